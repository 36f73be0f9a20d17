/* spec_cost.c - the step-time table and the draft length it favours
 * (spec_cost.h has the model).
 *
 * Owns: smoothing a row count's samples, estimating a row count not
 * measured from its neighbours, the score's maximisation.
 * Does not own: what a step is or when it is measured (sched_step.c), the
 * acceptance rate (sched_spec.c keeps it per request).
 */
#include "spec_cost.h"

#include <math.h>

void spec_cost_observe(spec_cost *c, int rows, double seconds)
{
    if (rows < 1 || rows > SPEC_COST_ROWS || !(seconds > 0.0) || !isfinite(seconds))
        return;
    const uint32_t n = c->n[rows] < SPEC_COST_SMOOTH ? c->n[rows] + 1 : SPEC_COST_SMOOTH;
    c->t[rows] += (seconds - c->t[rows]) / (double)n;
    if (c->n[rows] < UINT32_MAX)
        c->n[rows]++;
}

double spec_cost_seconds(const spec_cost *c, int rows)
{
    if (rows < 1 || rows > SPEC_COST_ROWS)
        return -1.0;
    if (c->n[rows])
        return c->t[rows];
    int lo = rows - 1, hi = rows + 1;
    while (lo >= 1 && !c->n[lo])
        lo--;
    while (hi <= SPEC_COST_ROWS && !c->n[hi])
        hi++;
    if (lo < 1)
        return -1.0;
    if (hi <= SPEC_COST_ROWS)
        return c->t[lo] + (c->t[hi] - c->t[lo]) * (double)(rows - lo) / (double)(hi - lo);
    int lo2 = lo - 1;
    while (lo2 >= 1 && !c->n[lo2])
        lo2--;
    if (lo2 < 1)
        return -1.0;
    double slope = (c->t[lo] - c->t[lo2]) / (double)(lo - lo2);
    if (slope < 0.0)
        slope = 0.0;
    return c->t[lo] + slope * (double)(rows - lo);
}

double spec_expected_accepted(double a, int k)
{
    if (!(a > 0.0))
        return 0.0;
    if (a > 1.0)
        a = 1.0;
    double e = 0.0, p = 1.0;
    for (int i = 0; i < k; i++) {
        p *= a;
        e += p;
    }
    return e;
}

int spec_cost_best_k(const spec_cost *c, int base_rows, int base_tokens, double a, int kmax)
{
    if (kmax <= 0)
        return 0;
    const double t0 = spec_cost_seconds(c, base_rows);
    if (!(t0 > 0.0))
        return kmax;
    int best = 0;
    double best_score = (double)base_tokens / t0;
    for (int k = 1; k <= kmax; k++) {
        const double t = spec_cost_seconds(c, base_rows + k);
        if (!(t > 0.0))
            return kmax;    /* not measured yet: the draft that measures it */
        const double score = ((double)base_tokens + spec_expected_accepted(a, k)) / t;
        if (score > best_score * (1.0 + 1e-9)) {
            best = k;
            best_score = score;
        }
    }
    return best;
}

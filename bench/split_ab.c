/* split_ab.c - decode speed with share.h's stealing split against the
 * fixed split (one equal share per thread), alternating in one process.
 *
 * Owns: timing decode steps of one sequence with share_set_fixed() off and
 * on in alternating pairs (the order flipped every pair), on the same
 * engine, so a machine whose speed drifts treats both alike; the median of
 * each and of the per-pair ratios. Does not own: the split (share.h).
 *
 *   hyserve-split-ab -m MODEL [-t THREADS] [-r PAIRS] [-d STEPS]
 * Prints one line per pair and a last line of medians. A slow core (a busy
 * host, another process) is what stealing is for; on a quiet machine with
 * equal cores the ratio should stay near 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels/blas.h"
#include "kernels/share.h"
#include "engine_run.h"
#include "median.h"

#define SPLIT_MAX_PAIRS 64

int main(int argc, char **argv)
{
    blas_process_init(argv);
    engine_run_args a = { .threads = 2, .reps = 8, .steps = 32 };
    if (!engine_run_parse(argc, argv, &a)) {
        fprintf(stderr, "usage: hyserve-split-ab -m MODEL [-t THREADS] [-r PAIRS] [-d STEPS]\n");
        return 2;
    }
    const int pairs = a.reps, steps = a.steps;
    if (!a.model || a.threads < 1 || pairs < 1 || pairs > SPLIT_MAX_PAIRS || steps < 1 || steps > 4096) {
        fprintf(stderr, "split_ab: need -m MODEL, 1 <= -r <= %d, 1 <= -d <= 4096\n", SPLIT_MAX_PAIRS);
        return 2;
    }
    int32_t *tok = NULL;
    float *logits = NULL;
    engine *e = engine_run_open(&a, 8 + steps + 16, 16 + steps, &tok, &logits);
    if (!e)
        return 1;
    int rc = 1;
    if (engine_run(e, tok, 8, 8, logits) < 0)     /* warm-up */
        goto out;
    double ts[SPLIT_MAX_PAIRS], tf[SPLIT_MAX_PAIRS], ratio[SPLIT_MAX_PAIRS];
    for (int r = 0; r < pairs; r++) {
        for (int k = 0; k < 2; k++) {
            const bool fixed = (k == 0) == (r % 2 == 1);
            share_set_fixed(fixed);
            const double t = engine_run(e, tok, 8, steps, logits);
            if (t < 0)
                goto out;
            *(fixed ? &tf[r] : &ts[r]) = t;
        }
        ratio[r] = tf[r] / ts[r];
        printf("pair %d: stealing %.2f tok/s, fixed %.2f, ratio %.3f\n", r, steps / ts[r], steps / tf[r], ratio[r]);
        fflush(stdout);
    }
    share_set_fixed(false);
    printf("median: stealing %.2f tok/s, fixed %.2f, ratio of speeds %.3f (%d pairs of %d steps, %d threads)\n",
           steps / median(ts, pairs), steps / median(tf, pairs), median(ratio, pairs), pairs, steps, a.threads);
    rc = 0;
out:
    engine_run_close(e, tok, logits);
    return rc;
}

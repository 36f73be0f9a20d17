/* test_spec_cost.c - the cost gate's arithmetic (runtime/spec_cost.h).
 *
 * The expected values are worked by hand from the model's formulas
 * (score(k) = (N + a + a^2 + .. + a^k) / t(R + k); Leviathan et al. 2023,
 * section 3.4, for the single-sequence case), written out beside each
 * check; none is computed by the code under test.
 */
#include <math.h>
#include <string.h>

#include "spec_cost.h"
#include "test.h"

static void table(spec_cost *c, const double *t, int n)
{
    memset(c, 0, sizeof *c);
    for (int r = 1; r < n; r++)
        if (t[r] > 0.0)
            spec_cost_observe(c, r, t[r]);
}

TEST(test_spec_cost_expected_accepted_is_the_geometric_sum)
{
    CHECK_NEAR(spec_expected_accepted(0.5, 3), 0.875, 1e-12);      /* 1/2 + 1/4 + 1/8 */
    CHECK_NEAR(spec_expected_accepted(0.9, 2), 1.71, 1e-12);       /* 0.9 + 0.81 */
    CHECK_NEAR(spec_expected_accepted(1.0, 7), 7.0, 1e-12);        /* every draft accepted */
    CHECK(spec_expected_accepted(0.0, 16) == 0.0);
    CHECK(spec_expected_accepted(0.7, 0) == 0.0);
    CHECK_NEAR(spec_expected_accepted(1.5, 2), 2.0, 1e-12);        /* a rate is at most 1 */
}

TEST(test_spec_cost_smooths_then_follows_a_row_count)
{
    spec_cost c;
    memset(&c, 0, sizeof c);
    spec_cost_observe(&c, 3, 1.0);
    spec_cost_observe(&c, 3, 2.0);
    CHECK_NEAR(spec_cost_seconds(&c, 3), 1.5, 1e-12);             /* the mean of the first samples */
    for (int i = 2; i < SPEC_COST_SMOOTH; i++)
        spec_cost_observe(&c, 3, 1.5);
    CHECK_NEAR(spec_cost_seconds(&c, 3), 1.5, 1e-12);
    spec_cost_observe(&c, 3, 9.5);                                  /* then each sample weighs 1/8 */
    CHECK_NEAR(spec_cost_seconds(&c, 3), 1.5 + 8.0 / 8.0, 1e-12);
    /* what is not a time, or not a row count it keeps, changes nothing */
    spec_cost_observe(&c, 3, -1.0);
    spec_cost_observe(&c, 3, NAN);
    spec_cost_observe(&c, 3, INFINITY);
    spec_cost_observe(&c, 0, 1.0);
    spec_cost_observe(&c, SPEC_COST_ROWS + 1, 1.0);
    CHECK_NEAR(spec_cost_seconds(&c, 3), 2.5, 1e-12);
    CHECK(spec_cost_seconds(&c, 0) < 0.0 && spec_cost_seconds(&c, SPEC_COST_ROWS + 1) < 0.0);
}

TEST(test_spec_cost_estimates_rows_between_and_beyond_the_measured)
{
    spec_cost c;
    const double t[] = { 0, 1.0, 0, 0, 0, 3.0, 0, 0, 0, 4.0 };    /* rows 1, 5, 9 measured */
    table(&c, t, 10);
    CHECK_NEAR(spec_cost_seconds(&c, 3), 2.0, 1e-12);              /* half way from 1.0 at 1 to 3.0 at 5 */
    CHECK_NEAR(spec_cost_seconds(&c, 7), 3.5, 1e-12);
    CHECK_NEAR(spec_cost_seconds(&c, 13), 5.0, 1e-12);             /* 4.0 + 4 rows at (4 - 3) / 4 a row */
    /* a falling tail is not extrapolated downward */
    const double f[] = { 0, 2.0, 0, 1.0 };
    table(&c, f, 4);
    CHECK_NEAR(spec_cost_seconds(&c, 10), 1.0, 1e-12);
    /* one measured count tells nothing above it, and nothing is below the lowest */
    const double one[] = { 0, 0, 2.0 };
    table(&c, one, 3);
    CHECK(spec_cost_seconds(&c, 4) < 0.0 && spec_cost_seconds(&c, 1) < 0.0);
    CHECK_NEAR(spec_cost_seconds(&c, 2), 2.0, 1e-12);
}

TEST(test_spec_cost_best_length_maximises_tokens_per_second)
{
    spec_cost c;
    double t[20];
    /* a step of r rows costs 1 + 0.25 (r - 1); one sequence (N = R = 1) at
     * a = 0.8: score(0) = 1, score(1) = 1.8 / 1.25 = 1.44,
     * score(2) = 2.44 / 1.5 = 1.627, score(3) = 2.952 / 1.75 = 1.687,
     * score(4) = 3.3616 / 2 = 1.681, and it falls after: k = 3 */
    for (int r = 1; r < 20; r++)
        t[r] = 1.0 + 0.25 * (r - 1);
    table(&c, t, 20);
    CHECK(spec_cost_best_k(&c, 1, 1, 0.8, 16) == 3);
    CHECK(spec_cost_best_k(&c, 1, 1, 0.8, 2) == 2);                /* never past the bound */
    CHECK(spec_cost_best_k(&c, 1, 1, 1.0, 16) == 16);              /* every draft pays: (1 + k) / (1 + k / 4) rises */
    /* a = 0.1: score(1) = 1.1 / 1.25 = 0.88 < 1, and E(k) < 1/9 for all k
     * while the cost grows: no draft */
    CHECK(spec_cost_best_k(&c, 1, 1, 0.1, 16) == 0);
    /* in a batch of 8 (N = R = 8, t(8) = 2.75): score(0) = 2.909; one
     * draft at a = 0.8 makes 8.8 / 3 = 2.933 (pays), at a = 0.6 8.6 / 3
     * = 2.867 (does not: a batch is closer to compute-bound) */
    CHECK(spec_cost_best_k(&c, 8, 8, 0.8, 1) == 1);
    CHECK(spec_cost_best_k(&c, 8, 8, 0.6, 1) == 0);

    /* rows that cost as much as steps of their own (t(r) = r): no rate
     * below 1 pays, since (1 + E(k)) / (1 + k) < 1; a rate of 1 ties, and
     * a tie keeps the shorter draft */
    for (int r = 1; r < 20; r++)
        t[r] = (double)r;
    table(&c, t, 20);
    CHECK(spec_cost_best_k(&c, 1, 1, 0.99, 16) == 0);
    CHECK(spec_cost_best_k(&c, 1, 1, 1.0, 16) == 0);

    /* costs not measured: the gate is open */
    memset(&c, 0, sizeof c);
    CHECK(spec_cost_best_k(&c, 1, 1, 0.01, 6) == 6);
    spec_cost_observe(&c, 1, 1.0);          /* only one row count: nothing above it is known */
    CHECK(spec_cost_best_k(&c, 1, 1, 0.01, 6) == 6);
    CHECK(spec_cost_best_k(&c, 1, 1, 0.5, 0) == 0);
}

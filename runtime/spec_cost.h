/* spec_cost.h - what a decode step costs by its rows, and the draft length
 * that pays for itself (speculative decoding's cost gate, sched_spec.c).
 *
 * A verify row is not free. Where the weights' read dominates a step (fast
 * vector kernels, slow memory) an 8-row exact step costs little more than a
 * 1-row one and any draft with some acceptance gains; where the exact rows
 * are compute-bound (AVX2 K-quants: 8 rows ~7x one row) even a draft
 * accepted whole can lose, and in a large batch every step is compute-bound.
 * So the scheduler measures the wall time of its decode-only steps by their
 * row count (spec_cost_observe: one table, smoothed per row count) and a
 * request, before it drafts, takes the length k, at most its adaptive bound,
 * that maximises the step's expected tokens per second
 *
 *     score(k) = (N + E(k)) / t(R + k),    E(k) = a + a^2 + ... + a^k,
 *
 * where N tokens and R rows are what the step makes and costs without the
 * draft (one each per decoding sequence), t the measured step time, and a
 * the request's acceptance rate per draft position (draft i is only used
 * when drafts 1..i-1 were accepted, so with a per-position rate the
 * expected accepted count is the geometric sum). k = 0, no draft, when no
 * k beats score(0). Where t(R + k) cannot be estimated yet the gate stays
 * open (the step that drafts measures it): optimism where nothing is known.
 * ref: Leviathan et al. 2023, section 3.4 (the expected improvement factor
 * (1 - a^(k+1)) / ((1 - a)(c k + 1)), of which this is the measured form).
 */
#ifndef HYSERVE_SPEC_COST_H
#define HYSERVE_SPEC_COST_H

#include <stdint.h>

enum {
    SPEC_COST_ROWS = 256,       /* row counts measured; steps with more are not */
    SPEC_COST_SMOOTH = 8,       /* a row count's first 8 samples averaged, then each weighs 1/8 */
};

typedef struct spec_cost {
    double t[SPEC_COST_ROWS + 1];   /* seconds of a decode-only step of r rows, smoothed; index 0 unused */
    uint32_t n[SPEC_COST_ROWS + 1]; /* samples taken at r rows */
} spec_cost;

/* A decode-only step of rows rows took seconds (ignored outside
 * 1..SPEC_COST_ROWS or for a time that is not positive and finite). */
void spec_cost_observe(spec_cost *c, int rows, double seconds);

/* The estimated seconds of a step of rows rows: the row count's own
 * samples, else linear between the nearest measured counts below and above,
 * else extrapolated from the two highest below (never decreasing); < 0
 * when it cannot be estimated (nothing measured at or below, or only one
 * count below and none above). */
double spec_cost_seconds(const spec_cost *c, int rows);

/* E(k) = a + a^2 + ... + a^k, the expected accepted drafts of k drafted
 * at per-position acceptance a in [0, 1]. */
double spec_expected_accepted(double a, int k);

/* The draft length in 0..kmax with the best score (above), base_rows and
 * base_tokens the step's without this draft; the shortest of equal
 * scores. kmax when the costs are not known yet. */
int spec_cost_best_k(const spec_cost *c, int base_rows, int base_tokens, double a, int kmax);

#endif

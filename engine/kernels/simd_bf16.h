/* simd_bf16.h - BF16 weights in panels against activations rounded to
 * bf16, on AVX512_BF16's vdpbf16ps (decode steps and prompts).
 *
 * Owns: rounding activations to bf16 pairs, the vdpbf16ps product on the
 * BF16 panel layout (panels.h: one dword per row and k-pair, exactly the
 * pairs vdpbf16ps multiplies), and the start-up measurement that decides
 * whether this CPU runs it faster than the convert+FMA panel kernel (Zen 4
 * and 5 run vdpbf16ps at full rate; the Intel parts measured so far at half
 * rate). Does not own: the choice's switch and its name (cpu.c), the
 * panel layout or the calls (panels.c).
 *
 * Arithmetic: each weight is exact bf16, each activation is rounded to
 * bf16 (nearest even, per call), and vdpbf16ps adds the two products of a
 * pair into an f32 accumulator. Against the f32-activation product each
 * term moves by at most |w x| 2^-8 (the rounding), so an output moves by
 * at most 2^-8 sum_k |w_k x_k| plus f32 summation error; tests/test_bf16.c
 * checks that bound. The exact path (convert+FMA, the numpy reference's
 * arithmetic) stays the default wherever the measurement does not pick
 * this one, and HYSERVE_BF16_DOT=fma (or simd_set_bf16_dot) forces it.
 */
#ifndef HYSERVE_SIMD_BF16_H
#define HYSERVE_SIMD_BF16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* bf16 of x, nearest even, as vcvtneps2bf16 rounds: NaN stays a (quiet)
 * NaN, a denormal input becomes a signed zero */
uint16_t bf16_round_ref(float x);

/* xb[k] = bf16_round_ref(x[k]) for k < n (n even; xb read as n / 2 dwords
 * of pairs); the AVX512_BF16 form gives the same bits */
void bf16_round_row_ref(const float *x, int n, uint16_t *xb);
void avx512bf16_round_row(const float *x, int n, uint16_t *xb);

/* Panels [p0, p1) of a packed BF16 weight (ps bytes apart, n_in % 2 == 0)
 * x n_tok tokens of rounded activations (token t's pairs at
 * xb + t * n_in): Y[t * n_out + 16 p + i] = sum over the pairs j, in
 * order, of vdpbf16ps(W(16p + i, 2j..2j+1), xb pair j). One chain per
 * output whatever the tile: a token's outputs are the same bits alone and
 * in a decode step of any size. Tiles of 2 panels x 12 tokens, each pair
 * of panels (224 KiB at 3584 wide: in L2) met by every token group in
 * turn. Call only where the CPU has AVX512_BF16. */
void avx512bf16_pan_rows(const char *W, size_t ps, int p0, int p1, int n_in, const uint16_t *xb, int n_tok,
                         float *Y, int n_out);

/* The start-up measurement (about 2 ms): the one-token vdpbf16ps kernel
 * against the convert+FMA kernel on 4 panels of 2048 (256 KiB, L2), 8
 * alternating rounds, the best time of each. Returns the FMA kernel's time
 * over vdpbf16ps's (> 1: vdpbf16ps faster); call only where the CPU has
 * AVX512_BF16. */
double bf16_dot_speedup(void);

#endif

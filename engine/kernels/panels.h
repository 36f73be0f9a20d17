/* panels.h - BF16, F16 and Q8_0 weights repacked into panels of 16 rows.
 *
 * Owns: the panel layout, packing a weight into it in place at load, the
 * products on packed weights for every batch size (AVX-512 outer-product
 * kernels; sgemm on decoded tiles for prompts; a portable loop for CPUs
 * without AVX-512), and element access for that loop and the tests.
 * Does not own: when to pack or where the packed weights live (model.c).
 *
 * Why: a decode step of many sequences multiplies each weight by a few
 * dozen tokens. With rows stored as in the file, the AVX-512 tile keeps k
 * along the vector lanes: R + T loads and widenings per R x T FMAs and a
 * horizontal sum per output. In panels, the vector lanes run along 16
 * rows and each token's activation is broadcast (an outer product, as
 * sgemm's micro-kernel): one load and widening per 16 rows and k, reused
 * by every token, no horizontal sums. Measured before building it
 * (prototype, BF16, 16 tokens, 2 threads, one process alternating, 15
 * repetitions): time over the row tile 0.67-0.85 from DRAM (400 MiB of
 * weight, rows of 1024 and 3584), 0.65-0.72 in L2. Widening whole rows
 * into panels on the fly instead measured 1.3 times slower, and a pair-
 * widening trick in the row tile 1.1-1.2 times slower.
 *
 * Layout (w->panels): n_out % 16 == 0. Panel p holds rows 16p .. 16p + 15
 * in 16 row_bytes consecutive bytes (p * 16 * row_bytes bytes in).
 * BF16 and F16 (n_in % 2 == 0): the k-pair j (k = 2j, 2j + 1) is 32
 * elements (64 bytes) at j * 64:
 *   BF16: element 2i + (k & 1) is row i's k: one dword per row, whose low
 *         half is k = 2j and high half k = 2j + 1 (each widens to a float
 *         in one instruction: shift left by 16, or mask the low half);
 *   F16:  element 16 (k & 1) + i is row i's k: 16 rows of k = 2j, then
 *         16 of k = 2j + 1 (vcvtph2ps widens each half).
 * Q8_0 (n_in % 32 == 0, nb = n_in / 32 blocks per row): block b's quants
 *   are 512 bytes at b * 512, in 8 groups of 4 k (k = 32b + 4g + m at
 *   b * 512 + 64 g + 4 i + m for row i), each stored as q + 128 (q ^ 0x80:
 *   unsigned, as vpdpbusd's first operand wants); then block b's 16 fp16
 *   scales, row i's at 512 nb + 32 b + 2 i. The same 34 bytes per block
 *   and row as the file.
 * The weight's size and row_bytes do not change.
 */
#ifndef HYSERVE_PANELS_H
#define HYSERVE_PANELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weight.h"

#define PANEL_ROWS 16

/* Whether this process packs BF16, F16 and Q8_0 weights at load: the
 * HYSERVE_PANELS environment variable, "0" never, "1" wherever AVX-512 is
 * on (tests, and A/B runs); unset (or anything else) where AVX-512 is on
 * and AMX is not (AMX multiplies rows as stored, in bf16 tiles). */
bool panels_wanted(void);

/* true when w's type and shape take the layout (it may still be stored as
 * rows); Q8_0 only where the CPU has AVX512-VNNI */
bool panels_fit(const weight *w);

/* true when products on packed w run on the AVX-512 kernels now (Q8_0:
 * AVX512-VNNI), else on the portable loop */
bool panels_kernel(const weight *w);

/* Write n_out rows of n_in BF16, F16 or Q8_0 elements (as stored in the
 * file) to dst in the panel layout, n_out row_bytes bytes; the shape must
 * satisfy panels_fit; rows and dst must not overlap. */
void panels_pack(const void *rows, uint32_t type, int n_in, int n_out, void *dst);

/* element (r, k) of a packed weight, as a float (exact) */
float panels_get(const weight *w, int r, int k);

/* Scratch floats panels_matmul needs for n_tok tokens (BF16, F16: 0 for
 * one; Q8_0 always some, for the int8 activations). */
long panels_scratch_floats(const weight *w, int n_tok);

/* How panels_matmul multiplies:
 *   PANELS_DECODE: one token and decode steps: the outer-product kernel;
 *     Q8_0 on the activations quantized to int8 per block of 32
 *     (quantize_act_q8, as the rows' one-token product): per block an
 *     exact int sum, scaled by dw dx and added in block order;
 *   PANELS_OUTER: short prompts: the outer-product kernel on f32
 *     activations (Q8_0's weights widened to f32, exact);
 *   PANELS_SGEMM: longer prompts: sgemm on tiles of 64 rows decoded to f32;
 *   PANELS_BF16ACT: BF16 prompts on activations rounded to bf16 (nearest
 *     even, bf16_round_ref): vdpbf16ps where BF16 decode takes it
 *     (simd_bf16_dot, simd_bf16.h), else the rounded values as floats on
 *     the FMA kernel or the portable loop: the same products (bf16 x bf16
 *     is exact in f32), summed in f32. Other types take PANELS_OUTER.
 * On the kernels every output is one chain over k (or over Q8_0's blocks)
 * whatever the tile, so a token's result is the same bits alone or in any
 * decode step. One token takes PANELS_DECODE unless PANELS_BF16ACT. */
enum { PANELS_DECODE, PANELS_OUTER, PANELS_SGEMM, PANELS_BF16ACT };

/* Y[t * n_out + r] = sum_k W(r, k) X[t * n_in + k] for a packed W (the
 * contract of matmul), on path (above). Without the kernels
 * (panels_kernel() false): a plain loop, over panels_get or (Q8_0,
 * PANELS_DECODE) the same int8 arithmetic as the kernel.
 * scratch: panels_scratch_floats(W, n_tok) floats (BF16, F16: may be NULL,
 * which takes PANELS_OUTER for PANELS_SGEMM). */
void panels_matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, int path,
                   float *scratch);

/* Y[i] = X W[i]^T for n packed weights of one type and width on the
 * outer-product kernel in one parallel region (their panels concatenated
 * and split between the threads), as matmul_many does for rows; path
 * PANELS_DECODE, PANELS_OUTER or PANELS_BF16ACT (above). Only where
 * panels_kernel(); scratch as panels_matmul's for W[0]. */
void panels_matmul_many(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                        int path, float *scratch);

#endif

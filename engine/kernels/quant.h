/* quant.h - weight block formats: row dequantization and dot products.
 *
 * Owns: decoding and encoding rows of F32, F16, BF16, Q8_0, Q4_0 and the
 * K-quants Q4_K, Q5_K, Q6_K (quant_supported). Does not own: choosing
 * kernels per shape (matmul.c) or the f16 / bf16 numbers (half.h).
 * ref: docs/models.md section 5 (block layouts).
 */
#ifndef HYSERVE_QUANT_H
#define HYSERVE_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "half.h"

bool quant_supported(uint32_t type);
/* Names of the supported types, for error messages. */
const char *quant_supported_list(void);

/* dst[0..n) = row decoded; n is a multiple of the type's block size. */
void dequant_row(uint32_t type, const void *src, float *dst, int n);
/* sum_i row[i] * x[i] over n elements. */
float dot_row(uint32_t type, const void *row, const float *x, int n);
/* Encode n floats as type (any supported type) into dst. */
void quantize_row(uint32_t type, const float *src, void *dst, int n);

/* ---- fast paths ----
 * Same contracts as dequant_row / dot_row, which stay the references:
 * AVX2 kernels (simd_avx2.c) for F32, F16, BF16 and Q8_0 when the CPU has
 * them, the references otherwise and for every other type. Results agree
 * with the references up to float summation order (tests/test_kernels.c).
 * Each goes through the kernel table (cpu.h). */
void dequant_row_fast(uint32_t type, const void *src, float *dst, int n);
/* quantize_row's contract, bit for bit; AVX2 for BF16 (the DeltaNet state's
 * store), the reference otherwise. */
void quantize_row_fast(uint32_t type, const float *src, void *dst, int n);
float dot_row_fast(uint32_t type, const void *row, const float *x, int n);
/* The per-level entry points the table holds: the AVX2 (AVX-512) kernel
 * for the types that have one, the next level down for the others. */
void dequant_row_avx2(uint32_t type, const void *src, float *dst, int n);
void dequant_row_avx512(uint32_t type, const void *src, float *dst, int n);
float dot_row_avx2(uint32_t type, const void *row, const float *x, int n);
void quantize_row_avx2(uint32_t type, const float *src, void *dst, int n);

/* ---- Q8_0 weights against int8 activations ----
 * An activation vector is quantized once per token in blocks of 32:
 * d[b] = max_j |x[32b + j]| / 127, q[32b + j] = round(x[32b + j] / d[b]),
 * rounding half to even. n is a multiple of 32. The dot product is then
 * sum_b dw[b] d[b] sum_j w[32b + j] q[32b + j] with exact int sums per
 * block; its error against dot_row(Q8_0, w, x) is at most
 * sum_b |dw[b]| (d[b] / 2) sum_j |w[32b + j]| (plus float rounding). */
void quantize_act_q8(const float *x, int n, int8_t *q, float *d);
float dot_q8_0_act(const void *row, const int8_t *q, const float *d, int n);
/* the scalar references of the two above */
void quantize_act_q8_ref(const float *x, int n, int8_t *q, float *d);
float dot_q8_0_act_ref(const void *row, const int8_t *q, const float *d, int n);

/* ---- K-quant and Q4_0 weights against int8 activations ----
 * The K-quants (Q4_K, Q5_K, Q6_K) take activations quantized per block of
 * 256 (the Q8_K layout their super-blocks are designed for):
 * d[b] = max_j |x[256b + j]| / 127, q[i] = round(x[i] / d[b]) (half to
 * even), and bsums[16b + g] = sum_{j<16} q[256b + 16g + j], the exact int
 * sums that carry the formats' offsets (Q4_K/Q5_K's mins, Q6_K's -32).
 * Per super-block the dot is then exact integer sums scaled once:
 *   Q4_K/Q5_K: d[b] (d sum_s sc_s sum_l q_w q - dmin sum_s mn_s bsum_s)
 *   Q6_K:      d[b] d sum_g sc_g (sum_l q_w q - 32 bsum_g)
 * Q4_0 takes Q8_0's activations (blocks of 32, quantize_act_q8):
 *   sum_b dw d[b] (sum_j q_w q - 8 sum_j q).
 * Against dot_row on the float x the error is at most
 * sum_i |w[i]| d[b(i)] / 2 plus float rounding. n a multiple of 256
 * (K-quants) or 32 (Q4_0); bsums holds n / 16 entries. */
/* the 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K
 * super-block's 12 packed scale bytes (docs/models.md section 5) */
void kq_scale_min(const uint8_t *sc, int s, int *scale, int *min);
/* true for the types whose one-token product runs on int8 activations */
bool quant_int8_act(uint32_t type);
/* elements per activation scale for such a type: 32 or 256 */
int quant_act_block(uint32_t type);
void quantize_act_q8k(const float *x, int n, int8_t *q, float *d, int16_t *bsums);
float dot_kq_act(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n);
float dot_q4_0_act(const void *row, const int8_t *q, const float *d, int n);
/* the scalar references of the three above */
void quantize_act_q8k_ref(const float *x, int n, int8_t *q, float *d, int16_t *bsums);
float dot_kq_act_ref(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n);
float dot_q4_0_act_ref(const void *row, const int8_t *q, const float *d, int n);

#endif

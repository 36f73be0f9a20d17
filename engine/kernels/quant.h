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

#endif

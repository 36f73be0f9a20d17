/* quant.h - weight block formats: row dequantization and dot products.
 *
 * Owns: decoding F32, F16, BF16 and Q8_0 rows (more types come with the
 * real-models work). Does not own: choosing kernels per shape (ops.c).
 * ref: ../shared/docs/architectures.md section 5 (block layouts).
 */
#ifndef HYSERVE_QUANT_H
#define HYSERVE_QUANT_H

#include <stdbool.h>
#include <stdint.h>

bool quant_supported(uint32_t type);
/* Names of the supported types, for error messages. */
const char *quant_supported_list(void);

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);          /* round to nearest even */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);          /* round to nearest even */

/* dst[0..n) = row decoded; n is a multiple of the type's block size. */
void dequant_row(uint32_t type, const void *src, float *dst, int n);
/* sum_i row[i] * x[i] over n elements. */
float dot_row(uint32_t type, const void *row, const float *x, int n);
/* Encode n floats as type (any supported type) into dst. */
void quantize_row(uint32_t type, const float *src, void *dst, int n);

#endif

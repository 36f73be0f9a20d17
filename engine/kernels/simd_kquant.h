/* simd_kquant.h - K-quant (Q4_K, Q5_K, Q6_K) and Q4_0 dot products on int8
 * activations, AVX2 and AVX-512.
 *
 * Owns: the declarations of the kernels in simd_kquant.c. Each has the
 * contract of a scalar reference in quant.c (named in its comment) up to
 * the order of the float sums: the integer sums per block are exact in
 * both, only their scaling and summing in float is reordered
 * (tests/test_kernels.c compares them). Does not own: the activation
 * layout (quant.h: int8 q, one float d per 256 (K-quants) or 32 (Q4_0)
 * elements, bsums per 16) or choosing a kernel (the table of cpu.h).
 */
#ifndef HYSERVE_SIMD_KQUANT_H
#define HYSERVE_SIMD_KQUANT_H

#include <stddef.h>
#include <stdint.h>

/* ref: quantize_act_q8k_ref, bit for bit */
void avx2_quantize_act_q8k(const float *x, int n, int8_t *q, float *d, int16_t *bsums);
/* ref: dot_kq_act_ref (type Q4_K, Q5_K or Q6_K) */
float avx2_dot_kq_act(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n);
/* y[r ldy] = avx2_dot_kq_act(type, W + r rb, ...) for r < n_rows, the same bits */
void avx2_dot_kq_act_rows(uint32_t type, const void *W, size_t rb, int n_rows, const int8_t *q, const float *d,
                          const int16_t *bsums, int n, float *y, long ldy);
/* ref: dot_q4_0_act_ref */
float avx2_dot_q4_0_act(const void *row, const int8_t *q, const float *d, int n);

/* ref: dequant_row for GGML_Q4_K, Q5_K, Q6_K or Q4_0, bit for bit */
void avx2_dequant_kq(uint32_t type, const void *src, float *dst, int n);

/* The same on 512-bit vectors (AVX-512 F, BW, VL, DQ), two sub-blocks per
 * register. The _vnni forms fold the scale products into vpdpwssd /
 * vpdpbusd (AVX512-VNNI); call them only where simd_avx512_vnni(). */
float avx512_dot_kq_act(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n);
float avx512_dot_kq_act_vnni(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums,
                             int n);
/* One K-quant row against n_tok tokens' activations (token t at q[t],
 * d[t], bs[t]): y[t ldy] = avx512_dot_kq_act(type, row, q[t], d[t], bs[t],
 * n), the same bits, with the row's weights unpacked once per super-block
 * for groups of up to 8 tokens (decode steps). */
void avx512_dot_kq_act_tokens(uint32_t type, const void *row, int n, const int8_t *const *q, const float *const *d,
                              const int16_t *const *bs, int n_tok, float *y, long ldy);
void avx512_dot_kq_act_tokens_vnni(uint32_t type, const void *row, int n, const int8_t *const *q,
                                   const float *const *d, const int16_t *const *bs, int n_tok, float *y, long ldy);
float avx512_dot_q4_0_act(const void *row, const int8_t *q, const float *d, int n);
float avx512_dot_q4_0_act_vnni(const void *row, const int8_t *q, const float *d, int n);

#endif

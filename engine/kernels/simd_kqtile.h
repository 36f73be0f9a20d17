/* simd_kqtile.h - prompts on K-quant (Q4_K, Q5_K, Q6_K) and Q4_0 weights
 * as int8 products: tiles of 16 rows x up to 8 tokens.
 *
 * Owns: the unpacked panel layout (16 rows of one weight, their integers
 * transposed so that one 64-byte load feeds 16 rows), unpacking rows into
 * it, and the products of a panel with n tokens' int8 activations, in a
 * scalar form and on AVX2 (vpmaddubsw), AVX-VNNI (vpdpbusd on 256 bits),
 * AVX-512 (vpmaddubsw) and AVX512-VNNI (vpdpbusd). Does not own: quantizing the activations
 * (quant.h: quantize_act_q8k for the K-quants, quantize_act_q8 for Q4_0,
 * whose per-16 sums the caller adds), when this path is taken (matmul.c).
 *
 * Why: a prompt multiplies each weight by hundreds of tokens. Decoding the
 * rows to f32 for sgemm costs a 4-byte float per weight and an FMA per 16
 * products; int8 products do 64 per vpdpbusd and read a byte per weight
 * (the weight block is unpacked once per 16 rows and reused by every
 * token of the chunk).
 *
 * Arithmetic: per super-block b of 256 elements (Q4_0: per block of 32),
 * the integer sums of quant.h's contract, exact, then scaled in float in
 * exactly dot_kq_act_ref's / dot_q4_0_act_ref's order:
 *   Q4_K/Q5_K: y += d_x[b] (d si - dmin sm),  si = sum_s sc_s sum q_w q,
 *              sm = sum_s mn_s (bsum_2s + bsum_2s+1)
 *   Q6_K:      y += d_x[b] (d si),  si = sum_g sc_g (sum q_w q - 32 bsum_g)
 *   Q4_0:      y += (dw d_x[j]) (sum q_w q - 8 (bsum_2j + bsum_2j+1))
 * so every form gives the scalar references' bits: a token's result does
 * not depend on the kernel, the tile or the other tokens.
 *
 * Panel layout, per group of 256 elements (KQT_GROUP_BYTES each, 64-byte
 * aligned): q [64 quads][16 rows][4] uint8 (element 4g + m of row i at
 * 64 g + 4 i + m: the weight's unsigned integer, Q4_K 0..15, Q5_K 0..31,
 * Q6_K 0..63, Q4_0 0..15); sc [16][16] int32 (sub-block scales: 8 of 32
 * elements for Q4_K/Q5_K, 16 of 16 for Q6_K; unused for Q4_0); mn [8][16]
 * int32 (Q4_K/Q5_K mins); dw [8][16] float (Q4_K/Q5_K: d, dmin; Q6_K: d;
 * Q4_0: each block's d). Rows past nr are zero.
 */
#ifndef HYSERVE_SIMD_KQTILE_H
#define HYSERVE_SIMD_KQTILE_H

#include <stddef.h>
#include <stdint.h>

#define KQT_ROWS 16
#define KQT_GROUP_BYTES 6144

/* true when kqtile_* take weights of this type and width: Q4_K, Q5_K,
 * Q6_K with n % 256 == 0, Q4_0 with n % 32 == 0 */
_Bool kqtile_fits(uint32_t type, int n);

/* bytes of one panel for rows of n elements */
size_t kqtile_panel_bytes(int n);

/* Unpack nr <= 16 rows (rb bytes apart, n elements each) into panel
 * (64-byte aligned, kqtile_panel_bytes(n) bytes). */
void kqtile_unpack(uint32_t type, const void *rows, size_t rb, int nr, int n, void *panel);

/* y[t ldy + i] = row i . token t for i < nr, t < n_tok: token t's
 * activations at q[t] [n], d[t] [n / 256] (K-quants) or [n / 32] (Q4_0),
 * bs[t] [n / 16] (sums of 16 consecutive q, also for Q4_0). Bit for bit
 * dot_kq_act_ref / dot_q4_0_act_ref of the row. Picks the widest form the
 * current level runs (cpu.h); the _scalar form is the reference. */
void kqtile_mul(uint32_t type, const void *panel, int n, int nr, const int8_t *const *q, const float *const *d,
                const int16_t *const *bs, int n_tok, float *y, long ldy);
void kqtile_mul_scalar(uint32_t type, const void *panel, int n, int nr, const int8_t *const *q,
                       const float *const *d, const int16_t *const *bs, int n_tok, float *y, long ldy);

#endif

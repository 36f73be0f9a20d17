/* simd512.h - AVX-512 fast paths.
 *
 * Owns: the declarations of the kernels in simd_avx512.c (the feature
 * check, simd_avx512(), is cpu.h's). Every kernel here has the same contract as an AVX2 kernel
 * of simd.h (named in its comment), which keeps its scalar reference;
 * tests/test_avx512.c checks them against plain double-precision sums.
 * Does not own: choosing a kernel (the table of cpu.h, and callers that
 * branch on simd_avx512(), so the binary runs on any x86-64).
 *
 * HYSERVE_SIMD=avx2 in the environment forces the AVX2 kernels,
 * HYSERVE_SIMD=0 the scalar references (simd_avx2() is false then, and
 * simd_avx512() with it).
 */
#ifndef HYSERVE_SIMD512_H
#define HYSERVE_SIMD512_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "simd.h"

/* ---- small batches: many rows x 1..many tokens, decoded to f32 ----
 * Y[t * ldy + r] = sum_{i<n} W[r * ldw + i] X[t * ldx + i]
 * for r < n_rows, t < n_tok; any n_rows >= 1, n_tok >= 1, n >= 1 (n = 0
 * writes zeros); no alignment needed (64-byte aligned rows are faster);
 * reads no element past a row's n; Y entries outside [n_tok) x [n_rows)
 * are not touched. No heap scratch: 12 KiB of stack. Thread-safe; callers
 * split rows between threads. Same contract as avx2_rows_x_tokens()
 * without its 4-row limit; pass whole blocks of rows (a thread's range, or
 * a decoded tile of 48-64 rows), not groups of 4: the kernel tiles 6 rows
 * x 4 tokens and prefetches the rows ahead within one call.
 * ref: n_rows * n_tok calls of dot_row(GGML_F32, ...). */
void avx512_rows_x_tokens(const float *W, int ldw, int n_rows, const float *X, int ldx, int n_tok,
                          int n, float *Y, int ldy);
/* The same product with X packed once per call (avx512_pack_tokens: the
 * tokens in groups of 4, k in steps of 16, n padded with zeros to a
 * multiple of 16; Xp 64-byte aligned, avx512_packed_tokens_floats()
 * floats), shared read-only by the threads that split the rows. The same
 * arithmetic in the same order, so the same results bit for bit; measured
 * 5-10% faster at n = 1024 and 3584 (see simd_avx512.c). */
size_t avx512_packed_tokens_floats(int n_tok, int n);
void avx512_pack_tokens(const float *X, int ldx, int n_tok, int n, float *Xp);
void avx512_rows_x_tokens_packed(const float *W, int ldw, int n_rows, const float *Xp, int n_tok, int n,
                                 float *Y, int ldy);

/* The same product on F16, BF16 or Q8_0 weights (GGML type ids), each
 * 16-element row piece widened to floats in registers (exactly the values
 * dequant_row gives) and used for a tile of tokens; nothing is decoded to
 * memory. Rows row_bytes apart. X plain (rows ldx floats apart, packed
 * false) or packed as above (packed true, ldx unused). The tile sums in
 * the same order as the F32 kernel, so the result equals
 * avx512_rows_x_tokens on the decoded rows bit for bit.
 * avx512_rows_x_tokens_typed_ok: the types and widths it takes (Q8_0
 * needs n % 32 == 0, whole blocks). */
bool avx512_rows_x_tokens_typed_ok(uint32_t type, int n);
void avx512_rows_x_tokens_typed(uint32_t type, const void *W, size_t row_bytes, int n_rows, const float *X, int ldx,
                                bool packed, int n_tok, int n, float *Y, int ldy);

/* ---- Q8_0 rows x int8 activations, decode steps (AVX512-VNNI) ----
 * Y[t * ldy + r] = dot_q8_0_act(row r, xq + t n, xd + t n / 32, n): the
 * one-token product's arithmetic (exact int sums per block, scaled by
 * dw d) for n_tok tokens per pass over the rows; the same value up to the
 * order of the float sums. n % 32 == 0. prep (avx512_q8_prep_bytes bytes,
 * 64-byte aligned) is filled once per step by avx512_q8_prepare from the
 * quantized activations (quantize_act_q8; token t at xq + t n and
 * xd + t n / 32), tokens [t0, t1) per call so that threads can split
 * them, and read by every thread. Call only where simd_avx512_vnni(). */
size_t avx512_q8_prep_bytes(int n, int n_tok);
void avx512_q8_prepare(const int8_t *xq, const float *xd, int n, int n_tok, int t0, int t1, void *prep);
void avx512_q8_0_rows_x_tokens(const void *W, size_t rb, int n_rows, int n, const void *prep, int n_tok, float *Y,
                               int ldy);

/* ---- row decoding ----
 * out[0..n) = w decoded, any n >= 0; bit-exact (every f16 and bf16 value is
 * a float). ref: avx2_dequant_f16 / avx2_dequant_bf16, fp16_to_f32 /
 * bf16_to_f32 in quant.c. */
void avx512_dequant_f16(const uint16_t *w, float *out, int n);
void avx512_dequant_bf16(const uint16_t *w, float *out, int n);

/* The gated delta rule's decode step on a bf16 state, 16 lanes:
 * avx2_dnet_step_bf16's contract (simd.h) up to float summation order (the
 * stored S is rounded as f32_to_bf16 does). d_k % 16 == 0, d_v % 4 == 0. */
void avx512_dnet_step_bf16(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                           float g, uint16_t *S, float *o);

#endif

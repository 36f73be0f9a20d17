/* simd.h - AVX2/FMA/F16C fast paths.
 *
 * Owns: the declarations of the hand-written AVX2 kernels in simd_avx2.c
 * (the CPU feature check and the choice of kernels per level are cpu.h's). Every kernel here has a plain scalar reference
 * (named in its comment) and tests/test_kernels.c compares the two.
 * Does not own: choosing a kernel (the table of cpu.h holds these where
 * simd_avx2() says so, and matmul.c calls them only then, so the binary
 * runs on any x86-64).
 *
 * Setting HYSERVE_SIMD=0 in the environment forces the scalar references
 * (for comparisons and for bisecting a numerical difference).
 */
#ifndef HYSERVE_SIMD_H
#define HYSERVE_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* simd_avx2(), simd_vnni() (the Q8_0 matrix-vector product then uses
 * vpdpbusd) and the switches tests use, simd_set_enabled, simd_set_vnni */
#include "cpu.h"

/* ---- dot products of one weight row with f32 activations ----
 * sum_i w[i] x[i] over n elements (any n; tails handled).
 * ref: dot_row() in quant.c for the same type. */
float avx2_dot_f32(const float *w, const float *x, int n);
float avx2_dot_f16(const uint16_t *w, const float *x, int n);
float avx2_dot_bf16(const uint16_t *w, const float *x, int n);
/* Q8_0 row (n / 32 blocks of {f16 d; int8 qs[32]}) with f32 x. */
float avx2_dot_q8_0(const void *w, const float *x, int n);

/* ---- Q8_0 against activations quantized once per token ----
 * x is split in blocks of 32: d[b] = max|x| / 127, q = round(x / d[b]).
 * ref: quantize_act_q8_ref() and dot_q8_0_act_ref() in quant.c. */
void avx2_quantize_act_q8(const float *x, int n, int8_t *q, float *d);
/* sum_b dw[b] d[b] sum_j w[b][j] q[b][j]; n a multiple of 32 */
float avx2_dot_q8_0_act(const void *w, const int8_t *q, const float *d, int n);

/* ---- matrix-vector product over rows [0, n_rows) ----
 * y[r] = row r . x, rows row_bytes apart, four far-apart rows per pass
 * (rows o, o + q, o + 2q, o + 3q with q = n_rows / 4). type is
 * GGML_F32, GGML_F16, GGML_BF16 (x used) or GGML_Q8_0 (xq, xd: the
 * activations from avx2_quantize_act_q8 used). ref: per-row dot_row() /
 * dot_q8_0_act_ref(). */
void avx2_matvec(uint32_t type, const void *W, size_t row_bytes, int n_rows, const float *x, const int8_t *xq,
                 const float *xd, int n, float *y);
/* avx2_matvec for n_tok tokens (token t: x[t], or xq[t] and xd[t]; its
 * results at y + t * ldy), each token's results avx2_matvec's bits for
 * that token alone: tokens in pairs share each load of the weights (and
 * Q8_0's per-block work on them). For exact steps (matmul_set_exact). */
void avx2_matvec_tokens(uint32_t type, const void *W, size_t row_bytes, int n_rows, const float *const *x,
                        const int8_t *const *xq, const float *const *xd, int n_tok, int n, float *y, size_t ldy);

/* ---- row decoding for the prefill tiles ----
 * ref: dequant_row() in quant.c. */
void avx2_dequant_f16(const uint16_t *src, float *dst, int n);
void avx2_dequant_bf16(const uint16_t *src, float *dst, int n);
/* ref: f32_to_bf16() (round to nearest even, NaN kept quiet), bit for bit */
void avx2_quant_bf16(const float *src, uint16_t *dst, int n);
void avx2_dequant_q8_0(const void *src, float *dst, int n);

/* ---- small batches: 2..many tokens against rows decoded to f32 ----
 * Y[t * ldy + r] = sum_i W[r][i] X[t][i] for r < n_rows (<= 4), t < n_tok:
 * W: n_rows rows of n f32 (row stride ldw), X: n_tok rows (stride ldx).
 * ref: n_rows * n_tok calls of dot_row(GGML_F32, ...). */
void avx2_rows_x_tokens(const float *W, int ldw, int n_rows, const float *X, int ldx, int n_tok,
                        int n, float *Y, int ldy);

/* ---- the gated delta rule, one token, one value head ----
 * S [d_v][d_k] *= exp(g); kv = S k; S += k (beta (v - kv))^T; o = S q.
 * cold: S is probably not in cache (a sequence's first token of a step),
 * so its rows are prefetched ahead; the result is the same either way.
 * ref: dnet_recurrent_head() in deltanet.c with n = 1. */
void avx2_dnet_step(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                    float g, float *S, float *o, bool cold);
/* The same step on a bf16 S (the cache's bf16 state): S is read widened,
 * the step runs in f32 (o from the unrounded S), and S is stored rounded to
 * nearest even; bit for bit what widening S into f32, avx2_dnet_step and
 * quantize_row(GGML_BF16) give. */
void avx2_dnet_step_bf16(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                         float g, uint16_t *S, float *o);

/* ---- Kimi Delta Attention, one token, one head (d % 8 == 0) ----
 * S [d][d] (value rows, key columns): S[j] *= eg (eg = exp(g) per key
 * channel); kv = S[j] . k; S[j] += k (beta (v_j - kv)); o_j = S[j] . q.
 * ref: kda_recurrent_head() in kda.c with n = 1. */
void avx2_kda_step(int d, const float *q, const float *k, const float *v, float beta, const float *eg, float *S,
                   float *o);

/* ---- Mamba-2, one token, one head (ds % 8 == 0) ----
 * S [hd][ds]: S[j] = a S[j] + (x_j dt) B; y_j = S[j] . C.
 * ref: mamba2_recurrent_head() in mamba2.c with n = 1. */
void avx2_mamba2_step(int hd, int ds, float a, float dt, const float *x, const float *B, const float *C, float *S,
                      float *y);

/* ---- Mamba-1, rows [t0, t1) of channels [c0, c1) (DS % 8 == 0) ----
 * S[c][i] = exp(dt_c A[c][i]) S[c][i] + dt_c x_c B_i; y_c = S[c] . C, the
 * exponentials 8 at a time (simd_exp.h: mamba1.c's expf was 2-3% of a
 * Jamba-shaped decode beside the scan's 5%).
 * ref: mamba1_scan() in mamba1.c, the same arguments. */
void avx2_mamba1_scan(int t0, int t1, int c0, int c1, int DS, const float *A, const float *x, int xs,
                      const float *dt, int dts, const float *BC, int bcs, float *S, float *y, int ys);

/* y[r] = w[r] . x for four f32 rows (any n): the F32 body of avx2_matvec,
 * also the odd-key tail of attention's q.K. ref: dot_row(GGML_F32, ...). */
void avx2_dot4_f32(const void *const *w, const float *x, int n, float *y);

/* ---- elementwise gates ----
 * y[i] = silu(x[i]) * (b ? b[i] : 1)  (y may alias x or b): SwiGLU, the
 * DeltaNet output gate, the conv's SiLU.
 * y[i] *= sigmoid(g[i]): attention's output gate.
 * exp is a degree-7 polynomial on the reduced range (relative error
 * < 4e-7, as exp256_neg in attn.c). ref: silu(), sigmoid() in vecmath.h. */
void avx2_silu_mul(float *y, const float *x, const float *b, long n);
void avx2_sigmoid_mul(float *y, const float *g, long n);

/* ---- the norms' two loops (rmsnorm, l2norm in vecmath.c) ----
 * avx2_sumsq: sum_i x[i]^2 accumulated in double (in another order than
 * the scalar loop). avx2_scale: y[i] = x[i] * r * (w ? w[i] : 1), bit
 * for bit as the scalar products; y may alias x.
 * ref: the scalar loops of rmsnorm() and l2norm(). */
double avx2_sumsq(const float *x, int n);
void avx2_scale(float *y, const float *x, float r, const float *w, int n);

#endif

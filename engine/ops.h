/* ops.h - the math kernels shared by the layers, and the one BLAS wrapper.
 *
 * Kernels are leaf functions on restrict pointers; they never allocate.
 * ref: ../shared/docs/architectures.md sections 1.3-1.6.
 */
#ifndef HYSERVE_OPS_H
#define HYSERVE_OPS_H

#include <stdbool.h>

#include "model.h"

/* Set the thread count for OpenMP and OpenBLAS once. */
void ops_set_threads(int n);
int ops_get_threads(void);

/* OpenBLAS picks its kernels when the library loads. DYNAMIC_ARCH builds
 * that do not know the CPU (0.3.21 on Sapphire/Emerald Rapids under KVM,
 * say) fall back to SSE3 "Prescott" kernels, three to five times slower
 * than the AVX2/AVX-512 ones the CPU can run. If OPENBLAS_CORETYPE is unset
 * and that happened, set it (SkylakeX with AVX-512 F/BW/VL/DQ, Haswell
 * with AVX2+FMA) and re-execute the program with the same argv; on
 * success this does not return. Call first thing in main(). Returns the
 * core name OpenBLAS runs with otherwise; argv NULL: only that. */
const char *ops_blas_choose_core(char **argv);
/* "avx512", "avx2" or "scalar": the widest hand-written kernels in use */
const char *simd_name(void);

/* y = x * rsqrt(mean(x^2) + eps) * w   (w may be NULL: plain normalisation) */
void rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* x <- x / max(||x||_2, eps)   (llama.cpp ggml_l2_norm semantics) */
void l2norm(float *x, int n, float eps);
/* In-place softmax over n entries; -INFINITY entries get exactly 0. */
void softmax(float *x, int n);
/* NeoX partial RoPE on one head: pairs (i, i + n_rot/2), i < n_rot/2. */
void rope_neox(float *x, int n_rot, const float *inv_freq, int pos);
/* Adjacent-pair RoPE (llama.cpp NORM): pairs (2i, 2i + 1). */
void rope_norm(float *x, int n_rot, const float *inv_freq, int pos);
/* Either, by enum rope_type. */
void rope(float *x, int type, int n_rot, const float *inv_freq, int pos);

static inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
/* y[i] = silu(x[i]) * (b ? b[i] : 1), y may alias x or b; y[i] *= sigmoid(g[i]).
 * Vectorized when the CPU allows (simd.h), one thread. */
void vec_silu_mul(float *y, const float *x, const float *b, long n);
void vec_sigmoid_mul(float *y, const float *g, long n);
/* PyTorch softplus (beta 1, threshold 20) */
static inline float softplus(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

/* Y[t][o] = sum_i W[o][i] X[t][i] for t < n_tok. X: [n_tok][W->n_in],
 * Y: [n_tok][W->n_out], both row-major and dense. scratch must hold
 * matmul_scratch_floats() floats. Uses all threads. */
void matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, float *scratch);
long matmul_scratch_floats(const weight *W, int n_tok);
/* Y[i] = X W[i]^T for i < n <= MATMUL_MANY_MAX: what n matmul() calls give
 * (the same kernels and activation rounding), but weights of one type and
 * width that take the one-token or AMX decode kernels share one parallel
 * region and one preparation of X. scratch: the largest of the n
 * matmul_scratch_floats(). */
#define MATMUL_MANY_MAX 8
void matmul_many(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                 float *scratch);
/* Tuning and tests: batches of up to n_tok tokens (default 16) take the
 * small-batch kernel instead of sgemm; 1 turns it off. */
void matmul_set_small_max(int n_tok);
/* Decode steps (the engine turns this on for passes where every sequence
 * adds one token, off for prompts; per calling thread, default off).
 * Q8_0 weights always meet int8 activations for one token (quantized per
 * block of 32, as llama.cpp does); on CPUs with AMX, in a decode step of
 * several tokens too, on int8 tiles, so a sequence decoded in a batch sees
 * the same int8 inputs as decoded alone. BF16 weights in a decode step of
 * several tokens on AMX-BF16 meet activations rounded to bf16 (as
 * llama.cpp rounds them for every BF16 product); one token keeps f32
 * activations. Without AMX, batches keep f32 activations. */
void matmul_set_decode_step(bool on);

/* C = alpha * op(A) op(B) + beta * C, row-major, op = transpose if ta/tb.
 * A is M x K after op, B is K x N after op. The one place BLAS is called. */
void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
          const float *B, int ldb, float beta, float *C, int ldc);

/* B <- A^-1 B with A (M x M) unit lower triangular (diagonal and upper
 * part never read), B M x N, row-major. BLAS strsm. */
void trsm_lower_unit(int M, int N, const float *A, int lda, float *B, int ldb);

#endif

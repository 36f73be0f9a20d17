/* vecmath.h - the math kernels shared by the layers: norms, RoPE, softmax,
 * activations.
 *
 * Kernels are leaf functions on restrict pointers; they never allocate.
 * ref: docs/models.md sections 1.3-1.6.
 */
#ifndef HYSERVE_VECMATH_H
#define HYSERVE_VECMATH_H

enum rope_type {
    ROPE_NEOX = 0,              /* pairs (i, i + n_rot/2): qwen35, qwen3next, qwen3 */
    ROPE_NORM = 1,              /* adjacent pairs (2i, 2i+1): llama */
};

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
 * Vectorized when the CPU allows (the kernel table, cpu.h), one thread. */
void vec_silu_mul(float *y, const float *x, const float *b, long n);
void vec_sigmoid_mul(float *y, const float *g, long n);
/* Their scalar references, and those of the norms' two loops: sumsq_ref
 * sum_i x[i]^2 in double; scale_ref y[i] = x[i] * r * (w ? w[i] : 1), y may
 * alias x. The kernel table (cpu.h) holds these or their AVX2 forms. */
void silu_mul_ref(float *y, const float *x, const float *b, long n);
void sigmoid_mul_ref(float *y, const float *g, long n);
double sumsq_ref(const float *x, int n);
void scale_ref(float *y, const float *x, float r, const float *w, int n);
/* PyTorch softplus (beta 1, threshold 20) */
static inline float softplus(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

#endif

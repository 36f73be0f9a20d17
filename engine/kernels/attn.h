/* attn.h - causal GQA softmax attention over the paged KV cache.
 *
 * Owns: the attention core softmax(q K^T * scale + causal mask) V for the
 * new rows of one sequence, in three forms that must agree:
 *   attn_gqa_ref   plain reference: per query row and head, scores over
 *                  all visible keys, softmax, weighted sum of V rows;
 *   decode path    (few rows) per query row and KV head, the whole query
 *                  group at once with an online softmax, so each K and V
 *                  row is read once per group, never n_head / n_kv times
 *                  (AVX2 or AVX-512 sums; the latter prefetch the V pages
 *                  of a block while its K pages are summed);
 *   tiled path     (prefill) query blocks x key blocks on sgemm with an
 *                  online softmax: no n x n score matrix is ever stored;
 *                  memory is O(block^2) per thread whatever the context.
 * attn_gqa picks the decode or tiled path and runs work items (KV head x
 * query row or block) across OpenMP threads.
 * Does not own: q/k norms, RoPE, writing K/V into the cache, the output
 * gate (attention.c), or page allocation (cache.c).
 * ref: docs/models.md section 1.5; online softmax as in
 * Milakov & Gimelshein 2018 (running max m, running sum l, rescale by
 * exp(m_old - m_new) when the max grows).
 */
#ifndef HYSERVE_ATTN_H
#define HYSERVE_ATTN_H

#include <stdbool.h>

#include "kv_pages.h"

/* One call: n new query rows of one sequence at positions pos0 .. pos0+n-1;
 * row t sees cached keys 0 .. pos0 + t (their K/V must be in the cache,
 * including the new rows' own). Query head h uses KV head h / (n_head / n_kv). */
typedef struct attn_args {
    kv_pages kv;                /* the sequence's cached K/V rows of this layer */
    int n_head, n_kv, head_dim;
    const float *Q;             /* row t, head h: Q + t * q_stride + h * q_head, head_dim floats */
    int q_stride, q_head;
    float *out;                 /* row t, head h: out + t * out_stride + h * head_dim */
    int out_stride;
    int n, pos0;
    float scale;                /* applied to q.k before the softmax */
    bool decode_rows;           /* every row on the decode path whatever n: each row's bits those of a
                                   one-token step at its position (an exact verify step) */
} attn_args;

/* Floats of scratch one thread needs (attn_gqa takes omp_get_max_threads()
 * times this). Independent of the context length. */
long attn_scratch_floats(int head_dim, int group, int page_tokens);

/* The fast path: AVX2 kernels when the CPU has them, sgemm for the tiled
 * prefill, OpenMP over work items. scratch: omp_get_max_threads() *
 * attn_scratch_floats(head_dim, n_head / n_kv, kv.page_tokens) floats. */
void attn_gqa(const attn_args *a, float *scratch);
/* attn_gqa over n calls (sequences of one batch): the ones with enough
 * rows run tiled one after another; the others (decode rows) share one
 * parallel loop over (call, row, KV head), one fork/join for the batch. */
/* (a is not const: GCC 12 flags a partly filled array passed as const) */
void attn_gqa_batch(attn_args *a, int n, float *scratch);

/* The reference. scores: pos0 + n floats. Serial. */
void attn_gqa_ref(const attn_args *a, float *scores);

/* Tuning and tests: rows per call from which the tiled path is used
 * (default 16); a huge value forces the decode path, 1 the tiled one. */
void attn_set_tiled_min_rows(int n);

/* Benchmarks: decode reads the pages of a block in pairs, two streams
 * (default on); off reads them one at a time. Call between passes. */
void attn_set_decode_pairs(bool on);

/* e^x for x <= 0 in f32 lanes, |relative error| < 4e-7 against expf for
 * x >= -87; 0 below (where expf is subnormal or 0). Exposed for tests.
 * Through the kernel table (cpu.h): the AVX2 form or the scalar one. */
void attn_exp_block(const float *x, float *y, int n);
void attn_exp_block_ref(const float *x, float *y, int n);
void attn_exp_block_avx2(const float *x, float *y, int n);

#endif

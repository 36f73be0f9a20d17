/* attention.c - gated softmax attention (GQA) over the paged KV cache.
 *
 * Owns: q/k RMSNorm, partial NeoX RoPE, writing K/V into the cache, the
 * causal softmax over cached keys, and the sigmoid output gate.
 * Does not own: the projections (forward.c) or page allocation (cache.c).
 * ref: docs/models.md section 1.5; section 9 (the causal
 * mask as minus infinity: a query at position p sees keys 0..p only).
 */
#include <math.h>
#include <omp.h>

#include "kernels/attn.h"
#include "kernels/vecmath.h"
#include "layers.h"

/* One query row against the first n_keys cached keys of one KV head.
 * scores[j] = (q . k_j) * scale; p = softmax(scores); out = sum_j p_j v_j.
 * Keys past the query's position are never visited, which is the causal
 * mask's -inf: they get exactly zero weight. */
void attn_row(const cache *c, const cache_seq *s, int la, int kvh, const float *q, int n_keys,
              float scale, float *scores, float *out)
{
    const int HD = c->head_dim;
    for (int j = 0; j < n_keys; j++)
        scores[j] = cache_dot(c, cache_k(c, s, la, kvh, j), q, HD) * scale;
    softmax(scores, n_keys);
    for (int d = 0; d < HD; d++)
        out[d] = 0.0f;
    for (int j = 0; j < n_keys; j++)
        cache_axpy(c, out, scores[j], cache_v(c, s, la, kvh, j), HD);
}

void attn_forward(const model *m, const layer *L, const cache *c, const fwd_item *items,
                  int n_items, float *Q, float *K, const float *V, float *out, float *scores)
{
    const int HD = m->head_dim, NH = m->n_head, NKV = m->n_head_kv;
    const int la = L->kind_idx;
    const int q_head = m->attn_gated ? 2 * HD : HD;     /* per head [q | gate] or [q] */
    const int q_stride = NH * q_head, kv_stride = NKV * HD;

    /* 1. per-head norms and RoPE; K/V rows into the cache */
    for (int ii = 0; ii < n_items; ii++) {
        const fwd_item *it = &items[ii];
        #pragma omp parallel for schedule(static) if (it->n >= 4)
        for (int t = 0; t < it->n; t++) {
            int row = it->row0 + t, pos = it->pos0 + t;
            for (int h = 0; h < NH; h++) {
                float *q = Q + (size_t)row * q_stride + (size_t)h * q_head;
                if (L->q_norm)
                    rmsnorm(q, q, L->q_norm, HD, m->eps);
                if (m->use_rope)
                    rope(q, m->rope_type, m->n_rot, m->rope_inv_freq, pos);
            }
            for (int h = 0; h < NKV; h++) {
                float *k = K + (size_t)row * kv_stride + (size_t)h * HD;
                if (L->k_norm)
                    rmsnorm(k, k, L->k_norm, HD, m->eps);
                if (m->use_rope)
                    rope(k, m->rope_type, m->n_rot, m->rope_inv_freq, pos);
                cache_store(c, cache_k(c, it->s, la, h, pos), k, HD);
                cache_store(c, cache_v(c, it->s, la, h, pos), V + (size_t)row * kv_stride + (size_t)h * HD, HD);
            }
        }
    }

    /* 2. a[t,h] = softmax_j(q.k_j * scale), j <= pos  (the causal mask),
     *    out = sum_j a_j v_j (kernels/attn.c: GQA decode reads each KV head
     *    once per query group; prefill is tiled with an online softmax) */
    attn_args aa[ENGINE_UBATCH];
    for (int ii = 0; ii < n_items; ii++) {
        const fwd_item *it = &items[ii];
        aa[ii] = (attn_args){ .kv = cache_kv_pages(c, it->s, la), .n_head = NH, .n_kv = NKV, .head_dim = HD,
                              .Q = Q + (size_t)it->row0 * q_stride, .q_stride = q_stride, .q_head = q_head,
                              .out = out + (size_t)it->row0 * NH * HD, .out_stride = NH * HD,
                              .n = it->n, .pos0 = it->pos0, .scale = m->attn_scale, .decode_rows = it->exact };
    }
    attn_gqa_batch(aa, n_items, scores);
    /* 3. out *= sigmoid(gate) */
    if (m->attn_gated) {
        int T = 0;
        for (int ii = 0; ii < n_items; ii++)
            T = items[ii].row0 + items[ii].n > T ? items[ii].row0 + items[ii].n : T;
        #pragma omp parallel for schedule(static) if (T >= 4)
        for (int row = 0; row < T; row++)
            for (int h = 0; h < NH; h++) {
                const float *gate = Q + (size_t)row * q_stride + (size_t)h * q_head + HD;
                vec_sigmoid_mul(out + (size_t)row * NH * HD + (size_t)h * HD, gate, HD);
            }
    }
}

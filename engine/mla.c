/* mla.c - multi-head latent attention (DeepSeek-V2) over a compressed cache.
 *
 * Owns: the kv_a norm, the decoupled RoPE key shared by all heads, caching
 * only [c (kv_lora) | k_pe (rope)] per token, and two ways to attend that
 * must agree: "expanded" rebuilds per-head keys and values from the
 * latent (k_nope_h = W_kb,h c, v_h = W_vb,h c), "absorbed" folds W_kb into
 * the query and W_vb into the output so decode never rebuilds them:
 *   q_abs_h = W_kb,h^T q_nope_h;  s_h(t) = (q_abs_h . c_t + q_pe_h . k_pe_t) * scale
 *   ctx_h = sum_t p_h(t) c_t;     out_h = W_vb,h ctx_h
 * Does not own: the q / kv_a projections and attn_output (forward.c).
 * ref: docs/models.md section 3.2; RoPE on adjacent pairs
 * (llama.cpp NORM for deepseek2).
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/blas.h"
#include "kernels/quant.h"
#include "kernels/vecmath.h"
#include "layers.h"
#include "matmul.h"

long mla_scratch_floats(const model *m, int n_ctx)
{
    if (!m->n_mla)
        return 0;
    const long R = m->mla_kv_lora, NH = m->n_head;
    /* expanded: latents [n_ctx][R], k_nope [n_ctx][NH][nope], v [n_ctx][NH][v],
     * a dequantized W_kb head [R][nope], one head's v [n_ctx][v];
     * absorbed per thread: q_abs [R], ctx [R] */
    long expanded = (long)n_ctx * (R + NH * (m->mla_nope + m->mla_v) + m->mla_v) + R * m->mla_nope;
    long absorbed = (long)omp_get_max_threads() * 2 * R;
    return expanded > absorbed ? expanded : absorbed;
}

/* Rebuild k_nope and v for context tokens [0, n_ctx) of one sequence. */
static void mla_expand(const model *m, const layer *L, const cache *c, const cache_seq *s, int n_ctx,
                       float *lat, float *kn, float *vv, float *kb, float *vtmp, bool decode, float *mm)
{
    const int R = m->mla_kv_lora, NH = m->n_head, DN = m->mla_nope, DV = m->mla_v;
    const int lm = L->kind_idx;
    for (int t = 0; t < n_ctx; t++)
        cache_load(c, cache_mla(c, s, lm, t), lat + (size_t)t * R, R);
    for (int h = 0; h < NH; h++) {
        /* k_nope_h(t) = W_kb,h c(t); the file holds W_kb,h^T as R rows of DN */
        const char *kb_h = weight_slab(&L->wk_b, L->k_b_stride, h).data;
        for (int r = 0; r < R; r++)
            dequant_row(L->wk_b.type, kb_h + (size_t)r * L->wk_b.row_bytes, kb + (size_t)r * DN, DN);
        gemm(false, false, n_ctx, DN, R, 1.0f, lat, R, kb, DN, 0.0f, kn + (size_t)h * DN, NH * DN);
        /* v_h(t) = W_vb,h c(t): [n_ctx][DV] for head h, scattered into [t][h][DV] */
        weight vb = weight_slab(&L->wv_b, L->v_b_stride, h);
        matmul(vtmp, &vb, lat, n_ctx, decode, mm);
        for (int t = 0; t < n_ctx; t++)
            memcpy(vv + ((size_t)t * NH + h) * DV, vtmp + (size_t)t * DV, sizeof(float) * DV);
    }
}

void mla_forward(const model *m, const layer *L, const cache *c, const fwd_item *items, int n_items,
                 float *Q, float *KVA, float *out, int mode, bool decode, float *scores, float *scratch, float *mm)
{
    const int R = m->mla_kv_lora, DR = m->mla_rope, DN = m->mla_nope, DV = m->mla_v;
    const int NH = m->n_head, QK = DN + DR, lm = L->kind_idx;

    for (int ii = 0; ii < n_items; ii++) {
        const fwd_item *it = &items[ii];
        /* 1. latent c = RMSNorm(kv_a[:R]) * w, shared k_pe = RoPE(kv_a[R:]);
         *    q_pe = RoPE(q_pe) per head; cache [c | k_pe] */
        #pragma omp parallel for schedule(static)
        for (int t = 0; t < it->n; t++) {
            int row = it->row0 + t, pos = it->pos0 + t;
            float *kva = KVA + (size_t)row * (R + DR);
            rmsnorm(kva, kva, L->kv_a_norm, R, m->eps);
            if (m->mla_use_rope)
                rope_norm(kva + R, DR, m->mla_inv_freq, pos);
            cache_store(c, cache_mla(c, it->s, lm, pos), kva, R + DR);
            for (int h = 0; h < NH; h++)
                if (m->mla_use_rope)
                    rope_norm(Q + (size_t)row * NH * QK + (size_t)h * QK + DN, DR, m->mla_inv_freq, pos);
        }

        /* an exact item: the absorbed form, as its one-token steps take
         * (the expanded form's exact items come one token at a time) */
        const bool absorbed = mode == ENGINE_MLA_ABSORBED || (mode == ENGINE_MLA_AUTO && (it->n == 1 || it->exact));
        const int n_ctx = it->pos0 + it->n;
        if (absorbed) {
            /* 2a. attend over the latent itself: MQA with a (R + DR)-dim key */
            #pragma omp parallel for collapse(2) schedule(dynamic, 1)
            for (int t = 0; t < it->n; t++) {
                for (int h = 0; h < NH; h++) {
                    int row = it->row0 + t, pos = it->pos0 + t;
                    const float *q = Q + (size_t)row * NH * QK + (size_t)h * QK;
                    float *qa = scratch + (size_t)omp_get_thread_num() * 2 * R, *ctx = qa + R;
                    float *sc = scores + (size_t)omp_get_thread_num() * c->n_ctx;
                    /* q_abs[r] = sum_i W_kb,h[i][r] q_nope[i]: row r of the stored W_kb,h^T */
                    const char *kb_h = weight_slab(&L->wk_b, L->k_b_stride, h).data;
                    for (int r = 0; r < R; r++)
                        qa[r] = dot_row_fast(L->wk_b.type, kb_h + (size_t)r * L->wk_b.row_bytes, q, DN);
                    for (int j = 0; j <= pos; j++) {
                        const void *lat = cache_mla(c, it->s, lm, j);
                        const char *kpe = (const char *)lat + (size_t)R * c->kv_es;
                        sc[j] = (cache_dot(c, lat, qa, R) + cache_dot(c, kpe, q + DN, DR)) * m->mla_scale;
                    }
                    softmax(sc, pos + 1);
                    memset(ctx, 0, sizeof(float) * R);
                    for (int j = 0; j <= pos; j++)
                        cache_axpy(c, ctx, sc[j], cache_mla(c, it->s, lm, j), R);
                    /* out_h = W_vb,h ctx */
                    weight vb = weight_slab(&L->wv_b, L->v_b_stride, h);
                    float *o = out + (size_t)row * NH * DV + (size_t)h * DV;
                    for (int d = 0; d < DV; d++)
                        o[d] = dot_row_fast(vb.type, (const char *)vb.data + (size_t)d * vb.row_bytes, ctx, R);
                }
            }
        } else {
            /* 2b. rebuild per-head k_nope and v for the whole context, then attend */
            float *lat = scratch, *kn = lat + (size_t)c->n_ctx * R;
            float *vv = kn + (size_t)c->n_ctx * NH * DN, *kb = vv + (size_t)c->n_ctx * NH * DV;
            float *vtmp = kb + (size_t)R * DN;
            /* the expansion over the context is not a row of the step:
             * it multiplies as a one-token step's does, off exact */
            const bool was = matmul_set_exact(false);
            mla_expand(m, L, c, it->s, n_ctx, lat, kn, vv, kb, vtmp, decode, mm);
            matmul_set_exact(was);
            #pragma omp parallel for collapse(2) schedule(dynamic, 1)
            for (int t = 0; t < it->n; t++) {
                for (int h = 0; h < NH; h++) {
                    int row = it->row0 + t, pos = it->pos0 + t;
                    const float *q = Q + (size_t)row * NH * QK + (size_t)h * QK;
                    float *sc = scores + (size_t)omp_get_thread_num() * c->n_ctx;
                    for (int j = 0; j <= pos; j++) {
                        const float *k = kn + ((size_t)j * NH + h) * DN;
                        const char *kpe = (const char *)cache_mla(c, it->s, lm, j) + (size_t)R * c->kv_es;
                        float d = 0.0f;
                        for (int i = 0; i < DN; i++)
                            d += q[i] * k[i];
                        sc[j] = (d + cache_dot(c, kpe, q + DN, DR)) * m->mla_scale;
                    }
                    softmax(sc, pos + 1);
                    float *o = out + (size_t)row * NH * DV + (size_t)h * DV;
                    memset(o, 0, sizeof(float) * DV);
                    for (int j = 0; j <= pos; j++) {
                        const float *v = vv + ((size_t)j * NH + h) * DV;
                        for (int d = 0; d < DV; d++)
                            o[d] += sc[j] * v[d];
                    }
                }
            }
        }
    }
}

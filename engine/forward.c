/* forward.c - the layer loop over a batch of sequences.
 *
 * Owns: splitting a batch into passes of at most ENGINE_UBATCH rows, the
 * residual stream, the per-layer switch on kind, the SwiGLU MLP and the LM
 * head. Projections of all sequences in a pass share one matrix product,
 * so a weight is read once per pass whatever the batch size.
 * ref: docs/models.md section 1.2 (block structure).
 */
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "engine_impl.h"
#include "kernels/blas.h"
#include "kernels/quant.h"
#include "kernels/vecmath.h"
#include "matmul.h"

static void add_rows(float *restrict x, const float *restrict y, long n)
{
    #pragma omp parallel for schedule(static) if (n >= 65536)
    for (long i = 0; i < n; i++)
        x[i] += y[i];
}

/* qwen3next DeltaNet inputs: split ssm_ba (per key head g: [b (r) | a (r)])
 * into beta/alpha logits by value head g*r + j; for legacy files also
 * de-interleave the fused ssm_in (per key head g: [q | k | v (r*d_v) |
 * z (r*d_v)]) into [q all | k all | v all] and z.
 * ref: docs/models.md 1.4(a) and 2.3 item 5. */
static void dnet_inputs_qwen3next(const model *m, const layer *L, fwd_scratch *s, int T)
{
    const int NK = m->ssm_n_k, NV = m->ssm_n_v, DK = m->ssm_d_k, DV = m->ssm_d_v, r = NV / NK;
    if (L->legacy_ssm_in) {
        const int W = 2 * NK * DK + 2 * NV * DV, G = 2 * DK + 2 * r * DV;
        matmul(s->t, &L->ssm_in, s->xn, T, s->mm);
        for (int row = 0; row < T; row++) {
            const float *src = s->t + (size_t)row * W;
            float *qkv = s->a + (size_t)row * m->conv_dim, *z = s->c + (size_t)row * NV * DV;
            for (int g = 0; g < NK; g++) {
                const float *grp = src + (size_t)g * G;
                memcpy(qkv + (size_t)g * DK, grp, sizeof(float) * DK);
                memcpy(qkv + (size_t)(NK + g) * DK, grp + DK, sizeof(float) * DK);
                memcpy(qkv + (size_t)2 * NK * DK + (size_t)g * r * DV, grp + 2 * DK, sizeof(float) * r * DV);
                memcpy(z + (size_t)g * r * DV, grp + 2 * DK + r * DV, sizeof(float) * r * DV);
            }
        }
    } else {
        matmul(s->a, &L->wqkv, s->xn, T, s->mm);
        matmul(s->c, &L->wz, s->xn, T, s->mm);
    }
    matmul(s->t, &L->ssm_ba, s->xn, T, s->mm);
    for (int row = 0; row < T; row++) {
        const float *ba = s->t + (size_t)row * 2 * NV;
        for (int g = 0; g < NK; g++)
            for (int j = 0; j < r; j++) {
                s->b[(size_t)row * NV + g * r + j] = ba[g * 2 * r + j];
                s->e[(size_t)row * NV + g * r + j] = ba[g * 2 * r + r + j];
            }
    }
}

static weight expert_view(const weight *w, size_t stride, int ex)
{
    weight v = *w;
    v.data = (const char *)w->data + stride * (size_t)ex;
    return v;
}

/* Mixture of experts with a gated shared expert (qwen3next), into s->y:
 *   p = softmax(W_r x); top-k; w = p_topk / sum(p_topk)
 *   y = sum_k w_k SwiGLU_k(x) + sigmoid(g_sh . x) SwiGLU_sh(x)
 * Rows routed to one expert are gathered so each expert's weights are
 * read once per pass. ref: docs/models.md 1.6. */
static void moe_forward(const model *m, const layer *L, fwd_scratch *s, int T)
{
    const int E = m->n_embd, NE = m->n_expert, K = m->n_expert_used, FF = m->n_ff_exp;
    matmul(s->t, &L->router, s->xn, T, s->mm);
    for (int row = 0; row < T; row++) {
        float *p = s->t + (size_t)row * NE;
        softmax(p, NE);
        int *sel = s->sel + (size_t)row * K;
        float *w = s->selw + (size_t)row * K, sum = 0.0f;
        for (int k = 0; k < K; k++) {              /* top-k, ties to the lower index */
            int best = -1;
            for (int ex = 0; ex < NE; ex++) {
                bool taken = false;
                for (int j = 0; j < k; j++)
                    taken |= sel[j] == ex;
                if (!taken && (best < 0 || p[ex] > p[best]))
                    best = ex;
            }
            sel[k] = best;
            w[k] = p[best];
            sum += p[best];
        }
        for (int k = 0; k < K; k++)
            w[k] /= sum;
    }
    memset(s->y, 0, sizeof(float) * (size_t)T * E);
    for (int ex = 0; ex < NE; ex++) {
        int cnt = 0;
        for (int row = 0; row < T; row++)
            for (int k = 0; k < K; k++)
                if (s->sel[(size_t)row * K + k] == ex) {
                    s->rows[cnt] = row;
                    s->roww[cnt++] = s->selw[(size_t)row * K + k];
                }
        if (cnt == 0)
            continue;
        for (int i = 0; i < cnt; i++)
            memcpy(s->g + (size_t)i * E, s->xn + (size_t)s->rows[i] * E, sizeof(float) * E);
        weight wg = expert_view(&L->gate_exps, L->up_gate_stride, ex);
        weight wu = expert_view(&L->up_exps, L->up_gate_stride, ex);
        weight wd = expert_view(&L->down_exps, L->down_stride, ex);
        matmul(s->a, &wg, s->g, cnt, s->mm);
        matmul(s->b, &wu, s->g, cnt, s->mm);
        vec_silu_mul(s->a, s->a, s->b, (long)cnt * FF);
        matmul(s->g2, &wd, s->a, cnt, s->mm);
        for (int i = 0; i < cnt; i++) {
            float *y = s->y + (size_t)s->rows[i] * E;
            const float *o = s->g2 + (size_t)i * E;
            for (int d = 0; d < E; d++)
                y[d] += s->roww[i] * o[d];
        }
    }
    /* shared expert, scaled by a scalar sigmoid gate per row */
    matmul(s->a, &L->gate_shexp, s->xn, T, s->mm);
    matmul(s->b, &L->up_shexp, s->xn, T, s->mm);
    vec_silu_mul(s->a, s->a, s->b, (long)T * m->n_ff_shexp);
    matmul(s->g2, &L->down_shexp, s->a, T, s->mm);
    for (int row = 0; row < T; row++) {
        const float *x = s->xn + (size_t)row * E;
        float gs = 0.0f;
        for (int d = 0; d < E; d++)
            gs += L->shexp_gate[d] * x[d];
        gs = sigmoid(gs);
        float *y = s->y + (size_t)row * E;
        const float *o = s->g2 + (size_t)row * E;
        for (int d = 0; d < E; d++)
            y[d] += gs * o[d];
    }
}

/* x = x + Mixer(RMSNorm_in(x)); x = x + FFN(RMSNorm_post(x)) for one layer */
static void layer_forward(engine *e, const layer *L, const fwd_item *items, int n_items, int T)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const int E = m->n_embd;

    #pragma omp parallel for schedule(static) if (T >= 16)
    for (int r = 0; r < T; r++)
        rmsnorm(s->xn + (size_t)r * E, s->x + (size_t)r * E, L->attn_norm, E, m->eps);

    if (L->kind == ENGINE_LAYER_ATTN) {
        /* [T][n_head*2*hd], [T][n_kv*hd], [T][n_kv*hd] */
        matmul_many(3, (float *[]){ s->a, s->b, s->c }, (const weight *[]){ &L->wq, &L->wk, &L->wv }, s->xn, T,
                    s->mm);
        attn_forward(m, L, &e->kv, items, n_items, s->a, s->b, s->c, s->d, s->scores);
        matmul(s->y, &L->wo, s->d, T, s->mm);
    } else if (L->kind == ENGINE_LAYER_MLA) {
        if (m->mla_q_lora > 0) {                                    /* q = W_qb RMSNorm(W_qa x) */
            matmul(s->t, &L->wq_a, s->xn, T, s->mm);
            for (int r = 0; r < T; r++)
                rmsnorm(s->t + (size_t)r * m->mla_q_lora, s->t + (size_t)r * m->mla_q_lora,
                        L->q_a_norm, m->mla_q_lora, m->eps);
            matmul(s->a, &L->wq_b, s->t, T, s->mm);
        } else {
            matmul(s->a, &L->wq, s->xn, T, s->mm);                  /* [T][n_head*(nope+rope)] */
        }
        matmul(s->b, &L->wkv_a, s->xn, T, s->mm);                   /* [T][kv_lora+rope] */
        mla_forward(m, L, &e->kv, items, n_items, s->a, s->b, s->d, e->params.mla_mode,
                    s->scores, s->mla, s->mm);
        matmul(s->y, &L->wo, s->d, T, s->mm);
    } else {
        if (m->dnet_grouped) {
            dnet_inputs_qwen3next(m, L, s, T);
        } else {
            /* [T][conv_dim], [T][n_v], [T][n_v], [T][n_v*d_v] */
            matmul_many(4, (float *[]){ s->a, s->b, s->e, s->c },
                        (const weight *[]){ &L->wqkv, &L->wb, &L->wa, &L->wz }, s->xn, T, s->mm);
        }
        dnet_forward(m, L, &e->kv, items, n_items, s->a, s->b, s->e, s->c, s->d,
                     e->params.dnet_mode, s->dnet);
        matmul(s->y, &L->wout, s->d, T, s->mm);
    }
    add_rows(s->x, s->y, (long)T * E);

    /* SwiGLU: down(silu(gate(x)) * up(x)), or the mixture of experts */
    #pragma omp parallel for schedule(static) if (T >= 16)
    for (int r = 0; r < T; r++)
        rmsnorm(s->xn + (size_t)r * E, s->x + (size_t)r * E, L->post_norm, E, m->eps);
    if (L->moe) {
        moe_forward(m, L, s, T);
        add_rows(s->x, s->y, (long)T * E);
        return;
    }
    matmul_many(2, (float *[]){ s->a, s->b }, (const weight *[]){ &L->ffn_gate, &L->ffn_up }, s->xn, T, s->mm);
    const long nf = (long)T * m->n_ff;
    #pragma omp parallel if (T > 1)
    {   /* contiguous, 8-aligned shares: silu(gate) * up */
        const long nt = omp_get_num_threads(), it = omp_get_thread_num();
        const long i0 = nf * it / nt & ~7L, i1 = it == nt - 1 ? nf : nf * (it + 1) / nt & ~7L;
        vec_silu_mul(s->a + i0, s->a + i0, s->b + i0, i1 - i0);
    }
    matmul(s->y, &L->ffn_down, s->a, T, s->mm);
    add_rows(s->x, s->y, (long)T * E);
}

/* One pass over T rows; out_rows[r] receives row r's logits when not NULL. */
static void forward_pass(engine *e, const fwd_item *items, int n_items, const int32_t *tokens,
                         float *const *out_rows, int T)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const int E = m->n_embd, NV = m->n_vocab;

    for (int r = 0; r < T; r++)
        dequant_row(m->tok_embd.type,
                    (const char *)m->tok_embd.data + (size_t)tokens[r] * m->tok_embd.row_bytes,
                    s->x + (size_t)r * E, E);
    for (int il = 0; il < m->n_layer; il++)
        layer_forward(e, &m->layers[il], items, n_items, T);

    /* logits = LMHead(RMSNorm_final(x)) for the requested rows, in groups */
    int r = 0;
    while (r < T) {
        int rows[LOGIT_GROUP], ng = 0;
        for (; r < T && ng < LOGIT_GROUP; r++)
            if (out_rows[r])
                rows[ng++] = r;
        if (ng == 0)
            continue;
        for (int g = 0; g < ng; g++)
            rmsnorm(s->lx + (size_t)g * E, s->x + (size_t)rows[g] * E, m->output_norm, E, m->eps);
        matmul(s->logits, &m->output, s->lx, ng, s->mm);
        for (int g = 0; g < ng; g++)
            memcpy(out_rows[rows[g]], s->logits + (size_t)g * NV, (size_t)NV * sizeof(float));
    }
}

int engine_forward(engine *e, const engine_batch_item *items, int n_items, char *err,
                   size_t errlen)
{
    const model *m = e->m;
    cache *c = &e->kv;
    /* OpenMP thread counts are per calling thread: the owner thread may not
     * be the one that opened the engine, and scratch is sized for n_threads */
    blas_set_threads(e->n_threads);
    if (n_items <= 0) {
        snprintf(err, errlen, "empty batch");
        return -1;
    }
    /* validate everything before touching any state */
    for (int i = 0; i < n_items; i++) {
        const engine_batch_item *it = &items[i];
        cache_seq *sq = cache_get(c, it->seq);
        if (!sq) {
            snprintf(err, errlen, "batch item %d: sequence %d does not exist", i, it->seq);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq) {
                snprintf(err, errlen, "sequence %d appears twice in one batch", it->seq);
                return -1;
            }
        if (it->n_tokens <= 0 || !it->tokens) {
            snprintf(err, errlen, "batch item %d has no tokens", i);
            return -1;
        }
        if (it->logits != ENGINE_LOGITS_NONE && !it->out) {
            snprintf(err, errlen, "batch item %d asks for logits without an output buffer", i);
            return -1;
        }
        for (int t = 0; t < it->n_tokens; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= m->n_vocab) {
                snprintf(err, errlen, "token id %d is out of range (vocabulary has %d tokens)",
                         it->tokens[t], m->n_vocab);
                return -1;
            }
        if (sq->n_past + it->n_tokens > c->n_ctx) {
            snprintf(err, errlen, "context full: %d cached + %d new tokens exceeds the context of %d",
                     sq->n_past, it->n_tokens, c->n_ctx);
            return -1;
        }
    }
    /* Pages for every item or for none (engine.h: on error no sequence is
     * modified): count what the items lack, make room for all of it at
     * once, and only then hand the pages out, which cannot fail. */
    int n_short = 0, first_short = -1;
    for (int i = 0; i < n_items; i++) {
        const int k = cache_pages_short(c, items[i].seq, cache_get(c, items[i].seq)->n_past + items[i].n_tokens);
        if (k > 0 && first_short < 0)
            first_short = i;
        n_short += k;
    }
    if (cache_make_room(c, n_short) != 0) {
        const engine_batch_item *it = &items[first_short];
        snprintf(err, errlen, "cache budget exhausted: sequence %d needs room for %d tokens",
                 it->seq, cache_get(c, it->seq)->n_past + it->n_tokens);
        return -1;
    }
    for (int i = 0; i < n_items; i++) {
        cache_seq *sq = cache_get(c, items[i].seq);
        if (cache_reserve(c, items[i].seq, sq->n_past + items[i].n_tokens) != 0) {
            snprintf(err, errlen, "cache: sequence %d lost the room made for it", items[i].seq);
            return -1;
        }
    }

    /* passes of at most ENGINE_UBATCH rows; an item may span passes */
    int item = 0, off = 0;
    fwd_item fi[ENGINE_UBATCH];
    int32_t toks[ENGINE_UBATCH];
    float *out_rows[ENGINE_UBATCH];
    while (item < n_items) {
        int T = 0, n_fi = 0;
        while (item < n_items && T < ENGINE_UBATCH) {
            const engine_batch_item *it = &items[item];
            cache_seq *sq = cache_get(c, it->seq);
            int take = it->n_tokens - off;
            if (take > ENGINE_UBATCH - T)
                take = ENGINE_UBATCH - T;
            fi[n_fi] = (fwd_item){ .s = sq, .row0 = T, .n = take, .pos0 = sq->n_past };
            n_fi++;
            for (int t = 0; t < take; t++) {
                int ti = off + t;
                toks[T + t] = it->tokens[ti];
                float *dst = NULL;
                if (it->logits == ENGINE_LOGITS_ALL)
                    dst = it->out + (size_t)ti * m->n_vocab;
                else if (it->logits == ENGINE_LOGITS_LAST && ti == it->n_tokens - 1)
                    dst = it->out;
                out_rows[T + t] = dst;
            }
            T += take;
            off += take;
            if (off == it->n_tokens) {
                item++;
                off = 0;
            }
        }
        bool decode = true;                 /* every sequence of the pass adds one token */
        for (int i = 0; i < n_fi; i++)
            decode = decode && fi[i].n == 1;
        matmul_set_decode_step(decode);
        forward_pass(e, fi, n_fi, toks, out_rows, T);
        for (int i = 0; i < n_fi; i++)
            fi[i].s->n_past += fi[i].n;
    }
    return 0;
}

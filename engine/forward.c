/* forward.c - the layer loop over a batch of sequences.
 *
 * Owns: splitting a batch into passes of at most ENGINE_UBATCH rows, the
 * residual stream, the per-layer switch on kind, the SwiGLU MLP and the LM
 * head. Projections of all sequences in a pass share one matrix product,
 * so a weight is read once per pass whatever the batch size.
 * ref: ../shared/docs/architectures.md section 1.2 (block structure).
 */
#include <stdio.h>
#include <string.h>

#include "engine_impl.h"
#include "ops.h"
#include "quant.h"

static void add_rows(float *restrict x, const float *restrict y, long n)
{
    for (long i = 0; i < n; i++)
        x[i] += y[i];
}

/* x = x + Mixer(RMSNorm_in(x)); x = x + FFN(RMSNorm_post(x)) for one layer */
static void layer_forward(engine *e, const layer *L, const fwd_item *items, int n_items, int T)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const int E = m->n_embd;

    for (int r = 0; r < T; r++)
        rmsnorm(s->xn + (size_t)r * E, s->x + (size_t)r * E, L->attn_norm, E, m->eps);

    if (L->kind == ENGINE_LAYER_ATTN) {
        matmul(s->a, &L->wq, s->xn, T, s->mm);                      /* [T][n_head*2*hd] */
        matmul(s->b, &L->wk, s->xn, T, s->mm);                      /* [T][n_kv*hd] */
        matmul(s->c, &L->wv, s->xn, T, s->mm);                      /* [T][n_kv*hd] */
        attn_forward(m, L, &e->kv, items, n_items, s->a, s->b, s->c, s->d, s->scores);
        matmul(s->y, &L->wo, s->d, T, s->mm);
    } else {
        matmul(s->a, &L->wqkv, s->xn, T, s->mm);                    /* [T][conv_dim] */
        matmul(s->b, &L->wb, s->xn, T, s->mm);                      /* [T][n_v] */
        matmul(s->e, &L->wa, s->xn, T, s->mm);                      /* [T][n_v] */
        matmul(s->c, &L->wz, s->xn, T, s->mm);                      /* [T][n_v*d_v] */
        dnet_forward(m, L, &e->kv, items, n_items, s->a, s->b, s->e, s->c, s->d,
                     e->params.dnet_mode, s->dnet);
        matmul(s->y, &L->wout, s->d, T, s->mm);
    }
    add_rows(s->x, s->y, (long)T * E);

    /* SwiGLU: down(silu(gate(x)) * up(x)) */
    for (int r = 0; r < T; r++)
        rmsnorm(s->xn + (size_t)r * E, s->x + (size_t)r * E, L->post_norm, E, m->eps);
    matmul(s->a, &L->ffn_gate, s->xn, T, s->mm);
    matmul(s->b, &L->ffn_up, s->xn, T, s->mm);
    const long nf = (long)T * m->n_ff;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < nf; i++)
        s->a[i] = silu(s->a[i]) * s->b[i];
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
    for (int i = 0; i < n_items; i++) {
        cache_seq *sq = cache_get(c, items[i].seq);
        if (cache_reserve(c, items[i].seq, sq->n_past + items[i].n_tokens) != 0) {
            snprintf(err, errlen, "cache budget exhausted: sequence %d needs room for %d tokens",
                     items[i].seq, sq->n_past + items[i].n_tokens);
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
        forward_pass(e, fi, n_fi, toks, out_rows, T);
        for (int i = 0; i < n_fi; i++)
            fi[i].s->n_past += fi[i].n;
    }
    return 0;
}

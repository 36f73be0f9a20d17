/* mtp.c - the MTP (multi-token prediction, "nextn") block as a draft head.
 *
 * Owns: the MTP block's KV cache (a cache of one attention layer beside the
 * trunk's, made at open only with engine_params.mtp, one MTP sequence per
 * trunk sequence, empty at new and fork, freed with it), and
 * engine_mtp_step: the rows x = eh_proj([enorm(E[t]) | hnorm(h)]), the
 * block itself (forward.c's fwd_layer: the trunk's full-attention layer and
 * FFN code, its K/V routed to this cache by layer_kv) and the head
 * o = shared_head_norm(y), logits = head(o).
 * Does not own: the trunk's hidden rows (forward.c writes them into
 * engine_batch_item.hidden), what the rows mean for speculation
 * (runtime/sched_spec.c), the weights (model.c binds them).
 * ref: docs/models.md 1.7; vLLM's qwen3_next_mtp.py (the order of the
 * concat: embedding half first; the chained rows take o as h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "fault.h"
#include "kernels/blas.h"
#include "kernels/quant.h"
#include "kernels/vecmath.h"
#include "matmul.h"

int mtp_open(engine *e, char *err, size_t errlen)
{
    const model *m = e->m;
    const cache *kv = &e->kv;
    cache_layout cl = {
        .n_layers = 1, .n_head = m->n_head, .n_attn = 1, .n_kv = m->n_head_kv, .head_dim = m->head_dim,
        .kv_type = kv->kv_type, .page_tokens = kv->page_tokens, .n_ctx = kv->n_ctx, .max_seqs = kv->max_seqs,
        /* room for every sequence's full context, at most the trunk's budget */
        .budget_bytes = 0, .budget_max_bytes = kv->budget_bytes,
    };
    e->mtp_seq = FAULT_OR(malloc(sizeof(int) * (size_t)kv->max_seqs));
    e->mtp_in = FAULT_OR(malloc(sizeof(float) * (size_t)ENGINE_UBATCH * 2 * (size_t)m->n_embd));
    if (!e->mtp_seq || !e->mtp_in || cache_init(&e->mtp_kv, &cl) != 0) {
        snprintf(err, errlen, "%s: out of memory allocating the MTP cache", e->params.model_path);
        return -1;
    }
    for (int i = 0; i < kv->max_seqs; i++)
        e->mtp_seq[i] = -1;
    e->mtp_on = true;
    return 0;
}

void mtp_close(engine *e)
{
    if (e->mtp_on)
        cache_deinit(&e->mtp_kv);
    free(e->mtp_seq);
    free(e->mtp_in);
    e->mtp_seq = NULL;
    e->mtp_in = NULL;
    e->mtp_on = false;
}

void mtp_seq_new(engine *e, int seq)
{
    if (!e->mtp_on || seq < 0 || seq >= e->kv.max_seqs)
        return;
    /* no pages yet: a sequence that never drafts holds nothing here */
    e->mtp_seq[seq] = cache_seq_new(&e->mtp_kv);
}

void mtp_seq_free(engine *e, int seq)
{
    if (!e->mtp_on || seq < 0 || seq >= e->kv.max_seqs || e->mtp_seq[seq] < 0)
        return;
    cache_seq_free(&e->mtp_kv, e->mtp_seq[seq]);
    e->mtp_seq[seq] = -1;
}

/* seq's MTP sequence, NULL unless both are live */
static cache_seq *mtp_of(const engine *e, int seq)
{
    if (!e->mtp_on || !cache_get_const(&e->kv, seq) || e->mtp_seq[seq] < 0)
        return NULL;
    return cache_get((cache *)&e->mtp_kv, e->mtp_seq[seq]);
}

int engine_mtp_len(const engine *e, int seq)
{
    const cache_seq *s = mtp_of(e, seq);
    return s ? s->n_past : -1;
}

int engine_mtp_reserve(engine *e, int seq, int n_rows)
{
    if (!mtp_of(e, seq) || n_rows < 0)
        return -1;
    return cache_reserve(&e->mtp_kv, e->mtp_seq[seq], n_rows);
}

int engine_mtp_truncate(engine *e, int seq, int n_rows)
{
    const cache_seq *s = mtp_of(e, seq);
    if (!s || n_rows < 0 || n_rows > s->n_past)
        return -1;
    return cache_seq_truncate(&e->mtp_kv, e->mtp_seq[seq], n_rows);
}

/* The last rows of the pass's items whose last row it holds: o =
 * shared_head_norm(y) into out_hidden, logits = head(o), LOGIT_GROUP rows
 * a product. */
static void mtp_heads(engine *e, const int *last_row, const engine_mtp_item *const *last_item, int n_last, bool decode)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const int E = m->n_embd, NV = m->n_vocab;
    const weight *head = m->mtp.head.data ? &m->mtp.head : &m->output;
    for (int g0 = 0; g0 < n_last; g0 += LOGIT_GROUP) {
        const int ng = n_last - g0 < LOGIT_GROUP ? n_last - g0 : LOGIT_GROUP;
        bool any = false;
        for (int g = 0; g < ng; g++) {
            float *o = s->lx + (size_t)g * E;
            rmsnorm(o, s->x + (size_t)last_row[g0 + g] * E, m->mtp.head_norm, E, m->eps);     /* o = norm(y) */
            if (last_item[g0 + g]->out_hidden)
                memcpy(last_item[g0 + g]->out_hidden, o, sizeof(float) * (size_t)E);
            any = any || last_item[g0 + g]->logits;
        }
        if (!any)
            continue;
        matmul(s->logits, head, s->lx, ng, decode, s->mm);                          /* logits = head(o) */
        for (int g = 0; g < ng; g++) {
            float *z = last_item[g0 + g]->logits;
            if (!z)
                continue;
            memcpy(z, s->logits + (size_t)g * NV, sizeof(float) * (size_t)NV);
            if (m->logit_scale != 1.0f)
                for (int v = 0; v < NV; v++)
                    z[v] /= m->logit_scale;
        }
    }
}

/* One pass over T rows of fi[0..n_fi) (rows of items[first..], the first
 * from row offset off0): x = eh_proj([enorm(e) | hnorm(h)]), the block,
 * then the heads of the items that end in it. */
static void mtp_pass(engine *e, fwd_item *fi, const engine_mtp_item *const *fit, const int *foff, int n_fi, int T,
                     bool exact)
{
    const model *m = e->m;
    const mtp_block *p = &m->mtp;
    fwd_scratch *s = &e->sc;
    const int E = m->n_embd;
    const weight *emb = p->embed.data ? &p->embed : &m->tok_embd;
    bool decode = true;
    for (int i = 0; i < n_fi; i++)
        decode = decode && fi[i].n == 1;
    decode = decode || exact;
    const bool was = matmul_set_exact(exact);
    for (int i = 0; i < n_fi; i++)
        for (int t = 0; t < fi[i].n; t++) {
            const int r = fi[i].row0 + t, j = foff[i] + t;
            float *in = e->mtp_in + (size_t)r * 2 * E, *er = s->xn + (size_t)r * E;
            dequant_row(emb->type, (const char *)emb->data + (size_t)fit[i]->tokens[j] * emb->row_bytes, er, E);
            rmsnorm(in, er, p->enorm, E, m->eps);                                   /* enorm(E[t]) */
            rmsnorm(in + E, fit[i]->hidden + (size_t)j * E, p->hnorm, E, m->eps);   /* hnorm(h) */
        }
    matmul(s->x, &p->eh_proj, e->mtp_in, T, decode, s->mm);                         /* x = eh_proj(.) */
    fwd_layer(e, &p->blk, fi, n_fi, T, decode);                                     /* y = block(x) */
    int last_row[ENGINE_UBATCH], n_last = 0;
    const engine_mtp_item *last_item[ENGINE_UBATCH];
    for (int i = 0; i < n_fi; i++)
        if (foff[i] + fi[i].n == fit[i]->n) {
            last_row[n_last] = fi[i].row0 + fi[i].n - 1;
            last_item[n_last++] = fit[i];
        }
    mtp_heads(e, last_row, last_item, n_last, decode);
    matmul_set_exact(was);
    for (int i = 0; i < n_fi; i++)
        fi[i].s->n_past += fi[i].n;
}

int engine_mtp_step(engine *e, const engine_mtp_item *items, int n_items, bool exact, char *err, size_t errlen)
{
    const model *m = e->m;
    cache *c = &e->mtp_kv;
    blas_set_threads(e->n_threads);
    if (!e->mtp_on) {
        snprintf(err, errlen, "the engine was opened without MTP (engine_params.mtp)");
        return -1;
    }
    if (n_items <= 0) {
        snprintf(err, errlen, "empty MTP batch");
        return -1;
    }
    int n_short = 0;
    for (int i = 0; i < n_items; i++) {
        const engine_mtp_item *it = &items[i];
        const cache_seq *ms = mtp_of(e, it->seq);
        if (!ms) {
            snprintf(err, errlen, "MTP item %d: sequence %d does not exist", i, it->seq);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq) {
                snprintf(err, errlen, "sequence %d appears twice in one MTP batch", it->seq);
                return -1;
            }
        if (it->n <= 0 || !it->tokens || !it->hidden) {
            snprintf(err, errlen, "MTP item %d has no rows", i);
            return -1;
        }
        for (int t = 0; t < it->n; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= m->n_vocab) {
                snprintf(err, errlen, "token id %d is out of range (vocabulary has %d tokens)", it->tokens[t],
                         m->n_vocab);
                return -1;
            }
        if (ms->n_past + it->n > c->n_ctx) {
            snprintf(err, errlen, "MTP context full: %d cached + %d new rows exceeds the context of %d", ms->n_past,
                     it->n, c->n_ctx);
            return -1;
        }
        n_short += cache_pages_short(c, e->mtp_seq[it->seq], ms->n_past + it->n);
    }
    /* pages for every item or none, as engine_forward */
    if (cache_make_room(c, n_short) != 0) {
        snprintf(err, errlen, "MTP cache budget exhausted (%d more pages)", n_short);
        return -1;
    }
    for (int i = 0; i < n_items; i++) {
        const int ms = e->mtp_seq[items[i].seq];
        if (cache_reserve(c, ms, cache_get(c, ms)->n_past + items[i].n) != 0) {
            snprintf(err, errlen, "MTP cache reservation failed after making room (a bug)");
            return -1;
        }
    }
    /* passes of at most ENGINE_UBATCH rows; an item may span passes */
    fwd_item fi[ENGINE_UBATCH];
    const engine_mtp_item *fit[ENGINE_UBATCH];
    int foff[ENGINE_UBATCH];
    int item = 0, off = 0;
    while (item < n_items) {
        int T = 0, n_fi = 0;
        while (T < ENGINE_UBATCH && item < n_items) {
            const engine_mtp_item *it = &items[item];
            int take = it->n - off;
            if (take > ENGINE_UBATCH - T)
                take = ENGINE_UBATCH - T;
            cache_seq *ms = cache_get(c, e->mtp_seq[it->seq]);
            fi[n_fi] = (fwd_item){ .s = ms, .row0 = T, .n = take, .pos0 = ms->n_past, .exact = exact };
            fit[n_fi] = it;
            foff[n_fi++] = off;
            T += take;
            off += take;
            if (off == it->n) {
                item++;
                off = 0;
            }
        }
        mtp_pass(e, fi, fit, foff, n_fi, T, exact);
    }
    return 0;
}

/* forward.c - the layer loop over a batch of sequences.
 *
 * Owns: splitting a batch into passes of at most ENGINE_UBATCH rows, the
 * residual stream, the per-layer switch on kind with one block function per
 * kind (the projections around each mixer), the SwiGLU MLP, the mixture of
 * experts and the LM head. Projections of all sequences in a pass share one
 * matrix product, so a weight is read once per pass whatever the batch
 * size. Exact items (a speculative verify step) run in passes of their
 * own, every product on the one-token arithmetic (matmul_set_exact) and
 * each mixer told by fwd_item.exact (docs/architecture.md 7b). Does not
 * own: the mixers (attention.c, mla.c, deltanet.c) or qwen3next's order
 * of its DeltaNet projections (qwen3next.c).
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

/* x += scale * y (scale: the model's residual multiplier, 1 for most) */
static void add_rows(float *restrict x, const float *restrict y, long n, float scale)
{
    if (scale == 1.0f) {
        #pragma omp parallel for schedule(static) if (n >= 65536)
        for (long i = 0; i < n; i++)
            x[i] += y[i];
        return;
    }
    #pragma omp parallel for schedule(static) if (n >= 65536)
    for (long i = 0; i < n; i++)
        x[i] += scale * y[i];
}

/* xn[r] = RMSNorm(x[r]) * w for the T rows */
static void norm_rows(float *xn, const float *x, const float *w, int T, const model *m)
{
    const int E = m->n_embd;
    #pragma omp parallel for schedule(static) if (T >= 16)
    for (int r = 0; r < T; r++)
        rmsnorm(xn + (size_t)r * E, x + (size_t)r * E, w, E, m->eps);
}

/* ---- the mixers: xn -> y, one function per layer kind ---- */

/* Gated attention: q (with its gate), k and v; attention over the KV cache
 * (attention.c); y = W_o out. */
static void attn_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    fwd_scratch *s = &e->sc;
    /* [T][n_head*2*hd], [T][n_kv*hd], [T][n_kv*hd] */
    matmul_many(3, (float *[]){ s->attn.q, s->attn.k, s->attn.v }, (const weight *[]){ &L->wq, &L->wk, &L->wv },
                s->xn, T, decode, s->mm);
    attn_forward(e->m, L, layer_kv(e, L), items, n_items, s->attn.q, s->attn.k, s->attn.v, s->mix, s->scores);
    matmul(s->y, &L->wo, s->mix, T, decode, s->mm);
}

/* Multi-head latent attention: q (through the q_lora bottleneck when the
 * model has one) and the latent kv; attention over the compressed cache
 * (mla.c); y = W_o out. */
static void mla_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    if (m->mla_q_lora > 0) {                                    /* q = W_qb RMSNorm(W_qa x) */
        matmul(s->mla.q_lora, &L->wq_a, s->xn, T, decode, s->mm);
        for (int r = 0; r < T; r++)
            rmsnorm(s->mla.q_lora + (size_t)r * m->mla_q_lora, s->mla.q_lora + (size_t)r * m->mla_q_lora,
                    L->q_a_norm, m->mla_q_lora, m->eps);
        matmul(s->mla.q, &L->wq_b, s->mla.q_lora, T, decode, s->mm);
    } else {
        matmul(s->mla.q, &L->wq, s->xn, T, decode, s->mm);      /* [T][n_head*(nope+rope)] */
    }
    matmul(s->mla.kv, &L->wkv_a, s->xn, T, decode, s->mm);      /* [T][kv_lora+rope] */
    mla_forward(m, L, &e->kv, items, n_items, s->mla.q, s->mla.kv, s->mix, e->params.mla_mode, decode, s->scores,
                s->mla_work, s->mm);
    matmul(s->y, &L->wo, s->mix, T, decode, s->mm);
}

/* Gated DeltaNet: the conv input qkv, beta and alpha logits and the output
 * gate z (qwen3next orders its projections otherwise: qwen3next.c); the
 * conv and the delta rule over the recurrent state (deltanet.c);
 * y = W_out out. */
static void dnet_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    if (m->dnet_grouped)
        qwen3next_dnet_inputs(m, L, s->xn, T, decode, s->mm, s->dnet.fused, s->dnet.qkv, s->dnet.z, s->dnet.beta,
                              s->dnet.alpha);
    else    /* [T][conv_dim], [T][n_v], [T][n_v], [T][n_v*d_v] */
        matmul_many(4, (float *[]){ s->dnet.qkv, s->dnet.beta, s->dnet.alpha, s->dnet.z },
                    (const weight *[]){ &L->wqkv, &L->wb, &L->wa, &L->wz }, s->xn, T, decode, s->mm);
    dnet_forward(m, L, &e->kv, items, n_items, s->dnet.qkv, s->dnet.beta, s->dnet.alpha, s->dnet.z, s->mix,
                 e->params.dnet_mode, s->dnet_work);
    matmul(s->y, &L->wout, s->mix, T, decode, s->mm);
}

/* ---- the feed-forward blocks: xn -> y ---- */

/* ReLU^2: y = W_down(relu(W_up x)^2) */
static void relu2_block(const model *m, const layer *L, fwd_scratch *s, int T, bool decode)
{
    matmul(s->ffn.up, &L->ffn_up, s->xn, T, decode, s->mm);
    const long nf = (long)T * m->n_ff;
    for (long i = 0; i < nf; i++) {
        const float u = s->ffn.up[i] > 0.0f ? s->ffn.up[i] : 0.0f;
        s->ffn.up[i] = u * u;
    }
    matmul(s->y, &L->ffn_down, s->ffn.up, T, decode, s->mm);
}

/* SwiGLU: y = W_down(silu(W_gate x) * W_up x) */
/* silu(gate) * up over nr rows of ff, one call per row in an exact pass
 * (a row's elements then meet the kernel's vector lanes and tail as one
 * token's do) */
static void silu_mul_rows(float *gate, const float *up, int nr, int ff, bool exact)
{
    for (int r = 0; r < (exact ? nr : 1); r++)
        vec_silu_mul(gate + (size_t)r * ff, gate + (size_t)r * ff, up + (size_t)r * ff, exact ? ff : (long)nr * ff);
}

static void ffn_block(const model *m, const layer *L, fwd_scratch *s, int T, bool decode, bool exact)
{
    matmul_many(2, (float *[]){ s->ffn.gate, s->ffn.up }, (const weight *[]){ &L->ffn_gate, &L->ffn_up }, s->xn, T,
                decode, s->mm);
    if (exact) {
        silu_mul_rows(s->ffn.gate, s->ffn.up, T, m->n_ff, true);
        matmul(s->y, &L->ffn_down, s->ffn.gate, T, decode, s->mm);
        return;
    }
    const long nf = (long)T * m->n_ff;
    #pragma omp parallel if (T > 1)
    {   /* contiguous, 8-aligned shares: silu(gate) * up */
        const long nt = omp_get_num_threads(), it = omp_get_thread_num();
        const long i0 = nf * it / nt & ~7L, i1 = it == nt - 1 ? nf : nf * (it + 1) / nt & ~7L;
        vec_silu_mul(s->ffn.gate + i0, s->ffn.gate + i0, s->ffn.up + i0, i1 - i0);
    }
    matmul(s->y, &L->ffn_down, s->ffn.gate, T, decode, s->mm);
}

/* Mixture of experts with a shared expert (qwen3next, qwen35moe, Granite):
 *   p = softmax(W_r x); top-k; w = p_topk / sum(p_topk)
 *   y = sum_k w_k SwiGLU_k(x) + sigmoid(g_sh . x) SwiGLU_sh(x)
 * (the shared expert's gate is 1 where the model has none, and the shared
 * expert is absent where n_ff_shexp is 0). Variants by the model's flags:
 * p = sigmoid(W_r x) and choice by p + exp_probs_b (kimi-linear, lfm2moe,
 * nemotron_h_moe), weights not renormalised (Jamba), weights times
 * moe_scale (kimi-linear); moe_relu2: every expert and the shared one
 * W_down relu(W_up x)^2, and with moe_latent the routed experts run on
 * W_ld x and their weighted sum goes back through W_lu (nemotron_h_moe).
 * Rows routed to one expert are gathered so each expert's weights are
 * read once per pass. ref: docs/models.md 1.6. */
/* One expert (routed or shared) on nr gathered rows: out = W_down f(in),
 * f SwiGLU (W_gate, W_up) or, with moe_relu2, relu(W_up in)^2. */
static void expert_rows(const model *m, fwd_scratch *s, const weight *wg, const weight *wu, const weight *wd,
                        int FF, const float *in, int nr, float *out, bool decode, bool exact)
{
    float *gt = s->ffn.gate, *up = s->ffn.up;
    if (m->moe_relu2) {
        matmul(up, wu, in, nr, decode, s->mm);
        const long n = (long)nr * FF;
        for (long i = 0; i < n; i++) {
            const float u = up[i] > 0.0f ? up[i] : 0.0f;
            up[i] = u * u;
        }
        matmul(out, wd, up, nr, decode, s->mm);
        return;
    }
    matmul(gt, wg, in, nr, decode, s->mm);
    matmul(up, wu, in, nr, decode, s->mm);
    silu_mul_rows(gt, up, nr, FF, exact);
    matmul(out, wd, gt, nr, decode, s->mm);
}

static void moe_block(const model *m, const layer *L, fwd_scratch *s, int T, bool decode, bool per_row, bool exact)
{
    const int E = m->n_embd, NE = m->n_expert, K = m->n_expert_used, FF = m->n_ff_exp;
    matmul(s->moe.probs, &L->router, s->xn, T, decode, s->mm);
    for (int row = 0; row < T; row++) {
        float *p = s->moe.probs + (size_t)row * NE;
        if (m->moe_sigmoid)
            for (int ex = 0; ex < NE; ex++)
                p[ex] = sigmoid(p[ex]);
        else
            softmax(p, NE);
        /* the experts are chosen by p (+ the selection bias, kimi-linear) and
         * weighed by p */
        const float *bias = L->exp_probs_b;
        int *sel = s->moe.sel + (size_t)row * K;
        float *w = s->moe.selw + (size_t)row * K, sum = 0.0f;
        for (int k = 0; k < K; k++) {              /* top-k, ties to the lower index */
            int best = -1;
            for (int ex = 0; ex < NE; ex++) {
                bool taken = false;
                for (int j = 0; j < k; j++)
                    taken |= sel[j] == ex;
                if (!taken && (best < 0 || p[ex] + (bias ? bias[ex] : 0.0f) > p[best] + (bias ? bias[best] : 0.0f)))
                    best = ex;
            }
            sel[k] = best;
            w[k] = p[best];
            sum += p[best];
        }
        sum = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;    /* as llama.cpp: no division by ~0 */
        for (int k = 0; k < K; k++)
            w[k] = (m->moe_norm_topk ? w[k] / sum : w[k]) * m->moe_scale;
    }
    /* the routed experts read xin (XE wide) and their weighted outputs sum
     * into acc: x and y, or (moe_latent) W_ld x and a latent sum that
     * W_lu takes back to y */
    const int XE = m->moe_latent > 0 ? m->moe_latent : E;
    const float *xin = s->xn;
    float *acc = s->y;
    if (m->moe_latent > 0) {
        matmul(s->moe.lat, &L->latent_down, s->xn, T, decode, s->mm);
        xin = s->moe.lat;
        acc = s->moe.lat + (size_t)ENGINE_UBATCH * XE;
    }
    memset(acc, 0, sizeof(float) * (size_t)T * XE);
    for (int ex = 0; ex < NE; ex++) {
        int cnt = 0;
        for (int row = 0; row < T; row++)
            for (int k = 0; k < K; k++)
                if (s->moe.sel[(size_t)row * K + k] == ex) {
                    s->moe.rows[cnt] = row;
                    s->moe.roww[cnt++] = s->moe.selw[(size_t)row * K + k];
                }
        if (cnt == 0)
            continue;
        for (int i = 0; i < cnt; i++)
            memcpy(s->moe.in + (size_t)i * XE, xin + (size_t)s->moe.rows[i] * XE, sizeof(float) * XE);
        weight wg = m->moe_relu2 ? L->gate_exps : weight_slab(&L->gate_exps, L->up_gate_stride, ex);
        weight wu = weight_slab(&L->up_exps, L->up_gate_stride, ex);
        weight wd = weight_slab(&L->down_exps, L->down_stride, ex);
        /* per_row: the benchmark's baseline, one product of one row at a time */
        for (int r0 = 0; r0 < cnt; r0 += per_row ? 1 : cnt)
            expert_rows(m, s, &wg, &wu, &wd, FF, s->moe.in + (size_t)r0 * XE, per_row ? 1 : cnt,
                        s->moe.out + (size_t)r0 * XE, decode || per_row, exact);
        for (int i = 0; i < cnt; i++) {
            float *y = acc + (size_t)s->moe.rows[i] * XE;
            const float *o = s->moe.out + (size_t)i * XE;
            for (int d = 0; d < XE; d++)
                y[d] += s->moe.roww[i] * o[d];
        }
    }
    if (m->moe_latent > 0)
        matmul(s->y, &L->latent_up, acc, T, decode, s->mm);
    /* the shared expert, scaled by a scalar sigmoid gate per row where the
     * model has one (qwen3next, qwen35moe; Granite's is ungated) */
    if (m->n_ff_shexp <= 0)
        return;
    expert_rows(m, s, &L->gate_shexp, &L->up_shexp, &L->down_shexp, m->n_ff_shexp, s->xn, T, s->moe.out, decode,
                exact);
    for (int row = 0; row < T; row++) {
        const float *x = s->xn + (size_t)row * E;
        float gs = 1.0f;
        if (L->shexp_gate) {
            gs = 0.0f;
            for (int d = 0; d < E; d++)
                gs += L->shexp_gate[d] * x[d];
            gs = sigmoid(gs);
        }
        float *y = s->y + (size_t)row * E;
        const float *o = s->moe.out + (size_t)row * E;
        for (int d = 0; d < E; d++)
            y[d] += gs * o[d];
    }
}

/* One layer, as the block diagram:
 *   x = x + Mixer(RMSNorm_in(x))      Mixer by kind: attention, MLA, DeltaNet
 *   x = x + FFN(RMSNorm_post(x))      FFN: SwiGLU, or the mixture of experts */
void fwd_layer(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const long n = (long)T * m->n_embd;

    if (L->kind != ENGINE_LAYER_MLP) {
        norm_rows(s->xn, s->x, L->attn_norm, T, m);
        switch ((enum engine_layer_kind)L->kind) {
        case ENGINE_LAYER_ATTN:
            attn_block(e, L, items, n_items, T, decode);
            break;
        case ENGINE_LAYER_MLA:
            mla_block(e, L, items, n_items, T, decode);
            break;
        case ENGINE_LAYER_DELTANET:
            dnet_block(e, L, items, n_items, T, decode);
            break;
        case ENGINE_LAYER_MAMBA2:
            mamba2_block(e, L, items, n_items, T, decode);
            break;
        case ENGINE_LAYER_SCONV:
            sconv_block(e, L, items, n_items, T, decode);
            break;
        case ENGINE_LAYER_MAMBA:
            mamba1_block(e, L, items, n_items, T, decode);
            break;
        case ENGINE_LAYER_KDA:
            kda_block(e, L, items, n_items, T, decode);
            break;
        case ENGINE_LAYER_ATTN_MAMBA2:      /* y = attention(xn) + Mamba-2(xn) */
            attn_block(e, L, items, n_items, T, decode);
            memcpy(s->moe.out, s->y, sizeof(float) * (size_t)n);
            mamba2_block(e, L, items, n_items, T, decode);
            add_rows(s->y, s->moe.out, n, 1.0f);
            break;
        case ENGINE_LAYER_MLP:
        case ENGINE_LAYER_KINDS:
            break;
        }
        add_rows(s->x, s->y, n, m->residual_scale);
    }
    if (L->ffn == FFN_NONE)
        return;
    norm_rows(s->xn, s->x, L->ffn_norm, T, m);
    if (L->ffn == FFN_MOE)
        moe_block(m, L, s, T, decode, e->params.moe_per_row, items_exact(items, n_items));
    else if (L->ffn == FFN_RELU2)
        relu2_block(m, L, s, T, decode);
    else
        ffn_block(m, L, s, T, decode, items_exact(items, n_items));
    add_rows(s->x, s->y, n, m->residual_scale);
}

/* One pass over T rows; out_rows[r] receives row r's logits when not NULL.
 * decode: every item adds one token (matmul.h). */
static void forward_pass(engine *e, const fwd_item *items, int n_items, const int32_t *tokens,
                         float *const *out_rows, float *const *hid_rows, int T, bool decode)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const int E = m->n_embd, NV = m->n_vocab;

    for (int r = 0; r < T; r++) {
        float *x = s->x + (size_t)r * E;
        dequant_row(m->tok_embd.type, (const char *)m->tok_embd.data + (size_t)tokens[r] * m->tok_embd.row_bytes, x, E);
        if (m->embd_scale != 1.0f)
            for (int d = 0; d < E; d++)
                x[d] *= m->embd_scale;
    }
    for (int il = 0; il < m->n_layer; il++)
        fwd_layer(e, &m->layers[il], items, n_items, T, decode);

    /* h = RMSNorm_final(x) for the rows asked for it (an MTP's input) */
    for (int r = 0; r < T; r++)
        if (hid_rows[r])
            rmsnorm(hid_rows[r], s->x + (size_t)r * E, m->output_norm, E, m->eps);
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
        matmul(s->logits, &m->output, s->lx, ng, decode, s->mm);
        for (int g = 0; g < ng; g++) {
            float *z = out_rows[rows[g]];
            memcpy(z, s->logits + (size_t)g * NV, (size_t)NV * sizeof(float));
            if (m->logit_scale != 1.0f)
                for (int v = 0; v < NV; v++)
                    z[v] /= m->logit_scale;
        }
    }
}

/* Row slot T + t .. of a pass for tokens [off, off + take) of item it:
 * its fwd_item (with the snapshot when it falls in these rows), tokens and
 * logit destinations. */
static void pass_item(engine *e, const engine_batch_item *it, int off, int take, int T, fwd_item *fi,
                      int32_t *toks, float **out_rows, float **hid_rows, uint8_t **ckpt_rows)
{
    const model *m = e->m;
    cache_seq *sq = cache_get(&e->kv, it->seq);
    *fi = (fwd_item){ .s = sq, .row0 = T, .n = take, .pos0 = sq->n_past, .exact = it->exact != 0 };
    if (it->snap && it->snap_at >= off && it->snap_at < off + take) {   /* in this pass */
        fi->snap = it->snap->slot;
        fi->snap_at = it->snap_at - off;
        it->snap->n_tokens = sq->n_past + it->snap_at - off;
    }
    /* checkpoints: the state after r rows of this part is the one after
     * off + r rows of the item, snaps[off + r - 1] */
    bool any = false;
    for (int r = 0; it->snaps && r < take; r++) {
        const int j = off + r - 1;
        engine_snap *sn = j >= 0 && j < it->n_tokens - 1 ? it->snaps[j] : NULL;
        ckpt_rows[T + r] = sn ? sn->slot : NULL;
        if (sn) {
            sn->n_tokens = sq->n_past + r;
            any = true;
        }
    }
    fi->ckpt = any ? ckpt_rows + T : NULL;
    for (int t = 0; t < take; t++) {
        const int ti = off + t;
        toks[T + t] = it->tokens[ti];
        float *dst = NULL;
        if (it->logits == ENGINE_LOGITS_ALL)
            dst = it->out + (size_t)ti * m->n_vocab;
        else if (it->logits == ENGINE_LOGITS_LAST && ti == it->n_tokens - 1)
            dst = it->out;
        out_rows[T + t] = dst;
        hid_rows[T + t] = it->hidden ? it->hidden + (size_t)ti * m->n_embd : NULL;
    }
}

/* One pass, its sequences' lengths advanced after it. An exact pass runs
 * every product on the one-token arithmetic (matmul_set_exact) and is a
 * decode step for the kernels' choices. */
static void run_pass(engine *e, fwd_item *fi, int n_fi, const int32_t *toks, float *const *out_rows,
                     float *const *hid_rows, int T, bool exact)
{
    bool decode = true;                 /* every sequence of the pass adds one token */
    for (int i = 0; i < n_fi; i++)
        decode = decode && fi[i].n == 1;
    const bool was = matmul_set_exact(exact);
    forward_pass(e, fi, n_fi, toks, out_rows, hid_rows, T, decode || exact);
    matmul_set_exact(was);
    for (int i = 0; i < n_fi; i++)
        fi[i].s->n_past += fi[i].n;
}

/* The items whose exact flag is `exact`, in passes of at most
 * ENGINE_UBATCH rows; an item may span passes. */
static void run_passes(engine *e, const engine_batch_item *items, int n_items, bool exact)
{
    int item = 0, off = 0;
    fwd_item fi[ENGINE_UBATCH];
    int32_t toks[ENGINE_UBATCH];
    float *out_rows[ENGINE_UBATCH], *hid_rows[ENGINE_UBATCH];
    uint8_t *ckpt[ENGINE_UBATCH];
    for (;;) {
        int T = 0, n_fi = 0;
        while (T < ENGINE_UBATCH) {
            while (item < n_items && (items[item].exact != 0) != exact)
                item++;
            if (item >= n_items)
                break;
            const engine_batch_item *it = &items[item];
            int take = it->n_tokens - off;
            if (take > ENGINE_UBATCH - T)
                take = ENGINE_UBATCH - T;
            pass_item(e, it, off, take, T, &fi[n_fi++], toks, out_rows, hid_rows, ckpt);
            T += take;
            off += take;
            if (off == it->n_tokens) {
                item++;
                off = 0;
            }
        }
        if (n_fi == 0)
            return;
        run_pass(e, fi, n_fi, toks, out_rows, hid_rows, T, exact);
    }
}

/* Whether every layer of this model runs an exact pass natively (the rows
 * of a multi-token item as one-token steps compute them). MLA's expanded
 * form (ENGINE_MLA_EXPANDED) rebuilds K and V over the whole context in
 * each step: no multi-row twin, so exact items there go one token per pass
 * (run_token_rounds), exact by construction. */
static bool exact_native(const engine *e)
{
    return !(e->m->n_mla > 0 && e->params.mla_mode == ENGINE_MLA_EXPANDED);
}

/* The exact items one token per pass each: pass q holds token q of every
 * exact item that long (ENGINE_UBATCH items at most per pass). */
static void run_token_rounds(engine *e, const engine_batch_item *items, int n_items)
{
    fwd_item fi[ENGINE_UBATCH];
    int32_t toks[ENGINE_UBATCH];
    float *out_rows[ENGINE_UBATCH], *hid_rows[ENGINE_UBATCH];
    uint8_t *ckpt[ENGINE_UBATCH];
    int longest = 0;
    for (int i = 0; i < n_items; i++)
        if (items[i].exact && items[i].n_tokens > longest)
            longest = items[i].n_tokens;
    for (int q = 0; q < longest; q++) {
        int T = 0;
        for (int i = 0; i < n_items; i++) {
            if (!items[i].exact || items[i].n_tokens <= q)
                continue;
            pass_item(e, &items[i], q, 1, T, &fi[T], toks, out_rows, hid_rows, ckpt);
            if (++T == ENGINE_UBATCH) {
                run_pass(e, fi, T, toks, out_rows, hid_rows, T, true);
                T = 0;
            }
        }
        if (T > 0)
            run_pass(e, fi, T, toks, out_rows, hid_rows, T, true);
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
        if (it->snap && (it->snap_at <= 0 || it->snap_at >= it->n_tokens)) {
            snprintf(err, errlen, "batch item %d: a snapshot after %d of its %d tokens (it must be inside)", i,
                     it->snap_at, it->n_tokens);
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

    /* exact items (engine_batch_item.exact) run in passes of their own */
    bool any_exact = false, any_plain = false;
    for (int i = 0; i < n_items; i++) {
        any_exact = any_exact || items[i].exact;
        any_plain = any_plain || !items[i].exact;
    }
    if (any_exact) {
        if (exact_native(e))
            run_passes(e, items, n_items, true);
        else
            run_token_rounds(e, items, n_items);
    }
    if (any_plain)
        run_passes(e, items, n_items, false);
    return 0;
}

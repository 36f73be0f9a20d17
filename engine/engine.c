/* engine.c - engine lifecycle, model facts, tokenizer and sequence API.
 *
 * Owns: opening a model with its tokenizer and cache, the immutable
 * engine_info, scratch sizing, and the thin sequence wrappers over cache.c.
 * The forward pass lives in forward.c.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_impl.h"
#include "fault.h"
#include "gguf.h"
#include "kernels/attn.h"
#include "kernels/blas.h"
#include "kernels/cpu.h"
#include "kernels/quant.h"
#include "matmul.h"

void engine_params_default(engine_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_threads = 0;
    p->n_ctx = 0;
    p->max_seqs = 0;
    p->cache_bytes = 0;
    p->page_tokens = 16;
    p->dnet_mode = ENGINE_DNET_AUTO;
    p->mla_mode = ENGINE_MLA_AUTO;
    p->kv_dtype = ENGINE_KV_F32;
}

static int imax(int a, int b) { return a > b ? a : b; }

static float *alloc_f(long n)
{
    return FAULT_OR(malloc((size_t)(n > 0 ? n : 1) * sizeof(float)));
}

static int scratch_init(engine *e)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const long UB = ENGINE_UBATCH;
    const int qd = m->n_head * 2 * m->head_dim, kvd = m->n_head_kv * m->head_dim;
    const int vd = m->ssm_n_v * m->ssm_d_v;
    const int nt = omp_get_max_threads();
    const int ff = imax(m->n_ff, imax(m->n_ff_exp, m->n_ff_shexp));
    const int ssm_in = 2 * m->ssm_n_k * m->ssm_d_k + 2 * vd;
    const int mla_q = m->n_head * (m->mla_nope + m->mla_rope), mla_kv = m->mla_kv_lora + m->mla_rope;
    const int mla_o = m->n_head * m->mla_v;
    const int m2_inner = m->m2_heads * m->m2_head_dim, m1 = imax(m->m1_inner, m->kda_heads * m->kda_head_dim);
    int max_in = imax(imax(imax(imax(m->n_embd, m->moe_latent), ff), imax(m->n_head * m->head_dim, vd)),
                      imax(imax(m->mla_q_lora, m->mla_kv_lora), imax(imax(mla_o, m2_inner), m1)));
    if (e->params.mtp)
        max_in = imax(max_in, 2 * m->n_embd);      /* the MTP's eh_proj reads [enorm(e) | hnorm(h)] */
    s->x = alloc_f(UB * m->n_embd);
    s->xn = alloc_f(UB * m->n_embd);
    s->y = alloc_f(UB * m->n_embd);
    s->mix = alloc_f(UB * imax(imax(imax(m->n_head * m->head_dim, vd), mla_o), imax(imax(m2_inner, m1), m->n_embd)));
    /* the slabs, each as large as the largest role it holds (engine_impl.h) */
    s->slab[SLAB_1] = alloc_f(UB * imax(imax(imax(qd, m->conv_dim), imax(ff, mla_q)),
                                        imax(imax(m->m2_in_dim, 2 * m1), m->n_sconv ? 3 * m->n_embd : 0)));
    s->slab[SLAB_2] = alloc_f(UB * imax(imax(imax(kvd, m->ssm_n_v), imax(ff, mla_kv)), m1));
    s->slab[SLAB_3] = alloc_f(UB * imax(imax(kvd, vd), m1));
    s->slab[SLAB_4] = alloc_f(UB * imax(m->ssm_n_v, m->m1_dt_rank));
    s->slab[SLAB_5] = alloc_f(UB * imax(imax(imax(ssm_in, 2 * m->ssm_n_v), imax(m->n_expert, m->mla_q_lora)),
                                        m->m1_dt_rank + 2 * m->m1_d_state));
    s->attn.q = s->mla.q = s->dnet.qkv = s->ffn.gate = s->m2.zxd = s->sconv.bcx = s->m1.xz = s->slab[SLAB_1];
    s->m1.dt = s->slab[SLAB_2];
    s->m1.x = s->slab[SLAB_3];
    s->m1.dtr = s->slab[SLAB_4];
    s->m1.xdb = s->slab[SLAB_5];
    s->attn.k = s->mla.kv = s->dnet.beta = s->ffn.up = s->slab[SLAB_2];
    s->attn.v = s->dnet.z = s->slab[SLAB_3];
    s->dnet.alpha = s->slab[SLAB_4];
    s->dnet.fused = s->mla.q_lora = s->moe.probs = s->slab[SLAB_5];
    s->moe.in = alloc_f(UB * imax(m->n_embd, m->moe_latent));
    s->moe.out = alloc_f(UB * imax(m->n_embd, m->moe_latent));
    s->moe.lat = m->moe_latent > 0 ? alloc_f(2 * UB * m->moe_latent) : NULL;   /* the input, then the sum */
    s->moe.sel = FAULT_OR(malloc(sizeof(int) * (size_t)UB * (size_t)imax(m->n_expert_used, 1)));
    s->moe.selw = alloc_f(UB * imax(m->n_expert_used, 1));
    s->moe.rows = FAULT_OR(malloc(sizeof(int) * (size_t)UB));
    s->moe.roww = alloc_f(UB);
    s->mla_work = alloc_f(mla_scratch_floats(m, e->kv.n_ctx));
    s->mm = alloc_f((long)nt * 64 * max_in);
    /* attention scratch per thread: the scores of one row (reference, MLA)
     * or the tiles of kernels/attn.c, whichever is larger */
    const long attn_tile = m->n_head_kv ? attn_scratch_floats(m->head_dim, m->n_head / m->n_head_kv,
                                                              e->kv.page_tokens) : 0;
    s->scores = alloc_f((long)nt * (e->kv.n_ctx > attn_tile ? e->kv.n_ctx : attn_tile));
    long rec_floats = dnet_scratch_floats(m) > mamba2_scratch_floats(m) ? dnet_scratch_floats(m)
                                                                         : mamba2_scratch_floats(m);
    if (mamba1_scratch_floats(m) > rec_floats)
        rec_floats = mamba1_scratch_floats(m);
    if (kda_scratch_floats(m) > rec_floats)
        rec_floats = kda_scratch_floats(m);
    bool kda_ok = true;
    if (m->n_kda) {
        const long W = (long)m->kda_heads * m->kda_head_dim;
        s->kda.q = alloc_f(UB * W);
        s->kda.k = alloc_f(UB * W);
        s->kda.v = alloc_f(UB * W);
        s->kda.g = alloc_f(UB * W);
        s->kda.gate = alloc_f(UB * W);
        s->kda.beta = alloc_f(UB * m->kda_heads);
        s->kda.lr = alloc_f(UB * m->kda_head_dim);
        kda_ok = s->kda.q && s->kda.k && s->kda.v && s->kda.g && s->kda.gate && s->kda.beta && s->kda.lr;
    }
    s->rec_stride = rec_floats;
    s->dnet_work = s->rec_work = alloc_f((long)nt * rec_floats);
    s->logits = alloc_f((long)LOGIT_GROUP * m->n_vocab);
    s->lx = alloc_f((long)LOGIT_GROUP * m->n_embd);
    bool ok = kda_ok && s->x && s->xn && s->y && s->mix && s->moe.in && s->moe.out && s->moe.sel && s->moe.selw &&
              s->moe.rows && s->moe.roww && (s->moe.lat || m->moe_latent <= 0) && s->mla_work && s->mm &&
              s->scores && s->dnet_work && s->logits && s->lx;
    for (int i = 0; i < N_SLABS; i++)
        ok = ok && s->slab[i];
    return ok ? 0 : -1;
}

static void scratch_deinit(fwd_scratch *s)
{
    free(s->x); free(s->xn); free(s->y); free(s->mix);
    for (int i = 0; i < N_SLABS; i++)
        free(s->slab[i]);
    free(s->moe.in); free(s->moe.out); free(s->moe.sel); free(s->moe.selw); free(s->moe.rows); free(s->moe.roww);
    free(s->moe.lat);
    free(s->kda.q); free(s->kda.k); free(s->kda.v); free(s->kda.g); free(s->kda.gate); free(s->kda.beta);
    free(s->kda.lr);
    free(s->mla_work); free(s->mm); free(s->scores); free(s->dnet_work); free(s->logits); free(s->lx);
    memset(s, 0, sizeof *s);
}

/* The ggml type of the matrices (tensors of 2 or more dimensions) that
 * hold the most bytes: what the file is "in", for TGI's model_dtype. */
static const char *dominant_weight_type(const gguf_ctx *g)
{
    uint64_t bytes[64] = { 0 };
    uint32_t best = GGML_F32;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (t->n_dims < 2 || t->type >= 64)
            continue;
        bytes[t->type] += t->n_bytes;
        if (bytes[t->type] > bytes[best])
            best = t->type;
    }
    return ggml_type_name(best);
}

static void fill_info(engine *e)
{
    const model *m = e->m;
    engine_info *in = &e->info;
    snprintf(in->arch, sizeof in->arch, "%s", m->arch);
    snprintf(in->name, sizeof in->name, "%s", m->name);
    in->chat_template = m->chat_template;
    in->n_vocab = m->n_vocab;
    in->n_embd = m->n_embd;
    in->n_layer = m->n_layer;
    in->n_ctx_train = m->n_ctx_train;
    in->n_ctx = e->kv.n_ctx;
    in->max_seqs = e->kv.max_seqs;
    in->n_head = m->n_head;
    in->n_head_kv = m->n_head_kv;
    in->head_dim = m->head_dim;
    in->n_rot = m->n_rot;
    in->ssm_n_k = m->ssm_n_k;
    in->ssm_n_v = m->ssm_n_v;
    in->ssm_d_k = m->ssm_d_k;
    in->ssm_d_v = m->ssm_d_v;
    in->ssm_conv_kernel = m->ssm_k;
    in->n_ff = m->n_ff;
    in->n_attn_layers = m->n_attn;
    in->n_dnet_layers = m->n_dnet;
    in->n_mla_layers = m->n_mla;
    in->n_mamba2_layers = m->n_m2;
    in->n_sconv_layers = m->n_sconv;
    in->n_mlp_layers = m->n_mlp;
    in->n_mamba_layers = m->n_m1;
    in->n_rec_layers = m->n_dnet + m->n_m2 + m->n_sconv + m->n_m1 + m->n_kda;
    in->n_kda_layers = m->n_kda;
    in->kda_heads = m->kda_heads;
    in->kda_head_dim = m->kda_head_dim;
    in->mamba_d_inner = m->m1_inner;
    in->mamba_d_state = m->m1_d_state;
    in->mamba2_heads = m->m2_heads;
    in->mamba2_head_dim = m->m2_head_dim;
    in->mamba2_d_state = m->m2_d_state;
    in->mamba2_groups = m->m2_groups;
    in->mla_kv_lora_rank = m->mla_kv_lora;
    in->mla_rope_dim = m->mla_rope;
    in->mla_nope_dim = m->mla_nope;
    in->mla_v_dim = m->mla_v;
    in->mla_q_lora_rank = m->mla_q_lora;
    in->n_expert = m->n_expert;
    in->n_expert_used = m->n_expert_used;
    in->layer_kind = m->kinds;
    in->n_params = m->n_params;
    in->weight_bytes = m->weight_bytes;
    in->expert_weight_bytes = 0;
    for (int il = 0; il < m->n_layer; il++) {
        const layer *L = &m->layers[il];
        if (L->ffn == FFN_MOE)
            in->expert_weight_bytes += (uint64_t)m->n_expert * (2 * L->up_gate_stride + L->down_stride);
    }
    in->weights_dtype = dominant_weight_type(m->gguf);
    in->weights_memory = m->gguf->data_copy ? "huge_pages" : "mapped";
    in->weights_note = m->huge_note;
    in->weights_in_panels = m->n_panels;
    in->kv_bytes_per_token = e->kv.kv_bytes_per_token;
    in->mla_bytes_per_token = e->kv.mla_bytes_per_token;
    /* by kind and in all, from the planner's arithmetic (memplan.c), as the
     * cache sized its slots */
    memplan_costs mc;
    memplan_costs_of(&e->kv.plan, &mc);
    in->dnet_state_bytes_per_seq = mc.dnet_state_bytes_per_seq;
    in->dnet_conv_bytes_per_seq = mc.dnet_conv_bytes_per_seq;
    in->mamba2_state_bytes_per_seq = mc.mamba2_state_bytes_per_seq;
    in->mamba2_conv_bytes_per_seq = mc.mamba2_conv_bytes_per_seq;
    in->sconv_bytes_per_seq = mc.sconv_bytes_per_seq;
    in->mamba_state_bytes_per_seq = mc.mamba_state_bytes_per_seq;
    in->mamba_conv_bytes_per_seq = mc.mamba_bytes_per_seq - mc.mamba_state_bytes_per_seq;
    in->kda_state_bytes_per_seq = mc.kda_state_bytes_per_seq;
    in->kda_conv_bytes_per_seq = mc.kda_bytes_per_seq - mc.kda_state_bytes_per_seq;
    in->rec_state_bytes_per_seq = e->kv.state_bytes;
    in->rec_conv_bytes_per_seq = e->kv.conv_bytes;
    in->mha_bytes_per_token = mc.mha_bytes_per_token;
    in->all_attention_bytes_per_token = mc.all_attention_bytes_per_token;
    in->page_tokens = e->kv.page_tokens;
    in->cache_budget_bytes = e->kv.budget_bytes;
    in->bos_id = tok_bos(e->tok);
    in->eos_id = tok_eos(e->tok);
    in->add_bos = tok_add_bos(e->tok);
    in->kv_dtype = e->kv.kv_type == GGML_F16 ? "f16" : e->kv.kv_type == GGML_BF16 ? "bf16" : "f32";
    in->kv_dtype_bytes = (int)e->kv.kv_es;
    in->state_dtype = e->kv.state_type == GGML_BF16 ? "bf16" : "f32";
    in->n_nextn = m->n_nextn;
    in->has_mtp = m->has_mtp;
    in->mtp_enabled = e->mtp_on;
    in->mtp_bytes_per_token = e->mtp_on ? e->mtp_kv.kv_bytes_per_token : 0;
    in->mtp_budget_bytes = e->mtp_on ? e->mtp_kv.budget_bytes : 0;
}

engine *engine_open(const engine_params *p, char *err, size_t errlen)
{
    engine *e = FAULT_OR(calloc(1, sizeof *e));
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    e->params = *p;
    blas_set_threads(p->n_threads);
    e->n_threads = e->n_threads_max = blas_get_threads();
    e->m = model_load(p->model_path, p, err, errlen);
    if (!e->m)
        goto out_fail;
    char terr[256];
    e->tok = tok_new_from_gguf(e->m->gguf, terr, sizeof terr);
    if (!e->tok) {
        snprintf(err, errlen, "%s: %s", p->model_path, terr);
        goto out_fail;
    }
    if (tok_n_vocab(e->tok) > e->m->n_vocab) {
        snprintf(err, errlen, "%s: tokenizer has %d tokens but the embedding only %d rows",
                 p->model_path, tok_n_vocab(e->tok), e->m->n_vocab);
        goto out_fail;
    }
    const model *m = e->m;
    if (p->mtp && !m->has_mtp) {
        snprintf(err, errlen, "%s has no MTP block (nextn_predict_layers is 0)", p->model_path);
        goto out_fail;
    }
    int n_ctx = p->n_ctx > 0 ? p->n_ctx : (m->n_ctx_train < 4096 ? m->n_ctx_train : 4096);
    cache_layout cl = {
        .n_layers = m->n_layer - m->n_mlp, .n_head = m->n_head,   /* mixer layers: what the counterfactuals count */
        .n_attn = m->n_attn, .n_kv = m->n_head_kv, .head_dim = m->head_dim,
        .n_mla = m->n_mla, .mla_dim = m->mla_kv_lora + m->mla_rope, .mla_rope = m->mla_rope,
        .mla_nope = m->mla_nope, .mla_v = m->mla_v,
        .kv_type = p->kv_dtype == ENGINE_KV_F16 ? GGML_F16 : p->kv_dtype == ENGINE_KV_BF16 ? GGML_BF16 : GGML_F32,
        .state_type = p->state_dtype == ENGINE_STATE_BF16 ? GGML_BF16 : GGML_F32,
        .n_dnet = m->n_dnet, .conv_kernel = m->ssm_k, .conv_dim = m->conv_dim,
        .n_v = m->ssm_n_v, .d_v = m->ssm_d_v, .d_k = m->ssm_d_k,
        .n_mamba2 = m->n_m2, .mamba2_heads = m->m2_heads, .mamba2_head_dim = m->m2_head_dim,
        .mamba2_d_state = m->m2_d_state, .mamba2_groups = m->m2_groups, .mamba2_conv = m->ssm_k,
        .n_sconv = m->n_sconv, .sconv_channels = m->n_embd, .sconv_conv = m->ssm_k,
        .n_mamba = m->n_m1, .mamba_d_inner = m->m1_inner, .mamba_d_state = m->m1_d_state, .mamba_conv = m->ssm_k,
        .n_kda = m->n_kda, .kda_heads = m->kda_heads, .kda_head_dim = m->kda_head_dim, .kda_conv = m->ssm_k,
        .n_mlp = m->n_mlp,
        .page_tokens = p->page_tokens, .n_ctx = n_ctx,
        .max_seqs = p->max_seqs > 0 ? p->max_seqs : 64, .budget_bytes = p->cache_bytes,
        .budget_max_bytes = p->cache_max_bytes,
    };
    if (cache_init(&e->kv, &cl) != 0 || scratch_init(e) != 0) {
        snprintf(err, errlen, "%s: out of memory allocating the cache and scratch", p->model_path);
        goto out_fail;
    }
    /* the layers' parts of a slot (model.c) fill the slot the cache sized
     * from the planner's arithmetic exactly: two counts of one layout */
    if (e->kv.state_bytes != (uint64_t)m->rec_state_numbers * e->kv.state_es ||
        e->kv.conv_bytes != (uint64_t)m->rec_conv_floats * sizeof(float)) {
        snprintf(err, errlen, "%s: recurrent slot of %llu + %llu bytes, but the layers take %llu + %llu (a bug)",
                 p->model_path, (unsigned long long)e->kv.state_bytes, (unsigned long long)e->kv.conv_bytes,
                 (unsigned long long)(m->rec_state_numbers * e->kv.state_es),
                 (unsigned long long)(m->rec_conv_floats * sizeof(float)));
        goto out_fail;
    }
    if (p->mtp && mtp_open(e, err, errlen) != 0)
        goto out_fail;
    fill_info(e);
    /* Release this thread's OpenMP pool (the load's parallel regions made
     * one). The passes may run on another thread (the server's scheduler),
     * whose team would then count these idle threads too: with more
     * OpenMP threads than CPUs libgomp cuts its spin-wait to almost
     * nothing, and every parallel region waits for a futex wake-up. Q8_0
     * 0.8B shape, one sequence on 2 threads, engine opened on one thread
     * and decoding on another: 31-33 ms per token, 20-21 with the pool
     * released (21 when both are the same thread). Another parallel region
     * here makes a new pool. */
    omp_pause_resource_all(omp_pause_soft);
    return e;

out_fail:
    engine_close(e);
    return NULL;
}

void engine_close(engine *e)
{
    if (!e)
        return;
    scratch_deinit(&e->sc);
    mtp_close(e);
    cache_deinit(&e->kv);       /* also a half-made or never-made cache */
    tok_free(e->tok);
    model_free(e->m);
    free(e);
}

int engine_set_threads(engine *e, int n)
{
    e->n_threads = n <= 0 || n > e->n_threads_max ? e->n_threads_max : n;
    blas_set_threads(e->n_threads);
    return e->n_threads;
}

const engine_info *engine_get_info(const engine *e)
{
    return &e->info;
}

int engine_tokenize(const engine *e, const char *text, size_t len, bool add_bos,
                    bool parse_special, int32_t *out, int max_out)
{
    return engine_tokenize_chat(e, text, len, add_bos, NULL, parse_special ? 0 : -1, out, max_out);
}

int engine_tokenize_chat(const engine *e, const char *text, size_t len, bool add_bos, const size_t *data,
                         int n_data, int32_t *out, int max_out)
{
    int n0 = 0;
    int32_t bos = tok_bos(e->tok);
    if (add_bos && e->info.add_bos && bos >= 0) {
        if (max_out > 0)
            out[0] = bos;
        n0 = 1;
    }
    int n = tok_encode_data(e->tok, text, len, data, n_data, out + (max_out > 0 ? n0 : 0),
                            max_out - n0 > 0 ? max_out - n0 : 0);
    return n < 0 ? n : n + n0;
}

const tokenizer *engine_tokenizer(const engine *e)
{
    return e->tok;
}

int engine_seq_new(engine *e)
{
    const int seq = cache_seq_new(&e->kv);
    mtp_seq_new(e, seq);
    return seq;
}

void engine_seq_free(engine *e, int seq)
{
    if (cache_get_const(&e->kv, seq))
        mtp_seq_free(e, seq);
    cache_seq_free(&e->kv, seq);
}

int engine_seq_reserve(engine *e, int seq, int n_tokens)
{
    return cache_reserve(&e->kv, seq, n_tokens);
}

uint64_t engine_bytes_for_tokens(const engine *e, int n_tokens)
{
    return cache_bytes_for(&e->kv, n_tokens);
}

/* Chunk i of a sequence's cache state, in a fixed order: the recurrent
 * states, the conv windows, then each cached position's K and V rows per
 * attention layer and KV head, then its MLA latent rows; *n its bytes.
 * NULL past the last (or for an empty part: *n 0). */
static const void *seq_chunk(const cache *c, const cache_seq *s, long i, size_t *n)
{
    const long T = s->n_past, nkv = (long)c->n_attn * 2 * c->n_kv * T, nmla = (long)c->n_mla * T;
    *n = 0;
    if (i == 0) {
        *n = c->n_rec > 0 ? c->state_bytes : 0;
        return s->state;
    }
    if (i == 1) {
        *n = c->n_rec > 0 ? c->conv_bytes : 0;
        return s->conv;
    }
    i -= 2;
    if (i < nkv) {                  /* (layer, K or V, head, position) */
        const int t = (int)(i % T), h = (int)(i / T % c->n_kv), kv = (int)(i / T / c->n_kv % 2);
        const int la = (int)(i / T / c->n_kv / 2);
        *n = (size_t)c->head_dim * c->kv_es;
        return cache_kv(c, s, la, kv, h, t);
    }
    i -= nkv;
    if (i < nmla) {
        *n = (size_t)c->mla_dim * c->kv_es;
        return cache_mla(c, s, (int)(i / T), (int)(i % T));
    }
    return NULL;
}

bool engine_seq_state_equal(const engine *e, int a, int b)
{
    const cache_seq *sa = cache_get_const(&e->kv, a), *sb = cache_get_const(&e->kv, b);
    if (!sa || !sb || sa->n_past != sb->n_past)
        return false;
    size_t na, nb;
    const void *pa, *pb;
    for (long i = 0; (pa = seq_chunk(&e->kv, sa, i, &na)) != NULL || i < 2; i++) {
        pb = seq_chunk(&e->kv, sb, i, &nb);
        if (na != nb || (na && memcmp(pa, pb, na)))
            return false;
    }
    return true;
}

uint64_t engine_seq_digest(const engine *e, int seq)
{
    const cache_seq *s = cache_get_const(&e->kv, seq);
    if (!s)
        return 0;
    uint64_t h = 14695981039346656037ull;          /* FNV-1a 64 */
    const int32_t len = s->n_past;
    const uint8_t *lp = (const uint8_t *)&len;
    for (size_t j = 0; j < sizeof len; j++)
        h = (h ^ lp[j]) * 1099511628211ull;
    size_t n;
    const uint8_t *p;
    for (long i = 0; (p = seq_chunk(&e->kv, s, i, &n)) != NULL || i < 2; i++)
        for (size_t j = 0; j < n; j++)
            h = (h ^ p[j]) * 1099511628211ull;
    return h;
}

int engine_seq_len(const engine *e, int seq)
{
    const cache_seq *s = cache_get_const(&e->kv, seq);
    return s ? s->n_past : -1;
}

int engine_seq_get_usage(const engine *e, int seq, engine_seq_usage *u)
{
    const cache *c = &e->kv;
    const cache_seq *s = cache_get_const(c, seq);
    memset(u, 0, sizeof *u);
    if (!s)
        return -1;
    u->n_tokens = s->n_past;
    u->n_reserved_tokens = c->page_bytes ? s->n_pages * c->page_tokens : c->n_ctx;
    u->kv_reserved_bytes = (uint64_t)s->n_pages * c->page_tokens * c->kv_bytes_per_token;
    u->kv_used_bytes = (uint64_t)s->n_past * c->kv_bytes_per_token;
    u->mla_reserved_bytes = (uint64_t)s->n_pages * c->page_tokens * c->mla_bytes_per_token;
    u->mla_used_bytes = (uint64_t)s->n_past * c->mla_bytes_per_token;
    u->rec_state_bytes = c->state_bytes;
    u->rec_conv_bytes = c->conv_bytes;
    u->total_reserved_bytes = u->kv_reserved_bytes + u->mla_reserved_bytes + u->rec_state_bytes +
                              u->rec_conv_bytes;
    u->n_shared_pages = cache_seq_shared_pages(c, seq);
    u->shared_bytes = (uint64_t)u->n_shared_pages * c->page_bytes;
    if (e->mtp_on && e->mtp_seq[seq] >= 0) {
        const cache_seq *ms = cache_get_const(&e->mtp_kv, e->mtp_seq[seq]);
        u->mtp_tokens = ms ? ms->n_past : 0;
        u->mtp_reserved_bytes = ms ? (uint64_t)ms->n_pages * e->mtp_kv.page_bytes : 0;
    }
    return 0;
}

void engine_get_pool_usage(const engine *e, engine_pool_usage *u)
{
    const cache *c = &e->kv;
    u->budget_bytes = c->budget_bytes;
    u->reserved_bytes = c->reserved_bytes;
    u->free_bytes = c->budget_bytes - c->reserved_bytes;
    u->n_seqs = c->n_live;
    u->n_pages_total = c->page_bytes ? (int)(c->budget_bytes / c->page_bytes) : 0;
    u->n_pages_used = c->n_pages_used;
    u->n_snaps = c->n_snaps;
    u->snap_state_bytes = (uint64_t)c->n_snaps * c->state_bytes;
    u->snap_conv_bytes = (uint64_t)c->n_snaps * c->conv_bytes;
    u->mtp_budget_bytes = e->mtp_on ? e->mtp_kv.budget_bytes : 0;
    u->mtp_reserved_bytes = e->mtp_on ? e->mtp_kv.reserved_bytes : 0;
    u->mtp_pages_used = e->mtp_on ? e->mtp_kv.n_pages_used : 0;
    u->mtp_seqs = 0;
    for (int i = 0; e->mtp_on && i < e->mtp_kv.max_seqs; i++)
        u->mtp_seqs += e->mtp_kv.seqs[i].live && e->mtp_kv.seqs[i].n_past > 0;
    engine_get_spares(e, u);
}

void engine_get_spares(const engine *e, engine_pool_usage *u)
{
    cache_spares_info si;
    cache_spares_get(&e->kv, &si);
    u->n_spare_blocks = si.ready;
    u->n_spare_regions = si.ready_regions;
    u->spare_bytes = si.ready_bytes;
    u->spare_blocks_taken = si.taken;
    u->spare_regions_taken = si.regions_taken;
}

int engine_spares_start(engine *e, int n_blocks, int n_regions)
{
    return cache_spares_start(&e->kv, n_blocks, n_regions);
}

void engine_spare_refill(engine *e)
{
    cache_spares_refill(&e->kv);
}

int engine_seq_fork(engine *e, int src, int n_tokens)
{
    const int seq = cache_seq_fork(&e->kv, src, n_tokens);
    mtp_seq_new(e, seq);        /* an empty MTP KV: the fork's rows begin where it goes on */
    return seq;
}

int engine_seq_truncate(engine *e, int seq, int n_tokens, const engine_snap *snap)
{
    cache *c = &e->kv;
    const cache_seq *s = cache_get_const(c, seq);
    if (!s || n_tokens < 0 || n_tokens > s->n_past)
        return -1;
    const bool need_snap = c->n_rec > 0 && n_tokens < s->n_past;
    if (need_snap && (!snap || snap->n_tokens != n_tokens))
        return -1;
    if (cache_seq_truncate(c, seq, n_tokens) != 0)
        return -1;
    return need_snap ? cache_snap_restore(c, seq, snap) : 0;
}

engine_snap *engine_snap_take(engine *e, int seq)
{
    if (!cache_get_const(&e->kv, seq))
        return NULL;
    cache_snap *s = cache_snap_new(&e->kv);
    if (s)
        cache_snap_save(&e->kv, seq, s);
    return s;
}

engine_snap *engine_snap_new(engine *e)
{
    return cache_snap_new(&e->kv);
}

int engine_snap_save(engine *e, int seq, engine_snap *snap)
{
    if (!snap || !cache_get_const(&e->kv, seq))
        return -1;
    return cache_snap_save(&e->kv, seq, snap);
}

engine_snap *engine_seq_into_snap(engine *e, int seq)
{
    engine_snap *sn = cache_seq_into_snap(&e->kv, seq);
    if (sn)
        mtp_seq_free(e, seq);
    return sn;
}

int engine_snap_restore(engine *e, int seq, const engine_snap *snap)
{
    return cache_snap_restore(&e->kv, seq, snap);
}

void engine_snap_free(engine *e, engine_snap *snap)
{
    cache_snap_free(&e->kv, snap);
}

int engine_snap_tokens(const engine_snap *snap)
{
    return snap ? snap->n_tokens : -1;
}

uint64_t engine_snap_bytes(const engine *e)
{
    return e->kv.n_rec ? e->kv.state_bytes + e->kv.conv_bytes : 0;
}

void engine_get_memplan(const engine *e, memplan_layout *out)
{
    *out = e->kv.plan;
}

void engine_process_init(char **argv)
{
    blas_process_init(argv);
}

void engine_get_kernels(engine_kernels *k)
{
    k->threads = blas_get_threads();
    k->blas_core = blas_core_name();
    k->simd = simd_name();
    k->bf16_decode = simd_bf16_dot_why();
    matmul_prompt_describe(GGML_BF16, k->bf16_prompt, sizeof k->bf16_prompt);
    matmul_prompt_describe(GGML_F16, k->f16_prompt, sizeof k->f16_prompt);
    matmul_prompt_describe(GGML_F32, k->f32_prompt, sizeof k->f32_prompt);
    matmul_int8_prompt_describe(k->int8_prompt, sizeof k->int8_prompt);
}

bool engine_type_supported(uint32_t type)
{
    return quant_supported(type);
}

void engine_dequant_row(uint32_t type, const void *src, float *dst, int n)
{
    dequant_row(type, src, dst, n);
}

double engine_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

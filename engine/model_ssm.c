/* model_ssm.c - load the Mamba-2 and short-convolution hybrid families.
 *
 * Owns: the hyperparameters and tensors of granitehybrid (Granite 4.0-H:
 * Mamba-2 and GQA layers, each with a dense or MoE feed-forward, Granite's
 * multipliers), nemotron_h (Nemotron-H: each layer one of Mamba-2, GQA
 * attention or a ReLU^2 MLP) and lfm2 (LFM2: gated short convolutions and
 * GQA with q/k norms) and falcon-h1 (Falcon-H1: attention and Mamba-2 side
 * by side in every layer on the same normed input, outputs summed, then a
 * SwiGLU; its multipliers are folded into the weights by llama.cpp's
 * converter) and jamba (Jamba: Mamba-1 and NoPE GQA layers, each with a
 * dense or MoE SwiGLU as the file has ffn_gate_inp or not), with llama.cpp's
 * key and tensor names and shapes; and kimi-linear (Kimi Linear: KDA
 * layers beside MLA layers without RoPE, a sigmoid-routed MoE with a
 * selection bias after leading dense layers).
 * A layer's kind comes from the file as llama.cpp reads it: the per-layer
 * attention.head_count_kv array (0: not attention) and, for nemotron_h,
 * the per-layer feed_forward_length (> 0: an MLP layer).
 * Does not own: the helpers (model.c) or the math (mamba2.c,
 * shortconv.c, attention.c, forward.c).
 * ref: docs/models.md section 10.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "kernels/quant.h"
#include "kernels/vecmath.h"
#include "model_impl.h"

/* "<arch>.<suffix>" as one value per layer: an array of n integers, or one
 * integer for every layer (def when absent and not required). */
static int hp_layers(loader *ld, const char *suffix, int *out, int n, int def, bool required)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", ld->m->arch, suffix);
    const gguf_kv *kv = gguf_find_kv(ld->g, key);
    if (kv && kv->type == GGUF_T_ARRAY) {
        if (kv->arr_n < (uint64_t)n) {
            ld_fail(ld, "metadata %s has %llu values for %d layers", key, (unsigned long long)kv->arr_n, n);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            int64_t v;
            if (!gguf_arr_get_i64(kv, (uint64_t)i, &v) || v < 0 || v > (1 << 30)) {
                ld_fail(ld, "metadata %s[%d] must be an integer in 0..2^30", key, i);
                return -1;
            }
            out[i] = (int)v;
        }
        return 0;
    }
    int v = 0;
    if (hp_u32(ld, suffix, &v, def, required) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        out[i] = v;
    return 0;
}

/* One value the layers of a kind share: every nonzero entry of per[] must
 * be the same (the cache has one shape per kind). */
static int shared_value(loader *ld, const char *what, const int *per, int n, int *out)
{
    *out = 0;
    for (int i = 0; i < n; i++) {
        if (!per[i])
            continue;
        if (*out && per[i] != *out) {
            ld_fail(ld, "layers differ in %s (%d and %d); hyserve needs one value for all layers", what, *out, per[i]);
            return -1;
        }
        *out = per[i];
    }
    return 0;
}

/* A multiplier as llama.cpp reads it: absent or 0 means none (1). */
static float multiplier(loader *ld, const char *suffix)
{
    float v = 0.0f;
    hp_f32(ld, suffix, &v, 0.0f);
    return v == 0.0f || !isfinite(v) ? 1.0f : v;
}

/* Mamba-2 hyperparameters: ssm.* keys (d_inner, d_state, heads, groups, conv). */
static void mamba2_hparams(loader *ld)
{
    model *m = ld->m;
    int inner = 0;
    if (hp_u32(ld, "ssm.conv_kernel", &m->ssm_k, 0, true) || hp_u32(ld, "ssm.inner_size", &inner, 0, true) ||
        hp_u32(ld, "ssm.state_size", &m->m2_d_state, 0, true) ||
        hp_u32(ld, "ssm.time_step_rank", &m->m2_heads, 0, true) ||
        hp_u32(ld, "ssm.group_count", &m->m2_groups, 1, false))
        return;
    if (m->ssm_k < 2 || m->ssm_k > 16 || m->m2_d_state <= 0 || m->m2_heads <= 0 || inner <= 0 ||
        inner % m->m2_heads || m->m2_groups <= 0 || m->m2_heads % m->m2_groups ||
        (m->m2_groups & (m->m2_groups - 1)) || m->m2_d_state > (1 << 16) || inner > (1 << 20) ||
        (int64_t)m->m2_groups * m->m2_d_state > (1 << 20)) {
        ld_fail(ld, "Mamba-2 hyperparameters out of range: conv kernel %d (2..16), inner size %d (a multiple "
                "of heads), state %d, %d heads, %d groups (a power of two dividing the heads)",
                m->ssm_k, inner, m->m2_d_state, m->m2_heads, m->m2_groups);
        return;
    }
    m->m2_head_dim = inner / m->m2_heads;
    m->m2_conv_ch = inner + 2 * m->m2_groups * m->m2_d_state;
    m->m2_in_dim = inner + m->m2_conv_ch + m->m2_heads;
}

/* The attention shape shared by the attention layers (kv[] per layer, 0
 * where a layer has no attention). */
static void attn_hparams(loader *ld, const int *heads, const int *kv)
{
    model *m = ld->m;
    if (shared_value(ld, "attention.head_count", heads, m->n_layer, &m->n_head) ||
        shared_value(ld, "attention.head_count_kv", kv, m->n_layer, &m->n_head_kv))
        return;
    if (m->n_attn == 0)
        return;
    if (m->n_head <= 0 || m->n_head_kv <= 0 || m->n_head % m->n_head_kv) {
        ld_fail(ld, "attention heads %d / KV heads %d out of range (heads a multiple of KV heads)", m->n_head,
                m->n_head_kv);
        return;
    }
    int v_len = 0;
    if (hp_u32(ld, "attention.key_length", &m->head_dim, m->n_embd / m->n_head, false) ||
        hp_u32(ld, "attention.value_length", &v_len, m->head_dim, false) ||
        hp_u32(ld, "rope.dimension_count", &m->n_rot, m->head_dim, false))
        return;
    if (m->head_dim <= 0 || v_len != m->head_dim || m->n_rot > m->head_dim || m->n_rot % 2 || m->head_dim > 4096) {
        ld_fail(ld, "attention head dims out of range (key %d, value %d, rotary %d: even, at most the key length)",
                m->head_dim, v_len, m->n_rot);
        return;
    }
    if (m->n_rot == 0)
        m->n_rot = m->head_dim;
    hp_f32(ld, "rope.freq_base", &m->rope_theta, 10000.0f);
    hp_f32(ld, "attention.scale", &m->attn_scale, 0.0f);
    if (m->attn_scale == 0.0f)
        m->attn_scale = 1.0f / sqrtf((float)m->head_dim);
}

static void bind_attention(loader *ld, layer *L, int il, bool qk_norm)
{
    model *m = ld->m;
    char nm[96];
    const int E = m->n_embd, HD = m->head_dim;
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    static const char *const biases[] = { "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias" };
    for (size_t i = 0; i < sizeof biases / sizeof biases[0]; i++) {
        snprintf(nm, sizeof nm, "blk.%d.%s", il, biases[i]);
        if (gguf_find_tensor(ld->g, nm)) {
            ld_fail(ld, "tensor '%s': attention biases are not supported yet", nm);
            return;
        }
    }
    bind_w(ld, &L->wq, TN("attn_q.weight"), E, m->n_head * HD);
    bind_w(ld, &L->wk, TN("attn_k.weight"), E, m->n_head_kv * HD);
    bind_w(ld, &L->wv, TN("attn_v.weight"), E, m->n_head_kv * HD);
    bind_w(ld, &L->wo, TN("attn_output.weight"), m->n_head * HD, E);
    if (qk_norm) {
        L->q_norm = bind_vec(ld, TN("attn_q_norm.weight"), HD);
        L->k_norm = bind_vec(ld, TN("attn_k_norm.weight"), HD);
    }
#undef TN
}

static void bind_mamba2(loader *ld, layer *L, int il)
{
    model *m = ld->m;
    char nm[96];
    const int E = m->n_embd, NH = m->m2_heads, DI = NH * m->m2_head_dim, CD = m->m2_conv_ch, NG = m->m2_groups;
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    bind_w(ld, &L->ssm_in, TN("ssm_in.weight"), E, m->m2_in_dim);
    L->conv1d_t = bind_vec2(ld, TN("ssm_conv1d.weight"), m->ssm_k, CD);
    transpose_taps(ld, &L->conv1d_t, m->ssm_k, CD);
    if (!ld->failed && gguf_find_tensor(ld->g, TN("ssm_conv1d.bias")))
        L->conv_b = bind_vec(ld, nm, CD);
    L->dt_bias = bind_vec(ld, TN("ssm_dt.bias"), NH);
    /* ssm_a and ssm_d are {1, n_head}: one per head */
    L->ssm_a = bind_vec2(ld, TN("ssm_a"), 1, NH);
    L->ssm_d = bind_vec2(ld, TN("ssm_d"), 1, NH);
    /* optional in falcon-h1 (then the gated output is not normed) */
    if (ld->m->kinds[il] != ENGINE_LAYER_ATTN_MAMBA2 || gguf_find_tensor(ld->g, TN("ssm_norm.weight")))
        L->ssm_norm = bind_vec2(ld, TN("ssm_norm.weight"), DI / NG, NG);
    bind_w(ld, &L->wout, TN("ssm_out.weight"), DI, E);
#undef TN
}

/* Mamba-1 hyperparameters: d_inner, d_state, dt_rank, conv (jamba). */
static void mamba1_hparams(loader *ld)
{
    model *m = ld->m;
    if (hp_u32(ld, "ssm.conv_kernel", &m->ssm_k, 0, true) || hp_u32(ld, "ssm.inner_size", &m->m1_inner, 0, true) ||
        hp_u32(ld, "ssm.state_size", &m->m1_d_state, 0, true) ||
        hp_u32(ld, "ssm.time_step_rank", &m->m1_dt_rank, 0, true))
        return;
    if (m->ssm_k < 2 || m->ssm_k > 16 || m->m1_inner <= 0 || m->m1_inner > (1 << 20) || m->m1_d_state <= 0 ||
        m->m1_d_state > 4096 || m->m1_dt_rank <= 0 || m->m1_dt_rank > (1 << 16))
        ld_fail(ld, "Mamba hyperparameters out of range: conv kernel %d (2..16), inner size %d, state %d, "
                "dt rank %d", m->ssm_k, m->m1_inner, m->m1_d_state, m->m1_dt_rank);
}

static void bind_mamba1(loader *ld, layer *L, int il)
{
    model *m = ld->m;
    char nm[96];
    const int E = m->n_embd, DI = m->m1_inner, DS = m->m1_d_state, R = m->m1_dt_rank;
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    bind_w(ld, &L->ssm_in, TN("ssm_in.weight"), E, 2 * DI);
    L->conv1d_t = bind_vec2(ld, TN("ssm_conv1d.weight"), m->ssm_k, DI);
    transpose_taps(ld, &L->conv1d_t, m->ssm_k, DI);
    L->conv_b = bind_vec(ld, TN("ssm_conv1d.bias"), DI);
    bind_w(ld, &L->ssm_x, TN("ssm_x.weight"), DI, R + 2 * DS);
    L->dt_norm = bind_vec(ld, TN("ssm_dt_norm.weight"), R);
    bind_w(ld, &L->ssm_dt, TN("ssm_dt.weight"), R, DI);
    L->dt_bias = bind_vec(ld, TN("ssm_dt.bias"), DI);
    L->b_norm = bind_vec(ld, TN("ssm_b_norm.weight"), DS);
    L->c_norm = bind_vec(ld, TN("ssm_c_norm.weight"), DS);
    L->ssm_a = bind_vec2(ld, TN("ssm_a"), DS, DI);          /* {d_state, d_inner}: [channel][state] */
    L->ssm_d = bind_vec(ld, TN("ssm_d"), DI);
    bind_w(ld, &L->wout, TN("ssm_out.weight"), DI, E);
#undef TN
}

/* Conv taps stored {K, channels} or {K, 1, channels[, 1]} (kimi-linear's
 * q/k/v convs), into out [channel][K] f32. */
static void bind_taps(loader *ld, const char *name, int K, int n_ch, float *out)
{
    if (ld->failed)
        return;
    const gguf_tensor *t = find_t(ld, name, true);
    if (!t)
        return;
    const bool flat = t->ne[0] == (uint64_t)K && t->ne[1] == (uint64_t)n_ch && t->ne[2] == 1 && t->ne[3] == 1;
    const bool deep = t->ne[0] == (uint64_t)K && t->ne[1] == 1 && t->ne[2] == (uint64_t)n_ch && t->ne[3] == 1;
    if (!flat && !deep) {
        ld_fail(ld, "tensor '%s' has shape {%llu, %llu, %llu, %llu}, expected {%d, 1, %d}", name,
                (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                (unsigned long long)t->ne[3], K, n_ch);
        return;
    }
    if (t->type != GGML_F32 && t->type != GGML_F16 && t->type != GGML_BF16) {
        ld_fail(ld, "tensor '%s' has type %s; conv taps must be F32, F16 or BF16", name, ggml_type_name(t->type));
        return;
    }
    dequant_row(t->type, t->data, out, K * n_ch);
    ld->m->n_params += (uint64_t)K * (uint64_t)n_ch;
    ld->m->weight_bytes += t->n_bytes;
}

static void bind_kda(loader *ld, layer *L, int il)
{
    model *m = ld->m;
    char nm[96];
    const int E = m->n_embd, H = m->kda_heads, D = m->kda_head_dim, W = H * D, K = m->ssm_k;
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    bind_w(ld, &L->wq, TN("attn_q.weight"), E, W);
    bind_w(ld, &L->wk, TN("attn_k.weight"), E, W);
    bind_w(ld, &L->wv, TN("attn_v.weight"), E, W);
    /* the three convs' taps side by side, [channel][K] for q's, k's, v's channels */
    float *taps = FAULT_OR(malloc(sizeof(float) * (size_t)3 * W * K));
    if (!taps) {
        ld_fail(ld, "out of memory");
        return;
    }
    L->conv1d_t = taps;
    static const char *const conv[3] = { "ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight" };
    for (int p = 0; p < 3 && !ld->failed; p++) {
        float *part = FAULT_OR(malloc(sizeof(float) * (size_t)W * K));
        if (!part) {
            ld_fail(ld, "out of memory");
            break;
        }
        snprintf(nm, sizeof nm, "blk.%d.%s", il, conv[p]);
        bind_taps(ld, nm, K, W, part);
        transpose_taps(ld, &part, K, W);            /* [K][W] */
        if (!ld->failed)
            memcpy(taps + (size_t)p * W * K, part, sizeof(float) * (size_t)W * K);
        free(part);
    }
    bind_w(ld, &L->ssm_fa, TN("ssm_f_a.weight"), E, D);
    bind_w(ld, &L->ssm_fb, TN("ssm_f_b.weight"), D, W);
    bind_w(ld, &L->wb, TN("ssm_beta.weight"), E, H);
    if (!ld->failed) {
        const gguf_tensor *a = find_t(ld, TN("ssm_a"), true);
        if (a && (a->ne[0] != 1 || a->ne[1] * a->ne[2] * a->ne[3] != (uint64_t)H))
            ld_fail(ld, "tensor '%s' must hold one value per head (%d)", nm, H);
        else if (a && a->type != GGML_F32 && a->type != GGML_F16 && a->type != GGML_BF16)
            ld_fail(ld, "tensor '%s' must be F32, F16 or BF16", nm);
        else if (a && !(L->ssm_a = FAULT_OR(malloc(sizeof(float) * (size_t)H))))
            ld_fail(ld, "out of memory");
        else if (a) {
            dequant_row(a->type, a->data, L->ssm_a, H);
            m->n_params += (uint64_t)H;
            m->weight_bytes += a->n_bytes;
        }
    }
    L->dt_bias = bind_vec(ld, TN("ssm_dt.bias"), W);
    if (!ld->failed && gguf_find_tensor(ld->g, TN("attn_gate.weight"))) {
        bind_w(ld, &L->wz, nm, E, W);
    } else {
        bind_w(ld, &L->ssm_ga, TN("ssm_g_a.weight"), E, D);
        bind_w(ld, &L->ssm_gb, TN("ssm_g_b.weight"), D, W);
    }
    L->ssm_norm = bind_vec(ld, TN("ssm_norm.weight"), D);
    bind_w(ld, &L->wo, TN("attn_output.weight"), W, E);
#undef TN
}

static void bind_short_conv(loader *ld, layer *L, int il)
{
    model *m = ld->m;
    char nm[96];
    const int E = m->n_embd;
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    bind_w(ld, &L->ssm_in, TN("shortconv.in_proj.weight"), E, 3 * E);
    L->conv1d_t = bind_vec2(ld, TN("shortconv.conv.weight"), m->ssm_k, E);
    transpose_taps(ld, &L->conv1d_t, m->ssm_k, E);
    bind_w(ld, &L->wout, TN("shortconv.out_proj.weight"), E, E);
#undef TN
}

/* A SwiGLU MLP, or Granite's experts (routed: n_ff wide, softmax top-k,
 * renormalised; shared: n_ff_shexp wide, ungated) where the file has them. */
static void bind_ffn(loader *ld, layer *L, int il, int n_ff)
{
    model *m = ld->m;
    char nm[96];
    const int E = m->n_embd;
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    /* falcon-h1 files name it blk.N.ffn_norm (the converter maps HF's
     * pre_ff_layernorm.weight whole): either name */
    if (!ld->failed && !gguf_find_tensor(ld->g, TN("ffn_norm.weight")) && gguf_find_tensor(ld->g, TN("ffn_norm")))
        L->ffn_norm = L->post_norm = bind_vec(ld, nm, E);
    else
        L->ffn_norm = L->post_norm = bind_vec(ld, TN("ffn_norm.weight"), E);
    /* Jamba: the layers with a router are the MoE ones */
    const bool moe = m->n_expert > 0 && il >= m->n_dense_lead &&
                     (strcmp(m->arch, "jamba") || gguf_find_tensor(ld->g, TN("ffn_gate_inp.weight")));
    if (moe) {
        L->ffn = FFN_MOE;
        bind_w(ld, &L->router, TN("ffn_gate_inp.weight"), E, m->n_expert);
        size_t up_stride = 0;
        bind_slabs(ld, &L->gate_exps, &L->up_gate_stride, TN("ffn_gate_exps.weight"), E, m->n_ff_exp, m->n_expert);
        bind_slabs(ld, &L->up_exps, &up_stride, TN("ffn_up_exps.weight"), E, m->n_ff_exp, m->n_expert);
        bind_slabs(ld, &L->down_exps, &L->down_stride, TN("ffn_down_exps.weight"), m->n_ff_exp, E, m->n_expert);
        if (!ld->failed && up_stride != L->up_gate_stride)
            ld_fail(ld, "layer %d: ffn_gate_exps and ffn_up_exps have different types", il);
        /* the selection bias: kimi-linear's sigmoid router needs it, lfm2moe's files always carry it */
        TN("exp_probs_b.bias");
        if (m->moe_sigmoid || gguf_find_tensor(ld->g, nm))
            L->exp_probs_b = bind_vec(ld, nm, m->n_expert);
        if (m->n_ff_shexp > 0) {
            bind_w(ld, &L->gate_shexp, TN("ffn_gate_shexp.weight"), E, m->n_ff_shexp);
            bind_w(ld, &L->up_shexp, TN("ffn_up_shexp.weight"), E, m->n_ff_shexp);
            bind_w(ld, &L->down_shexp, TN("ffn_down_shexp.weight"), m->n_ff_shexp, E);
        }
    } else {
        L->ffn = FFN_SWIGLU;
        bind_w(ld, &L->ffn_gate, TN("ffn_gate.weight"), E, n_ff);
        bind_w(ld, &L->ffn_up, TN("ffn_up.weight"), E, n_ff);
        bind_w(ld, &L->ffn_down, TN("ffn_down.weight"), n_ff, E);
    }
#undef TN
}

/* kimi-linear: KDA shape (kda.head_dim, ssm.conv_kernel, the heads of
 * attention.head_count), MLA shape (without RoPE: k_pe is cached as it is),
 * and the experts (a sigmoid router with a selection bias, scaled weights,
 * shared experts, leading dense layers). */
static void kimi_hparams(loader *ld, int n_block)
{
    model *m = ld->m;
    int heads = 0, klen = 0, gating = 0, n_shared = 0;
    if (hp_u32(ld, "attention.head_count", &heads, 0, true) || hp_u32(ld, "ssm.conv_kernel", &m->ssm_k, 0, true) ||
        hp_u32(ld, "kda.head_dim", &m->kda_head_dim, 0, true) ||
        hp_u32(ld, "attention.kv_lora_rank", &m->mla_kv_lora, 0, true) ||
        hp_u32(ld, "attention.q_lora_rank", &m->mla_q_lora, 0, false) ||
        hp_u32(ld, "attention.key_length_mla", &klen, 0, true) ||
        hp_u32(ld, "attention.value_length_mla", &m->mla_v, 0, true) ||
        hp_u32(ld, "rope.dimension_count", &m->mla_rope, 0, true) ||
        hp_u32(ld, "expert_count", &m->n_expert, 0, false) ||
        hp_u32(ld, "expert_used_count", &m->n_expert_used, 0, m->n_expert > 0) ||
        hp_u32(ld, "expert_feed_forward_length", &m->n_ff_exp, 0, m->n_expert > 0) ||
        hp_u32(ld, "expert_shared_count", &n_shared, 0, false) ||
        hp_u32(ld, "leading_dense_block_count", &m->n_dense_lead, 0, false) ||
        hp_u32(ld, "expert_gating_func", &gating, 1, false))
        return;
    m->n_head = m->kda_heads = heads;
    m->mla_nope = klen - m->mla_rope;
    if (heads <= 0 || heads > 4096 || m->ssm_k < 2 || m->ssm_k > 16 || m->kda_head_dim <= 0 ||
        m->kda_head_dim > 512 || m->mla_kv_lora <= 0 || m->mla_rope < 0 || m->mla_nope <= 0 || m->mla_v <= 0 ||
        m->mla_q_lora < 0) {
        ld_fail(ld, "Kimi Linear hyperparameters out of range: %d heads, KDA head dim %d (1..512), conv kernel %d "
                "(2..16), MLA kv_lora %d, key length %d, rope %d, value %d", heads, m->kda_head_dim, m->ssm_k,
                m->mla_kv_lora, klen, m->mla_rope, m->mla_v);
        return;
    }
    if (m->n_expert > 0 && (m->n_expert_used < 1 || m->n_expert_used > m->n_expert || m->n_expert_used > 64 ||
                            m->n_expert > 4096 || m->n_ff_exp < 1 || gating < 1 || gating > 2 || n_shared < 0 ||
                            m->n_dense_lead > n_block)) {
        ld_fail(ld, "experts out of range: %d of %d, width %d, gating function %d (1 softmax, 2 sigmoid), %d shared, "
                "%d leading dense layers", m->n_expert_used, m->n_expert, m->n_ff_exp, gating, n_shared,
                m->n_dense_lead);
        return;
    }
    m->mla_scale = 1.0f / sqrtf((float)klen);
    m->mla_use_rope = false;        /* Kimi's MLA has no positions */
    m->moe_sigmoid = gating == 2;
    m->n_ff_shexp = n_shared * m->n_ff_exp;
    hp_f32(ld, "expert_weights_scale", &m->moe_scale, 1.0f);
    if (m->moe_scale == 0.0f || !isfinite(m->moe_scale))
        m->moe_scale = 1.0f;
    hp_f32(ld, "rope.freq_base", &m->rope_theta, 10000.0f);
}

/* The experts of nemotron_h_moe (sigmoid router with a selection bias,
 * weights renormalised when expert_weights_norm says, times
 * expert_weights_scale; ReLU^2 experts, optionally on a moe_latent_size
 * projection; a ReLU^2 shared expert) and of lfm2moe (after
 * leading_dense_block_count dense layers; the router of
 * expert_gating_func, renormalised, no scale; SwiGLU experts). */
static int moe_hparams(loader *ld, enum arch a, int n_block, int n_ff)
{
    model *m = ld->m;
    int gating = 2;
    if (hp_u32(ld, "expert_count", &m->n_expert, 0, a == ARCH_LFM2MOE) ||
        hp_u32(ld, "expert_used_count", &m->n_expert_used, 0, m->n_expert > 0) ||
        hp_u32(ld, "expert_feed_forward_length", &m->n_ff_exp, 0, a == ARCH_LFM2MOE && m->n_expert > 0))
        return -1;
    if (a == ARCH_LFM2MOE) {
        if (hp_u32(ld, "leading_dense_block_count", &m->n_dense_lead, 0, false) ||
            hp_u32(ld, "expert_gating_func", &gating, 0, m->n_expert > 0))
            return -1;
        m->moe_norm_topk = true;
    } else {
        if (hp_u32(ld, "expert_shared_feed_forward_length", &m->n_ff_shexp, 0, m->n_expert > 0) ||
            hp_u32(ld, "moe_latent_size", &m->moe_latent, 0, false))
            return -1;
        char key[128];
        snprintf(key, sizeof key, "%s.expert_weights_norm", m->arch);
        bool norm = false;
        if (gguf_find_kv(ld->g, key) && !gguf_get_bool(ld->g, key, &norm)) {
            ld_fail(ld, "metadata %s must be a boolean", key);
            return -1;
        }
        m->moe_norm_topk = norm;
        hp_f32(ld, "expert_weights_scale", &m->moe_scale, 1.0f);
        if (m->moe_scale == 0.0f)
            m->moe_scale = 1.0f;    /* llama.cpp scales only by a value other than 0 and 1 */
        m->moe_relu2 = true;
        if (m->n_expert > 0 && m->n_ff_exp == 0 && m->n_expert_used > 0)
            m->n_ff_exp = n_ff / m->n_expert_used;     /* llama.cpp's default width */
    }
    if (m->n_expert == 0)
        return 0;
    if (m->n_expert_used < 1 || m->n_expert_used > m->n_expert || m->n_expert_used > 64 || m->n_expert > 4096 ||
        m->n_ff_exp < 1 || m->n_ff_exp > (1 << 20) || m->n_ff_shexp < 0 || m->n_ff_shexp > (1 << 20) ||
        m->moe_latent < 0 || m->moe_latent > (1 << 20) || gating < 1 || gating > 2 || m->n_dense_lead < 0 ||
        m->n_dense_lead > n_block || !isfinite(m->moe_scale)) {
        ld_fail(ld, "experts out of range: %d of %d (1..4096, at most 64 used), width %d, shared width %d, latent %d, "
                "gating function %d (1 softmax, 2 sigmoid), %d leading dense layers of %d", m->n_expert_used,
                m->n_expert, m->n_ff_exp, m->n_ff_shexp, m->moe_latent, gating, m->n_dense_lead, n_block);
        return -1;
    }
    m->moe_sigmoid = gating == 2;
    return 0;
}

/* A nemotron_h_moe MLP layer: router, selection bias, ReLU^2 experts (up
 * and down only) on the latent when the file has its projections, the
 * ReLU^2 shared expert; the layer's one norm. */
static void bind_nemotron_moe(loader *ld, layer *L, int il)
{
    model *m = ld->m;
    char nm[96];
    const int E = m->n_embd, XE = m->moe_latent > 0 ? m->moe_latent : E;
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    L->ffn = FFN_MOE;
    L->ffn_norm = L->attn_norm;
    bind_w(ld, &L->router, TN("ffn_gate_inp.weight"), E, m->n_expert);
    L->exp_probs_b = bind_vec(ld, TN("exp_probs_b.bias"), m->n_expert);
    if (m->moe_latent > 0) {
        bind_w(ld, &L->latent_down, TN("ffn_latent_down.weight"), E, XE);
        bind_w(ld, &L->latent_up, TN("ffn_latent_up.weight"), XE, E);
    } else if (gguf_find_tensor(ld->g, TN("ffn_latent_down.weight"))) {
        ld_fail(ld, "tensor '%s' without %s.moe_latent_size", nm, m->arch);
    }
    bind_slabs(ld, &L->up_exps, &L->up_gate_stride, TN("ffn_up_exps.weight"), XE, m->n_ff_exp, m->n_expert);
    bind_slabs(ld, &L->down_exps, &L->down_stride, TN("ffn_down_exps.weight"), m->n_ff_exp, XE, m->n_expert);
    bind_w(ld, &L->up_shexp, TN("ffn_up_shexp.weight"), E, m->n_ff_shexp);
    bind_w(ld, &L->down_shexp, TN("ffn_down_shexp.weight"), m->n_ff_shexp, E);
#undef TN
}

void ssm_family_load(loader *ld, enum arch a)
{
    model *m = ld->m;
    const bool nemo = a == ARCH_NEMOTRON_H || a == ARCH_NEMOTRON_H_MOE, lfm = a == ARCH_LFM2 || a == ARCH_LFM2MOE;
    int n_block = 0;
    if (hp_u32(ld, "block_count", &n_block, 0, true) || hp_u32(ld, "embedding_length", &m->n_embd, 0, true) ||
        hp_u32(ld, "context_length", &m->n_ctx_train, 4096, false))
        return;
    if (n_block <= 0 || (uint64_t)n_block > ld->g->n_tensors || m->n_embd <= 0 || m->n_embd > (1 << 20)) {
        ld_fail(ld, "hyperparameters out of range (block_count %d for %llu tensors, embedding_length %d)", n_block,
                (unsigned long long)ld->g->n_tensors, m->n_embd);
        return;
    }
    if (m->n_ctx_train <= 0) {
        ld_fail(ld, "metadata %s.context_length is 0: no request could ever fit", m->arch);
        return;
    }
    m->n_layer = n_block;
    hp_f32(ld, "attention.layer_norm_rms_epsilon", &m->eps, 1e-5f);
    int *heads = FAULT_OR(calloc((size_t)n_block, sizeof(int)));
    int *kv = FAULT_OR(calloc((size_t)n_block, sizeof(int)));
    int *ff = FAULT_OR(calloc((size_t)n_block, sizeof(int)));
    m->kinds = FAULT_OR(calloc((size_t)n_block, 1));
    m->layers = FAULT_OR(calloc((size_t)n_block, sizeof(layer)));
    if (!heads || !kv || !ff || !m->kinds || !m->layers) {
        ld_fail(ld, "out of memory");
        goto out;
    }
    if (hp_layers(ld, "attention.head_count", heads, n_block, 0, true) ||
        hp_layers(ld, "attention.head_count_kv", kv, n_block, 0, true) ||
        hp_layers(ld, "feed_forward_length", ff, n_block, 0, !nemo))
        goto out;

    /* the kinds, as llama.cpp's hparams say: KV heads 0 means recurrent (or,
     * in nemotron_h, an MLP layer when it has a feed-forward length) */
    for (int il = 0; il < n_block; il++) {
        uint8_t k;
        if (a == ARCH_FALCON_H1)
            k = kv[il] > 0 ? ENGINE_LAYER_ATTN_MAMBA2 : ENGINE_LAYER_MAMBA2;
        else if (a == ARCH_JAMBA)
            k = kv[il] > 0 ? ENGINE_LAYER_ATTN : ENGINE_LAYER_MAMBA;
        else if (a == ARCH_KIMI_LINEAR)
            k = kv[il] > 0 ? ENGINE_LAYER_MLA : ENGINE_LAYER_KDA;
        else if (kv[il] > 0)
            k = ENGINE_LAYER_ATTN;
        else if (nemo && ff[il] > 0)
            k = ENGINE_LAYER_MLP;
        else
            k = lfm ? ENGINE_LAYER_SCONV : ENGINE_LAYER_MAMBA2;
        m->kinds[il] = k;
        if (nemo && k != ENGINE_LAYER_MLP)
            ff[il] = 0;             /* the mixer layers of nemotron_h have no feed-forward */
        if (k != ENGINE_LAYER_ATTN && k != ENGINE_LAYER_ATTN_MAMBA2)
            heads[il] = 0;
        if (a == ARCH_KIMI_LINEAR)
            kv[il] = 0;                 /* MLA keeps a latent, not KV heads */
        m->n_attn += k == ENGINE_LAYER_ATTN || k == ENGINE_LAYER_ATTN_MAMBA2;
    }
    int n_ff = 0;
    if (n_block > 0 && shared_value(ld, "feed_forward_length", ff, n_block, &n_ff))
        goto out;
    m->n_ff = n_ff;
    if (a == ARCH_KIMI_LINEAR)
        kimi_hparams(ld, n_block);
    else
        attn_hparams(ld, heads, kv);
    if (ld->failed)
        goto out;
    if (a == ARCH_KIMI_LINEAR) {
        /* kimi_hparams read it all */
    } else if (lfm) {
        if (hp_u32(ld, "shortconv.l_cache", &m->ssm_k, 0, true))
            goto out;
        if (m->ssm_k < 2 || m->ssm_k > 16) {
            ld_fail(ld, "metadata %s.shortconv.l_cache = %d is out of range (2..16)", m->arch, m->ssm_k);
            goto out;
        }
    } else if (a == ARCH_JAMBA) {
        mamba1_hparams(ld);
    } else {
        mamba2_hparams(ld);
    }
    if (a == ARCH_JAMBA) {
        /* softmax router, top-k, weights not renormalised (llama.cpp's jamba graph) */
        if (hp_u32(ld, "expert_count", &m->n_expert, 0, false) ||
            hp_u32(ld, "expert_used_count", &m->n_expert_used, 0, m->n_expert > 0))
            goto out;
        if (m->n_expert > 0 && (m->n_expert_used < 1 || m->n_expert_used > m->n_expert || m->n_expert_used > 64 ||
                                m->n_expert > 4096)) {
            ld_fail(ld, "expert_count %d / expert_used_count %d out of range", m->n_expert, m->n_expert_used);
            goto out;
        }
        m->n_ff_exp = n_ff;
        m->moe_norm_topk = false;
        m->use_rope = false;            /* "No RoPE :)" */
        m->attn_scale = 1.0f / sqrtf((float)m->head_dim);
    }
    if (a == ARCH_GRANITEHYBRID) {
        if (hp_u32(ld, "expert_count", &m->n_expert, 0, false) ||
            hp_u32(ld, "expert_used_count", &m->n_expert_used, 0, m->n_expert > 0) ||
            hp_u32(ld, "expert_shared_feed_forward_length", &m->n_ff_shexp, 0, false))
            goto out;
        if (m->n_expert > 0 && (m->n_expert_used < 1 || m->n_expert_used > m->n_expert || m->n_expert_used > 64 ||
                                m->n_expert > 4096)) {
            ld_fail(ld, "expert_count %d / expert_used_count %d out of range", m->n_expert, m->n_expert_used);
            goto out;
        }
        m->n_ff_exp = n_ff;         /* Granite's experts are feed_forward_length wide */
        m->embd_scale = multiplier(ld, "embedding_scale");
        m->residual_scale = multiplier(ld, "residual_scale");
        m->logit_scale = multiplier(ld, "logit_scale");
        char key[128];
        snprintf(key, sizeof key, "%s.rope.scaling.finetuned", m->arch);
        bool finetuned = true;
        if (gguf_find_kv(ld->g, key) && !gguf_get_bool(ld->g, key, &finetuned)) {
            ld_fail(ld, "metadata %s must be a boolean", key);
            goto out;
        }
        m->use_rope = finetuned;    /* Granite uses it as the switch for RoPE */
    }
    if ((a == ARCH_NEMOTRON_H_MOE || a == ARCH_LFM2MOE) && moe_hparams(ld, a, n_block, n_ff))
        goto out;
    m->rope_type = lfm || a == ARCH_FALCON_H1 ? ROPE_NEOX : ROPE_NORM;
    if (a == ARCH_FALCON_H1)
        m->attn_scale = 1.0f / sqrtf((float)m->head_dim);   /* llama.cpp reads no attention.scale for it */
    if (nemo)
        m->use_rope = false;        /* Nemotron-H's attention has no positions (llama.cpp: rope type none) */
    m->qk_norm = lfm;
    if (ld->failed)
        goto out;

    /* tensors */
    const gguf_tensor *te = find_t(ld, "token_embd.weight", true);
    if (!te)
        goto out;
    if (te->ne[0] != (uint64_t)m->n_embd || te->ne[1] < 1 || te->ne[1] > (1u << 24)) {
        ld_fail(ld, "tensor 'token_embd.weight' has shape {%llu, %llu}, expected {%d, n_vocab}",
                (unsigned long long)te->ne[0], (unsigned long long)te->ne[1], m->n_embd);
        goto out;
    }
    m->n_vocab = (int)te->ne[1];
    bind_w(ld, &m->tok_embd, "token_embd.weight", m->n_embd, m->n_vocab);
    /* LFM2's final norm is stored as token_embd_norm (llama.cpp's name fix) */
    m->output_norm = bind_vec(ld, lfm ? "token_embd_norm.weight" : "output_norm.weight", m->n_embd);
    if (gguf_find_tensor(ld->g, "output.weight"))
        bind_w(ld, &m->output, "output.weight", m->n_embd, m->n_vocab);
    else
        m->output = m->tok_embd;
    char nm[96];
    m->n_attn = 0;                  /* counted again as the layers are bound */
    for (int il = 0; il < n_block && !ld->failed; il++) {
        layer *L = &m->layers[il];
        L->kind = m->kinds[il];
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", il);
        L->attn_norm = bind_vec(ld, nm, m->n_embd);
        switch ((enum engine_layer_kind)L->kind) {
        case ENGINE_LAYER_ATTN:
            L->kind_idx = m->n_attn++;
            bind_attention(ld, L, il, m->qk_norm);
            break;
        case ENGINE_LAYER_MAMBA2:
            L->kind_idx = m->n_m2++;
            bind_mamba2(ld, L, il);
            break;
        case ENGINE_LAYER_SCONV:
            L->kind_idx = m->n_sconv++;
            bind_short_conv(ld, L, il);
            break;
        case ENGINE_LAYER_MLP:
            L->kind_idx = m->n_mlp++;
            break;
        case ENGINE_LAYER_MAMBA:
            L->kind_idx = m->n_m1++;
            bind_mamba1(ld, L, il);
            break;
        case ENGINE_LAYER_KDA:
            L->kind_idx = m->n_kda++;
            bind_kda(ld, L, il);
            break;
        case ENGINE_LAYER_MLA:
            L->kind_idx = m->n_mla++;
            snprintf(nm, sizeof nm, "blk.%d.attn_gate.weight", il);
            if (gguf_find_tensor(ld->g, nm)) {
                ld_fail(ld, "tensor '%s': a gate on an MLA layer is not supported yet", nm);
                break;
            }
            bind_mla(ld, L, il);
            break;
        case ENGINE_LAYER_ATTN_MAMBA2:
            L->kind_idx = m->n_attn++;      /* its KV: attention layer kind_idx */
            m->n_m2++;
            bind_attention(ld, L, il, false);
            bind_mamba2(ld, L, il);
            break;
        case ENGINE_LAYER_DELTANET:
        case ENGINE_LAYER_KINDS:
            break;
        }
        if (nemo && m->n_expert > 0) {
            if (L->kind == ENGINE_LAYER_MLP)    /* nemotron_h_moe: the MLP layers are ReLU^2 experts */
                bind_nemotron_moe(ld, L, il);
        } else if (nemo) {
            if (L->kind == ENGINE_LAYER_MLP) {   /* x + W_down relu(W_up norm(x))^2, the layer's one norm */
                L->ffn = FFN_RELU2;
                L->ffn_norm = L->attn_norm;
                snprintf(nm, sizeof nm, "blk.%d.ffn_up.weight", il);
                bind_w(ld, &L->ffn_up, nm, m->n_embd, m->n_ff);
                snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", il);
                bind_w(ld, &L->ffn_down, nm, m->n_ff, m->n_embd);
            }
        } else {
            bind_ffn(ld, L, il, m->n_ff);
        }
    }
    if (ld->failed)
        goto out;
    model_assign_slots(m);
    model_rope_tables(ld);
out:
    free(heads);
    free(kv);
    free(ff);
}

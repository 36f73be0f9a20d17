/* model.c - read qwen35 hyperparameters and bind tensors, shape-checked.
 *
 * Every tensor is checked for presence, shape and type before use, so a
 * broken file fails here with a message naming the file and the tensor,
 * never later inside a kernel.
 * ref: docs/models.md sections 1.2, 2.2-2.4.
 */
#include "model.h"
#include "model_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fault.h"
#include "kernels/panels.h"
#include "kernels/quant.h"
#include "kernels/vecmath.h"


__attribute__((format(printf, 2, 3)))
void ld_fail(loader *ld, const char *fmt, ...)
{
    if (ld->failed)
        return;
    ld->failed = true;
    int n = snprintf(ld->err, ld->errlen, "%s: ", ld->path);
    if (n < 0 || (size_t)n >= ld->errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->err + n, ld->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static void key_name(const loader *ld, const char *suffix, char *buf, size_t n)
{
    snprintf(buf, n, "%s.%s", ld->m->arch, suffix);
}

/* Required u32 hyperparameter "<arch>.<suffix>". */
int hp_u32(loader *ld, const char *suffix, int *out, int def, bool required)
{
    char key[128];
    uint32_t v;
    key_name(ld, suffix, key, sizeof key);
    if (gguf_get_u32(ld->g, key, &v)) {
        if (v > (1u << 30)) {
            ld_fail(ld, "metadata %s = %u is out of range", key, v);
            return -1;
        }
        *out = (int)v;
        return 0;
    }
    if (gguf_find_kv(ld->g, key)) {
        ld_fail(ld, "metadata %s has the wrong type (expected an unsigned integer)", key);
        return -1;
    }
    if (required) {
        ld_fail(ld, "missing metadata key %s", key);
        return -1;
    }
    *out = def;
    return 0;
}

void hp_f32(loader *ld, const char *suffix, float *out, float def)
{
    char key[128];
    key_name(ld, suffix, key, sizeof key);
    if (!gguf_get_f32(ld->g, key, out))
        *out = def;
}

const gguf_tensor *find_t(loader *ld, const char *name, bool required)
{
    const gguf_tensor *t = gguf_find_tensor(ld->g, name);
    if (!t && required)
        ld_fail(ld, "missing tensor '%s'", name);
    return t;
}

/* Bind a weight with ne = {n_in, n_out, n_slabs}: n_slabs matrices of
 * n_out rows (experts, or MLA heads; 1 for a plain 2-D weight). *stride
 * (may be NULL) gets the bytes between slabs. */
void bind_slabs(loader *ld, weight *w, size_t *stride, const char *name, int n_in, int n_out,
                       int n_slabs)
{
    if (ld->failed)
        return;
    const gguf_tensor *t = find_t(ld, name, true);
    if (!t)
        return;
    if (t->ne[0] != (uint64_t)n_in || t->ne[1] != (uint64_t)n_out || t->ne[2] != (uint64_t)n_slabs ||
        t->ne[3] != 1) {
        ld_fail(ld, "tensor '%s' has shape {%llu, %llu, %llu, %llu}, expected {%d, %d, %d}", name,
                (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], n_in, n_out, n_slabs);
        return;
    }
    if (!quant_supported(t->type)) {
        ld_fail(ld, "tensor '%s' has weight type %s (%u), which hyserve does not support yet "
                "(supported: %s)", name, ggml_type_name(t->type), t->type, quant_supported_list());
        return;
    }
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = (size_t)n_in / ggml_block_size(t->type) * ggml_type_size(t->type);
    if (stride)
        *stride = w->row_bytes * (size_t)n_out;
    ld->m->n_params += (uint64_t)n_in * (uint64_t)n_out * (uint64_t)n_slabs;
    ld->m->weight_bytes += t->n_bytes;
}

/* Bind a 2-D weight with ne = {n_in, n_out}. */
void bind_w(loader *ld, weight *w, const char *name, int n_in, int n_out)
{
    bind_slabs(ld, w, NULL, name, n_in, n_out, 1);
}

/* Bind a small tensor of n_rows x n elements (ne = {n, n_rows}), copied to f32. */
float *bind_vec2(loader *ld, const char *name, int n, int n_rows)
{
    if (ld->failed)
        return NULL;
    const gguf_tensor *t = find_t(ld, name, true);
    if (!t)
        return NULL;
    uint64_t want1 = n_rows == 1 ? 1 : (uint64_t)n_rows;
    if (t->ne[0] != (uint64_t)n || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1) {
        ld_fail(ld, "tensor '%s' has shape {%llu, %llu}, expected {%d, %d}", name,
                (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], n, n_rows);
        return NULL;
    }
    if (t->type != GGML_F32 && t->type != GGML_F16 && t->type != GGML_BF16) {
        ld_fail(ld, "tensor '%s' has type %s; small tensors must be F32, F16 or BF16", name,
                ggml_type_name(t->type));
        return NULL;
    }
    float *v = FAULT_OR(malloc((size_t)n * (size_t)n_rows * sizeof(float)));
    if (!v) {
        ld_fail(ld, "out of memory");
        return NULL;
    }
    dequant_row(t->type, t->data, v, n * n_rows);
    ld->m->n_params += (uint64_t)n * (uint64_t)n_rows;
    ld->m->weight_bytes += t->n_bytes;
    return v;
}

float *bind_vec(loader *ld, const char *name, int n)
{
    return bind_vec2(ld, name, n, 1);
}

/* The file's conv taps are [channel][K]; the conv runs over channels
 * innermost, so they are kept as [K][channel]. */
void transpose_taps(loader *ld, float **w, int K, int n_ch)
{
    if (ld->failed || !*w)
        return;
    float *t = FAULT_OR(malloc(sizeof(float) * (size_t)K * (size_t)n_ch));
    if (!t) {
        ld_fail(ld, "out of memory");
        return;
    }
    for (int c = 0; c < n_ch; c++)
        for (int j = 0; j < K; j++)
            t[(size_t)j * n_ch + c] = (*w)[(size_t)c * K + j];
    free(*w);
    *w = t;
}

/* Layer kinds: explicit per-layer array, else the interval rule. */
static void read_layout(loader *ld)
{
    model *m = ld->m;
    char key[128];
    /* our extension: an explicit kind per layer (0 attention, 1 DeltaNet, 2 MLA) */
    const gguf_kv *lk = gguf_find_kv(ld->g, "hyserve.layer_kinds");
    if (lk) {
        if (lk->type != GGUF_T_ARRAY || lk->arr_n < (uint64_t)m->n_layer) {
            ld_fail(ld, "metadata hyserve.layer_kinds must be an array of at least %d kinds", m->n_layer);
            return;
        }
        for (int il = 0; il < m->n_layer; il++) {
            int64_t v;
            if (!gguf_arr_get_i64(lk, (uint64_t)il, &v) || v < 0 || v > ENGINE_LAYER_MLA) {
                ld_fail(ld, "metadata hyserve.layer_kinds[%d] must be 0 (attention), 1 (DeltaNet) or 2 (MLA)", il);
                return;
            }
            m->kinds[il] = (uint8_t)v;
        }
        return;
    }
    key_name(ld, "attention.recurrent_layers", key, sizeof key);
    const gguf_kv *kv = gguf_find_kv(ld->g, key);
    int interval = 4;
    if (kv) {
        if (kv->type != GGUF_T_ARRAY || kv->arr_n < (uint64_t)m->n_layer) {
            ld_fail(ld, "metadata %s must be an array of at least %d booleans", key, m->n_layer);
            return;
        }
        for (int il = 0; il < m->n_layer; il++) {
            int64_t v;
            if (!gguf_arr_get_i64(kv, (uint64_t)il, &v)) {
                ld_fail(ld, "metadata %s must hold booleans or integers", key);
                return;
            }
            m->kinds[il] = v ? ENGINE_LAYER_DELTANET : ENGINE_LAYER_ATTN;
        }
        return;
    }
    if (hp_u32(ld, "full_attention_interval", &interval, 4, false) != 0)
        return;
    if (interval <= 0) {
        ld_fail(ld, "metadata %s.full_attention_interval must be at least 1", m->arch);
        return;
    }
    for (int il = 0; il < m->n_layer; il++)
        m->kinds[il] = (il + 1) % interval == 0 ? ENGINE_LAYER_ATTN : ENGINE_LAYER_DELTANET;
}


/* the archs whose feed-forward is a mixture of experts with a gated shared expert */
static bool arch_moe(enum arch a)
{
    return a == ARCH_QWEN3NEXT || a == ARCH_QWEN35MOE;
}

/* MLA shape: deepseek2 keys, also used by hybrid files with MLA layers. */
static void load_mla_hparams(loader *ld, enum arch a)
{
    model *m = ld->m;
    int klen = 0;
    if (hp_u32(ld, "attention.kv_lora_rank", &m->mla_kv_lora, 0, true) ||
        hp_u32(ld, "attention.q_lora_rank", &m->mla_q_lora, 0, false) ||
        hp_u32(ld, "attention.key_length_mla", &klen, 0, true) ||
        hp_u32(ld, "attention.value_length_mla", &m->mla_v, 0, true) ||
        hp_u32(ld, a == ARCH_DEEPSEEK2 ? "rope.dimension_count" : "rope.dimension_count_mla",
               &m->mla_rope, 0, true))
        return;
    m->mla_nope = klen - m->mla_rope;
    if (m->mla_kv_lora <= 0 || m->mla_rope <= 0 || m->mla_rope % 2 || m->mla_nope <= 0 ||
        m->mla_v <= 0 || m->mla_q_lora < 0) {
        ld_fail(ld, "MLA hyperparameters out of range (kv_lora_rank %d, key_length_mla %d, rope dims %d "
                "(even), value_length_mla %d)", m->mla_kv_lora, klen, m->mla_rope, m->mla_v);
        return;
    }
    char *scaling = NULL, key[128];
    key_name(ld, "rope.scaling.type", key, sizeof key);
    scaling = gguf_get_str_dup(ld->g, key);
    if (!scaling && gguf_has_str(ld->g, key)) {
        ld_fail(ld, "out of memory");
        return;
    }
    if (scaling && strcmp(scaling, "none")) {
        ld_fail(ld, "RoPE scaling '%s' is not supported for MLA layers yet", scaling);
        free(scaling);
        return;
    }
    free(scaling);
    m->mla_scale = 1.0f / sqrtf((float)klen);
}

static void load_hparams(loader *ld, enum arch a)
{
    model *m = ld->m;
    const bool hybrid = a == ARCH_QWEN35 || a == ARCH_QWEN35MOE || a == ARCH_QWEN3NEXT;
    if (a == ARCH_DEEPSEEK2) {
        int n_block = 0, n_dense = 0;
        if (hp_u32(ld, "block_count", &n_block, 0, true) ||
            hp_u32(ld, "embedding_length", &m->n_embd, 0, true) ||
            hp_u32(ld, "feed_forward_length", &m->n_ff, 0, true) ||
            hp_u32(ld, "context_length", &m->n_ctx_train, 4096, false) ||
            hp_u32(ld, "attention.head_count", &m->n_head, 0, true) ||
            hp_u32(ld, "leading_dense_block_count", &n_dense, 0, false))
            return;
        m->n_layer = n_block;
        if (m->n_layer <= 0 || m->n_embd <= 0 || m->n_head <= 0 || m->n_ff <= 0) {
            ld_fail(ld, "hyperparameters out of range (layers %d, embd %d, heads %d, ff %d)",
                    m->n_layer, m->n_embd, m->n_head, m->n_ff);
            return;
        }
        if (n_dense < n_block) {
            ld_fail(ld, "deepseek2 mixture-of-experts layers are not supported (%d of %d layers are "
                    "dense); dense MLA models load", n_dense, n_block);
            return;
        }
        hp_f32(ld, "attention.layer_norm_rms_epsilon", &m->eps, 1e-6f);
        hp_f32(ld, "rope.freq_base", &m->rope_theta, 10000.0f);
        load_mla_hparams(ld, a);
        return;
    }
    int n_block = 0, n_nextn = 0;
    if (hp_u32(ld, "block_count", &n_block, 0, true) ||
        hp_u32(ld, "nextn_predict_layers", &n_nextn, 0, false) ||
        hp_u32(ld, "embedding_length", &m->n_embd, 0, true) ||
        hp_u32(ld, "feed_forward_length", &m->n_ff, 0, !arch_moe(a)) ||
        hp_u32(ld, "context_length", &m->n_ctx_train, 4096, false) ||
        hp_u32(ld, "attention.head_count", &m->n_head, 0, true) ||
        hp_u32(ld, "attention.head_count_kv", &m->n_head_kv, m->n_head, false))
        return;
    if (m->n_head <= 0 || m->n_embd <= 0) {
        ld_fail(ld, "embedding_length and attention.head_count must be positive");
        return;
    }
    int v_len = 0;
    if (hp_u32(ld, "attention.key_length", &m->head_dim, m->n_embd / m->n_head, hybrid) ||
        hp_u32(ld, "attention.value_length", &v_len, m->head_dim, false) ||
        hp_u32(ld, "rope.dimension_count", &m->n_rot, m->head_dim, false))
        return;
    if (hybrid) {
        int inner = 0;
        if (hp_u32(ld, "ssm.conv_kernel", &m->ssm_k, 0, true) ||
            hp_u32(ld, "ssm.state_size", &m->ssm_d_k, 0, true) ||
            hp_u32(ld, "ssm.group_count", &m->ssm_n_k, 0, true) ||
            hp_u32(ld, "ssm.time_step_rank", &m->ssm_n_v, 0, true) ||
            hp_u32(ld, "ssm.inner_size", &inner, 0, true))
            return;
        if (m->ssm_k <= 0 || m->ssm_k > 16 || m->ssm_d_k <= 0 || m->ssm_n_k <= 0 ||
            m->ssm_n_v <= 0 || inner <= 0 || inner % m->ssm_n_v != 0 ||
            m->ssm_n_v % m->ssm_n_k != 0) {
            ld_fail(ld, "DeltaNet hyperparameters out of range: conv kernel %d (1..16), state %d, "
                    "%d key heads, %d value heads (a multiple of key heads), inner size %d",
                    m->ssm_k, m->ssm_d_k, m->ssm_n_k, m->ssm_n_v, inner);
            return;
        }
        m->ssm_d_v = inner / m->ssm_n_v;
        m->conv_dim = 2 * m->ssm_n_k * m->ssm_d_k + m->ssm_n_v * m->ssm_d_v;
    }
    if (arch_moe(a)) {
        if (hp_u32(ld, "expert_count", &m->n_expert, 0, true) ||
            hp_u32(ld, "expert_used_count", &m->n_expert_used, 0, true) ||
            hp_u32(ld, "expert_feed_forward_length", &m->n_ff_exp, 0, true) ||
            hp_u32(ld, "expert_shared_feed_forward_length", &m->n_ff_shexp, m->n_ff_exp, false))
            return;
        if (m->n_expert < 1 || m->n_expert_used < 1 || m->n_expert_used > m->n_expert ||
            m->n_expert_used > 64 || m->n_ff_exp < 1) {
            ld_fail(ld, "expert_count %d / expert_used_count %d / expert_feed_forward_length %d out "
                    "of range", m->n_expert, m->n_expert_used, m->n_ff_exp);
            return;
        }
    }
    if (hybrid) {
        const gguf_kv *lk = gguf_find_kv(ld->g, "hyserve.layer_kinds");
        bool any_mla = false;
        for (uint64_t i = 0; lk && i < lk->arr_n; i++) {
            int64_t v;
            any_mla |= gguf_arr_get_i64(lk, i, &v) && v == ENGINE_LAYER_MLA;
        }
        if (any_mla)
            load_mla_hparams(ld, a);
        if (ld->failed)
            return;
    }
    hp_f32(ld, "attention.layer_norm_rms_epsilon", &m->eps, a == ARCH_LLAMA ? 1e-5f : 1e-6f);
    hp_f32(ld, "rope.freq_base", &m->rope_theta, a == ARCH_LLAMA ? 10000.0f : 1000000.0f);
    hp_f32(ld, "attention.scale", &m->attn_scale, 0.0f);

    if (n_nextn < 0 || n_nextn >= n_block) {
        ld_fail(ld, "metadata %s.nextn_predict_layers = %d must be below block_count %d", m->arch, n_nextn,
                n_block);
        return;
    }
    m->n_nextn = n_nextn;
    m->n_layer = n_block - n_nextn;
    if (m->n_layer <= 0 || m->n_head_kv <= 0 || m->head_dim <= 0 || m->n_ff < 0) {
        ld_fail(ld, "hyperparameters out of range (layers %d, heads %d/%d, head_dim %d, ff %d)",
                m->n_layer, m->n_head, m->n_head_kv, m->head_dim, m->n_ff);
        return;
    }
    if (m->n_head % m->n_head_kv != 0) {
        ld_fail(ld, "attention.head_count %d is not a multiple of head_count_kv %d", m->n_head,
                m->n_head_kv);
        return;
    }
    if (v_len != m->head_dim) {
        ld_fail(ld, "attention.value_length %d differs from key_length %d (unsupported)", v_len,
                m->head_dim);
        return;
    }
    if (m->n_rot == 0)
        m->n_rot = m->head_dim;
    if (m->n_rot > m->head_dim || m->n_rot % 2) {
        ld_fail(ld, "rope.dimension_count %d must be even and at most head_dim %d", m->n_rot,
                m->head_dim);
        return;
    }
    if (m->attn_scale == 0.0f)
        m->attn_scale = 1.0f / sqrtf((float)m->head_dim);
    m->rope_type = a == ARCH_LLAMA ? ROPE_NORM : ROPE_NEOX;
    m->attn_gated = hybrid;
    m->qk_norm = a != ARCH_LLAMA;
    m->dnet_grouped = a == ARCH_QWEN3NEXT;
}

/* Each recurrent layer's part of a sequence's slot, in layer order: its
 * state in the slot's states, its conv window in the slot's conv windows.
 * The totals are what the cache sizes slots by (memplan.c's per-kind
 * arithmetic), checked equal at engine open. */
void model_assign_slots(model *m)
{
    size_t st = 0, cv = 0;
    for (int il = 0; il < m->n_layer; il++) {
        layer *L = &m->layers[il];
        L->rec_state = st;
        L->rec_conv = cv;
        switch ((enum engine_layer_kind)L->kind) {
        case ENGINE_LAYER_DELTANET:
            st += (size_t)m->ssm_n_v * m->ssm_d_v * m->ssm_d_k;
            cv += (size_t)(m->ssm_k - 1) * m->conv_dim;
            break;
        case ENGINE_LAYER_MAMBA2:
        case ENGINE_LAYER_ATTN_MAMBA2:
            st += (size_t)m->m2_heads * m->m2_head_dim * m->m2_d_state;
            cv += (size_t)(m->ssm_k - 1) * m->m2_conv_ch;
            break;
        case ENGINE_LAYER_SCONV:
            cv += (size_t)(m->ssm_k - 1) * m->n_embd;
            break;
        case ENGINE_LAYER_MAMBA:
            st += (size_t)m->m1_inner * m->m1_d_state;
            cv += (size_t)(m->ssm_k - 1) * m->m1_inner;
            break;
        case ENGINE_LAYER_KDA:
            st += (size_t)m->kda_heads * m->kda_head_dim * m->kda_head_dim;
            cv += (size_t)3 * (m->ssm_k - 1) * m->kda_heads * m->kda_head_dim;
            break;
        case ENGINE_LAYER_ATTN:
        case ENGINE_LAYER_MLA:
        case ENGINE_LAYER_MLP:
        case ENGINE_LAYER_KINDS:
            break;
        }
    }
    m->rec_state_numbers = st;
    m->rec_conv_floats = cv;
}

/* An MLA layer's tensors (deepseek2's names; also kimi-linear's MLA layers). */
void bind_mla(loader *ld, layer *L, int il)
{
    model *m = ld->m;
    const int E = m->n_embd, NH = m->n_head, QK = m->mla_nope + m->mla_rope, R = m->mla_kv_lora;
    char nm[96];
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    if (m->mla_q_lora > 0) {
        bind_w(ld, &L->wq_a, TN("attn_q_a.weight"), E, m->mla_q_lora);
        L->q_a_norm = bind_vec(ld, TN("attn_q_a_norm.weight"), m->mla_q_lora);
        bind_w(ld, &L->wq_b, TN("attn_q_b.weight"), m->mla_q_lora, NH * QK);
    } else {
        bind_w(ld, &L->wq, TN("attn_q.weight"), E, NH * QK);
    }
    bind_w(ld, &L->wkv_a, TN("attn_kv_a_mqa.weight"), E, R + m->mla_rope);
    L->kv_a_norm = bind_vec(ld, TN("attn_kv_a_norm.weight"), R);
    if (!ld->failed && !gguf_find_tensor(ld->g, TN("attn_k_b.weight")) &&
        gguf_find_tensor(ld->g, TN("attn_kv_b.weight"))) {
        ld_fail(ld, "layer %d has the legacy fused attn_kv_b; hyserve needs attn_k_b/attn_v_b "
                "(re-convert with a current llama.cpp converter)", il);
        return;
    }
    bind_slabs(ld, &L->wk_b, &L->k_b_stride, TN("attn_k_b.weight"), m->mla_nope, R, NH);
    bind_slabs(ld, &L->wv_b, &L->v_b_stride, TN("attn_v_b.weight"), R, m->mla_v, NH);
    bind_w(ld, &L->wo, TN("attn_output.weight"), NH * m->mla_v, E);
#undef TN
}

/* Block il's tensors (blk.{il}.*) as a layer of the given kind: its mixer
 * and its FFN, the arch's kinds. The trunk's blocks and the MTP block. */
static void bind_block(loader *ld, enum arch a, layer *L, int il, uint8_t kind)
{
    model *m = ld->m;
    const bool hybrid = a == ARCH_QWEN35 || a == ARCH_QWEN35MOE || a == ARCH_QWEN3NEXT;
    const int E = m->n_embd, HD = m->head_dim, NV = m->ssm_n_v, DV = m->ssm_d_v;
    const int NK = m->ssm_n_k, DK = m->ssm_d_k;
    const char *post_norm_name = hybrid ? "post_attention_norm.weight" : "ffn_norm.weight";
    char nm[96];
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    L->kind = kind;
    L->attn_norm = bind_vec(ld, TN("attn_norm.weight"), E);
    snprintf(nm, sizeof nm, "blk.%d.%s", il, post_norm_name);
    L->post_norm = bind_vec(ld, nm, E);
    if (L->kind == ENGINE_LAYER_ATTN) {
        L->kind_idx = m->n_attn++;
        bind_w(ld, &L->wq, TN("attn_q.weight"), E, m->n_head * (m->attn_gated ? 2 : 1) * HD);
        bind_w(ld, &L->wk, TN("attn_k.weight"), E, m->n_head_kv * HD);
        bind_w(ld, &L->wv, TN("attn_v.weight"), E, m->n_head_kv * HD);
        bind_w(ld, &L->wo, TN("attn_output.weight"), m->n_head * HD, E);
        if (m->qk_norm) {
            L->q_norm = bind_vec(ld, TN("attn_q_norm.weight"), HD);
            L->k_norm = bind_vec(ld, TN("attn_k_norm.weight"), HD);
        }
    } else if (L->kind == ENGINE_LAYER_MLA) {
        L->kind_idx = m->n_mla++;
        bind_mla(ld, L, il);
    } else {
        L->kind_idx = m->n_dnet++;
        if (a == ARCH_QWEN3NEXT) {
            if (gguf_find_tensor(ld->g, TN("attn_qkv.weight")) || !gguf_find_tensor(ld->g, TN("ssm_in.weight"))) {
                bind_w(ld, &L->wqkv, TN("attn_qkv.weight"), E, m->conv_dim);
                bind_w(ld, &L->wz, TN("attn_gate.weight"), E, NV * DV);
            } else {
                L->legacy_ssm_in = true;
                bind_w(ld, &L->ssm_in, TN("ssm_in.weight"), E, 2 * NK * DK + 2 * NV * DV);
            }
            bind_w(ld, &L->ssm_ba, TN("ssm_ba.weight"), E, 2 * NV);
        } else {
            bind_w(ld, &L->wqkv, TN("attn_qkv.weight"), E, m->conv_dim);
            bind_w(ld, &L->wz, TN("attn_gate.weight"), E, NV * DV);
            bind_w(ld, &L->wb, TN("ssm_beta.weight"), E, NV);
            bind_w(ld, &L->wa, TN("ssm_alpha.weight"), E, NV);
        }
        L->conv1d_t = bind_vec2(ld, TN("ssm_conv1d.weight"), m->ssm_k, m->conv_dim);
        transpose_taps(ld, &L->conv1d_t, m->ssm_k, m->conv_dim);
        L->dt_bias = bind_vec(ld, TN("ssm_dt.bias"), NV);
        L->ssm_a = bind_vec(ld, TN("ssm_a"), NV);
        L->ssm_norm = bind_vec(ld, TN("ssm_norm.weight"), DV);
        bind_w(ld, &L->wout, TN("ssm_out.weight"), NV * DV, E);
    }
    L->ffn_norm = L->post_norm;
    if (arch_moe(a)) {
        L->ffn = FFN_MOE;
        bind_w(ld, &L->router, TN("ffn_gate_inp.weight"), E, m->n_expert);
        bind_slabs(ld, &L->gate_exps, &L->up_gate_stride, TN("ffn_gate_exps.weight"), E, m->n_ff_exp, m->n_expert);
        size_t up_stride = 0;
        bind_slabs(ld, &L->up_exps, &up_stride, TN("ffn_up_exps.weight"), E, m->n_ff_exp, m->n_expert);
        bind_slabs(ld, &L->down_exps, &L->down_stride, TN("ffn_down_exps.weight"), m->n_ff_exp, E, m->n_expert);
        if (!ld->failed && up_stride != L->up_gate_stride) {
            ld_fail(ld, "layer %d: ffn_gate_exps and ffn_up_exps have different types", il);
            return;
        }
        L->shexp_gate = bind_vec(ld, TN("ffn_gate_inp_shexp.weight"), E);
        bind_w(ld, &L->gate_shexp, TN("ffn_gate_shexp.weight"), E, m->n_ff_shexp);
        bind_w(ld, &L->up_shexp, TN("ffn_up_shexp.weight"), E, m->n_ff_shexp);
        bind_w(ld, &L->down_shexp, TN("ffn_down_shexp.weight"), m->n_ff_shexp, E);
    } else {
        L->ffn = FFN_SWIGLU;
        bind_w(ld, &L->ffn_gate, TN("ffn_gate.weight"), E, m->n_ff);
        bind_w(ld, &L->ffn_up, TN("ffn_up.weight"), E, m->n_ff);
        bind_w(ld, &L->ffn_down, TN("ffn_down.weight"), m->n_ff, E);
    }
#undef TN
}

/* The MTP block blk.{n_layer} (nextn_predict_layers N > 0): a
 * full-attention block, the arch's FFN and the nextn.* tensors, every
 * shape checked against n_embd and n_vocab. N > 1 (no released file has
 * it): the first block only, said in one line on stderr; the drafts chain
 * it (docs/models.md 1.7). */
static void bind_mtp(loader *ld, enum arch a)
{
    model *m = ld->m;
    mtp_block *p = &m->mtp;
    const int il = m->n_layer, E = m->n_embd;
    char nm[96];
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
    if (m->n_nextn > 1)
        fprintf(stderr, "hyserve: %s: %s.nextn_predict_layers is %d; using the first MTP block (blk.%d) only\n",
                ld->path, m->arch, m->n_nextn, il);
    const int n_attn = m->n_attn, n_dnet = m->n_dnet, n_mla = m->n_mla;
    bind_block(ld, a, &p->blk, il, ENGINE_LAYER_ATTN);
    /* the MTP's attention is the only layer of its own cache, not one of the trunk's */
    m->n_attn = n_attn;
    m->n_dnet = n_dnet;
    m->n_mla = n_mla;
    p->blk.kind_idx = 0;
    bind_w(ld, &p->eh_proj, TN("nextn.eh_proj.weight"), 2 * E, E);
    p->enorm = bind_vec(ld, TN("nextn.enorm.weight"), E);
    p->hnorm = bind_vec(ld, TN("nextn.hnorm.weight"), E);
    p->head_norm = bind_vec(ld, TN("nextn.shared_head_norm.weight"), E);
    if (!ld->failed && gguf_find_tensor(ld->g, TN("nextn.embed_tokens.weight")))
        bind_w(ld, &p->embed, nm, E, m->n_vocab);
    if (!ld->failed && gguf_find_tensor(ld->g, TN("nextn.shared_head_head.weight")))
        bind_w(ld, &p->head, nm, E, m->n_vocab);
#undef TN
    p->blk.ffn_norm = p->blk.post_norm;
    m->has_mtp = !ld->failed;
}

static void bind_tensors(loader *ld, enum arch a)
{
    model *m = ld->m;
    const bool hybrid = a == ARCH_QWEN35 || a == ARCH_QWEN35MOE || a == ARCH_QWEN3NEXT;
    /* every layer has tensors of its own: a block_count the file's tensor
     * table cannot hold is refused before allocating per layer for it */
    if ((uint64_t)m->n_layer > ld->g->n_tensors) {
        ld_fail(ld, "metadata %s.block_count = %d is more layers than the file's %llu tensors can hold",
                m->arch, m->n_layer, (unsigned long long)ld->g->n_tensors);
        return;
    }
    m->kinds = FAULT_OR(calloc((size_t)m->n_layer, 1));
    m->layers = FAULT_OR(calloc((size_t)m->n_layer, sizeof(layer)));
    if (!m->kinds || !m->layers) {
        ld_fail(ld, "out of memory");
        return;
    }
    if (hybrid)
        read_layout(ld);
    else if (a == ARCH_DEEPSEEK2)
        memset(m->kinds, ENGINE_LAYER_MLA, (size_t)m->n_layer);
    /* plain-attention archs: every layer is ENGINE_LAYER_ATTN (0, from calloc) */
    if (ld->failed)
        return;

    /* token embedding: ne = {n_embd, n_vocab}; n_vocab comes from the tensor */
    const gguf_tensor *te = find_t(ld, "token_embd.weight", true);
    if (!te)
        return;
    if (te->ne[0] != (uint64_t)m->n_embd || te->ne[1] < 1 || te->ne[1] > (1u << 24)) {
        ld_fail(ld, "tensor 'token_embd.weight' has shape {%llu, %llu}, expected {%d, n_vocab}",
                (unsigned long long)te->ne[0], (unsigned long long)te->ne[1], m->n_embd);
        return;
    }
    m->n_vocab = (int)te->ne[1];
    bind_w(ld, &m->tok_embd, "token_embd.weight", m->n_embd, m->n_vocab);
    m->output_norm = bind_vec(ld, "output_norm.weight", m->n_embd);
    if (gguf_find_tensor(ld->g, "output.weight"))
        bind_w(ld, &m->output, "output.weight", m->n_embd, m->n_vocab);
    else
        m->output = m->tok_embd;   /* tied */

    for (int il = 0; il < m->n_layer && !ld->failed; il++)
        bind_block(ld, a, &m->layers[il], il, m->kinds[il]);
    if (!ld->failed && m->n_nextn > 0)
        bind_mtp(ld, a);
    if (ld->failed)
        return;
    model_assign_slots(m);
    model_rope_tables(ld);
}

void model_rope_tables(loader *ld)
{
    model *m = ld->m;
    m->rope_inv_freq = FAULT_OR(malloc((size_t)(m->n_rot / 2 + 1) * sizeof(float)));
    if (!m->rope_inv_freq) {
        ld_fail(ld, "out of memory");
        return;
    }
    /* inv_freq[i] = theta^(-2i/n_rot); Llama 3.1 files carry per-frequency
     * divisors in rope_freqs.weight (llama.cpp's freq_factors) */
    if (m->n_mla) {
        m->mla_inv_freq = FAULT_OR(malloc((size_t)(m->mla_rope / 2 + 1) * sizeof(float)));
        if (!m->mla_inv_freq) {
            ld_fail(ld, "out of memory");
            return;
        }
        for (int i = 0; i < m->mla_rope / 2; i++)
            m->mla_inv_freq[i] = (float)pow((double)m->rope_theta, -2.0 * i / m->mla_rope);
    }
    float *ff = NULL;
    if (gguf_find_tensor(ld->g, "rope_freqs.weight"))
        ff = bind_vec(ld, "rope_freqs.weight", m->n_rot / 2);
    if (ld->failed)
        return;
    for (int i = 0; i < m->n_rot / 2; i++)
        m->rope_inv_freq[i] = (float)(pow((double)m->rope_theta, -2.0 * i / m->n_rot) /
                                      (ff ? (double)ff[i] : 1.0));
    free(ff);
}

static const struct { const char *name; enum arch a; } archs[] = {
    { "granitehybrid", ARCH_GRANITEHYBRID },
    { "nemotron_h", ARCH_NEMOTRON_H },
    { "nemotron_h_moe", ARCH_NEMOTRON_H_MOE },
    { "lfm2", ARCH_LFM2 },
    { "lfm2moe", ARCH_LFM2MOE },
    { "falcon-h1", ARCH_FALCON_H1 },
    { "jamba", ARCH_JAMBA },
    { "kimi-linear", ARCH_KIMI_LINEAR },
    { "qwen35", ARCH_QWEN35 },
    { "qwen35moe", ARCH_QWEN35MOE },
    { "qwen3next", ARCH_QWEN3NEXT },
    { "qwen3", ARCH_QWEN3 },
    { "llama", ARCH_LLAMA },
    { "deepseek2", ARCH_DEEPSEEK2 },
};

/* The weights only ever multiplied whole by matmul: every layer's
 * projections and an untied LM head, into ws (room for PROJ_MAX(m)). */
#define PROJ_PER_LAYER 27
#define PROJ_MAX(m) ((size_t)(m)->n_layer * PROJ_PER_LAYER + 1)

static int projection_weights(model *m, weight **ws)
{
    int n = 0;
    for (int l = 0; l < m->n_layer; l++) {
        layer *L = &m->layers[l];
        weight *lw[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->wqkv, &L->wz, &L->wb, &L->wa, &L->wout,
                         &L->wq_a, &L->wq_b, &L->wkv_a, &L->ssm_ba, &L->ssm_in, &L->ffn_gate,
                         &L->ffn_up, &L->ffn_down, &L->router, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
                         &L->ssm_x, &L->ssm_dt, &L->ssm_fa, &L->ssm_fb, &L->ssm_ga, &L->ssm_gb };
        _Static_assert(sizeof lw / sizeof lw[0] == PROJ_PER_LAYER, "PROJ_PER_LAYER counts the weights listed");
        for (int i = 0; i < PROJ_PER_LAYER; i++)
            if (lw[i]->data)
                ws[n++] = lw[i];
    }
    if (m->output.data && m->output.data != m->tok_embd.data)
        ws[n++] = &m->output;                       /* an untied LM head */
    return n;
}

/* w's whole pages in the file mapping dropped (its bytes now live elsewhere
 * and are no longer read): a private mapping's pages would otherwise stay
 * resident, counted against the process */
static void drop_file_pages(const weight *w)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)w->data + pg - 1) & ~(pg - 1);
    const uintptr_t b = ((uintptr_t)w->data + (size_t)w->n_out * w->row_bytes) & ~(pg - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* A file's MTP blocks (blk.{n_layer}.. on) when the engine does not run
 * them: the pages the prefault read are given back, so the process holds
 * no more than for a file without them. */
static void drop_mtp_pages(const model *m)
{
    char pre[32];
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        bool mtp = false;
        for (int il = m->n_layer; il < m->n_layer + m->n_nextn && !mtp; il++) {
            const int n = snprintf(pre, sizeof pre, "blk.%d.", il);
            mtp = n > 0 && !strncmp(t->name, pre, (size_t)n);
        }
        const uintptr_t a = ((uintptr_t)t->data + pg - 1) & ~(pg - 1);
        const uintptr_t b = ((uintptr_t)t->data + t->n_bytes) & ~(pg - 1);
        if (mtp && b > a)
            madvise((void *)a, b - a, MADV_DONTNEED);
    }
}

/* where weight i of ws starts in an arena that holds them in order, each
 * rounded up to 64 bytes; i = n: the bytes of all n */
/* A phase of the load as engine_progress_fn hears of it: begun with its
 * total, parts added from any thread; the part that completes it is the
 * one call with done == total. */
typedef struct progress {
    engine_progress_fn fn;
    void *ctx;
    const char *phase;
    uint64_t total;
    _Atomic uint64_t done;
    const char *read_phase;     /* the name file_read gives the next read */
} progress;

static void progress_begin(progress *p, const char *phase, uint64_t total)
{
    p->phase = phase;
    p->total = total;
    atomic_store(&p->done, 0);
    if (p->fn && total)
        p->fn(p->ctx, phase, 0, total);
}

static void progress_add(void *ctx, uint64_t bytes)
{
    progress *p = ctx;
    if (!p->fn || !p->total || !bytes)
        return;
    p->fn(p->ctx, p->phase, atomic_fetch_add(&p->done, bytes) + bytes, p->total);
}

/* gguf_load_huge's and gguf_prefault's parts: 0 bytes when reading begins */
static void file_read(void *ctx, uint64_t bytes, uint64_t total)
{
    progress *p = ctx;
    if (bytes)
        progress_add(p, bytes);
    else
        progress_begin(p, p->read_phase, total);
}

static size_t weight_bytes_of(weight *const *ws, int n)
{
    size_t b = 0;
    for (int i = 0; i < n; i++)
        b += (size_t)ws[i]->n_out * ws[i]->row_bytes;
    return b;
}

static size_t arena_offset(weight *const *ws, int i)
{
    size_t off = 0;
    for (int j = 0; j < i; j++)
        off += ((size_t)ws[j]->n_out * ws[j]->row_bytes + 63) & ~(size_t)63;
    return off;
}

/* Repack the projection weights that panels_fit into panels (panels.h):
 * from the file mapping into one anonymous region of the model's
 * (panel_arena), and the file pages they came from are dropped from the
 * mapping (drop_file_pages): a private copy would copy each page on first
 * write, a slower load (docs/performance.md section 12). With
 * huge_weights the huge-page copy is already the process's own and is
 * rewritten in place. Leaves every weight as stored if memory is short. */
static void pack_panels(model *m, weight **ws, progress *pg)     /* ws: room for PROJ_MAX(m) */
{
    int n = 0;
    size_t total = 0, max_bytes = 0;
    const int n_proj = projection_weights(m, ws);
    for (int i = 0; i < n_proj; i++)
        if (panels_fit(ws[i]))
            ws[n++] = ws[i];
    for (int i = 0; i < n; i++) {
        const size_t bytes = (size_t)ws[i]->n_out * ws[i]->row_bytes;
        total += (bytes + 63) & ~(size_t)63;
        max_bytes = bytes > max_bytes ? bytes : max_bytes;
    }
    if (n && m->gguf->data_copy) {
        void *tmp = FAULT_OR(malloc(max_bytes));
        if (tmp && gguf_data_writable(m->gguf, true) == 0) {
            progress_begin(pg, "repacking weights into panels", weight_bytes_of(ws, n));
            for (int i = 0; i < n; i++) {
                weight *w = ws[i];
                memcpy(tmp, w->data, (size_t)w->n_out * w->row_bytes);
                panels_pack(tmp, w->type, w->n_in, w->n_out, (void *)w->data);
                w->panels = true;
                progress_add(pg, (uint64_t)w->n_out * w->row_bytes);
            }
            gguf_data_writable(m->gguf, false);
            m->n_panels = n;
        }
        free(tmp);
    } else if (n) {
        uint8_t *arena = fault_now() ? MAP_FAILED : mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (arena != MAP_FAILED) {
            progress_begin(pg, "repacking weights into panels", weight_bytes_of(ws, n));
            #pragma omp parallel for schedule(dynamic, 1)
            for (int i = 0; i < n; i++) {
                weight *w = ws[i];
                const size_t off = arena_offset(ws, i);
                panels_pack(w->data, w->type, w->n_in, w->n_out, arena + off);
                drop_file_pages(w);
                w->data = arena + off;
                w->panels = true;
                progress_add(pg, (uint64_t)w->n_out * w->row_bytes);
            }
            mprotect(arena, total, PROT_READ);
            m->panel_arena = arena;
            m->panel_arena_bytes = total;
            m->n_panels = n;
        }
    }
}

/* Copy the F32 weights matmul reads whole (the projections, the LM head,
 * the token embedding) out of the file mapping into one anonymous region
 * of the model's (f32_arena), advised for transparent huge pages, and drop
 * the file pages they came from, as pack_panels does. The same rows, the
 * same bytes: every kernel and every result is unchanged. Why: a decode
 * token streams every weight once, and from the file's page-cache pages
 * F32 decode ran well short of what anonymous memory gives
 * (docs/performance.md sections 9 and 12). Not with the huge-page copy
 * (already the process's own), not with HYSERVE_F32_COPY=0 (A/B runs),
 * and the weights stay mapped if memory is short. */
#define F32_ARENA_ALIGN ((size_t)2 << 20)

static bool f32_copy_wanted(void)
{
    const char *e = getenv("HYSERVE_F32_COPY");
    return !(e && !strcmp(e, "0"));
}

static void copy_f32(model *m, weight **ws, progress *pg)       /* ws: room for PROJ_MAX(m) + 1 */
{
    int n = 0;
    size_t total;
    const int n_proj = projection_weights(m, ws);
    for (int i = 0; i < n_proj; i++)
        if (ws[i]->type == GGML_F32 && !ws[i]->panels)
            ws[n++] = ws[i];
    if (m->tok_embd.data && m->tok_embd.type == GGML_F32)
        ws[n++] = &m->tok_embd;
    total = (arena_offset(ws, n) + F32_ARENA_ALIGN - 1) / F32_ARENA_ALIGN * F32_ARENA_ALIGN;
    uint8_t *arena = !n || fault_now() ? MAP_FAILED
                                       : mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena != MAP_FAILED) {
        madvise(arena, total, MADV_HUGEPAGE);
        progress_begin(pg, "copying F32 weights", weight_bytes_of(ws, n));
        #pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            weight *w = ws[i];
            const size_t off = arena_offset(ws, i);
            memcpy(arena + off, w->data, (size_t)w->n_out * w->row_bytes);
            drop_file_pages(w);
            const void *old = w->data;
            w->data = arena + off;
            if (w == &m->tok_embd && m->output.data == old)
                m->output.data = w->data;           /* a tied LM head reads the same copy */
            progress_add(pg, (uint64_t)w->n_out * w->row_bytes);
        }
        mprotect(arena, total, PROT_READ);
        m->f32_arena = arena;
        m->f32_arena_bytes = total;
        m->n_f32_copied = n;
    }
}

static const char *supported_archs = "qwen35, qwen35moe, qwen3next, qwen3, llama, deepseek2 (dense), "
                                     "granitehybrid, nemotron_h, lfm2, falcon-h1, jamba, kimi-linear";

model *model_load(const char *path, const engine_params *p, char *err, size_t errlen)
{
    const bool huge_weights = p && p->huge_weights;
    progress pg = {.fn = p ? p->progress : NULL, .ctx = p ? p->progress_ctx : NULL};
    model *m = FAULT_OR(calloc(1, sizeof *m));
    loader ld = { .m = m, .path = path, .err = err, .errlen = errlen };
    if (!m) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    m->gguf = gguf_open(path, err, errlen);
    if (!m->gguf)
        goto out_fail;
    pg.read_phase = "reading the weights into huge pages";
    if (huge_weights && gguf_load_huge(m->gguf, file_read, &pg, m->huge_note, sizeof m->huge_note) != 0 &&
        !m->huge_note[0])
        snprintf(m->huge_note, sizeof m->huge_note, "%s: huge pages not used", path);   /* stays mapped */
    ld.g = m->gguf;
    char *arch = gguf_get_str_dup(m->gguf, "general.architecture");
    if (!arch && gguf_has_str(m->gguf, "general.architecture")) {
        ld_fail(&ld, "out of memory");
        goto out_fail;
    }
    if (!arch) {
        ld_fail(&ld, "missing metadata general.architecture (is this a model file?)");
        goto out_fail;
    }
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    m->embd_scale = m->residual_scale = m->logit_scale = 1.0f;
    m->use_rope = true;
    m->moe_norm_topk = true;
    m->moe_scale = 1.0f;
    m->mla_use_rope = true;
    bool known = false;
    enum arch a = ARCH_QWEN35;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(arch, archs[i].name)) {
            known = true;
            a = archs[i].a;
        }
    if (!known)
        ld_fail(&ld, "unknown architecture '%s' (supported: %s)", arch, supported_archs);
    free(arch);
    if (!known)
        goto out_fail;

    char *name = gguf_get_str_dup(m->gguf, "general.name");
    m->chat_template = gguf_get_str_dup(m->gguf, "tokenizer.chat_template");
    if ((!name && gguf_has_str(m->gguf, "general.name")) ||
        (!m->chat_template && gguf_has_str(m->gguf, "tokenizer.chat_template"))) {
        free(name);
        ld_fail(&ld, "out of memory");
        goto out_fail;
    }
    if (name) {
        snprintf(m->name, sizeof m->name, "%s", name);
        free(name);
    } else {
        const char *base = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    }

    if (arch_ssm_family(a)) {
        ssm_family_load(&ld, a);
    } else {
        load_hparams(&ld, a);
        if (!ld.failed && m->n_ctx_train <= 0)
            ld_fail(&ld, "metadata %s.context_length is 0: no request could ever fit", m->arch);
        if (!ld.failed)
            bind_tensors(&ld, a);
    }
    if (ld.failed)
        goto out_fail;
    pg.read_phase = "reading the weights from the file";
    if (p && p->prefault_weights)
        gguf_prefault(m->gguf, file_read, &pg);
    if (m->n_nextn > 0 && !m->gguf->data_copy && !(p && p->mtp))
        drop_mtp_pages(m);
    const bool pack = panels_wanted(), copy = !m->gguf->data_copy && f32_copy_wanted();
    /* room for the list of weights either takes (PROJ_MAX, and the
     * embedding); if even that is short, the weights stay as stored */
    weight **ws = pack || copy ? FAULT_OR(malloc(sizeof *ws * (PROJ_MAX(m) + 1))) : NULL;
    if (ws && pack)
        pack_panels(m, ws, &pg);
    if (ws && copy)
        copy_f32(m, ws, &pg);
    free(ws);
    return m;

out_fail:
    model_free(m);
    return NULL;
}

void model_free(model *m)
{
    if (!m)
        return;
    if (m->panel_arena)
        munmap(m->panel_arena, m->panel_arena_bytes);
    if (m->f32_arena)
        munmap(m->f32_arena, m->f32_arena_bytes);
    if (m->layers) {
        for (int il = 0; il <= m->n_layer; il++) {
            layer *L = il < m->n_layer ? &m->layers[il] : &m->mtp.blk;   /* the MTP block last (zero if none) */
            free(L->attn_norm);
            free(L->post_norm);
            free(L->q_norm);
            free(L->k_norm);
            free(L->conv1d_t);
            free(L->dt_bias);
            free(L->ssm_a);
            free(L->ssm_norm);
            free(L->conv_b);
            free(L->ssm_d);
            free(L->dt_norm);
            free(L->b_norm);
            free(L->c_norm);
            free(L->exp_probs_b);
            free(L->shexp_gate);
            free(L->q_a_norm);
            free(L->kv_a_norm);
        }
    }
    free(m->mtp.enorm);
    free(m->mtp.hnorm);
    free(m->mtp.head_norm);
    free(m->layers);
    free(m->kinds);
    free(m->output_norm);
    free(m->rope_inv_freq);
    free(m->mla_inv_freq);
    free(m->chat_template);
    gguf_close(m->gguf);
    free(m);
}

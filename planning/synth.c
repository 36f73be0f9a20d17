/* synth.c - write a seeded random qwen35 model.
 *
 * Weights are drawn per tensor from a PRNG seeded by (seed, tensor name),
 * so a tensor does not change when another one is added. Projections have
 * variance 1/fan_in, norms sit near 1, ssm_a = -exp(A_log) with A_log in
 * [0, ln 16], like the models it imitates.
 * ref: docs/models.md sections 2.2-2.4 and 6.
 */
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "tokenizer.h"

void synth_config_default(synth_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "qwen35");
    c->seed = 1;
    c->n_expert = 8;
    c->n_expert_used = 2;
    c->n_ff_exp = 32;
    c->n_ff_shexp = 32;
    c->mla_kv_lora = 32;
    c->mla_q_lora = 0;
    c->mla_nope = 16;
    c->mla_rope = 8;
    c->mla_v = 16;
    c->n_layer = 4;
    c->attn_every = 4;
    c->n_embd = 64;
    c->n_head = 4;
    c->n_head_kv = 2;
    c->head_dim = 16;
    c->n_rot = 8;
    c->dnet_n_k = 2;
    c->dnet_n_v = 2;
    c->dnet_d_k = 16;
    c->dnet_d_v = 16;
    c->conv_kernel = 4;
    c->m2_heads = 4;
    c->m2_head_dim = 16;
    c->m2_d_state = 16;
    c->m2_groups = 2;
    c->m1_dt_rank = 8;
    c->n_ff = 128;
    c->n_vocab = 256;
    c->n_ctx = 4096;
    c->tied = 1;
    c->dtype = GGML_F32;
    c->rope_theta = 10000.0f;
    snprintf(c->name, sizeof c->name, "hyserve-synth");
}

/* splitmix64 */
typedef struct { uint64_t s; } rng;
static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_uniform(rng *r)    /* [-1, 1) */
{
    return (float)((double)(rng_next(r) >> 11) * 0x1p-53 * 2.0 - 1.0);
}
static rng rng_for(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull ^ seed;     /* FNV-1a over the name */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    rng r = { h };
    rng_next(&r);
    return r;
}

typedef struct sw {
    gguf_writer *w;
    const synth_config *c;
    float *buf;
    void *qbuf;
    int failed;
    int attn_v_seen;            /* attn_v.weight tensors written so far (the mixes count them) */
} sw;

/* llama-quantize's layer choice for the tensors a *_K_M mix gives more bits */
static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool has_part(const char *name, const char *part)
{
    return strstr(name, part) != NULL;
}

static char kind_of(const synth_config *c, int il);
static bool moe_arch(const synth_config *c);

/* llama-quantize's n_attention_wv: the tensors named attn_v, attn_qkv or
 * attn_kv_b (one per attention or DeltaNet layer here; MLA layers have none) */
static int attn_v_count(const synth_config *c)
{
    int n = 0;
    for (int il = 0; il < c->n_layer; il++)
        n += kind_of(c, il) != 'M';
    return n;
}

uint32_t synth_tensor_type(const synth_config *c, const char *name, int attn_v_index)
{
    if (c->mix != SYNTH_MIX_K_M || (c->dtype != GGML_Q4_K && c->dtype != GGML_Q5_K))
        return c->dtype;
    const bool q4 = c->dtype == GGML_Q4_K;
    const bool eight_experts = moe_arch(c) && c->n_expert == 8;
    if (!strcmp(name, "output.weight") || (c->tied && !strcmp(name, "token_embd.weight")))
        return GGML_Q6_K;
    if (has_part(name, "attn_v.weight")) {
        if (eight_experts)
            return GGML_Q8_0;
        return use_more_bits(attn_v_index, attn_v_count(c)) ? GGML_Q6_K : c->dtype;
    }
    if (has_part(name, "attn_k.weight"))
        return eight_experts ? GGML_Q8_0 : c->dtype;
    if (has_part(name, "ffn_down")) {
        int il = -1;
        if (sscanf(name, "blk.%d.", &il) == 1 && il >= 0 && use_more_bits(il, c->n_layer))
            return GGML_Q6_K;
        return c->dtype;
    }
    if (has_part(name, "attn_output.weight"))
        return eight_experts && q4 ? GGML_Q5_K : c->dtype;
    if (has_part(name, "attn_qkv.weight"))
        return q4 ? GGML_Q5_K : GGML_Q6_K;
    return c->dtype;
}

/* The type a weight passed as the config's dtype is stored in: the mix's */
static uint32_t weight_type(sw *s, const char *name, uint32_t type)
{
    if (type != s->c->dtype || s->c->mix == SYNTH_MIX_NONE)
        return type;
    uint32_t t = synth_tensor_type(s->c, name, s->attn_v_seen);
    if (has_part(name, "attn_v.weight"))
        s->attn_v_seen++;
    return t;
}

enum fill { FILL_PROJ, FILL_NORM, FILL_EMBD, FILL_CONV, FILL_A, FILL_DT, FILL_ZERO, FILL_EYE };

/* Write a tensor of ne = {n0, n1} with values drawn per `how`. */
static void put(sw *s, const char *name, int n0, int n1, enum fill how, uint32_t type)
{
    if (s->failed)
        return;
    type = weight_type(s, name, type);
    if (n0 % (int)ggml_block_size(type))
        type = GGML_F16;            /* as llama-quantize falls back for rows that are not whole blocks */
    size_t n = (size_t)n0 * (size_t)n1;
    float *v = malloc(n * sizeof(float));
    void *q = malloc(n * 4 + 64);
    if (!v || !q) {
        free(v);
        free(q);
        s->failed = 1;
        return;
    }
    rng r = rng_for(s->c->seed, name);
    float scale = sqrtf(3.0f / (float)n0);  /* uniform with variance 1/fan_in */
    for (size_t i = 0; i < n; i++) {
        float u = rng_uniform(&r);
        switch (how) {
        case FILL_PROJ: v[i] = u * scale; break;
        case FILL_NORM: v[i] = 1.0f + 0.1f * u; break;
        case FILL_EMBD: v[i] = u * 1.7320508f; break;                   /* variance 1 */
        case FILL_CONV: v[i] = u * sqrtf(3.0f / (float)n0); break;
        case FILL_A: v[i] = -expf((u + 1.0f) * 0.5f * logf(16.0f)); break; /* -exp(A_log) */
        case FILL_DT: v[i] = -2.0f + u; break;
        case FILL_ZERO: v[i] = 0.0f; break;
        case FILL_EYE: v[i] = i % (size_t)n0 == i / (size_t)n0 ? 1.0f : 0.0f; break;  /* out r = in r */
        }
    }
    size_t row_bytes = (size_t)n0 / ggml_block_size(type) * ggml_type_size(type);
    for (int i = 0; i < n1; i++)
        quantize_row(type, v + (size_t)i * n0, (char *)q + (size_t)i * row_bytes, n0);
    uint64_t ne[2] = { (uint64_t)n0, (uint64_t)n1 };
    gguf_w_tensor(s->w, name, type, n1 == 1 ? 1 : 2, ne, q);
    free(v);
    free(q);
}

/* A 3-D tensor ne = {n0, n1, n2}: n2 slabs, uniform values of the given scale. */
static void put3s(sw *s, const char *name, int n0, int n1, int n2, uint32_t type, float scale)
{
    if (s->failed)
        return;
    type = weight_type(s, name, type);
    if (n0 % (int)ggml_block_size(type))
        type = GGML_F16;            /* as llama-quantize falls back for rows that are not whole blocks */
    size_t row_bytes = (size_t)n0 / ggml_block_size(type) * ggml_type_size(type);
    size_t slab = row_bytes * (size_t)n1;
    uint8_t *all = malloc(slab * (size_t)n2);
    float *v = malloc((size_t)n0 * sizeof(float));
    if (!all || !v) {
        free(all);
        free(v);
        s->failed = 1;
        return;
    }
    rng r = rng_for(s->c->seed, name);
    for (int e = 0; e < n2; e++)
        for (int i = 0; i < n1; i++) {
            for (int j = 0; j < n0; j++)
                v[j] = rng_uniform(&r) * scale;
            quantize_row(type, v, all + slab * (size_t)e + row_bytes * (size_t)i, n0);
        }
    uint64_t ne[3] = { (uint64_t)n0, (uint64_t)n1, (uint64_t)n2 };
    gguf_w_tensor(s->w, name, type, 3, ne, all);
    free(all);
    free(v);
}

/* Expert / per-head matrices drawn like projections (variance 1/fan_in = 1/n0). */
static void put3(sw *s, const char *name, int n0, int n1, int n2, uint32_t type)
{
    put3s(s, name, n0, n1, n2, type, sqrtf(3.0f / (float)n0));
}

static bool hybrid(const synth_config *c)
{
    return !strcmp(c->arch, "qwen35") || !strcmp(c->arch, "qwen35moe") || !strcmp(c->arch, "qwen3next");
}

/* the archs whose FFN is qwen3next's mixture of experts with a gated shared expert */
static bool moe_arch(const synth_config *c)
{
    return !strcmp(c->arch, "qwen3next") || !strcmp(c->arch, "qwen35moe");
}

/* the families written by ssm_write */
static bool ssm_arch(const synth_config *c)
{
    return !strcmp(c->arch, "granitehybrid") || !strcmp(c->arch, "nemotron_h") || !strcmp(c->arch, "lfm2") ||
           !strcmp(c->arch, "falcon-h1") || !strcmp(c->arch, "jamba") || !strcmp(c->arch, "kimi-linear") ||
           !strcmp(c->arch, "nemotron_h_moe") || !strcmp(c->arch, "lfm2moe");
}

/* nemotron_h and its MoE form; lfm2 and its */
static bool nemo_arch(const synth_config *c)
{
    return !strcmp(c->arch, "nemotron_h") || !strcmp(c->arch, "nemotron_h_moe");
}

static bool lfm_arch(const synth_config *c)
{
    return !strcmp(c->arch, "lfm2") || !strcmp(c->arch, "lfm2moe");
}

/* Layer kind letter: 'A' attention, 'L' DeltaNet, 'M' MLA, 'S' Mamba-2,
 * 'C' short conv, 'F' MLP only. */
static char kind_of(const synth_config *c, int il)
{
    size_t np = strlen(c->pattern);
    if (!strcmp(c->arch, "deepseek2"))
        return 'M';
    if (ssm_arch(c)) {
        if (np)
            return c->pattern[(size_t)il % np];
        if (nemo_arch(c))
            return "SFAF"[il % 4];          /* Nemotron-H's shape: Mamba-2 and attention layers, each then an MLP */
        if (!strcmp(c->arch, "falcon-h1"))
            return 'H';                     /* attention and Mamba-2 side by side in every layer */
        if (!strcmp(c->arch, "kimi-linear"))
            return (il + 1) % c->attn_every == 0 ? 'M' : 'K';   /* KDA, and MLA every attn_every-th */
        return (il + 1) % c->attn_every == 0 ? 'A' : lfm_arch(c) ? 'C' : !strcmp(c->arch, "jamba") ? 'B' : 'S';
    }
    if (!hybrid(c))
        return 'A';
    if (np)
        return c->pattern[(size_t)il % np];
    return (il + 1) % c->attn_every == 0 ? 'A' : 'L';
}

static bool has_kind(const synth_config *c, char k)
{
    for (int il = 0; il < c->n_layer; il++)
        if (kind_of(c, il) == k)
            return true;
    return false;
}

static bool has_mla(const synth_config *c)
{
    return has_kind(c, 'M');
}

/* A ChatML template in the Jinja form Qwen models ship (only its shape
 * matters to the server's template detection). */
static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* A few English merges so synthesized vocabularies exercise BPE. */
static const char *const merge_pairs[][2] = {
    { "t", "h" }, { "h", "e" }, { "i", "n" }, { "e", "r" }, { "a", "n" }, { "\xc4\xa0", "t" },
    { "r", "e" }, { "o", "n" }, { "\xc4\xa0", "a" }, { "e", "n" }, { "a", "t" }, { "o", "r" },
    { "\xc4\xa0t", "he" }, { "e", "s" }, { "\xc4\xa0", "s" }, { "i", "s" }, { "o", "u" },
    { "\xc4\xa0", "w" }, { "i", "t" }, { "a", "l" }, { "\xc4\xa0", "o" }, { "in", "g" },
};

static int write_vocab(sw *s)
{
    const synth_config *c = s->c;
    int n = c->n_vocab;
    char **tok = calloc((size_t)n, sizeof *tok);
    int32_t *type = calloc((size_t)n, sizeof *type);
    const char *merges[sizeof merge_pairs / sizeof merge_pairs[0]];
    char merge_buf[sizeof merge_pairs / sizeof merge_pairs[0]][32];
    int n_merges = 0, rc = -1;
    if (!tok || !type)
        goto out;
    for (int b = 0; b < 256 && b < n; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        char u[5] = { 0 };
        if (cp < 0x80) {
            u[0] = (char)cp;
        } else {
            u[0] = (char)(0xc0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3f));
        }
        tok[b] = strdup(u);
        type[b] = 1;
    }
    int id = 256;
    static const char *const specials[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
    if (n >= 259) {
        for (int i = 0; i < 3; i++, id++) {
            tok[id] = strdup(specials[i]);
            type[id] = 3;   /* CONTROL */
        }
    }
    for (size_t i = 0; i < sizeof merge_pairs / sizeof merge_pairs[0] && id < n; i++, id++) {
        snprintf(merge_buf[n_merges], sizeof merge_buf[0], "%s %s", merge_pairs[i][0], merge_pairs[i][1]);
        merges[n_merges] = merge_buf[n_merges];
        n_merges++;
        char joined[32];
        snprintf(joined, sizeof joined, "%s%s", merge_pairs[i][0], merge_pairs[i][1]);
        tok[id] = strdup(joined);
        type[id] = 1;
    }
    for (; id < n; id++) {
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%d]", id);
        tok[id] = strdup(pad);
        type[id] = 5;   /* UNUSED */
    }
    for (int i = 0; i < n; i++)
        if (!tok[i])
            goto out;
    gguf_w_str(s->w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(s->w, "tokenizer.ggml.pre", "qwen2");
    gguf_w_arr_str(s->w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n);
    gguf_w_arr(s->w, "tokenizer.ggml.token_type", GGUF_T_I32, type, (uint64_t)n);
    gguf_w_arr_str(s->w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges);
    if (n >= 259) {
        gguf_w_u32(s->w, "tokenizer.ggml.bos_token_id", 256);
        gguf_w_u32(s->w, "tokenizer.ggml.eos_token_id", c->chat_template ? 258 : 256);
        gguf_w_u32(s->w, "tokenizer.ggml.padding_token_id", 256);
    }
    gguf_w_bool(s->w, "tokenizer.ggml.add_bos_token", false);
    if (c->chat_template)
        gguf_w_str(s->w, "tokenizer.chat_template", chatml_template);
    rc = 0;
out:
    if (tok)
        for (int i = 0; i < n; i++)
            free(tok[i]);
    free(tok);
    free(type);
    return rc;
}

static int check_config(const synth_config *c, char *err, size_t errlen)
{
    const char *bad = NULL;
    size_t bs = ggml_block_size(c->dtype);
    if (c->n_layer < 1 || c->n_layer > 256) bad = "layers must be 1..256";
    else if (c->n_embd < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->head_dim < 2) bad = "sizes must be positive";
    else if (c->n_head % c->n_head_kv) bad = "heads must be a multiple of kv-heads";
    else if (c->n_rot < 0 || c->n_rot > c->head_dim || c->n_rot % 2) bad = "rope-dim must be even and at most head-dim";
    else if (c->dnet_n_k < 1 || c->dnet_n_v < 1 || c->dnet_n_v % c->dnet_n_k) bad = "dnet-v-heads must be a multiple of dnet-k-heads";
    else if (c->dnet_d_k < 1 || c->dnet_d_v < 1 || c->conv_kernel < 2 || c->conv_kernel > 16) bad = "DeltaNet dims must be positive and conv kernel 2..16";
    else if (c->n_ff < 1 || c->n_vocab < 256 || c->n_ctx < 1) bad = "ff must be positive and vocab at least 256";
    else if (c->attn_every < 1 && !c->pattern[0]) bad = "attn-every must be at least 1";
    else if (c->chat_template && c->n_vocab < 259) bad = "a chat template needs vocab >= 259 for its special tokens";
    else if (!quant_supported(c->dtype)) bad = "unsupported dtype";
    else if (c->mix != SYNTH_MIX_NONE && c->dtype != GGML_Q4_K && c->dtype != GGML_Q5_K)
        bad = "the _K_M mixes need dtype q4_k or q5_k";
    else if (bs > 1 && (c->n_embd % (int)bs || c->n_ff % (int)bs || (c->n_head * c->head_dim) % (int)bs ||
                        /* the DeltaNet and expert widths only where those layers are */
                        (hybrid(c) && (c->dnet_n_v * c->dnet_d_v) % (int)bs) ||
                        (ssm_arch(c) && (has_kind(c, 'S') || has_kind(c, 'H')) &&
                         (c->m2_heads * c->m2_head_dim) % (int)bs) ||
                        (moe_arch(c) && (c->n_ff_exp % (int)bs || c->n_ff_shexp % (int)bs))))
        bad = "quantized dtypes need embd, ff, expert ff and head widths that are multiples of the block size (32, or 256 for K-quants)";
    else if (strcmp(c->arch, "qwen35") && strcmp(c->arch, "qwen35moe") && strcmp(c->arch, "qwen3next") &&
             strcmp(c->arch, "qwen3") && strcmp(c->arch, "llama") && strcmp(c->arch, "deepseek2") && !ssm_arch(c))
        bad = "arch must be qwen35, qwen35moe, qwen3next, qwen3, llama, deepseek2, granitehybrid, nemotron_h, "
              "nemotron_h_moe, lfm2, lfm2moe, falcon-h1, jamba or kimi-linear";
    else if (moe_arch(c) &&
             (c->n_expert < 1 || c->n_expert_used < 1 || c->n_expert_used > c->n_expert ||
              c->n_ff_exp < 1 || c->n_ff_shexp < 1))
        bad = "experts, experts-used (<= experts), expert-ff and shared-ff must be positive";
    const char *letters = !strcmp(c->arch, "granitehybrid") ? "AS" : nemo_arch(c) ? "ASF"
                        : lfm_arch(c) ? "AC" : !strcmp(c->arch, "falcon-h1") ? "H"
                        : !strcmp(c->arch, "jamba") ? "AB" : !strcmp(c->arch, "kimi-linear") ? "KM" : "ALM";
    for (const char *p = c->pattern; !bad && *p; p++)
        if (!strchr(letters, *p))
            bad = ssm_arch(c) ? "pattern letters: granitehybrid A and S (Mamba-2), nemotron_h A, S and F (MLP only), "
                                "lfm2 A and C (short conv), falcon-h1 H (attention + Mamba-2), jamba A and B (Mamba-1), "
                                "kimi-linear K (KDA) and M (MLA)"
                              : "pattern may only hold 'A' (attention), 'L' (DeltaNet) and 'M' (MLA)";
    if (!bad && ssm_arch(c) &&
        (c->m2_heads < 1 || c->m2_head_dim < 1 || c->m2_d_state < 1 || c->m2_groups < 1 ||
         (c->m2_groups & (c->m2_groups - 1)) || c->m2_heads % c->m2_groups))
        bad = "Mamba-2 heads, head dim and state must be positive, groups a power of two dividing the heads";
    if (!bad && !strcmp(c->arch, "jamba") && c->m1_dt_rank < 1)
        bad = "the Mamba dt rank must be positive";
    if (!bad && (!strcmp(c->arch, "granitehybrid") || !strcmp(c->arch, "jamba")) && c->n_expert > 0 &&
        (c->n_expert_used < 1 || c->n_expert_used > c->n_expert))
        bad = "experts-used must be 1..experts";
    if (!bad && (!strcmp(c->arch, "nemotron_h_moe") || !strcmp(c->arch, "lfm2moe")) &&
        (c->n_expert < 1 || c->n_expert_used < 1 || c->n_expert_used > c->n_expert || c->n_ff_exp < 1 ||
         c->n_ff_shexp < 1 || c->moe_latent < 0 ||
         (bs > 1 && (c->n_ff_exp % (int)bs || c->n_ff_shexp % (int)bs || c->moe_latent % (int)bs))))
        bad = "nemotron_h_moe and lfm2moe need experts, experts-used 1..experts, a positive expert-ff and shared-ff "
              "(block multiples when quantized) and a latent >= 0";
    if (!bad && strchr(c->pattern, 'M') && strcmp(c->arch, "qwen35") && strcmp(c->arch, "qwen35moe") &&
        strcmp(c->arch, "kimi-linear"))
        bad = "MLA layers in a pattern need --arch qwen35 or qwen35moe (or use --arch deepseek2)";
    if (!bad && (c->mla_kv_lora < 1 || c->mla_nope < 1 || c->mla_rope < 2 || c->mla_rope % 2 ||
                 c->mla_v < 1 || c->mla_q_lora < 0))
        bad = "MLA dims must be positive and the MLA rope dim even";
    if (!bad && (c->n_mtp < 0 || c->n_mtp > 4 || c->mtp_own_head < 0 || c->mtp_own_head > 1))
        bad = "mtp blocks must be 0..4";
    else if (!bad && c->n_mtp > 0 && strcmp(c->arch, "qwen35") && strcmp(c->arch, "qwen35moe"))
        bad = "MTP blocks (--mtp) need --arch qwen35 or qwen35moe";
    else if (!bad && c->mtp_own_head && c->n_mtp == 0)
        bad = "--mtp-own-head needs --mtp N";
    else if (!bad && c->mtp_copy && (c->n_mtp == 0 || moe_arch(c)))
        bad = "--mtp-copy needs --mtp N and a dense FFN (--arch qwen35)";
    /* MLA's rows that are not whole blocks (k_b's nope, v_b's latent) fall back to F16 as llama-quantize's */
    if (bad) {
        snprintf(err, errlen, "synth: %s", bad);
        return -1;
    }
    return 0;
}

/* granitehybrid, nemotron_h and lfm2, as llama.cpp's converter writes them:
 * the layer kinds in attention.head_count_kv (0: not attention) and, for
 * nemotron_h, feed_forward_length per layer (> 0: an MLP-only layer). */
static int ssm_write(sw *s, const char *path, char *err, size_t errlen)
{
    const synth_config *c = s->c;
    gguf_writer *w = s->w;
    const uint32_t t = c->dtype;
    const bool granite = !strcmp(c->arch, "granitehybrid"), nemo = nemo_arch(c);
    const bool nemo_moe = !strcmp(c->arch, "nemotron_h_moe"), lfm_moe = !strcmp(c->arch, "lfm2moe");
    const bool kimi = !strcmp(c->arch, "kimi-linear");
    const bool lfm = lfm_arch(c);
    const bool moe_any = c->n_expert > 0 && (granite || !strcmp(c->arch, "jamba") || kimi || lfm_moe);
    const bool falcon = !strcmp(c->arch, "falcon-h1"), jamba = !strcmp(c->arch, "jamba");
    const int E = c->n_embd, HD = c->head_dim, NH = c->m2_heads, DI = NH * c->m2_head_dim, NG = c->m2_groups;
    const int DS = c->m2_d_state, CD = DI + 2 * NG * DS, K = c->conv_kernel;
    const int KW = c->n_head * HD;                     /* KDA: heads x head dim (head dim = --head-dim) */
    const int QK = c->mla_nope + c->mla_rope, R = c->mla_kv_lora;
    const int DI1 = c->m1_inner > 0 ? c->m1_inner : 2 * E, R1 = c->m1_dt_rank;   /* llama.cpp asserts 2 n_embd */
    char key[96], nm[96];
    int rc = -1;
    int32_t *kv = calloc((size_t)c->n_layer, sizeof *kv), *ff = calloc((size_t)c->n_layer, sizeof *ff);
    if (!kv || !ff) {
        snprintf(err, errlen, "synth: out of memory");
        goto out;
    }
    for (int il = 0; il < c->n_layer; il++) {
        kv[il] = kind_of(c, il) == 'A' || kind_of(c, il) == 'H' ? c->n_head_kv : kind_of(c, il) == 'M' ? 1 : 0;
        ff[il] = !nemo || kind_of(c, il) == 'F' ? c->n_ff : 0;
    }
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, c->arch), key)
    gguf_w_str(w, "general.architecture", c->arch);
    gguf_w_str(w, "general.name", c->name);
    gguf_w_u32(w, "general.file_type", t == GGML_F32 ? 0 : t == GGML_F16 ? 1 : t == GGML_BF16 ? 32 :
                                       t == GGML_Q8_0 ? 7 : t == GGML_Q4_0 ? 2 : t == GGML_Q4_K ? 15 :
                                       t == GGML_Q5_K ? 17 : 18);
    const int n_mtp = c->n_mtp;         /* 0 unless asked: the file is then as before, byte for byte */
    gguf_w_u32(w, K("block_count"), (uint32_t)(c->n_layer + n_mtp));
    if (n_mtp > 0)
        gguf_w_u32(w, K("nextn_predict_layers"), (uint32_t)n_mtp);
    gguf_w_u32(w, K("context_length"), (uint32_t)c->n_ctx);
    gguf_w_u32(w, K("embedding_length"), (uint32_t)E);
    if (nemo)
        gguf_w_arr(w, K("feed_forward_length"), GGUF_T_I32, ff, (uint64_t)c->n_layer);
    else
        gguf_w_u32(w, K("feed_forward_length"), (uint32_t)c->n_ff);
    gguf_w_u32(w, K("attention.head_count"), (uint32_t)c->n_head);
    gguf_w_arr(w, K("attention.head_count_kv"), GGUF_T_I32, kv, (uint64_t)c->n_layer);
    /* kimi-linear: the MLA layers' cached key, latent + rope (llama.cpp sizes its K cache by it) */
    gguf_w_u32(w, K("attention.key_length"), kimi ? (uint32_t)(R + c->mla_rope) : (uint32_t)HD);
    gguf_w_u32(w, K("attention.value_length"), kimi ? (uint32_t)R : (uint32_t)HD);
    gguf_w_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-5f);
    gguf_w_f32(w, K("rope.freq_base"), c->rope_theta);
    if (!kimi)
        gguf_w_u32(w, K("rope.dimension_count"), (uint32_t)c->n_rot);
    if (lfm) {
        gguf_w_u32(w, K("shortconv.l_cache"), (uint32_t)K);
        if (lfm_moe) {      /* LFM2-8B-A1B's router (llama.cpp's converter): sigmoid, a selection bias */
            gguf_w_u32(w, K("expert_count"), (uint32_t)c->n_expert);
            gguf_w_u32(w, K("expert_used_count"), (uint32_t)c->n_expert_used);
            gguf_w_u32(w, K("expert_feed_forward_length"), (uint32_t)c->n_ff_exp);
            gguf_w_u32(w, K("leading_dense_block_count"), 1);
            gguf_w_u32(w, K("expert_gating_func"), 2);
        }
    } else if (kimi) {
        gguf_w_u32(w, K("ssm.conv_kernel"), (uint32_t)K);
        gguf_w_u32(w, K("kda.head_dim"), (uint32_t)HD);
        gguf_w_u32(w, K("attention.kv_lora_rank"), (uint32_t)R);
        if (c->mla_q_lora)
            gguf_w_u32(w, K("attention.q_lora_rank"), (uint32_t)c->mla_q_lora);
        gguf_w_u32(w, K("attention.key_length_mla"), (uint32_t)QK);
        gguf_w_u32(w, K("attention.value_length_mla"), (uint32_t)c->mla_v);
        gguf_w_u32(w, K("rope.dimension_count"), (uint32_t)c->mla_rope);
        if (moe_any) {      /* Kimi-Linear-48B-A3B's router: sigmoid, bias, 2.446 scale, one shared, one dense lead */
            gguf_w_u32(w, K("expert_count"), (uint32_t)c->n_expert);
            gguf_w_u32(w, K("expert_used_count"), (uint32_t)c->n_expert_used);
            gguf_w_u32(w, K("expert_feed_forward_length"), (uint32_t)c->n_ff_exp);
            gguf_w_u32(w, K("expert_shared_count"), 1);
            gguf_w_u32(w, K("leading_dense_block_count"), 1);
            gguf_w_u32(w, K("expert_gating_func"), 2);
            gguf_w_f32(w, K("expert_weights_scale"), 2.446f);
        }
    } else if (jamba) {
        gguf_w_u32(w, K("ssm.conv_kernel"), (uint32_t)K);
        gguf_w_u32(w, K("ssm.inner_size"), (uint32_t)DI1);
        gguf_w_u32(w, K("ssm.state_size"), (uint32_t)DS);
        gguf_w_u32(w, K("ssm.time_step_rank"), (uint32_t)R1);
        if (moe_any) {
            gguf_w_u32(w, K("expert_count"), (uint32_t)c->n_expert);
            gguf_w_u32(w, K("expert_used_count"), (uint32_t)c->n_expert_used);
        }
    } else {
        gguf_w_u32(w, K("ssm.conv_kernel"), (uint32_t)K);
        gguf_w_u32(w, K("ssm.inner_size"), (uint32_t)DI);
        gguf_w_u32(w, K("ssm.state_size"), (uint32_t)DS);
        gguf_w_u32(w, K("ssm.time_step_rank"), (uint32_t)NH);
        gguf_w_u32(w, K("ssm.group_count"), (uint32_t)NG);
    }
    if (nemo_moe) {     /* Nemotron-3-Nano's router: sigmoid with a bias, normalised, scaled 2.5 */
        gguf_w_u32(w, K("expert_count"), (uint32_t)c->n_expert);
        gguf_w_u32(w, K("expert_used_count"), (uint32_t)c->n_expert_used);
        gguf_w_u32(w, K("expert_feed_forward_length"), (uint32_t)c->n_ff_exp);
        gguf_w_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)c->n_ff_shexp);
        gguf_w_bool(w, K("expert_weights_norm"), true);
        gguf_w_f32(w, K("expert_weights_scale"), 2.5f);
        if (c->moe_latent > 0)
            gguf_w_u32(w, K("moe_latent_size"), (uint32_t)c->moe_latent);
    }
    if (granite) {
        /* Granite 4.0-H's multipliers (its config.json) and NoPE attention */
        gguf_w_f32(w, K("embedding_scale"), 12.0f);
        gguf_w_f32(w, K("residual_scale"), 0.22f);
        gguf_w_f32(w, K("logit_scale"), 6.0f);
        gguf_w_f32(w, K("attention.scale"), 1.0f / (float)HD);
        gguf_w_bool(w, K("rope.scaling.finetuned"), false);
        if (moe_any) {
            gguf_w_u32(w, K("expert_count"), (uint32_t)c->n_expert);
            gguf_w_u32(w, K("expert_used_count"), (uint32_t)c->n_expert_used);
            gguf_w_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)c->n_ff_shexp);
        }
    }
#undef K
    if (write_vocab(s) != 0) {
        snprintf(err, errlen, "synth: out of memory building the vocabulary");
        goto out;
    }
    put(s, "token_embd.weight", E, c->n_vocab, FILL_EMBD, t);
    put(s, lfm ? "token_embd_norm.weight" : "output_norm.weight", E, 1, FILL_NORM, GGML_F32);
    if (!c->tied)
        put(s, "output.weight", E, c->n_vocab, FILL_PROJ, t);
    for (int il = 0; il < c->n_layer; il++) {
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
        const char k = kind_of(c, il);
        put(s, TN("attn_norm.weight"), E, 1, FILL_NORM, GGML_F32);
        if (k == 'A' || k == 'H') {
            put(s, TN("attn_q.weight"), E, c->n_head * HD, FILL_PROJ, t);
            put(s, TN("attn_k.weight"), E, c->n_head_kv * HD, FILL_PROJ, t);
            put(s, TN("attn_v.weight"), E, c->n_head_kv * HD, FILL_PROJ, t);
            put(s, TN("attn_output.weight"), c->n_head * HD, E, FILL_PROJ, t);
            if (lfm) {
                put(s, TN("attn_q_norm.weight"), HD, 1, FILL_NORM, GGML_F32);
                put(s, TN("attn_k_norm.weight"), HD, 1, FILL_NORM, GGML_F32);
            }
        }
        if (k == 'S' || k == 'H') {
            put(s, TN("ssm_in.weight"), E, DI + CD + NH, FILL_PROJ, t);
            put(s, TN("ssm_conv1d.weight"), K, CD, FILL_CONV, GGML_F32);
            put(s, TN("ssm_conv1d.bias"), CD, 1, FILL_DT, GGML_F32);
            put(s, TN("ssm_dt.bias"), NH, 1, FILL_DT, GGML_F32);
            put(s, TN("ssm_a"), 1, NH, FILL_A, GGML_F32);
            put(s, TN("ssm_d"), 1, NH, FILL_NORM, GGML_F32);
            if (!falcon)     /* Falcon-H1's configs have mamba_rms_norm false: no ssm_norm */
                put(s, TN("ssm_norm.weight"), DI / NG, NG, FILL_NORM, GGML_F32);
            put(s, TN("ssm_out.weight"), DI, E, FILL_PROJ, t);
        } else if (k == 'B') {
            put(s, TN("ssm_in.weight"), E, 2 * DI1, FILL_PROJ, t);
            put(s, TN("ssm_conv1d.weight"), K, DI1, FILL_CONV, GGML_F32);
            put(s, TN("ssm_conv1d.bias"), DI1, 1, FILL_DT, GGML_F32);
            put(s, TN("ssm_x.weight"), DI1, R1 + 2 * DS, FILL_PROJ, t);
            put(s, TN("ssm_dt_norm.weight"), R1, 1, FILL_NORM, GGML_F32);
            put(s, TN("ssm_dt.weight"), R1, DI1, FILL_PROJ, t);
            put(s, TN("ssm_dt.bias"), DI1, 1, FILL_DT, GGML_F32);
            put(s, TN("ssm_b_norm.weight"), DS, 1, FILL_NORM, GGML_F32);
            put(s, TN("ssm_c_norm.weight"), DS, 1, FILL_NORM, GGML_F32);
            put(s, TN("ssm_a"), DS, DI1, FILL_A, GGML_F32);
            put(s, TN("ssm_d"), DI1, 1, FILL_NORM, GGML_F32);
            put(s, TN("ssm_out.weight"), DI1, E, FILL_PROJ, t);
        } else if (k == 'K') {
            put(s, TN("attn_q.weight"), E, KW, FILL_PROJ, t);
            put(s, TN("attn_k.weight"), E, KW, FILL_PROJ, t);
            put(s, TN("attn_v.weight"), E, KW, FILL_PROJ, t);
            /* the convs as llama.cpp's converter writes them: {K, 1, channels} */
            put3s(s, TN("ssm_conv1d_q.weight"), K, 1, KW, GGML_F32, sqrtf(3.0f / (float)K));
            put3s(s, TN("ssm_conv1d_k.weight"), K, 1, KW, GGML_F32, sqrtf(3.0f / (float)K));
            put3s(s, TN("ssm_conv1d_v.weight"), K, 1, KW, GGML_F32, sqrtf(3.0f / (float)K));
            put(s, TN("ssm_f_a.weight"), E, HD, FILL_PROJ, t);
            put(s, TN("ssm_f_b.weight"), HD, KW, FILL_PROJ, t);
            put(s, TN("ssm_beta.weight"), E, c->n_head, FILL_PROJ, t);
            put(s, TN("ssm_a"), 1, c->n_head, FILL_A, GGML_F32);
            put(s, TN("ssm_dt.bias"), KW, 1, FILL_DT, GGML_F32);
            put(s, TN("ssm_g_a.weight"), E, HD, FILL_PROJ, t);
            put(s, TN("ssm_g_b.weight"), HD, KW, FILL_PROJ, t);
            put(s, TN("ssm_norm.weight"), HD, 1, FILL_NORM, GGML_F32);
            put(s, TN("attn_output.weight"), KW, E, FILL_PROJ, t);
        } else if (k == 'M') {
            if (c->mla_q_lora) {
                put(s, TN("attn_q_a.weight"), E, c->mla_q_lora, FILL_PROJ, t);
                put(s, TN("attn_q_a_norm.weight"), c->mla_q_lora, 1, FILL_NORM, GGML_F32);
                put(s, TN("attn_q_b.weight"), c->mla_q_lora, c->n_head * QK, FILL_PROJ, t);
            } else {
                put(s, TN("attn_q.weight"), E, c->n_head * QK, FILL_PROJ, t);
            }
            put(s, TN("attn_kv_a_mqa.weight"), E, R + c->mla_rope, FILL_PROJ, t);
            put(s, TN("attn_kv_a_norm.weight"), R, 1, FILL_NORM, GGML_F32);
            put3s(s, TN("attn_k_b.weight"), c->mla_nope, R, c->n_head, t, sqrtf(3.0f / (float)R));
            put3(s, TN("attn_v_b.weight"), R, c->mla_v, c->n_head, t);
            put(s, TN("attn_output.weight"), c->n_head * c->mla_v, E, FILL_PROJ, t);
        } else if (k == 'C') {
            put(s, TN("shortconv.in_proj.weight"), E, 3 * E, FILL_PROJ, t);
            put(s, TN("shortconv.conv.weight"), K, E, FILL_CONV, GGML_F32);
            put(s, TN("shortconv.out_proj.weight"), E, E, FILL_PROJ, t);
        }
        if (nemo_moe) {
            if (k == 'F') {     /* ReLU^2 experts (up, down) on the latent, a ReLU^2 shared expert */
                const int XE = c->moe_latent > 0 ? c->moe_latent : E;
                put(s, TN("ffn_gate_inp.weight"), E, c->n_expert, FILL_PROJ, GGML_F32);
                put(s, TN("exp_probs_b.bias"), c->n_expert, 1, FILL_DT, GGML_F32);
                if (c->moe_latent > 0) {
                    put(s, TN("ffn_latent_down.weight"), E, XE, FILL_PROJ, t);
                    put(s, TN("ffn_latent_up.weight"), XE, E, FILL_PROJ, t);
                }
                put3(s, TN("ffn_up_exps.weight"), XE, c->n_ff_exp, c->n_expert, t);
                put3(s, TN("ffn_down_exps.weight"), c->n_ff_exp, XE, c->n_expert, t);
                put(s, TN("ffn_up_shexp.weight"), E, c->n_ff_shexp, FILL_PROJ, t);
                put(s, TN("ffn_down_shexp.weight"), c->n_ff_shexp, E, FILL_PROJ, t);
            }
            continue;
        }
        if (nemo) {
            if (k == 'F') {
                put(s, TN("ffn_up.weight"), E, c->n_ff, FILL_PROJ, t);
                put(s, TN("ffn_down.weight"), c->n_ff, E, FILL_PROJ, t);
            }
            continue;
        }
        /* falcon-h1's converter maps pre_ff_layernorm.weight to blk.N.ffn_norm, no suffix */
        put(s, falcon ? TN("ffn_norm") : TN("ffn_norm.weight"), E, 1, FILL_NORM, GGML_F32);
        /* Granite: experts in every layer; Jamba: in every other layer (odd
         * ones); Kimi Linear: after one dense layer, with a shared expert */
        const bool moe = moe_any && (granite || (kimi || lfm_moe ? il >= 1 : il % 2 == 1));
        const int EF = kimi || lfm_moe ? c->n_ff_exp : c->n_ff;
        if (moe) {
            put(s, TN("ffn_gate_inp.weight"), E, c->n_expert, FILL_PROJ, GGML_F32);
            put3(s, TN("ffn_gate_exps.weight"), E, EF, c->n_expert, t);
            put3(s, TN("ffn_up_exps.weight"), E, EF, c->n_expert, t);
            put3(s, TN("ffn_down_exps.weight"), EF, E, c->n_expert, t);
            if (lfm_moe)
                put(s, TN("exp_probs_b.bias"), c->n_expert, 1, FILL_DT, GGML_F32);
            if (kimi) {
                put(s, TN("ffn_gate_shexp.weight"), E, EF, FILL_PROJ, t);
                put(s, TN("ffn_up_shexp.weight"), E, EF, FILL_PROJ, t);
                put(s, TN("ffn_down_shexp.weight"), EF, E, FILL_PROJ, t);
                put(s, TN("exp_probs_b.bias"), c->n_expert, 1, FILL_DT, GGML_F32);
            }
            if (granite && c->n_ff_shexp > 0) {
                put(s, TN("ffn_gate_shexp.weight"), E, c->n_ff_shexp, FILL_PROJ, t);
                put(s, TN("ffn_up_shexp.weight"), E, c->n_ff_shexp, FILL_PROJ, t);
                put(s, TN("ffn_down_shexp.weight"), c->n_ff_shexp, E, FILL_PROJ, t);
            }
        } else {
            put(s, TN("ffn_gate.weight"), E, c->n_ff, FILL_PROJ, t);
            put(s, TN("ffn_up.weight"), E, c->n_ff, FILL_PROJ, t);
            put(s, TN("ffn_down.weight"), c->n_ff, E, FILL_PROJ, t);
        }
#undef TN
    }
    if (s->failed) {
        snprintf(err, errlen, "synth: out of memory drawing weights");
        goto out;
    }
    rc = gguf_writer_write(w, path, err, errlen);
out:
    free(kv);
    free(ff);
    return rc;
}

int synth_write(const synth_config *c, const char *path, char *err, size_t errlen)
{
    if (check_config(c, err, errlen) != 0)
        return -1;
    sw s = { .w = gguf_writer_new(), .c = c };
    if (!s.w) {
        snprintf(err, errlen, "synth: out of memory");
        return -1;
    }
    if (ssm_arch(c)) {
        int r = ssm_write(&s, path, err, errlen);
        gguf_writer_free(s.w);
        return r;
    }
    gguf_writer *w = s.w;
    const int E = c->n_embd, HD = c->head_dim, NV = c->dnet_n_v, DV = c->dnet_d_v;
    const int conv_dim = 2 * c->dnet_n_k * c->dnet_d_k + NV * DV;
    const uint32_t t = c->dtype;
    int rc = -1;

    char key[96];
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, c->arch), key)
    const bool hyb = hybrid(c), next = !strcmp(c->arch, "qwen3next"), moe = moe_arch(c);
    const bool ds2 = !strcmp(c->arch, "deepseek2"), mla = has_mla(c);
    const int QK = c->mla_nope + c->mla_rope, R = c->mla_kv_lora;
    const bool gated = hyb, qk_norm = strcmp(c->arch, "llama") != 0;
    gguf_w_str(w, "general.architecture", c->arch);
    gguf_w_str(w, "general.name", c->name);
    gguf_w_u32(w, "general.file_type", t == GGML_F32 ? 0 : t == GGML_F16 ? 1 : t == GGML_BF16 ? 32 :
                                       t == GGML_Q8_0 ? 7 : t == GGML_Q4_0 ? 2 : t == GGML_Q4_K ? 15 :
                                       t == GGML_Q5_K ? 17 : 18);   /* Q4_K_M 15, Q5_K_M 17 */
    const int n_mtp = c->n_mtp;         /* 0 unless asked: the file is then as before, byte for byte */
    gguf_w_u32(w, K("block_count"), (uint32_t)(c->n_layer + n_mtp));
    if (n_mtp > 0)
        gguf_w_u32(w, K("nextn_predict_layers"), (uint32_t)n_mtp);
    gguf_w_u32(w, K("context_length"), (uint32_t)c->n_ctx);
    gguf_w_u32(w, K("embedding_length"), (uint32_t)E);
    gguf_w_u32(w, K("feed_forward_length"), (uint32_t)c->n_ff);
    gguf_w_u32(w, K("attention.head_count"), (uint32_t)c->n_head);
    gguf_w_u32(w, K("attention.head_count_kv"), ds2 ? 1u : (uint32_t)c->n_head_kv);
    gguf_w_u32(w, K("attention.key_length"), ds2 ? (uint32_t)(R + c->mla_rope) : (uint32_t)HD);
    gguf_w_u32(w, K("attention.value_length"), ds2 ? (uint32_t)R : (uint32_t)HD);
    gguf_w_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-6f);
    gguf_w_f32(w, K("rope.freq_base"), c->rope_theta);
    gguf_w_u32(w, K("rope.dimension_count"), ds2 ? (uint32_t)c->mla_rope : (uint32_t)c->n_rot);
    if (mla) {
        gguf_w_u32(w, K("attention.kv_lora_rank"), (uint32_t)R);
        if (c->mla_q_lora)
            gguf_w_u32(w, K("attention.q_lora_rank"), (uint32_t)c->mla_q_lora);
        gguf_w_u32(w, K("attention.key_length_mla"), (uint32_t)QK);
        gguf_w_u32(w, K("attention.value_length_mla"), (uint32_t)c->mla_v);
        if (!ds2)
            gguf_w_u32(w, K("rope.dimension_count_mla"), (uint32_t)c->mla_rope);
    }
    if (ds2)
        gguf_w_u32(w, K("leading_dense_block_count"), (uint32_t)c->n_layer);
    if (!strcmp(c->arch, "qwen35") || !strcmp(c->arch, "qwen35moe")) {
        /* MRoPE sections in rotary pairs, summing to n_rot / 2 (llama.cpp asserts
         * they fit the head), proportioned like Qwen3.5's [11, 11, 10, 0] of 32 */
        const int half = c->n_rot / 2, sa = (half + 2) / 3, sb = (half - sa + 1) / 2;
        int32_t sections[4] = { sa, sb, half - sa - sb, 0 };
        gguf_w_arr(w, K("rope.dimension_sections"), GGUF_T_I32, sections, 4);
    }
    if (hyb) {
        gguf_w_u32(w, K("ssm.conv_kernel"), (uint32_t)c->conv_kernel);
        gguf_w_u32(w, K("ssm.state_size"), (uint32_t)c->dnet_d_k);
        gguf_w_u32(w, K("ssm.group_count"), (uint32_t)c->dnet_n_k);
        gguf_w_u32(w, K("ssm.time_step_rank"), (uint32_t)NV);
        gguf_w_u32(w, K("ssm.inner_size"), (uint32_t)(NV * DV));
        if (c->pattern[0]) {
            /* one entry per block, the MTP blocks' too (attention: 0) */
            const int n_blk = c->n_layer + n_mtp;
            uint8_t *rec = malloc((size_t)n_blk);
            if (!rec)
                goto out;
            for (int il = 0; il < n_blk; il++) {
                char k = il < c->n_layer ? kind_of(c, il) : 'A';
                rec[il] = mla ? (uint8_t)(k == 'A' ? 0 : k == 'L' ? 1 : 2) : (uint8_t)(k == 'L');
            }
            if (mla)    /* our extension key: llama.cpp has no hybrid with MLA and DeltaNet */
                gguf_w_arr(w, "hyserve.layer_kinds", GGUF_T_U8, rec, (uint64_t)n_blk);
            else
                gguf_w_arr(w, K("attention.recurrent_layers"), GGUF_T_BOOL, rec, (uint64_t)n_blk);
            free(rec);
        } else {
            gguf_w_u32(w, K("full_attention_interval"), (uint32_t)c->attn_every);
        }
    }
    if (moe) {
        gguf_w_u32(w, K("expert_count"), (uint32_t)c->n_expert);
        gguf_w_u32(w, K("expert_used_count"), (uint32_t)c->n_expert_used);
        gguf_w_u32(w, K("expert_feed_forward_length"), (uint32_t)c->n_ff_exp);
        gguf_w_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)c->n_ff_shexp);
    }
#undef K
    if (write_vocab(&s) != 0) {
        snprintf(err, errlen, "synth: out of memory building the vocabulary");
        goto out;
    }

    put(&s, "token_embd.weight", E, c->n_vocab, FILL_EMBD, t);
    put(&s, "output_norm.weight", E, 1, FILL_NORM, GGML_F32);
    if (!c->tied)
        put(&s, "output.weight", E, c->n_vocab, FILL_PROJ, t);
    char nm[96];
    /* the trunk's blocks, then the MTP blocks: each a full-attention block
     * with the arch's FFN, plus its nextn.* tensors (docs/models.md, MTP) */
    for (int il = 0; il < c->n_layer + n_mtp; il++) {
#define TN(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, il), nm)
        const char kind = il < c->n_layer ? kind_of(c, il) : 'A';
        /* --mtp-copy: the MTP block passes enorm(E[t]) through (eh_proj [I | 0], its attention and FFN
         * outputs zero), so its head scores t itself highest: it drafts a repeat of the last token */
        const bool copy = il >= c->n_layer && c->mtp_copy;
        put(&s, TN("attn_norm.weight"), E, 1, FILL_NORM, GGML_F32);
        put(&s, hyb ? TN("post_attention_norm.weight") : TN("ffn_norm.weight"), E, 1, FILL_NORM, GGML_F32);
        if (kind == 'M') {
            if (c->mla_q_lora) {
                put(&s, TN("attn_q_a.weight"), E, c->mla_q_lora, FILL_PROJ, t);
                put(&s, TN("attn_q_a_norm.weight"), c->mla_q_lora, 1, FILL_NORM, GGML_F32);
                put(&s, TN("attn_q_b.weight"), c->mla_q_lora, c->n_head * QK, FILL_PROJ, t);
            } else {
                put(&s, TN("attn_q.weight"), E, c->n_head * QK, FILL_PROJ, t);
            }
            put(&s, TN("attn_kv_a_mqa.weight"), E, R + c->mla_rope, FILL_PROJ, t);
            put(&s, TN("attn_kv_a_norm.weight"), R, 1, FILL_NORM, GGML_F32);
            /* k_nope = W_kb c has fan-in R; the file holds W_kb^T: {nope, R, heads} */
            put3s(&s, TN("attn_k_b.weight"), c->mla_nope, R, c->n_head, t, sqrtf(3.0f / (float)R));
            put3(&s, TN("attn_v_b.weight"), R, c->mla_v, c->n_head, t);
            put(&s, TN("attn_output.weight"), c->n_head * c->mla_v, E, FILL_PROJ, t);
        } else if (kind == 'A') {
            put(&s, TN("attn_q.weight"), E, c->n_head * (gated ? 2 : 1) * HD, FILL_PROJ, t);
            put(&s, TN("attn_k.weight"), E, c->n_head_kv * HD, FILL_PROJ, t);
            put(&s, TN("attn_v.weight"), E, c->n_head_kv * HD, FILL_PROJ, t);
            put(&s, TN("attn_output.weight"), c->n_head * HD, E, copy ? FILL_ZERO : FILL_PROJ, t);
            if (qk_norm) {
                put(&s, TN("attn_q_norm.weight"), HD, 1, FILL_NORM, GGML_F32);
                put(&s, TN("attn_k_norm.weight"), HD, 1, FILL_NORM, GGML_F32);
            }
        } else {
            put(&s, TN("attn_qkv.weight"), E, conv_dim, FILL_PROJ, t);
            put(&s, TN("attn_gate.weight"), E, NV * DV, FILL_PROJ, t);
            if (next) {
                put(&s, TN("ssm_ba.weight"), E, 2 * NV, FILL_PROJ, t);
            } else {
                put(&s, TN("ssm_beta.weight"), E, NV, FILL_PROJ, t);
                put(&s, TN("ssm_alpha.weight"), E, NV, FILL_PROJ, t);
            }
            put(&s, TN("ssm_conv1d.weight"), c->conv_kernel, conv_dim, FILL_CONV, GGML_F32);
            put(&s, TN("ssm_dt.bias"), NV, 1, FILL_DT, GGML_F32);
            put(&s, TN("ssm_a"), NV, 1, FILL_A, GGML_F32);
            put(&s, TN("ssm_norm.weight"), DV, 1, FILL_NORM, GGML_F32);
            put(&s, TN("ssm_out.weight"), NV * DV, E, FILL_PROJ, t);
        }
        if (moe) {
            put(&s, TN("ffn_gate_inp.weight"), E, c->n_expert, FILL_PROJ, GGML_F32);
            put3(&s, TN("ffn_gate_exps.weight"), E, c->n_ff_exp, c->n_expert, t);
            put3(&s, TN("ffn_up_exps.weight"), E, c->n_ff_exp, c->n_expert, t);
            put3(&s, TN("ffn_down_exps.weight"), c->n_ff_exp, E, c->n_expert, t);
            put(&s, TN("ffn_gate_inp_shexp.weight"), E, 1, FILL_PROJ, GGML_F32);
            put(&s, TN("ffn_gate_shexp.weight"), E, c->n_ff_shexp, FILL_PROJ, t);
            put(&s, TN("ffn_up_shexp.weight"), E, c->n_ff_shexp, FILL_PROJ, t);
            put(&s, TN("ffn_down_shexp.weight"), c->n_ff_shexp, E, FILL_PROJ, t);
        } else {
            put(&s, TN("ffn_gate.weight"), E, c->n_ff, FILL_PROJ, t);
            put(&s, TN("ffn_up.weight"), E, c->n_ff, FILL_PROJ, t);
            put(&s, TN("ffn_down.weight"), c->n_ff, E, copy ? FILL_ZERO : FILL_PROJ, t);
        }
        if (il >= c->n_layer) {     /* eh_proj: [enorm(e) | hnorm(h)] (2 E) -> E */
            put(&s, TN("nextn.eh_proj.weight"), 2 * E, E, copy ? FILL_EYE : FILL_PROJ, t);
            put(&s, TN("nextn.enorm.weight"), E, 1, FILL_NORM, GGML_F32);
            put(&s, TN("nextn.hnorm.weight"), E, 1, FILL_NORM, GGML_F32);
            put(&s, TN("nextn.shared_head_norm.weight"), E, 1, FILL_NORM, GGML_F32);
            if (c->mtp_own_head) {
                put(&s, TN("nextn.embed_tokens.weight"), E, c->n_vocab, FILL_EMBD, t);
                put(&s, TN("nextn.shared_head_head.weight"), E, c->n_vocab, FILL_PROJ, t);
            }
        }
#undef TN
    }
    if (s.failed) {
        snprintf(err, errlen, "synth: out of memory drawing weights");
        goto out;
    }
    rc = gguf_writer_write(w, path, err, errlen);
out:
    gguf_writer_free(w);
    return rc;
}

/* memplan.h - cache memory arithmetic for any layout, with or without weights.
 *
 * Owns: the byte counts of every cache kind (GQA/MHA/MQA KV, MLA latents,
 * Gated DeltaNet recurrent + conv state, Mamba-1 state, KDA state), the
 * counterfactuals (plain MHA on every layer; every layer attention), and the
 * planner questions (largest batch for a context, largest context for a
 * batch, within a budget). The live cache (cache.c) sizes itself with these
 * same functions, so /stats, admission and the planner can never disagree.
 * ref: docs/models.md section 8; docs/serving.md section 6.
 */
#ifndef HYSERVE_MEMPLAN_H
#define HYSERVE_MEMPLAN_H

#include <stdint.h>

typedef struct memplan_layout {
    char name[128];
    int n_layers;
    /* softmax attention with a KV cache: MHA (kv = heads), GQA, MQA (kv = 1) */
    int attn_layers, attn_heads, attn_kv_heads, attn_head_dim;
    /* multi-head latent attention: caches kv_lora + rope numbers per token */
    int mla_layers, mla_heads, mla_kv_lora, mla_rope, mla_nope, mla_v;
    /* Gated DeltaNet: n_v * d_k * d_v state + (K-1) * (2 n_k d_k + n_v d_v) conv */
    int dnet_layers, dnet_k_heads, dnet_v_heads, dnet_d_k, dnet_d_v, dnet_conv;
    /* Mamba-1: d_state * d_inner state + (K-1) * d_inner conv */
    int mamba_layers, mamba_d_inner, mamba_d_state, mamba_conv;
    /* Kimi Delta Attention: heads * hd^2 state + 3 (q,k,v) * (K-1) * heads * hd conv */
    int kda_layers, kda_heads, kda_head_dim, kda_conv;
    /* Mamba-2 (SSD): heads * head_dim * d_state state + (K-1) * (heads * head_dim
     * + 2 * groups * d_state) conv (the conv runs over x, B and C) */
    int mamba2_layers, mamba2_heads, mamba2_head_dim, mamba2_d_state, mamba2_groups, mamba2_conv;
    /* gated short convolution (LFM2): no state, (K-1) * channels conv */
    int sconv_layers, sconv_channels, sconv_conv;
    /* layers without a mixer (Nemotron-H's MLP-only layers): no cache, and
     * not in n_layers (the counterfactuals count mixer layers) */
    int mlp_layers;
    int kv_bytes;               /* bytes per cached attention number (4 f32, 2 f16/bf16) */
    char kv_dtype[8];           /* its name: "f32", "f16" or "bf16" (memplan_set_kv_dtype) */
    int state_bytes;            /* bytes per recurrent-state number (4: f32, 2: bf16) */
    int conv_bytes;             /* bytes per conv-window number (DeltaNet, Mamba, KDA); 0: state_bytes */
    int page_tokens;            /* KV page size in tokens */
    int max_context;            /* the model's trained context, 0 if unknown */
} memplan_layout;

typedef struct memplan_costs {
    uint64_t gqa_numbers_per_token_layer;   /* 2 * kv_heads * head_dim */
    uint64_t mla_numbers_per_token_layer;   /* kv_lora + rope */
    uint64_t attn_kv_bytes_per_token;       /* all GQA layers */
    uint64_t mla_bytes_per_token;           /* all MLA layers */
    uint64_t cache_bytes_per_token;         /* both */
    uint64_t dnet_state_bytes_per_seq, dnet_conv_bytes_per_seq;
    uint64_t mamba_bytes_per_seq, kda_bytes_per_seq;      /* state + conv of each */
    uint64_t mamba_state_bytes_per_seq, kda_state_bytes_per_seq;
    uint64_t mamba2_state_bytes_per_seq, mamba2_conv_bytes_per_seq;
    uint64_t sconv_bytes_per_seq;           /* conv windows only: the kind has no state */
    uint64_t rec_state_bytes_per_seq;       /* the recurrent states of every kind (state_bytes numbers) */
    uint64_t rec_conv_bytes_per_seq;        /* the conv windows of every kind (conv_bytes numbers) */
    uint64_t state_bytes_per_seq;           /* every recurrent kind, states and conv windows */
    uint64_t page_bytes;                    /* page_tokens * cache_bytes_per_token */
    /* counterfactuals per token, same number format as the cache */
    uint64_t mha_bytes_per_token;           /* every layer plain MHA with the model's query heads */
    uint64_t all_attention_bytes_per_token; /* every layer one of the model's own attention layers */
    uint64_t gqa_all_layers_bytes_per_token; /* every layer one of its GQA layers (0 without any) */
    uint64_t mla_all_layers_bytes_per_token; /* every layer one of its MLA layers (0 without any) */
} memplan_costs;

void memplan_costs_of(const memplan_layout *l, memplan_costs *c);
/* a * b and a + b, stuck at UINT64_MAX where they would wrap: every byte
 * count here is one of these, so a layout too large for 64 bits reads as
 * UINT64_MAX, never as a small number. */
uint64_t memplan_mul(uint64_t a, uint64_t b);
uint64_t memplan_add(uint64_t a, uint64_t b);
/* Recurrent-state numbers of `bytes` each (4: f32, 2: bf16); conv windows
 * keep what they had (f32 unless set). */
void memplan_set_state_dtype(memplan_layout *l, int bytes);
/* The one rule naming softmax attention by its KV heads, everywhere
 * (/stats, the planner, hyserve mem): "mha" when every query head has its
 * own KV head, "mqa" when one KV head serves several query heads, else
 * "gqa". */
const char *memplan_attn_kind(int heads, int kv_heads);
/* Bytes one sequence of n_tokens holds: its state plus whole pages. */
uint64_t memplan_seq_reserved_bytes(const memplan_layout *l, int64_t n_tokens);
/* Bytes its filled token slots and state use (no page rounding). */
uint64_t memplan_seq_used_bytes(const memplan_layout *l, int64_t n_tokens);
/* Largest batch of n_tokens-long sequences within budget (may be 0). */
int64_t memplan_max_batch(const memplan_layout *l, uint64_t budget, int64_t n_tokens);
/* Largest per-sequence context (page multiple) for batch sequences within
 * budget; 0 if not even their states fit; capped at 1 << 30. */
int64_t memplan_max_context(const memplan_layout *l, uint64_t budget, int64_t batch);

#endif

/* model.h - hyperparameters, per-layer kind and weight binding.
 *
 * Owns: reading an architecture's metadata keys and binding its tensors
 * (shape-checked) to struct fields. Does not own: the math (forward.c,
 * attention.c, deltanet.c, mla.c) or caches (cache.c).
 * ref: docs/models.md sections 1.2-2.4.
 */
#ifndef HYSERVE_MODEL_H
#define HYSERVE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "gguf.h"
#include "kernels/weight.h"

typedef struct layer {
    uint8_t kind;               /* enum engine_layer_kind */
    int kind_idx;               /* index among layers of the same kind */
    /* a recurrent layer's part of its sequence's slot (cache.h): its state
     * starts rec_state numbers (of the state type) into the slot's states,
     * its conv window rec_conv floats into the slot's conv windows */
    size_t rec_state, rec_conv;
    float *attn_norm;           /* [n_embd] input RMSNorm (GGUF: final multiplier) */
    float *post_norm;           /* [n_embd] post_attention_norm */

    /* gated attention */
    weight wq;                  /* n_embd -> n_head * 2 * head_dim, per head [q | gate] */
    weight wk, wv;              /* n_embd -> n_head_kv * head_dim */
    weight wo;                  /* n_head * head_dim -> n_embd */
    float *q_norm, *k_norm;     /* [head_dim] */

    /* Gated DeltaNet */
    weight wqkv;                /* n_embd -> conv_dim = 2*n_k*d_k + n_v*d_v */
    weight wz;                  /* n_embd -> n_v*d_v (attn_gate) */
    weight wb, wa;              /* n_embd -> n_v (ssm_beta, ssm_alpha) */
    float *conv1d_t;            /* [K][conv_dim]: the file's taps transposed at load */
    float *dt_bias;             /* [n_v] */
    float *ssm_a;               /* [n_v] = -exp(A_log) */
    float *ssm_norm;            /* [d_v] gated RMSNorm weight, shared by heads */
    weight wout;                /* n_v*d_v -> n_embd (ssm_out) */

    /* Mamba-2: ssm_in (below) projects to [z | x | B | C | dt]; conv1d_t
     * over [x | B | C]; dt_bias, ssm_a (= -exp(A_log)) per head; ssm_norm
     * [d_inner] grouped; wout */
    float *conv_b;              /* [conv channels] conv bias (Mamba-2) */
    float *ssm_d;               /* [n_head] the D skip (Mamba-2); [d_inner] (Mamba-1) */

    /* Mamba-1 (Jamba): ssm_in projects to [x | z]; conv1d_t, conv_b over x;
     * ssm_x (x_proj) x -> [dt (dt_rank) | B | C (d_state each)], each part
     * RMS-normed by its weight; ssm_dt (dt_proj) dt_rank -> d_inner with
     * dt_bias; ssm_a [d_inner][d_state] (= -exp(A_log)); ssm_d; wout */
    weight ssm_x, ssm_dt;
    float *dt_norm, *b_norm, *c_norm;

    /* KDA (kimi-linear): wq, wk, wv; conv1d_t [K][3 W] (q's taps, k's, v's);
     * ssm_fa, ssm_fb (the decay's low rank: n_embd -> d -> W); dt_bias [W];
     * ssm_a [heads]; wb (beta); the output gate wz (attn_gate) or ssm_ga,
     * ssm_gb; ssm_norm [d]; wo */
    weight ssm_fa, ssm_fb, ssm_ga, ssm_gb;
    float *exp_probs_b;         /* [n_expert] the router's selection bias (kimi-linear), or NULL */

    /* multi-head latent attention (DeepSeek-V2) */
    weight wq_a;                /* n_embd -> q_lora (when q_lora > 0; else wq is n_embd -> n_head*(nope+rope)) */
    float *q_a_norm;            /* [q_lora] */
    weight wq_b;                /* q_lora -> n_head*(nope+rope) */
    weight wkv_a;               /* n_embd -> kv_lora + rope (attn_kv_a_mqa) */
    float *kv_a_norm;           /* [kv_lora] */
    weight wk_b;                /* per head: kv_lora rows of nope (W_kb,h transposed); head h at h * k_b_stride */
    weight wv_b;                /* per head: v_dim rows of kv_lora (W_vb,h) */
    size_t k_b_stride, v_b_stride;

    /* qwen3next DeltaNet inputs */
    weight ssm_ba;              /* n_embd -> 2*n_v, per key head g: [b (r) | a (r)] */
    weight ssm_in;              /* legacy fused: per key head g: [q | k | v (r*d_v) | z (r*d_v)] */
    bool legacy_ssm_in;

    /* the feed-forward block after the mixer (enum ffn_kind; FFN_NONE: the
     * layer has none, as Nemotron-H's mixer layers); ffn_norm is the norm
     * in front of it (post_norm, or attn_norm for a layer without mixer) */
    uint8_t ffn;
    const float *ffn_norm;

    /* SwiGLU MLP (dense layers) */
    weight ffn_gate, ffn_up;    /* n_embd -> n_ff */
    weight ffn_down;            /* n_ff -> n_embd */

    /* mixture of experts (qwen3next): weights below view expert 0; expert e
     * starts e * *_stride bytes further */
    weight router;              /* ffn_gate_inp: n_embd -> n_expert */
    weight gate_exps, up_exps;  /* per expert n_embd -> n_ff_exp */
    weight down_exps;           /* per expert n_ff_exp -> n_embd */
    size_t up_gate_stride, down_stride;
    float *shexp_gate;          /* [n_embd] ffn_gate_inp_shexp: scalar gate of the shared expert */
    weight gate_shexp, up_shexp;/* n_embd -> n_ff_shexp */
    weight down_shexp;          /* n_ff_shexp -> n_embd */
    weight latent_down;         /* nemotron_h_moe: n_embd -> moe_latent, the experts' input (absent: none) */
    weight latent_up;           /* moe_latent -> n_embd, their weighted sum back */
} layer;

enum ffn_kind {
    FFN_NONE = 0,
    FFN_SWIGLU,                 /* W_down(silu(W_gate x) * W_up x) */
    FFN_MOE,                    /* routed experts + a shared expert (forward.c moe_block) */
    FFN_RELU2,                  /* W_down(relu(W_up x)^2) (Nemotron-H) */
};

/* The MTP (multi-token prediction, "nextn") block a qwen35 file may carry
 * after its trunk, blk.{n_layer} (docs/models.md 1.7): a full-attention
 * layer plus the model's FFN, run on x = eh_proj([enorm(E[t]) | hnorm(h)])
 * over a KV cache of its own (cache.h: the engine's mtp_kv), then
 * shared_head_norm and an LM head. Owned by the model; the weights stay in
 * the file mapping as stored (never packed or copied: a file with MTP that
 * is not asked to use it costs nothing at run time). */
typedef struct mtp_block {
    layer blk;                  /* kind ENGINE_LAYER_ATTN, kind_idx 0 (the only layer of mtp_kv) */
    weight eh_proj;             /* 2 n_embd -> n_embd, input [enorm(e) | hnorm(h)] */
    float *enorm, *hnorm;       /* [n_embd] pre_fc_norm_embedding, pre_fc_norm_hidden */
    float *head_norm;           /* [n_embd] shared_head_norm (the MTP's final norm) */
    weight embed;               /* nextn.embed_tokens, n_vocab rows of n_embd; data NULL: tok_embd */
    weight head;                /* nextn.shared_head_head n_embd -> n_vocab; data NULL: the trunk's output */
} mtp_block;

typedef struct model {
    gguf_ctx *gguf;
    char arch[32];
    char name[128];
    int n_vocab, n_embd, n_layer, n_ctx_train, n_ff;
    int n_head, n_head_kv, head_dim, n_rot;
    float rope_theta, attn_scale, eps;
    int ssm_n_k, ssm_n_v, ssm_d_k, ssm_d_v, ssm_k;  /* DeltaNet shape; ssm_k = conv kernel */
    int conv_dim;               /* 2*n_k*d_k + n_v*d_v */
    int rope_type;              /* enum rope_type (kernels/vecmath.h) */
    bool attn_gated;            /* attn_q carries a sigmoid gate half per head */
    bool qk_norm;               /* per-head RMSNorm on q and k */
    bool dnet_grouped;          /* value head h uses key head h / r (else h % n_k) */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int n_mla;
    int mla_kv_lora, mla_q_lora, mla_nope, mla_rope, mla_v;  /* MLA shape */
    float mla_scale;            /* 1/sqrt(nope + rope) */
    float *mla_inv_freq;        /* [mla_rope/2] adjacent-pair RoPE */
    /* Mamba-2 shape: m2_heads heads of m2_head_dim, state m2_d_state, B and C
     * in m2_groups groups; conv over m2_conv_ch = d_inner + 2 groups d_state
     * channels; the input projection is m2_in_dim = 2 d_inner + 2 groups
     * d_state + heads wide. The conv kernel is ssm_k. */
    int m2_heads, m2_head_dim, m2_d_state, m2_groups, m2_conv_ch, m2_in_dim;
    /* Mamba-1 shape: d_inner channels, each with a d_state state; dt_rank
     * the width of dt before dt_proj. The conv kernel is ssm_k. */
    int m1_inner, m1_d_state, m1_dt_rank;
    bool moe_norm_topk;         /* renormalise the chosen experts' weights to sum 1 (all but Jamba) */
    bool moe_sigmoid;           /* router scores sigmoid(logit) (+ exp_probs_b to choose), not a softmax */
    bool moe_relu2;             /* experts and shared expert W_down relu(W_up x)^2, no gate (nemotron_h_moe) */
    int moe_latent;             /* the experts' width in and out when projected (nemotron_h_moe), else 0 */
    float moe_scale;            /* the chosen experts' weights times this (1 unless the file says) */
    int kda_heads, kda_head_dim;
    int n_dense_lead;           /* the first layers have a dense FFN, the rest experts (kimi-linear) */
    bool mla_use_rope;          /* MLA layers rotate q_pe and k_pe (not kimi-linear's) */
    /* Granite's multipliers (1 where a model has none): the embedding is
     * scaled by embd_scale, every block's output by residual_scale before
     * it joins the residual stream, the logits divided by logit_scale */
    float embd_scale, residual_scale, logit_scale;
    bool use_rope;              /* attention layers rotate q and k (Granite switches it off) */
    int n_attn, n_dnet, n_m2, n_sconv, n_mlp, n_m1, n_kda;
    size_t rec_state_numbers;   /* a sequence's recurrent states, every layer: numbers of the state type */
    size_t rec_conv_floats;     /* and its conv windows, in floats */
    uint8_t *kinds;             /* [n_layer] */
    layer *layers;              /* [n_layer] */
    int n_nextn;                /* the file's nextn_predict_layers (MTP blocks past the trunk; 0 none) */
    bool has_mtp;               /* mtp is bound (the first block when n_nextn > 1) */
    mtp_block mtp;
    weight tok_embd;            /* n_vocab rows of n_embd */
    weight output;              /* LM head (== tok_embd when tied) */
    float *output_norm;         /* [n_embd] */
    float *rope_inv_freq;       /* [n_rot/2] */
    uint64_t n_params;
    uint64_t weight_bytes;
    char *chat_template;
    char huge_note[256];        /* why huge_weights left the weights mapped ("" if it did not) */
    int n_panels;               /* weights repacked into panels at load (panels.h) */
    void *panel_arena;          /* where they live (NULL: rewritten in the huge-page copy, or none) */
    size_t panel_arena_bytes;
    int n_f32_copied;           /* F32 weights copied out of the file mapping at load */
    void *f32_arena;            /* where they live, 2 MiB pages advised (NULL: mapped, or none) */
    size_t f32_arena_bytes;
} model;

/* Load and validate. On failure: NULL and one line naming the file and
 * the problem in err. The tensors stay in the file mapping (zero-copy);
 * huge_weights reads them into transparent huge pages instead when the
 * kernel has them (gguf_load_huge), else they stay mapped and huge_note
 * says why in one line. Where panels_wanted(), BF16, F16 and Q8_0 projection
 * weights of a fitting shape are repacked into panels of 16 rows in place
 * (their pages become the process's own; the token embedding, MLA's
 * per-head k_b/v_b and expert slabs, read by row or slab, stay as stored).
 * F32 projections, LM head and token embedding are copied as they are
 * into an anonymous region advised for huge pages (unless the huge-page
 * copy holds them already, or HYSERVE_F32_COPY=0). With prefault_weights
 * the mapped weights' pages are read first (gguf_prefault). p->progress
 * hears of each of those phases (engine_progress_fn). Of p (NULL: none of
 * these) only huge_weights, prefault_weights and progress are read. */
model *model_load(const char *path, const engine_params *p, char *err, size_t errlen);
void model_free(model *m);

#endif

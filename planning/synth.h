/* synth.h - seeded random models of any size and layout, written as GGUF.
 *
 * Owns: choosing shapes, drawing weights (scaled so activations stay
 * finite through the stack) and writing them in llama.cpp's qwen35 layout
 * with a byte-level tokenizer. Used by `hyserve synth`, tests and benches.
 */
#ifndef HYSERVE_SYNTH_H
#define HYSERVE_SYNTH_H

#include <stddef.h>
#include <stdint.h>

typedef struct synth_config {
    char arch[16];              /* qwen35 (default), qwen35moe, qwen3next, qwen3, llama, deepseek2,
                                   granitehybrid, nemotron_h, lfm2, falcon-h1, jamba */
    uint64_t seed;
    int n_layer;
    int attn_every;             /* attention every Nth layer (used when pattern is empty) */
    char pattern[256];          /* per layer: 'A' attention, 'L' DeltaNet, 'M' MLA, 'S' Mamba-2,
                                   'C' short conv, 'F' MLP only, 'H' attention + Mamba-2,
                                   'B' Mamba-1; repeated */
    int n_embd, n_head, n_head_kv, head_dim, n_rot;
    int dnet_n_k, dnet_n_v, dnet_d_k, dnet_d_v, conv_kernel;
    int n_ff, n_vocab, n_ctx;
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;   /* qwen3next MoE (granitehybrid: n_expert 0 is dense) */
    int m2_heads, m2_head_dim, m2_d_state, m2_groups;   /* Mamba-2 layers (conv kernel: conv_kernel) */
    int m1_dt_rank;             /* Mamba-1 layers (jamba): d_state m2_d_state */
    int m1_inner;               /* their d_inner; 0: 2 n_embd (llama.cpp asserts that; a preset's own may differ) */
    int moe_latent;             /* nemotron_h_moe: the experts' latent width, 0 none */
    int mla_kv_lora, mla_q_lora, mla_nope, mla_rope, mla_v; /* MLA layers (n_head heads) */
    int tied;
    uint32_t dtype;             /* ggml type of the 2-D weights (a mix's base type) */
    int mix;                    /* SYNTH_MIX_*: llama-quantize's per-tensor choice on top of dtype */
    float rope_theta;
    int chat_template;          /* 1: write a ChatML template and its special tokens */
    int n_mtp;                  /* qwen35/qwen35moe: MTP blocks after the trunk (nextn_predict_layers, blk.{n_layer}..:
                                   an attention layer, the arch's FFN and the nextn.* tensors); 0: none */
    int mtp_copy;               /* 1 (tests): the MTP blocks draft a repeat of the last token (eh_proj [I | 0],
                                   attention and FFN outputs zero; dense FFN only) */
    int mtp_own_head;           /* 1: the MTP blocks carry nextn.embed_tokens and nextn.shared_head_head of
                                   their own; 0 (as released Qwen3.5 files): absent, the trunk's are used */
    char name[64];
} synth_config;

/* The *_K_M mixes (dtype Q4_K or Q5_K): the tensors llama-quantize gives more
 * bits to, by its rule (src/llama-quant.cpp, llama_tensor_get_type), get them:
 *   output.weight (token_embd.weight when tied)       Q6_K
 *   attn_qkv.weight (the DeltaNet input projection)  Q5_K (Q4_K_M) / Q6_K (Q5_K_M)
 *   attn_v.weight number i of n, ffn_down* of layer i of n (the routed and
 *   shared experts' too) where use_more_bits: i < n/8, i >= 7n/8 or
 *   (i - n/8) % 3 == 2                               Q6_K
 *   with 8 routed experts (qwen3next): attn_v and attn_k Q8_0, and for
 *   Q4_K_M attn_output Q5_K
 * general.file_type is 15 (Q4_K_M) or 17 (Q5_K_M). */
enum { SYNTH_MIX_NONE = 0, SYNTH_MIX_K_M = 1 };

void synth_config_default(synth_config *c);
/* The type synth writes `name` (a 2-D or 3-D weight named as in the file)
 * in: c->dtype, or the mix's choice; attn_v_index is the tensor's position
 * among the file's attn_v.weight tensors. */
uint32_t synth_tensor_type(const synth_config *c, const char *name, int attn_v_index);
/* Writes the model; 0 or -1 with one line in err. */
int synth_write(const synth_config *c, const char *path, char *err, size_t errlen);

#endif

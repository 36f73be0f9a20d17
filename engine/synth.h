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
    char arch[16];              /* qwen35 (default), qwen3next, qwen3, llama */
    uint64_t seed;
    int n_layer;
    int attn_every;             /* attention every Nth layer (used when pattern is empty) */
    char pattern[256];          /* per layer: 'A' attention, 'L' DeltaNet, 'M' MLA; repeated */
    int n_embd, n_head, n_head_kv, head_dim, n_rot;
    int dnet_n_k, dnet_n_v, dnet_d_k, dnet_d_v, conv_kernel;
    int n_ff, n_vocab, n_ctx;
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;   /* qwen3next MoE */
    int mla_kv_lora, mla_q_lora, mla_nope, mla_rope, mla_v; /* MLA layers (n_head heads) */
    int tied;
    uint32_t dtype;             /* ggml type of the 2-D weights */
    float rope_theta;
    int chat_template;          /* 1: write a ChatML template and its special tokens */
    char name[64];
} synth_config;

void synth_config_default(synth_config *c);
/* Writes the model; 0 or -1 with one line in err. */
int synth_write(const synth_config *c, const char *path, char *err, size_t errlen);

#endif

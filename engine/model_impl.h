/* model_impl.h - the loader's helpers, shared by the files that load a family.
 *
 * Internal to model.c (qwen35, qwen35moe, qwen3next, qwen3, llama,
 * deepseek2) and model_ssm.c (the Mamba-2 and short-convolution families:
 * granitehybrid, nemotron_h, lfm2, falcon-h1, jamba, kimi-linear). A loader fails once: the first failure's
 * message (the file, then the problem) is kept and every later call is a
 * no-op, so a family's loader can bind tensor after tensor and check
 * ld->failed once at the end.
 */
#ifndef HYSERVE_MODEL_IMPL_H
#define HYSERVE_MODEL_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "model.h"

enum arch {
    ARCH_QWEN35, ARCH_QWEN35MOE, ARCH_QWEN3NEXT, ARCH_QWEN3, ARCH_LLAMA, ARCH_DEEPSEEK2,
    ARCH_GRANITEHYBRID, ARCH_NEMOTRON_H, ARCH_LFM2, ARCH_FALCON_H1, ARCH_JAMBA, ARCH_KIMI_LINEAR,
    ARCH_NEMOTRON_H_MOE, ARCH_LFM2MOE,
};

/* the families model_ssm.c loads */
static inline bool arch_ssm_family(enum arch a)
{
    return a == ARCH_GRANITEHYBRID || a == ARCH_NEMOTRON_H || a == ARCH_LFM2 || a == ARCH_FALCON_H1 ||
           a == ARCH_JAMBA || a == ARCH_KIMI_LINEAR || a == ARCH_NEMOTRON_H_MOE || a == ARCH_LFM2MOE;
}

typedef struct loader {
    model *m;
    const gguf_ctx *g;
    const char *path;
    char *err;
    size_t errlen;
    bool failed;
} loader;

__attribute__((format(printf, 2, 3)))
void ld_fail(loader *ld, const char *fmt, ...);
/* u32 hyperparameter "<arch>.<suffix>" (def when absent and not required) */
int hp_u32(loader *ld, const char *suffix, int *out, int def, bool required);
/* f32 hyperparameter "<arch>.<suffix>", def when absent */
void hp_f32(loader *ld, const char *suffix, float *out, float def);
const gguf_tensor *find_t(loader *ld, const char *name, bool required);
/* a weight of ne = {n_in, n_out, n_slabs}, shape- and type-checked */
void bind_slabs(loader *ld, weight *w, size_t *stride, const char *name, int n_in, int n_out, int n_slabs);
void bind_w(loader *ld, weight *w, const char *name, int n_in, int n_out);
/* a small tensor of ne = {n, n_rows} copied to f32 */
float *bind_vec2(loader *ld, const char *name, int n, int n_rows);
float *bind_vec(loader *ld, const char *name, int n);
/* conv taps from the file's [channel][K] to [K][channel] */
void transpose_taps(loader *ld, float **w, int K, int n_ch);

/* An MLA layer's tensors, with the model's MLA shape already read. */
void bind_mla(loader *ld, layer *L, int il);

/* After the tensors: each recurrent layer's part of the slot, then the
 * RoPE frequency tables (model.c). */
void model_assign_slots(model *m);
void model_rope_tables(loader *ld);

/* Hyperparameters and tensors of a model_ssm.c family. */
void ssm_family_load(loader *ld, enum arch a);

#endif

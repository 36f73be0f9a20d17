/* presets.h - cache layouts as JSON (files under config/presets/) and the memory
 * estimate both `hyserve mem` and POST /v1/memory/estimate return. */
#ifndef HYSERVE_PRESETS_H
#define HYSERVE_PRESETS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memplan.h"

/* Directory holding the presets: $HYSERVE_PRESETS, else config/presets. */
const char *preset_dir(void);
/* Fill l from a layout object (the preset file format). 0, or -1 with a
 * message naming the field. kv_dtype (if present) sets l->kv_bytes. */
int preset_from_json(const cJSON *j, memplan_layout *l, char *err, size_t errlen);
/* Load preset NAME (config/presets/NAME.json) or a path to a JSON file. */
int preset_load(const char *name_or_path, memplan_layout *l, char *err, size_t errlen);
#define PRESET_NAME_MAX 64
/* The preset names (file names without .json), sorted, at most cap of
 * them, into caller storage. Returns how many. */
int preset_list(char (*names)[PRESET_NAME_MAX], int cap);
/* Comma-separated preset names, for error messages (static buffer). */
const char *preset_names(void);
/* kv dtype name -> bytes per number (f32 4, f16/bf16 2); 0 if unknown. */
int kv_dtype_bytes(const char *name);
/* l->kv_bytes and l->kv_dtype from a name kv_dtype_bytes knows. */
void memplan_set_kv_dtype(memplan_layout *l, const char *name);

/* A synthesized model whose cache layout is exactly l: every number that
 * sets cache bytes (layer kinds and counts, KV heads, head dims, MLA latent
 * and rope dims, DeltaNet heads and dims, conv kernel) is kept; the rest
 * (hidden size, MLP, vocabulary) is shrunk so it runs here. Layer kinds the
 * engine cannot run (Mamba, KDA) are an error. Positions: attention layers
 * evenly spaced, last layer of each group (as in Qwen3.5/Qwen3-Next). */
struct synth_config;
int synth_from_layout(const memplan_layout *l, struct synth_config *c, char *err, size_t errlen);
/* Write that model for preset NAME (or a layout JSON file) to path. The
 * layout's name goes to name_out. 0, or -1 with a message in err. */
int preset_synth_write(const char *name_or_path, const char *path, char *name_out, size_t name_cap, char *err,
                       size_t errlen);

/* The estimate: layout, per-token and per-sequence costs, counterfactuals,
 * the totals for batch sequences of context tokens, and (when budget > 0)
 * the largest batch and context that fit. Caller owns the result. */
cJSON *memplan_estimate_json(const memplan_layout *l, int64_t context, int64_t batch, uint64_t budget);

/* Speculation's memory (docs/serving.md 17), added to an estimate r as its
 * "speculative" object: each speculating sequence of a model with recurrent
 * layers holds one rollback snapshot (its recurrent state and conv windows)
 * in the model's budget beside its reservation; a draft model (draft
 * non-NULL, its weights draft_weight_bytes) adds its weights and its own
 * cache pool, one draft sequence of the context and its snapshot per
 * speculating sequence; mtp (--spec-type draft-mtp) the MTP block's KV pool,
 * one attention layer of the model's KV shape per sequence of the context
 * (engine/mtp.c). With budget > 0, "max_batch": the speculating sequences of
 * the context the budget holds, snapshots included. */
void memplan_spec_add_json(cJSON *r, const memplan_layout *l, const memplan_layout *draft,
                           uint64_t draft_weight_bytes, bool mtp, int64_t context, int64_t batch, uint64_t budget);

#endif

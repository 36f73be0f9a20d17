/* engine.h - the public API of the hyserve inference engine.
 *
 * The boundary: server/ includes this header and runtime/scheduler.h (the
 * batching layer above the engine), and where it needs them the stateless
 * leaf modules sampler.h and tokenizer.h and the allocation wrapper fault.h;
 * nothing else of engine/. The memory planner's layout (memplan.h) comes in
 * through this header: it is a pure function of a layout and has no engine
 * state; its preset files and the JSON estimate (planning/presets.h, which
 * brings cJSON) are included where they are used. tests/suite_layout.sh
 * fails the build when a file of server/ includes any other engine header,
 * and when cli/ reaches further than this header, gguf.h and the planning
 * headers (docs/architecture.md 2).
 *
 * Threading: an engine is NOT thread-safe. One thread (the scheduler)
 * owns it and makes every call that takes a non-const engine pointer.
 * engine_info() returns data that is immutable after engine_open(), so any
 * thread may read it.
 *
 * Memory: all cache memory (attention KV pages and DeltaNet state slots)
 * comes from one budget in bytes fixed at open (the MTP block's KV, made
 * only with engine_params.mtp, has a budget of its own beside it). Sequences reserve their
 * cache up front (engine_seq_reserve) so that a forward step never runs out
 * of memory halfway.
 */
#ifndef HYSERVE_ENGINE_H
#define HYSERVE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memplan.h"

typedef struct engine engine;
typedef struct tokenizer tokenizer;     /* tokenizer.h */

enum engine_layer_kind {
    ENGINE_LAYER_ATTN = 0,      /* gated softmax attention, GQA KV cache */
    ENGINE_LAYER_DELTANET = 1,  /* Gated DeltaNet, conv + recurrent state */
    ENGINE_LAYER_MLA = 2,       /* multi-head latent attention, compressed latent cache */
    ENGINE_LAYER_MAMBA2 = 3,    /* Mamba-2 (SSD), conv + recurrent state */
    ENGINE_LAYER_SCONV = 4,     /* gated short convolution (LFM2), conv window only */
    ENGINE_LAYER_MLP = 5,       /* no mixer: the layer is its feed-forward only (Nemotron-H) */
    ENGINE_LAYER_ATTN_MAMBA2 = 6, /* attention and Mamba-2 side by side on one input, outputs summed (Falcon-H1) */
    ENGINE_LAYER_MAMBA = 7,     /* Mamba (v1, selective scan with a diagonal A per channel), conv + state (Jamba) */
    ENGINE_LAYER_KDA = 8,       /* Kimi Delta Attention: delta rule with a decay per channel, 3 convs + state */
    ENGINE_LAYER_KINDS
};

/* One letter per kind for layer strips (hyserve info, /stats, the
 * dashboard, hyserve synth --pattern): A attention, L DeltaNet (linear),
 * M MLA, S Mamba-2 (SSM), C short convolution, F feed-forward only, H
 * attention and Mamba-2 in parallel (hybrid head), B Mamba-1 (the
 * selective scan of the first Mamba paper), K Kimi Delta Attention. */
static inline char engine_layer_letter(int kind)
{
    return kind >= 0 && kind < ENGINE_LAYER_KINDS ? "ALMSCFHBK"[kind] : '?';
}
/* Does a layer of this kind hold per-sequence recurrent state (a part of the slot)? */
static inline bool engine_layer_recurrent(int kind)
{
    return kind == ENGINE_LAYER_DELTANET || kind == ENGINE_LAYER_MAMBA2 || kind == ENGINE_LAYER_SCONV ||
           kind == ENGINE_LAYER_ATTN_MAMBA2 || kind == ENGINE_LAYER_MAMBA || kind == ENGINE_LAYER_KDA;
}

/* How DeltaNet layers process multi-token inputs. */
enum engine_dnet_mode {
    ENGINE_DNET_AUTO = 0,       /* the faster form: recurrent AVX2 step where the CPU has it, else chunked for prompts */
    ENGINE_DNET_RECURRENT = 1,  /* always token by token (reference path) */
    ENGINE_DNET_CHUNKED = 2,    /* chunked even for a single token */
};

/* How MLA layers attend. */
enum engine_mla_mode {
    ENGINE_MLA_AUTO = 0,        /* expanded for prefill, absorbed for decode */
    ENGINE_MLA_ABSORBED = 1,    /* always attend over the latent (never rebuild K/V) */
    ENGINE_MLA_EXPANDED = 2,    /* always rebuild per-head K and V from the latent */
};

/* Element type of the attention KV cache (GQA K/V and MLA latents). */
enum engine_kv_dtype {
    ENGINE_KV_F32 = 0,
    ENGINE_KV_F16 = 1,
    ENGINE_KV_BF16 = 2,
};

/* Element type of the DeltaNet recurrent state between forward calls (the
 * conv window stays f32). A call loads each head's state into f32, runs all
 * its tokens in f32 and stores it back; bf16 rounds it (to nearest even) at
 * that store: half the bytes per sequence and per decode step, for a
 * rounding of the state after every call (SGLang's --mamba-ssm-dtype). */
enum engine_state_dtype {
    ENGINE_STATE_F32 = 0,
    ENGINE_STATE_BF16 = 1,
};

/* ---- the process (call before any engine exists) ---- */

/* Process start-up, first thing in main(): the defaults of the threading
 * libraries' environment, applied by re-executing argv once
 * (blas_process_init: OpenBLAS's core where it fell back to SSE3 kernels,
 * libgomp's spin-wait; what the environment sets wins). */
void engine_process_init(char **argv);
/* The kernels this process chose at start, for /info, the ready line and
 * logs (engine_get_kernels fills every field; any thread). */
#define ENGINE_PROMPT_NAME_LEN 160
typedef struct engine_kernels {
    int threads;                /* the engine's parallel regions and OpenBLAS use now */
    const char *blas_core;      /* the OpenBLAS core in use: "Haswell", "SkylakeX", ... */
    const char *simd;           /* the hand-written kernels: "avx512+vnni+amx", "avx2", "scalar" ... */
    const char *bf16_decode;    /* the BF16 decode kernel and why, e.g. "vdpbf16ps (measured 1.31x
                                   the speed of the FMA kernel)" or "fma (no AVX512_BF16)" (kernels/cpu.h) */
    /* The prompt paths of BF16 and F16 weights in panels and of F32
     * weights (matmul.h), e.g. "vdpbf16ps (as bf16 decode)", "outer-product
     * tile to 16 tokens, sgemm past it"; and the int8 products in one
     * phrase: the form and from how many tokens each weight family takes
     * it, e.g. "avx512-vnni tiles, Q8_0/Q4_0 from 2 tokens, K-quants from
     * 32 tokens", or "off (...)". Each caller owns its copy: /info
     * requests and the ready line read them from different threads. */
    char bf16_prompt[ENGINE_PROMPT_NAME_LEN], f16_prompt[ENGINE_PROMPT_NAME_LEN];
    char f32_prompt[ENGINE_PROMPT_NAME_LEN], int8_prompt[ENGINE_PROMPT_NAME_LEN];
} engine_kernels;
void engine_get_kernels(engine_kernels *k);
/* Seconds on the monotonic clock: the one clock the scheduler, the server
 * and the tools stamp and time requests with. */
double engine_now_s(void);

/* ---- tools (`hyserve tensor`): weight types as the engine reads them ---- */

/* Whether the engine reads weights of this ggml type (enum ggml_type). */
bool engine_type_supported(uint32_t type);
/* n elements of one row stored as `type` blocks -> f32 (exact widening). */
void engine_dequant_row(uint32_t type, const void *src, float *dst, int n);

/* The load's progress, for a line on a terminal: the phase that moves the
 * weights' bytes ("reading the weights from the file" or "... into huge
 * pages", "repacking
 * weights into panels", "copying F32 weights"), the bytes of it done and
 * its total. Called once with done 0 when a phase begins, then as parts
 * finish, from any of the load's threads at once (the callee locks), and
 * exactly once per phase with done == total. A file whose weights stay in
 * the mapping as stored (Q4_K, ...) has no phase. */
typedef void (*engine_progress_fn)(void *ctx, const char *phase, uint64_t done, uint64_t total);

typedef struct engine_params {
    const char *model_path;
    int n_threads;              /* <= 0: all cores */
    int n_ctx;                  /* max tokens per sequence; <= 0: min(train ctx, 4096) */
    int max_seqs;               /* max live sequences; <= 0: 64 */
    uint64_t cache_bytes;       /* cache budget; 0: enough for max_seqs full contexts, capped at 4 GiB */
    uint64_t cache_max_bytes;   /* with cache_bytes 0: a lower cap on that default (a memory limit's
                                   room beside the weights); 0: none */
    int page_tokens;            /* tokens per KV page; <= 0: 16 */
    int dnet_mode;              /* enum engine_dnet_mode */
    int mla_mode;               /* enum engine_mla_mode */
    int kv_dtype;               /* enum engine_kv_dtype */
    int state_dtype;            /* enum engine_state_dtype */
    bool huge_weights;          /* read the weights into 2 MiB huge pages instead
                                   of serving them from the file mapping */
    bool moe_per_row;           /* the benchmark's baseline (bench/bench.c): each row's chosen experts as
                                   products of one row, not the rows routed to an expert gathered into one */
    bool prefault_weights;      /* read the mapped weights' pages at load (the server: the first request
                                   does not wait on the disk, /ready means ready); off: on first use */
    bool mtp;                   /* run the file's MTP block (engine_mtp_step): its KV cache is made at open;
                                   the model must have one (else engine_open fails). Off: a file with an MTP
                                   block costs nothing more than one without (its weights stay unread) */
    engine_progress_fn progress;        /* NULL, or told how the load goes (below) */
    void *progress_ctx;
} engine_params;

void engine_params_default(engine_params *p);

/* Immutable facts about the loaded model and its cache layout. */
typedef struct engine_info {
    char arch[32];              /* general.architecture, e.g. "qwen35" */
    char name[128];             /* general.name or the file name */
    const char *chat_template;  /* tokenizer.chat_template or NULL */
    int n_vocab;
    int n_embd;
    int n_layer;
    int n_ctx_train;
    int n_ctx;                  /* effective max tokens per sequence */
    int max_seqs;
    int n_head, n_head_kv, head_dim;
    int n_rot;
    int ssm_n_k, ssm_n_v, ssm_d_k, ssm_d_v, ssm_conv_kernel;
    int n_ff;
    int n_attn_layers, n_dnet_layers, n_mla_layers;
    int n_mamba2_layers, n_sconv_layers, n_mlp_layers, n_mamba_layers, n_kda_layers;
    int kda_heads, kda_head_dim;
    int n_rec_layers;           /* layers of every recurrent kind (DeltaNet, Mamba-2, short conv) */
    int mamba2_heads, mamba2_head_dim, mamba2_d_state, mamba2_groups;
    int mla_kv_lora_rank, mla_rope_dim, mla_nope_dim, mla_v_dim, mla_q_lora_rank;
    int n_expert, n_expert_used;
    const uint8_t *layer_kind;  /* [n_layer] enum engine_layer_kind */
    uint64_t n_params;
    uint64_t weight_bytes;
    uint64_t expert_weight_bytes;       /* of weight_bytes, the routed experts' (a decode step reads
                                           n_expert_used / n_expert of them) */
    const char *weights_dtype;          /* type of the matrices holding most weight bytes ("Q8_0", "BF16"; "Q4_K" for a Q4_K_M file) */
    const char *weights_memory;         /* "mapped" (the file's pages) or "huge_pages" (read into 2 MiB pages) */
    const char *weights_note;           /* "", or why huge_weights fell back to the mapping (one line) */
    int weights_in_panels;              /* BF16/F16/Q8_0 matrices repacked into 16-row panels at load (HYSERVE_PANELS) */
    /* Cache layout, in bytes. */
    uint64_t kv_bytes_per_token;        /* all attention layers, K and V */
    uint64_t mla_bytes_per_token;       /* all MLA layers */
    uint64_t dnet_state_bytes_per_seq;  /* recurrent state, all DeltaNet layers */
    uint64_t dnet_conv_bytes_per_seq;   /* conv state, all DeltaNet layers */
    uint64_t mamba2_state_bytes_per_seq, mamba2_conv_bytes_per_seq;   /* the same, Mamba-2 layers */
    uint64_t sconv_bytes_per_seq;       /* conv windows of the short-conv layers (they have no state) */
    uint64_t mamba_state_bytes_per_seq, mamba_conv_bytes_per_seq;     /* Mamba-1 layers */
    int mamba_d_inner, mamba_d_state;
    uint64_t kda_state_bytes_per_seq, kda_conv_bytes_per_seq;         /* KDA layers */
    uint64_t rec_state_bytes_per_seq;   /* every recurrent kind's state: a slot's first part */
    uint64_t rec_conv_bytes_per_seq;    /* every kind's conv windows: its second part */
    uint64_t mha_bytes_per_token;       /* counterfactual: MHA on every layer */
    uint64_t all_attention_bytes_per_token; /* counterfactual: every layer one of its attention layers */
    int page_tokens;
    uint64_t cache_budget_bytes;
    int32_t bos_id, eos_id;             /* -1 when absent */
    bool add_bos;
    const char *kv_dtype;               /* "f32", "f16" or "bf16" */
    int kv_dtype_bytes;                 /* bytes per cached number */
    const char *state_dtype;            /* DeltaNet recurrent state: "f32" or "bf16" */
    int n_nextn;                        /* the file's MTP blocks (nextn_predict_layers; only the first runs) */
    bool has_mtp;                       /* an MTP block is loaded: engine_params.mtp may be set */
    bool mtp_enabled;                   /* opened with engine_params.mtp: engine_mtp_step works */
    uint64_t mtp_bytes_per_token;       /* the MTP's KV, K and V of its one attention layer (0 unless enabled) */
    uint64_t mtp_budget_bytes;          /* its own cache budget (beside cache_budget_bytes; 0 unless enabled) */
} engine_info;

/* Cache held by one sequence, in bytes. reserved counts whole pages,
 * used counts filled token slots. */
typedef struct engine_seq_usage {
    int n_tokens;                       /* tokens in the cache */
    int n_reserved_tokens;              /* capacity of the reserved pages */
    uint64_t kv_reserved_bytes, kv_used_bytes;
    uint64_t mla_reserved_bytes, mla_used_bytes;
    uint64_t rec_state_bytes, rec_conv_bytes;    /* its recurrent slot: every kind's states, every kind's conv windows */
    uint64_t total_reserved_bytes;      /* everything this sequence holds */
    int n_shared_pages;                 /* of its pages, those another sequence also holds (prefix cache) */
    uint64_t shared_bytes;              /* their bytes: counted once in the pool, not owned by this sequence */
    int mtp_tokens;                     /* rows in its MTP KV (engine_mtp_step) */
    uint64_t mtp_reserved_bytes;        /* the MTP KV's pages (its own pool, not in total_reserved_bytes) */
} engine_seq_usage;

typedef struct engine_pool_usage {
    uint64_t budget_bytes;
    uint64_t reserved_bytes;            /* sum over live sequences */
    uint64_t free_bytes;
    int n_seqs;
    int n_pages_total, n_pages_used;    /* pages used: held by one sequence or more, each counted once */
    int n_snaps;                        /* DeltaNet snapshots held (engine_snap_take) */
    uint64_t snap_state_bytes;          /* their recurrent state */
    uint64_t snap_conv_bytes;           /* their conv windows */
    int n_spare_blocks;                 /* DeltaNet blocks mapped ahead of need: free, not in reserved_bytes */
    int n_spare_regions;                /* KV page regions the same (engine_spares_start) */
    uint64_t spare_bytes;               /* their mapped bytes */
    uint64_t spare_blocks_taken, spare_regions_taken;   /* spares taken since open */
    /* the MTP's KV (engine_mtp_step), a cache of its own: 0 unless enabled */
    uint64_t mtp_budget_bytes, mtp_reserved_bytes;
    int mtp_pages_used, mtp_seqs;       /* its pages held; sequences holding MTP rows */
} engine_pool_usage;

engine *engine_open(const engine_params *p, char *err, size_t errlen);
void engine_close(engine *e);
const engine_info *engine_get_info(const engine *e);
/* Threads the next forwards use (OpenMP regions and OpenBLAS), from 1 up
 * to the count the engine was opened with (scratch is sized for that);
 * <= 0 or more: the opened count. Owner thread only. Returns the count set. */
int engine_set_threads(engine *e, int n);

/* ---- tokenizer (pure functions of the model; any thread) ---- */

/* Encode text. parse_special: match control tokens like <|im_start|> in
 * the text. add_bos: prepend BOS when the model wants it. Returns the
 * number of tokens (may exceed max_out: then only max_out were written),
 * or a negative value on error. */
int engine_tokenize(const engine *e, const char *text, size_t len,
                    bool add_bos, bool parse_special, int32_t *out, int max_out);
/* Encode a rendered chat prompt: control tokens are parsed in the
 * template's markup only, never inside the data spans (byte ranges
 * data[2i] .. data[2i + 1], sorted and disjoint: the messages' content), so
 * a user cannot write "<|im_end|><|im_start|>system" into a message and
 * open a turn of their own. Otherwise as engine_tokenize. */
int engine_tokenize_chat(const engine *e, const char *text, size_t len, bool add_bos, const size_t *data,
                         int n_data, int32_t *out, int max_out);
/* The model's tokenizer, for tokenizer.h's pure functions of a token
 * (tok_piece, tok_is_eog, tok_is_control, tok_lookup): valid while e is
 * open; any thread. */
const tokenizer *engine_tokenizer(const engine *e);

/* ---- sequences (owner thread only) ---- */

/* Create an empty sequence. Returns its id (>= 0), or -1 when max_seqs
 * are live or the budget cannot hold its recurrent state. */
int engine_seq_new(engine *e);
/* Free a sequence and all its cache at once. Accepts invalid ids. */
void engine_seq_free(engine *e, int seq);
/* Make sure the sequence can hold n_tokens in total. Returns 0, or -1 if
 * the budget or n_ctx does not allow it (nothing changes then). */
int engine_seq_reserve(engine *e, int seq, int n_tokens);
/* Cache bytes a fresh sequence of n_tokens would reserve (admission). */
uint64_t engine_bytes_for_tokens(const engine *e, int n_tokens);
int engine_seq_len(const engine *e, int seq);
int engine_seq_get_usage(const engine *e, int seq, engine_seq_usage *u);
void engine_get_pool_usage(const engine *e, engine_pool_usage *u);
/* Only the spare counts of u (n_spare_*, spare_*): any thread (the spare
 * thread's own lock). */
void engine_get_spares(const engine *e, engine_pool_usage *u);
/* Keep up to n_blocks DeltaNet blocks and n_regions regions of KV pages
 * mapped and populated ahead of need, made on a thread of the cache's own,
 * so a new sequence, snapshot or page that finds nothing freed does not
 * fault in fresh memory on the request's path (the prefix store's growth;
 * cache_spares_start); made at once, then again at engine_spare_refill.
 * Only for models whose DeltaNet block is 8 MiB or more (a mapping of its
 * own); else nothing. 0, or -1 out of memory (no spares). Owner thread,
 * once. */
int engine_spares_start(engine *e, int n_blocks, int n_regions);
/* Have the thread make spares up to those counts again, in the
 * background; call it when idle (its populating holds the mmap lock that
 * mmap waits for). */
void engine_spare_refill(engine *e);
/* ---- sharing: forks, truncation, DeltaNet snapshots (owner thread only) ----
 * Used by the prefix store and by n > 1 choices. Pages are reference
 * counted: a fork shares its source's whole pages (counted once in the
 * pool) and copies a partly filled last page; a DeltaNet layer's state
 * cannot be rebuilt from the KV, so going back to an earlier length needs
 * a snapshot taken at that length. */
typedef struct cache_snap engine_snap;
/* A new sequence holding the first n_tokens of src: whole pages shared,
 * a partly filled page copied, the DeltaNet conv and recurrent state
 * copied (the state after src's length: when n_tokens is shorter, restore
 * a snapshot taken at n_tokens with engine_snap_restore). Id or -1 (no
 * sequence free, over budget). */
int engine_seq_fork(engine *e, int src, int n_tokens);
/* Shorten seq to n_tokens. Attention layers drop the tokens; DeltaNet
 * layers need snap, taken at n_tokens (NULL is enough for a model without
 * DeltaNet layers or when n_tokens is the length). 0 or -1 (nothing
 * changed, except on out of memory: released pages stay released). */
int engine_seq_truncate(engine *e, int seq, int n_tokens, const engine_snap *snap);
/* A copy of seq's DeltaNet conv window and recurrent state, counted in the
 * pool. NULL when the budget cannot hold engine_snap_bytes() more. */
engine_snap *engine_snap_take(engine *e, int seq);
/* An empty snapshot counted in the pool, for engine_batch_item.snap to
 * fill inside a step (its length is set then; -1 before). NULL when the
 * budget cannot hold engine_snap_bytes() more. */
engine_snap *engine_snap_new(engine *e);
/* seq becomes a snapshot of its own length and is freed: its DeltaNet
 * block moves into the snapshot (no copy; the pool's bytes do not change).
 * NULL (nothing changed) when seq is not live or out of memory. */
engine_snap *engine_seq_into_snap(engine *e, int seq);
/* Copy seq's recurrent state and conv windows into snap (from
 * engine_snap_new or engine_snap_take; its length becomes seq's): a
 * checkpoint refreshed in place, nothing allocated (the draft model's
 * rollback point, runtime/sched_spec.c). 0 or -1 (seq not live). */
int engine_snap_save(engine *e, int seq, engine_snap *snap);
/* Put a snapshot back into seq, whose length must be the snapshot's. 0 or -1. */
int engine_snap_restore(engine *e, int seq, const engine_snap *snap);
void engine_snap_free(engine *e, engine_snap *snap);
/* The sequence length a snapshot was taken at. */
int engine_snap_tokens(const engine_snap *snap);
/* Bytes of one snapshot: every DeltaNet layer's state and conv window
 * (the planner's dnet state + conv per sequence); 0 without DeltaNet layers. */
uint64_t engine_snap_bytes(const engine *e);

/* Whether sequences a and b hold bit-identical cache state: the same
 * length, every recurrent layer's state and conv window byte for byte,
 * and the K/V (and MLA latent) rows of every cached position (rows past
 * the length are not state: the next step overwrites them). false when
 * either is not live. For tests of rollback (engine_seq_truncate after a
 * verify step) against a sequence that never saw the rejected tokens. */
bool engine_seq_state_equal(const engine *e, int a, int b);
/* A 64-bit FNV-1a digest of the same bytes (length first), for logs and
 * for comparing a state across runs; 0 when seq is not live. */
uint64_t engine_seq_digest(const engine *e, int seq);

/* The loaded model's cache layout in the planner's terms (memplan.h): the
 * same numbers /v1/memory/estimate and `hyserve mem` compute. */
void engine_get_memplan(const engine *e, memplan_layout *out);

/* ---- forward ---- */

enum engine_logits_mode {
    ENGINE_LOGITS_NONE = 0,
    ENGINE_LOGITS_LAST = 1,     /* out: n_vocab floats */
    ENGINE_LOGITS_ALL = 2,      /* out: n_tokens * n_vocab floats */
};

typedef struct engine_batch_item {
    int seq;
    const int32_t *tokens;
    int n_tokens;               /* >= 1; appended after the cached tokens */
    int logits;                 /* enum engine_logits_mode */
    float *out;                 /* caller-owned, sized per the mode */
    engine_snap *snap;          /* NULL, or a snapshot (engine_snap_new) that receives the DeltaNet state
                                   and conv window after the first snap_at tokens of this item, inside the
                                   step: the prefix store's snapshots cost no step of their own */
    int snap_at;                /* 0 < snap_at < n_tokens when snap is set */
    int exact;                  /* 1: every row computed as n_tokens one-token steps would compute it, bit
                                   for bit (speculative decoding's verify step: greedy output and every
                                   state after a rollback exactly as without the draft), the weights
                                   still read once for all rows. Exact items run in passes of their own
                                   (a non-exact item in the same call takes another pass, a second read of
                                   the weights): set it on every item of a step, decode items too, for one
                                   read; a decode item marked exact gets its bits as if alone. */
    float *hidden;              /* NULL, or caller-owned [n_tokens][n_embd]: every row's trunk hidden state after
                                   the final norm (output_norm), the vector the LM head multiplies: what an MTP
                                   row takes (engine_mtp_step), whatever the logits mode */
    engine_snap *const *snaps;  /* NULL, or n_tokens - 1 snapshots (engine_snap_new; entries may be NULL):
                                   snaps[j] receives the DeltaNet (every recurrent kind's) state and conv
                                   window after j + 1 rows, a checkpoint at every position inside the step,
                                   so a rollback to any length needs no re-feed: engine_seq_truncate(seq,
                                   len + j + 1, snaps[j]). Each costs a copy of the slot in the step
                                   (engine_snap_bytes), and the recurrences run token by token */
} engine_batch_item;

/* One forward step over several sequences at once (each at most once per
 * call). Their cached contexts grow by n_tokens. Returns 0, or a negative
 * value with a message in err (bad token id, context full, missing
 * reservation); on error no sequence is modified. */
int engine_forward(engine *e, const engine_batch_item *items, int n_items,
                   char *err, size_t errlen);

/* ---- MTP: the file's multi-token-prediction block (engine/mtp.c) ----
 * With engine_params.mtp, every sequence has an MTP KV of its own (one
 * attention layer's pages, a pool beside the trunk's, empty at
 * engine_seq_new and engine_seq_fork, freed with the sequence). Row j of
 * it takes a trunk hidden row h (engine_batch_item.hidden, or the previous
 * row's out_hidden when chaining drafts) and the token t after h's
 * position, and gives the MTP's distribution for the token after t
 * (docs/models.md 1.7). The rows are the caller's to keep in step with the
 * trunk; the MTP's positions are its own rows 0, 1, .. (RoPE sees only
 * their differences, so rows begun mid-sequence after a prefix-cache hit
 * attend as the same rows at their trunk positions would). */
typedef struct engine_mtp_item {
    int seq;
    const float *hidden;        /* [n][n_embd] the h of each row */
    const int32_t *tokens;      /* [n] each row's next token t */
    int n;                      /* >= 1 rows appended after the MTP rows cached */
    float *logits;              /* NULL, or [n_vocab]: the last row's MTP logits */
    float *out_hidden;          /* NULL, or [n_embd]: the last row's normed output o (the h of a chained row) */
} engine_mtp_item;
/* Feed every item's rows (each sequence at most once) in one pass of the
 * MTP block per ENGINE_UBATCH rows; exact: the rows as one-row steps
 * compute them (as engine_batch_item.exact). The trunk's state is not
 * touched. 0, or -1 with a message (MTP not enabled, bad sequence or
 * token, context or MTP budget full); on error no MTP KV changed. */
int engine_mtp_step(engine *e, const engine_mtp_item *items, int n_items, bool exact, char *err, size_t errlen);
/* MTP rows cached for seq (-1: not live or MTP not enabled). */
int engine_mtp_len(const engine *e, int seq);
/* Make sure seq's MTP KV can hold n_rows in total (its pages reserved
 * now, as engine_seq_reserve for the trunk). 0, or -1 (MTP budget or n_ctx;
 * nothing changes then). */
int engine_mtp_reserve(engine *e, int seq, int n_rows);
/* Drop seq's MTP rows from n_rows on (n_rows <= engine_mtp_len): the
 * rollback of rejected or chained rows. 0 or -1. */
int engine_mtp_truncate(engine *e, int seq, int n_rows);

#endif

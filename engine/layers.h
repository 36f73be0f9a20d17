/* layers.h - the per-kind mixer kernels called by the layer loop.
 *
 * Internal to the engine. A batch is a set of fwd_items: consecutive rows
 * [row0, row0 + n) of the batch matrices belong to one sequence whose
 * cached context holds pos0 tokens before them.
 */
#ifndef HYSERVE_LAYERS_H
#define HYSERVE_LAYERS_H

#include <stdbool.h>

#include "cache.h"
#include "model.h"

/* Most rows (tokens) one internal forward pass processes; longer inputs
 * are split into passes of this size. Scratch is sized for it at open. */
#define ENGINE_UBATCH 512

typedef struct fwd_item {
    cache_seq *s;
    int row0;                   /* first row in the batch matrices */
    int n;                      /* rows (new tokens) */
    int pos0;                   /* tokens already cached */
    uint8_t *snap;              /* NULL, or a recurrent slot (cache_snap.slot) that receives every recurrent
                                   layer's state and conv window after the first snap_at rows */
    int snap_at;                /* 0 <= snap_at < n when snap is set */
    bool exact;                 /* the rows as n one-token steps compute them (engine_batch_item.exact); a
                                   pass holds exact items only or none (items_exact) */
    uint8_t *const *ckpt;       /* NULL, or [n] recurrent slots: ckpt[r], where not NULL, receives every
                                   recurrent layer's state and conv window after r rows (checkpoints,
                                   engine_batch_item.snaps); the recurrences then run token by token */
} fwd_item;

/* The slots that receive the state after r rows of it: the snapshot and
 * the checkpoint, each NULL when not wanted there. */
static inline uint8_t *item_snap_at(const fwd_item *it, int r)
{
    return it->snap && it->snap_at == r ? it->snap : NULL;
}
static inline uint8_t *item_ckpt_at(const fwd_item *it, int r)
{
    return it->ckpt && r >= 0 && r < it->n ? it->ckpt[r] : NULL;
}

/* Whether the pass is an exact one: each row through the one-token
 * arithmetic (the recurrences token by token as one-token steps run them,
 * attention on the decode path, serial conv channel blocks). */
static inline bool items_exact(const fwd_item *items, int n_items)
{
    return n_items > 0 && items[0].exact;
}

/* Causal depthwise conv over channels [c0, c1) of CD, in place in X (rows
 * ld floats apart; an item's rows as fwd_item says), with each sequence's
 * ring of K - 1 raw inputs at ring_off floats into its slot's conv windows
 * (updated; a snapshot item's snapshot receives the ring after snap_at
 * rows). taps: [K][CD]; bias: [CD] or NULL; silu: apply SiLU. K <= 16. */
void conv1d_items(const fwd_item *items, int n_items, float *X, int ld, int CD, int K, const float *taps,
                  const float *bias, size_t ring_off, bool silu, int c0, int c1);

/* A recurrent state S (n floats, the layer's work copy after snap_at rows)
 * into a snapshot at byte offset at numbers: f32 copied; bf16 rounded, and
 * S set to the rounded numbers, so the rows after the snapshot go on from
 * exactly the state a prefix-cache hit will restore (a hit then reads the
 * same as the cold request that made the snapshot). */
void rec_snapshot_state(float *S, uint8_t *snap, size_t at, int n, bool b16);

/* One head (or channel block) of a recurrent layer over an item's rows:
 * run(ctx, t0, n, S) advances the state S (f32, n_state numbers) over rows
 * [t0, t0 + n). rec_head_rows holds the state in f32 (a bf16 cache's in
 * work, rounded back at the end), takes the item's snapshot after snap_at
 * rows (rec_snapshot_state), and with step1 runs the rows one at a time,
 * a bf16 state rounded after each as one-token steps round it at their
 * store (an exact item whose kind's multi-row form, chunked or rounded
 * once, is not its one-token form). at: the head's offset in numbers. */
typedef void (*rec_rows_fn)(void *ctx, int t0, int n, float *S);
void rec_head_rows(const fwd_item *it, size_t at, int n_state, bool b16, bool step1, float *work, rec_rows_fn run,
                   void *ctx);

/* Gated attention, after the q/k/v projections.
 * Q:   [T][n_head * 2 * head_dim] per head [q | gate]; q normed/roped in place
 * K,V: [T][n_kv * head_dim]; written to the cache of each item
 * out: [T][n_head * head_dim] = softmax(q k^T * scale + mask) v * sigmoid(gate)
 * scores: per-thread scratch, n_threads * n_ctx floats. */
void attn_forward(const model *m, const layer *L, const cache *c, const fwd_item *items,
                  int n_items, float *Q, float *K, const float *V, float *out, float *scores);

/* One query row over n_keys cached keys: softmax(q k^T * scale) v. The
 * normalised weights are left in scores[0..n_keys). */
void attn_row(const cache *c, const cache_seq *s, int la, int kvh, const float *q, int n_keys,
              float scale, float *scores, float *out);

/* Gated DeltaNet, after the projections.
 * QKV: [T][conv_dim] conv input; replaced by the conv + SiLU output
 * B, A: [T][n_v] beta and alpha logits; replaced by beta and g
 * Z:   [T][n_v * d_v] output gate
 * O:   [T][n_v * d_v] gated-normed output
 * chunked: use the chunked (WY) form for this call.
 * scratch: n_threads * dnet_scratch_floats(m) floats. */
void dnet_forward(const model *m, const layer *L, const cache *c, const fwd_item *items,
                  int n_items, float *QKV, float *B, float *A, const float *Z, float *O,
                  int mode, float *scratch);
long dnet_scratch_floats(const model *m);

/* qwen3next's DeltaNet inputs (qwen3next.c): the projections of xn [T][n_embd]
 * into dnet_forward's layout: qkv [T][conv_dim], z [T][n_v*d_v], beta and
 * alpha logits [T][n_v]. fused: [T][max(ssm_in width, 2*n_v)] scratch for
 * the projections as the file groups them; decode, mm: as matmul's. */
void qwen3next_dnet_inputs(const model *m, const layer *L, const float *xn, int T, bool decode, float *mm,
                           float *fused, float *qkv, float *z, float *beta, float *alpha);

/* Multi-head latent attention, after the projections.
 * Q:   [T][n_head * (nope + rope)] per head [q_nope | q_pe]; q_pe roped in place
 * KVA: [T][kv_lora + rope]; normed/roped in place and cached
 * out: [T][n_head * v_dim]
 * mode: enum engine_mla_mode; decode: the pass is a decode step (matmul.h;
 * the expanded form's products take it too); scores: n_threads * n_ctx
 * floats; scratch: mla_scratch_floats(); mm: matmul scratch. */
void mla_forward(const model *m, const layer *L, const cache *c, const fwd_item *items, int n_items,
                 float *Q, float *KVA, float *out, int mode, bool decode, float *scores, float *scratch, float *mm);
long mla_scratch_floats(const model *m, int n_ctx);

/* Mamba-2 after its input projection (mamba2.c).
 * ZXD: [T][m2_in_dim] per row [z | x | B | C | dt]; [x | B | C] conv'd in
 * place, dt softplus'd in place
 * O:   [T][d_inner] = RMSNorm_group((y + D x) * silu(z)) * w
 * mode: enum engine_dnet_mode (the same forms: recurrent, chunked, auto).
 * scratch: n_threads * mamba2_scratch_floats(m) floats. */
void mamba2_forward(const model *m, const layer *L, const cache *c, const fwd_item *items, int n_items, float *ZXD,
                    float *O, int mode, float *scratch);
long mamba2_scratch_floats(const model *m);
/* Its two forms on one head, exposed for tests: x [n] rows of hd (stride
 * xs), dt [n] (softplus'd), B, C [n] rows of ds (stride bs), A the head's
 * (negative) decay rate, S [hd][ds] in/out, y [n] rows (stride ys). */
void mamba2_recurrent_head(int n, int hd, int ds, float A, const float *x, int xs, const float *dt,
                           const float *B, const float *C, int bs, float *S, float *y, int ys);
void mamba2_chunked_head(int n, int hd, int ds, float A, const float *x, int xs, const float *dt,
                         const float *B, const float *C, int bs, float *S, float *y, int ys, float *scratch);
long mamba2_chunk_scratch_floats(int hd, int ds);

/* Mamba-1's scan (mamba1.c), exposed for tests: rows [t0, t1), channels
 * [c0, c1); A [d_inner][DS]; x, dt rows (strides xs, dts); BC rows [B | C]
 * (stride bcs); S [c1 - c0][DS] in/out; y rows (stride ys). */
void mamba1_scan(int t0, int t1, int c0, int c1, int DS, const float *A, const float *x, int xs, const float *dt,
                 int dts, const float *BC, int bcs, float *S, float *y, int ys);

/* KDA's recurrence on one head (kda.c), exposed for tests: q, k, v rows of
 * d at stride; g rows of d (log decays per key channel), beta (strides
 * given), S [d (value)][d (key)] in/out, o rows. d <= 512. */
void kda_recurrent_head(int n, int d, const float *q, const float *k, const float *v, int stride, const float *g,
                        int g_stride, const float *beta, int beta_stride, float *S, float *o, int o_stride);

/* The two recurrence kernels on one value head, exposed for tests.
 * q,k: [n][d_k] (q already normed and scaled), v: [n][d_v], beta, g: [n],
 * S: [d_v][d_k] in/out, o: [n][d_v]. Row strides in floats. */
void dnet_recurrent_head(int n, int d_k, int d_v, const float *q, int q_stride,
                         const float *k, int k_stride, const float *v, int v_stride,
                         const float *beta, const float *g, float *S, float *o, int o_stride);
void dnet_chunked_head(int n, int d_k, int d_v, const float *q, int q_stride,
                       const float *k, int k_stride, const float *v, int v_stride,
                       const float *beta, const float *g, float *S, float *o, int o_stride,
                       float *scratch);
long dnet_chunk_scratch_floats(int d_k, int d_v);

#endif

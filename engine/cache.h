/* cache.h - attention KV pages and DeltaNet state slots, from one budget.
 *
 * Owns: every byte of per-sequence cache and the accounting behind /stats.
 * Attention KV lives in fixed-size pages of page_tokens tokens (all
 * attention layers of a token range in one page); DeltaNet conv and
 * recurrent state live in one slot per sequence. Budget checks happen at
 * reservation, so the forward pass never allocates. Pages are carved from
 * 2 MiB-aligned regions (transparent huge pages advised); freed pages and
 * DeltaNet blocks (slots and snapshots) are kept for the next sequences
 * until cache_deinit. Optionally a thread of its own maps spare blocks and
 * regions ahead of need (cache_spares_start).
 * Does not own: what is computed into the cache (attention.c, deltanet.c).
 * Owned by the engine's owner thread.
 */
#ifndef HYSERVE_CACHE_H
#define HYSERVE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kv_pages.h"
#include "memplan.h"

/* One sequence's share of the cache. Invariants (cache_broken checks them):
 * a live sequence holds its DeltaNet slot (state, then conv, 64-byte
 * aligned in one block) and n_pages non-NULL pages, enough for n_past
 * tokens (n_past <= n_pages * page_tokens <= max_pages * page_tokens,
 * n_past <= n_ctx); a sequence that is not live is all zero. */
typedef struct cache_seq {
    bool live;
    int n_past;                 /* tokens whose K/V and state are in the cache */
    int n_pages;                /* pages reserved */
    uint8_t **pages;            /* [max_pages] page pointers, first n_pages valid */
    void *state;                /* [n_dnet][n_v][d_v][d_k] of state_type (llama.cpp order: S^T of HF); the slot */
    float *conv;                /* [n_dnet][K-1][conv_dim], a ring: input x_p in row p % (K-1); in the slot after the state */
} cache_seq;

/* A copy of one sequence's DeltaNet slot (recurrent state, then conv
 * ring) as it was after n_tokens tokens: restoring it into a sequence of
 * the same length makes that sequence's DeltaNet layers continue exactly
 * as the original's would. Counted in the pool (reserved_bytes) like a
 * slot. Owned by whoever took it (the prefix store); freed with
 * cache_snap_free. */
typedef struct cache_snap {
    int n_tokens;               /* the length of the sequence it was taken from */
    uint8_t *slot;              /* [slot_bytes] state, then conv, as in a sequence */
} cache_snap;

/* The pool. Owned by the engine's owner thread. Invariants (cache_broken
 * checks them, under assert at every sequence new/free, and with
 * HYSERVE_CHECKS at every reservation):
 *   reserved_bytes == sum over live sequences of (state_bytes + conv_bytes)
 *                     + n_pages_used * page_bytes
 *                     + n_snaps * (state_bytes + conv_bytes)
 *                  <= budget_bytes;
 *   pages are reference counted (a count in each page's trailer, past
 *   page_bytes): a page held by k live sequences has count k, and a
 *   sequence never writes a page whose count is above 1 (only full pages
 *   below its n_past are shared; cache_seq_fork and cache_seq_truncate
 *   copy a partly filled page before sharing it);
 *   n_pages_used == the pages with a count above 0 (shared pages once),
 *   and the counts add up to the sum over live sequences of n_pages;
 *   n_pages_used + n_free_pages == n_pages_carved <= cap_free_pages
 *                  (every page is held or free, and the free list can take
 *                  all of them back, so freeing never allocates);
 *   n_live == the live sequences <= max_seqs, and
 *   n_live + n_snaps + n_free_blocks == n_blocks <= cap_free_blocks (every
 *                  DeltaNet block is a live sequence's slot, a snapshot's
 *                  or free, and the free list can take all of them back). */
typedef struct cache {
    /* layout */
    int n_attn, n_kv, head_dim;         /* attention KV shape */
    int n_mla, mla_dim;                 /* MLA latent rows: kv_lora + rope per token and layer */
    uint32_t kv_type;                   /* ggml type of cached numbers: F32, F16 or BF16 */
    size_t kv_es;                       /* bytes per cached number */
    int n_dnet, conv_rows, conv_dim;    /* conv_rows = K-1 */
    int n_rec;                          /* layers of every recurrent kind: a sequence holds a slot when > 0 */
    int n_v, d_v, d_k;                  /* recurrent state shape */
    uint32_t state_type;                /* its numbers: GGML_F32 or GGML_BF16 */
    size_t state_es;                    /* bytes per state number */
    int page_tokens, max_pages;         /* max_pages = ceil(n_ctx / page_tokens) */
    int n_ctx, max_seqs;
    uint64_t page_bytes;                /* page_tokens * (kv + mla) bytes per token */
    uint64_t kv_bytes_per_token;        /* GQA K and V, all attention layers */
    uint64_t mla_bytes_per_token;       /* MLA latents, all MLA layers */
    size_t page_mla_offset;             /* byte offset of the MLA part in a page */
    uint64_t conv_bytes, state_bytes;   /* per sequence, all recurrent layers (every kind's states, then
                                           every kind's conv windows; each layer's offsets: model.h) */
    /* pool */
    uint64_t budget_bytes;
    uint64_t reserved_bytes;            /* held by live sequences */
    int n_pages_used;
    int n_pages_carved;                 /* pages ever carved from the regions */
    uint8_t **free_pages;               /* [cap_free_pages] recycled and carved, not held */
    int n_free_pages, cap_free_pages;
    uint8_t **regions;                  /* where pages are carved from (cache.c) */
    int n_regions, cap_regions;
    size_t region_bytes, region_used;   /* each region's size; bytes used in the last */
    uint8_t **free_blocks;              /* [cap_free_blocks] DeltaNet blocks (a slot: state, then conv) not held */
    int n_free_blocks, cap_free_blocks;
    int n_blocks;                       /* blocks made: sequences' slots, snapshots' and free (cache.c) */
    bool blocks_mapped;                 /* each block its own huge-page mapping, else from aligned_alloc */
    struct cache_spares *spares;        /* NULL, or the thread keeping blocks and regions ready (cache_spares_start) */
    cache_seq *seqs;                    /* [max_seqs] */
    int n_live;
    int n_snaps;                        /* DeltaNet snapshots held (cache_snap_new) */
    memplan_layout plan;                /* the layout every byte count above comes from */
} cache;

typedef struct cache_layout {
    int n_layers;                       /* for the planner's counterfactuals */
    int n_attn, n_kv, head_dim, n_head;
    int n_mla, mla_dim, mla_rope, mla_nope, mla_v;
    uint32_t kv_type;                   /* GGML_F32 (0, default), GGML_F16, GGML_BF16 */
    uint32_t state_type;                /* DeltaNet recurrent state: GGML_F32 (0, default) or GGML_BF16 */
    int n_dnet, conv_kernel, conv_dim, n_v, d_v, d_k;
    int n_mamba2, mamba2_heads, mamba2_head_dim, mamba2_d_state, mamba2_groups, mamba2_conv;
    int n_sconv, sconv_channels, sconv_conv;    /* short convolutions: a conv window, no state */
    int n_mamba, mamba_d_inner, mamba_d_state, mamba_conv;   /* Mamba-1 */
    int n_kda, kda_heads, kda_head_dim, kda_conv;           /* Kimi Delta Attention */
    int n_mlp;                          /* MLP-only layers: no cache, named in the plan's layout */
    int page_tokens, n_ctx, max_seqs;
    uint64_t budget_bytes;              /* 0: room for max_seqs full contexts, capped */
    uint64_t budget_max_bytes;          /* with budget_bytes 0: a lower cap than 4 GiB; 0: none */
} cache_layout;

int cache_init(cache *c, const cache_layout *l);
/* Also ends the spare thread and unmaps its blocks. */
void cache_deinit(cache *c);

/* Spares: a thread of the cache's own keeps up to n DeltaNet blocks and
 * n_regions regions of KV pages (each at most 8) mapped and populated
 * zeroed, so a sequence or snapshot that finds no freed block, or a
 * reservation that needs a new region, takes a ready one instead of
 * faulting in fresh memory on the request's path. It makes them at the
 * start, then again only at cache_spares_refill (the owner calls it when
 * idle). Only with mapped blocks (blocks_mapped); a no-op otherwise or
 * when started already. Spares are free memory: not in reserved_bytes,
 * n_blocks or n_regions until taken, and never more than the budget could
 * hold at once (blocks made plus spares <= budget / (state + conv);
 * regions likewise in pages, plus one). 0, or -1 out of memory (then no
 * spares, as before). */
int cache_spares_start(cache *c, int n, int n_regions);
/* Have the spare thread make spares up to its counts again (no-op without it). */
void cache_spares_refill(cache *c);
typedef struct cache_spares_info {
    bool on;                            /* the spare thread runs */
    int want, ready;                    /* DeltaNet blocks it keeps ready; ready now */
    int want_regions, ready_regions;    /* page regions, the same */
    uint64_t ready_bytes;               /* mapped bytes of both */
    uint64_t made, taken;               /* blocks made since start; taken by sequences and snapshots */
    uint64_t regions_made, regions_taken;
} cache_spares_info;
/* A consistent copy of the spare counts (all zero when off). Any thread
 * (the spare thread's own lock; the layout does not change). */
void cache_spares_get(const cache *c, cache_spares_info *info);

int cache_seq_new(cache *c);                    /* id or -1 */
void cache_seq_free(cache *c, int id);
cache_seq *cache_get(cache *c, int id);         /* NULL unless live */
const cache_seq *cache_get_const(const cache *c, int id);
/* Ensure capacity for n_tokens; 0, or -1 (over budget or n_ctx, or out of
 * memory) and then nothing changed. */
int cache_reserve(cache *c, int id, int n_tokens);
/* Pages sequence id lacks to hold n_tokens (0 when it has them or is not live). */
int cache_pages_short(const cache *c, int id, int n_tokens);
/* Make n_pages more pages fit the budget and wait on the free list, so that
 * reservations adding up to n_pages pages cannot fail: 0, or -1 (over
 * budget or out of memory) and no sequence changed. For all-or-nothing
 * batches (engine_forward). */
int cache_make_room(cache *c, int n_pages);

/* ---- sharing: forks, truncation, DeltaNet snapshots (the prefix store) ---- */

/* A new sequence holding the first n_tokens tokens of src (n_tokens <=
 * src's n_past): src's whole pages below n_tokens are shared (counts go
 * up), a partly filled page at n_tokens is copied into a page of its own,
 * and src's DeltaNet slot is copied (the state after src's n_past tokens:
 * right when n_tokens == src's n_past, else the caller restores a snapshot
 * taken at n_tokens). Returns the id, or -1 (no free sequence, over
 * budget, out of memory) and nothing changed. */
int cache_seq_fork(cache *c, int src, int n_tokens);
/* Drop the tokens of sequence id from n_tokens on (n_tokens <= n_past):
 * pages wholly past n_tokens are released, a shared page that would be
 * written next is copied first. The DeltaNet slot is not touched (the
 * caller restores a snapshot taken at n_tokens). 0, or -1 (out of budget
 * for that copy, bad arguments) and nothing changed. */
int cache_seq_truncate(cache *c, int id, int n_tokens);
/* Pages of sequence id that another sequence also holds. */
int cache_seq_shared_pages(const cache *c, int id);
/* A snapshot buffer, counted in the pool: NULL when the budget cannot
 * hold state_bytes + conv_bytes more, or out of memory. */
cache_snap *cache_snap_new(cache *c);
void cache_snap_free(cache *c, cache_snap *s);
/* Sequence id becomes a snapshot of its own length: its DeltaNet block
 * moves into the snapshot (no copy, no new block; the bytes stay counted)
 * and the sequence is freed. NULL (and nothing changed) when id is not
 * live or out of memory. */
cache_snap *cache_seq_into_snap(cache *c, int id);
/* Copy sequence id's DeltaNet slot into s (s->n_tokens = its n_past). */
int cache_snap_save(cache *c, int id, cache_snap *s);
/* Copy s into sequence id's slot; -1 unless id's n_past == s->n_tokens. */
int cache_snap_restore(cache *c, int id, const cache_snap *s);

/* Invariants of the pool (see struct cache): NULL when they all hold, else
 * the first broken one, as a static string. */
const char *cache_broken(const cache *c);
/* cache_broken(c) == NULL; else says which invariant broke on stderr. For
 * assert() (invariant.h). */
bool cache_check(const cache *c);
/* Bytes a sequence holding n_tokens reserves (state + whole pages). */
uint64_t cache_bytes_for(const cache *c, int n_tokens);

/* Page layout (one page = page_tokens consecutive tokens of a sequence):
 *   [attention layer la][K=0 | V=1][kv head h][token in page][head_dim]
 *   then, at page_mla_offset: [MLA layer lm][token in page][mla_dim]
 * Elements are kv_type (f32, f16 or bf16). */

/* K (kv = 0) or V (kv = 1) row of attention layer la, kv head h, token t. */
static inline void *cache_kv(const cache *c, const cache_seq *s, int la, int kv, int h, int t)
{
    return kv_pages_row((const uint8_t *const *)s->pages, c->page_tokens, c->n_kv, c->head_dim, c->kv_es, la, kv, h,
                        t);
}
/* The K/V rows of attention layer la of s, as the attention kernels take them */
static inline kv_pages cache_kv_pages(const cache *c, const cache_seq *s, int la)
{
    return (kv_pages){ .pages = s->pages, .page_tokens = c->page_tokens, .n_kv = c->n_kv, .head_dim = c->head_dim,
                       .type = c->kv_type, .es = c->kv_es, .la = la };
}
static inline void *cache_k(const cache *c, const cache_seq *s, int la, int h, int t)
{
    return cache_kv(c, s, la, 0, h, t);
}
static inline void *cache_v(const cache *c, const cache_seq *s, int la, int h, int t)
{
    return cache_kv(c, s, la, 1, h, t);
}
/* MLA latent row [c (kv_lora) | k_pe (rope)] of MLA layer lm, token t. */
static inline void *cache_mla(const cache *c, const cache_seq *s, int lm, int t)
{
    uint8_t *p = s->pages[t / c->page_tokens] + c->page_mla_offset;
    size_t el = ((size_t)lm * (size_t)c->page_tokens + (size_t)(t % c->page_tokens)) * (size_t)c->mla_dim;
    return p + el * c->kv_es;
}

/* Conversions between f32 and the cache's element type. */
void cache_store(const cache *c, void *dst, const float *src, int n);
void cache_load(const cache *c, const void *src, float *dst, int n);
float cache_dot(const cache *c, const void *row, const float *x, int n);
/* out[0..n) += a * row */
void cache_axpy(const cache *c, float *out, float a, const void *row, int n);

#endif

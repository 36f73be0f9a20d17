/* cache.h - attention KV pages and DeltaNet state slots, from one budget.
 *
 * Owns: every byte of per-sequence cache and the accounting behind /stats.
 * Attention KV lives in fixed-size pages of page_tokens tokens (all
 * attention layers of a token range in one page); DeltaNet conv and
 * recurrent state live in one slot per sequence. Budget checks happen at
 * reservation, so the forward pass never allocates.
 * Does not own: what is computed into the cache (attention.c, deltanet.c).
 * Owned by the engine's owner thread.
 */
#ifndef HYSERVE_CACHE_H
#define HYSERVE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cache_seq {
    bool live;
    int n_past;                 /* tokens whose K/V and state are in the cache */
    int n_pages;                /* pages reserved */
    float **pages;              /* [max_pages] page pointers, first n_pages valid */
    float *conv;                /* [n_dnet][K-1][conv_dim], oldest input first */
    float *state;               /* [n_dnet][n_v][d_v][d_k] (llama.cpp order: S^T of HF) */
} cache_seq;

typedef struct cache {
    /* layout */
    int n_attn, n_kv, head_dim;         /* attention KV shape */
    int n_dnet, conv_rows, conv_dim;    /* conv_rows = K-1 */
    int n_v, d_v, d_k;                  /* recurrent state shape */
    int page_tokens, max_pages;         /* max_pages = ceil(n_ctx / page_tokens) */
    int n_ctx, max_seqs;
    uint64_t page_bytes;                /* page_tokens * kv bytes per token */
    uint64_t kv_bytes_per_token;
    uint64_t conv_bytes, state_bytes;   /* per sequence, all DeltaNet layers */
    /* pool */
    uint64_t budget_bytes;
    uint64_t reserved_bytes;            /* held by live sequences */
    int n_pages_used;
    float **free_pages;                 /* recycled pages */
    int n_free_pages, cap_free_pages;
    cache_seq *seqs;                    /* [max_seqs] */
    int n_live;
} cache;

typedef struct cache_layout {
    int n_attn, n_kv, head_dim;
    int n_dnet, conv_kernel, conv_dim, n_v, d_v, d_k;
    int page_tokens, n_ctx, max_seqs;
    uint64_t budget_bytes;              /* 0: room for max_seqs full contexts, capped */
} cache_layout;

int cache_init(cache *c, const cache_layout *l);
void cache_deinit(cache *c);

int cache_seq_new(cache *c);                    /* id or -1 */
void cache_seq_free(cache *c, int id);
cache_seq *cache_get(cache *c, int id);         /* NULL unless live */
const cache_seq *cache_get_const(const cache *c, int id);
/* Ensure capacity for n_tokens; 0 or -1 (over budget or n_ctx). */
int cache_reserve(cache *c, int id, int n_tokens);
/* Bytes a sequence holding n_tokens reserves (state + whole pages). */
uint64_t cache_bytes_for(const cache *c, int n_tokens);

/* K or V row of attention layer la, kv head h, token t: [head_dim] floats. */
static inline float *cache_k(const cache *c, const cache_seq *s, int la, int h, int t)
{
    float *p = s->pages[t / c->page_tokens];
    return p + ((((size_t)la * 2 + 0) * c->n_kv + h) * c->page_tokens + t % c->page_tokens) * c->head_dim;
}
static inline float *cache_v(const cache *c, const cache_seq *s, int la, int h, int t)
{
    float *p = s->pages[t / c->page_tokens];
    return p + ((((size_t)la * 2 + 1) * c->n_kv + h) * c->page_tokens + t % c->page_tokens) * c->head_dim;
}

#endif

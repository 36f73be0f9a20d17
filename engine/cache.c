/* cache.c - KV page pool and per-sequence DeltaNet state slots.
 * Invariant: reserved_bytes == sum over live seqs of
 *            conv_bytes + state_bytes + n_pages * page_bytes <= budget_bytes. */
#include "cache.h"

#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

#define DEFAULT_BUDGET_CAP (4ull << 30)

int cache_init(cache *c, const cache_layout *l)
{
    memset(c, 0, sizeof *c);
    c->n_attn = l->n_attn;
    c->n_mla = l->n_mla;
    c->mla_dim = l->mla_dim;
    c->kv_type = l->kv_type;
    c->kv_es = c->kv_type == GGML_F32 ? 4 : 2;
    c->n_kv = l->n_kv;
    c->head_dim = l->head_dim;
    c->n_dnet = l->n_dnet;
    c->conv_rows = l->conv_kernel - 1;
    c->conv_dim = l->conv_dim;
    c->n_v = l->n_v;
    c->d_v = l->d_v;
    c->d_k = l->d_k;
    c->page_tokens = l->page_tokens > 0 ? l->page_tokens : 16;
    c->n_ctx = l->n_ctx;
    c->max_seqs = l->max_seqs;
    c->max_pages = (c->n_ctx + c->page_tokens - 1) / c->page_tokens;
    /* every byte count comes from the planner's arithmetic */
    memplan_layout *pl = &c->plan;
    memset(pl, 0, sizeof *pl);
    pl->n_layers = l->n_layers;
    pl->attn_layers = l->n_attn;
    pl->attn_heads = l->n_head;
    pl->attn_kv_heads = l->n_kv;
    pl->attn_head_dim = l->head_dim;
    pl->mla_layers = l->n_mla;
    pl->mla_heads = l->n_head;
    pl->mla_kv_lora = l->mla_dim - l->mla_rope;
    pl->mla_rope = l->mla_rope;
    pl->mla_nope = l->mla_nope;
    pl->mla_v = l->mla_v;
    pl->dnet_layers = l->n_dnet;
    pl->dnet_v_heads = l->n_v;
    pl->dnet_d_k = l->d_k;
    pl->dnet_d_v = l->d_v;
    pl->dnet_conv = l->conv_kernel;
    /* conv_dim = 2 n_k d_k + n_v d_v: recover n_k for the planner */
    pl->dnet_k_heads = l->d_k ? (l->conv_dim - l->n_v * l->d_v) / (2 * l->d_k) : 0;
    pl->kv_bytes = (int)c->kv_es;
    pl->state_bytes = 4;
    pl->page_tokens = c->page_tokens;
    pl->max_context = l->n_ctx;
    memplan_costs mc;
    memplan_costs_of(pl, &mc);
    c->kv_bytes_per_token = mc.attn_kv_bytes_per_token;
    c->mla_bytes_per_token = mc.mla_bytes_per_token;
    c->page_bytes = mc.page_bytes;
    c->page_mla_offset = (size_t)(c->kv_bytes_per_token * (uint64_t)c->page_tokens);
    c->conv_bytes = mc.dnet_conv_bytes_per_seq;
    c->state_bytes = mc.dnet_state_bytes_per_seq;
    c->budget_bytes = l->budget_bytes;
    if (c->budget_bytes == 0) {
        c->budget_bytes = cache_bytes_for(c, c->n_ctx) * (uint64_t)c->max_seqs;
        if (c->budget_bytes > DEFAULT_BUDGET_CAP)
            c->budget_bytes = DEFAULT_BUDGET_CAP;
    }
    c->seqs = calloc((size_t)c->max_seqs, sizeof *c->seqs);
    c->free_slots = calloc((size_t)c->max_seqs, sizeof *c->free_slots);
    return c->seqs && c->free_slots ? 0 : -1;
}

/* A sequence's DeltaNet slot: the state, then the conv ring, one block */
static size_t slot_bytes(const cache *c)
{
    return (size_t)((c->state_bytes + c->conv_bytes + 63) & ~(uint64_t)63) + 64;
}

void cache_deinit(cache *c)
{
    if (c->seqs)
        for (int i = 0; i < c->max_seqs; i++)
            cache_seq_free(c, i);
    for (int i = 0; i < c->n_free_pages; i++)
        free(c->free_pages[i]);
    free(c->free_pages);
    for (int i = 0; i < c->n_free_slots; i++)
        free(c->free_slots[i]);
    free(c->free_slots);
    free(c->seqs);
    memset(c, 0, sizeof *c);
}

uint64_t cache_bytes_for(const cache *c, int n_tokens)
{
    return memplan_seq_reserved_bytes(&c->plan, n_tokens);
}

int cache_seq_new(cache *c)
{
    int id = -1;
    for (int i = 0; i < c->max_seqs; i++)
        if (!c->seqs[i].live) {
            id = i;
            break;
        }
    if (id < 0 || c->reserved_bytes + c->conv_bytes + c->state_bytes > c->budget_bytes)
        return -1;
    cache_seq *s = &c->seqs[id];
    memset(s, 0, sizeof *s);
    s->pages = calloc((size_t)(c->max_pages ? c->max_pages : 1), sizeof(uint8_t *));
    /* The slot of a freed sequence if there is one, else a new one. Zeroed
     * by writing: the recurrent step reads the state before it writes it,
     * and on untouched (calloc'd, mmap'd) pages that read maps the zero
     * page and the write then copies it, with a TLB flush across the
     * threads: a fresh sequence's 16-token prompt took 310-330 ms against
     * 200 on reused memory (Q8_0 0.8B shape, 2 threads, 10k page faults). */
    const size_t sb = slot_bytes(c);
    uint8_t *slot = c->n_free_slots ? c->free_slots[--c->n_free_slots] : aligned_alloc(64, sb);
    if (!s->pages || !slot) {
        free(s->pages);
        free(slot);
        memset(s, 0, sizeof *s);
        return -1;
    }
    memset(slot, 0, sb);
    s->state = (float *)slot;
    s->conv = (float *)(slot + ((c->state_bytes + 63) & ~(uint64_t)63));
    s->live = true;
    c->reserved_bytes += c->conv_bytes + c->state_bytes;
    c->n_live++;
    return id;
}

void cache_seq_free(cache *c, int id)
{
    if (id < 0 || id >= c->max_seqs || !c->seqs[id].live)
        return;
    cache_seq *s = &c->seqs[id];
    for (int i = 0; i < s->n_pages; i++) {
        /* recycle; the free list was sized at reservation, so this fits */
        if (c->n_free_pages < c->cap_free_pages)
            c->free_pages[c->n_free_pages++] = s->pages[i];
        else
            free(s->pages[i]);
    }
    c->n_pages_used -= s->n_pages;
    c->reserved_bytes -= c->conv_bytes + c->state_bytes + (uint64_t)s->n_pages * c->page_bytes;
    free(s->pages);
    if (c->n_free_slots < c->max_seqs)                     /* the slot, for the next sequence */
        c->free_slots[c->n_free_slots++] = (uint8_t *)s->state;
    else
        free(s->state);
    memset(s, 0, sizeof *s);
    c->n_live--;
}

cache_seq *cache_get(cache *c, int id)
{
    if (id < 0 || id >= c->max_seqs || !c->seqs[id].live)
        return NULL;
    return &c->seqs[id];
}

const cache_seq *cache_get_const(const cache *c, int id)
{
    if (id < 0 || id >= c->max_seqs || !c->seqs[id].live)
        return NULL;
    return &c->seqs[id];
}

int cache_reserve(cache *c, int id, int n_tokens)
{
    cache_seq *s = cache_get(c, id);
    if (!s || n_tokens > c->n_ctx)
        return -1;
    if (c->page_bytes == 0)
        return 0;
    int need = (n_tokens + c->page_tokens - 1) / c->page_tokens;
    if (need <= s->n_pages)
        return 0;
    uint64_t extra = (uint64_t)(need - s->n_pages) * c->page_bytes;
    if (c->reserved_bytes + extra > c->budget_bytes)
        return -1;
    /* grow the free list's capacity first so freeing never allocates */
    int total = c->n_pages_used + (need - s->n_pages);
    if (total > c->cap_free_pages) {
        uint8_t **fp = realloc(c->free_pages, (size_t)total * sizeof *fp);
        if (!fp)
            return -1;
        c->free_pages = fp;
        c->cap_free_pages = total;
    }
    int got = s->n_pages;
    while (got < need) {
        uint8_t *p = c->n_free_pages ? c->free_pages[--c->n_free_pages] : malloc(c->page_bytes);
        if (!p)
            break;
        s->pages[got++] = p;
    }
    c->n_pages_used += got - s->n_pages;
    c->reserved_bytes += (uint64_t)(got - s->n_pages) * c->page_bytes;
    s->n_pages = got;
    return got == need ? 0 : -1;
}

void cache_store(const cache *c, void *dst, const float *src, int n)
{
    quantize_row(c->kv_type, src, dst, n);
}

void cache_load(const cache *c, const void *src, float *dst, int n)
{
    dequant_row(c->kv_type, src, dst, n);
}

float cache_dot(const cache *c, const void *row, const float *x, int n)
{
    return dot_row(c->kv_type, row, x, n);
}

void cache_axpy(const cache *c, float *restrict out, float a, const void *row, int n)
{
    if (c->kv_type == GGML_F32) {
        const float *r = row;
        for (int i = 0; i < n; i++)
            out[i] += a * r[i];
    } else if (c->kv_type == GGML_F16) {
        const uint16_t *r = row;
        for (int i = 0; i < n; i++)
            out[i] += a * fp16_to_f32(r[i]);
    } else {
        const uint16_t *r = row;
        for (int i = 0; i < n; i++)
            out[i] += a * bf16_to_f32(r[i]);
    }
}

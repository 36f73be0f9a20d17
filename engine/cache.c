/* cache.c - KV page pool and per-sequence DeltaNet state slots.
 * Invariant: reserved_bytes == sum over live seqs of
 *            conv_bytes + state_bytes + n_pages * page_bytes <= budget_bytes. */
#include "cache.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gguf.h"
#include "kernels/quant.h"

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
    c->state_type = l->state_type == GGML_BF16 ? GGML_BF16 : GGML_F32;
    c->state_es = c->state_type == GGML_F32 ? 4 : 2;
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
    pl->state_bytes = (int)c->state_es;
    pl->conv_bytes = 4;
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
        if (l->budget_max_bytes && c->budget_bytes > l->budget_max_bytes)
            c->budget_bytes = l->budget_max_bytes;
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
    for (int i = 0; i < c->n_regions; i++)        /* every page, free or not, lives in one */
        munmap(c->regions[i], c->region_bytes);
    free(c->regions);
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
     * threads: a fresh sequence's 16-token prompt took 282 ms against 121
     * on reused memory (Q8_0 0.8B shape, 2 threads, 10k page faults); now
     * 8.7 ms of memset here, then 121. */
    const size_t sb = slot_bytes(c);
    uint8_t *slot = c->n_free_slots ? c->free_slots[--c->n_free_slots] : aligned_alloc(64, sb);
    if (!s->pages || !slot) {
        free(s->pages);
        free(slot);
        memset(s, 0, sizeof *s);
        return -1;
    }
    memset(slot, 0, sb);
    s->state = slot;
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
    for (int i = 0; i < s->n_pages; i++)     /* recycle; the free list was sized at reservation */
        if (c->n_free_pages < c->cap_free_pages)
            c->free_pages[c->n_free_pages++] = s->pages[i];
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

/* A new page, carved from a region of 2 MiB-aligned anonymous memory with
 * transparent huge pages advised (where the kernel has them; else plain
 * pages). A decode step at long context streams every page of a sequence
 * in 16 KiB pieces (one head's K or V of 16 tokens); on 4 KiB pages each
 * piece meant four page walks. Q8_0 0.8B shape, 8K context, 2 threads, the
 * bench's alternation (hyserve-bench --only decode), huge-page regions
 * against one malloc per page: extra ms per token over context 0 9.4
 * against 11.2, a plain read of the pages 23.4 against 15.9 GB/s. Regions
 * stay until cache_deinit, as free pages always did. */
#define REGION_ALIGN (2u << 20)
static uint8_t *page_new(cache *c)
{
    const size_t stride = (c->page_bytes + 63) & ~(uint64_t)63;
    if (c->n_regions == 0 || c->region_used + stride > c->region_bytes) {
        if (c->region_bytes == 0) {           /* 16 pages or 2 MiB, whichever is more, in whole 2 MiB */
            const size_t want = stride * 16 > REGION_ALIGN ? stride * 16 : REGION_ALIGN;
            c->region_bytes = (want + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
        }
        if (c->n_regions == c->cap_regions) {
            const int cap = c->cap_regions ? 2 * c->cap_regions : 16;
            uint8_t **r = realloc(c->regions, (size_t)cap * sizeof *r);
            if (!r)
                return NULL;
            c->regions = r;
            c->cap_regions = cap;
        }
        /* over-map by 2 MiB and trim, so the region starts 2 MiB-aligned */
        uint8_t *m = mmap(NULL, c->region_bytes + REGION_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        uint8_t *a = (uint8_t *)(((uintptr_t)m + REGION_ALIGN - 1) & ~(uintptr_t)(REGION_ALIGN - 1));
        if (a > m)
            munmap(m, (size_t)(a - m));
        munmap(a + c->region_bytes, (size_t)(m + REGION_ALIGN - a));
        madvise(a, c->region_bytes, MADV_HUGEPAGE);
        c->regions[c->n_regions++] = a;
        c->region_used = 0;
    }
    uint8_t *p = c->regions[c->n_regions - 1] + c->region_used;
    c->region_used += stride;
    return p;
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
        uint8_t *p = c->n_free_pages ? c->free_pages[--c->n_free_pages] : page_new(c);
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

/* cache.c - KV page pool and per-sequence DeltaNet state slots.
 * Invariants: above struct cache in cache.h; cache_broken checks them. */
#include "cache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fault.h"
#include "gguf.h"
#include "invariant.h"
#include "kernels/quant.h"

#define DEFAULT_BUDGET_CAP (4ull << 30)

/* A sequence's DeltaNet slot: the state, then the conv ring, one block */
static size_t slot_bytes(const cache *c)
{
    return (size_t)((c->state_bytes + c->conv_bytes + 63) & ~(uint64_t)63) + 64;
}

/* DeltaNet blocks of at least this many bytes get mappings of their own
 * (block_new); smaller ones come from the allocator. */
#define BLOCK_MAP_MIN (8u << 20)

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
    pl->mamba2_layers = l->n_mamba2;
    pl->mamba2_heads = l->mamba2_heads;
    pl->mamba2_head_dim = l->mamba2_head_dim;
    pl->mamba2_d_state = l->mamba2_d_state;
    pl->mamba2_groups = l->mamba2_groups;
    pl->mamba2_conv = l->mamba2_conv;
    pl->sconv_layers = l->n_sconv;
    pl->sconv_channels = l->sconv_channels;
    pl->sconv_conv = l->sconv_conv;
    pl->mamba_layers = l->n_mamba;
    pl->mamba_d_inner = l->mamba_d_inner;
    pl->mamba_d_state = l->mamba_d_state;
    pl->mamba_conv = l->mamba_conv;
    pl->kda_layers = l->n_kda;
    pl->kda_heads = l->kda_heads;
    pl->kda_head_dim = l->kda_head_dim;
    pl->kda_conv = l->kda_conv;
    pl->mlp_layers = l->n_mlp;
    c->n_rec = l->n_dnet + l->n_mamba2 + l->n_sconv + l->n_mamba + l->n_kda;
    pl->kv_bytes = (int)c->kv_es;
    snprintf(pl->kv_dtype, sizeof pl->kv_dtype, "%s", c->kv_type == GGML_F32 ? "f32" : c->kv_type == GGML_F16 ? "f16" : "bf16");
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
    c->conv_bytes = mc.rec_conv_bytes_per_seq;
    c->state_bytes = mc.rec_state_bytes_per_seq;
    c->budget_bytes = l->budget_bytes;
    if (c->budget_bytes == 0) {
        c->budget_bytes = cache_bytes_for(c, c->n_ctx) * (uint64_t)c->max_seqs;
        if (c->budget_bytes > DEFAULT_BUDGET_CAP)
            c->budget_bytes = DEFAULT_BUDGET_CAP;
        if (l->budget_max_bytes && c->budget_bytes > l->budget_max_bytes)
            c->budget_bytes = l->budget_max_bytes;
    }
    c->seqs = FAULT_OR(calloc((size_t)c->max_seqs, sizeof *c->seqs));
    c->blocks_mapped = slot_bytes(c) >= BLOCK_MAP_MIN;
    return c->seqs ? 0 : -1;
}

/* A page's bytes, rounded to 64, then a 64-byte trailer holding its
 * reference count (the sequences that hold it). */
static size_t page_body(const cache *c)
{
    return (size_t)((c->page_bytes + 63) & ~(uint64_t)63);
}

static size_t page_stride(const cache *c)
{
    return page_body(c) + 64;
}

static int32_t *page_refs(const cache *c, uint8_t *p)
{
    return (int32_t *)(void *)(p + page_body(c));
}

static const int32_t *page_refs_const(const cache *c, const uint8_t *p)
{
    return (const int32_t *)(const void *)(p + page_body(c));
}

/* One holder less of page p; at none it goes back to the free list. */
static void page_unref(cache *c, uint8_t *p)
{
    int32_t *r = page_refs(c, p);
    if (--*r > 0)
        return;
    if (c->n_free_pages < c->cap_free_pages)     /* sized when the page was carved */
        c->free_pages[c->n_free_pages++] = p;
    c->n_pages_used--;
    c->reserved_bytes -= c->page_bytes;
}

/* A page off the free list for one holder (cache_make_room made room). */
static uint8_t *page_take(cache *c)
{
    uint8_t *p = c->free_pages[--c->n_free_pages];
    *page_refs(c, p) = 1;
    c->n_pages_used++;
    c->reserved_bytes += c->page_bytes;
    return p;
}

/* Room in *a, an array of *cap pointers, for n + 1 of them: *cap doubled
 * (first when empty) when it holds n. 0, or -1 out of memory (unchanged). */
static int ptrs_room(uint8_t ***a, int *cap, int n, int first)
{
    uint8_t **p = fault_grow(*a, n, cap, sizeof *p, first);
    if (!p)
        return -1;
    *a = p;
    return 0;
}

/* bytes (a multiple of REGION_ALIGN) of anonymous memory, 2 MiB-aligned,
 * with transparent huge pages advised; NULL when out of memory. Over-maps
 * by 2 MiB and trims. Any thread (callers on the owner's take fault_now). */
#define REGION_ALIGN (2u << 20)
static uint8_t *map_aligned(size_t bytes)
{
    uint8_t *m = mmap(NULL, bytes + REGION_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)m + REGION_ALIGN - 1) & ~(uintptr_t)(REGION_ALIGN - 1));
    if (a > m)
        munmap(m, (size_t)(a - m));
    munmap(a + bytes, (size_t)(m + REGION_ALIGN - a));
    madvise(a, bytes, MADV_HUGEPAGE);
    return a;
}

/* ---- DeltaNet blocks: sequence slots and snapshots ----
 * A block holds one DeltaNet slot (state, then conv): a live sequence's,
 * or a snapshot's. Freed blocks wait on free_blocks for the next sequence
 * or snapshot until cache_deinit, as pages do. With the prefix store a
 * finished sequence stays (its block with it) and a new request needs a
 * block of its own and one per snapshot; from the allocator each came as
 * memory it had given back to the kernel, so every request faulted its
 * blocks in anew (docs/performance.md section 12). Blocks of BLOCK_MAP_MIN
 * bytes or more are mappings of their own with huge pages advised (a few
 * faults of 2 MiB when first touched); smaller ones come from
 * aligned_alloc. */

static size_t block_map_bytes(const cache *c)
{
    return (slot_bytes(c) + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
}

static void block_unmap(cache *c, uint8_t *b)
{
    if (c->blocks_mapped)
        munmap(b, block_map_bytes(c));
    else
        free(b);
}

/* bytes (a multiple of REGION_ALIGN) of new mapped memory, populated
 * zeroed: the kernel faults it in writable (MADV_POPULATE_WRITE: huge
 * pages cleared once, by the kernel, and no page-fault exits later), or,
 * on kernels without that, a memset. NULL when out of memory. Any thread. */
static uint8_t *map_zeroed(size_t bytes)
{
    uint8_t *b = map_aligned(bytes);
    if (!b)
        return NULL;
    bool done = false;
#ifdef MADV_POPULATE_WRITE
    /* 2 MiB at a time: populating holds the process's mmap lock for
     * reading, and an mmap or munmap elsewhere waits for it to let go */
    done = true;
    for (size_t off = 0; done && off < bytes; off += REGION_ALIGN)
        done = madvise(b + off, REGION_ALIGN, MADV_POPULATE_WRITE) == 0;
#endif
    if (!done)
        memset(b, 0, bytes);
    return b;
}

/* Bytes of one region of pages: 16 pages or 2 MiB, whichever is more, in
 * whole 2 MiB. */
static size_t region_size(const cache *c)
{
    const size_t stride = page_stride(c);
    const size_t want = stride * 16 > REGION_ALIGN ? stride * 16 : REGION_ALIGN;
    return (want + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
}

/* ---- Spares: DeltaNet blocks and page regions mapped ahead of need ----
 * While the prefix store grows, every request takes memory no sequence
 * ever held (the store keeps the old): its DeltaNet slot and snapshots,
 * and regions for its KV pages. Faulting in fresh memory is slow and
 * unpredictable here (a VM whose host backs guest memory lazily), and a
 * cold request waited for it at admission: in the reservation (each new
 * page's reference count is written when taken, so every huge page of a
 * new region faulted in there) and in its fresh slot and prompt-end
 * snapshot blocks (docs/performance.md section 12). A thread of the cache's
 * own keeps `want` blocks and `want_regions` regions mapped and populated,
 * so block_take and page_new find them ready. It makes them when asked
 * (cache_spares_refill: the scheduler asks when it goes idle), not at the
 * take: populating holds the mmap lock, and a refill started at admission
 * made that admission's own mmap wait. Spares are free memory: not in
 * reserved_bytes, n_blocks or n_regions until taken, and the thread makes
 * one only while what was made plus it fits the budget (blocks: budget /
 * (state + conv); regions: the pages the budget holds, in regions, plus
 * one), so mapped memory never outgrows what the budget could hold. */
#define SPARE_MAX 8
typedef struct cache_spares {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *ready[SPARE_MAX];          /* under mu: populated zeroed blocks, not in n_blocks */
    int n_ready;                        /* under mu */
    int want;                           /* blocks kept ready (<= SPARE_MAX) */
    int max_blocks;                     /* budget_bytes / (state + conv): blocks the pool can hold at once */
    int n_blocks;                       /* under mu: c->n_blocks as the owner thread last set it */
    uint8_t *ready_regions[SPARE_MAX];  /* under mu: populated zeroed page regions, not in n_regions */
    int n_ready_regions;                /* under mu */
    int want_regions;                   /* regions kept ready (0 without attention pages) */
    int max_regions;                    /* regions holding the pages the budget holds, plus one */
    int n_regions;                      /* under mu: c->n_regions as the owner thread last set it */
    size_t region_bytes;                /* c->region_bytes */
    uint64_t n_made, n_taken;           /* under mu: spare blocks made, and taken by block_take */
    uint64_t n_regions_made, n_regions_taken;   /* under mu: the same for regions (page_new) */
    bool failed;                        /* under mu: the last one found no memory; retried at the next refill */
    bool go;                            /* under mu: make spares up to want (cache_spares_refill) */
    bool stop;                          /* under mu: cache_deinit asks the thread to end */
} cache_spares;

static bool spare_block_due(const cache_spares *sp)
{
    return sp->n_ready < sp->want && sp->n_blocks + sp->n_ready < sp->max_blocks;
}

static bool spare_region_due(const cache_spares *sp)
{
    return sp->n_ready_regions < sp->want_regions && sp->n_regions + sp->n_ready_regions < sp->max_regions;
}

static void *spare_main(void *arg)
{
    cache *c = arg;
    cache_spares *sp = c->spares;
    pthread_mutex_lock(&sp->mu);
    for (;;) {
        while (!sp->stop && (!sp->go || sp->failed || (!spare_block_due(sp) && !spare_region_due(sp))))
            pthread_cond_wait(&sp->cv, &sp->mu);
        if (sp->stop)
            break;
        const bool block = spare_block_due(sp);    /* blocks first: the bigger wait */
        const size_t bytes = block ? block_map_bytes(c) : sp->region_bytes;
        pthread_mutex_unlock(&sp->mu);
        uint8_t *b = map_zeroed(bytes);         /* the slow part, with no lock held */
        pthread_mutex_lock(&sp->mu);
        if (!b)     /* out of memory: wait for the next refill to try again */
            sp->failed = true;
        else if (sp->stop || (block ? sp->n_ready : sp->n_ready_regions) >= SPARE_MAX)
            munmap(b, bytes);
        else if (block) {
            sp->ready[sp->n_ready++] = b;
            sp->n_made++;
        } else {
            sp->ready_regions[sp->n_ready_regions++] = b;
            sp->n_regions_made++;
        }
        sp->go = spare_block_due(sp) || spare_region_due(sp);
    }
    pthread_mutex_unlock(&sp->mu);
    return NULL;
}

int cache_spares_start(cache *c, int n, int n_regions)
{
    if (!c->blocks_mapped || c->spares || n <= 0)
        return 0;
    const uint64_t each = c->state_bytes + c->conv_bytes;
    cache_spares *sp = FAULT_OR(calloc(1, sizeof *sp));
    if (!sp)
        return -1;
    sp->want = n < SPARE_MAX ? n : SPARE_MAX;
    sp->max_blocks = (int)(c->budget_bytes / each < (uint64_t)INT32_MAX ? c->budget_bytes / each : INT32_MAX);
    sp->n_blocks = c->n_blocks;
    if (c->page_bytes && n_regions > 0) {
        if (c->region_bytes == 0)
            c->region_bytes = region_size(c);
        const uint64_t per = c->region_bytes / page_stride(c);
        const uint64_t max = c->budget_bytes / c->page_bytes / per + 1;
        sp->want_regions = n_regions < SPARE_MAX ? n_regions : SPARE_MAX;
        sp->max_regions = (int)(max < (uint64_t)INT32_MAX ? max : INT32_MAX);
        sp->region_bytes = c->region_bytes;
    }
    sp->n_regions = c->n_regions;
    sp->go = true;                      /* the first ones now, while nothing runs */
    if (pthread_mutex_init(&sp->mu, NULL) != 0)
        goto out_free;
    if (pthread_cond_init(&sp->cv, NULL) != 0)
        goto out_mutex;
    c->spares = sp;
    if (fault_now() || pthread_create(&sp->thread, NULL, spare_main, c) != 0)
        goto out_cond;
    return 0;
out_cond:
    c->spares = NULL;
    pthread_cond_destroy(&sp->cv);
out_mutex:
    pthread_mutex_destroy(&sp->mu);
out_free:
    free(sp);
    return -1;
}

/* End the spare thread and unmap what it kept ready. */
static void spares_stop(cache *c)
{
    cache_spares *sp = c->spares;
    if (!sp)
        return;
    pthread_mutex_lock(&sp->mu);
    sp->stop = true;
    pthread_cond_signal(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
    pthread_join(sp->thread, NULL);
    for (int i = 0; i < sp->n_ready; i++)
        munmap(sp->ready[i], block_map_bytes(c));
    for (int i = 0; i < sp->n_ready_regions; i++)
        munmap(sp->ready_regions[i], sp->region_bytes);
    pthread_cond_destroy(&sp->cv);
    pthread_mutex_destroy(&sp->mu);
    free(sp);
    c->spares = NULL;
}

/* A ready spare block (region: a ready page region), or NULL when none (or
 * no spare thread). */
static uint8_t *spare_take(cache *c, bool region)
{
    cache_spares *sp = c->spares;
    if (!sp)
        return NULL;
    pthread_mutex_lock(&sp->mu);
    uint8_t *b = NULL;
    if (region && sp->n_ready_regions > 0) {
        b = sp->ready_regions[--sp->n_ready_regions];
        sp->n_regions_taken++;
    } else if (!region && sp->n_ready > 0) {
        b = sp->ready[--sp->n_ready];
        sp->n_taken++;
    }
    pthread_mutex_unlock(&sp->mu);
    return b;
}

/* The thread's counts of blocks and regions made (for its budget), after
 * one was made or a spare taken; with refill, also have it make spares up
 * to its counts again (else it waits for cache_spares_refill). */
static void spare_count(cache *c, bool refill)
{
    cache_spares *sp = c->spares;
    if (!sp)
        return;
    pthread_mutex_lock(&sp->mu);
    sp->n_blocks = c->n_blocks;
    sp->n_regions = c->n_regions;
    if (refill && (spare_block_due(sp) || spare_region_due(sp))) {
        sp->go = true;
        sp->failed = false;
        pthread_cond_signal(&sp->cv);
    }
    pthread_mutex_unlock(&sp->mu);
}

void cache_spares_refill(cache *c)
{
    spare_count(c, true);
}

void cache_spares_get(const cache *c, cache_spares_info *info)
{
    memset(info, 0, sizeof *info);
    cache_spares *sp = c->spares;
    if (!sp)
        return;
    pthread_mutex_lock(&sp->mu);
    info->on = true;
    info->want = sp->want;
    info->ready = sp->n_ready;
    info->made = sp->n_made;
    info->taken = sp->n_taken;
    info->want_regions = sp->want_regions;
    info->ready_regions = sp->n_ready_regions;
    info->regions_made = sp->n_regions_made;
    info->regions_taken = sp->n_regions_taken;
    pthread_mutex_unlock(&sp->mu);
    info->ready_bytes = (uint64_t)info->ready * block_map_bytes(c) + (uint64_t)info->ready_regions * sp->region_bytes;
}

/* A block for a new sequence or snapshot: a recycled one, else a spare
 * made ahead (cache_spares_start), else a new one (the free list grown
 * first to hold every block there will be, so giving back never
 * allocates). Contents undefined, but *zero set when it is a spare or a
 * new mapping, which come zeroed (block_map_zeroed). NULL when out of
 * memory. The caller counts its bytes in the budget. */
static uint8_t *block_take(cache *c, bool *zero)
{
    *zero = false;
    if (c->n_free_blocks > 0)
        return c->free_blocks[--c->n_free_blocks];
    if (ptrs_room(&c->free_blocks, &c->cap_free_blocks, c->n_blocks, 8) != 0)
        return NULL;
    uint8_t *b = spare_take(c, false);
    if (!b)
        b = c->blocks_mapped ? (fault_now() ? NULL : map_zeroed(block_map_bytes(c))) : FAULT_OR(aligned_alloc(64, slot_bytes(c)));
    *zero = b && c->blocks_mapped;
    if (b) {
        c->n_blocks++;
        spare_count(c, false);
    }
    return b;
}

static void block_give(cache *c, uint8_t *b)
{
    c->free_blocks[c->n_free_blocks++] = b;     /* room: cap_free_blocks >= n_blocks */
}

void cache_deinit(cache *c)
{
    spares_stop(c);
    if (c->seqs)
        for (int i = 0; i < c->max_seqs; i++)
            cache_seq_free(c, i);
    for (int i = 0; i < c->n_regions; i++)        /* every page, free or not, lives in one */
        munmap(c->regions[i], c->region_bytes);
    free(c->regions);
    free(c->free_pages);
    for (int i = 0; i < c->n_free_blocks; i++)    /* every block, once the sequences are gone */
        block_unmap(c, c->free_blocks[i]);
    free(c->free_blocks);
    free(c->seqs);
    memset(c, 0, sizeof *c);
}

uint64_t cache_bytes_for(const cache *c, int n_tokens)
{
    return memplan_seq_reserved_bytes(&c->plan, n_tokens);
}

/* A live sequence in a free entry of c->seqs, with a page table and a
 * DeltaNet block: zeroed (a new sequence) or left as it was (a fork, which
 * copies its source's over it). -1 when none is free, over budget or out
 * of memory. */
static int seq_new(cache *c, bool zero)
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
    s->pages = FAULT_OR(calloc((size_t)(c->max_pages ? c->max_pages : 1), sizeof(uint8_t *)));
    /* A recycled block if there is one (block_take). Zeroed by writing: the
     * recurrent step reads the state before it writes it, and on untouched
     * (calloc'd, mmap'd) pages that read maps the zero page and the write
     * then copies it, with a TLB flush across the threads (what that cost:
     * docs/performance.md section 12). A new mapping the kernel populated
     * is zero already. */
    bool zeroed;
    uint8_t *slot = s->pages ? block_take(c, &zeroed) : NULL;
    if (!s->pages || !slot) {
        free(s->pages);
        memset(s, 0, sizeof *s);
        return -1;
    }
    if (zero && !zeroed)
        memset(slot, 0, slot_bytes(c));
    s->state = slot;
    s->conv = (float *)(slot + ((c->state_bytes + 63) & ~(uint64_t)63));
    s->live = true;
    c->reserved_bytes += c->conv_bytes + c->state_bytes;
    c->n_live++;
    INVARIANT(cache_check(c));
    return id;
}

int cache_seq_new(cache *c)
{
    return seq_new(c, true);
}

/* Release sequence id's pages and page table and mark it free; its block
 * is the caller's (given back, or kept as a snapshot). */
static uint8_t *seq_release(cache *c, int id)
{
    cache_seq *s = &c->seqs[id];
    uint8_t *block = (uint8_t *)s->state;
    for (int i = 0; i < s->n_pages; i++)     /* recycled when no other sequence holds it */
        page_unref(c, s->pages[i]);
    c->reserved_bytes -= c->conv_bytes + c->state_bytes;
    free(s->pages);
    memset(s, 0, sizeof *s);
    c->n_live--;
    return block;
}

void cache_seq_free(cache *c, int id)
{
    if (id < 0 || id >= c->max_seqs || !c->seqs[id].live)
        return;
    block_give(c, seq_release(c, id));         /* for the next sequence or snapshot */
    INVARIANT(cache_check(c));
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
 * piece meant four page walks (measured: docs/performance.md section 12).
 * Regions stay until cache_deinit, as free pages always did. */
static uint8_t *page_new(cache *c)
{
    const size_t stride = page_stride(c);
    if (c->n_regions == 0 || c->region_used + stride > c->region_bytes) {
        if (c->region_bytes == 0)
            c->region_bytes = region_size(c);
        if (ptrs_room(&c->regions, &c->cap_regions, c->n_regions, 16) != 0)
            return NULL;
        uint8_t *a = spare_take(c, true);      /* populated ahead (cache_spares_start), else new */
        if (!a)
            a = fault_now() ? NULL : map_aligned(c->region_bytes);
        if (!a)
            return NULL;
        c->regions[c->n_regions++] = a;
        c->region_used = 0;
        spare_count(c, false);
    }
    uint8_t *p = c->regions[c->n_regions - 1] + c->region_used;
    c->region_used += stride;
    return p;
}

/* Pages s lacks to hold n_tokens. */
static int pages_short(const cache *c, const cache_seq *s, int n_tokens)
{
    if (c->page_bytes == 0)
        return 0;
    const int need = (n_tokens + c->page_tokens - 1) / c->page_tokens;
    return need > s->n_pages ? need - s->n_pages : 0;
}

int cache_pages_short(const cache *c, int id, int n_tokens)
{
    const cache_seq *s = cache_get_const(c, id);
    return s ? pages_short(c, s, n_tokens) : 0;
}

int cache_make_room(cache *c, int n_pages)
{
    if (n_pages <= 0)
        return 0;
    if (c->reserved_bytes + (uint64_t)n_pages * c->page_bytes > c->budget_bytes)
        return -1;
    const int n_new = n_pages - c->n_free_pages;
    if (n_new <= 0)
        return 0;
    /* grow the free list first, to hold every page that will exist, so
     * freeing never allocates */
    const int carved = c->n_pages_carved + n_new;
    if (carved > c->cap_free_pages) {
        uint8_t **fp = FAULT_OR(realloc(c->free_pages, (size_t)carved * sizeof *fp));
        if (!fp)
            return -1;
        c->free_pages = fp;
        c->cap_free_pages = carved;
    }
    /* New pages go under the recycled ones, the first carved nearest the
     * top: reservations take recycled pages first, then new ones in the
     * order they were carved (ascending addresses within a region). */
    memmove(c->free_pages + n_new, c->free_pages, (size_t)c->n_free_pages * sizeof *c->free_pages);
    int got = 0;
    for (; got < n_new; got++) {
        uint8_t *p = page_new(c);
        if (!p)
            break;
        c->free_pages[n_new - 1 - got] = p;
    }
    if (got < n_new)    /* out of memory: keep what was carved, free, and close the gap */
        memmove(c->free_pages, c->free_pages + n_new - got,
                (size_t)(c->n_free_pages + got) * sizeof *c->free_pages);
    c->n_free_pages += got;
    c->n_pages_carved += got;
    return got == n_new ? 0 : -1;
}

int cache_reserve(cache *c, int id, int n_tokens)
{
    cache_seq *s = cache_get(c, id);
    if (!s || n_tokens > c->n_ctx)
        return -1;
    const int k = pages_short(c, s, n_tokens);
    if (k == 0)
        return 0;
    if (cache_make_room(c, k) != 0)
        return -1;
    for (int i = 0; i < k; i++)         /* cannot fail now */
        s->pages[s->n_pages++] = page_take(c);
    INVARIANT_STEP(cache_check(c));
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Sharing: forks, truncation, DeltaNet snapshots                         */
/* ---------------------------------------------------------------------- */

int cache_seq_fork(cache *c, int src, int n_tokens)
{
    const cache_seq *a = cache_get_const(c, src);
    if (!a || n_tokens < 0 || n_tokens > a->n_past)
        return -1;
    const int pt = c->page_tokens;
    const int n_full = c->page_bytes ? n_tokens / pt : 0;
    const bool part = c->page_bytes && n_tokens % pt != 0;
    /* the copy of a partly filled page first: after cache_seq_new the
     * budget has the slot in it */
    if (part && cache_make_room(c, 1) != 0)
        return -1;
    if (part && c->reserved_bytes + c->conv_bytes + c->state_bytes + c->page_bytes > c->budget_bytes)
        return -1;
    const int id = seq_new(c, false);      /* its block is overwritten with src's below */
    if (id < 0)
        return -1;
    cache_seq *s = &c->seqs[id];
    a = &c->seqs[src];
    for (int i = 0; i < n_full; i++) {
        s->pages[i] = a->pages[i];
        (*page_refs(c, a->pages[i]))++;
    }
    s->n_pages = n_full;
    if (part) {     /* copy-on-write: the tokens past n_tokens in it are never read */
        uint8_t *p = page_take(c);
        memcpy(p, a->pages[n_full], (size_t)c->page_bytes);
        s->pages[s->n_pages++] = p;
    }
    memcpy(s->state, a->state, slot_bytes(c));
    s->n_past = n_tokens;
    INVARIANT(cache_check(c));
    return id;
}

int cache_seq_truncate(cache *c, int id, int n_tokens)
{
    cache_seq *s = cache_get(c, id);
    if (!s || n_tokens < 0 || n_tokens > s->n_past)
        return -1;
    if (c->page_bytes == 0) {
        s->n_past = n_tokens;
        return 0;
    }
    const int pt = c->page_tokens;
    const int keep = (n_tokens + pt - 1) / pt;          /* pages holding tokens below n_tokens */
    const int wr = n_tokens / pt;                       /* the page the next token goes to */
    const bool cow = n_tokens % pt != 0 && *page_refs(c, s->pages[wr]) > 1;
    if (cow) {      /* room for the copy, counting the pages released below */
        int freed = 0;
        for (int i = keep; i < s->n_pages; i++)
            freed += *page_refs(c, s->pages[i]) == 1;
        if (c->reserved_bytes + c->page_bytes > c->budget_bytes + (uint64_t)freed * c->page_bytes)
            return -1;
    }
    while (s->n_pages > keep)
        page_unref(c, s->pages[--s->n_pages]);
    if (cow) {
        if (cache_make_room(c, 1) != 0)     /* only out of memory now: the pages are released, tokens kept */
            return -1;
        uint8_t *p = page_take(c);
        memcpy(p, s->pages[wr], (size_t)c->page_bytes);
        page_unref(c, s->pages[wr]);
        s->pages[wr] = p;
    }
    s->n_past = n_tokens;
    INVARIANT(cache_check(c));
    return 0;
}

int cache_seq_shared_pages(const cache *c, int id)
{
    const cache_seq *s = cache_get_const(c, id);
    int n = 0;
    for (int i = 0; s && i < s->n_pages; i++)
        n += *page_refs_const(c, s->pages[i]) > 1;
    return n;
}

cache_snap *cache_snap_new(cache *c)
{
    if (c->reserved_bytes + c->state_bytes + c->conv_bytes > c->budget_bytes)
        return NULL;
    cache_snap *s = FAULT_OR(calloc(1, sizeof *s));
    bool zeroed;
    uint8_t *slot = s ? block_take(c, &zeroed) : NULL;
    if (!slot) {
        free(s);
        return NULL;
    }
    s->slot = slot;
    s->n_tokens = -1;
    c->reserved_bytes += c->state_bytes + c->conv_bytes;
    c->n_snaps++;
    return s;
}

void cache_snap_free(cache *c, cache_snap *s)
{
    if (!s)
        return;
    block_give(c, s->slot);
    free(s);
    c->reserved_bytes -= c->state_bytes + c->conv_bytes;
    c->n_snaps--;
}

cache_snap *cache_seq_into_snap(cache *c, int id)
{
    const cache_seq *q = cache_get_const(c, id);
    cache_snap *s = q ? FAULT_OR(calloc(1, sizeof *s)) : NULL;
    if (!s)
        return NULL;
    s->n_tokens = q->n_past;
    s->slot = seq_release(c, id);       /* its bytes move from the sequence to the snapshot */
    c->reserved_bytes += c->state_bytes + c->conv_bytes;
    c->n_snaps++;
    INVARIANT(cache_check(c));
    return s;
}

int cache_snap_save(cache *c, int id, cache_snap *s)
{
    const cache_seq *q = cache_get_const(c, id);
    if (!q || !s)
        return -1;
    memcpy(s->slot, q->state, slot_bytes(c));
    s->n_tokens = q->n_past;
    return 0;
}

int cache_snap_restore(cache *c, int id, const cache_snap *s)
{
    cache_seq *q = cache_get(c, id);
    if (!q || !s || q->n_past != s->n_tokens)
        return -1;
    memcpy(q->state, s->slot, slot_bytes(c));
    return 0;
}

const char *cache_broken(const cache *c)
{
    if (c->max_seqs > 0 && !c->seqs)
        return "seqs is allocated";
    uint64_t reserved = 0;
    int n_live = 0, n_pages = 0;
    const size_t conv_off = (size_t)((c->state_bytes + 63) & ~(uint64_t)63);
    for (int i = 0; i < c->max_seqs; i++) {
        const cache_seq *s = &c->seqs[i];
        if (!s->live) {
            if (s->n_past || s->n_pages || s->pages || s->state || s->conv)
                return "a sequence that is not live is all zero";
            continue;
        }
        n_live++;
        if (!s->pages || !s->state || (uint8_t *)s->conv != (uint8_t *)s->state + conv_off)
            return "a live sequence has its page table and its slot (state, then conv)";
        if (s->n_pages < 0 || s->n_pages > c->max_pages || (c->page_bytes == 0 && s->n_pages != 0))
            return "a live sequence holds 0..max_pages pages (none without attention)";
        if (s->n_past < 0 || s->n_past > c->n_ctx ||
            (c->page_bytes && s->n_past > s->n_pages * c->page_tokens))
            return "a live sequence's tokens fit its pages and n_ctx";
        for (int p = 0; p < s->n_pages; p++)
            if (!s->pages[p])
                return "a live sequence's pages are not NULL";
        n_pages += s->n_pages;
        for (int p = 0; p < s->n_pages; p++)
            if (*page_refs_const(c, s->pages[p]) < 1)
                return "a page a live sequence holds has a count of at least 1";
        reserved += c->state_bytes + c->conv_bytes;
    }
    /* every carved page, region by region: counts add up to the holders */
    int n_held = 0, n_carved = 0;
    int64_t n_refs = 0;
    if (c->page_bytes && c->n_regions) {
        const size_t stride = page_stride(c), per = c->region_bytes / stride;
        for (int r = 0; r < c->n_regions; r++) {
            const size_t k = r == c->n_regions - 1 ? c->region_used / stride : per;
            for (size_t i = 0; i < k; i++) {
                const int32_t n = *page_refs_const(c, c->regions[r] + i * stride);
                if (n < 0)
                    return "page counts are not negative";
                n_held += n > 0;
                n_refs += n;
                n_carved++;
            }
        }
    }
    if (n_carved != c->n_pages_carved)
        return "the regions hold the carved pages";
    if (n_refs != n_pages)
        return "page counts sum to the pages the live sequences hold";
    if (n_held != c->n_pages_used)
        return "n_pages_used counts the held pages";
    if (c->n_snaps < 0)
        return "n_snaps is not negative";
    reserved += (uint64_t)n_held * c->page_bytes + (uint64_t)c->n_snaps * (c->state_bytes + c->conv_bytes);
    if (n_live != c->n_live || n_live > c->max_seqs)
        return "n_live counts the live sequences";
    if (reserved != c->reserved_bytes)
        return "reserved_bytes is the sum over live sequences";
    if (c->reserved_bytes > c->budget_bytes)
        return "reserved_bytes <= budget_bytes";
    if (c->n_free_pages < 0 || c->n_pages_used + c->n_free_pages != c->n_pages_carved)
        return "used plus free pages are the carved pages";
    if (c->n_pages_carved > c->cap_free_pages)
        return "the free list can hold every carved page";
    for (int p = 0; p < c->n_free_pages; p++)
        if (!c->free_pages[p])
            return "free pages are not NULL";
        else if (*page_refs_const(c, c->free_pages[p]) != 0)
            return "free pages have a count of 0";
    if (c->n_free_blocks < 0 || c->n_live + c->n_snaps + c->n_free_blocks != c->n_blocks)
        return "every DeltaNet block is a live sequence's, a snapshot's or free";
    if (c->n_blocks > c->cap_free_blocks && c->n_blocks > 0)
        return "the free list can hold every DeltaNet block";
    for (int b = 0; b < c->n_free_blocks; b++)
        if (!c->free_blocks[b])
            return "free DeltaNet blocks are not NULL";
    return NULL;
}

bool cache_check(const cache *c)
{
    const char *why = cache_broken(c);
    if (why)
        fprintf(stderr, "cache invariant broken: %s\n", why);
    return why == NULL;
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
    return dot_row_fast(c->kv_type, row, x, n);
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

/* test_cache.c - the cache manager (engine/cache.c) on its own: DeltaNet
 * slots recycled zeroed, snapshot blocks recycled and handed over, spare blocks mapped ahead by a thread and
 * kept within the budget, a bf16 state at half the bytes, KV pages carved
 * from regions, reservations that
 * change everything or nothing, also when memory runs out at any of their
 * allocations (fault.h), and the invariant checker cache_broken, which must
 * hold through normal use and notice each kind of broken pool. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "fault.h"
#include "gguf.h"
#include "test.h"

/* Attention and DeltaNet: pages of 16 tokens x 1 layer x (K, V) x 2 heads x
 * 16 dims x 4 bytes = 4 KiB; per sequence a recurrent state of 1 layer x 2
 * heads x 16 x 16 x 4 bytes = 2 KiB and a conv window of 3 rows x (2 x 16 +
 * 2 x 16) channels x 4 bytes = 768 bytes. */
static const cache_layout hybrid = { .n_attn = 1, .n_kv = 2, .head_dim = 16, .n_dnet = 1, .conv_kernel = 4,
                                     .conv_dim = 64, .n_v = 2, .d_v = 16, .d_k = 16, .page_tokens = 16,
                                     .n_ctx = 256, .max_seqs = 4, .budget_bytes = 1u << 20 };

/* A pool in use: sequence a holds 40 tokens in 3 pages, b 16 tokens in 1,
 * and a freed sequence left 2 pages and its slot on the free lists. */
static int busy_pool(cache *c, int *a, int *b)
{
    if (cache_init(c, &hybrid) != 0)
        return -1;
    const int gone = cache_seq_new(c);
    *a = cache_seq_new(c);
    *b = cache_seq_new(c);
    if (gone < 0 || *a < 0 || *b < 0 || cache_reserve(c, gone, 32) != 0 || cache_reserve(c, *a, 40) != 0 ||
        cache_reserve(c, *b, 16) != 0)
        return -1;
    cache_seq_free(c, gone);
    cache_get(c, *a)->n_past = 40;
    cache_get(c, *b)->n_past = 16;
    return 0;
}

TEST(test_cache_invariants_hold_through_new_reserve_and_free)
{
    cache c;
    int a, b;
    CHECK(busy_pool(&c, &a, &b) == 0);
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    CHECK(c.n_pages_used == 4 && c.n_free_pages == 2 && c.n_pages_carved == 6 && c.n_free_blocks == 1 &&
          c.n_blocks == 3);
    CHECK(cache_reserve(&c, b, 100) == 0 && c.n_free_pages == 0 && c.n_pages_carved == 10);
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    cache_seq_free(&c, a);
    cache_seq_free(&c, b);
    CHECK(c.reserved_bytes == 0 && c.n_pages_used == 0 && c.n_free_pages == 10);
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    cache_deinit(&c);
}

/* Each corruption of a copy of a good pool is caught, and named. */
TEST(test_cache_check_catches_each_broken_invariant)
{
    cache c;
    int a, b;
    CHECK(busy_pool(&c, &a, &b) == 0);
    CHECK(cache_broken(&c) == NULL);
    cache_seq seqs[4];
    uint8_t *pages[16];
    struct { const char *what, *says; } cases[] = {
        { "reserved bytes one more", "reserved_bytes is the sum" },
        { "budget below the reservations", "budget_bytes" },
        { "a page more in use", "n_pages_used" },
        { "a free page lost", "carved" },
        { "free list too short for every page", "free list can hold" },
        { "a sequence more counted live", "n_live" },
        { "a slot both live and free", "DeltaNet block is" },
        { "a sequence's page count one more", "sum" },
        { "a sequence past its pages", "tokens fit its pages" },
        { "a sequence past n_ctx", "tokens fit its pages" },
        { "a NULL page", "pages are not NULL" },
        { "a conv ring away from its state", "slot (state, then conv)" },
        { "a dead sequence with tokens", "all zero" },
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int k = 0; k < n_cases; k++) {
        cache bad = c;
        memcpy(seqs, c.seqs, sizeof seqs);
        bad.seqs = seqs;
        cache_seq *sa = &seqs[a];
        memcpy(pages, sa->pages, (size_t)sa->n_pages * sizeof *pages);
        sa->pages = pages;
        switch (k) {
        case 0: bad.reserved_bytes++; break;
        case 1: bad.budget_bytes = bad.reserved_bytes - 1; break;
        case 2: bad.n_pages_used++; break;
        case 3: bad.n_free_pages--; break;
        case 4: bad.cap_free_pages = bad.n_pages_carved - 1; break;
        case 5: bad.n_live++; break;
        case 6: bad.n_free_blocks++; break;
        case 7: pages[sa->n_pages] = pages[0]; sa->n_pages++; break;
        case 8: sa->n_past = sa->n_pages * bad.page_tokens + 1; break;
        case 9: sa->n_past = bad.n_ctx + 1; break;
        case 10: pages[1] = NULL; break;
        case 11: sa->conv++; break;
        case 12:
            for (int i = 0; i < bad.max_seqs; i++)
                if (!seqs[i].live) {
                    seqs[i].n_past = 1;
                    break;
                }
            break;
        }
        const char *why = cache_broken(&bad);
        CHECK_MSG(why != NULL, "%s: not noticed", cases[k].what);
        CHECK_MSG(strstr(why, cases[k].says), "%s: noticed as '%s', expected '%s'", cases[k].what, why,
                  cases[k].says);
    }
    CHECK(cache_broken(&c) == NULL);        /* the copies shared nothing that was changed */
    cache_deinit(&c);
}

/* A reservation over the budget changes nothing: not the sequence's pages,
 * not the pool's counts; room made for several sequences at once is either
 * all there or not made. */
TEST(test_cache_reservations_change_everything_or_nothing)
{
    cache c;
    CHECK(cache_init(&c, &hybrid) == 0);
    CHECK(c.page_bytes == 4096 && c.state_bytes == 2048 && c.conv_bytes == 768);
    c.budget_bytes = 2 * (2048 + 768) + 6 * 4096;       /* 2 slots (state + conv) + 6 pages */
    const int a = cache_seq_new(&c), b = cache_seq_new(&c);
    CHECK(a >= 0 && b >= 0 && cache_reserve(&c, a, 20) == 0);
    const uint64_t reserved = c.reserved_bytes;
    CHECK(cache_reserve(&c, b, 5 * 16) == -1);                  /* 5 pages, 4 left */
    CHECK(cache_get(&c, b)->n_pages == 0 && c.reserved_bytes == reserved && c.n_pages_used == 2);
    CHECK(cache_pages_short(&c, a, 40) == 1 && cache_pages_short(&c, b, 40) == 3);
    CHECK(cache_make_room(&c, 5) == -1 && c.n_free_pages == 0);
    CHECK(cache_make_room(&c, 4) == 0 && c.n_free_pages == 4 && c.reserved_bytes == reserved);
    CHECK(cache_reserve(&c, a, 40) == 0 && cache_reserve(&c, b, 40) == 0 && c.n_free_pages == 0);
    CHECK(c.reserved_bytes == c.budget_bytes);
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    cache_deinit(&c);
}

/* A freed sequence's DeltaNet slot (state and conv ring) goes to the next
 * sequence, zeroed (a new sequence starts from S = 0 and an empty conv
 * window); live sequences' slots never overlap; the budget counts live
 * sequences only. */
TEST(test_cache_recycles_deltanet_slots_zeroed_and_apart)
{
    cache_layout l = { .n_dnet = 2, .conv_kernel = 4, .conv_dim = 24, .n_v = 2, .d_v = 8, .d_k = 8,
                       .page_tokens = 16, .n_ctx = 64, .max_seqs = 3 };
    cache c;
    CHECK(cache_init(&c, &l) == 0);
    CHECK(c.state_bytes == 2 * 2 * 8 * 8 * 4 && c.conv_bytes > 0);
    int a = cache_seq_new(&c), b = cache_seq_new(&c);
    CHECK(a >= 0 && b >= 0);
    cache_seq *sa = cache_get(&c, a), *sb = cache_get(&c, b);
    const uintptr_t a0 = (uintptr_t)sa->state, a1 = (uintptr_t)sa->conv + c.conv_bytes;
    const uintptr_t b0 = (uintptr_t)sb->state, b1 = (uintptr_t)sb->conv + c.conv_bytes;
    CHECK(a1 <= b0 || b1 <= a0);
    CHECK((uintptr_t)sa->conv >= a0 + c.state_bytes);
    memset(sa->state, 0x7f, c.state_bytes);
    memset(sa->conv, 0x7f, c.conv_bytes);
    void *old_state = sa->state;
    cache_seq_free(&c, a);
    CHECK(c.reserved_bytes == c.state_bytes + c.conv_bytes);
    int a2 = cache_seq_new(&c);
    CHECK(a2 >= 0);
    cache_seq *s2 = cache_get(&c, a2);
    CHECK(s2->state == old_state);          /* recycled */
    int nz = 0;
    for (uint64_t i = 0; i < c.state_bytes / 4; i++)
        nz += ((const float *)s2->state)[i] != 0.0f;
    for (uint64_t i = 0; i < c.conv_bytes / 4; i++)
        nz += s2->conv[i] != 0.0f;
    CHECK_MSG(nz == 0, "%d numbers of a recycled slot not zeroed", nz);
    cache_seq_free(&c, a2);
    cache_seq_free(&c, b);
    CHECK(c.reserved_bytes == 0 && c.n_live == 0);
    cache_deinit(&c);
}

/* Snapshots and sequences draw their DeltaNet blocks from one free list:
 * a freed snapshot's block goes to the next snapshot or sequence (the
 * prefix store takes one or two a request; fresh memory each time cost
 * page faults), a sequence turned into a snapshot hands over its block
 * with its state in it (no copy, the pool's bytes unchanged), and
 * restoring that snapshot gives the state back. Run on a small slot (from
 * the allocator) and on one of 9 MiB (its own 2 MiB-aligned mapping). */
static void check_snapshot_blocks(const cache_layout *l, bool mapped)
{
    cache c;
    CHECK(cache_init(&c, l) == 0);
    CHECK(c.blocks_mapped == mapped);
    const uint64_t each = c.state_bytes + c.conv_bytes;
    const int a = cache_seq_new(&c);
    CHECK(a >= 0 && cache_reserve(&c, a, 20) == 0);
    cache_seq *sa = cache_get(&c, a);
    sa->n_past = 20;
    float *st = sa->state;
    for (uint64_t i = 0; i < c.state_bytes / 4; i++)
        st[i] = (float)(i % 1000) + 0.5f;
    sa->conv[0] = 7.0f;
    CHECK(!mapped || ((uintptr_t)sa->state & ((2u << 20) - 1)) == 0);
    cache_snap *s1 = cache_snap_new(&c);
    CHECK(s1 && cache_snap_save(&c, a, s1) == 0 && s1->n_tokens == 20 && c.n_blocks == 2);
    uint8_t *b1 = s1->slot;
    cache_snap_free(&c, s1);
    CHECK(c.n_free_blocks == 1 && c.reserved_bytes == each + (uint64_t)c.n_pages_used * c.page_bytes);
    cache_snap *s2 = cache_snap_new(&c);
    CHECK(s2 && s2->slot == b1 && c.n_blocks == 2 && c.n_free_blocks == 0);     /* recycled */
    cache_snap_free(&c, s2);
    void *state_a = sa->state;
    const uint64_t before = c.reserved_bytes - (uint64_t)c.n_pages_used * c.page_bytes;
    cache_snap *end = cache_seq_into_snap(&c, a);
    CHECK(end && end->slot == state_a && end->n_tokens == 20);
    CHECK(c.n_live == 0 && c.n_snaps == 1 && c.n_pages_used == 0 && c.reserved_bytes == before);
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    const int b = cache_seq_new(&c);
    CHECK(b >= 0 && cache_get(&c, b)->state == b1 && c.n_blocks == 2);         /* the free block again */
    CHECK(cache_reserve(&c, b, 20) == 0);
    cache_get(&c, b)->n_past = 20;
    CHECK(cache_snap_restore(&c, b, end) == 0);
    const float *sb = cache_get(&c, b)->state;
    int bad = 0;
    for (uint64_t i = 0; i < c.state_bytes / 4; i++)
        bad += sb[i] != (float)(i % 1000) + 0.5f;
    CHECK_MSG(bad == 0 && cache_get(&c, b)->conv[0] == 7.0f, "%d state numbers not restored", bad);
    cache_snap_free(&c, end);
    cache_seq_free(&c, b);
    CHECK(c.reserved_bytes == 0 && c.n_snaps == 0 && c.n_free_blocks == c.n_blocks && c.n_blocks == 2);
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    cache_deinit(&c);
}

TEST(test_cache_snapshots_and_sequences_recycle_one_block_list)
{
    check_snapshot_blocks(&hybrid, false);
    /* 9 layers x 16 heads x 128 x 128 x 4 bytes: 9 MiB of state (16 key heads: conv 2 x 16 x 128 + 16 x 128) */
    cache_layout big = { .n_attn = 1, .n_kv = 2, .head_dim = 16, .n_dnet = 9, .conv_kernel = 4, .conv_dim = 6144,
                         .n_v = 16, .d_v = 128, .d_k = 128, .page_tokens = 16, .n_ctx = 256, .max_seqs = 4,
                         .budget_bytes = 64u << 20 };
    check_snapshot_blocks(&big, true);
}

/* Wait (up to 20 s: the spare thread faults in 10 MiB blocks, slow on a
 * loaded VM) until the spare thread has `ready` blocks and all its regions
 * ready; false if it never does. */
static bool spares_reach(const cache *c, int ready)
{
    const struct timespec nap = { 0, 5 * 1000 * 1000 };
    for (int i = 0; i < 4000; i++) {
        cache_spares_info si;
        cache_spares_get(c, &si);
        if (si.ready == ready && si.ready_regions == si.want_regions)
            return true;
        nanosleep(&nap, NULL);
    }
    return false;
}

/* Spares (cache_spares_start): with mapped blocks a thread keeps two
 * populated blocks and a region of pages ready; a new sequence and a
 * snapshot take the blocks zeroed, a reservation the region,
 * huge-page aligned, without their bytes in the pool until taken; the
 * thread makes the next ones only when asked (cache_spares_refill, when
 * the scheduler is idle), and never more blocks than the budget holds
 * at once (64 MiB / 10,100,736 bytes a block: 6); small blocks get none. */
TEST(test_cache_spare_blocks_and_regions_are_taken_first_and_stay_within_the_budget)
{
    /* the 9-layer shape of the test above: 9 MiB state + 648 KiB conv a block */
    const cache_layout big = { .n_attn = 1, .n_kv = 2, .head_dim = 16, .n_dnet = 9, .conv_kernel = 4,
                               .conv_dim = 6144, .n_v = 16, .d_v = 128, .d_k = 128, .page_tokens = 16,
                               .n_ctx = 256, .max_seqs = 8, .budget_bytes = 64u << 20 };
    cache c;
    CHECK(cache_init(&c, &big) == 0 && c.blocks_mapped);
    const uint64_t each = c.state_bytes + c.conv_bytes;
    CHECK(each == 10100736u && (64u << 20) / each == 6);
    CHECK(cache_spares_start(&c, 2, 1) == 0);
    CHECK(spares_reach(&c, 2));
    cache_spares_info si;
    cache_spares_get(&c, &si);
    CHECK(si.on && si.want == 2 && si.taken == 0 && si.made == 2);
    CHECK(si.want_regions == 1 && si.ready_regions == 1 && si.regions_made == 1 && si.regions_taken == 0);
    /* blocks: 10,100,736 + 64 rounded up to 2 MiB; a region of 4 KiB pages: 2 MiB */
    CHECK(si.ready_bytes == 2 * (uint64_t)(10u << 20) + (2u << 20));
    CHECK(c.reserved_bytes == 0 && c.n_blocks == 0 && c.n_regions == 0);   /* free memory, outside the pool */
    const int a = cache_seq_new(&c);
    CHECK(a >= 0 && c.n_blocks == 1 && c.reserved_bytes == each);
    const uint8_t *st = cache_get(&c, a)->state;
    CHECK(((uintptr_t)st & ((2u << 20) - 1)) == 0);
    int nonzero = 0;
    for (uint64_t i = 0; i < each; i++)
        nonzero += st[i] != 0;
    CHECK_MSG(nonzero == 0, "a spare came with %d nonzero bytes", nonzero);
    /* its pages come from the ready region */
    CHECK(cache_reserve(&c, a, 40) == 0 && c.n_regions == 1 && ((uintptr_t)c.regions[0] & ((2u << 20) - 1)) == 0);
    cache_spares_get(&c, &si);
    CHECK(si.regions_taken == 1 && si.ready_regions == 0);
    CHECK(c.reserved_bytes == each + 3 * c.page_bytes);
    cache_snap *sn[5] = { 0 };
    sn[0] = cache_snap_new(&c);
    CHECK(sn[0] && c.n_blocks == 2 && c.reserved_bytes == 2 * each + 3 * c.page_bytes);
    const struct timespec settle = { 0, 200 * 1000 * 1000 };
    nanosleep(&settle, NULL);
    cache_spares_get(&c, &si);
    CHECK_MSG(si.taken == 2 && si.ready == 0 && si.made == 2 && si.regions_made == 1,
              "%llu spares taken of 2 blocks, %d ready, %llu made", (unsigned long long)si.taken, si.ready,
              (unsigned long long)si.made);  /* none made on the way */
    cache_spares_refill(&c);
    CHECK(spares_reach(&c, 2));                              /* made again when asked (idle) */
    cache_spares_get(&c, &si);
    CHECK(si.made == 4 && si.regions_made == 2 && si.ready_regions == 1);
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    /* four blocks in use: 4 + 2 ready = 6, the budget's; a fifth leaves room for one spare */
    sn[1] = cache_snap_new(&c);
    sn[2] = cache_snap_new(&c);
    CHECK(sn[1] && sn[2] && c.n_blocks == 4);
    cache_spares_refill(&c);
    CHECK(spares_reach(&c, 2));
    sn[3] = cache_snap_new(&c);
    CHECK(sn[3] && c.n_blocks == 5);
    cache_spares_refill(&c);
    CHECK(spares_reach(&c, 1));
    nanosleep(&settle, NULL);
    cache_spares_get(&c, &si);
    CHECK_MSG(si.ready == 1 && c.n_blocks + si.ready == 6, "%d blocks and %d spares over a budget of 6", c.n_blocks,
              si.ready);
    sn[4] = cache_snap_new(&c);         /* the sixth: the last spare, and no more made */
    CHECK(sn[4] && c.n_blocks == 6);
    cache_spares_refill(&c);
    nanosleep(&settle, NULL);
    cache_spares_get(&c, &si);
    CHECK(si.ready == 0 && si.taken == 6 && si.made == 6);
    CHECK(si.ready_regions == 1 && si.regions_made == 2);    /* regions have their own room */
    CHECK(cache_snap_new(&c) == NULL);  /* over budget, as without spares */
    CHECK_MSG(cache_broken(&c) == NULL, "%s", cache_broken(&c));
    for (int i = 0; i < 5; i++)
        cache_snap_free(&c, sn[i]);
    cache_seq_free(&c, a);
    CHECK(c.reserved_bytes == 0 && c.n_free_blocks == 6 && c.n_free_pages == 3);
    const int b = cache_seq_new(&c);    /* recycled first: no spare taken */
    cache_spares_get(&c, &si);
    CHECK(b >= 0 && c.n_blocks == 6 && si.taken == 6);
    cache_seq_free(&c, b);
    cache_deinit(&c);                   /* ends the thread, unmaps every block */

    cache small;
    CHECK(cache_init(&small, &hybrid) == 0 && !small.blocks_mapped);
    CHECK(cache_spares_start(&small, 2, 1) == 0);
    cache_spares_get(&small, &si);
    CHECK(!si.on && si.ready == 0);
    cache_deinit(&small);

    /* out of memory for the thread's record: -1, and the cache as without spares */
    CHECK(cache_init(&c, &big) == 0);
    fault_inject(1);
    CHECK(cache_spares_start(&c, 2, 0) == -1);
    fault_inject(0);
    cache_spares_get(&c, &si);
    CHECK(!si.on && c.spares == NULL);
    cache_deinit(&c);
}

/* A bf16 recurrent state takes 2 bytes a number (2 layers x 2 heads x
 * 8 x 8 here), the conv window stays 4, and the budget and /stats counts
 * follow; the planner's layout says the same. */
TEST(test_cache_bf16_state_halves_the_recurrent_bytes_only)
{
    cache_layout l = { .n_dnet = 2, .conv_kernel = 4, .conv_dim = 32, .n_v = 2, .d_v = 8, .d_k = 8,
                       .page_tokens = 16, .n_ctx = 64, .max_seqs = 3 };
    cache c32, c16;
    CHECK(cache_init(&c32, &l) == 0);
    l.state_type = GGML_BF16;
    CHECK(cache_init(&c16, &l) == 0);
    CHECK(c32.state_bytes == 2 * 2 * 8 * 8 * 4 && c16.state_bytes == 2 * 2 * 8 * 8 * 2);
    CHECK(c16.conv_bytes == c32.conv_bytes && c16.conv_bytes == 2 * 3 * 32 * 4);
    CHECK(c16.state_type == GGML_BF16 && c16.state_es == 2 && c32.state_es == 4);
    const int s = cache_seq_new(&c16);
    CHECK(s >= 0 && c16.reserved_bytes == c16.state_bytes + c16.conv_bytes);
    memplan_costs mc;
    memplan_costs_of(&c16.plan, &mc);
    CHECK(mc.dnet_state_bytes_per_seq == c16.state_bytes && mc.dnet_conv_bytes_per_seq == c16.conv_bytes);
    cache_deinit(&c16);
    cache_deinit(&c32);
}

static int cmp_ptr(const void *a, const void *b)
{
    const uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* KV pages carved from regions: every page whole and apart from the
 * others, 64-byte aligned, across more than one region; a freed
 * sequence's pages go to the next without new regions. */
TEST(test_cache_pages_from_regions_are_whole_apart_and_recycled)
{
    cache_layout l = { .n_attn = 1, .n_kv = 1, .head_dim = 64, .page_tokens = 16, .n_ctx = 8192, .max_seqs = 2,
                       .budget_bytes = 64ull << 20 };
    cache c;
    CHECK(cache_init(&c, &l) == 0);
    const int n_tok = 300 * 16;                 /* 300 pages of 8 KiB: two 2 MiB regions */
    int a = cache_seq_new(&c);
    CHECK(a >= 0 && cache_reserve(&c, a, n_tok) == 0);
    cache_seq *s = cache_get(&c, a);
    CHECK(s->n_pages == 300 && c.n_regions >= 2);
    uintptr_t p[300];
    for (int i = 0; i < 300; i++) {
        p[i] = (uintptr_t)s->pages[i];
        CHECK(p[i] % 64 == 0);
        memset(s->pages[i], i & 0xff, c.page_bytes);        /* whole page writable */
    }
    qsort(p, 300, sizeof p[0], cmp_ptr);
    for (int i = 1; i < 300; i++)
        CHECK_MSG(p[i] >= p[i - 1] + c.page_bytes, "pages %d and %d overlap", i - 1, i);
    const int regions = c.n_regions;
    cache_seq_free(&c, a);
    int b = cache_seq_new(&c);
    CHECK(b >= 0 && cache_reserve(&c, b, n_tok) == 0);
    CHECK(c.n_regions == regions);
    cache_seq_free(&c, b);
    CHECK(c.reserved_bytes == 0);
    cache_deinit(&c);
}

/* Out of memory at each allocation of admission in turn (the page table,
 * the DeltaNet slot, the free list, the region table, a region): the
 * sequence is refused or its reservation fails, nothing else changes, and
 * the invariants hold. Pages of 16 tokens x 8 heads x 128 dims x (K, V) x 4
 * bytes = 128 KiB, 16 to a 2 MiB region: a full context of 256 tokens fills
 * one region, so each new sequence maps another. */
TEST(test_cache_out_of_memory_at_each_allocation_changes_nothing)
{
    const cache_layout wide = { .n_attn = 1, .n_kv = 8, .head_dim = 128, .n_dnet = 1, .conv_kernel = 4,
                                .conv_dim = 64, .n_v = 2, .d_v = 16, .d_k = 16, .page_tokens = 16,
                                .n_ctx = 256, .max_seqs = 4, .budget_bytes = 64u << 20 };
    cache c;
    CHECK(cache_init(&c, &wide) == 0);
    CHECK(c.page_bytes == 128u << 10);
    const int a = cache_seq_new(&c);
    CHECK(a >= 0 && cache_reserve(&c, a, 100) == 0);
    int n_failed = 0, k = 1;
    for (; k < 100; k++) {
        const uint64_t reserved = c.reserved_bytes;
        const int live = c.n_live, used = c.n_pages_used, pages_a = cache_get(&c, a)->n_pages;
        fault_inject(k);
        const int b = cache_seq_new(&c);
        const int rc = b < 0 ? -1 : cache_reserve(&c, b, 256);
        const int rc_a = rc == 0 ? cache_reserve(&c, a, 256) : -1;
        const bool fired = fault_fired();
        fault_inject(0);
        CHECK_MSG(cache_broken(&c) == NULL, "allocation %d failed: %s", k, cache_broken(&c));
        if (!fired) {
            CHECK_MSG(rc == 0 && rc_a == 0, "allocation %d: nothing failed, yet the reservations did", k);
            break;
        }
        n_failed++;
        if (rc != 0) {
            CHECK_MSG(b < 0 || cache_get(&c, b)->n_pages == 0, "allocation %d: b kept pages", k);
            cache_seq_free(&c, b);
        } else {
            CHECK_MSG(rc_a != 0 && cache_get(&c, a)->n_pages == pages_a, "allocation %d: a changed", k);
            cache_seq_free(&c, b);
        }
        CHECK_MSG(c.reserved_bytes == reserved && c.n_live == live && c.n_pages_used == used,
                  "allocation %d failed and left %llu bytes reserved (was %llu)", k,
                  (unsigned long long)c.reserved_bytes, (unsigned long long)reserved);
    }
    CHECK_MSG(n_failed >= 4, "only %d allocations could be failed", n_failed);
    cache_deinit(&c);
}

/* test_cache.c - the cache manager (engine/cache.c) on its own: DeltaNet
 * slots recycled zeroed, KV pages carved from regions, reservations that
 * change everything or nothing, also when memory runs out at any of their
 * allocations (fault.h), and the invariant checker cache_broken, which must
 * hold through normal use and notice each kind of broken pool. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "fault.h"
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
    CHECK(c.n_pages_used == 4 && c.n_free_pages == 2 && c.n_pages_carved == 6 && c.n_free_slots == 1);
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
        { "a slot both live and free", "slots" },
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
        case 6: bad.n_free_slots = bad.max_seqs; break;
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

/* share.h - a parallel region's rows split between its threads, the idle
 * stealing from the busy.
 *
 * Owns: the split of a product's rows (or panels) between the threads of
 * one OpenMP region: units [0, total) numbered across one or more weights,
 * one equal share per thread, claimed in chunks, stolen by halves. Does
 * not own: what a unit is (the callers: groups of rows, pairs of panels)
 * nor the kernels.
 *
 * Why: a decode step's products used to give each thread one fixed, equal
 * share. On a VM whose host also runs other guests, or beside another
 * process, one core is at times 30% slower than the other for seconds on
 * end (measured here: one thread of a Q4_K decode at 51 tok/s on CPU 0
 * and 69 on CPU 1, minutes later 68 on both), and every region then waits
 * for the slow core's share: the fast thread spun in libgomp for 30% of
 * its samples (perf, 2 threads). With stealing, the fast core takes over
 * part of the slow one's share and the region ends when the work does.
 *
 * Each thread starts on its equal share, as before, and claims it from
 * the front in chunks of at least `min` units; consecutive chunks are
 * adjacent, so the hardware prefetcher's stream runs on across them and
 * a balanced region reads memory exactly as one fixed share per thread
 * did. A thread whose share is done steals the back half of the largest
 * share left (at least `min` units, or all of it) and makes it its own,
 * so a slow thread's work moves to the fast one in a few steals and can
 * move back. A first version handed out guided chunks from one counter:
 * every chunk started a new stream (the prefetcher ramps up again, a DRAM
 * latency or more), about 10-20 of them per product, and 2-thread Q4_K
 * decode measured 0.90-0.93 of the fixed split (in-process A/B).
 *
 * Units never straddle two weights and a weight's units start at its row
 * 0 (share_part), so a row's kernel, and with it its bits, depends only on
 * the row, never on the thread count or the timing (tests/test_kernels.c).
 */
#ifndef HYSERVE_SHARE_H
#define HYSERVE_SHARE_H

#include <omp.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Chunks of at least this many weight bytes: a claim (one uncontended
 * compare-and-swap) per few microseconds of work. */
#define SHARE_CHUNK_BYTES (64L * 1024)

/* threads with a share of their own; more take only what they steal */
#define SHARE_MAX_THREADS 64

typedef struct {
    /* thread t's units left, [lo, hi) packed as lo | hi << 32; a line each */
    struct {
        alignas(64) _Atomic uint64_t r;
    } slot[SHARE_MAX_THREADS];
    long min;               /* the smallest claim but a share's last, >= 1 */
    int nt;                 /* slots in use */
    bool steal;             /* false: the fixed split, each thread its share only */
} share;

/* Whether regions keep the fixed split, each thread its equal share and
 * no stealing (HYSERVE_SPLIT=fixed, or share_set_fixed): for A/B runs. */
bool share_fixed(void);
void share_set_fixed(bool fixed);

static inline uint64_t share_pack(long lo, long hi)
{
    return (uint64_t)lo | (uint64_t)hi << 32;
}

/* the smallest claim, in units of unit_bytes of weight: SHARE_CHUNK_BYTES */
static inline long share_min_units(size_t unit_bytes)
{
    const long u = unit_bytes ? SHARE_CHUNK_BYTES / (long)unit_bytes : 1;
    return u > 1 ? u : 1;
}

/* total units (< 2^31) for a region of nt threads, claims of at least min
 * units. nt is the team the region will have: omp_get_max_threads(), or
 * 1 where its if() clause is false. Should the team be smaller, the
 * missing threads' shares are stolen, even when fixed (tested). */
static inline void share_init(share *s, long total, long min, int nt)
{
    s->nt = nt < 1 ? 1 : nt > SHARE_MAX_THREADS ? SHARE_MAX_THREADS : nt;
    for (int t = 0; t < s->nt; t++)
        atomic_init(&s->slot[t].r, share_pack(total * t / s->nt, total * (t + 1) / s->nt));
    s->min = min > 0 ? min : 1;
    s->steal = !share_fixed();
}

/* the front min units (or fewer, the last) of slot t */
static inline bool share_front(share *s, int t, long *a, long *b)
{
    uint64_t v = atomic_load_explicit(&s->slot[t].r, memory_order_relaxed);
    for (;;) {
        const long lo = (long)(v & 0xffffffffu), hi = (long)(v >> 32);
        if (lo >= hi)
            return false;
        const long n = hi - lo < s->min ? hi - lo : s->min;
        if (atomic_compare_exchange_weak_explicit(&s->slot[t].r, &v, share_pack(lo + n, hi), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *a = lo;
            *b = lo + n;
            return true;
        }
    }
}

/* Claims thread it's next chunk as [*a, *b); false when no work is left
 * (a chunk another thread stole is that thread's to finish). */
static inline bool share_take(share *s, int it, long *a, long *b)
{
    for (;;) {
        if (it < s->nt && share_front(s, it, a, b))
            return true;
        /* steal the back half of the largest share left (fixed: only the
         * shares of threads the region lacks) */
        const int team = omp_get_num_threads();
        int best = -1;
        long most = 0;
        for (int v = 0; v < s->nt; v++) {
            const uint64_t r = atomic_load_explicit(&s->slot[v].r, memory_order_relaxed);
            const long left = (long)(r >> 32) - (long)(r & 0xffffffffu);
            if (v != it && left > most && (s->steal || v >= team)) {
                best = v;
                most = left;
            }
        }
        if (best < 0)
            return false;
        uint64_t r = atomic_load_explicit(&s->slot[best].r, memory_order_relaxed);
        const long lo = (long)(r & 0xffffffffu), hi = (long)(r >> 32);
        if (lo >= hi)
            continue;
        long n = (hi - lo) / 2 > s->min ? (hi - lo) / 2 : s->min;
        if (n > hi - lo)
            n = hi - lo;
        if (!atomic_compare_exchange_strong_explicit(&s->slot[best].r, &r, share_pack(lo, hi - n),
                                                     memory_order_relaxed, memory_order_relaxed))
            continue;               /* the owner or another thief moved it: look again */
        if (it >= s->nt) {          /* no slot: the stolen units are one chunk */
            *a = hi - n;
            *b = hi;
            return true;
        }
        /* the stolen units become this thread's share (its slot is empty,
         * so no one else claims from it), which others may steal from */
        atomic_store_explicit(&s->slot[it].r, share_pack(hi - n, hi), memory_order_relaxed);
    }
}

/* The part of chunk [a, b) in the weight whose units are [off, off + n):
 * [*pa, *pb) relative to the weight's first unit; false when empty. */
static inline bool share_part(long a, long b, long off, long n, long *pa, long *pb)
{
    *pa = (a > off ? a : off) - off;
    *pb = (b < off + n ? b : off + n) - off;
    return *pb > *pa;
}

#endif

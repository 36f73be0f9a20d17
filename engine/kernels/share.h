/* share.h - a parallel region's rows handed out in shrinking chunks.
 *
 * Owns: the split of a product's rows (or panels) between the threads of
 * one OpenMP region: units [0, total) numbered across one or more weights,
 * taken in chunks by an atomic counter. Does not own: what a unit is (the
 * callers: groups of rows, pairs of panels) nor the kernels.
 *
 * Why: a decode step's products used to give each thread one fixed, equal
 * share. On a VM whose host also runs other guests, or beside another
 * process, one core is at times 30% slower than the other for seconds on
 * end (measured here: one thread of a Q4_K decode at 51 tok/s on CPU 0
 * and 69 on CPU 1, minutes later 68 on both), and every region then waits
 * for the slow core's share: the fast thread spun in libgomp for 30% of
 * its samples (perf, 2 threads). With chunks, the fast core takes more of
 * them and the region ends when the work does.
 *
 * Each take claims a quarter of its fair share of what is left,
 * left / (4 nt) units (OpenMP's "guided" schedule, finer), at least `min`:
 * long sequential runs first, which the hardware prefetcher likes, and
 * small ones at the end, so the threads finish within about one small
 * chunk of each other. One compare-and-swap per chunk.
 *
 * Units never straddle two weights and a weight's units start at its row
 * 0 (share_part), so a row's kernel, and with it its bits, depends only on
 * the row, never on the thread count or the timing (tests/test_kernels.c).
 */
#ifndef HYSERVE_SHARE_H
#define HYSERVE_SHARE_H

#include <stdatomic.h>
#include <stdbool.h>

typedef struct {
    _Atomic long next;      /* the first unit not taken yet */
    long total;             /* units in all */
    long min;               /* the smallest chunk but the last, >= 1 */
    int nt;                 /* threads taking */
    bool fixed;             /* the old split: thread t takes [total t / nt, total (t + 1) / nt) once */
} share;

/* Chunks of at least this many weight bytes: long enough that the
 * hardware prefetcher runs ahead within each, and a claim (one
 * compare-and-swap) per few microseconds of work. */
#define SHARE_CHUNK_BYTES (64L * 1024)

/* Whether regions split their work the old way, one fixed equal share per
 * thread (HYSERVE_SPLIT=fixed, or share_set_fixed): for A/B runs only. */
bool share_fixed(void);
void share_set_fixed(bool fixed);

/* total units for nt threads (the region's thread count), chunks of at
 * least min units */
static inline void share_init(share *s, long total, long min, int nt)
{
    atomic_init(&s->next, 0);
    s->total = total;
    s->min = min > 0 ? min : 1;
    s->nt = nt > 0 ? nt : 1;
    s->fixed = share_fixed();
}

/* the smallest chunk, in units of unit_bytes of weight: SHARE_CHUNK_BYTES */
static inline long share_min_units(size_t unit_bytes)
{
    const long u = unit_bytes ? SHARE_CHUNK_BYTES / (long)unit_bytes : 1;
    return u > 1 ? u : 1;
}

/* Claims the next chunk as [*a, *b) for thread it; false when none is
 * left. *b must be -1 before a thread's first call (the fixed split
 * hands each thread one chunk). */
static inline bool share_take(share *s, int it, long *a, long *b)
{
    if (s->fixed) {
        if (*b != -1)
            return false;
        *a = s->total * it / s->nt;
        *b = s->total * (it + 1) / s->nt;
        return *b > *a;
    }
    long cur = atomic_load_explicit(&s->next, memory_order_relaxed);
    for (;;) {
        const long left = s->total - cur;
        if (left <= 0)
            return false;
        long n = left / (4L * s->nt);
        if (n < s->min)
            n = s->min;
        if (n > left)
            n = left;
        if (atomic_compare_exchange_weak_explicit(&s->next, &cur, cur + n, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *a = cur;
            *b = cur + n;
            return true;
        }
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

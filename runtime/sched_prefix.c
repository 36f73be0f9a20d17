/* sched_prefix.c - the prefix cache: admission from the store, snapshots, keeping the result.
 * Split from scheduler.c along its section banners; the design
 * notes are at the top of scheduler.c. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "invariant.h"
#include "scheduler_impl.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------------- */
/* Prefix cache: admission from the store, snapshots, keeping the result  */
/* ---------------------------------------------------------------------- */

/* Publish the pool (and the prefix store's numbers) for sched_get_stats,
 * and everything for sched_get_published.
 * Caller holds s->mu. */
void publish_pool(sched *s)
{
    engine_get_pool_usage(s->e, &s->st.pool);
    if (s->prefix)
        prefix_get_stats(s->prefix, &s->st.prefix);
    publish_stats(s);
}

static int snap_hints(const sched *s, const sched_req *r, int *at, int n_planned);

/* A branch point or a hint closer than this to the previous snapshot
 * length is not worth an engine step of its own: at b4e0b13 each turn of
 * the multi-turn bench ran three prefill steps with the cache on (1 token
 * to a branch point right after the restored snapshot, ~300, then 1 to
 * the prompt's end - 1) against one with it off, and a step's fixed cost
 * (the weights read once, a parallel region per matmul) is ~55 ms at 2
 * threads on a quiet machine (bench/results/latest.md: 128 against 512
 * prompt tokens), far more when the cores are shared; 32 tokens of
 * recompute cost ~0.2 s, paid only by a request that branches there.
 * (Since then a step takes the first snapshot inside its chunk without
 * stopping there, prefill_chunk, so only a second length in one chunk
 * costs a step; the gap still keeps lengths from crowding a chunk.) */
enum { PREFIX_MIN_SNAP_GAP = 32 };


/* A sequence reserved for n_reserve tokens, the one way the scheduler
 * takes memory from the cache: through the prefix store (prefix_acquire:
 * with q, q's longest cached prefix restored and *m set; entries evicted
 * while the reservation does not fit) and, when even the emptied store
 * leaves no room, with the running requests' snapshots given back (a
 * reservation wins over cached state). Without the store, a new empty
 * sequence. -1 when it does not fit. Caller holds s->mu. */
int sched_seq_acquire(sched *s, const prefix_query *q, int n_reserve, prefix_match *m)
{
    if (!s->prefix) {
        int seq = engine_seq_new(s->e);
        if (seq >= 0 && engine_seq_reserve(s->e, seq, n_reserve) != 0) {
            engine_seq_free(s->e, seq);
            seq = -1;
        }
        return seq;
    }
    int seq;
    while ((seq = prefix_acquire(s->prefix, q, n_reserve, m)) < 0 && drop_running_snaps(s))
        ;
    return seq;
}

/* A new sequence for r reserved for total tokens, r's longest cached
 * prefix restored into it (sched_seq_acquire), or -1. Sets r->pm and the
 * snapshot lengths of r's prefill. Caller holds s->mu. */
int admit_seq_from_store(sched *s, sched_req *r, int total)
{
    const prefix_query q = { .salt = r->salt, .owner = r->owner, .prompt = r->tokens, .n_prompt = r->n_prompt,
                             .whole = r->prompt_lp };
    const int seq = sched_seq_acquire(s, &q, total, &r->pm);
    if (seq < 0 || !s->prefix)
        return seq;
    /* another tenant's entry is none of this one's business: the request
     * hears "no entry" (the counters in /metrics keep the reason) */
    if (r->pm.reason == PREFIX_SALT_DIFFERS)
        r->pm.reason = PREFIX_NO_ENTRY;
    /* where r's prefill stops for a DeltaNet snapshot: the point where it
     * diverged from a cached entry (the next request sharing that prefix
     * hits there), every snap_interval tokens, the submitter's hints (a
     * chat's message boundaries: the end of a shared system prompt) and
     * one short of the end of the prompt */
    if (!prefix_needs_snapshots(s->prefix))
        return seq;
    const int iv = prefix_snap_interval(s->prefix), from = r->pm.n_cached;
    const int n_max = (iv > 0 ? r->n_prompt / iv : 0) + 3 + 2 * SCHED_MAX_SNAP_HINTS;
    free(r->snap_at);
    free(r->snaps);
    r->snap_at = FAULT_OR(malloc((size_t)n_max * sizeof *r->snap_at));
    r->snaps = FAULT_OR(calloc((size_t)n_max, sizeof *r->snaps));
    r->n_snap_at = r->i_snap_at = r->n_snaps = 0;
    if (!r->snap_at || !r->snaps)
        return seq;     /* no snapshots: only the end of the output is kept */
    /* the lengths past from: the multiples of iv and one short of the
     * prompt (the same prompt again leaves its last token to prefill, for
     * the logits; a longer one that extends it restores there and
     * recomputes one token), always; the divergence point and the hints
     * only PREFIX_MIN_SNAP_GAP tokens or more past the previous length
     * kept (or from): each length is one more engine step for r, and a
     * later request that would have restored at a closer one restores the
     * previous one and recomputes fewer tokens than that step costs. The
     * kept lengths ascending, once each, into snap_at. */
    enum { OPT = SCHED_MAX_SNAP_HINTS + 1 };
    const int last = r->n_prompt - 1;
    int *req = r->snap_at + OPT, n_req = 0, opt[OPT], n_opt = 0;
    for (int t = iv > 0 ? (from / iv + 1) * iv : last; iv > 0 && t < last; t += iv)
        req[n_req++] = t;
    if (last > from)
        req[n_req++] = last;
    if (r->pm.diverged_at > from && r->pm.diverged_at < last)
        opt[n_opt++] = r->pm.diverged_at;
    n_opt += snap_hints(s, r, opt + n_opt, n_req + n_opt);
    for (int i = 1; i < n_opt; i++)     /* insertion sort: the divergence point among the hints */
        for (int j = i; j > 0 && opt[j - 1] > opt[j]; j--) {
            const int t = opt[j];
            opt[j] = opt[j - 1];
            opt[j - 1] = t;
        }
    int i = 0, j = 0, prev = from;
    const int align = s->p.prefix_snap_align > 1 ? s->p.prefix_snap_align : 1;
    while (i < n_req || j < n_opt) {    /* writes snap_at[k] with k <= i + j < OPT + i: never unread req */
        const bool take_req = j == n_opt || (i < n_req && req[i] <= opt[j]);
        int t = take_req ? req[i++] : opt[j++];
        t -= t % align;                 /* KV events: at a block's end (sched_params.prefix_snap_align) */
        if ((take_req || t - prev >= PREFIX_MIN_SNAP_GAP) && t > prev) {
            r->snap_at[r->n_snap_at++] = t;
            prev = t;
        }
    }
    return seq;
}

/* Copy to at[] r's hints that are worth a snapshot: past what the store
 * restored (no entry of r's salt holds a state there, else the lookup
 * would have restored at least that far) and short of the end of the
 * prompt, as many as the store's budget holds beside the n_planned others
 * (a snapshot it cannot hold would only evict one it can). Returns the
 * count. */
static int snap_hints(const sched *s, const sched_req *r, int *at, int n_planned)
{
    int n = 0;
    for (int i = 0; i < r->n_hints; i++) {
        const int h = r->hints[i];
        if (h <= r->pm.n_cached || h >= r->n_prompt - 1)
            continue;
        if (!prefix_snaps_fit(s->prefix, n_planned + n + 1))
            break;
        at[n++] = h;
    }
    return n;
}

/* The prompt tokens r may prefill this step (at most k), and the snapshot
 * the step takes on the way: the next snapshot length inside the chunk is
 * taken inside the step (it->snap: the engine copies the DeltaNet state
 * there), and the chunk stops at the length after it (taken after the
 * step). Before, every length was a step of its own: a cold 300-token
 * prompt ran 299 tokens, then 1 token for the snapshot one short of its
 * end (~16 ms, a decode step reading every weight; docs/performance.md).
 * A snapshot the budget cannot hold is skipped (the store then restores
 * an earlier one). Caller holds s->mu. */
int prefill_chunk(sched *s, sched_req *r, int k, engine_batch_item *it)
{
    int i = r->i_snap_at;
    if (i < r->n_snap_at && r->snaps) {
        const int at = r->snap_at[i] - r->n_fed;
        if (at > 0 && at < k) {
            it->snap = engine_snap_new(s->e);
            it->snap_at = at;
            i++;
        }
    }
    if (i < r->n_snap_at) {
        const int stop = r->snap_at[i] - r->n_fed;
        if (stop > 0 && stop < k)
            return stop;
    }
    return k;
}

/* A step's snapshot that did not run (the forward failed). */
void step_snap_drop(sched *s, engine_batch_item *it)
{
    engine_snap_free(s->e, it->snap);
    it->snap = NULL;
}

/* After a step: keep the snapshot the step took inside it (it->snap), and
 * take the one r's prefill stopped for. A snapshot the budget cannot hold
 * is skipped (the store then restores an earlier one). */
void snaps_due(sched *s, sched_req *r, engine_batch_item *it)
{
    if (it->snap) {
        r->snaps[r->n_snaps++] = it->snap;      /* room: one per length in snap_at */
        it->snap = NULL;
    }
    while (r->i_snap_at < r->n_snap_at && r->snap_at[r->i_snap_at] <= r->n_fed) {
        if (r->snap_at[r->i_snap_at] == r->n_fed && r->snaps) {
            engine_snap *sn = engine_snap_take(s->e, r->seq);
            if (sn)
                r->snaps[r->n_snaps++] = sn;
        }
        r->i_snap_at++;
    }
}

/* Give back the snapshots r holds (it failed, or the store took the
 * rest). Caller holds s->mu. */
void drop_snaps(sched *s, sched_req *r)
{
    for (int i = 0; i < r->n_snaps; i++)
        engine_snap_free(s->e, r->snaps[i]);
    r->n_snaps = r->pub_n_snaps = 0;
    r->i_snap_at = r->n_snap_at;        /* and takes no more */
}

/* The cache cannot admit the next request even with the store empty:
 * give back the snapshots the running requests took for the store (a
 * reservation wins over cached state). Returns whether any were held.
 * Caller holds s->mu. */
bool drop_running_snaps(sched *s)
{
    bool any = false;
    for (int i = 0; i < s->n_running; i++) {
        any = any || s->running[i]->n_snaps > 0;
        drop_snaps(s, s->running[i]);
    }
    return any;
}

/* Carry out the resets sched_prefix_reset asked for: every entry of the
 * store goes (a running request forked from one keeps its own references
 * to the pages it shares, and its snapshots). Caller holds s->mu, on the
 * thread that owns the engine. */
void store_reset_due(sched *s)
{
    if (s->reset_done == s->reset_asked)
        return;
    sched_prefix_freed f = { .enabled = s->prefix != NULL };
    if (s->prefix) {
        const prefix_cleared c = prefix_clear(s->prefix);
        f.entries = c.entries;
        f.snapshots = c.snapshots;
        f.bytes = c.bytes;
        f.pool_freed_bytes = c.pool_freed_bytes;
    }
    engine_pool_usage after;
    engine_get_pool_usage(s->e, &after);
    f.pool_reserved_bytes = after.reserved_bytes;
    f.running = s->n_running;
    s->reset_last = f;
    s->reset_done = s->reset_asked;
    publish_pool(s);
    pthread_cond_broadcast(&s->reset_cv);
}

/* r finished: the store keeps its sequence (prompt and the output fed
 * back, with its state at the end) and its snapshots. Caller holds s->mu. */
void keep_in_store(sched *s, sched_req *r)
{
    if (!s->prefix || r->seq < 0)
        return;
    engine_mtp_truncate(s->e, r->seq, 0);      /* the MTP rows are the request's, not the store's */
    prefix_insert(s->prefix, r->salt, r->owner, r->tokens, r->n_fed, r->seq, r->snaps, r->n_snaps);
    r->seq = -1;
    r->n_snaps = 0;
}


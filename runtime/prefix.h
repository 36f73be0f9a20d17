/* prefix.h - the prefix store: finished requests' caches kept for reuse.
 *
 * Owns: entries of (salt, token sequence) -> a parked engine sequence (its
 * attention KV pages, shared by reference count with whoever forks it, and
 * its DeltaNet state at its full length) plus DeltaNet snapshots at
 * earlier lengths; lookup of the longest cached prefix of a prompt that
 * ends where the DeltaNet state is known; LRU eviction within its own byte
 * budget; the counters behind /metrics and /stats.
 * Does not own: when to snapshot or when to look up (the scheduler), the
 * pages and snapshots themselves (engine cache, engine.h).
 * A hit is always verified on the full token sequence and the salt
 * string, never on a hash. Entries of different salts never match.
 * ref: docs/serving.md section 11 (prefix caching).
 *
 * Owned by the scheduler thread (like the engine it calls). The numbers
 * (prefix_stats) are copied under the scheduler's lock.
 */
#ifndef HYSERVE_PREFIX_H
#define HYSERVE_PREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

typedef struct prefix_store prefix_store;

/* Why a lookup reused what it did. */
enum prefix_reason {
    PREFIX_HIT = 0,             /* the whole shared prefix was restored */
    PREFIX_NO_ENTRY = 1,        /* nothing cached under this salt shares a token */
    PREFIX_EVICTED = 2,         /* a matching entry was evicted */
    PREFIX_SALT_DIFFERS = 3,    /* only entries under other salts share a prefix (metrics only) */
    PREFIX_DIVERGED = 4,        /* shared diverged_at tokens, but no state at or before that but 0 */
    PREFIX_EARLIER_SNAPSHOT = 5, /* shared diverged_at tokens, restored the snapshot at n_cached, recomputed the gap */
    PREFIX_OFF = 6,             /* the store is off */
    PREFIX_PROMPT_LOGPROBS = 7, /* the request wants every prompt position's log probabilities: the store
                                   keeps no logits, so it prefilled whole (and still left an entry) */
    PREFIX_N_REASONS
};

/* What the store tells its listener (the server's KV event publisher,
 * server/kvevents.c) as entries come and go. */
enum prefix_event {
    PREFIX_EV_STORED = 0,       /* an entry of these tokens is kept (before it merges with one it extends) */
    PREFIX_EV_REMOVED = 1,      /* an entry of these tokens is gone (evicted, merged into a longer one, dropped) */
    PREFIX_EV_CLEARED = 2,      /* every entry is gone (prefix_clear); tokens NULL */
    /* A recurrent state after tokens[0..n_tokens) is kept / is gone: an
     * entry's snapshot or its own end state (models with recurrent layers
     * only). Each state an entry holds is told once kept and once gone:
     * when it moves to the entry that merged it, kept there first. */
    PREFIX_EV_STATE_STORED = 3,
    PREFIX_EV_STATE_REMOVED = 4,
};

/* The listener: called on the scheduler thread, inside the store's calls,
 * so it must neither block nor call the store. tokens are the entry's
 * whole sequence, valid during the call only. NULL fn: none. */
typedef struct prefix_sink {
    void (*fn)(void *ctx, int event, const char *salt, int owner, const int32_t *tokens, int n_tokens);
    void *ctx;
} prefix_sink;

typedef struct prefix_params {
    uint64_t budget_bytes;      /* the store's bytes at most (entries' KV pages, slots, snapshots) */
    int snap_interval;          /* a DeltaNet snapshot every this many prompt tokens; 0: none */
    prefix_sink sink;           /* told of every entry stored and removed */
} prefix_params;

/* What a lookup found. */
typedef struct prefix_match {
    int reason;                 /* enum prefix_reason */
    int n_cached;               /* tokens restored from the store */
    int diverged_at;            /* tokens the prompt shares with the best entry */
    int entry;                  /* internal: the entry to fork, -1 for none */
} prefix_match;

typedef struct prefix_stats {
    int n_entries;
    uint64_t bytes;             /* held by the entries, each counted whole (shared pages per entry) */
    uint64_t budget_bytes;
    uint64_t kv_bytes;          /* of it, the entries' attention KV and MLA pages */
    uint64_t state_bytes, conv_bytes;   /* DeltaNet state and conv: parked slots and snapshots */
    int n_snapshots;            /* snapshots besides the parked sequences' own state */
    uint64_t lookups, hits;     /* hits: some tokens reused */
    uint64_t misses[PREFIX_N_REASONS];  /* lookups that reused less than the shared prefix or nothing, by reason
                                           (PREFIX_EARLIER_SNAPSHOT ones are hits too) */
    uint64_t reused_tokens;     /* tokens restored instead of prefilled */
    uint64_t recomputed_tokens; /* tokens shared with an entry but recomputed from an earlier snapshot */
    uint64_t evictions;
    uint64_t inserted;
} prefix_stats;

prefix_store *prefix_new(engine *e, const prefix_params *p);
/* Frees every entry's sequence and snapshots. Accepts NULL. */
void prefix_free(prefix_store *ps);

/* What a request asks of the store when it is admitted. */
typedef struct prefix_query {
    const char *salt;           /* the cache salt ("" for none) */
    int owner;                  /* the API key's index: entries never match across keys */
    const int32_t *prompt;
    int n_prompt;
    bool whole;                 /* prefill the whole prompt (prompt logprobs need every position's
                                   logits, which the store does not keep): no lookup, counted as
                                   PREFIX_PROMPT_LOGPROBS */
} prefix_query;

/* The one call admission makes: a sequence reserved for n_reserve tokens.
 * With q, q's longest cached prefix is restored into it (pages shared,
 * state restored; prefix_lookup and prefix_fork), the lookup is counted
 * and *m says what was reused; with q NULL it is a new empty sequence (an
 * n-choice request's placeholder) and m is untouched (may be NULL). While
 * the cache cannot hold the reservation, entries are evicted, least
 * recently used first (a request always wins over cached entries), and
 * the lookup is made again. -1 when it does not fit with the store empty. */
int prefix_acquire(prefix_store *ps, const prefix_query *q, int n_reserve, prefix_match *m);

/* The parts of prefix_acquire, for tests: the longest prefix of
 * prompt[0..n_prompt-1) (one token is always left to prefill, for the
 * logits) cached under (salt, owner) that ends where every layer's state
 * is known; and a new sequence holding m's n_cached tokens (pages shared,
 * state restored), or -1 when the engine cannot hold one more sequence
 * now (marks the entry used). Neither is counted in the stats. */
prefix_match prefix_lookup(prefix_store *ps, const char *salt, int owner, const int32_t *prompt, int n_prompt);
int prefix_fork(prefix_store *ps, const prefix_match *m);

/* Whether n recurrent snapshots fit in the store's budget (false when the
 * model has no recurrent layers: there is nothing to snapshot). */
bool prefix_snaps_fit(const prefix_store *ps, int n);

/* Keep a finished sequence: tokens[0..n_tokens) are in seq (its length),
 * snaps[0..n_snaps) are snapshots taken at shorter lengths of it. The
 * store takes seq and the snapshots (on every path: it frees what it does
 * not keep). Entries this one extends are merged into it. */
void prefix_insert(prefix_store *ps, const char *salt, int owner, const int32_t *tokens, int n_tokens, int seq,
                   engine_snap **snaps, int n_snaps);
/* Evict the least recently used entry; false when the store is empty. */
bool prefix_evict_one(prefix_store *ps);
/* What prefix_clear let go. */
typedef struct prefix_cleared {
    int entries, snapshots;
    uint64_t bytes;             /* the entries' bytes as the store counted them */
    uint64_t pool_freed_bytes;  /* what the engine's pool got back (pages still shared with a running
                                   request stay reserved) */
} prefix_cleared;
/* Evict everything (POST /reset_prefix_cache, tests). */
prefix_cleared prefix_clear(prefix_store *ps);

int prefix_n_entries(const prefix_store *ps);
void prefix_get_stats(const prefix_store *ps, prefix_stats *st);
const char *prefix_reason_name(int reason);
/* Whether the model needs snapshots (has DeltaNet layers). */
bool prefix_needs_snapshots(const prefix_store *ps);
int prefix_snap_interval(const prefix_store *ps);

#endif

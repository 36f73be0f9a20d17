/* prefix.c - the prefix store (see prefix.h).
 *
 * An entry is a finished request's engine sequence, parked: its pages hold
 * the attention KV (and MLA latents) of all its tokens and its DeltaNet
 * slot the state after the last one; snapshots hold the DeltaNet state at
 * shorter lengths (end of prompt, every snap_interval tokens, the point
 * where an earlier request diverged from another entry). A request forks
 * the entry at the longest shared length where the state is known: the
 * pages below it are shared, a partly filled page copied, and the state
 * restored (engine_seq_fork, engine_snap_restore). A model without
 * DeltaNet layers needs no snapshots: any shared length is restorable.
 * Lookups scan the entries and compare tokens in full (a few entries of a
 * few thousand tokens: microseconds against a prefill's milliseconds).
 */
#include "prefix.h"

#include <stdlib.h>
#include <string.h>

#include "fault.h"

typedef struct prefix_entry {
    char *salt;                 /* the request's cache_salt ("" for none) */
    int owner;                  /* the API key id (sched_req_params.owner) */
    int32_t *tokens;            /* [n_tokens] */
    int n_tokens;
    int seq;                    /* parked engine sequence of length n_tokens */
    engine_snap **snaps;        /* [n_snaps] ascending lengths, all < n_tokens */
    int n_snaps;
    uint64_t kv_bytes, state_bytes, conv_bytes;  /* its share of prefix_stats */
    uint64_t last_used;         /* the store's clock at the last hit or insert */
    bool told;                  /* the sink was told of it (PREFIX_EV_STORED): its states are told too */
} prefix_entry;

/* What an evicted entry was, to tell "evicted" from "no entry" on a miss:
 * a hash of its salt and first tokens (only a miss reason, never a hit). */
typedef struct evicted_mark {
    uint64_t hash;
    int n_head;
} evicted_mark;

enum { N_EVICTED = 64, HEAD_TOKENS = 16 };

/* Owned by the scheduler thread. Invariant: stats.bytes == sum over
 * entries of kv + state + conv bytes, the same for each part. */
struct prefix_store {
    engine *e;
    prefix_params p;
    bool needs_snaps;           /* DeltaNet layers: state only where a snapshot was taken */
    uint64_t snap_bytes;        /* one snapshot */
    uint64_t snap_state_bytes, snap_conv_bytes;
    prefix_entry **entries;     /* [cap] */
    int n, cap;
    uint64_t clock;
    evicted_mark evicted[N_EVICTED];
    int n_evicted;              /* ring position */
    prefix_stats st;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t head_hash(const char *salt, int owner, const int32_t *t, int n)
{
    uint64_t h = fnv(14695981039346656037ull, salt, strlen(salt) + 1);
    h = fnv(h, &owner, sizeof owner);
    return fnv(h, t, (size_t)n * sizeof *t);
}

prefix_store *prefix_new(engine *e, const prefix_params *p)
{
    prefix_store *ps = FAULT_OR(calloc(1, sizeof *ps));
    if (!ps)
        return NULL;
    ps->e = e;
    ps->p = *p;
    const engine_info *in = engine_get_info(e);
    ps->needs_snaps = in->n_rec_layers > 0;
    ps->snap_bytes = engine_snap_bytes(e);
    ps->snap_state_bytes = ps->needs_snaps ? in->rec_state_bytes_per_seq : 0;
    ps->snap_conv_bytes = ps->needs_snaps ? in->rec_conv_bytes_per_seq : 0;
    ps->st.budget_bytes = p->budget_bytes;
    return ps;
}

/* Tell the sink that x's recurrent state after its first n tokens is kept
 * or gone (PREFIX_EV_STATE_STORED / _REMOVED). */
static void state_notify(const prefix_store *ps, int event, const prefix_entry *x, int n)
{
    if (ps->p.sink.fn && ps->needs_snaps && x->told)
        ps->p.sink.fn(ps->p.sink.ctx, event, x->salt, x->owner, x->tokens, n);
}

static void entry_free(prefix_store *ps, prefix_entry *x)
{
    if (!x)
        return;
    for (int i = 0; i < x->n_snaps; i++)
        state_notify(ps, PREFIX_EV_STATE_REMOVED, x, engine_snap_tokens(x->snaps[i]));
    if (x->seq >= 0)
        state_notify(ps, PREFIX_EV_STATE_REMOVED, x, x->n_tokens);
    engine_seq_free(ps->e, x->seq);
    for (int i = 0; i < x->n_snaps; i++)
        engine_snap_free(ps->e, x->snaps[i]);
    free(x->snaps);
    free(x->tokens);
    free(x->salt);
    free(x);
}

/* Take entry i out of the store (its bytes out of the stats). */
static prefix_entry *entry_unlink(prefix_store *ps, int i)
{
    prefix_entry *x = ps->entries[i];
    ps->entries[i] = ps->entries[--ps->n];
    ps->st.kv_bytes -= x->kv_bytes;
    ps->st.state_bytes -= x->state_bytes;
    ps->st.conv_bytes -= x->conv_bytes;
    ps->st.bytes -= x->kv_bytes + x->state_bytes + x->conv_bytes;
    ps->st.n_snapshots -= x->n_snaps;
    ps->st.n_entries = ps->n;
    return x;
}

/* Count x's bytes (after its snapshots or pages changed) into the stats. */
static void entry_account(prefix_store *ps, prefix_entry *x)
{
    engine_seq_usage u;
    engine_seq_get_usage(ps->e, x->seq, &u);
    x->kv_bytes = u.kv_reserved_bytes + u.mla_reserved_bytes;
    x->state_bytes = u.rec_state_bytes + (uint64_t)x->n_snaps * ps->snap_state_bytes;
    x->conv_bytes = u.rec_conv_bytes + (uint64_t)x->n_snaps * ps->snap_conv_bytes;
    ps->st.kv_bytes += x->kv_bytes;
    ps->st.state_bytes += x->state_bytes;
    ps->st.conv_bytes += x->conv_bytes;
    ps->st.bytes += x->kv_bytes + x->state_bytes + x->conv_bytes;
    ps->st.n_snapshots += x->n_snaps;
}

void prefix_free(prefix_store *ps)
{
    if (!ps)
        return;
    prefix_clear(ps);
    free(ps->entries);
    free(ps);
}

static bool same_salt(const prefix_entry *x, const char *salt, int owner)
{
    return x->owner == owner && strcmp(x->salt, salt) == 0;
}

static int common_prefix(const int32_t *a, const int32_t *b, int n)
{
    int i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* The longest length <= lcp at which x's state is known: x's own length,
 * a snapshot's, or any length without DeltaNet layers; 0 for none. */
static int restorable(const prefix_store *ps, const prefix_entry *x, int lcp)
{
    if (!ps->needs_snaps || lcp == x->n_tokens)
        return lcp;
    int best = 0;
    for (int i = 0; i < x->n_snaps; i++)
        if (engine_snap_tokens(x->snaps[i]) <= lcp)
            best = engine_snap_tokens(x->snaps[i]);
    return best;
}

prefix_match prefix_lookup(prefix_store *ps, const char *salt, int owner, const int32_t *prompt, int n_prompt)
{
    prefix_match m = { .reason = PREFIX_NO_ENTRY, .entry = -1 };
    const int cap = n_prompt - 1;
    bool other_salt = false;
    int best_pos = 0, best_lcp = 0;
    salt = salt ? salt : "";
    for (int i = 0; i < ps->n && cap > 0; i++) {
        const prefix_entry *x = ps->entries[i];
        const int n = x->n_tokens < cap ? x->n_tokens : cap;
        if (!same_salt(x, salt, owner)) {
            other_salt = other_salt || common_prefix(x->tokens, prompt, n) > 0;
            continue;
        }
        const int lcp = common_prefix(x->tokens, prompt, n);
        const int pos = restorable(ps, x, lcp);
        if (pos > best_pos || (pos == best_pos && pos > 0 && m.entry >= 0 &&
                               x->last_used > ps->entries[m.entry]->last_used)) {
            best_pos = pos;
            m.entry = i;
        }
        if (lcp > best_lcp)
            best_lcp = lcp;
    }
    m.diverged_at = best_lcp;
    if (best_pos > 0) {
        m.n_cached = best_pos;
        m.reason = best_pos == best_lcp ? PREFIX_HIT : PREFIX_EARLIER_SNAPSHOT;
    } else {
        m.entry = -1;
        if (best_lcp > 0) {
            m.reason = PREFIX_DIVERGED;
        } else if (other_salt) {
            m.reason = PREFIX_SALT_DIFFERS;
        } else {
            for (int i = 0; i < N_EVICTED && cap > 0; i++) {
                const evicted_mark *v = &ps->evicted[i];
                if (v->n_head > 0 && v->n_head <= cap && v->hash == head_hash(salt, owner, prompt, v->n_head)) {
                    m.reason = PREFIX_EVICTED;
                    break;
                }
            }
        }
    }
    return m;
}

/* Count the lookup a request was admitted with: a hit (tokens reused,
 * recomputed) or a miss by its reason. */
static void prefix_count(prefix_store *ps, const prefix_match *m)
{
    ps->st.lookups++;
    if (m->n_cached > 0) {
        ps->st.hits++;
        ps->st.reused_tokens += (uint64_t)m->n_cached;
        if (m->diverged_at > m->n_cached)
            ps->st.recomputed_tokens += (uint64_t)(m->diverged_at - m->n_cached);
    }
    if (m->reason != PREFIX_HIT && m->reason >= 0 && m->reason < PREFIX_N_REASONS)
        ps->st.misses[m->reason]++;
}

int prefix_fork(prefix_store *ps, const prefix_match *m)
{
    if (m->entry < 0 || m->entry >= ps->n || m->n_cached <= 0)
        return -1;
    prefix_entry *x = ps->entries[m->entry];
    const int pos = m->n_cached;
    const engine_snap *snap = NULL;
    if (ps->needs_snaps && pos < x->n_tokens) {
        for (int i = 0; i < x->n_snaps && !snap; i++)
            if (engine_snap_tokens(x->snaps[i]) == pos)
                snap = x->snaps[i];
        if (!snap)
            return -1;
    }
    const int seq = engine_seq_fork(ps->e, x->seq, pos);
    if (seq < 0)
        return -1;
    if (snap && engine_snap_restore(ps->e, seq, snap) != 0) {
        engine_seq_free(ps->e, seq);
        return -1;
    }
    x->last_used = ++ps->clock;
    return seq;
}

/* Put snap into x's sorted list; frees it when x has that length already
 * or it is not shorter than x. */
static void entry_add_snap(prefix_store *ps, prefix_entry *x, engine_snap *snap)
{
    const int t = engine_snap_tokens(snap);
    int at = 0;
    while (at < x->n_snaps && engine_snap_tokens(x->snaps[at]) < t)
        at++;
    if (t >= x->n_tokens || t <= 0 || (at < x->n_snaps && engine_snap_tokens(x->snaps[at]) == t)) {
        engine_snap_free(ps->e, snap);
        return;
    }
    engine_snap **a = FAULT_OR(realloc(x->snaps, (size_t)(x->n_snaps + 1) * sizeof *a));
    if (!a) {
        engine_snap_free(ps->e, snap);
        return;
    }
    memmove(a + at + 1, a + at, (size_t)(x->n_snaps - at) * sizeof *a);
    a[at] = snap;
    x->snaps = a;
    x->n_snaps++;
    state_notify(ps, PREFIX_EV_STATE_STORED, x, t);
}

/* Move the snapshots of `from`, and its own end state, into `into`
 * (whose tokens extend from's), then free `from`. Each state moved is
 * told kept by into before gone from from, so a listener's count of its
 * holders never passes through zero. */
static void entry_merge(prefix_store *ps, prefix_entry *into, prefix_entry *from)
{
    for (int i = 0; i < from->n_snaps; i++) {
        const int t = engine_snap_tokens(from->snaps[i]);
        entry_add_snap(ps, into, from->snaps[i]);
        state_notify(ps, PREFIX_EV_STATE_REMOVED, from, t);
    }
    from->n_snaps = 0;
    if (ps->needs_snaps && from->n_tokens < into->n_tokens) {
        /* from's sequence is going: its state block becomes the snapshot */
        engine_snap *end = engine_seq_into_snap(ps->e, from->seq);
        if (end) {
            from->seq = -1;
            entry_add_snap(ps, into, end);
            state_notify(ps, PREFIX_EV_STATE_REMOVED, from, from->n_tokens);
        }
    }
    into->last_used = from->last_used > into->last_used ? from->last_used : into->last_used;
    entry_free(ps, from);
}

static int lru_index(const prefix_store *ps, const prefix_entry *keep)
{
    int v = -1;
    for (int i = 0; i < ps->n; i++)
        if (ps->entries[i] != keep && (v < 0 || ps->entries[i]->last_used < ps->entries[v]->last_used))
            v = i;
    return v;
}

/* Tell the sink of x (PREFIX_EV_STORED or PREFIX_EV_REMOVED). */
static void entry_notify(const prefix_store *ps, int event, const prefix_entry *x)
{
    if (ps->p.sink.fn)
        ps->p.sink.fn(ps->p.sink.ctx, event, x->salt, x->owner, x->tokens, x->n_tokens);
}

static void evict_at(prefix_store *ps, int i)
{
    prefix_entry *x = entry_unlink(ps, i);
    entry_notify(ps, PREFIX_EV_REMOVED, x);
    const int k = x->n_tokens < HEAD_TOKENS ? x->n_tokens : HEAD_TOKENS;
    ps->evicted[ps->n_evicted] = (evicted_mark){ head_hash(x->salt, x->owner, x->tokens, k), k };
    ps->n_evicted = (ps->n_evicted + 1) % N_EVICTED;
    ps->st.evictions++;
    entry_free(ps, x);
}

bool prefix_evict_one(prefix_store *ps)
{
    const int v = lru_index(ps, NULL);
    if (v < 0)
        return false;
    evict_at(ps, v);
    return true;
}

prefix_cleared prefix_clear(prefix_store *ps)
{
    prefix_cleared c = { .entries = ps->n, .snapshots = ps->st.n_snapshots, .bytes = ps->st.bytes };
    engine_pool_usage before, after;
    engine_get_pool_usage(ps->e, &before);
    while (ps->n > 0) {
        prefix_entry *x = entry_unlink(ps, ps->n - 1);
        x->told = false;        /* PREFIX_EV_CLEARED below says it of every state at once */
        entry_free(ps, x);
    }
    if (ps->p.sink.fn)
        ps->p.sink.fn(ps->p.sink.ctx, PREFIX_EV_CLEARED, NULL, 0, NULL, 0);
    engine_get_pool_usage(ps->e, &after);
    c.pool_freed_bytes = before.reserved_bytes - after.reserved_bytes;
    return c;
}

int prefix_acquire(prefix_store *ps, const prefix_query *q, int n_reserve, prefix_match *m)
{
    for (;;) {
        if (q && q->whole)
            *m = (prefix_match){ .reason = PREFIX_PROMPT_LOGPROBS, .entry = -1 };
        else if (q)
            *m = prefix_lookup(ps, q->salt, q->owner, q->prompt, q->n_prompt);
        int seq = q && m->entry >= 0 ? prefix_fork(ps, m) : engine_seq_new(ps->e);
        if (seq >= 0 && engine_seq_reserve(ps->e, seq, n_reserve) == 0) {
            if (q) {
                if (m->entry < 0)
                    m->n_cached = 0;
                prefix_count(ps, m);
            }
            return seq;
        }
        engine_seq_free(ps->e, seq);
        if (!prefix_evict_one(ps))
            return -1;
    }
}

bool prefix_snaps_fit(const prefix_store *ps, int n)
{
    return ps->snap_bytes > 0 && (uint64_t)n * ps->snap_bytes <= ps->p.budget_bytes;
}

void prefix_insert(prefix_store *ps, const char *salt, int owner, const int32_t *tokens, int n_tokens, int seq,
                   engine_snap **snaps, int n_snaps)
{
    salt = salt ? salt : "";
    prefix_entry *x = FAULT_OR(calloc(1, sizeof *x));
    if (!x)
        goto out_drop;
    x->seq = seq;
    x->n_tokens = n_tokens;
    x->owner = owner;
    x->salt = FAULT_OR(strdup(salt));
    x->tokens = FAULT_OR(malloc((size_t)(n_tokens > 0 ? n_tokens : 1) * sizeof *x->tokens));
    if (!x->salt || !x->tokens || n_tokens < 1 || engine_seq_len(ps->e, seq) != n_tokens ||
        engine_seq_truncate(ps->e, seq, n_tokens, NULL) != 0)   /* gives back reserved, unused pages */
        goto out_drop;
    memcpy(x->tokens, tokens, (size_t)n_tokens * sizeof *tokens);
    seq = -1;                           /* x holds it now */
    x->last_used = ++ps->clock;
    /* told before the merge, so blocks the merged entries share stay held
     * throughout; its end state, then its snapshots as they join it */
    entry_notify(ps, PREFIX_EV_STORED, x);
    x->told = true;
    state_notify(ps, PREFIX_EV_STATE_STORED, x, x->n_tokens);
    for (int i = 0; i < n_snaps; i++) {
        if (ps->needs_snaps)
            entry_add_snap(ps, x, snaps[i]);
        else
            engine_snap_free(ps->e, snaps[i]);
        snaps[i] = NULL;
    }
    n_snaps = 0;
    /* merge with entries of the same salt that one of the two extends */
    for (int i = ps->n - 1; i >= 0; i--) {
        prefix_entry *y = ps->entries[i];
        if (!same_salt(y, salt, owner))
            continue;
        const int n = y->n_tokens < x->n_tokens ? y->n_tokens : x->n_tokens;
        if (common_prefix(y->tokens, x->tokens, n) != n)
            continue;
        if (y->n_tokens >= x->n_tokens) {       /* x adds nothing but snapshots: keep y */
            y = entry_unlink(ps, i);
            entry_notify(ps, PREFIX_EV_REMOVED, x);
            entry_merge(ps, y, x);
            x = y;
        } else {
            entry_notify(ps, PREFIX_EV_REMOVED, y);
            entry_merge(ps, x, entry_unlink(ps, i));
        }
        break;      /* entries of one salt never extend one another, so one merge at most */
    }
    prefix_entry **a = fault_grow(ps->entries, ps->n, &ps->cap, sizeof *a, 16);
    if (!a) {
        seq = -1;
        entry_notify(ps, PREFIX_EV_REMOVED, x);    /* x: the kept entry, whichever it is */
        goto out_drop;
    }
    ps->entries = a;
    ps->entries[ps->n++] = x;
    ps->st.n_entries = ps->n;
    ps->st.inserted++;
    entry_account(ps, x);
    /* the budget: least recently used first, this one last */
    while (ps->st.bytes > ps->p.budget_bytes) {
        int v = lru_index(ps, x);
        if (v < 0)
            v = lru_index(ps, NULL);    /* x alone is over the budget */
        evict_at(ps, v);
    }
    return;

out_drop:
    for (int i = 0; i < n_snaps; i++)
        engine_snap_free(ps->e, snaps[i]);
    if (seq >= 0) {
        engine_seq_free(ps->e, seq);
        if (x)
            x->seq = -1;
    }
    entry_free(ps, x);
}

int prefix_n_entries(const prefix_store *ps)
{
    return ps ? ps->n : 0;
}

void prefix_get_stats(const prefix_store *ps, prefix_stats *st)
{
    *st = ps->st;
}

bool prefix_needs_snapshots(const prefix_store *ps)
{
    return ps->needs_snaps;
}

int prefix_snap_interval(const prefix_store *ps)
{
    return ps->p.snap_interval;
}

const char *prefix_reason_name(int reason)
{
    switch (reason) {
    case PREFIX_HIT: return "hit";
    case PREFIX_NO_ENTRY: return "no_entry";
    case PREFIX_EVICTED: return "evicted";
    case PREFIX_SALT_DIFFERS: return "salt_differs";
    case PREFIX_DIVERGED: return "diverged";
    case PREFIX_EARLIER_SNAPSHOT: return "earlier_snapshot";
    case PREFIX_OFF: return "off";
    case PREFIX_PROMPT_LOGPROBS: return "prompt_logprobs";
    default: return "unknown";
    }
}

/* test_prefix.c - the prefix store (runtime/prefix.c) over a real engine:
 * lookups verified token by token and by salt, the longest restorable
 * length (a snapshot's or an entry's end with DeltaNet layers, any length
 * without), entries merged when one extends another, and a randomized run
 * of inserts, forks and evictions that never takes the store past its
 * budget and leaves the pool empty at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefix.h"
#include "synth.h"
#include "test.h"

static engine *open_synth(const char *tag, const char *pattern, uint64_t cache_bytes)
{
    synth_config c;
    synth_config_default(&c);
    c.n_layer = 4;
    snprintf(c.pattern, sizeof c.pattern, "%s", pattern);
    c.seed = 3;
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/prefix_%s.gguf", test_tmpdir(), tag);
    if (synth_write(&c, path, err, sizeof err) != 0) {
        fprintf(stderr, "    synth: %s\n", err);
        return NULL;
    }
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 1;
    p.n_ctx = 256;
    p.max_seqs = 32;
    p.cache_bytes = cache_bytes;
    engine *e = engine_open(&p, err, sizeof err);
    if (!e)
        fprintf(stderr, "    engine_open: %s\n", err);
    return e;
}

/* A sequence holding toks[0..n), with snapshots at the lengths in at[]
 * (ascending, < n) put in snaps. */
static int run_seq(engine *e, const int32_t *toks, int n, const int *at, int n_at, engine_snap **snaps)
{
    int seq = engine_seq_new(e), done = 0;
    char err[256];
    if (seq < 0 || engine_seq_reserve(e, seq, n) != 0)
        return -1;
    for (int k = 0; k <= n_at; k++) {
        const int upto = k < n_at ? at[k] : n;
        engine_batch_item it = { .seq = seq, .tokens = toks + done, .n_tokens = upto - done,
                                 .logits = ENGINE_LOGITS_NONE, .out = NULL };
        if (upto > done && engine_forward(e, &it, 1, err, sizeof err) != 0)
            return -1;
        done = upto;
        if (k < n_at && !(snaps[k] = engine_snap_take(e, seq)))
            return -1;
    }
    return seq;
}

static void tokens(int32_t *t, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)(32 + (seed >> 8) % 200);
    }
}

TEST(test_prefix_lookup_restores_at_snapshots_and_never_across_salts)
{
    engine *e = open_synth("hyb", "LLLA", 0);
    CHECK(e);
    prefix_params pp = { .budget_bytes = 1u << 30 };
    prefix_store *ps = prefix_new(e, &pp);
    CHECK(ps && prefix_needs_snapshots(ps));
    int32_t a[60], q[60];
    tokens(a, 60, 1);
    const int at[2] = { 16, 33 };
    engine_snap *snaps[2];
    int seq = run_seq(e, a, 50, at, 2, snaps);
    CHECK(seq >= 0);
    prefix_insert(ps, "s1", 7, a, 50, seq, snaps, 2);
    CHECK(prefix_n_entries(ps) == 1);

    memcpy(q, a, sizeof q);
    q[40] = a[40] + 1;                                  /* shares 40: restores the snapshot at 33 */
    prefix_match m = prefix_lookup(ps, "s1", 7, q, 60);
    CHECK_MSG(m.n_cached == 33 && m.diverged_at == 40 && m.reason == PREFIX_EARLIER_SNAPSHOT,
              "%d %d %s", m.n_cached, m.diverged_at, prefix_reason_name(m.reason));
    int f = prefix_fork(ps, &m);
    CHECK(f >= 0 && engine_seq_len(e, f) == 33);
    engine_seq_free(e, f);
    m = prefix_lookup(ps, "s1", 7, a, 60);              /* extends the entry: its own end */
    CHECK(m.n_cached == 50 && m.reason == PREFIX_HIT);
    m = prefix_lookup(ps, "s1", 7, a, 34);              /* one token left to prefill: 33 */
    CHECK(m.n_cached == 33 && m.reason == PREFIX_HIT);
    m = prefix_lookup(ps, "s1", 7, q, 15);              /* nothing known below 16 */
    CHECK(m.n_cached == 0 && m.reason == PREFIX_DIVERGED && m.diverged_at == 14);
    m = prefix_lookup(ps, "s2", 7, a, 60);              /* another salt */
    CHECK(m.n_cached == 0 && m.entry < 0 && m.reason == PREFIX_SALT_DIFFERS);
    m = prefix_lookup(ps, "s1", 8, a, 60);              /* another API key */
    CHECK(m.n_cached == 0 && m.entry < 0 && m.reason == PREFIX_SALT_DIFFERS);
    q[0] = a[0] + 1;
    m = prefix_lookup(ps, "s1", 7, q, 60);
    CHECK(m.n_cached == 0 && m.reason == PREFIX_NO_ENTRY);

    /* an entry extending the first absorbs it: one entry, the old end a snapshot */
    int32_t b[80];
    memcpy(b, a, 50 * sizeof *b);
    tokens(b + 50, 30, 2);
    seq = run_seq(e, b, 70, NULL, 0, NULL);
    CHECK(seq >= 0);
    prefix_insert(ps, "s1", 7, b, 70, seq, NULL, 0);
    prefix_stats st;
    prefix_get_stats(ps, &st);
    CHECK_MSG(st.n_entries == 1 && st.n_snapshots == 3, "%d entries, %d snapshots", st.n_entries, st.n_snapshots);
    m = prefix_lookup(ps, "s1", 7, a, 60);
    CHECK(m.n_cached == 50);
    prefix_free(ps);
    engine_pool_usage pu;
    engine_get_pool_usage(e, &pu);
    CHECK(pu.reserved_bytes == 0 && pu.n_seqs == 0 && pu.n_snaps == 0);
    engine_close(e);
}

TEST(test_prefix_attention_only_restores_at_any_token)
{
    engine *e = open_synth("attn", "A", 0);
    CHECK(e);
    prefix_params pp = { .budget_bytes = 1u << 30 };
    prefix_store *ps = prefix_new(e, &pp);
    CHECK(ps && !prefix_needs_snapshots(ps));
    int32_t a[40], q[40];
    tokens(a, 40, 3);
    int seq = run_seq(e, a, 40, NULL, 0, NULL);
    CHECK(seq >= 0);
    prefix_insert(ps, "", 0, a, 40, seq, NULL, 0);
    memcpy(q, a, sizeof q);
    q[21] = a[21] + 1;
    prefix_match m = prefix_lookup(ps, "", 0, q, 40);
    CHECK(m.n_cached == 21 && m.reason == PREFIX_HIT);
    int f = prefix_fork(ps, &m);
    engine_seq_usage u;
    CHECK(f >= 0 && engine_seq_get_usage(e, f, &u) == 0 && u.n_shared_pages == 1 && u.n_tokens == 21);
    engine_seq_free(e, f);
    prefix_free(ps);
    engine_close(e);
}

/* Random prompts from three stems: look up, fork (or start cold), run
 * the rest, insert; sometimes evict. The store stays within its budget,
 * the engine's pool within its own, and everything returns at the end. */
/* A listener that keeps what the store told of its recurrent states: a
 * count per (salt, tokens[0..n)) key, which must never go below zero. */
typedef struct state_log {
    uint64_t keys[1024];
    int counts[1024];
    int n_keys, held, bad, cleared;
} state_log;

static uint64_t state_key(const char *salt, const int32_t *t, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = salt; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)t[i]) * 1099511628211ull;
    return h;
}

static void state_sink(void *ctx, int event, const char *salt, int owner, const int32_t *tokens, int n_tokens)
{
    (void)owner;
    state_log *l = ctx;
    if (event == PREFIX_EV_CLEARED) {
        l->n_keys = l->held = 0;
        l->cleared++;
        return;
    }
    if (event != PREFIX_EV_STATE_STORED && event != PREFIX_EV_STATE_REMOVED)
        return;
    const uint64_t k = state_key(salt, tokens, n_tokens);
    int i = 0;
    while (i < l->n_keys && l->keys[i] != k)
        i++;
    if (i == l->n_keys) {
        if (i == 1024 || event == PREFIX_EV_STATE_REMOVED) {
            l->bad++;           /* gone without having been kept */
            return;
        }
        l->keys[l->n_keys] = k;
        l->counts[l->n_keys++] = 0;
    }
    const int d = event == PREFIX_EV_STATE_STORED ? 1 : -1;
    l->counts[i] += d;
    l->held += d;
    if (l->counts[i] < 0)
        l->bad++;
}

TEST(test_prefix_randomized_inserts_and_evictions_stay_within_the_budget)
{
    engine *e = open_synth("rand", "LLAL", 24u << 20);
    CHECK(e);
    const uint64_t budget = 4u << 20;
    /* the listener (the KV events' group of recurrent states) hears of
     * every state kept and gone, merges and evictions included: what it
     * holds is always the store's snapshots and entries' end states */
    state_log slog = {0};
    prefix_params pp = { .budget_bytes = budget, .snap_interval = 0,
                         .sink = { .fn = state_sink, .ctx = &slog } };
    prefix_store *ps = prefix_new(e, &pp);
    CHECK(ps);
    int32_t stems[3][100];
    for (int i = 0; i < 3; i++)
        tokens(stems[i], 100, 10u + (uint32_t)i);
    uint32_t r = 99;
    char err[256];
    uint64_t hits = 0;
    int32_t last[120];
    int n_last = 0;
    const char *last_salt = "x";
    for (int it = 0; it < 60; it++) {
        r = r * 1664525u + 1013904223u;
        int32_t p[120];
        const int stem = (int)(r >> 8) % 3;
        int keep = 1 + (int)((r >> 12) % 90), n = keep + 1 + (int)((r >> 20) % 20);
        memcpy(p, stems[stem], (size_t)keep * sizeof *p);
        const char *salt = (r >> 28) & 1 ? "x" : "y";
        if ((r >> 24) % 3 == 0 && n_last > 0 && n_last + 10 <= 120) {
            /* a conversation's next turn: the last sequence kept and more (its entry merges into this one) */
            keep = n_last;
            n = n_last + 1 + (int)((r >> 20) % 9);
            memcpy(p, last, (size_t)keep * sizeof *p);
            salt = last_salt;
        }
        tokens(p + keep, n - keep, r);
        prefix_match m;
        const prefix_query q = { .salt = salt, .owner = 0, .prompt = p, .n_prompt = n };
        const int seq = prefix_acquire(ps, &q, n, &m);
        CHECK(seq >= 0);
        /* what the match says was restored is what the sequence holds */
        CHECK_MSG(engine_seq_len(e, seq) == m.n_cached && (m.n_cached > 0) == (m.entry >= 0),
                  "sequence of %d tokens for a match of %d (entry %d)", engine_seq_len(e, seq), m.n_cached,
                  m.entry);
        hits += m.n_cached > 0;
        /* the rest, with a snapshot every 8 tokens and one short of the end */
        engine_snap *snap[16];
        int n_snap = 0;
        for (int done = engine_seq_len(e, seq); done < n;) {
            int upto = (done / 8 + 1) * 8;
            if (upto >= n - 1)
                upto = done < n - 1 ? n - 1 : n;
            engine_batch_item bi = { .seq = seq, .tokens = p + done, .n_tokens = upto - done,
                                     .logits = ENGINE_LOGITS_NONE, .out = NULL };
            CHECK(engine_forward(e, &bi, 1, err, sizeof err) == 0);
            done = upto;
            if (done < n && (snap[n_snap] = engine_snap_take(e, seq)))
                n_snap++;
        }
        prefix_insert(ps, salt, 0, p, n, seq, snap, n_snap);
        memcpy(last, p, (size_t)n * sizeof *p);
        n_last = n;
        last_salt = salt;
        prefix_stats st;
        prefix_get_stats(ps, &st);
        engine_pool_usage pu;
        engine_get_pool_usage(e, &pu);
        CHECK_MSG(st.bytes <= budget, "store %llu bytes over its budget %llu", (unsigned long long)st.bytes,
                  (unsigned long long)budget);
        CHECK(pu.reserved_bytes <= pu.budget_bytes && pu.n_seqs == st.n_entries);
        if (it % 17 == 16)
            prefix_evict_one(ps);
        prefix_get_stats(ps, &st);
        CHECK_MSG(slog.bad == 0 && slog.held == st.n_snapshots + st.n_entries,
                  "step %d: the listener holds %d states (%d bad events), the store %d snapshots and %d entries", it,
                  slog.held, slog.bad, st.n_snapshots, st.n_entries);
    }
    prefix_stats st;
    prefix_get_stats(ps, &st);
    CHECK_MSG(hits > 10 && st.evictions > 0, "%llu hits, %llu evictions, %d entries of %llu bytes",
              (unsigned long long)hits, (unsigned long long)st.evictions, st.n_entries, (unsigned long long)st.bytes);
    /* every acquisition counted once, a hit exactly when tokens came back */
    CHECK_MSG(st.lookups == 60 && st.hits == hits, "%llu lookups, %llu hits counted, %llu seen",
              (unsigned long long)st.lookups, (unsigned long long)st.hits, (unsigned long long)hits);
    engine_pool_usage pu;
    engine_get_pool_usage(e, &pu);
    const uint64_t held = pu.reserved_bytes;
    const prefix_cleared c = prefix_clear(ps);
    CHECK(c.entries == st.n_entries && c.snapshots == st.n_snapshots && c.bytes == st.bytes);
    CHECK(c.pool_freed_bytes == held);  /* nothing else held pages */
    engine_get_pool_usage(e, &pu);
    CHECK(pu.reserved_bytes == 0 && pu.n_seqs == 0 && pu.n_snaps == 0 && pu.n_pages_used == 0);
    CHECK_MSG(slog.cleared == 1 && slog.held == 0 && slog.bad == 0, "after the clear: %d cleared, %d held, %d bad",
              slog.cleared, slog.held, slog.bad);
    prefix_free(ps);
    engine_close(e);
}

/* prefix_acquire, the one call admission makes: a hit restores the entry's
 * tokens and counts once, a reservation the cache cannot hold evicts
 * entries least recently used first (the entry just used stays), and a
 * query that wants every prompt position's logits restores nothing and
 * says why. */
TEST(test_prefix_acquire_evicts_least_recently_used_until_the_reservation_fits)
{
    engine *e = open_synth("acq", "LLAL", 512u << 10);
    CHECK(e);
    prefix_params pp = { .budget_bytes = 512u << 10, .snap_interval = 0 };
    prefix_store *ps = prefix_new(e, &pp);
    CHECK(ps);
    engine_pool_usage pu;
    const uint64_t per_entry = engine_bytes_for_tokens(e, 64);
    enum { MAX_ENTRIES = 32 };
    int32_t t[MAX_ENTRIES][65];   /* entries of 64 tokens, asked with one more */
    int n_ins = 0;
    /* entries until the cache cannot hold one more */
    for (engine_get_pool_usage(e, &pu); n_ins < MAX_ENTRIES && pu.free_bytes >= per_entry;
         engine_get_pool_usage(e, &pu)) {
        tokens(t[n_ins], 65, 100u + (uint32_t)n_ins);
        const int seq = run_seq(e, t[n_ins], 64, NULL, 0, NULL);
        CHECK(seq >= 0);
        prefix_insert(ps, "", 0, t[n_ins], 64, seq, NULL, 0);
        n_ins++;
    }
    CHECK_MSG(n_ins >= 3 && n_ins < MAX_ENTRIES && prefix_n_entries(ps) == n_ins,
              "%d entries of %llu bytes fill the cache", n_ins, (unsigned long long)per_entry);
    /* room for one sequence: the oldest entry out */
    CHECK(prefix_evict_one(ps));
    CHECK(prefix_lookup(ps, "", 0, t[0], 65).n_cached == 0);
    /* entry 1 restored, and held: it fits now and is the most recently used */
    prefix_stats before, after;
    prefix_get_stats(ps, &before);
    prefix_match m;
    prefix_query q = { .salt = "", .owner = 0, .prompt = t[1], .n_prompt = 65 };
    const int held = prefix_acquire(ps, &q, 65, &m);
    CHECK(held >= 0 && m.n_cached == 64 && m.reason == PREFIX_HIT && engine_seq_len(e, held) == 64);
    prefix_get_stats(ps, &after);
    CHECK(after.evictions == before.evictions && after.lookups == before.lookups + 1 && after.hits == before.hits + 1);
    /* a 64-token placeholder does not fit beside them: exactly the least
     * recently used entry (2, the oldest untouched) goes */
    before = after;
    int seq = prefix_acquire(ps, NULL, 64, NULL);
    CHECK(seq >= 0 && engine_seq_len(e, seq) == 0);
    prefix_get_stats(ps, &after);
    CHECK_MSG(after.evictions == before.evictions + 1, "%llu evictions for one entry's room",
              (unsigned long long)(after.evictions - before.evictions));
    CHECK(after.lookups == before.lookups);     /* a placeholder is no lookup */
    CHECK(prefix_lookup(ps, "", 0, t[2], 65).n_cached == 0);
    CHECK(prefix_lookup(ps, "", 0, t[1], 65).n_cached == 64);
    CHECK(prefix_lookup(ps, "", 0, t[3], 65).n_cached == 64);
    engine_seq_free(e, seq);
    engine_seq_free(e, held);
    /* prompt logprobs: nothing restored, the reason counted */
    q.whole = true;
    seq = prefix_acquire(ps, &q, 64, &m);
    CHECK(seq >= 0 && m.n_cached == 0 && m.entry < 0 && m.reason == PREFIX_PROMPT_LOGPROBS);
    CHECK(engine_seq_len(e, seq) == 0);
    engine_seq_free(e, seq);
    prefix_get_stats(ps, &after);
    CHECK(after.misses[PREFIX_PROMPT_LOGPROBS] == before.misses[PREFIX_PROMPT_LOGPROBS] + 1);
    prefix_free(ps);
    engine_close(e);
}

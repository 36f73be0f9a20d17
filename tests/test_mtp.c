/* test_mtp.c - the MTP draft head (engine/mtp.c) as speculation uses it.
 *
 * The numbers themselves are checked against an independent numpy
 * reference of the contract's math (tests/ref, suite_reference); these
 * tests check the structure the scheduler relies on, with the engine's own
 * computations as each other's reference: MTP row i is a function of
 * tokens 0..i+1 only (a prompt's rows and its prefix's rows are the same
 * bits), it does depend on token i+1, rolling the MTP KV back and feeding
 * other rows gives the bits of never having fed the rejected ones, forks
 * start empty, and a file with MTP opened without it holds nothing of it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels/ggml_type.h"
#include "synth.h"
#include "test.h"

/* A qwen35 (dense FFN, the trunk's head) or qwen35moe (experts, an MTP
 * head and embedding of its own) file with one MTP block. */
static const char *mtp_file(const char *tag, bool moe, int n_mtp)
{
    static char path[512];
    synth_config c;
    synth_config_default(&c);
    snprintf(c.arch, sizeof c.arch, "%s", moe ? "qwen35moe" : "qwen35");
    snprintf(c.pattern, sizeof c.pattern, "LLLA");
    c.n_layer = 4;
    c.seed = 42;
    c.n_mtp = n_mtp;
    c.mtp_own_head = moe;
    c.tied = !moe;
    char err[512];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), tag);
    if (synth_write(&c, path, err, sizeof err) != 0) {
        fprintf(stderr, "    synth %s: %s\n", tag, err);
        return NULL;
    }
    return path;
}

static engine *open_mtp(const char *path, bool mtp, char *err, size_t errlen)
{
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 128;
    p.max_seqs = 4;
    p.mtp = mtp;
    return engine_open(&p, err, errlen);
}

static void tokens_of(int32_t *t, int n, int V, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % (unsigned)V);
    }
}

/* A new sequence fed t[0..n) as one exact step (the bits of one-token
 * steps, so a prompt and its prefix share their trunk rows), its hidden
 * rows into hid [n][n_embd]; then its MTP rows 0..n-2, one row a step,
 * each row's logits into rows [n-1][n_vocab]. The sequence, or -1. */
static int mtp_rows(engine *e, const int32_t *t, int n, float *hid, float *rows)
{
    const engine_info *in = engine_get_info(e);
    char err[256];
    const int seq = engine_seq_new(e);
    if (seq < 0 || engine_seq_reserve(e, seq, n) != 0)
        return -1;
    engine_batch_item it = { .seq = seq, .tokens = t, .n_tokens = n, .logits = ENGINE_LOGITS_NONE, .exact = 1,
                             .hidden = hid };
    if (engine_forward(e, &it, 1, err, sizeof err) != 0) {
        fprintf(stderr, "    forward: %s\n", err);
        return -1;
    }
    for (int i = 0; i + 1 < n; i++) {
        engine_mtp_item mi = { .seq = seq, .hidden = hid + (size_t)i * in->n_embd, .tokens = t + i + 1, .n = 1,
                               .logits = rows + (size_t)i * in->n_vocab };
        if (engine_mtp_step(e, &mi, 1, false, err, sizeof err) != 0) {
            fprintf(stderr, "    mtp: %s\n", err);
            return -1;
        }
    }
    return seq;
}

TEST(test_mtp_row_i_is_a_function_of_tokens_0_to_i_plus_1)
{
    enum { N = 21, NP = 9 };        /* past a 16-token page */
    for (int moe = 0; moe <= 1; moe++) {
        const char *path = mtp_file(moe ? "mtp_moe" : "mtp_dense", moe, 1);
        CHECK(path);
        char err[512];
        engine *e = open_mtp(path, true, err, sizeof err);
        CHECK_MSG(e, "%s", err);
        const engine_info *in = engine_get_info(e);
        CHECK(in->has_mtp && in->mtp_enabled && in->n_nextn == 1);
        const int V = in->n_vocab, E = in->n_embd;
        int32_t t[N], u[N];
        tokens_of(t, N, V, 4242u + (unsigned)moe);
        float *hid = malloc(sizeof(float) * N * (size_t)E), *a = malloc(sizeof(float) * N * (size_t)V);
        float *b = malloc(sizeof(float) * N * (size_t)V);
        CHECK(hid && a && b);
        const int s1 = mtp_rows(e, t, N, hid, a);
        const int s2 = mtp_rows(e, t, NP, hid, b);         /* the prefix: its rows 0..NP-2 */
        CHECK(s1 >= 0 && s2 >= 0);
        CHECK(engine_mtp_len(e, s1) == N - 1 && engine_mtp_len(e, s2) == NP - 1);
        CHECK_MSG(memcmp(a, b, sizeof(float) * (NP - 1) * (size_t)V) == 0,
                  "%s: the prefix's MTP rows differ from the prompt's", path);
        engine_seq_free(e, s2);
        /* token NP-1 changed: rows up to NP-3 stay, row NP-2 (which takes it as t_{i+1}) moves */
        memcpy(u, t, sizeof u);
        u[NP - 1] = (t[NP - 1] + 1) % V;
        const int s3 = mtp_rows(e, u, NP, hid, b);
        CHECK(s3 >= 0);
        CHECK(memcmp(a, b, sizeof(float) * (NP - 2) * (size_t)V) == 0);
        CHECK_MSG(memcmp(a + (size_t)(NP - 2) * V, b + (size_t)(NP - 2) * V, sizeof(float) * (size_t)V) != 0,
                  "%s: MTP row %d does not depend on token %d", path, NP - 2, NP - 1);
        engine_seq_free(e, s3);
        engine_seq_free(e, s1);
        engine_pool_usage pu;
        engine_get_pool_usage(e, &pu);
        CHECK(pu.mtp_reserved_bytes == 0 && pu.mtp_pages_used == 0 && pu.mtp_seqs == 0);
        free(hid);
        free(a);
        free(b);
        engine_close(e);
    }
}

/* The scheduler's rollback: rows of rejected drafts (and chained rows fed
 * the MTP's own output) are truncated and the accepted rows fed; the MTP
 * KV and every later logit are then those of a sequence that never saw
 * the rejected rows, bit for bit, across a page boundary too. */
TEST(test_mtp_truncate_then_refeed_equals_never_fed)
{
    enum { N = 24, KEEP = 14, BAD = 5 };
    const char *path = mtp_file("mtp_roll", false, 1);
    CHECK(path);
    char err[512];
    engine *e = open_mtp(path, true, err, sizeof err);
    CHECK_MSG(e, "%s", err);
    const engine_info *in = engine_get_info(e);
    const int V = in->n_vocab, E = in->n_embd;
    int32_t t[N], junk[BAD];
    tokens_of(t, N, V, 99u);
    tokens_of(junk, BAD, V, 7u);
    float *hid = malloc(sizeof(float) * N * (size_t)E), *rows = malloc(sizeof(float) * N * (size_t)V);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    float *oa = malloc(sizeof(float) * (size_t)E), *ob = malloc(sizeof(float) * (size_t)E);
    CHECK(hid && rows && la && lb && oa && ob);
    const int s = mtp_rows(e, t, N, hid, rows);     /* only for the hidden rows */
    CHECK(s >= 0);
    engine_seq_free(e, s);
    const int a = engine_seq_new(e), b = engine_seq_new(e);
    CHECK(a >= 0 && b >= 0 && engine_mtp_len(e, a) == 0);
    engine_mtp_item head = { .seq = a, .hidden = hid, .tokens = t + 1, .n = KEEP, .out_hidden = oa };
    /* the kept rows exact, so their K/V have one-row steps' bits (a plain
     * multi-row step may take other products: sgemm at the scalar level) */
    CHECK(engine_mtp_step(e, &head, 1, true, err, sizeof err) == 0);
    head.seq = b;
    CHECK(engine_mtp_step(e, &head, 1, true, err, sizeof err) == 0);
    /* a: chained rows past KEEP (h := o, tokens that will be rejected), over the page at 16 */
    for (int j = 0; j < BAD; j++) {
        engine_mtp_item ch = { .seq = a, .hidden = oa, .tokens = junk + j, .n = 1, .logits = la, .out_hidden = oa };
        CHECK(engine_mtp_step(e, &ch, 1, false, err, sizeof err) == 0);
    }
    CHECK(engine_mtp_len(e, a) == KEEP + BAD);
    engine_seq_usage ua, ub;
    CHECK(engine_seq_get_usage(e, a, &ua) == 0 && engine_seq_get_usage(e, b, &ub) == 0);
    CHECK(ua.mtp_tokens == KEEP + BAD && ub.mtp_tokens == KEEP && ua.mtp_reserved_bytes > ub.mtp_reserved_bytes);
    CHECK(engine_mtp_truncate(e, a, KEEP + BAD + 1) != 0);
    CHECK(engine_mtp_truncate(e, a, KEEP) == 0 && engine_mtp_len(e, a) == KEEP);
    CHECK(engine_seq_get_usage(e, a, &ua) == 0 && ua.mtp_reserved_bytes == ub.mtp_reserved_bytes);
    /* both: the accepted rows KEEP..N-2, each in a step of its own (a
     * batch's rows take other tiles of the products than one sequence's) */
    engine_mtp_item two[2] = {
        { .seq = a, .hidden = hid + (size_t)KEEP * E, .tokens = t + KEEP + 1, .n = N - 1 - KEEP, .logits = la,
          .out_hidden = oa },
        { .seq = b, .hidden = hid + (size_t)KEEP * E, .tokens = t + KEEP + 1, .n = N - 1 - KEEP, .logits = lb,
          .out_hidden = ob },
    };
    CHECK(engine_mtp_step(e, &two[0], 1, false, err, sizeof err) == 0);
    CHECK(engine_mtp_step(e, &two[1], 1, false, err, sizeof err) == 0);
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)V) == 0 && memcmp(oa, ob, sizeof(float) * (size_t)E) == 0);
    /* and the row of the whole sequence computed one row at a time is close (other kernels, same math) */
    double md = 0;
    for (int v = 0; v < V; v++)
        md = fabs(la[v] - rows[(size_t)(N - 2) * V + v]) > md ? fabs(la[v] - rows[(size_t)(N - 2) * V + v]) : md;
    CHECK_MSG(md < 1e-3, "batched MTP rows differ from one-row steps by %g", md);
    /* exact rows, both sequences in one batch: the bits of one-row steps */
    CHECK(engine_mtp_truncate(e, a, KEEP) == 0 && engine_mtp_truncate(e, b, KEEP) == 0);
    CHECK(engine_mtp_step(e, two, 2, true, err, sizeof err) == 0);
    CHECK_MSG(memcmp(la, rows + (size_t)(N - 2) * V, sizeof(float) * (size_t)V) == 0 &&
              memcmp(lb, rows + (size_t)(N - 2) * V, sizeof(float) * (size_t)V) == 0,
              "an exact multi-row MTP step differs from one-row steps");
    /* bad input is an error, and changes nothing */
    int32_t bad = V;
    engine_mtp_item bi = { .seq = a, .hidden = hid, .tokens = &bad, .n = 1 };
    CHECK(engine_mtp_step(e, &bi, 1, false, err, sizeof err) != 0 && engine_mtp_len(e, a) == N - 1);
    bi.seq = 77;
    bi.tokens = t;
    CHECK(engine_mtp_step(e, &bi, 1, false, err, sizeof err) != 0);
    /* a fork starts with no MTP rows */
    const int f = engine_seq_fork(e, b, 0);
    CHECK(f >= 0 && engine_mtp_len(e, f) == 0);
    engine_seq_free(e, f);
    engine_seq_free(e, a);
    engine_seq_free(e, b);
    free(hid);
    free(rows);
    free(la);
    free(lb);
    free(oa);
    free(ob);
    engine_close(e);
}

TEST(test_mtp_is_opt_in_and_refused_without_a_block)
{
    const char *path = mtp_file("mtp_off", false, 1);
    CHECK(path);
    char err[512];
    engine *e = open_mtp(path, false, err, sizeof err);
    CHECK_MSG(e, "%s", err);
    const engine_info *in = engine_get_info(e);
    CHECK(in->has_mtp && !in->mtp_enabled && in->mtp_budget_bytes == 0 && in->mtp_bytes_per_token == 0);
    const int s = engine_seq_new(e);
    CHECK(s >= 0 && engine_mtp_len(e, s) == -1);
    float h[1024] = { 0 };
    int32_t tok = 1;
    engine_mtp_item mi = { .seq = s, .hidden = h, .tokens = &tok, .n = 1 };
    CHECK(engine_mtp_step(e, &mi, 1, false, err, sizeof err) != 0 && strstr(err, "without MTP"));
    engine_pool_usage pu;
    engine_get_pool_usage(e, &pu);
    CHECK(pu.mtp_budget_bytes == 0 && pu.mtp_reserved_bytes == 0);
    engine_close(e);
    /* no block: refused at open, naming the key */
    const char *plain = mtp_file("mtp_none", false, 0);
    CHECK(plain);
    CHECK(open_mtp(plain, true, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "has no MTP block (nextn_predict_layers is 0)"), "%s", err);
    /* N = 2: the first block runs */
    const char *two = mtp_file("mtp_two", false, 2);
    CHECK(two);
    e = open_mtp(two, true, err, sizeof err);
    CHECK_MSG(e, "%s", err);
    CHECK(engine_get_info(e)->n_nextn == 2 && engine_get_info(e)->n_layer == 4);
    engine_close(e);
}

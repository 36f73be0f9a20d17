/* test_sched_spec.c - speculative decoding in the scheduler
 * (runtime/sched_spec.c), driven directly on synthesized models of each
 * layer mix synth writes (attention only, Gated DeltaNet with attention,
 * MLA with DeltaNet): the evidence is the non-speculative run of the same
 * request on the same scheduler, never a stored answer.
 *   - a prediction equal to the greedy output: the same tokens, and every
 *     draft the scheduler verified accepted (all but the first token, which
 *     the prompt's logits give, come out of verify steps);
 *   - a shuffled prediction and n-gram drafts: the same tokens;
 *   - 4 sequences at once with the prefix cache on, each with its own
 *     prediction: each equal to its run alone;
 *   - a JSON-object constraint with a prediction: the same tokens;
 *   - sampling: the same seed gives the same tokens (the verifier draws
 *     from the target's distribution exactly as a plain step does), and
 *     over 300 seeds the second token's frequencies with a prediction
 *     drafting it match those without, by a chi-square bound;
 *   - logprobs of the accepted tokens equal the non-speculative ones;
 *   - max_new_tokens is never passed, and a bad prediction id is refused.
 *   - on every layer kind (attention, DeltaNet, MLA, Mamba-2, Mamba-1,
 *     short conv, attention beside Mamba-2, KDA), a rolled-back sequence
 *     continues bit for bit as another rolled back from other drafts.
 *   - the draft model (SCHED_SPEC_DRAFT): greedy output equal to no
 *     speculation with a 2-layer draft of another mix (rejections and
 *     rollbacks of both sequences) and with the target as its own draft
 *     (every draft accepted), the draft pool empty after; another
 *     vocabulary refused by sched_new.
 *   - the MTP head (SCHED_SPEC_MTP): greedy output equal to no speculation
 *     with a random MTP block (rollbacks) and one that drafts a repeat
 *     (accepted), the MTP pool empty after; an engine without it refused.
 * The verify steps are exact (engine_batch_item.exact): their rows are
 * the one-token steps' bits, so "the same tokens" and "the same logprobs"
 * are equalities, not tolerances. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "scheduler.h"
#include "synth.h"
#include "test.h"

/* An engine on path for these tests: one thread, 6 sequences of 512;
 * mtp: with the MTP block's cache. */
static engine *open_path_mtp(const char *path, bool mtp)
{
    char err[256];
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 1;
    p.max_seqs = 6;
    p.n_ctx = 512;
    p.mtp = mtp;
    engine *e = engine_open(&p, err, sizeof err);
    if (!e)
        fprintf(stderr, "    engine_open: %s\n", err);
    return e;
}

static engine *open_path(const char *path)
{
    return open_path_mtp(path, false);
}

/* A synth model of arch/pattern, seed and vocabulary of the caller's. */
static engine *open_synth(const char *tag, const char *arch, const char *pattern, int n_layer, uint32_t seed,
                          int n_vocab)
{
    char path[512], err[256];
    synth_config c;
    synth_config_default(&c);
    if (arch)
        snprintf(c.arch, sizeof c.arch, "%s", arch);
    c.seed = seed;
    c.n_layer = n_layer;
    c.n_vocab = n_vocab;
    snprintf(c.pattern, sizeof c.pattern, "%s", pattern);
    snprintf(path, sizeof path, "%s/spec_%s.gguf", test_tmpdir(), tag);
    if (synth_write(&c, path, err, sizeof err) != 0) {
        fprintf(stderr, "    synth: %s\n", err);
        return NULL;
    }
    return open_path(path);
}

static engine *open_arch(const char *tag, const char *arch, const char *pattern)
{
    return open_synth(tag, arch, pattern, 4, 7, 300);
}

static engine *open_mix(const char *tag, const char *pattern)
{
    return open_arch(tag, NULL, pattern);
}

/* The trained default model (models/default.gguf, a DeltaNet hybrid):
 * random-weight models repeat one token, so a shuffled prediction or a
 * sampled distribution needs text with some variety. NULL when absent. */
static engine *open_default(void)
{
    FILE *f = fopen("models/default.gguf", "rb");
    if (!f)
        return NULL;
    fclose(f);
    return open_path("models/default.gguf");
}

static int tokenize(engine *e, const char *text, int32_t *out, int cap)
{
    int n = engine_tokenize(e, text, strlen(text), true, false, out, cap);
    return n > cap ? cap : n;
}

static sched *start(engine *e, bool prefix, int spec_type)
{
    sched_params sp;
    sched_params_default(&sp);
    sp.n_threads = 1;
    sp.prefix_cache = prefix;
    sp.spec_type = spec_type;
    /* the cost gate weighs measured step times, which differ from run to
     * run: these tests count drafts, so the length follows acceptance
     * alone (the gate's own test gives it fixed times) */
    sp.spec_cost = false;
    char err[256];
    sched *s = sched_new(e, &sp, err, sizeof err);
    if (s && sched_start(s) != 0) {
        sched_free(s);
        return NULL;
    }
    return s;
}

/* One run's output. */
typedef struct run_out {
    int32_t tok[256];
    float lp[256];
    int n;
    int error;
    sched_result res;
} run_out;

static sched_req_params request(const int32_t *prompt, int n_prompt, int max_new)
{
    sched_req_params rp = {0};
    rp.id = "spec";
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rp.max_new_tokens = max_new;
    rp.ignore_eos = true;
    sampler_params_default(&rp.sampling);
    rp.sampling.greedy = true;
    return rp;
}

/* Collect r's tokens into o until its last event. */
static void collect(sched_req *r, run_out *o)
{
    for (;;) {
        sched_event ev;
        if (!sched_req_next(r, &ev, 20000)) {
            o->error = -100;
            break;
        }
        const bool last = ev.kind == SCHED_EV_ERROR || (ev.kind == SCHED_EV_TOKEN && ev.final);
        if (ev.kind == SCHED_EV_TOKEN && o->n < 256) {
            o->tok[o->n] = ev.token;
            o->lp[o->n++] = ev.logprob;
        }
        if (ev.kind == SCHED_EV_ERROR)
            o->error = ev.error;
        sched_event_clear(&ev);
        if (last)
            break;
    }
    sched_req_result(r, &o->res);
    sched_req_release(r);
}

static int run(sched *s, const sched_req_params *rp, run_out *o)
{
    sched_req *r = NULL;
    char err[256];
    memset(o, 0, sizeof *o);
    int rc = sched_submit(s, rp, &r, err, sizeof err);
    if (rc) {
        fprintf(stderr, "    submit: %s\n", err);
        return rc;
    }
    collect(r, o);
    return o->error;
}

static bool same_tokens(const run_out *a, const run_out *b)
{
    return a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof a->tok[0]);
}

static const struct { const char *tag, *pattern; } mixes[] = {
    { "attn", "A" }, { "dnet", "LLLA" }, { "mla", "LAML" },
};

static void prompt_of(int32_t *p, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (int32_t)(1 + (seed >> 8) % 290u);
    }
}

TEST(test_spec_greedy_prediction_equal_to_output_is_accepted_whole_and_changes_nothing)
{
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++) {
        engine *e = open_mix(mixes[m].tag, mixes[m].pattern);
        CHECK(e != NULL);
        sched *s = start(e, true, SCHED_SPEC_NONE);
        CHECK(s != NULL);
        int32_t prompt[12];
        prompt_of(prompt, 12, 3 + (uint32_t)m);
        const int n_new = 64;
        run_out base, spec, ngram;
        sched_req_params rp = request(prompt, 12, n_new);
        rp.speculative = -1;
        CHECK(run(s, &rp, &base) == 0 && base.n == n_new);
        CHECK(base.res.spec.drafted == 0);

        rp.speculative = 0;
        rp.prediction = base.tok;
        rp.n_prediction = base.n;
        CHECK(run(s, &rp, &spec) == 0);
        CHECK(same_tokens(&base, &spec));
        /* every draft verified was accepted, and with each verify step's own
         * token they cover every token after the first (the prompt's logits
         * give that one) */
        CHECK(spec.res.spec.drafted > 0 && spec.res.spec.accepted == spec.res.spec.drafted);
        CHECK(spec.res.spec.accepted + spec.res.spec.drafts == (uint64_t)(n_new - 1));
        CHECK(spec.res.spec.pred_accepted == (uint64_t)n_new);  /* every output token was the prediction's */
        CHECK(spec.res.spec.pred_rejected == 0 && spec.res.spec.rollbacks == 0);
        /* logprobs of the accepted tokens are the verifying distribution's.
         * Not bit for bit here: the prefix cache is on, so this second run
         * restores the first's prompt and computes its last token in a
         * one-token step where the first prefilled all 12 at once (the
         * verify rows themselves are exact: the rollback test below) */
        for (int i = 0; i < base.n; i++)
            CHECK_MSG(fabsf(base.lp[i] - spec.lp[i]) <= 1e-5f + 1e-4f * fabsf(base.lp[i]),
                      "%s token %d: logprob %.9g vs %.9g", mixes[m].tag, i, (double)base.lp[i], (double)spec.lp[i]);
        /* n-gram drafts (speculative: true) */
        rp.prediction = NULL;
        rp.n_prediction = 0;
        rp.speculative = 1;
        CHECK(run(s, &rp, &ngram) == 0);
        CHECK(same_tokens(&base, &ngram));
        sched_free(s);
        engine_close(e);
    }
}

/* The cost gate (runtime/spec_cost.h) with fixed step times by rows. Where
 * a verify row costs as much as a step of its own (t(r) = r), no draft at
 * an acceptance rate below 1 pays, so only the gate's probes (every 16th
 * proposal) verify; where rows are nearly free, every step drafts, as
 * without the gate. The output is the same either way. */
TEST(test_spec_cost_gate_declines_drafts_whose_rows_cost_more_than_they_save)
{
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++) {
        engine *e = open_mix(mixes[m].tag, mixes[m].pattern);
        CHECK(e != NULL);
        double dear[SCHED_SPEC_MAX_POS + 2], cheap[SCHED_SPEC_MAX_POS + 2];
        for (int r = 0; r < SCHED_SPEC_MAX_POS + 2; r++) {
            dear[r] = (double)r;
            cheap[r] = 1.0 + 0.01 * (double)(r - 1);
        }
        int32_t prompt[12];
        prompt_of(prompt, 12, 7 + (uint32_t)m);
        const int n_new = 64;
        run_out base, gated, open;
        for (int pass = 0; pass < 2; pass++) {
            sched_params sp;
            sched_params_default(&sp);
            sp.n_threads = 1;
            sp.prefix_cache = false;
            sp.spec_step_seconds = pass == 0 ? dear : cheap;
            sp.spec_step_seconds_n = SCHED_SPEC_MAX_POS + 2;
            char err[256];
            sched *s = sched_new(e, &sp, err, sizeof err);
            CHECK(s != NULL && sched_start(s) == 0);
            sched_req_params rp = request(prompt, 12, n_new);
            rp.speculative = -1;
            if (pass == 0)
                CHECK(run(s, &rp, &base) == 0 && base.n == n_new);
            /* a prediction equal to the greedy output, cut short so the
             * acceptance rate stays below 1 (the last drafts are wrong) */
            int32_t pred[256];
            memcpy(pred, base.tok, sizeof base.tok);
            for (int i = 40; i < n_new; i++)
                pred[i] = (base.tok[i] + 1) % 290;
            rp.speculative = 0;
            rp.prediction = pred;
            rp.n_prediction = n_new;
            run_out *o = pass == 0 ? &gated : &open;
            CHECK(run(s, &rp, o) == 0);
            CHECK(same_tokens(&base, o));
            sched_stats st;
            CHECK(sched_get_stats(s, &st, NULL, NULL) == 0);
            CHECK(st.spec_cost && st.spec.declined == o->res.spec.declined);
            CHECK_NEAR(st.spec_step_seconds[3], sp.spec_step_seconds[3], 1e-12);
            sched_free(s);
        }
        fprintf(stderr, "    %s: rows as dear as steps: %llu drafts verified, %llu declined; nearly free: %llu "
                "verified, %llu declined\n", mixes[m].tag, (unsigned long long)gated.res.spec.drafts,
                (unsigned long long)gated.res.spec.declined, (unsigned long long)open.res.spec.drafts,
                (unsigned long long)open.res.spec.declined);
        /* the first proposal is made before any acceptance is seen (a = 1/2),
         * and it is declined there; then one probe in every 16 proposals */
        CHECK(gated.res.spec.declined >= 15 && gated.res.spec.drafts >= 1);
        CHECK(gated.res.spec.drafts * 15 <= gated.res.spec.declined + 15);
        CHECK(open.res.spec.declined == 0 && open.res.spec.drafts >= 2);
        CHECK(open.res.spec.accepted >= 39 - open.res.spec.drafts);
        engine_close(e);
    }
}

TEST(test_spec_trained_model_shuffled_prediction_and_copying_prompt)
{
    engine *e = open_default();
    if (!e)
        SKIP("models/default.gguf is absent");
    sched *s = start(e, true, SCHED_SPEC_NONE);
    CHECK(s != NULL);
    int32_t prompt[64];
    int np = tokenize(e, "The committee said that the new law would", prompt, 64);
    CHECK(np > 2);
    const int n_new = 48;
    run_out base, shuf, copy_plain, copy_ngram;
    sched_req_params rp = request(prompt, np, n_new);
    rp.speculative = -1;
    CHECK(run(s, &rp, &base) == 0 && base.n == n_new);
    /* a shuffled prediction: the same output, next to nothing accepted */
    int32_t bad[256];
    memcpy(bad, base.tok, (size_t)base.n * sizeof bad[0]);
    uint32_t x = 12345;
    for (int i = base.n - 1; i > 0; i--) {
        x = x * 1664525u + 1013904223u;
        int j = (int)((x >> 8) % (uint32_t)(i + 1));
        int32_t t = bad[i];
        bad[i] = bad[j];
        bad[j] = t;
    }
    rp.speculative = 0;
    rp.prediction = bad;
    rp.n_prediction = base.n;
    CHECK(run(s, &rp, &shuf) == 0);
    CHECK(same_tokens(&base, &shuf));
    fprintf(stderr, "    shuffled prediction: %llu of %llu drafts accepted\n",
            (unsigned long long)shuf.res.spec.accepted, (unsigned long long)shuf.res.spec.drafted);
    CHECK(shuf.res.spec.accepted * 4 <= shuf.res.spec.drafted + 4);
    /* n-gram on a prompt that repeats: this 4.4M-parameter model does not
     * copy the prompt (it answers " of the 1960, and the 1960, was ..."),
     * but it repeats its own phrases, and the lookup drafts those */
    const char *rep = "one two three four five six seven eight nine ten. one two three four five six seven eight "
                      "nine ten. one two three four five six seven eight nine ten. one two three";
    int32_t cp[128];
    int nc = tokenize(e, rep, cp, 128);
    CHECK(nc > 10);
    rp = request(cp, nc, 40);
    rp.speculative = -1;
    CHECK(run(s, &rp, &copy_plain) == 0);
    rp.speculative = 1;
    CHECK(run(s, &rp, &copy_ngram) == 0);
    CHECK(same_tokens(&copy_plain, &copy_ngram));
    fprintf(stderr, "    copying prompt, n-gram: %llu of %llu drafts accepted over %d tokens in %llu verify steps\n",
            (unsigned long long)copy_ngram.res.spec.accepted, (unsigned long long)copy_ngram.res.spec.drafted,
            copy_ngram.n, (unsigned long long)copy_ngram.res.spec.drafts);
    CHECK(copy_ngram.res.spec.accepted > 0);
    sched_free(s);
    engine_close(e);
}

TEST(test_spec_four_sequences_at_once_each_equal_to_its_run_alone)
{
    engine *e = open_mix("dnet4", "LLLA");
    CHECK(e != NULL);
    sched *s = start(e, true, SCHED_SPEC_NGRAM);
    CHECK(s != NULL);
    enum { N = 4, NEW = 48 };
    int32_t prompt[N][10];
    run_out *alone = calloc(N, sizeof *alone), *together = calloc(N, sizeof *together);
    CHECK(alone && together);
    sched_req_params rp[N];
    for (int i = 0; i < N; i++) {
        prompt_of(prompt[i], 10, 40 + (uint32_t)i);
        rp[i] = request(prompt[i], 10, NEW);
        rp[i].speculative = -1;
        CHECK(run(s, &rp[i], &alone[i]) == 0);
    }
    /* half with the exact prediction, half with a prediction that leaves
     * it after 10 tokens, all with n-gram drafts from the server */
    int32_t pred[N][NEW];
    sched_req *r[N];
    char err[256];
    for (int i = 0; i < N; i++) {
        memcpy(pred[i], alone[i].tok, sizeof pred[i]);
        if (i % 2)
            for (int j = 10; j < NEW; j++)
                pred[i][j] = (pred[i][j] + 7) % 300;
        rp[i].speculative = 0;
        rp[i].prediction = pred[i];
        rp[i].n_prediction = NEW;
        memset(&together[i], 0, sizeof together[i]);
        CHECK(sched_submit(s, &rp[i], &r[i], err, sizeof err) == 0);
    }
    for (int i = 0; i < N; i++)
        collect(r[i], &together[i]);
    for (int i = 0; i < N; i++) {
        CHECK(together[i].error == 0);
        CHECK(same_tokens(&alone[i], &together[i]));
        CHECK(together[i].res.spec.accepted > 0);
    }
    sched_stats st;
    CHECK(sched_get_stats(s, &st, NULL, NULL) == 0);
    CHECK(st.spec.drafted >= st.spec.accepted && st.spec.accepted > 0);
    CHECK(st.spec_accepted_per_pos[0] > 0 && st.spec_accepted_per_pos[0] <= st.spec.drafts);
    CHECK(st.spec_snapshots == 0);      /* every request gave its rollback snapshot back */
    free(alone);
    free(together);
    sched_free(s);
    engine_close(e);
}

TEST(test_spec_grammar_drafts_keep_the_constrained_output)
{
    engine *e = open_mix("gram", "LLLA");
    CHECK(e != NULL);
    sched *s = start(e, false, SCHED_SPEC_NGRAM);
    CHECK(s != NULL);
    int32_t prompt[8];
    prompt_of(prompt, 8, 99);
    run_out base, spec;
    sched_req_params rp = request(prompt, 8, 40);
    rp.ignore_eos = false;
    rp.constraint = SCHED_CONSTRAINT_JSON_OBJECT;
    rp.speculative = -1;
    CHECK(run(s, &rp, &base) == 0 && base.n > 0);
    /* the exact output as the prediction, then one where a token the
     * grammar would refuse sits in the middle: the draft stops before it */
    rp.speculative = 0;
    rp.prediction = base.tok;
    rp.n_prediction = base.n;
    CHECK(run(s, &rp, &spec) == 0);
    CHECK(same_tokens(&base, &spec));
    int32_t bad[256];
    memcpy(bad, base.tok, (size_t)base.n * sizeof bad[0]);
    if (base.n > 6)
        bad[base.n / 2] = base.tok[0];      /* a second "{" opening mid-object, or the like */
    rp.prediction = bad;
    CHECK(run(s, &rp, &spec) == 0);
    CHECK(same_tokens(&base, &spec));
    sched_free(s);
    engine_close(e);
}

TEST(test_spec_sampled_tokens_keep_their_distribution)
{
    engine *e = open_default();
    if (!e)
        SKIP("models/default.gguf is absent");
    sched *s = start(e, false, SCHED_SPEC_NONE);
    CHECK(s != NULL);
    int32_t prompt[32];
    const int np = tokenize(e, "It was the first time that", prompt, 32);
    /* the prediction: the greedy output, so the second token's draft is
     * the most likely token (accepted often, rejected often) */
    run_out g, a, b;
    sched_req_params rp = request(prompt, np, 3);
    rp.speculative = -1;
    CHECK(run(s, &rp, &g) == 0 && g.n == 3);
    enum { SEEDS = 300, BINS = 8 };
    int cnt[2][BINS] = {{0}};   /* bins: the 7 ids most frequent without speculation, the rest */
    int32_t *second[2];
    second[0] = calloc(SEEDS, sizeof(int32_t));
    second[1] = calloc(SEEDS, sizeof(int32_t));
    CHECK(second[0] && second[1]);
    int same = 0;
    uint64_t drafted = 0, accepted = 0;
    for (int i = 0; i < SEEDS; i++) {
        rp.sampling.greedy = false;
        rp.sampling.temperature = 1.0f;
        rp.sampling.seed = 1000 + (uint64_t)i;
        rp.speculative = -1;
        rp.prediction = NULL;
        rp.n_prediction = 0;
        CHECK(run(s, &rp, &a) == 0 && a.n == 3);
        rp.speculative = 0;
        rp.prediction = g.tok;
        rp.n_prediction = 3;
        CHECK(run(s, &rp, &b) == 0 && b.n == 3);
        same += same_tokens(&a, &b);
        drafted += b.res.spec.drafted;
        accepted += b.res.spec.accepted;
        second[0][i] = a.tok[1];
        second[1][i] = b.tok[1];
    }
    /* the verifier draws from the target exactly as a plain step does, on
     * the same bits (exact verify rows): with one seed the tokens are the same */
    fprintf(stderr, "    same %d, accepted %llu of %llu\n", same, (unsigned long long)accepted,
            (unsigned long long)drafted);
    CHECK(same == SEEDS);
    CHECK(drafted > 0 && accepted > 0 && accepted < drafted);   /* both branches of the rule ran */
    /* and by a test that holds for any exact rule: two-sample chi-square
     * over BINS bins, df = 7, bound 24.3 (p = 0.001) */
    int32_t top[BINS - 1];
    int n_top = 0;
    for (int t = 0; t < BINS - 1; t++) {
        int best = -1, best_n = 0;
        for (int i = 0; i < SEEDS; i++) {
            bool taken = false;
            for (int k = 0; k < n_top; k++)
                taken |= top[k] == second[0][i];
            if (taken)
                continue;
            int c = 0;
            for (int j = 0; j < SEEDS; j++)
                c += second[0][j] == second[0][i];
            if (c > best_n) {
                best_n = c;
                best = second[0][i];
            }
        }
        if (best >= 0)
            top[n_top++] = best;
    }
    for (int w = 0; w < 2; w++) {
        for (int i = 0; i < SEEDS; i++) {
            int bin = BINS - 1;
            for (int k = 0; k < n_top; k++)
                if (second[w][i] == top[k])
                    bin = k;
            cnt[w][bin]++;
        }
    }
    double chi2 = 0;
    for (int k = 0; k < BINS; k++)
        if (cnt[0][k] + cnt[1][k] > 0)
            chi2 += (double)(cnt[0][k] - cnt[1][k]) * (cnt[0][k] - cnt[1][k]) / (cnt[0][k] + cnt[1][k]);
    fprintf(stderr, "    second token over %d seeds: chi-square %.2f (bound 24.3), same text %d, drafts accepted "
            "%llu of %llu\n", SEEDS, chi2, same, (unsigned long long)accepted, (unsigned long long)drafted);
    CHECK(chi2 < 24.3);
    free(second[0]);
    free(second[1]);
    sched_free(s);
    engine_close(e);
}

TEST(test_spec_never_passes_max_new_tokens_and_refuses_bad_prediction_ids)
{
    engine *e = open_mix("max", "LLLA");
    CHECK(e != NULL);
    sched *s = start(e, false, SCHED_SPEC_NONE);
    CHECK(s != NULL);
    int32_t prompt[6];
    prompt_of(prompt, 6, 11);
    run_out base, spec;
    sched_req_params rp = request(prompt, 6, 40);
    rp.speculative = -1;
    CHECK(run(s, &rp, &base) == 0 && base.n == 40);
    for (int max_new = 1; max_new <= 9; max_new += 4) {
        rp = request(prompt, 6, max_new);
        rp.prediction = base.tok;
        rp.n_prediction = base.n;     /* longer than max_new */
        CHECK(run(s, &rp, &spec) == 0);
        CHECK(spec.n == max_new && !memcmp(spec.tok, base.tok, (size_t)max_new * sizeof spec.tok[0]));
    }
    int32_t bad[3] = {1, 300, 2};
    rp.prediction = bad;
    rp.n_prediction = 3;
    sched_req *r = NULL;
    char err[256] = "";
    CHECK(sched_submit(s, &rp, &r, err, sizeof err) == SCHED_EINVAL && r == NULL);
    CHECK(strstr(err, "outside the vocabulary") != NULL);
    bad[1] = -1;
    CHECK(sched_submit(s, &rp, &r, err, sizeof err) == SCHED_EINVAL);
    sched_free(s);
    engine_close(e);
}

/* The rollback leaves no trace of the rejected tokens, for every layer
 * kind: two sequences of one prompt verify [t, d1..d6] and [t, e1..e6]
 * (other drafts, both rejected whole) in exact steps, as the scheduler
 * runs them, each truncated back to after t with the snapshot its step
 * took after t, then take the same three tokens one step at a time: their
 * logits agree bit for bit with each other and with a sequence that never
 * speculated (t in a one-token step). */
/* every recurrent kind: the synth mixes and a family of each other kind */
static const struct { const char *tag, *arch, *pattern; } kinds[] = {
    { "attn", NULL, "A" }, { "dnet", NULL, "LLLA" }, { "mla", NULL, "LAML" },
    { "mamba2", "granitehybrid", "SSSA" }, { "mamba1", "jamba", "BBAB" }, { "sconv", "lfm2", "CCAC" },
    { "hybrid_head", "falcon-h1", "HHH" }, { "kda", "kimi-linear", "KKMK" },
};

TEST(test_spec_rollback_leaves_no_trace_of_the_rejected_tokens)
{
    for (size_t m = 0; m < sizeof kinds / sizeof kinds[0]; m++) {
        engine *e = open_arch(kinds[m].tag, kinds[m].arch, kinds[m].pattern);
        CHECK(e != NULL);
        const int nv = engine_get_info(e)->n_vocab;
        float *scratch = malloc((size_t)8 * (size_t)nv * sizeof(float));     /* the verify steps' rows */
        float *out = malloc((size_t)3 * (size_t)nv * sizeof(float));
        float *ref = malloc((size_t)3 * (size_t)nv * sizeof(float));
        float *plain = malloc((size_t)3 * (size_t)nv * sizeof(float));
        CHECK(scratch && out && ref && plain);
        int32_t prompt[10], step[2][7], cont[3] = {17, 42, 99};
        prompt_of(prompt, 10, 21 + (uint32_t)m);
        prompt_of(step[0], 7, 5);
        prompt_of(step[1], 7, 6);
        step[1][0] = step[0][0];        /* the same accepted token t, other drafts */
        char err[256];
        for (int v = 0; v < 3; v++) {
            int seq = engine_seq_new(e);
            CHECK(seq >= 0 && engine_seq_reserve(e, seq, 32) == 0);
            engine_batch_item it = { .seq = seq, .tokens = prompt, .n_tokens = 10, .logits = ENGINE_LOGITS_NONE };
            CHECK(engine_forward(e, &it, 1, err, sizeof err) == 0);
            if (v < 2) {
                engine_snap *sn = engine_snap_new(e);
                const bool rec = engine_snap_bytes(e) > 0;
                CHECK(!rec || sn != NULL);
                it = (engine_batch_item){ .seq = seq, .tokens = step[v], .n_tokens = 7, .logits = ENGINE_LOGITS_ALL,
                                          .out = scratch, .snap = rec ? sn : NULL, .snap_at = rec ? 1 : 0,
                                          .exact = 1 };
                CHECK(engine_forward(e, &it, 1, err, sizeof err) == 0);
                CHECK(engine_seq_truncate(e, seq, 11, rec ? sn : NULL) == 0 && engine_seq_len(e, seq) == 11);
                engine_snap_free(e, sn);
            } else {
                it = (engine_batch_item){ .seq = seq, .tokens = step[0], .n_tokens = 1, .logits = ENGINE_LOGITS_LAST,
                                          .out = scratch };
                CHECK(engine_forward(e, &it, 1, err, sizeof err) == 0);
            }
            float *dst = v == 0 ? ref : v == 1 ? out : plain;
            for (int j = 0; j < 3; j++) {
                it = (engine_batch_item){ .seq = seq, .tokens = cont + j, .n_tokens = 1, .logits = ENGINE_LOGITS_LAST,
                                          .out = dst + (size_t)j * (size_t)nv };
                CHECK(engine_forward(e, &it, 1, err, sizeof err) == 0);
            }
            engine_seq_free(e, seq);
        }
        float worst = 0, twin = 0;
        for (size_t i = 0; i < (size_t)3 * (size_t)nv; i++)
            twin = fmaxf(twin, fabsf(ref[i] - out[i]));
        /* bit for bit: the verify step is exact, as the scheduler runs it */
        CHECK(twin == 0.0f);
        for (size_t i = 0; i < (size_t)3 * (size_t)nv; i++)
            worst = fmaxf(worst, fabsf(ref[i] - plain[i]));
        fprintf(stderr, "    %s: two rollbacks differ by %.3g, %.2g from never speculating\n", kinds[m].tag,
                (double)twin, (double)worst);
        CHECK(worst == 0.0f);
        free(scratch);
        free(out);
        free(ref);
        free(plain);
        engine_close(e);
    }
}

/* Six greedy 48-token requests (prompts from seed0 on), each run without
 * speculation and then with the server's drafts: false when a pair
 * differs or a run fails; the speculative runs' counts add into *sum. */
static bool six_runs_equal(sched *s, uint32_t seed0, sched_spec_counts *sum)
{
    for (uint32_t q = 0; q < 6; q++) {
        int32_t prompt[10];
        prompt_of(prompt, 10, seed0 + q);
        run_out base, spec;
        sched_req_params rp = request(prompt, 10, 48);
        rp.speculative = -1;
        if (run(s, &rp, &base) != 0 || base.n != 48 || base.res.spec.drafted != 0)
            return false;
        rp.speculative = 0;
        if (run(s, &rp, &spec) != 0 || !same_tokens(&base, &spec)) {
            fprintf(stderr, "    prompt %u differs with speculation\n", seed0 + q);
            return false;
        }
        sum->drafted += spec.res.spec.drafted;
        sum->accepted += spec.res.spec.accepted;
        sum->rollbacks += spec.res.spec.rollbacks;
    }
    return true;
}

static sched *start_draft(engine *e, engine *d, char *err, size_t errlen)
{
    sched_params sp;
    sched_params_default(&sp);
    sp.n_threads = 1;
    sp.prefix_cache = true;
    sp.spec_type = SCHED_SPEC_DRAFT;
    sp.draft = d;
    sp.spec_cost = false;   /* as start(): drafts are counted */
    sched *s = sched_new(e, &sp, err, errlen);
    if (s && sched_start(s) != 0) {
        sched_free(s);
        return NULL;
    }
    return s;
}

/* --spec-type draft-simple: a DeltaNet target with a 2-layer draft of
 * another mix (recurrent too: its rollbacks restore its snapshot) and with
 * itself as draft; greedy output equal to no speculation, rejections
 * happened (the other draft) or none (itself), the draft engine's pool
 * empty again after the requests; a draft of another vocabulary refused. */
TEST(test_spec_draft_model_keeps_greedy_output_and_gives_its_sequences_back)
{
    engine *e = open_synth("dm_target", NULL, "LLLA", 4, 7, 300);
    engine *d = open_synth("dm_draft", NULL, "LA", 2, 11, 300);
    engine *self = open_synth("dm_target", NULL, "LLLA", 4, 7, 300);
    engine *other = open_synth("dm_vocab", NULL, "LA", 2, 11, 320);
    CHECK(e && d && self && other);
    char err[256];
    sched *bad = start_draft(e, other, err, sizeof err);
    CHECK(bad == NULL);
    CHECK_MSG(strstr(err, "vocabulary has 320 tokens, the model's 300") != NULL, "%s", err);
    engine *drafts[2] = { d, self };
    for (int k = 0; k < 2; k++) {
        sched *s = start_draft(e, drafts[k], err, sizeof err);
        CHECK_MSG(s != NULL, "%s", err);
        sched_spec_counts n = {0};
        CHECK_MSG(six_runs_equal(s, 40, &n), "draft %d", k);
        const uint64_t drafted = n.drafted, accepted = n.accepted, rollbacks = n.rollbacks;
        CHECK(drafted > 0);
        if (k == 1)
            CHECK_MSG(accepted == drafted && rollbacks == 0, "itself: %llu of %llu", (unsigned long long)accepted,
                      (unsigned long long)drafted);
        else
            CHECK_MSG(rollbacks > 0, "another draft: %llu of %llu accepted", (unsigned long long)accepted,
                      (unsigned long long)drafted);
        sched_free(s);
        engine_pool_usage u;
        engine_get_pool_usage(drafts[k], &u);
        CHECK(u.n_seqs == 0 && u.n_snaps == 0 && u.reserved_bytes == 0);
    }
    engine_close(other);
    engine_close(self);
    engine_close(d);
    engine_close(e);
}

/* The MTP head (SCHED_SPEC_MTP): a qwen35 file with an MTP block of random
 * weights (its drafts nearly all rejected: rollbacks) and a tied one whose
 * block drafts a repeat of the last token as the trunk tends to
 * (synth --mtp-copy: drafts accepted, whole and in part), greedy output
 * equal to no speculation with the prefix cache on, the MTP pool empty
 * after; an engine opened without the block's cache refused by sched_new. */
TEST(test_spec_mtp_keeps_greedy_output_and_gives_its_rows_back)
{
    char err[256];
    engine *plain = open_synth("mtp_plain", NULL, "LLLA", 4, 7, 300);
    CHECK(plain);
    sched_params sp;
    sched_params_default(&sp);
    sp.spec_type = SCHED_SPEC_MTP;
    CHECK(sched_new(plain, &sp, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "no MTP block (nextn_predict_layers is 0)") != NULL, "%s", err);
    engine_close(plain);
    for (int copy = 0; copy <= 1; copy++) {
        char path[512];
        synth_config c;
        synth_config_default(&c);
        c.seed = 50 + (uint64_t)copy;
        c.n_layer = 4;
        c.n_vocab = 300;
        snprintf(c.pattern, sizeof c.pattern, "LLLA");
        c.n_mtp = 1;
        c.mtp_copy = copy;
        c.tied = copy;          /* a tied random model repeats its last token: the copy block's drafts are right */
        snprintf(path, sizeof path, "%s/spec_mtp%d.gguf", test_tmpdir(), copy);
        CHECK_MSG(synth_write(&c, path, err, sizeof err) == 0, "%s", err);
        engine *e = open_path_mtp(path, true);
        CHECK(e);
        sched *s = start(e, true, SCHED_SPEC_MTP);
        CHECK(s);
        sched_spec_counts n = {0};
        CHECK_MSG(six_runs_equal(s, 60, &n), "mtp copy %d", copy);
        const uint64_t drafted = n.drafted, accepted = n.accepted, rollbacks = n.rollbacks;
        CHECK(drafted > 0 && rollbacks > 0);
        if (copy)
            CHECK_MSG(accepted * 2 > drafted, "copy: %llu of %llu accepted", (unsigned long long)accepted,
                      (unsigned long long)drafted);
        sched_free(s);
        engine_pool_usage u;
        engine_get_pool_usage(e, &u);
        CHECK(u.mtp_budget_bytes > 0 && u.mtp_reserved_bytes == 0 && u.mtp_seqs == 0 && u.mtp_pages_used == 0);
        engine_close(e);
    }
}

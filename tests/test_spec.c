/* test_spec.c - the engine facts speculative decoding rests on (issue 42).
 *
 * A verify step feeds k tokens [t, d1 .. d(k-1)] of one sequence in one
 * engine step. Without engine_batch_item.exact its logits are only close
 * to those of k one-token steps (the multi-token products, attention and
 * the chunked recurrences take other kernels: max abs difference ~1e-5 on
 * these models). With exact they must be the same bits, for every layer
 * kind and weight type, so that greedy output under speculation is the
 * output without it; and after a rejection, truncating to the accepted
 * length with a snapshot taken inside the step (or before it, then
 * re-feeding) must leave every state, recurrent and KV, bit for bit what a
 * sequence that never saw the rejected tokens holds
 * (engine_seq_state_equal). The reference throughout is the engine's own
 * one-token step: the product being checked is the identity of two
 * computations, not closeness to a third.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels/ggml_type.h"
#include "synth.h"
#include "test.h"

/* One small model per layer kind and weight type: the synth pattern's
 * letters (A attention, L DeltaNet, M MLA, S Mamba-2, C short conv, F MLP
 * only, H attention + Mamba-2, B Mamba-1, K KDA) in the families that carry
 * them; shape: SHAPE_WIDE the K-quants' 256-wide blocks, SHAPE_ODD widths
 * that are no multiple of 8 (the vector kernels' tails land inside a
 * multi-row step's rows, and a channel share's edge inside a vector). */
enum { SHAPE_SMALL, SHAPE_WIDE, SHAPE_ODD };
typedef struct spec_case {
    const char *tag, *arch, *pattern;
    uint32_t dtype;
    int mix;                    /* SYNTH_MIX_* */
    int shape;                  /* SHAPE_* */
    int state_dtype, kv_dtype, dnet_mode, mla_mode;
} spec_case;

static const spec_case cases[] = {
    { "x_attn", "qwen35", "A", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_dnet", "qwen35", "LLLA", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_mla", "qwen35", "LAML", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_moe", "qwen35moe", "LLLA", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_q3next", "qwen3next", "LLLA", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_mamba2", "granitehybrid", "SSAS", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_nemo", "nemotron_h", "SFAS", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_falcon", "falcon-h1", "H", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_mamba1", "jamba", "BBAB", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_kda", "kimi-linear", "KKMK", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_sconv", "lfm2", "CCAC", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    /* weight types */
    { "x_dnet_f16", "qwen35", "LLLA", GGML_F16, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_dnet_bf16", "qwen35", "LLLA", GGML_BF16, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_dnet_q8", "qwen35", "LLLA", GGML_Q8_0, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_mla_q8", "qwen35", "LAML", GGML_Q8_0, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_mamba2_bf16", "granitehybrid", "SSAS", GGML_BF16, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_kda_q8", "kimi-linear", "KKMK", GGML_Q8_0, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_dnet_q4km", "qwen35", "LLLA", GGML_Q4_K, SYNTH_MIX_K_M, SHAPE_WIDE, 0, 0, 0, 0 },
    { "x_moe_q6k", "qwen35moe", "LLLA", GGML_Q6_K, 0, SHAPE_WIDE, 0, 0, 0, 0 },
    { "x_mamba1_q4k", "jamba", "BBAB", GGML_Q4_K, 0, SHAPE_WIDE, 0, 0, 0, 0 },
    { "x_mla_q5km", "qwen35", "LAML", GGML_Q5_K, SYNTH_MIX_K_M, SHAPE_WIDE, 0, 0, 0, 0 },
    { "x_dnet_q4_0", "qwen35", "LLLA", GGML_Q4_0, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    { "x_sconv_f16", "lfm2", "CCAC", GGML_F16, 0, SHAPE_SMALL, 0, 0, 0, 0 },
    /* cache types and forced forms */
    { "x_dnet_s16", "qwen35", "LLLA", GGML_F32, 0, false, ENGINE_STATE_BF16, ENGINE_KV_F16, 0, 0 },
    { "x_mamba2_s16", "granitehybrid", "SSAS", GGML_F32, 0, false, ENGINE_STATE_BF16, ENGINE_KV_BF16, 0, 0 },
    { "x_mamba1_s16", "jamba", "BBAB", GGML_F32, 0, false, ENGINE_STATE_BF16, 0, 0, 0 },
    { "x_kda_s16", "kimi-linear", "KKMK", GGML_F32, 0, false, ENGINE_STATE_BF16, 0, 0, 0 },
    { "x_dnet_chunk", "qwen35", "LLLA", GGML_F32, 0, SHAPE_SMALL, 0, 0, ENGINE_DNET_CHUNKED, 0 },
    { "x_dnet_chunk16", "qwen35", "LLLA", GGML_F32, 0, false, ENGINE_STATE_BF16, 0, ENGINE_DNET_CHUNKED, 0 },
    { "x_mamba2_chunk", "granitehybrid", "SSAS", GGML_F32, 0, SHAPE_SMALL, 0, 0, ENGINE_DNET_CHUNKED, 0 },
    { "x_mla_abs", "qwen35", "LAML", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, ENGINE_MLA_ABSORBED },
    { "x_mla_exp", "qwen35", "LAML", GGML_F32, 0, SHAPE_SMALL, 0, 0, 0, ENGINE_MLA_EXPANDED },
    { "x_dnet_odd", "qwen35", "LLLA", GGML_F32, 0, SHAPE_ODD, 0, 0, 0, 0 },
    { "x_mamba2_odd", "granitehybrid", "SSAS", GGML_F32, 0, SHAPE_ODD, 0, 0, 0, 0 },
    { "x_kda_odd", "kimi-linear", "KKMK", GGML_F32, 0, SHAPE_ODD, 0, 0, 0, 0 },
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static const spec_case *case_of(const char *tag)
{
    for (int i = 0; i < N_CASES; i++)
        if (!strcmp(cases[i].tag, tag))
            return &cases[i];
    return NULL;
}

static engine *open_case(const spec_case *k, int max_seqs)
{
    synth_config c;
    synth_config_default(&c);
    snprintf(c.arch, sizeof c.arch, "%s", k->arch);
    snprintf(c.pattern, sizeof c.pattern, "%s", k->pattern);
    c.n_layer = 4;
    c.dnet_n_k = 2;
    c.dnet_n_v = 4;
    c.seed = 21;
    c.dtype = k->dtype;
    c.mix = k->mix;
    if (k->shape == SHAPE_ODD) {    /* conv channels 72 (two shares of 36), ff 100, LM head rows 4 k + 3 */
        c.n_vocab = 259;
        c.n_embd = 60;
        c.head_dim = 12;
        c.n_ff = 100;
        c.n_ff_exp = 36;
        c.n_ff_shexp = 36;
        c.dnet_d_k = 9;
        c.dnet_d_v = 9;
        c.m2_head_dim = 9;
        c.m2_d_state = 12;
    }
    if (k->shape == SHAPE_WIDE) {   /* every product width a multiple of 256 */
        c.n_embd = 256;
        c.head_dim = 64;
        c.n_rot = 32;
        c.n_ff = 256;
        c.dnet_d_k = 64;
        c.dnet_d_v = 64;
        c.n_ff_exp = 256;
        c.n_ff_shexp = 256;
        c.m2_head_dim = 64;
    }
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), k->tag);
    if (synth_write(&c, path, err, sizeof err) != 0) {
        fprintf(stderr, "    synth %s: %s\n", k->tag, err);
        return NULL;
    }
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 256;
    p.max_seqs = max_seqs;
    p.dnet_mode = k->dnet_mode;
    p.mla_mode = k->mla_mode;
    p.state_dtype = k->state_dtype;
    p.kv_dtype = k->kv_dtype;
    engine *e = engine_open(&p, err, sizeof err);
    if (!e)
        fprintf(stderr, "    engine_open %s: %s\n", k->tag, err);
    return e;
}

static void tokens_of(int32_t *t, int n, int vocab, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
    }
}

static int feed_item(engine *e, const engine_batch_item *it)
{
    char err[256];
    int rc = engine_forward(e, it, 1, err, sizeof err);
    if (rc)
        fprintf(stderr, "    forward: %s\n", err);
    return rc;
}

/* n tokens in one step of seq: logits of every row into out (or none) */
static int feed(engine *e, int seq, const int32_t *t, int n, float *out, bool exact)
{
    engine_batch_item it = { .seq = seq, .tokens = t, .n_tokens = n, .logits = out ? ENGINE_LOGITS_ALL : ENGINE_LOGITS_NONE,
                             .out = out, .exact = exact };
    return feed_item(e, &it);
}

/* n one-token steps of seq, row q's logits at out + q V */
static int feed_steps(engine *e, int seq, const int32_t *t, int n, float *out, int V)
{
    for (int q = 0; q < n; q++)
        if (feed(e, seq, t + q, 1, out ? out + (size_t)q * V : NULL, false))
            return -1;
    return 0;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs((double)a[i] - b[i]) > m ? fabs((double)a[i] - b[i]) : m;
    return m;
}

/* a new sequence with room for n tokens, fed the prompt t[0..P) in one step */
static int seq_with_prompt(engine *e, const int32_t *t, int P, int n)
{
    const int s = engine_seq_new(e);
    if (s < 0 || engine_seq_reserve(e, s, n) != 0 || feed(e, s, t, P, NULL, false) != 0)
        return -1;
    return s;
}

enum { P = 13, KMAX = 16 };

/* After a prompt of P tokens, one step of K tokens with every position's
 * logits against K steps of one token: within 1e-4 of the largest logit
 * without exact (the measured difference printed), the same bits with it,
 * and then the same cache state. */
TEST(test_exact_verify_step_equals_one_token_steps_bit_for_bit_for_every_kind_and_type)
{
    static const int ks[] = { 2, 5, 8, KMAX };
    for (int i = 0; i < N_CASES; i++) {
        engine *e = open_case(&cases[i], 6);
        CHECK(e);
        const int V = engine_get_info(e)->n_vocab;
        int32_t t[P + KMAX];
        tokens_of(t, P + KMAX, V, 5 + (uint32_t)i);
        float *a = malloc(sizeof(float) * (size_t)KMAX * V), *b = malloc(sizeof(float) * (size_t)KMAX * V);
        float *c = malloc(sizeof(float) * (size_t)KMAX * V);
        CHECK(a && b && c);
        for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
            const int K = ks[j];
            const int s1 = seq_with_prompt(e, t, P, P + K), s2 = seq_with_prompt(e, t, P, P + K);
            const int s3 = seq_with_prompt(e, t, P, P + K);
            CHECK(s1 >= 0 && s2 >= 0 && s3 >= 0);
            CHECK(feed(e, s1, t + P, K, a, true) == 0);
            CHECK(feed_steps(e, s2, t + P, K, b, V) == 0);
            CHECK(feed(e, s3, t + P, K, c, false) == 0);
            double mx = 0;
            for (size_t q = 0; q < (size_t)K * V; q++)
                mx = fabs((double)b[q]) > mx ? fabs((double)b[q]) : mx;
            const double d = max_abs_diff(c, b, (size_t)K * V);
            /* plain, float weights: within 1e-4 of the largest logit.
             * Quantized ones only printed: a prompt's products quantize the
             * activations otherwise than a step's (f32 or int8 tiles
             * against int8 per token), and MLA's expanded prompt form
             * multiplies the latents where its absorbed step form does not
             * (x_mla_q8 measured up to 1.5 of 44 apart) */
            /* (and a bf16 state or KV: a multi-token step rounds once where
             * one-token steps round after each token) */
            const bool fl = (cases[i].dtype == GGML_F32 || cases[i].dtype == GGML_F16 || cases[i].dtype == GGML_BF16) &&
                            !cases[i].state_dtype && !cases[i].kv_dtype;
            CHECK_MSG(!fl || d <= 1e-4 * (mx > 1 ? mx : 1),
                      "%s: a %d-token step's logits differ from %d one-token steps (max abs %g)", cases[i].tag, K, K, d);
            const bool same = memcmp(a, b, sizeof(float) * (size_t)K * V) == 0;
            if (K == 8)
                fprintf(stderr, "    %s: 8 tokens in one step vs 8 steps: plain max abs %g of %g; exact %s\n",
                        cases[i].tag, d, mx, same ? "bit-identical" : "DIFFERS");
            CHECK_MSG(same, "%s: an exact %d-token step's logits are not those of %d one-token steps (max abs %g)",
                      cases[i].tag, K, K, max_abs_diff(a, b, (size_t)K * V));
            CHECK_MSG(engine_seq_state_equal(e, s1, s2), "%s: after an exact %d-token step the cache state is not that "
                      "of %d one-token steps", cases[i].tag, K, K);
            CHECK(engine_seq_digest(e, s1) == engine_seq_digest(e, s2));
            engine_seq_free(e, s1);
            engine_seq_free(e, s2);
            engine_seq_free(e, s3);
        }
        free(a);
        free(b);
        free(c);
        engine_close(e);
    }
}

/* Several verify steps of different lengths in one call, beside a plain
 * decode item and a plain prompt (which take their own passes), each
 * exact item's logits and state those of its one-token steps alone. */
TEST(test_exact_items_batched_with_plain_items_keep_one_token_bits)
{
    static const char *const which[] = { "x_dnet", "x_mla", "x_mamba2", "x_kda", "x_dnet_q8", "x_moe_q6k", "x_dnet_s16" };
    enum { NS = 3 };
    static const int klen[NS] = { 3, 9, 1 };             /* the last: a decode item marked exact */
    for (size_t w = 0; w < sizeof which / sizeof which[0]; w++) {
        const spec_case *k = case_of(which[w]);
        CHECK(k);
        engine *e = open_case(k, 2 * NS + 2);
        CHECK(e);
        const int V = engine_get_info(e)->n_vocab;
        int32_t t[NS][P + KMAX], plain[P + 4];
        float *got[NS], *want[NS], *pl = malloc(sizeof(float) * (size_t)V);
        int sx[NS], sr[NS];
        engine_batch_item items[NS + 2];
        for (int i = 0; i < NS; i++) {
            tokens_of(t[i], P + KMAX, V, 77 + (uint32_t)i);
            got[i] = malloc(sizeof(float) * (size_t)KMAX * V);
            want[i] = malloc(sizeof(float) * (size_t)KMAX * V);
            CHECK(got[i] && want[i]);
            sx[i] = seq_with_prompt(e, t[i], P + i, P + i + klen[i]);
            sr[i] = seq_with_prompt(e, t[i], P + i, P + i + klen[i]);
            CHECK(sx[i] >= 0 && sr[i] >= 0);
            CHECK(feed_steps(e, sr[i], t[i] + P + i, klen[i], want[i], V) == 0);
            items[i] = (engine_batch_item){ .seq = sx[i], .tokens = t[i] + P + i, .n_tokens = klen[i],
                                            .logits = ENGINE_LOGITS_ALL, .out = got[i], .exact = 1 };
        }
        tokens_of(plain, P + 4, V, 991);
        const int sp = seq_with_prompt(e, plain, P, P + 5), sq = engine_seq_new(e);
        CHECK(sp >= 0 && sq >= 0 && engine_seq_reserve(e, sq, P) == 0 && pl);
        items[NS] = (engine_batch_item){ .seq = sp, .tokens = plain + P, .n_tokens = 1, .logits = ENGINE_LOGITS_LAST,
                                         .out = pl };
        items[NS + 1] = (engine_batch_item){ .seq = sq, .tokens = plain, .n_tokens = P };
        char err[256];
        CHECK_MSG(engine_forward(e, items, NS + 2, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < NS; i++) {
            CHECK_MSG(memcmp(got[i], want[i], sizeof(float) * (size_t)klen[i] * V) == 0,
                      "%s: batched exact item %d (%d tokens) differs from its one-token steps alone (max abs %g)", k->tag,
                      i, klen[i], max_abs_diff(got[i], want[i], (size_t)klen[i] * V));
            CHECK_MSG(engine_seq_state_equal(e, sx[i], sr[i]), "%s: batched exact item %d's state differs", k->tag, i);
            free(got[i]);
            free(want[i]);
        }
        CHECK(engine_seq_len(e, sp) == P + 1 && engine_seq_len(e, sq) == P);
        free(pl);
        engine_close(e);
    }
}

/* The rollback fact. After a prompt of P tokens a verify step feeds
 * [t, d1 .. dK] exactly; the first `acc` drafts are accepted (the first
 * rejected is d(acc+1): position 0, the middle, the last; acc == K: none
 * rejected). Three ways back to the accepted length n = P + 1 + acc:
 *   in-step: the item's snapshot taken after 1 + acc rows, then
 *     engine_seq_truncate(n, snap) - no re-feed;
 *   re-feed: a snapshot taken before the step, engine_seq_truncate(P,
 *     snap), then the accepted tokens fed again in one exact step.
 *   checkpoints: the item's snaps[], a snapshot after every row, then
 *     engine_seq_truncate(n, snaps[acc]) - no re-feed, any position.
 * Each way the sequence's state must be bit for bit that of a sequence
 * that only ever saw the prompt and the accepted tokens (one-token steps),
 * and the next step's logits must be the same bits. */
enum { BACK_REFEED, BACK_IN_STEP, BACK_CHECKPOINTS };
static const char *back_name[] = { "re-feed", "in-step snapshot", "checkpoints" };

static void check_rollback(engine *e, const spec_case *k, int K, int acc, int how)
{
    const bool in_step = how != BACK_REFEED;
    const int V = engine_get_info(e)->n_vocab, n = P + 1 + acc;
    const bool rec = engine_snap_bytes(e) > 0;
    int32_t t[P + KMAX + 2];
    tokens_of(t, P + KMAX + 2, V, 300 + (uint32_t)K * 7 + (uint32_t)acc);
    int32_t fix = (t[n] + 1) % V;                       /* the token that replaces the rejected draft */
    float *lg = malloc(sizeof(float) * (size_t)(K + 1) * V), *x = malloc(sizeof(float) * (size_t)V);
    float *y = malloc(sizeof(float) * (size_t)V);
    CHECK(lg && x && y);
    const int sv = seq_with_prompt(e, t, P, P + K + 2), sr = seq_with_prompt(e, t, P, P + K + 2);
    CHECK(sv >= 0 && sr >= 0);
    /* the reference: the accepted tokens only, one-token steps */
    CHECK(feed_steps(e, sr, t + P, 1 + acc, NULL, V) == 0);
    engine_snap *before = NULL, *inside = NULL, *ck[KMAX] = { 0 };
    if (rec && how == BACK_REFEED)
        CHECK((before = engine_snap_take(e, sv)) != NULL);
    if (rec && how == BACK_IN_STEP && acc < K)
        CHECK((inside = engine_snap_new(e)) != NULL);
    for (int j = 0; rec && how == BACK_CHECKPOINTS && j < K; j++)    /* after 1 .. K rows */
        CHECK((ck[j] = engine_snap_new(e)) != NULL);
    engine_batch_item it = { .seq = sv, .tokens = t + P, .n_tokens = K + 1, .logits = ENGINE_LOGITS_ALL, .out = lg,
                             .exact = 1, .snap = inside, .snap_at = inside ? 1 + acc : 0,
                             .snaps = how == BACK_CHECKPOINTS ? ck : NULL };
    CHECK(feed_item(e, &it) == 0);
    for (int j = 0; ck[0] && j < K; j++)
        CHECK(engine_snap_tokens(ck[j]) == P + 1 + j);
    if (acc < K) {
        if (how == BACK_CHECKPOINTS) {
            CHECK(engine_seq_truncate(e, sv, n, ck[acc]) == 0);
        } else if (in_step) {
            CHECK(engine_seq_truncate(e, sv, n, inside) == 0);
        } else {
            CHECK(engine_seq_truncate(e, sv, P, before) == 0);
            CHECK(feed(e, sv, t + P, 1 + acc, NULL, true) == 0);
        }
    }
    CHECK_MSG(engine_seq_len(e, sv) == n, "%s: length %d after the rollback, want %d", k->tag, engine_seq_len(e, sv), n);
    CHECK_MSG(engine_seq_state_equal(e, sv, sr),
              "%s: K %d, %d accepted, %s: the rolled-back state differs from a sequence that never saw the rejected "
              "tokens (digests %016llx %016llx)",
              k->tag, K, acc, back_name[how], (unsigned long long)engine_seq_digest(e, sv),
              (unsigned long long)engine_seq_digest(e, sr));
    /* and decoding goes on from it alike: the replacement token's logits */
    CHECK(feed(e, sv, &fix, 1, x, false) == 0 && feed(e, sr, &fix, 1, y, false) == 0);
    CHECK_MSG(memcmp(x, y, sizeof(float) * (size_t)V) == 0, "%s: the step after the rollback differs (max abs %g)",
              k->tag, max_abs_diff(x, y, (size_t)V));
    CHECK(engine_seq_state_equal(e, sv, sr));
    if (before)
        engine_snap_free(e, before);
    if (inside)
        engine_snap_free(e, inside);
    for (int j = 0; j < K; j++)
        if (ck[j])
            engine_snap_free(e, ck[j]);
    engine_seq_free(e, sv);
    engine_seq_free(e, sr);
    free(lg);
    free(x);
    free(y);
}

TEST(test_rollback_after_an_exact_verify_step_leaves_the_state_of_a_run_without_the_rejected_tokens)
{
    enum { K = 6 };
    static const int accs[] = { 0, K / 2, K - 1, K };   /* first rejected: d1, the middle, dK; none */
    for (int i = 0; i < N_CASES; i++) {
        engine *e = open_case(&cases[i], 4);
        CHECK(e);
        for (size_t a = 0; a < sizeof accs / sizeof accs[0]; a++)
            for (int how = BACK_REFEED; how <= BACK_CHECKPOINTS; how++)
                check_rollback(e, &cases[i], K, accs[a], how);
        engine_close(e);
    }
}

/* engine_seq_state_equal can fail: two sequences with one prompt token
 * apart differ, and one of them rolled back by truncation alone (no
 * snapshot) keeps the recurrent state of the longer one. */
TEST(test_seq_state_equal_tells_states_apart)
{
    for (int i = 0; i < 3; i++) {       /* attention, DeltaNet, MLA */
        engine *e = open_case(&cases[i], 4);
        CHECK(e);
        const int V = engine_get_info(e)->n_vocab;
        int32_t t[P + 2], u[P + 2];
        tokens_of(t, P + 2, V, 4242);
        memcpy(u, t, sizeof t);
        u[P / 2] = (u[P / 2] + 1) % V;
        const int a = seq_with_prompt(e, t, P, P + 2), b = seq_with_prompt(e, u, P, P + 2);
        const int c = seq_with_prompt(e, t, P, P + 2);
        CHECK(a >= 0 && b >= 0 && c >= 0);
        CHECK(engine_seq_state_equal(e, a, c) && engine_seq_digest(e, a) == engine_seq_digest(e, c));
        CHECK(!engine_seq_state_equal(e, a, b) && engine_seq_digest(e, a) != engine_seq_digest(e, b));
        CHECK(!engine_seq_state_equal(e, a, -1) && engine_seq_digest(e, -1) == 0);
        CHECK(feed(e, c, t + P, 1, NULL, false) == 0);
        CHECK(!engine_seq_state_equal(e, a, c));        /* longer */
        if (engine_snap_bytes(e) == 0)                  /* attention only: truncation is the rollback */
            CHECK(engine_seq_truncate(e, c, P, NULL) == 0 && engine_seq_state_equal(e, a, c));
        engine_close(e);
    }
}

/* An exact item longer than one product call takes (64 tokens: matmul.c
 * MV_MAX_TOK, Q8_ACT_MAX_TOK) and than attention's tiled threshold: 70
 * tokens, still the bits of 70 one-token steps. */
TEST(test_a_long_exact_step_keeps_one_token_bits)
{
    enum { LONG = 70 };
    static const char *const which[] = { "x_dnet", "x_dnet_q8", "x_dnet_q4km", "x_dnet_s16" };
    for (size_t w = 0; w < sizeof which / sizeof which[0]; w++) {
        const spec_case *k = case_of(which[w]);
        CHECK(k);
        engine *e = open_case(k, 2);
        CHECK(e);
        const int V = engine_get_info(e)->n_vocab;
        int32_t t[P + LONG];
        tokens_of(t, P + LONG, V, 7070);
        float *a = malloc(sizeof(float) * (size_t)LONG * V), *b = malloc(sizeof(float) * (size_t)LONG * V);
        CHECK(a && b);
        const int s1 = seq_with_prompt(e, t, P, P + LONG), s2 = seq_with_prompt(e, t, P, P + LONG);
        CHECK(s1 >= 0 && s2 >= 0);
        CHECK(feed(e, s1, t + P, LONG, a, true) == 0 && feed_steps(e, s2, t + P, LONG, b, V) == 0);
        CHECK_MSG(memcmp(a, b, sizeof(float) * (size_t)LONG * V) == 0, "%s: a %d-token exact step differs (max abs %g)",
                  k->tag, LONG, max_abs_diff(a, b, (size_t)LONG * V));
        CHECK(engine_seq_state_equal(e, s1, s2));
        free(a);
        free(b);
        engine_close(e);
    }
}

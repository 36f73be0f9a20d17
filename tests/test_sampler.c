/* test_sampler.c - sampling chain, seeded PRNG, and the distributions it draws from. */
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

static sampler *make(float temp, int top_k, float top_p, float min_p, float rep,
                     bool greedy, uint64_t seed, int n_vocab)
{
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = rep;
    p.greedy = greedy;
    p.seed = seed;
    return sampler_new(&p, n_vocab);
}

/* Draws n times from logits (copied fresh each time) and counts choices. */
static void draw_counts(sampler *s, const float *logits, int n_vocab, int n, int *counts)
{
    float tmp[64];
    memset(counts, 0, sizeof(int) * (size_t)n_vocab);
    for (int i = 0; i < n; i++) {
        memcpy(tmp, logits, sizeof(float) * (size_t)n_vocab);
        int32_t id = sampler_sample(s, tmp, NULL, 0, NULL);
        if (id >= 0 && id < n_vocab)
            counts[id]++;
    }
}

/* Pearson chi-square of counts against probabilities p (sum 1). */
static double chi_square(const int *counts, const double *p, int k, int n)
{
    double x2 = 0.0;
    for (int i = 0; i < k; i++) {
        double e = p[i] * n;
        x2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    return x2;
}

static void softmax_d(const float *l, int n, double temp, double *p)
{
    double m = -INFINITY, z = 0.0;
    for (int i = 0; i < n; i++)
        m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; i++)
        z += p[i] = exp((l[i] - m) / temp);
    for (int i = 0; i < n; i++)
        p[i] /= z;
}

TEST(test_sampler_defaults_are_temperature_one_and_everything_off)
{
    sampler_params p;
    memset(&p, 0x5a, sizeof p);
    sampler_params_default(&p);
    CHECK(p.temperature == 1.0f);
    CHECK(p.top_k <= 0);
    CHECK(p.top_p >= 1.0f);
    CHECK(p.min_p <= 0.0f);
    CHECK(p.repetition_penalty == 1.0f);
    CHECK(!p.greedy);
    CHECK(sampler_new(&p, 0) == NULL);
    CHECK(sampler_new(NULL, 10) == NULL);
    sampler_free(NULL);
}

TEST(test_sampler_greedy_picks_the_argmax)
{
    const float base[5] = { 0.1f, 3.0f, 2.9f, -1.0f, 3.0f };   /* tie: lowest id wins */
    float l[5];
    sampler *a = make(1.0f, 0, 1.0f, 0.0f, 1.0f, true, 1, 5);
    sampler *b = make(0.0f, 0, 1.0f, 0.0f, 1.0f, false, 1, 5);
    sampler *c = make(-1.0f, 40, 0.5f, 0.1f, 1.0f, false, 1, 5);
    CHECK(a && b && c);
    float lp = 0.0f;
    memcpy(l, base, sizeof l);
    CHECK(sampler_sample(a, l, NULL, 0, &lp) == 1);
    /* greedy logprob is log softmax at T = 1 */
    double p[5];
    softmax_d(base, 5, 1.0, p);
    CHECK_NEAR(lp, log(p[1]), 1e-5);
    memcpy(l, base, sizeof l);
    CHECK(sampler_sample(b, l, NULL, 0, NULL) == 1);
    memcpy(l, base, sizeof l);
    CHECK(sampler_sample(c, l, NULL, 0, NULL) == 1);
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

TEST(test_sampler_same_seed_gives_the_same_sequence)
{
    float base[16], l[16];
    for (int i = 0; i < 16; i++)
        base[i] = (float)sin(i * 1.7) * 2.0f;
    sampler *a = make(1.0f, 0, 0.95f, 0.0f, 1.0f, false, 42, 16);
    sampler *b = make(1.0f, 0, 0.95f, 0.0f, 1.0f, false, 42, 16);
    sampler *c = make(1.0f, 0, 0.95f, 0.0f, 1.0f, false, 43, 16);
    CHECK(a && b && c);
    int differ = 0;
    for (int i = 0; i < 300; i++) {
        memcpy(l, base, sizeof l);
        int32_t x = sampler_sample(a, l, NULL, 0, NULL);
        memcpy(l, base, sizeof l);
        int32_t y = sampler_sample(b, l, NULL, 0, NULL);
        memcpy(l, base, sizeof l);
        int32_t z = sampler_sample(c, l, NULL, 0, NULL);
        CHECK(x == y);
        CHECK(x >= 0 && x < 16 && z >= 0 && z < 16);
        differ += x != z;
    }
    CHECK(differ > 0);      /* another seed is another sequence */
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

TEST(test_sampler_top_k_of_one_equals_greedy)
{
    float l[64], g[64];
    uint64_t r = 7;
    sampler *s = make(1.5f, 1, 1.0f, 0.0f, 1.0f, false, 9, 64);
    sampler *gr = make(1.0f, 0, 1.0f, 0.0f, 1.0f, true, 9, 64);
    CHECK(s && gr);
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < 64; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = (float)((double)(r >> 40) / (double)(1ull << 24) * 8.0 - 4.0);
        }
        memcpy(g, l, sizeof l);
        float lp = -1.0f;
        int32_t a = sampler_sample(s, l, NULL, 0, &lp);
        int32_t b = sampler_sample(gr, g, NULL, 0, NULL);
        CHECK(a == b);
        CHECK_NEAR(lp, 0.0, 1e-6);      /* the only candidate: probability 1 */
    }
    sampler_free(s);
    sampler_free(gr);
}

TEST(test_sampler_draws_follow_the_softmax_at_temperature_one)
{
    const float l[8] = { 1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.2f };
    double p[8];
    int counts[8];
    const int n = 40000;
    softmax_d(l, 8, 1.0, p);
    sampler *s = make(1.0f, 0, 1.0f, 0.0f, 1.0f, false, 2024, 8);
    CHECK(s);
    draw_counts(s, l, 8, n, counts);
    double x2 = chi_square(counts, p, 8, n);
    /* 7 degrees of freedom: P(X2 > 24.3) = 0.001 */
    CHECK_MSG(x2 < 24.3, "chi-square %.2f over 7 dof", x2);
    sampler_free(s);
}

TEST(test_sampler_temperature_reshapes_the_distribution)
{
    const float l[6] = { 1.0f, 0.0f, -0.5f, 0.5f, 1.2f, -2.0f };
    const double temps[2] = { 0.5, 2.0 };
    int counts[6];
    const int n = 40000;
    for (int k = 0; k < 2; k++) {
        double p[6];
        softmax_d(l, 6, temps[k], p);
        sampler *s = make((float)temps[k], 0, 1.0f, 0.0f, 1.0f, false, 77 + (uint64_t)k, 6);
        CHECK(s);
        draw_counts(s, l, 6, n, counts);
        double x2 = chi_square(counts, p, 6, n);
        /* 5 degrees of freedom: P(X2 > 20.5) = 0.001 */
        CHECK_MSG(x2 < 20.5, "T=%.1f chi-square %.2f over 5 dof", temps[k], x2);
        sampler_free(s);
    }
}

TEST(test_sampler_top_k_draws_only_the_k_best_in_proportion)
{
    const float l[8] = { 0.0f, 2.0f, -1.0f, 1.0f, 1.9f, -3.0f, 0.5f, 0.9f };
    int counts[8];
    const int n = 30000;
    sampler *s = make(1.0f, 3, 1.0f, 0.0f, 1.0f, false, 5, 8);
    CHECK(s);
    draw_counts(s, l, 8, n, counts);
    /* the three best are ids 1, 4, 3 */
    for (int i = 0; i < 8; i++)
        if (i != 1 && i != 4 && i != 3)
            CHECK(counts[i] == 0);
    const float kl[3] = { 2.0f, 1.9f, 1.0f };
    double p[3];
    softmax_d(kl, 3, 1.0, p);
    int kc[3] = { counts[1], counts[4], counts[3] };
    double x2 = chi_square(kc, p, 3, n);
    CHECK_MSG(x2 < 13.8, "chi-square %.2f over 2 dof", x2);   /* P = 0.001 */
    sampler_free(s);
}

TEST(test_sampler_top_p_keeps_the_smallest_prefix_reaching_p)
{
    /* probabilities 0.5, 0.3, 0.15, 0.05 (shuffled ids) */
    const float l[4] = { logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f) };
    int counts[4];
    float tmp[4];
    sampler *s = make(1.0f, 0, 0.75f, 0.0f, 1.0f, false, 11, 4);
    CHECK(s);
    draw_counts(s, l, 4, 5000, counts);
    CHECK(counts[0] == 0 && counts[2] == 0);        /* 0.5 + 0.3 >= 0.75: only ids 1, 3 */
    CHECK(counts[1] > 0 && counts[3] > 0);
    CHECK_NEAR((double)counts[1] / 5000.0, 0.5 / 0.8, 0.03);
    /* logprob is under the renormalised distribution */
    for (int i = 0; i < 20; i++) {
        float lp;
        memcpy(tmp, l, sizeof tmp);
        int32_t id = sampler_sample(s, tmp, NULL, 0, &lp);
        CHECK_NEAR(lp, id == 1 ? log(0.5 / 0.8) : log(0.3 / 0.8), 1e-5);
    }
    sampler_free(s);

    /* a tiny p keeps just the best */
    s = make(1.0f, 0, 0.01f, 0.0f, 1.0f, false, 13, 4);
    CHECK(s);
    draw_counts(s, l, 4, 500, counts);
    CHECK(counts[1] == 500);
    sampler_free(s);
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

TEST(test_sampler_top_p_matches_brute_force_on_a_large_vocab)
{
    enum { N = 150000 };
    float *l = malloc(sizeof(float) * N), *tmp = malloc(sizeof(float) * N);
    double *p = malloc(sizeof(double) * N), *sorted = malloc(sizeof(double) * N);
    CHECK(l && tmp && p && sorted);
    uint64_t r = 99;
    for (int i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        /* uniform logits in [0, 12): the 0.9 nucleus holds a few thousand tokens */
        l[i] = (float)((double)(r >> 40) / (double)(1ull << 24) * 12.0);
    }
    softmax_d(l, N, 1.0, p);
    memcpy(sorted, p, sizeof(double) * N);
    /* the nucleus edge: smallest probability inside the 0.9 prefix */
    qsort(sorted, N, sizeof(double), cmp_desc);
    double cum = 0.0, p_min_kept = 1.0;
    for (int i = 0; i < N; i++) {
        cum += sorted[i];
        p_min_kept = sorted[i];
        if (cum >= 0.9)
            break;
    }
    sampler *s = make(1.0f, 0, 0.9f, 0.0f, 1.0f, false, 3, N);
    CHECK(s);
    for (int k = 0; k < 50; k++) {
        memcpy(tmp, l, sizeof(float) * N);
        int32_t id = sampler_sample(s, tmp, NULL, 0, NULL);
        CHECK(id >= 0 && id < N);
        CHECK_MSG(p[id] >= p_min_kept * (1 - 1e-5), "drew p=%g below the nucleus edge %g",
                  p[id], p_min_kept);
    }
    sampler_free(s);
    free(l);
    free(tmp);
    free(p);
    free(sorted);
}

TEST(test_sampler_min_p_drops_tokens_below_the_scaled_maximum)
{
    const float l[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
    int counts[4];
    /* threshold 0.25 * 0.5 = 0.125: keeps 0, 1, 2 */
    sampler *s = make(1.0f, 0, 1.0f, 0.25f, 1.0f, false, 21, 4);
    CHECK(s);
    draw_counts(s, l, 4, 5000, counts);
    CHECK(counts[3] == 0);
    CHECK(counts[0] > 0 && counts[1] > 0 && counts[2] > 0);
    sampler_free(s);
    /* threshold 0.5 * 0.5 = 0.25: keeps 0, 1 */
    s = make(1.0f, 0, 1.0f, 0.5f, 1.0f, false, 22, 4);
    CHECK(s);
    draw_counts(s, l, 4, 5000, counts);
    CHECK(counts[2] == 0 && counts[3] == 0);
    CHECK_NEAR((double)counts[0] / 5000.0, 0.5 / 0.8, 0.03);
    sampler_free(s);
    /* min_p 1 keeps only the maximum */
    s = make(1.0f, 0, 1.0f, 1.0f, 1.0f, false, 23, 4);
    CHECK(s);
    draw_counts(s, l, 4, 500, counts);
    CHECK(counts[0] == 500);
    sampler_free(s);
}

TEST(test_sampler_repetition_penalty_pushes_seen_tokens_down)
{
    sampler *s = make(1.0f, 0, 1.0f, 0.0f, 1.5f, true, 1, 4);
    CHECK(s);
    /* positive logit divided: 2.0 / 1.5 = 1.333 < 1.9 */
    float l[4] = { 2.0f, 1.9f, -1.0f, -1.1f };
    const int32_t hist[4] = { 0, 0, 0, 99 };   /* repeats count once; out of range ignored */
    CHECK(sampler_sample(s, l, hist, 4, NULL) == 1);
    CHECK_NEAR(l[0], 2.0 / 1.5, 1e-6);
    /* negative logit multiplied: -1.0 * 1.5 = -1.5 < -1.1 */
    float m[4] = { -1.0f, -1.1f, -5.0f, -6.0f };
    const int32_t h2[1] = { 0 };
    CHECK(sampler_sample(s, m, h2, 1, NULL) == 1);
    CHECK_NEAR(m[0], -1.5, 1e-6);
    /* without history nothing changes */
    float u[4] = { 2.0f, 1.9f, -1.0f, -1.1f };
    CHECK(sampler_sample(s, u, NULL, 0, NULL) == 0);
    CHECK(u[0] == 2.0f);
    sampler_free(s);
    /* a penalty below 1 pulls seen tokens up */
    s = make(1.0f, 0, 1.0f, 0.0f, 0.5f, true, 1, 4);
    CHECK(s);
    float v[4] = { 1.0f, 1.9f, -1.0f, -1.1f };
    CHECK(sampler_sample(s, v, h2, 1, NULL) == 0);      /* 1.0 / 0.5 = 2.0 > 1.9 */
    sampler_free(s);
}

TEST(test_sampler_masked_and_nan_logits_are_never_drawn)
{
    float base[6] = { -INFINITY, 0.0f, NAN, 0.0f, -INFINITY, 0.0f };
    float l[6];
    sampler *s = make(1.0f, 0, 1.0f, 0.0f, 1.0f, false, 31, 6);
    CHECK(s);
    int counts[6] = { 0 };
    for (int i = 0; i < 3000; i++) {
        memcpy(l, base, sizeof l);
        float lp;
        int32_t id = sampler_sample(s, l, NULL, 0, &lp);
        CHECK(id >= 0 && id < 6);
        CHECK_NEAR(lp, log(1.0 / 3.0), 1e-5);
        counts[id]++;
    }
    CHECK(counts[0] == 0 && counts[2] == 0 && counts[4] == 0);
    CHECK(counts[1] > 0 && counts[3] > 0 && counts[5] > 0);
    /* everything masked: still a valid id, logprob -inf */
    float all[6] = { -INFINITY, -INFINITY, NAN, -INFINITY, -INFINITY, -INFINITY };
    float lp = 0.0f;
    int32_t id = sampler_sample(s, all, NULL, 0, &lp);
    CHECK(id >= 0 && id < 6);
    CHECK(isinf(lp) && lp < 0);
    /* +inf wins greedily and by sampling */
    float inf[6] = { 0.0f, INFINITY, 1.0f, 0.0f, 0.0f, 0.0f };
    CHECK(sampler_sample(s, inf, NULL, 0, NULL) == 1);
    CHECK(sampler_sample(NULL, inf, NULL, 0, NULL) < 0);
    sampler_free(s);
}

/* ---------------------------------------------------------------------- */
/* Bias, OpenAI penalties, typical-p, min-p: the logprob of every draw is  */
/* compared with the same distribution computed here from the formula.    */
/* ---------------------------------------------------------------------- */

/* log of softmax(l / temp) restricted to keep[] (NULL: all), at token t */
static double formula_logprob(const double *l, const bool *keep, int n, double temp, int t)
{
    double m = -INFINITY, z = 0.0;
    for (int i = 0; i < n; i++)
        if ((!keep || keep[i]) && l[i] > m)
            m = l[i];
    for (int i = 0; i < n; i++)
        if (!keep || keep[i])
            z += exp((l[i] - m) / temp);
    return (l[t] - m) / temp - log(z);
}

/* Draws n times from base (copied fresh each time) and returns the largest
 * |logprob - formula| over the draws, or +inf if a token outside keep is
 * drawn; counts (may be NULL) receives the draws. */
static double worst_logprob_error(sampler *s, const float *base, int n_vocab, const double *l, const bool *keep,
                                  double temp, int n, int *counts)
{
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        float tmp[64], lp = 0.0f;
        memcpy(tmp, base, sizeof(float) * (size_t)n_vocab);
        int32_t t = sampler_sample(s, tmp, NULL, 0, &lp);
        if (t < 0 || t >= n_vocab || (keep && !keep[t]))
            return INFINITY;
        if (counts)
            counts[t]++;
        double d = fabs(lp - formula_logprob(l, keep, n_vocab, temp, t));
        worst = d > worst ? d : worst;
    }
    return worst;
}

TEST(test_sampler_frequency_and_presence_penalties_follow_openai_formula)
{
    /* l'[t] = l[t] - count[t] * f - (count[t] > 0) * p over the tokens drawn so far */
    const float base[6] = { 1.0f, 0.5f, 0.2f, 0.0f, -0.3f, 0.8f };
    const double f = 0.7, pres = 0.4, temp = 0.8;
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = (float)temp;
    p.frequency_penalty = (float)f;
    p.presence_penalty = (float)pres;
    p.seed = 31;
    sampler *s = sampler_new(&p, 6);
    CHECK(s);
    int count[6] = {0};
    double worst = 0.0;
    for (int step = 0; step < 300; step++) {
        float tmp[6];
        double want[6];
        memcpy(tmp, base, sizeof tmp);
        for (int i = 0; i < 6; i++)
            want[i] = base[i] - count[i] * f - (count[i] > 0 ? pres : 0.0);
        float lp = 0.0f;
        int32_t t = sampler_sample(s, tmp, NULL, 0, &lp);
        CHECK(t >= 0 && t < 6);
        double d = fabs(lp - formula_logprob(want, NULL, 6, temp, t));
        worst = d > worst ? d : worst;
        count[t]++;
    }
    CHECK(worst < 1e-4);
    /* the penalty spreads the draws: every token was drawn (the frequency term grows with each draw) */
    for (int i = 0; i < 6; i++)
        CHECK(count[i] > 10);
    sampler_free(s);

    /* greedy: the argmax of the penalized logits, so a frequency penalty walks through the tokens */
    p.greedy = true;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 2.0f;
    s = sampler_new(&p, 6);
    CHECK(s);
    int32_t seq[4];
    for (int i = 0; i < 4; i++) {
        float tmp[6];
        memcpy(tmp, base, sizeof tmp);
        seq[i] = sampler_sample(s, tmp, NULL, 0, NULL);
    }
    /* 1.0 -> (0: -1.0) 0.8 -> (5: -1.2) 0.5 -> (1: -1.5) 0.2 */
    CHECK(seq[0] == 0 && seq[1] == 5 && seq[2] == 1 && seq[3] == 2);
    sampler_free(s);
}

TEST(test_sampler_logit_bias_is_added_and_minus_infinity_bans)
{
    const float base[5] = { 0.3f, 1.2f, -0.5f, 0.7f, 0.0f };
    sampler_bias b[3] = { {1, -INFINITY}, {2, 2.0f}, {4, -1.5f} };
    sampler_params p;
    sampler_params_default(&p);
    p.bias = b;
    p.n_bias = 3;
    p.seed = 77;
    sampler *s = sampler_new(&p, 5);
    CHECK(s);
    b[2].bias = 50.0f;      /* the sampler holds its own copy */
    const double want[5] = { 0.3, -INFINITY, 1.5, 0.7, -1.5 };
    bool keep[5] = { true, false, true, true, true };
    int counts[5] = {0};
    CHECK(worst_logprob_error(s, base, 5, want, keep, 1.0, 4000, counts) < 1e-5);
    CHECK(counts[1] == 0);
    CHECK_NEAR(counts[2] / 4000.0, exp(formula_logprob(want, keep, 5, 1.0, 2)), 0.03);
    CHECK_NEAR(counts[4] / 4000.0, exp(formula_logprob(want, keep, 5, 1.0, 4)), 0.02);
    sampler_free(s);
    /* greedy sees the biased logits: token 1 is banned, 2 (1.5) wins */
    p.greedy = true;
    b[2].bias = -1.5f;
    s = sampler_new(&p, 5);
    float tmp[5];
    memcpy(tmp, base, sizeof tmp);
    CHECK(s && sampler_sample(s, tmp, NULL, 0, NULL) == 2);
    sampler_free(s);
}

TEST(test_sampler_typical_p_keeps_the_tokens_nearest_the_entropy)
{
    /* q = softmax(l); H = -sum q log q; rank by |-log q - H|; keep the
     * shortest prefix of that ranking with mass >= typical_p */
    const float base[6] = { 2.0f, 1.6f, 1.0f, 0.3f, -0.5f, -2.0f };
    const double tp = 0.55;
    double l[6], q[6], h = 0.0, shift[6];
    for (int i = 0; i < 6; i++)
        l[i] = base[i];
    softmax_d(base, 6, 1.0, q);
    for (int i = 0; i < 6; i++)
        h -= q[i] * log(q[i]);
    int order[6] = { 0, 1, 2, 3, 4, 5 };
    for (int i = 0; i < 6; i++)
        shift[i] = fabs(-log(q[i]) - h);
    for (int i = 1; i < 6; i++)         /* insertion sort by shift */
        for (int j = i; j > 0 && shift[order[j]] < shift[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    bool keep[6] = { false };
    double cum = 0.0;
    int n_keep = 0;
    for (int i = 0; i < 6 && cum < tp; i++) {
        keep[order[i]] = true;
        cum += q[order[i]];
        n_keep++;
    }
    CHECK(n_keep >= 2 && n_keep < 6);
    CHECK(!keep[0] || !keep[5]);        /* the case is not trivial: something is cut */
    sampler_params p;
    sampler_params_default(&p);
    p.typical_p = (float)tp;
    p.seed = 5;
    sampler *s = sampler_new(&p, 6);
    CHECK(s);
    int counts[6] = {0};
    CHECK(worst_logprob_error(s, base, 6, l, keep, 1.0, 3000, counts) < 1e-5);
    for (int i = 0; i < 6; i++)
        CHECK(keep[i] ? counts[i] > 0 : counts[i] == 0);
    sampler_free(s);
}

TEST(test_sampler_min_p_renormalizes_over_tokens_above_min_p_times_p_max)
{
    /* min-p at temperature 0.7: keep p_i >= min_p * p_max of the tempered softmax, renormalized */
    const float base[5] = { 1.5f, 1.2f, 0.4f, 0.1f, -1.0f };
    const double temp = 0.7, min_p = 0.3;
    double q[5], l[5], pmax = 0.0;
    softmax_d(base, 5, temp, q);
    bool keep[5];
    for (int i = 0; i < 5; i++) {
        l[i] = base[i];
        pmax = q[i] > pmax ? q[i] : pmax;
    }
    int n_keep = 0;
    for (int i = 0; i < 5; i++)
        n_keep += keep[i] = q[i] >= min_p * pmax;
    CHECK(n_keep == 2);
    sampler *s = make((float)temp, 0, 1.0f, (float)min_p, 1.0f, false, 9, 5);
    CHECK(s);
    CHECK(worst_logprob_error(s, base, 5, l, keep, temp, 2000, NULL) < 1e-5);
    sampler_free(s);
}

/* sampler_logprobs: log softmax(l / T) written out by hand, and the top
 * list sorted best first, ties to the smaller id. */
TEST(test_sampler_logprobs_are_log_softmax_at_the_temperature_with_a_sorted_top)
{
    const float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -INFINITY};
    const double t = 0.7;
    double z = 0.0;
    for (int i = 0; i < 5; i++)
        z += exp(l[i] / t);
    sampler_top top;
    float lp = sampler_logprobs(l, 6, (float)t, 4, 4, &top);
    CHECK_NEAR(lp, 0.5 / t - log(z), 1e-5);
    CHECK(top.n == 4);
    const int32_t want[4] = {1, 3, 0, 4};
    for (int k = 0; k < 4 && k < top.n; k++) {
        CHECK(top.id[k] == want[k]);
        CHECK_NEAR(top.logprob[k], l[want[k]] / t - log(z), 1e-5);
    }
    CHECK(isinf(sampler_logprobs(l, 6, (float)t, 5, 0, NULL)));   /* masked: -inf */
    CHECK(isinf(sampler_logprobs(l, 6, (float)t, 6, 0, NULL)));   /* out of range */
}

/* sampler_last_top lists the distribution the draw came from: after top-k
 * only the k kept tokens, renormalised, and the drawn token's logprob is
 * its entry; greedy lists log softmax at T = 1. */
TEST(test_sampler_last_top_is_the_distribution_drawn_from)
{
    const float base[5] = {0.0f, 2.0f, 1.0f, -1.0f, 1.5f};
    sampler *s = make(1.0f, 3, 1.0f, 0.0f, 1.0f, false, 5, 5);
    CHECK(s != NULL);
    double z = exp(2.0) + exp(1.0) + exp(1.5);
    for (int it = 0; s && it < 50; it++) {
        float tmp[5], lp = 0.0f;
        memcpy(tmp, base, sizeof(tmp));
        int32_t id = sampler_sample(s, tmp, NULL, 0, &lp);
        sampler_top top;
        sampler_last_top(s, tmp, 20, &top);
        CHECK(top.n == 3 && top.id[0] == 1 && top.id[1] == 4 && top.id[2] == 2);
        bool found = false;
        for (int k = 0; k < top.n; k++) {
            CHECK_NEAR(top.logprob[k], base[top.id[k]] - log(z), 1e-5);
            if (top.id[k] == id) {
                found = true;
                CHECK_NEAR(top.logprob[k], lp, 1e-6);
            }
        }
        CHECK(found);
    }
    sampler_free(s);
    s = make(1.0f, 0, 1.0f, 0.0f, 1.0f, true, 0, 5);
    float tmp[5];
    memcpy(tmp, base, sizeof(tmp));
    float lp = 0.0f;
    CHECK(s && sampler_sample(s, tmp, NULL, 0, &lp) == 1);
    sampler_top top;
    sampler_last_top(s, tmp, 2, &top);
    double z1 = 0.0;
    for (int i = 0; i < 5; i++)
        z1 += exp(base[i]);
    CHECK(top.n == 2 && top.id[0] == 1 && top.id[1] == 4);
    CHECK_NEAR(top.logprob[0], lp, 1e-6);
    CHECK_NEAR(top.logprob[1], 1.5 - log(z1), 1e-5);
    sampler_free(s);
}

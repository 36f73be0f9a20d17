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

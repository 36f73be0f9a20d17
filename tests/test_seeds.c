/* test_seeds.c - the worked numbers of docs/models.md 9 ("The Math of Attention")
 * as tests of the engine's own kernels: softmax, attn_row over the paged
 * KV cache, gemm, and the DeltaNet recurrence in both forms.
 * The expected values are the seed's printed numbers, not ours. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "layers.h"
#include "kernels/blas.h"
#include "kernels/vecmath.h"
#include "test.h"

/* Seed 000, Step 1: three tokens of four numbers. */
static const float SQ[3][4] = { { 1, 1, 0, 0 }, { 0, 0, 0, 2 }, { 2, 0, 2, 0 } };
static const float SK[3][4] = { { 1, 0, 1, 0 }, { 0, 1, 0, 1 }, { 1, 1, 0, 0 } };
static const float SV[3][4] = { { 1, 0, 1, 0 }, { 0, 2, 0, 0 }, { 0, 0, 0, 3 } };

/* A one-layer, one-head cache holding the seed's keys and values. */
static int seed_cache(cache *c)
{
    cache_layout l = { .n_attn = 1, .n_kv = 1, .head_dim = 4, .conv_kernel = 4,
                       .page_tokens = 2, .n_ctx = 16, .max_seqs = 1 };
    if (cache_init(c, &l) != 0)
        return -1;
    int id = cache_seq_new(c);
    if (id != 0 || cache_reserve(c, id, 3) != 0)
        return -1;
    cache_seq *s = cache_get(c, id);
    for (int t = 0; t < 3; t++) {
        memcpy(cache_k(c, s, 0, 0, t), SK[t], sizeof SK[t]);
        memcpy(cache_v(c, s, 0, 0, t), SV[t], sizeof SV[t]);
    }
    return 0;
}

TEST(test_seed_three_token_attention_gives_the_worked_row)
{
    cache c;
    CHECK(seed_cache(&c) == 0);
    float sc[16], out[4];
    /* token 3 sees all three keys; scale 1/sqrt(4) */
    attn_row(&c, cache_get(&c, 0), 0, 0, SQ[2], 3, 0.5f, sc, out);
    const float w[3] = { 0.665f, 0.090f, 0.245f };
    const float o[4] = { 0.665f, 0.180f, 0.665f, 0.734f };
    for (int j = 0; j < 3; j++)
        CHECK_NEAR(sc[j], w[j], 5e-4);
    for (int d = 0; d < 4; d++)
        CHECK_NEAR(out[d], o[d], 5e-4);
    cache_deinit(&c);
}

TEST(test_seed_causal_mask_matrix_p_has_an_exact_zero_upper_triangle)
{
    /* P = softmax_rows(Q K^T / 2 + M), M = -inf above the diagonal */
    const float P[3][3] = { { 1, 0, 0 }, { 0.269f, 0.731f, 0 }, { 0.665f, 0.090f, 0.245f } };
    const float PV[3][4] = { { 1, 0, 1, 0 }, { 0.269f, 1.462f, 0.269f, 0 },
                             { 0.665f, 0.180f, 0.665f, 0.734f } };
    cache c;
    CHECK(seed_cache(&c) == 0);
    for (int i = 0; i < 3; i++) {
        /* the softmax kernel with the mask written out as -inf */
        float row[3];
        for (int j = 0; j < 3; j++) {
            float dot = 0;
            for (int d = 0; d < 4; d++)
                dot += SQ[i][d] * SK[j][d];
            row[j] = j > i ? -INFINITY : dot / 2.0f;
        }
        softmax(row, 3);
        for (int j = 0; j < 3; j++) {
            CHECK_NEAR(row[j], P[i][j], 5e-4);
            if (j > i)
                CHECK_MSG(row[j] == 0.0f, "P[%d][%d] = %g, must be exactly 0", i, j, (double)row[j]);
        }
        /* the attention kernel over the cache: query i sees keys 0..i */
        float sc[16], out[4];
        attn_row(&c, cache_get(&c, 0), 0, 0, SQ[i], i + 1, 0.5f, sc, out);
        for (int j = 0; j <= i; j++)
            CHECK_NEAR(sc[j], P[i][j], 5e-4);
        for (int d = 0; d < 4; d++)
            CHECK_NEAR(out[d], PV[i][d], 5e-4);
    }
    /* setting masked scores to 0 instead is wrong: token 1 row [0.5, 0, 0] */
    float wrong[3] = { 0.5f, 0.0f, 0.0f };
    softmax(wrong, 3);
    CHECK_NEAR(wrong[0], 0.452, 5e-4);
    CHECK_NEAR(wrong[1], 0.274, 5e-4);
    /* an all-masked row must not produce NaN */
    float dead[2] = { -INFINITY, -INFINITY };
    softmax(dead, 2);
    CHECK(dead[0] == 0.0f && dead[1] == 0.0f);
    cache_deinit(&c);
}

TEST(test_seed_softmax_jacobian_matches_step_3)
{
    /* J = diag(p) - p p^T for token 3's scores [2, 0, 1]; the seed prints J
     * to four decimals. We differentiate the engine's softmax numerically. */
    const double J[3][3] = { { 0.2227, -0.0599, -0.1628 },
                             { -0.0599, 0.0819, -0.0220 },
                             { -0.1628, -0.0220, 0.1848 } };
    const float z[3] = { 2.0f, 0.0f, 1.0f };
    const float h = 1e-3f;
    for (int j = 0; j < 3; j++) {
        float up[3], dn[3];
        memcpy(up, z, sizeof up);
        memcpy(dn, z, sizeof dn);
        up[j] += h;
        dn[j] -= h;
        softmax(up, 3);
        softmax(dn, 3);
        double colsum = 0;
        for (int i = 0; i < 3; i++) {
            double d = ((double)up[i] - dn[i]) / (2.0 * h);
            CHECK_NEAR(d, J[i][j], 2e-4);
            colsum += d;
        }
        CHECK_NEAR(colsum, 0.0, 1e-4);   /* shift invariance: columns (and rows) sum to 0 */
    }
}

static double phi(double x) { return x > 0 ? x + 1 : exp(x); }   /* elu + 1 */

TEST(test_seed_linear_attention_quadratic_and_recurrent_forms_agree)
{
    /* Seed 000 Step 7: n = 512, d = 16, random Q, K, V. Quadratic form with
     * the engine's gemm; recurrent form with a d x d state. */
    enum { N = 512, D = 16 };
    float *fq = malloc(sizeof(float) * N * D), *fk = malloc(sizeof(float) * N * D);
    float *v = malloc(sizeof(float) * N * D), *A = malloc(sizeof(float) * N * N);
    float *num = malloc(sizeof(float) * N * D);
    CHECK(fq && fk && v && A && num);
    uint64_t s = 12345;
    for (int i = 0; i < N * D; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((s >> 11) + 0.5) * 0x1p-53;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = ((s >> 11) + 0.5) * 0x1p-53;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u3 = ((s >> 11) + 0.5) * 0x1p-53;
        fq[i] = (float)phi(u1 * 4 - 2);
        fk[i] = (float)phi(u2 * 4 - 2);
        v[i] = (float)(u3 * 4 - 2);
    }
    /* quadratic: A = tril(phi(Q) phi(K)^T); out = (A V) / rowsum(A) */
    gemm(false, true, N, N, D, 1.0f, fq, D, fk, D, 0.0f, A, N);
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            A[(size_t)i * N + j] = 0.0f;
    gemm(false, false, N, D, N, 1.0f, A, N, v, D, 0.0f, num, D);
    /* recurrent: S += phi(k) v^T, z += phi(k), out = phi(q)^T S / phi(q).z */
    double S[D][D] = { { 0 } }, z[D] = { 0 }, maxdiff = 0;
    for (int i = 0; i < N; i++) {
        double den_q = 0, rowsum = 0;
        for (int a = 0; a < D; a++) {
            z[a] += fk[i * D + a];
            for (int b = 0; b < D; b++)
                S[a][b] += (double)fk[i * D + a] * v[i * D + b];
        }
        for (int a = 0; a < D; a++)
            den_q += fq[i * D + a] * z[a];
        for (int j = 0; j <= i; j++)
            rowsum += A[(size_t)i * N + j];
        for (int b = 0; b < D; b++) {
            double r = 0;
            for (int a = 0; a < D; a++)
                r += fq[i * D + a] * S[a][b];
            double diff = fabs(r / den_q - num[i * D + b] / rowsum);
            maxdiff = diff > maxdiff ? diff : maxdiff;
        }
    }
    /* the seed reports 4.4e-16 in float64; our quadratic side is float32 */
    CHECK_MSG(maxdiff < 1e-4, "max difference %g", maxdiff);
    free(fq); free(fk); free(v); free(A); free(num);
}

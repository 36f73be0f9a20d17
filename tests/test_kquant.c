/* test_kquant.c - the K-quant (Q4_K, Q5_K, Q6_K) and Q4_0 products on int8
 * activations: the scalar references against a dequantize-then-dot in
 * double, and every SIMD family this CPU runs (AVX2, AVX-512, AVX-512 with
 * VNNI) against the references, on random blocks with extreme scales.
 *
 * Tolerances are rounding bounds, not tuned numbers: the integer sums per
 * block are exact everywhere, so results differ only by the float scaling
 * and summing, within 4 gamma(n) T where gamma(n) = n u / (1 - n u),
 * u = 2^-24 (Higham 3.1) and T bounds the sum of the magnitudes of every
 * float term (each weight's scale parts times |q| d_x, from the block
 * fields as docs/models.md section 5 lays them out). Against the float dot
 * on unquantized x, quantization moves each x by at most d_x / 2.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/blas.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/simd512.h"
#include "kernels/simd_kquant.h"
#include "kq_blocks.h"
#include "matmul.h"
#include "test.h"

static double kq_gamma(int n)
{
    const double u = 0x1p-24;
    return n * u / (1.0 - n * u);
}

enum { KQ_N = 1024 };

static const uint32_t KQ_TYPES[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q4_0 };

/* activations: a scale per run, a zero block and a lone spike */
static void kq_random_x(float *x, int n, int seed)
{
    static const float scale[] = { 1.0f, 1e4f, 1e-3f, 3e-20f };
    const float s = scale[seed % 4];
    for (int i = 0; i < n; i++)
        x[i] = kqb_frand() * s;
    for (int i = 256; i < 512 && i < n; i++)
        x[i] = 0.0f;
    if (n > 600)
        x[600] = 50.0f * s;
}

/* activation block of element i */
static int act_blk(uint32_t type)
{
    return quant_act_block(type);
}

/* T: a bound on sum of |float terms| (see the file comment): per element,
 * the weight's scale parts at their largest (6-bit scales <= 63, Q6_K's
 * |sc| <= 128 with |q - 32| bounded by q + 32 <= 95, Q4_0's q + 8 <= 23)
 * times |q_x| d_x. */
static double kq_terms(uint32_t type, const void *row, const int8_t *q, const float *d, int n)
{
    const size_t bs = ggml_type_size(type), be = ggml_block_size(type);
    const uint8_t *p = row;
    double t = 0.0;
    for (int i = 0; i < n; i++) {
        const uint8_t *blk = p + (size_t)i / be * bs;
        uint16_t h0, h1 = 0;
        double w;
        switch (type) {
        case GGML_Q6_K: memcpy(&h0, blk + 208, 2); w = fabs(fp16_to_f32(h0)) * 128.0 * 95.0; break;
        case GGML_Q4_0: memcpy(&h0, blk, 2); w = fabs(fp16_to_f32(h0)) * 23.0; break;
        default:
            memcpy(&h0, blk, 2);
            memcpy(&h1, blk + 2, 2);
            w = fabs(fp16_to_f32(h0)) * 63.0 * (type == GGML_Q5_K ? 31.0 : 15.0) + fabs(fp16_to_f32(h1)) * 63.0;
        }
        t += w * fabs((double)q[i]) * d[i / act_blk(type)];
    }
    return t;
}

TEST(test_kquant_activation_quantizer_matches_reference_and_definition)
{
    float x[KQ_N];
    int8_t q[KQ_N], q2[KQ_N];
    float d[KQ_N / 256], d2[KQ_N / 256];
    int16_t bs[KQ_N / 16], bs2[KQ_N / 16];
    for (int seed = 0; seed < 8; seed++) {
        kqb_rng = 100u + (uint32_t)seed;
        kq_random_x(x, KQ_N, seed);
        quantize_act_q8k_ref(x, KQ_N, q, d, bs);
        /* the definition: d = max|x| / 127, |x / d - q| <= 1/2, bsums the sums of q */
        for (int b = 0; b < KQ_N / 256; b++) {
            float amax = 0.0f;
            for (int j = 0; j < 256; j++)
                amax = fmaxf(amax, fabsf(x[256 * b + j]));
            CHECK(d[b] == amax / 127.0f);
            for (int j = 0; j < 256; j++)
                CHECK(d[b] == 0.0f ? q[256 * b + j] == 0
                                   : fabs((double)x[256 * b + j] / d[b] - q[256 * b + j]) <= 0.5 + 1e-5);
        }
        for (int g = 0; g < KQ_N / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += q[16 * g + j];
            CHECK(bs[g] == s);
        }
        if (!simd_avx2())
            continue;       /* no AVX2: the reference alone */
        avx2_quantize_act_q8k(x, KQ_N, q2, d2, bs2);
        CHECK(!memcmp(q, q2, sizeof q) && !memcmp(d, d2, sizeof d) && !memcmp(bs, bs2, sizeof bs));
    }
}

/* the references against a dequantize-then-dot on the same quantized
 * activations (double), and against the float dot on the unquantized x */
TEST(test_kquant_references_match_dequantized_dots)
{
    float x[KQ_N], w[KQ_N];
    int8_t q[KQ_N];
    float d[KQ_N / 32];
    int16_t bs[KQ_N / 16];
    static uint8_t row[KQ_N / 32 * 34];
    for (size_t ti = 0; ti < sizeof KQ_TYPES / sizeof KQ_TYPES[0]; ti++)
        for (int seed = 0; seed < 24; seed++) {
            const uint32_t t = KQ_TYPES[ti];
            kqb_rng = 1000u * (uint32_t)ti + (uint32_t)seed;
            kqb_random_row(t, row, KQ_N, seed);
            kq_random_x(x, KQ_N, seed);
            kqb_quantize(t, x, KQ_N, q, d, bs);
            dequant_row(t, row, w, KQ_N);
            double exact = 0.0, quant = 0.0, absw = 0.0;
            for (int i = 0; i < KQ_N; i++) {
                exact += (double)w[i] * q[i] * d[i / act_blk(t)];
                quant += fabs((double)w[i]) * d[i / act_blk(t)] / 2.0;
                absw += fabs((double)w[i] * x[i]);
            }
            const double ref = kqb_ref(t, row, q, d, bs, KQ_N), T = kq_terms(t, row, q, d, KQ_N);
            const double tol = 4.0 * kq_gamma(KQ_N) * T;
            CHECK_MSG(fabs(ref - exact) <= tol, "type %u seed %d: reference %.9g, dequantized dot %.9g (tol %.3g)",
                      t, seed, ref, exact, tol);
            const double fdot = dot_row(t, row, x, KQ_N);
            const double tolq = quant + tol + 4.0 * kq_gamma(KQ_N) * absw;
            CHECK_MSG(fabs(ref - fdot) <= tolq, "type %u seed %d: reference %.9g, float dot %.9g (tol %.3g)", t,
                      seed, ref, fdot, tolq);
        }
}

/* One SIMD family's kernels against the references. */
static int kq_check_family(const char *name, float (*kdot)(uint32_t, const void *, const int8_t *, const float *,
                                                            const int16_t *, int),
                           float (*q40)(const void *, const int8_t *, const float *, int))
{
    float x[KQ_N];
    int8_t q[KQ_N];
    float d[KQ_N / 32];
    int16_t bs[KQ_N / 16];
    static uint8_t row[KQ_N / 32 * 34];
    static const int lens[] = { 256, 512, KQ_N, 32, 96 };  /* Q4_0: odd block counts (the 512-bit tail) */
    for (size_t ti = 0; ti < sizeof KQ_TYPES / sizeof KQ_TYPES[0]; ti++)
        for (int seed = 0; seed < 40; seed++) {
            const uint32_t t = KQ_TYPES[ti];
            const int n = lens[seed % 5] < act_blk(t) ? act_blk(t) : lens[seed % 5];
            kqb_rng = 5000u + 100u * (uint32_t)ti + (uint32_t)seed;
            kqb_random_row(t, row, n, seed);
            kq_random_x(x, n, seed);
            kqb_quantize(t, x, n, q, d, bs);
            const double ref = kqb_ref(t, row, q, d, bs, n);
            const double got = t == GGML_Q4_0 ? q40(row, q, d, n) : kdot(t, row, q, d, bs, n);
            const double tol = 4.0 * kq_gamma(n) * kq_terms(t, row, q, d, n);
            if (!(fabs(got - ref) <= tol)) {
                test_fail(__FILE__, __LINE__, "%s type %u n %d seed %d: %.9g, reference %.9g (tol %.3g)", name, t, n,
                          seed, got, ref, tol);
                return 1;
            }
        }
    return 0;
}

TEST(test_kquant_every_simd_family_matches_the_reference)
{
    int ran = 0;
    if (simd_avx2()) {
        CHECK(!kq_check_family("avx2", avx2_dot_kq_act, avx2_dot_q4_0_act));
        ran++;
    }
    if (simd_avx512()) {
        CHECK(!kq_check_family("avx512", avx512_dot_kq_act, avx512_dot_q4_0_act));
        ran++;
    }
    if (simd_avx512_vnni()) {
        CHECK(!kq_check_family("avx512+vnni", avx512_dot_kq_act_vnni, avx512_dot_q4_0_act_vnni));
        ran++;
    }
    /* and the table's entry at this level */
    CHECK(!kq_check_family(simd_name(), dot_kq_act, dot_q4_0_act));
    if (!ran)
        fprintf(stderr, "  (skipped: no AVX2 on this CPU, the scalar table only)\n");
}

/* The AVX2 rows entry (avx2_dot_kq_act_rows, the one-token row loop of
 * matmul.c) gives each row the one-row kernel's bits, rows rb bytes apart
 * and results ldy apart, and each within the reference's bound. */
TEST(test_kquant_avx2_rows_equal_each_row_alone)
{
    if (!simd_avx2())
        SKIP("no AVX2 on this CPU (or HYSERVE_SIMD=0)");
    enum { NR = 7, N = 768 };
    static const uint32_t types[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K };
    static uint8_t rows[NR * (N / 256 * 210 + 16)];        /* rb up to a Q6_K row + 16 */
    float x[N], y[2 * NR];
    int8_t q[N];
    float d[N / 32];
    int16_t bs[N / 16];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti];
        const size_t rb = ggml_type_size(t) * N / 256 + 8 * ti;     /* rows apart by more than a row, too */
        for (int r = 0; r < NR; r++)
            kqb_random_row(t, rows + (size_t)r * rb, N, 70 + r);
        kqb_rng = 77u + (uint32_t)ti;
        kq_random_x(x, N, 3 + (int)ti);
        kqb_quantize(t, x, N, q, d, bs);
        avx2_dot_kq_act_rows(t, rows, rb, NR, q, d, bs, N, y, 2);
        for (int r = 0; r < NR; r++) {
            const void *row = rows + (size_t)r * rb;
            const float one = avx2_dot_kq_act(t, row, q, d, bs, N);
            CHECK_MSG(!memcmp(&one, &y[2 * r], sizeof one), "type %u row %d: %.9g in a run, %.9g alone", t, r,
                      y[2 * r], one);
            const double ref = kqb_ref(t, row, q, d, bs, N), tol = 4.0 * kq_gamma(N) * kq_terms(t, row, q, d, N);
            CHECK_MSG(fabs(y[2 * r] - ref) <= tol, "type %u row %d: %.9g, reference %.9g (tol %.3g)", t, r,
                      y[2 * r], ref, tol);
        }
    }
}

/* matmul on a K-quant weight: one token, decode steps of any size and
 * prompts on the decode-step kernels (MATMUL_INT8_STEP; auto takes them
 * for short prompts, matmul.h) give the one-token kernel's results bit for
 * bit (the same int8 activations and kernel per token: a sequence's
 * results do not depend on its batch, nor a short prompt's on its length),
 * at every level this CPU runs (without AVX2, f32 activations: within
 * the bound); and within the quantization bound of the float reference
 * dots. */
TEST(test_kquant_decode_steps_equal_one_token_each_at_every_level)
{
    enum { NIN = 512, NOUT = 70, TMAX = 65 };
    static const int counts[] = { 2, 5, 17, 65 };
    float *X = malloc(sizeof(float) * NIN * TMAX), *Y = malloc(sizeof(float) * NOUT * TMAX);
    float *R = malloc(sizeof(float) * NOUT), *scratch = malloc(sizeof(float) * 64 * NIN * 4 + 64);
    float wf[NIN];
    CHECK(X && Y && R && scratch);
    blas_set_threads(2);
    const bool a512 = simd_avx512(), vnni = simd_avx512_vnni();
    int bad = 0;
    for (int level = 0; level < 3 && !bad; level++) {
        simd_set_vnni(level == 0);              /* 0: everything on; 1: no VNNI; 2: AVX2 */
        simd_set_avx512(level < 2);
        for (size_t ti = 0; ti < sizeof KQ_TYPES / sizeof KQ_TYPES[0] && !bad; ti++) {
            const uint32_t t = KQ_TYPES[ti];
            const size_t rb = ggml_type_size(t) * NIN / ggml_block_size(t);
            char *data = malloc(rb * NOUT);
            kqb_rng = 77u + (uint32_t)ti;
            for (int o = 0; o < NOUT; o++) {
                for (int i = 0; i < NIN; i++)
                    wf[i] = kqb_frand() * 0.3f;
                quantize_row(t, wf, data + (size_t)o * rb, NIN);
            }
            for (int i = 0; i < NIN * TMAX; i++)
                X[i] = kqb_frand();
            weight W = { .data = data, .type = t, .n_in = NIN, .n_out = NOUT, .row_bytes = rb };
            for (size_t ci = 0; ci < 2 * sizeof counts / sizeof counts[0] && !bad; ci++) {
                const int n = counts[ci / 2];
                const bool prompt = ci % 2;     /* a decode step, then a prompt on the decode-step kernels */
                matmul_set_int8_prompt(prompt ? MATMUL_INT8_STEP : MATMUL_INT8_AUTO);
                matmul(Y, &W, X, n, !prompt, scratch);
                matmul_set_int8_prompt(MATMUL_INT8_AUTO);
                for (int tk = 0; tk < n && !bad; tk++) {
                    matmul(R, &W, X + (size_t)tk * NIN, 1, true, scratch);
                    for (int o = 0; o < NOUT && !bad; o++) {
                        const float *x = X + (size_t)tk * NIN;
                        const char *row = data + (size_t)o * rb;
                        int8_t q[NIN];
                        float d[NIN / 32], w[NIN];
                        int16_t bs[NIN / 16];
                        kqb_quantize(t, x, NIN, q, d, bs);
                        dequant_row(t, row, w, NIN);
                        double quant = 0.0;
                        for (int i = 0; i < NIN; i++)
                            quant += fabs((double)w[i]) * d[i / act_blk(t)] / 2.0;
                        const double fdot = dot_row(t, row, x, NIN);
                        const double tol = quant + 8.0 * kq_gamma(NIN) * kq_terms(t, row, q, d, NIN);
                        /* without AVX2 both stay on f32 activations, by different kernels */
                        const double same = simd_avx2() ? 0.0 : tol;
                        if (!(fabs(Y[(size_t)tk * NOUT + o] - R[o]) <= same) || !(fabs(R[o] - fdot) <= tol)) {
                            test_fail(__FILE__, __LINE__,
                                      "level %d type %u %s of %d tokens: Y[%d][%d] = %.9g, one token %.9g, float "
                                      "dot %.9g (tol %.3g)", level, t, prompt ? "prompt" : "decode step", n, tk, o,
                                      Y[(size_t)tk * NOUT + o], R[o], fdot, tol);
                            bad = 1;
                        }
                    }
                }
            }
            free(data);
        }
    }
    simd_set_vnni(true);
    simd_set_avx512(true);
    CHECK(simd_avx512() == a512 && simd_avx512_vnni() == vnni);
    CHECK(!bad);
    free(X); free(Y); free(R); free(scratch);
}

/* The AVX-512 decode-step kernels share each super-block's unpack among
 * groups of up to 8 tokens (simd_kquant.c, KQ512_GROUP): every count of
 * 1-19 tokens (one group, a full group plus a partial one, two full plus
 * a partial), each type, each 512-bit family the CPU runs, must give token
 * t exactly the one-token kernel's bits on token t's activations. */
TEST(test_kquant_avx512_token_groups_give_each_token_its_one_token_bits)
{
    enum { N = 512, NT = 19 };
    static const uint32_t types[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K };
    if (!simd_avx512())
        SKIP("no AVX-512 on this CPU (or HYSERVE_SIMD=avx2/0)");
    static int8_t q[NT][N];
    static float x[N], d[NT][N / 256];
    static int16_t b[NT][N / 16];
    static uint8_t row[N / 256 * 210];
    const int8_t *qp[NT];
    const float *dp[NT];
    const int16_t *bp[NT];
    for (int t = 0; t < NT; t++) {
        kqb_rng = 900u + (uint32_t)t;
        kq_random_x(x, N, t);
        kqb_quantize(GGML_Q4_K, x, N, q[t], d[t], b[t]);
        qp[t] = q[t];
        dp[t] = d[t];
        bp[t] = b[t];
    }
    int bad = 0;
    for (int fam = 0; fam < 2 && !bad; fam++) {
        if (fam == 1 && !simd_avx512_vnni()) {
            fprintf(stderr, "  (skipped: AVX512-VNNI, not on this CPU)\n");
            break;
        }
        float (*one)(uint32_t, const void *, const int8_t *, const float *, const int16_t *, int) =
            fam ? avx512_dot_kq_act_vnni : avx512_dot_kq_act;
        void (*steps)(uint32_t, const void *, int, const int8_t *const *, const float *const *,
                      const int16_t *const *, int, float *, long) =
            fam ? avx512_dot_kq_act_tokens_vnni : avx512_dot_kq_act_tokens;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0] && !bad; ti++)
            for (int nt = 1; nt <= NT && !bad; nt++) {
                kqb_rng = 31u * (uint32_t)nt + (uint32_t)ti;
                kqb_random_row(types[ti], row, N, nt);
                float y[2 * NT];
                steps(types[ti], row, N, qp, dp, bp, nt, y, 2);
                for (int t = 0; t < nt && !bad; t++) {
                    const float r = one(types[ti], row, q[t], d[t], b[t], N);
                    if (memcmp(&r, &y[2 * t], sizeof r)) {
                        test_fail(__FILE__, __LINE__, "family %d type %u, %d tokens: token %d %.9g, alone %.9g", fam,
                                  types[ti], nt, t, y[2 * t], r);
                        bad = 1;
                    }
                }
            }
    }
    CHECK(!bad);
}

/* A Q4_K_M/Q5_K_M layer mixes K-quant types in one group of products of
 * the same input (the DeltaNet's Q5_K qkv with Q4_K gates, QKV with a Q6_K
 * V): matmul_many runs such a group as one pass on one quantization of
 * the activations (matvec_shares); each product must equal its own
 * one-weight matmul bit for bit, at every level the CPU runs. The first
 * weight is large enough for the pass to go parallel (2 threads). */
TEST(test_kquant_mixed_kquant_group_equals_each_product_alone)
{
    enum { NIN = 1024, NW = 3 };
    static const uint32_t types[NW] = { GGML_Q5_K, GGML_Q4_K, GGML_Q6_K };
    static const int n_out[NW] = { 300, 37, 90 };
    weight W[NW];
    float *Y[NW], *R = malloc(sizeof(float) * 300), *X = malloc(sizeof(float) * NIN);
    float *scratch = malloc(sizeof(float) * 64 * NIN * 4 + 64), wf[NIN];
    CHECK(R && X && scratch);
    blas_set_threads(2);
    kqb_rng = 4242u;
    for (int w = 0; w < NW; w++) {
        const size_t rb = ggml_type_size(types[w]) * NIN / ggml_block_size(types[w]);
        char *data = malloc(rb * (size_t)n_out[w]);
        Y[w] = malloc(sizeof(float) * (size_t)n_out[w]);
        CHECK(data && Y[w]);
        for (int o = 0; o < n_out[w]; o++) {
            for (int i = 0; i < NIN; i++)
                wf[i] = kqb_frand() * 0.3f;
            quantize_row(types[w], wf, data + (size_t)o * rb, NIN);
        }
        W[w] = (weight){ .data = data, .type = types[w], .n_in = NIN, .n_out = n_out[w], .row_bytes = rb };
    }
    for (int i = 0; i < NIN; i++)
        X[i] = kqb_frand();
    const bool a512 = simd_avx512(), vnni = simd_avx512_vnni();
    int bad = 0;
    for (int level = 0; level < 3 && !bad; level++) {
        simd_set_vnni(level == 0);              /* 0: everything on; 1: no VNNI; 2: AVX2 */
        simd_set_avx512(level < 2);
        matmul_many(NW, Y, (const weight *[]){ &W[0], &W[1], &W[2] }, X, 1, true, scratch);
        for (int w = 0; w < NW && !bad; w++) {
            matmul(R, &W[w], X, 1, true, scratch);
            for (int o = 0; o < n_out[w] && !bad; o++)
                if (memcmp(&Y[w][o], &R[o], sizeof(float)) != 0) {
                    test_fail(__FILE__, __LINE__, "level %d weight %d (type %u) row %d: group %.9g, alone %.9g",
                              level, w, types[w], o, Y[w][o], R[o]);
                    bad = 1;
                }
        }
    }
    simd_set_vnni(true);
    simd_set_avx512(true);
    CHECK(simd_avx512() == a512 && simd_avx512_vnni() == vnni);
    CHECK(!bad);
    for (int w = 0; w < NW; w++) {
        free((void *)W[w].data);
        free(Y[w]);
    }
    free(R); free(X); free(scratch);
}

/* The prompt path decodes rows for sgemm: the AVX2 decoder gives
 * dequant_row's floats bit for bit (the numpy reference checks prompts on
 * the same file exactly, tests/suite_reference_arch.py), extreme scales
 * included. */
TEST(test_kquant_row_decoding_is_bit_exact)
{
    if (!simd_avx2())
        SKIP("no AVX2 on this CPU (or HYSERVE_SIMD=0)");
    static uint8_t row[KQ_N / 32 * 34];
    float a[KQ_N], b[KQ_N];
    for (size_t ti = 0; ti < sizeof KQ_TYPES / sizeof KQ_TYPES[0]; ti++)
        for (int seed = 0; seed < 24; seed++) {
            const uint32_t t = KQ_TYPES[ti];
            kqb_rng = 9000u + 100u * (uint32_t)ti + (uint32_t)seed;
            kqb_random_row(t, row, KQ_N, seed);
            dequant_row(t, row, a, KQ_N);
            avx2_dequant_kq(t, row, b, KQ_N);
            CHECK_MSG(!memcmp(a, b, sizeof a), "type %u seed %d: decoded rows differ", t, seed);
            dequant_row_fast(t, row, b, KQ_N);
            CHECK_MSG(!memcmp(a, b, sizeof a), "type %u seed %d: the table's decoder differs", t, seed);
        }
}

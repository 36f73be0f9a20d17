/* test_kqtile.c - prompts on int8 products: the K-quant and Q4_0 tiles of
 * simd_kqtile.h and matmul's int8 prompt path.
 *
 * The tiles promise the scalar references' bits (dot_kq_act_ref,
 * dot_q4_0_act_ref: exact integer sums per block, then the same float
 * operations in the same order), so the checks are bit for bit, at every
 * level this CPU runs (AVX512-VNNI, AVX-512, AVX-VNNI, AVX2, scalar: each forced
 * with the simd_set_* switches; a level the CPU lacks is said and
 * skipped), on random blocks with extreme scales, partial panels (rows not
 * a multiple of 16), token counts off the tile widths, and a Q4_0 width
 * that ends inside a 256-element group. The references themselves are
 * checked against dequantize-then-dot in test_kquant.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/blas.h"
#include "kernels/cpu.h"
#include "kernels/quant.h"
#include "kernels/simd_kqtile.h"
#include "kq_blocks.h"
#include "matmul.h"
#include "test.h"

/* token t's activations as matmul lays them out for the tiles: q, d, and
 * the per-16 sums (Q4_0 too), kqb_quantize's */
typedef struct {
    int8_t *q;
    float *d;
    int16_t *bs;
} kt_act;

static bool kt_same(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static const uint32_t KT_TYPES[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q4_0 };

/* the levels: 0 AVX512-VNNI, 1 AVX-512, 2 AVX2 with AVX-VNNI, 3 AVX2,
 * 4 scalar (KT_LEVELS); false (and a line saying so) where this CPU, or
 * HYSERVE_SIMD, does not let the level run */
enum { KT_LEVELS = 5 };
static const char *const KT_LEVEL_NAME[KT_LEVELS] = { "avx512-vnni", "avx512", "avx2+avx-vnni", "avx2", "scalar" };

static bool kt_level(int level)
{
    simd_set_enabled(level < 4);
    simd_set_avx512(level < 2);
    simd_set_vnni(level == 0 || level == 2);
    const bool ok = level == 4 ? !simd_avx2()
                  : level == 3 ? simd_avx2() && !simd_vnni() && !simd_avx512()
                  : level == 2 ? simd_vnni() && !simd_avx512()
                  : level == 1 ? simd_avx512() && !simd_avx512_vnni() : simd_avx512_vnni();
    if (!ok)
        printf("    (level %s not on this CPU, or off by HYSERVE_SIMD: skipped)\n", KT_LEVEL_NAME[level]);
    return ok;
}

/* the automatic choice at each level (matmul.h): from how many prompt
 * tokens Q8_0, Q4_0 and the K-quants take int8 products (0: never), and
 * the form the ready line names */
static int kt_auto_from(int level, uint32_t type)
{
    static const int from[KT_LEVELS][3] = {
        { 2, MATMUL_INT8_VNNI512_Q4_0, MATMUL_KQ_PROMPT_MIN_TOK },
        { MATMUL_INT8_AVX512_Q8_0, MATMUL_INT8_AVX512_Q4_0, MATMUL_INT8_AVX512_KQ },
        { MATMUL_INT8_AVXVNNI_Q8_0, MATMUL_INT8_AVXVNNI_Q4_0, MATMUL_INT8_AVXVNNI_KQ },
        { MATMUL_INT8_AVX2_Q8_0, MATMUL_INT8_AVX2_Q4_0, MATMUL_INT8_AVX2_KQ },
        { 0, 0, 0 } };
    return from[level][type == GGML_Q8_0 ? 0 : type == GGML_Q4_0 ? 1 : 2];
}

/* auto: whether a K-quant or Q4_0 prompt of n tokens takes the
 * decode-step kernels (matmul.h MATMUL_STEP_*: 2 to that many tokens; on
 * AVX512-VNNI K-quants also past the f32 tile's 16 tokens and short of
 * the int8 tiles) */
static bool kt_auto_step(int level, uint32_t type, int n)
{
    static const int upto[KT_LEVELS][2] = {
        { MATMUL_STEP_VNNI512_Q4_0, MATMUL_STEP_VNNI512_KQ },
        { MATMUL_STEP_AVX512_Q4_0, MATMUL_STEP_AVX512_KQ },
        { MATMUL_STEP_AVX2_Q4_0, MATMUL_STEP_AVX2_KQ },
        { MATMUL_STEP_AVX2_Q4_0, MATMUL_STEP_AVX2_KQ },
        { 0, 0 } };
    if (type == GGML_Q8_0)
        return false;
    if (type == GGML_Q4_0)
        return n <= upto[level][0];
    return n <= upto[level][1] || (level == 0 && n > 16 && n < MATMUL_KQ_PROMPT_MIN_TOK);
}

static const char *const KT_FORM[KT_LEVELS] = { "avx512-vnni", "avx512", "avx-vnni", "avx2", "scalar" };

/* AVX2 as the test found it: off with HYSERVE_SIMD=0, which the tests
 * after this one must still see (the other switches keep HYSERVE_SIMD's
 * limits when set on) */
static bool kt_avx2_was;

static void kt_levels_save(void)
{
    kt_avx2_was = simd_avx2();
}

static void kt_levels_restore(void)
{
    simd_set_enabled(kt_avx2_was);
    simd_set_avx512(true);
    simd_set_vnni(true);
}

/* kqtile_unpack + kqtile_mul give dot_kq_act_ref / dot_q4_0_act_ref of
 * every row and token bit for bit, at every level, and so does the scalar
 * form (16 and 13 rows; 1 to 11 tokens; Q4_0 at 544 = 2 groups + 32) */
TEST(test_kqtile_products_equal_the_references_bit_for_bit_at_every_level)
{
    enum { NMAX = 544, ROWS = 16, TOK = 11 };
    float *x = malloc(sizeof(float) * NMAX * TOK), *y = malloc(sizeof(float) * ROWS * TOK);
    int8_t *q = malloc((size_t)NMAX * TOK);
    float *d = malloc(sizeof(float) * NMAX / 32 * TOK);
    int16_t *bs = malloc(sizeof(int16_t) * NMAX / 16 * TOK);
    uint8_t *rows = malloc(210 * NMAX / 256 * ROWS + 18 * NMAX / 32 * ROWS);
    void *panel = aligned_alloc(64, kqtile_panel_bytes(NMAX));
    CHECK(x && y && q && d && bs && rows && panel);
    const int8_t *qp[TOK];
    const float *dp[TOK];
    const int16_t *bp[TOK];
    int bad = 0, levels = 0;
    kt_levels_save();
    for (int level = 0; level < KT_LEVELS && !bad; level++) {
        if (!kt_level(level))
            continue;
        levels++;
        for (size_t ti = 0; ti < sizeof KT_TYPES / sizeof KT_TYPES[0] && !bad; ti++) {
            const uint32_t type = KT_TYPES[ti];
            const int n = type == GGML_Q4_0 ? 544 : 512;
            const size_t rb = ggml_type_size(type) * (size_t)n / ggml_block_size(type);
            CHECK(kqtile_fits(type, n));
            kqb_rng = 1000u * (uint32_t)level + (uint32_t)ti;
            for (int r = 0; r < ROWS; r++)
                kqb_random_row(type, rows + (size_t)r * rb, n, r);
            static const float scale[] = { 1.0f, 1e4f, 1e-3f };
            for (int t = 0; t < TOK; t++) {
                for (int i = 0; i < n; i++)
                    x[t * n + i] = kqb_frand() * scale[t % 3];
                if (t == 1)
                    memset(x + t * n, 0, sizeof(float) * 256);   /* a zero group */
                kt_act a = { q + (size_t)t * n, d + (size_t)t * (n / 32), bs + (size_t)t * (n / 16) };
                kqb_quantize(type, x + (size_t)t * n, n, a.q, a.d, a.bs);
                qp[t] = a.q;
                dp[t] = a.d;
                bp[t] = a.bs;
            }
            for (int nr = ROWS; nr >= 13 && !bad; nr -= 3) {
                kqtile_unpack(type, rows, rb, nr, n, panel);
                for (int form = 0; form < 2 && !bad; form++) {
                    for (int nt = 1; nt <= TOK && !bad; nt += (nt < 4 ? 1 : 3)) {
                        memset(y, 0xff, sizeof(float) * ROWS * TOK);
                        (form ? kqtile_mul_scalar : kqtile_mul)(type, panel, n, nr, qp, dp, bp, nt, y, ROWS);
                        for (int t = 0; t < nt && !bad; t++) {
                            for (int r = 0; r < nr && !bad; r++) {
                                kt_act a = { q + (size_t)t * n, d + (size_t)t * (n / 32), bs + (size_t)t * (n / 16) };
                                const float want = kqb_ref(type, rows + (size_t)r * rb, a.q, a.d, a.bs, n);
                                if (!kt_same(y[t * ROWS + r], want)) {
                                    test_fail(__FILE__, __LINE__, "level %d (%s) type %u %s rows %d tokens %d: "
                                              "y[%d][%d] = %.9g, reference %.9g", level, simd_name(), type,
                                              form ? "scalar" : "kqtile_mul", nr, nt, t, r, y[t * ROWS + r], want);
                                    bad = 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    kt_levels_restore();
    CHECK(levels >= 1);         /* the scalar level always runs (HYSERVE_SIMD may hide the others) */
    CHECK(!bad);
    free(x); free(y); free(q); free(d); free(bs); free(rows); free(panel);
}

/* matmul on a prompt (decode false) with int8 prompts forced on: every
 * token's outputs are its int8 products (K-quants and Q4_0: the reference's
 * bits, whatever the tile, pass or thread split; Q8_0: a decode step's
 * bits), at every level; on auto, those the level's thresholds send to
 * int8 (kt_auto_from: the reference's bits; kt_auto_step, short prompts
 * on the decode-step kernels: a decode step's bits), else the f32 path's
 * bits; and off: f32
 * activations, within the quantization bound's distance of them. Prompt
 * lengths cross the tile widths and the short-prompt thresholds. The
 * description the ready line and /info show names the level's form and
 * its K-quant threshold. */
TEST(test_kqtile_matmul_prompts_on_int8_give_the_int8_products_at_every_level)
{
    enum { N = 512, NOUT = 70, TMAX = 80 };
    static const int counts[] = { 2, 4, 5, 8, 9, 15, 16, 17, 24, 31, 32, 47, 48, 63, 64, 80 };
    static const uint32_t types[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q4_0, GGML_Q8_0 };
    float *X = malloc(sizeof(float) * N * TMAX), *Y = malloc(sizeof(float) * NOUT * TMAX);
    float *Yf = malloc(sizeof(float) * NOUT * TMAX), *Yd = malloc(sizeof(float) * NOUT * TMAX);
    float *scratch = aligned_alloc(64, sizeof(float) * 64 * N * 4 + 64);
    uint8_t *data = malloc(34 * N / 32 * NOUT + 210 * N / 256 * NOUT);
    int8_t q[N];
    float d[N / 32];
    int16_t bs[N / 16];
    CHECK(X && Y && Yf && Yd && scratch && data);
    blas_set_threads(2);
    int bad = 0;
    kt_levels_save();
    for (int level = 0; level < KT_LEVELS && !bad; level++) {
        if (!kt_level(level))
            continue;
        char desc[160], phrase[64];
        matmul_set_int8_prompt(MATMUL_INT8_AUTO);
        matmul_int8_prompt_describe(desc, sizeof desc);
        const int kq = kt_auto_from(level, GGML_Q4_K);
        const bool any = kq || kt_auto_from(level, GGML_Q8_0) || kt_auto_from(level, GGML_Q4_0);
        if (kq)
            snprintf(phrase, sizeof phrase, "K-quants from %d tokens", kq);
        else
            snprintf(phrase, sizeof phrase, "K-quants off");
        CHECK_MSG(any ? !strncmp(desc, KT_FORM[level], strlen(KT_FORM[level])) && strstr(desc, " tiles, ") &&
                            strstr(desc, phrase)
                      : !strncmp(desc, "off (", 5) && strstr(desc, KT_FORM[level]),
                  "level %s: int8 prompts described as \"%s\"", KT_LEVEL_NAME[level], desc);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0] && !bad; ti++) {
            const uint32_t type = types[ti];
            const size_t rb = ggml_type_size(type) * N / ggml_block_size(type);
            kqb_rng = 55u + (uint32_t)ti;
            float wf[N];
            for (int o = 0; o < NOUT; o++) {
                for (int i = 0; i < N; i++)
                    wf[i] = kqb_frand() * 0.3f;
                quantize_row(type, wf, data + (size_t)o * rb, N);
            }
            for (int i = 0; i < N * TMAX; i++)
                X[i] = kqb_frand();
            const weight W = { .data = data, .type = type, .n_in = N, .n_out = NOUT, .row_bytes = rb };
            for (size_t ci = 0; ci < 2 * sizeof counts / sizeof counts[0] && !bad; ci++) {
                const int nt = counts[ci / 2];
                const bool on = ci % 2 == 0;    /* forced on, then auto */
                matmul_set_int8_prompt(on ? MATMUL_INT8_ON : MATMUL_INT8_AUTO);
                matmul(Y, &W, X, nt, false, scratch);
                matmul_set_int8_prompt(MATMUL_INT8_OFF);
                matmul(Yf, &W, X, nt, false, scratch);
                /* auto: the level's thresholds; short K-quant and Q4_0 prompts
                 * on the decode-step kernels give the decode step's bits */
                const int from = kt_auto_from(level, type);
                const bool stepped = !on && kt_auto_step(level, type, nt);
                const bool int8 = on || stepped || (from > 0 && nt >= from);
                if (type == GGML_Q8_0 || stepped)       /* the decode step of these tokens */
                    matmul(Yd, &W, X, nt, true, scratch);
                for (int t = 0; t < nt && !bad; t++) {
                    const float *x = X + (size_t)t * N;
                    kt_act a = { q, d, bs };
                    kqb_quantize(type, x, N, a.q, a.d, a.bs);
                    for (int o = 0; o < NOUT && !bad; o++) {
                        const uint8_t *row = data + (size_t)o * rb;
                        /* Q8_0, and short prompts on the decode-step kernels: the
                         * decode step's kernels and bits (without AVX2 the Q8_0
                         * decode step keeps f32: then the int8 reference's) */
                        const float want = type != GGML_Q8_0 && !stepped ? kqb_ref(type, row, a.q, a.d, a.bs, N)
                                           : simd_avx2() ? Yd[(size_t)t * NOUT + o] : dot_q8_0_act_ref(row, q, d, N);
                        /* the f32 path against the float dot: quantization moves
                         * each x by at most d_x / 2 */
                        float w[N];
                        dequant_row(type, row, w, N);
                        double qb = 0.0, fd = 0.0;
                        for (int i = 0; i < N; i++) {
                            qb += fabs((double)w[i]) * d[i / quant_act_block(type)] / 2.0;
                            fd += (double)w[i] * x[i];
                        }
                        const float got = Y[(size_t)t * NOUT + o];
                        const bool ok = (int8 ? kt_same(got, want) : fabsf(got - Yf[(size_t)t * NOUT + o]) == 0.0f) &&
                                        fabs(Yf[(size_t)t * NOUT + o] - fd) <= 1e-4 * (1.0 + fabs(fd)) &&
                                        fabs(want - fd) <= qb + 1e-4 * (1.0 + fabs(fd));
                        if (!ok) {
                            test_fail(__FILE__, __LINE__, "level %d (%s) type %u tokens %d %s: Y[%d][%d] = %.9g, "
                                      "int8 %.9g, f32 path %.9g, float dot %.9g (bound %.3g)", level,
                                      simd_name(), type, nt, on ? "on" : "auto", t, o, got, want, Yf[(size_t)t * NOUT + o], fd, qb);
                            bad = 1;
                        }
                    }
                }
            }
        }
    }
    matmul_set_int8_prompt(MATMUL_INT8_AUTO);
    kt_levels_restore();
    CHECK(!bad);
    free(X); free(Y); free(Yf); free(Yd); free(scratch); free(data);
}

/* test_kqtile.c - prompts on int8 products: the K-quant and Q4_0 tiles of
 * simd_kqtile.h and matmul's int8 prompt path.
 *
 * The tiles promise the scalar references' bits (dot_kq_act_ref,
 * dot_q4_0_act_ref: exact integer sums per block, then the same float
 * operations in the same order), so the checks are bit for bit, at every
 * level this CPU runs (AVX512-VNNI, AVX-512, AVX2, scalar: each forced
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
#include "matmul.h"
#include "test.h"

static uint32_t kt_rng;

static uint32_t kt_next(void)
{
    kt_rng = kt_rng * 1664525u + 1013904223u;
    return kt_rng >> 8;
}

static float kt_frand(void)     /* uniform in [-1, 1) */
{
    return (float)kt_next() / (float)(1u << 23) - 1.0f;
}

/* a row of random bytes with finite half scales (ordinary, and the
 * extremes: largest, smallest subnormal, negative, zero) */
static void kt_random_row(uint32_t type, uint8_t *row, int n)
{
    static const uint16_t extreme[] = { 0x7bff, 0x0001, 0xfbff, 0x0000 };
    const size_t bsz = ggml_type_size(type), nb = (size_t)n / ggml_block_size(type);
    for (size_t i = 0; i < bsz * nb; i++)
        row[i] = (uint8_t)kt_next();
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = row + b * bsz;
        uint16_t h[2];
        for (int k = 0; k < 2; k++)
            h[k] = kt_next() % 4 ? f32_to_fp16(kt_frand() * 0.05f) : extreme[kt_next() % 4];
        if (type == GGML_Q6_K)
            memcpy(blk + 208, &h[0], 2);
        else if (type == GGML_Q4_0)
            memcpy(blk, &h[0], 2);
        else
            memcpy(blk, h, 4);
    }
}

/* token t's activations as matmul lays them out for the tiles: q, d, and
 * the per-16 sums (Q4_0 too) */
typedef struct {
    int8_t *q;
    float *d;
    int16_t *bs;
} kt_act;

static void kt_quantize(uint32_t type, const float *x, int n, kt_act a)
{
    if (type == GGML_Q4_0 || type == GGML_Q8_0) {
        quantize_act_q8_ref(x, n, a.q, a.d);
        for (int g = 0; g < n / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += a.q[16 * g + j];
            a.bs[g] = (int16_t)s;
        }
    } else {
        quantize_act_q8k_ref(x, n, a.q, a.d, a.bs);
    }
}

static float kt_ref(uint32_t type, const void *row, kt_act a, int n)
{
    return type == GGML_Q4_0 ? dot_q4_0_act_ref(row, a.q, a.d, n) : dot_kq_act_ref(type, row, a.q, a.d, a.bs, n);
}

static bool kt_same(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static const uint32_t KT_TYPES[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_Q4_0 };

/* the levels: 0 AVX512-VNNI, 1 AVX-512, 2 AVX2, 3 scalar; false (and a
 * line saying so) where this CPU cannot run the level */
static bool kt_level(int level)
{
    simd_set_enabled(level < 3);
    simd_set_avx512(level < 2);
    simd_set_vnni(level == 0);
    const bool ok = level == 3 ? !simd_avx2()
                  : level == 2 ? simd_avx2() && !simd_avx512()
                  : level == 1 ? simd_avx512() && !simd_avx512_vnni() : simd_avx512_vnni();
    if (!ok)
        printf("    (level %s not on this CPU: skipped)\n", level == 0 ? "avx512-vnni" : level == 1 ? "avx512" : "avx2");
    return ok;
}

static void kt_levels_restore(void)
{
    simd_set_enabled(true);
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
    for (int level = 0; level < 4 && !bad; level++) {
        if (!kt_level(level))
            continue;
        levels++;
        for (size_t ti = 0; ti < sizeof KT_TYPES / sizeof KT_TYPES[0] && !bad; ti++) {
            const uint32_t type = KT_TYPES[ti];
            const int n = type == GGML_Q4_0 ? 544 : 512;
            const size_t rb = ggml_type_size(type) * (size_t)n / ggml_block_size(type);
            CHECK(kqtile_fits(type, n));
            kt_rng = 1000u * (uint32_t)level + (uint32_t)ti;
            for (int r = 0; r < ROWS; r++)
                kt_random_row(type, rows + (size_t)r * rb, n);
            static const float scale[] = { 1.0f, 1e4f, 1e-3f };
            for (int t = 0; t < TOK; t++) {
                for (int i = 0; i < n; i++)
                    x[t * n + i] = kt_frand() * scale[t % 3];
                if (t == 1)
                    memset(x + t * n, 0, sizeof(float) * 256);   /* a zero group */
                kt_act a = { q + (size_t)t * n, d + (size_t)t * (n / 32), bs + (size_t)t * (n / 16) };
                kt_quantize(type, x + (size_t)t * n, n, a);
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
                                const float want = kt_ref(type, rows + (size_t)r * rb, a, n);
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
 * bits), at every level; on auto, those where the CPU has AVX512-VNNI
 * (K-quants from MATMUL_KQ_PROMPT_MIN_TOK tokens), else the f32 path's
 * bits; and off: f32 activations, within the quantization bound's
 * distance of them. Prompt lengths cross
 * the tile widths and the K-quants' short-prompt threshold. */
TEST(test_kqtile_matmul_prompts_on_int8_give_the_int8_products_at_every_level)
{
    enum { N = 512, NOUT = 70, TMAX = 80 };
    static const int counts[] = { 2, 9, 17, 31, 32, 80 };
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
    for (int level = 0; level < 4 && !bad; level++) {
        if (!kt_level(level))
            continue;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0] && !bad; ti++) {
            const uint32_t type = types[ti];
            const size_t rb = ggml_type_size(type) * N / ggml_block_size(type);
            kt_rng = 55u + (uint32_t)ti;
            float wf[N];
            for (int o = 0; o < NOUT; o++) {
                for (int i = 0; i < N; i++)
                    wf[i] = kt_frand() * 0.3f;
                quantize_row(type, wf, data + (size_t)o * rb, N);
            }
            for (int i = 0; i < N * TMAX; i++)
                X[i] = kt_frand();
            const weight W = { .data = data, .type = type, .n_in = N, .n_out = NOUT, .row_bytes = rb };
            for (size_t ci = 0; ci < 2 * sizeof counts / sizeof counts[0] && !bad; ci++) {
                const int nt = counts[ci / 2];
                const bool on = ci % 2 == 0;    /* forced on, then auto */
                matmul_set_int8_prompt(on ? MATMUL_INT8_ON : MATMUL_INT8_AUTO);
                matmul(Y, &W, X, nt, false, scratch);
                matmul_set_int8_prompt(MATMUL_INT8_OFF);
                matmul(Yf, &W, X, nt, false, scratch);
                /* auto: with AVX512-VNNI, Q8_0, Q4_0, and K-quants from MATMUL_KQ_PROMPT_MIN_TOK */
                const bool int8 = on || (simd_avx512_vnni() && (type == GGML_Q8_0 || type == GGML_Q4_0 ||
                                                                 nt >= MATMUL_KQ_PROMPT_MIN_TOK));
                if (type == GGML_Q8_0)                  /* the decode step of these tokens */
                    matmul(Yd, &W, X, nt, true, scratch);
                for (int t = 0; t < nt && !bad; t++) {
                    const float *x = X + (size_t)t * N;
                    kt_act a = { q, d, bs };
                    kt_quantize(type, x, N, a);
                    for (int o = 0; o < NOUT && !bad; o++) {
                        const uint8_t *row = data + (size_t)o * rb;
                        /* Q8_0: the decode step's kernels and bits (without AVX2 the
                         * decode step keeps f32: then the int8 reference's) */
                        const float want = type != GGML_Q8_0 ? kt_ref(type, row, a, N)
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

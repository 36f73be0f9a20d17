/* test_avx512.c - the AVX-512 kernels (simd_avx512.c) against references
 * computed here from the definitions.
 *
 * rows x tokens: every output against a double-precision dot product. The
 * kernel sums each of 16 lanes sequentially over n / 16 terms and then adds
 * the lanes in a tree, so its error is at most gamma(n / 16 + 5) sum |w x|
 * (Higham 3.1, u = 2^-24, gamma(m) = m u / (1 - m u)); for n <= 2048 that
 * is below 1e-5 sum |w x|, the tolerance used (the bound itself for the
 * longer rows of the second test). Strides larger than the extents prove ldw, ldx and
 * ldy are respected, and sentinels that nothing outside [n_tok) x [n_rows)
 * is written. The packed form (X packed once, avx512_rows_x_tokens_packed)
 * must give the same bits as the plain one on every shape. Buffers are allocated to the last element read, so
 * AddressSanitizer sees any unmasked read past a row.
 * The typed form (F16, BF16, Q8_0 rows widened in registers) must give
 * the bits of the f32 kernel run on the same rows decoded by quant.c's
 * dequant_row, plain and packed.
 * Q8_0 on AVX512-VNNI (int8 activations): every output against the exact
 * block sums, within the rounding of its float steps.
 * Decoding: every f16 and bf16 bit pattern, bit for bit, against integer
 * conversions written here (not quant.c's).
 * Without AVX-512 (or with HYSERVE_SIMD=avx2 / 0) the kernel tests are
 * reported skipped; the dispatch test runs everywhere.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/simd512.h"
#include "test.h"

static uint32_t rng_state;

static float frand(void)        /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / (float)(1u << 23) - 1.0f;
}

#define NO_AVX512 "no AVX-512 (or HYSERVE_SIMD=avx2/0)"

/* got against the double sum of w[i] x[i]: within gamma(n / 16 + 5) (at
 * least 1e-5) of sum |w x|, the bound in the header. ref and tol out. */
static bool near_double_dot(float got, const float *w, const float *x, int n, double *ref, double *tol)
{
    double s = 0.0, mag = 0.0;
    for (int i = 0; i < n; i++) {
        s += (double)w[i] * x[i];
        mag += fabs((double)w[i] * x[i]);
    }
    const double m = n / 16 + 5, u = 0x1p-24, bound = m * u / (1.0 - m * u);
    *ref = s;
    *tol = (bound > 1e-5 ? bound : 1e-5) * mag + 1e-30;
    return fabs(got - s) <= *tol;
}

/* One shape: W n_rows x n (stride ldw), X n_tok x n (stride ldx), Y with
 * stride ldy and one spare token row. Returns 0 or reports and returns 1. */
static int check_rows_x_tokens(int n, int n_rows, int n_tok, int ldw, int ldx, int ldy)
{
    const float sentinel = -12345.0f;
    const size_t nw = (size_t)(n_rows - 1) * ldw + n, nx = (size_t)(n_tok - 1) * ldx + n;
    const size_t ny = (size_t)(n_tok + 1) * ldy;
    float *W = malloc(sizeof(float) * nw), *X = malloc(sizeof(float) * nx), *Y = malloc(sizeof(float) * ny);
    int bad = 0;
    if (!W || !X || !Y) {
        test_fail(__FILE__, __LINE__, "out of memory");
        bad = 1;
        goto out;
    }
    for (size_t i = 0; i < nw; i++)
        W[i] = frand();
    for (size_t i = 0; i < nx; i++)
        X[i] = frand() * 2.0f;
    for (size_t i = 0; i < ny; i++)
        Y[i] = sentinel;
    avx512_rows_x_tokens(W, ldw, n_rows, X, ldx, n_tok, n, Y, ldy);
    /* the packed form: the same sums in the same order, so the same bits
     * everywhere (sentinels included) */
    const size_t np = avx512_packed_tokens_floats(n_tok, n);
    /* np is a multiple of 16 floats: exactly the panel, so AddressSanitizer sees a read past it */
    float *Xp = aligned_alloc(64, sizeof(float) * (np ? np : 16)), *Y2 = malloc(sizeof(float) * ny);
    if (!Xp || !Y2) {
        test_fail(__FILE__, __LINE__, "out of memory");
        bad = 1;
        free(Xp);
        free(Y2);
        goto out;
    }
    for (size_t i = 0; i < ny; i++)
        Y2[i] = sentinel;
    avx512_pack_tokens(X, ldx, n_tok, n, Xp);
    avx512_rows_x_tokens_packed(W, ldw, n_rows, Xp, n_tok, n, Y2, ldy);
    if (memcmp(Y, Y2, sizeof(float) * ny) != 0) {
        test_fail(__FILE__, __LINE__, "n %d rows %d tokens %d: the packed form differs from the plain one", n,
                  n_rows, n_tok);
        bad = 1;
    }
    free(Xp);
    free(Y2);
    for (int t = 0; t <= n_tok && !bad; t++)
        for (int r = 0; r < ldy && !bad; r++) {
            const float got = Y[(size_t)t * ldy + r];
            if (t >= n_tok || r >= n_rows) {
                if (memcmp(&got, &sentinel, sizeof got) != 0) {
                    test_fail(__FILE__, __LINE__, "n %d rows %d tokens %d: wrote Y[%d][%d] outside the result",
                              n, n_rows, n_tok, t, r);
                    bad = 1;
                }
                continue;
            }
            double ref, tol;
            if (!near_double_dot(got, W + (size_t)r * ldw, X + (size_t)t * ldx, n, &ref, &tol)) {
                test_fail(__FILE__, __LINE__, "n %d rows %d tokens %d: Y[%d][%d] = %.9g, reference %.9g (tol %.3g)",
                          n, n_rows, n_tok, t, r, got, ref, tol);
                bad = 1;
            }
        }
out:
    free(W);
    free(X);
    free(Y);
    return bad;
}

TEST(test_avx512_rows_x_tokens_matches_double_reference)
{
    if (!simd_avx512())
        SKIP(NO_AVX512);
    static const int ns[] = { 1, 7, 15, 16, 17, 33, 100, 1024, 1031 };
    static const int rows[] = { 1, 2, 3, 4, 5, 7, 8, 9, 16, 33 };
    static const int toks[] = { 1, 2, 3, 4, 5, 8, 15, 16, 17, 32 };
    rng_state = 11;
    int shapes = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof rows / sizeof rows[0]; b++)
            for (size_t c = 0; c < sizeof toks / sizeof toks[0]; c++) {
                const int n = ns[a], nr = rows[b], nt = toks[c];
                /* odd extra strides: rows start off cache-line boundaries */
                if (check_rows_x_tokens(n, nr, nt, n + 5, n + 3, nr + 3))
                    return;
                shapes++;
            }
    CHECK(shapes == 900);
}

/* contiguous operands as the engine passes them (ldw = ldx = n, ldy =
 * n_rows), several k chunks (n > 1024, with a tail), more tokens than one
 * accumulator pass holds (32), and n = 0 */
TEST(test_avx512_rows_x_tokens_long_rows_and_many_tokens)
{
    if (!simd_avx512())
        SKIP(NO_AVX512);
    static const int shapes[][3] = {    /* n, n_rows, n_tok */
        { 3584, 8, 16 }, { 3584, 13, 33 }, { 2049, 6, 40 }, { 1024, 64, 32 }, { 4099, 5, 70 }, { 48, 3, 100 },
    };
    rng_state = 12;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n = shapes[s][0], nr = shapes[s][1], nt = shapes[s][2];
        if (check_rows_x_tokens(n, nr, nt, n, n, nr))
            return;
    }
    /* n = 0: empty sums are 0 */
    if (check_rows_x_tokens(0, 7, 5, 8, 8, 9))
        return;
}

/* One shape of the typed product: W quantized to `type` (allocated to its
 * last byte), the f32 kernel on dequant_row's rows as the reference (and
 * that against double sums of the same rows, with the tolerance of the
 * f32 tests above), the typed kernel on plain and on packed X; all three
 * Y (sentinels included) must be equal bit for bit. */
static int check_typed(uint32_t type, int n, int n_rows, int n_tok)
{
    const size_t rb = type == GGML_Q8_0 ? (size_t)n / 32 * 34 : (size_t)n * 2;
    const int ldy = n_rows + 1;
    const size_t ny = (size_t)(n_tok + 1) * ldy, np = avx512_packed_tokens_floats(n_tok, n);
    char *W = malloc(rb * n_rows + 1);
    float *Wf = malloc(sizeof(float) * ((size_t)n_rows * n + 1)), *X = malloc(sizeof(float) * ((size_t)n_tok * n + 1));
    float *Xp = aligned_alloc(64, sizeof(float) * (np ? np : 16)), *Y[3];
    for (int v = 0; v < 3; v++)
        Y[v] = malloc(sizeof(float) * ny);
    int bad = 0;
    if (!W || !Wf || !X || !Xp || !Y[0] || !Y[1] || !Y[2]) {
        test_fail(__FILE__, __LINE__, "out of memory");
        bad = 1;
        goto out;
    }
    for (int r = 0; r < n_rows; r++) {
        for (int i = 0; i < n; i++)     /* varied magnitudes: Q8_0 scales differ per block */
            Wf[(size_t)r * n + i] = frand() * (1.0f + (float)((i / 32 + r) % 5));
        quantize_row(type, Wf + (size_t)r * n, W + (size_t)r * rb, n);
        dequant_row(type, W + (size_t)r * rb, Wf + (size_t)r * n, n);
    }
    for (size_t i = 0; i < (size_t)n_tok * n; i++)
        X[i] = frand() * 2.0f;
    for (int v = 0; v < 3; v++)
        for (size_t i = 0; i < ny; i++)
            Y[v][i] = -12345.0f;
    avx512_rows_x_tokens(Wf, n, n_rows, X, n, n_tok, n, Y[0], ldy);
    avx512_rows_x_tokens_typed(type, W, rb, n_rows, X, n, false, n_tok, n, Y[1], ldy);
    avx512_pack_tokens(X, n, n_tok, n, Xp);
    avx512_rows_x_tokens_typed(type, W, rb, n_rows, Xp, 0, true, n_tok, n, Y[2], ldy);
    /* the reference itself against double sums of the decoded rows */
    for (int t = 0; t < n_tok && !bad; t++)
        for (int r = 0; r < n_rows && !bad; r++) {
            double ref, tol;
            if (!near_double_dot(Y[0][(size_t)t * ldy + r], Wf + (size_t)r * n, X + (size_t)t * n, n, &ref, &tol)) {
                test_fail(__FILE__, __LINE__, "type %u n %d rows %d tokens %d: Y[%d][%d] = %.9g, double sum %.9g", type,
                          n, n_rows, n_tok, t, r, Y[0][(size_t)t * ldy + r], ref);
                bad = 1;
            }
        }
    for (int v = 1; v < 3 && !bad; v++)
        for (size_t i = 0; i < ny && !bad; i++)
            if (memcmp(&Y[0][i], &Y[v][i], sizeof(float)) != 0) {
                test_fail(__FILE__, __LINE__,
                          "type %u n %d rows %d tokens %d (%s X): Y[%zu][%zu] = %.9g, f32 kernel on the decoded rows %.9g",
                          type, n, n_rows, n_tok, v == 1 ? "plain" : "packed", i / ldy, i % ldy, Y[v][i], Y[0][i]);
                bad = 1;
            }
out:
    free(W);
    free(Wf);
    free(X);
    free(Xp);
    for (int v = 0; v < 3; v++)
        free(Y[v]);
    return bad;
}

TEST(test_avx512_typed_rows_x_tokens_equal_f32_kernel_on_decoded_rows)
{
    if (!simd_avx512())
        SKIP(NO_AVX512);
    static const uint32_t types[] = { GGML_F16, GGML_BF16, GGML_Q8_0 };
    static const int ns[] = { 7, 17, 32, 100, 1024, 1031, 2080, 3584 };
    static const int rows[] = { 1, 5, 6, 7, 13 };
    static const int toks[] = { 1, 2, 3, 4, 5, 8, 16, 33 };
    rng_state = 13;
    int shapes = 0;
    for (size_t a = 0; a < sizeof types / sizeof types[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            const bool ok = avx512_rows_x_tokens_typed_ok(types[a], ns[b]);
            CHECK_MSG(ok == (types[a] != GGML_Q8_0 || ns[b] % 32 == 0), "type %u n %d: typed_ok says %d", types[a],
                      ns[b], ok);
            if (!ok)
                continue;
            for (size_t c = 0; c < sizeof rows / sizeof rows[0]; c++)
                for (size_t d = 0; d < sizeof toks / sizeof toks[0]; d++) {
                    if (check_typed(types[a], ns[b], rows[c], toks[d]))
                        return;
                    shapes++;
                }
        }
    CHECK(shapes == 40 * (8 + 8 + 4));
}

/* One shape of the VNNI Q8_0 kernel: weights quantized by quant.c,
 * activations by quantize_act_q8_ref; every output against the exact
 * value sum_b dw_b d_b s_b (s_b the integer block sum, computed here in
 * double). The kernel rounds dw d once per block, each lane's partial
 * product and sum once per pair of blocks, then adds 16 lanes: within
 * (np + 8) 2^-24 of the sum of |terms|, sum_b |dw_b d_b| sum_j |w_j q_j|
 * (np = pairs of blocks; a lane's partial can cancel within its block). Sentinels in a spare
 * token row and spare columns must survive. */
static int check_q8_vnni(int n, int n_rows, int n_tok)
{
    const int nb = n / 32, np = (nb + 1) / 2, ldy = n_rows + 3;
    const size_t rb = (size_t)nb * 34, ny = (size_t)(n_tok + 1) * ldy;
    uint8_t *W = malloc(rb * n_rows);
    int8_t *xq = malloc((size_t)n_tok * n);
    float *xd = malloc(sizeof(float) * (size_t)n_tok * nb), *wf = malloc(sizeof(float) * n);
    float *xf = malloc(sizeof(float) * n), *Y = malloc(sizeof(float) * ny);
    void *prep = aligned_alloc(64, (avx512_q8_prep_bytes(n, n_tok) + 63) / 64 * 64);
    int bad = 0;
    if (!W || !xq || !xd || !wf || !xf || !Y || !prep) {
        test_fail(__FILE__, __LINE__, "out of memory");
        bad = 1;
        goto out;
    }
    for (int r = 0; r < n_rows; r++) {
        for (int i = 0; i < n; i++)
            wf[i] = frand() * (1.0f + (float)((i / 32 + r) % 7));
        quantize_row(GGML_Q8_0, wf, W + (size_t)r * rb, n);
    }
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < n; i++)
            xf[i] = frand() * (0.5f + (float)((i / 32 + t) % 3));
        quantize_act_q8_ref(xf, n, xq + (size_t)t * n, xd + (size_t)t * nb);
    }
    for (size_t i = 0; i < ny; i++)
        Y[i] = -12345.0f;
    /* prepared in two token ranges, as two threads of a step do */
    avx512_q8_prepare(xq, xd, n, n_tok, 0, n_tok / 2, prep);
    avx512_q8_prepare(xq, xd, n, n_tok, n_tok / 2, n_tok, prep);
    avx512_q8_0_rows_x_tokens(W, rb, n_rows, n, prep, n_tok, Y, ldy);
    for (int t = 0; t <= n_tok && !bad; t++)
        for (int r = 0; r < ldy && !bad; r++) {
            const float got = Y[(size_t)t * ldy + r];
            if (t == n_tok || r >= n_rows) {
                if (got != -12345.0f) {
                    test_fail(__FILE__, __LINE__, "n %d rows %d tokens %d: wrote Y[%d][%d]", n, n_rows, n_tok, t, r);
                    bad = 1;
                }
                continue;
            }
            double exact = 0.0, mag = 0.0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = W + (size_t)r * rb + (size_t)b * 34;
                uint16_t h;
                memcpy(&h, blk, 2);
                long sb = 0, sa = 0;
                for (int j = 0; j < 32; j++) {
                    const long pj = (long)(int8_t)blk[2 + j] * xq[(size_t)t * n + 32 * b + j];
                    sb += pj;
                    sa += pj < 0 ? -pj : pj;
                }
                const double scale = (double)fp16_to_f32(h) * xd[(size_t)t * nb + b];
                exact += scale * (double)sb;
                mag += fabs(scale) * (double)sa;
            }
            const double tol = (np + 8) * 0x1p-24 * mag + 1e-30;
            if (!(fabs(got - exact) <= tol)) {
                test_fail(__FILE__, __LINE__, "n %d rows %d tokens %d: Y[%d][%d] = %.9g, exact %.9g (tol %.3g)", n,
                          n_rows, n_tok, t, r, got, exact, tol);
                bad = 1;
            }
        }
out:
    free(W);
    free(xq);
    free(xd);
    free(wf);
    free(xf);
    free(Y);
    free(prep);
    return bad;
}

TEST(test_avx512_q8_0_vnni_matches_exact_block_sums)
{
    if (!simd_avx512())
        SKIP(NO_AVX512);
    if (!simd_avx512_vnni())
        SKIP("no AVX512-VNNI");
    /* odd block counts (a half pair at the end), rows in and out of whole
     * far-apart blocks of 4 (and of 2, the wide tile's), tokens in and past
     * one group of 4 (up to 4 tokens) and of 8 (the wide tile, from 5) */
    static const int ns[] = { 32, 64, 96, 1024, 3584 };
    static const int rows[] = { 1, 3, 4, 5, 9, 70 };
    static const int toks[] = { 1, 2, 3, 4, 5, 8, 9, 17 };
    rng_state = 14;
    int shapes = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof rows / sizeof rows[0]; b++)
            for (size_t c = 0; c < sizeof toks / sizeof toks[0]; c++) {
                if (check_q8_vnni(ns[a], rows[b], toks[c]))
                    return;
                shapes++;
            }
    CHECK(shapes == 240);
}

/* IEEE binary16 -> binary32 by integer manipulation. Subnormals are
 * normalized by shifting; a NaN keeps its payload and comes out quiet, as
 * vcvtph2ps returns it. */
static uint32_t f16_bits_to_f32_bits(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0)
            return sign;                                /* +-0 */
        int e = -14;                                    /* man * 2^-24 = 0.man * 2^-14 */
        while (!(man & 0x400)) {
            man <<= 1;
            e--;
        }
        return sign | (uint32_t)(e + 127) << 23 | (man & 0x3ff) << 13;
    }
    if (exp == 31)
        return sign | 0x7f800000u | (man ? 0x400000u | man << 13 : 0);   /* inf, quiet NaN */
    return sign | (exp + 112) << 23 | man << 13;
}

static bool bits_equal(float f, uint32_t want)
{
    uint32_t got;
    memcpy(&got, &f, 4);
    return got == want;
}

/* all 65536 patterns in one call, then short lengths at every offset so
 * each tail length 0..16 is decoded and nothing past n is written */
static void check_dequant(bool bf16)
{
    enum { N = 65536, SPARE = 20 };
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    float *out = malloc(sizeof(float) * (N + SPARE));
    CHECK(h && out);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    for (int i = 0; i < N + SPARE; i++)
        out[i] = -3.0f;
    int bad = -1;
    if (bf16)
        avx512_dequant_bf16(h, out, N);
    else
        avx512_dequant_f16(h, out, N);
    for (int i = 0; i < N && bad < 0; i++)
        if (!bits_equal(out[i], bf16 ? (uint32_t)h[i] << 16 : f16_bits_to_f32_bits(h[i])))
            bad = i;
    for (int i = N; i < N + SPARE && bad < 0; i++)
        if (out[i] != -3.0f)
            bad = i;
    for (int n = 0; n <= 40 && bad < 0; n++)
        for (int pass = 0; pass < 2 && bad < 0; pass++) {
            /* an exact-size copy: a read past n is an ASan report */
            uint16_t *s = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
            CHECK(s);
            memcpy(s, h + (pass ? 7 * n : 0x3bf0 + 7 * n), sizeof(uint16_t) * (size_t)n);  /* subnormals; normals */
            for (int i = 0; i < n + SPARE; i++)
                out[i] = -3.0f;
            if (bf16)
                avx512_dequant_bf16(s, out, n);
            else
                avx512_dequant_f16(s, out, n);
            for (int i = 0; i < n + SPARE && bad < 0; i++) {
                const bool ok = i < n ? bits_equal(out[i], bf16 ? (uint32_t)s[i] << 16 : f16_bits_to_f32_bits(s[i]))
                                      : out[i] == -3.0f;
                if (!ok)
                    bad = 100000 * (n + 1) + i;
            }
            free(s);
        }
    free(h);
    free(out);
    CHECK_MSG(bad < 0, "%s: first mismatch at %d (pattern index, or 100000 * (n + 1) + i for short n)",
              bf16 ? "bf16" : "f16", bad);
}

TEST(test_avx512_dequant_f16_is_bit_exact)
{
    if (!simd_avx512())
        SKIP(NO_AVX512);
    /* the integer reference itself, on values known by heart */
    CHECK(f16_bits_to_f32_bits(0x3c00) == 0x3f800000u);         /* 1 */
    CHECK(f16_bits_to_f32_bits(0xc000) == 0xc0000000u);         /* -2 */
    CHECK(f16_bits_to_f32_bits(0x8000) == 0x80000000u);         /* -0 */
    CHECK(f16_bits_to_f32_bits(0x0001) == 0x33800000u);         /* 2^-24, smallest subnormal */
    CHECK(f16_bits_to_f32_bits(0x03ff) == 0x387fc000u);         /* largest subnormal */
    CHECK(f16_bits_to_f32_bits(0x7bff) == 0x477fe000u);         /* 65504 */
    CHECK(f16_bits_to_f32_bits(0x7c00) == 0x7f800000u);         /* inf */
    CHECK(f16_bits_to_f32_bits(0xfc00) == 0xff800000u);         /* -inf */
    check_dequant(false);
}

TEST(test_avx512_dequant_bf16_is_bit_exact)
{
    if (!simd_avx512())
        SKIP(NO_AVX512);
    check_dequant(true);
}

/* simd_avx512() follows simd_set_enabled(): off with AVX2 off, back on with it */
TEST(test_avx512_dispatch_follows_the_avx2_switch)
{
    const bool was2 = simd_avx2(), was512 = simd_avx512();
    CHECK(!was512 || was2);
    simd_set_enabled(false);
    const bool off512 = simd_avx512();
    simd_set_enabled(was2);
    CHECK(!off512);
    CHECK(simd_avx2() == was2);
    CHECK(simd_avx512() == was512);
}

/* test_amx.c - the AMX Q8_0 kernel (simd_amx.c) against sums computed here
 * from the definition of Q8_0 x int8 activations.
 *
 * Each output is sum_b dw[r][b] dx[t][b] sum_j w[r][b][j] q[t][b][j]. The
 * inner sums are integers and exact (in the kernel and in the double
 * reference); the kernel then rounds one product and one sum per block,
 * in order, so it is within gamma(nb + 2) sum_b |term_b| of the exact value
 * (Higham 3.1, u = 2^-24); twice that is the tolerance. The f16 scales are
 * decoded here by bit arithmetic, not by quant.c. Weight bytes include
 * -128 (valid in the format) and activations +-127, the extremes.
 * Sentinels around Y prove nothing outside [n_tok) x [n_rows) is written.
 * Without AMX (or with HYSERVE_SIMD=avx512 / avx2 / 0) the kernel tests are
 * reported skipped (SKIP).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/blas.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/simd_amx.h"
#include "matmul.h"
#include "test.h"

static uint32_t rng_state;

static uint32_t rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}

/* why a kernel test is skipped: the CPU, or HYSERVE_SIMD, lacks the kernel */
#define OR_SIMD_OFF " (or HYSERVE_SIMD=avx512/avx2/0)"

/* |got - exact| within twice gamma(n) sum |terms| (Higham 3.1, u = 2^-24) */
static bool within(double got, double exact, double mag, int n)
{
    const double u = 0x1p-24, g = n * u / (1.0 - n * u);
    return fabs(got - exact) <= 2.0 * g * mag + 1e-30;
}

/* IEEE half -> double from the bit fields */
static double half_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0)
        return s * ldexp(m, -24);
    return s * ldexp(1024 + m, e - 25);
}

/* a random normal half in [2^-10, 2^-4) with a random sign */
static uint16_t rand_half(void)
{
    return (uint16_t)(((rnd() & 1) << 15) | ((5 + rnd() % 6) << 10) | (rnd() & 1023));
}

static int check_shape(int n_in, int n_rows, int n_tok)
{
    const int nb = n_in / 32, ldy = n_rows + 3;
    const size_t rb = (size_t)nb * 34;
    uint8_t *W = malloc(rb * n_rows);
    int8_t *xq = malloc((size_t)n_tok * n_in);
    float *xd = malloc(sizeof(float) * n_tok * nb);
    void *prep = aligned_alloc(64, (amx_q8_0_prep_bytes(n_in, n_tok) + 63) / 64 * 64);
    float *Y = malloc(sizeof(float) * (size_t)(n_tok + 1) * ldy);
    for (int r = 0; r < n_rows; r++)
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = W + r * rb + b * 34;
            const uint16_t d = rand_half();
            memcpy(blk, &d, 2);
            for (int j = 0; j < 32; j++)
                blk[2 + j] = (uint8_t)((r + b + j) % 29 == 0 ? 0x80 : rnd() & 0xff);   /* -128 sometimes */
        }
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < n_in; i++)
            xq[(size_t)t * n_in + i] = (int8_t)(i % 31 == 0 ? ((t + i) % 2 ? 127 : -127) : (int)(rnd() % 255) - 127);
        for (int b = 0; b < nb; b++)
            xd[t * nb + b] = (float)ldexp(1.0 + (rnd() % 1000) / 1000.0, -(int)(rnd() % 8));
    }
    for (int i = 0; i < (n_tok + 1) * ldy; i++)
        Y[i] = -777.0f;
    amx_q8_0_prepare(xq, xd, n_in, n_tok, prep);
    amx_q8_0_rows_x_tokens(W, rb, n_rows, n_in, prep, n_tok, Y, ldy);
    int bad = 0;
    for (int t = 0; t <= n_tok && !bad; t++)
        for (int r = 0; r < ldy && !bad; r++) {
            const float got = Y[(size_t)t * ldy + r];
            if (t == n_tok || r >= n_rows) {
                if (got != -777.0f) {
                    test_fail(__FILE__, __LINE__, "n_in %d rows %d tokens %d: wrote outside at [%d][%d]", n_in,
                              n_rows, n_tok, t, r);
                    bad = 1;
                }
                continue;
            }
            double exact = 0.0, mag = 0.0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = W + r * rb + b * 34;
                uint16_t d;
                memcpy(&d, blk, 2);
                long s = 0;
                for (int j = 0; j < 32; j++)
                    s += (long)(int8_t)blk[2 + j] * xq[(size_t)t * n_in + b * 32 + j];
                const double term = half_value(d) * xd[t * nb + b] * (double)s;
                exact += term;
                mag += fabs(term);
            }
            if (!within(got, exact, mag, nb + 2)) {
                test_fail(__FILE__, __LINE__, "n_in %d rows %d tokens %d: Y[%d][%d] = %.9g, exact %.9g", n_in,
                          n_rows, n_tok, t, r, got, exact);
                bad = 1;
            }
        }
    free(W); free(xq); free(xd); free(prep); free(Y);
    return bad;
}

TEST(test_amx_q8_0_tiles_match_the_integer_definition)
{
    if (!simd_amx())
        SKIP("no AMX" OR_SIMD_OFF);
    static const int shapes[][3] = {
        { 32, 16, 2 }, { 64, 16, 16 }, { 96, 32, 5 }, { 1024, 48, 16 }, { 1024, 16, 1 },
        { 3584, 32, 9 }, { 2048, 64, 3 }, { 1024, 32, 40 }, { 64, 16, 33 },     /* groups of 16 tokens */
    };
    rng_state = 5;
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && !bad; i++)
        bad = check_shape(shapes[i][0], shapes[i][1], shapes[i][2]);
    CHECK(!bad);
}

/* Through matmul: a batch of n_tok tokens gives each token what a
 * one-token product gives it (both quantize the activations the same way;
 * only the float order of the block sums differs), for widths with and
 * without a partial tile of 16 rows. */
TEST(test_amx_batched_q8_0_matmul_equals_one_token_products)
{
    if (!simd_amx())
        SKIP("no AMX" OR_SIMD_OFF);
    static const int n_outs[] = { 64, 70 }, n_toks[] = { 16, 70 };     /* 70 tokens: calls of 64 + 6 */
    rng_state = 6;
    blas_set_threads(2);
    int bad = 0;
    for (size_t k = 0; k < 2 && !bad; k++) {
        const int n_in = 1024, n_out = n_outs[k], n_tok = n_toks[k];
        const size_t rb = (size_t)n_in / 32 * 34;
        float *wf = malloc(sizeof(float) * n_in), *X = malloc(sizeof(float) * n_in * n_tok);
        float *Yb = malloc(sizeof(float) * n_out * n_tok), *Y1 = malloc(sizeof(float) * n_out);
        char *data = malloc(rb * n_out);
        /* the smallest scratch matmul may be given (one thread's share):
         * the AMX path's shared scratch must fit it; AddressSanitizer
         * checks the bound in the SANITIZE build */
        float *scratch = malloc(sizeof(float) * 64 * (size_t)n_in);
        for (int o = 0; o < n_out; o++) {
            for (int i = 0; i < n_in; i++)
                wf[i] = ((float)(rnd() % 2001) - 1000.0f) / 3000.0f;
            quantize_row(GGML_Q8_0, wf, data + (size_t)o * rb, n_in);
        }
        for (int i = 0; i < n_in * n_tok; i++)
            X[i] = ((float)(rnd() % 2001) - 1000.0f) / 500.0f;
        weight W = { .data = data, .type = GGML_Q8_0, .n_in = n_in, .n_out = n_out, .row_bytes = rb };
        matmul(Yb, &W, X, n_tok, true, scratch);
        const int nb = n_in / 32;
        int8_t *q = malloc(n_in);
        float *d = malloc(sizeof(float) * nb);
        for (int t = 0; t < n_tok && !bad; t++) {
            matmul(Y1, &W, X + (size_t)t * n_in, 1, false, scratch);
            quantize_act_q8_ref(X + (size_t)t * n_in, n_in, q, d);
            for (int o = 0; o < n_out; o++) {
                /* the same exact block sums scaled and added in two float
                 * orders (one-token: 8 lanes of nb terms, then the lanes;
                 * AMX: nb terms): gamma(nb + 4) + gamma(nb + 2) of
                 * sum_b |dw dx| sum_j |w q| bounds the difference. Using
                 * f32 activations for the batch would miss it by ~1e3. */
                const uint8_t *row = (const uint8_t *)data + (size_t)o * rb;
                double mag = 0.0;
                for (int b = 0; b < nb; b++) {
                    uint16_t dh;
                    memcpy(&dh, row + b * 34, 2);
                    long sa = 0;
                    for (int j = 0; j < 32; j++)
                        sa += labs((long)(int8_t)row[b * 34 + 2 + j] * q[b * 32 + j]);
                    mag += fabs(half_value(dh) * d[b]) * (double)sa;
                }
                const double u = 0x1p-24;
                const double tol = ((nb + 4) * u / (1 - (nb + 4) * u) + (nb + 2) * u / (1 - (nb + 2) * u)) * mag;
                if (!(fabs(Yb[(size_t)t * n_out + o] - Y1[o]) <= tol)) {
                    test_fail(__FILE__, __LINE__, "n_out %d token %d row %d: batch %.9g alone %.9g", n_out, t, o,
                              Yb[(size_t)t * n_out + o], Y1[o]);
                    bad = 1;
                    break;
                }
            }
        }
        free(wf); free(X); free(Yb); free(Y1); free(data); free(scratch); free(q); free(d);
    }
    CHECK(!bad);
}

/* ---- BF16 ---------------------------------------------------------- */

/* bf16 bits -> double, and f32 -> bf16 by round to nearest even, written
 * here from the format (the top 16 bits of an IEEE single) */
static double bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t low = u & 0xffffu, keep = u >> 16;
    return (uint16_t)(low > 0x8000u || (low == 0x8000u && (keep & 1u)) ? keep + 1 : keep);
}

/* Rows of 16-bit weights (BF16, or F16 on the same bf16 tiles) against
 * exact sums in double.
 * BF16: against sum_i w_i bf16(x_i). The products of two bf16 are exact
 * in f32, the kernel adds n terms in f32 in some order, so it is within
 * gamma(n) sum |terms|; twice that is the tolerance. For the short rows
 * (n = 32: 4e-6 of sum |terms|) a kernel that skipped or truncated the
 * rounding of x (errors up to 2^-9 per term) falls outside.
 * F16: against sum_i w_i x_i with the true x. The kernel splits each
 * weight exactly (hi + lo) and x into xh + xl and drops lo xl: every term
 * within 2^-15 of w x (2^-16 for xl's rounding, 2^-16 for lo xl), then 3n
 * products added in f32, within gamma(3n) of their magnitude, taken
 * twice. A kernel that skipped either correction product (hi xl or lo xh)
 * errs by up to 2^-9 per term and falls outside. Its weights cover every
 * significand bit, subnormal halves included.
 * Through matmul() in a decode step with a partial tile (n_out 70) the
 * tail rows are checked the same way; more tokens than one call takes
 * (64 for BF16, 32 for F16) split into calls. */
static int check_16bit(uint32_t type, int n_in, int n_out, int n_tok, bool via_matmul)
{
    const bool f16 = type == GGML_F16;
    const size_t rb = (size_t)n_in * 2;
    uint16_t *W = malloc(rb * n_out);
    float *X = malloc(sizeof(float) * n_in * n_tok), *Y = malloc(sizeof(float) * (size_t)(n_tok + 1) * (n_out + 3));
    const size_t prep_bytes = f16 ? amx_f16_prep_bytes(n_in, n_tok) : amx_bf16_prep_bytes(n_in, n_tok);
    void *prep = aligned_alloc(64, (prep_bytes + 63) / 64 * 64);
    float *scratch = malloc(sizeof(float) * 64 * (size_t)n_in);     /* one thread's share, as above */
    const int ldy = via_matmul ? n_out : n_out + 3;
    for (int i = 0; i < n_in * n_out; i++) {
        if (f16) {
            const uint32_t e = rnd() % 8 == 0 ? 0 : 8 + rnd() % 12;   /* subnormal, or 2^-7 .. 2^4 */
            W[i] = (uint16_t)((rnd() & 1) << 15 | e << 10 | (rnd() & 1023));
        } else {
            W[i] = bf16_rne(((float)(rnd() % 2001) - 1000.0f) / 1000.0f);
        }
    }
    for (int i = 0; i < n_in * n_tok; i++)
        X[i] = ((float)(rnd() % 200001) - 100000.0f) / 31337.0f;      /* many bits below bf16's */
    for (int i = 0; i < (n_tok + 1) * (n_out + 3); i++)
        Y[i] = -777.0f;
    if (via_matmul) {
        weight Wt = { .data = W, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb };
        matmul(Y, &Wt, X, n_tok, true, scratch);
    } else if (f16) {
        amx_f16_prepare(X, n_in, n_tok, prep);
        amx_f16_rows_x_tokens(W, rb, n_out, n_in, prep, n_tok, Y, ldy);
    } else {
        amx_bf16_prepare(X, n_in, n_tok, prep, NULL);
        amx_bf16_rows_x_tokens(W, rb, n_out, n_in, prep, n_tok, Y, ldy);
    }
    const char *name = f16 ? "f16" : "bf16";
    const double u = 0x1p-24, g3 = 3.0 * n_in * u / (1.0 - 3.0 * n_in * u);
    int bad = 0;
    for (int t = 0; t < n_tok && !bad; t++)
        for (int r = 0; r < ldy && !bad; r++) {
            const float got = Y[(size_t)t * ldy + r];
            if (r >= n_out) {
                if (got != -777.0f) {
                    test_fail(__FILE__, __LINE__, "%s %dx%d: wrote outside at [%d][%d]", name, n_out, n_in, t, r);
                    bad = 1;
                }
                continue;
            }
            double exact = 0.0, mag = 0.0;
            for (int i = 0; i < n_in; i++) {
                const uint16_t w = W[(size_t)r * n_in + i];
                const float x = X[(size_t)t * n_in + i];
                const double term = f16 ? half_value(w) * x : bf16_value(w) * bf16_value(bf16_rne(x));
                exact += term;
                mag += fabs(term);
            }
            const bool ok = f16 ? fabs(got - exact) <= (0x1p-15 + 2.0 * g3) * mag + 1e-30
                                : within(got, exact, mag, n_in + 2);
            if (!ok) {
                test_fail(__FILE__, __LINE__, "%s %dx%d tokens %d%s: Y[%d][%d] = %.9g, exact %.9g", name, n_out, n_in,
                          n_tok, via_matmul ? " (matmul)" : "", t, r, got, exact);
                bad = 1;
            }
        }
    free(W); free(X); free(Y); free(prep); free(scratch);
    return bad;
}

static int check_bf16(int n_in, int n_out, int n_tok, bool via_matmul)
{
    return check_16bit(GGML_BF16, n_in, n_out, n_tok, via_matmul);
}

static int check_f16(int n_in, int n_out, int n_tok, bool via_matmul)
{
    return check_16bit(GGML_F16, n_in, n_out, n_tok, via_matmul);
}

TEST(test_amx_bf16_tiles_match_the_rounded_definition)
{
    if (!simd_amx_bf16())
        SKIP("no AMX-BF16" OR_SIMD_OFF);
    rng_state = 9;
    blas_set_threads(2);
    CHECK(!check_bf16(32, 16, 2, false));
    CHECK(!check_bf16(64, 32, 16, false));
    CHECK(!check_bf16(96, 16, 5, false));          /* an odd number of 32-wide chunks */
    CHECK(!check_bf16(1024, 48, 9, false));
    CHECK(!check_bf16(1024, 70, 16, true));        /* matmul: tiles + 6 tail rows */
    CHECK(!check_bf16(256, 64, 3, true));
    CHECK(!check_bf16(128, 70, 70, true));         /* 70 tokens: calls of 64 + 6, groups of 16 */
    CHECK(!check_bf16(64, 32, 20, false));
}

/* The prepared tiles bit for bit: dword j * 16 + t of chunk c (group g) is
 * bf16(x[2j]) | bf16(x[2j + 1]) << 16 of token 16 g + t, zero past the
 * last token. Inputs include ties in both directions, the largest finite
 * floats (which round to infinity), infinities, subnormals, -0 and NaNs
 * (which must stay NaNs of the same sign). */
static int check_bf16_layout(int n_in, int n_tok)
{
    static const uint32_t special[] = { 0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu, 0xff7fffffu,
                                        0x7f800000u, 0xff800000u, 0x00000001u, 0x80008000u, 0x00018000u,
                                        0x80000000u, 0x7fc00000u, 0xff800001u, 0x7f80ffffu, 0x3f80ffffu };
    const int nc = n_in / 32, ns = (int)(sizeof special / sizeof special[0]);
    float *X = malloc(sizeof(float) * n_in * n_tok);
    const size_t bytes = amx_bf16_prep_bytes(n_in, n_tok);
    uint32_t *prep = aligned_alloc(64, (bytes + 63) / 64 * 64);
    memset(prep, 0xa5, bytes);
    for (int i = 0; i < n_in * n_tok; i++) {
        uint32_t u = rnd() % 3 == 0 ? special[rnd() % ns] : (rnd() << 8) ^ rnd();
        memcpy(&X[i], &u, 4);
    }
    amx_bf16_prepare(X, n_in, n_tok, prep, NULL);
    int bad = 0;
    for (int g = 0; 16 * g < n_tok && !bad; g++)
        for (int c = 0; c < nc && !bad; c++)
            for (int j = 0; j < 16 && !bad; j++)
                for (int t = 0; t < 16 && !bad; t++) {
                    const uint32_t got = prep[((size_t)g * nc + c) * 256 + 16 * j + t];
                    uint32_t want = 0;
                    const int tok = 16 * g + t;
                    for (int h = 0; h < 2 && tok < n_tok; h++) {
                        const float x = X[(size_t)tok * n_in + 32 * c + 2 * j + h];
                        uint32_t u;
                        memcpy(&u, &x, 4);
                        /* a NaN keeps its sign and top payload bits, quiet bit set */
                        want |= (isnan(x) ? (u >> 16) | 0x40u : bf16_rne(x)) << (16 * h);
                    }
                    if (got != want) {
                        test_fail(__FILE__, __LINE__, "bf16 layout n_in %d tokens %d: group %d chunk %d pair %d "
                                  "token %d: %08x, want %08x", n_in, n_tok, g, c, j, t, got, want);
                        bad = 1;
                    }
                }
    free(X);
    free(prep);
    return bad;
}

TEST(test_amx_bf16_prepare_lays_out_rounded_activations_bit_for_bit)
{
    if (!simd_amx_bf16())
        SKIP("no AMX-BF16" OR_SIMD_OFF);
    rng_state = 21;
    CHECK(!check_bf16_layout(32, 1));
    CHECK(!check_bf16_layout(64, 16));
    CHECK(!check_bf16_layout(96, 17));           /* a second group of one token */
    CHECK(!check_bf16_layout(1024, 40));
}

TEST(test_amx_f16_split_tiles_match_the_exact_products)
{
    if (!simd_amx_f16())
        SKIP("no AMX-BF16 with AVX512-BF16" OR_SIMD_OFF);
    rng_state = 11;
    blas_set_threads(2);
    CHECK(!check_f16(32, 16, 2, false));
    CHECK(!check_f16(96, 16, 5, false));           /* an odd number of 32-wide chunks */
    CHECK(!check_f16(1024, 48, 16, false));
    CHECK(!check_f16(64, 32, 20, false));          /* two token groups, the second partial */
    CHECK(!check_f16(1024, 70, 16, true));         /* matmul: tiles + 6 tail rows */
    CHECK(!check_f16(128, 70, 40, true));          /* 40 tokens: calls of 32 + 8 */
}

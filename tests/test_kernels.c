/* test_kernels.c - every fast kernel against its plain scalar reference.
 *
 * The AVX2 kernels (simd_avx2.c) reorder float sums; nothing else may
 * differ. Tolerances are therefore rigorous float-summation bounds, not
 * tuned numbers: a sum of n terms computed in any order is within
 * gamma(n) * sum |terms| of the exact sum, gamma(n) = n u / (1 - n u) with
 * u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
 * Two such sums differ by at most 2 gamma(n) sum |terms|. Decoding (f16,
 * bf16, Q8_0 -> f32) and int8 quantization of activations are exact
 * operations or single roundings done identically, so those are compared
 * bit for bit. On a CPU without AVX2 (or with HYSERVE_SIMD=0) the AVX2
 * tests have nothing to run and are reported skipped; the dispatch test
 * still checks the scalar route.
 */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "kernels/attn.h"
#include "kernels/blas.h"
#include "kernels/panels.h"
#include "kernels/quant.h"
#include "kernels/share.h"
#include "kernels/simd_amx.h"
#include "kernels/simd.h"
#include "kernels/simd512.h"
#include "kernels/vecmath.h"
#include "layers.h"
#include "matmul.h"
#include "test.h"

#define NO_AVX2 "no AVX2 on this CPU (or HYSERVE_SIMD=0)"

static uint32_t rng_state;

static float frand(void)        /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / (float)(1u << 23) - 1.0f;
}

static void fill(float *x, int n, float scale)
{
    for (int i = 0; i < n; i++)
        x[i] = frand() * scale;
}

static double gamma_n(int n)
{
    const double u = 0x1p-24;
    return n * u / (1.0 - n * u);
}

/* sum |w_i x_i| with w decoded by the reference */
static double abs_terms(uint32_t type, const void *row, const float *x, int n)
{
    float *w = malloc(sizeof(float) * (size_t)n);
    dequant_row(type, row, w, n);
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += fabs((double)w[i] * x[i]);
    free(w);
    return s;
}

static size_t row_bytes(uint32_t type, int n)
{
    return ggml_type_size(type) * (size_t)n / ggml_block_size(type);
}

static float avx2_dot(uint32_t type, const void *row, const float *x, int n)
{
    switch (type) {
    case GGML_F32: return avx2_dot_f32(row, x, n);
    case GGML_F16: return avx2_dot_f16(row, x, n);
    case GGML_BF16: return avx2_dot_bf16(row, x, n);
    default: return avx2_dot_q8_0(row, x, n);
    }
}

TEST(test_kernel_avx2_dot_products_match_the_scalar_references)
{
    if (!simd_avx2())
        SKIP(NO_AVX2);
    static const uint32_t types[] = { GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0 };
    /* block multiples for Q8_0; odd lengths exercise the tails of the others */
    static const int lens[] = { 32, 64, 1024, 3584, 8, 1, 7, 33, 1001 };
    rng_state = 1;
    for (size_t ti = 0; ti < 4; ti++) {
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const uint32_t type = types[ti];
            const int n = lens[li];
            if (type == GGML_Q8_0 && n % 32)
                continue;
            float *w = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
            void *row = malloc(row_bytes(type, n));
            fill(w, n, 0.5f);
            fill(x, n, 2.0f);
            quantize_row(type, w, row, n);
            double ref = dot_row(type, row, x, n), got = avx2_dot(type, row, x, n);
            /* each side sums n products (Q8_0: n + n/32 with the scales) */
            double tol = 2.0 * gamma_n(n + n / 32 + 8) * abs_terms(type, row, x, n) + 1e-30;
            int bad = !(fabs(got - ref) <= tol);
            free(w);
            free(x);
            free(row);
            CHECK_MSG(!bad, "type %u n %d: avx2 %.9g vs reference %.9g (tol %.3g)", type, n, got, ref, tol);
        }
    }
}

TEST(test_kernel_avx2_row_decoding_is_bit_exact)
{
    if (!simd_avx2())
        SKIP(NO_AVX2);
    /* every f16 and bf16 bit pattern: normals, subnormals, zeros, inf, nan */
    uint16_t *h = malloc(sizeof(uint16_t) * 65536);
    float *a = malloc(sizeof(float) * 65536), *b = malloc(sizeof(float) * 65536);
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t type = pass ? GGML_BF16 : GGML_F16;
        dequant_row(type, h, a, 65536);
        if (pass)
            avx2_dequant_bf16(h, b, 65536);
        else
            avx2_dequant_f16(h, b, 65536);
        for (int i = 0; i < 65536; i++) {
            if (isnan(a[i]) && isnan(b[i]))
                continue;
            if (memcmp(&a[i], &b[i], 4) != 0) {
                test_fail(__FILE__, __LINE__, "type %u pattern 0x%04x: %g vs reference %g", type, i, b[i], a[i]);
                goto out;
            }
        }
    }
    {   /* Q8_0: d * q is one rounding in both */
        const int n = 4096;
        rng_state = 2;
        float *x = malloc(sizeof(float) * n), *y0 = malloc(sizeof(float) * n), *y1 = malloc(sizeof(float) * n);
        void *row = malloc(row_bytes(GGML_Q8_0, n));
        fill(x, n, 3.0f);
        quantize_row(GGML_Q8_0, x, row, n);
        dequant_row(GGML_Q8_0, row, y0, n);
        avx2_dequant_q8_0(row, y1, n);
        int same = memcmp(y0, y1, sizeof(float) * n) == 0;
        free(x); free(y0); free(y1); free(row);
        CHECK_MSG(same, "Q8_0 decoding differs from dequant_row");
    }
out:
    free(h);
    free(a);
    free(b);
}

TEST(test_kernel_int8_activation_quantizer_matches_reference_bit_for_bit)
{
    if (!simd_avx2())
        SKIP(NO_AVX2);
    const int n = 4096;
    rng_state = 3;
    float *x = malloc(sizeof(float) * n);
    int8_t *q0 = malloc(n), *q1 = malloc(n);
    float d0[128], d1[128];
    fill(x, n, 5.0f);
    for (int j = 0; j < 32; j++)            /* an all-zero block: d = 0, q = 0 */
        x[64 + j] = 0.0f;
    x[200] = 127.5f;                        /* ties and the extremes */
    x[300] = -1e-30f;
    quantize_act_q8_ref(x, n, q0, d0);
    avx2_quantize_act_q8(x, n, q1, d1);
    int same = memcmp(q0, q1, n) == 0 && memcmp(d0, d1, sizeof d0) == 0;
    int in_range = 1;
    for (int i = 0; i < n; i++)
        in_range &= q0[i] != -128;
    free(x);
    free(q0);
    free(q1);
    CHECK_MSG(same, "avx2 quantized activations differ from the reference");
    CHECK_MSG(in_range, "a quantized activation left [-127, 127]");
}

TEST(test_kernel_q8_0_int8_dot_matches_reference_and_float_dot)
{
    if (!simd_avx2())
        SKIP(NO_AVX2);
    static const int lens[] = { 32, 64, 96, 1024, 3584 };
    rng_state = 4;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int n = lens[li], nb = n / 32;
        float *w = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * n), *wd = malloc(sizeof(float) * n);
        int8_t *q = malloc(n);
        float *d = malloc(sizeof(float) * nb);
        void *row = malloc(row_bytes(GGML_Q8_0, n));
        fill(w, n, 0.25f);
        fill(x, n, 4.0f);
        quantize_row(GGML_Q8_0, w, row, n);
        /* one weight of -128 (valid in the format, never written by our
         * quantizer): the maddubs pair sums must not saturate */
        ((int8_t *)row)[2 + 5] = -128;
        quantize_act_q8_ref(x, n, q, d);
        dequant_row(GGML_Q8_0, row, wd, n);
        double ref = dot_q8_0_act_ref(row, q, d, n), got = avx2_dot_q8_0_act(row, q, d, n);
        /* block sums are exact ints; only the nb scaled block sums (8 lanes each) are reordered */
        double terms = 0.0, qerr = 0.0;
        for (int b = 0; b < nb; b++) {
            double s = 0.0, sw = 0.0;
            for (int j = 0; j < 32; j++) {
                s += fabs((double)wd[32 * b + j] * q[32 * b + j] * d[b]);
                sw += fabs((double)wd[32 * b + j]);
            }
            terms += s;
            qerr += sw * d[b] / 2.0;    /* |x - d q| <= d / 2 per element */
        }
        double tol = 2.0 * gamma_n(nb + 16) * terms + 1e-30;
        double fl = dot_row(GGML_Q8_0, row, x, n);
        double tolq = qerr + 2.0 * gamma_n(n + nb + 16) * abs_terms(GGML_Q8_0, row, x, n);
        free(w); free(x); free(wd); free(q); free(d); free(row);
        CHECK_MSG(fabs(got - ref) <= tol, "n %d: avx2 %.9g vs reference %.9g (tol %.3g)", n, got, ref, tol);
        CHECK_MSG(fabs(ref - fl) <= tolq, "n %d: int8 dot %.9g vs float dot %.9g (bound %.3g)", n, ref, fl, tolq);
    }
}

/* The Q8_0 matrix-vector product with vpdpbusd (AVX-VNNI) and with the
 * sign trick: both form exact integer block sums and scale them with the
 * same float operations in the same order, so they must agree bit for bit.
 * Extreme bytes (-128 and +127 weights, +-127 activations) are planted so
 * the w + 128 offset and its correction are exercised at their limits;
 * 70 rows leave a partial group of four for the one-row tail. The
 * one-token kernel takes the blocks' starting sums computed once per call
 * (up to 512 blocks; 16416 elements, 513 blocks, computes them per group
 * as the decode-step kernel always does): the decode-step kernel on the
 * same single token must give the same bits too. */
TEST(test_kernel_q8_0_vnni_matvec_equals_sign_trick_bit_for_bit)
{
    if (!simd_vnni())
        SKIP("no AVX-VNNI on this CPU");
    static const int lens[] = { 32, 256, 1024, 3584, 16384, 16416 };
    rng_state = 11;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int n = lens[li], rows = 70;
        const size_t rb = row_bytes(GGML_Q8_0, n);
        float *w = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n / 32);
        float *y0 = malloc(sizeof(float) * rows), *y1 = malloc(sizeof(float) * rows);
        int8_t *q = malloc(n);
        char *data = malloc(rb * rows);
        for (int r = 0; r < rows; r++) {
            fill(w, n, 0.5f);
            quantize_row(GGML_Q8_0, w, data + (size_t)r * rb, n);
            int8_t *qs = (int8_t *)(data + (size_t)r * rb + 2);     /* first block's weights */
            qs[r % 32] = -128;
            qs[(r + 7) % 32] = 127;
        }
        fill(x, n, 3.0f);
        x[0] = 3.0f;            /* a block maximum: quantizes to +127 */
        x[1] = -3.0f;           /* and -127 */
        quantize_act_q8(x, n, q, d);
        simd_set_vnni(false);
        avx2_matvec(GGML_Q8_0, data, rb, rows, x, q, d, n, y0);
        simd_set_vnni(true);
        avx2_matvec(GGML_Q8_0, data, rb, rows, x, q, d, n, y1);
        int same = memcmp(y0, y1, sizeof(float) * rows) == 0;
        int first = 0;
        while (same == 0 && first < rows - 1 && y0[first] == y1[first])
            first++;
        CHECK_MSG(same, "n %d: row %d vnni %.9g vs sign trick %.9g", n, first, y1[first], y0[first]);
        const float *xs[1] = { x }, *ds[1] = { d };
        const int8_t *qv[1] = { q };
        avx2_matvec_tokens(GGML_Q8_0, data, rb, rows, xs, qv, ds, 1, n, y0, (size_t)rows);
        same = memcmp(y0, y1, sizeof(float) * rows) == 0;
        for (first = 0; same == 0 && first < rows - 1 && y0[first] == y1[first]; first++)
            ;
        CHECK_MSG(same, "n %d: row %d one token %.9g vs decode-step kernel %.9g", n, first, y1[first], y0[first]);
        free(w); free(x); free(d); free(y0); free(y1); free(q); free(data);
    }
}

TEST(test_kernel_rows_x_tokens_matches_per_row_dots)
{
    if (!simd_avx2())
        SKIP(NO_AVX2);
    const int n = 1001, ld = 1024;
    rng_state = 5;
    float *W = malloc(sizeof(float) * 4 * ld), *X = malloc(sizeof(float) * 5 * ld);
    float Y[5 * 7];
    fill(W, 4 * ld, 1.0f);
    fill(X, 5 * ld, 1.0f);
    for (int nr = 1; nr <= 4; nr++)
        for (int nt = 1; nt <= 5; nt++) {
            for (int i = 0; i < 35; i++)
                Y[i] = -7.0f;
            avx2_rows_x_tokens(W, ld, nr, X, ld, nt, n, Y, 7);
            for (int t = 0; t < 5; t++)
                for (int r = 0; r < 7; r++) {
                    float got = Y[t * 7 + r];
                    if (t >= nt || r >= nr) {
                        CHECK_MSG(got == -7.0f, "rows %d tokens %d wrote outside (%d, %d)", nr, nt, t, r);
                        continue;
                    }
                    double ref = dot_row(GGML_F32, W + (size_t)r * ld, X + (size_t)t * ld, n);
                    double tol = 2.0 * gamma_n(n) * abs_terms(GGML_F32, W + (size_t)r * ld, X + (size_t)t * ld, n);
                    CHECK_MSG(fabs(got - ref) <= tol, "rows %d tokens %d (%d, %d): %.9g vs %.9g", nr, nt, t, r,
                              got, ref);
                }
        }
    free(W);
    free(X);
}

TEST(test_kernel_avx2_deltanet_step_matches_recurrent_reference)
{
    if (!simd_avx2())
        SKIP(NO_AVX2);
    /* d_k = 128 as in Qwen3.5, and an odd size for the tails */
    static const int dims[][2] = { { 128, 128 }, { 20, 12 } };
    for (int di = 0; di < 2; di++) {
        const int dk = dims[di][0], dv = dims[di][1], steps = 40;
        rng_state = 6 + (uint32_t)di;
        float *S0 = malloc(sizeof(float) * dk * dv), *S1 = malloc(sizeof(float) * dk * dv);
        float *q = malloc(sizeof(float) * dk), *k = malloc(sizeof(float) * dk), *v = malloc(sizeof(float) * dv);
        float *o0 = malloc(sizeof(float) * dv), *o1 = malloc(sizeof(float) * dv);
        fill(S0, dk * dv, 0.1f);
        memcpy(S1, S0, sizeof(float) * dk * dv);
        double worst = 0.0;
        for (int t = 0; t < steps; t++) {
            fill(q, dk, 1.0f);
            fill(k, dk, 1.0f);
            fill(v, dv, 1.0f);
            l2norm(q, dk, 1e-6f);
            l2norm(k, dk, 1e-6f);
            float beta = 0.5f + 0.5f * frand(), g = -0.5f + 0.45f * frand();
            dnet_recurrent_head(1, dk, dv, q, dk, k, dk, v, dv, &beta, &g, S0, o0, dv);
            avx2_dnet_step(dk, dv, q, k, v, beta, g, S1, o1, t % 2 == 0);     /* with and without prefetch */
            for (int j = 0; j < dv; j++)
                worst = fmax(worst, fabs((double)o0[j] - o1[j]));
            for (int i = 0; i < dk * dv; i++)
                worst = fmax(worst, fabs((double)S0[i] - S1[i]));
        }
        free(S0); free(S1); free(q); free(k); free(v); free(o0); free(o1);
        /* entries of S and o stay O(1) here (unit q, k; |v| <= 1; decay < 1);
         * each step adds a few d_k-term sums' worth of reordering error
         * (gamma(128) ~ 8e-6 relative), and the state carries it forward
         * with |factor| <= 1 + beta |k|^2 <= 2, damped by the decay */
        CHECK_MSG(worst < 1e-4, "d_k %d d_v %d: max difference %.3g over %d steps", dk, dv, worst, steps);
    }
}

/* f32 -> bf16 stores (the DeltaNet state's, quantize_row_fast) against
 * values worked by hand from the format (1 sign, 8 exponent, 7 mantissa
 * bits; round to nearest, ties to even) and, over random and special bit
 * patterns, bit for bit against the scalar f32_to_bf16. */
TEST(test_kernel_bf16_stores_round_to_nearest_even)
{
    static const uint32_t in[] = {
        0x3f800000u, /* 1.0 exact */
        0x3f808000u, /* 1 + 2^-8: a tie, to the even 1.0 */
        0x3f818000u, /* 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6 */
        0x3f808001u, /* just above the tie: up */
        0xbf80c000u, /* -(1 + 3 * 2^-9): up in magnitude */
        0x7f7fffffu, /* the largest float: rounds to inf */
        0x0000ffffu, /* a subnormal: rounds up to the smallest bf16 subnormal */
        0x00000001u, /* the smallest subnormal: to +0 */
        0x80000000u, /* -0 */
        0xff800000u, /* -inf */
        0x7fc00000u, /* the default quiet NaN */
        0x7f800001u, /* a NaN whose payload is all below bit 16: stays a NaN */
    };
    static const uint16_t want[] = { 0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xbf81, 0x7f80, 0x0001, 0x0000,
                                     0x8000, 0xff80, 0x7fc0, 0x7fc0 };
    enum { N = 4096 + 12 + 5 };          /* vector body and a tail */
    float *x = malloc(sizeof(float) * N);
    uint16_t *a = malloc(sizeof(uint16_t) * N), *b = malloc(sizeof(uint16_t) * N);
    rng_state = 17;
    for (int i = 0; i < N; i++) {
        rng_state = rng_state * 1664525u + 1013904223u;
        uint32_t u = i < 12 ? in[i] : rng_state ^ (rng_state >> 13) * 2654435761u;
        memcpy(&x[i], &u, 4);
    }
    quantize_row(GGML_BF16, x, a, N);
    quantize_row_fast(GGML_BF16, x, b, N);
    for (int i = 0; i < 12; i++)
        CHECK_MSG(a[i] == want[i], "0x%08x: 0x%04x, want 0x%04x", in[i], a[i], want[i]);
    int diff = 0;
    for (int i = 0; i < N; i++)
        diff += a[i] != b[i];
    CHECK_MSG(diff == 0, "%d of %d bf16 stores differ from f32_to_bf16", diff, N);
    free(x);
    free(a);
    free(b);
}

/* The decode step on a bf16 state (the cache's --state-dtype bf16): from
 * the same stored state, the scalar recurrence on the widened state with
 * its result rounded (f32_to_bf16) is the reference. The AVX2 step must be
 * exactly widen -> avx2_dnet_step -> quantize_row (its contract); both
 * kernels' o within summation-order error of the reference, and their
 * stored S equal to the reference's rounding or one bf16 step away where
 * the reference sits that close to a rounding boundary (rare). */
TEST(test_kernel_deltanet_step_on_a_bf16_state_matches_the_rounded_reference)
{
    if (!simd_avx2())
        SKIP(NO_AVX2);
    static const int dims[][2] = { { 128, 128 }, { 32, 8 }, { 20, 12 } };
    for (int di = 0; di < 3; di++) {
        const int dk = dims[di][0], dv = dims[di][1], n = dk * dv, steps = 24;
        rng_state = 60 + (uint32_t)di;
        uint16_t *S = malloc(2 * (size_t)n), *Sa = malloc(2 * (size_t)n), *Sr = malloc(2 * (size_t)n);
        float *Sf = malloc(sizeof(float) * n), *Sg = malloc(sizeof(float) * n);
        float *q = malloc(sizeof(float) * dk), *k = malloc(sizeof(float) * dk), *v = malloc(sizeof(float) * dv);
        float *o0 = malloc(sizeof(float) * dv), *o1 = malloc(sizeof(float) * dv), *o2 = malloc(sizeof(float) * dv);
        fill(Sf, n, 0.1f);
        quantize_row(GGML_BF16, Sf, S, n);
        double worst_o = 0.0;
        long off = 0, far = 0, total = 0;
        int inexact = 0;
        for (int t = 0; t < steps; t++) {
            fill(q, dk, 1.0f);
            fill(k, dk, 1.0f);
            fill(v, dv, 1.0f);
            l2norm(q, dk, 1e-6f);
            l2norm(k, dk, 1e-6f);
            float beta = 0.5f + 0.5f * frand(), g = -0.5f + 0.45f * frand();
            dequant_row(GGML_BF16, S, Sf, n);                  /* the reference, from S */
            dnet_recurrent_head(1, dk, dv, q, dk, k, dk, v, dv, &beta, &g, Sf, o0, dv);
            quantize_row(GGML_BF16, Sf, Sr, n);
            dequant_row(GGML_BF16, S, Sg, n);                  /* the AVX2 step's contract */
            avx2_dnet_step(dk, dv, q, k, v, beta, g, Sg, o2, true);
            memcpy(Sa, S, 2 * (size_t)n);
            avx2_dnet_step_bf16(dk, dv, q, k, v, beta, g, Sa, o1);
            for (int i = 0; i < n; i++)
                inexact += Sa[i] != f32_to_bf16(Sg[i]);
            for (int j = 0; j < dv; j++)
                inexact += memcmp(&o1[j], &o2[j], 4) != 0;
            for (int kern = 0; kern < (simd_avx512() && dk % 16 == 0 && dv % 4 == 0 ? 2 : 1); kern++) {
                if (kern == 1) {
                    memcpy(Sa, S, 2 * (size_t)n);
                    avx512_dnet_step_bf16(dk, dv, q, k, v, beta, g, Sa, o1);
                }
                for (int j = 0; j < dv; j++)
                    worst_o = fmax(worst_o, fabs((double)o0[j] - o1[j]));
                for (int i = 0; i < n; i++) {
                    const int d = abs((int)(int16_t)Sa[i] - (int)(int16_t)Sr[i]);
                    off += d == 1;
                    far += d > 1;
                }
                total += n;
            }
            memcpy(S, Sr, 2 * (size_t)n);                      /* next step from the reference's state */
        }
        free(S); free(Sa); free(Sr); free(Sf); free(Sg); free(q); free(k); free(v); free(o0); free(o1); free(o2);
        CHECK_MSG(inexact == 0, "d_k %d d_v %d: the AVX2 bf16 step differs from widen + step + round in %d places",
                  dk, dv, inexact);
        /* o: as the f32 step's test (|S|, |o| = O(1)); S: a reordered sum moves a value by ~1e-6
         * relative, so it lands on the other side of a bf16 rounding boundary (spaced 2^-8
         * relative) for ~1e-6 / 2^-8 ~ 3e-4 of the values at most */
        CHECK_MSG(worst_o < 1e-4, "d_k %d d_v %d: o differs by %.3g", dk, dv, worst_o);
        CHECK_MSG(far == 0 && off <= total / 1000 + 1, "d_k %d d_v %d: %ld of %ld stored values one bf16 step off, "
                  "%ld further", dk, dv, off, total, far);
    }
}

/* one weight matrix in memory, every matmul regime against per-row dot_row;
 * decode: as a decode step (matmul's decode) */
static void check_matmul_as(uint32_t type, int n_in, int n_out, int n_tok, bool decode, int *failed)
{
    const size_t rb = row_bytes(type, n_in);
    float *wf = malloc(sizeof(float) * (size_t)n_in * n_out);
    float *X = malloc(sizeof(float) * (size_t)n_in * n_tok), *Y = malloc(sizeof(float) * (size_t)n_out * n_tok);
    char *data = malloc(rb * (size_t)n_out);
    float *scratch = malloc(sizeof(float) * 64 * (size_t)n_in * 4 + 64);
    fill(wf, n_in * n_out, 0.3f);
    fill(X, n_in * n_tok, 1.0f);
    for (int o = 0; o < n_out; o++)
        quantize_row(type, wf + (size_t)o * n_in, data + (size_t)o * rb, n_in);
    weight W = { .data = data, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb };
    matmul(Y, &W, X, n_tok, decode, scratch);
    for (int t = 0; t < n_tok && !*failed; t++)
        for (int o = 0; o < n_out; o++) {
            const char *row = data + (size_t)o * rb;
            const float *x = X + (size_t)t * n_in;
            double ref = dot_row(type, row, x, n_in), got = Y[(size_t)t * n_out + o];
            double terms = abs_terms(type, row, x, n_in);
            double tol = 2.0 * gamma_n(n_in + n_in / 32 + 8) * terms + 1e-30;
            if (quant_int8_act(type) &&
                (((n_tok == 1 || decode) && simd_avx2()) || (!decode && matmul_int8_prompt(type, n_tok)))) {
                /* int8 activations (one token, decode steps, and prompts where
                 * int8 prompts are on: matmul.h): the quantization bound of quant.h (blocks of 32 for
                 * Q8_0 and Q4_0, of 256 for the K-quants), and the rounding of the
                 * scaled int sums (a K-quant's scale parts can exceed |w|: twice) */
                int8_t q[4096];
                float d[128], wd[4096];
                int16_t bs[256];
                const int ab = quant_act_block(type);
                if (ab == 32)
                    quantize_act_q8_ref(x, n_in, q, d);
                else
                    quantize_act_q8k_ref(x, n_in, q, d, bs);
                dequant_row(type, row, wd, n_in);
                for (int i = 0; i < n_in; i++)
                    tol += fabs((double)wd[i]) * d[i / ab] / 2.0;
                tol *= ab == 32 ? 1.0 : 2.0;
            }
            if (!(fabs(got - ref) <= tol)) {
                test_fail(__FILE__, __LINE__, "type %u %dx%d tokens %d: Y[%d][%d] = %.9g, reference %.9g (tol %.3g)",
                          type, n_out, n_in, n_tok, t, o, got, ref, tol);
                *failed = 1;
                break;
            }
        }
    free(wf); free(X); free(Y); free(data); free(scratch);
}

static void check_matmul(uint32_t type, int n_in, int n_out, int n_tok, int *failed)
{
    check_matmul_as(type, n_in, n_out, n_tok, false, failed);
}

TEST(test_kernel_matmul_regimes_match_per_row_reference_dots)
{
    static const uint32_t types[] = { GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_K };
    static const int toks[] = { 1, 2, 3, 5, 16, 17, 40 };   /* decode, small batches, tiles/sgemm */
    int failed = 0;
    rng_state = 7;
    blas_set_threads(2);
    for (int pass = 0; pass < 2 && !failed; pass++) {
        /* pass 1 runs the scalar route, as on a CPU without AVX2 */
        bool was = simd_avx2();
        if (pass)
            simd_set_enabled(false);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0] && !failed; ti++)
            for (size_t k = 0; k < sizeof toks / sizeof toks[0] && !failed; k++) {
                check_matmul(types[ti], 256, 70, toks[k], &failed);      /* 70: a partial group of 4 */
                if (types[ti] != GGML_Q4_K)
                    check_matmul(types[ti], 1024, 300, toks[k], &failed);  /* parallel rows */
            }
        simd_set_enabled(was);
    }
    CHECK(!failed);
}

/* matmul_prompt_describe writes only the caller's buffer. The ready line
 * and concurrent /info requests call it from different threads; the
 * former matmul_f32_prompt_name() and matmul_f16_prompt_name() formatted
 * into one static buffer each (a data race), so a second call changed the
 * string a first caller still held, which this test's first check sees.
 * Also: the phrases name the limit set; a short buffer gets a terminated
 * prefix; len 0 writes nothing; BF16 names its path, other types the int8
 * phrase. */
TEST(test_kernel_prompt_descriptions_fill_the_callers_buffer)
{
    static const uint32_t types[] = { GGML_F32, GGML_F16 };
    static const int lims[] = { 40, 72 };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char got[2][MATMUL_PROMPT_NAME_LEN], want[2][MATMUL_PROMPT_NAME_LEN];
        for (int i = 0; i < 2; i++) {
            /* F32 without AVX-512 takes the AVX2 tile to small_max */
            const bool rows = types[t] == GGML_F32 && simd_avx512();
            if (types[t] == GGML_F16)
                matmul_set_f16_outer_max(lims[i]);
            else if (rows)
                matmul_set_f32_tile_max(lims[i]);
            else
                matmul_set_small_max(lims[i]);
            matmul_prompt_describe(types[t], got[i], sizeof got[i]);
            snprintf(want[i], sizeof want[i], "%s to %d tokens, sgemm past it",
                     types[t] == GGML_F16 ? "outer-product tile" : rows ? "rows x tokens tile" : "tile", lims[i]);
        }
        matmul_set_small_max(16);
        matmul_set_f16_outer_max(-1);
        matmul_set_f32_tile_max(-1);
        CHECK_MSG(!strcmp(got[0], want[0]), "type %u: first %s, want %s", types[t], got[0], want[0]);
        CHECK_MSG(!strcmp(got[1], want[1]), "type %u: second %s, want %s", types[t], got[1], want[1]);
        char cut[8];
        memset(cut, 'x', sizeof cut);
        matmul_prompt_describe(types[t], cut, sizeof cut);
        CHECK(cut[7] == '\0' && !strncmp(cut, want[0], 7));
        memset(cut, 'x', sizeof cut);
        matmul_prompt_describe(types[t], cut, 0);
        CHECK(cut[0] == 'x');
    }
    matmul_set_f16_outer_max(INT_MAX);
    char name[MATMUL_PROMPT_NAME_LEN], int8[MATMUL_PROMPT_NAME_LEN];
    matmul_prompt_describe(GGML_F16, name, sizeof name);
    CHECK_MSG(!strcmp(name, "outer-product tile"), "%s", name);
    matmul_set_f16_outer_max(-1);
    matmul_prompt_describe(GGML_BF16, name, sizeof name);
    CHECK_MSG(!strncmp(name, "exact", 5) || !strncmp(name, "vdpbf16ps", 9) || !strncmp(name, "bf16-rounded", 12),
              "%s", name);
    matmul_prompt_describe(GGML_Q8_0, name, sizeof name);
    matmul_int8_prompt_describe(int8, sizeof int8);
    CHECK_MSG(!strcmp(name, int8), "%s / %s", name, int8);
}

/* F32 prompts through matmul at the tile's default limit and with it
 * forced each way (every length on the tile; sgemm past small_max): within
 * the rounding bound of the per-row reference dots from 17 tokens (where
 * sgemm took over before) to past the limit. With AVX-512, up to the limit
 * the outputs are the bits of the rows x tokens tile called directly on
 * the whole matrix (the tile ran; its per-output sums do not depend on the
 * row split), which the reference dots alone could not tell from sgemm. */
TEST(test_kernel_f32_prompts_take_the_tile_to_its_limit)
{
    enum { N_IN = 1024, N_OUT = 300 };
    static const int toks[] = { 17, 32, 65, MATMUL_F32_TILE_MAX, MATMUL_F32_TILE_MAX + 1 };
    static const int modes[] = { -1, INT_MAX, 0 };
    int failed = 0;
    rng_state = 41;
    blas_set_threads(2);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0] && !failed; m++) {
        matmul_set_f32_tile_max(modes[m]);
        const int lim = matmul_f32_tile_max();
        if (modes[m] >= 0 || !getenv("HYSERVE_F32_PROMPT"))     /* the default, unless the environment sets it */
            CHECK(lim == (modes[m] < 0 ? MATMUL_F32_TILE_MAX : modes[m] == 0 ? 16 : INT_MAX));
        char name[MATMUL_PROMPT_NAME_LEN];
        matmul_prompt_describe(GGML_F32, name, sizeof name);
        if (simd_avx512())
            CHECK_MSG(!strncmp(name, "rows x tokens tile", 18), "%s", name);
        for (size_t k = 0; k < sizeof toks / sizeof toks[0] && !failed; k++)
            check_matmul(GGML_F32, N_IN, N_OUT, toks[k], &failed);
    }
    matmul_set_f32_tile_max(-1);
    if (!simd_avx512()) {
        printf("    skipped the bit check: no AVX-512 (F32 prompts take the AVX2 tile to 16 tokens)\n");
        CHECK(!failed);
        return;
    }
    const int tmax = MATMUL_F32_TILE_MAX + 1;
    float *W = malloc(sizeof(float) * N_IN * N_OUT), *X = malloc(sizeof(float) * N_IN * (size_t)tmax);
    float *Y = malloc(sizeof(float) * N_OUT * (size_t)tmax), *Yd = malloc(sizeof(float) * N_OUT * (size_t)tmax);
    float *scratch = malloc(sizeof(float) * 64 * N_IN * 4 + 64);
    CHECK(W && X && Y && Yd && scratch);
    if (W && X && Y && Yd && scratch) {
        fill(W, N_IN * N_OUT, 0.3f);
        fill(X, N_IN * tmax, 1.0f);
        const weight w = { .data = W, .type = GGML_F32, .n_in = N_IN, .n_out = N_OUT, .row_bytes = 4 * N_IN };
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            const int n = toks[k];
            if (n > matmul_f32_tile_max())
                continue;
            matmul(Y, &w, X, n, false, scratch);
            avx512_rows_x_tokens(W, N_IN, N_OUT, X, N_IN, n, N_IN, Yd, N_OUT);
            CHECK_MSG(!memcmp(Y, Yd, sizeof(float) * N_OUT * (size_t)n), "%d tokens: not the tile's bits", n);
        }
    }
    free(W); free(X); free(Y); free(Yd); free(scratch);
    CHECK(!failed);
}

/* Decode steps off AMX (as on a CPU without it): every type and count
 * takes the rows x tokens tile, the VNNI kernel (Q8_0) or, for F32 past
 * matmul_f32_tile_max() tokens, sgemm; against per-row reference dots. 64 and 65 tokens: the
 * tile's token groups of 32 and a remainder; Q8_0's chunks of 64. */
TEST(test_kernel_decode_steps_of_any_size_match_per_row_reference_dots)
{
    static const uint32_t types[] = { GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0 };
    static const int toks[] = { 2, 16, 17, 40, 64, 65 };
    int failed = 0;
    rng_state = 29;
    blas_set_threads(2);
    const bool amx = simd_amx();
    simd_set_amx(false);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0] && !failed; ti++)
        for (size_t k = 0; k < sizeof toks / sizeof toks[0] && !failed; k++) {
            check_matmul_as(types[ti], 256, 70, toks[k], true, &failed);
            check_matmul_as(types[ti], 1024, 300, toks[k], true, &failed);
        }
    simd_set_amx(amx);
    CHECK(!failed);
}

/* matmul_many against one matmul() per weight, on the kernels it shares
 * (one token; a decode step on AMX, 5 and 16 tokens, with 16-row tiles and
 * tails) and the ones it leaves alone (3 tokens of a prompt; Q4_K). Each
 * row is computed by the same kernel on the same prepared activations
 * either way, only the thread that takes it changes, so the results are
 * equal bit for bit; for one token too, as the matvec's groups of 4 rows
 * start at each weight's row 0 (share.h). A sentinel after each Y must
 * survive. */
static int check_many(uint32_t type, int n_tok, bool decode)
{
    enum { N = 4, NIN = 256 };
    static const int n_out[N] = { 256, 16, 70, 300 };   /* tails in the later two */
    const size_t rb = row_bytes(type, NIN);
    float *X = malloc(sizeof(float) * NIN * n_tok), *wf = malloc(sizeof(float) * NIN);
    float *scratch = malloc(sizeof(float) * 64 * (size_t)NIN * 4 + 64);
    char *data[N];
    float *Y[N], *R[N];
    weight W[N];
    const weight *Wp[N];
    fill(X, NIN * n_tok, 1.0f);
    for (int i = 0; i < N; i++) {
        data[i] = malloc(rb * (size_t)n_out[i]);
        for (int o = 0; o < n_out[i]; o++) {
            fill(wf, NIN, 0.3f);
            quantize_row(type, wf, data[i] + (size_t)o * rb, NIN);
        }
        W[i] = (weight){ .data = data[i], .type = type, .n_in = NIN, .n_out = n_out[i], .row_bytes = rb };
        Wp[i] = &W[i];
        Y[i] = malloc(sizeof(float) * ((size_t)n_out[i] * n_tok + 1));
        R[i] = malloc(sizeof(float) * (size_t)n_out[i] * n_tok);
        Y[i][(size_t)n_out[i] * n_tok] = -777.0f;
    }
    for (int i = 0; i < N; i++)
        matmul(R[i], &W[i], X, n_tok, decode, scratch);
    matmul_many(N, Y, Wp, X, n_tok, decode, scratch);
    int bad = 0;
    for (int i = 0; i < N && !bad; i++) {
        if (Y[i][(size_t)n_out[i] * n_tok] != -777.0f) {
            test_fail(__FILE__, __LINE__, "type %u tokens %d: wrote past weight %d's output", type, n_tok, i);
            bad = 1;
        }
        for (long j = 0; j < (long)n_out[i] * n_tok && !bad; j++) {
            if (memcmp(&Y[i][j], &R[i][j], sizeof(float))) {
                test_fail(__FILE__, __LINE__, "type %u tokens %d%s: weight %d, Y[%ld][%ld] = %.9g, alone %.9g", type,
                          n_tok, decode ? " (decode)" : "", i, j / n_out[i], j % n_out[i], Y[i][j], R[i][j]);
                bad = 1;
            }
        }
    }
    for (int i = 0; i < N; i++) {
        free(data[i]);
        free(Y[i]);
        free(R[i]);
    }
    free(X); free(wf); free(scratch);
    return bad;
}

/* Q8_0 decode steps against one-token products, token by token, on
 * whichever route this CPU (and HYSERVE_SIMD) gives: the VNNI kernel, AMX
 * from 5 tokens, or the AVX2 per-row dots. All keep the one-token path's
 * int8 activations, so they differ from it only in float order (a step
 * on f32 activations, as every step off AMX once took, fails here);
 * within four times the rounding bound of sum |w x| (the activations'
 * quantization moves |x| by at most half a step). 300 rows: shares and
 * far-apart blocks with rows left over. */
TEST(test_kernel_q8_0_decode_steps_equal_one_token_each)
{
    enum { NIN = 1024, NOUT = 300, TMAX = 65 };
    /* every route a step can take: VNNI (2-4), AMX or VNNI or AVX2 (5+),
     * past one chunk of 64 tokens */
    static const int counts[] = { 2, 3, 4, 5, 6, 8, 16, 17, 65 };
    const size_t rb = row_bytes(GGML_Q8_0, NIN);
    char *data = malloc(rb * NOUT);
    float *wf = malloc(sizeof(float) * NIN), *X = malloc(sizeof(float) * NIN * TMAX);
    float *Y = malloc(sizeof(float) * NOUT * TMAX), *R = malloc(sizeof(float) * NOUT);
    float *scratch = malloc(sizeof(float) * 64 * (size_t)NIN * 4 + 64);
    CHECK(data && wf && X && Y && R && scratch);
    rng_state = 23;
    blas_set_threads(2);
    for (int o = 0; o < NOUT; o++) {
        fill(wf, NIN, 0.3f);
        quantize_row(GGML_Q8_0, wf, data + (size_t)o * rb, NIN);
    }
    weight W = { .data = data, .type = GGML_Q8_0, .n_in = NIN, .n_out = NOUT, .row_bytes = rb };
    fill(X, NIN * TMAX, 1.0f);
    int bad = 0;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0] && !bad; ci++) {
        const int n_tok = counts[ci];
        matmul(Y, &W, X, n_tok, true, scratch);
        for (int t = 0; t < n_tok && !bad; t++) {
            matmul(R, &W, X + (size_t)t * NIN, 1, true, scratch);
            for (int o = 0; o < NOUT && !bad; o++) {
                const double tol = 4.0 * gamma_n(NIN + NIN / 32 + 8) *
                                   abs_terms(GGML_Q8_0, data + (size_t)o * rb, X + (size_t)t * NIN, NIN);
                if (!(fabs((double)Y[(size_t)t * NOUT + o] - R[o]) <= tol)) {
                    test_fail(__FILE__, __LINE__, "tokens %d: Y[%d][%d] = %.9g, one token %.9g (tol %.3g)", n_tok, t,
                              o, Y[(size_t)t * NOUT + o], R[o], tol);
                    bad = 1;
                }
            }
        }
    }
    CHECK(!bad);
    free(data); free(wf); free(X); free(Y); free(R); free(scratch);
}

TEST(test_kernel_matmul_many_equals_one_matmul_per_weight)
{
    static const uint32_t types[] = { GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_K };
    rng_state = 17;
    blas_set_threads(2);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        CHECK(!check_many(types[ti], 1, true));
        CHECK(!check_many(types[ti], 1, false));
        CHECK(!check_many(types[ti], 5, true));
        CHECK(!check_many(types[ti], 16, true));
        CHECK(!check_many(types[ti], 3, false));
    }
}

/* One share.h region of `team` threads (its shares made for `nt`): each
 * unit claimed counts into seen[]; thread 0 naps 1 ms per chunk (a slow
 * core); done[t]: units thread t claimed */
static void share_region(share *sh, int team, _Atomic int *seen, long *done)
{
    #pragma omp parallel num_threads(team)
    {
        const int it = omp_get_thread_num();
        long a, b, mine = 0;
        while (share_take(sh, it, &a, &b)) {
            for (long u = a; u < b; u++)
                atomic_fetch_add_explicit(&seen[u], 1, memory_order_relaxed);
            mine += b - a;
            if (it == 0)
                nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
        }
        done[it] = mine;
    }
}

/* share.h's split: every unit claimed exactly once, whoever takes it;
 * stealing moves a slow thread's units to the others (thread 0 naps 1 ms
 * per chunk: without steals it would claim its 1/4 share of 3000 units in
 * 71 chunks, ~71 ms, while the others finish theirs in microseconds);
 * the fixed split gives each thread exactly its share; and fixed shares of
 * threads a region lacks are still taken. */
TEST(test_kernel_share_claims_every_unit_once_and_the_idle_steal)
{
    enum { TOTAL = 3000, MIN = 7, NT = 4 };
    _Atomic int *seen = malloc(sizeof *seen * TOTAL);
    long done[NT];
    CHECK(seen);
    if (!seen)
        return;
    for (int mode = 0; mode < 3; mode++) {      /* stealing, fixed, fixed with 2 of 4 threads */
        const int team = mode == 2 ? 2 : NT;
        for (int u = 0; u < TOTAL; u++)
            atomic_init(&seen[u], 0);
        for (int t = 0; t < NT; t++)
            done[t] = -1;
        share_set_fixed(mode > 0);
        share sh;
        share_init(&sh, TOTAL, MIN, NT);
        share_region(&sh, team, seen, done);
        share_set_fixed(false);
        int wrong = 0;
        for (int u = 0; u < TOTAL; u++)
            wrong += atomic_load(&seen[u]) != 1;
        CHECK_MSG(wrong == 0, "mode %d: %d of %d units not claimed exactly once", mode, wrong, TOTAL);
        long sum = 0;
        for (int t = 0; t < team; t++)
            sum += done[t];
        CHECK_MSG(sum == TOTAL, "mode %d: the threads claimed %ld units of %d", mode, sum, TOTAL);
        if (mode == 0)
            CHECK_MSG(done[0] < TOTAL / NT, "stealing: the slow thread still claimed %ld units, its whole share is %d",
                      done[0], TOTAL / NT);
        if (mode == 1)
            for (int t = 0; t < NT; t++)
                CHECK_MSG(done[t] == TOTAL / NT, "fixed: thread %d claimed %ld units, not its share %d", t, done[t],
                          TOTAL / NT);
    }
    free(seen);
}

/* Decode products of one weight group under split split (0: 1 thread;
 * 1: 2 threads, one fixed share each; 2: 2 threads that steal) into Y */
static void split_run(int split, int n, float *const *Y, const weight *const *W, const float *X, int n_tok,
                      float *scratch)
{
    blas_set_threads(split ? 2 : 1);
    share_set_fixed(split == 1);
    matmul_many(n, Y, W, X, n_tok, true, scratch);
    share_set_fixed(false);
    blas_set_threads(2);
}

/* The bits of every decode product do not depend on how its rows are
 * split between threads: one thread, two with fixed equal shares, and two
 * that steal from each other (share.h), five times over (where the
 * steals fall moves with the timing). Three weights per group, rows not a
 * multiple of 4 (the matvec's groups) nor of 32 (pairs of panels), so
 * that shares and chunks end inside them. One token and a decode step of
 * 3, for F32, F16, BF16 and Q8_0 as stored (the matvec; the AVX-512 rows
 * x tokens tiles and Q8_0's VNNI steps), the K-quants and Q4_0 on int8
 * activations, and BF16, F16 and Q8_0 packed in panels (the AVX-512
 * outer-product kernels, or the portable loop). Before
 * share.h, the fixed shares cut the matvec's groups of 4 rows where the
 * thread count put them, so a row took the 4-row kernel on one thread and
 * the 1-row kernel (another order of its sum) on two. */
TEST(test_kernel_decode_products_give_the_same_bits_at_any_split)
{
    enum { N = 3, NIN = 1024, TOK = 3 };
    static const struct { uint32_t type; bool panels; } cases[] = {
        { GGML_F32, false }, { GGML_F16, false }, { GGML_BF16, false }, { GGML_Q8_0, false },
        { GGML_Q4_K, false }, { GGML_Q6_K, false }, { GGML_Q4_0, false },
        { GGML_BF16, true }, { GGML_F16, true }, { GGML_Q8_0, true },
    };
    const int rows_plain[N] = { 70, 301, 1030 }, rows_pan[N] = { 48, 304, 1040 };
    float *X = malloc(sizeof(float) * NIN * TOK), *wf = malloc(sizeof(float) * NIN);
    float *scratch = malloc(sizeof(float) * (64 * (size_t)NIN * 4 + 64));
    CHECK(X && wf && scratch);
    if (!X || !wf || !scratch)
        goto out;
    rng_state = 41;
    fill(X, NIN * TOK, 1.0f);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint32_t type = cases[c].type;
        const bool pan = cases[c].panels;
        const int *n_out = pan ? rows_pan : rows_plain;
        const size_t rb = row_bytes(type, NIN);
        char *data[N] = { 0 };
        float *Y[3][N] = { { 0 } };
        weight W[N];
        const weight *Wp[N];
        bool ok = true;
        for (int i = 0; i < N; i++) {
            const size_t bytes = (rb * (size_t)n_out[i] + 63) / 64 * 64;
            char *rows = malloc(bytes);
            data[i] = pan ? aligned_alloc(64, bytes) : rows;
            for (int v = 0; v < 3; v++)
                ok &= (Y[v][i] = malloc(sizeof(float) * (size_t)n_out[i] * TOK)) != NULL;
            ok &= rows && data[i];
            if (!ok) {
                if (pan)
                    free(rows);
                break;
            }
            for (int o = 0; o < n_out[i]; o++) {
                fill(wf, NIN, 0.3f);
                quantize_row(type, wf, rows + (size_t)o * rb, NIN);
            }
            if (pan) {
                panels_pack(rows, type, NIN, n_out[i], data[i]);
                free(rows);
            }
            W[i] = (weight){ .data = data[i], .type = type, .n_in = NIN, .n_out = n_out[i], .row_bytes = rb,
                             .panels = pan };
            Wp[i] = &W[i];
        }
        CHECK(ok);
        for (int n_tok = 1; ok && n_tok <= TOK; n_tok += TOK - 1)
            for (int rep = 0; rep < 5 && ok; rep++) {
                for (int v = 0; v < 3; v++)
                    split_run(v, N, Y[v], Wp, X, n_tok, scratch);
                for (int i = 0; i < N && ok; i++)
                    for (int v = 1; v < 3 && ok; v++)
                        if (memcmp(Y[0][i], Y[v][i], sizeof(float) * (size_t)n_out[i] * n_tok)) {
                            test_fail(__FILE__, __LINE__, "type %u%s, %d token(s), weight %d: the %s split gives "
                                      "other bits than one thread", type, pan ? " (panels)" : "", n_tok, i,
                                      v == 1 ? "fixed" : "stealing");
                            ok = false;
                        }
            }
        for (int i = 0; i < N; i++) {
            free(data[i]);
            for (int v = 0; v < 3; v++)
                free(Y[v][i]);
        }
    }
out:
    free(X); free(wf); free(scratch);
}

/* ---- attention ----------------------------------------------------- */

TEST(test_kernel_vector_exp_is_within_4e7_of_expf)
{
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++)
        x[i] = -90.0f * (float)i / (N - 1);          /* 0 .. -90, past the cutoff */
    x[7] = -INFINITY;
    attn_exp_block(x, y, N);
    double worst = 0.0;
    int bad_zero = 0;
    for (int i = 0; i < N; i++) {
        if (x[i] < -87.0f) {
            bad_zero |= y[i] != 0.0f;                /* documented: exactly 0 below -87 */
            continue;
        }
        double e = exp((double)x[i]);
        worst = fmax(worst, fabs(y[i] - e) / e);
    }
    free(x);
    free(y);
    CHECK_MSG(!bad_zero, "exp of x < -87 (or -inf) is not exactly 0");
    /* 4e-7 = a few float ulps: Taylor truncation 5.3e-9 plus Horner and
     * 2^n scaling roundings */
    CHECK_MSG(worst < 4e-7, "max relative error %.3g", worst);
}

/* silu and sigmoid gates against their definitions in double precision:
 * the vector exp's 4e-7 plus a division and a product stay under 1e-6
 * relative (|silu(x)| is tiny for very negative x: there the bound is
 * absolute, 1e-30). Tails (n not a multiple of 8), b == NULL and y
 * aliasing b, as the callers use it. */
TEST(test_kernel_silu_and_sigmoid_gates_match_their_definitions)
{
    enum { N = 1003 };
    float *x = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    float *g = malloc(sizeof(float) * N);
    rng_state = 99;
    for (int i = 0; i < N; i++) {
        x[i] = -100.0f + 200.0f * (float)i / (N - 1);   /* both saturated ends */
        b[i] = frand() * 3.0f;
        g[i] = frand() * 20.0f;
    }
    double worst_silu = 0.0, worst_sig = 0.0;
    for (int pass = 0; pass < 2; pass++) {
        const bool with_b = pass == 1;
        if (with_b) {                                   /* y aliases b: o = silu(z) * o */
            memcpy(y, b, sizeof(float) * N);
            vec_silu_mul(y, x, y, N);
        } else {
            vec_silu_mul(y, x, NULL, N);
        }
        for (int i = 0; i < N; i++) {
            double e = (double)x[i] / (1.0 + exp(-(double)x[i])) * (with_b ? b[i] : 1.0);
            double err = fabs(y[i] - e) / fmax(fabs(e), 1e-30);
            worst_silu = fmax(worst_silu, fabs(e) < 1e-30 ? fabs(y[i] - e) : err);
        }
    }
    memcpy(y, b, sizeof(float) * N);
    vec_sigmoid_mul(y, g, N);
    for (int i = 0; i < N; i++) {
        double e = b[i] / (1.0 + exp(-(double)g[i]));
        worst_sig = fmax(worst_sig, fabs(y[i] - e) / fmax(fabs(e), 1e-30));
    }
    free(x);
    free(b);
    free(y);
    free(g);
    CHECK_MSG(worst_silu < 1e-6, "silu: max relative error %.3g", worst_silu);
    CHECK_MSG(worst_sig < 1e-6, "sigmoid: max relative error %.3g", worst_sig);
}

/* A cache with one sequence of n_tok tokens of random K/V in one layer. */
typedef struct attn_fixture {
    cache c;
    int seq;
    int n_head, n_kv, hd;
} attn_fixture;

static int attn_fixture_init(attn_fixture *f, uint32_t kv_type, int n_head, int n_kv, int hd, int n_tok,
                             int page_tokens)
{
    cache_layout l = { .n_layers = 2, .n_attn = 2, .n_kv = n_kv, .head_dim = hd, .n_head = n_head,
                       .kv_type = kv_type, .page_tokens = page_tokens, .n_ctx = 1024, .max_seqs = 1 };
    if (cache_init(&f->c, &l) != 0)
        return -1;
    f->seq = cache_seq_new(&f->c);
    if (f->seq < 0 || cache_reserve(&f->c, f->seq, n_tok) != 0)
        return -1;
    f->n_head = n_head;
    f->n_kv = n_kv;
    f->hd = hd;
    float *row = malloc(sizeof(float) * (size_t)hd);
    const cache_seq *s = cache_get(&f->c, f->seq);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_kv; h++)
            for (int kv = 0; kv < 2; kv++) {
                fill(row, hd, kv ? 1.0f : 2.0f);
                cache_store(&f->c, cache_kv(&f->c, s, 1, kv, h, t), row, hd);
            }
    free(row);
    return 0;
}

/* |fast - ref| per output element, against the bound: every score is a
 * d-term dot product (two orders: 2 gamma(d) sum |q k| scale), the exp
 * differs by < 4e-7 relative, so each softmax weight moves by at most
 * ~2 (score error + 4e-7) relative and the output, a convex combination
 * of V rows, by that times max |v|; times 4 for margin. */
static void check_attn(uint32_t kv_type, int n_head, int n_kv, int hd, int n, int pos0, int page_tokens,
                       int tiled_min, int *failed)
{
    attn_fixture f;
    if (attn_fixture_init(&f, kv_type, n_head, n_kv, hd, pos0 + n, page_tokens) != 0) {
        test_fail(__FILE__, __LINE__, "fixture");
        *failed = 1;
        return;
    }
    const int q_head = 2 * hd, q_stride = n_head * q_head, o_stride = n_head * hd;
    float *Q = malloc(sizeof(float) * (size_t)n * q_stride);
    float *o_ref = malloc(sizeof(float) * (size_t)n * o_stride), *o_fast = malloc(sizeof(float) * (size_t)n * o_stride);
    float *scores = malloc(sizeof(float) * (size_t)(pos0 + n + hd));
    const int G = n_head / n_kv;
    float *scratch = malloc(sizeof(float) * 2 * (size_t)attn_scratch_floats(hd, G, page_tokens));
    fill(Q, n * q_stride, 1.0f);
    attn_args a = { .kv = cache_kv_pages(&f.c, cache_get(&f.c, f.seq), 1), .n_head = n_head, .n_kv = n_kv,
                    .head_dim = hd, .Q = Q, .q_stride = q_stride, .q_head = q_head, .out = o_ref,
                    .out_stride = o_stride, .n = n, .pos0 = pos0, .scale = 1.0f / sqrtf((float)hd) };
    attn_gqa_ref(&a, scores);
    a.out = o_fast;
    attn_set_tiled_min_rows(tiled_min);
    attn_gqa(&a, scratch);
    attn_set_tiled_min_rows(16);
    /* bound inputs: |q| <= 1, |k| <= 2, |v| <= 1 (bf16/f16 only shrink the range a little) */
    const double score_err = 2.0 * gamma_n(hd) * hd * 2.0 * a.scale;
    const double tol = 4.0 * 2.0 * (score_err + 4e-7) + 1e-6;
    for (int t = 0; t < n && !*failed; t++)
        for (int i = 0; i < o_stride; i++) {
            double r = o_ref[(size_t)t * o_stride + i], g = o_fast[(size_t)t * o_stride + i];
            if (!(fabs(r - g) <= tol)) {
                test_fail(__FILE__, __LINE__,
                          "kv type %u heads %d/%d hd %d n %d pos0 %d page %d tiled from %d: row %d [%d] %.9g vs ref %.9g",
                          kv_type, n_head, n_kv, hd, n, pos0, page_tokens, tiled_min, t, i, g, r);
                *failed = 1;
                break;
            }
        }
    free(Q); free(o_ref); free(o_fast); free(scores); free(scratch);
    cache_deinit(&f.c);
}

TEST(test_kernel_gqa_decode_and_tiled_attention_match_the_reference)
{
    static const uint32_t kv_types[] = { GGML_F32, GGML_F16, GGML_BF16 };
    int failed = 0;
    rng_state = 8;
    blas_set_threads(2);
    for (int pass = 0; pass < 4 && !failed; pass++) {
        bool was = simd_avx2();
        if (pass == 1)
            attn_set_decode_pairs(false);           /* f32 pages one at a time */
        if (pass == 2)
            simd_set_enabled(false);                /* the non-AVX2 route */
        if (pass == 3)
            simd_set_avx512(false);                 /* the AVX2 pair kernels where pass 0 took AVX-512 */
        for (size_t ki = 0; ki < 3 && !failed; ki++) {
            const uint32_t kt = kv_types[ki];
            /* decode (one row, a few rows) and tiled (1 = always), ragged
             * blocks and pages, Qwen3.5's 8/2 x 256, MHA, odd groups */
            check_attn(kt, 8, 2, 256, 1, 0, 16, 1 << 30, &failed);
            check_attn(kt, 8, 2, 256, 1, 300, 16, 1 << 30, &failed);
            check_attn(kt, 8, 2, 256, 3, 77, 16, 1 << 30, &failed);
            /* decode pairs pages (k, k + half) of a block: the second may
             * be the partial last page (52 keys: 3 full + 4), odd page
             * counts leave one page alone, long contexts many blocks */
            check_attn(kt, 8, 2, 256, 1, 51, 16, 1 << 30, &failed);
            check_attn(kt, 8, 2, 64, 2, 1021, 16, 1 << 30, &failed);
            check_attn(kt, 6, 2, 64, 1, 1000, 7, 1 << 30, &failed);
            check_attn(kt, 2, 2, 64, 1, 300, 16, 1 << 30, &failed);   /* MHA: groups of one */
            check_attn(kt, 4, 2, 32, 2, 100, 16, 1 << 30, &failed);   /* groups of two */
            check_attn(kt, 8, 2, 256, 70, 0, 16, 1, &failed);
            check_attn(kt, 8, 2, 256, 37, 101, 16, 1, &failed);
            check_attn(kt, 4, 4, 64, 100, 5, 7, 1, &failed);
            check_attn(kt, 6, 2, 64, 5, 40, 7, 1 << 30, &failed);
            check_attn(kt, 6, 1, 24, 33, 20, 16, 1, &failed);   /* hd % 8 != 0 */
            check_attn(kt, 6, 1, 24, 2, 20, 16, 1 << 30, &failed);
            check_attn(kt, 20, 1, 32, 2, 30, 16, 1 << 30, &failed);  /* a group of 20 */
            check_attn(kt, 20, 1, 32, 19, 30, 16, 1, &failed);
        }
        simd_set_enabled(was);
        simd_set_avx512(true);
        attn_set_decode_pairs(true);
    }
    CHECK(!failed);
}

/* RMSNorm and the L2 norm against their definitions, on both routes:
 * rmsnorm y = x / sqrt(mean(x^2) + eps) * w, l2norm x / max(|x|, eps).
 * The sum of squares is accumulated in double on either route, so it is
 * within n 2^-53 of the exact sum (taken here in long double); one
 * rounding of the scale to float and two float products then leave each
 * output within 4 ulps (4 * 2^-24 relative) of the definition. The AVX2
 * scaling is the scalar's products in the same order, so the two routes
 * may differ only through the scale: at most one ulp of it. Lengths with
 * tails, in place (y aliasing x, as the DeltaNet gate and l2norm run), and
 * a vector of huge values whose squares overflow float but not double. */
TEST(test_kernel_norms_match_their_definitions_on_both_routes)
{
    const int lens[] = { 1, 5, 15, 16, 17, 128, 1000, 1024 };
    const bool was = simd_avx2();
    rng_state = 4242;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int len = lens[li];
        float *x = malloc(sizeof(float) * len), *w = malloc(sizeof(float) * len);
        float *y[2] = { malloc(sizeof(float) * len), malloc(sizeof(float) * len) };
        float *z[2] = { malloc(sizeof(float) * len), malloc(sizeof(float) * len) };
        for (int big = 0; big < 2; big++) {
            fill(x, len, big ? 3e30f : 2.0f);
            fill(w, len, 1.5f);
            long double ss = 0.0L;
            for (int i = 0; i < len; i++)
                ss += (long double)x[i] * x[i];
            const double eps = 1e-6;
            const double r_rms = 1.0 / sqrt((double)(ss / len) + eps), r_l2 = 1.0 / fmax(sqrt((double)ss), eps);
            for (int route = 0; route < 2; route++) {
                simd_set_enabled(route == 1);
                memcpy(y[route], x, sizeof(float) * len);
                rmsnorm(y[route], y[route], w, len, (float)eps);          /* in place */
                memcpy(z[route], x, sizeof(float) * len);
                l2norm(z[route], len, (float)eps);
                for (int i = 0; i < len; i++) {
                    double e = x[i] * r_rms * w[i], e2 = x[i] * r_l2;
                    CHECK(fabs(y[route][i] - e) <= 4 * 0x1p-24 * fabs(e) + 1e-37);
                    CHECK(fabs(z[route][i] - e2) <= 4 * 0x1p-24 * fabs(e2) + 1e-37);
                }
            }
            for (int i = 0; i < len; i++) {
                CHECK(fabs(y[1][i] - y[0][i]) <= 2 * 0x1p-24 * fabs(y[0][i]) + 1e-37);
                CHECK(fabs(z[1][i] - z[0][i]) <= 2 * 0x1p-24 * fabs(z[0][i]) + 1e-37);
            }
            if (was) {                  /* the kernels alone, against the same sums */
                double d = avx2_sumsq(x, len);
                CHECK(fabs(d - (double)ss) <= len * 0x1p-53 * (double)ss);
                avx2_scale(y[1], x, 0.37f, w, len);
                avx2_scale(z[1], x, 0.37f, NULL, len);
                for (int i = 0; i < len; i++) {
                    CHECK(y[1][i] == x[i] * 0.37f * w[i]);
                    CHECK(z[1][i] == x[i] * 0.37f);
                }
            }
        }
        free(x), free(w), free(y[0]), free(y[1]), free(z[0]), free(z[1]);
    }
    simd_set_enabled(was);
}

/* ---- the new recurrent kinds' kernels against the recurrences written out
 * in double (docs/models.md 10.1, 10.2, 10.4) ---- */

/* Mamba-2, one head: S = exp(dt A) S + (dt x) B^T; y = S C. Both forms from
 * a nonzero state over 150 rows (3 chunks of 64, the last partial). */
TEST(test_mamba2_forms_match_the_recurrence_in_double)
{
    enum { N = 150, HD = 8, DS = 16 };
    rng_state = 71;
    static float x[N * HD], B[N * DS], C[N * DS], dt[N], S0[HD * DS], S1[HD * DS], S2[HD * DS];
    static float y1[N * HD], y2[N * HD], sc[100000];
    static double Sd[HD * DS], yd[N * HD];
    fill(x, N * HD, 1.0f);
    fill(B, N * DS, 1.0f);
    fill(C, N * DS, 1.0f);
    fill(S0, HD * DS, 0.5f);
    for (int t = 0; t < N; t++)
        dt[t] = 0.05f + 0.1f * (frand() + 1.0f);
    const float A = -1.7f;
    CHECK(mamba2_chunk_scratch_floats(HD, DS) <= (long)(sizeof sc / sizeof sc[0]));
    for (int i = 0; i < HD * DS; i++)
        Sd[i] = S0[i];
    for (int t = 0; t < N; t++)
        for (int j = 0; j < HD; j++) {
            double acc = 0;
            for (int i = 0; i < DS; i++) {
                Sd[j * DS + i] = exp((double)dt[t] * A) * Sd[j * DS + i] + (double)dt[t] * x[t * HD + j] * B[t * DS + i];
                acc += Sd[j * DS + i] * C[t * DS + i];
            }
            yd[t * HD + j] = acc;
        }
    memcpy(S1, S0, sizeof S0);
    memcpy(S2, S0, sizeof S0);
    mamba2_recurrent_head(N, HD, DS, A, x, HD, dt, B, C, DS, S1, y1, HD);
    mamba2_chunked_head(N, HD, DS, A, x, HD, dt, B, C, DS, S2, y2, HD, sc);
    double e1 = 0, e2 = 0, es1 = 0, es2 = 0, my = 0, ms = 0;
    for (int i = 0; i < N * HD; i++) {
        e1 = fmax(e1, fabs(y1[i] - yd[i]));
        e2 = fmax(e2, fabs(y2[i] - yd[i]));
        my = fmax(my, fabs(yd[i]));
    }
    for (int i = 0; i < HD * DS; i++) {
        es1 = fmax(es1, fabs(S1[i] - Sd[i]));
        es2 = fmax(es2, fabs(S2[i] - Sd[i]));
        ms = fmax(ms, fabs(Sd[i]));
    }
    printf("    recurrent %.2e, chunked %.2e of max |y| %.2f; states %.2e, %.2e\n", e1 / my, e2 / my, my, es1 / ms,
           es2 / ms);
    CHECK(e1 <= 1e-5 * my && e2 <= 1e-5 * my && es1 <= 1e-5 * ms && es2 <= 1e-5 * ms);
}

/* Mamba-1 over channels [3, 11) of 16: S[c][i] = exp(dt_c A[c][i]) S[c][i] +
 * dt_c x_c B_i; y_c = S[c] . C, in two segments (a snapshot point). */
TEST(test_mamba1_scan_matches_the_recurrence_in_double)
{
    enum { N = 40, DI = 16, DS = 8, C0 = 3, C1 = 11 };
    rng_state = 72;
    static float x[N * DI], dt[N * DI], BC[N * 2 * DS], A[DI * DS], S[(C1 - C0) * DS], y[N * DI];
    static double Sd[DI * DS], yd[N * DI];
    fill(x, N * DI, 1.0f);
    fill(BC, N * 2 * DS, 1.0f);
    fill(S, (C1 - C0) * DS, 0.5f);
    for (int i = 0; i < N * DI; i++)
        dt[i] = 0.02f + 0.1f * (frand() + 1.0f);
    for (int i = 0; i < DI * DS; i++)
        A[i] = -0.2f - 2.0f * (frand() + 1.0f);
    for (int c = C0; c < C1; c++)
        for (int i = 0; i < DS; i++)
            Sd[c * DS + i] = S[(c - C0) * DS + i];
    for (int t = 0; t < N; t++)
        for (int c = C0; c < C1; c++) {
            double acc = 0, d = dt[t * DI + c];
            for (int i = 0; i < DS; i++) {
                Sd[c * DS + i] = exp(d * A[c * DS + i]) * Sd[c * DS + i] + d * x[t * DI + c] * BC[t * 2 * DS + i];
                acc += Sd[c * DS + i] * BC[t * 2 * DS + DS + i];
            }
            yd[t * DI + c] = acc;
        }
    mamba1_scan(0, 17, C0, C1, DS, A, x, DI, dt, DI, BC, 2 * DS, S, y, DI);
    mamba1_scan(17, N, C0, C1, DS, A, x, DI, dt, DI, BC, 2 * DS, S, y, DI);
    double e = 0, m = 0;
    for (int t = 0; t < N; t++)
        for (int c = C0; c < C1; c++) {
            e = fmax(e, fabs(y[t * DI + c] - yd[t * DI + c]));
            m = fmax(m, fabs(yd[t * DI + c]));
        }
    printf("    max error %.2e of max |y| %.2f\n", e / m, m);
    CHECK(e <= 1e-5 * m);
}

/* KDA, one head: S[j][i] *= exp(g_i); S[j] += k (beta (v_j - S[j] . k));
 * o_j = S[j] . q, with g different per key channel. */
TEST(test_kda_step_matches_the_recurrence_in_double)
{
    enum { N = 30, D = 16 };
    rng_state = 73;
    static float q[N * D], k[N * D], v[N * D], g[N * D], beta[N], S[D * D], o[N * D];
    static double Sd[D * D], od[N * D];
    fill(q, N * D, 0.25f);
    fill(k, N * D, 0.25f);
    fill(v, N * D, 1.0f);
    fill(S, D * D, 0.5f);
    for (int i = 0; i < N * D; i++)
        g[i] = -0.5f * (frand() + 1.0f);
    for (int t = 0; t < N; t++)
        beta[t] = 0.5f + 0.5f * frand();
    for (int i = 0; i < D * D; i++)
        Sd[i] = S[i];
    for (int t = 0; t < N; t++)
        for (int j = 0; j < D; j++) {
            double kv = 0, acc = 0;
            for (int i = 0; i < D; i++) {
                Sd[j * D + i] *= exp((double)g[t * D + i]);
                kv += Sd[j * D + i] * k[t * D + i];
            }
            const double dj = beta[t] * (v[t * D + j] - kv);
            for (int i = 0; i < D; i++) {
                Sd[j * D + i] += k[t * D + i] * dj;
                acc += Sd[j * D + i] * q[t * D + i];
            }
            od[t * D + j] = acc;
        }
    kda_recurrent_head(N, D, q, k, v, D, g, D, beta, 1, S, o, D);
    double e = 0, m = 0;
    for (int i = 0; i < N * D; i++) {
        e = fmax(e, fabs(o[i] - od[i]));
        m = fmax(m, fabs(od[i]));
    }
    printf("    max error %.2e of max |o| %.2f\n", e / m, m);
    CHECK(e <= 1e-5 * m);
}

/* The kernel table's KDA and Mamba-2 steps and Mamba-1 scan (AVX2) against
 * the scalar recurrences, token by token from the same state; skipped
 * without AVX2. */
TEST(test_kda_mamba2_and_mamba1_kernels_of_the_table_match_the_scalar_ones)
{
    if (!cpu_kern.kda_step || !cpu_kern.mamba2_step)
        SKIP("no AVX2 step kernels on this CPU (or HYSERVE_SIMD=0)");
    enum { N = 12, D = 32, HD = 8, DS = 24 };
    rng_state = 74;
    static float q[N * D], k[N * D], v[N * D], g[N * D], eg[D], beta[N], S1[D * D], S2[D * D], o1[N * D], o2[N * D];
    fill(q, N * D, 0.25f);
    fill(k, N * D, 0.25f);
    fill(v, N * D, 1.0f);
    fill(S1, D * D, 0.5f);
    memcpy(S2, S1, sizeof S1);
    for (int i = 0; i < N * D; i++)
        g[i] = -0.5f * (frand() + 1.0f);
    for (int t = 0; t < N; t++)
        beta[t] = 0.5f + 0.5f * frand();
    kda_recurrent_head(N, D, q, k, v, D, g, D, beta, 1, S1, o1, D);
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < D; i++)
            eg[i] = expf(g[t * D + i]);
        cpu_kern.kda_step(D, q + t * D, k + t * D, v + t * D, beta[t], eg, S2, o2 + t * D);
    }
    double e = 0, m = 0;
    for (int i = 0; i < N * D; i++) {
        e = fmax(e, fabs(o1[i] - o2[i]));
        m = fmax(m, fabs(o1[i]));
    }
    printf("    KDA: max difference %.2e of max |o| %.2f\n", e / m, m);
    CHECK(e <= 1e-5 * m);

    static float x[N * HD], B[N * DS], C[N * DS], dt[N], T1[HD * DS], T2[HD * DS], y1[N * HD], y2[N * HD];
    fill(x, N * HD, 1.0f);
    fill(B, N * DS, 1.0f);
    fill(C, N * DS, 1.0f);
    fill(T1, HD * DS, 0.5f);
    memcpy(T2, T1, sizeof T1);
    for (int t = 0; t < N; t++)
        dt[t] = 0.05f + 0.1f * (frand() + 1.0f);
    const float A = -1.3f;
    mamba2_recurrent_head(N, HD, DS, A, x, HD, dt, B, C, DS, T1, y1, HD);
    for (int t = 0; t < N; t++)
        cpu_kern.mamba2_step(HD, DS, expf(dt[t] * A), dt[t], x + t * HD, B + t * DS, C + t * DS, T2, y2 + t * HD);
    e = m = 0;
    for (int i = 0; i < N * HD; i++) {
        e = fmax(e, fabs(y1[i] - y2[i]));
        m = fmax(m, fabs(y1[i]));
    }
    printf("    Mamba-2: max difference %.2e of max |y| %.2f\n", e / m, m);
    CHECK(e <= 1e-5 * m);

    /* Mamba-1: the table's scan against mamba1.c's, over channels [3, 13) of 16 in two segments */
    if (!cpu_kern.mamba1_scan)
        SKIP("no AVX2 Mamba-1 scan on this CPU (or HYSERVE_SIMD=0)");
    enum { DI = 16, MS = 16, C0 = 3, C1 = 13 };
    static float mx[N * DI], mdt[N * DI], mBC[N * 2 * MS], mA[DI * MS], Q1[(C1 - C0) * MS], Q2[(C1 - C0) * MS];
    static float my1[N * DI], my2[N * DI];
    fill(mx, N * DI, 1.0f);
    fill(mBC, N * 2 * MS, 1.0f);
    fill(Q1, (C1 - C0) * MS, 0.5f);
    memcpy(Q2, Q1, sizeof Q1);
    for (int i = 0; i < N * DI; i++)
        mdt[i] = 0.02f + 0.1f * (frand() + 1.0f);
    for (int i = 0; i < DI * MS; i++)
        mA[i] = -0.2f - 2.0f * (frand() + 1.0f);
    mamba1_scan(0, 5, C0, C1, MS, mA, mx, DI, mdt, DI, mBC, 2 * MS, Q1, my1, DI);
    mamba1_scan(5, N, C0, C1, MS, mA, mx, DI, mdt, DI, mBC, 2 * MS, Q1, my1, DI);
    cpu_kern.mamba1_scan(0, 5, C0, C1, MS, mA, mx, DI, mdt, DI, mBC, 2 * MS, Q2, my2, DI);
    cpu_kern.mamba1_scan(5, N, C0, C1, MS, mA, mx, DI, mdt, DI, mBC, 2 * MS, Q2, my2, DI);
    e = m = 0;
    for (int t = 0; t < N; t++)
        for (int c = C0; c < C1; c++) {
            e = fmax(e, fabs(my1[t * DI + c] - my2[t * DI + c]));
            m = fmax(m, fabs(my1[t * DI + c]));
        }
    printf("    Mamba-1: max difference %.2e of max |y| %.2f\n", e / m, m);
    CHECK(e <= 1e-5 * m);
}

/* simd_bf16.c - vdpbf16ps on BF16 panels (see simd_bf16.h).
 *
 * The file is compiled for the baseline ISA; the kernels carry
 * __attribute__((target(...))) and run only where cpu.c found AVX512_BF16.
 * ref: Intel SDM, VDPBF16PS and VCVTNEPS2BF16 (rounding, DAZ/FTZ).
 */
#include "simd_bf16.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "panel_tile.h"
#include "panels.h"

#define AVX512BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#define INLINEBF AVX512BF static inline __attribute__((always_inline))

uint16_t bf16_round_ref(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)            /* NaN: keep it, quiet */
        return (uint16_t)((u >> 16) | 0x40);
    if ((u & 0x7f800000u) == 0)                      /* zero or denormal: signed zero */
        return (uint16_t)((u >> 16) & 0x8000);
    u += 0x7fffu + ((u >> 16) & 1u);                 /* nearest, ties to even */
    return (uint16_t)(u >> 16);
}

void bf16_round_row_ref(const float *x, int n, uint16_t *xb)
{
    for (int k = 0; k < n; k++)
        xb[k] = bf16_round_ref(x[k]);
}

AVX512BF void avx512bf16_round_row(const float *x, int n, uint16_t *xb)
{
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + k));
        _mm256_storeu_si256((__m256i *)(xb + k), (__m256i)h);
    }
    if (k < n) {
        const __mmask16 m = (__mmask16)((1u << (n - k)) - 1u);
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k));
        _mm256_mask_storeu_epi16(xb + k, m, (__m256i)h);
    }
}

/* bytes ahead in each panel's stream (panels.c's distance) */
#define BF_PF 2048

/* Tokens per tile: 2 x 12 accumulators, 2 weight vectors and a broadcast
 * in the 32 registers (as panels.c's f32 tile). */
#define BF_TG 12

/* RV panels (1 or 2) x T tokens (1-BF_TG): one vdpbf16ps chain per output */
INLINEBF void dp_tile(const char *P, size_t ps, int n_pair, const uint32_t *xb, size_t ldx, float *Y, size_t ldy,
                      const int RV, const int T)
{
    __m512 a[2][BF_TG];
    _Pragma("GCC unroll 2") for (int v = 0; v < RV; v++)
        _Pragma("GCC unroll 12") for (int t = 0; t < T; t++)
            a[v][t] = _mm512_setzero_ps();
    for (int j = 0; j < n_pair; j++) {
        __m512bh w[2];
        _Pragma("GCC unroll 2") for (int v = 0; v < RV; v++) {
            const char *p = P + (size_t)v * ps + (size_t)j * 64;
            _mm_prefetch(p + BF_PF, _MM_HINT_T0);
            w[v] = (__m512bh)_mm512_loadu_si512(p);
        }
        _Pragma("GCC unroll 12") for (int t = 0; t < T; t++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)xb[(size_t)t * ldx + (size_t)j]);
            _Pragma("GCC unroll 2") for (int v = 0; v < RV; v++)
                a[v][t] = _mm512_dpbf16_ps(a[v][t], w[v], x);
        }
    }
    _Pragma("GCC unroll 2") for (int v = 0; v < RV; v++)
        _Pragma("GCC unroll 12") for (int t = 0; t < T; t++)
            _mm512_storeu_ps(Y + (size_t)t * ldy + 16 * v, a[v][t]);
}

#define DP_CASE(RV_, T_)                                                                                       \
    case (RV_) * 16 + (T_):                                                                                    \
        dp_tile(P, ps, n_pair, x, ldx, y, ldy, RV_, T_);                                                       \
        break;

AVX512BF void avx512bf16_pan_rows(const char *W, size_t ps, int p0, int p1, int n_in, const uint16_t *xb,
                                  int n_tok, float *Y, int n_out)
{
    const int n_pair = n_in / 2;
    const size_t ldx = (size_t)n_pair, ldy = (size_t)n_out;
    const uint32_t *xp = (const uint32_t *)(const void *)xb;
    for (int p = p0; p < p1; p += 2) {
        const int rv = p1 - p >= 2 ? 2 : 1;
        const char *P = W + (size_t)p * ps;
        for (int t0 = 0; t0 < n_tok; t0 += BF_TG) {
            const int nt = n_tok - t0 < BF_TG ? n_tok - t0 : BF_TG;
            const uint32_t *x = xp + (size_t)t0 * ldx;
            float *y = Y + (size_t)t0 * ldy + (size_t)p * PANEL_ROWS;
            PANEL_TILE_SWITCH(PANEL_TILE_CASES12, DP_CASE, rv, nt)
        }
    }
}

/* ---- the start-up measurement ---- */

/* the convert+FMA panel kernel's one-token arithmetic (panels.c, pan_tile
 * with one token): each k-pair widened by a shift and a mask, two chained
 * FMAs per pair and output */
AVX512BF static void fma_rows1(const char *W, size_t ps, int n_pan, int n_in, const float *x, float *Y)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (int p = 0; p < n_pan; p += 2) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        const char *P = W + (size_t)p * ps;
        for (int j = 0; j < n_in / 2; j++) {
            const __m512i v0 = _mm512_loadu_si512(P + (size_t)j * 64);
            const __m512i v1 = _mm512_loadu_si512(P + ps + (size_t)j * 64);
            const __m512 xe = _mm512_set1_ps(x[2 * j]), xo = _mm512_set1_ps(x[2 * j + 1]);
            a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v0, hi)), xo,
                                 _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), xe, a0));
            a1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v1, hi)), xo,
                                 _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)), xe, a1));
        }
        _mm512_storeu_ps(Y + (size_t)p * PANEL_ROWS, a0);
        _mm512_storeu_ps(Y + (size_t)p * PANEL_ROWS + 16, a1);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bf16_dot_speedup(void)
{
    enum { N_IN = 2048, N_PAN = 4, REPS = 4, ROUNDS = 8 };
    const size_t ps = (size_t)PANEL_ROWS * 2 * N_IN;
    char *w = aligned_alloc(64, ps * N_PAN);
    float *x = malloc(sizeof(float) * N_IN), *y = malloc(sizeof(float) * PANEL_ROWS * N_PAN);
    uint16_t *xb = malloc(sizeof(uint16_t) * N_IN);
    double t_dp = 1e30, t_fma = 1e30;
    if (w && x && y && xb) {
        for (size_t i = 0; i < ps * N_PAN / 2; i++)         /* bf16 values in [1, 2) */
            ((uint16_t *)(void *)w)[i] = (uint16_t)(0x3f80u | (i * 37u & 0x7fu));
        for (int k = 0; k < N_IN; k++)
            x[k] = 1.0f / (float)(k + 1);
        fma_rows1(w, ps, N_PAN, N_IN, x, y);                 /* warm the caches */
        for (int r = 0; r < ROUNDS; r++) {
            double t0 = now_s();
            for (int i = 0; i < REPS; i++) {
                avx512bf16_round_row(x, N_IN, xb);
                avx512bf16_pan_rows(w, ps, 0, N_PAN, N_IN, xb, 1, y, PANEL_ROWS * N_PAN);
            }
            double t1 = now_s();
            for (int i = 0; i < REPS; i++)
                fma_rows1(w, ps, N_PAN, N_IN, x, y);
            double t2 = now_s();
            t_dp = t1 - t0 < t_dp ? t1 - t0 : t_dp;
            t_fma = t2 - t1 < t_fma ? t2 - t1 : t_fma;
        }
    }
    free(w);
    free(x);
    free(y);
    free(xb);
    return t_dp < 1e30 && t_dp > 0.0 ? t_fma / t_dp : 0.0;
}

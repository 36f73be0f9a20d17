/* panels.c - BF16 and F16 weights in panels of 16 rows (see panels.h). */
#include "panels.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "ops.h"
#include "quant.h"
#include "simd_amx.h"
#include "simd512.h"

bool panels_wanted(void)
{
    const char *e = getenv("HYSERVE_PANELS");
    if (e && !strcmp(e, "0"))
        return false;
    if (e && !strcmp(e, "1"))
        return simd_avx512();
    return simd_avx512() && !simd_amx();
}

bool panels_fit(const weight *w)
{
    return (w->type == GGML_BF16 || w->type == GGML_F16) && w->n_out > 0 && w->n_out % PANEL_ROWS == 0 &&
           w->n_in >= 2 && w->n_in % 2 == 0;
}

/* index of element (r, k) in the packed weight, in 16-bit elements */
static size_t panel_index(uint32_t type, int n_in, int r, int k)
{
    const size_t panel = (size_t)(r / PANEL_ROWS) * PANEL_ROWS * (size_t)n_in, pair = (size_t)(k / 2) * 32;
    const int i = r % PANEL_ROWS;
    return panel + pair + (type == GGML_BF16 ? (size_t)(2 * i + (k & 1)) : (size_t)(16 * (k & 1) + i));
}

void panels_pack(const void *rows, uint32_t type, int n_in, int n_out, void *dst)
{
    const int half = n_in / 2;
    for (int p = 0; p < n_out / PANEL_ROWS; p++) {
        const size_t r0 = (size_t)p * PANEL_ROWS;
        if (type == GGML_BF16) {                /* one dword (k = 2j, 2j + 1) per row */
            const uint32_t *s = (const uint32_t *)rows + r0 * half;
            uint32_t *d = (uint32_t *)dst + r0 * half;
            for (int j = 0; j < half; j++)
                for (int i = 0; i < PANEL_ROWS; i++)
                    d[(size_t)j * PANEL_ROWS + i] = s[(size_t)i * half + j];
        } else {                                /* k = 2j for 16 rows, then 2j + 1 */
            const uint16_t *s = (const uint16_t *)rows + r0 * n_in;
            uint16_t *d = (uint16_t *)dst + r0 * n_in;
            for (int j = 0; j < half; j++)
                for (int i = 0; i < PANEL_ROWS; i++) {
                    d[(size_t)j * 32 + i] = s[(size_t)i * n_in + 2 * j];
                    d[(size_t)j * 32 + 16 + i] = s[(size_t)i * n_in + 2 * j + 1];
                }
        }
    }
}

float panels_get(const weight *w, int r, int k)
{
    const uint16_t h = ((const uint16_t *)w->data)[panel_index(w->type, w->n_in, r, k)];
    return w->type == GGML_BF16 ? bf16_to_f32(h) : fp16_to_f32(h);
}

/* Rows decoded to f32 per tile for sgemm (prompts): 4 panels */
#define PANEL_TILE_ROWS 64

long panels_scratch_floats(const weight *w, int n_tok)
{
    return n_tok > 1 ? (long)omp_get_max_threads() * PANEL_TILE_ROWS * w->n_in : 0;
}

/* ---- portable: CPUs (or tests) without AVX-512 ---- */

static void panels_matmul_plain(float *restrict Y, const weight *W, const float *restrict X, int n_tok)
{
    const int n_in = W->n_in, n_out = W->n_out;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n_out; r++)
        for (int t = 0; t < n_tok; t++) {
            const float *x = X + (size_t)t * n_in;
            float s = 0.0f;
            for (int k = 0; k < n_in; k++)
                s += panels_get(W, r, k) * x[k];
            Y[(size_t)t * n_out + r] = s;
        }
}

/* ---- AVX-512 ---- */

#define AVX512P __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define INLINEP AVX512P static inline __attribute__((always_inline))

/* Prefetch distance, bytes ahead in each panel's stream. Measured on the
 * prototype (BF16, 16 tokens, 400 MiB, 2 threads): none 0.81-1.01 of the
 * row tile's time, 512 B 0.79-0.89, 2 KiB 0.69-0.78, 4 KiB 0.73-0.86. */
#ifndef PANEL_PF
#define PANEL_PF 2048
#endif

/* the tile loops run over constants: unrolled, the accumulators stay in
 * registers (without, GCC kept them in memory) */
#define PAN_UNROLL _Pragma("GCC unroll 12")

/* k-pair j of a panel (p points at it) widened: e for k = 2j, o for 2j + 1 */
INLINEP void pair_w(const char *p, const bool bf16, __m512 *e, __m512 *o)
{
    if (bf16) {
        const __m512i v = _mm512_loadu_si512(p);
        *e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        *o = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
    } else {
        *e = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        *o = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
    }
}

/* RV panels (1 or 2, ps bytes apart) x T tokens (1-12, rows ldx floats
 * apart): Y[t * ldy + 16 v + i] = sum_k W(16 v + i, k) X[t][k]. Each
 * output sums k = 0, 1, 2, ... in one chain of FMAs whatever RV and T
 * are, so a token's result does not depend on the tokens beside it (a
 * sequence decodes the same alone or in any batch). Separate even/odd
 * chains for up to 4 tokens were measured against it (2 threads, one
 * process alternating): from DRAM 0.96-1.03 of its time at 1-4 tokens,
 * in L2/L3 (1-8 MiB) 0.82-1.05; not worth giving the property up. */
INLINEP void pan_tile(const char *P, size_t ps, int n_in, const float *X, size_t ldx, float *Y, size_t ldy,
                      const int RV, const int T, const bool bf16)
{
    __m512 a[2][12];
    PAN_UNROLL for (int v = 0; v < RV; v++)
        PAN_UNROLL for (int t = 0; t < T; t++)
            a[v][t] = _mm512_setzero_ps();
    for (int j = 0; j < n_in / 2; j++) {
        __m512 e[2], o[2];
        PAN_UNROLL for (int v = 0; v < RV; v++) {
            const char *p = P + (size_t)v * ps + (size_t)j * 64;
            _mm_prefetch(p + PANEL_PF, _MM_HINT_T0);
            pair_w(p, bf16, &e[v], &o[v]);
        }
        PAN_UNROLL for (int t = 0; t < T; t++) {
            const __m512 xe = _mm512_set1_ps(X[(size_t)t * ldx + 2 * j]);
            const __m512 xo = _mm512_set1_ps(X[(size_t)t * ldx + 2 * j + 1]);
            PAN_UNROLL for (int v = 0; v < RV; v++)
                a[v][t] = _mm512_fmadd_ps(o[v], xo, _mm512_fmadd_ps(e[v], xe, a[v][t]));
        }
    }
    PAN_UNROLL for (int v = 0; v < RV; v++)
        PAN_UNROLL for (int t = 0; t < T; t++)
            _mm512_storeu_ps(Y + (size_t)t * ldy + 16 * v, a[v][t]);
}

#define PAN_CASE(RV_, T_, BF)                                                                                  \
    case (RV_) * 16 + (T_):                                                                                    \
        pan_tile(P, ps, n_in, x, ldx, y, ldy, RV_, T_, BF);                                                    \
        break;
#define PAN_CASES(RV_, BF)                                                                                     \
    PAN_CASE(RV_, 1, BF) PAN_CASE(RV_, 2, BF) PAN_CASE(RV_, 3, BF) PAN_CASE(RV_, 4, BF) PAN_CASE(RV_, 5, BF) \
    PAN_CASE(RV_, 6, BF) PAN_CASE(RV_, 7, BF) PAN_CASE(RV_, 8, BF) PAN_CASES_WIDE(RV_, BF)
/* Tokens per tile: 12 (2 x 12 accumulators, 4 weight vectors and 2
 * broadcasts in the 32 registers). Measured against groups of 8 (BF16 and
 * F16, 400 MiB, 2 threads, one process alternating, 15 repetitions,
 * median): 16 tokens 0.91-0.98, 24: 0.90-0.95, 64: 0.94-1.00, 12: 0.92,
 * 8: 1.01. */
#ifndef PANEL_TG
#define PANEL_TG 12
#endif
#if PANEL_TG > 8
#define PAN_CASES_WIDE(RV_, BF) PAN_CASE(RV_, 9, BF) PAN_CASE(RV_, 10, BF) PAN_CASE(RV_, 11, BF) PAN_CASE(RV_, 12, BF)
#else
#define PAN_CASES_WIDE(RV_, BF)
#endif

/* panels [p0, p1) of W x all n_tok tokens: pairs of panels, each pair's
 * tokens in groups of PANEL_TG (a pair of 3584-element panels, 224 KiB,
 * stays in L2 for the next group) */
#define PAN_ROWS(NAME, BF)                                                                                     \
    AVX512P static void NAME(const char *W, size_t ps, int p0, int p1, int n_in, const float *X, int n_tok,  \
                             float *Y, int n_out)                                                              \
    {                                                                                                          \
        const size_t ldx = (size_t)n_in, ldy = (size_t)n_out;                                                  \
        for (int p = p0; p < p1; p += 2) {                                                                     \
            const int rv = p1 - p >= 2 ? 2 : 1;                                                                \
            const char *P = W + (size_t)p * ps;                                                                \
            for (int t0 = 0; t0 < n_tok; t0 += PANEL_TG) {                                                     \
                const int nt = n_tok - t0 < PANEL_TG ? n_tok - t0 : PANEL_TG;                                  \
                const float *x = X + (size_t)t0 * ldx;                                                         \
                float *y = Y + (size_t)t0 * ldy + (size_t)p * PANEL_ROWS;                                      \
                switch (rv * 16 + nt) {                                                                        \
                    PAN_CASES(1, BF) PAN_CASES(2, BF)                                                          \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

PAN_ROWS(pan_rows_bf16, true)
PAN_ROWS(pan_rows_f16, false)

/* panel q (< 4) of a tile, decoded to f32 columns 16q .. 16q + 15 of
 * tile[k][64]: the rows x k block transposed, for sgemm without trans */
AVX512P static void pan_decode(const char *P, int n_in, bool bf16, float *tile, int q)
{
    for (int j = 0; j < n_in / 2; j++) {
        __m512 e, o;
        if (bf16)
            pair_w(P + (size_t)j * 64, true, &e, &o);
        else
            pair_w(P + (size_t)j * 64, false, &e, &o);
        _mm512_storeu_ps(tile + (size_t)(2 * j) * PANEL_TILE_ROWS + 16 * q, e);
        _mm512_storeu_ps(tile + (size_t)(2 * j + 1) * PANEL_TILE_ROWS + 16 * q, o);
    }
}

void panels_matmul_many(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok)
{
    long total = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        total += W[i]->n_out / PANEL_ROWS;
        bytes += (long)W[i]->n_out * (long)W[i]->row_bytes;
    }
    const int n_in = W[0]->n_in;
    const bool bf16 = W[0]->type == GGML_BF16;
    #pragma omp parallel if (bytes >= 128 * 1024)
    {
        const int nt = omp_get_num_threads(), it = omp_get_thread_num();
        const long g0 = total * it / nt, g1 = total * (it + 1) / nt;
        long off = 0;
        for (int i = 0; i < n; i++) {               /* the parts of [g0, g1) in each weight */
            const long np = W[i]->n_out / PANEL_ROWS;
            const long a = g0 > off ? g0 : off, b = g1 < off + np ? g1 : off + np;
            const size_t ps = (size_t)PANEL_ROWS * W[i]->row_bytes;
            if (b > a && bf16)
                pan_rows_bf16(W[i]->data, ps, (int)(a - off), (int)(b - off), n_in, X, n_tok, Y[i], W[i]->n_out);
            else if (b > a)
                pan_rows_f16(W[i]->data, ps, (int)(a - off), (int)(b - off), n_in, X, n_tok, Y[i], W[i]->n_out);
            off += np;
        }
    }
}

void panels_matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, bool outer,
                   float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out, n_pan = n_out / PANEL_ROWS;
    const size_t ps = (size_t)PANEL_ROWS * W->row_bytes;
    const char *base = W->data;
    const bool bf16 = W->type == GGML_BF16;
    if (!simd_avx512()) {
        panels_matmul_plain(Y, W, X, n_tok);
        return;
    }
    if (n_tok == 1 || outer || !scratch) {
        float *y = Y;
        panels_matmul_many(1, &y, &W, X, n_tok);
        return;
    }
    const int per = PANEL_TILE_ROWS / PANEL_ROWS, n_tiles = (n_pan + per - 1) / per;
    #pragma omp parallel
    {
        float *tile = scratch + (long)omp_get_thread_num() * PANEL_TILE_ROWS * n_in;
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_tiles; it++) {
            const int q0 = it * per, nq = n_pan - q0 < per ? n_pan - q0 : per;
            for (int q = 0; q < nq; q++)
                pan_decode(base + (size_t)(q0 + q) * ps, n_in, bf16, tile, q);
            gemm(false, false, n_tok, nq * PANEL_ROWS, n_in, 1.0f, X, n_in, tile, PANEL_TILE_ROWS, 0.0f,
                 Y + (size_t)q0 * PANEL_ROWS, n_out);
        }
    }
}

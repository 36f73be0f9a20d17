/* panels.c - BF16, F16 and Q8_0 weights in panels of 16 rows (see panels.h). */
#include "panels.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "ggml_type.h"
#include "panel_tile.h"
#include "quant.h"
#include "share.h"
#include "simd_amx.h"
#include "simd_bf16.h"
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
    if (w->n_out <= 0 || w->n_out % PANEL_ROWS)
        return false;
    if (w->type == GGML_Q8_0)
        return w->n_in >= 32 && w->n_in % 32 == 0 && simd_avx512_vnni();
    return (w->type == GGML_BF16 || w->type == GGML_F16) && w->n_in >= 2 && w->n_in % 2 == 0;
}

bool panels_kernel(const weight *w)
{
    return w->type == GGML_Q8_0 ? simd_avx512_vnni() : simd_avx512();
}

/* Q8_0 panels: the quants of block b at b * 512 in a panel, its scales at
 * 512 nb + 32 b (panels.h) */
#define Q8P_BLOCK 512
#define Q8P_SCALES 32

/* index of element (r, k) in the packed weight, in 16-bit elements */
static size_t panel_index(uint32_t type, int n_in, int r, int k)
{
    const size_t panel = (size_t)(r / PANEL_ROWS) * PANEL_ROWS * (size_t)n_in, pair = (size_t)(k / 2) * 32;
    const int i = r % PANEL_ROWS;
    return panel + pair + (type == GGML_BF16 ? (size_t)(2 * i + (k & 1)) : (size_t)(16 * (k & 1) + i));
}

/* Q8_0 rows (blocks of 34 bytes: fp16 d, then 32 int8) into panels */
static void pack_q8_0(const uint8_t *rows, int n_in, int n_out, uint8_t *dst)
{
    const int nb = n_in / 32;
    const size_t rb = (size_t)nb * 34, ps = PANEL_ROWS * rb;
    for (int p = 0; p < n_out / PANEL_ROWS; p++) {
        uint8_t *P = dst + (size_t)p * ps;
        for (int i = 0; i < PANEL_ROWS; i++) {
            const uint8_t *row = rows + ((size_t)p * PANEL_ROWS + (size_t)i) * rb;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * 34;
                memcpy(P + (size_t)nb * Q8P_BLOCK + (size_t)b * Q8P_SCALES + 2 * (size_t)i, blk, 2);
                for (int k = 0; k < 32; k++)            /* group k / 4, row i's dword, byte k % 4 */
                    P[(size_t)b * Q8P_BLOCK + (size_t)(k / 4) * 64 + 4 * (size_t)i + (size_t)(k % 4)] =
                        (uint8_t)(blk[2 + k] ^ 0x80);
            }
        }
    }
}

void panels_pack(const void *rows, uint32_t type, int n_in, int n_out, void *dst)
{
    const int half = n_in / 2;
    if (type == GGML_Q8_0) {
        pack_q8_0(rows, n_in, n_out, dst);
        return;
    }
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

/* Q8_0 element (r, k) as stored (int8) and the scale of row r's block b */
static int q8_at(const weight *w, int r, int k)
{
    const uint8_t *P = (const uint8_t *)w->data + (size_t)(r / PANEL_ROWS) * PANEL_ROWS * w->row_bytes;
    return (int8_t)(P[(size_t)(k / 32) * Q8P_BLOCK + (size_t)(k % 32 / 4) * 64 + 4 * (size_t)(r % PANEL_ROWS) +
                      (size_t)(k % 4)] ^ 0x80);
}

static float q8_scale(const weight *w, int r, int b)
{
    const uint8_t *P = (const uint8_t *)w->data + (size_t)(r / PANEL_ROWS) * PANEL_ROWS * w->row_bytes;
    uint16_t d;
    memcpy(&d, P + (size_t)(w->n_in / 32) * Q8P_BLOCK + (size_t)b * Q8P_SCALES + 2 * (size_t)(r % PANEL_ROWS), 2);
    return fp16_to_f32(d);
}

float panels_get(const weight *w, int r, int k)
{
    if (w->type == GGML_Q8_0)
        return q8_scale(w, r, k / 32) * (float)q8_at(w, r, k);
    const uint16_t h = ((const uint16_t *)w->data)[panel_index(w->type, w->n_in, r, k)];
    return w->type == GGML_BF16 ? bf16_to_f32(h) : fp16_to_f32(h);
}

/* Rows decoded to f32 per tile for sgemm (prompts): 4 panels */
#define PANEL_TILE_ROWS 64

/* Q8_0: tokens per pass of int8 activations (their scratch, 1.25 n_in
 * bytes each, then fits the sgemm tiles' for 2 threads or more) */
#define Q8P_MAX_TOK 64

/* A pass's int8 activations: per token t, q[t n_in ..] as quantize_act_q8
 * makes them, their scales d[t nb + b], and c[t nb + b] = -128 sum of
 * block b's q (the kernel's weights are w + 128: sum (w + 128) q + c =
 * sum w q, exact in int32). */
typedef struct {
    int8_t *q;
    float *d;
    int32_t *c;
} q8_acts;

static long q8_acts_floats(int n_in, int n_tok)
{
    return 2L * n_tok * (n_in / 32) + (long)n_tok * n_in / 4 + 1;
}

static q8_acts q8_acts_at(float *scratch, int n_in, int n_tok)
{
    const size_t nb = (size_t)n_in / 32;
    q8_acts a;
    a.d = scratch;
    a.c = (int32_t *)(scratch + (size_t)n_tok * nb);
    a.q = (int8_t *)(a.c + (size_t)n_tok * nb);
    return a;
}

/* tokens [t0, t1) of X quantized into a */
static void q8_acts_fill(const float *X, int n_in, int t0, int t1, q8_acts a)
{
    const int nb = n_in / 32;
    for (int t = t0; t < t1; t++) {
        int8_t *q = a.q + (size_t)t * n_in;
        quantize_act_q8(X + (size_t)t * n_in, n_in, q, a.d + (size_t)t * nb);
        for (int b = 0; b < nb; b++) {
            int32_t s = 0;
            for (int j = 0; j < 32; j++)
                s += q[32 * b + j];
            a.c[(size_t)t * nb + b] = -128 * s;
        }
    }
}

/* BF16 products on rounded activations (n_in / 2 floats a token on
 * vdpbf16ps) get scratch for at least this many tokens, so a decode step
 * of up to 64 sequences is one pass; prompts fill the sgemm tiles' scratch
 * too (bf16_pass_tokens) */
#define BF16DP_MAX_TOK 64

long panels_scratch_floats(const weight *w, int n_tok)
{
    const long tile = n_tok > 1 ? (long)omp_get_max_threads() * PANEL_TILE_ROWS * w->n_in : 0;
    if (w->type == GGML_BF16) {             /* bf16 pairs for vdpbf16ps, or one token's rounded floats */
        const long pairs = (long)(n_tok < BF16DP_MAX_TOK ? n_tok : BF16DP_MAX_TOK) * (w->n_in / 2 + 16);
        const long acts = pairs > w->n_in ? pairs : w->n_in;
        return acts > tile ? acts : tile;
    }
    if (w->type != GGML_Q8_0)
        return tile;
    const long acts = q8_acts_floats(w->n_in, n_tok < Q8P_MAX_TOK ? n_tok : Q8P_MAX_TOK);
    return acts > tile ? acts : tile;
}

/* ---- portable: CPUs (or tests) without AVX-512 ---- */

/* Q8_0 on int8 activations, the kernel's arithmetic: per block an exact
 * int sum, then acc = fma(sum, dw dx, acc) over the blocks in order (the
 * same bits as the kernel) */
static void panels_matmul_plain_q8(float *restrict Y, const weight *W, const float *restrict X, int n_tok,
                                   float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out, nb = n_in / 32;
    for (int c0 = 0; c0 < n_tok; c0 += Q8P_MAX_TOK) {
        const int nc = n_tok - c0 < Q8P_MAX_TOK ? n_tok - c0 : Q8P_MAX_TOK;
        const q8_acts a = q8_acts_at(scratch, n_in, nc);
        q8_acts_fill(X + (size_t)c0 * n_in, n_in, 0, nc, a);
        #pragma omp parallel for schedule(static)
        for (int r = 0; r < n_out; r++)
            for (int t = 0; t < nc; t++) {
                float acc = 0.0f;
                for (int b = 0; b < nb; b++) {
                    int32_t s = 0;
                    for (int k = 32 * b; k < 32 * b + 32; k++)
                        s += q8_at(W, r, k) * a.q[(size_t)t * n_in + k];
                    acc = fmaf((float)s, q8_scale(W, r, b) * a.d[(size_t)t * nb + b], acc);
                }
                Y[(size_t)(c0 + t) * n_out + r] = acc;
            }
    }
}

/* round: each activation rounded to bf16 first (PANELS_BF16ACT) */
static void panels_matmul_plain(float *restrict Y, const weight *W, const float *restrict X, int n_tok, bool round)
{
    const int n_in = W->n_in, n_out = W->n_out;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n_out; r++)
        for (int t = 0; t < n_tok; t++) {
            const float *x = X + (size_t)t * n_in;
            float s = 0.0f;
            for (int k = 0; k < n_in; k++)
                s += panels_get(W, r, k) * (round ? bf16_to_f32(bf16_round_ref(x[k])) : x[k]);
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

#define PAN_CASE_BF16(RV_, T_)                                                                                 \
    case (RV_) * 16 + (T_):                                                                                    \
        pan_tile(P, ps, n_in, x, ldx, y, ldy, RV_, T_, true);                                                 \
        break;
#define PAN_CASE_F16(RV_, T_)                                                                                  \
    case (RV_) * 16 + (T_):                                                                                    \
        pan_tile(P, ps, n_in, x, ldx, y, ldy, RV_, T_, false);                                                 \
        break;
/* Tokens per tile: 12 (2 x 12 accumulators, 4 weight vectors and 2
 * broadcasts in the 32 registers). Measured against groups of 8 (BF16 and
 * F16, 400 MiB, 2 threads, one process alternating, 15 repetitions,
 * median): 16 tokens 0.91-0.98, 24: 0.90-0.95, 64: 0.94-1.00, 12: 0.92,
 * 8: 1.01. */
#define PANEL_TG 12

/* panels [p0, p1) of W x all n_tok tokens: pairs of panels, each pair's
 * tokens in groups of PANEL_TG (a pair of 3584-element panels, 224 KiB,
 * stays in L2 for the next group). Chunks of 512 k in L1 for every group
 * measured no faster (prompts of 128 and 512 tokens, F16 and vdpbf16ps:
 * 0.77-1.0 of this). */
#define PAN_ROWS(NAME, CASE)                                                                                   \
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
                PANEL_TILE_SWITCH(PANEL_TILE_CASES12, CASE, rv, nt)                                            \
            }                                                                                                  \
        }                                                                                                      \
    }

PAN_ROWS(pan_rows_bf16, PAN_CASE_BF16)
PAN_ROWS(pan_rows_f16, PAN_CASE_F16)

/* ---- Q8_0 on AVX512-VNNI ----
 * RV panels (1 or 2, ps bytes apart) x T tokens (1-Q8P_TG) of int8
 * activations: per block, each output's exact int sum starts at the
 * token's c and takes 8 vpdpbusd (16 rows x 4 k of w + 128 against a
 * broadcast dword of 4 int8 activations), then acc = fma(sum, dw dx, acc),
 * the blocks in order: the same bits whatever RV and T (and as the
 * portable loop), so a sequence's outputs do not depend on its batch.
 * 11 vector uops per 512 multiply-adds of a token, against about 4 per 64
 * on the rows' tile (simd_avx512.c). */
#define AVX512Q __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define INLINEQ AVX512Q static inline __attribute__((always_inline))

/* tokens per tile: 2 x 6 float and 2 x 6 int accumulators, 2 weight
 * vectors and a broadcast in the 32 registers */
#ifndef Q8P_TG
#define Q8P_TG 6
#endif

/* blocks [b0, b1) of the tile; after block 0 the sums so far come from Y.
 * Prefetch: PANEL_PF ahead in the panels into L1, or (ahead) the same
 * place in the next pair, 2 ps on, into L2. */
INLINEQ void q8p_tile(const char *P, size_t ps, int nb, int b0, int b1, q8_acts a, size_t n_in, float *Y,
                      size_t ldy, const int RV, const int T, bool ahead)
{
    __m512 acc[2][Q8P_TG];
    const char *S = P + (size_t)nb * Q8P_BLOCK;
    PAN_UNROLL for (int v = 0; v < RV; v++)
        PAN_UNROLL for (int t = 0; t < T; t++)
            acc[v][t] = b0 ? _mm512_loadu_ps(Y + (size_t)t * ldy + 16 * v) : _mm512_setzero_ps();
    for (int b = b0; b < b1; b++) {
        __m512i s[2][Q8P_TG];
        PAN_UNROLL for (int t = 0; t < T; t++) {
            const __m512i c = _mm512_set1_epi32(a.c[(size_t)t * nb + b]);
            PAN_UNROLL for (int v = 0; v < RV; v++)
                s[v][t] = c;
        }
        PAN_UNROLL for (int g = 0; g < 8; g++) {
            __m512i w[2];
            PAN_UNROLL for (int v = 0; v < RV; v++) {
                const char *p = P + (size_t)v * ps + (size_t)b * Q8P_BLOCK + (size_t)g * 64;
                if (ahead)
                    _mm_prefetch(p + 2 * ps, _MM_HINT_T1);
                else
                    _mm_prefetch(p + PANEL_PF, _MM_HINT_T0);
                w[v] = _mm512_loadu_si512(p);
            }
            PAN_UNROLL for (int t = 0; t < T; t++) {
                int32_t x4;
                memcpy(&x4, a.q + (size_t)t * n_in + 32 * (size_t)b + 4 * (size_t)g, 4);
                const __m512i x = _mm512_set1_epi32(x4);
                PAN_UNROLL for (int v = 0; v < RV; v++)
                    s[v][t] = _mm512_dpbusd_epi32(s[v][t], w[v], x);
            }
        }
        __m512 dw[2];
        PAN_UNROLL for (int v = 0; v < RV; v++) {
            const char *sc = S + (size_t)v * ps + (size_t)b * Q8P_SCALES;
            if (ahead)
                _mm_prefetch(sc + 2 * ps, _MM_HINT_T1);
            else
                _mm_prefetch(sc + PANEL_PF / 16, _MM_HINT_T0);
            dw[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
        }
        PAN_UNROLL for (int t = 0; t < T; t++) {
            const __m512 dx = _mm512_set1_ps(a.d[(size_t)t * nb + b]);
            PAN_UNROLL for (int v = 0; v < RV; v++)
                acc[v][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[v][t]), _mm512_mul_ps(dw[v], dx), acc[v][t]);
        }
    }
    PAN_UNROLL for (int v = 0; v < RV; v++)
        PAN_UNROLL for (int t = 0; t < T; t++)
            _mm512_storeu_ps(Y + (size_t)t * ldy + 16 * v, acc[v][t]);
}

#define Q8P_CASE(RV_, T_)                                                                                      \
    case (RV_) * 16 + (T_):                                                                                    \
        q8p_tile(P, ps, nb, k0, k1, at, (size_t)n_in, y, ldy, RV_, T_, ahead);                                 \
        break;
#if Q8P_TG != 6
#error "q8p_rows switches over tiles of 1-6 tokens"
#endif

/* blocks per chunk when a pair of panels takes several token groups */
#ifndef Q8P_KC
#define Q8P_KC 8
#endif

/* panels [p0, p1) of a Q8_0 W x the n_tok tokens of a, pairs of panels in
 * turn. At 16 tokens a weight byte feeds 16 multiply-adds, and the kernel's
 * ~60-70 per cycle and core (in L2) need about the bytes per second DRAM
 * gives two cores, so loading and multiplying must overlap: in a step of
 * more than Q8P_TG tokens each pair goes in chunks of Q8P_KC blocks,
 * every token group on a chunk before the next (a chunk of a pair, 8.5 KiB,
 * stays in L1), and the groups after the first prefetch the next pair into
 * L2. Before, all of a pair for the first group, then the rest: the first
 * group waited on DRAM and the others left it idle. Same FMAs in the same
 * order per output, so the same bits. Measured (16 tokens, 170-600 MB of
 * weights, 2 threads, alternating binaries): 211-261 -> 277-302 GMAC/s;
 * chunks of 4-16 blocks alike, 2 worse. */
AVX512Q static void q8p_rows(const char *W, size_t ps, int p0, int p1, int n_in, q8_acts a, int n_tok, float *Y,
                             int n_out)
{
    const int nb = n_in / 32, kc = n_tok > Q8P_TG ? Q8P_KC : nb;
    const size_t ldy = (size_t)n_out;
    for (int p = p0; p < p1; p += 2) {
        const int rv = p1 - p >= 2 ? 2 : 1;
        const char *P = W + (size_t)p * ps;
        for (int k0 = 0; k0 < nb; k0 += kc) {
            const int k1 = nb - k0 < kc ? nb : k0 + kc;
            for (int t0 = 0; t0 < n_tok; t0 += Q8P_TG) {
                const int nt = n_tok - t0 < Q8P_TG ? n_tok - t0 : Q8P_TG;
                const bool ahead = t0 > 0 && p + 2 < p1;
                const q8_acts at = { a.q + (size_t)t0 * n_in, a.d + (size_t)t0 * nb, a.c + (size_t)t0 * nb };
                float *y = Y + (size_t)t0 * ldy + (size_t)p * PANEL_ROWS;
                PANEL_TILE_SWITCH(PANEL_TILE_CASES6, Q8P_CASE, rv, nt)
            }
        }
    }
}

/* byte m of each dword of u (signed quants, 16 rows x 4 k), times the
 * rows' scales: k = 4g + m of the 16 rows as f32 (exact) */
INLINEQ __m512 q8_widen(__m512i u, const int m, __m512 dw)
{
    const __m512i q = m == 3 ? _mm512_srai_epi32(u, 24) : _mm512_srai_epi32(_mm512_slli_epi32(u, 24 - 8 * m), 24);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), dw);
}

/* Q8_0 on f32 activations (prompts of 2 to small_max tokens): RV panels x
 * T tokens (1-12) as pan_tile, each group of 4 k widened to f32 (exact:
 * q d) and multiplied by every token's activation in one chain of FMAs
 * over k per output, as for BF16 and F16 */
INLINEQ void q8f_tile(const char *P, size_t ps, int nb, const float *X, size_t ldx, float *Y, size_t ldy, const int RV,
                      const int T)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const char *S = P + (size_t)nb * Q8P_BLOCK;
    __m512 a[2][12];
    PAN_UNROLL for (int v = 0; v < RV; v++)
        PAN_UNROLL for (int t = 0; t < T; t++)
            a[v][t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512 dw[2];
        PAN_UNROLL for (int v = 0; v < RV; v++)
            dw[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(S + (size_t)v * ps + (size_t)b * Q8P_SCALES)));
        for (int g = 0; g < 8; g++) {
            __m512i u[2];
            PAN_UNROLL for (int v = 0; v < RV; v++) {
                const char *p = P + (size_t)v * ps + (size_t)b * Q8P_BLOCK + (size_t)g * 64;
                _mm_prefetch(p + PANEL_PF, _MM_HINT_T0);
                u[v] = _mm512_xor_si512(_mm512_loadu_si512(p), bias);      /* q, signed */
            }
            const size_t k = 32 * (size_t)b + 4 * (size_t)g;
            PAN_UNROLL for (int m = 0; m < 4; m++) {
                __m512 w[2];
                PAN_UNROLL for (int v = 0; v < RV; v++)
                    w[v] = q8_widen(u[v], m, dw[v]);
                PAN_UNROLL for (int t = 0; t < T; t++) {
                    const __m512 x = _mm512_set1_ps(X[(size_t)t * ldx + k + (size_t)m]);
                    PAN_UNROLL for (int v = 0; v < RV; v++)
                        a[v][t] = _mm512_fmadd_ps(w[v], x, a[v][t]);
                }
            }
        }
    }
    PAN_UNROLL for (int v = 0; v < RV; v++)
        PAN_UNROLL for (int t = 0; t < T; t++)
            _mm512_storeu_ps(Y + (size_t)t * ldy + 16 * v, a[v][t]);
}

#define Q8F_CASE(RV_, T_)                                                                                      \
    case (RV_) * 16 + (T_):                                                                                    \
        q8f_tile(P, ps, nb, x, ldx, y, ldy, RV_, T_);                                                          \
        break;
/* panels [p0, p1) of a Q8_0 W x n_tok f32 tokens, as PAN_ROWS (tiles of 12) */
AVX512Q static void q8f_rows(const char *W, size_t ps, int p0, int p1, int n_in, const float *X, int n_tok, float *Y,
                             int n_out)
{
    const int nb = n_in / 32;
    const size_t ldx = (size_t)n_in, ldy = (size_t)n_out;
    for (int p = p0; p < p1; p += 2) {
        const int rv = p1 - p >= 2 ? 2 : 1;
        const char *P = W + (size_t)p * ps;
        for (int t0 = 0; t0 < n_tok; t0 += 12) {
            const int nt = n_tok - t0 < 12 ? n_tok - t0 : 12;
            const float *x = X + (size_t)t0 * ldx;
            float *y = Y + (size_t)t0 * ldy + (size_t)p * PANEL_ROWS;
            PANEL_TILE_SWITCH(PANEL_TILE_CASES12, Q8F_CASE, rv, nt)
        }
    }
}

/* Q8_0 panel q (< 4) of a tile decoded to f32, as pan_decode */
AVX512Q static void q8p_decode(const char *P, int nb, float *tile, int q)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < nb; b++) {
        const __m512 dw = _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)(P + (size_t)nb * Q8P_BLOCK + (size_t)b * Q8P_SCALES)));
        for (int g = 0; g < 8; g++) {
            const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(P + (size_t)b * Q8P_BLOCK + (size_t)g * 64), bias);
            float *o = tile + (size_t)(32 * b + 4 * g) * PANEL_TILE_ROWS + 16 * q;
            _mm512_storeu_ps(o, q8_widen(v, 0, dw));
            _mm512_storeu_ps(o + PANEL_TILE_ROWS, q8_widen(v, 1, dw));
            _mm512_storeu_ps(o + 2 * PANEL_TILE_ROWS, q8_widen(v, 2, dw));
            _mm512_storeu_ps(o + 3 * PANEL_TILE_ROWS, q8_widen(v, 3, dw));
        }
    }
}

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

/* Tokens per pass of BF16 products on rounded activations: all n_tok if
 * the scratch holds them at slot floats each, else passes as even as the
 * scratch allows (each pass reads the weight again: a short last one
 * would cost the weight's bytes for a few tokens' products). About 250
 * tokens of 1024 or 3584 on 2 threads. */
static int bf16_pass_tokens(const weight *w, int n_tok, long slot)
{
    const long fit = panels_scratch_floats(w, n_tok) / slot;
    if (fit >= n_tok)
        return n_tok;
    if (fit < 1)
        return 1;
    const long passes = (n_tok + fit - 1) / fit;
    return (int)((n_tok + passes - 1) / passes);
}

/* Activations rounded to bf16, or quantized to int8 for Q8_0, before the
 * parallel region up to this many floats (4 tokens of 3584: a few
 * microseconds), by shares inside it (then a barrier) past it. */
#define ACT_PREP_SERIAL 16384

/* tokens [t0, t1) of X rounded to bf16: pairs for vdpbf16ps at xb + t n_in
 * (dp), else the rounded values as floats at xr + t n_in */
static void bf16_round_tokens(const float *X, int n_in, int t0, int t1, bool dp, uint16_t *xb, float *xr)
{
    for (int t = t0; t < t1; t++) {
        const float *x = X + (size_t)t * n_in;
        if (dp)
            avx512bf16_round_row(x, n_in, xb + (size_t)t * n_in);
        else
            for (int k = 0; k < n_in; k++)
                xr[(size_t)t * n_in + k] = bf16_to_f32(bf16_round_ref(x[k]));
    }
}

void panels_matmul_many(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                        int path, float *scratch)
{
    long units = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        units += (W[i]->n_out / PANEL_ROWS + 1) / 2;
        bytes += (long)W[i]->n_out * (long)W[i]->row_bytes;
    }
    const int n_in = W[0]->n_in;
    const uint32_t type = W[0]->type;
    if (n_tok == 1 && path != PANELS_BF16ACT)
        path = PANELS_DECODE;
    /* Q8_0 on int8 activations in passes of up to Q8P_MAX_TOK tokens; BF16
     * on activations rounded to bf16 (decode steps where vdpbf16ps was
     * chosen, prompts on PANELS_BF16ACT) in passes that fit the scratch:
     * vdpbf16ps where BF16 decode takes it too (dp: simd_bf16_dot, the
     * start-up measurement or the switch), else the rounded values as
     * floats on the FMA kernel (the same products, exact in f32); the
     * others in one pass */
    const bool int8 = type == GGML_Q8_0 && path == PANELS_DECODE;
    const bool bfa = type == GGML_BF16 && scratch &&
                     ((path == PANELS_DECODE && simd_bf16_dot()) || path == PANELS_BF16ACT);
    const bool dp = bfa && simd_bf16_dot();
    const long slot = dp ? n_in / 2 + 16 : n_in;       /* scratch floats per token: bf16 pairs, or floats */
    const int per = int8 ? Q8P_MAX_TOK : bfa ? bf16_pass_tokens(W[0], n_tok, slot) : n_tok;
    for (int c0 = 0; c0 < n_tok; c0 += per) {
        const int nc = n_tok - c0 < per ? n_tok - c0 : per;
        const q8_acts acts = int8 ? q8_acts_at(scratch, n_in, nc) : (q8_acts){ 0 };
        uint16_t *xb = (uint16_t *)(void *)scratch;     /* dp: token t's pairs at xb + t n_in */
        float *xr = scratch;                            /* bfa without dp: token t's rounded x at xr + t n_in */
        /* A few tokens are rounded or quantized before the region: a
         * barrier inside it costs more than the work (a one-token decode
         * pays it in every product, ~100 a token). */
        const bool prep_first = (int8 || bfa) && (long)nc * n_in <= ACT_PREP_SERIAL;
        if (prep_first && int8)
            q8_acts_fill(X + (size_t)c0 * n_in, n_in, 0, nc, acts);
        else if (prep_first)
            bf16_round_tokens(X + (size_t)c0 * n_in, n_in, 0, nc, dp, xb, xr);
        /* units: pairs of panels from each weight's first (the kernels take
         * panels two at a time): each thread claims its share in chunks and
         * the idle steal from the busiest (share.h) */
        share sh;
        share_init(&sh, units, share_min_units(2 * PANEL_ROWS * W[0]->row_bytes),
                   bytes >= 128 * 1024 ? omp_get_max_threads() : 1);
        #pragma omp parallel if (bytes >= 128 * 1024)
        {
            const int nt = omp_get_num_threads(), it = omp_get_thread_num();
            if (int8 && !prep_first) {              /* each thread quantizes a share of the tokens */
                q8_acts_fill(X + (size_t)c0 * n_in, n_in, nc * it / nt, nc * (it + 1) / nt, acts);
                #pragma omp barrier
            } else if (bfa && !prep_first) {        /* or rounds a share to bf16 */
                bf16_round_tokens(X + (size_t)c0 * n_in, n_in, nc * it / nt, nc * (it + 1) / nt, dp, xb, xr);
                #pragma omp barrier
            }
            long ca, cb;
            while (share_take(&sh, it, &ca, &cb)) {
                long off = 0;
                for (int i = 0; i < n; i++) {       /* the parts of the chunk in each weight */
                    const long nu = (W[i]->n_out / PANEL_ROWS + 1) / 2;
                    long ua, ub;
                    if (!share_part(ca, cb, off, nu, &ua, &ub)) {
                        off += nu;
                        continue;
                    }
                    const int np = W[i]->n_out / PANEL_ROWS, a = (int)(2 * ua), b = 2 * ub < np ? (int)(2 * ub) : np;
                    const size_t ps = (size_t)PANEL_ROWS * W[i]->row_bytes;
                    float *y = Y[i] + (size_t)c0 * W[i]->n_out;
                    const float *x = bfa ? xr : X + (size_t)c0 * n_in;
                    if (int8)
                        q8p_rows(W[i]->data, ps, a, b, n_in, acts, nc, y, W[i]->n_out);
                    else if (type == GGML_Q8_0)
                        q8f_rows(W[i]->data, ps, a, b, n_in, x, nc, y, W[i]->n_out);
                    else if (dp)
                        avx512bf16_pan_rows(W[i]->data, ps, a, b, n_in, xb, nc, y, W[i]->n_out);
                    else if (type == GGML_BF16)
                        pan_rows_bf16(W[i]->data, ps, a, b, n_in, x, nc, y, W[i]->n_out);
                    else
                        pan_rows_f16(W[i]->data, ps, a, b, n_in, x, nc, y, W[i]->n_out);
                    off += nu;
                }
            }
        }
    }
}

void panels_matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, int path,
                   float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out, n_pan = n_out / PANEL_ROWS;
    const size_t ps = (size_t)PANEL_ROWS * W->row_bytes;
    const char *base = W->data;
    const bool bf16 = W->type == GGML_BF16;
    const bool q8 = W->type == GGML_Q8_0;
    if (n_tok == 1 && path != PANELS_BF16ACT)
        path = PANELS_DECODE;
    if ((path == PANELS_SGEMM && !scratch) || (path == PANELS_BF16ACT && !bf16))
        path = PANELS_OUTER;
    if (!panels_kernel(W) && q8 && path == PANELS_DECODE) {
        panels_matmul_plain_q8(Y, W, X, n_tok, scratch);
        return;
    }
    if (!panels_kernel(W) || (path == PANELS_BF16ACT && !scratch)) {
        panels_matmul_plain(Y, W, X, n_tok, path == PANELS_BF16ACT);
        return;
    }
    if (path != PANELS_SGEMM) {
        float *y = Y;
        panels_matmul_many(1, &y, &W, X, n_tok, path, scratch);
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
                if (q8)
                    q8p_decode(base + (size_t)(q0 + q) * ps, n_in / 32, tile, q);
                else
                    pan_decode(base + (size_t)(q0 + q) * ps, n_in, bf16, tile, q);
            gemm(false, false, n_tok, nq * PANEL_ROWS, n_in, 1.0f, X, n_in, tile, PANEL_TILE_ROWS, 0.0f,
                 Y + (size_t)q0 * PANEL_ROWS, n_out);
        }
    }
}

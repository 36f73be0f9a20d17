/* simd_avx512.c - the AVX-512 kernels declared in simd512.h.
 *
 * Owns: the small-batch rows x tokens product and f16 / bf16 row
 * decoding. Does not own: the AVX-512 check (cpu.c) or choosing kernels
 * per shape (callers branch on simd_avx512()) or the references (quant.c and the
 * AVX2 kernels of simd_avx2.c define the results these must reproduce, up
 * to float summation order for the product and bit for bit for decoding).
 *
 * The file is compiled for the baseline ISA; each kernel carries
 * __attribute__((target(...))) so the binary still starts on CPUs without
 * AVX-512 and only calls these after the startup check.
 * ref: Intel Intrinsics Guide; Intel 64 and IA-32 Architectures
 * Optimization Reference Manual (server cores: two 512-bit FMA pipes, two
 * 512-bit loads per cycle).
 */
#include "simd512.h"

#include "ggml_type.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define INLINE AVX512 static inline __attribute__((always_inline))

/* GCC 12 otherwise turns a loaded vector back into a memory operand of
 * every FMA that uses it (re-loading it R or T times per step: 2 loads per
 * FMA in the 4 x 4 tile, load-bound); an empty asm that "changes" the
 * register keeps it in the register. */
#define PIN(v) __asm__("" : "+v"(v))

/* ------------------------------------------------------------------ */
/* small batches                                                        */

/* Blocking, for Y[t][r] = W[r] . X[t] with W rows and X rows contiguous.
 * Figures: single thread on the 2-core Xeon this was written on (AVX-512
 * with two FMA pipes, 48 KiB L1D, 2 MiB L2, ~20 GB/s read bandwidth from
 * L3 for one core), n = 1024, GFLOP/s = 2 n_rows n n_tok / s.
 *
 *  - register tile: 6 rows x 4 tokens, 24 zmm accumulators. Each k-step
 *    of 16 floats loads 4 X vectors (kept in registers) and 6 W vectors
 *    (one at a time) and issues 24 FMAs: 12 cycles of FMAs against 5 of
 *    loads, so the tile is FMA-bound from L1; 29 of the 32 registers.
 *    Against the 4 x 4 tile first tried (16 FMAs per 4 W + 4 X loads), 6
 *    rows make each X vector, the operand that streams from L2, feed 6
 *    FMAs instead of 4: with the weight in L2 (256 rows) 4 x 4 gave
 *    128-138 at 16-32 tokens, 6 x 4 139-151 (AVX2's 4 x 2 tile: ~63);
 *    with the weight in L3, 6 x 4 was 8-18% faster than 4 x 4 at 16-32
 *    tokens. 8 x 3 (24 accumulators too) needs 32 KiB of W per block and
 *    was no better than 4 x 4.
 *  - row block outer, token tiles inner: the 6 weight rows are read from
 *    memory once and re-read from L1 for every further 4 tokens; X (at
 *    most 128 KiB for 32 tokens of 1024) streams from L2.
 *  - k chunks of at most RXT_KC = 1024 floats (6 rows = 24 KiB of L1):
 *    the rows of a 3584-wide weight would not fit L1 and the tile would
 *    stream W from L2 too; between chunks the accumulators go to a stack
 *    buffer (24 stores + 24 loads per ~800 cycles of FMAs). Chunks of 512
 *    or 768 measured no better on n = 3584 and worse on n = 1024.
 *  - software prefetch (to L2) of the weight piece RXT_PF_DIST = 2 ahead
 *    (next chunk of the same rows, or the rows after), spread over the
 *    token tiles so the weight traffic overlaps the FMAs of the L1-hot
 *    passes. Each 4 KiB row is its own page, which the hardware streamer
 *    does not cross; without the prefetch, 5-15% slower at 8-32 tokens
 *    with the weight in L3 (within noise at 2-4, which are bandwidth-
 *    bound); distance 1 into L1 measured the same within the ~7% noise
 *    of a shared machine.
 *  - horizontal sums once per tile: per group of 4 rows the 16 (token,
 *    row) accumulators are transposed and added in 4 rounds (15 adds, 30
 *    shuffles) into one vector whose lane 4t + r is Y[t][r], so each
 *    token's outputs go out as one masked 128-bit store per 4 rows.
 * Leftover rows (the last block, R < 6) and tokens (T < 4) use the same
 * code with smaller constants. With the weight in L3 (3584 x 1024) the
 * product is bound by L3 bandwidth up to ~8 tokens (20 GB/s = 10 n_tok
 * GFLOP/s), both kernels alike; the tile's advantage shows from 16 up. */

#define RXT_KC 1024             /* max k chunk (floats) */
#define RXT_RM 6                /* tile rows */
#define RXT_TM 4                /* tile tokens */
#define RXT_NT 8                /* tiles per pass over the chunks: the accumulator buffer */
#define RXT_TG (RXT_NT * RXT_TM)        /* tokens per pass (32) */
#ifndef RXT_PF_DIST
#define RXT_PF_DIST 2           /* prefetch this many (row block, chunk) pieces ahead */
#endif
#define RXT_PF_HINT _MM_HINT_T1

/* what a tile prefetches while it runs: npf (0..2) lines per k-step, from
 * rows pf[0..npf) of the next weight piece, up to k offset pf_len */
typedef struct {
    const char *pf[2];
    int npf, pf_len;
} rxt_pf;

/* Weight element types of the tile (constants after inlining): the row
 * vector for k-step i is loaded and widened to 16 floats in registers, so
 * every weight byte is read once per token group and never stored back.
 *  - F32: one load;
 *  - F16: vcvtph2ps from 32 bytes (exact);
 *  - BF16: zero-extend to 32 bits and shift left 16 (exact);
 *  - Q8_0: blocks of 34 bytes (f16 scale d, 32 int8 q): sign-extend 16 q,
 *    convert, multiply by d (exact: |q| <= 127 has 8 bits, d 11), the
 *    value dequant_row gives. The k chunks are multiples of 32 so a k-step
 *    never straddles two blocks. */
enum { RXT_F32, RXT_F16, RXT_BF16, RXT_Q8_0 };

/* bytes from a row's start to element i (i % 32 == 0 for Q8_0) */
INLINE size_t rxt_off(int i, const int TY)
{
    return TY == RXT_F32 ? (size_t)i * 4 : TY == RXT_Q8_0 ? (size_t)(i / 32) * 34 : (size_t)i * 2;
}

/* row's elements [i, i + 16) as floats; i % 16 == 0 */
INLINE __m512 rxt_w(const char *row, int i, const int TY)
{
    if (TY == RXT_F32)
        return _mm512_loadu_ps((const float *)row + i);
    if (TY == RXT_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + (size_t)i * 2)));
    if (TY == RXT_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + (size_t)i * 2))), 16));
    const char *b = row + (size_t)(i / 32) * 34;
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(*(const short *)b));
    const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + (i & 16))));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
}

/* the same for elements [i, i + len), len < 16, zeros after; reads none
 * of the row past i + len */
INLINE __m512 rxt_w_tail(const char *row, int i, int len, const int TY)
{
    const __mmask16 m = (__mmask16)((1u << len) - 1);
    if (TY == RXT_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    if (TY == RXT_F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + (size_t)i * 2));
    if (TY == RXT_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + (size_t)i * 2)), 16));
    const char *b = row + (size_t)(i / 32) * 34;
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(*(const short *)b));
    const __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b + 2 + (i & 16)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
}

/* sum of a with its other 256-bit half, for a's and b's halves:
 * result quads 0,1 hold a's partial sums, quads 2,3 b's */
INLINE __m512 pair_halves(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

/* two such vectors: quads (a.0 + a.1, a.2 + a.3, b.0 + b.1, b.2 + b.3) */
INLINE __m512 pair_quads(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

/* within each 128-bit quad: (a0 + a2, b0 + b2, a1 + a3, b1 + b3) */
INLINE __m512 pair_lanes(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}

/* lane j of the result = sum of the 16 lanes of v[j].
 * Rounds: u[k] holds v[k] (quads 0-1) and v[k + 4] (2-3) for k < 4, v[k + 4]
 * and v[k + 8] for k >= 4; w[p] holds v[p], v[p + 4], v[p + 8], v[p + 12]
 * one per quad; the last two rounds interleave w[0..3] within each quad, so
 * lane 4q + p ends up with the sum of v[4q + p]. */
INLINE __m512 reduce16(const __m512 v[16])
{
    __m512 u[8], w[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        u[k] = pair_halves(v[k], v[k + 4]);
        u[k + 4] = pair_halves(v[k + 8], v[k + 12]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        w[k] = pair_quads(u[k], u[k + 4]);
    return pair_lanes(pair_lanes(w[0], w[2]), pair_lanes(w[1], w[3]));
}

/* one k-step of 16 floats at offset i: acc[r][t] += W[r][i..] X[t][i..].
 * The smaller side is held in registers, the other loaded one vector at a
 * time: R T accumulators + min(R, T) + 1 registers. */
INLINE void rxt_step(const char *W, size_t ldw, const float *X, size_t ldx, size_t xk, int i, __m512 acc[8][4], const int R,
                     const int T, const int TY)
{
    if (T <= R) {
        __m512 x[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            x[t] = _mm512_loadu_ps(X + t * ldx + i * xk);
            PIN(x[t]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 w = rxt_w(W + r * ldw, i, TY);
            PIN(w);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_fmadd_ps(w, x[t], acc[r][t]);
        }
    } else {
        __m512 w[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            w[r] = rxt_w(W + r * ldw, i, TY);
            PIN(w[r]);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 x = _mm512_loadu_ps(X + t * ldx + i * xk);
            PIN(x);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm512_fmadd_ps(w[r], x, acc[r][t]);
        }
    }
}

/* One R x T tile (R <= 8, T <= 4, R T <= 24; constants after inlining) over
 * k in [k0, k1): acc[r][t] += W[r][k] X[t][k]. k1 - k0 is a multiple of 16
 * except at k1 == n, whose tail is read with masked loads (no access past
 * n). buf: the tile's accumulators between chunks; first: start from 0
 * (else from buf); last: reduce and store Y (else save to buf).
 * NPF (constant): prefetches per k-step, see rxt_pf. */
INLINE void rxt_tile(const char *W, size_t ldw, const float *X, size_t ldx, size_t xk, int k0, int k1, float *Y,
                     size_t ldy, size_t ys, __m512 *buf, bool first, bool last, const rxt_pf *p, const int R,
                     const int T, const int NPF, const int TY)
{
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = first ? _mm512_setzero_ps() : buf[4 * r + t];
    const int kend = k0 + ((k1 - k0) & ~15);
    int i = k0;
    if (NPF > 0) {
        /* one line per k-step: F32's next line; the narrower types
         * prefetch some lines twice (the second finds it in flight) */
        const char *pa = p->pf[0], *pb = p->pf[1];
        const int stop = k0 + p->pf_len < kend ? k0 + p->pf_len : kend;
        for (; i < stop; i += 16) {
            const size_t o = TY == RXT_Q8_0 ? (size_t)(i - k0) * 34 / 32 : rxt_off(i - k0, TY);
            _mm_prefetch(pa + o, RXT_PF_HINT);
            if (NPF > 1)
                _mm_prefetch(pb + o, RXT_PF_HINT);
            rxt_step(W, ldw, X, ldx, xk, i, acc, R, T, TY);
        }
    }
    for (; i < kend; i += 16)
        rxt_step(W, ldw, X, ldx, xk, i, acc, R, T, TY);
    if (kend < k1) {
        const __mmask16 m = (__mmask16)((1u << (k1 - kend)) - 1);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512 w = rxt_w_tail(W + r * ldw, kend, k1 - kend, TY);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, X + t * ldx + kend * xk), acc[r][t]);
        }
    }
    if (!last) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                buf[4 * r + t] = acc[r][t];
        return;
    }
    /* rows in groups of 4: reduce16 of v[4t + r'] puts token t's rows in
     * quad t, stored with one masked 128-bit store */
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#pragma GCC unroll 2
    for (int g = 0; g < (R + 3) / 4; g++) {
        __m512 v[16];
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++)
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                v[4 * t + q] = t < T && 4 * g + q < R ? acc[4 * g + q][t] : _mm512_setzero_ps();
        const __m512 s = reduce16(v);
        const int nr = R - 4 * g < 4 ? R - 4 * g : 4;
        const __mmask8 rm = (__mmask8)((1u << nr) - 1);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 q = t ? _mm512_permutexvar_ps(_mm512_add_epi32(lane, _mm512_set1_epi32(4 * t)), s) : s;
            if (ys == 1) {
                _mm_mask_storeu_ps(Y + t * ldy + 4 * g, rm, _mm512_castps512_ps128(q));
            } else {                    /* rows ys apart */
                float o[4];
                _mm_storeu_ps(o, _mm512_castps512_ps128(q));
                for (int j = 0; j < nr; j++)
                    Y[t * ldy + (4 * g + j) * ys] = o[j];
            }
        }
    }
}

/* Rows [0, R) x tokens [0, n_tok <= RXT_TG) over k in [k0, k1): every
 * token block of RXT_TM (and the leftover block) runs one tile. Full row
 * blocks prefetch, the last partial one does not (nothing follows it). */
#define RXT_TILE_PF(R_, T_, NPF_)                                                                         \
    rxt_tile(W, ldw, X + (size_t)t * xt, ldx, xk, k0, k1, Y + (size_t)t * ldy, ldy, ys,                      \
             buf + (t / RXT_TM) * (4 * RXT_RM), first, last, &pf[t / RXT_TM], R_, T_, NPF_, TY)
#define RXT_TILE(R_, T_)                                    \
    do {                                                    \
        if ((R_) < RXT_RM || pf[t / RXT_TM].npf == 0)       \
            RXT_TILE_PF(R_, T_, 0);                         \
        else if (pf[t / RXT_TM].npf == 1)                   \
            RXT_TILE_PF(R_, T_, 1);                         \
        else                                                \
            RXT_TILE_PF(R_, T_, 2);                         \
    } while (0)
#define RXT_ROWS(R_)                                        \
    for (; t + 4 <= n_tok; t += 4)                          \
        RXT_TILE(R_, 4);                                    \
    switch (n_tok - t) {                                    \
    case 3: RXT_TILE(R_, 3); break;                         \
    case 2: RXT_TILE(R_, 2); break;                         \
    case 1: RXT_TILE(R_, 1); break;                         \
    default: break;                                         \
    }
_Static_assert(RXT_RM == 6 && RXT_TM == 4, "rxt_chunk's cases and RXT_ROWS spell out the 6 x 4 tile");

INLINE void rxt_chunk(const char *W, size_t ldw, int R, const float *X, size_t ldx, size_t xt, size_t xk,
                      int n_tok, int k0, int k1, float *Y, size_t ldy, size_t ys, __m512 *buf, bool first,
                      bool last, const rxt_pf *pf, const int TY)
{
    int t = 0;
    switch (R) {
    case 6: RXT_ROWS(6) break;
    case 5: RXT_ROWS(5) break;
    case 4: RXT_ROWS(4) break;
    case 3: RXT_ROWS(3) break;
    case 2: RXT_ROWS(2) break;
    default: RXT_ROWS(1) break;
    }
}

/* Spread the next weight piece (rows nw[0..nr) of len floats) over the nb
 * tiles of a chunk: one row per tile when there are enough tiles, else two
 * (with too few tiles the rest is left to the hardware prefetcher). */
static void rxt_plan_prefetch(rxt_pf pf[RXT_NT], int nb, const char *nw, size_t ldw, int nr, int len)
{
    const int per = nb >= nr ? 1 : 2;
    for (int j = 0; j < nb; j++) {
        const int r0 = j * per;
        pf[j].npf = r0 < nr ? per : 0;
        pf[j].pf_len = len;
        for (int k = 0; k < 2; k++) {
            const int r = r0 + k % per;
            pf[j].pf[k] = nw + (size_t)(r < nr ? r : nr > 0 ? nr - 1 : 0) * ldw;
        }
    }
}

/* X's token t, k-step i (i % 16 == 0) at X + t * xt + i * xk, its tile's
 * next token ldx further: plain rows (ldx, ldx, 1) or packed panels (16,
 * n rounded up to 16, 4). W: elements of type TY. n_blk row blocks of R
 * rows: block b's row j at W + b bs + j rs (bytes), its outputs at
 * Y[t ldy + b yb + j ys]. k chunks of kc (n_chunk of them). */
INLINE void rxt_span(const char *W, size_t rs, size_t bs, int n_blk, int R, const float *X, size_t ldx, size_t xt,
                     size_t xk, int n_tok, int n, int kc, int n_chunk, float *Y, size_t ldy, size_t yb, size_t ys,
                     __m512 *buf, const int TY)
{
    rxt_pf pf[RXT_NT];
    for (int b = 0; b < n_blk; b++) {
        const char *Wr = W + (size_t)b * bs;
        for (int t0 = 0; t0 < n_tok; t0 += RXT_TG) {
            const int nt = n_tok - t0 < RXT_TG ? n_tok - t0 : RXT_TG, nb = (nt + RXT_TM - 1) / RXT_TM;
            const bool last_group = t0 + RXT_TG >= n_tok;
            for (int k0 = 0; k0 < n; k0 += kc) {
                const int k1 = k0 + kc < n ? k0 + kc : n;
                /* the piece RXT_PF_DIST ahead in (row block, chunk) order */
                const long tgt = (long)b * n_chunk + k0 / kc + RXT_PF_DIST;
                const int pb = (int)(tgt / n_chunk), pk = (int)(tgt % n_chunk) * kc;
                if (last_group && pb < n_blk)
                    rxt_plan_prefetch(pf, nb, W + (size_t)pb * bs + rxt_off(pk, TY), rs, R, n - pk < kc ? n - pk : kc);
                else
                    rxt_plan_prefetch(pf, nb, Wr, rs, 0, 0);
                rxt_chunk(Wr, rs, R, X + (size_t)t0 * xt, ldx, xt, xk, nt, k0, k1, Y + (size_t)t0 * ldy + b * yb, ldy,
                          ys, buf, k0 == 0, k1 == n, pf, TY);
            }
        }
    }
}

/* Rows [0, n_rows), ldw bytes apart. The tile's 6 rows are far apart:
 * with q = n_rows / 6, block o holds rows o, o + q, ..., o + 5q, so each
 * of the 6 is its own sequential stream through its own pages, which the
 * hardware prefetchers follow (as avx2_matvec's four rows); the n_rows %
 * 6 rows left over form one block of adjacent rows. Same sums, same
 * bits; only the order of the rows changes. Measured against adjacent
 * rows (2 threads, 400-600 MiB of weight, one process alternating, 21
 * repetitions, median time new / old): F16 n = 1024 4 tokens 0.58, 8
 * tokens 0.81, n = 3584 4 tokens 0.87; BF16 4 tokens 0.58; Q8_0 2 tokens
 * 0.65, 4 tokens 0.82; F32 2, 4, 8 tokens 0.94, 0.94, 0.97. Where the
 * FMAs bound the tile (F32 at 16 tokens: 1.00-1.05; F16 at 12-16:
 * 1.04-1.13) it does not help. */
INLINE void rxt_rows(const char *W, size_t ldw, int n_rows, const float *X, size_t ldx, size_t xt, size_t xk,
                     int n_tok, int n, float *Y, int ldy, const int TY)
{
    __m512 buf[RXT_NT * 4 * RXT_RM];    /* accumulators of one token group (12 KiB) */
    if (n <= 0) {                       /* empty sums */
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < n_rows; r++)
                Y[(size_t)t * ldy + r] = 0.0f;
        return;
    }
    /* about equal chunks, multiples of 16 (of 32 for Q8_0's blocks), the
     * last one shorter */
    const int kq = TY == RXT_Q8_0 ? 31 : 15;
    const int n_parts = (n + RXT_KC - 1) / RXT_KC;
    const int kc = ((n + n_parts - 1) / n_parts + kq) & ~kq;
    const int n_chunk = (n + kc - 1) / kc;      /* rounding kc up may leave fewer */
    const int q = n_rows / RXT_RM, rest = n_rows - q * RXT_RM;
    if (q > 0)
        rxt_span(W, (size_t)q * ldw, ldw, q, RXT_RM, X, ldx, xt, xk, n_tok, n, kc, n_chunk, Y, (size_t)ldy, 1,
                 (size_t)q, buf, TY);
    if (rest > 0)
        rxt_span(W + (size_t)q * RXT_RM * ldw, ldw, 0, 1, rest, X, ldx, xt, xk, n_tok, n, kc, n_chunk,
                 Y + (size_t)q * RXT_RM, (size_t)ldy, 0, 1, buf, TY);
}

AVX512 void avx512_rows_x_tokens(const float *W, int ldw, int n_rows, const float *X, int ldx, int n_tok, int n,
                                 float *Y, int ldy)
{
    rxt_rows((const char *)W, (size_t)ldw * 4, n_rows, X, (size_t)ldx, (size_t)ldx, 1, n_tok, n, Y, ldy, RXT_F32);
}

/* Packed panels: the tile of tokens 4g .. 4g + 3 reads one contiguous
 * panel, k-step by k-step (1 KiB per 4 steps), instead of four rows 4 n
 * bytes apart; rows of 1024 floats put those in the same L1 sets, and
 * the sixteen tokens' rows of one k-step then exceed the 12 ways.
 * Measured (f32 weight, 16 tokens, one process alternating the two, 15
 * repetitions each, median): 1024 x 256 in L2, 1 thread 113 -> 126 and
 * 116 -> 129 GFLOP/s; 600 MiB from DRAM, 2 threads, rows of 1024 120 ->
 * 126 and 121 -> 131, rows of 3584 127 -> 137. Whole F32 model, 2
 * threads, decode steps in alternating turns, per-turn time over the
 * unpacked one (median): 16 sequences 0.90 and 0.91, 8 0.98, 4 0.95. */
static size_t packed_stride(int n)
{
    return (size_t)((n + 15) & ~15);
}

size_t avx512_packed_tokens_floats(int n_tok, int n)
{
    return (size_t)((n_tok + 3) / 4) * 4 * packed_stride(n);
}

AVX512 void avx512_pack_tokens(const float *X, int ldx, int n_tok, int n, float *Xp)
{
    const size_t np = packed_stride(n);
    for (int t = 0; t < (n_tok + 3) / 4 * 4; t++) {
        float *d = Xp + (size_t)(t / 4) * 4 * np + (size_t)(t % 4) * 16;
        if (t >= n_tok) {                       /* the last group's unused slots */
            for (int i = 0; i < (int)np; i += 16)
                _mm512_store_ps(d + (size_t)i * 4, _mm512_setzero_ps());
            continue;
        }
        const float *x = X + (size_t)t * ldx;
        for (int i = 0; i < (int)np; i += 16) {
            const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
            _mm512_store_ps(d + (size_t)i * 4, _mm512_maskz_loadu_ps(m, x + i));
        }
    }
}

AVX512 void avx512_rows_x_tokens_packed(const float *W, int ldw, int n_rows, const float *Xp, int n_tok, int n,
                                        float *Y, int ldy)
{
    rxt_rows((const char *)W, (size_t)ldw * 4, n_rows, Xp, 16, packed_stride(n), 4, n_tok, n, Y, ldy, RXT_F32);
}

/* The other weight types: one instance of the tile code per type */
#define RXT_TYPED(TY_)                                                                                           \
    if (packed)                                                                                                  \
        rxt_rows((const char *)W, row_bytes, n_rows, X, 16, packed_stride(n), 4, n_tok, n, Y, ldy, TY_);         \
    else                                                                                                         \
        rxt_rows((const char *)W, row_bytes, n_rows, X, (size_t)ldx, (size_t)ldx, 1, n_tok, n, Y, ldy, TY_);

AVX512 static void rxt_f16(const void *W, size_t row_bytes, int n_rows, const float *X, int ldx, bool packed,
                           int n_tok, int n, float *Y, int ldy)
{
    RXT_TYPED(RXT_F16)
}

AVX512 static void rxt_bf16(const void *W, size_t row_bytes, int n_rows, const float *X, int ldx, bool packed,
                            int n_tok, int n, float *Y, int ldy)
{
    RXT_TYPED(RXT_BF16)
}

AVX512 static void rxt_q8_0(const void *W, size_t row_bytes, int n_rows, const float *X, int ldx, bool packed,
                            int n_tok, int n, float *Y, int ldy)
{
    RXT_TYPED(RXT_Q8_0)
}

bool avx512_rows_x_tokens_typed_ok(uint32_t type, int n)
{
    return type == GGML_F16 || type == GGML_BF16 || (type == GGML_Q8_0 && n % 32 == 0);
}

void avx512_rows_x_tokens_typed(uint32_t type, const void *W, size_t row_bytes, int n_rows, const float *X, int ldx,
                                bool packed, int n_tok, int n, float *Y, int ldy)
{
    switch (type) {
    case GGML_F16: rxt_f16(W, row_bytes, n_rows, X, ldx, packed, n_tok, n, Y, ldy); break;
    case GGML_BF16: rxt_bf16(W, row_bytes, n_rows, X, ldx, packed, n_tok, n, Y, ldy); break;
    default: rxt_q8_0(W, row_bytes, n_rows, X, ldx, packed, n_tok, n, Y, ldy); break;
    }
}

/* ------------------------------------------------------------------ */
/* Q8_0 rows x int8 activations, decode steps                           */

/* For Q8_0 decode steps (matmul.c q8_act_step: 2-4 tokens with AMX, every
 * size without it): the one-token kernel's
 * arithmetic (quant.h: exact int sums per block, then dw d) for several
 * tokens per pass over the weights. Per row and pair of blocks (68 bytes,
 * one zmm of 64 weights):
 *  - sw = 128 sum(w) per group of 4 (vpdpbusd of 0x80 bytes with w), once
 *    for all tokens; the activations are stored as u = q + 128 (q ^ 0x80),
 *    the unsigned operand vpdpbusd wants, and -sw starts each token's sum:
 *    s = sum u w - 128 sum w = sum q w, exact in int32 (every partial is
 *    below 32 255 128 in magnitude);
 *  - per token: vpdpbusd, convert (exact: |s| < 2^24), multiply the pair's
 *    scales (lanes 0-7 block b, 8-15 block b + 1: dw dx), FMA into the
 *    token's accumulator. 4 uops per token against ~9 shared per row.
 * A tile is 4 rows x up to 4 tokens (16 accumulators, the 4 activation
 * vectors and their 4 scale vectors in registers); from 5 tokens 2 rows x
 * up to 8 (q8_tile_wide). The AMX kernel instead
 * scales every block's 16 x 16 int32 tile whatever the token count, which
 * makes a step of 2-8 tokens cost about two one-token passes.
 * The tile's 4 rows are far apart (as avx2_matvec's). With 4 adjacent
 * rows this kernel was slower than AMX from memory (400 MiB, 2 threads, 2
 * tokens 41.8 against 31.3 ms; perf: the loads of each row's scales
 * missing) though twice as fast in L2; far apart, 14.2 against 27.2 ms
 * (2 tokens) and 20.4 against 32.8 (4 tokens), one process alternating. */

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define INLINE_VNNI AVX512_VNNI static inline __attribute__((always_inline))

size_t avx512_q8_prep_bytes(int n, int n_tok)
{
    const size_t np = (size_t)(n / 32 + 1) / 2;         /* pairs of blocks, the last maybe half */
    return (size_t)n_tok * (np * 64 + np * 64) + 64;
}

/* prep: [n_tok][np] 64-byte vectors of u = q ^ 0x80 (a half pair's upper
 * 32 bytes 0x80: u = 128 is q = 0, and its w is masked to 0 anyway), then
 * [n_tok][np] vectors of 16 floats: d[b] in lanes 0-7, d[b + 1] in 8-15
 * (0 past the last block). Tokens [t0, t1) only: the threads of a step
 * fill disjoint ranges. */
AVX512 void avx512_q8_prepare(const int8_t *xq, const float *xd, int n, int n_tok, int t0, int t1, void *prep)
{
    const int nb = n / 32, np = (nb + 1) / 2, full = nb / 2;    /* pairs with both blocks */
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    uint8_t *u = prep;
    float *dv = (float *)(u + (size_t)n_tok * np * 64);
    for (int t = t0; t < t1; t++) {
        const int8_t *q = xq + (size_t)t * n;
        const float *d = xd + (size_t)t * nb;
        uint8_t *o = u + (size_t)t * np * 64;
        float *dd = dv + (size_t)t * np * 16;
        for (int p = 0; p < full; p++) {
            _mm512_store_si512(o + (size_t)p * 64, _mm512_xor_si512(_mm512_loadu_si512(q + 64 * p), bias));
            _mm512_store_ps(dd + (size_t)p * 16, _mm512_insertf32x8(_mm512_set1_ps(d[2 * p]),
                                                                      _mm256_set1_ps(d[2 * p + 1]), 1));
        }
        if (full < np) {                    /* the last block alone */
            const __m256i lo = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + 64 * full)),
                                                _mm512_castsi512_si256(bias));
            _mm512_store_si512(o + (size_t)full * 64, _mm512_inserti64x4(bias, lo, 0));
            _mm512_store_ps(dd + (size_t)full * 16, _mm512_insertf32x8(_mm512_set1_ps(d[2 * full]),
                                                                         _mm256_setzero_ps(), 1));
        }
    }
}

#ifndef Q8_PF
#define Q8_PF 512
#endif

/* one row's pair of blocks at b0 (or the last block alone, full false,
 * upper half 0): the 64 weights, their two scales widened (lanes 0-7 and
 * 8-15), and -128 sum(w) per group of 4, every token's starting sum */
INLINE_VNNI void q8_pair(const char *b0, bool full, __m512i *w, __m512 *dw, __m512i *nsw)
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m256i h;
    if (full) {
        *w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                _mm256_loadu_si256((const __m256i *)(b0 + 36)), 1);
        h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(*(const short *)b0)),
                                    _mm_set1_epi16(*(const short *)(b0 + 34)), 1);
    } else {
        *w = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2)));
        *w = _mm512_inserti64x4(*w, _mm256_setzero_si256(), 1);
        h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(*(const short *)b0)),
                                    _mm_setzero_si128(), 1);
    }
    *dw = _mm512_cvtph_ps(h);
    *nsw = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, *w));
}

/* R rows rs bytes apart x tokens [0, T) of the prepared activations;
 * row r's outputs at Y[t ldy + r ys] */
INLINE_VNNI void q8_tile(const char *W, size_t rs, int nb, const uint8_t *u, const float *dv, size_t np, float *Y,
                         size_t ldy, size_t ys, const int R, const int T)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int p = 0; 2 * p < nb; p++) {
        const bool full = 2 * p + 1 < nb;
        __m512i x[4];
        __m512 dx[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            x[t] = _mm512_load_si512(u + ((size_t)t * np + p) * 64);
            dx[t] = _mm512_load_ps(dv + ((size_t)t * np + p) * 16);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const char *b0 = W + (size_t)r * rs + (size_t)(2 * p) * 34;
            _mm_prefetch(b0 + Q8_PF, _MM_HINT_T0);
            __m512i w, nsw;
            __m512 dw;
            q8_pair(b0, full, &w, &dw, &nsw);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m512i s = _mm512_dpbusd_epi32(nsw, x[t], w);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx[t]), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            Y[(size_t)t * ldy + (size_t)r * ys] = _mm512_reduce_add_ps(acc[r][t]);
}

/* The wide tile for 5 or more tokens: 2 rows x up to 8 tokens (16
 * accumulators; each token's activations and scales loaded once per pair
 * for both rows). The 4 x 4 tile redoes a row's shared work (loading the
 * pair, widening dw, -128 sum(w): ~9 uops) for every group of 4 tokens;
 * this one once per 8: at 16 tokens 82 uops per row and pair instead of
 * 100. The 16 sums are reduced together (reduce16: lane 8r + t). */
INLINE_VNNI void q8_tile_wide(const char *W, size_t rs, int nb, const uint8_t *u, const float *dv, size_t np,
                              float *Y, size_t ldy, size_t ys, const int R, const int T)
{
    __m512 acc[2][8];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int p = 0; 2 * p < nb; p++) {
        const bool full = 2 * p + 1 < nb;
        __m512i w[2], nsw[2];
        __m512 dw[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const char *b0 = W + (size_t)r * rs + (size_t)(2 * p) * 34;
            _mm_prefetch(b0 + Q8_PF, _MM_HINT_T0);
            q8_pair(b0, full, &w[r], &dw[r], &nsw[r]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512i x = _mm512_load_si512(u + ((size_t)t * np + p) * 64);
            const __m512 dx = _mm512_load_ps(dv + ((size_t)t * np + p) * 16);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m512i s = _mm512_dpbusd_epi32(nsw[r], x, w[r]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
    __m512 v[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        v[j] = j / 8 < R && j % 8 < T ? acc[j / 8][j % 8] : _mm512_setzero_ps();
    float o[16] __attribute__((aligned(64)));
    _mm512_store_ps(o, reduce16(v));
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            Y[(size_t)t * ldy + (size_t)r * ys] = o[8 * r + t];
}

#define Q8_TILE_WIDE(R_)                                                                        \
    do {                                                                                        \
        switch (tt) {                                                                           \
        case 8: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 8); break;       \
        case 7: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 7); break;       \
        case 6: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 6); break;       \
        case 5: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 5); break;       \
        case 4: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 4); break;       \
        case 3: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 3); break;       \
        case 2: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 2); break;       \
        default: q8_tile_wide(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 1); break;      \
        }                                                                                       \
    } while (0)

#define Q8_TILE(R_)                                                                         \
    do {                                                                                    \
        switch (tt) {                                                                       \
        case 4: q8_tile(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 4); break;        \
        case 3: q8_tile(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 3); break;        \
        case 2: q8_tile(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 2); break;        \
        default: q8_tile(Wr, rs, nb, ut, dt, np, Yr, (size_t)ldy, ys, R_, 1); break;       \
        }                                                                                   \
    } while (0)

/* The tile's rows far apart, as avx2_matvec's: with q = n_rows / RB,
 * block o holds rows o, o + q, ...; the n_rows % RB left over adjacent.
 * RB x TB: 4 x 4 (q8_tile) up to 4 tokens, 2 x 8 (q8_tile_wide) from 5;
 * each a constant after inlining. */
INLINE_VNNI void q8_rows(const char *W, size_t rb, int n_rows, int nb, const uint8_t *u, const float *dv, size_t np,
                         int n_tok, float *Y, int ldy, const int RB, const int TB)
{
    const int q = n_rows / RB, n_blk = q + (n_rows % RB != 0);
    for (int o = 0; o < n_blk; o++) {
        const int R = o < q ? RB : n_rows % RB;
        const int r = o < q ? o : RB * q;               /* the block's first row */
        const size_t rs = o < q ? (size_t)q * rb : rb, ys = o < q ? (size_t)q : 1;
        const char *Wr = W + (size_t)r * rb;
        for (int t = 0; t < n_tok; t += TB) {
            const int tt = n_tok - t < TB ? n_tok - t : TB;
            const uint8_t *ut = u + (size_t)t * np * 64;
            const float *dt = dv + (size_t)t * np * 16;
            float *Yr = Y + (size_t)t * ldy + r;
            if (TB == 8) {
                if (R == 2)
                    Q8_TILE_WIDE(2);
                else
                    Q8_TILE_WIDE(1);
                continue;
            }
            switch (R) {
            case 4: Q8_TILE(4); break;
            case 3: Q8_TILE(3); break;
            case 2: Q8_TILE(2); break;
            default: Q8_TILE(1); break;
            }
        }
    }
}

AVX512_VNNI void avx512_q8_0_rows_x_tokens(const void *W, size_t rb, int n_rows, int n, const void *prep, int n_tok,
                                           float *Y, int ldy)
{
    const int nb = n / 32;
    const size_t np = (size_t)(nb + 1) / 2;
    const uint8_t *u = prep;
    const float *dv = (const float *)(u + (size_t)n_tok * np * 64);
    if (n_tok > 4)
        q8_rows((const char *)W, rb, n_rows, nb, u, dv, np, n_tok, Y, ldy, 2, 8);
    else
        q8_rows((const char *)W, rb, n_rows, nb, u, dv, np, n_tok, Y, ldy, 4, 4);
}

/* ------------------------------------------------------------------ */
/* row decoding                                                         */

AVX512 void avx512_dequant_f16(const uint16_t *w, float *out, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i)));
    }
}

/* bf16 is the high half of an f32: widen to 32 bits and shift */
AVX512 void avx512_dequant_bf16(const uint16_t *w, float *out, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + i)));
        _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, w + i));
        _mm512_mask_storeu_ps(out + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
}

/* ------------------------------------------------------------------ */
/* the gated delta rule on a bf16 state                                 */

/* 16 bf16 -> f32 (exact) */
INLINE __m512 bf16x16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* 16 f32 -> bf16 as f32_to_bf16: x + 0x7fff + (bit 16 of x), the high
 * half; a NaN keeps its high half with the quiet bit set */
INLINE void bf16x16_store(uint16_t *p, __m512 x)
{
    const __m512i u = _mm512_castps_si512(x), h = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(h, _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                 _mm512_set1_epi32(0x7f800000));
    const __m512i w = _mm512_mask_or_epi32(r, nan, h, _mm512_set1_epi32(0x40));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(w));
}

/* avx2_dnet_step_bf16's contract (simd.h), 16 lanes: four rows of S at a
 * time, the two passes of avx2_dnet_step (kv_j = decay (S_j . k), d_j =
 * beta (v_j - kv_j), S_j = decay S_j + d_j k, o_j = S_j . q before the
 * rounding store). d_k % 16 == 0 and d_v % 4 == 0. Per head of 128 x 128
 * (2 threads, heads in cache / 4608 heads from DRAM): the AVX2 bf16 step
 * 6.5 / 7.0 us, spent on widening and rounding 8 lanes at a time (blendv);
 * this one 4.4 / 5.0; the f32 step 2.9 / 7.0 (its state is twice the
 * bytes). So the bf16 step is bound by its arithmetic, not by DRAM. */
AVX512 void avx512_dnet_step_bf16(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                                  float g, uint16_t *S, float *o)
{
    const float decay = expf(g);
    const __m512 vdec = _mm512_set1_ps(decay);
    for (int j = 0; j < d_v; j += 4) {
        uint16_t *R[4] = { S + (size_t)j * d_k, S + (size_t)(j + 1) * d_k, S + (size_t)(j + 2) * d_k,
                           S + (size_t)(j + 3) * d_k };
        if (j + 16 + 4 <= d_v)                  /* rows 16 ahead, as avx2_dnet_step's DNET_PF_ROWS */
            for (size_t b = 0; b < 4 * (size_t)d_k * 2; b += 64)
                _mm_prefetch((const char *)(S + (size_t)(j + 16) * d_k) + b, _MM_HINT_T0);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < d_k; i += 16) {
            const __m512 kk = _mm512_loadu_ps(k + i);
            a0 = _mm512_fmadd_ps(bf16x16(R[0] + i), kk, a0);
            a1 = _mm512_fmadd_ps(bf16x16(R[1] + i), kk, a1);
            a2 = _mm512_fmadd_ps(bf16x16(R[2] + i), kk, a2);
            a3 = _mm512_fmadd_ps(bf16x16(R[3] + i), kk, a3);
        }
        const __m512 d0 = _mm512_set1_ps(beta * (v[j] - _mm512_reduce_add_ps(a0) * decay));
        const __m512 d1 = _mm512_set1_ps(beta * (v[j + 1] - _mm512_reduce_add_ps(a1) * decay));
        const __m512 d2 = _mm512_set1_ps(beta * (v[j + 2] - _mm512_reduce_add_ps(a2) * decay));
        const __m512 d3 = _mm512_set1_ps(beta * (v[j + 3] - _mm512_reduce_add_ps(a3) * decay));
        a0 = _mm512_setzero_ps();
        a1 = a0;
        a2 = a0;
        a3 = a0;
        for (int i = 0; i < d_k; i += 16) {
            const __m512 kk = _mm512_loadu_ps(k + i), qq = _mm512_loadu_ps(q + i);
            const __m512 s0 = _mm512_fmadd_ps(kk, d0, _mm512_mul_ps(bf16x16(R[0] + i), vdec));
            const __m512 s1 = _mm512_fmadd_ps(kk, d1, _mm512_mul_ps(bf16x16(R[1] + i), vdec));
            const __m512 s2 = _mm512_fmadd_ps(kk, d2, _mm512_mul_ps(bf16x16(R[2] + i), vdec));
            const __m512 s3 = _mm512_fmadd_ps(kk, d3, _mm512_mul_ps(bf16x16(R[3] + i), vdec));
            bf16x16_store(R[0] + i, s0);
            bf16x16_store(R[1] + i, s1);
            bf16x16_store(R[2] + i, s2);
            bf16x16_store(R[3] + i, s3);
            a0 = _mm512_fmadd_ps(s0, qq, a0);
            a1 = _mm512_fmadd_ps(s1, qq, a1);
            a2 = _mm512_fmadd_ps(s2, qq, a2);
            a3 = _mm512_fmadd_ps(s3, qq, a3);
        }
        o[j] = _mm512_reduce_add_ps(a0);
        o[j + 1] = _mm512_reduce_add_ps(a1);
        o[j + 2] = _mm512_reduce_add_ps(a2);
        o[j + 3] = _mm512_reduce_add_ps(a3);
    }
}

/* simd_amx.c - the AMX kernels declared in simd_amx.h.
 *
 * Why tiles: a decode step of 16 sequences makes every weight row meet 16
 * tokens, so decoding turns from a bandwidth problem into an arithmetic
 * one. With f32 arithmetic (decode Q8_0 to floats, then AVX-512 FMAs) the
 * decoding alone was 15% of a 16-sequence Q8_0 step and the products 27%
 * (perf). TDPBSSD multiplies a 16 x 32 int8 tile of weights by a 32 x 16
 * int8 tile of activations into 16 x 16 int32 sums in one instruction, on
 * the weights as they sit in the file (a block's 32 bytes, rows row_bytes
 * apart, are exactly a tile with that stride), so nothing is decoded.
 * TDPBF16PS does the same for BF16 rows (32 weights per 64 bytes) with
 * f32 sums.
 *
 * Q8_0, per 16-row tile, per block b: C = A_b B_b (exact int32, |C| <=
 * 32 * 128 * 127 < 2^24, so exact as float too); then for each row r
 * acc[r][:] += float(C[r][:]) * (dw[r][b] * dx[:][b]), with acc[r] one
 * AVX-512 register of 16 tokens. Two C tiles alternate between even and
 * odd blocks so one product runs while the other is scaled. BF16: the C
 * tiles accumulate over the whole row, no scaling. More than 16 tokens:
 * each 16-row tile meets every group of 16 while its rows are in cache,
 * so the weights still stream from memory once per call.
 */
#include "simd_amx.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "simd512.h"

#define AMX __attribute__((target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

enum { QK = 32, BLK = 34 };     /* Q8_0: 32 weights and an f16 scale per block */

/* Software prefetch distance in blocks along each of a tile's 16 rows. The
 * tile loads waited on the weights (perf: the samples sat after the A
 * tile's TILELOADD); 16-sequence Q8_0 step, 3 alternating runs each:
 * none 120-124 tok/s, 8 blocks 145-152, 16 blocks 117-151, 32 blocks
 * 138-146. */
#ifndef AMX_PF
#define AMX_PF 8
#endif
/* The same for BF16 rows, in 64-byte chunks. The BF16 kernel takes two
 * chunks per pass and prefetches both lines of the pass AMX_PF_BF16
 * chunks ahead (the next pass). It used to prefetch one line per pass, 4
 * chunks ahead, leaving every other line to the hardware. 16-sequence
 * BF16 step, 2 threads, whole model, one process alternating the variants
 * in 25 turns of 4 steps; per-turn time over the old one, median of each
 * run: both lines 2 ahead 0.86-0.92 (6 runs), 1 ahead 0.91-0.95, 8 ahead
 * 0.93-1.02; one line per pass 2 or 3 ahead 0.94-0.99. */
#ifndef AMX_PF_BF16
#define AMX_PF_BF16 2
#endif
/* F16 rows, one chunk per pass, one line prefetched per row and pass */
#ifndef AMX_PF_F16
#define AMX_PF_F16 4
#endif

/* C [16 rows][16 tokens] (64-byte aligned) -> Y[t][0..16) for t < nt:
 * each token's 16 row sums are one gathered column, one vector store.
 * Scalar stores (256 per tile, each to another token's row of Y) were
 * 29% of the BF16 kernel's samples on 1024-wide rows (perf). */
AMX static inline void store_transposed(const float *c, float *Y, size_t ldy, int nt)
{
    const __m512i col = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(16));
    for (int t = 0; t < nt; t++)
        _mm512_storeu_ps(Y + (size_t)t * ldy, _mm512_i32gather_ps(_mm512_add_epi32(col, _mm512_set1_epi32(t)), c, 4));
}

/* prep, per group of 16 tokens: [nb] B tiles of 8 rows x 64 bytes (row
 * k4, bytes 4t..4t+3 = activations 4 k4 .. 4 k4 + 3 of token t: the layout
 * TDPBSSD reads), then [nb][16] float scales dx[t][b] */
static size_t q8_group_bytes(int n_in)
{
    const size_t nb = (size_t)n_in / QK;
    return nb * 512 + nb * 16 * sizeof(float);
}

size_t amx_q8_0_prep_bytes(int n_in, int n_tok)
{
    return (size_t)((n_tok + 15) / 16) * q8_group_bytes(n_in) + 64;
}

void amx_q8_0_prepare(const int8_t *xq, const float *xd, int n_in, int n_tok, void *prep)
{
    const int nb = n_in / QK;
    for (int g = 0; 16 * g < n_tok; g++) {
        const int nt = n_tok - 16 * g < 16 ? n_tok - 16 * g : 16;
        int8_t *bt = (int8_t *)prep + (size_t)g * q8_group_bytes(n_in);
        float *sx = (float *)(bt + (size_t)nb * 512);
        memset(bt, 0, (size_t)nb * 512);
        for (int t = 0; t < nt; t++) {
            const int8_t *q = xq + (size_t)(16 * g + t) * n_in;
            for (int b = 0; b < nb; b++)
                for (int k4 = 0; k4 < QK / 4; k4++)
                    memcpy(bt + (size_t)b * 512 + k4 * 64 + 4 * t, q + b * QK + 4 * k4, 4);
        }
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < 16; t++)
                sx[(size_t)b * 16 + t] = t < nt ? xd[(size_t)(16 * g + t) * nb + b] : 0.0f;
    }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* scales of block b for the tile's 16 rows: the f16 at the start of each
 * row's block, gathered as dwords (the f16 and the first two weights) */
AMX static inline __m512 row_scales(const char *blk0, __m512i row_off)
{
    __m512i d = _mm512_i32gather_epi32(row_off, blk0, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
}

/* acc[r] += float(C[r]) * (dw[r] * dx) for the 16 rows of one block */
#define SCALE_ROWS(cbuf, dw, dx)                                                              \
    do {                                                                                      \
        float w_[16];                                                                         \
        _mm512_storeu_ps(w_, dw);                                                             \
        for (int r = 0; r < 16; r++)                                                          \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * r)),    \
                                     _mm512_mul_ps(_mm512_set1_ps(w_[r]), dx), acc[r]);       \
    } while (0)

AMX void amx_q8_0_rows_x_tokens(const void *W, size_t row_bytes, int n_rows, int n_in, const void *prep,
                                int n_tok, float *Y, int ldy)
{
    const int nb = n_in / QK;
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {               /* C0, C1: 16 rows x 16 int32 */
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    for (int i = 2; i < 4; i++) {               /* A0, A1: 16 rows x 32 int8 */
        cfg.rows[i] = 16;
        cfg.colsb[i] = QK;
    }
    for (int i = 4; i < 6; i++) {               /* B0, B1: 8 rows x 64 int8 */
        cfg.rows[i] = QK / 4;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    int32_t c0[256] __attribute__((aligned(64))), c1[256] __attribute__((aligned(64)));
    const __m512i row_off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)row_bytes));
    for (int r0 = 0; r0 < n_rows; r0 += 16)
    for (int g = 0; 16 * g < n_tok; g++) {     /* groups of 16 tokens reuse the rows from cache */
        const char *base = (const char *)W + (size_t)r0 * row_bytes;
        const int8_t *bt = (const int8_t *)prep + (size_t)g * q8_group_bytes(n_in);
        const float *sx = (const float *)(bt + (size_t)nb * 512);
        const int nt = n_tok - 16 * g < 16 ? n_tok - 16 * g : 16;
        __m512 acc[16];
        for (int r = 0; r < 16; r++)
            acc[r] = _mm512_setzero_ps();
        int b = 0;
        for (; b + 2 <= nb; b += 2) {
            if (g == 0 && b + AMX_PF < nb)      /* each row's line AMX_PF blocks ahead */
                for (int r = 0; r < 16; r++)
                    _mm_prefetch(base + (size_t)r * row_bytes + (size_t)(b + AMX_PF) * BLK, _MM_HINT_T0);
            _tile_zero(0);
            _tile_loadd(2, base + (size_t)b * BLK + 2, row_bytes);
            _tile_loadd(4, bt + (size_t)b * 512, 64);
            _tile_dpbssd(0, 2, 4);
            _tile_zero(1);
            _tile_loadd(3, base + (size_t)(b + 1) * BLK + 2, row_bytes);
            _tile_loadd(5, bt + (size_t)(b + 1) * 512, 64);
            _tile_dpbssd(1, 3, 5);
            _tile_stored(0, c0, 64);
            SCALE_ROWS(c0, row_scales(base + (size_t)b * BLK, row_off), _mm512_loadu_ps(sx + (size_t)b * 16));
            _tile_stored(1, c1, 64);
            SCALE_ROWS(c1, row_scales(base + (size_t)(b + 1) * BLK, row_off),
                       _mm512_loadu_ps(sx + (size_t)(b + 1) * 16));
        }
        if (b < nb) {                           /* an odd last block */
            _tile_zero(0);
            _tile_loadd(2, base + (size_t)b * BLK + 2, row_bytes);
            _tile_loadd(4, bt + (size_t)b * 512, 64);
            _tile_dpbssd(0, 2, 4);
            _tile_stored(0, c0, 64);
            SCALE_ROWS(c0, row_scales(base + (size_t)b * BLK, row_off), _mm512_loadu_ps(sx + (size_t)b * 16));
        }
        float v[256] __attribute__((aligned(64)));
        for (int r = 0; r < 16; r++)            /* acc[r] lane t -> Y[16 g + t][r0 + r] */
            _mm512_store_ps(v + 16 * r, acc[r]);
        store_transposed(v, Y + (size_t)16 * g * ldy + r0, (size_t)ldy, nt);
    }
    _tile_release();
}

/* ------------------------------------------------------------------ */
/* BF16 weights x bf16 activations                                      */

/* prep, per group of 16 tokens: [n_in / 32] B tiles of 16 rows x 64
 * bytes: row k2, bytes 4t .. 4t + 3 = activations 2 k2 and 2 k2 + 1 of
 * token t as bf16 (the pairs TDPBF16PS multiplies) */
size_t amx_bf16_prep_bytes(int n_in, int n_tok)
{
    return (size_t)((n_tok + 15) / 16) * ((size_t)n_in / 32 * 1024) + 64;
}

/* 16 floats rounded to bf16 exactly as f32_to_bf16 (nearest, ties to
 * even; a NaN stays a NaN with its quiet bit set), in the low halves */
AMX static inline __m512i bf16_round16(const float *x)
{
    const __m512i b = _mm512_castps_si512(_mm512_loadu_ps(x));
    const __m512i hi = _mm512_srli_epi32(b, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, bias), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

/* Per token and chunk of 32 activations the 32 bf16 in order are 16
 * dwords, dword j = the pair (2j, 2j + 1); the tile wants dword j of
 * token t at j * 16 + t, so the 16 x 16 dwords of a chunk are written as
 * rows and read back transposed with gathers. This was a scalar call per
 * activation, run by one thread while the other waited: 4.5% of a
 * 16-sequence BF16 step's samples (perf). With prep_lo, the residuals
 * x - bf16(x) (exact in f32) are rounded and laid out the same way. */
AMX static void transpose_rows(uint32_t (*rows)[16], uint32_t *dst)
{
    const __m512i col = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(16));
    for (int j = 0; j < 16; j++)
        _mm512_storeu_si512(dst + 16 * j, _mm512_i32gather_epi32(_mm512_add_epi32(col, _mm512_set1_epi32(j)), rows, 4));
}

/* bf16 in the low halves of r (as bf16_round16 returns) back to f32 */
AMX static inline __m512 bf16_widen16(__m512i r)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
}

AMX void amx_bf16_prepare(const float *X, int n_in, int n_tok, void *prep, void *prep_lo)
{
    const int nc = n_in / 32;
    uint32_t rows[16][16] __attribute__((aligned(64))), rows_lo[16][16] __attribute__((aligned(64)));
    float res[32] __attribute__((aligned(64)));
    for (int g = 0; 16 * g < n_tok; g++) {
        const int nt = n_tok - 16 * g < 16 ? n_tok - 16 * g : 16;
        uint32_t *bt = (uint32_t *)prep + (size_t)g * nc * 256;
        uint32_t *bl = prep_lo ? (uint32_t *)prep_lo + (size_t)g * nc * 256 : NULL;
        memset(rows, 0, sizeof rows);
        if (bl)
            memset(rows_lo, 0, sizeof rows_lo);
        for (int c = 0; c < nc; c++) {
            for (int t = 0; t < nt; t++) {
                const float *x = X + (size_t)(16 * g + t) * n_in + 32 * c;
                const __m512i r0 = bf16_round16(x), r1 = bf16_round16(x + 16);
                _mm512_store_si512(rows[t], _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(r0)),
                                                               _mm512_cvtepi32_epi16(r1), 1));
                if (bl) {
                    _mm512_store_ps(res, _mm512_sub_ps(_mm512_loadu_ps(x), bf16_widen16(r0)));
                    _mm512_store_ps(res + 16, _mm512_sub_ps(_mm512_loadu_ps(x + 16), bf16_widen16(r1)));
                    _mm512_store_si512(rows_lo[t],
                                       _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(bf16_round16(res))),
                                                          _mm512_cvtepi32_epi16(bf16_round16(res + 16)), 1));
                }
            }
            transpose_rows(rows, bt + (size_t)c * 256);
            if (bl)
                transpose_rows(rows_lo, bl + (size_t)c * 256);
        }
    }
}

AMX void amx_bf16_rows_x_tokens(const void *W, size_t row_bytes, int n_rows, int n_in, const void *prep,
                                int n_tok, float *Y, int ldy)
{
    const int nc = n_in / 32;
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 6; i++) {              /* C0, C1 16 x 16 f32; A0, A1 16 x 32 bf16; B0, B1 */
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    float c0[256] __attribute__((aligned(64))), c1[256] __attribute__((aligned(64)));
    for (int r0 = 0; r0 < n_rows; r0 += 16)
    for (int g = 0; 16 * g < n_tok; g++) {     /* groups of 16 tokens reuse the rows from cache */
        const char *base = (const char *)W + (size_t)r0 * row_bytes;
        const char *bt = (const char *)prep + (size_t)g * nc * 1024;
        const int nt = n_tok - 16 * g < 16 ? n_tok - 16 * g : 16;
        _tile_zero(0);
        _tile_zero(1);
        int c = 0;
        for (; c + 2 <= nc; c += 2) {           /* two accumulators: even and odd chunks */
            if (g == 0 && c + AMX_PF_BF16 + 1 < nc)
                for (int r = 0; r < 16; r++) {
                    const char *pf = base + (size_t)r * row_bytes + (size_t)(c + AMX_PF_BF16) * 64;
                    _mm_prefetch(pf, _MM_HINT_T0);
                    _mm_prefetch(pf + 64, _MM_HINT_T0);
                }
            _tile_loadd(2, base + (size_t)c * 64, row_bytes);
            _tile_loadd(4, bt + (size_t)c * 1024, 64);
            _tile_dpbf16ps(0, 2, 4);
            _tile_loadd(3, base + (size_t)(c + 1) * 64, row_bytes);
            _tile_loadd(5, bt + (size_t)(c + 1) * 1024, 64);
            _tile_dpbf16ps(1, 3, 5);
        }
        if (c < nc) {
            _tile_loadd(2, base + (size_t)c * 64, row_bytes);
            _tile_loadd(4, bt + (size_t)c * 1024, 64);
            _tile_dpbf16ps(0, 2, 4);
        }
        _tile_stored(0, c0, 64);
        _tile_stored(1, c1, 64);
        for (int r = 0; r < 16; r++)            /* C[r] lane t -> Y[16 g + t][r0 + r] */
            _mm512_store_ps(c0 + 16 * r, _mm512_add_ps(_mm512_load_ps(c0 + 16 * r), _mm512_load_ps(c1 + 16 * r)));
        store_transposed(c0, Y + (size_t)16 * g * ldy + r0, (size_t)ldy, nt);
    }
    _tile_release();
}

/* ---- F16 weights ----
 * A row piece of 32 f16 weights w is split exactly into bf16 parts: hi =
 * the top 16 bits of f32(w) (8 of w's 11 significant bits), and w - hi,
 * exact in f32 with at most 3 significant bits, so its top 16 bits are
 * all of it: lo = w - hi. The activations are split too, but not exactly:
 * xh = bf16(x) (nearest even), xl = bf16(x - xh).
 * hi xh + hi xl + lo xh = w (xh + xl) - lo xl, each relative error at most
 * 2^-16, three tile products instead of one, all exact in f32 before the
 * adds. The split of the weights is per tile, in registers, into two
 * 1 KiB buffers that the tile loads read from L1; it is what limits the
 * kernel (in cache, 1024-wide rows, 16 tokens, 2 threads: 22 GB/s of f16
 * weights without it, 15 GB/s with the split and no products). Loading
 * the halves straight into vcvtph2ps and taking hi by a mask, rather than
 * rounding it and widening it back, was 15-20% faster. */
#define AMXF16 __attribute__((target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")))

AMXF16 static inline void f16_split_piece(const char *src, uint16_t *hi, uint16_t *lo)
{
    const __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)src));
    const __m512 b = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 32)));
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    const __m512 ha = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), top));
    const __m512 hb = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b), top));
    /* both conversions are exact: their inputs have no bits below bf16's */
    _mm512_store_si512(hi, (__m512i)_mm512_cvtne2ps_pbh(hb, ha));      /* a in the low half */
    _mm512_store_si512(lo, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha)));
}

size_t amx_f16_prep_bytes(int n_in, int n_tok)
{
    return 2 * ((amx_bf16_prep_bytes(n_in, n_tok) + 63) / 64 * 64);
}

void amx_f16_prepare(const float *X, int n_in, int n_tok, void *prep)
{
    amx_bf16_prepare(X, n_in, n_tok, prep, (char *)prep + amx_f16_prep_bytes(n_in, n_tok) / 2);
}

AMXF16 void amx_f16_rows_x_tokens(const void *W, size_t row_bytes, int n_rows, int n_in, const void *prep,
                                  int n_tok, float *Y, int ldy)
{
    const int nc = n_in / 32;
    const char *prep_lo = (const char *)prep + amx_f16_prep_bytes(n_in, n_tok) / 2;
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 6; i++) {              /* C0, C1 16 x 16 f32; A hi, lo 16 x 32 bf16; B hi, lo */
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    uint16_t wh[16 * 32] __attribute__((aligned(64))), wl[16 * 32] __attribute__((aligned(64)));
    float c0[256] __attribute__((aligned(64))), c1[256] __attribute__((aligned(64)));
    for (int r0 = 0; r0 < n_rows; r0 += 16)
    for (int g = 0; 16 * g < n_tok; g++) {     /* groups of 16 tokens reuse the rows from cache */
        const char *base = (const char *)W + (size_t)r0 * row_bytes;
        const char *bh = (const char *)prep + (size_t)g * nc * 1024, *bl = prep_lo + (size_t)g * nc * 1024;
        const int nt = n_tok - 16 * g < 16 ? n_tok - 16 * g : 16;
        _tile_zero(0);
        _tile_zero(1);
        for (int c = 0; c < nc; c++) {
            if (g == 0 && c + AMX_PF_F16 < nc)
                for (int r = 0; r < 16; r++)
                    _mm_prefetch(base + (size_t)r * row_bytes + (size_t)(c + AMX_PF_F16) * 64, _MM_HINT_T0);
            for (int r = 0; r < 16; r++)
                f16_split_piece(base + (size_t)r * row_bytes + (size_t)c * 64, wh + 32 * r, wl + 32 * r);
            _tile_loadd(2, wh, 64);
            _tile_loadd(3, wl, 64);
            _tile_loadd(4, bh + (size_t)c * 1024, 64);
            _tile_loadd(5, bl + (size_t)c * 1024, 64);
            _tile_dpbf16ps(0, 2, 4);            /* hi xh */
            _tile_dpbf16ps(1, 2, 5);            /* hi xl */
            _tile_dpbf16ps(1, 3, 4);            /* lo xh */
        }
        _tile_stored(0, c0, 64);
        _tile_stored(1, c1, 64);
        for (int r = 0; r < 16; r++)
            _mm512_store_ps(c0 + 16 * r, _mm512_add_ps(_mm512_load_ps(c0 + 16 * r), _mm512_load_ps(c1 + 16 * r)));
        store_transposed(c0, Y + (size_t)16 * g * ldy + r0, (size_t)ldy, nt);
    }
    _tile_release();
}

/* simd_kqtile.c - the int8 prompt tiles of simd_kqtile.h: unpacking K-quant
 * and Q4_0 rows into 16-row panels, and panel x tokens products in a
 * scalar form, on AVX2, AVX-VNNI, AVX-512 and AVX512-VNNI.
 *
 * Owns: the panel layout and the forms of kqtile_mul. Does not own: the
 * block layouts' definitions (docs/models.md section 5; quant.c decodes
 * them too), the activations (quant.h), the row loops (matmul.c).
 *
 * The file is compiled for the baseline ISA; each SIMD form carries
 * __attribute__((target(...))) and is called only when cpu.h says the
 * level is on. The four SIMD forms share one body (simd_kqtile_body.inc)
 * over a few vector macros: the AVX2 and plain AVX-512 forms build
 * vpdpbusd from vpmaddubsw (u8 x s8 pairs in int16: at most
 * 2 * 63 * 127 = 16002, never saturating) and vpmaddwd by ones.
 * ref: Intel Intrinsics Guide; dot_kq_act_ref and dot_q4_0_act_ref
 * (quant.c) for the arithmetic and its order.
 */
#include "simd_kqtile.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "cpu.h"
#include "ggml_type.h"
#include "half.h"
#include "quant.h"

/* the block layouts (docs/models.md section 5) */
typedef struct { uint16_t d; uint8_t qs[16]; } kt_q4_0;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } kt_q4_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } kt_q5_k;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } kt_q6_k;

/* a group's parts (simd_kqtile.h), byte offsets */
#define KQT_SC 4096             /* int32 [16][16] */
#define KQT_MN 5120             /* int32 [8][16] */
#define KQT_DW 5632             /* float [8][16] */
_Static_assert(KQT_DW + 8 * 16 * 4 == KQT_GROUP_BYTES, "group layout");

bool kqtile_fits(uint32_t type, int n)
{
    if (type == GGML_Q4_0)
        return n > 0 && n % 32 == 0;
    return (type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K) && n > 0 && n % 256 == 0;
}

size_t kqtile_panel_bytes(int n)
{
    return (size_t)((n + 255) / 256) * KQT_GROUP_BYTES;
}

/* 4 bytes as one word (little-endian: byte m is bits 8m ..) */
static inline uint32_t kt_w32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Group g (elements 256 g ..) of row i: its unsigned integers as quads
 * (4 elements, one word each, byte m element 4 k + m) at G + 64 k + 4 i,
 * its scale fields into sc [16], mn [8], dw [8]. Each quad is built from
 * word loads of the block: the 4 elements share their nibble (and high
 * bits) positions. */
static void unpack_group(uint32_t type, const void *row, int g, int n, uint8_t *G, int i, int32_t *sc, int32_t *mn,
                         float *dw)
{
    const uint32_t lo4 = 0x0F0F0F0Fu;
    uint8_t *Q = G + 4 * i;
    if (type == GGML_Q4_0) {
        const kt_q4_0 *b = (const kt_q4_0 *)row + 8 * g;
        const int nj = n / 32 - 8 * g < 8 ? n / 32 - 8 * g : 8;
        for (int j = 0; j < nj; j++) {          /* element l: low nibble of qs[l], l + 16: high */
            dw[j] = fp16_to_f32(b[j].d);
            for (int k = 0; k < 4; k++) {
                const uint32_t v = kt_w32(b[j].qs + 4 * k), a = v & lo4, h = (v >> 4) & lo4;
                memcpy(Q + 64 * (8 * j + k), &a, 4);
                memcpy(Q + 64 * (8 * j + 4 + k), &h, 4);
            }
        }
    } else if (type == GGML_Q6_K) {
        const kt_q6_k *b = (const kt_q6_k *)row + g;
        dw[0] = fp16_to_f32(b->d);
        for (int j = 0; j < 16; j++)
            sc[j] = b->scales[j];
        for (int nn = 0; nn < 2; nn++)          /* element 128 nn + 32 k + l */
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l += 4) {
                    const uint32_t lq = (kt_w32(b->ql + 64 * nn + l + 32 * (k & 1)) >> (4 * (k >> 1))) & lo4;
                    const uint32_t hq = ((kt_w32(b->qh + 32 * nn + l) >> (2 * k)) & 0x03030303u) << 4;
                    const uint32_t v = lq | hq;
                    memcpy(Q + 64 * ((128 * nn + 32 * k + l) / 4), &v, 4);
                }
    } else {                                    /* Q4_K, Q5_K */
        const bool five = type == GGML_Q5_K;
        const kt_q4_k *b4 = (const kt_q4_k *)row + g;
        const kt_q5_k *b5 = (const kt_q5_k *)row + g;
        const uint8_t *scales = five ? b5->scales : b4->scales, *qs = five ? b5->qs : b4->qs;
        dw[0] = fp16_to_f32(five ? b5->d : b4->d);
        dw[1] = fp16_to_f32(five ? b5->dmin : b4->dmin);
        for (int s = 0; s < 8; s++) {           /* sub-block s: nibble s & 1 of qs[32 (s / 2) + l] */
            int a, m;
            kq_scale_min(scales, s, &a, &m);
            sc[s] = a;
            mn[s] = m;
            for (int l = 0; l < 32; l += 4) {
                uint32_t v = (kt_w32(qs + 32 * (s / 2) + l) >> (4 * (s & 1))) & lo4;
                if (five)                       /* bit s of qh[l] is bit 4 */
                    v |= ((kt_w32(b5->qh + l) >> s) & 0x01010101u) << 4;
                memcpy(Q + 64 * ((32 * s + l) / 4), &v, 4);
            }
        }
    }
}

void kqtile_unpack(uint32_t type, const void *rows, size_t rb, int nr, int n, void *panel)
{
    const int ng = (n + 255) / 256;
    if (nr < KQT_ROWS)                          /* the missing rows are zeros */
        memset(panel, 0, kqtile_panel_bytes(n));
    for (int g = 0; g < ng; g++) {
        uint8_t *G = (uint8_t *)panel + (size_t)g * KQT_GROUP_BYTES;
        int32_t *SC = (int32_t *)(G + KQT_SC), *MN = (int32_t *)(G + KQT_MN);
        float *DW = (float *)(G + KQT_DW);
        for (int i = 0; i < nr; i++) {
            int32_t sc[16] = { 0 }, mn[8] = { 0 };
            float dw[8] = { 0 };
            unpack_group(type, (const char *)rows + (size_t)i * rb, g, n, G, i, sc, mn, dw);
            for (int j = 0; j < 16; j++)
                SC[16 * j + i] = sc[j];
            for (int j = 0; j < 8; j++) {
                MN[16 * j + i] = mn[j];
                DW[16 * j + i] = dw[j];
            }
        }
    }
}

void kqtile_mul_scalar(uint32_t type, const void *panel, int n, int nr, const int8_t *const *q,
                       const float *const *d, const int16_t *const *bs, int n_tok, float *y, long ldy)
{
    const int ng = (n + 255) / 256, nb = n / 32;
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < nr; i++) {
            float acc = 0.0f;
            for (int g = 0; g < ng; g++) {
                const uint8_t *G = (const uint8_t *)panel + (size_t)g * KQT_GROUP_BYTES;
                const int32_t *sc = (const int32_t *)(G + KQT_SC), *mn = (const int32_t *)(G + KQT_MN);
                const float *dw = (const float *)(G + KQT_DW);
                const int8_t *x = q[t] + 256 * g;
                const int16_t *s16 = bs[t] + 16 * g;
#define KT_W(e) ((int32_t)G[64 * ((e) / 4) + 4 * i + (e) % 4])
                if (type == GGML_Q6_K) {
                    int32_t si = 0;
                    for (int j = 0; j < 16; j++) {
                        int32_t a = 0;
                        for (int l = 16 * j; l < 16 * j + 16; l++)
                            a += KT_W(l) * x[l];
                        si += sc[16 * j + i] * (a - 32 * s16[j]);   /* sc_g (sum q_w q - 32 bsum_g) */
                    }
                    acc += d[t][g] * (dw[i] * (float)si);
                } else if (type == GGML_Q4_0) {
                    const int nj = nb - 8 * g < 8 ? nb - 8 * g : 8;
                    for (int j = 0; j < nj; j++) {
                        int32_t a = 0;
                        for (int l = 32 * j; l < 32 * j + 32; l++)
                            a += KT_W(l) * x[l];
                        a -= 8 * (s16[2 * j] + s16[2 * j + 1]);     /* sum (q_w - 8) q */
                        acc += dw[16 * j + i] * d[t][8 * g + j] * (float)a;
                    }
                } else {
                    int32_t si = 0, sm = 0;
                    for (int s = 0; s < 8; s++) {
                        int32_t a = 0;
                        for (int l = 32 * s; l < 32 * s + 32; l++)
                            a += KT_W(l) * x[l];
                        si += sc[16 * s + i] * a;
                        sm += mn[16 * s + i] * (s16[2 * s] + s16[2 * s + 1]);
                    }
                    acc += d[t][g] * (dw[i] * (float)si - dw[16 + i] * (float)sm);
                }
#undef KT_W
            }
            y[(size_t)t * (size_t)ldy + (size_t)i] = acc;
        }
    }
}

/* one int32 from 4 bytes (the activation quad a lane's 4 products meet) */
static inline int32_t kt_ld32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- AVX2: 8 rows per vector, 4 tokens per tile ---- */

#define AVX2_ATTR __attribute__((target("avx2,fma,f16c")))

AVX2_ATTR static inline __m256i kt_dot256(__m256i acc, __m256i w, __m256i x)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}

#define KT_NAME kqtile_mul_avx2
#define KT_ATTR AVX2_ATTR
#define KT_T 4
#define KT_LANES 8
#define vi __m256i
#define vf __m256
#define KT_LOADI(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define KT_LOADF(p) _mm256_loadu_ps(p)
#define KT_SET1I(v) _mm256_set1_epi32(v)
#define KT_SET1F(v) _mm256_set1_ps(v)
#define KT_ZEROI() _mm256_setzero_si256()
#define KT_ZEROF() _mm256_setzero_ps()
#define KT_ADDI _mm256_add_epi32
#define KT_SUBI _mm256_sub_epi32
#define KT_MULLO _mm256_mullo_epi32
#define KT_CVT _mm256_cvtepi32_ps
#define KT_ADDF _mm256_add_ps
#define KT_SUBF _mm256_sub_ps
#define KT_MULF _mm256_mul_ps
#define KT_STOREF(p, v) _mm256_storeu_ps(p, v)
#define KT_DOT kt_dot256
#include "simd_kqtile_body.inc"
#undef KT_NAME
#undef KT_ATTR
#undef KT_DOT

/* ---- AVX-VNNI: the AVX2 form with vpdpbusd (VEX, 256-bit) ----
 * Alder Lake to Arrow Lake clients and Sierra Forest have it without
 * AVX-512. The same body, macros and tile as the AVX2 form; only the
 * products change, and both sums are exact, so the bits are the same. */

#define AVXVNNI_ATTR __attribute__((target("avx2,fma,f16c,avxvnni")))

AVXVNNI_ATTR static inline __m256i kt_dot256_vnni(__m256i acc, __m256i w, __m256i x)
{
    return _mm256_dpbusd_avx_epi32(acc, w, x);
}

#define KT_NAME kqtile_mul_avxvnni
#define KT_ATTR AVXVNNI_ATTR
#define KT_DOT kt_dot256_vnni
#include "simd_kqtile_body.inc"
#undef KT_NAME
#undef KT_ATTR
#undef KT_DOT
#undef KT_T
#undef KT_LANES
#undef vi
#undef vf
#undef KT_LOADI
#undef KT_LOADF
#undef KT_SET1I
#undef KT_SET1F
#undef KT_ZEROI
#undef KT_ZEROF
#undef KT_ADDI
#undef KT_SUBI
#undef KT_MULLO
#undef KT_CVT
#undef KT_ADDF
#undef KT_SUBF
#undef KT_MULF
#undef KT_STOREF

/* ---- AVX-512: 16 rows per vector, 8 tokens per tile; with and without VNNI ---- */

#define AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define AVX512_VNNI_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512vnni")))

AVX512_ATTR static inline __m512i kt_dot512(__m512i acc, __m512i w, __m512i x)
{
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
}

AVX512_VNNI_ATTR static inline __m512i kt_dot512_vnni(__m512i acc, __m512i w, __m512i x)
{
    return _mm512_dpbusd_epi32(acc, w, x);
}

#define KT_T 8
#define KT_LANES 16
#define vi __m512i
#define vf __m512
#define KT_LOADI(p) _mm512_loadu_si512((const void *)(p))
#define KT_LOADF(p) _mm512_loadu_ps(p)
#define KT_SET1I(v) _mm512_set1_epi32(v)
#define KT_SET1F(v) _mm512_set1_ps(v)
#define KT_ZEROI() _mm512_setzero_si512()
#define KT_ZEROF() _mm512_setzero_ps()
#define KT_ADDI _mm512_add_epi32
#define KT_SUBI _mm512_sub_epi32
#define KT_MULLO _mm512_mullo_epi32
#define KT_CVT _mm512_cvtepi32_ps
#define KT_ADDF _mm512_add_ps
#define KT_SUBF _mm512_sub_ps
#define KT_MULF _mm512_mul_ps
#define KT_STOREF(p, v) _mm512_storeu_ps(p, v)

#define KT_NAME kqtile_mul_avx512
#define KT_ATTR AVX512_ATTR
#define KT_DOT kt_dot512
#include "simd_kqtile_body.inc"
#undef KT_NAME
#undef KT_ATTR
#undef KT_DOT

#define KT_NAME kqtile_mul_avx512_vnni
#define KT_ATTR AVX512_VNNI_ATTR
#define KT_DOT kt_dot512_vnni
#include "simd_kqtile_body.inc"

void kqtile_mul(uint32_t type, const void *panel, int n, int nr, const int8_t *const *q, const float *const *d,
                const int16_t *const *bs, int n_tok, float *y, long ldy)
{
    if (simd_avx512_vnni())
        kqtile_mul_avx512_vnni(type, panel, n, nr, q, d, bs, n_tok, y, ldy);
    else if (simd_avx512())
        kqtile_mul_avx512(type, panel, n, nr, q, d, bs, n_tok, y, ldy);
    else if (simd_vnni())
        kqtile_mul_avxvnni(type, panel, n, nr, q, d, bs, n_tok, y, ldy);
    else if (simd_avx2())
        kqtile_mul_avx2(type, panel, n, nr, q, d, bs, n_tok, y, ldy);
    else
        kqtile_mul_scalar(type, panel, n, nr, q, d, bs, n_tok, y, ldy);
}

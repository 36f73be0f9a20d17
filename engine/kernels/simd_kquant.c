/* simd_kquant.c - the K-quant and Q4_0 int8 dot products of simd_kquant.h.
 *
 * Owns: one row of Q4_K, Q5_K, Q6_K or Q4_0 blocks against activations
 * quantized to int8 (quant.h), on AVX2 and AVX-512, and the AVX2 quantizer
 * of the K-quants' activations. Does not own: the block layouts and the
 * references (quant.c), the choice of kernel (cpu.c), the row loops
 * (matmul.c).
 *
 * The file is compiled for the baseline ISA; each kernel carries
 * __attribute__((target(...))) and is called only after cpu.c's checks.
 *
 * Arithmetic, per super-block of 256 (ref: docs/models.md section 5):
 * the weight's small unsigned integers (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63,
 * Q4_0 0..15) meet the int8 activations in vpmaddubsw (u8 x s8 -> pairs
 * summed in int16: at most 2 * 63 * 127 = 16002, never saturating, as
 * |q| <= 127); the pairs are multiplied by the sub-block's 6- or 8-bit
 * scale and summed in int32 by vpmaddwd (vpdpwssd with VNNI, which adds
 * in the same instruction); the formats' offsets (Q4_K/Q5_K's mins, Q6_K's
 * -32, Q4_0's -8) come from the activations' block sums. The int32 lanes
 * are exact; each super-block's are converted to float once and scaled by
 * d_x d_w (and d_x dmin for the mins).
 * ref: Intel Intrinsics Guide; docs/models.md section 5 (block layouts).
 */
#include "simd_kquant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "ggml_type.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512vnni")))

/* A block's half-precision scale as a float: F16C's vcvtph2ps, inline
 * (every kernel here has f16c), the value half.c's fp16_to_f32 gives; the
 * call to that branchy function cost 2.7% of a Q4_K decode (perf, 1 thread) */
#define H2F(h) _cvtsh_ss(h)

/* the block layouts of quant.c (docs/models.md section 5) */
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_k;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_k;

/* The 8 six-bit scales and 8 mins of a Q4_K/Q5_K super-block, unpacked
 * from its 12 bytes four at a time: out[0..8) = sc, out[8..16) = mn.
 *   s < 4:  sc = b[s] & 63,                        mn = b[s + 4] & 63
 *   s >= 4: sc = (b[s + 4] & 15) | (b[s - 4] >> 6) << 4,
 *           mn = (b[s + 4] >> 4) | (b[s] >> 6) << 4   (ref: kq_scale_min) */
static inline void kq_unpack_scales(const uint8_t *scales, uint8_t out[16])
{
    uint32_t u[3], o[4];
    memcpy(u, scales, 12);
    o[0] = u[0] & 0x3f3f3f3fu;
    o[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
    o[2] = u[1] & 0x3f3f3f3fu;
    o[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
    memcpy(out, o, 16);
}

/* ------------------------------------------------------------------ */
/* AVX2                                                                 */

AVX2 static inline float hsum8_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the sum of 8 int32 lanes (exact: the callers' sums are far from overflow) */
AVX2 static inline int32_t avx2_hsum8_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* d = max|x| / 127 and q = round(x / d) as quantize_act_q8k_ref: the same
 * division, reciprocal and product, rounded to nearest even by cvtps */
AVX2 void avx2_quantize_act_q8k(const float *x, int n, int8_t *q, float *d, int16_t *bsums)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        int8_t *qb = q + 256 * b;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 256; j += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xb + j), absmask));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float db = _mm_cvtss_f32(m4) / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        const __m256 vid = _mm256_set1_ps(id);
        for (int j = 0; j < 256; j += 32) {
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vid));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), vid));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 16), vid));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 24), vid));
            /* bsums: 16 elements are two int32 vectors */
            __m256i s01 = _mm256_add_epi32(i0, i1), s23 = _mm256_add_epi32(i2, i3);
            __m256i h = _mm256_hadd_epi32(s01, s23);              /* per 128-bit lane: pairs of s01, s23 */
            h = _mm256_hadd_epi32(h, h);
            __m128i g = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            bsums[16 * b + j / 16] = (int16_t)_mm_cvtsi128_si32(g);
            bsums[16 * b + j / 16 + 1] = (int16_t)_mm_extract_epi32(g, 1);
            /* packs work per 128-bit lane: a dword permute restores the order */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(qb + j), p);
        }
    }
}

/* kq_unpack_scales in registers, as bytes [sc0..sc7 | mn0..mn7]:
 * the 12 bytes at scales and the 4 after them (Q4_K's qs, Q5_K's qh: in
 * the block) as dwords u0 u1 u2 x, then per dword lane
 *   [u0 & 3f, (u2 & 0f) | (u0 >> 2 & 30), u1 & 3f, (u2 >> 4 & 0f) | (u1 >> 2 & 30)]
 * by two dword shuffles, one variable shift and two masks. The scalar
 * form's four dword stores and its vector load stall on store forwarding;
 * this one measured 23.3 -> 24.7 GB/s of CPU time on Q4_K rows in L2
 * (one thread, AVX512-VNNI, medians of 63); on AVX2, with the mins' sum
 * in one vpmaddwd as well, 8.4 -> 11.7 (Q5_K 9.3 -> 12.0). Written for AVX2; the
 * AVX-512 kernels inline it too (their target includes AVX2). */
AVX2 static inline __m128i kq_scales_v(const uint8_t *scales)
{
    const __m128i u = _mm_loadu_si128((const __m128i *)scales);
    const __m128i a = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0));         /* u0 u2 u1 u2 */
    const __m128i b = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0));         /* u0 u0 u1 u1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* The weights of Q4_K/Q5_K sub-blocks 2j (*lo) and 2j + 1 (*hi), 32
 * bytes each: the low and high nibbles of qs[32j..32j+32), plus (Q5_K, h
 * the 32 bytes of qh, else NULL) bit s of qh[l] as bit 4. Shifts of 16-bit
 * lanes, masked per byte. */
AVX2 static inline void avx2_kq45_w32(const uint8_t *qs, const __m256i *h, int j, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
    *lo = _mm256_and_si256(w, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
    if (h) {
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(*h, 2 * j), one), 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(*h, 2 * j + 1), one), 4));
    }
}

/* The 32 weights (0..63) of Q6_K elements 128n + 32k + [0, 32): the low
 * (k < 2) or high nibbles of ql[64n + 32 (k & 1) + l] | bits 2k, 2k+1 of
 * qh[32n + l] << 4 */
AVX2 static inline __m256i avx2_q6k_w32(const blk_q6_k *b, int n, int k)
{
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n + 32 * (k & 1)));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * n));
    const __m256i nib = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    return _mm256_or_si256(nib, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m2), 4));
}

/* sum_s sc_s sum_l w q and sum_s mn_s bsum_s of one Q4_K/Q5_K super-block;
 * qh NULL for Q4_K. Sub-block 2j is the low nibbles of qs[32j..32j+32),
 * 2j+1 the high ones; Q5_K's bit 4 of sub-block s is bit s of qh[l]. */
AVX2 static inline __m256i avx2_kq45_block(const uint8_t *qs, const uint8_t *qh, const uint8_t sm[16],
                                           const int8_t *q)
{
    const __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        __m256i lo, hi;
        avx2_kq45_w32(qs, qh ? &h : NULL, j, &lo, &hi);
        const __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q + 64 * j)));
        const __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 64 * j + 32)));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(plo, _mm256_set1_epi16(sm[2 * j])));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(phi, _mm256_set1_epi16(sm[2 * j + 1])));
    }
    return sumi;
}

/* Q6_K super-block: 32 elements per step k of each half, weights
 * (ql nibble | 2 bits of qh << 4) in 0..63, two 16-element scales per
 * step; the -32 offset is left to the caller (bsums) */
AVX2 static inline __m256i avx2_q6k_block(const blk_q6_k *b, const int8_t *q)
{
    __m256i sumi = _mm256_setzero_si256();
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 4; k++) {
            const int g = 8 * n + 2 * k;                    /* the scales of elements 128n + 32k + [0, 16), [16, 32) */
            const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(b->scales[g + 1]), _mm_set1_epi16(b->scales[g]));
            const __m256i p = _mm256_maddubs_epi16(avx2_q6k_w32(b, n, k),
                                                   _mm256_loadu_si256((const __m256i *)(q + 128 * n + 32 * k)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
        }
    return sumi;
}

AVX2 float avx2_dot_kq_act(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n)
{
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;               /* the offsets' part: mins (Q4_K/Q5_K) or 32 sum sc bsum (Q6_K) */
    for (int i = 0; i < n / 256; i++) {
        const int8_t *qb = q + 256 * i;
        const int16_t *bs = bsums + 16 * i;
        __m256i sumi;
        float dd, dm;
        int32_t m = 0;
        if (type == GGML_Q6_K) {
            const blk_q6_k *b = (const blk_q6_k *)row + i;
            sumi = avx2_q6k_block(b, qb);
            /* m = sum_g sc_g bsum_g in one vpmaddwd, exact in int32 (|.| <= 2 * 128 * 2032 per lane) */
            m = avx2_hsum8_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales)),
                                                   _mm256_loadu_si256((const __m256i *)bs)));
            dd = d[i] * H2F(b->d);
            dm = 32.0f * dd;
        } else {
            const bool five = type == GGML_Q5_K;
            const blk_q4_k *b4 = (const blk_q4_k *)row + i;
            const blk_q5_k *b5 = (const blk_q5_k *)row + i;
            uint8_t sm[16];
            const __m128i v = kq_scales_v(five ? b5->scales : b4->scales);
            _mm_storeu_si128((__m128i *)sm, v);   /* one vector store: the byte reads below forward from it */
            sumi = avx2_kq45_block(five ? b5->qs : b4->qs, five ? b5->qh : NULL, sm, qb);
            /* m = sum_s mn_s (bs[2s] + bs[2s + 1]): the mins paired [mn0 mn0 mn1 mn1 ..] against the
             * 16 bsums in one vpmaddwd, exact in int32 (|.| <= 2 * 63 * 2032 per lane) */
            const __m128i mn = _mm_unpackhi_epi8(v, _mm_setzero_si128());            /* mn0..mn7 as int16 */
            const __m256i mm2 = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
            m = avx2_hsum8_epi32(_mm256_madd_epi16(mm2, _mm256_loadu_si256((const __m256i *)bs)));
            dd = d[i] * H2F(five ? b5->d : b4->d);
            dm = d[i] * H2F(five ? b5->dmin : b4->dmin);
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(dd), acc);
        off += dm * (float)m;
    }
    return hsum8_ps(acc) - off;
}

/* one Q4_0 block: [low nibbles | high nibbles] are elements [0, 16) and
 * [16, 32); sum (w - 8) q as maddubs(w, q) - maddubs(8, q) in int16
 * (|.| <= 3810 + 2032) */
AVX2 static inline __m256i avx2_q4_0_block(const blk_q4_0 *b, const int8_t *q)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)b->qs), m4 = _mm_set1_epi8(15);
    const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    const __m256i x = _mm256_loadu_si256((const __m256i *)q);
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(w, x), _mm256_maddubs_epi16(_mm256_set1_epi8(8), x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

AVX2 float avx2_dot_q4_0_act(const void *row, const int8_t *q, const float *d, int n)
{
    const blk_q4_0 *b = row;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / 32; i++)
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(avx2_q4_0_block(b + i, q + 32 * i)),
                              _mm256_set1_ps(H2F(b[i].d) * d[i]), acc);
    return hsum8_ps(acc);
}

/* ---- row decoding for the prompt path (sgemm on decoded tiles) ----
 * Bit for bit as dequant_row: the same float operations in the same order,
 * one rounding each (a product, then a difference; no fused multiply-add).
 */

/* y[i] = dd * (v[i] - off) - mm for the 32 unsigned bytes of v, dd = d0
 * for i < 16 and d1 from 16; off != 0: no mm (Q6_K, Q4_0: one product) */
AVX2 static inline void avx2_deq32(__m256i v, int off, float d0, float d1, float mm, float *y)
{
    const __m128i a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
    const __m128i part[4] = { a, _mm_srli_si128(a, 8), b, _mm_srli_si128(b, 8) };
    const __m256 m = _mm256_set1_ps(mm);
    const __m256i o = _mm256_set1_epi32(off);
    for (int k = 0; k < 4; k++) {
        const __m256 d = _mm256_set1_ps(k < 2 ? d0 : d1);
        const __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(part[k]), o));
        _mm256_storeu_ps(y + 8 * k, off ? _mm256_mul_ps(d, f) : _mm256_sub_ps(_mm256_mul_ps(d, f), m));
    }
}

/* ref: deq_q4_k / deq_q5_k (qh NULL for Q4_K): y = (d sc) q - dmin mn */
AVX2 static void avx2_dequant_kq45(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, float d, float dmin,
                                   float *y)
{
    const __m256i h = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    uint8_t sm[16];
    kq_unpack_scales(scales, sm);
    for (int j = 0; j < 4; j++) {
        __m256i lo, hi;
        avx2_kq45_w32(qs, qh ? &h : NULL, j, &lo, &hi);
        const float dlo = d * (float)sm[2 * j], dhi = d * (float)sm[2 * j + 1];
        avx2_deq32(lo, 0, dlo, dlo, dmin * (float)sm[8 + 2 * j], y + 64 * j);
        avx2_deq32(hi, 0, dhi, dhi, dmin * (float)sm[8 + 2 * j + 1], y + 64 * j + 32);
    }
}

/* ref: deq_q6_k: y = (d sc) (q - 32), 16 elements per scale */
AVX2 static void avx2_dequant_q6k(const blk_q6_k *b, float *y)
{
    const float d = H2F(b->d);
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 4; k++) {
            const int g = 8 * n + 2 * k;
            avx2_deq32(avx2_q6k_w32(b, n, k), 32, d * (float)b->scales[g], d * (float)b->scales[g + 1], 0.0f,
                       y + 128 * n + 32 * k);
        }
}

/* ref: dequant_row for Q4_K, Q5_K, Q6_K and Q4_0 (y = d (q - 8)) */
AVX2 void avx2_dequant_kq(uint32_t type, const void *src, float *dst, int n)
{
    switch (type) {
    case GGML_Q4_K:
        for (int i = 0; i < n / 256; i++) {
            const blk_q4_k *b = (const blk_q4_k *)src + i;
            avx2_dequant_kq45(b->scales, b->qs, NULL, H2F(b->d), H2F(b->dmin), dst + 256 * i);
        }
        break;
    case GGML_Q5_K:
        for (int i = 0; i < n / 256; i++) {
            const blk_q5_k *b = (const blk_q5_k *)src + i;
            avx2_dequant_kq45(b->scales, b->qs, b->qh, H2F(b->d), H2F(b->dmin), dst + 256 * i);
        }
        break;
    case GGML_Q6_K:
        for (int i = 0; i < n / 256; i++)
            avx2_dequant_q6k((const blk_q6_k *)src + i, dst + 256 * i);
        break;
    default: {          /* Q4_0 */
        const blk_q4_0 *b = src;
        const __m128i m4 = _mm_set1_epi8(15);
        for (int i = 0; i < n / 32; i++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)b[i].qs);
            const float d = H2F(b[i].d);
            avx2_deq32(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4)), 8, d, d,
                       0.0f, dst + 32 * i);
        }
    }
    }
}

/* ------------------------------------------------------------------ */
/* AVX-512                                                              */

/* The body of each AVX-512 kernel is written once, as a macro over the
 * instruction that scales and accumulates the int16 pairs: vpmaddwd +
 * vpaddd, or AVX512-VNNI's vpdpwssd. Two copies are compiled, each with
 * its target, so the plain one holds no VNNI instruction. */
#define MADD_ACC_PLAIN(acc, p, s) _mm512_add_epi32((acc), _mm512_madd_epi16((p), (s)))
#define MADD_ACC_VNNI(acc, p, s) _mm512_dpwssd_epi32((acc), (p), (s))

/* two 32-byte halves of activations, lo at a and hi at b */
#define LOAD2X256(a, b) \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a))), \
                       _mm256_loadu_si256((const __m256i *)(b)), 1)

/* Q4_K/Q5_K, one register per pair of sub-blocks: the 64 bytes qs[0..64)
 * hold sub-blocks 0 and 2 in their low nibbles (elements [0, 32) and
 * [64, 96)) and 1 and 3 in their high ones; qs[64..128) the same for 4-7.
 * Each register's int16 pairs take a scale vector [sc_a x16 | sc_b x16]
 * (vpermw from the unpacked scales); the mins [mn_s, mn_s] per 16-element
 * bsum go through one vpmaddwd on 256 bits. Q5_K's high bits: qh[l] bit
 * s is bit 4 of element 32s + l, so [qh | qh >> 2] lines them up with the
 * pairs (0|2), shifted right by 1, 4, 5 with (1|3), (4|6), (5|7).
 * Q6_K: register 2h holds elements 128h + [0, 64) (low nibbles of ql,
 * qh bits 0-1 | 2-3), 2h + 1 elements 128h + [64, 128) (high nibbles,
 * bits 4-5 | 6-7); scales per 16 elements, [s x8, s' x8, ..] by vpermw.
 * Each super-block's weights are unpacked once into w[4], sc[4] and then
 * dotted with up to 4 tokens (decode steps); a token's arithmetic is the
 * same whatever the group, so one token alone gives the same bits.
 * Activation register k of a token is its bytes [o[k][0], +32) and
 * [o[k][1], +32). */
/* Q4_K/Q5_K super-block i of a row: its 8 scales and 8 mins as the int16
 * lanes 0..15 of *scm, Q5_K's [qh | qh >> 2] in *H (zeros for Q4_K), the
 * half-precision d and dmin as floats; returns qs. */
#define INLINE512 AVX512 static inline __attribute__((always_inline))

INLINE512 const uint8_t *kq512_head45(const void *row, int i, bool five, __m512i *scm, __m512i *H, float *d,
                                      float *dmin)
{
    const blk_q4_k *b4 = (const blk_q4_k *)row + i;
    const blk_q5_k *b5 = (const blk_q5_k *)row + i;
    *scm = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(kq_scales_v(five ? b5->scales : b4->scales)));
    *H = _mm512_setzero_si512();
    if (five) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b5->qh);
        *H = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    }
    *d = H2F(five ? b5->d : b4->d);
    *dmin = H2F(five ? b5->dmin : b4->dmin);
    return five ? b5->qs : b4->qs;
}

/* the weights of sub-blocks 4h + (0|2) (*lo) and 4h + (1|3) (*hi) */
INLINE512 void kq512_w45(const uint8_t *qs, __m512i H, int h, bool five, __m512i *lo, __m512i *hi)
{
    const __m512i m4 = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1);
    const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * h));
    *lo = _mm512_and_si512(v, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (five) {
        *lo = _mm512_or_si512(*lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(H, 4 * h), one), 4));
        *hi = _mm512_or_si512(*hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(H, 4 * h + 1), one), 4));
    }
}

/* One token (decode): the same arithmetic as KQ512_TOKENS_BODY with n_tok 1
 * (the same bits), written for one token: measured 2x faster there than the
 * token loop (one thread, CPU time, Q4_K 11.0 against 5.3 GB/s). */
#define KQ512_BODY(MADD_ACC)                                                                              \
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);                                       \
    const __m512i i02 = _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,        \
                                         0x0002000200020002, 0, 0, 0, 0);                                    \
    const __m512i i_step = _mm512_set1_epi16(1);                                                             \
    const __m256i imn = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);      \
    const __m512i i6 = _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,         \
                                        0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0);   \
    const __m512i i4 = _mm512_set1_epi16(4);                                                                 \
    __m512 acc = _mm512_setzero_ps();                                                                        \
    __m256 accm = _mm256_setzero_ps();                                                                       \
    (void)m2; (void)i02; (void)i_step; (void)imn; (void)i6; (void)i4;                             \
    for (int i = 0; i < n / 256; i++) {                                                                      \
        const int8_t *qb = q + 256 * i;                                                                      \
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(bsums + 16 * i));                            \
        __m512i sumi = _mm512_setzero_si512();                                                               \
        __m256i msum;                                                                                        \
        float dd, dm;                                                                                        \
        if (type == GGML_Q6_K) {                                                                             \
            const blk_q6_k *b = (const blk_q6_k *)row + i;                                                   \
            /* scales as int16 [s0..s15]; step k's vector [s_4k x8, .., s_4k+3 x8] */                       \
            const __m512i sc = _mm512_castsi256_si512(                                                       \
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales)));                           \
            for (int h = 0; h < 2; h++) {                                                                    \
                const __m512i l = _mm512_loadu_si512((const void *)(b->ql + 64 * h));                        \
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));                    \
                const __m512i H = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1); \
                /* elements 128h + [0, 64): low nibbles, qh bits 0-1 | 2-3 */                                \
                const __m512i wa = _mm512_or_si512(_mm512_and_si512(l, m4),                                  \
                                                   _mm512_slli_epi16(_mm512_and_si512(H, m2), 4));           \
                /* elements 128h + [64, 128): high nibbles, qh bits 4-5 | 6-7 */                             \
                const __m512i wb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),            \
                                                   _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(H, 4), m2), 4)); \
                const __m512i ia = _mm512_add_epi16(i6, _mm512_set1_epi16((short)(8 * h)));                  \
                const __m512i pa = _mm512_maddubs_epi16(wa, _mm512_loadu_si512((const void *)(qb + 128 * h))); \
                const __m512i pb = _mm512_maddubs_epi16(wb, _mm512_loadu_si512((const void *)(qb + 128 * h + 64))); \
                sumi = MADD_ACC(sumi, pa, _mm512_permutexvar_epi16(ia, sc));                                 \
                sumi = MADD_ACC(sumi, pb, _mm512_permutexvar_epi16(_mm512_add_epi16(ia, i4), sc));           \
            }                                                                                                \
            msum = _mm256_madd_epi16(_mm512_castsi512_si256(sc), bs);        /* sum sc bsum */               \
            dd = d[i] * H2F(b->d);                                                                   \
            dm = 32.0f * dd;                                                                                 \
        } else {                                                                                             \
            const bool five = type == GGML_Q5_K;                                                             \
            __m512i scm, H;                                                                                  \
            float dw, dmw;                                                                                   \
            const uint8_t *qs = kq512_head45(row, i, five, &scm, &H, &dw, &dmw);                             \
            for (int h = 0; h < 2; h++) {        /* sub-blocks 4h + (0|2) and 4h + (1|3) */                   \
                __m512i lo, hi;                                                                              \
                kq512_w45(qs, H, h, five, &lo, &hi);                                                         \
                const __m512i ia = _mm512_add_epi16(i02, _mm512_set1_epi16((short)(4 * h)));                 \
                const __m512i plo = _mm512_maddubs_epi16(lo, LOAD2X256(qb + 128 * h, qb + 128 * h + 64));   \
                const __m512i phi = _mm512_maddubs_epi16(hi, LOAD2X256(qb + 128 * h + 32, qb + 128 * h + 96)); \
                sumi = MADD_ACC(sumi, plo, _mm512_permutexvar_epi16(ia, scm));                               \
                sumi = MADD_ACC(sumi, phi, _mm512_permutexvar_epi16(_mm512_add_epi16(ia, i_step), scm));     \
            }                                                                                                \
            msum = _mm256_madd_epi16(_mm256_permutexvar_epi16(imn, _mm512_castsi512_si256(scm)), bs);        \
            dd = d[i] * dw;                                                                                  \
            dm = d[i] * dmw;                                                                                 \
        }                                                                                                    \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(dd), acc);                            \
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dm), accm);                          \
    }                                                                                                        \
    return _mm512_reduce_add_ps(acc) - hsum8_ps(accm)

#define KQ512_TOKENS_BODY(MADD_ACC)                                                                      \
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);                                       \
    const __m512i i02 = _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,        \
                                         0x0002000200020002, 0, 0, 0, 0);                                    \
    const __m512i i6 = _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,         \
                                        0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0);   \
    const __m256i imn = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);      \
    static const int o45[4][2] = { { 0, 64 }, { 32, 96 }, { 128, 192 }, { 160, 224 } };                     \
    static const int o6[4][2] = { { 0, 32 }, { 64, 96 }, { 128, 160 }, { 192, 224 } };                      \
    const bool q6 = type == GGML_Q6_K, five = type == GGML_Q5_K;                                             \
    const int(*o)[2] = q6 ? o6 : o45;                                                                        \
    for (int t0 = 0; t0 < n_tok; t0 += 4) {                                                                  \
        const int nt = n_tok - t0 < 4 ? n_tok - t0 : 4;                                                      \
        __m512 acc[4];                                                                                       \
        __m256 accm[4];                                                                                      \
        for (int t = 0; t < 4; t++) {                                                                        \
            acc[t] = _mm512_setzero_ps();                                                                    \
            accm[t] = _mm256_setzero_ps();                                                                   \
        }                                                                                                    \
        for (int i = 0; i < n / 256; i++) {                                                                  \
            __m512i w[4], sc[4];                                                                             \
            __m256i mv;                     /* times the bsums: Q6_K's scales, Q4_K/Q5_K's mins */           \
            float dd, dm;                   /* the weight's scale of the int sums and of mv . bsums */       \
            if (q6) {                                                                                        \
                const blk_q6_k *b = (const blk_q6_k *)row + i;                                               \
                const __m512i s16 = _mm512_castsi256_si512(                                                  \
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales)));                       \
                for (int h = 0; h < 2; h++) {                                                                \
                    const __m512i l = _mm512_loadu_si512((const void *)(b->ql + 64 * h));                    \
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));                \
                    const __m512i H = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1); \
                    w[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4),                                      \
                                               _mm512_slli_epi16(_mm512_and_si512(H, m2), 4));               \
                    w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),            \
                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(H, 4), m2), 4));                \
                }                                                                                            \
                for (int k = 0; k < 4; k++)                                                                  \
                    sc[k] = _mm512_permutexvar_epi16(_mm512_add_epi16(i6, _mm512_set1_epi16((short)(4 * k))), s16); \
                mv = _mm512_castsi512_si256(s16);                                                            \
                dd = H2F(b->d);                                                                      \
                dm = 0.0f;                      /* Q6_K: 32 dd, rounded per token */                         \
            } else {                                                                                         \
                __m512i scm, H;                                                                              \
                const uint8_t *qs = kq512_head45(row, i, five, &scm, &H, &dd, &dm);                          \
                for (int h = 0; h < 2; h++)      /* sub-blocks 4h + (0|2) and 4h + (1|3) */                  \
                    kq512_w45(qs, H, h, five, &w[2 * h], &w[2 * h + 1]);                                     \
                for (int k = 0; k < 4; k++)      /* [2k' | 2k'+2] + 4h: k = 2h + odd */                      \
                    sc[k] = _mm512_permutexvar_epi16(                                                        \
                        _mm512_add_epi16(i02, _mm512_set1_epi16((short)(4 * (k / 2) + (k & 1)))), scm);       \
                mv = _mm256_permutexvar_epi16(imn, _mm512_castsi512_si256(scm));                             \
            }                                                                                                \
            for (int t = 0; t < nt; t++) {                                                                   \
                const int8_t *qb = q[t0 + t] + 256 * i;                                                      \
                __m512i sumi = _mm512_setzero_si512();                                                       \
                for (int k = 0; k < 4; k++)                                                                  \
                    sumi = MADD_ACC(sumi, _mm512_maddubs_epi16(w[k], LOAD2X256(qb + o[k][0], qb + o[k][1])), sc[k]); \
                const __m256i msum = _mm256_madd_epi16(mv, _mm256_loadu_si256((const __m256i *)(bs[t0 + t] + 16 * i))); \
                const float dx = d[t0 + t][i];                                                               \
                const float sd = dx * dd, sx = q6 ? 32.0f * sd : dx * dm;   /* as KQ512_BODY rounds them */ \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(sd), acc[t]);              \
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(sx), accm[t]);            \
            }                                                                                                \
        }                                                                                                    \
        for (int t = 0; t < nt; t++)                                                                         \
            y[(size_t)(t0 + t) * (size_t)ldy] = _mm512_reduce_add_ps(acc[t]) - hsum8_ps(accm[t]);            \
    }

AVX512 void avx512_dot_kq_act_tokens(uint32_t type, const void *row, int n, const int8_t *const *q,
                                     const float *const *d, const int16_t *const *bs, int n_tok, float *y, long ldy)
{
    KQ512_TOKENS_BODY(MADD_ACC_PLAIN)
}

AVX512_VNNI void avx512_dot_kq_act_tokens_vnni(uint32_t type, const void *row, int n, const int8_t *const *q,
                                               const float *const *d, const int16_t *const *bs, int n_tok, float *y,
                                               long ldy)
{
    KQ512_TOKENS_BODY(MADD_ACC_VNNI)
}

AVX512 float avx512_dot_kq_act(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums,
                               int n)
{
    KQ512_BODY(MADD_ACC_PLAIN);
}

AVX512_VNNI float avx512_dot_kq_act_vnni(uint32_t type, const void *row, const int8_t *q, const float *d,
                                         const int16_t *bsums, int n)
{
    KQ512_BODY(MADD_ACC_VNNI);
}

/* Q4_0, two blocks per register ([block i | block i + 1], each
 * [low nibbles | high nibbles]), sum (w - 8) q as
 * madd(maddubs(w, q) - maddubs(8, q), 1); a last odd block on 256 bits
 * (avx2_q4_0_block, valid under this target). The per-block scale vector
 * [dw dx x8 | dw' dx' x8]. */
#define Q4_0_512_BODY(MADD_ACC)                                                                          \
    const blk_q4_0 *b = row;                                                                                 \
    const __m128i m4 = _mm_set1_epi8(15);                                                                    \
    const __m512i eight = _mm512_set1_epi8(8), ones = _mm512_set1_epi16(1);                                  \
    __m512 acc = _mm512_setzero_ps();                                                                        \
    const int nb = n / 32;                                                                                   \
    int i = 0;                                                                                               \
    for (; i + 2 <= nb; i += 2) {                                                                            \
        const __m128i v0 = _mm_loadu_si128((const __m128i *)b[i].qs);                                        \
        const __m128i v1 = _mm_loadu_si128((const __m128i *)b[i + 1].qs);                                    \
        const __m256i w0 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v0, 4), m4), _mm_and_si128(v0, m4)); \
        const __m256i w1 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v1, 4), m4), _mm_and_si128(v1, m4)); \
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);                             \
        const __m512i x = _mm512_loadu_si512((const void *)(q + 32 * i));                                   \
        const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(w, x), _mm512_maddubs_epi16(eight, x));      \
        const __m512i s = MADD_ACC(_mm512_setzero_si512(), p, ones);                                         \
        const __m512 sc = _mm512_insertf32x8(_mm512_set1_ps(H2F(b[i].d) * d[i]),                      \
                                             _mm256_set1_ps(H2F(b[i + 1].d) * d[i + 1]), 1);          \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc);                                               \
    }                                                                                                        \
    float tail = 0.0f;                                                                                       \
    if (i < nb)                                                                                              \
        tail = hsum8_ps(_mm256_cvtepi32_ps(avx2_q4_0_block(b + i, q + 32 * i))) * (H2F(b[i].d) * d[i]); \
    return _mm512_reduce_add_ps(acc) + tail

AVX512 float avx512_dot_q4_0_act(const void *row, const int8_t *q, const float *d, int n)
{
    Q4_0_512_BODY(MADD_ACC_PLAIN);
}

AVX512_VNNI float avx512_dot_q4_0_act_vnni(const void *row, const int8_t *q, const float *d, int n)
{
    Q4_0_512_BODY(MADD_ACC_VNNI);
}

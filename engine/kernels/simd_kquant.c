/* simd_kquant.c - the K-quant and Q4_0 int8 dot products of simd_kquant.h.
 *
 * Owns: one row of Q4_K, Q5_K, Q6_K or Q4_0 blocks against activations
 * quantized to int8 (quant.h), on AVX2 and AVX-512 (AVX2 also a run of
 * rows per call, AVX-512 several tokens per row), and the AVX2 quantizer
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
#include <stdlib.h>
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

/* ---- the one-token dots on AVX2 ----
 * Per super-block the weights of 32 elements at a time meet the int8
 * activations in vpmaddubsw, the int16 pairs are scaled by their
 * sub-block's scale in vpmaddwd and summed into one int32 vector sumi; the
 * offsets' part (Q4_K/Q5_K: the mins against the bsums, Q6_K: 32 sc
 * against them) is a second int32 vector m from one vpmaddwd. Both are
 * converted and scaled in float into two accumulators, acc += dd sumi and
 * accm += dm m, with no horizontal sum until the row's end: hsum(acc -
 * accm). The scales reach their int16 lanes by one vpshufb each from the
 * super-block's unpacked scale bytes (no scalar byte read, no broadcast
 * from a general register: the kernel this replaced spent 3 operations a
 * scale on it and a horizontal sum per super-block). The type is a
 * constant of each inlined copy.
 * Every row runs the same operations in the same order, so a row's result
 * is the same bits alone (avx2_dot_kq_act) and in a run of rows
 * (avx2_dot_kq_act_rows, the engine's row loop: no call per row). */
#define INLINE2 AVX2 static inline __attribute__((always_inline))
/* the loops over sub-blocks unrolled, so the sub-block index is a constant (-O2 does not) */
#define KQ2_UNROLL _Pragma("GCC unroll 8")

/* vpshufb controls picking int16 lanes out of 16 bytes broadcast to both
 * halves. kq45: the unpacked [sc0..sc7 | mn0..mn7]: sub-block s's scale as
 * 16 words (byte s, zero), and the mins paired [mn0 mn0 .. mn3 mn3 | mn4
 * mn4 .. mn7 mn7] against the 16 bsums. q6: 8 int16 scales (one half of
 * a super-block): word 2k in the low half, word 2k + 1 in the high one. */
#define KQ_W(s) (char)(s), (char)0x80
#define KQ_W8(s) KQ_W(s), KQ_W(s), KQ_W(s), KQ_W(s), KQ_W(s), KQ_W(s), KQ_W(s), KQ_W(s)
#define KQ_P(a, b) (char)(a), (char)(b)
#define KQ_P8(w) KQ_P(2 * (w), 2 * (w) + 1), KQ_P(2 * (w), 2 * (w) + 1), KQ_P(2 * (w), 2 * (w) + 1), \
                 KQ_P(2 * (w), 2 * (w) + 1), KQ_P(2 * (w), 2 * (w) + 1), KQ_P(2 * (w), 2 * (w) + 1), \
                 KQ_P(2 * (w), 2 * (w) + 1), KQ_P(2 * (w), 2 * (w) + 1)
static const char kq2_sci[8][32] __attribute__((aligned(32))) = {
    { KQ_W8(0), KQ_W8(0) }, { KQ_W8(1), KQ_W8(1) }, { KQ_W8(2), KQ_W8(2) }, { KQ_W8(3), KQ_W8(3) },
    { KQ_W8(4), KQ_W8(4) }, { KQ_W8(5), KQ_W8(5) }, { KQ_W8(6), KQ_W8(6) }, { KQ_W8(7), KQ_W8(7) },
};
static const char kq2_mn[32] __attribute__((aligned(32))) = {
    KQ_W(8), KQ_W(8), KQ_W(9), KQ_W(9), KQ_W(10), KQ_W(10), KQ_W(11), KQ_W(11),
    KQ_W(12), KQ_W(12), KQ_W(13), KQ_W(13), KQ_W(14), KQ_W(14), KQ_W(15), KQ_W(15),
};
static const char kq2_q6[4][32] __attribute__((aligned(32))) = {
    { KQ_P8(0), KQ_P8(1) }, { KQ_P8(2), KQ_P8(3) }, { KQ_P8(4), KQ_P8(5) }, { KQ_P8(6), KQ_P8(7) },
};

INLINE2 __m256i kq2_ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* what a super-block's sub-blocks are taken from (kq2_pre): its weights
 * stay in memory (each 32-byte load is one vpmaddubsw's, or two for the
 * two nibbles of Q4_K/Q5_K's qs); its scales are unpacked once:
 * Q4_K/Q5_K vb = [sc0..sc7 | mn0..mn7] in both halves, Q6_K vb / vb2 the
 * int16 scales of halves 0 / 1 in both halves; mv the int16 vector
 * against the 16 bsums; dd, dm the block's factors before the
 * activations' d */
typedef struct {
    const uint8_t *qs, *qh;     /* Q4_K/Q5_K qs (Q6_K ql), Q5_K/Q6_K qh */
    __m256i vb, vb2, mv;
    float dd, dm;
} kq2_sb;

INLINE2 void kq2_pre(uint32_t type, const void *row, int i, kq2_sb *u)
{
    if (type == GGML_Q6_K) {
        const blk_q6_k *b = (const blk_q6_k *)row + i;
        u->qs = b->ql;
        u->qh = b->qh;
        const __m128i s = _mm_loadu_si128((const __m128i *)b->scales);
        u->mv = _mm256_cvtepi8_epi16(s);
        u->vb = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(u->mv));
        u->vb2 = _mm256_permute2x128_si256(u->mv, u->mv, 0x11);
        u->dd = H2F(b->d);
        u->dm = 32.0f * u->dd;
        return;
    }
    const bool five = type == GGML_Q5_K;
    const blk_q4_k *b4 = (const blk_q4_k *)row + i;
    const blk_q5_k *b5 = (const blk_q5_k *)row + i;
    u->qs = five ? b5->qs : b4->qs;
    u->qh = five ? b5->qh : NULL;
    u->vb = _mm256_broadcastsi128_si256(kq_scales_v(five ? b5->scales : b4->scales));
    u->vb2 = u->vb;
    u->mv = _mm256_shuffle_epi8(u->vb, kq2_ld(kq2_mn));
    u->dd = H2F(five ? b5->d : b4->d);
    u->dm = H2F(five ? b5->dmin : b4->dmin);
}

/* the unsigned weights of elements 32s + [0, 32) (s a constant once unrolled):
 * Q4_K/Q5_K: sub-block s is the low (s even) or high nibbles of qs[32 (s / 2) ..]; Q5_K's bit 4
 * is bit s of qh[l], moved there by one 16-bit shift (a bit crossing into the next byte falls
 * outside the 0x10 mask). Q6_K: elements 128n + 32k + l are the low (k < 2) or high nibbles of
 * ql[64n + 32 (k & 1) + l] | bits 2k, 2k+1 of qh[32n + l] << 4. */
INLINE2 __m256i kq2_w(uint32_t type, const kq2_sb *u, int s)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    if (type == GGML_Q6_K) {
        const int n = s / 4, k = s % 4;
        const __m256i l = kq2_ld(u->qs + 64 * n + 32 * (k & 1)), h = kq2_ld(u->qh + 32 * n);
        const __m256i nib = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
        const __m256i hb = k == 0 ? _mm256_slli_epi16(h, 4) : k == 1 ? _mm256_slli_epi16(h, 2)
                         : k == 2 ? h : _mm256_srli_epi16(h, 2);
        return _mm256_or_si256(nib, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    }
    const __m256i w = kq2_ld(u->qs + 32 * (s / 2));
    const __m256i nib = s % 2 ? _mm256_and_si256(_mm256_srli_epi16(w, 4), m4) : _mm256_and_si256(w, m4);
    if (type != GGML_Q5_K)
        return nib;
    const __m256i h = kq2_ld(u->qh);
    const __m256i hb = s < 4 ? _mm256_slli_epi16(h, 4 - s) : s == 4 ? h : _mm256_srli_epi16(h, s - 4);
    return _mm256_or_si256(nib, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
}

/* the int16 scale of each product pair of kq2_w(.., s) */
INLINE2 __m256i kq2_sc(uint32_t type, const kq2_sb *u, int s)
{
    if (type == GGML_Q6_K)
        return _mm256_shuffle_epi8(s < 4 ? u->vb : u->vb2, kq2_ld(kq2_q6[s % 4]));
    return _mm256_shuffle_epi8(u->vb, kq2_ld(kq2_sci[s]));
}

/* a token's products with sub-block s added to its two int32 sums */
INLINE2 void kq2_acc(__m256i w, __m256i sc, const int8_t *q, int s, __m256i *sum)
{
    sum[s % 2] = _mm256_add_epi32(sum[s % 2], _mm256_madd_epi16(_mm256_maddubs_epi16(w, kq2_ld(q + 32 * s)), sc));
}

/* a super-block's end for one token: acc += d dd sumi, accm += d dm m */
INLINE2 void kq2_fin(const kq2_sb *u, const __m256i *sum, const int16_t *bs, float d, __m256 *acc, __m256 *accm)
{
    const __m256i m = _mm256_madd_epi16(u->mv, kq2_ld(bs));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(sum[0], sum[1])), _mm256_set1_ps(d * u->dd), *acc);
    *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(d * u->dm), *accm);
}

/* one row against one token */
INLINE2 float kq2_row(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bs, int n)
{
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int i = 0; i < n / 256; i++) {
        kq2_sb u;
        __m256i sum[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
        kq2_pre(type, row, i, &u);
        KQ2_UNROLL
        for (int s = 0; s < 8; s++)
            kq2_acc(kq2_w(type, &u, s), kq2_sc(type, &u, s), q + 256 * i, s, sum);
        kq2_fin(&u, sum, bs + 16 * i, d[i], &acc, &accm);
    }
    return hsum8_ps(_mm256_sub_ps(acc, accm));
}

/* one row at a time: two rows per pass sharing the activations' loads measured slower
 * (hyserve-kq-rows, L2 Q4_K 15.2 against 16.1 GB/s, Q6_K 17.7 against 20.6; from memory 2.6-6.5
 * against 10.6-14.3: two interleaved streams defeat the prefetcher) */
INLINE2 void kq2_rows(uint32_t type, const char *W, size_t rb, int n_rows, const int8_t *q, const float *d,
                      const int16_t *bs, int n, float *y, long ldy)
{
    for (int r = 0; r < n_rows; r++)
        y[r * ldy] = kq2_row(type, W + (size_t)r * rb, q, d, bs, n);
}

AVX2 float avx2_dot_kq_act(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n)
{
    switch (type) {
    case GGML_Q6_K:
        return kq2_row(GGML_Q6_K, row, q, d, bsums, n);
    case GGML_Q5_K:
        return kq2_row(GGML_Q5_K, row, q, d, bsums, n);
    default:
        return kq2_row(GGML_Q4_K, row, q, d, bsums, n);
    }
}

AVX2 void avx2_dot_kq_act_rows(uint32_t type, const void *W, size_t rb, int n_rows, const int8_t *q, const float *d,
                               const int16_t *bsums, int n, float *y, long ldy)
{
    switch (type) {
    case GGML_Q6_K:
        kq2_rows(GGML_Q6_K, W, rb, n_rows, q, d, bsums, n, y, ldy);
        break;
    case GGML_Q5_K:
        kq2_rows(GGML_Q5_K, W, rb, n_rows, q, d, bsums, n, y, ldy);
        break;
    default:
        kq2_rows(GGML_Q4_K, W, rb, n_rows, q, d, bsums, n, y, ldy);
    }
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

/* ---- K-quants on 512 bits ----
 * Each super-block is unpacked once into four registers w[k] holding the
 * unsigned weights of 64 consecutive elements, 64k + [0, 64), so a
 * token's activations are four plain 64-byte loads, and int16 scale
 * vectors sc[k], one scale per product pair of vpmaddubsw:
 * - Q4_K/Q5_K: elements 64k + [0, 32) are the low nibbles of
 *   qs[32k..32k+32) (sub-block 2k), 64k + [32, 64) their high nibbles
 *   (sub-block 2k + 1): the 32 bytes broadcast to both halves (a load,
 *   no shuffle), the high half shifted right by 4 (vpsrlvw by [0 | 4]),
 *   one AND. Q5_K's bit 4 of element 32s + l is bit s of qh[l]: [qh | qh]
 *   (one broadcast) shifted per half so bits 2k | 2k + 1 land on bit 4,
 *   then one vpternlogd, w | (that & 16).
 *   sc[k] = [sc_2k x16 | sc_2k+1 x16] by vpermw of the unpacked scales
 *   with a constant index; the mins [mn0 mn0 mn1 mn1 .. mn7 mn7] meet the
 *   16 bsums in one 256-bit vpmaddwd.
 * - Q6_K: the low nibbles of ql[64h..64h+64) are elements 128h + [0, 64),
 *   the high ones 128h + [64, 128); bits 4-5 of element 128h + 32c + l
 *   are bits 2c, 2c+1 of qh[32h + l]. H = [qh | qh >> 2] & 0x33 holds
 *   them at bits 0-1 (c = 0, 1) and 4-5 (c = 2, 3), so
 *   w[2h] = m4 ? ql : H << 4 and w[2h+1] = m4 ? ql >> 4 : H, each one
 *   vpternlogd bit select. sc[k] = [s_4k x8, .., s_4k+3 x8] by vpermw.
 * The super-block's [d, dmin] are converted by one vcvtph2ps and scaled by
 * each token's d_x in one vmulps. The type is a constant of each inlined
 * copy (no branch in the loop). Every token runs the same arithmetic, so
 * a token gets the same bits in any group (the decode steps) as alone.
 * Instructions per super-block of the one-token AVX512-VNNI loop (objdump,
 * the loop body): Q4_K 79 -> 51, Q5_K 98 -> 61, Q6_K 67 -> 50 against the
 * kernel this replaced (two 32-byte activation loads and a vinserti64x4
 * per register, index adds, the type branch, scalar scale products).
 * Weight GB/s, one thread pinned, 1024-element rows, hyserve-kq-rows
 * alternating old / new binaries, three runs of medians of 9, load 2.9,
 * median of the runs (range): rows in L2 Q4_K 28.4 -> 35.0 (30.6-35.1),
 * Q5_K 25.3 -> 34.7 (30.9-34.7), Q6_K 43.2 -> 44.7 (44.4-51.8); from
 * memory Q4_K 17.8 -> 28.9 (21.7-29.4), Q5_K and Q6_K within the noise
 * (22-34 both). Decode steps, weights GB/s in L2 (each token's work on
 * top): 4 tokens Q4_K 3.6 -> 13.4, Q6_K 7.9 -> 19.0; 8 tokens Q4_K 2.0 ->
 * 6.8, Q6_K 3.4 -> 9.8; 16 tokens Q4_K 1.0 -> 2.9 (the old body held its
 * 4 tokens' w, sc and accumulators in memory). */
#define INLINE512 AVX512 static inline __attribute__((always_inline))
/* the loops over registers and tokens, unrolled so the arrays stay in registers (-O2 does not) */
#define KQ_UNROLL _Pragma("GCC unroll 8")

/* one super-block unpacked (kq512_unpack): owned by the caller's registers */
typedef struct {
    __m512i w[4];               /* unsigned weights of elements 64k + [0, 64) */
    __m512i sc[4];              /* int16 scale of each product pair of w[k] */
    __m256i mv;                 /* int16 against the 16 bsums: Q4_K/Q5_K's mins paired, Q6_K's scales */
    __m128 dw;                  /* [d, dmin, ..] as floats (Q6_K: [d, ..]) */
} kq512_sb;

#define R8(v) v, v, v, v, v, v, v, v
#define R16(v) R8(v), R8(v)
/* vpermw indices of sc[k]: Q4_K/Q5_K words [2k x16 | 2k+1 x16] of [sc0..sc7 | mn0..mn7];
 * Q6_K [4k x8, 4k+1 x8, 4k+2 x8, 4k+3 x8] of the 16 scales */
static const uint16_t kq512_idx45[4][32] __attribute__((aligned(64))) = {
    { R16(0), R16(1) }, { R16(2), R16(3) }, { R16(4), R16(5) }, { R16(6), R16(7) } };
static const uint16_t kq512_idx6[4][32] __attribute__((aligned(64))) = {
    { R8(0), R8(1), R8(2), R8(3) }, { R8(4), R8(5), R8(6), R8(7) },
    { R8(8), R8(9), R8(10), R8(11) }, { R8(12), R8(13), R8(14), R8(15) } };
#undef R8
#undef R16

INLINE512 void kq512_unpack(const uint32_t type, const void *row, int i, kq512_sb *s)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    if (type == GGML_Q6_K) {
        const blk_q6_k *b = (const blk_q6_k *)row + i;
        const __m512i m33 = _mm512_set1_epi8(0x33);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        KQ_UNROLL
        for (int h = 0; h < 2; h++) {
            const __m512i l = _mm512_loadu_si512((const void *)(b->ql + 64 * h));
            __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
            H = _mm512_and_si512(_mm512_mask_srli_epi16(H, 0xffff0000u, H, 2), m33);    /* [qh | qh >> 2] & 0x33 */
            s->w[2 * h] = _mm512_ternarylogic_epi32(l, _mm512_slli_epi16(H, 4), m4, 0xe4);          /* m4 ? l : H << 4 */
            s->w[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l, 4), H, m4, 0xe4);     /* m4 ? l >> 4 : H */
        }
        KQ_UNROLL
        for (int k = 0; k < 4; k++)
            s->sc[k] = _mm512_permutexvar_epi16(_mm512_load_si512((const void *)kq512_idx6[k]),
                                                _mm512_castsi256_si512(s16));
        s->mv = s16;
        s->dw = _mm_set_ss(H2F(b->d));
    } else {
        const bool five = type == GGML_Q5_K;
        const blk_q4_k *b4 = (const blk_q4_k *)row + i;
        const blk_q5_k *b5 = (const blk_q5_k *)row + i;
        const uint8_t *qs = five ? b5->qs : b4->qs;
        const __m256i sm = _mm256_cvtepu8_epi16(kq_scales_v(five ? b5->scales : b4->scales));  /* sc0..7 mn0..7 */
        const __m512i sh4 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);  /* [0 x16 | 4 x16] */
        const __m512i Hb = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b5->qh))
                                : _mm512_setzero_si512();                                   /* [qh | qh] */
        KQ_UNROLL
        for (int k = 0; k < 4; k++) {
            __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * k)));
            x = _mm512_and_si512(_mm512_srlv_epi16(x, sh4), m4);                            /* [lo | hi] nibbles */
            if (five) {             /* bits 2k | 2k + 1 of qh to bit 4: shifts of [4 | 3], [2 | 1], [0 | -1], [-2 | -3] */
                const __m512i c = _mm512_inserti64x4(_mm512_set1_epi16((short)abs(4 - 2 * k)),
                                                     _mm256_set1_epi16((short)abs(3 - 2 * k)), 1);
                const __m512i hk = k < 2 ? _mm512_sllv_epi16(Hb, c) : _mm512_srlv_epi16(Hb, c);
                x = _mm512_ternarylogic_epi32(x, hk, _mm512_set1_epi8(16), 0xf8);         /* x | (hk & 16) */
            }
            s->w[k] = x;
            s->sc[k] = _mm512_permutexvar_epi16(_mm512_load_si512((const void *)kq512_idx45[k]),
                                                _mm512_castsi256_si512(sm));
        }
        s->mv = _mm256_permutexvar_epi16(_mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15),
                                         sm);
        uint32_t h2;
        memcpy(&h2, five ? (const void *)b5 : (const void *)b4, 4);     /* d, dmin: the first 4 bytes */
        s->dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)h2));
    }
}

/* token t's part of super-block i: the exact int32 sums sum_k sc[k] . (w[k] q)
 * and mv . bsums, scaled by d_x d (acc) and d_x dmin, or 32 d_x d for Q6_K
 * (accm, subtracted at the end) */
#define KQ512_TOKEN(MADD_ACC, q6, s, qb, bsb, dx, acc, accm)                                                  \
    do {                                                                                                     \
        __m512i sumi_ = _mm512_madd_epi16(_mm512_maddubs_epi16((s).w[0], _mm512_loadu_si512((const void *)(qb))), \
                                          (s).sc[0]);                                                        \
        KQ_UNROLL for (int k_ = 1; k_ < 4; k_++)                                                                     \
            sumi_ = MADD_ACC(sumi_, _mm512_maddubs_epi16((s).w[k_], _mm512_loadu_si512((const void *)((qb) + 64 * k_))), \
                             (s).sc[k_]);                                                                    \
        const __m256i msum_ = _mm256_madd_epi16((s).mv, _mm256_loadu_si256((const __m256i *)(bsb)));         \
        const __m128 f_ = _mm_mul_ps((s).dw, _mm_set1_ps(dx));             /* [d_x d, d_x dmin] */          \
        const __m256 fm_ = _mm256_broadcastss_ps((q6) ? _mm_mul_ss(f_, _mm_set_ss(32.0f)) : _mm_movehdup_ps(f_)); \
        (acc) = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi_), _mm512_broadcastss_ps(f_), (acc));                 \
        (accm) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum_), fm_, (accm));                                     \
    } while (0)

/* at most this many tokens share one unpack of each super-block: 8 tokens'
 * accumulators (8 zmm + 8 ymm) and the unpacked w[4], sc[4] fit the 32
 * registers */
#define KQ512_GROUP 8

/* The kernels of one instruction set: kq512_group##SFX, NT tokens (a
 * constant of each copy) of one type (also a constant) against one row;
 * the one-token kernel is its NT = 1 copy, the decode steps take groups of
 * up to KQ512_GROUP. */
#define KQ512_KERNELS(SFX, ATTR, MADD_ACC)                                                                   \
    ATTR static inline __attribute__((always_inline)) void kq512_group##SFX(                                \
        const uint32_t type, const void *row, int n, const int8_t *const *q, const float *const *d,           \
        const int16_t *const *bs, const int NT, float *y, long ldy)                                           \
    {                                                                                                        \
        __m512 acc[KQ512_GROUP];                                                                             \
        __m256 accm[KQ512_GROUP];                                                                            \
        KQ_UNROLL for (int t = 0; t < NT; t++) {                                                                       \
            acc[t] = _mm512_setzero_ps();                                                                    \
            accm[t] = _mm256_setzero_ps();                                                                   \
        }                                                                                                    \
        for (int i = 0; i < n / 256; i++) {                                                                  \
            kq512_sb s;                                                                                      \
            kq512_unpack(type, row, i, &s);                                                                  \
            KQ_UNROLL for (int t = 0; t < NT; t++)                                                                     \
                KQ512_TOKEN(MADD_ACC, type == GGML_Q6_K, s, q[t] + 256 * i, bs[t] + 16 * i, d[t][i], acc[t],  \
                            accm[t]);                                                                        \
        }                                                                                                    \
        KQ_UNROLL for (int t = 0; t < NT; t++)                                                                         \
            y[(size_t)t * (size_t)ldy] = _mm512_reduce_add_ps(acc[t]) - hsum8_ps(accm[t]);                   \
    }                                                                                                        \
                                                                                                             \
    /* nt (1..KQ512_GROUP) tokens: one copy per type and count */                                            \
    ATTR static void kq512_tokens##SFX(uint32_t type, const void *row, int n, const int8_t *const *q,         \
                                       const float *const *d, const int16_t *const *bs, int nt, float *y,     \
                                       long ldy)                                                             \
    {                                                                                                        \
        switch (type * 16 + (uint32_t)nt) {                                                                  \
        KQ512_CASES(SFX, GGML_Q4_K)                                                                          \
        KQ512_CASES(SFX, GGML_Q5_K)                                                                          \
        KQ512_CASES(SFX, GGML_Q6_K)                                                                          \
        default:                                                                                             \
            break;                                                                                           \
        }                                                                                                    \
    }                                                                                                        \
                                                                                                             \
    ATTR void avx512_dot_kq_act_tokens##SFX(uint32_t type, const void *row, int n, const int8_t *const *q,    \
                                            const float *const *d, const int16_t *const *bs, int n_tok,       \
                                            float *y, long ldy)                                              \
    {                                                                                                        \
        for (int t0 = 0; t0 < n_tok; t0 += KQ512_GROUP)                                                      \
            kq512_tokens##SFX(type, row, n, q + t0, d + t0, bs + t0,                                         \
                              n_tok - t0 < KQ512_GROUP ? n_tok - t0 : KQ512_GROUP, y + (size_t)t0 * (size_t)ldy, \
                              ldy);                                                                          \
    }                                                                                                        \
                                                                                                             \
    ATTR float avx512_dot_kq_act##SFX(uint32_t type, const void *row, const int8_t *q, const float *d,        \
                                      const int16_t *bsums, int n)                                           \
    {                                                                                                        \
        float y = 0.0f;                                                                                      \
        if (type == GGML_Q4_K)                                                                               \
            kq512_group##SFX(GGML_Q4_K, row, n, &q, &d, &bsums, 1, &y, 1);                                   \
        else if (type == GGML_Q5_K)                                                                          \
            kq512_group##SFX(GGML_Q5_K, row, n, &q, &d, &bsums, 1, &y, 1);                                   \
        else                                                                                                 \
            kq512_group##SFX(GGML_Q6_K, row, n, &q, &d, &bsums, 1, &y, 1);                                   \
        return y;                                                                                            \
    }

#define KQ512_CASE(SFX, T, NT)                                                                               \
    case (T) * 16 + (NT):                                                                                    \
        kq512_group##SFX((T), row, n, q, d, bs, (NT), y, ldy);                                               \
        break;
#define KQ512_CASES(SFX, T)                                                                                  \
    KQ512_CASE(SFX, T, 1) KQ512_CASE(SFX, T, 2) KQ512_CASE(SFX, T, 3) KQ512_CASE(SFX, T, 4)                  \
    KQ512_CASE(SFX, T, 5) KQ512_CASE(SFX, T, 6) KQ512_CASE(SFX, T, 7) KQ512_CASE(SFX, T, 8)

KQ512_KERNELS(, AVX512, MADD_ACC_PLAIN)
KQ512_KERNELS(_vnni, AVX512_VNNI, MADD_ACC_VNNI)

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

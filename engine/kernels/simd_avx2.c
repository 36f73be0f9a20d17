/* simd_avx2.c - the AVX2/FMA/F16C kernels declared in simd.h.
 *
 * Owns: hand-written x86 kernels for decode matrix-vector products (f32,
 * f16, bf16, Q8_0 with f32 or int8 activations), row decoding for the
 * prefill tiles, the small-batch rows x tokens product and the one-token
 * gated delta rule. Does not own: dispatch (cpu.c puts these in the kernel
 * table where simd_avx2(); matmul.c branches on it) or the scalar references (quant.c,
 * deltanet.c), which define the results these must reproduce up to float
 * summation order.
 *
 * The file is compiled for the baseline ISA; each kernel carries
 * __attribute__((target(...))) so the binary still starts on CPUs without
 * AVX2 and only calls these after the startup check.
 * ref: Intel Intrinsics Guide; IEEE 754 binary16 / bfloat16 layouts.
 */
#include "simd.h"
#include "simd_exp.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_type.h"
#include "half.h"
#include "vecmath.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* ------------------------------------------------------------------ */
/* helpers                                                             */

/* sum of the 8 lanes */
AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 bf16 -> 8 f32: the bf16 bits are the high half of the f32 */
AVX2 static inline __m256 load_bf16(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

AVX2 static inline __m256 load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* 8 int8 -> 8 f32 */
AVX2 static inline __m256 load_i8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;      /* as in quant.c */
_Static_assert(sizeof(blk_q8_0) == 34, "Q8_0 block is 34 bytes");

AVX2 static inline float f16_scalar(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* ------------------------------------------------------------------ */
/* dot products, f32 activations                                        */

/* four independent accumulators: FMA latency x throughput = 8 in flight
 * would be ideal, but these run at memory speed, where 4 are plenty */
AVX2 float avx2_dot_f32(const float *w, const float *x, int n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++)
        s += w[i] * x[i];
    return s;
}

/* f16 -> f32 with F16C inside the FMA loop */
AVX2 float avx2_dot_f16(const uint16_t *w, const float *x, int n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(load_f16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(load_f16(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(load_f16(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++)
        s += f16_scalar(w[i]) * x[i];
    return s;
}

AVX2 float avx2_dot_bf16(const uint16_t *w, const float *x, int n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load_bf16(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(load_bf16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(load_bf16(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(load_bf16(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(load_bf16(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++)
        s += bf16_to_f32(w[i]) * x[i];
    return s;
}

/* per block: s_b = sum_j q[j] x[j] in f32 lanes, acc += d_b s_b; two blocks
 * per iteration into two accumulators */
AVX2 float avx2_dot_q8_0(const void *w, const float *x, int n)
{
    const blk_q8_0 *b = w;
    const int nb = n / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        const float *x0 = x + 32 * i, *x1 = x0 + 32;
        __m256 s0 = _mm256_mul_ps(load_i8(b[i].qs), _mm256_loadu_ps(x0));
        __m256 s1 = _mm256_mul_ps(load_i8(b[i + 1].qs), _mm256_loadu_ps(x1));
        s0 = _mm256_fmadd_ps(load_i8(b[i].qs + 8), _mm256_loadu_ps(x0 + 8), s0);
        s1 = _mm256_fmadd_ps(load_i8(b[i + 1].qs + 8), _mm256_loadu_ps(x1 + 8), s1);
        s0 = _mm256_fmadd_ps(load_i8(b[i].qs + 16), _mm256_loadu_ps(x0 + 16), s0);
        s1 = _mm256_fmadd_ps(load_i8(b[i + 1].qs + 16), _mm256_loadu_ps(x1 + 16), s1);
        s0 = _mm256_fmadd_ps(load_i8(b[i].qs + 24), _mm256_loadu_ps(x0 + 24), s0);
        s1 = _mm256_fmadd_ps(load_i8(b[i + 1].qs + 24), _mm256_loadu_ps(x1 + 24), s1);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b[i].d)), s0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b[i + 1].d)), s1, acc1);
    }
    for (; i < nb; i++) {
        const float *x0 = x + 32 * i;
        __m256 s0 = _mm256_mul_ps(load_i8(b[i].qs), _mm256_loadu_ps(x0));
        s0 = _mm256_fmadd_ps(load_i8(b[i].qs + 8), _mm256_loadu_ps(x0 + 8), s0);
        s0 = _mm256_fmadd_ps(load_i8(b[i].qs + 16), _mm256_loadu_ps(x0 + 16), s0);
        s0 = _mm256_fmadd_ps(load_i8(b[i].qs + 24), _mm256_loadu_ps(x0 + 24), s0);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b[i].d)), s0, acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* ------------------------------------------------------------------ */
/* Q8_0 x int8 activations                                              */

/* per block of 32: amax = max |x|; d = amax / 127; q = rint(x / d) with
 * the same float operations as the reference (id = 1 / d, q = rint(x id)),
 * so the two agree bit for bit */
AVX2 void avx2_quantize_act_q8(const float *x, int n, int8_t *q, float *d)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        __m256 vid = _mm256_set1_ps(id);
        /* cvtps rounds to nearest even, as lrintf in the default mode */
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        /* pack 32 x int32 -> int8; packs work per 128-bit lane, so the
         * result is lane-interleaved: fix with a dword permute */
        __m256i p01 = _mm256_packs_epi32(i0, i1);
        __m256i p23 = _mm256_packs_epi32(i2, i3);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), p);
    }
}

/* per block: int32 lanes of sum w q via sign trick + maddubs (|w| is
 * unsigned, q * sign(w) signed; |w| <= 128 and |q| <= 127 keep each int16
 * pair sum <= 2 * 128 * 127 < 32767, so no saturation), madd to int32,
 * convert, scale by dw * dq */
AVX2 float avx2_dot_q8_0_act(const void *w, const int8_t *q, const float *d, int n)
{
    const blk_q8_0 *b = w;
    const int nb = n / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)b[i].qs);
        __m256i w1 = _mm256_loadu_si256((const __m256i *)b[i + 1].qs);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + 32 * i + 32));
        __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x0, w0)), ones);
        __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(x1, w1)), ones);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b[i].d) * d[i]), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b[i + 1].d) * d[i + 1]), _mm256_cvtepi32_ps(p1), acc1);
    }
    for (; i < nb; i++) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)b[i].qs);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x0, w0)), ones);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b[i].d) * d[i]), _mm256_cvtepi32_ps(p0), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* ------------------------------------------------------------------ */
/* matrix-vector: four rows at a time                                   */

/* Four rows stream at once, x loaded once per chunk for the four. The
 * four rows are far apart - row o of each quarter of the block - so each
 * is its own sequential stream through its own pages, which the hardware
 * prefetchers follow; four adjacent short rows share pages and confuse
 * them. Measured (512 MiB f16 and Q8_0-sized rows, 1 thread, against a
 * 17.8 GB/s triad): one row at a time 11 GB/s; four adjacent rows 9-13 GB/s
 * (worst for 1 KiB rows); four far-apart rows 15-17 GB/s. The one-row loop
 * was bound by memory-level parallelism, not arithmetic. Tails (< 8
 * elements, < 4 rows) reuse the one-row kernels above. */

AVX2 void avx2_dot4_f32(const void *const *w, const float *x, int n, float *y)
{
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8) {
        __m256 xx = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xx, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xx, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xx, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xx, a3);
    }
    y[0] = hsum8(a0) + (n8 < n ? avx2_dot_f32(w0 + n8, x + n8, n - n8) : 0.0f);
    y[1] = hsum8(a1) + (n8 < n ? avx2_dot_f32(w1 + n8, x + n8, n - n8) : 0.0f);
    y[2] = hsum8(a2) + (n8 < n ? avx2_dot_f32(w2 + n8, x + n8, n - n8) : 0.0f);
    y[3] = hsum8(a3) + (n8 < n ? avx2_dot_f32(w3 + n8, x + n8, n - n8) : 0.0f);
}

AVX2 static void rows4_f16(const void *const *w, const float *x, int n, float *y)
{
    const uint16_t *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8) {
        __m256 xx = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(load_f16(w0 + i), xx, a0);
        a1 = _mm256_fmadd_ps(load_f16(w1 + i), xx, a1);
        a2 = _mm256_fmadd_ps(load_f16(w2 + i), xx, a2);
        a3 = _mm256_fmadd_ps(load_f16(w3 + i), xx, a3);
    }
    y[0] = hsum8(a0) + (n8 < n ? avx2_dot_f16(w0 + n8, x + n8, n - n8) : 0.0f);
    y[1] = hsum8(a1) + (n8 < n ? avx2_dot_f16(w1 + n8, x + n8, n - n8) : 0.0f);
    y[2] = hsum8(a2) + (n8 < n ? avx2_dot_f16(w2 + n8, x + n8, n - n8) : 0.0f);
    y[3] = hsum8(a3) + (n8 < n ? avx2_dot_f16(w3 + n8, x + n8, n - n8) : 0.0f);
}

AVX2 static void rows4_bf16(const void *const *w, const float *x, int n, float *y)
{
    const uint16_t *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8) {
        __m256 xx = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(load_bf16(w0 + i), xx, a0);
        a1 = _mm256_fmadd_ps(load_bf16(w1 + i), xx, a1);
        a2 = _mm256_fmadd_ps(load_bf16(w2 + i), xx, a2);
        a3 = _mm256_fmadd_ps(load_bf16(w3 + i), xx, a3);
    }
    y[0] = hsum8(a0) + (n8 < n ? avx2_dot_bf16(w0 + n8, x + n8, n - n8) : 0.0f);
    y[1] = hsum8(a1) + (n8 < n ? avx2_dot_bf16(w1 + n8, x + n8, n - n8) : 0.0f);
    y[2] = hsum8(a2) + (n8 < n ? avx2_dot_bf16(w2 + n8, x + n8, n - n8) : 0.0f);
    y[3] = hsum8(a3) + (n8 < n ? avx2_dot_bf16(w3 + n8, x + n8, n - n8) : 0.0f);
}

/* int32 lanes of sum_j w[j] q[j] for one block: the sign trick of
 * avx2_dot_q8_0_act */
AVX2 static inline __m256 q8_block(const int8_t *wq, __m256i xq, __m256i ones)
{
    __m256i w = _mm256_loadu_si256((const __m256i *)wq);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w)), ones));
}

AVX2 static void rows4_q8_0_act(const void *const *w, const int8_t *q, const float *d, int n, float *y)
{
    const blk_q8_0 *b0 = w[0], *b1 = w[1], *b2 = w[2], *b3 = w[3];
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < n / 32; i++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        /* the four rows' scales converted and multiplied together (the same products as one at a
         * time): hyserve-mv-rows q8_0 in L2 25.0-27.0 -> 29.3-29.6 GB/s (one thread, Zen 4 AVX2) */
        __m128i h = _mm_cvtsi32_si128(b0[i].d);
        h = _mm_insert_epi16(h, b1[i].d, 1);
        h = _mm_insert_epi16(h, b2[i].d, 2);
        h = _mm_insert_epi16(h, b3[i].d, 3);
        const __m256 sc = _mm256_castps128_ps256(_mm_mul_ps(_mm_cvtph_ps(h), _mm_set1_ps(d[i])));
        a0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(0)), q8_block(b0[i].qs, xq, ones), a0);
        a1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(1)), q8_block(b1[i].qs, xq, ones), a1);
        a2 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(2)), q8_block(b2[i].qs, xq, ones), a2);
        a3 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(3)), q8_block(b3[i].qs, xq, ones), a3);
    }
    y[0] = hsum8(a0);
    y[1] = hsum8(a1);
    y[2] = hsum8(a2);
    y[3] = hsum8(a3);
}

/* The same sums with AVX-VNNI: vpdpbusd multiplies unsigned by signed
 * bytes and adds groups of four into int32 lanes in one instruction, in
 * place of sign, sign, maddubs and madd. The weight is made unsigned by
 * flipping its top bit (w ^ 0x80 = w + 128), so each lane gets
 * sum (w + 128) q = sum w q + 128 sum q; starting the lanes at
 * 128 sum(-q) (the same instruction on -q, once per block for the four
 * rows) cancels the excess exactly. The four rows' f16 scales are
 * converted together. The integer sums are exact either way, so this
 * gives the same floats as rows4_q8_0_act. Measured (1 thread, 285 MB of
 * Q8_0 rows): 12 GB/s for rows4_q8_0_act, 13-14 GB/s here, 14-19 GB/s for
 * a loop that only loads the same bytes. */
AVX2_VNNI static void rows4_q8_0_vnni(const void *const *w, const int8_t *q, const float *d, const __m256i *starts,
                                     int n, float *y)
{
    const blk_q8_0 *b0 = w[0], *b1 = w[1], *b2 = w[2], *b3 = w[3];
    const __m256i m80 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < n / 32; i++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        const __m256i start = starts ? _mm256_load_si256(starts + i)
                                     : _mm256_dpbusd_avx_epi32(zero, m80, _mm256_sub_epi8(zero, xq));
        __m128i h = _mm_cvtsi32_si128(b0[i].d);
        h = _mm_insert_epi16(h, b1[i].d, 1);
        h = _mm_insert_epi16(h, b2[i].d, 2);
        h = _mm_insert_epi16(h, b3[i].d, 3);
        const __m256 sc = _mm256_castps128_ps256(_mm_mul_ps(_mm_cvtph_ps(h), _mm_set1_ps(d[i])));
#define ROW(b, a, k)                                                                                  \
        {                                                                                             \
            __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)b[i].qs), m80);           \
            __m256i s = _mm256_dpbusd_avx_epi32(start, u, xq);                                        \
            a = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc, _mm256_set1_epi32(k)), _mm256_cvtepi32_ps(s), a); \
        }
        ROW(b0, a0, 0) ROW(b1, a1, 1) ROW(b2, a2, 2) ROW(b3, a3, 3)
#undef ROW
    }
    y[0] = hsum8(a0);
    y[1] = hsum8(a1);
    y[2] = hsum8(a2);
    y[3] = hsum8(a3);
}

/* the blocks' starting sums 128 sum(-q) of rows4_q8_0_vnni, once per activation vector */
#define Q8_STARTS_MAX 512
AVX2_VNNI static void q8_starts(const int8_t *q, int n, __m256i *starts)
{
    const __m256i m80 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    for (int i = 0; i < n / 32; i++)
        starts[i] = _mm256_dpbusd_avx_epi32(zero, m80, _mm256_sub_epi8(zero, _mm256_loadu_si256((const __m256i *)(q + 32 * i))));
}

/* the four far-apart rows w of one group (avx2_matvec), one token */
static void rows4_one(uint32_t type, const void *const *w, const float *x, const int8_t *xq, const float *xd,
                      const __m256i *starts, int n, float *r)
{
    switch (type) {
    case GGML_F32: avx2_dot4_f32(w, x, n, r); break;
    case GGML_F16: rows4_f16(w, x, n, r); break;
    case GGML_BF16: rows4_bf16(w, x, n, r); break;
    default:
        if (cpu_kern.on.vnni)
            rows4_q8_0_vnni(w, xq, xd, starts, n, r);
        else
            rows4_q8_0_act(w, xq, xd, n, r);
        break;
    }
}

/* one row past the groups, one token */
static float row_one(uint32_t type, const void *w, const float *x, const int8_t *xq, const float *xd, int n)
{
    switch (type) {
    case GGML_F32: return avx2_dot_f32(w, x, n);
    case GGML_F16: return avx2_dot_f16(w, x, n);
    case GGML_BF16: return avx2_dot_bf16(w, x, n);
    default: return avx2_dot_q8_0_act(w, xq, xd, n);
    }
}

void avx2_matvec(uint32_t type, const void *W, size_t row_bytes, int n_rows, const float *x, const int8_t *xq,
                 const float *xd, int n, float *y)
{
    const char *base = W;
    const int q = n_rows / 4;
    _Alignas(32) __m256i starts[Q8_STARTS_MAX];
    const bool pre = type == GGML_Q8_0 && cpu_kern.on.vnni && q > 1 && n / 32 <= Q8_STARTS_MAX;
    if (pre)
        q8_starts(xq, n, starts);
    for (int o = 0; o < q; o++) {
        const void *w[4] = { base + (size_t)o * row_bytes, base + (size_t)(o + q) * row_bytes,
                             base + (size_t)(o + 2 * q) * row_bytes, base + (size_t)(o + 3 * q) * row_bytes };
        float r[4];
        rows4_one(type, w, x, xq, xd, pre ? starts : NULL, n, r);
        y[o] = r[0];
        y[o + q] = r[1];
        y[o + 2 * q] = r[2];
        y[o + 3 * q] = r[3];
    }
    for (int o = 4 * q; o < n_rows; o++)
        y[o] = row_one(type, base + (size_t)o * row_bytes, x, xq, xd, n);
}

/* ---- the same four rows for two tokens: each weight vector loaded once
 * for both, each (row, token) accumulated exactly as rows4_* accumulates
 * it for one token (the same instructions on the same values in the same
 * order), so each token's sums are rows4_*'s bits ---- */
#define ROWS4_TOK2(name, wtype, LOAD, TAIL)                                                                    \
    AVX2 static void name(const void *const *w, const float *x0, const float *x1, int n, float *y0, float *y1) \
    {                                                                                                          \
        const wtype *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];                                            \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;        \
        const int n8 = n & ~7;                                                                                 \
        for (int i = 0; i < n8; i += 8) {                                                                      \
            const __m256 xa = _mm256_loadu_ps(x0 + i), xb = _mm256_loadu_ps(x1 + i);                           \
            __m256 v = LOAD(w0 + i);                                                                           \
            a0 = _mm256_fmadd_ps(v, xa, a0);                                                                   \
            b0 = _mm256_fmadd_ps(v, xb, b0);                                                                   \
            v = LOAD(w1 + i);                                                                                  \
            a1 = _mm256_fmadd_ps(v, xa, a1);                                                                   \
            b1 = _mm256_fmadd_ps(v, xb, b1);                                                                   \
            v = LOAD(w2 + i);                                                                                  \
            a2 = _mm256_fmadd_ps(v, xa, a2);                                                                   \
            b2 = _mm256_fmadd_ps(v, xb, b2);                                                                   \
            v = LOAD(w3 + i);                                                                                  \
            a3 = _mm256_fmadd_ps(v, xa, a3);                                                                   \
            b3 = _mm256_fmadd_ps(v, xb, b3);                                                                   \
        }                                                                                                      \
        y0[0] = hsum8(a0) + (n8 < n ? TAIL(w0 + n8, x0 + n8, n - n8) : 0.0f);                                  \
        y0[1] = hsum8(a1) + (n8 < n ? TAIL(w1 + n8, x0 + n8, n - n8) : 0.0f);                                  \
        y0[2] = hsum8(a2) + (n8 < n ? TAIL(w2 + n8, x0 + n8, n - n8) : 0.0f);                                  \
        y0[3] = hsum8(a3) + (n8 < n ? TAIL(w3 + n8, x0 + n8, n - n8) : 0.0f);                                  \
        y1[0] = hsum8(b0) + (n8 < n ? TAIL(w0 + n8, x1 + n8, n - n8) : 0.0f);                                  \
        y1[1] = hsum8(b1) + (n8 < n ? TAIL(w1 + n8, x1 + n8, n - n8) : 0.0f);                                  \
        y1[2] = hsum8(b2) + (n8 < n ? TAIL(w2 + n8, x1 + n8, n - n8) : 0.0f);                                  \
        y1[3] = hsum8(b3) + (n8 < n ? TAIL(w3 + n8, x1 + n8, n - n8) : 0.0f);                                  \
    }
ROWS4_TOK2(rows4x2_f32, float, _mm256_loadu_ps, avx2_dot_f32)
ROWS4_TOK2(rows4x2_f16, uint16_t, load_f16, avx2_dot_f16)
ROWS4_TOK2(rows4x2_bf16, uint16_t, load_bf16, avx2_dot_bf16)
#undef ROWS4_TOK2

/* rows4_q8_0_act for two tokens: |w| once per block for both */
AVX2 static void rows4x2_q8_0_act(const void *const *w, const int8_t *q0, const float *d0, const int8_t *q1,
                                  const float *d1, int n, float *y0, float *y1)
{
    const blk_q8_0 *bl[4] = { w[0], w[1], w[2], w[3] };
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a[4], b[4];
    for (int r = 0; r < 4; r++)
        a[r] = b[r] = _mm256_setzero_ps();
    for (int i = 0; i < n / 32; i++) {
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(q0 + 32 * i));
        const __m256i xb = _mm256_loadu_si256((const __m256i *)(q1 + 32 * i));
        for (int r = 0; r < 4; r++) {       /* q8_block's sums, token by token */
            const __m256i wr = _mm256_loadu_si256((const __m256i *)bl[r][i].qs), aw = _mm256_sign_epi8(wr, wr);
            const float dw = f16_scalar(bl[r][i].d);
            const __m256 pa = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xa, wr)), ones));
            const __m256 pb = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xb, wr)), ones));
            a[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d0[i]), pa, a[r]);
            b[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * d1[i]), pb, b[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        y0[r] = hsum8(a[r]);
        y1[r] = hsum8(b[r]);
    }
}

/* rows4_q8_0_vnni for two tokens: the rows' unsigned bytes and scales once per block for both */
AVX2_VNNI static void rows4x2_q8_0_vnni(const void *const *w, const int8_t *q0, const float *d0, const int8_t *q1,
                                        const float *d1, int n, float *y0, float *y1)
{
    const blk_q8_0 *b0 = w[0], *b1 = w[1], *b2 = w[2], *b3 = w[3];
    const __m256i m80 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    for (int i = 0; i < n / 32; i++) {
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(q0 + 32 * i));
        const __m256i xb = _mm256_loadu_si256((const __m256i *)(q1 + 32 * i));
        const __m256i sa = _mm256_dpbusd_avx_epi32(zero, m80, _mm256_sub_epi8(zero, xa));
        const __m256i sb = _mm256_dpbusd_avx_epi32(zero, m80, _mm256_sub_epi8(zero, xb));
        __m128i h = _mm_cvtsi32_si128(b0[i].d);
        h = _mm_insert_epi16(h, b1[i].d, 1);
        h = _mm_insert_epi16(h, b2[i].d, 2);
        h = _mm_insert_epi16(h, b3[i].d, 3);
        const __m128 hw = _mm_cvtph_ps(h);
        const __m256 sca = _mm256_castps128_ps256(_mm_mul_ps(hw, _mm_set1_ps(d0[i])));
        const __m256 scb = _mm256_castps128_ps256(_mm_mul_ps(hw, _mm_set1_ps(d1[i])));
#define ROW2(b, a, c, k)                                                                                        \
        {                                                                                                       \
            const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)b[i].qs), m80);               \
            const __m256i idx = _mm256_set1_epi32(k);                                                           \
            a = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sca, idx), _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(sa, u, xa)), a); \
            c = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scb, idx), _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(sb, u, xb)), c); \
        }
        ROW2(b0, a0, c0, 0) ROW2(b1, a1, c1, 1) ROW2(b2, a2, c2, 2) ROW2(b3, a3, c3, 3)
#undef ROW2
    }
    y0[0] = hsum8(a0);
    y0[1] = hsum8(a1);
    y0[2] = hsum8(a2);
    y0[3] = hsum8(a3);
    y1[0] = hsum8(c0);
    y1[1] = hsum8(c1);
    y1[2] = hsum8(c2);
    y1[3] = hsum8(c3);
}

void avx2_matvec_tokens(uint32_t type, const void *W, size_t row_bytes, int n_rows, const float *const *x,
                        const int8_t *const *xq, const float *const *xd, int n_tok, int n, float *y, size_t ldy)
{
    const char *base = W;
    const int q = n_rows / 4;
    const bool q8 = type != GGML_F32 && type != GGML_F16 && type != GGML_BF16;
    for (int o = 0; o < q; o++) {
        const void *w[4] = { base + (size_t)o * row_bytes, base + (size_t)(o + q) * row_bytes,
                             base + (size_t)(o + 2 * q) * row_bytes, base + (size_t)(o + 3 * q) * row_bytes };
        int t = 0;
        for (; t + 2 <= n_tok; t += 2) {
            float r0[4], r1[4];
            switch (type) {
            case GGML_F32: rows4x2_f32(w, x[t], x[t + 1], n, r0, r1); break;
            case GGML_F16: rows4x2_f16(w, x[t], x[t + 1], n, r0, r1); break;
            case GGML_BF16: rows4x2_bf16(w, x[t], x[t + 1], n, r0, r1); break;
            default:
                if (cpu_kern.on.vnni)
                    rows4x2_q8_0_vnni(w, xq[t], xd[t], xq[t + 1], xd[t + 1], n, r0, r1);
                else
                    rows4x2_q8_0_act(w, xq[t], xd[t], xq[t + 1], xd[t + 1], n, r0, r1);
                break;
            }
            for (int j = 0; j < 4; j++) {
                y[(size_t)t * ldy + o + (size_t)j * q] = r0[j];
                y[(size_t)(t + 1) * ldy + o + (size_t)j * q] = r1[j];
            }
        }
        for (; t < n_tok; t++) {
            float r[4];
            rows4_one(type, w, x[t], q8 ? xq[t] : NULL, q8 ? xd[t] : NULL, NULL, n, r);
            for (int j = 0; j < 4; j++)
                y[(size_t)t * ldy + o + (size_t)j * q] = r[j];
        }
    }
    for (int o = 4 * q; o < n_rows; o++)
        for (int t = 0; t < n_tok; t++)
            y[(size_t)t * ldy + o] = row_one(type, base + (size_t)o * row_bytes, x[t], q8 ? xq[t] : NULL,
                                             q8 ? xd[t] : NULL, n);
}

/* ------------------------------------------------------------------ */
/* row decoding                                                         */

AVX2 void avx2_dequant_f16(const uint16_t *src, float *dst, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, load_f16(src + i));
    for (; i < n; i++)
        dst[i] = f16_scalar(src[i]);
}

AVX2 void avx2_dequant_bf16(const uint16_t *src, float *dst, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, load_bf16(src + i));
    for (; i < n; i++)
        dst[i] = bf16_to_f32(src[i]);
}

/* 8 f32 -> 8 bf16 at p as f32_to_bf16: x + 0x7fff + (bit 16 of x), the
 * high half; a NaN keeps its high half with the quiet bit set. The two
 * 128-bit halves of the rounded words packed to 8 words (packus: each is
 * below 2^16). */
AVX2 static inline __attribute__((always_inline)) void bf16x8_store(uint16_t *p, __m256 x)
{
    const __m256i u = _mm256_castps_si256(x), h = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(h, _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i w = _mm256_blendv_epi8(r, _mm256_or_si256(h, _mm256_set1_epi32(0x40)), nan);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

AVX2 void avx2_quant_bf16(const float *src, uint16_t *dst, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        bf16x8_store(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; i++)
        dst[i] = f32_to_bf16(src[i]);
}

AVX2 void avx2_dequant_q8_0(const void *src, float *dst, int n)
{
    const blk_q8_0 *b = src;
    for (int i = 0; i < n / 32; i++) {
        __m256 d = _mm256_set1_ps(f16_scalar(b[i].d));
        float *y = dst + 32 * i;
        _mm256_storeu_ps(y, _mm256_mul_ps(d, load_i8(b[i].qs)));
        _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, load_i8(b[i].qs + 8)));
        _mm256_storeu_ps(y + 16, _mm256_mul_ps(d, load_i8(b[i].qs + 16)));
        _mm256_storeu_ps(y + 24, _mm256_mul_ps(d, load_i8(b[i].qs + 24)));
    }
}

/* ------------------------------------------------------------------ */
/* small batches                                                        */

/* up to 4 rows x 2 tokens per pass: 8 accumulators, 4 weight and 2
 * activation registers; per 8 elements 6 loads feed 8 FMAs, so the loop
 * runs at FMA speed with W in L1 and X in L2 */
AVX2 void avx2_rows_x_tokens(const float *W, int ldw, int n_rows, const float *X, int ldx, int n_tok,
                             int n, float *Y, int ldy)
{
    const float *w0 = W, *w1 = W + (n_rows > 1 ? ldw : 0);
    const float *w2 = W + (n_rows > 2 ? 2 * ldw : 0), *w3 = W + (n_rows > 3 ? 3 * ldw : 0);
    const int n8 = n & ~7;
    int t = 0;
    for (; t + 2 <= n_tok; t += 2) {
        const float *x0 = X + (size_t)t * ldx, *x1 = x0 + ldx;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        for (int i = 0; i < n8; i += 8) {
            __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i);
            __m256 r = _mm256_loadu_ps(w0 + i);
            a00 = _mm256_fmadd_ps(r, v0, a00);
            a01 = _mm256_fmadd_ps(r, v1, a01);
            r = _mm256_loadu_ps(w1 + i);
            a10 = _mm256_fmadd_ps(r, v0, a10);
            a11 = _mm256_fmadd_ps(r, v1, a11);
            r = _mm256_loadu_ps(w2 + i);
            a20 = _mm256_fmadd_ps(r, v0, a20);
            a21 = _mm256_fmadd_ps(r, v1, a21);
            r = _mm256_loadu_ps(w3 + i);
            a30 = _mm256_fmadd_ps(r, v0, a30);
            a31 = _mm256_fmadd_ps(r, v1, a31);
        }
        float s[8] = { hsum8(a00), hsum8(a10), hsum8(a20), hsum8(a30),
                       hsum8(a01), hsum8(a11), hsum8(a21), hsum8(a31) };
        for (int i = n8; i < n; i++) {
            s[0] += w0[i] * x0[i]; s[1] += w1[i] * x0[i]; s[2] += w2[i] * x0[i]; s[3] += w3[i] * x0[i];
            s[4] += w0[i] * x1[i]; s[5] += w1[i] * x1[i]; s[6] += w2[i] * x1[i]; s[7] += w3[i] * x1[i];
        }
        for (int r = 0; r < n_rows; r++) {
            Y[(size_t)t * ldy + r] = s[r];
            Y[(size_t)(t + 1) * ldy + r] = s[4 + r];
        }
    }
    for (; t < n_tok; t++) {
        const float *x0 = X + (size_t)t * ldx;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < n8; i += 8) {
            __m256 v0 = _mm256_loadu_ps(x0 + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), v0, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), v0, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), v0, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), v0, a3);
        }
        float s[4] = { hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3) };
        for (int i = n8; i < n; i++) {
            s[0] += w0[i] * x0[i]; s[1] += w1[i] * x0[i]; s[2] += w2[i] * x0[i]; s[3] += w3[i] * x0[i];
        }
        for (int r = 0; r < n_rows; r++)
            Y[(size_t)t * ldy + r] = s[r];
    }
}

/* ------------------------------------------------------------------ */
/* the gated delta rule, one token                                      */

/* Rows of S are f32, or bf16 (the cache's state_dtype): loaded widened
 * exactly, stored rounded to nearest even as f32_to_bf16 does. */
#define AVX2_INLINE AVX2 static inline __attribute__((always_inline))

AVX2_INLINE __m256 st_load(const void *S, int i, const bool b16)
{
    if (!b16)
        return _mm256_loadu_ps((const float *)S + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)S + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2_INLINE void st_store(void *S, int i, __m256 x, const bool b16)
{
    if (b16)
        bf16x8_store((uint16_t *)S + i, x);
    else
        _mm256_storeu_ps((float *)S + i, x);
}

static inline float st_get(const void *S, int i, bool b16)
{
    return b16 ? bf16_to_f32(((const uint16_t *)S)[i]) : ((const float *)S)[i];
}

static inline void st_put(void *S, int i, float x, bool b16)
{
    if (b16)
        ((uint16_t *)S)[i] = f32_to_bf16(x);
    else
        ((float *)S)[i] = x;
}

/* One row j of S (d_k numbers), two passes:
 *   kv_j = exp(g) (S_j . k)                       (decay folded into the dot)
 *   d_j  = beta (v_j - kv_j)
 *   S_j  = exp(g) S_j + d_j k;  o_j = S_j . q      (updated S, before any rounding)
 * The reference decays S first and then dots; folding the scalar decay
 * out of the sum only changes rounding. */
AVX2_INLINE void dnet_row1(int d_k, const float *q, const float *k, float vj, float beta, float decay,
                           void *Sj, float *oj, const bool b16)
{
    const int n8 = d_k & ~7;
    const __m256 vdec = _mm256_set1_ps(decay);
    __m256 a0 = _mm256_setzero_ps();
    int i;
    for (i = 0; i < n8; i += 8)
        a0 = _mm256_fmadd_ps(st_load(Sj, i, b16), _mm256_loadu_ps(k + i), a0);
    float kv = hsum8(a0);
    for (i = n8; i < d_k; i++)
        kv += st_get(Sj, i, b16) * k[i];
    const float dj = beta * (vj - kv * decay);
    const __m256 vd = _mm256_set1_ps(dj);
    a0 = _mm256_setzero_ps();
    for (i = 0; i < n8; i += 8) {
        __m256 s0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), vd, _mm256_mul_ps(st_load(Sj, i, b16), vdec));
        st_store(Sj, i, s0, b16);
        a0 = _mm256_fmadd_ps(s0, _mm256_loadu_ps(q + i), a0);
    }
    float acc = hsum8(a0);
    for (i = n8; i < d_k; i++) {
        const float s = st_get(Sj, i, b16) * decay + k[i] * dj;
        st_put(Sj, i, s, b16);
        acc += s * q[i];
    }
    *oj = acc;
}

/* Four rows at once, the same two passes: the rows are independent, so
 * their dependency chains (dot -> horizontal sum -> d_j -> update -> dot)
 * overlap, and each k and q vector loaded serves four rows. Profile of
 * the one-row loop: ~170 cycles per row of 128, latency-bound on that
 * chain; four rows keep the FMA ports busy instead. */
AVX2_INLINE void dnet_row4(int d_k, const float *q, const float *k, const float *v, float beta, float decay,
                           void *S, float *o, const char *pf, const bool b16)
{
    const int n8 = d_k & ~7;
    const size_t es = b16 ? 2 : 4;
    char *S0 = S, *S1 = S0 + (size_t)d_k * es, *S2 = S1 + (size_t)d_k * es, *S3 = S2 + (size_t)d_k * es;
    const __m256 vdec = _mm256_set1_ps(decay);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i;
    if (pf)                             /* four rows DNET_PF_ROWS ahead, see avx2_dnet_step */
        for (size_t b = 0; b < 4 * (size_t)d_k * es; b += 64)
            _mm_prefetch(pf + b, _MM_HINT_T0);
    for (i = 0; i < n8; i += 8) {
        __m256 kk = _mm256_loadu_ps(k + i);
        a0 = _mm256_fmadd_ps(st_load(S0, i, b16), kk, a0);
        a1 = _mm256_fmadd_ps(st_load(S1, i, b16), kk, a1);
        a2 = _mm256_fmadd_ps(st_load(S2, i, b16), kk, a2);
        a3 = _mm256_fmadd_ps(st_load(S3, i, b16), kk, a3);
    }
    float kv[4] = { hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3) };
    char *Sr[4] = { S0, S1, S2, S3 };
    for (i = n8; i < d_k; i++)
        for (int r = 0; r < 4; r++)
            kv[r] += st_get(Sr[r], i, b16) * k[i];
    float dj[4];
    for (int r = 0; r < 4; r++)
        dj[r] = beta * (v[r] - kv[r] * decay);
    const __m256 d0 = _mm256_set1_ps(dj[0]), d1 = _mm256_set1_ps(dj[1]);
    const __m256 d2 = _mm256_set1_ps(dj[2]), d3 = _mm256_set1_ps(dj[3]);
    a0 = _mm256_setzero_ps();
    a1 = a0;
    a2 = a0;
    a3 = a0;
    for (i = 0; i < n8; i += 8) {
        __m256 kk = _mm256_loadu_ps(k + i), qq = _mm256_loadu_ps(q + i);
        __m256 s0 = _mm256_fmadd_ps(kk, d0, _mm256_mul_ps(st_load(S0, i, b16), vdec));
        __m256 s1 = _mm256_fmadd_ps(kk, d1, _mm256_mul_ps(st_load(S1, i, b16), vdec));
        __m256 s2 = _mm256_fmadd_ps(kk, d2, _mm256_mul_ps(st_load(S2, i, b16), vdec));
        __m256 s3 = _mm256_fmadd_ps(kk, d3, _mm256_mul_ps(st_load(S3, i, b16), vdec));
        st_store(S0, i, s0, b16);
        st_store(S1, i, s1, b16);
        st_store(S2, i, s2, b16);
        st_store(S3, i, s3, b16);
        a0 = _mm256_fmadd_ps(s0, qq, a0);
        a1 = _mm256_fmadd_ps(s1, qq, a1);
        a2 = _mm256_fmadd_ps(s2, qq, a2);
        a3 = _mm256_fmadd_ps(s3, qq, a3);
    }
    float acc[4] = { hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3) };
    for (i = n8; i < d_k; i++)
        for (int r = 0; r < 4; r++) {
            const float s = st_get(Sr[r], i, b16) * decay + k[i] * dj[r];
            st_put(Sr[r], i, s, b16);
            acc[r] += s * q[i];
        }
    for (int r = 0; r < 4; r++)
        o[r] = acc[r];
}

/* cold: rows of S are prefetched DNET_PF_ROWS ahead, within the head's
 * state. The state of a decode step comes from memory (16 sequences: 302
 * MB read and written per step); the hardware prefetcher alone left the
 * step waiting on it. Measured (2 threads, 4608 heads of 128 x 128, as 16
 * sequences of the 0.8B shape): none 22-27 ms, 4 rows 15-20 ms, 12-16
 * rows 14-17 ms, 24-32 rows 16-18 ms. Later tokens of a prompt find S in
 * cache, where the prefetches cost 5% (16 heads x 512 tokens: 10.3-10.6
 * against 11.0-11.2 ms), so only the first token of a call asks for them. */
#define DNET_PF_ROWS 16

AVX2_INLINE void dnet_step(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                           float g, void *S, float *o, bool cold, const bool b16)
{
    const float decay = expf(g);
    const size_t row = (size_t)d_k * (b16 ? 2 : 4);
    char *S8 = S;
    int j = 0;
    for (; j + 4 <= d_v; j += 4)
        dnet_row4(d_k, q, k, v + j, beta, decay, S8 + (size_t)j * row, o + j,
                  cold && j + DNET_PF_ROWS + 4 <= d_v ? S8 + (size_t)(j + DNET_PF_ROWS) * row : NULL, b16);
    for (; j < d_v; j++)
        dnet_row1(d_k, q, k, v[j], beta, decay, S8 + (size_t)j * row, o + j, b16);
}

AVX2 void avx2_dnet_step(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                         float g, float *S, float *o, bool cold)
{
    dnet_step(d_k, d_v, q, k, v, beta, g, S, o, cold, false);
}

AVX2 void avx2_dnet_step_bf16(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                              float g, uint16_t *S, float *o)
{
    dnet_step(d_k, d_v, q, k, v, beta, g, S, o, true, true);
}

/* ------------------------------------------------------------------ */
/* elementwise gates                                                    */

/* 1 / (1 + e^-x) */
AVX2 static inline __m256 sigmoid256(__m256 x)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp256_clamped(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

AVX2 void avx2_silu_mul(float *y, const float *x, const float *b, long n)
{
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 s = _mm256_mul_ps(v, sigmoid256(v));
        if (b)
            s = _mm256_mul_ps(s, _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(y + i, s);
    }
    for (; i < n; i++)
        y[i] = silu(x[i]) * (b ? b[i] : 1.0f);
}

AVX2 void avx2_sigmoid_mul(float *y, const float *g, long n)
{
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), sigmoid256(_mm256_loadu_ps(g + i))));
    for (; i < n; i++)
        y[i] *= sigmoid(g[i]);
}

/* ------------------------------------------------------------------ */
/* norms                                                                */

/* sum_i x[i]^2 in double, as the scalar norms accumulate: each square of
 * a float is exact in double, only the additions round, here in four
 * lanes x four chains instead of one chain. The scalar loop is one
 * dependent double add per element (4 cycles): a 16-sequence decode step
 * spent 2.5% of its samples in rmsnorm and l2norm (perf). */
AVX2 double avx2_sumsq(const float *x, int n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), v1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        __m256d v2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), v3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
        a0 = _mm256_fmadd_pd(v0, v0, a0);
        a1 = _mm256_fmadd_pd(v1, v1, a1);
        a2 = _mm256_fmadd_pd(v2, v2, a2);
        a3 = _mm256_fmadd_pd(v3, v3, a3);
    }
    __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    return ss;
}

/* y[i] = x[i] * r * (w ? w[i] : 1), the products in the scalar order */
AVX2 void avx2_scale(float *y, const float *x, float r, const float *w, int n)
{
    const __m256 vr = _mm256_set1_ps(r);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vr);
        if (w)
            v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++)
        y[i] = w ? x[i] * r * w[i] : x[i] * r;
}

AVX2 void avx2_kda_step(int d, const float *q, const float *k, const float *v, float beta, const float *eg, float *S,
                        float *o)
{
    for (int j = 0; j < d; j++) {
        float *Sj = S + (size_t)j * d;
        __m256 kv = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) {
            const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(Sj + i), _mm256_loadu_ps(eg + i));
            _mm256_storeu_ps(Sj + i, s);
            kv = _mm256_fmadd_ps(s, _mm256_loadu_ps(k + i), kv);
        }
        const __m256 dj = _mm256_set1_ps(beta * (v[j] - hsum8(kv)));
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) {
            const __m256 s = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), dj, _mm256_loadu_ps(Sj + i));
            _mm256_storeu_ps(Sj + i, s);
            acc = _mm256_fmadd_ps(s, _mm256_loadu_ps(q + i), acc);
        }
        o[j] = hsum8(acc);
    }
}

AVX2 void avx2_mamba1_scan(int t0, int t1, int c0, int c1, int DS, const float *A, const float *x, int xs,
                           const float *dt, int dts, const float *BC, int bcs, float *S, float *y, int ys)
{
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * xs, *dtt = dt + (size_t)t * dts;
        const float *B = BC + (size_t)t * bcs, *C = B + DS;
        float *yt = y + (size_t)t * ys;
        for (int c = c0; c < c1; c++) {
            const __m256 d = _mm256_set1_ps(dtt[c]), xd = _mm256_set1_ps(xt[c] * dtt[c]);
            const float *Ac = A + (size_t)c * DS;
            float *Sc = S + (size_t)(c - c0) * DS;
            __m256 acc = _mm256_setzero_ps();
            for (int i = 0; i < DS; i += 8) {
                const __m256 a = exp256_clamped(_mm256_mul_ps(d, _mm256_loadu_ps(Ac + i)));
                const __m256 s = _mm256_fmadd_ps(_mm256_loadu_ps(Sc + i), a, _mm256_mul_ps(_mm256_loadu_ps(B + i), xd));
                _mm256_storeu_ps(Sc + i, s);
                acc = _mm256_fmadd_ps(s, _mm256_loadu_ps(C + i), acc);
            }
            yt[c] = hsum8(acc);
        }
    }
}

AVX2 void avx2_mamba2_step(int hd, int ds, float a, float dt, const float *x, const float *B, const float *C, float *S,
                           float *y)
{
    const __m256 va = _mm256_set1_ps(a);
    for (int j = 0; j < hd; j++) {
        float *Sj = S + (size_t)j * ds;
        const __m256 xd = _mm256_set1_ps(x[j] * dt);
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < ds; i += 8) {
            const __m256 s = _mm256_fmadd_ps(_mm256_loadu_ps(B + i), xd, _mm256_mul_ps(_mm256_loadu_ps(Sj + i), va));
            _mm256_storeu_ps(Sj + i, s);
            acc = _mm256_fmadd_ps(s, _mm256_loadu_ps(C + i), acc);
        }
        y[j] = hsum8(acc);
    }
}


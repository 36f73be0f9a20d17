/* attn.c - causal GQA attention kernels (see attn.h).
 *
 * Owns: the reference, the decode path (online softmax over pages, a whole
 * query group per K/V read) and the tiled prefill (sgemm on query x key
 * blocks, online softmax). Does not own: anything attention.c does before
 * or after the softmax(q K^T) V core.
 * ref: docs/models.md 1.5; Milakov & Gimelshein, "Online normalizer
 * calculation for softmax" (2018); FlashAttention's tiling (Dao 2022).
 *
 * Online softmax, per query row: m = running max of the scores seen,
 * l = running sum of exp(score - m), o = running sum of exp(score - m) v.
 * A new block with max mx: m' = max(m, mx); o, l *= exp(m - m'); then
 * p_j = exp(s_j - m'), l += sum p_j, o += sum p_j v_j. At the end o / l.
 * Masked keys (j > pos) are never visited or get p = 0 exactly.
 */
#include "attn.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "blas.h"
#include "ggml_type.h"
#include "quant.h"
#include "simd.h"
#include "simd512.h"
#include "simd_exp.h"
#include "vecmath.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512A __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))

#define ATTN_BQ 32              /* query rows per tile (times the group) */
#define ATTN_BK 64              /* keys per tile */
#ifndef ATTN_DEC_PAGES
#define ATTN_DEC_PAGES 4        /* decode: pages of keys per online-softmax step */
#endif

static int tiled_min_rows = 16;
static bool decode_pairs = true;

void attn_set_decode_pairs(bool on)
{
    decode_pairs = on;
}

void attn_set_tiled_min_rows(int n)
{
    tiled_min_rows = n;
}

long attn_scratch_floats(int head_dim, int group, int page_tokens)
{
    const long R = (long)ATTN_BQ * group;
    /* tiled: Qb, O [R][hd]; Sb [R][BK]; Kt, Vt [BK][hd]; m, l [R] */
    long tiled = 2 * R * head_dim + R * ATTN_BK + 2L * ATTN_BK * head_dim + 2 * R;
    /* decode: acc [G][hd]; scores [G][pages x P]; one page of rows in f32 [P][hd]; m, l [G] */
    long decode = (long)group * head_dim + (long)group * ATTN_DEC_PAGES * page_tokens +
                  (long)page_tokens * head_dim + 2L * group;
    return (tiled > decode ? tiled : decode) + 16;
}

/* ------------------------------------------------------------------ */
/* exp                                                                  */

/* exp256_neg: simd_exp.h */

static inline float exp_neg_scalar(float x)
{
    return x < -87.0f ? 0.0f : expf(x);
}

AVX2 void attn_exp_block_avx2(const float *x, float *y, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, exp256_neg(_mm256_loadu_ps(x + i)));
    if (i < n) {                        /* tail through a padded vector: same rounding as the body */
        float t[8] = { 0 };
        memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(t, exp256_neg(_mm256_loadu_ps(t)));
        memcpy(y + i, t, sizeof(float) * (size_t)(n - i));
    }
}

void attn_exp_block_ref(const float *x, float *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = exp_neg_scalar(x[i]);
}

void attn_exp_block(const float *x, float *y, int n)
{
    cpu_kern.exp_block(x, y, n);
}

/* ------------------------------------------------------------------ */
/* reference                                                            */

void attn_gqa_ref(const attn_args *a, float *scores)
{
    const int HD = a->head_dim, G = a->n_head / a->n_kv;
    float *vrow = scores + a->pos0 + a->n;          /* [HD], past the scores */
    for (int t = 0; t < a->n; t++) {
        const int nk = a->pos0 + t + 1;             /* keys 0..pos: the causal mask */
        for (int h = 0; h < a->n_head; h++) {
            const float *q = a->Q + (size_t)t * a->q_stride + (size_t)h * a->q_head;
            float *o = a->out + (size_t)t * a->out_stride + (size_t)h * HD;
            for (int j = 0; j < nk; j++)            /* s_j = (q . k_j) * scale */
                scores[j] = dot_row(a->kv.type, kv_row(&a->kv, 0, h / G, j), q, HD) * a->scale;
            softmax(scores, nk);                    /* p = softmax(s) */
            for (int d = 0; d < HD; d++)
                o[d] = 0.0f;
            for (int j = 0; j < nk; j++) {          /* o = sum_j p_j v_j */
                dequant_row(a->kv.type, kv_row(&a->kv, 1, h / G, j), vrow, HD);
                for (int d = 0; d < HD; d++)
                    o[d] += scores[j] * vrow[d];
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* shared helpers                                                       */

/* np rows (np <= rows left in the page) of K (kv = 0) or V of head h from
 * token j0, as f32: the page itself when the cache is f32, else decoded
 * into buf */
static const float *page_rows(const attn_args *a, int kv, int h, int j0, int np, float *buf)
{
    const void *p = kv_row(&a->kv, kv, h, j0);
    if (a->kv.type == GGML_F32)
        return p;
    dequant_row_fast(a->kv.type, p, buf, np * a->head_dim);
    return buf;
}

/* rows [j0, j0 + n) of K or V of head h, across pages, into dst [n][HD] */
static void gather_rows(const attn_args *a, int kv, int h, int j0, int n, float *dst)
{
    const int P = a->kv.page_tokens, HD = a->head_dim;
    for (int j = j0; j < j0 + n;) {
        int run = P - j % P;
        if (run > j0 + n - j)
            run = j0 + n - j;
        dequant_row_fast(a->kv.type, kv_row(&a->kv, kv, h, j), dst + (size_t)(j - j0) * HD,
                         run * HD);
        j += run;
    }
}

/* Online-softmax step for one row of scores s[0..nk), of which the first
 * nv are visible: updates m, l, rescales o [HD], and leaves p in s
 * (0 for the masked tail). */
static void softmax_step(float *s, int nk, int nv, float *m, float *l, float *o, int HD)
{
    float mx = -INFINITY;
    for (int j = 0; j < nv; j++)
        mx = s[j] > mx ? s[j] : mx;
    if (mx > *m) {                                  /* m' = max(m, mx); o, l *= exp(m - m') */
        float alpha = *m == -INFINITY ? 0.0f : exp_neg_scalar(*m - mx);
        if (alpha != 1.0f) {
            for (int d = 0; d < HD; d++)
                o[d] *= alpha;
            *l *= alpha;
        }
        *m = mx;
    }
    for (int j = 0; j < nv; j++)                    /* p_j = exp(s_j - m') */
        s[j] -= *m;
    attn_exp_block(s, s, nv);
    float sum = 0.0f;
    for (int j = 0; j < nv; j++)
        sum += s[j];
    *l += sum;
    for (int j = nv; j < nk; j++)
        s[j] = 0.0f;
}

/* ------------------------------------------------------------------ */
/* decode path: one query row, one KV head, the whole group             */

/* Keys in pairs: for j < n, key A_j = KA + j rs and key B_j = KB + j rs;
 * scA[g * ld + j ss] = scale q_g . A_j and the same for B, g < ng <= 4.
 * Two keys per pass: eight independent FMA chains and two rows' loads in
 * flight. qk_group4 pairs neighbouring keys of one page; decode_pass
 * pairs keys of two pages (two streams). */
AVX2 static void qk_pairs(const float *const *q, int ng, const float *KA, const float *KB, int n, size_t rs,
                          int HD, float scale, float *scA, float *scB, int ss, int ld)
{
    const float *q0 = q[0], *q1 = q[ng > 1 ? 1 : 0], *q2 = q[ng > 2 ? 2 : 0], *q3 = q[ng > 3 ? 3 : 0];
    const __m128 vs = _mm_set1_ps(scale);
    for (int j = 0; j < n; j++) {
        const float *k = KA + (size_t)j * rs, *k1 = KB + (size_t)j * rs;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int i = 0; i < HD; i += 8) {
            __m256 kk = _mm256_loadu_ps(k + i), kl = _mm256_loadu_ps(k1 + i);
            __m256 x0 = _mm256_loadu_ps(q0 + i), x1 = _mm256_loadu_ps(q1 + i);
            __m256 x2 = _mm256_loadu_ps(q2 + i), x3 = _mm256_loadu_ps(q3 + i);
            a0 = _mm256_fmadd_ps(x0, kk, a0);
            a1 = _mm256_fmadd_ps(x1, kk, a1);
            a2 = _mm256_fmadd_ps(x2, kk, a2);
            a3 = _mm256_fmadd_ps(x3, kk, a3);
            b0 = _mm256_fmadd_ps(x0, kl, b0);
            b1 = _mm256_fmadd_ps(x1, kl, b1);
            b2 = _mm256_fmadd_ps(x2, kl, b2);
            b3 = _mm256_fmadd_ps(x3, kl, b3);
        }
        /* four horizontal sums at once: hadd pairs, then the two halves */
        __m256 ha = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m256 hb = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
        float r[8];
        _mm_storeu_ps(r, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(ha), _mm256_extractf128_ps(ha, 1)), vs));
        _mm_storeu_ps(r + 4, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(hb), _mm256_extractf128_ps(hb, 1)), vs));
        for (int g = 0; g < ng; g++) {
            scA[(size_t)g * ld + (size_t)j * ss] = r[g];
            scB[(size_t)g * ld + (size_t)j * ss] = r[4 + g];
        }
    }
}

/* sc[g][j] = scale * (q_g . K_j) for g < ng <= 4, j < np: keys of one page */
AVX2 static void qk_group4(const float *const *q, int ng, const float *K, int np, int HD, float scale,
                           float *sc, int ld_sc)
{
    qk_pairs(q, ng, K, K + HD, np / 2, 2 * (size_t)HD, HD, scale, sc, sc + 1, 2, ld_sc);
    if (np % 2) {                                   /* an odd last key: four rows . one vector */
        const int j = np - 1;
        const void *rows[4] = { q[0], q[ng > 1 ? 1 : 0], q[ng > 2 ? 2 : 0], q[ng > 3 ? 3 : 0] };
        float r[4];
        avx2_dot4_f32(rows, K + (size_t)j * HD, HD, r);
        for (int g = 0; g < ng; g++)
            sc[(size_t)g * ld_sc + j] = r[g] * scale;
    }
}

/* acc[g][:] += sum_j p[g][j] V_j for g < ng <= 4 */
AVX2 static void pv_group4(const float *p, int ld_p, int ng, const float *V, int np, int HD, float *acc)
{
    const float *p0 = p, *p1 = p + (ng > 1 ? ld_p : 0), *p2 = p + (ng > 2 ? 2 * ld_p : 0);
    const float *p3 = p + (ng > 3 ? 3 * ld_p : 0);
    float *o0 = acc, *o1 = acc + (ng > 1 ? HD : 0), *o2 = acc + (ng > 2 ? 2 * HD : 0);
    float *o3 = acc + (ng > 3 ? 3 * HD : 0);
    int i = 0;
    /* sixteen columns at a time: eight independent chains over j (see qk_group4) */
    for (; i + 16 <= HD; i += 16) {
        __m256 a0 = _mm256_loadu_ps(o0 + i), a1 = _mm256_loadu_ps(o1 + i);
        __m256 a2 = _mm256_loadu_ps(o2 + i), a3 = _mm256_loadu_ps(o3 + i);
        __m256 b0 = _mm256_loadu_ps(o0 + i + 8), b1 = _mm256_loadu_ps(o1 + i + 8);
        __m256 b2 = _mm256_loadu_ps(o2 + i + 8), b3 = _mm256_loadu_ps(o3 + i + 8);
        for (int j = 0; j < np; j++) {
            const __m256 v = _mm256_loadu_ps(V + (size_t)j * HD + i), w = _mm256_loadu_ps(V + (size_t)j * HD + i + 8);
            const __m256 x0 = _mm256_broadcast_ss(p0 + j), x1 = _mm256_broadcast_ss(p1 + j);
            const __m256 x2 = _mm256_broadcast_ss(p2 + j), x3 = _mm256_broadcast_ss(p3 + j);
            a0 = _mm256_fmadd_ps(x0, v, a0);
            a1 = _mm256_fmadd_ps(x1, v, a1);
            a2 = _mm256_fmadd_ps(x2, v, a2);
            a3 = _mm256_fmadd_ps(x3, v, a3);
            b0 = _mm256_fmadd_ps(x0, w, b0);
            b1 = _mm256_fmadd_ps(x1, w, b1);
            b2 = _mm256_fmadd_ps(x2, w, b2);
            b3 = _mm256_fmadd_ps(x3, w, b3);
        }
        /* stores in reverse so that for ng < 4 (aliased rows point at row 0) row 0 wins */
        _mm256_storeu_ps(o3 + i + 8, b3);
        _mm256_storeu_ps(o2 + i + 8, b2);
        _mm256_storeu_ps(o1 + i + 8, b1);
        _mm256_storeu_ps(o0 + i + 8, b0);
        _mm256_storeu_ps(o3 + i, a3);
        _mm256_storeu_ps(o2 + i, a2);
        _mm256_storeu_ps(o1 + i, a1);
        _mm256_storeu_ps(o0 + i, a0);
    }
    for (; i < HD; i += 8) {
        __m256 a0 = _mm256_loadu_ps(o0 + i), a1 = _mm256_loadu_ps(o1 + i);
        __m256 a2 = _mm256_loadu_ps(o2 + i), a3 = _mm256_loadu_ps(o3 + i);
        for (int j = 0; j < np; j++) {
            __m256 v = _mm256_loadu_ps(V + (size_t)j * HD + i);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), v, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), v, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + j), v, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + j), v, a3);
        }
        /* stores in reverse so that for ng < 4 (aliased rows point at row 0) row 0 wins */
        _mm256_storeu_ps(o3 + i, a3);
        _mm256_storeu_ps(o2 + i, a2);
        _mm256_storeu_ps(o1 + i, a1);
        _mm256_storeu_ps(o0 + i, a0);
    }
}

/* Two pages at once, each V row read front to back (the strips of
 * pv_group4 stride a page's rows): acc[g][:] += pA[g][j] VA_j + pB[g][j] VB_j
 * for j < n, g < ng <= 4, acc in L1 */
AVX2 static void pv_two(const float *pA, const float *pB, int ld_p, int ng, const float *VA, const float *VB,
                        int n, int HD, float *acc)
{
    float *o0 = acc, *o1 = acc + (ng > 1 ? HD : 0), *o2 = acc + (ng > 2 ? 2 * HD : 0);
    float *o3 = acc + (ng > 3 ? 3 * HD : 0);
    const size_t d1 = ng > 1 ? ld_p : 0, d2 = ng > 2 ? 2 * (size_t)ld_p : 0, d3 = ng > 3 ? 3 * (size_t)ld_p : 0;
    for (int j = 0; j < n; j++) {
        const float *va = VA + (size_t)j * HD, *vb = VB + (size_t)j * HD;
        const __m256 xa0 = _mm256_broadcast_ss(pA + j), xa1 = _mm256_broadcast_ss(pA + d1 + j);
        const __m256 xa2 = _mm256_broadcast_ss(pA + d2 + j), xa3 = _mm256_broadcast_ss(pA + d3 + j);
        const __m256 xb0 = _mm256_broadcast_ss(pB + j), xb1 = _mm256_broadcast_ss(pB + d1 + j);
        const __m256 xb2 = _mm256_broadcast_ss(pB + d2 + j), xb3 = _mm256_broadcast_ss(pB + d3 + j);
        for (int i = 0; i < HD; i += 8) {
            const __m256 v = _mm256_loadu_ps(va + i), w = _mm256_loadu_ps(vb + i);
            __m256 a0 = _mm256_loadu_ps(o0 + i), a1 = _mm256_loadu_ps(o1 + i);
            __m256 a2 = _mm256_loadu_ps(o2 + i), a3 = _mm256_loadu_ps(o3 + i);
            a0 = _mm256_fmadd_ps(xb0, w, _mm256_fmadd_ps(xa0, v, a0));
            a1 = _mm256_fmadd_ps(xb1, w, _mm256_fmadd_ps(xa1, v, a1));
            a2 = _mm256_fmadd_ps(xb2, w, _mm256_fmadd_ps(xa2, v, a2));
            a3 = _mm256_fmadd_ps(xb3, w, _mm256_fmadd_ps(xa3, v, a3));
            _mm256_storeu_ps(o3 + i, a3);
            _mm256_storeu_ps(o2 + i, a2);
            _mm256_storeu_ps(o1 + i, a1);
            _mm256_storeu_ps(o0 + i, a0);
        }
    }
}

/* ---- AVX-512 forms of qk_pairs and pv_two (head_dim % 16 == 0) ----
 * The AVX2 pair kernels run at 17-37 GB/s per core with K and V in L1
 * (1 KiB rows, groups of 4; per kernel, microbenchmark on the bench
 * machine), close to what one core reads from DRAM, and their compute
 * did not overlap the reads: an 8K decode's attention took 1.3 times a
 * plain read of the same pages. These do four keys per pass (16 zmm sums,
 * each q load feeding four keys) and p.V in strips of 64 columns whose
 * sums stay in registers for a whole page pair: 33-50 and 52-65 GB/s in
 * L1. Faster compute alone moved the 8K case by a few percent; what
 * closed most of the gap is the prefetch below. */

/* four keys' sums x four heads -> 16 scores: the two halves of each zmm,
 * then horizontal adds of four vectors at a time */
AVX512A static inline __m128 hsum4_512(__m512 a, __m512 b, __m512 c, __m512 d)
{
    const __m256 x0 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 x1 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 x2 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 x3 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(x0, x1), _mm256_hadd_ps(x2, x3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* qk_pairs' contract with rows HD apart (rs = HD, ss = 1): scA[g * ld + j]
 * = scale q_g . A_j, the same for B, j < n, g < ng <= 4. Keys j and j + 1
 * of both pages per pass. pfA, pfB (or NULL): the V pages of the same
 * keys, prefetched to L2 a pass ahead of the p.V pass that will read
 * them, so the V reads are in flight while the K reads are summed:
 * 8K context, 6 layers, microbenchmark, attention over a plain read of the
 * same pages 1.28-1.40 -> 1.10-1.19 (1 and 2 threads, alternating runs).
 * The same prefetch with the AVX2 kernels was mixed (1 thread 1.21-1.23,
 * 2 threads 1.43-1.54): their slower compute leaves no room for it. */
AVX512A static void qk_pairs512(const float *const *q, int ng, const float *KA, const float *KB, int n, int HD,
                                float scale, float *scA, float *scB, int ld, const char *pfA, const char *pfB)
{
    const float *qq[4] = { q[0], q[ng > 1 ? 1 : 0], q[ng > 2 ? 2 : 0], q[ng > 3 ? 3 : 0] };
    const __m128 vs = _mm_set1_ps(scale);
    const size_t row = (size_t)HD * sizeof(float);
    int j = 0;
    for (; j + 2 <= n; j += 2) {
        const float *a = KA + (size_t)j * HD, *b = KB + (size_t)j * HD;
        if (pfA)
            for (size_t o = 0; o < 2 * row; o += 64) {
                _mm_prefetch(pfA + (size_t)j * row + o, _MM_HINT_T1);
                _mm_prefetch(pfB + (size_t)j * row + o, _MM_HINT_T1);
            }
        /* s[g][k]: head g, key k = A_j, A_j+1, B_j, B_j+1 (unrolled so
         * that all 16 stay in registers) */
        __m512 sum[4][4];
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
                sum[g][k] = _mm512_setzero_ps();
        for (int i = 0; i < HD; i += 16) {
            const __m512 k4[4] = { _mm512_loadu_ps(a + i), _mm512_loadu_ps(a + HD + i), _mm512_loadu_ps(b + i),
                                   _mm512_loadu_ps(b + HD + i) };
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
                const __m512 x = _mm512_loadu_ps(qq[g] + i);
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
                    sum[g][k] = _mm512_fmadd_ps(x, k4[k], sum[g][k]);
            }
        }
        float r[16];
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
            _mm_storeu_ps(r + 4 * g, _mm_mul_ps(hsum4_512(sum[g][0], sum[g][1], sum[g][2], sum[g][3]), vs));
        for (int g = 0; g < ng; g++) {
            scA[(size_t)g * ld + j] = r[4 * g];
            scA[(size_t)g * ld + j + 1] = r[4 * g + 1];
            scB[(size_t)g * ld + j] = r[4 * g + 2];
            scB[(size_t)g * ld + j + 1] = r[4 * g + 3];
        }
    }
    if (j < n)                                      /* an odd last key of each page */
        qk_pairs(q, ng, KA + (size_t)j * HD, KB + (size_t)j * HD, 1, (size_t)HD, HD, scale, scA + j, scB + j, 1, ld);
}

/* pv_two's contract, HD % 16 == 0: columns in strips of W16 zmm (64 or
 * 16 columns), each strip's sums for the four heads held in registers
 * over all n keys of both pages. Aliased rows (ng < 4) compute the same
 * values, stored last-to-first so row 0 is written last. pfA, pfB (or
 * NULL): the next block's K pages, n rows each, prefetched to L2 a slice
 * per (strip, key) so the next QK pass finds them there: microbenchmark
 * as above, attention over a plain read 1.16-1.31 -> 1.04-1.08 on top of
 * the V prefetch (issuing them all at the start instead: worse). */
#define PV512_STRIP(W16)                                                                                       \
    do {                                                                                                       \
        __m512 c[4][W16];                                                                                      \
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)                                                    \
            _Pragma("GCC unroll 4") for (int w = 0; w < W16; w++)                                              \
                c[g][w] = _mm512_loadu_ps(o[g] + i + 16 * w);                                                  \
        for (int j = 0; j < n; j++) {                                                                          \
            const float *va = VA + (size_t)j * HD + i, *vb = VB + (size_t)j * HD + i;                          \
            if (pfA)                                                                                           \
                for (size_t b0 = ((size_t)i * n + (size_t)j * 16 * W16) * sizeof(float), ob = 0;               \
                     ob < 64 * W16; ob += 64) {                                                                \
                    _mm_prefetch(pfA + b0 + ob, _MM_HINT_T1);                                                  \
                    if (pfB)                                                                                   \
                        _mm_prefetch(pfB + b0 + ob, _MM_HINT_T1);                                              \
                }                                                                                              \
            __m512 v[W16], u[W16];                                                                             \
            _Pragma("GCC unroll 4") for (int w = 0; w < W16; w++) {                                            \
                v[w] = _mm512_loadu_ps(va + 16 * w);                                                           \
                u[w] = _mm512_loadu_ps(vb + 16 * w);                                                           \
            }                                                                                                  \
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                                              \
                const __m512 xa = _mm512_set1_ps(pa[g][j]), xb = _mm512_set1_ps(pb[g][j]);                    \
                _Pragma("GCC unroll 4") for (int w = 0; w < W16; w++)                                          \
                    c[g][w] = _mm512_fmadd_ps(xb, u[w], _mm512_fmadd_ps(xa, v[w], c[g][w]));                  \
            }                                                                                                  \
        }                                                                                                      \
        _Pragma("GCC unroll 4") for (int g = 3; g >= 0; g--)                                                   \
            _Pragma("GCC unroll 4") for (int w = 0; w < W16; w++)                                              \
                _mm512_storeu_ps(o[g] + i + 16 * w, c[g][w]);                                                  \
    } while (0)

AVX512A static void pv_two512(const float *pA, const float *pB, int ld_p, int ng, const float *VA, const float *VB,
                              int n, int HD, float *acc, const char *pfA, const char *pfB)
{
    const float *pa[4], *pb[4];
    float *o[4];
    for (int g = 0; g < 4; g++) {
        const int gg = g < ng ? g : 0;
        pa[g] = pA + (size_t)gg * ld_p;
        pb[g] = pB + (size_t)gg * ld_p;
        o[g] = acc + (size_t)gg * HD;
    }
    int i = 0;
    for (; i + 64 <= HD; i += 64)
        PV512_STRIP(4);
    for (; i < HD; i += 16)
        PV512_STRIP(1);
}
#undef PV512_STRIP

/* plain C versions of the two, for CPUs without AVX2 and head_dim % 8 */
static void qk_plain(const float *const *q, int ng, const float *K, int np, int HD, float scale, float *sc,
                     int ld_sc)
{
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < np; j++) {
            float s = 0.0f;
            for (int i = 0; i < HD; i++)
                s += q[g][i] * K[(size_t)j * HD + i];
            sc[(size_t)g * ld_sc + j] = s * scale;
        }
}

static void pv_plain(const float *p, int ld_p, int ng, const float *V, int np, int HD, float *acc)
{
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < np; j++) {
            const float pj = p[(size_t)g * ld_p + j];
            for (int i = 0; i < HD; i++)
                acc[(size_t)g * HD + i] += pj * V[(size_t)j * HD + i];
        }
}

/* the query rows of group heads g .. g + ng - 1 (ng <= 4) of row t, KV head kvh */
static int group_q(const attn_args *a, int t, int kvh, int g, const float **q)
{
    const int G = a->n_head / a->n_kv, ng = G - g < 4 ? G - g : 4;
    const float *q0 = a->Q + (size_t)t * a->q_stride + (size_t)kvh * G * a->q_head;
    for (int i = 0; i < ng; i++)
        q[i] = q0 + (size_t)(g + i) * a->q_head;
    return ng;
}

/* One pass over the keys [j0, j0 + nb) of a block: scores into sc
 * (kv = 0: sc[g][j - j0] = scale q_g . K_j) or values into acc (kv = 1:
 * acc[g] += sum_j sc[g][j - j0] V_j), a whole query group per K/V row.
 * With AVX2 and an f32 cache the block's pages go in pairs (k, k + half),
 * two streams at once. Measured (1 thread, 8K context, 6 layers of
 * 2 KV heads x 256, f32 KV beyond the last-level cache): one page at a
 * time 5.4-7.1 GB/s, pairs 8.0-9.8 GB/s (x1.45, the same on 2 threads);
 * perf showed the one-page loops waiting on the K/V loads. Four pages at
 * once measured within 5% of pairs; prefetching the next pages in
 * software ran into the per-core limit on outstanding misses instead. */
static void decode_pass(const attn_args *a, int kv, int t, int kvh, int j0, int nb, float *sc, float *acc,
                        float *buf)
{
    const int G = a->n_head / a->n_kv, HD = a->head_dim, P = a->kv.page_tokens, B = ATTN_DEC_PAGES * P;
    const bool avx = simd_avx2() && HD % 8 == 0, a512 = avx && HD % 16 == 0 && simd_avx512();
    const float *q[4];
    int jp = j0;
    if (avx && decode_pairs && a->kv.type == GGML_F32) {
        const int half = (nb + P - 1) / P / 2;
        for (int k = 0; k < half; k++) {
            const int ja = j0 + k * P, jb = j0 + (k + half) * P;
            const int nB = j0 + nb - jb < P ? j0 + nb - jb : P;        /* B may be the last, partial page */
            const float *RA = kv_row(&a->kv, kv, kvh, ja), *RB = kv_row(&a->kv, kv, kvh, jb);
            for (int g = 0; g < G; g += 4) {
                const int ng = group_q(a, t, kvh, g, q);
                float *sA = sc + (size_t)g * B + (ja - j0), *sB = sc + (size_t)g * B + (jb - j0);
                if (kv == 0) {
                    if (a512)   /* the V rows of these keys, once per page pair (the first group) */
                        qk_pairs512(q, ng, RA, RB, nB, HD, a->scale, sA, sB, B,
                                    g ? NULL : (const char *)kv_row(&a->kv, 1, kvh, ja),
                                    (const char *)kv_row(&a->kv, 1, kvh, jb));
                    else
                        qk_pairs(q, ng, RA, RB, nB, (size_t)HD, HD, a->scale, sA, sB, 1, B);
                    if (nB < P)
                        qk_group4(q, ng, RA + (size_t)nB * HD, P - nB, HD, a->scale, sA + nB, B);
                } else {
                    if (a512) {     /* the next block's K pages, where the row sees them */
                        const int nk = a->pos0 + t + 1;
                        const char *pa = !g && ja + B < nk ? (const char *)kv_row(&a->kv, 0, kvh, ja + B) : NULL;
                        const char *pb = pa && jb + B < nk ? (const char *)kv_row(&a->kv, 0, kvh, jb + B) : NULL;
                        pv_two512(sA, sB, B, ng, RA, RB, nB, HD, acc + (size_t)g * HD, pa, pb);
                    } else {
                        pv_two(sA, sB, B, ng, RA, RB, nB, HD, acc + (size_t)g * HD);
                    }
                    if (nB < P)
                        pv_group4(sA + nB, B, ng, RA + (size_t)nB * HD, P - nB, HD, acc + (size_t)g * HD);
                }
            }
        }
        jp = j0 + 2 * half * P;
    }
    for (; jp < j0 + nb; jp += P) {                 /* one page at a time */
        const int np = j0 + nb - jp < P ? j0 + nb - jp : P;
        const float *R = page_rows(a, kv, kvh, jp, np, buf);
        for (int g = 0; g < G; g += 4) {
            const int ng = group_q(a, t, kvh, g, q);
            float *s = sc + (size_t)g * B + (jp - j0);
            if (kv == 0 && avx)
                qk_group4(q, ng, R, np, HD, a->scale, s, B);
            else if (kv == 0)
                qk_plain(q, ng, R, np, HD, a->scale, s, B);
            else if (avx)
                pv_group4(s, B, ng, R, np, HD, acc + (size_t)g * HD);
            else
                pv_plain(s, B, ng, R, np, HD, acc + (size_t)g * HD);
        }
    }
}

/* Query row t against KV head kvh: blocks of ATTN_DEC_PAGES pages, each
 * K and V row read once for the G query heads of the group. */
static void decode_row(const attn_args *a, int t, int kvh, float *scr)
{
    const int G = a->n_head / a->n_kv, HD = a->head_dim, P = a->kv.page_tokens, B = ATTN_DEC_PAGES * P;
    const int nk = a->pos0 + t + 1;
    float *acc = scr, *sc = acc + (size_t)G * HD, *buf = sc + (size_t)G * B;
    float *m = buf + (size_t)P * HD, *l = m + G;
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)G * HD);
    /* per block: the scores, one online-softmax step, then p.V */
    for (int j0 = 0; j0 < nk; j0 += B) {
        const int nb = nk - j0 < B ? nk - j0 : B;
        decode_pass(a, 0, t, kvh, j0, nb, sc, acc, buf);
        for (int g = 0; g < G; g++)
            softmax_step(sc + (size_t)g * B, nb, nb, &m[g], &l[g], acc + (size_t)g * HD, HD);
        decode_pass(a, 1, t, kvh, j0, nb, sc, acc, buf);
    }
    for (int g = 0; g < G; g++) {                   /* o = acc / l */
        float *o = a->out + (size_t)t * a->out_stride + (size_t)(kvh * G + g) * HD;
        const float inv = 1.0f / l[g];
        for (int i = 0; i < HD; i++)
            o[i] = acc[(size_t)g * HD + i] * inv;
    }
}

/* ------------------------------------------------------------------ */
/* tiled path: a block of query rows x the group, key blocks on sgemm   */

static void tiled_block(const attn_args *a, int kvh, int t0, int t1, float *scr)
{
    const int G = a->n_head / a->n_kv, HD = a->head_dim, R = (t1 - t0) * G, RM = ATTN_BQ * G;
    float *Qb = scr, *O = Qb + (size_t)RM * HD, *Sb = O + (size_t)RM * HD;
    float *Kt = Sb + (size_t)RM * ATTN_BK, *Vt = Kt + (size_t)ATTN_BK * HD;
    float *m = Vt + (size_t)ATTN_BK * HD, *l = m + RM;

    /* Qb row r = (t - t0) G + g: q of row t, head kvh G + g, times scale */
    for (int r = 0; r < R; r++) {
        const int t = t0 + r / G, h = kvh * G + r % G;
        const float *q = a->Q + (size_t)t * a->q_stride + (size_t)h * a->q_head;
        for (int d = 0; d < HD; d++)
            Qb[(size_t)r * HD + d] = q[d] * a->scale;
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)R * HD);
    const int last = a->pos0 + t1 - 1;              /* the block's last row sees keys 0..last */
    for (int k0 = 0; k0 <= last; k0 += ATTN_BK) {
        const int nk = last + 1 - k0 < ATTN_BK ? last + 1 - k0 : ATTN_BK;
        gather_rows(a, 0, kvh, k0, nk, Kt);
        gather_rows(a, 1, kvh, k0, nk, Vt);
        /* S = Qb Kt^T */
        gemm(false, true, R, nk, HD, 1.0f, Qb, HD, Kt, HD, 0.0f, Sb, ATTN_BK);
        for (int r = 0; r < R; r++) {
            /* row t sees keys j <= pos0 + t: nv of this block's nk */
            int nv = a->pos0 + t0 + r / G - k0 + 1;
            nv = nv < 0 ? 0 : nv > nk ? nk : nv;
            softmax_step(Sb + (size_t)r * ATTN_BK, nk, nv, &m[r], &l[r], O + (size_t)r * HD, HD);
        }
        /* O += P Vt */
        gemm(false, false, R, HD, nk, 1.0f, Sb, ATTN_BK, Vt, HD, 1.0f, O, HD);
    }
    for (int r = 0; r < R; r++) {                   /* out = O / l */
        const int t = t0 + r / G, h = kvh * G + r % G;
        float *o = a->out + (size_t)t * a->out_stride + (size_t)h * HD;
        const float inv = 1.0f / l[r];
        for (int d = 0; d < HD; d++)
            o[d] = O[(size_t)r * HD + d] * inv;
    }
}

/* ------------------------------------------------------------------ */

/* whether a call takes the tiled path (else a decode row per row and KV head) */
static bool tiled(const attn_args *a)
{
    return a->n >= tiled_min_rows && !a->decode_rows;
}

void attn_gqa(const attn_args *a, float *scratch)
{
    const int G = a->n_head / a->n_kv;
    const long per = attn_scratch_floats(a->head_dim, G, a->kv.page_tokens);
    if (tiled(a)) {
        /* work items: KV head x query block, the longest (last) blocks first */
        const int nqb = (a->n + ATTN_BQ - 1) / ATTN_BQ, items = nqb * a->n_kv;
        #pragma omp parallel for schedule(dynamic, 1)
        for (int it = 0; it < items; it++) {
            const int kvh = it % a->n_kv, qb = nqb - 1 - it / a->n_kv;
            const int t0 = qb * ATTN_BQ, t1 = t0 + ATTN_BQ < a->n ? t0 + ATTN_BQ : a->n;
            tiled_block(a, kvh, t0, t1, scratch + (size_t)omp_get_thread_num() * per);
        }
        return;
    }
    const int items = a->n * a->n_kv;
    #pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int it = 0; it < items; it++)
        decode_row(a, it / a->n_kv, it % a->n_kv, scratch + (size_t)omp_get_thread_num() * per);
}

void attn_gqa_batch(attn_args *a, int n, float *scratch)
{
    int units = 0;
    long per = 0;
    for (int i = 0; i < n; i++) {
        if (tiled(&a[i])) {
            attn_gqa(&a[i], scratch);
        } else {
            units += a[i].n * a[i].n_kv;
            per = attn_scratch_floats(a[i].head_dim, a[i].n_head / a[i].n_kv, a[i].kv.page_tokens);
        }
    }
    if (units == 0)
        return;
    #pragma omp parallel for schedule(dynamic, 1) if (units > 1)
    for (int u = 0; u < units; u++) {
        int i = 0, r = u;                           /* unit u: call i, row r / n_kv, KV head r % n_kv */
        while (tiled(&a[i]) || r >= a[i].n * a[i].n_kv) {
            if (!tiled(&a[i]))
                r -= a[i].n * a[i].n_kv;
            i++;
        }
        decode_row(&a[i], r / a[i].n_kv, r % a[i].n_kv, scratch + (size_t)omp_get_thread_num() * per);
    }
}

/* simd_exp.h - e^x in AVX2 lanes, shared by the kernels that need it
 * (simd_avx2.c: SiLU and sigmoid gates; attn.c: softmax).
 *
 * e^x = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 split in a
 * high part exact in few bits and a low correction, so n ln2_hi is exact),
 * |r| <= ln2 / 2; e^r by its Taylor polynomial to degree 7 (truncation
 * r^8 / 8! < 5.3e-9 relative), 2^n built in the exponent field.
 * Include only from files compiled with AVX2 function attributes.
 */
#ifndef HYSERVE_SIMD_EXP_H
#define HYSERVE_SIMD_EXP_H

#include <immintrin.h>

/* x clamped to [-87, 88] first (2^n stays a normal float) */
__attribute__((target("avx2,fma"))) static inline __m256 exp256_clamped(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440054690583e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* for the softmax: x <= 0, and exactly 0 below -87 (so -inf, a masked
 * score, gives 0) */
__attribute__((target("avx2,fma"))) static inline __m256 exp256_neg(__m256 x)
{
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);     /* includes -inf */
    return _mm256_andnot_ps(under, exp256_clamped(x));
}

#endif

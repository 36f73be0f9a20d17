/* quant.c - block formats: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
 * ref: docs/models.md section 5; IEEE 754 binary16. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "ggml_type.h"
#include "simd.h"
#include "simd512.h"
#include "simd_kquant.h"

bool quant_supported(uint32_t type)
{
    switch (type) {
    case GGML_F32: case GGML_F16: case GGML_BF16: case GGML_Q8_0: case GGML_Q4_0:
    case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K:
        return true;
    default:
        return false;
    }
}

const char *quant_supported_list(void)
{
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K";
}

/* Q8_0 block: half d; int8 qs[32]; x[i] = d * qs[i]. */
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;
/* Q4_0 block: half d; u8 qs[16]; x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8). */
typedef struct { uint16_t d; uint8_t qs[16]; } block_q4_0;
/* Q4_K super-block of 256: half d, dmin; 6-bit scales/mins packed in 12 bytes; 4-bit qs. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_k;
/* Q5_K: as Q4_K plus one high bit per element in qh. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } block_q5_k;
/* Q6_K: low 4 bits in ql, high 2 bits in qh, int8 scale per 16, half d last. */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } block_q6_k;

_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(block_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(block_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(block_q6_k) == 210, "Q6_K block is 210 bytes");

/* 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K super-block. */
void kq_scale_min(const uint8_t *sc, int s, int *scale, int *min)
{
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

static void kq_pack_scales(uint8_t *out, const int *sc, const int *mn)
{
    for (int s = 0; s < 4; s++) {
        out[s] = (uint8_t)((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
        out[s + 4] = (uint8_t)((mn[s] & 63) | ((mn[s + 4] >> 4) << 6));
        out[s + 8] = (uint8_t)((sc[s + 4] & 15) | ((mn[s + 4] & 15) << 4));
    }
}

static void deq_q4_0(const block_q4_0 *b, float *y)
{
    float d = fp16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((b->qs[j] & 15) - 8);
        y[j + 16] = d * (float)((b->qs[j] >> 4) - 8);
    }
}

static void deq_q4_k(const block_q4_k *b, float *y)
{
    float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
    for (int j = 0; j < 4; j++) {
        const uint8_t *q = b->qs + 32 * j;
        int sc1, m1, sc2, m2;
        kq_scale_min(b->scales, 2 * j, &sc1, &m1);
        kq_scale_min(b->scales, 2 * j + 1, &sc2, &m2);
        float d1 = d * (float)sc1, mm1 = dmin * (float)m1, d2 = d * (float)sc2, mm2 = dmin * (float)m2;
        for (int l = 0; l < 32; l++) {
            y[64 * j + l] = d1 * (float)(q[l] & 15) - mm1;
            y[64 * j + 32 + l] = d2 * (float)(q[l] >> 4) - mm2;
        }
    }
}

static void deq_q5_k(const block_q5_k *b, float *y)
{
    float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
    for (int j = 0; j < 4; j++) {
        const uint8_t *q = b->qs + 32 * j;
        const uint8_t u1 = (uint8_t)(1u << (2 * j)), u2 = (uint8_t)(2u << (2 * j));
        int sc1, m1, sc2, m2;
        kq_scale_min(b->scales, 2 * j, &sc1, &m1);
        kq_scale_min(b->scales, 2 * j + 1, &sc2, &m2);
        float d1 = d * (float)sc1, mm1 = dmin * (float)m1, d2 = d * (float)sc2, mm2 = dmin * (float)m2;
        for (int l = 0; l < 32; l++) {
            y[64 * j + l] = d1 * (float)((q[l] & 15) + (b->qh[l] & u1 ? 16 : 0)) - mm1;
            y[64 * j + 32 + l] = d2 * (float)((q[l] >> 4) + (b->qh[l] & u2 ? 16 : 0)) - mm2;
        }
    }
}

static void deq_q6_k(const block_q6_k *b, float *y)
{
    float d = fp16_to_f32(b->d);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
        const int8_t *sc = b->scales + 8 * n;
        float *yy = y + 128 * n;
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yy[l] = d * (float)sc[is + 0] * (float)q1;
            yy[l + 32] = d * (float)sc[is + 2] * (float)q2;
            yy[l + 64] = d * (float)sc[is + 4] * (float)q3;
            yy[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

void dequant_row(uint32_t type, const void *src, float *restrict dst, int n)
{
    switch (type) {
    case GGML_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case GGML_F16: {
        const uint16_t *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = fp16_to_f32(s[i]);
        break;
    }
    case GGML_BF16: {
        const uint16_t *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = bf16_to_f32(s[i]);
        break;
    }
    case GGML_Q8_0: {
        const block_q8_0 *b = src;
        for (int i = 0; i < n / 32; i++) {
            float d = fp16_to_f32(b[i].d);
            for (int j = 0; j < 32; j++)
                dst[i * 32 + j] = d * (float)b[i].qs[j];
        }
        break;
    }
    case GGML_Q4_0:
        for (int i = 0; i < n / 32; i++)
            deq_q4_0((const block_q4_0 *)src + i, dst + 32 * i);
        break;
    case GGML_Q4_K:
        for (int i = 0; i < n / 256; i++)
            deq_q4_k((const block_q4_k *)src + i, dst + 256 * i);
        break;
    case GGML_Q5_K:
        for (int i = 0; i < n / 256; i++)
            deq_q5_k((const block_q5_k *)src + i, dst + 256 * i);
        break;
    case GGML_Q6_K:
        for (int i = 0; i < n / 256; i++)
            deq_q6_k((const block_q6_k *)src + i, dst + 256 * i);
        break;
    default:
        memset(dst, 0, (size_t)n * 4);
    }
}

float dot_row(uint32_t type, const void *row, const float *restrict x, int n)
{
    float acc = 0.0f;
    switch (type) {
    case GGML_F32: {
        const float *w = row;
        for (int i = 0; i < n; i++)
            acc += w[i] * x[i];
        break;
    }
    case GGML_F16: {
        const uint16_t *w = row;
        for (int i = 0; i < n; i++)
            acc += fp16_to_f32(w[i]) * x[i];
        break;
    }
    case GGML_BF16: {
        const uint16_t *w = row;
        for (int i = 0; i < n; i++)
            acc += bf16_to_f32(w[i]) * x[i];
        break;
    }
    case GGML_Q8_0: {
        const block_q8_0 *b = row;
        for (int i = 0; i < n / 32; i++) {
            float s = 0.0f;
            for (int j = 0; j < 32; j++)
                s += (float)b[i].qs[j] * x[i * 32 + j];
            acc += fp16_to_f32(b[i].d) * s;
        }
        break;
    }
    case GGML_Q4_0: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: {
        /* dequantize one block at a time on the stack: no f32 copy of the row */
        const size_t bs = ggml_block_size(type), tsz = ggml_type_size(type);
        float tmp[256];
        for (int i = 0; i < n / (int)bs; i++) {
            dequant_row(type, (const char *)row + (size_t)i * tsz, tmp, (int)bs);
            float s = 0.0f;
            for (int j = 0; j < (int)bs; j++)
                s += tmp[j] * x[(size_t)i * bs + (size_t)j];
            acc += s;
        }
        break;
    }
    default:
        break;
    }
    return acc;
}

/* Encoders: simple min/max fits, valid blocks (not llama.cpp's search). */
static void quant_q4_0(const float *x, block_q4_0 *b)
{
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f32_to_fp16(d);
    for (int j = 0; j < 16; j++) {
        int q0 = (int)lrintf(x[j] * id) + 8, q1 = (int)lrintf(x[j + 16] * id) + 8;
        q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
        q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
        b->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void quant_q45_k(const float *x, void *dst, bool five)
{
    const int qmax = five ? 31 : 15;
    float scale[8], mn[8], smax = 0.0f, mmax = 0.0f;
    for (int s = 0; s < 8; s++) {
        float lo = 0.0f, hi = 0.0f;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * s + l]);
            hi = fmaxf(hi, x[32 * s + l]);
        }
        scale[s] = (hi - lo) / (float)qmax;
        mn[s] = -lo;
        smax = fmaxf(smax, scale[s]);
        mmax = fmaxf(mmax, mn[s]);
    }
    float d = smax / 63.0f, dmin = mmax / 63.0f;
    uint16_t dh = f32_to_fp16(d), dmh = f32_to_fp16(dmin);
    d = fp16_to_f32(dh);
    dmin = fp16_to_f32(dmh);
    int sc[8], mi[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = d > 0 ? (int)lrintf(scale[s] / d) : 0;
        mi[s] = dmin > 0 ? (int)lrintf(mn[s] / dmin) : 0;
        sc[s] = sc[s] > 63 ? 63 : sc[s];
        mi[s] = mi[s] > 63 ? 63 : mi[s];
    }
    uint8_t q[256];
    for (int s = 0; s < 8; s++) {
        float ds = d * (float)sc[s], ms = dmin * (float)mi[s];
        for (int l = 0; l < 32; l++) {
            int v = ds > 0 ? (int)lrintf((x[32 * s + l] + ms) / ds) : 0;
            q[32 * s + l] = (uint8_t)(v < 0 ? 0 : v > qmax ? qmax : v);
        }
    }
    uint8_t *scales, *qs, *qh = NULL;
    if (five) {
        block_q5_k *b = dst;
        b->d = dh; b->dmin = dmh; scales = b->scales; qs = b->qs; qh = b->qh;
        memset(qh, 0, 32);
    } else {
        block_q4_k *b = dst;
        b->d = dh; b->dmin = dmh; scales = b->scales; qs = b->qs;
    }
    kq_pack_scales(scales, sc, mi);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            uint8_t lo = q[64 * j + l], hi = q[64 * j + 32 + l];
            qs[32 * j + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            if (qh) {
                if (lo & 16) qh[l] |= (uint8_t)(1u << (2 * j));
                if (hi & 16) qh[l] |= (uint8_t)(2u << (2 * j));
            }
        }
}

static void quant_q6_k(const float *x, block_q6_k *b)
{
    float scale[16], amax = 0.0f;
    for (int s = 0; s < 16; s++) {
        float m = 0.0f;
        for (int l = 0; l < 16; l++)
            m = fmaxf(m, fabsf(x[16 * s + l]));
        scale[s] = m / 31.0f;
        amax = fmaxf(amax, scale[s]);
    }
    float d = amax / 127.0f;
    b->d = f32_to_fp16(d);
    d = fp16_to_f32(b->d);
    int q[256];
    for (int s = 0; s < 16; s++) {
        int sc = d > 0 ? (int)lrintf(scale[s] / d) : 0;
        sc = sc > 127 ? 127 : sc;
        b->scales[s] = (int8_t)sc;
        float ds = d * (float)sc;
        for (int l = 0; l < 16; l++) {
            int v = ds > 0 ? (int)lrintf(x[16 * s + l] / ds) : 0;
            q[16 * s + l] = (v < -32 ? -32 : v > 31 ? 31 : v) + 32;
        }
    }
    memset(b->qh, 0, 64);
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const int *qq = q + 128 * n;
            b->ql[64 * n + l] = (uint8_t)((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
            b->ql[64 * n + l + 32] = (uint8_t)((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
            b->qh[32 * n + l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                          ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
        }
}

void quantize_row(uint32_t type, const float *src, void *dst, int n)
{
    switch (type) {
    case GGML_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case GGML_F16: {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++)
            d[i] = f32_to_fp16(src[i]);
        break;
    }
    case GGML_BF16: {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++)
            d[i] = f32_to_bf16(src[i]);
        break;
    }
    case GGML_Q8_0: {
        block_q8_0 *b = dst;
        for (int i = 0; i < n / 32; i++) {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(src[i * 32 + j]));
            float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            b[i].d = f32_to_fp16(d);
            for (int j = 0; j < 32; j++)
                b[i].qs[j] = (int8_t)lrintf(src[i * 32 + j] * id);
        }
        break;
    }
    case GGML_Q4_0:
        for (int i = 0; i < n / 32; i++)
            quant_q4_0(src + 32 * i, (block_q4_0 *)dst + i);
        break;
    case GGML_Q4_K:
    case GGML_Q5_K:
        for (int i = 0; i < n / 256; i++)
            quant_q45_k(src + 256 * i, (char *)dst + (size_t)i * ggml_type_size(type), type == GGML_Q5_K);
        break;
    case GGML_Q6_K:
        for (int i = 0; i < n / 256; i++)
            quant_q6_k(src + 256 * i, (block_q6_k *)dst + i);
        break;
    default:
        break;
    }
}

/* ---- fast paths and the int8-activation references ---- */

/* The fast paths go through the kernel table (cpu.h), filled with the
 * per-level entry points below. */
void quantize_row_fast(uint32_t type, const float *src, void *dst, int n)
{
    cpu_kern.quantize_row(type, src, dst, n);
}

void dequant_row_fast(uint32_t type, const void *src, float *dst, int n)
{
    cpu_kern.dequant_row(type, src, dst, n);
}

float dot_row_fast(uint32_t type, const void *row, const float *x, int n)
{
    return cpu_kern.dot_row(type, row, x, n);
}

void quantize_row_avx2(uint32_t type, const float *src, void *dst, int n)
{
    if (type == GGML_BF16)
        avx2_quant_bf16(src, dst, n);
    else
        quantize_row(type, src, dst, n);
}

void dequant_row_avx2(uint32_t type, const void *src, float *dst, int n)
{
    switch (type) {
    case GGML_F16: avx2_dequant_f16(src, dst, n); return;
    case GGML_BF16: avx2_dequant_bf16(src, dst, n); return;
    case GGML_Q8_0: avx2_dequant_q8_0(src, dst, n); return;
    case GGML_Q4_0: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: avx2_dequant_kq(type, src, dst, n); return;
    default: dequant_row(type, src, dst, n); return;
    }
}

void dequant_row_avx512(uint32_t type, const void *src, float *dst, int n)
{
    switch (type) {
    case GGML_F16: avx512_dequant_f16(src, dst, n); return;
    case GGML_BF16: avx512_dequant_bf16(src, dst, n); return;
    default: dequant_row_avx2(type, src, dst, n); return;
    }
}

float dot_row_avx2(uint32_t type, const void *row, const float *x, int n)
{
    switch (type) {
    case GGML_F32: return avx2_dot_f32(row, x, n);
    case GGML_F16: return avx2_dot_f16(row, x, n);
    case GGML_BF16: return avx2_dot_bf16(row, x, n);
    case GGML_Q8_0: return avx2_dot_q8_0(row, x, n);
    default: return dot_row(type, row, x, n);
    }
}

void quantize_act_q8_ref(const float *x, int n, int8_t *q, float *d)
{
    for (int b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[32 * b + j]));
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;   /* d = max|x| / 127 */
        d[b] = db;
        for (int j = 0; j < 32; j++)
            q[32 * b + j] = (int8_t)lrintf(x[32 * b + j] * id);          /* q = round(x / d) */
    }
}

float dot_q8_0_act_ref(const void *row, const int8_t *q, const float *d, int n)
{
    const block_q8_0 *b = row;
    float acc = 0.0f;
    for (int i = 0; i < n / 32; i++) {
        int32_t s = 0;                                          /* exact: |s| <= 32 * 128 * 127 */
        for (int j = 0; j < 32; j++)
            s += (int32_t)b[i].qs[j] * q[32 * i + j];
        acc += fp16_to_f32(b[i].d) * d[i] * (float)s;           /* dw dq sum w q */
    }
    return acc;
}

void quantize_act_q8(const float *x, int n, int8_t *q, float *d)
{
    cpu_kern.quantize_act_q8(x, n, q, d);
}

float dot_q8_0_act(const void *row, const int8_t *q, const float *d, int n)
{
    return cpu_kern.dot_q8_0_act(row, q, d, n);
}

/* ---- K-quants and Q4_0 on int8 activations (quant.h) ---- */

bool quant_int8_act(uint32_t type)
{
    return type == GGML_Q8_0 || type == GGML_Q4_0 || type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K;
}

int quant_act_block(uint32_t type)
{
    return type == GGML_Q8_0 || type == GGML_Q4_0 ? 32 : 256;
}

void quantize_act_q8k_ref(const float *x, int n, int8_t *q, float *d, int16_t *bsums)
{
    for (int b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        float amax = 0.0f;
        for (int j = 0; j < 256; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;    /* d = max|x| / 127 */
        d[b] = db;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) {
                int v = (int)lrintf(xb[16 * g + j] * id);                 /* q = round(x / d) */
                q[256 * b + 16 * g + j] = (int8_t)v;
                s += v;
            }
            bsums[16 * b + g] = (int16_t)s;                             /* |s| <= 16 * 127 */
        }
    }
}

/* Q4_K / Q5_K super-block against int8 activations: the integer parts
 * sum_s sc_s sum_l q_w q (into *si) and sum_s mn_s bsum_s (into *sm). */
static void kq45_isums(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, const int8_t *q,
                       const int16_t *bs, int32_t *si, int32_t *sm)
{
    int32_t a = 0, m = 0;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        kq_scale_min(scales, s, &sc, &mn);
        const int j = s / 2, hi = s & 1;                /* sub-block s: nibble hi of qs[32 j + l] */
        int32_t t = 0;
        for (int l = 0; l < 32; l++) {
            int w = hi ? qs[32 * j + l] >> 4 : qs[32 * j + l] & 15;
            if (qh && (qh[l] >> s & 1))                 /* Q5_K: bit s of qh[l] is bit 4 */
                w += 16;
            t += w * q[32 * s + l];
        }
        a += sc * t;                                    /* |a| <= 8 * 63 * 32 * 31 * 127 */
        m += mn * (bs[2 * s] + bs[2 * s + 1]);
    }
    *si = a;
    *sm = m;
}

float dot_kq_act_ref(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n / 256; i++) {
        const int8_t *qb = q + 256 * i;
        const int16_t *bs = bsums + 16 * i;
        if (type == GGML_Q6_K) {
            const block_q6_k *b = (const block_q6_k *)row + i;
            int32_t a = 0;
            for (int e = 0; e < 256; e++) {             /* element e = 128 n + 32 k + l */
                const int nn = e / 128, k = (e / 32) & 3, l = e & 31;
                const uint8_t lq = b->ql[64 * nn + l + 32 * (k & 1)];
                const int w = ((k < 2 ? lq & 15 : lq >> 4) | ((b->qh[32 * nn + l] >> (2 * k) & 3) << 4));
                a += b->scales[e / 16] * w * qb[e];     /* sc sum q_w q ... */
            }
            for (int g = 0; g < 16; g++)
                a -= 32 * b->scales[g] * bs[g];         /* ... - 32 sc bsum */
            acc += d[i] * (fp16_to_f32(b->d) * (float)a);
        } else {
            const block_q4_k *b4 = (const block_q4_k *)row + i;
            const block_q5_k *b5 = (const block_q5_k *)row + i;
            const bool five = type == GGML_Q5_K;
            int32_t si, sm;
            kq45_isums(five ? b5->scales : b4->scales, five ? b5->qs : b4->qs, five ? b5->qh : NULL, qb, bs, &si,
                       &sm);
            const float dd = fp16_to_f32(five ? b5->d : b4->d), dm = fp16_to_f32(five ? b5->dmin : b4->dmin);
            acc += d[i] * (dd * (float)si - dm * (float)sm);
        }
    }
    return acc;
}

float dot_q4_0_act_ref(const void *row, const int8_t *q, const float *d, int n)
{
    const block_q4_0 *b = row;
    float acc = 0.0f;
    for (int i = 0; i < n / 32; i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += ((b[i].qs[j] & 15) - 8) * q[32 * i + j] + ((b[i].qs[j] >> 4) - 8) * q[32 * i + j + 16];
        acc += fp16_to_f32(b[i].d) * d[i] * (float)s;             /* dw dq sum (q_w - 8) q */
    }
    return acc;
}

void quantize_act_q8k(const float *x, int n, int8_t *q, float *d, int16_t *bsums)
{
    cpu_kern.quantize_act_q8k(x, n, q, d, bsums);
}

float dot_kq_act(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums, int n)
{
    return cpu_kern.dot_kq_act(type, row, q, d, bsums, n);
}

float dot_q4_0_act(const void *row, const int8_t *q, const float *d, int n)
{
    return cpu_kern.dot_q4_0_act(row, q, d, n);
}

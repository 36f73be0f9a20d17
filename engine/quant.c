/* quant.c - block formats: F32, F16, BF16, Q8_0.
 * ref: ../shared/docs/architectures.md section 5; IEEE 754 binary16. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "gguf.h"

bool quant_supported(uint32_t type)
{
    return type == GGML_F32 || type == GGML_F16 || type == GGML_BF16 || type == GGML_Q8_0;
}

const char *quant_supported_list(void)
{
    return "F32, F16, BF16, Q8_0";
}

float fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {                            /* subnormal: man * 2^-24 */
            float f = (float)man * 0x1p-24f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)                  /* inf or nan */
        return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
    if (ax >= 0x477ff000u)                  /* rounds past 65504: inf */
        return sign | 0x7c00;
    if (ax < 0x38800000u) {                 /* below 2^-14: subnormal half */
        float a;
        memcpy(&a, &ax, 4);
        float m = a * 0x1p24f;              /* units of 2^-24 */
        return sign | (uint16_t)lrintf(m);  /* lrintf rounds to nearest even */
    }
    uint32_t e = (ax >> 23) - 112, man = ax & 0x7fffff;
    uint32_t h = (e << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;                                /* may carry into the exponent: correct */
    return sign | (uint16_t)h;
}

float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* Q8_0 block: half d; int8 qs[32]; x[i] = d * qs[i]. */
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;

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
    default:
        break;
    }
    return acc;
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
    default:
        break;
    }
}

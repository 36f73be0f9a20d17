/* half.c - f16 and bf16 numbers to and from f32.
 * ref: IEEE 754 binary16; bfloat16 is the top half of a binary32. */
#include "half.h"

#include <math.h>
#include <string.h>

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

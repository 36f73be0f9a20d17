/* kq_blocks.h - random K-quant and Q4_0 blocks and int8 activations for the
 * tests of the int8 products (test_kquant.c, test_kqtile.c).
 *
 * Owns: one seeded generator, rows of random bytes whose half-precision
 * scales include the extremes (docs/models.md section 5 for where each
 * block keeps them), and the activations quantized and dotted by the
 * scalar references (quant.h). Each test file gets its own copy of the
 * generator state (static): set kqb_rng before drawing.
 */
#ifndef HYSERVE_TESTS_KQ_BLOCKS_H
#define HYSERVE_TESTS_KQ_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "gguf.h"
#include "kernels/half.h"
#include "kernels/quant.h"

static uint32_t kqb_rng;

/* a 24-bit draw of a linear congruential generator (Numerical Recipes' constants) */
static inline uint32_t kqb_next(void)
{
    kqb_rng = kqb_rng * 1664525u + 1013904223u;
    return kqb_rng >> 8;
}

static inline float kqb_frand(void)     /* uniform in [-1, 1) */
{
    return (float)kqb_next() / (float)(1u << 23) - 1.0f;
}

/* half-precision scales: ordinary ones (two picks in three) and the
 * extremes (largest finite, smallest subnormal and normal, negative, zero, one) */
static inline uint16_t kqb_half(int pick)
{
    static const uint16_t extreme[] = { 0x7bff, 0x0001, 0x0400, 0xfbff, 0x8000, 0x0000, 0x3c00 };
    if (pick % 3 != 0)
        return f32_to_fp16(kqb_frand() * 0.05f);
    return extreme[(pick / 3) % (int)(sizeof extreme / sizeof extreme[0])];
}

/* A row of n elements of random bytes, with its scale fields (d, and
 * dmin for Q4_K/Q5_K) set from kqb_half. */
static inline void kqb_random_row(uint32_t type, void *row, int n, int seed)
{
    const size_t bs = ggml_type_size(type), nb = (size_t)n / ggml_block_size(type);
    uint8_t *p = row;
    for (size_t i = 0; i < bs * nb; i++)
        p[i] = (uint8_t)kqb_next();
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * bs;
        const uint16_t d = kqb_half(seed + (int)b), dmin = kqb_half(seed + 2 * (int)b + 1);
        switch (type) {
        case GGML_Q6_K: memcpy(blk + 208, &d, 2); break;
        case GGML_Q4_0: memcpy(blk, &d, 2); break;
        default: memcpy(blk, &d, 2); memcpy(blk + 2, &dmin, 2); break;
        }
    }
}

/* x quantized by the scalar references as matmul lays a token out for
 * this weight type: q [n], d [n / 32] (Q4_0, Q8_0) or [n / 256]
 * (K-quants), and bs [n / 16] the sums of 16 consecutive q (the prompt
 * tiles read them for Q4_0 too) */
static inline void kqb_quantize(uint32_t type, const float *x, int n, int8_t *q, float *d, int16_t *bs)
{
    if (type == GGML_Q4_0 || type == GGML_Q8_0) {
        quantize_act_q8_ref(x, n, q, d);
        for (int g = 0; g < n / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += q[16 * g + j];
            bs[g] = (int16_t)s;
        }
    } else {
        quantize_act_q8k_ref(x, n, q, d, bs);
    }
}

/* row . x on those activations: the scalar reference of the type */
static inline float kqb_ref(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bs, int n)
{
    return type == GGML_Q4_0 ? dot_q4_0_act_ref(row, q, d, n) : dot_kq_act_ref(type, row, q, d, bs, n);
}

#endif

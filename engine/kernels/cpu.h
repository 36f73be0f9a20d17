/* cpu.h - CPU-feature dispatch: the level the kernels run at, and one table
 * of kernel pointers chosen for it.
 *
 * Owns: probing the CPU (once, in a constructor: __builtin_cpu_supports and
 * Linux's AMX tile permission), reading HYSERVE_SIMD, the switches tests use
 * to lower the level (simd_set_*), and `cpu_kern`: the features in use and
 * the kernels every caller goes through. The table is filled at start-up
 * and rebuilt by each switch, so a level change takes effect on the next
 * call. Does not own: the kernels (vecmath.c, simd_*.c, quant.c, attn.c)
 * or the choice of a kernel by shape (matmul.c, panels.c and attn.c read
 * the features, simd_avx2() and the like below, for that).
 *
 * This header is the bottom of the kernel stack: it includes no other file
 * of kernels/, so every level may read the table; cpu.c, which fills it
 * with the kernels of every level, sits on top of them.
 *
 * HYSERVE_SIMD=0 runs the scalar references, =avx2 the AVX2 kernels (no
 * VNNI, AVX-512 or AMX), =avx2+vnni the same with the 256-bit AVX-VNNI
 * where the CPU has it (what an Alder Lake client runs), =avx512
 * everything but AMX. HYSERVE_BF16_DOT=dp
 * or =fma forces the BF16 decode kernel (simd_set_bf16_dot).
 */
#ifndef HYSERVE_CPU_H
#define HYSERVE_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The features the kernels use now: the CPU's, less what HYSERVE_SIMD and
 * the switches below turned off. Each implies the ones it builds on
 * (avx512 implies avx2; amx implies avx512; avx512_vnni implies avx512,
 * not vnni: Zen 4 has AVX512-VNNI without AVX-VNNI). */
typedef struct cpu_features {
    bool avx2;                  /* AVX2, FMA and F16C */
    bool vnni;                  /* AVX-VNNI */
    bool avx512;                /* AVX-512 F, BW, VL and DQ */
    bool avx512_vnni;           /* AVX512-VNNI */
    bool amx;                   /* AMX-TILE and AMX-INT8, tile state granted */
    bool amx_bf16;              /* AMX-BF16 */
    bool amx_f16;               /* AMX-BF16 and AVX512-BF16 (F16 weights split in two bf16) */
    bool avx512_bf16;           /* AVX512_BF16 (vdpbf16ps, vcvtneps2bf16) */
    bool bf16_dot;              /* BF16 decode steps on vdpbf16ps (simd_bf16.h): chosen, see simd_bf16_dot_why */
} cpu_features;

/* The kernels of the current level. Each entry has the contract of the
 * function named in its comment (whose scalar reference it is, or
 * reproduces up to float summation order); NULL where the level has no
 * kernel for it. */
typedef struct cpu_kernels {
    cpu_features on;
    const char *name;           /* "avx512+vnni", "avx2", "scalar", ...: simd_name() */
    /* vecmath.h */
    double (*sumsq)(const float *x, int n);                                 /* sumsq_ref */
    void (*scale)(float *y, const float *x, float r, const float *w, int n);   /* scale_ref */
    void (*silu_mul)(float *y, const float *x, const float *b, long n);      /* vec_silu_mul */
    void (*sigmoid_mul)(float *y, const float *g, long n);                  /* vec_sigmoid_mul */
    /* quant.h: rows of any supported type, and Q8_0 on int8 activations */
    void (*dequant_row)(uint32_t type, const void *src, float *dst, int n);   /* dequant_row */
    float (*dot_row)(uint32_t type, const void *row, const float *x, int n);  /* dot_row */
    void (*quantize_row)(uint32_t type, const float *src, void *dst, int n);  /* quantize_row, bit for bit */
    void (*quantize_act_q8)(const float *x, int n, int8_t *q, float *d);      /* quantize_act_q8_ref */
    float (*dot_q8_0_act)(const void *row, const int8_t *q, const float *d, int n);   /* dot_q8_0_act_ref */
    /* the K-quants and Q4_0 on int8 activations (quant.h) */
    void (*quantize_act_q8k)(const float *x, int n, int8_t *q, float *d, int16_t *bsums);  /* ..._ref, bit for bit */
    float (*dot_kq_act)(uint32_t type, const void *row, const int8_t *q, const float *d, const int16_t *bsums,
                        int n);                                                 /* dot_kq_act_ref */
    float (*dot_q4_0_act)(const void *row, const int8_t *q, const float *d, int n);   /* dot_q4_0_act_ref */
    /* y[r ldy] = dot_kq_act(type, W + r rb, ..) for r < n_rows, bit for bit (a K-quant type); NULL: call
     * dot_kq_act per row */
    void (*dot_kq_act_rows)(uint32_t type, const void *W, size_t rb, int n_rows, const int8_t *q, const float *d,
                            const int16_t *bsums, int n, float *y, long ldy);
    /* one K-quant row against n_tok tokens' activations, y[t ldy] = dot_kq_act(.., token t), bit for bit
     * (simd_kquant.h); NULL: call dot_kq_act per token */
    void (*dot_kq_act_tokens)(uint32_t type, const void *row, int n, const int8_t *const *q, const float *const *d,
                              const int16_t *const *bs, int n_tok, float *y, long ldy);
    /* attn.h: e^x for x <= 0 */
    void (*exp_block)(const float *x, float *y, int n);                    /* exp_neg_scalar per element */
    /* the gated delta rule, one token and one value head (simd.h);
     * dnet_step NULL: no fast recurrent step, the layer takes the chunked
     * form for prompts and the scalar recurrence for one token */
    void (*dnet_step)(int d_k, int d_v, const float *q, const float *k, const float *v, float beta, float g,
                      float *S, float *o, bool cold);
    void (*dnet_step_bf16)(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                           float g, uint16_t *S, float *o);
    /* the same on 16 lanes where d_k % 16 == 0 and d_v % 4 == 0, else NULL */
    void (*dnet_step_bf16_x16)(int d_k, int d_v, const float *q, const float *k, const float *v, float beta,
                               float g, uint16_t *S, float *o);
    /* Kimi Delta Attention and Mamba-2, one token and one head (simd.h); NULL: the scalar recurrences */
    void (*kda_step)(int d, const float *q, const float *k, const float *v, float beta, const float *eg, float *S,
                     float *o);
    void (*mamba2_step)(int hd, int ds, float a, float dt, const float *x, const float *B, const float *C, float *S,
                        float *y);
    /* Mamba-1's scan where DS % 8 == 0 (simd.h avx2_mamba1_scan; NULL: mamba1.c's loop) */
    void (*mamba1_scan)(int t0, int t1, int c0, int c1, int DS, const float *A, const float *x, int xs,
                        const float *dt, int dts, const float *BC, int bcs, float *S, float *y, int ys);
} cpu_kernels;

/* Read by every kernel call; written only at start-up and by the switches
 * below (call those while no kernel runs: not thread-safe). */
extern cpu_kernels cpu_kern;

/* true when the AVX2 kernels are in use (the CPU has AVX2, FMA and F16C and
 * they are not turned off) */
static inline bool simd_avx2(void) { return cpu_kern.on.avx2; }
/* true when the 256-bit Q8_0 matrix-vector product uses AVX-VNNI's vpdpbusd */
static inline bool simd_vnni(void) { return cpu_kern.on.vnni; }
/* true when the AVX-512 kernels are in use (simd_avx2() too) */
static inline bool simd_avx512(void) { return cpu_kern.on.avx512; }
static inline bool simd_avx512_vnni(void) { return cpu_kern.on.avx512_vnni; }
/* true when the AMX tiles are in use (simd_avx512() too) */
static inline bool simd_amx(void) { return cpu_kern.on.amx; }
static inline bool simd_amx_bf16(void) { return cpu_kern.on.amx_bf16; }
static inline bool simd_amx_f16(void) { return cpu_kern.on.amx_f16; }
/* true when BF16 weights in panels decode on vdpbf16ps against activations
 * rounded to bf16 (simd_bf16.h), false: the exact convert+FMA kernel */
static inline bool simd_bf16_dot(void) { return cpu_kern.on.bf16_dot; }

/* Tests and benchmarks: turn the fast paths off (false) or back on; on only
 * takes effect where the CPU has them. Each rebuilds `cpu_kern`.
 *   simd_set_enabled: every hand-written kernel (AVX2 and all above it);
 *   simd_set_vnni:    AVX-VNNI and AVX512-VNNI;
 *   simd_set_avx512:  AVX-512 (stays off under HYSERVE_SIMD=avx2);
 *   simd_set_amx:     the AMX tiles. */
void simd_set_enabled(bool on);
void simd_set_vnni(bool on);
void simd_set_avx512(bool on);
void simd_set_amx(bool on);
/* BF16 decode on vdpbf16ps: 1 on (where the CPU has AVX512_BF16 and
 * AVX-512 is on), 0 off (the exact kernel), -1 the start-up choice. The
 * start-up choice: HYSERVE_BF16_DOT=dp or =fma forces one, else a short
 * measurement (bf16_dot_speedup) picks vdpbf16ps where it ran faster. */
void simd_set_bf16_dot(int mode);
/* the BF16 decode kernel in use and why, one phrase for the ready line and
 * /info: "vdpbf16ps (measured 1.31x the speed of the FMA kernel)", "fma (no AVX512_BF16)" */
const char *simd_bf16_dot_why(void);

/* "avx512", "avx2" or "scalar" (with "+vnni", "+amx"): the widest
 * hand-written kernels in use */
const char *simd_name(void);

#endif

/* matmul.c - the matrix products: one entry point, the kernel per shape. */
#include "matmul.h"

#include <limits.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/blas.h"
#include "kernels/cpu.h"
#include "kernels/ggml_type.h"
#include "kernels/panels.h"
#include "kernels/quant.h"
#include "kernels/share.h"
#include "kernels/simd.h"
#include "kernels/simd_amx.h"
#include "kernels/simd512.h"
#include "kernels/simd_kqtile.h"

/* F16 prompts on packed weights up to this many tokens take the
 * outer-product kernel, longer ones sgemm on decoded panels (see
 * matmul_f16_outer_max): every length. Measured (the bench model's seven
 * projection shapes, 2 threads, best of 3-5, load 8-11 from other
 * sessions: ratios only), GFLOP/s tile / sgemm: 17 tokens 160 / 43 and
 * 105 / 35 (sgemm's cliff past small_max), 32: 169 / 41, 145 / 85, 64:
 * 126 / 75, 130 / 74, 128: 135 / 61, 116 / 70, 512: 75 / 66, 54 / 50. */
#define MATMUL_F16_OUTER_MAX INT_MAX

/* MATMUL_F32_TILE_MAX (matmul.h): F32 prompts (and decode steps) of up
 * to this many tokens take the AVX-512 rows x tokens tile
 * (matmul_small512), longer ones sgemm: from 17 tokens OpenBLAS falls off
 * its small-matrix path (the F32 form of the cliff the F16 and BF16
 * prompts lost to their panel tiles), and past 128 one thread measured
 * sgemm faster (the figures: docs/performance.md section 12). */

/* Rows dequantized per tile when a non-f32 weight meets a multi-token
 * input: each thread turns a tile to f32 and runs sgemm on it. */
#define MM_TILE_ROWS 64

/* ---- matmul: one entry point, three regimes ----
 * n_tok == 1 (decode): one dot product per row, rows split across threads
 *   in contiguous blocks (each thread streams its share of the weight);
 *   Q8_0 quantizes the activations to int8 once and runs int8 dot products.
 * 2 <= n_tok <= small_max (small prompts; F32's with AVX-512 up to
 *   matmul_f32_tile_max), and decode steps of any size (F32's up to the
 *   same limit): each weight byte is read once per step (per
 *   32 tokens on the tile).
 *   With AVX-512, F32, F16, BF16 and Q8_0 rows go straight to the rows x
 *   tokens tile, which widens them in registers; decode steps of BF16 and
 *   F16 (from AMX_MIN_TOK_F16) take the AMX tiles instead where the CPU
 *   has them, and Q8_0 decode steps keep int8 activations (AMX, or the
 *   VNNI kernel, see q8_act_step). Other types, and AVX2 machines (up to
 *   small_max tokens), decode groups of rows to f32 into a per-thread
 *   buffer for the micro-kernel.
 * larger n_tok (prefill): f32 goes straight to sgemm (past its tile's
 *   limit); other types are
 *   decoded in tiles of MM_TILE_ROWS rows per thread and each tile is one
 *   (single-threaded, inside the parallel region) sgemm. */

/* Below this many weight bytes a matrix-vector product runs on one thread:
 * the fork/join costs more than the split saves. */
#define MV_PAR_BYTES (128L * 1024)

/* matvec's unit: groups of this many rows from each weight's row 0, as
 * avx2_matvec dots 4 rows at a time and the last n_out % 4 one by one
 * (whose bits differ): a group is always whole, so every row gets the
 * same kernel whatever the split. */
#define MV_GROUP 4

static int mm_small_max = 16;

void matmul_set_small_max(int n_tok)
{
    mm_small_max = n_tok;
}

/* A prompt path's tile limit in tokens (F16 panels, F32 rows): *set when
 * a test or bench set it, else from the environment variable var ("tile":
 * every length, "sgemm" or "0": small_max; else deflt, the measured
 * default), and at least small_max. */
static int tile_limit(int *set, const char *var, int deflt)
{
    if (*set < 0) {
        const char *e = getenv(var);
        *set = e && !strcmp(e, "tile") ? INT_MAX : e && (!strcmp(e, "sgemm") || !strcmp(e, "0")) ? 0 : deflt;
    }
    return *set > mm_small_max ? *set : mm_small_max;
}

static int mm_f32_tile_max = -1;        /* tokens; -1 before the environment is read */

void matmul_set_f32_tile_max(int n_tok)
{
    mm_f32_tile_max = n_tok;
}

int matmul_f32_tile_max(void)
{
    return tile_limit(&mm_f32_tile_max, "HYSERVE_F32_PROMPT", MATMUL_F32_TILE_MAX);
}

/* the most tokens an F32 product of W takes on the tile (else sgemm): the
 * AVX-512 tile to matmul_f32_tile_max(), the AVX2 one to small_max */
static int f32_tile_limit(void)
{
    return simd_avx512() ? matmul_f32_tile_max() : simd_avx2() ? mm_small_max : 0;
}

/* ---- the K-quants and Q4_0 on int8 activations ----
 * One token's activations quantized for such a weight (quant.h): q [n_in],
 * then d [n_in / 32] (Q4_0; the K-quants use n_in / 256 of them), then
 * bsums [n_in / 16] (K-quants); act8_bytes per token, a multiple of 4. */
typedef struct act8 {
    int8_t *q;                  /* [n_in] */
    float *d;                   /* [n_in / 32] or [n_in / 256] */
    int16_t *bs;                /* [n_in / 16] */
} act8;

static size_t act8_bytes(int n_in)
{
    return (size_t)n_in + (size_t)n_in / 32 * sizeof(float) + (size_t)n_in / 16 * sizeof(int16_t) + 4;
}

static act8 act8_at(void *base, int n_in, int t)
{
    char *p = (char *)base + act8_bytes(n_in) * (size_t)t;
    act8 a = { .q = (int8_t *)p, .d = (float *)(p + n_in) };
    a.bs = (int16_t *)(a.d + n_in / 32);
    return a;
}

/* true where a K-quant or Q4_0 weight's products run on int8 activations:
 * one token, and decode steps token by token (the same arithmetic, so a
 * sequence's results do not depend on its batch); prompts stay on f32
 * (sgemm on decoded tiles), as the reference checks them */
static bool kq_act(const weight *W)
{
    return simd_avx2() && W->type != GGML_Q8_0 && quant_int8_act(W->type) && W->n_in % quant_act_block(W->type) == 0;
}

/* true for the K-quants: their activations are quantized alike
 * (quantize_act_q8k), so weights of different K-quant types share them */
static bool kq_type(uint32_t type)
{
    return type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K;
}

/* true where W[0..n) may share one matvec: one type and width, or
 * K-quants of one width on int8 activations (a Q4_K_M/Q5_K_M file mixes
 * Q4_K, Q5_K and Q6_K in one layer's products: QKV with a Q6_K V, the
 * DeltaNet's Q5_K qkv with Q4_K gates) */
static bool matvec_shares(int n, const weight *const *W)
{
    for (int i = 0; i < n; i++) {
        if (W[i]->panels || W[i]->n_in != W[0]->n_in)
            return false;
        if (W[i]->type != W[0]->type && !(kq_type(W[i]->type) && kq_type(W[0]->type) && kq_act(W[i]) && kq_act(W[0])))
            return false;
    }
    return true;
}

static void act8_quantize(uint32_t type, const float *x, int n_in, act8 a)
{
    if (type == GGML_Q4_0) {
        quantize_act_q8(x, n_in, a.q, a.d);
        for (int g = 0; g < n_in / 16; g++) {       /* the per-16 sums the prompt tiles read */
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += a.q[16 * g + j];
            a.bs[g] = (int16_t)s;
        }
    } else
        quantize_act_q8k(x, n_in, a.q, a.d, a.bs);
}

/* the pointers of n_tok tokens' activations laid out from base */
static void act8_pointers(void *base, int n_in, int n_tok, const int8_t **q, const float **d, const int16_t **bs)
{
    for (int t = 0; t < n_tok; t++) {
        const act8 a = act8_at(base, n_in, t);
        q[t] = a.q;
        d[t] = a.d;
        bs[t] = a.bs;
    }
}

/* inside a parallel region: this thread's share of n_tok tokens of X
 * quantized to base, then a barrier */
static void act8_quantize_share(uint32_t type, const float *X, int n_in, int n_tok, void *base)
{
    const int nt = omp_get_num_threads(), it = omp_get_thread_num();
    for (int t = n_tok * it / nt; t < n_tok * (it + 1) / nt; t++)
        act8_quantize(type, X + (size_t)t * n_in, n_in, act8_at(base, n_in, t));
    #pragma omp barrier
}

/* y[r] = row r . x on the activations a, rows rb bytes apart */
static void act8_rows(uint32_t type, const char *W, size_t rb, int n_rows, act8 a, int n_in, float *y, long ldy)
{
    if (type != GGML_Q4_0 && cpu_kern.dot_kq_act_rows) {
        cpu_kern.dot_kq_act_rows(type, W, rb, n_rows, a.q, a.d, a.bs, n_in, y, ldy);
        return;
    }
    for (int r = 0; r < n_rows; r++)
        y[r * ldy] = type == GGML_Q4_0 ? dot_q4_0_act(W + (size_t)r * rb, a.q, a.d, n_in)
                                       : dot_kq_act(type, W + (size_t)r * rb, a.q, a.d, a.bs, n_in);
}

/* ---- prompts on int8 products ----
 * HYSERVE_INT8_PROMPT (or matmul_set_int8_prompt): "0" prompts of every
 * type on f32 activations (sgemm on decoded tiles, or the f32 tile);
 * "1" every Q8_0, K-quant and Q4_0 prompt product on int8 activations
 * quantized per token as for one token (Q8_0: the decode-step kernels;
 * K-quants, Q4_0: simd_kqtile.h) at every level: what the reference's
 * int8 mode computes; unset (or anything else), auto: int8_rule_now(). */
static _Atomic int mm_int8_prompt = -1;     /* MATMUL_INT8_*, -1 before the environment is read */

void matmul_set_int8_prompt(int mode)
{
    atomic_store_explicit(&mm_int8_prompt, mode, memory_order_relaxed);
}

static int int8_mode(void)
{
    int m = atomic_load_explicit(&mm_int8_prompt, memory_order_relaxed);
    if (m < 0) {
        const char *e = getenv("HYSERVE_INT8_PROMPT");
        m = !e                  ? MATMUL_INT8_AUTO
            : !strcmp(e, "0")    ? MATMUL_INT8_OFF
            : !strcmp(e, "1")    ? MATMUL_INT8_ON
            : !strcmp(e, "step") ? MATMUL_INT8_STEP
                                 : MATMUL_INT8_AUTO;
        atomic_store_explicit(&mm_int8_prompt, m, memory_order_relaxed);
    }
    return m;
}

/* The automatic choice at the level in use: from how many prompt tokens
 * each weight family multiplies on int8 (0: never), and the tile's form.
 * Measured with bench/int8_ab.c (`make bench-int8`: matmul alone on the
 * bench model's MLP shapes, 3584 x 1024 and 1024 x 3584, 2 threads, int8
 * and f32 alternating in one process, the level forced in-process, the
 * AVX2 levels against OpenBLAS's Haswell core, as an AVX2-only CPU runs
 * it); docs/performance.md section 2 has the figures. */
typedef struct int8_rule {
    const char *form;           /* the int8 kernels' family, "avx512-vnni" .. "scalar" */
    int q8_0, q4_0, kq;         /* Q8_0, Q4_0, Q4_K/Q5_K/Q6_K prompts from this many tokens; 0 never */
    int q4_0_step, kq_step;     /* Q4_0, K-quant prompts of 2 to this many tokens on the decode-step
                                   kernels (kq_step_prompt); 0 never */
    bool kq_step_gap;           /* and K-quant prompts past the f32 tile (small_max) and short of the
                                   int8 tiles (kq), where the f32 path is sgemm on decoded tiles */
} int8_rule;

static int8_rule int8_rule_now(void)
{
    /* AVX512-VNNI (Zen 4/5, Ice Lake and later Xeons): time f32 / int8
     * at 512 tokens Q4_K 2.7, Q6_K 3.9, Q8_0 2.0 (panels 6.6); K-quants
     * at 8 tokens 0.2-0.5, at 32 1.5-1.8. Q4_0 below 17 tokens meets the
     * AVX-512 f32 tile, which widens its rows in registers: 0.49-0.98 at
     * 2-16 tokens, 8.3-17.8 at 32 (sgemm on decoded tiles from 17) */
    if (simd_avx512_vnni())
        return (int8_rule){ "avx512-vnni", 2, MATMUL_INT8_VNNI512_Q4_0, MATMUL_KQ_PROMPT_MIN_TOK,
                            MATMUL_STEP_VNNI512_Q4_0, MATMUL_STEP_VNNI512_KQ, true };
    /* AVX-512 without VNNI (vpmaddubsw + vpmaddwd tiles), load ~10,
     * 2 threads, medians of 5, f32 / int8 over the two shapes: Q8_0
     * 0.79-0.92 at 48-64, 0.64-0.90 at 128-512; Q4_K 0.59-1.39 at 32,
     * 1.45-1.73 at 48, 2.1-2.6 at 512; Q6_K 1.35-1.38 at 32, 1.08-1.29
     * at 48; Q4_0 1.36-2.24 at 32, 0.21-0.64 at 16. K-quants again at
     * 16-47 tokens (load ~3-4, medians of 9-11, 1 and 2 threads, Q4_K,
     * Q5_K, Q6_K): f32 / int8 0.69-0.85 at 16 (the f32 tile), 1.44-2.38 at
     * 17-32, 1.39-2.43 at 33-47 (less two stalled samples); f32 / step
     * 1.03-1.76 at 17-47: the tiles from 17 */
    if (simd_avx512())
        return (int8_rule){ "avx512", MATMUL_INT8_AVX512_Q8_0, MATMUL_INT8_AVX512_Q4_0, MATMUL_INT8_AVX512_KQ,
                            MATMUL_STEP_AVX512_Q4_0, MATMUL_STEP_AVX512_KQ, false };
    /* AVX-VNNI and AVX2 (256-bit tiles) against OpenBLAS's Haswell sgemm,
     * same conditions, AVX-VNNI / AVX2: Q8_0 (the decode-step kernels)
     * 0.76-0.84 / 0.71-0.81 from 128 tokens; at 64 tokens Q4_K 1.33-2.87
     * / 1.31-1.64, Q5_K 1.41 / 0.69-1.24, Q6_K 1.17-1.33 / 1.00-1.17,
     * Q4_0 1.21-1.94 / 1.02-1.14; at 128 every K-quant 1.04-1.53, at 512
     * 1.24-2.09; at 32 and below mixed (0.87-1.71 at 32, 0.1-0.8 at 2-8).
     * K-quants again at 16-63 tokens (load ~3-4, medians of 9-11, 2
     * threads; 1 thread alike but noisier): AVX-VNNI f32 / int8 1.20-1.94
     * at 17-63, AVX2 0.75-1.06 at 16, 1.13-1.78 at 17-32, 1.12-2.07 at
     * 33-63; f32 / step 0.53-1.55, mostly below 1 past 20: the tiles from
     * 17 */
    if (simd_vnni())
        return (int8_rule){ "avx-vnni", MATMUL_INT8_AVXVNNI_Q8_0, MATMUL_INT8_AVXVNNI_Q4_0, MATMUL_INT8_AVXVNNI_KQ,
                            MATMUL_STEP_AVX2_Q4_0, MATMUL_STEP_AVX2_KQ, false };
    if (simd_avx2())
        return (int8_rule){ "avx2", MATMUL_INT8_AVX2_Q8_0, MATMUL_INT8_AVX2_Q4_0, MATMUL_INT8_AVX2_KQ,
                            MATMUL_STEP_AVX2_Q4_0, MATMUL_STEP_AVX2_KQ, false };
    return (int8_rule){ "scalar", 0, 0, 0, 0, 0, false };
}

/* whether a prompt of n_tok tokens on a K-quant or Q4_0 weight takes the
 * decode-step kernels (where they run: kq_step_prompt), in auto up to the
 * level's step counts, with MATMUL_INT8_STEP at every length */
static bool step_rule(uint32_t type, int n_tok)
{
    if (n_tok < 2 || type == GGML_Q8_0 || !quant_int8_act(type))
        return false;
    const int mode = int8_mode();
    if (mode == MATMUL_INT8_STEP)
        return true;
    if (mode != MATMUL_INT8_AUTO)
        return false;
    const int8_rule r = int8_rule_now();
    if (type == GGML_Q4_0)
        return n_tok <= r.q4_0_step;
    return n_tok <= r.kq_step || (r.kq_step_gap && n_tok > mm_small_max && n_tok < r.kq);
}

bool matmul_int8_prompt(uint32_t type, int n_tok)
{
    const int mode = int8_mode();
    if (n_tok < 2 || !quant_int8_act(type) || mode == MATMUL_INT8_OFF)
        return false;
    if (mode == MATMUL_INT8_ON || step_rule(type, n_tok))
        return true;
    const int8_rule r = int8_rule_now();
    const int from = type == GGML_Q8_0 ? r.q8_0 : type == GGML_Q4_0 ? r.q4_0 : r.kq;
    return from > 0 && n_tok >= from;
}

/* "Q8_0 from 2 tokens" / "Q8_0 off" into p, the rest of len */
static int int8_from(char *p, size_t len, const char *what, int from)
{
    const int k = from > 0 ? snprintf(p, len, "%s from %d tokens", what, from) : snprintf(p, len, "%s off", what);
    return k < 0 ? 0 : (size_t)k < len ? k : (int)len - 1;
}

void matmul_int8_prompt_describe(char *buf, size_t len)
{
    const int mode = int8_mode();
    const int8_rule r = int8_rule_now();
    if (!len)
        return;
    if (mode == MATMUL_INT8_ON) {
        snprintf(buf, len, "%s tiles at every prompt length (HYSERVE_INT8_PROMPT=1)", r.form);
        return;
    }
    if (mode == MATMUL_INT8_OFF) {
        snprintf(buf, len, "off (HYSERVE_INT8_PROMPT=0)");
        return;
    }
    if (mode == MATMUL_INT8_STEP) {
        snprintf(buf, len, "K-quants/Q4_0 on the decode-step kernels at every prompt length (%s)", r.form);
        return;
    }
    if (!r.q8_0 && !r.q4_0 && !r.kq) {
        snprintf(buf, len, "off (%s: f32 is faster at this level)", r.form);
        return;
    }
    int k = snprintf(buf, len, "%s tiles, ", r.form);
    k = k < 0 ? 0 : (size_t)k < len ? k : (int)len - 1;
    if (r.q8_0 == r.q4_0)
        k += int8_from(buf + k, len - (size_t)k, "Q8_0/Q4_0", r.q8_0);
    else {
        k += int8_from(buf + k, len - (size_t)k, "Q8_0", r.q8_0);
        k += int8_from(buf + k, len - (size_t)k, ", Q4_0", r.q4_0);
    }
    k += int8_from(buf + k, len - (size_t)k, ", K-quants", r.kq);
    char gap[32] = "";
    int kq_upto = r.kq_step;
    if (r.kq_step_gap && r.kq > mm_small_max + 1) {
        if (r.kq_step >= mm_small_max)      /* one range: 2 to the int8 tiles */
            kq_upto = r.kq - 1;
        else
            snprintf(gap, sizeof gap, " and %d-%d", mm_small_max + 1, r.kq - 1);
    }
    if (r.kq_step > 1 && (size_t)k < len)
        k += snprintf(buf + k, len - (size_t)k, "; decode-step kernels for K-quants of 2-%d%s tokens", kq_upto, gap);
    if (r.q4_0_step > 1 && k >= 0 && (size_t)k < len)
        snprintf(buf + k, len - (size_t)k, "%s Q4_0 of 2-%d", r.kq_step > 1 ? "," : "; decode-step kernels for",
                 r.q4_0_step);
}

/* true when a short prompt of n_tok tokens on a K-quant or Q4_0 weight
 * takes the decode-step kernels (matmul_kq_act_chunk): each weight row is
 * unpacked in registers once per 8 tokens instead of decoded to f32 or
 * into a tile, so a few tokens cost little more than one; each token gets
 * the one-token product's bits (its activations quantized per block, as
 * the reference's int8 mode computes). */
static bool kq_step_prompt(const weight *W, int n_tok, bool decode)
{
    return !decode && kq_act(W) && step_rule(W->type, n_tok);
}

/* true when a prompt of n_tok tokens on W takes the int8 tiles */
static bool kq_prompt(const weight *W, int n_tok, bool decode)
{
    return !decode && n_tok >= 2 && kqtile_fits(W->type, W->n_in) && matmul_int8_prompt(W->type, n_tok) &&
           !kq_step_prompt(W, n_tok, decode);
}

/* at most this many tokens per pass of matmul_kq_prompt (the pointer arrays) */
#define KQ_PROMPT_MAX_TOK 512

/* A prompt on a K-quant or Q4_0 weight as int8 products (kq_prompt): the
 * tokens quantized as for one token (a share per thread), then each
 * thread unpacks a panel of 16 rows at a time (simd_kqtile.h) and
 * multiplies it with every token of the pass. Scratch: a panel per thread,
 * then as many tokens' activations as fit the rest of the prompt scratch
 * (64 n_in floats per thread, matmul_scratch_floats): about 200 tokens on
 * one thread, 400 on two. */
static void matmul_kq_prompt(float *restrict Y, const weight *W, const float *restrict X, int n_tok, float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out, nth = omp_get_max_threads(), n_pan = (n_out + KQT_ROWS - 1) / KQT_ROWS;
    const size_t pb = kqtile_panel_bytes(n_in), ab = act8_bytes(n_in);
    const size_t have = (size_t)nth * MM_TILE_ROWS * (size_t)n_in * sizeof(float) - 64;
    char *panels = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63), *acts = panels + (size_t)nth * pb;
    size_t fit = (have - (size_t)nth * pb) / ab;
    const int per = fit > KQ_PROMPT_MAX_TOK ? KQ_PROMPT_MAX_TOK : (int)fit;
    const int8_t *q[KQ_PROMPT_MAX_TOK];
    const float *d[KQ_PROMPT_MAX_TOK];
    const int16_t *bs[KQ_PROMPT_MAX_TOK];
    for (int t0 = 0; t0 < n_tok; t0 += per) {
        const int nt = n_tok - t0 < per ? n_tok - t0 : per;
        act8_pointers(acts, n_in, nt, q, d, bs);
        #pragma omp parallel
        {
            act8_quantize_share(W->type, X + (size_t)t0 * n_in, n_in, nt, acts);
            void *panel = panels + (size_t)omp_get_thread_num() * pb;
            #pragma omp for schedule(dynamic, 1)
            for (int p = 0; p < n_pan; p++) {
                const int r0 = KQT_ROWS * p, nr = n_out - r0 < KQT_ROWS ? n_out - r0 : KQT_ROWS;
                kqtile_unpack(W->type, (const char *)W->data + (size_t)r0 * W->row_bytes, W->row_bytes, nr, n_in,
                              panel);
                kqtile_mul(W->type, panel, n_in, nr, q, d, bs, nt, Y + (size_t)t0 * n_out + r0, n_out);
            }
        }
    }
}

long matmul_scratch_floats(const weight *W, int n_tok)
{
    if (W->panels)
        return panels_scratch_floats(W, n_tok);
    if (n_tok == 1)
        return W->type == GGML_Q8_0 ? W->n_in / 4 + W->n_in / 32 + 8
               : quant_int8_act(W->type) ? (long)act8_bytes(W->n_in) / 4 + 1 : 0;
    if (W->type == GGML_F32 && n_tok > f32_tile_limit())
        return 0;
    return (long)omp_get_max_threads() * MM_TILE_ROWS * W->n_in;
}

/* Y[i][t][o] = W[i][o] . X[t] for o < W[i]->n_out, i < n, t < n_tok: n
 * weights of the same type and width read by one parallel region, their
 * rows concatenated, each token's dots exactly as the one-token product
 * computes them (n_tok 1: the decode step; more: an exact step, see
 * matmul_set_exact). With AVX2 each thread takes an equal share of those
 * rows in chunks and then steals from the busiest (share.h: whole groups
 * of MV_GROUP rows of one weight), each chunk streamed as four sequential
 * streams (avx2_matvec; for several tokens avx2_matvec_tokens, two tokens
 * per load of the rows, the next pair reading the chunk from L2: a chunk
 * is SHARE_CHUNK_BYTES), so the weight is read from memory once for all
 * n_tok; a Q8_0 or K-quant X is quantized once per token for all n. At most MV_MAX_TOK tokens (the scratch: one token's
 * matmul_scratch_floats(W, 1) each). */
#define MV_MAX_TOK 64

static void matvec_tokens(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                          float *scratch)
{
    const int n_in = W[0]->n_in;
    const uint32_t t = W[0]->type;
    long bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += (long)W[i]->n_out * (long)W[i]->row_bytes;
    const bool par = bytes >= MV_PAR_BYTES;
    const bool kq = kq_act(W[0]);
    if (simd_avx2() && (t == GGML_F32 || t == GGML_F16 || t == GGML_BF16 || t == GGML_Q8_0 || kq)) {
        /* token k's int8 activations: Q8_0 xq [n_in] then xd [n_in / 32] at
         * k * q8s floats, K-quants act8_at(scratch, n_in, k) */
        const long q8s = n_in / 4 + n_in / 32 + 8;
        const float *xs[MV_MAX_TOK], *xds[MV_MAX_TOK];
        const int8_t *xqs[MV_MAX_TOK];
        for (int k = 0; k < n_tok; k++) {
            xs[k] = X + (size_t)k * n_in;
            xqs[k] = t == GGML_Q8_0 ? (const int8_t *)(scratch + k * q8s) : NULL;
            xds[k] = t == GGML_Q8_0 ? scratch + k * q8s + n_in / 4 + 4 : NULL;
            if (kq)
                act8_quantize(t, X + (size_t)k * n_in, n_in, act8_at(scratch, n_in, k));
            else if (t == GGML_Q8_0)
                quantize_act_q8(X + (size_t)k * n_in, n_in, (int8_t *)(scratch + k * q8s),
                                scratch + k * q8s + n_in / 4 + 4);
        }
        long units = 0;
        for (int i = 0; i < n; i++)
            units += (W[i]->n_out + MV_GROUP - 1) / MV_GROUP;
        share sh;
        share_init(&sh, units, share_min_units(MV_GROUP * W[0]->row_bytes), par ? omp_get_max_threads() : 1);
        #pragma omp parallel if (par)
        {
            long ca, cb;
            while (share_take(&sh, omp_get_thread_num(), &ca, &cb)) {
                long off = 0;
                for (int i = 0; i < n; i++) {       /* the parts of the chunk in each weight */
                    const long nu = (W[i]->n_out + MV_GROUP - 1) / MV_GROUP, n_out = W[i]->n_out;
                    long pa, pb;
                    if (share_part(ca, cb, off, nu, &pa, &pb)) {
                        const long a = pa * MV_GROUP, b = pb * MV_GROUP < n_out ? pb * MV_GROUP : n_out;
                        const char *rows = (const char *)W[i]->data + (size_t)a * W[i]->row_bytes;
                        if (kq)
                            for (int k = 0; k < n_tok; k++)
                                act8_rows(W[i]->type, rows, W[i]->row_bytes, (int)(b - a), act8_at(scratch, n_in, k),
                                          n_in, Y[i] + (size_t)k * n_out + a, 1);
                        else if (n_tok == 1)
                            avx2_matvec(t, rows, W[i]->row_bytes, (int)(b - a), X, xqs[0], xds[0], n_in, Y[i] + a);
                        else
                            avx2_matvec_tokens(t, rows, W[i]->row_bytes, (int)(b - a), xs, xqs, xds, n_tok, n_in,
                                               Y[i] + a, (size_t)n_out);
                    }
                    off += nu;
                }
            }
        }
        return;
    }
    for (int i = 0; i < n; i++) {
        const weight *w = W[i];
        const int n_out = w->n_out;
        #pragma omp parallel for schedule(static) if ((long)w->n_out * (long)w->row_bytes >= MV_PAR_BYTES)
        for (int o = 0; o < n_out; o++)
            for (int k = 0; k < n_tok; k++)
                Y[i][(size_t)k * n_out + o] =
                    dot_row_fast(t, (const char *)w->data + (size_t)o * w->row_bytes, X + (size_t)k * n_in, n_in);
    }
}

/* one token: the decode step's products */
static void matvec(int n, float *const *Y, const weight *const *W, const float *restrict X, float *scratch)
{
    matvec_tokens(n, Y, W, X, 1, scratch);
}

/* An exact step (matmul_set_exact): n_tok tokens in calls of at most
 * MV_MAX_TOK, each token's dots the one-token product's. */
static void matmul_q8_act(float *restrict Y, const weight *W, const float *restrict X, int n_tok, float *scratch);

static void matvec_exact(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                         float *scratch)
{
    bool fused = simd_avx2();
    for (int i = 0; i < n; i++)
        fused = fused && kq_act(W[i]);
    if (fused) {
        for (int i = 0; i < n; i++)
            matmul_q8_act(Y[i], W[i], X, n_tok, scratch);
        return;
    }
    float *Yt[MATMUL_MANY_MAX];
    for (int t0 = 0; t0 < n_tok; t0 += MV_MAX_TOK) {
        for (int i = 0; i < n; i++)
            Yt[i] = Y[i] + (size_t)t0 * W[i]->n_out;
        matvec_tokens(n, Yt, W, X + (size_t)t0 * W[0]->n_in, n_tok - t0 < MV_MAX_TOK ? n_tok - t0 : MV_MAX_TOK,
                      scratch);
    }
}

static _Thread_local bool mm_exact;

bool matmul_set_exact(bool on)
{
    const bool was = mm_exact;
    mm_exact = on;
    return was;
}

/* Rows decoded to f32 per tile on the AVX-512 small-batch path: a
 * multiple of the kernel's 6-row register tile; 48 x 3584 floats (672 KiB)
 * stays in L2 while every token passes over it. */
#define MM_SMALL_ROWS 48

/* At most this many tokens per call of matmul_small_amx: its scratch
 * (below) then fits the smallest small-batch scratch (64 n_in floats). */
#define AMX_MAX_TOK 64

/* F16 decode steps of fewer tokens take the AVX-512 typed kernel
 * (matmul_small512): AMX's f16 -> bf16 split costs the same per weight
 * whatever the token count, the typed kernel's widening (vcvtph2ps) is
 * cheap and its FMAs grow with the tokens. Measured, 2 threads, 400 MiB of
 * f16 weight, one process alternating, median time typed / AMX: n = 1024,
 * 2 tokens 0.44, 4: 0.48, 8: 0.64, 12: 0.98, 16: 1.23; n = 3584, 4: 0.64,
 * 8: 0.71, 12: 1.21. BF16 (no split) stays on AMX at every count: typed /
 * AMX was 0.90-0.95 at 2-4 tokens and 1.26-2.08 from 8. Q8_0 decode
 * steps never take the typed tile (f32 activations would make a
 * sequence's results depend on its batch): see q8_act_step. */
#define AMX_MIN_TOK_F16 12

/* Q8_0 decode steps of 2-4 tokens take the AVX512-VNNI kernel
 * (matmul_q8_act, the one-token path's int8 arithmetic per token, rows
 * far apart) even with AMX: AMX scales every block's 16 x 16 tile whatever
 * the count. Measured, 2 threads, 400 MiB of Q8_0 weight, one process
 * alternating, median time VNNI / AMX: n = 1024, 2 tokens 0.52, 3: 0.60,
 * 4: 0.62, 5: 1.00, 6: 1.08, 8: 1.26; n = 3584, 2: 0.56, 4: 0.79, 6: 1.29.
 * Without AMX every Q8_0 decode step takes it (see q8_act_step). */
#define AMX_MIN_TOK_Q8 5

/* Q8_0 decode steps off AMX, wherever the one-token product runs on int8
 * activations (simd_avx2, matvec): the same arithmetic per token, so a
 * sequence's results do not depend on the batch it decodes in. With AMX
 * only steps of fewer than AMX_MIN_TOK_Q8 tokens (with AVX512-VNNI); AMX
 * takes the rest, on the same int8 activations. */
static bool q8_act_step(const weight *W, int n_tok, bool decode)
{
    if (!(decode && W->type == GGML_Q8_0 && n_tok > 1 && W->n_in % 32 == 0 && simd_avx2()))
        return false;
    return !simd_amx() || (n_tok < AMX_MIN_TOK_Q8 && simd_avx512_vnni());
}

/* true when a decode step of n_tok tokens on W takes the AMX tiles */
static bool amx_step(const weight *W, int n_tok, bool decode)
{
    if ((W->type == GGML_F16 && n_tok < AMX_MIN_TOK_F16 && simd_avx512()) || q8_act_step(W, n_tok, decode))
        return false;
    return decode && n_tok > 1 &&
           ((W->type == GGML_Q8_0 && simd_amx()) || (W->type == GGML_BF16 && W->n_in % 32 == 0 && simd_amx_bf16()) ||
            (W->type == GGML_F16 && W->n_in % 32 == 0 && simd_amx_f16()));
}

/* A Q8_0 prompt of n_tok tokens on int8 activations (matmul_int8_prompt):
 * it takes the kernel a decode step of as many tokens takes (amx_step's
 * choice, else matmul_q8_act), so a prompt token gets a decode step's
 * bits. Prompts used to stay on matmul_q8_act while AMX took steps from
 * AMX_MIN_TOK_Q8 tokens: the tile sums a block in one int32 and scales it
 * once, the VNNI kernel in lanes of 4, so the bits differed on AMX
 * machines (test_kqtile_matmul_prompts_on_int8_give_the_int8_products_at_every_level). */
static bool q8_int8_prompt(const weight *W, int n_tok, bool decode)
{
    return !decode && W->type == GGML_Q8_0 && W->n_in % 32 == 0 && matmul_int8_prompt(GGML_Q8_0, n_tok);
}

/* true when n_tok tokens on W (a decode step, or a Q8_0 int8 prompt)
 * take the AMX tiles */
static bool amx_takes(const weight *W, int n_tok, bool decode)
{
    return amx_step(W, n_tok, decode || q8_int8_prompt(W, n_tok, decode));
}

/* tokens per call of matmul_small_amx: F16 lays out two copies of the
 * activations (x and its residual), so it takes half as many */
static int amx_max_tok(const weight *W)
{
    return W->type == GGML_F16 ? AMX_MAX_TOK / 2 : AMX_MAX_TOK;
}

/* Decode steps of 2..AMX_MAX_TOK tokens on AMX (matmul's decode; Q8_0
 * int8 prompts too, in calls of as many, see q8_int8_prompt), for n weights of the same type and width: the activations are prepared
 * once as tiles - Q8_0: quantized to int8 per token as for one token
 * (quantize_act_q8); BF16: rounded to bf16; F16: rounded to bf16 and the
 * residual too - then the tiles of 16 rows of all n weights, concatenated,
 * are split between the threads. Rows past a weight's last multiple of 16
 * dot the same prepared activations (F16: x itself).
 * Scratch, at most 144 n_in + 64 bytes for 64 tokens: Q8_0 scales, int8
 * activations, tiles; BF16 tiles, then one token's rounded activations as
 * floats; F16 (at most 32 tokens) two sets of tiles, 128 n_in + 256 bytes. */
static void matmul_small_amx(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                             float *scratch)
{
    const int n_in = W[0]->n_in, nb = n_in / 32;
    const bool q8 = W[0]->type == GGML_Q8_0, f16 = W[0]->type == GGML_F16;
    float *xd = scratch;                                    /* Q8_0: [n_tok][nb] */
    int8_t *xq = (int8_t *)(xd + (size_t)n_tok * nb);       /* Q8_0: [n_tok][n_in] */
    void *prep = q8 ? (void *)(xq + (size_t)n_tok * n_in) : (void *)scratch;
    float *xr = scratch + amx_bf16_prep_bytes(n_in, n_tok) / sizeof(float) + 1;   /* BF16: [n_in] */
    void (*tiles)(const void *, size_t, int, int, const void *, int, float *, int) = amx_bf16_rows_x_tokens;
    if (q8) {
        for (int t = 0; t < n_tok; t++)
            quantize_act_q8(X + (size_t)t * n_in, n_in, xq + (size_t)t * n_in, xd + (size_t)t * nb);
        amx_q8_0_prepare(xq, xd, n_in, n_tok, prep);
        tiles = amx_q8_0_rows_x_tokens;
    } else if (f16) {
        amx_f16_prepare(X, n_in, n_tok, prep);
        tiles = amx_f16_rows_x_tokens;
    } else {
        amx_bf16_prepare(X, n_in, n_tok, prep, NULL);
    }
    long total16 = 0;
    for (int i = 0; i < n; i++)
        total16 += W[i]->n_out / 16;
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), it = omp_get_thread_num();
        const long g0 = total16 * it / nt, g1 = total16 * (it + 1) / nt;
        long off = 0;
        for (int i = 0; i < n; i++) {               /* the parts of [g0, g1) in each weight */
            const long n16 = W[i]->n_out / 16;
            const long a = g0 > off ? g0 : off, b = g1 < off + n16 ? g1 : off + n16;
            const size_t rb = W[i]->row_bytes;
            if (b > a)
                tiles((const char *)W[i]->data + (size_t)(a - off) * 16 * rb, rb, (int)(16 * (b - a)), n_in, prep,
                      n_tok, Y[i] + (size_t)(a - off) * 16, W[i]->n_out);
            off += n16;
        }
    }
    for (int t = 0; t < n_tok; t++) {
        bool rounded = false;
        for (int i = 0; i < n; i++) {
            const int n_out = W[i]->n_out;
            const size_t rb = W[i]->row_bytes;
            for (int o = n_out / 16 * 16; o < n_out; o++) {
                if (!q8 && !f16 && !rounded) {
                    for (int k = 0; k < n_in; k++)
                        xr[k] = bf16_to_f32(f32_to_bf16(X[(size_t)t * n_in + k]));
                    rounded = true;
                }
                const char *row = (const char *)W[i]->data + (size_t)o * rb;
                Y[i][(size_t)t * n_out + o] = q8    ? dot_q8_0_act(row, xq + (size_t)t * n_in, xd + (size_t)t * nb, n_in)
                                              : f16 ? dot_row_fast(GGML_F16, row, X + (size_t)t * n_in, n_in)
                                                    : dot_row_fast(GGML_BF16, row, xr, n_in);
            }
        }
    }
}

/* 2 <= n_tok <= mm_small_max with AVX-512: F32, F16, BF16 and Q8_0 (whole
 * blocks) go to the kernel in chunks of rows (share.h; its prefetch runs
 * ahead within a call), with X packed once into the scratch; other types
 * are decoded to f32 a tile at a time. */
static void matmul_small512(float *restrict Y, const weight *W, const float *restrict X, int n_tok,
                            float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out;
    const char *base = W->data;
    const size_t rb = W->row_bytes;
    const bool f32 = W->type == GGML_F32;
    if (f32 || avx512_rows_x_tokens_typed_ok(W->type, n_in)) {
        /* X packed once into the scratch, read by every thread */
        float *Xp = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
        const bool packed = scratch && (long)avx512_packed_tokens_floats(n_tok, n_in) + 16 <=
                                           matmul_scratch_floats(W, n_tok);
        if (packed)
            avx512_pack_tokens(X, n_in, n_tok, n_in, Xp);
        share sh;
        share_init(&sh, n_out, share_min_units(rb), omp_get_max_threads());
        #pragma omp parallel
        {
            long r0, r1;
            while (share_take(&sh, omp_get_thread_num(), &r0, &r1)) {
                const char *Wr = base + (size_t)r0 * rb;
                const int nr = (int)(r1 - r0);
                if (!f32)
                    avx512_rows_x_tokens_typed(W->type, Wr, rb, nr, packed ? Xp : X, n_in, packed, n_tok, n_in,
                                               Y + r0, n_out);
                else if (packed)
                    avx512_rows_x_tokens_packed((const float *)Wr, n_in, nr, Xp, n_tok, n_in, Y + r0, n_out);
                else
                    avx512_rows_x_tokens((const float *)Wr, n_in, nr, X, n_in, n_tok, n_in, Y + r0, n_out);
            }
        }
        return;
    }
    const int n_blk = (n_out + MM_SMALL_ROWS - 1) / MM_SMALL_ROWS;
    #pragma omp parallel
    {
        float *buf = scratch + (long)omp_get_thread_num() * MM_TILE_ROWS * n_in;
        #pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < n_blk; b++) {
            const int r0 = b * MM_SMALL_ROWS, nr = n_out - r0 < MM_SMALL_ROWS ? n_out - r0 : MM_SMALL_ROWS;
            for (int r = 0; r < nr; r++)
                dequant_row_fast(W->type, base + (size_t)(r0 + r) * rb, buf + (size_t)r * n_in, n_in);
            avx512_rows_x_tokens(buf, n_in, nr, X, n_in, n_tok, n_in, Y + r0, n_out);
        }
    }
}

/* At most this many tokens per call of matmul_q8_act_chunk: its scratch,
 * about 3.2 n_tok n_in bytes, then fits the smallest small-batch scratch
 * (64 n_in floats, one thread). */
#define Q8_ACT_MAX_TOK 64

/* Q8_0 decode steps on int8 activations (q8_act_step): the activations
 * quantized per token as for one token, the rows split as share.h does.
 * AVX512-VNNI: the activations prepared once for the tile kernel.
 * AVX2: each row dotted with every token's activations while it is in L1.
 * The threads quantize and prepare a share of the tokens each, then meet
 * at a barrier, rather than one doing it while the others wait
 * (docs/performance.md section 12).
 * Scratch: xq, xd, then the 64-byte aligned prep. */
static void matmul_q8_act_chunk(float *restrict Y, const weight *W, const float *restrict X, int n_tok,
                                float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out, nb = n_in / 32;
    const bool vnni = simd_avx512_vnni();
    int8_t *xq = (int8_t *)scratch;
    float *xd = (float *)(((uintptr_t)(xq + (size_t)n_tok * n_in) + 3) & ~(uintptr_t)3);
    void *prep = (void *)(((uintptr_t)(xd + (size_t)n_tok * nb) + 63) & ~(uintptr_t)63);
    share sh;
    share_init(&sh, n_out, share_min_units(W->row_bytes), omp_get_max_threads());
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), it = omp_get_thread_num();
        const int t0 = n_tok * it / nt, t1 = n_tok * (it + 1) / nt;
        for (int t = t0; t < t1; t++)
            quantize_act_q8(X + (size_t)t * n_in, n_in, xq + (size_t)t * n_in, xd + (size_t)t * nb);
        if (vnni)
            avx512_q8_prepare(xq, xd, n_in, n_tok, t0, t1, prep);
        #pragma omp barrier
        const char *base = (const char *)W->data;
        long r0, r1;
        while (share_take(&sh, it, &r0, &r1))
            if (vnni)
                avx512_q8_0_rows_x_tokens(base + (size_t)r0 * W->row_bytes, W->row_bytes, (int)(r1 - r0), n_in, prep,
                                          n_tok, Y + r0, n_out);
            else
                for (long o = r0; o < r1; o++)
                    for (int t = 0; t < n_tok; t++)
                        Y[(size_t)t * n_out + o] = dot_q8_0_act(base + (size_t)o * W->row_bytes,
                                                              xq + (size_t)t * n_in, xd + (size_t)t * nb, n_in);
    }
}

/* K-quant and Q4_0 decode steps on int8 activations (kq_act): each
 * thread quantizes a share of the tokens, then takes its share of the
 * rows and steals from the busiest (share.h). With AVX-512 each K-quant
 * row's super-blocks are unpacked once per 8 tokens
 * (cpu_kern.dot_kq_act_tokens); with AVX2 a group of rows filling
 * KQ_STEP_L1_BYTES (half a 32 KiB L1d) meets every token in turn through
 * the one-token rows kernel (cpu_kern.dot_kq_act_rows: no call per row),
 * read from memory once; otherwise each row is dotted with every token
 * while it is in L1 by the one-token kernel. Either way a
 * token gets the one-token product's bits. At most Q8_ACT_MAX_TOK tokens
 * per call (act8_bytes each, about 1.2 n_in: within the small-batch
 * scratch). Measured (one thread, CPU time, 14336 x 1024 Q4_K, medians of
 * 9) per-token dots against the f32 tile on rows decoded on AVX2: 2
 * tokens 1.22 / 2.45 ms, 4: 2.47 / 2.87, 16: 9.89 / 5.66; with the
 * weights unpacked once per 4 tokens (AVX-512, before the groups of 8 of
 * simd_kquant.c) 2: 1.41, 4: 1.90, 16: 7.69
 * (Q6_K 1.22 / 3.38, 1.80 / 3.76, 7.49 / 6.66). Past ~8 tokens the f32
 * tile would be faster, but a sequence's bits would then depend on its
 * batch (docs/performance.md section 2). */
#define KQ_STEP_L1_BYTES 16384

static void matmul_kq_act_chunk(float *restrict Y, const weight *W, const float *restrict X, int n_tok,
                                float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out;
    const bool tokens = W->type != GGML_Q4_0 && cpu_kern.dot_kq_act_tokens;
    const bool rows = !tokens && W->type != GGML_Q4_0 && cpu_kern.dot_kq_act_rows;
    /* rows of a group, with rows: KQ_STEP_L1_BYTES of them (half of a 32 KiB L1d) */
    const long rows_l1 = rows ? (KQ_STEP_L1_BYTES / (long)W->row_bytes > 1 ? KQ_STEP_L1_BYTES / (long)W->row_bytes : 1)
                              : 1;
    const int8_t *q[Q8_ACT_MAX_TOK];
    const float *d[Q8_ACT_MAX_TOK];
    const int16_t *bs[Q8_ACT_MAX_TOK];
    act8_pointers(scratch, n_in, n_tok, q, d, bs);
    share sh;
    share_init(&sh, n_out, share_min_units(W->row_bytes), omp_get_max_threads());
    #pragma omp parallel
    {
        act8_quantize_share(W->type, X, n_in, n_tok, scratch);
        long r0, r1;
        while (share_take(&sh, omp_get_thread_num(), &r0, &r1))
            for (long o = r0; o < r1; o += rows_l1) {
                const char *row = (const char *)W->data + (size_t)o * W->row_bytes;
                if (rows) {         /* a group of rows in L1, every token's one-token products over it */
                    const int nr = (int)(r1 - o < rows_l1 ? r1 - o : rows_l1);
                    for (int t = 0; t < n_tok; t++)
                        cpu_kern.dot_kq_act_rows(W->type, row, W->row_bytes, nr, q[t], d[t], bs[t], n_in,
                                                 Y + (size_t)t * n_out + o, 1);
                } else if (tokens)
                    cpu_kern.dot_kq_act_tokens(W->type, row, n_in, q, d, bs, n_tok, Y + o, n_out);
                else
                    for (int t = 0; t < n_tok; t++)
                        act8_rows(W->type, row, W->row_bytes, 1, act8_at(scratch, n_in, t), n_in,
                                  Y + (size_t)t * n_out + o, 0);
            }
    }
}

static void matmul_q8_act(float *restrict Y, const weight *W, const float *restrict X, int n_tok, float *scratch)
{
    const bool kq = W->type != GGML_Q8_0;
    for (int t0 = 0; t0 < n_tok; t0 += Q8_ACT_MAX_TOK)
        (kq ? matmul_kq_act_chunk : matmul_q8_act_chunk)(Y + (size_t)t0 * W->n_out, W, X + (size_t)t0 * W->n_in,
                                                         n_tok - t0 < Q8_ACT_MAX_TOK ? n_tok - t0 : Q8_ACT_MAX_TOK,
                                                         scratch);
}

/* 2 <= n_tok <= mm_small_max, AVX2 only */
static void matmul_small(float *restrict Y, const weight *W, const float *restrict X, int n_tok,
                         float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out, n_grp = (n_out + 3) / 4;
    const char *base = W->data;
    const size_t rb = W->row_bytes;
    const bool f32 = W->type == GGML_F32;
    #pragma omp parallel
    {
        float *buf = scratch + (long)omp_get_thread_num() * MM_TILE_ROWS * n_in;   /* [4][n_in] */
        #pragma omp for schedule(static)
        for (int g = 0; g < n_grp; g++) {
            const int r0 = 4 * g, nr = n_out - r0 < 4 ? n_out - r0 : 4;
            const float *rows = buf;
            if (f32) {
                rows = (const float *)(base + (size_t)r0 * rb);
            } else {
                for (int r = 0; r < nr; r++)
                    dequant_row_fast(W->type, base + (size_t)(r0 + r) * rb, buf + (size_t)r * n_in, n_in);
            }
            avx2_rows_x_tokens(rows, n_in, nr, X, n_in, n_tok, n_in, Y + r0, n_out);
        }
    }
}

/* Several products of one X on the shared kernels: one token (matvec) or
 * a decode step on AMX, in calls of at most AMX_MAX_TOK tokens. */
static void matmul_shared(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                          float *scratch)
{
    if (n_tok == 1) {
        matvec(n, Y, W, X, scratch);
        return;
    }
    float *Yt[MATMUL_MANY_MAX];
    const int per = amx_max_tok(W[0]);
    for (int t0 = 0; t0 < n_tok; t0 += per) {
        for (int i = 0; i < n; i++)
            Yt[i] = Y[i] + (size_t)t0 * W[i]->n_out;
        matmul_small_amx(n, Yt, W, X + (size_t)t0 * W[0]->n_in, n_tok - t0 < per ? n_tok - t0 : per, scratch);
    }
}

/* ---- BF16 and F16 prompts on packed weights ----
 * BF16: see matmul_set_bf16_prompt (matmul.h). F16: the outer-product
 * kernel up to mm_f16_outer_max tokens. */
static int mm_bf16_prompt = -1;         /* MATMUL_BF16_*, -1 before the environment is read */

void matmul_set_bf16_prompt(int mode)
{
    mm_bf16_prompt = mode;
}

static int bf16_prompt_mode(void)
{
    if (mm_bf16_prompt < 0) {
        const char *e = getenv("HYSERVE_BF16_PROMPT");
        mm_bf16_prompt = e && !strcmp(e, "0") ? MATMUL_BF16_EXACT : e && !strcmp(e, "1") ? MATMUL_BF16_ROUNDED
                                                                                        : MATMUL_BF16_AUTO;
    }
    return mm_bf16_prompt;
}

bool matmul_bf16_prompt(void)
{
    const int m = bf16_prompt_mode();
    return m == MATMUL_BF16_ROUNDED || (m == MATMUL_BF16_AUTO && simd_bf16_dot());
}

/* the BF16 prompt path and why */
static const char *bf16_prompt_name(void)
{
    const int m = bf16_prompt_mode();
    if (!matmul_bf16_prompt())
        return m == MATMUL_BF16_EXACT ? "exact (HYSERVE_BF16_PROMPT=0)" : "exact (as bf16 decode)";
    if (!simd_bf16_dot())
        return "bf16-rounded activations on the FMA kernel (HYSERVE_BF16_PROMPT=1; vdpbf16ps not in use)";
    return m == MATMUL_BF16_ROUNDED ? "vdpbf16ps (HYSERVE_BF16_PROMPT=1)" : "vdpbf16ps (as bf16 decode)";
}

static int mm_f16_outer_max = -1;       /* tokens; -1 before the environment is read */

void matmul_set_f16_outer_max(int n_tok)
{
    mm_f16_outer_max = n_tok;
}

int matmul_f16_outer_max(void)
{
    return tile_limit(&mm_f16_outer_max, "HYSERVE_F16_PROMPT", MATMUL_F16_OUTER_MAX);
}

/* Written into the caller's buffer: the ready line and concurrent /info
 * requests call this from different threads (a shared static buffer here
 * was a data race). */
void matmul_prompt_describe(uint32_t type, char *buf, size_t len)
{
    if (!len)
        return;
    const char *tile = "rows x tokens tile";        /* F32 with AVX-512 */
    int lim = matmul_f32_tile_max();
    switch (type) {
    case GGML_BF16:
        snprintf(buf, len, "%s", bf16_prompt_name());
        return;
    case GGML_F16:
        tile = "outer-product tile";
        lim = matmul_f16_outer_max();
        break;
    case GGML_F32:
        if (!simd_avx512()) {
            tile = "tile";
            lim = mm_small_max;
        }
        break;
    default:
        matmul_int8_prompt_describe(buf, len);
        return;
    }
    if (lim == INT_MAX)
        snprintf(buf, len, "%s", tile);
    else
        snprintf(buf, len, "%s to %d tokens, sgemm past it", tile, lim);
}

/* packed weights (panels.h): the outer-product kernel for one token and
 * decode steps (Q8_0 on int8 activations, as the rows'), and on f32
 * activations for short prompts (as the rows' tile; F16 up to
 * matmul_f16_outer_max); sgemm on decoded panels for longer prompts; BF16
 * prompts on bf16-rounded activations where matmul_bf16_prompt() */
static int panels_path(const weight *W, int n_tok, bool decode)
{
    if (!decode && W->type == GGML_BF16 && matmul_bf16_prompt())
        return PANELS_BF16ACT;  /* a prompt of one token too: every prompt product rounds */
    if (n_tok == 1 || decode || (W->type == GGML_Q8_0 && matmul_int8_prompt(GGML_Q8_0, n_tok)))
        return PANELS_DECODE;
    return n_tok <= (W->type == GGML_F16 ? matmul_f16_outer_max() : mm_small_max) ? PANELS_OUTER : PANELS_SGEMM;
}

#ifdef HYSERVE_MMPROF
/* ---- HYSERVE_MMPROF (make MMPROF=1): each outermost product on the
 * engine's thread timed, by shape (type, width, rows of all its weights,
 * one token or more), printed at exit to stderr with its GB/s of weights.
 * For the decode profile (docs/performance.md section 13); off in every
 * other build. Products from several engine threads at once (a server)
 * would race on the table: meant for `hyserve generate`. ---- */
#define MMPROF_KEYS 64
typedef struct mmprof_key {
    uint32_t type;
    int n_in, n_w;
    long n_out, bytes;
    bool one;
    long calls;
    double s;
} mmprof_key;
static mmprof_key mmprof_tab[MMPROF_KEYS];
static int mmprof_n, mmprof_depth;

static void mmprof_report(void)
{
    double tot = 0;
    for (int i = 0; i < mmprof_n; i++)
        tot += mmprof_tab[i].s;
    fprintf(stderr, "mmprof: %.3f s in products\n", tot);
    for (int i = 0; i < mmprof_n; i++) {
        const mmprof_key *k = &mmprof_tab[i];
        fprintf(stderr, "mmprof: %-5s x%d n_in %5d n_out %6ld %s calls %6ld  %8.3f s  %5.1f%%  %6.2f MB  %6.2f GB/s\n",
                ggml_type_name(k->type), k->n_w, k->n_in, k->n_out, k->one ? "1 tok " : "n tok ", k->calls, k->s,
                tot > 0 ? 100.0 * k->s / tot : 0.0, (double)k->bytes * 1e-6,
                k->s > 0 ? (double)k->bytes * (double)k->calls / k->s * 1e-9 : 0.0);
    }
}

static double mmprof_now(void)
{
    return omp_get_wtime();
}

static void mmprof_add(int n, const weight *const *W, int n_tok, double s)
{
    long n_out = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        n_out += W[i]->n_out;
        bytes += (long)W[i]->n_out * (long)W[i]->row_bytes;
    }
    int k = 0;
    while (k < mmprof_n && !(mmprof_tab[k].type == W[0]->type && mmprof_tab[k].n_in == W[0]->n_in &&
                             mmprof_tab[k].n_out == n_out && mmprof_tab[k].n_w == n && mmprof_tab[k].one == (n_tok == 1)))
        k++;
    if (k == MMPROF_KEYS)
        return;
    if (k == mmprof_n) {
        if (!mmprof_n)
            atexit(mmprof_report);
        mmprof_tab[mmprof_n++] = (mmprof_key){ .type = W[0]->type, .n_in = W[0]->n_in, .n_w = n, .n_out = n_out,
                                               .bytes = bytes, .one = n_tok == 1 };
    }
    mmprof_tab[k].calls++;
    mmprof_tab[k].s += s;
}

static void matmul_many_body(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok,
                             bool decode, float *scratch);
static void matmul_body(float *restrict Y, const weight *W, const float *restrict X, int n_tok, bool decode,
                        float *scratch);

void matmul_many(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok, bool decode,
                 float *scratch)
{
    const double t0 = mmprof_depth++ ? 0 : mmprof_now();
    matmul_many_body(n, Y, W, X, n_tok, decode, scratch);
    if (--mmprof_depth == 0)
        mmprof_add(n, W, n_tok, mmprof_now() - t0);
}

void matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, bool decode, float *scratch)
{
    const double t0 = mmprof_depth++ ? 0 : mmprof_now();
    matmul_body(Y, W, X, n_tok, decode, scratch);
    if (--mmprof_depth == 0)
        mmprof_add(1, &W, n_tok, mmprof_now() - t0);
}
#define matmul_many matmul_many_body
#define matmul matmul_body
#endif

void matmul_many(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok, bool decode,
                 float *scratch)
{
    /* an exact step: the one-token choices below, every token through them */
    const bool exact = mm_exact && n_tok > 1;
    decode = decode || exact;
    /* packed weights of one type and width on the outer-product kernel
     * share one parallel region (their panels split between the threads);
     * the rest go on one by one (one region per weight measured a little
     * slower: docs/performance.md section 11). */
    int f = 0;                  /* the first packed weight: the group's type and width */
    while (f < n && !W[f]->panels)
        f++;
    const int path = f < n ? panels_path(W[f], n_tok, decode) : PANELS_SGEMM;
    if (n >= 2 && n <= MATMUL_MANY_MAX && f < n && panels_kernel(W[f]) && path != PANELS_SGEMM) {
        const weight *P[MATMUL_MANY_MAX];
        float *YP[MATMUL_MANY_MAX];
        bool in[MATMUL_MANY_MAX];
        int np = 0;
        for (int i = 0; i < n; i++) {
            in[i] = W[i]->panels && W[i]->type == W[f]->type && W[i]->n_in == W[f]->n_in;
            if (in[i]) {
                P[np] = W[i];
                YP[np++] = Y[i];
            }
        }
        if (np >= 2) {
            panels_matmul_many(np, YP, P, X, n_tok, path, scratch);
            for (int i = 0; i < n; i++)
                if (!in[i])
                    matmul(Y[i], W[i], X, n_tok, decode, scratch);
            return;
        }
    }
    bool shared = n >= 1 && n <= MATMUL_MANY_MAX && (n_tok == 1 || exact || amx_takes(W[0], n_tok, decode));
    for (int i = 0; i < n && shared && n_tok > 1 && !exact; i++)
        shared = W[i]->type == W[0]->type && W[i]->n_in == W[0]->n_in && !W[i]->panels;
    if (shared && ((n_tok > 1 && !exact) || matvec_shares(n, W))) {
        if (exact)
            matvec_exact(n, Y, W, X, n_tok, scratch);
        else
            matmul_shared(n, Y, W, X, n_tok, scratch);
        return;
    }
    for (int i = 0; i < n; i++)
        matmul(Y[i], W[i], X, n_tok, decode, scratch);
}

#ifdef HYSERVE_MMPROF
static
#endif
void matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, bool decode, float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out;
    const bool exact = mm_exact && n_tok > 1;
    if (W->panels) {        /* BF16/F16/Q8_0 in panels: the outer-product kernel, sgemm for prompts */
        /* (an exact step: the decode path, whose tokens get one token's bits, panels.h) */
        panels_matmul(Y, W, X, n_tok, panels_path(W, n_tok, decode || exact), scratch);
        return;
    }
    if (exact) {
        float *y = Y;
        matvec_exact(1, &y, &W, X, n_tok, scratch);
        return;
    }
    if (n_tok == 1 || amx_takes(W, n_tok, decode)) {
        float *y = Y;
        matmul_shared(1, &y, &W, X, n_tok, scratch);
        return;
    }
    if (q8_act_step(W, n_tok, decode) || (decode && kq_act(W)) || kq_step_prompt(W, n_tok, decode) ||
        q8_int8_prompt(W, n_tok, decode)) {
        matmul_q8_act(Y, W, X, n_tok, scratch);
        return;
    }
    if (kq_prompt(W, n_tok, decode)) {
        matmul_kq_prompt(Y, W, X, n_tok, scratch);
        return;
    }
    /* decode steps of any size but F32's stay on the tile (F16 and BF16
     * off AMX widened in registers, other types decoded 48 rows at a
     * time; Q8_0's took matmul_q8_act above), faster than decoding tiles
     * for sgemm (docs/performance.md section 12). F32 needs no decoding:
     * its prompts and steps take the tile to matmul_f32_tile_max() tokens,
     * sgemm past it. */
    if ((n_tok <= mm_small_max || (decode && W->type != GGML_F32) ||
         (W->type == GGML_F32 && n_tok <= matmul_f32_tile_max())) && simd_avx512()) {
        matmul_small512(Y, W, X, n_tok, scratch);
        return;
    }
    if (n_tok <= mm_small_max && simd_avx2()) {
        matmul_small(Y, W, X, n_tok, scratch);
        return;
    }
    if (W->type == GGML_F32) {
        /* Y = X W^T */
        gemm(false, true, n_tok, n_out, n_in, 1.0f, X, n_in, W->data, n_in, 0.0f, Y, n_out);
        return;
    }
    /* multi-token, non-f32: dequantize tiles of rows, sgemm each tile */
    const int n_tiles = (n_out + MM_TILE_ROWS - 1) / MM_TILE_ROWS;
    #pragma omp parallel
    {
        float *tile = scratch + (long)omp_get_thread_num() * MM_TILE_ROWS * n_in;
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_tiles; it++) {
            int r0 = it * MM_TILE_ROWS;
            int nr = n_out - r0 < MM_TILE_ROWS ? n_out - r0 : MM_TILE_ROWS;
            for (int r = 0; r < nr; r++)
                dequant_row_fast(W->type, (const char *)W->data + (size_t)(r0 + r) * W->row_bytes,
                                 tile + (long)r * n_in, n_in);
            gemm(false, true, n_tok, nr, n_in, 1.0f, X, n_in, tile, n_in, 0.0f, Y + r0, n_out);
        }
    }
}

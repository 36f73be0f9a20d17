/* test_panels.c - BF16/F16 weights in panels of 16 rows (engine/kernels/panels.h).
 *
 * Evidence: the layout as panels.h describes it, recomputed here; and
 * every product (one token, decode steps of any size on the outer-product
 * kernel, prompts on sgemm over decoded panels, the portable loop without
 * AVX-512) against dot products of the rows as stored, summed in double.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels/blas.h"
#include "kernels/cpu.h"
#include "kernels/panels.h"
#include "kernels/quant.h"
#include "kernels/simd512.h"
#include "matmul.h"
#include "test.h"

static uint32_t rng_state;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / (float)(1u << 23) - 1.0f;
}

static uint16_t to16(uint32_t type, float f)
{
    return type == GGML_BF16 ? f32_to_bf16(f) : f32_to_fp16(f);
}

static float from16(uint32_t type, uint16_t h)
{
    return type == GGML_BF16 ? bf16_to_f32(h) : fp16_to_f32(h);
}

/* where panels.h says element (r, k) lives, in 16-bit units */
static size_t doc_index(uint32_t type, int n_in, int r, int k)
{
    size_t base = (size_t)(r / 16) * 16 * (size_t)n_in + (size_t)(k / 2) * 32;
    if (type == GGML_BF16)
        return base + (size_t)(2 * (r % 16) + k % 2);
    return base + (size_t)(16 * (k % 2) + r % 16);
}

TEST(test_panels_layout_puts_each_element_where_the_header_says)
{
    static const uint32_t types[] = { GGML_BF16, GGML_F16 };
    static const int outs[] = { 16, 48 }, ins[] = { 2, 34, 64 };
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 3; c++) {
                const uint32_t type = types[a];
                const int n_out = outs[b], n_in = ins[c];
                const size_t n = (size_t)n_out * n_in;
                uint16_t *rows = malloc(2 * n), *packed = malloc(2 * n);
                if (!rows || !packed) {
                    free(rows);
                    free(packed);
                    CHECK_MSG(0, "out of memory");
                    return;
                }
                for (size_t i = 0; i < n; i++)      /* distinct values: the index, rounded */
                    rows[i] = to16(type, (float)i * (i % 2 ? -1.0f : 1.0f));
                weight w = { .data = packed, .type = type, .n_in = n_in, .n_out = n_out,
                             .row_bytes = 2 * (size_t)n_in, .panels = true };
                CHECK(panels_fit(&w));
                panels_pack(rows, type, n_in, n_out, packed);
                int bad = 0;
                for (int r = 0; r < n_out && !bad; r++)
                    for (int k = 0; k < n_in && !bad; k++) {
                        const uint16_t want = rows[(size_t)r * n_in + k];
                        if (packed[doc_index(type, n_in, r, k)] != want ||
                            panels_get(&w, r, k) != from16(type, want)) {
                            CHECK_MSG(0, "type %u %d x %d: element (%d, %d) misplaced", type, n_out, n_in, r, k);
                            bad = 1;
                        }
                    }
                free(rows);
                free(packed);
                if (bad)
                    return;
            }
    weight odd = { .type = GGML_BF16, .n_in = 33, .n_out = 16 }, few = { .type = GGML_F16, .n_in = 32, .n_out = 24 },
           q8 = { .type = GGML_Q8_0, .n_in = 32, .n_out = 16 }, q8few = { .type = GGML_Q8_0, .n_in = 64, .n_out = 40 },
           q4 = { .type = GGML_Q4_0, .n_in = 32, .n_out = 16 };
    CHECK(!panels_fit(&odd) && !panels_fit(&few) && !panels_fit(&q8few) && !panels_fit(&q4));
    CHECK(panels_fit(&q8) == simd_avx512_vnni());
}

static uint8_t *q8_rows(int n_out, int n_in);

/* Q8_0: where panels.h says row r's quant k and its block's scale live */
TEST(test_panels_q8_0_layout_puts_each_quant_and_scale_where_the_header_says)
{
    static const int outs[] = { 16, 48 }, ins[] = { 32, 96 };
    rng_state = 5;
    for (size_t a = 0; a < 2; a++)
        for (size_t c = 0; c < 2; c++) {
            const int n_out = outs[a], n_in = ins[c], nb = n_in / 32;
            const size_t rb = (size_t)nb * 34;
            uint8_t *rows = q8_rows(n_out, n_in), *packed = malloc((size_t)n_out * rb);
            CHECK(rows && packed);
            weight w = { .data = packed, .type = GGML_Q8_0, .n_in = n_in, .n_out = n_out, .row_bytes = rb,
                         .panels = true };
            panels_pack(rows, GGML_Q8_0, n_in, n_out, packed);
            int bad = 0;
            for (int r = 0; r < n_out && !bad; r++)
                for (int k = 0; k < n_in && !bad; k++) {
                    const uint8_t *blk = rows + (size_t)r * rb + (size_t)(k / 32) * 34, *P = packed + (size_t)(r / 16) * 16 * rb;
                    const int i = r % 16, b = k / 32, g = k % 32 / 4, m = k % 4;
                    uint16_t d;
                    memcpy(&d, blk, 2);
                    const bool quant_ok = P[b * 512 + g * 64 + 4 * i + m] == (uint8_t)(blk[2 + k % 32] ^ 0x80);
                    const bool scale_ok = !memcmp(P + nb * 512 + b * 32 + 2 * i, blk, 2);
                    if (!quant_ok || !scale_ok || panels_get(&w, r, k) != fp16_to_f32(d) * (float)(int8_t)blk[2 + k % 32]) {
                        CHECK_MSG(0, "q8_0 %d x %d: element (%d, %d) misplaced", n_out, n_in, r, k);
                        bad = 1;
                    }
                }
            free(rows);
            free(packed);
            if (bad)
                return;
        }
}

/* mode 0: matmul as a prompt; 1: matmul as a decode step; 2, 3, 4:
 * panels_matmul on PANELS_DECODE, PANELS_OUTER, PANELS_SGEMM */
enum { N_MODES = 5 };
static void run_mode(float *Y, const weight *w, const float *X, int n_tok, int mode, float *scratch)
{
    if (mode == 0) {
        matmul(Y, w, X, n_tok, false, scratch);
    } else if (mode == 1) {
        matmul(Y, w, X, n_tok, true, scratch);
    } else {
        panels_matmul(Y, w, X, n_tok, mode == 2 ? PANELS_DECODE : mode == 3 ? PANELS_OUTER : PANELS_SGEMM, scratch);
    }
}

/* |got - want| <= tol (and not NaN), else a failure naming the case */
static bool near(double got, double want, double tol, uint32_t type, int n_out, int n_in, int n_tok, int mode, int t,
                 int r)
{
    if (fabs(got - want) <= tol + 1e-30)
        return true;
    test_fail(__FILE__, __LINE__, "type %u %d x %d, %d tokens, mode %d: Y[%d][%d] = %.9g, want %.9g", type, n_out,
              n_in, n_tok, mode, t, r, got, want);
    return false;
}

/* One shape: Y from matmul on the packed weight (routing as the engine's)
 * or panels_matmul directly (outer or sgemm), against double dots of the
 * stored rows. Bound: float sums of n terms, n 2^-23 sum |w x|. A spare
 * token row of Y must keep its sentinels. */
static int check_products(uint32_t type, int n_out, int n_in, int n_tok, int mode)
{
    const size_t nw = (size_t)n_out * n_in;
    uint16_t *rows = malloc(2 * nw), *packed = aligned_alloc(64, (2 * nw + 63) / 64 * 64);
    float *X = malloc(sizeof(float) * (size_t)n_tok * n_in), *Y = malloc(sizeof(float) * (size_t)(n_tok + 1) * n_out);
    weight w = { .data = packed, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = 2 * (size_t)n_in,
                 .panels = true };
    long ns = matmul_scratch_floats(&w, n_tok);
    float *scratch = ns ? malloc(sizeof(float) * (size_t)ns) : NULL;
    int bad = 0;
    if (!rows || !packed || !X || !Y || (ns && !scratch)) {
        test_fail(__FILE__, __LINE__, "out of memory");
        bad = 1;
        goto out;
    }
    for (size_t i = 0; i < nw; i++)
        rows[i] = to16(type, frand() * (1.0f + (float)(i % 5)));
    for (size_t i = 0; i < (size_t)n_tok * n_in; i++)
        X[i] = frand();
    for (size_t i = 0; i < (size_t)(n_tok + 1) * n_out; i++)
        Y[i] = -777.0f;
    panels_pack(rows, type, n_in, n_out, packed);
    run_mode(Y, &w, X, n_tok, mode, scratch);
    for (int t = 0; t <= n_tok && !bad; t++)
        for (int r = 0; r < n_out && !bad; r++) {
            const float got = Y[(size_t)t * n_out + r];
            if (t == n_tok) {
                if (got != -777.0f) {
                    test_fail(__FILE__, __LINE__, "type %u %d x %d, %d tokens, mode %d: wrote past the last token",
                              type, n_out, n_in, n_tok, mode);
                    bad = 1;
                }
                continue;
            }
            double s = 0.0, mag = 0.0;
            for (int k = 0; k < n_in; k++) {
                const double p = (double)from16(type, rows[(size_t)r * n_in + k]) * X[(size_t)t * n_in + k];
                s += p;
                mag += p < 0 ? -p : p;
            }
            bad = !near(got, s, n_in * 0x1p-23 * mag, type, n_out, n_in, n_tok, mode, t, r);
        }
out:
    free(rows);
    free(packed);
    free(X);
    free(Y);
    free(scratch);
    return bad;
}

TEST(test_panels_products_match_double_dots_of_the_stored_rows)
{
    static const uint32_t types[] = { GGML_BF16, GGML_F16 };
    static const int shapes[][2] = { { 16, 2 }, { 32, 34 }, { 48, 1024 }, { 80, 130 } };
    /* 1-12 every tile width; 13, 16, 25, 65 several groups of 12 and a remainder */
    static const int toks[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 25, 65 };
    rng_state = 29;
    /* the exact (convert+FMA) kernel for BF16 decode steps: the vdpbf16ps
     * one rounds the activations (tests/test_bf16.c checks it) */
    simd_set_bf16_dot(0);
    int n = 0;
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < sizeof shapes / sizeof shapes[0]; b++)
            for (size_t c = 0; c < sizeof toks / sizeof toks[0]; c++)
                for (int mode = 0; mode < N_MODES; mode++) {
                    if (check_products(types[a], shapes[b][0], shapes[b][1], toks[c], mode))
                        return;
                    n++;
                }
    CHECK(n == 2 * 4 * 16 * N_MODES);
    if (!simd_avx512())
        return;
    /* the portable loop too, where the CPU would take the kernels */
    simd_set_avx512(false);
    int bad = check_products(GGML_BF16, 48, 1024, 5, 1) || check_products(GGML_F16, 80, 130, 17, 0);
    simd_set_avx512(true);
    simd_set_bf16_dot(-1);
    CHECK(!bad);
}

/* F16 prompts through matmul with the length switch forced each way: the
 * outer-product kernel at every length, and sgemm on decoded panels past
 * small_max; both within f32 summation of the double dots (a wide shape,
 * past the kernel's chunk of 512 k, and token counts past its group of 12) */
TEST(test_panels_f16_prompt_takes_either_path_by_length)
{
    static const int toks[] = { 13, 40, 100 };
    rng_state = 31;
    int bad = 0;
    for (int f = 0; f < 2 && !bad; f++) {
        matmul_set_f16_outer_max(f ? 0 : INT_MAX);
        CHECK(matmul_f16_outer_max() == (f ? 16 : INT_MAX));
        char name[MATMUL_PROMPT_NAME_LEN];
        matmul_prompt_describe(GGML_F16, name, sizeof name);
        CHECK_MSG(!strncmp(name, "outer-product tile", 18), "%s", name);
        for (size_t t = 0; t < sizeof toks / sizeof toks[0] && !bad; t++)
            bad = check_products(GGML_F16, 48, 1030, toks[t], 0) || check_products(GGML_F16, 32, 34, toks[t], 0);
    }
    matmul_set_f16_outer_max(-1);
    CHECK(!bad);
}

/* matmul_many on packed weights of one type and width (one parallel
 * region for all), next to a weight left as rows (20 rows: no panels),
 * for one token and a decode step of 5. On AMX the rows' decode step
 * takes the bf16 tiles (docs/performance.md 6), which round the
 * activations to bf16 as llama.cpp does: that weight's step is checked
 * against the double dot of the rounded activations, as strictly. */
TEST(test_panels_matmul_many_takes_packed_weights)
{
    enum { N_IN = 64, T_MAX = 5 };
    const int n_out[3] = { 32, 48, 20 };
    uint16_t *rows[3], *packed[2];
    float X[T_MAX * N_IN], Y[3][T_MAX * 48];
    weight w[3];
    bool ok = true;
    for (int m = 0; m < 3; m++)
        ok &= (rows[m] = malloc(sizeof(uint16_t) * n_out[m] * N_IN)) != NULL;
    for (int m = 0; m < 2; m++)
        ok &= (packed[m] = aligned_alloc(64, sizeof(uint16_t) * 48 * N_IN)) != NULL;
    CHECK(ok);
    if (!ok)
        goto out;
    rng_state = 7;
    for (int i = 0; i < T_MAX * N_IN; i++)
        X[i] = frand();
    for (int m = 0; m < 3; m++) {
        for (int i = 0; i < n_out[m] * N_IN; i++)
            rows[m][i] = f32_to_bf16(frand());
        w[m] = (weight){ .data = rows[m], .type = GGML_BF16, .n_in = N_IN, .n_out = n_out[m], .row_bytes = 2 * N_IN };
        if (m < 2) {
            panels_pack(rows[m], GGML_BF16, N_IN, n_out[m], packed[m]);
            w[m].data = packed[m];
            w[m].panels = true;
        }
    }
    const weight *W[3] = { &w[0], &w[1], &w[2] };
    float *Yp[3] = { Y[0], Y[1], Y[2] };
    simd_set_bf16_dot(0);       /* the exact kernel (as above) */
    float *scratch = malloc(sizeof(float) * (size_t)matmul_scratch_floats(&w[2], T_MAX));
    CHECK(scratch);
    for (int n_tok = 1; scratch && n_tok <= T_MAX; n_tok += T_MAX - 1) {
        matmul_many(3, Yp, W, X, n_tok, n_tok > 1, scratch);
        for (int m = 0; m < 3; m++)
            for (int t = 0; t < n_tok; t++)
                for (int r = 0; r < n_out[m]; r++) {
                    const bool tiles = m == 2 && n_tok > 1 && simd_amx_bf16();
                    double s = 0.0;
                    for (int k = 0; k < N_IN; k++) {
                        const float x = X[t * N_IN + k];
                        s += (double)bf16_to_f32(rows[m][r * N_IN + k]) * (tiles ? bf16_to_f32(f32_to_bf16(x)) : x);
                    }
                    CHECK_NEAR(Y[m][t * n_out[m] + r], s, 1e-4);
                }
    }
    free(scratch);
    simd_set_bf16_dot(-1);
out:
    for (int m = 0; m < 3; m++)
        free(rows[m]);
    for (int m = 0; m < 2; m++)
        free(packed[m]);
}

/* A token's outputs on the outer-product kernel are the same bits alone
 * and in a decode step of any size (each output one chain of FMAs over
 * k, whatever the tile), so a sequence decodes the same in any batch.
 * On 2 threads (the weights are past the one-thread size), at every level
 * the machine runs (the AVX512-VNNI kernel, the portable loop): Q8_0's
 * one token and steps of up to 16 tokens of 1024 get their int8
 * activations before the parallel region, 17 and 25 in shares inside it
 * behind a barrier (panels.c, ACT_PREP_SERIAL): the same bits either way. */
TEST(test_panels_decode_step_outputs_equal_each_token_alone)
{
    static const uint32_t types[] = { GGML_BF16, GGML_F16, GGML_Q8_0 };
    static const int toks[] = { 2, 3, 5, 6, 7, 12, 13, 16, 17, 25 };
    enum { N_OUT = 176, N_IN = 1024, T_MAX = 25 };     /* 11 panels: pairs and a single */
    uint16_t *rows = malloc(sizeof(uint16_t) * N_OUT * N_IN), *packed = aligned_alloc(64, 2 * N_OUT * N_IN);
    float *X = malloc(sizeof(float) * T_MAX * N_IN), *Y = malloc(sizeof(float) * T_MAX * N_OUT);
    weight q8w = { .type = GGML_Q8_0, .n_in = N_IN, .n_out = N_OUT };
    float *scratch = malloc(sizeof(float) * (size_t)panels_scratch_floats(&q8w, T_MAX));
    float one[N_OUT];
    CHECK(rows && packed && X && Y && scratch);
    blas_set_threads(2);
    rng_state = 41;
    const int n_runs = simd_avx512() ? 6 : 3;          /* the CPU's level, then the portable loop */
    for (int run = 0; run < n_runs && rows && packed && X && Y && scratch; run++) {
        const int a = run % 3;
        simd_set_avx512(run < 3);
        const bool q8 = types[a] == GGML_Q8_0;
        uint8_t *q8r = q8 ? q8_rows(N_OUT, N_IN) : NULL;
        if (q8 && !q8r)
            break;
        for (int i = 0; i < N_OUT * N_IN && !q8; i++)
            rows[i] = to16(types[a], frand());
        for (int i = 0; i < T_MAX * N_IN; i++)
            X[i] = frand() * 4.0f;
        panels_pack(q8 ? (const void *)q8r : rows, types[a], N_IN, N_OUT, packed);
        free(q8r);
        weight w = { .data = packed, .type = types[a], .n_in = N_IN, .n_out = N_OUT,
                     .row_bytes = q8 ? N_IN / 32 * 34 : 2 * N_IN, .panels = true };
        float *sc = q8 ? scratch : NULL;
        for (size_t c = 0; c < sizeof toks / sizeof toks[0]; c++) {
            panels_matmul(Y, &w, X, toks[c], PANELS_DECODE, sc);
            for (int t = 0; t < toks[c]; t++) {
                panels_matmul(one, &w, X + (size_t)t * N_IN, 1, PANELS_DECODE, sc);
                if (memcmp(one, Y + (size_t)t * N_OUT, sizeof one)) {
                    CHECK_MSG(0, "type %u, level %s: token %d of a step of %d differs from the token alone",
                              types[a], simd_name(), t, toks[c]);
                    goto out;
                }
            }
        }
    }
out:
    simd_set_avx512(true);
    simd_set_bf16_dot(-1);
    free(rows);
    free(packed);
    free(X);
    free(Y);
    free(scratch);
}

/* ---- Q8_0 ---- */

/* n_out rows of n_in random Q8_0 weights as the file stores them */
static uint8_t *q8_rows(int n_out, int n_in)
{
    const int nb = n_in / 32;
    uint8_t *rows = malloc((size_t)n_out * nb * 34);
    for (size_t b = 0; rows && b < (size_t)n_out * nb; b++) {
        const uint16_t d = f32_to_fp16(0.01f + 0.02f * (frand() + 1.0f));
        memcpy(rows + 34 * b, &d, 2);
        for (int j = 0; j < 32; j++)
            rows[34 * b + 2 + j] = (uint8_t)(int8_t)(frand() * 127.5f);   /* -127 .. 127 */
    }
    return rows;
}

/* Q8_0 products against the rows as stored. On int8 activations (one
 * token, decode steps: modes 1 and 2): per block the exact int sum of the
 * stored quants with quantize_act_q8_ref's activations, times dw dx, in
 * double. On f32 activations (prompts: mode 0 from 2 tokens, PANELS_OUTER,
 * PANELS_SGEMM): double dots of the dequantized rows. */
static int check_q8_products(int n_out, int n_in, int n_tok, int mode)
{
    const int nb = n_in / 32;
    const size_t rb = (size_t)nb * 34;
    uint8_t *rows = q8_rows(n_out, n_in), *packed = aligned_alloc(64, ((size_t)n_out * rb + 63) / 64 * 64);
    float *X = malloc(sizeof(float) * (size_t)n_tok * n_in), *Y = malloc(sizeof(float) * (size_t)(n_tok + 1) * n_out);
    int8_t *xq = malloc((size_t)n_in);
    float *xd = malloc(sizeof(float) * (size_t)nb), *row = malloc(sizeof(float) * (size_t)n_in);
    weight w = { .data = packed, .type = GGML_Q8_0, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .panels = true };
    const long ns = matmul_scratch_floats(&w, n_tok);
    float *scratch = malloc(sizeof(float) * (size_t)ns);
    int bad = 0;
    if (!rows || !packed || !X || !Y || !xq || !xd || !row || !scratch) {
        test_fail(__FILE__, __LINE__, "out of memory");
        bad = 1;
        goto out;
    }
    for (size_t i = 0; i < (size_t)n_tok * n_in; i++)
        X[i] = frand() * (1.0f + (float)(i % 7));
    for (size_t i = 0; i < (size_t)(n_tok + 1) * n_out; i++)
        Y[i] = -777.0f;
    panels_pack(rows, GGML_Q8_0, n_in, n_out, packed);
    run_mode(Y, &w, X, n_tok, mode, scratch);
    /* int8 activations: one token, decode steps (mode 1), the outer kernel (2), and prompts (0)
     * where int8 prompts are on (matmul.h); else prompts keep f32 */
    const bool int8 = n_tok == 1 || mode == 1 || mode == 2 || (mode == 0 && matmul_int8_prompt(GGML_Q8_0, n_tok));
    for (int t = 0; t <= n_tok && !bad; t++) {
        if (t == n_tok) {
            for (int r = 0; r < n_out && !bad; r++)
                if (Y[(size_t)t * n_out + r] != -777.0f) {
                    test_fail(__FILE__, __LINE__, "q8_0 %d x %d, %d tokens, mode %d: wrote past the last token",
                              n_out, n_in, n_tok, mode);
                    bad = 1;
                }
            continue;
        }
        const float *x = X + (size_t)t * n_in;
        quantize_act_q8_ref(x, n_in, xq, xd);
        for (int r = 0; r < n_out && !bad; r++) {
            const uint8_t *rr = rows + (size_t)r * rb;
            double s = 0.0, mag = 0.0;
            if (int8) {
                for (int b = 0; b < nb; b++) {
                    uint16_t d;
                    memcpy(&d, rr + 34 * b, 2);
                    long is = 0;
                    for (int j = 0; j < 32; j++)
                        is += (long)(int8_t)rr[34 * b + 2 + j] * xq[32 * b + j];
                    const double p = (double)fp16_to_f32(d) * xd[b] * (double)is;
                    s += p;
                    mag += p < 0 ? -p : p;
                }
            } else {
                dequant_row(GGML_Q8_0, rr, row, n_in);
                for (int k = 0; k < n_in; k++) {
                    const double p = (double)row[k] * x[k];
                    s += p;
                    mag += p < 0 ? -p : p;
                }
            }
            bad = !near(Y[(size_t)t * n_out + r], s, (int8 ? nb + 2 : n_in) * 0x1p-23 * mag, GGML_Q8_0, n_out, n_in,
                        n_tok, mode, t, r);
        }
    }
out:
    free(rows);
    free(packed);
    free(X);
    free(Y);
    free(xq);
    free(xd);
    free(row);
    free(scratch);
    return bad;
}

TEST(test_panels_q8_0_products_match_the_int8_arithmetic_of_the_stored_rows)
{
    /* 416 inputs: 13 blocks, so steps of more than 6 tokens take a pair's
     * blocks in a whole chunk and a part (panels.c, Q8P_KC) */
    static const int shapes[][2] = { { 16, 32 }, { 32, 96 }, { 48, 1024 }, { 80, 160 }, { 64, 416 } };
    static const int toks[] = { 1, 2, 3, 5, 6, 7, 12, 13, 16, 65, 70 };
    rng_state = 31;
    for (size_t b = 0; b < sizeof shapes / sizeof shapes[0]; b++)
        for (size_t c = 0; c < sizeof toks / sizeof toks[0]; c++)
            for (int mode = 0; mode < N_MODES; mode++)
                if (check_q8_products(shapes[b][0], shapes[b][1], toks[c], mode))
                    return;
    if (!simd_avx512())
        return;
    simd_set_avx512(false);             /* the portable loop */
    const int bad = check_q8_products(48, 1024, 5, 1) || check_q8_products(80, 160, 17, 0) ||
                    check_q8_products(32, 96, 1, 0);
    simd_set_avx512(true);
    simd_set_bf16_dot(-1);
    CHECK(!bad);
}

/* test_bf16.c - BF16 decode and prompts on vdpbf16ps (engine/kernels/simd_bf16.h).
 *
 * The weights are exact bf16; the kernel rounds each activation to bf16
 * (nearest even) and sums the pairs' products in f32. So against the exact
 * product with f32 activations every term moves by at most |w x| 2^-8
 * (half a unit in the last place of bf16's 8-bit significand), and the f32 sums add at most
 * about n 2^-24 sum |w x| more: the tolerance below, from those two
 * figures and nothing measured. Against the same product with the
 * activations rounded by the scalar reference only the f32 summation
 * remains. A kernel that skipped the rounding, dropped the odd element of
 * a pair, or read a wrong pair misses by far more.
 *
 * The decode tests need AVX512_BF16; elsewhere each is reported skipped.
 * The switch (simd_set_bf16_dot, HYSERVE_BF16_DOT) is tested both
 * ways, so both paths run on any machine with the instruction whatever
 * the start-up measurement chose. The prompt test runs each form the
 * machine can run (vdpbf16ps, the rounded activations on the FMA kernel,
 * the portable loop) and names the ones it skips.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/ggml_type.h"
#include "kernels/half.h"
#include "kernels/panels.h"
#include "kernels/simd_bf16.h"
#include "matmul.h"
#include "test.h"

static uint32_t rng;
static float urand(void) /* [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((double)(rng >> 8) * 0x1p-23 - 1.0);
}

#define NO_BF16 "no AVX512_BF16 (or AVX-512 off: HYSERVE_SIMD=avx2/0)"

TEST(test_bf16_rounding_instruction_matches_the_reference)
{
    if (!cpu_kern.on.avx512_bf16)
        SKIP(NO_BF16);
    enum { N = 1000 };
    float x[N];
    uint16_t a[N], b[N];
    rng = 11;
    for (int i = 0; i < N; i++)
        x[i] = urand() * ldexpf(1.0f, (int)(rng % 60) - 30);
    /* ties both ways, the largest finite, a NaN, infinities, zeros, a denormal */
    const uint32_t special[] = { 0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu, 0x7fc00001u, 0x7f800000u,
                                 0xff800000u, 0x80000000u, 0x00000000u, 0x00400000u, 0x3f80ffffu };
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        memcpy(&x[i], &special[i], 4);
    for (int n = N; n >= N - 7; n--) {          /* the masked tail: 1000 % 16 = 8, and shorter */
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        bf16_round_row_ref(x, n, a);
        avx512bf16_round_row(x, n, b);
        for (int i = 0; i < N; i++)
            CHECK_MSG(a[i] == b[i], "n %d element %d (%.9g): ref %04x instruction %04x", n, i, (double)x[i], a[i],
                      b[i]);
    }
    CHECK(bf16_round_ref(1.0f) == 0x3f80);
    CHECK(bf16_round_ref(x[0]) == 0x3f80);      /* 1 + 2^-8: a tie, to the even 1 */
    CHECK(bf16_round_ref(x[1]) == 0x3f82);      /* 1 + 3 2^-8: a tie, to the even 1 + 2^-6 */
}

/* rows of bf16 weights and their panels; x and its rounded pairs */
typedef struct case_ {
    int n_out, n_in;
    uint16_t *rows, *packed;
    float *x;                   /* [T][n_in] */
} case_;

static bool case_make(case_ *c, int n_out, int n_in, int n_tok, uint32_t seed)
{
    c->n_out = n_out;
    c->n_in = n_in;
    c->rows = malloc(sizeof(uint16_t) * (size_t)n_out * n_in);
    c->packed = aligned_alloc(64, sizeof(uint16_t) * (size_t)n_out * n_in);
    c->x = malloc(sizeof(float) * (size_t)n_tok * n_in);
    if (!c->rows || !c->packed || !c->x)
        return false;
    rng = seed;
    for (int i = 0; i < n_out * n_in; i++)
        c->rows[i] = f32_to_bf16(urand());
    for (int i = 0; i < n_tok * n_in; i++)
        c->x[i] = urand() * 3.0f;
    panels_pack(c->rows, GGML_BF16, n_in, n_out, c->packed);
    return true;
}

static void case_free(case_ *c)
{
    free(c->rows);
    free(c->packed);
    free(c->x);
}

/* output (t, r) against the exact product and the rounded-activation one:
 * 0 when within the bounds of the header, else 1 (with a message) */
static int check_out(const case_ *c, const float *x, float y, int r, const char *what)
{
    double exact = 0.0, rounded = 0.0, mag = 0.0;
    for (int k = 0; k < c->n_in; k++) {
        const double w = bf16_to_f32(c->rows[(size_t)r * c->n_in + k]);
        exact += w * x[k];
        rounded += w * bf16_to_f32(bf16_round_ref(x[k]));
        mag += fabs(w * x[k]);
    }
    const double sum_tol = (c->n_in + 2) * 0x1p-24 * mag * 1.01;
    const double round_tol = 0x1p-8 * mag + sum_tol;
    if (fabs(y - rounded) > sum_tol || fabs(y - exact) > round_tol) {
        test_fail(__FILE__, __LINE__, "%s %dx%d row %d: %.9g, rounded-x product %.9g (tol %.3g), exact %.9g (tol %.3g)",
                  what, c->n_out, c->n_in, r, (double)y, rounded, sum_tol, exact, round_tol);
        return 1;
    }
    return 0;
}

TEST(test_bf16_dot_kernel_within_bf16_rounding_of_the_reference)
{
    if (!cpu_kern.on.avx512_bf16)
        SKIP(NO_BF16);
    static const int shapes[][2] = { { 16, 2 }, { 48, 34 }, { 32, 1024 }, { 80, 3584 } };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n_out = shapes[s][0], n_in = shapes[s][1], T = 11;     /* a tile of 8 and one of 3 */
        case_ c;
        const bool ok = case_make(&c, n_out, n_in, T, 100u + (uint32_t)s);
        uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)T * n_in);
        float *y = malloc(sizeof(float) * (size_t)T * n_out);
        CHECK(ok && xb && y);
        for (int t = 0; t < T; t++)
            bf16_round_row_ref(c.x + (size_t)t * n_in, n_in, xb + (size_t)t * n_in);
        /* every panel range: all, and each single panel (the RV = 1 tile) */
        const size_t ps = (size_t)PANEL_ROWS * 2 * n_in;
        avx512bf16_pan_rows((const char *)c.packed, ps, 0, n_out / 16, n_in, xb, T, y, n_out);
        int bad = 0;
        for (int t = 0; t < T && !bad; t++)
            for (int r = 0; r < n_out && !bad; r++)
                bad = check_out(&c, c.x + (size_t)t * n_in, y[(size_t)t * n_out + r], r, "all panels");
        for (int p = 0; p < n_out / 16 && !bad; p++) {
            memset(y, 0, sizeof(float) * (size_t)T * n_out);
            avx512bf16_pan_rows((const char *)c.packed, ps, p, p + 1, n_in, xb, 1, y, n_out);
            for (int r = 16 * p; r < 16 * p + 16 && !bad; r++)
                bad = check_out(&c, c.x, y[r], r, "one panel");
        }
        free(xb);
        free(y);
        case_free(&c);
        CHECK(!bad);
    }
}

/* panels_matmul as a decode step with the switch forced each way: on,
 * the vdpbf16ps bounds and the same bits for a token alone and in a step
 * of 5; off, the exact kernel (f32 activations: within f32 summation of
 * the exact product, tighter than the bf16 rounding the other path shows) */
TEST(test_bf16_dot_switch_forces_each_path_in_decode_steps)
{
    if (!cpu_kern.on.avx512_bf16)
        SKIP(NO_BF16);
    enum { N_OUT = 48, N_IN = 1024, T = 5 };
    case_ c;
    const bool ok = case_make(&c, N_OUT, N_IN, T, 7);
    weight w = { .data = c.packed, .type = GGML_BF16, .n_in = N_IN, .n_out = N_OUT, .row_bytes = 2 * N_IN,
                 .panels = true };
    float *scratch = malloc(sizeof(float) * (size_t)matmul_scratch_floats(&w, T));
    float y[T * N_OUT], one[N_OUT];
    CHECK(ok && scratch);
    int bad = 0;
    double max_dev_on = 0.0;
    for (int mode = 1; mode >= 0 && !bad; mode--) {
        simd_set_bf16_dot(mode);
        CHECK(simd_bf16_dot() == (mode == 1));
        CHECK((strstr(simd_name(), "+bf16dp") != NULL) == (mode == 1));
        CHECK(!strncmp(simd_bf16_dot_why(), mode ? "vdpbf16ps" : "fma", mode ? 9 : 3));
        matmul(y, &w, c.x, T, true, scratch);
        for (int t = 0; t < T && !bad; t++) {
            matmul(one, &w, c.x + (size_t)t * N_IN, 1, true, scratch);
            for (int r = 0; r < N_OUT && !bad; r++) {
                const float *x = c.x + (size_t)t * N_IN;
                double exact = 0.0, mag = 0.0;
                for (int k = 0; k < N_IN; k++) {
                    const double wk = bf16_to_f32(c.rows[(size_t)r * N_IN + k]);
                    exact += wk * x[k];
                    mag += fabs(wk * x[k]);
                }
                const float v = y[t * N_OUT + r];
                if (memcmp(&v, &one[r], 4)) {
                    test_fail(__FILE__, __LINE__, "mode %d token %d row %d: step %.9g alone %.9g", mode, t, r,
                              (double)v, (double)one[r]);
                    bad = 1;
                } else if (mode == 1) {
                    bad = check_out(&c, x, v, r, "decode step");
                    max_dev_on = fmax(max_dev_on, fabs(v - exact) / mag);
                } else if (fabs(v - exact) > (N_IN + 2) * 0x1p-24 * mag) {
                    test_fail(__FILE__, __LINE__, "fma path row %d: %.9g exact %.9g", r, (double)v, exact);
                    bad = 1;
                }
            }
        }
    }
    simd_set_bf16_dot(-1);
    /* the vdpbf16ps path really rounded: some output moved by more than the f32 sums could */
    CHECK_MSG(bad || max_dev_on > N_IN * 0x1p-24, "vdpbf16ps path max deviation %.3g: not bf16-rounded?",
              max_dev_on);
    free(scratch);
    case_free(&c);
    CHECK(!bad);
}

TEST(test_bf16_dot_startup_measurement_runs)
{
    if (!cpu_kern.on.avx512_bf16)
        SKIP(NO_BF16);
    const double r = bf16_dot_speedup();
    printf("    vdpbf16ps / convert+FMA speed ratio here: %.2f (%s)\n", r, simd_bf16_dot_why());
    CHECK(r > 0.0 && isfinite(r));
}

/* One BF16 prompt form (matmul, n_tok tokens) on a case: every output
 * within check_out's bounds of the rounded-activation product (rounded) or
 * within f32 summation of the exact product (exact mode); *dev gets the
 * largest deviation from the exact product relative to sum |w x|. */
static int prompt_form(const case_ *c, int n_tok, bool rounded, const char *what, double *dev)
{
    weight w = { .data = c->packed, .type = GGML_BF16, .n_in = c->n_in, .n_out = c->n_out,
                 .row_bytes = 2 * (size_t)c->n_in, .panels = true };
    float *scratch = malloc(sizeof(float) * (size_t)matmul_scratch_floats(&w, n_tok));
    float *y = malloc(sizeof(float) * (size_t)n_tok * c->n_out);
    int bad = !scratch || !y;
    if (!bad)
        matmul(y, &w, c->x, n_tok, false, scratch);
    for (int t = 0; t < n_tok && !bad; t++)
        for (int r = 0; r < c->n_out && !bad; r++) {
            const float *x = c->x + (size_t)t * c->n_in;
            const float v = y[(size_t)t * c->n_out + r];
            double exact = 0.0, mag = 0.0;
            for (int k = 0; k < c->n_in; k++) {
                const double wk = bf16_to_f32(c->rows[(size_t)r * c->n_in + k]);
                exact += wk * x[k];
                mag += fabs(wk * x[k]);
            }
            *dev = fmax(*dev, fabs(v - exact) / mag);
            if (rounded) {
                bad = check_out(c, x, v, r, what);
            } else if (fabs(v - exact) > (c->n_in + 2) * 0x1p-24 * mag) {
                test_fail(__FILE__, __LINE__, "%s %dx%d token %d row %d: %.9g exact %.9g", what, c->n_out, c->n_in, t,
                          r, (double)v, exact);
                bad = 1;
            }
        }
    free(scratch);
    free(y);
    return bad;
}

/* BF16 prompts (matmul, not a decode step) on weights in panels, each form
 * the machine can run, forced: vdpbf16ps (AVX512_BF16), the rounded
 * activations on the FMA kernel (AVX-512), the portable loop (AVX-512
 * off), and the exact mode. Token counts past the kernels' group of 12
 * (and not a multiple of it), widths of 34 to 1030. */
TEST(test_bf16_prompt_forms_within_bf16_rounding_of_the_reference)
{
    static const int shapes[][2] = { { 32, 34 }, { 48, 1024 }, { 80, 1030 } };
    static const int toks[] = { 2, 13, 40 };
    struct {
        const char *name;
        int dot, avx512, mode;
    } forms[] = {
        { "vdpbf16ps", 1, 1, MATMUL_BF16_ROUNDED },
        { "rounded x on the FMA kernel", 0, 1, MATMUL_BF16_ROUNDED },
        { "rounded x on the portable loop", 0, 0, MATMUL_BF16_ROUNDED },
        { "exact", 0, 1, MATMUL_BF16_EXACT },
    };
    int bad = 0;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0] && !bad; f++) {
        simd_set_avx512(true);                  /* the CPU's level (less HYSERVE_SIMD), then forced */
        simd_set_bf16_dot(-1);
        if ((forms[f].dot && !cpu_kern.on.avx512_bf16) || (forms[f].avx512 && !simd_avx512())) {
            printf("    skipped form \"%s\": %s\n", forms[f].name, forms[f].dot ? "no AVX512_BF16" : "no AVX-512");
            continue;
        }
        simd_set_avx512(forms[f].avx512);
        simd_set_bf16_dot(forms[f].dot);
        matmul_set_bf16_prompt(forms[f].mode);
        const bool rounded = forms[f].mode == MATMUL_BF16_ROUNDED;
        CHECK(matmul_bf16_prompt() == rounded);
        char name[MATMUL_PROMPT_NAME_LEN];
        matmul_prompt_describe(GGML_BF16, name, sizeof name);
        CHECK_MSG(!strncmp(name, !rounded ? "exact" : forms[f].dot ? "vdpbf16ps" : "bf16-rounded", 5),
                  "form %s: name %s", forms[f].name, name);
        double dev = 0.0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && !bad; s++)
            for (size_t t = 0; t < sizeof toks / sizeof toks[0] && !bad; t++) {
                case_ c;
                const bool ok = case_make(&c, shapes[s][0], shapes[s][1], toks[t], 300u + (uint32_t)(s * 7 + t));
                CHECK(ok);
                bad = !ok || prompt_form(&c, toks[t], rounded, forms[f].name, &dev);
                case_free(&c);
            }
        /* the rounding really happened (or really did not) */
        if (!bad && rounded)
            CHECK_MSG(dev > 1030 * 0x1p-24, "form %s: max deviation %.3g, not bf16-rounded?", forms[f].name, dev);
        printf("    form \"%s\": max deviation from the exact product %.3g of sum |w x|\n", forms[f].name, dev);
    }
    simd_set_avx512(true);
    simd_set_bf16_dot(-1);
    matmul_set_bf16_prompt(MATMUL_BF16_AUTO);
    CHECK(!bad);
}

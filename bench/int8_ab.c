/* int8_ab.c - prompt products on int8 activations against the f32 path, one
 * weight at a time, at a kernel level forced in-process: the measurement
 * behind matmul.c's automatic int8 prompt choice (which level, which type,
 * from how many tokens).
 *
 * Owns: timing matmul() on a prompt (decode false) of n tokens with
 * HYSERVE_INT8_PROMPT forced on and off (matmul_set_int8_prompt),
 * alternating the two in one process so a change in the machine's load
 * hits both; medians of the repetitions; the ratio f32 time / int8 time
 * (above 1: int8 is faster). Does not own: the kernels or the choice
 * (engine/matmul.c), the whole-engine A/B (prompt_ab.sh).
 *
 *   hyserve-int8-ab [-t THREADS] [-r REPS] [-l LEVEL] [-n "2 4 8 ..."] [TYPE...]
 *   LEVEL: avx512-vnni (default: what the CPU has), avx512 (VNNI off),
 *          avx2+vnni (AVX-512 off, AVX-VNNI on), avx2 (both off)
 *   TYPE:  q8_0 q4_k q5_k q6_k q4_0 (default q8_0 q4_k q6_k); f32 times the
 *          AVX-512 rows x tokens tile against sgemm instead (the
 *          evidence of MATMUL_F32_TILE_MAX)
 * The f32 path's sgemm is OpenBLAS's: for an AVX2 CPU's figure run the
 * AVX2 levels with OPENBLAS_CORETYPE=Haswell (its AVX2 kernels). The
 * shapes are the bench model's MLP (3584 x 1024 up/gate, 1024 x 3584
 * down). Prints one line per shape and token count, and the load average.
 */
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "kernels/blas.h"
#include "kernels/cpu.h"
#include "kernels/quant.h"
#include "matmul.h"
#include "median.h"

#define AB_MAX_REPS 31

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t ab_rng = 12345u;

static float ab_frand(void)     /* uniform in [-1, 1) */
{
    ab_rng = ab_rng * 1664525u + 1013904223u;
    return (float)(ab_rng >> 8) / (float)(1u << 23) - 1.0f;
}

static int set_level(const char *l)
{
    if (!strcmp(l, "avx512-vnni"))
        return 0;
    if (!strcmp(l, "avx512"))
        simd_set_vnni(false);
    else if (!strcmp(l, "avx2+vnni"))
        simd_set_avx512(false);
    else if (!strcmp(l, "avx2")) {
        simd_set_avx512(false);
        simd_set_vnni(false);
    } else
        return -1;
    return 0;
}

static uint32_t type_of(const char *s)
{
    static const struct { const char *name; uint32_t type; } t[] = {
        { "q8_0", GGML_Q8_0 }, { "q4_k", GGML_Q4_K }, { "q5_k", GGML_Q5_K }, { "q6_k", GGML_Q6_K },
        { "q4_0", GGML_Q4_0 }, { "f32", GGML_F32 } };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].name))
            return t[i].type;
    return UINT32_MAX;
}

int main(int argc, char **argv)
{
    blas_process_init(argv);    /* the OpenBLAS core and thread waits hyserve runs with */
    int threads = 2, reps = 7, counts[32], n_counts = 0;
    const char *level = NULL, *sizes = "2 4 8 16 24 32 48 64 128 256 512";
    int a = 1;
    for (; a < argc && argv[a][0] == '-'; a += 2) {
        if (a + 1 >= argc)
            goto usage;
        if (!strcmp(argv[a], "-t"))
            threads = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-r"))
            reps = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-l"))
            level = argv[a + 1];
        else if (!strcmp(argv[a], "-n"))
            sizes = argv[a + 1];
        else
            goto usage;
    }
    if (threads < 1 || threads > 64 || reps < 1 || reps > AB_MAX_REPS || (level && set_level(level)))
        goto usage;
    for (const char *p = sizes; *p && n_counts < 32;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p)
            break;
        if (v < 2 || v > 4096)
            goto usage;
        counts[n_counts++] = (int)v;
        p = end;
    }
    const char *deft[] = { "q8_0", "q4_k", "q6_k" };
    const int n_types = a < argc ? argc - a : 3;
    blas_set_threads(threads);
    printf("level %s, %d threads, OpenBLAS core %s, load ", simd_name(), threads, blas_core_name());
    FILE *la = fopen("/proc/loadavg", "r");
    char lbuf[64] = "?";
    if (la) {
        if (!fgets(lbuf, sizeof lbuf, la))
            strcpy(lbuf, "?\n");
        fclose(la);
    }
    printf("%s", lbuf);
    static const int shapes[2][2] = { { 3584, 1024 }, { 1024, 3584 } };   /* n_out, n_in */
    for (int ti = 0; ti < n_types; ti++) {
        const char *tname = a < argc ? argv[a + ti] : deft[ti];
        const uint32_t type = type_of(tname);
        if (type == UINT32_MAX)
            goto usage;
        for (int si = 0; si < 2; si++) {
            const int n_out = shapes[si][0], n_in = shapes[si][1], tmax = counts[n_counts - 1];
            const size_t rb = ggml_type_size(type) * (size_t)n_in / ggml_block_size(type);
            char *data = malloc(rb * (size_t)n_out);
            float *row = malloc(sizeof(float) * (size_t)n_in);
            float *X = malloc(sizeof(float) * (size_t)n_in * (size_t)tmax);
            float *Y = malloc(sizeof(float) * (size_t)n_out * (size_t)tmax);
            const weight W = { .data = data, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb };
            long sf = 0;
            for (int c = 0; c < n_counts; c++)
                if (matmul_scratch_floats(&W, counts[c]) > sf)
                    sf = matmul_scratch_floats(&W, counts[c]);
            float *scratch = aligned_alloc(64, ((size_t)sf * sizeof(float) + 64 + 63) / 64 * 64);
            if (!data || !row || !X || !Y || !scratch) {
                fprintf(stderr, "int8_ab: out of memory\n");
                return 1;
            }
            for (int o = 0; o < n_out; o++) {
                for (int i = 0; i < n_in; i++)
                    row[i] = ab_frand() * 0.1f;
                quantize_row(type, row, data + (size_t)o * rb, n_in);
            }
            for (long i = 0; i < (long)n_in * tmax; i++)
                X[i] = ab_frand();
            for (int c = 0; c < n_counts; c++) {
                const int n = counts[c];
                /* the int8 tiles, the f32 path and (K-quants, Q4_0) the decode-step kernels;
                 * F32: its tile ("int8" slot) against sgemm ("f32" slot) */
                static const int modes[3] = { MATMUL_INT8_ON, MATMUL_INT8_OFF, MATMUL_INT8_STEP };
                double t[3][AB_MAX_REPS];
                const int n_modes = type == GGML_Q8_0 || type == GGML_F32 ? 2 : 3;
                for (int r = -1; r < reps; r++) {       /* r = -1: the warm-up of each */
                    for (int m = 0; m < n_modes; m++) {
                        const int k = (r + 1 + m) % n_modes;        /* rotate the order */
                        if (type == GGML_F32)
                            matmul_set_f32_tile_max(modes[k] == MATMUL_INT8_ON ? INT_MAX : 0);
                        else
                            matmul_set_int8_prompt(modes[k]);
                        const double t0 = now_s();
                        matmul(Y, &W, X, n, false, scratch);
                        const double dt = now_s() - t0;
                        if (r >= 0)
                            t[k][r] = dt;
                    }
                }
                const double m8 = median(t[0], reps), mf = median(t[1], reps);
                const double gf = 2e-9 * n_out * (double)n_in * n;
                if (type == GGML_F32)
                    printf("%-5s %5d x %-5d tokens %4d: tile %8.3f ms (%5.0f GFLOP/s)  sgemm %8.3f ms (%5.0f)  "
                           "sgemm/tile %.2f", tname, n_out, n_in, n, 1e3 * m8, gf / m8, 1e3 * mf, gf / mf, mf / m8);
                else
                    printf("%-5s %5d x %-5d tokens %4d: int8 %8.3f ms  f32 %8.3f ms  f32/int8 %.2f", tname, n_out,
                           n_in, n, 1e3 * m8, 1e3 * mf, mf / m8);
                if (n_modes == 3) {
                    const double ms = median(t[2], reps);
                    printf("  step %8.3f ms  f32/step %.2f", 1e3 * ms, mf / ms);
                }
                printf("\n");
                fflush(stdout);
            }
            free(data); free(row); free(X); free(Y); free(scratch);
        }
    }
    matmul_set_int8_prompt(MATMUL_INT8_AUTO);
    matmul_set_f32_tile_max(-1);
    la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fgets(lbuf, sizeof lbuf, la))
            printf("load after %s", lbuf);
        fclose(la);
    }
    return 0;
usage:
    fprintf(stderr, "usage: hyserve-int8-ab [-t THREADS] [-r REPS] [-l avx512-vnni|avx512|avx2+vnni|avx2] "
                    "[-n \"2 4 8 ...\"] [q8_0|q4_k|q5_k|q6_k|q4_0|f32 ...]\n");
    return 2;
}

/* kq_rows.c - the K-quant decode kernels alone, one thread: GB/s of
 * weights through cpu_kern.dot_kq_act (one token) and
 * cpu_kern.dot_kq_act_tokens (decode steps), and (where the level has it)
 * cpu_kern.dot_kq_act_rows, runs of 64 rows a call as the engine's row
 * loop calls it ("rows 64"), rows in L2 and from memory.
 *
 * Owns: timing the kernel in use (the CPU's best level) over rows of
 * random valid blocks against one quantized activation vector, medians of
 * the repetitions, printed with the load average. Does not own: the
 * kernels (engine/kernels/simd_kquant.c), the row split (matmul.c), the
 * whole-engine figures (bench.c, engine_ab.c).
 *
 *   hyserve-kq-rows [-c] [-r REPS] [-T "1 4 8 16"] [TYPE...]    (q4_k q5_k q6_k)
 * -c times the thread's CPU time instead of wall time (on a shared machine).
 * Meant for A/B: build it on two trees and alternate the two binaries
 * pinned to one CPU (taskset -c 1), as bench/README.md shows; the figure
 * is weight bytes per second of wall time, so a busy machine lowers both.
 * Rows: 1024 elements (the bench model's n_embd); L2: 256 rows (144-210
 * KiB, read 64 times per repetition); memory: 64 MiB of rows, read once.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ggml_type.h"
#include "engine.h"
#include "kernels/cpu.h"
#include "kernels/quant.h"
#include "median.h"

#define KR_N 1024               /* elements per row */
#define KR_MAX_REPS 63
#define KR_MAX_TOK 16
#define KR_RUN 64               /* rows per call of the rows kernel (a 64 KiB chunk of the engine's is 78-113 rows) */

static uint32_t kr_rng = 2463534242u;

static uint32_t kr_next(void)   /* xorshift32 */
{
    kr_rng ^= kr_rng << 13;
    kr_rng ^= kr_rng >> 17;
    kr_rng ^= kr_rng << 5;
    return kr_rng;
}

/* random blocks of type t with small positive half-precision scales (the
 * d and dmin fields: 0x2000-0x2fff, about 0.008-0.12) */
static void fill_rows(uint32_t t, uint8_t *p, size_t n_bytes)
{
    for (size_t i = 0; i < n_bytes; i++)
        p[i] = (uint8_t)kr_next();
    const size_t bb = t == GGML_Q6_K ? 210 : t == GGML_Q5_K ? 176 : 144;
    for (size_t o = 0; o + bb <= n_bytes; o += bb) {
        uint16_t h = (uint16_t)(0x2000 | (kr_next() & 0x0fff)), m = (uint16_t)(0x2000 | (kr_next() & 0x0fff));
        if (t == GGML_Q6_K) {
            memcpy(p + o + 208, &h, 2);
        } else {
            memcpy(p + o, &h, 2);
            memcpy(p + o + 2, &m, 2);
        }
    }
}

static volatile float kr_sink;
static int kr_cpu;              /* -c: the thread's CPU time, not wall time (a shared machine's other processes drop out) */

static double kr_now(void)
{
    if (!kr_cpu)
        return engine_now_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* seconds for one pass of n_tok tokens over n_rows rows, reps times */
static double pass(uint32_t t, const uint8_t *rows, size_t rb, int n_rows, int n_tok, const int8_t *const *q,
                   const float *const *d, const int16_t *const *bs, int reps)
{
    float y[KR_MAX_TOK];
    const double t0 = kr_now();
    if (n_tok == 0) {           /* the engine's one-token path: a run of rows per call (cpu_kern.dot_kq_act_rows) */
        static float ys[1 << 17];
        for (int k = 0; k < reps; k++)
            for (int r = 0; r < n_rows; r += KR_RUN) {
                const int nr = n_rows - r < KR_RUN ? n_rows - r : KR_RUN;
                cpu_kern.dot_kq_act_rows(t, rows + (size_t)r * rb, rb, nr, q[0], d[0], bs[0], KR_N, ys, 1);
                kr_sink = ys[0];
            }
        return kr_now() - t0;
    }
    for (int k = 0; k < reps; k++)
        for (int r = 0; r < n_rows; r++) {
            const uint8_t *row = rows + (size_t)r * rb;
            if (n_tok == 1)
                y[0] = cpu_kern.dot_kq_act(t, row, q[0], d[0], bs[0], KR_N);
            else
                cpu_kern.dot_kq_act_tokens(t, row, KR_N, q, d, bs, n_tok, y, 1);
            kr_sink = y[0];
        }
    return kr_now() - t0;
}

int main(int argc, char **argv)
{
    int reps = 15, toks[9] = { 1, 4, 8, 16 }, n_toks = 4, a = 1;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (!strcmp(argv[a], "-c")) {
            kr_cpu = 1;
        } else if (!strcmp(argv[a], "-r") && a + 1 < argc) {
            reps = atoi(argv[++a]);
            if (reps < 1 || reps > KR_MAX_REPS)
                reps = 15;
        } else if (!strcmp(argv[a], "-T") && a + 1 < argc) {
            char *s = argv[++a], *e;
            n_toks = 0;
            for (long v = strtol(s, &e, 10); e != s && n_toks < 8; s = e, v = strtol(s, &e, 10))
                if (v >= 1 && v <= KR_MAX_TOK)
                    toks[n_toks++] = (int)v;
        } else {
            fprintf(stderr, "usage: %s [-c] [-r REPS] [-T \"1 4 8 16\"] [q4_k|q5_k|q6_k ...]\n", argv[0]);
            return 2;
        }
    }
    static const char *names[] = { "q4_k", "q5_k", "q6_k" };
    static const uint32_t types[] = { GGML_Q4_K, GGML_Q5_K, GGML_Q6_K };
    static const size_t blk[] = { 144, 176, 210 };
    if (!cpu_kern.dot_kq_act_tokens)
        fprintf(stderr, "note: no decode-step kernel at this level; steps are skipped\n");
    if (cpu_kern.dot_kq_act_rows && n_toks < 9) {      /* "tokens 0": the rows kernel, after the one-row calls */
        int i = 0;
        while (i < n_toks && toks[i] != 1)
            i++;
        if (i < n_toks) {
            memmove(toks + i + 2, toks + i + 1, sizeof(int) * (size_t)(n_toks - i - 1));
            toks[i + 1] = 0;
            n_toks++;
        }
    }

    /* KR_MAX_TOK tokens' activations */
    int8_t *q[KR_MAX_TOK];
    float *d[KR_MAX_TOK];
    int16_t *bs[KR_MAX_TOK];
    float x[KR_N];
    for (int t = 0; t < KR_MAX_TOK; t++) {
        q[t] = malloc(KR_N);
        d[t] = malloc(sizeof(float) * (KR_N / 256));
        bs[t] = malloc(sizeof(int16_t) * (KR_N / 16));
        if (!q[t] || !d[t] || !bs[t])
            return 1;
        for (int i = 0; i < KR_N; i++)
            x[i] = (float)((int)(kr_next() % 2001) - 1000) / 1000.0f;
        quantize_act_q8k(x, KR_N, q[t], d[t], bs[t]);
    }
    const size_t mem_bytes = (size_t)64 << 20;
    uint8_t *big = malloc(mem_bytes);
    if (!big)
        return 1;
    double ld[3] = { 0 };
    if (getloadavg(ld, 3) < 0)
        ld[0] = -1;
    printf("# kq_rows: one thread, %d elements per row, medians of %d, %s time, load %.2f\n", KR_N, reps,
           kr_cpu ? "CPU" : "wall", ld[0]);
    for (int ai = a == argc ? 0 : a; ai < (a == argc ? 3 : argc); ai++) {
        int k = ai;
        if (a != argc)
            for (k = 0; k < 3 && strcmp(argv[ai], names[k]); k++)
                ;
        if (k == 3) {
            fprintf(stderr, "unknown type %s\n", argv[ai]);
            continue;
        }
        const uint32_t t = types[k];
        const size_t rb = blk[k] * (KR_N / 256);
        const int l2_rows = 256, mem_rows = (int)(mem_bytes / rb);
        fill_rows(t, big, mem_bytes);
        for (int ti = 0; ti < n_toks; ti++) {
            const int nt = toks[ti];
            if (nt > 1 && !cpu_kern.dot_kq_act_tokens)
                continue;
            double tl2[KR_MAX_REPS], tmem[KR_MAX_REPS];
            pass(t, big, rb, l2_rows, nt, (const int8_t *const *)q, (const float *const *)d,
                 (const int16_t *const *)bs, 8);     /* warm-up */
            for (int r = 0; r < reps; r++) {
                tl2[r] = pass(t, big, rb, l2_rows, nt, (const int8_t *const *)q, (const float *const *)d,
                              (const int16_t *const *)bs, 64);
                tmem[r] = pass(t, big, rb, mem_rows, nt, (const int8_t *const *)q, (const float *const *)d,
                               (const int16_t *const *)bs, 1);
            }
            const double gl2 = 64.0 * l2_rows * (double)rb / median(tl2, reps) * 1e-9;
            const double gmem = (double)mem_rows * (double)rb / median(tmem, reps) * 1e-9;
            if (nt == 0)
                printf("%s rows %4d: L2 %6.2f GB/s  memory %6.2f GB/s  (weights; one token, %d rows a call)\n",
                       names[k], KR_RUN, gl2, gmem, KR_RUN);
            else
                printf("%s tokens %2d: L2 %6.2f GB/s  memory %6.2f GB/s  (weights; x%d tokens of work)\n", names[k],
                       nt, gl2, gmem, nt);
        }
    }
    for (int t = 0; t < KR_MAX_TOK; t++) {
        free(q[t]);
        free(d[t]);
        free(bs[t]);
    }
    free(big);
    return 0;
}

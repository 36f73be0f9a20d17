/* mv_rows.c - the one-token decode kernels of F32, F16, BF16 and Q8_0
 * alone, one thread: GB/s of weights through avx2_matvec (the kernel
 * matvec_tokens runs per chunk: four row streams, Q8_0 on int8
 * activations with VNNI where the CPU has it), rows in L2 and from
 * memory, beside a one-thread triad measured in the same process.
 *
 * Owns: timing the kernel over random rows in chunks of SHARE_CHUNK_BYTES
 * (as the engine's threads claim them), medians of the repetitions, and
 * the triad (a[i] = b[i] + s c[i] on 3 x 32 MiB, bytes counted 3 per
 * element, the convention of `hyserve-bench limits`), alternated with the
 * kernel's passes so both see the same load. Does not own: the kernels
 * (engine/kernels/simd_avx2.c), the K-quants (kq_rows.c), the engine's
 * row split (matmul.c).
 *
 *   hyserve-mv-rows [-r REPS] [TYPE...]          (f32 f16 bf16 q8_0)
 * The question it answers (issue 39): can one core's kernel keep up with
 * its share of a fast machine's memory (28 GB/s per thread of a 56 GB/s
 * triad at 2 threads)? "memory / triad" near 1 means bandwidth-bound on
 * this host; "L2" is the kernel's own rate, the ceiling on any host.
 * Rows: 1024 elements (the bench model's n_embd); L2: 192 KiB of rows
 * read 64 times per repetition; memory: 64 MiB of rows, read once.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels/ggml_type.h"
#include "kernels/quant.h"
#include "kernels/share.h"
#include "kernels/simd.h"
#include "median.h"

#define MR_N 1024
#define MR_MAX_REPS 63
#define MR_TRIAD_N ((size_t)4 << 20)   /* floats per triad array: 16 MiB each */

static uint32_t mr_rng = 2463534242u;

static uint32_t mr_next(void)   /* xorshift32 */
{
    mr_rng ^= mr_rng << 13;
    mr_rng ^= mr_rng >> 17;
    mr_rng ^= mr_rng << 5;
    return mr_rng;
}

static float mr_unit(void)
{
    return (float)((int)(mr_next() % 2001) - 1000) / 1000.0f;
}

/* n_bytes of rows of type t with finite values (Q8_0: scales 0x2000-0x2fff) */
static void fill_rows(uint32_t t, uint8_t *p, size_t n_bytes)
{
    if (t == GGML_F32) {
        float *f = (float *)p;
        for (size_t i = 0; i < n_bytes / 4; i++)
            f[i] = mr_unit();
        return;
    }
    for (size_t i = 0; i < n_bytes; i++)
        p[i] = (uint8_t)mr_next();
    if (t == GGML_F16 || t == GGML_BF16) {   /* exponents kept small: no inf or NaN */
        uint16_t *h = (uint16_t *)p;
        for (size_t i = 0; i < n_bytes / 2; i++)
            h[i] = (uint16_t)((h[i] & 0x83ff) | (t == GGML_F16 ? 0x3000 : 0x3c00));
        return;
    }
    for (size_t o = 0; o + 34 <= n_bytes; o += 34) {
        const uint16_t d = (uint16_t)(0x2000 | (mr_next() & 0x0fff));
        memcpy(p + o, &d, 2);
    }
}

static volatile float mr_sink;

/* seconds for reps passes over n_rows rows in chunks, as one engine thread */
static double pass(uint32_t t, const uint8_t *rows, size_t rb, int n_rows, const float *x, const int8_t *xq,
                   const float *xd, float *y, int reps)
{
    const int chunk = (int)(SHARE_CHUNK_BYTES / (long)rb) & ~3;
    const double t0 = engine_now_s();
    for (int k = 0; k < reps; k++)
        for (int r = 0; r < n_rows; r += chunk) {
            const int nr = n_rows - r < chunk ? n_rows - r : chunk;
            avx2_matvec(t, rows + (size_t)r * rb, rb, nr, x, xq, xd, MR_N, y + r);
        }
    mr_sink = y[0];
    return engine_now_s() - t0;
}

static double triad(float *a, const float *b, const float *c)
{
    const double t0 = engine_now_s();
    for (size_t i = 0; i < MR_TRIAD_N; i++)
        a[i] = b[i] + 3.0f * c[i];
    const double s = engine_now_s() - t0;
    mr_sink = a[MR_TRIAD_N / 2];
    return s;
}

int main(int argc, char **argv)
{
    int reps = 15, a = 1;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (!strcmp(argv[a], "-r") && a + 1 < argc) {
            reps = atoi(argv[++a]);
            if (reps < 1 || reps > MR_MAX_REPS)
                reps = 15;
        } else {
            fprintf(stderr, "usage: %s [-r REPS] [f32|f16|bf16|q8_0 ...]\n", argv[0]);
            return 2;
        }
    }
    if (!simd_avx2()) {
        printf("# mv_rows: no AVX2 on this CPU: avx2_matvec is not the decode kernel here\n");
        return 0;
    }
    static const char *names[] = { "f32", "f16", "bf16", "q8_0" };
    static const uint32_t types[] = { GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0 };
    static const size_t rbs[] = { 4 * MR_N, 2 * MR_N, 2 * MR_N, 34 * (MR_N / 32) };

    float x[MR_N], xd[MR_N / 32];
    int8_t xq[MR_N];
    for (int i = 0; i < MR_N; i++)
        x[i] = mr_unit();
    quantize_act_q8(x, MR_N, xq, xd);
    const size_t mem_bytes = (size_t)64 << 20;
    uint8_t *big = malloc(mem_bytes);
    float *y = malloc(sizeof(float) * (mem_bytes / rbs[3] + 4));
    float *ta = malloc(sizeof(float) * MR_TRIAD_N), *tb = malloc(sizeof(float) * MR_TRIAD_N),
          *tc = malloc(sizeof(float) * MR_TRIAD_N);
    if (!big || !y || !ta || !tb || !tc)
        return 1;
    for (size_t i = 0; i < MR_TRIAD_N; i++) {
        ta[i] = 0.0f;
        tb[i] = mr_unit();
        tc[i] = mr_unit();
    }
    double ld[3] = { 0 };
    if (getloadavg(ld, 3) < 0)
        ld[0] = -1;
    printf("# mv_rows: one thread, %d elements per row, chunks of %ld bytes, medians of %d, load %.2f\n", MR_N,
           SHARE_CHUNK_BYTES, reps, ld[0]);
    for (int ai = a == argc ? 0 : a; ai < (a == argc ? 4 : argc); ai++) {
        int k = ai;
        if (a != argc)
            for (k = 0; k < 4 && strcmp(argv[ai], names[k]); k++)
                ;
        if (k == 4) {
            fprintf(stderr, "unknown type %s\n", argv[ai]);
            continue;
        }
        const uint32_t t = types[k];
        const size_t rb = rbs[k];
        const int l2_rows = (int)((192 << 10) / rb), mem_rows = (int)(mem_bytes / rb);
        fill_rows(t, big, mem_bytes);
        double tl2[MR_MAX_REPS], tmem[MR_MAX_REPS], ttr[MR_MAX_REPS];
        pass(t, big, rb, l2_rows, x, xq, xd, y, 8);     /* warm-up */
        for (int r = 0; r < reps; r++) {
            tl2[r] = pass(t, big, rb, l2_rows, x, xq, xd, y, 64);
            tmem[r] = pass(t, big, rb, mem_rows, x, xq, xd, y, 1);
            ttr[r] = triad(ta, tb, tc);
        }
        const double gl2 = 64.0 * l2_rows * (double)rb / median(tl2, reps) * 1e-9;
        const double gmem = (double)mem_rows * (double)rb / median(tmem, reps) * 1e-9;
        const double gtr = 3.0 * sizeof(float) * (double)MR_TRIAD_N / median(ttr, reps) * 1e-9;
        printf("%-4s: L2 %6.2f GB/s  memory %6.2f GB/s  triad %6.2f GB/s  memory/triad %.2f  "
               "L2/28 GB/s %.2f\n", names[k], gl2, gmem, gtr, gmem / gtr, gl2 / 28.0);
    }
    free(big);
    free(y);
    free(ta);
    free(tb);
    free(tc);
    return 0;
}

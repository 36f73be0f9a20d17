/* engine_ab.c - prompt and decode speed of one engine build, for comparing
 * two trees (bench/tree_ab.sh builds this file against each tree's engine
 * objects and alternates the two binaries).
 *
 * Owns: timing engine_forward() in-process, after a warm-up, on prompts of
 * the given lengths (one forward of n tokens into a fresh sequence, the
 * last token's logits, as a server's prefill does) and on single-token
 * decode steps after a short prompt; the median of the repetitions. Uses
 * only the engine calls that have stayed the same since the first K-quant
 * kernels (engine_open, engine_seq_*, engine_forward), so an older tree
 * builds it unchanged. Does not own: the alternation, the ratios (the
 * script) or the machine's limits (bench.c).
 *
 *   hyserve-engine-ab -m MODEL [-t THREADS] [-r REPS] [-d STEPS] [-n "2 8 32 ..."]
 * Prints one line per figure: "prompt N TOK_S" and "decode STEPS TOK_S".
 * AB_INIT names the tree's process start-up call (blas_process_init, or
 * blas_choose_core before it was renamed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels/blas.h"
#include "engine_run.h"
#include "median.h"

#ifndef AB_INIT
#define AB_INIT blas_process_init
#endif

#define AB_MAX_LENS 32
#define AB_MAX_REPS 15

int main(int argc, char **argv)
{
    AB_INIT(argv);
    engine_run_args a = { .lens = "2 4 8 16 17 24 32 48 64 128 512", .threads = 2, .reps = 3, .steps = 32 };
    if (!engine_run_parse(argc, argv, &a)) {
        fprintf(stderr, "usage: hyserve-engine-ab -m MODEL [-t THREADS] [-r REPS] [-d STEPS] [-n \"LENS\"]\n");
        return 2;
    }
    const int reps = a.reps, steps = a.steps;
    int lens[AB_MAX_LENS], n_lens = 0, max_len = 128;
    for (const char *p = a.lens; *p && n_lens < AB_MAX_LENS;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        if (v < 1 || v > 8192) {
            fprintf(stderr, "engine_ab: a length must be 1..8192, not %ld\n", v);
            return 2;
        }
        lens[n_lens++] = (int)v;
        max_len = v > max_len ? (int)v : max_len;
        p = end;
    }
    if (!a.model || a.threads < 1 || reps < 1 || reps > AB_MAX_REPS || steps < 1 || steps > 4096 || !n_lens) {
        fprintf(stderr, "engine_ab: need -m MODEL, 1 <= -r <= %d, 1 <= -d <= 4096 and a length\n", AB_MAX_REPS);
        return 2;
    }

    int32_t *tok = NULL;
    float *logits = NULL;
    engine *e = engine_run_open(&a, max_len + steps + 16, max_len + steps + 16, &tok, &logits);
    if (!e)
        return 1;
    int rc = 1;
    if (engine_run(e, tok, 128, 0, logits) < 0 || engine_run(e, tok, 16, 8, logits) < 0)    /* warm-up */
        goto out;
    double t[AB_MAX_REPS];
    for (int l = 0; l < n_lens; l++) {
        for (int r = 0; r < reps; r++)
            if ((t[r] = engine_run(e, tok, lens[l], 0, logits)) < 0)
                goto out;
        printf("prompt %d %.2f\n", lens[l], lens[l] / median(t, reps));
        fflush(stdout);
    }
    for (int r = 0; r < reps; r++)
        if ((t[r] = engine_run(e, tok, 16, steps, logits)) < 0)
            goto out;
    printf("decode %d %.2f\n", steps, steps / median(t, reps));
    rc = 0;
out:
    engine_run_close(e, tok, logits);
    return rc;
}

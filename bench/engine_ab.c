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
#include "median.h"

#ifndef AB_INIT
#define AB_INIT blas_process_init
#endif

#define AB_MAX_LENS 32
#define AB_MAX_REPS 15

/* Seconds for one forward of n tokens into a fresh sequence (its last
 * token's logits), or for `steps` decode steps after n prompt tokens when
 * steps > 0. Negative on an engine error. */
static double run(engine *e, const int32_t *tok, int n, int steps, float *logits)
{
    char err[256];
    int seq = engine_seq_new(e);
    if (seq < 0 || engine_seq_reserve(e, seq, n + steps) != 0) {
        fprintf(stderr, "engine_ab: no sequence for %d tokens\n", n + steps);
        if (seq >= 0)
            engine_seq_free(e, seq);
        return -1;
    }
    double t0 = engine_now_s();
    engine_batch_item it = { .seq = seq, .tokens = tok, .n_tokens = n, .logits = ENGINE_LOGITS_LAST,
                             .out = logits };
    int rc = engine_forward(e, &it, 1, err, sizeof err);
    if (steps > 0) {
        t0 = engine_now_s();
        for (int s = 0; s < steps && rc == 0; s++) {
            it.tokens = tok + n + s;
            it.n_tokens = 1;
            rc = engine_forward(e, &it, 1, err, sizeof err);
        }
    }
    double dt = engine_now_s() - t0;
    engine_seq_free(e, seq);
    if (rc != 0) {
        fprintf(stderr, "engine_ab: %s\n", err);
        return -1;
    }
    return dt;
}

int main(int argc, char **argv)
{
    AB_INIT(argv);
    const char *model = NULL, *lens_arg = "2 4 8 16 17 24 32 48 64 128 512";
    int threads = 2, reps = 3, steps = 32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-d") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            lens_arg = argv[++i];
        else {
            fprintf(stderr, "usage: hyserve-engine-ab -m MODEL [-t THREADS] [-r REPS] [-d STEPS] [-n \"LENS\"]\n");
            return 2;
        }
    }
    int lens[AB_MAX_LENS], n_lens = 0, max_len = 128;
    for (const char *p = lens_arg; *p && n_lens < AB_MAX_LENS;) {
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
    if (!model || threads < 1 || reps < 1 || reps > AB_MAX_REPS || steps < 1 || steps > 4096 || !n_lens) {
        fprintf(stderr, "engine_ab: need -m MODEL, 1 <= -r <= %d, 1 <= -d <= 4096 and a length\n", AB_MAX_REPS);
        return 2;
    }

    engine_params p;
    engine_params_default(&p);
    p.model_path = model;
    p.n_threads = threads;
    p.n_ctx = max_len + steps + 16;
    p.max_seqs = 1;
    char err[512];
    engine *e = engine_open(&p, err, sizeof err);
    if (!e) {
        fprintf(stderr, "engine_ab: %s\n", err);
        return 1;
    }
    const int n_vocab = engine_get_info(e)->n_vocab;
    const int n_tok = max_len + steps + 16;
    int32_t *tok = malloc((size_t)n_tok * sizeof *tok);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    int rc = 1;
    if (!tok || !logits)
        goto out;
    unsigned s = 12345u;
    for (int i = 0; i < n_tok; i++) {       /* ordinary ids, the same in every run */
        s = s * 1103515245u + 12345u;
        tok[i] = (int32_t)((s >> 8) % (unsigned)(n_vocab > 256 ? n_vocab - 256 : n_vocab));
    }
    if (run(e, tok, 128, 0, logits) < 0 || run(e, tok, 16, 8, logits) < 0)    /* warm-up */
        goto out;
    double t[AB_MAX_REPS];
    for (int l = 0; l < n_lens; l++) {
        for (int r = 0; r < reps; r++)
            if ((t[r] = run(e, tok, lens[l], 0, logits)) < 0)
                goto out;
        printf("prompt %d %.2f\n", lens[l], lens[l] / median(t, reps));
        fflush(stdout);
    }
    for (int r = 0; r < reps; r++)
        if ((t[r] = run(e, tok, 16, steps, logits)) < 0)
            goto out;
    printf("decode %d %.2f\n", steps, steps / median(t, reps));
    rc = 0;
out:
    free(tok);
    free(logits);
    engine_close(e);
    return rc;
}

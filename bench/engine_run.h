/* engine_run.h - timing an engine's prompt or decode steps, shared by the
 * A/B programs (engine_ab.c, split_ab.c). Uses only the engine calls that
 * have stayed the same since the first K-quant kernels (engine_seq_*,
 * engine_forward, engine_now_s), so tree_ab.sh can build engine_ab.c
 * against an older tree's engine. */
#ifndef BENCH_ENGINE_RUN_H
#define BENCH_ENGINE_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* Seconds for one forward of n tokens into a fresh sequence (its last
 * token's logits), or for `steps` decode steps after n prompt tokens when
 * steps > 0. Negative on an engine error (printed). */
static double engine_run(engine *e, const int32_t *tok, int n, int steps, float *logits)
{
    char err[256];
    int seq = engine_seq_new(e);
    if (seq < 0 || engine_seq_reserve(e, seq, n + steps) != 0) {
        fprintf(stderr, "bench: no sequence for %d tokens\n", n + steps);
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
        fprintf(stderr, "bench: %s\n", err);
        return -1;
    }
    return dt;
}

/* n ordinary token ids (no special ones at the top of the vocabulary),
 * the same in every run */
static void engine_run_tokens(int32_t *tok, int n, int n_vocab)
{
    unsigned s = 12345u;
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        tok[i] = (int32_t)((s >> 8) % (unsigned)(n_vocab > 256 ? n_vocab - 256 : n_vocab));
    }
}

/* The command line both programs share: -m MODEL, -t THREADS, -r REPS,
 * -d STEPS and, where lens is not NULL, -n "LENS"; false on anything else
 * (the caller prints its usage). The values are checked by the caller. */
typedef struct {
    const char *model, *lens;
    int threads, reps, steps;
} engine_run_args;

static bool engine_run_parse(int argc, char **argv, engine_run_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return false;
        if (!strcmp(argv[i], "-m"))
            a->model = v;
        else if (!strcmp(argv[i], "-t"))
            a->threads = atoi(v);
        else if (!strcmp(argv[i], "-r"))
            a->reps = atoi(v);
        else if (!strcmp(argv[i], "-d"))
            a->steps = atoi(v);
        else if (!strcmp(argv[i], "-n") && a->lens)
            a->lens = v;
        else
            return false;
        i++;
    }
    return true;
}

/* the engine on model with one sequence of up to n_ctx tokens, and room
 * for n_tok token ids and one row of logits; NULL (printed) on error */
static engine *engine_run_open(const engine_run_args *a, int n_ctx, int n_tok, int32_t **tok, float **logits)
{
    engine_params p;
    engine_params_default(&p);
    p.model_path = a->model;
    p.n_threads = a->threads;
    p.n_ctx = n_ctx;
    p.max_seqs = 1;
    char err[512];
    engine *e = engine_open(&p, err, sizeof err);
    if (!e) {
        fprintf(stderr, "bench: %s\n", err);
        return NULL;
    }
    const int n_vocab = engine_get_info(e)->n_vocab;
    *tok = malloc((size_t)n_tok * sizeof **tok);
    *logits = malloc((size_t)n_vocab * sizeof **logits);
    if (!*tok || !*logits) {
        fprintf(stderr, "bench: out of memory\n");
        free(*tok);
        free(*logits);
        engine_close(e);
        return NULL;
    }
    engine_run_tokens(*tok, n_tok, n_vocab);
    return e;
}

/* what engine_run_open gave */
static void engine_run_close(engine *e, int32_t *tok, float *logits)
{
    free(tok);
    free(logits);
    engine_close(e);
}

#endif

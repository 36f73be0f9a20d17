/* verify_ab.c - a speculative verify step's cost (issue 42): one step of
 * k tokens with engine_batch_item.exact (every row the bits of a one-token
 * step, the weights read once), the same step without exact (the
 * multi-token kernels), k one-token steps, and one one-token step,
 * alternating in one process after a prompt, medians of the repetitions;
 * and the two rollbacks' costs: the exact step with a checkpoint after
 * every row (engine_batch_item.snaps: paid on every step), and the
 * re-feed a rejection half way costs (a snapshot before the step, then
 * an exact step of the k/2 accepted tokens: paid per rejection).
 * Each measured step is rolled back (engine_seq_truncate to the prompt
 * with a snapshot taken there) so every repetition starts from the same
 * state; the truncation is outside the timing.
 *
 * usage: hyserve-verify-ab -m MODEL [-d K (8)] [-n PROMPT (256)] [-r REPS (9)] [-t THREADS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_run.h"
#include "median.h"

enum { FORM_EXACT, FORM_CKPT, FORM_REFEED, FORM_PLAIN, FORM_STEPS, FORM_ONE, N_FORMS };
static const char *form_name[N_FORMS] = { "exact k-token step", "  + k-1 checkpoints", "re-feed k/2 (+ snap)",
                                          "plain k-token step", "k one-token steps", "one one-token step" };

int main(int argc, char **argv)
{
    engine_run_args a = { .lens = "256", .reps = 9, .steps = 8 };
    const bool ok = engine_run_parse(argc, argv, &a);
    const int k = a.steps, n_prompt = atoi(a.lens), reps = a.reps;
    if (!ok || !a.model || k < 1 || k > 64 || n_prompt < 1 || reps < 1 || reps > 99) {
        fprintf(stderr, "usage: %s -m MODEL [-d K 1..64] [-n PROMPT] [-r 1..99] [-t THREADS]\n", argv[0]);
        return 2;
    }
    engine_process_init(argv);
    char err[512];
    int32_t *tok;
    float *warm;
    /* a context far past what the step uses: the budget (one full
     * context) then has room for the snapshots */
    engine *e = engine_run_open(&a, n_prompt + k + 16384, n_prompt + k, &tok, &warm);
    if (!e)
        return 1;
    if (engine_run(e, tok, 16, 1, warm) < 0)       /* the kernels' first touch, untimed */
        return 1;
    const engine_info *info = engine_get_info(e);
    float *out = malloc(sizeof(float) * (size_t)k * info->n_vocab);
    double *t[N_FORMS];
    for (int f = 0; f < N_FORMS; f++)
        t[f] = malloc(sizeof(double) * (size_t)reps);
    const int seq = engine_seq_new(e);
    if (!out || !t[N_FORMS - 1] || seq < 0 || engine_seq_reserve(e, seq, n_prompt + k) != 0) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    engine_batch_item it = { .seq = seq, .tokens = tok, .n_tokens = n_prompt };
    if (engine_forward(e, &it, 1, err, sizeof err) != 0) {
        fprintf(stderr, "prompt: %s\n", err);
        return 1;
    }
    engine_snap *at_prompt = engine_snap_bytes(e) > 0 ? engine_snap_take(e, seq) : NULL;
    if (engine_snap_bytes(e) > 0 && !at_prompt) {
        fprintf(stderr, "no room for a snapshot\n");
        return 1;
    }
    engine_snap *ck[64] = { 0 };
    for (int j = 0; at_prompt && j < k - 1; j++)
        if (!(ck[j] = engine_snap_new(e))) {
            fprintf(stderr, "no room for %d checkpoints\n", k - 1);
            return 1;
        }
    for (int r = 0; r < reps + 1; r++)             /* the first round warms up, untimed */
        for (int f = 0; f < N_FORMS; f++) {
            const double t0 = engine_now_s();
            int rc = 0;
            if (f == FORM_STEPS || f == FORM_ONE) {
                for (int q = 0; q < (f == FORM_ONE ? 1 : k) && rc == 0; q++) {
                    it = (engine_batch_item){ .seq = seq, .tokens = tok + n_prompt + q, .n_tokens = 1,
                                              .logits = ENGINE_LOGITS_LAST, .out = out + (size_t)q * info->n_vocab };
                    rc = engine_forward(e, &it, 1, err, sizeof err);
                }
            } else if (f == FORM_REFEED) {
                engine_snap *sn = at_prompt ? engine_snap_take(e, seq) : NULL;
                rc = at_prompt && !sn;
                it = (engine_batch_item){ .seq = seq, .tokens = tok + n_prompt, .n_tokens = k / 2 > 0 ? k / 2 : 1,
                                          .logits = ENGINE_LOGITS_ALL, .out = out, .exact = 1 };
                rc = rc ? rc : engine_forward(e, &it, 1, err, sizeof err);
                if (sn)
                    engine_snap_free(e, sn);
            } else {
                it = (engine_batch_item){ .seq = seq, .tokens = tok + n_prompt, .n_tokens = k,
                                          .logits = ENGINE_LOGITS_ALL, .out = out, .exact = f != FORM_PLAIN,
                                          .snaps = f == FORM_CKPT && at_prompt ? ck : NULL };
                rc = engine_forward(e, &it, 1, err, sizeof err);
            }
            const double dt = engine_now_s() - t0;
            if (rc != 0 || engine_seq_truncate(e, seq, n_prompt, at_prompt) != 0) {
                fprintf(stderr, "step: %s\n", rc ? err : "truncate failed");
                return 1;
            }
            if (r > 0)
                t[f][r - 1] = dt;
        }
    engine_kernels kn;
    engine_get_kernels(&kn);
    printf("model %s (%s, %s), %d threads, kernels %s; prompt %d, k %d, medians of %d, alternating\n", info->name,
           info->arch, info->weights_dtype, kn.threads, kn.simd, n_prompt, k, reps);
    const double one = median(t[FORM_ONE], reps);
    for (int f = 0; f < N_FORMS; f++) {
        const double m = median(t[f], reps);
        printf("  %-20s %8.2f ms  %5.2f x one token\n", form_name[f], 1e3 * m, m / one);
    }
    if (at_prompt)
        engine_snap_free(e, at_prompt);
    for (int j = 0; j < k - 1; j++)
        if (ck[j])
            engine_snap_free(e, ck[j]);
    engine_seq_free(e, seq);
    for (int f = 0; f < N_FORMS; f++)
        free(t[f]);
    free(out);
    engine_run_close(e, tok, warm);
    return 0;
}

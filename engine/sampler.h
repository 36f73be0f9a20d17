/* sampler.h - turning logits into the next token, seeded per request.
 *
 * Owns: repetition penalty, temperature, top-k, top-p, min-p, greedy, and
 * a per-request PRNG so the same seed gives the same tokens.
 * Does not own: stop strings (server), logits (engine).
 */
#ifndef HYSERVE_SAMPLER_H
#define HYSERVE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sampler_params {
    float temperature;          /* <= 0 or greedy: argmax */
    int top_k;                  /* <= 0: off */
    float top_p;                /* >= 1: off */
    float min_p;                /* <= 0: off */
    float repetition_penalty;   /* 1: off (CTRL-style: divide positive logits, multiply negative) */
    bool greedy;
    uint64_t seed;
} sampler_params;

typedef struct sampler sampler;

void sampler_params_default(sampler_params *p);   /* greedy off, temp 1, everything else off */
sampler *sampler_new(const sampler_params *p, int n_vocab);
void sampler_free(sampler *s);
/* Picks the next token. logits is scratch (modified). history: tokens the
 * penalty applies to. logprob (may be NULL) receives log softmax of the
 * chosen token under the final distribution. */
int32_t sampler_sample(sampler *s, float *logits, const int32_t *history,
                       int n_history, float *logprob);

#endif

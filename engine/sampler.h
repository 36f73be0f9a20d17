/* sampler.h - turning logits into the next token, seeded per request.
 *
 * Owns: logit bias, repetition / frequency / presence penalties,
 * temperature, top-k, top-p, typical-p, min-p, greedy, and
 * a per-request PRNG so the same seed gives the same tokens.
 * Does not own: stop strings (server), logits (engine).
 */
#ifndef HYSERVE_SAMPLER_H
#define HYSERVE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

/* One logit bias: added to token id's logit before anything else
 * (-INFINITY bans the token). */
typedef struct sampler_bias {
    int32_t id;
    float bias;
} sampler_bias;

typedef struct sampler_params {
    float temperature;          /* <= 0 or greedy: argmax */
    int top_k;                  /* <= 0: off */
    float top_p;                /* >= 1: off */
    float min_p;                /* <= 0: off */
    float repetition_penalty;   /* 1: off (CTRL-style: divide positive logits, multiply negative) */
    float frequency_penalty;    /* 0: off; OpenAI: l -= count * f over the tokens this sampler drew */
    float presence_penalty;     /* 0: off; OpenAI: l -= p once a token has been drawn */
    float typical_p;            /* >= 1: off; locally typical sampling (Meister et al. 2022) */
    const sampler_bias *bias;   /* [n_bias] borrowed; sampler_new copies it */
    int n_bias;
    bool greedy;
    uint64_t seed;
} sampler_params;

typedef struct sampler sampler;

void sampler_params_default(sampler_params *p);   /* greedy off, temp 1, everything else off */
sampler *sampler_new(const sampler_params *p, int n_vocab);
void sampler_free(sampler *s);
/* Picks the next token and counts it as drawn (the frequency and presence
 * penalties apply to the tokens this sampler returned, not the prompt). logits is scratch (modified). history: tokens the
 * penalty applies to. logprob (may be NULL) receives log softmax of the
 * chosen token under the final distribution. */
int32_t sampler_sample(sampler *s, float *logits, const int32_t *history,
                       int n_history, float *logprob);

#endif

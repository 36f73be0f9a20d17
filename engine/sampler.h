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

/* The most likely tokens of one distribution, best first (ties: the
 * smaller id), with their log-probabilities. Caller storage. */
#define SAMPLER_MAX_TOP 20
typedef struct sampler_top {
    int n;                          /* entries used, <= SAMPLER_MAX_TOP */
    int32_t id[SAMPLER_MAX_TOP];
    float logprob[SAMPLER_MAX_TOP];
} sampler_top;

void sampler_params_default(sampler_params *p);   /* greedy off, temp 1, everything else off */
sampler *sampler_new(const sampler_params *p, int n_vocab);
void sampler_free(sampler *s);
/* The seed of choice i (n > 1, best_of) of a request seeded seed: seed
 * itself for choice 0 (so n = 1 is unchanged), else splitmix64's output
 * for state seed at step i: z = seed + i * 0x9e3779b97f4a7c15, then
 * z ^= z >> 30, z *= 0xbf58476d1ce4e5b9, z ^= z >> 27,
 * z *= 0x94d049bb133111eb, z ^= z >> 31 (mod 2^64). ref: docs/serving.md 3.1. */
uint64_t sampler_choice_seed(uint64_t seed, int i);
/* The index of x[0..n)'s largest value, the first of equals (greedy). */
int32_t sampler_argmax(const float *x, int n);

/* Picks the next token and counts it as drawn (the frequency and presence
 * penalties apply to the tokens this sampler returned, not the prompt). logits is scratch (modified). history: tokens the
 * penalty applies to. logprob (may be NULL) receives log softmax of the
 * chosen token under the final distribution. */
int32_t sampler_sample(sampler *s, float *logits, const int32_t *history,
                       int n_history, float *logprob);

/* After sampler_sample: the n_top (clamped to 0..SAMPLER_MAX_TOP) most
 * likely tokens of the distribution that call drew from, the same one its
 * logprob is of: after bias, penalties, temperature and the top-k / top-p
 * / typical-p / min-p cuts, renormalised (tokens cut away have probability
 * 0 and are never listed, so out->n may be below n_top). A greedy call's
 * distribution is log softmax at T = 1 of the biased, penalised logits,
 * which sampler_sample left in logits. Allocates nothing. */
void sampler_last_top(sampler *s, const float *logits, int n_top, sampler_top *out);

/* Stateless: log softmax(logits / temp) of token tok over all n_vocab
 * entries (-inf for a token out of range), and with out the n_top most
 * likely tokens of the same distribution. temp <= 0 counts as 1. */
float sampler_logprobs(const float *logits, int n_vocab, float temp, int32_t tok, int n_top,
                       sampler_top *out);

#endif

/* logprobs.h - the log-probability blocks of the OpenAI and TGI answers.
 *
 * Owns: the list of tokens with their logprobs and top alternatives that a
 * response collects, and their JSON shapes: OpenAI chat's
 * choices[].logprobs.content[] ({token, logprob, bytes, top_logprobs}),
 * OpenAI completions' {tokens, token_logprobs, top_logprobs, text_offset},
 * TGI's token objects ({id, text, logprob, special}) and top_tokens.
 * Does not own: which distribution the numbers are of (engine/sampler.c,
 * runtime/sched_step.c) or when a chunk is sent (stream.c).
 * ref: docs/serving.md 2.2, 2.3 (TGI details, top_tokens, prefill), 3.3
 * (OpenAI logprobs); OpenAI's API reference for the shapes.
 */
#ifndef HYSERVE_LOGPROBS_H
#define HYSERVE_LOGPROBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine.h"
#include "sampler.h"

/* One token with its logprob (NaN: none, written as null, as for the
 * first prompt token) and its most likely alternatives. */
typedef struct lp_token {
    int32_t id;
    float logprob;
    bool special;               /* an end-of-generation token */
    sampler_top top;
} lp_token;

/* A growable list. Owned by its response (collector or stream). */
typedef struct lp_list {
    lp_token *v;                /* [n] */
    int n, cap;
} lp_list;

/* Append one token (top may be NULL). Returns 0 or -1 (out of memory). */
int lp_list_push(lp_list *l, int32_t id, float logprob, bool special, const sampler_top *top);
void lp_list_free(lp_list *l);

/* OpenAI chat: {"content": [...], "refusal": null} for t[0..n),
 * end-of-generation tokens left out (they are not in the content). */
cJSON *lp_oai_chat(const engine *e, const lp_token *t, int n);
/* OpenAI completions: {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"} for t[0..n), offsets counted in bytes from offset0. With
 * with_top false, top_logprobs is null (logprobs: 0). *offset_end (may be
 * NULL) receives the offset after the last token. */
cJSON *lp_oai_completion(const engine *e, const lp_token *t, int n, bool with_top, size_t offset0,
                         size_t *offset_end);
/* TGI: {"id", "text", "logprob", "special"} of one token (text: the token's
 * own bytes, made valid UTF-8). */
cJSON *lp_tgi_token(const engine *e, int32_t id, float logprob, bool special);
/* TGI: the array of a token's top tokens. */
cJSON *lp_tgi_top(const engine *e, const sampler_top *top);

#endif

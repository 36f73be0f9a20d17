/* generate.h - the generation flow of /generate, /generate_stream, POST /
 * (TGI compat), /v1/completions and /v1/chat/completions, written once.
 *
 * Owns: read and check the body (json.c) -> chat template -> tokenize and
 * fit the context -> submit to the scheduler -> wait for admission ->
 * stream (stream.c) or collect and answer; several sequences in one
 * request (prompt arrays, n, best_of); the answers' TGI and OpenAI shapes.
 * Does not own: the route table (routes.c), field rules (json.c), error
 * statuses (errors.c), SSE (stream.c).
 * ref: docs/serving.md 2 (TGI), 3 (OpenAI).
 */
#ifndef HYSERVE_GENERATE_H
#define HYSERVE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "http.h"

enum gen_mode {
    GEN_BODY = 0,               /* stream when the body says "stream": true */
    GEN_STREAM = 1,             /* /generate_stream */
    GEN_COMPAT = 2,             /* POST /: like /generate, the answer is an array of one */
};

/* Serve one generation request: api an enum api_kind (json.h), mode an
 * enum gen_mode. Returns 0 when a response was queued, -1 to close the
 * connection. */
/* Another API's route over the chat flow (responses.c, anthropic.c):
 * chat (taken) becomes the request's body, x (heap, taken) translates
 * every answer, then generate_route as POST /v1/chat/completions. */
int generate_translated(http_req *hr, cJSON *chat, http_xlate *x);
/* The number of prompt tokens the chat body chat (taken) renders to, as
 * POST /v1/chat/completions would feed it to the model; -1 when an error
 * was answered (its code in *rc). */
int generate_count_tokens(http_req *hr, cJSON *chat, int *rc);
int generate_route(http_req *hr, int api, int mode);

/* POST /v1/completions/render and /v1/chat/completions/render (vLLM's,
 * which llm-d's endpoint picker calls for precise prefix routing): the
 * token ids a generation of the same body would prefill, through the same
 * steps (parse and checks, chat template with tools, tokenizing):
 * completions [{"token_ids": [...]}] one a prompt, chat {"token_ids":
 * [...]}. api is API_OAI_COMPLETION or API_OAI_CHAT. */
int generate_render(http_req *hr, int api);

/* Encode text with the model's BOS rule, control tokens parsed except in
 * the data spans (n_data pairs [start, end) of a rendered chat prompt: the
 * messages' content; none for a raw prompt, whose writer formats it).
 * Returns the count (tokens in *out, heap) or -1. */
int generate_tokenize(server *srv, const char *text, const size_t *data, int n_data, int32_t **out);

#endif

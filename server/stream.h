/* stream.h - reading a request's scheduler events on an HTTP thread, and
 * Server-Sent Events.
 *
 * Owns: waiting for the next event while watching the client socket (a
 * client that goes away is cancelled at once), collecting a whole
 * generation for non-streaming responses, the SSE response (TGI events,
 * OpenAI chunks, "data: [DONE]", ": ping" keep-alive comments, error
 * events), flushing every event.
 * Does not own: admission (done before a stream starts, so a stream only
 * ever starts with 200), JSON field rules (json.c).
 * ref: docs/serving.md 2.3, 3.2 and 2.4.
 */
#ifndef HYSERVE_STREAM_H
#define HYSERVE_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "http.h"
#include "json.h"
#include "logprobs.h"
#include "scheduler.h"

/* Wait up to timeout_ms for r's next event while watching hr's socket.
 * Returns 1 with *ev, 0 on timeout, -1 when the client has gone (r is
 * then cancelled). */
int stream_next_event(http_req *hr, sched_req *r, sched_event *ev, int timeout_ms);

/* One generated token of a collected generation. */
typedef struct gen_token {
    int32_t id;
    float logprob;
    bool special;
    size_t off, len;            /* its released text inside gen_result.text */
} gen_token;

/* A whole generation (non-streaming). Owned by the route handler. */
typedef struct gen_result {
    char *text;                 /* [len] + NUL, generated text */
    size_t len, cap;
    gen_token *toks;            /* [n_toks] */
    int n_toks, cap_toks;
    int finish;                 /* enum sched_finish; NONE when it failed */
    int stop_index;             /* finish STOP: which stop string matched (request's order) */
    int error;                  /* enum sched_status; 0 on success */
    char message[256];          /* error message */
    double t_last;              /* when the previous token was sampled (ITL metric) */
    lp_list lp;                 /* the generated tokens with their top alternatives */
    lp_list prompt_lp;          /* prompt logprobs (prompt_logprobs), positions 1.. */
} gen_result;

/* Read events until the generation ends. Returns 0 (see res->error), or
 * -1 when the client went away. */
int stream_collect(http_req *hr, sched_req *r, gen_result *res);
void gen_result_free(gen_result *res);

/* Send 200 with an SSE body for an admitted request. Takes ownership of r
 * and of *g (moved out; the caller's copy is zeroed). n_prompt: prompt
 * tokens (TGI input_length, usage). Returns 0, or -1 (then r and g were
 * released and the connection should be closed). prompt: its tokens
 * (copied for a completions echo). */
int stream_start(http_req *hr, sched_req *r, gen_request *g, const int32_t *prompt, int n_prompt);

/* OpenAI n > 1 (at most JSON_MAX_BATCH): one SSE body interleaving the
 * chunks of the admitted requests r[0..n), chunk choices[0].index k for
 * r[k], one usage chunk (the prompt counted once) and one [DONE] when all
 * have ended. Takes ownership of r[0..n) and *g, as stream_start. */
int stream_start_n(http_req *hr, sched_req **r, int n, gen_request *g, const int32_t *prompt, int n_prompt);

/* finish_reason for the OpenAI routes ("stop" or "length"). */
const char *stream_oai_finish(int finish);

#endif

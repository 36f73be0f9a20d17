/* errors.h - the one mapping from error kinds (validation, overload,
 * draining, ...) to HTTP statuses and JSON envelopes: TGI's shape, and
 * OpenAI's on /v1/ routes; and the readiness gate every model route
 * passes first.
 * Owns: statuses, envelopes, Retry-After and Allow headers of errors, the
 * request's failure label for the log and metrics.
 * Does not own: which route failed or why (routes.c, generate.c), the
 * JSON field rules (json.c).
 * ref: docs/serving.md 4.
 */
#ifndef HYSERVE_ERRORS_H
#define HYSERVE_ERRORS_H

#include <stdbool.h>

#include "http.h"

enum route_err {
    ERR_BAD_JSON = 1,       /* 400 */
    ERR_VALIDATION,         /* 422 (OpenAI 400) */
    ERR_CONTEXT,            /* 422 (OpenAI 400, code context_length_exceeded) */
    ERR_TEMPLATE,           /* 422 (OpenAI 400) */
    ERR_NOT_FOUND,          /* 404 */
    ERR_METHOD,             /* 405 */
    ERR_TOO_LARGE,          /* 413 */
    ERR_HEAD_TOO_LARGE,     /* 431 */
    ERR_OVERLOADED,         /* 429 + Retry-After */
    ERR_LOADING,            /* 503 + Retry-After */
    ERR_DRAINING,           /* 503 + Retry-After */
    ERR_GENERATION,         /* 424: the engine failed before anything was sent */
    ERR_CANCELLED,          /* 499: cancelled by DELETE /requests/{id}; not retried by clients */
    ERR_MODEL,              /* 404, OpenAI code model_not_found: a model this server does not serve */
    ERR_INTERNAL,           /* 500 */
    ERR_NOT_IMPLEMENTED,    /* 501: a transfer coding other than chunked */
};

/* Extra facts some errors carry. */
typedef struct err_extra {
    const char *param;          /* OpenAI "param" */
    int n_prompt, max_total;    /* context overflow numbers, when > 0 */
    const char *allow;          /* 405: Allow header */
} err_extra;

/* Queue the error response for kind on hr's route (x: NULL or extra
 * facts). Returns what http_send_json gave. */
int errors_send(http_req *hr, int kind, const char *msg, const err_extra *x);
/* errors_send without extra facts. */
int errors_reply(http_req *hr, int kind, const char *msg);

/* True when the model is loaded and the server is not draining; else a
 * 503 (500 when the model failed to load) was sent. */
bool errors_ready(http_req *hr);

/* The error kind of a json_parse_* / json_check_gen status: not JSON 400,
 * out of memory 500, a model this server does not serve 404, anything
 * else the request's fields (422). */
int errors_of_json(int jrc);
/* The kind of a scheduler status that arrived before anything was sent. */
int errors_of_sched(int status);

#endif

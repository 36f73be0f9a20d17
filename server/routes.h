/* routes.h - the {method, path, handler} table and error statuses.
 *
 * Owns: which handler serves which route, 404/405, and the one mapping
 * from error kinds (validation, overload, draining, ...) to HTTP statuses
 * and JSON envelopes (TGI shape, OpenAI shape on /v1/ routes).
 * Does not own: libmicrohttpd (http.c), JSON field rules (json.c).
 * ref: docs/serving.md 1 and 4.
 */
#ifndef HYSERVE_ROUTES_H
#define HYSERVE_ROUTES_H

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
};

/* Serve a complete request (body collected, or refused early by http.c:
 * too large, or no memory for the body); serve.c hands it to http_start
 * as the request handler. Returns 0 when a response was queued, -1 to
 * close the connection. */
int routes_dispatch(http_req *hr);

/* Queue the error response for kind on hr's route. */
int routes_error(http_req *hr, int kind, const char *msg);

#endif

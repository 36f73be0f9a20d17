/* routes.h - the {method, path, handler} table.
 *
 * Owns: which handler serves which route, 404/405, the API key check and
 * CORS preflights before any handler, and the small handlers.
 * Does not own: libmicrohttpd (http.c), the generation flow (generate.c),
 * error statuses and envelopes (errors.c), JSON field rules (json.c).
 * ref: docs/serving.md 1.
 */
#ifndef HYSERVE_ROUTES_H
#define HYSERVE_ROUTES_H

#include "http.h"

/* Serve a complete request (body collected, or refused early by http.c:
 * too large, no memory for the body, or its framing refused); serve.c hands it to http_start
 * as the request handler. Returns 0 when a response was queued, -1 to
 * close the connection. */
int routes_dispatch(http_req *hr);
/* The checks on the headers of a request with a body, before the body is
 * read (http_hooks.head): with API keys, a keyed route without a valid
 * key gets its 401 now. 1 to read the body, else as routes_dispatch. */
int routes_head(http_req *hr);

#endif

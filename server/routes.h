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
 * too large, or no memory for the body); serve.c hands it to http_start
 * as the request handler. Returns 0 when a response was queued, -1 to
 * close the connection. */
int routes_dispatch(http_req *hr);

#endif

/* cors.h - Cross-Origin Resource Sharing, off unless --cors-origin is set.
 *
 * Owns: which request origins may read responses (--cors-origin ORIGIN,
 * repeatable, or "*"), the Access-Control-* headers every response of an
 * allowed origin carries (SSE streams included), and the answer to a
 * preflight OPTIONS request.
 * Does not own: the route table (routes.c tells it which methods a path
 * allows) or authentication (a preflight carries no credentials, so it is
 * answered before the API key check, and says nothing but the rules).
 * ref: the Fetch standard's CORS protocol; docs/serving.md 11.
 */
#ifndef HYSERVE_CORS_H
#define HYSERVE_CORS_H

#include <stdbool.h>

#include "http.h"

/* True when --cors-origin was given. */
bool cors_enabled(const server *srv);
/* Add Access-Control-Allow-Origin (and Vary, Expose-Headers) when the
 * request's Origin is allowed. serve.c gives it to http_start as the
 * add_headers hook, so every response carries them. */
void cors_add_headers(http_req *hr, struct MHD_Response *resp);
/* Answer a preflight OPTIONS on a known path whose methods are allow
 * ("GET, POST"): 204 with the allowed methods and headers. Returns 0 or -1. */
int cors_preflight(http_req *hr, const char *allow);

#endif

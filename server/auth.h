/* auth.h - API keys: who may use the server.
 *
 * Owns: the key set (from --api-key, repeatable, HYSERVE_API_KEY and
 * --api-key-file), the check of an Authorization header against it, and
 * which routes are open without a key.
 * Does not own: answering (routes.c sends the 401), or keeping the keys out
 * of logs (nothing logs headers; keys are never printed).
 *
 * Deny by default: once one key exists every route needs one, except the
 * probes /health, /live and /ready; --metrics-public opens /metrics and
 * /stats too, for a trusted scraper. A client sends "Authorization: Bearer
 * KEY" (as OpenAI's clients do); the comparison takes the same time
 * whatever the bytes of the key it is given.
 */
#ifndef HYSERVE_AUTH_H
#define HYSERVE_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"

#define AUTH_MAX_KEYS 64
#define AUTH_MAX_KEY_BYTES 512

/* Owned by the server; immutable once loaded (any thread reads it). */
typedef struct auth_keys {
    int n;                                  /* 0: authentication is off */
    char key[AUTH_MAX_KEYS][AUTH_MAX_KEY_BYTES + 1];
    size_t len[AUTH_MAX_KEYS];
} auth_keys;

/* Fill k from c->api_keys (newline-separated) and the lines of
 * c->api_key_file (blank lines and '#' comments skipped). A key is 1 to
 * AUTH_MAX_KEY_BYTES printable ASCII characters without spaces. Returns 0,
 * or -1 with one line in err (which never quotes a key). */
int auth_load(const server_config *c, auth_keys *k, char *err, size_t errlen);

/* The key an Authorization header value carries: 1 + its index in k, or 0
 * when the header is absent, not "Bearer KEY", or names no key. Every key
 * is compared in full, in time that depends only on the stored keys. */
int auth_check(const auth_keys *k, const char *authorization);
/* The same for a bare key (Anthropic's x-api-key header), spaces around
 * it dropped. */
int auth_check_key(const auth_keys *k, const char *key);

/* Whether a request is served without a key: the probes; GET of the
 * dashboard's embedded files (web.h: "/", "/web/NAME"), not POST /; /metrics
 * and /stats with metrics_public. */
bool auth_open_path(const char *method, const char *path, bool metrics_public);

#endif

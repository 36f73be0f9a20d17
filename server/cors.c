/* cors.c - Cross-Origin Resource Sharing (see cors.h).
 *
 * An origin is allowed when it equals one --cors-origin value byte for
 * byte (scheme, host and port, as browsers send Origin), or when "*" is
 * configured; then the response says "*" and browsers send no cookies,
 * which this server never reads anyway (API keys travel in Authorization,
 * which a page adds itself).
 */
#include <string.h>

#include <microhttpd.h>

#include "config.h"
#include "cors.h"

/* Headers a page may send: the API key, JSON bodies, request ids, session affinity. */
#define CORS_ALLOW_HEADERS "Authorization, Content-Type, X-Request-Id, X-Session-Id"
/* Response headers a page may read beyond the basic ones. */
#define CORS_EXPOSE_HEADERS                                                                              \
    "X-Request-Id, X-Hyserve-Replica, Retry-After, x-prompt-tokens, x-generated-tokens, x-queue-time, " \
    "x-inference-time, x-time-per-token, x-total-time, x-cached-tokens, x-cache-bytes"

bool cors_enabled(const server *srv)
{
    return srv->cfg && srv->cfg->cors_origins[0];
}

/* The Access-Control-Allow-Origin value for hr, or NULL. */
static const char *allowed_origin(http_req *hr)
{
    if (!cors_enabled(hr->srv))
        return NULL;
    const char *origin = http_header(hr, "Origin");
    const char *list = hr->srv->cfg->cors_origins;
    for (const char *p = list; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (n == 1 && p[0] == '*')
            return "*";
        if (origin && strlen(origin) == n && !memcmp(origin, p, n))
            return origin;
        p += n + (nl ? 1 : 0);
    }
    return NULL;
}

void cors_add_headers(http_req *hr, struct MHD_Response *resp)
{
    const char *o = allowed_origin(hr);
    if (!o)
        return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", o);
    if (strcmp(o, "*"))
        MHD_add_response_header(resp, "Vary", "Origin");   /* the answer depends on who asks */
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS);
}

int cors_preflight(http_req *hr, const char *allow)
{
    const char *const hdrs[] = {"Access-Control-Allow-Methods", allow, "Access-Control-Allow-Headers",
                                CORS_ALLOW_HEADERS, "Access-Control-Max-Age", "600", NULL};
    /* X-Request-Id and the Allow-Origin above (http.c's common headers),
     * the rules only for an allowed origin */
    return http_send(hr, 204, NULL, "", 0, allowed_origin(hr) ? hdrs : NULL);
}

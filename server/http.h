/* http.h - libmicrohttpd glue.
 *
 * Owns: the daemon (one thread per connection, so a handler may block while
 * its request generates), body collection with the size limit, the
 * body framing checks of RFC 9112 6.3 on the head (400/501 and close),
 * the headers-only checks before a body is read (http_hooks.head), request
 * ids, the per-request state and its completion (one log line and the
 * metrics record per request), response helpers that always add
 * X-Request-Id and X-Hyserve-Replica (and Connection: close while
 * draining), and detecting that a client went away.
 * Does not own: routing (routes.c), JSON shapes (json.c), SSE (stream.c).
 * Calls nothing above it: the request handler and the extra headers
 * (routes.c, cors.c) come from serve.c at start, as http_hooks.
 */
#ifndef HYSERVE_HTTP_H
#define HYSERVE_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "server.h"

struct MHD_Connection;
struct MHD_Response;

struct http_req;

/* A route that answers in another API's shape over the chat flow
 * (responses.c, anthropic.c): set on the request before the flow runs,
 * it rewrites every JSON answer sent and every event of a chat stream.
 * Freed with the request (state by free_state). */
typedef struct http_xlate {
    /* The JSON answer of status (takes obj): what to send instead, NULL
     * for a 500. */
    cJSON *(*body)(struct http_req *hr, int status, cJSON *obj);
    /* One event of a chat stream: a chunk or an error object, NULL for
     * the end ([DONE]). Appends its own SSE frames to *out. 0 or -1. */
    int (*event)(struct http_req *hr, const cJSON *obj, char **out, size_t *n, size_t *cap);
    void (*free_state)(void *state);
    void *state;
} http_xlate;

/* One HTTP request. Owned by its connection thread; freed when both the
 * request is complete and any streaming response is done (refs). */
typedef struct http_req {
    server *srv;
    struct MHD_Connection *conn;
    int refs;                   /* request + streaming response; same thread, no lock */
    char id[80];                /* X-Request-Id (client's, if sane) */
    bool metrics_port;          /* arrived on the --metrics-port listener */
    char gateway[512];          /* the inference gateway's x-llm-d-* headers, "name=value" pairs
                                   separated by spaces (values sanitized and cut), "" without */
    int key_id;                 /* 1 + index of the API key the request carried; 0: none (or keys off) */
    struct guard_conn *gconn;   /* the connection's deadline record (guard.h), or NULL */
    char method[16];
    char path[256];
    double t_start;             /* monotonic seconds */
    char *body;                 /* [n_body] + NUL */
    size_t n_body, cap_body;
    bool body_too_large;
    bool head_too_large;        /* request line + headers past --max-header-bytes: 431 */
    bool body_oom;              /* no memory for the body: the rest is read and dropped, then a 500 */
    bool body_done;
    bool body_unread;           /* the head announced a body not read yet (an answer now closes) */
    int framing;                /* HTTP_FRAMING_*: the head's body framing is ambiguous or unsupported */
    bool close_conn;            /* answer with Connection: close (libmicrohttpd then closes) */
    int status;                 /* status sent, 0 before */
    bool inflight;              /* counted in srv->n_inflight */
    /* for the log line and metrics, filled by handlers */
    bool generation;
    int n_prompt, n_gen;
    double queue_ms, ttft_ms;   /* < 0: n/a */
    uint64_t cache_bytes;
    const char *finish;         /* static string or NULL */
    const char *failure;        /* static string or NULL */
    char *log_prompt;           /* prompt text when --log-prompts; heap */
    http_xlate *xlate;          /* NULL, or the answer's translation (heap, freed with the request) */
    struct park_co *co;         /* the handler's coroutine while it waits (park.h), or NULL */
    bool closing;               /* the connection closed under a waiting handler: it ends as if the client left */
} http_req;

/* Body framing faults of a request head (RFC 9112 6.3), found before the
 * body is read; each is answered and the connection closed, so nothing
 * after it on the connection is parsed as a request. */
enum {
    HTTP_FRAMING_OK = 0,
    HTTP_FRAMING_CL_DIFFER,     /* Content-Length repeated with different values: 400 */
    HTTP_FRAMING_TE_CL,         /* Transfer-Encoding and Content-Length together: 400 */
    HTTP_FRAMING_TE_CODING,     /* a Transfer-Encoding other than exactly "chunked": 501 */
};

/* What the daemon calls, given by serve.c (http.c calls no layer above
 * it). handle: a complete request (body collected, or refused early:
 * head_too_large, body_too_large, body_oom, framing); queue a response and
 * return 0, or -1 to close the connection. head: NULL, or the checks on
 * the headers of a request that announced a body, before any of it is
 * read (the API key): 1 to go on reading it, else what handle returns
 * (a response queued: the body is never read nor 100 Continue sent).
 * add_headers: NULL, or more headers on every response (CORS), after
 * X-Request-Id. */
typedef struct http_hooks {
    int (*handle)(http_req *hr);
    int (*head)(http_req *hr);
    void (*add_headers)(http_req *hr, struct MHD_Response *resp);
} http_hooks;

/* The HTTP threads: each an epoll loop over its share of the
 * connections (none is held by a connection or a stream). */
#define HTTP_POOL_THREADS 4
/* File descriptors kept for everything but client connections (model
 * file, logs, eventfds of queued requests, the listeners). */
#define HTTP_FD_RESERVE 64u
/* --max-connections when not given: the fd limit less the reserve, at
 * most this. */
#define HTTP_MAX_CONNECTIONS_DEFAULT 16384u

/* Raise RLIMIT_NOFILE's soft limit to its hard limit; returns the soft
 * limit then in force. */
unsigned http_raise_fd_limit(void);
/* --max-connections' default for an fd limit. */
unsigned http_default_connections(unsigned fd_limit);

int http_start(server *srv, const http_hooks *hooks, char *err, size_t errlen);
/* Stop the daemon: closes every connection and joins its threads. */
void http_stop(server *srv);
/* Connections currently open. */
unsigned http_n_connections(server *srv);

/* The headers every response carries: X-Request-Id, X-Hyserve-Replica
 * (which replica answered, for a load balancer's spread to be seen), and
 * once the server drains, Connection: close (a balancer's keep-alive
 * connection is closed after this response, so its next request goes to
 * a replica that is staying). */
void http_add_common_headers(http_req *hr, struct MHD_Response *resp);

/* Queue a response. headers: NULL or a NULL-terminated list of name,
 * value pairs. Returns 0 or -1 (then close the connection). */
int http_send(http_req *hr, int status, const char *content_type, const char *body, size_t len,
              const char *const *headers);
/* Queue a JSON response; takes ownership of obj (NULL sends a 500). */
int http_send_json(http_req *hr, int status, cJSON *obj, const char *const *headers);

/* A streamed response body. read fills buf with up to max bytes and
 * returns the count, or HTTP_STREAM_END (done) or HTTP_STREAM_ERROR (cut
 * the connection); done(cls) runs once libmicrohttpd is finished with the
 * response, and then owes http_req_unref(hr). */
#define HTTP_STREAM_END ((ssize_t)-1)
#define HTTP_STREAM_ERROR ((ssize_t)-2)
typedef ssize_t (*http_read_fn)(void *cls, uint64_t pos, char *buf, size_t max);

/* Queue status with a body read from read(cls); headers as http_send's
 * (after Content-Type, before the common ones). Takes a reference on hr
 * for done once the response exists. Returns 0, -1 when it was not
 * queued (done has run or will: close the connection), or -2 when the
 * response could not be made (done will not run; cls is still the
 * caller's, and nothing was sent). */
int http_send_stream(http_req *hr, int status, const char *content_type, const char *const *headers,
                     http_read_fn read, void (*done)(void *cls), void *cls);

const char *http_header(http_req *hr, const char *name);
const char *http_query(http_req *hr, const char *name);

/* The client socket, or -1. */
int http_socket(http_req *hr);
/* True when the peer has closed or reset the connection. */
bool http_peer_gone(http_req *hr);

/* Wait until one of fds[0..n) is readable, the client hangs up or
 * deadline (engine_now_s()) passes, whichever is first; it may also
 * return early (look again). In a handler of the main listener this
 * suspends the connection and gives the HTTP thread back (park.h);
 * elsewhere it blocks in poll. */
void http_wait(http_req *hr, const int *fds, int n, double deadline);

/* From a content reader with nothing to send: suspend the connection
 * until one of fds[0..n) is readable, the client hangs up or deadline
 * passes, then the reader is called again. Returns 0 (return 0 from the
 * reader), or -1 when it could not be suspended (wait with http_wait). */
int http_park(http_req *hr, const int *fds, int n, double deadline);

/* Mark the request as in-flight generation work (drain waits for these). */
void http_inflight_begin(http_req *hr);
void http_inflight_end(http_req *hr);

/* Drop one reference (the streaming response holds one). */
void http_req_unref(http_req *hr);

#endif

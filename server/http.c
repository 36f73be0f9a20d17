/* http.c - libmicrohttpd daemon, per-request state, request log.
 *
 * Owns: starting/stopping the daemon (event driven: a small pool of
 * threads, each an epoll loop over its connections; a handler that waits
 * for the engine runs on a coroutine and suspends its connection, a
 * streaming content reader with nothing to send suspends it too, and the
 * resumer (park.h) resumes them), raising the fd limit, collecting request bodies up to
 * --max-body, request ids, response helpers, the one-line-per-request log
 * and the metrics record when a request is done.
 * Does not own: what each route does (routes.c, called through the
 * handler serve.c gives http_start).
 * ref: libmicrohttpd 0.9 manual (MHD_AccessHandlerCallback, content reader
 * callbacks, MHD_OPTION_NOTIFY_COMPLETED).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "fault.h"
#include "guard.h"
#include "http.h"
#include "json.h"
#include "metrics.h"
#include "log.h"
#include "park.h"

_Static_assert(HTTP_STREAM_END == MHD_CONTENT_READER_END_OF_STREAM &&
               HTTP_STREAM_ERROR == MHD_CONTENT_READER_END_WITH_ERROR, "http.h and libmicrohttpd agree");

/* The request handler and the extra headers (serve.c), set once before
 * the daemon starts. */
static http_hooks hooks;

/* The main listener's resumer (park.h), while the daemon runs. */
static parker *resumer;

/* ---------------------------------------------------------------------- */
/* Request ids                                                            */
/* ---------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Use the client's X-Request-Id when it is 1..64 characters of
 * [A-Za-z0-9._:-]; otherwise make one. */
static void set_request_id(http_req *hr)
{
    const char *v = MHD_lookup_connection_value(hr->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (v) {
        size_t n = strlen(v);
        bool ok = n >= 1 && n <= 64;
        for (size_t i = 0; ok && i < n; i++)
            ok = isalnum((unsigned char)v[i]) || strchr("._:-", v[i]) != NULL;
        if (ok) {
            memcpy(hr->id, v, n + 1);
            return;
        }
    }
    uint64_t k = atomic_fetch_add(&hr->srv->next_id, 1);
    snprintf(hr->id, sizeof(hr->id), "req-%016llx", (unsigned long long)splitmix64(k ^ hr->srv->id_salt));
}

/* One x-llm-d-* header into hr->gateway as name=value: the name lower
 * case, the value's bytes outside printable ASCII, spaces, quotes and
 * backslashes as '_', cut at 128 bytes, so a log line and /stats stay one
 * token a pair whatever a client sends. */
static enum MHD_Result add_gateway_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    http_req *hr = cls;
    if (!key || strncasecmp(key, "x-llm-d-", 8) || !value)
        return MHD_YES;
    char pair[200];
    size_t k = 0;
    for (const char *p = key; *p && k < 64; p++)
        pair[k++] = isalnum((unsigned char)*p) || *p == '-' || *p == '_' ? (char)tolower((unsigned char)*p) : '_';
    pair[k++] = '=';
    for (const unsigned char *p = (const unsigned char *)value; *p && k < 64 + 1 + 128; p++)
        pair[k++] = *p > 0x20 && *p < 0x7f && *p != '"' && *p != '\\' ? (char)*p : '_';
    pair[k] = '\0';
    size_t n = strlen(hr->gateway);
    if (n + (n ? 1 : 0) + k < sizeof(hr->gateway))
        snprintf(hr->gateway + n, sizeof(hr->gateway) - n, "%s%s", n ? " " : "", pair);
    return MHD_YES;
}

/* The inference gateway's routing headers (llm-d's endpoint picker sets
 * x-llm-d-* ones), kept for the request's log line and /stats. */
static void set_gateway_headers(http_req *hr)
{
    hr->gateway[0] = '\0';
    MHD_get_connection_values(hr->conn, MHD_HEADER_KIND, add_gateway_header, hr);
}

/* ---------------------------------------------------------------------- */
/* Response helpers                                                       */
/* ---------------------------------------------------------------------- */

void http_add_common_headers(http_req *hr, struct MHD_Response *resp)
{
    MHD_add_response_header(resp, "X-Request-Id", hr->id);
    if (hooks.add_headers)
        hooks.add_headers(hr, resp);
    if (hr->srv->replica[0])
        MHD_add_response_header(resp, "X-Hyserve-Replica", hr->srv->replica);
    if (hr->close_conn || hr->body_unread || atomic_load(&hr->srv->state) == SERVER_DRAINING)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

int http_send(http_req *hr, int status, const char *content_type, const char *body, size_t len,
              const char *const *headers)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(uintptr_t)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return -1;
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    http_add_common_headers(hr, resp);
    for (int i = 0; headers && headers[i] && headers[i + 1]; i += 2)
        MHD_add_response_header(resp, headers[i], headers[i + 1]);
    enum MHD_Result ok = MHD_queue_response(hr->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    hr->status = status;
    return ok == MHD_YES ? 0 : -1;
}

int http_send_json(http_req *hr, int status, cJSON *obj, const char *const *headers)
{
    if (hr->xlate && hr->xlate->body)
        obj = hr->xlate->body(hr, status, obj);
    char *txt = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (json_oom_take() && txt) {      /* built while memory ran out: it lacks something */
        cJSON_free(txt);
        txt = NULL;
    }
    if (!txt) {
        static const char oom[] = "{\"error\":\"out of memory\",\"error_type\":\"internal\"}";
        return http_send(hr, 500, "application/json", oom, sizeof(oom) - 1, NULL);
    }
    int rc = http_send(hr, status, "application/json", txt, strlen(txt), headers);
    cJSON_free(txt);
    return rc;
}

int http_send_stream(http_req *hr, int status, const char *content_type, const char *const *headers,
                     http_read_fn read, void (*done)(void *cls), void *cls)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, read, cls, done);
    if (!resp)
        return -2;
    hr->refs++;     /* done's */
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    for (int i = 0; headers && headers[i] && headers[i + 1]; i += 2)
        MHD_add_response_header(resp, headers[i], headers[i + 1]);
    http_add_common_headers(hr, resp);
    enum MHD_Result ok = MHD_queue_response(hr->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);     /* done runs when MHD is finished with it */
    hr->status = status;
    return ok == MHD_YES ? 0 : -1;
}

const char *http_header(http_req *hr, const char *name)
{
    return MHD_lookup_connection_value(hr->conn, MHD_HEADER_KIND, name);
}

const char *http_query(http_req *hr, const char *name)
{
    return MHD_lookup_connection_value(hr->conn, MHD_GET_ARGUMENT_KIND, name);
}

int http_socket(http_req *hr)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(hr->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

bool http_peer_gone(http_req *hr)
{
    if (hr->closing)
        return true;
    int fd = http_socket(hr);
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void http_wait(http_req *hr, const int *fds, int n, double deadline)
{
    if (hr->closing)
        return;
    int sock = http_socket(hr);
    if (!hr->metrics_port && park_co_inside() &&
        parker_park(resumer, hr->conn, fds, n, sock, deadline) == 0) {
        park_co_yield();
        return;
    }
    struct pollfd p[PARK_MAX_FDS + 1];
    int np = 0;
    for (int i = 0; i < n && i < PARK_MAX_FDS; i++)
        p[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    if (sock >= 0)
        p[np++] = (struct pollfd){.fd = sock, .events = POLLRDHUP};
    double left_ms = deadline > 0 ? (deadline - engine_now_s()) * 1e3 : 1000;
    (void)poll(p, (nfds_t)np, left_ms > 0 ? (int)left_ms + 1 : 0);
}

int http_park(http_req *hr, const int *fds, int n, double deadline)
{
    if (hr->metrics_port || hr->closing)
        return -1;
    return parker_park(resumer, hr->conn, fds, n, http_socket(hr), deadline);
}

void http_inflight_begin(http_req *hr)
{
    if (!hr->inflight) {
        hr->inflight = true;
        atomic_fetch_add(&hr->srv->n_inflight, 1);
    }
}

void http_inflight_end(http_req *hr)
{
    if (hr->inflight) {
        hr->inflight = false;
        atomic_fetch_sub(&hr->srv->n_inflight, 1);
    }
}

/* ---------------------------------------------------------------------- */
/* Request completion: log line and metrics                               */
/* ---------------------------------------------------------------------- */

/* libmicrohttpd's own error lines (a client gone mid-response, ...), with
 * a timestamp and a level like every other line. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    va_list cp;
    va_copy(cp, ap);
    vsnprintf(line, sizeof line, fmt, cp);
    va_end(cp);
    /* a stream whose reader stopped: the client went away or the request
     * was cancelled (its request line says which): no server fault */
    if (strstr(line, "application error generating response") || strstr(line, "Application reported internal error")) {
        log_msg(LOG_INFO, "hyserve: http: a response ended early and its connection was closed (the client went "
                "away or the request was cancelled; the request's log line says which)\n");
        return;
    }
    log_vmsg(LOG_WARN, "hyserve: http: ", fmt, ap);
}

/* GET /health, /live, /ready and /metrics: probes and scrapes, every few
 * seconds from each balancer and scraper; not logged unless --log-probes
 * (they are counted in /metrics all the same). */
static bool is_probe(const http_req *hr)
{
    return (!strcmp(hr->method, "GET") || !strcmp(hr->method, "HEAD")) &&
           (!strcmp(hr->path, "/health") || !strcmp(hr->path, "/live") || !strcmp(hr->path, "/ready") ||
            !strcmp(hr->path, "/metrics"));
}

/* The request's line as JSON fields (--log-format json). */
static void log_request_json(const http_req *hr, double total_s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    cJSON_AddStringToObject(o, "msg", "request");
    cJSON_AddStringToObject(o, "id", hr->id);
    cJSON_AddStringToObject(o, "method", hr->method);
    cJSON_AddStringToObject(o, "path", hr->path);
    cJSON_AddNumberToObject(o, "status", hr->status);
    if (hr->gateway[0])
        cJSON_AddStringToObject(o, "gateway", hr->gateway);
    if (hr->generation) {
        cJSON_AddNumberToObject(o, "prompt_tokens", hr->n_prompt);
        cJSON_AddNumberToObject(o, "gen_tokens", hr->n_gen);
        cJSON_AddStringToObject(o, "finish", hr->finish ? hr->finish : (hr->failure ? hr->failure : "-"));
        cJSON_AddNumberToObject(o, "queue_ms", hr->queue_ms >= 0 ? hr->queue_ms : 0.0);
        cJSON_AddNumberToObject(o, "ttft_ms", hr->ttft_ms >= 0 ? hr->ttft_ms : -1.0);
    }
    cJSON_AddNumberToObject(o, "total_ms", total_s * 1e3);
    if (hr->log_prompt) {
        /* log_prompt is JSON-escaped text without its quotes: read it back into a string */
        size_t n = strlen(hr->log_prompt);
        char *q = fault_malloc(n + 3);
        if (q) {
            q[0] = '"';
            memcpy(q + 1, hr->log_prompt, n);
            q[n + 1] = '"';
            q[n + 2] = '\0';
            cJSON *p = cJSON_Parse(q);
            if (p)
                json_put(o, "prompt", p);
            free(q);
        }
    }
    log_fields(LOG_INFO, o);
}

static void log_request(const http_req *hr, double total_s)
{
    if (is_probe(hr) && !log_probes())
        return;
    if (log_json()) {
        log_request_json(hr, total_s);
        return;
    }
    char extra[256 + sizeof(hr->gateway)] = "";
    if (hr->generation) {
        snprintf(extra, sizeof(extra), " prompt_tokens=%d gen_tokens=%d finish=%s queue_ms=%.1f ttft_ms=%.1f",
                 hr->n_prompt, hr->n_gen, hr->finish ? hr->finish : (hr->failure ? hr->failure : "-"),
                 hr->queue_ms >= 0 ? hr->queue_ms : 0.0, hr->ttft_ms >= 0 ? hr->ttft_ms : -1.0);
    }
    if (hr->gateway[0]) {       /* after the numbers: name=value pairs, as the rest of the line */
        size_t n = strlen(extra);
        snprintf(extra + n, sizeof(extra) - n, " %s", hr->gateway);
    }
    if (hr->log_prompt)
        log_msg(LOG_INFO, "hyserve: id=%s %s %s status=%d%s total_ms=%.1f prompt=\"%s\"", hr->id, hr->method,
                hr->path, hr->status, extra, total_s * 1e3, hr->log_prompt);
    else
        log_msg(LOG_INFO, "hyserve: id=%s %s %s status=%d%s total_ms=%.1f", hr->id, hr->method, hr->path,
                hr->status, extra, total_s * 1e3);
}

void http_req_unref(http_req *hr)
{
    if (!hr || --hr->refs > 0)
        return;
    double total = engine_now_s() - hr->t_start;
    log_request(hr, total);
    if (hr->srv->m) {
        metrics_req mr = {
            .path = hr->path,
            .generation = hr->generation,
            .status = hr->status,
            .finish = hr->finish,
            .failure = hr->failure,
            .n_prompt = hr->n_prompt,
            .n_gen = hr->n_gen,
            .queue_s = hr->queue_ms >= 0 ? hr->queue_ms / 1e3 : -1,
            .ttft_s = hr->ttft_ms >= 0 ? hr->ttft_ms / 1e3 : -1,
            .e2e_s = total,
            .cache_bytes = hr->cache_bytes,
        };
        metrics_record(hr->srv->m, &mr);
    }
    http_inflight_end(hr);
    free(hr->body);
    free(hr->log_prompt);
    if (hr->xlate && hr->xlate->free_state)
        hr->xlate->free_state(hr->xlate->state);
    free(hr->xlate);
    free(hr);
}

/* The request whose state could not be allocated: a 500 from static
 * memory, and the rest of its body read and dropped (the con_cls of such
 * a request is &oom_req). */
static http_req oom_req;

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    http_req *hr = *con_cls;
    *con_cls = NULL;
    if (!hr || hr == &oom_req)
        return;
    if (hr->co) {   /* closed while its handler waits (the daemon stopping): it ends as if the client left */
        hr->closing = true;
        int rc;
        if (park_co_resume(hr->co, &rc))
            hr->co = NULL;
    }
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !hr->failure && hr->generation && !hr->finish)
        hr->failure = "cancelled";
    /* the connection waits for its next request, under --idle-timeout */
    if (hr->srv->guard)
        guard_idle(hr->srv->guard, hr->gconn);
    http_req_unref(hr);
}

/* The kernel's send buffer of a connection. Left to autotuning it grows to
 * megabytes (tcp_wmem), all of it output a client that reads nothing makes
 * the server hold before --max-stream-buffer sees any; fixed, it bounds
 * that, at 128 KiB (the kernel doubles the value) per round trip, far more
 * than a token stream needs. */
#define HTTP_SNDBUF_BYTES (64 * 1024)

/* Every connection gets a fixed send buffer and a deadline record while it
 * is open (guard.h). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    server *srv = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) {
            int sndbuf = HTTP_SNDBUF_BYTES;
            (void)setsockopt((int)ci->connect_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
        }
        if (srv->guard)
            *socket_context = ci ? guard_open(srv->guard, (int)ci->connect_fd) : NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && srv->guard) {
        guard_close(srv->guard, *socket_context);
        *socket_context = NULL;
    }
}

/* ---------------------------------------------------------------------- */
/* The access handler                                                     */
/* ---------------------------------------------------------------------- */

/* Adds up the bytes of the header lines ("Name: value\r\n"). */
static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    size_t *n = cls;
    *n += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

/* The body framing headers of a request head, every value of each
 * (MHD_lookup_connection_value sees only the first). */
typedef struct framing_scan {
    int n_cl, n_te;
    bool cl_differ;
    bool te_chunked;            /* the one Transfer-Encoding value is exactly "chunked" */
    const char *cl;             /* the first Content-Length value */
    size_t cl_len;
} framing_scan;

/* value without the blanks around it, as [*len] */
static const char *trim_blanks(const char *v, size_t *len)
{
    while (*v == ' ' || *v == '\t')
        v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    *len = n;
    return v;
}

static enum MHD_Result scan_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    framing_scan *f = cls;
    size_t n;
    const char *v = trim_blanks(value ? value : "", &n);
    if (!strcasecmp(key, "Content-Length")) {
        if (f->n_cl++ == 0) {
            f->cl = v;
            f->cl_len = n;
        } else if (n != f->cl_len || memcmp(v, f->cl, n)) {
            f->cl_differ = true;
        }
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->te_chunked = f->n_te++ == 0 && n == 7 && !strncasecmp(v, "chunked", 7);
    }
    return MHD_YES;
}

/* RFC 9112 6.3 on the head: the same Content-Length repeated is one (9110
 * 8.6 allows it), different ones are a 400; Transfer-Encoding with
 * Content-Length is refused with a 400 (6.3 item 3 lets a server reject
 * it), and any transfer coding but a lone "chunked" is a 501 (6.1; what
 * nginx answers). *has_body: the head announces a body. */
static int check_framing(struct MHD_Connection *conn, bool *has_body)
{
    framing_scan f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, scan_framing, &f);
    *has_body = f.n_te > 0 || (f.n_cl > 0 && !(f.cl_len == 1 && f.cl[0] == '0'));
    if (f.cl_differ)
        return HTTP_FRAMING_CL_DIFFER;
    if (f.n_te && f.n_cl)
        return HTTP_FRAMING_TE_CL;
    if (f.n_te && !f.te_chunked)
        return HTTP_FRAMING_TE_CODING;
    return HTTP_FRAMING_OK;
}

/* Test builds with HYSERVE_FAULT_LIVE=1 (fault.h): X-Hyserve-Fault-Nth: n
 * fails the n-th allocation from the start of this request on; GET
 * /debug/fault disarms before it allocates anything, and answers what the
 * countdown said (routes.c). */
static void arm_fault(struct MHD_Connection *conn, const char *url)
{
    if (!fault_live())
        return;
    if (!strcmp(url, "/debug/fault")) {
        fault_take();
        return;
    }
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Hyserve-Fault-Nth");
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    if (v && *end == '\0' && n > 0 && n < 1000000)
        fault_inject((int)n);
}

static enum MHD_Result answer_oom(struct MHD_Connection *conn, void **con_cls)
{
    static const char body[] = "{\"error\":\"out of memory\",\"error_type\":\"internal\"}";
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(sizeof(body) - 1, (void *)(uintptr_t)body, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, resp);
    MHD_destroy_response(resp);
    *con_cls = &oom_req;
    return ok;
}

static int run_handler(void *arg)
{
    return hooks.handle(arg);
}

/* Both listeners' access handler: metrics_port marks a request of the
 * --metrics-port listener (routes.c answers only the scrape and the
 * probes there, without a key). */
static enum MHD_Result on_any_request(server *srv, bool metrics_port, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version, const char *upload_data,
                                      size_t *upload_data_size, void **con_cls)
{
    http_req *hr = *con_cls;

    if (hr && hr != &oom_req && hr->co) {     /* resumed after a wait: its handler goes on */
        int rc;
        if (park_co_resume(hr->co, &rc) == 0)
            return MHD_YES;
        hr->co = NULL;
        return rc == 0 ? MHD_YES : MHD_NO;
    }
    if (hr == &oom_req) {   /* answered 500 below: discard the body */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (!hr) {
        json_oom_take();        /* nothing from this thread's last request carries over */
        arm_fault(conn, url);
        hr = fault_calloc(1, sizeof(*hr));
        if (!hr)
            return answer_oom(conn, con_cls);
        hr->srv = srv;
        hr->conn = conn;
        hr->metrics_port = metrics_port;
        hr->refs = 1;
        hr->t_start = engine_now_s();
        hr->queue_ms = hr->ttft_ms = -1;
        snprintf(hr->method, sizeof(hr->method), "%s", method);
        snprintf(hr->path, sizeof(hr->path), "%s", url);
        set_request_id(hr);
        set_gateway_headers(hr);
        *con_cls = hr;
        if (srv->guard) {
            const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
            hr->gconn = ci ? ci->socket_context : NULL;
            guard_head_done(srv->guard, hr->gconn);
        }
        /* the request line and headers against --max-header-bytes (the
         * connection's memory limit, set from it, stops a much larger head
         * before it is read at all, with libmicrohttpd's own 431) */
        size_t head = strlen(method) + strlen(url) + strlen(version) + 4;
        MHD_get_connection_values(conn, MHD_HEADER_KIND, add_header_bytes, &head);
        if (head > srv->cfg->max_header_bytes) {
            hr->head_too_large = true;
            return hooks.handle(hr) == 0 ? MHD_YES : MHD_NO;
        }
        bool has_body;
        hr->framing = check_framing(conn, &has_body);
        if (hr->framing) {
            /* answered with Connection: close, so libmicrohttpd reads
             * nothing more of this connection: a smuggled request after
             * the ambiguous body is never parsed */
            hr->close_conn = true;
            return hooks.handle(hr) == 0 ? MHD_YES : MHD_NO;
        }
        hr->body_unread = has_body;
        if (has_body && hooks.head) {
            /* refused on its headers (no key): the body is not read, and
             * no 100 Continue invites it */
            int h = hooks.head(hr);
            if (h != 1)
                return h == 0 ? MHD_YES : MHD_NO;
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (end != cl && n > srv->cfg->max_body) {
                /* refuse before reading the body; MHD closes the connection */
                hr->body_too_large = true;
                return hooks.handle(hr) == 0 ? MHD_YES : MHD_NO;
            }
        }
        return MHD_YES;
    }
    if (hr->status)         /* answered early (413): discard the rest */
    {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (hr->body_too_large || hr->body_oom)
            return MHD_YES;
        if (hr->n_body + n > srv->cfg->max_body) {
            hr->body_too_large = true;
            free(hr->body);
            hr->body = NULL;
            hr->n_body = hr->cap_body = 0;
            return MHD_YES;
        }
        if (hr->n_body + n + 1 > hr->cap_body) {
            size_t cap = hr->cap_body ? hr->cap_body : 1024;
            while (cap < hr->n_body + n + 1)
                cap *= 2;
            char *b = fault_realloc(hr->body, cap);
            if (!b) {
                hr->body_oom = true;
                free(hr->body);
                hr->body = NULL;
                hr->n_body = hr->cap_body = 0;
                return MHD_YES;
            }
            hr->body = b;
            hr->cap_body = cap;
        }
        memcpy(hr->body + hr->n_body, upload_data, n);
        hr->n_body += n;
        hr->body[hr->n_body] = '\0';
        return MHD_YES;
    }
    hr->body_done = true;
    hr->body_unread = false;
    if (srv->guard)
        guard_busy(srv->guard, hr->gconn);
    if (metrics_port)
        return hooks.handle(hr) == 0 ? MHD_YES : MHD_NO;
    /* on its own stack: a wait inside parks the connection (http_wait) */
    int rc;
    int done = park_co_start(&hr->co, run_handler, hr, &rc);
    if (done < 0)
        return hooks.handle(hr) == 0 ? MHD_YES : MHD_NO;    /* no coroutine: blocks this thread */
    return done == 0 || rc == 0 ? MHD_YES : MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    return on_any_request(cls, false, conn, url, method, version, upload_data, upload_data_size, con_cls);
}

static enum MHD_Result on_metrics_request(void *cls, struct MHD_Connection *conn, const char *url,
                                          const char *method, const char *version, const char *upload_data,
                                          size_t *upload_data_size, void **con_cls)
{
    return on_any_request(cls, true, conn, url, method, version, upload_data, upload_data_size, con_cls);
}

/* ---------------------------------------------------------------------- */
/* Daemon                                                                 */
/* ---------------------------------------------------------------------- */

/* Why the address cannot be listened on, asked again of bind(2) after the
 * HTTP library failed (it does not say): an errno, or 0 when a bind works. */
static int bind_errno(const struct addrinfo *ai)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);   /* as MHD binds */
    int why = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    close(fd);
    return why;
}

static int start_metrics_listener(server *srv, char *err, size_t errlen);

/* The address to listen on (host "" for all) and the daemon flags for it
 * (a thread pool of epoll loops; IPv6 for an IPv6 address). NULL with a
 * message naming opt when it does not resolve; else freeaddrinfo it. */
static struct addrinfo *resolve_listen(const char *host, int port_no, const char *opt, unsigned *flags, char *err,
                                       size_t errlen)
{
    struct addrinfo hints = {0}, *ai = NULL;
    char port[16];
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    snprintf(port, sizeof(port), "%d", port_no);
    int grc = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (grc != 0 || !ai) {
        snprintf(err, errlen, "cannot resolve %s '%s': %s", opt, host, gai_strerror(grc));
        return NULL;
    }
    *flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
             MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        *flags |= MHD_USE_IPv6;
    return ai;
}

unsigned http_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY ? 1048576 : rl.rlim_max;
        struct rlimit up = {.rlim_cur = want, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0)
            rl.rlim_cur = want;
    }
    return rl.rlim_cur > 1u << 30 ? 1u << 30 : (unsigned)rl.rlim_cur;
}

unsigned http_default_connections(unsigned fd_limit)
{
    unsigned n = fd_limit > HTTP_FD_RESERVE + 64 ? fd_limit - HTTP_FD_RESERVE : 64;
    return n > HTTP_MAX_CONNECTIONS_DEFAULT ? HTTP_MAX_CONNECTIONS_DEFAULT : n;
}

int http_start(server *srv, const http_hooks *h, char *err, size_t errlen)
{
    const server_config *c = srv->cfg;
    hooks = *h;
    unsigned flags;
    unsigned fd_limit = http_raise_fd_limit();
    unsigned max_conn = c->max_connections > 0 ? (unsigned)c->max_connections : http_default_connections(fd_limit);
    if (max_conn + HTTP_FD_RESERVE / 2 > fd_limit)
        log_msg(LOG_WARN, "hyserve: --max-connections %u is near the open-file limit %u: connections past it are "
                "refused by the kernel, not by the server", max_conn, fd_limit);
    struct addrinfo *ai = resolve_listen(c->host, c->port, "--host", &flags, err, errlen);
    if (!ai)
        return -1;
    srv->guard = guard_new(c->idle_timeout, c->request_timeout);
    resumer = srv->guard ? parker_new() : NULL;
    if (!srv->guard || !resumer) {
        guard_free(srv->guard);
        srv->guard = NULL;
        freeaddrinfo(ai);
        snprintf(err, errlen, "out of memory (or no thread) for the connection guard");
        return -1;
    }
    srv->daemon = MHD_start_daemon(flags, (uint16_t)c->port, NULL, NULL, on_request, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,   /* first, or MHD logs before it */
                                   MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                   MHD_OPTION_CONNECTION_LIMIT, max_conn,
                                   MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_POOL_THREADS,
                                   MHD_OPTION_CONNECTION_TIMEOUT,
                                   (unsigned)(c->idle_timeout >= 1 ? c->idle_timeout + 0.5 : 120),
                                   MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)c->max_conn_per_client,
                                   /* room for a head at the limit twice over (MHD also keeps the
                                    * response headers here), never below MHD's 32 KiB default */
                                   MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                   (size_t)(c->max_header_bytes < 12288 ? 32768 : 2 * c->max_header_bytes + 8192),
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                   MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
                                   MHD_OPTION_END);
    if (!srv->daemon) {
        guard_free(srv->guard);
        srv->guard = NULL;
        parker_free(resumer);
        resumer = NULL;
        const int why = bind_errno(ai);
        if (why == EADDRINUSE)
            snprintf(err, errlen, "cannot listen on %s:%d: the port is in use (`ss -ltnp 'sport = :%d'` shows by "
                     "what); choose another with --port N, HYSERVE_PORT=N, or `make run PORT=N`", c->host, c->port,
                     c->port);
        else
            snprintf(err, errlen, "cannot listen on %s:%d: %s", c->host, c->port,
                     why ? strerror(why) : "the HTTP library refused (see the line before)");
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    if (c->metrics_port > 0 && start_metrics_listener(srv, err, errlen)) {
        http_stop(srv);
        return -1;
    }
    return 0;
}

/* The --metrics-port listener: its own daemon, so a scrape never queues
 * behind the main port's connections (or their limits); the same request
 * state, log line and metrics record as the main port's. */
static int start_metrics_listener(server *srv, char *err, size_t errlen)
{
    const server_config *c = srv->cfg;
    const char *host = c->metrics_host[0] ? c->metrics_host : c->host;
    unsigned flags;
    struct addrinfo *ai = resolve_listen(host, c->metrics_port, "--metrics-host", &flags, err, errlen);
    if (!ai)
        return -1;
    /* a few scrapers and probes, each answered at once: a small
     * connection limit and a short idle timeout */
    srv->metrics_daemon = MHD_start_daemon(flags, (uint16_t)c->metrics_port, NULL, NULL, on_metrics_request, srv,
                                           MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                                           MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                           MHD_OPTION_CONNECTION_LIMIT, 32u,
                                           MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                                           MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                           MHD_OPTION_END);
    if (!srv->metrics_daemon) {
        const int why = bind_errno(ai);
        snprintf(err, errlen, "cannot listen on %s:%d (--metrics-port): %s", host, c->metrics_port,
                 why == EADDRINUSE ? "the port is in use" : why ? strerror(why) : "the HTTP library refused");
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    return 0;
}

void http_stop(server *srv)
{
    if (srv->metrics_daemon)
        MHD_stop_daemon(srv->metrics_daemon);
    srv->metrics_daemon = NULL;
    /* every suspended connection resumed first: libmicrohttpd must not
     * stop with one (and parking fails from now on) */
    parker_shutdown(resumer);
    if (srv->daemon)
        MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    parker_free(resumer);
    resumer = NULL;
    guard_free(srv->guard);     /* after the daemon: no connection is left to report */
    srv->guard = NULL;
}

unsigned http_n_connections(server *srv)
{
    if (!srv->daemon)
        return 0;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return di ? di->num_connections : 0;
}

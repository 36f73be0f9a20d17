/* serve_bench.c - streaming clients against a running `hyserve serve`.
 *
 * Owns: N concurrent clients, each sending POST /generate_stream (TGI SSE,
 * docs/serving.md section 2.3) requests one after another over plain HTTP/1.1
 * sockets, and timing every token event as it arrives: time to first token
 * (from the request's first byte sent), inter-token latency between token
 * events, and aggregate tokens/s over the run's wall time. Writes one JSON
 * object. A C client keeps its own cost per token far below the server's,
 * which a Python client at 32 streams would not.
 * --params adds TGI parameters to every request (e.g. a grammar, for the
 * constrained decode run).
 * Does not own: starting or stopping the server (bench/run.sh).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The engine's engine_now_s() on the same clock: this client is built
 * alone, without the engine's objects. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct samples {
    double *v;
    int n, cap;
} samples;

static void sp_add(samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        double *nv = realloc(s->v, sizeof(double) * (size_t)s->cap);
        if (!nv) {
            fprintf(stderr, "serve_bench: out of memory\n");
            exit(1);
        }
        s->v = nv;
    }
    s->v[s->n++] = x;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double sp_pct(samples *s, double p)
{
    if (s->n == 0)
        return 0.0;
    qsort(s->v, (size_t)s->n, sizeof(double), cmp_d);
    int i = (int)(p / 100.0 * (s->n - 1) + 0.5);
    return s->v[i];
}

typedef struct client {
    pthread_t th;
    int port, requests, max_new;
    const char *prompt;
    const char *params;         /* more TGI parameters ("k": v, ...), or NULL */
    samples ttft, itl;          /* seconds */
    long tokens;
    int errors;
    char err[200];
} client;

/* Incremental decoder: HTTP response head, then (chunked or plain) body,
 * then SSE events separated by a blank line. */
typedef struct stream {
    int state;                  /* 0 head, 1 chunk size, 2 chunk data, 3 chunk CRLF, 4 plain body */
    bool chunked;
    long chunk_left;
    char head[4096];
    int head_n;
    char line[64];
    int line_n;
    char *ev;                   /* current SSE event text */
    int ev_n, ev_cap;
    int status;
} stream;

/* one complete SSE event: count it if it carries a token */
static void on_event(client *c, stream *st, double t, double t_send, double *t_last, int *n_tok)
{
    st->ev[st->ev_n] = 0;
    if (strstr(st->ev, "data:") && strstr(st->ev, "\"token\"")) {
        if (*n_tok == 0)
            sp_add(&c->ttft, t - t_send);
        else
            sp_add(&c->itl, t - *t_last);
        *t_last = t;
        (*n_tok)++;
    }
    st->ev_n = 0;
}

static void body_bytes(client *c, stream *st, const char *p, int n, double t, double t_send, double *t_last,
                       int *n_tok)
{
    for (int i = 0; i < n; i++) {
        if (st->ev_n + 2 >= st->ev_cap) {
            st->ev_cap = st->ev_cap ? 2 * st->ev_cap : 4096;
            st->ev = realloc(st->ev, (size_t)st->ev_cap);
            if (!st->ev) {
                fprintf(stderr, "serve_bench: out of memory\n");
                exit(1);
            }
        }
        st->ev[st->ev_n++] = p[i];
        /* an event ends at a blank line: "\n\n" */
        if (p[i] == '\n' && st->ev_n >= 2 && st->ev[st->ev_n - 2] == '\n')
            on_event(c, st, t, t_send, t_last, n_tok);
    }
}

static int feed(client *c, stream *st, const char *p, int n, double t, double t_send, double *t_last, int *n_tok)
{
    int i = 0;
    while (i < n) {
        switch (st->state) {
        case 0:                                         /* response head up to CRLF CRLF */
            if (st->head_n + 1 >= (int)sizeof st->head)
                return -1;
            st->head[st->head_n++] = p[i++];
            st->head[st->head_n] = 0;
            if (st->head_n >= 4 && !memcmp(st->head + st->head_n - 4, "\r\n\r\n", 4)) {
                st->status = atoi(st->head + 9);
                for (char *q = st->head; *q; q++)
                    *q = (char)(*q >= 'A' && *q <= 'Z' ? *q + 32 : *q);
                st->chunked = strstr(st->head, "transfer-encoding: chunked") != NULL;
                st->state = st->chunked ? 1 : 4;
                st->line_n = 0;
            }
            break;
        case 1:                                         /* chunk size line */
            if (p[i] == '\n') {
                st->line[st->line_n] = 0;
                st->chunk_left = strtol(st->line, NULL, 16);
                st->line_n = 0;
                st->state = st->chunk_left > 0 ? 2 : 5;
            } else if (st->line_n + 1 < (int)sizeof st->line) {
                st->line[st->line_n++] = p[i];
            }
            i++;
            break;
        case 2: {                                       /* chunk data */
            int take = n - i < st->chunk_left ? n - i : (int)st->chunk_left;
            body_bytes(c, st, p + i, take, t, t_send, t_last, n_tok);
            i += take;
            st->chunk_left -= take;
            if (st->chunk_left == 0)
                st->state = 3;
            break;
        }
        case 3:                                         /* CRLF after the data */
            if (p[i++] == '\n')
                st->state = 1;
            break;
        case 4:
            body_bytes(c, st, p + i, n - i, t, t_send, t_last, n_tok);
            i = n;
            break;
        default:                                        /* after the last chunk */
            i = n;
        }
    }
    return 0;
}

static int one_request(client *c)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(c->err, sizeof c->err, "connect: %s", strerror(errno));
        close(fd);
        return -1;
    }
    char body[8192], req[9216];
    int bl = snprintf(body, sizeof body, "{\"inputs\": \"%s\", \"parameters\": {\"max_new_tokens\": %d%s%s}}",
                      c->prompt, c->max_new, c->params ? ", " : "", c->params ? c->params : "");
    if (bl < 0 || bl >= (int)sizeof body) {
        snprintf(c->err, sizeof c->err, "request body over %zu bytes", sizeof body);
        close(fd);
        return -1;
    }
    int rl = snprintf(req, sizeof req,
                      "POST /generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Accept: text/event-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
                      bl, body);
    stream st;
    memset(&st, 0, sizeof st);
    double t_send = now_s(), t_last = t_send;
    int n_tok = 0;
    if (write(fd, req, (size_t)rl) != rl) {
        close(fd);
        return -1;
    }
    char buf[16384];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0)
            break;
        if (feed(c, &st, buf, (int)r, now_s(), t_send, &t_last, &n_tok) != 0)
            break;
    }
    close(fd);
    free(st.ev);
    if (st.status != 200) {
        snprintf(c->err, sizeof c->err, "HTTP status %d", st.status);
        return -1;
    }
    c->tokens += n_tok;
    return 0;
}

static void *client_main(void *arg)
{
    client *c = arg;
    for (int r = 0; r < c->requests; r++)
        if (one_request(c) != 0)
            c->errors++;
    return NULL;
}

int main(int argc, char **argv)
{
    int port = 8080, n_clients = 1, requests = 2, max_new = 64;
    const char *prompt = "The quick brown fox jumps over the lazy dog", *out = NULL, *params = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc) port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc) n_clients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) requests = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-new") && i + 1 < argc) max_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--params") && i + 1 < argc) params = argv[++i];
        else {
            fprintf(stderr, "usage: serve_bench [--port N] [--clients N] [--requests N] [--max-new N] "
                            "[--prompt TEXT] [--params '\"k\": v, ...'] [-o OUT.json]\n");
            return 2;
        }
    }
    client *cs = calloc((size_t)n_clients, sizeof *cs);
    if (!cs)
        return 1;
    double t0 = now_s();
    for (int i = 0; i < n_clients; i++) {
        cs[i] = (client){ .port = port, .requests = requests, .max_new = max_new, .prompt = prompt, .params = params };
        pthread_create(&cs[i].th, NULL, client_main, &cs[i]);
    }
    samples ttft = { 0 }, itl = { 0 };
    long tokens = 0;
    int errors = 0;
    const char *err = "";
    for (int i = 0; i < n_clients; i++) {
        pthread_join(cs[i].th, NULL);
        for (int j = 0; j < cs[i].ttft.n; j++)
            sp_add(&ttft, cs[i].ttft.v[j]);
        for (int j = 0; j < cs[i].itl.n; j++)
            sp_add(&itl, cs[i].itl.v[j]);
        tokens += cs[i].tokens;
        errors += cs[i].errors;
        if (cs[i].errors)
            err = cs[i].err;
    }
    double wall = now_s() - t0, itl_sum = 0.0;
    for (int j = 0; j < itl.n; j++)
        itl_sum += itl.v[j];
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f)
        return 1;
    fprintf(f, "{\"clients\": %d, \"requests\": %d, \"max_new_tokens\": %d, \"tokens\": %ld, \"errors\": %d, "
               "\"error\": \"%s\", \"wall_s\": %.4f, \"tok_s\": %.4f, \"ttft_ms_p50\": %.4f, \"ttft_ms_p99\": %.4f, "
               "\"itl_ms_p50\": %.4f, \"itl_ms_p99\": %.4f, \"itl_ms_mean\": %.4f}\n",
            n_clients, n_clients * requests, max_new, tokens, errors, err, wall, tokens / wall,
            1e3 * sp_pct(&ttft, 50), 1e3 * sp_pct(&ttft, 99), 1e3 * sp_pct(&itl, 50), 1e3 * sp_pct(&itl, 99),
            itl.n ? 1e3 * itl_sum / itl.n : 0.0);
    if (out)
        fclose(f);
    for (int i = 0; i < n_clients; i++) {
        free(cs[i].ttft.v);
        free(cs[i].itl.v);
    }
    free(cs);
    free(ttft.v);
    free(itl.v);
    return errors ? 1 : 0;
}

/* health.c - `hyserve health`: is the server on this machine ready?
 *
 * Owns: the probe a container's HEALTHCHECK runs. It finds the address
 * the server listens on exactly as `hyserve serve` does (flags,
 * HYSERVE_* variables, the config file; a wildcard bind address becomes
 * loopback), sends GET /ready over a plain socket and exits 0 on a 200,
 * 1 on anything else (503 while loading or draining, no answer within
 * the timeout, no connection). No curl or shell needed in the image.
 * Does not own: what /ready answers (routes.c).
 * ref: RFC 9112 section 4 (the status line).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "engine.h"
#include "serve.h"

#define HEALTH_TIMEOUT_S 3.0

/* Milliseconds left until deadline (monotonic seconds), at least 0. */
static int ms_left(double deadline)
{
    double left = deadline - engine_now_s();
    return left > 0 ? (int)(left * 1e3) + 1 : 0;
}

/* Connect to one address before the deadline. Returns the socket or -1
 * (errno set). */
static int connect_by(const struct addrinfo *ai, double deadline)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
        return -1;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
        return fd;
    if (errno != EINPROGRESS)
        goto out_close;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int pr = poll(&p, 1, ms_left(deadline));
    if (pr <= 0) {
        errno = pr == 0 ? ETIMEDOUT : errno;
        goto out_close;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
        errno = soerr ? soerr : EIO;
        goto out_close;
    }
    return fd;

out_close: {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
}

/* GET path on host:port; the status code of the answer in *status.
 * Returns 0, or -1 with one line in err. */
static int probe(const char *host, int port, const char *path, int *status, char *err, size_t errlen)
{
    double deadline = engine_now_s() + HEALTH_TIMEOUT_S;
    struct addrinfo hints = {0}, *ai = NULL;
    char portstr[16], req[512], resp[256];
    int fd = -1, rc = -1;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(portstr, sizeof portstr, "%d", port);
    int grc = getaddrinfo(host, portstr, &hints, &ai);
    if (grc != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(grc));
        return -1;
    }
    for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next)
        fd = connect_by(a, deadline);
    if (fd < 0) {
        snprintf(err, errlen, "cannot connect to %s:%d: %s", host, port, strerror(errno));
        goto out;
    }
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: hyserve-health\r\n"
                                      "Connection: close\r\n\r\n", path, host, port);
    for (int off = 0; off < n;) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, ms_left(deadline)) <= 0) {
            snprintf(err, errlen, "%s:%d: timed out sending the request", host, port);
            goto out;
        }
        ssize_t w = send(fd, req + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(err, errlen, "%s:%d: %s", host, port, strerror(errno));
            goto out;
        }
        off += w > 0 ? (int)w : 0;
    }
    /* the status line is all we read: "HTTP/1.1 200 OK\r\n" */
    size_t got = 0;
    while (got < sizeof resp - 1 && !memchr(resp, '\n', got)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms_left(deadline)) <= 0) {
            snprintf(err, errlen, "%s:%d: no answer within %.0f s", host, port, HEALTH_TIMEOUT_S);
            goto out;
        }
        ssize_t r = recv(fd, resp + got, sizeof resp - 1 - got, 0);
        if (r == 0)
            break;
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            snprintf(err, errlen, "%s:%d: %s", host, port, strerror(errno));
            goto out;
        }
        got += (size_t)r;
    }
    resp[got] = '\0';
    int code = 0;
    if (sscanf(resp, "HTTP/%*d.%*d %d", &code) != 1 || code < 100 || code > 599) {
        snprintf(err, errlen, "%s:%d: not an HTTP answer", host, port);
        goto out;
    }
    *status = code;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}

/* The address to probe for a bind address: the wildcard ones mean this
 * machine, so loopback of the same family. */
static const char *probe_host(const char *bind)
{
    if (!bind[0] || !strcmp(bind, "0.0.0.0") || !strcmp(bind, "*"))
        return "127.0.0.1";
    if (!strcmp(bind, "::") || !strcmp(bind, "[::]"))
        return "::1";
    return bind;
}

int serve_health(int argc, char **argv)
{
    server_config cfg;
    char err[512];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: hyserve health [--port N] [--host ADDR] [--config FILE]\n\n"
                   "Asks the server on this machine for GET /ready and exits 0 when it answers 200,\n"
                   "1 otherwise (loading, draining, failed, or no answer within %.0f s). The port\n"
                   "and address come from the same flags, HYSERVE_* variables and config file as\n"
                   "`hyserve serve`; a wildcard address (0.0.0.0, ::) is probed on loopback.\n"
                   "For a container's HEALTHCHECK: no curl needed.\n",
                   HEALTH_TIMEOUT_S);
            return 0;
        }
    }
    if (config_load_address(&cfg, argc, argv, err, sizeof err) != 0) {
        fprintf(stderr, "hyserve: health: %s\n", err);
        return 1;
    }
    const char *host = probe_host(cfg.host);
    int status = 0;
    if (probe(host, cfg.port, "/ready", &status, err, sizeof err) != 0) {
        fprintf(stderr, "hyserve: health: %s\n", err);
        return 1;
    }
    bool v6 = strchr(host, ':') != NULL;
    printf("hyserve: health: http://%s%s%s:%d/ready answered %d\n", v6 ? "[" : "", host, v6 ? "]" : "", cfg.port,
           status);
    return status == 200 ? 0 : 1;
}

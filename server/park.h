/* park.h - connections that wait for the engine without a thread.
 *
 * Owns: the resumer (one thread with one epoll set: a suspended
 * connection's wake fds, its client socket for hang-ups, its deadline),
 * and the handler coroutines (a request's handler runs on its own small
 * stack, so a wait inside it suspends the connection and gives the HTTP
 * thread back instead of blocking it).
 * Does not own: what is waited for (stream.c), the daemon (http.c).
 * ref: libmicrohttpd 0.9 manual (MHD_suspend_connection,
 * MHD_resume_connection), epoll(7), makecontext(3).
 */
#ifndef HYSERVE_PARK_H
#define HYSERVE_PARK_H

#include <stdbool.h>

struct MHD_Connection;

/* At most this many fds (besides the client socket) one wait watches. */
#define PARK_MAX_FDS 40

typedef struct parker parker;

/* The resumer thread; NULL when out of memory or threads. */
parker *parker_new(void);
/* Resume every parked connection and stop the thread; parking fails from
 * then on (before MHD_stop_daemon, which must not see a suspended one). */
void parker_shutdown(parker *p);
void parker_free(parker *p);

/* Suspend conn until one of fds[0..n) is readable, sock (-1: none) hangs
 * up or deadline (engine_now_s(), <= 0: none) passes; then it is resumed
 * and libmicrohttpd calls its handler or content reader again. Call only
 * from those callbacks. Returns 0, or -1 (not suspended: shutting down or
 * out of memory). */
int parker_park(parker *p, struct MHD_Connection *conn, const int *fds, int n, int sock, double deadline);

/* Parked connections right now (tests, /stats). */
int parker_count(parker *p);

/* ---- handler coroutines ---- */

typedef struct park_co park_co;

/* Run fn(arg) on a new coroutine. Returns 1 when fn finished (*rc its
 * result, the coroutine freed), 0 when it is parked (continue it with
 * park_co_resume when its connection is called again), -1 when no
 * coroutine could be made (fn was not run). */
int park_co_start(park_co **co, int (*fn)(void *), void *arg, int *rc);
int park_co_resume(park_co *co, int *rc);
/* Inside a coroutine: give the thread back until park_co_resume. False
 * when not on a coroutine (the caller waits the blocking way). */
bool park_co_yield(void);
bool park_co_inside(void);

#endif

/* guard.h - deadlines on connections that send a request too slowly.
 *
 * Owns: one record per open connection (its socket and what it is waiting
 * for), and a thread that shuts down connections past their deadline:
 *   - waiting for a request (just accepted, or idle after a response): the
 *     whole request head must arrive within --idle-timeout. libmicrohttpd's
 *     own timeout restarts with every byte, so a client trickling one
 *     header byte a second would hold its connection (and its thread) for
 *     ever; this one does not restart.
 *   - reading a body: all of it within --request-timeout of the head.
 *   - busy (a handler runs, a response streams): no deadline here.
 * With the per-client connection limit (MHD_OPTION_PER_IP_CONNECTION_LIMIT)
 * one client cannot take every connection slot with slow requests, so
 * health probes and other clients are still served.
 * Does not own: the connections (libmicrohttpd does; a shutdown(2) on the
 * socket makes its thread see the end of the stream and close it).
 */
#ifndef HYSERVE_GUARD_H
#define HYSERVE_GUARD_H

#include <stdbool.h>

typedef struct guard guard;
typedef struct guard_conn guard_conn;

/* Start the sweeper; timeouts in seconds (<= 0: that deadline is off). */
guard *guard_new(double idle_timeout, double request_timeout);
/* Stop the sweeper and free every record. Accepts NULL. */
void guard_free(guard *g);

/* A connection opened (its socket) / closed. */
guard_conn *guard_open(guard *g, int fd);
void guard_close(guard *g, guard_conn *c);
/* The connection's request head arrived: its body is read next. */
void guard_head_done(guard *g, guard_conn *c);
/* Its request is complete and being answered: no deadline. */
void guard_busy(guard *g, guard_conn *c);
/* Its response is done: it waits for the next request. */
void guard_idle(guard *g, guard_conn *c);

/* Connections shut down for a missed deadline, since the start. */
unsigned long guard_n_cut(guard *g);

#endif

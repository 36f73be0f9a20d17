/* guard.c - connection deadlines (guard.h says what it owns). */
#include "fault.h"
#include "guard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "engine.h"

enum guard_phase {
    PHASE_WAITING = 0,          /* for a request head */
    PHASE_BODY = 1,             /* reading a request body */
    PHASE_BUSY = 2,             /* answering: no deadline */
};

/* One open connection. Owned by the guard; linked under g->mu. */
struct guard_conn {
    int fd;
    int phase;                  /* enum guard_phase */
    double since;               /* engine_now_s() when the phase began */
    bool cut;                   /* shut down already */
    guard_conn *prev, *next;
};

struct guard {
    double idle_timeout, request_timeout;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    guard_conn *head;           /* open connections, under mu */
    bool stop;
    unsigned long n_cut;
    pthread_t thread;
    bool started;
};

/* Shut down every connection past its deadline, about four times a second. */
static void *sweep(void *arg)
{
    guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        double now = engine_now_s();
        for (guard_conn *c = g->head; c; c = c->next) {
            double limit = c->phase == PHASE_WAITING ? g->idle_timeout
                         : c->phase == PHASE_BODY ? g->request_timeout : 0;
            if (c->cut || limit <= 0 || now - c->since < limit)
                continue;
            /* the connection's thread reads end of stream and closes it;
             * the record goes when libmicrohttpd reports the close */
            shutdown(c->fd, SHUT_RDWR);
            c->cut = true;
            g->n_cut++;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

guard *guard_new(double idle_timeout, double request_timeout)
{
    guard *g = fault_calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->idle_timeout = idle_timeout;
    g->request_timeout = request_timeout;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, sweep, g) != 0) {
        guard_free(g);
        return NULL;
    }
    g->started = true;
    return g;
}

void guard_free(guard *g)
{
    if (!g)
        return;
    if (g->started) {
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
    }
    for (guard_conn *c = g->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

guard_conn *guard_open(guard *g, int fd)
{
    guard_conn *c = fault_calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->phase = PHASE_WAITING;
    c->since = engine_now_s();
    pthread_mutex_lock(&g->mu);
    c->next = g->head;
    if (g->head)
        g->head->prev = c;
    g->head = c;
    pthread_mutex_unlock(&g->mu);
    return c;
}

void guard_close(guard *g, guard_conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

static void set_phase(guard *g, guard_conn *c, int phase)
{
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    c->phase = phase;
    c->since = engine_now_s();
    pthread_mutex_unlock(&g->mu);
}

void guard_head_done(guard *g, guard_conn *c) { set_phase(g, c, PHASE_BODY); }
void guard_busy(guard *g, guard_conn *c) { set_phase(g, c, PHASE_BUSY); }
void guard_idle(guard *g, guard_conn *c) { set_phase(g, c, PHASE_WAITING); }

unsigned long guard_n_cut(guard *g)
{
    pthread_mutex_lock(&g->mu);
    unsigned long n = g->n_cut;
    pthread_mutex_unlock(&g->mu);
    return n;
}

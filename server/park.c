/* park.c - suspended connections and handler coroutines (park.h says
 * what it owns).
 *
 * Why one resumer thread and not a hook in the scheduler: the engine
 * already signals each request's eventfd (runtime/ owns that and knows
 * nothing of HTTP), so a thread that epolls every parked connection's
 * eventfds and client socket needs no change below server/, notices a
 * client that hangs up while its connection is suspended (libmicrohttpd
 * does not), and costs one thread for any number of connections.
 * Why coroutines: the route handlers wait for admission and, for a
 * non-streamed answer, for the whole generation, deep inside code that
 * would otherwise have to be cut into a state machine per route; on a
 * coroutine the same code parks the connection and the HTTP thread serves
 * others. A coroutine lives only while its handler waits: its stack is
 * reserved (not committed) memory, returned when the handler is done.
 */
#include "park.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <microhttpd.h>

#include "engine.h"

/* One parked connection; its fds are in the epoll set with data.ptr at
 * it. Linked under p->mu. */
typedef struct park_ent {
    struct MHD_Connection *conn;
    int fds[PARK_MAX_FDS + 1];
    int n;
    double deadline;
    bool fired;
    struct park_ent *prev, *next;
} park_ent;

struct parker {
    int ep;                     /* epoll set */
    int wake;                   /* eventfd: a nearer deadline, or stop */
    pthread_mutex_t mu;
    park_ent *head;
    int count;
    double sleep_until;         /* the resumer's wake-up (0: none), under mu */
    bool stop;
    pthread_t thread;
};

static void unlink_ent(parker *p, park_ent *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        p->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    p->count--;
}

/* Out of the epoll set, resumed, freed; under p->mu. */
static void fire(parker *p, park_ent *e)
{
    for (int i = 0; i < e->n; i++)
        (void)epoll_ctl(p->ep, EPOLL_CTL_DEL, e->fds[i], NULL);
    unlink_ent(p, e);
    MHD_resume_connection(e->conn);
    free(e);
}

static void *resumer(void *arg)
{
    parker *p = arg;
    struct epoll_event evs[256];
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        double now = engine_now_s(), soon = 0;
        for (park_ent *e = p->head, *nx; e; e = nx) {
            nx = e->next;
            if (e->deadline > 0 && e->deadline <= now)
                fire(p, e);
            else if (e->deadline > 0 && (soon == 0 || e->deadline < soon))
                soon = e->deadline;
        }
        p->sleep_until = soon;
        pthread_mutex_unlock(&p->mu);
        int ms = soon > 0 ? (int)((soon - now) * 1e3) + 1 : -1;
        int n = epoll_wait(p->ep, evs, 256, ms);
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < n; i++) {
            if (!evs[i].data.ptr) {     /* the wake fd */
                uint64_t v;
                (void)!read(p->wake, &v, sizeof v);
                continue;
            }
            park_ent *e = evs[i].data.ptr;
            e->fired = true;
        }
        /* an entry may come up twice in one batch: free after the batch */
        for (park_ent *e = p->head, *nx; e; e = nx) {
            nx = e->next;
            if (e->fired)
                fire(p, e);
        }
        pthread_mutex_unlock(&p->mu);
    }
}

parker *parker_new(void)
{
    parker *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->ep = epoll_create1(EPOLL_CLOEXEC);
    p->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (p->ep < 0 || p->wake < 0 || epoll_ctl(p->ep, EPOLL_CTL_ADD, p->wake, &ev) ||
        pthread_mutex_init(&p->mu, NULL))
        goto fail;
    if (pthread_create(&p->thread, NULL, resumer, p)) {
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    return p;
fail:
    if (p->ep >= 0)
        close(p->ep);
    if (p->wake >= 0)
        close(p->wake);
    free(p);
    return NULL;
}

static void poke(parker *p)
{
    uint64_t one = 1;
    (void)!write(p->wake, &one, sizeof one);
}

void parker_shutdown(parker *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    bool was = p->stop;
    p->stop = true;
    pthread_mutex_unlock(&p->mu);
    if (!was) {
        poke(p);
        pthread_join(p->thread, NULL);
    }
    pthread_mutex_lock(&p->mu);
    while (p->head)
        fire(p, p->head);
    pthread_mutex_unlock(&p->mu);
}

void parker_free(parker *p)
{
    if (!p)
        return;
    parker_shutdown(p);
    close(p->ep);
    close(p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int parker_park(parker *p, struct MHD_Connection *conn, const int *fds, int n, int sock, double deadline)
{
    if (!p || n < 0 || n > PARK_MAX_FDS)
        return -1;
    park_ent *e = calloc(1, sizeof(*e));     /* plain calloc: fault injection counts a request's own allocations */
    if (!e)
        return -1;
    e->conn = conn;
    e->deadline = deadline;
    pthread_mutex_lock(&p->mu);
    if (p->stop) {
        pthread_mutex_unlock(&p->mu);
        free(e);
        return -1;
    }
    /* suspended before any fd can fire its resume */
    MHD_suspend_connection(conn);
    e->next = p->head;
    if (p->head)
        p->head->prev = e;
    p->head = e;
    p->count++;
    for (int i = 0; i <= n; i++) {
        int fd = i < n ? fds[i] : sock;
        if (fd < 0)
            continue;
        struct epoll_event ev = {.events = i < n ? EPOLLIN : (EPOLLRDHUP | EPOLLHUP | EPOLLERR), .data.ptr = e};
        if (epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev) == 0)
            e->fds[e->n++] = fd;
        else
            e->fired = true;    /* cannot watch it: resume at once, the caller looks again */
    }
    bool nearer = deadline > 0 && (p->sleep_until == 0 || deadline < p->sleep_until);
    if (nearer)
        p->sleep_until = deadline;
    /* read before the unlock: once it is released the resumer may fire e
     * (one of its fds is ready already) and free it */
    const bool wake = nearer || e->fired;
    pthread_mutex_unlock(&p->mu);
    if (wake)
        poke(p);
    return 0;
}

int parker_count(parker *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    int n = p->count;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* ---------------------------------------------------------------------- */
/* Coroutines                                                             */
/* ---------------------------------------------------------------------- */

/* A handler's stack: reserved, committed as it is touched (a handler
 * that parses, renders a template and compiles a grammar uses tens of
 * KiB), with a guard page below it. */
#define PARK_CO_STACK (8u << 20)

struct park_co {
    ucontext_t self, caller;
    void *stack;
    int (*fn)(void *);
    void *arg;
    int rc;
    bool done;
};

static _Thread_local park_co *cur_co;

static void co_main(unsigned lo, unsigned hi)
{
    park_co *co = (park_co *)(((uintptr_t)hi << 32) | (uintptr_t)lo);
    co->rc = co->fn(co->arg);
    co->done = true;
    /* back to whoever resumed it last (uc_link is not used: caller moves) */
    swapcontext(&co->self, &co->caller);
}

static int co_switch(park_co *co, int *rc)
{
    park_co *outer = cur_co;
    cur_co = co;
    swapcontext(&co->caller, &co->self);
    cur_co = outer;
    if (!co->done)
        return 0;
    *rc = co->rc;
    munmap(co->stack, PARK_CO_STACK);
    free(co);
    return 1;
}

int park_co_start(park_co **out, int (*fn)(void *), void *arg, int *rc)
{
    park_co *co = calloc(1, sizeof(*co));
    if (!co)
        return -1;
    co->stack = mmap(NULL, PARK_CO_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                     -1, 0);
    if (co->stack == MAP_FAILED || getcontext(&co->self)) {
        if (co->stack != MAP_FAILED)
            munmap(co->stack, PARK_CO_STACK);
        free(co);
        return -1;
    }
    (void)mprotect(co->stack, 4096, PROT_NONE);
    co->fn = fn;
    co->arg = arg;
    co->self.uc_stack.ss_sp = co->stack;
    co->self.uc_stack.ss_size = PARK_CO_STACK;
    co->self.uc_link = NULL;
    uintptr_t v = (uintptr_t)co;
    makecontext(&co->self, (void (*)(void))co_main, 2, (unsigned)(v & 0xffffffffu), (unsigned)(v >> 32));
    *out = co;
    int r = co_switch(co, rc);
    if (r)
        *out = NULL;
    return r;
}

int park_co_resume(park_co *co, int *rc)
{
    return co_switch(co, rc);
}

bool park_co_yield(void)
{
    park_co *co = cur_co;
    if (!co)
        return false;
    swapcontext(&co->self, &co->caller);
    return true;
}

bool park_co_inside(void)
{
    return cur_co != NULL;
}

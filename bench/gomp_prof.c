/* gomp_prof.c - an LD_PRELOAD shim over libgomp: per process, how many
 * parallel regions and barriers ran, the wall time inside regions and
 * outside them (serial work, when the other threads idle), and per region
 * the time the threads waited at its closing barrier for the slowest one.
 *
 * Owns: counting GOMP_parallel, GOMP_barrier and the closing barriers of
 * worksharing loops (GOMP_loop_end), timing each region's body per thread
 * (the outlined function wrapped in a trampoline) and, at exit, printing
 * the totals and the regions by outlined function (its address relative to
 * the binary, for `addr2line -f -e BINARY`), most time first, to stderr.
 * Does not own: the engine (no engine code is compiled in: this measures
 * any OpenMP program built with GCC), the per-product figures (matmul.c's
 * HYSERVE_MMPROF build flag).
 *
 *   cc -O2 -shared -fPIC bench/gomp_prof.c -o build/bench/gomp_prof.so -ldl
 *   LD_PRELOAD=build/bench/gomp_prof.so build/hyserve generate ...
 * (`make bench-profile` does both; bench/profile.sh).
 * Env: GOMP_PROF_TOKENS (divide the counts by this many tokens).
 * Timing: CLOCK_MONOTONIC at each region's start and end and at each
 * thread's body start and end; a region's join wait is the sum over
 * threads of (region end - that thread's body end), its start delay the
 * sum of (body start - region start): the fork's wake-up. Waits at
 * barriers inside a body are counted, not timed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GP_FNS 256
#define GP_THREADS 64

typedef struct gp_fn {
    void (*fn)(void *);
    long calls;
    double wall, idle, lag;     /* seconds: region wall time, the threads' join waits and start delays summed */
} gp_fn;

static gp_fn gp_fns[GP_FNS];
static int gp_nfns;
static _Atomic long gp_barriers, gp_loop_ends, gp_parallel;
static double gp_in_regions, gp_t0;
static int gp_depth;            /* the master's nesting: only outermost regions are timed */

static double gp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct gp_call {
    void (*fn)(void *);
    void *data;
    double t0;                  /* the region's start */
    double end[GP_THREADS];     /* per thread: when its body returned */
    _Atomic double lag;         /* the threads' start delays summed (body start - t0) */
    _Atomic int n;              /* threads that ran the body */
} gp_call;

static void gp_body(void *p)
{
    gp_call *c = p;
    const double lag = gp_now() - c->t0;
    double old = atomic_load(&c->lag);
    while (!atomic_compare_exchange_weak(&c->lag, &old, old + lag))
        ;
    c->fn(c->data);
    const int i = atomic_fetch_add(&c->n, 1);
    if (i < GP_THREADS)
        c->end[i] = gp_now();
}

static gp_fn *gp_slot(void (*fn)(void *))
{
    for (int i = 0; i < gp_nfns; i++)
        if (gp_fns[i].fn == fn)
            return &gp_fns[i];
    if (gp_nfns == GP_FNS)
        return NULL;
    gp_fns[gp_nfns].fn = fn;
    return &gp_fns[gp_nfns++];
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags)
{
    static void (*real)(void (*)(void *), void *, unsigned, unsigned);
    if (!real)
        real = (void (*)(void (*)(void *), void *, unsigned, unsigned))dlsym(RTLD_NEXT, "GOMP_parallel");
    atomic_fetch_add(&gp_parallel, 1);
    if (gp_depth++ > 0) {       /* nested (or from another thread's region): counted only */
        real(fn, data, num_threads, flags);
        gp_depth--;
        return;
    }
    const double t0 = gp_now();
    gp_call c = { .fn = fn, .data = data, .t0 = t0 };
    real(gp_body, &c, num_threads, flags);
    const double t1 = gp_now();
    gp_depth--;
    gp_in_regions += t1 - t0;
    gp_fn *s = gp_slot(fn);
    if (!s)
        return;
    s->calls++;
    s->wall += t1 - t0;
    s->lag += c.lag;
    const int n = c.n < GP_THREADS ? c.n : GP_THREADS;
    for (int i = 0; i < n; i++)
        s->idle += t1 - c.end[i];
}

void GOMP_barrier(void);
void GOMP_barrier(void)
{
    static void (*real)(void);
    if (!real)
        real = (void (*)(void))dlsym(RTLD_NEXT, "GOMP_barrier");
    atomic_fetch_add(&gp_barriers, 1);
    real();
}

void GOMP_loop_end(void);
void GOMP_loop_end(void)
{
    static void (*real)(void);
    if (!real)
        real = (void (*)(void))dlsym(RTLD_NEXT, "GOMP_loop_end");
    atomic_fetch_add(&gp_loop_ends, 1);
    real();
}

static int gp_cmp(const void *a, const void *b)
{
    const double x = ((const gp_fn *)a)->wall, y = ((const gp_fn *)b)->wall;
    return x < y ? 1 : x > y ? -1 : 0;
}

__attribute__((constructor)) static void gp_start(void)
{
    gp_t0 = gp_now();
}

__attribute__((destructor)) static void gp_report(void)
{
    const double wall = gp_now() - gp_t0;
    const char *e = getenv("GOMP_PROF_TOKENS");
    const double tok = e && atof(e) > 0 ? atof(e) : 1;
    double idle = 0, lag = 0;
    for (int i = 0; i < gp_nfns; i++) {
        idle += gp_fns[i].idle;
        lag += gp_fns[i].lag;
    }
    fprintf(stderr,
            "gomp_prof: wall %.3f s, in regions %.3f s, outside %.3f s; per %g tokens: %.1f regions, "
            "%.1f explicit barriers (threads x calls), %.1f loop-end barriers (threads x calls), "
            "join waits %.3f ms and start delays %.3f ms (threads summed), region wall %.3f ms, outside %.3f ms\n",
            wall, gp_in_regions, wall - gp_in_regions, tok, (double)gp_parallel / tok, (double)gp_barriers / tok,
            (double)gp_loop_ends / tok, 1e3 * idle / tok, 1e3 * lag / tok, 1e3 * gp_in_regions / tok,
            1e3 * (wall - gp_in_regions) / tok);
    qsort(gp_fns, (size_t)gp_nfns, sizeof gp_fns[0], gp_cmp);
    for (int i = 0; i < gp_nfns && i < 24; i++) {
        Dl_info di;
        uintptr_t off = (uintptr_t)gp_fns[i].fn;
        const char *obj = "?";
        if (dladdr((void *)gp_fns[i].fn, &di) && di.dli_fname) {
            off -= (uintptr_t)di.dli_fbase;
            obj = strrchr(di.dli_fname, '/') ? strrchr(di.dli_fname, '/') + 1 : di.dli_fname;
        }
        fprintf(stderr, "gomp_prof: fn %s+0x%lx calls %.2f/token wall %.3f ms/token join-wait %.3f ms/token "
                "start-delay %.3f ms/token\n", obj, (unsigned long)off, (double)gp_fns[i].calls / tok,
                1e3 * gp_fns[i].wall / tok, 1e3 * gp_fns[i].idle / tok, 1e3 * gp_fns[i].lag / tok);
    }
}

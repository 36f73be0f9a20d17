/* fault.h - allocation failures on demand, for tests (the sqlite habit).
 *
 * fault_inject(n) arms a countdown: the n-th allocation after it that goes
 * through FAULT_OR() fails as if memory had run out, once; fault_inject(0)
 * disarms. The engine's allocations go through it: model load (gguf
 * reader, binding, tokenizer, cache and scratch), admission (cache_seq_new,
 * cache_make_room and the regions behind it, sched_submit, the grammar
 * compilers and the grammar cache) and a request's life on the scheduler
 * thread (sampler, events, text, the grammar matcher), so a test can fail
 * each of them in turn and see that nothing leaks and every invariant
 * still holds (tests/test_fault.c). The server allocates through the same
 * countdown: fault_malloc and friends below for its own buffers, and cJSON
 * through the hooks json_init (server/json.c) installs with
 * cJSON_InitHooks, whose malloc (json_malloc) calls fault_malloc, so one
 * count covers a request's whole life from its first byte to its last
 * event. The countdown is atomic, so exactly one allocation fails even
 * when several threads allocate; which one is then up to the race.
 * Disarmed it costs one relaxed load and a predictable branch per
 * allocation.
 */
#ifndef HYSERVE_FAULT_H
#define HYSERVE_FAULT_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

extern _Atomic int fault_countdown;     /* <= 0: disarmed */

/* Whether this allocation is the one to fail (counts it down). */
static inline bool fault_now(void)
{
    return atomic_load_explicit(&fault_countdown, memory_order_relaxed) > 0 &&
           atomic_fetch_sub(&fault_countdown, 1) == 1;
}

/* The value of expr, an allocation; NULL without evaluating it when the
 * armed countdown says this one fails. */
#define FAULT_OR(expr) (fault_now() ? NULL : (expr))

/* The C library's allocators behind the countdown, for code that has no
 * expression to wrap (the server's buffers, cJSON's hooks). Each returns
 * NULL when this allocation is the one to fail; fault_realloc then leaves
 * p as it was, as realloc does. */
static inline void *fault_malloc(size_t n) { return FAULT_OR(malloc(n)); }
static inline void *fault_calloc(size_t n, size_t size) { return FAULT_OR(calloc(n, size)); }
static inline void *fault_realloc(void *p, size_t n) { return FAULT_OR(realloc(p, n)); }
static inline char *fault_strdup(const char *s) { return FAULT_OR(strdup(s)); }

/* Room for one more element in an array p of *cap elements of elem bytes
 * that holds n: when it is full, the capacity doubles (from first when
 * the array is empty). Returns the array, moved or not, and updates *cap;
 * NULL when the allocation failed (or the capacity would pass INT_MAX),
 * with p and *cap left as they were. */
static inline void *fault_grow(void *p, int n, int *cap, size_t elem, int first)
{
    if (n < *cap)
        return p;
    if (*cap > INT_MAX / 2)
        return NULL;
    int c = *cap ? 2 * *cap : first;
    void *q = fault_realloc(p, (size_t)c * elem);
    if (q)
        *cap = c;
    return q;
}

/* Fail the n-th allocation from now (n >= 1), or disarm (n = 0). */
void fault_inject(int n);
/* Whether the armed failure has happened since fault_inject(n >= 1). */
bool fault_fired(void);
/* Builds with HYSERVE_CHECKS (CHECKS=1, SANITIZE=1): the first call arms
 * fault_inject(N) from HYSERVE_FAULT_NTH=N, so a test can fail the N-th
 * allocation of a live server (sched_start calls it, once the model, the
 * scheduler and its prefix store are made: N counts
 * the allocations of serving). Other builds ignore the variable. */
void fault_inject_from_env(void);
/* Builds with HYSERVE_CHECKS, when the server was started with
 * HYSERVE_FAULT_LIVE=1: whether the server honours the request header
 * X-Hyserve-Fault-Nth: n (fault_inject(n) before the request allocates
 * anything) and answers GET /debug/fault, so a test can fail each
 * allocation of a request in turn on one live server. Otherwise false. */
bool fault_live(void);
/* Disarms, keeping what the countdown said for fault_taken: whether the
 * armed failure happened, and how many allocations it still had to go. */
void fault_take(void);
void fault_taken(bool *fired, int *remaining);

#endif

/* fault.h - allocation failures on demand, for tests (the sqlite habit).
 *
 * fault_inject(n) arms a countdown: the n-th allocation after it that goes
 * through FAULT_OR() fails as if memory had run out, once; fault_inject(0)
 * disarms. The engine's allocations go through it: model load (gguf
 * reader, binding, tokenizer, cache and scratch), admission (cache_seq_new,
 * cache_make_room and the regions behind it, sched_submit) and a request's
 * life on the scheduler thread (sampler, events, text), so a test can fail
 * each of them in turn and see that nothing leaks and every invariant
 * still holds (tests/test_fault.c). The countdown is atomic, so exactly one
 * allocation fails even when several threads allocate; which one is then
 * up to the race. Disarmed it costs one relaxed load and a predictable
 * branch per allocation.
 */
#ifndef HYSERVE_FAULT_H
#define HYSERVE_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>

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

#endif

/* fault.h - allocation failures on demand, for tests (the sqlite habit).
 *
 * fault_inject(n) arms a countdown: the n-th allocation after it that goes
 * through FAULT_OR() fails as if memory had run out, once; fault_inject(0)
 * disarms. The allocations of admission go through it (cache_seq_new,
 * cache_make_room and the regions behind it, sched_submit), so a test can
 * fail each of them in turn and see that nothing leaks and every invariant
 * still holds. Disarmed it costs one predictable branch per allocation.
 * Not thread-safe: tests arm it while no other thread allocates.
 */
#ifndef HYSERVE_FAULT_H
#define HYSERVE_FAULT_H

#include <stdbool.h>

extern int fault_countdown;     /* 0: disarmed */

/* Whether this allocation is the one to fail (counts it down). */
static inline bool fault_now(void)
{
    return fault_countdown > 0 && --fault_countdown == 0;
}

/* The value of expr, an allocation; NULL without evaluating it when the
 * armed countdown says this one fails. */
#define FAULT_OR(expr) (fault_now() ? NULL : (expr))

/* Fail the n-th allocation from now (n >= 1), or disarm (n = 0). */
void fault_inject(int n);
/* Whether the armed failure has happened since fault_inject(n >= 1). */
bool fault_fired(void);

#endif

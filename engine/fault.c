/* fault.c - the countdown behind fault.h. */
#include "fault.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

_Atomic int fault_countdown;
static bool armed;

void fault_inject(int n)
{
    atomic_store(&fault_countdown, n > 0 ? n : 0);
    armed = n > 0;
}

bool fault_fired(void)
{
    return armed && atomic_load(&fault_countdown) <= 0;
}

void fault_inject_from_env(void)
{
#ifdef HYSERVE_CHECKS
    static atomic_flag read = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&read))
        return;
    const char *s = getenv("HYSERVE_FAULT_NTH");
    if (!s || !*s)
        return;
    char *end;
    const long n = strtol(s, &end, 10);
    if (*end != '\0' || n <= 0 || n > INT_MAX) {
        fprintf(stderr, "HYSERVE_FAULT_NTH=%s: not a count from 1; no allocation will fail\n", s);
        return;
    }
    fault_inject((int)n);
    fprintf(stderr, "HYSERVE_FAULT_NTH=%ld: the engine's allocation %ld from now fails (test build)\n", n, n);
#endif
}

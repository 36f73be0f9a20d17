/* fault.c - the countdown behind fault.h. */
#include "fault.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    fprintf(stderr, "HYSERVE_FAULT_NTH=%ld: allocation %ld from now (engine or server) fails (test build)\n", n, n);
#endif
}

bool fault_live(void)
{
#ifdef HYSERVE_CHECKS
    static _Atomic int live = -1;   /* -1: the variable not read yet */
    int v = atomic_load(&live);
    if (v < 0) {
        const char *s = getenv("HYSERVE_FAULT_LIVE");
        v = s && !strcmp(s, "1");
        atomic_store(&live, v);
    }
    return v == 1;
#else
    return false;
#endif
}

static _Atomic int taken_fired, taken_remaining;

void fault_take(void)
{
    const int n = atomic_exchange(&fault_countdown, 0);
    atomic_store(&taken_fired, armed && n <= 0);
    atomic_store(&taken_remaining, n > 0 ? n : 0);
    armed = false;
}

void fault_taken(bool *fired, int *remaining)
{
    *fired = atomic_load(&taken_fired) != 0;
    *remaining = atomic_load(&taken_remaining);
}

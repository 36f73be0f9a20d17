/* fault.c - the countdown behind fault.h. */
#include "fault.h"

int fault_countdown;
static bool armed;

void fault_inject(int n)
{
    fault_countdown = n > 0 ? n : 0;
    armed = n > 0;
}

bool fault_fired(void)
{
    return armed && fault_countdown == 0;
}

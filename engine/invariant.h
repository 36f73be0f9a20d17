/* invariant.h - where the invariant checkers run.
 *
 * A checker (cache_check, sched_check) is a predicate that walks one
 * structure and returns false at the first broken invariant, after saying
 * which on stderr; callers wrap it in assert(), the sqlite habit. Unit
 * tests call the checkers directly on corrupted copies.
 *
 * Two kinds of call site:
 *   INVARIANT(x)       where a sequence or a request is admitted or freed:
 *                      once per request, and a checker costs O(live
 *                      sequences + their pages), so these run in every build
 *                      that keeps assert() (the plain -O2 -g build too) and
 *                      go away under NDEBUG.
 *   INVARIANT_STEP(x)  on the path every step takes (a reservation that
 *                      grows a sequence, the end of a scheduler step): only
 *                      with HYSERVE_CHECKS, which SANITIZE=1 and CHECKS=1
 *                      set, so the plain build's decode step pays nothing.
 */
#ifndef HYSERVE_INVARIANT_H
#define HYSERVE_INVARIANT_H

#include <assert.h>

#define INVARIANT(x) assert(x)

#if defined(HYSERVE_CHECKS) && !defined(NDEBUG)
#define INVARIANT_STEP(x) assert(x)
#else
#define INVARIANT_STEP(x) ((void)0)
#endif

#endif

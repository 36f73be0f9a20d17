/* test.h - a tiny test registry. Each TEST() registers itself at load
 * time (constructor), with its file, so test files need no central list.
 * The runner (tests/runner.c) runs them all, or those named on its command
 * line (a full name, a part of names, or -m MODULE for tests/test_MODULE.c;
 * --list prints them), and prints "unit: N passed, N failed, N skipped"
 * last. A test that cannot run here (the CPU lacks the kernel it tests, the
 * build or the kernel cannot give what it needs) says so with SKIP(reason):
 * it is counted skipped, not passed. */
#ifndef HYSERVE_TEST_H
#define HYSERVE_TEST_H

#include <math.h>
#include <stdio.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, const char *file);
void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern int test_current_failed;

#define TEST(name)                                                        \
    static void name(void);                                               \
    __attribute__((constructor)) static void name##_reg(void)             \
    { test_register(#name, name, __FILE__); }                             \
    static void name(void)

#define CHECK(cond)                                                       \
    do { if (!(cond)) { test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond); return; } } while (0)
#define CHECK_MSG(cond, ...)                                              \
    do { if (!(cond)) { test_fail(__FILE__, __LINE__, __VA_ARGS__); return; } } while (0)
#define CHECK_NEAR(a, b, tol)                                             \
    do { double a_ = (a), b_ = (b);                                       \
         if (!(fabs(a_ - b_) <= (tol))) {                                 \
             test_fail(__FILE__, __LINE__, "%s = %.9g, expected %s = %.9g (tol %g)", \
                       #a, a_, #b, b_, (double)(tol)); return; } } while (0)

/* The test cannot run here: marks it skipped, with the reason (printf
 * style) on the runner's "skip NAME: reason" line, and returns. A check
 * that failed before it still makes the test FAIL. */
#define SKIP(...)                                                         \
    do { test_skip(__VA_ARGS__); return; } while (0)

/* Directory for scratch files ("tests/tmp" unless $TEST_TMPDIR). */
const char *test_tmpdir(void);

#endif

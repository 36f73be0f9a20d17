/* runner.c - runs every registered TEST (see test.h). */
#include "test.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_TESTS 1024

static struct { const char *name; test_fn fn; } tests[MAX_TESTS];
static int n_tests;
int test_current_failed;

void test_register(const char *name, test_fn fn)
{
    if (n_tests < MAX_TESTS) {
        tests[n_tests].name = name;
        tests[n_tests].fn = fn;
        n_tests++;
    }
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    test_current_failed = 1;
}

const char *test_tmpdir(void)
{
    const char *d = getenv("TEST_TMPDIR");
    if (!d || !*d)
        d = "tests/tmp";
    mkdir(d, 0755);
    return d;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0;
    /* constructors run in link order; sort for a stable report */
    qsort(tests, (size_t)n_tests, sizeof tests[0], cmp_name);
    for (int i = 0; i < n_tests; i++) {
        if (argc > 1 && !strstr(tests[i].name, argv[1]))
            continue;
        test_current_failed = 0;
        tests[i].fn();
        printf("%s %s\n", test_current_failed ? "FAIL" : "ok  ", tests[i].name);
        fflush(stdout);
        if (test_current_failed)
            failed++;
        else
            passed++;
    }
    printf("unit: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

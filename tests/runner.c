/* runner.c - runs the registered TESTs (see test.h): all of them, or those
 * the command line selects. A line a test, "ok   NAME", "FAIL NAME" (the
 * failed checks above it) or "skip NAME: reason" (SKIP: it could not run
 * here), and last "unit: N passed, N failed, N skipped", counting tests.
 *
 *   hyserve-tests                      every test
 *   hyserve-tests NAME...              a NAME that is a test's full name runs that
 *                                      test only; any other NAME runs every test
 *                                      whose name contains it
 *   hyserve-tests -m MODULE...         the tests of tests/test_MODULE.c
 *   hyserve-tests --list [NAME...]     print the selected names, one a line, and
 *                                      run nothing (with -m too)
 * A NAME or MODULE that selects no test is an error (exit 2): a typo must not
 * pass as an empty run. */
#include "test.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_TESTS 1024

static struct {
    const char *name;
    test_fn fn;
    const char *module;     /* "cache" for tests/test_cache.c */
    size_t module_len;
} tests[MAX_TESTS];
static int n_tests;
int test_current_failed;
static bool test_current_skipped;
static char skip_reason[256];

void test_register(const char *name, test_fn fn, const char *file)
{
    if (n_tests >= MAX_TESTS)
        return;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (!strncmp(base, "test_", 5))
        base += 5;
    const char *dot = strrchr(base, '.');
    tests[n_tests].name = name;
    tests[n_tests].fn = fn;
    tests[n_tests].module = base;
    tests[n_tests].module_len = dot ? (size_t)(dot - base) : strlen(base);
    n_tests++;
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

void test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(skip_reason, sizeof skip_reason, fmt, ap);
    va_end(ap);
    test_current_skipped = true;
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

static bool is_name(const char *s)
{
    for (int i = 0; i < n_tests; i++)
        if (!strcmp(tests[i].name, s))
            return true;
    return false;
}

/* Whether selector sel (a name, or a module with by_module) picks test i. */
static bool picks(int i, const char *sel, bool by_module)
{
    if (by_module)
        return strlen(sel) == tests[i].module_len && !strncmp(tests[i].module, sel, tests[i].module_len);
    return is_name(sel) ? !strcmp(tests[i].name, sel) : strstr(tests[i].name, sel) != NULL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: hyserve-tests [--list] [-m MODULE]... [NAME]...\n"
               "  NAME       a test's full name runs that test; otherwise every test whose name contains NAME\n"
               "  -m MODULE  the tests of tests/test_MODULE.c (e.g. -m cache)\n"
               "  --list     print the selected test names instead of running them\n");
}

int main(int argc, char **argv)
{
    bool list = false;
    const char *sel[MAX_TESTS];
    bool sel_module[MAX_TESTS];
    int n_sel = 0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--list") || !strcmp(argv[a], "-l")) {
            list = true;
        } else if (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[a], "-m") && a + 1 < argc && n_sel < MAX_TESTS) {
            sel_module[n_sel] = true;
            sel[n_sel++] = argv[++a];
        } else if (argv[a][0] == '-') {
            usage(stderr);
            return 2;
        } else if (n_sel < MAX_TESTS) {
            sel_module[n_sel] = false;
            sel[n_sel++] = argv[a];
        }
    }
    /* constructors run in link order; sort for a stable report */
    qsort(tests, (size_t)n_tests, sizeof tests[0], cmp_name);
    static bool run[MAX_TESTS];
    for (int i = 0; i < n_tests; i++)
        run[i] = n_sel == 0;
    for (int k = 0; k < n_sel; k++) {
        bool any = false;
        for (int i = 0; i < n_tests; i++)
            if (picks(i, sel[k], sel_module[k]))
                run[i] = any = true;
        if (!any) {
            fprintf(stderr, "hyserve-tests: no test %s '%s' (--list shows the names)\n",
                    sel_module[k] ? "is in module" : "matches", sel[k]);
            return 2;
        }
    }
    if (list) {
        for (int i = 0; i < n_tests; i++)
            if (run[i])
                printf("%s\n", tests[i].name);
        return 0;
    }
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n_tests; i++) {
        if (!run[i])
            continue;
        test_current_failed = 0;
        test_current_skipped = false;
        tests[i].fn();
        if (test_current_failed) {
            printf("FAIL %s\n", tests[i].name);
            failed++;
        } else if (test_current_skipped) {
            printf("skip %s: %s\n", tests[i].name, skip_reason);
            skipped++;
        } else {
            printf("ok   %s\n", tests[i].name);
            passed++;
        }
        fflush(stdout);
    }
    printf("unit: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

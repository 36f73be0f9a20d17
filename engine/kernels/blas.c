/* blas.c - the one BLAS wrapper: OpenBLAS's threads, its core, sgemm, strsm. */
#include "blas.h"

#include <cblas.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#include "share.h"

static int n_threads_set = 1;

void blas_set_threads(int n)
{
    if (n <= 0)
        n = omp_get_num_procs();
    n_threads_set = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int blas_get_threads(void)
{
    return n_threads_set;
}

/* share.h's switch: -1 until HYSERVE_SPLIT is read */
static _Atomic int split_fixed = -1;

bool share_fixed(void)
{
    int f = atomic_load_explicit(&split_fixed, memory_order_relaxed);
    if (f < 0) {
        const char *e = getenv("HYSERVE_SPLIT");
        f = e && !strcmp(e, "fixed");
        atomic_store_explicit(&split_fixed, f, memory_order_relaxed);
    }
    return f;
}

void share_set_fixed(bool fixed)
{
    atomic_store_explicit(&split_fixed, fixed, memory_order_relaxed);
}

/* How OpenMP's threads wait (at a barrier, or for the next parallel
 * region) when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set.
 * libgomp's own default spins 300000 iterations of its pause loop (~3 ms)
 * before sleeping, which assumes each thread has a core: with more
 * runnable threads than cores (a build or a second server beside this
 * one) the thread that arrives first spins out its time slice while the
 * one it waits for is queued behind it. Measured (bench/threads_ab.sh,
 * Q4_K bench model, machine at load ~10 on 2 cores from other jobs),
 * decode tok/s 1 thread -> 2 threads: libgomp's default 20.7-22.8 -> 0.9,
 * GOMP_SPINCOUNT=10000 (~0.1 ms) 22.3-22.5 -> 5.3-6.0, passive 17.6-22.6
 * -> 15.9-24.5. Passive waiting puts a futex wake-up on each of the
 * hundreds of parallel regions of a token, which a quiet machine pays
 * for (engine.c: ~100 spins, 20-21 -> 31-33 ms a token), so it is taken
 * only when the machine is busy when the process starts (the 1-minute
 * load average at or above the CPUs online); otherwise the short spin,
 * which waits out the few microseconds a region's threads take to meet on
 * a quiet machine and, under load that comes later, collapses 6 times
 * less than libgomp's. docs/performance.md section 8. */
#define BLAS_GOMP_SPINCOUNT "10000"

/* true when the 1-minute load average is at or above the CPUs online */
static bool cores_busy(void)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double load = 0.0;
    if (!f)
        return false;
    const bool ok = fscanf(f, "%lf", &load) == 1;
    fclose(f);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return ok && n > 0 && load >= (double)n;
}

/* true when OpenBLAS fell back to generic SSE kernels on a CPU with AVX2+FMA */
static bool core_is_generic(const char *core)
{
    static const char *const generic[] = { "prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                                           "sandybridge", "katmai", "coppermine", "northwood", "banias" };
    bool weak = false;
    for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
        weak |= !strcasecmp(core, generic[i]);
    __builtin_cpu_init();
    return weak && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* A process started through /proc/self/exe (ours before it exec'd by the
 * real path, or a caller's) is named "exe": name it after argv[0]. */
static void name_after_argv0(const char *argv0)
{
    char comm[32] = "";
    FILE *f = fopen("/proc/self/comm", "r");
    if (!f)
        return;
    if (!fgets(comm, sizeof comm, f))
        comm[0] = '\0';
    fclose(f);
    if (strcmp(comm, "exe\n") || !argv0 || !*argv0)
        return;
    const char *base = strrchr(argv0, '/') ? strrchr(argv0, '/') + 1 : argv0;
    if (*base)
        (void)prctl(PR_SET_NAME, base, 0, 0, 0);   /* the kernel keeps 15 bytes */
}

void blas_process_init(char **argv)
{
    const char *core = openblas_get_corename();
    const char *wait_var = NULL;        /* the OpenMP variable set here, if any */
    bool set_core = false;
    if (!argv)
        return;
    name_after_argv0(argv[0]);
    if (!getenv("OPENBLAS_CORETYPE") && core && core_is_generic(core)) {
        const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
        setenv("OPENBLAS_CORETYPE", avx512 ? "SkylakeX" : "Haswell", 1);
        set_core = true;
    }
    if (!getenv("GOMP_SPINCOUNT") && !getenv("OMP_WAIT_POLICY")) {
        const bool busy = cores_busy();
        wait_var = busy ? "OMP_WAIT_POLICY" : "GOMP_SPINCOUNT";
        setenv(wait_var, busy ? "passive" : BLAS_GOMP_SPINCOUNT, 1);
    }
    /* both libraries read their environment when they load, before
     * main(): only a new image of the program sees it */
    if (set_core || wait_var) {
        /* by the binary's real path: exec names the process after the
         * file it runs, and "exe" (of /proc/self/exe) is not what pgrep,
         * top or ps look for; /proc/self/exe when the path is gone (a
         * rebuilt binary: "... (deleted)") */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            if (access(self, X_OK) == 0)
                execv(self, argv);
        }
        execv("/proc/self/exe", argv);
    }
    if (set_core)                       /* exec failed: carry on as loaded */
        unsetenv("OPENBLAS_CORETYPE");
    if (wait_var)
        unsetenv(wait_var);
}

const char *blas_core_name(void)
{
    return openblas_get_corename();
}

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
          const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void trsm_lower_unit(int M, int N, const float *A, int lda, float *B, int ldb)
{
    cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, M, N, 1.0f, A, lda, B, ldb);
}

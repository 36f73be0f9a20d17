/* blas.c - the one BLAS wrapper: OpenBLAS's threads, its core, sgemm, strsm. */
#include "blas.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

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

const char *blas_choose_core(char **argv)
{
    const char *core = openblas_get_corename();
    if (!argv || getenv("OPENBLAS_CORETYPE") || !core)
        return core;
    static const char *const generic[] = { "prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                                           "sandybridge", "katmai", "coppermine", "northwood", "banias" };
    bool weak = false;
    for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
        weak |= !strcasecmp(core, generic[i]);
    __builtin_cpu_init();
    if (!weak || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return core;
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    setenv("OPENBLAS_CORETYPE", avx512 ? "SkylakeX" : "Haswell", 1);
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");     /* exec failed: carry on with what OpenBLAS chose */
    return core;
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

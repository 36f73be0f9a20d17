/* blas.h - the one BLAS wrapper.
 *
 * Owns: every call into OpenBLAS (sgemm, strsm), the thread count it and
 * OpenMP run with, the choice of its core and of libgomp's spin-wait at
 * start-up. Nothing else in the engine includes cblas.h.
 */
#ifndef HYSERVE_BLAS_H
#define HYSERVE_BLAS_H

#include <stdbool.h>

/* Set the thread count for OpenMP and OpenBLAS once. */
void blas_set_threads(int n);
int blas_get_threads(void);

/* Process start-up, first thing in main(): the threading libraries'
 * defaults, which they read from the environment when they load.
 * OpenBLAS picks its kernels then: DYNAMIC_ARCH builds that do not know
 * the CPU (0.3.21 on Sapphire/Emerald Rapids under KVM, say) fall back to
 * SSE3 "Prescott" kernels, three to five times slower than the AVX2/AVX-512
 * ones the CPU can run; if OPENBLAS_CORETYPE is unset and that happened,
 * set it (SkylakeX with AVX-512 F/BW/VL/DQ, Haswell with AVX2+FMA). If
 * neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set, choose how OpenMP's
 * threads wait (libgomp's ~3 ms spin collapses multi-thread decode when
 * the cores are shared, blas.c): OMP_WAIT_POLICY=passive when the load
 * average at start is at or above the CPUs online, else a short spin
 * (GOMP_SPINCOUNT=BLAS_GOMP_SPINCOUNT). Then
 * re-execute the program with the same argv; on success this does not
 * return. argv NULL: nothing. */
void blas_process_init(char **argv);
/* the core OpenBLAS runs with ("Haswell", "SkylakeX", ...) */
const char *blas_core_name(void);

/* C = alpha * op(A) op(B) + beta * C, row-major, op = transpose if ta/tb.
 * A is M x K after op, B is K x N after op. The one place BLAS is called. */
void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
          const float *B, int ldb, float beta, float *C, int ldc);

/* B <- A^-1 B with A (M x M) unit lower triangular (diagonal and upper
 * part never read), B M x N, row-major. BLAS strsm. */
void trsm_lower_unit(int M, int N, const float *A, int lda, float *B, int ldb);

#endif

/* cpu.h - which hand-written kernels this process runs. */
#ifndef HYSERVE_CPU_H
#define HYSERVE_CPU_H

/* "avx512", "avx2" or "scalar": the widest hand-written kernels in use */
const char *simd_name(void);

#endif

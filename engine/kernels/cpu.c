/* cpu.c - the name of the kernels this process runs. */
#include "cpu.h"

#include "simd.h"
#include "simd512.h"
#include "simd_amx.h"

const char *simd_name(void)
{
    if (simd_amx())
        return simd_vnni() ? "avx512+vnni+amx" : "avx512+amx";
    if (simd_avx512())
        return simd_vnni() ? "avx512+vnni" : "avx512";
    if (simd_avx2())
        return simd_vnni() ? "avx2+vnni" : "avx2";
    return "scalar";
}

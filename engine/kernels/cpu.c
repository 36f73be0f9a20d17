/* cpu.c - probing the CPU and filling the kernel table of cpu.h.
 *
 * The level is a set of switches (what the CPU has, less what HYSERVE_SIMD
 * and the tests turn off); cpu_select turns them into `cpu_kern`, and runs at
 * start-up and after every switch.
 * ref: Linux Documentation/arch/x86/xstate.rst (ARCH_REQ_XCOMP_PERM).
 */
#include "cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "attn.h"
#include "quant.h"
#include "simd.h"
#include "simd512.h"
#include "simd_bf16.h"
#include "simd_kquant.h"
#include "vecmath.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* every entry at the scalar level: the references (dnet_step NULL) */
#define SCALAR_KERNELS                                                                                  \
    .sumsq = sumsq_ref, .scale = scale_ref, .silu_mul = silu_mul_ref, .sigmoid_mul = sigmoid_mul_ref,   \
    .dequant_row = dequant_row, .dot_row = dot_row, .quantize_row = quantize_row,                       \
    .quantize_act_q8 = quantize_act_q8_ref, .dot_q8_0_act = dot_q8_0_act_ref,                           \
    .quantize_act_q8k = quantize_act_q8k_ref, .dot_kq_act = dot_kq_act_ref, .dot_q4_0_act = dot_q4_0_act_ref, \
    .exp_block = attn_exp_block_ref

/* The scalar references until the constructor has probed the CPU. */
cpu_kernels cpu_kern = { .name = "scalar", SCALAR_KERNELS };

/* what the CPU has (set once by the constructor, read-only after) */
static bool has_avx2, has_vnni, has_avx512, has_avx512_vnni, has_amx, has_amx_bf16, has_amx_f16, has_avx512_bf16;
/* the switches: HYSERVE_SIMD at start-up, then simd_set_* */
static bool avx2_on, vnni_on, avx512_on, amx_on;
/* BF16 decode on vdpbf16ps: the start-up choice, the switch, and why */
static bool bf16_dot_auto, bf16_dot_on;
static char bf16_dot_auto_why[96];
static const char *bf16_dot_why = "fma (no AVX512_BF16)";
static char kern_name[48];

static bool env_is(const char *v)
{
    const char *env = getenv("HYSERVE_SIMD");
    return env && !strcmp(env, v);
}

/* HYSERVE_SIMD=avx2 or =avx2+vnni: the 256-bit levels, no AVX-512 (nor
 * AMX, AVX512-VNNI, AVX512_BF16); avx2+vnni keeps AVX-VNNI where the CPU
 * has it (Alder Lake to Arrow Lake clients, Sierra Forest), avx2 does not */
static bool env_256(void)
{
    return env_is("avx2") || env_is("avx2+vnni");
}

static const char *level_name(const cpu_features *f)
{
    if (f->amx)
        return f->vnni || f->avx512_vnni ? "avx512+vnni+amx" : "avx512+amx";
    if (f->avx512)
        return f->vnni || f->avx512_vnni ? "avx512+vnni" : "avx512";
    if (f->avx2)
        return f->vnni ? "avx2+vnni" : "avx2";
    return "scalar";
}

/* The switches -> the features in use -> the kernels. */
static void cpu_select(void)
{
    cpu_features f = { 0 };
    f.avx2 = avx2_on;
    f.vnni = vnni_on && has_vnni && f.avx2;
    f.avx512 = avx512_on && f.avx2;
    /* AVX512-VNNI stands on its own: Zen 4, Ice Lake and Cascade Lake have
     * it without the 256-bit AVX-VNNI, and their 512-bit int8 kernels
     * (Q8_0 panels and decode steps, the K-quant dots) need only it */
    f.avx512_vnni = vnni_on && has_avx512_vnni && f.avx512;
    f.amx = amx_on && f.avx512;
    f.amx_bf16 = has_amx_bf16 && f.amx;
    f.amx_f16 = has_amx_f16 && f.amx;
    f.avx512_bf16 = has_avx512_bf16 && f.avx512;
    f.bf16_dot = bf16_dot_on && f.avx512_bf16;
    bf16_dot_why = !f.avx512_bf16 ? "fma (no AVX512_BF16 in use)"
                   : bf16_dot_on == bf16_dot_auto ? bf16_dot_auto_why
                   : f.bf16_dot ? "vdpbf16ps (forced)" : "fma (forced)";
    snprintf(kern_name, sizeof kern_name, "%s%s", level_name(&f), f.bf16_dot ? "+bf16dp" : "");

    cpu_kernels k = { .on = f, .name = kern_name, SCALAR_KERNELS };
    if (f.avx2) {
        k.sumsq = avx2_sumsq;
        k.scale = avx2_scale;
        k.silu_mul = avx2_silu_mul;
        k.sigmoid_mul = avx2_sigmoid_mul;
        k.dequant_row = dequant_row_avx2;
        k.dot_row = dot_row_avx2;
        k.quantize_row = quantize_row_avx2;
        k.quantize_act_q8 = avx2_quantize_act_q8;
        k.dot_q8_0_act = avx2_dot_q8_0_act;
        k.quantize_act_q8k = avx2_quantize_act_q8k;
        k.dot_kq_act = avx2_dot_kq_act;
        k.dot_kq_act_rows = avx2_dot_kq_act_rows;
        k.dot_q4_0_act = avx2_dot_q4_0_act;
        k.exp_block = attn_exp_block_avx2;
        k.dnet_step = avx2_dnet_step;
        k.dnet_step_bf16 = avx2_dnet_step_bf16;
        k.kda_step = avx2_kda_step;
        k.mamba2_step = avx2_mamba2_step;
        k.mamba1_scan = avx2_mamba1_scan;
    }
    if (f.avx512) {
        k.dequant_row = dequant_row_avx512;
        k.dnet_step_bf16_x16 = avx512_dnet_step_bf16;
        k.dot_kq_act = f.avx512_vnni ? avx512_dot_kq_act_vnni : avx512_dot_kq_act;
        k.dot_kq_act_rows = NULL;       /* the AVX-512 one-token kernel row by row */
        k.dot_kq_act_tokens = f.avx512_vnni ? avx512_dot_kq_act_tokens_vnni : avx512_dot_kq_act_tokens;
        k.dot_q4_0_act = f.avx512_vnni ? avx512_dot_q4_0_act_vnni : avx512_dot_q4_0_act;
    }
    cpu_kern = k;
}

__attribute__((constructor)) static void cpu_init(void)
{
    __builtin_cpu_init();
    has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    /* HYSERVE_SIMD=avx2 means the AVX2 baseline: no AVX-512, no VNNI */
    has_vnni = has_avx2 && __builtin_cpu_supports("avxvnni") && !env_is("avx2");
    has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    has_avx512_vnni = has_avx512 && __builtin_cpu_supports("avx512vnni");
    if (!env_is("0") && !env_256() && !env_is("avx512") && __builtin_cpu_supports("amx-tile") &&
        __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw")) {
        /* Linux hands out the 8 KiB tile state only on request (5.16+);
         * without it the first tile instruction would kill the process */
        has_amx = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        has_amx_bf16 = has_amx && __builtin_cpu_supports("amx-bf16");
        has_amx_f16 = has_amx_bf16 && __builtin_cpu_supports("avx512bf16");
    }
    has_avx512_bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16") && !env_256() && !env_is("0");
    /* BF16 decode: forced by HYSERVE_BF16_DOT, else measured (a few ms) */
    const char *bd = getenv("HYSERVE_BF16_DOT");
    if (!has_avx512_bf16) {
        snprintf(bf16_dot_auto_why, sizeof bf16_dot_auto_why, "fma (no AVX512_BF16)");
    } else if (bd && (!strcmp(bd, "dp") || !strcmp(bd, "fma"))) {
        bf16_dot_auto = !strcmp(bd, "dp");
        snprintf(bf16_dot_auto_why, sizeof bf16_dot_auto_why, "%s (HYSERVE_BF16_DOT=%s)",
                 bf16_dot_auto ? "vdpbf16ps" : "fma", bd);
    } else {
        const double r = bf16_dot_speedup();
        bf16_dot_auto = r > 1.05;       /* a clear win only: the FMA kernel is exact */
        snprintf(bf16_dot_auto_why, sizeof bf16_dot_auto_why, "%s (measured %.2fx the speed of the FMA kernel)",
                 bf16_dot_auto ? "vdpbf16ps" : "fma", r);
    }
    bf16_dot_on = bf16_dot_auto;
    avx2_on = has_avx2 && !env_is("0");
    vnni_on = (has_vnni || has_avx512_vnni) && !env_is("avx2");
    avx512_on = has_avx512 && !env_256();
    amx_on = has_amx;
    cpu_select();
}

void simd_set_enabled(bool on)
{
    avx2_on = on && has_avx2;
    cpu_select();
}

void simd_set_vnni(bool on)
{
    vnni_on = on && (has_vnni || has_avx512_vnni) && !env_is("avx2");
    cpu_select();
}

void simd_set_avx512(bool on)
{
    avx512_on = on && has_avx512 && !env_256();
    cpu_select();
}

void simd_set_amx(bool on)
{
    amx_on = on && has_amx;
    cpu_select();
}

void simd_set_bf16_dot(int mode)
{
    bf16_dot_on = mode < 0 ? bf16_dot_auto : mode > 0;
    cpu_select();
}

const char *simd_bf16_dot_why(void)
{
    return bf16_dot_why;
}

const char *simd_name(void)
{
    return cpu_kern.name;
}

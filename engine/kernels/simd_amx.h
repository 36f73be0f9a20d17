/* simd_amx.h - Intel AMX (tile) fast paths for Q8_0 and BF16 weights in
 * decode steps of several sequences.
 *
 * Owns: laying out activations as tiles (the AMX feature checks and the
 * tile permission request are cpu.c's), and the rows x tokens
 * products on int8 (Q8_0) and bf16 tiles declared here. Does not own:
 * choosing the kernel per shape (matmul.c calls these for decode steps of 2
 * or more tokens of a decode step) or quantizing the
 * activations (quant.c: quantize_act_q8, the same int8 activations the
 * one-token matrix-vector product uses, so a sequence decoded alone or in
 * a batch sees the same int8 inputs).
 *
 * HYSERVE_SIMD=avx2 or =0 turns AMX off, as it turns off AVX-512.
 * ref: Intel Architecture Instruction Set Extensions Programming Reference,
 * chapter 3 (AMX: LDTILECFG palette 1, TILELOADD, TDPBSSD, TDPBF16PS,
 * TILESTORED); Linux Documentation/arch/x86/xstate.rst
 * (ARCH_REQ_XCOMP_PERM).
 */
#ifndef HYSERVE_SIMD_AMX_H
#define HYSERVE_SIMD_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* simd_amx(), simd_amx_bf16(), simd_amx_f16() and simd_set_amx */
#include "cpu.h"

/* Bytes of shared scratch amx_q8_0_prepare needs for n_tok tokens of n_in
 * inputs (18 n_in per group of 16 tokens, plus 64). */
size_t amx_q8_0_prep_bytes(int n_in, int n_tok);

/* Lay out n_tok tokens of int8 activations (xq: token t at xq + t * n_in,
 * scales xd + t * (n_in / 32), from quantize_act_q8) as the B tiles of the
 * product, in groups of 16 tokens (the last group padded with zeros):
 * prep gets amx_q8_0_prep_bytes(n_in, n_tok) bytes. Once per matmul,
 * before the threads split the rows. */
void amx_q8_0_prepare(const int8_t *xq, const float *xd, int n_in, int n_tok, void *prep);

/* Y[t * ldy + r] = sum_b dw[r][b] dx[t][b] sum_j w[r][b][j] q[t][b][j] for
 * r < n_rows (a multiple of 16), t < n_tok: rows of Q8_0 blocks row_bytes
 * apart from W, activations from amx_q8_0_prepare. Each 16-row tile meets
 * every group of 16 tokens while its rows are in cache. The block sums are
 * exact integers (TDPBSSD); each is scaled in float and summed over the
 * blocks in order. Thread-safe: each calling thread loads its own tile
 * configuration and releases it. ref: dot_q8_0_act_ref() in quant.c per
 * row and token. */
void amx_q8_0_rows_x_tokens(const void *W, size_t row_bytes, int n_rows, int n_in, const void *prep,
                            int n_tok, float *Y, int ldy);

/* ---- BF16 weights (where simd_amx_bf16()) ---- */
size_t amx_bf16_prep_bytes(int n_in, int n_tok);  /* 32 n_in per group of 16 tokens, plus 64 */
/* n_tok tokens of f32 activations (token t at X + t * n_in, n_in a
 * multiple of 32) rounded to bf16 (nearest even) and laid out as B tiles
 * in groups of 16 tokens, the last one padded with zeros. prep_lo, when
 * not NULL (amx_bf16_prep_bytes too), gets the residuals x - bf16(x)
 * rounded to bf16 in the same layout. */
void amx_bf16_prepare(const float *X, int n_in, int n_tok, void *prep, void *prep_lo);
/* Y[t * ldy + r] = sum_i w[r][i] bf16(x[t][i]) for r < n_rows (a multiple
 * of 16), t < n_tok: rows of n_in bf16 weights row_bytes apart. TDPBF16PS
 * forms each product of two bf16 exactly and adds in f32; odd and even
 * 32-wide chunks go to two accumulators, added at the end. ref: dot_row()
 * of the row with the rounded activations. */
void amx_bf16_rows_x_tokens(const void *W, size_t row_bytes, int n_rows, int n_in, const void *prep,
                            int n_tok, float *Y, int ldy);

/* ---- F16 weights, on the bf16 tiles (where simd_amx_f16()) ---- */
/* both activation layouts of amx_bf16_prepare (x rounded, residual) */
size_t amx_f16_prep_bytes(int n_in, int n_tok);
void amx_f16_prepare(const float *X, int n_in, int n_tok, void *prep);
/* Y[t * ldy + r] ~ sum_i w[r][i] x[t][i] for r < n_rows (a multiple of
 * 16), t < n_tok: rows of n_in f16 weights row_bytes apart. Each weight
 * piece is split exactly into two bf16 (hi + lo), the activations into
 * xh + xl (see amx_bf16_prepare), and hi xh + hi xl + lo xh is formed on
 * the tiles: every term within 2^-15 of w x, then f32 adds. ref: dot_row()
 * of the row with x, in double, within that bound. */
void amx_f16_rows_x_tokens(const void *W, size_t row_bytes, int n_rows, int n_in, const void *prep,
                           int n_tok, float *Y, int ldy);

#endif

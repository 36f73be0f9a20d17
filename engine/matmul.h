/* matmul.h - the matrix products of the layers: weights x activations.
 *
 * Owns: choosing, per weight type, shape, token count and CPU, the kernel
 * that multiplies (panels, AMX tiles, the AVX-512 / AVX2 tiles, int8
 * activations for Q8_0, sgemm on decoded tiles) and splitting the rows
 * between the threads. Does not own: the kernels themselves (kernels/).
 */
#ifndef HYSERVE_MATMUL_H
#define HYSERVE_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/weight.h"

/* Y[t][o] = sum_i W[o][i] X[t][i] for t < n_tok. X: [n_tok][W->n_in],
 * Y: [n_tok][W->n_out], both row-major and dense. scratch must hold
 * matmul_scratch_floats() floats. Uses all threads.
 * decode: the n_tok rows are a decode step, one new token of each of n_tok
 * sequences (the engine passes it for passes where every sequence adds one
 * token, false for prompts). Q8_0 weights always meet int8 activations for
 * one token (quantized per block of 32, as llama.cpp does); in a decode
 * step of several tokens too (int8 tiles on AMX, the int8 kernels
 * elsewhere), so a sequence decoded in a batch sees the same int8 inputs
 * as decoded alone. Prompts on Q8_0, K-quant and Q4_0 weights meet int8
 * activations too where matmul_int8_prompt() says (quantized per token as for
 * one token: Q8_0 and Q4_0 per block of 32, the K-quants per super-block
 * of 256 with per-16 sums), else f32. BF16 weights in a decode step of several tokens on
 * AMX-BF16 meet activations rounded to bf16 (as llama.cpp rounds them for
 * every BF16 product); one token keeps f32 activations. Other batches keep
 * f32 activations. */
void matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, bool decode, float *scratch);
long matmul_scratch_floats(const weight *W, int n_tok);
/* Y[i] = X W[i]^T for i < n <= MATMUL_MANY_MAX: what n matmul() calls give
 * (the same kernels and activation rounding), but weights of one type and
 * width that take the one-token or AMX decode kernels share one parallel
 * region and one preparation of X. scratch: the largest of the n
 * matmul_scratch_floats(). */
#define MATMUL_MANY_MAX 8
void matmul_many(int n, float *const *Y, const weight *const *W, const float *restrict X, int n_tok, bool decode,
                 float *scratch);
/* Exact steps (speculative decoding's verify step, engine_batch_item.exact):
 * while on, every product of n_tok > 1 tokens on this thread gives each
 * token the bits of the one-token product (decode n_tok 1): the same
 * kernel per weight type, level and row group as matvec picks for one
 * token, each chunk of rows dotted with every token while it is in L2, so
 * the weight is still read from memory once for the step. Packed weights
 * take their decode path (every token one token's bits, panels.h).
 * Returns the previous setting; the caller restores it. Per thread: the
 * engine's owner thread sets it around an exact pass. */
bool matmul_set_exact(bool on);
/* Tuning and tests: batches of up to n_tok tokens (default 16) take the
 * small-batch kernel instead of sgemm; 1 turns it off. */
void matmul_set_small_max(int n_tok);
/* Prompts on int8 products (Q8_0, K-quants, Q4_0): MATMUL_INT8_OFF never;
 * MATMUL_INT8_ON every such product at every level (the int8 kernels have
 * AVX512-VNNI, AVX-512, AVX-VNNI, AVX2 and scalar forms; the reference's
 * int8 mode); MATMUL_INT8_AUTO where they were measured faster than the
 * f32 path at the level in use, per weight family, from a number of
 * tokens (the tile unpacks each weight once per prompt pass: too dear for
 * a few tokens), the thresholds below (0: never; matmul.c int8_rule_now
 * has the measurements). The default is HYSERVE_INT8_PROMPT: "0" off,
 * "1" on, unset or else auto. In auto, K-quant and Q4_0 prompts shorter
 * than the tiles' threshold take the decode-step kernels (each token's
 * dots as for one token, the row unpacked in registers once per 8 tokens)
 * up to the MATMUL_STEP_* counts below, where those were measured faster
 * than the f32 path; MATMUL_INT8_STEP (bench/int8_ab.c) forces them at
 * every prompt length. */
enum { MATMUL_INT8_OFF, MATMUL_INT8_ON, MATMUL_INT8_AUTO, MATMUL_INT8_STEP };
/* AVX512-VNNI: Q8_0 from 2 tokens, Q4_0 from MATMUL_INT8_VNNI512_Q4_0 */
#define MATMUL_KQ_PROMPT_MIN_TOK 32
#define MATMUL_INT8_VNNI512_Q4_0 16
/* AVX-512 without VNNI (Skylake-SP): vpmaddubsw tiles; Q8_0 off (its
 * int8 path is the decode-step kernel, slower than sgemm from 48 tokens);
 * K-quants from 17 tokens, just past the f32 tile (small_max, 16), where
 * the f32 path turns to sgemm on decoded tiles */
#define MATMUL_INT8_AVX512_Q8_0 0
#define MATMUL_INT8_AVX512_Q4_0 32
#define MATMUL_INT8_AVX512_KQ 17
/* AVX2 with AVX-VNNI (Alder Lake to Arrow Lake clients, Sierra Forest),
 * and AVX2 alone, against OpenBLAS's Haswell sgemm: Q8_0 off; K-quants
 * from 17 tokens as on AVX-512 */
#define MATMUL_INT8_AVXVNNI_Q8_0 0
#define MATMUL_INT8_AVXVNNI_Q4_0 64
#define MATMUL_INT8_AVXVNNI_KQ 17
#define MATMUL_INT8_AVX2_Q8_0 0
#define MATMUL_INT8_AVX2_Q4_0 64
#define MATMUL_INT8_AVX2_KQ 17
/* K-quant and Q4_0 prompts of 2 to this many tokens on the decode-step
 * kernels in auto (0: never): AVX512-VNNI, AVX-512, AVX2 with or without
 * AVX-VNNI. On AVX512-VNNI K-quant prompts past the f32 tile (small_max,
 * 16) and short of the int8 tiles take them too: sgemm on decoded tiles
 * at 17-31 tokens ran at 24-39 tok/s against 36-43 (bench model, one
 * thread). Since the decode-step kernels share each unpack among 8
 * tokens (simd_kquant.c) they beat the f32 tile up to 16 tokens too:
 * hyserve-int8-ab, one thread, f32 / step on the two MLP shapes, Q4_K
 * and Q6_K, AVX512-VNNI 12 tokens 1.8-2.8, 16: 1.5-1.7 (the old kernels
 * 0.65-0.90); AVX-512 12: 1.8-2.1, 16: 1.5-1.7. Whole engine, Q4_K_M,
 * AVX512-VNNI, auto (the f32 tile) against step: one thread 9 tokens
 * 26-29 -> 57-64 tok/s, 12: 30-33 -> 60-67, 16: 35-36 -> 58-63; two
 * threads 12: 21-24 -> 28-30, 16: 25-28 -> 31-34, and 32 tokens (the
 * int8 tiles) 32-37 -> 45. At the other levels the int8 tiles take
 * K-quants from 17 tokens (faster there than both sgemm and the old
 * step kernels; AVX-512 thus runs the step kernels at 2-16 tokens and
 * the int8 tiles from 17). */
#define MATMUL_STEP_VNNI512_Q4_0 4
#define MATMUL_STEP_VNNI512_KQ 16
#define MATMUL_STEP_AVX512_Q4_0 4
#define MATMUL_STEP_AVX512_KQ 16
#define MATMUL_STEP_AVX2_Q4_0 4
#define MATMUL_STEP_AVX2_KQ 4
void matmul_set_int8_prompt(int mode);
/* BF16 prompts on weights in panels (panels.h, PANELS_BF16ACT):
 * MATMUL_BF16_EXACT on f32 activations (the outer-product kernel up to
 * small_max tokens, sgemm on decoded panels past it: the reference's
 * arithmetic); MATMUL_BF16_ROUNDED on activations rounded to bf16 at every
 * level (vdpbf16ps where BF16 decode takes it, simd_bf16_dot; else the
 * rounded values on the FMA kernel: the reference's bf16 mode); MATMUL_BF16_AUTO rounded
 * where BF16 decode took vdpbf16ps (simd_bf16_dot, the start-up
 * measurement), else exact. The default is HYSERVE_BF16_PROMPT: "0"
 * exact, "1" rounded, unset or else auto. matmul_bf16_prompt(): whether
 * BF16 prompts round now; matmul_prompt_describe(GGML_BF16, ...): the path
 * and why, for the ready line and /info. */
enum { MATMUL_BF16_EXACT, MATMUL_BF16_ROUNDED, MATMUL_BF16_AUTO };
void matmul_set_bf16_prompt(int mode);
bool matmul_bf16_prompt(void);
/* F16 prompts on weights in panels: the outer-product kernel (F16C
 * widening in registers, tiles of 32 rows x 12 tokens) up to
 * matmul_f16_outer_max() tokens, sgemm on panels decoded to f32 past it.
 * HYSERVE_F16_PROMPT: "tile" every length on the kernel, "sgemm" (or "0")
 * from small_max + 1 tokens on sgemm (as before), unset or else the measured
 * default (MATMUL_F16_OUTER_MAX). */
int matmul_f16_outer_max(void);
/* Tests and benchmarks: set it (INT_MAX: every length on the kernel, 0:
 * small_max), -1: the default again. */
void matmul_set_f16_outer_max(int n_tok);
/* F32 products of 2 to matmul_f32_tile_max() tokens (prompts and decode
 * steps) take the AVX-512 rows x tokens tile, longer ones sgemm; without
 * AVX-512 the AVX2 tile to small_max. HYSERVE_F32_PROMPT: "tile" every
 * length on the tile, "sgemm" (or "0") sgemm from small_max + 1 (as
 * before), unset or else the measured default (MATMUL_F32_TILE_MAX).
 * matmul_set_f32_tile_max: tests and benchmarks (INT_MAX every length, 0
 * small_max, -1 the default again). */
#define MATMUL_F32_TILE_MAX 128
int matmul_f32_tile_max(void);
void matmul_set_f32_tile_max(int n_tok);
/* whether a prompt (not a decode step) of n_tok tokens on a weight of this
 * type multiplies on int8 activations now */
bool matmul_int8_prompt(uint32_t type, int n_tok);
/* the choice in one phrase for the ready line and /info, e.g.
 * "avx512-vnni tiles, Q8_0/Q4_0 from 2 tokens, K-quants from 32 tokens",
 * "off (HYSERVE_INT8_PROMPT=0)" */
void matmul_int8_prompt_describe(char *buf, size_t len);
/* The prompt path of a weight type now, in one phrase, into buf (cut to
 * len - 1 bytes and terminated; nothing written when len is 0), for the
 * ready line and /info: GGML_F32 "rows x tokens tile to 128 tokens, sgemm
 * past it" (AVX2: "tile to 16 tokens, ..."), GGML_F16 "outer-product tile
 * to 16 tokens, sgemm past it" (no limit: "outer-product tile"), GGML_BF16
 * the path and why ("vdpbf16ps (as bf16 decode)"), other types
 * matmul_int8_prompt_describe(). Safe to call from several threads (each
 * writes only its own buf) while no thread changes the settings.
 * MATMUL_PROMPT_NAME_LEN bytes hold every phrase. */
#define MATMUL_PROMPT_NAME_LEN 160
void matmul_prompt_describe(uint32_t type, char *buf, size_t len);

#endif

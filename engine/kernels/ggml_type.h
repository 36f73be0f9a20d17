/* ggml_type.h - the ids and block sizes of ggml tensor types.
 *
 * Owns: the type ids GGUF files store per tensor (enum ggml_type) and the
 * bytes and elements of one block of each. The kernels decode blocks by
 * these ids; the file reader (gguf.h, above the kernels) includes this.
 * Does not own: decoding (quant.h) or reading files (gguf.h).
 */
#ifndef HYSERVE_GGML_TYPE_H
#define HYSERVE_GGML_TYPE_H

#include <stddef.h>
#include <stdint.h>

/* ggml tensor types (the ones we name; others are reported by number). */
enum ggml_type {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6,
    GGML_Q5_1 = 7, GGML_Q8_0 = 8, GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_Q8_K = 15,
    GGML_BF16 = 30,
};

/* Bytes per block and elements per block of a tensor type; 0 if unknown. */
size_t ggml_type_size(uint32_t type);
size_t ggml_block_size(uint32_t type);
const char *ggml_type_name(uint32_t type);

#endif

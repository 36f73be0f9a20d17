/* half.h - the 16-bit floats weights and caches are stored in.
 *
 * Owns: converting one f16 (IEEE binary16) or bf16 number to f32 and back.
 * Every kernel level uses these as its scalar reference; the block formats
 * (quant.h) build rows from them.
 */
#ifndef HYSERVE_HALF_H
#define HYSERVE_HALF_H

#include <stdint.h>

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);          /* round to nearest even */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);          /* round to nearest even */

#endif

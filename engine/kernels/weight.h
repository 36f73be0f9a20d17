/* weight.h - the view of one 2-D weight that the products take.
 *
 * Owns: the description (data, block type, shape, layout) every product
 * kernel reads. Does not own: binding tensors to weights (model.c) or
 * packing them (panels.c).
 */
#ifndef HYSERVE_WEIGHT_H
#define HYSERVE_WEIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A 2-D weight used as y = W x: n_out rows of n_in contiguous elements
 * stored as `type` blocks. GGUF ne = {n_in, n_out}. Points into the mmap
 * (or the huge-page copy); panels: BF16/F16/Q8_0 rows repacked at load. */
typedef struct weight {
    const void *data;
    uint32_t type;              /* enum ggml_type */
    int n_in, n_out;
    size_t row_bytes;
    bool panels;                /* rows repacked in panels of 16 (panels.h) */
} weight;

/* Slab i of a weight stored as equal slabs one after another (experts, MLA
 * heads; model.c binds the first and the stride): the same view, stride
 * bytes further on per slab. */
static inline weight weight_slab(const weight *w, size_t stride, int i)
{
    weight v = *w;
    v.data = (const char *)w->data + stride * (size_t)i;
    return v;
}

#endif

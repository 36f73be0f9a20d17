/* shortconv.c - LFM2's gated short convolution, the recurrent kind with no state.
 *
 * Owns: a short-conv layer from its normed input to its output: the input
 * projection into three chunks [B | C | x], h = B * x, the causal
 * depthwise conv over h with the layer's window of K - 1 past h rows in
 * the slot (conv1d.c; no bias, no activation), y = C * conv(h) and the out
 * projection. llama.cpp: src/models/lfm2.cpp, build_shortconv_block.
 * Does not own: the conv loop (conv1d.c) or the slot (cache.c).
 */
#include <omp.h>

#include "engine_impl.h"
#include "matmul.h"

void sconv_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    const model *m = e->m;
    fwd_scratch *s = &e->sc;
    const int E = m->n_embd, LD = 3 * E;
    float *bcx = s->sconv.bcx;                          /* [T][3E]: B, C, x */
    matmul(bcx, &L->ssm_in, s->xn, T, decode, s->mm);
    /* h = B * x, into the x chunk (the conv runs in place there) */
    #pragma omp parallel for schedule(static) if (T >= 8)
    for (int row = 0; row < T; row++) {
        float *r = bcx + (size_t)row * LD;
        for (int d = 0; d < E; d++)
            r[2 * E + d] *= r[d];
    }
    #pragma omp parallel if (T >= 8 && !items_exact(items, n_items))     /* exact: a one-token step's blocks */
    {
        const int nt = omp_get_num_threads(), th = omp_get_thread_num();
        const int c0 = (int)((long)E * th / nt), c1 = (int)((long)E * (th + 1) / nt);
        conv1d_items(items, n_items, bcx + 2 * E, LD, E, m->ssm_k, L->conv1d_t, NULL, L->rec_conv, false, c0, c1);
    }
    /* y = C * conv(h) */
    #pragma omp parallel for schedule(static) if (T >= 8)
    for (int row = 0; row < T; row++) {
        const float *r = bcx + (size_t)row * LD;
        float *y = s->mix + (size_t)row * E;
        for (int d = 0; d < E; d++)
            y[d] = r[E + d] * r[2 * E + d];
    }
    matmul(s->y, &L->wout, s->mix, T, decode, s->mm);
}

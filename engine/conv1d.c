/* conv1d.c - the causal depthwise convolution every recurrent kind runs.
 *
 * Owns: the conv window of K - 1 raw input rows each recurrent layer keeps
 * in its sequence's slot (cache.h), the convolution over a batch of
 * sequences with it, and the window a snapshot inside the batch receives;
 * and how every kind writes its state into such a snapshot
 * (rec_snapshot_state).
 * Gated DeltaNet runs it over [q | k | v], Mamba-2 over [x | B | C], the
 * short convolution of LFM2 over B * x. Does not own: what the layer does
 * with the result (deltanet.c, mamba2.c, shortconv.c).
 */
#include <string.h>

#include "kernels/quant.h"
#include "kernels/vecmath.h"
#include "layers.h"

/* channels per block of the conv loop */
#define CONV_BLOCK 256

/* The conv window of a sequence is a ring of K - 1 raw input rows: x_p
 * lives in slot p mod (K - 1), so a decode step stores one row instead of
 * shifting K - 1 of them. Slots of positions p < 0 stay zero from
 * allocation, the conv's left padding. */
static int conv_slot(int p, int w1)
{
    const int r = p % w1;
    return r < 0 ? r + w1 : r;
}

/* The window after r rows of it, as the ring would hold it, into the
 * slot snap's ring for this layer (the block's conv part sits where the
 * sequence's does in its own block), channels [cb, cb + nc): raw inputs of
 * positions pos0 + r - (K-1) .. pos0 + r - 1, from the batch (not yet
 * overwritten) or from the ring. */
static void conv_window_into(const fwd_item *it, uint8_t *snap, int r, const float *X, int ld, int CD, int W1,
                             const float *conv, size_t ring_off, int cb, int nc)
{
    float *sconv = (float *)(void *)(snap + ((const uint8_t *)it->s->conv - (const uint8_t *)it->s->state)) + ring_off;
    for (int j = 0; j < W1; j++) {
        const int q = r - W1 + j;
        const float *x = q >= 0 ? X + (size_t)(it->row0 + q) * ld + cb : conv + (size_t)conv_slot(it->pos0 + q, W1) * CD + cb;
        memcpy(sconv + (size_t)conv_slot(it->pos0 + q, W1) * CD + cb, x, sizeof(float) * (size_t)nc);
    }
}

/* Causal depthwise conv (+ bias, + SiLU) of every item over channels [c0, c1),
 * in place: u_t[ch] = silu(sum_j w[j][ch] x_{t-K+1+j}[ch] + b[ch]), x_{<0} from the
 * cached window of raw inputs. Rows run last to first, so the raw rows a
 * row needs are not yet overwritten; channels run in blocks innermost,
 * contiguous and vectorizable, with the taps stored [K][channel] at load
 * (a channel-outer loop strides 24 KB between rows). Items are the outer
 * loop, so an item's K - 1 window rows are read front to back: with the
 * channel blocks outermost each block would touch K - 1 short pieces of
 * every item's window, not in cache. The profiles of both orders:
 * docs/performance.md section 12. */
void conv1d_items(const fwd_item *items, int n_items, float *X, int ld, int CD, int K, const float *taps,
                  const float *bias, size_t ring_off, bool silu, int c0, int c1)
{
    const int W1 = K - 1;
    for (int ii = 0; ii < n_items; ii++) {
        const fwd_item *it = &items[ii];
        float *conv = it->s->conv + ring_off;                          /* ring [K-1][CD] */
        const int nk = it->n < W1 ? it->n : W1;                         /* raw rows the ring keeps */
        for (int cb = c0; cb < c1; cb += CONV_BLOCK) {
            const int nc = c1 - cb < CONV_BLOCK ? c1 - cb : CONV_BLOCK;
            float keep[15][CONV_BLOCK], acc[CONV_BLOCK];
            /* the snapshot's and the checkpoints' windows, before the conv
             * overwrites the rows they read */
            if (it->snap)
                conv_window_into(it, it->snap, it->snap_at, X, ld, CD, W1, conv, ring_off, cb, nc);
            for (int r = 0; it->ckpt && r < it->n; r++)
                if (it->ckpt[r])
                    conv_window_into(it, it->ckpt[r], r, X, ld, CD, W1, conv, ring_off, cb, nc);
            /* the last nk raw rows, before the conv overwrites them */
            for (int j = 0; j < nk; j++)
                memcpy(keep[j], X + (size_t)(it->row0 + it->n - nk + j) * ld + cb, sizeof(float) * (size_t)nc);
            for (int t = it->n - 1; t >= 0; t--) {
                for (int j = 0; j < K; j++) {
                    const int r = t - W1 + j;
                    const float *x = r >= 0 ? X + (size_t)(it->row0 + r) * ld + cb
                                            : conv + (size_t)conv_slot(it->pos0 + r, W1) * CD + cb;
                    const float *w = taps + (size_t)j * CD + cb;
                    /* -O2 leaves these loops scalar without the pragma
                     * (timed: docs/performance.md section 12) */
                    if (j == 0) {
                        #pragma omp simd
                        for (int ci = 0; ci < nc; ci++)
                            acc[ci] = w[ci] * x[ci];
                    } else {
                        #pragma omp simd
                        for (int ci = 0; ci < nc; ci++)
                            acc[ci] += w[ci] * x[ci];
                    }
                }
                float *y = X + (size_t)(it->row0 + t) * ld + cb;
                if (bias)
                    for (int ci = 0; ci < nc; ci++)
                        acc[ci] += bias[cb + ci];
                if (silu)
                    vec_silu_mul(y, acc, NULL, nc);
                else
                    memcpy(y, acc, sizeof(float) * (size_t)nc);
            }
            for (int j = 0; j < nk; j++)
                memcpy(conv + (size_t)conv_slot(it->pos0 + it->n - nk + j, W1) * CD + cb, keep[j],
                       sizeof(float) * (size_t)nc);
        }
    }
}

void rec_snapshot_state(float *S, uint8_t *snap, size_t at, int n, bool b16)
{
    if (b16) {
        uint16_t *dst = (uint16_t *)(void *)snap + at;
        quantize_row_fast(GGML_BF16, S, dst, n);
        dequant_row_fast(GGML_BF16, dst, S, n);
    } else {
        memcpy((float *)(void *)snap + at, S, sizeof(float) * (size_t)n);
    }
}

void rec_head_rows(const fwd_item *it, size_t at, int n_state, bool b16, bool step1, float *work, rec_rows_fn run,
                   void *ctx)
{
    uint16_t *S16 = (uint16_t *)it->s->state + at;
    float *S = b16 ? work : (float *)it->s->state + at;
    if (b16)
        dequant_row_fast(GGML_BF16, S16, S, n_state);
    step1 = step1 || it->ckpt;
    for (int t0 = 0; t0 < it->n;) {
        int t1 = step1 ? t0 + 1 : it->n;
        if (it->snap && t0 < it->snap_at && t1 > it->snap_at)
            t1 = it->snap_at;
        if (item_snap_at(it, t0))
            rec_snapshot_state(S, it->snap, at, n_state, b16);
        if (item_ckpt_at(it, t0))
            rec_snapshot_state(S, it->ckpt[t0], at, n_state, b16);
        run(ctx, t0, t1 - t0, S);
        if (step1 && b16 && t1 < it->n) {   /* stored and loaded back, as between one-token steps */
            quantize_row_fast(GGML_BF16, S, S16, n_state);
            dequant_row_fast(GGML_BF16, S16, S, n_state);
        }
        t0 = t1;
    }
    if (b16)
        quantize_row_fast(GGML_BF16, S, S16, n_state);
}

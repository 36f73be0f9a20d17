/* mamba1.c - the Mamba (v1) selective-scan mixer, as Jamba's layers run it.
 *
 * Owns: a Mamba-1 layer from its normed input to its output: the input
 * projection into [x | z], the causal conv (+ bias, SiLU) over x with the
 * layer's window in the slot (conv1d.c), x_proj into dt (dt_rank), B and C
 * (d_state each), each RMS-normed by its weight (Jamba's dt/B/C norms),
 * dt_proj with its bias and softplus, the selective scan with a diagonal
 * A per channel and state, the D skip, the gate silu(z) and the out
 * projection. llama.cpp: build_mamba_layer and ggml_ssm_scan with a
 * {d_state, d_inner} A. Does not own: the slot (cache.c).
 *
 * Per channel c and state index i, with dt_t = softplus(dt_proj(dt) + b):
 *   S_t[c][i] = exp(dt_t[c] A[c][i]) S_{t-1}[c][i] + dt_t[c] x_t[c] B_t[i]
 *   y_t[c]    = sum_i S_t[c][i] C_t[i] + D[c] x_t[c]
 * The decay differs per channel and state, so a chunked form would cost
 * more products than the scan it replaces (the state is only d_state
 * numbers per channel); prompts run the same recurrence, parallel over
 * sequences and channel blocks, as llama.cpp's ssm_scan does. State layout:
 * llama.cpp's [d_inner][d_state].
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "engine_impl.h"
#include "gguf.h"
#include "kernels/cpu.h"
#include "kernels/quant.h"
#include "kernels/vecmath.h"
#include "layers.h"
#include "matmul.h"

/* channels per work unit of the scan */
#define M1_BLOCK 64

/* The scan over rows [t0, t1) of one sequence for channels [c0, c1): x, dt
 * rows of DI (strides xs, ds_), BC rows [B | C] of 2 DS at stride bcs; S
 * [channel][DS] for these channels (f32); y rows at stride ys. */
void mamba1_scan(int t0, int t1, int c0, int c1, int DS, const float *A, const float *x, int xs, const float *dt,
                 int dts, const float *BC, int bcs, float *S, float *y, int ys)
{
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * xs, *dtt = dt + (size_t)t * dts;
        const float *B = BC + (size_t)t * bcs, *C = B + DS;
        float *yt = y + (size_t)t * ys;
        for (int c = c0; c < c1; c++) {
            const float d = dtt[c], xd = xt[c] * d;
            const float *Ac = A + (size_t)c * DS;
            float *Sc = S + (size_t)(c - c0) * DS, acc = 0.0f;
            #pragma omp simd reduction(+ : acc)
            for (int i = 0; i < DS; i++) {
                Sc[i] = Sc[i] * expf(d * Ac[i]) + B[i] * xd;
                acc += Sc[i] * C[i];
            }
            yt[c] = acc;
        }
    }
}

long mamba1_scratch_floats(const model *m)
{
    return (long)M1_BLOCK * m->m1_d_state;
}

/* the scan's arguments but the rows, for rec_head_rows */
typedef void (*m1_scan_fn)(int, int, int, int, int, const float *, const float *, int, const float *, int,
                           const float *, int, float *, float *, int);
typedef struct m1_rows_ctx {
    m1_scan_fn scan;
    int c0, c1, DS;
    const float *A, *x;
    int xs;
    const float *dt, *bc;
    int bcs;
    float *y;
} m1_rows_ctx;

static void m1_rows(void *ctx, int t0, int n, float *S)
{
    const m1_rows_ctx *r = ctx;
    r->scan(t0, t0 + n, r->c0, r->c1, r->DS, r->A, r->x, r->xs, r->dt, r->xs, r->bc, r->bcs, S, r->y, r->xs);
}

void mamba1_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    const model *m = e->m;
    const cache *kv = &e->kv;
    fwd_scratch *s = &e->sc;
    const int DI = m->m1_inner, DS = m->m1_d_state, R = m->m1_dt_rank, XW = R + 2 * DS;
    float *xz = s->m1.xz, *x = s->m1.x, *xdb = s->m1.xdb, *dtr = s->m1.dtr, *dt = s->m1.dt, *y = s->mix;
    const bool par = T >= 8;

    matmul(xz, &L->ssm_in, s->xn, T, decode, s->mm);                    /* [T][2 DI]: x | z */
    #pragma omp parallel if (par && !items_exact(items, n_items))     /* exact: a one-token step's blocks */
    {
        const int nt = omp_get_num_threads(), th = omp_get_thread_num();
        const int c0 = (int)((long)DI * th / nt), c1 = (int)((long)DI * (th + 1) / nt);
        conv1d_items(items, n_items, xz, 2 * DI, DI, m->ssm_k, L->conv1d_t, L->conv_b, L->rec_conv, true, c0, c1);
    }
    for (int r = 0; r < T; r++)
        memcpy(x + (size_t)r * DI, xz + (size_t)r * 2 * DI, sizeof(float) * (size_t)DI);
    matmul(xdb, &L->ssm_x, x, T, decode, s->mm);                        /* [T][R + 2 DS]: dt | B | C */
    for (int r = 0; r < T; r++) {
        float *row = xdb + (size_t)r * XW;
        rmsnorm(dtr + (size_t)r * R, row, L->dt_norm, R, m->eps);
        rmsnorm(row + R, row + R, L->b_norm, DS, m->eps);
        rmsnorm(row + R + DS, row + R + DS, L->c_norm, DS, m->eps);
    }
    matmul(dt, &L->ssm_dt, dtr, T, decode, s->mm);                      /* [T][DI] */
    #pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < T; r++)
        for (int c = 0; c < DI; c++)
            dt[(size_t)r * DI + c] = softplus(dt[(size_t)r * DI + c] + L->dt_bias[c]);

    const int NB = (DI + M1_BLOCK - 1) / M1_BLOCK;
    const bool b16 = kv->state_type == GGML_BF16;
    /* the kernel table's scan (AVX2: the exponentials 8 wide) where the state size allows */
    m1_scan_fn scan = cpu_kern.mamba1_scan && DS % 8 == 0 ? cpu_kern.mamba1_scan : mamba1_scan;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int w = 0; w < n_items * NB; w++) {
        const fwd_item *it = &items[w / NB];
        const int c0 = (w % NB) * M1_BLOCK, c1 = c0 + M1_BLOCK < DI ? c0 + M1_BLOCK : DI;
        const size_t at = L->rec_state + (size_t)c0 * DS;
        /* a bf16 state runs in f32 in this thread's scratch, rounded back
         * at the end (an exact item: after every token) */
        m1_rows_ctx rc = { scan, c0, c1, DS, L->ssm_a, x + (size_t)it->row0 * DI, DI, dt + (size_t)it->row0 * DI,
                           xdb + (size_t)it->row0 * XW + R, XW, y + (size_t)it->row0 * DI };
        rec_head_rows(it, at, (c1 - c0) * DS, b16, it->exact && b16,
                      s->rec_work + (size_t)omp_get_thread_num() * s->rec_stride, m1_rows, &rc);
    }
    /* y += D x; y *= silu(z) */
    #pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < T; r++) {
        float *yr = y + (size_t)r * DI;
        const float *xr = x + (size_t)r * DI, *z = xz + (size_t)r * 2 * DI + DI;
        for (int c = 0; c < DI; c++)
            yr[c] += L->ssm_d[c] * xr[c];
        vec_silu_mul(yr, z, yr, DI);
    }
    matmul(s->y, &L->wout, y, T, decode, s->mm);
}

/* mamba2.c - the Mamba-2 (SSD) mixer: conv, selective scan, gated norm.
 *
 * Owns: a Mamba-2 layer after its input projection: the causal conv over
 * [x | B | C] with its window (conv1d.c), the state-space recurrence per
 * head in two forms that must agree (token by token, and chunked on
 * matrix products), the D skip, the gate and the grouped RMSNorm. Does
 * not own: the projections (forward.c) or the slot (cache.c).
 * ref: docs/models.md section 10 (Mamba-2), Dao & Gu 2024 (SSD).
 *
 * Per head h (group g = h / (n_head / n_group): consecutive heads share a
 * group, as llama.cpp's ggml_ssm_scan, HF and mamba_ssm read B and C), with dt_t = softplus(dt_raw + dt_bias) and a_t = exp(dt_t A_h):
 *   S_t = a_t S_{t-1} + (dt_t x_t) B_t^T        S: [head_dim][d_state]
 *   y_t = S_t C_t + D_h x_t
 * then y = RMSNorm_group(y * silu(z)) * w and the out projection. The state
 * is kept as llama.cpp keeps it: [head][head_dim][d_state], d_state
 * innermost.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "gguf.h"
#include "kernels/cpu.h"
#include "kernels/blas.h"
#include "kernels/quant.h"
#include "kernels/vecmath.h"
#include "engine_impl.h"
#include "layers.h"
#include "matmul.h"

#define M2_CHUNK 64
/* below this many rows the conv and the norms run on one thread (as deltanet.c) */
#define M2_PAR_MIN_ROWS 8

/* ---- token by token ----
 * x: [n] rows of hd (stride xs), dt: [n] softplus'd steps, B, C: [n] rows of
 * ds (strides bs), S: [hd][ds] in/out, y: [n] rows of hd (stride ys). */
void mamba2_recurrent_head(int n, int hd, int ds, float A, const float *x, int xs, const float *dt,
                           const float *B, const float *C, int bs, float *S, float *y, int ys)
{
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * xs, *Bt = B + (size_t)t * bs, *Ct = C + (size_t)t * bs;
        float *yt = y + (size_t)t * ys;
        const float a = expf(dt[t] * A);
        for (int j = 0; j < hd; j++) {
            float *Sj = S + (size_t)j * ds;
            const float xdt = xt[j] * dt[t];
            float acc = 0.0f;
            #pragma omp simd reduction(+ : acc)
            for (int i = 0; i < ds; i++) {
                Sj[i] = Sj[i] * a + Bt[i] * xdt;
                acc += Sj[i] * Ct[i];
            }
            yt[j] = acc;
        }
    }
}

long mamba2_chunk_scratch_floats(int hd, int ds)
{
    const long c = M2_CHUNK;
    /* G, e^G; L: c*c; Xd (x dt): c*hd; Bd (B e^(G_last - G)): c*ds; Bc, Cc: c*ds each; Y: c*hd */
    return 2 * c + c * c + c * hd + c * ds + 2 * c * ds + c * hd;
}

/* ---- chunked (SSD) ----
 * Per chunk of c <= 64 rows, with G = cumsum(dt A):
 *   Y = diag(e^G) C S^T + (L .* (C B^T)) (x * dt),  L[t][s] = e^(G_t - G_s), s <= t
 *   S = e^(G_last) S + (x * dt)^T (B * e^(G_last - G))
 * the same sums as the recurrence, grouped into products. */
void mamba2_chunked_head(int n, int hd, int ds, float A, const float *x, int xs, const float *dt,
                         const float *B, const float *C, int bs, float *S, float *y, int ys, float *scratch)
{
    const int CH = M2_CHUNK;
    float *G = scratch, *eG = G + CH, *L = eG + CH, *Xd = L + CH * CH, *Bd = Xd + CH * hd;
    float *Bc = Bd + CH * ds, *Cc = Bc + CH * ds, *Y = Cc + CH * ds;
    for (int c0 = 0; c0 < n; c0 += CH) {
        const int c = n - c0 < CH ? n - c0 : CH;
        float acc = 0.0f;
        for (int t = 0; t < c; t++) {
            acc += dt[c0 + t] * A;
            G[t] = acc;
            eG[t] = expf(acc);
        }
        const float g_last = G[c - 1];
        for (int t = 0; t < c; t++) {
            const float *xt = x + (size_t)(c0 + t) * xs;
            for (int j = 0; j < hd; j++)
                Xd[t * hd + j] = xt[j] * dt[c0 + t];
            memcpy(Bc + (size_t)t * ds, B + (size_t)(c0 + t) * bs, sizeof(float) * (size_t)ds);
            memcpy(Cc + (size_t)t * ds, C + (size_t)(c0 + t) * bs, sizeof(float) * (size_t)ds);
            const float el = expf(g_last - G[t]);
            for (int i = 0; i < ds; i++)
                Bd[t * ds + i] = Bc[t * ds + i] * el;
        }
        /* L = C B^T, masked and decayed */
        gemm(false, true, c, c, ds, 1.0f, Cc, ds, Bc, ds, 0.0f, L, CH);
        for (int t = 0; t < c; t++) {
            for (int s = 0; s <= t; s++)
                L[t * CH + s] *= expf(G[t] - G[s]);
            for (int s = t + 1; s < c; s++)
                L[t * CH + s] = 0.0f;
        }
        /* Y = C S^T (then scaled by e^G per row) + L Xd */
        gemm(false, true, c, hd, ds, 1.0f, Cc, ds, S, ds, 0.0f, Y, hd);
        for (int t = 0; t < c; t++)
            for (int j = 0; j < hd; j++)
                Y[t * hd + j] *= eG[t];
        gemm(false, false, c, hd, c, 1.0f, L, CH, Xd, hd, 1.0f, Y, hd);
        for (int t = 0; t < c; t++)
            memcpy(y + (size_t)(c0 + t) * ys, Y + (size_t)t * hd, sizeof(float) * (size_t)hd);
        /* S = e^(G_last) S + Xd^T Bd */
        const float el = expf(g_last);
        for (long i = 0; i < (long)hd * ds; i++)
            S[i] *= el;
        gemm(true, false, hd, ds, c, 1.0f, Xd, hd, Bd, ds, 1.0f, S, ds);
    }
}

long mamba2_scratch_floats(const model *m)
{
    /* chunk scratch + dt gathered for up to ENGINE_UBATCH rows + one head's
     * state in f32 (when the cache keeps it in bf16) */
    return mamba2_chunk_scratch_floats(m->m2_head_dim, m->m2_d_state) + ENGINE_UBATCH +
           (long)m->m2_head_dim * m->m2_d_state;
}

/* The recurrence on the fastest kernel this CPU has (cpu.h: AVX2, for a
 * state a multiple of 8 wide), else the scalar one above. */
static void recurrent_fast(int n, int hd, int ds, float A, const float *x, int xs, const float *dt, const float *B,
                           const float *C, int bs, float *S, float *y, int ys)
{
    if (!cpu_kern.mamba2_step || ds % 8) {
        mamba2_recurrent_head(n, hd, ds, A, x, xs, dt, B, C, bs, S, y, ys);
        return;
    }
    for (int t = 0; t < n; t++)
        cpu_kern.mamba2_step(hd, ds, expf(dt[t] * A), dt[t], x + (size_t)t * xs, B + (size_t)t * bs,
                             C + (size_t)t * bs, S, y + (size_t)t * ys);
}

static void head_rows(bool chunked, int t0, int n, int hd, int ds, float A, const float *x, int ld,
                      const float *dt, const float *B, const float *C, float *S, float *y, int ys, float *sc)
{
    if (n <= 0)
        return;
    x += (size_t)t0 * ld;
    B += (size_t)t0 * ld;
    C += (size_t)t0 * ld;
    y += (size_t)t0 * ys;
    if (chunked)
        mamba2_chunked_head(n, hd, ds, A, x, ld, dt + t0, B, C, ld, S, y, ys, sc);
    else
        recurrent_fast(n, hd, ds, A, x, ld, dt + t0, B, C, ld, S, y, ys);
}

/* head_rows's arguments but the rows, for rec_head_rows */
typedef struct m2_rows_ctx {
    bool chunked;
    int hd, ds;
    float A;
    const float *x;
    int ld;
    const float *dt, *B, *C;
    float *y;
    int ys;
    float *sc;
} m2_rows_ctx;

static void m2_rows(void *ctx, int t0, int n, float *S)
{
    const m2_rows_ctx *r = ctx;
    head_rows(r->chunked, t0, n, r->hd, r->ds, r->A, r->x, r->ld, r->dt, r->B, r->C, S, r->y, r->ys, r->sc);
}

/* ZXD: [T][d_in_proj] the input projection per row, [z | x | B | C | dt];
 * conv'd in place; O: [T][d_inner] the gated, normed output. */
void mamba2_forward(const model *m, const layer *L, const cache *c, const fwd_item *items, int n_items, float *ZXD,
                    float *O, int mode, float *scratch)
{
    const int NH = m->m2_heads, HD = m->m2_head_dim, DS = m->m2_d_state, NG = m->m2_groups;
    const int DI = NH * HD, CD = m->m2_conv_ch, LD = m->m2_in_dim;
    const fwd_item *last = &items[n_items - 1];
    const int T = last->row0 + last->n;
    const bool par = T >= M2_PAR_MIN_ROWS;

    /* conv + SiLU over [x | B | C], each thread a share of the channels
     * (an exact pass: one thread, a one-token step's channel blocks) */
    #pragma omp parallel if (par && !items_exact(items, n_items))
    {
        const int nt = omp_get_num_threads(), th = omp_get_thread_num();
        const int c0 = (int)((long)CD * th / nt), c1 = (int)((long)CD * (th + 1) / nt);
        conv1d_items(items, n_items, ZXD + DI, LD, CD, m->ssm_k, L->conv1d_t, L->conv_b, L->rec_conv, true, c0, c1);
    }
    /* dt = softplus(dt_raw + dt_bias), in place */
    for (int row = 0; row < T; row++) {
        float *d = ZXD + (size_t)row * LD + DI + CD;
        for (int h = 0; h < NH; h++)
            d[h] = softplus(d[h] + L->dt_bias[h]);
    }

    #pragma omp parallel for schedule(dynamic, 1)
    for (int w = 0; w < n_items * NH; w++) {
        const fwd_item *it = &items[w / NH];
        const int h = w % NH, g = h / (NH / NG);
        const bool chunked = mode == ENGINE_DNET_CHUNKED || (mode == ENGINE_DNET_AUTO && it->n >= M2_CHUNK / 4 && !it->exact);
        float *sc = scratch + (size_t)omp_get_thread_num() * mamba2_scratch_floats(m);
        float *dt = sc + mamba2_chunk_scratch_floats(HD, DS);
        const float *base = ZXD + (size_t)it->row0 * LD;
        const float *x = base + DI + (size_t)h * HD;
        const float *B = base + 2 * DI + (size_t)g * DS, *C = base + 2 * DI + (size_t)(NG + g) * DS;
        for (int t = 0; t < it->n; t++)
            dt[t] = base[(size_t)t * LD + DI + CD + h];
        const size_t at = L->rec_state + (size_t)h * HD * DS;                 /* [HD][DS] */
        const bool b16 = c->state_type == GGML_BF16;
        /* rows [0, snap_at), the snapshot, the rest; an exact item one
         * token at a time where its one-token steps differ (chunks, bf16) */
        m2_rows_ctx rc = { chunked, HD, DS, L->ssm_a[h], x, LD, dt, B, C, O + (size_t)it->row0 * DI + (size_t)h * HD,
                           DI, sc };
        rec_head_rows(it, at, HD * DS, b16, it->exact && (b16 || chunked), dt + ENGINE_UBATCH, m2_rows, &rc);
    }

    /* y += D x; y *= silu(z); RMSNorm per group of d_inner / n_group, times w */
    const int GW = DI / NG;
    #pragma omp parallel for schedule(static) if (par)
    for (int row = 0; row < T; row++) {
        float *y = O + (size_t)row * DI;
        const float *z = ZXD + (size_t)row * LD, *x = z + DI;
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < HD; j++)
                y[h * HD + j] += L->ssm_d[h] * x[h * HD + j];
        vec_silu_mul(y, z, y, DI);
        for (int gi = 0; L->ssm_norm && gi < NG; gi++)     /* Falcon-H1 may have none */
            rmsnorm(y + (size_t)gi * GW, y + (size_t)gi * GW, L->ssm_norm + (size_t)gi * GW, GW, m->eps);
    }
}

/* Mamba-2: one input projection [z | x | B | C | dt]; the conv, the scan
 * and the gated norm (mamba2.c); y = W_out out. */
void mamba2_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    fwd_scratch *s = &e->sc;
    matmul(s->m2.zxd, &L->ssm_in, s->xn, T, decode, s->mm);
    mamba2_forward(e->m, L, &e->kv, items, n_items, s->m2.zxd, s->mix, e->params.dnet_mode, s->rec_work);
    matmul(s->y, &L->wout, s->mix, T, decode, s->mm);
}

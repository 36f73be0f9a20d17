/* deltanet.c - the gated delta rule: conv, recurrent step and chunked form.
 *
 * Owns: the causal depthwise conv with its cached state, q/k L2 norm,
 * beta/g, the recurrence per value head (two paths that must agree: token
 * by token, and the chunked WY/UT form built on matrix products), and the
 * gated RMSNorm. Does not own: the projections (forward.c).
 * ref: docs/models.md section 1.4 (a)-(i).
 *
 * State layout (llama.cpp's): S[h][j][i] with j over d_v and i over d_k,
 * i.e. the transpose of HF's [d_k][d_v]. Then S^T k and the rank-1 update
 * are row-contiguous.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "gguf.h"
#include "kernels/blas.h"
#include "kernels/quant.h"
#include "kernels/cpu.h"
#include "kernels/vecmath.h"
#include "layers.h"

#ifndef DNET_CHUNK
#define DNET_CHUNK 64
#endif
/* Below this many rows the conv and the norms run on one thread: for a
 * decode step they are a few microseconds of work, less than a fork/join
 * (and far less than one when another process holds a core). */
#define DNET_PAR_MIN_ROWS 8

/* ---- recurrent form, section 1.4(f) ----
 * shapes: q,k [n][d_k]; v [n][d_v]; S [d_v][d_k]; o [n][d_v]
 * per token: S *= exp(g); kv = S^T k; d = beta (v - kv); S += k d^T; o = S^T q */
void dnet_recurrent_head(int n, int d_k, int d_v, const float *q, int q_stride,
                         const float *k, int k_stride, const float *v, int v_stride,
                         const float *beta, const float *g, float *S, float *o, int o_stride)
{
    for (int t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * q_stride, *kt = k + (size_t)t * k_stride;
        const float *vt = v + (size_t)t * v_stride;
        float *ot = o + (size_t)t * o_stride;
        float decay = expf(g[t]), b = beta[t];
        for (int j = 0; j < d_v; j++) {
            float *Sj = S + (size_t)j * d_k;
            float kv = 0.0f;
            for (int i = 0; i < d_k; i++) {
                Sj[i] *= decay;                 /* S = S * exp(g) */
                kv += Sj[i] * kt[i];            /* kv[j] = sum_i S[i][j] k[i] */
            }
            float d = b * (vt[j] - kv);         /* d = beta (v - kv) */
            float acc = 0.0f;
            for (int i = 0; i < d_k; i++) {
                Sj[i] += kt[i] * d;             /* S[i][j] += k[i] d[j] */
                acc += Sj[i] * qt[i];           /* o[j] = sum_i S[i][j] q[i] (updated S) */
            }
            ot[j] = acc;
        }
    }
}

long dnet_chunk_scratch_floats(int d_k, int d_v)
{
    const long C = DNET_CHUNK;
    /* R: C*(d_k+d_v); qg, kd: C*d_k each; O: C*d_v; G: C; A, Aqk: C*C each;
     * the chunk's q, k (C*d_k each) and v (C*d_v) gathered contiguous */
    return C * (d_k + d_v) + 2 * C * d_k + C * d_v + C + 2 * C * C + 2 * C * d_k + C * d_v;
}

/* ---- chunked form, section 1.4(g) ----
 * Per chunk of c <= 64 rows with cumulative log-decay G:
 *   L[i][j] = beta_i exp(G_i - G_j) k_i.k_j  (i > j);  T = (I + L)^-1
 *   U = T (v * beta);  W = T (k * beta * exp(G))
 *   Vnew = U - W S_hf;   O = (q * exp(G)) S_hf + (lower_incl(q k^T .* D)) Vnew
 *   S_hf = S_hf exp(G_last) + (k * exp(G_last - G))^T Vnew
 * with S_hf = S^T in our layout. T is never formed: [W | U] is the
 * solution of (I + L) [W | U] = [k beta exp(G) | v beta], one unit lower
 * triangular solve (trsm) with both right-hand sides side by side, in
 * place of building T column by column by forward substitution and the
 * two products with T (the profile: docs/performance.md section 12). */
void dnet_chunked_head(int n, int d_k, int d_v, const float *q, int q_stride,
                       const float *k, int k_stride, const float *v, int v_stride,
                       const float *beta, const float *g, float *S, float *o, int o_stride,
                       float *scratch)
{
    const int C = DNET_CHUNK, ldr = d_k + d_v;
    float *R = scratch, *qg = R + C * ldr, *kd = qg + C * d_k, *O = kd + C * d_k;
    float *G = O + C * d_v, *A = G + C, *Aqk = A + C * C;
    float *qb = Aqk + C * C, *kb = qb + C * d_k, *vb = kb + C * d_k;

    for (int c0 = 0; c0 < n; c0 += C) {
        const int c = n - c0 < C ? n - c0 : C;
        /* the chunk's rows, contiguous: in a model they are rows of the
         * fused qkv projection, tens of KiB apart, and every product below
         * would pack them from a different page per row */
        for (int i = 0; i < c; i++) {
            memcpy(qb + (size_t)i * d_k, q + (size_t)(c0 + i) * q_stride, sizeof(float) * (size_t)d_k);
            memcpy(kb + (size_t)i * d_k, k + (size_t)(c0 + i) * k_stride, sizeof(float) * (size_t)d_k);
            memcpy(vb + (size_t)i * d_v, v + (size_t)(c0 + i) * v_stride, sizeof(float) * (size_t)d_v);
        }
        const float *qc = qb, *kc = kb, *vc = vb;
        const int qs = d_k, ks = d_k, vs = d_v;

        /* G = cumsum(g) within the chunk */
        float acc = 0.0f;
        for (int i = 0; i < c; i++) {
            acc += g[c0 + i];
            G[i] = acc;
        }
        const float g_last = G[c - 1];

        /* R = [k * beta * exp(G) | v * beta];  qg = q * exp(G);  kd = k * exp(G_last - G) */
        for (int i = 0; i < c; i++) {
            const float *ki = kc + (size_t)i * ks, *qi = qc + (size_t)i * qs;
            const float *vi = vc + (size_t)i * vs;
            float b = beta[c0 + i], eg = expf(G[i]), el = expf(g_last - G[i]), be = b * eg;
            float *Ri = R + (size_t)i * ldr;
            for (int d = 0; d < d_k; d++) {
                Ri[d] = ki[d] * be;
                qg[i * d_k + d] = qi[d] * eg;
                kd[i * d_k + d] = ki[d] * el;
            }
            for (int d = 0; d < d_v; d++)
                Ri[d_k + d] = vi[d] * b;
        }

        /* A = k k^T;  Aqk = q k^T */
        gemm(false, true, c, c, d_k, 1.0f, kc, ks, kc, ks, 0.0f, A, C);
        gemm(false, true, c, c, d_k, 1.0f, qc, qs, kc, ks, 0.0f, Aqk, C);

        /* with D[i][j] = exp(G_i - G_j):
         * A[i][j] = L[i][j] = beta_i D[i][j] (k_i.k_j) for j < i (the unit diagonal is implicit);
         * Aqk[i][j] = (q_i.k_j) D[i][j] for j <= i, 0 above */
        for (int i = 0; i < c; i++) {
            const float bi = beta[c0 + i];
            for (int j = 0; j < i; j++) {
                float dij = expf(G[i] - G[j]);
                A[i * C + j] *= bi * dij;
                Aqk[i * C + j] *= dij;
            }
            for (int j = i + 1; j < c; j++)
                Aqk[i * C + j] = 0.0f;
        }

        /* [W | U] = (I + L)^-1 R, in place */
        trsm_lower_unit(c, ldr, A, C, R, ldr);
        float *W = R, *U = R + d_k;

        /* Vnew = U - W S_hf = U - W S^T  (in place in U) */
        gemm(false, true, c, d_v, d_k, -1.0f, W, ldr, S, d_k, 1.0f, U, ldr);
        /* O = qg S^T + Aqk Vnew */
        gemm(false, true, c, d_v, d_k, 1.0f, qg, d_k, S, d_k, 0.0f, O, d_v);
        gemm(false, false, c, d_v, c, 1.0f, Aqk, C, U, ldr, 1.0f, O, d_v);
        for (int i = 0; i < c; i++)
            memcpy(o + (size_t)(c0 + i) * o_stride, O + (size_t)i * d_v, (size_t)d_v * sizeof(float));

        /* S = S exp(G_last) + Vnew^T kd */
        float el = expf(g_last);
        for (long x = 0; x < (long)d_v * d_k; x++)
            S[x] *= el;
        gemm(true, false, d_v, d_k, c, 1.0f, U, ldr, kd, d_k, 1.0f, S, d_k);
    }
}

/* The recurrent form on the fastest kernel this CPU has: one step per token
 * from the kernel table (cpu.h: AVX2, simd_avx2.c), else the scalar
 * reference above. Same semantics;
 * tests/test_kernels.c compares the step with dnet_recurrent_head. */
static void dnet_recurrent_fast(int n, int d_k, int d_v, const float *q, int q_stride,
                                const float *k, int k_stride, const float *v, int v_stride,
                                const float *beta, const float *g, float *S, float *o, int o_stride)
{
    if (!cpu_kern.dnet_step) {
        dnet_recurrent_head(n, d_k, d_v, q, q_stride, k, k_stride, v, v_stride, beta, g, S, o, o_stride);
        return;
    }
    for (int t = 0; t < n; t++)
        cpu_kern.dnet_step(d_k, d_v, q + (size_t)t * q_stride, k + (size_t)t * k_stride,
                       v + (size_t)t * v_stride, beta[t], g[t], S, o + (size_t)t * o_stride, t == 0);
}

long dnet_scratch_floats(const model *m)
{
    /* chunk scratch + beta and g gathered for up to ENGINE_UBATCH rows + one
     * head's state in f32 (when the cache keeps it in bf16) */
    return dnet_chunk_scratch_floats(m->ssm_d_k, m->ssm_d_v) + 2 * ENGINE_UBATCH +
           (long)m->ssm_d_k * m->ssm_d_v;
}

/* Rows [row0, row0 + n) of all items are contiguous in the pass and the
 * items follow each other, so T = last row0 + n. */
static int total_rows(const fwd_item *items, int n_items)
{
    const fwd_item *last = &items[n_items - 1];
    return last->row0 + last->n;
}

/* Rows [t0, t0 + n) of one value head through the delta rule, from state
 * S (updated): the chunked or the recurrent form. q, k, v rows are CD
 * apart, o rows o_stride; bt, gt: beta and g per row. */
static void dnet_head_rows(bool chunked, int t0, int n, int DK, int DV, const float *q, const float *k,
                           const float *v, int CD, const float *bt, const float *gt, float *S, float *o,
                           int o_stride, float *sc)
{
    if (n <= 0)
        return;
    q += (size_t)t0 * CD;
    k += (size_t)t0 * CD;
    v += (size_t)t0 * CD;
    o += (size_t)t0 * o_stride;
    if (chunked)
        dnet_chunked_head(n, DK, DV, q, CD, k, CD, v, CD, bt + t0, gt + t0, S, o, o_stride, sc);
    else
        dnet_recurrent_fast(n, DK, DV, q, CD, k, CD, v, CD, bt + t0, gt + t0, S, o, o_stride);
}

/* dnet_head_rows's arguments but the rows, for rec_head_rows */
typedef struct dnet_rows_ctx {
    bool chunked;
    int DK, DV;
    const float *q, *k, *v;
    int CD;
    const float *bt, *gt;
    float *o;
    int o_stride;
    float *sc;
} dnet_rows_ctx;

static void dnet_rows(void *ctx, int t0, int n, float *S)
{
    const dnet_rows_ctx *r = ctx;
    dnet_head_rows(r->chunked, t0, n, r->DK, r->DV, r->q, r->k, r->v, r->CD, r->bt, r->gt, S, r->o, r->o_stride,
                   r->sc);
}

/* Which form runs a multi-token input in ENGINE_DNET_AUTO: the one that
 * is faster here. Measured (make bench, Qwen3.5-0.8B shape, f32, 2048-token
 * prompt, 2 threads; bench/results): in isolation the chunked form on
 * OpenBLAS is 7.8x the scalar recurrence but only 1.1x the AVX2 step; in
 * the whole model the AVX2 step prefills at 158-172 tok/s against the
 * chunked form's 102-125 (27% of the chunked prefill's samples are the
 * per-chunk 64 x 128 products and solves, each a separate OpenBLAS call).
 * So with AVX2 prompts run the AVX2 step; without it, the chunked form.
 * ENGINE_DNET_CHUNKED / _RECURRENT force either (tests, benchmarks).
 *
 * Every step runs over all items of the pass at once: one fork/join per
 * step and layer whatever the batch, so 64 sequences decoding together do
 * not pay 64 x 4 of them per layer. */
void dnet_forward(const model *m, const layer *L, const cache *c, const fwd_item *items,
                  int n_items, float *QKV, float *B, float *A, const float *Z, float *O,
                  int mode, float *scratch)
{
    const int CD = m->conv_dim, NK = m->ssm_n_k, NV = m->ssm_n_v;
    const int DK = m->ssm_d_k, DV = m->ssm_d_v;
    const float q_scale = 1.0f / sqrtf((float)DK);
    const int T = total_rows(items, n_items);
    const bool par = T >= DNET_PAR_MIN_ROWS;

    /* (b) conv: each thread a share of the channels, for every item (an
     * exact pass: one thread, the channel blocks of a one-token step) */
    #pragma omp parallel if (par && !items_exact(items, n_items))
    {
        const int nt = omp_get_num_threads(), th = omp_get_thread_num();
        const int c0 = (int)((long)CD * th / nt), c1 = (int)((long)CD * (th + 1) / nt);
        conv1d_items(items, n_items, QKV, CD, CD, m->ssm_k, L->conv1d_t, NULL, L->rec_conv, true, c0, c1);
    }

    /* (c), (d): l2-normalise q and k per key head, scale q; beta and g per value head */
    #pragma omp parallel for schedule(static) if (par)
    for (int row = 0; row < T; row++) {
        float *x = QKV + (size_t)row * CD;
        for (int h = 0; h < NK; h++) {
            float *qh = x + (size_t)h * DK, *kh = x + (size_t)(NK + h) * DK;
            l2norm(qh, DK, m->eps);
            l2norm(kh, DK, m->eps);
            for (int d = 0; d < DK; d++)
                qh[d] *= q_scale;
        }
        float *b = B + (size_t)row * NV, *a = A + (size_t)row * NV;
        for (int h = 0; h < NV; h++) {
            b[h] = sigmoid(b[h]);                                  /* beta = sigmoid(b) */
            a[h] = L->ssm_a[h] * softplus(a[h] + L->dt_bias[h]);   /* g = ssm_a softplus(a + dt_bias) */
        }
    }

    /* (e)-(g): per item and value head h; key head h % n_k in qwen35's
     * tiled order, h / r in the grouped order of qwen3next and Hugging Face.
     * An exact item takes its one-token steps' forms: recurrent unless
     * forced chunked (then chunks of one token), a bf16 state stepped in
     * place or rounded after each token. */
    #pragma omp parallel for schedule(dynamic, 1)
    for (int w = 0; w < n_items * NV; w++) {
        const fwd_item *it = &items[w / NV];
        const int h = w % NV;
        const bool chunked = mode == ENGINE_DNET_CHUNKED ||
                             (mode == ENGINE_DNET_AUTO && it->n > 1 && !it->exact && !cpu_kern.dnet_step);
        const int kh = m->dnet_grouped ? h / (NV / NK) : h % NK;
        float *sc = scratch + (size_t)omp_get_thread_num() * dnet_scratch_floats(m);
        const float *base = QKV + (size_t)it->row0 * CD;
        const float *q = base + (size_t)kh * DK, *k = base + (size_t)(NK + kh) * DK;
        const float *v = base + (size_t)2 * NK * DK + (size_t)h * DV;
        /* beta and g are strided by n_v: gather into the tail of scratch */
        float *bt = sc + dnet_chunk_scratch_floats(DK, DV), *gt = bt + it->n;
        for (int t = 0; t < it->n; t++) {
            bt[t] = B[(size_t)(it->row0 + t) * NV + h];
            gt[t] = A[(size_t)(it->row0 + t) * NV + h];
        }
        const size_t at = L->rec_state + (size_t)h * DV * DK;                        /* [DV][DK] */
        const bool b16 = c->state_type == GGML_BF16;
        float *o = O + (size_t)it->row0 * NV * DV + (size_t)h * DV;
        if (b16 && !chunked && cpu_kern.dnet_step_bf16 && ((it->n == 1 && !it->snap && !it->ckpt) || it->exact)) {
            /* a decode step, or an exact item's tokens one by one: in place */
            uint16_t *S16 = (uint16_t *)it->s->state + at;
            for (int t = 0; t < it->n; t++) {
                uint8_t *into[2] = { item_snap_at(it, t), item_ckpt_at(it, t) };
                for (int j = 0; j < 2; j++)
                    if (into[j])
                        memcpy((uint16_t *)(void *)into[j] + at, S16, sizeof(uint16_t) * (size_t)DV * DK);
                const size_t r = (size_t)t * CD;
                if (cpu_kern.dnet_step_bf16_x16 && DK % 16 == 0 && DV % 4 == 0)
                    cpu_kern.dnet_step_bf16_x16(DK, DV, q + r, k + r, v + r, bt[t], gt[t], S16, o + (size_t)t * NV * DV);
                else
                    cpu_kern.dnet_step_bf16(DK, DV, q + r, k + r, v + r, bt[t], gt[t], S16, o + (size_t)t * NV * DV);
            }
            continue;
        }
        /* else a bf16 state runs in f32 in scratch, rounded back at the end
         * of the call; rows [0, snap_at), the state copied into the
         * snapshot, then the rest. The recurrent form runs token by token
         * either way (the same numbers as without the copy); the chunked
         * form restarts its chunks at snap_at. */
        dnet_rows_ctx rc = { chunked, DK, DV, q, k, v, CD, bt, gt, o, NV * DV, sc };
        rec_head_rows(it, at, DV * DK, b16, it->exact && (b16 || chunked), bt + 2 * ENGINE_UBATCH, dnet_rows, &rc);
    }

    /* (h): o_h = rmsnorm(o_h) * w * silu(z_h) */
    #pragma omp parallel for schedule(static) if (par)
    for (int row = 0; row < T; row++) {
        for (int h = 0; h < NV; h++) {
            float *oh = O + (size_t)row * NV * DV + (size_t)h * DV;
            const float *zh = Z + (size_t)row * NV * DV + (size_t)h * DV;
            rmsnorm(oh, oh, L->ssm_norm, DV, m->eps);
            vec_silu_mul(oh, zh, oh, DV);
        }
    }
}

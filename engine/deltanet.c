/* deltanet.c - the gated delta rule: conv, recurrent step and chunked form.
 *
 * Owns: the causal depthwise conv with its cached state, q/k L2 norm,
 * beta/g, the recurrence per value head (two paths that must agree: token
 * by token, and the chunked WY/UT form built on matrix products), and the
 * gated RMSNorm. Does not own: the projections (forward.c).
 * ref: ../shared/docs/architectures.md section 1.4 (a)-(i).
 *
 * State layout (llama.cpp's): S[h][j][i] with j over d_v and i over d_k,
 * i.e. the transpose of HF's [d_k][d_v]. Then S^T k and the rank-1 update
 * are row-contiguous.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "layers.h"
#include "ops.h"

#define DNET_CHUNK 64

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
    /* kb, qg, kd, W: C*d_k each; vb/U, O: C*d_v each; G: C; KK, T, Aqk: C*C each */
    return 4 * C * d_k + 2 * C * d_v + C + 3 * C * C;
}

/* ---- chunked form, section 1.4(g) ----
 * Per chunk of c <= 64 rows with cumulative log-decay G:
 *   L[i][j] = beta_i exp(G_i - G_j) k_i.k_j  (i > j);  T = (I + L)^-1
 *   U = T (v * beta);  W = T (k * beta * exp(G))
 *   Vnew = U - W S_hf;   O = (q * exp(G)) S_hf + (lower_incl(q k^T .* D)) Vnew
 *   S_hf = S_hf exp(G_last) + (k * exp(G_last - G))^T Vnew
 * with S_hf = S^T in our layout. */
void dnet_chunked_head(int n, int d_k, int d_v, const float *q, int q_stride,
                       const float *k, int k_stride, const float *v, int v_stride,
                       const float *beta, const float *g, float *S, float *o, int o_stride,
                       float *scratch)
{
    const int C = DNET_CHUNK;
    float *kb = scratch, *qg = kb + C * d_k, *kd = qg + C * d_k, *W = kd + C * d_k;
    float *U = W + C * d_k, *O = U + C * d_v, *G = O + C * d_v;
    float *KK = G + C, *T = KK + C * C, *Aqk = T + C * C;

    for (int c0 = 0; c0 < n; c0 += C) {
        const int c = n - c0 < C ? n - c0 : C;
        const float *qc = q + (size_t)c0 * q_stride, *kc = k + (size_t)c0 * k_stride;
        const float *vc = v + (size_t)c0 * v_stride;

        /* G = cumsum(g) within the chunk */
        float acc = 0.0f;
        for (int i = 0; i < c; i++) {
            acc += g[c0 + i];
            G[i] = acc;
        }
        const float g_last = G[c - 1];

        /* kb = k * beta * exp(G) (for W);  U = v * beta (T applied below);
         * qg = q * exp(G);  kd = k * exp(G_last - G) */
        for (int i = 0; i < c; i++) {
            const float *ki = kc + (size_t)i * k_stride, *qi = qc + (size_t)i * q_stride;
            const float *vi = vc + (size_t)i * v_stride;
            float b = beta[c0 + i], eg = expf(G[i]), el = expf(g_last - G[i]);
            for (int d = 0; d < d_k; d++) {
                kb[i * d_k + d] = ki[d] * b * eg;
                qg[i * d_k + d] = qi[d] * eg;
                kd[i * d_k + d] = ki[d] * el;
            }
            for (int d = 0; d < d_v; d++)
                U[i * d_v + d] = vi[d] * b;
        }

        /* KK = k k^T;  Aqk = q k^T */
        gemm(false, true, c, c, d_k, 1.0f, kc, k_stride, kc, k_stride, 0.0f, KK, C);
        gemm(false, true, c, c, d_k, 1.0f, qc, q_stride, kc, k_stride, 0.0f, Aqk, C);

        /* T = (I + L)^-1 by forward substitution (unit lower triangular):
         * T[i][j] = -sum_{m=j}^{i-1} L[i][m] T[m][j], L[i][m] = beta_i D[i][m] KK[i][m] */
        for (int i = 0; i < c; i++) {
            float bi = beta[c0 + i];
            for (int m = 0; m < i; m++)
                KK[i * C + m] *= bi * expf(G[i] - G[m]);   /* KK now holds L */
            for (int j = 0; j < c; j++)
                T[i * C + j] = 0.0f;
            T[i * C + i] = 1.0f;
            for (int j = 0; j < i; j++) {
                float s = 0.0f;
                for (int mm = j; mm < i; mm++)
                    s += KK[i * C + mm] * T[mm * C + j];
                T[i * C + j] = -s;
            }
            /* Aqk keeps the diagonal: (q_i.k_j) exp(G_i - G_j), j <= i */
            for (int j = 0; j <= i; j++)
                Aqk[i * C + j] *= expf(G[i] - G[j]);
            for (int j = i + 1; j < c; j++)
                Aqk[i * C + j] = 0.0f;
        }

        /* W = T kb;  U = T (v beta)  (U overwritten: use O as the temporary) */
        gemm(false, false, c, d_k, c, 1.0f, T, C, kb, d_k, 0.0f, W, d_k);
        gemm(false, false, c, d_v, c, 1.0f, T, C, U, d_v, 0.0f, O, d_v);
        memcpy(U, O, (size_t)c * d_v * sizeof(float));

        /* Vnew = U - W S_hf = U - W S^T */
        gemm(false, true, c, d_v, d_k, -1.0f, W, d_k, S, d_k, 1.0f, U, d_v);
        /* O = qg S^T + Aqk Vnew */
        gemm(false, true, c, d_v, d_k, 1.0f, qg, d_k, S, d_k, 0.0f, O, d_v);
        gemm(false, false, c, d_v, c, 1.0f, Aqk, C, U, d_v, 1.0f, O, d_v);
        for (int i = 0; i < c; i++)
            memcpy(o + (size_t)(c0 + i) * o_stride, O + (size_t)i * d_v, (size_t)d_v * sizeof(float));

        /* S = S exp(G_last) + Vnew^T kd */
        float el = expf(g_last);
        for (long x = 0; x < (long)d_v * d_k; x++)
            S[x] *= el;
        gemm(true, false, d_v, d_k, c, 1.0f, U, d_v, kd, d_k, 1.0f, S, d_k);
    }
}

long dnet_scratch_floats(const model *m)
{
    /* chunk scratch + beta and g gathered for up to ENGINE_UBATCH rows */
    return dnet_chunk_scratch_floats(m->ssm_d_k, m->ssm_d_v) + 2 * ENGINE_UBATCH;
}

void dnet_forward(const model *m, const layer *L, const cache *c, const fwd_item *items,
                  int n_items, float *QKV, float *B, float *A, const float *Z, float *O,
                  int mode, float *scratch)
{
    const int CD = m->conv_dim, K = m->ssm_k, NK = m->ssm_n_k, NV = m->ssm_n_v;
    const int DK = m->ssm_d_k, DV = m->ssm_d_v, ld = L->kind_idx;
    const float q_scale = 1.0f / sqrtf((float)DK);

    for (int ii = 0; ii < n_items; ii++) {
        const fwd_item *it = &items[ii];
        float *conv = it->s->conv + (size_t)ld * (K - 1) * CD;      /* [K-1][CD] */
        float *state = it->s->state + (size_t)ld * NV * DV * DK;    /* [NV][DV][DK] */

        /* (b) causal depthwise conv + SiLU, in place, channel by channel:
         * u_t[ch] = silu(sum_j w[ch][j] x_{t-K+1+j}[ch]); the window keeps raw inputs */
        #pragma omp parallel for schedule(static)
        for (int ch = 0; ch < CD; ch++) {
            float win[16];
            const float *w = L->conv1d + (size_t)ch * K;
            for (int j = 0; j < K - 1; j++)
                win[j] = conv[(size_t)j * CD + ch];
            for (int t = 0; t < it->n; t++) {
                float *x = QKV + (size_t)(it->row0 + t) * CD + ch;
                win[K - 1] = *x;
                float s = 0.0f;
                for (int j = 0; j < K; j++)
                    s += w[j] * win[j];
                for (int j = 0; j < K - 1; j++)
                    win[j] = win[j + 1];
                *x = silu(s);
            }
            for (int j = 0; j < K - 1; j++)
                conv[(size_t)j * CD + ch] = win[j];
        }

        /* (c), (d): l2-normalise q and k per key head, scale q; beta and g per value head */
        #pragma omp parallel for schedule(static)
        for (int t = 0; t < it->n; t++) {
            float *row = QKV + (size_t)(it->row0 + t) * CD;
            for (int h = 0; h < NK; h++) {
                float *qh = row + (size_t)h * DK, *kh = row + (size_t)(NK + h) * DK;
                l2norm(qh, DK, m->eps);
                l2norm(kh, DK, m->eps);
                for (int d = 0; d < DK; d++)
                    qh[d] *= q_scale;
            }
            float *b = B + (size_t)(it->row0 + t) * NV, *a = A + (size_t)(it->row0 + t) * NV;
            for (int h = 0; h < NV; h++) {
                b[h] = sigmoid(b[h]);                                  /* beta = sigmoid(b) */
                a[h] = L->ssm_a[h] * softplus(a[h] + L->dt_bias[h]);   /* g = ssm_a softplus(a + dt_bias) */
            }
        }

        /* (e)-(g): per value head h; key head h % n_k in qwen35's tiled order,
         * h / r in the grouped order of qwen3next and Hugging Face */
        const bool chunked = mode == ENGINE_DNET_CHUNKED || (mode == ENGINE_DNET_AUTO && it->n > 1);
        #pragma omp parallel for schedule(dynamic, 1)
        for (int h = 0; h < NV; h++) {
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
            float *S = state + (size_t)h * DV * DK;
            float *o = O + (size_t)it->row0 * NV * DV + (size_t)h * DV;
            if (chunked)
                dnet_chunked_head(it->n, DK, DV, q, CD, k, CD, v, CD, bt, gt, S, o, NV * DV, sc);
            else
                dnet_recurrent_head(it->n, DK, DV, q, CD, k, CD, v, CD, bt, gt, S, o, NV * DV);
        }

        /* (h): o_h = rmsnorm(o_h) * w * silu(z_h) */
        #pragma omp parallel for schedule(static)
        for (int t = 0; t < it->n; t++) {
            for (int h = 0; h < NV; h++) {
                float *oh = O + (size_t)(it->row0 + t) * NV * DV + (size_t)h * DV;
                const float *zh = Z + (size_t)(it->row0 + t) * NV * DV + (size_t)h * DV;
                rmsnorm(oh, oh, L->ssm_norm, DV, m->eps);
                for (int d = 0; d < DV; d++)
                    oh[d] *= silu(zh[d]);
            }
        }
    }
}

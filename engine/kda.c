/* kda.c - Kimi Delta Attention (KDA), Kimi Linear's recurrent layer.
 *
 * Owns: a KDA layer from its normed input to its output: the q, k, v
 * projections, each through its own causal conv (+ SiLU) with its window
 * in the slot (conv1d.c), the per-channel decay g = A_h softplus(f_b(f_a x)
 * + dt_bias), beta = sigmoid(W_b x), q and k L2-normed (q scaled by
 * 1/sqrt(d)), the gated delta rule with a decay per key channel, the
 * per-head RMSNorm gated by sigmoid(g_b(g_a x)) and the out projection.
 * llama.cpp: src/models/kimi-linear.cpp (build_delta_net with a per-channel
 * g). Does not own: the slot (cache.c).
 *
 * Per head, S [d (value)][d (key)] as DeltaNet keeps it, per token:
 *   S[j][i] *= exp(g[i]);  kv_j = S[j] . k;  S[j] += k (beta (v_j - kv_j));
 *   o_j = S[j] . q
 * i.e. S_t = (I - beta k k^T) Diag(exp g) S_{t-1} + beta k v^T in the
 * paper's orientation. Prompts run the same recurrence, token by token,
 * parallel over sequences and heads: the chunked (WY) form with a decay
 * per channel needs the decay of every pair of rows per channel, which is
 * not written yet (docs/architecture.md, the recurrent kinds).
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

void kda_recurrent_head(int n, int d, const float *q, const float *k, const float *v, int stride, const float *g,
                        int g_stride, const float *beta, int beta_stride, float *S, float *o, int o_stride)
{
    float eg[512];
    for (int t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * stride, *kt = k + (size_t)t * stride, *vt = v + (size_t)t * stride;
        const float *gt = g + (size_t)t * g_stride, b = beta[(size_t)t * beta_stride];
        float *ot = o + (size_t)t * o_stride;
        for (int i = 0; i < d; i++)
            eg[i] = expf(gt[i]);
        for (int j = 0; j < d; j++) {
            float *Sj = S + (size_t)j * d, kv = 0.0f, acc = 0.0f;
            #pragma omp simd reduction(+ : kv)
            for (int i = 0; i < d; i++) {
                Sj[i] *= eg[i];
                kv += Sj[i] * kt[i];
            }
            const float dj = b * (vt[j] - kv);
            #pragma omp simd reduction(+ : acc)
            for (int i = 0; i < d; i++) {
                Sj[i] += kt[i] * dj;
                acc += Sj[i] * qt[i];
            }
            ot[j] = acc;
        }
    }
}

/* The recurrence on the fastest kernel this CPU has (cpu.h: AVX2, for d a
 * multiple of 8), else the scalar one above; tests/test_kernels.c holds
 * both to the recurrence in double. */
static void kda_head_fast(int n, int d, const float *q, const float *k, const float *v, int stride, const float *g,
                          int g_stride, const float *beta, int beta_stride, float *S, float *o, int o_stride)
{
    if (!cpu_kern.kda_step || d % 8 || d > 512) {
        kda_recurrent_head(n, d, q, k, v, stride, g, g_stride, beta, beta_stride, S, o, o_stride);
        return;
    }
    float eg[512];
    for (int t = 0; t < n; t++) {
        const float *gt = g + (size_t)t * g_stride;
        for (int i = 0; i < d; i++)
            eg[i] = expf(gt[i]);
        cpu_kern.kda_step(d, q + (size_t)t * stride, k + (size_t)t * stride, v + (size_t)t * stride,
                          beta[(size_t)t * beta_stride], eg, S, o + (size_t)t * o_stride);
    }
}

long kda_scratch_floats(const model *m)
{
    return (long)m->kda_head_dim * m->kda_head_dim;     /* one head's state in f32 (a bf16 cache) */
}

/* one head's rows from its first (q, k, v, g, o at stride W; beta at H), for rec_head_rows */
typedef struct kda_rows_ctx {
    int D, W, H;
    const float *q, *k, *v, *g, *beta;
    float *o;
} kda_rows_ctx;

static void kda_rows(void *ctx, int t0, int n, float *S)
{
    const kda_rows_ctx *r = ctx;
    const size_t o2 = (size_t)t0 * r->W;
    kda_head_fast(n, r->D, r->q + o2, r->k + o2, r->v + o2, r->W, r->g + o2, r->W, r->beta + (size_t)t0 * r->H, r->H,
                  S, r->o + o2, r->W);
}

void kda_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode)
{
    const model *m = e->m;
    const cache *c = &e->kv;
    fwd_scratch *s = &e->sc;
    const int H = m->kda_heads, D = m->kda_head_dim, W = H * D, K = m->ssm_k;
    float *q = s->kda.q, *k = s->kda.k, *v = s->kda.v, *g = s->kda.g, *beta = s->kda.beta, *gate = s->kda.gate;
    float *O = s->mix;
    const bool par = T >= 8;

    matmul_many(3, (float *[]){ q, k, v }, (const weight *[]){ &L->wq, &L->wk, &L->wv }, s->xn, T, decode, s->mm);
    /* three convs, one ring each: q's, then k's, then v's in the layer's part of the slot */
    float *qkv[3] = { q, k, v };
    for (int p = 0; p < 3; p++) {
        #pragma omp parallel if (par && !items_exact(items, n_items))   /* exact: a one-token step's blocks */
        {
            const int nt = omp_get_num_threads(), th = omp_get_thread_num();
            const int c0 = (int)((long)W * th / nt), c1 = (int)((long)W * (th + 1) / nt);
            conv1d_items(items, n_items, qkv[p], W, W, K, L->conv1d_t + (size_t)p * K * W, NULL,
                         L->rec_conv + (size_t)p * (K - 1) * W, true, c0, c1);
        }
    }
    /* g = A_h softplus(f_b(f_a x) + dt_bias); beta = sigmoid(W_b x); the output gate */
    matmul(s->kda.lr, &L->ssm_fa, s->xn, T, decode, s->mm);
    matmul(g, &L->ssm_fb, s->kda.lr, T, decode, s->mm);
    matmul(beta, &L->wb, s->xn, T, decode, s->mm);
    if (L->wz.data) {
        matmul(gate, &L->wz, s->xn, T, decode, s->mm);
    } else {
        matmul(s->kda.lr, &L->ssm_ga, s->xn, T, decode, s->mm);
        matmul(gate, &L->ssm_gb, s->kda.lr, T, decode, s->mm);
    }
    const float qs = 1.0f / sqrtf((float)D);
    #pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < T; r++) {
        float *gr = g + (size_t)r * W, *qr = q + (size_t)r * W, *kr = k + (size_t)r * W;
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < D; i++)
                gr[h * D + i] = L->ssm_a[h] * softplus(gr[h * D + i] + L->dt_bias[h * D + i]);
            l2norm(qr + (size_t)h * D, D, m->eps);
            l2norm(kr + (size_t)h * D, D, m->eps);
            for (int i = 0; i < D; i++)
                qr[h * D + i] *= qs;
            beta[(size_t)r * H + h] = sigmoid(beta[(size_t)r * H + h]);
        }
    }

    const bool b16 = c->state_type == GGML_BF16;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int w = 0; w < n_items * H; w++) {
        const fwd_item *it = &items[w / H];
        const int h = w % H;
        const size_t at = L->rec_state + (size_t)h * D * D, off = (size_t)it->row0 * W + (size_t)h * D;
        kda_rows_ctx rc = { D, W, H, q + off, k + off, v + off, g + off, beta + (size_t)it->row0 * H + h, O + off };
        rec_head_rows(it, at, D * D, b16, it->exact && b16,
                      s->rec_work + (size_t)omp_get_thread_num() * s->rec_stride, kda_rows, &rc);
    }
    /* o_h = RMSNorm(o_h) * w * sigmoid(gate_h) */
    #pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < T; r++)
        for (int h = 0; h < H; h++) {
            float *oh = O + (size_t)r * W + (size_t)h * D;
            rmsnorm(oh, oh, L->ssm_norm, D, m->eps);
            vec_sigmoid_mul(oh, gate + (size_t)r * W + (size_t)h * D, D);
        }
    matmul(s->y, &L->wo, O, T, decode, s->mm);
}

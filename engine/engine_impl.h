/* engine_impl.h - the engine struct, shared by engine.c and forward.c only. */
#ifndef HYSERVE_ENGINE_IMPL_H
#define HYSERVE_ENGINE_IMPL_H

#include "cache.h"
#include "engine.h"
#include "layers.h"
#include "model.h"
#include "tokenizer.h"

/* The memory the per-kind scratch roles below share: a layer runs one
 * mixer kind and then its FFN, so the roles of different kinds (and the
 * FFN's) point into the same slabs, each sized at open for the largest
 * role it holds. Owned by fwd_scratch (freed at close). */
enum { SLAB_1, SLAB_2, SLAB_3, SLAB_4, SLAB_5, N_SLABS };

/* Scratch for one internal pass of up to ENGINE_UBATCH (UB) rows; allocated
 * at open so that prefill and decode allocate nothing. Owned by the
 * engine's owner thread. Roles sharing a slab are marked [slab n]. */
typedef struct fwd_scratch {
    float *x;           /* [UB][n_embd] residual stream */
    float *xn;          /* [UB][n_embd] normed input of the mixer, then of the FFN */
    float *mix;         /* [UB][max(n_head*head_dim, n_v*d_v, n_head*mla_v)] the mixer's output, before wo/wout */
    float *y;           /* [UB][n_embd] block output, added into x */
    float *slab[N_SLABS];
    struct {            /* gated attention */
        float *q;       /* [UB][n_head*2*head_dim] per head [q | gate]  [slab 1] */
        float *k, *v;   /* [UB][n_kv*head_dim]  [slab 2], [slab 3] */
    } attn;
    struct {            /* multi-head latent attention */
        float *q;       /* [UB][n_head*(nope+rope)] per head [q_nope | q_pe]  [slab 1] */
        float *kv;      /* [UB][kv_lora+rope] latent c and k_pe  [slab 2] */
        float *q_lora;  /* [UB][q_lora] W_qa x, normed in place  [slab 5] */
    } mla;
    struct {            /* Gated DeltaNet */
        float *qkv;     /* [UB][conv_dim] conv input  [slab 1] */
        float *beta;    /* [UB][n_v] beta logits -> beta  [slab 2] */
        float *z;       /* [UB][n_v*d_v] output gate  [slab 3] */
        float *alpha;   /* [UB][n_v] alpha logits -> g  [slab 4] */
        float *fused;   /* [UB][max(ssm_in width, 2*n_v)] qwen3next: fused projections before
                           de-interleaving  [slab 5] */
    } dnet;
    struct {            /* SwiGLU MLP, and each expert's and the shared expert's */
        float *gate;    /* [UB][max(n_ff, n_ff_exp, n_ff_shexp)] gate(x), then silu(gate) * up  [slab 1] */
        float *up;      /* [UB][the same] up(x)  [slab 2] */
    } ffn;
    struct {            /* mixture of experts */
        float *probs;   /* [UB][n_expert] router logits -> probabilities  [slab 5] */
        float *in;      /* [UB][max(n_embd, moe_latent)] the rows routed to one expert, gathered */
        float *out;     /* [UB][the same] an expert's (or the shared expert's) output */
        float *lat;     /* [2][UB][moe_latent] the experts' input and their weighted sum (NULL: no latent) */
        int *sel;       /* [UB][n_expert_used] chosen experts per row */
        float *selw;    /* [UB][n_expert_used] their renormalised weights */
        int *rows;      /* [UB] rows routed to one expert */
        float *roww;    /* [UB] and their weights */
    } moe;
    struct {            /* Mamba-2 */
        float *zxd;     /* [UB][m2_in_dim] the input projection [z | x | B | C | dt]  [slab 1] */
    } m2;
    struct {            /* short convolution */
        float *bcx;     /* [UB][3 n_embd] the input projection [B | C | x]  [slab 1] */
    } sconv;
    struct {            /* Mamba-1 */
        float *xz;      /* [UB][2 d_inner] the input projection [x | z]  [slab 1] */
        float *dt;      /* [UB][d_inner] dt_proj(dt), then softplus'd  [slab 2] */
        float *x;       /* [UB][d_inner] the conv'd x, contiguous  [slab 3] */
        float *dtr;     /* [UB][dt_rank] dt, normed  [slab 4] */
        float *xdb;     /* [UB][dt_rank + 2 d_state] x_proj(x): dt | B | C  [slab 5] */
    } m1;
    struct {            /* Kimi Delta Attention (allocated only for models with KDA layers) */
        float *q, *k, *v;   /* [UB][heads * d] each: projected, then conv'd */
        float *g;       /* [UB][heads * d] the per-channel log decay */
        float *gate;    /* [UB][heads * d] the output gate's logits */
        float *beta;    /* [UB][heads] */
        float *lr;      /* [UB][d] the low-rank middle of f_a/f_b and g_a/g_b */
    } kda;
    float *rec_work;    /* [n_threads][rec_stride]: the largest recurrent kind's scratch (== dnet_work) */
    long rec_stride;
    float *mla_work;    /* mla_scratch_floats(): expanded keys/values or absorbed queries */
    float *mm;          /* matmul tile scratch */
    float *scores;      /* [n_threads][n_ctx] attention scores */
    float *dnet_work;   /* [n_threads][dnet_scratch_floats] */
    float *logits;      /* [LOGIT_GROUP][n_vocab] */
    float *lx;          /* [LOGIT_GROUP][n_embd] */
} fwd_scratch;

#define LOGIT_GROUP 16

/* Owned by the thread that opened it (see engine.h). */
struct engine {
    engine_params params;
    model *m;
    tokenizer *tok;
    cache kv;
    engine_info info;
    fwd_scratch sc;
    int n_threads;          /* threads of the next forward (engine_set_threads) */
    int n_threads_max;      /* threads at open: the scratch is sized for these */
    /* the MTP block's KV, with engine_params.mtp (mtp.c): one attention
     * layer, max_seqs sequences, pages from a budget of its own */
    bool mtp_on;
    cache mtp_kv;
    int *mtp_seq;           /* [max_seqs] the MTP sequence of each trunk sequence, -1 none */
    float *mtp_in;          /* [UB][2 n_embd] [enorm(e) | hnorm(h)] rows of a pass */
};

/* The cache an attention layer's K/V live in: the MTP block's own, or the trunk's. */
static inline const cache *layer_kv(const engine *e, const layer *L)
{
    return L == &e->m->mtp.blk ? &e->mtp_kv : &e->kv;
}

/* One layer over the rows of a pass (forward.c's layer loop body): the
 * trunk's layers and the MTP block. */
void fwd_layer(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode);

/* mtp.c: the MTP KV's lifecycle beside the trunk's sequences */
int mtp_open(engine *e, char *err, size_t errlen);
void mtp_close(engine *e);
void mtp_seq_new(engine *e, int seq);
void mtp_seq_free(engine *e, int seq);

/* The blocks of the recurrent kinds that live in files of their own: the
 * layer's normed input s->xn [T][n_embd] to its output s->y, as forward.c's
 * blocks do. */
void mamba2_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode);
void sconv_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode);
void mamba1_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode);
long mamba1_scratch_floats(const model *m);
void kda_block(engine *e, const layer *L, const fwd_item *items, int n_items, int T, bool decode);
long kda_scratch_floats(const model *m);

#endif

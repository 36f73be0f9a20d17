/* engine_impl.h - the engine struct, shared by engine.c and forward.c only. */
#ifndef HYSERVE_ENGINE_IMPL_H
#define HYSERVE_ENGINE_IMPL_H

#include "cache.h"
#include "engine.h"
#include "layers.h"
#include "model.h"
#include "tokenizer.h"

/* Scratch for one internal pass of up to ENGINE_UBATCH rows; allocated at
 * open so that prefill and decode allocate nothing. */
typedef struct fwd_scratch {
    float *x;           /* [UB][n_embd] residual stream */
    float *xn;          /* [UB][n_embd] normed input */
    float *a;           /* [UB][max(q_dim, conv_dim, n_ff)] first projection */
    float *b;           /* [UB][max(kv_dim, 2*n_v, n_ff)] second projection */
    float *c;           /* [UB][max(kv_dim, v_dim)] third projection */
    float *d;           /* [UB][max(n_head*head_dim, v_dim)] mixer output */
    float *e;           /* [UB][n_v] DeltaNet alpha logits -> g */
    float *y;           /* [UB][n_embd] block output */
    float *t;           /* [UB][max(ssm_in width, 2*n_v, n_expert)] temporary projections */
    float *g, *g2;      /* [UB][n_embd] MoE: gathered rows and expert output */
    int *sel;           /* [UB][n_expert_used] MoE: chosen experts per row */
    float *selw;        /* [UB][n_expert_used] MoE: their renormalised weights */
    int *rows;          /* [UB] MoE: rows routed to one expert */
    float *roww;        /* [UB] MoE: and their weights */
    float *mla;         /* mla_scratch_floats(): expanded keys/values or absorbed queries */
    float *mm;          /* matmul tile scratch */
    float *scores;      /* [n_threads][n_ctx] attention scores */
    float *dnet;        /* [n_threads][dnet_scratch_floats] */
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
};

#endif

/* memplan.c - cache byte arithmetic shared by the cache, /stats and the planner. */
#include "memplan.h"

static uint64_t u(int x) { return x > 0 ? (uint64_t)x : 0; }

const char *memplan_attn_kind(int heads, int kv_heads)
{
    if (kv_heads >= heads)
        return "mha";
    return kv_heads == 1 ? "mqa" : "gqa";
}

void memplan_set_state_dtype(memplan_layout *l, int bytes)
{
    if (l->conv_bytes <= 0)
        l->conv_bytes = l->state_bytes > 0 ? l->state_bytes : 4;
    l->state_bytes = bytes;
}

/* Products and sums that stick at UINT64_MAX instead of wrapping: a layout
 * from a request (POST /v1/memory/estimate) may have every dimension at
 * its 1e9 limit, and "more bytes than 64 bits count" must not come out as
 * a small number. A real model's numbers are far below, so they are exact. */
uint64_t memplan_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t memplan_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t mul3(uint64_t a, uint64_t b, uint64_t c) { return memplan_mul(memplan_mul(a, b), c); }
static uint64_t mul4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) { return memplan_mul(mul3(a, b, c), d); }
static uint64_t add3(uint64_t a, uint64_t b, uint64_t c) { return memplan_add(memplan_add(a, b), c); }

void memplan_costs_of(const memplan_layout *l, memplan_costs *c)
{
    const uint64_t kvb = u(l->kv_bytes), sb = u(l->state_bytes), cb = l->conv_bytes > 0 ? u(l->conv_bytes) : sb;
    c->gqa_numbers_per_token_layer = mul3(2, u(l->attn_kv_heads), u(l->attn_head_dim));
    c->mla_numbers_per_token_layer = u(l->mla_kv_lora) + u(l->mla_rope);
    c->attn_kv_bytes_per_token = mul3(u(l->attn_layers), c->gqa_numbers_per_token_layer, kvb);
    c->mla_bytes_per_token = mul3(u(l->mla_layers), c->mla_numbers_per_token_layer, kvb);
    c->cache_bytes_per_token = memplan_add(c->attn_kv_bytes_per_token, c->mla_bytes_per_token);

    /* Gated DeltaNet: S is n_v heads of d_k x d_v; the conv keeps K-1 inputs
     * of every channel of [q | k | v] */
    const uint64_t conv_dim = memplan_add(mul3(2, u(l->dnet_k_heads), u(l->dnet_d_k)),
                                          memplan_mul(u(l->dnet_v_heads), u(l->dnet_d_v)));
    c->dnet_state_bytes_per_seq = memplan_mul(mul4(u(l->dnet_layers), u(l->dnet_v_heads), u(l->dnet_d_k),
                                                   u(l->dnet_d_v)), sb);
    c->dnet_conv_bytes_per_seq = mul4(u(l->dnet_layers), l->dnet_conv > 1 ? u(l->dnet_conv - 1) : 0, conv_dim, cb);
    /* Mamba-1: d_state x d_inner SSM state + K-1 conv inputs of d_inner */
    c->mamba_state_bytes_per_seq = mul4(u(l->mamba_layers), u(l->mamba_d_inner), u(l->mamba_d_state), sb);
    const uint64_t mamba_conv = mul4(u(l->mamba_layers), u(l->mamba_d_inner), l->mamba_conv > 1 ? u(l->mamba_conv - 1) : 0, cb);
    c->mamba_bytes_per_seq = memplan_add(c->mamba_state_bytes_per_seq, mamba_conv);
    /* KDA: heads x hd x hd state + three short convs (q, k, v) of K-1 inputs */
    const uint64_t kda_width = memplan_mul(u(l->kda_heads), u(l->kda_head_dim));
    c->kda_state_bytes_per_seq = mul4(u(l->kda_layers), kda_width, u(l->kda_head_dim), sb);
    const uint64_t kda_conv = memplan_mul(u(l->kda_layers), mul4(3, l->kda_conv > 1 ? u(l->kda_conv - 1) : 0, kda_width, cb));
    c->kda_bytes_per_seq = memplan_add(c->kda_state_bytes_per_seq, kda_conv);
    /* Mamba-2: per head a head_dim x d_state state; the conv keeps K-1
     * inputs of x (heads * head_dim), B and C (groups * d_state each) */
    const uint64_t m2_inner = memplan_mul(u(l->mamba2_heads), u(l->mamba2_head_dim));
    c->mamba2_state_bytes_per_seq = mul4(u(l->mamba2_layers), m2_inner, u(l->mamba2_d_state), sb);
    c->mamba2_conv_bytes_per_seq = mul4(u(l->mamba2_layers), l->mamba2_conv > 1 ? u(l->mamba2_conv - 1) : 0,
                                        memplan_add(m2_inner, mul3(2, u(l->mamba2_groups), u(l->mamba2_d_state))), cb);
    /* short conv: K-1 inputs of every channel, nothing else */
    c->sconv_bytes_per_seq = mul4(u(l->sconv_layers), l->sconv_conv > 1 ? u(l->sconv_conv - 1) : 0,
                                  u(l->sconv_channels), cb);
    c->rec_state_bytes_per_seq = memplan_add(add3(c->dnet_state_bytes_per_seq, c->mamba_state_bytes_per_seq,
                                                  c->kda_state_bytes_per_seq), c->mamba2_state_bytes_per_seq);
    c->rec_conv_bytes_per_seq = memplan_add(add3(c->dnet_conv_bytes_per_seq, mamba_conv, kda_conv),
                                            memplan_add(c->mamba2_conv_bytes_per_seq, c->sconv_bytes_per_seq));
    c->state_bytes_per_seq = memplan_add(c->rec_state_bytes_per_seq, c->rec_conv_bytes_per_seq);
    c->page_bytes = memplan_mul(u(l->page_tokens), c->cache_bytes_per_token);

    /* counterfactuals: plain MHA keeps keys and values for every query head
     * (an MLA layer's MHA keeps nope-dim keys and v-dim values per head, the
     * seeds' 2 x 128 x 128); "all attention" turns every layer into the
     * model's own attention layer (GQA first, else MLA) */
    const uint64_t mha_attn = mul3(2, u(l->attn_heads), u(l->attn_head_dim));
    const uint64_t mha_mla = memplan_mul(u(l->mla_heads), u(l->mla_nope) + u(l->mla_v));
    const uint64_t mha_other = l->attn_layers > 0 ? mha_attn : mha_mla;
    uint64_t n_other = u(l->n_layers) - u(l->attn_layers) - u(l->mla_layers);
    if (u(l->n_layers) < u(l->attn_layers) + u(l->mla_layers))
        n_other = 0;
    c->mha_bytes_per_token = memplan_mul(add3(memplan_mul(u(l->attn_layers), mha_attn),
                                              memplan_mul(u(l->mla_layers), mha_mla),
                                              memplan_mul(n_other, mha_other)), kvb);
    const uint64_t own = l->attn_layers > 0 ? c->gqa_numbers_per_token_layer : c->mla_numbers_per_token_layer;
    c->all_attention_bytes_per_token = memplan_mul(add3(memplan_mul(u(l->attn_layers), c->gqa_numbers_per_token_layer),
                                                        memplan_mul(u(l->mla_layers), c->mla_numbers_per_token_layer),
                                                        memplan_mul(n_other, own)), kvb);
    /* the same layer count with one kind throughout, for comparing kinds
     * (the seeds' GQA-vs-MLA factors); a kind the layout lacks has none */
    c->gqa_all_layers_bytes_per_token =
        l->attn_layers > 0 ? mul3(u(l->n_layers), c->gqa_numbers_per_token_layer, kvb) : 0;
    c->mla_all_layers_bytes_per_token =
        l->mla_layers > 0 ? mul3(u(l->n_layers), c->mla_numbers_per_token_layer, kvb) : 0;
}

static uint64_t pages_for(const memplan_layout *l, int64_t n_tokens)
{
    uint64_t p = u(l->page_tokens) ? u(l->page_tokens) : 1;
    return n_tokens > 0 ? ((uint64_t)n_tokens + p - 1) / p : 0;
}

uint64_t memplan_seq_reserved_bytes(const memplan_layout *l, int64_t n_tokens)
{
    memplan_costs c;
    memplan_costs_of(l, &c);
    return memplan_add(c.state_bytes_per_seq, memplan_mul(pages_for(l, n_tokens), c.page_bytes));
}

uint64_t memplan_seq_used_bytes(const memplan_layout *l, int64_t n_tokens)
{
    memplan_costs c;
    memplan_costs_of(l, &c);
    return memplan_add(c.state_bytes_per_seq, memplan_mul(n_tokens > 0 ? (uint64_t)n_tokens : 0, c.cache_bytes_per_token));
}

int64_t memplan_max_batch(const memplan_layout *l, uint64_t budget, int64_t n_tokens)
{
    uint64_t per = memplan_seq_reserved_bytes(l, n_tokens);
    if (!per)
        return -1;      /* costs nothing, unbounded */
    return budget / per > INT64_MAX ? INT64_MAX : (int64_t)(budget / per);
}

int64_t memplan_max_context(const memplan_layout *l, uint64_t budget, int64_t batch)
{
    memplan_costs c;
    memplan_costs_of(l, &c);
    if (batch <= 0)
        return 0;
    uint64_t state = memplan_mul(c.state_bytes_per_seq, (uint64_t)batch);
    if (state > budget)
        return 0;
    if (c.page_bytes == 0)
        return 1 << 30;
    uint64_t pages = (budget - state) / memplan_mul(c.page_bytes, (uint64_t)batch);   /* never 0: sticks at the top */
    uint64_t ctx = memplan_mul(pages, u(l->page_tokens));
    return ctx > (1u << 30) ? (int64_t)1 << 30 : (int64_t)ctx;
}

/* sched_grammar.c - structured output inside the scheduler: the hook
 * between a request's constraint and its sampler.
 *
 * Owns: compiling a request's constraint at submission (on the
 * submitter's thread, so a slow schema never stalls the batch), the
 * scheduler's one gram_vocab and gram_cache (built by the first
 * constrained request and shared by all: a grammar is compiled once per
 * source and its masks computed once per parser state while it stays in
 * the cache), masking the logits before the sampler sees them (so
 * temperature, top-k/p and logprobs see only valid tokens), advancing
 * the matcher past each sampled token.
 * Does not own: the grammar engine (grammar.c), sampling (sampler.c),
 * where constraints come from (server).
 * Threads: masks are computed on the scheduler thread, one request after
 * another after each engine step (sample_emit); submitters compile. The
 * cache's one mutex is taken per grammar lookup and per mask key a
 * request meets for the first time, never per token.
 */
#include <stdio.h>
#include <string.h>

#include "fault.h"
#include "grammar.h"
#include "scheduler_impl.h"
#include "tokenizer.h"

static int token_piece(const void *ctx, int32_t id, char *buf, size_t cap, int *kind)
{
    const tokenizer *t = ctx;
    *kind = tok_is_eog(t, id) ? GRAM_TOK_EOG : tok_is_control(t, id) ? GRAM_TOK_OTHER : GRAM_TOK_TEXT;
    return tok_piece(t, id, buf, cap);
}

/* The shared vocabulary trie (about 0.6 s for 248K tokens) and the
 * grammar cache over it, built once by the first constrained request. */
static gram_cache *cache_get(sched *s, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->gram_mu);
    if (!s->gram_vocab)
        s->gram_vocab = gram_vocab_new(s->n_vocab, token_piece, engine_tokenizer(s->e), err, errlen);
    gram_cache *c = atomic_load(&s->gram_cache);
    if (s->gram_vocab && !c) {
        c = gram_cache_new(s->gram_vocab, s->p.grammar_cache_bytes, err, errlen);
        atomic_store(&s->gram_cache, c);
    }
    pthread_mutex_unlock(&s->gram_mu);
    return c;
}

/* What gram_cache_acquire compiles on a miss. */
typedef struct compile_ctx {
    int kind;
    const char *src;
    size_t len;
} compile_ctx;

static grammar *compile_constraint(void *arg, char *err, size_t errlen)
{
    const compile_ctx *x = arg;
    switch (x->kind) {
    case SCHED_CONSTRAINT_JSON_SCHEMA:
        return grammar_compile_json_schema(x->src, x->len, NULL, err, errlen);
    case SCHED_CONSTRAINT_JSON_OBJECT:
        return grammar_compile_json_object(NULL, err, errlen);
    case SCHED_CONSTRAINT_TOOL_CALLS:
    case SCHED_CONSTRAINT_TOOL_CALLS_AUTO:
        return grammar_compile_tool_spec(x->src, x->len, NULL, err, errlen);
    case SCHED_CONSTRAINT_GBNF:
        return grammar_compile_gbnf(x->src, x->len, err, errlen);
    case SCHED_CONSTRAINT_REGEX:
        return grammar_compile_regex(x->src, x->len, err, errlen);
    default:
        snprintf(err, errlen, "unknown constraint kind %d", x->kind);
        return NULL;
    }
}

/* The grammar's canonical source, the cache's key: its compiler (the
 * constraint kind; TOOL_CALLS and its auto form compile alike), the
 * compiler's options (always the defaults here) and the text. The
 * vocabulary is the cache's own. */
static char *constraint_key(const compile_ctx *x, size_t *n)
{
    int kind = x->kind == SCHED_CONSTRAINT_TOOL_CALLS_AUTO ? SCHED_CONSTRAINT_TOOL_CALLS : x->kind;
    char head[48];
    int h = snprintf(head, sizeof head, "kind=%d opts=default\n", kind);
    char *key = fault_malloc((size_t)h + x->len + 1);
    if (!key)
        return NULL;
    memcpy(key, head, (size_t)h);
    if (x->len)
        memcpy(key + h, x->src, x->len);
    *n = (size_t)h + x->len;
    return key;
}

int sched_grammar_attach(sched *s, sched_req *r, const sched_req_params *p, char *err, size_t errlen)
{
    char why[256] = "";
    if (p->constraint == SCHED_CONSTRAINT_NONE)
        return 0;
    if (p->constraint < SCHED_CONSTRAINT_JSON_SCHEMA || p->constraint > SCHED_CONSTRAINT_GBNF) {
        snprintf(err, errlen, "unknown constraint kind %d", p->constraint);
        return SCHED_EINVAL;
    }
    compile_ctx x = {p->constraint, p->constraint_src ? p->constraint_src : "", p->constraint_len};
    gram_cache *c = cache_get(s, why, sizeof why);
    if (!c) {
        snprintf(err, errlen, "%s", why);
        return SCHED_ENOMEM;
    }
    size_t n_key = 0;
    char *key = constraint_key(&x, &n_key);
    if (!key) {
        snprintf(err, errlen, "out of memory while compiling the constraint");
        return SCHED_ENOMEM;
    }
    gram_shared *sh = gram_cache_acquire(c, key, n_key, compile_constraint, &x, why, sizeof why);
    free(key);
    if (!sh) {
        snprintf(err, errlen, "%s", why);
        return strstr(why, "out of memory") ? SCHED_ENOMEM : SCHED_EINVAL;
    }
    r->gm = gram_matcher_new_shared(sh);     /* takes sh, also on failure */
    if (!r->gm) {
        snprintf(err, errlen, "out of memory while compiling the constraint");
        return SCHED_ENOMEM;
    }
    /* auto: free text until the model opens a call, then the call's grammar */
    if (p->constraint == SCHED_CONSTRAINT_TOOL_CALLS_AUTO &&
        gram_matcher_set_trigger(r->gm, grammar_tool_trigger(x.src, x.len))) {
        snprintf(err, errlen, "the tool-call trigger could not be set");
        return SCHED_EINVAL;
    }
    /* the first mask (the start state's trie walks) here, on the submitting
     * thread: the engine's first step finds it made and no other request
     * waits on it; a constraint no first token can start is refused now */
    const int n_first = gram_matcher_prime(r->gm);
    if (n_first < 0 && gram_matcher_out_of_memory(r->gm)) {
        snprintf(err, errlen, "out of memory while computing the constraint's first token mask");
        return SCHED_ENOMEM;
    }
    if (n_first <= 0) {
        snprintf(err, errlen, n_first < 0 ? "the constraint's first token mask passed the matcher's limits (4096 "
                                            "parser configurations a state, 4194304 configuration visits a mask)"
                                          : "no token of this model's vocabulary can start text the constraint admits");
        return SCHED_EINVAL;
    }
    return 0;
}

void sched_grammar_get_stats(sched *s, sched_grammar_stats *st)
{
    gram_cache_stats g;
    gram_cache *c = atomic_load(&s->gram_cache);    /* not gram_mu: the first trie build holds it */
    gram_cache_get_stats(c, &g);
    if (!c)
        g.max_bytes = s->p.grammar_cache_bytes;
    *st = (sched_grammar_stats){
        .compile_hits = g.grammar_hits, .compiles = g.grammar_misses, .mask_hits = g.hits, .walks = g.walks,
        .evictions = g.evictions, .not_kept = g.not_kept, .grammars = g.grammars, .entries = g.entries,
        .bytes = g.bytes, .max_bytes = g.max_bytes,
    };
}

int sched_grammar_mask(sched_req *r, float *logits)
{
    if (!r->gm)
        return 0;
    if (gram_matcher_mask(r->gm, logits) > 0)
        return 0;
    /* a mask past the matcher's work limit stops this request, not the engine */
    return gram_matcher_out_of_memory(r->gm) ? SCHED_ENOMEM : gram_matcher_at_limit(r->gm) ? SCHED_EINVAL
                                                                                         : SCHED_EENGINE;
}

int sched_grammar_advance(sched_req *r, int32_t tok)
{
    if (!r->gm)
        return 0;
    if (gram_matcher_accept_token(r->gm, tok) == 0)
        return 0;
    return gram_matcher_out_of_memory(r->gm) ? SCHED_ENOMEM : SCHED_EENGINE;
}

bool sched_grammar_done(const sched_req *r)
{
    return r->gm && gram_matcher_finished(r->gm);
}

void sched_grammar_deinit(sched *s)
{
    gram_cache_free(atomic_load(&s->gram_cache));  /* what a live request holds goes with it */
    atomic_store(&s->gram_cache, NULL);
    gram_vocab_free(s->gram_vocab);
    s->gram_vocab = NULL;
    pthread_mutex_destroy(&s->gram_mu);
}

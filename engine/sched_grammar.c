/* sched_grammar.c - structured output inside the scheduler: the hook
 * between a request's constraint and its sampler.
 *
 * Owns: compiling a request's constraint at submission (on the
 * submitter's thread, so a slow schema never stalls the batch), the
 * scheduler's one gram_vocab (built by the first constrained request and
 * shared by all), masking the logits before the sampler sees them (so
 * temperature, top-k/p and logprobs see only valid tokens), advancing
 * the matcher past each sampled token.
 * Does not own: the grammar engine (grammar.c), sampling (sampler.c),
 * where constraints come from (server).
 */
#include <stdio.h>
#include <string.h>

#include "grammar.h"
#include "scheduler_impl.h"

static int engine_piece(void *ctx, int32_t id, char *buf, size_t cap, int *kind)
{
    const engine *e = ctx;
    *kind = engine_token_is_eog(e, id) ? GRAM_TOK_EOG
            : engine_token_is_control(e, id) ? GRAM_TOK_OTHER : GRAM_TOK_TEXT;
    return engine_token_piece(e, id, buf, cap);
}

/* The shared vocabulary trie, built once (about 0.2 s for 152K tokens). */
static const gram_vocab *vocab_get(sched *s, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->gram_mu);
    if (!s->gram_vocab)
        s->gram_vocab = gram_vocab_new(s->n_vocab, engine_piece, s->e, err, errlen);
    const gram_vocab *v = s->gram_vocab;
    pthread_mutex_unlock(&s->gram_mu);
    return v;
}

int sched_grammar_attach(sched *s, sched_req *r, const sched_req_params *p, char *err, size_t errlen)
{
    grammar *g = NULL;
    char why[256] = "";
    switch (p->constraint) {
    case SCHED_CONSTRAINT_NONE:
        return 0;
    case SCHED_CONSTRAINT_JSON_SCHEMA:
        g = grammar_compile_json_schema(p->constraint_src ? p->constraint_src : "", p->constraint_len, NULL,
                                        why, sizeof why);
        break;
    case SCHED_CONSTRAINT_JSON_OBJECT:
        g = grammar_compile_json_object(NULL, why, sizeof why);
        break;
    case SCHED_CONSTRAINT_TOOL_CALLS:
    case SCHED_CONSTRAINT_TOOL_CALLS_AUTO:
        g = grammar_compile_tool_spec(p->constraint_src ? p->constraint_src : "", p->constraint_len, NULL, why,
                                      sizeof why);
        break;
    case SCHED_CONSTRAINT_GBNF:
        g = grammar_compile_gbnf(p->constraint_src ? p->constraint_src : "", p->constraint_len, why, sizeof why);
        break;
    case SCHED_CONSTRAINT_REGEX:
        g = grammar_compile_regex(p->constraint_src ? p->constraint_src : "", p->constraint_len, why,
                                  sizeof why);
        break;
    default:
        snprintf(err, errlen, "unknown constraint kind %d", p->constraint);
        return SCHED_EINVAL;
    }
    if (!g) {
        snprintf(err, errlen, "%s", why);
        return strstr(why, "out of memory") ? SCHED_ENOMEM : SCHED_EINVAL;
    }
    const gram_vocab *v = vocab_get(s, why, sizeof why);
    if (!v) {
        grammar_free(g);
        snprintf(err, errlen, "%s", why);
        return SCHED_ENOMEM;
    }
    r->gm = gram_matcher_new(g, v);     /* takes g, also on failure */
    if (!r->gm) {
        snprintf(err, errlen, "out of memory while compiling the constraint");
        return SCHED_ENOMEM;
    }
    /* auto: free text until the model opens a call, then the call's grammar */
    if (p->constraint == SCHED_CONSTRAINT_TOOL_CALLS_AUTO &&
        gram_matcher_set_trigger(r->gm, grammar_tool_trigger(p->constraint_src ? p->constraint_src : "",
                                                             p->constraint_len))) {
        snprintf(err, errlen, "the tool-call trigger could not be set");
        return SCHED_EINVAL;
    }
    return 0;
}

int sched_grammar_mask(sched_req *r, float *logits)
{
    if (!r->gm)
        return 0;
    return gram_matcher_mask(r->gm, logits) > 0 ? 0 : SCHED_EENGINE;
}

int sched_grammar_advance(sched_req *r, int32_t tok)
{
    if (!r->gm)
        return 0;
    return gram_matcher_accept_token(r->gm, tok) == 0 ? 0 : SCHED_EENGINE;
}

bool sched_grammar_done(const sched_req *r)
{
    return r->gm && gram_matcher_finished(r->gm);
}

void sched_grammar_deinit(sched *s)
{
    gram_vocab_free(s->gram_vocab);
    s->gram_vocab = NULL;
    pthread_mutex_destroy(&s->gram_mu);
}

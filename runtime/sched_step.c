/* sched_step.c - the scheduler thread: one step, and prompt logprobs.
 * Split from scheduler.c along its section banners; the design
 * notes are at the top of scheduler.c. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "invariant.h"
#include "scheduler_impl.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------------- */
/* Scheduler thread: one step                                             */
/* ---------------------------------------------------------------------- */

/* Drop cancelled running requests. Caller holds s->mu. */
static void reap_cancelled(sched *s)
{
    for (int i = s->n_running - 1; i >= 0; i--) {
        sched_req *r = s->running[i];
        if (!atomic_load(&r->cancel))
            continue;
        run_fail(s, r, cancel_status(r), r->cancel_msg[0] ? r->cancel_msg : "request cancelled");
    }
    tell_ended(s);
}

/* ---- prompt logprobs (OpenAI echo, TGI decoder_input_details) ----
 * A request that asks for them prefills in chunks of at most
 * SCHED_PLP_ROWS tokens with ENGINE_LOGITS_ALL into its own buffer: row j
 * of a chunk starting at prompt position a is the model's distribution of
 * the token at a + j + 1. The last prompt row is the first decode step's
 * logits. */

/* Shape a prefill item as a prompt-logprob chunk of at most k tokens, or
 * 0 when another request has the buffer this step (*used). Returns the
 * chunk's token count. */
static int prompt_lp_chunk(sched *s, engine_batch_item *it, int k, bool *used)
{
    if (*used)
        return 0;
    *used = true;
    if (k > SCHED_PLP_ROWS)
        k = SCHED_PLP_ROWS;
    it->logits = ENGINE_LOGITS_ALL;
    it->out = s->plp_logits;
    return k;
}

/* The chunk it ran (r->n_fed already counts it): one PROMPT event per
 * prompt token it predicts, log softmax at T = 1. When the chunk ended the
 * prompt, *first points at the row to sample the first token from (copied
 * into r's logits slot), else it stays NULL. Returns 0 or SCHED_ENOMEM. */
static int prompt_lp_emit(sched *s, sched_req *r, const engine_batch_item *it, float **first)
{
    const int start = r->n_fed - it->n_tokens;
    const size_t nv = (size_t)s->n_vocab;
    for (int j = 0; j < it->n_tokens; j++) {
        const int pos = start + j + 1;
        const float *row = s->plp_logits + (size_t)j * nv;
        if (pos >= r->n_prompt) {
            float *slot = s->logits + (size_t)r->slot * nv;
            memcpy(slot, row, nv * sizeof(float));
            *first = slot;
            return 0;
        }
        sched_event ev = {0};
        ev.kind = SCHED_EV_PROMPT;
        ev.pos = pos;
        ev.token = r->tokens[pos];
        ev.logprob = sampler_logprobs(row, s->n_vocab, 1.0f, ev.token, r->top_logprobs, &ev.top);
        if (req_push(r, &ev))
            return SCHED_ENOMEM;
    }
    return 0;
}

/* Fill s->items for this step. Returns the item count; *n_decode and
 * *n_prefill_tok count decoding sequences and prompt tokens, *n_spec_tok
 * the tokens decoding sequences feed beyond one each (drafts, and accepted
 * tokens a rollback carries). */
static int build_batch(sched *s, int *n_decode, int *n_prefill_tok, int *n_spec_tok)
{
    int n = 0, budget = s->p.prefill_chunk;
    int spec_rows = s->spec_rows, spec_off = 0;   /* verify logits rows left this step, the next free one */
    bool plp_used = false;      /* the prompt-logprob buffer is taken this step */
    bool any_exact = false;     /* a decode item feeds several tokens (speculation): exact rows */
    *n_decode = 0;
    *n_prefill_tok = 0;
    *n_spec_tok = 0;
    for (int i = 0; i < s->n_running; i++) {
        sched_req *r = s->running[i];
        engine_batch_item *it = &s->items[n];
        if (r->await_fork)
            continue;       /* fed nothing: it forks from its leader */
        it->seq = r->seq;
        it->snap = NULL;
        it->snap_at = 0;
        it->exact = 0;
        it->snaps = NULL;
        it->tokens = r->tokens + r->n_fed;
        it->out = s->logits + (size_t)r->slot * (size_t)s->n_vocab;
        it->hidden = NULL;
        if (r->state == RS_DECODE) {
            spec_item(s, r, it, &spec_rows, &spec_off);    /* the accepted tokens, and drafts */
            (*n_decode)++;
            *n_spec_tok += it->n_tokens - 1;
        } else {
            int left = r->n_prompt - r->n_fed;
            int k = left < budget ? left : budget;
            if (k <= 0)
                continue;
            if (r->prompt_lp && (k = prompt_lp_chunk(s, it, k, &plp_used)) == 0)
                continue;
            k = prefill_chunk(s, r, k, it);
            budget -= k;
            *n_prefill_tok += k;
            it->n_tokens = k;
            if (!r->prompt_lp)
                it->logits = k == left ? ENGINE_LOGITS_LAST : ENGINE_LOGITS_NONE;
        }
        /* the MTP source takes the trunk's hidden rows of every item (spec_mtp) */
        r->spec.hpos0 = r->n_fed;
        r->spec.hrows = r->spec.mhid && it->n_tokens <= s->mtp_rows ? it->n_tokens : 0;
        it->hidden = r->spec.hrows > 0 ? r->spec.mhid : NULL;
        s->item_req[n++] = r;
        any_exact = any_exact || it->exact;
    }
    /* an exact item runs in a pass of its own: the other decode items join
     * it (a one-token item's exact bits are its plain decode bits alone),
     * so the step reads the weights once; prompt chunks stay on their
     * matrix kernels, a second pass */
    for (int i = 0; any_exact && i < n; i++)
        if (s->item_req[i]->state == RS_DECODE)
            s->items[i].exact = 1;
    return n;
}

/* Sample r's next token from logits (scratch) and emit it (into *out
 * when out is not NULL). Caller does not hold s->mu. Returns 0, 1
 * (finished) or a negative error. */
int sample_emit(sched *s, sched_req *r, float *logits, int32_t *out)
{
    float lp = 0.0f;
    int grc = sched_grammar_mask(r, logits);
    if (grc)
        return grc;
    int32_t tok = sampler_sample(r->smp, logits, r->tokens, r->n_prompt + r->n_gen, &lp);
    if (tok < 0 || tok >= s->n_vocab)
        return SCHED_EENGINE;
    if ((grc = sched_grammar_advance(r, tok)))
        return grc;
    if (out)
        *out = tok;
    sampler_top top;
    sampler_last_top(r->smp, logits, r->top_logprobs, &top);
    return on_token(s, r, tok, lp, &top);
}

/* Leader r's prefill ended with logits (not yet sampled from): each
 * follower trades its placeholder for a fork of r's sequence (the freed
 * placeholder is what the fork and its reservation take, so it fits) and
 * samples its first token from its own copy of the logits. Its outcome
 * goes to fork_rc and the follower to s->forked, for the step's end.
 * Scheduler thread; s->mu not held (the group links are the scheduler
 * thread's). */
static void group_fork(sched *s, sched_req *r, const float *logits)
{
    const size_t nv = (size_t)s->n_vocab;
    for (int i = 0; i < r->n_fol; i++) {
        sched_req *f = group_take(r, i);
        if (!f)
            continue;
        engine_seq_free(s->e, f->seq);
        f->seq = engine_seq_fork(s->e, r->seq, r->n_fed);
        if (f->seq >= 0 && engine_seq_reserve(s->e, f->seq, f->n_prompt + f->max_new) != 0) {
            engine_seq_free(s->e, f->seq);
            f->seq = -1;
        }
        if (f->seq < 0) {
            f->fork_rc = SCHED_ENOMEM;
        } else {
            float *slot = s->logits + (size_t)f->slot * nv;
            memcpy(slot, logits, nv * sizeof(float));
            f->n_fed = r->n_fed;
            f->fork_rc = sample_emit(s, f, slot, NULL);
            spec_propose(s, f, f->fork_rc);
        }
        s->forked[s->n_forked++] = f;
    }
    r->n_fol = 0;
}

/* The item ran: advance r and sample when logits came back. Caller does
 * not hold s->mu. Returns 0, 1 (finished) or a negative error. */
static int after_item(sched *s, sched_req *r, engine_batch_item *it)
{
    float *logits = it->out;
    if (r->state == RS_DECODE) {
        int rc = spec_after(s, r, it);
        spec_propose(s, r, rc);
        return rc;
    }
    r->n_fed += it->n_tokens;
    snaps_due(s, r, it);
    if (it->logits == ENGINE_LOGITS_ALL) {
        logits = NULL;
        int rc = prompt_lp_emit(s, r, it, &logits);
        if (rc || !logits)
            return rc;
    } else if (it->logits == ENGINE_LOGITS_NONE) {
        return 0;
    }
    if (r->n_fol > 0)
        group_fork(s, r, logits);
    int rc = sample_emit(s, r, logits, NULL);
    spec_propose(s, r, rc);
    return rc;
}

/* An item whose step failed: its prefix-store snapshot goes back; a
 * verify item's snapshot is its request's own and stays. */
static void item_snap_drop(sched *s, sched_req *r, engine_batch_item *it)
{
    if (it->snap && it->snap == r->spec.snap) {
        it->snap = NULL;
        r->spec.n_fed_draft = 0;
        return;
    }
    step_snap_drop(s, it);
}

/* The tokens-per-step histogram (sched_stats.step_tokens): bucket k holds
 * steps of at most 2^k tokens. Caller holds s->mu. */
static void step_tokens_observe(sched_stats *st, int n_tok)
{
    int k = 0;
    while (k < SCHED_STEP_BUCKETS && n_tok > (1 << k))
        k++;
    st->step_tokens[k]++;
    st->step_tokens_sum += (uint64_t)n_tok;
}

/* The cost gate's measurement (spec_cost.h): an exact decode-only step's
 * seconds, forward, sampling and the next drafts included, by the rows it
 * fed (plain batched decode takes other kernels than the exact steps of
 * speculating requests: those steps are not what a draft would cost). */
static void cost_observe(sched *s, int n, int frc, int n_decode, int n_prefill_tok, int n_spec_tok, double sec)
{
    if (n_decode > 0)
        s->cost_seqs = n_decode;
    if (s->cost_fixed || frc != 0 || n_prefill_tok > 0 || n_decode == 0)
        return;
    bool exact = false;
    for (int i = 0; i < n && !exact; i++)
        exact = s->items[i].exact;
    if (exact)
        spec_cost_observe(&s->cost, n_decode + n_spec_tok, sec);
}

static void sched_step(sched *s)
{
    char err[256];
    int n_decode = 0, n_prefill_tok = 0, n_spec_tok = 0;

    pthread_mutex_lock(&s->mu);
    reap_cancelled(s);
    admit(s);
    /* publish the pool together with the admissions, so a /stats snapshot
     * never lists an admitted request's cache without it in the pool */
    publish_pool(s);
    int n = build_batch(s, &n_decode, &n_prefill_tok, &n_spec_tok);
    pthread_mutex_unlock(&s->mu);
    if (n == 0)
        return;

    int *rcs = s->rcs;      /* every branch below sets rcs[0..n) */
    const double t_fwd = engine_now_s();
    int frc = engine_forward(s->e, s->items, n, err, sizeof(err));
    const double fwd_s = engine_now_s() - t_fwd;
    if (frc == 0) {
        for (int i = 0; i < n; i++)
            rcs[i] = after_item(s, s->item_req[i], &s->items[i]);
    } else if (n == 1) {
        rcs[0] = SCHED_EENGINE;
        item_snap_drop(s, s->item_req[0], &s->items[0]);
    } else {
        /* find the culprit: run the items one at a time (no sequence was
         * modified by the failed call) */
        for (int i = 0; i < n; i++) {
            if (engine_forward(s->e, &s->items[i], 1, err, sizeof(err)) == 0) {
                rcs[i] = after_item(s, s->item_req[i], &s->items[i]);
            } else {
                rcs[i] = SCHED_EENGINE;
                item_snap_drop(s, s->item_req[i], &s->items[i]);
            }
        }
    }

    if (s->n_dwant > 0)
        spec_draft_model(s);    /* the draft model's rounds, batched over the requests that asked */
    spec_mtp(s, n);             /* the MTP's rows of this step, and its drafts */
    cost_observe(s, n, frc, n_decode, n_prefill_tok, n_spec_tok, engine_now_s() - t_fwd);
    pthread_mutex_lock(&s->mu);
    s->st.steps_total++;
    s->st.prompt_tokens_total += (uint64_t)n_prefill_tok;
    s->st.batch_seqs_total += (uint64_t)n;
    s->st.batch_seqs_last = n;
    if (n > s->st.batch_seqs_max)
        s->st.batch_seqs_max = n;
    if (n_decode > s->st.batch_decode_max)
        s->st.batch_decode_max = n_decode;
    if (n_decode > 0 && n_prefill_tok > 0)
        s->st.mixed_steps_total++;
    step_tokens_observe(&s->st, n_decode + n_prefill_tok + n_spec_tok);
    spec_publish(s);
    if (frc == 0 && n_prefill_tok == 0 && n_spec_tok == 0) {
        s->st.decode_steps_total++;
        s->st.decode_forward_seconds += fwd_s;
    }
    for (int i = 0; i < n + s->n_forked; i++) {
        /* the items, then the followers that forked from them */
        sched_req *r = i < n ? s->item_req[i] : s->forked[i - n];
        const int rc = i < n ? rcs[i] : r->fork_rc;
        r->pub_n_fed = r->n_fed;
        r->pub_n_snaps = r->n_snaps;
        r->pub_spec = r->spec.n;
        if (rc == 0 && (i >= n || s->items[i].logits != ENGINE_LOGITS_NONE) && r->n_fed >= r->n_prompt)
            r->state = RS_DECODE;
        if (rc == 0) {
            engine_seq_get_usage(s->e, r->seq, &r->usage);
            if (r->usage.total_reserved_bytes > r->peak_bytes)
                r->peak_bytes = r->usage.total_reserved_bytes;
        } else if (rc == 1) {
            run_finish(s, r, SCHED_OK, &r->final_ev);
        } else {
            char msg[256];
            if (rc == SCHED_EENGINE)
                snprintf(msg, sizeof(msg), "generation failed: %.200s", frc && i < n ? err : "sampler returned no token");
            else if (rc == SCHED_EINVAL)
                snprintf(msg, sizeof(msg), "generation stopped: a token mask of the constraint passed the matcher's "
                         "limits (4096 parser configurations a state, 4194304 configuration visits a mask)");
            else
                snprintf(msg, sizeof(msg), "generation failed: out of memory");
            run_fail(s, r, rc, msg);
        }
    }
    s->n_forked = 0;
    tell_ended(s);
    INVARIANT_STEP(sched_check(s));
    pthread_mutex_unlock(&s->mu);
}

void *sched_main(void *arg)
{
    sched *s = arg;
    /* OpenMP thread counts are per thread: engine_open set the count on
     * the thread that opened the engine, and the engine sizes per-thread
     * scratch by it, so this thread must use the same count */
    if (s->p.n_threads > 0)
        omp_set_num_threads(s->p.n_threads);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (!s->stop && !s->wait_head && s->n_running == 0 && s->reset_done == s->reset_asked)
            engine_spare_refill(s->e);  /* idle: spare DeltaNet blocks for the next requests, in the background */
        while (!s->stop && !s->wait_head && s->n_running == 0 && s->reset_done == s->reset_asked)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop)
            break;
        store_reset_due(s);    /* between steps: no forward is using the engine */
        pthread_mutex_unlock(&s->mu);
        sched_step(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}


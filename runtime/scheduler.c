/* scheduler.c - continuous batching: one thread owns the engine.
 *
 * Owns: the wait queue (FIFO, bounded), the running set (at most
 * info->max_seqs sequences), admission (a request is admitted only when
 * its whole reservation, prompt + max_new_tokens, fits the cache budget),
 * the step loop (every decoding sequence advances one token and newly
 * admitted prompts are prefilled in chunks of at most prefill_chunk tokens
 * per step in total, all in one engine_forward), sampling, stop checks and
 * text release, and freeing sequences the moment they finish or are
 * cancelled.
 * Does not own: tokenizing prompts, request validation, HTTP/JSON.
 * The pieces, one section each: sched_request.c (requests, event queues,
 * submission), sched_prefix.c (prefix-cache admission and snapshots),
 * sched_admit.c (admission, finishing, groups), sched_text.c (text release
 * and stop strings), sched_step.c (one step, prompt logprobs), this file
 * (names, invariants, lifecycle); what they share is in scheduler_impl.h.
 * ref: docs/serving.md 5 (admission, the queue), 2.4 (cancel on
 * disconnect) and 8 (drain).
 *
 * Locking: s->mu guards the wait queue, the running array, the published
 * per-request numbers and the counters; r->mu guards one request's event
 * queue. Order: s->mu before r->mu. Engine calls happen only on the
 * scheduler thread (some under s->mu, all of them short except
 * engine_forward, which runs unlocked).
 */
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

void sched_params_default(sched_params *p)
{
    *p = (sched_params){0};     /* every field not named below: off (the prefix sink among them) */
    p->max_queue = 64;
    p->queue_timeout_s = 30.0;
    p->prefill_chunk = 512;
    p->n_threads = 0;
    p->prefix_cache = false;
    p->prefix_budget_bytes = 0;
    p->prefix_snap_interval = 0;
    p->max_unread_bytes = 0;
    p->grammar_cache_bytes = (size_t)64 << 20;
    p->spec_type = SCHED_SPEC_NONE;
    p->spec_n_max = 16;
    p->spec_n_min = 0;
    p->spec_cost = true;
}

void sched_event_clear(sched_event *ev)
{
    if (!ev)
        return;
    free(ev->text);
    ev->text = NULL;
    ev->text_len = 0;
}

const char *sched_finish_name(int finish)
{
    switch (finish) {
    case SCHED_FINISH_LENGTH: return "length";
    case SCHED_FINISH_EOS: return "eos_token";
    case SCHED_FINISH_STOP: return "stop_sequence";
    default: return "none";
    }
}

const char *sched_status_name(int status)
{
    switch (status) {
    case SCHED_OK: return "ok";
    case SCHED_EFULL: return "overloaded";
    case SCHED_EDRAINING: return "draining";
    case SCHED_ETOOBIG: return "too_big";
    case SCHED_ETIMEOUT: return "queue_timeout";
    case SCHED_ENOMEM: return "out_of_memory";
    case SCHED_EENGINE: return "generation";
    case SCHED_ECANCELLED: return "cancelled";
    case SCHED_EDELETED: return "cancelled";
    case SCHED_EINVAL: return "validation";
    default: return "internal";
    }
}

/* ---------------------------------------------------------------------- */
/* Invariants                                                             */
/* ---------------------------------------------------------------------- */

enum { MARK_SLOT = 1, MARK_SEQ = 2 };

const char *sched_broken(const sched *s)
{
    if (s->n_running < 0 || s->n_running > s->max_seqs)
        return "0 <= n_running <= max_seqs";
    if (s->n_free_slots < 0 || s->n_running + s->n_free_slots != s->max_seqs)
        return "running requests plus free logits slots are max_seqs";
    uint8_t *mark = s->check_marks;
    memset(mark, 0, (size_t)s->max_seqs);
    for (int i = 0; i < s->n_running; i++) {
        const sched_req *r = s->running[i];
        if (!r || (r->state != RS_PREFILL && r->state != RS_DECODE))
            return "a running request is prefilling or decoding";
        if (r->slot < 0 || r->slot >= s->max_seqs || (mark[r->slot] & MARK_SLOT))
            return "every running request holds a logits slot of its own";
        mark[r->slot] |= MARK_SLOT;
        if (r->seq < 0 || r->seq >= s->max_seqs || (mark[r->seq] & MARK_SEQ))
            return "every running request owns a sequence of its own";
        mark[r->seq] |= MARK_SEQ;
        if (engine_seq_len(s->e, r->seq) != r->n_fed)
            return "a running request's sequence is live and holds the tokens fed to it";
        if (r->n_gen < 0 || r->n_gen > r->max_new || r->n_fed > r->n_prompt + r->n_gen)
            return "a running request was fed only its prompt and its generated tokens";
        if (r->await_fork && (r->n_fed != 0 || !r->leader || r->leader->state != RS_PREFILL))
            return "a follower awaiting its fork is fed nothing and its leader is prefilling";
    }
    for (int i = 0; i < s->n_free_slots; i++) {
        const int slot = s->free_slots[i];
        if (slot < 0 || slot >= s->max_seqs || (mark[slot] & MARK_SLOT))
            return "a free logits slot is held by nobody and free once";
        mark[slot] |= MARK_SLOT;
    }
    engine_pool_usage pu;
    engine_get_pool_usage(s->e, &pu);
    if (pu.n_seqs != s->n_running + prefix_n_entries(s->prefix))
        return "the engine's live sequences are the running requests' and the prefix store's";
    int n_wait = 0;
    const sched_req *last = NULL;
    for (const sched_req *r = s->wait_head; r; last = r, r = r->wait_next) {
        if (++n_wait > s->n_waiting)
            return "the wait queue holds n_waiting requests";
        if (r->state != RS_QUEUED || r->seq != -1 || r->slot != -1)
            return "a waiting request is queued, without a sequence or a slot";
        if (r->await_fork && (!r->leader || r->leader->state != RS_QUEUED))
            return "a queued follower's leader is queued before it";
    }
    if (n_wait != s->n_waiting || last != s->wait_tail)
        return "the wait queue holds n_waiting requests, wait_tail the last";
    if (s->n_waiting > s->p.max_queue)
        return "n_waiting <= max_queue";
    return NULL;
}

bool sched_check(const sched *s)
{
    const char *why = sched_broken(s);
    if (why)
        fprintf(stderr, "scheduler invariant broken: %s\n", why);
    return why == NULL;
}

/* ---------------------------------------------------------------------- */
/* Lifecycle and observation                                              */
/* ---------------------------------------------------------------------- */

sched *sched_new(engine *e, const sched_params *p, char *err, size_t errlen)
{
    sched *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->e = e;
    s->info = engine_get_info(e);
    sched_params_default(&s->p);
    if (p) {
        if (p->max_queue > 0)
            s->p.max_queue = p->max_queue;
        if (p->queue_timeout_s > 0)
            s->p.queue_timeout_s = p->queue_timeout_s;
        if (p->prefill_chunk > 0)
            s->p.prefill_chunk = p->prefill_chunk;
        s->p.n_threads = p->n_threads;
        s->p.prefix_cache = p->prefix_cache;
        s->p.prefix_budget_bytes = p->prefix_budget_bytes;
        s->p.prefix_snap_interval = p->prefix_snap_interval > 0 ? p->prefix_snap_interval : 0;
        s->p.prefix_sink = p->prefix_sink;
        s->p.prefix_snap_align = p->prefix_snap_align > 1 ? p->prefix_snap_align : 0;
        s->p.max_unread_bytes = p->max_unread_bytes;
        s->p.grammar_cache_bytes = p->grammar_cache_bytes;
        s->p.spec_type = p->spec_type == SCHED_SPEC_NGRAM ? SCHED_SPEC_NGRAM
                         : p->spec_type == SCHED_SPEC_DRAFT && p->draft ? SCHED_SPEC_DRAFT
                         : p->spec_type == SCHED_SPEC_MTP ? SCHED_SPEC_MTP : SCHED_SPEC_NONE;
        s->de = s->p.spec_type == SCHED_SPEC_DRAFT ? p->draft : NULL;
        if (p->spec_n_max >= 1)
            s->p.spec_n_max = p->spec_n_max < SCHED_SPEC_MAX ? p->spec_n_max : SCHED_SPEC_MAX;
        s->p.spec_n_min = p->spec_n_min < 0 ? 0 : p->spec_n_min > s->p.spec_n_max ? s->p.spec_n_max : p->spec_n_min;
        s->p.spec_cost = p->spec_cost;
        /* a fixed table (tests) stands for the measurements: nothing is observed */
        for (int r = 1; p->spec_step_seconds && r < p->spec_step_seconds_n && r <= SPEC_COST_ROWS; r++) {
            if (p->spec_step_seconds[r] > 0.0) {
                s->cost.t[r] = p->spec_step_seconds[r];
                s->cost.n[r] = 1;
            }
        }
        s->cost_fixed = p->spec_step_seconds != NULL;
    }
    s->st.spec_cost = s->p.spec_cost;
    s->st.spec_type = s->p.spec_type;
    s->st.spec_n_max = s->p.spec_n_max;
    s->st.spec_n_min = s->p.spec_n_min;
    s->max_seqs = s->info->max_seqs > 0 ? s->info->max_seqs : 1;
    s->n_vocab = s->info->n_vocab;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->pub_mu, NULL);
    pthread_mutex_init(&s->gram_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->reset_cv, NULL);
    s->logits = malloc((size_t)s->max_seqs * (size_t)s->n_vocab * sizeof(float));
    s->plp_logits = malloc((size_t)SCHED_PLP_ROWS * (size_t)s->n_vocab * sizeof(float));
    s->free_slots = malloc((size_t)s->max_seqs * sizeof(int));
    s->items = calloc((size_t)s->max_seqs, sizeof(*s->items));
    s->item_req = calloc((size_t)s->max_seqs, sizeof(*s->item_req));
    s->ended = calloc((size_t)s->max_seqs, sizeof(*s->ended));
    s->ended_ev = calloc((size_t)s->max_seqs, sizeof(*s->ended_ev));
    s->running = calloc((size_t)s->max_seqs, sizeof(*s->running));
    s->rcs = calloc((size_t)s->max_seqs, sizeof(*s->rcs));
    s->check_marks = calloc((size_t)s->max_seqs, sizeof(*s->check_marks));
    s->forked = calloc((size_t)s->max_seqs, sizeof(*s->forked));
    s->eog = malloc((size_t)s->n_vocab * sizeof(*s->eog));
    if (!s->logits || !s->plp_logits || !s->free_slots || !s->items || !s->item_req || !s->running || !s->ended ||
        !s->ended_ev || !s->rcs || !s->check_marks || !s->forked || !s->eog) {
        snprintf(err, errlen, "out of memory for %d sequence slots of %d logits", s->max_seqs, s->n_vocab);
        sched_free(s);
        return NULL;
    }
    if (spec_init(s, err, errlen)) {
        sched_free(s);
        return NULL;
    }
    for (int32_t t = 0; t < s->n_vocab; t++)     /* before sched_start: the engine is still ours */
        if (tok_is_eog(engine_tokenizer(e), t))
            s->eog[s->n_eog++] = t;
    if (s->p.prefix_cache) {
        const uint64_t budget = s->info->cache_budget_bytes;
        prefix_params pp = { .budget_bytes = s->p.prefix_budget_bytes ? s->p.prefix_budget_bytes : budget / 4,
                             .snap_interval = s->p.prefix_snap_interval, .sink = s->p.prefix_sink };
        if (pp.budget_bytes > budget)
            pp.budget_bytes = budget;
        s->prefix = prefix_new(e, &pp);
        if (!s->prefix) {
            snprintf(err, errlen, "out of memory for the prefix store");
            sched_free(s);
            return NULL;
        }
        s->st.prefix_on = true;
        /* the store keeps finished sequences' memory, so while it grows a
         * cold request takes memory nothing held before: two DeltaNet
         * blocks (its slot, its prompt-end snapshot) and a region or two of
         * KV pages (16 pages each). Keep that ready off the request's path
         * (made again when idle: sched_main). Without spares it faulted
         * them in at admission and inside the step; none is fine (as
         * before). */
        engine_spares_start(e, SCHED_SPARE_BLOCKS, SCHED_SPARE_REGIONS);
    }
    for (int i = 0; i < s->max_seqs; i++)
        s->free_slots[i] = s->max_seqs - 1 - i;
    s->n_free_slots = s->max_seqs;
    engine_get_pool_usage(e, &s->st.pool);
    publish_stats(s);
    return s;
}

int sched_start(sched *s)
{
    /* test builds: HYSERVE_FAULT_NTH counts the allocations of serving,
     * from here on (the model, the scheduler and its prefix store are made) */
    fault_inject_from_env();
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0)
        return SCHED_ENOMEM;
    s->started = true;
    return 0;
}

void sched_free(sched *s)
{
    if (!s)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv);
        pthread_cond_broadcast(&s->reset_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* the thread is gone: this thread owns the engine now */
    pthread_mutex_lock(&s->mu);
    while (s->n_running > 0) {
        sched_req *r = s->running[s->n_running - 1];
        run_fail(s, r, SCHED_ECANCELLED, "the server is shutting down");
        tell_ended(s);
    }
    while (s->wait_head)
        wait_reject(s, s->wait_head, SCHED_ECANCELLED, "the server is shutting down");
    prefix_free(s->prefix);     /* its sequences and snapshots: the engine outlives the scheduler */
    s->prefix = NULL;
    publish_pool(s);
    pthread_mutex_unlock(&s->mu);
    free(s->logits);
    free(s->plp_logits);
    free(s->spec_logits);
    free(s->dwant);
    free(s->dreq);
    free(s->ditems);
    free(s->dlogits);
    free(s->mitems);
    free(s->mreq);
    free(s->mlogits);
    free(s->mout);
    free(s->eog);
    free(s->free_slots);
    free(s->items);
    free(s->item_req);
    free(s->ended);
    free(s->ended_ev);
    free(s->running);
    free(s->rcs);
    free(s->check_marks);
    free(s->forked);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->reset_cv);
    sched_grammar_deinit(s);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->pub_mu);
    free(s);
}

int sched_prefix_reset(sched *s, sched_prefix_freed *out)
{
    int rc = SCHED_OK;
    pthread_mutex_lock(&s->mu);
    const uint64_t ticket = ++s->reset_asked;
    pthread_cond_signal(&s->cv);
    while (s->started && !s->stop && s->reset_done < ticket)
        pthread_cond_wait(&s->reset_cv, &s->mu);
    if (s->reset_done >= ticket)
        *out = s->reset_last;
    else
        rc = SCHED_EDRAINING;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sched_drain(sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    publish_stats(s);
    pthread_mutex_unlock(&s->mu);
}

void sched_cancel_all(sched *s, const char *why)
{
    pthread_mutex_lock(&s->mu);
    for (sched_req *r = s->wait_head; r; r = r->wait_next) {
        snprintf(r->cancel_msg, sizeof(r->cancel_msg), "%s", why);
        atomic_store(&r->cancel, true);
    }
    for (int i = 0; i < s->n_running; i++) {
        snprintf(s->running[i]->cancel_msg, sizeof(s->running[i]->cancel_msg), "%s", why);
        atomic_store(&s->running[i]->cancel, true);
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Whether sched_cancel_id(id, owner) cancels r: its own id (the first
 * such request only: once found is set) or its group's. */
static bool cancel_id_matches(const sched_req *r, const char *id, int owner, bool found)
{
    if (r->owner != owner || atomic_load(&r->cancel))
        return false;
    return (!found && !strcmp(r->id, id)) || (r->gid[0] && !strcmp(r->gid, id));
}

/* Cancel r by its id with why. Caller holds s->mu. */
void cancel_by_id(sched_req *r, const char *why)
{
    snprintf(r->cancel_msg, sizeof(r->cancel_msg), "%s", why);
    r->cancel_by_id = true;
    atomic_store(&r->cancel, true);
}

int sched_cancel_id(sched *s, const char *id, int owner, const char *why)
{
    int rc = -1;
    pthread_mutex_lock(&s->mu);
    for (sched_req *r = s->wait_head; r; r = r->wait_next) {
        if (cancel_id_matches(r, id, owner, rc == 0)) {
            cancel_by_id(r, why);
            rc = 0;
        }
    }
    for (int i = 0; i < s->n_running; i++) {
        if (cancel_id_matches(s->running[i], id, owner, rc == 0)) {
            cancel_by_id(s->running[i], why);
            rc = 0;
        }
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int sched_n_active(sched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_waiting + s->n_running;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int sched_retry_after_s(sched *s)
{
    pthread_mutex_lock(&s->mu);
    double per = s->ema_req_s > 0 ? s->ema_req_s : 1.0;
    double waves = (double)(s->n_waiting + 1) / (double)s->max_seqs;
    pthread_mutex_unlock(&s->mu);
    double t = ceil(per * (waves < 1.0 ? 1.0 : waves));
    if (t < 1)
        t = 1;
    if (t > 60)
        t = 60;
    return (int)t;
}

/* The running requests' rollback snapshots. Caller holds s->mu. */
static void spec_count_snaps(const sched *s, sched_stats *st)
{
    st->spec_snapshots = 0;
    for (int i = 0; i < s->n_running; i++)
        st->spec_snapshots += s->running[i]->spec.snap != NULL;
    st->spec_snapshot_bytes = (uint64_t)st->spec_snapshots * engine_snap_bytes(s->e);
}

void publish_stats(sched *s)
{
    sched_live_totals t = {0};
    for (int i = 0; i < s->n_running; i++) {
        const engine_seq_usage *u = &s->running[i]->usage;
        t.kv_bytes += u->kv_reserved_bytes;
        t.mla_bytes += u->mla_reserved_bytes;
        t.state_bytes += u->rec_state_bytes;
        t.conv_bytes += u->rec_conv_bytes;
        t.tokens += (uint64_t)u->n_tokens;
        t.n_slots += u->rec_state_bytes + u->rec_conv_bytes > 0;
    }
    spec_count_snaps(s, &s->st);
    pthread_mutex_lock(&s->pub_mu);
    s->pub = s->st;
    s->pub.running = s->n_running;
    s->pub.waiting = s->n_waiting;
    s->pub.draining = s->draining;
    s->pub_tot = t;
    pthread_mutex_unlock(&s->pub_mu);
}

void sched_get_published(sched *s, sched_stats *st, sched_live_totals *t)
{
    pthread_mutex_lock(&s->pub_mu);
    *st = s->pub;
    if (t)
        *t = s->pub_tot;
    pthread_mutex_unlock(&s->pub_mu);
    sched_grammar_get_stats(s, &st->grammar);   /* its own lock */
}

int sched_get_stats(sched *s, sched_stats *st, sched_req_stats **reqs, int *n_reqs)
{
    int rc = 0;
    double now = engine_now_s();
    if (reqs) {
        *reqs = NULL;
        *n_reqs = 0;
    }
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    spec_count_snaps(s, st);
    st->running = s->n_running;
    st->waiting = s->n_waiting;
    st->draining = s->draining;
    /* st->pool is the engine's pool usage as published after the last
     * step; the engine itself is not touched here, but for the spares,
     * which their thread makes while the scheduler idles (under their own
     * lock) */
    engine_get_spares(s->e, &st->pool);
    if (reqs) {
        int total = s->n_running + s->n_waiting;
        sched_req_stats *a = total ? calloc((size_t)total, sizeof(*a)) : NULL;
        if (total && !a) {
            rc = SCHED_ENOMEM;
            goto out_unlock;
        }
        int k = 0;
        for (int i = 0; i < s->n_running; i++) {
            const sched_req *r = s->running[i];
            sched_req_stats *q = &a[k++];
            snprintf(q->id, sizeof(q->id), "%s", r->id);
            snprintf(q->tags, sizeof(q->tags), "%s", r->tags);
            q->owner = r->owner;
            q->state = r->state == RS_DECODE ? "decoding" : "prefill";
            q->age_ms = (now - r->t_submit) * 1e3;
            q->prompt_tokens = r->n_prompt;
            q->prefilled_tokens = r->pub_n_fed < r->n_prompt ? r->pub_n_fed : r->n_prompt;
            q->generated_tokens = r->pub_n_gen;
            q->max_new_tokens = r->max_new;
            q->usage = r->usage;
            q->cached_tokens = r->pm.n_cached;
            q->prefix_reason = r->pm.reason;
            q->prefix_diverged_at = r->pm.diverged_at;
            q->n_snapshots = r->pub_n_snaps;
            q->snapshot_bytes = (uint64_t)r->pub_n_snaps * engine_snap_bytes(s->e);
            q->spec_on = r->spec.on;
            q->spec_snapshot_bytes = r->spec.snap ? engine_snap_bytes(s->e) : 0;
            q->spec = r->pub_spec;
        }
        for (const sched_req *r = s->wait_head; r; r = r->wait_next) {
            sched_req_stats *q = &a[k++];
            snprintf(q->id, sizeof(q->id), "%s", r->id);
            snprintf(q->tags, sizeof(q->tags), "%s", r->tags);
            q->owner = r->owner;
            q->state = "queued";
            q->age_ms = (now - r->t_submit) * 1e3;
            q->prompt_tokens = r->n_prompt;
            q->max_new_tokens = r->max_new;
        }
        *reqs = a;
        *n_reqs = k;
    }
out_unlock:
    pthread_mutex_unlock(&s->mu);
    sched_grammar_get_stats(s, &st->grammar);   /* its own locks, after s->mu */
    return rc;
}

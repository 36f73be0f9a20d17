/* sched_admit.c - the scheduler thread: admission, finishing, and groups.
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
/* Scheduler thread: admission, finishing                                 */
/* ---------------------------------------------------------------------- */


/* ---- groups (sched_submit_group) ----
 * A follower waits in the queue behind its leader, is admitted with it
 * holding a placeholder (an empty sequence reserving what its fork will
 * own), and forks when the leader's prefill ends. */

/* Tokens a follower's fork owns: all of its reservation but the prompt's
 * whole pages, which it shares with its leader (the copied partly filled
 * page and the pages decoding fills are its own). */
static int fork_own_tokens(const sched *s, const sched_req *r)
{
    const int pt = s->info->page_tokens > 0 ? s->info->page_tokens : 1;
    return r->n_prompt + r->max_new - r->n_prompt / pt * pt;
}

/* r and the followers it still lists. */
static int group_size(const sched_req *r)
{
    int m = 1;
    for (int i = 0; i < r->n_fol; i++)
        m += r->fol[i] != NULL;
    return m;
}

/* Cache bytes r's admission reserves: its own reservation and each
 * follower's placeholder. */
static uint64_t group_need_bytes(const sched *s, const sched_req *r)
{
    /* not a speculating request's rollback snapshot: it is taken at
     * admission where the pool has room (spec_admit) and the request
     * decodes without drafts where it has none, so speculation never makes
     * a request wait or refuses it (its drafts fit its reservation: they
     * never pass max_new_tokens) */
    const uint64_t own = engine_bytes_for_tokens(s->e, r->n_prompt + r->max_new);
    return own + (uint64_t)(group_size(r) - 1) * engine_bytes_for_tokens(s->e, fork_own_tokens(s, r));
}

/* Give back the placeholders of r's followers. Caller holds s->mu. */
static void group_unhold(sched *s, sched_req *r)
{
    for (int i = 0; i < r->n_fol; i++) {
        if (r->fol[i] && r->fol[i]->seq >= 0) {
            engine_seq_free(s->e, r->fol[i]->seq);
            r->fol[i]->seq = -1;
        }
    }
}

/* A placeholder for each of r's followers, evicting prefix store entries
 * while they do not fit. 0, or -1 with none held. Caller holds s->mu. */
static int group_hold(sched *s, sched_req *r)
{
    const int own = fork_own_tokens(s, r);
    for (int i = 0; i < r->n_fol; i++) {
        sched_req *f = r->fol[i];
        if (f && (f->seq = sched_seq_acquire(s, NULL, own, NULL)) < 0) {
            group_unhold(s, r);
            return -1;
        }
    }
    return 0;
}

/* Unlink leader r's follower i (NULL when it already left): it no longer
 * waits for a fork. Scheduler thread. */
sched_req *group_take(sched_req *r, int i)
{
    sched_req *f = r->fol[i];
    if (f) {
        r->fol[i] = NULL;
        f->leader = NULL;
        f->await_fork = false;
    }
    return f;
}

/* r ended (queued or running): a follower leaves its leader's list; a
 * leader's followers that have not forked end with it, with its error.
 * Caller holds s->mu. */
static void group_leave(sched *s, sched_req *r, int status, const char *msg)
{
    if (r->leader) {
        for (int i = 0; i < r->leader->n_fol; i++)
            if (r->leader->fol[i] == r)
                r->leader->fol[i] = NULL;
        r->leader = NULL;
    }
    if (status == SCHED_OK) {   /* cannot happen: followers fork before the leader samples */
        status = SCHED_EENGINE;
        msg = "generation failed: the choice that prefilled the prompt ended before the others forked";
    }
    for (int i = 0; i < r->n_fol; i++) {
        sched_req *f = group_take(r, i);
        if (!f)
            continue;
        if (f->state == RS_QUEUED)
            wait_reject(s, f, status, msg);
        else
            run_fail(s, f, status, msg);
    }
    r->n_fol = 0;
}

/* Unlink r from the wait queue. Caller holds s->mu. */
static void wait_remove(sched *s, sched_req *r)
{
    sched_req *prev = NULL;
    for (sched_req *it = s->wait_head; it; prev = it, it = it->wait_next) {
        if (it != r)
            continue;
        if (prev)
            prev->wait_next = r->wait_next;
        else
            s->wait_head = r->wait_next;
        if (s->wait_tail == r)
            s->wait_tail = prev;
        r->wait_next = NULL;
        s->n_waiting--;
        publish_stats(s);
        return;
    }
}

/* Take r out of the running set, free its sequence and slot, mark it
 * done. Caller holds s->mu. Does not drop the scheduler's reference. */
static void run_remove(sched *s, sched_req *r)
{
    for (int i = 0; i < s->n_running; i++) {
        if (s->running[i] != r)
            continue;
        memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof(s->running[0]));
        s->n_running--;
        break;
    }
    if (r->seq >= 0)
        engine_seq_free(s->e, r->seq);
    r->seq = -1;
    drop_snaps(s, r);
    spec_release(s, r);
    if (r->slot >= 0)
        s->free_slots[s->n_free_slots++] = r->slot;
    r->slot = -1;
    /* r->usage keeps the last step's numbers for sched_req_result */
    r->state = RS_DONE;
    r->t_end = engine_now_s();
}

/* A running request ended (final token, error or cancel): free its
 * sequence now and queue its last event (ownership of ev->text moves).
 * The event is pushed by tell_ended, after the pool numbers are
 * published, so a client that has its last event also sees its cache gone
 * from /stats. Caller holds s->mu. */
void run_finish(sched *s, sched_req *r, int status, sched_event *ev)
{
    if (status == SCHED_OK)
        keep_in_store(s, r);
    run_remove(s, r);
    group_leave(s, r, status, ev->kind == SCHED_EV_ERROR ? ev->message : "");
    double dur = r->t_end - r->t_submit;
    s->ema_req_s = s->ema_req_s > 0 ? 0.8 * s->ema_req_s + 0.2 * dur : dur;
    if (status == SCHED_OK)
        s->st.finished_total++;
    else if (status == SCHED_ECANCELLED || status == SCHED_EDELETED)
        s->st.cancelled_total++;
    else
        s->st.failed_total++;
    s->ended[s->n_ended] = r;
    s->ended_ev[s->n_ended] = *ev;
    s->n_ended++;
    memset(ev, 0, sizeof(*ev));
}

void run_fail(sched *s, sched_req *r, int status, const char *msg)
{
    sched_event ev = {0};
    ev.kind = SCHED_EV_ERROR;
    ev.error = status;
    snprintf(ev.message, sizeof(ev.message), "%s", msg);
    run_finish(s, r, status, &ev);
}

/* Publish the pool numbers, then push the last events of the requests
 * that ended and drop the scheduler's references. Caller holds s->mu. */
void tell_ended(sched *s)
{
    if (s->n_ended == 0) {
        publish_pool(s);
        return;
    }
    INVARIANT(sched_check(s));
    publish_pool(s);
    for (int i = 0; i < s->n_ended; i++) {
        req_push(s->ended[i], &s->ended_ev[i]);
        req_unref(s->ended[i]);
    }
    s->n_ended = 0;
}

/* The error of a cancelled request: by its id, or otherwise (its client
 * went away, shutdown). Caller holds s->mu, under which cancel_by_id is set. */
int cancel_status(const sched_req *r)
{
    return r->cancel_by_id ? SCHED_EDELETED : SCHED_ECANCELLED;
}

/* Reject a queued request with an error event. Caller holds s->mu. */
void wait_reject(sched *s, sched_req *r, int status, const char *msg)
{
    wait_remove(s, r);
    r->state = RS_DONE;
    r->t_end = engine_now_s();
    group_leave(s, r, status, msg);
    req_push_error(r, status, msg);
    if (status == SCHED_ETIMEOUT)
        s->st.rejected_timeout_total++;
    else if (status == SCHED_ETOOBIG)
        s->st.rejected_toobig_total++;
    else if (status == SCHED_ECANCELLED || status == SCHED_EDELETED)
        s->st.cancelled_total++;
    req_unref(r);
}

static void fmt_toobig(const sched *s, const sched_req *r, char *buf, size_t n)
{
    const int total = r->n_prompt + r->max_new, m = group_size(r);
    uint64_t need = group_need_bytes(s, r);
    if (m > 1)
        snprintf(buf, n,
                 "%d choices need %llu bytes of cache (prompt %d + max_new_tokens %d each, the prompt's pages "
                 "shared), but the budget is %llu bytes (--cache-mem) and the context %d tokens; lower max_new_tokens or n",
                 m, (unsigned long long)need, r->n_prompt, r->max_new,
                 (unsigned long long)s->info->cache_budget_bytes, s->info->n_ctx);
    else
        snprintf(buf, n,
                 "request needs %d tokens of cache (prompt %d + max_new_tokens %d) = %llu bytes, "
                 "but the cache budget is %llu bytes (--cache-mem) and the context limit is %d tokens; "
                 "shorten the prompt or lower max_new_tokens",
                 total, r->n_prompt, r->max_new, (unsigned long long)need,
                 (unsigned long long)s->info->cache_budget_bytes, s->info->n_ctx);
}

/* Move queued r into the running set with sequence seq. Caller holds s->mu. */
static void admit_one(sched *s, sched_req *r, int seq)
{
    wait_remove(s, r);
    r->seq = seq;
    r->n_fed = engine_seq_len(s->e, seq);  /* the tokens the prefix store restored (0 for a placeholder) */
    r->slot = s->free_slots[--s->n_free_slots];
    r->state = RS_PREFILL;
    r->t_admit = engine_now_s();
    engine_seq_get_usage(s->e, seq, &r->usage);
    if (r->usage.total_reserved_bytes > r->peak_bytes)
        r->peak_bytes = r->usage.total_reserved_bytes;
    s->running[s->n_running++] = r;
    spec_admit(s, r);
    s->st.admitted_total++;
    sched_event ev = {0};
    ev.kind = SCHED_EV_ADMITTED;
    req_push(r, &ev);
}

/* Admit queued requests in FIFO order while they fit; a group (a leader
 * and the followers queued behind it) all at once or not at all. Caller
 * holds s->mu. */
void admit(sched *s)
{
    char msg[256];
    double now = engine_now_s();

    /* drop cancelled and expired requests first (a leader takes its
     * followers along: the scan starts over) */
    for (sched_req *r = s->wait_head, *next; r; r = next) {
        next = r->wait_next;
        if (atomic_load(&r->cancel)) {
            wait_reject(s, r, cancel_status(r), r->cancel_msg[0] ? r->cancel_msg : "request cancelled");
            next = s->wait_head;
        } else if (now - r->t_submit > s->p.queue_timeout_s) {
            snprintf(msg, sizeof(msg),
                     "request waited %.1f s without the sequences or cache budget to admit it (queue timeout %g s); retry later",
                     now - r->t_submit, s->p.queue_timeout_s);
            wait_reject(s, r, SCHED_ETIMEOUT, msg);
            next = s->wait_head;
        }
    }

    while (s->wait_head) {
        sched_req *r = s->wait_head;
        int total = r->n_prompt + r->max_new;
        const int m = group_size(r);
        uint64_t need = group_need_bytes(s, r);
        if (total > s->info->n_ctx || need > s->info->cache_budget_bytes) {
            fmt_toobig(s, r, msg, sizeof(msg));
            wait_reject(s, r, SCHED_ETOOBIG, msg);
            continue;
        }
        if (s->n_running + m > s->max_seqs || s->n_free_slots < m)
            break;
        int seq = group_hold(s, r) == 0 ? admit_seq_from_store(s, r, total) : -1;
        if (seq < 0) {
            group_unhold(s, r);
            if (s->n_running == 0) {
                /* nothing else holds cache: it will never fit */
                fmt_toobig(s, r, msg, sizeof(msg));
                wait_reject(s, r, SCHED_ETOOBIG, msg);
                continue;
            }
            break;      /* head-of-line: wait for running requests to free cache */
        }
        admit_one(s, r, seq);
        for (int i = 0; i < r->n_fol; i++)
            if (r->fol[i])
                admit_one(s, r->fol[i], r->fol[i]->seq);
        INVARIANT(sched_check(s));
    }
}


/* sched_text.c - the scheduler thread: text release and stop strings.
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
/* Scheduler thread: text release and stop strings                        */
/* ---------------------------------------------------------------------- */

/* Earliest full stop-string match in pending: its offset in *at and length
 * in *len. Returns false when there is none. */
static bool stop_find(const sched_req *r, size_t *at, size_t *len, int *which)
{
    bool found = false;
    for (int i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        const char *m = memmem(r->pending, r->n_pending, r->stop[i], l);
        if (m && (!found || (size_t)(m - r->pending) < *at)) {
            *at = (size_t)(m - r->pending);
            *len = l;
            *which = i;
            found = true;
        }
    }
    return found;
}

/* Bytes of pending that can be released now: everything before the
 * earliest suffix that could still grow into a stop string, cut back to a
 * complete UTF-8 prefix. */
static size_t release_len(const sched_req *r)
{
    size_t n = r->n_pending, hold = n;
    for (int i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        for (size_t k = n >= l ? n - l + 1 : 0; k < n && k < hold; k++) {
            if (memcmp(r->pending + k, r->stop[i], n - k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return utf8_complete_prefix(r->pending, hold);
}

static int pending_append(sched_req *r, const char *b, size_t n)
{
    if (r->n_pending + n + 1 > r->cap_pending) {
        size_t cap = r->cap_pending * 2;
        while (cap < r->n_pending + n + 1)
            cap *= 2;
        char *p = FAULT_OR(realloc(r->pending, cap));
        if (!p)
            return SCHED_ENOMEM;
        r->pending = p;
        r->cap_pending = cap;
    }
    memcpy(r->pending + r->n_pending, b, n);
    r->n_pending += n;
    return 0;
}

/* Move the first n pending bytes into a new heap string. NULL on OOM. */
static char *pending_take(sched_req *r, size_t n)
{
    char *t = FAULT_OR(malloc(n + 1));
    if (!t)
        return NULL;
    memcpy(t, r->pending, n);
    t[n] = '\0';
    memmove(r->pending, r->pending + n, r->n_pending - n);
    r->n_pending -= n;
    return t;
}

/* A submitter that reads nothing (a stalled stream client) leaves its
 * events queued: past max_unread_bytes the request is cancelled, so the
 * next step frees its sequence and the queue stops growing. */
static void check_unread(sched *s, sched_req *r)
{
    pthread_mutex_lock(&r->mu);
    const size_t unread = r->q_bytes;
    pthread_mutex_unlock(&r->mu);
    if (unread <= s->p.max_unread_bytes || atomic_load(&r->cancel))
        return;
    pthread_mutex_lock(&s->mu);
    snprintf(r->cancel_msg, sizeof(r->cancel_msg),
             "the client left %zu bytes of output unread (limit %zu): request cancelled", unread,
             s->p.max_unread_bytes);
    atomic_store(&r->cancel, true);
    pthread_mutex_unlock(&s->mu);
}

/* A token was sampled for r. Emit its event; returns SCHED_OK when the
 * request continues, 1 when it finished, or a negative error. */
int on_token(sched *s, sched_req *r, int32_t tok, float logprob, const sampler_top *top)
{
    sched_event ev = {0};
    char piece[256];
    ev.kind = SCHED_EV_TOKEN;
    ev.token = tok;
    ev.logprob = logprob;
    if (top)
        ev.top = *top;
    ev.t = engine_now_s();
    r->tokens[r->n_prompt + r->n_gen] = tok;
    r->n_gen++;

    size_t rel;
    if (tok_is_eog(engine_tokenizer(s->e), tok)) {
        ev.special = true;
        ev.final = true;
        ev.finish = SCHED_FINISH_EOS;
        rel = r->n_pending;
    } else {
        int n = tok_piece(engine_tokenizer(s->e), tok, piece, sizeof(piece));
        if (n < 0)
            n = 0;
        if ((size_t)n > sizeof(piece)) {
            char *big = FAULT_OR(malloc((size_t)n));
            if (!big)
                return SCHED_ENOMEM;
            tok_piece(engine_tokenizer(s->e), tok, big, (size_t)n);
            int rc = pending_append(r, big, (size_t)n);
            free(big);
            if (rc)
                return rc;
        } else if (pending_append(r, piece, (size_t)n)) {
            return SCHED_ENOMEM;
        }
        size_t at = 0, len = 0;
        if (stop_find(r, &at, &len, &ev.stop_index)) {
            ev.final = true;
            ev.finish = SCHED_FINISH_STOP;
            rel = r->include_stop ? at + len : at;
            r->n_pending = rel;     /* drop what follows the stop string */
        } else if (sched_grammar_done(r)) {
            ev.final = true;
            ev.finish = SCHED_FINISH_EOS;   /* the constraint is complete: as if the model ended */
            rel = r->n_pending;
        } else if (r->n_gen >= r->max_new) {
            ev.final = true;
            ev.finish = SCHED_FINISH_LENGTH;
            rel = r->n_pending;
        } else {
            rel = release_len(r);
        }
    }
    ev.text = pending_take(r, rel);
    if (!ev.text)
        return SCHED_ENOMEM;
    ev.text_len = rel;
    if (ev.final)
        r->n_pending = 0;
    bool final = ev.final;
    pthread_mutex_lock(&s->mu);
    if (r->t_first == 0)
        r->t_first = engine_now_s();
    r->pub_n_gen = r->n_gen;
    s->st.generation_tokens_total++;
    pthread_mutex_unlock(&s->mu);
    if (final) {
        r->final_ev = ev;       /* pushed after the sequence is freed */
        return 1;
    }
    int rc = req_push(r, &ev);
    if (rc == 0 && s->p.max_unread_bytes)
        check_unread(s, r);
    return rc;
}


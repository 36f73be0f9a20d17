/* sched_request.c - request objects, their event queues, and submission (any thread).
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
/* Request objects and their event queues                                 */
/* ---------------------------------------------------------------------- */

static void req_free(sched_req *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->q_len; i++)
        sched_event_clear(&r->q[(r->q_head + i) % r->q_cap]);
    free(r->q);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->pending);
    free(r->salt);
    free(r->snap_at);
    free(r->snaps);             /* empty: run_remove gave the snapshots back on the scheduler thread */
    free(r->fol);
    free(r->spec.pred);         /* its snapshot went back in run_remove */
    sched_event_clear(&r->final_ev);
    free(r->tokens);
    sampler_free(r->smp);
    gram_matcher_free(r->gm);
    if (r->efd >= 0)
        close(r->efd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void req_unref(sched_req *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1)
        req_free(r);
}

/* Append an event (takes ownership of ev->text). Returns 0 or SCHED_ENOMEM
 * (then the text is freed and the event dropped). The queue keeps one slot
 * free for the last event (ERROR or the final token), so out of memory can
 * drop a token but never the end a client waits for: sched_submit makes
 * the queue, and only the others grow it. */
int req_push(sched_req *r, sched_event *ev)
{
    int rc = 0;
    const bool last = ev->kind == SCHED_EV_ERROR || ev->final;
    pthread_mutex_lock(&r->mu);
    if (r->q_len + (last ? 0 : 1) >= r->q_cap) {
        int cap = r->q_cap ? r->q_cap * 2 : 16;
        sched_event *q = FAULT_OR(malloc((size_t)cap * sizeof(*q)));
        if (!q) {
            sched_event_clear(ev);
            rc = SCHED_ENOMEM;
            goto out_unlock;
        }
        for (int i = 0; i < r->q_len; i++)
            q[i] = r->q[(r->q_head + i) % r->q_cap];
        free(r->q);
        r->q = q;
        r->q_cap = cap;
        r->q_head = 0;
    }
    r->q[(r->q_head + r->q_len) % r->q_cap] = *ev;
    r->q_len++;
    r->q_bytes += sizeof(*ev) + ev->text_len;
    pthread_cond_broadcast(&r->cv);
    uint64_t one = 1;
    if (write(r->efd, &one, sizeof(one)) < 0) {
        /* eventfd counter overflow cannot happen at our rates; the
         * condvar has been signalled anyway */
    }
out_unlock:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void req_push_error(sched_req *r, int status, const char *msg)
{
    sched_event ev = {0};
    ev.kind = SCHED_EV_ERROR;
    ev.error = status;
    snprintf(ev.message, sizeof(ev.message), "%s", msg);
    req_push(r, &ev);
}

int sched_req_next(sched_req *r, sched_event *ev, int timeout_ms)
{
    int got = 0;
    pthread_mutex_lock(&r->mu);
    if (r->q_len == 0 && timeout_ms != 0) {
        if (timeout_ms < 0) {
            while (r->q_len == 0)
                pthread_cond_wait(&r->cv, &r->mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += timeout_ms / 1000;
            ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            while (r->q_len == 0) {
                if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT)
                    break;
            }
        }
    }
    if (r->q_len > 0) {
        *ev = r->q[r->q_head];
        r->q_head = (r->q_head + 1) % r->q_cap;
        r->q_len--;
        r->q_bytes -= sizeof(*ev) + ev->text_len;
        got = 1;
    }
    if (r->q_len == 0) {
        uint64_t v;
        /* drain the eventfd so poll() sleeps until the next push */
        if (read(r->efd, &v, sizeof(v)) < 0) {
            /* EAGAIN: already zero */
        }
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

int sched_req_event_fd(const sched_req *r)
{
    return r->efd;
}

void sched_req_cancel(sched_req *r)
{
    if (!r)
        return;
    atomic_store(&r->cancel, true);
    sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sched_req_release(sched_req *r)
{
    if (!r)
        return;
    sched_req_cancel(r);
    req_unref(r);
}

void sched_req_result(sched_req *r, sched_result *res)
{
    sched *s = r->s;
    double now = engine_now_s();
    memset(res, 0, sizeof(*res));
    pthread_mutex_lock(&s->mu);
    res->n_prompt = r->n_prompt;
    res->n_generated = r->pub_n_gen;
    res->max_new_tokens = r->max_new;
    double end = r->t_end > 0 ? r->t_end : now;
    res->queue_ms = ((r->t_admit > 0 ? r->t_admit : end) - r->t_submit) * 1e3;
    res->ttft_ms = r->t_first > 0 ? (r->t_first - r->t_submit) * 1e3 : -1.0;
    res->total_ms = (end - r->t_submit) * 1e3;
    res->peak_cache_bytes = r->peak_bytes;
    res->kv_bytes = r->usage.kv_reserved_bytes + r->usage.mla_reserved_bytes;
    res->state_bytes = r->usage.rec_state_bytes + r->usage.rec_conv_bytes;
    res->seed = r->seed;
    res->cached_tokens = r->pm.n_cached;
    res->prefix_reason = r->pm.reason;
    res->prefix_diverged_at = r->pm.diverged_at;
    res->spec = r->pub_spec;
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------------- */
/* Submission (any thread)                                                */
/* ---------------------------------------------------------------------- */

/* The request's sampler. With ignore_eos every end-of-generation token is
 * banned by a -inf bias, as llama-server does: the text never holds one
 * and the request runs to max_new_tokens (vLLM instead samples past an
 * EOS and keeps it in the text; a ban keeps the text clean and the length
 * fixed, which is what benchmarks ask ignore_eos for). */
static sampler *new_sampler(const sched *s, const sched_req_params *p)
{
    if (!p->ignore_eos || s->n_eog == 0)
        return sampler_new(&p->sampling, s->n_vocab);
    sampler_params sp = p->sampling;
    int n = sp.n_bias + s->n_eog;
    sampler_bias *b = FAULT_OR(malloc((size_t)n * sizeof(*b)));
    if (!b)
        return NULL;
    if (sp.n_bias > 0)
        memcpy(b, sp.bias, (size_t)sp.n_bias * sizeof(*b));
    for (int i = 0; i < s->n_eog; i++)
        b[sp.n_bias + i] = (sampler_bias){.id = s->eog[i], .bias = -INFINITY};
    sp.bias = b;
    sp.n_bias = n;
    sampler *smp = sampler_new(&sp, s->n_vocab);   /* copies the biases */
    free(b);
    return smp;
}

/* A request made from p, not queued yet (refs: submitter + scheduler).
 * Returns 0, SCHED_EINVAL or SCHED_ENOMEM with a message in err. */
static int req_make(sched *s, const sched_req_params *p, sched_req **out, char *err, size_t errlen)
{
    sched_req *r = NULL;
    int rc = SCHED_ENOMEM;
    *out = NULL;

    if (p->n_prompt < 1 || p->max_new_tokens < 1 || p->n_stop < 0) {
        snprintf(err, errlen, "a request needs at least one prompt token and max_new_tokens >= 1");
        return SCHED_EINVAL;
    }
    r = FAULT_OR(calloc(1, sizeof(*r)));
    if (!r)
        goto out_free;
    r->s = s;
    r->efd = -1;
    r->seq = -1;
    r->slot = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancel, false);
    atomic_init(&r->refs, 2);
    snprintf(r->id, sizeof(r->id), "%s", p->id ? p->id : "");
    snprintf(r->tags, sizeof(r->tags), "%s", p->tags ? p->tags : "");
    r->owner = p->owner;
    r->n_prompt = p->n_prompt;
    r->max_new = p->max_new_tokens;
    r->include_stop = p->include_stop;
    r->top_logprobs = p->top_logprobs < 0 ? 0 : p->top_logprobs > SAMPLER_MAX_TOP ? SAMPLER_MAX_TOP : p->top_logprobs;
    r->seed = p->sampling.seed;
    r->pm = (prefix_match){ .reason = PREFIX_OFF, .entry = -1 };
    r->salt = FAULT_OR(strdup(p->cache_salt ? p->cache_salt : ""));
    for (int i = 0; i < p->n_snap_hints && r->n_hints < SCHED_MAX_SNAP_HINTS; i++) {
        const int h = p->snap_hints[i];
        if (h > 0 && h < p->n_prompt && (r->n_hints == 0 || h > r->hints[r->n_hints - 1]))
            r->hints[r->n_hints++] = h;
    }
    if (!r->salt)
        goto out_free;
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->efd < 0)
        goto out_free;
    r->tokens = FAULT_OR(malloc(((size_t)p->n_prompt + (size_t)p->max_new_tokens) * sizeof(int32_t)));
    if (!r->tokens)
        goto out_free;
    memcpy(r->tokens, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    if (p->n_stop > 0) {
        r->stop = FAULT_OR(calloc((size_t)p->n_stop, sizeof(char *)));
        if (!r->stop)
            goto out_free;
        for (int i = 0; i < p->n_stop; i++) {
            r->stop[i] = FAULT_OR(strdup(p->stop[i]));
            if (!r->stop[i])
                goto out_free;
            r->n_stop++;
        }
    }
    r->prompt_lp = p->prompt_logprobs && p->n_prompt > 1;
    r->q_cap = 16;
    r->q = FAULT_OR(malloc((size_t)r->q_cap * sizeof(*r->q)));
    if (!r->q)
        goto out_free;
    r->cap_pending = 256;
    r->pending = FAULT_OR(malloc(r->cap_pending));
    if (!r->pending)
        goto out_free;
    r->smp = FAULT_OR(new_sampler(s, p));
    if (!r->smp)
        goto out_free;
    rc = sched_grammar_attach(s, r, p, err, errlen);
    if (rc)
        goto out_free;
    if ((rc = spec_attach(s, r, p, err, errlen)) != 0)
        goto out_free;
    rc = SCHED_ENOMEM;
    r->t_submit = engine_now_s();
    *out = r;
    return 0;

out_free:
    if (rc == SCHED_ENOMEM)
        snprintf(err, errlen, "out of memory while queueing the request");
    req_free(r);
    return rc;
}

/* Queue rs[0..n) at the tail, in order, all or none. Returns 0, or
 * SCHED_EDRAINING / SCHED_EFULL with a message in err (the requests stay
 * the caller's). */
static int wait_append(sched *s, sched_req *const *rs, int n, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->mu);
    if (s->draining || s->stop) {
        pthread_mutex_unlock(&s->mu);
        snprintf(err, errlen, "the server is shutting down and accepts no new requests");
        return SCHED_EDRAINING;
    }
    if (n > s->p.max_queue) {
        /* more choices than the whole queue holds: no retry can succeed */
        pthread_mutex_unlock(&s->mu);
        snprintf(err, errlen, "the %d choices of this request exceed the queue (--max-queue %d): ask for at most %d",
                 n, s->p.max_queue, s->p.max_queue);
        return SCHED_EINVAL;
    }
    if (s->n_waiting + n > s->p.max_queue) {
        s->st.rejected_full_total++;
        publish_stats(s);
        int n_wait = s->n_waiting;
        pthread_mutex_unlock(&s->mu);
        if (n > 1)
            snprintf(err, errlen, "model is overloaded: %d requests are already waiting and the %d choices of this "
                     "one do not fit the queue (--max-queue %d); retry later", n_wait, n, s->p.max_queue);
        else
            snprintf(err, errlen, "model is overloaded: %d requests are already waiting (--max-queue %d); retry later",
                     n_wait, s->p.max_queue);
        return SCHED_EFULL;
    }
    for (int i = 0; i < n; i++) {
        sched_req *r = rs[i];
        r->state = RS_QUEUED;
        if (s->wait_tail)
            s->wait_tail->wait_next = r;
        else
            s->wait_head = r;
        s->wait_tail = r;
        s->n_waiting++;
    }
    publish_stats(s);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int sched_submit(sched *s, const sched_req_params *p, sched_req **out,
                 char *err, size_t errlen)
{
    sched_req *r = NULL;
    int rc = req_make(s, p, &r, err, errlen);
    *out = NULL;
    if (rc)
        return rc;
    rc = wait_append(s, &r, 1, err, errlen);
    if (rc) {
        req_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int sched_submit_group(sched *s, const sched_req_params *p, int n, const uint64_t *seeds, const char *const *ids,
                       sched_req **out, char *err, size_t errlen)
{
    int rc = 0, made = 0;
    if (n < 1 || n > s->max_seqs) {
        snprintf(err, errlen, "%d choices cannot run together: the server runs at most %d sequences (--max-seqs)",
                 n, s->max_seqs);
        return SCHED_EINVAL;
    }
    if (p->prompt_logprobs && n > 1) {
        snprintf(err, errlen, "the choices of a group cannot ask for prompt logprobs");
        return SCHED_EINVAL;
    }
    for (int k = 0; k < n; k++)
        out[k] = NULL;
    sched_req *lead = NULL;
    for (; made < n; made++) {
        sched_req_params pk = *p;
        pk.id = ids[made];
        pk.sampling.seed = seeds[made];
        if ((rc = req_make(s, &pk, &out[made], err, errlen)) != 0)
            goto out_free;
        snprintf(out[made]->gid, sizeof out[made]->gid, "%s", p->id ? p->id : "");
    }
    lead = out[0];
    if (n > 1) {
        lead->fol = FAULT_OR(calloc((size_t)n - 1, sizeof *lead->fol));
        if (!lead->fol) {
            rc = SCHED_ENOMEM;
            snprintf(err, errlen, "out of memory while queueing the request");
            goto out_free;
        }
    }
    for (int k = 1; k < n; k++) {
        lead->fol[lead->n_fol++] = out[k];
        out[k]->leader = lead;
        out[k]->await_fork = true;
    }
    if ((rc = wait_append(s, out, n, err, errlen)) != 0)
        goto out_free;
    return 0;

out_free:
    for (int k = 0; k < made; k++) {
        req_free(out[k]);
        out[k] = NULL;
    }
    return rc;
}


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
    p->max_queue = 64;
    p->queue_timeout_s = 30.0;
    p->prefill_chunk = 512;
    p->n_threads = 0;
    p->prefix_cache = false;
    p->prefix_budget_bytes = 0;
    p->prefix_snap_interval = 0;
    p->max_unread_bytes = 0;
    p->grammar_cache_bytes = (size_t)64 << 20;
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

static void req_unref(sched_req *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1)
        req_free(r);
}

/* Append an event (takes ownership of ev->text). Returns 0 or SCHED_ENOMEM
 * (then the text is freed and the event dropped). The queue keeps one slot
 * free for the last event (ERROR or the final token), so out of memory can
 * drop a token but never the end a client waits for: sched_submit makes
 * the queue, and only the others grow it. */
static int req_push(sched_req *r, sched_event *ev)
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

static void req_push_error(sched_req *r, int status, const char *msg)
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
    if (s->n_waiting + n > s->p.max_queue) {
        s->st.rejected_full_total++;
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

/* ---------------------------------------------------------------------- */
/* Prefix cache: admission from the store, snapshots, keeping the result  */
/* ---------------------------------------------------------------------- */

/* Publish the pool (and the prefix store's numbers) for sched_get_stats.
 * Caller holds s->mu. */
static void publish_pool(sched *s)
{
    engine_get_pool_usage(s->e, &s->st.pool);
    if (s->prefix)
        prefix_get_stats(s->prefix, &s->st.prefix);
}

static bool prefix_drop_running_snaps(sched *s);
static int prefix_hints(const sched *s, const sched_req *r, int *at, int n_planned);

/* A branch point or a hint closer than this to the previous snapshot
 * length is not worth an engine step of its own: at b4e0b13 each turn of
 * the multi-turn bench ran three prefill steps with the cache on (1 token
 * to a branch point right after the restored snapshot, ~300, then 1 to
 * the prompt's end - 1) against one with it off, and a step's fixed cost
 * (the weights read once, a parallel region per matmul) is ~55 ms at 2
 * threads on a quiet machine (bench/results/latest.md: 128 against 512
 * prompt tokens), far more when the cores are shared; 32 tokens of
 * recompute cost ~0.2 s, paid only by a request that branches there.
 * (Since then a step takes the first snapshot inside its chunk without
 * stopping there, prefix_chunk, so only a second length in one chunk
 * costs a step; the gap still keeps lengths from crowding a chunk.) */
enum { PREFIX_MIN_SNAP_GAP = 32 };

/* DeltaNet blocks and KV page regions kept mapped ahead of need while the
 * store is on (sched_new). */
enum { SCHED_SPARE_BLOCKS = 2, SCHED_SPARE_REGIONS = 2 };

/* A new sequence for r reserved for total tokens. With the prefix store:
 * r's longest cached prefix restored into it, and store entries evicted,
 * least recently used first, while the cache cannot hold the reservation
 * (a request always wins over cached entries). -1 when it does not fit
 * even so. Sets r->pm and the snapshot lengths of r's prefill. Caller
 * holds s->mu. */
static int prefix_admit_seq(sched *s, sched_req *r, int total)
{
    int seq = -1;
    for (;;) {
        /* prompt logprobs need every prompt position's logits, which the
         * store does not keep: such a request prefills its whole prompt
         * (and still leaves an entry), and its miss says why */
        if (s->prefix && r->prompt_lp)
            r->pm = (prefix_match){ .reason = PREFIX_PROMPT_LOGPROBS, .entry = -1 };
        else if (s->prefix)
            r->pm = prefix_lookup(s->prefix, r->salt, r->owner, r->tokens, r->n_prompt);
        seq = r->pm.entry >= 0 ? prefix_fork(s->prefix, &r->pm) : engine_seq_new(s->e);
        if (seq >= 0 && engine_seq_reserve(s->e, seq, total) == 0)
            break;
        engine_seq_free(s->e, seq);
        seq = -1;
        if (!s->prefix || (!prefix_evict_one(s->prefix) && !prefix_drop_running_snaps(s)))
            break;
    }
    if (seq < 0 || !s->prefix)
        return seq;
    if (r->pm.entry < 0)
        r->pm.n_cached = 0;
    prefix_count(s->prefix, &r->pm);
    /* another tenant's entry is none of this one's business: the request
     * hears "no entry" (the counters in /metrics keep the reason) */
    if (r->pm.reason == PREFIX_SALT_DIFFERS)
        r->pm.reason = PREFIX_NO_ENTRY;
    /* where r's prefill stops for a DeltaNet snapshot: the point where it
     * diverged from a cached entry (the next request sharing that prefix
     * hits there), every snap_interval tokens, the submitter's hints (a
     * chat's message boundaries: the end of a shared system prompt) and
     * one short of the end of the prompt */
    if (!prefix_needs_snapshots(s->prefix))
        return seq;
    const int iv = prefix_snap_interval(s->prefix), from = r->pm.n_cached;
    const int n_max = (iv > 0 ? r->n_prompt / iv : 0) + 3 + 2 * SCHED_MAX_SNAP_HINTS;
    free(r->snap_at);
    free(r->snaps);
    r->snap_at = FAULT_OR(malloc((size_t)n_max * sizeof *r->snap_at));
    r->snaps = FAULT_OR(calloc((size_t)n_max, sizeof *r->snaps));
    r->n_snap_at = r->i_snap_at = r->n_snaps = 0;
    if (!r->snap_at || !r->snaps)
        return seq;     /* no snapshots: only the end of the output is kept */
    /* the lengths past from: the multiples of iv and one short of the
     * prompt (the same prompt again leaves its last token to prefill, for
     * the logits; a longer one that extends it restores there and
     * recomputes one token), always; the divergence point and the hints
     * only PREFIX_MIN_SNAP_GAP tokens or more past the previous length
     * kept (or from): each length is one more engine step for r, and a
     * later request that would have restored at a closer one restores the
     * previous one and recomputes fewer tokens than that step costs. The
     * kept lengths ascending, once each, into snap_at. */
    enum { OPT = SCHED_MAX_SNAP_HINTS + 1 };
    const int last = r->n_prompt - 1;
    int *req = r->snap_at + OPT, n_req = 0, opt[OPT], n_opt = 0;
    for (int t = iv > 0 ? (from / iv + 1) * iv : last; iv > 0 && t < last; t += iv)
        req[n_req++] = t;
    if (last > from)
        req[n_req++] = last;
    if (r->pm.diverged_at > from && r->pm.diverged_at < last)
        opt[n_opt++] = r->pm.diverged_at;
    n_opt += prefix_hints(s, r, opt + n_opt, n_req + n_opt);
    for (int i = 1; i < n_opt; i++)     /* insertion sort: the divergence point among the hints */
        for (int j = i; j > 0 && opt[j - 1] > opt[j]; j--) {
            const int t = opt[j];
            opt[j] = opt[j - 1];
            opt[j - 1] = t;
        }
    int i = 0, j = 0, prev = from;
    while (i < n_req || j < n_opt) {    /* writes snap_at[k] with k <= i + j < OPT + i: never unread req */
        const bool take_req = j == n_opt || (i < n_req && req[i] <= opt[j]);
        const int t = take_req ? req[i++] : opt[j++];
        if ((take_req || t - prev >= PREFIX_MIN_SNAP_GAP) && t > prev) {
            r->snap_at[r->n_snap_at++] = t;
            prev = t;
        }
    }
    return seq;
}

/* Copy to at[] r's hints that are worth a snapshot: past what the store
 * restored (no entry of r's salt holds a state there, else the lookup
 * would have restored at least that far) and short of the end of the
 * prompt, as many as the store's budget holds beside the n_planned others
 * (a snapshot it cannot hold would only evict one it can). Returns the
 * count. */
static int prefix_hints(const sched *s, const sched_req *r, int *at, int n_planned)
{
    const uint64_t each = engine_snap_bytes(s->e), budget = prefix_budget(s->prefix);
    int n = 0;
    for (int i = 0; i < r->n_hints; i++) {
        const int h = r->hints[i];
        if (h <= r->pm.n_cached || h >= r->n_prompt - 1)
            continue;
        if (each == 0 || (uint64_t)(n_planned + n + 1) * each > budget)
            break;
        at[n++] = h;
    }
    return n;
}

/* The prompt tokens r may prefill this step (at most k), and the snapshot
 * the step takes on the way: the next snapshot length inside the chunk is
 * taken inside the step (it->snap: the engine copies the DeltaNet state
 * there), and the chunk stops at the length after it (taken after the
 * step). Before, every length was a step of its own: a cold 300-token
 * prompt ran 299 tokens, then 1 token for the snapshot one short of its
 * end (~16 ms, a decode step reading every weight; docs/performance.md).
 * A snapshot the budget cannot hold is skipped (the store then restores
 * an earlier one). Caller holds s->mu. */
static int prefix_chunk(sched *s, sched_req *r, int k, engine_batch_item *it)
{
    int i = r->i_snap_at;
    if (i < r->n_snap_at && r->snaps) {
        const int at = r->snap_at[i] - r->n_fed;
        if (at > 0 && at < k) {
            it->snap = engine_snap_new(s->e);
            it->snap_at = at;
            i++;
        }
    }
    if (i < r->n_snap_at) {
        const int stop = r->snap_at[i] - r->n_fed;
        if (stop > 0 && stop < k)
            return stop;
    }
    return k;
}

/* A step's snapshot that did not run (the forward failed). */
static void prefix_step_snap_drop(sched *s, engine_batch_item *it)
{
    engine_snap_free(s->e, it->snap);
    it->snap = NULL;
}

/* After a step: keep the snapshot the step took inside it (it->snap), and
 * take the one r's prefill stopped for. A snapshot the budget cannot hold
 * is skipped (the store then restores an earlier one). */
static void prefix_snap_due(sched *s, sched_req *r, engine_batch_item *it)
{
    if (it->snap) {
        r->snaps[r->n_snaps++] = it->snap;      /* room: one per length in snap_at */
        it->snap = NULL;
    }
    while (r->i_snap_at < r->n_snap_at && r->snap_at[r->i_snap_at] <= r->n_fed) {
        if (r->snap_at[r->i_snap_at] == r->n_fed && r->snaps) {
            engine_snap *sn = engine_snap_take(s->e, r->seq);
            if (sn)
                r->snaps[r->n_snaps++] = sn;
        }
        r->i_snap_at++;
    }
}

/* Give back the snapshots r holds (it failed, or the store took the
 * rest). Caller holds s->mu. */
static void prefix_drop_snaps(sched *s, sched_req *r)
{
    for (int i = 0; i < r->n_snaps; i++)
        engine_snap_free(s->e, r->snaps[i]);
    r->n_snaps = r->pub_n_snaps = 0;
    r->i_snap_at = r->n_snap_at;        /* and takes no more */
}

/* The cache cannot admit the next request even with the store empty:
 * give back the snapshots the running requests took for the store (a
 * reservation wins over cached state). Returns whether any were held.
 * Caller holds s->mu. */
static bool prefix_drop_running_snaps(sched *s)
{
    bool any = false;
    for (int i = 0; i < s->n_running; i++) {
        any = any || s->running[i]->n_snaps > 0;
        prefix_drop_snaps(s, s->running[i]);
    }
    return any;
}

/* Carry out the resets sched_prefix_reset asked for: every entry of the
 * store goes (a running request forked from one keeps its own references
 * to the pages it shares, and its snapshots). Caller holds s->mu, on the
 * thread that owns the engine. */
static void prefix_reset_due(sched *s)
{
    if (s->reset_done == s->reset_asked)
        return;
    sched_prefix_freed f = { .enabled = s->prefix != NULL };
    engine_pool_usage before, after;
    engine_get_pool_usage(s->e, &before);
    if (s->prefix) {
        prefix_stats st;
        prefix_get_stats(s->prefix, &st);
        f.entries = st.n_entries;
        f.snapshots = st.n_snapshots;
        f.bytes = st.bytes;
        prefix_clear(s->prefix);
    }
    engine_get_pool_usage(s->e, &after);
    f.pool_freed_bytes = before.reserved_bytes - after.reserved_bytes;
    f.pool_reserved_bytes = after.reserved_bytes;
    f.running = s->n_running;
    s->reset_last = f;
    s->reset_done = s->reset_asked;
    publish_pool(s);
    pthread_cond_broadcast(&s->reset_cv);
}

/* r finished: the store keeps its sequence (prompt and the output fed
 * back, with its state at the end) and its snapshots. Caller holds s->mu. */
static void prefix_keep(sched *s, sched_req *r)
{
    if (!s->prefix || r->seq < 0)
        return;
    prefix_insert(s->prefix, r->salt, r->owner, r->tokens, r->n_fed, r->seq, r->snaps, r->n_snaps);
    r->seq = -1;
    r->n_snaps = 0;
}

/* ---------------------------------------------------------------------- */
/* Scheduler thread: admission, finishing                                 */
/* ---------------------------------------------------------------------- */

static void run_fail(sched *s, sched_req *r, int status, const char *msg);
static void wait_reject(sched *s, sched_req *r, int status, const char *msg);

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
        while (f) {
            const int seq = engine_seq_new(s->e);
            if (seq >= 0 && engine_seq_reserve(s->e, seq, own) == 0) {
                f->seq = seq;
                break;
            }
            engine_seq_free(s->e, seq);
            if (!s->prefix || (!prefix_evict_one(s->prefix) && !prefix_drop_running_snaps(s))) {
                group_unhold(s, r);
                return -1;
            }
        }
    }
    return 0;
}

/* Unlink leader r's follower i (NULL when it already left): it no longer
 * waits for a fork. Scheduler thread. */
static sched_req *group_take(sched_req *r, int i)
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
    prefix_drop_snaps(s, r);
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
static void run_finish(sched *s, sched_req *r, int status, sched_event *ev)
{
    if (status == SCHED_OK)
        prefix_keep(s, r);
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

static void run_fail(sched *s, sched_req *r, int status, const char *msg)
{
    sched_event ev = {0};
    ev.kind = SCHED_EV_ERROR;
    ev.error = status;
    snprintf(ev.message, sizeof(ev.message), "%s", msg);
    run_finish(s, r, status, &ev);
}

/* Publish the pool numbers, then push the last events of the requests
 * that ended and drop the scheduler's references. Caller holds s->mu. */
static void tell_ended(sched *s)
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
static int cancel_status(const sched_req *r)
{
    return r->cancel_by_id ? SCHED_EDELETED : SCHED_ECANCELLED;
}

/* Reject a queued request with an error event. Caller holds s->mu. */
static void wait_reject(sched *s, sched_req *r, int status, const char *msg)
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
    s->st.admitted_total++;
    sched_event ev = {0};
    ev.kind = SCHED_EV_ADMITTED;
    req_push(r, &ev);
}

/* Admit queued requests in FIFO order while they fit; a group (a leader
 * and the followers queued behind it) all at once or not at all. Caller
 * holds s->mu. */
static void admit(sched *s)
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
        int seq = group_hold(s, r) == 0 ? prefix_admit_seq(s, r, total) : -1;
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

/* ---------------------------------------------------------------------- */
/* Scheduler thread: text release and stop strings                        */
/* ---------------------------------------------------------------------- */

/* Earliest full stop-string match in pending: its offset in *at and length
 * in *len. Returns false when there is none. */
static bool stop_find(const sched_req *r, size_t *at, size_t *len)
{
    bool found = false;
    for (int i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        const char *m = memmem(r->pending, r->n_pending, r->stop[i], l);
        if (m && (!found || (size_t)(m - r->pending) < *at)) {
            *at = (size_t)(m - r->pending);
            *len = l;
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
static int on_token(sched *s, sched_req *r, int32_t tok, float logprob, const sampler_top *top)
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
    if (engine_token_is_eog(s->e, tok)) {
        ev.special = true;
        ev.final = true;
        ev.finish = SCHED_FINISH_EOS;
        rel = r->n_pending;
    } else {
        int n = engine_token_piece(s->e, tok, piece, sizeof(piece));
        if (n < 0)
            n = 0;
        if ((size_t)n > sizeof(piece)) {
            char *big = FAULT_OR(malloc((size_t)n));
            if (!big)
                return SCHED_ENOMEM;
            engine_token_piece(s->e, tok, big, (size_t)n);
            int rc = pending_append(r, big, (size_t)n);
            free(big);
            if (rc)
                return rc;
        } else if (pending_append(r, piece, (size_t)n)) {
            return SCHED_ENOMEM;
        }
        size_t at = 0, len = 0;
        if (stop_find(r, &at, &len)) {
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
 * *n_prefill_tok count decoding sequences and prompt tokens. */
static int build_batch(sched *s, int *n_decode, int *n_prefill_tok)
{
    int n = 0, budget = s->p.prefill_chunk;
    bool plp_used = false;      /* the prompt-logprob buffer is taken this step */
    *n_decode = 0;
    *n_prefill_tok = 0;
    for (int i = 0; i < s->n_running; i++) {
        sched_req *r = s->running[i];
        engine_batch_item *it = &s->items[n];
        if (r->await_fork)
            continue;       /* fed nothing: it forks from its leader */
        it->seq = r->seq;
        it->snap = NULL;
        it->snap_at = 0;
        it->tokens = r->tokens + r->n_fed;
        it->out = s->logits + (size_t)r->slot * (size_t)s->n_vocab;
        if (r->state == RS_DECODE) {
            it->n_tokens = 1;
            it->logits = ENGINE_LOGITS_LAST;
            (*n_decode)++;
        } else {
            int left = r->n_prompt - r->n_fed;
            int k = left < budget ? left : budget;
            if (k <= 0)
                continue;
            if (r->prompt_lp && (k = prompt_lp_chunk(s, it, k, &plp_used)) == 0)
                continue;
            k = prefix_chunk(s, r, k, it);
            budget -= k;
            *n_prefill_tok += k;
            it->n_tokens = k;
            if (!r->prompt_lp)
                it->logits = k == left ? ENGINE_LOGITS_LAST : ENGINE_LOGITS_NONE;
        }
        s->item_req[n++] = r;
    }
    return n;
}

/* Sample r's next token from logits (scratch) and emit it. Caller does
 * not hold s->mu. Returns 0, 1 (finished) or a negative error. */
static int sample_emit(sched *s, sched_req *r, float *logits)
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
            f->fork_rc = sample_emit(s, f, slot);
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
    r->n_fed += it->n_tokens;
    prefix_snap_due(s, r, it);
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
    return sample_emit(s, r, logits);
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

static void sched_step(sched *s)
{
    char err[256];
    int n_decode = 0, n_prefill_tok = 0;

    pthread_mutex_lock(&s->mu);
    reap_cancelled(s);
    admit(s);
    /* publish the pool together with the admissions, so a /stats snapshot
     * never lists an admitted request's cache without it in the pool */
    publish_pool(s);
    int n = build_batch(s, &n_decode, &n_prefill_tok);
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
        prefix_step_snap_drop(s, &s->items[0]);
    } else {
        /* find the culprit: run the items one at a time (no sequence was
         * modified by the failed call) */
        for (int i = 0; i < n; i++) {
            if (engine_forward(s->e, &s->items[i], 1, err, sizeof(err)) == 0) {
                rcs[i] = after_item(s, s->item_req[i], &s->items[i]);
            } else {
                rcs[i] = SCHED_EENGINE;
                prefix_step_snap_drop(s, &s->items[i]);
            }
        }
    }

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
    step_tokens_observe(&s->st, n_decode + n_prefill_tok);
    if (frc == 0 && n_prefill_tok == 0) {
        s->st.decode_steps_total++;
        s->st.decode_forward_seconds += fwd_s;
    }
    for (int i = 0; i < n + s->n_forked; i++) {
        /* the items, then the followers that forked from them */
        sched_req *r = i < n ? s->item_req[i] : s->forked[i - n];
        const int rc = i < n ? rcs[i] : r->fork_rc;
        r->pub_n_fed = r->n_fed;
        r->pub_n_snaps = r->n_snaps;
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

static void *sched_main(void *arg)
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
        prefix_reset_due(s);    /* between steps: no forward is using the engine */
        pthread_mutex_unlock(&s->mu);
        sched_step(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
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
        s->p.max_unread_bytes = p->max_unread_bytes;
        s->p.grammar_cache_bytes = p->grammar_cache_bytes;
    }
    s->max_seqs = s->info->max_seqs > 0 ? s->info->max_seqs : 1;
    s->n_vocab = s->info->n_vocab;
    pthread_mutex_init(&s->mu, NULL);
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
    for (int32_t t = 0; t < s->n_vocab; t++)     /* before sched_start: the engine is still ours */
        if (engine_token_is_eog(e, t))
            s->eog[s->n_eog++] = t;
    if (s->p.prefix_cache) {
        const uint64_t budget = s->info->cache_budget_bytes;
        prefix_params pp = { .budget_bytes = s->p.prefix_budget_bytes ? s->p.prefix_budget_bytes : budget / 4,
                             .snap_interval = s->p.prefix_snap_interval };
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
static void cancel_by_id(sched_req *r, const char *why)
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
        }
        for (const sched_req *r = s->wait_head; r; r = r->wait_next) {
            sched_req_stats *q = &a[k++];
            snprintf(q->id, sizeof(q->id), "%s", r->id);
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

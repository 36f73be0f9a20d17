/* test_scheduler.c - the scheduler (runtime/scheduler.c) driven directly on
 * a synthesized model: stop strings held back and cut across tokens,
 * cancellation frees the cache, never-fitting requests are refused with the
 * numbers, a submission that runs out of memory anywhere queues nothing,
 * a group of choices prefills once and ends and is admitted as a whole;
 * and its invariant checker sched_broken, which must notice each kind of
 * broken running set, slot list and wait queue. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fault.h"
#include "scheduler.h"
#include "scheduler_impl.h"
#include "synth.h"
#include "test.h"

static engine *open_model(const char *tag, uint64_t cache_bytes)
{
    static char path[512];
    char err[256];
    synth_config c;
    synth_config_default(&c);
    c.seed = 1;
    c.n_layer = 4;
    c.attn_every = 2;
    c.n_vocab = 300;
    snprintf(path, sizeof(path), "%s/sched_%s.gguf", test_tmpdir(), tag);
    if (synth_write(&c, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "synth: %s\n", err);
        return NULL;
    }
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 1;
    p.max_seqs = 4;
    p.cache_bytes = cache_bytes;
    engine *e = engine_open(&p, err, sizeof(err));
    if (!e)
        fprintf(stderr, "engine_open: %s\n", err);
    return e;
}

static sched_req_params greedy_request(const char *id, const int32_t *prompt, int n_prompt, int max_new)
{
    sched_req_params rp = {0};
    rp.id = id;
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rp.max_new_tokens = max_new;
    sampler_params_default(&rp.sampling);
    rp.sampling.greedy = true;
    return rp;
}

/* Run one request to the end; returns the text (heap) and the finish. */
static char *run_one(sched *s, const int32_t *prompt, int n_prompt, int max_new, const char *stop, bool include,
                     uint64_t seed, int *finish, int *n_events)
{
    sched_req_params rp = {0};
    sched_req *r = NULL;
    char err[256];
    const char *stops[1] = {stop};
    rp.id = "t";
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rp.max_new_tokens = max_new;
    sampler_params_default(&rp.sampling);
    rp.sampling.temperature = 10.0f;
    rp.sampling.seed = seed;
    rp.stop = stop ? stops : NULL;
    rp.n_stop = stop ? 1 : 0;
    rp.include_stop = include;
    if (sched_submit(s, &rp, &r, err, sizeof(err)) != 0)
        return NULL;
    char *text = calloc(1, 1);
    size_t len = 0;
    *finish = SCHED_FINISH_NONE;
    *n_events = 0;
    for (;;) {
        sched_event ev;
        if (!sched_req_next(r, &ev, 5000))
            break;
        if (ev.kind == SCHED_EV_TOKEN) {
            (*n_events)++;
            char *t = realloc(text, len + ev.text_len + 1);
            if (!t) {
                sched_event_clear(&ev);
                break;
            }
            text = t;
            memcpy(text + len, ev.text, ev.text_len + 1);
            len += ev.text_len;
            if (ev.final)
                *finish = ev.finish;
        }
        int kind = ev.kind;
        bool final = ev.final;
        sched_event_clear(&ev);
        if (kind == SCHED_EV_ERROR || final)
            break;
    }
    sched_req_release(r);
    return text;
}

TEST(test_scheduler_stop_strings_hold_back_and_cut_across_tokens)
{
    engine *e = open_model("stop", 0);
    CHECK(e != NULL);
    sched_params sp;
    sched_params_default(&sp);
    sp.n_threads = 1;     /* the engine's -t: OpenMP counts are per thread */
    sched *s = sched_new(e, &sp, NULL, 0);
    CHECK(s != NULL && sched_start(s) == 0);
    int32_t prompt[4];
    int np = engine_tokenize(e, "Once", 4, true, true, prompt, 4);
    int fin, nev;
    char *base = run_one(s, prompt, np, 40, NULL, false, 5, &fin, &nev);
    CHECK(base != NULL && fin == SCHED_FINISH_LENGTH && nev == 40);
    /* a two-byte stop from the middle: with a byte-level vocabulary it
     * always spans two tokens */
    size_t bl = strlen(base), at = 0;
    char stop[3] = {0};
    for (size_t i = 8; i + 2 < bl; i++) {
        if (base[i] > 32 && base[i] < 127 && base[i + 1] > 32 && base[i + 1] < 127) {
            memcpy(stop, base + i, 2);
            at = (size_t)(strstr(base, stop) - base);
            break;
        }
    }
    if (stop[0]) {
        char *cut = run_one(s, prompt, np, 40, stop, false, 5, &fin, &nev);
        CHECK(cut && fin == SCHED_FINISH_STOP && strlen(cut) == at && !strncmp(cut, base, at));
        free(cut);
        char *kept = run_one(s, prompt, np, 40, stop, true, 5, &fin, &nev);
        CHECK(kept && fin == SCHED_FINISH_STOP && strlen(kept) == at + 2 && !strncmp(kept, base, at + 2));
        free(kept);
    }
    free(base);
    sched_stats st;
    CHECK(sched_get_stats(s, &st, NULL, NULL) == 0);
    CHECK(st.running == 0 && st.pool.reserved_bytes == 0);
    sched_free(s);
    engine_close(e);
}

/* The last event of r: its error (0 after a final token). */
/* The text of r's tokens to its end; *error the error it ended with (0 for none). */
static char *collect(sched_req *r, int *error)
{
    char *text = calloc(1, 1);
    size_t len = 0;
    *error = -100;
    sched_event ev;
    while (text && sched_req_next(r, &ev, 10000) == 1) {
        const int kind = ev.kind;
        const bool final = ev.final;
        if (kind == SCHED_EV_TOKEN) {
            char *t = realloc(text, len + ev.text_len + 1);
            if (t) {
                memcpy(t + len, ev.text, ev.text_len + 1);
                len += ev.text_len;
            }
            text = t;
        }
        *error = kind == SCHED_EV_ERROR ? ev.error : 0;
        sched_event_clear(&ev);
        if (kind == SCHED_EV_ERROR || final)
            break;
    }
    return text;
}

static int last_error(sched_req *r)
{
    int error = 0;
    free(collect(r, &error));
    return error;
}

/* A started scheduler on e with the default parameters and one thread. */
static sched *sched_started(engine *e)
{
    sched_params sp;
    sched_params_default(&sp);
    sp.n_threads = 1;
    sched *s = sched_new(e, &sp, NULL, 0);
    if (s && sched_start(s) != 0) {
        sched_free(s);
        return NULL;
    }
    return s;
}

TEST(test_scheduler_cancel_by_id_ends_with_deleted_and_counts_as_cancelled)
{
    engine *e = open_model("cancel-id", 256 * 1024);
    CHECK(e != NULL);
    sched_params sp;
    sched_params_default(&sp);
    sp.n_threads = 1;
    sched *s = sched_new(e, &sp, NULL, 0);
    CHECK(s != NULL && sched_start(s) == 0);
    int32_t prompt[8];
    int np = engine_tokenize(e, "Hello", 5, true, true, prompt, 8);
    sched_req_params rp = greedy_request("by-id", prompt, np, 300);
    rp.owner = 7;
    sched_req *r = NULL, *r2 = NULL;
    char err[256];
    CHECK(sched_submit(s, &rp, &r, err, sizeof(err)) == 0);
    sched_event ev;
    CHECK(sched_req_next(r, &ev, 5000) == 1 && ev.kind == SCHED_EV_ADMITTED);
    CHECK(sched_cancel_id(s, "by-id", 8, "x") != 0);        /* another owner may not */
    CHECK(sched_cancel_id(s, "by-id", 7, "cancelled by its id") == 0);
    CHECK(last_error(r) == SCHED_EDELETED);
    /* sched_req_cancel (a client gone) stays SCHED_ECANCELLED */
    rp.id = "gone";
    CHECK(sched_submit(s, &rp, &r2, err, sizeof(err)) == 0);
    CHECK(sched_req_next(r2, &ev, 5000) == 1 && ev.kind == SCHED_EV_ADMITTED);
    sched_req_cancel(r2);
    CHECK(last_error(r2) == SCHED_ECANCELLED);
    sched_stats st;
    CHECK(sched_get_stats(s, &st, NULL, NULL) == 0);
    CHECK(st.cancelled_total == 2 && st.failed_total == 0);
    sched_req_release(r);
    sched_req_release(r2);
    sched_free(s);
    engine_close(e);
}

TEST(test_scheduler_cancel_frees_the_cache_and_refuses_what_never_fits)
{
    engine *e = open_model("cancel", 256 * 1024);
    CHECK(e != NULL);
    sched_params sp;
    sched_params_default(&sp);
    sp.max_queue = 2;
    sp.n_threads = 1;
    sched *s = sched_new(e, &sp, NULL, 0);
    CHECK(s != NULL && sched_start(s) == 0);
    int32_t prompt[8];
    int np = engine_tokenize(e, "Hello", 5, true, true, prompt, 8);
    sched_req_params rp = greedy_request("c", prompt, np, 300);
    sched_req *r = NULL;
    char err[256];
    CHECK(sched_submit(s, &rp, &r, err, sizeof(err)) == 0);
    sched_event ev;
    CHECK(sched_req_next(r, &ev, 5000) == 1 && ev.kind == SCHED_EV_ADMITTED);
    CHECK(sched_req_next(r, &ev, 5000) == 1 && ev.kind == SCHED_EV_TOKEN);
    sched_event_clear(&ev);
    sched_req_cancel(r);
    CHECK(last_error(r) == SCHED_ECANCELLED);
    sched_stats st;
    CHECK(sched_get_stats(s, &st, NULL, NULL) == 0);
    CHECK(st.running == 0 && st.pool.reserved_bytes == 0 && st.cancelled_total == 1);
    sched_req_release(r);

    /* 3000 tokens cannot fit a 256 KiB budget: refused with the numbers */
    rp.max_new_tokens = 3000;
    CHECK(sched_submit(s, &rp, &r, err, sizeof(err)) == 0);
    CHECK(sched_req_next(r, &ev, 5000) == 1 && ev.kind == SCHED_EV_ERROR && ev.error == SCHED_ETOOBIG);
    CHECK_MSG(strstr(ev.message, "3000") && strstr(ev.message, "bytes"), "%s", ev.message);
    sched_req_release(r);

    sched_drain(s);
    CHECK(sched_submit(s, &rp, &r, err, sizeof(err)) == SCHED_EDRAINING);
    sched_free(s);
    engine_close(e);
}

/* A scheduler whose thread is not started: the calling thread owns the
 * engine, and nothing moves unless the test moves it. */
static sched *sched_unstarted(engine *e, int max_queue)
{
    sched_params sp;
    sched_params_default(&sp);
    sp.max_queue = max_queue;
    sp.n_threads = 1;
    return sched_new(e, &sp, NULL, 0);
}

/* Put r in the running set the way admit() does, on sequence seq. */
static void run_by_hand(sched *s, sched_req *r, int seq)
{
    memset(r, 0, sizeof *r);
    r->s = s;
    r->seq = seq;
    r->slot = s->free_slots[--s->n_free_slots];
    r->state = RS_PREFILL;
    r->n_prompt = 4;
    r->max_new = 4;
    s->running[s->n_running++] = r;
}

/* A scheduler that is made but not started (so this thread owns the
 * engine) with two requests queued through sched_submit and two running,
 * put there by hand; each corruption of a copy of it is caught and named. */
TEST(test_scheduler_check_catches_each_broken_invariant)
{
    engine *e = open_model("check", 0);
    CHECK(e != NULL);
    sched *s = sched_unstarted(e, 4);
    CHECK(s != NULL);
    int32_t prompt[4] = { 1, 2, 3, 4 };
    sched_req_params rp = greedy_request("q", prompt, 4, 4);
    sched_req *q[2] = { NULL, NULL };
    char err[256];
    CHECK(sched_submit(s, &rp, &q[0], err, sizeof err) == 0 && sched_submit(s, &rp, &q[1], err, sizeof err) == 0);
    sched_req run[2];
    run_by_hand(s, &run[0], engine_seq_new(e));
    run_by_hand(s, &run[1], engine_seq_new(e));
    engine_batch_item it = { .seq = run[1].seq, .tokens = prompt, .n_tokens = 3,
                             .logits = ENGINE_LOGITS_NONE, .out = NULL };
    CHECK(engine_forward(e, &it, 1, err, sizeof err) == 0);
    run[1].n_fed = 3;
    pthread_mutex_lock(&s->mu);
    const char *good = sched_broken(s);
    pthread_mutex_unlock(&s->mu);
    CHECK_MSG(good == NULL, "%s", good);

    struct { const char *what, *says; } cases[] = {
        { "more running than max_seqs", "n_running <= max_seqs" },
        { "a logits slot lost", "free logits slots" },
        { "two requests on one sequence", "sequence of its own" },
        { "two requests on one logits slot", "slot of its own" },
        { "fed more than the sequence holds", "holds the tokens fed" },
        { "a running request marked queued", "prefilling or decoding" },
        { "more generated than max_new_tokens", "prompt and its generated" },
        { "a free slot that is held", "free logits slot" },
        { "n_waiting one more", "wait queue holds" },
        { "wait_tail not the last", "wait_tail" },
        { "a waiting request with a sequence", "without a sequence" },
        { "more waiting than max_queue", "max_queue" },
        { "a live sequence nobody runs", "running requests'" },
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int k = 0; k < n_cases; k++) {
        sched bad = *s;
        sched_req rc[2] = { run[0], run[1] }, qc = *q[0];
        sched_req *running[2] = { &rc[0], &rc[1] };
        int free_slots[4];
        memcpy(free_slots, s->free_slots, sizeof free_slots);
        bad.running = running;
        bad.free_slots = free_slots;
        bad.wait_head = &qc;
        int extra = -1;
        switch (k) {
        case 0: bad.n_running = bad.max_seqs + 1; break;
        case 1: bad.n_free_slots--; break;
        case 2: rc[1].seq = rc[0].seq; break;
        case 3: rc[1].slot = rc[0].slot; break;
        case 4: rc[0].n_fed = 1; break;
        case 5: rc[0].state = RS_QUEUED; break;
        case 6: rc[0].n_gen = rc[0].max_new + 1; break;
        case 7: free_slots[0] = rc[0].slot; break;
        case 8: bad.n_waiting++; break;
        case 9: bad.wait_tail = &qc; break;
        case 10: qc.seq = 0; break;
        case 11: bad.p.max_queue = 1; break;
        case 12: extra = engine_seq_new(e); break;
        }
        const char *why = sched_broken(&bad);
        if (extra >= 0)
            engine_seq_free(e, extra);
        CHECK_MSG(why != NULL, "%s: not noticed", cases[k].what);
        CHECK_MSG(strstr(why, cases[k].says), "%s: noticed as '%s', expected '%s'", cases[k].what, why,
                  cases[k].says);
    }
    CHECK(sched_broken(s) == NULL);

    /* take the hand-made requests out again, then shut down as usual */
    for (int i = 1; i >= 0; i--) {
        engine_seq_free(e, run[i].seq);
        s->free_slots[s->n_free_slots++] = run[i].slot;
    }
    s->n_running = 0;
    sched_req_release(q[0]);
    sched_req_release(q[1]);
    sched_free(s);
    engine_close(e);
}

/* Out of memory at each allocation of sched_submit in turn: the request is
 * refused with SCHED_ENOMEM and a message, nothing is queued, and the
 * scheduler's invariants hold (under SANITIZE=1 LeakSanitizer also sees
 * that the half-built request was freed). */
TEST(test_scheduler_submit_out_of_memory_at_each_allocation_queues_nothing)
{
    engine *e = open_model("oom", 0);
    CHECK(e != NULL);
    sched *s = sched_unstarted(e, 4);
    CHECK(s != NULL);
    int32_t prompt[4] = { 1, 2, 3, 4 };
    const char *stops[2] = { "ab", "cd" };
    sched_req_params rp = greedy_request("oom", prompt, 4, 4);
    rp.stop = stops;
    rp.n_stop = 2;
    const uint64_t seeds[3] = { 1, 2, 3 };
    const char *ids[3] = { "oom-0", "oom-1", "oom-2" };
    /* one request (sched_submit), then a group of 3 (sched_submit_group) */
    for (int n = 1, base = 0; n <= 3; base += n, n += 2) {
        int n_failed = 0, k = 1;
        for (; k < 200; k++) {
            sched_req *r[3] = { NULL, NULL, NULL };
            char err[256] = "";
            fault_inject(k);
            const int rc = n == 1 ? sched_submit(s, &rp, &r[0], err, sizeof err)
                                  : sched_submit_group(s, &rp, n, seeds, ids, r, err, sizeof err);
            const bool fired = fault_fired();
            fault_inject(0);
            pthread_mutex_lock(&s->mu);
            const char *why = sched_broken(s);
            const int n_waiting = s->n_waiting;
            pthread_mutex_unlock(&s->mu);
            CHECK_MSG(why == NULL, "allocation %d failed: %s", k, why);
            if (!fired) {
                CHECK_MSG(rc == 0 && r[n - 1] != NULL && n_waiting == base + n, "allocation %d: nothing failed, rc %d", k, rc);
                for (int i = 0; i < n; i++)
                    sched_req_release(r[i]);     /* still queued: sched_free ends them */
                break;
            }
            n_failed++;
            CHECK_MSG(rc == SCHED_ENOMEM && !r[0] && !r[1] && !r[2] && n_waiting == base && strstr(err, "out of memory"),
                      "allocation %d failed: rc %d, %d waiting, '%s'", k, rc, n_waiting, err);
        }
        CHECK_MSG(n_failed >= 7 * n, "only %d allocations could be failed (n = %d)", n_failed, n);
    }
    sched_free(s);
    engine_close(e);
}

static sched_req_params sampled_request(const char *id, const int32_t *prompt, int n_prompt, int max_new)
{
    sched_req_params rp = greedy_request(id, prompt, n_prompt, max_new);
    rp.sampling.greedy = false;
    rp.sampling.temperature = 10.0f;     /* every choice its own text */
    return rp;
}

/* sched_submit_group: the prompt is prefilled once (the prefill counter
 * grows by one prompt), each choice equals the request run alone with its
 * seed, and the cache is all given back. */
TEST(test_scheduler_group_prefills_once_and_each_choice_is_its_seed_alone)
{
    engine *e = open_model("group", 512 * 1024);
    CHECK(e != NULL);
    sched *s = sched_started(e);
    CHECK(s != NULL);
    const char *text = "The quick brown fox jumps over the lazy dog, again and again.";
    int32_t prompt[128];
    const int np = engine_tokenize(e, text, strlen(text), true, true, prompt, 128);
    CHECK(np > 2 * engine_get_info(e)->page_tokens && np < 128);   /* whole pages to share */
    enum { N = 3, MAX_NEW = 12 };
    const uint64_t seeds[N] = {11, 12, 13};
    const char *ids[N] = {"g-0", "g-1", "g-2"};
    char *alone[N] = {0}, *both[N] = {0};
    char err[256];
    for (int k = 0; k < N; k++) {
        sched_req_params rp = sampled_request(ids[k], prompt, np, MAX_NEW);
        rp.sampling.seed = seeds[k];
        sched_req *r = NULL;
        int error = 0;
        CHECK(sched_submit(s, &rp, &r, err, sizeof err) == 0);
        alone[k] = collect(r, &error);
        CHECK(error == 0);
        sched_req_release(r);
    }
    sched_stats st0, st1;
    CHECK(sched_get_stats(s, &st0, NULL, NULL) == 0);
    sched_req_params rp = sampled_request("g", prompt, np, MAX_NEW);
    sched_req *rs[N];
    CHECK(sched_submit_group(s, &rp, N, seeds, ids, rs, err, sizeof err) == 0);
    for (int k = 0; k < N; k++) {
        int error = 0;
        both[k] = collect(rs[k], &error);
        CHECK(error == 0);
        CHECK_MSG(alone[k] && both[k] && !strcmp(alone[k], both[k]), "choice %d: '%s' alone, '%s' in the group", k,
                  alone[k] ? alone[k] : "", both[k] ? both[k] : "");
    }
    CHECK(strcmp(both[0], both[1]) || strcmp(both[1], both[2]));
    CHECK(sched_get_stats(s, &st1, NULL, NULL) == 0);
    CHECK_MSG(st1.prompt_tokens_total - st0.prompt_tokens_total == (uint64_t)np, "prefilled %llu, the prompt is %d",
              (unsigned long long)(st1.prompt_tokens_total - st0.prompt_tokens_total), np);
    CHECK(st1.running == 0 && st1.pool.reserved_bytes == 0 && st1.pool.n_seqs == 0);
    for (int k = 0; k < N; k++) {
        sched_req_release(rs[k]);
        free(alone[k]);
        free(both[k]);
    }
    /* more choices than sequences can never run together */
    const uint64_t many[5] = {1, 2, 3, 4, 5};
    const char *mids[5] = {"m0", "m1", "m2", "m3", "m4"};
    sched_req *ms[5];
    CHECK(sched_submit_group(s, &rp, 5, many, mids, ms, err, sizeof err) == SCHED_EINVAL);
    sched_free(s);
    engine_close(e);
}

/* A queued group whose first choice is cancelled ends every choice; a group
 * whose forks cannot fit the budget is refused whole while one choice alone
 * would fit. */
TEST(test_scheduler_group_ends_together_and_is_admitted_whole)
{
    engine *e = open_model("group-end", 256 * 1024);
    CHECK(e != NULL);
    sched *s = sched_started(e);
    CHECK(s != NULL);
    int32_t prompt[64];
    const char *text = "Hello there, a prompt of two pages or so.";
    const int np = engine_tokenize(e, text, strlen(text), true, true, prompt, 64);
    char err[256];
    sched_event ev;
    /* two long requests hold two of the four sequences: a group of 3 waits */
    sched_req *hold[2];
    for (int i = 0; i < 2; i++) {
        sched_req_params rp = greedy_request("hold", prompt, np, 200);
        CHECK(sched_submit(s, &rp, &hold[i], err, sizeof err) == 0);
        CHECK(sched_req_next(hold[i], &ev, 5000) == 1 && ev.kind == SCHED_EV_ADMITTED);
    }
    const uint64_t seeds[3] = {1, 2, 3};
    const char *ids[3] = {"q-0", "q-1", "q-2"};
    sched_req *rs[3];
    sched_req_params rp = sampled_request("q", prompt, np, 8);
    CHECK(sched_submit_group(s, &rp, 3, seeds, ids, rs, err, sizeof err) == 0);
    sched_stats st;
    CHECK(sched_get_stats(s, &st, NULL, NULL) == 0 && st.waiting == 3);
    sched_req_cancel(rs[0]);
    for (int k = 0; k < 3; k++) {
        int error = 0;
        free(collect(rs[k], &error));
        CHECK_MSG(error == SCHED_ECANCELLED, "choice %d ended with %d", k, error);
        sched_req_release(rs[k]);
    }
    for (int i = 0; i < 2; i++) {
        sched_req_cancel(hold[i]);
        CHECK(last_error(hold[i]) == SCHED_ECANCELLED);
        sched_req_release(hold[i]);
    }
    /* the group's id (DELETE /requests/{id}) cancels every choice; on a
     * fast machine all of them may have finished first, and then the id
     * matches nothing and each ended normally */
    rp.max_new_tokens = 64;
    CHECK(sched_submit_group(s, &rp, 3, seeds, ids, rs, err, sizeof err) == 0);
    for (int k = 0; k < 3; k++)
        CHECK(sched_req_next(rs[k], &ev, 5000) == 1 && ev.kind == SCHED_EV_ADMITTED);
    const int crc = sched_cancel_id(s, "q", 0, "by the group's id");
    int n_deleted = 0;
    for (int k = 0; k < 3; k++) {
        int error = 0;
        free(collect(rs[k], &error));
        CHECK_MSG(error == SCHED_EDELETED || error == 0, "choice %d ended with %d", k, error);
        n_deleted += error == SCHED_EDELETED;
        sched_req_release(rs[k]);
    }
    CHECK_MSG(crc == 0 || n_deleted == 0, "the id matched nothing, yet %d choices were deleted", n_deleted);
    CHECK(sched_get_stats(s, &st, NULL, NULL) == 0 && st.running == 0 && st.pool.reserved_bytes == 0);

    /* the largest max_new one choice fits in the budget, 3 choices do not */
    const engine_info *in = engine_get_info(e);
    int max_new = 0;
    for (int m = 1; np + m <= in->n_ctx; m++) {
        const uint64_t one = engine_bytes_for_tokens(e, np + m);
        const uint64_t fork = engine_bytes_for_tokens(e, np + m - np / in->page_tokens * in->page_tokens);
        if (one <= in->cache_budget_bytes && one + 2 * fork > in->cache_budget_bytes) {
            max_new = m;
            break;
        }
    }
    CHECK(max_new > 0);
    rp.max_new_tokens = max_new;
    CHECK(sched_submit_group(s, &rp, 3, seeds, ids, rs, err, sizeof err) == 0);
    for (int k = 0; k < 3; k++) {
        CHECK(sched_req_next(rs[k], &ev, 5000) == 1 && ev.kind == SCHED_EV_ERROR && ev.error == SCHED_ETOOBIG);
        CHECK_MSG(strstr(ev.message, "3 choices"), "%s", ev.message);
        sched_req_release(rs[k]);
    }
    sched_req *one = NULL;
    CHECK(sched_submit(s, &rp, &one, err, sizeof err) == 0);
    CHECK(sched_req_next(one, &ev, 5000) == 1 && ev.kind == SCHED_EV_ADMITTED);
    sched_req_release(one);
    sched_free(s);
    engine_close(e);
}

/* Run prompt greedily to its end with the given snapshot hints; the
 * prompt tokens the prefix cache restored for it, -1 on an error. */
static int cached_run(sched *s, const int32_t *prompt, int n_prompt, const int *hints, int n_hints)
{
    sched_req_params rp = greedy_request("hinted", prompt, n_prompt, 4);
    rp.snap_hints = hints;
    rp.n_snap_hints = n_hints;
    sched_req *r = NULL;
    char err[256];
    if (sched_submit(s, &rp, &r, err, sizeof(err)) != 0)
        return -1;
    sched_result res;
    int rc = last_error(r);
    sched_req_result(r, &res);
    sched_req_release(r);
    return rc == 0 ? res.cached_tokens : -1;
}

/* A hint inside the prompt makes the request snapshot its DeltaNet state
 * there, so the next prompt sharing exactly that much restores it: 40 of
 * a 40-token shared head on the second request, where without the hint
 * the only snapshot (one short of the first prompt) is past the shared
 * part and nothing is restored. Hints outside (0, n_prompt - 1) are
 * dropped. Then sched_prefix_reset frees every entry: the pool is empty. */
TEST(test_scheduler_snapshot_hints_let_the_second_request_restore_a_shared_head)
{
    /* the first prompt is HEAD shared tokens and 16 of its own */
    enum { HEAD = 40, N = 56 };     /* HEAD past PREFIX_MIN_SNAP_GAP (32): a hint closer to 0 takes no step */
    int32_t a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = (int32_t)(40 + (i * 7) % 80);
        b[i] = i < HEAD ? a[i] : (int32_t)(200 + i);
    }
    const int hints[] = { 0, HEAD, N, N + 5 };
    for (int with = 0; with < 2; with++) {
        engine *e = open_model(with ? "hints-on" : "hints-off", 0);
        CHECK(e != NULL);
        sched_params sp;
        sched_params_default(&sp);
        sp.n_threads = 1;
        sp.prefix_cache = true;
        sched *s = sched_new(e, &sp, NULL, 0);
        CHECK(s != NULL && sched_start(s) == 0);
        CHECK(cached_run(s, a, N, with ? hints : NULL, with ? 4 : 0) == 0);
        const int got = cached_run(s, b, N, NULL, 0);
        CHECK_MSG(got == (with ? HEAD : 0), "%s hints: restored %d", with ? "with" : "without", got);
        sched_prefix_freed f;
        CHECK(sched_prefix_reset(s, &f) == 0);
        CHECK(f.enabled && f.entries >= 1 && f.pool_freed_bytes > 0 && f.pool_reserved_bytes == 0);
        sched_stats st;
        CHECK(sched_get_stats(s, &st, NULL, NULL) == 0);
        CHECK(st.pool.reserved_bytes == 0 && st.pool.n_seqs == 0 && st.prefix.n_entries == 0);
        sched_free(s);
        engine_close(e);
    }
}

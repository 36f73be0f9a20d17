/* test_fault.c - out of memory at each allocation in turn (engine/fault.h):
 * loading a model, and a request's whole life on a running scheduler.
 * Each failure must give a clean error (NULL with a message, an ERROR
 * event or a refused submit) and leave nothing behind: under
 * `make SANITIZE=1` LeakSanitizer checks that every half-built thing was
 * freed; the scheduler's pool is checked here to come back to zero. The
 * loops stop at the first N whose armed failure never happened: the
 * operation then made fewer than N allocations and succeeded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "fault.h"
#include "scheduler.h"
#include "synth.h"
#include "test.h"

static const char *write_model(const char *tag)
{
    static char path[512];
    char err[256];
    synth_config c;
    synth_config_default(&c);
    c.seed = 3;
    c.n_layer = 4;
    c.attn_every = 2;       /* both layer kinds: DeltaNet and attention */
    c.n_vocab = 300;
    snprintf(path, sizeof path, "%s/fault_%s.gguf", test_tmpdir(), tag);
    if (synth_write(&c, path, err, sizeof err) != 0) {
        fprintf(stderr, "synth: %s\n", err);
        return NULL;
    }
    return path;
}

static void params_for(engine_params *p, const char *path)
{
    engine_params_default(p);
    p->model_path = path;
    p->n_threads = 1;       /* no OpenMP team allocating beside the countdown */
    p->max_seqs = 4;
}

/* engine_open with its N-th allocation failing, N = 1, 2, ...: the gguf
 * reader, the model binding, the tokenizer's construction, the cache and
 * the scratch. A failure returns NULL with a message; the allocations
 * that may fail without failing the load are the list of weights the
 * panel repack and the F32 copy take, and the F32 copy's region (this
 * model is F32), which then leave the weights as stored (the engine must
 * still work). */
TEST(test_fault_engine_open_fails_cleanly_at_each_allocation)
{
    const char *path = write_model("open");
    CHECK(path != NULL);
    engine_params p;
    params_for(&p, path);
    int n_failed = 0, n_degraded = 0, k = 1;
    for (; k < 20000; k++) {
        char err[256] = "";
        fault_inject(k);
        engine *e = engine_open(&p, err, sizeof err);
        const bool fired = fault_fired();
        fault_inject(0);
        if (!fired) {
            CHECK_MSG(e != NULL, "allocation %d: nothing failed but engine_open: %s", k, err);
            int32_t ids[8];
            CHECK(engine_tokenize(e, "Once", 4, true, true, ids, 8) > 0);
            engine_close(e);
            break;
        }
        if (e) {                /* survived the failure: it must still tokenize */
            int32_t ids[8];
            const int n = engine_tokenize(e, "Once", 4, true, true, ids, 8);
            engine_close(e);
            CHECK_MSG(n > 0, "allocation %d failed, engine_open succeeded but cannot tokenize", k);
            n_degraded++;
            printf("    allocation %d failed, engine_open went on (the panel repack or the F32 copy?)\n", k);
            continue;
        }
        CHECK_MSG(err[0] != '\0', "allocation %d failed: engine_open returned NULL with no message", k);
        n_failed++;
    }
    CHECK_MSG(k < 20000, "engine_open still failed after %d allocations", k - 1);
    /* the load allocates at least the engine, model, gguf context, its
     * tables, the tokenizer and its tables, cache and scratch */
    CHECK_MSG(n_failed >= 20, "only %d of %d allocations failed the load", n_failed, k - 1);
    CHECK_MSG(n_degraded <= 2, "%d allocations failed without failing the load", n_degraded);
    printf("    engine_open: %d allocations, %d failed it cleanly, %d degraded\n", k - 1, n_failed, n_degraded);
}

/* Run one request to its end. Returns 1 when it ended with its final
 * token, 0 with an ERROR event, -1 refused at submit, -2 no end in sight. */
static int one_request(sched *s, const int32_t *prompt, int n_prompt, int max_new, char *why, size_t whylen)
{
    const char *stops[1] = { "zz" };
    sched_req_params rp = {0};
    rp.id = "fault";
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rp.max_new_tokens = max_new;
    rp.stop = stops;
    rp.n_stop = 1;
    sampler_params_default(&rp.sampling);
    rp.sampling.temperature = 0.8f;
    rp.sampling.seed = 7;
    //rp.sampling.repetition_penalty = 1.1f;      /* the sampler's count tables too */
    sched_req *r = NULL;
    why[0] = '\0';
    if (sched_submit(s, &rp, &r, why, whylen) != 0)
        return why[0] ? -1 : -2;
    int rc = -2;
    for (;;) {
        sched_event ev;
        if (!sched_req_next(r, &ev, 30000))
            break;
        const int kind = ev.kind;
        const bool final = ev.final;
        if (kind == SCHED_EV_ERROR)
            snprintf(why, whylen, "%s", ev.message);
        sched_event_clear(&ev);
        if (kind == SCHED_EV_ERROR) {
            rc = 0;
            break;
        }
        if (kind == SCHED_EV_TOKEN && final) {
            rc = 1;
            break;
        }
    }
    sched_req_release(r);
    return rc;
}

/* Wait (bounded) until the scheduler holds no request and no cache. */
static bool pool_back_to_zero(sched *s, sched_stats *st)
{
    for (int i = 0; i < 3000; i++) {
        if (sched_get_stats(s, st, NULL, NULL) == 0 && st->running == 0 && st->waiting == 0 &&
            st->pool.n_seqs == 0 && st->pool.reserved_bytes == 0 && st->pool.n_pages_used == 0)
            return true;
        nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    }
    return false;
}

/* A request's whole life (submit, admission, prefill, decode, sampling,
 * stop-string holding, events, finish) on a running scheduler with its
 * N-th allocation failing, N = 1, 2, ...: armed only while this request
 * is the one live, so the scheduler thread's allocations count too. Each
 * failure is an ERROR event or a refused submit, the pool goes back to
 * zero, and the next request (the next N) is served. */
TEST(test_fault_request_life_fails_cleanly_at_each_allocation)
{
    const char *path = write_model("life");
    CHECK(path != NULL);
    engine_params p;
    params_for(&p, path);
    char err[256];
    engine *e = engine_open(&p, err, sizeof err);
    CHECK_MSG(e != NULL, "engine_open: %s", err);
    sched_params sp;
    sched_params_default(&sp);
    sp.n_threads = 1;
    sched *s = sched_new(e, &sp, NULL, 0);
    CHECK(s != NULL && sched_start(s) == 0);
    int32_t prompt[64];
    const int np = engine_tokenize(e, "Once upon a time there", 22, true, true, prompt, 64);
    CHECK(np > 1);
    const int max_new = 12;
    char why[256];
    /* the request served once with nothing failing */
    CHECK_MSG(one_request(s, prompt, np, max_new, why, sizeof why) == 1, "unarmed request: %s", why);
    sched_stats st;
    int n_error = 0, n_refused = 0, k = 1;
    for (; k < 5000; k++) {
        fault_inject(k);
        const int rc = one_request(s, prompt, np, max_new, why, sizeof why);
        const bool fired = fault_fired();
        fault_inject(0);
        CHECK_MSG(rc != -2, "allocation %d: the request never ended (%s)", k, why);
        CHECK_MSG(pool_back_to_zero(s, &st), "allocation %d: %d running, %d waiting, %d seqs, %llu bytes held",
                  k, st.running, st.waiting, st.pool.n_seqs, (unsigned long long)st.pool.reserved_bytes);
        if (!fired) {
            CHECK_MSG(rc == 1, "allocation %d: nothing failed but the request: %s", k, why);
            break;
        }
        CHECK_MSG(rc != 1, "allocation %d failed but the request finished as if nothing had", k);
        CHECK_MSG(why[0] != '\0', "allocation %d failed without a message", k);
        if (rc == 0)
            n_error++;
        else
            n_refused++;
    }
    CHECK_MSG(k < 5000, "the request still failed after %d allocations", k - 1);
    CHECK_MSG(n_refused >= 5 && n_error >= 5, "%d refused at submit, %d ERROR events", n_refused, n_error);
    /* and one more, unarmed, served as before */
    CHECK_MSG(one_request(s, prompt, np, max_new, why, sizeof why) == 1, "after the loop: %s", why);
    printf("    request life: %d allocations, %d refused at submit, %d ended with ERROR\n", k - 1, n_refused,
           n_error);
    sched_free(s);
    engine_close(e);
}

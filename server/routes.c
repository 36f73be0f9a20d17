/* routes.c - the route table, request handlers, and error statuses.
 *
 * Owns: one handler per route; the generation flow shared by the TGI and
 * OpenAI routes (parse -> template -> tokenize -> validate against the
 * context -> queue -> wait for admission -> stream, or collect and answer);
 * the mapping of every error kind to a status and an envelope.
 * Does not own: libmicrohttpd (http.c), field rules (json.c), SSE
 * (stream.c), /stats and /metrics contents (metrics.c).
 * ref: docs/serving.md 1 (routes), 2 (TGI shapes), 4 (errors).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "chat.h"
#include "json.h"
#include "config.h"
#include "metrics.h"
#include "routes.h"
#include "stream.h"
#include "web.h"

#define HYSERVE_VERSION "0.1.0"

/* ---------------------------------------------------------------------- */
/* Errors: kind -> status and envelope, in one place                      */
/* ---------------------------------------------------------------------- */

typedef struct err_map {
    int kind;
    int status;
    const char *tgi_type;
    const char *oai_type;
} err_map;

static const err_map ERRS[] = {
    {ERR_BAD_JSON, 400, "bad_request", "invalid_request_error"},
    {ERR_VALIDATION, 422, "validation", "invalid_request_error"},
    {ERR_CONTEXT, 422, "validation", "invalid_request_error"},
    {ERR_TEMPLATE, 422, "template_error", "invalid_request_error"},
    {ERR_NOT_FOUND, 404, "not_found", "invalid_request_error"},
    {ERR_METHOD, 405, "method_not_allowed", "invalid_request_error"},
    {ERR_TOO_LARGE, 413, "payload_too_large", "invalid_request_error"},
    {ERR_OVERLOADED, 429, "overloaded", "overloaded_error"},
    {ERR_LOADING, 503, "not_ready", "server_error"},
    {ERR_DRAINING, 503, "draining", "server_error"},
    {ERR_GENERATION, 424, "generation", "server_error"},
    /* A request cancelled by DELETE /requests/{id} must not come back: the
     * official clients retry 408, 409, 429 and every 5xx (the openai
     * package re-ran the whole generation on the 503 this used to be).
     * 499 is nginx's "client closed request", the status logs and proxies
     * already use for a request ended from the client's side; as a 4xx it
     * is not retried by the openai or huggingface clients, and unlike a
     * 400 (vLLM's answer to an aborted request) it does not say the
     * request was malformed. The body names the cancellation. */
    {ERR_CANCELLED, 499, "cancelled", "cancelled"},
    {ERR_INTERNAL, 500, "internal", "server_error"},
};

static bool is_openai(const http_req *hr)
{
    return !strncmp(hr->path, "/v1/", 4);
}

/* Extra facts some errors carry. */
typedef struct err_extra {
    const char *param;          /* OpenAI "param" */
    int n_prompt, max_total;    /* context overflow numbers, when > 0 */
    const char *allow;          /* 405: Allow header */
} err_extra;

static int send_error(http_req *hr, int kind, const char *msg, const err_extra *x)
{
    const err_map *m = &ERRS[sizeof(ERRS) / sizeof(ERRS[0]) - 1];
    for (size_t i = 0; i < sizeof(ERRS) / sizeof(ERRS[0]); i++)
        if (ERRS[i].kind == kind)
            m = &ERRS[i];
    int status = m->status;
    cJSON *body;
    if (is_openai(hr)) {
        /* OpenAI clients expect 400 for every invalid request */
        if (status == 422)
            status = 400;
        const char *code = kind == ERR_CONTEXT ? "context_length_exceeded" : NULL;
        body = json_error_oai(msg, m->oai_type, x ? x->param : NULL, code);
        if (body && kind == ERR_CONTEXT && x && x->max_total > 0) {
            cJSON *e = cJSON_GetObjectItemCaseSensitive(body, "error");
            cJSON_AddNumberToObject(e, "n_prompt_tokens", x->n_prompt);
            cJSON_AddNumberToObject(e, "max_total_tokens", x->max_total);
        }
    } else {
        body = json_error_tgi(msg, m->tgi_type);
        if (body && kind == ERR_CONTEXT && x && x->max_total > 0) {
            cJSON_AddNumberToObject(body, "n_prompt_tokens", x->n_prompt);
            cJSON_AddNumberToObject(body, "max_total_tokens", x->max_total);
        }
    }
    if (!hr->failure) {
        switch (kind) {
        case ERR_BAD_JSON: case ERR_VALIDATION: case ERR_CONTEXT: case ERR_TEMPLATE: case ERR_TOO_LARGE:
            hr->failure = "validation";
            break;
        case ERR_OVERLOADED: hr->failure = "overloaded"; break;
        case ERR_CANCELLED: hr->failure = "cancelled"; break;
        case ERR_LOADING: case ERR_DRAINING: hr->failure = "unavailable"; break;
        case ERR_NOT_FOUND: case ERR_METHOD: hr->failure = "not_found"; break;
        default: hr->failure = "internal"; break;
        }
    }
    char retry[16];
    const char *hdrs[5] = {NULL};
    int nh = 0;
    if (kind == ERR_OVERLOADED || kind == ERR_LOADING || kind == ERR_DRAINING) {
        int s = kind == ERR_OVERLOADED && hr->srv->sched ? sched_retry_after_s(hr->srv->sched) : 5;
        snprintf(retry, sizeof(retry), "%d", s);
        hdrs[nh++] = "Retry-After";
        hdrs[nh++] = retry;
    }
    if (kind == ERR_METHOD && x && x->allow) {
        hdrs[nh++] = "Allow";
        hdrs[nh++] = x->allow;
    }
    return http_send_json(hr, status, body, hdrs);
}

int routes_error(http_req *hr, int kind, const char *msg)
{
    return send_error(hr, kind, msg, NULL);
}

/* 503 unless the model is loaded and we are not draining. */
static bool check_ready(http_req *hr)
{
    int st = atomic_load_explicit(&hr->srv->state, memory_order_acquire);
    if (st == SERVER_READY)
        return true;
    if (st == SERVER_DRAINING)
        routes_error(hr, ERR_DRAINING, "the server is shutting down and accepts no new requests");
    else if (st == SERVER_LOADING)
        routes_error(hr, ERR_LOADING, "the model is still loading; retry shortly");
    else
        routes_error(hr, ERR_INTERNAL, "the model failed to load; see the server log");
    return false;
}

/* ---------------------------------------------------------------------- */
/* Tokenizing                                                             */
/* ---------------------------------------------------------------------- */

/* Encode text with the model's BOS rule, control tokens parsed except in
 * the data spans (n_data pairs [start, end) of a rendered chat prompt: the
 * messages' content; none for a raw prompt, whose writer formats it).
 * Returns the count (tokens in *out, heap) or -1. */
static int tokenize(server *srv, const char *text, const size_t *data, int n_data, int32_t **out)
{
    size_t len = strlen(text);
    int cap = (int)(len < 1000000000 ? len : 1000000000) + 8;
    *out = NULL;
    for (int tries = 0; tries < 2; tries++) {
        int32_t *buf = malloc((size_t)cap * sizeof(int32_t));
        if (!buf)
            return -1;
        int n = engine_tokenize_chat(srv->eng, text, len, srv->info->add_bos, data, n_data, buf, cap);
        if (n < 0) {
            free(buf);
            return -1;
        }
        if (n <= cap) {
            *out = buf;
            return n;
        }
        free(buf);
        cap = n;
    }
    return -1;
}

static uint64_t random_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s))
        s = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL;
    return s;   /* all 64 bits: details.seed is written in full digits */
}

/* ---------------------------------------------------------------------- */
/* Generation                                                             */
/* ---------------------------------------------------------------------- */

enum gen_mode {
    GEN_BODY = 0,               /* stream when the body says "stream": true */
    GEN_STREAM = 1,             /* /generate_stream */
    GEN_COMPAT = 2,             /* POST /: like /generate, the answer is an array of one */
};

static cJSON *tgi_response(server *srv, const gen_request *g, const gen_result *res, const sched_result *sr,
                           int n_prompt)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    char *full = NULL;
    size_t fl = 0, fc = 0;
    if (g->return_full_text)
        json_buf_append(&full, &fl, &fc, g->prompt, strlen(g->prompt));
    json_buf_append(&full, &fl, &fc, res->text ? res->text : "", res->len);
    json_add_text(o, "generated_text", full ? full : "", full ? fl : 0);
    free(full);
    if (g->details) {
        cJSON *d = cJSON_AddObjectToObject(o, "details");
        cJSON_AddStringToObject(d, "finish_reason", sched_finish_name(res->finish));
        cJSON_AddNumberToObject(d, "generated_tokens", res->n_toks);
        if (g->sp.greedy)
            cJSON_AddNullToObject(d, "seed");
        else
            json_add_u64(d, "seed", g->sp.seed);
        cJSON_AddArrayToObject(d, "prefill");
        cJSON *toks = cJSON_AddArrayToObject(d, "tokens");
        for (int i = 0; i < res->n_toks; i++) {
            const gen_token *t = &res->toks[i];
            cJSON *to = cJSON_CreateObject();
            if (!to)
                break;
            cJSON_AddItemToArray(toks, to);
            cJSON_AddNumberToObject(to, "id", t->id);
            json_add_text(to, "text", res->text + t->off, t->len);
            cJSON_AddNumberToObject(to, "logprob", t->logprob);
            cJSON_AddBoolToObject(to, "special", t->special);
        }
    }
    if (g->return_usage) {
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", res->n_toks);
        cJSON_AddNumberToObject(u, "cached_tokens", 0);
        cJSON *c = cJSON_AddObjectToObject(u, "cache");
        cJSON_AddNumberToObject(c, "attn_kv_bytes", (double)sr->kv_bytes);
        cJSON_AddNumberToObject(c, "recurrent_state_bytes", (double)sr->state_bytes);
        cJSON_AddNumberToObject(c, "peak_total_bytes", (double)sr->peak_cache_bytes);
    }
    (void)srv;
    return o;
}

static cJSON *oai_response(server *srv, http_req *hr, const gen_request *g, const gen_result *res, int n_prompt)
{
    bool chat = g->api == API_OAI_CHAT;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    char id[128];
    snprintf(id, sizeof(id), "%s-%s", chat ? "chatcmpl" : "cmpl", hr->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)time(NULL));
    cJSON_AddStringToObject(o, "model", g->model[0] ? g->model : srv->info->name);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        json_add_text(msg, "content", res->text ? res->text : "", res->len);
    } else {
        json_add_text(c, "text", res->text ? res->text : "", res->len);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", stream_oai_finish(res->finish));
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", res->n_toks);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + res->n_toks);
    return o;
}

/* Status for a scheduler error that arrived before anything was sent. */
static int sched_err_kind(int status)
{
    switch (status) {
    case SCHED_EFULL: case SCHED_ETIMEOUT: return ERR_OVERLOADED;
    case SCHED_EDRAINING: case SCHED_ECANCELLED: return ERR_DRAINING;
    case SCHED_EDELETED: return ERR_CANCELLED;
    case SCHED_ETOOBIG: return ERR_CONTEXT;
    case SCHED_EINVAL: return ERR_VALIDATION;
    case SCHED_EENGINE: return ERR_GENERATION;
    default: return ERR_INTERNAL;
    }
}

static int handle_generation(http_req *hr, int api, int mode)
{
    server *srv = hr->srv;
    const server_config *cfg = srv->cfg;
    gen_request g;
    gen_result res = {0};
    sched_req *r = NULL;
    int32_t *toks = NULL;
    size_t *content = NULL;     /* chat: byte ranges of the prompt that are message text */
    int n_content = 0;
    char err[512], param[64];
    int rc = 0;

    hr->generation = true;
    if (!check_ready(hr))
        return 0;
    int jrc = json_parse_gen(&g, api, hr->body, hr->n_body, cfg->max_stop, err, sizeof(err), param, sizeof(param));
    if (jrc != JSON_OK) {
        err_extra x = {.param = param};
        rc = send_error(hr, jrc == JSON_EPARSE ? ERR_BAD_JSON : jrc == JSON_ENOMEM ? ERR_INTERNAL : ERR_VALIDATION,
                        err, &x);
        json_gen_free(&g);
        return rc;
    }
    if (mode == GEN_STREAM)
        g.stream = true;
    if (mode == GEN_COMPAT && g.stream)
        mode = GEN_BODY;
    if (api == API_OAI_CHAT) {
        if (chat_render(srv->chat_kind, g.msgs, g.n_msgs, &g.prompt, &content, &n_content, err, sizeof(err))) {
            err_extra x = {.param = "messages"};
            rc = send_error(hr, ERR_TEMPLATE, err, &x);
            goto out;
        }
    }
    if (cfg->log_prompts && g.prompt) {
        cJSON *s = json_text(g.prompt, strlen(g.prompt));
        char *p = s ? cJSON_PrintUnformatted(s) : NULL;
        cJSON_Delete(s);
        if (p) {
            size_t n = strlen(p);
            if (n >= 2) {
                p[n - 1] = '\0';
                hr->log_prompt = strdup(p + 1);   /* JSON-escaped, without the quotes */
            }
            cJSON_free(p);
        }
    }

    int n_prompt;
    if (g.prompt_ids) {
        /* completions with token ids: the prompt as given, no BOS added */
        for (int i = 0; i < g.n_prompt_ids; i++) {
            if (g.prompt_ids[i] >= srv->info->n_vocab) {
                err_extra x = {.param = "prompt"};
                snprintf(err, sizeof(err), "`prompt`: token %d is not in the vocabulary (0..%d)",
                         (int)g.prompt_ids[i], srv->info->n_vocab - 1);
                rc = send_error(hr, ERR_VALIDATION, err, &x);
                goto out;
            }
        }
        toks = malloc((size_t)g.n_prompt_ids * sizeof(*toks));
        if (!toks) {
            rc = send_error(hr, ERR_INTERNAL, "out of memory", NULL);
            goto out;
        }
        memcpy(toks, g.prompt_ids, (size_t)g.n_prompt_ids * sizeof(*toks));
        n_prompt = g.n_prompt_ids;
    } else {
        n_prompt = tokenize(srv, g.prompt, content, n_content, &toks);
    }
    if (n_prompt < 0) {
        rc = send_error(hr, ERR_INTERNAL, "out of memory while tokenizing the prompt", NULL);   /* any text encodes */
        goto out;
    }
    if (g.truncate > 0 && n_prompt > g.truncate) {
        /* TGI keeps the end of the prompt */
        memmove(toks, toks + (n_prompt - g.truncate), (size_t)g.truncate * sizeof(int32_t));
        n_prompt = g.truncate;
    }
    hr->n_prompt = n_prompt;
    if (n_prompt == 0) {
        err_extra x = {.param = api == API_TGI ? "inputs" : api == API_OAI_CHAT ? "messages" : "prompt"};
        rc = send_error(hr, ERR_VALIDATION, "the prompt produced no tokens", &x);
        goto out;
    }
    int n_ctx = srv->info->n_ctx;
    int max_new = g.max_new_tokens;
    if (max_new < 0) {
        max_new = api == API_OAI_COMPLETION ? 16 : cfg->default_max_tokens;
        if (max_new > n_ctx - n_prompt)
            max_new = n_ctx - n_prompt;
    }
    if (max_new < 1 || (long)n_prompt + (long)max_new > (long)n_ctx) {
        err_extra x = {.param = api == API_TGI ? "max_new_tokens" : "max_tokens", .n_prompt = n_prompt,
                       .max_total = n_ctx};
        if (g.max_new_tokens < 0)
            snprintf(err, sizeof(err), "the prompt has %d tokens, which leaves no room to generate within the "
                                       "context limit of %d tokens; shorten the prompt", n_prompt, n_ctx);
        else
            snprintf(err, sizeof(err), "prompt tokens + %s must be <= %d. Given: %d prompt tokens and %d %s",
                     x.param, n_ctx, n_prompt, max_new, x.param);
        rc = send_error(hr, ERR_CONTEXT, err, &x);
        goto out;
    }
    for (int i = 0; i < g.n_bias; i++) {
        if (g.bias[i].id >= srv->info->n_vocab) {
            err_extra x = {.param = "logit_bias"};
            snprintf(err, sizeof(err), "`logit_bias`: token %d is not in the vocabulary (0..%d)", (int)g.bias[i].id,
                     srv->info->n_vocab - 1);
            rc = send_error(hr, ERR_VALIDATION, err, &x);
            goto out;
        }
    }
    if (!g.sp.greedy && !g.seed_given)
        g.sp.seed = random_seed();

    sched_req_params rp = {
        .id = hr->id,
        .owner = hr->key_id,
        .prompt = toks,
        .n_prompt = n_prompt,
        .max_new_tokens = max_new,
        .sampling = g.sp,
        .stop = (const char *const *)g.stop,
        .n_stop = g.n_stop,
        .include_stop = api == API_TGI,
        .ignore_eos = g.ignore_eos,
    };
    http_inflight_begin(hr);
    int src = sched_submit(srv->sched, &rp, &r, err, sizeof(err));
    if (src != 0) {
        rc = send_error(hr, sched_err_kind(src), err, NULL);
        goto out;
    }

    /* wait for admission: until then every failure has a real status */
    for (;;) {
        sched_event ev;
        int erc = stream_next_event(hr, r, &ev, 1000);
        if (erc < 0) {
            rc = -1;
            hr->failure = "cancelled";
            goto out;
        }
        if (erc == 0)
            continue;
        if (ev.kind == SCHED_EV_ADMITTED)
            break;
        if (ev.kind == SCHED_EV_ERROR) {
            err_extra x = {.param = api == API_TGI ? "max_new_tokens" : "max_tokens", .n_prompt = n_prompt,
                           .max_total = ev.error == SCHED_ETOOBIG ? n_ctx : 0};
            rc = send_error(hr, sched_err_kind(ev.error), ev.message, &x);
            goto out;
        }
        sched_event_clear(&ev);
    }

    if (g.stream) {
        rc = stream_start(hr, r, &g, n_prompt);
        r = NULL;       /* the stream owns it now */
        goto out;
    }

    if (stream_collect(hr, r, &res) < 0) {
        rc = -1;
        hr->failure = "cancelled";
        goto out;
    }
    sched_result sr;
    sched_req_result(r, &sr);
    hr->n_gen = sr.n_generated;
    hr->queue_ms = sr.queue_ms;
    hr->ttft_ms = sr.ttft_ms;
    hr->cache_bytes = sr.peak_cache_bytes;
    if (res.error) {
        rc = send_error(hr, res.error == SCHED_ECANCELLED  ? ERR_DRAINING
                           : res.error == SCHED_EDELETED ? ERR_CANCELLED
                                                         : ERR_GENERATION,
                        res.message, NULL);
        goto out;
    }
    hr->finish = sched_finish_name(res.finish);
    cJSON *body;
    if (api == API_TGI) {
        body = tgi_response(srv, &g, &res, &sr, n_prompt);
        if (body && mode == GEN_COMPAT) {
            cJSON *arr = cJSON_CreateArray();
            if (arr)
                cJSON_AddItemToArray(arr, body);
            else
                cJSON_Delete(body);
            body = arr;
        }
    } else {
        body = oai_response(srv, hr, &g, &res, n_prompt);
    }
    char h_prompt[24], h_gen[24], h_queue[32], h_inf[32], h_tpt[32], h_total[32], h_cache[32];
    double total_ms = sr.total_ms, inf_ms = total_ms - sr.queue_ms;
    snprintf(h_prompt, sizeof(h_prompt), "%d", n_prompt);
    snprintf(h_gen, sizeof(h_gen), "%d", sr.n_generated);
    snprintf(h_queue, sizeof(h_queue), "%.0f", sr.queue_ms);
    snprintf(h_inf, sizeof(h_inf), "%.0f", inf_ms);
    snprintf(h_tpt, sizeof(h_tpt), "%.0f", sr.n_generated > 0 ? inf_ms / sr.n_generated : 0.0);
    snprintf(h_total, sizeof(h_total), "%.0f", total_ms);
    snprintf(h_cache, sizeof(h_cache), "%llu", (unsigned long long)sr.peak_cache_bytes);
    const char *hdrs[] = {"x-prompt-tokens", h_prompt, "x-generated-tokens", h_gen, "x-queue-time", h_queue,
                          "x-inference-time", h_inf, "x-time-per-token", h_tpt, "x-total-time", h_total,
                          "x-cached-tokens", "0", "x-cache-bytes", h_cache, NULL};
    rc = http_send_json(hr, 200, body, hdrs);
out:
    gen_result_free(&res);
    sched_req_release(r);
    free(toks);
    free(content);
    json_gen_free(&g);
    return rc;
}

static int h_generate(http_req *hr) { return handle_generation(hr, API_TGI, GEN_BODY); }
static int h_generate_stream(http_req *hr) { return handle_generation(hr, API_TGI, GEN_STREAM); }
static int h_compat(http_req *hr) { return handle_generation(hr, API_TGI, GEN_COMPAT); }
static int h_completions(http_req *hr) { return handle_generation(hr, API_OAI_COMPLETION, GEN_BODY); }
static int h_chat(http_req *hr) { return handle_generation(hr, API_OAI_CHAT, GEN_BODY); }

/* ---------------------------------------------------------------------- */
/* Other routes                                                           */
/* ---------------------------------------------------------------------- */

static int h_health(http_req *hr)
{
    /* constant time: no lock, no engine */
    bool failed = atomic_load(&hr->srv->state) == SERVER_FAILED;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", failed ? "failed" : "ok");
    return http_send_json(hr, failed ? 503 : 200, o, NULL);
}

static int h_ready(http_req *hr)
{
    int st = atomic_load(&hr->srv->state);
    static const char *const names[] = {"loading", "ready", "draining", "failed"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", names[st >= 0 && st <= 3 ? st : 3]);
    if (st == SERVER_READY)
        return http_send_json(hr, 200, o, NULL);
    const char *hdrs[] = {"Retry-After", "5", NULL};
    return http_send_json(hr, 503, o, st == SERVER_FAILED ? NULL : hdrs);
}

/* /info "container": the limits seen at start and the defaults they gave
 * (serve.c apply_limits). A missing limit is null. */
static void info_add_container(cJSON *o, const server *srv)
{
    const server_limits *lim = &srv->limits;
    cJSON *k = cJSON_AddObjectToObject(o, "container");
    if (!k)
        return;
    if (lim->cg.version)
        cJSON_AddNumberToObject(k, "cgroup_version", lim->cg.version);
    else
        cJSON_AddNullToObject(k, "cgroup_version");
    if (lim->cg.cpus > 0)
        cJSON_AddNumberToObject(k, "cpu_limit", lim->cg.cpus);
    else
        cJSON_AddNullToObject(k, "cpu_limit");
    if (lim->cg.memory_bytes)
        cJSON_AddNumberToObject(k, "memory_limit_bytes", (double)lim->cg.memory_bytes);
    else
        cJSON_AddNullToObject(k, "memory_limit_bytes");
    cJSON_AddNumberToObject(k, "threads", engine_threads());
    cJSON_AddStringToObject(k, "threads_from", lim->threads_from ? lim->threads_from : "");
    cJSON_AddNumberToObject(k, "cache_budget_bytes", (double)srv->info->cache_budget_bytes);
    cJSON_AddStringToObject(k, "cache_budget_from", lim->cache_from ? lim->cache_from : "");
    if (lim->cache_fit_bytes) {
        cJSON_AddNumberToObject(k, "cache_fit_bytes", (double)lim->cache_fit_bytes);
        cJSON_AddNumberToObject(k, "headroom_bytes", (double)lim->headroom_bytes);
    } else {
        cJSON_AddNullToObject(k, "cache_fit_bytes");
        cJSON_AddNullToObject(k, "headroom_bytes");
    }
    cJSON_AddNumberToObject(k, "model_file_bytes", (double)lim->model_file_bytes);
    cJSON_AddStringToObject(k, "kernels", engine_kernels_name());
}

static int h_info(http_req *hr)
{
    if (!check_ready(hr))
        return 0;
    server *srv = hr->srv;
    const engine_info *in = srv->info;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_id", in->name);
    cJSON_AddNullToObject(o, "model_sha");
    cJSON_AddStringToObject(o, "model_dtype", in->weights_dtype);
    cJSON_AddStringToObject(o, "model_pipeline_tag", "text-generation");
    cJSON_AddNumberToObject(o, "max_concurrent_requests", in->max_seqs + srv->cfg->max_queue);
    cJSON_AddNumberToObject(o, "max_best_of", 1);
    cJSON_AddNumberToObject(o, "max_stop_sequences", srv->cfg->max_stop);
    cJSON_AddNumberToObject(o, "max_input_tokens", in->n_ctx - 1);
    cJSON_AddNumberToObject(o, "max_total_tokens", in->n_ctx);
    cJSON_AddNumberToObject(o, "validation_workers", 0);
    cJSON_AddNumberToObject(o, "max_client_batch_size", 1);
    cJSON_AddStringToObject(o, "router", "hyserve");
    cJSON_AddStringToObject(o, "version", HYSERVE_VERSION);
    cJSON_AddNullToObject(o, "sha");
    cJSON_AddNullToObject(o, "docker_label");
    cJSON *m = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(m, "arch", in->arch);
    cJSON_AddStringToObject(m, "name", in->name);
    cJSON_AddNumberToObject(m, "n_params", (double)in->n_params);
    cJSON_AddNumberToObject(m, "weight_bytes", (double)in->weight_bytes);
    cJSON_AddNumberToObject(m, "n_vocab", in->n_vocab);
    cJSON_AddNumberToObject(m, "n_embd", in->n_embd);
    cJSON_AddNumberToObject(m, "n_layer", in->n_layer);
    cJSON_AddNumberToObject(m, "n_attn_layers", in->n_attn_layers);
    cJSON_AddNumberToObject(m, "n_dnet_layers", in->n_dnet_layers);
    cJSON_AddNumberToObject(m, "n_ctx_train", in->n_ctx_train);
    cJSON_AddStringToObject(m, "chat_template", chat_kind_name(srv->chat_kind));
    cJSON *c = cJSON_AddObjectToObject(o, "cache_layout");
    cJSON_AddStringToObject(c, "kind", in->n_dnet_layers > 0 && in->n_attn_layers > 0 ? "hybrid"
                                       : in->n_dnet_layers > 0                         ? "recurrent"
                                                                                       : "attention");
    cJSON_AddNumberToObject(c, "page_tokens", in->page_tokens);
    cJSON_AddNumberToObject(c, "kv_bytes_per_token", (double)in->kv_bytes_per_token);
    cJSON_AddNumberToObject(c, "dnet_state_bytes_per_seq", (double)in->dnet_state_bytes_per_seq);
    cJSON_AddNumberToObject(c, "dnet_conv_bytes_per_seq", (double)in->dnet_conv_bytes_per_seq);
    cJSON_AddNumberToObject(c, "mha_bytes_per_token", (double)in->mha_bytes_per_token);
    cJSON_AddNumberToObject(c, "budget_bytes", (double)in->cache_budget_bytes);
    cJSON_AddNumberToObject(c, "max_seqs", in->max_seqs);
    cJSON_AddStringToObject(o, "replica", srv->replica);
    info_add_container(o, srv);
    return http_send_json(hr, 200, o, NULL);
}

static int h_models(http_req *hr)
{
    if (!check_ready(hr))
        return 0;
    const engine_info *in = hr->srv->info;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", in->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)hr->srv->started_at);
    cJSON_AddStringToObject(m, "owned_by", "hyserve");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_vocab", in->n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", in->n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_ctx", in->n_ctx);
    cJSON_AddNumberToObject(meta, "n_params", (double)in->n_params);
    cJSON_AddNumberToObject(meta, "size", (double)in->weight_bytes);
    return http_send_json(hr, 200, o, NULL);
}

static int h_tokenize(http_req *hr)
{
    if (!check_ready(hr))
        return 0;
    server *srv = hr->srv;
    char err[256], *inputs = NULL;
    int32_t *toks = NULL;
    int jrc = json_parse_tokenize(hr->body, hr->n_body, &inputs, err, sizeof(err));
    if (jrc != JSON_OK)
        return routes_error(hr, jrc == JSON_EPARSE ? ERR_BAD_JSON : ERR_VALIDATION, err);
    int n = tokenize(srv, inputs, NULL, 0, &toks);
    free(inputs);
    if (n < 0)
        return routes_error(hr, ERR_INTERNAL, "out of memory while tokenizing the input");   /* any text encodes */
    /* the answer costs about 80 bytes a token: bound it by what a request
     * can hold (a 2 MB body of CJK text is over a million tokens) */
    if (n > srv->info->n_ctx) {
        free(toks);
        malloc_trim(0);
        snprintf(err, sizeof err, "the input is %d tokens, more than the %d a request can hold "
                                  "(max_input_tokens); /tokenize answers up to that many", n, srv->info->n_ctx);
        return routes_error(hr, ERR_CONTEXT, err);
    }
    cJSON *arr = cJSON_CreateArray();
    size_t off = 0;
    char piece[512];
    for (int i = 0; arr && i < n; i++) {
        int pl = engine_token_piece(srv->eng, toks[i], piece, sizeof(piece));
        if (pl < 0)
            pl = 0;
        if ((size_t)pl > sizeof(piece))
            pl = (int)sizeof(piece);
        bool added_bos = i == 0 && srv->info->add_bos && toks[0] == srv->info->bos_id;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, t);
        cJSON_AddNumberToObject(t, "id", toks[i]);
        json_add_text(t, "text", piece, (size_t)pl);
        cJSON_AddNumberToObject(t, "start", (double)off);
        if (!added_bos)
            off += (size_t)pl;
        cJSON_AddNumberToObject(t, "stop", (double)off);
    }
    free(toks);
    int rc = http_send_json(hr, 200, arr, NULL);
    /* many small nodes were freed: hand the pages back to the system */
    if (n > 4096)
        malloc_trim(0);
    return rc;
}

/* POST /v1/memory/estimate: the planner (memplan.c) over HTTP, no weights.
 * Body: {"preset": NAME} or {"layout": {...preset format...}} or neither
 * (the loaded model's layout), plus optional "context", "batch",
 * "kv_dtype", "state_dtype" (recurrent state: f32 or bf16; conv windows stay
 * f32), "page_tokens", "budget" (bytes, or a string like "24G"). */
static int h_memory_estimate(http_req *hr)
{
    server *srv = hr->srv;
    char err[512];
    const char *end = NULL;
    cJSON *j = hr->n_body ? cJSON_ParseWithLengthOpts(hr->body, hr->n_body, &end, 0) : cJSON_CreateObject();
    if (!j)
        return routes_error(hr, ERR_BAD_JSON, "the body is not valid JSON");
    memplan_layout l;
    int rc = 0;
    const cJSON *preset = cJSON_GetObjectItemCaseSensitive(j, "preset");
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(j, "layout");
    if (!cJSON_IsObject(j)) {
        snprintf(err, sizeof(err), "the body must be a JSON object");
        rc = -1;
    } else if (preset && layout) {
        snprintf(err, sizeof(err), "give either \"preset\" or \"layout\", not both");
        rc = -1;
    } else if (preset) {
        if (!cJSON_IsString(preset) || strchr(preset->valuestring, '/') || strchr(preset->valuestring, '.')) {
            snprintf(err, sizeof(err), "\"preset\" must be a preset name (known: %s)", preset_names());
            rc = -1;
        } else {
            rc = preset_load(preset->valuestring, &l, err, sizeof(err));
        }
    } else if (layout) {
        char e2[256];
        rc = preset_from_json(layout, &l, e2, sizeof(e2));
        if (rc)
            snprintf(err, sizeof(err), "layout: %s", e2);
    } else if (atomic_load(&srv->state) == SERVER_READY || atomic_load(&srv->state) == SERVER_DRAINING) {
        engine_get_memplan(srv->eng, &l);
        snprintf(l.name, sizeof(l.name), "%s", srv->info->name);
    } else {
        snprintf(err, sizeof(err), "the model is not loaded yet: name a \"preset\" or give a \"layout\"");
        rc = -1;
    }
    double context = preset || layout ? (l.max_context > 0 && l.max_context < 4096 ? l.max_context : 4096)
                                      : (rc == 0 ? srv->info->n_ctx : 0);
    double batch = 1;
    uint64_t budget = 0;
    const cJSON *v;
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(j, "context"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e9 || v->valuedouble != (double)(long long)v->valuedouble) {
            snprintf(err, sizeof(err), "\"context\" must be an integer from 1 to 1e9");
            rc = -1;
        } else {
            context = v->valuedouble;
        }
    }
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(j, "batch"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e6 || v->valuedouble != (double)(long long)v->valuedouble) {
            snprintf(err, sizeof(err), "\"batch\" must be an integer from 1 to 1e6");
            rc = -1;
        } else {
            batch = v->valuedouble;
        }
    }
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(j, "kv_dtype"))) {
        if (!cJSON_IsString(v) || !kv_dtype_bytes(v->valuestring)) {
            snprintf(err, sizeof(err), "\"kv_dtype\" must be \"f32\", \"f16\" or \"bf16\"");
            rc = -1;
        } else {
            l.kv_bytes = kv_dtype_bytes(v->valuestring);
        }
    }
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(j, "state_dtype"))) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "f32") && strcmp(v->valuestring, "bf16"))) {
            snprintf(err, sizeof(err), "\"state_dtype\" must be \"f32\" or \"bf16\"");
            rc = -1;
        } else {
            memplan_set_state_dtype(&l, !strcmp(v->valuestring, "bf16") ? 2 : 4);
        }
    }
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(j, "page_tokens"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 4096) {
            snprintf(err, sizeof(err), "\"page_tokens\" must be an integer from 1 to 4096");
            rc = -1;
        } else {
            l.page_tokens = v->valueint;
        }
    }
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(j, "budget"))) {
        if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e18)
            budget = (uint64_t)v->valuedouble;
        else if (!cJSON_IsString(v) || config_parse_bytes(v->valuestring, &budget)) {
            snprintf(err, sizeof(err), "\"budget\" must be a byte count or a size like \"24G\"");
            rc = -1;
        }
    }
    cJSON_Delete(j);
    if (rc)
        return routes_error(hr, ERR_VALIDATION, err);
    return http_send_json(hr, 200, memplan_estimate_json(&l, (int64_t)context, (int64_t)batch, budget), NULL);
}

/* GET /v1/memory/presets: the names POST /v1/memory/estimate takes as
 * "preset" (config/presets/, or $HYSERVE_PRESETS), for the dashboard's
 * planner. */
static int h_memory_presets(http_req *hr)
{
    char names[64][PRESET_NAME_MAX];
    int n = preset_list(names, 64);
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "presets");
    for (int i = 0; arr && i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateString(names[i]));
    return http_send_json(hr, 200, o, NULL);
}

static int h_stats(http_req *hr)
{
    /* still useful while draining: watch the in-flight work finish */
    if (atomic_load(&hr->srv->state) != SERVER_DRAINING && !check_ready(hr))
        return 0;
    const char *rid = http_query(hr, "request_id");
    const char *reqs = http_query(hr, "requests");
    bool with = !(reqs && !strcmp(reqs, "0"));
    return http_send_json(hr, 200, metrics_stats_json(hr->srv, rid, with), NULL);
}

static int h_metrics(http_req *hr)
{
    char *txt = metrics_prometheus(hr->srv);
    if (!txt)
        return routes_error(hr, ERR_INTERNAL, "out of memory");
    int rc = http_send(hr, 200, "text/plain; version=0.0.4; charset=utf-8", txt, strlen(txt), NULL);
    free(txt);
    return rc;
}

/* DELETE /requests/{id}: cancel a request by its X-Request-Id, for
 * clients that cannot close their socket. Its own client gets the
 * cancellation (an error event on a stream). */
static int h_cancel(http_req *hr)
{
    if (atomic_load(&hr->srv->state) != SERVER_DRAINING && !check_ready(hr))
        return 0;
    const char *id = hr->path + strlen("/requests/");
    char msg[200];
    /* only the key that made a request may cancel it: another key's
     * request is as unknown to it as a finished one */
    if (!*id || sched_cancel_id(hr->srv->sched, id, hr->key_id, "request cancelled by DELETE /requests/{id}") != 0) {
        snprintf(msg, sizeof(msg), "no queued or running request has the id '%.100s'", id);
        return routes_error(hr, ERR_NOT_FOUND, msg);
    }
    return http_send(hr, 204, NULL, "", 0, NULL);
}

/* GET / and GET /web/NAME: the dashboard, embedded at build time (web.h).
 * Static files that hold no data, so they are served without a key and
 * before the model is loaded; the page asks the API for everything it
 * shows. The policy allows only this origin's scripts, styles and API
 * calls: the page has no inline script or style to allow. */
static int h_web(http_req *hr)
{
    const web_asset *a = web_find(hr->path);
    if (!a) {
        char msg[320];
        snprintf(msg, sizeof(msg), "no dashboard file %s", hr->path);
        return routes_error(hr, ERR_NOT_FOUND, msg);
    }
    static const char *const hdrs[] = {
        "Cache-Control", "no-store",
        "Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "
                                   "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                                   "form-action 'none'; frame-ancestors 'none'",
        "X-Content-Type-Options", "nosniff",
        "Referrer-Policy", "no-referrer",
        NULL,
    };
    return http_send(hr, 200, a->content_type, (const char *)a->data, a->len, hdrs);
}

/* ---------------------------------------------------------------------- */
/* The table                                                              */
/* ---------------------------------------------------------------------- */

typedef struct route {
    const char *method;
    const char *path;           /* exact, or a prefix when it ends with '/' and is not "/" */
    int (*fn)(http_req *hr);
} route;

static const route ROUTES[] = {
    {"POST", "/generate", h_generate},
    {"POST", "/generate_stream", h_generate_stream},
    {"POST", "/", h_compat},
    {"GET", "/", h_web},
    {"GET", "/web/", h_web},
    {"POST", "/v1/completions", h_completions},
    {"POST", "/v1/chat/completions", h_chat},
    {"GET", "/v1/models", h_models},
    {"POST", "/tokenize", h_tokenize},
    {"GET", "/health", h_health},
    {"GET", "/live", h_health},
    {"GET", "/ready", h_ready},
    {"GET", "/info", h_info},
    {"GET", "/stats", h_stats},
    {"POST", "/v1/memory/estimate", h_memory_estimate},
    {"GET", "/v1/memory/presets", h_memory_presets},
    {"GET", "/metrics", h_metrics},
    {"DELETE", "/requests/", h_cancel},
};

static bool route_matches(const route *r, const char *path)
{
    size_t n = strlen(r->path);
    if (n > 1 && r->path[n - 1] == '/')
        return !strncmp(r->path, path, n);
    return !strcmp(r->path, path);
}
#define N_ROUTES ((int)(sizeof(ROUTES) / sizeof(ROUTES[0])))

/* 401 for a request without a valid key. The same body whatever was wrong
 * (absent, malformed, unknown), in OpenAI's shape on every route, so the
 * answer tells an attacker nothing and an OpenAI client raises its
 * AuthenticationError. */
static int send_unauthorized(http_req *hr)
{
    static const char body[] = "{\"error\":{\"message\":\"a valid API key is required: send the header "
                               "'Authorization: Bearer KEY'\",\"type\":\"invalid_request_error\","
                               "\"param\":null,\"code\":\"invalid_api_key\"}}";
    static const char *const hdrs[] = {"WWW-Authenticate", "Bearer", NULL};
    return http_send(hr, 401, "application/json", body, sizeof(body) - 1, hdrs);
}

int routes_dispatch(http_req *hr)
{
    const auth_keys *keys = &hr->srv->keys;
    if (keys->n && !auth_open_path(hr->method, hr->path, hr->srv->cfg->metrics_public)) {
        hr->key_id = auth_check(keys, http_header(hr, "Authorization"));
        if (!hr->key_id)
            return send_unauthorized(hr);
    }
    const char *method = !strcmp(hr->method, "HEAD") ? "GET" : hr->method;
    char allow[64] = "";
    bool path_known = false;
    for (int i = 0; i < N_ROUTES; i++) {
        if (!route_matches(&ROUTES[i], hr->path))
            continue;
        path_known = true;
        if (strcmp(ROUTES[i].method, method)) {
            size_t l = strlen(allow);
            snprintf(allow + l, sizeof(allow) - l, "%s%s", l ? ", " : "", ROUTES[i].method);
            continue;
        }
        if (hr->body_too_large) {
            char msg[160];
            snprintf(msg, sizeof(msg), "request body is larger than the limit of %llu bytes (--max-body)",
                     (unsigned long long)hr->srv->cfg->max_body);
            return routes_error(hr, ERR_TOO_LARGE, msg);
        }
        return ROUTES[i].fn(hr);
    }
    char msg[400];
    if (path_known) {
        snprintf(msg, sizeof(msg), "method %s is not allowed on %s (allowed: %s)", hr->method, hr->path, allow);
        err_extra x = {.allow = allow};
        return send_error(hr, ERR_METHOD, msg, &x);
    }
    snprintf(msg, sizeof(msg), "no route %s %s; see GET /info and the README for the API", hr->method, hr->path);
    return routes_error(hr, ERR_NOT_FOUND, msg);
}

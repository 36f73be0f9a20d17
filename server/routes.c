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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "fault.h"
#include "chat.h"
#include "json.h"
#include "memest.h"
#include "config.h"
#include "cors.h"
#include "metrics.h"
#include "presets.h"
#include "routes.h"
#include "serve.h"
#include "stream.h"
#include "web.h"


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
    {ERR_HEAD_TOO_LARGE, 431, "headers_too_large", "invalid_request_error"},
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
    {ERR_MODEL, 404, "not_found", "invalid_request_error"},
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
        const char *code = kind == ERR_CONTEXT ? "context_length_exceeded" : kind == ERR_MODEL ? "model_not_found" : NULL;
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
        case ERR_HEAD_TOO_LARGE:
            hr->failure = "validation";
            break;
        case ERR_OVERLOADED: hr->failure = "overloaded"; break;
        case ERR_CANCELLED: hr->failure = "cancelled"; break;
        case ERR_LOADING: case ERR_DRAINING: hr->failure = "unavailable"; break;
        case ERR_NOT_FOUND: case ERR_METHOD: case ERR_MODEL: hr->failure = "not_found"; break;
        case ERR_GENERATION: hr->failure = "generation"; break;
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

/* The error kind of a json_parse_* status: not JSON 400, out of memory
 * 500, anything else the request's fields (422). */
static int parse_error_kind(int jrc)
{
    return jrc == JSON_EPARSE ? ERR_BAD_JSON : jrc == JSON_ENOMEM ? ERR_INTERNAL : ERR_VALIDATION;
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
        int32_t *buf = fault_malloc((size_t)cap * sizeof(int32_t));
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

/* Snapshot hints for the prefix cache (issue 26): the token positions of
 * a rendered chat's message boundaries, where a hybrid model's DeltaNet
 * state is worth keeping because the next request is likely to share the
 * prompt up to there: the end of the leading system turn(s) (every request
 * with that system prompt hits from the second on) and the starts of the
 * last few turns before the generation prompt (a history's edited or
 * regenerated end). Each turn opens with the template's marker, a control
 * token that only markup produces (data spans never parse control tokens),
 * so the k-th marker in the text is the k-th marker token in toks; when the
 * counts differ (a model without that control token) there are no hints.
 * Fills hints[0..SCHED_MAX_SNAP_HINTS) ascending; returns the count. */
static int chat_snap_hints(server *srv, const char *text, const size_t *data, int n_data, const int32_t *toks,
                           int n_toks, int *hints)
{
    const char *mark = chat_turn_marker(srv->chat_kind);
    int32_t id[2];
    size_t *at = NULL;
    bool *sys = NULL;
    int n_hints = 0;
    if (!mark || engine_tokenize(srv->eng, mark, strlen(mark), false, true, id, 2) != 1)
        return 0;
    const int n_turns = chat_turns(srv->chat_kind, text, data, n_data, &at, &sys);
    int *pos = n_turns > 0 ? fault_malloc((size_t)n_turns * sizeof *pos) : NULL;
    int n_pos = 0;
    for (int i = 0; pos && i < n_toks; i++)
        if (toks[i] == id[0] && n_pos++ < n_turns)
            pos[n_pos - 1] = i;
    if (!pos || n_pos != n_turns)
        goto out;
    /* turns [0, n_turns - 1) are messages, the last the generation prompt */
    int first_user = 0;
    while (first_user < n_turns - 1 && sys[first_user])
        first_user++;
    if (first_user > 0 && first_user < n_turns - 1)
        hints[n_hints++] = pos[first_user];
    int from = n_turns - 1 - (SCHED_MAX_SNAP_HINTS - n_hints);
    for (int t = from > first_user ? from : first_user + 1; t < n_turns - 1; t++)
        hints[n_hints++] = pos[t];
out:
    free(pos);
    free(at);
    free(sys);
    return n_hints;
}

/* Is name one of the names this server serves (--served-model-name)? */
static bool served_name(const server *srv, const char *name)
{
    for (int i = 0; i < srv->n_model_names; i++)
        if (!strcmp(srv->model_names[i], name))
            return true;
    return false;
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

/* TGI details.prefill: every prompt token {id, text, logprob}, the first
 * with a null logprob (nothing predicts it); [] unless
 * decoder_input_details. */
static void tgi_prefill(server *srv, cJSON *d, const gen_request *g, const gen_result *res, const int32_t *toks,
                        int n_prompt)
{
    cJSON *pre = cJSON_AddArrayToObject(d, "prefill");
    if (!pre || !g->prompt_logprobs)
        return;
    for (int i = 0; i < n_prompt; i++) {
        float lp = i > 0 && i - 1 < res->prompt_lp.n ? res->prompt_lp.v[i - 1].logprob : NAN;
        cJSON *t = lp_tgi_token(srv->eng, toks[i], lp, false);
        if (!t)
            return;
        cJSON_DeleteItemFromObjectCaseSensitive(t, "special");   /* TGI's PrefillToken has none */
        json_push(pre, t);
    }
}

static cJSON *tgi_response(server *srv, const gen_request *g, const gen_result *res, const sched_result *sr,
                           const int32_t *toks, int n_prompt)
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
        cJSON_AddNumberToObject(d, "cached_tokens", sr->cached_tokens);     /* hyserve: prefix cache */
        cJSON_AddStringToObject(d, "prefix_cache", prefix_reason_name(sr->prefix_reason));
        if (g->sp.greedy)
            cJSON_AddNullToObject(d, "seed");
        else
            json_add_u64(d, "seed", g->sp.seed);
        tgi_prefill(srv, d, g, res, toks, n_prompt);
        cJSON *gtoks = cJSON_AddArrayToObject(d, "tokens");
        for (int i = 0; i < res->n_toks; i++) {
            const gen_token *t = &res->toks[i];
            cJSON *to = cJSON_CreateObject();
            if (!to)
                break;
            json_push(gtoks, to);
            cJSON_AddNumberToObject(to, "id", t->id);
            json_add_text(to, "text", res->text + t->off, t->len);
            cJSON_AddNumberToObject(to, "logprob", t->logprob);
            cJSON_AddBoolToObject(to, "special", t->special);
        }
        if (g->top_logprobs > 0) {
            cJSON *tt = cJSON_AddArrayToObject(d, "top_tokens");
            for (int i = 0; tt && i < res->lp.n; i++)
                json_push(tt, lp_tgi_top(srv->eng, &res->lp.v[i].top));
        }
    }
    if (g->return_usage) {
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", res->n_toks);
        cJSON_AddNumberToObject(u, "cached_tokens", sr->cached_tokens);
        cJSON *c = cJSON_AddObjectToObject(u, "cache");
        cJSON_AddNumberToObject(c, "attn_kv_bytes", (double)sr->kv_bytes);
        cJSON_AddNumberToObject(c, "recurrent_state_bytes", (double)sr->state_bytes);
        cJSON_AddNumberToObject(c, "peak_total_bytes", (double)sr->peak_cache_bytes);
    }
    return o;
}

/* Completions: the echoed prompt's text (the prompt string, or the token
 * ids' text) and, with prompt logprobs, its tokens first in lp (the
 * first with a null logprob). Returns 0 or -1. */
static int oai_echo(server *srv, const gen_request *g, const gen_result *res, const int32_t *toks, int n_prompt,
                    char **text, size_t *len, size_t *cap, lp_list *lp)
{
    if (g->prompt) {
        if (json_buf_append(text, len, cap, g->prompt, strlen(g->prompt)))
            return -1;
    } else {
        for (int i = 0; i < n_prompt; i++) {
            char b[256];
            int n = engine_token_piece(srv->eng, toks[i], b, sizeof(b));
            if (n > 0 && json_buf_append(text, len, cap, b, (size_t)n < sizeof(b) ? (size_t)n : sizeof(b)))
                return -1;
        }
    }
    if (!g->prompt_logprobs)
        return 0;
    for (int i = 0; i < n_prompt; i++) {
        const lp_token *p = i > 0 && i - 1 < res->prompt_lp.n ? &res->prompt_lp.v[i - 1] : NULL;
        if (lp_list_push(lp, toks[i], p ? p->logprob : NAN, false, p ? &p->top : NULL))
            return -1;
    }
    return 0;
}

/* choices[0].logprobs of a whole answer: chat's content list, or
 * completions' parallel arrays over the echoed prompt and the generated
 * tokens (end-of-generation tokens left out, as from the text). */
static cJSON *oai_logprobs(server *srv, const gen_request *g, const gen_result *res, lp_list *lp)
{
    if (g->api == API_OAI_CHAT)
        return lp_oai_chat(srv->eng, res->lp.v, res->lp.n);
    for (int i = 0; i < res->lp.n; i++)
        if (!res->lp.v[i].special && lp_list_push(lp, res->lp.v[i].id, res->lp.v[i].logprob, false,
                                                  &res->lp.v[i].top))
            return NULL;
    return lp_oai_completion(srv->eng, lp->v, lp->n, g->top_logprobs > 0, 0, NULL);
}

static cJSON *oai_response(server *srv, http_req *hr, const gen_request *g, const gen_result *res,
                           const int32_t *toks, int n_prompt, int cached_tokens)
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
    cJSON_AddStringToObject(o, "model", g->model[0] ? g->model : server_model_name(srv));
    cJSON_AddStringToObject(o, "system_fingerprint", srv->fingerprint);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    json_push(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    const char *finish = stream_oai_finish(res->finish);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        /* tool calls the model wrote (forced by the grammar for required
         * and named choices) leave the content; the markup never shows */
        cJSON *calls = NULL;
        const char *text = res->text ? res->text : "";
        size_t len = res->text ? res->len : 0, clen, r_off, r_len, c_off;
        /* Qwen3-style <think>...</think> goes to reasoning_content */
        if (chat_split_reasoning(text, len, &r_off, &r_len, &c_off, &clen)) {
            json_add_text(msg, "reasoning_content", text + r_off, r_len);
            text += c_off;
            len = clen;
        }
        clen = len;
        if (g->tools && g->tool_choice != TOOL_CHOICE_NONE &&
            chat_parse_tool_calls(srv->chat_kind, text, len, hr->id, &clen, &calls) > 0) {
            if (clen)
                json_add_text(msg, "content", text, clen);
            else
                cJSON_AddNullToObject(msg, "content");
            json_put(msg, "tool_calls", calls);
            finish = "tool_calls";
        } else {
            json_add_text(msg, "content", text, len);
        }
    }
    lp_list lp = {0};
    if (!chat) {
        char *text = NULL;
        size_t tl = 0, tc = 0;
        if (g->echo && oai_echo(srv, g, res, toks, n_prompt, &text, &tl, &tc, &lp))
            goto out_nomem;
        if (json_buf_append(&text, &tl, &tc, res->text ? res->text : "", res->len))
            goto out_nomem;
        json_add_text(c, "text", text, tl);
        free(text);
    }
    if (g->logprobs)
        json_put(c, "logprobs", oai_logprobs(srv, g, res, &lp));
    else
        cJSON_AddNullToObject(c, "logprobs");
    lp_list_free(&lp);
    cJSON_AddStringToObject(c, "finish_reason", finish);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", res->n_toks);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + res->n_toks);
    json_add_cached_tokens(u, cached_tokens);
    return o;
out_nomem:
    lp_list_free(&lp);
    cJSON_Delete(o);
    return NULL;
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

/* Wait for r's admission: until then every failure has a real status.
 * Returns 0 once admitted, else -1 with *rc the answer's (an error sent,
 * or -1 when the client went away). */
static int wait_admitted(http_req *hr, sched_req *r, int api, int n_prompt, int *rc)
{
    for (;;) {
        sched_event ev;
        int erc = stream_next_event(hr, r, &ev, 1000);
        if (erc < 0) {
            *rc = -1;
            hr->failure = "cancelled";
            return -1;
        }
        if (erc == 0)
            continue;
        if (ev.kind == SCHED_EV_ADMITTED)
            return 0;
        if (ev.kind == SCHED_EV_ERROR) {
            err_extra x = {.param = api == API_TGI ? "max_new_tokens" : "max_tokens", .n_prompt = n_prompt,
                           .max_total = ev.error == SCHED_ETOOBIG ? hr->srv->info->n_ctx : 0};
            *rc = send_error(hr, sched_err_kind(ev.error), ev.message, &x);
            return -1;
        }
        sched_event_clear(&ev);
    }
}

/* ---- several sequences in one request: prompt arrays, n, best_of ---- */

/* One sequence of a request: its prompt's tokens, its scheduler request,
 * its result. */
typedef struct batch_item {
    int32_t *toks;              /* [n_prompt] heap (shared by a prompt's n choices: owned by choice 0) */
    int n_prompt;
    int prompt;                 /* which prompt of a prompt array (0 for one prompt) */
    sched_req *r;
    gen_result res;
    sampler_params sp;          /* the request's, with this choice's seed */
    const int *hints;           /* [n_hints] prefix-cache snapshot hints (chat_snap_hints), first choice only */
    int n_hints;
} batch_item;

/* Sum of the generated tokens' logprobs: TGI's best_of score. */
static double seq_logprob(const gen_result *res)
{
    double s = 0;
    for (int i = 0; i < res->n_toks; i++)
        s += res->toks[i].logprob;
    return s;
}

/* TGI answer for best_of: the sequence with the highest logprob sum (the
 * first of equals), details.best_of_sequences the others in order. */
static cJSON *tgi_best_of(server *srv, const gen_request *g, batch_item *it, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (seq_logprob(&it[i].res) > seq_logprob(&it[best].res))
            best = i;
    gen_request gi = *g;
    sched_result sr;
    sched_req_result(it[best].r, &sr);
    gi.sp = it[best].sp;
    cJSON *o = tgi_response(srv, &gi, &it[best].res, &sr, it[best].toks, it[best].n_prompt);
    cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "details");
    cJSON *seqs = d ? cJSON_AddArrayToObject(d, "best_of_sequences") : NULL;
    for (int i = 0; seqs && i < n; i++) {
        if (i == best)
            continue;
        sched_req_result(it[i].r, &sr);
        gi.sp = it[i].sp;
        cJSON *one = tgi_response(srv, &gi, &it[i].res, &sr, it[i].toks, it[i].n_prompt);
        cJSON *seq = one ? cJSON_DetachItemFromObjectCaseSensitive(one, "details") : NULL;
        if (seq) {
            json_put(seq, "generated_text", cJSON_DetachItemFromObjectCaseSensitive(one, "generated_text"));
            json_push(seqs, seq);
        }
        cJSON_Delete(one);
    }
    return o;
}

/* Queue the n_per choices of one prompt, it[0..n_per): as a group that
 * prefills the prompt once and forks (sched_submit_group), or, when the
 * choices ask for the prompt's logprobs (echo) or are more than the
 * sequences the server runs at once, one request each. Returns 0 or a
 * scheduler status with a message in err. */
static int submit_choices(http_req *hr, const gen_request *g, batch_item *it, int k0, int n_per, int max_new,
                          char *err, size_t errlen)
{
    server *srv = hr->srv;
    enum { ID_LEN = 128 };
    int rc = SCHED_ENOMEM;
    char *ids = fault_malloc((size_t)n_per * ID_LEN), gid[ID_LEN];
    const char **idp = fault_malloc((size_t)n_per * sizeof *idp);
    uint64_t *seeds = fault_malloc((size_t)n_per * sizeof *seeds);
    sched_req **rs = fault_malloc((size_t)n_per * sizeof *rs);
    if (!ids || !idp || !seeds || !rs) {
        snprintf(err, errlen, "out of memory");
        goto out_free;
    }
    for (int j = 0; j < n_per; j++) {
        snprintf(ids + (size_t)j * ID_LEN, ID_LEN, "%s-%d", hr->id, k0 + j);
        idp[j] = ids + (size_t)j * ID_LEN;
        it[j].sp = g->sp;
        it[j].sp.seed = seeds[j] = sampler_choice_seed(g->sp.seed, j);
    }
    /* the group's id: the request's for one prompt, else one per prompt */
    if (g->n_batch <= 1)
        snprintf(gid, sizeof gid, "%s", hr->id);
    else
        snprintf(gid, sizeof gid, "%s-p%d", hr->id, it[0].prompt);
    sched_req_params rp = {.id = gid, .owner = hr->key_id, .prompt = it[0].toks, .n_prompt = it[0].n_prompt,
                           .max_new_tokens = max_new, .sampling = it[0].sp,
                           .stop = (const char *const *)g->stop, .n_stop = g->n_stop,
                           .include_stop = g->api == API_TGI, .ignore_eos = g->ignore_eos,
                           .top_logprobs = g->top_logprobs, .prompt_logprobs = g->prompt_logprobs,
                           .cache_salt = g->cache_salt, .constraint = g->constraint,
                           .constraint_src = g->constraint_src, .constraint_len = g->constraint_len,
                           .snap_hints = it[0].hints, .n_snap_hints = it[0].n_hints};
    if (n_per > 1 && !g->prompt_logprobs && n_per <= srv->info->max_seqs) {
        rc = sched_submit_group(srv->sched, &rp, n_per, seeds, idp, rs, err, errlen);
        for (int j = 0; rc == 0 && j < n_per; j++)
            it[j].r = rs[j];
        goto out_free;
    }
    for (int j = 0; j < n_per; j++) {
        rp.id = idp[j];
        rp.sampling = it[j].sp;
        if ((rc = sched_submit(srv->sched, &rp, &it[j].r, err, errlen)) != 0)
            goto out_free;
        rp.snap_hints = NULL;   /* the choices share the prompt: the first snapshots it */
        rp.n_snap_hints = 0;
    }
out_free:
    free(ids);
    free(idp);
    free(seeds);
    free(rs);
    return rc;
}

/* Queue every sequence of it[0..n_items) at once (they run in the same
 * batch; the choices of one prompt prefill it once), collect them in
 * order and answer: OpenAI one choice each (index k: prompt k / n_per,
 * choice k % n_per) with the usage summed and each prompt counted once;
 * TGI the best of them. Not streamed. */
static int run_sequences(http_req *hr, gen_request *g, batch_item *it, int n_items, int n_per, int max_new, bool compat)
{
    server *srv = hr->srv;
    char err[512];
    if (!g->sp.greedy && !g->seed_given)
        g->sp.seed = random_seed();     /* one seed for the request: each choice derives its own */
    http_inflight_begin(hr);
    for (int k = 0; k < n_items; k += n_per) {
        int src = submit_choices(hr, g, it + k, k, n_per, max_new, err, sizeof err);
        if (src)
            return send_error(hr, sched_err_kind(src), err, NULL);
    }
    if (g->stream) {
        /* OpenAI n > 1 streamed (one prompt): every choice admitted, then one stream of all */
        sched_req *rs[JSON_MAX_BATCH];
        int rc = 0;
        for (int k = 0; k < n_items; k++)
            if (wait_admitted(hr, it[k].r, g->api, it[k].n_prompt, &rc))
                return rc;
        for (int k = 0; k < n_items; k++) {
            rs[k] = it[k].r;
            it[k].r = NULL;     /* the stream owns them now */
        }
        return stream_start_n(hr, rs, n_items, g, it[0].toks, it[0].n_prompt);
    }
    for (int k = 0; k < n_items; k++) {
        if (stream_collect(hr, it[k].r, &it[k].res) < 0) {
            hr->failure = "cancelled";
            return -1;
        }
        if (it[k].res.error)
            return send_error(hr, sched_err_kind(it[k].res.error), it[k].res.message, NULL);
        hr->n_gen += it[k].res.n_toks;
        hr->finish = sched_finish_name(it[k].res.finish);
    }
    if (g->api == API_TGI) {
        cJSON *best = tgi_best_of(srv, g, it, n_items), *arr = compat ? cJSON_CreateArray() : NULL;
        if (arr)
            json_push(arr, best);    /* POST /: an array of one answer */
        return http_send_json(hr, 200, arr ? arr : best, NULL);
    }
    /* one answer: the first sequence's, with every sequence's choice and the usage summed */
    cJSON *body = NULL, *choices = NULL;
    int n_gen = 0, n_cached = 0;
    for (int k = 0; k < n_items; k++) {
        char *saved = g->prompt;
        sched_result sr;
        sched_req_result(it[k].r, &sr);
        if (k % n_per == 0)
            n_cached += sr.cached_tokens;
        if (g->n_batch > 1)
            g->prompt = g->batch_prompt[it[k].prompt];     /* echo gives this prompt's text */
        cJSON *one = oai_response(srv, hr, g, &it[k].res, it[k].toks, it[k].n_prompt, sr.cached_tokens);
        g->prompt = saved;
        if (!one)
            continue;
        cJSON *ch = cJSON_DetachItemFromArray(cJSON_GetObjectItemCaseSensitive(one, "choices"), 0);
        cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(ch, "index"), k);
        n_gen += it[k].res.n_toks;
        if (!body) {
            body = one;
            choices = cJSON_GetObjectItemCaseSensitive(body, "choices");
        } else {
            cJSON_Delete(one);
        }
        json_push(choices, ch);
    }
    cJSON *u = cJSON_GetObjectItemCaseSensitive(body, "usage");
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens"), hr->n_prompt);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(u, "completion_tokens"), n_gen);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(u, "total_tokens"), hr->n_prompt + n_gen);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details"),
                                                          "cached_tokens"),
                         n_cached);
    return http_send_json(hr, 200, body, NULL);
}

static void free_sequences(batch_item *it, int n_items, int n_per)
{
    for (int k = 0; k < n_items; k++) {
        gen_result_free(&it[k].res);
        sched_req_release(it[k].r);
        if (k % n_per == 0)
            free(it[k].toks);
    }
    free(it);
}

/* One prompt, n (OpenAI) or best_of (TGI) sequences of it. toks stays the
 * caller's. */
static int handle_choices(http_req *hr, gen_request *g, int32_t *toks, int n_prompt, const int *hints, int n_hints,
                          int max_new, bool compat)
{
    int n = g->api == API_TGI ? g->best_of : g->n;
    batch_item *it = fault_calloc((size_t)n, sizeof(*it));
    if (!it)
        return send_error(hr, ERR_INTERNAL, "out of memory", NULL);
    for (int k = 0; k < n; k++) {
        it[k].toks = toks;
        it[k].n_prompt = n_prompt;
    }
    it[0].hints = hints;    /* the choices share the prompt: one of them snapshots it */
    it[0].n_hints = n_hints;
    int rc = run_sequences(hr, g, it, n, n, max_new, compat);
    it[0].toks = NULL;      /* the caller's */
    free_sequences(it, n, n);
    return rc;
}

/* Tokens of batch prompt i (as given for token ids, checked against the
 * vocabulary). Returns the count, or -1 with a message in err. */
static int batch_tokens(server *srv, const gen_request *g, int i, int32_t **out, char *err, size_t errlen)
{
    if (g->batch_prompt[i]) {
        int nt = tokenize(srv, g->batch_prompt[i], NULL, 0, out);
        if (nt < 1)
            snprintf(err, errlen, "`prompt`: item %d produced no tokens", i);
        return nt < 1 ? -1 : nt;
    }
    for (int k = 0; k < g->batch_n_ids[i]; k++) {
        if (g->batch_ids[i][k] >= srv->info->n_vocab) {
            snprintf(err, errlen, "`prompt`: item %d: token %d is not in the vocabulary (0..%d)", i,
                     (int)g->batch_ids[i][k], srv->info->n_vocab - 1);
            return -1;
        }
    }
    *out = fault_malloc((size_t)g->batch_n_ids[i] * sizeof(**out));
    if (!*out) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(*out, g->batch_ids[i], (size_t)g->batch_n_ids[i] * sizeof(**out));
    return g->batch_n_ids[i];
}

/* /v1/completions with prompt: [p0, p1, ...]: n choices of every prompt,
 * choices p * n .. p * n + n - 1 for prompt p, as OpenAI orders them.
 * Not streamed (400): one stream would interleave several requests. */
static int handle_batch(http_req *hr, gen_request *g)
{
    server *srv = hr->srv;
    const int n_per = g->n, n = g->n_batch * n_per, n_ctx = srv->info->n_ctx;
    batch_item *it = fault_calloc((size_t)n, sizeof(*it));
    char err[512];
    int rc = 0;
    err_extra xp = {.param = "prompt"};
    if (!it)
        return send_error(hr, ERR_INTERNAL, "out of memory", NULL);
    if (g->stream) {
        rc = send_error(hr, ERR_VALIDATION, "`prompt`: several prompts cannot be streamed in one request; send one "
                                            "streaming request per prompt", &xp);
        goto out;
    }
    int max_new = g->max_new_tokens > 0 ? g->max_new_tokens : 16;
    for (int i = 0; i < g->n_batch; i++) {
        batch_item *p = &it[i * n_per];
        p->n_prompt = batch_tokens(srv, g, i, &p->toks, err, sizeof err);
        if (p->n_prompt < 1) {
            rc = send_error(hr, ERR_VALIDATION, err, &xp);
            goto out;
        }
        for (int j = 0; j < n_per; j++) {
            p[j].toks = p->toks;
            p[j].n_prompt = p->n_prompt;
            p[j].prompt = i;
        }
        if (srv->cfg->max_prompt_tokens > 0 && p->n_prompt > srv->cfg->max_prompt_tokens) {
            snprintf(err, sizeof err, "prompt %d has %d tokens, more than the limit of %d (--max-prompt-tokens)", i,
                     p->n_prompt, srv->cfg->max_prompt_tokens);
            rc = send_error(hr, ERR_VALIDATION, err, &xp);
            goto out;
        }
        if ((long)p->n_prompt + max_new > n_ctx) {
            err_extra x = {.param = "max_tokens", .n_prompt = p->n_prompt, .max_total = n_ctx};
            snprintf(err, sizeof err, "prompt %d: prompt tokens + max_tokens must be <= %d. Given: %d prompt tokens "
                                      "and %d max_tokens", i, n_ctx, p->n_prompt, max_new);
            rc = send_error(hr, ERR_CONTEXT, err, &x);
            goto out;
        }
        hr->n_prompt += p->n_prompt;
    }
    rc = run_sequences(hr, g, it, n, n_per, max_new, false);
out:
    free_sequences(it, n, n_per);
    return rc;
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
        rc = send_error(hr, parse_error_kind(jrc),
                        err, &x);
        json_gen_free(&g);
        return rc;
    }
    for (int i = 0; i < g.n_stop; i++) {
        if (strlen(g.stop[i]) > (size_t)cfg->max_stop_len) {
            err_extra x = {.param = "stop"};
            snprintf(err, sizeof(err), "`stop`: sequence %d is %zu bytes, more than the limit of %d "
                     "(--max-stop-length)", i, strlen(g.stop[i]), cfg->max_stop_len);
            rc = send_error(hr, ERR_VALIDATION, err, &x);
            json_gen_free(&g);
            return rc;
        }
    }
    /* @huggingface/inference 4.x sends its endpoint URL as "model" when given
     * an endpointUrl: a URL names this endpoint, not another model */
    if (!strncmp(g.model, "http://", 7) || !strncmp(g.model, "https://", 8))
        g.model[0] = '\0';
    if (api != API_TGI && g.model[0] && !cfg->accept_any_model && !served_name(srv, g.model)) {
        err_extra x = {.param = "model"};
        snprintf(err, sizeof(err), "The model `%.200s` does not exist (this server serves %.200s; GET /v1/models "
                 "lists its names)", g.model, server_model_name(srv));
        rc = send_error(hr, ERR_MODEL, err, &x);
        goto out;
    }
    if (mode == GEN_STREAM)
        g.stream = true;
    int n_seq = api == API_TGI ? g.best_of : g.n;
    if (n_seq > cfg->max_n) {
        err_extra x = {.param = api == API_TGI ? "best_of" : "n"};
        snprintf(err, sizeof(err), "`%s` must be <= %d (--max-n). Given: %d", x.param, cfg->max_n, n_seq);
        rc = send_error(hr, ERR_VALIDATION, err, &x);
        goto out;
    }
    if (n_seq > 1 && g.stream && (api == API_TGI || n_seq > JSON_MAX_BATCH)) {
        err_extra x = {.param = api == API_TGI ? "best_of" : "n"};
        snprintf(err, sizeof(err), api == API_TGI ? "`best_of` != 1 is not supported when streaming tokens"
                                                  : "a stream carries at most %d choices", JSON_MAX_BATCH);
        rc = send_error(hr, ERR_VALIDATION, err, &x);
        goto out;
    }
    if (g.n_batch > 1) {
        rc = handle_batch(hr, &g);
        goto out;
    }
    if (g.stream && g.prompt_logprobs && api == API_TGI) {
        err_extra x = {.param = "decoder_input_details"};
        rc = send_error(hr, ERR_VALIDATION, "decoder_input_details == true is not supported when streaming tokens",
                        &x);
        goto out;
    }
    if (mode == GEN_COMPAT && g.stream)
        mode = GEN_BODY;
    if (api == API_OAI_CHAT) {
        const char *tools = g.tool_choice != TOOL_CHOICE_NONE ? g.tools : NULL;
        int crc = chat_render_tools(srv->chat_kind, g.msgs, g.n_msgs, tools, g.no_think, g.tools_in_system,
                                    &g.prompt, &content, &n_content, err, sizeof(err));
        if (crc) {
            err_extra x = {.param = "messages"};
            rc = send_error(hr, crc == CHAT_ENOMEM ? ERR_INTERNAL : ERR_TEMPLATE, err, &x);
            goto out;
        }
        /* a forced or started tool call in the template's own form */
        if (srv->chat_kind == CHAT_LLAMA31 && json_set_tool_format(&g, "llama3.1")) {
            rc = send_error(hr, ERR_INTERNAL, "out of memory", NULL);
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
                hr->log_prompt = fault_strdup(p + 1);   /* JSON-escaped, without the quotes */
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
        toks = fault_malloc((size_t)g.n_prompt_ids * sizeof(*toks));
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
    if (cfg->max_prompt_tokens > 0 && n_prompt > cfg->max_prompt_tokens) {
        err_extra x = {.param = api == API_TGI ? "inputs" : api == API_OAI_CHAT ? "messages" : "prompt"};
        snprintf(err, sizeof(err), "the prompt has %d tokens, more than the limit of %d (--max-prompt-tokens)",
                 n_prompt, cfg->max_prompt_tokens);
        rc = send_error(hr, ERR_VALIDATION, err, &x);
        goto out;
    }
    if (n_prompt == 0) {
        err_extra x = {.param = api == API_TGI ? "inputs" : api == API_OAI_CHAT ? "messages" : "prompt"};
        rc = send_error(hr, ERR_VALIDATION, "the prompt produced no tokens", &x);
        goto out;
    }
    int hints[SCHED_MAX_SNAP_HINTS], n_hints = 0;
    if (api == API_OAI_CHAT && g.truncate <= 0)
        n_hints = chat_snap_hints(srv, g.prompt, content, n_content, toks, n_prompt, hints);
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
    if (n_seq > 1) {
        rc = handle_choices(hr, &g, toks, n_prompt, hints, n_hints, max_new, mode == GEN_COMPAT);
        goto out;
    }
    if (!g.sp.greedy && !g.seed_given)
        g.sp.seed = random_seed();

    _Static_assert((int)GEN_CONSTRAINT_JSON_SCHEMA == (int)SCHED_CONSTRAINT_JSON_SCHEMA &&
                   (int)GEN_CONSTRAINT_JSON_OBJECT == (int)SCHED_CONSTRAINT_JSON_OBJECT &&
                   (int)GEN_CONSTRAINT_REGEX == (int)SCHED_CONSTRAINT_REGEX &&
                   (int)GEN_CONSTRAINT_TOOL_CALLS == (int)SCHED_CONSTRAINT_TOOL_CALLS &&
                   (int)GEN_CONSTRAINT_TOOL_CALLS_AUTO == (int)SCHED_CONSTRAINT_TOOL_CALLS_AUTO &&
                   (int)GEN_CONSTRAINT_GBNF == (int)SCHED_CONSTRAINT_GBNF,
                   "json.h and scheduler.h agree");
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
        .cache_salt = g.cache_salt,
        .top_logprobs = g.top_logprobs,
        .prompt_logprobs = g.prompt_logprobs,
        .constraint = g.constraint,
        .constraint_src = g.constraint_src,
        .constraint_len = g.constraint_len,
        .snap_hints = hints,
        .n_snap_hints = n_hints,
    };
    http_inflight_begin(hr);
    json_oom_take();
    int src = sched_submit(srv->sched, &rp, &r, err, sizeof(err));
    if (src == SCHED_EINVAL && g.constraint && json_oom_take()) {
        /* the compiler's cJSON ran out of memory reading our own copy of
         * the schema: not the request's fault */
        rc = send_error(hr, ERR_INTERNAL, "out of memory compiling the constraint", NULL);
        goto out;
    }
    if (src == SCHED_EINVAL && g.constraint) {
        /* the constraint did not compile: name the field it came from */
        char msg[sizeof(err) + 40];
        err_extra x = {.param = g.constraint_param};
        snprintf(msg, sizeof(msg), "`%s`: %s", g.constraint_param, err);
        rc = send_error(hr, ERR_VALIDATION, msg, &x);
        goto out;
    }
    if (src != 0) {
        rc = send_error(hr, sched_err_kind(src), err, NULL);
        goto out;
    }

    if (wait_admitted(hr, r, api, n_prompt, &rc))
        goto out;

    if (g.stream) {
        rc = stream_start(hr, r, &g, toks, n_prompt);
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
                           : res.error == SCHED_ENOMEM   ? ERR_INTERNAL     /* the server's fault: 500 */
                                                         : ERR_GENERATION,
                        res.message, NULL);
        goto out;
    }
    hr->finish = sched_finish_name(res.finish);
    cJSON *body;
    if (api == API_TGI) {
        body = tgi_response(srv, &g, &res, &sr, toks, n_prompt);
        if (body && mode == GEN_COMPAT) {
            cJSON *arr = cJSON_CreateArray();
            if (arr)
                json_push(arr, body);
            else
                cJSON_Delete(body);
            body = arr;
        }
    } else {
        body = oai_response(srv, hr, &g, &res, toks, n_prompt, sr.cached_tokens);
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
    cJSON_AddStringToObject(k, "bf16_decode", engine_bf16_decode());
    char path[ENGINE_PROMPT_NAME_LEN];
    engine_bf16_prompt(path, sizeof path);
    cJSON_AddStringToObject(k, "bf16_prompt", path);
    engine_f16_prompt(path, sizeof path);
    cJSON_AddStringToObject(k, "f16_prompt", path);
    engine_f32_prompt(path, sizeof path);
    cJSON_AddStringToObject(k, "f32_prompt", path);
    engine_int8_prompt(path, sizeof path);
    cJSON_AddStringToObject(k, "int8_prompt", path);
}

static int h_info(http_req *hr)
{
    if (!check_ready(hr))
        return 0;
    server *srv = hr->srv;
    const engine_info *in = srv->info;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_id", server_model_name(srv));
    cJSON_AddNullToObject(o, "model_sha");
    cJSON_AddStringToObject(o, "model_dtype", in->weights_dtype);
    cJSON_AddStringToObject(o, "model_pipeline_tag", "text-generation");
    cJSON_AddNumberToObject(o, "max_concurrent_requests", in->max_seqs + srv->cfg->max_queue);
    cJSON_AddNumberToObject(o, "max_best_of", srv->cfg->max_n);     /* TGI best_of up to --max-n */
    cJSON_AddNumberToObject(o, "max_stop_sequences", srv->cfg->max_stop);
    cJSON_AddNumberToObject(o, "max_input_tokens", in->n_ctx - 1);
    cJSON_AddNumberToObject(o, "max_total_tokens", in->n_ctx);
    cJSON_AddNumberToObject(o, "validation_workers", 0);
    cJSON_AddNumberToObject(o, "max_client_batch_size", 1);
    cJSON_AddStringToObject(o, "router", "hyserve");
    cJSON_AddStringToObject(o, "version", hyserve_version());
    cJSON_AddStringToObject(o, "git_commit", hyserve_git_commit());
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
    cJSON_AddNumberToObject(m, "n_mamba2_layers", in->n_mamba2_layers);
    cJSON_AddNumberToObject(m, "n_shortconv_layers", in->n_sconv_layers);
    cJSON_AddNumberToObject(m, "n_mamba_layers", in->n_mamba_layers);
    cJSON_AddNumberToObject(m, "n_kda_layers", in->n_kda_layers);
    cJSON_AddNumberToObject(m, "n_recurrent_layers", in->n_rec_layers);
    cJSON_AddNumberToObject(m, "n_ctx_train", in->n_ctx_train);
    cJSON_AddStringToObject(m, "chat_template", chat_kind_name(srv->chat_kind));
    cJSON *c = cJSON_AddObjectToObject(o, "cache_layout");
    cJSON_AddStringToObject(c, "kind", in->n_rec_layers > 0 && in->n_attn_layers + in->n_mla_layers > 0 ? "hybrid"
                                       : in->n_rec_layers > 0                                             ? "recurrent"
                                                                                                          : "attention");
    cJSON_AddNumberToObject(c, "page_tokens", in->page_tokens);
    cJSON_AddNumberToObject(c, "kv_bytes_per_token", (double)in->kv_bytes_per_token);
    cJSON_AddNumberToObject(c, "dnet_state_bytes_per_seq", (double)in->dnet_state_bytes_per_seq);
    cJSON_AddNumberToObject(c, "dnet_conv_bytes_per_seq", (double)in->dnet_conv_bytes_per_seq);
    cJSON_AddNumberToObject(c, "recurrent_state_bytes_per_seq", (double)in->rec_state_bytes_per_seq);
    cJSON_AddNumberToObject(c, "recurrent_conv_bytes_per_seq", (double)in->rec_conv_bytes_per_seq);
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
    /* one entry per served name (aliases of the one model) */
    for (int i = 0; i < hr->srv->n_model_names || i == 0; i++) {
        cJSON *m = cJSON_CreateObject();
        json_push(data, m);
        cJSON_AddStringToObject(m, "id", i < hr->srv->n_model_names ? hr->srv->model_names[i] : in->name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)hr->srv->started_at);
        cJSON_AddStringToObject(m, "owned_by", "hyserve");
        cJSON *meta = cJSON_AddObjectToObject(m, "meta");
        cJSON_AddNumberToObject(meta, "n_vocab", in->n_vocab);
        cJSON_AddNumberToObject(meta, "n_ctx_train", in->n_ctx_train);
        cJSON_AddNumberToObject(meta, "n_ctx", in->n_ctx);
        cJSON_AddNumberToObject(meta, "n_params", (double)in->n_params);
        cJSON_AddNumberToObject(meta, "size", (double)in->weight_bytes);
    }
    return http_send_json(hr, 200, o, NULL);
}

/* POST /detokenize: {"tokens": [ids]} -> the text they spell, as
 * llama-server's "content" and vLLM's "prompt" (the same string). A BOS
 * the model adds is skipped when it comes first, so /tokenize's ids come
 * back to its input. */
static int h_detokenize(http_req *hr)
{
    if (!check_ready(hr))
        return 0;
    server *srv = hr->srv;
    char err[256];
    int32_t *ids = NULL;
    int n = 0;
    int jrc = json_parse_detokenize(hr->body, hr->n_body, srv->info->n_vocab - 1, &ids, &n, err, sizeof(err));
    if (jrc != JSON_OK)
        return routes_error(hr, parse_error_kind(jrc),
                            err);
    char *text = NULL, piece[512];
    size_t len = 0, cap = 0;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 && srv->info->add_bos && ids[0] == srv->info->bos_id)
            continue;
        int pl = engine_token_piece(srv->eng, ids[i], piece, sizeof(piece));
        if (pl > (int)sizeof(piece))
            pl = (int)sizeof(piece);
        if (pl > 0 && json_buf_append(&text, &len, &cap, piece, (size_t)pl)) {
            rc = routes_error(hr, ERR_INTERNAL, "out of memory");
            goto out;
        }
    }
    cJSON *o = cJSON_CreateObject();
    json_add_text(o, "content", text ? text : "", len);
    json_add_text(o, "prompt", text ? text : "", len);
    rc = http_send_json(hr, 200, o, NULL);
out:
    free(text);
    free(ids);
    return rc;
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
        return routes_error(hr, parse_error_kind(jrc), err);
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
        json_push(arr, t);
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

/* Is name one of config/presets/ (a name, never a path: "qwen3.5-9b" has a
 * dot, so the check is membership, not a character filter)? */
/* POST /apply-template (llama-server's name): the chat body's prompt text,
 * exactly as /v1/chat/completions would feed it to the model, tools and
 * tool calls included: {"prompt": "..."}. */
static int h_apply_template(http_req *hr)
{
    server *srv = hr->srv;
    gen_request g;
    char err[512], param[64];
    char *prompt = NULL;
    size_t *content = NULL;
    int n_content = 0, rc;
    int jrc = json_parse_gen(&g, API_OAI_CHAT, hr->body, hr->n_body, srv->cfg->max_stop, err, sizeof(err), param,
                             sizeof(param));
    if (jrc != JSON_OK) {
        json_gen_free(&g);
        return routes_error(hr, parse_error_kind(jrc), err);
    }
    const char *tools = g.tool_choice != TOOL_CHOICE_NONE ? g.tools : NULL;
    int crc = chat_render_tools(srv->chat_kind, g.msgs, g.n_msgs, tools, g.no_think, g.tools_in_system, &prompt,
                                &content, &n_content, err, sizeof(err));
    if (crc) {
        rc = routes_error(hr, crc == CHAT_ENOMEM ? ERR_INTERNAL : ERR_TEMPLATE, err);
    } else {
        cJSON *o = cJSON_CreateObject();
        json_add_text(o, "prompt", prompt, strlen(prompt));
        rc = http_send_json(hr, 200, o, NULL);
    }
    free(prompt);
    free(content);
    json_gen_free(&g);
    return rc;
}

/* POST /v1/memory/estimate: the planner (memplan.c) over HTTP, no weights;
 * memest.c reads the body. */
static int h_memory_estimate(http_req *hr)
{
    server *srv = hr->srv;
    char err[512];
    memplan_layout served;
    const bool loaded = atomic_load(&srv->state) == SERVER_READY || atomic_load(&srv->state) == SERVER_DRAINING;
    if (loaded) {
        engine_get_memplan(srv->eng, &served);
        snprintf(served.name, sizeof(served.name), "%s", srv->info->name);
    }
    memest_req q;
    int jrc = memest_parse(hr->body, hr->n_body, loaded ? &served : NULL, loaded ? srv->info->n_ctx : 0, &q, err,
                           sizeof(err));
    if (jrc != JSON_OK)
        return routes_error(hr, parse_error_kind(jrc), err);
    return http_send_json(hr, 200, memplan_estimate_json(&q.l, q.context, q.batch, q.budget), NULL);
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
        json_push(arr, cJSON_CreateString(names[i]));
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

/* POST /reset_prefix_cache (vLLM's route): empty the prefix cache. Never
 * refused for running requests: it drops the entries, and a running
 * request forked from one keeps the pages it shares until it ends. Says
 * what it freed. */
static int h_reset_prefix(http_req *hr)
{
    if (!check_ready(hr))
        return 0;
    sched_prefix_freed f;
    if (sched_prefix_reset(hr->srv->sched, &f) != SCHED_OK)
        return routes_error(hr, ERR_DRAINING, "the server is shutting down");
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddBoolToObject(o, "enabled", f.enabled) ||
        !cJSON_AddNumberToObject(o, "freed_entries", f.entries) ||
        !cJSON_AddNumberToObject(o, "freed_snapshots", f.snapshots) ||
        !cJSON_AddNumberToObject(o, "freed_store_bytes", (double)f.bytes) ||
        !cJSON_AddNumberToObject(o, "freed_pool_bytes", (double)f.pool_freed_bytes) ||
        !cJSON_AddNumberToObject(o, "pool_reserved_bytes", (double)f.pool_reserved_bytes) ||
        !cJSON_AddNumberToObject(o, "running_requests", f.running)) {
        cJSON_Delete(o);
        return routes_error(hr, ERR_INTERNAL, "out of memory");
    }
    return http_send_json(hr, 200, o, NULL);
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

/* GET /debug/fault, test builds started with HYSERVE_FAULT_LIVE=1 only
 * (fault.h; a 404 like any unknown path otherwise): the request arrived
 * disarmed (http.c); says whether the failure armed by the last
 * X-Hyserve-Fault-Nth happened, and how many allocations it had left. */
static int h_debug_fault(http_req *hr)
{
    if (!fault_live()) {
        char msg[400];
        snprintf(msg, sizeof(msg), "no route %s %s; see GET /info and the README for the API", hr->method, hr->path);
        return routes_error(hr, ERR_NOT_FOUND, msg);
    }
    bool fired;
    int remaining;
    fault_taken(&fired, &remaining);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "fired", fired);
    cJSON_AddNumberToObject(o, "remaining", remaining);
    return http_send_json(hr, 200, o, NULL);
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
    {"POST", "/detokenize", h_detokenize},
    {"POST", "/apply-template", h_apply_template},
    {"GET", "/health", h_health},
    {"GET", "/live", h_health},
    {"GET", "/ready", h_ready},
    {"GET", "/info", h_info},
    {"GET", "/stats", h_stats},
    {"POST", "/v1/memory/estimate", h_memory_estimate},
    {"GET", "/v1/memory/presets", h_memory_presets},
    {"GET", "/metrics", h_metrics},
    {"POST", "/reset_prefix_cache", h_reset_prefix},
    {"DELETE", "/requests/", h_cancel},
    {"GET", "/debug/fault", h_debug_fault},
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

/* A CORS preflight (OPTIONS on a known path, --cors-origin set): answered
 * before the key check, since browsers send it without credentials.
 * Returns 1 when it was not one (nothing sent), else what sending gave. */
static int preflight(http_req *hr)
{
    if (strcmp(hr->method, "OPTIONS") || !cors_enabled(hr->srv))
        return 1;
    char allow[64] = "";
    for (int i = 0; i < N_ROUTES; i++) {
        if (!route_matches(&ROUTES[i], hr->path) || strstr(allow, ROUTES[i].method))
            continue;
        size_t l = strlen(allow);
        snprintf(allow + l, sizeof(allow) - l, "%s%s", l ? ", " : "", ROUTES[i].method);
    }
    return allow[0] ? cors_preflight(hr, allow) : 1;
}

int routes_dispatch(http_req *hr)
{
    const auth_keys *keys = &hr->srv->keys;
    if (hr->body_oom)
        return routes_error(hr, ERR_INTERNAL, "out of memory reading the request body");
    if (hr->head_too_large) {
        char msg[160];
        snprintf(msg, sizeof(msg), "request line and headers are larger than the limit of %llu bytes "
                 "(--max-header-bytes)", (unsigned long long)hr->srv->cfg->max_header_bytes);
        return routes_error(hr, ERR_HEAD_TOO_LARGE, msg);
    }
    int pf = preflight(hr);
    if (pf <= 0)
        return pf;
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

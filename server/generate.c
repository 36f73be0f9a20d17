/* generate.c - the generation flow, once for the five generation routes
 * (see generate.h).
 *
 * Steps: read the body into a checked gen_request (json.c's parser and
 * field rules) -> render the chat template -> tokenize and fit the prompt
 * in the context -> build the scheduler request and submit it -> wait for
 * admission (until then every failure has a real status) -> stream it
 * (stream.c), or collect it and answer one body. Several sequences in one
 * request (prompt arrays, n, best_of) branch off after the prompt step.
 * Does not own: field rules (json.c), error statuses (errors.c), SSE and
 * event collection (stream.c).
 * ref: docs/serving.md 2 (TGI shapes), 3 (OpenAI shapes), 4 (errors).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "fault.h"
#include "chat.h"
#include "config.h"
#include "errors.h"
#include "generate.h"
#include "json.h"
#include "stream.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------------- */
/* Tokenizing                                                             */
/* ---------------------------------------------------------------------- */

int generate_tokenize(server *srv, const char *text, const size_t *data, int n_data, int32_t **out)
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

static uint64_t random_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s))
        s = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL;
    return s;   /* all 64 bits: details.seed is written in full digits */
}

/* A seed for a sampled request that gave none. */
static void pick_seed(gen_request *g)
{
    if (!g->sp.greedy && !g->seed_given)
        g->sp.seed = random_seed();
}

_Static_assert((int)GEN_CONSTRAINT_JSON_SCHEMA == (int)SCHED_CONSTRAINT_JSON_SCHEMA &&
               (int)GEN_CONSTRAINT_JSON_OBJECT == (int)SCHED_CONSTRAINT_JSON_OBJECT &&
               (int)GEN_CONSTRAINT_REGEX == (int)SCHED_CONSTRAINT_REGEX &&
               (int)GEN_CONSTRAINT_TOOL_CALLS == (int)SCHED_CONSTRAINT_TOOL_CALLS &&
               (int)GEN_CONSTRAINT_TOOL_CALLS_AUTO == (int)SCHED_CONSTRAINT_TOOL_CALLS_AUTO &&
               (int)GEN_CONSTRAINT_GBNF == (int)SCHED_CONSTRAINT_GBNF,
               "json.h and scheduler.h agree");

/* The scheduler request of g's prompt toks[0..n_prompt), under hr's id
 * and key, with g's sampling (one sequence and groups alike). */
static sched_req_params req_params(const http_req *hr, const gen_request *g, const int32_t *toks, int n_prompt,
                                   int max_new, const int *hints, int n_hints)
{
    return (sched_req_params){
        .id = hr->id,
        .tags = hr->gateway[0] ? hr->gateway : NULL,
        .owner = hr->key_id,
        .prompt = toks,
        .n_prompt = n_prompt,
        .max_new_tokens = max_new,
        .sampling = g->sp,
        .stop = (const char *const *)g->stop,
        .n_stop = g->n_stop,
        .include_stop = g->api == API_TGI,
        .ignore_eos = g->ignore_eos,
        .cache_salt = g->cache_salt,
        .top_logprobs = g->top_logprobs,
        .prompt_logprobs = g->prompt_logprobs,
        .constraint = g->constraint,
        .constraint_src = g->constraint_src,
        .constraint_len = g->constraint_len,
        .snap_hints = hints,
        .n_snap_hints = n_hints,
        .speculative = g->speculative,
        .prediction = g->speculative >= 0 ? g->pred_ids : NULL,
        .n_prediction = g->speculative >= 0 ? g->n_pred_ids : 0,
    };
}

/* ---------------------------------------------------------------------- */
/* Answers: TGI and OpenAI bodies, admission, several sequences           */
/* ---------------------------------------------------------------------- */

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

/* Speculation's numbers of one answer (json_add_speculative). */
static void add_speculative(cJSON *obj, const gen_request *g, const sched_result *sr)
{
    json_add_speculative(obj, g->has_prediction, sr->spec.pred_accepted, sr->spec.pred_rejected, sr->spec.drafts,
                         sr->spec.drafted, sr->spec.accepted);
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
        add_speculative(d, g, sr);
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
        add_speculative(u, g, sr);
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
            int n = tok_piece(engine_tokenizer(srv->eng), toks[i], b, sizeof(b));
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
                           const int32_t *toks, int n_prompt, const sched_result *sr)
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
        int n_calls = g->tools && g->tool_choice != TOOL_CHOICE_NONE
                          ? chat_parse_tool_calls(srv->chat_kind, text, len, hr->id, &clen, &calls) : 0;
        if (calls) {
            /* complete calls (a last one cut off is dropped); cut by
             * max_tokens the finish stays "length" */
            if (clen)
                json_add_text(msg, "content", text, clen);
            else
                cJSON_AddNullToObject(msg, "content");
            if (n_calls > 0) {
                json_put(msg, "tool_calls", calls);
                if (res->finish != SCHED_FINISH_LENGTH)
                    finish = "tool_calls";
            } else {
                cJSON_Delete(calls);
            }
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
    /* vLLM's stop_reason: the stop string that ended the text */
    if (res->finish == SCHED_FINISH_STOP && res->stop_index >= 0 && res->stop_index < g->n_stop)
        cJSON_AddStringToObject(c, "stop_reason", g->stop[res->stop_index]);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", res->n_toks);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + res->n_toks);
    json_add_cached_tokens(u, sr->cached_tokens);
    add_speculative(u, g, sr);
    return o;
out_nomem:
    lp_list_free(&lp);
    cJSON_Delete(o);
    return NULL;
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
            *rc = errors_send(hr, errors_of_sched(ev.error), ev.message, &x);
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
    sched_req_params rp = req_params(hr, g, it[0].toks, it[0].n_prompt, max_new, it[0].hints, it[0].n_hints);
    rp.id = gid;
    rp.sampling = it[0].sp;
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
    pick_seed(g);     /* one seed for the request: each choice derives its own */
    http_inflight_begin(hr);
    for (int k = 0; k < n_items; k += n_per) {
        int src = submit_choices(hr, g, it + k, k, n_per, max_new, err, sizeof err);
        if (src)
            return errors_send(hr, errors_of_sched(src), err, NULL);
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
            return errors_send(hr, errors_of_sched(it[k].res.error), it[k].res.message, NULL);
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
    sched_result sum = {0};     /* the choices' speculation, summed */
    for (int k = 0; k < n_items; k++) {
        char *saved = g->prompt;
        sched_result sr;
        sched_req_result(it[k].r, &sr);
        if (k % n_per == 0)
            n_cached += sr.cached_tokens;
        sum.spec.drafts += sr.spec.drafts;
        sum.spec.drafted += sr.spec.drafted;
        sum.spec.accepted += sr.spec.accepted;
        sum.spec.pred_accepted += sr.spec.pred_accepted;
        sum.spec.pred_rejected += sr.spec.pred_rejected;
        if (g->n_batch > 1)
            g->prompt = g->batch_prompt[it[k].prompt];     /* echo gives this prompt's text */
        cJSON *one = oai_response(srv, hr, g, &it[k].res, it[k].toks, it[k].n_prompt, &sr);
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
    cJSON_DeleteItemFromObjectCaseSensitive(u, "completion_tokens_details");
    cJSON_DeleteItemFromObjectCaseSensitive(u, "speculative");
    add_speculative(u, g, &sum);
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
        return errors_send(hr, ERR_INTERNAL, "out of memory", NULL);
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
        int nt = generate_tokenize(srv, g->batch_prompt[i], NULL, 0, out);
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
 * Not streamed (json_check_gen): one stream would interleave several
 * requests. */
static int handle_batch(http_req *hr, gen_request *g)
{
    server *srv = hr->srv;
    const int n_per = g->n, n = g->n_batch * n_per, n_ctx = srv->info->n_ctx;
    batch_item *it = fault_calloc((size_t)n, sizeof(*it));
    char err[512];
    int rc = 0;
    err_extra xp = {.param = "prompt"};
    if (!it)
        return errors_send(hr, ERR_INTERNAL, "out of memory", NULL);
    int max_new = g->max_new_tokens > 0 ? g->max_new_tokens : 16;
    for (int i = 0; i < g->n_batch; i++) {
        batch_item *p = &it[i * n_per];
        p->n_prompt = batch_tokens(srv, g, i, &p->toks, err, sizeof err);
        if (p->n_prompt < 1) {
            rc = errors_send(hr, ERR_VALIDATION, err, &xp);
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
            rc = errors_send(hr, ERR_VALIDATION, err, &xp);
            goto out;
        }
        if ((long)p->n_prompt + max_new > n_ctx) {
            err_extra x = {.param = "max_tokens", .n_prompt = p->n_prompt, .max_total = n_ctx};
            snprintf(err, sizeof err, "prompt %d: prompt tokens + max_tokens must be <= %d. Given: %d prompt tokens "
                                      "and %d max_tokens", i, n_ctx, p->n_prompt, max_new);
            rc = errors_send(hr, ERR_CONTEXT, err, &x);
            goto out;
        }
        hr->n_prompt += p->n_prompt;
    }
    rc = run_sequences(hr, g, it, n, n_per, max_new, false);
out:
    free_sequences(it, n, n_per);
    return rc;
}

/* ---------------------------------------------------------------------- */
/* The flow                                                               */
/* ---------------------------------------------------------------------- */

/* One generation request on its way through the steps. Each step returns
 * false to go on, or true when it has answered (the answer's code in
 * *rc). */
typedef struct gen_job {
    http_req *hr;
    server *srv;
    int api;                    /* enum api_kind */
    bool compat;                /* POST /: the answer is an array of one (not when streamed) */
    gen_request g;
    size_t *content;            /* chat: byte ranges of the prompt that are message text */
    int n_content;
    int32_t *toks;              /* [n_prompt] heap */
    int n_prompt;
    int hints[SCHED_MAX_SNAP_HINTS], n_hints;   /* prefix-cache snapshot hints (chat_snap_hints) */
    int max_new;
    char err[512];
} gen_job;

/* The field named by a prompt error on this route. */
static const char *prompt_param(int api)
{
    return api == API_TGI ? "inputs" : api == API_OAI_CHAT ? "messages" : "prompt";
}

/* Parse the body and check its fields against the server's limits. */
static bool read_request(gen_job *j, int mode, int *rc)
{
    const server_config *cfg = j->srv->cfg;
    char param[64];
    int jrc = json_parse_gen(&j->g, j->api, j->hr->body, j->hr->n_body, cfg->max_stop, j->err, sizeof(j->err), param,
                             sizeof(param));
    if (jrc == JSON_OK) {
        const gen_limits lim = {.max_stop_len = cfg->max_stop_len, .max_n = cfg->max_n, .stream = mode == GEN_STREAM,
                                .any_model = cfg->accept_any_model, .names = j->srv->model_names,
                                .n_names = j->srv->n_model_names, .name = server_model_name(j->srv),
                                .n_vocab = j->srv->info->n_vocab};
        jrc = json_check_gen(&j->g, &lim, j->err, sizeof(j->err), param, sizeof(param));
    }
    if (jrc != JSON_OK) {
        err_extra x = {.param = param};
        *rc = errors_send(j->hr, errors_of_json(jrc), j->err, &x);
        return true;
    }
    j->compat = mode == GEN_COMPAT && !j->g.stream;
    return false;
}

/* Chat: the messages through the model's template into g.prompt; the
 * prompt for the log when --log-prompts. */
static bool render_prompt(gen_job *j, int *rc)
{
    server *srv = j->srv;
    gen_request *g = &j->g;
    if (j->api == API_OAI_CHAT) {
        const char *tools = g->tool_choice != TOOL_CHOICE_NONE ? g->tools : NULL;
        int crc = chat_render_tools(srv->chat_kind, g->msgs, g->n_msgs, tools, g->no_think, g->tools_in_system,
                                    &g->prompt, &j->content, &j->n_content, j->err, sizeof(j->err));
        if (crc) {
            err_extra x = {.param = "messages"};
            *rc = errors_send(j->hr, crc == CHAT_ENOMEM ? ERR_INTERNAL : ERR_TEMPLATE, j->err, &x);
            return true;
        }
        /* a forced or started tool call in the template's own form */
        if (srv->chat_kind == CHAT_LLAMA31 && json_set_tool_format(g, "llama3.1")) {
            *rc = errors_reply(j->hr, ERR_INTERNAL, "out of memory");
            return true;
        }
    }
    if (srv->cfg->log_prompts && g->prompt) {
        cJSON *s = json_text(g->prompt, strlen(g->prompt));
        char *p = s ? cJSON_PrintUnformatted(s) : NULL;
        cJSON_Delete(s);
        if (p) {
            size_t n = strlen(p);
            if (n >= 2) {
                p[n - 1] = '\0';
                j->hr->log_prompt = fault_strdup(p + 1);   /* JSON-escaped, without the quotes */
            }
            cJSON_free(p);
        }
    }
    return false;
}

/* A prediction given as text: its tokens, as the output would hold them
 * (no BOS, control-token markup not parsed: the text is data). */
static bool prediction_tokens(gen_job *j, int *rc)
{
    gen_request *g = &j->g;
    if (!g->pred_text)
        return false;
    const size_t len = strlen(g->pred_text);
    const int cap = (int)(len < JSON_MAX_PREDICTION ? len : JSON_MAX_PREDICTION) + 1;
    free(g->pred_ids);
    g->n_pred_ids = 0;
    g->pred_ids = fault_malloc((size_t)cap * sizeof *g->pred_ids);
    int n = g->pred_ids ? engine_tokenize(j->srv->eng, g->pred_text, len, false, false, g->pred_ids, cap) : -1;
    if (n < 0) {
        *rc = errors_reply(j->hr, ERR_INTERNAL, "out of memory while tokenizing the prediction");
        return true;
    }
    g->n_pred_ids = n < cap ? n : cap;     /* a longer prediction is drafted from its first tokens */
    return false;
}

/* The prompt's tokens (token ids as given, no BOS added; else the text
 * tokenized), TGI's truncate, --max-prompt-tokens, and the snapshot hints. */
static bool prompt_tokens(gen_job *j, int *rc)
{
    const gen_request *g = &j->g;
    const int max_prompt = j->srv->cfg->max_prompt_tokens;
    if (g->prompt_ids) {
        j->toks = fault_malloc((size_t)g->n_prompt_ids * sizeof(*j->toks));
        if (!j->toks) {
            *rc = errors_reply(j->hr, ERR_INTERNAL, "out of memory");
            return true;
        }
        memcpy(j->toks, g->prompt_ids, (size_t)g->n_prompt_ids * sizeof(*j->toks));
        j->n_prompt = g->n_prompt_ids;
    } else {
        j->n_prompt = generate_tokenize(j->srv, g->prompt, j->content, j->n_content, &j->toks);
    }
    if (j->n_prompt < 0) {
        *rc = errors_reply(j->hr, ERR_INTERNAL, "out of memory while tokenizing the prompt");   /* any text encodes */
        return true;
    }
    if (g->truncate > 0 && j->n_prompt > g->truncate) {
        /* TGI keeps the end of the prompt */
        memmove(j->toks, j->toks + (j->n_prompt - g->truncate), (size_t)g->truncate * sizeof(int32_t));
        j->n_prompt = g->truncate;
    }
    j->hr->n_prompt = j->n_prompt;
    err_extra x = {.param = prompt_param(j->api)};
    if (max_prompt > 0 && j->n_prompt > max_prompt) {
        snprintf(j->err, sizeof(j->err), "the prompt has %d tokens, more than the limit of %d (--max-prompt-tokens)",
                 j->n_prompt, max_prompt);
        *rc = errors_send(j->hr, ERR_VALIDATION, j->err, &x);
        return true;
    }
    if (j->n_prompt == 0) {
        *rc = errors_send(j->hr, ERR_VALIDATION, "the prompt produced no tokens", &x);
        return true;
    }
    if (prediction_tokens(j, rc))
        return true;
    if (j->api == API_OAI_CHAT && g->truncate <= 0)
        j->n_hints = chat_snap_hints(j->srv, g->prompt, j->content, j->n_content, j->toks, j->n_prompt, j->hints);
    return false;
}

/* max_new: as asked, or the route's default within what the context
 * leaves; the prompt and it must fit the context. Then logit_bias. */
static bool fit_context(gen_job *j, int *rc)
{
    const gen_request *g = &j->g;
    const int n_ctx = j->srv->info->n_ctx, n_prompt = j->n_prompt;
    int max_new = g->max_new_tokens;
    if (max_new < 0) {
        max_new = j->api == API_OAI_COMPLETION ? 16 : j->srv->cfg->default_max_tokens;
        if (max_new > n_ctx - n_prompt)
            max_new = n_ctx - n_prompt;
    }
    if (max_new < 1 || (long)n_prompt + (long)max_new > (long)n_ctx) {
        err_extra x = {.param = j->api == API_TGI ? "max_new_tokens" : "max_tokens", .n_prompt = n_prompt,
                       .max_total = n_ctx};
        if (g->max_new_tokens < 0)
            snprintf(j->err, sizeof(j->err), "the prompt has %d tokens, which leaves no room to generate within the "
                                             "context limit of %d tokens; shorten the prompt", n_prompt, n_ctx);
        else
            snprintf(j->err, sizeof(j->err), "prompt tokens + %s must be <= %d. Given: %d prompt tokens and %d %s",
                     x.param, n_ctx, n_prompt, max_new, x.param);
        *rc = errors_send(j->hr, ERR_CONTEXT, j->err, &x);
        return true;
    }
    j->max_new = max_new;
    if (json_check_bias(g, j->srv->info->n_vocab, j->err, sizeof(j->err)) != JSON_OK) {
        err_extra x = {.param = "logit_bias"};
        *rc = errors_send(j->hr, ERR_VALIDATION, j->err, &x);
        return true;
    }
    return false;
}

/* Queue the one sequence (a seed picked first when it gave none). */
static bool submit_one(gen_job *j, sched_req **r, int *rc)
{
    gen_request *g = &j->g;
    pick_seed(g);
    sched_req_params rp = req_params(j->hr, g, j->toks, j->n_prompt, j->max_new, j->hints, j->n_hints);
    http_inflight_begin(j->hr);
    json_oom_take();
    int src = sched_submit(j->srv->sched, &rp, r, j->err, sizeof(j->err));
    if (src == SCHED_EINVAL && g->constraint && json_oom_take()) {
        /* the compiler's cJSON ran out of memory reading our own copy of
         * the schema: not the request's fault */
        *rc = errors_reply(j->hr, ERR_INTERNAL, "out of memory compiling the constraint");
        return true;
    }
    if (src == SCHED_EINVAL && g->constraint) {
        /* the constraint did not compile: name the field it came from */
        char msg[sizeof(j->err) + 40];
        err_extra x = {.param = g->constraint_param};
        snprintf(msg, sizeof(msg), "`%s`: %s", g->constraint_param, j->err);
        *rc = errors_send(j->hr, ERR_VALIDATION, msg, &x);
        return true;
    }
    if (src != 0) {
        *rc = errors_reply(j->hr, errors_of_sched(src), j->err);
        return true;
    }
    return false;
}

/* Collect the admitted r and answer one body: TGI's (an array of one for
 * POST /) or OpenAI's, with the x-* timing headers. */
static int answer_body(gen_job *j, sched_req *r)
{
    http_req *hr = j->hr;
    gen_result res = {0};
    int rc;
    if (stream_collect(hr, r, &res) < 0) {
        hr->failure = "cancelled";
        gen_result_free(&res);
        return -1;
    }
    sched_result sr;
    sched_req_result(r, &sr);
    hr->n_gen = sr.n_generated;
    hr->queue_ms = sr.queue_ms;
    hr->ttft_ms = sr.ttft_ms;
    hr->cache_bytes = sr.peak_cache_bytes;
    if (res.error) {
        rc = errors_reply(hr, res.error == SCHED_ECANCELLED  ? ERR_DRAINING
                              : res.error == SCHED_EDELETED ? ERR_CANCELLED
                              : res.error == SCHED_ENOMEM   ? ERR_INTERNAL     /* the server's fault: 500 */
                                                            : ERR_GENERATION,
                          res.message);
        gen_result_free(&res);
        return rc;
    }
    hr->finish = sched_finish_name(res.finish);
    cJSON *body;
    if (j->api == API_TGI) {
        body = tgi_response(j->srv, &j->g, &res, &sr, j->toks, j->n_prompt);
        if (body && j->compat) {
            cJSON *arr = cJSON_CreateArray();
            if (arr)
                json_push(arr, body);
            else
                cJSON_Delete(body);
            body = arr;
        }
    } else {
        body = oai_response(j->srv, hr, &j->g, &res, j->toks, j->n_prompt, &sr);
    }
    char h_prompt[24], h_gen[24], h_queue[32], h_inf[32], h_tpt[32], h_total[32], h_cache[32], h_cached[24];
    double total_ms = sr.total_ms, inf_ms = total_ms - sr.queue_ms;
    snprintf(h_prompt, sizeof(h_prompt), "%d", j->n_prompt);
    snprintf(h_gen, sizeof(h_gen), "%d", sr.n_generated);
    snprintf(h_queue, sizeof(h_queue), "%.0f", sr.queue_ms);
    snprintf(h_inf, sizeof(h_inf), "%.0f", inf_ms);
    snprintf(h_tpt, sizeof(h_tpt), "%.0f", sr.n_generated > 0 ? inf_ms / sr.n_generated : 0.0);
    snprintf(h_total, sizeof(h_total), "%.0f", total_ms);
    snprintf(h_cache, sizeof(h_cache), "%llu", (unsigned long long)sr.peak_cache_bytes);
    snprintf(h_cached, sizeof(h_cached), "%d", sr.cached_tokens);     /* the prefix cache's, as usage says */
    const char *hdrs[] = {"x-prompt-tokens", h_prompt, "x-generated-tokens", h_gen, "x-queue-time", h_queue,
                          "x-inference-time", h_inf, "x-time-per-token", h_tpt, "x-total-time", h_total,
                          "x-cached-tokens", h_cached, "x-cache-bytes", h_cache, NULL};
    rc = http_send_json(hr, 200, body, hdrs);
    gen_result_free(&res);
    return rc;
}

int generate_translated(http_req *hr, cJSON *chat, http_xlate *x)
{
    hr->xlate = x;
    char *body = chat ? cJSON_PrintUnformatted(chat) : NULL;
    cJSON_Delete(chat);
    if (!body)
        return errors_reply(hr, ERR_INTERNAL, "out of memory");
    free(hr->body);
    hr->body = body;
    hr->n_body = hr->cap_body = strlen(body);
    return generate_route(hr, API_OAI_CHAT, GEN_BODY);
}

int generate_count_tokens(http_req *hr, cJSON *chat, int *rc)
{
    gen_job job = {.hr = hr, .srv = hr->srv, .api = API_OAI_CHAT}, *j = &job;
    int n = -1;
    char *body = chat ? cJSON_PrintUnformatted(chat) : NULL;
    cJSON_Delete(chat);
    if (!body) {
        *rc = errors_reply(hr, ERR_INTERNAL, "out of memory");
        return -1;
    }
    free(hr->body);
    hr->body = body;
    hr->n_body = hr->cap_body = strlen(body);
    if (!read_request(j, GEN_BODY, rc) && !render_prompt(j, rc) && !prompt_tokens(j, rc))
        n = j->n_prompt;
    free(j->toks);
    free(j->content);
    json_gen_free(&j->g);
    return n;
}

/* The ids as a JSON array. */
static cJSON *ids_json(const int32_t *toks, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        json_push(a, cJSON_CreateNumber(toks[i]));
    return a;
}

int generate_render(http_req *hr, int api)
{
    gen_job job = {.hr = hr, .srv = hr->srv, .api = api}, *j = &job;
    int rc = 0;
    if (!errors_ready(hr))
        return 0;
    if (read_request(j, GEN_BODY, &rc))
        goto out;
    if (api == API_OAI_COMPLETION) {
        /* [{"token_ids": [...]}], one a prompt, as a batch would prefill them */
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; arr && i < (j->g.n_batch > 1 ? j->g.n_batch : 1); i++) {
            int32_t *toks = NULL;
            int n;
            if (j->g.n_batch > 1) {
                n = batch_tokens(j->srv, &j->g, i, &toks, j->err, sizeof j->err);
                if (n < 0) {
                    err_extra x = {.param = "prompt"};
                    cJSON_Delete(arr);
                    rc = errors_send(hr, ERR_VALIDATION, j->err, &x);
                    goto out;
                }
            } else {
                if (render_prompt(j, &rc) || prompt_tokens(j, &rc)) {
                    cJSON_Delete(arr);
                    goto out;
                }
                toks = j->toks;
                n = j->n_prompt;
                j->toks = NULL;
            }
            cJSON *o = cJSON_CreateObject();
            json_push(arr, o);
            if (o)
                json_put(o, "token_ids", ids_json(toks, n));
            free(toks);
        }
        rc = http_send_json(hr, 200, arr, NULL);
        goto out;
    }
    /* chat: {"token_ids": [...]}, the template, tools and all */
    if (render_prompt(j, &rc) || prompt_tokens(j, &rc))
        goto out;
    cJSON *o = cJSON_CreateObject();
    if (o)
        json_put(o, "token_ids", ids_json(j->toks, j->n_prompt));
    rc = http_send_json(hr, 200, o, NULL);
out:
    free(j->toks);
    free(j->content);
    json_gen_free(&j->g);
    return rc;
}

int generate_route(http_req *hr, int api, int mode)
{
    gen_job job = {.hr = hr, .srv = hr->srv, .api = api}, *j = &job;
    sched_req *r = NULL;
    int rc = 0;
    hr->generation = true;
    if (!errors_ready(hr))
        return 0;
    if (read_request(j, mode, &rc))
        goto out;
    if (j->g.n_batch > 1) {
        rc = handle_batch(hr, &j->g);
        goto out;
    }
    if (render_prompt(j, &rc) || prompt_tokens(j, &rc) || fit_context(j, &rc))
        goto out;
    if ((api == API_TGI ? j->g.best_of : j->g.n) > 1) {
        rc = handle_choices(hr, &j->g, j->toks, j->n_prompt, j->hints, j->n_hints, j->max_new, j->compat);
        goto out;
    }
    if (submit_one(j, &r, &rc) || wait_admitted(hr, r, api, j->n_prompt, &rc))
        goto out;
    if (j->g.stream) {
        rc = stream_start(hr, r, &j->g, j->toks, j->n_prompt);
        r = NULL;       /* the stream owns it now */
        goto out;
    }
    rc = answer_body(j, r);
out:
    sched_req_release(r);
    free(j->toks);
    free(j->content);
    json_gen_free(&j->g);
    return rc;
}

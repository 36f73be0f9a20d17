/* stream.c - scheduler events -> HTTP, with disconnect detection and SSE.
 *
 * Owns: stream_next_event (the request's eventfd and the client socket
 * watched together, so a closed socket is noticed while waiting; in a
 * handler the connection is suspended meanwhile), the
 * non-streaming collector, the SSE content reader (one frame per event,
 * handed to libmicrohttpd as soon as it exists, the connection suspended
 * while there is none (no thread waits on a stream), ": ping" after
 * --keepalive seconds of silence, an error event on mid-stream failure),
 * and the per-API frame shapes.
 * Does not own: admission or validation (done before the stream starts).
 * ref: docs/serving.md 2.3 (TGI events), 3.2 (OpenAI chunks),
 * 2.4 (headers, pings, disconnect).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault.h"
#include "chat.h"
#include "metrics.h"
#include "stream.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------------- */
/* Waiting for events                                                     */
/* ---------------------------------------------------------------------- */

int stream_next_event(http_req *hr, sched_req *r, sched_event *ev, int timeout_ms)
{
    double deadline = engine_now_s() + timeout_ms / 1e3;
    for (;;) {
        int have = sched_req_next(r, ev, 0);
        if (http_peer_gone(hr)) {
            if (have)
                sched_event_clear(ev);
            sched_req_cancel(r);
            return -1;
        }
        if (have)
            return 1;
        if (engine_now_s() >= deadline)
            return 0;
        /* in a handler: the connection is suspended meanwhile (http.h) */
        int fd = sched_req_event_fd(r);
        http_wait(hr, &fd, 1, deadline);
    }
}

const char *stream_oai_finish(int finish)
{
    return finish == SCHED_FINISH_LENGTH ? "length" : "stop";
}

/* ---------------------------------------------------------------------- */
/* Non-streaming                                                          */
/* ---------------------------------------------------------------------- */

void gen_result_free(gen_result *res)
{
    if (!res)
        return;
    free(res->text);
    free(res->toks);
    lp_list_free(&res->lp);
    lp_list_free(&res->prompt_lp);
    memset(res, 0, sizeof(*res));
}

int stream_collect(http_req *hr, sched_req *r, gen_result *res)
{
    sched_event ev;
    for (;;) {
        int rc = stream_next_event(hr, r, &ev, 1000);
        if (rc < 0)
            return -1;
        if (rc == 0)
            continue;
        if (ev.kind == SCHED_EV_ERROR) {
            res->error = ev.error ? ev.error : SCHED_EENGINE;
            snprintf(res->message, sizeof(res->message), "%s", ev.message);
            return 0;
        }
        if (ev.kind == SCHED_EV_PROMPT) {
            if (lp_list_push(&res->prompt_lp, ev.token, ev.logprob, false, &ev.top))
                goto out_nomem;
            continue;
        }
        if (ev.kind != SCHED_EV_TOKEN)
            continue;
        if (lp_list_push(&res->lp, ev.token, ev.logprob, ev.special, &ev.top))
            goto out_nomem;
        if (res->n_toks == res->cap_toks) {
            int cap = res->cap_toks ? res->cap_toks * 2 : 64;
            gen_token *t = fault_realloc(res->toks, (size_t)cap * sizeof(*t));
            if (!t)
                goto out_nomem;
            res->toks = t;
            res->cap_toks = cap;
        }
        if (res->n_toks > 0 && res->t_last > 0)
            metrics_observe_itl(hr->srv->m, ev.t - res->t_last);
        res->t_last = ev.t;
        gen_token *t = &res->toks[res->n_toks++];
        t->id = ev.token;
        t->logprob = ev.logprob;
        t->special = ev.special;
        t->off = res->len;
        t->len = ev.text_len;
        if (json_buf_append(&res->text, &res->len, &res->cap, ev.text ? ev.text : "", ev.text_len))
            goto out_nomem;
        bool final = ev.final;
        res->finish = ev.finish;
        res->stop_index = ev.stop_index;
        sched_event_clear(&ev);
        if (final)
            return 0;
    }
out_nomem:
    sched_event_clear(&ev);
    sched_req_cancel(r);
    res->error = SCHED_ENOMEM;
    snprintf(res->message, sizeof(res->message), "out of memory while collecting the generation");
    return 0;
}

/* ---------------------------------------------------------------------- */
/* SSE                                                                    */
/* ---------------------------------------------------------------------- */

/* One streaming response. Owned by libmicrohttpd's response (freed in
 * stream_free on the connection's thread). */
typedef struct stream {
    http_req *hr;               /* holds one reference */
    sched_req *r;
    gen_request g;
    int n_prompt;
    int index;                  /* TGI: events sent, from 1 */
    int n_gen;
    char *out;                  /* [n_out] bytes framed, not yet handed to MHD, from off_out */
    size_t n_out, off_out, cap_out;
    char *text;                 /* [n_text] generated text so far (TGI generated_text) */
    size_t n_text, cap_text;
    bool done;                  /* the last frame is in out */
    bool ok;                    /* ended with a final token */
    bool gone;                  /* the client went away */
    int error;                  /* enum sched_status of the error event that ended it; 0 if none */
    int finish;
    const char *stop_reason;    /* the stop string that ended it (vLLM's stop_reason), or NULL */
    int keepalive_ms;
    double ping_at;             /* engine_now_s() of the next ": ping" unless an event comes first */
    char oai_id[128];
    long long created;
    const char *model;
    double t_last;              /* when the previous token was sampled (ITL metric) */
    lp_list pend;               /* logprobs: tokens not yet sent in a chunk */
    lp_list prompt_lp;          /* completions echo: the prompt's tokens, logprobs from PROMPT events */
    bool echoed;                /* completions echo: the prompt chunk was sent */
    size_t text_off;            /* completions logprobs: text_offset of the next token */
    int think;                  /* chat: enum think_state, splitting <think>...</think> off the content */
    char hold[64];              /* chat: bytes held back until they are known to be a tag or not */
    size_t n_hold;
    char *tc;                   /* chat with tools: [n_tc] content from "<tool_call>" on (or a prefix of it) */
    size_t n_tc, cap_tc;
    bool tc_open;               /* a "<tool_call>" has begun: everything after is held for the parser */
    bool tc_sent;               /* tool_calls deltas went out: finish_reason is tool_calls (tool_finish) */
    int choice;                 /* OpenAI choices[].index of this stream's chunks */
    bool kid;                   /* one choice of a multi-choice stream: g is the parent's, no [DONE] */
    struct stream *kids;        /* [n_kids] OpenAI n > 1: the choices, interleaved into this one's out */
    int n_kids;
    int next_kid;               /* n > 1: the choice looked at first for the next event (round robin) */
    const char *tail;           /* out of memory: the static last frame sent instead of out, from off_tail */
    size_t n_tail, off_tail;
} stream;

static cJSON *oai_base(stream *st, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", st->oai_id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)st->created);
    cJSON_AddStringToObject(o, "model", st->model);
    cJSON_AddStringToObject(o, "system_fingerprint", st->hr->srv->fingerprint);
    return o;
}

static cJSON *usage_obj(int n_prompt, int n_gen)
{
    cJSON *u = cJSON_CreateObject();
    if (!u)
        return NULL;
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + n_gen);
    return u;
}

/* One event (takes o); another API's route frames it its own way. */
static int frame(stream *st, cJSON *o, bool space)
{
    const http_xlate *x = st->hr->xlate;
    if (x && x->event) {
        int rc = o ? x->event(st->hr, o, &st->out, &st->n_out, &st->cap_out) : -1;
        cJSON_Delete(o);
        return rc;
    }
    return json_sse_frame(o, space, &st->out, &st->n_out, &st->cap_out);
}

static const char done_frame[] = "data: [DONE]\n\n";

static int frame_raw(stream *st, const char *s)
{
    const http_xlate *x = st->hr->xlate;
    if (x && x->event && !strcmp(s, done_frame))
        return x->event(st->hr, NULL, &st->out, &st->n_out, &st->cap_out);
    return json_buf_append(&st->out, &st->n_out, &st->cap_out, s, strlen(s));
}

/* choices[0].logprobs of a chunk: the tokens pending since the last chunk
 * (then cleared), or null. */
static cJSON *oai_chunk_logprobs(stream *st, bool with_lp)
{
    if (!with_lp || !st->g.logprobs)
        return cJSON_CreateNull();
    const engine *e = st->hr->srv->eng;
    cJSON *lp = st->g.api == API_OAI_CHAT
                    ? lp_oai_chat(e, st->pend.v, st->pend.n)
                    : lp_oai_completion(e, st->pend.v, st->pend.n, st->g.top_logprobs > 0, st->text_off, &st->text_off);
    st->pend.n = 0;
    return lp;
}

/* An OpenAI chunk with one choice: text (completion) or delta (chat)
 * under field; with_lp carries the pending logprobs. */
static int oai_chunk_field(stream *st, const char *field, const char *text, size_t len, const char *finish,
                           bool role, bool with_lp);

static int oai_chunk(stream *st, const char *text, size_t len, const char *finish, bool role, bool with_lp)
{
    return oai_chunk_field(st, "content", text, len, finish, role, with_lp);
}

/* ---- reasoning: Qwen3's <think>...</think> streamed as reasoning_content ---- */

enum think_state {
    THINK_START = 0,            /* nothing decided: the output may open with <think> */
    THINK_IN = 1,               /* inside the reasoning */
    THINK_AFTER = 2,            /* after </think>: newlines before the content are dropped */
    THINK_CONTENT = 3,          /* plain content */
    THINK_OPENED = 4,           /* after <think>: newlines before the reasoning are dropped */
};

static const char think_open[] = "<think>", think_close[] = "</think>";

/* Longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t tag_prefix_suffix(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

static int tool_content(stream *st, const char *s, size_t n);

static int emit_if(stream *st, const char *field, const char *s, size_t n)
{
    if (n && !strcmp(field, "content") && st->g.tools && st->g.tool_choice != TOOL_CHOICE_NONE)
        return tool_content(st, s, n);
    return n ? oai_chunk_field(st, field, s, n, NULL, false, true) : 0;
}

/* ---- tool calls: "<tool_call>" (Llama 3.1: {"name") and what follows never reach content ---- */

/* Content of a chat with tools: streamed until a "<tool_call>" begins
 * (a possible start of one is held), then held whole for tool_flush. */
static int tool_content(stream *st, const char *s, size_t n)
{
    if (json_buf_append(&st->tc, &st->n_tc, &st->cap_tc, s, n))
        return -1;
    if (st->tc_open)
        return 0;
    const char *tc_open_tag = chat_tool_tag(st->hr->srv->chat_kind);
    const char *at = memmem(st->tc, st->n_tc, tc_open_tag, strlen(tc_open_tag));
    size_t free_n = at ? (size_t)(at - st->tc) : st->n_tc - tag_prefix_suffix(st->tc, st->n_tc, tc_open_tag);
    st->tc_open = at != NULL;
    int rc = free_n ? oai_chunk_field(st, "content", st->tc, free_n, NULL, false, true) : 0;
    memmove(st->tc, st->tc + free_n, st->n_tc - free_n);
    st->n_tc -= free_n;
    return rc;
}

/* At the end: the held text as tool_calls deltas (for each call one chunk
 * with its index, id, type and name, then one with its arguments), or as
 * content when it does not parse as calls. */
static int tool_flush(stream *st)
{
    if (st->n_tc == 0)
        return 0;
    cJSON *calls = NULL;
    size_t clen;
    int n = st->tc_open ? chat_parse_tool_calls(st->hr->srv->chat_kind, st->tc, st->n_tc, st->hr->id, &clen, &calls) : 0;
    int rc = 0;
    if (!calls) {
        rc = oai_chunk_field(st, "content", st->tc, st->n_tc, NULL, false, true);
    } else if (n > 0) {
        int i = 0;
        for (const cJSON *c = calls->child; c && rc == 0; c = c->next, i++) {
            for (int part = 0; part < 2 && rc == 0; part++) {
                cJSON *o = oai_base(st, "chat.completion.chunk");
                cJSON *ch = cJSON_CreateObject(), *d = NULL, *arr = NULL, *t = NULL, *fn = NULL;
                json_push(cJSON_AddArrayToObject(o, "choices"), ch);
                cJSON_AddNumberToObject(ch, "index", st->choice);
                d = cJSON_AddObjectToObject(ch, "delta");
                arr = cJSON_AddArrayToObject(d, "tool_calls");
                t = cJSON_CreateObject();
                json_push(arr, t);
                cJSON_AddNumberToObject(t, "index", i);
                const cJSON *cfn = cJSON_GetObjectItemCaseSensitive(c, "function");
                if (part == 0) {
                    cJSON_AddStringToObject(t, "id", cJSON_GetObjectItemCaseSensitive(c, "id")->valuestring);
                    cJSON_AddStringToObject(t, "type", "function");
                }
                fn = cJSON_AddObjectToObject(t, "function");
                if (part == 0) {
                    cJSON_AddStringToObject(fn, "name", cJSON_GetObjectItemCaseSensitive(cfn, "name")->valuestring);
                    cJSON_AddStringToObject(fn, "arguments", "");
                } else {
                    cJSON_AddStringToObject(fn, "arguments",
                                            cJSON_GetObjectItemCaseSensitive(cfn, "arguments")->valuestring);
                }
                cJSON_AddNullToObject(ch, "logprobs");
                cJSON_AddNullToObject(ch, "finish_reason");
                if (st->g.include_usage)
                    cJSON_AddNullToObject(o, "usage");
                rc = o && ch ? frame(st, o, true) : -1;
            }
        }
        st->tc_sent = rc == 0;
    }
    cJSON_Delete(calls);
    st->n_tc = 0;
    return rc;
}

/* Feeds generated bytes through the <think> splitter: reasoning goes out
 * as delta.reasoning_content, the rest as delta.content; a possible tag cut
 * across pieces is held back (final: flushed). The same split as
 * chat_split_reasoning on the whole text, except that a reasoning whose
 * opening tag was in the prompt streams as content. */
static int think_feed(stream *st, const char *text, size_t len, bool final)
{
    char *buf = fault_malloc(st->n_hold + len + 1);
    if (!buf)
        return -1;
    memcpy(buf, st->hold, st->n_hold);
    memcpy(buf + st->n_hold, text, len);
    size_t n = st->n_hold + len, at = 0;
    int rc = 0;
    st->n_hold = 0;
    while (rc == 0 && at < n) {
        const char *s = buf + at;
        size_t left = n - at;
        if (st->think == THINK_START) {
            size_t ws = 0;
            while (ws < left && (s[ws] == ' ' || s[ws] == '\n' || s[ws] == '\r' || s[ws] == '\t'))
                ws++;
            size_t k = left - ws < sizeof think_open - 1 ? left - ws : sizeof think_open - 1;
            if (memcmp(s + ws, think_open, k)) {
                st->think = THINK_CONTENT;
            } else if (k == sizeof think_open - 1) {
                st->think = THINK_OPENED;
                at += ws + k;
            } else {
                break;          /* a prefix of "<think>" so far: hold it */
            }
        } else if (st->think == THINK_IN) {
            const char *close = memmem(s, left, think_close, sizeof think_close - 1);
            size_t end = close ? (size_t)(close - s) : left - tag_prefix_suffix(s, left, think_close);
            size_t keep = end;
            while (keep > 0 && s[keep - 1] == '\n')
                keep--;         /* newlines before </think> are not reasoning */
            rc = emit_if(st, "reasoning_content", s, keep);
            if (close) {
                st->think = THINK_AFTER;
                at += end + sizeof think_close - 1;
            } else {
                at += keep;
                break;          /* hold the newlines and a partial tag */
            }
        } else if (st->think == THINK_AFTER || st->think == THINK_OPENED) {
            while (at < n && buf[at] == '\n')
                at++;
            if (at < n)
                st->think = st->think == THINK_AFTER ? THINK_CONTENT : THINK_IN;
        } else {
            rc = emit_if(st, "content", s, left);
            at = n;
        }
    }
    if (rc == 0 && at < n) {
        if (final || n - at > sizeof st->hold) {
            /* the end, or no tag can be this long: what is held is text */
            bool in = st->think == THINK_IN || st->think == THINK_OPENED;
            const char *field = in ? "reasoning_content" : "content";
            size_t k = n - at;
            while (in && final && k > 0 && buf[at + k - 1] == '\n')
                k--;
            rc = emit_if(st, field, buf + at, k);
            if (st->think == THINK_START)
                st->think = THINK_CONTENT;
        } else {
            memcpy(st->hold, buf + at, n - at);
            st->n_hold = n - at;
        }
    }
    free(buf);
    return rc;
}

static int oai_chunk_field(stream *st, const char *field, const char *text, size_t len, const char *finish,
                           bool role, bool with_lp)
{
    bool chat = st->g.api == API_OAI_CHAT;
    cJSON *o = oai_base(st, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    if (!o || !choices || !c) {
        cJSON_Delete(o);
        cJSON_Delete(c);
        return -1;
    }
    json_push(choices, c);
    cJSON_AddNumberToObject(c, "index", st->choice);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (text)
            json_add_text(d, field, text, len);
    } else {
        json_add_text(c, "text", text ? text : "", text ? len : 0);
    }
    json_put(c, "logprobs", oai_chunk_logprobs(st, with_lp));
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (finish && st->stop_reason)
        cJSON_AddStringToObject(c, "stop_reason", st->stop_reason);
    if (st->g.include_usage)
        cJSON_AddNullToObject(o, "usage");
    return frame(st, o, true);
}

static int on_event_tgi(stream *st, const sched_event *ev)
{
    cJSON *o = cJSON_CreateObject(), *tok = cJSON_CreateObject();
    if (!o || !tok) {
        cJSON_Delete(o);
        cJSON_Delete(tok);
        return -1;
    }
    cJSON_AddNumberToObject(o, "index", ++st->index);
    json_put(o, "token", tok);
    cJSON_AddNumberToObject(tok, "id", ev->token);
    json_add_text(tok, "text", ev->text ? ev->text : "", ev->text_len);
    cJSON_AddNumberToObject(tok, "logprob", ev->logprob);
    cJSON_AddBoolToObject(tok, "special", ev->special);
    if (st->g.top_logprobs > 0)
        json_put(o, "top_tokens", lp_tgi_top(st->hr->srv->eng, &ev->top));
    if (!ev->final) {
        cJSON_AddNullToObject(o, "generated_text");
        cJSON_AddNullToObject(o, "details");
        return frame(st, o, false);
    }
    char *full = NULL;
    size_t fl = 0, fc = 0;
    if (st->g.return_full_text && json_buf_append(&full, &fl, &fc, st->g.prompt, strlen(st->g.prompt)))
        goto out_nomem;
    if (json_buf_append(&full, &fl, &fc, st->text ? st->text : "", st->n_text))
        goto out_nomem;
    json_add_text(o, "generated_text", full, fl);
    free(full);
    if (st->g.details) {
        cJSON *d = cJSON_AddObjectToObject(o, "details");
        cJSON_AddStringToObject(d, "finish_reason", sched_finish_name(ev->finish));
        cJSON_AddNumberToObject(d, "generated_tokens", st->n_gen);
        if (st->g.sp.greedy)
            cJSON_AddNullToObject(d, "seed");
        else
            json_add_u64(d, "seed", st->g.sp.seed);
        cJSON_AddNumberToObject(d, "input_length", st->n_prompt);
        sched_result pr;
        sched_req_result(st->r, &pr);
        cJSON_AddNumberToObject(d, "cached_tokens", pr.cached_tokens);     /* hyserve: prefix cache */
        json_add_speculative(d, st->g.has_prediction, pr.spec.pred_accepted, pr.spec.pred_rejected, pr.spec.drafts,
                             pr.spec.drafted, pr.spec.accepted);
    } else {
        cJSON_AddNullToObject(o, "details");
    }
    if (st->g.return_usage) {
        sched_result res;
        sched_req_result(st->r, &res);
        cJSON *u = usage_obj(st->n_prompt, st->n_gen);
        json_put(o, "usage", u);
        cJSON_AddNumberToObject(u, "cached_tokens", res.cached_tokens);
        json_add_speculative(u, st->g.has_prediction, res.spec.pred_accepted, res.spec.pred_rejected, res.spec.drafts,
                             res.spec.drafted, res.spec.accepted);
        cJSON *cache = cJSON_AddObjectToObject(u, "cache");
        cJSON_AddNumberToObject(cache, "attn_kv_bytes", (double)res.kv_bytes);
        cJSON_AddNumberToObject(cache, "recurrent_state_bytes", (double)res.state_bytes);
        cJSON_AddNumberToObject(cache, "peak_total_bytes", (double)res.peak_cache_bytes);
    }
    return frame(st, o, false);
out_nomem:
    free(full);
    cJSON_Delete(o);
    return -1;
}

/* Completions echo: one chunk with the prompt's text (and, with logprobs,
 * its tokens' logprobs) before the first generated text. */
static int oai_echo_chunk(stream *st)
{
    const engine *e = st->hr->srv->eng;
    char *text = NULL;
    size_t tl = 0, tc = 0;
    int rc = -1;
    st->echoed = true;
    if (st->g.prompt) {
        if (json_buf_append(&text, &tl, &tc, st->g.prompt, strlen(st->g.prompt)))
            goto out;
    } else {
        for (int i = 0; i < st->prompt_lp.n; i++) {
            char b[256];
            int n = tok_piece(engine_tokenizer(e), st->prompt_lp.v[i].id, b, sizeof(b));
            if (n > 0 && json_buf_append(&text, &tl, &tc, b, (size_t)n < sizeof(b) ? (size_t)n : sizeof(b)))
                goto out;
        }
    }
    lp_list gen = st->pend;     /* tokens already drawn wait for the next chunk */
    st->pend = st->prompt_lp;
    rc = oai_chunk(st, text ? text : "", tl, NULL, false, st->g.prompt_logprobs);
    st->prompt_lp = st->pend;
    st->pend = gen;
out:
    free(text);
    return rc;
}

/* The end of an OpenAI stream: with include_usage a chunk with empty
 * choices and the usage (n_gen generated tokens; cached tokens those of
 * r, the first choice's), then [DONE]. */
static int oai_end(stream *st, int n_gen, sched_req *r)
{
    if (st->g.include_usage) {
        cJSON *o = oai_base(st, st->g.api == API_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
        if (!o)
            return -1;
        cJSON_AddArrayToObject(o, "choices");
        sched_result res;
        sched_req_result(r, &res);
        cJSON *u = json_add_cached_tokens(usage_obj(st->n_prompt, n_gen), res.cached_tokens);
        json_add_speculative(u, st->g.has_prediction, res.spec.pred_accepted, res.spec.pred_rejected, res.spec.drafts,
                             res.spec.drafted, res.spec.accepted);
        json_put(o, "usage", u);
        if (frame(st, o, true))
            return -1;
    }
    return frame_raw(st, done_frame);
}

/* A chat's finish_reason: tool_calls when calls went out and the model
 * ended its turn (cut by max_tokens it stays length). */
static const char *tool_finish(const stream *st, const sched_event *ev, const char *fin)
{
    return st->tc_sent && ev->finish != SCHED_FINISH_LENGTH ? "tool_calls" : fin;
}

static int on_event_oai(stream *st, const sched_event *ev)
{
    if (st->g.echo && !st->echoed && oai_echo_chunk(st))
        return -1;
    if (ev->text_len > 0 || ev->final) {
        const char *fin = ev->final ? stream_oai_finish(ev->finish) : NULL;
        if (st->g.api == API_OAI_CHAT && (ev->text_len > 0 || st->n_hold > 0)) {
            /* chat: reasoning and content (split by think_feed), then an
             * empty delta carrying finish_reason (and the logprobs of
             * tokens no chunk has carried yet) */
            if (think_feed(st, ev->text ? ev->text : "", ev->text_len, ev->final))
                return -1;
            if (ev->final && tool_flush(st))
                return -1;
            if (ev->final && oai_chunk(st, NULL, 0, tool_finish(st, ev, fin), false, st->pend.n > 0))
                return -1;
        } else if (st->g.api == API_OAI_CHAT && ev->final) {
            if (tool_flush(st) || oai_chunk(st, NULL, 0, tool_finish(st, ev, fin), false, st->pend.n > 0))
                return -1;
        } else if (oai_chunk(st, ev->text ? ev->text : "", ev->text_len, fin, false, true)) {
            return -1;
        }
    }
    if (!ev->final || st->kid)
        return 0;
    return oai_end(st, st->n_gen, st->r);
}

static int on_error(stream *st, const sched_event *ev)
{
    bool cancelled = ev->error == SCHED_ECANCELLED || ev->error == SCHED_EDELETED;
    const char *type = cancelled ? "cancelled" : "generation";
    if (st->g.api == API_TGI)
        return frame(st, json_error_tgi(ev->message, type), false);
    if (frame(st, json_error_oai(ev->message, "server_error", NULL, type), true))
        return -1;
    return frame_raw(st, done_frame);
}

/* Turn one event into frames. Returns 0 or -1 (out of memory). */
static int on_event(stream *st, sched_event *ev)
{
    if (ev->kind == SCHED_EV_ERROR) {
        st->done = true;
        st->error = ev->error;
        return on_error(st, ev);
    }
    if (ev->kind == SCHED_EV_PROMPT) {
        /* completions echo: prompt_lp holds every prompt token, position 0 first */
        if (ev->pos >= 1 && ev->pos < st->prompt_lp.n) {
            st->prompt_lp.v[ev->pos].logprob = ev->logprob;
            st->prompt_lp.v[ev->pos].top = ev->top;
        }
        return 0;
    }
    if (ev->kind != SCHED_EV_TOKEN)
        return 0;
    if (st->g.logprobs && !ev->special && lp_list_push(&st->pend, ev->token, ev->logprob, false, &ev->top))
        return -1;
    if (st->n_gen > 0 && st->t_last > 0)
        metrics_observe_itl(st->hr->srv->m, ev->t - st->t_last);
    st->t_last = ev->t;
    st->n_gen++;
    if (ev->text_len && json_buf_append(&st->text, &st->n_text, &st->cap_text, ev->text, ev->text_len))
        return -1;
    if (ev->final) {
        st->done = true;
        st->ok = true;
        st->finish = ev->finish;
        if (ev->finish == SCHED_FINISH_STOP && ev->stop_index >= 0 && ev->stop_index < st->g.n_stop)
            st->stop_reason = st->g.stop[ev->stop_index];
    }
    return st->g.api == API_TGI ? on_event_tgi(st, ev) : on_event_oai(st, ev);
}

/* Nothing to send before st->ping_at unless one of fds[0..n) becomes
 * readable: suspend the connection (true: the reader returns 0 and is
 * called again on a wake-up), or, when it cannot be, wait here. */
static bool park_stream(stream *st, const int *fds, int n)
{
    if (http_park(st->hr, fds, n, st->ping_at) == 0)
        return true;
    http_wait(st->hr, fds, n, st->ping_at);
    return false;
}

/* n > 1: take an event of any unfinished choice, turn it into that
 * choice's frames and move them to st's out. Returns 1 with frames (or
 * none: look again), 2 when the connection was suspended until one may
 * come, 0 when a ping is due, -1 when the client went away or out of
 * memory (every choice is then cancelled). */
static int multi_next(stream *st)
{
    int p[JSON_MAX_BATCH];
    int np = 0;
    bool ended = true;
    for (int i = 0; i < st->n_kids; i++) {
        /* round robin from the choice after the last one served, so a
         * reader that comes back to many queued events still interleaves
         * them (the first choice would otherwise be drained first) */
        const int k = (st->next_kid + i) % st->n_kids;
        stream *c = &st->kids[k];
        if (c->done)
            continue;
        ended = false;
        sched_event ev;
        if (sched_req_next(c->r, &ev, 0)) {
            st->next_kid = (k + 1) % st->n_kids;
            int rc = on_event(c, &ev);
            sched_event_clear(&ev);
            if (rc == 0 && c->error) {         /* a choice failed: the stream ends with its error */
                st->done = true;
                st->error = c->error;
            }
            if (rc == 0 && c->n_out)
                rc = json_buf_append(&st->out, &st->n_out, &st->cap_out, c->out, c->n_out);
            c->n_out = 0;
            return rc ? -1 : 1;
        }
        if (np < JSON_MAX_BATCH)
            p[np++] = sched_req_event_fd(c->r);
    }
    if (ended) {
        int n_gen = 0;
        st->done = st->ok = true;
        for (int k = 0; k < st->n_kids; k++)
            n_gen += st->kids[k].n_gen;
        st->finish = st->kids[0].finish;
        return oai_end(st, n_gen, st->kids[0].r) ? -1 : 1;
    }
    if (http_peer_gone(st->hr)) {
        st->gone = true;
        return -1;
    }
    if (engine_now_s() >= st->ping_at)
        return 0;
    return park_stream(st, p, np) ? 2 : 1;
}

static void multi_cancel(stream *st)
{
    for (int k = 0; k < st->n_kids; k++)
        sched_req_cancel(st->kids[k].r);
}

/* Up to max bytes of src[*off .. n) into buf, *off moved past them. */
static ssize_t hand_out(const char *src, size_t n, size_t *off, char *buf, size_t max)
{
    size_t k = n - *off;
    if (k > max)
        k = max;
    memcpy(buf, src + *off, k);
    *off += k;
    return (ssize_t)k;
}

/* The frames of the events, into buf; HTTP_STREAM_ERROR
 * when the client went away (st->gone) or memory ran out. */
static ssize_t read_frames(stream *st, char *buf, size_t max)
{
    while (st->n_kids && st->off_out == st->n_out) {
        if (st->done)
            return HTTP_STREAM_END;
        st->n_out = st->off_out = 0;
        int rc = multi_next(st);
        if (rc < 0) {
            multi_cancel(st);
            return HTTP_STREAM_ERROR;
        }
        if (rc == 2)
            return 0;       /* suspended: called again on a wake-up */
        if (rc == 0 && frame_raw(st, ": ping\n\n"))
            return HTTP_STREAM_ERROR;
        if (rc == 0 || st->n_out)
            st->ping_at = engine_now_s() + st->keepalive_ms / 1e3;
    }
    while (st->off_out == st->n_out) {
        if (st->done)
            return HTTP_STREAM_END;
        st->n_out = st->off_out = 0;
        sched_event ev;
        int rc = stream_next_event(st->hr, st->r, &ev, 0);
        if (rc < 0) {
            st->gone = true;
            return HTTP_STREAM_ERROR;
        }
        double now = engine_now_s();
        if (rc == 0 && now >= st->ping_at) {
            st->ping_at = now + st->keepalive_ms / 1e3;
            if (frame_raw(st, ": ping\n\n"))
                return HTTP_STREAM_ERROR;
            continue;
        }
        if (rc == 0) {
            int fd = sched_req_event_fd(st->r);
            if (park_stream(st, &fd, 1))
                return 0;   /* suspended: called again on a wake-up */
            continue;
        }
        st->ping_at = now + st->keepalive_ms / 1e3;
        rc = on_event(st, &ev);
        sched_event_clear(&ev);
        if (rc) {
            sched_req_cancel(st->r);
            return HTTP_STREAM_ERROR;
        }
    }
    return hand_out(st->out, st->n_out, &st->off_out, buf, max);
}

/* Memory ran out framing an event (or a ping): every choice is cancelled,
 * what was framed of that event (out holds nothing else then) is dropped,
 * and the stream ends with an error event made of static bytes. */
static void end_out_of_memory(stream *st)
{
    static const char tgi[] = "data:{\"error\":\"out of memory\",\"error_type\":\"generation\"}\n\n";
    static const char oai[] = "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":\"generation\"}}\n\ndata: [DONE]\n\n";
    if (st->n_kids)
        multi_cancel(st);
    else
        sched_req_cancel(st->r);
    st->n_out = st->off_out = 0;
    st->done = true;
    st->ok = false;
    st->tail = st->g.api == API_TGI ? tgi : oai;
    st->n_tail = strlen(st->tail);
    st->off_tail = 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *st = cls;
    if (!st->tail) {
        json_oom_take();        /* nothing from the thread's earlier work carries over */
        ssize_t n = read_frames(st, buf, max);
        if (n != HTTP_STREAM_ERROR || st->gone)
            return n;
        end_out_of_memory(st);
    }
    if (st->off_tail == st->n_tail)
        return HTTP_STREAM_END;
    return hand_out(st->tail, st->n_tail, &st->off_tail, buf, max);
}

/* Frees what st owns of itself (not st, not g unless own_g). */
static void stream_clear(stream *st, bool own_g)
{
    sched_req_release(st->r);
    if (own_g)
        json_gen_free(&st->g);
    free(st->out);
    free(st->text);
    lp_list_free(&st->pend);
    lp_list_free(&st->prompt_lp);
    free(st->tc);
    for (int k = 0; k < st->n_kids; k++)
        stream_clear(&st->kids[k], false);
    free(st->kids);
}

static void stream_free(void *cls)
{
    stream *st = cls;
    http_req *hr = st->hr;
    sched_result res;
    sched_req_result(st->n_kids ? st->kids[0].r : st->r, &res);
    hr->n_prompt = res.n_prompt;
    hr->n_gen = res.n_generated;
    for (int k = 1; k < st->n_kids; k++) {
        sched_result rk;
        sched_req_result(st->kids[k].r, &rk);
        hr->n_gen += rk.n_generated;
    }
    hr->queue_ms = res.queue_ms;
    hr->ttft_ms = res.ttft_ms;
    hr->cache_bytes = res.peak_cache_bytes;
    if (st->ok)
        hr->finish = sched_finish_name(st->finish);
    else if (!hr->failure)
        hr->failure = st->gone || !st->done || st->error == SCHED_ECANCELLED || st->error == SCHED_EDELETED
                          ? "cancelled"
                          : "generation";
    stream_clear(st, true);
    free(st);
    http_req_unref(hr);
}

/* The fields of one stream of r, sharing g's contents (shallow). */
static int stream_setup(stream *st, http_req *hr, sched_req *r, const gen_request *g, const int32_t *prompt,
                        int n_prompt)
{
    st->hr = hr;
    st->r = r;
    st->g = *g;
    st->n_prompt = n_prompt;
    for (int i = 0; st->g.echo && i < n_prompt; i++)
        if (lp_list_push(&st->prompt_lp, prompt[i], NAN, false, NULL))
            return -1;
    double ka = hr->srv->cfg->keepalive;
    st->keepalive_ms = ka > 0 ? (int)(ka * 1e3) : 15000;
    if (st->keepalive_ms < 10)
        st->keepalive_ms = 10;
    st->ping_at = engine_now_s() + st->keepalive_ms / 1e3;
    st->created = (long long)time(NULL);
    st->model = st->g.model[0] ? st->g.model : server_model_name(hr->srv);
    snprintf(st->oai_id, sizeof(st->oai_id), "%s-%s", st->g.api == API_OAI_CHAT ? "chatcmpl" : "cmpl", hr->id);
    /* chat streams open with the assistant role, so the client sees bytes
     * (and the role) before the first token */
    if (st->g.api == API_OAI_CHAT && !st->n_kids && oai_chunk(st, "", 0, NULL, true, false))
        return -1;
    return 0;
}

/* No memory to start the stream: a 500 in the API's shape, from static
 * bytes (nothing was sent yet). */
static int start_failed(http_req *hr, int api)
{
    static const char tgi[] = "{\"error\":\"out of memory starting the stream\",\"error_type\":\"internal\"}";
    static const char oai[] = "{\"error\":{\"message\":\"out of memory starting the stream\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":null}}";
    const char *b = api == API_TGI ? tgi : oai;
    return http_send(hr, 500, "application/json", b, strlen(b), NULL);
}

int stream_start_n(http_req *hr, sched_req **r, int n, gen_request *g, const int32_t *prompt, int n_prompt)
{
    const int api = g->api;
    stream *st = fault_calloc(1, sizeof(*st));
    stream *kids = n > 1 ? fault_calloc((size_t)n, sizeof(*kids)) : NULL;
    if (!st || (n > 1 && !kids)) {
        for (int k = 0; k < n; k++)
            sched_req_release(r[k]);
        free(st);
        free(kids);
        json_gen_free(g);
        return start_failed(hr, api);
    }
    st->kids = kids;
    st->n_kids = kids ? n : 0;
    for (int k = 0; kids && k < n; k++) {
        kids[k].kid = true;
        kids[k].choice = k;
        kids[k].r = r[k];
    }
    int rc = stream_setup(st, hr, kids ? NULL : r[0], g, prompt, n_prompt);
    memset(g, 0, sizeof(*g));
    for (int k = 0; rc == 0 && kids && k < n; k++) {
        rc = stream_setup(&kids[k], hr, r[k], &st->g, prompt, n_prompt);
        if (rc == 0 && kids[k].n_out)
            rc = json_buf_append(&st->out, &st->n_out, &st->cap_out, kids[k].out, kids[k].n_out);
        kids[k].n_out = 0;
    }
    if (rc)
        goto out_free;

    static const char *const hdrs[] = {"Cache-Control", "no-cache", "X-Accel-Buffering", "no", NULL};
    int qrc = http_send_stream(hr, 200, "text/event-stream", hdrs, stream_read, stream_free, st);
    if (qrc != -2)
        return qrc;     /* stream_free runs when MHD is done with it */

out_free:
    stream_clear(st, true);
    free(st);
    return start_failed(hr, api);
}

int stream_start(http_req *hr, sched_req *r, gen_request *g, const int32_t *prompt, int n_prompt)
{
    return stream_start_n(hr, &r, 1, g, prompt, n_prompt);
}

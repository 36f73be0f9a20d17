/* anthropic.c - Anthropic's Messages API, POST /v1/messages and
 * /v1/messages/count_tokens, over the chat flow (see anthropic.h).
 *
 * Owns: reading a Messages body into a chat-completions body (system,
 * content blocks, tool_use / tool_result, tools, tool_choice,
 * stop_sequences, thinking), the message object of the answer, the
 * stream's events (message_start, content_block_start / _delta / _stop,
 * message_delta, message_stop) made from the chat stream's chunks, and
 * errors in Anthropic's envelope.
 * Does not own: the generation flow (generate.c), templates and tool-call
 * parsing (chat.c), the x-api-key check (routes.c, auth.c).
 * ref: docs/serving.md 3.8.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "anthropic.h"
#include "errors.h"
#include "generate.h"
#include "json.h"

typedef struct msg_state {
    char id[96];                /* msg_<request id> */
    char model[128];
    /* the stream */
    bool started;
    int block;                  /* index of the open content block, -1 none */
    int n_blocks;
    const char *open_type;      /* "text", "thinking", "tool_use" */
    const char *stop_reason;
    char *stop_sequence;        /* heap */
    int output_tokens;
    bool failed;
} msg_state;

static void state_free(void *p)
{
    msg_state *s = p;
    if (s)
        free(s->stop_sequence);
    free(s);
}

typedef struct aerr {
    char msg[320];
} aerr;

static bool fail(aerr *e, const char *field, const char *msg)
{
    snprintf(e->msg, sizeof e->msg, "%s: %s", field, msg);
    return false;
}

/* ---------------------------------------------------------------------- */
/* The request                                                            */
/* ---------------------------------------------------------------------- */

/* The text of a string or of text blocks. */
static bool blocks_text(const cJSON *c, const char *field, char **out, size_t *n, size_t *cap, aerr *e)
{
    if (cJSON_IsString(c))
        return !json_buf_append(out, n, cap, c->valuestring, strlen(c->valuestring)) || fail(e, field, "out of memory");
    if (!cJSON_IsArray(c))
        return fail(e, field, "expected a string or an array of text blocks");
    const cJSON *b;
    cJSON_ArrayForEach(b, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return fail(e, field, "only text blocks are supported here (images and documents are not)");
        if ((*n && json_buf_append(out, n, cap, "\n", 1)) ||
            json_buf_append(out, n, cap, text->valuestring, strlen(text->valuestring)))
            return fail(e, field, "out of memory");
    }
    return true;
}

static cJSON *role_msg(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content)
        cJSON_AddStringToObject(m, "content", content);
    else
        cJSON_AddNullToObject(m, "content");
    return m;
}

/* One Messages message -> chat messages: a user's tool_result blocks
 * become tool messages (before its text), an assistant's tool_use blocks
 * its tool_calls. */
static bool one_message(const cJSON *m, cJSON *msgs, aerr *e)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return fail(e, "messages", "each message needs role user or assistant");
    bool user = !strcmp(role->valuestring, "user");
    char *text = NULL;
    size_t n = 0, cap = 0;
    bool ok = json_buf_append(&text, &n, &cap, "", 0) == 0;
    if (cJSON_IsString(content) || !cJSON_IsArray(content)) {
        free(text);
        if (cJSON_IsString(content))
            return ok && json_push(msgs, role_msg(role->valuestring, content->valuestring));
        return fail(e, "messages", "content must be a string or an array of content blocks");
    }
    cJSON *calls = cJSON_CreateArray();
    bool results = false;
    const cJSON *b;
    cJSON_ArrayForEach(b, content)
    {
        if (!ok)
            break;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "text")) {
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(b, "text");
            ok = cJSON_IsString(tx) ? !(n && json_buf_append(&text, &n, &cap, "\n", 1)) &&
                                          !json_buf_append(&text, &n, &cap, tx->valuestring, strlen(tx->valuestring))
                                    : fail(e, "messages", "a text block needs text");
        } else if (!strcmp(t, "tool_use") && !user) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                ok = fail(e, "messages", "a tool_use block needs id, name and an input object");
                break;
            }
            char *args = cJSON_PrintUnformatted(input);
            json_push(calls, json_chat_call(id->valuestring, name->valuestring, args ? args : "{}"));
            cJSON_free(args);
        } else if (!strcmp(t, "tool_result") && user) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
            const cJSON *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
            char *res = NULL;
            size_t rn = 0, rcap = 0;
            if (!cJSON_IsString(id)) {
                ok = fail(e, "messages", "a tool_result block needs tool_use_id");
                break;
            }
            ok = !json_buf_append(&res, &rn, &rcap, "", 0);
            if (ok && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "is_error")))
                ok = !json_buf_append(&res, &rn, &rcap, "Error: ", 7);
            if (ok && rc)
                ok = blocks_text(rc, "messages: tool_result content", &res, &rn, &rcap, e);
            if (ok) {
                results = true;
                cJSON *tm = role_msg("tool", res);
                cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
                json_push(msgs, tm);
            }
            free(res);
        } else if (strcmp(t, "thinking") && strcmp(t, "redacted_thinking")) {   /* thinking is not fed back */
            snprintf(e->msg, sizeof e->msg, "messages: content blocks of type %.40s are not supported in a %s "
                                            "message", t, role->valuestring);
            ok = false;
        }
    }
    /* a user turn of tool results only has no user message */
    if (ok && (n || calls->child || !user || !results)) {
        cJSON *cm = role_msg(role->valuestring, n || !calls->child ? text : NULL);
        if (calls->child) {
            json_put(cm, "tool_calls", calls);
            calls = NULL;
        }
        json_push(msgs, cm);
    }
    cJSON_Delete(calls);
    free(text);
    return ok;
}

/* tools [{name, description, input_schema}] and tool_choice {type, name,
 * disable_parallel_tool_use} -> chat's. */
static bool tools_of(const cJSON *root, cJSON *chat, aerr *e)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tools && !cJSON_IsArray(tools))
        return fail(e, "tools", "expected an array of {name, description, input_schema}");
    if (tools && tools->child) {
        cJSON *out = cJSON_AddArrayToObject(chat, "tools");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
            const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
            if ((type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "custom"))) || !cJSON_IsString(name))
                return fail(e, "tools", "only client tools {name, input_schema} are supported; server tools "
                                        "(web_search, bash, text_editor, computer, ...) are not");
            json_push(out, json_chat_tool(name, cJSON_IsString(desc) ? desc : NULL, schema));
        }
    }
    if (!choice)
        return true;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        cJSON_AddStringToObject(chat, "tool_choice", t);
    } else if (!strcmp(t, "any")) {
        cJSON_AddStringToObject(chat, "tool_choice", "required");
    } else if (!strcmp(t, "tool") && cJSON_IsString(name)) {
        json_put(chat, "tool_choice", json_chat_named(name->valuestring));
    } else {
        return fail(e, "tool_choice", "must be {\"type\": auto | any | none} or {\"type\": \"tool\", \"name\": ...}");
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(choice, "disable_parallel_tool_use")))
        cJSON_AddBoolToObject(chat, "parallel_tool_calls", false);
    return true;
}

/* The chat body of a Messages body (count: for count_tokens, no
 * max_tokens needed). */
static cJSON *to_chat(const cJSON *root, bool count, msg_state *st, aerr *e)
{
    static const char *const known[] = {"model", "messages", "system", "max_tokens", "stop_sequences",
                                        "temperature", "top_p", "top_k", "stream", "tools", "tool_choice",
                                        "thinking", "metadata", "service_tier", NULL};
    const char *unk = json_unknown_key(root, known);
    if (unk) {
        snprintf(e->msg, sizeof e->msg, "%.60s: Extra inputs are not permitted", unk);
        return NULL;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
    if (!cJSON_IsString(model)) {
        fail(e, "model", "Field required (a string)");
        return NULL;
    }
    snprintf(st->model, sizeof st->model, "%s", model->valuestring);
    if (!count && !cJSON_IsNumber(max)) {
        fail(e, "max_tokens", "Field required (an integer)");
        return NULL;
    }
    if (!cJSON_IsArray(msgs) || !msgs->child) {
        fail(e, "messages", "Field required (a non-empty array)");
        return NULL;
    }
    cJSON *chat = cJSON_CreateObject();
    cJSON *out = cJSON_AddArrayToObject(chat, "messages");
    cJSON_AddStringToObject(chat, "model", model->valuestring);
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
    if (sys) {
        char *text = NULL;
        size_t n = 0, cap = 0;
        if (!blocks_text(sys, "system", &text, &n, &cap, e)) {
            free(text);
            goto fail;
        }
        json_push(out, role_msg("system", text ? text : ""));
        free(text);
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
        if (!one_message(m, out, e))
            goto fail;
    if (!tools_of(root, chat, e))
        goto fail;
    static const char *const same[] = {"max_tokens", "temperature", "top_p", "top_k", "stream"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, same[i]);
        if (v && !count)
            json_put(chat, same[i], cJSON_Duplicate(v, true));
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop_sequences");
    if (stop && !count)
        json_put(chat, "stop", cJSON_Duplicate(stop, true));
    const cJSON *think = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "thinking"), "type");
    if (cJSON_IsString(think))
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(chat, "chat_template_kwargs"), "enable_thinking",
                              !strcmp(think->valuestring, "enabled"));
    if (!count && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "stream")))
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(chat, "stream_options"), "include_usage", true);
    return chat;
fail:
    cJSON_Delete(chat);
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* Answers                                                                */
/* ---------------------------------------------------------------------- */

/* Anthropic's error type of an HTTP status. */
static const char *error_type(int status)
{
    switch (status) {
    case 400: case 405: case 422: case 431: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
    }
}

static cJSON *error_body(int status, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "type", error_type(status));
    cJSON_AddStringToObject(e, "message", msg);
    return o;
}

/* stop_reason of a chat finish_reason and vLLM's stop_reason. */
static const char *stop_reason(const char *finish, const cJSON *stop_str)
{
    if (!strcmp(finish, "tool_calls"))
        return "tool_use";
    if (!strcmp(finish, "length"))
        return "max_tokens";
    return cJSON_IsString(stop_str) ? "stop_sequence" : "end_turn";
}

static void add_usage(cJSON *o, int in, int out)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", in);
    cJSON_AddNumberToObject(u, "output_tokens", out);
}

static cJSON *tool_use_block(const cJSON *call, bool with_input)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", cJSON_IsString(id) ? id->valuestring : "");
    cJSON_AddStringToObject(b, "name", cJSON_IsString(name) ? name->valuestring : "");
    cJSON *input = with_input && cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    json_put(b, "input", input ? input : cJSON_CreateObject());
    return b;
}

static cJSON *message_object(const msg_state *st, cJSON *content)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", st->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", st->model);
    json_put(o, "content", content);
    return o;
}

static cJSON *on_body(http_req *hr, int status, cJSON *obj)
{
    msg_state *st = hr->xlate->state;
    const cJSON *object = cJSON_GetObjectItemCaseSensitive(obj, "object");
    if (status != 200 || !cJSON_IsString(object) || strcmp(object->valuestring, "chat.completion")) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(obj, "error"), "message");
        cJSON *o = status == 200 ? NULL : error_body(status, cJSON_IsString(m) ? m->valuestring : "request failed");
        if (!o)
            return obj;
        cJSON_Delete(obj);
        return o;
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(obj, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    const cJSON *stop_str = cJSON_GetObjectItemCaseSensitive(ch, "stop_reason");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(obj, "usage");
    cJSON *blocks = cJSON_CreateArray();
    if (cJSON_IsString(reason)) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", reason->valuestring);
        cJSON_AddStringToObject(b, "signature", "");
        json_push(blocks, b);
    }
    if (cJSON_IsString(content) && content->valuestring[0]) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", content->valuestring);
        json_push(blocks, b);
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"))
        json_push(blocks, tool_use_block(c, true));
    cJSON *o = message_object(st, blocks);
    const char *sr = stop_reason(cJSON_IsString(fin) ? fin->valuestring : "stop", stop_str);
    cJSON_AddStringToObject(o, "stop_reason", sr);
    if (!strcmp(sr, "stop_sequence"))
        cJSON_AddStringToObject(o, "stop_sequence", stop_str->valuestring);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    add_usage(o, cJSON_IsNumber(pt) ? pt->valueint : 0, cJSON_IsNumber(ct) ? ct->valueint : 0);
    cJSON_Delete(obj);
    return o;
}

/* ---- the stream ---- */

typedef json_sse_out sse_out;

static int emit(const sse_out *o, const char *type, cJSON *obj)
{
    return json_sse_typed(o, type, -1, obj);
}

static cJSON *indexed(int index)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "index", index);
    return e;
}

static int close_block(msg_state *st, const sse_out *o)
{
    if (st->block < 0)
        return 0;
    int b = st->block;
    st->block = -1;
    st->open_type = NULL;
    return emit(o, "content_block_stop", indexed(b));
}

/* Open block (taken) of type, closing the one open. */
static int open_block(msg_state *st, const sse_out *o, const char *type, cJSON *block)
{
    if (close_block(st, o))
        return -1;
    st->block = st->n_blocks++;
    st->open_type = type;
    cJSON *e = indexed(st->block);
    json_put(e, "content_block", block);
    return emit(o, "content_block_start", e);
}

/* Text (or thinking) into a block of that type. */
static int text_delta(msg_state *st, const sse_out *o, bool thinking, const char *s)
{
    if (!s[0])
        return 0;
    const char *type = thinking ? "thinking" : "text";
    if (!st->open_type || strcmp(st->open_type, type)) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", type);
        cJSON_AddStringToObject(b, type, "");
        if (thinking)
            cJSON_AddStringToObject(b, "signature", "");
        if (open_block(st, o, type, b))
            return -1;
    }
    cJSON *e = indexed(st->block), *d = cJSON_AddObjectToObject(e, "delta");
    cJSON_AddStringToObject(d, "type", thinking ? "thinking_delta" : "text_delta");
    cJSON_AddStringToObject(d, type, s);
    return emit(o, "content_block_delta", e);
}

/* A chat tool_calls delta: the first of a call opens a tool_use block, the
 * second carries its arguments as one input_json_delta and closes it. */
static int call_delta(msg_state *st, const sse_out *o, const cJSON *t)
{
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(t, "id")))
        return open_block(st, o, "tool_use", tool_use_block(t, false));
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "arguments");
    cJSON *e = indexed(st->block), *d = cJSON_AddObjectToObject(e, "delta");
    cJSON_AddStringToObject(d, "type", "input_json_delta");
    cJSON_AddStringToObject(d, "partial_json", cJSON_IsString(args) ? args->valuestring : "");
    return emit(o, "content_block_delta", e) || close_block(st, o) ? -1 : 0;
}

static int finish_stream(msg_state *st, const sse_out *o)
{
    if (st->failed)
        return 0;
    if (close_block(st, o))
        return -1;
    cJSON *e = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(e, "delta");
    cJSON_AddStringToObject(d, "stop_reason", st->stop_reason ? st->stop_reason : "end_turn");
    if (st->stop_sequence)
        cJSON_AddStringToObject(d, "stop_sequence", st->stop_sequence);
    else
        cJSON_AddNullToObject(d, "stop_sequence");
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(e, "usage"), "output_tokens", st->output_tokens);
    if (emit(o, "message_delta", e))
        return -1;
    return emit(o, "message_stop", cJSON_CreateObject());
}

static int on_event(http_req *hr, const cJSON *obj, char **out, size_t *n, size_t *cap)
{
    msg_state *st = hr->xlate->state;
    sse_out o = {out, n, cap};
    if (!obj)
        return finish_stream(st, &o);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(obj, "error");
    if (err) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        st->failed = true;
        cJSON *b = error_body(500, cJSON_IsString(m) ? m->valuestring : "generation failed");
        cJSON_DeleteItemFromObjectCaseSensitive(b, "type");
        return emit(&o, "error", b);
    }
    if (!st->started) {
        st->started = true;
        cJSON *m = message_object(st, cJSON_CreateArray());
        cJSON_AddNullToObject(m, "stop_reason");
        cJSON_AddNullToObject(m, "stop_sequence");
        add_usage(m, hr->n_prompt, 0);
        cJSON *e = cJSON_CreateObject();
        json_put(e, "message", m);
        if (emit(&o, "message_start", e))
            return -1;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(obj, "usage");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    if (cJSON_IsNumber(ct))
        st->output_tokens = ct->valueint;
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(obj, "choices"), 0);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(d, "reasoning_content");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(d, "content");
    if (cJSON_IsString(r) && text_delta(st, &o, true, r->valuestring))
        return -1;
    if (cJSON_IsString(c) && text_delta(st, &o, false, c->valuestring))
        return -1;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(d, "tool_calls"))
        if (call_delta(st, &o, t))
            return -1;
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    if (cJSON_IsString(fin)) {
        const cJSON *ss = cJSON_GetObjectItemCaseSensitive(ch, "stop_reason");
        st->stop_reason = stop_reason(fin->valuestring, ss);
        if (cJSON_IsString(ss) && !(st->stop_sequence = fault_strdup(ss->valuestring)))
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* The routes                                                             */
/* ---------------------------------------------------------------------- */

/* The translation set on hr and the body read into a chat body; NULL
 * when an error was answered (*rc). */
static cJSON *begin(http_req *hr, bool count, int *rc)
{
    http_xlate *x = fault_calloc(1, sizeof *x);
    msg_state *st = fault_calloc(1, sizeof *st);
    if (!x || !st) {
        free(x);
        free(st);
        *rc = errors_reply(hr, ERR_INTERNAL, "out of memory");
        return NULL;
    }
    snprintf(st->id, sizeof st->id, "msg_%s", hr->id);
    st->block = -1;
    *x = (http_xlate){.body = on_body, .event = on_event, .free_state = state_free, .state = st};
    hr->xlate = x;
    cJSON *root = cJSON_ParseWithLength(hr->body ? hr->body : "", hr->n_body);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        *rc = errors_reply(hr, ERR_BAD_JSON, "the body is not a JSON object");
        return NULL;
    }
    aerr e = {{0}};
    cJSON *chat = to_chat(root, count, st, &e);
    cJSON_Delete(root);
    if (!chat)
        *rc = errors_reply(hr, ERR_BAD_JSON, e.msg);
    return chat;
}

int anthropic_messages_route(http_req *hr)
{
    hr->generation = true;
    int rc = 0;
    if (!errors_ready(hr))
        return 0;
    cJSON *chat = begin(hr, false, &rc);
    return chat ? generate_translated(hr, chat, hr->xlate) : rc;
}

int anthropic_count_tokens_route(http_req *hr)
{
    int rc = 0;
    if (!errors_ready(hr))
        return 0;
    cJSON *chat = begin(hr, true, &rc);
    if (!chat)
        return rc;
    int n = generate_count_tokens(hr, chat, &rc);
    if (n < 0)
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", n);
    return http_send_json(hr, 200, o, NULL);
}

/* responses.c - OpenAI's Responses API, POST /v1/responses, over the chat
 * flow (see responses.h).
 *
 * Owns: reading a Responses body into a chat-completions body (input
 * items, instructions, tools, text.format, previous_response_id), the
 * answer's response object, the typed stream events (response.created ..
 * response.completed, each with its sequence_number) made from the chat
 * stream's chunks, and the bounded store of recent conversations that
 * previous_response_id reads.
 * Does not own: the generation flow (generate.c), templates and tool-call
 * parsing (chat.c), field rules of the chat body (json.c).
 * ref: docs/serving.md 3.7.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault.h"
#include "errors.h"
#include "generate.h"
#include "json.h"
#include "responses.h"

/* ---------------------------------------------------------------------- */
/* The store: recent conversations by response id                         */
/* ---------------------------------------------------------------------- */

typedef struct stored {
    char id[96];
    int owner;                  /* the API key that made it (0: keys off) */
    char *messages;             /* the chat messages up to and with the answer, JSON text (heap) */
    size_t len;
    unsigned long long age;     /* insertion order: the smallest goes first */
} stored;

static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;
static stored store_v[RESPONSES_STORE_MAX];
static size_t store_bytes;
static unsigned long long store_age;

static void store_put(const char *id, int owner, char *messages)
{
    size_t len = strlen(messages);
    if (len > RESPONSES_STORE_BYTES) {
        free(messages);
        return;
    }
    pthread_mutex_lock(&store_mu);
    for (;;) {
        int empty = -1, oldest = -1;
        for (int i = 0; i < RESPONSES_STORE_MAX; i++) {
            if (!store_v[i].messages)
                empty = empty < 0 ? i : empty;
            else if (oldest < 0 || store_v[i].age < store_v[oldest].age)
                oldest = i;
        }
        if (empty >= 0 && store_bytes + len <= RESPONSES_STORE_BYTES) {
            stored *s = &store_v[empty];
            snprintf(s->id, sizeof s->id, "%s", id);
            s->owner = owner;
            s->messages = messages;
            s->len = len;
            s->age = ++store_age;
            store_bytes += len;
            break;
        }
        store_bytes -= store_v[oldest].len;     /* full: the oldest goes */
        free(store_v[oldest].messages);
        store_v[oldest].messages = NULL;
    }
    pthread_mutex_unlock(&store_mu);
}

/* The stored messages of id made with owner's key (parsed), or NULL. */
static cJSON *store_get(const char *id, int owner)
{
    cJSON *m = NULL;
    pthread_mutex_lock(&store_mu);
    for (int i = 0; i < RESPONSES_STORE_MAX; i++)
        if (store_v[i].messages && store_v[i].owner == owner && !strcmp(store_v[i].id, id))
            m = cJSON_ParseWithLength(store_v[i].messages, store_v[i].len);
    pthread_mutex_unlock(&store_mu);
    return m;
}

/* ---------------------------------------------------------------------- */
/* The request: a Responses body -> a chat body                           */
/* ---------------------------------------------------------------------- */

typedef struct resp_state {
    char id[96];                /* resp_<request id> */
    long long created;
    cJSON *echo;                /* the request's fields the response object repeats */
    cJSON *history;             /* the chat messages without instructions (for the store) */
    bool store;
    int seq;                    /* the next event's sequence_number */
    /* the stream */
    bool started;
    cJSON *output;              /* the finished output items */
    cJSON *item;                /* the open item (message, reasoning, function_call) */
    int item_index;
    char *text;                 /* the open item's text so far */
    size_t n_text, cap_text;
    cJSON *calls;               /* chat tool_calls so far (for the store) */
    char *content;              /* the message text so far (for the store) */
    size_t n_content, cap_content;
    const char *finish;         /* the chat finish_reason */
    cJSON *usage;               /* the chat usage */
    bool failed;
} resp_state;

static void state_free(void *p)
{
    resp_state *s = p;
    if (!s)
        return;
    cJSON_Delete(s->echo);
    cJSON_Delete(s->history);
    cJSON_Delete(s->output);
    cJSON_Delete(s->item);
    cJSON_Delete(s->calls);
    cJSON_Delete(s->usage);
    free(s->text);
    free(s->content);
    free(s);
}

/* A request error found while translating: the message and the field. */
typedef struct rerr {
    char msg[320];
    char param[64];
} rerr;

static bool bad(rerr *e, const char *param, const char *msg)
{
    snprintf(e->msg, sizeof e->msg, "`%s`: %s", param, msg);
    snprintf(e->param, sizeof e->param, "%s", param);
    return false;
}

/* The text of a content given as a string or as parts (input_text,
 * output_text, text); NULL with e set for another part. */
static char *content_text(const cJSON *c, const char *param, rerr *e)
{
    if (cJSON_IsString(c))
        return fault_strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        bad(e, param, "content must be a string or an array of input_text parts");
        return NULL;
    }
    char *out = NULL;
    size_t n = 0, cap = 0;
    json_buf_append(&out, &n, &cap, "", 0);
    const cJSON *p;
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if ((strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text")) || !cJSON_IsString(text)) {
            free(out);
            bad(e, param, "only text parts (input_text, output_text) are supported; images, files and audio are not");
            return NULL;
        }
        if (json_buf_append(&out, &n, &cap, text->valuestring, strlen(text->valuestring))) {
            free(out);
            bad(e, param, "out of memory");
            return NULL;
        }
    }
    return out;
}

/* The last message of msgs when it is the assistant's and can take tool
 * calls; else a new one. */
static cJSON *assistant_for_calls(cJSON *msgs)
{
    int n = cJSON_GetArraySize(msgs);
    cJSON *last = n ? cJSON_GetArrayItem(msgs, n - 1) : NULL;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant"))
        return last;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddNullToObject(m, "content");
    json_push(msgs, m);
    return m;
}

/* input (a string or items) appended to msgs as chat messages. */
static bool input_messages(const cJSON *input, cJSON *msgs, rerr *e)
{
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        return json_push(msgs, m) || bad(e, "input", "out of memory");
    }
    if (!cJSON_IsArray(input))
        return bad(e, "input", "expected a string or an array of items");
    const cJSON *it;
    cJSON_ArrayForEach(it, input)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const char *t = cJSON_IsString(type) ? type->valuestring : "message";
        if (!cJSON_IsObject(it))
            return bad(e, "input", "each item must be an object");
        if (!strcmp(t, "message")) {
            const char *r = cJSON_IsString(role) ? role->valuestring : "";
            if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
                return bad(e, "input", "a message's role must be user, assistant, system or developer");
            char *text = content_text(cJSON_GetObjectItemCaseSensitive(it, "content"), "input", e);
            if (!text)
                return false;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", r);
            cJSON_AddStringToObject(m, "content", text);
            free(text);
            json_push(msgs, m);
        } else if (!strcmp(t, "function_call")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
                return bad(e, "input", "a function_call item needs call_id, name and arguments (strings)");
            cJSON *m = assistant_for_calls(msgs);
            cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            if (!calls)
                calls = cJSON_AddArrayToObject(m, "tool_calls");
            json_push(calls, json_chat_call(id->valuestring, name->valuestring, args->valuestring));
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            if (!cJSON_IsString(id))
                return bad(e, "input", "a function_call_output item needs call_id");
            char *text = content_text(cJSON_GetObjectItemCaseSensitive(it, "output"), "input", e);
            if (!text)
                return false;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(m, "content", text);
            free(text);
            json_push(msgs, m);
        } else if (strcmp(t, "reasoning")) {     /* reasoning items are not fed back */
            snprintf(e->msg, sizeof e->msg, "`input`: items of type %.40s are not supported (message, function_call, "
                                            "function_call_output, reasoning are)", t);
            snprintf(e->param, sizeof e->param, "input");
            return false;
        }
    }
    return true;
}

/* tools, tool_choice: Responses' flat function tools -> chat's. */
static bool chat_tools(const cJSON *root, cJSON *chat, rerr *e)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tools && !cJSON_IsArray(tools))
        return bad(e, "tools", "expected an array of {\"type\": \"function\", \"name\", \"parameters\"}");
    if (tools && tools->child) {
        cJSON *out = cJSON_AddArrayToObject(chat, "tools");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
                return bad(e, "tools", "only function tools are supported; built-in tools (web_search, file_search, "
                                       "code_interpreter, computer_use, mcp, ...) are not");
            json_push(out, json_chat_tool(cJSON_GetObjectItemCaseSensitive(t, "name"),
                                          cJSON_GetObjectItemCaseSensitive(t, "description"),
                                          cJSON_GetObjectItemCaseSensitive(t, "parameters")));
        }
    }
    if (cJSON_IsString(choice)) {
        cJSON_AddStringToObject(chat, "tool_choice", choice->valuestring);
    } else if (choice) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
            return bad(e, "tool_choice", "must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
        json_put(chat, "tool_choice", json_chat_named(name->valuestring));
    }
    return true;
}

/* text.format -> response_format. */
static bool chat_format(const cJSON *root, cJSON *chat, rerr *e)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(text, "format");
    if (text && !cJSON_IsObject(text))
        return bad(e, "text", "expected an object {\"format\": {...}}");
    if (!fmt)
        return true;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(fmt, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "text"))
        return true;
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (!strcmp(t, "json_object")) {
        cJSON_AddStringToObject(rf, "type", "json_object");
        return true;
    }
    if (strcmp(t, "json_schema"))
        return bad(e, "text.format", "type must be text, json_object or json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(fmt, "schema");
    if (!cJSON_IsObject(schema))
        return bad(e, "text.format", "json_schema needs a schema object");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fmt, "name");
    cJSON_AddStringToObject(js, "name", cJSON_IsString(name) ? name->valuestring : "response");
    json_put(js, "schema", cJSON_Duplicate(schema, true));
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fmt, "strict");
    if (cJSON_IsBool(strict))
        cJSON_AddBoolToObject(js, "strict", cJSON_IsTrue(strict));
    return true;
}

/* Copy root's key to chat under to when present. */
static void pass(const cJSON *root, cJSON *chat, const char *key, const char *to)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (v && !cJSON_IsNull(v))
        json_put(chat, to, cJSON_Duplicate(v, true));
}

/* The chat body of a Responses body, the history in st. */
static cJSON *to_chat(http_req *hr, const cJSON *root, resp_state *st, rerr *e, int *kind)
{
    static const char *const known[] = {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "max_output_tokens",
        "temperature", "top_p", "stream", "store", "previous_response_id", "metadata", "user", "include",
        "truncation", "reasoning", "background", "service_tier", "safety_identifier", "prompt_cache_key",
        "stream_options", "max_tool_calls", "top_logprobs", "conversation", "prompt", NULL};
    *kind = ERR_VALIDATION;
    const char *unk = json_unknown_key(root, known);
    if (unk) {
        snprintf(e->msg, sizeof e->msg, "unknown field `%.60s`", unk);
        snprintf(e->param, sizeof e->param, "%s", unk);
        return NULL;
    }
    static const char *const refused[] = {"background", "conversation", "prompt", "top_logprobs", "max_tool_calls"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, refused[i]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v)) {
            bad(e, refused[i], "is not supported by this server (see docs/serving.md 3.7)");
            return NULL;
        }
    }
    const cJSON *trunc = cJSON_GetObjectItemCaseSensitive(root, "truncation");
    if (trunc && !(cJSON_IsString(trunc) && !strcmp(trunc->valuestring, "disabled"))) {
        bad(e, "truncation", "only \"disabled\" is supported: a too long input is a 400");
        return NULL;
    }
    const cJSON *store = cJSON_GetObjectItemCaseSensitive(root, "store");
    if (store && !cJSON_IsBool(store)) {
        bad(e, "store", "expected a boolean");
        return NULL;
    }
    st->store = !cJSON_IsFalse(store);
    cJSON *chat = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    st->history = cJSON_CreateArray();
    const cJSON *instr = cJSON_GetObjectItemCaseSensitive(root, "instructions");
    if (instr && !cJSON_IsNull(instr) && !cJSON_IsString(instr)) {
        bad(e, "instructions", "expected a string");
        goto fail;
    }
    const cJSON *prev = cJSON_GetObjectItemCaseSensitive(root, "previous_response_id");
    if (prev && !cJSON_IsNull(prev)) {
        cJSON *old = cJSON_IsString(prev) ? store_get(prev->valuestring, hr->key_id) : NULL;
        if (!old) {
            snprintf(e->msg, sizeof e->msg, "Previous response with id '%.96s' not found (this server keeps the "
                                            "last %d stored responses)", cJSON_IsString(prev) ? prev->valuestring : "",
                     RESPONSES_STORE_MAX);
            snprintf(e->param, sizeof e->param, "previous_response_id");
            *kind = ERR_NOT_FOUND;
            goto fail;
        }
        cJSON_Delete(st->history);
        st->history = old;
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!input) {
        bad(e, "input", "is required");
        goto fail;
    }
    if (!input_messages(input, st->history, e))
        goto fail;
    /* instructions are this request's only: a follow-up does not inherit them */
    if (cJSON_IsString(instr)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", instr->valuestring);
        json_push(msgs, m);
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, st->history)
        json_push(msgs, cJSON_Duplicate(m, true));
    if (!chat_tools(root, chat, e) || !chat_format(root, chat, e))
        goto fail;
    pass(root, chat, "model", "model");
    pass(root, chat, "max_output_tokens", "max_tokens");
    pass(root, chat, "temperature", "temperature");
    pass(root, chat, "top_p", "top_p");
    pass(root, chat, "parallel_tool_calls", "parallel_tool_calls");
    pass(root, chat, "stream", "stream");
    pass(root, chat, "user", "user");
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "reasoning"),
                                                           "effort");
    if (cJSON_IsString(effort) && (!strcmp(effort->valuestring, "none") || !strcmp(effort->valuestring, "minimal")))
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(chat, "chat_template_kwargs"), "enable_thinking", false);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "stream")))
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(chat, "stream_options"), "include_usage", true);
    /* what the response object repeats */
    st->echo = cJSON_CreateObject();
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    bool named = cJSON_IsString(model) && model->valuestring[0];
    cJSON_AddStringToObject(st->echo, "model", named ? model->valuestring : server_model_name(hr->srv));
    static const char *const echoed[] = {"instructions", "max_output_tokens", "previous_response_id", "temperature",
                                         "top_p", "user", "metadata"};
    for (size_t i = 0; i < sizeof echoed / sizeof echoed[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, echoed[i]);
        json_put(st->echo, echoed[i], v ? cJSON_Duplicate(v, true) : cJSON_CreateNull());
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    json_put(st->echo, "tools", tools ? cJSON_Duplicate(tools, true) : cJSON_CreateArray());
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    json_put(st->echo, "tool_choice", tc ? cJSON_Duplicate(tc, true) : cJSON_CreateString("auto"));
    cJSON_AddBoolToObject(st->echo, "parallel_tool_calls",
                          !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls")));
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    if (text)
        json_put(st->echo, "text", cJSON_Duplicate(text, true));
    else
        cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(st->echo, "text"), "format"), "type",
                                "text");
    cJSON_AddBoolToObject(st->echo, "store", st->store);
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(st->echo, "metadata")))
        cJSON_ReplaceItemInObjectCaseSensitive(st->echo, "metadata", cJSON_CreateObject());
    return chat;
fail:
    cJSON_Delete(chat);
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* The answer: a chat completion -> a response object                     */
/* ---------------------------------------------------------------------- */

static cJSON *usage_of(const cJSON *u)
{
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    const cJSON *cached = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details"),
                                                           "cached_tokens");
    double in = cJSON_IsNumber(pt) ? pt->valuedouble : 0, out = cJSON_IsNumber(ct) ? ct->valuedouble : 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", in);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "input_tokens_details"), "cached_tokens",
                            cJSON_IsNumber(cached) ? cached->valuedouble : 0);
    cJSON_AddNumberToObject(o, "output_tokens", out);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "output_tokens_details"), "reasoning_tokens", 0);
    cJSON_AddNumberToObject(o, "total_tokens", in + out);
    return o;
}

/* The response object: status from the chat finish_reason (NULL: in
 * progress), output (taken, NULL: []), usage (taken, NULL: null). */
static cJSON *response_object(http_req *hr, const resp_state *st, const char *finish, cJSON *output, cJSON *usage)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", st->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)st->created);
    const char *status = st->failed ? "failed" : !finish ? "in_progress"
                                        : !strcmp(finish, "length") ? "incomplete" : "completed";
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddNullToObject(o, "error");
    if (!strcmp(status, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    for (const cJSON *c = st->echo ? st->echo->child : NULL; c; c = c->next)
        json_put(o, c->string, cJSON_Duplicate(c, true));
    json_put(o, "output", output ? output : cJSON_CreateArray());
    cJSON *r = cJSON_AddObjectToObject(o, "reasoning");
    cJSON_AddNullToObject(r, "effort");
    cJSON_AddNullToObject(r, "summary");
    cJSON_AddStringToObject(o, "truncation", "disabled");
    json_put(o, "usage", usage ? usage : cJSON_CreateNull());
    return o;
}

static cJSON *message_item(const char *id, const char *text, size_t len, const char *status)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *parts = cJSON_AddArrayToObject(it, "content");
    if (text) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "output_text");
        json_add_text(p, "text", text, len);
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
        json_push(parts, p);
    }
    return it;
}

static cJSON *reasoning_item(const char *id, const char *text, size_t len)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "reasoning");
    cJSON_AddArrayToObject(it, "summary");
    cJSON *parts = cJSON_AddArrayToObject(it, "content");
    if (text) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        json_add_text(p, "text", text, len);
        json_push(parts, p);
    }
    return it;
}

static cJSON *call_item(const cJSON *call, const char *args, const char *status)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    char fid[200];
    snprintf(fid, sizeof fid, "fc_%s", cJSON_IsString(id) ? id->valuestring : "");
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", fid);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "call_id", cJSON_IsString(id) ? id->valuestring : "");
    cJSON_AddStringToObject(it, "name", cJSON_IsString(name) ? name->valuestring : "");
    cJSON_AddStringToObject(it, "arguments", args);
    return it;
}

/* Keep the conversation with its answer (content, tool calls) for a
 * follow-up's previous_response_id. */
static void remember(http_req *hr, resp_state *st, const char *content, size_t len, const cJSON *calls)
{
    if (!st->store || !st->history)
        return;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (content && len)
        json_add_text(m, "content", content, len);
    else
        cJSON_AddNullToObject(m, "content");
    if (calls && calls->child)
        json_put(m, "tool_calls", cJSON_Duplicate(calls, true));
    json_push(st->history, m);
    char *text = cJSON_PrintUnformatted(st->history);
    if (text)
        store_put(st->id, hr->key_id, text);
}

/* The chat flow's errors name its fields: the Responses names instead. */
static void rename_param(cJSON *err)
{
    cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(err, "error"), "param");
    static const char *const map[][2] = {{"max_tokens", "max_output_tokens"}, {"messages", "input"},
                                         {"response_format", "text.format"}};
    for (size_t i = 0; cJSON_IsString(p) && i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(p->valuestring, map[i][0]))
            cJSON_SetValuestring(p, map[i][1]);
}

static cJSON *on_body(http_req *hr, int status, cJSON *obj)
{
    resp_state *st = hr->xlate->state;
    const cJSON *object = cJSON_GetObjectItemCaseSensitive(obj, "object");
    if (status != 200 || !cJSON_IsString(object) || strcmp(object->valuestring, "chat.completion")) {
        rename_param(obj);
        return obj;
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(obj, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    cJSON *output = cJSON_CreateArray();
    char id[160];
    if (cJSON_IsString(reason)) {
        snprintf(id, sizeof id, "rs_%s", hr->id);
        json_push(output, reasoning_item(id, reason->valuestring, strlen(reason->valuestring)));
    }
    if (cJSON_IsString(content) || !calls) {
        const char *t = cJSON_IsString(content) ? content->valuestring : "";
        snprintf(id, sizeof id, "msg_%s", hr->id);
        json_push(output, message_item(id, t, strlen(t), "completed"));
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, calls)
    {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "arguments");
        json_push(output, call_item(c, cJSON_IsString(a) ? a->valuestring : "", "completed"));
    }
    const char *finish = cJSON_IsString(fin) ? fin->valuestring : "stop";
    cJSON *o = response_object(hr, st, finish, output, usage_of(cJSON_GetObjectItemCaseSensitive(obj, "usage")));
    remember(hr, st, cJSON_IsString(content) ? content->valuestring : NULL,
             cJSON_IsString(content) ? strlen(content->valuestring) : 0, calls);
    cJSON_Delete(obj);
    return o;
}

/* ---------------------------------------------------------------------- */
/* The stream: chat chunks -> typed events                                */
/* ---------------------------------------------------------------------- */

typedef json_sse_out sse_out;

static int emit(resp_state *st, const sse_out *o, const char *type, cJSON *obj)
{
    return json_sse_typed(o, type, st->seq++, obj);
}

/* An event about the open item: {output_index, item_id, ...}. */
static cJSON *item_event(const resp_state *st, bool part)
{
    cJSON *e = cJSON_CreateObject();
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(st->item, "id");
    cJSON_AddStringToObject(e, "item_id", cJSON_IsString(id) ? id->valuestring : "");
    cJSON_AddNumberToObject(e, "output_index", st->item_index);
    if (part)
        cJSON_AddNumberToObject(e, "content_index", 0);
    return e;
}

static const char *item_type(const resp_state *st)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(st->item, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

/* Close the open item: its .done events, then into output. */
static int close_item(resp_state *st, const sse_out *o)
{
    if (!st->item)
        return 0;
    const char *type = item_type(st);
    int rc = 0;
    const char *txt = st->text ? st->text : "";
    if (!strcmp(type, "message") || !strcmp(type, "reasoning")) {
        bool msg = !strcmp(type, "message");
        cJSON *done = msg ? message_item("", txt, st->n_text, "completed") : reasoning_item("", txt, st->n_text);
        cJSON *part = cJSON_DetachItemFromArray(cJSON_GetObjectItemCaseSensitive(done, "content"), 0);
        cJSON_Delete(done);
        cJSON *e = item_event(st, true);
        json_add_text(e, "text", txt, st->n_text);
        if (msg)
            cJSON_AddArrayToObject(e, "logprobs");
        rc = emit(st, o, msg ? "response.output_text.done" : "response.reasoning_text.done", e);
        e = item_event(st, true);
        json_put(e, "part", cJSON_Duplicate(part, true));
        rc = rc ? rc : emit(st, o, "response.content_part.done", e);
        cJSON *parts = cJSON_GetObjectItemCaseSensitive(st->item, "content");
        json_push(parts, part);
        if (msg)
            cJSON_ReplaceItemInObjectCaseSensitive(st->item, "status", cJSON_CreateString("completed"));
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "output_index", st->item_index);
    json_put(e, "item", cJSON_Duplicate(st->item, true));
    rc = rc ? rc : emit(st, o, "response.output_item.done", e);
    json_push(st->output, st->item);
    st->item = NULL;
    st->n_text = 0;
    return rc;
}

/* Open an item (taken): output_item.added, and for text its part. */
static int open_item(resp_state *st, const sse_out *o, cJSON *item)
{
    if (close_item(st, o))
        return -1;
    st->item = item;
    st->item_index = cJSON_GetArraySize(st->output);
    st->n_text = 0;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "output_index", st->item_index);
    json_put(e, "item", cJSON_Duplicate(item, true));
    int rc = emit(st, o, "response.output_item.added", e);
    const char *type = item_type(st);
    if (rc == 0 && (!strcmp(type, "message") || !strcmp(type, "reasoning"))) {
        bool msg = !strcmp(type, "message");
        cJSON *full = msg ? message_item("", "", 0, "") : reasoning_item("", "", 0);
        e = item_event(st, true);
        json_put(e, "part", cJSON_DetachItemFromArray(cJSON_GetObjectItemCaseSensitive(full, "content"), 0));
        cJSON_Delete(full);
        rc = emit(st, o, "response.content_part.added", e);
    }
    return rc;
}

/* Text for a message (msg) or reasoning item, opening one when needed. */
static int text_delta(http_req *hr, resp_state *st, const sse_out *o, bool msg, const char *s)
{
    size_t n = strlen(s);
    if (!n)
        return 0;
    const char *want = msg ? "message" : "reasoning";
    char id[160];
    if (!st->item || strcmp(item_type(st), want)) {
        snprintf(id, sizeof id, "%s_%s", msg ? "msg" : "rs", hr->id);
        if (open_item(st, o, msg ? message_item(id, NULL, 0, "in_progress") : reasoning_item(id, NULL, 0)))
            return -1;
    }
    if (json_buf_append(&st->text, &st->n_text, &st->cap_text, s, n) ||
        (msg && json_buf_append(&st->content, &st->n_content, &st->cap_content, s, n)))
        return -1;
    cJSON *e = item_event(st, true);
    cJSON_AddStringToObject(e, "delta", s);
    if (msg)
        cJSON_AddArrayToObject(e, "logprobs");
    return emit(st, o, msg ? "response.output_text.delta" : "response.reasoning_text.delta", e);
}

/* A chat tool_calls delta: the first of a call opens its item, the
 * second (its arguments, whole) finishes it. */
static int call_delta(resp_state *st, const sse_out *o, const cJSON *t)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(t, "id");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (cJSON_IsString(id)) {
        cJSON *call = cJSON_Duplicate(t, true);
        cJSON_DeleteItemFromObjectCaseSensitive(call, "index");
        json_push(st->calls, call);
        return open_item(st, o, call_item(t, "", "in_progress"));
    }
    const char *a = cJSON_IsString(args) ? args->valuestring : "";
    cJSON *last = cJSON_GetArrayItem(st->calls, cJSON_GetArraySize(st->calls) - 1);
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(last, "function"), "arguments",
                                           cJSON_CreateString(a));
    cJSON *e = item_event(st, false);
    cJSON_AddStringToObject(e, "delta", a);
    int rc = emit(st, o, "response.function_call_arguments.delta", e);
    e = item_event(st, false);
    cJSON_AddStringToObject(e, "arguments", a);
    rc = rc ? rc : emit(st, o, "response.function_call_arguments.done", e);
    cJSON_ReplaceItemInObjectCaseSensitive(st->item, "arguments", cJSON_CreateString(a));
    cJSON_ReplaceItemInObjectCaseSensitive(st->item, "status", cJSON_CreateString("completed"));
    return rc ? rc : close_item(st, o);
}

/* The end: the last item closed, then response.completed (or
 * response.incomplete when cut by max_output_tokens). */
static int finish_stream(http_req *hr, resp_state *st, const sse_out *o)
{
    if (st->failed)
        return 0;
    if (!st->item && !cJSON_GetArraySize(st->output)) {
        char id[160];
        snprintf(id, sizeof id, "msg_%s", hr->id);
        if (open_item(st, o, message_item(id, NULL, 0, "in_progress")))
            return -1;
    }
    if (close_item(st, o))
        return -1;
    const char *finish = st->finish ? st->finish : "stop";
    cJSON *r = response_object(hr, st, finish, cJSON_Duplicate(st->output, true), usage_of(st->usage));
    cJSON *e = cJSON_CreateObject();
    json_put(e, "response", r);
    remember(hr, st, st->content, st->n_content, st->calls);
    return emit(st, o, strcmp(finish, "length") ? "response.completed" : "response.incomplete", e);
}

static int on_event(http_req *hr, const cJSON *obj, char **out, size_t *n, size_t *cap)
{
    resp_state *st = hr->xlate->state;
    sse_out o = {out, n, cap};
    if (!obj)
        return finish_stream(hr, st, &o);
    if (!st->started) {
        st->started = true;
        cJSON *e = cJSON_CreateObject();
        json_put(e, "response", response_object(hr, st, NULL, NULL, NULL));
        if (emit(st, &o, "response.created", e))
            return -1;
        e = cJSON_CreateObject();
        json_put(e, "response", response_object(hr, st, NULL, NULL, NULL));
        if (emit(st, &o, "response.in_progress", e))
            return -1;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(obj, "error");
    if (err) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        st->failed = true;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "code", "server_error");
        cJSON_AddStringToObject(e, "message", cJSON_IsString(m) ? m->valuestring : "generation failed");
        cJSON_AddNullToObject(e, "param");
        if (emit(st, &o, "error", e))
            return -1;
        cJSON *r = response_object(hr, st, "stop", cJSON_Duplicate(st->output, true), NULL);
        cJSON *re = cJSON_CreateObject();
        cJSON_AddStringToObject(re, "code", "server_error");
        cJSON_AddStringToObject(re, "message", cJSON_IsString(m) ? m->valuestring : "generation failed");
        cJSON_ReplaceItemInObjectCaseSensitive(r, "error", re);
        e = cJSON_CreateObject();
        json_put(e, "response", r);
        return emit(st, &o, "response.failed", e);
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(obj, "usage");
    if (cJSON_IsObject(u)) {
        cJSON_Delete(st->usage);
        st->usage = cJSON_Duplicate(u, true);
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(obj, "choices"), 0);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    const cJSON *rc_ = cJSON_GetObjectItemCaseSensitive(d, "reasoning_content");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(d, "content");
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    if (cJSON_IsString(rc_) && text_delta(hr, st, &o, false, rc_->valuestring))
        return -1;
    if (cJSON_IsString(c) && text_delta(hr, st, &o, true, c->valuestring))
        return -1;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(d, "tool_calls"))
        if (call_delta(st, &o, t))
            return -1;
    if (cJSON_IsString(fin))
        st->finish = !strcmp(fin->valuestring, "length") ? "length" : "stop";
    return 0;
}

/* ---------------------------------------------------------------------- */
/* The route                                                              */
/* ---------------------------------------------------------------------- */

int responses_route(http_req *hr)
{
    hr->generation = true;
    if (!errors_ready(hr))
        return 0;
    http_xlate *x = fault_calloc(1, sizeof *x);
    resp_state *st = fault_calloc(1, sizeof *st);
    if (!x || !st) {
        free(x);
        free(st);
        return errors_reply(hr, ERR_INTERNAL, "out of memory");
    }
    snprintf(st->id, sizeof st->id, "resp_%s", hr->id);
    st->created = (long long)time(NULL);
    st->output = cJSON_CreateArray();
    st->calls = cJSON_CreateArray();
    *x = (http_xlate){.body = on_body, .event = on_event, .free_state = state_free, .state = st};
    hr->xlate = x;
    cJSON *root = cJSON_ParseWithLength(hr->body ? hr->body : "", hr->n_body);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return errors_reply(hr, ERR_BAD_JSON, "the body is not a JSON object");
    }
    rerr e = {{0}, {0}};
    int kind;
    cJSON *chat = to_chat(hr, root, st, &e, &kind);
    cJSON_Delete(root);
    if (!chat) {
        err_extra xe = {.param = e.param};
        return errors_send(hr, kind, e.msg, &xe);
    }
    return generate_translated(hr, chat, x);
}

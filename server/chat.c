/* chat.c - recognised chat templates.
 *
 * Owns: ChatML and Llama 3 / 3.1 detection and rendering, the tool-call
 * forms of the Qwen3 and Llama 3.1 templates and parsing them back.
 * Does not own: Jinja. A template is recognised by the markers it emits;
 * anything else is reported as unsupported so the client can send a
 * formatted prompt to /v1/completions instead.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fault.h"
#include "chat.h"

int chat_detect(const char *tmpl)
{
    if (!tmpl || !*tmpl)
        return CHAT_NONE;
    if (!strcmp(tmpl, "chatml") || (strstr(tmpl, "<|im_start|>") && strstr(tmpl, "<|im_end|>")))
        return CHAT_CHATML;
    if (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "<|end_header_id|>") && strstr(tmpl, "<|eot_id|>"))
        return strstr(tmpl, "Cutting Knowledge Date") ? CHAT_LLAMA31 : CHAT_LLAMA3;
    return CHAT_UNKNOWN;
}

const char *chat_kind_name(int kind)
{
    switch (kind) {
    case CHAT_CHATML: return "chatml";
    case CHAT_LLAMA3: return "llama3";
    case CHAT_LLAMA31: return "llama3.1";
    case CHAT_UNKNOWN: return "unsupported";
    default: return "none";
    }
}

/* A prompt being rendered: the text, and the byte ranges of it that came
 * from the messages' content (pairs [start, end) in data). */
typedef struct prompt_buf {
    char *buf;
    size_t len, cap;
    size_t *data;               /* [2 * n_data] */
    int n_data, cap_data;
} prompt_buf;

/* template markup: control tokens in it are parsed */
static int markup(prompt_buf *p, const char *s, size_t n)
{
    return json_buf_append(&p->buf, &p->len, &p->cap, s, n);
}

/* text from the request: encoded as text, whatever it contains */
static int content(prompt_buf *p, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    size_t *d = fault_grow(p->data, p->n_data, &p->cap_data, 2 * sizeof *d, 8);   /* pairs */
    if (!d)
        return -1;
    p->data = d;
    p->data[2 * p->n_data] = p->len;
    p->data[2 * p->n_data + 1] = p->len + n;
    p->n_data++;
    return json_buf_append(&p->buf, &p->len, &p->cap, s, n);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* One Llama 3 message: header, Jinja-trimmed content, end of turn. */
static int llama3_msg(prompt_buf *p, const char *role, const char *prefix, const char *text)
{
    const char *a = text, *b = text + strlen(text);
    while (a < b && is_space(*a))
        a++;
    while (b > a && is_space(b[-1]))
        b--;
    return markup(p, "<|start_header_id|>", 19) || markup(p, role, strlen(role)) ||
           markup(p, "<|end_header_id|>\n\n", 19) || markup(p, prefix, strlen(prefix)) ||
           content(p, a, (size_t)(b - a)) || markup(p, "<|eot_id|>", 10);
}

/* ---- tools (the Qwen3 template's forms) ---- */

static int marks(prompt_buf *p, const char *s)
{
    return markup(p, s, strlen(s));
}

/* A JSON string as Python's json.dumps(ensure_ascii=False) writes it (the
 * template's tojson): data, since it comes from the request. */
static int py_string(prompt_buf *p, const char *s)
{
    size_t n = strlen(s), k = 0;
    char *b = fault_malloc(6 * n + 3);
    if (!b)
        return -1;
    b[k++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        static const char esc[] = "\"\\\b\f\n\r\t", letter[] = "\"\\bfnrt";
        const char *e = strchr(esc, *c);
        if (e && *c) {
            b[k++] = '\\';
            b[k++] = letter[e - esc];
        } else if (*c < 0x20) {
            k += (size_t)sprintf(b + k, "\\u%04x", *c);
        } else {
            b[k++] = (char)*c;
        }
    }
    b[k++] = '"';
    int rc = content(p, b, k);
    free(b);
    return rc;
}

static int py_json_at(prompt_buf *p, const cJSON *v, int indent, int depth);

/* v as json.dumps writes it: ", " and ": " separators, keys in order. */
static int py_json(prompt_buf *p, const cJSON *v, int depth)
{
    return py_json_at(p, v, 0, depth);
}

/* A newline and the indent of level depth (json.dumps with indent). */
static int py_newline(prompt_buf *p, int indent, int depth)
{
    if (content(p, "\n", 1))
        return -1;
    for (int i = 0; i < indent * depth; i++)
        if (content(p, " ", 1))
            return -1;
    return 0;
}

/* v as json.dumps(v, indent=indent, ensure_ascii=False) writes it (indent
 * 0: on one line): with an indent, items one per line, "," ending a line,
 * empty containers as {} and []. */
static int py_json_at(prompt_buf *p, const cJSON *v, int indent, int depth)
{
    if (depth > CHAT_TOOL_MAX_DEPTH)
        return -1;
    if (cJSON_IsString(v))
        return py_string(p, v->valuestring);
    if (cJSON_IsNumber(v)) {
        char num[40];
        double d = v->valuedouble;
        if (d == (double)(long long)d && d < 1e15 && d > -1e15)
            snprintf(num, sizeof num, "%lld", (long long)d);
        else if (snprintf(num, sizeof num, "%.15g", d), strtod(num, NULL) != d)
            snprintf(num, sizeof num, "%.17g", d);     /* the shortest that reads back, mostly */
        return content(p, num, strlen(num));
    }
    if (cJSON_IsBool(v))
        return content(p, cJSON_IsTrue(v) ? "true" : "false", cJSON_IsTrue(v) ? 4 : 5);
    if (cJSON_IsNull(v))
        return content(p, "null", 4);
    bool obj = cJSON_IsObject(v);
    if (content(p, obj ? "{" : "[", 1))
        return -1;
    for (const cJSON *e = v->child; e; e = e->next) {
        if (e != v->child && content(p, indent ? "," : ", ", indent ? 1 : 2))
            return -1;
        if (indent && py_newline(p, indent, depth + 1))
            return -1;
        if (obj && (py_string(p, e->string) || content(p, ": ", 2)))
            return -1;
        if (py_json_at(p, e, indent, depth + 1))
            return -1;
    }
    if (indent && v->child && py_newline(p, indent, depth))
        return -1;
    return content(p, obj ? "}" : "]", 1);
}

static int tools_block(prompt_buf *p, const cJSON *tools, const char *system)
{
    if (marks(p, "<|im_start|>system\n") ||
        (system && (content(p, system, strlen(system)) || marks(p, "\n\n"))) ||
        marks(p, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"))
        return -1;
    for (const cJSON *t = tools->child; t; t = t->next)
        if (marks(p, "\n") || py_json(p, t, 0))
            return -1;
    return marks(p, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
}

/* An assistant turn's tool calls (OpenAI's shape, arguments a JSON string). */
static int tool_calls(prompt_buf *p, const char *calls_json, bool had_content)
{
    cJSON *calls = cJSON_Parse(calls_json);
    int rc = calls ? 0 : -1, i = 0;
    for (const cJSON *c = calls ? calls->child : NULL; c && rc == 0; c = c->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name) || !cJSON_IsString(args))
            rc = -1;
        else if (((i == 0 && had_content) || i > 0) && marks(p, "\n"))
            rc = -1;
        else if (marks(p, "<tool_call>\n{\"name\": \"") || content(p, name->valuestring, strlen(name->valuestring)) ||
                 marks(p, "\", \"arguments\": ") || content(p, args->valuestring, strlen(args->valuestring)) ||
                 marks(p, "}\n</tool_call>"))
            rc = -1;
    }
    cJSON_Delete(calls);
    return rc;
}

static int render_chatml(const chat_msg *msgs, int n_msgs, const cJSON *tools, prompt_buf *p)
{
    int first = 0;
    if (tools) {
        bool sys = n_msgs > 0 && (!strcmp(msgs[0].role, "system") || !strcmp(msgs[0].role, "developer"));
        if (tools_block(p, tools, sys ? msgs[0].content : NULL))
            return -1;
        first = sys ? 1 : 0;
    }
    for (int i = first; i < n_msgs; i++) {
        const chat_msg *m = &msgs[i];
        if (!strcmp(m->role, "tool")) {
            /* consecutive tool results share one user turn */
            bool open = i == first || strcmp(msgs[i - 1].role, "tool");
            bool close = i + 1 == n_msgs || strcmp(msgs[i + 1].role, "tool");
            if ((open && marks(p, "<|im_start|>user")) || marks(p, "\n<tool_response>\n") ||
                content(p, m->content, strlen(m->content)) || marks(p, "\n</tool_response>") ||
                (close && marks(p, "<|im_end|>\n")))
                return -1;
            continue;
        }
        /* "developer" is OpenAI's newer name for the system role */
        const char *role = strcmp(m->role, "developer") ? m->role : "system";
        if (markup(p, "<|im_start|>", 12) || markup(p, role, strlen(role)) || markup(p, "\n", 1) ||
            content(p, m->content, strlen(m->content)) ||
            (m->tool_calls && tool_calls(p, m->tool_calls, m->content[0] != '\0')) || markup(p, "<|im_end|>\n", 11))
            return -1;
    }
    return markup(p, "<|im_start|>assistant\n", 22);
}

/* ---- Llama 3 / 3.1 ---- */

/* The tools as Llama 3.1's template lists them: intro (markup), each
 * tool as json.dumps(tool, indent=4) and a blank line, then text
 * Jinja-trimmed and the end of the turn. */
static int llama31_tool_list(prompt_buf *p, const char *intro, const cJSON *tools, const char *text)
{
    const char *a = text, *b = a + strlen(a);
    while (a < b && is_space(*a))
        a++;
    while (b > a && is_space(b[-1]))
        b--;
    if (marks(p, intro))
        return -1;
    for (const cJSON *t = tools->child; t; t = t->next)
        if (py_json_at(p, t, 4, 0) || content(p, "\n\n", 2))
            return -1;
    return content(p, a, (size_t)(b - a)) || marks(p, "<|eot_id|>");
}

/* Llama 3.1's prompt with custom tools (its template's default,
 * tools_in_user_message): they go into the first message after the
 * system one. */
static int llama31_tools(prompt_buf *p, const cJSON *tools, const chat_msg *m)
{
    return llama31_tool_list(p, "<|start_header_id|>user<|end_header_id|>\n\n"
                                "Given the following functions, please respond with a JSON for a function call with "
                                "its proper arguments that best answers the given prompt.\n\nRespond in the format "
                                "{\"name\": function name, \"parameters\": dictionary of argument name and its "
                                "value}.Do not use variables.\n\n", tools, m->content);
}

/* Llama 3.1's system turn with the tools in it (tools_in_user_message
 * false): the date lines, the other instruction, the tools, then the
 * system message. */
static int llama31_system_tools(prompt_buf *p, const cJSON *tools, const char *sys)
{
    return llama31_tool_list(p, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
                                "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                                "You have access to the following functions. To call a function, please respond with "
                                "JSON for a function call.Respond in the format {\"name\": function name, "
                                "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n",
                             tools, sys);
}

/* An assistant turn's one tool call as Llama 3.1 writes it:
 * {"name": "NAME", "parameters": ARGS}, ARGS the arguments object (OpenAI
 * sends it as JSON text; vLLM and llama-server parse it before rendering
 * too), or the text as a JSON string when it is not JSON. */
static int llama31_call(prompt_buf *p, const char *calls_json)
{
    cJSON *calls = cJSON_Parse(calls_json);
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(calls ? calls->child : NULL, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    int rc = -1;
    if (cJSON_IsString(name) && cJSON_IsString(args)) {
        cJSON *obj = cJSON_Parse(args->valuestring);
        rc = marks(p, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"") ||
             content(p, name->valuestring, strlen(name->valuestring)) || marks(p, "\", \"parameters\": ") ||
             (obj ? py_json(p, obj, 0) : py_string(p, args->valuestring)) || marks(p, "}<|eot_id|>");
        cJSON_Delete(obj);
    }
    cJSON_Delete(calls);
    return rc;
}

static int render_llama3(int kind, const chat_msg *msgs, int n_msgs, const cJSON *tools, bool in_system,
                         prompt_buf *p)
{
    int first = 0;
    if (kind == CHAT_LLAMA31) {
        /* 3.1 always opens with a system message carrying the cutoff lines;
         * a leading system message of the request supplies its text */
        static const char cutoff[] = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
        const char *sys = "";
        if (n_msgs > 0 && (!strcmp(msgs[0].role, "system") || !strcmp(msgs[0].role, "developer"))) {
            sys = msgs[0].content;
            first = 1;
        }
        /* with tools, "Environment: ipython\n" before them; with
         * tools_in_user_message false, the tools after the date lines */
        if (tools && in_system) {
            if (llama31_system_tools(p, tools, sys))
                return -1;
        } else if (llama3_msg(p, "system", tools ? "Environment: ipython\n" "Cutting Knowledge Date: December 2023\n"
                                                   "Today Date: 26 Jul 2024\n\n" : cutoff, sys)) {
            return -1;
        }
        if (tools && !in_system && llama31_tools(p, tools, &msgs[first++]))
            return -1;
    }
    for (int i = first; i < n_msgs; i++) {
        const chat_msg *m = &msgs[i];
        int rc;
        if (kind == CHAT_LLAMA31 && (!strcmp(m->role, "tool") || !strcmp(m->role, "ipython")))
            /* a result is a string, which the template's tojson quotes */
            rc = marks(p, "<|start_header_id|>ipython<|end_header_id|>\n\n") || py_string(p, m->content) ||
                 marks(p, "<|eot_id|>");
        else if (m->tool_calls)
            rc = llama31_call(p, m->tool_calls);
        else
            rc = llama3_msg(p, strcmp(m->role, "developer") ? m->role : "system", "", m->content);
        if (rc)
            return -1;
    }
    return markup(p, "<|start_header_id|>assistant<|end_header_id|>\n\n", 47);
}

/* One OpenAI tool_calls entry; NULL when name is not a string or args
 * neither a string nor an object. */
static cJSON *openai_call(const cJSON *name, const cJSON *args, const char *id_prefix, int i)
{
    char *args_text = cJSON_IsString(args) ? fault_strdup(args->valuestring)
                      : cJSON_IsObject(args) ? cJSON_PrintUnformatted(args) : NULL;
    cJSON *tc = cJSON_CreateObject(), *fn = NULL;
    char id[160];
    snprintf(id, sizeof id, "call_%s_%d", id_prefix, i);
    bool ok = cJSON_IsString(name) && args_text && tc && cJSON_AddStringToObject(tc, "id", id) &&
              cJSON_AddStringToObject(tc, "type", "function") && (fn = cJSON_AddObjectToObject(tc, "function")) &&
              cJSON_AddStringToObject(fn, "name", name->valuestring) &&
              cJSON_AddStringToObject(fn, "arguments", args_text);
    free(args_text);
    if (!ok) {
        cJSON_Delete(tc);
        return NULL;
    }
    return tc;
}

/* Does the JSON text s[0..n) (from an opening '{') end before its object
 * closes? A call cut off by max_tokens or a stop string: it never closes. */
static bool json_unclosed(const char *s, size_t n)
{
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return false;
        }
    }
    return true;
}

/* The content before the call at `at`, trailing whitespace dropped. */
static size_t content_before(const char *text, const char *at)
{
    size_t cl = (size_t)(at - text);
    while (cl > 0 && is_space(text[cl - 1]))
        cl--;
    return cl;
}

/* Llama 3.1's one call, {"name": NAME, "parameters": ARGS}, ending the
 * text (whitespace may follow); text before it is content. A call cut off
 * before its object closes is dropped with no call. */
static int llama31_parse_call(const char *text, size_t len, const char *id_prefix, size_t *content_len,
                              cJSON **calls)
{
    const char *tag = chat_tool_tag(CHAT_LLAMA31), *end = text + len;
    size_t tn = strlen(tag);
    for (const char *at = memmem(text, len, tag, tn); at; at = memmem(at + 1, (size_t)(end - at - 1), tag, tn)) {
        const char *stop = NULL;
        cJSON *obj = cJSON_ParseWithLengthOpts(at, (size_t)(end - at), &stop, false);
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
        if (!args)
            args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
        while (stop && stop < end && is_space(*stop))
            stop++;
        cJSON *tc = obj && stop == end && cJSON_IsObject(args)
                        ? openai_call(cJSON_GetObjectItemCaseSensitive(obj, "name"), args, id_prefix, 0) : NULL;
        cJSON_Delete(obj);
        if (!tc && !obj && json_unclosed(at, (size_t)(end - at))) {
            *calls = cJSON_CreateArray();       /* truncated: no call, and no markup in the content */
            *content_len = content_before(text, at);
            return 0;
        }
        cJSON *arr = tc ? cJSON_CreateArray() : NULL;
        if (!arr) {
            cJSON_Delete(tc);
            continue;
        }
        cJSON_AddItemToArray(arr, tc);
        *content_len = content_before(text, at);
        *calls = arr;
        return 1;
    }
    return 0;
}

const char *chat_tool_tag(int kind)
{
    return kind == CHAT_LLAMA31 ? "{\"name\"" : "<tool_call>";
}

/* The call in body[0..end) whose close tag was cut off: 1 with *tc when its
 * JSON is whole (a prefix of the close tag may follow), 0 when the JSON
 * itself was cut (no call), -1 when it is not a call. */
static int cut_call(const char *body, const char *end, const char *id_prefix, int i, cJSON **tc)
{
    static const char close_tag[] = "</tool_call>";
    *tc = NULL;
    while (body < end && is_space(*body))
        body++;
    if (body == end)
        return 0;
    if (*body != '{')
        return -1;
    const char *after = NULL;
    cJSON *call = cJSON_ParseWithLengthOpts(body, (size_t)(end - body), &after, false);
    if (!call)
        return json_unclosed(body, (size_t)(end - body)) ? 0 : -1;
    while (after < end && is_space(*after))
        after++;
    size_t left = (size_t)(end - after);
    if (left < sizeof close_tag - 1 && !memcmp(after, close_tag, left))
        *tc = openai_call(cJSON_GetObjectItemCaseSensitive(call, "name"),
                          cJSON_GetObjectItemCaseSensitive(call, "arguments"), id_prefix, i);
    cJSON_Delete(call);
    return *tc ? 1 : -1;
}

int chat_parse_tool_calls(int kind, const char *text, size_t len, const char *id_prefix, size_t *content_len,
                          cJSON **calls)
{
    static const char open_tag[] = "<tool_call>", close_tag[] = "</tool_call>";
    const size_t n_open = sizeof open_tag - 1;
    *calls = NULL;
    *content_len = len;
    if (kind == CHAT_LLAMA31)
        return llama31_parse_call(text, len, id_prefix, content_len, calls);
    const char *first = memmem(text, len, open_tag, n_open);
    if (!first)
        return 0;
    cJSON *arr = cJSON_CreateArray();
    const char *at = first, *end = text + len;
    bool ok = arr != NULL;
    int n = 0;
    while (ok) {
        const char *body = at + n_open;
        const char *stop = memmem(body, (size_t)(end - body), close_tag, sizeof close_tag - 1);
        cJSON *tc = NULL;
        if (!stop) {
            /* the last call was cut off (max_tokens, a stop string): the
             * complete ones stand, and its markup never reaches content */
            int c = cut_call(body, end, id_prefix, n, &tc);
            ok = c >= 0;
            if (c > 0)
                json_push(arr, tc);
            n += c > 0;
            break;
        }
        cJSON *call = cJSON_ParseWithLength(body, (size_t)(stop - body));
        tc = openai_call(cJSON_GetObjectItemCaseSensitive(call, "name"),
                         cJSON_GetObjectItemCaseSensitive(call, "arguments"), id_prefix, n);
        cJSON_Delete(call);
        if (!tc) {
            ok = false;
            break;
        }
        json_push(arr, tc);
        n++;
        const char *after = stop + sizeof close_tag - 1;
        while (after < end && is_space(*after))
            after++;
        size_t left = (size_t)(end - after);
        if (left == 0 || (left < n_open && !memcmp(after, open_tag, left)))
            break;                          /* the end, or a next call cut off in its tag */
        if (left < n_open || memcmp(after, open_tag, n_open))
            ok = false;                     /* text after a call: not a clean tool-call answer */
        at = after;
    }
    if (!ok) {
        cJSON_Delete(arr);
        return 0;
    }
    *content_len = content_before(text, first);
    *calls = arr;
    return n;
}

int chat_render(int kind, const chat_msg *msgs, int n_msgs, char **out, size_t **data, int *n_data, char *err,
                size_t errlen)
{
    return chat_render_tools(kind, msgs, n_msgs, NULL, false, false, out, data, n_data, err, errlen);
}

bool chat_split_reasoning(const char *text, size_t len, size_t *r_off, size_t *r_len, size_t *c_off, size_t *c_len)
{
    static const char open_tag[] = "<think>", close_tag[] = "</think>";
    size_t a = 0;
    while (a < len && is_space(text[a]))
        a++;
    bool opened = len - a >= sizeof open_tag - 1 && !memcmp(text + a, open_tag, sizeof open_tag - 1);
    const char *close = memmem(text, len, close_tag, sizeof close_tag - 1);
    if (!opened && !close)
        return false;
    size_t r = opened ? a + sizeof open_tag - 1 : 0;
    size_t e = close ? (size_t)(close - text) : len;
    if (close && close < text + r)      /* "</think>" before "<think>": not reasoning */
        return false;
    size_t c = close ? e + sizeof close_tag - 1 : len;
    while (r < e && text[r] == '\n')
        r++;
    while (e > r && text[e - 1] == '\n')
        e--;
    while (c < len && text[c] == '\n')
        c++;
    *r_off = r;
    *r_len = e - r;
    *c_off = c;
    *c_len = len - c;
    return true;
}

/* What Llama 3's templates cannot render (they raise an exception there
 * or have no tool form at all), or NULL. */
static const char *llama_tools_refused(int kind, const chat_msg *msgs, int n_msgs, bool tools, bool in_system)
{
    bool calls = false;
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].tool_calls)
            continue;
        calls = true;
        cJSON *a = cJSON_Parse(msgs[i].tool_calls);
        int n = cJSON_GetArraySize(a);
        cJSON_Delete(a);
        if (n != 1)
            return "Llama 3.1's chat template takes exactly one tool call per assistant message";
    }
    if (kind == CHAT_LLAMA3 && (tools || calls))
        return "tools are rendered for ChatML (Qwen) and Llama 3.1 templates; Llama 3.0's has no tool form";
    bool sys = n_msgs > 0 && (!strcmp(msgs[0].role, "system") || !strcmp(msgs[0].role, "developer"));
    if (tools && !in_system && n_msgs <= (sys ? 1 : 0))
        return "Llama 3.1's chat template puts the tools into the first user message, and there is none";
    return NULL;
}

int chat_render_tools(int kind, const chat_msg *msgs, int n_msgs, const char *tools_json, bool no_think,
                      bool tools_in_system, char **out, size_t **data, int *n_data, char *err, size_t errlen)
{
    *out = NULL;
    *data = NULL;
    *n_data = 0;
    if (kind == CHAT_NONE) {
        snprintf(err, errlen, "the model has no chat template (tokenizer.chat_template is missing from the GGUF); "
                              "send a formatted prompt to /v1/completions instead");
        return -1;
    }
    if (kind != CHAT_CHATML && kind != CHAT_LLAMA3 && kind != CHAT_LLAMA31) {
        snprintf(err, errlen, "the model's chat template is not one this server can render (supported: ChatML, "
                              "Llama 3); send a formatted prompt to /v1/completions instead");
        return -1;
    }
    if (kind == CHAT_LLAMA3 || kind == CHAT_LLAMA31) {
        const char *why = llama_tools_refused(kind, msgs, n_msgs, tools_json != NULL, tools_in_system);
        if (why) {
            snprintf(err, errlen, "%s", why);
            return -1;
        }
    }
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (tools_json && !tools) {        /* our own compact copy of the tools: no memory to read it */
        snprintf(err, errlen, "out of memory rendering the chat template");
        return CHAT_ENOMEM;
    }
    prompt_buf p = { 0 };
    int rc = kind == CHAT_CHATML ? render_chatml(msgs, n_msgs, tools, &p)
                                 : render_llama3(kind, msgs, n_msgs, tools, tools_in_system, &p);
    if (rc == 0 && no_think && kind == CHAT_CHATML)
        rc = marks(&p, "<think>\n\n</think>\n\n");
    cJSON_Delete(tools);
    /* an empty prompt still gets a buffer: callers take a string */
    if (rc == 0 && !p.buf)
        rc = markup(&p, "", 0);
    if (rc != 0) {
        free(p.buf);
        free(p.data);
        snprintf(err, errlen, "out of memory rendering the chat template");
        return CHAT_ENOMEM;
    }
    *out = p.buf;
    *data = p.data;
    *n_data = p.n_data;
    return 0;
}

const char *chat_turn_marker(int kind)
{
    return kind == CHAT_CHATML ? "<|im_start|>" : kind == CHAT_LLAMA3 || kind == CHAT_LLAMA31 ? "<|start_header_id|>"
                                                                                             : NULL;
}

int chat_turns(int kind, const char *text, const size_t *data, int n_data, size_t **at, bool **sys)
{
    const char *mark = chat_turn_marker(kind);
    const size_t len = strlen(text), n_mark = mark ? strlen(mark) : 0;
    int n = 0, cap = 0;
    *at = NULL;
    *sys = NULL;
    /* the markup between data spans: [from, to) */
    for (int d = 0; mark && d <= n_data; d++) {
        const size_t from = d == 0 ? 0 : data[2 * d - 1], to = d < n_data ? data[2 * d] : len;
        for (size_t i = from; i + n_mark <= to; i++) {
            if (memcmp(text + i, mark, n_mark) != 0)
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                size_t *a = fault_realloc(*at, (size_t)cap * sizeof *a);
                if (a)
                    *at = a;
                bool *b = a ? fault_realloc(*sys, (size_t)cap * sizeof *b) : NULL;
                if (!b) {
                    free(*at);
                    free(*sys);
                    *at = NULL;
                    *sys = NULL;
                    return -1;
                }
                *sys = b;
            }
            /* the role follows the marker in both templates, as markup */
            (*at)[n] = i;
            (*sys)[n] = i + n_mark + 6 <= to && !memcmp(text + i + n_mark, "system", 6);
            n++;
            i += n_mark - 1;
        }
    }
    return n;
}

/* chat.c - recognised chat templates.
 *
 * Owns: ChatML detection and rendering.
 * Does not own: Jinja. A template is recognised by the markers it emits;
 * anything else is reported as unsupported so the client can send a
 * formatted prompt to /v1/completions instead.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (p->n_data == p->cap_data) {
        int c = p->cap_data ? 2 * p->cap_data : 8;
        size_t *d = realloc(p->data, 2 * (size_t)c * sizeof *d);
        if (!d)
            return -1;
        p->data = d;
        p->cap_data = c;
    }
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

static int render_llama3(int kind, const chat_msg *msgs, int n_msgs, prompt_buf *p)
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
        if (llama3_msg(p, "system", cutoff, sys))
            return -1;
    }
    for (int i = first; i < n_msgs; i++) {
        const char *role = strcmp(msgs[i].role, "developer") ? msgs[i].role : "system";
        if (llama3_msg(p, role, "", msgs[i].content))
            return -1;
    }
    return markup(p, "<|start_header_id|>assistant<|end_header_id|>\n\n", 47);
}

static int render_chatml(const chat_msg *msgs, int n_msgs, prompt_buf *p)
{
    for (int i = 0; i < n_msgs; i++) {
        /* "developer" is OpenAI's newer name for the system role */
        const char *role = strcmp(msgs[i].role, "developer") ? msgs[i].role : "system";
        if (markup(p, "<|im_start|>", 12) || markup(p, role, strlen(role)) || markup(p, "\n", 1) ||
            content(p, msgs[i].content, strlen(msgs[i].content)) || markup(p, "<|im_end|>\n", 11))
            return -1;
    }
    return markup(p, "<|im_start|>assistant\n", 22);
}

int chat_render(int kind, const chat_msg *msgs, int n_msgs, char **out, size_t **data, int *n_data, char *err,
                size_t errlen)
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
    prompt_buf p = { 0 };
    int rc = kind == CHAT_CHATML ? render_chatml(msgs, n_msgs, &p) : render_llama3(kind, msgs, n_msgs, &p);
    /* an empty prompt still gets a buffer: callers take a string */
    if (rc == 0 && !p.buf)
        rc = markup(&p, "", 0);
    if (rc != 0) {
        free(p.buf);
        free(p.data);
        snprintf(err, errlen, "out of memory rendering the chat template");
        return -1;
    }
    *out = p.buf;
    *data = p.data;
    *n_data = p.n_data;
    return 0;
}

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

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* One Llama 3 message: header, Jinja-trimmed content, end of turn. */
static int llama3_msg(char **buf, size_t *len, size_t *cap, const char *role, const char *prefix,
                      const char *content)
{
    const char *a = content, *b = content + strlen(content);
    while (a < b && is_space(*a))
        a++;
    while (b > a && is_space(b[-1]))
        b--;
    return json_buf_append(buf, len, cap, "<|start_header_id|>", 19) ||
           json_buf_append(buf, len, cap, role, strlen(role)) ||
           json_buf_append(buf, len, cap, "<|end_header_id|>\n\n", 19) ||
           json_buf_append(buf, len, cap, prefix, strlen(prefix)) ||
           json_buf_append(buf, len, cap, a, (size_t)(b - a)) ||
           json_buf_append(buf, len, cap, "<|eot_id|>", 10);
}

static int render_llama3(int kind, const chat_msg *msgs, int n_msgs, char **out, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
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
        if (llama3_msg(&buf, &len, &cap, "system", cutoff, sys))
            goto out_nomem;
    }
    for (int i = first; i < n_msgs; i++) {
        const char *role = strcmp(msgs[i].role, "developer") ? msgs[i].role : "system";
        if (llama3_msg(&buf, &len, &cap, role, "", msgs[i].content))
            goto out_nomem;
    }
    if (json_buf_append(&buf, &len, &cap, "<|start_header_id|>assistant<|end_header_id|>\n\n", 47))
        goto out_nomem;
    *out = buf;
    return 0;
out_nomem:
    free(buf);
    snprintf(err, errlen, "out of memory rendering the chat template");
    return -1;
}

int chat_render(int kind, const chat_msg *msgs, int n_msgs, char **out, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    *out = NULL;
    if (kind == CHAT_NONE) {
        snprintf(err, errlen, "the model has no chat template (tokenizer.chat_template is missing from the GGUF); "
                              "send a formatted prompt to /v1/completions instead");
        return -1;
    }
    if (kind == CHAT_LLAMA3 || kind == CHAT_LLAMA31)
        return render_llama3(kind, msgs, n_msgs, out, err, errlen);
    if (kind != CHAT_CHATML) {
        snprintf(err, errlen, "the model's chat template is not one this server can render (supported: ChatML, "
                              "Llama 3); send a formatted prompt to /v1/completions instead");
        return -1;
    }
    for (int i = 0; i < n_msgs; i++) {
        /* "developer" is OpenAI's newer name for the system role */
        const char *role = strcmp(msgs[i].role, "developer") ? msgs[i].role : "system";
        if (json_buf_append(&buf, &len, &cap, "<|im_start|>", 12) ||
            json_buf_append(&buf, &len, &cap, role, strlen(role)) ||
            json_buf_append(&buf, &len, &cap, "\n", 1) ||
            json_buf_append(&buf, &len, &cap, msgs[i].content, strlen(msgs[i].content)) ||
            json_buf_append(&buf, &len, &cap, "<|im_end|>\n", 11))
            goto out_nomem;
    }
    if (json_buf_append(&buf, &len, &cap, "<|im_start|>assistant\n", 22))
        goto out_nomem;
    *out = buf;
    return 0;
out_nomem:
    free(buf);
    snprintf(err, errlen, "out of memory rendering the chat template");
    return -1;
}

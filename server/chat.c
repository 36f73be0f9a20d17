/* chat.c - recognised chat templates.
 *
 * Owns: ChatML detection and rendering.
 * Does not own: Jinja. A template is recognised by the markers it emits;
 * anything else is reported as unsupported so the client can send a
 * formatted prompt to /v1/completions instead.
 */
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
    return CHAT_UNKNOWN;
}

const char *chat_kind_name(int kind)
{
    switch (kind) {
    case CHAT_CHATML: return "chatml";
    case CHAT_UNKNOWN: return "unsupported";
    default: return "none";
    }
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
    if (kind != CHAT_CHATML) {
        snprintf(err, errlen, "the model's chat template is not one this server can render (supported: ChatML); "
                              "send a formatted prompt to /v1/completions instead");
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

/* chat.h - chat templates: recognise the model's template, render messages.
 *
 * Owns: detection of the template family from the GGUF's
 * tokenizer.chat_template text and rendering a message list into a prompt.
 * Does not own: a Jinja interpreter (we recognise common forms instead),
 * tokenization.
 * ref: ChatML as used by Qwen: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per
 * message, then "<|im_start|>assistant\n" as the generation prompt.
 */
#ifndef HYSERVE_CHAT_H
#define HYSERVE_CHAT_H

#include <stddef.h>

#include "json.h"

enum chat_kind {
    CHAT_NONE = 0,              /* the model has no chat template */
    CHAT_UNKNOWN = 1,           /* it has one we cannot render */
    CHAT_CHATML = 2,
};

int chat_detect(const char *tmpl);
const char *chat_kind_name(int kind);
/* Render msgs with the generation prompt appended. Returns 0 and a heap
 * string in *out, or -1 with a message in err. */
int chat_render(int kind, const chat_msg *msgs, int n_msgs, char **out, char *err, size_t errlen);

#endif

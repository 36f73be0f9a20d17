/* chat.h - chat templates: recognise the model's template, render messages.
 *
 * Owns: detection of the template family from the GGUF's
 * tokenizer.chat_template text and rendering a message list into a prompt.
 * Does not own: a Jinja interpreter (we recognise common forms instead),
 * tokenization (it says which bytes are content; the engine encodes them).
 * ref: ChatML as used by Qwen: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per
 * message, then "<|im_start|>assistant\n" as the generation prompt.
 * Llama 3: "<|start_header_id|>ROLE<|end_header_id|>\n\n" + trim(CONTENT) +
 * "<|eot_id|>" per message, then the assistant header; the BOS token comes
 * from the tokenizer (add_bos), not from the text. Llama 3.1's template
 * always opens with a system message whose text starts with
 * "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n".
 */
#ifndef HYSERVE_CHAT_H
#define HYSERVE_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "json.h"

enum chat_kind {
    CHAT_NONE = 0,              /* the model has no chat template */
    CHAT_UNKNOWN = 1,           /* it has one we cannot render */
    CHAT_CHATML = 2,
    CHAT_LLAMA3 = 3,            /* Llama 3 / 3.0 headers */
    CHAT_LLAMA31 = 4,           /* Llama 3.1+: a system header with the knowledge-cutoff lines */
};

int chat_detect(const char *tmpl);
const char *chat_kind_name(int kind);
/* Render msgs with the generation prompt appended. Returns 0 and a heap
 * string in *out, with the byte ranges of it that are the messages' content
 * in *data (heap, pairs [start, end), *n_data of them, in order), or -1 with
 * a message in err. Control tokens are to be parsed outside those ranges
 * only (engine_tokenize_chat): message text is data, never markup. */
int chat_render(int kind, const chat_msg *msgs, int n_msgs, char **out, size_t **data, int *n_data, char *err,
                size_t errlen);
/* The same with OpenAI tools (a JSON array, NULL for none), rendered as the
 * Qwen3 / Qwen2.5 templates do: a "# Tools" block in the system turn,
 * assistant tool calls as <tool_call> blocks, tool results as
 * <tool_response> blocks in a user turn. Or as Llama 3.1's does (its
 * default tools_in_user_message): "Environment: ipython" in the system
 * turn, the tools as indented JSON in the first user turn, one call per
 * assistant turn as {"name": ..., "parameters": ...}, results in
 * "ipython" turns as JSON strings; tools_in_system (its
 * tools_in_user_message=false): the tools in the system turn instead, after
 * the date lines. Not Llama 3.0. no_think: Qwen3's enable_thinking=false,
 * an empty <think></think> after the generation prompt. Returns 0, -1 (the request asks for what the template cannot do)
 * or CHAT_ENOMEM, with err filled. */
#define CHAT_ENOMEM (-2)
int chat_render_tools(int kind, const chat_msg *msgs, int n_msgs, const char *tools, bool no_think,
                      bool tools_in_system, char **out, size_t **data, int *n_data, char *err, size_t errlen);
/* The control-token text that opens a turn of kind's rendered prompts
 * (ChatML "<|im_start|>", Llama 3 "<|start_header_id|>"); NULL for none. */
const char *chat_turn_marker(int kind);
/* Where the turns of text (as chat_render made it, with its data spans)
 * open: the byte offset of each turn marker outside the data spans, in
 * order (the generation prompt's is the last), and whether that turn is a
 * system turn. Returns the count, with *at and *sys heap arrays of it
 * (NULL for none), or -1 when out of memory. */
int chat_turns(int kind, const char *text, const size_t *data, int n_data, size_t **at, bool **sys);
/* Qwen3-style reasoning in generated text: "<think>R</think>C" (the
 * opening tag may be in the prompt instead). Returns true when there is
 * some, with R (newlines around it dropped) at text + *r_off, *r_len and C
 * (leading newlines dropped) at text + *c_off, *c_len. */
bool chat_split_reasoning(const char *text, size_t len, size_t *r_off, size_t *r_len, size_t *c_off, size_t *c_len);
/* Tool calls in generated text: for ChatML every
 * <tool_call>{"name", "arguments"}</tool_call> block, for Llama 3.1 one
 * {"name", "parameters"} object ending the text. A last call cut off
 * (max_tokens, a stop string) is dropped, the complete ones before it
 * stand. Returns the number of complete calls, with *calls an array of
 * OpenAI tool_calls (ids "call_<id_prefix>_<i>", arguments as JSON text;
 * empty when the only call was cut off) and *content_len the length of the
 * text before the first call, trailing whitespace dropped: the markup never
 * reaches the content. *calls NULL (and 0) when there are none or one is
 * malformed: then the text is all content. */
int chat_parse_tool_calls(int kind, const char *text, size_t len, const char *id_prefix, size_t *content_len,
                          cJSON **calls);
/* The text a tool call of kind's format starts with ("<tool_call>",
 * or "{\"name\"" for Llama 3.1): streamed content is held from there on. */
const char *chat_tool_tag(int kind);

#endif

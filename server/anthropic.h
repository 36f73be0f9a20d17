/* anthropic.h - Anthropic's Messages API (POST /v1/messages,
 * /v1/messages/count_tokens) over the chat flow: the body becomes a
 * chat-completions body (generate.c runs it), the answer and the stream
 * come back as a message object and its events, errors as
 * {"type": "error", "error": {"type", "message"}}. ref: docs/serving.md 3.8.
 */
#ifndef HYSERVE_ANTHROPIC_H
#define HYSERVE_ANTHROPIC_H

#include "http.h"

int anthropic_messages_route(http_req *hr);
int anthropic_count_tokens_route(http_req *hr);

#endif

/* responses.h - OpenAI's Responses API (POST /v1/responses) over the chat
 * flow: the body becomes a chat-completions body (generate.c runs it), the
 * answer and the stream come back as a response object and its typed
 * events. ref: docs/serving.md 3.7.
 */
#ifndef HYSERVE_RESPONSES_H
#define HYSERVE_RESPONSES_H

#include "http.h"

/* The store previous_response_id reads: the last RESPONSES_STORE_MAX
 * responses made with store (the default), at most RESPONSES_STORE_BYTES
 * of conversation text in all; the oldest go first. In memory only. */
#define RESPONSES_STORE_MAX 256
#define RESPONSES_STORE_BYTES (64u << 20)

int responses_route(http_req *hr);

#endif

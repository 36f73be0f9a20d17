/* json.h - cJSON at the edge: request bodies -> validated structs, and
 * the response / event shapes of the TGI and OpenAI APIs.
 *
 * Owns: field names, types, defaults and validation rules of /generate,
 * /generate_stream, /v1/completions, /v1/chat/completions and /tokenize;
 * the JSON of responses, stream events and error envelopes; making text
 * valid UTF-8 before it goes into JSON.
 * Does not own: tokenization, admission, HTTP.
 * ref: docs/serving.md 2 (TGI), 3 (OpenAI), 4 (errors).
 */
#ifndef HYSERVE_JSON_H
#define HYSERVE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "sampler.h"

/* Prompts one /v1/completions request may carry. */
#define JSON_MAX_BATCH 32
/* Largest n / best_of the parser accepts; --max-n is json_check_gen's. */
#define JSON_MAX_N 1000000
/* How deep one tool's JSON may nest (the tool object's values at depth 1):
 * a deeper one is a 400; the chat template writes each tool out as Python's
 * json.dumps would, and stops there. */
#define CHAT_TOOL_MAX_DEPTH 64

enum api_kind {
    API_TGI = 0,                /* /generate, /generate_stream, POST / */
    API_OAI_COMPLETION = 1,     /* /v1/completions */
    API_OAI_CHAT = 2,           /* /v1/chat/completions */
};

enum json_status {
    JSON_OK = 0,
    JSON_EPARSE = -1,           /* not JSON: 400 */
    JSON_EINVALID = -2,         /* wrong types or values: 422 (OpenAI: 400) */
    JSON_ENOMEM = -3,
    JSON_EMODEL = -4,           /* json_check_gen: a model this server does not serve: 404 */
};

/* cJSON allocates through the fault countdown (fault.h), so a test can fail
 * its allocations like any other; the server calls this once at start-up,
 * before any thread parses. */
void json_init(void);
/* cJSON_ParseWithLengthOpts that tells a body it could not parse for want
 * of memory (*oom set: a 500, not the client's fault) from one that is not
 * JSON (*oom clear: a 400). */
cJSON *json_parse_body(const char *body, size_t len, const char **end, bool *oom);
/* Whether an allocation for JSON failed on this thread since the last
 * call (the object built meanwhile lacks something: send a static error
 * instead); frees what json_put could not attach. Senders (http_send_json,
 * json_sse_frame) call it after freeing what they were given; a request
 * calls it as it starts, so nothing carries over. */
bool json_oom_take(void);

/* cJSON_AddItemToObject and cJSON_AddItemToArray that never lose item:
 * when it cannot be attached (no memory for the key, or a NULL parent that
 * failed to be made) it is kept aside, the build is marked out of memory,
 * and json_oom_take frees it. Return whether item was attached. */
bool json_put(cJSON *obj, const char *key, cJSON *item);
bool json_push(cJSON *arr, cJSON *item);

/* One chat message, content flattened to text. */
typedef struct chat_msg {
    char *role;
    char *content;
    char *tool_calls;           /* assistant: its tool_calls as a JSON array (compact), or NULL */
} chat_msg;

/* A validated generation request. Owned by the route handler (and then by
 * the stream for streaming requests); json_gen_free releases it. */
typedef struct gen_request {
    int api;                    /* enum api_kind */
    bool stream;
    char *prompt;               /* TGI inputs / completion prompt; the rendered chat prompt for chat; NULL with prompt_ids */
    int32_t *prompt_ids;        /* [n_prompt_ids] completions: the prompt given as token ids */
    int n_prompt_ids;
    int n_batch;                /* completions: prompts given as an array of 2 or more (one choice each); else 0 */
    char **batch_prompt;        /* [n_batch] each a string prompt, or NULL when that one is token ids */
    int32_t **batch_ids;        /* [n_batch] the token-id prompts (NULL for strings) */
    int *batch_n_ids;           /* [n_batch] */
    chat_msg *msgs;             /* [n_msgs] chat only */
    int n_msgs;
    int max_new_tokens;         /* -1: not given */
    int truncate;               /* TGI: keep only the last N prompt tokens; 0: off */
    sampler_params sp;
    bool seed_given;
    sampler_bias *bias;         /* [n_bias] OpenAI logit_bias; sp.bias points here */
    int n_bias;
    bool ignore_eos;            /* keep generating past end-of-generation tokens (vLLM, llama-server) */
    char **stop;                /* [n_stop] non-empty strings */
    int n_stop;
    bool details;               /* TGI: token details */
    bool return_full_text;      /* TGI: prepend the prompt */
    bool return_usage;          /* TGI extension: usage block */
    bool include_usage;         /* OpenAI stream_options.include_usage */
    bool logprobs;              /* OpenAI: logprobs of the generated tokens (TGI: always in details) */
    int top_logprobs;           /* 0..SAMPLER_MAX_TOP: chat top_logprobs, completions logprobs N, TGI top_n_tokens */
    bool echo;                  /* completions: the prompt before the completion */
    bool prompt_logprobs;       /* logprobs of the prompt's tokens: completions echo + logprobs, TGI
                                 * decoder_input_details */
    char model[128];            /* OpenAI: echoed back */
    char cache_salt[256];       /* prefix cache isolation (OpenAI body, TGI parameters); "" for none */
    int constraint;             /* enum gen_constraint: structured output */
    char *constraint_src;       /* [constraint_len] the JSON Schema or regex text (heap), NULL for json_object */
    size_t constraint_len;
    char constraint_param[32];  /* the field it came from, for errors: "response_format", "grammar", ... */
    char *tools;                /* chat: the tools array as JSON (compact), NULL without tools */
    int tool_choice;            /* enum gen_tool_choice */
    bool no_think;              /* chat_template_kwargs.enable_thinking == false */
    bool tools_in_system;       /* chat_template_kwargs.tools_in_user_message == false (Llama 3.1) */
    int n;                      /* OpenAI n: choices per prompt (1..JSON_MAX_N; the route checks --max-n) */
    int best_of;                /* TGI best_of: sequences generated, the best answered (1..JSON_MAX_N) */
    int speculative;            /* "speculative": 0 not given (the server's --spec-type), 1 true (n-gram
                                 * drafts too), -1 false (no drafts, the prediction unused) */
    bool has_prediction;        /* "prediction" given (usage then carries completion_tokens_details) */
    char *pred_text;            /* prediction {"type": "content"}: its text (heap; the route tokenizes it) */
    int32_t *pred_ids;          /* [n_pred_ids] prediction {"type": "tokens"} or the text's tokens (heap) */
    int n_pred_ids;
} gen_request;

/* Token ids a "prediction" may hold. */
#define JSON_MAX_PREDICTION (1 << 20)

/* What the output must match (the values of the scheduler's
 * enum sched_constraint). */
enum gen_constraint {
    GEN_CONSTRAINT_NONE = 0,
    GEN_CONSTRAINT_JSON_SCHEMA = 1,
    GEN_CONSTRAINT_JSON_OBJECT = 2,
    GEN_CONSTRAINT_REGEX = 3,
    GEN_CONSTRAINT_TOOL_CALLS = 4,
    GEN_CONSTRAINT_TOOL_CALLS_AUTO = 5,
    GEN_CONSTRAINT_GBNF = 6,
};

/* OpenAI tool_choice. */
enum gen_tool_choice {
    TOOL_CHOICE_NONE = 0,       /* no tools, or "none": tool markup is not parsed */
    TOOL_CHOICE_AUTO = 1,
    TOOL_CHOICE_REQUIRED = 2,
    TOOL_CHOICE_NAMED = 3,
};

/* Parse and validate body for the given API. max_stop bounds the stop
 * list. On error returns JSON_E* with a message in err and the offending
 * field (or "") in param. */
int json_parse_gen(gen_request *g, int api, const char *body, size_t len, int max_stop,
                   char *err, size_t errlen, char *param, size_t paramlen);
void json_gen_free(gen_request *g);

/* What the server allows a parsed generation request (its options and
 * the model's vocabulary), for json_check_gen. */
typedef struct gen_limits {
    int max_stop_len;           /* --max-stop-length: bytes of one stop sequence */
    int max_n;                  /* --max-n: OpenAI n, TGI best_of */
    bool stream;                /* the route streams whatever the body says (/generate_stream) */
    bool any_model;             /* --accept-any-model */
    const char (*names)[128];   /* [n_names] the served model names (--served-model-name) */
    int n_names;
    const char *name;           /* the one the model error names */
    int n_vocab;                /* token ids are 0..n_vocab-1 */
} gen_limits;

/* The field rules of a parsed request against lim, in this order: the stop
 * sequences' length, "model" (a URL names this endpoint and is cleared;
 * another name than a served one is JSON_EMODEL on the OpenAI routes),
 * lim->stream sets g->stream, n / best_of against --max-n and against
 * streaming, several prompts never streamed, TGI decoder_input_details
 * never streamed, prompt token ids inside the vocabulary. Returns JSON_OK,
 * JSON_EINVALID or JSON_EMODEL with a message in err and the field in
 * param. */
int json_check_gen(gen_request *g, const gen_limits *lim, char *err, size_t errlen, char *param, size_t paramlen);
/* OpenAI logit_bias: every token inside the vocabulary. Returns JSON_OK or
 * JSON_EINVALID with a message in err (the field is "logit_bias"). */
int json_check_bias(const gen_request *g, int n_vocab, char *err, size_t errlen);
/* A tool-call constraint of g written in format's form ("llama3.1"; the
 * Qwen form by default), the model's chat template's: adds "format" to its
 * spec. Nothing to do without one. Returns 0, or -1 out of memory. */
int json_set_tool_format(gen_request *g, const char *format);

/* /tokenize: {"inputs": "..."} -> *inputs (heap). */
int json_parse_tokenize(const char *body, size_t len, char **inputs, char *err, size_t errlen);

/* /detokenize: {"tokens": [ids]} -> *ids (heap, *n_ids entries, each
 * 0..max_id). */
int json_parse_detokenize(const char *body, size_t len, int32_t max_id, int32_t **ids, int *n_ids, char *err,
                          size_t errlen);

/* A string item holding text made valid UTF-8 (invalid bytes -> U+FFFD). */
cJSON *json_text(const char *s, size_t len);
/* The same, added to an object. Returns the item or NULL. */
cJSON *json_add_text(cJSON *obj, const char *name, const char *s, size_t len);

/* usage.prompt_tokens_details.cached_tokens (OpenAI): prompt tokens the
 * prefix cache restored instead of prefilling. Returns usage. */
cJSON *json_add_cached_tokens(cJSON *usage, int cached_tokens);

/* Speculative decoding in an answer: OpenAI's
 * usage.completion_tokens_details.{accepted,rejected}_prediction_tokens
 * when the request gave a prediction, and hyserve's "speculative":
 * {"verify_steps", "draft_tokens", "accepted_tokens"} when drafts were
 * verified. Returns obj. */
cJSON *json_add_speculative(cJSON *obj, bool prediction, uint64_t pred_accepted, uint64_t pred_rejected,
                            uint64_t verify_steps, uint64_t drafted, uint64_t accepted);

/* A 64-bit integer member written in full digits (a cJSON number is a
 * double, exact only to 2^53). Returns the item or NULL. */
cJSON *json_add_u64(cJSON *obj, const char *name, uint64_t v);

/* Error bodies. TGI: {"error": msg, "error_type": type}. OpenAI:
 * {"error": {"message","type","param","code"}}. */
cJSON *json_error_tgi(const char *msg, const char *error_type);
cJSON *json_error_oai(const char *msg, const char *type, const char *param, const char *code);

/* Serialize obj (deleted) as one SSE frame "data:<json>\n\n" (TGI writes no
 * space after the colon; OpenAI frames use "data: "). Appends to *buf.
 * Returns 0 or -1. */
int json_sse_frame(cJSON *obj, bool space, char **buf, size_t *len, size_t *cap);
/* The same as a named event: "event: NAME\ndata: {...}\n\n". */
int json_sse_event(const char *name, cJSON *obj, char **buf, size_t *len, size_t *cap);
/* Where a translated stream's frames go (responses.c, anthropic.c). */
typedef struct json_sse_out {
    char **buf;
    size_t *len, *cap;
} json_sse_out;
/* A typed event (obj taken): "event: TYPE" and {"type": TYPE,
 * "sequence_number": seq (when seq >= 0), obj's fields}. 0 or -1. */
int json_sse_typed(const json_sse_out *o, const char *type, int seq, cJSON *obj);
/* Chat-completions pieces other APIs translate into: one tool_calls entry
 * {id, type, function: {name, arguments}}; one tools entry {type,
 * function: {name, description, parameters}} (absent ones left out); a
 * named tool_choice {type, function: {name}}. */
cJSON *json_chat_call(const char *id, const char *name, const char *args);
cJSON *json_chat_tool(const cJSON *name, const cJSON *desc, const cJSON *params);
cJSON *json_chat_named(const char *name);
/* The first key of obj not in known (NULL-terminated), or NULL. */
const char *json_unknown_key(const cJSON *obj, const char *const *known);
/* Append raw bytes to a growable buffer. Returns 0 or -1. */
int json_buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

#endif

/* errors.c - error kinds -> HTTP status and envelope, in one place (see
 * errors.h). ref: docs/serving.md 4.
 */
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "json.h"

typedef struct err_map {
    int kind;
    int status;
    const char *tgi_type;
    const char *oai_type;
} err_map;

static const err_map ERRS[] = {
    {ERR_BAD_JSON, 400, "bad_request", "invalid_request_error"},
    {ERR_VALIDATION, 422, "validation", "invalid_request_error"},
    {ERR_CONTEXT, 422, "validation", "invalid_request_error"},
    {ERR_TEMPLATE, 422, "template_error", "invalid_request_error"},
    {ERR_NOT_FOUND, 404, "not_found", "invalid_request_error"},
    {ERR_METHOD, 405, "method_not_allowed", "invalid_request_error"},
    {ERR_TOO_LARGE, 413, "payload_too_large", "invalid_request_error"},
    {ERR_HEAD_TOO_LARGE, 431, "headers_too_large", "invalid_request_error"},
    {ERR_OVERLOADED, 429, "overloaded", "overloaded_error"},
    {ERR_LOADING, 503, "not_ready", "server_error"},
    {ERR_DRAINING, 503, "draining", "server_error"},
    {ERR_GENERATION, 424, "generation", "server_error"},
    /* A request cancelled by DELETE /requests/{id} must not come back: the
     * official clients retry 408, 409, 429 and every 5xx (the openai
     * package re-ran the whole generation on the 503 this used to be).
     * 499 is nginx's "client closed request", the status logs and proxies
     * already use for a request ended from the client's side; as a 4xx it
     * is not retried by the openai or huggingface clients, and unlike a
     * 400 (vLLM's answer to an aborted request) it does not say the
     * request was malformed. The body names the cancellation. */
    {ERR_CANCELLED, 499, "cancelled", "cancelled"},
    {ERR_MODEL, 404, "not_found", "invalid_request_error"},
    {ERR_NOT_IMPLEMENTED, 501, "not_implemented", "invalid_request_error"},
    {ERR_INTERNAL, 500, "internal", "server_error"},   /* last: the kind of an unknown kind */
};

static bool is_openai(const http_req *hr)
{
    return !strncmp(hr->path, "/v1/", 4);
}

int errors_send(http_req *hr, int kind, const char *msg, const err_extra *x)
{
    const err_map *m = &ERRS[sizeof(ERRS) / sizeof(ERRS[0]) - 1];
    for (size_t i = 0; i < sizeof(ERRS) / sizeof(ERRS[0]); i++)
        if (ERRS[i].kind == kind)
            m = &ERRS[i];
    int status = m->status;
    cJSON *body;
    if (is_openai(hr)) {
        /* OpenAI clients expect 400 for every invalid request */
        if (status == 422)
            status = 400;
        const char *code = kind == ERR_CONTEXT ? "context_length_exceeded" : kind == ERR_MODEL ? "model_not_found" : NULL;
        body = json_error_oai(msg, m->oai_type, x ? x->param : NULL, code);
        if (body && kind == ERR_CONTEXT && x && x->max_total > 0) {
            cJSON *e = cJSON_GetObjectItemCaseSensitive(body, "error");
            cJSON_AddNumberToObject(e, "n_prompt_tokens", x->n_prompt);
            cJSON_AddNumberToObject(e, "max_total_tokens", x->max_total);
        }
    } else {
        body = json_error_tgi(msg, m->tgi_type);
        if (body && kind == ERR_CONTEXT && x && x->max_total > 0) {
            cJSON_AddNumberToObject(body, "n_prompt_tokens", x->n_prompt);
            cJSON_AddNumberToObject(body, "max_total_tokens", x->max_total);
        }
    }
    if (!hr->failure) {
        switch (kind) {
        case ERR_BAD_JSON: case ERR_VALIDATION: case ERR_CONTEXT: case ERR_TEMPLATE: case ERR_TOO_LARGE:
        case ERR_HEAD_TOO_LARGE: case ERR_NOT_IMPLEMENTED:
            hr->failure = "validation";
            break;
        case ERR_OVERLOADED: hr->failure = "overloaded"; break;
        case ERR_CANCELLED: hr->failure = "cancelled"; break;
        case ERR_LOADING: case ERR_DRAINING: hr->failure = "unavailable"; break;
        case ERR_NOT_FOUND: case ERR_METHOD: case ERR_MODEL: hr->failure = "not_found"; break;
        case ERR_GENERATION: hr->failure = "generation"; break;
        default: hr->failure = "internal"; break;
        }
    }
    char retry[16];
    const char *hdrs[5] = {NULL};
    int nh = 0;
    if (kind == ERR_OVERLOADED || kind == ERR_LOADING || kind == ERR_DRAINING) {
        int s = kind == ERR_OVERLOADED && hr->srv->sched ? sched_retry_after_s(hr->srv->sched) : 5;
        snprintf(retry, sizeof(retry), "%d", s);
        hdrs[nh++] = "Retry-After";
        hdrs[nh++] = retry;
    }
    if (kind == ERR_METHOD && x && x->allow) {
        hdrs[nh++] = "Allow";
        hdrs[nh++] = x->allow;
    }
    return http_send_json(hr, status, body, hdrs);
}

int errors_of_json(int jrc)
{
    return jrc == JSON_EPARSE    ? ERR_BAD_JSON
           : jrc == JSON_ENOMEM  ? ERR_INTERNAL
           : jrc == JSON_EMODEL  ? ERR_MODEL
                                 : ERR_VALIDATION;
}

int errors_reply(http_req *hr, int kind, const char *msg)
{
    return errors_send(hr, kind, msg, NULL);
}

bool errors_ready(http_req *hr)
{
    int st = atomic_load_explicit(&hr->srv->state, memory_order_acquire);
    if (st == SERVER_READY)
        return true;
    if (st == SERVER_DRAINING)
        errors_reply(hr, ERR_DRAINING, "the server is shutting down and accepts no new requests");
    else if (st == SERVER_LOADING)
        errors_reply(hr, ERR_LOADING, "the model is still loading; retry shortly");
    else
        errors_reply(hr, ERR_INTERNAL, "the model failed to load; see the server log");
    return false;
}

int errors_of_sched(int status)
{
    switch (status) {
    case SCHED_EFULL: case SCHED_ETIMEOUT: return ERR_OVERLOADED;
    case SCHED_EDRAINING: case SCHED_ECANCELLED: return ERR_DRAINING;
    case SCHED_EDELETED: return ERR_CANCELLED;
    case SCHED_ETOOBIG: return ERR_CONTEXT;
    case SCHED_EINVAL: return ERR_VALIDATION;
    case SCHED_EENGINE: return ERR_GENERATION;
    default: return ERR_INTERNAL;
    }
}

/* logprobs.c - the log-probability blocks of the OpenAI and TGI answers.
 *
 * Owns: lp_list and the JSON of logprobs on both APIs (see logprobs.h).
 * Does not own: the numbers (sampler, scheduler) or the framing (stream.c).
 * ref: docs/serving.md 3.3; OpenAI's API reference (ChatCompletionTokenLogprob,
 * the legacy completions Logprobs object); TGI's Token / top_tokens.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "json.h"
#include "logprobs.h"
#include "tokenizer.h"

int lp_list_push(lp_list *l, int32_t id, float logprob, bool special, const sampler_top *top)
{
    lp_token *v = fault_grow(l->v, l->n, &l->cap, sizeof *v, 32);
    if (!v)
        return -1;
    l->v = v;
    lp_token *t = &l->v[l->n++];
    t->id = id;
    t->logprob = logprob;
    t->special = special;
    if (top)
        t->top = *top;
    else
        t->top.n = 0;
    return 0;
}

void lp_list_free(lp_list *l)
{
    if (!l)
        return;
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* The token's raw bytes into buf (cap bytes; longer pieces are cut, which
 * no vocabulary here reaches). Returns the length. */
static size_t piece(const engine *e, int32_t id, char *buf, size_t cap)
{
    int n = tok_piece(engine_tokenizer(e), id, buf, cap);
    if (n < 0)
        return 0;
    return (size_t)n < cap ? (size_t)n : cap;
}

/* A logprob, or null for NaN (no logprob: the first prompt token). JSON
 * has no -Infinity: a banned token's -inf is written as -9999, as OpenAI
 * writes the logprob of a token it could not have drawn. */
static cJSON *lp_number(float lp)
{
    if (isnan(lp))
        return cJSON_CreateNull();
    return cJSON_CreateNumber(isinf(lp) ? -9999.0 : (double)lp);
}

/* {"token", "logprob", "bytes"} of one token: OpenAI chat's entry. */
static cJSON *oai_entry(const engine *e, int32_t id, float logprob)
{
    char buf[256];
    size_t n = piece(e, id, buf, sizeof(buf));
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    if (!o || !bytes) {
        cJSON_Delete(o);
        cJSON_Delete(bytes);
        return NULL;
    }
    json_add_text(o, "token", buf, n);
    json_put(o, "logprob", lp_number(logprob));
    for (size_t i = 0; i < n; i++)
        json_push(bytes, cJSON_CreateNumber((unsigned char)buf[i]));
    json_put(o, "bytes", bytes);
    return o;
}

cJSON *lp_oai_chat(const engine *e, const lp_token *t, int n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    if (!o || !content) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (t[i].special)
            continue;
        cJSON *it = oai_entry(e, t[i].id, t[i].logprob);
        cJSON *top = cJSON_AddArrayToObject(it, "top_logprobs");
        for (int k = 0; top && k < t[i].top.n; k++)
            json_push(top, oai_entry(e, t[i].top.id[k], t[i].top.logprob[k]));
        json_push(content, it);
    }
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

cJSON *lp_oai_completion(const engine *e, const lp_token *t, int n, bool with_top, size_t offset0,
                         size_t *offset_end)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = with_top ? cJSON_AddArrayToObject(o, "top_logprobs") : cJSON_AddNullToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    if (!o || !toks || !lps || !tops || !offs) {
        cJSON_Delete(o);
        return NULL;
    }
    size_t off = offset0;
    char buf[256];
    for (int i = 0; i < n; i++) {
        size_t len = piece(e, t[i].id, buf, sizeof(buf));
        json_push(toks, json_text(buf, len));
        json_push(lps, lp_number(t[i].logprob));
        json_push(offs, cJSON_CreateNumber((double)off));
        off += len;
        if (!with_top)
            continue;
        if (isnan(t[i].logprob)) {
            json_push(tops, cJSON_CreateNull());
            continue;
        }
        /* {"token text": logprob}, most likely first; a text two ids share
         * keeps the likelier one, as a JSON object can hold a key once */
        cJSON *d = cJSON_CreateObject();
        for (int k = 0; d && k < t[i].top.n; k++) {
            char tb[256];
            size_t tl = piece(e, t[i].top.id[k], tb, sizeof(tb));
            cJSON *key = json_text(tb, tl);
            if (key && !cJSON_GetObjectItemCaseSensitive(d, key->valuestring))
                json_put(d, key->valuestring, lp_number(t[i].top.logprob[k]));
            cJSON_Delete(key);
        }
        json_push(tops, d);
    }
    if (offset_end)
        *offset_end = off;
    return o;
}

cJSON *lp_tgi_token(const engine *e, int32_t id, float logprob, bool special)
{
    char buf[256];
    size_t n = piece(e, id, buf, sizeof(buf));
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "id", id);
    json_add_text(o, "text", buf, n);
    json_put(o, "logprob", lp_number(logprob));
    cJSON_AddBoolToObject(o, "special", special);
    return o;
}

cJSON *lp_tgi_top(const engine *e, const sampler_top *top)
{
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; a && k < top->n; k++)
        json_push(a, lp_tgi_token(e, top->id[k], top->logprob[k], tok_is_eog(engine_tokenizer(e), top->id[k])));
    return a;
}

/* json.c - request parsing/validation and response shapes.
 *
 * Owns: TGI and OpenAI field rules (defaults, ranges, the "not supported"
 * list), error envelopes, SSE framing of a JSON object, UTF-8 repair.
 * Does not own: chat templates (chat.c), what the numbers mean to the
 * scheduler.
 * ref: docs/serving.md 2.1 (validation rules and wording, after
 * TGI's router/src/validation.rs), 3.1 (OpenAI request fields).
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "json.h"

/* Set by an allocation for JSON that failed on this thread (cJSON's own,
 * json_text's, a key json_put could not copy): the object being built
 * lacks something, so whoever sends it sends a static error instead
 * (json_oom_take). */
static _Thread_local bool json_oom;

/* ---------------------------------------------------------------------- */
/* Text and buffers                                                       */
/* ---------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid. */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c >= 0x01 && c < 0x80)
        return 1;
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;   /* NUL, continuation byte, or never valid */
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

cJSON *json_text(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t bad = 0;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_seq_len(u + i, len - i);
        if (l == 0) {
            bad++;
            i++;
        } else {
            i += l;
        }
    }
    char *out = fault_malloc(len + bad * 2 + 1);
    if (!out) {
        json_oom = true;
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_seq_len(u + i, len - i);
        if (l == 0) {
            out[o++] = (char)0xEF;
            out[o++] = (char)0xBF;
            out[o++] = (char)0xBD;
            i++;
        } else {
            memcpy(out + o, s + i, l);
            o += l;
            i += l;
        }
    }
    out[o] = '\0';
    cJSON *item = cJSON_CreateString(out);
    free(out);
    return item;
}

/* ---------------------------------------------------------------------- */
/* cJSON's allocator                                                      */
/* ---------------------------------------------------------------------- */

/* Items json_put and json_push could not attach, kept (in static storage,
 * which needs no allocation) until json_oom_take frees them: the builder
 * may still be filling them in, so they cannot be freed on the spot. */
static _Thread_local cJSON json_orphans = {.type = cJSON_Array};

static void *json_malloc(size_t n)
{
    void *p = fault_malloc(n);
    if (!p)
        json_oom = true;
    return p;
}

void json_init(void)
{
    cJSON_Hooks h = {.malloc_fn = json_malloc, .free_fn = free};
    cJSON_InitHooks(&h);
}

bool json_oom_take(void)
{
    const bool was = json_oom;
    json_oom = false;
    while (json_orphans.child)
        cJSON_Delete(cJSON_DetachItemViaPointer(&json_orphans, json_orphans.child));
    return was;
}

cJSON *json_parse_body(const char *body, size_t len, const char **end, bool *oom)
{
    json_oom_take();
    const char *stop = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &stop, false);
    *oom = !j && json_oom_take();
    /* RFC 8259: a JSON text is one value with optional whitespace around
     * it; bytes after the value (a second document, a smuggled tail) make
     * the body malformed, at the first of them */
    if (j && stop) {
        while (stop < body + len && (*stop == ' ' || *stop == '\t' || *stop == '\r' || *stop == '\n'))
            stop++;
        if (stop < body + len) {
            cJSON_Delete(j);
            j = NULL;
        }
    }
    if (end)
        *end = stop;
    return j;
}

/* Keeps item, which could not be attached, for json_oom_take to free. */
static bool orphan(cJSON *item)
{
    json_oom = true;
    if (item)
        cJSON_AddItemToArray(&json_orphans, item);     /* allocates nothing */
    return false;
}

bool json_put(cJSON *obj, const char *key, cJSON *item)
{
    if (obj && item && cJSON_AddItemToObject(obj, key, item))
        return true;
    return orphan(item);
}

bool json_push(cJSON *arr, cJSON *item)
{
    if (arr && item && cJSON_AddItemToArray(arr, item))
        return true;
    return orphan(item);
}

cJSON *json_add_text(cJSON *obj, const char *name, const char *s, size_t len)
{
    cJSON *item = json_text(s, len);
    if (item && !cJSON_AddItemToObject(obj, name, item)) {
        cJSON_Delete(item);
        return NULL;
    }
    return item;
}

int json_buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 512;
        while (c < *len + n + 1)
            c *= 2;
        char *b = fault_realloc(*buf, c);
        if (!b)
            return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int json_sse_frame(cJSON *obj, bool space, char **buf, size_t *len, size_t *cap)
{
    char *txt = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (json_oom_take() || !txt) {     /* the event lacks something: the caller ends the stream */
        cJSON_free(txt);
        return -1;
    }
    int rc = json_buf_append(buf, len, cap, space ? "data: " : "data:", space ? 6 : 5);
    if (!rc)
        rc = json_buf_append(buf, len, cap, txt, strlen(txt));
    if (!rc)
        rc = json_buf_append(buf, len, cap, "\n\n", 2);
    cJSON_free(txt);
    return rc;
}

int json_sse_event(const char *name, cJSON *obj, char **buf, size_t *len, size_t *cap)
{
    if (json_buf_append(buf, len, cap, "event: ", 7) || json_buf_append(buf, len, cap, name, strlen(name)) ||
        json_buf_append(buf, len, cap, "\n", 1)) {
        cJSON_Delete(obj);
        return -1;
    }
    return json_sse_frame(obj, true, buf, len, cap);
}

int json_sse_typed(const json_sse_out *o, const char *type, int seq, cJSON *obj)
{
    cJSON *e = cJSON_CreateObject();
    if (!obj || !e) {
        cJSON_Delete(obj);
        cJSON_Delete(e);
        return -1;
    }
    cJSON_AddStringToObject(e, "type", type);
    if (seq >= 0)
        cJSON_AddNumberToObject(e, "sequence_number", seq);
    while (obj->child) {
        cJSON *c = cJSON_DetachItemViaPointer(obj, obj->child);
        if (!cJSON_AddItemToObject(e, c->string, c))
            cJSON_Delete(c);
    }
    cJSON_Delete(obj);
    return json_sse_event(type, e, o->buf, o->len, o->cap);
}

cJSON *json_chat_call(const char *id, const char *name, const char *args)
{
    cJSON *c = cJSON_CreateObject(), *fn;
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", args);
    return c;
}

cJSON *json_chat_tool(const cJSON *name, const cJSON *desc, const cJSON *params)
{
    cJSON *w = cJSON_CreateObject(), *fn;
    cJSON_AddStringToObject(w, "type", "function");
    fn = cJSON_AddObjectToObject(w, "function");
    if (name)
        json_put(fn, "name", cJSON_Duplicate(name, true));
    if (desc)
        json_put(fn, "description", cJSON_Duplicate(desc, true));
    if (params)
        json_put(fn, "parameters", cJSON_Duplicate(params, true));
    return w;
}

cJSON *json_chat_named(const char *name)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name);
    return c;
}

const char *json_unknown_key(const cJSON *obj, const char *const *known)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, obj)
    {
        int i = 0;
        while (known[i] && strcmp(known[i], c->string))
            i++;
        if (!known[i])
            return c->string;
    }
    return NULL;
}

cJSON *json_error_tgi(const char *msg, const char *error_type)
{
    cJSON *o = cJSON_CreateObject();
    if (!o || !json_add_text(o, "error", msg, strlen(msg)) || !cJSON_AddStringToObject(o, "error_type", error_type)) {
        cJSON_Delete(o);    /* out of memory: NULL, and the caller's static answer */
        return NULL;
    }
    return o;
}

cJSON *json_error_oai(const char *msg, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_CreateObject();
    if (!o || !e) {
        cJSON_Delete(o);
        cJSON_Delete(e);
        return NULL;
    }
    bool ok = json_put(o, "error", e) && json_add_text(e, "message", msg, strlen(msg)) && cJSON_AddStringToObject(e, "type", type);
    ok = ok && (param && *param ? cJSON_AddStringToObject(e, "param", param) : cJSON_AddNullToObject(e, "param"));
    ok = ok && (code && *code ? cJSON_AddStringToObject(e, "code", code) : cJSON_AddNullToObject(e, "code"));
    if (!ok) {
        cJSON_Delete(o);    /* out of memory: NULL, and the caller's static answer */
        return NULL;
    }
    return o;
}

/* ---------------------------------------------------------------------- */
/* Field readers: 0 absent or null, 1 set, -1 invalid (err filled)        */
/* ---------------------------------------------------------------------- */

typedef struct perr {
    char *err;
    size_t errlen;
    char *param;
    size_t paramlen;
    const char *prefix;         /* "" or "parameters." for messages */
    bool oom;                   /* the failure was an allocation: a 500, not the request's fault */
} perr;

__attribute__((format(printf, 3, 4))) static int fail(perr *pe, const char *field, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(pe->err, pe->errlen, "`%s`: %s", field, msg);
    snprintf(pe->param, pe->paramlen, "%s", field);
    return -1;
}

static int fail_oom(perr *pe, const char *field)
{
    pe->oom = true;
    return fail(pe, field, "out of memory");
}

static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static int get_bool(const cJSON *obj, const char *name, bool *out, perr *pe)
{
    const cJSON *it = field(obj, name);
    if (!it)
        return 0;
    if (!cJSON_IsBool(it))
        return fail(pe, name, "expected true or false");
    *out = cJSON_IsTrue(it);
    return 1;
}

static int get_num(const cJSON *obj, const char *name, double *out, perr *pe)
{
    const cJSON *it = field(obj, name);
    if (!it)
        return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return fail(pe, name, "expected a number");
    *out = it->valuedouble;
    return 1;
}

static int get_int(const cJSON *obj, const char *name, double lo, double hi, double *out, perr *pe)
{
    double v;
    int rc = get_num(obj, name, &v, pe);
    if (rc <= 0)
        return rc;
    if (v != floor(v))
        return fail(pe, name, "expected an integer");
    if (v < lo || v > hi) {
        char range[96];
        snprintf(range, sizeof(range), "%.0f..%.0f", lo, hi);
        return fail(pe, name, "must be in %s", range);
    }
    *out = v;
    return 1;
}

static int get_str(const cJSON *obj, const char *name, const char **out, perr *pe)
{
    const cJSON *it = field(obj, name);
    if (!it)
        return 0;
    if (!cJSON_IsString(it))
        return fail(pe, name, "expected a string");
    *out = it->valuestring;
    return 1;
}

/* "speculative": true | false, and "prediction" (OpenAI's Predicted
 * Outputs): {"type": "content", "content": TEXT or [{"type": "text",
 * "text": ...}]}, or hyserve's {"type": "tokens", "tokens": [ids]} (each
 * id checked against the vocabulary by json_check_gen). */
static int get_speculation(gen_request *g, const cJSON *obj, perr *pe)
{
    bool on = false;
    int rc = get_bool(obj, "speculative", &on, pe);
    if (rc < 0)
        return -1;
    if (rc)
        g->speculative = on ? 1 : -1;
    const cJSON *pr = field(obj, "prediction");
    if (!pr)
        return 0;
    const char *type = NULL;
    if (!cJSON_IsObject(pr) || get_str(pr, "type", &type, pe) <= 0)
        return fail(pe, "prediction", "expected {\"type\": \"content\", \"content\": ...} or "
                                      "{\"type\": \"tokens\", \"tokens\": [...]}");
    g->has_prediction = true;
    if (!strcmp(type, "tokens")) {
        const cJSON *arr = field(pr, "tokens"), *t;
        const int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
        if (n < 0 || n > JSON_MAX_PREDICTION)
            return fail(pe, "prediction", "`tokens` must be an array of at most %d token ids", JSON_MAX_PREDICTION);
        g->pred_ids = n ? fault_malloc((size_t)n * sizeof *g->pred_ids) : NULL;
        if (n && !g->pred_ids)
            return fail_oom(pe, "prediction");
        cJSON_ArrayForEach(t, arr)
        {
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
                t->valuedouble > INT32_MAX)
                return fail(pe, "prediction", "`tokens`: entry %d is not a token id (an integer >= 0)", g->n_pred_ids);
            g->pred_ids[g->n_pred_ids++] = (int32_t)t->valuedouble;
        }
        return 0;
    }
    if (strcmp(type, "content"))
        return fail(pe, "prediction", "`type` must be \"content\" or \"tokens\"");
    const cJSON *c = field(pr, "content"), *part;
    if (cJSON_IsString(c)) {
        g->pred_text = fault_strdup(c->valuestring);
        return g->pred_text ? 0 : fail_oom(pe, "prediction");
    }
    if (!cJSON_IsArray(c))
        return fail(pe, "prediction", "`content` must be a string or an array of text parts");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(tx)) {
            free(buf);
            return fail(pe, "prediction", "`content`: each part must be {\"type\": \"text\", \"text\": ...}");
        }
        if (json_buf_append(&buf, &len, &cap, tx->valuestring, strlen(tx->valuestring))) {
            free(buf);
            return fail_oom(pe, "prediction");
        }
    }
    g->pred_text = buf ? buf : fault_strdup("");
    return g->pred_text ? 0 : fail_oom(pe, "prediction");
}

/* cache_salt (vLLM's field, OpenAI bodies and TGI parameters): requests
 * share prefix cache entries only under the same salt (and API key). */
static int get_cache_salt(gen_request *g, const cJSON *obj, perr *pe)
{
    const char *salt = NULL;
    int rc = get_str(obj, "cache_salt", &salt, pe);
    if (rc <= 0)
        return rc;
    if (!salt[0] || strlen(salt) >= sizeof(g->cache_salt))
        return fail(pe, "cache_salt", "must be a non-empty string of at most 255 bytes");
    snprintf(g->cache_salt, sizeof(g->cache_salt), "%s", salt);
    return 1;
}

/* ---------------------------------------------------------------------- */
/* 64-bit integers from the body text                                     */
/* ---------------------------------------------------------------------- */

/* cJSON keeps numbers as doubles, which hold integers exactly only up to
 * 2^53; a seed is a 64-bit integer, so its digits are read from the body
 * text instead. The body has already parsed as JSON, so the scanner below
 * only walks it: it finds the first member named path[0] of the root
 * object, then path[1] inside that, and returns the value's token. Keys
 * written with escapes do not match (the caller reports that the number
 * could not be read rather than guess). */

static size_t raw_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

/* s[i] is '"': the index just past the closing quote */
static size_t raw_string_end(const char *s, size_t n, size_t i)
{
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\')
            i++;
    return i < n ? i + 1 : n;
}

/* the index just past the value starting at s[i] */
static size_t raw_value_end(const char *s, size_t n, size_t i)
{
    if (i >= n)
        return n;
    if (s[i] == '"')
        return raw_string_end(s, n, i);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                i = raw_string_end(s, n, i);
                continue;
            }
            if (s[i] == '{' || s[i] == '[')
                depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i]))
        i++;
    return i;
}

/* The token of the value at path (n_path keys from the root object), or
 * NULL if the walk does not find it. */
static const char *raw_lookup(const char *s, size_t n, const char *const *path, int n_path, size_t *tlen)
{
    size_t i = raw_ws(s, n, 0);
    for (int d = 0; d < n_path; d++) {
        if (i >= n || s[i] != '{')
            return NULL;
        i = raw_ws(s, n, i + 1);
        size_t klen = strlen(path[d]);
        for (;;) {
            if (i >= n || s[i] != '"')
                return NULL;
            size_t kend = raw_string_end(s, n, i);
            bool match = kend - i == klen + 2 && !memcmp(s + i + 1, path[d], klen);
            i = raw_ws(s, n, kend);
            if (i >= n || s[i] != ':')
                return NULL;
            i = raw_ws(s, n, i + 1);
            if (match)
                break;
            i = raw_ws(s, n, raw_value_end(s, n, i));
            if (i >= n || s[i] != ',')
                return NULL;
            i = raw_ws(s, n, i + 1);
        }
    }
    size_t end = raw_value_end(s, n, i);
    *tlen = end - i;
    return s + i;
}

/* A JSON number token as an unsigned 64-bit integer: digits, optionally
 * a fraction of zeros ("7.0" is the integer 7). 0, or -1 if not an
 * integer written in digits, -2 if an integer outside 0..2^64-1. */
static int raw_u64(const char *t, size_t len, uint64_t *out)
{
    size_t i = 0;
    bool neg = false;
    uint64_t v = 0;
    bool overflow = false;
    if (i < len && t[i] == '-') {
        neg = true;
        i++;
    }
    if (i >= len || t[i] < '0' || t[i] > '9')
        return -1;
    for (; i < len && t[i] >= '0' && t[i] <= '9'; i++) {
        unsigned dgt = (unsigned)(t[i] - '0');
        if (v > (UINT64_MAX - dgt) / 10)
            overflow = true;
        v = v * 10 + dgt;
    }
    if (i < len && t[i] == '.') {
        for (i++; i < len && t[i] == '0'; i++)
            ;
    }
    if (i != len)
        return -1;      /* a non-zero fraction or an exponent */
    if (overflow || (neg && v != 0))
        return -2;
    *out = v;
    return 0;
}

/* The seed: an integer in 0..2^64-1, read from the body text. where is
 * the object holding it (the root or "parameters"); path locates the same
 * member in the text. */
static int get_seed(const cJSON *where, const char *body, size_t len, const char *const *path, int n_path,
                    uint64_t *out, perr *pe)
{
    const cJSON *it = field(where, "seed");
    if (!it)
        return 0;
    if (!cJSON_IsNumber(it))
        return fail(pe, "seed", "expected an integer in 0..18446744073709551615");
    size_t tlen = 0;
    const char *tok = raw_lookup(body, len, path, n_path, &tlen);
    int rc = tok ? raw_u64(tok, tlen, out) : -1;
    if (rc == -2)
        return fail(pe, "seed", "must be in 0..18446744073709551615");
    if (rc < 0)
        return fail(pe, "seed", "expected an integer in 0..18446744073709551615, written in digits");
    return 1;
}

cJSON *json_add_u64(cJSON *obj, const char *name, uint64_t v)
{
    char digits[24];
    snprintf(digits, sizeof(digits), "%" PRIu64, v);
    return cJSON_AddRawToObject(obj, name, digits);
}

/* stop: a string or an array of strings (the string form only when
 * allow_string). */
static int get_stop(gen_request *g, const cJSON *obj, bool allow_string, int max_stop, perr *pe)
{
    const cJSON *it = field(obj, "stop");
    if (!it)
        return 0;
    int n = 0;
    if (cJSON_IsString(it) && allow_string) {
        n = 1;
    } else if (cJSON_IsArray(it)) {
        n = cJSON_GetArraySize(it);
    } else {
        return fail(pe, "stop", allow_string ? "expected a string or an array of strings"
                                             : "expected an array of strings");
    }
    if (n > max_stop) {
        char d[64];
        snprintf(d, sizeof(d), "%d. Given: %d", max_stop, n);
        return fail(pe, "stop", "supports up to %s", d);
    }
    if (n == 0)
        return 0;
    g->stop = fault_calloc((size_t)n, sizeof(char *));
    if (!g->stop)
        return fail_oom(pe, "stop");
    const cJSON *s = cJSON_IsString(it) ? it : it->child;
    for (int i = 0; i < n; i++, s = cJSON_IsString(it) ? it : s->next) {
        if (!cJSON_IsString(s))
            return fail(pe, "stop", "expected an array of strings");
        if (!s->valuestring[0])
            return fail(pe, "stop", "stop sequences must not be empty");
        g->stop[i] = fault_strdup(s->valuestring);
        if (!g->stop[i])
            return fail_oom(pe, "stop");
        g->n_stop++;
    }
    return 1;
}

/* OpenAI logit_bias: {"token id": bias in -100..100}. The bias is added
 * to the logit; -100 bans the token outright (-inf), as OpenAI documents
 * ("-100 should result in a ban") and as llama-server does, rather than
 * leaving a finite, possibly still drawn, logit. Ids are checked against
 * the vocabulary by the route, which knows it. */
static int get_logit_bias(gen_request *g, const cJSON *root, perr *pe)
{
    const cJSON *lb = field(root, "logit_bias");
    if (!lb)
        return 0;
    if (!cJSON_IsObject(lb))
        return fail(pe, "logit_bias", "expected an object mapping token ids to biases");
    int n = cJSON_GetArraySize(lb);
    if (n == 0)
        return 0;
    g->bias = fault_calloc((size_t)n, sizeof(*g->bias));
    if (!g->bias)
        return fail_oom(pe, "logit_bias");
    const cJSON *it;
    cJSON_ArrayForEach(it, lb)
    {
        const char *k = it->string;
        char *end = NULL;
        long id = k && *k >= '0' && *k <= '9' ? strtol(k, &end, 10) : -1;
        if (id < 0 || id > INT32_MAX || !end || *end)
            return fail(pe, "logit_bias", "keys must be token ids (non-negative integers); got '%s'", k ? k : "");
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return fail(pe, "logit_bias", "the bias of token %ld must be a number in -100..100", id);
        g->bias[g->n_bias].id = (int32_t)id;
        g->bias[g->n_bias].bias = it->valuedouble <= -100 ? -INFINITY : (float)it->valuedouble;
        g->n_bias++;
    }
    g->sp.bias = g->bias;
    g->sp.n_bias = g->n_bias;
    return 1;
}

/* A completion prompt given as token ids: [1, 2, 3], each an integer
 * 0..2^31-1 (the route checks them against the vocabulary). */
static int get_prompt_ids(gen_request *g, const cJSON *arr, perr *pe)
{
    int n = cJSON_GetArraySize(arr);
    g->prompt_ids = fault_malloc((size_t)n * sizeof(*g->prompt_ids));
    if (!g->prompt_ids)
        return fail_oom(pe, "prompt");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!(v >= 0 && v <= INT32_MAX && v == floor(v)))
            return fail(pe, "prompt", "a token-id prompt must hold only integers 0..2147483647");
        g->prompt_ids[g->n_prompt_ids++] = (int32_t)v;
    }
    return 0;
}

/* Several completion prompts: an array of 2..JSON_MAX_BATCH strings or
 * token-id arrays (mixed as OpenAI allows), one choice each. */
static int get_prompt_batch(gen_request *g, const cJSON *arr, perr *pe)
{
    int n = cJSON_GetArraySize(arr);
    if (n > JSON_MAX_BATCH)
        return fail(pe, "prompt", "at most %d prompts in one request", JSON_MAX_BATCH);
    g->batch_prompt = fault_calloc((size_t)n, sizeof(*g->batch_prompt));
    g->batch_ids = fault_calloc((size_t)n, sizeof(*g->batch_ids));
    g->batch_n_ids = fault_calloc((size_t)n, sizeof(*g->batch_n_ids));
    if (!g->batch_prompt || !g->batch_ids || !g->batch_n_ids)
        return fail_oom(pe, "prompt");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        int i = g->n_batch++;
        if (cJSON_IsString(it) && it->valuestring[0]) {
            g->batch_prompt[i] = fault_strdup(it->valuestring);
            if (!g->batch_prompt[i])
                return fail_oom(pe, "prompt");
        } else if (cJSON_IsArray(it) && it->child && cJSON_IsNumber(it->child)) {
            if (get_prompt_ids(g, it, pe) < 0)
                return -1;
            g->batch_ids[i] = g->prompt_ids;       /* moved: prompt_ids is the single prompt's */
            g->batch_n_ids[i] = g->n_prompt_ids;
            g->prompt_ids = NULL;
            g->n_prompt_ids = 0;
        } else {
            return fail(pe, "prompt", "item %d of the prompt array must be a non-empty string or an array of token ids",
                        i);
        }
    }
    return 0;
}

/* A known field we do not implement: reject it when set to anything but
 * its neutral value, rather than silently ignoring it. */
static int unsupported(const cJSON *obj, const char *name, perr *pe)
{
    const cJSON *it = field(obj, name);
    if (!it)
        return 0;
    if (cJSON_IsFalse(it))
        return 0;
    if (cJSON_IsNumber(it) && it->valuedouble == 0)
        return 0;
    if ((cJSON_IsObject(it) || cJSON_IsArray(it)) && !it->child)
        return 0;
    return fail(pe, name, "is not supported by this server");
}

/* ---------------------------------------------------------------------- */
/* Generation requests                                                    */
/* ---------------------------------------------------------------------- */

/* OpenAI logprobs. Chat: "logprobs": bool and "top_logprobs": 0..20,
 * which needs logprobs true. Completions: "logprobs": 0..5 (the top count;
 * 0 lists only the chosen tokens) and "echo": bool; echo with logprobs
 * also scores the prompt. ref: OpenAI's API reference. */
static int get_oai_logprobs(gen_request *g, const cJSON *root, int api, perr *pe)
{
    double v;
    int rc;
    if (api == API_OAI_CHAT) {
        if (get_bool(root, "logprobs", &g->logprobs, pe) < 0)
            return -1;
        if ((rc = get_int(root, "top_logprobs", 0, SAMPLER_MAX_TOP, &v, pe)) < 0)
            return -1;
        if (rc && !g->logprobs)
            return fail(pe, "top_logprobs", "requires `logprobs` to be true");
        if (rc)
            g->top_logprobs = (int)v;
        return 0;
    }
    if ((rc = get_int(root, "logprobs", 0, 5, &v, pe)) < 0)
        return -1;
    if (rc) {
        g->logprobs = true;
        g->top_logprobs = (int)v;
    }
    if (get_bool(root, "echo", &g->echo, pe) < 0)
        return -1;
    g->prompt_logprobs = g->echo && g->logprobs;
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Structured output                                                      */
/* ---------------------------------------------------------------------- */

/* Sets g's constraint; src (a schema object, or a string: a schema's JSON
 * text or a regex) is copied. */
static int set_constraint(gen_request *g, int kind, const cJSON *src, const char *param, perr *pe)
{
    free(g->constraint_src);
    g->constraint_src = NULL;
    g->constraint_len = 0;
    if (src) {
        g->constraint_src = cJSON_IsString(src) ? fault_strdup(src->valuestring) : cJSON_PrintUnformatted(src);
        if (!g->constraint_src)
            return fail_oom(pe, param);
        g->constraint_len = strlen(g->constraint_src);
    }
    g->constraint = kind;
    snprintf(g->constraint_param, sizeof(g->constraint_param), "%s", param);
    return 0;
}

/* A JSON Schema given as an object (or a boolean schema). */
static int set_schema(gen_request *g, const cJSON *schema, const char *param, perr *pe)
{
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return fail(pe, param, "the JSON Schema must be an object");
    return set_constraint(g, GEN_CONSTRAINT_JSON_SCHEMA, schema, param, pe);
}

/* OpenAI response_format: {"type": "text" | "json_object" | "json_schema",
 * "json_schema": {"name", "schema", "strict"}}; llama-server's
 * {"type": "json_object", "schema": ...}, top-level "json_schema" and
 * "grammar" (GBNF text); TGI's
 * chat form {"type": "json" | "regex", "value": ...}. */
static int get_oai_constraint(gen_request *g, const cJSON *root, perr *pe)
{
    const cJSON *js = field(root, "json_schema");
    if (js && set_schema(g, js, "json_schema", pe) < 0)
        return -1;
    /* llama-server's GBNF grammar */
    const cJSON *gbnf = field(root, "grammar");
    if (gbnf) {
        if (!cJSON_IsString(gbnf))
            return fail(pe, "grammar", "expected a GBNF grammar (a string)");
        if (js)
            return fail(pe, "grammar", "cannot be combined with json_schema");
        if (set_constraint(g, GEN_CONSTRAINT_GBNF, gbnf, "grammar", pe) < 0)
            return -1;
    }
    const cJSON *rf = field(root, "response_format");
    if (!rf)
        return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
        return fail(pe, "response_format", "expected an object with a \"type\"");
    const char *type = t->valuestring;
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object")) {
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(rf, "schema");
        if (schema)
            return set_schema(g, schema, "response_format", pe);
        return set_constraint(g, GEN_CONSTRAINT_JSON_OBJECT, NULL, "response_format", pe);
    }
    if (!strcmp(type, "json_schema")) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(j, "schema");
        if (!cJSON_IsObject(j) || !schema)
            return fail(pe, "response_format", "json_schema needs {\"json_schema\": {\"schema\": {...}}}");
        return set_schema(g, schema, "response_format", pe);
    }
    if (!strcmp(type, "json") || !strcmp(type, "regex")) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(rf, "value");
        if (!strcmp(type, "regex")) {
            if (!cJSON_IsString(v))
                return fail(pe, "response_format", "a regex needs \"value\": a string");
            return set_constraint(g, GEN_CONSTRAINT_REGEX, v, "response_format", pe);
        }
        return set_schema(g, v, "response_format", pe);
    }
    return fail(pe, "response_format", "type must be text, json_object, json_schema, json or regex");
}

/* TGI parameters.grammar: {"type": "json" | "regex", "value": ...}
 * ("json_object" as "json"); the schema may also be a JSON string. */
static int get_tgi_grammar(gen_request *g, const cJSON *p, perr *pe)
{
    const cJSON *gr = field(p, "grammar");
    if (!gr)
        return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(gr, "type");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(gr, "value");
    if (!cJSON_IsObject(gr) || !cJSON_IsString(t) || !v)
        return fail(pe, "grammar", "expected {\"type\": \"json\" | \"regex\", \"value\": ...}");
    if (!strcmp(t->valuestring, "regex")) {
        if (!cJSON_IsString(v))
            return fail(pe, "grammar", "a regex grammar's value must be a string");
        return set_constraint(g, GEN_CONSTRAINT_REGEX, v, "grammar", pe);
    }
    if (!strcmp(t->valuestring, "json") || !strcmp(t->valuestring, "json_object")) {
        if (cJSON_IsString(v))
            return set_constraint(g, GEN_CONSTRAINT_JSON_SCHEMA, v, "grammar", pe);
        return set_schema(g, v, "grammar", pe);
    }
    return fail(pe, "grammar", "type must be \"json\" or \"regex\"");
}

/* Sampling fields shared by the OpenAI routes. */
static int parse_oai_sampling(gen_request *g, const cJSON *root, const char *body, size_t len, int max_stop,
                              perr *pe)
{
    double v;
    g->sp.temperature = 1.0f;
    g->sp.greedy = false;
    int rc = get_num(root, "temperature", &v, pe);
    if (rc < 0)
        return -1;
    if (rc) {
        if (v < 0 || v > 2)
            return fail(pe, "temperature", "must be between 0 and 2");
        g->sp.temperature = (float)v;
        if (v == 0)
            g->sp.greedy = true;
    }
    if ((rc = get_num(root, "top_p", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (!(v > 0 && v <= 1))
            return fail(pe, "top_p", "must be > 0 and <= 1");
        g->sp.top_p = (float)v;
    }
    if ((rc = get_int(root, "top_k", -1, 1e9, &v, pe)) < 0)
        return -1;
    if (rc)
        g->sp.top_k = (int)v;
    if ((rc = get_num(root, "min_p", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (v < 0 || v > 1)
            return fail(pe, "min_p", "must be between 0 and 1");
        g->sp.min_p = (float)v;
    }
    if ((rc = get_num(root, "repetition_penalty", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (!(v > 0))
            return fail(pe, "repetition_penalty", "must be strictly positive");
        g->sp.repetition_penalty = (float)v;
    }
    static const char *const penalties[] = {"frequency_penalty", "presence_penalty"};
    for (int i = 0; i < 2; i++) {
        if ((rc = get_num(root, penalties[i], &v, pe)) < 0)
            return -1;
        if (rc && !(v >= -2 && v <= 2))
            return fail(pe, penalties[i], "must be between -2 and 2");
        if (rc && i == 0)
            g->sp.frequency_penalty = (float)v;
        else if (rc)
            g->sp.presence_penalty = (float)v;
    }
    if (get_logit_bias(g, root, pe) < 0 || get_bool(root, "ignore_eos", &g->ignore_eos, pe) < 0)
        return -1;
    static const char *const seed_path[] = {"seed"};
    if ((rc = get_seed(root, body, len, seed_path, 1, &g->sp.seed, pe)) < 0)
        return -1;
    if (rc)
        g->seed_given = true;
    if (get_stop(g, root, true, max_stop, pe) < 0)
        return -1;
    if (get_bool(root, "stream", &g->stream, pe) < 0 || get_cache_salt(g, root, pe) < 0 ||
        get_speculation(g, root, pe) < 0)
        return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return fail(pe, "stream_options", "expected an object");
        if (get_bool(so, "include_usage", &g->include_usage, pe) < 0)
            return -1;
    }
    const char *model = NULL;
    if (get_str(root, "model", &model, pe) < 0)
        return -1;
    if (model)
        snprintf(g->model, sizeof(g->model), "%s", model);
    if ((rc = get_int(root, "n", 1, JSON_MAX_N, &v, pe)) < 0)
        return -1;
    if (rc)
        g->n = (int)v;
    static const char *const unsup[] = {"best_of", "suffix", "functions", "function_call", NULL};
    for (int i = 0; unsup[i]; i++)
        if (unsupported(root, unsup[i], pe))
            return -1;
    return get_oai_constraint(g, root, pe);
}

static int parse_tgi(gen_request *g, const cJSON *root, const char *body, size_t len, int max_stop, perr *pe)
{
    const char *inputs = NULL;
    double v;
    int rc = get_str(root, "inputs", &inputs, pe);
    if (rc < 0)
        return -1;
    if (rc == 0)
        return fail(pe, "inputs", "missing field (expected a string)");
    if (!inputs[0])
        return fail(pe, "inputs", "cannot be empty");
    g->prompt = fault_strdup(inputs);
    if (!g->prompt)
        return fail_oom(pe, "inputs");
    if (get_bool(root, "stream", &g->stream, pe) < 0)
        return -1;
    g->sp.greedy = true;
    g->sp.temperature = 1.0f;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "parameters");
    if (!p || cJSON_IsNull(p))
        return 0;
    if (!cJSON_IsObject(p))
        return fail(pe, "parameters", "expected an object");
    bool sample = false, do_sample = false;
    if ((rc = get_int(p, "max_new_tokens", -1e18, 1e18, &v, pe)) < 0)
        return -1;
    if (rc) {
        if (v <= 0)
            return fail(pe, "max_new_tokens", "must be strictly positive");
        g->max_new_tokens = v > 1e9 ? 1000000000 : (int)v;
    }
    if ((rc = get_num(p, "temperature", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (!(v > 0))
            return fail(pe, "temperature", "must be strictly positive");
        g->sp.temperature = (float)v;
        sample = true;
    }
    if ((rc = get_int(p, "top_k", -1e18, 1e18, &v, pe)) < 0)
        return -1;
    if (rc) {
        if (v <= 0)
            return fail(pe, "top_k", "must be strictly positive");
        g->sp.top_k = v > 1e9 ? 1000000000 : (int)v;
        sample = true;
    }
    if ((rc = get_num(p, "top_p", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (!(v > 0 && v < 1))
            return fail(pe, "top_p", "must be > 0.0 and < 1.0");
        g->sp.top_p = (float)v;
        sample = true;
    }
    if ((rc = get_num(p, "min_p", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (!(v > 0 && v < 1))
            return fail(pe, "min_p", "must be > 0.0 and < 1.0");
        g->sp.min_p = (float)v;
    }
    if ((rc = get_num(p, "repetition_penalty", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (!(v > 0))
            return fail(pe, "repetition_penalty", "must be strictly positive");
        g->sp.repetition_penalty = (float)v;
    }
    if ((rc = get_num(p, "typical_p", &v, pe)) < 0)
        return -1;
    if (rc) {
        if (!(v > 0 && v < 1))
            return fail(pe, "typical_p", "must be > 0.0 and < 1.0");
        g->sp.typical_p = (float)v;
        sample = true;      /* a warper, as in TGI: it turns sampling on */
    }
    if (get_bool(p, "ignore_eos", &g->ignore_eos, pe) < 0)
        return -1;
    if (get_bool(p, "do_sample", &do_sample, pe) < 0)
        return -1;
    if ((rc = get_int(p, "truncate", -1e18, 1e18, &v, pe)) < 0)
        return -1;
    if (rc) {
        if (v <= 0)
            return fail(pe, "truncate", "must be strictly positive");
        g->truncate = v > 1e9 ? 1000000000 : (int)v;
    }
    static const char *const seed_path[] = {"parameters", "seed"};
    if ((rc = get_seed(p, body, len, seed_path, 2, &g->sp.seed, pe)) < 0)
        return -1;
    if (rc)
        g->seed_given = true;
    if (get_stop(g, p, false, max_stop, pe) < 0)
        return -1;
    if (get_bool(p, "details", &g->details, pe) < 0 || get_bool(p, "return_full_text", &g->return_full_text, pe) < 0 ||
        get_bool(p, "return_usage", &g->return_usage, pe) < 0 || get_cache_salt(g, p, pe) < 0 ||
        get_speculation(g, p, pe) < 0)
        return -1;
    if (get_tgi_grammar(g, p, pe) < 0)
        return -1;
    /* top_n_tokens: TGI's limit is its --max-top-n-tokens, 5 by default */
    if ((rc = get_int(p, "top_n_tokens", 0, 5, &v, pe)) < 0)
        return -1;
    if (rc)
        g->top_logprobs = (int)v;
    if (get_bool(p, "decoder_input_details", &g->prompt_logprobs, pe) < 0)
        return -1;
    if (g->prompt_logprobs && g->stream)
        return fail(pe, "decoder_input_details", "decoder_input_details == true is not supported when streaming tokens");
    static const char *const unsup[] = {"watermark", "adapter_id", "frequency_penalty", NULL};
    for (int i = 0; unsup[i]; i++)
        if (unsupported(p, unsup[i], pe))
            return -1;
    g->sp.greedy = !(sample || do_sample);
    /* best_of: TGI's rules (sampling on, not streamed); the cap is --max-n */
    if ((rc = get_int(p, "best_of", 1, JSON_MAX_N, &v, pe)) < 0)
        return -1;
    if (rc && v > 1) {
        if (g->sp.greedy)
            return fail(pe, "best_of", "you must use sampling when `best_of` is > 1");
        if (g->stream)
            return fail(pe, "best_of", "`best_of` != 1 is not supported when streaming tokens");
        g->best_of = (int)v;
    }
    return 0;
}

/* An assistant message's tool_calls: [{"id", "type": "function", "function":
 * {"name", "arguments": a JSON string}}], kept as compact JSON for the
 * template. */
static int get_msg_tool_calls(chat_msg *cm, const cJSON *m, const char *where, perr *pe)
{
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!tc || cJSON_IsNull(tc))
        return 0;
    if (!cJSON_IsArray(tc) || strcmp(cm->role, "assistant"))
        return fail(pe, where, "`tool_calls` must be an array on an assistant message");
    const cJSON *c;
    cJSON_ArrayForEach(c, tc)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "arguments")))
            return fail(pe, where, "each tool call needs function.name and function.arguments (a JSON string)");
    }
    cm->tool_calls = cJSON_PrintUnformatted(tc);
    return cm->tool_calls ? 0 : fail_oom(pe, where);
}

/* tools, tool_choice, parallel_tool_calls (chat). required and a named
 * function become a tool-call constraint; auto and none leave the output
 * free (auto's calls are parsed from the text afterwards). */
/* chat_template_kwargs: {"enable_thinking": bool, "tools_in_user_message":
 * bool} (vLLM's and llama-server's way to pass template variables; the
 * first is Qwen3's, the second Llama 3.1's); other keys are ignored, as a
 * template that does not read them would. */
static int get_template_kwargs(gen_request *g, const cJSON *root, perr *pe)
{
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (!kw)
        return 0;
    if (!cJSON_IsObject(kw))
        return fail(pe, "chat_template_kwargs", "expected an object");
    bool think = true;
    if (get_bool(kw, "enable_thinking", &think, pe) < 0)
        return -1;
    g->no_think = !think;
    bool in_user = true;
    if (get_bool(kw, "tools_in_user_message", &in_user, pe) < 0)
        return -1;
    g->tools_in_system = !in_user;
    return 0;
}

/* How deep v's values go below it (v: 0), stopping once past cap. */
static int json_depth(const cJSON *v, int d, int cap)
{
    int m = d;
    for (const cJSON *c = v->child; c && m <= cap; c = c->next) {
        const int x = json_depth(c, d + 1, cap);
        m = x > m ? x : m;
    }
    return m;
}

static int get_tools(gen_request *g, const cJSON *root, perr *pe)
{
    const cJSON *tools = field(root, "tools");
    const cJSON *choice = field(root, "tool_choice");
    bool parallel = true;
    if (get_bool(root, "parallel_tool_calls", &parallel, pe) < 0)
        return -1;
    if (!tools || (cJSON_IsArray(tools) && !tools->child)) {
        if (choice && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")))
            return fail(pe, "tool_choice", "needs tools");
        return 0;
    }
    if (!cJSON_IsArray(tools))
        return fail(pe, "tools", "expected an array of {\"type\": \"function\", \"function\": {...}}");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")))
            return fail(pe, "tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\", ...}}");
        /* the chat template writes each tool out as Python's json.dumps
         * would, to CHAT_TOOL_MAX_DEPTH levels */
        if (json_depth(t, 0, CHAT_TOOL_MAX_DEPTH) > CHAT_TOOL_MAX_DEPTH)
            return fail(pe, "tools", "a tool nests deeper than %d levels (the limit of a tool's JSON, parameters "
                                     "included)", CHAT_TOOL_MAX_DEPTH);
    }
    g->tools = cJSON_PrintUnformatted(tools);
    if (!g->tools)
        return fail_oom(pe, "tools");
    g->tool_choice = TOOL_CHOICE_AUTO;
    const char *name = NULL;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        g->tool_choice = !strcmp(c, "none") ? TOOL_CHOICE_NONE : !strcmp(c, "auto") ? TOOL_CHOICE_AUTO
                         : !strcmp(c, "required") ? TOOL_CHOICE_REQUIRED : -1;
        if (g->tool_choice < 0)
            return fail(pe, "tool_choice", "must be none, auto, required or {\"type\": \"function\", ...}");
    } else if (choice) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"), "name");
        if (!cJSON_IsString(n))
            return fail(pe, "tool_choice", "a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
        name = n->valuestring;
        g->tool_choice = TOOL_CHOICE_NAMED;
    }
    bool forced = g->tool_choice == TOOL_CHOICE_REQUIRED || g->tool_choice == TOOL_CHOICE_NAMED;
    /* auto: a call the model opens is constrained from its "<tool_call>"
     * on, unless the output already has a constraint of its own */
    if (g->tool_choice == TOOL_CHOICE_NONE || (g->tool_choice == TOOL_CHOICE_AUTO && g->constraint))
        return 0;
    if (forced && g->constraint)
        return fail(pe, "tool_choice", "cannot be combined with %s", g->constraint_param);
    cJSON *spec = cJSON_CreateObject();
    cJSON *tcopy = cJSON_Duplicate(tools, true);
    if (!spec || !tcopy || !cJSON_AddItemToObject(spec, "tools", tcopy)) {
        cJSON_Delete(spec);
        cJSON_Delete(tcopy);
        return fail_oom(pe, "tools");
    }
    if (name)
        cJSON_AddStringToObject(spec, "name", name);
    /* a named function: exactly one call, whatever parallel_tool_calls says */
    cJSON_AddBoolToObject(spec, "parallel", parallel && !name);
    int rc = set_constraint(g, forced ? GEN_CONSTRAINT_TOOL_CALLS : GEN_CONSTRAINT_TOOL_CALLS_AUTO, spec,
                            forced ? "tool_choice" : "tools", pe);
    cJSON_Delete(spec);
    return rc;
}

int json_set_tool_format(gen_request *g, const char *format)
{
    if ((g->constraint != GEN_CONSTRAINT_TOOL_CALLS && g->constraint != GEN_CONSTRAINT_TOOL_CALLS_AUTO) ||
        !g->constraint_src)
        return 0;
    cJSON *spec = cJSON_ParseWithLength(g->constraint_src, g->constraint_len);
    char *text = spec && cJSON_AddStringToObject(spec, "format", format) ? cJSON_PrintUnformatted(spec) : NULL;
    cJSON_Delete(spec);
    if (!text)
        return -1;
    free(g->constraint_src);
    g->constraint_src = text;
    g->constraint_len = strlen(text);
    return 0;
}

static int parse_chat_messages(gen_request *g, const cJSON *root, perr *pe)
{
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!ms || cJSON_IsNull(ms))
        return fail(pe, "messages", "missing field (expected an array of messages)");
    if (!cJSON_IsArray(ms))
        return fail(pe, "messages", "expected an array of messages");
    int n = cJSON_GetArraySize(ms);
    if (n == 0)
        return fail(pe, "messages", "must contain at least one message");
    g->msgs = fault_calloc((size_t)n, sizeof(*g->msgs));
    if (!g->msgs)
        return fail_oom(pe, "messages");
    /* walk the list (cJSON_GetArrayItem(ms, i) walks it from the start each
     * time: 60k messages cost seconds of CPU) */
    const cJSON *m = ms->child;
    for (int i = 0; i < n; i++, m = m->next) {
        char where[48];
        snprintf(where, sizeof(where), "messages[%d]", i);
        if (!cJSON_IsObject(m))
            return fail(pe, where, "expected an object with role and content");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return fail(pe, where, "`role` must be a string");
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant") && strcmp(role->valuestring, "developer") &&
            strcmp(role->valuestring, "tool"))
            return fail(pe, where, "unknown role '%s' (system, developer, user, assistant or tool)",
                        role->valuestring);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        char *text = NULL;
        if (!content || cJSON_IsNull(content)) {
            text = fault_strdup("");
        } else if (cJSON_IsString(content)) {
            text = fault_strdup(content->valuestring);
        } else if (cJSON_IsArray(content)) {
            /* content parts: concatenate the text parts */
            size_t tl = 0, tc = 0;
            const cJSON *part;
            cJSON_ArrayForEach(part, content)
            {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t)) {
                    free(text);
                    return fail(pe, where, "only text content parts ({\"type\":\"text\",\"text\":...}) are supported");
                }
                if (json_buf_append(&text, &tl, &tc, t->valuestring, strlen(t->valuestring))) {
                    free(text);
                    return fail_oom(pe, where);
                }
            }
            if (!text)
                text = fault_strdup("");
        } else {
            return fail(pe, where, "`content` must be a string or an array of text parts");
        }
        g->msgs[i].role = fault_strdup(role->valuestring);
        g->msgs[i].content = text;
        g->n_msgs++;
        if (!g->msgs[i].role || !g->msgs[i].content)
            return fail_oom(pe, where);
        if (get_msg_tool_calls(&g->msgs[i], m, where, pe) < 0)
            return -1;
    }
    return 0;
}

int json_parse_gen(gen_request *g, int api, const char *body, size_t len, int max_stop,
                   char *err, size_t errlen, char *param, size_t paramlen)
{
    perr pe = {err, errlen, param, paramlen, "", false};
    const char *end = NULL;
    double v;
    memset(g, 0, sizeof(*g));
    g->api = api;
    g->max_new_tokens = -1;
    g->n = 1;
    g->best_of = 1;
    sampler_params_default(&g->sp);
    param[0] = '\0';
    if (!body || len == 0) {
        snprintf(err, errlen, "empty request body: expected a JSON object");
        return JSON_EPARSE;
    }
    bool oom;
    cJSON *root = json_parse_body(body, len, &end, &oom);
    if (!root && oom) {
        snprintf(err, errlen, "out of memory reading the request body");
        return JSON_ENOMEM;
    }
    if (!root) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        snprintf(err, errlen, "malformed JSON in the request body near byte %zu", off);
        return JSON_EPARSE;
    }
    int rc = JSON_EINVALID;
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "the request body must be a JSON object");
        goto out;
    }
    if (api == API_TGI) {
        if (parse_tgi(g, root, body, len, max_stop, &pe))
            goto out;
    } else {
        if (parse_oai_sampling(g, root, body, len, max_stop, &pe) || get_oai_logprobs(g, root, api, &pe))
            goto out;
        int r2 = get_int(root, "max_tokens", -1e18, 1e18, &v, &pe);
        if (r2 < 0)
            goto out;
        if (api == API_OAI_CHAT && r2 == 0) {
            r2 = get_int(root, "max_completion_tokens", -1e18, 1e18, &v, &pe);
            if (r2 < 0)
                goto out;
        }
        if (r2) {
            if (v <= 0) {
                fail(&pe, "max_tokens", "must be at least 1");
                goto out;
            }
            g->max_new_tokens = v > 1e9 ? 1000000000 : (int)v;
        }
        if (api == API_OAI_COMPLETION) {
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
            if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0)))
                p = cJSON_GetArrayItem(p, 0);   /* a batch of one: a string or a token-id array */
            if (!p || cJSON_IsNull(p)) {
                fail(&pe, "prompt", "missing field (expected a string)");
                goto out;
            }
            if (cJSON_IsArray(p) && p->child && cJSON_IsNumber(p->child)) {
                if (get_prompt_ids(g, p, &pe) < 0)
                    goto out;
                rc = JSON_OK;
                goto out;
            }
            if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1) {
                if (get_prompt_batch(g, p, &pe) < 0)
                    goto out;
                rc = JSON_OK;
                goto out;
            }
            if (!cJSON_IsString(p)) {
                fail(&pe, "prompt", "expected a string or an array of token ids (or an array of exactly one of those)");
                goto out;
            }
            if (!p->valuestring[0]) {
                fail(&pe, "prompt", "cannot be empty");
                goto out;
            }
            g->prompt = fault_strdup(p->valuestring);
            if (!g->prompt) {
                rc = JSON_ENOMEM;
                goto out;
            }
        } else if (parse_chat_messages(g, root, &pe) || get_tools(g, root, &pe) ||
                   get_template_kwargs(g, root, &pe)) {
            goto out;
        }
    }
    rc = JSON_OK;
out:
    if (rc == JSON_EINVALID && pe.oom)
        rc = JSON_ENOMEM;
    cJSON_Delete(root);
    return rc;
}

static bool served_name(const gen_limits *lim, const char *name)
{
    for (int i = 0; i < lim->n_names; i++)
        if (!strcmp(lim->names[i], name))
            return true;
    return false;
}

int json_check_gen(gen_request *g, const gen_limits *lim, char *err, size_t errlen, char *param, size_t paramlen)
{
    const int api = g->api;
    const char *field = NULL;
    int rc = JSON_EINVALID;
    for (int i = 0; i < g->n_stop; i++) {
        if (strlen(g->stop[i]) > (size_t)lim->max_stop_len) {
            field = "stop";
            snprintf(err, errlen, "`stop`: sequence %d is %zu bytes, more than the limit of %d "
                     "(--max-stop-length)", i, strlen(g->stop[i]), lim->max_stop_len);
            goto fail;
        }
    }
    /* @huggingface/inference 4.x sends its endpoint URL as "model" when given
     * an endpointUrl: a URL names this endpoint, not another model */
    if (!strncmp(g->model, "http://", 7) || !strncmp(g->model, "https://", 8))
        g->model[0] = '\0';
    if (api != API_TGI && g->model[0] && !lim->any_model && !served_name(lim, g->model)) {
        field = "model";
        snprintf(err, errlen, "The model `%.200s` does not exist (this server serves %.200s; GET /v1/models "
                 "lists its names)", g->model, lim->name);
        rc = JSON_EMODEL;
        goto fail;
    }
    if (lim->stream)
        g->stream = true;
    int n_seq = api == API_TGI ? g->best_of : g->n;
    if (n_seq > lim->max_n) {
        field = api == API_TGI ? "best_of" : "n";
        snprintf(err, errlen, "`%s` must be <= %d (--max-n). Given: %d", field, lim->max_n, n_seq);
        goto fail;
    }
    if (n_seq > 1 && g->stream && (api == API_TGI || n_seq > JSON_MAX_BATCH)) {
        field = api == API_TGI ? "best_of" : "n";
        snprintf(err, errlen, api == API_TGI ? "`best_of` != 1 is not supported when streaming tokens"
                                             : "a stream carries at most %d choices", JSON_MAX_BATCH);
        goto fail;
    }
    if (g->n_batch > 1 && g->stream) {
        field = "prompt";
        snprintf(err, errlen, "`prompt`: several prompts cannot be streamed in one request; send one "
                              "streaming request per prompt");
        goto fail;
    }
    if (g->n_batch <= 1 && g->stream && g->prompt_logprobs && api == API_TGI) {
        field = "decoder_input_details";
        snprintf(err, errlen, "decoder_input_details == true is not supported when streaming tokens");
        goto fail;
    }
    for (int i = 0; g->n_batch <= 1 && i < g->n_prompt_ids; i++) {
        if (g->prompt_ids[i] >= lim->n_vocab) {
            field = "prompt";
            snprintf(err, errlen, "`prompt`: token %d is not in the vocabulary (0..%d)", (int)g->prompt_ids[i],
                     lim->n_vocab - 1);
            goto fail;
        }
    }
    for (int i = 0; i < g->n_pred_ids; i++) {
        if (g->pred_ids[i] >= lim->n_vocab) {
            field = "prediction";
            snprintf(err, errlen, "`prediction`: token %d is not in the vocabulary (0..%d)", (int)g->pred_ids[i],
                     lim->n_vocab - 1);
            goto fail;
        }
    }
    param[0] = '\0';
    return JSON_OK;
fail:
    snprintf(param, paramlen, "%s", field);
    return rc;
}

int json_check_bias(const gen_request *g, int n_vocab, char *err, size_t errlen)
{
    for (int i = 0; i < g->n_bias; i++) {
        if (g->bias[i].id >= n_vocab) {
            snprintf(err, errlen, "`logit_bias`: token %d is not in the vocabulary (0..%d)", (int)g->bias[i].id,
                     n_vocab - 1);
            return JSON_EINVALID;
        }
    }
    return JSON_OK;
}

cJSON *json_add_cached_tokens(cJSON *usage, int cached_tokens)
{
    cJSON *d = usage ? cJSON_AddObjectToObject(usage, "prompt_tokens_details") : NULL;
    if (d)
        cJSON_AddNumberToObject(d, "cached_tokens", cached_tokens);
    return usage;
}

cJSON *json_add_speculative(cJSON *obj, bool prediction, uint64_t pred_accepted, uint64_t pred_rejected,
                            uint64_t verify_steps, uint64_t drafted, uint64_t accepted)
{
    if (!obj)
        return NULL;
    if (prediction) {
        cJSON *d = cJSON_AddObjectToObject(obj, "completion_tokens_details");
        cJSON_AddNumberToObject(d, "accepted_prediction_tokens", (double)pred_accepted);
        cJSON_AddNumberToObject(d, "rejected_prediction_tokens", (double)pred_rejected);
    }
    if (drafted > 0) {
        cJSON *sp = cJSON_AddObjectToObject(obj, "speculative");
        cJSON_AddNumberToObject(sp, "verify_steps", (double)verify_steps);
        cJSON_AddNumberToObject(sp, "draft_tokens", (double)drafted);
        cJSON_AddNumberToObject(sp, "accepted_tokens", (double)accepted);
    }
    return obj;
}

void json_gen_free(gen_request *g)
{
    if (!g)
        return;
    free(g->prompt);
    free(g->pred_text);
    free(g->pred_ids);
    for (int i = 0; i < g->n_msgs; i++) {
        free(g->msgs[i].role);
        free(g->msgs[i].content);
        free(g->msgs[i].tool_calls);
    }
    free(g->msgs);
    for (int i = 0; i < g->n_stop; i++)
        free(g->stop[i]);
    free(g->stop);
    free(g->bias);
    free(g->prompt_ids);
    for (int i = 0; i < g->n_batch; i++) {
        free(g->batch_prompt[i]);
        free(g->batch_ids[i]);
    }
    free(g->batch_prompt);
    free(g->batch_ids);
    free(g->batch_n_ids);
    free(g->constraint_src);
    free(g->tools);
    memset(g, 0, sizeof(*g));
}

/* Parse a small body (/tokenize, /detokenize) into *root. Returns JSON_OK
 * or JSON_EPARSE with err saying what was expected (want). */
static int parse_small_body(const char *body, size_t len, const char *want, cJSON **root, char *err, size_t errlen)
{
    const char *end = NULL;
    *root = NULL;
    if (!body || len == 0) {
        snprintf(err, errlen, "empty request body: expected %s", want);
        return JSON_EPARSE;
    }
    bool oom;
    *root = json_parse_body(body, len, &end, &oom);
    if (!*root && oom) {
        snprintf(err, errlen, "out of memory reading the request body");
        return JSON_ENOMEM;
    }
    if (!*root) {
        snprintf(err, errlen, "malformed JSON in the request body near byte %zu",
                 end && end >= body ? (size_t)(end - body) : (size_t)0);
        return JSON_EPARSE;
    }
    return JSON_OK;
}

int json_parse_tokenize(const char *body, size_t len, char **inputs, char *err, size_t errlen)
{
    cJSON *root;
    *inputs = NULL;
    int prc = parse_small_body(body, len, "{\"inputs\": \"...\"}", &root, err, errlen);
    if (prc)
        return prc;
    int rc = JSON_EINVALID;
    const cJSON *in = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "inputs") : NULL;
    if (!cJSON_IsString(in)) {
        snprintf(err, errlen, "`inputs`: missing field (expected a string)");
        goto out;
    }
    *inputs = fault_strdup(in->valuestring);
    rc = *inputs ? JSON_OK : JSON_ENOMEM;
out:
    cJSON_Delete(root);
    return rc;
}

int json_parse_detokenize(const char *body, size_t len, int32_t max_id, int32_t **ids, int *n_ids, char *err,
                          size_t errlen)
{
    cJSON *root;
    *ids = NULL;
    *n_ids = 0;
    int prc = parse_small_body(body, len, "{\"tokens\": [ids]}", &root, err, errlen);
    if (prc)
        return prc;
    int rc = JSON_EINVALID;
    const cJSON *arr = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "tokens") : NULL;
    if (!cJSON_IsArray(arr)) {
        snprintf(err, errlen, "`tokens`: missing field (expected an array of token ids)");
        goto out;
    }
    int n = cJSON_GetArraySize(arr);
    *ids = fault_malloc((size_t)(n > 0 ? n : 1) * sizeof(**ids));
    if (!*ids) {
        rc = JSON_ENOMEM;
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!(v >= 0 && v <= max_id && v == floor(v))) {
            snprintf(err, errlen, "`tokens`: item %d is not a token id (integers 0..%d)", *n_ids, (int)max_id);
            free(*ids);
            *ids = NULL;
            *n_ids = 0;
            goto out;
        }
        (*ids)[(*n_ids)++] = (int32_t)v;
    }
    rc = JSON_OK;
out:
    cJSON_Delete(root);
    return rc;
}

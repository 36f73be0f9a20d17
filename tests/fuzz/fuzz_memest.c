/* fuzz_memest.c - libFuzzer target: POST /v1/memory/estimate's body, and
 * the byte sizes `hyserve mem --budget`, the config file and the body's
 * "budget" give as text.
 *
 * Input: byte 0 picks what the rest is: bit 0 clear, a body
 * (memest_parse; bit 1 says whether a model is served, so the body may
 * name neither preset nor layout); bit 0 set, a size text
 * (config_parse_bytes).
 * Properties: a body is either accepted or refused with a message; an
 * accepted one has context 1..1e9, batch 1..1e6, at least one layer no
 * more than n_layers, a page of at least one token, and its estimate
 * (memplan_estimate_json, what the route answers) is made, every number
 * in it finite and not negative (byte counts and ratios; the largest
 * batch is -1 when sequences cost nothing), its totals hang together (the
 * whole at least each part, reserved at least used: a product that wrapped
 * past 64 bits breaks this), and it prints.
 * A size text read as bytes reads back the same from its decimal form.
 */
#include <inttypes.h>
#include <math.h>

#include "config.h"
#include "fuzz.h"
#include "json.h"
#include "memest.h"
#include "presets.h"

/* Every number under j finite and >= 0 (max_batch_at_context may be -1:
 * a layout whose sequences cost nothing fits any batch). */
static void check_numbers(const cJSON *j)
{
    for (const cJSON *c = j->child; c; c = c->next) {
        if (cJSON_IsNumber(c))
            FUZZ_CHECK(isfinite(c->valuedouble) &&
                       (c->valuedouble >= 0 ||
                        (c->valuedouble == -1 && c->string && !strcmp(c->string, "max_batch_at_context"))));
        else if (cJSON_IsObject(c) || cJSON_IsArray(c))
            check_numbers(c);
    }
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    FUZZ_CHECK(cJSON_IsNumber(v));
    return v->valuedouble;
}

/* The totals hang together as byte counts do (a product that wrapped
 * would break one): a batch holds at least one sequence, reserving rounds
 * up to whole pages, and the whole holds each of its parts. */
static void check_totals(const cJSON *r)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "total");
    FUZZ_CHECK(t != NULL);
    const double res_seq = num(t, "bytes_reserved_per_sequence"), used_seq = num(t, "bytes_used_per_sequence");
    const double res = num(t, "bytes_reserved"), used = num(t, "bytes_used");
    FUZZ_CHECK(res_seq >= used_seq && res >= res_seq && used >= used_seq && res >= used);
    FUZZ_CHECK(res >= num(t, "kv_bytes") && res >= num(t, "recurrent_state_bytes"));
}

static void check_size_text(const char *s)
{
    uint64_t v = 0, back = 0;
    if (config_parse_bytes(s, &v) != 0)
        return;
    if (v >= (1ULL << 53))
        return;     /* past a double's whole numbers the decimal form rounds */
    char dec[32];
    snprintf(dec, sizeof dec, "%" PRIu64, v);
    FUZZ_CHECK(config_parse_bytes(dec, &back) == 0 && back == v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    const uint8_t how = data[0];
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    if (how & 1) {
        char *s = malloc(len + 1);
        if (!s)
            return 0;
        memcpy(s, body, len);
        s[len] = '\0';
        check_size_text(s);
        free(s);
        return 0;
    }
    static memplan_layout served;
    static bool have_served;
    if (!have_served) {
        char e[256];
        FUZZ_CHECK(preset_load("qwen3-next-80b-a3b", &served, e, sizeof e) == 0);
        have_served = true;
    }
    memest_req q;
    char err[512];
    err[0] = '\0';
    int rc = memest_parse(body, len, (how & 2) ? &served : NULL, 4096, &q, err, sizeof err);
    if (rc != JSON_OK) {
        FUZZ_CHECK((rc == JSON_EPARSE || rc == JSON_EINVALID || rc == JSON_ENOMEM) && err[0]);
        return 0;
    }
    FUZZ_CHECK(q.context >= 1 && q.context <= 1000000000);
    FUZZ_CHECK(q.batch >= 1 && q.batch <= 1000000);
    const memplan_layout *l = &q.l;
    const int sum = l->attn_layers + l->mla_layers + l->dnet_layers + l->mamba_layers + l->kda_layers;
    FUZZ_CHECK(sum >= 1 && sum <= l->n_layers);
    FUZZ_CHECK(l->page_tokens >= 1);
    cJSON *r = memplan_estimate_json(l, q.context, q.batch, q.budget);
    FUZZ_CHECK(r != NULL);
    check_numbers(r);
    check_totals(r);
    char *txt = cJSON_PrintUnformatted(r);
    FUZZ_CHECK(txt != NULL);
    free(txt);
    cJSON_Delete(r);
    return 0;
}

/* memest.c - the body of POST /v1/memory/estimate (memest.h says what it
 * owns).
 *
 * Body: {"preset": NAME} or {"layout": {...preset format...}} or neither
 * (the served model's layout), plus optional "context", "batch",
 * "kv_dtype", "state_dtype" (recurrent state: f32 or bf16; conv windows stay
 * f32), "page_tokens", "budget" (bytes, or a string like "24G").
 */
#include "memest.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "json.h"
#include "engine.h"
#include "presets.h"

static bool known_preset(const char *name)
{
    char names[64][PRESET_NAME_MAX];
    int n = preset_list(names, 64);
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name))
            return true;
    return false;
}

/* A whole number in [lo, hi] (range: the same in words) at field name of j: 0 absent, 1 read into
 * *out, -1 not one (err says so). */
static int get_count(const cJSON *j, const char *name, double lo, double hi, const char *range, int64_t *out,
                     char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != (double)(int64_t)v->valuedouble) {
        snprintf(err, errlen, "\"%s\" must be an integer from %s", name, range);
        return -1;
    }
    *out = (int64_t)v->valuedouble;
    return 1;
}

int memest_parse(const char *body, size_t len, const memplan_layout *served, int64_t served_ctx, memest_req *out,
                 char *err, size_t errlen)
{
    const char *end = NULL;
    bool oom = false;
    memset(out, 0, sizeof(*out));
    cJSON *j = len ? json_parse_body(body, len, &end, &oom) : cJSON_CreateObject();
    if (!j) {
        snprintf(err, errlen, oom || !len ? "out of memory reading the request body" : "the body is not valid JSON");
        return oom || !len ? JSON_ENOMEM : JSON_EPARSE;
    }
    memplan_layout *l = &out->l;
    int rc = JSON_EINVALID;
    const cJSON *preset = cJSON_GetObjectItemCaseSensitive(j, "preset");
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(j, "layout");
    if (!cJSON_IsObject(j)) {
        snprintf(err, errlen, "the body must be a JSON object");
        goto out;
    } else if (preset && layout) {
        snprintf(err, errlen, "give either \"preset\" or \"layout\", not both");
        goto out;
    } else if (preset) {
        if (!cJSON_IsString(preset) || !known_preset(preset->valuestring)) {
            snprintf(err, errlen, "\"preset\" must be a preset name (known: %s)", preset_names());
            goto out;
        }
        if (preset_load(preset->valuestring, l, err, errlen))
            goto out;
    } else if (layout) {
        char e2[256];
        if (preset_from_json(layout, l, e2, sizeof(e2))) {
            snprintf(err, errlen, "layout: %s", e2);
            goto out;
        }
    } else if (served) {
        *l = *served;
        out->served = true;
    } else {
        snprintf(err, errlen, "the model is not loaded yet: name a \"preset\" or give a \"layout\"");
        goto out;
    }
    out->context = preset || layout ? (l->max_context > 0 && l->max_context < 4096 ? l->max_context : 4096)
                                    : served_ctx;
    out->batch = 1;
    out->speculative = -1;
    int64_t page = 0;
    if (get_count(j, "context", 1, 1e9, "1 to 1e9", &out->context, err, errlen) < 0 ||
        get_count(j, "batch", 1, 1e6, "1 to 1e6", &out->batch, err, errlen) < 0 ||
        get_count(j, "page_tokens", 1, 4096, "1 to 4096", &page, err, errlen) < 0)
        goto out;
    if (page)
        l->page_tokens = (int)page;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "kv_dtype"))) {
        if (!cJSON_IsString(v) || !kv_dtype_bytes(v->valuestring)) {
            snprintf(err, errlen, "\"kv_dtype\" must be \"f32\", \"f16\" or \"bf16\"");
            goto out;
        }
        memplan_set_kv_dtype(l, v->valuestring);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "state_dtype"))) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "f32") && strcmp(v->valuestring, "bf16"))) {
            snprintf(err, errlen, "\"state_dtype\" must be \"f32\" or \"bf16\"");
            goto out;
        }
        memplan_set_state_dtype(l, !strcmp(v->valuestring, "bf16") ? 2 : 4);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "budget"))) {
        if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e18) {
            out->budget = (uint64_t)v->valuedouble;
        } else if (!cJSON_IsString(v) || config_parse_bytes(v->valuestring, &out->budget)) {
            snprintf(err, errlen, "\"budget\" must be a byte count or a size like \"24G\"");
            goto out;
        }
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "speculative"))) {
        if (!cJSON_IsBool(v)) {
            snprintf(err, errlen, "\"speculative\" must be true or false");
            goto out;
        }
        out->speculative = cJSON_IsTrue(v);
    }
    rc = JSON_OK;
out:
    cJSON_Delete(j);
    return rc;
}

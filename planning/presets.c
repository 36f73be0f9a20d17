/* presets.c - JSON cache layouts and the memory estimate.
 * The arithmetic lives in engine/memplan.c; this file only translates. */
#include "presets.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "synth.h"

const char *preset_dir(void)
{
    const char *d = getenv("HYSERVE_PRESETS");
    return d && *d ? d : "config/presets";
}

void memplan_set_kv_dtype(memplan_layout *l, const char *name)
{
    l->kv_bytes = kv_dtype_bytes(name);
    snprintf(l->kv_dtype, sizeof l->kv_dtype, "%s", name);
}

int kv_dtype_bytes(const char *name)
{
    if (!strcmp(name, "f32"))
        return 4;
    if (!strcmp(name, "f16") || !strcmp(name, "bf16"))
        return 2;
    return 0;
}

/* Read integer field `key` of object o into *out (0 when absent). */
static int get_int(const cJSON *o, const char *section, const char *key, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 ||
        v->valuedouble != (double)(int)v->valuedouble) {
        snprintf(err, errlen, "%s%s%s must be a non-negative integer", section, *section ? "." : "", key);
        return -1;
    }
    *out = v->valueint;
    return 0;
}

int preset_from_json(const cJSON *j, memplan_layout *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    if (!cJSON_IsObject(j)) {
        snprintf(err, errlen, "a layout must be a JSON object");
        return -1;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    snprintf(l->name, sizeof l->name, "%s", cJSON_IsString(name) ? name->valuestring : "custom");
    if (get_int(j, "", "layers", &l->n_layers, err, errlen) ||
        get_int(j, "", "max_context", &l->max_context, err, errlen) ||
        get_int(j, "", "page_tokens", &l->page_tokens, err, errlen) ||
        get_int(j, "", "mlp_layers", &l->mlp_layers, err, errlen))
        return -1;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "attention");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "mla");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "deltanet");
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(j, "mamba");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kda");
    const cJSON *m2 = cJSON_GetObjectItemCaseSensitive(j, "mamba2");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(j, "shortconv");
    if ((a && (get_int(a, "attention", "layers", &l->attn_layers, err, errlen) ||
               get_int(a, "attention", "heads", &l->attn_heads, err, errlen) ||
               get_int(a, "attention", "kv_heads", &l->attn_kv_heads, err, errlen) ||
               get_int(a, "attention", "head_dim", &l->attn_head_dim, err, errlen))) ||
        (m && (get_int(m, "mla", "layers", &l->mla_layers, err, errlen) ||
               get_int(m, "mla", "heads", &l->mla_heads, err, errlen) ||
               get_int(m, "mla", "kv_lora_rank", &l->mla_kv_lora, err, errlen) ||
               get_int(m, "mla", "rope_dim", &l->mla_rope, err, errlen) ||
               get_int(m, "mla", "nope_dim", &l->mla_nope, err, errlen) ||
               get_int(m, "mla", "v_dim", &l->mla_v, err, errlen))) ||
        (d && (get_int(d, "deltanet", "layers", &l->dnet_layers, err, errlen) ||
               get_int(d, "deltanet", "k_heads", &l->dnet_k_heads, err, errlen) ||
               get_int(d, "deltanet", "v_heads", &l->dnet_v_heads, err, errlen) ||
               get_int(d, "deltanet", "d_k", &l->dnet_d_k, err, errlen) ||
               get_int(d, "deltanet", "d_v", &l->dnet_d_v, err, errlen) ||
               get_int(d, "deltanet", "conv_kernel", &l->dnet_conv, err, errlen))) ||
        (mb && (get_int(mb, "mamba", "layers", &l->mamba_layers, err, errlen) ||
                get_int(mb, "mamba", "d_inner", &l->mamba_d_inner, err, errlen) ||
                get_int(mb, "mamba", "d_state", &l->mamba_d_state, err, errlen) ||
                get_int(mb, "mamba", "conv_kernel", &l->mamba_conv, err, errlen))) ||
        (k && (get_int(k, "kda", "layers", &l->kda_layers, err, errlen) ||
               get_int(k, "kda", "heads", &l->kda_heads, err, errlen) ||
               get_int(k, "kda", "head_dim", &l->kda_head_dim, err, errlen) ||
               get_int(k, "kda", "conv_kernel", &l->kda_conv, err, errlen))) ||
        (m2 && (get_int(m2, "mamba2", "layers", &l->mamba2_layers, err, errlen) ||
                get_int(m2, "mamba2", "heads", &l->mamba2_heads, err, errlen) ||
                get_int(m2, "mamba2", "head_dim", &l->mamba2_head_dim, err, errlen) ||
                get_int(m2, "mamba2", "d_state", &l->mamba2_d_state, err, errlen) ||
                get_int(m2, "mamba2", "groups", &l->mamba2_groups, err, errlen) ||
                get_int(m2, "mamba2", "conv_kernel", &l->mamba2_conv, err, errlen))) ||
        (sc && (get_int(sc, "shortconv", "layers", &l->sconv_layers, err, errlen) ||
                get_int(sc, "shortconv", "channels", &l->sconv_channels, err, errlen) ||
                get_int(sc, "shortconv", "conv_kernel", &l->sconv_conv, err, errlen))))
        return -1;
    if (a && l->attn_kv_heads == 0)
        l->attn_kv_heads = l->attn_heads;               /* MHA */
    /* each count is at most 1e9 (get_int): their sum can pass INT_MAX */
    const int64_t sum = (int64_t)l->attn_layers + l->mla_layers + l->dnet_layers + l->mamba_layers + l->kda_layers +
                        l->mamba2_layers + l->sconv_layers;
    if (sum == 0 || sum > (l->n_layers ? l->n_layers : 1000000000)) {
        snprintf(err, errlen, "layer counts by kind (%lld) must be at least 1 and at most layers (%d)",
                 (long long)sum, l->n_layers ? l->n_layers : 1000000000);
        return -1;
    }
    if (l->n_layers == 0)
        l->n_layers = (int)sum;
    if (l->page_tokens == 0)
        l->page_tokens = 16;
    memplan_set_kv_dtype(l, "bf16");   /* published checkpoints' own dtype, unless the preset says */
    l->state_bytes = 4;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "kv_dtype");
    if (dt) {
        if (!cJSON_IsString(dt) || !kv_dtype_bytes(dt->valuestring)) {
            snprintf(err, errlen, "kv_dtype must be \"f32\", \"f16\" or \"bf16\"");
            return -1;
        }
        memplan_set_kv_dtype(l, dt->valuestring);
    }
    return 0;
}

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long sz = ftell(f);
        if (sz >= 0 && sz < (1 << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)sz + 1))) {
            *n = fread(buf, 1, (size_t)sz, f);
            buf[*n] = 0;
        }
    }
    fclose(f);
    return buf;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

int preset_list(char (*names)[PRESET_NAME_MAX], int cap)
{
    DIR *d = opendir(preset_dir());
    if (!d)
        return 0;
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) && n < cap) {
        size_t len = strlen(de->d_name);
        if (len > 5 && len - 5 < PRESET_NAME_MAX && !strcmp(de->d_name + len - 5, ".json")) {
            memcpy(names[n], de->d_name, len - 5);
            names[n++][len - 5] = '\0';
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_name);     /* a stable order */
    return n;
}

const char *preset_names(void)
{
    static char out[1024];
    char list[64][PRESET_NAME_MAX];
    int n = preset_list(list, 64);
    if (!n)
        return "(no presets found)";
    out[0] = '\0';
    for (int i = 0; i < n; i++)
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", i ? ", " : "", list[i]);
    return out;
}

int preset_load(const char *name_or_path, memplan_layout *l, char *err, size_t errlen)
{
    char path[1024];
    if (strchr(name_or_path, '/') || strstr(name_or_path, ".json"))
        snprintf(path, sizeof path, "%s", name_or_path);
    else
        snprintf(path, sizeof path, "%s/%s.json", preset_dir(), name_or_path);
    size_t n = 0;
    char *text = read_file(path, &n);
    if (!text) {
        snprintf(err, errlen, "no preset '%s' (known: %s)", name_or_path, preset_names());
        return -1;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    free(text);
    if (!j) {
        snprintf(err, errlen, "%s: not valid JSON", path);
        return -1;
    }
    char e2[256];
    int rc = preset_from_json(j, l, e2, sizeof e2);
    if (rc)
        snprintf(err, errlen, "%s: %s", path, e2);
    cJSON_Delete(j);
    return rc;
}

static void add_u64(cJSON *o, const char *k, uint64_t v)
{
    cJSON_AddNumberToObject(o, k, (double)v);
}

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

cJSON *memplan_estimate_json(const memplan_layout *l, int64_t context, int64_t batch, uint64_t budget)
{
    memplan_costs c;
    memplan_costs_of(l, &c);
    cJSON *r = cJSON_CreateObject();
    cJSON *lay = cJSON_AddObjectToObject(r, "layout");
    cJSON_AddStringToObject(lay, "name", l->name);
    cJSON_AddNumberToObject(lay, "layers", l->n_layers);
    if (l->mlp_layers)
        cJSON_AddNumberToObject(lay, "mlp_only_layers", l->mlp_layers);
    cJSON_AddStringToObject(lay, "kv_dtype", l->kv_dtype[0] ? l->kv_dtype : l->kv_bytes == 4 ? "f32" : "f16");
    cJSON_AddNumberToObject(lay, "kv_bytes_per_number", l->kv_bytes);
    cJSON_AddStringToObject(lay, "state_dtype", l->state_bytes == 2 ? "bf16" : "f32");
    cJSON_AddNumberToObject(lay, "page_tokens", l->page_tokens);
    if (l->attn_layers) {
        cJSON *a = cJSON_AddObjectToObject(lay, "attention");
        cJSON_AddStringToObject(a, "type", memplan_attn_kind(l->attn_heads, l->attn_kv_heads));
        cJSON_AddNumberToObject(a, "layers", l->attn_layers);
        cJSON_AddNumberToObject(a, "heads", l->attn_heads);
        cJSON_AddNumberToObject(a, "kv_heads", l->attn_kv_heads);
        cJSON_AddNumberToObject(a, "head_dim", l->attn_head_dim);
        add_u64(a, "numbers_per_token_per_layer", c.gqa_numbers_per_token_layer);
        add_u64(a, "bytes_per_token", c.attn_kv_bytes_per_token);
    }
    if (l->mla_layers) {
        cJSON *a = cJSON_AddObjectToObject(lay, "mla");
        cJSON_AddNumberToObject(a, "layers", l->mla_layers);
        cJSON_AddNumberToObject(a, "heads", l->mla_heads);
        cJSON_AddNumberToObject(a, "kv_lora_rank", l->mla_kv_lora);
        cJSON_AddNumberToObject(a, "rope_dim", l->mla_rope);
        add_u64(a, "numbers_per_token_per_layer", c.mla_numbers_per_token_layer);
        add_u64(a, "bytes_per_token", c.mla_bytes_per_token);
    }
    if (l->dnet_layers) {
        cJSON *a = cJSON_AddObjectToObject(lay, "deltanet");
        cJSON_AddNumberToObject(a, "layers", l->dnet_layers);
        add_u64(a, "ssm_state_bytes_per_seq", c.dnet_state_bytes_per_seq);
        add_u64(a, "conv_state_bytes_per_seq", c.dnet_conv_bytes_per_seq);
    }
    if (l->mamba_layers) {
        cJSON *a = cJSON_AddObjectToObject(lay, "mamba");
        cJSON_AddNumberToObject(a, "layers", l->mamba_layers);
        cJSON_AddNumberToObject(a, "d_inner", l->mamba_d_inner);
        cJSON_AddNumberToObject(a, "d_state", l->mamba_d_state);
        add_u64(a, "ssm_state_bytes_per_seq", c.mamba_state_bytes_per_seq);
        add_u64(a, "conv_state_bytes_per_seq", c.mamba_bytes_per_seq - c.mamba_state_bytes_per_seq);
    }
    if (l->kda_layers) {
        cJSON *a = cJSON_AddObjectToObject(lay, "kda");
        cJSON_AddNumberToObject(a, "layers", l->kda_layers);
        cJSON_AddNumberToObject(a, "heads", l->kda_heads);
        cJSON_AddNumberToObject(a, "head_dim", l->kda_head_dim);
        add_u64(a, "ssm_state_bytes_per_seq", c.kda_state_bytes_per_seq);
        add_u64(a, "conv_state_bytes_per_seq", c.kda_bytes_per_seq - c.kda_state_bytes_per_seq);
    }
    if (l->mamba2_layers) {
        cJSON *a = cJSON_AddObjectToObject(lay, "mamba2");
        cJSON_AddNumberToObject(a, "layers", l->mamba2_layers);
        cJSON_AddNumberToObject(a, "heads", l->mamba2_heads);
        cJSON_AddNumberToObject(a, "head_dim", l->mamba2_head_dim);
        cJSON_AddNumberToObject(a, "d_state", l->mamba2_d_state);
        cJSON_AddNumberToObject(a, "groups", l->mamba2_groups);
        add_u64(a, "ssm_state_bytes_per_seq", c.mamba2_state_bytes_per_seq);
        add_u64(a, "conv_state_bytes_per_seq", c.mamba2_conv_bytes_per_seq);
    }
    if (l->sconv_layers) {
        cJSON *a = cJSON_AddObjectToObject(lay, "shortconv");
        cJSON_AddNumberToObject(a, "layers", l->sconv_layers);
        cJSON_AddNumberToObject(a, "channels", l->sconv_channels);
        add_u64(a, "conv_state_bytes_per_seq", c.sconv_bytes_per_seq);
    }
    cJSON *per = cJSON_AddObjectToObject(r, "per_token");
    add_u64(per, "attn_kv_bytes", c.attn_kv_bytes_per_token);
    add_u64(per, "mla_bytes", c.mla_bytes_per_token);
    add_u64(per, "total_bytes", c.cache_bytes_per_token);
    cJSON *ps = cJSON_AddObjectToObject(r, "per_sequence");
    add_u64(ps, "recurrent_state_bytes", c.state_bytes_per_seq);
    cJSON *cf = cJSON_AddObjectToObject(r, "counterfactual");
    add_u64(cf, "mha_bytes_per_token", c.mha_bytes_per_token);
    cJSON_AddNumberToObject(cf, "mha_over_actual", ratio(c.mha_bytes_per_token, c.cache_bytes_per_token));
    add_u64(cf, "all_attention_bytes_per_token", c.all_attention_bytes_per_token);
    cJSON_AddNumberToObject(cf, "actual_over_all_attention", ratio(c.cache_bytes_per_token, c.all_attention_bytes_per_token));
    add_u64(cf, "gqa_all_layers_bytes_per_token", c.gqa_all_layers_bytes_per_token);
    add_u64(cf, "mla_all_layers_bytes_per_token", c.mla_all_layers_bytes_per_token);
    if (context > 0 && batch > 0) {
        cJSON *t = cJSON_AddObjectToObject(r, "total");
        cJSON_AddNumberToObject(t, "context", (double)context);
        cJSON_AddNumberToObject(t, "batch", (double)batch);
        uint64_t res = memplan_seq_reserved_bytes(l, context), used = memplan_seq_used_bytes(l, context);
        add_u64(t, "bytes_reserved_per_sequence", res);
        add_u64(t, "bytes_used_per_sequence", used);
        add_u64(t, "bytes_reserved", memplan_mul(res, (uint64_t)batch));
        add_u64(t, "bytes_used", memplan_mul(used, (uint64_t)batch));
        add_u64(t, "kv_bytes", memplan_mul(res - c.state_bytes_per_seq, (uint64_t)batch));
        add_u64(t, "recurrent_state_bytes", memplan_mul(c.state_bytes_per_seq, (uint64_t)batch));
        add_u64(t, "mha_kv_bytes", memplan_mul(memplan_mul(c.mha_bytes_per_token, (uint64_t)context), (uint64_t)batch));
    }
    /* the prefix cache keeps the recurrent state at chosen lengths: one
     * snapshot is a sequence's state (the KV of a cached prefix is its pages) */
    cJSON *pc = cJSON_AddObjectToObject(r, "prefix_cache");
    add_u64(pc, "snapshot_bytes", c.state_bytes_per_seq);
    if (budget > 0 && c.state_bytes_per_seq > 0)
        add_u64(pc, "snapshots_in_budget", budget / c.state_bytes_per_seq);
    if (budget > 0) {
        cJSON *f = cJSON_AddObjectToObject(r, "fits");
        add_u64(f, "budget_bytes", budget);
        if (context > 0)
            cJSON_AddNumberToObject(f, "max_batch_at_context", (double)memplan_max_batch(l, budget, context));
        if (batch > 0)
            cJSON_AddNumberToObject(f, "max_context_at_batch", (double)memplan_max_context(l, budget, batch));
    }
    return r;
}

int synth_from_layout(const memplan_layout *l, struct synth_config *c, char *err, size_t errlen)
{
    synth_config_default(c);
    int n_attn = l->attn_layers + l->mla_layers;
    if (n_attn > 0 && l->attn_layers > 0 && l->mla_layers > 0) {
        snprintf(err, errlen, "a preset with both GQA and MLA layers: write the pattern with hyserve synth --pattern");
        return -1;
    }
    const int n_rec_kinds = (l->dnet_layers > 0) + (l->mamba2_layers > 0) + (l->sconv_layers > 0) +
                            (l->mamba_layers > 0) + (l->kda_layers > 0);
    if (n_rec_kinds > 1 || ((l->mamba2_layers || l->sconv_layers || l->mamba_layers) && l->mla_layers)) {
        snprintf(err, errlen, "%s mixes recurrent kinds (or MLA with Mamba or short convolutions), which no "
                 "architecture the synthesizer writes has", l->name);
        return -1;
    }
    if (l->kda_layers && (l->attn_layers || (l->mla_layers && l->mla_heads != l->kda_heads))) {
        snprintf(err, errlen, "%s: KDA layers go with MLA layers of as many heads (kimi-linear)", l->name);
        return -1;
    }
    snprintf(c->name, sizeof c->name, "synth of %.50s", l->name);
    c->n_layer = l->n_layers + l->mlp_layers;
    c->n_embd = 64;
    c->n_ff = 64;
    c->n_vocab = 512;
    c->chat_template = 1;
    c->n_ctx = l->max_context > 0 ? l->max_context : 4096;
    /* attention layer last in each group of n_layers / n_attn mixer layers */
    const char rec = l->dnet_layers ? 'L' : l->mamba2_layers ? 'S' : l->mamba_layers ? 'B' : l->kda_layers ? 'K' : 'C';
    if (l->mla_layers && !l->dnet_layers && l->mla_layers == l->n_layers) {
        snprintf(c->arch, sizeof c->arch, "deepseek2");
    } else if (!l->dnet_layers && !l->mamba2_layers && !l->sconv_layers && !l->mamba_layers && !l->kda_layers) {
        snprintf(c->arch, sizeof c->arch, "qwen3");
    } else {
        snprintf(c->arch, sizeof c->arch, "%s", l->dnet_layers ? "qwen35" : l->sconv_layers ? "lfm2"
                                                 : l->mamba_layers ? "jamba" : l->kda_layers ? "kimi-linear"
                                                 : l->mlp_layers ? "nemotron_h"
                                                 : "granitehybrid");
        if (c->n_layer > (int)sizeof c->pattern - 1) {
            snprintf(err, errlen, "%d layers are more than the synthesizer's pattern holds", c->n_layer);
            return -1;
        }
        /* mixer layers in order, the attention layers spread evenly (the
         * last of each n_layers / n_attn, rounded); MLP-only layers
         * (Nemotron-H) after each mixer layer while they last */
        int n = 0, mlp = l->mlp_layers;
        for (int il = 0; il < l->n_layers; il++) {
            const bool attn = (int64_t)(il + 1) * n_attn / l->n_layers > (int64_t)il * n_attn / l->n_layers;
            c->pattern[n++] = attn ? (l->mla_layers ? 'M' : 'A') : rec;
            if (mlp > 0) {
                c->pattern[n++] = 'F';
                mlp--;
            }
        }
        while (mlp-- > 0)
            c->pattern[n++] = 'F';
        c->pattern[n] = 0;
        if (l->dnet_layers) {
            c->dnet_n_k = l->dnet_k_heads;
            c->dnet_n_v = l->dnet_v_heads;
            c->dnet_d_k = l->dnet_d_k;
            c->dnet_d_v = l->dnet_d_v;
        }
        c->conv_kernel = l->dnet_layers ? l->dnet_conv : l->mamba2_layers ? l->mamba2_conv
                       : l->mamba_layers ? l->mamba_conv : l->kda_layers ? l->kda_conv : l->sconv_conv;
        if (l->mamba_layers) {
            c->m1_inner = l->mamba_d_inner;
            c->m2_d_state = l->mamba_d_state;
            c->n_expert = 0;
        }
        if (l->mamba2_layers) {
            c->m2_heads = l->mamba2_heads;
            c->m2_head_dim = l->mamba2_head_dim;
            c->m2_d_state = l->mamba2_d_state;
            c->m2_groups = l->mamba2_groups;
            c->n_expert = 0;
        }
        if (l->sconv_layers)
            c->n_embd = l->sconv_channels;      /* the conv window is n_embd wide */
    }
    if (l->attn_layers) {
        c->n_head = l->attn_heads;
        c->n_head_kv = l->attn_kv_heads;
        c->head_dim = l->attn_head_dim;
        c->n_rot = l->attn_head_dim / 4 * 2 > 0 ? l->attn_head_dim / 4 * 2 : 2;
    }
    if (l->mla_layers) {
        c->n_head = l->mla_heads;
        c->mla_kv_lora = l->mla_kv_lora;
        c->mla_rope = l->mla_rope;
        c->mla_nope = l->mla_nope;
        c->mla_v = l->mla_v;
    }
    if (l->kda_layers) {            /* KDA heads of head_dim (synth's --heads, --head-dim) */
        c->n_head = l->kda_heads;
        c->head_dim = l->kda_head_dim;
        c->n_head_kv = 1;
    }
    c->dtype = GGML_F16;
    return 0;
}

int preset_synth_write(const char *name_or_path, const char *path, char *name_out, size_t name_cap, char *err,
                       size_t errlen)
{
    memplan_layout lay;
    synth_config sc;
    if (preset_load(name_or_path, &lay, err, errlen) || synth_from_layout(&lay, &sc, err, errlen) ||
        synth_write(&sc, path, err, errlen))
        return -1;
    if (name_cap)
        snprintf(name_out, name_cap, "%s", lay.name);
    return 0;
}

void memplan_spec_add_json(cJSON *r, const memplan_layout *l, const memplan_layout *draft,
                           uint64_t draft_weight_bytes, bool mtp, int64_t context, int64_t batch, uint64_t budget)
{
    memplan_costs c;
    memplan_costs_of(l, &c);
    const uint64_t snap = c.state_bytes_per_seq;
    uint64_t draft_per_seq = 0, draft_cache = 0, draft_weights = 0;
    if (draft) {
        memplan_costs dc;
        memplan_costs_of(draft, &dc);
        draft_per_seq = memplan_add(memplan_seq_reserved_bytes(draft, context), dc.state_bytes_per_seq);
        draft_cache = memplan_mul(draft_per_seq, (uint64_t)batch);
        draft_weights = draft_weight_bytes;
    }
    uint64_t mtp_per_seq = 0, mtp_cache = 0;
    if (mtp) {  /* one attention layer of the model's KV shape, nothing else (engine/mtp.c's cache) */
        const memplan_layout ml = { .n_layers = 1, .attn_layers = 1, .attn_heads = l->attn_heads,
                                    .attn_kv_heads = l->attn_kv_heads, .attn_head_dim = l->attn_head_dim,
                                    .kv_bytes = l->kv_bytes, .state_bytes = l->state_bytes,
                                    .page_tokens = l->page_tokens };
        mtp_per_seq = memplan_seq_reserved_bytes(&ml, context);
        mtp_cache = memplan_mul(mtp_per_seq, (uint64_t)batch);
    }
    const uint64_t total = memplan_add(memplan_add(memplan_add(memplan_mul(snap, (uint64_t)batch), draft_cache),
                                                   draft_weights), mtp_cache);
    cJSON *o = cJSON_AddObjectToObject(r, "speculative");
    cJSON_AddNumberToObject(o, "rollback_snapshot_bytes_per_seq", (double)snap);
    cJSON_AddNumberToObject(o, "draft_cache_bytes_per_seq", (double)draft_per_seq);
    cJSON_AddNumberToObject(o, "draft_cache_bytes", (double)draft_cache);
    cJSON_AddNumberToObject(o, "draft_weight_bytes", (double)draft_weights);
    cJSON_AddNumberToObject(o, "mtp_cache_bytes_per_seq", (double)mtp_per_seq);
    cJSON_AddNumberToObject(o, "mtp_cache_bytes", (double)mtp_cache);
    cJSON_AddNumberToObject(o, "total_bytes", (double)total);
    if (budget) {
        const uint64_t per = memplan_add(memplan_seq_reserved_bytes(l, context), snap);
        cJSON_AddNumberToObject(o, "max_batch", per ? (double)(budget / per) : 0.0);
    }
}

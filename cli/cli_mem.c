/* cli_mem.c - `hyserve mem`: the cache planner, no weights needed.
 *
 *   hyserve mem --preset qwen3-next-80b-a3b --context 32768 --batch 8 --budget 64G
 *
 * Prints the layout, bytes per token and per sequence by layer kind, the
 * MHA and all-attention counterfactuals, the totals, and the largest batch
 * and context that fit the budget. --json prints what POST
 * /v1/memory/estimate returns. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine.h"
#include "presets.h"
#include "synth.h"

static const char mem_help[] =
    "usage: hyserve mem (--preset NAME | --config FILE.json | -m MODEL.gguf) [options]\n"
    "  --preset NAME      a layout from config/presets/ (see the list below)\n"
    "  --config FILE      a layout in the preset JSON format\n"
    "  -m, --model FILE   a GGUF model's own layout (weights are mapped, not read)\n"
    "  --context N        tokens per sequence (default: 4096)\n"
    "  --batch B          sequences (default 1)\n"
    "  --kv-dtype T       f32 | f16 | bf16 for attention caches (default: the preset's, f32 for -m)\n"
    "  --list             list the presets, their layer kinds, and which the engine can run\n"
    "  --state-dtype T    f32 | bf16 for recurrent states (conv windows stay f32; default f32)\n"
    "  --page-tokens P    KV page size (default 16)\n"
    "  --budget SIZE      cache budget, e.g. 24G: also print the largest batch and context\n"
    "  --speculative      the sequences speculate: each holds a rollback snapshot of its recurrent state\n"
    "  --model-draft FILE the draft model of --spec-type draft-simple: its weights and its own cache for\n"
    "                     --batch draft sequences of --context tokens (implies --speculative)\n"
    "  --mtp              -m MODEL's MTP block drafts (--spec-type draft-mtp): its own KV pool, one\n"
    "                     attention layer for --batch sequences of --context tokens (implies --speculative)\n"
    "  --json             print JSON (the /v1/memory/estimate response, and a \"speculative\" object)\n";

static void fmt_bytes(char *buf, size_t n, uint64_t b)
{
    const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)b);
    else
        snprintf(buf, n, "%llu B (%.2f %s)", (unsigned long long)b, v, unit[u]);
}

/* --list: every preset, its layer kinds, and whether the engine can run it
 * (`serve --synth`) or only the planner knows it (Mamba and KDA layers). */
static int list_presets(void)
{
    char names[64][PRESET_NAME_MAX];
    int n = preset_list(names, 64);
    for (int i = 0; i < n; i++) {
        memplan_layout l;
        char err[256];
        if (preset_load(names[i], &l, err, sizeof err)) {
            printf("%-22s (unreadable: %s)\n", names[i], err);
            continue;
        }
        char kinds[160] = "";
        size_t k = 0;
        if (l.attn_layers)
        {
            const char *kind = memplan_attn_kind(l.attn_heads, l.attn_kv_heads);
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d %c%c%c ", l.attn_layers, toupper(kind[0]),
                                  toupper(kind[1]), toupper(kind[2]));
        }
        if (l.mla_layers && k < sizeof kinds)
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d MLA ", l.mla_layers);
        if (l.dnet_layers && k < sizeof kinds)
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d DeltaNet ", l.dnet_layers);
        if (l.mamba_layers && k < sizeof kinds)
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d Mamba ", l.mamba_layers);
        if (l.kda_layers && k < sizeof kinds)
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d KDA ", l.kda_layers);
        if (l.mamba2_layers && k < sizeof kinds)
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d Mamba-2 ", l.mamba2_layers);
        if (l.sconv_layers && k < sizeof kinds)
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d ShortConv ", l.sconv_layers);
        if (l.mlp_layers && k < sizeof kinds)
            k += (size_t)snprintf(kinds + k, sizeof kinds - k, "%d MLP ", l.mlp_layers);
        memplan_layout probe = l;
        struct synth_config sc;
        char why[256];
        const bool runs = synth_from_layout(&probe, &sc, why, sizeof why) == 0;
        printf("%-22s %-40s %s\n", names[i], kinds, runs ? "runs (serve --synth)" : "planner only (no synthesizer "
                                                                              "for its layout)");
    }
    return 0;
}

/* A GGUF's layout (the weights mapped, not read), its weight bytes and
 * its MTP blocks (nextn_predict_layers; NULL: not asked). */
static int mem_open_layout(const char *path, const char *kvd, memplan_layout *l, uint64_t *weights, int *n_nextn,
                           char *err, size_t errlen)
{
    engine_params p;
    engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 1;
    p.max_seqs = 1;
    p.n_ctx = 16;
    if (kvd && kv_dtype_bytes(kvd))
        p.kv_dtype = !strcmp(kvd, "f16") ? ENGINE_KV_F16 : !strcmp(kvd, "bf16") ? ENGINE_KV_BF16 : ENGINE_KV_F32;
    engine *e = engine_open(&p, err, errlen);
    if (!e)
        return -1;
    engine_get_memplan(e, l);
    const engine_info *in = engine_get_info(e);
    /* the name the server serves the file under (docs/serving.md 3.4):
     * its file name without .gguf, as /v1/memory/estimate says */
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t bl = strlen(base);
    if (bl > 5 && !strcmp(base + bl - 5, ".gguf"))
        bl -= 5;
    snprintf(l->name, sizeof l->name, "%.*s", (int)bl, base);
    l->max_context = in->n_ctx_train;
    *weights = in->weight_bytes;
    if (n_nextn)
        *n_nextn = in->has_mtp ? in->n_nextn : 0;
    engine_close(e);
    return 0;
}

/* A byte count of the estimate's "speculative" object (0 when absent). */
static uint64_t spec_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) && v->valuedouble > 0 ? (uint64_t)v->valuedouble : 0;
}

int cli_mem(int argc, char **argv)
{
    const char *preset = NULL, *config = NULL, *model = NULL, *kvd = NULL, *sdt = NULL, *draft = NULL;
    bool spec = false, mtp = false;
    long context = 4096, batch = 1, page = 0;
    uint64_t budget = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = strcmp(a, "--json") && strcmp(a, "-h") && strcmp(a, "--help") && strcmp(a, "--list") &&
                     strcmp(a, "--speculative") && strcmp(a, "--mtp");
        if (takes && !v) {
            fprintf(stderr, "hyserve: option %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(mem_help, stdout);
            printf("presets: %s\n", preset_names());
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        } else if (!strcmp(a, "--list")) {
            return list_presets();
        } else if (!strcmp(a, "--speculative")) {
            spec = true;
            continue;
        } else if (!strcmp(a, "--mtp")) {
            spec = mtp = true;
            continue;
        } else if (!strcmp(a, "--model-draft")) draft = v;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--kv-dtype")) kvd = v;
        else if (!strcmp(a, "--state-dtype")) sdt = v;
        else if (!strcmp(a, "--context")) { if (!cli_int(a, v, 1, 1L << 30, &context)) return 2; }
        else if (!strcmp(a, "--batch")) { if (!cli_int(a, v, 1, 1L << 20, &batch)) return 2; }
        else if (!strcmp(a, "--page-tokens")) { if (!cli_int(a, v, 1, 1 << 16, &page)) return 2; }
        else if (!strcmp(a, "--budget")) { if (!cli_bytes(a, v, &budget)) return 2; }
        else {
            fprintf(stderr, "hyserve: mem: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        i++;
    }
    if (!!preset + !!config + !!model != 1) {
        fprintf(stderr, "hyserve: mem: give exactly one of --preset NAME, --config FILE or -m MODEL\n");
        return 2;
    }
    memplan_layout l, dl;
    char err[512];
    uint64_t draft_weights = 0;
    if (draft) {
        spec = true;
        if (mem_open_layout(draft, kvd, &dl, &draft_weights, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "hyserve: mem: --model-draft: %s\n", err);
            return 1;
        }
    }
    if (mtp && !model) {
        fprintf(stderr, "hyserve: mem: --mtp needs -m MODEL (a file with an MTP block)\n");
        return 2;
    }
    if (model) {
        uint64_t w;
        int n_nextn = 0;
        if (mem_open_layout(model, kvd, &l, &w, &n_nextn, err, sizeof err) != 0) {
            fprintf(stderr, "hyserve: %s\n", err);
            return 1;
        }
        if (mtp && n_nextn == 0) {
            fprintf(stderr, "hyserve: mem: --mtp: %s has no MTP block (nextn_predict_layers is 0)\n", model);
            return 1;
        }
    } else if (preset_load(preset ? preset : config, &l, err, sizeof err) != 0) {
        fprintf(stderr, "hyserve: mem: %s\n", err);
        return 1;
    }
    if (kvd) {
        if (!kv_dtype_bytes(kvd)) {
            fprintf(stderr, "hyserve: --kv-dtype must be f32, f16 or bf16, got '%s'\n", kvd);
            return 2;
        }
        memplan_set_kv_dtype(&l, kvd);
    }
    if (sdt) {
        if (strcmp(sdt, "f32") && strcmp(sdt, "bf16")) {
            fprintf(stderr, "hyserve: --state-dtype must be f32 or bf16, got '%s'\n", sdt);
            return 2;
        }
        memplan_set_state_dtype(&l, !strcmp(sdt, "bf16") ? 2 : 4);
    }
    if (page)
        l.page_tokens = (int)page;
    cJSON *r = memplan_estimate_json(&l, context, batch, budget);
    if (spec)
        memplan_spec_add_json(r, &l, draft ? &dl : NULL, draft_weights, mtp, context, batch, budget);
    if (json) {
        char *s = cJSON_PrintUnformatted(r);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(r);
        return 0;
    }
    memplan_costs c;
    memplan_costs_of(&l, &c);
    char b1[64], b2[64], b3[64];
    printf("layout:            %s, %d layers:", l.name, l.n_layers);
    if (l.attn_layers)
        printf(" %d attention (%d KV heads x %d)", l.attn_layers, l.attn_kv_heads, l.attn_head_dim);
    if (l.mla_layers)
        printf(" %d MLA (latent %d + rope %d)", l.mla_layers, l.mla_kv_lora, l.mla_rope);
    if (l.dnet_layers)
        printf(" %d Gated DeltaNet", l.dnet_layers);
    if (l.mamba_layers)
        printf(" %d Mamba", l.mamba_layers);
    if (l.kda_layers)
        printf(" %d KDA", l.kda_layers);
    if (l.mamba2_layers)
        printf(" %d Mamba-2 (%d heads x %d, state %d, %d groups)", l.mamba2_layers, l.mamba2_heads,
               l.mamba2_head_dim, l.mamba2_d_state, l.mamba2_groups);
    if (l.sconv_layers)
        printf(" %d short conv", l.sconv_layers);
    if (l.mlp_layers)
        printf(" (+ %d MLP-only)", l.mlp_layers);
    int conv = l.conv_bytes ? l.conv_bytes : l.state_bytes;
    printf("\ncache numbers:     KV %s (%d bytes), state %s (%d bytes), conv %s\n",
           l.kv_dtype[0] ? l.kv_dtype : l.kv_bytes == 4 ? "f32" : "f16", l.kv_bytes, l.state_bytes == 2 ? "bf16" : "f32",
           l.state_bytes, conv == 2 ? "bf16" : "f32");
    if (l.attn_layers)
        printf("attention KV:      %llu numbers per token per layer, %llu B per token\n",
               (unsigned long long)c.gqa_numbers_per_token_layer, (unsigned long long)c.attn_kv_bytes_per_token);
    if (l.mla_layers)
        printf("MLA latent:        %llu numbers per token per layer, %llu B per token\n",
               (unsigned long long)c.mla_numbers_per_token_layer, (unsigned long long)c.mla_bytes_per_token);
    fmt_bytes(b1, sizeof b1, c.state_bytes_per_seq);
    printf("recurrent state:   %s per sequence", b1);
    if (l.dnet_layers)
        printf(" (DeltaNet %llu + conv %llu)", (unsigned long long)c.dnet_state_bytes_per_seq,
               (unsigned long long)c.dnet_conv_bytes_per_seq);
    if (l.mamba2_layers)
        printf(" (Mamba-2 %llu + conv %llu)", (unsigned long long)c.mamba2_state_bytes_per_seq,
               (unsigned long long)c.mamba2_conv_bytes_per_seq);
    if (l.sconv_layers)
        printf(" (short conv %llu)", (unsigned long long)c.sconv_bytes_per_seq);
    printf("\n");
    printf("plain MHA instead: %llu B per token (%.2fx this layout)\n",
           (unsigned long long)c.mha_bytes_per_token,
           c.cache_bytes_per_token ? (double)c.mha_bytes_per_token / (double)c.cache_bytes_per_token : 0.0);
    printf("all attention:     %llu B per token (this layout is %.3f of it)\n",
           (unsigned long long)c.all_attention_bytes_per_token,
           c.all_attention_bytes_per_token ? (double)c.cache_bytes_per_token / (double)c.all_attention_bytes_per_token : 0.0);
    uint64_t res = memplan_seq_reserved_bytes(&l, context);
    fmt_bytes(b1, sizeof b1, res);
    fmt_bytes(b2, sizeof b2, memplan_mul(res, (uint64_t)batch));
    fmt_bytes(b3, sizeof b3, memplan_mul(memplan_mul(c.mha_bytes_per_token, (uint64_t)context), (uint64_t)batch));
    printf("%ld tokens x %ld:  %s per sequence, %s in all (plain MHA: %s)\n", context, batch, b1, b2, b3);
    if (budget) {
        fmt_bytes(b1, sizeof b1, budget);
        printf("budget %s: at most %lld sequences of %ld tokens; at most %lld tokens each for %ld sequences\n",
               b1, (long long)memplan_max_batch(&l, budget, context), context,
               (long long)memplan_max_context(&l, budget, batch), batch);
    }
    if (c.state_bytes_per_seq) {
        fmt_bytes(b1, sizeof b1, c.state_bytes_per_seq);
        printf("prefix snapshot:   %s (the recurrent state at one cached length)", b1);
        if (budget)
            printf("; the budget holds %llu", (unsigned long long)(budget / c.state_bytes_per_seq));
        printf("\n");
    }
    if (spec) {
        /* the figures of the "speculative" object, as --json prints them */
        const cJSON *so = cJSON_GetObjectItemCaseSensitive(r, "speculative");
        const uint64_t snap = spec_num(so, "rollback_snapshot_bytes_per_seq");
        fmt_bytes(b1, sizeof b1, snap);
        fmt_bytes(b2, sizeof b2, memplan_mul(snap, (uint64_t)batch));
        printf("speculation:       rollback snapshot %s per speculating sequence, %s for %ld (in the budget)", b1, b2,
               batch);
        if (budget)
            printf("; the budget holds %llu speculating sequences of %ld tokens",
                   (unsigned long long)spec_num(so, "max_batch"), context);
        printf("\n");
        if (draft) {
            fmt_bytes(b1, sizeof b1, spec_num(so, "draft_weight_bytes"));
            fmt_bytes(b2, sizeof b2, spec_num(so, "draft_cache_bytes"));
            fmt_bytes(b3, sizeof b3, spec_num(so, "total_bytes"));
            printf("draft model:       %s, weights %s, its own cache %s for %ld draft sequences of %ld tokens "
                   "(with their snapshots; beside the budget); speculation in all %s\n", dl.name, b1, b2, batch,
                   context, b3);
        }
        if (mtp) {
            fmt_bytes(b1, sizeof b1, spec_num(so, "mtp_cache_bytes_per_seq"));
            fmt_bytes(b2, sizeof b2, spec_num(so, "mtp_cache_bytes"));
            fmt_bytes(b3, sizeof b3, spec_num(so, "total_bytes"));
            printf("MTP drafts:        the MTP block's KV %s per sequence, %s for %ld (its own pool, beside the "
                   "budget); speculation in all %s\n", b1, b2, batch, b3);
        }
    }
    cJSON_Delete(r);
    return 0;
}

/* cli_engine.c - the engine subcommands: generate, logits, info, synth.
 *
 * Each prints one line naming the problem and exits non-zero on bad input.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "engine.h"
#include "gguf.h"
#include "presets.h"
#include "sampler.h"
#include "synth.h"
#include "tokenizer.h"

/* ------------------------------------------------------------------ */
/* option helpers                                                      */

bool cli_int(const char *opt, const char *val, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi) {
        fprintf(stderr, "hyserve: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, val);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *val, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !isfinite(v)) {
        fprintf(stderr, "hyserve: %s expects a number, got '%s'\n", opt, val);
        return false;
    }
    *out = v;
    return true;
}

bool cli_bytes(const char *opt, const char *val, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B')
        end += *end == 'i' ? (end[1] == 'B' ? 2 : 1) : 1;
    if (errno || end == val || *end || !(v >= 0) || v * mul > 1e15) {
        fprintf(stderr, "hyserve: %s expects a size like 512M or 2G, got '%s'\n", opt, val);
        return false;
    }
    *out = (uint64_t)(v * mul);
    return true;
}

/* argv walker: NEXT() yields the value of the current option or fails */
#define NEXT()                                                                        \
    (i + 1 < argc ? argv[++i]                                                          \
                  : (fprintf(stderr, "hyserve: option %s needs a value\n", argv[i]), (char *)NULL))
#define IS(a, b) is_opt(argv[i], a, b)

static bool is_opt(const char *arg, const char *a, const char *b)
{
    return !strcmp(arg, a) || (b && !strcmp(arg, b));
}

static int opt_mla_mode = ENGINE_MLA_AUTO, opt_kv_dtype = ENGINE_KV_F32, opt_state_dtype = ENGINE_STATE_F32;
static bool opt_huge_weights;

static bool parse_state_dtype(const char *v, int *out)
{
    if (!strcmp(v, "f32")) *out = ENGINE_STATE_F32;
    else if (!strcmp(v, "bf16")) *out = ENGINE_STATE_BF16;
    else {
        fprintf(stderr, "hyserve: --state-dtype must be f32 or bf16, got '%s'\n", v);
        return false;
    }
    return true;
}

static bool parse_kv_dtype(const char *v, int *out)
{
    if (!strcmp(v, "f32")) *out = ENGINE_KV_F32;
    else if (!strcmp(v, "f16")) *out = ENGINE_KV_F16;
    else if (!strcmp(v, "bf16")) *out = ENGINE_KV_BF16;
    else {
        fprintf(stderr, "hyserve: --kv-dtype must be f32, f16 or bf16, got '%s'\n", v);
        return false;
    }
    return true;
}

static bool parse_mla_mode(const char *v, int *out)
{
    if (!strcmp(v, "auto")) *out = ENGINE_MLA_AUTO;
    else if (!strcmp(v, "absorbed")) *out = ENGINE_MLA_ABSORBED;
    else if (!strcmp(v, "expanded")) *out = ENGINE_MLA_EXPANDED;
    else {
        fprintf(stderr, "hyserve: --mla-mode must be auto, absorbed or expanded, got '%s'\n", v);
        return false;
    }
    return true;
}

static bool opt_mtp;            /* logits --mtp: open with the MTP block's cache */
static bool opt_no_mtp_block;   /* set when the open failed for want of an MTP block */

static engine *open_engine(const char *model, int threads, int ctx, int dnet_mode)
{
    if (!model) {
        fprintf(stderr, "hyserve: no model given (use -m MODEL.gguf)\n");
        return NULL;
    }
    engine_params p;
    engine_params_default(&p);
    p.model_path = model;
    p.n_threads = threads;
    p.n_ctx = ctx;
    p.max_seqs = 1;
    p.dnet_mode = dnet_mode;
    p.mla_mode = opt_mla_mode;
    p.kv_dtype = opt_kv_dtype;
    p.state_dtype = opt_state_dtype;
    p.huge_weights = opt_huge_weights;
    p.mtp = opt_mtp;
    char err[512];
    engine *e = engine_open(&p, err, sizeof err);
    opt_no_mtp_block = !e && opt_mtp && strstr(err, "has no MTP block");
    if (!e)
        fprintf(stderr, "hyserve: %s%s\n", opt_no_mtp_block ? "logits: " : "", err);
    else if (engine_get_info(e)->weights_note[0])
        fprintf(stderr, "hyserve: warning: --huge-pages: %s\n", engine_get_info(e)->weights_note);
    return e;
}

static bool parse_dnet_mode(const char *v, int *mode)
{
    if (!strcmp(v, "auto")) *mode = ENGINE_DNET_AUTO;
    else if (!strcmp(v, "recurrent")) *mode = ENGINE_DNET_RECURRENT;
    else if (!strcmp(v, "chunked")) *mode = ENGINE_DNET_CHUNKED;
    else {
        fprintf(stderr, "hyserve: --dnet-mode must be auto, recurrent or chunked, got '%s'\n", v);
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ */
/* generate                                                            */

static const char generate_help[] =
    "usage: hyserve generate -m MODEL -p PROMPT [options]\n"
    "  -m, --model FILE       GGUF model\n"
    "  -p, --prompt TEXT      prompt text (special tokens like <|im_start|> are parsed)\n"
    "  -n, --n-predict N      tokens to generate (default 64)\n"
    "      --temp T           temperature; 0 = greedy (default 0.8)\n"
    "      --top-k K          keep the K most likely tokens (default 40, 0 = off)\n"
    "      --top-p P          nucleus sampling (default 0.95, 1 = off)\n"
    "      --min-p P          drop tokens below P * max prob (default 0.05, 0 = off)\n"
    "      --repeat-penalty R repetition penalty (default 1.0 = off)\n"
    "      --seed S           sampling seed (default 42)\n"
    "      --ignore-eos       keep going past end-of-generation tokens\n"
    "      --kv-dtype T       f32 | f16 | bf16 attention cache (default f32)\n"
    "      --state-dtype T    f32 | bf16 DeltaNet state between steps (default f32)\n"
    "      --huge-pages       read the weights into 2 MiB pages (default: the file mapping)\n"
    "  -c, --ctx N            context size (default min(train, 4096))\n"
    "  -t, --threads N        threads (default: all cores)\n"
    "Text goes to stdout as it is generated; speeds go to stderr.\n";

int cli_generate(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL;
    long n_predict = 64, threads = 0, ctx = 0, top_k = 40, seed = 42;
    double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0;
    bool ignore_eos = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (IS("-h", "--help")) { fputs(generate_help, stdout); return 0; }
        else if (IS("-m", "--model")) { if (!(model = NEXT())) return 2; }
        else if (IS("-p", "--prompt")) { if (!(prompt = NEXT())) return 2; }
        else if (IS("-n", "--n-predict")) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1 << 20, &n_predict)) return 2; }
        else if (IS("-t", "--threads")) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1024, &threads)) return 2; }
        else if (IS("-c", "--ctx")) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1 << 24, &ctx)) return 2; }
        else if (IS("--temp", NULL)) { if (!(v = NEXT()) || !cli_float(argv[i - 1], v, &temp)) return 2; }
        else if (IS("--top-k", NULL)) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1 << 30, &top_k)) return 2; }
        else if (IS("--top-p", NULL)) { if (!(v = NEXT()) || !cli_float(argv[i - 1], v, &top_p)) return 2; }
        else if (IS("--min-p", NULL)) { if (!(v = NEXT()) || !cli_float(argv[i - 1], v, &min_p)) return 2; }
        else if (IS("--repeat-penalty", NULL)) { if (!(v = NEXT()) || !cli_float(argv[i - 1], v, &rep)) return 2; }
        else if (IS("--seed", NULL)) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 0x7fffffffffffffffL, &seed)) return 2; }
        else if (IS("--ignore-eos", NULL)) ignore_eos = true;
        else if (IS("--kv-dtype", NULL)) { if (!(v = NEXT()) || !parse_kv_dtype(v, &opt_kv_dtype)) return 2; }
        else if (IS("--state-dtype", NULL)) { if (!(v = NEXT()) || !parse_state_dtype(v, &opt_state_dtype)) return 2; }
        else if (IS("--huge-pages", NULL)) opt_huge_weights = true;
        else { fprintf(stderr, "hyserve: generate: unknown option '%s' (see --help)\n", argv[i]); return 2; }
    }
    if (!prompt) {
        fprintf(stderr, "hyserve: generate: no prompt given (use -p TEXT)\n");
        return 2;
    }
    engine *e = open_engine(model, (int)threads, (int)ctx, ENGINE_DNET_AUTO);
    if (!e)
        return 1;
    const engine_info *info = engine_get_info(e);
    int rc = 1, seq = -1;
    int cap = info->n_ctx;
    int32_t *toks = malloc((size_t)cap * sizeof *toks);
    float *logits = malloc((size_t)info->n_vocab * sizeof *logits);
    sampler *smp = NULL;
    char *hold = malloc(256);
    size_t n_hold = 0;
    if (!toks || !logits || !hold)
        goto out;
    int n_prompt = engine_tokenize(e, prompt, strlen(prompt), true, true, toks, cap);
    if (n_prompt < 0) {
        fprintf(stderr, "hyserve: generate: could not tokenize the prompt\n");
        goto out;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "hyserve: generate: the prompt is empty\n");
        goto out;
    }
    if (n_prompt + n_predict > cap) {
        fprintf(stderr, "hyserve: generate: prompt (%d tokens) + %ld new tokens exceeds the context of %d (use -c)\n",
                n_prompt, n_predict, cap);
        goto out;
    }
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = (float)temp;
    sp.greedy = temp <= 0;
    sp.top_k = (int)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.repetition_penalty = (float)rep;
    sp.seed = (uint64_t)seed;
    smp = sampler_new(&sp, info->n_vocab);
    seq = engine_seq_new(e);
    if (!smp || seq < 0 || engine_seq_reserve(e, seq, n_prompt + (int)n_predict) != 0) {
        fprintf(stderr, "hyserve: generate: out of memory for the cache\n");
        goto out;
    }
    char err[256];
    double t0 = engine_now_s();
    engine_batch_item it = { .seq = seq, .tokens = toks, .n_tokens = n_prompt,
                             .logits = ENGINE_LOGITS_LAST, .out = logits };
    if (engine_forward(e, &it, 1, err, sizeof err) != 0) {
        fprintf(stderr, "hyserve: generate: %s\n", err);
        goto out;
    }
    double t1 = engine_now_s();
    int n_gen = 0;
    for (; n_gen < n_predict; n_gen++) {
        int32_t tok = sampler_sample(smp, logits, toks, n_prompt + n_gen, NULL);
        toks[n_prompt + n_gen] = tok;
        if (!ignore_eos && tok_is_eog(engine_tokenizer(e), tok))
            break;
        char piece[256];
        int np = tok_piece(engine_tokenizer(e), tok, piece, sizeof piece);
        if (np > 0) {
            if (np > (int)sizeof piece)
                np = (int)sizeof piece;
            if (n_hold + (size_t)np > 256)
                n_hold = 0;     /* cannot happen for valid UTF-8: 3 held bytes at most */
            memcpy(hold + n_hold, piece, (size_t)np);
            n_hold += (size_t)np;
            size_t ok = utf8_complete_prefix(hold, n_hold);
            fwrite(hold, 1, ok, stdout);
            fflush(stdout);
            memmove(hold, hold + ok, n_hold - ok);
            n_hold -= ok;
        }
        if (n_gen + 1 == n_predict)
            break;
        it = (engine_batch_item){ .seq = seq, .tokens = &toks[n_prompt + n_gen], .n_tokens = 1,
                                  .logits = ENGINE_LOGITS_LAST, .out = logits };
        if (engine_forward(e, &it, 1, err, sizeof err) != 0) {
            fprintf(stderr, "hyserve: generate: %s\n", err);
            goto out;
        }
    }
    if (n_gen < n_predict && n_gen >= 0 && n_hold)
        fwrite(hold, 1, n_hold, stdout);
    else if (n_hold)
        fwrite(hold, 1, n_hold, stdout);
    fflush(stdout);
    double t2 = engine_now_s();
    int n_out = n_gen + (n_gen < n_predict ? 1 : 0);
    fprintf(stderr, "\nprompt: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s)\n",
            n_prompt, t1 - t0, n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_out, t2 - t1,
            n_out > 1 ? (n_out - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0);
    rc = 0;
out:
    sampler_free(smp);
    engine_seq_free(e, seq);
    engine_close(e);
    free(toks);
    free(logits);
    free(hold);
    return rc;
}

/* ------------------------------------------------------------------ */
/* logits                                                              */

static const char logits_help[] =
    "usage: hyserve logits -m MODEL --tokens 1,2,3 [--all] [--mtp]\n"
    "  -m, --model FILE     GGUF model\n"
    "      --tokens LIST    comma-separated token ids\n"
    "  -p, --prompt TEXT    or: tokenize this text\n"
    "      --all            print logits after every token, not only the last\n"
    "      --dnet-mode M    auto | recurrent | chunked (DeltaNet prefill path)\n"
    "      --mla-mode M     auto | absorbed | expanded (MLA attention path)\n"
    "      --kv-dtype T     f32 | f16 | bf16 attention cache (default f32)\n"
    "      --state-dtype T  f32 | bf16 DeltaNet state between steps (default f32)\n"
    "      --huge-pages     read the weights into 2 MiB pages (default: the file mapping)\n"
    "      --split N        feed the tokens in pieces of N (exercises decode steps)\n"
    "      --mtp            the MTP block's logits instead (the file must have one): row i from the\n"
    "                       trunk's normed hidden state at i and token i+1, the MTP's distribution\n"
    "                       for token i+2; n-1 rows with --all, else the last (needs 2+ tokens)\n"
    "  -t, --threads N      threads\n"
    "Prints {\"tokens\": [...], \"logits\": [[...], ...]} with one row per position.\n";

int cli_logits(int argc, char **argv)
{
    const char *model = NULL, *list = NULL, *prompt = NULL;
    long threads = 0, split = 0;
    bool all = false;
    int mode = ENGINE_DNET_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (IS("-h", "--help")) { fputs(logits_help, stdout); return 0; }
        else if (IS("-m", "--model")) { if (!(model = NEXT())) return 2; }
        else if (IS("--tokens", NULL)) { if (!(list = NEXT())) return 2; }
        else if (IS("-p", "--prompt")) { if (!(prompt = NEXT())) return 2; }
        else if (IS("--all", NULL)) all = true;
        else if (IS("--mtp", NULL)) opt_mtp = true;
        else if (IS("--dnet-mode", NULL)) { if (!(v = NEXT()) || !parse_dnet_mode(v, &mode)) return 2; }
        else if (IS("--mla-mode", NULL)) { if (!(v = NEXT()) || !parse_mla_mode(v, &opt_mla_mode)) return 2; }
        else if (IS("--kv-dtype", NULL)) { if (!(v = NEXT()) || !parse_kv_dtype(v, &opt_kv_dtype)) return 2; }
        else if (IS("--state-dtype", NULL)) { if (!(v = NEXT()) || !parse_state_dtype(v, &opt_state_dtype)) return 2; }
        else if (IS("--huge-pages", NULL)) opt_huge_weights = true;
        else if (IS("--split", NULL)) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1 << 24, &split)) return 2; }
        else if (IS("-t", "--threads")) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1024, &threads)) return 2; }
        else { fprintf(stderr, "hyserve: logits: unknown option '%s' (see --help)\n", argv[i]); return 2; }
    }
    if (!list == !prompt) {
        fprintf(stderr, "hyserve: logits: give exactly one of --tokens LIST or -p TEXT\n");
        return 2;
    }
    engine *e = open_engine(model, (int)threads, 0, mode);
    if (!e)
        return opt_no_mtp_block ? 2 : 1;
    const engine_info *info = engine_get_info(e);
    int rc = 1, n = 0, seq = -1;
    int32_t *toks = malloc((size_t)info->n_ctx * sizeof *toks);
    float *out = NULL, *hid = NULL;
    if (!toks)
        goto out;
    if (list) {
        const char *p = list;
        while (*p) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= info->n_vocab) {
                fprintf(stderr, "hyserve: logits: bad token id near '%.20s' (vocabulary has %d tokens)\n",
                        p, info->n_vocab);
                goto out;
            }
            if (n >= info->n_ctx) {
                fprintf(stderr, "hyserve: logits: more tokens than the context of %d\n", info->n_ctx);
                goto out;
            }
            toks[n++] = (int32_t)v;
            p = end;
            if (*p == ',')
                p++;
            else if (*p) {
                fprintf(stderr, "hyserve: logits: --tokens must be comma-separated integers\n");
                goto out;
            }
        }
    } else {
        n = engine_tokenize(e, prompt, strlen(prompt), true, true, toks, info->n_ctx);
        if (n > info->n_ctx) {
            fprintf(stderr, "hyserve: logits: prompt is longer than the context of %d\n", info->n_ctx);
            goto out;
        }
    }
    if (n <= 0) {
        fprintf(stderr, "hyserve: logits: no tokens\n");
        goto out;
    }
    if (opt_mtp && n < 2) {
        fprintf(stderr, "hyserve: logits: --mtp needs at least 2 tokens (row i takes tokens i and i+1)\n");
        rc = 2;
        goto out;
    }
    out = malloc((size_t)(all ? n : 1) * (size_t)info->n_vocab * sizeof(float));
    hid = opt_mtp ? malloc((size_t)n * (size_t)info->n_embd * sizeof(float)) : NULL;
    seq = engine_seq_new(e);
    if (!out || seq < 0 || (opt_mtp && !hid)) {
        fprintf(stderr, "hyserve: logits: out of memory\n");
        goto out;
    }
    char err[256];
    int step = split > 0 ? (int)split : n;
    for (int s0 = 0; s0 < n; s0 += step) {
        int cnt = n - s0 < step ? n - s0 : step;
        bool last = s0 + cnt == n;
        engine_batch_item it = { .seq = seq, .tokens = toks + s0, .n_tokens = cnt,
                                 .logits = opt_mtp ? ENGINE_LOGITS_NONE
                                         : all ? ENGINE_LOGITS_ALL : last ? ENGINE_LOGITS_LAST : ENGINE_LOGITS_NONE,
                                 .out = all ? out + (size_t)s0 * info->n_vocab : out,
                                 .hidden = hid ? hid + (size_t)s0 * info->n_embd : NULL };
        if (engine_forward(e, &it, 1, err, sizeof err) != 0) {
            fprintf(stderr, "hyserve: logits: %s\n", err);
            goto out;
        }
    }
    if (opt_mtp) {
        /* MTP row i = (h_i, t_{i+1}), i = 0..n-2: with --all one row per
         * step (each row's logits), else in pieces of --split, the last
         * row's logits */
        const int mstep = all ? 1 : split > 0 ? (int)split : n - 1;
        for (int s0 = 0; s0 < n - 1; s0 += mstep) {
            const int cnt = n - 1 - s0 < mstep ? n - 1 - s0 : mstep;
            const bool last = s0 + cnt == n - 1;
            engine_mtp_item mi = { .seq = seq, .hidden = hid + (size_t)s0 * info->n_embd, .tokens = toks + s0 + 1,
                                   .n = cnt, .logits = all ? out + (size_t)s0 * info->n_vocab : last ? out : NULL };
            if (engine_mtp_step(e, &mi, 1, false, err, sizeof err) != 0) {
                fprintf(stderr, "hyserve: logits: %s\n", err);
                goto out;
            }
        }
    }
    printf("{\"tokens\": [");
    for (int i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", toks[i]);
    printf("], \"logits\": [");
    int rows = all ? n - (opt_mtp ? 1 : 0) : 1;
    for (int r = 0; r < rows; r++) {
        printf("%s[", r ? ", " : "");
        const float *row = out + (size_t)r * info->n_vocab;
        for (int v = 0; v < info->n_vocab; v++)
            printf("%s%.9g", v ? ", " : "", (double)row[v]);
        printf("]");
    }
    printf("]}\n");
    rc = 0;
out:
    engine_seq_free(e, seq);
    engine_close(e);
    free(toks);
    free(out);
    free(hid);
    return rc;
}

/* ------------------------------------------------------------------ */
/* info                                                                */

static const char info_help[] =
    "usage: hyserve info -m MODEL\n"
    "Prints the architecture, the layer layout (A = attention, L = DeltaNet),\n"
    "hyperparameters, weight dtypes with their bytes, parameter count and\n"
    "cache cost per token and per sequence.\n";

int cli_info(int argc, char **argv)
{
    const char *model = NULL;
    long threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (IS("-h", "--help")) { fputs(info_help, stdout); return 0; }
        else if (IS("-m", "--model")) { if (!(model = NEXT())) return 2; }
        else if (IS("-t", "--threads")) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1024, &threads)) return 2; }
        else { fprintf(stderr, "hyserve: info: unknown option '%s' (see --help)\n", argv[i]); return 2; }
    }
    engine *e = open_engine(model, (int)threads, 0, ENGINE_DNET_AUTO);
    if (!e)
        return 1;
    const engine_info *in = engine_get_info(e);
    /* the name serve answers to is the file's (as set_model_names in
     * server/serve.c): general.name is printed as what it is */
    const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    int nb = (int)strlen(base);
    if (nb > 5 && !strcmp(base + nb - 5, ".gguf"))
        nb -= 5;
    printf("model:         %.*s (the name `serve -m` answers to; --served-model-name sets others)\n", nb, base);
    printf("general.name:  %s\n", in->name);
    printf("architecture:  %s\n", in->arch);
    printf("layers:        %d (%d attention, %d DeltaNet, %d MLA", in->n_layer, in->n_attn_layers,
           in->n_dnet_layers, in->n_mla_layers);
    if (in->n_mamba2_layers || in->n_sconv_layers || in->n_mlp_layers || in->n_mamba_layers || in->n_kda_layers)
        printf(", %d Mamba-2, %d Mamba-1, %d KDA, %d short conv, %d MLP only", in->n_mamba2_layers,
               in->n_mamba_layers, in->n_kda_layers, in->n_sconv_layers, in->n_mlp_layers);
    printf(")\n");
    printf("layout:        ");
    for (int il = 0; il < in->n_layer; il++)
        putchar(engine_layer_letter(in->layer_kind[il]));
    printf("  (A attention, L DeltaNet, M MLA, S Mamba-2, B Mamba-1, K KDA, C short conv, F MLP only, H attention + Mamba-2)\n");
    printf("embedding:     %d, vocabulary %d, context (train) %d\n", in->n_embd, in->n_vocab,
           in->n_ctx_train);
    printf("attention:     %d query heads, %d KV heads, head dim %d, rotary dims %d\n",
           in->n_head, in->n_head_kv, in->head_dim, in->n_rot);
    printf("deltanet:      %d key heads x %d, %d value heads x %d, conv kernel %d\n", in->ssm_n_k,
           in->ssm_d_k, in->ssm_n_v, in->ssm_d_v, in->ssm_conv_kernel);
    if (in->n_mla_layers)
        printf("mla:           %d heads, kv_lora %d, rope %d, nope %d, v %d, q_lora %d\n", in->n_head,
               in->mla_kv_lora_rank, in->mla_rope_dim, in->mla_nope_dim, in->mla_v_dim,
               in->mla_q_lora_rank);
    if (in->n_expert)
        printf("experts:       %d routed, %d per token\n", in->n_expert, in->n_expert_used);
    printf("mlp:           %d\n", in->n_ff);
    if (in->n_nextn)
        printf("mtp:           %d block%s after the trunk (nextn_predict_layers); the first drafts for "
               "--spec-type draft-mtp\n", in->n_nextn, in->n_nextn > 1 ? "s" : "");
    printf("parameters:    %llu (%.2f M)\n", (unsigned long long)in->n_params, in->n_params / 1e6);
    printf("weights:       %llu bytes (%.2f MiB)\n", (unsigned long long)in->weight_bytes,
           in->weight_bytes / 1048576.0);
    if (in->weights_in_panels)
        printf("weight layout: %d BF16/F16/Q8_0 matrices repacked into 16-row panels (HYSERVE_PANELS=0: as stored)\n",
               in->weights_in_panels);
    /* bytes by tensor type and the type of each tensor group, straight from the file */
    char err[256];
    gguf_ctx *g = gguf_open(model, err, sizeof err);
    if (g) {
        uint64_t by_type[64] = { 0 }, n_by_type[64] = { 0 };
        for (uint64_t i = 0; i < g->n_tensors; i++)
            if (g->tensors[i].type < 64) {
                by_type[g->tensors[i].type] += g->tensors[i].n_bytes;
                n_by_type[g->tensors[i].type]++;
            }
        printf("weight bytes by type:\n");
        for (int t = 0; t < 64; t++)
            if (n_by_type[t])
                printf("  %-6s %5llu tensors %14llu bytes (%.2f MiB)\n", ggml_type_name((uint32_t)t),
                       (unsigned long long)n_by_type[t], (unsigned long long)by_type[t],
                       by_type[t] / 1048576.0);
        /* group = name without the "blk.N." prefix; count tensors per (group, type) */
        enum { MAXG = 128 };
        struct { char name[96]; uint32_t type; int n; uint64_t bytes; } grp[MAXG];
        int n_grp = 0;
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const char *nm = g->tensors[i].name;
            if (!strncmp(nm, "blk.", 4)) {
                const char *dot = strchr(nm + 4, '.');
                nm = dot ? dot + 1 : nm;
            }
            int k = 0;
            while (k < n_grp && (strcmp(grp[k].name, nm) || grp[k].type != g->tensors[i].type))
                k++;
            if (k == n_grp) {
                if (n_grp == MAXG)
                    continue;
                snprintf(grp[k].name, sizeof grp[k].name, "%s", nm);
                grp[k].type = g->tensors[i].type;
                grp[k].n = 0;
                grp[k].bytes = 0;
                n_grp++;
            }
            grp[k].n++;
            grp[k].bytes += g->tensors[i].n_bytes;
        }
        printf("quantization by tensor group:\n");
        for (int k = 0; k < n_grp; k++)
            printf("  %-32s %-6s x%-4d %14llu bytes\n", grp[k].name, ggml_type_name(grp[k].type), grp[k].n,
                   (unsigned long long)grp[k].bytes);
        gguf_close(g);
    }
    printf("kv cache:      %llu bytes per token GQA + %llu MLA (%s); MHA on every layer would be %llu\n",
           (unsigned long long)in->kv_bytes_per_token, (unsigned long long)in->mla_bytes_per_token,
           in->kv_dtype, (unsigned long long)in->mha_bytes_per_token);
    printf("deltanet state: %llu bytes recurrent (%s) + %llu bytes conv per sequence\n",
           (unsigned long long)in->dnet_state_bytes_per_seq, in->state_dtype,
           (unsigned long long)in->dnet_conv_bytes_per_seq);
    if (in->n_mamba2_layers)
        printf("mamba2 state:  %llu bytes recurrent (%s) + %llu bytes conv per sequence (%d heads x %d, state %d, "
               "%d groups)\n", (unsigned long long)in->mamba2_state_bytes_per_seq, in->state_dtype,
               (unsigned long long)in->mamba2_conv_bytes_per_seq, in->mamba2_heads, in->mamba2_head_dim,
               in->mamba2_d_state, in->mamba2_groups);
    if (in->n_sconv_layers)
        printf("short conv:    %llu bytes conv per sequence\n", (unsigned long long)in->sconv_bytes_per_seq);
    if (in->n_kda_layers)
        printf("kda state:     %llu bytes recurrent (%s) + %llu bytes conv per sequence (%d heads x %d)\n",
               (unsigned long long)in->kda_state_bytes_per_seq, in->state_dtype,
               (unsigned long long)in->kda_conv_bytes_per_seq, in->kda_heads, in->kda_head_dim);
    if (in->n_mamba_layers)
        printf("mamba1 state:  %llu bytes recurrent (%s) + %llu bytes conv per sequence (%d channels, state %d)\n",
               (unsigned long long)in->mamba_state_bytes_per_seq, in->state_dtype,
               (unsigned long long)in->mamba_conv_bytes_per_seq, in->mamba_d_inner, in->mamba_d_state);
    printf("chat template: %s\n", in->chat_template ? "present" : "none");
    engine_close(e);
    return 0;
}

/* ------------------------------------------------------------------ */
/* tensor                                                              */

static const char tensor_help[] =
    "usage: hyserve tensor -m MODEL --name TENSOR\n"
    "Prints {\"name\", \"type\", \"ne\", \"values\"}: the tensor dequantized to float32\n"
    "in memory order (%.9g, an exact float32 round trip). Without --name, lists tensors.\n";

int cli_tensor(int argc, char **argv)
{
    const char *model = NULL, *name = NULL;
    for (int i = 1; i < argc; i++) {
        if (IS("-h", "--help")) { fputs(tensor_help, stdout); return 0; }
        else if (IS("-m", "--model")) { if (!(model = NEXT())) return 2; }
        else if (IS("--name", NULL)) { if (!(name = NEXT())) return 2; }
        else { fprintf(stderr, "hyserve: tensor: unknown option '%s' (see --help)\n", argv[i]); return 2; }
    }
    if (!model) {
        fprintf(stderr, "hyserve: tensor: no model given (use -m MODEL.gguf)\n");
        return 2;
    }
    char err[512];
    gguf_ctx *g = gguf_open(model, err, sizeof err);
    if (!g) {
        fprintf(stderr, "hyserve: %s\n", err);
        return 1;
    }
    int rc = 1;
    if (!name) {
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const gguf_tensor *t = &g->tensors[i];
            printf("%-40s %-5s {%llu, %llu, %llu, %llu}\n", t->name, ggml_type_name(t->type),
                   (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                   (unsigned long long)t->ne[2], (unsigned long long)t->ne[3]);
        }
        rc = 0;
        goto out;
    }
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "hyserve: %s: no tensor named '%s'\n", model, name);
        goto out;
    }
    if (!engine_type_supported(t->type)) {
        fprintf(stderr, "hyserve: %s: tensor '%s' has type %s, which hyserve cannot decode\n", model,
                name, ggml_type_name(t->type));
        goto out;
    }
    const int n0 = (int)t->ne[0];
    const uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    const size_t row_bytes = (size_t)n0 / ggml_block_size(t->type) * ggml_type_size(t->type);
    float *row = malloc((size_t)n0 * sizeof *row);
    if (!row)
        goto out;
    printf("{\"name\": \"%s\", \"type\": \"%s\", \"ne\": [", t->name, ggml_type_name(t->type));
    for (uint32_t d = 0; d < t->n_dims; d++)
        printf("%s%llu", d ? ", " : "", (unsigned long long)t->ne[d]);
    printf("], \"values\": [");
    for (uint64_t r = 0; r < rows; r++) {
        engine_dequant_row(t->type, (const char *)t->data + r * row_bytes, row, n0);
        for (int i = 0; i < n0; i++)
            printf("%s%.9g", r || i ? ", " : "", (double)row[i]);
    }
    printf("]}\n");
    free(row);
    rc = 0;
out:
    gguf_close(g);
    return rc;
}

/* ------------------------------------------------------------------ */
/* synth                                                               */

static const char synth_help[] =
    "usage: hyserve synth -o OUT.gguf [options]\n"
    "  -o, --output FILE      where to write the model\n"
    "      --preset NAME      start from a preset's cache layout (config/presets/NAME.json or a\n"
    "                         JSON file): cache-sizing dims exact, small hidden/MLP/vocab;\n"
    "                         later options still apply\n"
    "      --arch A           qwen35 (default, hybrid), qwen35moe and qwen3next (hybrid + MoE), qwen3, llama,\n"
    "                         deepseek2 (dense, every layer MLA), granitehybrid (Mamba-2 + attention,\n"
    "                         MoE with --experts N, dense with --experts 0), nemotron_h (Mamba-2,\n"
    "                         attention and MLP-only layers), lfm2 (short conv + attention),\n"
    "                         falcon-h1 (attention + Mamba-2 in every layer), jamba (Mamba-1 +\n"
    "                         attention; MoE in every other layer with --experts N), kimi-linear\n"
    "                         (KDA + MLA without RoPE: heads --heads x --head-dim; MoE after one\n"
    "                         dense layer with --experts N, sigmoid router, a shared expert),\n"
    "                         nemotron_h_moe (nemotron_h with ReLU^2 experts in its MLP layers, a\n"
    "                         shared expert, --moe-latent), lfm2moe (lfm2 with SwiGLU experts after\n"
    "                         one dense layer, sigmoid router)\n"
    "      --seed S           weight seed (default 1)\n"
    "      --layers N         decoder layers (default 4)\n"
    "      --attn-every K     attention every Kth layer, the rest DeltaNet (default 4)\n"
    "      --pattern P        explicit layout, e.g. LLLA or LLLM (A attention, L DeltaNet,\n"
    "                         M multi-head latent attention, S Mamba-2, B Mamba-1, C short conv,\n"
    "                         K KDA,\n"
    "                         F MLP only, H attention + Mamba-2 in one layer),\n"
    "                         repeated to --layers\n"
    "      --ssm-heads N      Mamba-2 heads (default 4)\n"
    "      --ssm-head-dim D   Mamba-2 head dim (default 16)\n"
    "      --ssm-state N      Mamba-2 state size (default 16)\n"
    "      --ssm-groups G     Mamba-2 B/C groups, a power of two (default 2)\n"
    "      --ssm-dt-rank R    Mamba-1 (jamba) dt rank (default 8); d_inner is 2 x embd, state --ssm-state\n"
    "      --moe-latent N     nemotron_h_moe: the experts' latent width (default 0: none)\n"
    "      --embd D           hidden size (default 64)\n"
    "      --heads H          attention query heads (default 4)\n"
    "      --kv-heads H       attention KV heads (default 2)\n"
    "      --head-dim D       attention head dim (default 16)\n"
    "      --rope-dim R       rotary dims (default head-dim / 2)\n"
    "      --dnet-k-heads N   DeltaNet key heads (default 2)\n"
    "      --dnet-v-heads N   DeltaNet value heads (default = key heads)\n"
    "      --dnet-k-dim D     DeltaNet key head dim (default 16)\n"
    "      --dnet-v-dim D     DeltaNet value head dim (default = key dim)\n"
    "      --conv-kernel K    DeltaNet conv kernel (default 4)\n"
    "      --ff N             MLP size (default 128)\n"
    "      --vocab N          vocabulary; 256 = bytes only; >= 259 adds special tokens\n"
    "      --ctx N            training context written to the file (default 4096)\n"
    "      --tied | --untied  LM head tied to the embedding (default tied)\n"
    "      --dtype T          f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q5_k | q6_k for the 2-D\n"
    "                         weights (default f32); quantized widths must be block multiples;\n"
    "                         q4_k_m | q5_k_m: llama-quantize's mixes (Q6_K output, attn_v and\n"
    "                         ffn_down in its \"more bits\" layers; Q5_K/Q6_K attn_qkv)\n"
    "      --experts N        routed experts (default 8; qwen35moe, qwen3next, granitehybrid, jamba,\n"
    "                         kimi-linear, nemotron_h_moe, lfm2moe)\n"
    "      --experts-used K   experts per token (default 2)\n"
    "      --expert-ff N      expert MLP size (default 32; jamba's experts are --ff wide)\n"
    "      --shared-ff N      shared expert MLP size (default 32)\n"
    "      --mla-kv-lora R    MLA latent rank (default 32); heads = --heads\n"
    "      --mla-q-lora N     MLA query compression rank, 0 = none (default 0)\n"
    "      --mla-nope D       MLA no-RoPE key dims per head (default 16)\n"
    "      --mla-rope D       MLA decoupled RoPE dims (default 8)\n"
    "      --mla-vdim D       MLA value dims per head (default 16)\n"
    "      --mtp N            qwen35/qwen35moe: N MTP (nextn) blocks after the trunk, as llama.cpp's\n"
    "                         converter writes them (nextn_predict_layers N); default 0: none\n"
    "      --mtp-copy         (tests) the MTP blocks draft a repeat of the last token: eh_proj passes the\n"
    "                         normed embedding through, attention and FFN outputs are zero (qwen35)\n"
    "      --mtp-own-head     the MTP blocks carry nextn.embed_tokens and nextn.shared_head_head\n"
    "                         (default: absent, the trunk's embedding and LM head serve)\n"
    "      --chat-template chatml  add a ChatML template (needs vocab >= 259)\n"
    "      --name NAME        general.name\n";

int cli_synth(int argc, char **argv)
{
    synth_config c;
    synth_config_default(&c);
    const char *out = NULL;
    long v_l;
    bool rope_set = false, nv_set = false, dv_set = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
#define INTOPT(name, field, lo, hi)                                                          \
        else if (IS(name, NULL)) {                                                           \
            if (!(v = NEXT()) || !cli_int(name, v, lo, hi, &v_l)) return 2;                  \
            c.field = (int)v_l;                                                              \
        }
        if (IS("-h", "--help")) { fputs(synth_help, stdout); return 0; }
        else if (IS("-o", "--output")) { if (!(out = NEXT())) return 2; }
        else if (IS("--seed", NULL)) {
            if (!(v = NEXT()) || !cli_int("--seed", v, 0, 0x7fffffffffffffffL, &v_l)) return 2;
            c.seed = (uint64_t)v_l;
        }
        INTOPT("--layers", n_layer, 1, 256)
        INTOPT("--attn-every", attn_every, 1, 256)
        INTOPT("--embd", n_embd, 1, 65536)
        INTOPT("--heads", n_head, 1, 1024)
        INTOPT("--kv-heads", n_head_kv, 1, 1024)
        INTOPT("--head-dim", head_dim, 2, 4096)
        INTOPT("--dnet-k-heads", dnet_n_k, 1, 1024)
        INTOPT("--dnet-k-dim", dnet_d_k, 1, 4096)
        INTOPT("--conv-kernel", conv_kernel, 2, 16)
        INTOPT("--ff", n_ff, 1, 1 << 20)
        INTOPT("--vocab", n_vocab, 256, 1 << 22)
        INTOPT("--ctx", n_ctx, 1, 1 << 24)
        INTOPT("--experts", n_expert, 0, 4096)
        INTOPT("--ssm-heads", m2_heads, 1, 4096)
        INTOPT("--ssm-head-dim", m2_head_dim, 1, 4096)
        INTOPT("--ssm-state", m2_d_state, 1, 4096)
        INTOPT("--ssm-groups", m2_groups, 1, 1024)
        INTOPT("--ssm-dt-rank", m1_dt_rank, 1, 65536)
        INTOPT("--moe-latent", moe_latent, 0, 1 << 20)
        INTOPT("--experts-used", n_expert_used, 1, 64)
        INTOPT("--expert-ff", n_ff_exp, 1, 1 << 20)
        INTOPT("--shared-ff", n_ff_shexp, 1, 1 << 20)
        INTOPT("--mla-kv-lora", mla_kv_lora, 1, 1 << 16)
        INTOPT("--mla-q-lora", mla_q_lora, 0, 1 << 16)
        INTOPT("--mla-nope", mla_nope, 1, 4096)
        INTOPT("--mla-rope", mla_rope, 2, 4096)
        INTOPT("--mla-vdim", mla_v, 1, 4096)
        INTOPT("--mtp", n_mtp, 0, 4)
        else if (IS("--mtp-own-head", NULL)) c.mtp_own_head = 1;
        else if (IS("--mtp-copy", NULL)) c.mtp_copy = 1;
        else if (IS("--preset", NULL)) {
            /* a preset's (or layout JSON's) cache layout with small weights */
            memplan_layout l;
            char err[512];
            if (!(v = NEXT())) return 2;
            if (preset_load(v, &l, err, sizeof err) != 0 || synth_from_layout(&l, &c, err, sizeof err) != 0) {
                fprintf(stderr, "hyserve: synth: %s\n", err);
                return 2;
            }
            rope_set = nv_set = dv_set = true;  /* the preset fixed them */
        }
        else if (IS("--arch", NULL)) {
            if (!(v = NEXT())) return 2;
            snprintf(c.arch, sizeof c.arch, "%s", v);
        }
        else if (IS("--rope-dim", NULL)) {
            if (!(v = NEXT()) || !cli_int("--rope-dim", v, 0, 4096, &v_l)) return 2;
            c.n_rot = (int)v_l;
            rope_set = true;
        } else if (IS("--dnet-v-heads", NULL)) {
            if (!(v = NEXT()) || !cli_int("--dnet-v-heads", v, 1, 1024, &v_l)) return 2;
            c.dnet_n_v = (int)v_l;
            nv_set = true;
        } else if (IS("--dnet-v-dim", NULL)) {
            if (!(v = NEXT()) || !cli_int("--dnet-v-dim", v, 1, 4096, &v_l)) return 2;
            c.dnet_d_v = (int)v_l;
            dv_set = true;
        } else if (IS("--pattern", NULL)) {
            if (!(v = NEXT())) return 2;
            if (strlen(v) >= sizeof c.pattern || !*v) {
                fprintf(stderr, "hyserve: synth: --pattern must have 1 to %zu letters\n", sizeof c.pattern - 1);
                return 2;
            }
            snprintf(c.pattern, sizeof c.pattern, "%s", v);
        } else if (IS("--tied", NULL)) c.tied = 1;
        else if (IS("--untied", NULL)) c.tied = 0;
        else if (IS("--dtype", NULL)) {
            if (!(v = NEXT())) return 2;
            if (!strcmp(v, "f32")) c.dtype = GGML_F32;
            else if (!strcmp(v, "f16")) c.dtype = GGML_F16;
            else if (!strcmp(v, "bf16")) c.dtype = GGML_BF16;
            else if (!strcmp(v, "q8_0")) c.dtype = GGML_Q8_0;
            else if (!strcmp(v, "q4_0")) c.dtype = GGML_Q4_0;
            else if (!strcmp(v, "q4_k")) c.dtype = GGML_Q4_K;
            else if (!strcmp(v, "q5_k")) c.dtype = GGML_Q5_K;
            else if (!strcmp(v, "q6_k")) c.dtype = GGML_Q6_K;
            else if (!strcmp(v, "q4_k_m")) c.dtype = GGML_Q4_K;
            else if (!strcmp(v, "q5_k_m")) c.dtype = GGML_Q5_K;
            else { fprintf(stderr, "hyserve: synth: --dtype must be f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m, got '%s'\n", v); return 2; }
            c.mix = !strcmp(v, "q4_k_m") || !strcmp(v, "q5_k_m") ? SYNTH_MIX_K_M : SYNTH_MIX_NONE;
        } else if (IS("--chat-template", NULL)) {
            if (!(v = NEXT())) return 2;
            if (strcmp(v, "chatml")) { fprintf(stderr, "hyserve: synth: only --chat-template chatml is known\n"); return 2; }
            c.chat_template = 1;
        } else if (IS("--name", NULL)) {
            if (!(v = NEXT())) return 2;
            snprintf(c.name, sizeof c.name, "%s", v);
        } else {
            fprintf(stderr, "hyserve: synth: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
#undef INTOPT
    }
    if (!out) {
        fprintf(stderr, "hyserve: synth: no output file (use -o OUT.gguf)\n");
        return 2;
    }
    if (!rope_set)
        c.n_rot = c.head_dim / 2 - (c.head_dim / 2) % 2;
    if (!nv_set)
        c.dnet_n_v = c.dnet_n_k;
    if (!dv_set)
        c.dnet_d_v = c.dnet_d_k;
    if (c.chat_template && c.n_vocab < 259)
        c.n_vocab = 259;
    char err[256];
    if (synth_write(&c, out, err, sizeof err) != 0) {
        fprintf(stderr, "hyserve: %s\n", err);
        return 1;
    }
    return 0;
}

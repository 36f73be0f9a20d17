/* cli_perplexity.c - `hyserve perplexity -m MODEL -f TEXT [--ctx N] [--stride S]`.
 *
 * Owns: scoring a text file with the model through engine.h only
 * (engine_open, engine_tokenize, engine_seq_new, engine_forward with
 * ENGINE_LOGITS_ALL, engine_seq_free), and printing perplexity and bits per
 * byte.
 * Does not: sample, cache across windows, or change any engine state other
 * than its own short-lived sequences.
 *
 * ref: the definition below is shared, word for word, with
 * tools/train/evaluate.py (the PyTorch evaluation of the training tool); the
 * two must agree on the same file. Like llama.cpp's llama-perplexity, the
 * text is scored in fixed-size windows; unlike it, windows overlap by
 * ctx - stride tokens so every token is scored once, each with at least
 * ctx - stride tokens of context (the Hugging Face "strided" scheme):
 *
 *   t  = tokenize(text) without special-token parsing, n tokens
 *   u  = [s] + t, L = n + 1; s = the model's BOS id, else its EOS id (the
 *        document separator); s is context only, never scored. A model with
 *        neither is refused.
 *   window k = u[b_k, e_k), b_k = k * stride, e_k = min(b_k + ctx, L), run as
 *        a fresh sequence (positions from 0); the last window is the first
 *        with e_k = L.
 *   window k scores targets u[j] for j in [max(b_k + 1, e_{k-1}), e_k)
 *        (e_{-1} = 0) with -log softmax(logits at j - 1)[u[j]].
 *   perplexity    = exp(NLL / n), NLL = the summed natural-log loss
 *   bits per byte = NLL / ln 2 / (bytes of the file, i.e. of its UTF-8 text)
 *
 * Needs 2 <= ctx and 1 <= stride <= ctx - 1; defaults ctx 512, stride ctx/2.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_perplexity.h"
#include "engine.h"

static const char perplexity_help[] =
    "usage: hyserve perplexity -m MODEL -f TEXT [options]\n"
    "  -m, --model FILE     GGUF model\n"
    "  -f, --file FILE      text file to score (UTF-8)\n"
    "  -c, --ctx N          window length in tokens (default 512)\n"
    "      --stride S       tokens between window starts, 1 .. ctx-1 (default ctx/2);\n"
    "                       each window scores only tokens no earlier window scored\n"
    "  -t, --threads N      threads (default: all cores)\n"
    "The text is tokenized without parsing special tokens and preceded by the\n"
    "model's BOS (or EOS) token as unscored context. Prints the token count,\n"
    "the mean loss, perplexity = exp(mean loss) and bits per byte =\n"
    "summed loss / ln 2 / file bytes.\n";

/* Whole file into a NUL-terminated buffer; *len gets its size. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (!f) {
        fprintf(stderr, "hyserve: perplexity: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                fprintf(stderr, "hyserve: perplexity: out of memory reading %s\n", path);
                goto out_fail;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        fprintf(stderr, "hyserve: perplexity: error reading %s\n", path);
        goto out_fail;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
out_fail:
    fclose(f);
    free(buf);
    return NULL;
}

/* -log softmax(row)[target], in double.
 * ref: log p = x[t] - max - log(sum_v exp(x[v] - max)) */
static double token_nll(const float *restrict row, int n_vocab, int target)
{
    double mx = row[0];
    for (int v = 1; v < n_vocab; v++)
        if (row[v] > mx)
            mx = row[v];
    double sum = 0.0;
    for (int v = 0; v < n_vocab; v++)
        sum += exp((double)row[v] - mx);
    return -((double)row[target] - mx - log(sum));
}

#define NEXT()                                                                        \
    (i + 1 < argc ? argv[++i]                                                          \
                  : (fprintf(stderr, "hyserve: option %s needs a value\n", argv[i]), (char *)NULL))

static bool is_opt(const char *arg, const char *a, const char *b)
{
    return !strcmp(arg, a) || (b && !strcmp(arg, b));
}
#define IS(a, b) is_opt(argv[i], a, b)

int cli_perplexity(int argc, char **argv)
{
    const char *model = NULL, *path = NULL;
    long ctx = 512, stride = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (IS("-h", "--help")) { fputs(perplexity_help, stdout); return 0; }
        else if (IS("-m", "--model")) { if (!(model = NEXT())) return 2; }
        else if (IS("-f", "--file")) { if (!(path = NEXT())) return 2; }
        else if (IS("-c", "--ctx")) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 2, 1 << 20, &ctx)) return 2; }
        else if (IS("--stride", NULL)) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 1, 1 << 20, &stride)) return 2; }
        else if (IS("-t", "--threads")) { if (!(v = NEXT()) || !cli_int(argv[i - 1], v, 0, 1024, &threads)) return 2; }
        else { fprintf(stderr, "hyserve: perplexity: unknown option '%s' (see --help)\n", argv[i]); return 2; }
    }
    if (!model || !path) {
        fprintf(stderr, "hyserve: perplexity: need -m MODEL and -f TEXT (see --help)\n");
        return 2;
    }
    if (stride == 0)
        stride = ctx / 2;
    if (stride >= ctx) {
        fprintf(stderr, "hyserve: perplexity: --stride must be less than --ctx (%ld)\n", ctx);
        return 2;
    }

    int rc = 1, seq = -1;
    size_t n_bytes = 0;
    int32_t *u = NULL;
    float *logits = NULL;
    engine *e = NULL;
    char *text = read_file(path, &n_bytes);
    if (!text)
        return 1;
    if (n_bytes == 0) {
        fprintf(stderr, "hyserve: perplexity: %s is empty\n", path);
        goto out;
    }

    engine_params p;
    engine_params_default(&p);
    p.model_path = model;
    p.n_threads = (int)threads;
    p.n_ctx = (int)ctx;
    p.max_seqs = 1;
    char err[512];
    e = engine_open(&p, err, sizeof err);
    if (!e) {
        fprintf(stderr, "hyserve: %s\n", err);
        goto out;
    }
    const engine_info *info = engine_get_info(e);
    if (info->n_ctx < ctx) {
        fprintf(stderr, "hyserve: perplexity: the engine allows %d tokens per sequence, less than --ctx %ld\n",
                info->n_ctx, ctx);
        goto out;
    }
    int32_t start = info->bos_id >= 0 ? info->bos_id : info->eos_id;
    if (start < 0) {
        fprintf(stderr, "hyserve: perplexity: the model has neither a BOS nor an EOS token to start from\n");
        goto out;
    }

    /* byte-level BPE: at most one token per byte */
    if (n_bytes > (size_t)(1 << 30)) {
        fprintf(stderr, "hyserve: perplexity: %s is too large\n", path);
        goto out;
    }
    u = malloc((n_bytes + 1) * sizeof *u);
    logits = malloc((size_t)ctx * (size_t)info->n_vocab * sizeof *logits);
    if (!u || !logits) {
        fprintf(stderr, "hyserve: perplexity: out of memory\n");
        goto out;
    }
    u[0] = start;
    int n = engine_tokenize(e, text, n_bytes, false, false, u + 1, (int)n_bytes);
    if (n < 0 || n > (int)n_bytes) {
        fprintf(stderr, "hyserve: perplexity: could not tokenize %s\n", path);
        goto out;
    }
    if (n == 0) {
        fprintf(stderr, "hyserve: perplexity: %s has no tokens\n", path);
        goto out;
    }
    const long L = n + 1;
    const long n_windows = L <= ctx ? 1 : 1 + (L - ctx + stride - 1) / stride;

    double nll = 0.0, t0 = engine_now_s();
    long n_scored = 0, prev_e = 0, n_fed = 0;
    for (long k = 0; k < n_windows; k++) {
        long b = k * stride;
        long end = b + ctx < L ? b + ctx : L;
        long j0 = b + 1 > prev_e ? b + 1 : prev_e;
        seq = engine_seq_new(e);
        if (seq < 0 || engine_seq_reserve(e, seq, (int)(end - b)) != 0) {
            fprintf(stderr, "hyserve: perplexity: out of cache memory for a %ld-token window\n", end - b);
            goto out;
        }
        engine_batch_item it = { .seq = seq, .tokens = u + b, .n_tokens = (int)(end - b),
                                 .logits = ENGINE_LOGITS_ALL, .out = logits };
        if (engine_forward(e, &it, 1, err, sizeof err) != 0) {
            fprintf(stderr, "hyserve: perplexity: %s\n", err);
            goto out;
        }
        engine_seq_free(e, seq);
        seq = -1;
        n_fed += end - b;
        /* target u[j] is predicted by the logits row at window position j - 1 - b */
        for (long j = j0; j < end; j++)
            nll += token_nll(logits + (size_t)(j - 1 - b) * info->n_vocab, info->n_vocab, u[j]);
        n_scored += end - j0;
        prev_e = end;
        if (k + 1 == n_windows || (k + 1) % 16 == 0)
            fprintf(stderr, "\rhyserve: perplexity: window %ld/%ld, running perplexity %.4f", k + 1,
                    n_windows, exp(nll / (double)n_scored));
    }
    double dt = engine_now_s() - t0;
    fprintf(stderr, "\nhyserve: perplexity: %ld tokens through the model in %.2f s (%.1f tok/s)\n", n_fed, dt,
            n_fed / (dt > 0 ? dt : 1e-9));
    if (n_scored != n) {
        fprintf(stderr, "hyserve: perplexity: internal error: scored %ld of %d tokens\n", n_scored, n);
        goto out;
    }
    printf("tokens: %d  windows: %ld  ctx: %ld  stride: %ld  bytes: %zu\n", n, n_windows, ctx, stride,
           n_bytes);
    printf("nll: %.6f nats/token\n", nll / n);
    printf("perplexity: %.4f\n", exp(nll / n));
    printf("bits per byte: %.4f\n", nll / log(2.0) / (double)n_bytes);
    rc = 0;
out:
    if (e)
        engine_seq_free(e, seq);
    engine_close(e);
    free(logits);
    free(u);
    free(text);
    return rc;
}

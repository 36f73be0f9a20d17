/* grammar_bench.c - `hyserve-grammar-bench TOKENIZER.gguf`: what structured
 * output costs per token at a real vocabulary (make bench's "grammar"
 * section).
 *
 * Measures, on the converted Qwen3 tokenizer (151936 tokens; the tests'
 * tests/tmp/qwen3-tokenizer.gguf): building the vocabulary trie; compiling
 * a 50-property schema and a nested one; and per generated token, the
 * sampler alone (temperature 1 over random logits) against mask + sampler
 * + matcher advance under the nested schema, over whole requests (each
 * request starts with a cold mask cache, as on the server). The logits are
 * seeded random numbers, not a model's: the grammar's cost does not depend
 * on where they come from, and report.py divides it into the engine
 * section's measured decode time per token for the constrained vs
 * unconstrained tokens/s. The same requests again through a gram_cache
 * ("shared"): the first warms it, the others find the grammar and its
 * masks as a server's later requests of one schema do.
 * Prints one JSON object.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "grammar.h"
#include "sampler.h"
#include "tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* quantile q of x[0..n) (sorts x) */
static double quant(double *x, int n, double q)
{
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return n ? x[(int)(q * (n - 1) + 0.5)] : 0.0;
}

static int piece_fn(const void *ctx, int32_t id, char *buf, size_t cap, int *kind)
{
    const tokenizer *t = ctx;
    *kind = tok_is_eog(t, id) ? GRAM_TOK_EOG : tok_is_control(t, id) ? GRAM_TOK_OTHER : GRAM_TOK_TEXT;
    return tok_piece(t, id, buf, cap);
}

static const char nested[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"integer\",\"minimum\":1},"
    "\"name\":{\"type\":\"string\"},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"city\",\"zip\"],"
    "\"additionalProperties\":false},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5},"
    "\"scores\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}},"
    "\"kind\":{\"enum\":[\"person\",\"company\"]},"
    "\"active\":{\"type\":\"boolean\"}},"
    "\"required\":[\"id\",\"name\",\"address\",\"tags\",\"scores\",\"kind\",\"active\"],\"additionalProperties\":false}";

static char *fifty_props(void)
{
    static const char *const kinds[] = {
        "{\"type\":\"string\"}", "{\"type\":\"integer\",\"minimum\":0,\"maximum\":999}", "{\"type\":\"number\"}",
        "{\"type\":\"boolean\"}", "{\"enum\":[\"a\",\"b\",\"c\"]}", "{\"type\":\"string\",\"format\":\"date-time\"}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":4}",
        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},\"required\":[\"x\"]}",
        "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,6}$\"}", "{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"string\"}]}",
    };
    char *s = malloc(1 << 16);
    if (!s)
        return NULL;
    size_t n = (size_t)sprintf(s, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 50; i++)
        n += (size_t)sprintf(s + n, "%s\"property_%02d\":%s", i ? "," : "", i, kinds[i % 10]);
    n += (size_t)sprintf(s + n, "},\"required\":[");
    for (int i = 0; i < 50; i++)
        n += (size_t)sprintf(s + n, "%s\"property_%02d\"", i ? "," : "", i);
    sprintf(s + n, "],\"additionalProperties\":false}");
    return s;
}

static double compile_ms(const char *src, int reps, char *err, size_t errlen)
{
    double *t = malloc((size_t)reps * sizeof *t);
    double r = -1;
    for (int i = 0; t && i < reps; i++) {
        double t0 = now_s();
        grammar *g = grammar_compile_json_schema(src, strlen(src), NULL, err, errlen);
        t[i] = 1e3 * (now_s() - t0);
        if (!g)
            goto out;
        grammar_free(g);
    }
    r = t ? quant(t, reps, 0.5) : -1;
out:
    free(t);
    return r;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float randn(void)
{
    /* Box-Muller over xorshift64* */
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        u[i] = ((rng * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
    }
    return (float)(sqrt(-2.0 * log(u[0] + 1e-300)) * cos(6.283185307179586 * u[1]));
}

/* What run_requests measured. */
typedef struct req_stats {
    int n_req, n_done, n;           /* requests, those that ended, tokens */
    double sampler_ms, con_ms;      /* per token: the sampler alone; mask + sampler + advance */
    double mask_p50, mask_p99, mask_max, first_ms;
    double grammar_ms_later;        /* grammar ms per token over requests 2.. */
    int walks_later;                /* trie walks by requests 2.. */
} req_stats;

static const char *g_nested_src = nested;

static grammar *compile_nested(void *ctx, char *err, size_t errlen)
{
    (void)ctx;
    return grammar_compile_json_schema(g_nested_src, strlen(g_nested_src), NULL, err, errlen);
}

/* n_req whole requests under the nested schema with seeded random logits;
 * gc NULL: each matcher private (a cold mask cache), else from gc. */
static int run_requests(const tokenizer *tk, const gram_vocab *v, gram_cache *gc, int n_req, req_stats *out)
{
    int n_vocab = tok_n_vocab(tk), max_tok = 256, cap = n_req * max_tok;
    char err[256];
    float *base = malloc((size_t)n_vocab * sizeof *base), *work = malloc((size_t)n_vocab * sizeof *work);
    double *t_mask = malloc((size_t)cap * sizeof *t_mask);
    if (!base || !work || !t_mask)
        return 1;
    sampler_params sp;
    sampler_params_default(&sp);
    int n = 0, n_done = 0, n_first = 0, n_later = 0;
    double first_ms = 0, sum_free = 0, sum_con = 0, later_ms = 0;
    memset(out, 0, sizeof *out);
    rng = 0x9E3779B97F4A7C15ull;
    for (int q = 0; q < n_req; q++) {
        sp.seed = (uint64_t)q + 1;
        sampler *s_free = sampler_new(&sp, n_vocab), *s_con = sampler_new(&sp, n_vocab);
        gram_matcher *m = gc ? gram_matcher_new_shared(gram_cache_acquire(gc, nested, strlen(nested), compile_nested,
                                                                           NULL, err, sizeof err))
                             : gram_matcher_new(compile_nested(NULL, err, sizeof err), v);
        if (!s_free || !s_con || !m)
            return 1;
        for (int k = 0; k < max_tok; k++) {
            for (int i = 0; i < n_vocab; i++)
                base[i] = 2.0f * randn();
            memcpy(work, base, (size_t)n_vocab * sizeof *work);
            double a = now_s();
            (void)sampler_sample(s_free, work, NULL, 0, NULL);
            double b = now_s();
            memcpy(work, base, (size_t)n_vocab * sizeof *work);
            double c = now_s();
            int allowed = gram_matcher_mask(m, work);
            double d = now_s();
            int32_t tok = sampler_sample(s_con, work, NULL, 0, NULL);
            int arc = allowed > 0 ? gram_matcher_accept_token(m, tok) : -1;
            double e = now_s();
            if (arc) {
                fprintf(stderr, "grammar bench: the matcher refused its own token\n");
                return 1;
            }
            t_mask[n] = 1e3 * (d - c);
            sum_free += 1e3 * (b - a);
            sum_con += 1e3 * (e - c);
            if (q > 0) {
                later_ms += 1e3 * ((e - c) - (b - a));
                n_later++;
            }
            if (k == 0) {
                first_ms += t_mask[n];
                n_first++;
            }
            n++;
            if (tok_is_eog(tk, tok) || gram_matcher_finished(m)) {
                n_done++;
                break;
            }
        }
        if (q > 0)
            out->walks_later += gram_matcher_walks(m);
        sampler_free(s_free);
        sampler_free(s_con);
        gram_matcher_free(m);
    }
    out->n_req = n_req;
    out->n_done = n_done;
    out->n = n;
    out->sampler_ms = sum_free / n;
    out->con_ms = sum_con / n;
    out->grammar_ms_later = n_later ? later_ms / n_later : 0;
    out->first_ms = first_ms / (n_first ? n_first : 1);
    out->mask_p50 = quant(t_mask, n, 0.5);
    out->mask_p99 = quant(t_mask, n, 0.99);
    out->mask_max = quant(t_mask, n, 1.0);
    free(base);
    free(work);
    free(t_mask);
    return 0;
}

int main(int argc, char **argv)
{
    bool quick = argc > 2 && !strcmp(argv[2], "--quick");
    if (argc < 2) {
        fprintf(stderr, "usage: hyserve-grammar-bench TOKENIZER.gguf [--quick]\n");
        return 2;
    }
    char err[256];
    gguf_ctx *gg = gguf_open(argv[1], err, sizeof err);
    tokenizer *tk = gg ? tok_new_from_gguf(gg, err, sizeof err) : NULL;
    gguf_close(gg);
    if (!tk) {
        fprintf(stderr, "grammar bench: %s\n", err);
        return 1;
    }
    int n_vocab = tok_n_vocab(tk);
    double t0 = now_s();
    gram_vocab *v = gram_vocab_new(n_vocab, piece_fn, tk, err, sizeof err);
    double vocab_ms = 1e3 * (now_s() - t0);
    char *fifty = fifty_props();
    if (!v || !fifty) {
        fprintf(stderr, "grammar bench: %s\n", v ? "out of memory" : err);
        return 1;
    }
    double c50 = compile_ms(fifty, quick ? 5 : 21, err, sizeof err);
    double cnested = compile_ms(nested, quick ? 5 : 21, err, sizeof err);
    if (c50 < 0 || cnested < 0) {
        fprintf(stderr, "grammar bench: %s\n", err);
        return 1;
    }

    /* whole requests under the nested schema: each with a cold mask cache
     * (a private matcher), then through a gram_cache as the server runs
     * them (request 1 warms it, the others find its grammar and masks) */
    gram_cache *gc = gram_cache_new(v, (size_t)64 << 20, err, sizeof err);
    if (!gc) {
        fprintf(stderr, "grammar bench: %s\n", err);
        return 1;
    }
    req_stats cold, warm;
    if (run_requests(tk, v, NULL, quick ? 4 : 16, &cold) || run_requests(tk, v, gc, quick ? 4 : 16, &warm))
        return 1;
    gram_cache_stats cs;
    gram_cache_get_stats(gc, &cs);
    printf("{\"n_vocab\": %d, \"trie_nodes\": %d, \"vocab_build_ms\": %.1f, \"compile_ms_50_properties\": %.3f, "
           "\"compile_ms_nested\": %.3f, \"requests\": %d, \"requests_complete\": %d, \"tokens\": %d, "
           "\"sampler_ms_per_token\": %.4f, \"constrained_ms_per_token\": %.4f, \"grammar_ms_per_token\": %.4f, "
           "\"mask_ms_p50\": %.4f, \"mask_ms_p99\": %.4f, \"mask_ms_max\": %.3f, \"first_mask_ms_mean\": %.3f, "
           "\"shared\": {\"requests\": %d, \"tokens\": %d, \"grammar_ms_per_token\": %.4f, "
           "\"grammar_ms_per_token_after_first\": %.4f, \"mask_ms_p50\": %.4f, \"mask_ms_p99\": %.4f, "
           "\"mask_ms_max\": %.3f, \"walks\": %llu, \"walks_after_first\": %d, \"cache_bytes\": %llu, "
           "\"cache_entries\": %d}}\n",
           n_vocab, gram_vocab_n_nodes(v), vocab_ms, c50, cnested, cold.n_req, cold.n_done, cold.n, cold.sampler_ms,
           cold.con_ms, cold.con_ms - cold.sampler_ms, cold.mask_p50, cold.mask_p99, cold.mask_max, cold.first_ms,
           warm.n_req, warm.n, warm.con_ms - warm.sampler_ms, warm.grammar_ms_later, warm.mask_p50, warm.mask_p99,
           warm.mask_max, (unsigned long long)cs.walks, warm.walks_later, (unsigned long long)cs.bytes, cs.entries);
    gram_cache_free(gc);
    free(fifty);
    gram_vocab_free(v);
    tok_free(tk);
    return 0;
}

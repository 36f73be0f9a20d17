/* bench.c - the engine benchmark: machine limits and engine figures.
 *
 * Owns: measuring, in one process, (a) this machine's limits - STREAM-style
 * triad bandwidth over arrays much larger than the last-level cache, sgemv
 * bandwidth and OpenBLAS sgemm throughput at the model's projection shapes,
 * at 1 and 2 threads - and (b) the engine on a synthesized model: prefill
 * and decode tokens/s, batched decode, and the DeltaNet chunked vs recurrent
 * kernels. Each subcommand writes one JSON object; bench/run.sh merges them
 * into bench/results/latest.json and renders latest.md (bench/report.py).
 * Does not own: the ratios to the limits (report.py computes them from the
 * JSON, so the arithmetic is in one place) or the HTTP figures (serve.c).
 *
 * Statistics: every figure is measured after a warm-up run, repeated, and
 * reported as median, min and max of the repetitions (rates are derived
 * from times: rate_median = work / time_median). Limits use the best
 * repetition (STREAM convention), which makes the engine's ratios
 * conservative.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "gguf.h"
#include "kernels/attn.h"
#include "kernels/blas.h"
#include "kernels/cpu.h"
#include "kernels/panels.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/simd512.h"
#include "kernels/simd_amx.h"
#include "kernels/vecmath.h"
#include "layers.h"
#include "matmul.h"

#define MAX_REPS 32

/* ------------------------------------------------------------------ */
/* timing and statistics                                               */

typedef struct stats {
    int n;
    double v[MAX_REPS];         /* seconds per repetition */
} stats;

static void st_add(stats *s, double t)
{
    if (s->n < MAX_REPS)
        s->v[s->n++] = t;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double st_median(const stats *s)
{
    double t[MAX_REPS];
    memcpy(t, s->v, sizeof(double) * (size_t)s->n);
    qsort(t, (size_t)s->n, sizeof(double), cmp_d);
    return s->n % 2 ? t[s->n / 2] : 0.5 * (t[s->n / 2 - 1] + t[s->n / 2]);
}

static double st_min(const stats *s)
{
    double m = s->v[0];
    for (int i = 1; i < s->n; i++)
        m = s->v[i] < m ? s->v[i] : m;
    return m;
}

static double st_max(const stats *s)
{
    double m = s->v[0];
    for (int i = 1; i < s->n; i++)
        m = s->v[i] > m ? s->v[i] : m;
    return m;
}

/* {"median": work/t_med, "best": work/t_min, "worst": work/t_max,
 *  "spread_pct": (t_max - t_min) / t_med * 100, "reps": n, "seconds_median": t_med} */
static void json_rate(FILE *f, const char *key, const stats *s, double work)
{
    double med = st_median(s), lo = st_min(s), hi = st_max(s);
    fprintf(f, "\"%s\": {\"median\": %.6g, \"best\": %.6g, \"worst\": %.6g, \"spread_pct\": %.3g, "
               "\"reps\": %d, \"seconds_median\": %.6g}",
            key, work / med, work / lo, work / hi, 100.0 * (hi - lo) / med, s->n, med);
}

/* ------------------------------------------------------------------ */
/* machine                                                             */

static void json_machine(FILE *f)
{
    char cpu[256] = "unknown";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[512];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10)) {
                char *p = strchr(line, ':');
                if (p) {
                    p += 2;
                    p[strcspn(p, "\n")] = 0;
                    snprintf(cpu, sizeof cpu, "%s", p);
                }
                break;
            }
        fclose(ci);
    }
    for (char *p = cpu; *p; p++)
        if (*p == '"' || *p == '\\')
            *p = ' ';
    __builtin_cpu_init();
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    fprintf(f, "\"machine\": {\"cpu\": \"%s\", \"n_procs\": %d, \"l3_bytes\": %ld, "
               "\"avx2\": %s, \"fma\": %s, \"f16c\": %s, \"avx512f\": %s, "
               "\"openblas\": \"%s\", \"openblas_core\": \"%s\", \"kernels\": \"%s\"}",
            cpu, omp_get_num_procs(), l3,
            __builtin_cpu_supports("avx2") ? "true" : "false",
            __builtin_cpu_supports("fma") ? "true" : "false",
            __builtin_cpu_supports("f16c") ? "true" : "false",
            __builtin_cpu_supports("avx512f") ? "true" : "false",
            openblas_get_config(), openblas_get_corename(), simd_name());
}

/* ------------------------------------------------------------------ */
/* limits: triad, sgemv, sgemm                                         */

/* a = b + s c over n doubles; STREAM counts 3 * 8 bytes per element
 * (no write-allocate traffic). */
static void triad(double *restrict a, const double *restrict b, const double *restrict c,
                  double s, long n)
{
    #pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
}

static void json_triad(FILE *f, int threads, int reps)
{
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 <= 0)
        l3 = 32L << 20;
    /* each array 4/3 of L3, at least 256 MiB: the three together are 4x L3 */
    long n = (l3 * 4 / 3) / 8;
    if (n < (256L << 20) / 8)
        n = (256L << 20) / 8;
    double *a = malloc((size_t)n * 8), *b = malloc((size_t)n * 8), *c = malloc((size_t)n * 8);
    if (!a || !b || !c) {
        fprintf(stderr, "bench: out of memory for the triad\n");
        exit(1);
    }
    blas_set_threads(threads);
    #pragma omp parallel for schedule(static)         /* first touch by the thread that streams it */
    for (long i = 0; i < n; i++) {
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    stats s = {0};
    triad(a, b, c, 3.0, n);                           /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = engine_now_s();
        triad(a, b, c, 3.0, n);
        st_add(&s, engine_now_s() - t0);
    }
    fprintf(f, "{\"threads\": %d, \"array_bytes\": %ld, ", threads, n * 8);
    json_rate(f, "gb_s", &s, 3.0 * 8.0 * (double)n / 1e9);
    fprintf(f, "}");
    free(a);
    free(b);
    free(c);
}

/* a = s a + t in place over 3 triad arrays' worth of doubles, counted as
 * 2 * 8 bytes per element (read and written back): the pattern of a
 * DeltaNet state update, which needs no write-allocate of its own (the
 * line is in cache from the read), unlike the triad's a. */
static void update(double *restrict a, double s, double t, long n)
{
    #pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++)
        a[i] = s * a[i] + t;
}

static void json_update(FILE *f, int threads, int reps)
{
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 <= 0)
        l3 = 32L << 20;
    long n = l3 * 4 / 8;                            /* 4x L3, at least 768 MiB, as the triad's three */
    if (n < (768L << 20) / 8)
        n = (768L << 20) / 8;
    double *a = malloc((size_t)n * 8);
    if (!a) {
        fprintf(stderr, "bench: out of memory for the update stream\n");
        exit(1);
    }
    blas_set_threads(threads);
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        a[i] = 1.0;
    stats s = {0};
    update(a, 0.5, 1.0, n);                         /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = engine_now_s();
        update(a, 0.5, 1.0, n);
        st_add(&s, engine_now_s() - t0);
    }
    fprintf(f, "{\"threads\": %d, \"array_bytes\": %ld, ", threads, n * 8);
    json_rate(f, "gb_s", &s, 2.0 * 8.0 * (double)n / 1e9);
    fprintf(f, "}");
    free(a);
}

/* y = W x over a 256 MiB f32 matrix: what a decode matvec could reach */
static void json_sgemv(FILE *f, int threads, int reps)
{
    const int n_in = 4096, n_out = 16384;            /* 256 MiB */
    float *W = malloc(sizeof(float) * (size_t)n_in * n_out);
    float *x = malloc(sizeof(float) * n_in), *y = malloc(sizeof(float) * n_out);
    if (!W || !x || !y) {
        fprintf(stderr, "bench: out of memory for sgemv\n");
        exit(1);
    }
    blas_set_threads(threads);
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n_in * n_out; i++)
        W[i] = (float)(i % 7) * 0.01f;
    for (int i = 0; i < n_in; i++)
        x[i] = 1.0f;
    stats s = {0};
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n_out, n_in, 1.0f, W, n_in, x, 1, 0.0f, y, 1);
    for (int r = 0; r < reps; r++) {
        double t0 = engine_now_s();
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n_out, n_in, 1.0f, W, n_in, x, 1, 0.0f, y, 1);
        st_add(&s, engine_now_s() - t0);
    }
    fprintf(f, "{\"threads\": %d, \"matrix_bytes\": %ld, ", threads, (long)n_in * n_out * 4);
    json_rate(f, "gb_s", &s, 4.0 * (double)n_in * n_out / 1e9);
    fprintf(f, "}");
    free(W);
    free(x);
    free(y);
}

/* One layer's projection shapes of the Qwen3.5-0.8B shape at a 512-token
 * prefill, as matmul runs them: Y[T][n_out] = X[T][n_in] W^T. */
static const struct { const char *name; int n_in, n_out; } mm_shapes[] = {
    { "dnet_qkv", 1024, 6144 }, { "dnet_z", 1024, 2048 }, { "dnet_out", 2048, 1024 },
    { "attn_q", 1024, 4096 }, { "attn_o", 2048, 1024 },
    { "ffn_gate_up", 1024, 3584 }, { "ffn_down", 3584, 1024 },
};
#define N_MM_SHAPES (int)(sizeof mm_shapes / sizeof mm_shapes[0])

static double sgemm_once(int M, int N, int K, const float *A, const float *B, float *C)
{
    double t0 = engine_now_s();
    gemm(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
    return engine_now_s() - t0;
}

static void json_sgemm(FILE *f, int threads, int reps, int T)
{
    const int KMAX = 4096, NMAX = 6144;
    float *A = malloc(sizeof(float) * (size_t)T * KMAX), *B = malloc(sizeof(float) * (size_t)NMAX * KMAX);
    float *C = malloc(sizeof(float) * (size_t)T * NMAX);
    float *Q = malloc(sizeof(float) * 2048 * 2048 * 3);
    if (!A || !B || !C || !Q) {
        fprintf(stderr, "bench: out of memory for sgemm\n");
        exit(1);
    }
    for (long i = 0; i < (long)T * KMAX; i++)
        A[i] = (float)(i % 13) * 0.01f;
    for (long i = 0; i < (long)NMAX * KMAX; i++)
        B[i] = (float)(i % 11) * 0.01f;
    for (long i = 0; i < 2048L * 2048 * 3; i++)
        Q[i] = (float)(i % 5) * 0.01f;
    blas_set_threads(threads);
    fprintf(f, "{\"threads\": %d, \"tokens\": %d, \"shapes\": [", threads, T);
    /* the mix: one repetition runs every shape once; its FLOPs over its time */
    stats mix = {0};
    double mix_flop = 0.0;
    stats per[N_MM_SHAPES];
    memset(per, 0, sizeof per);
    for (int i = 0; i < N_MM_SHAPES; i++)
        (void)sgemm_once(T, mm_shapes[i].n_out, mm_shapes[i].n_in, A, B, C);     /* warm-up */
    for (int r = 0; r < reps; r++) {
        double tot = 0.0;
        for (int i = 0; i < N_MM_SHAPES; i++) {
            double t = sgemm_once(T, mm_shapes[i].n_out, mm_shapes[i].n_in, A, B, C);
            st_add(&per[i], t);
            tot += t;
        }
        st_add(&mix, tot);
    }
    for (int i = 0; i < N_MM_SHAPES; i++) {
        double fl = 2.0 * T * mm_shapes[i].n_in * mm_shapes[i].n_out;
        mix_flop += fl;
        fprintf(f, "%s{\"name\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, ", i ? ", " : "",
                mm_shapes[i].name, T, mm_shapes[i].n_out, mm_shapes[i].n_in);
        json_rate(f, "gflop_s", &per[i], fl / 1e9);
        fprintf(f, "}");
    }
    fprintf(f, "], ");
    json_rate(f, "mix_gflop_s", &mix, mix_flop / 1e9);
    stats sq = {0};
    (void)sgemm_once(2048, 2048, 2048, Q, Q + 2048 * 2048, Q + 2 * 2048 * 2048);
    for (int r = 0; r < reps; r++)
        st_add(&sq, sgemm_once(2048, 2048, 2048, Q, Q + 2048 * 2048, Q + 2 * 2048 * 2048));
    fprintf(f, ", ");
    json_rate(f, "square2048_gflop_s", &sq, 2.0 * 2048.0 * 2048.0 * 2048.0 / 1e9);
    fprintf(f, "}");
    free(A);
    free(B);
    free(C);
    free(Q);
}

static int cmd_limits(FILE *f, bool quick)
{
    const int reps = quick ? 3 : 7;
    fprintf(f, "{");
    json_machine(f);
    fprintf(f, ",\n\"triad\": [");
    for (int t = 1; t <= 2; t++) {
        json_triad(f, t, reps);
        fprintf(f, t < 2 ? ",\n" : "");
    }
    fprintf(f, "],\n\"update\": [");
    for (int t = 1; t <= 2; t++) {
        json_update(f, t, reps);
        fprintf(f, t < 2 ? ",\n" : "");
    }
    fprintf(f, "],\n\"sgemv\": [");
    for (int t = 1; t <= 2; t++) {
        json_sgemv(f, t, reps);
        fprintf(f, t < 2 ? ",\n" : "");
    }
    fprintf(f, "],\n\"sgemm\": [");
    for (int t = 1; t <= 2; t++) {
        json_sgemm(f, t, quick ? 2 : 5, 512);
        fprintf(f, t < 2 ? ",\n" : "");
    }
    fprintf(f, "]}\n");
    return 0;
}

/* ------------------------------------------------------------------ */
/* engine figures                                                      */

typedef struct bench_engine {
    engine *e;
    const engine_info *info;
    int32_t *toks;              /* [n_tok_buf] pseudo-random prompt tokens */
    int n_tok_buf;
    float *logits;              /* [64][n_vocab] */
} bench_engine;

static uint32_t lcg_next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static int state_dtype = ENGINE_STATE_F32;      /* --state-dtype: the DeltaNet state's numbers */

/* flags: BE_HUGE (weights in huge pages), BE_MOE_PER_ROW (engine_params.moe_per_row) */
enum { BE_HUGE = 1, BE_MOE_PER_ROW = 2 };

static int be_open_ex(bench_engine *b, const char *path, int n_ctx, int max_seqs, int dnet_mode, int flags)
{
    engine_params p;
    engine_params_default(&p);
    p.state_dtype = state_dtype;
    p.model_path = path;
    p.huge_weights = flags & BE_HUGE;
    p.moe_per_row = flags & BE_MOE_PER_ROW;
    p.n_threads = 2;                    /* scratch is sized for 2; runs drop to 1 as needed */
    p.n_ctx = n_ctx;
    p.max_seqs = max_seqs;
    p.dnet_mode = dnet_mode;
    p.cache_bytes = 3ULL << 30;
    char err[512];
    b->e = engine_open(&p, err, sizeof err);
    if (!b->e) {
        fprintf(stderr, "bench: %s\n", err);
        return -1;
    }
    b->info = engine_get_info(b->e);
    b->n_tok_buf = n_ctx;
    b->toks = malloc(sizeof(int32_t) * (size_t)n_ctx);
    b->logits = malloc(sizeof(float) * 64 * (size_t)b->info->n_vocab);
    uint32_t s = 12345;
    for (int i = 0; i < n_ctx; i++)
        b->toks[i] = (int32_t)(lcg_next(&s) % (uint32_t)b->info->n_vocab);
    return 0;
}

static int be_open(bench_engine *b, const char *path, int n_ctx, int max_seqs, int dnet_mode)
{
    return be_open_ex(b, path, n_ctx, max_seqs, dnet_mode, 0);
}

static void be_close(bench_engine *b)
{
    engine_close(b->e);
    free(b->toks);
    free(b->logits);
}

static void must(int rc, const char *what, const char *err)
{
    if (rc != 0) {
        fprintf(stderr, "bench: %s: %s\n", what, err);
        exit(1);
    }
}

/* Append n prompt tokens to seq in one engine_forward; logits of the last. */
static double be_prefill(bench_engine *b, int seq, int n)
{
    char err[256];
    engine_batch_item it = { .seq = seq, .tokens = b->toks, .n_tokens = n,
                             .logits = ENGINE_LOGITS_LAST, .out = b->logits };
    double t0 = engine_now_s();
    must(engine_forward(b->e, &it, 1, err, sizeof err), "prefill", err);
    return engine_now_s() - t0;
}

/* n greedy decode steps on seq; returns seconds */
static double be_decode(bench_engine *b, int seq, int n)
{
    char err[256];
    int32_t tok = (int32_t)argmax(b->logits, b->info->n_vocab);
    double t0 = engine_now_s();
    for (int i = 0; i < n; i++) {
        engine_batch_item it = { .seq = seq, .tokens = &tok, .n_tokens = 1,
                                 .logits = ENGINE_LOGITS_LAST, .out = b->logits };
        must(engine_forward(b->e, &it, 1, err, sizeof err), "decode", err);
        tok = (int32_t)argmax(b->logits, b->info->n_vocab);
    }
    return engine_now_s() - t0;
}

static int be_seq(bench_engine *b, int n_tokens)
{
    int s = engine_seq_new(b->e);
    if (s < 0 || engine_seq_reserve(b->e, s, n_tokens) != 0) {
        fprintf(stderr, "bench: cannot reserve a sequence of %d tokens\n", n_tokens);
        exit(1);
    }
    return s;
}

/* Model FLOPs of a prefill of n tokens after pos0 cached ones: 2 per
 * projection weight per token, the LM head for the last token only, and
 * attention's q.k and p.v over the causal pairs (4 * head_dim per pair and
 * query head). DeltaNet's recurrence (~4 d_k d_v per token and head) is
 * counted too; conv, norms and gates are not. */
static double prefill_flop(const engine_info *in, int n, int pos0)
{
    double emb = (double)in->n_vocab * in->n_embd;
    double proj = (double)in->n_params - emb;          /* tied: tok_embd counted once */
    double pairs = (double)n * pos0 + (double)n * (n + 1) / 2.0;
    double attn = 4.0 * in->head_dim * in->n_head * pairs * in->n_attn_layers;
    double dnet = 4.0 * in->ssm_d_k * in->ssm_d_v * in->ssm_n_v * (double)n * in->n_dnet_layers;
    return 2.0 * proj * n + 2.0 * emb + attn + dnet;
}

/* Bytes a decode step at context ctx must move: every weight once (the LM
 * head is the tied embedding), K and V of ctx tokens in every attention
 * layer, the DeltaNet state read and written, and the conv window read
 * with one of its K - 1 rows written (it is a ring). */
static double decode_bytes(const engine_info *in, double ctx)
{
    const double conv = (double)in->dnet_conv_bytes_per_seq;
    const double rows = in->ssm_conv_kernel > 1 ? in->ssm_conv_kernel - 1 : 1;
    return (double)in->weight_bytes + ctx * (double)in->kv_bytes_per_token +
           2.0 * (double)in->dnet_state_bytes_per_seq + conv + conv / rows;
}

typedef struct eng_opts {
    bool quick;
    const char *only;           /* comma list of sections to run, NULL: all */
    const char *ctx8k;          /* weight types that also decode after 8K (full runs) */
} eng_opts;

static bool want(const eng_opts *o, const char *section)
{
    return !o->only || strstr(o->only, section);
}

static void json_prefill(FILE *f, bench_engine *b, int threads, const eng_opts *o)
{
    static const int full_n[] = { 128, 512, 2048 }, quick_n[] = { 128, 512 };
    const int *ns = o->quick ? quick_n : full_n;
    const int nn = o->quick ? 2 : 3;
    engine_set_threads(b->e, threads);
    {   /* warm-up: page the weights in, spin the pools up */
        int s = be_seq(b, 128);
        (void)be_prefill(b, s, 128);
        engine_seq_free(b->e, s);
    }
    fprintf(f, "\"prefill\": [");
    for (int i = 0; i < nn; i++) {
        int n = ns[i];
        /* full: 3 repetitions, fewer for the long prompts (run time) */
        int reps = o->quick ? 1 : n >= 2048 ? (threads == 1 ? 1 : 2) : threads == 1 ? 2 : 3;
        stats st = {0};
        for (int r = 0; r < reps; r++) {
            int s = be_seq(b, n);
            st_add(&st, be_prefill(b, s, n));
            engine_seq_free(b->e, s);
        }
        double fl = prefill_flop(b->info, n, 0);
        fprintf(f, "%s{\"tokens\": %d, \"flop\": %.6g, ", i ? ", " : "", n, fl);
        json_rate(f, "tok_s", &st, n);
        fprintf(f, ", ");
        json_rate(f, "gflop_s", &st, fl / 1e9);
        fprintf(f, "}");
        fflush(f);
    }
    fprintf(f, "]");
}

/* A limit for the KV reads of decode at a long context: K and V of every
 * attention layer and KV head of one ctx-token sequence, read with no
 * arithmetic but a sum, from a cache with the engine's layout (pages of
 * page_tokens tokens, f32) and much as the engine reads them: a thread per
 * KV head at a time, two pages at once (two streams; the decode kernel
 * pairs the pages of each 4-page block, this reader the two halves of the
 * context). The triad counts three long streams; this is what the same
 * bytes cost in the cache's own layout. */
typedef struct kv_reader {
    cache c;
    int seq, ctx, n_layers, n_kv, hd, page;
    double bytes;
} kv_reader;

static int kv_reader_init(kv_reader *r, const engine_info *in, int ctx)
{
    cache_layout l = { .n_layers = in->n_layer, .n_attn = in->n_attn_layers, .n_kv = in->n_head_kv,
                       .head_dim = in->head_dim, .n_head = in->n_head, .page_tokens = in->page_tokens,
                       .n_ctx = ctx, .max_seqs = 1 };
    if (in->n_attn_layers <= 0 || cache_init(&r->c, &l) != 0)
        return -1;
    r->seq = cache_seq_new(&r->c);
    if (r->seq < 0 || cache_reserve(&r->c, r->seq, ctx) != 0) {
        cache_deinit(&r->c);
        return -1;
    }
    cache_seq *sq = cache_get(&r->c, r->seq);
    r->ctx = ctx, r->n_layers = in->n_attn_layers, r->n_kv = in->n_head_kv, r->hd = in->head_dim;
    r->page = r->c.page_tokens;
    for (int la = 0; la < r->n_layers; la++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < r->n_kv; h++)
                for (int t = 0; t < ctx; t++) {
                    float *row = cache_kv(&r->c, sq, la, kv, h, t);
                    for (int i = 0; i < r->hd; i++)
                        row[i] = 1e-3f * (float)((t + i) % 17);
                }
    sq->n_past = ctx;
    r->bytes = 2.0 * r->n_layers * r->n_kv * (double)ctx * r->hd * sizeof(float);
    return 0;
}

static float sum_two(const float *restrict a, const float *restrict b, int n)
{
    float s = 0.0f;
    #pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++)
        s += a[i] + b[i];
    return s;
}

static volatile float kv_sink;

/* seconds for one read of the whole sequence */
static double kv_read_once(kv_reader *r)
{
    const cache_seq *sq = cache_get_const(&r->c, r->seq);
    const int P = r->page, np = (r->ctx + P - 1) / P, half = np / 2, rows = P * r->hd;
    double t0 = engine_now_s();
    float tot = 0.0f;
    #pragma omp parallel for schedule(dynamic, 1) reduction(+ : tot)
    for (int h = 0; h < r->n_kv; h++)
        for (int la = 0; la < r->n_layers; la++)
            for (int kv = 0; kv < 2; kv++) {
                for (int k = 0; k < half; k++)
                    tot += sum_two(cache_kv(&r->c, sq, la, kv, h, k * P), cache_kv(&r->c, sq, la, kv, h, (k + half) * P),
                                   rows);
                if (np % 2) {
                    const float *last = cache_kv(&r->c, sq, la, kv, h, (np - 1) * P);
                    tot += sum_two(last, last, (r->ctx - (np - 1) * P) * r->hd);
                }
            }
    kv_sink = tot;
    return engine_now_s() - t0;
}

/* Decode 128 new tokens after ctx tokens, at 1 and 2 threads, timed as 4
 * segments of 32 tokens (the repetitions: median and spread are over the
 * segments). The context is filled once by a real prefill at 2 threads;
 * the 1-thread run goes first and the 2-thread run continues the same
 * sequence, 136 tokens later (the JSON records the mean context each
 * figure saw). The 8K context costs a long prefill per model, so it runs
 * for the weight types listed in o->ctx8k only. */
static void json_decode(FILE *f, bench_engine *b, const char *dtype, const eng_opts *o)
{
    static const int ctxs[] = { 0, 1024, 8192 };
    const int seg = 32, n_seg = o->quick ? 1 : 4, warm = 8, n_new = seg * n_seg;
    fprintf(f, "\"decode\": [");
    int first = 1;
    for (int i = 0; i < 3; i++) {
        const int ctx = ctxs[i];
        if (ctx >= 8192 && (o->quick || !o->ctx8k || !strstr(o->ctx8k, dtype)))
            continue;
        int s = be_seq(b, ctx + 2 * (warm + n_new) + 1);
        /* at 8K a short sequence decodes in alternation with the long one,
         * so the 0-context time the prediction starts from is taken under
         * the same conditions (the VM's bandwidth drifts over minutes) */
        const int s0 = ctx >= 8192 ? be_seq(b, 2 * (2 * warm + 2 * n_new) + 1) : -1;
        kv_reader kvr;
        const bool have_kvr = ctx >= 8192 && kv_reader_init(&kvr, b->info, ctx) == 0;
        engine_set_threads(b->e, 2);
        double fill_s = 0.0;
        if (ctx > 0)
            fill_s = be_prefill(b, s, ctx);
        else
            memset(b->logits, 0, sizeof(float) * (size_t)b->info->n_vocab);
        for (int threads = 1; threads <= 2; threads++) {
            engine_set_threads(b->e, threads);
            (void)be_decode(b, s, warm);
            stats st = {0};
            const int pos0 = engine_seq_len(b->e, s);
            for (int r = 0; r < n_seg; r++)
                st_add(&st, be_decode(b, s, seg));
            const double ctx_mean = pos0 + (n_new - 1) / 2.0;
            fprintf(f, "%s{\"ctx\": %d, \"threads\": %d, \"new_tokens\": %d, \"ctx_mean\": %.1f, "
                       "\"fill_seconds\": %.3f, \"bytes_per_token\": %.6g, ",
                    first ? "" : ",\n", ctx, threads, n_new, ctx_mean, fill_s, decode_bytes(b->info, ctx_mean));
            first = 0;
            json_rate(f, "tok_s", &st, seg);
            fprintf(f, ", ");
            json_rate(f, "gb_s", &st, seg * decode_bytes(b->info, ctx_mean) / 1e9);
            if (ctx >= 8192) {
                /* the same steps with attention reading one page at a
                 * time (the layout before pairs), and the short sequence,
                 * alternated segment by segment with the long one */
                stats one = {0}, near0 = {0}, again = {0}, rd = {0};
                (void)be_decode(b, s0, warm);
                const int pos_near0 = engine_seq_len(b->e, s0);
                if (have_kvr) {
                    blas_set_threads(threads);
                    (void)kv_read_once(&kvr);
                }
                for (int r = 0; r < n_seg; r++) {
                    if (have_kvr)
                        st_add(&rd, kv_read_once(&kvr));
                    st_add(&near0, be_decode(b, s0, seg));
                    attn_set_decode_pairs(false);
                    st_add(&one, be_decode(b, s, seg));
                    attn_set_decode_pairs(true);
                    st_add(&again, be_decode(b, s, seg));
                }
                fprintf(f, ", ");
                json_rate(f, "tok_s_one_page", &one, seg);
                fprintf(f, ", ");
                json_rate(f, "tok_s_alternating", &again, seg);
                fprintf(f, ", \"near0_ctx_mean\": %.1f, ", pos_near0 + (n_new - 1) / 2.0);
                json_rate(f, "tok_s_near0_alternating", &near0, seg);
                if (have_kvr) {
                    fprintf(f, ", ");
                    json_rate(f, "kv_read_gb_s", &rd, kvr.bytes / 1e9);
                }
            }
            fprintf(f, "}");
            fflush(f);
        }
        engine_seq_free(b->e, s);
        if (s0 >= 0)
            engine_seq_free(b->e, s0);
        if (have_kvr)
            cache_deinit(&kvr.c);
    }
    fprintf(f, "]");
}

/* B sequences decoding together: each group of B gets a 16-token prompt
 * (one batched forward), then every step is one engine_forward of B
 * single-token items. The groups (1, 4, 16, 64 sequences) are all alive at
 * once and take turns, a segment of steps each per repetition, so "x one
 * sequence" compares figures taken under the same conditions (the VM's
 * bandwidth drifts over minutes). */
#define BATCHED_MAX_GROUPS 4
#define BATCHED_MAX_SEQS 85             /* 1 + 4 + 16 + 64 */
static void json_batched(FILE *f, bench_engine *b, int threads, const eng_opts *o)
{
    static const int full_b[] = { 1, 4, 16, 64 }, quick_b[] = { 1, 4, 16 };
    const int *bs = o->quick ? quick_b : full_b;
    const int ng = o->quick ? 3 : 4, prompt = 16;
    const int steps = o->quick ? 4 : 4, reps = o->quick ? 1 : 7, warm = 2;
    const int NV = b->info->n_vocab;
    int seqs[BATCHED_MAX_SEQS], first[BATCHED_MAX_GROUPS];
    engine_batch_item it[BATCHED_MAX_SEQS];
    int32_t tok[BATCHED_MAX_SEQS];
    stats st[BATCHED_MAX_GROUPS];
    char err[256];
    float *lg = malloc(sizeof(float) * BATCHED_MAX_SEQS * (size_t)NV);
    if (!lg) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    engine_set_threads(b->e, threads);
    int n = 0;
    for (int g = 0; g < ng; g++) {
        first[g] = n;
        memset(&st[g], 0, sizeof st[g]);
        for (int j = n; j < n + bs[g]; j++) {
            seqs[j] = be_seq(b, prompt + warm + reps * steps + 1);
            it[j] = (engine_batch_item){ .seq = seqs[j], .tokens = b->toks + 7 * (j - n), .n_tokens = prompt,
                                         .logits = ENGINE_LOGITS_LAST, .out = lg + (size_t)j * NV };
        }
        must(engine_forward(b->e, it + n, bs[g], err, sizeof err), "batched prompt", err);
        n += bs[g];
    }
    for (int r = -1; r < reps; r++)
        for (int g = 0; g < ng; g++) {
            const int B = bs[g], j0 = first[g], n_steps = r < 0 ? warm : steps;
            double t0 = engine_now_s();
            for (int k = 0; k < n_steps; k++) {
                for (int j = j0; j < j0 + B; j++) {
                    tok[j] = (int32_t)argmax(lg + (size_t)j * NV, NV);
                    it[j].tokens = &tok[j];
                    it[j].n_tokens = 1;
                }
                must(engine_forward(b->e, it + j0, B, err, sizeof err), "batched step", err);
            }
            if (r >= 0)
                st_add(&st[g], engine_now_s() - t0);
        }
    for (int j = 0; j < n; j++)
        engine_seq_free(b->e, seqs[j]);
    free(lg);
    fprintf(f, "\"batched\": [");
    for (int g = 0; g < ng; g++) {
        fprintf(f, "%s{\"seqs\": %d, \"threads\": %d, \"steps\": %d, \"alternating\": true, ", g ? ", " : "",
                bs[g], threads, steps);
        json_rate(f, "tok_s", &st[g], (double)bs[g] * steps);
        /* "x one" turn by turn: this group's rate over the one-sequence
         * group's in the same turn (seconds apart), so drift between turns
         * cancels; the median of those, and their range */
        stats pr;
        memset(&pr, 0, sizeof pr);
        for (int r = 0; r < st[g].n && r < st[0].n; r++)
            st_add(&pr, (double)bs[g] / bs[0] * st[0].v[r] / st[g].v[r]);
        if (pr.n > 0)
            fprintf(f, ", \"x_one_paired\": {\"median\": %.4g, \"min\": %.4g, \"max\": %.4g}", st_median(&pr),
                    st_min(&pr), st_max(&pr));
        fprintf(f, "}");
    }
    fprintf(f, "]");
    fflush(f);
}

/* Where the weights live, side by side: a second engine on the same file
 * reads them into 2 MiB pages (--huge-pages) while the main one serves
 * them from the file mapping (4 KiB pages, the default). Decode steps of 1
 * and 16 sequences (2 threads) alternate between the two in turns of
 * `steps` steps; per turn, the ratio of the two rates (huge over mapped). */
static void json_weights_memory(FILE *f, bench_engine *b, const char *path, const eng_opts *o)
{
    static const int bs[] = { 1, 16 };
    const int steps = 4, reps = o->quick ? 2 : 7, prompt = 16, NV = b->info->n_vocab;
    bench_engine hb;
    if (be_open_ex(&hb, path, 256, 24, ENGINE_DNET_AUTO, BE_HUGE) != 0)
        return;
    bench_engine *E[2] = { b, &hb };    /* 0: the default (mapped), 1: huge pages */
    float *lg = malloc(sizeof(float) * 2 * 16 * (size_t)NV);
    int seqs[2][17];
    engine_batch_item it[2][17];
    int32_t tok[2][17];
    char err[256];
    fprintf(f, "\"weights_memory\": {\"default\": \"%s\", \"other\": \"%s\", \"groups\": [", b->info->weights_memory,
            hb.info->weights_memory);
    for (int gi = 0; gi < 2; gi++) {
        const int B = bs[gi];
        stats st[2], pr;
        memset(st, 0, sizeof st);
        memset(&pr, 0, sizeof pr);
        for (int e = 0; e < 2; e++) {
            engine_set_threads(E[e]->e, 2);
            for (int j = 0; j < B; j++) {
                seqs[e][j] = be_seq(E[e], prompt + (reps + 1) * steps + 1);
                it[e][j] = (engine_batch_item){ .seq = seqs[e][j], .tokens = b->toks + 7 * j, .n_tokens = prompt,
                                                .logits = ENGINE_LOGITS_LAST, .out = lg + ((size_t)e * 16 + j) * NV };
            }
            must(engine_forward(E[e]->e, it[e], B, err, sizeof err), "weights prompt", err);
        }
        for (int r = -1; r < reps; r++) {
            double dt[2];
            for (int e = 0; e < 2; e++) {
                double t0 = engine_now_s();
                for (int k = 0; k < steps; k++) {
                    for (int j = 0; j < B; j++) {
                        tok[e][j] = (int32_t)argmax(lg + ((size_t)e * 16 + j) * NV, NV);
                        it[e][j].tokens = &tok[e][j];
                        it[e][j].n_tokens = 1;
                    }
                    must(engine_forward(E[e]->e, it[e], B, err, sizeof err), "weights step", err);
                }
                dt[e] = engine_now_s() - t0;
            }
            if (r >= 0) {
                st_add(&st[0], dt[0]);
                st_add(&st[1], dt[1]);
                st_add(&pr, dt[0] / dt[1]);
            }
        }
        for (int e = 0; e < 2; e++)
            for (int j = 0; j < B; j++)
                engine_seq_free(E[e]->e, seqs[e][j]);
        fprintf(f, "%s{\"seqs\": %d, \"threads\": 2, \"steps\": %d, ", gi ? ", " : "", B, steps);
        json_rate(f, "mapped_tok_s", &st[0], (double)B * steps);
        fprintf(f, ", ");
        json_rate(f, "huge_tok_s", &st[1], (double)B * steps);
        fprintf(f, ", \"ratio_paired\": {\"median\": %.4g, \"min\": %.4g, \"max\": %.4g}}", st_median(&pr),
                st_min(&pr), st_max(&pr));
    }
    fprintf(f, "]}");
    fflush(f);
    free(lg);
    be_close(&hb);
}

static int cmd_engine(FILE *f, const char *path, const char *dtype, const eng_opts *o)
{
    bench_engine b;
    const int n_ctx = 8192 + 2048;
    /* The limits again, right before this model's figures: on a shared
     * machine what two threads can get drifts over a long run, and each
     * model's ratios use the limits measured next to it. */
    fprintf(f, "{\"limits\": {\"triad\": [");
    for (int t = 1; t <= 2; t++) {
        json_triad(f, t, 3);
        fprintf(f, t < 2 ? ", " : "");
    }
    fprintf(f, "], \"update\": [");
    for (int t = 1; t <= 2; t++) {
        json_update(f, t, 3);
        fprintf(f, t < 2 ? ", " : "");
    }
    fprintf(f, "], \"sgemm\": [");
    for (int t = 1; t <= 2; t++) {
        json_sgemm(f, t, 2, 512);
        fprintf(f, t < 2 ? ", " : "");
    }
    fprintf(f, "]},\n");
    if (be_open(&b, path, n_ctx, BATCHED_MAX_SEQS + 8, ENGINE_DNET_AUTO) != 0)
        return 1;
    const engine_info *in = b.info;
    fprintf(f, "\"dtype\": \"%s\", \"file\": \"%s\", \"n_params\": %llu, \"weight_bytes\": %llu, "
               "\"kv_bytes_per_token\": %llu, \"dnet_state_bytes_per_seq\": %llu, "
               "\"dnet_conv_bytes_per_seq\": %llu, \"ssm_conv_kernel\": %d, \"n_layer\": %d, "
               "\"n_attn_layers\": %d, \"n_embd\": %d, \"n_vocab\": %d, \"state_dtype\": \"%s\",\n",
            dtype, path, (unsigned long long)in->n_params, (unsigned long long)in->weight_bytes,
            (unsigned long long)in->kv_bytes_per_token, (unsigned long long)in->dnet_state_bytes_per_seq,
            (unsigned long long)in->dnet_conv_bytes_per_seq, in->ssm_conv_kernel, in->n_layer,
            in->n_attn_layers, in->n_embd, in->n_vocab, in->state_dtype);
    /* decode steps of several sequences multiply on AMX tiles (int8 or
     * bf16 products) for these types, not in fp32 */
    const bool amx = (!strcmp(dtype, "q8_0") && simd_amx()) || (!strcmp(dtype, "bf16") && simd_amx_bf16()) ||
                     (!strcmp(dtype, "f16") && simd_amx_f16());
    fprintf(f, "\"batched_on_amx\": %s,\n", amx ? "true" : "false");
    /* what the products of a decode step of several sequences multiply in:
     * AMX tiles, int8 on AVX512-VNNI (Q8_0 without AMX), or fp32 */
    const bool vnni = !amx && !strcmp(dtype, "q8_0") && simd_avx512_vnni();
    fprintf(f, "\"batched_products\": \"%s\",\n", amx ? "amx" : vnni ? "vnni-int8" : "fp32");
    /* BF16/F16/Q8_0 matrices repacked into 16-row panels at load (engine/kernels/panels.h) */
    fprintf(f, "\"weights_in_panels\": %d,\n", b.info->weights_in_panels);
    fprintf(f, "\"threads\": [");
    for (int t = 1; t <= 2 && want(o, "prefill"); t++) {
        fprintf(f, "%s{\"threads\": %d, ", t > 1 ? ",\n" : "", t);
        json_prefill(f, &b, t, o);
        fprintf(f, "}");
    }
    fprintf(f, "]");
    if (want(o, "decode")) {
        fprintf(f, ",\n");
        json_decode(f, &b, dtype, o);
        /* the triad again right after the decode figures: with the one
         * before them it brackets them, and report.py divides by the
         * higher of the two (a bandwidth dip during either sample must not
         * flatter the fraction; the stop-32 run's 2-thread triads next to
         * the models ranged 35.7-52.4 GB/s) */
        fprintf(f, ",\n\"limits_after_decode\": {\"triad\": [");
        for (int t = 1; t <= 2; t++) {
            json_triad(f, t, 3);
            fprintf(f, t < 2 ? ", " : "");
        }
        fprintf(f, "]}");
    }
    if (want(o, "batched")) {
        fprintf(f, ",\n");
        json_batched(f, &b, 2, o);
    }
    if (want(o, "weights")) {
        fprintf(f, ",\n");
        json_weights_memory(f, &b, path, o);
    }
    fprintf(f, "}\n");
    be_close(&b);
    return 0;
}

/* ------------------------------------------------------------------ */
/* the hybrid families: one model of an architecture, shaped like a real one */

/* Bytes a decode step of one sequence at context ctx moves: the weights,
 * of the routed experts only the n_expert_used / n_expert a token picks
 * (every MoE layer picks that many), K and V (or MLA's latent) of ctx
 * tokens, every recurrent kind's state read and written, and its conv
 * windows read (one row of each written: left out). The LM head is the
 * tied embedding. */
static double family_decode_bytes(const engine_info *in, double ctx)
{
    double w = (double)in->weight_bytes;
    if (in->n_expert > 0)
        w -= (double)in->expert_weight_bytes * (1.0 - (double)in->n_expert_used / in->n_expert);
    return w + ctx * (double)(in->kv_bytes_per_token + in->mla_bytes_per_token) +
           2.0 * (double)in->rec_state_bytes_per_seq + (double)in->rec_conv_bytes_per_seq;
}

static void json_kinds(FILE *f, const engine_info *in)
{
    fprintf(f, "\"layout\": \"");
    for (int il = 0; il < in->n_layer; il++)
        fputc(engine_layer_letter(in->layer_kind[il]), f);
    fprintf(f, "\"");
}

/* A 512-token prompt at 2 threads (and, for a MoE model, the same prompt
 * with each row's experts as one-row products, engine_params.moe_per_row:
 * the two alternate, so a load change hits both, and their last logits
 * must agree), then decode after a 64-token prompt at 2 threads, between
 * two triads (the limit is the higher). */
static int cmd_family(FILE *f, const char *path, const char *dtype, bool quick)
{
    enum { PROMPT = 512, CTX0 = 64, SEG = 16 };
    const int reps = quick ? 1 : 3, n_seg = quick ? 2 : 4, warm = 8;
    bench_engine b, pr;
    fprintf(f, "{\"limits\": {\"triad\": [");
    json_triad(f, 2, 3);
    fprintf(f, "]},\n");
    if (be_open(&b, path, PROMPT + 2 * CTX0 + 256, 4, ENGINE_DNET_AUTO) != 0)
        return 1;
    const engine_info *in = b.info;
    const bool moe = in->n_expert > 0;
    fprintf(f, "\"dtype\": \"%s\", \"file\": \"%s\", \"arch\": \"%s\", ", dtype, path, in->arch);
    json_kinds(f, in);
    fprintf(f, ", \"n_params\": %llu, \"weight_bytes\": %llu, \"expert_weight_bytes\": %llu, \"n_expert\": %d, "
               "\"n_expert_used\": %d, \"kv_bytes_per_token\": %llu, \"mla_bytes_per_token\": %llu, "
               "\"rec_state_bytes_per_seq\": %llu, \"rec_conv_bytes_per_seq\": %llu, \"weights_dtype\": \"%s\",\n",
            (unsigned long long)in->n_params, (unsigned long long)in->weight_bytes,
            (unsigned long long)in->expert_weight_bytes, in->n_expert, in->n_expert_used,
            (unsigned long long)in->kv_bytes_per_token, (unsigned long long)in->mla_bytes_per_token,
            (unsigned long long)in->rec_state_bytes_per_seq, (unsigned long long)in->rec_conv_bytes_per_seq,
            in->weights_dtype);
    if (moe && be_open_ex(&pr, path, PROMPT + 8, 2, ENGINE_DNET_AUTO, BE_MOE_PER_ROW) != 0) {
        be_close(&b);
        return 1;
    }
    engine_set_threads(b.e, 2);
    {   /* warm-up: page the weights in */
        int s = be_seq(&b, PROMPT);
        (void)be_prefill(&b, s, PROMPT);
        engine_seq_free(b.e, s);
    }
    stats grouped = {0}, per_row = {0};
    double diff = 0.0, scale = 0.0;
    for (int r = 0; r < reps + (moe ? 1 : 0); r++) {
        int s = be_seq(&b, PROMPT);
        const double t = be_prefill(&b, s, PROMPT);
        engine_seq_free(b.e, s);
        if (!moe || r > 0)
            st_add(&grouped, t);
        if (moe) {
            engine_set_threads(pr.e, 2);
            int q = be_seq(&pr, PROMPT);
            const double tq = be_prefill(&pr, q, PROMPT);
            engine_seq_free(pr.e, q);
            if (r > 0)          /* the first: the per-row engine's warm-up */
                st_add(&per_row, tq);
            for (int v = 0; v < in->n_vocab; v++) {
                const double d = fabs((double)b.logits[v] - (double)pr.logits[v]);
                diff = d > diff ? d : diff;
                scale = fabs((double)b.logits[v]) > scale ? fabs((double)b.logits[v]) : scale;
            }
        }
    }
    fprintf(f, "\"prefill\": {\"tokens\": %d, \"threads\": 2, ", PROMPT);
    json_rate(f, "tok_s", &grouped, PROMPT);
    if (moe) {
        fprintf(f, ", ");
        json_rate(f, "tok_s_per_row_experts", &per_row, PROMPT);
        fprintf(f, ", \"per_row_max_abs_logit_diff\": %.3g, \"max_abs_logit\": %.3g", diff, scale);
        be_close(&pr);
    }
    fprintf(f, "},\n");
    int s = be_seq(&b, CTX0 + warm + n_seg * SEG + 1);
    (void)be_prefill(&b, s, CTX0);
    (void)be_decode(&b, s, warm);
    const int pos0 = engine_seq_len(b.e, s);
    stats st = {0};
    for (int r = 0; r < n_seg; r++)
        st_add(&st, be_decode(&b, s, SEG));
    engine_seq_free(b.e, s);
    const double ctx_mean = pos0 + (n_seg * SEG - 1) / 2.0, bytes = family_decode_bytes(in, ctx_mean);
    fprintf(f, "\"decode\": {\"threads\": 2, \"ctx_mean\": %.1f, \"bytes_per_token\": %.6g, ", ctx_mean, bytes);
    json_rate(f, "tok_s", &st, SEG);
    fprintf(f, ", ");
    json_rate(f, "gb_s", &st, SEG * bytes / 1e9);
    fprintf(f, "},\n\"limits_after\": {\"triad\": [");
    json_triad(f, 2, 3);
    fprintf(f, "]}}\n");
    be_close(&b);
    return 0;
}

/* ------------------------------------------------------------------ */
/* DeltaNet: chunked vs recurrent kernels on one layer's heads          */

/* n tokens, n_h heads of d_k = d_v = d; heads in parallel as dnet_forward
 * runs them. Inputs are random with q, k unit-norm rows and g < 0. */
enum { DN_RECURRENT_REF, DN_CHUNKED, DN_RECURRENT_AVX2 };

static double dnet_run(int variant, int n, int n_h, int d, const float *q, const float *k,
                       const float *v, const float *beta, const float *g, float *S, float *o,
                       float *scratch)
{
    const long scr = dnet_chunk_scratch_floats(d, d);
    memset(S, 0, sizeof(float) * (size_t)n_h * d * d);
    double t0 = engine_now_s();
    #pragma omp parallel for schedule(dynamic, 1)
    for (int h = 0; h < n_h; h++) {
        const int ld = n_h * d;
        float *sc = scratch + (size_t)omp_get_thread_num() * scr;
        if (variant == DN_CHUNKED)
            dnet_chunked_head(n, d, d, q + (size_t)h * d, ld, k + (size_t)h * d, ld, v + (size_t)h * d, ld,
                              beta + (size_t)h * n, g + (size_t)h * n, S + (size_t)h * d * d,
                              o + (size_t)h * d, ld, sc);
        else if (variant == DN_RECURRENT_AVX2)
            for (int t = 0; t < n; t++)
                avx2_dnet_step(d, d, q + (size_t)t * ld + (size_t)h * d, k + (size_t)t * ld + (size_t)h * d,
                               v + (size_t)t * ld + (size_t)h * d, beta[(size_t)h * n + t], g[(size_t)h * n + t],
                               S + (size_t)h * d * d, o + (size_t)t * ld + (size_t)h * d, t == 0);
        else
            dnet_recurrent_head(n, d, d, q + (size_t)h * d, ld, k + (size_t)h * d, ld, v + (size_t)h * d, ld,
                                beta + (size_t)h * n, g + (size_t)h * n, S + (size_t)h * d * d,
                                o + (size_t)h * d, ld);
    }
    return engine_now_s() - t0;
}

static int cmd_dnet(FILE *f, bool quick)
{
    const int n = 2048, n_h = 16, d = 128;
    const size_t nx = (size_t)n * n_h * d;
    float *q = malloc(nx * 4), *k = malloc(nx * 4), *v = malloc(nx * 4), *o = malloc(nx * 4);
    float *beta = malloc((size_t)n * n_h * 4), *g = malloc((size_t)n * n_h * 4);
    float *S = malloc((size_t)n_h * d * d * 4);
    float *scr = malloc((size_t)omp_get_num_procs() * dnet_chunk_scratch_floats(d, d) * 4);
    uint32_t s = 99;
    for (size_t i = 0; i < nx; i++) {
        q[i] = (float)(lcg_next(&s) % 2001) / 1000.0f - 1.0f;
        k[i] = (float)(lcg_next(&s) % 2001) / 1000.0f - 1.0f;
        v[i] = (float)(lcg_next(&s) % 2001) / 1000.0f - 1.0f;
    }
    for (size_t r = 0; r < (size_t)n * n_h; r++) {          /* unit rows, as after l2norm */
        l2norm(q + r * d, d, 1e-6f);
        l2norm(k + r * d, d, 1e-6f);
    }
    for (int i = 0; i < n * n_h; i++) {
        beta[i] = sigmoid((float)(lcg_next(&s) % 2001) / 1000.0f - 1.0f);
        g[i] = -softplus((float)(lcg_next(&s) % 2001) / 1000.0f - 2.0f);
    }
    fprintf(f, "{\"tokens\": %d, \"heads\": %d, \"d_k\": %d, \"d_v\": %d, \"runs\": [", n, n_h, d, d);
    const int reps = quick ? 2 : 5;
    for (int t = 1; t <= 2; t++) {
        blas_set_threads(t);
        static const char *names[] = { "recurrent_ref_tok_s", "chunked_tok_s", "recurrent_avx2_tok_s" };
        stats st[3];
        memset(st, 0, sizeof st);
        for (int var = 0; var < 3; var++) {
            if (var == DN_RECURRENT_AVX2 && !simd_avx2())
                continue;
            (void)dnet_run(var, n, n_h, d, q, k, v, beta, g, S, o, scr);
            for (int r = 0; r < (var == DN_RECURRENT_REF ? (quick ? 1 : 3) : reps); r++)
                st_add(&st[var], dnet_run(var, n, n_h, d, q, k, v, beta, g, S, o, scr));
        }
        fprintf(f, "%s{\"threads\": %d", t > 1 ? ", " : "", t);
        for (int var = 0; var < 3; var++)
            if (st[var].n) {
                fprintf(f, ", ");
                json_rate(f, names[var], &st[var], n);
            }
        fprintf(f, ", \"speedup_vs_ref\": %.4g", st_median(&st[DN_RECURRENT_REF]) / st_median(&st[DN_CHUNKED]));
        if (st[DN_RECURRENT_AVX2].n)
            fprintf(f, ", \"speedup_vs_avx2\": %.4g",
                    st_median(&st[DN_RECURRENT_AVX2]) / st_median(&st[DN_CHUNKED]));
        fprintf(f, "}");
        fflush(f);
    }
    fprintf(f, "]}\n");
    free(q); free(k); free(v); free(o); free(beta); free(g); free(S); free(scr);
    return 0;
}

/* Whole-model prefill of n tokens with the DeltaNet layers chunked (AUTO)
 * and recurrent, at 2 threads: the kernels' gain as the user sees it. */
static int cmd_dnet_model(FILE *f, const char *path, bool quick)
{
    const int n = quick ? 512 : 2048;
    fprintf(f, "{\"tokens\": %d, \"threads\": 2, \"file\": \"%s\"", n, path);
    static const struct { const char *name; int mode; } modes[] = {
        { "chunked", ENGINE_DNET_CHUNKED }, { "recurrent", ENGINE_DNET_RECURRENT } };
    for (int i = 0; i < 2; i++) {
        bench_engine b;
        if (be_open(&b, path, n + 16, 4, modes[i].mode) != 0)
            return 1;
        engine_set_threads(b.e, 2);
        int s = be_seq(&b, 128);
        (void)be_prefill(&b, s, 128);
        engine_seq_free(b.e, s);
        stats st = {0};
        s = be_seq(&b, n);
        st_add(&st, be_prefill(&b, s, n));
        engine_seq_free(b.e, s);
        fprintf(f, ", ");
        json_rate(f, modes[i].name, &st, n);
        be_close(&b);
    }
    fprintf(f, "}\n");
    return 0;
}

/* ------------------------------------------------------------------ */
/* kernels: matmul() per weight type in its three regimes               */

/* Decode matvec over one weight larger than 2x L3 (so it streams from
 * DRAM, as a model's weights do), in GB/s of weight bytes at 1 and 2
 * threads; and small batches through the rows x tokens kernel vs sgemm,
 * in GFLOP/s at 2 threads. */
/* w (data W, malloc'd rows) repacked into panels when want: returns the
 * buffer w now uses (W itself, or the packed copy with W freed) */
static char *panels_of(weight *w, char *W, bool want)
{
    if (!want)
        return W;
    char *P = malloc((size_t)w->n_out * w->row_bytes);
    if (!P) {
        fprintf(stderr, "bench: out of memory for kernels\n");
        exit(1);
    }
    panels_pack(W, w->type, w->n_in, w->n_out, P);
    free(W);
    w->data = P;
    w->panels = true;
    return P;
}

static int cmd_kernels(FILE *f, bool quick)
{
    /* F16 and BF16 also repacked into 16-row panels (engine/kernels/panels.h), where AVX-512 runs them,
     * and Q8_0 where AVX512-VNNI does */
    static const struct { const char *name; uint32_t type; bool panels; } types[] = {
        { "f32", GGML_F32, false }, { "f16", GGML_F16, false }, { "bf16", GGML_BF16, false },
        { "q8_0", GGML_Q8_0, false }, { "f16 panels", GGML_F16, true }, { "bf16 panels", GGML_BF16, true },
        { "q8_0 panels", GGML_Q8_0, true } };
    const int n_types = !simd_avx512() ? 4 : simd_avx512_vnni() ? 7 : 6;
    /* the K-quants and Q4_0 (int8 activations on every SIMD level): one-token rows only */
    static const struct { const char *name; uint32_t type; bool panels; } kq[] = {
        { "q4_k", GGML_Q4_K, false }, { "q5_k", GGML_Q5_K, false }, { "q6_k", GGML_Q6_K, false },
        { "q4_0", GGML_Q4_0, false } };
    const int n_kq = (int)(sizeof kq / sizeof kq[0]);
    const int n_in = 1024;
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    long bytes = 2 * (l3 > 0 ? l3 : 32L << 20);
    if (bytes < (256L << 20))
        bytes = 256L << 20;
    if (quick)
        bytes = 256L << 20;
    float *x = malloc(sizeof(float) * 64 * n_in), *row = malloc(sizeof(float) * n_in);
    float *scratch = malloc(sizeof(float) * (size_t)omp_get_num_procs() * 64 * n_in + 64);
    uint32_t s = 5;
    for (int i = 0; i < 64 * n_in; i++)
        x[i] = (float)(lcg_next(&s) % 2001) / 1000.0f - 1.0f;
    fprintf(f, "{\"matvec\": [");
    for (int ti = 0; ti < n_types + n_kq; ti++) {
        const char *tname = ti < n_types ? types[ti].name : kq[ti - n_types].name;
        const uint32_t type = ti < n_types ? types[ti].type : kq[ti - n_types].type;
        const bool tpanels = ti < n_types && types[ti].panels;
        const size_t rb = ggml_type_size(type) * n_in / ggml_block_size(type);
        const int n_out = (int)(bytes / (long)rb) / 16 * 16;
        char *W = malloc(rb * (size_t)n_out);
        float *y = malloc(sizeof(float) * (size_t)n_out * 64);
        if (!W || !y) {
            fprintf(stderr, "bench: out of memory for kernels\n");
            exit(1);
        }
        for (int i = 0; i < n_in; i++)
            row[i] = (float)(lcg_next(&s) % 2001) / 1000.0f - 1.0f;
        blas_set_threads(2);
        #pragma omp parallel for schedule(static)
        for (int o = 0; o < n_out; o++)             /* one row pattern, written by the streaming thread */
            quantize_row(type, row, W + (size_t)o * rb, n_in);
        weight w = { .data = W, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb };
        W = panels_of(&w, W, tpanels);
        for (int t = 1; t <= 2; t++) {
            blas_set_threads(t);
            stats st = {0};
            matmul(y, &w, x, 1, false, scratch);
            for (int r = 0; r < (quick ? 3 : 7); r++) {
                double t0 = engine_now_s();
                matmul(y, &w, x, 1, false, scratch);
                st_add(&st, engine_now_s() - t0);
            }
            fprintf(f, "%s{\"type\": \"%s\", \"threads\": %d, \"bytes\": %.6g, ", ti || t > 1 ? ",\n" : "",
                    tname, t, (double)rb * n_out);
            json_rate(f, "gb_s", &st, (double)rb * n_out / 1e9);
            fprintf(f, "}");
            fflush(f);
        }
        free(W);
        free(y);
    }
    fprintf(f, "],\n\"small_batch\": [");
    /* small batches on an ffn_up-sized weight (3584 x 1024), 2 threads */
    int first = 1;
    for (int ti = 0; ti < n_types; ti++) {
        const uint32_t type = types[ti].type;
        const size_t rb = ggml_type_size(type) * n_in / ggml_block_size(type);
        const int n_out = 3584;
        char *W = malloc(rb * (size_t)n_out);
        float *y = malloc(sizeof(float) * (size_t)n_out * 64);
        for (int o = 0; o < n_out; o++) {
            for (int i = 0; i < n_in; i++)
                row[i] = (float)(lcg_next(&s) % 2001) / 1000.0f - 1.0f;
            quantize_row(type, row, W + (size_t)o * rb, n_in);
        }
        weight w = { .data = W, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb };
        W = panels_of(&w, W, types[ti].panels);
        blas_set_threads(2);
        static const int toks[] = { 4, 16, 64 };
        for (int k = 0; k < 3; k++) {
            for (int path = 0; path < 2; path++) {      /* 0: rows x tokens kernel, 1: sgemm (tiles) */
                if (path == 0 && !simd_avx2())
                    continue;
                /* path 0 as a decode step: Q8_0 then takes its int8 kernels (the others the same tile) */
                matmul_set_small_max(path == 0 ? 64 : 1);
                matmul_set_f32_tile_max(path == 0 ? 64 : 0);     /* F32: its tile to 64 tokens, else sgemm */
                stats st = {0};
                matmul(y, &w, x, toks[k], path == 0, scratch);
                for (int r = 0; r < (quick ? 3 : 9); r++) {
                    double t0 = engine_now_s();
                    matmul(y, &w, x, toks[k], path == 0, scratch);
                    st_add(&st, engine_now_s() - t0);
                }
                fprintf(f, "%s{\"type\": \"%s\", \"tokens\": %d, \"path\": \"%s\", ", first ? "" : ",\n",
                        types[ti].name, toks[k], path == 0 ? "rows_x_tokens" : "sgemm");
                first = 0;
                json_rate(f, "gflop_s", &st, 2.0 * n_in * n_out * toks[k] / 1e9);
                fprintf(f, "}");
                fflush(f);
            }
        }
        matmul_set_small_max(16);
        matmul_set_f32_tile_max(-1);
        free(W);
        free(y);
    }
    fprintf(f, "]}\n");
    free(x);
    free(row);
    free(scratch);
    return 0;
}

/* ------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr,
            "usage: hyserve-bench [--quick] [--only SECTIONS] [--ctx8k TYPES] [--state-dtype bf16] [-o OUT.json] COMMAND\n"
            "  info                         OpenBLAS core and CPU features, one line\n"
            "  limits                       triad, sgemv and sgemm at 1 and 2 threads\n"
            "  engine MODEL.gguf DTYPE      prefill, decode and batched decode\n"
            "  kernels                      matmul per weight type: decode GB/s, small batches GFLOP/s\n"
            "  dnet                         DeltaNet chunked vs recurrent kernels, 2048 tokens\n"
            "  dnet-model MODEL.gguf        whole-model prefill, chunked vs recurrent DeltaNet\n"
            "  family MODEL.gguf DTYPE      a hybrid family's model: 512-token prompt (MoE: grouped vs per-row\n"
            "                               experts), decode against the triad\n");
}

int main(int argc, char **argv)
{
    blas_process_init(argv);        /* the kernels and thread waits hyserve itself would run with */
    bool quick = false;
    const char *out = NULL, *only = NULL, *ctx8k = "f32,q8_0";
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--ctx8k") && i + 1 < argc)
            ctx8k = argv[++i];
        else if (!strcmp(argv[i], "--state-dtype") && i + 1 < argc && !strcmp(argv[i + 1], "bf16") && ++i)
            state_dtype = ENGINE_STATE_BF16;
        else {
            usage();
            return 2;
        }
    }
    if (i >= argc) {
        usage();
        return 2;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) {
        perror(out);
        return 1;
    }
    int rc = 2;
    const char *cmd = argv[i];
    if (!strcmp(cmd, "info")) {
        __builtin_cpu_init();
        fprintf(f, "core %s avx2 %d fma %d f16c %d\n", openblas_get_corename(), __builtin_cpu_supports("avx2") ? 1 : 0,
                __builtin_cpu_supports("fma") ? 1 : 0, __builtin_cpu_supports("f16c") ? 1 : 0);
        rc = 0;
    } else if (!strcmp(cmd, "limits")) {
        rc = cmd_limits(f, quick);
    } else if (!strcmp(cmd, "engine") && i + 2 < argc) {
        eng_opts o = { .quick = quick, .only = only, .ctx8k = ctx8k };
        rc = cmd_engine(f, argv[i + 1], argv[i + 2], &o);
    } else if (!strcmp(cmd, "kernels")) {
        rc = cmd_kernels(f, quick);
    } else if (!strcmp(cmd, "dnet")) {
        rc = cmd_dnet(f, quick);
    } else if (!strcmp(cmd, "family") && i + 2 < argc) {
        rc = cmd_family(f, argv[i + 1], argv[i + 2], quick);
    } else if (!strcmp(cmd, "dnet-model") && i + 1 < argc) {
        rc = cmd_dnet_model(f, argv[i + 1], quick);
    } else {
        usage();
    }
    if (out)
        fclose(f);
    return rc;
}

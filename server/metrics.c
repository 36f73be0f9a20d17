/* metrics.c - counters, histograms, /stats JSON and /metrics text.
 *
 * Owns: request counters and latency/size histograms (updated by HTTP
 * threads when a request ends, under one mutex), and rendering them with
 * the scheduler's published numbers. Never includes prompt or output text.
 * Does not own: the cache numbers (engine, published by the scheduler).
 * ref: docs/serving.md 6 (/stats shape) and 7 (metric names).
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "chat.h"
#include "kvevents.h"
#include "metrics.h"
#include "serve.h"

#define HIST_MAX 20

static const double SECONDS_BUCKETS[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                         1, 2.5, 5, 10, 30, 60, 120};
static const double TOKEN_BUCKETS[] = {1, 4, 16, 64, 256, 1024, 4096, 16384, 65536};
static const double BYTE_BUCKETS[] = {1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30, 4294967296.0};

/* Routes as /metrics labels them: the route table's paths, so a client
 * cannot mint label values; anything else is "other". */
static const char *const ROUTE_NAMES[] = {"/", "/generate", "/generate_stream", "/v1/completions",
                                          "/v1/chat/completions", "/v1/completions/render", "/v1/chat/completions/render",
                                          "/v1/models", "/tokenize", "/detokenize",
                                          "/info", "/props", "/health", "/live", "/ready", "/stats", "/metrics",
                                          "/v1/memory/estimate", "/v1/memory/presets", "/reset_prefix_cache", "/requests/{id}",
                                          "/web/{name}", "other"};
#define N_ROUTES ((int)(sizeof(ROUTE_NAMES) / sizeof(ROUTE_NAMES[0])))
/* Statuses the server sends (docs/serving.md 4); any other is counted as 0 ("other"). */
static const int STATUS_CODES[] = {200, 400, 401, 403, 404, 405, 413, 422, 424, 429, 499, 500, 503, 0};
#define N_STATUS ((int)(sizeof(STATUS_CODES) / sizeof(STATUS_CODES[0])))

static int route_index(const char *path)
{
    if (!path)
        return N_ROUTES - 1;
    if (!strncmp(path, "/requests/", 10) && path[10])
        return N_ROUTES - 3;
    if (!strncmp(path, "/web/", 5) && path[5])
        return N_ROUTES - 2;
    for (int i = 0; i < N_ROUTES - 3; i++)
        if (!strcmp(path, ROUTE_NAMES[i]))
            return i;
    return N_ROUTES - 1;
}

static int status_index(int status)
{
    for (int i = 0; i < N_STATUS - 1; i++)
        if (STATUS_CODES[i] == status)
            return i;
    return N_STATUS - 1;
}

/* A Prometheus histogram with fixed upper bounds. */
typedef struct hist {
    const double *bounds;       /* [n] upper bounds, +Inf implied */
    int n;
    uint64_t counts[HIST_MAX];  /* per bucket, not cumulative */
    uint64_t count;
    double sum;
} hist;

enum { FIN_LENGTH, FIN_EOS, FIN_STOP, N_FIN };
static const char *const FIN_NAMES[N_FIN] = {"length", "eos_token", "stop_sequence"};
/* the words the request log writes after finish= (routes.c send_error) */
enum { FAIL_VALIDATION, FAIL_OVERLOADED, FAIL_CANCELLED, FAIL_UNAVAILABLE, FAIL_GENERATION, FAIL_NOT_FOUND,
       FAIL_INTERNAL, N_FAIL };
static const char *const FAIL_NAMES[N_FAIL] = {"validation", "overloaded", "cancelled", "unavailable",
                                               "generation", "not_found", "internal"};

/* Owned by the server; every field under mu. */
struct metrics {
    pthread_mutex_t mu;
    uint64_t http_requests[N_ROUTES][N_STATUS];
    uint64_t success[N_FIN];
    uint64_t failure[N_FAIL];
    hist ttft, e2e, queue, prompt_tokens, gen_tokens, cache_bytes, itl;
    hist prefill, decode;       /* per request: admission -> first token; first token -> last */
};

static void hist_init(hist *h, const double *b, int n)
{
    memset(h, 0, sizeof(*h));
    h->bounds = b;
    h->n = n;
}

static void hist_add(hist *h, double v)
{
    int i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

metrics *metrics_new(void)
{
    metrics *m = fault_calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, SECONDS_BUCKETS, (int)(sizeof(SECONDS_BUCKETS) / sizeof(double)));
    hist_init(&m->e2e, SECONDS_BUCKETS, (int)(sizeof(SECONDS_BUCKETS) / sizeof(double)));
    hist_init(&m->queue, SECONDS_BUCKETS, (int)(sizeof(SECONDS_BUCKETS) / sizeof(double)));
    hist_init(&m->prompt_tokens, TOKEN_BUCKETS, (int)(sizeof(TOKEN_BUCKETS) / sizeof(double)));
    hist_init(&m->gen_tokens, TOKEN_BUCKETS, (int)(sizeof(TOKEN_BUCKETS) / sizeof(double)));
    hist_init(&m->cache_bytes, BYTE_BUCKETS, (int)(sizeof(BYTE_BUCKETS) / sizeof(double)));
    hist_init(&m->itl, SECONDS_BUCKETS, (int)(sizeof(SECONDS_BUCKETS) / sizeof(double)));
    hist_init(&m->prefill, SECONDS_BUCKETS, (int)(sizeof(SECONDS_BUCKETS) / sizeof(double)));
    hist_init(&m->decode, SECONDS_BUCKETS, (int)(sizeof(SECONDS_BUCKETS) / sizeof(double)));
    return m;
}

void metrics_free(metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void metrics_record(metrics *m, const metrics_req *r)
{
    pthread_mutex_lock(&m->mu);
    m->http_requests[route_index(r->path)][status_index(r->status)]++;
    if (r->generation) {
        if (r->finish && r->status == 200) {
            for (int i = 0; i < N_FIN; i++)
                if (!strcmp(r->finish, FIN_NAMES[i]))
                    m->success[i]++;
            hist_add(&m->e2e, r->e2e_s);
            if (r->ttft_s >= 0)
                hist_add(&m->ttft, r->ttft_s);
            if (r->queue_s >= 0)
                hist_add(&m->queue, r->queue_s);
            if (r->ttft_s >= 0 && r->queue_s >= 0 && r->ttft_s >= r->queue_s)
                hist_add(&m->prefill, r->ttft_s - r->queue_s);
            if (r->ttft_s >= 0 && r->e2e_s >= r->ttft_s)
                hist_add(&m->decode, r->e2e_s - r->ttft_s);
            hist_add(&m->prompt_tokens, r->n_prompt);
            hist_add(&m->gen_tokens, r->n_gen);
            hist_add(&m->cache_bytes, (double)r->cache_bytes);
        } else if (r->failure) {
            int k = FAIL_INTERNAL;
            for (int i = 0; i < N_FAIL; i++)
                if (!strcmp(r->failure, FAIL_NAMES[i]))
                    k = i;
            m->failure[k]++;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_itl(metrics *m, double gap_s)
{
    if (gap_s < 0)
        return;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, gap_s);
    pthread_mutex_unlock(&m->mu);
}

/* ---------------------------------------------------------------------- */
/* /metrics                                                               */
/* ---------------------------------------------------------------------- */

typedef struct sbuf {
    char *b;
    size_t len, cap;
    bool oom;
    char label[300];            /* model_name="..." that every series carries, as vLLM's do */
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *s, const char *fmt, ...)
{
    if (s->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = s->cap - s->len;
        int n = vsnprintf(s->b ? s->b + s->len : NULL, s->b ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->oom = true;
            return;
        }
        if (s->b && (size_t)n < room) {
            s->len += (size_t)n;
            return;
        }
        size_t cap = s->cap ? s->cap * 2 : 8192;
        while (cap < s->len + (size_t)n + 1)
            cap *= 2;
        char *nb = fault_realloc(s->b, cap);
        if (!nb) {
            s->oom = true;
            return;
        }
        s->b = nb;
        s->cap = cap;
    }
}

/* The shortest decimal that reads back as v (bucket bounds written
 * exactly: 0.1 as "0.1", 4294967296 in full). */
static void exact_num(char *buf, size_t n, double v)
{
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        snprintf(buf, n, "%.0f", v);    /* integers in full digits: 10, not 1e+01 */
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* One sample: name{labels,model_name="..."} v (labels may be ""; the
 * model label goes last, so a reader matching name{kind="x" still does). */
static void prom_u64(sbuf *s, const char *name, const char *labels, uint64_t v)
{
    sb_printf(s, "%s{%s%s%s} %llu\n", name, labels, labels[0] ? "," : "", s->label, (unsigned long long)v);
}

static void prom_f64(sbuf *s, const char *name, const char *labels, double v)
{
    sb_printf(s, "%s{%s%s%s} %.17g\n", name, labels, labels[0] ? "," : "", s->label, v);
}

/* s->label = model_name="name", the name escaped for a label value
 * (backslash, quote, newline). */
static void set_model_label(sbuf *s, const char *name)
{
    size_t k = (size_t)snprintf(s->label, sizeof(s->label), "model_name=\"");
    for (const char *p = name ? name : ""; *p && k + 4 < sizeof(s->label); p++) {
        if (*p == '\\' || *p == '"' || *p == '\n')
            s->label[k++] = '\\';
        s->label[k++] = *p == '\n' ? 'n' : *p;
    }
    s->label[k++] = '"';
    s->label[k] = '\0';
}

static void prom_hist(sbuf *s, const char *name, const char *help, const hist *h)
{
    sb_printf(s, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    char le[32], lab[48], series[128];
    snprintf(series, sizeof(series), "%s_bucket", name);
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        exact_num(le, sizeof(le), h->bounds[i]);
        snprintf(lab, sizeof(lab), "le=\"%s\"", le);
        prom_u64(s, series, lab, cum);
    }
    prom_u64(s, series, "le=\"+Inf\"", h->count);
    snprintf(series, sizeof(series), "%s_sum", name);
    prom_f64(s, series, "", h->sum);
    snprintf(series, sizeof(series), "%s_count", name);
    prom_u64(s, series, "", h->count);
}

static void prom_gauge(sbuf *s, const char *name, const char *help, double v)
{
    sb_printf(s, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    prom_f64(s, name, "", v);
}

static void prom_counter(sbuf *s, const char *name, const char *help, double v)
{
    sb_printf(s, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    prom_f64(s, name, "", v);
}

/* Speculative decoding (docs/serving.md 17): vLLM's counter names, the
 * acceptance by position in the draft (position 0 the first draft token),
 * and hyserve's rollbacks and held snapshots. */
static void prom_spec(sbuf *s, const sched_stats *st)
{
    prom_counter(s, "vllm:spec_decode_num_drafts_total", "verify steps that carried draft tokens",
                 (double)st->spec.drafts);
    prom_counter(s, "vllm:spec_decode_num_draft_tokens_total", "draft tokens verified", (double)st->spec.drafted);
    prom_counter(s, "vllm:spec_decode_num_accepted_tokens_total", "draft tokens accepted", (double)st->spec.accepted);
    sb_printf(s, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total draft tokens accepted, by position in "
                 "their draft\n# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
    for (int i = 0; i < st->spec_n_max && i < SCHED_SPEC_MAX_POS; i++) {
        char lab[32];
        snprintf(lab, sizeof lab, "position=\"%d\"", i);
        prom_u64(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total", lab, st->spec_accepted_per_pos[i]);
    }
    prom_counter(s, "hyserve_spec_prediction_accepted_tokens_total", "draft tokens from requests' predictions accepted",
                 (double)st->spec.pred_accepted);
    prom_counter(s, "hyserve_spec_prediction_rejected_tokens_total", "draft tokens from requests' predictions rejected",
                 (double)st->spec.pred_rejected);
    prom_counter(s, "hyserve_spec_rollbacks_total", "verify steps that rolled a sequence back past a rejected draft",
                 (double)st->spec.rollbacks);
    prom_counter(s, "hyserve_spec_declined_total", "decode steps whose draft the cost gate declined (its rows "
                 "would cost more time than their expected accepted tokens save)", (double)st->spec.declined);
    prom_gauge(s, "hyserve_spec_snapshot_bytes", "rollback snapshots held by speculating requests (in the cache pool)",
               (double)st->spec_snapshot_bytes);
    if (st->spec_type == SCHED_SPEC_MTP)
        prom_gauge(s, "hyserve_spec_mtp_reserved_bytes", "the MTP block's KV held by speculating requests (its own "
                   "pool)", (double)st->mtp_reserved_bytes);
    if (st->spec_type == SCHED_SPEC_DRAFT)
        prom_gauge(s, "hyserve_spec_draft_reserved_bytes", "the draft model's cache held by draft sequences and "
                   "their snapshots (its own pool)", (double)st->draft_reserved_bytes);
}

/* The prefix cache's counters (docs/serving.md 9). */
static void prom_prefix_cache(sbuf *s, const sched_stats *st)
{
    const prefix_stats *p = &st->prefix;
    prom_counter(s, "hyserve_prefix_cache_hits_total", "admissions that restored some prompt tokens from the prefix cache",
                 (double)p->hits);
    sb_printf(s, "# HELP hyserve_prefix_cache_misses_total admissions that reused nothing or less than the shared "
                 "prefix, by reason\n# TYPE hyserve_prefix_cache_misses_total counter\n");
    for (int r = 1; r < PREFIX_N_REASONS; r++) {
        if (r == PREFIX_OFF)
            continue;
        char lab[64];
        snprintf(lab, sizeof(lab), "reason=\"%s\"", prefix_reason_name(r));
        prom_u64(s, "hyserve_prefix_cache_misses_total", lab, p->misses[r]);
    }
    prom_counter(s, "hyserve_prefix_cache_recomputed_tokens_total",
                 "prompt tokens shared with a cached entry but recomputed from an earlier snapshot",
                 (double)p->recomputed_tokens);
    prom_counter(s, "hyserve_prefix_cache_evictions_total", "prefix cache entries evicted", (double)p->evictions);
    prom_gauge(s, "hyserve_prefix_cache_bytes", "bytes held by the prefix cache's entries", (double)p->bytes);
    prom_gauge(s, "hyserve_prefix_cache_entries", "prefix cache entries", p->n_entries);
}

/* The grammar cache's counters (docs/serving.md, structured output). */
static void prom_grammar_cache(sbuf *s, const sched_grammar_stats *g)
{
    prom_counter(s, "hyserve_grammar_cache_compile_hits_total",
                 "constrained requests that found their grammar compiled", (double)g->compile_hits);
    prom_counter(s, "hyserve_grammar_cache_compiles_total", "constrained requests that compiled their grammar",
                 (double)g->compiles);
    prom_counter(s, "hyserve_grammar_cache_mask_hits_total",
                 "parser states whose token mask a request found computed", (double)g->mask_hits);
    prom_counter(s, "hyserve_grammar_cache_walks_total",
                 "parser states whose token mask a request computed (a vocabulary trie walk)", (double)g->walks);
    prom_counter(s, "hyserve_grammar_cache_evictions_total", "grammars evicted with their masks",
                 (double)g->evictions);
    prom_gauge(s, "hyserve_grammar_cache_bytes", "bytes held by the grammar cache", (double)g->bytes);
    prom_gauge(s, "hyserve_grammar_cache_entries", "token masks held by the grammar cache", g->entries);
    prom_gauge(s, "hyserve_grammar_cache_grammars", "grammars held by the grammar cache", g->grammars);
}

/* The cache utilisation the EPP reads (vllm:kv_cache_usage_perc), a
 * fraction 0..1: the scarcer of the two pools a request needs, attention
 * pages and recurrent slots (docs/serving.md 7): a hybrid that has slots
 * left but no pages, or pages but no slots, admits nothing more. An
 * attention-only model reads its pages, a recurrent-only one its slots.
 * The same ratios as /stats pools.attn_kv.usage_ratio and
 * pools.recurrent.usage_ratio. */
static double usage_fraction(const sched_stats *st, const engine_info *in)
{
    if (!in)
        return 0.0;
    double attn = st->pool.n_pages_total > 0 ? (double)st->pool.n_pages_used / st->pool.n_pages_total : 0.0;
    double rec = in->n_rec_layers > 0 && in->max_seqs > 0 ? (double)st->pool.n_seqs / in->max_seqs : 0.0;
    double u = attn > rec ? attn : rec;
    return u > 1.0 ? 1.0 : u;
}

/* The series the Gateway API Inference Extension's endpoint picker reads,
 * under vLLM's names (its default mapping) and SGLang's cache info
 * (GIE docs/proposals/003-model-server-protocol; llm-d-inference-scheduler
 * core-metrics-extractor). The hyserve_* names carry the same numbers. */
static void prom_gateway(sbuf *s, const sched_stats *st, const engine_info *in)
{
    prom_gauge(s, "vllm:num_requests_waiting", "requests in the wait queue (hyserve_requests_waiting)", st->waiting);
    prom_gauge(s, "vllm:num_requests_running", "requests holding a sequence (hyserve_requests_running)", st->running);
    prom_gauge(s, "vllm:kv_cache_usage_perc",
               "cache utilisation 0..1: the larger of attention pages used / total and recurrent slots used / total "
               "(hyserve_cache_utilisation_ratio)", usage_fraction(st, in));
    if (!in)
        return;
    char lab[256];
    /* info gauges: value 1, the numbers in labels (block_size and
     * num_gpu_blocks are the labels the EPP's prefix scorer reads) */
    sb_printf(s, "# HELP vllm:cache_config_info the KV cache's configuration (block_size: tokens per page)\n"
                 "# TYPE vllm:cache_config_info gauge\n");
    snprintf(lab, sizeof(lab), "block_size=\"%d\",num_gpu_blocks=\"%d\",cache_dtype=\"%s\",enable_prefix_caching=\"%s\"",
             in->page_tokens, st->pool.n_pages_total, in->kv_dtype ? in->kv_dtype : "f32",
             st->prefix_on ? "True" : "False");
    prom_u64(s, "vllm:cache_config_info", lab, 1);
    sb_printf(s, "# HELP sglang:cache_config_info the KV cache's configuration (page_size: tokens per page)\n"
                 "# TYPE sglang:cache_config_info gauge\n");
    snprintf(lab, sizeof(lab), "page_size=\"%d\",num_pages=\"%d\"", in->page_tokens, st->pool.n_pages_total);
    prom_u64(s, "sglang:cache_config_info", lab, 1);
}

char *metrics_prometheus(server *srv)
{
    sbuf s = {0};
    sched_stats st = {0};
    sched_live_totals lt = {0};
    int state = atomic_load(&srv->state);
    bool have = state == SERVER_READY || state == SERVER_DRAINING;
    /* the published numbers only: a scrape never waits for the scheduler
     * thread (sched_get_published), whatever the load */
    if (have)
        sched_get_published(srv->sched, &st, &lt);
    const uint64_t b_kv = lt.kv_bytes, b_mla = lt.mla_bytes, b_state = lt.state_bytes, b_conv = lt.conv_bytes,
                   tok_used = lt.tokens, n_slots = (uint64_t)lt.n_slots;
    const engine_info *in = have ? srv->info : NULL;
    set_model_label(&s, in ? server_model_name(srv) : "");

    char lab[512];
    sb_printf(&s, "# HELP hyserve_build_info the build: version and git commit\n# TYPE hyserve_build_info gauge\n");
    snprintf(lab, sizeof(lab), "version=\"%s\",git_commit=\"%s\"", hyserve_version(), hyserve_git_commit());
    prom_u64(&s, "hyserve_build_info", lab, 1);
    prom_gauge(&s, "hyserve_ready", "1 when the server accepts new work", state == SERVER_READY);
    prom_gauge(&s, "hyserve_draining", "1 after SIGTERM while in-flight requests finish", state == SERVER_DRAINING);
    prom_gauge(&s, "hyserve_requests_running", "requests holding a sequence (prefill or decode)", st.running);
    prom_gauge(&s, "hyserve_requests_waiting", "requests in the wait queue", st.waiting);
    double budget = (double)st.pool.budget_bytes;
    prom_gauge(&s, "hyserve_cache_budget_bytes", "cache budget (attention KV + recurrent state)", budget);
    prom_gauge(&s, "hyserve_cache_reserved_bytes", "cache bytes reserved by live sequences",
               (double)st.pool.reserved_bytes);
    prom_gauge(&s, "hyserve_cache_usage_ratio", "reserved / budget",
               budget > 0 ? (double)st.pool.reserved_bytes / budget : 0.0);
    prom_gauge(&s, "hyserve_attn_kv_usage_ratio", "attention KV pages used / total",
               st.pool.n_pages_total > 0 ? (double)st.pool.n_pages_used / st.pool.n_pages_total : 0.0);
    prom_gauge(&s, "hyserve_cache_utilisation_ratio",
               "the scarcer pool's use: max(attention pages used / total, recurrent slots used / total)",
               usage_fraction(&st, in));
    prom_gateway(&s, &st, in);
    static const char *const kinds[] = {"attn_kv", "mla_latent", "recurrent_state", "conv_state", "checkpoint",
                                        "prefix_cache"};
    const uint64_t kind_bytes[] = {b_kv, b_mla, b_state, b_conv, 0, st.prefix.bytes};
    sb_printf(&s, "# HELP hyserve_cache_bytes cache bytes reserved by live requests, by kind\n"
                  "# TYPE hyserve_cache_bytes gauge\n");
    for (int i = 0; i < 6; i++) {
        snprintf(lab, sizeof(lab), "kind=\"%s\"", kinds[i]);
        prom_u64(&s, "hyserve_cache_bytes", lab, kind_bytes[i]);
    }
    if (in && in->n_rec_layers) {
        /* the same recurrent bytes by the layer kind holding them (each live slot holds every kind's part) */
        const struct { const char *kind; uint64_t state, conv; } rk[] = {
            { "gated_deltanet", in->dnet_state_bytes_per_seq, in->dnet_conv_bytes_per_seq },
            { "mamba2", in->mamba2_state_bytes_per_seq, in->mamba2_conv_bytes_per_seq },
            { "mamba", in->mamba_state_bytes_per_seq, in->mamba_conv_bytes_per_seq },
            { "kda", in->kda_state_bytes_per_seq, in->kda_conv_bytes_per_seq },
            { "short_conv", 0, in->sconv_bytes_per_seq },
        };
        sb_printf(&s, "# HELP hyserve_recurrent_bytes recurrent cache bytes of live requests by layer kind and part\n"
                      "# TYPE hyserve_recurrent_bytes gauge\n");
        for (size_t i = 0; i < sizeof rk / sizeof rk[0]; i++) {
            if (!rk[i].state && !rk[i].conv)
                continue;
            snprintf(lab, sizeof(lab), "layer_kind=\"%s\",part=\"state\"", rk[i].kind);
            prom_u64(&s, "hyserve_recurrent_bytes", lab, n_slots * rk[i].state);
            snprintf(lab, sizeof(lab), "layer_kind=\"%s\",part=\"conv\"", rk[i].kind);
            prom_u64(&s, "hyserve_recurrent_bytes", lab, n_slots * rk[i].conv);
        }
    }
    double tok_cap = in ? (double)st.pool.n_pages_total * in->page_tokens : 0.0;
    prom_gauge(&s, "hyserve_attn_kv_token_usage_ratio", "filled token slots / token capacity of the KV pool",
               tok_cap > 0 ? (double)tok_used / tok_cap : 0.0);
    if (in) {
        sb_printf(&s, "# HELP hyserve_device_memory_bytes memory by use\n# TYPE hyserve_device_memory_bytes gauge\n");
        prom_u64(&s, "hyserve_device_memory_bytes", "device=\"cpu\",kind=\"weights\"", in->weight_bytes);
        prom_u64(&s, "hyserve_device_memory_bytes", "device=\"cpu\",kind=\"kv_pool\"", b_kv + b_mla);
        prom_u64(&s, "hyserve_device_memory_bytes", "device=\"cpu\",kind=\"state_pool\"", b_state + b_conv);
    }
    prom_gauge(&s, "hyserve_recurrent_slots_used", "DeltaNet state slots in use", st.pool.n_seqs);
    prom_gauge(&s, "hyserve_recurrent_slots", "DeltaNet state slots (max sequences)", in ? in->max_seqs : 0);
    /* tokens fed per engine step (decode tokens + prompt tokens): the batch
     * the engine ran, as a histogram rather than last/max gauges */
    hist steps;
    static const double STEP_BUCKETS[SCHED_STEP_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
    hist_init(&steps, STEP_BUCKETS, SCHED_STEP_BUCKETS);
    for (int i = 0; i <= SCHED_STEP_BUCKETS; i++) {
        steps.counts[i] = st.step_tokens[i];
        steps.count += st.step_tokens[i];
    }
    steps.sum = (double)st.step_tokens_sum;
    prom_hist(&s, "hyserve_engine_step_tokens", "tokens fed to the engine per step (decode + prompt)", &steps);
    prom_counter(&s, "hyserve_engine_steps_total", "engine forward steps", (double)st.steps_total);
    prom_counter(&s, "hyserve_engine_decode_steps_total", "engine steps that only decoded", (double)st.decode_steps_total);
    prom_counter(&s, "hyserve_engine_decode_seconds_total", "time inside the engine in decode-only steps",
                 st.decode_forward_seconds);
    prom_counter(&s, "hyserve_prompt_tokens_total", "prompt tokens prefilled", (double)st.prompt_tokens_total);
    prom_counter(&s, "hyserve_generation_tokens_total", "tokens generated", (double)st.generation_tokens_total);
    prom_counter(&s, "hyserve_cached_tokens_total", "prompt tokens served from a prefix cache",
                 (double)st.prefix.reused_tokens);
    prom_prefix_cache(&s, &st);
    kvev_stats kvs;
    kvev_get_stats(have ? srv->kv_events : NULL, &kvs);    /* zeros without --kv-events */
    prom_counter(&s, "hyserve_kv_events_published_total", "KV events (BlockStored, BlockRemoved, AllBlocksCleared) "
                 "sent on the --kv-events socket", (double)kvs.published);
    prom_counter(&s, "hyserve_kv_events_dropped_total", "KV events dropped: the publisher's queue was full (or out "
                 "of memory)", (double)kvs.dropped);
    prom_gauge(&s, "hyserve_kv_events_queued", "KV events waiting for the publisher thread", kvs.queued);
    prom_grammar_cache(&s, &st.grammar);
    prom_spec(&s, &st);
    prom_counter(&s, "hyserve_preemptions_total", "requests preempted", 0);
    sb_printf(&s, "# HELP hyserve_rejected_total requests refused before admission\n"
                  "# TYPE hyserve_rejected_total counter\n");
    prom_u64(&s, "hyserve_rejected_total", "reason=\"queue_full\"", st.rejected_full_total);
    prom_u64(&s, "hyserve_rejected_total", "reason=\"queue_timeout\"", st.rejected_timeout_total);
    prom_u64(&s, "hyserve_rejected_total", "reason=\"too_big\"", st.rejected_toobig_total);
    if (in) {
        sb_printf(&s, "# HELP hyserve_cache_config_info cache layout\n# TYPE hyserve_cache_config_info gauge\n");
        snprintf(lab, sizeof(lab), "block_tokens=\"%d\",num_blocks=\"%d\",kv_dtype=\"%s\",state_dtype=\"%s\","
                      "kv_bytes_per_token=\"%llu\",mla_bytes_per_token=\"%llu\",state_bytes_per_seq=\"%llu\"",
                  in->page_tokens, st.pool.n_pages_total, in->kv_dtype ? in->kv_dtype : "f32", in->state_dtype ? in->state_dtype : "f32",
                  (unsigned long long)in->kv_bytes_per_token,
                  (unsigned long long)in->mla_bytes_per_token,
                  (unsigned long long)(in->rec_state_bytes_per_seq + in->rec_conv_bytes_per_seq));
        prom_u64(&s, "hyserve_cache_config_info", lab, 1);
    }

    metrics *m = srv->m;
    pthread_mutex_lock(&m->mu);
    sb_printf(&s, "# HELP hyserve_http_requests_total HTTP requests answered, by route and status\n"
                  "# TYPE hyserve_http_requests_total counter\n");
    for (int r = 0; r < N_ROUTES; r++) {
        for (int k = 0; k < N_STATUS; k++) {
            if (!m->http_requests[r][k])
                continue;   /* a series appears with its first request */
            char code[8];
            snprintf(code, sizeof(code), "%d", STATUS_CODES[k]);
            snprintf(lab, sizeof(lab), "route=\"%s\",status=\"%s\"", ROUTE_NAMES[r], STATUS_CODES[k] ? code : "other");
            prom_u64(&s, "hyserve_http_requests_total", lab, m->http_requests[r][k]);
        }
    }
    sb_printf(&s, "# HELP hyserve_request_success_total generations that completed\n"
                  "# TYPE hyserve_request_success_total counter\n");
    for (int i = 0; i < N_FIN; i++) {
        snprintf(lab, sizeof(lab), "finish_reason=\"%s\"", FIN_NAMES[i]);
        prom_u64(&s, "hyserve_request_success_total", lab, m->success[i]);
    }
    sb_printf(&s, "# HELP hyserve_request_failure_total generation requests that failed, by the reason the log "
                  "line gives\n# TYPE hyserve_request_failure_total counter\n");
    for (int i = 0; i < N_FAIL; i++) {
        snprintf(lab, sizeof(lab), "reason=\"%s\"", FAIL_NAMES[i]);
        prom_u64(&s, "hyserve_request_failure_total", lab, m->failure[i]);
    }
    prom_hist(&s, "hyserve_time_to_first_token_seconds", "request arrival to first token", &m->ttft);
    prom_hist(&s, "hyserve_inter_token_latency_seconds", "time between two sampled tokens of a request", &m->itl);
    prom_hist(&s, "hyserve_e2e_request_latency_seconds", "request arrival to last byte", &m->e2e);
    prom_hist(&s, "hyserve_request_queue_time_seconds", "time waiting for admission", &m->queue);
    prom_hist(&s, "hyserve_request_prompt_tokens", "prompt tokens per request", &m->prompt_tokens);
    prom_hist(&s, "hyserve_request_generation_tokens", "generated tokens per request", &m->gen_tokens);
    prom_hist(&s, "hyserve_request_cache_bytes", "peak cache bytes per request", &m->cache_bytes);
    prom_hist(&s, "hyserve_request_prefill_time_seconds", "admission to first token, per request", &m->prefill);
    prom_hist(&s, "hyserve_request_decode_time_seconds", "first token to the end, per request", &m->decode);
    pthread_mutex_unlock(&m->mu);
    if (s.oom) {
        free(s.b);
        return NULL;
    }
    return s.b;
}

/* ---------------------------------------------------------------------- */
/* /stats                                                                 */
/* ---------------------------------------------------------------------- */

/* The prefix cache's /stats object: the store, its snapshots by kind, and
 * why lookups reused what they did. */
static void prefix_cache_json(cJSON *pc, const sched_stats *st, const engine_info *in)
{
    if (!pc)
        return;
    const prefix_stats *p = &st->prefix;
    cJSON_AddBoolToObject(pc, "enabled", st->prefix_on);
    if (!st->prefix_on)
        return;
    cJSON_AddNumberToObject(pc, "entries", p->n_entries);
    cJSON_AddNumberToObject(pc, "bytes", (double)p->bytes);
    cJSON_AddNumberToObject(pc, "budget_bytes", (double)p->budget_bytes);
    cJSON_AddNumberToObject(pc, "attn_kv_bytes", (double)p->kv_bytes);
    cJSON_AddNumberToObject(pc, "recurrent_state_bytes", (double)p->state_bytes);
    cJSON_AddNumberToObject(pc, "conv_state_bytes", (double)p->conv_bytes);
    cJSON_AddNumberToObject(pc, "snapshots", p->n_snapshots);
    cJSON_AddNumberToObject(pc, "snapshot_bytes_each",
                            (double)(in->n_rec_layers ? in->rec_state_bytes_per_seq + in->rec_conv_bytes_per_seq : 0));
    cJSON_AddNumberToObject(pc, "snapshot_state_bytes_held", (double)st->pool.snap_state_bytes);
    cJSON_AddNumberToObject(pc, "snapshot_conv_bytes_held", (double)st->pool.snap_conv_bytes);
    cJSON_AddNumberToObject(pc, "lookups", (double)p->lookups);
    cJSON_AddNumberToObject(pc, "hits", (double)p->hits);
    cJSON *m = cJSON_AddObjectToObject(pc, "misses_by_reason");
    for (int r = 1; r < PREFIX_N_REASONS; r++)
        if (r != PREFIX_OFF)
            cJSON_AddNumberToObject(m, prefix_reason_name(r), (double)p->misses[r]);
    cJSON_AddNumberToObject(pc, "reused_tokens", (double)p->reused_tokens);
    cJSON_AddNumberToObject(pc, "recomputed_tokens", (double)p->recomputed_tokens);
    cJSON_AddNumberToObject(pc, "evictions", (double)p->evictions);
}

/* "gateway": the request's x-llm-d-* headers as the gateway sent them
 * (http.c keeps them as name=value pairs), e.g. {"x-llm-d-pod": "..."}. */
static void add_gateway_tags(cJSON *o, const char *tags)
{
    if (!tags[0])
        return;
    cJSON *g = cJSON_AddObjectToObject(o, "gateway");
    char buf[SCHED_TAGS_MAX];
    snprintf(buf, sizeof buf, "%s", tags);
    char *save = NULL;
    for (char *t = strtok_r(buf, " ", &save); g && t; t = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(t, '=');
        if (!eq)
            continue;
        *eq = '\0';
        cJSON_AddStringToObject(g, t, eq + 1);
    }
}

static cJSON *request_json(const sched_req_stats *q, const engine_info *in)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", q->id);
    add_gateway_tags(o, q->tags);
    cJSON_AddStringToObject(o, "state", q->state);
    cJSON_AddNumberToObject(o, "age_ms", (double)(long long)q->age_ms);
    cJSON_AddNumberToObject(o, "prompt_tokens", q->prompt_tokens);
    cJSON_AddNumberToObject(o, "prefilled_tokens", q->prefilled_tokens);
    cJSON_AddNumberToObject(o, "generated_tokens", q->generated_tokens);
    cJSON_AddNumberToObject(o, "max_new_tokens", q->max_new_tokens);
    cJSON_AddNumberToObject(o, "cached_tokens", q->cached_tokens);
    if (q->prefix_reason != PREFIX_OFF && strcmp(q->state, "queued")) {
        cJSON *pc = cJSON_AddObjectToObject(o, "prefix_cache");
        cJSON_AddStringToObject(pc, "result", prefix_reason_name(q->prefix_reason));
        cJSON_AddNumberToObject(pc, "shared_prefix_tokens", q->prefix_diverged_at);
        cJSON_AddNumberToObject(pc, "recomputed_tokens", q->prefix_diverged_at > q->cached_tokens
                                                              ? q->prefix_diverged_at - q->cached_tokens : 0);
    }
    const engine_seq_usage *u = &q->usage;
    /* reserved = whole pages held; used = filled token slots */
    cJSON *kv = cJSON_AddObjectToObject(o, "attn_kv");
    cJSON_AddNumberToObject(kv, "blocks", in->page_tokens ? u->n_reserved_tokens / in->page_tokens : 0);
    cJSON_AddNumberToObject(kv, "tokens", u->n_tokens);
    cJSON_AddNumberToObject(kv, "tokens_reserved", u->n_reserved_tokens);
    cJSON_AddNumberToObject(kv, "bytes_reserved", (double)(u->kv_reserved_bytes + u->mla_reserved_bytes));
    cJSON_AddNumberToObject(kv, "bytes_used", (double)(u->kv_used_bytes + u->mla_used_bytes));
    cJSON_AddNumberToObject(kv, "blocks_shared", u->n_shared_pages);   /* held by another sequence too */
    cJSON_AddNumberToObject(kv, "bytes_shared", (double)u->shared_bytes);
    cJSON_AddNumberToObject(kv, "bytes_owned", (double)(u->kv_reserved_bytes + u->mla_reserved_bytes - u->shared_bytes));
    cJSON *rec = cJSON_AddObjectToObject(o, "recurrent");
    bool has_state = u->rec_state_bytes + u->rec_conv_bytes > 0;
    cJSON_AddNumberToObject(rec, "slots", has_state ? 1 : 0);
    cJSON_AddNumberToObject(rec, "state_bytes", (double)u->rec_state_bytes);
    cJSON_AddNumberToObject(rec, "conv_bytes", (double)u->rec_conv_bytes);
    cJSON_AddNumberToObject(rec, "bytes", (double)(u->rec_state_bytes + u->rec_conv_bytes));
    cJSON_AddNumberToObject(rec, "checkpoints", q->n_snapshots);      /* recurrent snapshots for the prefix cache */
    /* and a speculating request's rollback snapshot (its own "speculative" says how much of them) */
    cJSON_AddNumberToObject(rec, "checkpoint_bytes", (double)(q->snapshot_bytes + q->spec_snapshot_bytes));
    if (q->spec_on) {
        cJSON *sp = cJSON_AddObjectToObject(o, "speculative");
        cJSON_AddNumberToObject(sp, "rollback_snapshot_bytes", (double)q->spec_snapshot_bytes);
        cJSON_AddNumberToObject(sp, "verify_steps", (double)q->spec.drafts);
        cJSON_AddNumberToObject(sp, "draft_tokens", (double)q->spec.drafted);
        cJSON_AddNumberToObject(sp, "accepted_tokens", (double)q->spec.accepted);
        cJSON_AddNumberToObject(sp, "declined_steps", (double)q->spec.declined);
        if (in && in->mtp_enabled) {    /* its MTP rows: the MTP pool's, not in the bytes above */
            cJSON_AddNumberToObject(sp, "mtp_rows", u->mtp_tokens);
            cJSON_AddNumberToObject(sp, "mtp_reserved_bytes", (double)u->mtp_reserved_bytes);
        }
    }
    /* the same bytes by layer kind, and what plain MHA would hold */
    cJSON *by = cJSON_AddObjectToObject(o, "cache_by_kind");
    cJSON *g = cJSON_AddObjectToObject(by, "gqa_kv");
    cJSON_AddNumberToObject(g, "bytes_reserved", (double)u->kv_reserved_bytes);
    cJSON_AddNumberToObject(g, "bytes_used", (double)u->kv_used_bytes);
    cJSON *ml = cJSON_AddObjectToObject(by, "mla_latent");
    cJSON_AddNumberToObject(ml, "bytes_reserved", (double)u->mla_reserved_bytes);
    cJSON_AddNumberToObject(ml, "bytes_used", (double)u->mla_used_bytes);
    /* a live sequence holds its whole slot (all of it, then each kind's part) */
    const bool slot = has_state;
    cJSON_AddNumberToObject(by, "recurrent_state_bytes", (double)u->rec_state_bytes);
    cJSON_AddNumberToObject(by, "recurrent_conv_bytes", (double)u->rec_conv_bytes);
    cJSON_AddNumberToObject(by, "deltanet_state_bytes", slot ? (double)in->dnet_state_bytes_per_seq : 0.0);
    cJSON_AddNumberToObject(by, "deltanet_conv_bytes", slot ? (double)in->dnet_conv_bytes_per_seq : 0.0);
    if (in->n_mamba2_layers) {
        cJSON_AddNumberToObject(by, "mamba2_state_bytes", slot ? (double)in->mamba2_state_bytes_per_seq : 0.0);
        cJSON_AddNumberToObject(by, "mamba2_conv_bytes", slot ? (double)in->mamba2_conv_bytes_per_seq : 0.0);
    }
    if (in->n_sconv_layers)
        cJSON_AddNumberToObject(by, "shortconv_conv_bytes", slot ? (double)in->sconv_bytes_per_seq : 0.0);
    if (in->n_kda_layers) {
        cJSON_AddNumberToObject(by, "kda_state_bytes", slot ? (double)in->kda_state_bytes_per_seq : 0.0);
        cJSON_AddNumberToObject(by, "kda_conv_bytes", slot ? (double)in->kda_conv_bytes_per_seq : 0.0);
    }
    if (in->n_mamba_layers) {
        cJSON_AddNumberToObject(by, "mamba_state_bytes", slot ? (double)in->mamba_state_bytes_per_seq : 0.0);
        cJSON_AddNumberToObject(by, "mamba_conv_bytes", slot ? (double)in->mamba_conv_bytes_per_seq : 0.0);
    }
    cJSON_AddNumberToObject(o, "mha_equivalent_bytes", (double)((uint64_t)u->n_tokens * in->mha_bytes_per_token));
    cJSON_AddNumberToObject(o, "total_bytes_owned", (double)u->total_reserved_bytes);
    return o;
}

/* Total and available memory of this machine, from /proc/meminfo. */
static void mem_info(uint64_t *total, uint64_t *avail)
{
    *total = *avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            *total = kb * 1024;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            *avail = kb * 1024;
    }
    fclose(f);
}

cJSON *metrics_stats_json(server *srv, const char *request_id, bool with_requests, int viewer)
{
    sched_stats st;
    sched_req_stats *reqs = NULL;
    int n_reqs = 0;
    if (sched_get_stats(srv->sched, &st, &reqs, &n_reqs))
        return NULL;
    const engine_info *in = srv->info;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        goto out;

    cJSON *model = cJSON_AddObjectToObject(o, "model");
    /* the name requests send (GET /v1/models' id); general.name beside it */
    cJSON_AddStringToObject(model, "id", server_model_name(srv));
    cJSON_AddStringToObject(model, "general_name", in->name);
    cJSON_AddStringToObject(model, "arch", in->arch);
    cJSON_AddNumberToObject(model, "weights_bytes", (double)in->weight_bytes);
    cJSON_AddStringToObject(model, "weights_dtype", in->weights_dtype);
    /* the layout one letter a layer, as `hyserve info` and synth --pattern
     * write it: A attention (GQA KV), L Gated DeltaNet, M MLA */
    char layers[1024];
    int nl = in->n_layer < (int)sizeof(layers) - 1 ? in->n_layer : (int)sizeof(layers) - 1;
    for (int il = 0; il < nl; il++)
        layers[il] = engine_layer_letter(in->layer_kind[il]);
    layers[nl] = '\0';
    cJSON_AddNumberToObject(model, "n_layer", in->n_layer);
    cJSON_AddStringToObject(model, "layers", layers);
    cJSON_AddStringToObject(model, "weights_memory", in->weights_memory);
    cJSON_AddNumberToObject(model, "weights_in_panels", in->weights_in_panels);
    if (in->weights_note[0])    /* --huge-pages asked for, and why the weights stayed mapped */
        cJSON_AddStringToObject(model, "weights_memory_note", in->weights_note);
    cJSON *lay = cJSON_AddObjectToObject(model, "cache_layout");
    cJSON_AddStringToObject(lay, "kind", in->n_rec_layers > 0 && (in->n_attn_layers + in->n_mla_layers) > 0
                                             ? "hybrid"
                                             : in->n_rec_layers > 0 ? "recurrent" : "attention");
    cJSON_AddNumberToObject(lay, "block_tokens", in->page_tokens);
    if (in->n_attn_layers > 0) {
        cJSON *a = cJSON_AddObjectToObject(lay, "attention");
        cJSON_AddStringToObject(a, "type", memplan_attn_kind(in->n_head, in->n_head_kv));
        cJSON_AddNumberToObject(a, "layers", in->n_attn_layers);
        cJSON_AddNumberToObject(a, "kv_heads", in->n_head_kv);
        cJSON_AddNumberToObject(a, "head_dim", in->head_dim);
        cJSON_AddStringToObject(a, "dtype", in->kv_dtype ? in->kv_dtype : "f32");
        cJSON_AddNumberToObject(a, "bytes_per_token", (double)in->kv_bytes_per_token);
    }
    if (in->n_rec_layers > 0) {
        /* the slot in all (what a sequence and a snapshot hold), then each
         * recurrent kind's part; "type" names the kind when there is one */
        cJSON *r = cJSON_AddObjectToObject(lay, "recurrent");
        const int kinds = (in->n_dnet_layers > 0) + (in->n_mamba2_layers > 0) + (in->n_sconv_layers > 0) +
                          (in->n_mamba_layers > 0) + (in->n_kda_layers > 0);
        cJSON_AddStringToObject(r, "type", kinds > 1 ? "mixed" : in->n_dnet_layers ? "gated_deltanet"
                                                             : in->n_mamba2_layers ? "mamba2"
                                                             : in->n_mamba_layers ? "mamba"
                                                             : in->n_kda_layers ? "kda" : "short_conv");
        cJSON_AddNumberToObject(r, "layers", in->n_rec_layers);
        cJSON_AddNumberToObject(r, "ssm_state_bytes_per_seq", (double)in->rec_state_bytes_per_seq);
        cJSON_AddNumberToObject(r, "conv_state_bytes_per_seq", (double)in->rec_conv_bytes_per_seq);
        cJSON_AddStringToObject(r, "dtype", in->state_dtype ? in->state_dtype : "f32");
        cJSON_AddStringToObject(r, "conv_dtype", "f32");
        cJSON_AddNumberToObject(r, "bytes_per_seq", (double)(in->rec_state_bytes_per_seq + in->rec_conv_bytes_per_seq));
        cJSON *k = cJSON_AddObjectToObject(r, "by_kind");
        if (in->n_dnet_layers) {
            cJSON *d = cJSON_AddObjectToObject(k, "gated_deltanet");
            cJSON_AddNumberToObject(d, "layers", in->n_dnet_layers);
            cJSON_AddNumberToObject(d, "ssm_state_bytes_per_seq", (double)in->dnet_state_bytes_per_seq);
            cJSON_AddNumberToObject(d, "conv_state_bytes_per_seq", (double)in->dnet_conv_bytes_per_seq);
        }
        if (in->n_mamba2_layers) {
            cJSON *d = cJSON_AddObjectToObject(k, "mamba2");
            cJSON_AddNumberToObject(d, "layers", in->n_mamba2_layers);
            cJSON_AddNumberToObject(d, "heads", in->mamba2_heads);
            cJSON_AddNumberToObject(d, "head_dim", in->mamba2_head_dim);
            cJSON_AddNumberToObject(d, "d_state", in->mamba2_d_state);
            cJSON_AddNumberToObject(d, "groups", in->mamba2_groups);
            cJSON_AddNumberToObject(d, "ssm_state_bytes_per_seq", (double)in->mamba2_state_bytes_per_seq);
            cJSON_AddNumberToObject(d, "conv_state_bytes_per_seq", (double)in->mamba2_conv_bytes_per_seq);
        }
        if (in->n_kda_layers) {
            cJSON *d = cJSON_AddObjectToObject(k, "kda");
            cJSON_AddNumberToObject(d, "layers", in->n_kda_layers);
            cJSON_AddNumberToObject(d, "heads", in->kda_heads);
            cJSON_AddNumberToObject(d, "head_dim", in->kda_head_dim);
            cJSON_AddNumberToObject(d, "ssm_state_bytes_per_seq", (double)in->kda_state_bytes_per_seq);
            cJSON_AddNumberToObject(d, "conv_state_bytes_per_seq", (double)in->kda_conv_bytes_per_seq);
        }
        if (in->n_mamba_layers) {
            cJSON *d = cJSON_AddObjectToObject(k, "mamba");
            cJSON_AddNumberToObject(d, "layers", in->n_mamba_layers);
            cJSON_AddNumberToObject(d, "d_inner", in->mamba_d_inner);
            cJSON_AddNumberToObject(d, "d_state", in->mamba_d_state);
            cJSON_AddNumberToObject(d, "ssm_state_bytes_per_seq", (double)in->mamba_state_bytes_per_seq);
            cJSON_AddNumberToObject(d, "conv_state_bytes_per_seq", (double)in->mamba_conv_bytes_per_seq);
        }
        if (in->n_sconv_layers) {
            cJSON *d = cJSON_AddObjectToObject(k, "short_conv");
            cJSON_AddNumberToObject(d, "layers", in->n_sconv_layers);
            cJSON_AddNumberToObject(d, "conv_state_bytes_per_seq", (double)in->sconv_bytes_per_seq);
        }
    }
    if (in->n_mla_layers > 0) {
        cJSON *a = cJSON_AddObjectToObject(lay, "mla");
        cJSON_AddStringToObject(a, "type", "mla");
        cJSON_AddNumberToObject(a, "layers", in->n_mla_layers);
        cJSON_AddNumberToObject(a, "kv_lora_rank", in->mla_kv_lora_rank);
        cJSON_AddNumberToObject(a, "rope_dim", in->mla_rope_dim);
        cJSON_AddStringToObject(a, "dtype", in->kv_dtype ? in->kv_dtype : "f32");
        cJSON_AddNumberToObject(a, "bytes_per_token", (double)in->mla_bytes_per_token);
    }
    cJSON_AddNumberToObject(lay, "bytes_per_token", (double)(in->kv_bytes_per_token + in->mla_bytes_per_token));
    cJSON_AddNumberToObject(lay, "bytes_per_seq", (double)(in->rec_state_bytes_per_seq + in->rec_conv_bytes_per_seq));
    cJSON_AddNumberToObject(lay, "mha_bytes_per_token", (double)in->mha_bytes_per_token);
    cJSON_AddNumberToObject(lay, "all_attention_bytes_per_token", (double)in->all_attention_bytes_per_token);

    cJSON *lim = cJSON_AddObjectToObject(o, "limits");
    cJSON_AddNumberToObject(lim, "max_input_tokens", in->n_ctx - 1);
    cJSON_AddNumberToObject(lim, "max_total_tokens", in->n_ctx);
    /* TGI's meaning, as /info has it: requests held at once, running or queued */
    cJSON_AddNumberToObject(lim, "max_concurrent_requests", in->max_seqs + srv->cfg->max_queue);
    cJSON_AddNumberToObject(lim, "max_running_requests", in->max_seqs);
    cJSON_AddNumberToObject(lim, "max_queue", srv->cfg->max_queue);

    /* totals by kind over the live requests (computed first: the device and
     * pool sections use them) */
    uint64_t t_kv = 0, t_mla = 0, t_state = 0, t_conv = 0, t_all = 0, t_tok = 0, t_snap = 0;
    for (int i = 0; i < n_reqs; i++) {
        const engine_seq_usage *u = &reqs[i].usage;
        t_kv += u->kv_reserved_bytes;
        t_mla += u->mla_reserved_bytes;
        t_state += u->rec_state_bytes;
        t_conv += u->rec_conv_bytes;
        t_all += u->total_reserved_bytes;
        t_tok += (uint64_t)u->n_tokens;
        t_snap += reqs[i].snapshot_bytes + reqs[i].spec_snapshot_bytes;
    }
    uint64_t mem_total, mem_avail;
    mem_info(&mem_total, &mem_avail);
    cJSON *devs = cJSON_AddArrayToObject(o, "devices");
    cJSON *dev = cJSON_CreateObject();
    json_push(devs, dev);
    cJSON_AddNumberToObject(dev, "id", 0);
    cJSON_AddStringToObject(dev, "name", "cpu");
    cJSON_AddNumberToObject(dev, "total_bytes", (double)mem_total);
    cJSON_AddNumberToObject(dev, "free_bytes", (double)mem_avail);
    cJSON *self = cJSON_AddObjectToObject(dev, "self");
    cJSON_AddNumberToObject(self, "weights_bytes", (double)in->weight_bytes);
    cJSON_AddNumberToObject(self, "attn_kv_pool_bytes", (double)(t_kv + t_mla));
    cJSON_AddNumberToObject(self, "recurrent_pool_bytes", (double)(t_state + t_conv));
    cJSON_AddNumberToObject(self, "checkpoint_bytes", 0);
    cJSON_AddNumberToObject(self, "cache_budget_bytes", (double)st.pool.budget_bytes);

    cJSON *pools = cJSON_AddObjectToObject(o, "pools");
    cJSON_AddNumberToObject(pools, "budget_bytes", (double)st.pool.budget_bytes);
    cJSON_AddNumberToObject(pools, "reserved_bytes", (double)st.pool.reserved_bytes);
    cJSON_AddNumberToObject(pools, "free_bytes", (double)st.pool.free_bytes);
    cJSON_AddNumberToObject(pools, "n_seqs", st.pool.n_seqs);
    cJSON *kv = cJSON_AddObjectToObject(pools, "attn_kv");
    cJSON_AddNumberToObject(kv, "blocks_total", st.pool.n_pages_total);
    cJSON_AddNumberToObject(kv, "blocks_used", st.pool.n_pages_used);
    cJSON_AddNumberToObject(kv, "usage_ratio",
                            st.pool.n_pages_total > 0 ? (double)st.pool.n_pages_used / st.pool.n_pages_total : 0.0);
    double tok_cap = (double)st.pool.n_pages_total * in->page_tokens;
    cJSON_AddNumberToObject(kv, "tokens_capacity", tok_cap);
    cJSON_AddNumberToObject(kv, "tokens_used", (double)t_tok);
    cJSON_AddNumberToObject(kv, "token_usage_ratio", tok_cap > 0 ? (double)t_tok / tok_cap : 0.0);
    cJSON *rec = cJSON_AddObjectToObject(pools, "recurrent");
    cJSON_AddNumberToObject(rec, "slots_total", in->max_seqs);
    cJSON_AddNumberToObject(rec, "slots_used", in->n_rec_layers > 0 ? st.pool.n_seqs : 0);
    cJSON_AddNumberToObject(rec, "usage_ratio",
                            in->n_rec_layers > 0 && in->max_seqs ? (double)st.pool.n_seqs / in->max_seqs : 0.0);
    cJSON *sp = cJSON_AddObjectToObject(pools, "spares");
    cJSON_AddNumberToObject(sp, "recurrent_blocks", st.pool.n_spare_blocks);
    cJSON_AddNumberToObject(sp, "attn_kv_regions", st.pool.n_spare_regions);
    cJSON_AddNumberToObject(sp, "bytes", (double)st.pool.spare_bytes);
    cJSON_AddNumberToObject(sp, "recurrent_blocks_taken_total", (double)st.pool.spare_blocks_taken);
    cJSON_AddNumberToObject(sp, "attn_kv_regions_taken_total", (double)st.pool.spare_regions_taken);
    prefix_cache_json(cJSON_AddObjectToObject(pools, "prefix_cache"), &st, in);
    cJSON *kvo = cJSON_AddObjectToObject(o, "kv_events");
    if (kvo) {
        kvev_stats kvs;
        kvev_get_stats(srv->kv_events, &kvs);
        cJSON_AddBoolToObject(kvo, "enabled", srv->kv_events != NULL);
        cJSON_AddNumberToObject(kvo, "published", (double)kvs.published);
        cJSON_AddNumberToObject(kvo, "dropped", (double)kvs.dropped);
        cJSON_AddNumberToObject(kvo, "next_sequence", (double)kvs.batches);
        cJSON_AddNumberToObject(kvo, "queued", kvs.queued);
        cJSON_AddNumberToObject(kvo, "blocks_held", (double)kvs.blocks_held);
        cJSON_AddNumberToObject(kvo, "state_blocks_held", (double)kvs.state_blocks_held);
    }

    cJSON *gc = cJSON_AddObjectToObject(o, "grammar_cache");
    cJSON_AddNumberToObject(gc, "budget_bytes", (double)st.grammar.max_bytes);
    cJSON_AddNumberToObject(gc, "bytes", (double)st.grammar.bytes);
    cJSON_AddNumberToObject(gc, "grammars", st.grammar.grammars);
    cJSON_AddNumberToObject(gc, "entries", st.grammar.entries);
    cJSON_AddNumberToObject(gc, "compile_hits_total", (double)st.grammar.compile_hits);
    cJSON_AddNumberToObject(gc, "compiles_total", (double)st.grammar.compiles);
    cJSON_AddNumberToObject(gc, "hits_total", (double)st.grammar.mask_hits);
    cJSON_AddNumberToObject(gc, "walks_total", (double)st.grammar.walks);
    cJSON_AddNumberToObject(gc, "evictions_total", (double)st.grammar.evictions);
    cJSON_AddNumberToObject(gc, "not_kept_total", (double)st.grammar.not_kept);

    cJSON *sc = cJSON_AddObjectToObject(o, "scheduler");
    cJSON_AddNumberToObject(sc, "running", st.running);
    cJSON_AddNumberToObject(sc, "waiting", st.waiting);
    cJSON_AddBoolToObject(sc, "draining", st.draining);
    cJSON_AddNumberToObject(sc, "steps_total", (double)st.steps_total);
    cJSON_AddNumberToObject(sc, "batch_size_last", st.batch_seqs_last);
    cJSON_AddNumberToObject(sc, "batch_size_max", st.batch_seqs_max);
    cJSON_AddNumberToObject(sc, "batch_decode_max", st.batch_decode_max);
    cJSON_AddNumberToObject(sc, "mixed_steps_total", (double)st.mixed_steps_total);
    cJSON_AddNumberToObject(sc, "decode_steps_total", (double)st.decode_steps_total);
    cJSON_AddNumberToObject(sc, "decode_forward_seconds_total", st.decode_forward_seconds);
    cJSON_AddNumberToObject(sc, "prefill_chunk", srv->cfg->prefill_chunk);
    cJSON_AddNumberToObject(sc, "batch_size_mean",
                            st.steps_total ? (double)st.batch_seqs_total / (double)st.steps_total : 0.0);
    cJSON_AddNumberToObject(sc, "admitted_total", (double)st.admitted_total);
    cJSON_AddNumberToObject(sc, "finished_total", (double)st.finished_total);
    cJSON_AddNumberToObject(sc, "cancelled_total", (double)st.cancelled_total);
    cJSON_AddNumberToObject(sc, "failed_total", (double)st.failed_total);
    cJSON_AddNumberToObject(sc, "rejected_total",
                            (double)(st.rejected_full_total + st.rejected_timeout_total + st.rejected_toobig_total));
    cJSON_AddNumberToObject(sc, "preemptions_total", 0);
    cJSON_AddNumberToObject(sc, "prompt_tokens_total", (double)st.prompt_tokens_total);
    cJSON_AddNumberToObject(sc, "generation_tokens_total", (double)st.generation_tokens_total);
    cJSON *spec = cJSON_AddObjectToObject(o, "speculative");
    cJSON_AddStringToObject(spec, "type", sched_spec_type_name(st.spec_type));
    cJSON_AddNumberToObject(spec, "draft_n_max", st.spec_n_max);
    cJSON_AddNumberToObject(spec, "draft_n_min", st.spec_n_min);
    cJSON_AddNumberToObject(spec, "verify_steps_total", (double)st.spec.drafts);
    cJSON_AddNumberToObject(spec, "draft_tokens_total", (double)st.spec.drafted);
    cJSON_AddNumberToObject(spec, "accepted_tokens_total", (double)st.spec.accepted);
    cJSON_AddNumberToObject(spec, "acceptance_rate",
                            st.spec.drafted ? (double)st.spec.accepted / (double)st.spec.drafted : 0.0);
    cJSON_AddNumberToObject(spec, "rollbacks_total", (double)st.spec.rollbacks);
    /* the cost gate: decode steps whose draft it declined, and the step
     * times by rows it weighs (docs/serving.md 17, "Length") */
    cJSON_AddBoolToObject(spec, "cost_aware", st.spec_cost);
    cJSON_AddNumberToObject(spec, "declined_steps_total", (double)st.spec.declined);
    cJSON *secs = cJSON_AddArrayToObject(spec, "step_seconds_by_rows");
    for (int r = 1; r <= st.spec_n_max + 1 && r < SCHED_SPEC_MAX_POS + 2; r++)
        json_push(secs, cJSON_CreateNumber(st.spec_step_seconds[r]));
    cJSON_AddNumberToObject(spec, "rollback_snapshots", st.spec_snapshots);
    cJSON_AddNumberToObject(spec, "rollback_snapshot_bytes", (double)st.spec_snapshot_bytes);
    if (st.spec_type == SCHED_SPEC_DRAFT) {
        /* the draft model's engine: its weights and its own cache pool,
         * beside the model's budget (not inside pools above) */
        cJSON *dm = cJSON_AddObjectToObject(spec, "draft_model");
        cJSON_AddNumberToObject(dm, "n_layer", st.draft_n_layer);
        cJSON_AddNumberToObject(dm, "weight_bytes", (double)st.draft_weight_bytes);
        cJSON_AddNumberToObject(dm, "cache_budget_bytes", (double)st.draft_budget_bytes);
        cJSON_AddNumberToObject(dm, "reserved_bytes", (double)st.draft_reserved_bytes);
        cJSON_AddNumberToObject(dm, "sequences", st.draft_seqs);
        cJSON_AddNumberToObject(dm, "snapshots", st.draft_snaps);
    }
    if (st.spec_type == SCHED_SPEC_MTP) {
        /* the MTP block's KV: a pool of its own beside the model's budget,
         * and the requests' buffers of trunk hidden rows (heap) */
        cJSON *mt = cJSON_AddObjectToObject(spec, "mtp");
        cJSON_AddNumberToObject(mt, "cache_budget_bytes", (double)st.mtp_budget_bytes);
        cJSON_AddNumberToObject(mt, "reserved_bytes", (double)st.mtp_reserved_bytes);
        cJSON_AddNumberToObject(mt, "sequences", st.mtp_seqs);
        cJSON_AddNumberToObject(mt, "hidden_row_bytes", (double)st.mtp_hidden_bytes);
    }

    cJSON *arr = with_requests ? cJSON_AddArrayToObject(o, "requests") : NULL;
    for (int i = 0; i < n_reqs; i++) {
        if (arr && (!viewer || reqs[i].owner == viewer) && (!request_id || !strcmp(request_id, reqs[i].id)))
            json_push(arr, request_json(&reqs[i], in));
    }
    /* disjoint parts only, so they add up to all_requests_bytes (no
     * attention or recurrent subtotal beside its parts to count twice) */
    cJSON *tot = cJSON_AddObjectToObject(o, "totals");
    cJSON_AddNumberToObject(tot, "gqa_kv_bytes", (double)t_kv);
    cJSON_AddNumberToObject(tot, "mla_latent_bytes", (double)t_mla);
    cJSON_AddNumberToObject(tot, "recurrent_state_bytes", (double)t_state);    /* every recurrent kind's */
    cJSON_AddNumberToObject(tot, "recurrent_conv_bytes", (double)t_conv);
    /* the snapshots a running request takes for the prefix store are its
     * own until it ends; the store's entries are in pools.prefix_cache */
    cJSON_AddNumberToObject(tot, "checkpoint_bytes", (double)t_snap);
    cJSON_AddNumberToObject(tot, "all_requests_bytes", (double)(t_all + t_snap));
out:
    free(reqs);
    return o;
}

/* config.c - option table and the four option sources.
 *
 * Owns: parsing flags, HYSERVE_* environment variables and the config
 * file into a server_config, with precedence flags > env > file > defaults.
 * Does not own: acting on the options.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"

enum opt_type {
    OPT_STR,
    OPT_INT,
    OPT_BYTES,
    OPT_SECONDS,
    OPT_BOOL,
    OPT_LIST,               /* repeatable: values collect one per line; a source of higher
                               precedence replaces the lower ones' values */
};

/* One option, found by its long name in all four sources. */
typedef struct opt_def {
    const char *name;       /* long flag and config-file key */
    char short_name;        /* 0: none */
    const char *env;        /* environment variable */
    int type;               /* enum opt_type */
    size_t off;             /* offset in server_config */
    size_t size;            /* OPT_STR: buffer size */
    const char *arg;        /* metavar for the usage text */
    const char *help;
} opt_def;

#define OFF(f) offsetof(server_config, f)
#define SZ(f) sizeof(((server_config *)0)->f)

static const opt_def OPTS[] = {
    {"model", 'm', "HYSERVE_MODEL", OPT_STR, OFF(model), SZ(model), "FILE", "GGUF model to serve"},
    {"host", 0, "HYSERVE_HOST", OPT_STR, OFF(host), SZ(host), "ADDR", "address to bind (default 127.0.0.1)"},
    {"port", 0, "HYSERVE_PORT", OPT_INT, OFF(port), 0, "N", "TCP port (default 8080)"},
    {"config", 0, "HYSERVE_CONFIG", OPT_STR, OFF(config_path), SZ(config_path), "FILE",
     "config file (default " CONFIG_DEFAULT_PATH " when present)"},
    {"threads", 't', "HYSERVE_THREADS", OPT_INT, OFF(threads), 0, "N",
     "engine threads (default: the cgroup CPU limit rounded down, else all cores)"},
    {"ctx", 'c', "HYSERVE_CTX", OPT_INT, OFF(ctx), 0, "N", "max tokens per sequence (default: model, capped at 4096)"},
    {"max-seqs", 0, "HYSERVE_MAX_SEQS", OPT_INT, OFF(max_seqs), 0, "N", "sequences decoded together (default 64)"},
    {"cache-mem", 0, "HYSERVE_CACHE_MEM", OPT_BYTES, OFF(cache_mem), 0, "BYTES",
     "cache budget, K/M/G suffixes (default: max-seqs full contexts, at most 4G and at most what fits "
     "beside the weights in a cgroup memory limit)"},
    {"max-queue", 0, "HYSERVE_MAX_QUEUE", OPT_INT, OFF(max_queue), 0, "N", "waiting requests before 429 (default 64)"},
    {"queue-timeout", 0, "HYSERVE_QUEUE_TIMEOUT", OPT_SECONDS, OFF(queue_timeout), 0, "SEC",
     "longest wait for admission before 429 (default 30)"},
    {"max-body", 0, "HYSERVE_MAX_BODY", OPT_BYTES, OFF(max_body), 0, "BYTES", "request body limit (default 2M)"},
    {"drain-timeout", 0, "HYSERVE_DRAIN_TIMEOUT", OPT_SECONDS, OFF(drain_timeout), 0, "SEC",
     "time to finish in-flight requests after SIGTERM (default 60)"},
    {"log-prompts", 0, "HYSERVE_LOG_PROMPTS", OPT_BOOL, OFF(log_prompts), 0, NULL,
     "include prompt text in the request log (default off)"},
    {"prefill-chunk", 0, "HYSERVE_PREFILL_CHUNK", OPT_INT, OFF(prefill_chunk), 0, "N",
     "prompt tokens per step over all sequences (default 512)"},
    {"keepalive", 0, "HYSERVE_KEEPALIVE", OPT_SECONDS, OFF(keepalive), 0, "SEC",
     "SSE ': ping' comment after this much silence (default 15)"},
    {"max-stop", 0, "HYSERVE_MAX_STOP", OPT_INT, OFF(max_stop), 0, "N", "stop sequences per request (default 4)"},
    {"max-n", 0, "HYSERVE_MAX_N", OPT_INT, OFF(max_n), 0, "N",
     "OpenAI n and TGI best_of: sequences one request may ask for, 400 (TGI 422) beyond (default 8)"},
    {"default-max-tokens", 0, "HYSERVE_DEFAULT_MAX_TOKENS", OPT_INT, OFF(default_max_tokens), 0, "N",
     "max_new_tokens when a request gives none (default 256; /v1/completions: 16)"},
    {"max-connections", 0, "HYSERVE_MAX_CONNECTIONS", OPT_INT, OFF(max_connections), 0, "N",
     "concurrent HTTP connections; each costs a socket and a small buffer, no thread (default and 0: the "
     "open-file limit, raised to its hard limit at start, less 64, at most 16384)"},
    {"synth", 0, "HYSERVE_SYNTH", OPT_STR, OFF(synth), SZ(synth), "PRESET|FILE.json",
     "serve a synthesized model with this preset's (or layout file's) cache layout instead of -m"},
    {"kv-dtype", 0, "HYSERVE_KV_DTYPE", OPT_STR, OFF(kv_dtype), SZ(kv_dtype), "T",
     "attention cache numbers: f32, f16 or bf16 (default f32)"},
    {"state-dtype", 0, "HYSERVE_STATE_DTYPE", OPT_STR, OFF(state_dtype), SZ(state_dtype), "T",
     "DeltaNet recurrent state numbers between steps: f32 or bf16 (half the bytes, rounded after every "
     "step; default f32)"},
    {"page-tokens", 0, "HYSERVE_PAGE_TOKENS", OPT_INT, OFF(page_tokens), 0, "N",
     "tokens per KV cache page (default 16)"},
    {"api-key", 0, "HYSERVE_API_KEY", OPT_LIST, OFF(api_keys), SZ(api_keys), "KEY",
     "require 'Authorization: Bearer KEY' on every route but /health, /live and /ready (repeatable; "
     "keys are never logged)"},
    {"api-key-file", 0, "HYSERVE_API_KEY_FILE", OPT_STR, OFF(api_key_file), SZ(api_key_file), "FILE",
     "more API keys, one per line ('#' comments)"},
    {"idle-timeout", 0, "HYSERVE_IDLE_TIMEOUT", OPT_SECONDS, OFF(idle_timeout), 0, "SEC",
     "a connection must send a whole request head within this, counted from its opening or its last "
     "response, not restarted by each byte (default 60)"},
    {"request-timeout", 0, "HYSERVE_REQUEST_TIMEOUT", OPT_SECONDS, OFF(request_timeout), 0, "SEC",
     "a request body must arrive within this after its head (default 30)"},
    {"max-connections-per-client", 0, "HYSERVE_MAX_CONNECTIONS_PER_CLIENT", OPT_INT, OFF(max_conn_per_client), 0,
     "N", "open connections from one client address; 0: no limit (default 64; behind a load balancer every "
     "connection comes from it: raise it to --max-connections)"},
    {"max-header-bytes", 0, "HYSERVE_MAX_HEADER_BYTES", OPT_BYTES, OFF(max_header_bytes), 0, "BYTES",
     "request line and headers together, 431 beyond (default 16K)"},
    {"max-prompt-tokens", 0, "HYSERVE_MAX_PROMPT_TOKENS", OPT_INT, OFF(max_prompt_tokens), 0, "N",
     "prompt tokens per request, 422 (OpenAI 400) beyond; 0: only the context limit (default 0)"},
    {"max-stop-length", 0, "HYSERVE_MAX_STOP_LENGTH", OPT_INT, OFF(max_stop_len), 0, "BYTES",
     "bytes of one stop sequence (default 256)"},
    {"max-stream-buffer", 0, "HYSERVE_MAX_STREAM_BUFFER", OPT_BYTES, OFF(max_stream_buffer), 0, "BYTES",
     "generated output a stream may hold that its client has not read; beyond it the request is "
     "cancelled and its cache freed (default 1M)"},
    {"metrics-public", 0, "HYSERVE_METRICS_PUBLIC", OPT_BOOL, OFF(metrics_public), 0, NULL,
     "serve /metrics and /stats without a key, for a trusted scraper (default off)"},
    {"metrics-port", 0, "HYSERVE_METRICS_PORT", OPT_INT, OFF(metrics_port), 0, "N",
     "also listen on this port for GET /metrics, /health, /live and /ready only, without a key, for a scraper "
     "such as the inference gateway's endpoint picker (every other path 404 there; default 0: no such listener)"},
    {"metrics-host", 0, "HYSERVE_METRICS_HOST", OPT_STR, OFF(metrics_host), SZ(metrics_host), "ADDR",
     "address the --metrics-port listener binds (default: --host's)"},
    {"kv-events", 0, "HYSERVE_KV_EVENTS", OPT_STR, OFF(kv_events), SZ(kv_events), "ENDPOINT",
     "publish the prefix cache's blocks as vLLM's KV events (BlockStored, BlockRemoved, AllBlocksCleared) on "
     "a ZMQ PUB socket, for a cache-aware router such as llm-d's precise prefix scorer: tcp://*:5557 binds, "
     "tcp://HOST:PORT connects; topic kv@<POD_IP or --host>:<--port>@<model> (default off)"},
    {"kv-events-replay", 0, "HYSERVE_KV_EVENTS_REPLAY", OPT_STR, OFF(kv_events_replay), SZ(kv_events_replay),
     "ENDPOINT", "with --kv-events, bind a ZMQ ROUTER socket here (tcp://*:5558) that sends a subscriber who "
     "missed messages the last 1000 again from the sequence number it asks for, as vLLM's replay socket "
     "(default off)"},
    {"huge-pages", 0, "HYSERVE_HUGE_PAGES", OPT_BOOL, OFF(huge_weights), 0, NULL,
     "read the weights into 2 MiB transparent huge pages instead of serving them from the file "
     "mapping (default off)"},
    {"prefix-cache", 0, "HYSERVE_PREFIX_CACHE", OPT_STR, OFF(prefix_cache), SZ(prefix_cache), "on|off",
     "keep finished requests' attention KV and DeltaNet state snapshots and reuse the longest cached "
     "prefix of a new prompt (default on; off: every prompt is prefilled whole)"},
    {"prefix-cache-mem", 0, "HYSERVE_PREFIX_CACHE_MEM", OPT_BYTES, OFF(prefix_cache_mem), 0, "BYTES",
     "the prefix store's budget inside --cache-mem, evicted least recently used; a request's reservation "
     "always wins (default: a quarter of the cache budget)"},
    {"grammar-cache-mem", 0, "HYSERVE_GRAMMAR_CACHE_MEM", OPT_BYTES, OFF(grammar_cache_mem), 0, "BYTES",
     "structured output: compiled grammars and their token masks kept for later requests of the same "
     "schema, regex, grammar or tools, least recently used evicted; 0: none kept (default 64M)"},
    {"prefix-snapshot-interval", 0, "HYSERVE_PREFIX_SNAPSHOT_INTERVAL", OPT_INT, OFF(prefix_snap_interval), 0,
     "N", "with DeltaNet layers, also snapshot the state every N prompt tokens (default 0: at the end of "
     "the prompt and of the output, and where a prompt left a cached one)"},
    {"spec-type", 0, "HYSERVE_SPEC_TYPE", OPT_STR, OFF(spec_type), SZ(spec_type),
"none|ngram-simple|draft-simple|draft-mtp",
     "speculative decoding's server-side drafts: none, ngram-simple (prompt lookup: the tokens that followed "
     "the latest earlier occurrence of the context's last 4..2 tokens), draft-simple (a draft model's greedy "
     "tokens, --model-draft) or draft-mtp (the greedy tokens of the model's own MTP block, the nextn layer "
     "Qwen3.5 files carry: refused at start for a model without one; its KV is a pool of its own), verified "
     "in the sequence's own step; a request's prediction is drafted either way "
     "and \"speculative\" turns drafts off, or the server's source (n-gram on a none server) on, per request "
     "(default none, draft-simple when --model-draft is given)"},
    {"spec-draft-n-max", 0, "HYSERVE_SPEC_DRAFT_N_MAX", OPT_INT, OFF(spec_draft_n_max), 0, "N",
     "draft tokens one verify step takes per sequence at most, 1..64; the length adapts below it per request "
     "(default 16)"},
    {"spec-draft-n-min", 0, "HYSERVE_SPEC_DRAFT_N_MIN", OPT_INT, OFF(spec_draft_n_min), 0, "N",
     "a draft shorter than this is not verified, 0..--spec-draft-n-max (default 0)"},
    {"spec-cost", 0, "HYSERVE_SPEC_COST", OPT_STR, OFF(spec_cost), SZ(spec_cost), "on|off",
     "weigh each draft's rows against the decode step times measured by row count, and draft only the length "
     "whose expected accepted tokens save more time than its rows cost (none where verify rows are "
     "compute-bound); off: the length follows acceptance alone (default on)"},
    {"model-draft", 0, "HYSERVE_MODEL_DRAFT", OPT_STR, OFF(model_draft), SZ(model_draft), "FILE",
     "the draft model of --spec-type draft-simple: a small GGUF with the model's vocabulary (the same token "
     "count and texts, else refused at start), opened as a second engine with its own cache for --max-seqs "
     "draft sequences of the context (long option only: -md is not a short option here)"},
    {"served-model-name", 0, "HYSERVE_SERVED_MODEL_NAME", OPT_LIST, OFF(served_names), SZ(served_names), "NAME",
     "a name OpenAI requests may give as \"model\" (repeatable: aliases; the first is the one answers, /info "
     "and /metrics carry; default: the model file's name without .gguf)"},
    {"accept-any-model", 0, "HYSERVE_ACCEPT_ANY_MODEL", OPT_BOOL, OFF(accept_any_model), 0, NULL,
     "accept any \"model\" in OpenAI requests and echo it (default off: a name not served gets 404 "
     "model_not_found)"},
    {"log-format", 0, "HYSERVE_LOG_FORMAT", OPT_STR, OFF(log_format), SZ(log_format), "FMT",
     "log lines as text (a timestamp, a level, the message) or json (one object a line) (default text)"},
    {"log-probes", 0, "HYSERVE_LOG_PROBES", OPT_BOOL, OFF(log_probes), 0, NULL,
     "also log GET /health, /live, /ready and /metrics (default off: they are counted, not logged)"},
    {"cors-origin", 0, "HYSERVE_CORS_ORIGIN", OPT_LIST, OFF(cors_origins), SZ(cors_origins), "ORIGIN",
     "let web pages from this origin (scheme://host[:port], or * for any) call the API: Access-Control-* "
     "headers on every response and preflight OPTIONS answered (repeatable; default off)"},
    {"replica", 0, "HYSERVE_REPLICA", OPT_STR, OFF(replica), SZ(replica), "NAME",
     "this replica's name in the X-Hyserve-Replica header and /info (default: the host name)"},
};
#define N_OPTS ((int)(sizeof(OPTS) / sizeof(OPTS[0])))

/* The HYSERVE_* switches that are not options: read with getenv where they
 * act (kernels, loader, planner, test builds), with no flag and no config-file
 * key. Nothing reads this table at run time; it is their one documented list,
 * rendered with OPTS into docs/options.md by tools/gen_options_doc.py, and
 * tests/suite_options.sh fails when a "HYSERVE_..." name in the program's C
 * files is in neither table (or a row here names one no code reads). */
typedef struct env_switch {
    const char *env;
    const char *values;     /* what it takes; anything else counts as unset */
    const char *help;
    const char *ref;        /* where it is explained */
} env_switch;

static const env_switch ENV_SWITCHES[] __attribute__((unused)) = {
    {"HYSERVE_SIMD", "avx512|avx2+vnni|avx2|0",
     "force a kernel level below the CPU's own: AVX-512 without AMX, AVX2 with AVX-VNNI, AVX2 only, or the "
     "scalar references (default: everything the CPU has)", "docs/performance.md 3"},
    {"HYSERVE_BF16_DOT", "dp|fma",
     "BF16 decode on vdpbf16ps (dp) or the exact convert+FMA kernel (default: measured at start-up where the "
     "CPU has AVX512_BF16)", "docs/performance.md 3"},
    {"HYSERVE_INT8_PROMPT", "0|1|step",
     "Q8_0, Q4_0 and K-quant prompts on int8 tiles: off, on at every level, or on the decode-step kernels "
     "(default: where measured faster at the CPU's level, from a number of tokens per level)",
     "docs/performance.md 2"},
    {"HYSERVE_BF16_PROMPT", "0|1",
     "BF16 prompts with f32 activations (0) or rounded to bf16 at every level (1) (default: rounded on "
     "vdpbf16ps where BF16 decode takes it)", "docs/performance.md 3"},
    {"HYSERVE_F16_PROMPT", "tile|sgemm|0",
     "F16 prompts on the outer-product tile at every length, or (sgemm, 0) sgemm past the small-prompt kernels "
     "(default: the tile)", "docs/performance.md 3"},
    {"HYSERVE_F32_PROMPT", "tile|sgemm|0",
     "F32 prompts on the AVX-512 tile at every length, or (sgemm, 0) sgemm past the small-prompt kernels (default: the "
     "tile up to 128 tokens)", "docs/performance.md 3"},
    {"HYSERVE_PANELS", "0|1",
     "weights kept as stored (0), or packed into 16-row panels on AMX machines too (1) (default: panels on "
     "AVX-512 without AMX)", "docs/performance.md 4"},
    {"HYSERVE_SPLIT", "fixed",
     "decode products keep one fixed share of rows per thread, no stealing (for A/B runs)",
     "docs/performance.md 8"},
    {"HYSERVE_F32_COPY", "0",
     "leave F32 weights in the file mapping instead of copying them into memory advised for 2 MiB pages",
     "docs/performance.md 9"},
    {"HYSERVE_PRESETS", "DIR",
     "where the planner's preset layouts are read (default config/presets)", "docs/serving.md 9"},
    {"HYSERVE_CGROUP_ROOT", "DIR",
     "the cgroup tree whose CPU and memory limits give the default threads and cache budget (default "
     "/sys/fs/cgroup; tests point it at a fake tree)", "docs/deployment.md 3"},
    {"HYSERVE_FAULT_NTH", "N",
     "CHECKS=1 and SANITIZE=1 builds only: fail the N-th allocation once the server starts serving",
     "docs/testing.md 4"},
    {"HYSERVE_FAULT_LIVE", "1",
     "CHECKS=1 and SANITIZE=1 builds only: a request with X-Hyserve-Fault-Nth: N fails its N-th allocation, "
     "and GET /debug/fault disarms and reports", "docs/testing.md 4"},
};

void config_defaults(server_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->host, sizeof(c->host), "127.0.0.1");
    c->port = 8080;
    c->max_queue = 64;
    c->queue_timeout = 30.0;
    c->max_body = 2000000;
    c->drain_timeout = 60.0;
    c->prefill_chunk = 512;
    c->keepalive = 15.0;
    c->max_stop = 4;
    c->max_n = 8;
    c->default_max_tokens = 256;
    c->max_connections = 0;     /* from the fd limit at start (http.c) */
    c->idle_timeout = 60.0;
    c->request_timeout = 30.0;
    c->max_conn_per_client = 64;
    snprintf(c->prefix_cache, sizeof(c->prefix_cache), "on");
    snprintf(c->spec_type, sizeof(c->spec_type), "none");
    c->spec_draft_n_max = 16;
    c->spec_draft_n_min = 0;
    snprintf(c->spec_cost, sizeof(c->spec_cost), "on");
    c->max_header_bytes = 16384;
    c->max_prompt_tokens = 0;
    c->max_stop_len = 256;
    c->max_stream_buffer = 1 << 20;
    c->grammar_cache_mem = (uint64_t)64 << 20;
}

void config_usage(FILE *f)
{
    fprintf(f, "usage: hyserve serve -m MODEL [options]\n\n"
               "Serves TGI (/generate, /generate_stream) and OpenAI (/v1/completions,\n"
               "/v1/chat/completions) HTTP APIs with continuous batching.\n\n"
               "Options (precedence: flags, then HYSERVE_* environment, then the config file, then defaults):\n");
    for (int i = 0; i < N_OPTS; i++) {
        const opt_def *o = &OPTS[i];
        char lhs[64];
        if (o->short_name)
            snprintf(lhs, sizeof(lhs), "-%c, --%s%s%s", o->short_name, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        else
            snprintf(lhs, sizeof(lhs), "    --%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-30s %s [%s]\n", lhs, o->help, o->env);
    }
    fprintf(f, "  %-30s %s\n", "-h, --help", "show this help");
}

int config_parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    while (isspace((unsigned char)*s))
        s++;
    if (*s == '-' || !*s)
        return -1;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v))
        return -1;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (toupper((unsigned char)*end) == 'I')
        end++;
    if (toupper((unsigned char)*end) == 'B')
        end++;
    while (isspace((unsigned char)*end))
        end++;
    if (*end)
        return -1;
    double b = v * mul;
    if (b > 1.8e19)
        return -1;
    *out = (uint64_t)b;
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    if (!strcasecmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on")) {
        *out = true;
        return 0;
    }
    if (!strcasecmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off")) {
        *out = false;
        return 0;
    }
    return -1;
}

/* Store one textual value. src names the source for the error message. */
static int opt_set(server_config *c, const opt_def *o, const char *val, const char *src,
                   char *err, size_t errlen)
{
    char *base = (char *)c + o->off;
    char *end;
    switch (o->type) {
    case OPT_LIST: {
        /* flags (src "--name") over the environment (src = its variable)
         * over the file: a higher source starts the list afresh */
        int from = !strncmp(src, "--", 2) ? 3 : !strcmp(src, o->env) ? 2 : 1;
        int *list_from = o->off == OFF(api_keys)       ? &c->api_keys_from
                         : o->off == OFF(served_names) ? &c->served_names_from
                                                       : &c->cors_origins_from;
        if (from != *list_from) {
            base[0] = '\0';
            *list_from = from;
        }
        size_t have = strlen(base), n = strlen(val);
        if (have + n + 2 > o->size) {
            snprintf(err, errlen, "%s: too many values of %s", src, o->name);
            return -1;
        }
        memcpy(base + have, val, n);
        base[have + n] = '\n';
        base[have + n + 1] = '\0';
        return 0;
    }
    case OPT_STR:
        if (strlen(val) >= o->size) {
            snprintf(err, errlen, "%s: value of %s is too long", src, o->name);
            return -1;
        }
        memcpy(base, val, strlen(val) + 1);
        return 0;
    case OPT_INT: {
        errno = 0;
        long v = strtol(val, &end, 10);
        while (isspace((unsigned char)*end))
            end++;
        if (errno || end == val || *end || v < 0 || v > INT_MAX) {
            snprintf(err, errlen, "%s: %s wants a non-negative integer, got '%s'", src, o->name, val);
            return -1;
        }
        *(int *)(void *)base = (int)v;
        return 0;
    }
    case OPT_BYTES: {
        uint64_t v;
        if (config_parse_bytes(val, &v)) {
            snprintf(err, errlen, "%s: %s wants a byte count like 512M or 2G, got '%s'", src, o->name, val);
            return -1;
        }
        *(uint64_t *)(void *)base = v;
        return 0;
    }
    case OPT_SECONDS: {
        errno = 0;
        double v = strtod(val, &end);
        if (*end == 's')
            end++;
        while (isspace((unsigned char)*end))
            end++;
        if (errno || end == val || *end || !(v >= 0) || !isfinite(v)) {
            snprintf(err, errlen, "%s: %s wants seconds (e.g. 30 or 0.5), got '%s'", src, o->name, val);
            return -1;
        }
        *(double *)(void *)base = v;
        return 0;
    }
    case OPT_BOOL: {
        bool b;
        if (parse_bool(val, &b)) {
            snprintf(err, errlen, "%s: %s wants true or false, got '%s'", src, o->name, val);
            return -1;
        }
        *(bool *)(void *)base = b;
        return 0;
    }
    default:
        return -1;
    }
}

static const opt_def *opt_by_name(const char *name, size_t len)
{
    for (int i = 0; i < N_OPTS; i++)
        if (strlen(OPTS[i].name) == len && !strncmp(OPTS[i].name, name, len))
            return &OPTS[i];
    return NULL;
}

static const opt_def *opt_by_short(char ch)
{
    for (int i = 0; i < N_OPTS; i++)
        if (OPTS[i].short_name == ch)
            return &OPTS[i];
    return NULL;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int load_file(server_config *c, const char *path, bool must_exist, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (!must_exist && errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot open config file %s: %s", path, strerror(errno));
        return -1;
    }
    char line[2048], src[1200];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *l = trim(line);
        if (!*l)
            continue;
        snprintf(src, sizeof(src), "%s:%d", path, lineno);
        char *eq = strchr(l, '=');
        if (!eq) {
            snprintf(err, errlen, "%s: expected 'key = value'", src);
            rc = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(l), *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && ((val[0] == '"' && val[vl - 1] == '"') || (val[0] == '\'' && val[vl - 1] == '\''))) {
            val[vl - 1] = '\0';
            val++;
        }
        const opt_def *o = opt_by_name(key, strlen(key));
        if (!o || !strcmp(o->name, "config")) {
            snprintf(err, errlen, "%s: unknown option '%s'", src, key);
            rc = -1;
            break;
        }
        if (opt_set(c, o, val, src, err, errlen)) {
            rc = -1;
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        snprintf(c->config_path, sizeof(c->config_path), "%s", path);
    return rc;
}

/* Walk argv. With apply false only --config and --help are looked at
 * (and the syntax checked); with apply true every value is stored. */
static int scan_args(server_config *c, int argc, char **argv, bool apply, const char **config_flag,
                     bool *help, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const opt_def *o = NULL;
        const char *val = NULL;
        char src[80];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            *help = true;
            continue;
        }
        if (a[0] == '-' && a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            o = opt_by_name(name, len);
            if (!o && len > 3 && !strncmp(name, "no-", 3)) {
                o = opt_by_name(name + 3, len - 3);
                if (o && o->type == OPT_BOOL && !eq) {
                    if (apply)
                        *(bool *)(void *)((char *)c + o->off) = false;
                    continue;
                }
                o = NULL;
            }
            if (!o) {
                snprintf(err, errlen, "unknown option '%s' (see hyserve serve --help)", a);
                return -1;
            }
            if (eq)
                val = eq + 1;
        } else if (a[0] == '-' && a[1] && !a[2]) {
            o = opt_by_short(a[1]);
            if (!o) {
                snprintf(err, errlen, "unknown option '%s' (see hyserve serve --help)", a);
                return -1;
            }
        } else {
            snprintf(err, errlen, "unexpected argument '%s' (see hyserve serve --help)", a);
            return -1;
        }
        if (!val) {
            if (o->type == OPT_BOOL) {
                val = "true";
            } else {
                if (i + 1 >= argc) {
                    snprintf(err, errlen, "option %s needs a value", a);
                    return -1;
                }
                val = argv[++i];
            }
        }
        if (!strcmp(o->name, "config")) {
            *config_flag = val;
            continue;
        }
        if (apply) {
            snprintf(src, sizeof(src), "--%s", o->name);
            if (opt_set(c, o, val, src, err, errlen))
                return -1;
        }
    }
    return 0;
}

int config_load_address(server_config *c, int argc, char **argv, char *err, size_t errlen)
{
    const char *config_flag = NULL;
    bool help = false;
    config_defaults(c);
    if (scan_args(c, argc, argv, false, &config_flag, &help, err, errlen))
        return -1;
    if (help) {
        config_usage(stdout);
        return 1;
    }
    const char *env_cfg = getenv("HYSERVE_CONFIG");
    if (config_flag) {
        if (load_file(c, config_flag, true, err, errlen))
            return -1;
    } else if (env_cfg && *env_cfg) {
        if (load_file(c, env_cfg, true, err, errlen))
            return -1;
    } else if (load_file(c, CONFIG_DEFAULT_PATH, false, err, errlen)) {
        return -1;
    }
    for (int i = 0; i < N_OPTS; i++) {
        const opt_def *o = &OPTS[i];
        const char *v = getenv(o->env);
        if (!v || !*v || !strcmp(o->name, "config"))
            continue;
        if (opt_set(c, o, v, o->env, err, errlen))
            return -1;
    }
    if (scan_args(c, argc, argv, true, &config_flag, &help, err, errlen))
        return -1;
    if (c->port < 1 || c->port > 65535) {
        snprintf(err, errlen, "port %d is out of range 1..65535", c->port);
        return -1;
    }
    return 0;
}

int config_load(server_config *c, int argc, char **argv, char *err, size_t errlen)
{
    int rc = config_load_address(c, argc, argv, err, errlen);
    if (rc != 0)
        return rc;
    if (!c->model[0] && !c->synth[0]) {
        snprintf(err, errlen, "no model: pass -m FILE (or --synth PRESET), set HYSERVE_MODEL, or put 'model = FILE' in the config file");
        return -1;
    }
    if (c->model[0] && c->synth[0]) {
        snprintf(err, errlen, "give either -m FILE or --synth PRESET, not both");
        return -1;
    }
    if (c->kv_dtype[0] && strcmp(c->kv_dtype, "f32") && strcmp(c->kv_dtype, "f16") && strcmp(c->kv_dtype, "bf16")) {
        snprintf(err, errlen, "--kv-dtype must be f32, f16 or bf16, got '%s'", c->kv_dtype);
        return -1;
    }
    if (c->state_dtype[0] && strcmp(c->state_dtype, "f32") && strcmp(c->state_dtype, "bf16")) {
        snprintf(err, errlen, "--state-dtype must be f32 or bf16, got '%s'", c->state_dtype);
        return -1;
    }
    if (c->page_tokens < 0 || c->page_tokens > 4096) {
        snprintf(err, errlen, "--page-tokens %d is out of range 1..4096", c->page_tokens);
        return -1;
    }
    if (strcmp(c->prefix_cache, "on") && strcmp(c->prefix_cache, "off")) {
        snprintf(err, errlen, "--prefix-cache must be on or off, got '%s'", c->prefix_cache);
        return -1;
    }
    if (c->prefix_snap_interval < 0) {
        snprintf(err, errlen, "--prefix-snapshot-interval %d must be 0 (none) or more", c->prefix_snap_interval);
        return -1;
    }
    if (strcmp(c->spec_type, "none") && strcmp(c->spec_type, "ngram-simple") && strcmp(c->spec_type, "draft-simple") &&
        strcmp(c->spec_type, "draft-mtp")) {
        snprintf(err, errlen, "--spec-type must be none, ngram-simple, draft-simple or draft-mtp, got '%s'",
                 c->spec_type);
        return -1;
    }
    if (c->model_draft[0] && !strcmp(c->spec_type, "none"))
        snprintf(c->spec_type, sizeof c->spec_type, "draft-simple");   /* llama-server: -md turns the draft model on */
    if (!strcmp(c->spec_type, "draft-simple") && !c->model_draft[0]) {
        snprintf(err, errlen, "--spec-type draft-simple needs --model-draft FILE");
        return -1;
    }
    if (c->model_draft[0] && strcmp(c->spec_type, "draft-simple")) {
        snprintf(err, errlen, "--model-draft is the draft model of --spec-type draft-simple, not %s", c->spec_type);
        return -1;
    }
    if (c->spec_draft_n_max < 1 || c->spec_draft_n_max > 64) {
        snprintf(err, errlen, "--spec-draft-n-max %d is out of range 1..64", c->spec_draft_n_max);
        return -1;
    }
    if (strcmp(c->spec_cost, "on") && strcmp(c->spec_cost, "off")) {
        snprintf(err, errlen, "--spec-cost must be on or off, got '%s'", c->spec_cost);
        return -1;
    }
    if (c->spec_draft_n_min < 0 || c->spec_draft_n_min > c->spec_draft_n_max) {
        snprintf(err, errlen, "--spec-draft-n-min %d is out of range 0..--spec-draft-n-max (%d)", c->spec_draft_n_min,
                 c->spec_draft_n_max);
        return -1;
    }
    if (c->max_queue < 1)
        c->max_queue = 1;
    if (c->prefill_chunk < 1)
        c->prefill_chunk = 1;
    if (c->max_connections < 0)
        c->max_connections = 0;
    else if (c->max_connections > 0 && c->max_connections < 4)
        c->max_connections = 4;
    if (c->default_max_tokens < 1)
        c->default_max_tokens = 1;
    if (c->max_body < 16)
        c->max_body = 16;
    if (c->max_header_bytes < 1024 || c->max_header_bytes > (1u << 20)) {
        snprintf(err, errlen, "--max-header-bytes %llu is out of range 1K..1M", (unsigned long long)c->max_header_bytes);
        return -1;
    }
    if (c->max_prompt_tokens < 0)
        c->max_prompt_tokens = 0;
    if (c->max_n < 1)
        c->max_n = 1;
    if (c->max_stop_len < 1)
        c->max_stop_len = 1;
    if (c->max_stream_buffer < 4096)
        c->max_stream_buffer = 4096;
    return 0;
}

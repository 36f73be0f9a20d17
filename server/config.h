/* config.h - server options from flags, environment, a config file and
 * defaults, in that order of precedence.
 *
 * Owns: the option table (one row per option: long flag, short flag,
 * environment variable, config-file key, type, help), parsing of sizes
 * ("512M") and durations, the usage text.
 * Does not own: what the options mean (serve.c and friends read them).
 * An empty HYSERVE_* variable counts as unset (an image can declare every
 * variable and still let a mounted config file decide).
 * Config file format: "key = value" lines, '#' comments, keys are the long
 * flag names without dashes ("port = 8080", "cache-mem = 2G").
 */
#ifndef HYSERVE_CONFIG_H
#define HYSERVE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_DEFAULT_PATH "config/server.conf"

/* Every option of `hyserve serve`. Owned by serve_main; read-only once
 * the server starts. */
typedef struct server_config {
    char model[1024];           /* GGUF path (-m) */
    char host[256];             /* bind address */
    int port;
    char config_path[1024];     /* the file that was read, "" if none */
    int threads;                /* engine threads, 0: all cores */
    int ctx;                    /* max tokens per sequence, 0: model default */
    int max_seqs;               /* live sequences, 0: engine default */
    uint64_t cache_mem;         /* cache budget bytes, 0: engine default */
    int max_queue;              /* waiting requests before 429 */
    double queue_timeout;       /* seconds a request may wait for admission */
    uint64_t max_body;          /* request body limit in bytes (413 beyond) */
    double drain_timeout;       /* seconds to finish in-flight work after SIGTERM */
    bool log_prompts;           /* put prompt text in the request log */
    bool huge_weights;          /* read the weights into 2 MiB huge pages (else mapped) */
    int prefill_chunk;          /* prompt tokens per step over all sequences */
    double keepalive;           /* seconds of SSE silence before a ": ping" comment */
    int max_stop;               /* stop sequences per request */
    int max_n;                  /* OpenAI n and TGI best_of: sequences per request */
    int default_max_tokens;     /* max_new_tokens when a request gives none (TGI and chat) */
    int max_connections;        /* concurrent HTTP connections */
    char synth[1024];           /* preset name or layout JSON to synthesize and serve */
    char kv_dtype[8];           /* attention cache numbers: f32, f16, bf16 */
    char state_dtype[8];        /* DeltaNet recurrent state numbers: f32, bf16 */
    int page_tokens;            /* KV page size, 0: engine default */
    char replica[256];          /* name in X-Hyserve-Replica and /info, "": the host name */
    char api_keys[8192];        /* --api-key values, one per line (auth.c reads them) */
    int api_keys_from;          /* the source they came from: 0 none, 1 file, 2 environment, 3 flags */
    char api_key_file[1024];    /* more keys, one per line */
    bool metrics_public;        /* /metrics and /stats answer without a key */
    int metrics_port;           /* a second listener for /metrics, /health, /live, /ready without a key; 0: none */
    char metrics_host[256];     /* its bind address, "": --host's */
    char kv_events[256];        /* ZMQ endpoint of the KV events (kvevents.h), "": off */
    char kv_events_replay[256]; /* ZMQ endpoint of their replay socket, "": none */
    double idle_timeout;        /* seconds a connection may take to send a whole request head (or idle between requests) */
    double request_timeout;     /* seconds a request body may take to arrive after its head */
    int max_conn_per_client;    /* open connections from one address, 0: no limit */
    char prefix_cache[8];       /* "on" (default) or "off": keep finished requests' caches for reuse */
    uint64_t prefix_cache_mem;  /* the prefix store's bytes, inside cache_mem; 0: a quarter of the budget */
    int prefix_snap_interval;   /* DeltaNet snapshot every N prompt tokens; 0: only at the end and branch points */
    char served_names[2048];    /* --served-model-name values, one per line; "": the model file's name */
    int served_names_from;      /* their source, as api_keys_from */
    bool accept_any_model;      /* OpenAI requests may name any model (else 404 model_not_found) */
    char cors_origins[2048];    /* --cors-origin values, one per line ("*": any); "": CORS off */
    int cors_origins_from;      /* their source, as api_keys_from */
    char log_format[8];         /* "text" (default) or "json" */
    bool log_probes;            /* log GET /health, /live, /ready and /metrics too */
    uint64_t max_header_bytes;  /* request line + headers, bytes (431 beyond) */
    int max_prompt_tokens;      /* prompt tokens per request, 0: the context limit */
    int max_stop_len;           /* bytes of one stop sequence */
    uint64_t max_stream_buffer; /* output bytes a stream may hold unread before it is cancelled */
    uint64_t grammar_cache_mem; /* compiled grammars and their masks kept for later requests; 0: none */
    char spec_type[16];         /* "none" or "ngram-simple": speculative decoding's server-side drafts */
    int spec_draft_n_max;       /* draft tokens per verify step at most, 1..64 */
    int spec_draft_n_min;       /* shorter drafts are not verified */
    char spec_cost[8];          /* "on" (default): the draft length weighs the measured step times; "off" */
    char model_draft[1024];     /* --model-draft: the draft model of --spec-type draft-simple */
} server_config;

void config_defaults(server_config *c);

/* Fill c from defaults, the config file (--config, $HYSERVE_CONFIG, or
 * CONFIG_DEFAULT_PATH when it exists), the environment, then argv (argv[0]
 * is the subcommand name). Returns 0, 1 when --help was printed, or a
 * negative value with one line in err. */
int config_load(server_config *c, int argc, char **argv, char *err, size_t errlen);
/* The same sources, without requiring a model: for `hyserve health`,
 * which needs only the address the server listens on. */
int config_load_address(server_config *c, int argc, char **argv, char *err, size_t errlen);

/* Parse "123", "64K", "512M", "2G", "1T" (binary units, optional "B"/"iB").
 * Returns 0 or -1. */
int config_parse_bytes(const char *s, uint64_t *out);

void config_usage(FILE *f);

#endif

/* serve.c - `hyserve serve`: config -> HTTP up -> engine_open -> scheduler
 * -> ready -> wait for a signal -> drain -> close.
 *
 * Owns: the process lifecycle of the server: the order things start and
 * stop in, signal handling (SIGTERM/SIGINT drain: /ready turns 503, new
 * work is refused, in-flight requests finish up to --drain-timeout, then
 * exit 0; a second signal exits at once); the defaults that follow the
 * container's limits (threads from a CPU quota, the cache budget from a
 * memory limit: cgroup.c reads them); the replica's name.
 * Does not own: options (config.c), HTTP (http.c), scheduling.
 * ref: docs/serving.md 8 (health vs readiness, drain).
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "config.h"
#include "cors.h"
#include "http.h"
#include "kvevents.h"
#include "log.h"
#include "metrics.h"
#include "presets.h"
#include "routes.h"
#include "progress.h"
#include "serve.h"
#include "server.h"

static void fmt_bytes(uint64_t b, char *buf, size_t n)
{
    if (b >= (1ULL << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ULL << 30));
    else if (b >= (1ULL << 20))
        snprintf(buf, n, "%.2f MiB", (double)b / (double)(1ULL << 20));
    else
        snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
}

/* ---------------------------------------------------------------------- */
/* Container limits                                                       */
/* ---------------------------------------------------------------------- */

/* CPUs this process may run on (its affinity mask), as the engine counts
 * them for its default thread count. */
static int n_cpus_allowed(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Defaults from the cgroup limits, where no flag or HYSERVE_* variable set
 * them: threads for a CPU quota, and a cap on the default cache budget so
 * that weights, cache and headroom fit in a memory limit (a replica on its
 * defaults is neither throttled by too many threads nor OOM-killed).
 * HYSERVE_CGROUP_ROOT names another cgroup tree (tests). Fills srv->limits,
 * ep and sp. */
static void apply_limits(server *srv, const server_config *cfg, engine_params *ep, sched_params *sp)
{
    server_limits *lim = &srv->limits;
    const char *root = getenv("HYSERVE_CGROUP_ROOT");
    cgroup_read(root && *root ? root : CGROUP_ROOT_DEFAULT, NULL, &lim->cg);

    int threads = cfg->threads;
    lim->threads_from = "--threads";
    if (threads <= 0) {
        threads = cgroup_threads(&lim->cg, n_cpus_allowed());
        lim->threads_from = threads > 0 ? "cgroup cpu limit" : "all cpus";
    }
    ep->n_threads = threads;
    sp->n_threads = threads;

    struct stat st;
    lim->model_file_bytes = stat(ep->model_path, &st) == 0 ? (uint64_t)st.st_size : 0;
    if (cfg->cache_mem) {
        lim->cache_from = "--cache-mem";
    } else if (lim->cg.memory_bytes) {
        lim->headroom_bytes = cgroup_headroom_bytes(lim->cg.memory_bytes);
        lim->cache_fit_bytes = cgroup_cache_fit(lim->cg.memory_bytes, lim->model_file_bytes);
        if (lim->cache_fit_bytes < (1ULL << 20)) {
            char l[32], w[32];
            fmt_bytes(lim->cg.memory_bytes, l, sizeof l);
            fmt_bytes(lim->model_file_bytes, w, sizeof w);
            log_msg(LOG_WARN, "hyserve: serve: warning: the memory limit (%s) leaves no room for a cache beside "
                            "the weights (%s) and the headroom; using 1 MiB (set --cache-mem)\n", l, w);
            lim->cache_fit_bytes = 1ULL << 20;
        }
        ep->cache_max_bytes = lim->cache_fit_bytes;
        lim->cache_from = "cgroup memory limit";     /* "engine default" once open, if that is smaller */
    } else {
        lim->cache_from = "engine default";
    }
}

/* The ready line's account of the limits: ", no container limits (cgroup
 * v1)" or ", container limits (cgroup v2): 1 CPUs -> 1 threads, memory
 * 1.00 GiB -> cache budget up to 823 MiB beside 8.50 MiB of weights". */
static void fmt_limits(const server *srv, int threads, char *buf, size_t n)
{
    const server_limits *lim = &srv->limits;
    char ver[16] = "none", cpu[96] = "", mem[256] = "";
    if (lim->cg.version)
        snprintf(ver, sizeof ver, "v%d", lim->cg.version);
    if (lim->cg.cpus <= 0 && !lim->cg.memory_bytes) {
        snprintf(buf, n, ", no container limits (cgroup %s)", ver);
        return;
    }
    if (lim->cg.cpus > 0)
        snprintf(cpu, sizeof cpu, " %.2f CPUs -> %d threads (%s)", lim->cg.cpus, threads, lim->threads_from);
    if (lim->cg.memory_bytes) {
        char l[32], f[32], w[32];
        fmt_bytes(lim->cg.memory_bytes, l, sizeof l);
        fmt_bytes(lim->cache_fit_bytes, f, sizeof f);
        fmt_bytes(lim->model_file_bytes, w, sizeof w);
        if (lim->cache_fit_bytes)
            snprintf(mem, sizeof mem, "%s memory %s -> cache budget up to %s beside %s of weights (%s)",
                     cpu[0] ? "," : "", l, f, w, lim->cache_from);
        else
            snprintf(mem, sizeof mem, "%s memory %s (cache budget from %s)", cpu[0] ? "," : "", l, lim->cache_from);
    }
    snprintf(buf, n, ", container limits (cgroup %s):%s%s", ver, cpu, mem);
}

/* Wait for the first signal while serving, then drain. Returns when the
 * server may stop. */
static const char *sig_name(int sig)
{
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP"
         : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGUSR2 ? "SIGUSR2" : "signal";
}

/* SIGHUP, SIGUSR1 and SIGUSR2 would end the process without a drain by
 * default; the server has no reload, so they are logged and ignored. */
static bool sig_ignored(int sig)
{
    if (sig != SIGHUP && sig != SIGUSR1 && sig != SIGUSR2)
        return false;
    log_msg(LOG_INFO, "hyserve: %s received: ignored (SIGTERM or SIGINT drains and stops)\n", sig_name(sig));
    return true;
}

static void wait_and_drain(server *srv, const sigset_t *set)
{
    int sig = 0;
    while (sigwait(set, &sig) != 0 || sig_ignored(sig)) {
    }
    log_msg(LOG_INFO, "hyserve: %s received: draining (up to %.0f s); send it again to exit at once\n",
            sig_name(sig), srv->cfg->drain_timeout);
    atomic_store(&srv->state, SERVER_DRAINING);
    if (srv->sched)
        sched_drain(srv->sched);

    double deadline = engine_now_s() + srv->cfg->drain_timeout;
    bool cancelled = false;
    double cancel_deadline = 0;
    for (;;) {
        int active = srv->sched ? sched_n_active(srv->sched) : 0;
        int inflight = atomic_load(&srv->n_inflight);
        if (active == 0 && inflight == 0)
            break;
        double now = engine_now_s();
        if (!cancelled && now >= deadline) {
            log_msg(LOG_WARN, "hyserve: drain timeout: cancelling %d requests\n", active > inflight ? active : inflight);
            if (srv->sched)
                sched_cancel_all(srv->sched, "the server is shutting down (drain timeout reached)");
            cancelled = true;
            cancel_deadline = now + 2.0;    /* let the error events reach the clients */
        }
        if (cancelled && now >= cancel_deadline)
            break;
        struct timespec ts = {0, 20 * 1000000L};
        int s2 = sigtimedwait(set, NULL, &ts);
        if (s2 > 0 && !sig_ignored(s2)) {
            /* an operator insisting: no cleanup, exit now */
            log_msg(LOG_WARN, "hyserve: second %s: exiting at once\n", sig_name(s2));
            _exit(128 + s2);
        }
    }
}

/* The served names: the --served-model-name values (one per line, at
 * most SERVER_MAX_NAMES), else the model file's name without ".gguf"
 * (--synth: the preset's name, or its layout file's without ".json"). */
/* --kv-events: the publisher, told of the prefix store's entries through
 * sp's sink. Its topic names the pod as the gateway knows it: POD_IP (the
 * Kubernetes downward API's usual name) or else --host, unless that is a
 * wildcard (then the host name), with --port, and the served model name:
 * kv@10.0.0.7:8080@default. 0, or -1 and err. */
/* --model-draft: the draft model as a second engine, opened like the
 * model (its threads, KV type, context and sequence count: a draft
 * sequence per speculating request) with a cache of its own, the engine's
 * default for max_seqs full contexts (the draft's bytes are its own
 * budget, beside --cache-mem: /stats speculative.draft_model shows both). The
 * vocabulary check is sched_new's. 0, or -1 logged. */
static int open_draft(server *srv, const server_config *cfg, const engine_params *ep, sched_params *sp)
{
    char err[512];
    engine_params dp = *ep;
    dp.model_path = cfg->model_draft;
    dp.n_ctx = srv->info->n_ctx;
    dp.max_seqs = srv->info->max_seqs;
    dp.cache_bytes = 0;
    dp.progress = NULL;
    dp.progress_ctx = NULL;
    sp->draft = engine_open(&dp, err, sizeof err);
    if (!sp->draft) {
        atomic_store(&srv->state, SERVER_FAILED);
        log_msg(LOG_ERROR, "hyserve: serve: cannot load the draft model %s: %s\n", cfg->model_draft, err);
        return -1;
    }
    const engine_info *di = engine_get_info(sp->draft);
    char w[32], c[32];
    fmt_bytes(di->weight_bytes, w, sizeof w);
    fmt_bytes(di->cache_budget_bytes, c, sizeof c);
    log_msg(LOG_INFO, "hyserve: draft model %s (%s, %d layers, weights %s, its cache %s)\n", cfg->model_draft,
            di->arch, di->n_layer, w, c);
    return 0;
}

static int start_kv_events(server *srv, const server_config *cfg, sched_params *sp, char *err, size_t errlen)
{
    const char *pod = getenv("POD_IP");
    char host[256];
    if (pod && *pod)
        snprintf(host, sizeof host, "%s", pod);
    else if (cfg->host[0] && strcmp(cfg->host, "0.0.0.0") && strcmp(cfg->host, "::") && strcmp(cfg->host, "[::]"))
        snprintf(host, sizeof host, "%s", cfg->host);
    else if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    char topic[600];
    snprintf(topic, sizeof topic, "kv@%s:%d@%s", host, cfg->port, server_model_name(srv));
    const engine_info *in = srv->info;
    const kvev_params kp = {
        .endpoint = cfg->kv_events,
        .topic = topic,
        .block_tokens = in->page_tokens,
        .kind = in->n_attn_layers > 0 ? "full_attention" : in->n_mla_layers > 0 ? "mla_attention" : "mamba",
        .replay_endpoint = cfg->kv_events_replay,
    };
    srv->kv_events = kvev_new(&kp, err, errlen);
    if (!srv->kv_events)
        return -1;
    sp->prefix_sink = (prefix_sink){ .fn = kvev_sink, .ctx = srv->kv_events };
    sp->prefix_snap_align = in->page_tokens;    /* recurrent states at block ends: group 1 of the events */
    log_msg(LOG_INFO, "hyserve: KV events on %s%s%s, topic %s, blocks of %d tokens%s\n", cfg->kv_events,
            cfg->kv_events_replay[0] ? ", replay on " : "", cfg->kv_events_replay, topic, in->page_tokens,
            sp->prefix_cache ? "" : " (none will come: --prefix-cache off)");
    return 0;
}

static void set_model_names(server *srv, const server_config *cfg)
{
    srv->n_model_names = 0;
    for (const char *p = cfg->served_names; *p && srv->n_model_names < SERVER_MAX_NAMES;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (n > 0 && n < sizeof srv->model_names[0]) {
            memcpy(srv->model_names[srv->n_model_names], p, n);
            srv->model_names[srv->n_model_names++][n] = '\0';
        }
        p += n + (nl ? 1 : 0);
    }
    if (srv->n_model_names > 0)
        return;
    const char *path = cfg->synth[0] ? cfg->synth : cfg->model;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && (!strcmp(base + n - 5, ".gguf") || !strcmp(base + n - 5, ".json")))
        n -= 5;
    if (n >= sizeof srv->model_names[0])
        n = sizeof srv->model_names[0] - 1;
    memcpy(srv->model_names[0], base, n);
    srv->model_names[0][n] = '\0';
    srv->n_model_names = n > 0;
}

/* system_fingerprint: "fp_" and 16 hex digits of FNV-1a 64 over the
 * build's version and commit and the model file's size and first MiB (its
 * GGUF header, metadata and tensor table), so it changes with the build or
 * the weights file and costs one small read. */
static void set_fingerprint(server *srv, const char *path)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    const char *parts[] = {hyserve_version(), "/", hyserve_git_commit(), "/"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *p = parts[i]; *p; p++)
            h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    FILE *f = fopen(path, "rb");
    if (f) {
        static unsigned char buf[1 << 16];
        size_t total = 0, n;
        while (total < (1u << 20) && (n = fread(buf, 1, sizeof buf, f)) > 0) {
            for (size_t i = 0; i < n; i++)
                h = (h ^ buf[i]) * 0x100000001b3ULL;
            total += n;
        }
        struct stat st;
        if (fstat(fileno(f), &st) == 0)
            for (int i = 0; i < 8; i++)
                h = (h ^ (unsigned char)((uint64_t)st.st_size >> (8 * i))) * 0x100000001b3ULL;
        fclose(f);
    }
    snprintf(srv->fingerprint, sizeof srv->fingerprint, "fp_%016llx", (unsigned long long)h);
}

int serve_main(int argc, char **argv)
{
    server_config cfg;
    server srv;
    char err[512];
    int rc = 1;

    json_init();        /* before any thread: cJSON allocates through the fault countdown */
    int lrc = config_load(&cfg, argc, argv, err, sizeof(err));
    if (lrc == 1)
        return 0;
    if (lrc < 0) {
        log_msg(LOG_ERROR, "hyserve: serve: %s\n", err);
        return 2;
    }
    if (cfg.log_format[0] && strcmp(cfg.log_format, "text") && strcmp(cfg.log_format, "json")) {
        log_msg(LOG_ERROR, "hyserve: serve: --log-format is text or json, got '%s'", cfg.log_format);
        return 2;
    }
    log_setup(!strcmp(cfg.log_format, "json"), cfg.log_probes);

    /* every thread created from here on inherits the blocked set, so the
     * signals reach only sigwait below */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    memset(&srv, 0, sizeof(srv));
    srv.cfg = &cfg;
    atomic_init(&srv.state, SERVER_LOADING);
    atomic_init(&srv.n_inflight, 0);
    atomic_init(&srv.next_id, 1);
    if (getrandom(&srv.id_salt, sizeof(srv.id_salt), 0) != (ssize_t)sizeof(srv.id_salt))
        srv.id_salt = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (auth_load(&cfg, &srv.keys, err, sizeof(err))) {
        log_msg(LOG_ERROR, "hyserve: serve: %s\n", err);
        return 2;
    }
    if (srv.keys.n)
        log_msg(LOG_INFO, "hyserve: %d API key%s: every route but /health, /live and /ready%s needs "
                        "'Authorization: Bearer KEY'\n", srv.keys.n, srv.keys.n > 1 ? "s" : "",
                cfg.metrics_public ? ", /metrics and /stats" : "");
    else if (strcmp(cfg.host, "127.0.0.1") && strcmp(cfg.host, "localhost") && strcmp(cfg.host, "::1"))
        log_msg(LOG_WARN, "hyserve: warning: no API key and listening on %s: anyone who reaches the port can "
                        "use the server (--api-key, --api-key-file, HYSERVE_API_KEY)\n", cfg.host);
    srv.t_start = engine_now_s();
    srv.started_at = time(NULL);
    /* the name X-Hyserve-Replica gives from the first response on */
    if (cfg.replica[0])
        snprintf(srv.replica, sizeof srv.replica, "%s", cfg.replica);
    else if (gethostname(srv.replica, sizeof srv.replica) != 0)
        srv.replica[0] = '\0';
    srv.replica[sizeof srv.replica - 1] = '\0';
    srv.m = metrics_new();
    if (!srv.m) {
        log_msg(LOG_ERROR, "hyserve: serve: out of memory\n");
        return 1;
    }

    /* HTTP first, so /health and /ready answer while the model loads */
    const http_hooks hooks = {.handle = routes_dispatch, .head = routes_head, .add_headers = cors_add_headers};
    if (http_start(&srv, &hooks, err, sizeof(err))) {
        log_msg(LOG_ERROR, "hyserve: serve: %s\n", err);
        goto out_metrics;
    }
    char what[1200];
    if (cfg.synth[0])   /* no file yet: say what will be made */
        snprintf(what, sizeof what, "a synthesized model with the cache layout of %s (small random weights)",
                 cfg.synth);
    else
        snprintf(what, sizeof what, "%s", cfg.model);
    if (cfg.config_path[0])
        log_msg(LOG_INFO, "hyserve: listening on http://%s:%d, loading %s (config %s)\n", cfg.host, cfg.port,
                what, cfg.config_path);
    else
        log_msg(LOG_INFO, "hyserve: listening on http://%s:%d, loading %s\n", cfg.host, cfg.port, what);
    if (cfg.metrics_port > 0)
        log_msg(LOG_INFO, "hyserve: metrics listener on http://%s:%d: GET /metrics, /health, /live and /ready, no "
                        "key\n", cfg.metrics_host[0] ? cfg.metrics_host : cfg.host, cfg.metrics_port);

    set_model_names(&srv, &cfg);

    /* --synth: a model with a preset's cache layout, written to a temporary
     * file that is unlinked once mapped */
    char synth_path[512] = "";
    if (cfg.synth[0]) {
        char lay_name[128];
        const char *tmp = getenv("TMPDIR");
        snprintf(synth_path, sizeof(synth_path), "%s/hyserve-synth-%d.gguf", tmp && *tmp ? tmp : "/tmp", (int)getpid());
        if (preset_synth_write(cfg.synth, synth_path, lay_name, sizeof lay_name, err, sizeof err)) {
            atomic_store(&srv.state, SERVER_FAILED);
            log_msg(LOG_ERROR, "hyserve: serve: --synth %s: %s\n", cfg.synth, err);
            goto out_http;
        }
        snprintf(cfg.model, sizeof(cfg.model), "%s", synth_path);
        log_msg(LOG_INFO, "hyserve: synthesized %s with the cache layout of %s\n", synth_path, lay_name);
    }

    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = cfg.model;
    ep.page_tokens = cfg.page_tokens;
    ep.kv_dtype = !strcmp(cfg.kv_dtype, "f16") ? ENGINE_KV_F16 : !strcmp(cfg.kv_dtype, "bf16") ? ENGINE_KV_BF16 : ENGINE_KV_F32;
    ep.state_dtype = !strcmp(cfg.state_dtype, "bf16") ? ENGINE_STATE_BF16 : ENGINE_STATE_F32;
    ep.n_ctx = cfg.ctx;
    ep.max_seqs = cfg.max_seqs;
    ep.cache_bytes = cfg.cache_mem;
    ep.huge_weights = cfg.huge_weights;
    ep.prefault_weights = true;
    ep.mtp = !strcmp(cfg.spec_type, "draft-mtp");   /* the MTP block's KV, made only for its drafts */
    sched_params sp;
    sched_params_default(&sp);
    sp.draft = NULL;
    apply_limits(&srv, &cfg, &ep, &sp);
    set_fingerprint(&srv, cfg.model);
    load_line ll;
    load_line_init(&ll, strcmp(cfg.log_format, "json") != 0);
    ep.progress = load_line_update;
    ep.progress_ctx = &ll;
    const double t_load = engine_now_s();
    srv.eng = engine_open(&ep, err, sizeof(err));
    const double load_s = engine_now_s() - t_load;
    load_line_finish(&ll);
    if (synth_path[0])
        unlink(synth_path);     /* the mapping keeps the data */
    if (!srv.eng) {
        atomic_store(&srv.state, SERVER_FAILED);
        log_msg(LOG_ERROR, "hyserve: serve: %s%s: %s\n", ep.mtp && strstr(err, "has no MTP block") ?
                "--spec-type draft-mtp needs a model with an MTP block; cannot use " : "cannot load ", cfg.model, err);
        goto out_http;
    }
    srv.info = engine_get_info(srv.eng);
    srv.chat_kind = chat_detect(srv.info->chat_template);
    if (srv.info->weights_note[0])
        log_msg(LOG_WARN, "hyserve: serve: warning: --huge-pages: %s\n", srv.info->weights_note);
    if (ep.cache_max_bytes && srv.info->cache_budget_bytes < ep.cache_max_bytes)
        srv.limits.cache_from = "engine default";   /* it fits the limit by itself */

    sp.max_queue = cfg.max_queue;
    sp.queue_timeout_s = cfg.queue_timeout;
    sp.max_unread_bytes = (size_t)cfg.max_stream_buffer;
    sp.prefill_chunk = cfg.prefill_chunk;
    sp.prefix_cache = strcmp(cfg.prefix_cache, "off") != 0;
    sp.prefix_budget_bytes = cfg.prefix_cache_mem;
    sp.prefix_snap_interval = cfg.prefix_snap_interval;
    sp.grammar_cache_bytes = (size_t)cfg.grammar_cache_mem;
    sp.spec_type = !strcmp(cfg.spec_type, "ngram-simple") ? SCHED_SPEC_NGRAM
                   : !strcmp(cfg.spec_type, "draft-simple") ? SCHED_SPEC_DRAFT
                   : !strcmp(cfg.spec_type, "draft-mtp") ? SCHED_SPEC_MTP : SCHED_SPEC_NONE;
    if (sp.spec_type == SCHED_SPEC_DRAFT && open_draft(&srv, &cfg, &ep, &sp) != 0)
        goto out_engine;
    sp.spec_n_max = cfg.spec_draft_n_max;
    sp.spec_n_min = cfg.spec_draft_n_min;
    sp.spec_cost = strcmp(cfg.spec_cost, "off") != 0;
    if (cfg.kv_events_replay[0] && !cfg.kv_events[0]) {
        atomic_store(&srv.state, SERVER_FAILED);
        log_msg(LOG_ERROR, "hyserve: serve: --kv-events-replay needs --kv-events\n");
        goto out_engine;
    }
    if (cfg.kv_events[0] && start_kv_events(&srv, &cfg, &sp, err, sizeof err) != 0) {
        atomic_store(&srv.state, SERVER_FAILED);
        log_msg(LOG_ERROR, "hyserve: serve: %s\n", err);
        goto out_engine;
    }
    srv.draft = sp.draft;
    srv.sched = sched_new(srv.eng, &sp, err, sizeof(err));
    if (!srv.sched || sched_start(srv.sched)) {
        atomic_store(&srv.state, SERVER_FAILED);
        log_msg(LOG_ERROR, "hyserve: serve: cannot start the scheduler: %s\n", srv.sched ? "thread creation failed" : err);
        goto out_engine;
    }
    char budget[32], panels[96] = "", limits[400];
    engine_kernels ek;
    engine_get_kernels(&ek);
    fmt_limits(&srv, ek.threads, limits, sizeof limits);
    fmt_bytes(srv.info->cache_budget_bytes, budget, sizeof(budget));
    if (srv.info->weights_in_panels)
        snprintf(panels, sizeof panels, ", %d BF16/F16/Q8_0 matrices in 16-row panels", srv.info->weights_in_panels);
    log_msg(LOG_INFO, "hyserve: ready: model \"%s\" loaded in %.1f s (%s, %d layers: %d attention + %d recurrent), ctx %d, max %d sequences, "
                    "cache budget %s, chat template %s, %d threads, OpenBLAS core %s, %s kernels, bf16 decode %s, "
                    "bf16 prompt %s, f16 prompt %s, f32 prompt %s, int8 prompts %s, weights %s%s%s, "
                    "replica %s\n",
            server_model_name(&srv), load_s, srv.info->arch, srv.info->n_layer, srv.info->n_attn_layers + srv.info->n_mla_layers,
            srv.info->n_rec_layers, srv.info->n_ctx, srv.info->max_seqs, budget, chat_kind_name(srv.chat_kind), ek.threads,
            ek.blas_core, ek.simd, ek.bf16_decode, ek.bf16_prompt, ek.f16_prompt, ek.f32_prompt, ek.int8_prompt,
            !strcmp(srv.info->weights_memory, "huge_pages") ? "in 2 MiB pages" : "mapped from the file", panels,
            limits, srv.replica[0] ? srv.replica : "(unnamed)");
    atomic_store_explicit(&srv.state, SERVER_READY, memory_order_release);

    wait_and_drain(&srv, &set);
    rc = 0;
    http_stop(&srv);
    sched_free(srv.sched);
    srv.sched = NULL;
    log_msg(LOG_INFO, "hyserve: drained, exiting\n");
out_engine:
    sched_free(srv.sched);
    srv.sched = NULL;
    kvev_free(srv.kv_events);   /* after the store, whose last clear it publishes */
    srv.kv_events = NULL;
    if (rc != 0)
        http_stop(&srv);
    engine_close(srv.eng);
    engine_close(sp.draft);     /* after the scheduler, its one user */
out_http:
    http_stop(&srv);
out_metrics:
    metrics_free(srv.m);
    return rc;
}

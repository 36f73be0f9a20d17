/* server.h - state shared by the HTTP threads of `hyserve serve`.
 *
 * Owns: the server struct and its lifecycle states.
 * Does not own: the engine internals (engine.h), scheduling (scheduler.h).
 */
#ifndef HYSERVE_SERVER_H
#define HYSERVE_SERVER_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "auth.h"
#include "cgroup.h"
#include "config.h"
#include "engine.h"
#include "scheduler.h"

enum server_state {
    SERVER_LOADING = 0,         /* HTTP is up, the model is not */
    SERVER_READY = 1,
    SERVER_DRAINING = 2,        /* SIGTERM seen: finishing in-flight work */
    SERVER_FAILED = 3,          /* the model failed to load */
};

typedef struct metrics metrics;
typedef struct guard guard;
typedef struct kvev kvev;
struct MHD_Daemon;

/* What the container's limits made of the defaults (serve.c), for /info
 * and the ready log line. Written once before SERVER_READY. */
typedef struct server_limits {
    cgroup_limits cg;           /* as read at start */
    const char *threads_from;   /* "--threads", "cgroup cpu limit" or "all cpus" */
    const char *cache_from;     /* "--cache-mem", "cgroup memory limit" or "engine default" */
    uint64_t cache_fit_bytes;   /* room beside the weights in the memory limit; 0: no limit */
    uint64_t headroom_bytes;    /* kept back from the memory limit; 0: no limit */
    uint64_t model_file_bytes;  /* the weights' file, counted against the limit */
} server_limits;

#define SERVER_MAX_NAMES 16

/* Owned by serve_main. eng, info, sched, draft and chat_kind are written once
 * before state becomes SERVER_READY (release store) and never after, so
 * HTTP threads read them freely once they have seen READY (acquire load). */
typedef struct server {
    const server_config *cfg;
    engine *eng;
    const engine_info *info;
    sched *sched;
    engine *draft;              /* --model-draft's engine (the scheduler runs it), NULL without */
    int chat_kind;              /* enum chat_kind */
    atomic_int state;           /* enum server_state */
    atomic_int n_inflight;      /* generation requests not yet answered or streamed out */
    atomic_uint_least64_t next_id;  /* request id counter */
    uint64_t id_salt;           /* random per process, mixed into request ids */
    struct MHD_Daemon *daemon;
    struct MHD_Daemon *metrics_daemon;  /* --metrics-port: /metrics and the probes, no key; NULL without */
    metrics *m;
    kvev *kv_events;            /* --kv-events publisher, NULL without; written before SERVER_READY */
    double t_start;             /* monotonic seconds at start */
    time_t started_at;          /* wall clock at start */
    char replica[256];          /* --replica or the host name: X-Hyserve-Replica, /info */
    server_limits limits;
    auth_keys keys;             /* loaded before HTTP starts; read-only after */
    guard *guard;               /* connection deadlines (http.c) */
    char model_names[SERVER_MAX_NAMES][128];  /* [n_model_names] served names, the first the main one */
    int n_model_names;
    char fingerprint[32];       /* system_fingerprint: "fp_" + hash of the build and the model file */
} server;

/* The name answers carry (the first served name). */
static inline const char *server_model_name(const server *srv)
{
    return srv->n_model_names > 0 ? srv->model_names[0] : srv->info ? srv->info->name : "";
}

#endif

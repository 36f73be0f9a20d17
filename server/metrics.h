/* metrics.h - request counters and histograms, /stats and /metrics.
 *
 * Owns: the counters HTTP threads update when a request ends, and the
 * rendering of /stats (JSON) and /metrics (Prometheus text) from them plus
 * the scheduler's published numbers.
 * Does not own: the cache accounting itself (engine) or scheduling.
 * ref: docs/serving.md 6 and 7.
 */
#ifndef HYSERVE_METRICS_H
#define HYSERVE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "server.h"

/* One finished request, as the log line and the counters see it. */
typedef struct metrics_req {
    const char *path;           /* the request's path (counted under its route, or "other") */
    bool generation;            /* a generation route (counts tokens and latencies) */
    int status;                 /* HTTP status */
    const char *finish;         /* "length" | "eos_token" | "stop_sequence" | NULL */
    const char *failure;        /* "validation" | "overloaded" | "cancelled" | "internal" | ... | NULL */
    int n_prompt, n_gen;
    double queue_s, ttft_s, e2e_s;  /* < 0: unknown */
    uint64_t cache_bytes;       /* peak cache bytes held */
} metrics_req;

metrics *metrics_new(void);
void metrics_free(metrics *m);
void metrics_record(metrics *m, const metrics_req *r);
/* One inter-token gap of a generation (seconds between two sampled tokens). */
void metrics_observe_itl(metrics *m, double gap_s);

/* Prometheus exposition text (malloc'd, NUL-terminated), or NULL on OOM. */
char *metrics_prometheus(server *srv);
/* The /stats document. request_id: only that request (NULL: all);
 * with_requests false omits the list; viewer (an API key's id, 0: any)
 * lists only the live requests that key sent. NULL on OOM. */
cJSON *metrics_stats_json(server *srv, const char *request_id, bool with_requests, int viewer);

#endif

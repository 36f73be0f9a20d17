/* memest.h - the body of POST /v1/memory/estimate, read into what the
 * planner needs.
 *
 * Owns: the request's fields and their rules ("preset" or "layout" or the
 * served model, "context", "batch", "kv_dtype", "state_dtype",
 * "page_tokens", "budget", "speculative"). Does not own: the arithmetic (memplan.c), the
 * answer's shape (memplan_estimate_json), HTTP (routes.c).
 * Kept apart from the route so tests/fuzz/fuzz_memest.c can drive it.
 * ref: docs/serving.md section 6 (memory planning), README route table.
 */
#ifndef HYSERVE_MEMEST_H
#define HYSERVE_MEMEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* A validated estimate request. */
typedef struct memest_req {
    memplan_layout l;           /* the preset's, the body's or the served model's */
    int64_t context;            /* tokens per sequence, 1..1e9 */
    int64_t batch;              /* sequences, 1..1e6 */
    uint64_t budget;            /* bytes; 0: none given */
    bool served;                /* l is the served model's (no "preset" or "layout") */
    int speculative;            /* "speculative": 1 true, 0 false, -1 not given */
} memest_req;

/* Reads body[0..len) (len 0: an empty object). served is the loaded
 * model's layout (name and max_context filled) with served_ctx its context,
 * or NULL while it loads. Returns JSON_OK, or JSON_EPARSE (not JSON),
 * JSON_EINVALID (a field; err names it) or JSON_ENOMEM, with err filled. */
int memest_parse(const char *body, size_t len, const memplan_layout *served, int64_t served_ctx, memest_req *out,
                 char *err, size_t errlen);

#endif

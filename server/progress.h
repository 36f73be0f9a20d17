/* progress.h - the load's progress line on a terminal (`hyserve serve -m
 * FILE` for a large file): the phase that moves the weights, MiB done of
 * its total, the percent and the seconds left, rewritten in place on
 * stderr at most five times a second and ended with a newline when the
 * phase completes. Only when stderr is a terminal and logs are text:
 * container logs and JSON logs get the ready line alone, which says how
 * long the load took. */
#ifndef HYSERVE_PROGRESS_H
#define HYSERVE_PROGRESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct load_line {
    pthread_mutex_t mu;
    bool on;                /* stderr is a terminal, logs are text */
    bool open;              /* a line is written and not yet ended */
    const char *phase;      /* the phase last heard of */
    bool ended;             /* ... and it completed */
    double t0, last;        /* when it began, when the line was last written */
} load_line;

void load_line_init(load_line *l, bool text_logs);
/* engine_progress_fn: ctx is the load_line */
void load_line_update(void *ctx, const char *phase, uint64_t done, uint64_t total);
/* After the load (done or failed): ends a line left open. */
void load_line_finish(load_line *l);

#endif

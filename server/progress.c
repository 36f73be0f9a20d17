/* progress.c - the load's progress line (progress.h). */
#include "progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void load_line_init(load_line *l, bool text_logs)
{
    pthread_mutex_init(&l->mu, NULL);
    l->on = text_logs && isatty(STDERR_FILENO);
    l->open = l->ended = false;
    l->phase = NULL;
    l->t0 = l->last = 0;
}

void load_line_update(void *ctx, const char *phase, uint64_t done, uint64_t total)
{
    load_line *l = ctx;
    if (!l->on || !total)
        return;
    const bool end = done >= total;
    /* the part that completes a phase always writes; others skip a busy line */
    if (end ? pthread_mutex_lock(&l->mu) != 0 : pthread_mutex_trylock(&l->mu) != 0)
        return;
    const double t = now_s();
    if (phase != l->phase) {
        l->phase = phase;
        l->ended = false;
        l->t0 = t;
        l->last = -1;
    }
    /* a late part of a phase already ended (parts finish in any order) writes nothing */
    if (!l->ended && (end || done == 0 || t - l->last >= 0.2)) {
        const double el = t - l->t0, left = done && !end ? el * (double)(total - done) / (double)done : 0;
        char tail[48] = "";
        if (end)
            snprintf(tail, sizeof tail, ", %.1f s", el);
        else if (done)
            snprintf(tail, sizeof tail, ", %.0f s left", left + 0.5);
        fprintf(stderr, "\rhyserve: loading: %s: %.1f of %.1f MiB (%.0f%%)%s\033[K%s", phase, (double)done / 1048576.0,
                (double)total / 1048576.0, 100.0 * (double)done / (double)total, tail, end ? "\n" : "");
        fflush(stderr);
        l->last = t;
        l->open = !end;
        l->ended = end;
    }
    pthread_mutex_unlock(&l->mu);
}

void load_line_finish(load_line *l)
{
    pthread_mutex_lock(&l->mu);
    if (l->open)
        fputs("\n", stderr);
    l->open = false;
    pthread_mutex_unlock(&l->mu);
    pthread_mutex_destroy(&l->mu);
}

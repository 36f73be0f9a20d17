/* scheduler_impl.h - the scheduler's structs, shared by scheduler.c and
 * its tests only (tests/test_scheduler.c corrupts copies to show that
 * sched_broken notices). Everyone else goes through scheduler.h. */
#ifndef HYSERVE_SCHEDULER_IMPL_H
#define HYSERVE_SCHEDULER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "scheduler.h"

enum req_state {
    RS_QUEUED = 0,
    RS_PREFILL = 1,
    RS_DECODE = 2,
    RS_DONE = 3,
};

/* One request. Shared by the submitter and the scheduler (refs). */
struct sched_req {
    /* immutable after sched_submit */
    sched *s;
    char id[80];
    int owner;                  /* sched_req_params.owner */
    int n_prompt;
    int max_new;
    int32_t *tokens;            /* [n_prompt + max_new]: prompt, then generated (scheduler writes) */
    sampler *smp;               /* used by the scheduler thread only */
    uint64_t seed;
    char **stop;                /* [n_stop] NUL-terminated copies */
    int n_stop;
    bool include_stop;
    double t_submit;            /* seconds, monotonic */

    /* scheduler thread only */
    int seq;                    /* engine sequence id, -1 when none */
    int slot;                   /* logits slot, -1 when none */
    int n_fed;                  /* tokens already in the engine cache */
    int n_gen;                  /* tokens sampled */
    char *pending;              /* [cap_pending] decoded bytes not yet released */
    size_t n_pending, cap_pending;
    sched_event final_ev;       /* the last token's event, pushed once the sequence is freed */

    /* under s->mu */
    sched_req *wait_next;       /* wait queue link */
    int state;                  /* enum req_state */
    engine_seq_usage usage;     /* at the last step */
    uint64_t peak_bytes;
    double t_admit, t_first, t_end;   /* 0 until reached */
    int pub_n_gen;              /* n_gen as of the last event */
    int pub_n_fed;
    char cancel_msg[128];       /* why, when cancelled by the server */
    bool cancel_by_id;          /* set before cancel by sched_cancel_id: the error is SCHED_EDELETED */

    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int efd;                    /* eventfd: readable while events are pending */
    sched_event *q;             /* [q_cap] ring of pending events */
    int q_head, q_len, q_cap;
    size_t q_bytes;             /* the queued events' records and text: what the submitter has not read */

    atomic_bool cancel;
    atomic_int refs;            /* submitter + scheduler */
};

/* The scheduler. Owned by the control thread that made it; the engine is
 * used only by the scheduler thread between sched_start and sched_free.
 * Invariants (sched_broken checks them, under s->mu, at every admission
 * and finish, and with HYSERVE_CHECKS after every step):
 *   0 <= n_running <= max_seqs, and n_running + n_free_slots == max_seqs:
 *   every logits slot is held by one running request or free;
 *   every running request is prefilling or decoding and owns one live
 *   engine sequence holding exactly its n_fed tokens, and the engine has
 *   no other live sequence (the scheduler owns every sequence);
 *   the wait queue holds n_waiting <= max_queue requests, all queued,
 *   none with a sequence or a slot, wait_tail its last. */
struct sched {
    engine *e;
    const engine_info *info;
    sched_params p;
    int max_seqs;
    int n_vocab;
    int32_t *eog;               /* [n_eog] the end-of-generation token ids, listed at sched_new for ignore_eos */
    int n_eog;

    pthread_t thread;
    bool started;

    /* scheduler thread only */
    float *logits;              /* [max_seqs][n_vocab] one slot per running request */
    int *free_slots;            /* [max_seqs] stack of free slot indices */
    int n_free_slots;
    engine_batch_item *items;   /* [max_seqs] */
    sched_req **item_req;       /* [max_seqs] request of items[i] */
    sched_req **ended;          /* [max_seqs] requests that ended this step, not yet told */
    sched_event *ended_ev;      /* [max_seqs] their last event */
    int n_ended;
    int *rcs;                   /* [max_seqs] each item's outcome in this step */
    uint8_t *check_marks;       /* [max_seqs] sched_broken's scratch */

    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* the scheduler sleeps here when idle */
    bool stop;
    bool draining;
    sched_req *wait_head, *wait_tail;
    int n_waiting;
    sched_req **running;        /* [max_seqs], admission order */
    int n_running;
    sched_stats st;
    double ema_req_s;           /* smoothed request duration, for Retry-After */
};

/* Invariants of s (see struct sched): NULL when they all hold, else the
 * first broken one, as a static string. Caller holds s->mu and is the
 * thread that owns the engine (the scheduler thread, or any thread before
 * sched_start and after sched_free's join). */
const char *sched_broken(const sched *s);
/* sched_broken(s) == NULL; else says which invariant broke on stderr. For
 * assert() (invariant.h). */
bool sched_check(const sched *s);

#endif

/* scheduler_impl.h - the scheduler's structs, shared by scheduler.c and
 * its tests only (tests/test_scheduler.c corrupts copies to show that
 * sched_broken notices). Everyone else goes through scheduler.h. */
#ifndef HYSERVE_SCHEDULER_IMPL_H
#define HYSERVE_SCHEDULER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "grammar.h"
#include "scheduler.h"
#include "spec_cost.h"

/* Prompt tokens per step of a request that asked for prompt logprobs:
 * their logits come back for every position, SCHED_PLP_ROWS rows at a time,
 * into the scheduler's one buffer (so one such request prefills per step;
 * the buffer is allocated once, whatever the queue holds). */
#define SCHED_PLP_ROWS 8

/* Speculative decoding (sched_spec.c): the most draft tokens one verify
 * step takes per sequence (--spec-draft-n-max at most this). */
#define SCHED_SPEC_MAX SCHED_SPEC_MAX_POS

/* One request's speculation. Scheduler thread only (the counters are
 * copied into sched_req.pub_spec under s->mu after every step). */
typedef struct sched_spec {
    bool on;                    /* drafts are proposed and verified for this request */
    bool ngram;                 /* n-gram (prompt lookup) drafts from the prompt and the output */
    int32_t *pred;              /* [n_pred] the client's prediction as token ids (heap), NULL: none */
    int n_pred;
    int pred_pos;               /* the prediction index the output should continue with; -1: lost */
    int pred_lo;                /* where alignment was last lost: a re-alignment looks from here first */
    int n_aligned;              /* output tokens the aligner has seen */
    engine_snap *snap;          /* models with recurrent layers: the verify step's snapshot of the state
                                 * after the accepted tokens it carries (the rollback point), held from
                                 * admission to the end, counted in the pool */
    int32_t draft[SCHED_SPEC_MAX]; /* [n_draft] proposed for the next step */
    int n_draft;
    bool draft_pred;            /* those came from the prediction (else the n-gram) */
    int n_fed_draft;            /* drafts in this step's item (0: a plain decode step) */
    int k;                      /* adaptive draft length, n_min..n_max */
    int cool;                   /* steps left without drafts after verify steps accepted nothing */
    int miss;                   /* verify steps in a row that accepted nothing */
    double hits, trials;        /* acceptance per draft position, decayed sums: accepted drafts, and those
                                 * plus the rejected one (the cost gate's rate a = (hits + 1/2) / (trials + 1)) */
    int declined;               /* proposals in a row the cost gate declined (every SPEC_PROBE-th drafts anyway) */
    sched_spec_counts n;        /* the counters */
    /* the draft model (SCHED_SPEC_DRAFT) */
    bool dmodel;                /* drafts from the draft model where the prediction has none */
    bool dwant;                 /* spec_propose queued r for this step's draft rounds (spec_draft_model) */
    bool draft_dm;              /* the draft in draft[] came from the draft model */
    int dwant_k;                /* the draft length it asked for */
    int dseq;                   /* its sequence in the draft engine, -1: none yet (made at its first draft) */
    engine_snap *dsnap;         /* a recurrent draft model: the draft sequence's state at dbase (in its pool) */
    int dbase;                  /* the draft sequence's length before its draft tokens were fed */
    int dfed;                   /* draft tokens fed to the draft sequence after dbase */
    /* the MTP block (SCHED_SPEC_MTP): the MTP KV holds rows for trunk
     * positions [mbase, mbase + engine_mtp_len) */
    bool mtp;                   /* drafts from the MTP block where the prediction has none */
    bool mwant;                 /* spec_propose asked for an MTP draft of mwant_k tokens after this step */
    int mwant_k;
    float *mhid;                /* [s->mtp_rows][n_embd] this step's trunk hidden rows (heap, from admission) */
    int hpos0, hrows;           /* the trunk positions those rows are of: [hpos0, hpos0 + hrows) */
    int mbase;                  /* the trunk position of the MTP KV's row 0 */
    int mkeep;                  /* its rows of accepted tokens while drafting (chained rows past it go back) */
} sched_spec;

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
    char tags[SCHED_TAGS_MAX];  /* sched_req_params.tags */
    int owner;                  /* sched_req_params.owner */
    int n_prompt;
    int max_new;
    int32_t *tokens;            /* [n_prompt + max_new]: prompt, then generated (scheduler writes) */
    sampler *smp;               /* used by the scheduler thread only */
    gram_matcher *gm;           /* the output constraint or NULL; scheduler thread only after submit */
    uint64_t seed;
    char **stop;                /* [n_stop] NUL-terminated copies */
    int n_stop;
    bool include_stop;
    int top_logprobs;           /* sched_req_params.top_logprobs */
    bool prompt_lp;             /* sched_req_params.prompt_logprobs, with a prompt of 2 tokens or more */
    double t_submit;            /* seconds, monotonic */

    /* scheduler thread only */
    int seq;                    /* engine sequence id, -1 when none */
    int slot;                   /* logits slot, -1 when none */
    int n_fed;                  /* tokens already in the engine cache */
    int n_gen;                  /* tokens sampled */
    char *pending;              /* [cap_pending] decoded bytes not yet released */
    size_t n_pending, cap_pending;
    sched_event final_ev;       /* the last token's event, pushed once the sequence is freed */
    char *salt;                 /* sched_req_params.cache_salt, copied ("" for none) */
    prefix_match pm;            /* what admission found in the prefix store */
    int hints[SCHED_MAX_SNAP_HINTS]; /* [n_hints] sched_req_params.snap_hints, ascending, in (0, n_prompt) */
    int n_hints;
    int *snap_at;               /* [n_snap_at] ascending prompt lengths to snapshot at (prefill stops there) */
    int n_snap_at, i_snap_at;   /* i_snap_at: the next one */
    engine_snap **snaps;        /* [n_snap_at] taken so far, handed to the store at the end */
    int n_snaps;
    int pub_n_snaps;            /* under s->mu: n_snaps as of the last step, for /stats */
    /* a group (sched_submit_group): choice 0, the leader, prefills the
     * prompt; each other choice, a follower, holds an empty placeholder
     * sequence reserving what its fork will own until the leader's prefill
     * ends, then forks the leader's sequence and samples its first token
     * from a copy of the leader's last logits */
    char gid[80];               /* the group's id (sched_cancel_id matches it too); "" alone */
    sched_req *leader;          /* a follower not forked yet: its leader (else NULL) */
    sched_req **fol;            /* [n_fol] a leader's followers not forked yet (NULL: ended) */
    int n_fol;
    bool await_fork;            /* a follower whose leader is still prefilling */
    int fork_rc;                /* the step the follower forked in: as after_item's result */
    sched_spec spec;            /* speculative decoding (sched_spec.c) */

    /* under s->mu */
    sched_req *wait_next;       /* wait queue link */
    int state;                  /* enum req_state */
    engine_seq_usage usage;     /* at the last step */
    uint64_t peak_bytes;
    double t_admit, t_first, t_end;   /* 0 until reached */
    int pub_n_gen;              /* n_gen as of the last event */
    int pub_n_fed;
    sched_spec_counts pub_spec; /* spec.n as of the last step */
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
 *   engine sequence holding exactly its n_fed tokens, and the engine's
 *   other live sequences are the prefix store's entries (the scheduler owns
 *   every sequence);
 *   the wait queue holds n_waiting <= max_queue requests, all queued,
 *   none with a sequence or a slot, wait_tail its last;
 *   a follower awaiting its fork is fed nothing and its leader is live
 *   (queued before it, or running), still listing it. */
struct sched {
    engine *e;
    const engine_info *info;
    sched_params p;
    int max_seqs;
    int n_vocab;
    int32_t *eog;               /* [n_eog] the end-of-generation token ids, listed at sched_new for ignore_eos */
    int n_eog;
    pthread_mutex_t gram_mu;    /* guards building gram_vocab and gram_cache */
    gram_vocab *gram_vocab;     /* the vocabulary's byte trie, built by the first constrained request */
    _Atomic(gram_cache *) gram_cache; /* compiled grammars and their masks, shared by requests (its own
                                 * lock); set once under gram_mu, read by /stats without it */

    pthread_t thread;
    bool started;

    /* scheduler thread only */
    float *logits;              /* [max_seqs][n_vocab] one slot per running request */
    float *plp_logits;          /* [SCHED_PLP_ROWS][n_vocab] every position's logits of one prompt-logprob chunk a step */
    int *free_slots;            /* [max_seqs] stack of free slot indices */
    int n_free_slots;
    engine_batch_item *items;   /* [max_seqs] */
    sched_req **item_req;       /* [max_seqs] request of items[i] */
    sched_req **ended;          /* [max_seqs] requests that ended this step, not yet told */
    sched_event *ended_ev;      /* [max_seqs] their last event */
    int n_ended;
    int *rcs;                   /* [max_seqs] each item's outcome in this step */
    sched_req **forked;         /* [max_seqs] followers that forked this step (their fork_rc says how) */
    int n_forked;
    uint8_t *check_marks;       /* [max_seqs] sched_broken's scratch */
    float *spec_logits;         /* [spec_rows][n_vocab] every position's logits of this step's verify items */
    int spec_rows;              /* rows of spec_logits: verify items of one step take at most these */
    bool spec_rec;              /* the model has recurrent layers: a rejected draft rolls back to a snapshot */
    uint64_t spec_pos[SCHED_SPEC_MAX]; /* accepted drafts by position, not yet added to st (published per step) */
    sched_spec_counts spec_step; /* this step's counts, the same */
    spec_cost cost;             /* decode-only steps' seconds by rows (the cost gate; sched_params.spec_cost) */
    int cost_seqs;              /* decoding sequences in the last step: the gate's N and R */
    bool cost_fixed;            /* cost holds sched_params.spec_step_seconds: no step is observed */
    engine *de;                 /* the draft model's engine (sched_params.draft), NULL: none */
    bool spec_drec;             /* it has recurrent layers: its rollback restores dsnap */
    sched_req **dwant;          /* [max_seqs] requests whose draft the draft model makes after this step */
    int n_dwant;
    engine_batch_item *ditems;  /* [max_seqs] one draft round's items */
    sched_req **dreq;           /* [2 * max_seqs] the drafting requests, then one round's in item order */
    float *dlogits;             /* [max_seqs][n_vocab] the draft rounds' last-position logits */
    int mtp_rows;               /* SCHED_SPEC_MTP: rows of a request's mhid (its largest item) */
    engine_mtp_item *mitems;    /* [max_seqs] one MTP round's items */
    sched_req **mreq;           /* [2 * max_seqs] the MTP's requests this step, then one round's */
    float *mlogits;             /* [max_seqs][n_vocab] an MTP round's logits */
    float *mout;                /* [max_seqs][n_embd] each drafting request's last MTP output (a chained row's h) */

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
    prefix_store *prefix;       /* NULL when the prefix cache is off; scheduler thread only */
    pthread_cond_t reset_cv;    /* sched_prefix_reset waits here for the scheduler thread */
    uint64_t reset_asked, reset_done;   /* resets asked for and carried out (tickets) */
    sched_prefix_freed reset_last;      /* what the last reset freed */
    double ema_req_s;           /* smoothed request duration, for Retry-After */

    /* under pub_mu, held only to copy them: what publish_stats last saw */
    pthread_mutex_t pub_mu;
    sched_stats pub;
    sched_live_totals pub_tot;
};

/* sched_grammar.c: structured output. sched_grammar_attach compiles
 * p's constraint into r->gm (0, SCHED_EINVAL with the reason in err, or
 * SCHED_ENOMEM); sched_grammar_mask bans the tokens that cannot come next
 * (SCHED_EENGINE on an internal limit, SCHED_ENOMEM when the matcher ran
 * out of memory); sched_grammar_advance moves past the sampled token (the
 * same errors); sched_grammar_done says the output is complete and
 * nothing can follow. */
int sched_grammar_attach(sched *s, sched_req *r, const sched_req_params *p, char *err, size_t errlen);
int sched_grammar_mask(sched_req *r, float *logits);
int sched_grammar_advance(sched_req *r, int32_t tok);
bool sched_grammar_done(const sched_req *r);
void sched_grammar_deinit(sched *s);
/* The grammar cache's numbers (zeros and the budget before the first
 * constrained request). Any thread; takes the cache's lock only. */
void sched_grammar_get_stats(sched *s, sched_grammar_stats *st);

/* Invariants of s (see struct sched): NULL when they all hold, else the
 * first broken one, as a static string. Caller holds s->mu and is the
 * thread that owns the engine (the scheduler thread, or any thread before
 * sched_start and after sched_free's join). */
const char *sched_broken(const sched *s);
/* sched_broken(s) == NULL; else says which invariant broke on stderr. For
 * assert() (invariant.h). */
bool sched_check(const sched *s);

/* ---- shared by scheduler.c's pieces (sched_request.c, sched_prefix.c, sched_admit.c, sched_text.c, sched_step.c) ---- */

/* DeltaNet blocks and KV page regions kept mapped ahead of need while the
 * store is on (sched_new). */
enum { SCHED_SPARE_BLOCKS = 2, SCHED_SPARE_REGIONS = 2 };

/* scheduler.c */
void cancel_by_id(sched_req *r, const char *why);
/* sched_request.c */
void req_unref(sched_req *r);
int req_push(sched_req *r, sched_event *ev);
void req_push_error(sched_req *r, int status, const char *msg);
/* sched_prefix.c: the scheduler's side of the prefix cache (when to look
 * up, snapshot and keep). The store's own calls are prefix_* (prefix.h);
 * these are named apart so a reader never takes one for the other. */
void publish_pool(sched *s);
/* Copy the counters, the queue lengths and the running requests' totals
 * for sched_get_published. Caller holds s->mu. */
void publish_stats(sched *s);
bool drop_running_snaps(sched *s);
int sched_seq_acquire(sched *s, const prefix_query *q, int n_reserve, prefix_match *m);
int admit_seq_from_store(sched *s, sched_req *r, int total);
int prefill_chunk(sched *s, sched_req *r, int k, engine_batch_item *it);
void step_snap_drop(sched *s, engine_batch_item *it);
void snaps_due(sched *s, sched_req *r, engine_batch_item *it);
void drop_snaps(sched *s, sched_req *r);
void store_reset_due(sched *s);
void keep_in_store(sched *s, sched_req *r);
/* sched_admit.c */
void run_fail(sched *s, sched_req *r, int status, const char *msg);
void wait_reject(sched *s, sched_req *r, int status, const char *msg);
sched_req *group_take(sched_req *r, int i);
void run_finish(sched *s, sched_req *r, int status, sched_event *ev);
void tell_ended(sched *s);
int cancel_status(const sched_req *r);
void admit(sched *s);
/* sched_text.c */
int on_token(sched *s, sched_req *r, int32_t tok, float logprob, const sampler_top *top);
/* sched_step.c */
void *sched_main(void *arg);
int sample_emit(sched *s, sched_req *r, float *logits, int32_t *tok);
/* sched_spec.c: speculative decoding. spec_attach sets up r's speculation
 * from p at submission (0, SCHED_EINVAL with a message, or SCHED_ENOMEM);
 * spec_admit takes its rollback snapshot at admission (s->mu held);
 * spec_item shapes a decoding request's item (the accepted tokens not fed
 * yet and the drafts: every verify item is built there), taking rows of
 * s->spec_logits from *rows_left; spec_after verifies and emits after the
 * step (0, 1 finished, or an error, as after_item); spec_propose, told
 * that result, follows the output through the prediction and drafts for
 * the next step when the request goes on; spec_release gives the snapshot back (s->mu held);
 * spec_publish adds the step's counts to s->st (s->mu held). */
int spec_attach(sched *s, sched_req *r, const sched_req_params *p, char *err, size_t errlen);
void spec_admit(sched *s, sched_req *r);
void spec_item(sched *s, sched_req *r, engine_batch_item *it, int *rows_left, int *row_off);
int spec_after(sched *s, sched_req *r, engine_batch_item *it);
void spec_propose(sched *s, sched_req *r, int rc);
void spec_release(sched *s, sched_req *r);
void spec_publish(sched *s);
/* The draft model's rounds for the requests spec_propose queued this step
 * (after every item's after_item; s->mu not held). */
void spec_draft_model(sched *s);
/* After every step (SCHED_SPEC_MTP): the MTP rows of the step's accepted
 * trunk rows, then the MTP drafts of the requests that asked (sched_spec.c). */
void spec_mtp(sched *s, int n_items);
int spec_init(sched *s, char *err, size_t errlen);

#endif

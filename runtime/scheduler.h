/* scheduler.h - continuous batching over one engine.
 *
 * Owns: the scheduler thread (the only thread that touches the engine
 * after start), the bounded wait queue, admission against the cache
 * budget (prompt + max_new_tokens reserved up front), chunked prefill,
 * sampling, end-of-generation checks (EOG token, stop strings, max
 * tokens), UTF-8-safe text release, and the per-request event queues.
 * Does not own: tokenization of the prompt and validation of request
 * fields (the HTTP side does both before sched_submit), chat templates,
 * HTTP or JSON.
 * ref: docs/serving.md section 5 (admission), 2.3 and 2.4
 * (UTF-8 hold-back, cancel on disconnect).
 *
 * Threads: sched_new/sched_start/sched_free from one control thread.
 * sched_submit, sched_req_* and the sched_stats/sched_drain family from any
 * thread. A request handle is shared by the submitter and the scheduler
 * (reference counted); the submitter ends its use with sched_req_release,
 * which also cancels the request if it is still live.
 */
#ifndef HYSERVE_SCHEDULER_H
#define HYSERVE_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "prefix.h"
#include "sampler.h"

typedef struct sched sched;
typedef struct sched_req sched_req;

/* Status codes: 0 or one of these negative values. */
enum sched_status {
    SCHED_OK = 0,
    SCHED_EFULL = -1,       /* wait queue full (overloaded) */
    SCHED_EDRAINING = -2,   /* shutting down, no new work */
    SCHED_ETOOBIG = -3,     /* can never fit: context or cache budget */
    SCHED_ETIMEOUT = -4,    /* waited longer than the queue timeout */
    SCHED_ENOMEM = -5,      /* allocation failed */
    SCHED_EENGINE = -6,     /* engine_forward failed */
    SCHED_ECANCELLED = -7,  /* cancelled (client gone or shutdown) */
    SCHED_EINVAL = -8,      /* bad parameters */
    SCHED_EDELETED = -9,    /* cancelled by its id (sched_cancel_id: DELETE /requests/{id}) */
};

enum sched_finish {
    SCHED_FINISH_NONE = 0,
    SCHED_FINISH_LENGTH = 1,    /* max_new_tokens reached */
    SCHED_FINISH_EOS = 2,       /* end-of-generation token */
    SCHED_FINISH_STOP = 3,      /* a stop string matched */
};

typedef struct sched_params {
    int max_queue;              /* waiting requests at most; <= 0: 64 */
    double queue_timeout_s;     /* longest wait before admission; <= 0: 30 */
    int prefill_chunk;          /* prompt tokens per step over all sequences; <= 0: 512 */
    int n_threads;              /* OpenMP threads of the scheduler thread (the engine's -t); <= 0: default */
    bool prefix_cache;          /* keep finished requests' caches for reuse (prefix.h); false: none */
    uint64_t prefix_budget_bytes; /* the prefix store's bytes at most; 0: a quarter of the cache budget */
    int prefix_snap_interval;   /* with DeltaNet layers: a snapshot every this many prompt tokens; 0: none */
    prefix_sink prefix_sink;    /* told of the prefix store's entries as they come and go (the KV events) */
    int prefix_snap_align;      /* > 1: every snapshot length a prompt takes is rounded down to a multiple of
                                   this (the KV events' block: a state at a block's end has a block hash a
                                   router can match); a restore then recomputes up to this many - 1 more */
    size_t max_unread_bytes;    /* bytes of events (records + text) a request may hold unread; past it
                                 * the request is cancelled and its sequence freed (a client that reads
                                 * nothing cannot make the server buffer without bound); 0: no limit */
    size_t grammar_cache_bytes; /* compiled grammars and their token masks kept for later requests of the
                                 * same constraint, least recently used evicted (default 64 MiB); 0: none */
    int spec_type;              /* enum sched_spec_type (default SCHED_SPEC_NONE) */
    int spec_n_max;             /* draft tokens per verify step at most, 1..SCHED_SPEC_MAX (default 16) */
    int spec_n_min;             /* a draft shorter than this is not verified, 0..spec_n_max (default 0) */
    engine *draft;              /* SCHED_SPEC_DRAFT: the draft model's engine, opened and closed by the caller
                                   (after sched_free), used only by the scheduler thread in between; the same
                                   vocabulary as the target (sched_new refuses another); NULL: none */
    bool spec_cost;             /* the draft length also weighs the measured step time by rows, so a draft that
                                   costs more time than its expected accepted tokens save is not made (spec_cost.h;
                                   default true); false: acceptance alone */
    const double *spec_step_seconds; /* [spec_step_seconds_n] tests: fixed step seconds by rows (index 0 unused)
                                   instead of the measured ones; NULL: measured */
    int spec_step_seconds_n;
} sched_params;

void sched_params_default(sched_params *p);

/* Speculative decoding's draft sources on the server's side
 * (sched_params.spec_type); a request's own prediction needs none. */
enum sched_spec_type {
    SCHED_SPEC_NONE = 0,        /* only the drafts a request brings (its prediction) */
    SCHED_SPEC_NGRAM = 1,       /* also n-gram / prompt lookup drafts (llama-server's ngram-simple) */
    SCHED_SPEC_DRAFT = 2,       /* also a draft model's greedy tokens (draft-simple; sched_params.draft) */
    SCHED_SPEC_MTP = 3,         /* also the model's MTP block's greedy tokens (draft-mtp; the engine opened
                                   with engine_params.mtp) */
};

/* Speculation's counts: per request (sched_result, /stats) and in total (sched_stats). */
typedef struct sched_spec_counts {
    uint64_t drafts;            /* verify steps that carried drafts */
    uint64_t drafted;           /* draft tokens verified */
    uint64_t accepted;          /* of them, accepted (emitted as the target's own tokens) */
    uint64_t pred_accepted;     /* output tokens the prediction held at that place (OpenAI's
                                 * accepted_prediction_tokens: the prediction's tokens that appeared in
                                 * the completion, followed in order, the first token and the verifier's
                                 * own tokens included) */
    uint64_t pred_rejected;     /* prediction tokens drafted and rejected by the verifier (the work they
                                 * cost; OpenAI's rejected_prediction_tokens) */
    uint64_t rollbacks;         /* verify steps that rolled the sequence back (a draft rejected) */
    uint64_t declined;          /* decode steps whose draft the cost gate declined (sched_params.spec_cost) */
} sched_spec_counts;

enum { SCHED_MAX_SNAP_HINTS = 4 };  /* snapshot hints a request carries at most */

/* What a submitter asks for. Everything is copied by sched_submit. */
typedef struct sched_req_params {
    const char *id;             /* request id for /stats and logs */
    const char *tags;           /* routing tags /stats shows with it ("name=value" pairs separated by
                                   spaces: the gateway's x-llm-d-* headers), NULL: none; cut at
                                   SCHED_TAGS_MAX - 1 bytes */
    int owner;                  /* who may cancel it by id (the server: its API key; 0 for all) */
    const int32_t *prompt;      /* [n_prompt] token ids, n_prompt >= 1 */
    int n_prompt;
    int max_new_tokens;         /* >= 1 */
    sampler_params sampling;
    const char *const *stop;    /* [n_stop] non-empty stop strings */
    int n_stop;
    bool include_stop;          /* keep the matched stop string in the text (TGI) or cut it (OpenAI) */
    bool ignore_eos;            /* ban end-of-generation tokens: generate to max_new_tokens (or a stop string) */
    const char *cache_salt;     /* prefix cache isolation: entries match only under the same salt and owner; NULL: "" */
    const int *snap_hints;      /* [n_snap_hints] prompt lengths worth a DeltaNet snapshot (a rendered chat's
                                 * message boundaries), ascending; the first SCHED_MAX_SNAP_HINTS are kept */
    int n_snap_hints;
    int top_logprobs;           /* 0..SAMPLER_MAX_TOP: most likely tokens listed with each token event */
    bool prompt_logprobs;       /* emit a PROMPT event for each prompt token after the first */
    int constraint;             /* enum sched_constraint: what the output must match */
    const char *constraint_src; /* [constraint_len] the JSON Schema or regex text (borrowed) */
    size_t constraint_len;
    int speculative;            /* 0: the server's spec_type; 1: n-gram drafts too; -1: no drafts at all */
    const int32_t *prediction;  /* [n_prediction] the expected output as token ids (OpenAI Predicted
                                 * Outputs): drafts copied from it where the output follows it; NULL */
    int n_prediction;           /* 0..SCHED_MAX_PREDICTION; ids must be inside the vocabulary */
} sched_req_params;

enum { SCHED_MAX_PREDICTION = 1 << 20 };  /* prediction tokens a request may give */

/* Structured output: sched_submit compiles the constraint (SCHED_EINVAL
 * with the compiler's message when it cannot) and every token sampled
 * keeps the output a prefix of the language; the request ends when the
 * output is complete and nothing can follow, or the model ends it where
 * the language accepts. */
enum sched_constraint {
    SCHED_CONSTRAINT_NONE = 0,
    SCHED_CONSTRAINT_JSON_SCHEMA = 1,   /* constraint_src: a JSON Schema */
    SCHED_CONSTRAINT_JSON_OBJECT = 2,   /* any JSON object (no source) */
    SCHED_CONSTRAINT_REGEX = 3,         /* constraint_src: a regular expression over the whole output */
    SCHED_CONSTRAINT_TOOL_CALLS = 4,    /* constraint_src: {"tools", "name", "parallel", "format"} (grammar_compile_tool_spec) */
    SCHED_CONSTRAINT_TOOL_CALLS_AUTO = 5, /* the same from the first "<tool_call>" (Llama 3.1: {"name") on */
    SCHED_CONSTRAINT_GBNF = 6,          /* constraint_src: a GBNF grammar (llama-server's "grammar") */
};

enum sched_event_kind {
    SCHED_EV_ADMITTED = 1,      /* holds its cache reservation now */
    SCHED_EV_TOKEN = 2,         /* one generated token */
    SCHED_EV_ERROR = 3,         /* rejected or failed; always the last event */
    SCHED_EV_PROMPT = 4,        /* a prompt token's logprob (prompt_logprobs), before any TOKEN */
};

/* One event for the submitter. Owned by the caller of sched_req_next;
 * sched_event_clear frees text. */
typedef struct sched_event {
    int kind;                   /* enum sched_event_kind */
    int32_t token;              /* TOKEN: id */
    float logprob;              /* TOKEN: log-probability under the sampling distribution;
                                 * PROMPT: under the model's own (log softmax at T = 1) */
    int pos;                    /* PROMPT: the token's position in the prompt (>= 1) */
    sampler_top top;            /* TOKEN, PROMPT: the top_logprobs most likely tokens of that distribution */
    bool special;               /* TOKEN: an end-of-generation token (its text is not emitted) */
    char *text;                 /* TOKEN: newly released bytes, NUL-terminated (may be ""); heap */
    size_t text_len;
    bool final;                 /* TOKEN: last event of a successful generation */
    double t;                   /* TOKEN: when it was sampled (CLOCK_MONOTONIC seconds) */
    int finish;                 /* TOKEN with final: enum sched_finish */
    int stop_index;             /* TOKEN with finish STOP: which of the request's stop strings matched */
    int error;                  /* ERROR: enum sched_status */
    char message[256];          /* ERROR: one line a person can act on */
} sched_event;

void sched_event_clear(sched_event *ev);

/* Numbers about one request, readable at any time (sched_req_result). */
typedef struct sched_result {
    int n_prompt;
    int n_generated;
    int max_new_tokens;
    double queue_ms;            /* submit -> admission (or until now) */
    double ttft_ms;             /* submit -> first token; < 0 before */
    double total_ms;            /* submit -> finish (or until now) */
    uint64_t peak_cache_bytes;  /* most cache bytes the request held */
    uint64_t kv_bytes;          /* attention KV reserved at the last step it ran */
    uint64_t state_bytes;       /* DeltaNet state + conv at the last step it ran */
    uint64_t seed;
    int cached_tokens;          /* prompt tokens restored from the prefix cache, not prefilled */
    int prefix_reason;          /* enum prefix_reason: why no more were (PREFIX_HIT when all shared were) */
    int prefix_diverged_at;     /* prompt tokens shared with the best cached entry */
    sched_spec_counts spec;     /* speculative decoding */
} sched_result;

sched *sched_new(engine *e, const sched_params *p, char *err, size_t errlen);
/* Start the scheduler thread. After this only the scheduler thread calls
 * the engine. Returns 0 or a negative error. */
int sched_start(sched *s);
/* Stop the thread, fail every live request with SCHED_ECANCELLED, free
 * their sequences. Does not close the engine. Accepts NULL. */
void sched_free(sched *s);

/* Queue a request. Returns 0 and a handle in *out, or SCHED_EFULL,
 * SCHED_EDRAINING, SCHED_EINVAL, SCHED_ENOMEM with a message in err.
 * The first event is ADMITTED or ERROR (SCHED_ETOOBIG with the numbers,
 * SCHED_ETIMEOUT). */
int sched_submit(sched *s, const sched_req_params *p, sched_req **out,
                 char *err, size_t errlen);

/* Queue n >= 1 choices of one prompt as a group (OpenAI n, TGI best_of):
 * choice k samples with seeds[k], the rest of p is shared. The prompt is
 * prefilled once, by choice 0; when its prefill ends every other choice
 * forks its sequence (attention pages shared, DeltaNet state and conv
 * copied, engine_seq_fork) and samples its first token from the same
 * logits, so each choice equals the request run alone with its seed. The
 * group is queued and admitted whole: it needs n free sequences and the
 * cache for choice 0's reservation plus what each fork will own (its pages
 * past the shared prompt pages, and its state), or it waits (and times out
 * as a request does); one that can never fit is rejected with
 * SCHED_ETOOBIG. Choice 0 ending before the fork ends every choice with its
 * error. Choice k's id is ids[k]; sched_cancel_id(p->id), the group's id,
 * cancels every choice. Not with prompt_logprobs (SCHED_EINVAL): only choice 0 would see
 * the prompt's logits. Returns 0 with out[0..n) filled, or an error as
 * sched_submit (SCHED_EFULL when the queue cannot take all n). */
int sched_submit_group(sched *s, const sched_req_params *p, int n, const uint64_t *seeds, const char *const *ids,
                       sched_req **out, char *err, size_t errlen);

/* Pop the next event, waiting up to timeout_ms (0: do not wait, < 0:
 * forever). Returns 1 with *ev filled, 0 when none arrived. */
int sched_req_next(sched_req *r, sched_event *ev, int timeout_ms);
/* A file descriptor that polls readable while events are pending, so a
 * caller can wait on it together with a socket. */
int sched_req_event_fd(const sched_req *r);
/* Ask the scheduler to drop the request; it frees the sequence before the
 * next step and emits an ERROR SCHED_ECANCELLED event. Idempotent. */
void sched_req_cancel(sched_req *r);
void sched_req_result(sched_req *r, sched_result *res);
/* The submitter is done with the handle (cancels a live request). Accepts NULL. */
void sched_req_release(sched_req *r);

/* ---- control and observation (any thread) ---- */

/* Refuse new submissions from now on (SCHED_EDRAINING). */
void sched_drain(sched *s);
/* Cancel every queued and running request with the given message. */
void sched_cancel_all(sched *s, const char *why);
/* Cancel the live request with this id submitted by owner, or every
 * choice of the group with this id (as sched_req_cancel, but the error is
 * SCHED_EDELETED, with why as the message its submitter gets). Returns
 * 0, or -1 when none matches. */
int sched_cancel_id(sched *s, const char *id, int owner, const char *why);
/* Queued + running requests. */
int sched_n_active(sched *s);
/* Seconds a rejected client should wait before retrying (>= 1). */
int sched_retry_after_s(sched *s);

/* One live request as /stats shows it (no prompt or output text). */
#define SCHED_TAGS_MAX 512
typedef struct sched_req_stats {
    char id[80];
    char tags[SCHED_TAGS_MAX];  /* sched_req_params.tags, "" without */
    int owner;                  /* sched_req_params.owner (the server: the API key that sent it) */
    const char *state;          /* "queued" | "prefill" | "decoding" */
    double age_ms;
    int prompt_tokens, prefilled_tokens, generated_tokens, max_new_tokens;
    engine_seq_usage usage;     /* zero while queued */
    int cached_tokens;          /* as in sched_result */
    int prefix_reason;
    int prefix_diverged_at;
    int n_snapshots;            /* DeltaNet snapshots it took for the prefix store, held until it ends */
    uint64_t snapshot_bytes;    /* their bytes (in the pool, not in usage) */
    bool spec_on;               /* speculating */
    uint64_t spec_snapshot_bytes; /* its rollback snapshot (in the pool, not in usage) */
    sched_spec_counts spec;
} sched_req_stats;

/* Positions sched_stats counts accepted drafts at (SCHED_SPEC_MAX of scheduler_impl.h). */
#define SCHED_SPEC_MAX_POS 64

/* Buckets of the tokens-per-step histogram: upper bounds 2^0 .. 2^11. */
#define SCHED_STEP_BUCKETS 12

/* Scheduler-wide numbers, updated after every step. */
/* The grammar cache: structured-output grammars compiled once per
 * constraint source and their token masks computed once per parser state,
 * shared by requests (sched_grammar.c). */
typedef struct sched_grammar_stats {
    uint64_t compile_hits;          /* constrained requests that found their grammar compiled */
    uint64_t compiles;              /* constrained requests that compiled it */
    uint64_t mask_hits;             /* parser states whose mask a request found computed */
    uint64_t walks;                 /* parser states whose mask a request computed (a vocabulary trie walk) */
    uint64_t evictions;             /* grammars evicted with their masks */
    uint64_t not_kept;              /* masks not kept for lack of room (grammars in use held the budget) */
    int grammars, entries;          /* held now */
    uint64_t bytes, max_bytes;      /* held now; the budget */
} sched_grammar_stats;

typedef struct sched_stats {
    int running, waiting;
    bool draining;
    engine_pool_usage pool;
    uint64_t steps_total;           /* engine_forward calls */
    uint64_t batch_seqs_total;      /* sum over steps of sequences per step */
    int batch_seqs_last;            /* sequences in the last step */
    int batch_seqs_max;             /* most sequences in one step so far */
    int batch_decode_max;           /* most decoding sequences in one step so far */
    uint64_t mixed_steps_total;     /* steps that decoded some sequences and prefilled others */
    uint64_t decode_steps_total;    /* steps that only decoded (one token per sequence) */
    double decode_forward_seconds;  /* time inside engine_forward in those steps */
    uint64_t prompt_tokens_total;   /* prefilled */
    uint64_t generation_tokens_total;
    uint64_t admitted_total, finished_total, cancelled_total, failed_total;
    uint64_t rejected_full_total, rejected_timeout_total, rejected_toobig_total;
    bool prefix_on;                 /* the prefix cache is on */
    prefix_stats prefix;            /* its numbers as of the last step */
    uint64_t step_tokens[SCHED_STEP_BUCKETS + 1];  /* engine steps by tokens fed: <= 1, <= 2, <= 4 ... <= 2048, more */
    uint64_t step_tokens_sum;       /* tokens fed over all steps */
    sched_grammar_stats grammar;    /* the grammar cache */
    int spec_type, spec_n_max, spec_n_min; /* the options */
    sched_spec_counts spec;         /* speculative decoding, over all requests */
    uint64_t spec_accepted_per_pos[SCHED_SPEC_MAX_POS]; /* accepted drafts by position in their draft (0: first) */
    bool spec_cost;                 /* the cost gate is on */
    double spec_step_seconds[SCHED_SPEC_MAX_POS + 2]; /* its estimate of a decode step's seconds by rows
                                     * 1..spec_n_max + 1 (0: not known yet), as of the last step */
    int spec_snapshots;             /* rollback snapshots held by running requests */
    uint64_t spec_snapshot_bytes;   /* their bytes */
    /* the draft model's engine (SCHED_SPEC_DRAFT; zero without one), as of the last step */
    uint64_t draft_weight_bytes;    /* its weights */
    uint64_t draft_budget_bytes;    /* its own cache pool, beside the target's */
    uint64_t draft_reserved_bytes;  /* held by draft sequences and their rollback snapshots */
    int draft_seqs;                 /* draft sequences live (one per speculating request that drafted) */
    int draft_snaps;                /* their rollback snapshots (a draft model with recurrent layers) */
    int draft_n_layer;
    /* the MTP block's KV (SCHED_SPEC_MTP; zero without it), its own pool, as of the last step */
    uint64_t mtp_budget_bytes;      /* the pool's budget */
    uint64_t mtp_reserved_bytes;    /* pages held by speculating requests' MTP rows */
    int mtp_seqs;                   /* requests holding MTP rows */
    uint64_t mtp_hidden_bytes;      /* the running requests' buffers of trunk hidden rows (heap) */
} sched_stats;

/* Totals over the running requests, as /metrics shows them. */
typedef struct sched_live_totals {
    uint64_t kv_bytes, mla_bytes;       /* attention pages reserved (GQA KV, MLA latent) */
    uint64_t state_bytes, conv_bytes;   /* recurrent slots held */
    uint64_t tokens;                    /* tokens in their caches */
    int n_slots;                        /* running requests holding a recurrent slot */
} sched_live_totals;

/* The numbers as the scheduler thread last published them (after every
 * step, admission and change of the wait queue), copied under a lock that
 * guards nothing but that copy: never s->mu, so a scrape never waits for
 * a step, an admission or a prefix-store restore. The grammar cache's
 * numbers are read as sched_get_stats reads them (its own lock). t may be
 * NULL. */
void sched_get_published(sched *s, sched_stats *st, sched_live_totals *t);

/* Copy the numbers; with reqs != NULL also a malloc'd array of the live
 * requests (*n_reqs entries, caller frees). Returns 0 or SCHED_ENOMEM. */
int sched_get_stats(sched *s, sched_stats *st, sched_req_stats **reqs, int *n_reqs);

/* What POST /reset_prefix_cache freed: the prefix store's entries (a
 * running request forked from one keeps its own references to the shared
 * pages: nothing it holds is freed) and the pool bytes that came back. */
typedef struct sched_prefix_freed {
    bool enabled;               /* the prefix cache is on (else nothing was done) */
    int entries;                /* entries dropped */
    int snapshots;              /* their DeltaNet snapshots */
    uint64_t bytes;             /* the store's bytes before (entries counted whole) */
    uint64_t pool_freed_bytes;  /* pool reservation given back: bytes less what running requests still share */
    uint64_t pool_reserved_bytes; /* the pool's reservation after the reset */
    int running;                /* requests running at the reset (their caches untouched) */
} sched_prefix_freed;

/* Empty the prefix store on the scheduler thread (waits for the step in
 * progress to end; never cancels a request). Fills *out. 0, or
 * SCHED_EDRAINING when the scheduler has stopped. */
int sched_prefix_reset(sched *s, sched_prefix_freed *out);

/* "none" | "ngram-simple". */
const char *sched_spec_type_name(int type);

const char *sched_finish_name(int finish);   /* "length" | "eos_token" | "stop_sequence" */
const char *sched_status_name(int status);

#endif

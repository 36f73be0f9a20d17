/* grammar.h - constrained decoding: a byte-level grammar, compiled once per
 * request, and a matcher that masks the vocabulary at each step.
 *
 * Owns: the grammar form (a context-free grammar over bytes, run as a
 * pushdown automaton), its compilers (JSON Schema, regular expressions,
 * "any JSON object"), the vocabulary's byte trie, and per-request matchers
 * with their token-mask cache.
 * Does not own: where constraints come from (server), sampling (sampler),
 * when a request ends (scheduler).
 * ref: docs/serving.md "Structured output"; XGrammar (Dong et al. 2024)
 * for the adaptive token-mask cache idea; JSON: RFC 8259; JSON Schema
 * 2020-12 (the subset named in grammar_json.c).
 *
 * Threads: a grammar and a gram_vocab are immutable once built and may be
 * shared; a gram_matcher belongs to one thread at a time; a gram_cache is
 * shared by every thread (one mutex, taken once per grammar lookup and
 * once per mask-cache key a matcher has not met before).
 */
#ifndef HYSERVE_GRAMMAR_H
#define HYSERVE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct grammar grammar;
typedef struct gram_vocab gram_vocab;
typedef struct gram_matcher gram_matcher;
typedef struct gram_cache gram_cache;
typedef struct gram_shared gram_shared;

/* ---- compilers: NULL with one line in err on failure ---- */

/* How JSON is written. By default as a model should write it, never an
 * endless run: between tokens nothing, one space, or a newline and at
 * most 20 spaces or tabs of indent; integer, fraction and exponent parts
 * of at most 16 digits (llama.cpp's json-schema grammar bounds the same
 * way). exact: every document RFC 8259 allows (validation, tests). */
typedef struct grammar_opts {
    bool exact;
} grammar_opts;

/* A JSON Schema (raw bytes, need not be NUL-terminated); opts NULL: the
 * defaults. Unsupported keywords are an error that names them. The output
 * is one JSON value (no whitespace around it). */
grammar *grammar_compile_json_schema(const char *json, size_t len, const grammar_opts *opts, char *err,
                                     size_t errlen);
/* A regular expression (the subset of grammar_regex.c) matched against the
 * whole output, as TGI's regex grammar does. */
grammar *grammar_compile_regex(const char *re, size_t len, char *err, size_t errlen);
/* A GBNF grammar (llama.cpp's form, llama-server's "grammar" field; the
 * syntax is in grammar_gbnf.c). Errors name the line and column. */
grammar *grammar_compile_gbnf(const char *text, size_t len, char *err, size_t errlen);
/* Tool calls as the Qwen3 / ChatML templates write them:
 *   <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
 * NAME one of the functions of tools (an OpenAI "tools" array as JSON
 * text), or only name when it is not NULL (a named tool_choice); ARGS
 * follows that function's "parameters" schema (any object without one).
 * parallel: one or more calls, separated by "\n". */
grammar *grammar_compile_tool_calls(const char *tools, size_t len, const char *name, bool parallel,
                                    const grammar_opts *opts, char *err, size_t errlen);
/* One tool call as Llama 3.1's template writes it (one per turn):
 *   {"name": "NAME", "parameters": ARGS}
 * NAME and ARGS as above. */
grammar *grammar_compile_llama_tool_call(const char *tools, size_t len, const char *name, const grammar_opts *opts,
                                         char *err, size_t errlen);
/* The same from one JSON spec: {"tools": [...], "name": "f" or null,
 * "parallel": bool, "format": "llama3.1" or absent for Qwen's} (the
 * scheduler's SCHED_CONSTRAINT_TOOL_CALLS). */
grammar *grammar_compile_tool_spec(const char *spec, size_t len, const grammar_opts *opts, char *err, size_t errlen);
/* The text a call of spec's format starts with, the trigger of
 * tool_choice auto: "<tool_call>", or "{\"name\"" for Llama 3.1. */
const char *grammar_tool_trigger(const char *spec, size_t len);
/* Any JSON object (OpenAI's json_object mode). */
grammar *grammar_compile_json_object(const grammar_opts *opts, char *err, size_t errlen);
void grammar_free(grammar *g);

/* Rules, elements and byte sets of g (tests and logs). */
void grammar_size(const grammar *g, int *n_rules, int *n_elems);

/* Does g match all of s[0..n)? (No vocabulary needed: tests, validation.) */
bool grammar_accepts(const grammar *g, const char *s, size_t n);

/* ---- the vocabulary ---- */

enum gram_tok_kind {
    GRAM_TOK_TEXT = 0,          /* its bytes are output text */
    GRAM_TOK_EOG = 1,           /* end of generation: allowed where the grammar accepts */
    GRAM_TOK_OTHER = 2,         /* control and other special tokens: never allowed */
};

/* piece(ctx, id, buf, cap, &kind) writes token id's bytes (returns the
 * count, which may exceed cap, or < 0) and its kind. */
typedef int (*gram_piece_fn)(const void *ctx, int32_t id, char *buf, size_t cap, int *kind);

gram_vocab *gram_vocab_new(int n_vocab, gram_piece_fn piece, const void *ctx, char *err, size_t errlen);
void gram_vocab_free(gram_vocab *v);
int gram_vocab_n_nodes(const gram_vocab *v);   /* trie nodes (tests, logs) */

/* ---- matching one request's output ---- */

/* Takes ownership of g (freed with the matcher, also on failure); v is
 * borrowed and must outlive the matcher. */
gram_matcher *gram_matcher_new(grammar *g, const gram_vocab *v);
void gram_matcher_free(gram_matcher *m);

/* Sets logits[t] = -INFINITY for every token t that cannot come next;
 * end-of-generation tokens stay only where the grammar accepts. Returns
 * the number of tokens left, or < 0 on an internal limit. */
int gram_matcher_mask(gram_matcher *m, float *logits);
/* Same decision as a bitset (bit t of words[t / 64]; n_vocab bits). */
int gram_matcher_fill_mask(gram_matcher *m, uint64_t *words);
/* Compute the current state's mask and remember it, so that the next
 * gram_matcher_mask finds it made: the first mask's trie walks on the
 * thread that builds the matcher, not the engine's. Returns what
 * gram_matcher_mask would (the vocabulary size while not constraining). */
int gram_matcher_prime(gram_matcher *m);
/* Advance over a sampled token. Returns 0, or -1 when the token cannot
 * come next (the state is then unchanged). EOG tokens: 0 iff accepting. */
int gram_matcher_accept_token(gram_matcher *m, int32_t tok);
/* Advance over raw bytes (tests). 0 or -1 as above. */
int gram_matcher_accept_bytes(gram_matcher *m, const char *s, size_t n);
/* Could the output continue with s[0..n)? (State unchanged; the
 * byte-level check the cached mask must agree with.) */
bool gram_matcher_can_accept_bytes(gram_matcher *m, const char *s, size_t n);
/* The output so far is a complete sentence of the grammar. */
bool gram_matcher_accepting(const gram_matcher *m);
/* Complete and nothing can follow: generation should end now. */
bool gram_matcher_finished(const gram_matcher *m);
/* Lazy matching (tool_choice auto): the output is free until it contains
 * trigger (at most 32 bytes, e.g. "<tool_call>", which the grammar must
 * start with); from the trigger's first byte on it must follow the grammar.
 * Before that the mask allows everything and every token is accepted. If
 * the bytes after the trigger in the same token already leave the
 * grammar, the matcher stays inactive for good. Returns 0 or -1. */
int gram_matcher_set_trigger(gram_matcher *m, const char *trigger);
/* Constraining now (always, for a matcher without a trigger). */
bool gram_matcher_active(const gram_matcher *m);
/* Mask-cache entries this matcher has used so far (computed or found in
 * its gram_shared; tests: the cache is reused). */
int gram_matcher_cache_entries(const gram_matcher *m);
/* The matcher broke because an allocation failed (not on a limit). */
bool gram_matcher_out_of_memory(const gram_matcher *m);
/* Whether m stopped at a limit of its own (configurations a state, or the
 * work of one token mask: GRAM_MAX_WORK) rather than out of memory. */
bool gram_matcher_at_limit(const gram_matcher *m);
/* Trie walks this matcher made (entries it computed itself). */
int gram_matcher_walks(const gram_matcher *m);

/* ---- sharing between requests ----
 *
 * A gram_cache keeps, for one vocabulary, the grammars compiled from each
 * canonical source (the caller's bytes: constraint kind, options and
 * text) and each grammar's mask-cache entries, so a second request of
 * the same grammar neither compiles it nor walks the trie for a parser
 * state an earlier request met. An entry is what a fresh matcher would
 * compute for its key: the walk depends only on the grammar, the
 * vocabulary and the key. Bounded in bytes (grammars plus entries):
 * grammars no matcher holds are evicted least recently used first; when
 * the ones in use fill the budget, new entries stay private to their
 * matcher (freed with it). max_bytes 0: nothing is shared. */
typedef struct gram_cache_stats {
    uint64_t grammar_hits;      /* acquires that found the compiled grammar */
    uint64_t grammar_misses;    /* acquires that compiled it */
    uint64_t hits;              /* mask entries a matcher found in the cache instead of walking */
    uint64_t walks;             /* trie walks by matchers of cached grammars (first-time masks) */
    uint64_t evictions;         /* grammars evicted with their entries */
    uint64_t not_kept;          /* entries kept private because the budget was held by grammars in use */
    int grammars;               /* grammars held */
    int entries;                /* mask entries held */
    uint64_t bytes;             /* grammars + entries */
    uint64_t max_bytes;
} gram_cache_stats;

gram_cache *gram_cache_new(const gram_vocab *v, size_t max_bytes, char *err, size_t errlen);
/* Frees what no matcher holds now; the rest goes with its last matcher. */
void gram_cache_free(gram_cache *c);
void gram_cache_get_stats(gram_cache *c, gram_cache_stats *st);

/* compile(ctx, err, errlen): the grammar of the source, or NULL with one
 * line in err. */
typedef grammar *(*gram_compile_fn)(void *ctx, char *err, size_t errlen);
/* The shared grammar of key[0..n) (a reference, for gram_matcher_new_shared),
 * compiled with compile on a miss (outside the lock). NULL with err from
 * compile, or "out of memory". */
gram_shared *gram_cache_acquire(gram_cache *c, const char *key, size_t n, gram_compile_fn compile, void *ctx,
                                char *err, size_t errlen);
/* A matcher over sh's grammar and the cache's vocabulary that takes and
 * stores mask entries in the cache. Takes the reference (released with
 * the matcher, also on failure). */
gram_matcher *gram_matcher_new_shared(gram_shared *sh);
void gram_shared_release(gram_shared *sh);

#endif

/* grammar_impl.h - the grammar builder, shared by the compilers
 * (grammar_json.c, grammar_regex.c) and grammar.c. Nobody else includes it.
 *
 * A grammar is built as rules, each a list of alternatives, each a
 * sequence of symbols: a gsym >= 0 refers to a rule, a gsym < 0 is a byte
 * set (-1 - index). Errors are sticky: the first one is kept in the
 * builder and every later call becomes a no-op returning a dummy symbol,
 * so compilers check once at the end (gb_finish).
 */
#ifndef HYSERVE_GRAMMAR_IMPL_H
#define HYSERVE_GRAMMAR_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

typedef int32_t gsym;

/* Most symbols a grammar may hold (rules' elements summed): bounds memory
 * and compile time for hostile schemas (maxLength 10^9 and friends). */
#define GRAMMAR_MAX_ELEMS (1 << 20)

typedef struct gvec {
    int32_t *v;
    int n, cap;
} gvec;

typedef struct gb_rule {
    gvec *alts;                 /* [n_alts] each a symbol sequence */
    int n_alts, cap_alts;
} gb_rule;

/* Owned by one compiler call. */
typedef struct gbuild {
    gb_rule *rules;             /* [n_rules] */
    int n_rules, cap_rules;
    uint64_t (*sets)[4];        /* [n_sets] 256-bit byte sets */
    int n_sets, cap_sets;
    long n_elems;               /* symbols in all alternatives */
    bool failed;
    char err[256];              /* the first error */
} gbuild;

void gb_init(gbuild *b);
void gb_deinit(gbuild *b);
/* Records the first error (printf-style); later ones are dropped. */
void gb_fail(gbuild *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

gsym gb_set(gbuild *b, const uint64_t bits[4]);     /* a byte set (deduplicated) */
gsym gb_byte(gbuild *b, uint8_t c);
gsym gb_range(gbuild *b, uint8_t lo, uint8_t hi);
int gb_rule_new(gbuild *b);                         /* an empty rule (no alternatives yet) */
void gb_add_alt(gbuild *b, int rule, const gsym *s, int n);
gsym gb_seq(gbuild *b, const gsym *s, int n);       /* n == 1: s[0] itself */
gsym gb_lit(gbuild *b, const char *s, size_t n);    /* the bytes of s; n == 0: the empty string */
gsym gb_empty(gbuild *b);
gsym gb_or(gbuild *b, const gsym *s, int n);        /* one of */
gsym gb_opt(gbuild *b, gsym x);
gsym gb_star(gbuild *b, gsym x);                    /* x must not match the empty string */
/* x repeated min..max times (max < 0: unbounded). */
gsym gb_rep(gbuild *b, gsym x, long min, long max);
/* The UTF-8 of code point cp (at most 4 bytes) into out; its length. */
int gb_utf8_put(uint32_t cp, uint8_t *out);
/* The UTF-8 encodings of code points lo..hi (surrogates excluded). */
gsym gb_cp_range(gbuild *b, uint32_t lo, uint32_t hi);

/* The regular expression s[0..n) (grammar_regex.c). json: as the inside
 * of a JSON string, with ECMA-262 test() semantics (an unanchored side
 * matches anything); else the whole text must match. */
gsym gb_regex(gbuild *b, const char *s, size_t n, bool json);

/* The grammar whose start symbol is root; NULL with b->err on failure.
 * Rejects left recursion (the matcher's closure would not end). */
grammar *gb_finish(gbuild *b, gsym root);

int gvec_push(gvec *v, int32_t x);
/* gvec_push that records "out of memory" in b when it fails. */
void gb_push(gbuild *b, gvec *v, int32_t x);

#endif

/* grammar.c - the grammar form, its builder, the vocabulary trie, and the
 * matcher that masks tokens.
 *
 * Owns: building and flattening grammars (grammar_impl.h), the pushdown
 * run over bytes, the token-mask cache, gram_vocab. This file is the
 * builder; the rest is split along the sections: grammar_finish.c (checks
 * and flattening), grammar_vocab.c (the vocabulary trie), grammar_match.c
 * (the matcher), grammar_mask.c (the mask cache), grammar_share.c (sharing
 * between requests); what they share is declared in grammar_impl.h.
 * Does not own: the compilers from JSON Schema and regular expressions
 * (grammar_json.c, grammar_regex.c).
 * ref: XGrammar (Dong et al. 2024, "XGrammar: flexible and efficient
 * structured generation"): split tokens into context-independent ones
 * (decided by the top of the stack alone, cached) and context-dependent
 * ones (checked against the whole stack at each step); llama.cpp's
 * grammar (a set of stacks advanced byte by byte) is the baseline.
 *
 * The form. A grammar is rules; a rule is alternatives; an alternative is
 * a sequence of elements, each a byte set or a reference to a rule, ended
 * by END. A parser configuration is (pos, stack): pos indexes the byte
 * set to match next (or -1: the whole input is accepted), stack is the
 * chain of return positions. Stacks are hash-consed nodes (pos, parent),
 * so equal stacks have equal ids and a state (a set of configurations)
 * deduplicates by two integers. A reference that is the last element of
 * its alternative pushes nothing (a tail call), so right recursion - how
 * every repetition is written - runs in constant stack.
 *
 * The mask. For a configuration, whether a token's bytes can be consumed
 * depends on the stack only once the token's bytes pop below the frames
 * the configuration starts with. The cache key is the configuration with
 * its stack cut to its top GRAM_KEY_FRAMES frames over an UNKNOWN bottom;
 * one walk of the vocabulary trie from the key sorts every token into
 * accepted (consumed without reaching UNKNOWN, or reaching it only after
 * the last byte: valid in any context), rejected (every path dies above
 * UNKNOWN) and uncertain (some path reached UNKNOWN mid-token). At each
 * step the mask is the union of the accepted sets of the state's keys,
 * plus the uncertain tokens checked byte by byte against the real state.
 * Inside a JSON string the key is the same for every string of the
 * schema, so the 248K-token walk happens once per request and a step
 * costs one bitset OR and the check of the tokens that close the string.
 */
#include "grammar.h"
#include "grammar_impl.h"
#include "fault.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ====================================================================== */
/* Builder                                                                */
/* ====================================================================== */

int gvec_push(gvec *v, int32_t x)
{
    int32_t *p = fault_grow(v->v, v->n, &v->cap, sizeof *p, 8);
    if (!p)
        return -1;
    v->v = p;
    v->v[v->n++] = x;
    return 0;
}

void gb_push(gbuild *b, gvec *v, int32_t x)
{
    if (gvec_push(v, x))
        gb_fail(b, "out of memory");
}

void gb_init(gbuild *b)
{
    memset(b, 0, sizeof *b);
}

void gb_deinit(gbuild *b)
{
    for (int i = 0; i < b->n_rules; i++) {
        for (int j = 0; j < b->rules[i].n_alts; j++)
            free(b->rules[i].alts[j].v);
        free(b->rules[i].alts);
    }
    free(b->rules);
    free(b->sets);
    memset(b, 0, sizeof *b);
}

void gb_fail(gbuild *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    b->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
}

gsym gb_set(gbuild *b, const uint64_t bits[4])
{
    if (b->failed)
        return -1;
    for (int i = 0; i < b->n_sets; i++)
        if (!memcmp(b->sets[i], bits, sizeof b->sets[i]))
            return -1 - i;
    void *p = fault_grow(b->sets, b->n_sets, &b->cap_sets, sizeof *b->sets, 32);
    if (!p) {
        gb_fail(b, "out of memory");
        return -1;
    }
    b->sets = p;
    memcpy(b->sets[b->n_sets], bits, sizeof b->sets[0]);
    return -1 - b->n_sets++;
}

gsym gb_range(gbuild *b, uint8_t lo, uint8_t hi)
{
    uint64_t bits[4] = {0};
    for (unsigned c = lo; c <= hi; c++)
        bits[c >> 6] |= 1ull << (c & 63);
    return gb_set(b, bits);
}

gsym gb_byte(gbuild *b, uint8_t c)
{
    return gb_range(b, c, c);
}

int gb_rule_new(gbuild *b)
{
    if (b->failed)
        return 0;
    void *p = fault_grow(b->rules, b->n_rules, &b->cap_rules, sizeof *b->rules, 64);
    if (!p) {
        gb_fail(b, "out of memory");
        return 0;
    }
    b->rules = p;
    memset(&b->rules[b->n_rules], 0, sizeof b->rules[0]);
    return b->n_rules++;
}

void gb_add_alt(gbuild *b, int rule, const gsym *s, int n)
{
    if (b->failed)
        return;
    b->n_elems += n + 1;
    if (b->n_elems > GRAMMAR_MAX_ELEMS) {
        gb_fail(b, "the grammar is too large (more than %d elements)", GRAMMAR_MAX_ELEMS);
        return;
    }
    gb_rule *r = &b->rules[rule];
    void *p = fault_grow(r->alts, r->n_alts, &r->cap_alts, sizeof *r->alts, 2);
    if (!p) {
        gb_fail(b, "out of memory");
        return;
    }
    r->alts = p;
    gvec *a = &r->alts[r->n_alts++];
    memset(a, 0, sizeof *a);
    for (int i = 0; i < n; i++)
        if (gvec_push(a, s[i])) {
            gb_fail(b, "out of memory");
            return;
        }
}

gsym gb_seq(gbuild *b, const gsym *s, int n)
{
    if (n == 1)
        return s[0];
    int r = gb_rule_new(b);
    gb_add_alt(b, r, s, n);
    return r;
}

gsym gb_empty(gbuild *b)
{
    return gb_seq(b, NULL, 0);
}

gsym gb_lit(gbuild *b, const char *s, size_t n)
{
    if (n == 0)
        return gb_empty(b);
    if (n > GRAMMAR_MAX_ELEMS) {
        gb_fail(b, "a literal of %zu bytes is too long", n);
        return -1;
    }
    gvec v = {0};
    for (size_t i = 0; i < n; i++)
        if (gvec_push(&v, gb_byte(b, (uint8_t)s[i]))) {
            gb_fail(b, "out of memory");
            break;
        }
    gsym r = gb_seq(b, v.v, v.n);
    free(v.v);
    return r;
}

gsym gb_or(gbuild *b, const gsym *s, int n)
{
    if (n == 1)
        return s[0];
    int r = gb_rule_new(b);
    for (int i = 0; i < n; i++)
        gb_add_alt(b, r, &s[i], 1);
    return r;
}

gsym gb_opt(gbuild *b, gsym x)
{
    int r = gb_rule_new(b);
    gb_add_alt(b, r, &x, 1);
    gb_add_alt(b, r, NULL, 0);
    return r;
}

gsym gb_star(gbuild *b, gsym x)
{
    int r = gb_rule_new(b);
    gsym s[2] = {x, r};
    gb_add_alt(b, r, s, 2);
    gb_add_alt(b, r, NULL, 0);
    return r;
}

gsym gb_rep(gbuild *b, gsym x, long min, long max)
{
    if (min < 0 || (max >= 0 && max < min)) {
        gb_fail(b, "a repetition {%ld,%ld} is empty", min, max);
        return -1;
    }
    if (min > 100000 || max > 100000) {
        gb_fail(b, "a repetition count above 100000 is too large to express");
        return -1;
    }
    gvec v = {0};
    for (long i = 0; i < min && !b->failed; i++)
        if (gvec_push(&v, x))
            gb_fail(b, "out of memory");
    if (max < 0) {
        if (gvec_push(&v, gb_star(b, x)))
            gb_fail(b, "out of memory");
    } else if (max > min) {
        /* x? nested from the inside: (x (x (x)?)?)? */
        gsym t = gb_opt(b, x);
        for (long i = min + 1; i < max && !b->failed; i++) {
            gsym s[2] = {x, t};
            t = gb_opt(b, gb_seq(b, s, 2));
        }
        if (gvec_push(&v, t))
            gb_fail(b, "out of memory");
    }
    gsym r = b->failed ? -1 : gb_seq(b, v.v, v.n);
    free(v.v);
    return r;
}

/* UTF-8 of one code point into out (continuation bytes filled from the
 * end); returns the length. */
int gb_utf8_put(uint32_t cp, uint8_t *out)
{
    static const uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (int i = n - 1; i > 0; i--, cp >>= 6)
        out[i] = (uint8_t)(0x80 | (cp & 63));
    out[0] = (uint8_t)(lead[n] | cp);
    return n;
}

/* Splits lo..hi until each piece's encodings are a product of byte
 * ranges (one range per byte position), then emits that sequence.
 * ref: the utf8-ranges construction of Rust's regex-syntax. */
static void cp_split(gbuild *b, uint32_t lo, uint32_t hi, gvec *alts)
{
    if (lo > hi || b->failed)
        return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800)
            cp_split(b, lo, 0xD7FF, alts);
        if (hi > 0xDFFF)
            cp_split(b, 0xE000, hi, alts);
        return;
    }
    static const uint32_t bound[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i]) {
            cp_split(b, lo, bound[i], alts);
            cp_split(b, bound[i] + 1, hi, alts);
            return;
        }
    if (hi >= 0x80) {
        int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
        for (int i = 1; i < n; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if ((lo & m) != 0) {
                    cp_split(b, lo, lo | m, alts);
                    cp_split(b, (lo | m) + 1, hi, alts);
                    return;
                }
                if ((hi & m) != m) {
                    cp_split(b, lo, (hi & ~m) - 1, alts);
                    cp_split(b, hi & ~m, hi, alts);
                    return;
                }
            }
        }
    }
    uint8_t el[4], eh[4];
    int n = gb_utf8_put(lo, el);
    gb_utf8_put(hi, eh);
    gsym s[4];
    for (int i = 0; i < n; i++)
        s[i] = gb_range(b, el[i], eh[i]);
    if (gvec_push(alts, gb_seq(b, s, n)))
        gb_fail(b, "out of memory");
}

gsym gb_cp_range(gbuild *b, uint32_t lo, uint32_t hi)
{
    gvec alts = {0};
    if (hi > 0x10FFFF)
        hi = 0x10FFFF;
    cp_split(b, lo, hi, &alts);
    gsym r;
    if (b->failed || alts.n == 0) {
        if (!b->failed)
            gb_fail(b, "an empty character range");
        r = -1;
    } else {
        r = gb_or(b, alts.v, alts.n);
    }
    free(alts.v);
    return r;
}


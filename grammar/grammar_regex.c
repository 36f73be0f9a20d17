/* grammar_regex.c - regular expressions to grammars.
 *
 * Owns: parsing the supported subset and building it with the grammar
 * builder, over raw UTF-8 (TGI's regex grammar) or over the inside of a
 * JSON string (JSON Schema "pattern": characters JSON must escape are
 * written as their escapes).
 * Does not own: matching (grammar.c).
 * ref: ECMA-262 RegExp syntax (JSON Schema patterns are ECMA-262 regular
 * expressions, evaluated with the "u" flag by ajv).
 *
 * The subset: literals and escaped punctuation, ".", classes "[...]" with
 * ranges and negation, \d \w \s \D \W \S, \t \n \r \f \v \0 \xHH \uHHHH
 * \u{H...}, groups "(...)", "(?:...)", "(?<name>...)", alternation "|",
 * quantifiers * + ? {n} {n,} {n,m} (greedy or lazy: the same language),
 * "^" at the start and "$" at the end. Anything else (back-references,
 * look-around, anchors inside, flags, \b) is an error that names it.
 * Semantics: TGI's regex must match the whole output; a JSON Schema
 * pattern matches anywhere in the string unless anchored, as in ECMA-262
 * RegExp.test, so an unanchored side gets "any characters" added.
 */
#include "grammar.h"
#include "grammar_impl.h"
#include "fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RE_MAX_NEST 64

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

/* A set of code points as sorted, disjoint ranges. Owned by its parser. */
typedef struct cpset {
    cprange *r;
    int n, cap;
} cpset;

typedef struct re_parser {
    gbuild *b;
    const char *s;
    size_t n, i;
    bool json;                  /* characters are JSON-string content */
    bool open_head, open_tail;  /* json: a side is unanchored ("any characters" added there) */
    int depth;
} re_parser;

static int cpset_add(cpset *s, uint32_t lo, uint32_t hi)
{
    cprange *p = fault_grow(s->r, s->n, &s->cap, sizeof *p, 8);
    if (!p)
        return -1;
    s->r = p;
    s->r[s->n++] = (cprange){lo, hi};
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void cpset_norm(cpset *s)
{
    if (s->n == 0)
        return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi)
                s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

/* s = all code points not in s. */
static int cpset_negate(cpset *s)
{
    cpset t = {0};
    uint32_t next = 0;
    int rc = 0;
    cpset_norm(s);
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next)
            rc |= cpset_add(&t, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= 0x10FFFF)
        rc |= cpset_add(&t, next, 0x10FFFF);
    free(s->r);
    *s = t;
    return rc;
}

/* The grammar of one character of s: raw UTF-8, or in JSON mode the
 * characters JSON must escape (", \, controls) as their escapes. */
static gsym cpset_sym(re_parser *p, cpset *s)
{
    gbuild *b = p->b;
    gvec alts = {0};
    cpset_norm(s);
    for (int i = 0; i < s->n && !b->failed; i++) {
        uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
        if (!p->json) {
            gb_push(b, &alts, gb_cp_range(b, lo, hi));
            continue;
        }
        for (uint32_t c = lo; c <= hi && c < 0x20; c++) {
            static const char short_esc[] = "\b\f\n\r\t";
            static const char short_ch[] = "bfnrt";
            const char *q = c ? strchr(short_esc, (int)c) : NULL;
            char e[8];
            if (q) {
                e[0] = '\\';
                e[1] = short_ch[q - short_esc];
                gb_push(b, &alts, gb_lit(b, e, 2));
            } else {
                static const char hex[] = "0123456789abcdef";
                gsym sq[6] = {gb_byte(b, '\\'), gb_byte(b, 'u'), gb_byte(b, '0'), gb_byte(b, '0'),
                              gb_byte(b, (uint8_t)hex[c >> 4]), 0};
                uint8_t d = (uint8_t)hex[c & 15];
                if (d >= 'a') {
                    uint64_t bits[4] = {0};
                    bits[d >> 6] |= 1ull << (d & 63);
                    bits[(d - 32) >> 6] |= 1ull << ((d - 32) & 63);
                    sq[5] = gb_set(b, bits);
                } else {
                    sq[5] = gb_byte(b, d);
                }
                gb_push(b, &alts, gb_seq(b, sq, 6));
            }
        }
        if (hi < 0x20)
            continue;
        if (lo < 0x20)
            lo = 0x20;
        /* " and \ are written escaped */
        static const uint32_t esc[] = {0x22, 0x5C};
        for (int k = 0; k < 2; k++) {
            if (lo <= esc[k] && esc[k] <= hi) {
                char e[2] = {'\\', (char)esc[k]};
                gb_push(b, &alts, gb_lit(b, e, 2));
                if (lo < esc[k])
                    gb_push(b, &alts, gb_cp_range(b, lo, esc[k] - 1));
                lo = esc[k] + 1;
            }
        }
        if (lo <= hi)
            gb_push(b, &alts, gb_cp_range(b, lo, hi));
    }
    gsym r;
    if (alts.n == 0) {
        gb_fail(b, "a character class matches nothing");
        r = -1;
    } else {
        r = gb_or(b, alts.v, alts.n);
    }
    free(alts.v);
    return r;
}

static int re_fail(re_parser *p, const char *what)
{
    gb_fail(p->b, "regular expression: %s at offset %zu", what, p->i);
    return -1;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 character at p->i. */
static int re_utf8(re_parser *p, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)p->s + p->i;
    size_t left = p->n - p->i;
    uint8_t c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || (size_t)len > left)
        return re_fail(p, "invalid UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return re_fail(p, "invalid UTF-8");
        v = (v << 6) | (s[k] & 63);
    }
    p->i += (size_t)len;
    *cp = v;
    return 0;
}

/* Class escapes \d \w \s (neg: \D \W \S) into set. Returns 1 if c was one. */
static int class_escape(char c, cpset *set)
{
    cpset t = {0};
    int rc = 0;
    switch (c) {
    case 'd': case 'D':
        rc |= cpset_add(&t, '0', '9');
        break;
    case 'w': case 'W':
        rc |= cpset_add(&t, '0', '9');
        rc |= cpset_add(&t, 'A', 'Z');
        rc |= cpset_add(&t, 'a', 'z');
        rc |= cpset_add(&t, '_', '_');
        break;
    case 's': case 'S': {
        /* ECMA-262 WhiteSpace and LineTerminator */
        static const uint32_t ws[][2] = {{9, 13}, {32, 32}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                         {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                         {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++)
            rc |= cpset_add(&t, ws[k][0], ws[k][1]);
        break;
    }
    default:
        return 0;
    }
    if (c >= 'A' && c <= 'Z')
        rc |= cpset_negate(&t);
    for (int k = 0; k < t.n; k++)
        rc |= cpset_add(set, t.r[k].lo, t.r[k].hi);
    free(t.r);
    return rc ? -1 : 1;
}

/* One escaped character after '\' (p->i at the letter): its code point. */
static int re_escape_char(re_parser *p, uint32_t *cp)
{
    char c = p->s[p->i++];
    switch (c) {
    case 't': *cp = '\t'; return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x':
        if (p->i + 2 > p->n || hexval(p->s[p->i]) < 0 || hexval(p->s[p->i + 1]) < 0)
            return re_fail(p, "\\x needs two hex digits");
        *cp = (uint32_t)(hexval(p->s[p->i]) * 16 + hexval(p->s[p->i + 1]));
        p->i += 2;
        return 0;
    case 'u': {
        uint32_t v = 0;
        if (p->i < p->n && p->s[p->i] == '{') {
            p->i++;
            int k = 0;
            while (p->i < p->n && hexval(p->s[p->i]) >= 0 && k < 7) {
                v = v * 16 + (uint32_t)hexval(p->s[p->i++]);
                k++;
            }
            if (k == 0 || p->i >= p->n || p->s[p->i] != '}' || v > 0x10FFFF)
                return re_fail(p, "bad \\u{...}");
            p->i++;
        } else {
            if (p->i + 4 > p->n)
                return re_fail(p, "\\u needs four hex digits");
            for (int k = 0; k < 4; k++) {
                int h = hexval(p->s[p->i + (size_t)k]);
                if (h < 0)
                    return re_fail(p, "\\u needs four hex digits");
                v = v * 16 + (uint32_t)h;
            }
            p->i += 4;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return re_fail(p, "surrogate code points are not characters");
        *cp = v;
        return 0;
    }
    default:
        break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
        char what[64];
        snprintf(what, sizeof what, "the escape \\%c is not supported", c);
        p->i--;
        return re_fail(p, what);
    }
    p->i--;
    return re_utf8(p, cp);      /* escaped punctuation stands for itself */
}

static gsym re_alt(re_parser *p);

static gsym re_class(re_parser *p)
{
    cpset set = {0};
    bool neg = false;
    gsym r = -1;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = true;
        p->i++;
    }
    while (p->i < p->n && p->s[p->i] != ']') {
        uint32_t lo;
        if (p->s[p->i] == '\\') {
            p->i++;
            if (p->i >= p->n)
                break;
            int ce = class_escape(p->s[p->i], &set);
            if (ce < 0)
                goto oom;
            if (ce > 0) {
                p->i++;
                continue;
            }
            if (p->s[p->i] == 'b') {
                p->i++;
                lo = '\b';
            } else if (p->s[p->i] == '-') {
                p->i++;
                lo = '-';
            } else if (re_escape_char(p, &lo)) {
                goto out;
            }
        } else if (re_utf8(p, &lo)) {
            goto out;
        }
        uint32_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                if (p->i >= p->n || re_escape_char(p, &hi))
                    goto out;
            } else if (re_utf8(p, &hi)) {
                goto out;
            }
            if (hi < lo) {
                re_fail(p, "a class range out of order");
                goto out;
            }
        }
        if (cpset_add(&set, lo, hi))
            goto oom;
    }
    if (p->i >= p->n) {
        re_fail(p, "an unterminated [");
        goto out;
    }
    p->i++;
    if (neg && cpset_negate(&set))
        goto oom;
    r = cpset_sym(p, &set);
    goto out;
oom:
    gb_fail(p->b, "out of memory");
out:
    free(set.r);
    return r;
}

/* One character of the ranges r[0..n) (or of their complement). */
static gsym ranges_sym(re_parser *p, const uint32_t (*r)[2], int n, bool negate)
{
    cpset s = {0};
    gsym res = -1;
    int rc = 0;
    for (int i = 0; i < n; i++)
        rc |= cpset_add(&s, r[i][0], r[i][1]);
    if (rc == 0 && negate)
        rc = cpset_negate(&s);
    if (rc == 0)
        res = cpset_sym(p, &s);
    else
        gb_fail(p->b, "out of memory");
    free(s.r);
    return res;
}

static gsym cp_sym(re_parser *p, uint32_t lo, uint32_t hi)
{
    const uint32_t r[1][2] = {{lo, hi}};
    return ranges_sym(p, r, 1, false);
}

/* "." : any character but line terminators (ECMA-262 without the s flag). */
static gsym re_dot(re_parser *p)
{
    static const uint32_t eol[3][2] = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};
    return ranges_sym(p, eol, 3, true);
}

static gsym re_atom(re_parser *p)
{
    char c = p->s[p->i];
    if (c == '(') {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':') {
                p->i += 2;
            } else if (p->i + 2 < p->n && p->s[p->i + 1] == '<' && p->s[p->i + 2] != '=' &&
                       p->s[p->i + 2] != '!') {
                const char *e = memchr(p->s + p->i, '>', p->n - p->i);
                if (!e)
                    return re_fail(p, "an unterminated group name");
                p->i = (size_t)(e - p->s) + 1;
            } else {
                return re_fail(p, "look-around and inline flags are not supported");
            }
        }
        if (++p->depth > RE_MAX_NEST)
            return re_fail(p, "groups nested too deep");
        gsym r = re_alt(p);
        p->depth--;
        if (p->i >= p->n || p->s[p->i] != ')')
            return re_fail(p, "an unbalanced (");
        p->i++;
        return r;
    }
    if (c == '[') {
        p->i++;
        return re_class(p);
    }
    if (c == '.') {
        p->i++;
        return re_dot(p);
    }
    if (c == '\\') {
        p->i++;
        if (p->i >= p->n)
            return re_fail(p, "a trailing \\");
        cpset s = {0};
        int ce = class_escape(p->s[p->i], &s);
        if (ce != 0) {
            gsym r = -1;
            if (ce > 0) {
                p->i++;
                r = cpset_sym(p, &s);
            } else {
                gb_fail(p->b, "out of memory");
            }
            free(s.r);
            return r;
        }
        if (p->s[p->i] >= '1' && p->s[p->i] <= '9')
            return re_fail(p, "back-references are not supported");
        if (p->s[p->i] == 'b' || p->s[p->i] == 'B')
            return re_fail(p, "word boundaries are not supported");
        uint32_t cp;
        if (re_escape_char(p, &cp))
            return -1;
        return cp_sym(p, cp, cp);
    }
    if (c == '^' || c == '$')
        return re_fail(p, "anchors are supported only at the start and the end");
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return re_fail(p, "a quantifier with nothing before it");
    uint32_t cp;
    if (re_utf8(p, &cp))
        return -1;
    return cp_sym(p, cp, cp);
}

/* Reads {n}, {n,}, {n,m}; returns 1 if there was one, 0 if "{" is a literal, -1 on error. */
static int re_braces(re_parser *p, long *min, long *max)
{
    size_t i = p->i + 1;
    long a = 0, b;
    int k = 0;
    while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9' && k < 7) {
        a = a * 10 + (p->s[i++] - '0');
        k++;
    }
    if (k == 0)
        return 0;
    b = a;
    if (i < p->n && p->s[i] == ',') {
        i++;
        b = -1;
        k = 0;
        long v = 0;
        while (i < p->n && p->s[i] >= '0' && p->s[i] <= '9' && k < 7) {
            v = v * 10 + (p->s[i++] - '0');
            k++;
        }
        if (k)
            b = v;
    }
    if (i >= p->n || p->s[i] != '}')
        return 0;
    p->i = i + 1;
    *min = a;
    *max = b;
    return 1;
}

static gsym re_concat(re_parser *p)
{
    gvec seq = {0};
    gsym r = -1;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')' && !p->b->failed) {
        gsym a = re_atom(p);
        if (p->b->failed)
            break;
        for (;;) {
            long min, max;
            if (p->i >= p->n)
                break;
            char q = p->s[p->i];
            if (q == '*') {
                min = 0;
                max = -1;
                p->i++;
            } else if (q == '+') {
                min = 1;
                max = -1;
                p->i++;
            } else if (q == '?') {
                min = 0;
                max = 1;
                p->i++;
            } else if (q == '{') {
                int br = re_braces(p, &min, &max);
                if (br <= 0)
                    break;
            } else {
                break;
            }
            if (p->i < p->n && p->s[p->i] == '?')
                p->i++;             /* lazy: the same language */
            /* Next to an unanchored side, x{m,n} matches what x{m} does:
             * the "any characters" there absorb the other n - m. Keeping
             * them makes every output byte start one more parse of the
             * repetition (".{0,100000}": thousands of configurations after
             * a few dozen bytes, the matcher's limit, then no token), so
             * the outermost first and last quantifiers of a branch shrink. */
            bool at_end = p->i >= p->n || p->s[p->i] == '|';
            if (p->depth == 0 && max != min && ((p->open_head && seq.n == 0) || (p->open_tail && at_end)))
                max = min;
            a = gb_rep(p->b, a, min, max);
        }
        if (gvec_push(&seq, a))
            gb_fail(p->b, "out of memory");
    }
    if (!p->b->failed)
        r = seq.n == 0 ? gb_empty(p->b) : gb_seq(p->b, seq.v, seq.n);
    free(seq.v);
    return r;
}

static gsym re_alt(re_parser *p)
{
    gvec alts = {0};
    gsym r = -1;
    for (;;) {
        if (alts.n == GRAMMAR_MAX_ALTS) {
            gb_fail(p->b, "an alternation has more than %d alternatives; the limit is %d", GRAMMAR_MAX_ALTS,
                    GRAMMAR_MAX_ALTS);
            break;
        }
        if (gvec_push(&alts, re_concat(p)))
            gb_fail(p->b, "out of memory");
        if (p->b->failed || p->i >= p->n || p->s[p->i] != '|')
            break;
        p->i++;
    }
    if (!p->b->failed)
        r = gb_or(p->b, alts.v, alts.n);
    free(alts.v);
    return r;
}

gsym gb_regex(gbuild *b, const char *s, size_t n, bool json)
{
    bool head = n > 0 && s[0] == '^';
    bool tail = false;
    if (n > (head ? 1u : 0u) && s[n - 1] == '$') {
        size_t k = 0;           /* count the backslashes before '$' */
        while (k + 1 < n && s[n - 2 - k] == '\\')
            k++;
        tail = k % 2 == 0;
    }
    re_parser p = {.b = b, .s = s, .n = n - (tail ? 1 : 0), .i = head ? 1 : 0, .json = json,
                   .open_head = json && !head, .open_tail = json && !tail};
    gsym body = re_alt(&p);
    if (!b->failed && p.i < p.n)
        re_fail(&p, "an unbalanced )");
    if (b->failed)
        return -1;
    if (!json)
        return body;
    gsym any = -1;
    if (!head || !tail)
        any = gb_star(b, cp_sym(&p, 0, 0x10FFFF));
    gsym sq[3];
    int k = 0;
    if (!head)
        sq[k++] = any;
    sq[k++] = body;
    if (!tail)
        sq[k++] = any;
    return gb_seq(b, sq, k);
}

grammar *grammar_compile_regex(const char *re, size_t len, char *err, size_t errlen)
{
    gbuild b;
    gb_init(&b);
    gsym root = gb_regex(&b, re, len, false);
    grammar *g = gb_finish(&b, root);
    if (!g)
        snprintf(err, errlen, "%s", b.err);
    gb_deinit(&b);
    return g;
}

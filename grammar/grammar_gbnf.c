/* grammar_gbnf.c - llama.cpp's GBNF grammars compiled into the grammar form.
 *
 * Owns: parsing GBNF text (llama-server's "grammar" field) into rules of
 * the builder in grammar_impl.h, with errors that name the line and column.
 * Does not own: matching (grammar.c), JSON Schema and regex (the other
 * compilers).
 * ref: llama.cpp grammars/README.md, the GBNF it describes:
 *   name ::= alternatives        one rule per line; "root" is the start
 *   a b                          sequence;  a | b  alternation
 *   "text"                       literal (escapes \n \r \t \\ \" \[ \]
 *                                \xHH \uHHHH \UHHHHHHHH: code points)
 *   [a-z0-9_] [^"\\]             character classes over code points
 *   .                            any character
 *   ( ... )                      grouping; newlines allowed inside
 *   x* x+ x? x{m} x{m,} x{m,n} x{,n}   repetition
 *   # ...                        comment to the end of the line
 * Rules may be used before they are defined and may recurse (not through
 * the left: gb_finish refuses a grammar that loops without input).
 * Token references (<[id]>, !<...>) are not supported: an error names them.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "fault.h"

#define GBNF_MAX_DEPTH 64
#define GBNF_MAX_BYTES (1 << 20)

typedef struct gname {
    const char *s;              /* into the text */
    size_t n;
    int rule;
    long used_at;               /* first use (byte offset), for "not defined" */
    bool defined;
} gname;

typedef struct gparse {
    gbuild *b;
    const char *s, *p, *end;
    gname *names;
    int n_names, cap_names;
    int depth;
    /* [n_rep] by rule id: the copies of one part its nested bounded
     * repetitions ask for (GRAMMAR_MAX_NESTED_REPEAT); 0 is 1 */
    long *rep;
    int n_rep;
} gparse;

/* The copies of one part x asks for through its nested repetitions. */
static long rep_of(const gparse *g, gsym x)
{
    return x >= 0 && x < g->n_rep && g->rep[x] > 1 ? g->rep[x] : 1;
}

/* Records that the symbol x asks for rep copies of one part. */
static void rep_set(gparse *g, gsym x, long rep)
{
    if (x < 0 || rep <= 1 || g->b->failed)
        return;
    if (x >= g->n_rep) {
        int n = x + 1 > 2 * g->n_rep ? x + 1 : 2 * g->n_rep;
        long *p = realloc(g->rep, (size_t)n * sizeof *p);
        if (!p) {
            gb_fail(g->b, "out of memory");
            return;
        }
        memset(p + g->n_rep, 0, (size_t)(n - g->n_rep) * sizeof *p);
        g->rep = p;
        g->n_rep = n;
    }
    g->rep[x] = rep;
}

/* The most copies any of v[0..n) asks for. */
static long rep_max(const gparse *g, const gsym *v, int n)
{
    long m = 1;
    for (int i = 0; i < n; i++)
        m = rep_of(g, v[i]) > m ? rep_of(g, v[i]) : m;
    return m;
}

/* The first error, at the parser's position. */
static void syntax(gparse *g, const char *what)
{
    int line = 1, col = 1;
    for (const char *c = g->s; c < g->p && c < g->end; c++) {
        if (*c == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)*c & 0xC0) != 0x80) {
            col++;
        }
    }
    gb_fail(g->b, "GBNF syntax error at line %d, column %d: %s", line, col, what);
}

static bool word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Spaces, tabs and comments; newlines too when newline_ok. */
static void space(gparse *g, bool newline_ok)
{
    while (g->p < g->end) {
        char c = *g->p;
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            g->p++;
        } else if (c == '#') {
            while (g->p < g->end && *g->p != '\n')
                g->p++;
        } else {
            break;
        }
    }
}

/* The rule named s[0..n), made on first sight. */
static int rule_of(gparse *g, const char *s, size_t n, long at)
{
    for (int i = 0; i < g->n_names; i++)
        if (g->names[i].n == n && !memcmp(g->names[i].s, s, n))
            return i;
    gname *v = fault_grow(g->names, g->n_names, &g->cap_names, sizeof *v, 16);
    if (!v) {
        gb_fail(g->b, "out of memory");
        return -1;
    }
    g->names = v;
    g->names[g->n_names] = (gname){s, n, gb_rule_new(g->b), at, false};
    return g->n_names++;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                                                          : -1;
}

/* One character of a literal or class: an escape or a UTF-8 sequence.
 * Returns its code point, or -1 after an error. */
static long one_char(gparse *g)
{
    if (g->p >= g->end) {
        syntax(g, "unexpected end of the grammar");
        return -1;
    }
    unsigned char c = (unsigned char)*g->p;
    if (c == '\\') {
        if (g->p + 1 >= g->end) {
            syntax(g, "unexpected end of the grammar after '\\'");
            return -1;
        }
        char e = g->p[1];
        static const char plain[] = "nrt\\\"[]-^/'", value[] = "\n\r\t\\\"[]-^/'";
        const char *k = strchr(plain, e);
        if (k && e) {
            g->p += 2;
            return (unsigned char)value[k - plain];
        }
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (!digits) {
            syntax(g, "unknown escape (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)");
            return -1;
        }
        long v = 0;
        for (int i = 0; i < digits; i++) {
            int h = g->p + 2 + i < g->end ? hexval(g->p[2 + i]) : -1;
            if (h < 0) {
                syntax(g, "an escape needs its hex digits");
                return -1;
            }
            v = v * 16 + h;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
            syntax(g, "an escape names no Unicode scalar value");
            return -1;
        }
        g->p += 2 + digits;
        return v;
    }
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    long v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    bool ok = n > 0 && g->p + n <= g->end;
    for (int i = 1; ok && i < n; i++) {
        unsigned char t = (unsigned char)g->p[i];
        ok = (t & 0xC0) == 0x80;
        v = (v << 6) | (t & 0x3F);
    }
    static const long least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (!ok || v < least[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        syntax(g, "the grammar is not valid UTF-8");
        return -1;
    }
    g->p += n;
    return v;
}

/* "..." at g->p. */
static gsym literal(gparse *g)
{
    g->p++;
    size_t cap = (size_t)(g->end - g->p) * 4 + 1, n = 0;
    char *buf = fault_malloc(cap);
    if (!buf) {
        gb_fail(g->b, "out of memory");
        return -1;
    }
    while (g->p < g->end && *g->p != '"' && *g->p != '\n') {
        long cp = one_char(g);
        if (cp < 0) {
            free(buf);
            return -1;
        }
        n += (size_t)gb_utf8_put((uint32_t)cp, (uint8_t *)buf + n);
    }
    if (g->p >= g->end || *g->p != '"') {
        free(buf);
        syntax(g, "a string literal is not closed on its line");
        return -1;
    }
    g->p++;
    gsym r = gb_lit(g->b, buf, n);
    free(buf);
    return r;
}

static int cmp_range(const void *a, const void *b)
{
    long x = ((const long *)a)[0], y = ((const long *)b)[0];
    return x < y ? -1 : x > y;
}

/* [...] or [^...] at g->p. */
static gsym char_class(gparse *g)
{
    g->p++;
    bool neg = g->p < g->end && *g->p == '^';
    if (neg)
        g->p++;
    long (*r)[2] = NULL;
    int n = 0, cap = 0;
    gsym out = -1;
    while (g->p < g->end && *g->p != ']' && *g->p != '\n') {
        long lo = one_char(g), hi = lo;
        if (lo >= 0 && g->p + 1 < g->end && *g->p == '-' && g->p[1] != ']') {
            g->p++;
            hi = one_char(g);
            if (hi >= 0 && hi < lo) {
                syntax(g, "a character range runs backwards");
                hi = -1;
            }
        }
        if (lo < 0 || hi < 0)
            goto out;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            void *v = fault_realloc(r, (size_t)cap * sizeof *r);
            if (!v) {
                gb_fail(g->b, "out of memory");
                goto out;
            }
            r = v;
        }
        r[n][0] = lo;
        r[n][1] = hi;
        n++;
    }
    if (g->p >= g->end || *g->p != ']') {
        syntax(g, "a character class is not closed on its line");
        goto out;
    }
    g->p++;
    if (n == 0 && !neg) {
        syntax(g, "an empty character class matches nothing");
        goto out;
    }
    if (n > 1)                  /* [^] leaves r NULL: qsort may not see it */
        qsort(r, (size_t)n, sizeof *r, cmp_range);
    /* merge, then (negated) take the gaps between */
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i][0] <= r[m - 1][1] + 1) {
            if (r[i][1] > r[m - 1][1])
                r[m - 1][1] = r[i][1];
        } else {
            r[m][0] = r[i][0];
            r[m][1] = r[i][1];
            m++;
        }
    }
    if (neg) {                  /* the gaps between the ranges: at most m + 1 */
        void *v = fault_realloc(r, (size_t)(m + 1) * sizeof *r);
        if (!v) {
            gb_fail(g->b, "out of memory");
            goto out;
        }
        r = v;
        long prev = 0;
        int k = 0;
        for (int i = 0; i < m; i++) {
            long lo = r[i][0], hi = r[i][1];
            if (lo > prev) {
                r[k][0] = prev;
                r[k][1] = lo - 1;
                k++;
            }
            prev = hi + 1;
        }
        if (prev <= 0x10FFFF) {
            r[k][0] = prev;
            r[k][1] = 0x10FFFF;
            k++;
        }
        m = k;
    }
    gvec alts = {0};
    for (int i = 0; i < m && !g->b->failed; i++) {
        /* the surrogates alone are no characters */
        if (r[i][0] >= 0xD800 && r[i][1] <= 0xDFFF)
            continue;
        if (gvec_push(&alts, gb_cp_range(g->b, (uint32_t)r[i][0], (uint32_t)r[i][1])))
            gb_fail(g->b, "out of memory");
    }
    if (alts.n == 0 && !g->b->failed)
        syntax(g, "a character class matches nothing");
    else
        out = gb_or(g->b, alts.v, alts.n);
    free(alts.v);
out:
    free(r);
    return out;
}

/* A count of a {m,n} repetition; -1 when there are no digits. */
static long count(gparse *g)
{
    long v = -1;
    while (g->p < g->end && *g->p >= '0' && *g->p <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (*g->p++ - '0');
        if (v > 1000000)
            v = 1000000;                /* gb_rep refuses it with its own message */
    }
    return v;
}

static gsym alternates(gparse *g, bool nested);

static gsym sequence(gparse *g, bool nested)
{
    gvec items = {0};
    while (g->p < g->end && !g->b->failed) {
        char c = *g->p;
        gsym x = -1;
        bool item = true;
        if (c == '"') {
            x = literal(g);
        } else if (c == '[') {
            x = char_class(g);
        } else if (c == '.') {
            g->p++;
            x = gb_cp_range(g->b, 0, 0x10FFFF);
        } else if (word_char(c)) {
            const char *s = g->p;
            while (g->p < g->end && word_char(*g->p))
                g->p++;
            int k = rule_of(g, s, (size_t)(g->p - s), (long)(s - g->s));
            x = k < 0 ? -1 : g->names[k].rule;
        } else if (c == '(') {
            g->p++;
            space(g, true);
            x = alternates(g, true);
            if (!g->b->failed && (g->p >= g->end || *g->p != ')'))
                syntax(g, "expected ')'");
            else
                g->p++;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            item = false;
            if (items.n == 0) {
                syntax(g, "a repetition with nothing before it");
                break;
            }
            gsym *last = &items.v[items.n - 1];
            const long inner = rep_of(g, *last);
            g->p++;
            if (c == '*') {
                *last = gb_rep(g->b, *last, 0, -1);
            } else if (c == '+') {
                *last = gb_rep(g->b, *last, 1, -1);
            } else if (c == '?') {
                *last = gb_opt(g->b, *last);
            }
            if (c != '{') {
                rep_set(g, *last, inner);
            } else {
                space(g, false);
                long lo = count(g), hi;
                space(g, false);
                if (g->p < g->end && *g->p == ',') {
                    g->p++;
                    space(g, false);
                    hi = count(g);
                } else {
                    hi = lo;
                }
                space(g, false);
                if (g->p >= g->end || *g->p != '}' || (lo < 0 && hi < 0)) {
                    syntax(g, "a repetition is {m}, {m,}, {m,n} or {,n}");
                    break;
                }
                g->p++;
                /* nested bounds multiply: refused before anything is built */
                const long times = hi >= 0 ? hi : lo > 1 ? lo : 1;
                if (times > 1 && inner > 1 && inner * times > GRAMMAR_MAX_NESTED_REPEAT) {
                    gb_fail(g->b, "nested repetitions ask for %ld copies of one part (the product of their bounds); "
                            "the limit is %d", inner * times, GRAMMAR_MAX_NESTED_REPEAT);
                    break;
                }
                *last = gb_rep(g->b, *last, lo < 0 ? 0 : lo, hi);
                rep_set(g, *last, inner * times);
            }
        } else if (c == '<' || c == '!') {
            syntax(g, "token references (<[id]>, !) are not supported");
            break;
        } else {
            break;
        }
        if (item && gvec_push(&items, x))
            gb_fail(g->b, "out of memory");
        space(g, nested);
    }
    gsym r = gb_seq(g->b, items.v, items.n);
    rep_set(g, r, rep_max(g, items.v, items.n));
    free(items.v);
    return r;
}

static gsym alternates(gparse *g, bool nested)
{
    if (++g->depth > GBNF_MAX_DEPTH) {
        syntax(g, "groups nest more than 64 deep");
        return -1;
    }
    gvec alts = {0};
    for (;;) {
        if (alts.n == GRAMMAR_MAX_ALTS) {
            gb_fail(g->b, "a rule or group has more than %d alternatives; the limit is %d", GRAMMAR_MAX_ALTS,
                    GRAMMAR_MAX_ALTS);
            break;
        }
        if (gvec_push(&alts, sequence(g, nested)))
            gb_fail(g->b, "out of memory");
        if (g->b->failed || g->p >= g->end || *g->p != '|')
            break;
        g->p++;
        space(g, true);
    }
    gsym r = gb_or(g->b, alts.v, alts.n);
    rep_set(g, r, rep_max(g, alts.v, alts.n));
    free(alts.v);
    g->depth--;
    return r;
}

grammar *grammar_compile_gbnf(const char *text, size_t len, char *err, size_t errlen)
{
    gbuild b;
    gb_init(&b);
    gparse g = {.b = &b, .s = text, .p = text, .end = text + len};
    if (len > GBNF_MAX_BYTES)
        gb_fail(&b, "the grammar is larger than %d bytes", GBNF_MAX_BYTES);
    if (memchr(text, '\0', len))
        gb_fail(&b, "the grammar holds a NUL byte");
    space(&g, true);
    while (g.p < g.end && !b.failed) {
        const char *s = g.p;
        while (g.p < g.end && word_char(*g.p))
            g.p++;
        if (g.p == s) {
            syntax(&g, "expected a rule name");
            break;
        }
        int k = rule_of(&g, s, (size_t)(g.p - s), (long)(s - text));
        space(&g, false);
        if (g.end - g.p < 3 || memcmp(g.p, "::=", 3)) {
            syntax(&g, "expected '::=' after the rule name");
            break;
        }
        if (k >= 0 && g.names[k].defined) {
            g.p = s;
            syntax(&g, "a rule is defined twice");
            break;
        }
        g.p += 3;
        space(&g, true);
        gsym body = alternates(&g, false);
        if (b.failed)
            break;
        if (g.p < g.end && *g.p != '\n' && *g.p != '\r') {
            syntax(&g, "unexpected character (a rule ends at the end of its line; group across lines with ( ))");
            break;
        }
        g.names[k].defined = true;
        gb_add_alt(&b, g.names[k].rule, &body, 1);
        rep_set(&g, g.names[k].rule, rep_of(&g, body));   /* for the rules after it that use it */
        space(&g, true);
    }
    int root = -1;
    for (int i = 0; i < g.n_names && !b.failed; i++) {
        if (!g.names[i].defined) {
            g.p = text + g.names[i].used_at;
            char what[128];
            snprintf(what, sizeof what, "rule '%.*s' is used but not defined", (int)(g.names[i].n > 64 ? 64 : g.names[i].n),
                     g.names[i].s);
            syntax(&g, what);
        }
        if (g.names[i].n == 4 && !memcmp(g.names[i].s, "root", 4))
            root = g.names[i].rule;
    }
    if (!b.failed && root < 0)
        gb_fail(&b, "the GBNF grammar has no 'root' rule");
    grammar *out = b.failed ? NULL : gb_finish(&b, root);
    if (!out)
        snprintf(err, errlen, "%s", b.err);
    free(g.names);
    free(g.rep);
    gb_deinit(&b);
    return out;
}

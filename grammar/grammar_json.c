/* grammar_json.c - JSON Schema to grammar.
 *
 * Owns: the JSON grammar pieces (whitespace, strings with every escape,
 * numbers), and the schema compiler: type (one or a list), enum, const,
 * anyOf, oneOf, allOf of one schema, $ref into "#", "#/$defs/..." and
 * "#/definitions/...", properties / required / additionalProperties,
 * items / minItems / maxItems, minLength / maxLength, pattern, format
 * (date, time, date-time, uuid), integer bounds, number bounds that are
 * non-negative integers. Annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are
 * ignored; every other keyword is an error that names it.
 * Does not own: regular expressions (grammar_regex.c), matching (grammar.c).
 * ref: RFC 8259 (JSON); JSON Schema 2020-12 validation; ajv-formats for
 * what date, time, date-time and uuid accept.
 *
 * Choices where a grammar cannot follow JSON Schema exactly (a generated
 * document always validates; some valid documents are not generated):
 *   - properties come in the schema's order, each at most once; an object
 *     schema with properties and no additionalProperties allows no other
 *     keys (OpenAI's strict mode); with additionalProperties true or a
 *     schema, other keys (each differing from every property name) follow
 *     the properties, and such a key is written without escapes until it
 *     has left every property name (after that, any escape);
 *   - oneOf is generated as anyOf: branches must not overlap;
 *   - integers are written without fraction or exponent and without "-0";
 *   - whitespace and digit runs are bounded unless grammar_opts.exact;
 *   - enum and const values are written in canonical form (JSON.stringify's
 *     escapes and number spelling);
 *   - strings never hold lone surrogates (\ud800 must pair with \udc00..);
 */
#include "grammar.h"
#include "grammar_impl.h"
#include "fault.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_MAX_DEPTH 64
#define NONE INT32_MAX          /* a piece not built yet */

typedef struct jref {
    char *path;
    int rule;
} jref;

/* One compilation. */
typedef struct jctx {
    gbuild *b;
    const cJSON *root;
    jref *refs;
    int n_refs, cap_refs;
    int depth;
    bool exact;                 /* grammar_opts.exact */
    gsym ws, ch, str, num, value, obj_any, arr_any, digit, digits1, hex;
    gsym key_rest;              /* the rest of a key once it differs from every property name, and its quote */
} jctx;

static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", NULL};

static bool in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s))
            return true;
    return false;
}

static gsym set_of(gbuild *b, const char *chars)
{
    uint64_t bits[4] = {0};
    for (const unsigned char *c = (const unsigned char *)chars; *c; c++)
        bits[*c >> 6] |= 1ull << (*c & 63);
    return gb_set(b, bits);
}

static gsym lits(gbuild *b, const char *s)
{
    return gb_lit(b, s, strlen(s));
}

/* ---- JSON pieces ------------------------------------------------------- */

static gsym p_ws(jctx *c)
{
    if (c->ws != NONE)
        return c->ws;
    gbuild *b = c->b;
    if (c->exact) {
        c->ws = gb_star(b, set_of(b, " \t\n\r"));
    } else {
        gsym nl[2] = {gb_byte(b, '\n'), gb_rep(b, set_of(b, " \t"), 0, 20)};
        gsym one[2] = {gb_byte(b, ' '), gb_seq(b, nl, 2)};
        c->ws = gb_opt(b, gb_or(b, one, 2));
    }
    return c->ws;
}

static gsym p_hex(jctx *c)
{
    if (c->hex == NONE)
        c->hex = set_of(c->b, "0123456789abcdefABCDEF");
    return c->hex;
}

/* One character of a JSON string: unescaped (not ", \ or a control),
 * or an escape; \u escapes of surrogates only as a high-low pair. */
static gsym p_char(jctx *c)
{
    if (c->ch != NONE)
        return c->ch;
    gbuild *b = c->b;
    gsym h = p_hex(c);
    gsym bs = gb_byte(b, '\\'), u = gb_byte(b, 'u');
    /* \u not a surrogate: first digit not d/D, or d/D then 0-7 */
    gsym nd = set_of(b, "0123456789abcefABCEF");
    gsym d = set_of(b, "dD");
    gsym s1[4] = {nd, h, h, h};
    gsym s2[4] = {d, set_of(b, "01234567"), h, h};
    gsym plain_u[2] = {gb_seq(b, s1, 4), gb_seq(b, s2, 4)};
    gsym pair[10] = {d, set_of(b, "89abAB"), h, h, bs, u, d, set_of(b, "cdefCDEF"), h, h};
    gsym uesc[3] = {gb_or(b, plain_u, 2), gb_seq(b, pair, 10)};
    gsym esc_alts[2] = {set_of(b, "\"\\/bfnrt"), 0};
    gsym useq[2] = {u, gb_or(b, uesc, 2)};
    esc_alts[1] = gb_seq(b, useq, 2);
    gsym esc[2] = {bs, gb_or(b, esc_alts, 2)};
    uint64_t ascii[4] = {0};
    for (unsigned k = 0x20; k < 0x80; k++)
        if (k != '"' && k != '\\')
            ascii[k >> 6] |= 1ull << (k & 63);
    gsym alts[3] = {gb_set(b, ascii), gb_cp_range(b, 0x80, 0x10FFFF), gb_seq(b, esc, 2)};
    c->ch = gb_or(b, alts, 3);
    return c->ch;
}

static gsym p_string(jctx *c)
{
    if (c->str == NONE) {
        gsym q = gb_byte(c->b, '"');
        gsym s[3] = {q, gb_star(c->b, p_char(c)), q};
        c->str = gb_seq(c->b, s, 3);
    }
    return c->str;
}

static gsym p_digit(jctx *c)
{
    if (c->digit == NONE)
        c->digit = gb_range(c->b, '0', '9');
    return c->digit;
}

/* Digit runs after the first: unbounded when exact, else at most 15 more. */
static gsym p_more_digits(jctx *c)
{
    return c->exact ? gb_star(c->b, p_digit(c)) : gb_rep(c->b, p_digit(c), 0, 15);
}

/* 0 | [1-9][0-9]* */
static gsym p_uint(jctx *c)
{
    if (c->digits1 == NONE) {
        gsym s[2] = {gb_range(c->b, '1', '9'), p_more_digits(c)};
        gsym a[2] = {gb_byte(c->b, '0'), gb_seq(c->b, s, 2)};
        c->digits1 = gb_or(c->b, a, 2);
    }
    return c->digits1;
}

static gsym p_frac(jctx *c)
{
    gsym s[3] = {gb_byte(c->b, '.'), p_digit(c), p_more_digits(c)};
    return gb_seq(c->b, s, 3);
}

static gsym p_number(jctx *c)
{
    if (c->num == NONE) {
        gbuild *b = c->b;
        gsym e[4] = {set_of(b, "eE"), gb_opt(b, set_of(b, "+-")), p_digit(c), p_more_digits(c)};
        gsym s[4] = {gb_opt(b, gb_byte(b, '-')), p_uint(c), gb_opt(b, p_frac(c)), gb_opt(b, gb_seq(b, e, 4))};
        c->num = gb_seq(b, s, 4);
    }
    return c->num;
}

static gsym p_integer(jctx *c)
{
    gsym s[2] = {gb_opt(c->b, gb_byte(c->b, '-')), p_uint(c)};
    return gb_seq(c->b, s, 2);
}

/* open ws ( item (ws sep ws item)* ws )? close, with item counts min..max */
static gsym p_list(jctx *c, char open, char close, gsym item, long min, long max)
{
    gbuild *b = c->b;
    gsym ws = p_ws(c);
    gsym sep[4] = {ws, gb_byte(b, ','), ws, item};
    gsym more = gb_rep(b, gb_seq(b, sep, 4), min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
    gsym body[3] = {item, more, ws};
    gsym filled = gb_seq(b, body, 3);
    gsym s[4] = {gb_byte(b, (uint8_t)open), ws, min == 0 ? gb_opt(b, filled) : filled, gb_byte(b, (uint8_t)close)};
    return gb_seq(b, s, 4);
}

/* Any JSON value (recursive). */
static gsym p_value(jctx *c)
{
    if (c->value != NONE)
        return c->value;
    gbuild *b = c->b;
    int v = gb_rule_new(b);
    c->value = v;
    gsym ws = p_ws(c);
    gsym member[5] = {p_string(c), ws, gb_byte(b, ':'), ws, v};
    c->obj_any = p_list(c, '{', '}', gb_seq(b, member, 5), 0, -1);
    c->arr_any = p_list(c, '[', ']', v, 0, -1);
    gsym alts[7] = {c->obj_any, c->arr_any, p_string(c), p_number(c), lits(b, "true"), lits(b, "false"),
                    lits(b, "null")};
    for (int i = 0; i < 7; i++)
        gb_add_alt(b, v, &alts[i], 1);
    return v;
}

/* ---- literals (enum, const) ---------------------------------------------- */

/* s as JSON.stringify writes it, into buf (cap at least 6 * n + 3). */
static size_t json_quote(const char *s, char *buf)
{
    size_t k = 0;
    buf[k++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned ch = *p;
        const char *e = NULL;
        switch (ch) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default: break;
        }
        if (e) {
            memcpy(buf + k, e, 2);
            k += 2;
        } else if (ch < 0x20) {
            k += (size_t)sprintf(buf + k, "\\u%04x", ch);
        } else {
            buf[k++] = (char)ch;
        }
    }
    buf[k++] = '"';
    return k;
}

static gsym quoted_lit(jctx *c, const char *s)
{
    size_t n = strlen(s);
    char *buf = fault_malloc(6 * n + 3);
    if (!buf) {
        gb_fail(c->b, "out of memory");
        return -1;
    }
    gsym r = gb_lit(c->b, buf, json_quote(s, buf));
    free(buf);
    return r;
}

static gsym json_literal(jctx *c, const cJSON *v)
{
    gbuild *b = c->b;
    if (++c->depth > JS_MAX_DEPTH) {
        gb_fail(b, "a value nested more than %d deep", JS_MAX_DEPTH);
        return -1;
    }
    gsym r = -1;
    if (cJSON_IsString(v)) {
        r = quoted_lit(c, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        char num[40];
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 1e15)
            snprintf(num, sizeof num, "%.0f", d == 0 ? 0.0 : d);
        else
            snprintf(num, sizeof num, "%.17g", d);
        r = lits(b, num);
    } else if (cJSON_IsBool(v)) {
        r = lits(b, cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNull(v)) {
        r = lits(b, "null");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        gvec s = {0};
        gsym ws = p_ws(c);
        gb_push(b, &s, gb_byte(b, obj ? '{' : '['));
        gb_push(b, &s, ws);
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child) {
                gb_push(b, &s, gb_byte(b, ','));
                gb_push(b, &s, ws);
            }
            if (obj) {
                gb_push(b, &s, quoted_lit(c, e->string));
                gb_push(b, &s, ws);
                gb_push(b, &s, gb_byte(b, ':'));
                gb_push(b, &s, ws);
            }
            gb_push(b, &s, json_literal(c, e));
            gb_push(b, &s, ws);
        }
        gb_push(b, &s, gb_byte(b, obj ? '}' : ']'));
        r = gb_seq(b, s.v, s.n);
        free(s.v);
    }
    c->depth--;
    return r;
}

/* ---- numbers with bounds ------------------------------------------------- */

/* Decimal strings of length n between lo and hi (same length, lo <= hi). */
static gsym digits_between(jctx *c, const char *lo, const char *hi, size_t n)
{
    gbuild *b = c->b;
    if (n == 0)
        return gb_empty(b);
    if (lo[0] == hi[0]) {
        gsym s[2] = {gb_byte(b, (uint8_t)lo[0]), digits_between(c, lo + 1, hi + 1, n - 1)};
        return gb_seq(b, s, 2);
    }
    bool lo_zeros = strspn(lo + 1, "0") >= n - 1, hi_nines = strspn(hi + 1, "9") >= n - 1;
    gvec alts = {0};
    char d = lo[0];
    if (!lo_zeros) {
        char nines[24];
        memset(nines, '9', n - 1);
        gsym s[2] = {gb_byte(b, (uint8_t)lo[0]), digits_between(c, lo + 1, nines, n - 1)};
        gb_push(b, &alts, gb_seq(b, s, 2));
        d++;
    }
    char e = hi_nines ? hi[0] : (char)(hi[0] - 1);
    if (d <= e) {
        gsym s[2] = {gb_range(b, (uint8_t)d, (uint8_t)e), gb_rep(b, p_digit(c), (long)n - 1, (long)n - 1)};
        gb_push(b, &alts, gb_seq(b, s, 2));
    }
    if (!hi_nines) {
        char zeros[24];
        memset(zeros, '0', n - 1);
        gsym s[2] = {gb_byte(b, (uint8_t)hi[0]), digits_between(c, zeros, hi + 1, n - 1)};
        gb_push(b, &alts, gb_seq(b, s, 2));
    }
    gsym r = gb_or(b, alts.v, alts.n);
    free(alts.v);
    return r;
}

/* Decimal natural numbers (no leading zeros) in lo..hi; hi < 0: unbounded. */
static gsym uint_between(jctx *c, long long lo, long long hi)
{
    gbuild *b = c->b;
    gvec alts = {0};
    char a[24], z[24];
    int la = snprintf(a, sizeof a, "%lld", lo);
    int lh = hi < 0 ? la : snprintf(z, sizeof z, "%lld", hi);
    for (int n = la; n <= lh; n++) {
        char from[24], to[24];
        if (n == la)
            memcpy(from, a, (size_t)n + 1);
        else {
            memset(from, '0', (size_t)n);
            from[0] = '1';
        }
        if (hi >= 0 && n == lh)
            memcpy(to, z, (size_t)n + 1);
        else
            memset(to, '9', (size_t)n);
        gb_push(b, &alts, digits_between(c, from, to, (size_t)n));
    }
    if (hi < 0) {
        /* every number with more digits than lo */
        gsym s[3] = {gb_range(b, '1', '9'), gb_rep(b, p_digit(c), la, la),
                     c->exact ? gb_star(b, p_digit(c)) : gb_rep(b, p_digit(c), 0, la < 15 ? 15 - la : 0)};
        gb_push(b, &alts, gb_seq(b, s, 3));
    }
    gsym r = gb_or(b, alts.v, alts.n);
    free(alts.v);
    return r;
}

#define JS_INT_LIMIT 1e15       /* bounds beyond are refused */

/* Integers in lo..hi; has_lo / has_hi false: unbounded on that side. */
static gsym int_between(jctx *c, bool has_lo, long long lo, bool has_hi, long long hi)
{
    gbuild *b = c->b;
    gvec alts = {0};
    if (!has_hi || hi >= 0)     /* non-negative part */
        gb_push(b, &alts, uint_between(c, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1));
    if (!has_lo || lo < 0) {    /* negative part: "-" then |x| in (max(-hi, 1)) .. -lo */
        long long m_lo = has_hi && hi < 0 ? -hi : 1;
        gsym s[2] = {gb_byte(b, '-'), uint_between(c, m_lo, has_lo ? -lo : -1)};
        gb_push(b, &alts, gb_seq(b, s, 2));
    }
    gsym r = gb_or(b, alts.v, alts.n);
    free(alts.v);
    return r;
}

/* Reads minimum / maximum / exclusive* as integer bounds on an integer
 * (ceil / floor). Returns -1 after gb_fail. */
static int int_bounds(jctx *c, const cJSON *s, bool *has_lo, long long *lo, bool *has_hi, long long *hi)
{
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    const cJSON *emn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *emx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    double l = -INFINITY, h = INFINITY;
    const cJSON *all[4] = {mn, mx, emn, emx};
    for (int i = 0; i < 4; i++)
        if (all[i] && !cJSON_IsNumber(all[i])) {
            gb_fail(c->b, "minimum, maximum, exclusiveMinimum and exclusiveMaximum must be numbers");
            return -1;
        }
    if (mn)
        l = ceil(mn->valuedouble);
    if (emn)
        l = fmax(l, floor(emn->valuedouble) + 1);
    if (mx)
        h = floor(mx->valuedouble);
    if (emx)
        h = fmin(h, ceil(emx->valuedouble) - 1);
    if (fabs(l) > JS_INT_LIMIT && isfinite(l)) {
        gb_fail(c->b, "an integer bound beyond 1e15 is not supported");
        return -1;
    }
    if (fabs(h) > JS_INT_LIMIT && isfinite(h)) {
        gb_fail(c->b, "an integer bound beyond 1e15 is not supported");
        return -1;
    }
    if (l > h) {
        gb_fail(c->b, "no integer lies between the bounds");
        return -1;
    }
    *has_lo = isfinite(l);
    *has_hi = isfinite(h);
    *lo = *has_lo ? (long long)l : 0;
    *hi = *has_hi ? (long long)h : 0;
    return 0;
}

static bool has_bounds(const cJSON *s)
{
    return cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
           cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") ||
           cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
}

static gsym s_integer(jctx *c, const cJSON *s)
{
    if (!has_bounds(s))
        return p_integer(c);
    bool hl, hh;
    long long lo, hi;
    if (int_bounds(c, s, &hl, &lo, &hh, &hi))
        return -1;
    return int_between(c, hl, lo, hh, hi);
}

/* Numbers with bounds: only inclusive minimum >= 0 and maximum that are
 * integers: x = i(.d+)? with i in [min, max - 1], or max(.0+)? */
static gsym s_number(jctx *c, const cJSON *s)
{
    gbuild *b = c->b;
    if (!has_bounds(s))
        return p_number(c);
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    if (cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") ||
        cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum") || !mn || !cJSON_IsNumber(mn) ||
        mn->valuedouble < 0 || mn->valuedouble != floor(mn->valuedouble) || mn->valuedouble > JS_INT_LIMIT ||
        (mx && (!cJSON_IsNumber(mx) || mx->valuedouble != floor(mx->valuedouble) ||
                mx->valuedouble > JS_INT_LIMIT || mx->valuedouble < mn->valuedouble))) {
        gb_fail(b, "bounds on \"number\" are supported only as an inclusive integer minimum >= 0 and an "
                   "optional inclusive integer maximum");
        return -1;
    }
    long long lo = (long long)mn->valuedouble;
    if (!mx) {
        gsym sq[2] = {uint_between(c, lo, -1), gb_opt(b, p_frac(c))};
        return gb_seq(b, sq, 2);
    }
    long long hi = (long long)mx->valuedouble;
    char top[24];
    snprintf(top, sizeof top, "%lld", hi);
    gsym z[2] = {gb_byte(b, '.'), gb_rep(b, gb_byte(b, '0'), 1, -1)};
    gsym at_max[2] = {lits(b, top), gb_opt(b, gb_seq(b, z, 2))};
    if (hi == lo)
        return gb_seq(b, at_max, 2);
    gsym below[2] = {uint_between(c, lo, hi - 1), gb_opt(b, p_frac(c))};
    gsym alts[2] = {gb_seq(b, below, 2), gb_seq(b, at_max, 2)};
    return gb_or(b, alts, 2);
}

/* ---- strings ------------------------------------------------------------ */

static gsym two_digit(gbuild *b, const char *first, const char *second)
{
    gsym s[2] = {set_of(b, first), set_of(b, second)};
    return gb_seq(b, s, 2);
}

static gsym f_date(jctx *c)
{
    gbuild *b = c->b;
    gsym d = p_digit(c), dash = gb_byte(b, '-');
    gsym d1_9[2] = {gb_byte(b, '0'), gb_range(b, '1', '9')};
    gsym day_lo = gb_seq(b, d1_9, 2);                               /* 01-09 */
    gsym d31[3] = {day_lo, two_digit(b, "12", "0123456789"), two_digit(b, "3", "01")};
    gsym d30[3] = {day_lo, two_digit(b, "12", "0123456789"), lits(b, "30")};
    gsym d28[3] = {day_lo, two_digit(b, "1", "0123456789"), two_digit(b, "2", "012345678")};
    gsym m31[7] = {lits(b, "01"), lits(b, "03"), lits(b, "05"), lits(b, "07"), lits(b, "08"), lits(b, "10"),
                   lits(b, "12")};
    gsym m30[4] = {lits(b, "04"), lits(b, "06"), lits(b, "09"), lits(b, "11")};
    gsym a31[3] = {gb_or(b, m31, 7), dash, gb_or(b, d31, 3)};
    gsym a30[3] = {gb_or(b, m30, 4), dash, gb_or(b, d30, 3)};
    gsym a28[3] = {lits(b, "02"), dash, gb_or(b, d28, 3)};
    gsym md[3] = {gb_seq(b, a31, 3), gb_seq(b, a30, 3), gb_seq(b, a28, 3)};
    gsym s[6] = {d, d, d, d, dash, gb_or(b, md, 3)};
    /* 29 February of a leap year (the Gregorian rule, as ajv-formats has
     * it): the last two digits a multiple of 4 but not 00, or 00 after two
     * that are a multiple of 4 (years divisible by 400, 0000 too) */
    gsym m4nz[3] = {two_digit(b, "0", "48"), two_digit(b, "2468", "048"), two_digit(b, "13579", "26")};
    gsym mult4_nz = gb_or(b, m4nz, 3);
    gsym m4[2] = {mult4_nz, lits(b, "00")};
    gsym by4[3] = {d, d, mult4_nz}, by400[2] = {gb_or(b, m4, 2), lits(b, "00")};
    gsym leap[2] = {gb_seq(b, by4, 3), gb_seq(b, by400, 2)};
    gsym feb29[2] = {gb_or(b, leap, 2), lits(b, "-02-29")};
    gsym any[2] = {gb_seq(b, s, 6), gb_seq(b, feb29, 2)};
    return gb_or(b, any, 2);
}

static gsym f_time(jctx *c)
{
    gbuild *b = c->b;
    gsym hh[2] = {two_digit(b, "01", "0123456789"), two_digit(b, "2", "0123")};
    gsym h = gb_or(b, hh, 2), m = two_digit(b, "012345", "0123456789"), col = gb_byte(b, ':');
    gsym off[4] = {set_of(b, "+-"), h, col, m};
    gsym tz[2] = {set_of(b, "zZ"), gb_seq(b, off, 4)};
    gsym s[7] = {h, col, m, col, m, gb_opt(b, p_frac(c)), gb_or(b, tz, 2)};
    return gb_seq(b, s, 7);
}

static gsym f_uuid(jctx *c)
{
    gbuild *b = c->b;
    gsym x = p_hex(c), dash = gb_byte(b, '-');
    gsym s[9] = {gb_rep(b, x, 8, 8), dash, gb_rep(b, x, 4, 4), dash, gb_rep(b, x, 4, 4), dash,
                 gb_rep(b, x, 4, 4), dash, gb_rep(b, x, 12, 12)};
    return gb_seq(b, s, 9);
}

static bool get_count(jctx *c, const cJSON *s, const char *key, long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v)
        return false;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 100000) {
        gb_fail(c->b, "\"%s\" must be an integer in 0..100000", key);
        return false;
    }
    *out = (long)v->valuedouble;
    return true;
}

static gsym s_string(jctx *c, const cJSON *s)
{
    gbuild *b = c->b;
    gsym q = gb_byte(b, '"');
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    long mn = 0, mx = -1;
    bool has_len = get_count(c, s, "minLength", &mn);
    has_len |= get_count(c, s, "maxLength", &mx);
    if (mx >= 0 && mx < mn) {
        gb_fail(b, "maxLength is below minLength");
        return -1;
    }
    gsym body;
    if ((fmt != NULL) + (pat != NULL) + has_len > 1) {
        gb_fail(b, "a string may have one of format, pattern and minLength/maxLength, not several");
        return -1;
    }
    if (fmt) {
        const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "";
        if (!strcmp(f, "date")) {
            body = f_date(c);
        } else if (!strcmp(f, "time")) {
            body = f_time(c);
        } else if (!strcmp(f, "date-time")) {
            gsym dt[3] = {f_date(c), set_of(b, "Tt"), f_time(c)};
            body = gb_seq(b, dt, 3);
        } else if (!strcmp(f, "uuid")) {
            body = f_uuid(c);
        } else {
            gb_fail(b, "format \"%.40s\" is not supported (date, time, date-time, uuid are)", f);
            return -1;
        }
    } else if (pat) {
        if (!cJSON_IsString(pat)) {
            gb_fail(b, "\"pattern\" must be a string");
            return -1;
        }
        body = gb_regex(b, pat->valuestring, strlen(pat->valuestring), true);
    } else if (has_len) {
        body = gb_rep(b, p_char(c), mn, mx);
    } else {
        return p_string(c);
    }
    gsym sq[3] = {q, body, q};
    return gb_seq(b, sq, 3);
}

/* ---- objects and arrays --------------------------------------------------- */

static gsym schema(jctx *c, const cJSON *s);

/* ---- keys that are not property names ------------------------------------ */

#define JS_MAX_NAME_CPS 1024    /* code points of a property name beside additionalProperties */

/* A property name as code points. */
typedef struct cpname {
    uint32_t *cp;
    int n;
} cpname;

static int cpname_cmp(const void *pa, const void *pb)
{
    const cpname *a = pa, *b = pb;
    for (int i = 0; i < a->n && i < b->n; i++)
        if (a->cp[i] != b->cp[i])
            return a->cp[i] < b->cp[i] ? -1 : 1;
    return (a->n > b->n) - (a->n < b->n);
}

/* The code points of UTF-8 s into out (fault_malloc'd); -1 when s is not
 * UTF-8 or too long, -2 out of memory. */
static int utf8_cps(const char *s, cpname *out)
{
    size_t len = strlen(s);
    out->n = 0;
    out->cp = fault_malloc((len ? len : 1) * sizeof *out->cp);
    if (!out->cp)
        return -2;
    for (size_t i = 0; i < len;) {
        unsigned char c0 = (unsigned char)s[i];
        int k = c0 < 0x80 ? 1 : (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : (c0 >> 3) == 30 ? 4 : 0;
        if (!k || i + (size_t)k > len)
            return -1;
        uint32_t cp = k == 1 ? c0 : c0 & (0x7Fu >> k);
        for (int j = 1; j < k; j++) {
            unsigned char cj = (unsigned char)s[i + (size_t)j];
            if ((cj >> 6) != 2)
                return -1;
            cp = cp << 6 | (cj & 63);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || out->n >= JS_MAX_NAME_CPS)
            return -1;
        out->cp[out->n++] = cp;
        i += (size_t)k;
    }
    return 0;
}

/* Any characters, then the closing quote. */
static gsym key_rest(jctx *c)
{
    if (c->key_rest == NONE) {
        gsym s[2] = {gb_star(c->b, p_char(c)), gb_byte(c->b, '"')};
        c->key_rest = gb_seq(c->b, s, 2);
    }
    return c->key_rest;
}

/* The rest of a key (after the opening quote, through the closing one)
 * that differs from each of nm[0..n): sorted names that share their first
 * `at` code points, which the key has written. Either it ends here (when
 * no name does), or it takes the next code point of some names (raw) and
 * goes on with those, or a raw character none of them has next, after
 * which anything may follow. */
static gsym key_other(jctx *c, const cpname *nm, int n, int at)
{
    gbuild *b = c->b;
    gvec alts = {0}, gaps = {0}, ex = {0};
    int i = 0;
    while (i < n && nm[i].n == at)
        i++;
    if (i == 0)
        gb_push(b, &alts, gb_byte(b, '"'));
    /* the names' next code points (ascending: nm is sorted), each with the
     * names that have it; '"' and '\\' are never raw */
    gb_push(b, &ex, '"');
    gb_push(b, &ex, '\\');
    for (int j = i; j < n && !b->failed;) {
        uint32_t x = nm[j].cp[at];
        int k = j;
        while (k < n && nm[k].cp[at] == x)
            k++;
        gb_push(b, &ex, (int32_t)x);
        if (x >= 0x20 && x != '"' && x != '\\') {
            uint8_t u[4];
            int len = gb_utf8_put(x, u);
            gsym sq[2] = {gb_lit(b, (const char *)u, (size_t)len), key_other(c, nm + j, k - j, at + 1)};
            gb_push(b, &alts, gb_seq(b, sq, 2));
        }
        j = k;
    }
    /* a raw character that is none of them: the key has left every name */
    for (int x = 1; x < ex.n && !b->failed; x++) {      /* insertion sort */
        int32_t v = ex.v[x];
        int y = x;
        for (; y > 0 && ex.v[y - 1] > v; y--)
            ex.v[y] = ex.v[y - 1];
        ex.v[y] = v;
    }
    uint32_t lo = 0x20;
    for (int x = 0; x <= ex.n && !b->failed; x++) {
        uint32_t e = x < ex.n ? (uint32_t)ex.v[x] : 0x110000;
        if (e < lo)
            continue;
        if (e > lo && !(lo >= 0xD800 && e - 1 <= 0xDFFF))
            gb_push(b, &gaps, gb_cp_range(b, lo, e - 1));
        lo = e + 1;
    }
    if (gaps.n) {
        gsym sq[2] = {gb_or(b, gaps.v, gaps.n), key_rest(c)};
        gb_push(b, &alts, gb_seq(b, sq, 2));
    }
    gsym r = b->failed || !alts.n ? -1 : gb_or(b, alts.v, alts.n);
    free(alts.v);
    free(gaps.v);
    free(ex.v);
    return r;
}

/* One member whose key is none of the names of props: "KEY": VALUE. */
static gsym other_member(jctx *c, const cJSON *props, gsym value)
{
    gbuild *b = c->b;
    int n = cJSON_GetArraySize(props), k = 0;
    cpname *nm = fault_calloc((size_t)n + 1, sizeof *nm);
    gsym r = -1;
    if (!nm) {
        gb_fail(b, "out of memory");
        return -1;
    }
    for (const cJSON *p = props->child; p; p = p->next, k++) {
        int rc = utf8_cps(p->string, &nm[k]);
        if (rc == -2) {
            gb_fail(b, "out of memory");
            goto out;
        }
        if (rc < 0) {
            gb_fail(b, "property \"%.60s\" beside additionalProperties is not UTF-8 of at most %d characters",
                    p->string, JS_MAX_NAME_CPS);
            goto out;
        }
    }
    qsort(nm, (size_t)n, sizeof *nm, cpname_cmp);
    gsym ws = p_ws(c);
    gsym sq[6] = {gb_byte(b, '"'), key_other(c, nm, n, 0), ws, gb_byte(b, ':'), ws, value};
    r = gb_seq(b, sq, 6);
out:
    for (int i = 0; i < n; i++)
        free(nm[i].cp);
    free(nm);
    return r;
}

static gsym s_object(jctx *c, const cJSON *s)
{
    gbuild *b = c->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) {
        gb_fail(b, "\"properties\" must be an object");
        return -1;
    }
    if (req && !cJSON_IsArray(req)) {
        gb_fail(b, "\"required\" must be an array");
        return -1;
    }
    int n = cJSON_GetArraySize(props);
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r) || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
            gb_fail(b, "required property \"%.60s\" is not among the properties",
                    cJSON_IsString(r) ? r->valuestring : "?");
            return -1;
        }
    gsym ws = p_ws(c);
    if (n == 0) {
        if (addl && cJSON_IsFalse(addl)) {
            gsym sq[3] = {gb_byte(b, '{'), ws, gb_byte(b, '}')};
            return gb_seq(b, sq, 3);
        }
        if (!addl || cJSON_IsTrue(addl)) {
            p_value(c);
            return c->obj_any;
        }
        gsym member[5] = {p_string(c), ws, gb_byte(b, ':'), ws, schema(c, addl)};
        return p_list(c, '{', '}', gb_seq(b, member, 5), 0, -1);
    }
    /* the members past the properties: keys that are none of them */
    gsym other = NONE;
    if (addl && !cJSON_IsFalse(addl))
        other = other_member(c, props, cJSON_IsTrue(addl) ? p_value(c) : schema(c, addl));
    /* m[i][first]: members i.. given whether one was written already */
    gsym (*m)[2] = fault_malloc(((size_t)n + 1) * sizeof *m);
    gsym *kv = fault_malloc((size_t)n * sizeof *kv);
    bool *required = fault_calloc((size_t)n, sizeof *required);
    if (!m || !kv || !required) {
        free(m);
        free(kv);
        free(required);
        gb_fail(b, "out of memory");
        return -1;
    }
    int i = 0;
    for (const cJSON *p = props->child; p; p = p->next, i++) {
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (!strcmp(r->valuestring, p->string))
                required[i] = true;
        gsym sq[5] = {quoted_lit(c, p->string), ws, gb_byte(b, ':'), ws, schema(c, p)};
        kv[i] = gb_seq(b, sq, 5);
    }
    gsym sep[3] = {ws, gb_byte(b, ','), ws};
    gsym comma = gb_seq(b, sep, 3);
    if (other == NONE) {
        m[n][0] = m[n][1] = gb_empty(b);
    } else {
        /* after a member: (, OTHER)*; first: (OTHER (, OTHER)*)? */
        gsym next[2] = {comma, other};
        gsym more = gb_star(b, gb_seq(b, next, 2));
        m[n][0] = more;
        gsym first[2] = {other, more};
        m[n][1] = gb_opt(b, gb_seq(b, first, 2));
    }
    for (i = n - 1; i >= 0 && !b->failed; i--) {
        for (int first = 0; first < 2; first++) {
            gsym take[3];
            int k = 0;
            if (!first)
                take[k++] = comma;
            take[k++] = kv[i];
            take[k++] = m[i + 1][0];
            gsym t = gb_seq(b, take, k);
            if (required[i]) {
                m[i][first] = t;
            } else {
                gsym alts[2] = {t, m[i + 1][first]};
                m[i][first] = gb_or(b, alts, 2);
            }
        }
    }
    gsym sq[5] = {gb_byte(b, '{'), ws, m[0][1], ws, gb_byte(b, '}')};
    free(m);
    free(kv);
    free(required);
    return gb_seq(b, sq, 5);
}

static gsym s_array(jctx *c, const cJSON *s)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    long mn = 0, mx = -1;
    get_count(c, s, "minItems", &mn);
    get_count(c, s, "maxItems", &mx);
    if (mx >= 0 && mx < mn) {
        gb_fail(c->b, "maxItems is below minItems");
        return -1;
    }
    if (items && cJSON_IsArray(items)) {
        gb_fail(c->b, "\"items\" as an array (tuples) is not supported");
        return -1;
    }
    if (items && cJSON_IsFalse(items))
        mx = 0;
    if (mx == 0 && mn > 0) {
        gb_fail(c->b, "\"items\": false leaves no room for minItems");
        return -1;
    }
    if (mx == 0)
        return lits(c->b, "[]");
    gsym item = items && !cJSON_IsTrue(items) ? schema(c, items) : p_value(c);
    return p_list(c, '[', ']', item, mn, mx);
}

/* ---- the schema -------------------------------------------------------- */

static const char *const type_keywords[] = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                            "properties", "required", "additionalProperties", "items",
                                            "minItems", "maxItems", "minLength", "maxLength", "pattern",
                                            "format", "minimum", "maximum", "exclusiveMinimum",
                                            "exclusiveMaximum", NULL};

static gsym s_ref(jctx *c, const char *ref)
{
    gbuild *b = c->b;
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].path, ref))
            return c->refs[i].rule;
    const cJSON *t = NULL;
    if (!strcmp(ref, "#")) {
        t = c->root;
    } else if (!strncmp(ref, "#/$defs/", 8) || !strncmp(ref, "#/definitions/", 14)) {
        const char *name = strchr(ref + 2, '/') + 1;
        char key[16];
        snprintf(key, sizeof key, "%.*s", (int)(name - ref - 3), ref + 2);
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, key), name);
    }
    if (!t) {
        gb_fail(b, "$ref \"%.80s\" is not supported or not found (refs into #/$defs or #/definitions are)", ref);
        return -1;
    }
    jref *refs = fault_grow(c->refs, c->n_refs, &c->cap_refs, sizeof *refs, 8);
    if (!refs) {
        gb_fail(b, "out of memory");
        return -1;
    }
    c->refs = refs;
    int r = gb_rule_new(b);
    char *path = fault_strdup(ref);
    if (!path) {
        gb_fail(b, "out of memory");
        return -1;
    }
    c->refs[c->n_refs++] = (jref){path, r};
    gsym body = schema(c, t);
    gb_add_alt(b, r, &body, 1);
    return r;
}

static gsym s_typed(jctx *c, const cJSON *s, const char *type)
{
    if (!strcmp(type, "string"))
        return s_string(c, s);
    if (!strcmp(type, "integer"))
        return s_integer(c, s);
    if (!strcmp(type, "number"))
        return s_number(c, s);
    if (!strcmp(type, "boolean")) {
        gsym a[2] = {lits(c->b, "true"), lits(c->b, "false")};
        return gb_or(c->b, a, 2);
    }
    if (!strcmp(type, "null"))
        return lits(c->b, "null");
    if (!strcmp(type, "object"))
        return s_object(c, s);
    if (!strcmp(type, "array"))
        return s_array(c, s);
    gb_fail(c->b, "unknown type \"%.40s\"", type);
    return -1;
}

static gsym s_choice(jctx *c, const cJSON *list, const char *kw)
{
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) {
        gb_fail(c->b, "\"%s\" must be a non-empty array", kw);
        return -1;
    }
    if (cJSON_GetArraySize(list) > GRAMMAR_MAX_ALTS) {
        gb_fail(c->b, "\"%s\" has %d schemas; the limit is %d", kw, cJSON_GetArraySize(list), GRAMMAR_MAX_ALTS);
        return -1;
    }
    gvec alts = {0};
    for (const cJSON *e = list->child; e; e = e->next)
        if (gvec_push(&alts, schema(c, e)))
            gb_fail(c->b, "out of memory");
    gsym r = c->b->failed ? -1 : gb_or(c->b, alts.v, alts.n);
    free(alts.v);
    return r;
}

static gsym schema_body(jctx *c, const cJSON *s)
{
    gbuild *b = c->b;
    if (cJSON_IsTrue(s))
        return p_value(c);
    if (cJSON_IsFalse(s)) {
        gb_fail(b, "the schema false matches nothing");
        return -1;
    }
    if (!cJSON_IsObject(s)) {
        gb_fail(b, "a schema must be an object or a boolean");
        return -1;
    }
    for (const cJSON *k = s->child; k; k = k->next)
        if (!in_list(annotations, k->string) && !in_list(type_keywords, k->string)) {
            gb_fail(b, "unsupported JSON Schema keyword \"%.60s\"", k->string);
            return -1;
        }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) {
            gb_fail(b, "\"$ref\" must be a string");
            return -1;
        }
        return s_ref(c, ref->valuestring);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0) {
            gb_fail(b, "\"enum\" must be a non-empty array");
            return -1;
        }
        if (cJSON_GetArraySize(en) > GRAMMAR_MAX_ALTS) {
            gb_fail(b, "\"enum\" has %d values; the limit is %d", cJSON_GetArraySize(en), GRAMMAR_MAX_ALTS);
            return -1;
        }
        gvec alts = {0};
        for (const cJSON *e = en->child; e; e = e->next)
            gb_push(b, &alts, json_literal(c, e));
        gsym r = b->failed ? -1 : gb_or(b, alts.v, alts.n);
        free(alts.v);
        return r;
    }
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cn)
        return json_literal(c, cn);
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any)
        any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any)
        return s_choice(c, any, any->string);
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1) {
            gb_fail(b, "\"allOf\" is supported with one schema only");
            return -1;
        }
        return schema(c, all->child);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type))
        return s_typed(c, s, type->valuestring);
    if (cJSON_IsArray(type)) {
        gvec alts = {0};
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) {
                gb_fail(b, "\"type\" must name types");
                break;
            }
            gb_push(b, &alts, s_typed(c, s, t->valuestring));
        }
        gsym r = b->failed || alts.n == 0 ? -1 : gb_or(b, alts.v, alts.n);
        if (alts.n == 0)
            gb_fail(b, "\"type\" is an empty list");
        free(alts.v);
        return r;
    }
    if (type) {
        gb_fail(b, "\"type\" must be a string or an array");
        return -1;
    }
    /* no type: from the keywords */
    if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
        cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
        return s_object(c, s);
    if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
        cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
        return s_array(c, s);
    if (cJSON_GetObjectItemCaseSensitive(s, "pattern") || cJSON_GetObjectItemCaseSensitive(s, "format") ||
        cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
        return s_string(c, s);
    if (has_bounds(s))
        return s_number(c, s);
    return p_value(c);
}

static gsym schema(jctx *c, const cJSON *s)
{
    if (c->b->failed)
        return -1;
    if (++c->depth > JS_MAX_DEPTH) {
        gb_fail(c->b, "the schema is nested more than %d deep", JS_MAX_DEPTH);
        return -1;
    }
    gsym r = schema_body(c, s);
    c->depth--;
    return r;
}

static void jctx_init(jctx *c, gbuild *b, const cJSON *root, const grammar_opts *opts)
{
    memset(c, 0, sizeof *c);
    c->b = b;
    c->exact = opts && opts->exact;
    c->root = root;
    c->ws = c->ch = c->str = c->num = c->value = c->obj_any = c->arr_any = c->digit = c->digits1 = c->hex = NONE;
    c->key_rest = NONE;
}

static void jctx_deinit(jctx *c)
{
    for (int i = 0; i < c->n_refs; i++)
        free(c->refs[i].path);
    free(c->refs);
}

grammar *grammar_compile_json_schema(const char *json, size_t len, const grammar_opts *opts, char *err,
                                     size_t errlen)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        snprintf(err, errlen, "the schema is not valid JSON (at byte %td)", end ? end - json : (ptrdiff_t)0);
        return NULL;
    }
    gbuild b;
    jctx c;
    gb_init(&b);
    jctx_init(&c, &b, root, opts);
    gsym top = schema(&c, root);
    grammar *g = b.failed ? NULL : gb_finish(&b, top);
    if (!g)
        snprintf(err, errlen, "%s", b.err);
    jctx_deinit(&c);
    gb_deinit(&b);
    cJSON_Delete(root);
    return g;
}

/* One call of function fn (an OpenAI tools[] entry's "function"), as
 * Qwen's <tool_call> block or (llama) Llama 3.1's bare JSON object. */
static gsym tool_call(gbuild *b, const cJSON *fn, bool llama, const grammar_opts *opts)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const char *s = cJSON_IsString(name) ? name->valuestring : "";
    size_t n = strlen(s);
    if (n == 0 || n > 64 || strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != n) {
        gb_fail(b, "a function name must be 1 to 64 letters, digits, '_', '-' or '.'");
        return -1;
    }
    char head[128];
    snprintf(head, sizeof head, llama ? "{\"name\": \"%s\", \"parameters\": "
                                      : "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", s);
    jctx c;
    jctx_init(&c, b, params, opts);
    gsym args;
    if (params) {
        args = schema(&c, params);
    } else {
        p_value(&c);
        args = c.obj_any;
    }
    jctx_deinit(&c);
    gsym sq[3] = {lits(b, head), args, lits(b, llama ? "}" : "}\n</tool_call>")};
    return gb_seq(b, sq, 3);
}

/* Qwen's calls (or one of Llama 3.1's: llama). */
static grammar *compile_calls(const char *tools, size_t len, const char *name, bool parallel, bool llama,
                              const grammar_opts *opts, char *err, size_t errlen)
{
    cJSON *root = cJSON_ParseWithLengthOpts(tools, len, NULL, false);
    if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) == 0) {
        cJSON_Delete(root);
        snprintf(err, errlen, "tools must be a non-empty array");
        return NULL;
    }
    gbuild b;
    gb_init(&b);
    gvec calls = {0};
    const cJSON *t;
    cJSON_ArrayForEach(t, root)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *fname = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn)) {
            gb_fail(&b, "each tool must be {\"type\": \"function\", \"function\": {...}}");
            break;
        }
        if (name && (!cJSON_IsString(fname) || strcmp(fname->valuestring, name)))
            continue;
        if (gvec_push(&calls, tool_call(&b, fn, llama, opts)))
            gb_fail(&b, "out of memory");
    }
    if (!b.failed && calls.n == 0)
        gb_fail(&b, "tool_choice names the function \"%.64s\", which is not among the tools", name ? name : "");
    grammar *g = NULL;
    if (!b.failed) {
        gsym one = gb_or(&b, calls.v, calls.n);
        gsym root_sym = one;
        if (parallel && !llama) {
            gsym more[2] = {gb_byte(&b, '\n'), one};
            gsym sq[2] = {one, gb_star(&b, gb_seq(&b, more, 2))};
            root_sym = gb_seq(&b, sq, 2);
        }
        g = gb_finish(&b, root_sym);
    }
    if (!g)
        snprintf(err, errlen, "%s", b.err);
    free(calls.v);
    gb_deinit(&b);
    cJSON_Delete(root);
    return g;
}

grammar *grammar_compile_tool_calls(const char *tools, size_t len, const char *name, bool parallel,
                                    const grammar_opts *opts, char *err, size_t errlen)
{
    return compile_calls(tools, len, name, parallel, false, opts, err, errlen);
}

grammar *grammar_compile_llama_tool_call(const char *tools, size_t len, const char *name, const grammar_opts *opts,
                                         char *err, size_t errlen)
{
    return compile_calls(tools, len, name, false, true, opts, err, errlen);
}

/* Is spec's "format" Llama 3.1's? Anything else is Qwen's. */
static bool spec_is_llama(const cJSON *root)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
    return cJSON_IsString(f) && !strcmp(f->valuestring, "llama3.1");
}

const char *grammar_tool_trigger(const char *spec, size_t len)
{
    cJSON *root = cJSON_ParseWithLengthOpts(spec, len, NULL, false);
    bool llama = spec_is_llama(root);
    cJSON_Delete(root);
    return llama ? "{\"name\"" : "<tool_call>";
}

grammar *grammar_compile_tool_spec(const char *spec, size_t len, const grammar_opts *opts, char *err, size_t errlen)
{
    cJSON *root = cJSON_ParseWithLengthOpts(spec, len, NULL, false);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    grammar *g = NULL;
    char *text = tools ? cJSON_PrintUnformatted(tools) : NULL;
    if (!text)
        snprintf(err, errlen, "a tool-call constraint needs {\"tools\": [...]}");
    else
        g = compile_calls(text, strlen(text), cJSON_IsString(name) ? name->valuestring : NULL,
                          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "parallel")), spec_is_llama(root), opts,
                          err, errlen);
    free(text);
    cJSON_Delete(root);
    return g;
}

grammar *grammar_compile_json_object(const grammar_opts *opts, char *err, size_t errlen)
{
    gbuild b;
    jctx c;
    gb_init(&b);
    jctx_init(&c, &b, NULL, opts);
    p_value(&c);
    grammar *g = gb_finish(&b, c.obj_any);
    if (!g)
        snprintf(err, errlen, "%s", b.err);
    jctx_deinit(&c);
    gb_deinit(&b);
    return g;
}

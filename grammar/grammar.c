/* grammar.c - the grammar form, its builder, the vocabulary trie, and the
 * matcher that masks tokens.
 *
 * Owns: building and flattening grammars (grammar_impl.h), the pushdown
 * run over bytes, the token-mask cache, gram_vocab.
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

#define GEL_END INT32_MIN
#define NODE_EMPTY 0            /* the real bottom: popping it accepts */
#define NODE_UNKNOWN 1          /* a cache walk's bottom: popping it needs context */
#define GRAM_KEY_FRAMES 2       /* stack frames kept in a cache key */
#define GRAM_MAX_CONFIGS 4096   /* configurations in one state: more is an ambiguous grammar */
#define GRAM_MAX_DEPTH 4096     /* closure recursion */
#define GRAM_MAX_NODES (1 << 23)
#define GRAM_MAX_TOKEN_BYTES 1024
#define GRAM_MEMO 8             /* whole masks remembered per matcher, by state (direct-mapped) */

/* A compiled grammar. Immutable; owned by whoever compiled it (a matcher
 * once handed over). */
struct grammar {
    int32_t *el;                /* [n_el] >= 0: rule ref; GEL_END; else byte set -1 - i */
    int n_el;
    int32_t *rule_alt;          /* [n_rules + 1] first alternative of each rule */
    int32_t *alt_start;         /* [n_alts] first element of each alternative */
    uint64_t (*sets)[4];        /* [n_sets] */
    int n_rules, n_alts, n_sets;
    int root;
};

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

/* ---- finishing: checks and flattening ---------------------------------- */

static bool sym_nullable(const uint8_t *nullable, gsym s)
{
    return s >= 0 && nullable[s];
}

/* Left recursion (a rule reaching itself without consuming a byte) makes
 * the closure loop; find it with a DFS over "may start with" edges. */
static int check_left_recursion(gbuild *b, char *which, size_t cap)
{
    int n = b->n_rules, rc = 0;
    uint8_t *nullable = fault_calloc((size_t)n + 1, 1);
    uint8_t *color = fault_calloc((size_t)n + 1, 1);
    int32_t *stk_rule = fault_malloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *stk_alt = fault_malloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *stk_el = fault_malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!nullable || !color || !stk_rule || !stk_alt || !stk_el) {
        rc = -2;
        goto out;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < n; r++) {
            if (nullable[r])
                continue;
            for (int a = 0; a < b->rules[r].n_alts && !nullable[r]; a++) {
                const gvec *v = &b->rules[r].alts[a];
                int i = 0;
                while (i < v->n && sym_nullable(nullable, v->v[i]))
                    i++;
                if (i == v->n) {
                    nullable[r] = 1;
                    changed = true;
                }
            }
        }
    }
    for (int start = 0; start < n && rc == 0; start++) {
        if (color[start])
            continue;
        int sp = 0;
        stk_rule[0] = start;
        stk_alt[0] = 0;
        stk_el[0] = 0;
        color[start] = 1;
        while (sp >= 0 && rc == 0) {
            int r = stk_rule[sp];
            const gb_rule *R = &b->rules[r];
            if (stk_alt[sp] >= R->n_alts) {
                color[r] = 2;
                sp--;
                continue;
            }
            const gvec *v = &R->alts[stk_alt[sp]];
            int i = stk_el[sp];
            if (i >= v->n || (i > 0 && !sym_nullable(nullable, v->v[i - 1]))) {
                stk_alt[sp]++;
                stk_el[sp] = 0;
                continue;
            }
            stk_el[sp]++;
            gsym s = v->v[i];
            if (s < 0)
                continue;
            if (color[s] == 1) {
                snprintf(which, cap, "rule %d", s);
                rc = -1;
            } else if (color[s] == 0) {
                color[s] = 1;
                sp++;
                stk_rule[sp] = s;
                stk_alt[sp] = 0;
                stk_el[sp] = 0;
            }
        }
    }
out:
    free(nullable);
    free(color);
    free(stk_rule);
    free(stk_alt);
    free(stk_el);
    return rc;
}

grammar *gb_finish(gbuild *b, gsym root)
{
    grammar *g = NULL;
    if (b->failed)
        return NULL;
    /* the start rule: S -> root (a byte-set root needs a rule around it) */
    int start = gb_rule_new(b);
    gb_add_alt(b, start, &root, 1);
    if (b->failed)
        return NULL;
    char which[64];
    int lr = check_left_recursion(b, which, sizeof which);
    if (lr == -2) {
        gb_fail(b, "out of memory");
        return NULL;
    }
    if (lr) {
        gb_fail(b, "the grammar can loop without consuming input (%s)", which);
        return NULL;
    }
    g = fault_calloc(1, sizeof *g);
    if (!g)
        goto oom;
    int n_alts = 0;
    long n_el = 0;
    for (int r = 0; r < b->n_rules; r++) {
        n_alts += b->rules[r].n_alts;
        for (int a = 0; a < b->rules[r].n_alts; a++)
            n_el += b->rules[r].alts[a].n + 1;
    }
    g->el = fault_malloc((size_t)(n_el + 1) * sizeof *g->el);
    g->rule_alt = fault_malloc(((size_t)b->n_rules + 1) * sizeof *g->rule_alt);
    g->alt_start = fault_malloc(((size_t)n_alts + 1) * sizeof *g->alt_start);
    g->sets = fault_malloc(((size_t)b->n_sets + 1) * sizeof *g->sets);
    if (!g->el || !g->rule_alt || !g->alt_start || !g->sets)
        goto oom;
    int ia = 0, ie = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->rule_alt[r] = ia;
        for (int a = 0; a < b->rules[r].n_alts; a++) {
            const gvec *v = &b->rules[r].alts[a];
            g->alt_start[ia++] = ie;
            for (int i = 0; i < v->n; i++)
                g->el[ie++] = v->v[i];
            g->el[ie++] = GEL_END;
        }
    }
    g->rule_alt[b->n_rules] = ia;
    if (b->n_sets)
        memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets);
    g->n_el = ie;
    g->n_alts = ia;
    g->n_rules = b->n_rules;
    g->n_sets = b->n_sets;
    g->root = start;
    return g;
oom:
    grammar_free(g);
    gb_fail(b, "out of memory");
    return NULL;
}

void grammar_free(grammar *g)
{
    if (!g)
        return;
    free(g->el);
    free(g->rule_alt);
    free(g->alt_start);
    free(g->sets);
    free(g);
}

void grammar_size(const grammar *g, int *n_rules, int *n_elems)
{
    *n_rules = g ? g->n_rules : 0;
    *n_elems = g ? g->n_el : 0;
}

/* ====================================================================== */
/* Vocabulary                                                             */
/* ====================================================================== */

/* One trie node, in DFS pre-order: its subtree is [i, end); the tokens
 * spelled by it are tok_ids[tok_first, node[i + 1].tok_first), those of
 * its subtree tok_ids[tok_first, node[end].tok_first). */
typedef struct gtrie_node {
    int32_t end;
    int32_t tok_first;
    uint16_t depth;
    uint8_t byte;
} gtrie_node;

/* Token bytes and their trie. Immutable after gram_vocab_new; shared. */
struct gram_vocab {
    int n_vocab;
    char *bytes;                /* all text tokens' bytes */
    uint32_t *off;              /* [n_vocab + 1] token t is bytes[off[t], off[t + 1]) */
    uint8_t *kind;              /* [n_vocab] enum gram_tok_kind */
    int32_t *eog;               /* [n_eog] */
    int n_eog;
    gtrie_node *node;           /* [n_node + 1], node 0 the root, node[n_node] a sentinel */
    int n_node;
    int32_t *tok_ids;           /* [n_tok] text tokens in trie order */
    int n_tok;
    int max_depth;
};


static int cmp_tok(const void *pa, const void *pb, void *arg)
{
    const gram_vocab *v = arg;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
    int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], la < lb ? la : lb);
    if (c)
        return c;
    if (la != lb)
        return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int node_push(gram_vocab *v, int *cap, uint8_t byte, int depth)
{
    if (v->n_node + 1 >= *cap) {
        int nc = *cap * 2;
        void *p = fault_realloc(v->node, (size_t)nc * sizeof *v->node);
        if (!p)
            return -1;
        v->node = p;
        *cap = nc;
    }
    gtrie_node *n = &v->node[v->n_node];
    n->end = 0;
    n->tok_first = v->n_tok;
    n->depth = (uint16_t)depth;
    n->byte = byte;
    return v->n_node++;
}

/* Builds the trie from the text tokens sorted by their bytes: each token
 * shares its longest common prefix with the one before, so only the
 * nodes past that prefix are new, and a node's subtree ends when a later
 * token leaves its prefix. */
static int vocab_build_trie(gram_vocab *v, const int32_t *sorted, int n_sorted)
{
    int cap = 1024;
    int32_t path[GRAM_MAX_TOKEN_BYTES + 1];
    v->node = fault_malloc((size_t)cap * sizeof *v->node);
    if (!v->node)
        return -1;
    path[0] = node_push(v, &cap, 0, 0);
    int depth = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int k = 0; k < n_sorted; k++) {
        int32_t t = sorted[k];
        const char *s = v->bytes + v->off[t];
        uint32_t len = v->off[t + 1] - v->off[t];
        uint32_t l = 0;
        while (prev && l < len && l < prev_len && s[l] == prev[l])
            l++;
        for (; depth > (int)l; depth--)
            v->node[path[depth]].end = v->n_node;
        for (; depth < (int)len; depth++) {
            int id = node_push(v, &cap, (uint8_t)s[depth], depth + 1);
            if (id < 0)
                return -1;
            path[depth + 1] = id;
        }
        v->tok_ids[v->n_tok++] = t;
        prev = s;
        prev_len = len;
        if ((int)len > v->max_depth)
            v->max_depth = (int)len;
    }
    for (; depth >= 0; depth--)
        v->node[path[depth]].end = v->n_node;
    /* sentinel */
    if (node_push(v, &cap, 0, 0) < 0)
        return -1;
    v->n_node--;
    v->node[v->n_node].end = v->n_node;
    return 0;
}

gram_vocab *gram_vocab_new(int n_vocab, gram_piece_fn piece, void *ctx, char *err, size_t errlen)
{
    gram_vocab *v = NULL;
    int32_t *sorted = NULL;
    char buf[GRAM_MAX_TOKEN_BYTES];
    size_t cap_bytes = 1 << 20, n_bytes = 0;
    if (n_vocab <= 0 || !piece) {
        snprintf(err, errlen, "no vocabulary");
        return NULL;
    }
    v = fault_calloc(1, sizeof *v);
    if (!v)
        goto oom;
    v->n_vocab = n_vocab;
    v->off = fault_malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    v->kind = fault_malloc((size_t)n_vocab);
    v->bytes = fault_malloc(cap_bytes);
    v->eog = fault_malloc((size_t)n_vocab * sizeof *v->eog);
    v->tok_ids = fault_malloc((size_t)n_vocab * sizeof *v->tok_ids);
    sorted = fault_malloc((size_t)n_vocab * sizeof *sorted);
    if (!v->off || !v->kind || !v->bytes || !v->eog || !v->tok_ids || !sorted)
        goto oom;
    int n_sorted = 0;
    for (int32_t t = 0; t < n_vocab; t++) {
        int kind = GRAM_TOK_OTHER;
        int n = piece(ctx, t, buf, sizeof buf, &kind);
        v->off[t] = (uint32_t)n_bytes;
        if (kind == GRAM_TOK_EOG) {
            v->kind[t] = GRAM_TOK_EOG;
            v->eog[v->n_eog++] = t;
            continue;
        }
        /* empty, unreadable or over-long text tokens are never allowed */
        if (kind != GRAM_TOK_TEXT || n <= 0 || n > (int)sizeof buf) {
            v->kind[t] = GRAM_TOK_OTHER;
            continue;
        }
        if (n_bytes + (size_t)n > cap_bytes) {
            cap_bytes *= 2;
            char *p = fault_realloc(v->bytes, cap_bytes);
            if (!p)
                goto oom;
            v->bytes = p;
        }
        memcpy(v->bytes + n_bytes, buf, (size_t)n);
        n_bytes += (size_t)n;
        v->kind[t] = GRAM_TOK_TEXT;
        sorted[n_sorted++] = t;
    }
    v->off[n_vocab] = (uint32_t)n_bytes;
    /* off[t + 1] - off[t] is t's length only for text tokens: the others
     * added no bytes, so their length reads 0 */
    qsort_r(sorted, (size_t)n_sorted, sizeof *sorted, cmp_tok, v);
    if (vocab_build_trie(v, sorted, n_sorted))
        goto oom;
    free(sorted);
    return v;
oom:
    free(sorted);
    gram_vocab_free(v);
    snprintf(err, errlen, "out of memory building the vocabulary trie");
    return NULL;
}

void gram_vocab_free(gram_vocab *v)
{
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->kind);
    free(v->eog);
    free(v->node);
    free(v->tok_ids);
    free(v);
}

int gram_vocab_n_nodes(const gram_vocab *v)
{
    return v ? v->n_node : 0;
}

/* ====================================================================== */
/* Matcher                                                                */
/* ====================================================================== */

typedef struct gcfg {
    int32_t pos;                /* byte-set element to match next; -1: accepted */
    int32_t stk;                /* stack node */
} gcfg;

typedef struct gset {
    gcfg *c;
    int n, cap;
} gset;

typedef struct gnode {
    int32_t pos;                /* return position */
    int32_t parent;
} gnode;

/* A mask-cache key in a form that does not depend on one matcher's
 * stack nodes: the element, the return positions of the stack's top
 * frames (top first), and what lies below them. All int32, no padding, so
 * keys compare with memcmp. */
typedef struct gkey {
    int32_t pos;
    int32_t f[GRAM_KEY_FRAMES]; /* [frames] return positions; -1 past them */
    int32_t nfb;                /* frames * 2 + 1 when UNKNOWN is below them, + 0 for EMPTY */
} gkey;

/* One cache entry: the tokens a key accepts in any context, and those
 * that need the whole stack. Immutable once made; owned by the matcher
 * that made it or by a gram_shared (then freed only with it). */
typedef struct gentry {
    gkey key;
    uint64_t *bits;             /* [n_words] accepted, when many; else NULL */
    int32_t *acc;               /* [n_acc] accepted, when few */
    int n_acc;
    int32_t *unc;               /* [n_unc] uncertain */
    int n_unc;
    size_t bytes;               /* this struct and its arrays */
} gentry;

/* A matcher's own index of the entries it has used: its key (element,
 * local stack node) to the entry. */
typedef struct glocal {
    int32_t pos, stk;
    const gentry *e;
} glocal;

/* One grammar of a gram_cache and its shared entries. Owned by the cache
 * while listed, by its holders after that; fields under c->mu but g and
 * key (immutable). */
struct gram_shared {
    gram_cache *c;
    grammar *g;
    char *key;                  /* [n_key] the canonical source */
    size_t n_key;
    int refs;                   /* matchers and acquirers holding it */
    bool listed;                /* in c's list; else freed at its last release */
    gentry **tab;               /* [cap] entries by key, open addressing, NULL free */
    uint32_t cap;
    int n;                      /* entries */
    uint64_t bytes;             /* this struct, the key, the grammar and the entries */
    gram_shared *prev, *next;   /* c's list, most recently used first */
};

/* Owned by whoever made it (the scheduler), used by every thread. */
struct gram_cache {
    pthread_mutex_t mu;         /* guards everything below */
    const gram_vocab *v;
    int refs;                   /* 1 for the owner until gram_cache_free, + 1 per gram_shared alive */
    bool closing;               /* gram_cache_free was called */
    gram_shared *head, *tail;   /* listed grammars, most recently used first */
    gram_cache_stats st;
};

/* Owned by one request; one thread at a time. */
struct gram_matcher {
    grammar *g;
    bool owns_g;
    const gram_vocab *v;        /* NULL: bytes only */
    int n_words;                /* n_vocab / 64 rounded up */

    gnode *nodes;               /* [n_nodes] hash-consed stack nodes; 0 EMPTY, 1 UNKNOWN */
    int n_nodes, cap_nodes;
    int32_t *node_tab;          /* [node_tab_cap] open addressing, -1 free */
    uint32_t node_tab_cap;

    gram_shared *sh;            /* the cache the entries come from and go to; NULL: private */
    glocal *ent;                /* [n_ent] the entries used so far */
    int n_ent, cap_ent;
    int32_t *ent_tab;           /* [ent_tab_cap] indices into ent by (pos, stk) */
    uint32_t ent_tab_cap;
    gentry **own;               /* [n_own] entries this matcher made and keeps (not in a cache) */
    int n_own, cap_own;
    int n_walks;                /* trie walks made */

    gset cur;                   /* the state */
    gset scratch[2];
    int32_t *lvl;               /* [max_depth + 1] trie walk: the interned set at each depth */
    uint8_t *lvl_pop;
    int n_lvl;

    /* the walks' transition cache: configuration sets interned (sorted, in
     * dpool), and (set, byte) -> (set, popped) memoized, so a walk of the
     * trie costs a table lookup per node once its sets have been seen */
    gcfg *dpool;                /* [n_dpool] */
    long n_dpool, cap_dpool;
    int32_t (*dsets)[2];        /* [n_dsets] offset and count in dpool */
    int n_dsets, cap_dsets;
    int32_t *dset_tab;          /* [dset_tab_cap] set ids by content */
    uint32_t dset_tab_cap;
    uint64_t *dtr_key;          /* [dtr_cap] set * 256 + byte + 1; 0 free */
    int32_t *dtr_val;           /* [dtr_cap] next set * 2 + popped */
    uint32_t dtr_cap;
    int n_dtr;
    gvec acc, unc;              /* trie walk output */
    uint64_t *mask;             /* [n_words] gram_matcher_mask's bitset */
    /* the last states' whole masks (the uncertain tokens checked too): an
     * output inside a string or a digit run stays in one state for many
     * tokens, and its uncertain tokens need not be checked again */
    struct gmemo {
        gcfg *cfg;              /* [n_cfg] the state, NULL: empty slot */
        int n_cfg;
        uint32_t hash;
        int n;                  /* tokens allowed */
        uint64_t *words;        /* [n_words] */
    } memo[GRAM_MEMO];
    int n_memo_hits;
    int depth;                  /* closure recursion */
    bool broken;                /* a limit was hit or memory ran out: the grammar is unusable */
    bool at_limit;              /* broken by a limit (configurations, stack nodes, depth), not memory */
    char trigger[33];           /* lazy matching: "" when always active */
    char win[96];               /* the output's last bytes while waiting for the trigger */
    size_t n_win;
    bool waiting;               /* lazy and the trigger not seen yet */
    bool dead;                  /* the trigger came but what followed left the grammar: never constrain */
};

static uint32_t hash2(int32_t a, int32_t b)
{
    uint64_t x = (uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)b * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 29;
    return (uint32_t)(x * 0xBF58476D1CE4E5B9ull >> 32);
}

static int tab_grow(int32_t **tab, uint32_t *cap, uint32_t need)
{
    uint32_t nc = *cap ? *cap : 1024;
    while (nc < need * 2)
        nc *= 2;
    if (nc == *cap)
        return 0;
    int32_t *t = fault_malloc((size_t)nc * sizeof *t);
    if (!t)
        return -1;
    memset(t, 0xff, (size_t)nc * sizeof *t);
    free(*tab);
    *tab = t;
    *cap = nc;
    return 1;   /* rehash needed */
}

static void node_tab_put(gram_matcher *m, int32_t id)
{
    uint32_t mask = m->node_tab_cap - 1, h = hash2(m->nodes[id].pos, m->nodes[id].parent) & mask;
    while (m->node_tab[h] >= 0)
        h = (h + 1) & mask;
    m->node_tab[h] = id;
}

/* The stack node (pos, parent), made once. -1 (and m->broken) on limits. */
static int32_t node_intern(gram_matcher *m, int32_t pos, int32_t parent)
{
    uint32_t mask = m->node_tab_cap - 1, h = hash2(pos, parent) & mask;
    for (int32_t id; (id = m->node_tab[h]) >= 0; h = (h + 1) & mask)
        if (m->nodes[id].pos == pos && m->nodes[id].parent == parent)
            return id;
    if (m->n_nodes >= GRAM_MAX_NODES) {
        m->broken = m->at_limit = true;
        return -1;
    }
    if (m->n_nodes == m->cap_nodes) {
        int cap = m->cap_nodes * 2;
        gnode *p = fault_realloc(m->nodes, (size_t)cap * sizeof *p);
        if (!p) {
            m->broken = true;
            return -1;
        }
        m->nodes = p;
        m->cap_nodes = cap;
    }
    int32_t id = m->n_nodes++;
    m->nodes[id] = (gnode){pos, parent};
    if ((uint32_t)m->n_nodes * 2 > m->node_tab_cap) {
        int r = tab_grow(&m->node_tab, &m->node_tab_cap, (uint32_t)m->n_nodes);
        if (r < 0) {
            m->broken = true;
            return -1;
        }
        for (int32_t i = 0; i < m->n_nodes; i++)
            node_tab_put(m, i);
    } else {
        node_tab_put(m, id);
    }
    return id;
}

static int set_reserve(gset *s, int n)
{
    if (n <= s->cap)
        return 0;
    int cap = s->cap ? s->cap : 16;
    while (cap < n)
        cap *= 2;
    gcfg *p = fault_realloc(s->c, (size_t)cap * sizeof *p);
    if (!p)
        return -1;
    s->c = p;
    s->cap = cap;
    return 0;
}

static void set_add(gram_matcher *m, gset *s, int32_t pos, int32_t stk)
{
    for (int i = 0; i < s->n; i++)
        if (s->c[i].pos == pos && s->c[i].stk == stk)
            return;
    if (s->n >= GRAM_MAX_CONFIGS || set_reserve(s, s->n + 1)) {
        m->at_limit |= s->n >= GRAM_MAX_CONFIGS;
        m->broken = true;
        return;
    }
    s->c[s->n++] = (gcfg){pos, stk};
}

/* Adds to out every configuration reachable from element pos with stack
 * stk without consuming a byte; *popped is set when a path pops UNKNOWN. */
static void closure(gram_matcher *m, int32_t pos, int32_t stk, gset *out, bool *popped)
{
    const grammar *g = m->g;
    if (m->broken)
        return;
    if (++m->depth > GRAM_MAX_DEPTH) {
        m->broken = m->at_limit = true;
        m->depth--;
        return;
    }
    int32_t e = g->el[pos];
    if (e == GEL_END) {
        if (stk == NODE_EMPTY)
            set_add(m, out, -1, NODE_EMPTY);
        else if (stk == NODE_UNKNOWN)
            *popped = true;
        else
            closure(m, m->nodes[stk].pos, m->nodes[stk].parent, out, popped);
    } else if (e < 0) {
        set_add(m, out, pos, stk);
    } else {
        int32_t ret = g->el[pos + 1] == GEL_END ? stk : node_intern(m, pos + 1, stk);
        if (ret >= 0)
            for (int32_t a = g->rule_alt[e]; a < g->rule_alt[e + 1]; a++)
                closure(m, g->alt_start[a], ret, out, popped);
    }
    m->depth--;
}

static bool set_has_byte(const uint64_t set[4], uint8_t c)
{
    return (set[c >> 6] >> (c & 63)) & 1;
}

/* out = the configurations after consuming byte c from in. */
static void advance(gram_matcher *m, const gset *in, uint8_t c, gset *out, bool *popped)
{
    const grammar *g = m->g;
    out->n = 0;
    for (int i = 0; i < in->n; i++) {
        int32_t pos = in->c[i].pos;
        if (pos < 0)
            continue;
        if (set_has_byte(g->sets[-1 - g->el[pos]], c))
            closure(m, pos + 1, in->c[i].stk, out, popped);
    }
}

static gram_matcher *matcher_new(grammar *g, bool owns, const gram_vocab *v)
{
    gram_matcher *m = fault_calloc(1, sizeof *m);
    if (!m)
        goto fail;
    m->g = g;
    m->owns_g = owns;
    m->v = v;
    m->cap_nodes = 1024;
    m->nodes = fault_malloc((size_t)m->cap_nodes * sizeof *m->nodes);
    if (!m->nodes || tab_grow(&m->node_tab, &m->node_tab_cap, 1024) < 0)
        goto fail_m;
    m->nodes[0] = (gnode){-1, -1};
    m->nodes[1] = (gnode){-2, -2};
    m->n_nodes = 2;
    node_tab_put(m, 0);
    node_tab_put(m, 1);
    if (v) {
        m->n_words = (v->n_vocab + 63) / 64;
        m->n_lvl = v->max_depth + 1;
        m->lvl = fault_calloc((size_t)m->n_lvl, sizeof *m->lvl);
        m->lvl_pop = fault_calloc((size_t)m->n_lvl, 1);
        m->mask = fault_malloc((size_t)m->n_words * sizeof *m->mask);
        if (!m->lvl || !m->lvl_pop || !m->mask || tab_grow(&m->ent_tab, &m->ent_tab_cap, 64) < 0)
            goto fail_m;
    }
    bool popped = false;
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        closure(m, g->alt_start[a], NODE_EMPTY, &m->cur, &popped);
    if (m->broken)
        goto fail_m;
    return m;
fail_m:
    m->owns_g = false;
    gram_matcher_free(m);
fail:
    if (owns)
        grammar_free(g);
    return NULL;
}

gram_matcher *gram_matcher_new(grammar *g, const gram_vocab *v)
{
    if (!g)
        return NULL;
    return matcher_new(g, true, v);
}

static void gentry_free(gentry *e)
{
    if (!e)
        return;
    free(e->bits);
    free(e->acc);
    free(e->unc);
    free(e);
}

void gram_matcher_free(gram_matcher *m)
{
    if (!m)
        return;
    gram_shared_release(m->sh);
    if (m->owns_g)
        grammar_free(m->g);
    free(m->nodes);
    free(m->node_tab);
    for (int i = 0; i < m->n_own; i++)
        gentry_free(m->own[i]);
    free(m->own);
    free(m->ent);
    free(m->ent_tab);
    free(m->cur.c);
    free(m->scratch[0].c);
    free(m->scratch[1].c);
    free(m->lvl);
    free(m->lvl_pop);
    free(m->dpool);
    free(m->dsets);
    free(m->dset_tab);
    free(m->dtr_key);
    free(m->dtr_val);
    free(m->acc.v);
    free(m->unc.v);
    free(m->mask);
    for (int i = 0; i < GRAM_MEMO; i++) {
        free(m->memo[i].cfg);
        free(m->memo[i].words);
    }
    free(m);
}

/* Runs from m->cur over s[0..n); on success the state moves, else not. */
static int run_bytes(gram_matcher *m, const uint8_t *s, size_t n)
{
    gset *a = &m->scratch[0], *b = &m->scratch[1];
    if (set_reserve(a, m->cur.n)) {
        m->broken = true;       /* out of memory, not a token the grammar refuses */
        return -1;
    }
    memcpy(a->c, m->cur.c, (size_t)m->cur.n * sizeof *a->c);
    a->n = m->cur.n;
    bool popped = false;
    for (size_t i = 0; i < n && a->n > 0; i++) {
        advance(m, a, s[i], b, &popped);
        gset *t = a;
        a = b;
        b = t;
    }
    if (a->n == 0 || m->broken)
        return -1;
    gset t = m->cur;
    m->cur = *a;
    *a = t;
    return 0;
}

/* Could the state consume s[0..n)? (State unchanged.) */
static bool can_run(gram_matcher *m, const uint8_t *s, size_t n)
{
    gset *a = &m->scratch[0], *b = &m->scratch[1];
    bool popped = false;
    if (n == 0)
        return false;
    advance(m, &m->cur, s[0], a, &popped);
    for (size_t i = 1; i < n && a->n > 0; i++) {
        advance(m, a, s[i], b, &popped);
        gset *t = a;
        a = b;
        b = t;
    }
    return a->n > 0 && !m->broken;
}

int gram_matcher_set_trigger(gram_matcher *m, const char *trigger)
{
    size_t n = trigger ? strlen(trigger) : 0;
    if (!m || n == 0 || n >= sizeof m->trigger)
        return -1;
    memcpy(m->trigger, trigger, n + 1);
    m->waiting = true;
    m->n_win = 0;
    return 0;
}

bool gram_matcher_active(const gram_matcher *m)
{
    return m && !m->waiting && !m->dead;
}

/* Waiting for the trigger: look for it in the window plus s[0..n); when
 * it appears, run the grammar from its first byte. */
static void watch_trigger(gram_matcher *m, const char *s, size_t n)
{
    size_t t = strlen(m->trigger);
    while (n > 0 && m->waiting) {
        size_t take = sizeof m->win - m->n_win < n ? sizeof m->win - m->n_win : n;
        memcpy(m->win + m->n_win, s, take);
        m->n_win += take;
        s += take;
        n -= take;
        const char *at = memmem(m->win, m->n_win, m->trigger, t);
        if (at) {
            size_t off = (size_t)(at - m->win);
            /* the rest of this piece follows the trigger too */
            char *rest = fault_malloc(m->n_win - off + n);
            if (!rest) {
                /* out of memory: the request fails (the next mask says so);
                 * a call must never go on unconstrained */
                m->broken = true;
                m->waiting = false;
                return;
            }
            memcpy(rest, at, m->n_win - off);
            memcpy(rest + (m->n_win - off), s, n);
            m->waiting = false;
            m->dead = run_bytes(m, (const uint8_t *)rest, m->n_win - off + n) != 0;
            free(rest);
            return;
        }
        /* keep the last t - 1 bytes: a trigger may straddle pieces */
        size_t keep = t - 1 < m->n_win ? t - 1 : m->n_win;
        memmove(m->win, m->win + m->n_win - keep, keep);
        m->n_win = keep;
    }
}

int gram_matcher_accept_bytes(gram_matcher *m, const char *s, size_t n)
{
    if (!m || m->broken)
        return -1;
    if (m->waiting || m->dead) {
        watch_trigger(m, s, n);
        return 0;
    }
    return run_bytes(m, (const uint8_t *)s, n);
}

bool gram_matcher_can_accept_bytes(gram_matcher *m, const char *s, size_t n)
{
    return m && !m->broken && can_run(m, (const uint8_t *)s, n);
}

bool gram_matcher_accepting(const gram_matcher *m)
{
    if (!m)
        return false;
    for (int i = 0; i < m->cur.n; i++)
        if (m->cur.c[i].pos < 0)
            return true;
    return false;
}

bool gram_matcher_finished(const gram_matcher *m)
{
    return gram_matcher_active(m) && m->cur.n == 1 && m->cur.c[0].pos < 0;
}

int gram_matcher_accept_token(gram_matcher *m, int32_t tok)
{
    if (!m || !m->v || tok < 0 || tok >= m->v->n_vocab || m->broken)
        return -1;
    const gram_vocab *v = m->v;
    if (m->waiting || m->dead) {
        if (v->kind[tok] == GRAM_TOK_TEXT)
            watch_trigger(m, v->bytes + v->off[tok], v->off[tok + 1] - v->off[tok]);
        return 0;
    }
    if (v->kind[tok] == GRAM_TOK_EOG)
        return gram_matcher_accepting(m) ? 0 : -1;
    if (v->kind[tok] != GRAM_TOK_TEXT)
        return -1;
    return run_bytes(m, (const uint8_t *)v->bytes + v->off[tok], v->off[tok + 1] - v->off[tok]);
}

bool grammar_accepts(const grammar *g, const char *s, size_t n)
{
    if (!g)
        return false;
    gram_matcher *m = matcher_new((grammar *)g, false, NULL);
    bool ok = m && (n == 0 || run_bytes(m, (const uint8_t *)s, n) == 0) && gram_matcher_accepting(m);
    gram_matcher_free(m);
    return ok;
}

/* ---- the mask cache ---------------------------------------------------- */

static void ent_tab_put(gram_matcher *m, int32_t i)
{
    uint32_t mask = m->ent_tab_cap - 1, h = hash2(m->ent[i].pos, m->ent[i].stk) & mask;
    while (m->ent_tab[h] >= 0)
        h = (h + 1) & mask;
    m->ent_tab[h] = i;
}

#define GRAM_DFA_MAX_CONFIGS (1L << 20)     /* the transition cache (8 MiB of configurations) is cleared past this */

static void dfa_clear(gram_matcher *m)
{
    m->n_dpool = 0;
    m->n_dsets = 0;
    m->n_dtr = 0;
    if (m->dset_tab)
        memset(m->dset_tab, 0xff, (size_t)m->dset_tab_cap * sizeof *m->dset_tab);
    if (m->dtr_key)
        memset(m->dtr_key, 0, (size_t)m->dtr_cap * sizeof *m->dtr_key);
}

static uint32_t set_hash(const gcfg *c, int n)
{
    uint32_t h = 0x811C9DC5u ^ (uint32_t)n;
    for (int i = 0; i < n; i++)
        h = (h ^ hash2(c[i].pos, c[i].stk)) * 0x01000193u;
    return h;
}

static void dset_tab_put(gram_matcher *m, int32_t id)
{
    uint32_t mask = m->dset_tab_cap - 1;
    uint32_t h = set_hash(m->dpool + m->dsets[id][0], m->dsets[id][1]) & mask;
    while (m->dset_tab[h] >= 0)
        h = (h + 1) & mask;
    m->dset_tab[h] = id;
}

/* The id of the set s (sorted here), stored once. -1 on limits. */
static int32_t dset_intern(gram_matcher *m, gset *s)
{
    for (int i = 1; i < s->n; i++) {         /* insertion sort by (pos, stk) */
        gcfg x = s->c[i];
        int j = i;
        while (j > 0 && (s->c[j - 1].pos > x.pos || (s->c[j - 1].pos == x.pos && s->c[j - 1].stk > x.stk))) {
            s->c[j] = s->c[j - 1];
            j--;
        }
        s->c[j] = x;
    }
    uint32_t mask = m->dset_tab_cap - 1, h = set_hash(s->c, s->n) & mask;
    for (int32_t id; (id = m->dset_tab[h]) >= 0; h = (h + 1) & mask)
        if (m->dsets[id][1] == s->n &&
            (s->n == 0 || !memcmp(m->dpool + m->dsets[id][0], s->c, (size_t)s->n * sizeof *s->c)))
            return id;
    if (m->n_dpool + s->n > m->cap_dpool) {
        long cap = m->cap_dpool ? 2 * m->cap_dpool : 4096;
        while (cap < m->n_dpool + s->n)
            cap *= 2;
        gcfg *p = fault_realloc(m->dpool, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        m->dpool = p;
        m->cap_dpool = cap;
    }
    void *dsets = fault_grow(m->dsets, m->n_dsets, &m->cap_dsets, sizeof *m->dsets, 1024);
    if (!dsets)
        return -1;
    m->dsets = dsets;
    int32_t id = m->n_dsets++;
    m->dsets[id][0] = (int32_t)m->n_dpool;
    m->dsets[id][1] = s->n;
    if (s->n)
        memcpy(m->dpool + m->n_dpool, s->c, (size_t)s->n * sizeof *s->c);
    m->n_dpool += s->n;
    if ((uint32_t)m->n_dsets * 2 > m->dset_tab_cap) {
        if (tab_grow(&m->dset_tab, &m->dset_tab_cap, (uint32_t)m->n_dsets) < 0)
            return -1;
        for (int32_t k = 0; k < m->n_dsets; k++)
            dset_tab_put(m, k);
    } else {
        dset_tab_put(m, id);
    }
    return id;
}

static void dtr_put(gram_matcher *m, uint64_t key, int32_t val)
{
    uint32_t mask = m->dtr_cap - 1, h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    while (m->dtr_key[h])
        h = (h + 1) & mask;
    m->dtr_key[h] = key;
    m->dtr_val[h] = val;
}

/* The set after byte c from set id, and whether a path popped UNKNOWN:
 * (next << 1) | popped, or -1 on limits. */
static int32_t dfa_step(gram_matcher *m, int32_t id, uint8_t c)
{
    uint64_t key = (uint64_t)id * 256 + c + 1;
    uint32_t mask = m->dtr_cap - 1, h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    for (; m->dtr_key[h]; h = (h + 1) & mask)
        if (m->dtr_key[h] == key)
            return m->dtr_val[h];
    gset from = {m->dpool + m->dsets[id][0], m->dsets[id][1], m->dsets[id][1]};
    bool popped = false;
    advance(m, &from, c, &m->scratch[0], &popped);
    int32_t next = m->broken ? -1 : dset_intern(m, &m->scratch[0]);
    if (next < 0)
        return -1;
    if ((uint32_t)(m->n_dtr + 1) * 2 > m->dtr_cap) {
        uint32_t old_cap = m->dtr_cap, cap = old_cap ? 2 * old_cap : 4096;
        uint64_t *ok = m->dtr_key;
        int32_t *ov = m->dtr_val;
        m->dtr_key = fault_calloc(cap, sizeof *m->dtr_key);
        m->dtr_val = fault_malloc((size_t)cap * sizeof *m->dtr_val);
        if (!m->dtr_key || !m->dtr_val) {
            free(m->dtr_key);
            free(m->dtr_val);
            m->dtr_key = ok;
            m->dtr_val = ov;
            return -1;
        }
        m->dtr_cap = cap;
        for (uint32_t k = 0; k < old_cap; k++)
            if (ok[k])
                dtr_put(m, ok[k], ov[k]);
        free(ok);
        free(ov);
    }
    int32_t val = next * 2 + (popped ? 1 : 0);
    dtr_put(m, key, val);
    m->n_dtr++;
    return val;
}

/* Walks the trie from key (pos, stk) and sorts the tokens into
 * m->acc / m->unc. */
static void walk_trie(gram_matcher *m, int32_t pos, int32_t stk)
{
    const gram_vocab *v = m->v;
    m->acc.n = 0;
    m->unc.n = 0;
    if (m->n_dpool > GRAM_DFA_MAX_CONFIGS)
        dfa_clear(m);
    if (!m->dtr_key) {
        m->dtr_cap = 4096;
        m->dtr_key = fault_calloc(m->dtr_cap, sizeof *m->dtr_key);
        m->dtr_val = fault_malloc((size_t)m->dtr_cap * sizeof *m->dtr_val);
    }
    if (!m->dtr_key || !m->dtr_val || (!m->dset_tab && tab_grow(&m->dset_tab, &m->dset_tab_cap, 1024) < 0)) {
        m->broken = true;
        return;
    }
    gset *l0 = &m->scratch[1];
    l0->n = 0;
    set_add(m, l0, pos, stk);
    m->lvl[0] = dset_intern(m, l0);
    m->lvl_pop[0] = 0;
    bool oom = m->lvl[0] < 0;
    int i = 1;
    while (i < v->n_node && !m->broken && !oom) {
        const gtrie_node *nd = &v->node[i];
        int d = nd->depth;
        bool before = m->lvl_pop[d - 1];
        int32_t step = dfa_step(m, m->lvl[d - 1], nd->byte);
        if (step < 0) {
            oom = true;
            break;
        }
        int32_t next = step >> 1;
        bool popped = step & 1, alive = m->dsets[next][1] > 0;
        int32_t own_end = v->node[i + 1].tok_first;
        if (alive || popped) {
            for (int32_t k = nd->tok_first; k < own_end; k++)
                oom |= gvec_push(&m->acc, v->tok_ids[k]) != 0;
        } else if (before) {
            for (int32_t k = nd->tok_first; k < own_end; k++)
                oom |= gvec_push(&m->unc, v->tok_ids[k]) != 0;
        }
        if (!alive) {
            if (before || popped)
                for (int32_t k = own_end; k < v->node[nd->end].tok_first; k++)
                    oom |= gvec_push(&m->unc, v->tok_ids[k]) != 0;
            i = nd->end;
            continue;
        }
        m->lvl[d] = next;
        m->lvl_pop[d] = before || popped;
        i++;
    }
    if (oom)
        m->broken = true;
}

/* An entry for key from the walk's output (m->acc, m->unc); NULL when
 * out of memory. */
static gentry *entry_make(gram_matcher *m, const gkey *key)
{
    gentry *e = fault_calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->key = *key;
    e->bytes = sizeof *e;
    if (m->acc.n > m->v->n_vocab / 32) {
        e->bits = fault_calloc((size_t)m->n_words, sizeof *e->bits);
        if (!e->bits)
            goto oom;
        for (int k = 0; k < m->acc.n; k++)
            e->bits[m->acc.v[k] >> 6] |= 1ull << (m->acc.v[k] & 63);
        e->bytes += (size_t)m->n_words * sizeof *e->bits;
    } else if (m->acc.n > 0) {
        e->acc = fault_malloc((size_t)m->acc.n * sizeof *e->acc);
        if (!e->acc)
            goto oom;
        memcpy(e->acc, m->acc.v, (size_t)m->acc.n * sizeof *e->acc);
        e->n_acc = m->acc.n;
        e->bytes += (size_t)e->n_acc * sizeof *e->acc;
    }
    if (m->unc.n > 0) {
        e->unc = fault_malloc((size_t)m->unc.n * sizeof *e->unc);
        if (!e->unc)
            goto oom;
        memcpy(e->unc, m->unc.v, (size_t)m->unc.n * sizeof *e->unc);
        e->n_unc = m->unc.n;
        e->bytes += (size_t)e->n_unc * sizeof *e->unc;
    }
    return e;
oom:
    gentry_free(e);
    return NULL;
}

/* The canonical key of (pos, ks), ks a stack node key_stack made. */
static void key_canon(const gram_matcher *m, int32_t pos, int32_t ks, gkey *k)
{
    int nf = 0;
    k->pos = pos;
    for (int i = 0; i < GRAM_KEY_FRAMES; i++)
        k->f[i] = -1;
    while (nf < GRAM_KEY_FRAMES && ks > NODE_UNKNOWN) {
        k->f[nf++] = m->nodes[ks].pos;
        ks = m->nodes[ks].parent;
    }
    k->nfb = nf * 2 + (ks == NODE_UNKNOWN ? 1 : 0);
}

static uint32_t gkey_hash(const gkey *k)
{
    uint32_t h = hash2(k->pos, k->nfb);
    for (int i = 0; i < GRAM_KEY_FRAMES; i++)
        h = hash2((int32_t)h, k->f[i]);
    return h;
}

/* sh's entry of key k, or NULL. Caller holds sh->c->mu. */
static gentry *shared_find(const gram_shared *sh, const gkey *k)
{
    if (!sh->cap)
        return NULL;
    uint32_t mask = sh->cap - 1;
    for (uint32_t h = gkey_hash(k) & mask; sh->tab[h]; h = (h + 1) & mask)
        if (!memcmp(&sh->tab[h]->key, k, sizeof *k))
            return sh->tab[h];
    return NULL;
}

static void shared_put(gentry **tab, uint32_t cap, gentry *e)
{
    uint32_t mask = cap - 1, h = gkey_hash(&e->key) & mask;
    while (tab[h])
        h = (h + 1) & mask;
    tab[h] = e;
}

/* Adds e (not there yet) to sh's table. 0, or -1 out of memory. Caller
 * holds sh->c->mu. */
static int shared_insert(gram_shared *sh, gentry *e)
{
    if ((uint32_t)(sh->n + 1) * 2 > sh->cap) {
        uint32_t cap = sh->cap ? 2 * sh->cap : 64;
        gentry **t = fault_calloc(cap, sizeof *t);
        if (!t)
            return -1;
        for (uint32_t i = 0; i < sh->cap; i++)
            if (sh->tab[i])
                shared_put(t, cap, sh->tab[i]);
        sh->bytes += (uint64_t)(cap - sh->cap) * sizeof *t;
        sh->c->st.bytes += (uint64_t)(cap - sh->cap) * sizeof *t;
        free(sh->tab);
        sh->tab = t;
        sh->cap = cap;
    }
    shared_put(sh->tab, sh->cap, e);
    sh->n++;
    sh->bytes += e->bytes;
    sh->c->st.bytes += e->bytes;
    sh->c->st.entries++;
    return 0;
}

static bool gcache_make_room(gram_cache *c, uint64_t need, gram_shared **doomed);

/* The bytes inserting e into sh adds (its table may double). */
static uint64_t shared_need(const gram_shared *sh, const gentry *e)
{
    uint64_t grow = (uint32_t)(sh->n + 1) * 2 > sh->cap ? (uint64_t)(sh->cap ? sh->cap : 64) * sizeof(gentry *) : 0;
    return e->bytes + grow;
}

/* Records e under the matcher's key (pos, stk). -1 out of memory. */
static int local_put(gram_matcher *m, int32_t pos, int32_t stk, const gentry *e)
{
    glocal *p = fault_grow(m->ent, m->n_ent, &m->cap_ent, sizeof *p, 16);
    if (!p)
        return -1;
    m->ent = p;
    int id = m->n_ent++;
    m->ent[id] = (glocal){pos, stk, e};
    if ((uint32_t)m->n_ent * 2 > m->ent_tab_cap) {
        int r = tab_grow(&m->ent_tab, &m->ent_tab_cap, (uint32_t)m->n_ent);
        if (r < 0) {
            m->n_ent--;
            return -1;
        }
        for (int k = 0; k < m->n_ent; k++)
            ent_tab_put(m, k);
    } else {
        ent_tab_put(m, id);
    }
    return 0;
}

static void shared_free_list(gram_shared *doomed);

/* The cache entry of key (pos, stk), from the matcher's index, else from
 * its gram_shared, else walking the trie (and offering the result to the
 * gram_shared). NULL on limits (m->broken). */
static const gentry *entry_get(gram_matcher *m, int32_t pos, int32_t stk)
{
    uint32_t mask = m->ent_tab_cap - 1, h = hash2(pos, stk) & mask;
    for (int32_t id; (id = m->ent_tab[h]) >= 0; h = (h + 1) & mask)
        if (m->ent[id].pos == pos && m->ent[id].stk == stk)
            return m->ent[id].e;
    gkey k;
    key_canon(m, pos, stk, &k);
    gram_cache *c = m->sh ? m->sh->c : NULL;
    const gentry *found = NULL;
    if (c) {
        pthread_mutex_lock(&c->mu);
        found = shared_find(m->sh, &k);
        if (found)
            c->st.hits++;
        pthread_mutex_unlock(&c->mu);
    }
    if (found) {
        if (local_put(m, pos, stk, found))
            goto oom;
        return found;
    }
    walk_trie(m, pos, stk);
    if (m->broken)
        return NULL;
    m->n_walks++;
    gentry *e = entry_make(m, &k);
    if (!e)
        goto oom;
    bool kept = false;
    if (c) {
        gram_shared *doomed = NULL;
        pthread_mutex_lock(&c->mu);
        c->st.walks++;
        if (m->sh->listed && !c->closing) {
            if (gcache_make_room(c, shared_need(m->sh, e), &doomed) && shared_insert(m->sh, e) == 0)
                kept = true;
            else
                c->st.not_kept++;
        }
        pthread_mutex_unlock(&c->mu);
        shared_free_list(doomed);
    }
    if (!kept) {
        gentry **p = fault_grow(m->own, m->n_own, &m->cap_own, sizeof *p, 16);
        if (!p) {
            gentry_free(e);
            goto oom;
        }
        m->own = p;
        m->own[m->n_own++] = e;
    }
    if (local_put(m, pos, stk, e))
        goto oom;
    return e;
oom:
    m->broken = true;
    return NULL;
}

/* The key of a configuration: its stack cut to GRAM_KEY_FRAMES frames
 * over UNKNOWN (kept whole when it is that short). */
static int32_t key_stack(gram_matcher *m, int32_t stk)
{
    int32_t f[GRAM_KEY_FRAMES];
    int k = 0;
    while (k < GRAM_KEY_FRAMES && stk > NODE_UNKNOWN) {
        f[k++] = m->nodes[stk].pos;
        stk = m->nodes[stk].parent;
    }
    int32_t t = stk == NODE_EMPTY ? NODE_EMPTY : NODE_UNKNOWN;
    while (k > 0 && t >= 0)
        t = node_intern(m, f[--k], t);
    return t;
}

int gram_matcher_fill_mask(gram_matcher *m, uint64_t *words)
{
    if (!m || !m->v || m->broken)
        return -1;
    const gram_vocab *v = m->v;
    if (m->waiting || m->dead) {    /* not constraining (yet): every token */
        memset(words, 0xff, (size_t)m->n_words * sizeof *words);
        if (v->n_vocab % 64)
            words[m->n_words - 1] = (1ull << (v->n_vocab % 64)) - 1;
        return v->n_vocab;
    }
    uint32_t state_hash = set_hash(m->cur.c, m->cur.n);
    struct gmemo *mo = &m->memo[state_hash % GRAM_MEMO];
    if (mo->cfg && mo->hash == state_hash && mo->n_cfg == m->cur.n &&
        !memcmp(mo->cfg, m->cur.c, (size_t)m->cur.n * sizeof *mo->cfg)) {
        memcpy(words, mo->words, (size_t)m->n_words * sizeof *words);
        m->n_memo_hits++;
        return mo->n;
    }
    memset(words, 0, (size_t)m->n_words * sizeof *words);
    bool accept = false;
    int n_cfg = m->cur.n;
    for (int i = 0; i < n_cfg; i++) {
        gcfg c = m->cur.c[i];
        if (c.pos < 0) {
            accept = true;
            continue;
        }
        int32_t ks = key_stack(m, c.stk);
        const gentry *e = ks < 0 ? NULL : entry_get(m, c.pos, ks);
        if (!e)
            return -1;
        if (e->bits) {
            for (int w = 0; w < m->n_words; w++)
                words[w] |= e->bits[w];
        } else {
            for (int k = 0; k < e->n_acc; k++)
                words[e->acc[k] >> 6] |= 1ull << (e->acc[k] & 63);
        }
    }
    for (int i = 0; i < n_cfg; i++) {
        gcfg c = m->cur.c[i];
        if (c.pos < 0)
            continue;
        const gentry *e = entry_get(m, c.pos, key_stack(m, c.stk));
        if (!e)
            return -1;
        for (int k = 0; k < e->n_unc; k++) {
            int32_t t = e->unc[k];
            if ((words[t >> 6] >> (t & 63)) & 1)
                continue;
            if (can_run(m, (const uint8_t *)v->bytes + v->off[t], v->off[t + 1] - v->off[t]))
                words[t >> 6] |= 1ull << (t & 63);
        }
    }
    if (m->broken)
        return -1;
    if (accept)
        for (int k = 0; k < v->n_eog; k++)
            words[v->eog[k] >> 6] |= 1ull << (v->eog[k] & 63);
    int n = 0;
    for (int w = 0; w < m->n_words; w++)
        n += __builtin_popcountll(words[w]);
    /* remember it (a slot that cannot be allocated stays empty) */
    if (!mo->words)
        mo->words = fault_malloc((size_t)m->n_words * sizeof *mo->words);
    gcfg *cfg = mo->words ? fault_realloc(mo->cfg, (size_t)(n_cfg ? n_cfg : 1) * sizeof *cfg) : NULL;
    if (cfg) {
        memcpy(cfg, m->cur.c, (size_t)n_cfg * sizeof *cfg);
        memcpy(mo->words, words, (size_t)m->n_words * sizeof *words);
        mo->cfg = cfg;
        mo->n_cfg = n_cfg;
        mo->hash = state_hash;
        mo->n = n;
    }
    return n;
}

int gram_matcher_mask(gram_matcher *m, float *logits)
{
    if (!m || !m->v)
        return -1;
    if (m->waiting || m->dead)
        return m->v->n_vocab;       /* not constraining (yet) */
    uint64_t *words = m->mask;
    int n = gram_matcher_fill_mask(m, words);
    if (n < 0)
        return n;
    /* a word at a time: most words are all allowed or all banned */
    const int n_vocab = m->v->n_vocab;
    for (int w = 0; w < m->n_words; w++) {
        uint64_t ban = ~words[w];
        int base = w * 64, end = base + 64 < n_vocab ? base + 64 : n_vocab;
        if (!ban)
            continue;
        if (ban == ~0ull) {
            for (int t = base; t < end; t++)
                logits[t] = -INFINITY;
            continue;
        }
        for (; ban; ban &= ban - 1) {
            int t = base + __builtin_ctzll(ban);
            if (t < end)
                logits[t] = -INFINITY;
        }
    }
    return n;
}

int gram_matcher_cache_entries(const gram_matcher *m)
{
    return m ? m->n_ent : 0;
}

bool gram_matcher_out_of_memory(const gram_matcher *m)
{
    return m && m->broken && !m->at_limit;
}

int gram_matcher_walks(const gram_matcher *m)
{
    return m ? m->n_walks : 0;
}

/* ====================================================================== */
/* Sharing between requests                                               */
/* ====================================================================== */

static uint64_t grammar_bytes(const grammar *g)
{
    return sizeof *g + ((uint64_t)g->n_el + 1 + (uint64_t)g->n_rules + 1 + (uint64_t)g->n_alts + 1) * sizeof(int32_t) +
           ((uint64_t)g->n_sets + 1) * sizeof *g->sets;
}

/* Frees sh and what it holds (no lock: nobody else can reach it). */
static void shared_free(gram_shared *sh)
{
    for (uint32_t i = 0; i < sh->cap; i++)
        gentry_free(sh->tab[i]);
    free(sh->tab);
    grammar_free(sh->g);
    free(sh->key);
    free(sh);
}

static void shared_free_list(gram_shared *doomed)
{
    while (doomed) {
        gram_shared *next = doomed->next;
        shared_free(doomed);
        doomed = next;
    }
}

/* Caller holds c->mu. */
static void gcache_unlink(gram_cache *c, gram_shared *sh)
{
    if (sh->prev)
        sh->prev->next = sh->next;
    else
        c->head = sh->next;
    if (sh->next)
        sh->next->prev = sh->prev;
    else
        c->tail = sh->prev;
    sh->prev = sh->next = NULL;
}

/* Caller holds c->mu. */
static void gcache_push_front(gram_cache *c, gram_shared *sh)
{
    sh->prev = NULL;
    sh->next = c->head;
    if (c->head)
        c->head->prev = sh;
    else
        c->tail = sh;
    c->head = sh;
}

/* Caller holds c->mu: takes listed sh out of the cache's accounts. */
static void gcache_unlist(gram_cache *c, gram_shared *sh)
{
    gcache_unlink(c, sh);
    sh->listed = false;
    c->st.bytes -= sh->bytes;
    c->st.grammars--;
    c->st.entries -= sh->n;
}

/* Evicts grammars nobody holds, least recently used first, until need
 * more bytes fit; the evicted go onto *doomed (freed after the lock).
 * Whether they fit. Caller holds c->mu. */
static bool gcache_make_room(gram_cache *c, uint64_t need, gram_shared **doomed)
{
    for (gram_shared *sh = c->tail; sh && c->st.bytes + need > c->st.max_bytes;) {
        gram_shared *prev = sh->prev;
        if (sh->refs == 0) {
            gcache_unlist(c, sh);
            c->st.evictions++;
            c->refs--;
            sh->next = *doomed;
            *doomed = sh;
        }
        sh = prev;
    }
    return c->st.bytes + need <= c->st.max_bytes;
}

gram_cache *gram_cache_new(const gram_vocab *v, size_t max_bytes, char *err, size_t errlen)
{
    gram_cache *c = v ? fault_calloc(1, sizeof *c) : NULL;
    if (!c) {
        snprintf(err, errlen, v ? "out of memory" : "no vocabulary");
        return NULL;
    }
    if (pthread_mutex_init(&c->mu, NULL)) {
        free(c);
        snprintf(err, errlen, "cannot make a mutex");
        return NULL;
    }
    c->v = v;
    c->refs = 1;
    c->st.max_bytes = max_bytes;
    return c;
}

static void gcache_destroy(gram_cache *c)
{
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void gram_cache_free(gram_cache *c)
{
    if (!c)
        return;
    gram_shared *doomed = NULL;
    pthread_mutex_lock(&c->mu);
    c->closing = true;
    while (c->head) {
        gram_shared *sh = c->head;
        gcache_unlist(c, sh);
        if (sh->refs == 0) {
            c->refs--;
            sh->next = doomed;
            doomed = sh;
        }
    }
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    shared_free_list(doomed);
    if (last)
        gcache_destroy(c);
}

void gram_cache_get_stats(gram_cache *c, gram_cache_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    pthread_mutex_unlock(&c->mu);
}

/* The listed grammar of key[0..n), or NULL. Caller holds c->mu. */
static gram_shared *gcache_find(gram_cache *c, const char *key, size_t n)
{
    for (gram_shared *sh = c->head; sh; sh = sh->next)
        if (sh->n_key == n && !memcmp(sh->key, key, n))
            return sh;
    return NULL;
}

/* Caller holds c->mu: sh is in use again. */
static void gcache_touch(gram_cache *c, gram_shared *sh)
{
    sh->refs++;
    gcache_unlink(c, sh);
    gcache_push_front(c, sh);
}

gram_shared *gram_cache_acquire(gram_cache *c, const char *key, size_t n, gram_compile_fn compile, void *ctx,
                                char *err, size_t errlen)
{
    gram_shared *sh = NULL, *doomed = NULL;
    pthread_mutex_lock(&c->mu);
    if ((sh = gcache_find(c, key, n))) {
        c->st.grammar_hits++;
        gcache_touch(c, sh);
    } else {
        c->st.grammar_misses++;
    }
    pthread_mutex_unlock(&c->mu);
    if (sh)
        return sh;
    /* compile outside the lock: a slow schema stalls only its submitter */
    grammar *g = compile(ctx, err, errlen);
    if (!g)
        return NULL;
    sh = fault_calloc(1, sizeof *sh);
    char *k = fault_malloc(n ? n : 1);
    if (!sh || !k) {
        free(sh);
        free(k);
        grammar_free(g);
        snprintf(err, errlen, "out of memory while compiling the constraint");
        return NULL;
    }
    memcpy(k, key, n);
    sh->c = c;
    sh->g = g;
    sh->key = k;
    sh->n_key = n;
    sh->refs = 1;
    sh->bytes = sizeof *sh + n + grammar_bytes(g);
    pthread_mutex_lock(&c->mu);
    gram_shared *other = gcache_find(c, key, n);     /* compiled meanwhile by another thread */
    if (other) {
        gcache_touch(c, other);
    } else {
        c->refs++;
        if (!c->closing && c->st.max_bytes > 0 && gcache_make_room(c, sh->bytes, &doomed)) {
            sh->listed = true;
            gcache_push_front(c, sh);
            c->st.bytes += sh->bytes;
            c->st.grammars++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    shared_free_list(doomed);
    if (other) {
        shared_free(sh);
        return other;
    }
    return sh;
}

void gram_shared_release(gram_shared *sh)
{
    if (!sh)
        return;
    gram_cache *c = sh->c;
    pthread_mutex_lock(&c->mu);
    bool gone = --sh->refs == 0 && !sh->listed;
    bool last = gone && --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (gone)
        shared_free(sh);
    if (last)
        gcache_destroy(c);
}

gram_matcher *gram_matcher_new_shared(gram_shared *sh)
{
    if (!sh)
        return NULL;
    gram_matcher *m = matcher_new(sh->g, false, sh->c->v);
    if (!m) {
        gram_shared_release(sh);
        return NULL;
    }
    m->sh = sh;
    return m;
}

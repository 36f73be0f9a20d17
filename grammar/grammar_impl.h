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

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

typedef int32_t gsym;

/* Most symbols a grammar may hold (rules' elements summed): bounds memory
 * and compile time for hostile schemas (maxLength 10^9 and friends). */
#define GRAMMAR_MAX_ELEMS (1 << 20)
/* Most alternatives of one choice: a GBNF rule or group, a regex
 * alternation, a JSON Schema enum, anyOf or oneOf. Checked before the
 * choice is built: every alternative is a parser configuration of the
 * state that enters it, and GRAM_MAX_CONFIGS bounds those. */
#define GRAMMAR_MAX_ALTS 2048
/* Most copies of one part that nested bounded repetitions may ask for
 * (the product of their bounds: ((x{0,100}){0,100}){0,100} asks for
 * 10^6), checked before the repetition is built. */
#define GRAMMAR_MAX_NESTED_REPEAT 10000

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

/* ---- shared by grammar.c's pieces (grammar_finish.c, grammar_vocab.c, grammar_match.c, grammar_mask.c, grammar_share.c) ---- */

#define GEL_END INT32_MIN
#define NODE_EMPTY 0            /* the real bottom: popping it accepts */
#define NODE_UNKNOWN 1          /* a cache walk's bottom: popping it needs context */
#define GRAM_KEY_FRAMES 2       /* stack frames kept in a cache key */
#define GRAM_MAX_CONFIGS 4096   /* configurations in one state: more is an ambiguous grammar */
#define GRAM_MAX_DEPTH 4096     /* closure recursion */
#define GRAM_MAX_NODES (1 << 23)
#define GRAM_MAX_TOKEN_BYTES 1024
/* Configuration visits (closure steps and set comparisons) one token mask
 * may take: a grammar ambiguous in a way the limits above let through
 * ("a"? repeated 1,500 times: every state holds ~1,500 configurations,
 * each trie walk step compares them all) would otherwise hold the engine
 * thread for seconds a token. Past it the mask fails (at_limit): refused
 * at submission when it is the first mask. */
#define GRAM_MAX_WORK (4ull << 20)
#define GRAM_DD_CAP (4u * GRAM_MAX_CONFIGS)     /* a power of two, at least twice GRAM_MAX_CONFIGS */
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
    uint64_t work;              /* configuration visits of the mask being computed (GRAM_MAX_WORK) */
    /* advance()'s duplicate check: the set it builds (dd_on) has its
     * configurations in a hash of GRAM_DD_CAP slots stamped with the
     * build's number (a stale stamp is an empty slot), so a state of n
     * configurations costs n, not n^2; NULL dd_on: a linear scan */
    const struct gset *dd_on;
    uint64_t *dd_key;
    uint32_t *dd_gen;
    uint32_t dd_cur;

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

/* grammar_match.c */
/* a hash of two ints (inline: the matcher and the mask cache hash on every lookup) */
static inline uint32_t hash2(int32_t a, int32_t b)
{
    uint64_t x = (uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)b * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 29;
    return (uint32_t)(x * 0xBF58476D1CE4E5B9ull >> 32);
}
int tab_grow(int32_t **tab, uint32_t *cap, uint32_t need);
int32_t node_intern(gram_matcher *m, int32_t pos, int32_t parent);
void set_add(gram_matcher *m, gset *s, int32_t pos, int32_t stk);
void advance(gram_matcher *m, const gset *in, uint8_t c, gset *out, bool *popped);
/* at_limit (may be NULL): set when it failed on a limit (configurations,
 * stack nodes, depth) rather than on memory. */
gram_matcher *matcher_new(grammar *g, bool owns, const gram_vocab *v, bool *at_limit);
void gentry_free(gentry *e);
bool can_run(gram_matcher *m, const uint8_t *s, size_t n);
/* grammar_share.c */
void shared_free_list(gram_shared *doomed);
bool gcache_make_room(gram_cache *c, uint64_t need, gram_shared **doomed);

#endif

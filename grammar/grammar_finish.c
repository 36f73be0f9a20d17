/* grammar_finish.c - the builder's end: checks and flattening.
 * Split from grammar.c along its section banners; the design
 * notes are at the top of grammar.c. */
#include "grammar.h"
#include "grammar_impl.h"
#include "fault.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    /* The start state, built once here so a grammar too ambiguous to
     * start (4,100 identical alternatives, an enum of 20,000 values,
     * nested optional repetitions) is refused at compile time, naming the
     * limit, instead of failing in the matcher on the scheduler thread. */
    bool at_limit = false;
    gram_matcher *m0 = matcher_new(g, false, NULL, &at_limit);
    if (!m0) {
        grammar_free(g);
        if (at_limit)
            gb_fail(b, "the grammar is too ambiguous: its start state has more than %d parser configurations "
                    "(limit: %d configurations, %d nested rules)", GRAM_MAX_CONFIGS, GRAM_MAX_CONFIGS,
                    GRAM_MAX_DEPTH);
        else
            gb_fail(b, "out of memory");
        return NULL;
    }
    gram_matcher_free(m0);
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


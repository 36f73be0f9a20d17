/* grammar_match.c - the matcher: the pushdown run over bytes.
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

/* ====================================================================== */
/* Matcher                                                                */
/* ====================================================================== */


int tab_grow(int32_t **tab, uint32_t *cap, uint32_t need)
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
int32_t node_intern(gram_matcher *m, int32_t pos, int32_t parent)
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

void set_add(gram_matcher *m, gset *s, int32_t pos, int32_t stk)
{
    if (m->dd_on == s) {
        const uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)stk;
        uint32_t h = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & (GRAM_DD_CAP - 1);
        m->work++;
        while (m->dd_gen[h] == m->dd_cur) {
            if (m->dd_key[h] == key)
                return;
            h = (h + 1) & (GRAM_DD_CAP - 1);
            m->work++;
        }
        if (s->n >= GRAM_MAX_CONFIGS || set_reserve(s, s->n + 1)) {
            m->at_limit |= s->n >= GRAM_MAX_CONFIGS;
            m->broken = true;
            return;
        }
        m->dd_gen[h] = m->dd_cur;
        m->dd_key[h] = key;
        s->c[s->n++] = (gcfg){pos, stk};
        return;
    }
    m->work += (uint64_t)s->n + 1;
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
/* Start a hashed build of out (set_add's duplicate check in O(1)); false
 * (and m broken) when the table cannot be allocated. */
static bool dd_begin(gram_matcher *m, const gset *out)
{
    if (!m->dd_key) {
        m->dd_key = fault_malloc(GRAM_DD_CAP * sizeof *m->dd_key);
        m->dd_gen = fault_calloc(GRAM_DD_CAP, sizeof *m->dd_gen);
        if (!m->dd_key || !m->dd_gen) {
            free(m->dd_key);
            free(m->dd_gen);
            m->dd_key = NULL;
            m->dd_gen = NULL;
            m->broken = true;   /* out of memory: the matcher's usual clean failure */
            return false;
        }
    }
    if (++m->dd_cur == 0) {     /* the stamps wrapped: every slot empty again */
        memset(m->dd_gen, 0, GRAM_DD_CAP * sizeof *m->dd_gen);
        m->dd_cur = 1;
    }
    m->dd_on = out;
    return true;
}

void advance(gram_matcher *m, const gset *in, uint8_t c, gset *out, bool *popped)
{
    const grammar *g = m->g;
    out->n = 0;
    /* out is built here alone (closure adds only to it), hashed */
    const bool hashed = dd_begin(m, out);
    for (int i = 0; i < in->n; i++) {
        int32_t pos = in->c[i].pos;
        if (pos < 0)
            continue;
        if (set_has_byte(g->sets[-1 - g->el[pos]], c))
            closure(m, pos + 1, in->c[i].stk, out, popped);
    }
    if (hashed)
        m->dd_on = NULL;
}

gram_matcher *matcher_new(grammar *g, bool owns, const gram_vocab *v, bool *at_limit)
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
    const bool hashed = dd_begin(m, &m->cur);
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        closure(m, g->alt_start[a], NODE_EMPTY, &m->cur, &popped);
    if (hashed)
        m->dd_on = NULL;
    if (m->broken)
        goto fail_m;
    return m;
fail_m:
    if (at_limit)
        *at_limit = m->at_limit;
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
    return matcher_new(g, true, v, NULL);
}

void gentry_free(gentry *e)
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
    free(m->dd_key);
    free(m->dd_gen);
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
bool can_run(gram_matcher *m, const uint8_t *s, size_t n)
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
    gram_matcher *m = matcher_new((grammar *)g, false, NULL, NULL);
    bool ok = m && (n == 0 || run_bytes(m, (const uint8_t *)s, n) == 0) && gram_matcher_accepting(m);
    gram_matcher_free(m);
    return ok;
}


/* grammar_mask.c - the matcher's mask cache and trie walks.
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
        if (m->work > GRAM_MAX_WORK) {
            m->broken = m->at_limit = true;
            break;
        }
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
    m->work = 0;
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

int gram_matcher_prime(gram_matcher *m)
{
    if (!m || !m->v)
        return -1;
    if (m->waiting || m->dead)
        return m->v->n_vocab;
    return gram_matcher_fill_mask(m, m->mask);
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

bool gram_matcher_at_limit(const gram_matcher *m)
{
    return m && m->broken && m->at_limit;
}

int gram_matcher_walks(const gram_matcher *m)
{
    return m ? m->n_walks : 0;
}


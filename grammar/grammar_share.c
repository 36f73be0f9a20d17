/* grammar_share.c - sharing compiled grammars and mask entries between requests.
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

void shared_free_list(gram_shared *doomed)
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
bool gcache_make_room(gram_cache *c, uint64_t need, gram_shared **doomed)
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
    gram_matcher *m = matcher_new(sh->g, false, sh->c->v, NULL);
    if (!m) {
        gram_shared_release(sh);
        return NULL;
    }
    m->sh = sh;
    return m;
}

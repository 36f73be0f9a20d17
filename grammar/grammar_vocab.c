/* grammar_vocab.c - the vocabulary: token bytes and their trie.
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
/* Vocabulary                                                             */
/* ====================================================================== */


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

gram_vocab *gram_vocab_new(int n_vocab, gram_piece_fn piece, const void *ctx, char *err, size_t errlen)
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


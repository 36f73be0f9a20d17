/* kv_pages.h - the K and V rows of one attention layer of one sequence, as
 * the attention kernels read them from the cache's pages.
 *
 * Owns: the page layout's arithmetic (cache.h describes the layout and
 * fills the view; cache_kv is this function on its own fields). Does not
 * own: the pages (cache.c).
 */
#ifndef HYSERVE_KV_PAGES_H
#define HYSERVE_KV_PAGES_H

#include <stddef.h>
#include <stdint.h>

/* A read view of one sequence's pages for attention layer la. A page
 * holds page_tokens tokens of every attention layer:
 *   [layer][K=0 | V=1][kv head][token in page][head_dim] */
typedef struct kv_pages {
    uint8_t *const *pages;      /* token t in pages[t / page_tokens] */
    int page_tokens;
    int n_kv, head_dim;         /* KV heads per layer and their width */
    uint32_t type;              /* enum ggml_type of the numbers: F32, F16 or BF16 */
    size_t es;                  /* bytes per number */
    int la;                     /* attention layer index among the cached ones */
} kv_pages;

/* K (kv = 0) or V (kv = 1) row of layer la, kv head h, token t */
static inline void *kv_pages_row(const uint8_t *const *pages, int page_tokens, int n_kv, int head_dim, size_t es,
                                 int la, int kv, int h, int t)
{
    const uint8_t *p = pages[t / page_tokens];
    size_t el = ((((size_t)la * 2 + (size_t)kv) * (size_t)n_kv + (size_t)h) * (size_t)page_tokens +
                 (size_t)(t % page_tokens)) * (size_t)head_dim;
    return (void *)(p + el * es);
}

/* the same row in the view's layer */
static inline void *kv_row(const kv_pages *v, int kv, int h, int t)
{
    return kv_pages_row((const uint8_t *const *)v->pages, v->page_tokens, v->n_kv, v->head_dim, v->es, v->la, kv, h,
                        t);
}

#endif

/* fuzz_gguf.c - libFuzzer target: the GGUF reader and the model binding.
 *
 * Input: a whole GGUF file. Properties: gguf_open and model_load either
 * succeed or fail with a one-line message (never crash, leak or read past
 * the mapping: ASan); on success every metadata value of every type,
 * every array element (numbers and strings) and the first and last byte
 * of every tensor can be read, the typed getters agree with the stored
 * type, and every tensor lies inside the file after the aligned data
 * section start.
 */
#include <string.h>

#include "fuzz.h"
#include "gguf.h"
#include "model.h"

static volatile uint8_t sink;

static void read_all(const gguf_ctx *g)
{
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        char key[256];
        size_t n = kv->key.n < sizeof key - 1 ? (size_t)kv->key.n : sizeof key - 1;
        memcpy(key, kv->key.p, n);
        key[n] = 0;
        uint32_t u;
        int64_t v;
        float f;
        bool b;
        (void)gguf_get_u32(g, key, &u);
        (void)gguf_get_i64(g, key, &v);
        (void)gguf_get_f32(g, key, &f);
        (void)gguf_get_bool(g, key, &b);
        char *s = gguf_get_str_dup(g, key);
        if (s)
            sink ^= (uint8_t)s[strlen(s) / 2];
        free(s);
        if (kv->type != GGUF_T_ARRAY) {
            FUZZ_CHECK(!gguf_arr_get_i64(kv, 0, &v));
            continue;
        }
        FUZZ_CHECK(kv->arr_type != GGUF_T_ARRAY);   /* nested arrays are refused at open */
        FUZZ_CHECK(!gguf_arr_get_i64(kv, kv->arr_n, &v));
        const uint64_t m = kv->arr_n < 64 ? kv->arr_n : 64;
        for (uint64_t j = 0; j < m; j++) {
            const uint64_t k = j < 32 ? j : kv->arr_n - 1 - (j - 32);
            if (kv->arr_type == GGUF_T_STRING) {
                FUZZ_CHECK(kv->strs != NULL);
                if (kv->strs[k].n)
                    sink ^= (uint8_t)kv->strs[k].p[0] ^ (uint8_t)kv->strs[k].p[kv->strs[k].n - 1];
            } else {
                (void)gguf_arr_get_i64(kv, k, &v);
            }
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        FUZZ_CHECK(gguf_find_tensor(g, t->name) == t);    /* names are unique */
        FUZZ_CHECK(g->data_offset % g->alignment == 0);
        FUZZ_CHECK(t->offset <= g->size - g->data_offset && t->n_bytes <= g->size - g->data_offset - t->offset);
        if (t->n_bytes) {
            const uint8_t *p = t->data;
            sink ^= p[0] ^ p[t->n_bytes - 1];
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    if (!path)
        return 0;
    char err[512];
    err[0] = 0;
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    FUZZ_CHECK(g || err[0]);
    if (g) {
        read_all(g);
        gguf_close(g);
    }
    err[0] = 0;
    model *m = model_load(path, NULL, err, sizeof err);
    FUZZ_CHECK(m || err[0]);
    model_free(m);
    return 0;
}

/* test_gguf.c - the GGUF reader against hand-made hostile headers.
 *
 * Each file here is assembled byte by byte from the container layout
 * (docs: GGUF, version 3: magic, version, tensor count, metadata count,
 * metadata records, tensor records, data aligned to general.alignment), so
 * the reader is tested against the format, not against our writer. The
 * classes follow the advisories filed against GGUF readers: counts that the
 * file cannot hold (llama.cpp CVE-2025-53630 and its bypass), duplicate and
 * overlapping tensor records. */
#include "test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

typedef struct {
    uint8_t b[8192];
    size_t n;
} bytes;

static void put(bytes *o, const void *p, size_t n)
{
    if (o->n + n <= sizeof o->b) {
        memcpy(o->b + o->n, p, n);
        o->n += n;
    }
}
static void u32(bytes *o, uint32_t v) { put(o, &v, 4); }
static void u64(bytes *o, uint64_t v) { put(o, &v, 8); }
static void str(bytes *o, const char *s)
{
    u64(o, strlen(s));
    put(o, s, strlen(s));
}

static void header(bytes *o, uint64_t n_tensors, uint64_t n_kv)
{
    put(o, "GGUF", 4);
    u32(o, 3);
    u64(o, n_tensors);
    u64(o, n_kv);
}

/* one F32 tensor record of n elements at byte offset off of the data */
static void tensor(bytes *o, const char *name, uint64_t n, uint64_t off)
{
    str(o, name);
    u32(o, 1);
    u64(o, n);
    u32(o, GGML_F32);
    u64(o, off);
}

/* pad to 32 (the default alignment) and append n zero bytes of data */
static void data(bytes *o, size_t n)
{
    static const uint8_t zero[64];
    while (o->n % 32)
        put(o, zero, 1);
    for (size_t i = 0; i < n; i++)
        put(o, zero, 1);
}

/* write o to a scratch file and open it; err gets the reader's message */
static gguf_ctx *open_bytes(const bytes *o, const char *tag, char *err, size_t errlen)
{
    char path[512];
    snprintf(path, sizeof path, "%s/gguf_%s.gguf", test_tmpdir(), tag);
    FILE *f = fopen(path, "wb");
    if (!f)
        return NULL;
    fwrite(o->b, 1, o->n, f);
    fclose(f);
    err[0] = 0;
    gguf_ctx *g = gguf_open(path, err, errlen);
    remove(path);
    return g;
}

TEST(test_gguf_two_adjacent_tensors_open)
{
    bytes o = { .n = 0 };
    char err[512];
    header(&o, 2, 0);
    tensor(&o, "a", 8, 0);
    tensor(&o, "b", 8, 32);
    data(&o, 64);
    gguf_ctx *g = open_bytes(&o, "adjacent", err, sizeof err);
    CHECK_MSG(g != NULL, "a well-formed file is refused: %s", err);
    CHECK(g->n_tensors == 2 && gguf_find_tensor(g, "b") != NULL);
    gguf_close(g);
}

TEST(test_gguf_tensor_count_the_file_cannot_hold_is_refused_before_allocating)
{
    /* about 2.8 KB claiming 15.8 million tensor records: each takes at least
     * 33 bytes, so the count alone proves the file corrupt */
    bytes o = { .n = 0 };
    char err[512];
    header(&o, 15800000, 0);
    for (int i = 0; i < 80; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        tensor(&o, name, 8, 32 * (uint64_t)i);
    }
    gguf_ctx *g = open_bytes(&o, "count", err, sizeof err);
    CHECK(g == NULL);
    CHECK_MSG(strstr(err, "15800000 tensors") && strstr(err, "more than"), "message: %s", err);
}

TEST(test_gguf_metadata_count_the_file_cannot_hold_is_refused)
{
    bytes o = { .n = 0 };
    char err[512];
    header(&o, 0, 1000000);
    str(&o, "general.name");
    u32(&o, 8);
    str(&o, "x");
    gguf_ctx *g = open_bytes(&o, "kvcount", err, sizeof err);
    CHECK(g == NULL);
    CHECK_MSG(strstr(err, "1000000 metadata entries"), "message: %s", err);
}

TEST(test_gguf_overlapping_tensors_are_refused)
{
    bytes o = { .n = 0 };
    char err[512];
    header(&o, 2, 0);
    tensor(&o, "a", 16, 0);      /* bytes 0-64 */
    tensor(&o, "b", 8, 32);      /* bytes 32-64: inside a */
    data(&o, 64);
    gguf_ctx *g = open_bytes(&o, "overlap", err, sizeof err);
    CHECK(g == NULL);
    CHECK_MSG(strstr(err, "overlap") && strstr(err, "'a'") && strstr(err, "'b'"), "message: %s", err);
}

TEST(test_gguf_tensor_inside_an_earlier_longer_one_is_refused)
{
    /* a long, c inside it, b after c but still inside a: only the furthest
     * end seen so far catches b */
    bytes o = { .n = 0 };
    char err[512];
    header(&o, 3, 0);
    tensor(&o, "a", 32, 0);      /* bytes 0-128 */
    tensor(&o, "c", 8, 0);       /* bytes 0-32 */
    tensor(&o, "b", 8, 64);      /* bytes 64-96 */
    data(&o, 128);
    gguf_ctx *g = open_bytes(&o, "inside", err, sizeof err);
    CHECK(g == NULL);
    CHECK_MSG(strstr(err, "overlap"), "message: %s", err);
}

TEST(test_gguf_duplicate_tensor_names_are_refused)
{
    bytes o = { .n = 0 };
    char err[512];
    header(&o, 3, 0);
    tensor(&o, "w", 8, 0);
    tensor(&o, "v", 8, 32);
    tensor(&o, "w", 8, 64);
    data(&o, 96);
    gguf_ctx *g = open_bytes(&o, "dup", err, sizeof err);
    CHECK(g == NULL);
    CHECK_MSG(strstr(err, "'w' appears twice"), "message: %s", err);
}

/* gguf.h - bounds-checked GGUF reader (mmap, zero-copy views) and writer.
 *
 * Owns: parsing the GGUF container (header, metadata, tensor infos) and
 * writing one. Does not own: what the keys or tensors mean (model.c) or
 * how block types are decoded (kernels/quant.c); the type ids and block
 * sizes are kernels/ggml_type.h's.
 * ref: docs/models.md section 5; ggml's gguf.cpp for the
 * field order (read for facts only).
 */
#ifndef HYSERVE_GGUF_H
#define HYSERVE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ggml_type.h"

enum gguf_vtype {
    GGUF_T_U8 = 0, GGUF_T_I8 = 1, GGUF_T_U16 = 2, GGUF_T_I16 = 3,
    GGUF_T_U32 = 4, GGUF_T_I32 = 5, GGUF_T_F32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_U64 = 10, GGUF_T_I64 = 11,
    GGUF_T_F64 = 12,
};

/* One string: points into the mapped file (not NUL-terminated). */
typedef struct gguf_str {
    const char *p;
    uint64_t n;
} gguf_str;

/* One metadata value. Arrays of numbers point into the mapping; arrays of
 * strings get a side table of gguf_str built at open. */
typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;          /* enum gguf_vtype */
    uint32_t arr_type;      /* element type when type == ARRAY */
    uint64_t arr_n;         /* element count when type == ARRAY */
    const void *data;       /* scalar value or first array element */
    gguf_str *strs;         /* [arr_n] when arr_type == STRING, else NULL */
} gguf_kv;

typedef struct gguf_tensor {
    char name[96];          /* NUL-terminated copy */
    uint32_t n_dims;
    uint64_t ne[4];         /* ggml order, ne[0] contiguous; unused dims = 1 */
    uint32_t type;          /* enum ggml_type */
    uint64_t offset;        /* relative to the data section */
    uint64_t n_bytes;
    const void *data;       /* into the mapping, bounds checked at open */
} gguf_tensor;

/* An open GGUF file. Owned by whoever opened it; read-only after open, so
 * any thread may read it. */
typedef struct gguf_ctx {
    char *path;
    int fd;
    const uint8_t *base;    /* mmap of the whole file */
    size_t size;
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv;
    gguf_kv *kv;            /* [n_kv] */
    uint64_t n_tensors;
    gguf_tensor *tensors;   /* [n_tensors] */
    uint64_t data_offset;   /* start of the data section in the file */
    uint8_t *data_copy;     /* gguf_load_huge: the data section, else NULL */
    size_t data_copy_bytes; /* its mapping's length (a multiple of 2 MiB) */
} gguf_ctx;

/* Open and validate a file. On failure returns NULL and writes one line
 * naming the file and the problem into err. */
gguf_ctx *gguf_open(const char *path, char *err, size_t errlen);
void gguf_close(gguf_ctx *g);

/* Read the data section into anonymous memory backed by 2 MiB transparent
 * huge pages, and point every tensor's data there (metadata stays in the
 * mapping). Decode streams every weight once per token; with the file's
 * 4 KiB pages each stream walks the page tables every 4 KiB. Measured on
 * the bench machine (2 threads, A/B in one process): a one-token product
 * over a 600 MiB weight 5-14% faster on every type, but whole-model decode
 * steps of the bench models from -10% to +19% with a median near 0 (1 and
 * 16 sequences, `make bench`'s side-by-side section), so it is opt-in
 * (engine_params.huge_weights, `--huge-pages`). Returns 0, or -1 with one
 * line in err when the kernel has transparent huge pages off or memory
 * runs out; the tensors then stay in the mapping, unchanged. Call before
 * anything takes tensor pointers. The copy is read-only (mprotect).
 * on_read (or NULL) is told 0 bytes and the total when reading begins,
 * then of each part read (64 MiB at most), the parts adding up to the
 * total. */
typedef void (*gguf_read_fn)(void *ctx, uint64_t bytes, uint64_t total);
int gguf_load_huge(gguf_ctx *g, gguf_read_fn on_read, void *ctx, char *err, size_t errlen);

/* Read the data section's pages into the file mapping (the page cache) at
 * load, so that the first request does not wait on the disk and the load
 * time is the real one: MADV_WILLNEED, then each part of 64 MiB populated
 * (MADV_POPULATE_READ, or a read of each page where the kernel lacks it).
 * Nothing to do with the huge-page copy. on_read as gguf_load_huge's. */
void gguf_prefault(gguf_ctx *g, gguf_read_fn on_read, void *ctx);

/* Make the huge-page copy of the tensor data (gguf_load_huge) writable
 * (on) or read-only again (off), to repack weights in place at load.
 * Returns 0, or -1 if there is no copy or mprotect refused. */
int gguf_data_writable(gguf_ctx *g, bool on);

const gguf_kv *gguf_find_kv(const gguf_ctx *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_ctx *g, const char *name);

/* Typed getters: return false when the key is absent or of an
 * incompatible type. Integer getters accept any integer or bool type
 * whose value fits. */
bool gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out);
bool gguf_get_i64(const gguf_ctx *g, const char *key, int64_t *out);
bool gguf_get_f32(const gguf_ctx *g, const char *key, float *out);
bool gguf_get_bool(const gguf_ctx *g, const char *key, bool *out);
/* Returns a NUL-terminated heap copy (caller frees) or NULL: absent, not
 * a string, or out of memory (gguf_has_str tells the last apart). */
char *gguf_get_str_dup(const gguf_ctx *g, const char *key);
/* Whether key is present and holds a string. */
bool gguf_has_str(const gguf_ctx *g, const char *key);
/* Element i of an integer/bool array as int64; false if out of range. */
bool gguf_arr_get_i64(const gguf_kv *kv, uint64_t i, int64_t *out);

/* ------------------------------------------------------------------ */
/* Writer: collects metadata and tensors in memory, then writes a file. */

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_w_f32(gguf_writer *w, const char *key, float v);
void gguf_w_bool(gguf_writer *w, const char *key, bool v);
void gguf_w_str(gguf_writer *w, const char *key, const char *v);
/* Arrays: elem_type is a gguf_vtype of fixed size (not STRING). */
void gguf_w_arr(gguf_writer *w, const char *key, uint32_t elem_type,
                const void *data, uint64_t n);
void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v,
                    uint64_t n);
/* Copies one metadata entry read by gguf_open (any type). */
void gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv);
/* Adds a tensor; data is copied. ne has n_dims entries (ggml order). */
void gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type,
                   uint32_t n_dims, const uint64_t *ne, const void *data);
/* Writes the file; returns 0 or -1 with a message in err. */
int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen);

#endif

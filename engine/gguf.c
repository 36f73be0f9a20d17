/* gguf.c - bounds-checked GGUF reader (mmap, zero-copy) and writer.
 *
 * The reader walks the header through a cursor that keeps the first error:
 * every read checks the remaining bytes, so a truncated or hostile file
 * yields one message and never a read past the mapping.
 * ref: docs/models.md section 5.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault.h"

#define GGUF_MAGIC 0x46554747u
#define GGUF_MAX_ARRAY (1ull << 32)
#define GGUF_MAX_COUNT (1ull << 24)
/* The fewest bytes one header record can take, to check a count against the
 * bytes left before allocating for it. A metadata entry: key length (8) +
 * type (4) + a one-byte value; a tensor record: name length (8) + one name
 * byte + dims (4) + one extent (8) + type (4) + offset (8). */
#define GGUF_MIN_KV_BYTES 13u
#define GGUF_MIN_TENSOR_BYTES 33u

static size_t vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_T_U8: case GGUF_T_I8: case GGUF_T_BOOL: return 1;
    case GGUF_T_U16: case GGUF_T_I16: return 2;
    case GGUF_T_U32: case GGUF_T_I32: case GGUF_T_F32: return 4;
    case GGUF_T_U64: case GGUF_T_I64: case GGUF_T_F64: return 8;
    default: return 0;
    }
}

/* ------------------------------------------------------------------ */
/* Cursor                                                              */

typedef struct cursor {
    const uint8_t *p;
    size_t off, size;
    char *err;
    size_t errlen;
    const char *path;
    bool failed;
} cursor;

__attribute__((format(printf, 2, 3)))
static void cur_fail(cursor *c, const char *fmt, ...)
{
    if (c->failed)
        return;
    c->failed = true;
    int n = snprintf(c->err, c->errlen, "%s: ", c->path);
    if (n < 0 || (size_t)n >= c->errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static const void *cur_take(cursor *c, size_t n, const char *what)
{
    if (c->failed)
        return NULL;
    if (n > c->size - c->off) {
        cur_fail(c, "file is truncated: %s at byte %zu needs %zu bytes, %zu remain",
                 what, c->off, n, c->size - c->off);
        return NULL;
    }
    const void *r = c->p + c->off;
    c->off += n;
    return r;
}

static uint32_t cur_u32(cursor *c, const char *what)
{
    const void *p = cur_take(c, 4, what);
    uint32_t v = 0;
    if (p)
        memcpy(&v, p, 4);
    return v;
}

static uint64_t cur_u64(cursor *c, const char *what)
{
    const void *p = cur_take(c, 8, what);
    uint64_t v = 0;
    if (p)
        memcpy(&v, p, 8);
    return v;
}

static gguf_str cur_str(cursor *c, const char *what)
{
    gguf_str s = { NULL, 0 };
    uint64_t n = cur_u64(c, what);
    if (c->failed)
        return s;
    if (n > c->size - c->off) {
        cur_fail(c, "file is truncated or corrupt: %s of length %llu at byte %zu runs past the end",
                 what, (unsigned long long)n, c->off);
        return s;
    }
    s.p = (const char *)cur_take(c, (size_t)n, what);
    s.n = n;
    return s;
}

static bool str_eq(gguf_str s, const char *z)
{
    size_t n = strlen(z);
    return s.n == n && memcmp(s.p, z, n) == 0;
}

/* ------------------------------------------------------------------ */
/* Reader                                                              */

static void read_kv(cursor *c, gguf_kv *kv)
{
    kv->key = cur_str(c, "metadata key");
    kv->type = cur_u32(c, "metadata value type");
    if (c->failed)
        return;
    if (kv->type == GGUF_T_STRING) {
        size_t at = c->off;
        cur_str(c, "string value");
        kv->data = c->p + at;       /* points at the u64 length */
    } else if (kv->type == GGUF_T_ARRAY) {
        kv->arr_type = cur_u32(c, "array element type");
        kv->arr_n = cur_u64(c, "array length");
        if (c->failed)
            return;
        if (kv->arr_n > GGUF_MAX_ARRAY) {
            cur_fail(c, "metadata array '%.*s' has an absurd length %llu", (int)kv->key.n,
                     kv->key.p, (unsigned long long)kv->arr_n);
            return;
        }
        if (kv->arr_type == GGUF_T_STRING) {
            /* each string is at least 8 bytes: check before allocating */
            if (kv->arr_n > (c->size - c->off) / 8) {
                cur_fail(c, "file is truncated: string array '%.*s' of %llu entries runs past the end",
                         (int)kv->key.n, kv->key.p, (unsigned long long)kv->arr_n);
                return;
            }
            kv->strs = FAULT_OR(malloc((kv->arr_n ? kv->arr_n : 1) * sizeof(gguf_str)));
            if (!kv->strs) {
                cur_fail(c, "out of memory reading string array");
                return;
            }
            kv->data = c->p + c->off;
            for (uint64_t i = 0; i < kv->arr_n && !c->failed; i++)
                kv->strs[i] = cur_str(c, "array string");
        } else {
            size_t es = vtype_size(kv->arr_type);
            if (es == 0) {
                cur_fail(c, "metadata array '%.*s' has unsupported element type %u",
                         (int)kv->key.n, kv->key.p, kv->arr_type);
                return;
            }
            if (kv->arr_n > (c->size - c->off) / es) {
                cur_fail(c, "file is truncated: array '%.*s' runs past the end",
                         (int)kv->key.n, kv->key.p);
                return;
            }
            kv->data = cur_take(c, (size_t)kv->arr_n * es, "array data");
        }
    } else {
        size_t es = vtype_size(kv->type);
        if (es == 0) {
            cur_fail(c, "metadata key '%.*s' has unknown value type %u", (int)kv->key.n,
                     kv->key.p, kv->type);
            return;
        }
        kv->data = cur_take(c, es, "metadata value");
    }
}

static int read_tensor_info(cursor *c, gguf_tensor *t)
{
    gguf_str name = cur_str(c, "tensor name");
    t->n_dims = cur_u32(c, "tensor dims");
    if (c->failed)
        return -1;
    if (name.n == 0 || name.n >= sizeof t->name) {
        cur_fail(c, "tensor name of length %llu is empty or too long", (unsigned long long)name.n);
        return -1;
    }
    memcpy(t->name, name.p, name.n);
    t->name[name.n] = 0;
    if (t->n_dims == 0 || t->n_dims > 4) {
        cur_fail(c, "tensor '%s' has %u dimensions (1 to 4 allowed)", t->name, t->n_dims);
        return -1;
    }
    for (int i = 0; i < 4; i++)
        t->ne[i] = 1;
    for (uint32_t i = 0; i < t->n_dims; i++)
        t->ne[i] = cur_u64(c, "tensor shape");
    t->type = cur_u32(c, "tensor type");
    t->offset = cur_u64(c, "tensor offset");
    if (c->failed)
        return -1;
    size_t bs = ggml_block_size(t->type), ts = ggml_type_size(t->type);
    if (bs == 0) {
        cur_fail(c, "tensor '%s' has unknown type %u", t->name, t->type);
        return -1;
    }
    uint64_t n_el = 1;
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] == 0 || t->ne[i] > (1ull << 40) || n_el > (1ull << 40) / t->ne[i]) {
            cur_fail(c, "tensor '%s' has an invalid shape", t->name);
            return -1;
        }
        n_el *= t->ne[i];
    }
    if (t->ne[0] % bs != 0) {
        cur_fail(c, "tensor '%s' of type %s has a row of %llu elements, not a multiple of its block size %zu",
                 t->name, ggml_type_name(t->type), (unsigned long long)t->ne[0], bs);
        return -1;
    }
    t->n_bytes = n_el / bs * ts;
    return 0;
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

static int cmp_by_offset(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Every name once, and no two tensors sharing bytes of the data section
 * (a tensor of n bytes owns [offset, offset + n)). Sorted twice, so a file
 * of many tensors costs n log n, not n^2. 0, or -1 with the cursor failed. */
static int check_tensor_table(gguf_ctx *g, cursor *c)
{
    if (g->n_tensors < 2)
        return 0;
    const gguf_tensor **by = FAULT_OR(malloc((size_t)g->n_tensors * sizeof *by));
    if (!by) {
        cur_fail(c, "out of memory");
        return -1;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        by[i] = &g->tensors[i];
    int rc = 0;
    qsort(by, (size_t)g->n_tensors, sizeof *by, cmp_by_name);
    for (uint64_t i = 1; i < g->n_tensors && rc == 0; i++)
        if (strcmp(by[i - 1]->name, by[i]->name) == 0) {
            cur_fail(c, "tensor '%s' appears twice", by[i]->name);
            rc = -1;
        }
    qsort(by, (size_t)g->n_tensors, sizeof *by, cmp_by_offset);
    /* the furthest end so far: one tensor may lie inside an earlier, longer one */
    const gguf_tensor *reach = by[0];
    for (uint64_t i = 1; i < g->n_tensors && rc == 0; i++) {
        const gguf_tensor *t = by[i];
        if (t->n_bytes && reach->n_bytes && t->offset < reach->offset + reach->n_bytes) {
            cur_fail(c, "tensors '%s' and '%s' overlap (bytes %llu-%llu and %llu-%llu of the data section): "
                     "the file is corrupt", reach->name, t->name, (unsigned long long)reach->offset,
                     (unsigned long long)(reach->offset + reach->n_bytes), (unsigned long long)t->offset,
                     (unsigned long long)(t->offset + t->n_bytes));
            rc = -1;
        }
        if (t->offset + t->n_bytes > reach->offset + reach->n_bytes)
            reach = t;
    }
    free(by);
    return rc;
}

gguf_ctx *gguf_open(const char *path, char *err, size_t errlen)
{
    gguf_ctx *g = FAULT_OR(calloc(1, sizeof *g));
    cursor c = { .err = err, .errlen = errlen, .path = path };
    if (err && errlen)
        err[0] = 0;
    if (!g) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    g->fd = -1;
    g->path = FAULT_OR(strdup(path));
    if (!g->path) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto out_fail;
    }
    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (g->fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        goto out_fail;
    }
    struct stat st;
    if (fstat(g->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        goto out_fail;
    }
    g->size = (size_t)st.st_size;
    if (g->size < 24) {
        snprintf(err, errlen, "%s: file is truncated: %zu bytes is too small for a GGUF header",
                 path, g->size);
        goto out_fail;
    }
    void *m = fault_now() ? MAP_FAILED : mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, g->fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        goto out_fail;
    }
    g->base = m;
    c.p = g->base;
    c.size = g->size;

    uint32_t magic = cur_u32(&c, "magic");
    if (magic != GGUF_MAGIC) {
        cur_fail(&c, "not a GGUF file (bad magic 0x%08x, expected 0x%08x \"GGUF\")", magic, GGUF_MAGIC);
        goto out_fail;
    }
    g->version = cur_u32(&c, "version");
    if (g->version != 2 && g->version != 3) {
        cur_fail(&c, "unsupported GGUF version %u (2 and 3 are supported)", g->version);
        goto out_fail;
    }
    g->n_tensors = cur_u64(&c, "tensor count");
    g->n_kv = cur_u64(&c, "metadata count");
    if (c.failed)
        goto out_fail;
    if (g->n_tensors > GGUF_MAX_COUNT || g->n_kv > GGUF_MAX_COUNT) {
        cur_fail(&c, "corrupt header: %llu tensors, %llu metadata entries",
                 (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv);
        goto out_fail;
    }
    /* a file cannot hold more records than its remaining bytes allow: check
     * the counts against them before anything is allocated for them */
    const uint64_t left = c.size - c.off;
    if (g->n_kv > left / GGUF_MIN_KV_BYTES || g->n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        g->n_kv * GGUF_MIN_KV_BYTES + g->n_tensors * GGUF_MIN_TENSOR_BYTES > left) {
        cur_fail(&c, "file is truncated or corrupt: its header claims %llu metadata entries and %llu tensors, "
                 "more than the %llu bytes after it can hold",
                 (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, (unsigned long long)left);
        goto out_fail;
    }
    g->kv = FAULT_OR(calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv));
    g->tensors = FAULT_OR(calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors));
    if (!g->kv || !g->tensors) {
        cur_fail(&c, "out of memory");
        goto out_fail;
    }
    for (uint64_t i = 0; i < g->n_kv && !c.failed; i++)
        read_kv(&c, &g->kv[i]);
    if (c.failed)
        goto out_fail;

    g->alignment = 32;
    const gguf_kv *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (!gguf_get_u32(g, "general.alignment", &a) || a == 0 || (a & (a - 1)) != 0) {
            cur_fail(&c, "general.alignment must be a power of two");
            goto out_fail;
        }
        g->alignment = a;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (read_tensor_info(&c, &g->tensors[i]) != 0)
            goto out_fail;
    g->data_offset = (c.off + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_offset > g->size && g->n_tensors > 0) {
        cur_fail(&c, "file is truncated: the data section starts past the end");
        goto out_fail;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t avail = g->size - g->data_offset;
        if (t->offset > avail || t->n_bytes > avail - t->offset) {
            cur_fail(&c, "tensor '%s' (%llu bytes at offset %llu) points past the end of the file "
                     "(data section holds %llu bytes): the file is truncated or corrupt",
                     t->name, (unsigned long long)t->n_bytes, (unsigned long long)t->offset,
                     (unsigned long long)avail);
            goto out_fail;
        }
        t->data = g->base + g->data_offset + t->offset;
    }
    if (check_tensor_table(g, &c) != 0)
        goto out_fail;
    return g;

out_fail:
    if (!c.failed && err && errlen && !err[0])
        snprintf(err, errlen, "%s: cannot read", path);
    gguf_close(g);
    return NULL;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* true when the kernel hands out transparent huge pages to madvise()d
 * memory: "always" or "madvise" is the one in brackets */
static bool thp_available(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return false;
    char line[128] = "";
    const bool ok = fgets(line, sizeof line, f) && !strstr(line, "[never]");
    fclose(f);
    return ok;
}

int gguf_load_huge(gguf_ctx *g, gguf_read_fn on_read, void *ctx, char *err, size_t errlen)
{
    if (g->data_copy)
        return 0;
    const size_t n = g->size - (size_t)g->data_offset;
    if (n == 0 || g->n_tensors == 0)
        return 0;
    if (!thp_available()) {
        snprintf(err, errlen, "%s: transparent huge pages are off in this kernel; weights stay mapped", g->path);
        return -1;
    }
    /* a 2 MiB-aligned region: over-map by one huge page, trim both ends */
    const size_t len = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    uint8_t *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot allocate %zu bytes for the weights: %s", g->path, len, strerror(errno));
        return -1;
    }
    uint8_t *a = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (a > raw)
        munmap(raw, (size_t)(a - raw));
    munmap(a + len, (size_t)(raw + HUGE_PAGE - a));         /* a < raw + HUGE_PAGE: never empty */
    madvise(a, len, MADV_HUGEPAGE);
    /* read, not copy from the mapping: the mapping's data pages are never
     * touched, so they never count against this process */
    size_t got = 0;
    if (on_read)
        on_read(ctx, 0, n);
    while (got < n) {
        const size_t part = n - got < ((size_t)64 << 20) ? n - got : (size_t)64 << 20;
        const ssize_t r = pread(g->fd, a + got, part, (off_t)(g->data_offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s: cannot read the tensor data: %s", g->path,
                     r < 0 ? strerror(errno) : "the file shrank while loading");
            munmap(a, len);
            return -1;
        }
        got += (size_t)r;
        if (on_read)
            on_read(ctx, (uint64_t)r, n);
    }
    mprotect(a, len, PROT_READ);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        g->tensors[i].data = a + g->tensors[i].offset;
    g->data_copy = a;
    g->data_copy_bytes = len;
    return 0;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22       /* Linux 5.14; older kernels answer EINVAL */
#endif

void gguf_prefault(gguf_ctx *g, gguf_read_fn on_read, void *ctx)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (g->data_copy || g->data_offset >= g->size)
        return;
    const uint8_t *start = g->base + (g->data_offset / page * page);
    const size_t n = g->size - (size_t)(start - g->base), part_max = (size_t)64 << 20;
    madvise((void *)start, n, MADV_WILLNEED);
    if (on_read)
        on_read(ctx, 0, n);
    bool populate = true;
    for (size_t off = 0; off < n;) {
        const size_t part = n - off < part_max ? n - off : part_max;
        if (!populate || madvise((void *)(start + off), part, MADV_POPULATE_READ) != 0) {
            populate = false;
            volatile uint8_t sink = 0;
            for (size_t i = 0; i < part; i += page)
                sink ^= start[off + i];
            (void)sink;
        }
        off += part;
        if (on_read)
            on_read(ctx, part, n);
    }
}

int gguf_data_writable(gguf_ctx *g, bool on)
{
    if (!g->data_copy)
        return -1;
    return mprotect(g->data_copy, g->data_copy_bytes, on ? PROT_READ | PROT_WRITE : PROT_READ);
}

void gguf_close(gguf_ctx *g)
{
    if (!g)
        return;
    if (g->data_copy)
        munmap(g->data_copy, g->data_copy_bytes);
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            free(g->kv[i].strs);
    free(g->kv);
    free(g->tensors);
    if (g->base)
        munmap((void *)g->base, g->size);
    if (g->fd >= 0)
        close(g->fd);
    free(g->path);
    free(g);
}

const gguf_kv *gguf_find_kv(const gguf_ctx *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.p && str_eq(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

/* Read one integer-like value of type t at p as int64. */
static bool int_at(uint32_t t, const void *p, int64_t *out)
{
    switch (t) {
    case GGUF_T_U8: case GGUF_T_BOOL: { uint8_t v; memcpy(&v, p, 1); *out = v; return true; }
    case GGUF_T_I8: { int8_t v; memcpy(&v, p, 1); *out = v; return true; }
    case GGUF_T_U16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_T_I16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_T_U32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_T_I32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_T_U64: { uint64_t v; memcpy(&v, p, 8); if (v > INT64_MAX) return false; *out = (int64_t)v; return true; }
    case GGUF_T_I64: { int64_t v; memcpy(&v, p, 8); *out = v; return true; }
    default: return false;
    }
}

bool gguf_get_i64(const gguf_ctx *g, const char *key, int64_t *out)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    return kv && kv->type != GGUF_T_ARRAY && int_at(kv->type, kv->data, out);
}

bool gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out)
{
    int64_t v;
    if (!gguf_get_i64(g, key, &v) || v < 0 || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

bool gguf_get_bool(const gguf_ctx *g, const char *key, bool *out)
{
    int64_t v;
    if (!gguf_get_i64(g, key, &v))
        return false;
    *out = v != 0;
    return true;
}

bool gguf_get_f32(const gguf_ctx *g, const char *key, float *out)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv)
        return false;
    if (kv->type == GGUF_T_F32) {
        memcpy(out, kv->data, 4);
        return true;
    }
    if (kv->type == GGUF_T_F64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
        return true;
    }
    int64_t v;
    if (kv->type != GGUF_T_ARRAY && int_at(kv->type, kv->data, &v)) {
        *out = (float)v;
        return true;
    }
    return false;
}

bool gguf_has_str(const gguf_ctx *g, const char *key)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    return kv && kv->type == GGUF_T_STRING;
}

char *gguf_get_str_dup(const gguf_ctx *g, const char *key)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv || kv->type != GGUF_T_STRING)
        return NULL;
    uint64_t n;
    memcpy(&n, kv->data, 8);
    char *s = FAULT_OR(malloc(n + 1));
    if (!s)
        return NULL;
    memcpy(s, (const char *)kv->data + 8, n);
    s[n] = 0;
    return s;
}

bool gguf_arr_get_i64(const gguf_kv *kv, uint64_t i, int64_t *out)
{
    if (!kv || kv->type != GGUF_T_ARRAY || i >= kv->arr_n)
        return false;
    size_t es = vtype_size(kv->arr_type);
    if (es == 0 || kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_F64)
        return false;
    return int_at(kv->arr_type, (const uint8_t *)kv->data + i * es, out);
}

/* ------------------------------------------------------------------ */
/* Writer                                                              */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

static void wb_put(wbuf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void wb_u32(wbuf *b, uint32_t v) { wb_put(b, &v, 4); }
static void wb_u64(wbuf *b, uint64_t v) { wb_put(b, &v, 8); }
static void wb_str(wbuf *b, const char *s)
{
    size_t n = strlen(s);
    wb_u64(b, n);
    wb_put(b, s, n);
}

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint8_t *data;
    size_t n_bytes;
} wtensor;

struct gguf_writer {
    wbuf kv;            /* serialized metadata */
    uint64_t n_kv;
    wtensor *t;
    uint64_t n_t, cap_t;
    bool oom;
};

gguf_writer *gguf_writer_new(void)
{
    return calloc(1, sizeof(gguf_writer));
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w->kv.p);
    free(w);
}

static void w_key(gguf_writer *w, const char *key, uint32_t type)
{
    wb_str(&w->kv, key);
    wb_u32(&w->kv, type);
    w->n_kv++;
}

void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v) { w_key(w, key, GGUF_T_U32); wb_u32(&w->kv, v); }
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v) { w_key(w, key, GGUF_T_I32); wb_put(&w->kv, &v, 4); }
void gguf_w_f32(gguf_writer *w, const char *key, float v) { w_key(w, key, GGUF_T_F32); wb_put(&w->kv, &v, 4); }
void gguf_w_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v;
    w_key(w, key, GGUF_T_BOOL);
    wb_put(&w->kv, &b, 1);
}
void gguf_w_str(gguf_writer *w, const char *key, const char *v) { w_key(w, key, GGUF_T_STRING); wb_str(&w->kv, v); }

void gguf_w_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n)
{
    w_key(w, key, GGUF_T_ARRAY);
    wb_u32(&w->kv, elem_type);
    wb_u64(&w->kv, n);
    wb_put(&w->kv, data, (size_t)n * vtype_size(elem_type));
}

void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    w_key(w, key, GGUF_T_ARRAY);
    wb_u32(&w->kv, GGUF_T_STRING);
    wb_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++)
        wb_str(&w->kv, v[i]);
}

void gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv)
{
    wb_u64(&w->kv, kv->key.n);
    wb_put(&w->kv, kv->key.p, (size_t)kv->key.n);
    wb_u32(&w->kv, kv->type);
    w->n_kv++;
    if (kv->type == GGUF_T_STRING) {
        uint64_t n;
        memcpy(&n, kv->data, 8);
        wb_put(&w->kv, kv->data, (size_t)(8 + n));
    } else if (kv->type == GGUF_T_ARRAY) {
        wb_u32(&w->kv, kv->arr_type);
        wb_u64(&w->kv, kv->arr_n);
        if (kv->arr_type == GGUF_T_STRING) {
            for (uint64_t i = 0; i < kv->arr_n; i++) {
                wb_u64(&w->kv, kv->strs[i].n);
                wb_put(&w->kv, kv->strs[i].p, (size_t)kv->strs[i].n);
            }
        } else {
            wb_put(&w->kv, kv->data, (size_t)kv->arr_n * vtype_size(kv->arr_type));
        }
    } else {
        wb_put(&w->kv, kv->data, vtype_size(kv->type));
    }
}

void gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                   const uint64_t *ne, const void *data)
{
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) {
            w->oom = true;
            return;
        }
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->type = type;
    t->n_dims = n_dims;
    uint64_t n_el = 1;
    for (uint32_t i = 0; i < 4; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        n_el *= t->ne[i];
    }
    size_t bs = ggml_block_size(type);
    t->n_bytes = bs ? n_el / bs * ggml_type_size(type) : 0;
    t->data = malloc(t->n_bytes ? t->n_bytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        w->oom = true;
        return;
    }
    memcpy(t->data, data, t->n_bytes);
    w->n_t++;
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen)
{
    const uint64_t align = 32;
    wbuf h = { 0 };
    int rc = -1;
    FILE *f = NULL;
    if (w->oom || w->kv.oom) {
        snprintf(err, errlen, "%s: out of memory building the file", path);
        return -1;
    }
    wb_u32(&h, GGUF_MAGIC);
    wb_u32(&h, 3);
    wb_u64(&h, w->n_t);
    wb_u64(&h, w->n_kv);
    wb_put(&h, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        wb_str(&h, t->name);
        wb_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            wb_u64(&h, t->ne[d]);
        wb_u32(&h, t->type);
        wb_u64(&h, off);
        off += (t->n_bytes + align - 1) / align * align;
    }
    static const uint8_t zeros[32];
    while (h.n % align)
        wb_put(&h, zeros, 1);
    if (h.oom) {
        snprintf(err, errlen, "%s: out of memory building the header", path);
        goto out;
    }
    f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    bool ok = fwrite(h.p, 1, h.n, f) == h.n;
    for (uint64_t i = 0; ok && i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        size_t pad = (size_t)((t->n_bytes + align - 1) / align * align - t->n_bytes);
        ok = fwrite(t->data, 1, t->n_bytes, f) == t->n_bytes && fwrite(zeros, 1, pad, f) == pad;
    }
    if (fclose(f) != 0)
        ok = false;
    if (!ok) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    free(h.p);
    return rc;
}

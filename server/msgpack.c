/* msgpack.c - the MessagePack encoder (see msgpack.h).
 *
 * Every multi-byte number is big-endian, as the specification says.
 */
#include "msgpack.h"

#include <stdlib.h>
#include <string.h>

#include "fault.h"

void mp_init(mp_buf *b)
{
    memset(b, 0, sizeof *b);
}

void mp_deinit(mp_buf *b)
{
    free(b->data);
    mp_init(b);
}

void mp_reset(mp_buf *b)
{
    b->len = 0;
    b->failed = false;
}

static uint8_t *room(mp_buf *b, size_t n)
{
    if (b->failed)
        return NULL;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *d = FAULT_OR(realloc(b->data, cap));
        if (!d) {
            b->failed = true;
            return NULL;
        }
        b->data = d;
        b->cap = cap;
    }
    uint8_t *p = b->data + b->len;
    b->len += n;
    return p;
}

/* a type byte and then v in n big-endian bytes */
static void put_be(mp_buf *b, uint8_t type, uint64_t v, int n)
{
    uint8_t *p = room(b, 1 + (size_t)n);
    if (!p)
        return;
    p[0] = type;
    for (int i = 0; i < n; i++)
        p[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

void mp_nil(mp_buf *b)
{
    uint8_t *p = room(b, 1);
    if (p)
        *p = 0xc0;
}

void mp_bool(mp_buf *b, bool v)
{
    uint8_t *p = room(b, 1);
    if (p)
        *p = v ? 0xc3 : 0xc2;
}

void mp_uint(mp_buf *b, uint64_t v)
{
    if (v < 0x80) {                     /* positive fixint */
        uint8_t *p = room(b, 1);
        if (p)
            *p = (uint8_t)v;
    } else if (v <= 0xff) {
        put_be(b, 0xcc, v, 1);
    } else if (v <= 0xffff) {
        put_be(b, 0xcd, v, 2);
    } else if (v <= 0xffffffffu) {
        put_be(b, 0xce, v, 4);
    } else {
        put_be(b, 0xcf, v, 8);
    }
}

void mp_int(mp_buf *b, int64_t v)
{
    if (v >= 0) {
        mp_uint(b, (uint64_t)v);
    } else if (v >= -32) {              /* negative fixint: 111xxxxx */
        uint8_t *p = room(b, 1);
        if (p)
            *p = (uint8_t)(int8_t)v;
    } else if (v >= INT8_MIN) {
        put_be(b, 0xd0, (uint64_t)v & 0xff, 1);
    } else if (v >= INT16_MIN) {
        put_be(b, 0xd1, (uint64_t)v & 0xffff, 2);
    } else if (v >= INT32_MIN) {
        put_be(b, 0xd2, (uint64_t)v & 0xffffffffu, 4);
    } else {
        put_be(b, 0xd3, (uint64_t)v, 8);
    }
}

void mp_f64(mp_buf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put_be(b, 0xcb, u, 8);
}

/* a length header: fix form (fix_type | n) below fix_max, else 8/16/32-bit forms */
static void put_len(mp_buf *b, uint8_t fix_type, uint32_t fix_max, uint8_t t8, uint8_t t16, uint8_t t32, size_t n)
{
    if (fix_max && n < fix_max) {
        uint8_t *p = room(b, 1);
        if (p)
            *p = (uint8_t)(fix_type | n);
    } else if (t8 && n <= 0xff) {
        put_be(b, t8, n, 1);
    } else if (n <= 0xffff) {
        put_be(b, t16, n, 2);
    } else if (n <= 0xffffffffu) {
        put_be(b, t32, n, 4);
    } else {
        b->failed = true;               /* beyond the format */
    }
}

static void put_bytes(mp_buf *b, const void *s, size_t n)
{
    uint8_t *p = room(b, n);
    if (p && n)
        memcpy(p, s, n);
}

void mp_str(mp_buf *b, const char *s, size_t n)
{
    put_len(b, 0xa0, 32, 0xd9, 0xda, 0xdb, n);
    put_bytes(b, s, n);
}

void mp_cstr(mp_buf *b, const char *s)
{
    mp_str(b, s, strlen(s));
}

void mp_bin(mp_buf *b, const void *p, size_t n)
{
    put_len(b, 0, 0, 0xc4, 0xc5, 0xc6, n);
    put_bytes(b, p, n);
}

void mp_array(mp_buf *b, uint32_t n)
{
    put_len(b, 0x90, 16, 0, 0xdc, 0xdd, n);
}

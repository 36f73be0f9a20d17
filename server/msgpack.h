/* msgpack.h - the MessagePack encoder the KV events need (kvevents.c).
 *
 * Owns: appending nil, booleans, integers, float64, strings, binary and
 * array headers to a growing byte buffer, in the smallest form the
 * format allows for each value (what any decoder reads).
 * Does not own: decoding, maps, extension types (nothing here sends them).
 * ref: the MessagePack specification, https://github.com/msgpack/msgpack/blob/master/spec.md
 */
#ifndef HYSERVE_MSGPACK_H
#define HYSERVE_MSGPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Owned by its writer. After an allocation failure `failed` is set and
 * every later call does nothing: check it once at the end. */
typedef struct mp_buf {
    uint8_t *data;              /* [len] bytes written, capacity cap */
    size_t len, cap;
    bool failed;
} mp_buf;

void mp_init(mp_buf *b);
void mp_deinit(mp_buf *b);
void mp_reset(mp_buf *b);       /* len 0, keeps the memory */

void mp_nil(mp_buf *b);
void mp_bool(mp_buf *b, bool v);
void mp_uint(mp_buf *b, uint64_t v);
void mp_int(mp_buf *b, int64_t v);          /* non-negative values as mp_uint */
void mp_f64(mp_buf *b, double v);
void mp_str(mp_buf *b, const char *s, size_t n);
void mp_cstr(mp_buf *b, const char *s);
void mp_bin(mp_buf *b, const void *p, size_t n);
void mp_array(mp_buf *b, uint32_t n);       /* n items follow */

#endif

/* tokenizer.h - byte-level BPE (GPT-2 style) from GGUF tokenizer metadata.
 *
 * Owns: vocabulary, merge ranks, the GPT-2 byte<->unicode mapping, special
 * token matching, pre-tokenizer splitting, encode and decode.
 * Does not own: chat templates (server) or sampling.
 * ref: docs/models.md section 6.
 * Immutable after tok_new_from_gguf(): any thread may call encode/decode.
 */
#ifndef HYSERVE_TOKENIZER_H
#define HYSERVE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tokenizer tokenizer;

/* Build from tokenizer.ggml.* keys. Returns NULL with one line in err
 * (naming the problem) when the metadata is missing or malformed. */
tokenizer *tok_new_from_gguf(const gguf_ctx *g, char *err, size_t errlen);
void tok_free(tokenizer *t);

int tok_n_vocab(const tokenizer *t);
int32_t tok_bos(const tokenizer *t);        /* -1 if none */
int32_t tok_eos(const tokenizer *t);        /* -1 if none */
bool tok_add_bos(const tokenizer *t);
bool tok_is_eog(const tokenizer *t, int32_t id);  /* eos, eot, <|im_end|>, <|endoftext|>, ... */
bool tok_is_control(const tokenizer *t, int32_t id);
int32_t tok_lookup(const tokenizer *t, const char *text, size_t len); /* exact token string, -1 if none */

/* Encode. parse_special: CONTROL / USER_DEFINED tokens written literally in
 * the text are matched first and never split. Returns the token count (may
 * exceed max_out; only max_out are written), negative on error. */
int tok_encode(const tokenizer *t, const char *text, size_t len,
               bool parse_special, int32_t *out, int max_out);
/* Encode with control tokens parsed everywhere but in the data spans:
 * data[2i] .. data[2i + 1] for i < n_data, sorted, disjoint byte ranges
 * [start, end) of text that came from users (chat message content). A
 * special token is matched only where none of its bytes lies in a span,
 * so "<|im_end|>" typed in a message is text, while the template's own
 * markup around it stays control tokens; the text between control tokens
 * is encoded whole, as tok_encode does. n_data 0: specials anywhere
 * (tok_encode with parse_special); n_data < 0: none at all (without). */
int tok_encode_data(const tokenizer *t, const char *text, size_t len, const size_t *data, int n_data,
                    int32_t *out, int max_out);

/* Pre-tokenizer only (tests and tools): splits text[0..len) with this
 * vocabulary's tokenizer.ggml.pre rule, no special-token matching, and
 * writes the end byte offset of each piece to ends. Returns the piece
 * count (may exceed max_ends; only max_ends are written), negative on
 * error. */
int tok_pre_split(const tokenizer *t, const char *text, size_t len,
                  size_t *ends, int max_ends);

/* Raw bytes of one token (byte-level mapping undone). CONTROL tokens give
 * their literal text. Returns the byte count (may exceed cap), -1 if the
 * id is out of range. */
int tok_piece(const tokenizer *t, int32_t id, char *buf, size_t cap);

/* Length of the longest prefix of buf[0..n) that is complete UTF-8 (a
 * trailing partial sequence is held back for the next piece). Invalid
 * bytes count as complete so they never stall a stream. */
size_t utf8_complete_prefix(const char *buf, size_t n);

/* GPT-2 bytes_to_unicode: the code point that stands for byte b. */
uint32_t tok_byte_to_cp(uint8_t b);

#endif

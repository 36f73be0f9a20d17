/* fuzz_tokenizer.c - libFuzzer target: building the tokenizer from GGUF
 * metadata (tokenizer.ggml.tokens, token_type, merges, special ids, pre).
 *
 * Input: a whole GGUF file. Properties: tok_new_from_gguf either succeeds
 * or fails with a message; on success the special ids (bos, eos) are -1
 * or inside the vocabulary, every id's piece can be read and ids outside
 * the vocabulary are refused (-1, not a read past the table), the class
 * predicates take any id, and encoding a few fixed texts (with and without
 * special-token parsing, and with the text as data) gives ids inside the
 * vocabulary, never more ids than bytes.
 */
#include <string.h>

#include "fuzz.h"
#include "gguf.h"
#include "tokenizer.h"

static void check_encode(const tokenizer *t, const char *text, size_t len)
{
    int32_t ids[256];
    const int n_vocab = tok_n_vocab(t);
    for (int mode = 0; mode < 3; mode++) {
        size_t span[2] = { 0, len };
        int n = mode == 0   ? tok_encode(t, text, len, false, ids, 256)
                : mode == 1 ? tok_encode(t, text, len, true, ids, 256)
                            : tok_encode_data(t, text, len, span, len ? 1 : 0, ids, 256);
        if (n < 0)
            continue;           /* an error value, not a crash */
        FUZZ_CHECK((size_t)n <= len);
        for (int i = 0; i < n && i < 256; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    if (!path)
        return 0;
    char err[512];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g)
        return 0;
    err[0] = 0;
    tokenizer *t = tok_new_from_gguf(g, err, sizeof err);
    FUZZ_CHECK(t || err[0]);
    if (t) {
        const int n = tok_n_vocab(t);
        FUZZ_CHECK(n > 0);
        FUZZ_CHECK(tok_bos(t) >= -1 && tok_bos(t) < n);
        FUZZ_CHECK(tok_eos(t) >= -1 && tok_eos(t) < n);
        char buf[64];
        const int lim = n < 4096 ? n : 4096;
        for (int id = -2; id < lim + 2; id++) {
            int r = tok_piece(t, id, buf, sizeof buf);
            FUZZ_CHECK(id >= 0 && id < n ? r >= 0 : r == -1);
            (void)tok_is_eog(t, id);
            (void)tok_is_control(t, id);
        }
        (void)tok_piece(t, INT32_MAX, buf, sizeof buf);
        (void)tok_is_eog(t, INT32_MIN);
        static const char *const texts[] = {
            "", "Hello, world!", "<|im_start|>user\nhi<|im_end|>", "  \t\n12345 abc's",
            "\xff\xfe\xc3(\xe4\xb8", "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", "<|endoftext|><s></s>",
        };
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
            check_encode(t, texts[i], strlen(texts[i]));
        /* the file's own last bytes as text */
        size_t k = size < 48 ? size : 48;
        check_encode(t, (const char *)data + size - k, k);
        tok_free(t);
    }
    gguf_close(g);
    return 0;
}

/* fuzz_tokenize.c - libFuzzer target: encode and decode arbitrary bytes
 * with real vocabularies.
 *
 * Vocabularies: models/default.gguf (4,096-token byte-level BPE, committed)
 * and, when present, tests/tmp/qwen3-tokenizer.gguf (Qwen3's 151,936 tokens
 * and control tokens; `make test` builds it first). FUZZ_ROOT names the
 * repository when the target runs from elsewhere.
 * Input: byte 0 picks the vocabulary and the mode, the rest is the text.
 * Properties (from the byte-level BPE contract, docs/models.md 6):
 *  - without special-token parsing the pieces of the ids concatenate back
 *    to the input bytes exactly (every byte has a token, nothing is lost);
 *  - the whole text given as one data span encodes exactly as without
 *    special-token parsing (content is never markup);
 *  - with parsing, the pieces still concatenate back to the input;
 *  - every id is inside the vocabulary; never more ids than bytes;
 *  - the pre-tokenizer's piece ends rise strictly and end at the length;
 *  - utf8_complete_prefix never exceeds the length.
 */
#include <string.h>

#include "fuzz.h"
#include "gguf.h"
#include "tokenizer.h"

#define MAX_TEXT 4096

static tokenizer *toks[2];
static int n_toks;

static void load(const char *rel)
{
    const char *root = getenv("FUZZ_ROOT");
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s%s%s", root ? root : "", root ? "/" : "", rel);
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g)
        return;
    tokenizer *t = tok_new_from_gguf(g, err, sizeof err);
    gguf_close(g);      /* the tokenizer keeps copies */
    if (t)
        toks[n_toks++] = t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    load("models/default.gguf");
    if (n_toks == 0) {
        fprintf(stderr, "fuzz_tokenize: cannot load models/default.gguf (set FUZZ_ROOT)\n");
        exit(1);
    }
    load("tests/tmp/qwen3-tokenizer.gguf");
    return 0;
}

/* The pieces of ids[0..n) concatenated into out; returns the length. */
static size_t decode(const tokenizer *t, const int32_t *ids, int n, char *out, size_t cap)
{
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        int r = tok_piece(t, ids[i], out + len, cap - len);
        FUZZ_CHECK(r >= 0 && (size_t)r <= cap - len);
        len += (size_t)r;
    }
    return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > MAX_TEXT + 1)
        return 0;
    const tokenizer *t = toks[(data[0] & 1) % n_toks];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const int n_vocab = tok_n_vocab(t);
    static int32_t ids[MAX_TEXT + 8], ids2[MAX_TEXT + 8];
    static char back[MAX_TEXT * 8];
    static size_t ends[MAX_TEXT + 8];

    int n = tok_encode(t, text, len, false, ids, MAX_TEXT + 8);
    FUZZ_CHECK(n >= 0 && (size_t)n <= len);
    for (int i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab);
    size_t bl = decode(t, ids, n, back, sizeof back);
    FUZZ_CHECK(bl == len && memcmp(back, text, len) == 0);

    if (data[0] & 2) {
        size_t span[2] = { 0, len };
        int n2 = tok_encode_data(t, text, len, span, len ? 1 : 0, ids2, MAX_TEXT + 8);
        FUZZ_CHECK(n2 == n && memcmp(ids, ids2, (size_t)n * sizeof *ids) == 0);
    } else {
        int n2 = tok_encode(t, text, len, true, ids2, MAX_TEXT + 8);
        FUZZ_CHECK(n2 >= 0 && (size_t)n2 <= len);
        for (int i = 0; i < n2; i++)
            FUZZ_CHECK(ids2[i] >= 0 && ids2[i] < n_vocab);
        bl = decode(t, ids2, n2, back, sizeof back);
        FUZZ_CHECK(bl == len && memcmp(back, text, len) == 0);
    }
    /* a short output buffer: the count is the same, only max_out written */
    if (n > 1) {
        int n3 = tok_encode(t, text, len, false, ids2, 1);
        FUZZ_CHECK(n3 == n && ids2[0] == ids[0]);
    }

    int np = tok_pre_split(t, text, len, ends, MAX_TEXT + 8);
    FUZZ_CHECK(np >= 0 && (size_t)np <= len);
    for (int i = 0; i < np; i++)
        FUZZ_CHECK(ends[i] <= len && (i == 0 ? ends[i] > 0 : ends[i] > ends[i - 1]));
    FUZZ_CHECK(np == 0 ? len == 0 : ends[np - 1] == len);
    FUZZ_CHECK(utf8_complete_prefix(text, len) <= len);
    return 0;
}

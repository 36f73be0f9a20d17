/* fuzz_grammar.c - libFuzzer target: the structured-output compiler
 * (grammar/grammar.h) and the token matcher it drives.
 *
 * Input: byte 0 picks the source kind (a JSON Schema, a regular
 * expression, an OpenAI tools array as Qwen's calls, a GBNF grammar, or a
 * tools array as Llama 3.1's call); the bytes up to the first NUL are
 * the source, the bytes after it steer a walk of at most 48 tokens over a
 * small vocabulary (the 256 single bytes, some multi-byte JSON pieces, a
 * two-byte UTF-8 letter, a lone continuation byte and an end-of-generation
 * token).
 * Properties: compiling either gives a grammar or names the problem; the
 * same source compiles the same way twice; at every step of the walk the
 * mask lets through exactly the tokens the byte-level check
 * (gram_matcher_can_accept_bytes) allows, every allowed token is accepted
 * and every refused one is refused without changing the state; the
 * matcher says "accepting" exactly when the grammar, run on the walk's
 * whole output, accepts it; end of generation is allowed only there.
 */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "grammar.h"

#define N_BYTES 256
static const char *const multi[] = {"{\"", "\":", "\",\"", "true", "null", "-0.0e+5", "\\u00", "\\ud83d",
                                    "\xc3\xa9", "\x80", "  ", "\n", "},", "]}"};
#define N_MULTI ((int)(sizeof multi / sizeof *multi))
#define EOG_ID (N_BYTES + N_MULTI)
#define N_VOCAB (EOG_ID + 1)
#define MAX_WALK 48

static int piece(const void *ctx, int32_t id, char *buf, size_t cap, int *kind)
{
    (void)ctx;
    *kind = GRAM_TOK_TEXT;
    if (id < 0 || id >= N_VOCAB)
        return -1;
    if (id == EOG_ID) {
        *kind = GRAM_TOK_EOG;
        return 0;
    }
    if (id < N_BYTES) {
        if (cap > 0)
            buf[0] = (char)id;
        return 1;
    }
    size_t n = strlen(multi[id - N_BYTES]);
    memcpy(buf, multi[id - N_BYTES], n < cap ? n : cap);
    return (int)n;
}

static grammar *compile(int mode, const char *src, size_t len, char *err, size_t errlen)
{
    grammar_opts o = {0};
    err[0] = 0;
    switch (mode) {
    case 0: return grammar_compile_json_schema(src, len, &o, err, errlen);
    case 1: return grammar_compile_regex(src, len, err, errlen);
    case 3: return grammar_compile_gbnf(src, len, err, errlen);
    case 4: return grammar_compile_llama_tool_call(src, len, NULL, &o, err, errlen);
    default: return grammar_compile_tool_calls(src, len, NULL, true, &o, err, errlen);
    }
}

static gram_vocab *vocab(void)
{
    static gram_vocab *v;
    if (!v) {
        char err[128];
        v = gram_vocab_new(N_VOCAB, piece, NULL, err, sizeof err);
        FUZZ_CHECK(v != NULL);
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const int mode = data[0] % 5;
    const uint8_t *z = memchr(data + 1, 0, size - 1);
    const size_t src_len = z ? (size_t)(z - (data + 1)) : size - 1;
    const uint8_t *walk = z ? z + 1 : data + size;
    const size_t n_walk = (size_t)(data + size - walk);
    char *src = malloc(src_len + 1);
    if (!src)
        return 0;
    memcpy(src, data + 1, src_len);
    src[src_len] = 0;

    char err[256], err2[256];
    grammar *g = compile(mode, src, src_len, err, sizeof err);
    grammar *g2 = compile(mode, src, src_len, err2, sizeof err2);
    FUZZ_CHECK(!g == !g2);
    if (!g) {
        FUZZ_CHECK(err[0] && !strcmp(err, err2));
        free(src);
        return 0;
    }
    gram_matcher *m = gram_matcher_new(g, vocab());
    if (!m) {
        grammar_free(g2);
        free(src);
        return 0;
    }
    static float logits[N_VOCAB];
    char out[MAX_WALK * 8];
    size_t n_out = 0;
    for (size_t step = 0; step < MAX_WALK && step < n_walk; step++) {
        for (int t = 0; t < N_VOCAB; t++)
            logits[t] = 0.0f;
        int left = gram_matcher_mask(m, logits);
        if (left < 0)
            break;      /* an internal limit: the server ends the request there */
        int allowed[N_VOCAB], n_allowed = 0;
        for (int t = 0; t < N_VOCAB; t++) {
            const bool ok = !isinf(logits[t]);
            if (t != EOG_ID) {
                char b[16];
                int kind, n = piece(NULL, t, b, sizeof b, &kind);
                FUZZ_CHECK(ok == gram_matcher_can_accept_bytes(m, b, (size_t)n));
            } else {
                FUZZ_CHECK(ok == gram_matcher_accepting(m));
            }
            if (ok)
                allowed[n_allowed++] = t;
        }
        FUZZ_CHECK(n_allowed == left);
        /* a refused token leaves the state as it was */
        const int bad = (walk[step] * 7 + 3) % N_VOCAB;
        if (isinf(logits[bad]) && bad != EOG_ID) {
            FUZZ_CHECK(gram_matcher_accept_token(m, bad) == -1);
        }
        if (n_allowed == 0)
            break;
        const int t = allowed[walk[step] % n_allowed];
        FUZZ_CHECK(gram_matcher_accept_token(m, t) == 0);
        if (t == EOG_ID)
            break;
        char b[16];
        int kind, n = piece(NULL, t, b, sizeof b, &kind);
        memcpy(out + n_out, b, (size_t)n);
        n_out += (size_t)n;
    }
    if (gram_matcher_active(m))
        FUZZ_CHECK(gram_matcher_accepting(m) == grammar_accepts(g2, out, n_out));
    gram_matcher_free(m);
    grammar_free(g2);
    free(src);
    return 0;
}

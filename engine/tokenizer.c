/* tokenizer.c - byte-level BPE (GPT-2 style) from GGUF tokenizer metadata.
 *
 * Owns: loading tokenizer.ggml.* (tokens, token_type, merges, pre, special
 * ids), the GPT-2 byte<->unicode map, special-token matching, the
 * pre-tokenizer splitters, the BPE merge loop, and per-token decoding.
 * Does not own: chat templates, BOS insertion (the caller prepends tok_bos()
 * when tok_add_bos() says so), sampling.
 * ref: docs/models.md section 6; the pre-tokenizer regexes
 * of Hugging Face tokenizer.json (qwen2, qwen35, llama-bpe, gpt2) are
 * implemented as hand-written leftmost-first matchers over code points;
 * Unicode categories come from unicode_tables.h (tools/gen_unicode.py).
 *
 * Pipeline of tok_encode():
 *   text --(parse_special: leftmost-longest CONTROL/USER_DEFINED match)--> segments
 *   segment --utf8 decode + category flags--> code points
 *   code points --pre-tokenizer matcher--> pieces (byte ranges of the text)
 *   piece bytes --byte map--> one symbol per byte (token id of that char)
 *   symbols --merge lowest-rank adjacent pair, leftmost first--> token ids
 *
 * Invalid UTF-8 in the input is kept byte-exact: each invalid byte becomes
 * one pseudo code point of category "other" (like U+FFFD) for splitting,
 * but its piece still carries the original byte, so decode(encode(x)) == x.
 */
#include "tokenizer.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "unicode_tables.h"

/* token_type values written by llama.cpp's converter */
enum {
    TOK_T_UNDEFINED = 0, TOK_T_NORMAL = 1, TOK_T_UNKNOWN = 2, TOK_T_CONTROL = 3,
    TOK_T_USER_DEFINED = 4, TOK_T_UNUSED = 5, TOK_T_BYTE = 6,
};

/* Pre-tokenizer rules (tokenizer.ggml.pre). */
enum tok_pre {
    TOK_PRE_GPT2,       /* "gpt2", "default", absent or unknown */
    TOK_PRE_LLAMA3,     /* "llama-bpe": digits in runs of up to 3, ignore_merges */
    TOK_PRE_QWEN2,      /* "qwen2": digits one per piece */
    TOK_PRE_QWEN35,     /* "qwen35": qwen2 with \p{M} counted as letters */
};

#define TOK_MAX_VOCAB (1 << 26)     /* keeps every count and offset in int32 */
#define TOK_MAX_EOG 16

/* One vocabulary entry. Offsets index tokenizer.arena. */
typedef struct tok_entry {
    uint32_t text_off;      /* token string as stored in the GGUF */
    uint32_t text_len;
    uint32_t piece_off;     /* raw bytes it decodes to (byte map undone) */
    uint32_t piece_len;
    int32_t type;           /* TOK_T_* */
} tok_entry;

/* string -> token id, open addressing; id -1 = empty slot */
typedef struct tok_str_slot {
    uint32_t hash;
    int32_t id;
} tok_str_slot;

/* (left id, right id) -> merge rank and merged id; left -1 = empty slot */
typedef struct tok_pair_slot {
    int32_t left;
    int32_t right;
    int32_t rank;           /* index in tokenizer.ggml.merges; lower merges first */
    int32_t merged;         /* token id of left+right */
} tok_pair_slot;

/* The tokenizer. Owned by whoever built it (the engine); immutable after
 * tok_new_from_gguf(), so any thread may encode/decode concurrently. */
struct tokenizer {
    int32_t n_vocab;
    tok_entry *tokens;      /* [n_vocab] */
    char *arena;            /* token strings and decoded pieces */
    size_t arena_n, arena_cap;

    tok_str_slot *str_tab;  /* [str_cap], str_cap a power of two >= 2*n_vocab */
    uint32_t str_cap;
    tok_pair_slot *pair_tab;/* [pair_cap], a power of two >= 2*n_merges */
    uint32_t pair_cap;
    int32_t n_merges;       /* merges usable (parts and result in the vocab) */

    int32_t byte_tok[256];  /* token id of the single mapped char of each byte, -1 if none */

    int32_t *specials;      /* [n_specials] CONTROL/USER_DEFINED ids, sorted by first byte, then longest */
    int32_t n_specials;
    int32_t special_start[257]; /* specials[special_start[b] .. special_start[b+1]) start with byte b */

    enum tok_pre pre;
    int32_t bos, eos, eot, unk;  /* -1 if none */
    bool add_bos;
    int32_t eog[TOK_MAX_EOG];
    int n_eog;
};

/* ------------------------------------------------------------------ */
/* Errors                                                              */

static void tok_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void tok_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    int n = snprintf(err, errlen, "tokenizer: ");
    if (n < 0 || (size_t)n >= errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Printable excerpt of an untrusted string for error messages. */
static const char *tok_excerpt(const char *s, size_t n, char *buf, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[k++] = (c >= 0x20 && c < 0x7f && c != '"') ? (char)c : '?';
    }
    if (n > 0 && k + 4 >= cap && k >= 3) {
        buf[k - 3] = buf[k - 2] = buf[k - 1] = '.';
    }
    buf[k] = 0;
    return buf;
}

/* ------------------------------------------------------------------ */
/* UTF-8 and the GPT-2 byte map                                        */

/* Is b a valid second byte after lead byte c? (Rejects overlongs,
 * surrogates and code points above U+10FFFF.) */
static bool utf8_second_ok(uint8_t c, uint8_t b)
{
    if (c == 0xE0) return b >= 0xA0 && b <= 0xBF;
    if (c == 0xED) return b >= 0x80 && b <= 0x9F;
    if (c == 0xF0) return b >= 0x90 && b <= 0xBF;
    if (c == 0xF4) return b >= 0x80 && b <= 0x8F;
    return (b & 0xC0) == 0x80;
}

/* Sequence length announced by a lead byte; 0 if it cannot start one. */
static int utf8_lead_len(uint8_t c)
{
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

#define UTF8_INVALID UINT32_MAX

/* Decodes one code point from s[0..n), n >= 1. Returns the bytes used
 * (>= 1); *cp = UTF8_INVALID for an invalid or truncated sequence, which
 * then consumes exactly one byte. */
static int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t c = s[0];
    int len = utf8_lead_len(c);
    *cp = UTF8_INVALID;
    if (len == 1) {
        *cp = c;
        return 1;
    }
    if (len == 0 || (size_t)len > n || !utf8_second_ok(c, s[1]))
        return 1;
    for (int k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80)
            return 1;
    uint32_t v = (uint32_t)c & (0xFFu >> (len + 1));
    for (int k = 1; k < len; k++)
        v = (v << 6) | (s[k] & 0x3Fu);
    *cp = v;
    return len;
}

static int utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static bool utf8_valid(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        i += (size_t)utf8_decode(p + i, n - i, &cp);
        if (cp == UTF8_INVALID)
            return false;
    }
    return true;
}

size_t utf8_complete_prefix(const char *buf, size_t n)
{
    const uint8_t *p = (const uint8_t *)buf;
    if (!buf || n == 0)
        return 0;
    /* find the lead byte of the last sequence, at most 3 bytes back */
    size_t k = 1;
    while (k <= 3 && k <= n && (p[n - k] & 0xC0) == 0x80)
        k++;
    if (k > 3 || k > n)
        return n;               /* only stray continuation bytes: invalid, complete */
    size_t lead = n - k;
    int need = utf8_lead_len(p[lead]);
    if (need <= 1 || (size_t)need <= k)
        return n;               /* ASCII, invalid lead, or the sequence is whole */
    /* k < need bytes present: hold back only if they are a valid prefix */
    if (k >= 2 && !utf8_second_ok(p[lead], p[lead + 1]))
        return n;
    return lead;
}

/* GPT-2 bytes_to_unicode: printable bytes 33..126, 161..172, 174..255 keep
 * their value; the other 68 (0..32, 127..160, 173), in increasing order,
 * become U+0100 .. U+0143. */
uint32_t tok_byte_to_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256u + b;                /* 0x00 -> U+0100, 0x20 -> U+0120 */
    if (b <= 160)
        return 256u + 33u + (b - 127u); /* 0x7F -> U+0121, 0xA0 -> U+0142 */
    return 256u + 67u;                  /* 0xAD -> U+0143 */
}

/* Inverse map: code point -> byte, -1 when cp is not a byte's stand-in. */
static int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) {
        return ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174) ? (int)cp : -1;
    }
    if (cp <= 256 + 32)
        return (int)(cp - 256);
    if (cp <= 256 + 66)
        return (int)(cp - 256 - 33 + 127);
    if (cp == 256 + 67)
        return 173;
    return -1;
}

/* ------------------------------------------------------------------ */
/* Unicode categories                                                  */

enum {
    CP_L = 1,       /* \p{L} */
    CP_N = 2,       /* \p{N} */
    CP_M = 4,       /* \p{M} */
    CP_S = 8,       /* \s (White_Space) */
};

static bool in_ranges(const unicode_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

#define N_RANGES(a) (sizeof(a) / sizeof((a)[0]))

static uint8_t cp_flags(uint32_t cp)
{
    if (cp == UTF8_INVALID)
        return 0;               /* like U+FFFD (So): neither L, N, M nor space */
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
            return CP_L;
        if (cp >= '0' && cp <= '9')
            return CP_N;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
            return CP_S;
        return 0;
    }
    uint8_t f = 0;
    if (in_ranges(unicode_letter, N_RANGES(unicode_letter), cp))
        f |= CP_L;
    else if (in_ranges(unicode_number, N_RANGES(unicode_number), cp))
        f |= CP_N;
    else if (in_ranges(unicode_mark, N_RANGES(unicode_mark), cp))
        f |= CP_M;
    else if (in_ranges(unicode_whitespace, N_RANGES(unicode_whitespace), cp))
        f |= CP_S;
    return f;
}

/* ------------------------------------------------------------------ */
/* Pre-tokenizer                                                       */

/* A decoded run of text: code point i spans bytes off[i] .. off[i+1). */
typedef struct tok_cps {
    uint32_t *cp;       /* [n] code point, UTF8_INVALID for a stray byte */
    uint8_t *fl;        /* [n] CP_* flags */
    size_t *off;        /* [n + 1] byte offsets into the text */
    size_t n;
} tok_cps;

static bool is_nl(uint32_t c)
{
    return c == '\r' || c == '\n';
}

static uint32_t ascii_lower(uint32_t c)
{
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* 's 't 're 've 'm 'll 'd at i; returns the match length or 0.
 * Case-insensitive as (?i:...) for qwen2/llama3, ASCII only like
 * llama.cpp's spelling '[sS]|'[tT]|... (Oniguruma would also fold U+017F). */
static size_t match_contraction(const tok_cps *c, size_t i, bool fold)
{
    if (c->cp[i] != '\'' || i + 1 >= c->n)
        return 0;
    uint32_t a = c->cp[i + 1], b = i + 2 < c->n ? c->cp[i + 2] : 0;
    if (fold) {
        a = ascii_lower(a);
        b = ascii_lower(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* One match of the llama3 / qwen2 / qwen35 regex at i (i < n); returns the
 * end index. The regex, alternatives tried left to right:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)      contractions
 *   |[^\r\n\p{L}\p{N}]?LET+           LET = \p{L}, or [\p{L}\p{M}] for qwen35
 *   |\p{N}{1,max_digits}              qwen: 1, llama3: 3
 *   | ?PUN+[\r\n]*                    PUN = [^\s\p{L}\p{N}] (qwen35: also not \p{M})
 *   |\s*[\r\n]+
 *   |\s+(?!\S)
 *   |\s+                                                                    */
static size_t pre_match_llama(const tok_cps *c, size_t i, size_t max_digits, bool marks)
{
    const size_t n = c->n;
    const uint8_t *fl = c->fl;
    const uint8_t let = marks ? (CP_L | CP_M) : CP_L;
    const uint8_t not_pun = CP_S | CP_N | let;
    size_t j;

    size_t k = match_contraction(c, i, true);
    if (k)
        return i + k;

    /* [^\r\n\p{L}\p{N}]?LET+ : the optional prefix is tried first, then
     * without it; both give "letters from i" when cp[i] is a letter. */
    if (fl[i] & let) {
        j = i + 1;
        while (j < n && (fl[j] & let))
            j++;
        return j;
    }
    if (!is_nl(c->cp[i]) && !(fl[i] & (CP_L | CP_N)) && i + 1 < n && (fl[i + 1] & let)) {
        j = i + 2;
        while (j < n && (fl[j] & let))
            j++;
        return j;
    }

    /* \p{N}{1,max} */
    if (fl[i] & CP_N) {
        j = i + 1;
        while (j < n && j - i < max_digits && (fl[j] & CP_N))
            j++;
        return j;
    }

    /*  ?PUN+[\r\n]* */
    j = SIZE_MAX;
    if (c->cp[i] == ' ' && i + 1 < n && !(fl[i + 1] & not_pun))
        j = i + 1;
    else if (!(fl[i] & not_pun))
        j = i;
    if (j != SIZE_MAX) {
        while (j < n && !(fl[j] & not_pun))
            j++;
        while (j < n && is_nl(c->cp[j]))
            j++;
        return j;
    }

    /* what is left is whitespace (anything else matched above) */
    j = i;
    while (j < n && (fl[j] & CP_S))
        j++;
    if (j == i)
        return i + 1;               /* unreachable: every code point is L, N, M, S or other */
    /* \s*[\r\n]+ : greedy \s* backs off to the last \r or \n of the run */
    for (size_t e = j; e > i; e--)
        if (is_nl(c->cp[e - 1]))
            return e;
    /* \s+(?!\S) : the whole run at the end of text, else all but its last */
    if (j == n || j - i == 1)
        return j;                   /* (the single-space case is \s+) */
    return j - 1;
}

/* One match of the GPT-2 regex at i:
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t pre_match_gpt2(const tok_cps *c, size_t i)
{
    const size_t n = c->n;
    const uint8_t *fl = c->fl;
    static const uint8_t classes[3] = { CP_L, CP_N, 0 };   /* 0 = the "other" class */
    size_t j;

    size_t k = match_contraction(c, i, false);
    if (k)
        return i + k;

    for (int b = 0; b < 3; b++) {
        uint8_t want = classes[b];
        /* class test: L, N, or (for b == 2) not S, L, N */
#define IN_CLASS(x) (want ? (fl[x] & want) != 0 : !(fl[x] & (CP_S | CP_L | CP_N)))
        size_t s = SIZE_MAX;
        if (c->cp[i] == ' ' && i + 1 < n && IN_CLASS(i + 1))
            s = i + 1;
        else if (IN_CLASS(i))
            s = i;
        if (s != SIZE_MAX) {
            j = s + 1;
            while (j < n && IN_CLASS(j))
                j++;
            return j;
        }
#undef IN_CLASS
    }

    j = i;
    while (j < n && (fl[j] & CP_S))
        j++;
    if (j == i)
        return i + 1;
    if (j == n || j - i == 1)
        return j;
    return j - 1;
}

static size_t pre_match(enum tok_pre pre, const tok_cps *c, size_t i)
{
    switch (pre) {
    case TOK_PRE_QWEN2:  return pre_match_llama(c, i, 1, false);
    case TOK_PRE_QWEN35: return pre_match_llama(c, i, 1, true);
    case TOK_PRE_LLAMA3: return pre_match_llama(c, i, 3, false);
    case TOK_PRE_GPT2:   break;
    }
    return pre_match_gpt2(c, i);
}

/* Decodes text[0..len) into c (arrays sized by the caller for len). */
static void tok_decode_cps(const char *text, size_t len, tok_cps *c)
{
    const uint8_t *p = (const uint8_t *)text;
    size_t i = 0, n = 0;
    while (i < len) {
        uint32_t cp;
        int used = utf8_decode(p + i, len - i, &cp);
        c->cp[n] = cp;
        c->fl[n] = cp_flags(cp);
        c->off[n] = i;
        n++;
        i += (size_t)used;
    }
    c->off[n] = len;
    c->n = n;
}

static int tok_cps_alloc(tok_cps *c, size_t len)
{
    c->cp = FAULT_OR(malloc((len + 1) * sizeof *c->cp));
    c->fl = FAULT_OR(malloc(len + 1));
    c->off = FAULT_OR(malloc((len + 1) * sizeof *c->off));
    c->n = 0;
    return (c->cp && c->fl && c->off) ? 0 : -1;
}

static void tok_cps_free(tok_cps *c)
{
    free(c->cp);
    free(c->fl);
    free(c->off);
}

int tok_pre_split(const tokenizer *t, const char *text, size_t len,
                  size_t *ends, int max_ends)
{
    tok_cps c;
    int count = 0;
    if (!t || (!text && len) || max_ends < 0 || (!ends && max_ends > 0))
        return -1;
    if (tok_cps_alloc(&c, len) < 0) {
        tok_cps_free(&c);
        return -1;
    }
    tok_decode_cps(text, len, &c);
    for (size_t i = 0; i < c.n;) {
        size_t e = pre_match(t->pre, &c, i);
        if (count < max_ends)
            ends[count] = c.off[e];
        if (count == INT_MAX) {
            count = -1;
            break;
        }
        count++;
        i = e;
    }
    tok_cps_free(&c);
    return count;
}

/* ------------------------------------------------------------------ */
/* Hash tables                                                         */

static uint32_t hash_bytes(const char *s, size_t n)
{
    /* FNV-1a 64 folded to 32 bits */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static uint32_t hash_pair(int32_t a, int32_t b)
{
    uint64_t x = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint32_t)x;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

static int32_t str_find(const tokenizer *t, const char *s, size_t n)
{
    if (!t->str_tab || n == 0)
        return -1;
    uint32_t h = hash_bytes(s, n);
    uint32_t mask = t->str_cap - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        const tok_str_slot *sl = &t->str_tab[i];
        if (sl->id < 0)
            return -1;
        if (sl->hash == h) {
            const tok_entry *e = &t->tokens[sl->id];
            if (e->text_len == n && memcmp(t->arena + e->text_off, s, n) == 0)
                return sl->id;
        }
    }
}

/* Inserts token id under its text unless that text is already present
 * (the first id with a given text wins). */
static void str_insert(tokenizer *t, int32_t id)
{
    const tok_entry *e = &t->tokens[id];
    const char *s = t->arena + e->text_off;
    uint32_t h = hash_bytes(s, e->text_len);
    uint32_t mask = t->str_cap - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        tok_str_slot *sl = &t->str_tab[i];
        if (sl->id < 0) {
            sl->hash = h;
            sl->id = id;
            return;
        }
        if (sl->hash == h) {
            const tok_entry *o = &t->tokens[sl->id];
            if (o->text_len == e->text_len && memcmp(t->arena + o->text_off, s, e->text_len) == 0)
                return;
        }
    }
}

static const tok_pair_slot *pair_find(const tokenizer *t, int32_t a, int32_t b)
{
    if (!t->pair_tab || a < 0 || b < 0)
        return NULL;
    uint32_t mask = t->pair_cap - 1;
    for (uint32_t i = hash_pair(a, b) & mask;; i = (i + 1) & mask) {
        const tok_pair_slot *sl = &t->pair_tab[i];
        if (sl->left < 0)
            return NULL;
        if (sl->left == a && sl->right == b)
            return sl;
    }
}

/* Keeps the lowest rank when a pair is listed twice. */
static bool pair_insert(tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    uint32_t mask = t->pair_cap - 1;
    for (uint32_t i = hash_pair(a, b) & mask;; i = (i + 1) & mask) {
        tok_pair_slot *sl = &t->pair_tab[i];
        if (sl->left < 0) {
            sl->left = a;
            sl->right = b;
            sl->rank = rank;
            sl->merged = merged;
            return true;
        }
        if (sl->left == a && sl->right == b)
            return false;
    }
}

/* ------------------------------------------------------------------ */
/* Loading                                                             */

static int arena_put(tokenizer *t, const char *s, size_t n, uint32_t *off)
{
    if (t->arena_n + n > UINT32_MAX)
        return -1;
    if (t->arena_n + n > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
        while (cap < t->arena_n + n)
            cap *= 2;
        char *p = FAULT_OR(realloc(t->arena, cap));
        if (!p)
            return -1;
        t->arena = p;
        t->arena_cap = cap;
    }
    if (n)
        memcpy(t->arena + t->arena_n, s, n);
    *off = (uint32_t)t->arena_n;
    t->arena_n += n;
    return 0;
}

/* Computes the raw bytes of token id (byte map undone for NORMAL and
 * other byte-level tokens; CONTROL and USER_DEFINED are literal text, as
 * llama.cpp's converter stores them unmapped) and appends them. */
static int tok_build_piece(tokenizer *t, int32_t id)
{
    tok_entry *e = &t->tokens[id];
    if (e->type == TOK_T_CONTROL || e->type == TOK_T_USER_DEFINED) {
        e->piece_off = e->text_off;
        e->piece_len = e->text_len;
        return 0;
    }
    char tmp[256];
    size_t start = t->arena_n;
    const uint8_t *s;
    size_t i = 0, n = e->text_len;
    while (i < n) {
        /* re-read: arena may move when arena_put grows it */
        s = (const uint8_t *)t->arena + e->text_off;
        size_t k = 0;
        while (i < n && k + 4 <= sizeof tmp) {
            uint32_t cp;
            int used = utf8_decode(s + i, n - i, &cp);
            int b = tok_cp_to_byte(cp);
            if (b >= 0)
                tmp[k++] = (char)b;
            else
                k += (size_t)utf8_encode(cp, tmp + k);  /* not a byte stand-in: keep the char */
            i += (size_t)used;
        }
        uint32_t off;
        if (arena_put(t, tmp, k, &off) < 0)
            return -1;
    }
    e->piece_off = (uint32_t)start;
    e->piece_len = (uint32_t)(t->arena_n - start);
    return 0;
}

/* Reads an optional integer token id key: -1 when absent; error when
 * present with a non-integer type or outside [0, n_vocab). */
static int read_id(const gguf_ctx *g, const char *key, int32_t n_vocab, int32_t *out,
                   char *err, size_t errlen)
{
    int64_t v;
    *out = -1;
    if (!gguf_find_kv(g, key))
        return 0;
    if (!gguf_get_i64(g, key, &v)) {
        tok_err(err, errlen, "%s is not an integer", key);
        return -1;
    }
    if (v < 0 || v >= n_vocab) {
        tok_err(err, errlen, "%s = %lld is outside the vocabulary [0, %d)", key,
                (long long)v, (int)n_vocab);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static enum tok_pre tok_pre_from_name(const char *pre)
{
    if (!pre)
        return TOK_PRE_GPT2;
    if (strcmp(pre, "qwen2") == 0)
        return TOK_PRE_QWEN2;
    if (strcmp(pre, "qwen35") == 0)
        return TOK_PRE_QWEN35;
    if (strcmp(pre, "llama-bpe") == 0 || strcmp(pre, "llama3") == 0)
        return TOK_PRE_LLAMA3;
    return TOK_PRE_GPT2;        /* "gpt2", "default" and anything unknown */
}

/* Specials order: first byte, then longest first (leftmost-longest match
 * is then the first hit in a bucket), then id. qsort has no context
 * argument, so the tokenizer being sorted is passed per thread. */
static _Thread_local const tokenizer *sort_ctx;

static int cmp_special(const void *pa, const void *pb)
{
    const tok_entry *a = &sort_ctx->tokens[*(const int32_t *)pa];
    const tok_entry *b = &sort_ctx->tokens[*(const int32_t *)pb];
    uint8_t fa = (uint8_t)sort_ctx->arena[a->text_off];
    uint8_t fb = (uint8_t)sort_ctx->arena[b->text_off];
    if (fa != fb)
        return fa < fb ? -1 : 1;
    if (a->text_len != b->text_len)
        return a->text_len > b->text_len ? -1 : 1;
    int32_t ia = *(const int32_t *)pa, ib = *(const int32_t *)pb;
    return (ia > ib) - (ia < ib);
}

static int tok_build_specials(tokenizer *t)
{
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const tok_entry *e = &t->tokens[i];
        if ((e->type == TOK_T_CONTROL || e->type == TOK_T_USER_DEFINED) && e->text_len > 0)
            n++;
    }
    t->specials = FAULT_OR(malloc(((size_t)n + 1) * sizeof *t->specials));
    if (!t->specials)
        return -1;
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const tok_entry *e = &t->tokens[i];
        if ((e->type == TOK_T_CONTROL || e->type == TOK_T_USER_DEFINED) && e->text_len > 0)
            t->specials[n++] = i;
    }
    t->n_specials = n;
    sort_ctx = t;
    qsort(t->specials, (size_t)n, sizeof *t->specials, cmp_special);
    sort_ctx = NULL;
    int32_t k = 0;
    for (int b = 0; b < 256; b++) {
        t->special_start[b] = k;
        while (k < n && (uint8_t)t->arena[t->tokens[t->specials[k]].text_off] == b)
            k++;
    }
    t->special_start[256] = n;
    return 0;
}

static void tok_add_eog(tokenizer *t, int32_t id)
{
    if (id < 0 || t->n_eog >= TOK_MAX_EOG)
        return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return;
    t->eog[t->n_eog++] = id;
}

tokenizer *tok_new_from_gguf(const gguf_ctx *g, char *err, size_t errlen)
{
    tokenizer *t = NULL;
    char *model = NULL, *pre = NULL, *mbuf = NULL;
    char ex[64];

    if (err && errlen)
        err[0] = 0;
    if (!g) {
        tok_err(err, errlen, "no GGUF context");
        return NULL;
    }
    model = gguf_get_str_dup(g, "tokenizer.ggml.model");
    if (!model && gguf_has_str(g, "tokenizer.ggml.model"))
        goto oom;
    if (!model) {
        tok_err(err, errlen, "tokenizer.ggml.model is missing or not a string");
        goto fail;
    }
    if (strcmp(model, "gpt2") != 0) {
        tok_err(err, errlen, "tokenizer.ggml.model is \"%s\"; only \"gpt2\" (byte-level BPE) is supported",
                tok_excerpt(model, strlen(model), ex, sizeof ex));
        goto fail;
    }

    const gguf_kv *kt = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!kt || kt->type != GGUF_T_ARRAY || kt->arr_type != GGUF_T_STRING || !kt->strs) {
        tok_err(err, errlen, "tokenizer.ggml.tokens is missing or not an array of strings");
        goto fail;
    }
    if (kt->arr_n == 0 || kt->arr_n > TOK_MAX_VOCAB) {
        tok_err(err, errlen, "tokenizer.ggml.tokens has %llu entries (expected 1 .. %d)",
                (unsigned long long)kt->arr_n, TOK_MAX_VOCAB);
        goto fail;
    }
    const gguf_kv *ktt = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (ktt && (ktt->type != GGUF_T_ARRAY || ktt->arr_type == GGUF_T_STRING ||
                ktt->arr_type == GGUF_T_ARRAY || ktt->arr_type == GGUF_T_F32 ||
                ktt->arr_type == GGUF_T_F64)) {
        tok_err(err, errlen, "tokenizer.ggml.token_type is not an array of integers");
        goto fail;
    }
    if (ktt && ktt->arr_n != kt->arr_n) {
        tok_err(err, errlen, "tokenizer.ggml.token_type has %llu entries but tokenizer.ggml.tokens has %llu",
                (unsigned long long)ktt->arr_n, (unsigned long long)kt->arr_n);
        goto fail;
    }
    const gguf_kv *km = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!km || km->type != GGUF_T_ARRAY || km->arr_type != GGUF_T_STRING || !km->strs) {
        tok_err(err, errlen, "tokenizer.ggml.merges is missing or not an array of strings");
        goto fail;
    }
    if (km->arr_n > (uint64_t)INT32_MAX / 4) {
        tok_err(err, errlen, "tokenizer.ggml.merges has too many entries (%llu)",
                (unsigned long long)km->arr_n);
        goto fail;
    }

    t = FAULT_OR(calloc(1, sizeof *t));
    if (!t)
        goto oom;
    t->n_vocab = (int32_t)kt->arr_n;
    t->tokens = FAULT_OR(calloc((size_t)t->n_vocab, sizeof *t->tokens));
    if (!t->tokens)
        goto oom;

    /* token strings and types */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const gguf_str *s = &kt->strs[i];
        tok_entry *e = &t->tokens[i];
        if (s->n > (1u << 20)) {
            tok_err(err, errlen, "tokenizer.ggml.tokens[%d] is %llu bytes long", (int)i,
                    (unsigned long long)s->n);
            goto fail;
        }
        if (!utf8_valid(s->p, (size_t)s->n)) {
            tok_err(err, errlen, "tokenizer.ggml.tokens[%d] \"%s\" is not valid UTF-8", (int)i,
                    tok_excerpt(s->p, (size_t)s->n, ex, sizeof ex));
            goto fail;
        }
        if (arena_put(t, s->p, (size_t)s->n, &e->text_off) < 0)
            goto oom;
        e->text_len = (uint32_t)s->n;
        e->type = TOK_T_NORMAL;
        if (ktt) {
            int64_t ty;
            if (!gguf_arr_get_i64(ktt, (uint64_t)i, &ty) || ty < TOK_T_UNDEFINED || ty > TOK_T_BYTE) {
                tok_err(err, errlen, "tokenizer.ggml.token_type[%d] is not a token type (0..6)", (int)i);
                goto fail;
            }
            e->type = (int32_t)ty;
        }
    }
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (tok_build_piece(t, i) < 0)
            goto oom;

    /* string -> id */
    t->str_cap = pow2_at_least(2 * (uint64_t)t->n_vocab);
    t->str_tab = FAULT_OR(malloc((size_t)t->str_cap * sizeof *t->str_tab));
    if (!t->str_tab)
        goto oom;
    for (uint32_t i = 0; i < t->str_cap; i++)
        t->str_tab[i].id = -1;
    int32_t n_text = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tokens[i].text_len > 0) {
            str_insert(t, i);
            n_text++;
        }
    if (n_text == 0) {
        tok_err(err, errlen, "tokenizer.ggml.tokens has %d entries, all empty: no text can be encoded",
                (int)t->n_vocab);
        goto fail;
    }

    /* merges "A B" -> (id A, id B) -> rank, id AB */
    t->pair_cap = pow2_at_least(2 * km->arr_n);
    t->pair_tab = FAULT_OR(malloc((size_t)t->pair_cap * sizeof *t->pair_tab));
    if (!t->pair_tab)
        goto oom;
    for (uint32_t i = 0; i < t->pair_cap; i++)
        t->pair_tab[i].left = -1;
    size_t mbuf_cap = 0;
    for (uint64_t r = 0; r < km->arr_n; r++) {
        const gguf_str *s = &km->strs[r];
        size_t n = (size_t)s->n;
        if (s->n > (1u << 20) || !utf8_valid(s->p, n)) {
            tok_err(err, errlen, "tokenizer.ggml.merges[%llu] is not valid UTF-8 (or too long)",
                    (unsigned long long)r);
            goto fail;
        }
        /* split at the first space after the first byte (as llama.cpp:
         * byte-level strings never contain a literal space) */
        const char *sp = n > 1 ? memchr(s->p + 1, ' ', n - 1) : NULL;
        if (!sp || sp + 1 == s->p + n) {
            tok_err(err, errlen, "tokenizer.ggml.merges[%llu] \"%s\" is not of the form \"A B\"",
                    (unsigned long long)r, tok_excerpt(s->p, n, ex, sizeof ex));
            goto fail;
        }
        size_t na = (size_t)(sp - s->p), nb = n - na - 1;
        if (na + nb > mbuf_cap) {
            char *p = FAULT_OR(realloc(mbuf, na + nb));
            if (!p)
                goto oom;
            mbuf = p;
            mbuf_cap = na + nb;
        }
        memcpy(mbuf, s->p, na);
        memcpy(mbuf + na, sp + 1, nb);
        int32_t a = str_find(t, s->p, na);
        int32_t b = str_find(t, sp + 1, nb);
        int32_t ab = str_find(t, mbuf, na + nb);
        if (a < 0 || b < 0 || ab < 0) {
            /* a BPE merge joins two vocabulary tokens into a third (Hugging
             * Face's loader refuses any other as MergeTokenOutOfVocabulary):
             * one that does not is a corrupt file, not a rule to skip */
            tok_err(err, errlen, "tokenizer.ggml.merges[%llu] \"%s\" names %s, which is not in tokenizer.ggml.tokens",
                    (unsigned long long)r, tok_excerpt(s->p, n, ex, sizeof ex),
                    a < 0 ? "its left part" : b < 0 ? "its right part" : "the merged token");
            goto fail;
        }
        if (pair_insert(t, a, b, (int32_t)r, ab))
            t->n_merges++;
    }

    /* byte symbols */
    for (int b = 0; b < 256; b++) {
        char tmp[4];
        int k = utf8_encode(tok_byte_to_cp((uint8_t)b), tmp);
        t->byte_tok[b] = str_find(t, tmp, (size_t)k);
    }

    if (tok_build_specials(t) < 0)
        goto oom;

    pre = gguf_get_str_dup(g, "tokenizer.ggml.pre");
    if (!pre && gguf_has_str(g, "tokenizer.ggml.pre"))
        goto oom;                   /* not the default pre-tokenizer by mistake */
    t->pre = tok_pre_from_name(pre);

    if (read_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err, errlen) < 0 ||
        read_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err, errlen) < 0 ||
        read_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err, errlen) < 0)
        goto fail;
    {
        /* unk and pad: ignored when out of range (some files carry pad = n_vocab) */
        int64_t v;
        t->unk = -1;
        if (gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", &v) && v >= 0 && v < t->n_vocab)
            t->unk = (int32_t)v;
    }
    if (gguf_find_kv(g, "tokenizer.ggml.add_bos_token") &&
        !gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos)) {
        tok_err(err, errlen, "tokenizer.ggml.add_bos_token is not a bool");
        goto fail;
    }

    tok_add_eog(t, t->eos);
    tok_add_eog(t, t->eot);
    static const char *const eog_names[] = {
        "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
    };
    for (size_t i = 0; i < sizeof eog_names / sizeof eog_names[0]; i++)
        tok_add_eog(t, str_find(t, eog_names[i], strlen(eog_names[i])));

    free(model);
    free(pre);
    free(mbuf);
    return t;

oom:
    tok_err(err, errlen, "out of memory while loading the vocabulary");
fail:
    free(model);
    free(pre);
    free(mbuf);
    tok_free(t);
    return NULL;
}

void tok_free(tokenizer *t)
{
    if (!t)
        return;
    free(t->tokens);
    free(t->arena);
    free(t->str_tab);
    free(t->pair_tab);
    free(t->specials);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Queries                                                             */

int tok_n_vocab(const tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t tok_bos(const tokenizer *t) { return t ? t->bos : -1; }
int32_t tok_eos(const tokenizer *t) { return t ? t->eos : -1; }
bool tok_add_bos(const tokenizer *t) { return t && t->add_bos; }

bool tok_is_eog(const tokenizer *t, int32_t id)
{
    if (!t || id < 0)
        return false;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

bool tok_is_control(const tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && t->tokens[id].type == TOK_T_CONTROL;
}

int32_t tok_lookup(const tokenizer *t, const char *text, size_t len)
{
    if (!t || !text)
        return -1;
    return str_find(t, text, len);
}

int tok_piece(const tokenizer *t, int32_t id, char *buf, size_t cap)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return -1;
    const tok_entry *e = &t->tokens[id];
    if (buf && cap)
        memcpy(buf, t->arena + e->piece_off, e->piece_len < cap ? e->piece_len : cap);
    return (int)e->piece_len;
}

/* ------------------------------------------------------------------ */
/* BPE                                                                 */

/* One symbol of the piece being merged: a doubly linked list in place. */
typedef struct bpe_sym {
    int32_t id;         /* token id, -1 if the byte has no token */
    int32_t prev;       /* index of the previous live symbol, -1 at the start */
    int32_t next;       /* index of the next live symbol, -1 at the end */
    uint32_t start;     /* first byte in the piece */
    uint32_t len;       /* bytes covered; 0 = merged away */
} bpe_sym;

/* A candidate merge of symbol left with its right neighbour. Entries go
 * stale when either side changes; they are checked when popped. */
typedef struct bpe_cand {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
} bpe_cand;

/* Scratch of one tok_encode call, grown to the longest piece seen. */
typedef struct bpe_work {
    bpe_sym *sym;       /* [cap] */
    bpe_cand *heap;     /* [3 * cap]: n-1 initial + 2 per merge */
    char *mapped;       /* [2 * cap] piece as byte-level chars (llama-bpe only) */
    size_t cap;
    size_t n_heap;
} bpe_work;

static bool cand_less(const bpe_cand *a, const bpe_cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpe_work *w, bpe_cand c)
{
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static bpe_cand heap_pop(bpe_work *w)
{
    bpe_cand top = w->heap[0];
    bpe_cand last = w->heap[--w->n_heap];
    size_t n = w->n_heap, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const bpe_cand *best = &last;
        if (l < n && cand_less(&w->heap[l], best)) {
            m = l;
            best = &w->heap[l];
        }
        if (l + 1 < n && cand_less(&w->heap[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n > 0)
        w->heap[i] = last;
    return top;
}

static void bpe_try_pair(const tokenizer *t, bpe_work *w, int32_t left)
{
    if (left < 0)
        return;
    int32_t right = w->sym[left].next;
    if (right < 0)
        return;
    const tok_pair_slot *p = pair_find(t, w->sym[left].id, w->sym[right].id);
    if (!p)
        return;
    bpe_cand c = { p->rank, left, w->sym[left].id, w->sym[right].id };
    heap_push(w, c);
}

static int bpe_reserve(bpe_work *w, size_t n)
{
    if (n <= w->cap)
        return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n)
        cap *= 2;
    bpe_sym *s = FAULT_OR(realloc(w->sym, cap * sizeof *s));
    if (!s)
        return -1;
    w->sym = s;
    bpe_cand *h = FAULT_OR(realloc(w->heap, 3 * cap * sizeof *h));
    if (!h)
        return -1;
    w->heap = h;
    char *m = FAULT_OR(realloc(w->mapped, 2 * cap));
    if (!m)
        return -1;
    w->mapped = m;
    w->cap = cap;
    return 0;
}

/* Appends one id to the output, counting past max_out. */
static int emit(int32_t id, int32_t *out, int max_out, int *count)
{
    if (*count == INT_MAX)
        return -1;
    if (*count < max_out)
        out[*count] = id;
    (*count)++;
    return 0;
}

/* BPE of one piece p[0..n): lowest-rank adjacent pair first, leftmost
 * among equal ranks. O(n log n) per piece via a heap of candidates. */
static int bpe_piece(const tokenizer *t, bpe_work *w, const uint8_t *p, size_t n,
                     int32_t *out, int max_out, int *count)
{
    if (n == 0)
        return 0;
    if (n > INT32_MAX / 4)
        return -1;
    if (bpe_reserve(w, n) < 0)
        return -1;
    /* llama-bpe (HF ignore_merges): a piece that is a whole (non-special)
     * token is emitted as is, without merging */
    if (t->pre == TOK_PRE_LLAMA3 && n > 1) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += (size_t)utf8_encode(tok_byte_to_cp(p[i]), w->mapped + k);
        int32_t id = str_find(t, w->mapped, k);
        if (id >= 0 && t->tokens[id].type != TOK_T_CONTROL &&
            t->tokens[id].type != TOK_T_USER_DEFINED)
            return emit(id, out, max_out, count);
    }
    for (size_t i = 0; i < n; i++) {
        bpe_sym *s = &w->sym[i];
        s->id = t->byte_tok[p[i]];
        s->prev = (int32_t)i - 1;
        s->next = i + 1 < n ? (int32_t)i + 1 : -1;
        s->start = (uint32_t)i;
        s->len = 1;
    }
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        bpe_try_pair(t, w, (int32_t)i);

    while (w->n_heap > 0) {
        bpe_cand c = heap_pop(w);
        bpe_sym *l = &w->sym[c.left];
        if (l->len == 0 || l->id != c.left_id || l->next < 0)
            continue;
        bpe_sym *r = &w->sym[l->next];
        if (r->id != c.right_id)
            continue;
        /* merge: l absorbs r */
        const tok_pair_slot *ps = pair_find(t, l->id, r->id);
        l->id = ps->merged;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = c.left;
        bpe_try_pair(t, w, l->prev);
        bpe_try_pair(t, w, c.left);
    }

    for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
        const bpe_sym *s = &w->sym[i];
        if (s->id >= 0) {
            if (emit(s->id, out, max_out, count) < 0)
                return -1;
        } else if (t->unk >= 0) {
            /* a byte without a token (malformed vocab): unk if there is one, else dropped */
            if (emit(t->unk, out, max_out, count) < 0)
                return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Encode                                                              */

/* Leftmost-longest special token at or after text[from]; returns its
 * start (len when none) and the id in *id. */
static size_t find_special(const tokenizer *t, const char *text, size_t len, size_t from,
                           int32_t *id)
{
    for (size_t q = from; q < len; q++) {
        uint8_t b = (uint8_t)text[q];
        for (int32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
            const tok_entry *e = &t->tokens[t->specials[k]];
            if (e->text_len <= len - q && memcmp(t->arena + e->text_off, text + q, e->text_len) == 0) {
                *id = t->specials[k];
                return q;
            }
        }
    }
    *id = -1;
    return len;
}

/* find_special, but a special token may not touch a data span: pairs
 * data[2i] .. data[2i + 1] (sorted, disjoint byte ranges [start, end)) are
 * text from users, never control tokens. *di: the first span not wholly
 * before from; it only moves forward. */
static size_t find_special_outside(const tokenizer *t, const char *text, size_t len, size_t from,
                                   const size_t *data, int n_data, int *di, int32_t *id)
{
    size_t q = from;
    while (q < len) {
        while (*di < n_data && data[2 * *di + 1] <= q)
            (*di)++;
        if (*di < n_data && data[2 * *di] <= q) {
            q = data[2 * *di + 1];      /* inside a data span: skip to its end */
            continue;
        }
        /* specials may start in [q, limit) and must end by limit */
        size_t limit = *di < n_data && data[2 * *di] < len ? data[2 * *di] : len;
        size_t s = find_special(t, text, limit, q, id);
        if (*id >= 0)
            return s;
        q = limit;
    }
    *id = -1;
    return len;
}

/* Pre-tokenizes and BPE-encodes the segment text[0..len) (no specials). */
static int encode_segment(const tokenizer *t, const char *text, size_t len, tok_cps *c,
                          bpe_work *w, int32_t *out, int max_out, int *count)
{
    tok_decode_cps(text, len, c);
    for (size_t i = 0; i < c->n;) {
        size_t e = pre_match(t->pre, c, i);
        const uint8_t *p = (const uint8_t *)text + c->off[i];
        if (bpe_piece(t, w, p, c->off[e] - c->off[i], out, max_out, count) < 0)
            return -1;
        i = e;
    }
    return 0;
}

int tok_encode(const tokenizer *t, const char *text, size_t len,
               bool parse_special, int32_t *out, int max_out)
{
    return tok_encode_data(t, text, len, NULL, parse_special ? 0 : -1, out, max_out);
}

int tok_encode_data(const tokenizer *t, const char *text, size_t len, const size_t *data, int n_data,
                    int32_t *out, int max_out)
{
    tok_cps c = { 0 };
    bpe_work w = { 0 };
    int count = 0, rc = -1;

    if (!t || (!text && len) || max_out < 0 || (!out && max_out > 0))
        return -1;
    if (len == 0)
        return 0;
    if (tok_cps_alloc(&c, len) < 0)
        goto out_free;

    size_t pos = 0;
    int di = 0;
    while (pos < len) {
        int32_t sid = -1;
        size_t s = len;
        if (n_data >= 0 && t->n_specials > 0)
            s = find_special_outside(t, text, len, pos, data, n_data, &di, &sid);
        if (s > pos && encode_segment(t, text + pos, s - pos, &c, &w, out, max_out, &count) < 0)
            goto out_free;
        if (sid < 0)
            break;
        if (emit(sid, out, max_out, &count) < 0)
            goto out_free;
        pos = s + t->tokens[sid].text_len;
    }
    rc = count;

out_free:
    tok_cps_free(&c);
    free(w.sym);
    free(w.heap);
    free(w.mapped);
    return rc;
}

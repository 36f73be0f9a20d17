"""bpe.py - byte-level BPE for the default model: pre-tokenizer, trainer, encoder.

Owns: the "qwen2" pre-tokenizer split of docs/models.md section 6, written
with Python's unicodedata (Python's re has no \\p{L}); GPT-2's byte-to-unicode
map; training merges on a corpus; encoding text to ids and decoding back; the
GGUF tokenizer metadata (tokens, token_type, merges, specials, chat template).
Does not: know about models or files other than through the Tokenizer object.

ref: docs/models.md section 6. The C tokenizer (engine/tokenizer.c) must
produce the same ids for the same text; train.py checks that on the held-out
text through `hyserve perplexity`'s token count, and `tokenizer_selftest()`
checks the splitter on the tricky whitespace / contraction cases.

Merge semantics (same as llama.cpp and Hugging Face for merges learned in
order): inside one pre-tokenizer piece, repeatedly merge the adjacent pair
with the lowest merge rank, the leftmost occurrence first.
"""

import heapq
import unicodedata

# Token types (tokenizer.ggml.token_type)
TT_NORMAL, TT_CONTROL = 1, 3

EOT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIALS = (EOT, IM_START, IM_END)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# --------------------------------------------------------------------------
# byte <-> unicode (GPT-2 bytes_to_unicode)

def byte_to_unicode():
    """list of 256 one-character strings, index = byte value: bytes 33..126,
    161..172, 174..255 keep their code point; the other 68, in increasing
    order, map to U+0100, U+0101, ..."""
    keep = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, n = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


BYTE_CHARS = byte_to_unicode()
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}


# --------------------------------------------------------------------------
# pre-tokenizer

# Unicode White_Space (PropList.txt): what \s means in Oniguruma / Rust regex
# and in the C tokenizer's tables.
_WHITE_SPACE = set(chr(c) for c in list(range(0x09, 0x0E)) + [0x20, 0x85, 0xA0, 0x1680] +
                   list(range(0x2000, 0x200B)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000])

C_L, C_N, C_M, C_S = 1, 2, 4, 8


def _cls(ch, _cache={}):
    f = _cache.get(ch)
    if f is None:
        cat = unicodedata.category(ch)
        f = 0
        if cat[0] == "L":
            f |= C_L
        elif cat[0] == "N":
            f |= C_N
        elif cat[0] == "M":
            f |= C_M
        if ch in _WHITE_SPACE:
            f |= C_S
        _cache[ch] = f
    return f


def _contraction(s, i, n):
    """(?i:'s|'t|'re|'ve|'m|'ll|'d) at i: match length or 0 (ASCII case folding)."""
    if s[i] != "'" or i + 1 >= n:
        return 0
    a = s[i + 1].lower() if s[i + 1].isascii() else s[i + 1]
    b = s[i + 2].lower() if i + 2 < n and s[i + 2].isascii() else (s[i + 2] if i + 2 < n else "")
    if a in ("s", "t", "m", "d"):
        return 2
    if (a, b) in (("r", "e"), ("v", "e"), ("l", "l")):
        return 3
    return 0


def _match_qwen2(s, fl, i, n):
    """End index of the qwen2 regex's match at i, alternatives tried in order:
      (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\\r\\n\\p{L}\\p{N}]?\\p{L}+ | \\p{N}
      | ?[^\\s\\p{L}\\p{N}]+[\\r\\n]* | \\s*[\\r\\n]+ | \\s+(?!\\S) | \\s+"""
    k = _contraction(s, i, n)
    if k:
        return i + k
    # [^\r\n\p{L}\p{N}]?\p{L}+
    if fl[i] & C_L:
        j = i + 1
        while j < n and fl[j] & C_L:
            j += 1
        return j
    if s[i] not in "\r\n" and not fl[i] & (C_L | C_N) and i + 1 < n and fl[i + 1] & C_L:
        j = i + 2
        while j < n and fl[j] & C_L:
            j += 1
        return j
    # \p{N}: one digit per piece
    if fl[i] & C_N:
        return i + 1
    # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    punct = C_S | C_L | C_N
    j = None
    if s[i] == " " and i + 1 < n and not fl[i + 1] & punct:
        j = i + 1
    elif not fl[i] & punct:
        j = i
    if j is not None:
        while j < n and not fl[j] & punct:
            j += 1
        while j < n and s[j] in "\r\n":
            j += 1
        return j
    # whitespace run [i, j)
    j = i
    while j < n and fl[j] & C_S:
        j += 1
    # \s*[\r\n]+ : the greedy \s* backs off to the last newline of the run
    for e in range(j, i, -1):
        if s[e - 1] in "\r\n":
            return e
    # \s+(?!\S): the whole run at the end of the text, else all but its last
    # character; a single space followed by a non-space is \s+
    if j == n or j - i == 1:
        return j
    return j - 1


def pre_split(text):
    """Split text into pre-tokenizer pieces (list of str) per the qwen2 regex."""
    n = len(text)
    fl = [_cls(c) for c in text]
    out = []
    i = 0
    while i < n:
        e = _match_qwen2(text, fl, i, n)
        out.append(text[i:e])
        i = e
    return out


def tokenizer_selftest():
    """Expected splits from the regex semantics (hand-derived)."""
    cases = {
        "Hello world": ["Hello", " world"],
        "a   b": ["a", "  ", " b"],
        "it's He'LL": ["it", "'s", " He", "'LL"],
        "x 12.5%": ["x", " ", "1", "2", ".", "5", "%"],
        "end.\n\nNew": ["end", ".\n\n", "New"],
        "a \n b": ["a", " \n", " b"],
        "tail  ": ["tail", "  "],
        " \"Quote\"": [" \"", "Quote", "\""],
        "(see)--that": ["(see", ")--", "that"],
        "caf\u00e9 na\u0308ive": ["caf\u00e9", " na", "\u0308ive"],
    }
    for text, want in cases.items():
        got = pre_split(text)
        assert got == want, (text, got, want)
        assert "".join(got) == text
    return True


# --------------------------------------------------------------------------
# tokenizer

class Tokenizer:
    """Byte-level BPE vocabulary.

    tokens:  list of token strings (byte-level unicode); ids 0..255 are the
             single bytes (id = byte value), then merged tokens, then SPECIALS
    merges:  list of (a, b) pairs; rank = index
    """

    def __init__(self, tokens, merges):
        self.tokens = list(tokens)
        self.merges = [tuple(m) for m in merges]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {m: r for r, m in enumerate(self.merges)}
        self.special_ids = {t: self.ids[t] for t in SPECIALS if t in self.ids}
        self._cache = {}

    @property
    def n_vocab(self):
        return len(self.tokens)

    @property
    def eos_id(self):
        return self.ids[EOT]

    def token_types(self):
        return [TT_CONTROL if t in self.special_ids else TT_NORMAL for t in self.tokens]

    def _bpe(self, piece):
        """ids for one pre-tokenizer piece (no specials inside)."""
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        syms = [BYTE_CHARS[b] for b in piece.encode("utf-8")]
        ranks = self.ranks
        while len(syms) > 1:
            best, at = None, -1
            for i in range(len(syms) - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            syms[at:at + 2] = [syms[at] + syms[at + 1]]
        ids = [self.ids[s] for s in syms]
        if len(self._cache) < 500000:
            self._cache[piece] = ids
        return ids

    def encode(self, text):
        """Text -> ids. Special-token strings in the text are NOT parsed (they
        are plain text, like engine_tokenize(parse_special=false))."""
        out = []
        for piece in pre_split(text):
            out.extend(self._bpe(piece))
        return out

    def decode_bytes(self, ids):
        out = bytearray()
        for i in ids:
            t = self.tokens[i]
            if t in self.special_ids:
                out += t.encode("utf-8")
            else:
                out += bytes(CHAR_BYTES[c] for c in t)
        return bytes(out)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def gguf_metadata(self, w):
        """Write tokenizer.* keys to a gguf_io.GGUFWriter."""
        from gguf_io import T_INT32, T_STRING
        w.add_string("tokenizer.ggml.model", "gpt2")
        w.add_string("tokenizer.ggml.pre", "qwen2")
        w.add_array("tokenizer.ggml.tokens", T_STRING, self.tokens)
        w.add_array("tokenizer.ggml.token_type", T_INT32, self.token_types())
        w.add_array("tokenizer.ggml.merges", T_STRING, ["%s %s" % m for m in self.merges])
        w.add_u32("tokenizer.ggml.eos_token_id", self.ids[EOT])
        w.add_u32("tokenizer.ggml.bos_token_id", self.ids[EOT])
        w.add_u32("tokenizer.ggml.padding_token_id", self.ids[EOT])
        w.add_bool("tokenizer.ggml.add_bos_token", False)
        w.add_string("tokenizer.chat_template", CHATML_TEMPLATE)

    @staticmethod
    def from_gguf(reader):
        toks = reader.kv["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ")) for m in reader.kv["tokenizer.ggml.merges"]]
        return Tokenizer(toks, merges)


# --------------------------------------------------------------------------
# trainer

def train_bpe(piece_counts, n_vocab, log=None):
    """Learn merges until the vocabulary (256 bytes + merged tokens + the 3
    specials) has n_vocab entries.

    piece_counts: dict piece string -> count (pre-tokenizer pieces of the
    training text). Ties between equally frequent pairs go to the
    lexicographically smallest pair, so training is deterministic.
    """
    n_target = n_vocab - len(SPECIALS)
    words = []   # list of symbol lists
    counts = []
    for piece, c in sorted(piece_counts.items()):
        words.append([BYTE_CHARS[b] for b in piece.encode("utf-8")])
        counts.append(c)
    pair_count = {}
    pair_words = {}
    for wi, syms in enumerate(words):
        c = counts[wi]
        for a, b in zip(syms, syms[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + c
            pair_words.setdefault((a, b), set()).add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    tokens = list(BYTE_CHARS)
    known = set(tokens)
    merges = []
    while len(tokens) < n_target and heap:
        negc, pair = heapq.heappop(heap)
        cur = pair_count.get(pair, 0)
        if cur <= 0:
            continue
        if -negc != cur:          # stale heap entry: re-push with the current count
            heapq.heappush(heap, (-cur, pair))
            continue
        a, b = pair
        new = a + b
        merges.append(pair)
        if new not in known:
            known.add(new)
            tokens.append(new)
        changed = {}
        for wi in pair_words.pop(pair, ()):
            syms = words[wi]
            c = counts[wi]
            # remove this word's old pairs, merge, add the new pairs
            for p in zip(syms, syms[1:]):
                changed[p] = changed.get(p, 0) - c
            out = []
            i = 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                changed[p] = changed.get(p, 0) + c
                pair_words.setdefault(p, set()).add(wi)
        for p, d in changed.items():
            if d == 0:
                continue
            nc = pair_count.get(p, 0) + d
            if nc > 0:
                pair_count[p] = nc
                heapq.heappush(heap, (-nc, p))
            else:
                pair_count.pop(p, None)
        pair_count.pop(pair, None)
        if log and len(merges) % 500 == 0:
            log("bpe: %d merges, vocab %d, last %r x%d" % (len(merges), len(tokens), new, cur))
    tokens += list(SPECIALS)
    return Tokenizer(tokens, merges)

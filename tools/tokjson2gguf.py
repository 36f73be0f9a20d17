#!/usr/bin/python3
"""tokjson2gguf.py - write a GGUF holding only the tokenizer of a Hugging Face tokenizer.json.

Owns: turning a byte-level BPE tokenizer.json (+ optional tokenizer_config.json)
into the tokenizer.ggml.* metadata that engine/tokenizer.c loads, so the C
tokenizer can be checked against a real vocabulary without model weights.
Does not own: tensors (none are made: --weights copies a model's tensors and
other keys as they are, so `hyserve synth` weights can be served with a real
vocabulary), non-BPE tokenizers.
ref: docs/models.md sections 5 (container) and 6 (keys). The
key choices follow what llama.cpp's converter writes for gpt2-style vocabularies:
  tokens      id order; ids missing from the JSON become "[PAD<id>]" (UNUSED)
  token_type  1 NORMAL, 3 CONTROL (added + special, or shaped "<|...|>"),
              4 USER_DEFINED (other added tokens), 5 UNUSED
  merges      "A B" strings, rank = index
  bos/eos/pad ids of the tokens named in tokenizer_config.json; add_bos_token
  --extend-to N   grows the vocabulary to N ids the way BPE training grows one:
              each new token is the concatenation A+B of two tokens already in
              it (A letters, with or without the leading-space mark; B 1-6
              lowercase letters), with the merge "A B" ranked after the others;
              pairs drawn with a seeded random.Random (--extend-seed), so the
              file is the same on every machine. For a large-vocabulary stand-in
              (Qwen3.5's 248320 tokens) when the real one is not at hand.

Usage: /usr/bin/python3 tools/tokjson2gguf.py tokenizer.json -o out.gguf
           [--config tokenizer_config.json] [--pre qwen2] [--vocab-size N]
           [--weights model.gguf] [--extend-to N [--extend-seed S]]
"""
import argparse
import json
import random
import re
import struct
import sys

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

T_U32, T_I32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 7, 8, 9

TT_NORMAL, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED = 1, 3, 4, 5


class GgufWriter:
    """Metadata-only GGUF v3 writer (little-endian, no tensors)."""

    def __init__(self):
        self.kvs = []

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def add_str(self, key, v):
        self.kvs.append(self._str(key) + struct.pack("<I", T_STRING) + self._str(v))

    def add_u32(self, key, v):
        self.kvs.append(self._str(key) + struct.pack("<II", T_U32, v))

    def add_bool(self, key, v):
        self.kvs.append(self._str(key) + struct.pack("<IB", T_BOOL, 1 if v else 0))

    def add_str_array(self, key, items):
        parts = [self._str(key), struct.pack("<IIQ", T_ARRAY, T_STRING, len(items))]
        parts.extend(self._str(s) for s in items)
        self.kvs.append(b"".join(parts))

    def add_i32_array(self, key, items):
        self.kvs.append(self._str(key) + struct.pack("<IIQ", T_ARRAY, T_I32, len(items)) +
                        struct.pack("<%di" % len(items), *items))

    def write(self, path, weights=None):
        """weights: (raw key-value records, n_tensors, raw tensor infos,
        alignment, file, data offset) of a model read by read_model."""
        kvs, n_t, infos, align = self.kvs, 0, b"", ALIGNMENT
        if weights:
            kvs = weights[0] + kvs
            n_t, infos, align = weights[1], weights[2], weights[3]
        body = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, n_t, len(kvs)) + b"".join(kvs) + infos
        body += b"\0" * (-len(body) % align)
        with open(path, "wb") as f:
            f.write(body)
            if weights:
                with open(weights[4], "rb") as src:
                    src.seek(weights[5])
                    while True:
                        chunk = src.read(1 << 24)
                        if not chunk:
                            break
                        f.write(chunk)


# sizes of the fixed-width GGUF value types (docs/models.md section 5)
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_model(path, n_vocab):
    """The key-value records (raw bytes) of a model GGUF but its tokenizer.*
    keys, its tensor infos (raw;
    their offsets stay valid as the data section is copied whole), and where
    its data starts. The token embedding must have n_vocab rows."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:4] != GGUF_MAGIC or struct.unpack_from("<I", head, 4)[0] != 3:
            sys.exit("tokjson2gguf: %s is not a GGUF v3 file" % path)
        n_t, n_kv = struct.unpack_from("<QQ", head, 8)
        f.seek(0)
        buf = f.read(64 << 20)         # the header of a synth model fits
    at, kvs, align = 24, [], ALIGNMENT

    def take(n):
        nonlocal at
        if at + n > len(buf):
            sys.exit("tokjson2gguf: %s: header past %d bytes" % (path, len(buf)))
        at += n
        return buf[at - n:at]

    def string():
        return take(struct.unpack("<Q", take(8))[0]).decode("utf-8")

    def value(t):
        if t in SCALAR:
            return take(SCALAR[t])
        if t == T_STRING:
            return string()
        if t == T_ARRAY:
            et, n = struct.unpack("<IQ", take(12))
            for _ in range(n):
                value(et)
            return None
        sys.exit("tokjson2gguf: %s: unknown value type %d" % (path, t))

    for _ in range(n_kv):
        start = at
        key = string()
        t = struct.unpack("<I", take(4))[0]
        v = value(t)
        if key == "general.alignment":
            align = struct.unpack("<I", v)[0]
        if not key.startswith("tokenizer."):
            kvs.append(buf[start:at])
    start = at
    for _ in range(n_t):
        name = string()
        nd = struct.unpack("<I", take(4))[0]
        dims = struct.unpack("<%dQ" % nd, take(8 * nd))
        take(12)
        if name == "token_embd.weight" and dims[-1] != n_vocab:
            sys.exit("tokjson2gguf: %s has %d embedding rows, the vocabulary %d" % (path, dims[-1], n_vocab))
    infos = buf[start:at]
    return kvs, n_t, infos, align, path, at + (-at % align)


def token_name(v):
    """A tokenizer_config special-token entry: string, AddedToken dict, or null."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def looks_special(text):
    return (text.startswith("<|") and text.endswith("|>")) or \
        (text.startswith("<\uff5c") and text.endswith("\uff5c>"))


def extend(tokens, types, merges, vocab, n_to, seed):
    """Append BPE-made tokens (see --extend-to) until there are n_to."""
    if n_to < len(tokens):
        sys.exit("tokjson2gguf: --extend-to %d is below the vocabulary's %d ids" % (n_to, len(tokens)))
    heads = sorted(t for t in vocab if re.fullmatch("\u0120?[A-Za-z]{1,10}", t))
    tails = sorted(t for t in vocab if re.fullmatch("[a-z]{1,6}", t))
    if not heads or not tails:
        sys.exit("tokjson2gguf: --extend-to needs letter tokens to combine")
    rng = random.Random(seed)
    have = set(tokens)
    while len(tokens) < n_to:
        a, b = rng.choice(heads), rng.choice(tails)
        if a + b in have:
            continue
        have.add(a + b)
        tokens.append(a + b)
        types.append(TT_NORMAL)
        merges.append(a + " " + b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokenizer_json")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--config", help="tokenizer_config.json (bos/eos/pad, add_bos_token, chat_template)")
    ap.add_argument("--pre", default="qwen2", help="tokenizer.ggml.pre value (default qwen2)")
    ap.add_argument("--vocab-size", type=int, default=0,
                    help="pad the vocabulary to this many ids (the model's embedding rows)")
    ap.add_argument("--extend-to", type=int, default=0,
                    help="grow the vocabulary to this many ids with BPE-made tokens (after --vocab-size padding)")
    ap.add_argument("--extend-seed", type=int, default=1)
    ap.add_argument("--weights", help="a model GGUF (e.g. from `hyserve synth --vocab N`) whose keys and "
                    "tensors the output keeps, its tokenizer replaced by this one")
    args = ap.parse_args()

    with open(args.tokenizer_json, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model", {})
    if model.get("type") != "BPE":
        sys.exit("tokjson2gguf: model.type is %r, only BPE is supported" % model.get("type"))
    vocab = model["vocab"]
    added = tj.get("added_tokens", [])

    by_id = {}
    for text, i in vocab.items():
        by_id[i] = (text, TT_NORMAL)
    for a in added:
        text = a["content"]
        tt = TT_CONTROL if a.get("special") or looks_special(text) else TT_USER_DEFINED
        by_id[a["id"]] = (text, tt)
    n = max(by_id) + 1
    if args.vocab_size:
        if args.vocab_size < n:
            sys.exit("tokjson2gguf: --vocab-size %d is below the highest id + 1 (%d)" % (args.vocab_size, n))
        n = args.vocab_size
    tokens, types = [], []
    for i in range(n):
        text, tt = by_id.get(i, ("[PAD%d]" % i, TT_UNUSED))
        tokens.append(text)
        types.append(tt)
    merges = []
    for m in model.get("merges", []):
        merges.append(" ".join(m) if isinstance(m, list) else m)
    if args.extend_to:
        extend(tokens, types, merges, vocab, args.extend_to, args.extend_seed)
        n = len(tokens)
    ids = {t: i for i, t in reversed(list(enumerate(tokens)))}

    w = GgufWriter()
    weights = read_model(args.weights, n) if args.weights else None
    if not weights:
        w.add_str("general.architecture", "tokenizer-only")
        w.add_str("general.name", "tokenizer from %s" % args.tokenizer_json.split("/")[-1])
    w.add_str("tokenizer.ggml.model", "gpt2")
    w.add_str("tokenizer.ggml.pre", args.pre)
    w.add_str_array("tokenizer.ggml.tokens", tokens)
    w.add_i32_array("tokenizer.ggml.token_type", types)
    w.add_str_array("tokenizer.ggml.merges", merges)

    if args.config:
        with open(args.config, encoding="utf-8") as f:
            cfg = json.load(f)
        for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding")):
            t = token_name(cfg.get(key))
            if t is not None and t in ids:
                w.add_u32("tokenizer.ggml.%s_token_id" % name, ids[t])
        if "add_bos_token" in cfg and cfg["add_bos_token"] is not None:
            w.add_bool("tokenizer.ggml.add_bos_token", bool(cfg["add_bos_token"]))
        if isinstance(cfg.get("chat_template"), str):
            w.add_str("tokenizer.chat_template", cfg["chat_template"])

    w.write(args.out, weights)
    print("tokjson2gguf: wrote %s: %d tokens (%d added), %d merges, pre=%s"
          % (args.out, n, len(added), len(merges), args.pre))


if __name__ == "__main__":
    main()

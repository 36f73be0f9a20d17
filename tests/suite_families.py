#!/usr/bin/env python3
"""The newer GGUF architectures served end to end (run by tests/suite_families.sh).

For each family the engine loads beside qwen35 (qwen35moe: Gated DeltaNet +
attention + MoE; granitehybrid, dense and MoE: Mamba-2 + attention;
nemotron_h: Mamba-2, attention and MLP-only layers; lfm2: short convolution
+ attention; nemotron_h_moe and lfm2moe: the same with experts; falcon-h1:
attention and Mamba-2 side by side in each layer;
jamba: Mamba-1 + attention + MoE; kimi-linear: KDA + MLA + MoE) a small model is synthesized (`hyserve synth --arch`, ChatML
template) and served, and the same five things are checked on each:

 1. greedy text: /v1/chat/completions and /generate answer 200 with text
    equal to `hyserve generate --temp 0` on the same prompt (chat: the text
    /apply-template renders, whose /tokenize count is the chat's
    prompt_tokens; /generate: the raw prompt);
 2. cache bytes: a live request's /stats cache_by_kind and recurrent bytes,
    the model's cache_layout (recurrent.by_kind), POST /v1/memory/estimate
    and `hyserve mem -m FILE --json` all equal the arithmetic written out
    here from the shapes `hyserve info` prints (conv kernels from the GGUF
    metadata, read with the small reader below) -- to the byte;
 3. prefix cache: a long prompt sent twice restores all but its last token,
    a second chat turn restores the first, and both read as after POST
    /reset_prefix_cache (cold) and as the CLI;
 4. n: 3 with temperature > 0 and a seed: choice i equals the request with
    n: 1 and seed derive(seed, i) (docs/serving.md 3.1, hs.choice_seed), and
    the prompt is prefilled once;
 5. DELETE /requests/{id} ends a long stream with the cancelled event, and
    the server then serves the next request with nothing leaked.

Dtypes vary by family (f32, f16 and bf16 KV; f32 and bf16 recurrent state)
so that the byte widths in the formulas are exercised; the CLI is given the
same ones. Prints "families: N passed, N failed" last.

Usage: suite_families.py [-k PATTERN] [--list]; the test names are
test_NAME[FAMILY] (e.g. -k lfm2, -k test_prefix, -k 'test_cancel[nemotron_h]').
"""
import json
import os
import re
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_http as hs  # noqa: E402  (Server, stream helpers, check, choice_seed)

HYSERVE = hs.HYSERVE
TMP = os.path.abspath(os.path.join(os.environ.get("TEST_TMPDIR", "tests/tmp"), "families"))
hs.TMP = TMP
check = hs.check

CTX = 8192          # long enough for a stream that is still running when /stats looks at it
PAGE = 16           # --page-tokens (the default)
LONG_NEW = 7600     # the live (then cancelled) streams' max_new_tokens (prompt + this within CTX)
COMMON = ["--vocab", "300", "--ctx", str(CTX), "--chat-template", "chatml"]
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}

# name -> (synth options, kv dtype, state dtype). Falcon-H1 and Jamba untied as their releases are
# (tied, a small random residual leaves the last token's own embedding on top: "\n" after "\n")
FAMILIES = {
    "qwen35moe": (["--arch", "qwen35moe", "--layers", "4", "--pattern", "LLLA", "--dnet-k-heads", "2",
                   "--dnet-v-heads", "4", "--dnet-k-dim", "16", "--dnet-v-dim", "8", "--experts", "8",
                   "--experts-used", "2", "--seed", "11"], "f32", "f32"),
    "granitehybrid_dense": (["--arch", "granitehybrid", "--experts", "0", "--layers", "4", "--pattern", "SSSA",
                             "--seed", "12"], "f16", "bf16"),
    "granitehybrid_moe": (["--arch", "granitehybrid", "--experts", "8", "--experts-used", "2", "--layers", "4",
                           "--pattern", "SASS", "--ssm-heads", "8", "--ssm-head-dim", "8", "--ssm-state", "8",
                           "--ssm-groups", "1", "--seed", "13"], "bf16", "f32"),
    "nemotron_h": (["--arch", "nemotron_h", "--layers", "6", "--pattern", "SFAFSF", "--seed", "14"], "f32", "f32"),
    "lfm2": (["--arch", "lfm2", "--layers", "6", "--pattern", "CCACCA", "--seed", "15"], "f16", "f32"),
    "nemotron_h_moe": (["--arch", "nemotron_h_moe", "--layers", "6", "--pattern", "SFAFSF", "--experts", "8",
                        "--experts-used", "2", "--moe-latent", "32", "--untied", "--seed", "19"], "f16", "bf16"),
    "lfm2moe": (["--arch", "lfm2moe", "--layers", "6", "--pattern", "CCACCA", "--experts", "8", "--experts-used", "2",
                 "--seed", "20"], "f32", "f32"),
    "falcon_h1": (["--arch", "falcon-h1", "--layers", "3", "--pattern", "HHH", "--untied", "--seed", "16"], "bf16", "bf16"),
    "jamba": (["--arch", "jamba", "--layers", "4", "--pattern", "BBAB", "--experts", "4", "--experts-used", "2",
               "--untied", "--seed", "17"], "f16", "f32"),
    "kimi_linear": (["--arch", "kimi-linear", "--layers", "4", "--pattern", "KKMK", "--experts", "8",
                     "--experts-used", "2", "--seed", "18"], "f32", "bf16"),
}
TESTS = ["test_generate", "test_cache_bytes", "test_prefix", "test_n_fork", "test_cancel"]

WORDS = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing "
         "matches in a cold northern hall").split()


def text_of(n_words, salt):
    """A prompt of n_words plain words (byte tokens: one per character), distinct per salt."""
    return f"{salt}: " + " ".join(WORDS[(i * 7 + len(salt)) % len(WORDS)] for i in range(n_words))


# ---------------------------------------------------------------------------
# independent sources of the shapes
# ---------------------------------------------------------------------------

def gguf_metadata(path):
    """The key/value metadata of a GGUF file (docs/models.md section 5), standard library only."""
    with open(path, "rb") as f:
        buf = f.read(4 << 20)
    pos = 0

    def take(n):
        nonlocal pos
        b = buf[pos:pos + n]
        pos += n
        return b
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def value(t):
        if t == 8:
            n, = struct.unpack("<Q", take(8))
            return take(n).decode("utf-8", "replace")
        if t == 9:
            et, n = struct.unpack("<IQ", take(12))
            return [value(et) for _ in range(n)]
        return struct.unpack(fmt[t], take(struct.calcsize(fmt[t])))[0]
    magic, _version, _n_tensors, n_kv = struct.unpack("<IIQQ", take(24))
    if magic != 0x46554747:
        raise ValueError(f"{path}: not GGUF")
    out = {}
    for _ in range(n_kv):
        n, = struct.unpack("<Q", take(8))
        key = take(n).decode()
        t, = struct.unpack("<I", take(4))
        out[key] = value(t)
    return out


def info_shapes(model):
    """The shapes `hyserve info -m` prints: layer letters, embedding, attention, DeltaNet and Mamba-2
    dims (its byte lines are the engine's own arithmetic and are not read)."""
    r = hs.run([HYSERVE, "info", "-m", model])
    out = r.stdout.decode()
    if r.returncode != 0:
        raise RuntimeError(f"hyserve info failed: {r.stderr.decode()[-300:]}")
    sh = {"arch": re.search(r"^architecture:\s+(\S+)", out, re.M).group(1),
          "layout": re.search(r"^layout:\s+([A-Z]+)", out, re.M).group(1),
          "n_embd": int(re.search(r"^embedding:\s+(\d+)", out, re.M).group(1))}
    m = re.search(r"^attention:\s+(\d+) query heads, (\d+) KV heads, head dim (\d+)", out, re.M)
    sh["heads"], sh["kv_heads"], sh["head_dim"] = map(int, m.groups())
    m = re.search(r"^deltanet:\s+(\d+) key heads x (\d+), (\d+) value heads x (\d+), conv kernel (\d+)", out, re.M)
    sh["dn_k_heads"], sh["dn_d_k"], sh["dn_v_heads"], sh["dn_d_v"], sh["dn_conv_k"] = map(int, m.groups())
    m = re.search(r"^mamba2 state:.*\((\d+) heads x (\d+), state (\d+), (\d+) groups\)", out, re.M)
    sh["m2_heads"], sh["m2_head_dim"], sh["m2_state"], sh["m2_groups"] = map(int, m.groups()) if m else (0, 0, 0, 0)
    m = re.search(r"^mamba1 state:.*\((\d+) channels, state (\d+)\)", out, re.M)
    sh["m1_inner"], sh["m1_state"] = map(int, m.groups()) if m else (0, 0)
    m = re.search(r"^kda state:.*\((\d+) heads x (\d+)\)", out, re.M)
    sh["kda_heads"], sh["kda_head_dim"] = map(int, m.groups()) if m else (0, 0)
    m = re.search(r"^mla:\s+(\d+) heads, kv_lora (\d+), rope (\d+)", out, re.M)
    sh["mla_heads"], sh["mla_kv_lora"], sh["mla_rope"] = map(int, m.groups()) if m else (0, 0, 0)
    return sh


class Expect:
    """Cache bytes from the published formulas (docs/models.md section 8, llama.cpp's shapes):
    GQA 2 * kv_heads * head_dim * kv_bytes per token per attention layer; DeltaNet
    n_v * d_k * d_v * state_bytes state and (K-1) * (2 n_k d_k + n_v d_v) * 4 conv per layer;
    Mamba-2 heads * head_dim * d_state * state_bytes state and (K-1) * (heads * head_dim +
    2 groups d_state) * 4 conv per layer; short conv (K-1) * n_embd * 4 per layer; Mamba-1
    d_inner * d_state * state_bytes state and (K-1) * d_inner * 4 conv; KDA (key dim = value
    dim = head_dim, one state matrix per head) heads * head_dim^2 * state_bytes state and
    (K-1) * 3 * heads * head_dim * 4 conv (q, k and v each convolved); MLA (kv_lora + rope) *
    kv_bytes per token per layer (DeepSeek-V2's latent and its shared RoPE key)."""

    def __init__(self, sh, arch_meta, kv_dtype, state_dtype):
        lay = sh["layout"]
        self.n_attn = lay.count("A") + lay.count("H")
        self.n_dn = lay.count("L")
        self.n_m2 = lay.count("S") + lay.count("H")
        self.n_sc = lay.count("C")
        self.n_m1, self.n_kda, self.n_mla = lay.count("B"), lay.count("K"), lay.count("M")
        kvb, sb = DTYPE_BYTES[kv_dtype], DTYPE_BYTES[state_dtype]
        self.gqa_per_token = self.n_attn * 2 * sh["kv_heads"] * sh["head_dim"] * kvb
        self.mla_per_token = self.n_mla * (sh["mla_kv_lora"] + sh["mla_rope"]) * kvb
        self.per_token = self.gqa_per_token + self.mla_per_token
        k_ssm = arch_meta.get("ssm.conv_kernel", 0)
        k_sc = arch_meta.get("shortconv.l_cache", 0)
        self.dn_state = self.n_dn * sh["dn_v_heads"] * sh["dn_d_k"] * sh["dn_d_v"] * sb
        self.dn_conv = self.n_dn * (k_ssm - 1) * (2 * sh["dn_k_heads"] * sh["dn_d_k"] + sh["dn_v_heads"] * sh["dn_d_v"]) * 4
        self.m2_state = self.n_m2 * sh["m2_heads"] * sh["m2_head_dim"] * sh["m2_state"] * sb
        self.m2_conv = self.n_m2 * (k_ssm - 1) * (sh["m2_heads"] * sh["m2_head_dim"] + 2 * sh["m2_groups"] * sh["m2_state"]) * 4
        self.sc_conv = self.n_sc * (k_sc - 1) * sh["n_embd"] * 4
        self.m1_state = self.n_m1 * sh["m1_inner"] * sh["m1_state"] * sb
        self.m1_conv = self.n_m1 * (k_ssm - 1) * sh["m1_inner"] * 4
        kd = sh["kda_heads"] * sh["kda_head_dim"]
        self.kda_state = self.n_kda * kd * sh["kda_head_dim"] * sb
        self.kda_conv = self.n_kda * (k_ssm - 1) * 3 * kd * 4
        self.state = self.dn_state + self.m2_state + self.m1_state + self.kda_state
        self.conv = self.dn_conv + self.m2_conv + self.sc_conv + self.m1_conv + self.kda_conv
        self.recurrent = self.state + self.conv

    def reserved(self, n_tokens, per_token=None):
        return -(-n_tokens // PAGE) * PAGE * (self.per_token if per_token is None else per_token)

    def by_kind(self):
        """model.cache_layout.recurrent.by_kind as it should read: {kind: (layers, state, conv)}."""
        out = {}
        if self.n_dn:
            out["gated_deltanet"] = (self.n_dn, self.dn_state, self.dn_conv)
        if self.n_m2:
            out["mamba2"] = (self.n_m2, self.m2_state, self.m2_conv)
        if self.n_sc:
            out["short_conv"] = (self.n_sc, 0, self.sc_conv)
        if self.n_m1:
            out["mamba"] = (self.n_m1, self.m1_state, self.m1_conv)
        if self.n_kda:
            out["kda"] = (self.n_kda, self.kda_state, self.kda_conv)
        return out


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

class Family:
    def __init__(self, name, model, srv, sh, exp, kv_dtype, state_dtype):
        self.name, self.model, self.srv, self.sh, self.exp = name, model, srv, sh, exp
        self.dtypes = ["--kv-dtype", kv_dtype, "--state-dtype", state_dtype]

    def cli_bytes(self, prompt, n):
        """`hyserve generate --temp 0` with the server's dtypes: (exit code, the raw bytes it printed)."""
        r = hs.run([HYSERVE, "generate", "-m", self.model, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1",
                    "-c", str(CTX)] + self.dtypes)
        return r.returncode, r.stdout

    def cli(self, prompt, n):
        """The same as text the way the server renders bytes (server_text)."""
        rc, out = self.cli_bytes(prompt, n)
        return rc, server_text(out)

    def rendered(self, msgs):
        return self.srv.jreq("POST", "/apply-template", {"messages": msgs})[2].get("prompt", "")

    def n_tokens(self, text):
        st, _, j, _ = self.srv.jreq("POST", "/tokenize", {"inputs": text})
        return len(j) if st == 200 else -1

    def chat(self, msgs, max_tokens, **extra):
        body = dict({"messages": msgs, "max_tokens": max_tokens, "temperature": 0}, **extra)
        return self.srv.jreq("POST", "/v1/chat/completions", body, timeout=120)


def server_text(b):
    """Bytes as the server renders generated text: each complete UTF-8 sequence as its character,
    every other byte as one U+FFFD of its own (Python's "replace" gives one U+FFFD per maximal
    subpart instead: e6 ab is one there, two here), and NUL as U+FFFD too (server/json.c: JSON text
    carries no NUL), so the CLI's raw bytes compare with it."""
    out, i = [], 0
    while i < len(b):
        if b[i] == 0:
            out.append("\ufffd")
            i += 1
            continue
        for n in (1, 2, 3, 4):
            try:
                out.append(b[i:i + n].decode("utf-8"))
                i += n
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def metrics_by_kind_ok(gauges, exp):
    """hyserve_recurrent_bytes{kind, part} of one live request against the formulas: each kind the
    model has, state and conv (short conv: conv only), and nothing else nonzero."""
    want = {}
    for kind, (_layers, state, conv) in exp.by_kind().items():
        want[(kind, "state")] = state
        want[(kind, "conv")] = conv
    return bool(gauges) and all(gauges.get(k, 0 if v == 0 else None) == v for k, v in want.items()) and all(
        v == 0 for k, v in gauges.items() if k not in want)


def prefix_hits(srv):
    """hyserve_prefix_cache_hits_total from /metrics."""
    _, _, b = srv.req("GET", "/metrics")
    for line in b.decode().splitlines():
        if line.startswith(("hyserve_prefix_cache_hits_total ", "hyserve_prefix_cache_hits_total{")):
            return int(float(line.split()[-1]))
    return None


def quiet(srv, timeout=5.0):
    """Waits until nothing runs or waits and no request holds cache; (ok, last /stats)."""
    deadline, s = time.time() + timeout, None
    while time.time() < deadline:
        s = srv.stats()
        pc = s["pools"]["prefix_cache"]
        # the store counts pages its entries share in each entry (docs/serving.md 11): the pool holds
        # at most its bytes
        if (s["scheduler"]["running"] == 0 and s["scheduler"]["waiting"] == 0 and not s["requests"]
                and s["totals"]["all_requests_bytes"] == 0 and s["pools"]["n_seqs"] == pc.get("entries", 0)
                and s["pools"]["reserved_bytes"] <= pc.get("bytes", 0)):
            return True, s
        time.sleep(0.02)
    return False, s


def open_stream(srv, path, body, rid):
    """POST a streaming body with X-Request-Id; (connection, response, SSE event iterator)."""
    c = srv.conn(120)
    c.request("POST", path, body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json", "X-Request-Id": rid})
    r = c.getresponse()
    return c, r, hs.sse_events(r)


def stream_error_type(payload):
    """The error type of a stream's error event: TGI's error_type, OpenAI's error.code (its type is
    the envelope's class, server_error)."""
    try:
        d = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    if "error_type" in d:
        return d["error_type"]
    e = d.get("error")
    return e.get("code") if isinstance(e, dict) else None


# ---------------------------------------------------------------------------
# the five checks
# ---------------------------------------------------------------------------

def test_generate(f):
    """Greedy chat and /generate equal the CLI on the same prompt."""
    tag = f.name
    msgs = [{"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": "Name a colour of the sea."}]
    n = 24
    st, _, j, b = f.chat(msgs, n, logprobs=True)
    text = j["choices"][0]["message"]["content"] if st == 200 else None
    check(f"{tag}: POST /v1/chat/completions answers 200 with text", st == 200 and text, f"{st} {b[:200]}")
    rendered = f.rendered(msgs)
    check(f"{tag}: the chat's prompt_tokens are the /tokenize count of the /apply-template prompt",
          st == 200 and rendered and j["usage"]["prompt_tokens"] == f.n_tokens(rendered),
          f"{j and j.get('usage')} vs {f.n_tokens(rendered)}")
    rc, out = f.cli_bytes(rendered, n)
    got = bytes(x for t in j["choices"][0]["logprobs"]["content"] for x in t["bytes"]) if st == 200 else None
    check(f"{tag}: greedy chat == hyserve generate --temp 0 on the rendered prompt, byte for byte (the tokens' "
          f"logprobs bytes) and as text", st == 200 and rc == 0 and got == out and text == server_text(out),
          f"{got!r} / {text!r} vs {out!r} (finish {j and j['choices'][0]['finish_reason']})")
    for prompt in ("Once upon a time", "The " + text_of(20, "gen")):
        st, _, j = hs.gen(f.srv, prompt, max_new_tokens=n)
        got = j.get("generated_text") if st == 200 and j else None
        rc, out = f.cli(prompt, n)
        check(f"{tag}: POST /generate ({prompt[:10]!r}) answers 200 with text, equal to hyserve generate --temp 0",
              st == 200 and got and rc == 0 and got == out, f"{st} {got!r} vs {out!r}")


def test_cache_bytes(f):
    """A live request's bytes by kind = the layout's = the planner's = the formulas."""
    tag, srv, exp = f.name, f.srv, f.exp
    lay = srv.stats()["model"]["cache_layout"]
    rec = lay.get("recurrent", {})
    want_kinds = exp.by_kind()
    got_kinds = {k: (v.get("layers"), v.get("ssm_state_bytes_per_seq", 0), v.get("conv_state_bytes_per_seq"))
                 for k, v in rec.get("by_kind", {}).items()}
    check(f"{tag}: /stats cache_layout.recurrent.by_kind = the formulas {want_kinds}",
          got_kinds == want_kinds and all(v[1] + v[2] > 0 for v in got_kinds.values()), json.dumps(rec))
    check(f"{tag}: /stats cache_layout: attention {exp.per_token} bytes per token, recurrent "
          f"{exp.state} state + {exp.conv} conv = {exp.recurrent} bytes per sequence",
          lay.get("attention", {}).get("bytes_per_token", 0) == exp.gqa_per_token
          and lay.get("mla", {}).get("bytes_per_token", 0) == exp.mla_per_token
          and rec.get("ssm_state_bytes_per_seq") == exp.state and rec.get("conv_state_bytes_per_seq") == exp.conv
          and rec.get("bytes_per_seq") == exp.recurrent, json.dumps(lay))
    if exp.n_m2:
        bk = rec.get("by_kind", {}).get("mamba2", {})
        check(f"{tag}: by_kind.mamba2 names the shapes info prints",
              [bk.get(k) for k in ("heads", "head_dim", "d_state", "groups")]
              == [f.sh[k] for k in ("m2_heads", "m2_head_dim", "m2_state", "m2_groups")], json.dumps(bk))
    if exp.n_m1:
        bk = rec.get("by_kind", {}).get("mamba", {})
        check(f"{tag}: by_kind.mamba names the shapes info prints",
              [bk.get("d_inner"), bk.get("d_state")] == [f.sh["m1_inner"], f.sh["m1_state"]], json.dumps(bk))
    if exp.n_kda:
        bk = rec.get("by_kind", {}).get("kda", {})
        check(f"{tag}: by_kind.kda names the shapes info prints",
              [bk.get("heads"), bk.get("head_dim")] == [f.sh["kda_heads"], f.sh["kda_head_dim"]], json.dumps(bk))

    prompt = text_of(30, f"bytes {tag}")
    n_prompt = f.n_tokens(prompt)
    rid = f"fam-bytes-{tag}"
    c, r, it = open_stream(srv, "/generate_stream", {"inputs": prompt, "parameters": {"max_new_tokens": LONG_NEW, "ignore_eos": True}}, rid)
    live, metrics, still = None, "", False
    try:
        first = next(it, None)
        for _ in range(400):
            st, _, j, _ = srv.jreq("GET", "/stats?request_id=" + rid)
            q = j.get("requests", []) if st == 200 else []
            if q and q[0]["state"] == "decoding" and q[0]["attn_kv"]["tokens"] > 0:    # past its prefill
                live = (j, q[0])
                metrics = srv.req("GET", "/metrics")[2].decode()
                # and still running after /metrics was read: its gauges saw it
                st, _, j2, _ = srv.jreq("GET", "/stats?request_id=" + rid)
                still = st == 200 and bool(j2.get("requests"))
                break
            time.sleep(0.005)
    finally:
        srv.req("DELETE", "/requests/" + rid)
        rest = list(it)
        c.close()
    if not check(f"{tag}: /stats?request_id= shows the live stream", first and live,
                 f"status {r.status} first {first} last {rest[-1:]}"):
        return
    s, q = live
    total = n_prompt + LONG_NEW
    by = q["cache_by_kind"]
    used = q["attn_kv"]["tokens"]          # the cached tokens of the attention pages, GQA or MLA
    want = {"gqa_kv": {"bytes_reserved": exp.reserved(total, exp.gqa_per_token),
                       "bytes_used": used * exp.gqa_per_token},
            "mla_latent": {"bytes_reserved": exp.reserved(total, exp.mla_per_token),
                           "bytes_used": used * exp.mla_per_token},
            "recurrent_state_bytes": exp.state, "recurrent_conv_bytes": exp.conv,
            "deltanet_state_bytes": exp.dn_state, "deltanet_conv_bytes": exp.dn_conv}
    if exp.n_m2:
        want.update(mamba2_state_bytes=exp.m2_state, mamba2_conv_bytes=exp.m2_conv)
    if exp.n_sc:
        want["shortconv_conv_bytes"] = exp.sc_conv
    if exp.n_m1:
        want.update(mamba_state_bytes=exp.m1_state, mamba_conv_bytes=exp.m1_conv)
    if exp.n_kda:
        want.update(kda_state_bytes=exp.kda_state, kda_conv_bytes=exp.kda_conv)
    got = {k: by.get(k) for k in want}
    check(f"{tag}: request cache_by_kind = the formulas ({n_prompt} + {LONG_NEW} tokens reserved, "
          f"{used} used)", got == want and q["cached_tokens"] == 0
          and 0 < used <= total, f"{json.dumps(by)} want {json.dumps(want)} request {json.dumps(q)[:400]}")
    extra = {k: v for k, v in by.items() if k not in want and v}
    check(f"{tag}: cache_by_kind has no kind the model lacks", not extra, json.dumps(by))
    rq = q["recurrent"]
    check(f"{tag}: request recurrent: {exp.state} state + {exp.conv} conv bytes, total owned = KV + recurrent",
          rq["state_bytes"] == exp.state and rq["conv_bytes"] == exp.conv and rq["bytes"] == exp.recurrent
          and q["total_bytes_owned"] == exp.reserved(total) + exp.recurrent, json.dumps(q)[:600])
    # docs/serving.md 6: totals are the same kinds summed over all requests (one runs here), disjoint
    # parts adding up to all_requests_bytes
    tot = s["totals"]
    check(f"{tag}: /stats totals = the formulas: {exp.reserved(total)} KV and latent, {exp.state} state, "
          f"{exp.conv} conv, adding up to all_requests_bytes",
          tot.get("gqa_kv_bytes") == exp.reserved(total, exp.gqa_per_token)
          and tot.get("recurrent_state_bytes") == exp.state and tot.get("recurrent_conv_bytes") == exp.conv
          and tot.get("mla_latent_bytes") == exp.reserved(total, exp.mla_per_token) and tot["all_requests_bytes"] == exp.reserved(total) + exp.recurrent
          + tot["checkpoint_bytes"] and tot["checkpoint_bytes"] == q["recurrent"]["checkpoint_bytes"], json.dumps(tot))
    gauges = {}
    for line in metrics.splitlines():
        if line.startswith("hyserve_recurrent_bytes{"):
            lab = dict(re.findall(r'(\w+)="([^"]*)"', line))
            gauges[(lab.get("layer_kind"), lab.get("part"))] = int(float(line.split()[-1]))
    check(f"{tag}: /metrics hyserve_recurrent_bytes by layer_kind and part, read while the request still ran, "
          f"= the formulas (nonzero where the model has the kind: the scrape saw the live request)",
          metrics_by_kind_ok(gauges, exp), f"still running after: {still}; {gauges} want {exp.by_kind()}")

    st, _, est, b = srv.jreq("POST", "/v1/memory/estimate", {"context": total})
    r = hs.run([HYSERVE, "mem", "-m", f.model, "--context", str(total), "--json"] + f.dtypes)
    mem = json.loads(r.stdout) if r.returncode == 0 else None
    for src, j in (("POST /v1/memory/estimate (served model)", est if st == 200 else None),
                   ("hyserve mem -m FILE --json", mem)):
        ok = j is not None
        if ok:
            L = j["layout"]
            ok = (j["total"]["bytes_reserved_per_sequence"] == q["total_bytes_owned"] == exp.reserved(total) + exp.recurrent
                  and j["per_sequence"]["recurrent_state_bytes"] == exp.recurrent
                  and j["per_token"]["attn_kv_bytes"] == exp.gqa_per_token
                  and j["per_token"]["mla_bytes"] == exp.mla_per_token
                  and j["per_token"]["total_bytes"] == exp.per_token
                  and j["total"]["bytes_used_per_sequence"] == total * exp.per_token + exp.recurrent
                  and j["prefix_cache"]["snapshot_bytes"] == exp.recurrent
                  and (not exp.n_dn or (L["deltanet"]["layers"], L["deltanet"]["ssm_state_bytes_per_seq"],
                                        L["deltanet"]["conv_state_bytes_per_seq"]) == want_kinds["gated_deltanet"])
                  and (not exp.n_m2 or (L["mamba2"]["layers"], L["mamba2"]["ssm_state_bytes_per_seq"],
                                        L["mamba2"]["conv_state_bytes_per_seq"]) == want_kinds["mamba2"])
                  and (not exp.n_sc or (L["shortconv"]["layers"], L["shortconv"]["conv_state_bytes_per_seq"])
                       == want_kinds["short_conv"][::2])
                  and (not exp.n_m1 or (L["mamba"]["layers"], L["mamba"]["ssm_state_bytes_per_seq"],
                                        L["mamba"]["conv_state_bytes_per_seq"]) == want_kinds["mamba"])
                  and (not exp.n_kda or (L["kda"]["layers"], L["kda"]["ssm_state_bytes_per_seq"],
                                         L["kda"]["conv_state_bytes_per_seq"]) == want_kinds["kda"]))
        check(f"{tag}: {src} = the live request's bytes = the formulas, by kind", ok,
              json.dumps(j)[:700] if j else (b[:200] if src.startswith("POST") else r.stderr[-300:]))
    if mem is not None and st == 200:
        check(f"{tag}: hyserve mem --json and /v1/memory/estimate agree", mem == est,
              f"{json.dumps(mem)[:300]} vs {json.dumps(est)[:300]}")


def test_prefix(f):
    """A long prompt twice and a second chat turn hit the prefix cache and read as cold."""
    tag, srv = f.name, f.srv
    prompt = text_of(24, f"prefix {tag} {time.time_ns()}")        # ~130 byte tokens, new to the store
    n_prompt = f.n_tokens(prompt)
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
    h0 = prefix_hits(srv)
    st1, _, a, b1 = srv.jreq("POST", "/v1/completions", body)
    st2, _, c, b2 = srv.jreq("POST", "/v1/completions", body)
    h1 = prefix_hits(srv)
    ok = st1 == 200 and st2 == 200
    c1 = a["usage"]["prompt_tokens_details"]["cached_tokens"] if ok else None
    c2 = c["usage"]["prompt_tokens_details"]["cached_tokens"] if ok else None
    check(f"{tag}: a {n_prompt}-token prompt: cold first (0 cached), the same again restores all but its last "
          f"token ({n_prompt - 1}), one hit counted", ok and n_prompt > 64 and c1 == 0 and c2 == n_prompt - 1
          and h1 == h0 + 1, f"{st1} {st2} cached {c1} {c2} hits {h0} {h1} {b1[:100]} {b2[:100]}")
    text_hit = c["choices"][0]["text"] if ok else None
    check(f"{tag}: the hit's greedy text equals the cold request's", ok and text_hit == a["choices"][0]["text"],
          f"{a and a['choices'][0]['text']!r} vs {text_hit!r}")

    system = "You are terse. " + text_of(14, f"system {tag}")
    t1 = [{"role": "system", "content": system}, {"role": "user", "content": "First question: " + text_of(6, "q1")}]
    st, _, j1, b = f.chat(t1, 12)
    if not check(f"{tag}: chat turn 1 answers 200", st == 200, b[:200]):
        return
    answer = j1["choices"][0]["message"]["content"]
    t2 = t1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then? " + text_of(5, "q2")}]
    p1 = j1["usage"]["prompt_tokens"]
    h0 = prefix_hits(srv)
    st, _, j2, b = f.chat(t2, 16)
    h1 = prefix_hits(srv)
    cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else None
    p2 = j2["usage"]["prompt_tokens"] if st == 200 else None
    # at least turn 1's prompt less one token (its snapshot there; the answer re-rendered as text need
    # not be the tokens generated: a byte that is not UTF-8 comes back as U+FFFD)
    check(f"{tag}: chat turn 2 ({p2} prompt tokens) restores at least turn 1's {p1} prompt tokens less one, "
          f"a hit counted", st == 200 and p1 - 1 <= cached < p2 and h1 == h0 + 1,
          f"cached {cached} hits {h0} {h1} {b[:200]}")
    warm = j2["choices"][0]["message"]["content"] if st == 200 else None
    st, _, rj, b = srv.jreq("POST", "/reset_prefix_cache")
    check(f"{tag}: POST /reset_prefix_cache frees the entries", st == 200 and rj["freed_entries"] >= 1, b[:200])
    st, _, j3, b = f.chat(t2, 16)
    cold = j3["choices"][0]["message"]["content"] if st == 200 else None
    c3 = j3["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else None
    rc, out = f.cli(f.rendered(t2), 16)
    check(f"{tag}: turn 2 with the hit reads as cold after the reset (0 cached) and as hyserve generate",
          warm is not None and warm == cold and c3 == 0 and rc == 0 and out == warm,
          f"hit {warm!r} cold {cold!r} (cached {c3}) cli {out!r}")


def test_n_fork(f):
    """n: 3 sampled choices are the n: 1 requests with the derived seeds, the prompt prefilled once."""
    tag, srv = f.name, f.srv
    seed = 2 ** 63 + 2024
    msgs = [{"role": "user", "content": f"Tell me about {tag} {time.time_ns()}: " + text_of(8, "fork")}]
    body = {"messages": msgs, "max_tokens": 12, "temperature": 2.0, "seed": seed}
    before = srv.stats()["scheduler"]["prompt_tokens_total"]
    st, _, j, b = srv.jreq("POST", "/v1/chat/completions", dict(body, n=3))
    grew = srv.stats()["scheduler"]["prompt_tokens_total"] - before
    ch = j.get("choices", []) if st == 200 and j else []
    texts = [x["message"]["content"] for x in ch]
    alone = []
    for i in range(3):
        s1, _, one, _ = srv.jreq("POST", "/v1/chat/completions", dict(body, seed=hs.choice_seed(seed, i), n=1))
        alone.append(one["choices"][0]["message"]["content"] if s1 == 200 else None)
    check(f"{tag}: chat n=3 (temperature 2, seed {seed}): choice i == the request with n=1 and seed "
          f"derive(seed, i)", st == 200 and [x["index"] for x in ch] == [0, 1, 2] and texts == alone,
          f"{st} {texts} vs {alone} {b[:200]}")
    check(f"{tag}: the 3 choices differ (different seeds)", len(set(texts)) > 1, f"{texts}")
    cached = j["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else 0
    check(f"{tag}: n=3 prefilled the prompt once ({j and j.get('usage', {}).get('prompt_tokens')} tokens, "
          f"{cached} cached; the counter grew by {grew})",
          st == 200 and grew == j["usage"]["prompt_tokens"] - cached > 0, f"{grew} {j and j.get('usage')}")


def test_cancel(f):
    """DELETE /requests/{id} ends a long chat stream with the cancelled event; the server goes on."""
    tag, srv = f.name, f.srv
    cancelled0 = srv.stats()["scheduler"]["cancelled_total"]
    rid = f"fam-cancel-{tag}"
    body = {"messages": [{"role": "user", "content": "Talk for a long time about " + tag}], "max_tokens": LONG_NEW,
            "temperature": 0, "ignore_eos": True, "stream": True}
    c, r, it = open_stream(srv, "/v1/chat/completions", body, rid)
    status = r.status
    got = [e for _, e in zip(range(3), it)]
    dst, _, db = srv.req("DELETE", "/requests/" + rid)
    rest = list(it)
    c.close()
    datas = [p for k, p in got + rest if k == "data"]
    last = [p for p in datas if p != "[DONE]"][-1:] or [""]
    n_chunks = len(datas)
    check(f"{tag}: DELETE /requests/{{id}} is 204 and the stream ends with the cancelled event "
          f"({n_chunks} data events, well short of {LONG_NEW} tokens)",
          status == 200 and dst == 204 and stream_error_type(last[0]) == "cancelled" and n_chunks < LONG_NEW,
          f"{status} {dst} {db[:100]} last {last[0][:200]!r}")
    ok, s = quiet(srv)
    check(f"{tag}: after the cancel no sequence is leaked (nothing running, no request in /stats, the pool holds "
          f"only the prefix store's entries), the cancel counted",
          ok and s["scheduler"]["cancelled_total"] == cancelled0 + 1,
          f"{s and json.dumps(s['scheduler'])[:300]} {s and json.dumps(s['pools'])[:300]}")
    st, _, j = hs.gen(srv, "After the cancel", max_new_tokens=8)
    rc, out = f.cli("After the cancel", 8)
    check(f"{tag}: the next request answers 200 with the CLI's greedy text",
          st == 200 and j.get("generated_text") and rc == 0 and j["generated_text"] == out,
          f"{st} {j} vs {out!r}")
    ok, s = quiet(srv)
    check(f"{tag}: and leaves nothing behind either", ok, f"{s and json.dumps(s['pools'])[:300]}")
    st, _, rj, b = srv.jreq("POST", "/reset_prefix_cache")
    p = srv.stats()["pools"]
    check(f"{tag}: POST /reset_prefix_cache then: the pool back to exactly zero (pages, slots, snapshots)",
          st == 200 and rj["pool_reserved_bytes"] == 0 and rj["running_requests"] == 0 and p["reserved_bytes"] == 0
          and p["n_seqs"] == 0 and p["attn_kv"]["blocks_used"] == 0 and p["recurrent"]["slots_used"] == 0
          and p["prefix_cache"]["snapshot_state_bytes_held"] == 0 and p["prefix_cache"]["snapshot_conv_bytes_held"] == 0,
          f"{b[:300]} {json.dumps(p)[:400]}")


# ---------------------------------------------------------------------------

def main(argv=None):
    names = [f"{t}[{fam}]" for fam in FAMILIES for t in TESTS]
    chosen = hs.select(sys.argv[1:] if argv is None else argv, names, "families")
    os.makedirs(TMP, exist_ok=True)
    t_start = time.monotonic()
    servers = []
    try:
        for fam, (synth, kv_dtype, state_dtype) in FAMILIES.items():
            todo = [t for t in TESTS if f"{t}[{fam}]" in chosen]
            if not todo:
                continue
            print(f"-- {fam}: synth {' '.join(synth)}; serve --kv-dtype {kv_dtype} --state-dtype {state_dtype}")
            model = os.path.join(TMP, fam + ".gguf")
            r = hs.run([HYSERVE, "synth", "-o", model] + synth + COMMON)
            if not check(f"{fam}: hyserve synth writes the model", r.returncode == 0, r.stderr.decode()[-400:]):
                continue
            try:
                sh = info_shapes(model)
                meta = gguf_metadata(model)
            except (RuntimeError, ValueError, AttributeError, OSError) as e:
                check(f"{fam}: hyserve info and the GGUF metadata read", False, repr(e))
                continue
            arch = meta["general.architecture"]
            am = {k[len(arch) + 1:]: v for k, v in meta.items() if k.startswith(arch + ".")}
            pattern = synth[synth.index("--pattern") + 1]
            lay = sh["layout"]
            meta_ok = sh["arch"] == arch and lay == pattern and am["embedding_length"] == sh["n_embd"]
            if "S" in lay:      # Mamba-2: llama.cpp's keys (heads = time_step_rank, inner = heads * head_dim)
                meta_ok = meta_ok and (am["ssm.time_step_rank"], am["ssm.inner_size"], am["ssm.state_size"],
                                       am["ssm.group_count"]) == (sh["m2_heads"], sh["m2_heads"] * sh["m2_head_dim"],
                                                                  sh["m2_state"], sh["m2_groups"])
            if "L" in lay:      # DeltaNet: group_count = key heads, state_size = d_k, time_step_rank = value heads
                meta_ok = meta_ok and (am["ssm.group_count"], am["ssm.state_size"], am["ssm.time_step_rank"],
                                       am["ssm.inner_size"], am["ssm.conv_kernel"]) == (
                    sh["dn_k_heads"], sh["dn_d_k"], sh["dn_v_heads"], sh["dn_v_heads"] * sh["dn_d_v"], sh["dn_conv_k"])
            if "C" in lay:
                meta_ok = meta_ok and am.get("shortconv.l_cache", 0) > 1
            if "H" in lay:      # Falcon-H1: Mamba-2 keys as above, beside the attention
                meta_ok = meta_ok and (am["ssm.time_step_rank"], am["ssm.inner_size"], am["ssm.state_size"],
                                       am["ssm.group_count"]) == (sh["m2_heads"], sh["m2_heads"] * sh["m2_head_dim"],
                                                                  sh["m2_state"], sh["m2_groups"])
            if "B" in lay:      # Mamba-1: ssm.inner_size channels, ssm.state_size states each
                meta_ok = meta_ok and (am["ssm.inner_size"], am["ssm.state_size"]) == (sh["m1_inner"], sh["m1_state"])
            if "K" in lay:      # KDA: kda.head_dim, heads = attention.head_count
                meta_ok = meta_ok and (am["kda.head_dim"], am["attention.head_count"]) == (
                    sh["kda_head_dim"], sh["kda_heads"])
            if "M" in lay:      # MLA: the latent rank and the RoPE part of the key
                meta_ok = meta_ok and (am["attention.kv_lora_rank"], am["rope.dimension_count"]) == (
                    sh["mla_kv_lora"], sh["mla_rope"])
            check(f"{fam}: hyserve info ({sh['arch']}, {lay}) agrees with the GGUF metadata", meta_ok,
                  f"{sh} {am}")
            exp = Expect(sh, am, kv_dtype, state_dtype)
            srv = hs.Server(fam, model, "-t", "1", "--ctx", str(CTX), "--max-seqs", "8", "--prefix-cache", "on",
                            "--kv-dtype", kv_dtype, "--state-dtype", state_dtype)
            servers.append(srv)
            f = Family(fam, model, srv, sh, exp, kv_dtype, state_dtype)
            for t in todo:
                try:
                    globals()[t](f)
                except Exception as e:  # noqa: BLE001 - a crash in a test is a failure, the others still run
                    import traceback
                    traceback.print_exc()
                    check(f"{fam}: {t} ran to the end", False, repr(e))
            srv.stop()
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        check("families suite ran to the end", False, repr(e))
    finally:
        for s in servers:
            s.stop()
        hs.check_server_logs(servers)
    print(f"-- {time.monotonic() - t_start:.1f} s")
    print(f"families: {hs.passed} passed, {hs.failed} failed")
    sys.exit(1 if hs.failed else 0)


if __name__ == "__main__":
    main()

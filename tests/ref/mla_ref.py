#!/usr/bin/python3
"""mla_ref.py - float64 numpy reference of DeepSeek-V2 multi-head latent attention (MLA).

Owns: the MLA mixer of docs/models.md section 3.2 in two independent forms, and the
two file flavours hyserve loads MLA layers from:
  - hybrid `qwen35` files with the extension key `hyserve.layer_kinds` (UINT8 array, one
    per trunk layer: 0 = gated GQA attention, 1 = Gated DeltaNet, 2 = MLA; it overrides
    full_attention_interval / attention.recurrent_layers). Every layer keeps attn_norm,
    post_attention_norm and the SwiGLU FFN; kinds 0 and 1 run qwen35_ref's code.
    MLA keys (prefix qwen35.): attention.head_count (shared with GQA), attention.kv_lora_rank,
    attention.q_lora_rank (absent or 0 = plain attn_q), attention.key_length_mla (d_nope +
    d_rope), attention.value_length_mla, rope.dimension_count_mla; rope.freq_base and
    attention.layer_norm_rms_epsilon are shared.
  - dense `deepseek2` files (section 3.3 keys, every layer MLA + dense SwiGLU, FFN pre-norm
    `ffn_norm`, leading_dense_block_count = block_count, no YaRN, no MoE).
MLA math, per token x and head h:
    q_h = [q_nope_h (d_nope) | q_pe_h (d_rope)] = (W_q x)_h   or  (W_qb rmsnorm(W_qa x) * q_a_norm)_h
    [c_raw (R) | k_pe_raw (d_rope)] = W_kva x
    c = rmsnorm(c_raw) * kv_a_norm;  k_pe = rope(k_pe_raw) (one key shared by all heads);
    q_pe = rope(q_pe)   with llama.cpp NORM RoPE: adjacent pairs (x[2i], x[2i+1]) rotated by
                        pos * theta^(-2i/d_rope)
    expanded: k_nope_h(t) = W_kb,h c(t); v_h(t) = W_vb,h c(t);
              score_h(t) = (q_nope_h . k_nope_h(t) + q_pe_h . k_pe(t)) / sqrt(d_nope + d_rope)
              out_h = sum_{t <= pos} softmax(score_h)(t) v_h(t)
    absorbed: q_abs_h = W_kb,h^T q_nope_h; score_h(t) = (q_abs_h . c(t) + q_pe_h . k_pe(t)) * scale;
              ctx_h = sum_t p_h(t) c(t); out_h = W_vb,h ctx_h
    y = W_o concat_h out_h       (no output gate)
  GGUF (ne order): attn_k_b {d_nope, R, n_h} -> numpy [n_h, R, d_nope] = W_kb,h^T per head;
  attn_v_b {R, d_v, n_h} -> numpy [n_h, d_v, R] = W_vb,h per head.
  The per-layer cache is the latent one of section 3.2: c (after its norm) and k_pe (after
  RoPE), R + d_rope numbers per token; both forms read it.
Does not: YaRN / rope scaling, MoE deepseek2 layers, legacy attn_kv_b files, tokenize, sample.
Written from the math notes (now docs/models.md) and the hyserve brief only (no engine code read).

CLI:
  /usr/bin/python3 tests/ref/mla_ref.py MODEL.gguf --tokens 1,2,3 [--all] [--mla-mode absorbed]
  /usr/bin/python3 tests/ref/mla_ref.py --self-test
prints {"tokens": [...], "logits": [[...], ...]}; files without MLA go to the existing
reference (models_ref.load_model / qwen35_ref.Qwen35Ref).
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_io import GGUFReader  # noqa: E402
from qwen35_ref import Hparams, Qwen35Ref, linear, rmsnorm  # noqa: E402

KINDS_KEY = "hyserve.layer_kinds"
KIND_ATTN, KIND_DELTANET, KIND_MLA = 0, 1, 2
KIND_LETTERS = {KIND_ATTN: "A", KIND_DELTANET: "L", KIND_MLA: "M"}
MODES = ("expanded", "absorbed")


# --------------------------------------------------------------------------
# MLA math

def rope_adjacent(x, pos, theta):
    """llama.cpp NORM RoPE over the whole last axis of x [T, ..., d]: pairs (x[2i], x[2i+1])
    rotated by pos[t] * theta^(-2i/d)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError("rope dimension %d is odd" % d)
    inv_freq = theta ** (-2.0 * np.arange(d // 2) / d)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, d/2]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (d // 2,)
    cos = np.cos(ang).reshape(shape)
    sin = np.sin(ang).reshape(shape)
    a = x[..., 0::2]
    b = x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = a * cos - b * sin
    y[..., 1::2] = a * sin + b * cos
    return y


class MlaDims:
    """n_head, kv_lora (R), q_lora (0 = none), d_nope, d_rope, d_v, theta, eps, scale."""

    def __init__(self, n_head, kv_lora, q_lora, d_nope, d_rope, d_v, theta, eps):
        self.n_head, self.kv_lora, self.q_lora = n_head, kv_lora, q_lora
        self.d_nope, self.d_rope, self.d_v = d_nope, d_rope, d_v
        self.theta, self.eps = theta, eps
        self.scale = 1.0 / math.sqrt(d_nope + d_rope)
        if min(n_head, kv_lora, d_v, d_rope) <= 0 or d_nope < 0 or q_lora < 0:
            raise ValueError("bad MLA dimensions %r" % self.__dict__)
        if d_rope % 2:
            raise ValueError("MLA rope dimension %d is odd" % d_rope)

    def __repr__(self):
        return ("MlaDims(n_head=%d, kv_lora=%d, q_lora=%d, d_nope=%d, d_rope=%d, d_v=%d)"
                % (self.n_head, self.kv_lora, self.q_lora, self.d_nope, self.d_rope, self.d_v))


def mla_project(W, x, pos, dims):
    """The token-local part. x [T, E] (already attn-normed). Returns
    q_nope [T, H, d_nope], q_pe [T, H, d_rope] (roped), c [T, R] (normed), k_pe [T, d_rope] (roped)."""
    T = x.shape[0]
    H, R, dn, dr = dims.n_head, dims.kv_lora, dims.d_nope, dims.d_rope
    if "wq" in W:
        q = linear(x, W["wq"])
    else:
        q = linear(rmsnorm(linear(x, W["wq_a"]), W["q_a_norm"], dims.eps), W["wq_b"])
    q = q.reshape(T, H, dn + dr)
    q_nope = q[:, :, :dn]
    q_pe = rope_adjacent(q[:, :, dn:], pos, dims.theta)
    kv = linear(x, W["wkv_a"])                                  # [T, R + d_rope]
    c = rmsnorm(kv[:, :R], W["kv_a_norm"], dims.eps)
    k_pe = rope_adjacent(kv[:, R:], pos, dims.theta)
    return q_nope, q_pe, c, k_pe


def _causal_softmax(s, P):
    """s [..., T, P+T]: query t (absolute P + t) sees keys 0 .. P + t."""
    T, S = s.shape[-2:]
    mask = np.arange(S)[None, :] <= (P + np.arange(T))[:, None]
    s = np.where(mask, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def mla_attend_expanded(q_nope, q_pe, c, k_pe, wk_b, wv_b, scale, P=0):
    """Per-head keys and values rebuilt from the latent. q_* for T new tokens; c [P+T, R],
    k_pe [P+T, d_rope] for every visible position. Returns out [T, H, d_v]."""
    k_nope = np.einsum("sr,hrn->hsn", c, wk_b)                  # W_kb,h c(s)  [H, S, d_nope]
    v = np.einsum("sr,hvr->hsv", c, wv_b)                       # W_vb,h c(s)  [H, S, d_v]
    s = np.einsum("thn,hsn->hts", q_nope, k_nope) + np.einsum("thd,sd->hts", q_pe, k_pe)
    p = _causal_softmax(s * scale, P)                           # [H, T, S]
    return np.einsum("hts,hsv->thv", p, v)


def mla_attend_absorbed(q_nope, q_pe, c, k_pe, wk_b, wv_b, scale, P=0):
    """MQA over the (R + d_rope)-dim latent key; the value is the latent itself."""
    q_abs = np.einsum("hrn,thn->thr", wk_b, q_nope)            # W_kb,h^T q_nope_h  [T, H, R]
    s = np.einsum("thr,sr->hts", q_abs, c) + np.einsum("thd,sd->hts", q_pe, k_pe)
    p = _causal_softmax(s * scale, P)                           # [H, T, S]
    ctx = np.einsum("hts,sr->thr", p, c)                        # [T, H, R]
    return np.einsum("hvr,thr->thv", wv_b, ctx)                 # W_vb,h ctx_h


def mla_attend_naive(q_nope, q_pe, c, k_pe, wk_b, wv_b, scale, P=0):
    """Plain loops: MHA with the full per-head key [k_nope | k_pe] (a third, obvious form)."""
    T, H, _ = q_nope.shape
    out = np.zeros((T, H, wv_b.shape[1]))
    for h in range(H):
        Wkb = wk_b[h].T                                         # [d_nope, R]
        Wvb = wv_b[h]                                           # [d_v, R]
        for t in range(T):
            qf = np.concatenate([q_nope[t, h], q_pe[t, h]])
            n = P + t + 1
            sc = np.array([qf @ np.concatenate([Wkb @ c[s], k_pe[s]]) * scale for s in range(n)])
            w = np.exp(sc - sc.max())
            w /= w.sum()
            for s in range(n):
                out[t, h] += w[s] * (Wvb @ c[s])
    return out


ATTEND = {"expanded": mla_attend_expanded, "absorbed": mla_attend_absorbed, "naive": mla_attend_naive}


def mla_mixer(W, x, pos, dims, cache=None, mode="expanded"):
    """One MLA layer's mixer. x [T, E] (attn-normed), pos [T] absolute positions.
    cache: None or a dict {"c": [P, R], "k_pe": [P, d_rope]} of earlier positions (the latent
    cache: c after kv_a_norm, k_pe after RoPE), extended in place. Returns [T, E]."""
    T = x.shape[0]
    q_nope, q_pe, c, k_pe = mla_project(W, x, pos, dims)
    P = 0
    if cache is not None:
        if "c" in cache:
            P = cache["c"].shape[0]
            c = np.concatenate([cache["c"], c])
            k_pe = np.concatenate([cache["k_pe"], k_pe])
        cache["c"], cache["k_pe"] = c, k_pe
    out = ATTEND[mode](q_nope, q_pe, c, k_pe, W["wk_b"], W["wv_b"], dims.scale, P)
    return linear(out.reshape(T, dims.n_head * dims.d_v), W["wo"])


# --------------------------------------------------------------------------
# loading

def _tensor_getter(r):
    def t(name, shape):
        if name not in r.tensors:
            raise KeyError("missing tensor %s" % name)
        a = r.tensor(name)
        if a.shape != tuple(shape):
            raise ValueError("tensor %s: numpy shape %s, expected %s (ne reversed: ne = %s)"
                             % (name, a.shape, tuple(shape), tuple(reversed(shape))))
        return a
    return t


def _kv_int(r, key, default=None):
    if key in r.kv:
        return int(r.kv[key])
    if default is None:
        raise KeyError("missing metadata key %s" % key)
    return default


def load_mla_tensors(t, p, dims, n_embd):
    """The MLA tensors of one layer (prefix p = 'blk.N.') as a dict for mla_mixer."""
    E, H, R = n_embd, dims.n_head, dims.kv_lora
    dn, dr, dv, ql = dims.d_nope, dims.d_rope, dims.d_v, dims.q_lora
    W = {}
    if ql:
        W["wq_a"] = t(p + "attn_q_a.weight", (ql, E))
        W["q_a_norm"] = t(p + "attn_q_a_norm.weight", (ql,))
        W["wq_b"] = t(p + "attn_q_b.weight", (H * (dn + dr), ql))
    else:
        W["wq"] = t(p + "attn_q.weight", (H * (dn + dr), E))
    W["wkv_a"] = t(p + "attn_kv_a_mqa.weight", (R + dr, E))
    W["kv_a_norm"] = t(p + "attn_kv_a_norm.weight", (R,))
    W["wk_b"] = t(p + "attn_k_b.weight", (H, R, dn))            # ne {d_nope, R, n_h}
    W["wv_b"] = t(p + "attn_v_b.weight", (H, dv, R))            # ne {R, d_v, n_h}
    W["wo"] = t(p + "attn_output.weight", (E, H * dv))          # ne {n_h*d_v, E}
    return W


def mla_dims_from(r, arch, n_head, theta, eps):
    """MLA hyperparameters; qwen35 names its rope width rope.dimension_count_mla,
    deepseek2 rope.dimension_count."""
    pre = arch + "."
    R = _kv_int(r, pre + "attention.kv_lora_rank")
    ql = _kv_int(r, pre + "attention.q_lora_rank", 0)
    dqk = _kv_int(r, pre + "attention.key_length_mla")
    dv = _kv_int(r, pre + "attention.value_length_mla")
    dr = _kv_int(r, pre + ("rope.dimension_count" if arch == "deepseek2" else "rope.dimension_count_mla"))
    if dr > dqk:
        raise ValueError("MLA rope dimension %d > key_length_mla %d" % (dr, dqk))
    return MlaDims(n_head, R, ql, dqk - dr, dr, dv, theta, eps)


def read_layer_kinds(r, n_layer, n_block):
    """hyserve.layer_kinds as a list of n_layer ints, or None when the key is absent."""
    if KINDS_KEY not in r.kv:
        return None
    v = r.kv[KINDS_KEY]
    if not isinstance(v, (list, tuple)):
        raise ValueError("%s is not an array" % KINDS_KEY)
    if len(v) not in (n_layer, n_block):
        raise ValueError("%s has %d entries, expected %d (trunk layers)" % (KINDS_KEY, len(v), n_layer))
    kinds = [int(k) for k in v[:n_layer]]
    bad = [k for k in kinds if k not in KIND_LETTERS]
    if bad:
        raise ValueError("%s: unknown layer kind %d (0 attention, 1 DeltaNet, 2 MLA)" % (KINDS_KEY, bad[0]))
    return kinds


class _KvView:
    """A reader stand-in for qwen35_ref.Hparams: the file's metadata plus harmless defaults for
    keys only a layer kind the file does not use would need, without recurrent_layers (the
    layer kinds override it)."""

    def __init__(self, r, kinds):
        self.kv = dict(r.kv)
        self.tensors = r.tensors
        a = "qwen35."
        self.kv.pop(a + "attention.recurrent_layers", None)
        if KIND_DELTANET not in kinds:
            for k, v in (("ssm.conv_kernel", 4), ("ssm.state_size", 1), ("ssm.group_count", 1),
                         ("ssm.time_step_rank", 1), ("ssm.inner_size", 1)):
                self.kv.setdefault(a + k, v)
        if KIND_ATTN not in kinds:
            self.kv.setdefault(a + "attention.head_count_kv", self.kv.get(a + "attention.head_count", 1))
            n_rot = int(self.kv.get(a + "rope.dimension_count", 2))
            self.kv.setdefault(a + "attention.key_length", max(2, n_rot))
            self.kv.setdefault(a + "attention.value_length", self.kv[a + "attention.key_length"])

    def get(self, key, default=None):
        return self.kv.get(key, default)


class MlaModelBase(Qwen35Ref):
    """Common forward over layers of kind 0/1/2 (norm -> mixer -> residual -> norm -> FFN ->
    residual, as qwen35_ref's loop). A layer dict has "kind", "attn_norm", "post_norm" (the
    FFN-input norm), ffn_gate/up/down and the mixer's tensors; an MLA layer's are flattened
    in as "mla.<name>" (so helpers that walk the layer dicts' arrays see them too)."""

    mla_mode = "expanded"

    def kinds_string(self):
        return "".join(KIND_LETTERS[L["kind"]] for L in self.layers)

    def mla(self, L, x, pos, cache=None, mode=None):
        W = {k[4:]: v for k, v in L.items() if k.startswith("mla.")}
        return mla_mixer(W, x, pos, self.mla_dims, cache, mode or self.mla_mode)

    def forward(self, tokens, chunked=False, chunk=64, caches=None, pos0=0, mla_mode=None):
        """Logits [T, n_vocab] for tokens at positions pos0 ..; caches as in qwen35_ref
        (new_caches()); mla_mode 'expanded' | 'absorbed' | 'naive' (default self.mla_mode)."""
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError("need a non-empty token list")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError("token id out of range [0, %d)" % self.n_vocab)
        eps = self.hp.eps
        pos = pos0 + np.arange(len(toks))
        x = self.tok_embd[toks]
        for il, L in enumerate(self.layers):
            cache = None if caches is None else caches[il]
            xn = rmsnorm(x, L["attn_norm"], eps)
            if L["kind"] == KIND_MLA:
                x = x + self.mla(L, xn, pos, cache, mla_mode)
            elif L["kind"] == KIND_DELTANET:
                x = x + self.deltanet(L, xn, chunked, chunk, cache)
            else:
                x = x + self.attention(L, xn, pos, cache)
            xn = rmsnorm(x, L["post_norm"], eps)
            x = x + self.ffn(L, xn)
        x = rmsnorm(x, self.output_norm, eps)
        return linear(x, self.output)

    def _globals(self, r, t, D):
        self.tok_embd = r.tensor("token_embd.weight")
        if self.tok_embd.ndim != 2 or self.tok_embd.shape[1] != D:
            raise ValueError("token_embd.weight shape %s, expected (n_vocab, %d)" % (self.tok_embd.shape, D))
        self.n_vocab = self.tok_embd.shape[0]
        self.output_norm = t("output_norm.weight", (D,))
        self.output = t("output.weight", (self.n_vocab, D)) if "output.weight" in r.tensors else self.tok_embd

    def _ffn_tensors(self, t, p, D, F, norm_name):
        return {"post_norm": t(p + norm_name, (D,)),
                "ffn_gate": t(p + "ffn_gate.weight", (F, D)),
                "ffn_up": t(p + "ffn_up.weight", (F, D)),
                "ffn_down": t(p + "ffn_down.weight", (D, F))}

    def _mla_layer(self, t, p, D):
        W = load_mla_tensors(t, p, self.mla_dims, D)
        return {"mla." + k: v for k, v in W.items()}


class HybridMlaRef(MlaModelBase):
    """qwen35 file whose layer layout comes from hyserve.layer_kinds (0 A, 1 L, 2 M)."""

    def __init__(self, path):
        r = GGUFReader(path)
        self.reader = r
        if r.get("general.architecture") != "qwen35":
            raise ValueError("HybridMlaRef: architecture %r, expected 'qwen35'" % r.get("general.architecture"))
        n_block = _kv_int(r, "qwen35.block_count")
        n_layer = n_block - _kv_int(r, "qwen35.nextn_predict_layers", 0)
        kinds = read_layer_kinds(r, n_layer, n_block)
        if kinds is None:
            raise ValueError("no %s key: not an MLA hybrid (use qwen35_ref)" % KINDS_KEY)
        self.hp = hp = Hparams(_KvView(r, kinds))
        hp.kinds = kinds
        hp.recurrent = [k == KIND_DELTANET for k in kinds]
        self.mla_dims = None
        if KIND_MLA in kinds:
            self.mla_dims = mla_dims_from(r, "qwen35", hp.n_head, hp.rope_theta, hp.eps)
        t = _tensor_getter(r)
        D, F = hp.n_embd, hp.n_ff
        self._globals(r, t, D)
        key_dim, value_dim = hp.n_k * hp.d_k, hp.n_v * hp.d_v
        conv_dim = 2 * key_dim + value_dim
        hd = hp.head_dim
        self.layers = []
        for il, kind in enumerate(kinds):
            p = "blk.%d." % il
            L = {"kind": kind, "recurrent": kind == KIND_DELTANET,
                 "attn_norm": t(p + "attn_norm.weight", (D,))}
            L.update(self._ffn_tensors(t, p, D, F, "post_attention_norm.weight"))
            if kind == KIND_DELTANET:       # the dict qwen35_ref.Qwen35Ref.deltanet reads
                L.update({
                    "qkv": t(p + "attn_qkv.weight", (conv_dim, D)),
                    "gate": t(p + "attn_gate.weight", (value_dim, D)),
                    "beta": t(p + "ssm_beta.weight", (hp.n_v, D)),
                    "alpha": t(p + "ssm_alpha.weight", (hp.n_v, D)),
                    "conv": t(p + "ssm_conv1d.weight", (conv_dim, hp.conv_k)),
                    "dt_bias": t(p + "ssm_dt.bias", (hp.n_v,)),
                    "a": t(p + "ssm_a", (hp.n_v,)),
                    "norm": t(p + "ssm_norm.weight", (hp.d_v,)),
                    "out": t(p + "ssm_out.weight", (D, value_dim)),
                })
            elif kind == KIND_ATTN:         # the dict qwen35_ref.Qwen35Ref.attention reads
                L.update({
                    "wq": t(p + "attn_q.weight", (2 * hp.n_head * hd, D)),
                    "wk": t(p + "attn_k.weight", (hp.n_head_kv * hd, D)),
                    "wv": t(p + "attn_v.weight", (hp.n_head_kv * hd, D)),
                    "wo": t(p + "attn_output.weight", (D, hp.n_head * hd)),
                    "q_norm": t(p + "attn_q_norm.weight", (hd,)),
                    "k_norm": t(p + "attn_k_norm.weight", (hd,)),
                })
            else:
                L.update(self._mla_layer(t, p, D))
            self.layers.append(L)


class DenseHp:
    pass


class Deepseek2Ref(MlaModelBase):
    """Dense deepseek2 file: every layer MLA + SwiGLU FFN (pre-norm ffn_norm)."""

    def __init__(self, path):
        r = GGUFReader(path)
        self.reader = r
        a = "deepseek2."
        if r.get("general.architecture") != "deepseek2":
            raise ValueError("Deepseek2Ref: architecture %r" % r.get("general.architecture"))
        hp = self.hp = DenseHp()
        hp.n_layer = _kv_int(r, a + "block_count")
        hp.n_embd = _kv_int(r, a + "embedding_length")
        hp.n_ff = _kv_int(r, a + "feed_forward_length")
        hp.n_head = _kv_int(r, a + "attention.head_count")
        if a + "attention.layer_norm_rms_epsilon" not in r.kv:
            raise KeyError("missing metadata key %sattention.layer_norm_rms_epsilon" % a)
        hp.eps = float(r.kv[a + "attention.layer_norm_rms_epsilon"])
        hp.rope_theta = float(r.kv.get(a + "rope.freq_base", 10000.0))
        hp.kinds = [KIND_MLA] * hp.n_layer
        hp.recurrent = [False] * hp.n_layer
        n_dense = _kv_int(r, a + "leading_dense_block_count", hp.n_layer)
        if n_dense < hp.n_layer and int(r.kv.get(a + "expert_count", 0) or 0):
            raise ValueError("deepseek2 MoE layers (leading_dense_block_count %d < block_count %d) not supported"
                             % (n_dense, hp.n_layer))
        st = r.kv.get(a + "rope.scaling.type")
        if st not in (None, "none"):
            raise ValueError("rope.scaling.type %r not supported (no YaRN in the reference)" % st)
        self.mla_dims = d = mla_dims_from(r, "deepseek2", hp.n_head, hp.rope_theta, hp.eps)
        # the converter's MQA view of the latent cache (section 3.3)
        for key, want in (("attention.head_count_kv", 1), ("attention.key_length", d.kv_lora + d.d_rope),
                          ("attention.value_length", d.kv_lora)):
            if a + key in r.kv and int(r.kv[a + key]) != want:
                raise ValueError("%s%s = %d, expected %d" % (a, key, int(r.kv[a + key]), want))
        t = _tensor_getter(r)
        D, F = hp.n_embd, hp.n_ff
        self._globals(r, t, D)
        self.layers = []
        for il in range(hp.n_layer):
            p = "blk.%d." % il
            L = {"kind": KIND_MLA, "recurrent": False, "attn_norm": t(p + "attn_norm.weight", (D,))}
            L.update(self._ffn_tensors(t, p, D, F, "ffn_norm.weight"))
            L.update(self._mla_layer(t, p, D))
            self.layers.append(L)


def load_model(path):
    """The reference for any file: MLA flavours here, everything else by the existing reference."""
    r = GGUFReader(path)
    arch = r.get("general.architecture")
    has_kinds = KINDS_KEY in r.kv
    del r
    if arch == "deepseek2":
        return Deepseek2Ref(path)
    if arch == "qwen35" and has_kinds:
        return HybridMlaRef(path)
    try:
        from models_ref import load_model as other
    except ImportError:
        other = Qwen35Ref
    return other(path)


# --------------------------------------------------------------------------
# self-test: the three attention forms agree

def random_mla_weights(rng, E, dims):
    H, R, dn, dr, dv, ql = dims.n_head, dims.kv_lora, dims.d_nope, dims.d_rope, dims.d_v, dims.q_lora

    def mat(o, i):
        return rng.standard_normal((o, i)) / math.sqrt(i)
    W = {"wkv_a": mat(R + dr, E), "kv_a_norm": 1.0 + 0.1 * rng.standard_normal(R),
         "wk_b": rng.standard_normal((H, R, dn)) / math.sqrt(R),
         "wv_b": rng.standard_normal((H, dv, R)) / math.sqrt(R), "wo": mat(E, H * dv)}
    if ql:
        W.update({"wq_a": mat(ql, E), "q_a_norm": 1.0 + 0.1 * rng.standard_normal(ql), "wq_b": mat(H * (dn + dr), ql)})
    else:
        W["wq"] = mat(H * (dn + dr), E)
    return W


def self_test_mla(verbose=False):
    """Max relative disagreement of absorbed and naive vs expanded, over shapes with and
    without q_lora, d_nope 0, a cached prefix, and large positions."""
    rng = np.random.default_rng(4321)
    worst = 0.0
    cases = [  # E, H, R, q_lora, d_nope, d_rope, d_v, T, P, pos offset
        (32, 2, 16, 0, 8, 4, 8, 9, 0, 0), (48, 4, 32, 24, 16, 8, 16, 13, 6, 0),
        (24, 3, 8, 0, 0, 6, 4, 5, 3, 1000), (64, 1, 64, 16, 32, 16, 32, 17, 0, 70000),
        (40, 5, 12, 0, 6, 2, 20, 11, 9, 7)]
    for (E, H, R, ql, dn, dr, dv, T, P, off) in cases:
        dims = MlaDims(H, R, ql, dn, dr, dv, 1e4, 1e-6)
        W = random_mla_weights(rng, E, dims)
        x = rng.standard_normal((P + T, E))
        pos = off + np.arange(P + T)
        outs = {}
        for mode in ("expanded", "absorbed", "naive"):
            cache = {}
            if P:
                mla_mixer(W, x[:P], pos[:P], dims, cache, mode)
            outs[mode] = mla_mixer(W, x[P:], pos[P:], dims, cache, mode)
        ref = outs["expanded"]
        e = max(np.abs(outs[m] - ref).max() / np.abs(ref).max() for m in ("absorbed", "naive"))
        if verbose:
            print("  E=%d H=%d R=%d q_lora=%d nope=%d rope=%d v=%d T=%d P=%d pos0=%d: rel err %.3e"
                  % (E, H, R, ql, dn, dr, dv, T, P, off, e))
        worst = max(worst, e)
    return worst


def self_test_rope(verbose=False):
    """rope_adjacent: norms kept, position 0 is identity, and a rotation by p then q equals p+q."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 2, 8))
    e = 0.0
    y = rope_adjacent(x, np.array([0, 5, 11]), 1e4)
    e = max(e, np.abs(y[0] - x[0]).max())
    e = max(e, np.abs(np.linalg.norm(y, axis=-1) - np.linalg.norm(x, axis=-1)).max())
    z = rope_adjacent(rope_adjacent(x, np.array([2, 3, 4]), 1e4), np.array([3, 4, 5]), 1e4)
    e = max(e, np.abs(z - rope_adjacent(x, np.array([5, 7, 9]), 1e4)).max())
    # pair 0 of position 1 turns by exactly 1 radian; pair i by theta^(-2i/d)
    u = np.zeros((1, 8))
    u[0, 0::2] = 1.0
    v = rope_adjacent(u, np.array([1]), 1e4)
    ang = np.arctan2(v[0, 1::2], v[0, 0::2])
    e = max(e, np.abs(ang - 1e4 ** (-2.0 * np.arange(4) / 8)).max())
    if verbose:
        print("  rope_adjacent identities: max err %.3e" % e)
    return e


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 MLA reference forward (qwen35 + hyserve.layer_kinds, deepseek2)")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--all", action="store_true", help="logits for every position")
    ap.add_argument("--mla-mode", choices=MODES + ("naive",), default="expanded")
    ap.add_argument("--chunked", action="store_true", help="use the chunked DeltaNet form")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--self-test", action="store_true", help="absorbed vs expanded MLA, RoPE identities")
    args = ap.parse_args(argv)
    if args.self_test:
        e1 = self_test_mla(verbose=True)
        e2 = self_test_rope(verbose=True)
        ok = e1 < 1e-10 and e2 < 1e-12
        print("MLA absorbed/naive vs expanded: max rel err %.3e; rope %.3e %s" % (e1, e2, "ok" if ok else "FAIL"))
        return 0 if ok else 1
    if not args.model or args.tokens is None:
        ap.error("MODEL and --tokens are required")
    tokens = [int(s) for s in args.tokens.split(",") if s.strip()]
    m = load_model(args.model)
    if isinstance(m, MlaModelBase):
        logits = m.forward(tokens, chunked=args.chunked, chunk=args.chunk, mla_mode=args.mla_mode)
    else:
        logits = m.forward(tokens, chunked=args.chunked, chunk=args.chunk)
    rows = logits if args.all else logits[-1:]
    json.dump({"tokens": tokens, "logits": [[float(v) for v in row] for row in rows]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

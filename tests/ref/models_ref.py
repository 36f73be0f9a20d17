#!/usr/bin/python3
"""models_ref.py - float64 numpy reference forward of the non-qwen35 architectures.

Owns:
  qwen3next  Qwen3-Next: qwen35's hybrid layout and gated attention, but
             - DeltaNet inputs `attn_qkv` + `attn_gate` + `ssm_ba` (current files) or the
               fused legacy `ssm_in` + `ssm_ba` (docs/models.md 1.4(a), 2.3 item 5),
             - value heads in HF grouped order: value head h uses key head h // r (1.4(e)),
             - every FFN a mixture of experts with a sigmoid-gated shared expert (1.6).
  qwen3      dense Qwen3: plain GQA attention every layer, per-head q/k RMSNorm before RoPE,
             NeoX RoPE, `ffn_norm`, SwiGLU.
  llama      like qwen3 without q/k norm and with llama.cpp's NORM RoPE (adjacent pairs
             x[2i], x[2i+1]); optional Llama-3 `rope_freqs.weight` frequency factors.
  load_model(path) picks the class from general.architecture (qwen35 -> qwen35_ref.Qwen35Ref)
  and the CLI (same as qwen35_ref.py) runs any of them.
Does not: tokenize, sample, or run qwen3next MTP blocks (the trunk ignores them; qwen35's and
qwen35moe's MTP head is Qwen35Ref.mtp_logits), Mixtral-style
llama MoE, biases, or RoPE scaling keys other than rope_freqs.

All classes subclass qwen35_ref.Qwen35Ref and reuse its forward loop (norm -> mixer ->
residual -> norm -> FFN -> residual), DeltaNet core, attention and caches; a layer dict's
"post_norm" is the FFN-input norm (post_attention_norm for qwen3next, ffn_norm for
qwen3/llama).

CLI:
  /usr/bin/python3 tests/ref/models_ref.py MODEL.gguf --tokens 1,2,3 [--all] [--chunked]
prints {"tokens": [...], "logits": [[...], ...]} like qwen35_ref.py.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_io import GGUFReader  # noqa: E402
from qwen35_ref import (Hparams, Qwen35Ref, gated_attention_tensors, linear, rmsnorm,  # noqa: E402
                        rope_neox, sigmoid, silu, tensor_loader)

SUPPORTED = ("qwen35", "qwen3next", "qwen3", "llama")


# --------------------------------------------------------------------------
# shared pieces

def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def rope_norm(x, pos, n_rot, theta, freq_factors=None):
    """llama.cpp rope type NORM on x [T, H, D]: adjacent pairs (x[2i], x[2i+1]), i < n_rot/2,
    rotated by pos * theta^(-2i/n_rot) / freq_factors[i]; dims >= n_rot pass through."""
    half = n_rot // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [T, half]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    y = x.copy()
    x0 = x[..., 0:n_rot:2]
    x1 = x[..., 1:n_rot:2]
    y[..., 0:n_rot:2] = x0 * cos - x1 * sin
    y[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return y


def rope_neox_ff(x, pos, n_rot, theta, freq_factors=None):
    """NeoX RoPE; with freq_factors the same division as rope_norm."""
    if freq_factors is None:
        return rope_neox(x, pos, n_rot, theta)
    half = n_rot // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / n_rot) / freq_factors
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    y = x.copy()
    x1 = x[..., :half]
    x2 = x[..., half:n_rot]
    y[..., :half] = x1 * cos - x2 * sin
    y[..., half:n_rot] = x2 * cos + x1 * sin
    return y


def causal_attention(q, k, v, scale, cache=None):
    """Softmax attention with GQA. q [T, H, hd]; k, v [T, Hkv, hd] (k after norm + RoPE).
    cache: None or {"k", "v"} of earlier positions, extended in place. Returns [T, H, hd]."""
    T, H, hd = q.shape
    Hkv = k.shape[1]
    P = 0
    if cache is not None:
        if "k" in cache:
            P = cache["k"].shape[0]
            k = np.concatenate([cache["k"], k])
            v = np.concatenate([cache["v"], v])
        cache["k"], cache["v"] = k, v
    group = H // Hkv
    causal = np.arange(P + T)[None, :] <= (P + np.arange(T))[:, None]
    out = np.empty((T, H, v.shape[2]))
    for h in range(H):
        kvh = h // group
        s = (q[:, h, :] @ k[:, kvh, :].T) * scale
        s = np.where(causal, s, -np.inf)
        out[:, h, :] = softmax(s, axis=1) @ v[:, kvh, :]
    return out


_tensor_loader = tensor_loader  # qwen35_ref's: t(name, numpy shape) -> array, or an error naming it


def _globals(m, r, D):
    """token_embd / output_norm / output (tied when output.weight is absent)."""
    m.tok_embd = r.tensor("token_embd.weight")
    if m.tok_embd.ndim != 2 or m.tok_embd.shape[1] != D:
        raise ValueError("token_embd.weight shape %s, expected (n_vocab, %d)" % (m.tok_embd.shape, D))
    m.n_vocab = m.tok_embd.shape[0]
    t = _tensor_loader(r)
    m.output_norm = t("output_norm.weight", (D,))
    m.output = t("output.weight", (m.n_vocab, D)) if "output.weight" in r.tensors else m.tok_embd


# --------------------------------------------------------------------------
# qwen3next

class Qwen3NextHparams(Hparams):
    def __init__(self, r):
        super().__init__(r, "qwen3next")
        p = "qwen3next."

        def req(k):
            if p + k not in r.kv:
                raise KeyError("missing metadata key %s%s" % (p, k))
            return int(r.kv[p + k])
        self.n_expert = req("expert_count")
        self.n_expert_used = req("expert_used_count")
        self.n_ff_exp = req("expert_feed_forward_length")
        self.n_ff_shexp = int(r.kv.get(p + "expert_shared_feed_forward_length", 0))
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("expert_used_count %d not in 1..expert_count %d" % (self.n_expert_used, self.n_expert))


class Qwen3NextRef(Qwen35Ref):
    """qwen3next GGUF (current split or legacy fused DeltaNet inputs), MoE FFN every layer."""

    def __init__(self, path):
        r = GGUFReader(path)
        self.reader = r
        self.hp = hp = Qwen3NextHparams(r)
        t = _tensor_loader(r)
        D = hp.n_embd
        _globals(self, r, D)
        key_dim, value_dim = hp.n_k * hp.d_k, hp.n_v * hp.d_v
        conv_dim = 2 * key_dim + value_dim
        self.min_route_gap = np.inf  # smallest router-logit gap between the k-th and (k+1)-th expert seen
        self.layers = []
        for il in range(hp.n_layer):
            p = "blk.%d." % il
            L = {"recurrent": hp.recurrent[il],
                 "attn_norm": t(p + "attn_norm.weight", (D,)),
                 "post_norm": t(p + "post_attention_norm.weight", (D,))}
            L.update(self.ffn_tensors(t, p))
            if hp.recurrent[il]:
                L.update({
                    "ba": t(p + "ssm_ba.weight", (2 * hp.n_v, D)),
                    "conv": t(p + "ssm_conv1d.weight", (conv_dim, hp.conv_k)),
                    "dt_bias": t(p + "ssm_dt.bias", (hp.n_v,)),
                    "a": t(p + "ssm_a", (hp.n_v,)),
                    "norm": t(p + "ssm_norm.weight", (hp.d_v,)),
                    "out": t(p + "ssm_out.weight", (D, value_dim)),
                })
                if p + "attn_qkv.weight" in r.tensors:
                    L["qkv"] = t(p + "attn_qkv.weight", (conv_dim, D))
                    L["gate"] = t(p + "attn_gate.weight", (value_dim, D))
                elif p + "ssm_in.weight" in r.tensors:           # legacy fused in_proj_qkvz
                    L["ssm_in"] = t(p + "ssm_in.weight", (2 * key_dim + 2 * value_dim, D))
                else:
                    raise KeyError("layer %d: neither attn_qkv/attn_gate nor legacy ssm_in present" % il)
            else:
                L.update(gated_attention_tensors(t, p, hp))
            self.layers.append(L)

    def ffn_tensors(self, t, p):
        """The MoE FFN tensors of block prefix p (ne {n_embd, n_expert} -> numpy [E, D]; 3-D
        ne {in, out, E} -> [E, out, in]); also qwen35moe's (hybrid_ref), trunk and MTP block."""
        hp = self.hp
        D, E, Fe, Fs = hp.n_embd, hp.n_expert, hp.n_ff_exp, hp.n_ff_shexp
        L = {"gate_inp": t(p + "ffn_gate_inp.weight", (E, D)),
             "gate_exps": t(p + "ffn_gate_exps.weight", (E, Fe, D)),
             "up_exps": t(p + "ffn_up_exps.weight", (E, Fe, D)),
             "down_exps": t(p + "ffn_down_exps.weight", (E, D, Fe))}
        if Fs:
            L.update({"gate_inp_shexp": t(p + "ffn_gate_inp_shexp.weight", (D,)),
                      "gate_shexp": t(p + "ffn_gate_shexp.weight", (Fs, D)),
                      "up_shexp": t(p + "ffn_up_shexp.weight", (Fs, D)),
                      "down_shexp": t(p + "ffn_down_shexp.weight", (D, Fs))})
        return L

    # attention(): inherited unchanged (gated, q/k norm, NeoX partial RoPE)

    def deltanet_inputs(self, L, x):
        """mixed = [q all key heads | k all key heads | v all value heads (grouped order g*r+j)],
        z (same order), b and a per value head, from either tensor form (1.4(a))."""
        hp = self.hp
        T = x.shape[0]
        nk, nv, dk, dv = hp.n_k, hp.n_v, hp.d_k, hp.d_v
        r = nv // nk
        if "ssm_in" in L:
            # per key head g: [q_g (dk) | k_g (dk) | v_g (r*dv) | z_g (r*dv)]
            f = linear(x, L["ssm_in"]).reshape(T, nk, 2 * dk + 2 * r * dv)
            q = f[:, :, 0:dk]
            k = f[:, :, dk:2 * dk]
            v = f[:, :, 2 * dk:2 * dk + r * dv]                # [T, nk, r*dv] = heads g*r+j
            zz = f[:, :, 2 * dk + r * dv:]
            mixed = np.concatenate([q.reshape(T, nk * dk), k.reshape(T, nk * dk), v.reshape(T, nv * dv)], axis=1)
            z = zz.reshape(T, nv, dv)
        else:
            mixed = linear(x, L["qkv"])
            z = linear(x, L["gate"]).reshape(T, nv, dv)
        # ssm_ba rows, per key head g: [b_g (r values) | a_g (r values)]
        ba = linear(x, L["ba"]).reshape(T, nk, 2 * r)
        b = ba[:, :, :r].reshape(T, nv)                        # value head g*r + j <- row g*2r + j
        a = ba[:, :, r:].reshape(T, nv)                        #                     <- row g*2r + r + j
        return mixed, z, b, a

    def key_head_of_value_head(self):
        """Grouped order (HF repeat_interleave): value head h uses key head h // r."""
        hp = self.hp
        return np.arange(hp.n_v) // (hp.n_v // hp.n_k)

    def route(self, L, x):
        """Router: softmax over experts, top-k (ties -> lower index), renormalised weights.
        Returns (experts [T, k] int, weights [T, k])."""
        hp = self.hp
        logits = linear(x, L["gate_inp"])                      # [T, E]
        p = softmax(logits, axis=1)
        order = np.argsort(-p, axis=1, kind="stable")          # stable: equal p keep index order
        top = order[:, :hp.n_expert_used]
        if hp.n_expert_used < hp.n_expert:
            lk = np.take_along_axis(logits, order[:, hp.n_expert_used - 1:hp.n_expert_used + 1], axis=1)
            self.min_route_gap = min(self.min_route_gap, float((lk[:, 0] - lk[:, 1]).min()))
        w = np.take_along_axis(p, top, axis=1)
        w = w / w.sum(axis=1, keepdims=True)                   # norm_topk_prob
        return top, w

    def ffn(self, L, x):
        """MoE FFN of 1.6: sum_k w_k SwiGLU_{e_k}(x) + sigmoid(g_sh . x) SwiGLU_shared(x)."""
        T = x.shape[0]
        top, w = self.route(L, x)
        out = np.zeros_like(x)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            xe = x[rows]
            h = silu(linear(xe, L["gate_exps"][e])) * linear(xe, L["up_exps"][e])
            out[rows] += w[rows, slot][:, None] * linear(h, L["down_exps"][e])
        if "gate_shexp" in L:
            h = silu(linear(x, L["gate_shexp"])) * linear(x, L["up_shexp"])
            gate = sigmoid(x @ L["gate_inp_shexp"])            # one scalar per token
            out += gate.reshape(T, 1) * linear(h, L["down_shexp"])
        return out


# --------------------------------------------------------------------------
# qwen3 / llama (plain GQA attention every layer)

class DenseHparams:
    def __init__(self, r, arch):
        got = r.get("general.architecture")
        if got != arch:
            raise ValueError("general.architecture is %r, expected %r" % (got, arch))

        def key(name, default=None):
            full = "%s.%s" % (arch, name)
            if full in r.kv:
                return r.kv[full]
            if default is None:
                raise KeyError("missing metadata key %s" % full)
            return default
        self.arch = arch
        self.n_layer = int(key("block_count"))
        self.n_embd = int(key("embedding_length"))
        self.n_ff = int(key("feed_forward_length"))
        self.n_head = int(key("attention.head_count"))
        self.n_head_kv = int(key("attention.head_count_kv", self.n_head))
        self.head_dim = int(key("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(key("attention.value_length", self.head_dim))
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        self.rope_theta = float(key("rope.freq_base", 10000.0))
        self.n_rot = int(key("rope.dimension_count", self.head_dim))
        scale = r.kv.get(arch + ".attention.scale")
        self.attn_scale = float(scale) if scale else 1.0 / math.sqrt(self.head_dim)
        self.recurrent = [False] * self.n_layer
        if int(r.kv.get(arch + ".expert_count", 0) or 0):
            raise ValueError("%s with expert_count > 0 (Mixtral-style MoE) is not supported" % arch)
        if self.head_dim_v != self.head_dim:
            raise ValueError("key_length %d != value_length %d not supported" % (self.head_dim, self.head_dim_v))
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head %d not a multiple of n_head_kv %d" % (self.n_head, self.n_head_kv))
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise ValueError("bad rope.dimension_count %d" % self.n_rot)


class DenseRef(Qwen35Ref):
    """qwen3 (q/k norm, NeoX RoPE) and llama (no q/k norm, NORM RoPE)."""

    def __init__(self, path):
        r = GGUFReader(path)
        self.reader = r
        arch = r.get("general.architecture")
        if arch not in ("qwen3", "llama"):
            raise ValueError("DenseRef: architecture %r" % arch)
        self.hp = hp = DenseHparams(r, arch)
        self.qk_norm = arch == "qwen3"
        self.rope_type = "neox" if arch == "qwen3" else "norm"
        t = _tensor_loader(r)
        D, hd, H, Hkv, F = hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv, hp.n_ff
        _globals(self, r, D)
        self.freq_factors = t("rope_freqs.weight", (hp.n_rot // 2,)) if "rope_freqs.weight" in r.tensors else None
        self.layers = []
        for il in range(hp.n_layer):
            p = "blk.%d." % il
            L = {"recurrent": False,
                 "attn_norm": t(p + "attn_norm.weight", (D,)),
                 "post_norm": t(p + "ffn_norm.weight", (D,)),      # the FFN-input norm
                 "wq": t(p + "attn_q.weight", (H * hd, D)),
                 "wk": t(p + "attn_k.weight", (Hkv * hd, D)),
                 "wv": t(p + "attn_v.weight", (Hkv * hd, D)),
                 "wo": t(p + "attn_output.weight", (D, H * hd)),
                 "ffn_gate": t(p + "ffn_gate.weight", (F, D)),
                 "ffn_up": t(p + "ffn_up.weight", (F, D)),
                 "ffn_down": t(p + "ffn_down.weight", (D, F))}
            if self.qk_norm:
                L["q_norm"] = t(p + "attn_q_norm.weight", (hd,))
                L["k_norm"] = t(p + "attn_k_norm.weight", (hd,))
            self.layers.append(L)

    def attention(self, L, x, pos, cache=None):
        hp = self.hp
        T = x.shape[0]
        hd, H, Hkv = hp.head_dim, hp.n_head, hp.n_head_kv
        q = linear(x, L["wq"]).reshape(T, H, hd)
        k = linear(x, L["wk"]).reshape(T, Hkv, hd)
        v = linear(x, L["wv"]).reshape(T, Hkv, hd)
        if self.qk_norm:
            q = rmsnorm(q, L["q_norm"], hp.eps)                # per head, before RoPE
            k = rmsnorm(k, L["k_norm"], hp.eps)
        rope = rope_neox_ff if self.rope_type == "neox" else rope_norm
        q = rope(q, pos, hp.n_rot, hp.rope_theta, self.freq_factors)
        k = rope(k, pos, hp.n_rot, hp.rope_theta, self.freq_factors)
        out = causal_attention(q, k, v, hp.attn_scale, cache)
        return linear(out.reshape(T, H * hd), L["wo"])


# --------------------------------------------------------------------------

def load_model(path):
    """The reference model for a GGUF file, by general.architecture."""
    r = GGUFReader(path)
    arch = r.get("general.architecture")
    mla = arch == "deepseek2" or "hyserve.layer_kinds" in r.kv  # MLA layouts live in mla_ref.py
    del r
    if mla:
        from mla_ref import load_model as load_mla_model
        return load_mla_model(path)
    if arch == "qwen35":
        return Qwen35Ref(path)
    if arch == "qwen3next":
        return Qwen3NextRef(path)
    if arch in ("qwen3", "llama"):
        return DenseRef(path)
    raise ValueError("architecture %r not supported (supported: %s)" % (arch, ", ".join(SUPPORTED)))


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 reference forward (qwen35, qwen3next, qwen3, llama)")
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--all", action="store_true", help="logits for every position")
    ap.add_argument("--chunked", action="store_true", help="use the chunked DeltaNet form")
    ap.add_argument("--chunk", type=int, default=64)
    args = ap.parse_args(argv)
    tokens = [int(s) for s in args.tokens.split(",") if s.strip()]
    m = load_model(args.model)
    logits = m.forward(tokens, chunked=args.chunked, chunk=args.chunk)
    rows = logits if args.all else logits[-1:]
    json.dump({"tokens": tokens, "logits": [[float(v) for v in row] for row in rows]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""qwen35_ref.py - float64 numpy reference forward pass of a `qwen35` GGUF model.

Owns: the Qwen3.5 (dense) math of docs/models.md sections 1.2-1.6 as read from
a GGUF file laid out per section 2 (hyperparameter keys 2.2, converter
transforms 2.3, tensor names 2.4): gated softmax attention, Gated DeltaNet in
two forms (token-by-token recurrence of 1.4(f) and the chunked WY/UT form of
1.4(g)), SwiGLU MLP, RMSNorm, LM head.
Does not: tokenize, sample, or handle vision / MRoPE sections (for text the
interleaved MRoPE collapses to plain NeoX RoPE, section 1.5). Weight types are
whatever gguf_io / quants.py dequantize. The other architectures (qwen3next MoE
with grouped value heads, qwen3, llama) live in models_ref.py, which subclasses
Qwen35Ref; the CLI below runs any of them.
Written from the math notes (now docs/models.md) only; it is the golden reference the
C engine is tested against, so it favours obviousness over speed.

MTP draft head (Qwen35Ref.mtp_logits / mtp_chain; qwen35, and qwen35moe through
hybrid_ref.Qwen35MoeRef): the block blk.{n_layer} of a file with nextn_predict_layers >= 1, as
docs/models.md 1.7 defines it from vLLM's qwen3_next_mtp.py: row i = head(shared_head_norm(
block(eh_proj([enorm(E[t_{i+1}]) | hnorm(h_i)])))), h_i the trunk's hidden after output_norm,
the block's own causal attention over rows 0..i at RoPE position i, E / head the block's
nextn.embed_tokens / nextn.shared_head_head when present, else token_embd / the trunk's LM head.
mtp_chain adds chained greedy drafts (h := the previous row's normed output). Covers N = 1
(only blk.{n_layer} is read; files with more MTP blocks run the first one), float weights or
whatever gguf_io dequantizes. Does not: sample, verify drafts, or take the int8 / bf16
activation modes into account for the MTP block. self_test_mtp checks it without a C binary.

CLI:
  /usr/bin/python3 tests/ref/qwen35_ref.py MODEL.gguf --tokens 1,2,3 [--all] [--chunked] [--int8-act]
      [--bf16-act]
  /usr/bin/python3 tests/ref/qwen35_ref.py MODEL.gguf --tokens 1,2,3 --mtp [--all] [--mtp-variant V]
  /usr/bin/python3 tests/ref/qwen35_ref.py MODEL.gguf --tokens 1,2,...,32 --mtp-self-test
  /usr/bin/python3 tests/ref/qwen35_ref.py --self-test
prints one JSON object {"tokens": [...], "logits": [[...], ...]} (one row of
n_vocab floats per position with --all, else only the last position's row; with --mtp
the n-1 MTP rows, row i the distribution of token i+2, else only row n-2). --mtp on a
file without an MTP block, or on fewer than 2 tokens: one line on stderr, exit 2
(the contract's `hyserve logits --mtp` errors).
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_io import GGUFReader, round_to_dtype  # noqa: E402
import quants  # noqa: E402

ARCH = "qwen35"


# --------------------------------------------------------------------------
# elementary ops (all float64)

def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free form of 1/(1+exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    """PyTorch softplus (beta 1, threshold 20): x when x > 20, else log(1 + exp(x))."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rmsnorm(x, w, eps):
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis; w is the final multiplier (GGUF)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def l2norm(x, eps):
    """llama.cpp ggml_l2_norm: x / max(||x||, eps) over the last axis."""
    n = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    return x / np.maximum(n, eps)


# int8 activation mode (set_int8_activations, --int8-act): the engine's int8 prompt products
# (HYSERVE_INT8_PROMPT=1) multiply Q8_0 / Q4_0 / K-quant weights by activations quantized per
# block (quants.quantize_activations); off, every product takes x as it is
INT8_ACT = False


def set_int8_activations(on):
    global INT8_ACT
    INT8_ACT = bool(on)


# bf16 activation mode (set_bf16_activations, --bf16-act): the engine's BF16 prompt products
# (HYSERVE_BF16_PROMPT=1; vdpbf16ps) round the activations to bf16 for the BF16 weights it
# repacks into panels of 16 rows (engine/kernels/panels.h, model.c pack_panels): a layer's
# projection matrix or an untied LM head, with a multiple of 16 rows and an even width; not the
# token embedding (a tied LM head multiplies the table as stored) and not one expert of a 3-D
# tensor. Other products take x as it is.
BF16_ACT = False


def set_bf16_activations(on):
    global BF16_ACT
    BF16_ACT = bool(on)


def bf16_rounds(w):
    """True where the bf16 activation mode rounds the activations of a product with w."""
    name = getattr(w, "gguf_name", None) or ""
    return (getattr(w, "ggml_type", None) == quants.GGML_BF16 and w.ndim == 2 and w.shape[0] % 16 == 0
            and w.shape[1] % 2 == 0 and name != "token_embd.weight" and "_exps" not in name)


def linear(x, w):
    """x [..., in] times GGUF weight ne={in, out} (numpy W[out, in]) -> [..., out]; in the int8
    activation mode x is first quantized per block as the weight's type dictates, in the bf16
    mode rounded to bf16 where bf16_rounds(w)."""
    block = quants.act_block(w.ggml_type) if INT8_ACT and getattr(w, "ggml_type", None) is not None else None
    if block:
        x = quants.quantize_activations(x, block)
    if BF16_ACT and bf16_rounds(w):
        x = quants.round_bf16_activations(x)
    return x @ w.T


def rope_neox(x, pos, n_rot, theta):
    """Partial NeoX RoPE on x [T, H, D]: pairs (i, i + n_rot/2) for i < n_rot/2 rotated by
    pos * theta^(-2i/n_rot); dims >= n_rot pass through."""
    half = n_rot // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / n_rot)  # [half]
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [T, half]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    y = x.copy()
    x1 = x[..., :half]
    x2 = x[..., half:n_rot]
    y[..., :half] = x1 * cos - x2 * sin
    y[..., half:n_rot] = x2 * cos + x1 * sin
    return y


# --------------------------------------------------------------------------
# gated delta rule, two independent formulations

def delta_rule_recurrent(q, k, v, g, beta, state=None):
    """Token-by-token gated delta rule (docs/models.md 1.4(f)), all heads at once.

    q, k:  [T, H, dk]  (already l2-normed, q already scaled; expanded to value heads)
    v:     [T, H, dv]
    g:     [T, H]      log-decay (<= 0)
    beta:  [T, H]
    state: [H, dk, dv] or None (zeros); HF layout S[h][i=key][j=value]
    returns o [T, H, dv], final state [H, dk, dv]
    """
    T, H, dk = k.shape
    dv = v.shape[2]
    S = np.zeros((H, dk, dv)) if state is None else state.copy()
    o = np.empty((T, H, dv))
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]                 # S = S * exp(g)
        kv = np.einsum("hij,hi->hj", S, k[t])               # kv = S^T k
        d = beta[t][:, None] * (v[t] - kv)                  # d = beta (v - kv)
        S = S + k[t][:, :, None] * d[:, None, :]            # S += k d^T
        o[t] = np.einsum("hij,hi->hj", S, q[t])             # o = S^T q (updated state)
    return o, S


def _unit_lower_inverse(L):
    """(I + L)^-1 for strictly lower-triangular L [C, C], by forward substitution:
    row i of T solves T[i] = e_i - sum_{j<i} L[i, j] T[j]."""
    C = L.shape[0]
    T = np.zeros((C, C))
    for i in range(C):
        T[i, i] = 1.0
        if i:
            T[i, :i] -= L[i, :i] @ T[:i, :i]
    return T


def delta_rule_chunked_head(q, k, v, g, beta, state=None, chunk=64):
    """Chunked (WY / UT transform) gated delta rule for ONE head (docs/models.md 1.4(g)).

    q, k [T, dk]; v [T, dv]; g, beta [T]; state [dk, dv] or None.
    returns o [T, dv], final state [dk, dv]
    """
    T, dk = k.shape
    dv = v.shape[1]
    C = chunk
    Tp = (T + C - 1) // C * C
    pad = Tp - T

    def padrows(a):
        return np.concatenate([a, np.zeros((pad,) + a.shape[1:])]) if pad else a

    q, k, v, g, beta = (padrows(a) for a in (q, k, v, g, beta))
    S = np.zeros((dk, dv)) if state is None else state.copy()
    o = np.empty((Tp, dv))
    ii, jj = np.meshgrid(np.arange(C), np.arange(C), indexing="ij")
    lower_incl = ii >= jj
    strictly_lower = ii > jj
    for c0 in range(0, Tp, C):
        sl = slice(c0, c0 + C)
        qc, kc, vc, gc, bc = q[sl], k[sl], v[sl], g[sl], beta[sl]
        kb = kc * bc[:, None]                               # k * beta
        vb = vc * bc[:, None]                               # v * beta
        G = np.cumsum(gc)                                   # G[i] = g[0] + ... + g[i]
        diff = G[:, None] - G[None, :]
        D = np.where(lower_incl, np.exp(np.where(lower_incl, diff, 0.0)), 0.0)  # decay mask
        L = np.where(strictly_lower, (kb @ kc.T) * D, 0.0)  # strictly_lower((kb k^T) .* D)
        Tm = _unit_lower_inverse(L)                         # T = (I + L)^-1
        U = Tm @ vb                                         # pseudo-values [C, dv]
        W = Tm @ (kb * np.exp(G)[:, None])                  # k_cumdecay [C, dk]
        Aqk = np.where(lower_incl, (qc @ kc.T) * D, 0.0)    # diagonal kept
        Vnew = U - W @ S
        o[sl] = (qc * np.exp(G)[:, None]) @ S + Aqk @ Vnew
        S = S * np.exp(G[C - 1]) + (kc * np.exp(G[C - 1] - G)[:, None]).T @ Vnew
    return o[:T], S


def delta_rule_chunked(q, k, v, g, beta, state=None, chunk=64):
    """Chunked form for all heads; same signature / result as delta_rule_recurrent."""
    T, H, dk = k.shape
    dv = v.shape[2]
    o = np.empty((T, H, dv))
    S_out = np.empty((H, dk, dv))
    for h in range(H):
        o[:, h], S_out[h] = delta_rule_chunked_head(
            q[:, h], k[:, h], v[:, h], g[:, h], beta[:, h],
            None if state is None else state[h], chunk)
    return o, S_out


# --------------------------------------------------------------------------
# model

def gated_attention_tensors(t, p, hp):
    """The gated full-attention tensors of block prefix p (q and gate interleaved per head in
    attn_q), as the trunk's attention layers and the MTP block carry them."""
    D, hd = hp.n_embd, hp.head_dim
    return {"wq": t(p + "attn_q.weight", (2 * hp.n_head * hd, D)),
            "wk": t(p + "attn_k.weight", (hp.n_head_kv * hd, D)),
            "wv": t(p + "attn_v.weight", (hp.n_head_kv * hd, D)),
            "wo": t(p + "attn_output.weight", (D, hp.n_head * hd)),
            "q_norm": t(p + "attn_q_norm.weight", (hd,)),
            "k_norm": t(p + "attn_k_norm.weight", (hd,))}


class Hparams:
    def __init__(self, r, arch=ARCH):
        """arch: the expected general.architecture (qwen3next shares these keys, models_ref.py)."""
        def key(name, default=None, required=True):
            full = "%s.%s" % (arch, name)
            if full in r.kv:
                return r.kv[full]
            if required and default is None:
                raise KeyError("missing metadata key %s" % full)
            return default

        got = r.get("general.architecture")
        if got != arch:
            raise ValueError("general.architecture is %r, expected %r" % (got, arch))
        self.n_block = int(key("block_count"))
        self.n_nextn = int(key("nextn_predict_layers", 0, False))
        self.n_layer = self.n_block - self.n_nextn  # trunk depth
        self.n_embd = int(key("embedding_length"))
        self.n_ff = int(key("feed_forward_length"))
        self.n_head = int(key("attention.head_count"))
        self.n_head_kv = int(key("attention.head_count_kv"))
        self.head_dim = int(key("attention.key_length"))
        self.head_dim_v = int(key("attention.value_length", self.head_dim, False))
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        self.rope_theta = float(key("rope.freq_base", 10000.0, False))
        self.n_rot = int(key("rope.dimension_count", self.head_dim, False))
        scale = key("attention.scale", None, False)
        self.attn_scale = float(scale) if scale else 1.0 / math.sqrt(self.head_dim)
        self.conv_k = int(key("ssm.conv_kernel"))
        self.d_k = int(key("ssm.state_size"))
        self.n_k = int(key("ssm.group_count"))
        self.n_v = int(key("ssm.time_step_rank"))
        self.d_inner = int(key("ssm.inner_size"))
        self.d_v = self.d_inner // self.n_v  # head_v_dim
        rec = key("attention.recurrent_layers", None, False)
        if rec is not None:
            if len(rec) < self.n_layer:
                raise ValueError("attention.recurrent_layers has %d entries < %d layers" % (len(rec), self.n_layer))
            self.recurrent = [bool(x) for x in rec[:self.n_layer]]
        else:
            interval = int(key("full_attention_interval", 4, False))
            self.recurrent = [(i + 1) % interval != 0 for i in range(self.n_layer)]
        if self.head_dim_v != self.head_dim:
            raise ValueError("attention key_length %d != value_length %d not supported" % (self.head_dim, self.head_dim_v))
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head %d not a multiple of n_head_kv %d" % (self.n_head, self.n_head_kv))
        if self.n_v % self.n_k:
            raise ValueError("n_v %d not a multiple of n_k %d" % (self.n_v, self.n_k))
        if self.d_v * self.n_v != self.d_inner:
            raise ValueError("ssm.inner_size %d not a multiple of time_step_rank %d" % (self.d_inner, self.n_v))
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise ValueError("bad rope.dimension_count %d" % self.n_rot)


def tensor_loader(r):
    """t(name, numpy shape) -> the float64 array of tensor `name` of reader r, or KeyError /
    ValueError naming it (numpy shape = ne reversed)."""
    def t(name, shape):
        if name not in r.tensors:
            raise KeyError("missing tensor %s" % name)
        a = r.tensor(name)
        if a.shape != tuple(shape):
            raise ValueError("tensor %s: numpy shape %s, expected %s (ne reversed)" % (name, a.shape, tuple(shape)))
        return a
    return t


class Qwen35Ref:
    """Loads a qwen35 GGUF into float64 arrays and runs the full-sequence forward (and, with
    mtp_logits / mtp_chain, the MTP draft head of block n_layer)."""

    def __init__(self, path):
        r = GGUFReader(path)
        self.hp = hp = Hparams(r)
        self.reader = r
        t = tensor_loader(r)

        D, V = hp.n_embd, None
        self.tok_embd = r.tensor("token_embd.weight")  # [n_vocab, n_embd]
        V = self.tok_embd.shape[0]
        if self.tok_embd.shape[1] != D:
            raise ValueError("token_embd.weight ne[0] %d != n_embd %d" % (self.tok_embd.shape[1], D))
        self.n_vocab = V
        self.output_norm = t("output_norm.weight", (D,))
        self.output = t("output.weight", (V, D)) if "output.weight" in r.tensors else self.tok_embd

        key_dim = hp.n_k * hp.d_k
        value_dim = hp.n_v * hp.d_v
        conv_dim = 2 * key_dim + value_dim
        self.layers = []
        for il in range(hp.n_layer):
            p = "blk.%d." % il
            L = {"recurrent": hp.recurrent[il],
                 "attn_norm": t(p + "attn_norm.weight", (D,)),
                 "post_norm": t(p + "post_attention_norm.weight", (D,))}
            L.update(self.ffn_tensors(t, p))
            if hp.recurrent[il]:
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
            else:
                L.update(gated_attention_tensors(t, p, hp))
            self.layers.append(L)

    def ffn_tensors(self, t, p):
        """The FFN tensors of block prefix p (dense SwiGLU here; MoE in qwen35moe's subclass)."""
        hp = self.hp
        D = hp.n_embd
        return {"ffn_gate": t(p + "ffn_gate.weight", (hp.n_ff, D)),
                "ffn_up": t(p + "ffn_up.weight", (hp.n_ff, D)),
                "ffn_down": t(p + "ffn_down.weight", (D, hp.n_ff))}

    # ---- mixers -------------------------------------------------------------

    def attention(self, L, x, pos, cache=None):
        """Gated softmax attention (1.5). x [T, D] (already attn-normed), pos [T].
        cache: None, or a dict {"k": [P, Hkv, hd], "v": [P, Hkv, hd]} of earlier positions
        (k after norm + RoPE), extended in place."""
        hp = self.hp
        T = x.shape[0]
        hd, H, Hkv = hp.head_dim, hp.n_head, hp.n_head_kv
        qg = linear(x, L["wq"]).reshape(T, H, 2, hd)         # per head [q | gate]
        q = qg[:, :, 0, :]
        gate = qg[:, :, 1, :]
        k = linear(x, L["wk"]).reshape(T, Hkv, hd)
        v = linear(x, L["wv"]).reshape(T, Hkv, hd)
        q = rmsnorm(q, L["q_norm"], hp.eps)                  # per-head norm BEFORE RoPE
        k = rmsnorm(k, L["k_norm"], hp.eps)
        q = rope_neox(q, pos, hp.n_rot, hp.rope_theta)
        k = rope_neox(k, pos, hp.n_rot, hp.rope_theta)
        P = 0
        if cache is not None:
            if "k" in cache:
                P = cache["k"].shape[0]
                k = np.concatenate([cache["k"], k])
                v = np.concatenate([cache["v"], v])
            cache["k"], cache["v"] = k, v
        group = H // Hkv
        # causal: query t (absolute position P + t) sees keys 0 .. P + t
        causal = np.arange(P + T)[None, :] <= (P + np.arange(T))[:, None]
        out = np.empty((T, H, hd))
        for h in range(H):
            kvh = h // group                                 # GQA
            s = (q[:, h, :] @ k[:, kvh, :].T) * hp.attn_scale  # [T, P + T]
            s = np.where(causal, s, -np.inf)
            s = s - s.max(axis=1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=1, keepdims=True)
            out[:, h, :] = p @ v[:, kvh, :]
        out = out * sigmoid(gate)                            # gate BEFORE o_proj
        return linear(out.reshape(T, H * hd), L["wo"])

    def deltanet(self, L, x, chunked=False, chunk=64, cache=None):
        """Gated DeltaNet (1.4, qwen35 layout). x [T, D] (already attn-normed).
        cache: None, or a dict {"conv": [K-1, conv_dim] last inputs oldest first,
        "S": [n_v, dk, dv]} (missing = zeros), updated in place; with "state_dtype": "bf16"
        S is kept as a bf16 store of it would hold it (rounded at the end of every call)."""
        hp = self.hp
        T = x.shape[0]
        nk, nv, dk, dv, K = hp.n_k, hp.n_v, hp.d_k, hp.d_v, hp.conv_k
        key_dim = nk * dk
        mixed, z, b, a = self.deltanet_inputs(L, x)         # [T, conv_dim], [T, nv, dv], [T, nv] x 2
        # causal depthwise conv1d: u_t[c] = silu(sum_j w[c][j] x_{t-K+1+j}[c])
        past = np.zeros((K - 1, mixed.shape[1]))
        if cache is not None and "conv" in cache:
            past = cache["conv"]
        xp = np.concatenate([past, mixed])
        if cache is not None:
            cache["conv"] = xp[xp.shape[0] - (K - 1):].copy()
        w = L["conv"]                                        # [conv_dim, K]
        u = np.zeros_like(mixed)
        for j in range(K):
            u += w[:, j][None, :] * xp[j:j + T]
        u = silu(u)
        q = u[:, :key_dim].reshape(T, nk, dk)
        k = u[:, key_dim:2 * key_dim].reshape(T, nk, dk)
        v = u[:, 2 * key_dim:].reshape(T, nv, dv)
        beta = sigmoid(b)
        g = L["a"][None, :] * softplus(a + L["dt_bias"][None, :])  # ssm_a = -exp(A_log)
        q = l2norm(q, hp.eps) * (1.0 / math.sqrt(dk))
        k = l2norm(k, hp.eps)
        kh = self.key_head_of_value_head()
        q = q[:, kh, :]
        k = k[:, kh, :]
        S0 = cache.get("S") if cache is not None else None
        if chunked:
            o, S = delta_rule_chunked(q, k, v, g, beta, S0, chunk=chunk)
        else:
            o, S = delta_rule_recurrent(q, k, v, g, beta, S0)
        if cache is not None:
            sd = cache.get("state_dtype", "f64")
            cache["S"] = S if sd == "f64" else round_to_dtype(S, sd)
        o = rmsnorm(o, L["norm"], hp.eps) * silu(z)          # gated RMSNorm: norm, then gate
        return linear(o.reshape(T, nv * dv), L["out"])

    def deltanet_inputs(self, L, x):
        """qwen35 split projections: mixed = [q | k | v] (conv input), z, b (beta), a (alpha)."""
        T = x.shape[0]
        mixed = linear(x, L["qkv"])                          # [T, conv_dim] rows [q | k | v]
        z = linear(x, L["gate"]).reshape(T, self.hp.n_v, self.hp.d_v)
        b = linear(x, L["beta"])                             # [T, nv]
        a = linear(x, L["alpha"])                            # [T, nv]
        return mixed, z, b, a

    def key_head_of_value_head(self):
        """qwen35 tiled order (section 2.3 item 6): value head h uses key head h % n_k."""
        return np.arange(self.hp.n_v) % self.hp.n_k

    def ffn(self, L, x):
        """Dense SwiGLU MLP (1.6): down(silu(gate x) * up x)."""
        return linear(silu(linear(x, L["ffn_gate"])) * linear(x, L["ffn_up"]), L["ffn_down"])

    # ---- full forward -------------------------------------------------------

    def new_caches(self, state_dtype="f64"):
        """Per-layer caches for forward(..., caches=...): empty dicts, filled on first use.
        state_dtype: how the DeltaNet state is kept between calls ("f64": exactly; "bf16":
        rounded as a bf16 store of it, as `hyserve --state-dtype bf16` keeps it)."""
        return [dict(state_dtype=state_dtype) for _ in self.layers]

    def forward(self, tokens, chunked=False, chunk=64, caches=None, pos0=0):
        """tokens: list of ids at positions pos0 .. pos0+T-1. Returns logits [T, n_vocab] (float64).
        caches: None (a fresh sequence) or the list from new_caches(), carried across calls
        (then pos0 must be the number of tokens already processed)."""
        return linear(self.final_hidden(tokens, chunked, chunk, caches, pos0), self.output)

    def final_hidden(self, tokens, chunked=False, chunk=64, caches=None, pos0=0, normed=True):
        """The trunk's hidden states [T, n_embd] after the final norm (output_norm): what the LM
        head multiplies, and the MTP head's h. Arguments as forward(); normed=False: before
        output_norm (only to show the MTP test tells the two apart)."""
        hp = self.hp
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError("need a non-empty token list")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError("token id out of range [0, %d)" % self.n_vocab)
        pos = pos0 + np.arange(len(toks))
        x = self.tok_embd[toks]                              # [T, D]
        for il, L in enumerate(self.layers):
            cache = None if caches is None else caches[il]
            xn = rmsnorm(x, L["attn_norm"], hp.eps)
            if L["recurrent"]:
                x = x + self.deltanet(L, xn, chunked, chunk, cache)
            else:
                x = x + self.attention(L, xn, pos, cache)
            xn = rmsnorm(x, L["post_norm"], hp.eps)
            x = x + self.ffn(L, xn)
        return rmsnorm(x, self.output_norm, hp.eps) if normed else x

    def forward_segments(self, tokens, sizes, chunked=False, chunk=64, state_dtype="f64"):
        """Same logits as forward(tokens), computed in segments of the given sizes with the
        caches carried between them (size 1 = a decode step); state_dtype as new_caches."""
        caches = self.new_caches(state_dtype)
        rows = []
        i = 0
        for n in sizes:
            if i >= len(tokens):
                break
            rows.append(self.forward(tokens[i:i + n], chunked, chunk, caches, pos0=i))
            i += n
        if i < len(tokens):
            rows.append(self.forward(tokens[i:], chunked, chunk, caches, pos0=i))
        return np.concatenate(rows)

    # ---- MTP draft head ------------------------------------------------------
    # The block blk.{n_layer} of a file with nextn_predict_layers >= 1, per the MTP contract
    # (docs/models.md 1.7; vLLM qwen3_next_mtp.py): row i from the trunk's normed hidden h_i
    # and the embedding of t_{i+1}:
    #   x = eh_proj([enorm(E[t_{i+1}]) | hnorm(h_i)]);  a = x + attn(attn_norm(x)) at RoPE position i,
    #   causal over the block's own rows 0..i;  y = a + ffn(post_attention_norm(a));
    #   o = shared_head_norm(y);  logits = head(o)  (the distribution of t_{i+2}).
    # E = nextn.embed_tokens if present else token_embd; head = nextn.shared_head_head if present
    # else the trunk's LM head (output.weight, or token_embd when tied).

    # readings of the contract the MTP test must tell apart from it (mtp_logits(variant=...)):
    # the halves of eh_proj's input swapped, the embedding of t_i instead of t_{i+1}, h before
    # output_norm, the trunk's table / head instead of the block's own, each row attending to
    # itself only (no KV history), and RoPE positions i+1 (which cannot be told apart: RoPE
    # attention sees only position differences)
    MTP_VARIANTS = ("hidden_first", "same_token", "prenorm_hidden", "trunk_embed", "trunk_head", "self_only",
                    "pos_plus1")

    def load_mtp(self):
        """The MTP block's tensors (a layer dict like the trunk's attention layers, plus eh_proj,
        enorm, hnorm, head_norm, embed, head, own_embed, own_head), loaded once; ValueError when
        the file has none."""
        if getattr(self, "mtp", None) is not None:
            return self.mtp
        hp = self.hp
        if hp.n_nextn < 1:
            raise ValueError("no MTP block (nextn_predict_layers is 0)")
        r = self.reader
        t = tensor_loader(r)
        D, V = hp.n_embd, self.n_vocab
        p = "blk.%d." % hp.n_layer
        M = {"recurrent": False,
             "attn_norm": t(p + "attn_norm.weight", (D,)),
             "post_norm": t(p + "post_attention_norm.weight", (D,)),
             "eh_proj": t(p + "nextn.eh_proj.weight", (D, 2 * D)),        # ne {2D, D}
             "enorm": t(p + "nextn.enorm.weight", (D,)),
             "hnorm": t(p + "nextn.hnorm.weight", (D,)),
             "head_norm": t(p + "nextn.shared_head_norm.weight", (D,))}
        M.update(gated_attention_tensors(t, p, hp))
        M.update(self.ffn_tensors(t, p))
        M["own_embed"] = p + "nextn.embed_tokens.weight" in r.tensors
        M["own_head"] = p + "nextn.shared_head_head.weight" in r.tensors
        M["embed"] = t(p + "nextn.embed_tokens.weight", (V, D)) if M["own_embed"] else self.tok_embd
        M["head"] = t(p + "nextn.shared_head_head.weight", (V, D)) if M["own_head"] else self.output
        self.mtp = M
        return M

    def mtp_rows(self, h, next_tokens, pos, cache=None, variant=None):
        """MTP rows for hidden rows h [T, D], the tokens whose embeddings pair with them [T] and
        RoPE positions pos [T]; cache: None, or a dict (the block's own KV cache, extended in
        place, as attention() keeps it). Returns (logits [T, n_vocab], o [T, D] = the normed
        block output, the h of a chained next row)."""
        hp = self.hp
        M = self.load_mtp()
        E = self.tok_embd if variant == "trunk_embed" else M["embed"]
        e = rmsnorm(E[np.asarray(next_tokens, dtype=np.int64)], M["enorm"], hp.eps)
        hn = rmsnorm(h, M["hnorm"], hp.eps)
        x = linear(np.concatenate([hn, e] if variant == "hidden_first" else [e, hn], axis=1), M["eh_proj"])
        a = x + self.attention(M, rmsnorm(x, M["attn_norm"], hp.eps), np.asarray(pos, dtype=np.int64), cache)
        y = a + self.ffn(M, rmsnorm(a, M["post_norm"], hp.eps))
        o = rmsnorm(y, M["head_norm"], hp.eps)
        return linear(o, self.output if variant == "trunk_head" else M["head"]), o

    def mtp_logits(self, tokens, chunked=False, chunk=64, variant=None):
        """The MTP's first-depth rows on t_0..t_{n-1}: [n-1, n_vocab], row i from h_i and t_{i+1}
        (what `hyserve logits --mtp --all` prints). variant: None (the contract) or one of
        MTP_VARIANTS."""
        if variant is not None and variant not in self.MTP_VARIANTS:
            raise ValueError("unknown MTP variant %r" % variant)
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) < 2:
            raise ValueError("the MTP needs at least 2 tokens")
        self.load_mtp()
        h = self.final_hidden(toks, chunked, chunk, normed=variant != "prenorm_hidden")[:-1]
        nxt = toks[:-1] if variant == "same_token" else toks[1:]
        pos = np.arange(len(toks) - 1) + (1 if variant == "pos_plus1" else 0)
        if variant == "self_only":
            return np.concatenate([self.mtp_rows(h[i:i + 1], nxt[i:i + 1], pos[i:i + 1])[0] for i in range(len(pos))])
        return self.mtp_rows(h, nxt, pos, None, variant)[0]

    def mtp_chain(self, tokens, k):
        """k chained greedy drafts after t_0..t_{n-1} (one MTP layer reused, as vLLM does): row 0
        is first-depth row n-2 (from h_{n-2} and t_{n-1}, position n-2); row j > 0 uses h = o of
        row j-1, the token drafted from row j-1 (argmax, lowest id on ties) and position n-2+j,
        attending over the block's cache of every earlier row. Returns (logits [k, n_vocab],
        drafted ids [k], the inputs (h [n-2+k, D], tokens, positions) of every row in order)."""
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) < 2 or k < 1:
            raise ValueError("mtp_chain needs at least 2 tokens and k >= 1")
        n = len(toks)
        h = self.final_hidden(toks)[:-1]
        cache = {}
        lg, o = self.mtp_rows(h, toks[1:], np.arange(n - 1), cache)
        rows, drafts = [lg[-1]], [int(np.argmax(lg[-1]))]
        hs, ts, ps = [h], list(toks[1:]), list(range(n - 1))
        for j in range(1, k):
            h1 = o[-1:]
            lg, o = self.mtp_rows(h1, [drafts[-1]], [n - 2 + j], cache)
            hs.append(h1)
            ts.append(drafts[-1])
            ps.append(n - 2 + j)
            rows.append(lg[0])
            drafts.append(int(np.argmax(lg[0])))
        return np.array(rows), drafts, (np.concatenate(hs), ts, ps)


# --------------------------------------------------------------------------
# self-test: the two delta-rule forms agree

def self_test_delta_rule(verbose=False):
    """Returns the max relative disagreement between recurrent and chunked forms over
    several shapes, chunk sizes, lengths (incl. padding) and a non-zero initial state."""
    rng = np.random.default_rng(1234)
    worst = 0.0
    for (T, H, dk, dv, C, with_state) in [(1, 1, 4, 4, 4, False), (7, 2, 8, 8, 4, False),
                                          (64, 3, 16, 16, 64, False), (100, 2, 16, 8, 16, True),
                                          (130, 2, 8, 12, 64, True), (33, 1, 32, 32, 8, False)]:
        q = l2norm(rng.standard_normal((T, H, dk)), 1e-6) / math.sqrt(dk)
        k = l2norm(rng.standard_normal((T, H, dk)), 1e-6)
        v = rng.standard_normal((T, H, dv))
        g = -np.exp(rng.uniform(-1, 0.5, (T, H))) * softplus(rng.standard_normal((T, H)))
        beta = sigmoid(rng.standard_normal((T, H)))
        S0 = rng.standard_normal((H, dk, dv)) if with_state else None
        o1, S1 = delta_rule_recurrent(q, k, v, g, beta, S0)
        o2, S2 = delta_rule_chunked(q, k, v, g, beta, S0, chunk=C)
        e = max(np.abs(o1 - o2).max() / np.abs(o1).max(), np.abs(S1 - S2).max() / np.abs(S1).max())
        if verbose:
            print("  T=%d H=%d dk=%d dv=%d C=%d state=%s: rel err %.3e" % (T, H, dk, dv, C, with_state, e))
        worst = max(worst, e)
    return worst


def rel_rows(a, b):
    """max over rows of max|a_t - b_t| / max|b_t| (the suites' compare() metric)."""
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())


def self_test_mtp(m, tokens, verbose=False):
    """Checks of the MTP reference that need no C binary, on a model m with an MTP block:
    prefix   the rows of every prefix tokens[:j] (j = 2, 3, 5, n/2, n-1) equal the first j-1
             rows of the whole (the block's attention is causal; rel err, must be ~0),
    chain    the rows of a 4-draft chain, each step on the block's KV cache, equal the same
             rows recomputed in one cache-less call over all the chain's inputs (~0),
    variants the distance (same metric) of each wrong reading in MTP_VARIANTS from the
             contract's rows: the ones a test must catch have to be far above its 1e-4
             tolerance; pos_plus1 must be ~0 (RoPE attention sees position differences only,
             so the rows cannot show the position offset of the block).
    Returns {"prefix": err, "chain": err, "variants": {name: distance}} (variants that equal
    the contract on this file, trunk_embed / trunk_head without the block's own, left out)."""
    full = m.mtp_logits(tokens)
    n = len(tokens)
    prefix = 0.0
    for j in sorted({2, 3, 5, n // 2, n - 1}):
        if 2 <= j < n:
            prefix = max(prefix, rel_rows(m.mtp_logits(tokens[:j]), full[:j - 1]))
    k = 4
    rows, drafts, (H, ts, ps) = m.mtp_chain(tokens, k)
    again = m.mtp_rows(H, ts, ps)[0][n - 2:]
    chain = rel_rows(rows, again)
    if rel_rows(rows[:1], full[-1:]) > 1e-12:
        chain = max(chain, rel_rows(rows[:1], full[-1:]))
    M = m.load_mtp()
    variants = {}
    for v in m.MTP_VARIANTS:
        if (v == "trunk_embed" and not M["own_embed"]) or (v == "trunk_head" and not M["own_head"]):
            continue
        variants[v] = rel_rows(m.mtp_logits(tokens, variant=v), full)
    if verbose:
        print("  prefix %.3e, chain (drafts %s) %.3e, variants %s" % (
            prefix, drafts, chain, ", ".join("%s %.2e" % kv for kv in variants.items())))
    return {"prefix": prefix, "chain": chain, "variants": variants}


def main(argv=None):
    ap = argparse.ArgumentParser(description="qwen35 float64 reference forward")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--all", action="store_true", help="logits for every position")
    ap.add_argument("--chunked", action="store_true", help="use the chunked DeltaNet form")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--self-test", action="store_true", help="check chunked vs recurrent delta rule")
    ap.add_argument("--mtp", action="store_true",
                    help="the MTP head's rows instead (n-1 rows with --all; row i predicts token i+2)")
    ap.add_argument("--mtp-variant", choices=Qwen35Ref.MTP_VARIANTS, default=None,
                    help="with --mtp: a WRONG reading of the contract (to show a test tells it apart)")
    ap.add_argument("--mtp-self-test", action="store_true",
                    help="MODEL with an MTP block: run self_test_mtp on --tokens and print its figures")
    ap.add_argument("--int8-act", action="store_true",
                    help="quantize the activations of Q8_0 / Q4_0 / K-quant products (HYSERVE_INT8_PROMPT=1)")
    ap.add_argument("--bf16-act", action="store_true",
                    help="round the activations of BF16 products in panels to bf16 (HYSERVE_BF16_PROMPT=1)")
    args = ap.parse_args(argv)
    set_int8_activations(args.int8_act)
    set_bf16_activations(args.bf16_act)
    if args.self_test:
        e = self_test_delta_rule(verbose=True)
        ok = e < 1e-10
        print("delta rule chunked vs recurrent: max rel err %.3e %s" % (e, "ok" if ok else "FAIL"))
        return 0 if ok else 1
    if not args.model or args.tokens is None:
        ap.error("MODEL and --tokens are required")
    tokens = [int(s) for s in args.tokens.split(",") if s.strip()]
    if args.mtp or args.mtp_self_test:
        return main_mtp(args, tokens)
    from models_ref import load_model  # other architectures (qwen3next, qwen3, llama)
    m = load_model(args.model)
    logits = m.forward(tokens, chunked=args.chunked, chunk=args.chunk)
    rows = logits if args.all else logits[-1:]
    json.dump({"tokens": tokens, "logits": [[float(v) for v in row] for row in rows]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


def main_mtp(args, tokens):
    """--mtp / --mtp-self-test: qwen35 or qwen35moe (hybrid_ref) files; the errors of the MTP
    contract's CLI (one line, exit 2) for a file without an MTP block and for n < 2 tokens."""
    from hybrid_ref import load_model  # qwen35moe, else models_ref's architectures
    m = load_model(args.model)
    if not hasattr(m, "mtp_logits") or getattr(m.hp, "n_nextn", 0) < 1:
        sys.stderr.write("qwen35_ref.py: %s has no MTP block (nextn_predict_layers is 0)\n" % args.model)
        return 2
    if len(tokens) < 2:
        sys.stderr.write("qwen35_ref.py: --mtp needs at least 2 tokens, got %d\n" % len(tokens))
        return 2
    if args.mtp_self_test:
        r = self_test_mtp(m, tokens)
        print("mtp prefix invariance: max rel err %.3e" % r["prefix"])
        print("mtp chain cached vs batched: max rel err %.3e" % r["chain"])
        for v, d in r["variants"].items():
            print("mtp variant %-15s distance %.3e" % (v, d))
        return 0
    logits = m.mtp_logits(tokens, chunked=args.chunked, chunk=args.chunk, variant=args.mtp_variant)
    rows = logits if args.all else logits[-1:]
    json.dump({"tokens": tokens, "logits": [[float(v) for v in row] for row in rows]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""hybrid_ref.py - float64 numpy reference forward of llama.cpp's hybrid architectures.

Owns the math of (general.architecture):
  qwen35moe      qwen35_ref.Qwen35Ref's Gated DeltaNet (tiled value heads) and gated attention,
                 with models_ref.Qwen3NextRef's MoE FFN (softmax router, top-k, renormalised,
                 plus the sigmoid-gated shared expert).
  granitehybrid  Mamba-2 / GQA attention (NoPE unless rope.scaling.finetuned; then NORM RoPE),
                 dense SwiGLU or MoE + ungated shared expert, Granite's multipliers:
                 x0 = embedding_scale * embd; x += residual_scale * mixer(...), likewise FFN;
                 attention scale = attention.scale; logits = lm_head(...) / logit_scale.
  nemotron_h     one of Mamba-2 / attention (no RoPE) / relu^2 MLP per layer, x += f(norm(x)).
  nemotron_h_moe nemotron_h whose MLP layers (expert_count > 0) are a MoE: sigmoid router, top-k by
                 p + exp_probs_b, optionally renormalised (expert_weights_norm) and scaled
                 (expert_weights_scale); relu^2 experts (up / down only) on an optional latent
                 projection (ffn_latent_down / ffn_latent_up, moe_latent_size), plus a relu^2
                 shared expert on the normed input.
  lfm2           gated short conv (y = out(C * conv(B * x))) / attention with q/k RMSNorm and NeoX
                 RoPE; dense SwiGLU every layer; final norm token_embd_norm.
  lfm2moe        lfm2 with a MoE FFN from layer leading_dense_block_count on: sigmoid (or softmax,
                 expert_gating_func) router, top-k by p + exp_probs_b, renormalised, never scaled;
                 SwiGLU experts, no shared expert.
  falcon-h1      attention and Mamba-2 in parallel on the same normed input, then SwiGLU.
  jamba          Mamba-1 (dt / B / C RMSNorms) / attention without RoPE; dense or MoE FFN
                 (softmax top-k, not renormalised).
  kimi-linear    KDA (per-key-channel gated delta rule, short convs on q / k / v, sigmoid-gated
                 output norm) / MLA without RoPE (mla_ref's expanded and absorbed forms); dense
                 leading blocks, then a sigmoid-routed MoE with selection bias + shared expert.
Each recurrent mixer in two independent forms, selected by forward(..., chunked=...):
  Mamba-2   chunked=False: token-by-token recurrence (ggml's ssm_scan):
                h_t = exp(dt_t A_h) h_{t-1} + dt_t x_t B_t^T,  y_t = h_t C_t + D_h x_t
            chunked=True: the chunked SSD ("state space duality") form of the Mamba-2 paper,
                chunk size `chunk` (intra-chunk attention-like matrix L o (C B^T), inter-chunk
                state passing).
  short conv / the causal conv1d in front of Mamba and DeltaNet:
            chunked=False: step by step with a (K-1)-row cache; chunked=True: one-shot over the
                whole (cache-prefixed) sequence.
  DeltaNet  qwen35_ref's recurrent vs chunked WY forms; KDA the same with diagonal decays.
  Mamba-1   per-element recurrence vs chunked segment sums.
  MLA       expanded (chunked=False) vs absorbed (chunked=True).
Caches (KV, conv rows, SSM / DeltaNet state) carry across forward() calls
(new_caches / forward_segments), the ground truth for decode paths.
Does not: tokenize, sample, run MTP blocks, or model biases the converters do not write.

Written from the papers (Mamba-2 SSD: per-head scalar decay a_t = exp(dt_t A_h)) and from the GGUF
layout llama.cpp's converter writes / its loader reads; where the two differ the runtime math
follows llama.cpp (the differences are listed in self_test_notes() / the CLI's --notes).

CLI:
  /usr/bin/python3 tests/ref/hybrid_ref.py MODEL.gguf --tokens 1,2,3 [--last] [--chunked] [--chunk N]
      prints {"tokens": [...], "logits": [[...], ...]}: one row of n_vocab float64 values per position
      (--last: only the last position; --all is accepted and is the default). Any architecture
      models_ref.py / mla_ref.py know is run too.
  /usr/bin/python3 tests/ref/hybrid_ref.py --self-test [-v]
      chunked SSD vs recurrence, one-shot vs stepped conv, model-level chunked vs recurrent and
      segmented vs one-shot for every architecture here (all to 1e-10).
"""

import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_io import GGUFReader  # noqa: E402
import models_ref  # noqa: E402
from models_ref import causal_attention, rope_norm, softmax  # noqa: E402
from qwen35_ref import (Qwen35Ref, gated_attention_tensors, linear, rmsnorm, rope_neox, sigmoid, silu,  # noqa: E402
                        softplus)

ARCHS = ("qwen35moe", "granitehybrid", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "falcon-h1", "jamba",
         "kimi-linear")
DEFAULT_CHUNK = 8   # the reference's SSD chunk: a 20-token prompt spans 3 chunks


# --------------------------------------------------------------------------
# causal depthwise conv1d (Mamba / DeltaNet / LFM2 short conv), two forms

def conv1d_oneshot(x, w, past):
    """x [T, C], w [C, K] (w[:, K-1] multiplies the current token), past [K-1, C] (oldest first).
    out[t][c] = sum_j w[c][j] * xp[t + j][c] with xp = concat(past, x). Returns out, new past."""
    K = w.shape[1]
    T = x.shape[0]
    xp = np.concatenate([past, x])
    out = np.zeros_like(x)
    for j in range(K):
        out += w[:, j][None, :] * xp[j:j + T]
    return out, xp[xp.shape[0] - (K - 1):].copy()


def conv1d_step(x, w, past):
    """The same, one token at a time through a (K-1)-row rolling cache."""
    state = past.copy()
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        window = np.concatenate([state, x[t:t + 1]])      # [K, C], oldest first
        out[t] = np.sum(window.T * w, axis=1)
        state = window[1:]
    return out, state


def conv1d(x, w, past, oneshot):
    return conv1d_oneshot(x, w, past) if oneshot else conv1d_step(x, w, past)


# --------------------------------------------------------------------------
# Mamba-2 selective state space, two forms (all heads at once)

def ssd_recurrent(x, dt, A, B, C, state=None):
    """Token-by-token Mamba-2 scan (what ggml_ssm_scan computes, without D).
    x [T, H, P] (P = head dim), dt [T, H] (after softplus), A [H] (< 0), B, C [T, H, N]
    (already mapped from groups to heads), state [H, P, N] or None. Returns y [T, H, P], state."""
    T, H, P = x.shape
    N = B.shape[2]
    S = np.zeros((H, P, N)) if state is None else state.copy()
    y = np.empty((T, H, P))
    for t in range(T):
        dA = np.exp(dt[t] * A)                                          # [H]
        S = S * dA[:, None, None] + (x[t] * dt[t][:, None])[:, :, None] * B[t][:, None, :]
        y[t] = np.einsum("hpn,hn->hp", S, C[t])
    return y, S


def ssd_chunked(x, dt, A, B, C, state=None, chunk=DEFAULT_CHUNK):
    """Chunked SSD form (Mamba-2 paper, "state space duality"); same arguments and results as
    ssd_recurrent. Per chunk of Q tokens, with a_t = dt_t A (log decay) and cs = cumsum(a):
      y_diag[i] = sum_{j<=i} exp(cs_i - cs_j) (C_i . B_j) dt_j x_j      (intra-chunk, quadratic)
      y_off[i]  = exp(cs_i) (S C_i)                                       (state entering the chunk)
      S'        = exp(cs_{Q-1}) S + sum_j exp(cs_{Q-1} - cs_j) dt_j x_j B_j^T
    The sequence is padded to a multiple of Q with dt = 0 (decay 1, no input): S is unchanged."""
    T, H, P = x.shape
    N = B.shape[2]
    Q = int(chunk)
    Tp = (T + Q - 1) // Q * Q
    pad = Tp - T

    def padrows(a):
        return np.concatenate([a, np.zeros((pad,) + a.shape[1:])]) if pad else a

    x, dt, B, C = (padrows(v) for v in (x, dt, B, C))
    S = np.zeros((H, P, N)) if state is None else state.copy()
    y = np.empty((Tp, H, P))
    ii, jj = np.meshgrid(np.arange(Q), np.arange(Q), indexing="ij")
    lower = ii >= jj
    for c0 in range(0, Tp, Q):
        sl = slice(c0, c0 + Q)
        xc, dtc, Bc, Cc = x[sl], dt[sl], B[sl], C[sl]
        a = dtc * A[None, :]                                            # [Q, H]
        cs = np.cumsum(a, axis=0)                                       # [Q, H]
        seg = cs[:, None, :] - cs[None, :, :]                           # [Qi, Qj, H]: cs_i - cs_j
        Lm = np.where(lower[:, :, None], np.exp(np.where(lower[:, :, None], seg, 0.0)), 0.0)
        CB = np.einsum("ihn,jhn->ijh", Cc, Bc)                          # [Qi, Qj, H]
        xdt = xc * dtc[:, :, None]                                      # [Q, H, P]
        y_diag = np.einsum("ijh,jhp->ihp", Lm * CB, xdt)
        y_off = np.einsum("hpn,ihn->ihp", S, Cc) * np.exp(cs)[:, :, None]
        y[sl] = y_diag + y_off
        decay_to_end = np.exp(cs[-1][None, :] - cs)                     # [Q, H]
        S = S * np.exp(cs[-1])[:, None, None] + np.einsum("jh,jhp,jhn->hpn", decay_to_end, xdt, Bc)
    return y[:T], S


def selective_scan_mamba1(x, dt, A, B, C, state=None):
    """Mamba-1 (per channel and state element decay), token by token (ggml_ssm_scan, A 2-D).
    x, dt [T, Di]; A [Di, N]; B, C [T, N]; state [Di, N]. Returns y [T, Di], state."""
    T, Di = x.shape
    N = A.shape[1]
    S = np.zeros((Di, N)) if state is None else state.copy()
    y = np.empty((T, Di))
    for t in range(T):
        S = S * np.exp(dt[t][:, None] * A) + (x[t] * dt[t])[:, None] * B[t][None, :]
        y[t] = S @ C[t]
    return y, S


def selective_scan_mamba1_chunked(x, dt, A, B, C, state=None, chunk=DEFAULT_CHUNK):
    """Mamba-1 in chunks: within a chunk the decays are cumulative products (log-space sums),
    S_i = exp(cs_i) S_0 + sum_{j<=i} exp(cs_i - cs_j) dt_j x_j B_j  per (channel, state),
    y_i = S_i . C_i. Independent of the recurrence above (segment sums, no loop over tokens)."""
    T, Di = x.shape
    N = A.shape[1]
    Q = int(chunk)
    S = np.zeros((Di, N)) if state is None else state.copy()
    y = np.empty((T, Di))
    for c0 in range(0, T, Q):
        sl = slice(c0, min(T, c0 + Q))
        q = sl.stop - sl.start
        a = dt[sl][:, :, None] * A[None, :, :]                          # [q, Di, N]
        cs = np.cumsum(a, axis=0)
        ii, jj = np.meshgrid(np.arange(q), np.arange(q), indexing="ij")
        lower = (ii >= jj)[:, :, None, None]
        seg = cs[:, None] - cs[None, :]                                  # [qi, qj, Di, N]
        Lm = np.where(lower, np.exp(np.where(lower, seg, 0.0)), 0.0)
        u = (x[sl] * dt[sl])[:, :, None] * B[sl][:, None, :]            # [q, Di, N]
        Si = np.einsum("ijdn,jdn->idn", Lm, u) + np.exp(cs) * S[None]    # [q, Di, N]
        y[sl] = np.einsum("idn,in->id", Si, C[sl])
        S = Si[-1]
    return y, S


# --------------------------------------------------------------------------
# KDA (Kimi Delta Attention): gated delta rule with a per-key-channel decay, two forms

def kda_recurrent(q, k, v, g, beta, state=None):
    """q, k [T, H, dk] (q l2-normed and scaled, k l2-normed), v [T, H, dv], g [T, H, dk] log decay
    per key channel (<= 0), beta [T, H]; state [H, dk, dv] (S[key][value]). Per token:
      S = diag(exp(g)) S;  d = beta (v - S^T k);  S += k d^T;  o = S^T q."""
    T, H, dk = k.shape
    dv = v.shape[2]
    S = np.zeros((H, dk, dv)) if state is None else state.copy()
    o = np.empty((T, H, dv))
    for t in range(T):
        S = S * np.exp(g[t])[:, :, None]
        kv = np.einsum("hij,hi->hj", S, k[t])
        d = beta[t][:, None] * (v[t] - kv)
        S = S + k[t][:, :, None] * d[:, None, :]
        o[t] = np.einsum("hij,hi->hj", S, q[t])
    return o, S


def kda_chunked(q, k, v, g, beta, state=None, chunk=DEFAULT_CHUNK):
    """The chunked (WY / UT) form with diagonal decays; same arguments / results as kda_recurrent.
    Per chunk, G = cumsum(g) per key channel, E[i, j, d] = exp(G_i[d] - G_j[d]) (i >= j):
      L[i, j]   = beta_i sum_d k_i[d] k_j[d] E[i, j, d]  (i > j);  Tm = (I + L)^-1
      U = Tm (beta v);  W = Tm (beta k o exp(G));  Vn = U - W S
      O = (q o exp(G)) S + A Vn,  A[i, j] = sum_d q_i[d] k_j[d] E[i, j, d]  (i >= j)
      S' = diag(exp(G_last)) S + (k o exp(G_last - G))^T Vn"""
    T, H, dk = k.shape
    dv = v.shape[2]
    C = int(chunk)
    Tp = (T + C - 1) // C * C
    pad = Tp - T

    def padrows(a):
        return np.concatenate([a, np.zeros((pad,) + a.shape[1:])]) if pad else a

    q, k, v, g, beta = (padrows(a) for a in (q, k, v, g, beta))
    S = np.zeros((H, dk, dv)) if state is None else state.copy()
    o = np.empty((Tp, H, dv))
    ii, jj = np.meshgrid(np.arange(C), np.arange(C), indexing="ij")
    incl = (ii >= jj)[:, :, None]
    strict = ii > jj
    for h in range(H):
        Sh = S[h]
        for c0 in range(0, Tp, C):
            sl = slice(c0, c0 + C)
            qc, kc, vc, gc, bc = q[sl, h], k[sl, h], v[sl, h], g[sl, h], beta[sl, h]
            G = np.cumsum(gc, axis=0)                                   # [C, dk]
            diff = G[:, None, :] - G[None, :, :]                        # [Ci, Cj, dk]
            E = np.where(incl, np.exp(np.where(incl, diff, 0.0)), 0.0)
            kb = kc * bc[:, None]
            Lm = np.where(strict, np.einsum("id,jd,ijd->ij", kb, kc, E), 0.0)
            Tm = np.linalg.inv(np.eye(C) + Lm)
            U = Tm @ (vc * bc[:, None])
            Wm = Tm @ (kb * np.exp(G))
            A = np.einsum("id,jd,ijd->ij", qc, kc, E)                  # zero above the diagonal via E
            Vn = U - Wm @ Sh
            o[sl, h] = (qc * np.exp(G)) @ Sh + A @ Vn
            Sh = np.exp(G[-1])[:, None] * Sh + (kc * np.exp(G[-1][None, :] - G)).T @ Vn
        S[h] = Sh
    return o[:T], S


# --------------------------------------------------------------------------
# shared pieces

def _key(r, arch, name, default=None, required=True):
    full = "%s.%s" % (arch, name)
    if full in r.kv:
        return r.kv[full]
    if required and default is None:
        raise KeyError("missing metadata key %s" % full)
    return default


def _per_layer(v, n, what):
    """A key that is a scalar or a per-layer array -> list of n ints."""
    if isinstance(v, list):
        if len(v) != n:
            raise ValueError("%s has %d entries, expected %d layers" % (what, len(v), n))
        return [int(x) for x in v]
    return [int(v)] * n


def swiglu_expert(L, e, x):
    """Expert e's hidden activations silu(gate_e x) * up_e x (its down projection applied by the caller)."""
    return silu(linear(x, L["gate_exps"][e])) * linear(x, L["up_exps"][e])


def relu2_mlp(L, x, suffix=""):
    """down(relu(up x)^2): Nemotron-H's MLP, its experts and its shared expert (no gate)."""
    return linear(np.maximum(linear(x, L["up" + suffix]), 0.0) ** 2, L["down" + suffix])


class HybridRef:
    """Base: token embedding, a per-layer block, final norm, LM head. Subclasses set
    self.layers (dicts of float64 arrays plus "kind") and implement block()."""

    arch = None
    # Mamba-2 B/C group of head h: "interleave" = h // (n_head / n_group), what llama.cpp's
    # ggml_ssm_scan and HF / mamba_ssm (repeat_interleave) do; "tiled" = h % n_group exists only
    # so a failing golden case can tell whether the engine mapped the groups that way
    group_map = "interleave"

    def _load_common(self, path, output_norm_name="output_norm.weight"):
        r = GGUFReader(path)
        got = r.get("general.architecture")
        if got != self.arch:
            raise ValueError("general.architecture is %r, expected %r" % (got, self.arch))
        self.reader = r
        self.t = models_ref._tensor_loader(r)
        self.tok_embd = r.tensor("token_embd.weight")
        self.n_vocab, D = self.tok_embd.shape
        self.n_embd = int(_key(r, self.arch, "embedding_length"))
        if D != self.n_embd:
            raise ValueError("token_embd.weight ne[0] %d != embedding_length %d" % (D, self.n_embd))
        self.output_norm = self.t(output_norm_name, (D,))
        self.output = self.t("output.weight", (self.n_vocab, D)) if "output.weight" in r.tensors else self.tok_embd
        self.n_layer = int(_key(r, self.arch, "block_count"))
        self.eps = float(_key(r, self.arch, "attention.layer_norm_rms_epsilon"))
        self.min_route_gap = np.inf
        return r

    # ---- caches / driver ---------------------------------------------------

    def new_caches(self):
        return [dict() for _ in self.layers]

    def embed(self, toks):
        return self.tok_embd[toks]

    def head(self, x):
        return linear(rmsnorm(x, self.output_norm, self.eps), self.output)

    def forward(self, tokens, chunked=False, chunk=DEFAULT_CHUNK, caches=None, pos0=0):
        """Logits [T, n_vocab] for tokens at positions pos0 .. pos0+T-1; caches as new_caches()."""
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError("need a non-empty token list")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError("token id out of range [0, %d)" % self.n_vocab)
        pos = pos0 + np.arange(len(toks))
        x = self.embed(toks)
        for il, L in enumerate(self.layers):
            cache = None if caches is None else caches[il]
            x = self.block(L, x, pos, cache, chunked, chunk)
        return self.head(x)

    def forward_segments(self, tokens, sizes, chunked=False, chunk=DEFAULT_CHUNK):
        caches = self.new_caches()
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

    def kinds(self):
        return "".join(L["kind"] for L in self.layers)

    # ---- pieces ------------------------------------------------------------

    def attention(self, L, x, pos, cache, rope=None, qk_norm=False, scale=None):
        """GQA softmax attention; rope None / "norm" / "neox" over n_rot dims."""
        T = x.shape[0]
        H, Hkv, hd = self.n_head, L["n_head_kv"], self.head_dim
        q = linear(x, L["wq"]).reshape(T, H, hd)
        k = linear(x, L["wk"]).reshape(T, Hkv, hd)
        v = linear(x, L["wv"]).reshape(T, Hkv, hd)
        if qk_norm:
            q = rmsnorm(q, L["q_norm"], self.eps)
            k = rmsnorm(k, L["k_norm"], self.eps)
        if rope == "norm":
            q = rope_norm(q, pos, self.n_rot, self.rope_theta)
            k = rope_norm(k, pos, self.n_rot, self.rope_theta)
        elif rope == "neox":
            q = rope_neox(q, pos, self.n_rot, self.rope_theta)
            k = rope_neox(k, pos, self.n_rot, self.rope_theta)
        out = causal_attention(q, k, v, scale if scale else 1.0 / math.sqrt(hd), cache)
        return linear(out.reshape(T, H * hd), L["wo"])

    def swiglu(self, L, x, suffix=""):
        return linear(silu(linear(x, L["gate" + suffix])) * linear(x, L["up" + suffix]), L["down" + suffix])

    def top_k(self, scores, gap_of):
        """The n_expert_used largest scores [T, E] per row (ties -> lower index); records in
        min_route_gap the smallest gap between the k-th and (k+1)-th of gap_of (same order)."""
        k = self.n_expert_used
        order = np.argsort(-scores, axis=1, kind="stable")
        if k < scores.shape[1]:
            lk = np.take_along_axis(gap_of, order[:, k - 1:k + 1], axis=1)
            self.min_route_gap = min(self.min_route_gap, float((lk[:, 0] - lk[:, 1]).min()))
        return order[:, :k]

    def route(self, L, x, renorm=True):
        """Softmax router, top-k (ties -> lower index), optionally renormalised."""
        logits = linear(x, L["gate_inp"])
        p = softmax(logits, axis=1)
        top = self.top_k(p, logits)
        w = np.take_along_axis(p, top, axis=1)
        if renorm:
            w = w / w.sum(axis=1, keepdims=True)
        return top, w

    def route_biased(self, L, logits, gating, norm_w, w_scale):
        """llama.cpp build_moe_ffn's router with a selection bias (exp_probs_b): p = sigmoid or
        softmax of the logits [T, E]; the top-k of p + exp_probs_b choose (the bias picks, it does
        not weigh), the weights are p of the chosen, divided by max(their sum, 2^-14) when norm_w,
        times w_scale unless it is 0 or 1."""
        p = sigmoid(logits) if gating == "sigmoid" else softmax(logits, axis=1)
        sel = p + L["probs_b"][None, :] if "probs_b" in L else p
        top = self.top_k(sel, sel)
        w = np.take_along_axis(p, top, axis=1)
        if norm_w:
            w = w / np.maximum(w.sum(axis=1, keepdims=True), 6.103515625e-5)   # ggml_clamp to f16's min normal
        if w_scale not in (0.0, 1.0):
            w = w * w_scale
        return top, w

    def experts_weighted(self, L, x, top, w, act):
        """sum over the chosen experts e of w * down_e(act(L, e, x)), x [T, n_in] -> [T, n_out of down]."""
        out = None
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            y = linear(act(L, e, x[rows]), L["down_exps"][e])
            if out is None:
                out = np.zeros((x.shape[0], y.shape[1]))
            out[rows] += w[rows, slot][:, None] * y
        return out

    def experts(self, L, x, renorm=True):
        top, w = self.route(L, x, renorm)
        return self.experts_weighted(L, x, top, w, swiglu_expert)

    # ---- Mamba-2 -----------------------------------------------------------

    def _load_mamba2_hparams(self, r):
        a = self.arch
        self.conv_k = int(_key(r, a, "ssm.conv_kernel"))
        self.d_inner = int(_key(r, a, "ssm.inner_size"))
        self.d_state = int(_key(r, a, "ssm.state_size"))
        self.ssm_heads = int(_key(r, a, "ssm.time_step_rank"))
        self.n_group = int(_key(r, a, "ssm.group_count"))
        if self.d_inner % self.ssm_heads or self.ssm_heads % self.n_group or self.d_inner % self.n_group:
            raise ValueError("bad Mamba-2 sizes d_inner %d heads %d groups %d" % (
                self.d_inner, self.ssm_heads, self.n_group))

    def _load_mamba2(self, p):
        di, ds, nh, ng, K = self.d_inner, self.d_state, self.ssm_heads, self.n_group, self.conv_k
        t = self.t
        cd = di + 2 * ng * ds
        L = {"ssm_in": t(p + "ssm_in.weight", (2 * di + 2 * ng * ds + nh, self.n_embd)),
             "conv": t(p + "ssm_conv1d.weight", (cd, K)),
             "dt_b": t(p + "ssm_dt.bias", (nh,)),
             "A": t(p + "ssm_a", (nh, 1)),
             "D": t(p + "ssm_d", (nh, 1)),
             "ssm_out": t(p + "ssm_out.weight", (self.n_embd, di))}
        if p + "ssm_norm.weight" in self.reader.tensors or self.arch != "falcon-h1":
            L["ssm_norm"] = t(p + "ssm_norm.weight", (ng, di // ng))   # optional only for falcon-h1
        # the loader makes the bias optional, ggml's graph always adds it
        L["conv_b"] = t(p + "ssm_conv1d.bias", (cd,)) if p + "ssm_conv1d.bias" in self.reader.tensors else np.zeros(cd)
        return L

    def mamba2(self, L, x, cache, chunked, chunk):
        """llama.cpp build_mamba2_layer on x [T, D] (already normed)."""
        T = x.shape[0]
        di, ds, nh, ng, K = self.d_inner, self.d_state, self.ssm_heads, self.n_group, self.conv_k
        P = di // nh
        zxbcdt = linear(x, L["ssm_in"])
        z = zxbcdt[:, :di]
        xBC = zxbcdt[:, di:2 * di + 2 * ng * ds]
        dt = zxbcdt[:, 2 * di + 2 * ng * ds:]
        past = cache["conv"] if cache is not None and "conv" in cache else np.zeros((K - 1, xBC.shape[1]))
        xBC, new_past = conv1d(xBC, L["conv"], past, oneshot=chunked)
        xBC = silu(xBC + L["conv_b"])
        xs = xBC[:, :di].reshape(T, nh, P)
        B = xBC[:, di:di + ng * ds].reshape(T, ng, ds)
        C = xBC[:, di + ng * ds:].reshape(T, ng, ds)
        if self.group_map == "interleave":
            grp = np.arange(nh) // (nh // ng)        # head h reads group h / (nh / ng) (ggml_ssm_scan)
        else:
            grp = np.arange(nh) % ng                 # diagnosis only: the tiled mapping, NOT llama.cpp's
        dt = softplus(dt + L["dt_b"])                # ggml_softplus: x > 20 ? x : log1p(exp(x))
        A = L["A"].reshape(nh)
        S0 = cache.get("ssm") if cache is not None else None
        if chunked:
            y, S = ssd_chunked(xs, dt, A, B[:, grp], C[:, grp], S0, chunk)
        else:
            y, S = ssd_recurrent(xs, dt, A, B[:, grp], C[:, grp], S0)
        if cache is not None:
            cache["conv"], cache["ssm"] = new_past, S
        y = y + xs * L["D"].reshape(1, nh, 1)
        y = y.reshape(T, di) * silu(z)               # gate BEFORE the norm (norm_before_gate=False)
        if "ssm_norm" in L:
            y = rmsnorm(y.reshape(T, ng, di // ng), L["ssm_norm"], self.eps).reshape(T, di)   # grouped
        return linear(y, L["ssm_out"])

    def _load_attention(self, p, n_head_kv, qk_norm=False, q_mult=1):
        t, D, hd = self.t, self.n_embd, self.head_dim
        L = {"n_head_kv": n_head_kv,
             "wq": t(p + "attn_q.weight", (q_mult * self.n_head * hd, D)),
             "wk": t(p + "attn_k.weight", (n_head_kv * hd, D)),
             "wv": t(p + "attn_v.weight", (n_head_kv * hd, D)),
             "wo": t(p + "attn_output.weight", (D, self.n_head * hd))}
        if qk_norm:
            L["q_norm"] = t(p + "attn_q_norm.weight", (hd,))
            L["k_norm"] = t(p + "attn_k_norm.weight", (hd,))
        return L


# --------------------------------------------------------------------------
# qwen35moe

class Qwen35MoeHparams:
    """qwen35's keys (qwen35_ref.Hparams) without feed_forward_length, plus the MoE keys."""

    def __init__(self, r):
        a = "qwen35moe"

        def key(name, default=None, required=True):
            return _key(r, a, name, default, required)
        got = r.get("general.architecture")
        if got != a:
            raise ValueError("general.architecture is %r, expected %r" % (got, a))
        self.n_block = int(key("block_count"))
        self.n_nextn = int(key("nextn_predict_layers", 0, False))
        self.n_layer = self.n_block - self.n_nextn
        self.n_embd = int(key("embedding_length"))
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
        self.d_v = self.d_inner // self.n_v
        rec = key("attention.recurrent_layers", None, False)
        if rec is not None:
            self.recurrent = [bool(v) for v in rec[:self.n_layer]]
        else:
            interval = int(key("full_attention_interval", 4, False))
            self.recurrent = [(i + 1) % interval != 0 for i in range(self.n_layer)]
        self.n_expert = int(key("expert_count"))
        self.n_expert_used = int(key("expert_used_count"))
        self.n_ff_exp = int(key("expert_feed_forward_length"))
        self.n_ff_shexp = int(key("expert_shared_feed_forward_length", 0, False))
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("expert_used_count %d not in 1..%d" % (self.n_expert_used, self.n_expert))
        if self.n_v % self.n_k or self.n_head % self.n_head_kv:
            raise ValueError("n_v %% n_k or n_head %% n_head_kv != 0")


class Qwen35MoeRef(Qwen35Ref):
    """qwen35 mixers (inherited: attention, deltanet with tiled heads, forward loop, caches) with
    qwen3next's MoE FFN (inherited below from models_ref.Qwen3NextRef)."""

    arch = "qwen35moe"
    route = models_ref.Qwen3NextRef.route
    ffn = models_ref.Qwen3NextRef.ffn
    ffn_tensors = models_ref.Qwen3NextRef.ffn_tensors   # the trunk's and the MTP block's

    def __init__(self, path):
        r = GGUFReader(path)
        self.reader = r
        self.hp = hp = Qwen35MoeHparams(r)
        t = models_ref._tensor_loader(r)
        D = hp.n_embd
        models_ref._globals(self, r, D)
        key_dim, value_dim = hp.n_k * hp.d_k, hp.n_v * hp.d_v
        conv_dim = 2 * key_dim + value_dim
        self.min_route_gap = np.inf
        self.layers = []
        for il in range(hp.n_layer):
            p = "blk.%d." % il
            L = {"recurrent": hp.recurrent[il], "kind": "L" if hp.recurrent[il] else "A",
                 "attn_norm": t(p + "attn_norm.weight", (D,)),
                 "post_norm": t(p + "post_attention_norm.weight", (D,))}
            L.update(self.ffn_tensors(t, p))
            if hp.recurrent[il]:
                L.update({"qkv": t(p + "attn_qkv.weight", (conv_dim, D)),
                          "gate": t(p + "attn_gate.weight", (value_dim, D)),
                          "beta": t(p + "ssm_beta.weight", (hp.n_v, D)),
                          "alpha": t(p + "ssm_alpha.weight", (hp.n_v, D)),
                          "conv": t(p + "ssm_conv1d.weight", (conv_dim, hp.conv_k)),
                          "dt_bias": t(p + "ssm_dt.bias", (hp.n_v,)),
                          "a": t(p + "ssm_a", (hp.n_v,)),
                          "norm": t(p + "ssm_norm.weight", (hp.d_v,)),
                          "out": t(p + "ssm_out.weight", (D, value_dim))})
            else:
                L.update(gated_attention_tensors(t, p, hp))
            self.layers.append(L)

    def kinds(self):
        return "".join(L["kind"] for L in self.layers)

    def forward(self, tokens, chunked=False, chunk=DEFAULT_CHUNK, caches=None, pos0=0):
        return Qwen35Ref.forward(self, tokens, chunked, chunk, caches, pos0)

    def forward_segments(self, tokens, sizes, chunked=False, chunk=DEFAULT_CHUNK, state_dtype="f64"):
        return Qwen35Ref.forward_segments(self, tokens, sizes, chunked, chunk, state_dtype)


# --------------------------------------------------------------------------
# granitehybrid

class GraniteHybridRef(HybridRef):
    arch = "granitehybrid"

    def __init__(self, path):
        r = self._load_common(path)
        a = self.arch
        n = self.n_layer
        D = self.n_embd
        self.n_head = int(_key(r, a, "attention.head_count"))
        self.head_dim = D // self.n_head                     # Granite: no key_length
        hkv = _per_layer(_key(r, a, "attention.head_count_kv"), n, "attention.head_count_kv")
        self.rope_theta = float(_key(r, a, "rope.freq_base", 10000.0, False))
        self.n_rot = int(_key(r, a, "rope.dimension_count", self.head_dim, False))
        self.use_rope = bool(_key(r, a, "rope.scaling.finetuned", True, False))   # default true (llama.cpp)
        self.attn_scale = float(_key(r, a, "attention.scale", 0.0, False)) or 1.0 / math.sqrt(self.head_dim)
        self.embedding_scale = float(_key(r, a, "embedding_scale", 0.0, False))
        self.residual_scale = float(_key(r, a, "residual_scale", 0.0, False))
        self.logit_scale = float(_key(r, a, "logit_scale", 0.0, False))
        self.n_ff = int(_key(r, a, "feed_forward_length"))
        self.n_expert = int(_key(r, a, "expert_count", 0, False))
        self.n_expert_used = int(_key(r, a, "expert_used_count", 0, False))
        self.n_ff_shexp = int(_key(r, a, "expert_shared_feed_forward_length", 0, False))
        self._load_mamba2_hparams(r)
        if self.d_inner != 2 * D:
            raise ValueError("granitehybrid: ssm.inner_size %d != 2 * n_embd (llama.cpp asserts it)" % self.d_inner)
        t, F, E = self.t, self.n_ff, self.n_expert
        self.layers = []
        for il in range(n):
            p = "blk.%d." % il
            if hkv[il] == 0:
                L = self._load_mamba2(p)
                L["kind"] = "M"
            else:
                L = self._load_attention(p, hkv[il])
                L["kind"] = "A"
            L["attn_norm"] = t(p + "attn_norm.weight", (D,))
            L["ffn_norm"] = t(p + "ffn_norm.weight", (D,))
            if E:
                L.update({"gate_inp": t(p + "ffn_gate_inp.weight", (E, D)),
                          "gate_exps": t(p + "ffn_gate_exps.weight", (E, F, D)),
                          "up_exps": t(p + "ffn_up_exps.weight", (E, F, D)),
                          "down_exps": t(p + "ffn_down_exps.weight", (E, D, F))})
                if self.n_ff_shexp:
                    Fs = self.n_ff_shexp
                    L.update({"gate_shexp": t(p + "ffn_gate_shexp.weight", (Fs, D)),
                              "up_shexp": t(p + "ffn_up_shexp.weight", (Fs, D)),
                              "down_shexp": t(p + "ffn_down_shexp.weight", (D, Fs))})
            else:
                L.update({"gate": t(p + "ffn_gate.weight", (F, D)), "up": t(p + "ffn_up.weight", (F, D)),
                          "down": t(p + "ffn_down.weight", (D, F))})
            self.layers.append(L)

    def embed(self, toks):
        x = self.tok_embd[toks]
        return x * self.embedding_scale if self.embedding_scale else x

    def head(self, x):
        z = HybridRef.head(self, x)
        return z / self.logit_scale if self.logit_scale else z

    def block(self, L, x, pos, cache, chunked, chunk):
        xn = rmsnorm(x, L["attn_norm"], self.eps)
        if L["kind"] == "M":
            h = self.mamba2(L, xn, cache, chunked, chunk)
        else:
            h = self.attention(L, xn, pos, cache, rope="norm" if self.use_rope else None, scale=self.attn_scale)
        rs = self.residual_scale or 1.0
        x = x + rs * h
        xn = rmsnorm(x, L["ffn_norm"], self.eps)
        if "gate_inp" in L:
            f = self.experts(L, xn)
            if "gate_shexp" in L:
                f = f + self.swiglu(L, xn, "_shexp")           # Granite: shared expert not gated
        else:
            f = self.swiglu(L, xn)
        return x + rs * f


# --------------------------------------------------------------------------
# nemotron_h

class NemotronHRef(HybridRef):
    arch = "nemotron_h"

    def __init__(self, path):
        r = self._load_common(path)
        a, n, D = self.arch, self.n_layer, self.n_embd
        self.n_head = int(_key(r, a, "attention.head_count"))
        self.head_dim = int(_key(r, a, "attention.key_length", D // self.n_head, False))
        hkv = _per_layer(_key(r, a, "attention.head_count_kv"), n, "attention.head_count_kv")
        ff = _per_layer(_key(r, a, "feed_forward_length"), n, "feed_forward_length")
        self.attn_scale = float(_key(r, a, "attention.scale", 0.0, False)) or 1.0 / math.sqrt(self.head_dim)
        self._load_mamba2_hparams(r)
        t = self.t
        self.layers = []
        for il in range(n):
            p = "blk.%d." % il
            if hkv[il] == 0 and ff[il] == 0:
                L = self._load_mamba2(p)
                L["kind"] = "M"
            elif ff[il] == 0:
                L = self._load_attention(p, hkv[il])
                L["kind"] = "A"
            else:
                L = self._load_mlp(p, ff[il])
            L["attn_norm"] = t(p + "attn_norm.weight", (D,))
            self.layers.append(L)

    def _load_mlp(self, p, n_ff):
        t, D = self.t, self.n_embd
        return {"kind": "F", "up": t(p + "ffn_up.weight", (n_ff, D)), "down": t(p + "ffn_down.weight", (D, n_ff))}

    def mlp(self, L, xn):
        return relu2_mlp(L, xn)

    def block(self, L, x, pos, cache, chunked, chunk):
        xn = rmsnorm(x, L["attn_norm"], self.eps)
        if L["kind"] == "M":
            h = self.mamba2(L, xn, cache, chunked, chunk)
        elif L["kind"] == "A":
            h = self.attention(L, xn, pos, cache, rope=None, scale=self.attn_scale)
        else:
            h = self.mlp(L, xn)
        return x + h


class NemotronHMoeRef(NemotronHRef):
    """nemotron_h with, when expert_count > 0, a MoE on each MLP layer (llama.cpp
    nemotron_h::build_ffn_layer; the tensors and keys of nemotron_h's loader):
      logits = ffn_gate_inp xn; p = sigmoid(logits) (the gating is fixed, no key read);
      top-k of p + exp_probs_b; w = p of the chosen, / max(sum, 2^-14) if expert_weights_norm,
      times expert_weights_scale unless 0 / 1;
      xl = ffn_latent_down xn (when present, moe_latent_size wide; else xl = xn);
      moe = sum_k w_k down_k(relu(up_k xl)^2), then ffn_latent_up moe (when present);
      out = moe + down_shexp(relu(up_shexp xn)^2)   (the shared expert reads xn, not xl).
    Expert size expert_feed_forward_length, else feed_forward_length[il] / expert_used_count."""

    arch = "nemotron_h_moe"

    def __init__(self, path):
        r = GGUFReader(path)
        a = self.arch
        self.n_expert = int(_key(r, a, "expert_count", 0, False))
        self.n_expert_used = int(_key(r, a, "expert_used_count", 0, False))
        self.n_ff_exp = int(_key(r, a, "expert_feed_forward_length", 0, False))
        self.n_ff_shexp = int(_key(r, a, "expert_shared_feed_forward_length", 0, False))
        self.norm_w = bool(_key(r, a, "expert_weights_norm", False, False))
        self.w_scale = float(_key(r, a, "expert_weights_scale", 0.0, False))
        self.latent = int(_key(r, a, "moe_latent_size", 0, False))
        groups = int(_key(r, a, "expert_group_count", 0, False))
        if groups > 1:
            raise ValueError("nemotron_h_moe: expert_group_count %d > 1 (grouped selection) is not modelled"
                             % groups)
        if self.n_expert and not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("expert_used_count %d not in 1..%d" % (self.n_expert_used, self.n_expert))
        NemotronHRef.__init__(self, path)

    def _load_mlp(self, p, n_ff):
        if not self.n_expert:
            return NemotronHRef._load_mlp(self, p, n_ff)
        t, D, E = self.t, self.n_embd, self.n_expert
        Fe = self.n_ff_exp or n_ff // self.n_expert_used
        Fs = self.n_ff_shexp
        Dl = self.latent or D
        L = {"kind": "E", "gate_inp": t(p + "ffn_gate_inp.weight", (E, D)),
             "probs_b": t(p + "exp_probs_b.bias", (E,)),
             "up_exps": t(p + "ffn_up_exps.weight", (E, Fe, Dl)),
             "down_exps": t(p + "ffn_down_exps.weight", (E, Dl, Fe)),
             "up_shexp": t(p + "ffn_up_shexp.weight", (Fs, D)),
             "down_shexp": t(p + "ffn_down_shexp.weight", (D, Fs))}
        # each optional on its own in the loader (moe_n_embd = moe_latent_size or n_embd)
        if p + "ffn_latent_down.weight" in self.reader.tensors:
            L["latent_down"] = t(p + "ffn_latent_down.weight", (Dl, D))
        if p + "ffn_latent_up.weight" in self.reader.tensors:
            L["latent_up"] = t(p + "ffn_latent_up.weight", (D, Dl))
        return L

    def mlp(self, L, xn):
        if L["kind"] == "F":
            return relu2_mlp(L, xn)
        top, w = self.route_biased(L, linear(xn, L["gate_inp"]), "sigmoid", self.norm_w, self.w_scale)
        xl = linear(xn, L["latent_down"]) if "latent_down" in L else xn
        moe = self.experts_weighted(L, xl, top, w, lambda L, e, x: np.maximum(linear(x, L["up_exps"][e]), 0.0) ** 2)
        if "latent_up" in L:
            moe = linear(moe, L["latent_up"])
        return moe + relu2_mlp(L, xn, "_shexp")


# --------------------------------------------------------------------------
# lfm2

class Lfm2Ref(HybridRef):
    arch = "lfm2"

    def __init__(self, path):
        r = self._load_common(path, output_norm_name="token_embd_norm.weight")
        a, n, D = self.arch, self.n_layer, self.n_embd
        self.n_head = int(_key(r, a, "attention.head_count"))
        self.head_dim = D // self.n_head
        hkv = _per_layer(_key(r, a, "attention.head_count_kv"), n, "attention.head_count_kv")
        self.rope_theta = float(_key(r, a, "rope.freq_base", 10000.0, False))
        self.n_rot = int(_key(r, a, "rope.dimension_count", self.head_dim, False))
        self.l_cache = int(_key(r, a, "shortconv.l_cache"))
        self.n_ff = int(_key(r, a, "feed_forward_length"))
        t = self.t
        self.layers = []
        for il in range(n):
            p = "blk.%d." % il
            if hkv[il] == 0:
                L = {"kind": "C", "conv": t(p + "shortconv.conv.weight", (D, self.l_cache)),
                     "in_proj": t(p + "shortconv.in_proj.weight", (3 * D, D)),
                     "out_proj": t(p + "shortconv.out_proj.weight", (D, D))}
            else:
                L = self._load_attention(p, hkv[il], qk_norm=True)
                L["kind"] = "A"
            L.update({"attn_norm": t(p + "attn_norm.weight", (D,)), "ffn_norm": t(p + "ffn_norm.weight", (D,))})
            L.update(self._load_ffn(p, il))
            self.layers.append(L)

    def _load_ffn(self, p, il):
        t, D, F = self.t, self.n_embd, self.n_ff
        return {"gate": t(p + "ffn_gate.weight", (F, D)), "up": t(p + "ffn_up.weight", (F, D)),
                "down": t(p + "ffn_down.weight", (D, F))}

    def ffn(self, L, xn):
        return self.swiglu(L, xn)

    def shortconv(self, L, x, cache, oneshot):
        D = self.n_embd
        bcx = linear(x, L["in_proj"])
        b, c, xx = bcx[:, :D], bcx[:, D:2 * D], bcx[:, 2 * D:]
        past = cache["conv"] if cache is not None and "conv" in cache else np.zeros((self.l_cache - 1, D))
        y, new_past = conv1d(b * xx, L["conv"], past, oneshot)
        if cache is not None:
            cache["conv"] = new_past
        return linear(c * y, L["out_proj"])

    def block(self, L, x, pos, cache, chunked, chunk):
        xn = rmsnorm(x, L["attn_norm"], self.eps)
        if L["kind"] == "C":
            h = self.shortconv(L, xn, cache, oneshot=chunked)
        else:
            h = self.attention(L, xn, pos, cache, rope="neox", qk_norm=True)
        x = x + h
        return x + self.ffn(L, rmsnorm(x, L["ffn_norm"], self.eps))


class Lfm2MoeRef(Lfm2Ref):
    """lfm2 (the same mixers, norms and RoPE) whose layers il >= leading_dense_block_count have a
    MoE FFN instead of the dense SwiGLU (llama.cpp lfm2's graph, which lfm2moe shares):
      p = sigmoid (expert_gating_func 2) or softmax (1) of ffn_gate_inp xn; top-k of p + exp_probs_b;
      w = p of the chosen / max(sum, 2^-14) (norm_w is always true); NO expert_weights_scale (the
      loader reads no such key for lfm2moe, so the graph's 0 means none); SwiGLU experts of
      expert_feed_forward_length; no shared expert."""

    arch = "lfm2moe"

    def __init__(self, path):
        r = GGUFReader(path)
        a = self.arch
        self.n_expert = int(_key(r, a, "expert_count"))
        self.n_expert_used = int(_key(r, a, "expert_used_count"))
        self.n_ff_exp = int(_key(r, a, "expert_feed_forward_length"))
        self.dense_lead = int(_key(r, a, "leading_dense_block_count", 0, False))
        gating = int(_key(r, a, "expert_gating_func"))
        if gating not in (1, 2):
            raise ValueError("lfm2moe: expert_gating_func %d not modelled (1 softmax, 2 sigmoid)" % gating)
        self.gating = "softmax" if gating == 1 else "sigmoid"
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("expert_used_count %d not in 1..%d" % (self.n_expert_used, self.n_expert))
        Lfm2Ref.__init__(self, path)

    def _load_ffn(self, p, il):
        if il < self.dense_lead:
            return Lfm2Ref._load_ffn(self, p, il)
        t, D, E, Fe = self.t, self.n_embd, self.n_expert, self.n_ff_exp
        return {"gate_inp": t(p + "ffn_gate_inp.weight", (E, D)), "probs_b": t(p + "exp_probs_b.bias", (E,)),
                "gate_exps": t(p + "ffn_gate_exps.weight", (E, Fe, D)),
                "up_exps": t(p + "ffn_up_exps.weight", (E, Fe, D)),
                "down_exps": t(p + "ffn_down_exps.weight", (E, D, Fe))}

    def kinds(self):
        return "".join(L["kind"] + ("e" if "gate_inp" in L else "") for L in self.layers)

    def ffn(self, L, xn):
        if "gate_inp" not in L:
            return self.swiglu(L, xn)
        top, w = self.route_biased(L, linear(xn, L["gate_inp"]), self.gating, True, 0.0)
        return self.experts_weighted(L, xn, top, w, swiglu_expert)


# --------------------------------------------------------------------------
# falcon-h1

class FalconH1Ref(HybridRef):
    """Every layer: h = attn_norm(x); x += attention(h) + mamba2(h); x += SwiGLU(ffn_norm(x)).
    NeoX RoPE over the whole head; Falcon-H1's muP multipliers are folded into the weights by
    the converter (nothing at run time)."""

    arch = "falcon-h1"

    def __init__(self, path):
        r = self._load_common(path)
        a, n, D = self.arch, self.n_layer, self.n_embd
        self.n_head = int(_key(r, a, "attention.head_count"))
        # a scalar in the converter's files; a per-layer array (all equal) is read the same way
        hkv = sorted(set(_per_layer(_key(r, a, "attention.head_count_kv"), n, "attention.head_count_kv")))
        if len(hkv) != 1 or hkv[0] <= 0:
            raise ValueError("falcon-h1: attention.head_count_kv must be one positive value, got %r" % hkv)
        self.n_head_kv = hkv[0]
        self.head_dim = int(_key(r, a, "attention.key_length", D // self.n_head, False))
        self.rope_theta = float(_key(r, a, "rope.freq_base", 10000.0, False))
        self.n_rot = int(_key(r, a, "rope.dimension_count", self.head_dim, False))
        self.attn_scale = float(_key(r, a, "attention.scale", 0.0, False)) or 1.0 / math.sqrt(self.head_dim)
        self.n_ff = int(_key(r, a, "feed_forward_length"))
        self._load_mamba2_hparams(r)
        t, F = self.t, self.n_ff
        self.layers = []
        for il in range(n):
            p = "blk.%d." % il
            L = self._load_mamba2(p)
            L.update(self._load_attention(p, self.n_head_kv))
            L.update({"kind": "P", "attn_norm": t(p + "attn_norm.weight", (D,)),
                      "ffn_norm": t(p + "ffn_norm", (D,)),     # falcon-h1's name: no .weight
                      "gate": t(p + "ffn_gate.weight", (F, D)), "up": t(p + "ffn_up.weight", (F, D)),
                      "down": t(p + "ffn_down.weight", (D, F))})
            self.layers.append(L)

    def block(self, L, x, pos, cache, chunked, chunk):
        h = rmsnorm(x, L["attn_norm"], self.eps)
        a = self.attention(L, h, pos, cache, rope="neox", scale=self.attn_scale)
        s = self.mamba2(L, h, cache, chunked, chunk)
        x = x + a + s
        return x + self.swiglu(L, rmsnorm(x, L["ffn_norm"], self.eps))


# --------------------------------------------------------------------------
# jamba

class JambaRef(HybridRef):
    """Mamba-1 layers (head_count_kv 0) and attention layers without RoPE; each layer's FFN dense
    or, where ffn_gate_inp exists, a MoE whose top-k softmax weights are NOT renormalised."""

    arch = "jamba"

    def __init__(self, path):
        r = self._load_common(path)
        a, n, D = self.arch, self.n_layer, self.n_embd
        self.n_head = int(_key(r, a, "attention.head_count"))
        self.head_dim = D // self.n_head
        hkv = _per_layer(_key(r, a, "attention.head_count_kv"), n, "attention.head_count_kv")
        self.conv_k = int(_key(r, a, "ssm.conv_kernel"))
        self.d_inner = int(_key(r, a, "ssm.inner_size"))
        self.d_state = int(_key(r, a, "ssm.state_size"))
        self.dt_rank = int(_key(r, a, "ssm.time_step_rank"))
        self.n_ff = int(_key(r, a, "feed_forward_length"))
        self.n_expert = int(_key(r, a, "expert_count", 0, False))
        self.n_expert_used = int(_key(r, a, "expert_used_count", 0, False))
        if self.d_inner != 2 * D:
            raise ValueError("jamba: ssm.inner_size %d != 2 * n_embd (llama.cpp asserts it)" % self.d_inner)
        t, F, E = self.t, self.n_ff, self.n_expert
        di, N, R, K = self.d_inner, self.d_state, self.dt_rank, self.conv_k
        self.layers = []
        for il in range(n):
            p = "blk.%d." % il
            if hkv[il] == 0:
                L = {"kind": "M", "ssm_in": t(p + "ssm_in.weight", (2 * di, D)),
                     "conv": t(p + "ssm_conv1d.weight", (di, K)), "conv_b": t(p + "ssm_conv1d.bias", (di,)),
                     "ssm_x": t(p + "ssm_x.weight", (R + 2 * N, di)),
                     "dt_norm": t(p + "ssm_dt_norm.weight", (R,)),
                     "b_norm": t(p + "ssm_b_norm.weight", (N,)), "c_norm": t(p + "ssm_c_norm.weight", (N,)),
                     "dt_w": t(p + "ssm_dt.weight", (di, R)), "dt_b": t(p + "ssm_dt.bias", (di,)),
                     "A": t(p + "ssm_a", (di, N)), "D": t(p + "ssm_d", (di,)),
                     "ssm_out": t(p + "ssm_out.weight", (D, di))}
            else:
                L = self._load_attention(p, hkv[il])
                L["kind"] = "A"
            L["attn_norm"] = t(p + "attn_norm.weight", (D,))
            L["ffn_norm"] = t(p + "ffn_norm.weight", (D,))
            if p + "ffn_gate_inp.weight" in r.tensors:
                L.update({"gate_inp": t(p + "ffn_gate_inp.weight", (E, D)),
                          "gate_exps": t(p + "ffn_gate_exps.weight", (E, F, D)),
                          "up_exps": t(p + "ffn_up_exps.weight", (E, F, D)),
                          "down_exps": t(p + "ffn_down_exps.weight", (E, D, F))})
                L["kind"] += "e"
            else:
                L.update({"gate": t(p + "ffn_gate.weight", (F, D)), "up": t(p + "ffn_up.weight", (F, D)),
                          "down": t(p + "ffn_down.weight", (D, F))})
            self.layers.append(L)

    def mamba1(self, L, x, cache, chunked, chunk):
        """llama.cpp build_mamba_layer (Jamba: RMSNorms on dt, B, C before the dt projection)."""
        T = x.shape[0]
        di, N, R, K = self.d_inner, self.d_state, self.dt_rank, self.conv_k
        xz = linear(x, L["ssm_in"])
        xs, z = xz[:, :di], xz[:, di:]
        past = cache["conv"] if cache is not None and "conv" in cache else np.zeros((K - 1, di))
        xs, new_past = conv1d(xs, L["conv"], past, oneshot=chunked)
        xs = silu(xs + L["conv_b"])
        xdb = linear(xs, L["ssm_x"])
        dt, B, C = xdb[:, :R], xdb[:, R:R + N], xdb[:, R + N:]
        dt = rmsnorm(dt, L["dt_norm"], self.eps)
        B = rmsnorm(B, L["b_norm"], self.eps)
        C = rmsnorm(C, L["c_norm"], self.eps)
        dt = softplus(linear(dt, L["dt_w"]) + L["dt_b"])
        S0 = cache.get("ssm") if cache is not None else None
        if chunked:
            y, S = selective_scan_mamba1_chunked(xs, dt, L["A"], B, C, S0, chunk)
        else:
            y, S = selective_scan_mamba1(xs, dt, L["A"], B, C, S0)
        if cache is not None:
            cache["conv"], cache["ssm"] = new_past, S
        y = (y + xs * L["D"]) * silu(z)
        return linear(y, L["ssm_out"])

    def block(self, L, x, pos, cache, chunked, chunk):
        h = rmsnorm(x, L["attn_norm"], self.eps)
        if L["kind"].startswith("M"):
            h = self.mamba1(L, h, cache, chunked, chunk)
        else:
            h = self.attention(L, h, pos, cache, rope=None)
        x = x + h
        xn = rmsnorm(x, L["ffn_norm"], self.eps)
        f = self.experts(L, xn, renorm=False) if "gate_inp" in L else self.swiglu(L, xn)
        return x + f


# --------------------------------------------------------------------------
# kimi-linear

class KimiLinearRef(HybridRef):
    """KDA layers (head_count_kv 0) and MLA layers without RoPE; leading dense SwiGLU blocks, then
    MoE: p = sigmoid(router x), top-k by p + exp_probs_b, weights p renormalised over the k and
    times expert_weights_scale, plus an ungated shared expert. chunked=True also switches MLA to
    its absorbed form (expanded otherwise)."""

    arch = "kimi-linear"

    def __init__(self, path):
        import mla_ref
        self._mla = mla_ref
        r = self._load_common(path)
        a, n, D = self.arch, self.n_layer, self.n_embd
        H = self.n_head = int(_key(r, a, "attention.head_count"))
        hkv = _per_layer(_key(r, a, "attention.head_count_kv"), n, "attention.head_count_kv")
        self.conv_k = int(_key(r, a, "ssm.conv_kernel"))
        hk = self.kda_head_dim = int(_key(r, a, "kda.head_dim"))
        R = self.kv_lora = int(_key(r, a, "attention.kv_lora_rank"))
        ql = self.q_lora = int(_key(r, a, "attention.q_lora_rank", 0, False))
        dr = self.mla_rope = int(_key(r, a, "rope.dimension_count"))
        dqk = int(_key(r, a, "attention.key_length_mla"))
        dv = self.mla_vdim = int(_key(r, a, "attention.value_length_mla"))
        dn = self.mla_nope = dqk - dr
        self.mla_scale = 1.0 / math.sqrt(dqk)
        self.n_ff = int(_key(r, a, "feed_forward_length"))
        E = self.n_expert = int(_key(r, a, "expert_count"))
        self.n_expert_used = int(_key(r, a, "expert_used_count"))
        Fe = self.n_ff_exp = int(_key(r, a, "expert_feed_forward_length"))
        self.n_shared = int(_key(r, a, "expert_shared_count"))
        self.dense_lead = int(_key(r, a, "leading_dense_block_count", 0, False))
        self.w_scale = float(_key(r, a, "expert_weights_scale", 0.0, False))
        gating = int(_key(r, a, "expert_gating_func"))
        if gating not in (1, 2):
            raise ValueError("expert_gating_func %d (1 softmax, 2 sigmoid)" % gating)
        self.gating = "softmax" if gating == 1 else "sigmoid"
        t, F, di = self.t, self.n_ff, hk * H
        Fs = Fe * max(self.n_shared, 1)
        K = self.conv_k
        self.layers = []
        for il in range(n):
            p = "blk.%d." % il
            if hkv[il] == 0:
                L = {"kind": "K", "wq": t(p + "attn_q.weight", (di, D)), "wk": t(p + "attn_k.weight", (di, D)),
                     "wv": t(p + "attn_v.weight", (di, D)),
                     "f_a": t(p + "ssm_f_a.weight", (hk, D)), "f_b": t(p + "ssm_f_b.weight", (di, hk)),
                     "beta": t(p + "ssm_beta.weight", (H, D)), "dt_b": t(p + "ssm_dt.bias", (di,)),
                     "g_a": t(p + "ssm_g_a.weight", (hk, D)), "g_b": t(p + "ssm_g_b.weight", (di, hk)),
                     "o_norm": t(p + "ssm_norm.weight", (hk,)), "wo": t(p + "attn_output.weight", (D, di))}
                A = r.tensor(p + "ssm_a")
                if A.size != H:
                    raise ValueError("%sssm_a has %d values, expected %d" % (p, A.size, H))
                L["A"] = A.reshape(H)
                for c in "qkv":
                    w = r.tensor(p + "ssm_conv1d_%s.weight" % c)          # ne {K, 1, di, 1} or {K, 1, di}
                    if w.size != K * di or r.tensors[p + "ssm_conv1d_%s.weight" % c].ne[0] != K:
                        raise ValueError("%sssm_conv1d_%s.weight ne %s" % (p, c, r.tensors[p + "ssm_conv1d_%s.weight" % c].ne))
                    L["conv_" + c] = np.asarray(w).reshape(di, K)
            else:
                L = {"kind": "M", "n_head_kv": hkv[il]}
                if ql:
                    L.update({"wq_a": t(p + "attn_q_a.weight", (ql, D)), "q_a_norm": t(p + "attn_q_a_norm.weight", (ql,)),
                              "wq_b": t(p + "attn_q_b.weight", (H * dqk, ql))})
                else:
                    L["wq"] = t(p + "attn_q.weight", (H * dqk, D))
                L.update({"wkv_a": t(p + "attn_kv_a_mqa.weight", (R + dr, D)),
                          "kv_a_norm": t(p + "attn_kv_a_norm.weight", (R,)),
                          "wk_b": t(p + "attn_k_b.weight", (H, R, dn)), "wv_b": t(p + "attn_v_b.weight", (H, dv, R)),
                          "wo": t(p + "attn_output.weight", (D, H * dv))})
            L["attn_norm"] = t(p + "attn_norm.weight", (D,))
            L["ffn_norm"] = t(p + "ffn_norm.weight", (D,))
            if il < self.dense_lead:
                L.update({"gate": t(p + "ffn_gate.weight", (F, D)), "up": t(p + "ffn_up.weight", (F, D)),
                          "down": t(p + "ffn_down.weight", (D, F))})
            else:
                L.update({"gate_inp": t(p + "ffn_gate_inp.weight", (E, D)),
                          "gate_exps": t(p + "ffn_gate_exps.weight", (E, Fe, D)),
                          "up_exps": t(p + "ffn_up_exps.weight", (E, Fe, D)),
                          "down_exps": t(p + "ffn_down_exps.weight", (E, D, Fe)),
                          "probs_b": t(p + "exp_probs_b.bias", (E,))})
                if p + "ffn_gate_shexp.weight" in r.tensors:
                    L.update({"gate_shexp": t(p + "ffn_gate_shexp.weight", (Fs, D)),
                              "up_shexp": t(p + "ffn_up_shexp.weight", (Fs, D)),
                              "down_shexp": t(p + "ffn_down_shexp.weight", (D, Fs))})
            self.layers.append(L)

    def kda(self, L, x, cache, chunked, chunk):
        T = x.shape[0]
        H, hk, K = self.n_head, self.kda_head_dim, self.conv_k
        di = H * hk
        qkv = {}
        for c in "qkv":
            key = "conv_" + c
            past = cache[key] if cache is not None and key in cache else np.zeros((K - 1, di))
            y, new_past = conv1d(linear(x, L["w" + c]), L[key], past, oneshot=chunked)
            if cache is not None:
                cache[key] = new_past
            qkv[c] = silu(y).reshape(T, H, hk)                  # no conv bias
        q = models_ref_l2norm(qkv["q"], self.eps) / math.sqrt(hk)
        k = models_ref_l2norm(qkv["k"], self.eps)
        v = qkv["v"]
        g = (L["A"][None, :, None] * softplus(linear(linear(x, L["f_a"]), L["f_b"]) + L["dt_b"]).reshape(T, H, hk))
        beta = sigmoid(linear(x, L["beta"]))                    # [T, H]
        S0 = cache.get("S") if cache is not None else None
        if chunked:
            o, S = kda_chunked(q, k, v, g, beta, S0, chunk)
        else:
            o, S = kda_recurrent(q, k, v, g, beta, S0)
        if cache is not None:
            cache["S"] = S
        gate = sigmoid(linear(linear(x, L["g_a"]), L["g_b"])).reshape(T, H, hk)
        o = rmsnorm(o, L["o_norm"], self.eps) * gate            # norm per head, then the SIGMOID gate
        return linear(o.reshape(T, di), L["wo"])

    def mla(self, L, x, cache, chunked):
        T = x.shape[0]
        H, R, dn, dr, dv = self.n_head, self.kv_lora, self.mla_nope, self.mla_rope, self.mla_vdim
        if "wq" in L:
            q = linear(x, L["wq"])
        else:
            q = linear(rmsnorm(linear(x, L["wq_a"]), L["q_a_norm"], self.eps), L["wq_b"])
        q = q.reshape(T, H, dn + dr)
        q_nope, q_pe = q[:, :, :dn], q[:, :, dn:]               # no RoPE anywhere (Kimi MLA)
        kv = linear(x, L["wkv_a"])
        c = rmsnorm(kv[:, :R], L["kv_a_norm"], self.eps)
        k_pe = kv[:, R:]
        P = 0
        if cache is not None:
            if "c" in cache:
                P = cache["c"].shape[0]
                c = np.concatenate([cache["c"], c])
                k_pe = np.concatenate([cache["k_pe"], k_pe])
            cache["c"], cache["k_pe"] = c, k_pe
        attend = self._mla.ATTEND["absorbed" if chunked else "expanded"]
        out = attend(q_nope, q_pe, c, k_pe, L["wk_b"], L["wv_b"], self.mla_scale, P)
        return linear(out.reshape(T, H * dv), L["wo"])

    def moe(self, L, x):
        # the bias picks, it does not weigh; weights renormalised over the k, times the scale
        top, w = self.route_biased(L, linear(x, L["gate_inp"]), self.gating, True, self.w_scale)
        out = self.experts_weighted(L, x, top, w, swiglu_expert)
        if "gate_shexp" in L:
            out = out + self.swiglu(L, x, "_shexp")
        return out

    def block(self, L, x, pos, cache, chunked, chunk):
        h = rmsnorm(x, L["attn_norm"], self.eps)
        h = self.kda(L, h, cache, chunked, chunk) if L["kind"] == "K" else self.mla(L, h, cache, chunked)
        x = x + h
        xn = rmsnorm(x, L["ffn_norm"], self.eps)
        return x + (self.moe(L, xn) if "gate_inp" in L else self.swiglu(L, xn))


def models_ref_l2norm(x, eps):
    """ggml_l2_norm: x / max(||x||, eps) over the last axis."""
    return x / np.maximum(np.sqrt(np.sum(x * x, axis=-1, keepdims=True)), eps)


# --------------------------------------------------------------------------

CLASSES = {"qwen35moe": Qwen35MoeRef, "granitehybrid": GraniteHybridRef, "nemotron_h": NemotronHRef,
           "nemotron_h_moe": NemotronHMoeRef, "lfm2": Lfm2Ref, "lfm2moe": Lfm2MoeRef, "falcon-h1": FalconH1Ref,
           "jamba": JambaRef, "kimi-linear": KimiLinearRef}


def load_model(path):
    """The reference model for a GGUF file: the hybrid architectures here, else models_ref's."""
    arch = GGUFReader(path).get("general.architecture")
    if arch in CLASSES:
        return CLASSES[arch](path)
    return models_ref.load_model(path)


# --------------------------------------------------------------------------
# self-tests

def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def self_test_ssd(verbose=False):
    """Chunked SSD vs recurrence over shapes, chunk sizes (incl. T not a multiple, T < chunk, chunk 1)
    and a non-zero initial state; state after the sequence compared too."""
    rng = np.random.default_rng(77)
    worst = 0.0
    for (T, H, P, N, Q, with_state) in [(1, 1, 2, 3, 8, False), (20, 4, 4, 8, 8, False), (20, 4, 4, 8, 8, True),
                                        (37, 6, 3, 5, 8, True), (64, 2, 8, 16, 64, True), (150, 8, 16, 16, 64, True),
                                        (9, 3, 2, 4, 1, True), (33, 2, 5, 7, 16, False)]:
        x = rng.standard_normal((T, H, P))
        dt = softplus(rng.standard_normal((T, H)) - 1.0)
        A = -np.exp(rng.uniform(-2.0, 1.0, H))
        B = rng.standard_normal((T, H, N))
        C = rng.standard_normal((T, H, N))
        S0 = rng.standard_normal((H, P, N)) if with_state else None
        y1, S1 = ssd_recurrent(x, dt, A, B, C, S0)
        y2, S2 = ssd_chunked(x, dt, A, B, C, S0, Q)
        e = max(rel(y2, y1), rel(S2, S1))
        if verbose:
            print("  ssd T=%d H=%d P=%d N=%d chunk=%d state=%s: rel err %.3e" % (T, H, P, N, Q, with_state, e))
        worst = max(worst, e)
    for (T, H, dk, dv, Q, with_state) in [(20, 2, 8, 8, 8, False), (37, 3, 6, 5, 8, True), (130, 2, 16, 16, 64, True)]:
        q = models_ref_l2norm(rng.standard_normal((T, H, dk)), 1e-6) / math.sqrt(dk)
        k = models_ref_l2norm(rng.standard_normal((T, H, dk)), 1e-6)
        v = rng.standard_normal((T, H, dv))
        g = -np.exp(rng.uniform(-1, 0.5, (T, H, dk))) * softplus(rng.standard_normal((T, H, dk)))
        beta = sigmoid(rng.standard_normal((T, H)))
        S0 = rng.standard_normal((H, dk, dv)) if with_state else None
        o1, S1 = kda_recurrent(q, k, v, g, beta, S0)
        o2, S2 = kda_chunked(q, k, v, g, beta, S0, Q)
        e = max(rel(o2, o1), rel(S2, S1))
        if verbose:
            print("  kda T=%d H=%d dk=%d dv=%d chunk=%d state=%s: rel err %.3e" % (T, H, dk, dv, Q, with_state, e))
        worst = max(worst, e)
    for (T, Di, N, Q) in [(20, 6, 4, 8), (45, 5, 3, 16)]:
        x = rng.standard_normal((T, Di))
        dt = softplus(rng.standard_normal((T, Di)) - 1.0)
        A = -np.exp(rng.uniform(-2.0, 1.0, (Di, N)))
        B, C = rng.standard_normal((T, N)), rng.standard_normal((T, N))
        S0 = rng.standard_normal((Di, N))
        y1, S1 = selective_scan_mamba1(x, dt, A, B, C, S0)
        y2, S2 = selective_scan_mamba1_chunked(x, dt, A, B, C, S0, Q)
        e = max(rel(y2, y1), rel(S2, S1))
        if verbose:
            print("  mamba1 T=%d Di=%d N=%d chunk=%d: rel err %.3e" % (T, Di, N, Q, e))
        worst = max(worst, e)
    return worst


def self_test_conv(verbose=False):
    rng = np.random.default_rng(78)
    worst = 0.0
    for (T, C, K) in [(1, 3, 3), (20, 8, 3), (37, 5, 4), (150, 16, 4), (2, 4, 4)]:
        x = rng.standard_normal((T, C))
        w = rng.standard_normal((C, K))
        past = rng.standard_normal((K - 1, C))
        o1, p1 = conv1d_oneshot(x, w, past)
        o2, p2 = conv1d_step(x, w, past)
        # explicit definition: out[t][c] = sum_j w[c][j] * x_{t-K+1+j}[c], x_{<0} from past
        xp = np.concatenate([past, x])
        o3 = np.array([[sum(w[c, j] * xp[t + j, c] for j in range(K)) for c in range(C)] for t in range(T)])
        e = max(rel(o1, o3), rel(o2, o3), rel(p1, p2))
        if verbose:
            print("  conv T=%d C=%d K=%d: rel err %.3e" % (T, C, K, e))
        worst = max(worst, e)
    return worst


def self_test_models(verbose=False, tmpdir=None):
    """For each architecture: a small file from make_hybrid_model.py; chunked vs recurrent forward
    (chunk 8, 20 tokens) and segmented decode vs the one-shot forward."""
    import make_hybrid_model
    own = tmpdir is None
    tmpdir = tmpdir or tempfile.mkdtemp(prefix="hybrid_ref.")
    worst = 0.0
    rng = np.random.default_rng(5)
    toks = [int(v) for v in rng.integers(0, 256, 20)]
    specs = [("qwen35moe", []), ("granitehybrid", []),
             ("granitehybrid", ["--experts", "4", "--experts-used", "2", "--expert-ff", "32", "--shared-ff", "48",
                                "--rope"]),
             ("nemotron_h", []), ("lfm2", []), ("falcon-h1", []), ("falcon-h1", ["--no-ssm-norm"]),
             ("jamba", []), ("kimi-linear", []), ("kimi-linear", ["--q-lora", "24", "--dense-lead", "2"]),
             ("nemotron_h_moe", []), ("nemotron_h_moe", ["--latent", "0", "--no-norm-w"]),
             ("lfm2moe", []), ("lfm2moe", ["--dense-lead", "0", "--gating-func", "1"])]
    try:
        for i, (arch, extra) in enumerate(specs):
            path = os.path.join(tmpdir, "selftest_%d_%s.gguf" % (i, arch))
            make_hybrid_model.main(["-o", path, "--arch", arch, "--seed", str(40 + i)] + extra)
            m = load_model(path)
            a = m.forward(toks)
            b = m.forward(toks, chunked=True, chunk=8)
            c = m.forward_segments(toks, [1] * len(toks))
            d = m.forward_segments(toks, [3, 1, 9, 1, 6], chunked=True, chunk=8)
            e = max(rel(b, a), rel(c, a), rel(d, a))
            if verbose:
                print("  model %s %s (%s): chunked/segmented vs recurrent rel err %.3e" % (
                    arch, " ".join(extra), m.kinds(), e))
            worst = max(worst, e)
    finally:
        if own:
            import shutil
            shutil.rmtree(tmpdir, ignore_errors=True)
    return worst


NOTES = """Where llama.cpp's runtime and the papers / HF differ (the reference follows llama.cpp):
- Mamba-2 (granitehybrid, nemotron_h, falcon-h1): the gated RMSNorm is applied to y * silu(z)
  (gate first, then norm; HF's norm_before_gate=False agrees), grouped over n_group chunks of
  d_inner / n_group, eps = layer_norm_rms_epsilon. softplus(dt + dt_bias) with ggml's threshold
  (x > 20 -> x); no dt clamp (HF's time_step_limit is (0, inf) by default). The paper's D x skip
  is added before the gate. B / C of group g serve heads g*(nh/ng) .. (g+1)*(nh/ng)-1.
- qwen35moe: value head h pairs with key head h % n_k (the converter reordered the value heads
  into tiled order), not h // r as in HF's repeat_interleave.
- granitehybrid: rope.scaling.finetuned is a RoPE on/off switch (default true in the loader,
  written false by the converter for any model with a Mamba layer: NoPE attention); logits are
  DIVIDED by logit_scale; residual_scale multiplies both branch outputs; embedding_scale
  multiplies the embedding rows; the MoE expert size is feed_forward_length; the shared
  expert is added without a gate.
- nemotron_h: the layer kind comes from head_count_kv[il] and feed_forward_length[il] (both 0:
  Mamba-2; ff 0: attention; else MLP); attention has no positional encoding.
- nemotron_h_moe: the router is sigmoid whatever the file says (llama.cpp passes
  GATING_FUNC_SIGMOID; no expert_gating_func key is read), its logits come from the normed input
  (not the latent); exp_probs_b only chooses, the weights are the sigmoids of the chosen,
  renormalised only when expert_weights_norm is true (sum clamped below at 2^-14, f16's smallest
  normal), then times expert_weights_scale unless it is 0 or 1 (routed_scaling_factor, 2.5 in
  Nemotron-3-Nano); the experts run in the latent width and the weighted sum goes back through
  ffn_latent_up BEFORE the shared expert (which reads the un-projected normed input) is added;
  expert size expert_feed_forward_length, or feed_forward_length[il] / expert_used_count;
  expert_group_count > 1 (grouped top-k) is refused here, the converter writes n_group = 1.
- lfm2: the final norm is the tensor token_embd_norm.weight; in_proj's rows are [B | C | x];
  the conv has no bias and no activation; output = C * conv(B * x).
- lfm2moe: llama.cpp's lfm2moe graph is lfm2's; its MoE passes norm_w = true and
  hparams.expert_weights_scale, which lfm2moe's loader never reads (so 0: no scaling, even if a
  file carried the key); the gating is whatever expert_gating_func says (the converter writes 2,
  sigmoid); the layers before leading_dense_block_count keep the dense SwiGLU of
  feed_forward_length.
- falcon-h1: the muP multipliers (embedding, lm_head, attention in/out, key, ssm in/out, the
  five zxbcdt ones, mlp) are folded into the weights by the converter, so the runtime has none;
  ssm_norm is optional (mamba_rms_norm); the loader asks for the FFN norm as tn(FFN_NORM, il)
  without a ".weight" suffix while the converter writes blk.N.ffn_norm.weight (the file has the
  converter's name).
- jamba: the MoE weights are the softmax probabilities of the chosen experts, NOT renormalised;
  Mamba-1's dt, B and C go through RMSNorms (ssm_dt_norm / ssm_b_norm / ssm_c_norm) before
  dt's projection.
- kimi-linear: the KDA output gate is a SIGMOID (norm first, then gate), not FusedRMSNormGated's
  default swish; q and k are l2-normed (eps = rms eps) and q scaled by 1/sqrt(head_dim); the
  MLA layers apply NO RoPE although rope.dimension_count (qk_rope_head_dim) is written;
  head_count_kv is 1 on MLA layers (MQA for the latent cache) and 0 on KDA layers. The MoE picks
  the top-k of sigmoid(logits) + exp_probs_b but weighs with sigmoid(logits), renormalised over
  the k and times expert_weights_scale; the shared expert is not gated. llama.cpp's legacy
  path for files with an unsplit attn_kv_b concatenates the key as [k_pe | k_nope] against a
  query laid out [q_nope | q_pe] (looks inconsistent); the reference follows the attn_k_b /
  attn_v_b path the converter writes.
- qwen35moe: files converted before the converter's tiled value-head reorder carry HF's grouped
  order (value head h uses key head h // r), which llama.cpp's early qwen35moe graph read with an
  interleaved repeat; current converter + runtime: tiled (h % n_k), as here.
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 reference forward of llama.cpp hybrid architectures")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--all", action="store_true", help="logits for every position (the default)")
    ap.add_argument("--last", action="store_true", help="only the last position's logits")
    ap.add_argument("--chunked", action="store_true", help="chunked SSD / one-shot conv / chunked DeltaNet forms")
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--notes", action="store_true", help="print where llama.cpp and the papers differ")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.notes:
        print(NOTES)
        return 0
    if args.self_test:
        e1 = self_test_ssd(args.verbose)
        e2 = self_test_conv(args.verbose)
        e3 = self_test_models(args.verbose)
        ok = max(e1, e2, e3) < 1e-10
        print("ssd chunked vs recurrent %.3e, conv one-shot vs step %.3e, models chunked/segmented vs "
              "recurrent %.3e: %s" % (e1, e2, e3, "ok" if ok else "FAIL"))
        return 0 if ok else 1
    if not args.model or args.tokens is None:
        ap.error("MODEL and --tokens are required")
    tokens = [int(s) for s in args.tokens.split(",") if s.strip()]
    m = load_model(args.model)
    if isinstance(m, (HybridRef, Qwen35Ref)):
        logits = m.forward(tokens, chunked=args.chunked, chunk=args.chunk)
    else:
        logits = m.forward(tokens)
    rows = logits[-1:] if args.last else logits
    json.dump({"tokens": tokens, "logits": [[float(v) for v in row] for row in rows]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

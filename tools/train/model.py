"""model.py - the qwen35 hybrid model in PyTorch, parameterised like the GGUF file.

Owns: the forward pass of docs/models.md sections 1.2-1.6 (Qwen3.5 dense
layout, text only) for training and evaluation: Gated DeltaNet layers
(causal depthwise conv + SiLU, l2-normed q/k, gated delta rule in its chunked
WY form 1.4(g), gated RMSNorm, output projection), gated softmax attention
layers (per-head q/k RMSNorm, partial NeoX RoPE, GQA, sigmoid output gate
from attn_q's second half), SwiGLU FFN, tied embeddings; the recurrent form
1.4(f) as the check of the chunked one.
Does not: tokenize, read or write files (export.py), cache across calls.

Parameters are stored in the engine's convention so export is a copy:
every weight is [out, in] (GGUF ne = {in, out}); RMSNorm weights are the
final multipliers (plain x_hat * w, initialised to 1; nothing is added when
loading or saving); the DeltaNet decay is kept as A_log and exported as
ssm_a = -exp(A_log); n_v = n_k, so the qwen35 tiled value-head order is the
identity.
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 4096
    n_embd: int = 256
    n_layer: int = 8
    attn_interval: int = 4      # layer il is attention iff (il + 1) % attn_interval == 0
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 16             # rotary dims (partial RoPE, NeoX pairing)
    rope_theta: float = 10000.0
    ssm_n_k: int = 4            # DeltaNet key heads (= value heads)
    ssm_d_k: int = 64           # DeltaNet key / value head dim
    conv_k: int = 4
    n_ff: int = 768
    eps: float = 1e-6
    chunk: int = 64             # delta-rule chunk length
    n_ctx: int = 2048           # written as context_length

    def is_attn(self, il):
        return (il + 1) % self.attn_interval == 0

    def dict(self):
        return asdict(self)


# --------------------------------------------------------------------------
# elementary ops

def rmsnorm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def l2norm(x, eps):
    """llama.cpp ggml_l2_norm: x / max(||x||, eps) over the last axis."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def rope_neox(x, n_rot, theta):
    """x [B, T, H, D]: pairs (i, i + n_rot/2), i < n_rot/2, rotated by
    pos * theta^(-2i/n_rot) with pos = 0..T-1; dims >= n_rot pass through."""
    T = x.shape[1]
    half = n_rot // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / n_rot)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # [T, half]
    cos = torch.cos(ang).to(x.dtype)[None, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[None, :, None, :]
    x1, x2, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


# --------------------------------------------------------------------------
# gated delta rule

def delta_rule_recurrent(q, k, v, g, beta):
    """Token by token (1.4(f)). q, k [B, T, H, dk]; v [B, T, H, dv]; g, beta [B, T, H].
    Returns o [B, T, H, dv]. State S[b, h] is dk x dv."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    S = q.new_zeros(B, H, dk, dv)
    out = []
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None, None]                   # S = S * exp(g)
        kv = torch.einsum("bhij,bhi->bhj", S, k[:, t])                # S^T k
        d = beta[:, t][..., None] * (v[:, t] - kv)                    # beta (v - S^T k)
        S = S + k[:, t][..., :, None] * d[..., None, :]               # S += k d^T
        out.append(torch.einsum("bhij,bhi->bhj", S, q[:, t]))         # o = S^T q
    return torch.stack(out, dim=1)


def delta_rule_chunked(q, k, v, g, beta, chunk=64):
    """Chunked WY / UT form (1.4(g)), same signature and result as the recurrent form."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    C = chunk
    pad = (-T) % C
    # [B, H, T, *], zero-padded to a multiple of C (g = beta = k = 0 leave S alone)
    q, k, v = (F.pad(x.transpose(1, 2), (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x.transpose(1, 2), (0, pad)) for x in (g, beta))
    N = (T + pad) // C
    q, k, v = (x.reshape(B, H, N, C, -1) for x in (q, k, v))
    g, beta = (x.reshape(B, H, N, C) for x in (g, beta))

    kb = k * beta[..., None]                                          # k * beta
    vb = v * beta[..., None]                                          # v * beta
    G = g.cumsum(-1)                                                  # G[i] = g[0] + .. + g[i]
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    diff = G[..., :, None] - G[..., None, :]
    D = torch.exp(torch.where(lower, diff, torch.full_like(diff, -math.inf)))  # decay mask, 0 above
    L = (kb @ k.transpose(-1, -2) * D).tril(-1)                       # strictly lower
    eye = torch.eye(C, dtype=q.dtype).expand(B, H, N, C, C)
    Tm = torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True)  # (I + L)^-1
    U = Tm @ vb                                                       # pseudo-values [.., C, dv]
    W = Tm @ (kb * torch.exp(G)[..., None])                           # k_cumdecay [.., C, dk]
    Aqk = q @ k.transpose(-1, -2) * D                                 # lower incl. diagonal
    qg = q * torch.exp(G)[..., None]
    kd = k * torch.exp(G[..., -1:] - G)[..., None]
    dlast = torch.exp(G[..., -1])                                     # [B, H, N]

    S = q.new_zeros(B, H, dk, dv)
    outs = []
    for n in range(N):
        Vnew = U[:, :, n] - W[:, :, n] @ S                            # [B, H, C, dv]
        outs.append(qg[:, :, n] @ S + Aqk[:, :, n] @ Vnew)
        S = S * dlast[:, :, n][..., None, None] + kd[:, :, n].transpose(-1, -2) @ Vnew
    o = torch.stack(outs, dim=2).reshape(B, H, N * C, dv)[:, :, :T]
    return o.transpose(1, 2)


# --------------------------------------------------------------------------
# layers

class DeltaNet(nn.Module):
    """Gated DeltaNet mixer (1.4), qwen35 split projections."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        nk, dk = c.ssm_n_k, c.ssm_d_k
        key_dim = value_dim = nk * dk
        conv_dim = 2 * key_dim + value_dim
        D = c.n_embd
        self.qkv = nn.Parameter(torch.empty(conv_dim, D))            # attn_qkv  rows [q | k | v]
        self.z = nn.Parameter(torch.empty(value_dim, D))             # attn_gate
        self.b = nn.Parameter(torch.empty(nk, D))                    # ssm_beta
        self.a = nn.Parameter(torch.empty(nk, D))                    # ssm_alpha
        self.conv = nn.Parameter(torch.empty(conv_dim, c.conv_k))    # ssm_conv1d ne {K, conv_dim}
        self.dt_bias = nn.Parameter(torch.empty(nk))                 # ssm_dt.bias
        self.A_log = nn.Parameter(torch.empty(nk))                   # ssm_a = -exp(A_log)
        self.norm = nn.Parameter(torch.ones(dk))                     # ssm_norm (final multiplier)
        self.out = nn.Parameter(torch.empty(D, value_dim))           # ssm_out

    def forward(self, x, recurrent=False):
        c = self.c
        B, T, _ = x.shape
        nk, dk, K = c.ssm_n_k, c.ssm_d_k, c.conv_k
        kd = nk * dk
        mixed = x @ self.qkv.t()                                      # [B, T, conv_dim]
        z = (x @ self.z.t()).view(B, T, nk, dk)
        b = x @ self.b.t()
        a = x @ self.a.t()
        # causal depthwise conv: u_t[c] = silu(sum_j w[c][j] x_{t-K+1+j}[c])
        u = F.conv1d(F.pad(mixed.transpose(1, 2), (K - 1, 0)), self.conv[:, None, :],
                     groups=mixed.shape[-1])
        u = F.silu(u).transpose(1, 2)
        q = u[..., :kd].reshape(B, T, nk, dk)
        k = u[..., kd:2 * kd].reshape(B, T, nk, dk)
        v = u[..., 2 * kd:].reshape(B, T, nk, dk)
        beta = torch.sigmoid(b)
        g = -torch.exp(self.A_log) * F.softplus(a + self.dt_bias)     # log-decay <= 0
        q = l2norm(q, c.eps) * (1.0 / math.sqrt(dk))
        k = l2norm(k, c.eps)
        if recurrent:
            o = delta_rule_recurrent(q, k, v, g, beta)
        else:
            o = delta_rule_chunked(q, k, v, g, beta, c.chunk)
        o = rmsnorm(o, self.norm, c.eps) * F.silu(z)                  # gated RMSNorm
        return o.reshape(B, T, kd) @ self.out.t()


class Attention(nn.Module):
    """Gated softmax attention (1.5)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        D, H, Hkv, hd = c.n_embd, c.n_head, c.n_head_kv, c.head_dim
        self.wq = nn.Parameter(torch.empty(2 * H * hd, D))            # attn_q: per head [q | gate]
        self.wk = nn.Parameter(torch.empty(Hkv * hd, D))
        self.wv = nn.Parameter(torch.empty(Hkv * hd, D))
        self.wo = nn.Parameter(torch.empty(D, H * hd))
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))

    def forward(self, x, recurrent=False):
        c = self.c
        B, T, _ = x.shape
        H, Hkv, hd = c.n_head, c.n_head_kv, c.head_dim
        qg = (x @ self.wq.t()).view(B, T, H, 2, hd)
        q, gate = qg[..., 0, :], qg[..., 1, :]
        k = (x @ self.wk.t()).view(B, T, Hkv, hd)
        v = (x @ self.wv.t()).view(B, T, Hkv, hd)
        q = rope_neox(rmsnorm(q, self.q_norm, c.eps), c.n_rot, c.rope_theta)  # norm before RoPE
        k = rope_neox(rmsnorm(k, self.k_norm, c.eps), c.n_rot, c.rope_theta)
        rep = H // Hkv                                                # GQA: head h uses kv h // rep
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, -math.inf)
        o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)
        o = o * torch.sigmoid(gate)                                   # gate before o_proj
        return o.reshape(B, T, H * hd) @ self.wo.t()


class Block(nn.Module):
    def __init__(self, c, il):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(c.n_embd))
        self.post_norm = nn.Parameter(torch.ones(c.n_embd))
        self.mixer = Attention(c) if c.is_attn(il) else DeltaNet(c)
        self.ffn_gate = nn.Parameter(torch.empty(c.n_ff, c.n_embd))
        self.ffn_up = nn.Parameter(torch.empty(c.n_ff, c.n_embd))
        self.ffn_down = nn.Parameter(torch.empty(c.n_embd, c.n_ff))
        self.eps = c.eps

    def forward(self, x, recurrent=False):
        x = x + self.mixer(rmsnorm(x, self.attn_norm, self.eps), recurrent)
        h = rmsnorm(x, self.post_norm, self.eps)
        return x + (F.silu(h @ self.ffn_gate.t()) * (h @ self.ffn_up.t())) @ self.ffn_down.t()


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Parameter(torch.empty(c.n_vocab, c.n_embd))  # tied LM head
        self.blocks = nn.ModuleList(Block(c, il) for il in range(c.n_layer))
        self.output_norm = nn.Parameter(torch.ones(c.n_embd))

    def init_weights(self, seed):
        """Seeded init: matrices N(0, 0.02), residual outputs scaled by
        1/sqrt(2 n_layer); DeltaNet A in [1, 16], dt in [0.001, 0.1] as in HF."""
        gen = torch.Generator().manual_seed(seed)
        c = self.c
        res_std = 0.02 / math.sqrt(2 * c.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf in ("attn_norm", "post_norm", "output_norm", "norm", "q_norm", "k_norm"):
                    p.fill_(1.0)
                elif leaf in ("out", "wo", "ffn_down"):
                    p.normal_(0.0, res_std, generator=gen)
                elif leaf == "conv":
                    p.uniform_(-1.0 / math.sqrt(c.conv_k), 1.0 / math.sqrt(c.conv_k), generator=gen)
                elif leaf == "A_log":
                    p.copy_(torch.log(torch.empty_like(p).uniform_(1.0, 16.0, generator=gen)))
                elif leaf == "dt_bias":
                    lo, hi = math.log(1e-3), math.log(0.1)
                    dt = torch.exp(torch.empty_like(p).uniform_(0, 1, generator=gen) * (hi - lo) + lo)
                    p.copy_(dt + torch.log(-torch.expm1(-dt)))        # softplus^-1(dt)
                else:
                    p.normal_(0.0, 0.02, generator=gen)

    def forward(self, tokens, recurrent=False):
        """tokens [B, T] -> logits [B, T, n_vocab]."""
        x = self.tok_embd[tokens]
        for blk in self.blocks:
            x = blk(x, recurrent)
        x = rmsnorm(x, self.output_norm, self.c.eps)
        return x @ self.tok_embd.t()

    def n_params(self):
        return sum(p.numel() for p in self.parameters())


def selftest_delta_rule():
    """Chunked vs recurrent delta rule in float64 on random inputs, incl. padding.
    Returns the max relative error."""
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    for B, T, H, dk, C in [(2, 70, 3, 8, 16), (1, 64, 2, 16, 64), (1, 5, 1, 4, 4), (2, 131, 2, 8, 64)]:
        r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
        q = l2norm(r(B, T, H, dk), 1e-6) / math.sqrt(dk)
        k = l2norm(r(B, T, H, dk), 1e-6)
        v = r(B, T, H, dk)
        g = -torch.exp(r(B, T, H) * 0.5) * F.softplus(r(B, T, H))
        beta = torch.sigmoid(r(B, T, H))
        o1 = delta_rule_recurrent(q, k, v, g, beta)
        o2 = delta_rule_chunked(q, k, v, g, beta, C)
        worst = max(worst, ((o1 - o2).abs().max() / o1.abs().max()).item())
    return worst


def selftest_model(c=None):
    """Whole model, chunked vs recurrent DeltaNet, float64. Returns max rel error."""
    c = c or Config(n_vocab=300, n_embd=32, n_layer=4, n_head=2, n_head_kv=1, head_dim=16,
                    n_rot=8, ssm_n_k=2, ssm_d_k=16, n_ff=48, chunk=16)
    m = Model(c).double()
    m.init_weights(3)
    toks = torch.randint(0, c.n_vocab, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = m(toks)
        b = m(toks, recurrent=True)
    return ((a - b).abs().max() / a.abs().max()).item()


if __name__ == "__main__":
    torch.set_num_threads(1)
    e1 = selftest_delta_rule()
    e2 = selftest_model()
    print("delta rule chunked vs recurrent: max rel err %.2e" % e1)
    print("model chunked vs recurrent:      max rel err %.2e" % e2)
    raise SystemExit(0 if e1 < 1e-10 and e2 < 1e-10 else 1)

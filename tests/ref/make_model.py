#!/usr/bin/python3
"""make_model.py - writes a small seeded random GGUF (qwen35, qwen3next, qwen3, llama)
with gguf_io's writer.

Owns: a second, independent GGUF producer for the C engine's loader: every tensor
of docs/models.md section 2.4 for both layer kinds (exact names, ne shapes),
hyperparameter keys of section 2.2, and GPT-2 byte-level tokenizer metadata
(section 6; token id = byte value); for qwen3next the MoE tensors and either the
current (attn_qkv + attn_gate + ssm_ba) or the legacy (ssm_in + ssm_ba) DeltaNet
inputs; for qwen3 / llama the plain GQA layout (attn_q/k/v/output, ffn_norm).
qwen35 --nextn N appends N MTP blocks blk.{layers}..: a gated full-attention layer and a dense
FFN like the trunk's attention layers, plus nextn.eh_proj / enorm / hnorm / shared_head_norm,
and with --nextn-embed / --nextn-head the optional nextn.embed_tokens / shared_head_head
(their own random weights); block_count = layers + N, nextn_predict_layers = N (the MoE
version: make_hybrid_model.py --arch qwen35moe --nextn). A file without --nextn is the same,
byte for byte, as before MTP blocks existed; one with --nextn but neither option the same as
when the block was only written to be ignored.
Does not: produce meaningful weights; values are random but scaled so the
activations stay O(1) (matrices ~ N(0, 1/fan_in), norms near 1, ssm_a < 0).

Weight types (section 2.3 item 8): 2-D projections and the embedding use --dtype;
1-D tensors, norms, ssm_conv1d, ssm_a, ssm_dt.bias and the MoE router
(ffn_gate_inp) use --small-dtype (F32 by default, as the converter and
llama-quantize keep them). --dtype may be a quantized type (q8_0, q4_0, q4_k,
q5_k, q6_k; our own simple quantizer, see quants.py) or a llama.cpp-like mix:
  q4_k_m: Q4_K, except output.weight (token_embd.weight when tied) Q6_K, fused
          attn_qkv Q5_K, and Q6_K for ffn_down / ffn_down_exps / ffn_down_shexp of
          the "more bits" layers i of n = layers (i < n/8, i >= 7n/8, or
          (i - n/8) % 3 == 2) and for the attn_v.weight number i (in layer order)
          of n = the count of attn_v and attn_qkv tensors; with 8 experts
          (qwen3next) attn_v and attn_k Q8_0 and attn_output Q5_K instead,
          as llama-quantize's llama_tensor_get_type does.
  q5_k_m: the same with Q5_K as the base, Q6_K for attn_qkv, attn_output kept.
A tensor whose ne[0] is not a multiple of its type's block falls back to Q8_0 (if
ne[0] % 32 == 0) or F16 (llama-quantize falls back similarly, to Q5_0/Q5_1/Q8_0).

The random draws for a qwen35 model are the same as before these options existed
(same seed -> same file), and quantizing happens at write time, so a quantized file
and its --dtype f32 twin of the same seed hold the same model up to quantization.

Examples:
  /usr/bin/python3 tests/ref/make_model.py -o /tmp/m.gguf --layers 8 --interval 4 --dtype bf16
  /usr/bin/python3 tests/ref/make_model.py -o /tmp/m.gguf --pattern LLAL --nk 2 --nv 4
  /usr/bin/python3 tests/ref/make_model.py -o /tmp/t.gguf --layers 4 --nextn 1 [--nextn-embed] [--nextn-head]
  /usr/bin/python3 tests/ref/make_model.py -o /tmp/n.gguf --arch qwen3next --nk 2 --nv 4 \
      --experts 8 --experts-used 2 --expert-ff 64 --shared-ff 64 [--legacy-ssm-in]
  /usr/bin/python3 tests/ref/make_model.py -o /tmp/l.gguf --arch llama --embd 256 --heads 4 \
      --kv-heads 2 --head-dim 64 --ff 256 --dtype q4_k_m
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_io import GGUFWriter, T_BOOL, T_INT32, T_STRING  # noqa: E402
import quants  # noqa: E402

ARCHS = ("qwen35", "qwen3next", "qwen3", "llama")
FLOAT_DTYPES = ["f32", "f16", "bf16"]
QUANT_DTYPES = ["q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]
MIXES = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}
FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32, "q4_0": 2, "q8_0": 7, "q4_k": 14, "q5_k": 16,
             "q6_k": 18, "q4_k_m": 15, "q5_k_m": 17}
TOKENIZER_PRE = {"qwen35": "qwen35", "qwen3next": "qwen2", "qwen3": "qwen2", "llama": "llama-bpe"}


def gpt2_byte_strings():
    """The 256 GPT-2 byte-level token strings, index = byte value (section 6)."""
    keep = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out = []
    n = 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    assert n == 68
    return out


def rope_sections(n_rot):
    """MRoPE sections [t, h, w, 0] summing to n_rot/2, proportioned like [11, 11, 10, 0] for 64."""
    half = n_rot // 2
    a = (half + 2) // 3
    b = (half - a + 1) // 2
    return [a, b, half - a - b, 0]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="write a random qwen35 / qwen3next / qwen3 / llama GGUF")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--arch", choices=ARCHS, default="qwen35")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4, help="trunk layers")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--interval", type=int, default=None,
                      help="full_attention_interval: layer i is attention iff (i+1) %% K == 0 (hybrids)")
    kind.add_argument("--pattern", default=None,
                      help="string of L (DeltaNet) / A (attention), one per layer; "
                           "written as the bool array attention.recurrent_layers (hybrids)")
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--rope-dim", type=int, default=None,
                    help="rotary dims (default 8 for the hybrids, head-dim for qwen3 / llama)")
    ap.add_argument("--rope-theta", type=float, default=None,
                    help="default 1e7 (qwen35, qwen3next), 1e6 (qwen3), 5e5 (llama)")
    ap.add_argument("--rope-freqs", action="store_true",
                    help="llama: add a Llama-3 style rope_freqs.weight (frequency divisors)")
    ap.add_argument("--nk", type=int, default=2, help="DeltaNet key heads (ssm.group_count)")
    ap.add_argument("--nv", type=int, default=4, help="DeltaNet value heads (ssm.time_step_rank)")
    ap.add_argument("--dk", type=int, default=16, help="DeltaNet key head dim (ssm.state_size)")
    ap.add_argument("--dv", type=int, default=None, help="DeltaNet value head dim (default = dk)")
    ap.add_argument("--conv-k", type=int, default=4)
    ap.add_argument("--ff", type=int, default=128, help="dense MLP size (feed_forward_length)")
    ap.add_argument("--experts", type=int, default=8, help="qwen3next: expert_count")
    ap.add_argument("--experts-used", type=int, default=2, help="qwen3next: expert_used_count (top-k)")
    ap.add_argument("--expert-ff", type=int, default=64, help="qwen3next: expert_feed_forward_length")
    ap.add_argument("--shared-ff", type=int, default=64,
                    help="qwen3next: expert_shared_feed_forward_length (0 = no shared expert)")
    ap.add_argument("--router-gain", type=float, default=2.0,
                    help="qwen3next: router weights ~ N(0, gain^2/n_embd) (spreads the router logits)")
    ap.add_argument("--legacy-ssm-in", action="store_true",
                    help="qwen3next: write the fused legacy ssm_in instead of attn_qkv + attn_gate")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--eos", type=int, default=None, help="eos token id (default vocab-1)")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--nextn", type=int, default=0,
                    help="qwen35: append N MTP blocks (the trunk ignores them) and write nextn_predict_layers")
    ap.add_argument("--nextn-embed", action="store_true",
                    help="with --nextn: each MTP block also gets its own nextn.embed_tokens.weight")
    ap.add_argument("--nextn-head", action="store_true",
                    help="with --nextn: each MTP block also gets its own nextn.shared_head_head.weight")
    tied = ap.add_mutually_exclusive_group()
    tied.add_argument("--tied", dest="tied", action="store_true", default=True)
    tied.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--dtype", choices=FLOAT_DTYPES + QUANT_DTYPES + sorted(MIXES), default="f32")
    ap.add_argument("--small-dtype", choices=FLOAT_DTYPES, default="f32",
                    help="dtype of 1-D tensors, ssm_conv1d and the MoE router (converter keeps them F32)")
    ap.add_argument("--alignment", type=int, default=32)
    a = ap.parse_args(argv)
    hybrid = a.arch in ("qwen35", "qwen3next")
    if a.dv is None:
        a.dv = a.dk
    if a.rope_dim is None:
        a.rope_dim = 8 if hybrid else a.head_dim
    if a.rope_theta is None:
        a.rope_theta = {"qwen35": 1e7, "qwen3next": 1e7, "qwen3": 1e6, "llama": 5e5}[a.arch]
    if hybrid:
        if a.pattern is not None:
            if len(a.pattern) != a.layers or set(a.pattern) - set("LA"):
                ap.error("--pattern must be %d characters of L/A" % a.layers)
        elif a.interval is None:
            a.interval = 4
    elif a.pattern is not None or a.interval is not None:
        ap.error("--pattern / --interval only apply to qwen35 / qwen3next")
    if a.nextn and a.arch != "qwen35":
        ap.error("--nextn only applies to qwen35")
    if a.nextn < 0:
        ap.error("--nextn must be >= 0")
    if (a.nextn_embed or a.nextn_head) and not a.nextn:
        ap.error("--nextn-embed / --nextn-head need --nextn")
    if a.legacy_ssm_in and a.arch != "qwen3next":
        ap.error("--legacy-ssm-in only applies to qwen3next")
    if a.rope_freqs and a.arch != "llama":
        ap.error("--rope-freqs only applies to llama")
    if a.arch == "qwen3next" and not 0 < a.experts_used <= a.experts:
        ap.error("need 0 < --experts-used <= --experts")
    if a.vocab < 256:
        ap.error("--vocab must be >= 256 (byte-level tokens)")
    if a.nv % a.nk or a.heads % a.kv_heads or a.rope_dim % 2 or a.rope_dim > a.head_dim:
        ap.error("need nv %% nk == 0, heads %% kv-heads == 0, even rope-dim <= head-dim")
    if a.eos is None:
        a.eos = a.vocab - 1
    return a


def use_more_bits(il, n_layer):
    """llama-quantize's layer choice for the extra-precision tensors of *_K_M mixes."""
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def weight_dtype(a, name, ne0, il=None, n_layer=1, wv=None):
    """Storage type of a 2-D/3-D weight (or the embedding) under --dtype, with block fallback.
    wv = (i, n): this attn_v.weight's index among the file's attn_v tensors, and n the
    count of attn_v + attn_qkv tensors (llama-quantize's i/n_attention_wv)."""
    if a.dtype in MIXES:
        base = MIXES[a.dtype]
        t = base
        eight = a.arch == "qwen3next" and a.experts == 8
        if name == "output.weight" or (a.tied and name == "token_embd.weight"):
            t = "q6_k"
        elif name.endswith("attn_qkv.weight"):
            t = "q5_k" if base == "q4_k" else "q6_k"
        elif name.endswith("attn_v.weight"):
            if eight:
                t = "q8_0"
            elif wv is not None and use_more_bits(*wv):
                t = "q6_k"
        elif name.endswith("attn_k.weight") and eight:
            t = "q8_0"
        elif name.endswith("attn_output.weight") and eight and base == "q4_k":
            t = "q5_k"
        elif "ffn_down" in name and il is not None and use_more_bits(il, n_layer):
            t = "q6_k"
    else:
        t = a.dtype
    blk, _ = quants.block_info(t)
    if ne0 % blk:
        t = "q8_0" if (t in QUANT_DTYPES and ne0 % 32 == 0) else ("f16" if t in QUANT_DTYPES else t)
    return t


def write_tokenizer(w, a):
    V = a.vocab
    toks = gpt2_byte_strings() + ["[PAD%d]" % i for i in range(256, V)]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", TOKENIZER_PRE[a.arch])
    w.add_array("tokenizer.ggml.tokens", T_STRING, toks)
    w.add_array("tokenizer.ggml.token_type", T_INT32, [1] * 256 + [5] * (V - 256))
    w.add_array("tokenizer.ggml.merges", T_STRING, [])
    w.add_u32("tokenizer.ggml.eos_token_id", a.eos)


def build(a):
    rng = np.random.default_rng(a.seed)
    D, F, V = a.embd, a.ff, a.vocab
    hd, H, Hkv = a.head_dim, a.heads, a.kv_heads
    nk, nv, dk, dv, K = a.nk, a.nv, a.dk, a.dv, a.conv_k
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    ARCH = a.arch
    hybrid = ARCH in ("qwen35", "qwen3next")
    n_block = a.layers + a.nextn

    if not hybrid:
        recurrent = [False] * a.layers
    elif a.pattern is not None:
        recurrent = [c == "L" for c in a.pattern]
    else:
        recurrent = [(i + 1) % a.interval != 0 for i in range(a.layers)]

    w = GGUFWriter(alignment=a.alignment)
    w.add_string("general.architecture", ARCH)
    w.add_string("general.name", "hyserve-ref-synth seed %d" % a.seed)
    w.add_u32("general.file_type", FILE_TYPE[a.dtype])
    if a.dtype in QUANT_DTYPES or a.dtype in MIXES:
        w.add_u32("general.quantization_version", 2)
    w.add_u32(ARCH + ".block_count", n_block)
    if a.nextn:
        w.add_u32(ARCH + ".nextn_predict_layers", a.nextn)
    w.add_u32(ARCH + ".context_length", a.context)
    w.add_u32(ARCH + ".embedding_length", D)
    w.add_u32(ARCH + ".feed_forward_length", F)
    w.add_u32(ARCH + ".attention.head_count", H)
    w.add_u32(ARCH + ".attention.head_count_kv", Hkv)
    if hybrid or ARCH == "qwen3" or hd * H != D:
        # llama files carry key_length only when head_dim != n_embd / n_head
        w.add_u32(ARCH + ".attention.key_length", hd)
        w.add_u32(ARCH + ".attention.value_length", hd)
    w.add_f32(ARCH + ".attention.layer_norm_rms_epsilon", a.eps)
    w.add_f32(ARCH + ".rope.freq_base", a.rope_theta)
    if hybrid or ARCH == "llama" or a.rope_dim != hd:
        # qwen3: rope.dimension_count written only for partial rotation (exercises the default)
        w.add_u32(ARCH + ".rope.dimension_count", a.rope_dim)
    if ARCH == "qwen35":
        w.add_array(ARCH + ".rope.dimension_sections", T_INT32, rope_sections(a.rope_dim))
    if ARCH == "llama":
        w.add_u32(ARCH + ".vocab_size", V)
    if hybrid:
        w.add_u32(ARCH + ".ssm.conv_kernel", K)
        w.add_u32(ARCH + ".ssm.state_size", dk)
        w.add_u32(ARCH + ".ssm.group_count", nk)
        w.add_u32(ARCH + ".ssm.time_step_rank", nv)
        w.add_u32(ARCH + ".ssm.inner_size", value_dim)
        if a.pattern is not None:
            # MTP blocks (if any) look like attention blocks
            w.add_array(ARCH + ".attention.recurrent_layers", T_BOOL, recurrent + [False] * a.nextn)
        else:
            w.add_u32(ARCH + ".full_attention_interval", a.interval)
    if ARCH == "qwen3next":
        w.add_u32(ARCH + ".expert_count", a.experts)
        w.add_u32(ARCH + ".expert_used_count", a.experts_used)
        w.add_u32(ARCH + ".expert_feed_forward_length", a.expert_ff)
        w.add_u32(ARCH + ".expert_shared_feed_forward_length", a.shared_ff)
    write_tokenizer(w, a)

    def mat(n_out, n_in, gain=1.0):
        return rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    small = a.small_dtype

    # llama-quantize counts attn_v and attn_qkv tensors for n_attention_wv and
    # indexes the attn_v ones in file (layer) order
    n_wv = sum(1 for il in range(n_block) if not (il < a.layers and recurrent[il] and a.legacy_ssm_in
                                                  and ARCH == "qwen3next"))
    seen_v = [0]

    def W(name, arr, il=None):
        """A 2-D / 3-D weight (or the embedding) in the --dtype storage type."""
        wv = None
        if name.endswith("attn_v.weight"):
            wv = (seen_v[0], n_wv)
            seen_v[0] += 1
        w.add_tensor(name, arr, weight_dtype(a, name, arr.shape[-1], il, a.layers, wv))

    W("token_embd.weight", rng.standard_normal((V, D)))                      # ne {D, V}
    w.add_tensor("output_norm.weight", norm(D), small)
    if not a.tied:
        W("output.weight", mat(V, D))
    if a.rope_freqs:
        # Llama-3 style: 1 for high frequencies, up to 8 for the lowest ones
        w.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, a.rope_dim // 2) ** rng.uniform(0.9, 1.1), "f32")

    def attention_block(p, il, gated):
        W(p + "attn_q.weight", mat((2 if gated else 1) * H * hd, D), il)     # ne {D, (2*)H*hd}
        W(p + "attn_k.weight", mat(Hkv * hd, D), il)
        W(p + "attn_v.weight", mat(Hkv * hd, D), il)
        W(p + "attn_output.weight", mat(D, H * hd), il)                      # ne {H*hd, D}
        if ARCH != "llama":
            w.add_tensor(p + "attn_q_norm.weight", norm(hd), small)
            w.add_tensor(p + "attn_k_norm.weight", norm(hd), small)

    def deltanet_qwen35(p, il):
        W(p + "attn_qkv.weight", mat(conv_dim, D), il)                       # ne {D, conv_dim}
        W(p + "attn_gate.weight", mat(value_dim, D), il)                     # ne {D, value_dim}
        W(p + "ssm_beta.weight", mat(nv, D), il)                             # ne {D, nv}
        W(p + "ssm_alpha.weight", mat(nv, D), il)

    def deltanet_qwen3next(p, il):
        """HF-style weights (value heads grouped, h = g*r + j), then laid out as the converter
        does (current: attn_qkv + attn_gate) or as legacy files carry them (fused ssm_in)."""
        r = nv // nk
        q = mat(key_dim, D).reshape(nk, dk, D)
        k = mat(key_dim, D).reshape(nk, dk, D)
        v = mat(value_dim, D).reshape(nk, r * dv, D)                         # per key head g: heads g*r..g*r+r-1
        z = mat(value_dim, D).reshape(nk, r * dv, D)
        b = mat(nv, D).reshape(nk, r, D)
        al = mat(nv, D).reshape(nk, r, D)
        if a.legacy_ssm_in:
            # per key head g: [q_g | k_g | v_g (r*dv) | z_g (r*dv)]
            W(p + "ssm_in.weight", np.concatenate([q, k, v, z], axis=1).reshape(-1, D), il)
        else:
            W(p + "attn_qkv.weight", np.concatenate([q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)]), il)
            W(p + "attn_gate.weight", z.reshape(-1, D), il)
        # per key head g: [b_g (r) | a_g (r)]
        W(p + "ssm_ba.weight", np.concatenate([b, al], axis=1).reshape(2 * nv, D), il)

    def deltanet_common(p, il):
        w.add_tensor(p + "ssm_conv1d.weight", rng.standard_normal((conv_dim, K)) / np.sqrt(K), small)  # ne {K, conv_dim}
        w.add_tensor(p + "ssm_dt.bias", rng.uniform(-2.0, 1.0, nv), small)
        w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(np.log(0.05), np.log(2.0), nv)), small)
        w.add_tensor(p + "ssm_norm.weight", norm(dv), small)
        W(p + "ssm_out.weight", mat(D, value_dim), il)                       # ne {value_dim, D}

    def moe(p, il):
        E, Fe, Fs = a.experts, a.expert_ff, a.shared_ff
        w.add_tensor(p + "ffn_gate_inp.weight", mat(E, D, a.router_gain), small)     # ne {D, E}, router F32
        W(p + "ffn_gate_exps.weight", rng.standard_normal((E, Fe, D)) / np.sqrt(D), il)  # ne {D, Fe, E}
        W(p + "ffn_up_exps.weight", rng.standard_normal((E, Fe, D)) / np.sqrt(D), il)
        W(p + "ffn_down_exps.weight", rng.standard_normal((E, D, Fe)) / np.sqrt(Fe), il)  # ne {Fe, D, E}
        if Fs:
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", rng.standard_normal(D) / np.sqrt(D), small)  # ne {D}
            W(p + "ffn_gate_shexp.weight", mat(Fs, D), il)                   # ne {D, Fs}
            W(p + "ffn_up_shexp.weight", mat(Fs, D), il)
            W(p + "ffn_down_shexp.weight", mat(D, Fs), il)                   # ne {Fs, D}

    for il in range(n_block):
        p = "blk.%d." % il
        w.add_tensor(p + "attn_norm.weight", norm(D), small)
        if il < a.layers and recurrent[il]:
            if ARCH == "qwen35":
                deltanet_qwen35(p, il)
            else:
                deltanet_qwen3next(p, il)
            deltanet_common(p, il)
        else:
            attention_block(p, il, gated=hybrid)
        if il >= a.layers:  # MTP block: its own tensors (the trunk never reads this block)
            nextn_core(p, lambda n, x: W(n, x), lambda n, x: w.add_tensor(n, x, small), mat, norm, D)
        w.add_tensor(p + ("post_attention_norm.weight" if hybrid else "ffn_norm.weight"), norm(D), small)
        if ARCH == "qwen3next":
            moe(p, il)
        else:
            W(p + "ffn_gate.weight", mat(F, D), il)                          # ne {D, F}
            W(p + "ffn_up.weight", mat(F, D), il)
            W(p + "ffn_down.weight", mat(D, F), il)                          # ne {F, D}
        if il >= a.layers:
            nextn_extras(p, lambda n, x: W(n, x), rng, mat, D, V, a.nextn_embed, a.nextn_head)
    return w


def nextn_core(p, put, put_small, mat, norm, D):
    """An MTP block's own projection and norms (docs/models.md 2.4; the converter's names):
    eh_proj ne {2*D, D} (input: [enorm(embedding) | hnorm(hidden)]), enorm, hnorm, and
    shared_head_norm (the block's final norm), in this order of random draws."""
    put(p + "nextn.eh_proj.weight", mat(D, 2 * D))                           # ne {2D, D}
    put_small(p + "nextn.enorm.weight", norm(D))
    put_small(p + "nextn.hnorm.weight", norm(D))
    put_small(p + "nextn.shared_head_norm.weight", norm(D))


def nextn_extras(p, put, rng, mat, D, V, embed, head):
    """The optional per-block embedding and LM head (absent: the trunk's token_embd / output),
    drawn after the whole block so that a file without them holds the same other weights."""
    if embed:
        put(p + "nextn.embed_tokens.weight", rng.standard_normal((V, D)))    # ne {D, V}
    if head:
        put(p + "nextn.shared_head_head.weight", mat(V, D))                  # ne {D, V}


def main(argv=None):
    a = parse_args(argv)
    build(a).write(a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

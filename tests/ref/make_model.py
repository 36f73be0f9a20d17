#!/usr/bin/python3
"""make_model.py - writes a small seeded random `qwen35` GGUF with gguf_io's writer.

Owns: a second, independent GGUF producer for the C engine's loader: every tensor
of architectures.md section 2.4 for both layer kinds (exact names, ne shapes),
hyperparameter keys of section 2.2, and GPT-2 byte-level tokenizer metadata
(section 6; token id = byte value).
Does not: produce meaningful weights; values are random but scaled so the
activations stay O(1) (matrices ~ N(0, 1/fan_in), norms near 1, ssm_a < 0).

Converter conventions mirrored (section 2.3 item 8): 2-D projections use --dtype;
1-D tensors, norms, ssm_conv1d, ssm_a and ssm_dt.bias are F32 unless --small-dtype.

Example:
  /usr/bin/python3 tests/ref/make_model.py -o /tmp/m.gguf --layers 8 --interval 4 --dtype bf16
  /usr/bin/python3 tests/ref/make_model.py -o /tmp/m.gguf --pattern LLAL --nk 2 --nv 4
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_io import GGUFWriter, T_BOOL, T_INT32, T_STRING  # noqa: E402

ARCH = "qwen35"


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
    ap = argparse.ArgumentParser(description="write a random qwen35 GGUF")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4, help="trunk layers")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--interval", type=int, default=None,
                      help="full_attention_interval: layer i is attention iff (i+1) %% K == 0")
    kind.add_argument("--pattern", default=None,
                      help="string of L (DeltaNet) / A (attention), one per layer; "
                           "written as the bool array attention.recurrent_layers")
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--rope-dim", type=int, default=8)
    ap.add_argument("--rope-theta", type=float, default=1e7)
    ap.add_argument("--nk", type=int, default=2, help="DeltaNet key heads (ssm.group_count)")
    ap.add_argument("--nv", type=int, default=4, help="DeltaNet value heads (ssm.time_step_rank)")
    ap.add_argument("--dk", type=int, default=16, help="DeltaNet key head dim (ssm.state_size)")
    ap.add_argument("--dv", type=int, default=None, help="DeltaNet value head dim (default = dk)")
    ap.add_argument("--conv-k", type=int, default=4)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--eos", type=int, default=None, help="eos token id (default vocab-1)")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--nextn", type=int, default=0,
                    help="append N extra MTP-like blocks (ignored by the trunk) and write nextn_predict_layers")
    tied = ap.add_mutually_exclusive_group()
    tied.add_argument("--tied", dest="tied", action="store_true", default=True)
    tied.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--small-dtype", choices=["f32", "f16", "bf16"], default="f32",
                    help="dtype of 1-D tensors and ssm_conv1d (converter keeps them F32)")
    ap.add_argument("--alignment", type=int, default=32)
    a = ap.parse_args(argv)
    if a.dv is None:
        a.dv = a.dk
    if a.pattern is not None:
        if len(a.pattern) != a.layers or set(a.pattern) - set("LA"):
            ap.error("--pattern must be %d characters of L/A" % a.layers)
    elif a.interval is None:
        a.interval = 4
    if a.vocab < 256:
        ap.error("--vocab must be >= 256 (byte-level tokens)")
    if a.nv % a.nk or a.heads % a.kv_heads or a.rope_dim % 2 or a.rope_dim > a.head_dim:
        ap.error("need nv %% nk == 0, heads %% kv-heads == 0, even rope-dim <= head-dim")
    if a.eos is None:
        a.eos = a.vocab - 1
    return a


def build(a):
    rng = np.random.default_rng(a.seed)
    D, F, V = a.embd, a.ff, a.vocab
    hd, H, Hkv = a.head_dim, a.heads, a.kv_heads
    nk, nv, dk, dv, K = a.nk, a.nv, a.dk, a.dv, a.conv_k
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    n_block = a.layers + a.nextn

    if a.pattern is not None:
        recurrent = [c == "L" for c in a.pattern]
    else:
        recurrent = [(i + 1) % a.interval != 0 for i in range(a.layers)]

    w = GGUFWriter(alignment=a.alignment)
    w.add_string("general.architecture", ARCH)
    w.add_string("general.name", "hyserve-ref-synth seed %d" % a.seed)
    w.add_u32("general.file_type", {"f32": 0, "f16": 1, "bf16": 32}[a.dtype])
    w.add_u32(ARCH + ".block_count", n_block)
    if a.nextn:
        w.add_u32(ARCH + ".nextn_predict_layers", a.nextn)
    w.add_u32(ARCH + ".context_length", a.context)
    w.add_u32(ARCH + ".embedding_length", D)
    w.add_u32(ARCH + ".feed_forward_length", F)
    w.add_u32(ARCH + ".attention.head_count", H)
    w.add_u32(ARCH + ".attention.head_count_kv", Hkv)
    w.add_u32(ARCH + ".attention.key_length", hd)
    w.add_u32(ARCH + ".attention.value_length", hd)
    w.add_f32(ARCH + ".attention.layer_norm_rms_epsilon", a.eps)
    w.add_f32(ARCH + ".rope.freq_base", a.rope_theta)
    w.add_u32(ARCH + ".rope.dimension_count", a.rope_dim)
    w.add_array(ARCH + ".rope.dimension_sections", T_INT32, rope_sections(a.rope_dim))
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

    toks = gpt2_byte_strings() + ["[PAD%d]" % i for i in range(256, V)]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35")
    w.add_array("tokenizer.ggml.tokens", T_STRING, toks)
    w.add_array("tokenizer.ggml.token_type", T_INT32, [1] * 256 + [5] * (V - 256))
    w.add_array("tokenizer.ggml.merges", T_STRING, [])
    w.add_u32("tokenizer.ggml.eos_token_id", a.eos)

    def mat(n_out, n_in, gain=1.0):
        return rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    big, small = a.dtype, a.small_dtype

    w.add_tensor("token_embd.weight", rng.standard_normal((V, D)), big)      # ne {D, V}
    w.add_tensor("output_norm.weight", norm(D), small)
    if not a.tied:
        w.add_tensor("output.weight", mat(V, D), big)

    def attention_block(p):
        w.add_tensor(p + "attn_q.weight", mat(2 * H * hd, D), big)           # ne {D, 2*H*hd}
        w.add_tensor(p + "attn_k.weight", mat(Hkv * hd, D), big)
        w.add_tensor(p + "attn_v.weight", mat(Hkv * hd, D), big)
        w.add_tensor(p + "attn_output.weight", mat(D, H * hd), big)          # ne {H*hd, D}
        w.add_tensor(p + "attn_q_norm.weight", norm(hd), small)
        w.add_tensor(p + "attn_k_norm.weight", norm(hd), small)

    for il in range(n_block):
        p = "blk.%d." % il
        w.add_tensor(p + "attn_norm.weight", norm(D), small)
        if il < a.layers and recurrent[il]:
            w.add_tensor(p + "attn_qkv.weight", mat(conv_dim, D), big)       # ne {D, conv_dim}
            w.add_tensor(p + "attn_gate.weight", mat(value_dim, D), big)     # ne {D, value_dim}
            w.add_tensor(p + "ssm_beta.weight", mat(nv, D), big)             # ne {D, nv}
            w.add_tensor(p + "ssm_alpha.weight", mat(nv, D), big)
            w.add_tensor(p + "ssm_conv1d.weight", rng.standard_normal((conv_dim, K)) / np.sqrt(K), small)  # ne {K, conv_dim}
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(-2.0, 1.0, nv), small)
            w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(np.log(0.05), np.log(2.0), nv)), small)
            w.add_tensor(p + "ssm_norm.weight", norm(dv), small)
            w.add_tensor(p + "ssm_out.weight", mat(D, value_dim), big)       # ne {value_dim, D}
        else:
            attention_block(p)
        if il >= a.layers:  # MTP-like extras: present in the file, never used by the trunk
            w.add_tensor(p + "nextn.eh_proj.weight", mat(D, 2 * D), big)
            w.add_tensor(p + "nextn.enorm.weight", norm(D), small)
            w.add_tensor(p + "nextn.hnorm.weight", norm(D), small)
            w.add_tensor(p + "nextn.shared_head_norm.weight", norm(D), small)
        w.add_tensor(p + "post_attention_norm.weight", norm(D), small)
        w.add_tensor(p + "ffn_gate.weight", mat(F, D), big)                  # ne {D, F}
        w.add_tensor(p + "ffn_up.weight", mat(F, D), big)
        w.add_tensor(p + "ffn_down.weight", mat(D, F), big)                  # ne {F, D}
    return w


def main(argv=None):
    a = parse_args(argv)
    build(a).write(a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

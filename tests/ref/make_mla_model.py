#!/usr/bin/python3
"""make_mla_model.py - writes small seeded random GGUF models with MLA layers (gguf_io's writer).

Owns: the two MLA file flavours mla_ref.py reads:
  --arch qwen35     hybrid; --kinds is one letter per trunk layer: A gated GQA attention,
                    L Gated DeltaNet, M MLA. Written as the UINT8 array hyserve.layer_kinds
                    (0 A, 1 L, 2 M) plus, for readers without MLA, the matching bool array
                    qwen35.attention.recurrent_layers (True = L; see --layout-key). MLA keys:
                    attention.kv_lora_rank,
                    attention.q_lora_rank (only when > 0), attention.key_length_mla (nope + rope),
                    attention.value_length_mla, rope.dimension_count_mla; the GQA / DeltaNet keys
                    and tensors are those of make_model.py (docs/models.md 2.2, 2.4).
  --arch deepseek2  dense DeepSeek-V2 layout (section 3.3): every layer attn_norm, MLA, ffn_norm,
                    dense SwiGLU; head_count_kv 1, key_length R + rope, value_length R,
                    leading_dense_block_count = block_count, no rope scaling, no experts.
  MLA tensors (ne order): attn_q {E, H*(nope+rope)} or attn_q_a {E, q_lora} + attn_q_a_norm
  {q_lora} + attn_q_b {q_lora, H*(nope+rope)}; attn_kv_a_mqa {E, R+rope}; attn_kv_a_norm {R};
  attn_k_b {nope, R, H}; attn_v_b {R, vdim, H}; attn_output {H*vdim, E}.
  Byte-level 256-token GPT-2 vocabulary as make_model.py (its gpt2_byte_strings, rope_sections).
Does not: produce meaningful weights (N(0, 1/fan_in) matrices, norms near 1, ssm_a < 0).

2-D / 3-D weights use --dtype; norms and the DeltaNet 1-D tensors and conv use --small-dtype.
A tensor whose ne[0] is not a multiple of a quantized type's block falls back to Q8_0 (ne[0] a
multiple of 32) or F16.

Examples:
  /usr/bin/python3 tests/ref/make_mla_model.py -o /tmp/k.gguf --kinds LLLM
  /usr/bin/python3 tests/ref/make_mla_model.py -o /tmp/h.gguf --kinds LAMLM --q-lora 24
  /usr/bin/python3 tests/ref/make_mla_model.py -o /tmp/d.gguf --arch deepseek2 --layers 3 --q-lora 32
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io  # noqa: E402
from gguf_io import GGUFWriter, T_BOOL, T_INT32, T_STRING, T_UINT8  # noqa: E402
from make_model import gpt2_byte_strings, rope_sections  # noqa: E402

KINDS_KEY = "hyserve.layer_kinds"
KIND_CODES = {"A": 0, "L": 1, "M": 2}
FILE_TYPES = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_k": 15, "q5_k": 17, "q6_k": 18}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="write a random GGUF with MLA layers (qwen35 hybrid or deepseek2)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--arch", choices=["qwen35", "deepseek2"], default="qwen35")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=None,
                    help="qwen35: one letter per layer, A attention / L DeltaNet / M MLA (default LLLM)")
    ap.add_argument("--layers", type=int, default=None, help="deepseek2 layers (qwen35: len(--kinds))")
    # MLA
    ap.add_argument("--heads", type=int, default=4, help="attention heads (GQA and MLA share it)")
    ap.add_argument("--kv-lora", type=int, default=32, help="kv_lora_rank R")
    ap.add_argument("--q-lora", type=int, default=0, help="q_lora_rank (0 = plain attn_q)")
    ap.add_argument("--nope", type=int, default=16, help="qk_nope_head_dim")
    ap.add_argument("--rope-mla", type=int, default=8, help="qk_rope_head_dim")
    ap.add_argument("--vdim", type=int, default=16, help="v_head_dim")
    # the qwen35 options of make_model.py
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--rope-dim", type=int, default=8)
    ap.add_argument("--rope-theta", type=float, default=None, help="default 1e7 (qwen35), 1e4 (deepseek2)")
    ap.add_argument("--nk", type=int, default=2)
    ap.add_argument("--nv", type=int, default=4)
    ap.add_argument("--dk", type=int, default=16)
    ap.add_argument("--dv", type=int, default=None)
    ap.add_argument("--conv-k", type=int, default=4)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--eos", type=int, default=None)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--nextn", type=int, default=0, help="qwen35: extra MTP-like blocks after the trunk")
    ap.add_argument("--layout-key", choices=["recurrent", "interval2", "none"], default="recurrent",
                    help="qwen35: what else describes the layout besides hyserve.layer_kinds: "
                         "attention.recurrent_layers (matching), full_attention_interval = 2 "
                         "(contradicting: tests that the kinds override it), or nothing")
    tied = ap.add_mutually_exclusive_group()
    tied.add_argument("--tied", dest="tied", action="store_true", default=True)
    tied.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--dtype", choices=sorted(FILE_TYPES), default="f32")
    ap.add_argument("--small-dtype", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--alignment", type=int, default=32)
    a = ap.parse_args(argv)
    if a.dv is None:
        a.dv = a.dk
    if a.rope_theta is None:
        a.rope_theta = 1e7 if a.arch == "qwen35" else 1e4
    if a.arch == "qwen35":
        if a.kinds is None:
            a.kinds = "LLLM" if a.layers is None else "M" * a.layers
        a.kinds = a.kinds.upper()
        if not a.kinds or set(a.kinds) - set(KIND_CODES):
            ap.error("--kinds must be letters A / L / M")
        if a.layers is not None and a.layers != len(a.kinds):
            ap.error("--layers %d != len(--kinds) %d" % (a.layers, len(a.kinds)))
        a.layers = len(a.kinds)
    else:
        if a.kinds is not None and set(a.kinds.upper()) != {"M"}:
            ap.error("deepseek2: every layer is MLA (--kinds M...)")
        if a.layers is None:
            a.layers = len(a.kinds) if a.kinds else 4
        a.kinds = "M" * a.layers
        if a.nextn:
            ap.error("--nextn is for qwen35")
    if a.vocab < 256:
        ap.error("--vocab must be >= 256 (byte-level tokens)")
    if a.rope_mla % 2 or a.rope_mla <= 0 or a.nope < 0 or a.kv_lora <= 0 or a.vdim <= 0 or a.q_lora < 0:
        ap.error("need even --rope-mla > 0, --nope >= 0, --kv-lora > 0, --vdim > 0, --q-lora >= 0")
    if a.nv % a.nk or a.heads % a.kv_heads or a.rope_dim % 2 or a.rope_dim > a.head_dim:
        ap.error("need nv %% nk == 0, heads %% kv-heads == 0, even rope-dim <= head-dim")
    if a.eos is None:
        a.eos = a.vocab - 1
    return a


def build(a):
    rng = np.random.default_rng(a.seed)
    D, F, V, H = a.embd, a.ff, a.vocab, a.heads
    R, ql, dn, dr, dvm = a.kv_lora, a.q_lora, a.nope, a.rope_mla, a.vdim
    hd, Hkv = a.head_dim, a.kv_heads
    nk, nv, dk, dv, K = a.nk, a.nv, a.dk, a.dv, a.conv_k
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    arch = a.arch
    n_block = a.layers + a.nextn
    kinds = [KIND_CODES[c] for c in a.kinds]
    big, small = a.dtype, a.small_dtype

    w = GGUFWriter(alignment=a.alignment)
    pre = arch + "."
    w.add_string("general.architecture", arch)
    w.add_string("general.name", "hyserve-ref-mla-synth %s %s seed %d" % (arch, a.kinds, a.seed))
    w.add_u32("general.file_type", FILE_TYPES[big])
    w.add_u32(pre + "block_count", n_block)
    if a.nextn:
        w.add_u32(pre + "nextn_predict_layers", a.nextn)
    w.add_u32(pre + "context_length", a.context)
    w.add_u32(pre + "embedding_length", D)
    w.add_u32(pre + "feed_forward_length", F)
    w.add_u32(pre + "attention.head_count", H)
    w.add_f32(pre + "attention.layer_norm_rms_epsilon", a.eps)
    w.add_f32(pre + "rope.freq_base", a.rope_theta)
    if ql:
        w.add_u32(pre + "attention.q_lora_rank", ql)
    w.add_u32(pre + "attention.kv_lora_rank", R)
    w.add_u32(pre + "attention.key_length_mla", dn + dr)
    w.add_u32(pre + "attention.value_length_mla", dvm)
    if arch == "deepseek2":
        w.add_u32(pre + "attention.head_count_kv", 1)
        w.add_u32(pre + "attention.key_length", R + dr)
        w.add_u32(pre + "attention.value_length", R)
        w.add_u32(pre + "rope.dimension_count", dr)
        w.add_u32(pre + "leading_dense_block_count", a.layers)
    else:
        w.add_u32(pre + "rope.dimension_count_mla", dr)
        w.add_u32(pre + "attention.head_count_kv", Hkv)
        w.add_u32(pre + "attention.key_length", hd)
        w.add_u32(pre + "attention.value_length", hd)
        w.add_u32(pre + "rope.dimension_count", a.rope_dim)
        w.add_array(pre + "rope.dimension_sections", T_INT32, rope_sections(a.rope_dim))
        w.add_u32(pre + "ssm.conv_kernel", K)
        w.add_u32(pre + "ssm.state_size", dk)
        w.add_u32(pre + "ssm.group_count", nk)
        w.add_u32(pre + "ssm.time_step_rank", nv)
        w.add_u32(pre + "ssm.inner_size", value_dim)
        if a.layout_key == "recurrent":
            w.add_array(pre + "attention.recurrent_layers", T_BOOL, [k == 1 for k in kinds] + [False] * a.nextn)
        elif a.layout_key == "interval2":
            w.add_u32(pre + "full_attention_interval", 2)
        w.add_array(KINDS_KEY, T_UINT8, kinds)

    toks = gpt2_byte_strings() + ["[PAD%d]" % i for i in range(256, V)]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35" if arch == "qwen35" else "qwen2")
    w.add_array("tokenizer.ggml.tokens", T_STRING, toks)
    w.add_array("tokenizer.ggml.token_type", T_INT32, [1] * 256 + [5] * (V - 256))
    w.add_array("tokenizer.ggml.merges", T_STRING, [])
    w.add_u32("tokenizer.ggml.eos_token_id", a.eos)

    def mat(n_out, n_in, gain=1.0):
        return rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    def put(name, arr, dtype):
        blk = gguf_io.GGML_TYPES[gguf_io.DTYPE_IDS[dtype]][1]
        if arr.shape[-1] % blk:
            dtype = "q8_0" if arr.shape[-1] % 32 == 0 else "f16"
        w.add_tensor(name, arr, dtype)

    put("token_embd.weight", rng.standard_normal((V, D)), big)              # ne {D, V}
    put("output_norm.weight", norm(D), small)
    if not a.tied:
        put("output.weight", mat(V, D), big)

    def mla_block(p):
        if ql:
            put(p + "attn_q_a.weight", mat(ql, D), big)                     # ne {D, q_lora}
            put(p + "attn_q_a_norm.weight", norm(ql), small)
            put(p + "attn_q_b.weight", mat(H * (dn + dr), ql), big)         # ne {q_lora, H*(dn+dr)}
        else:
            put(p + "attn_q.weight", mat(H * (dn + dr), D), big)            # ne {D, H*(dn+dr)}
        put(p + "attn_kv_a_mqa.weight", mat(R + dr, D), big)                # ne {D, R+dr}
        put(p + "attn_kv_a_norm.weight", norm(R), small)
        put(p + "attn_k_b.weight", rng.standard_normal((H, R, dn)) / np.sqrt(R), big)   # ne {dn, R, H}
        put(p + "attn_v_b.weight", rng.standard_normal((H, dvm, R)) / np.sqrt(R), big)  # ne {R, dv, H}
        put(p + "attn_output.weight", mat(D, H * dvm), big)                 # ne {H*dv, D}

    def attention_block(p):
        put(p + "attn_q.weight", mat(2 * H * hd, D), big)
        put(p + "attn_k.weight", mat(Hkv * hd, D), big)
        put(p + "attn_v.weight", mat(Hkv * hd, D), big)
        put(p + "attn_output.weight", mat(D, H * hd), big)
        put(p + "attn_q_norm.weight", norm(hd), small)
        put(p + "attn_k_norm.weight", norm(hd), small)

    def deltanet_block(p):
        put(p + "attn_qkv.weight", mat(conv_dim, D), big)
        put(p + "attn_gate.weight", mat(value_dim, D), big)
        put(p + "ssm_beta.weight", mat(nv, D), big)
        put(p + "ssm_alpha.weight", mat(nv, D), big)
        put(p + "ssm_conv1d.weight", rng.standard_normal((conv_dim, K)) / np.sqrt(K), small)
        put(p + "ssm_dt.bias", rng.uniform(-2.0, 1.0, nv), small)
        put(p + "ssm_a", -np.exp(rng.uniform(np.log(0.05), np.log(2.0), nv)), small)
        put(p + "ssm_norm.weight", norm(dv), small)
        put(p + "ssm_out.weight", mat(D, value_dim), big)

    for il in range(n_block):
        p = "blk.%d." % il
        put(p + "attn_norm.weight", norm(D), small)
        kind = kinds[il] if il < a.layers else 0
        if kind == 2:
            mla_block(p)
        elif kind == 1:
            deltanet_block(p)
        else:
            attention_block(p)
        if il >= a.layers:  # MTP-like extras, never used by the trunk
            put(p + "nextn.eh_proj.weight", mat(D, 2 * D), big)
            put(p + "nextn.enorm.weight", norm(D), small)
            put(p + "nextn.hnorm.weight", norm(D), small)
            put(p + "nextn.shared_head_norm.weight", norm(D), small)
        put(p + ("ffn_norm.weight" if arch == "deepseek2" else "post_attention_norm.weight"), norm(D), small)
        put(p + "ffn_gate.weight", mat(F, D), big)
        put(p + "ffn_up.weight", mat(F, D), big)
        put(p + "ffn_down.weight", mat(D, F), big)
    return w


def main(argv=None):
    a = parse_args(argv)
    build(a).write(a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

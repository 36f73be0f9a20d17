"""export.py - write the trained model as a `qwen35` GGUF, and read it back.

Owns: the mapping between model.py's parameters and the GGUF tensors and
metadata of docs/models.md section 2 (names 2.4, ne shapes, keys 2.2), in
exactly the form llama.cpp's converter writes for Qwen3.5:
  - 2-D projections in --dtype (F16 by default), token_embd included; no
    output.weight (tied embeddings);
  - 1-D tensors, norms, ssm_conv1d, ssm_a, ssm_dt.bias in F32 (2.3 item 8);
  - ssm_a = -exp(A_log) (2.3 item 1); ssm_conv1d ne = {K, conv_dim} (item 3);
  - norm weights written as they are: model.py already keeps them as final
    multipliers, which is what GGUF stores after the converter's +1 (item 4);
  - n_v = n_k, so the tiled value-head permutation (item 6) is the identity.
Uses tests/ref/gguf_io.py's writer and reader (the project's own).
Does not: train or evaluate.
"""

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "ref"))
from gguf_io import GGUFReader, GGUFWriter, T_INT32  # noqa: E402

from bpe import Tokenizer  # noqa: E402
from model import Config, Model  # noqa: E402

ARCH = "qwen35"


def rope_sections(n_rot):
    """MRoPE sections [t, h, w, 0] summing to n_rot/2 (text-only: all equal the
    token position, so they do not change the math; the key is required)."""
    half = n_rot // 2
    a = (half + 2) // 3
    b = (half - a + 1) // 2
    return [a, b, half - a - b, 0]


def _np(p):
    return p.detach().to(torch.float64).cpu().numpy()


def tensor_map(m):
    """[(gguf name, torch tensor as stored, small)] in file order; small
    tensors are written F32, the others in the chosen dtype."""
    c = m.c
    out = [("token_embd.weight", m.tok_embd, False),
           ("output_norm.weight", m.output_norm, True)]
    for il, blk in enumerate(m.blocks):
        p = "blk.%d." % il
        out.append((p + "attn_norm.weight", blk.attn_norm, True))
        x = blk.mixer
        if c.is_attn(il):
            out += [(p + "attn_q.weight", x.wq, False),
                    (p + "attn_k.weight", x.wk, False),
                    (p + "attn_v.weight", x.wv, False),
                    (p + "attn_output.weight", x.wo, False),
                    (p + "attn_q_norm.weight", x.q_norm, True),
                    (p + "attn_k_norm.weight", x.k_norm, True)]
        else:
            out += [(p + "attn_qkv.weight", x.qkv, False),
                    (p + "attn_gate.weight", x.z, False),
                    (p + "ssm_beta.weight", x.b, False),
                    (p + "ssm_alpha.weight", x.a, False),
                    (p + "ssm_conv1d.weight", x.conv, True),
                    (p + "ssm_dt.bias", x.dt_bias, True),
                    (p + "ssm_a", x.A_log, True),      # transformed: -exp(A_log)
                    (p + "ssm_norm.weight", x.norm, True),
                    (p + "ssm_out.weight", x.out, False)]
        out += [(p + "post_attention_norm.weight", blk.post_norm, True),
                (p + "ffn_gate.weight", blk.ffn_gate, False),
                (p + "ffn_up.weight", blk.ffn_up, False),
                (p + "ffn_down.weight", blk.ffn_down, False)]
    return out


def export(m, tok, path, dtype="f16", name="hyserve-default", description=""):
    c = m.c
    nk, dk = c.ssm_n_k, c.ssm_d_k
    w = GGUFWriter()
    w.add_string("general.architecture", ARCH)
    w.add_string("general.name", name)
    if description:
        w.add_string("general.description", description)
    w.add_u32("general.file_type", {"f32": 0, "f16": 1, "bf16": 32}[dtype])
    w.add_u32(ARCH + ".block_count", c.n_layer)
    w.add_u32(ARCH + ".context_length", c.n_ctx)
    w.add_u32(ARCH + ".embedding_length", c.n_embd)
    w.add_u32(ARCH + ".feed_forward_length", c.n_ff)
    w.add_u32(ARCH + ".attention.head_count", c.n_head)
    w.add_u32(ARCH + ".attention.head_count_kv", c.n_head_kv)
    w.add_u32(ARCH + ".attention.key_length", c.head_dim)
    w.add_u32(ARCH + ".attention.value_length", c.head_dim)
    w.add_f32(ARCH + ".attention.layer_norm_rms_epsilon", c.eps)
    w.add_f32(ARCH + ".rope.freq_base", c.rope_theta)
    w.add_u32(ARCH + ".rope.dimension_count", c.n_rot)
    w.add_array(ARCH + ".rope.dimension_sections", T_INT32, rope_sections(c.n_rot))
    w.add_u32(ARCH + ".ssm.conv_kernel", c.conv_k)
    w.add_u32(ARCH + ".ssm.state_size", dk)
    w.add_u32(ARCH + ".ssm.group_count", nk)
    w.add_u32(ARCH + ".ssm.time_step_rank", nk)         # n_v = n_k
    w.add_u32(ARCH + ".ssm.inner_size", nk * dk)
    w.add_u32(ARCH + ".full_attention_interval", c.attn_interval)
    tok.gguf_metadata(w)
    for gname, p, small in tensor_map(m):
        a = _np(p)
        if gname.endswith("ssm_a"):
            a = -np.exp(a)
        w.add_tensor(gname, a, "f32" if small else dtype)
    w.write(path)


def load(path):
    """(Model in float32 with the file's values, Tokenizer, Config) from a GGUF
    written by export(); every tensor's shape is checked against the config."""
    r = GGUFReader(path)
    kv = r.kv

    def hp(k):
        return kv[ARCH + "." + k]

    c = Config(n_vocab=len(kv["tokenizer.ggml.tokens"]), n_embd=hp("embedding_length"),
               n_layer=hp("block_count"), attn_interval=hp("full_attention_interval"),
               n_head=hp("attention.head_count"), n_head_kv=hp("attention.head_count_kv"),
               head_dim=hp("attention.key_length"), n_rot=hp("rope.dimension_count"),
               rope_theta=hp("rope.freq_base"), ssm_n_k=hp("ssm.group_count"),
               ssm_d_k=hp("ssm.state_size"), conv_k=hp("ssm.conv_kernel"),
               n_ff=hp("feed_forward_length"), eps=hp("attention.layer_norm_rms_epsilon"),
               n_ctx=hp("context_length"))
    if hp("ssm.time_step_rank") != c.ssm_n_k:
        raise ValueError("%s: n_v != n_k is not what export.py writes" % path)
    m = Model(c)
    with torch.no_grad():
        for gname, p, _ in tensor_map(m):
            a = r.tensor(gname)
            if gname.endswith("ssm_a"):
                a = np.log(-a)
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError("%s: tensor %s has shape %s, expected %s" % (path, gname, a.shape, tuple(p.shape)))
            p.copy_(torch.from_numpy(a).to(p.dtype))
    return m, Tokenizer.from_gguf(r), c

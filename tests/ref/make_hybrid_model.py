#!/usr/bin/python3
"""make_hybrid_model.py - writes a small seeded random GGUF of a hybrid architecture, laid out
as llama.cpp's converter writes it and its loader reads it (metadata keys, tensor names, ne
shapes), with gguf_io's writer.

Owns: the synthetic files of these llama.cpp architectures (general.architecture):
  qwen35moe      Qwen3.5-MoE: qwen35's Gated DeltaNet (value heads in the converter's TILED
                 order: value head h uses key head h % n_k) and gated attention; every FFN is a
                 routed MoE (softmax, top-k, renormalised) plus a sigmoid-gated shared expert.
  granitehybrid  Granite-4.0-H: Mamba-2 layers and GQA attention layers (NoPE by default, as
                 the converter writes rope.scaling.finetuned = false whenever there is a Mamba
                 layer), a dense SwiGLU FFN or a MoE + ungated shared expert on every layer,
                 and Granite's four multipliers (embedding_scale, residual_scale, logit_scale,
                 attention.scale).
  nemotron_h     Nemotron-H: each layer ONE of Mamba-2 / attention (no RoPE) / MLP-only
                 (relu^2, no gate), single pre-norm + residual per layer.
  nemotron_h_moe Nemotron-3 (Nano / Super): nemotron_h whose MLP layers are MoE: sigmoid router
                 with exp_probs_b selection bias, relu^2 experts (up / down only) on an optional
                 latent projection (ffn_latent_down / ffn_latent_up), a relu^2 shared expert;
                 expert_weights_norm and expert_weights_scale as the converter writes them.
  lfm2           LFM2: gated short-conv layers (in_proj -> B, C, x; conv(B*x) * C) and GQA
                 layers with per-head q/k RMSNorm and NeoX RoPE; dense SwiGLU on every layer;
                 final norm `token_embd_norm`, tied embeddings.
  lfm2moe        LFM2-MoE (LFM2-8B-A1B): lfm2 with a SwiGLU MoE (sigmoid router + exp_probs_b,
                 expert_gating_func) from layer leading_dense_block_count on; no shared expert.
  falcon-h1      Falcon-H1: attention and Mamba-2 in PARALLEL in every layer, then a SwiGLU
                 FFN (no pattern: all layers are both).
  jamba          Jamba: Mamba-1 layers (with the dt/B/C RMSNorms) and GQA attention (no RoPE),
                 each layer's FFN dense or MoE (softmax top-k, NOT renormalised).
  kimi-linear    Kimi-Linear: KDA layers (Kimi Delta Attention: gated delta rule with a per-key-
                 channel decay, separate short convs on q / k / v, sigmoid-gated output norm) and
                 MLA layers WITHOUT RoPE (attn_k_b / attn_v_b split as the converter writes them);
                 leading dense SwiGLU blocks, then MoE (sigmoid router + exp_probs_b selection
                 bias, renormalised, times expert_weights_scale) plus an ungated shared expert.
Layer kinds (--pattern, one letter per layer):
  qwen35moe      L = Gated DeltaNet, A = gated attention      (default: interval 4, LLLA...)
  granitehybrid  M = Mamba-2, A = attention                   (default MMAM...)
  nemotron_h     M = Mamba-2, A = attention, F = MLP-only     (default MFAFMF...; HF's
                 hybrid_override_pattern characters M / * / - are accepted too)
  nemotron_h_moe M = Mamba-2, A = attention, E = MoE MLP      (default MEMEAE; HF's M / * / E too;
                 with --experts 0 the E layers are nemotron_h's dense relu^2 MLP)
  lfm2, lfm2moe  C = short conv, A = attention                (default CCAC...; lfm2moe's FFN kind is
                 set by --dense-lead, the leading_dense_block_count)
  jamba          M = Mamba-1, A = attention; append 'e' to a letter for a MoE FFN on that layer
                 (e.g. MeAMMe); default MAMe
  kimi-linear    K = KDA, M = MLA                             (default KKKM...; the FFN kind is set by
                 --dense-lead, the leading_dense_block_count)
  falcon-h1      no pattern (every layer is attention + Mamba-2)
How the kinds are written: qwen35moe full_attention_interval (a pattern that is no interval
is written as make_model.py does for qwen35, as the bool array attention.recurrent_layers);
granitehybrid / lfm2 / jamba attention.head_count_kv as an INT32 array with 0 for the
non-attention layers; nemotron_h / nemotron_h_moe that array plus feed_forward_length as an
INT32 array (non-zero only on the MLP layers: nemotron_h_moe's converter writes the expert size
there), which is how llama.cpp tells the three kinds apart.
Does not: produce meaningful weights (random, scaled so the activations stay O(1)), write
biases other than the ones the converters always write, or MTP blocks other than qwen35moe's
(--nextn N: N blocks after the trunk, each a gated attention layer with the MoE FFN plus
nextn.eh_proj / enorm / hnorm / shared_head_norm and, with --nextn-embed / --nextn-head, its own
nextn.embed_tokens / shared_head_head; block_count = layers + N, nextn_predict_layers = N).

Weight types: as make_model.py: 2-D/3-D projections and the embedding in --dtype (f32 default;
f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k through quants.py; a tensor whose ne[0] is not a multiple
of the block falls back to q8_0 or f16), 1-D tensors, norms, convolutions, ssm_a / ssm_d /
biases and routers in --small-dtype (F32).

Examples:
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/q.gguf --arch qwen35moe --layers 4
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/g.gguf --arch granitehybrid --pattern MMAM \
      --experts 4 --experts-used 2 --expert-ff 32 --shared-ff 64
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/n.gguf --arch nemotron_h --pattern MFAFMF
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/nm.gguf --arch nemotron_h_moe --pattern MEMEAE \
      --experts 8 --experts-used 2 --expert-ff 32 --shared-ff 48 --latent 32 [--no-norm-w] [--routed-scale 2.5]
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/l.gguf --arch lfm2 --pattern CCACCA --dtype q8_0
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/lm.gguf --arch lfm2moe --pattern CCACCA --dense-lead 1 \
      [--gating-func 1]
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/f.gguf --arch falcon-h1 --layers 3 [--no-ssm-norm]
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/j.gguf --arch jamba --layers 5 --pattern MAMeMAe
  /usr/bin/python3 tests/ref/make_hybrid_model.py -o /tmp/k.gguf --arch kimi-linear --pattern KKKM \
      [--q-lora 24] [--dense-lead 1] [--kda-head-dim 16 --kv-lora 32 --mla-nope 16 --mla-rope 8 --mla-vdim 16]
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_io import GGUFWriter, T_BOOL, T_INT32, T_STRING  # noqa: E402
import make_model  # noqa: E402  (gpt2_byte_strings, weight_dtype, rope_sections, dtype tables)

ARCHS = ("qwen35moe", "granitehybrid", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "falcon-h1", "jamba",
         "kimi-linear")
LETTERS = {"qwen35moe": "LA", "granitehybrid": "MA", "nemotron_h": "MAF", "nemotron_h_moe": "MAE", "lfm2": "CA",
           "lfm2moe": "CA", "jamba": "MA",
           "kimi-linear": "KM"}
DEFAULT_PATTERN = {"granitehybrid": "MMAM", "nemotron_h": "MFAFMF", "nemotron_h_moe": "MEMEAE", "lfm2": "CCAC",
                   "lfm2moe": "CCAC", "jamba": "MAMe",
                   "kimi-linear": "KKKM"}
NEMOTRON_HF = {"M": "M", "*": "A", "-": "F"}
NEMOTRON_MOE_HF = {"M": "M", "*": "A", "E": "E"}
TOKENIZER_PRE = {"qwen35moe": "qwen35"}  # the others: "gpt-2" (hyserve's byte-level rule; the
#                                          real files carry their own pre names)
FLOAT_DTYPES = make_model.FLOAT_DTYPES
QUANT_DTYPES = make_model.QUANT_DTYPES
FILE_TYPE = make_model.FILE_TYPE

# per-architecture defaults (None in argparse = take these)
DEFAULTS = {
    "qwen35moe": dict(layers=4, heads=4, kv_heads=2, head_dim=16, rope_dim=8, rope_theta=1e7, experts=8,
                      experts_used=2, expert_ff=32, shared_ff=64, ff=0, tied=False),
    "granitehybrid": dict(layers=4, heads=4, kv_heads=2, head_dim=None, rope_dim=None, rope_theta=1e4,
                          ssm_heads=8, ssm_state=16, ssm_groups=2, experts=0, experts_used=2, expert_ff=32,
                          shared_ff=64, ff=96, tied=True),
    "nemotron_h": dict(layers=6, heads=4, kv_heads=2, head_dim=16, rope_dim=None, rope_theta=1e4,
                       ssm_heads=8, ssm_head_dim=8, ssm_state=16, ssm_groups=2, ff=96, tied=False),
    "nemotron_h_moe": dict(layers=6, heads=4, kv_heads=2, head_dim=16, rope_dim=None, rope_theta=1e4,
                           ssm_heads=8, ssm_head_dim=8, ssm_state=16, ssm_groups=2, ff=96, experts=8,
                           experts_used=2, expert_ff=32, shared_ff=48, tied=False),
    "lfm2": dict(layers=4, heads=4, kv_heads=2, head_dim=None, rope_dim=None, rope_theta=1e6, ff=96,
                 conv_k=3, tied=True),
    "lfm2moe": dict(layers=4, heads=4, kv_heads=2, head_dim=None, rope_dim=None, rope_theta=1e6, ff=96,
                    conv_k=3, experts=4, experts_used=2, expert_ff=32, tied=True),
    "falcon-h1": dict(layers=3, heads=4, kv_heads=2, head_dim=16, rope_dim=None, rope_theta=1e6,
                      ssm_heads=8, ssm_head_dim=8, ssm_state=16, ssm_groups=2, ff=96, tied=False),
    "jamba": dict(layers=4, heads=4, kv_heads=2, head_dim=None, rope_dim=None, rope_theta=1e4,
                  ssm_state=16, ssm_dt_rank=8, conv_k=4, experts=4, experts_used=2, ff=96, tied=False),
    "kimi-linear": dict(layers=4, heads=4, kv_heads=1, head_dim=16, rope_dim=None, rope_theta=1e4, conv_k=4,
                        experts=4, experts_used=2, expert_ff=32, ff=96, tied=False),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="write a random hybrid-architecture GGUF (llama.cpp layout)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--arch", choices=ARCHS, default="granitehybrid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--pattern", default=None, help="layer kinds, one letter per layer (see the module doc)")
    ap.add_argument("--interval", type=int, default=None, help="qwen35moe: full_attention_interval (default 4)")
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=None,
                    help="attention head dim (qwen35moe / nemotron_h(_moe) / falcon-h1 write key_length; "
                         "granitehybrid / lfm2(moe) / jamba use embd / heads)")
    ap.add_argument("--rope-dim", type=int, default=None, help="rotary dims (qwen35moe default 8, else head dim)")
    ap.add_argument("--rope-theta", type=float, default=None)
    ap.add_argument("--ff", type=int, default=None, help="dense FFN / MLP size (feed_forward_length)")
    # Gated DeltaNet (qwen35moe)
    ap.add_argument("--nk", type=int, default=2, help="qwen35moe: DeltaNet key heads (ssm.group_count)")
    ap.add_argument("--nv", type=int, default=4, help="qwen35moe: DeltaNet value heads (ssm.time_step_rank)")
    ap.add_argument("--dk", type=int, default=16, help="qwen35moe: DeltaNet head dim (ssm.state_size)")
    # Mamba-2 / Mamba-1
    ap.add_argument("--ssm-heads", type=int, default=None, help="Mamba-2 heads (ssm.time_step_rank)")
    ap.add_argument("--ssm-head-dim", type=int, default=None,
                    help="Mamba-2 head dim (nemotron_h / falcon-h1; granitehybrid: 2*embd/ssm-heads)")
    ap.add_argument("--ssm-state", type=int, default=None, help="ssm.state_size (d_state)")
    ap.add_argument("--ssm-groups", type=int, default=None, help="Mamba-2 ssm.group_count (n_group)")
    ap.add_argument("--ssm-dt-rank", type=int, default=None, help="jamba (Mamba-1): ssm.time_step_rank")
    ap.add_argument("--conv-k", type=int, default=None,
                    help="conv kernel (ssm.conv_kernel; lfm2: shortconv.l_cache, default 3; others 4)")
    # MoE
    ap.add_argument("--experts", type=int, default=None,
                    help="expert_count (granitehybrid / nemotron_h_moe: 0 = dense FFN)")
    ap.add_argument("--experts-used", type=int, default=None)
    ap.add_argument("--expert-ff", type=int, default=None, help="expert FFN size")
    ap.add_argument("--shared-ff", type=int, default=None, help="shared expert FFN size (0 = none)")
    ap.add_argument("--router-gain", type=float, default=2.0)
    # Granite multipliers (0 = key not written)
    ap.add_argument("--embedding-scale", type=float, default=2.0)
    ap.add_argument("--residual-scale", type=float, default=0.5)
    ap.add_argument("--logit-scale", type=float, default=4.0)
    ap.add_argument("--attention-scale", type=float, default=0.125)
    ap.add_argument("--rope", action="store_true",
                    help="granitehybrid: write rope.scaling.finetuned = true (Bamba's shape: NORM RoPE)")
    # Kimi-Linear
    ap.add_argument("--kda-head-dim", type=int, default=16, help="kimi-linear: kda.head_dim")
    ap.add_argument("--kv-lora", type=int, default=32, help="kimi-linear MLA: attention.kv_lora_rank")
    ap.add_argument("--q-lora", type=int, default=0, help="kimi-linear MLA: attention.q_lora_rank (0 = attn_q)")
    ap.add_argument("--mla-nope", type=int, default=16, help="kimi-linear MLA: qk_nope_head_dim")
    ap.add_argument("--mla-rope", type=int, default=8,
                    help="kimi-linear MLA: qk_rope_head_dim (rope.dimension_count; no rotation is applied)")
    ap.add_argument("--mla-vdim", type=int, default=16, help="kimi-linear MLA: attention.value_length_mla")
    ap.add_argument("--shared-experts", type=int, default=1, help="kimi-linear / nemotron_h_moe: expert_shared_count")
    ap.add_argument("--dense-lead", type=int, default=1,
                    help="kimi-linear / lfm2moe: leading_dense_block_count")
    ap.add_argument("--routed-scale", type=float, default=2.446,
                    help="kimi-linear / nemotron_h_moe: expert_weights_scale (nemotron_h_moe: 0 = key not written)")
    # Nemotron-3 MoE / LFM2-MoE
    ap.add_argument("--latent", type=int, default=32,
                    help="nemotron_h_moe: moe_latent_size, ffn_latent_down / ffn_latent_up (0 = none)")
    norm_w = ap.add_mutually_exclusive_group()
    norm_w.add_argument("--norm-w", dest="norm_w", action="store_true", default=True,
                        help="nemotron_h_moe: expert_weights_norm = true (the default; HF norm_topk_prob)")
    norm_w.add_argument("--no-norm-w", dest="norm_w", action="store_false",
                        help="nemotron_h_moe: expert_weights_norm = false")
    ap.add_argument("--gating-func", type=int, choices=(1, 2), default=2,
                    help="lfm2moe: expert_gating_func (2 sigmoid, the converter's; 1 softmax)")
    ap.add_argument("--no-ssm-norm", action="store_true",
                    help="falcon-h1: no ssm_norm (HF mamba_rms_norm = false; the gate alone)")
    # MTP blocks (qwen35moe)
    ap.add_argument("--nextn", type=int, default=0,
                    help="qwen35moe: append N MTP blocks (the trunk ignores them), nextn_predict_layers = N")
    ap.add_argument("--nextn-embed", action="store_true", help="with --nextn: own nextn.embed_tokens.weight")
    ap.add_argument("--nextn-head", action="store_true", help="with --nextn: own nextn.shared_head_head.weight")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--context", type=int, default=4096)
    tied = ap.add_mutually_exclusive_group()
    tied.add_argument("--tied", dest="tied", action="store_true", default=None)
    tied.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--dtype", choices=FLOAT_DTYPES + QUANT_DTYPES, default="f32")
    ap.add_argument("--small-dtype", choices=FLOAT_DTYPES, default="f32")
    ap.add_argument("--alignment", type=int, default=32)
    a = ap.parse_args(argv)

    d = DEFAULTS[a.arch]
    for k in ("layers", "heads", "kv_heads", "head_dim", "rope_dim", "rope_theta", "ff", "experts", "experts_used",
              "expert_ff", "shared_ff", "ssm_heads", "ssm_head_dim", "ssm_state", "ssm_groups", "ssm_dt_rank",
              "conv_k", "tied"):
        if getattr(a, k) is None:
            setattr(a, k, d.get(k))
    if a.conv_k is None:
        a.conv_k = 4
    if a.arch == "kimi-linear":
        a.head_dim = a.kda_head_dim
        a.rope_dim = a.mla_rope
    if a.arch in ("granitehybrid", "lfm2", "lfm2moe", "jamba"):
        if a.head_dim is not None and a.head_dim * a.heads != a.embd:
            ap.error("%s: the head dim is embd / heads (no key_length key)" % a.arch)
        a.head_dim = a.embd // a.heads
    if a.rope_dim is None:
        a.rope_dim = a.head_dim
    if a.heads % a.kv_heads or a.rope_dim % 2 or a.rope_dim > a.head_dim:
        ap.error("need heads %% kv-heads == 0, even rope-dim <= head-dim")
    if a.vocab < 256:
        ap.error("--vocab must be >= 256 (byte-level tokens)")

    # layer kinds
    a.kinds = None
    a.moe_layers = None
    if a.arch == "qwen35moe":
        if a.pattern is not None and a.interval is not None:
            ap.error("--pattern or --interval, not both")
        if a.pattern is not None:
            if len(a.pattern) != a.layers or set(a.pattern) - set("LA"):
                ap.error("--pattern must be %d letters of L/A" % a.layers)
            a.kinds = list(a.pattern)
        else:
            a.interval = a.interval or 4
            a.kinds = ["A" if (i + 1) % a.interval == 0 else "L" for i in range(a.layers)]
    elif a.arch == "falcon-h1":
        if a.pattern is not None:
            ap.error("falcon-h1 has no pattern: every layer is attention + Mamba-2")
        a.kinds = ["P"] * a.layers
    else:
        pat = a.pattern
        if pat is None:
            if a.arch == "jamba":
                cells = ["M", "A", "Me", "M"]
                pat = "".join(cells[i % 4] for i in range(a.layers))
            else:
                base = DEFAULT_PATTERN[a.arch]
                pat = (base * a.layers)[:a.layers]
        if a.arch == "nemotron_h":
            pat = "".join(NEMOTRON_HF.get(c, c) for c in pat)
        if a.arch == "nemotron_h_moe":
            pat = "".join(NEMOTRON_MOE_HF.get(c, c) for c in pat)
        if a.arch == "jamba":
            kinds, moe = [], []
            for c in pat:
                if c == "e":
                    if not moe:
                        ap.error("--pattern: 'e' must follow a layer letter")
                    moe[-1] = True
                    continue
                kinds.append(c)
                moe.append(False)
            a.kinds, a.moe_layers = kinds, moe
        else:
            a.kinds = list(pat)
        if len(a.kinds) != a.layers or set(a.kinds) - set(LETTERS[a.arch]):
            ap.error("--pattern must give %d layers of %s for %s" % (a.layers, "/".join(LETTERS[a.arch]), a.arch))
        a.pattern = pat

    # recurrent sizes
    if a.arch in ("granitehybrid", "nemotron_h", "nemotron_h_moe", "falcon-h1"):
        if a.arch == "granitehybrid":
            a.d_inner = 2 * a.embd                      # llama.cpp asserts d_inner == 2 * n_embd
            if a.d_inner % a.ssm_heads:
                ap.error("granitehybrid: ssm-heads must divide 2 * embd")
            a.ssm_head_dim = a.d_inner // a.ssm_heads
        else:
            a.d_inner = a.ssm_heads * a.ssm_head_dim
        if a.ssm_heads % a.ssm_groups or a.d_inner % a.ssm_groups:
            ap.error("need ssm-heads and d_inner multiples of ssm-groups")
    if a.arch == "jamba":
        a.d_inner = 2 * a.embd
    if a.arch == "qwen35moe" and a.nv % a.nk:
        ap.error("qwen35moe: need nv %% nk == 0")
    if a.nextn and a.arch != "qwen35moe":
        ap.error("--nextn only applies to qwen35moe")
    if a.nextn < 0 or ((a.nextn_embed or a.nextn_head) and not a.nextn):
        ap.error("need --nextn >= 0, and --nextn for --nextn-embed / --nextn-head")
    if a.experts and not 0 < a.experts_used <= a.experts:
        ap.error("need 0 < --experts-used <= --experts")
    if a.arch == "nemotron_h_moe" and a.experts and not a.shared_ff:
        ap.error("nemotron_h_moe: the loader requires the shared expert (--shared-ff > 0)")
    if a.arch == "nemotron_h_moe" and a.latent < 0:
        ap.error("--latent must be >= 0")
    if a.arch == "lfm2moe" and not (a.experts and 0 <= a.dense_lead <= a.layers):
        ap.error("lfm2moe: need --experts > 0 and 0 <= --dense-lead <= layers")
    return a


class _DtypeShim:
    """What make_model.weight_dtype reads from its argument namespace."""

    def __init__(self, a):
        self.dtype = a.dtype
        self.arch = a.arch
        self.experts = a.experts or 0
        self.tied = a.tied


def write_tokenizer(w, a):
    V = a.vocab
    toks = make_model.gpt2_byte_strings() + ["[PAD%d]" % i for i in range(256, V)]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", TOKENIZER_PRE.get(a.arch, "gpt-2"))   # llama.cpp's name of the rule
    w.add_array("tokenizer.ggml.tokens", T_STRING, toks)
    w.add_array("tokenizer.ggml.token_type", T_INT32, [1] * 256 + [5] * (V - 256))
    w.add_array("tokenizer.ggml.merges", T_STRING, [])
    w.add_u32("tokenizer.ggml.eos_token_id", V - 1)


def inv_softplus(y):
    return np.log(np.expm1(y))


def build(a):
    rng = np.random.default_rng(a.seed)
    D, V = a.embd, a.vocab
    H, Hkv, hd = a.heads, a.kv_heads, a.head_dim
    ARCH = a.arch
    small = a.small_dtype
    shim = _DtypeShim(a)
    w = GGUFWriter(alignment=a.alignment)

    def mat(n_out, n_in, gain=1.0):
        return rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))

    def norm(*shape):
        return 1.0 + 0.1 * rng.standard_normal(shape)

    def W(name, arr):
        w.add_tensor(name, arr, make_model.weight_dtype(shim, name, arr.shape[-1]))

    def S(name, arr):
        w.add_tensor(name, arr, small)

    def key(k):
        return ARCH + "." + k

    # ---- metadata -------------------------------------------------------------------------
    w.add_string("general.architecture", ARCH)
    w.add_string("general.name", "hyserve-ref-hybrid %s seed %d" % (ARCH, a.seed))
    w.add_u32("general.file_type", FILE_TYPE[a.dtype])
    if a.dtype in QUANT_DTYPES:
        w.add_u32("general.quantization_version", 2)
    w.add_u32(key("block_count"), a.layers + a.nextn)
    if a.nextn:
        w.add_u32(key("nextn_predict_layers"), a.nextn)
    w.add_u32(key("context_length"), a.context)
    w.add_u32(key("embedding_length"), D)
    kinds = a.kinds
    hkv_arr = [Hkv if k in ("A", "P") else 0 for k in kinds]
    if ARCH == "qwen35moe":
        w.add_u32(key("attention.head_count"), H)
        w.add_u32(key("attention.head_count_kv"), Hkv)
        w.add_u32(key("attention.key_length"), hd)
        w.add_u32(key("attention.value_length"), hd)
        w.add_f32(key("attention.layer_norm_rms_epsilon"), a.eps)
        w.add_f32(key("rope.freq_base"), a.rope_theta)
        w.add_u32(key("rope.dimension_count"), a.rope_dim)
        w.add_array(key("rope.dimension_sections"), T_INT32, make_model.rope_sections(a.rope_dim))
        w.add_u32(key("ssm.conv_kernel"), a.conv_k)
        w.add_u32(key("ssm.state_size"), a.dk)
        w.add_u32(key("ssm.group_count"), a.nk)
        w.add_u32(key("ssm.time_step_rank"), a.nv)
        w.add_u32(key("ssm.inner_size"), a.nv * a.dk)
        interval_ok = a.interval is not None or all(
            (k == "A") == ((i + 1) % 4 == 0) for i, k in enumerate(kinds))
        if a.interval is not None:
            w.add_u32(key("full_attention_interval"), a.interval)
        elif interval_ok:
            w.add_u32(key("full_attention_interval"), 4)
        else:
            w.add_array(key("attention.recurrent_layers"), T_BOOL, [k == "L" for k in kinds] + [False] * a.nextn)
        w.add_u32(key("expert_count"), a.experts)
        w.add_u32(key("expert_used_count"), a.experts_used)
        w.add_u32(key("expert_feed_forward_length"), a.expert_ff)
        w.add_u32(key("expert_shared_feed_forward_length"), a.shared_ff)
    elif ARCH in ("granitehybrid", "nemotron_h", "nemotron_h_moe", "falcon-h1"):
        w.add_u32(key("vocab_size"), V)
        if ARCH == "nemotron_h":
            w.add_array(key("feed_forward_length"), T_INT32, [a.ff if k == "F" else 0 for k in kinds])
        elif ARCH == "nemotron_h_moe":       # the converter: moe_intermediate_size on the MoE layers
            n_ff = a.expert_ff if a.experts else a.ff
            w.add_array(key("feed_forward_length"), T_INT32, [n_ff if k == "E" else 0 for k in kinds])
        elif ARCH == "granitehybrid" and a.experts:
            w.add_u32(key("feed_forward_length"), a.expert_ff)   # the expert size (HF intermediate_size)
        else:
            w.add_u32(key("feed_forward_length"), a.ff)
        w.add_u32(key("attention.head_count"), H)
        if ARCH == "falcon-h1":
            w.add_u32(key("attention.head_count_kv"), Hkv)
        else:
            w.add_array(key("attention.head_count_kv"), T_INT32, hkv_arr)
        if ARCH != "granitehybrid":
            w.add_u32(key("attention.key_length"), hd)
            w.add_u32(key("attention.value_length"), hd)
        w.add_f32(key("attention.layer_norm_rms_epsilon"), a.eps)
        w.add_f32(key("rope.freq_base"), a.rope_theta)
        if ARCH != "falcon-h1":                       # (LlamaModel's converter writes it; Falcon-H1's not)
            w.add_u32(key("rope.dimension_count"), a.rope_dim)
        w.add_u32(key("ssm.conv_kernel"), a.conv_k)
        w.add_u32(key("ssm.state_size"), a.ssm_state)
        w.add_u32(key("ssm.group_count"), a.ssm_groups)
        w.add_u32(key("ssm.inner_size"), a.d_inner)
        w.add_u32(key("ssm.time_step_rank"), a.ssm_heads)
        if ARCH in ("granitehybrid", "nemotron_h", "nemotron_h_moe"):
            w.add_bool(key("rope.scaling.finetuned"), bool(a.rope) and ARCH == "granitehybrid")
        if ARCH == "nemotron_h_moe" and a.experts:
            # NemotronHModel.set_gguf_parameters' MoE keys (HF n_routed_experts, num_experts_per_tok,
            # moe_(shared_expert_)intermediate_size, n_shared_experts, norm_topk_prob,
            # routed_scaling_factor, n_group / topk_group, moe_latent_size)
            w.add_u32(key("expert_count"), a.experts)
            w.add_u32(key("expert_used_count"), a.experts_used)
            w.add_u32(key("expert_feed_forward_length"), a.expert_ff)
            w.add_u32(key("expert_shared_feed_forward_length"), a.shared_ff)
            w.add_u32(key("expert_shared_count"), a.shared_experts)
            w.add_bool(key("expert_weights_norm"), bool(a.norm_w))
            if a.routed_scale:
                w.add_f32(key("expert_weights_scale"), a.routed_scale)
            w.add_u32(key("expert_group_count"), 1)
            w.add_u32(key("expert_group_used_count"), 1)
            if a.latent:
                w.add_u32(key("moe_latent_size"), a.latent)
        if ARCH == "granitehybrid":
            if a.attention_scale:
                w.add_f32(key("attention.scale"), a.attention_scale)
            if a.embedding_scale:
                w.add_f32(key("embedding_scale"), a.embedding_scale)
            if a.residual_scale:
                w.add_f32(key("residual_scale"), a.residual_scale)
            if a.logit_scale:
                w.add_f32(key("logit_scale"), a.logit_scale)
            if a.experts:
                w.add_u32(key("expert_count"), a.experts)
                w.add_u32(key("expert_used_count"), a.experts_used)
                if a.shared_ff:
                    w.add_u32(key("expert_shared_feed_forward_length"), a.shared_ff)
    elif ARCH in ("lfm2", "lfm2moe"):
        w.add_u32(key("feed_forward_length"), a.ff)
        w.add_u32(key("attention.head_count"), H)
        w.add_array(key("attention.head_count_kv"), T_INT32, hkv_arr)
        w.add_f32(key("rope.freq_base"), a.rope_theta)
        w.add_f32(key("attention.layer_norm_rms_epsilon"), a.eps)
        w.add_u32(key("vocab_size"), V)
        w.add_u32(key("shortconv.l_cache"), a.conv_k)
        if ARCH == "lfm2moe":                 # LFM2MoeModel.set_gguf_parameters (+ TextModel's expert keys)
            w.add_u32(key("expert_count"), a.experts)
            w.add_u32(key("expert_used_count"), a.experts_used)
            w.add_u32(key("expert_feed_forward_length"), a.expert_ff)
            w.add_u32(key("leading_dense_block_count"), a.dense_lead)
            w.add_u32(key("expert_gating_func"), a.gating_func)
    elif ARCH == "kimi-linear":
        w.add_u32(key("feed_forward_length"), a.ff)
        w.add_u32(key("attention.head_count"), H)
        w.add_array(key("attention.head_count_kv"), T_INT32, [1 if k == "M" else 0 for k in kinds])
        w.add_f32(key("attention.layer_norm_rms_epsilon"), a.eps)
        w.add_u32(key("vocab_size"), V)
        w.add_u32(key("ssm.conv_kernel"), a.conv_k)
        w.add_u32(key("kda.head_dim"), a.kda_head_dim)
        if a.q_lora:
            w.add_u32(key("attention.q_lora_rank"), a.q_lora)
        w.add_u32(key("attention.kv_lora_rank"), a.kv_lora)
        w.add_u32(key("rope.dimension_count"), a.mla_rope)
        w.add_u32(key("attention.key_length"), a.kv_lora + a.mla_rope)
        w.add_u32(key("attention.key_length_mla"), a.mla_nope + a.mla_rope)
        w.add_u32(key("attention.value_length_mla"), a.mla_vdim)
        w.add_u32(key("expert_count"), a.experts)
        w.add_u32(key("expert_used_count"), a.experts_used)
        w.add_u32(key("expert_gating_func"), 2)                  # sigmoid
        w.add_u32(key("expert_feed_forward_length"), a.expert_ff)
        w.add_u32(key("expert_shared_count"), a.shared_experts)
        w.add_u32(key("leading_dense_block_count"), a.dense_lead)
        w.add_f32(key("expert_weights_scale"), a.routed_scale)
    elif ARCH == "jamba":
        w.add_u32(key("feed_forward_length"), a.ff)
        w.add_u32(key("attention.head_count"), H)
        w.add_array(key("attention.head_count_kv"), T_INT32, hkv_arr)
        w.add_f32(key("attention.layer_norm_rms_epsilon"), a.eps)
        w.add_u32(key("ssm.conv_kernel"), a.conv_k)
        w.add_u32(key("ssm.inner_size"), a.d_inner)
        w.add_u32(key("ssm.state_size"), a.ssm_state)
        w.add_u32(key("ssm.time_step_rank"), a.ssm_dt_rank)
        w.add_u32(key("expert_count"), a.experts)
        w.add_u32(key("expert_used_count"), a.experts_used)
    write_tokenizer(w, a)

    # ---- tensors --------------------------------------------------------------------------
    W("token_embd.weight", rng.standard_normal((V, D)))                          # ne {D, V}
    if ARCH in ("lfm2", "lfm2moe"):
        S("token_embd_norm.weight", norm(D))    # LFM2's final norm (LLM_TENSOR_OUTPUT_NORM_LFM2)
    else:
        S("output_norm.weight", norm(D))
    if not a.tied:
        W("output.weight", mat(V, D))

    def attention(p, qk_norm=False, gated=False):
        W(p + "attn_q.weight", mat((2 if gated else 1) * H * hd, D))            # ne {D, (2*)H*hd}
        W(p + "attn_k.weight", mat(Hkv * hd, D))
        W(p + "attn_v.weight", mat(Hkv * hd, D))
        W(p + "attn_output.weight", mat(D, H * hd))                              # ne {H*hd, D}
        if qk_norm:
            S(p + "attn_q_norm.weight", norm(hd))
            S(p + "attn_k_norm.weight", norm(hd))

    def swiglu(p, F, suffix=""):
        W(p + "ffn_gate%s.weight" % suffix, mat(F, D))                           # ne {D, F}
        W(p + "ffn_up%s.weight" % suffix, mat(F, D))
        W(p + "ffn_down%s.weight" % suffix, mat(D, F))                           # ne {F, D}

    def experts(p, E, Fe):
        S(p + "ffn_gate_inp.weight", mat(E, D, a.router_gain))                   # ne {D, E}
        W(p + "ffn_gate_exps.weight", rng.standard_normal((E, Fe, D)) / np.sqrt(D))   # ne {D, Fe, E}
        W(p + "ffn_up_exps.weight", rng.standard_normal((E, Fe, D)) / np.sqrt(D))
        W(p + "ffn_down_exps.weight", rng.standard_normal((E, D, Fe)) / np.sqrt(Fe))  # ne {Fe, D, E}

    def deltanet(p):
        nk, nv, dk = a.nk, a.nv, a.dk
        dv = dk
        conv_dim = 2 * nk * dk + nv * dv
        W(p + "attn_qkv.weight", mat(conv_dim, D))                               # ne {D, conv_dim}
        W(p + "attn_gate.weight", mat(nv * dv, D))
        W(p + "ssm_beta.weight", mat(nv, D))
        W(p + "ssm_alpha.weight", mat(nv, D))
        S(p + "ssm_conv1d.weight", rng.standard_normal((conv_dim, a.conv_k)) / np.sqrt(a.conv_k))  # ne {K, conv_dim}
        S(p + "ssm_dt.bias", rng.uniform(-2.0, 1.0, nv))
        S(p + "ssm_a", -np.exp(rng.uniform(np.log(0.05), np.log(2.0), nv)))
        S(p + "ssm_norm.weight", norm(dv))
        W(p + "ssm_out.weight", mat(D, nv * dv))

    def mamba2(p, ssm_norm=True):
        di, ds, nh, ng, K = a.d_inner, a.ssm_state, a.ssm_heads, a.ssm_groups, a.conv_k
        conv_dim = di + 2 * ng * ds
        W(p + "ssm_in.weight", mat(2 * di + 2 * ng * ds + nh, D))               # ne {D, d_in_proj}: z|x|B|C|dt
        S(p + "ssm_conv1d.weight", rng.standard_normal((conv_dim, K)) / np.sqrt(K))    # ne {K, conv_dim}
        S(p + "ssm_conv1d.bias", 0.1 * rng.standard_normal(conv_dim))
        # dt_bias = softplus^-1 of a target step in [0.02, 0.5] (log-uniform), shifted down by 1
        # so that the N(0, 1) projection part keeps softplus(dt) mostly small
        S(p + "ssm_dt.bias", inv_softplus(np.exp(rng.uniform(np.log(0.02), np.log(0.5), nh))) - 1.0)
        S(p + "ssm_a", (-np.exp(rng.uniform(np.log(0.1), np.log(2.0), nh))).reshape(nh, 1))   # ne {1, nh}
        S(p + "ssm_d", rng.uniform(0.5, 1.5, nh).reshape(nh, 1))                 # ne {1, nh}
        if ssm_norm:
            S(p + "ssm_norm.weight", norm(ng, di // ng))                         # ne {di/ng, ng}
        W(p + "ssm_out.weight", mat(D, di))                                      # ne {di, D}

    def mamba1(p):
        di, ds, R, K = a.d_inner, a.ssm_state, a.ssm_dt_rank, a.conv_k
        W(p + "ssm_in.weight", mat(2 * di, D))                                   # ne {D, 2 di}: x|z
        S(p + "ssm_conv1d.weight", rng.standard_normal((di, K)) / np.sqrt(K))   # ne {K, di}
        S(p + "ssm_conv1d.bias", 0.1 * rng.standard_normal(di))
        W(p + "ssm_x.weight", mat(R + 2 * ds, di))                               # ne {di, R + 2 ds}: dt|B|C
        S(p + "ssm_dt_norm.weight", norm(R))
        S(p + "ssm_b_norm.weight", norm(ds))
        S(p + "ssm_c_norm.weight", norm(ds))
        W(p + "ssm_dt.weight", mat(di, R, 0.5))                                  # ne {R, di}
        S(p + "ssm_dt.bias", inv_softplus(np.exp(rng.uniform(np.log(0.02), np.log(0.3), di))))
        # A = -exp(A_log), A_log[d][n] = log(n+1) in the S4D-real init; here random rows around it
        A = -np.exp(np.log(np.arange(1, ds + 1))[None, :] * rng.uniform(0.3, 1.0, (di, 1)) + np.log(0.05))
        S(p + "ssm_a", A)                                                        # ne {ds, di}
        S(p + "ssm_d", rng.uniform(0.5, 1.5, di))                                # ne {di}
        W(p + "ssm_out.weight", mat(D, di))                                      # ne {di, D}

    def kda(p):
        hk, K = a.kda_head_dim, a.conv_k
        di = hk * H
        for n in ("q", "k", "v"):
            W(p + "attn_%s.weight" % n, mat(di, D))                             # ne {D, hk*H}
        for n in ("q", "k", "v"):
            S(p + "ssm_conv1d_%s.weight" % n, (rng.standard_normal((di, K)) / np.sqrt(K)).reshape(1, di, 1, K))
        W(p + "ssm_f_a.weight", mat(hk, D))                                      # ne {D, hk}
        W(p + "ssm_f_b.weight", mat(di, hk))                                     # ne {hk, hk*H}
        W(p + "ssm_beta.weight", mat(H, D))                                      # ne {D, H}
        S(p + "ssm_a", (-np.exp(rng.uniform(np.log(0.05), np.log(1.0), H))).reshape(1, 1, H, 1))  # ne {1,H,1,1}
        S(p + "ssm_dt.bias", rng.uniform(-3.0, 0.0, di))                         # ne {hk*H}
        W(p + "ssm_g_a.weight", mat(hk, D))
        W(p + "ssm_g_b.weight", mat(di, hk))
        S(p + "ssm_norm.weight", norm(hk))
        W(p + "attn_output.weight", mat(D, di))                                  # ne {hk*H, D}

    def mla(p):
        R, dn, dr, dv, ql = a.kv_lora, a.mla_nope, a.mla_rope, a.mla_vdim, a.q_lora
        if ql:
            W(p + "attn_q_a.weight", mat(ql, D))
            S(p + "attn_q_a_norm.weight", norm(ql))
            W(p + "attn_q_b.weight", mat(H * (dn + dr), ql))
        else:
            W(p + "attn_q.weight", mat(H * (dn + dr), D))                        # ne {D, H*(dn+dr)}
        W(p + "attn_kv_a_mqa.weight", mat(R + dr, D))                            # ne {D, R+dr}: c | k_pe
        S(p + "attn_kv_a_norm.weight", norm(R))
        W(p + "attn_k_b.weight", rng.standard_normal((H, R, dn)) / np.sqrt(R))  # ne {dn, R, H}
        W(p + "attn_v_b.weight", rng.standard_normal((H, dv, R)) / np.sqrt(R))  # ne {R, dv, H}
        W(p + "attn_output.weight", mat(D, H * dv))

    # qwen35moe MTP blocks (--nextn) follow the trunk: a gated attention layer with the MoE FFN and
    # the nextn tensors (make_model.nextn_core / nextn_extras, the same order of draws as qwen35)
    for il, kind in enumerate(kinds + ["mtp"] * a.nextn):
        p = "blk.%d." % il
        S(p + "attn_norm.weight", norm(D))
        if ARCH == "qwen35moe":
            if kind == "L":
                deltanet(p)
            else:
                attention(p, qk_norm=True, gated=True)
            if kind == "mtp":
                make_model.nextn_core(p, W, S, mat, norm, D)
            S(p + "post_attention_norm.weight", norm(D))
            experts(p, a.experts, a.expert_ff)
            if a.shared_ff:
                S(p + "ffn_gate_inp_shexp.weight", rng.standard_normal(D) / np.sqrt(D))   # ne {D}
                swiglu(p, a.shared_ff, "_shexp")
            if kind == "mtp":
                make_model.nextn_extras(p, W, rng, mat, D, V, a.nextn_embed, a.nextn_head)
        elif ARCH == "granitehybrid":
            if kind == "M":
                mamba2(p)
            else:
                attention(p)
            S(p + "ffn_norm.weight", norm(D))
            if a.experts:
                experts(p, a.experts, a.expert_ff)
                if a.shared_ff:
                    swiglu(p, a.shared_ff, "_shexp")
            else:
                swiglu(p, a.ff)
        elif ARCH == "nemotron_h":
            if kind == "M":
                mamba2(p)
            elif kind == "A":
                attention(p)
            else:
                W(p + "ffn_up.weight", mat(a.ff, D))                             # ne {D, F}
                W(p + "ffn_down.weight", mat(D, a.ff))                           # ne {F, D}
        elif ARCH == "nemotron_h_moe":
            if kind == "M":
                mamba2(p)
            elif kind == "A":
                attention(p)
            elif a.experts:
                E, Fe, Fs = a.experts, a.expert_ff, a.shared_ff
                Dl = a.latent or D
                S(p + "ffn_gate_inp.weight", mat(E, D, a.router_gain))               # ne {D, E}
                S(p + "exp_probs_b.bias", 0.3 * rng.standard_normal(E))              # ne {E} (e_score_correction)
                if a.latent:
                    W(p + "ffn_latent_down.weight", mat(Dl, D))                      # ne {D, latent}
                    W(p + "ffn_latent_up.weight", mat(D, Dl))                        # ne {latent, D}
                W(p + "ffn_up_exps.weight", rng.standard_normal((E, Fe, Dl)) / np.sqrt(Dl))    # ne {latent, Fe, E}
                W(p + "ffn_down_exps.weight", rng.standard_normal((E, Dl, Fe)) / np.sqrt(Fe))  # ne {Fe, latent, E}
                W(p + "ffn_up_shexp.weight", mat(Fs, D))                             # ne {D, Fs}
                W(p + "ffn_down_shexp.weight", mat(D, Fs))                           # ne {Fs, D}
            else:
                W(p + "ffn_up.weight", mat(a.ff, D))
                W(p + "ffn_down.weight", mat(D, a.ff))
        elif ARCH in ("lfm2", "lfm2moe"):
            if kind == "C":
                S(p + "shortconv.conv.weight", rng.standard_normal((D, a.conv_k)) / np.sqrt(a.conv_k))  # ne {L, D}
                W(p + "shortconv.in_proj.weight", mat(3 * D, D))                 # ne {D, 3D}: B|C|x
                W(p + "shortconv.out_proj.weight", mat(D, D))
            else:
                attention(p, qk_norm=True)
            S(p + "ffn_norm.weight", norm(D))
            if ARCH == "lfm2moe" and il >= a.dense_lead:
                experts(p, a.experts, a.expert_ff)
                S(p + "exp_probs_b.bias", 0.3 * rng.standard_normal(a.experts))  # ne {E} (HF expert_bias)
            else:
                swiglu(p, a.ff)
        elif ARCH == "falcon-h1":
            attention(p)
            mamba2(p, ssm_norm=not a.no_ssm_norm)
            S(p + "ffn_norm", norm(D))            # HF pre_ff_layernorm.weight, mapped whole: no suffix
            swiglu(p, a.ff)
        elif ARCH == "kimi-linear":
            if kind == "K":
                kda(p)
            else:
                mla(p)
            S(p + "ffn_norm.weight", norm(D))
            if il < a.dense_lead:
                swiglu(p, a.ff)
            else:
                experts(p, a.experts, a.expert_ff)
                swiglu(p, a.expert_ff * max(a.shared_experts, 1), "_shexp")
                S(p + "exp_probs_b.bias", 0.3 * rng.standard_normal(a.experts))  # ne {E}
        elif ARCH == "jamba":
            if kind == "M":
                mamba1(p)
            else:
                attention(p)
            S(p + "ffn_norm.weight", norm(D))
            if a.moe_layers[il]:
                experts(p, a.experts, a.ff)
            else:
                swiglu(p, a.ff)
    return w


def main(argv=None):
    a = parse_args(argv)
    build(a).write(a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""suite_reference_mla.py - golden test of the C engine's MLA layers against tests/ref/mla_ref.py.

Owns: the MLA part of the reference suite (tests/suite_reference.sh runs it after
tests/suite_reference.py). Each golden case builds a small model with MLA layers - a qwen35
hybrid with hyserve.layer_kinds (A GQA / L DeltaNet / M MLA) or a dense deepseek2 file -
with tests/ref/make_mla_model.py or with `hyserve synth`, runs `hyserve logits --all` on a
64-token prompt and compares every position with the float64 reference:
    max_t  max|c_t - ref_t| / max|ref_t|  <=  1e-4
including the C engine's absorbed and expanded MLA paths (`logits --mla-mode`) and decode
steps (`logits --split`). Also the reference's own checks, which need no C binary: absorbed
== expanded == naive MLA (1e-10), segmented decode with the latent cache == one-shot forward,
the writer's tensor layout, the CLI. A C feature that is missing makes its cases FAIL with
"hyserve lacks ...", never skip.
Does not: test quantized MLA weights, tokenization or the server.

Env: HYSERVE (default build/hyserve), TEST_TMPDIR (default: a fresh temp dir).
Usage: /usr/bin/python3 tests/suite_reference_mla.py [-v] [-k SUBSTRING] [--list] [--keep]
The runner, the `hyserve logits` reader and the comparison are tests/ref/harness.py.
Last line printed: "reference-mla: N passed, N failed"; exit status 1 on any failure.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.dont_write_bytecode = True

import harness  # noqa: E402  (first: it pins numpy's BLAS to one thread)
from harness import CaseFailure, compare, f32_floor, need_hyserve, run  # noqa: E402

import numpy as np  # noqa: E402

import gguf_io  # noqa: E402
import make_mla_model  # noqa: E402
import mla_ref  # noqa: E402
import qwen35_ref  # noqa: E402

TOL = 1e-4
SUMMARY = "reference-mla"


# --------------------------------------------------------------------------
# helpers (the rest are tests/ref/harness.py's)

def has_mla(ctx):
    return "mla" in ctx.help_text("synth").lower() or "mla" in ctx.help_text("logits").lower()


def need_option(ctx, cmd, opt, what=None):
    need_hyserve(ctx)
    if opt not in ctx.help_text(cmd):
        raise CaseFailure("hyserve lacks `%s %s`%s (not in `hyserve %s --help`)"
                          % (cmd, opt, " (" + what + ")" if what else "", cmd))


def prompt(seed, vocab):
    return harness.prompt(seed, vocab, 2000)


def c_logits(ctx, model, tokens, extra=()):
    try:
        return harness.c_logits(ctx, model, tokens, extra)
    except CaseFailure as e:
        if any(w in str(e) for w in ("exited with", "timed out", "could not start")) and not has_mla(ctx):
            raise CaseFailure("hyserve lacks MLA layers (no MLA option in `synth --help` / `logits --help`); %s" % e)
        raise


# --------------------------------------------------------------------------
# model specs

MLA_BASE = dict(arch="qwen35", kinds="LLLM", heads=4, kv_lora=32, q_lora=0, nope=16, rope_mla=8, vdim=16,
                embd=64, kv_heads=2, head_dim=16, rope_dim=8, nk=2, nv=4, dk=16, dv=16, ff=128,
                vocab=256, tied=False, dtype="f32", layout_key="recurrent")


def spec(**kw):
    s = dict(MLA_BASE)
    for k in kw:
        if k not in s:
            raise KeyError(k)
    s.update(kw)
    if s["arch"] == "deepseek2" and set(s["kinds"]) != {"M"}:
        raise ValueError("deepseek2 spec needs kinds M...")
    return s


def py_argv(out, seed, s):
    argv = ["-o", out, "--seed", str(seed), "--arch", s["arch"], "--kinds", s["kinds"],
            "--heads", str(s["heads"]), "--kv-lora", str(s["kv_lora"]), "--q-lora", str(s["q_lora"]),
            "--nope", str(s["nope"]), "--rope-mla", str(s["rope_mla"]), "--vdim", str(s["vdim"]),
            "--embd", str(s["embd"]), "--kv-heads", str(s["kv_heads"]), "--head-dim", str(s["head_dim"]),
            "--rope-dim", str(s["rope_dim"]), "--nk", str(s["nk"]), "--nv", str(s["nv"]),
            "--dk", str(s["dk"]), "--dv", str(s["dv"]), "--ff", str(s["ff"]), "--vocab", str(s["vocab"]),
            "--tied" if s["tied"] else "--untied", "--dtype", s["dtype"]]
    if s["arch"] == "qwen35":
        argv += ["--layout-key", s["layout_key"]]
    return argv


# `hyserve synth` options for MLA, as the C side names them (checked against --help)
C_MLA_OPTS = [("--mla-kv-lora", "kv_lora"), ("--mla-nope", "nope"), ("--mla-rope", "rope_mla"),
              ("--mla-vdim", "vdim")]
C_MLA_QLORA = "--mla-q-lora"


def c_synth_argv(ctx, out, seed, s):
    argv = [ctx.hyserve, "synth", "-o", out, "--seed", str(seed)]
    if s["arch"] == "deepseek2":
        need_option(ctx, "synth", "deepseek2", "--arch deepseek2")
        argv += ["--arch", "deepseek2", "--layers", str(len(s["kinds"]))]
    else:
        argv += ["--layers", str(len(s["kinds"])), "--pattern", s["kinds"]]
    for opt, key in C_MLA_OPTS:
        need_option(ctx, "synth", opt)
        argv += [opt, str(s[key])]
    if s["q_lora"]:
        need_option(ctx, "synth", C_MLA_QLORA)
        argv += [C_MLA_QLORA, str(s["q_lora"])]
    argv += ["--embd", str(s["embd"]), "--heads", str(s["heads"]), "--ff", str(s["ff"]),
             "--vocab", str(s["vocab"]), "--tied" if s["tied"] else "--untied", "--dtype", s["dtype"]]
    if s["arch"] == "qwen35":
        argv += ["--kv-heads", str(s["kv_heads"]), "--head-dim", str(s["head_dim"]),
                 "--rope-dim", str(s["rope_dim"]), "--dnet-k-heads", str(s["nk"]),
                 "--dnet-v-heads", str(s["nv"]), "--dnet-k-dim", str(s["dk"]), "--dnet-v-dim", str(s["dv"])]
    return argv


def check_layout(path, s):
    """The file, as the reference reads it, has the requested layer kinds and dimensions."""
    m = mla_ref.load_model(path)
    if not isinstance(m, mla_ref.MlaModelBase):
        raise CaseFailure("file has no MLA layout (arch %r, no %s)" % (
            m.reader.get("general.architecture"), mla_ref.KINDS_KEY))
    arch = m.reader.get("general.architecture")
    if arch != s["arch"]:
        raise CaseFailure("general.architecture %r != requested %r" % (arch, s["arch"]))
    if m.kinds_string() != s["kinds"]:
        raise CaseFailure("layer kinds in file %s != requested %s" % (m.kinds_string(), s["kinds"]))
    d = m.mla_dims
    got = (m.hp.n_embd, m.hp.n_ff, d.n_head, d.kv_lora, d.q_lora, d.d_nope, d.d_rope, d.d_v, m.n_vocab,
           m.output is m.tok_embd)
    want = (s["embd"], s["ff"], s["heads"], s["kv_lora"], s["q_lora"], s["nope"], s["rope_mla"], s["vdim"],
            s["vocab"], s["tied"])
    if got != want:
        raise CaseFailure("dimensions in file %r != requested %r (embd ff heads R q_lora nope rope vdim vocab tied)"
                          % (got, want))
    if "L" in s["kinds"] or "A" in s["kinds"]:
        hp = m.hp
        got = (hp.n_head_kv, hp.head_dim, hp.n_rot, hp.n_k, hp.n_v, hp.d_k, hp.d_v)
        want = (s["kv_heads"], s["head_dim"], s["rope_dim"], s["nk"], s["nv"], s["dk"], s["dv"])
        if "A" not in s["kinds"]:
            got, want = got[3:], want[3:]
        if got != want:
            raise CaseFailure("GQA/DeltaNet dims in file %r != requested %r" % (got, want))
    return m


def reference_for(ctx, path, seed, s):
    """(model, tokens, reference logits, f32 floor), computed once per file."""
    if path not in ctx.models:
        m = check_layout(path, s)
        tokens = prompt(seed, s["vocab"])
        ref = m.forward(tokens)
        ctx.models[path] = (m, tokens, ref, f32_floor(m, tokens, ref))
    return ctx.models[path]


def build_model(ctx, name, seed, s, writer):
    path = os.path.join(ctx.tmpdir, name + ".gguf")
    if os.path.exists(path):
        return path
    if writer == "c":
        need_hyserve(ctx)
        run(c_synth_argv(ctx, path, seed, s), "hyserve synth")
    else:
        make_mla_model.main(py_argv(path, seed, s))
    return path


def golden(ctx, model, seed, s, writer, extra=()):
    path = build_model(ctx, model, seed, s, writer)
    m, tokens, ref, floor = reference_for(ctx, path, seed, s)
    need_hyserve(ctx)
    c, dt = c_logits(ctx, path, tokens, extra)
    err, worst, rows = compare(c, ref)
    msg = "max_rel_err %.3e (tol %.0e) worst pos %d, pos0 %.2e, f32 floor %.1e, layers %s, C %.2fs" % (
        err, TOL, worst, rows[0], floor, m.kinds_string(), dt)
    if err > TOL:
        msg += "; first position over tol: %d" % int(np.argmax(rows > TOL))
        if floor > TOL / 10:
            msg += " (the model itself is ill-conditioned on this prompt: suspect the seed, not only the engine)"
        if not has_mla(ctx):
            msg = "hyserve lacks MLA layers (no MLA option in `synth --help` / `logits --help`): " + msg
        raise CaseFailure(msg)
    return msg


# name, writer, seed, spec, extra `hyserve logits` options (option, what for the failure text)
# Seeds keep the f32 floor (f32_floor) near 1e-6 or below, >= 10x under the tolerance.
M_LLLM = ("py_qwen35_LLLM", "py", 1, spec(kinds="LLLM"))
M_LAMLM = ("py_qwen35_LAMLM_qlora", "py", 2, spec(kinds="LAMLM", q_lora=24, nk=2, nv=2))
M_MMMM = ("py_qwen35_MMMM_tied", "py", 3, spec(kinds="MMMM", heads=2, kv_lora=48, nope=8, rope_mla=16,
                                               vdim=24, tied=True))
M_DS = ("py_deepseek2", "py", 4, spec(arch="deepseek2", kinds="MMM", heads=4, kv_lora=32, nope=16,
                                      rope_mla=8, vdim=16))
M_DSQ = ("py_deepseek2_qlora", "py", 5, spec(arch="deepseek2", kinds="MMMM", heads=8, kv_lora=32, q_lora=48,
                                             nope=8, rope_mla=8, vdim=8, ff=96))
M_C_LLLM = ("c_qwen35_LLLM", "c", 6, spec(kinds="LLLM", nk=2, nv=2))
M_C_DS = ("c_deepseek2", "c", 7, spec(arch="deepseek2", kinds="MMMM", heads=4, kv_lora=32, nope=16,
                                      rope_mla=8, vdim=16))
M_C_DSQ = ("c_deepseek2_qlora", "c", 8, spec(arch="deepseek2", kinds="MM", heads=4, kv_lora=32, q_lora=24,
                                             nope=16, rope_mla=8, vdim=16))
M_C_MIX = ("c_qwen35_AMLM_qlora", "c", 9, spec(kinds="AMLM", q_lora=32, nk=2, nv=4, kv_lora=24, vdim=8))
# contradicting full_attention_interval = 2 (would read LALA): hyserve.layer_kinds must win
M_OVR = ("py_qwen35_LLLM_interval2", "py", 10, spec(kinds="LLLM", layout_key="interval2"))

GOLDEN = [
    # case name, model, extra logits options
    ("py_qwen35_LLLM_kimi_like", M_LLLM, ()),
    ("py_qwen35_LAMLM_mixed_qlora", M_LAMLM, ()),
    ("py_qwen35_MMMM_tied", M_MMMM, ()),
    ("py_deepseek2_dense", M_DS, ()),
    ("py_deepseek2_dense_qlora", M_DSQ, ()),
    ("c_synth_qwen35_LLLM", M_C_LLLM, ()),
    ("c_synth_deepseek2_dense", M_C_DS, ()),
    ("c_synth_deepseek2_dense_qlora", M_C_DSQ, ()),
    ("c_synth_qwen35_AMLM_qlora", M_C_MIX, ()),
    ("py_qwen35_LLLM_kinds_override_interval", M_OVR, ()),
    ("py_qwen35_LAMLM_split5_decode_steps", M_LAMLM, ("--split", "5")),
    ("py_qwen35_LLLM_split1_decode_only", M_LLLM, ("--split", "1")),
    ("py_qwen35_LAMLM_mla_mode_absorbed", M_LAMLM, ("--mla-mode", "absorbed")),
    ("py_qwen35_LAMLM_mla_mode_expanded", M_LAMLM, ("--mla-mode", "expanded")),
    ("py_deepseek2_qlora_mla_mode_absorbed", M_DSQ, ("--mla-mode", "absorbed")),
    ("py_deepseek2_qlora_mla_mode_expanded", M_DSQ, ("--mla-mode", "expanded")),
    ("py_deepseek2_qlora_mla_mode_absorbed_split7", M_DSQ, ("--mla-mode", "absorbed", "--split", "7")),
]


def make_golden(model, extra):
    name, writer, seed, s = model

    def t(ctx):
        for opt in extra:
            if opt.startswith("--"):
                need_option(ctx, "logits", opt)
        return golden(ctx, name, seed, s, writer, extra)
    return t


# --------------------------------------------------------------------------
# reference self-checks (no C binary)

def t_ref_mla_absorbed_and_naive_match_expanded(ctx):
    e = mla_ref.self_test_mla(verbose=ctx.verbose)
    r = mla_ref.self_test_rope(verbose=ctx.verbose)
    msg = "max_rel_err %.3e (tol 1e-10), rope identities %.1e" % (e, r)
    if not (e < 1e-10 and r < 1e-12):
        raise CaseFailure(msg)
    return msg


def _py_model(ctx, model):
    name, writer, seed, s = model
    path = build_model(ctx, name, seed, s, "py")
    return reference_for(ctx, path, seed, s)


def t_ref_model_absorbed_matches_expanded(ctx):
    worst = 0.0
    for model in (M_LAMLM, M_DSQ, M_MMMM):
        m, tokens, ref, _ = _py_model(ctx, model)
        for mode in ("absorbed", "naive") if model is M_MMMM else ("absorbed",):
            toks = tokens if mode != "naive" else tokens[:20]
            want = ref if mode != "naive" else m.forward(toks)
            worst = max(worst, compare(m.forward(toks, mla_mode=mode), want)[0])
    msg = "max_rel_err %.3e (tol 1e-10) over LAMLM, deepseek2 q_lora, MMMM (+naive)" % worst
    if not worst < 1e-10:
        raise CaseFailure(msg)
    return msg


def t_ref_segmented_decode_matches_full_forward(ctx):
    """The latent cache (c after its norm, k_pe after RoPE) carried across calls, read by the
    absorbed form, reproduces the one-shot expanded forward."""
    worst = 0.0
    for model in (M_LAMLM, M_DS):
        m, tokens, ref, _ = _py_model(ctx, model)
        for sizes, mode in (([1] * 64, "absorbed"), ([5, 1, 17, 1, 1, 30], "absorbed"), ([2, 3], "expanded")):
            m.mla_mode = mode
            try:
                worst = max(worst, compare(m.forward_segments(tokens, sizes, False, 16), ref)[0])
            finally:
                m.mla_mode = "expanded"
    msg = "max_rel_err %.3e (tol 1e-10)" % worst
    if not worst < 1e-10:
        raise CaseFailure(msg)
    return msg


def t_ref_layer_kinds_without_mla_match_qwen35_ref(ctx):
    """A/L layers read through hyserve.layer_kinds give exactly qwen35_ref's logits (the file
    also carries attention.recurrent_layers, which qwen35_ref reads)."""
    path = os.path.join(ctx.tmpdir, "ref_kinds_LLAL.gguf")
    make_mla_model.main(["-o", path, "--seed", "8", "--kinds", "LLAL", "--nk", "2", "--nv", "4", "--untied"])
    toks = prompt(8, 256)[:24]
    a = mla_ref.HybridMlaRef(path).forward(toks)
    b = qwen35_ref.Qwen35Ref(path).forward(toks)
    if not np.array_equal(a, b):
        raise CaseFailure("max abs diff %.3e" % np.abs(a - b).max())
    return "bit-identical, 24 positions"


def t_ref_make_mla_model_layout(ctx):
    """Tensor names / ne and keys of both flavours, as the brief's layout lists them."""
    E, F, H, R, dn, dr, dv, ql = 32, 48, 2, 16, 8, 4, 12, 20
    common = ["--embd", str(E), "--ff", str(F), "--heads", str(H), "--kv-lora", str(R), "--nope", str(dn),
              "--rope-mla", str(dr), "--vdim", str(dv), "--untied"]
    p1 = os.path.join(ctx.tmpdir, "ref_layout_q35.gguf")
    make_mla_model.main(["-o", p1, "--kinds", "LAM", "--q-lora", "0", "--kv-heads", "1", "--head-dim", "8",
                         "--rope-dim", "4", "--nk", "2", "--nv", "2", "--dk", "8"] + common)
    p2 = os.path.join(ctx.tmpdir, "ref_layout_ds2.gguf")
    make_mla_model.main(["-o", p2, "--arch", "deepseek2", "--layers", "1", "--q-lora", str(ql)] + common)
    mla_plain = {"attn_q.weight": (E, H * (dn + dr))}
    mla_q = {"attn_q_a.weight": (E, ql), "attn_q_a_norm.weight": (ql,), "attn_q_b.weight": (ql, H * (dn + dr))}
    mla_rest = {"attn_kv_a_mqa.weight": (E, R + dr), "attn_kv_a_norm.weight": (R,),
                "attn_k_b.weight": (dn, R, H), "attn_v_b.weight": (R, dv, H), "attn_output.weight": (H * dv, E)}
    ffn = {"ffn_gate.weight": (E, F), "ffn_up.weight": (E, F), "ffn_down.weight": (F, E)}
    glob = {"token_embd.weight": (E, 256), "output_norm.weight": (E,), "output.weight": (E, 256)}
    want1 = dict(glob)
    for il, mixer in enumerate([
            {"attn_qkv.weight": (E, 48), "attn_gate.weight": (E, 16), "ssm_beta.weight": (E, 2),
             "ssm_alpha.weight": (E, 2), "ssm_conv1d.weight": (4, 48), "ssm_dt.bias": (2,), "ssm_a": (2,),
             "ssm_norm.weight": (8,), "ssm_out.weight": (16, E)},
            {"attn_q.weight": (E, 2 * H * 8), "attn_k.weight": (E, 8), "attn_v.weight": (E, 8),
             "attn_output.weight": (H * 8, E), "attn_q_norm.weight": (8,), "attn_k_norm.weight": (8,)},
            dict(mla_plain, **mla_rest)]):
        for n, ne in list(mixer.items()) + list(ffn.items()) + [("attn_norm.weight", (E,)),
                                                                 ("post_attention_norm.weight", (E,))]:
            want1["blk.%d.%s" % (il, n)] = ne
    want2 = dict(glob)
    for n, ne in list(mla_q.items()) + list(mla_rest.items()) + list(ffn.items()) + [
            ("attn_norm.weight", (E,)), ("ffn_norm.weight", (E,))]:
        want2["blk.0." + n] = ne
    for path, want in ((p1, want1), (p2, want2)):
        r = gguf_io.GGUFReader(path)
        got = {n: tuple(ti.ne) for n, ti in r.tensors.items()}
        if got != want:
            raise CaseFailure("%s layout mismatch: missing %s extra %s wrong %s" % (
                os.path.basename(path), sorted(set(want) - set(got)), sorted(set(got) - set(want)),
                sorted((n, got[n], want[n]) for n in want if n in got and got[n] != want[n])))
    r1, r2 = gguf_io.GGUFReader(p1), gguf_io.GGUFReader(p2)
    kv1 = {k: r1.kv[k] for k in r1.kv if k.startswith("hyserve.") or "mla" in k or "lora" in k}
    want_kv1 = {"hyserve.layer_kinds": [1, 0, 2], "qwen35.attention.kv_lora_rank": R,
                "qwen35.attention.key_length_mla": dn + dr, "qwen35.attention.value_length_mla": dv,
                "qwen35.rope.dimension_count_mla": dr}
    if kv1 != want_kv1 or r1.kv_types["hyserve.layer_kinds"] != (gguf_io.T_ARRAY, gguf_io.T_UINT8):
        raise CaseFailure("qwen35 MLA keys %r (types %r) != %r" % (kv1, r1.kv_types.get("hyserve.layer_kinds"),
                                                                   want_kv1))
    if r1.kv["qwen35.attention.recurrent_layers"] != [True, False, False]:
        raise CaseFailure("recurrent_layers %r" % r1.kv["qwen35.attention.recurrent_layers"])
    d = "deepseek2."
    want_kv2 = {"block_count": 1, "embedding_length": E, "feed_forward_length": F, "attention.head_count": H,
                "attention.head_count_kv": 1, "attention.key_length": R + dr, "attention.value_length": R,
                "attention.key_length_mla": dn + dr, "attention.value_length_mla": dv,
                "attention.kv_lora_rank": R, "attention.q_lora_rank": ql, "rope.dimension_count": dr,
                "leading_dense_block_count": 1}
    bad = {k: r2.kv.get(d + k) for k, v in want_kv2.items() if r2.kv.get(d + k) != v}
    for k in ("rope.freq_base", "attention.layer_norm_rms_epsilon", "context_length"):
        if d + k not in r2.kv:
            bad[k] = None
    if bad:
        raise CaseFailure("deepseek2 keys wrong or missing: %r" % bad)
    return "%d + %d tensors, keys ok" % (len(want1), len(want2))


def t_ref_cli_prints_one_json_object(ctx):
    m, tokens, ref, _ = _py_model(ctx, M_DSQ)
    path = os.path.join(ctx.tmpdir, M_DSQ[0] + ".gguf")
    toks = tokens[:5]
    want = m.forward(toks)
    cli = [sys.executable, "-B", os.path.join(HERE, "ref", "mla_ref.py"), path, "--tokens", ",".join(map(str, toks))]
    out_all = json.loads(run(cli + ["--all", "--mla-mode", "absorbed"], "mla_ref.py --all")[0])
    out_last = json.loads(run(cli, "mla_ref.py")[0])
    if out_all["tokens"] != toks or out_last["tokens"] != toks:
        raise CaseFailure("tokens not echoed")
    a, b = np.array(out_all["logits"]), np.array(out_last["logits"])
    if a.shape != (5, 256) or b.shape != (1, 256):
        raise CaseFailure("wrong logits shapes %s %s" % (a.shape, b.shape))
    if not np.array_equal(b, want[-1:]) or compare(a, want)[0] > 1e-10:
        raise CaseFailure("CLI logits differ from the in-process forward")
    return "--all [5, 256] (absorbed), last [1, 256] exact"


def all_tests():
    tests = [("ref_mla_absorbed_and_naive_match_expanded", t_ref_mla_absorbed_and_naive_match_expanded),
             ("ref_make_mla_model_layout", t_ref_make_mla_model_layout),
             ("ref_layer_kinds_without_mla_match_qwen35_ref", t_ref_layer_kinds_without_mla_match_qwen35_ref),
             ("ref_model_absorbed_matches_expanded", t_ref_model_absorbed_matches_expanded),
             ("ref_segmented_decode_matches_full_forward", t_ref_segmented_decode_matches_full_forward),
             ("ref_mla_cli_prints_one_json_object", t_ref_cli_prints_one_json_object)]
    for name, model, extra in GOLDEN:
        tests.append((name, make_golden(model, extra)))
    return tests


def main(argv=None):
    return harness.main(argv, all_tests(), SUMMARY)


if __name__ == "__main__":
    sys.exit(main())

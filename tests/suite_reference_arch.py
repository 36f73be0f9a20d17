#!/usr/bin/python3
"""suite_reference_arch.py - golden cases for issue 5: weight types and architectures.

Owns the cases that check the C engine against the independent reference for
  (a) dequantization: a GGUF of random-but-valid blocks of every supported type;
      `hyserve tensor` must print exactly (bit for bit, as float32) what quants.py
      computes from section 5 of docs/models.md;
  (b) qwen3next (current split tensors and legacy fused ssm_in; MoE + shared expert;
      grouped value heads with n_v = 2 n_k), qwen3 and llama models, written by
      tests/ref/make_model.py and by `hyserve synth --arch ...`: logits within 1e-4
      relative (the metric of suite_reference.py);
  (c) quantized models (q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m written by make_model.py;
      q8_0 / q4_k written by `hyserve synth`): C logits vs the reference run on the SAME
      file within 1e-4; the distance to the f32 twin of the same seed is reported and
      held to a loose bound (see QUANT_BOUND);
  plus clear load errors for an unsupported tensor type and architecture, and
  reference self-checks that need no C binary.
Runs inside tests/suite_reference.py (its all_tests() appends these), so the suite's
last line stays "reference: N passed, N failed"; it can also run alone:
  /usr/bin/python3 tests/suite_reference_arch.py [-v] [-k SUBSTRING] [--list] [--keep]
Cases that need a C feature that is missing fail with "hyserve lacks ..." (never skip).
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

if "suite_reference" not in sys.modules and getattr(sys.modules.get("__main__"), "__file__", "").endswith(
        "suite_reference.py"):
    sys.modules["suite_reference"] = sys.modules["__main__"]
import suite_reference as tr  # noqa: E402  (first: it pins numpy's BLAS to one thread)
from suite_reference import CaseFailure, compare, need_hyserve, prompt, run  # noqa: E402
from harness import parse_logits  # noqa: E402

import numpy as np  # noqa: E402

import gguf_io  # noqa: E402
import make_model  # noqa: E402
import models_ref  # noqa: E402
import quants  # noqa: E402
import qwen35_ref  # noqa: E402

TOL = tr.TOL

# How far a quantized model's logits may be from its f32 twin (same seed, same random
# draws, quantized at write time). Metric: relative RMS distance over all positions,
# rms(z_q - z_f) / rms(z_f) (the max-based metric of the golden cases is reported too,
# but one flipped MoE routing decision dominates it). Bound: QUANT_GAIN * e_w, where
# e_w = rms(W_q - W) / rms(W) over all 2-D/3-D weights of the file (weight_noise()).
# Justification: to first order each of the ~N = 4 layers x 7 projections (+ embedding,
# LM head) contributes an independent relative error ~e_w to the residual stream, so
# the logits move by ~sqrt(N) e_w ~ 5 e_w; measured over 3 seeds per case: 2.8-6.2 e_w
# (the higher values for qwen3next, where quantization flips some top-k routing
# choices). QUANT_GAIN = 10 leaves ~1.6x margin. This is a sanity bound on our own
# quantizer + the reference; exactness of the C engine is the 1e-4 same-file check.
# Observed (seeds of GOLDEN): q8_0 ~2e-2 (e_w 5e-3), q6_k ~7e-2 (e_w 2e-2),
# q5_k ~0.2 (e_w 4e-2), q4_0 / q4_k / q4_k_m ~0.25-0.4 (e_w 8e-2).
QUANT_GAIN = 10.0


# --------------------------------------------------------------------------
# specs

ABASE = dict(arch="qwen3next", layers=4, attn_every=4, pattern=None, embd=64, heads=4, kv_heads=2,
             head_dim=16, rope_dim=8, nk=2, nv=4, dk=16, dv=16, ff=128, vocab=256, tied=False,
             dtype="f32", experts=8, experts_used=2, expert_ff=64, shared_ff=64,
             legacy=False, rope_freqs=False)


def aspec(**kw):
    s = dict(ABASE)
    for k in kw:
        if k not in s:
            raise KeyError(k)
    s.update(kw)
    if s["arch"] in ("qwen3", "llama") and "rope_dim" not in kw:
        s["rope_dim"] = s["head_dim"]
    return s


def hybrid(s):
    return s["arch"] in ("qwen35", "qwen3next")


def py_argv(out, seed, s, dtype=None):
    argv = ["-o", out, "--seed", str(seed), "--arch", s["arch"], "--layers", str(s["layers"]),
            "--embd", str(s["embd"]), "--heads", str(s["heads"]), "--kv-heads", str(s["kv_heads"]),
            "--head-dim", str(s["head_dim"]), "--rope-dim", str(s["rope_dim"]), "--ff", str(s["ff"]),
            "--vocab", str(s["vocab"]), "--tied" if s["tied"] else "--untied",
            "--dtype", dtype or s["dtype"]]
    if hybrid(s):
        argv += (["--pattern", s["pattern"]] if s["pattern"] else ["--interval", str(s["attn_every"])])
        argv += ["--nk", str(s["nk"]), "--nv", str(s["nv"]), "--dk", str(s["dk"]), "--dv", str(s["dv"])]
    if s["arch"] == "qwen3next":
        argv += ["--experts", str(s["experts"]), "--experts-used", str(s["experts_used"]),
                 "--expert-ff", str(s["expert_ff"]), "--shared-ff", str(s["shared_ff"])]
        if s["legacy"]:
            argv.append("--legacy-ssm-in")
    if s["rope_freqs"]:
        argv.append("--rope-freqs")
    return argv


def c_argv(hyserve, out, seed, s):
    argv = [hyserve, "synth", "-o", out, "--seed", str(seed), "--arch", s["arch"], "--layers", str(s["layers"]),
            "--embd", str(s["embd"]), "--heads", str(s["heads"]), "--kv-heads", str(s["kv_heads"]),
            "--head-dim", str(s["head_dim"]), "--rope-dim", str(s["rope_dim"]), "--ff", str(s["ff"]),
            "--vocab", str(s["vocab"]), "--tied" if s["tied"] else "--untied", "--dtype", s["dtype"]]
    if hybrid(s):
        argv += (["--pattern", s["pattern"]] if s["pattern"] else ["--attn-every", str(s["attn_every"])])
        argv += ["--dnet-k-heads", str(s["nk"]), "--dnet-v-heads", str(s["nv"]),
                 "--dnet-k-dim", str(s["dk"]), "--dnet-v-dim", str(s["dv"])]
    if s["arch"] == "qwen3next":
        argv += ["--experts", str(s["experts"]), "--experts-used", str(s["experts_used"]),
                 "--expert-ff", str(s["expert_ff"]), "--shared-ff", str(s["shared_ff"])]
    return argv


def expected_kinds(s):
    if not hybrid(s):
        return [False] * s["layers"]
    if s["pattern"]:
        return [c == "L" for c in s["pattern"]]
    return [(i + 1) % s["attn_every"] != 0 for i in range(s["layers"])]


# --------------------------------------------------------------------------
# C feature probes (so a missing feature reads "hyserve lacks ...")

def need_synth_arch(ctx, s):
    need_hyserve(ctx)
    h = ctx.help_text("synth")
    if "--arch" not in h:
        raise CaseFailure("hyserve lacks `synth --arch` (synth --help does not mention --arch)")
    if s["arch"] == "qwen3next" and "--experts" not in h:
        raise CaseFailure("hyserve lacks `synth --experts` (MoE options) for qwen3next")
    if s["dtype"] not in h:
        raise CaseFailure("hyserve lacks `synth --dtype %s` (not in synth --help)" % s["dtype"])


def c_run_model(ctx, argv, what, model_what):
    """Run a C command on a model; an 'unknown architecture' / 'unsupported type' load error
    reads as a missing feature."""
    try:
        return run(argv, what)
    except CaseFailure as e:
        msg = str(e)
        err = msg.split("stderr:", 1)[-1].strip()
        low = err.lower()
        if "architecture" in low or "support" in low or "unknown" in low:
            raise CaseFailure("hyserve lacks support for %s: %s" % (model_what, err[-300:]))
        raise


# --------------------------------------------------------------------------
# golden comparison

def check_layout(path, s):
    m = models_ref.load_model(path)
    hp = m.hp
    if m.reader.get("general.architecture") != s["arch"]:
        raise CaseFailure("general.architecture %r != %r" % (m.reader.get("general.architecture"), s["arch"]))
    kinds = expected_kinds(s)
    if hp.recurrent != kinds:
        raise CaseFailure("layer kinds in file %s != requested %s" % (
            "".join("L" if r else "A" for r in hp.recurrent), "".join("L" if r else "A" for r in kinds)))
    got = [hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot, m.n_vocab, m.output is m.tok_embd]
    want = [s["embd"], s["heads"], s["kv_heads"], s["head_dim"], s["rope_dim"], s["vocab"], s["tied"]]
    names = "embd heads kv hd rope vocab tied"
    if hybrid(s):
        got += [hp.n_k, hp.n_v, hp.d_k, hp.d_v]
        want += [s["nk"], s["nv"], s["dk"], s["dv"]]
        names += " nk nv dk dv"
    if s["arch"] == "qwen3next":
        got += [hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff_shexp]
        want += [s["experts"], s["experts_used"], s["expert_ff"], s["shared_ff"]]
        names += " E k ff_exp ff_shexp"
    else:
        got.append(hp.n_ff)
        want.append(s["ff"])
        names += " ff"
    if got != want:
        raise CaseFailure("hyperparameters in file %r != requested %r (%s)" % (got, want, names))
    types = sorted({ti.type_name for ti in m.reader.tensors.values()})
    want_t = make_model.MIXES.get(s["dtype"], s["dtype"]).upper()
    if want_t not in types:
        raise CaseFailure("no tensor of type %s in the file (types: %s)" % (want_t, types))
    return m, types


def golden(ctx, name, seed, s, writer):
    path = os.path.join(ctx.tmpdir, name + ".gguf")
    if writer == "c":
        need_synth_arch(ctx, s)
        run(c_argv(ctx.hyserve, path, seed, s), "hyserve synth")
    else:
        make_model.main(py_argv(path, seed, s))
    m, types = check_layout(path, s)
    tokens = prompt(seed, s["vocab"])
    ref = m.forward(tokens)
    gap = getattr(m, "min_route_gap", None)
    need_hyserve(ctx)
    out, dt = c_run_model(ctx, [ctx.hyserve, "logits", "-m", path, "--tokens", ",".join(map(str, tokens)), "--all"],
                          "hyserve logits", "%s (%s)" % (s["arch"], "/".join(types)))
    c = parse_logits(out, tokens)
    err, worst, rows = compare(c, ref)
    floor = tr.f32_floor(m, tokens, ref)
    msg = "max_rel_err %.3e (tol %.0e) worst pos %d, f32 floor %.1e" % (err, TOL, worst, floor)
    if gap is not None and gap < np.inf:
        msg += ", min router gap %.1e" % gap
    if len(types) > 1 or types[0] != "F32":
        msg += ", types %s" % "/".join(types)
    msg += ", C %.2fs" % dt
    extra = ""
    if s["dtype"] != "f32" and writer == "py":
        extra = quant_distance(ctx, name, seed, s, m, tokens, ref)
        msg += "; " + extra
    elif s["dtype"] != "f32" and writer == "c":
        # report only: whether C synth draws the same weights for every --dtype is its own choice
        path_f = os.path.join(ctx.tmpdir, name + ".f32twin.gguf")
        run(c_argv(ctx.hyserve, path_f, seed, dict(s, dtype="f32")), "hyserve synth (f32 twin)")
        ref_f = models_ref.load_model(path_f).forward(tokens)
        msg += "; C synth " + quant_report(path, path_f, ref, ref_f, assert_bound=False)
    if err > TOL:
        first = int(np.argmax(rows > TOL))
        msg += "; first position over tol: %d" % first
        if floor > TOL / 10:
            msg += " (the model itself is ill-conditioned on this prompt: suspect the seed, not only the engine)"
        if gap is not None and gap < 1e-4:
            msg += " (two experts nearly tie in the router: an f32 engine may route differently)"
        if s["rope_freqs"]:
            msg += " (the file has rope_freqs.weight: does hyserve divide the RoPE frequencies by it?)"
        if s["legacy"]:
            msg += " (legacy fused ssm_in: per key head [q|k|v(r heads)|z(r heads)])"
        raise CaseFailure(msg)
    if extra.startswith("FAIL"):
        raise CaseFailure(msg)
    if s["dtype"] in make_model.QUANT_DTYPES or s["dtype"] in make_model.MIXES:
        # the prompt on int8 products (HYSERVE_INT8_PROMPT=1: every Q8_0 / Q4_0 / K-quant product's
        # activations quantized per block) against the reference quantizing them the same way
        msg += ", " + int8_golden(ctx, path, m, tokens, s)
    if s["dtype"] == "bf16":
        # the prompt on bf16-rounded activations (HYSERVE_BF16_PROMPT=1) against the reference
        # rounding them the same way (suite_reference.bf16_golden)
        msg += ", " + tr.bf16_golden(ctx, path, m, tokens, ref)
    if s["dtype"] == "q8_0":
        # Q8_0 both as stored and repacked into panels of 16 rows (engine/kernels/panels.h; the default
        # only on AVX-512 with VNNI and without AMX): a prompt takes sgemm on decoded panels (up to
        # 16 tokens the f32 outer-product kernel)
        for panels in ("0", "1"):
            out2, _ = run([ctx.hyserve, "logits", "-m", path, "--tokens", ",".join(map(str, tokens)), "--all"],
                          "hyserve logits", {"HYSERVE_PANELS": panels})
            err2, worst2, _ = compare(parse_logits(out2, tokens), ref)
            if err2 > TOL:
                raise CaseFailure("panels %s: max_rel_err %.3e (tol %.0e) worst pos %d" % (panels, err2, TOL, worst2))
            msg += ", panels %s %.1e" % (panels, err2)
    return msg


# The int8 prompt against the int8-activation reference. Not within TOL at every position: the
# C engine's activations differ from the float64 reference's by f32 rounding (~1e-6 relative),
# so now and then a value sits so near a rounding boundary of its block's quantization that the
# two round it to neighbouring integers; each such flip moves that product by |w| d_x and
# carries into the later positions (the DeltaNet state, attention). Observed over the quantized
# cases: positions exact to 1e-7 until the first flip; rms(C - int8 ref) 0.04-0.67 of the whole
# effect of int8 activations on the model, rms(int8 ref - f32 ref). So the check: C int8 at most
# INT8_FRAC of that effect away from the int8 reference (f32 activations, or a wrong block size
# or scale, sit the whole effect or more away). 0.85, not the 0.75 first chosen: the worst case
# here (Q8_0 as rows, 0.67) left a thin margin, and another CPU's f32 kernels round the
# activations differently, so they flip other values.
INT8_FRAC = 0.85


def int8_golden(ctx, path, m, tokens, s):
    """C with int8 prompt products vs the reference in its int8 activation mode; Q8_0 also
    repacked in panels. Returns the message part."""
    ref = m.forward(tokens)
    ref8 = tr.forward_in_mode(m, tokens, qwen35_ref.set_int8_activations)
    rms = tr.rel_rms
    effect = rms(ref8, ref)
    parts = []
    for panels in (("0", "1") if s["dtype"] == "q8_0" else ("1",)):
        out, _ = run([ctx.hyserve, "logits", "-m", path, "--tokens", ",".join(map(str, tokens)), "--all"],
                     "hyserve logits", {"HYSERVE_INT8_PROMPT": "1", "HYSERVE_PANELS": panels})
        c8 = parse_logits(out, tokens)
        _, _, rows = compare(c8, ref8)
        away = rms(c8, ref8)
        tag = "int8%s" % (" panels " + panels if s["dtype"] == "q8_0" else "")
        if not away <= INT8_FRAC * effect:
            raise CaseFailure("%s: rms distance to the int8-activation reference %.2e > %.2f x %.2e (the distance "
                              "between the int8 and f32 references)" % (tag, away, INT8_FRAC, effect))
        parts.append("%s %.2e of %.2e, %.0f%% positions within tol" % (tag, away, effect, 100 * np.mean(rows <= TOL)))
    return ", ".join(parts)


def weight_noise(path_q, path_f):
    """RMS relative difference of all 2-D/3-D weights between a quantized file and its f32 twin."""
    rq, rf = gguf_io.GGUFReader(path_q), gguf_io.GGUFReader(path_f)
    num = den = 0.0
    for n, ti in rf.tensors.items():
        if len(ti.ne) < 2:
            continue
        a, b = rq.tensor(n), rf.tensor(n)
        num += float(((a - b) ** 2).sum())
        den += float((b ** 2).sum())
    return (num / den) ** 0.5


def quant_distance(ctx, name, seed, s, m, tokens, ref_q):
    """Reference logits of the f32 twin (same seed) vs the quantized file's reference logits."""
    path_f = os.path.join(ctx.tmpdir, name + ".f32twin.gguf")
    make_model.main(py_argv(path_f, seed, s, dtype="f32"))
    ref_f = models_ref.load_model(path_f).forward(tokens)
    # asserted for the quantized types; f16 / bf16 twins are reported only (their weight noise is
    # so small that one flipped top-k routing choice in a MoE model dominates the distance)
    quantized = s["dtype"] in make_model.QUANT_DTYPES or s["dtype"] in make_model.MIXES
    return quant_report(os.path.join(ctx.tmpdir, name + ".gguf"), path_f, ref_q, ref_f, assert_bound=quantized)


def quant_report(path_q, path_f, ref_q, ref_f, assert_bound=True):
    dmax = compare(ref_q, ref_f)[0]
    d = float(np.sqrt(np.mean((ref_q - ref_f) ** 2) / np.mean(ref_f ** 2)))
    e_w = weight_noise(path_q, path_f)
    bound = QUANT_GAIN * e_w
    agree = float(np.mean(ref_q.argmax(axis=1) == ref_f.argmax(axis=1)))
    txt = ("vs f32 twin: rms rel dist %.3e (bound %.2e = %g x weight noise %.2e), max-metric %.3e, "
           "argmax agree %.0f%%" % (d, bound, QUANT_GAIN, e_w, dmax, 100 * agree))
    return ("FAIL " + txt) if (assert_bound and d > bound) else txt


# --------------------------------------------------------------------------
# (a) dequantization bit-exactness

DEQ_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]


def deq_ne(t):
    blk, _ = quants.block_info(t)
    if blk == 256:
        return (512, 3, 2)
    if blk == 32:
        return (128, 6, 2)
    return (64, 6, 2)


def deq_file(ctx):
    """One GGUF holding a random-but-valid tensor of every type (written once per run)."""
    path = os.path.join(ctx.tmpdir, "dequant.gguf")
    if not os.path.exists(path):
        rng = np.random.default_rng(4242)
        w = gguf_io.GGUFWriter()
        w.add_string("general.architecture", "llama")
        w.add_string("general.name", "hyserve-ref dequantization test (random blocks, not a model)")
        for t in DEQ_TYPES:
            ne = deq_ne(t)
            n = ne[0] * ne[1] * ne[2]
            blk, _ = quants.block_info(t)
            w.add_raw_tensor("deq." + t, ne, quants.type_id(t), quants.random_blocks(rng, t, n // blk))
        w.write(path)
    return path


def t_c_dequant(t):
    def fn(ctx):
        path = deq_file(ctx)
        r = gguf_io.GGUFReader(path)
        name = "deq." + t
        want = r.tensor_f32(name)
        need_hyserve(ctx)
        h = ctx.help_text("tensor")
        if "--name" not in h:
            raise CaseFailure("hyserve lacks the `tensor -m MODEL --name TENSOR` command")
        out, dt = run([ctx.hyserve, "tensor", "-m", path, "--name", name], "hyserve tensor")
        try:
            # parse_int=float: "-0" (how %.9g prints negative zero) must stay -0.0, not int 0
            obj = json.loads(out.decode("utf-8", "replace"), parse_int=float)
        except ValueError as e:
            raise CaseFailure("hyserve tensor printed invalid JSON: %s" % e)
        if str(obj.get("type", "")).upper() != t.upper():
            raise CaseFailure("type %r, expected %r" % (obj.get("type"), t.upper()))
        if list(obj.get("ne", [])) != list(r.tensors[name].ne):
            raise CaseFailure("ne %r, expected %r" % (obj.get("ne"), list(r.tensors[name].ne)))
        got = np.array(obj.get("values", []), dtype=np.float64)
        if got.size != want.size:
            raise CaseFailure("%d values, expected %d" % (got.size, want.size))
        if not np.all(np.isfinite(got)):
            raise CaseFailure("non-finite values printed (the blocks are all finite)")
        # %.9g decimal -> float64 -> float32 is the float32 printed (9 digits leave the decimal
        # within 5e-9 relative of it, far inside half a float32 ulp, 3e-8)
        g32 = got.astype(np.float32)
        gb = g32.view(np.uint32)
        wb = want.view(np.uint32)
        bad = np.nonzero(gb != wb)[0]          # strict: -0 and +0 differ too
        if bad.size:
            i = int(bad[0])
            blk, bsz = quants.block_info(t)
            raise CaseFailure("%d of %d values differ in their float32 bits; first at flat index %d "
                              "(block %d, element %d): C %.9g (0x%08x) vs ref %.9g (0x%08x)" % (
                                  bad.size, want.size, i, i // blk, i % blk, g32[i], g32.view(np.uint32)[i],
                                  want[i], want.view(np.uint32)[i]))
        n_neg0 = int(np.sum(wb == 0x80000000))
        return "%d values bit-identical (ne %s, %d of them -0), C %.2fs" % (
            want.size, list(r.tensors[name].ne), n_neg0, dt)
    return fn


# --------------------------------------------------------------------------
# clear errors

def t_c_unsupported_type_error(ctx):
    """A qwen35 model (the architecture hyserve has always run) with one tensor stored as Q5_0
    (a ggml type outside issue 5's list) must fail to load with a message naming the type."""
    a = make_model.parse_args(["-o", "unused", "--arch", "qwen35", "--seed", "3", "--layers", "2",
                               "--interval", "2"])
    w = make_model.build(a)
    target = "blk.1.ffn_up.weight"
    for i, (n, ne, gt, data) in enumerate(w.tensors):
        if n == target:
            nel = ne[0] * ne[1]
            rng = np.random.default_rng(5)
            blocks = rng.integers(0, 256, (nel // 32, 22)).astype(np.uint8)
            blocks[:, 0:2] = np.array([0.01], "<f2").view(np.uint8)
            w.tensors[i] = (n, ne, 6, blocks.tobytes())          # GGML type 6 = Q5_0
    path = os.path.join(ctx.tmpdir, "unsupported_type.gguf")
    w.write(path)
    need_hyserve(ctx)
    p = subprocess.run([ctx.hyserve, "logits", "-m", path, "--tokens", "1,2,3"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=tr.TIMEOUT, env=tr.c_env())
    err = (p.stderr + p.stdout).decode("utf-8", "replace").replace(path, "MODEL")
    if p.returncode == 0:
        raise CaseFailure("hyserve accepted a model with a Q5_0 tensor (exit 0)")
    if "q5_0" not in err.lower():
        raise CaseFailure("load error does not name the type Q5_0: %r" % err.strip()[-300:])
    return "exit %d: %s" % (p.returncode, err.strip().splitlines()[-1][:160])


def t_c_unsupported_arch_error(ctx):
    a = make_model.parse_args(["-o", "unused", "--arch", "qwen3", "--seed", "3", "--layers", "1"])
    w = make_model.build(a)
    w.kv = [(k, vt, ("mamba2" if k == "general.architecture" else v), et) for k, vt, v, et in w.kv]
    path = os.path.join(ctx.tmpdir, "unsupported_arch.gguf")
    w.write(path)
    need_hyserve(ctx)
    p = subprocess.run([ctx.hyserve, "logits", "-m", path, "--tokens", "1,2,3"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=tr.TIMEOUT, env=tr.c_env())
    err = (p.stderr + p.stdout).decode("utf-8", "replace").replace(path, "MODEL")
    if p.returncode == 0:
        raise CaseFailure("hyserve accepted general.architecture = mamba2 (exit 0)")
    missing = [s for s in ("mamba2", "qwen35", "qwen3next", "qwen3", "llama") if s not in err]
    if missing:
        raise CaseFailure("error should name the architecture and list the supported ones; missing %s in %r"
                          % (missing, err.strip()[-300:]))
    return "exit %d: %s" % (p.returncode, err.strip().splitlines()[-1][:160])


# --------------------------------------------------------------------------
# reference self-checks (no C binary)

def t_ref_quants_self_test(ctx):
    rep = quants.self_test(verbose=ctx.verbose)
    return "%d checks (vectorized == per-element Q4_K/Q5_K/Q6_K, scale packing, quantizer round trips)" % len(rep)


def t_ref_qwen3next_legacy_equals_split(ctx):
    """The same HF weights written as legacy fused ssm_in and as attn_qkv + attn_gate give the same
    model: checks the reference's two de-interleavings against each other."""
    s = aspec(layers=4, pattern="LLAL", nk=2, nv=4)
    pa, pb = (os.path.join(ctx.tmpdir, "ref_q3n_%s.gguf" % k) for k in ("split", "legacy"))
    make_model.main(py_argv(pa, 41, s))
    make_model.main(py_argv(pb, 41, dict(s, legacy=True)))
    if "blk.0.ssm_in.weight" not in gguf_io.GGUFReader(pb).tensors:
        raise CaseFailure("legacy file has no ssm_in")
    toks = prompt(41, 256)
    e = compare(models_ref.load_model(pb).forward(toks), models_ref.load_model(pa).forward(toks))[0]
    if not e < 1e-12:
        raise CaseFailure("max_rel_err %.3e (tol 1e-12)" % e)
    return "max_rel_err %.3e (tol 1e-12)" % e


def t_ref_qwen3next_grouped_equals_qwen35_tiled(ctx):
    """A qwen3next DeltaNet layer (grouped value heads, ssm_ba) and the same layer permuted the way
    the qwen35 converter does (section 2.3 item 6: head g*r+j -> j*n_k+g; split beta/alpha)
    produce the same output through the two code paths."""
    path = os.path.join(ctx.tmpdir, "ref_q3n_perm.gguf")
    make_model.main(py_argv(path, 43, aspec(layers=1, pattern="L", nk=2, nv=6, dk=8, dv=12)))
    m = models_ref.load_model(path)
    hp = m.hp
    L = m.layers[0]
    nk, nv, dk, dv = hp.n_k, hp.n_v, hp.d_k, hp.d_v
    r = nv // nk
    kd = nk * dk
    perm = np.array([g * r + j for j in range(r) for g in range(nk)])    # new tiled slot -> old grouped head
    D = hp.n_embd
    ba = L["ba"].reshape(nk, 2 * r, D)
    beta = ba[:, :r].reshape(nv, D)
    alpha = ba[:, r:].reshape(nv, D)
    qkv = L["qkv"]
    v_rows = qkv[2 * kd:].reshape(nv, dv, D)[perm].reshape(nv * dv, D)
    conv = L["conv"]
    conv_v = conv[2 * kd:].reshape(nv, dv, -1)[perm].reshape(nv * dv, -1)
    L35 = {"qkv": np.concatenate([qkv[:2 * kd], v_rows]),
           "gate": L["gate"].reshape(nv, dv, D)[perm].reshape(nv * dv, D),
           "beta": beta[perm], "alpha": alpha[perm],
           "conv": np.concatenate([conv[:2 * kd], conv_v]),
           "dt_bias": L["dt_bias"][perm], "a": L["a"][perm], "norm": L["norm"],
           "out": L["out"].reshape(D, nv, dv)[:, perm, :].reshape(D, nv * dv)}
    shim = qwen35_ref.Qwen35Ref.__new__(qwen35_ref.Qwen35Ref)
    shim.hp = hp
    x = np.random.default_rng(1).standard_normal((20, D))
    a = m.deltanet(L, x)
    b = qwen35_ref.Qwen35Ref.deltanet(shim, L35, x)
    e = float(np.abs(a - b).max() / np.abs(a).max())
    if not e < 1e-12:
        raise CaseFailure("max_rel_err %.3e (tol 1e-12)" % e)
    # and the wrong (tiled) pairing really is different, so the check has teeth
    c = qwen35_ref.Qwen35Ref.deltanet(shim, dict(L35, qkv=qkv, gate=L["gate"], beta=beta, alpha=alpha,
                                                 conv=conv, dt_bias=L["dt_bias"], a=L["a"], out=L["out"]), x)
    e2 = float(np.abs(a - c).max() / np.abs(a).max())
    if not e2 > 1e-3:
        raise CaseFailure("grouped and tiled pairings agree (%.3e): the check has no teeth" % e2)
    return "max_rel_err %.3e (tol 1e-12); unpermuted tiled reading differs by %.2f" % (e, e2)


def t_ref_llama_norm_rope_matches_hf_rotate_half(ctx):
    """llama.cpp NORM RoPE (adjacent pairs) on rows permuted as the HF->GGUF converter does
    (GGUF row 2i+c of a head = HF row c*hd/2 + i) gives the same q.k scores as HF's rotate-half
    RoPE on the original rows."""
    rng = np.random.default_rng(3)
    T, H, hd, D = 9, 3, 16, 24
    Wq = rng.standard_normal((H * hd, D))
    Wk = rng.standard_normal((H * hd, D))
    x = rng.standard_normal((T, D))
    pos = np.arange(T) + 5
    perm = np.array([c * (hd // 2) + i for i in range(hd // 2) for c in range(2)])  # gguf row -> hf row

    def to_gguf(W):
        return W.reshape(H, hd, D)[:, perm, :].reshape(H * hd, D)
    q1 = rope_neox_hf(linear(x, Wq).reshape(T, H, hd), pos, hd, 1e4)
    k1 = rope_neox_hf(linear(x, Wk).reshape(T, H, hd), pos, hd, 1e4)
    q2 = models_ref.rope_norm(linear(x, to_gguf(Wq)).reshape(T, H, hd), pos, hd, 1e4)
    k2 = models_ref.rope_norm(linear(x, to_gguf(Wk)).reshape(T, H, hd), pos, hd, 1e4)
    s1 = np.einsum("thd,shd->hts", q1, k1)
    s2 = np.einsum("thd,shd->hts", q2, k2)
    e = float(np.abs(s1 - s2).max() / np.abs(s1).max())
    if not e < 1e-12:
        raise CaseFailure("max_rel_err %.3e (tol 1e-12)" % e)
    s3 = np.einsum("thd,shd->hts", models_ref.rope_norm(linear(x, Wq).reshape(T, H, hd), pos, hd, 1e4),
                   models_ref.rope_norm(linear(x, Wk).reshape(T, H, hd), pos, hd, 1e4))
    return "scores agree to %.1e; without the row permutation they differ by %.2f" % (
        e, float(np.abs(s1 - s3).max() / np.abs(s1).max()))


def linear(x, w):
    return x @ w.T


def rope_neox_hf(x, pos, n_rot, theta):
    """HF rotate_half written out directly: out = x*cos + rotate_half(x)*sin with the angle
    vector [f_0..f_{d/2-1}, f_0..f_{d/2-1}] (independent of qwen35_ref.rope_neox)."""
    half = n_rot // 2
    f = theta ** (-np.arange(0, n_rot, 2) / n_rot)
    ang = pos[:, None] * np.concatenate([f, f])[None, :]
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(ang)[:, None, :] + rot * np.sin(ang)[:, None, :]


def t_ref_moe_routing(ctx):
    """Router: top-k of the softmax with ties to the lower expert index, weights renormalised;
    the expert slabs of the 3-D tensors are ne[2]-indexed; shared expert gated by a sigmoid."""
    path = os.path.join(ctx.tmpdir, "ref_moe.gguf")
    make_model.main(py_argv(path, 47, aspec(layers=1, pattern="A", experts=4, experts_used=2)))
    m = models_ref.load_model(path)
    L = dict(m.layers[0])
    D = m.hp.n_embd
    x = np.random.default_rng(2).standard_normal((3, D))
    g = np.zeros((4, D))
    g[1] = g[2] = g[3] = x[0] / np.dot(x[0], x[0])              # logits of x[0]: 0, 1, 1, 1
    L["gate_inp"] = g
    top, w = m.route(L, x[:1])
    if top.tolist() != [[1, 2]] or not np.allclose(w, 0.5):
        raise CaseFailure("tie: chose %s weights %s, expected [1, 2] with 0.5 each" % (top.tolist(), w.tolist()))
    # explicit sum for token x[1] with the file's router
    L = m.layers[0]
    xt = x[1:2]
    lg = linear(xt, L["gate_inp"])[0]
    p = np.exp(lg - lg.max())
    p /= p.sum()
    idx = sorted(range(4), key=lambda e: (-p[e], e))[:2]
    wsum = p[idx[0]] + p[idx[1]]
    want = np.zeros(D)
    raw = gguf_io.GGUFReader(path)
    ge = raw.tensor("blk.0.ffn_gate_exps.weight")
    for e in idx:
        # expert e = the e-th slab of ne[0]*ne[1] elements
        gate_e = raw.tensor_f32("blk.0.ffn_gate_exps.weight")[e * D * 64:(e + 1) * D * 64].reshape(64, D)
        if not np.array_equal(gate_e, ge[e]):
            raise CaseFailure("expert slab %d mismatch" % e)
        hmid = qwen35_ref.silu(gate_e @ xt[0]) * (L["up_exps"][e] @ xt[0])
        want += p[e] / wsum * (L["down_exps"][e] @ hmid)
    sh = qwen35_ref.silu(L["gate_shexp"] @ xt[0]) * (L["up_shexp"] @ xt[0])
    want += qwen35_ref.sigmoid(np.dot(L["gate_inp_shexp"], xt[0])) * (L["down_shexp"] @ sh)
    got = m.ffn(L, xt)[0]
    e = float(np.abs(got - want).max() / np.abs(want).max())
    if not e < 1e-12:
        raise CaseFailure("ffn vs explicit sum: %.3e" % e)
    return "tie -> experts [1, 2] weights 0.5/0.5; explicit per-token sum agrees (%.1e)" % e


def t_ref_qwen3next_segmented_decode(ctx):
    """Caches carried across calls (KV, conv, S) reproduce the one-shot forward for qwen3next
    and llama: the ground truth for decode paths."""
    worst = 0.0
    for arch, extra in (("qwen3next", dict(pattern="LLAL")), ("llama", {}), ("qwen3", {})):
        path = os.path.join(ctx.tmpdir, "ref_seg_%s.gguf" % arch)
        make_model.main(py_argv(path, 51, aspec(arch=arch, layers=4, **extra)))
        m = models_ref.load_model(path)
        toks = prompt(51, 256)
        a = m.forward(toks)
        for sizes, chunked in (([1] * 64, False), ([5, 1, 17, 1, 1, 30], True)):
            worst = max(worst, compare(m.forward_segments(toks, sizes, chunked, 16), a)[0])
    if not worst < 1e-10:
        raise CaseFailure("max_rel_err %.3e (tol 1e-10)" % worst)
    return "max_rel_err %.3e (tol 1e-10) over qwen3next, llama, qwen3" % worst


def t_ref_make_model_arch_layouts(ctx):
    D, F, V, hd = 32, 48, 256, 8
    common = ["-o", "", "--layers", "2", "--embd", str(D), "--heads", "2", "--kv-heads", "1",
              "--head-dim", str(hd), "--ff", str(F), "--untied"]
    nk, nv, dk, dv, E, Fe, Fs = 2, 4, 8, 8, 4, 16, 24
    hyb = ["--pattern", "LA", "--rope-dim", "4", "--nk", str(nk), "--nv", str(nv), "--dk", str(dk), "--dv", str(dv),
           "--experts", str(E), "--experts-used", "2", "--expert-ff", str(Fe), "--shared-ff", str(Fs)]
    glob = {"token_embd.weight": (D, V), "output_norm.weight": (D,), "output.weight": (D, V)}
    moe = {"ffn_gate_inp.weight": (D, E), "ffn_gate_exps.weight": (D, Fe, E), "ffn_up_exps.weight": (D, Fe, E),
           "ffn_down_exps.weight": (Fe, D, E), "ffn_gate_inp_shexp.weight": (D,),
           "ffn_gate_shexp.weight": (D, Fs), "ffn_up_shexp.weight": (D, Fs), "ffn_down_shexp.weight": (Fs, D)}
    dnet = {"ssm_ba.weight": (D, 2 * nv), "ssm_conv1d.weight": (4, 2 * nk * dk + nv * dv), "ssm_dt.bias": (nv,),
            "ssm_a": (nv,), "ssm_norm.weight": (dv,), "ssm_out.weight": (nv * dv, D)}
    gattn = {"attn_q.weight": (D, 2 * 2 * hd), "attn_k.weight": (D, hd), "attn_v.weight": (D, hd),
             "attn_output.weight": (2 * hd, D), "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)}

    def blk(i, d):
        return {"blk.%d.%s" % (i, k): v for k, v in d.items()}
    norms = {"attn_norm.weight": (D,), "post_attention_norm.weight": (D,)}
    want_q3n = dict(glob, **blk(0, dict(norms, **moe, **dnet, **{
        "attn_qkv.weight": (D, 2 * nk * dk + nv * dv), "attn_gate.weight": (D, nv * dv)})),
        **blk(1, dict(norms, **moe, **gattn)))
    want_leg = {k: v for k, v in want_q3n.items() if "attn_qkv" not in k and "attn_gate." not in k}
    want_leg["blk.0.ssm_in.weight"] = (D, 2 * nk * dk + 2 * nv * dv)
    dense = {"attn_norm.weight": (D,), "ffn_norm.weight": (D,), "attn_q.weight": (D, 2 * hd),
             "attn_k.weight": (D, hd), "attn_v.weight": (D, hd), "attn_output.weight": (2 * hd, D),
             "ffn_gate.weight": (D, F), "ffn_up.weight": (D, F), "ffn_down.weight": (F, D)}
    qkn = {"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)}
    want_q3 = dict(glob, **blk(0, dict(dense, **qkn)), **blk(1, dict(dense, **qkn)))
    want_ll = dict(glob, **blk(0, dense), **blk(1, dense))
    checks = [("qwen3next", hyb, want_q3n), ("qwen3next", hyb + ["--legacy-ssm-in"], want_leg),
              ("qwen3", [], want_q3), ("llama", [], want_ll)]
    for arch, extra, want in checks:
        path = os.path.join(ctx.tmpdir, "ref_layout_%s.gguf" % arch)
        argv = list(common)
        argv[1] = path
        make_model.main(argv + ["--arch", arch] + extra)
        r = gguf_io.GGUFReader(path)
        got = {n: ti.ne for n, ti in r.tensors.items()}
        if got != want:
            raise CaseFailure("%s %s layout mismatch: missing %s extra %s wrong %s" % (
                arch, " ".join(extra[-1:]), sorted(set(want) - set(got)), sorted(set(got) - set(want)),
                sorted(n for n in want if n in got and got[n] != want[n])))
        for k in ("expert_count", "expert_used_count", "expert_feed_forward_length",
                  "expert_shared_feed_forward_length"):
            if (arch == "qwen3next") != ((arch + "." + k) in r.kv):
                raise CaseFailure("%s: key %s presence wrong" % (arch, k))
    # q4_k_m: the mix of types
    path = os.path.join(ctx.tmpdir, "ref_layout_q4km.gguf")
    make_model.main(["-o", path, "--arch", "qwen3next", "--layers", "4", "--embd", "256", "--heads", "4",
                     "--head-dim", "64", "--nk", "2", "--nv", "4", "--dk", "64", "--expert-ff", "256",
                     "--shared-ff", "256", "--untied", "--dtype", "q4_k_m"])
    r = gguf_io.GGUFReader(path)
    ty = {n: ti.type_name for n, ti in r.tensors.items()}
    # 8 experts (the default): llama-quantize's attn_v / attn_k Q8_0 and attn_output Q5_K
    exp = {"output.weight": "Q6_K", "token_embd.weight": "Q4_K", "blk.0.attn_qkv.weight": "Q5_K",
           "blk.0.ffn_down_exps.weight": "Q4_K", "blk.2.ffn_down_exps.weight": "Q6_K",
           "blk.3.attn_v.weight": "Q8_0", "blk.3.attn_k.weight": "Q8_0", "blk.3.attn_output.weight": "Q5_K",
           "blk.0.ffn_up_exps.weight": "Q4_K", "blk.0.ffn_gate_inp.weight": "F32",
           "blk.0.ssm_conv1d.weight": "F32", "blk.0.attn_norm.weight": "F32", "blk.0.ssm_ba.weight": "Q4_K"}
    bad = {n: (ty.get(n), t) for n, t in exp.items() if ty.get(n) != t}
    if bad:
        raise CaseFailure("q4_k_m types wrong: %s" % bad)
    if r.kv.get("general.file_type") != 15:
        raise CaseFailure("q4_k_m file_type %r" % r.kv.get("general.file_type"))
    return "qwen3next (split, legacy), qwen3, llama layouts; q4_k_m types %s" % sorted(set(ty.values()))


def t_c_synth_mix_types(ctx):
    """`hyserve synth --dtype q4_k_m / q5_k_m` stores each tensor in the type make_model.py's
    weight_dtype (llama-quantize's rule, written separately) picks, and writes file_type 15 / 17."""
    cases = [("qwen35_24_tied_q4_k_m", aspec(arch="qwen35", layers=24, attn_every=4, tied=True, dtype="q4_k_m", **Q)),
             ("qwen35_16_untied_q5_k_m", aspec(arch="qwen35", layers=16, attn_every=4, dtype="q5_k_m", **Q)),
             ("qwen3next_8exp_q4_k_m", aspec(arch="qwen3next", layers=8, attn_every=4, dtype="q4_k_m",
                                             **dict(Q, expert_ff=256))),
             ("llama_8_q5_k_m", aspec(arch="llama", layers=8, dtype="q5_k_m", **dict(Q, rope_dim=64)))]
    seen = set()
    for tag, s in cases:
        need_synth_arch(ctx, s)
        cpath = os.path.join(ctx.tmpdir, "mix_c_%s.gguf" % tag)
        ppath = os.path.join(ctx.tmpdir, "mix_py_%s.gguf" % tag)
        run(c_argv(ctx.hyserve, cpath, 5, s), "hyserve synth")
        make_model.main(py_argv(ppath, 5, s))
        rc, rp = gguf_io.GGUFReader(cpath), gguf_io.GGUFReader(ppath)
        tc = {n: ti.type_name for n, ti in rc.tensors.items()}
        tp = {n: ti.type_name for n, ti in rp.tensors.items()}
        common = sorted(set(tc) & set(tp))
        bad = {n: (tc[n], tp[n]) for n in common if tc[n] != tp[n]}
        if bad or len(common) < 20:
            raise CaseFailure("%s: C synth vs make_model types differ (%d common): %s" % (tag, len(common), bad))
        want_ft = make_model.FILE_TYPE[s["dtype"]]
        if rc.kv.get("general.file_type") != want_ft:
            raise CaseFailure("%s: file_type %r, want %d" % (tag, rc.kv.get("general.file_type"), want_ft))
        seen |= {(n.split(".", 2)[-1] if n.startswith("blk.") else n, tc[n]) for n in common}
    for need in [("attn_v.weight", "Q6_K"), ("attn_v.weight", "Q4_K"), ("attn_v.weight", "Q8_0"),
                 ("ffn_down.weight", "Q6_K"), ("ffn_down.weight", "Q5_K"), ("attn_qkv.weight", "Q5_K"),
                 ("attn_qkv.weight", "Q6_K"), ("token_embd.weight", "Q6_K"), ("output.weight", "Q6_K")]:
        if need not in seen:
            raise CaseFailure("no case exercised %s as %s" % need)
    return "%d files, C synth types == make_model's rule; file_type 15/17" % len(cases)


def t_ref_cli_other_archs(ctx):
    path = os.path.join(ctx.tmpdir, "ref_cli_llama.gguf")
    make_model.main(py_argv(path, 53, aspec(arch="llama", layers=2, tied=True)))
    want = models_ref.load_model(path).forward([1, 2, 3, 250])
    for script in ("models_ref.py", "qwen35_ref.py"):
        cli = [sys.executable, "-B", os.path.join(HERE, "ref", script), path, "--tokens", "1,2,3,250", "--all"]
        obj = json.loads(run(cli, script)[0])
        if obj["tokens"] != [1, 2, 3, 250] or not np.array_equal(np.array(obj["logits"]), want):
            raise CaseFailure("%s CLI output differs from models_ref.forward" % script)
    return "models_ref.py and qwen35_ref.py CLIs run llama, exact repr floats"


# --------------------------------------------------------------------------
# the C golden cases
# Quantized cases need every 2-D weight's ne[0] a multiple of 256 (embd, heads*head_dim,
# n_v*dv, ff, expert ff all 256), so no fallback type sneaks in.

Q = dict(embd=256, heads=4, kv_heads=2, head_dim=64, rope_dim=16, nk=2, nv=4, dk=64, dv=64, ff=256,
         expert_ff=256, shared_ff=256)

GOLDEN = [
    # (b) architectures
    ("py_qwen3next_split_nv_2nk_f32", "py", 61, aspec(arch="qwen3next", layers=4, attn_every=2)),
    ("py_qwen3next_legacy_ssm_in_nv_2nk_f32", "py", 62, aspec(arch="qwen3next", layers=4, pattern="LLAL",
                                                               legacy=True)),
    ("py_qwen3next_nv_eq_nk_top1_tied_bf16", "py", 63, aspec(arch="qwen3next", layers=4, attn_every=4, nk=4,
                                                              nv=4, experts=4, experts_used=1, tied=True,
                                                              dtype="bf16")),
    ("c_qwen3next_nv_2nk_f32", "c", 64, aspec(arch="qwen3next", layers=4, attn_every=4)),
    ("c_qwen3next_nv_2nk_top4_untied_f16", "c", 65, aspec(arch="qwen3next", layers=4, attn_every=2, experts=16,
                                                           experts_used=4, expert_ff=32, shared_ff=96,
                                                           dtype="f16")),
    ("py_qwen3_gqa_untied_f32", "py", 66, aspec(arch="qwen3", layers=4)),
    ("c_qwen3_gqa_tied_f32", "c", 67, aspec(arch="qwen3", layers=4, tied=True)),
    ("py_llama_gqa_untied_f32", "py", 68, aspec(arch="llama", layers=4)),
    ("py_llama_mha_tied_bf16", "py", 69, aspec(arch="llama", layers=4, heads=4, kv_heads=4, tied=True,
                                               dtype="bf16")),
    ("c_llama_gqa_tied_f32", "c", 70, aspec(arch="llama", layers=4, tied=True)),
    ("py_llama_rope_freqs_llama3_style_f32", "py", 71, aspec(arch="llama", layers=2, rope_freqs=True)),
    # (c) quantized files (make_model): C vs reference on the same file, and distance to f32
    ("py_qwen35_q8_0", "py", 72, aspec(arch="qwen35", layers=4, attn_every=4, dtype="q8_0", **Q)),
    ("py_qwen3_q4_0", "py", 73, aspec(arch="qwen3", layers=4, dtype="q4_0",
                                      **dict(Q, rope_dim=64))),
    ("py_llama_q4_k", "py", 74, aspec(arch="llama", layers=4, dtype="q4_k", **dict(Q, rope_dim=64))),
    ("py_qwen3next_q5_k", "py", 75, aspec(arch="qwen3next", layers=4, attn_every=2, dtype="q5_k", **Q)),
    ("py_qwen35_q6_k", "py", 76, aspec(arch="qwen35", layers=4, attn_every=2, dtype="q6_k", **Q)),
    ("py_qwen3next_q4_k_m", "py", 77, aspec(arch="qwen3next", layers=4, attn_every=4, dtype="q4_k_m", **Q)),
    # quantized files written by the C synth
    ("c_qwen3_q8_0", "c", 78, aspec(arch="qwen3", layers=4, dtype="q8_0", **dict(Q, rope_dim=64))),
    ("c_qwen3next_q4_k", "c", 79, aspec(arch="qwen3next", layers=4, attn_every=4, dtype="q4_k", **Q)),
    ("c_qwen35_q4_k_m", "c", 80, aspec(arch="qwen35", layers=8, attn_every=4, tied=True, dtype="q4_k_m", **Q)),
    ("c_qwen35_q5_k_m", "c", 81, aspec(arch="qwen35", layers=8, attn_every=2, dtype="q5_k_m", **Q)),
]


def make_golden(name, writer, seed, s):
    def t(ctx):
        return golden(ctx, name, seed, s, writer)
    return t


def all_tests():
    tests = [("ref_quants_self_test", t_ref_quants_self_test),
             ("ref_make_model_arch_layouts", t_ref_make_model_arch_layouts),
             ("ref_qwen3next_legacy_ssm_in_equals_split_form", t_ref_qwen3next_legacy_equals_split),
             ("ref_qwen3next_grouped_equals_qwen35_tiled_deltanet", t_ref_qwen3next_grouped_equals_qwen35_tiled),
             ("ref_llama_norm_rope_matches_hf_rotate_half", t_ref_llama_norm_rope_matches_hf_rotate_half),
             ("ref_moe_routing_topk_ties_renorm_shared", t_ref_moe_routing),
             ("ref_segmented_decode_qwen3next_llama_qwen3", t_ref_qwen3next_segmented_decode),
             ("ref_cli_other_archs", t_ref_cli_other_archs),
             ("c_synth_k_m_mix_types_match_llama_quantize_rule", t_c_synth_mix_types)]
    for t in DEQ_TYPES:
        tests.append(("c_tensor_dequant_bitexact_%s" % t, t_c_dequant(t)))
    for name, writer, seed, s in GOLDEN:
        tests.append((name, make_golden(name, writer, seed, s)))
    tests += [("c_unsupported_tensor_type_q5_0_clear_error", t_c_unsupported_type_error),
              ("c_unsupported_architecture_clear_error", t_c_unsupported_arch_error)]
    return tests


if __name__ == "__main__":
    sys.exit(tr.main(sys.argv[1:], tests=all_tests()))

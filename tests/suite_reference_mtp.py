#!/usr/bin/python3
"""suite_reference_mtp.py - golden cases of the MTP (multi-token prediction) draft head:
`hyserve logits --mtp --all` against the float64 reference, qwen35_ref.Qwen35Ref.mtp_logits.

Owns: the MTP cases of the reference suite (docs/models.md 1.7 is the layout and the math):
  - files with one MTP block (make_model.py --nextn 1 for qwen35, make_hybrid_model.py
    --arch qwen35moe --nextn 1), F32 weights (and one F16 file): the block's head falling back
    to the trunk's (untied output.weight, tied token_embd) and its own nextn.embed_tokens /
    nextn.shared_head_head; every one of the n-1 rows of `--mtp --all` on a 64-token prompt
        max_i  max|c_i - ref_i| / max|ref_i|  <=  1e-4   (suite_reference.TOL)
    and the one row printed without --all (row n-2); the first file also on 2, 3 and 150
    tokens; and, before any of that, each file's trunk logits (`--all` without --mtp) within
    1e-4 of Qwen35Ref.forward (the block must not change them);
  - the contract's CLI errors: a file without an MTP block, and fewer than 2 tokens, each one
    line on stderr and exit 2 (after checking that this build accepts --mtp at all, so that an
    unknown option cannot pass for either);
  - the reference's own checks, which need no C binary: the generators' MTP tensor layout, and
    self_test_mtp (prefix invariance, cached vs batched chained rows, and how far the wrong
    readings of the contract -- eh_proj's input halves swapped, t_i's embedding for t_{i+1}'s, h
    before output_norm, the trunk's table or head for the block's own, each row attending to
    itself only -- land from it: each must be over 100 x the tolerance, or the golden cases
    could not catch it).
Until `hyserve logits` knows --mtp the C cases FAIL with "hyserve logits does not accept --mtp"
(never a skip, never a pass).
Does not: check chained drafts (depth > 1) against C (the CLI prints first-depth rows only; the
reference has them, Qwen35Ref.mtp_chain), quantized MTP weights, or files with N > 1 MTP
blocks. The RoPE position offset of the block's rows (i, not i+1) cannot be checked through
the logits at all: RoPE attention sees only position differences (self_test_mtp's pos_plus1
distance is ~1e-16).

Runs inside tests/suite_reference.py (its all_tests() appends these; select them with -k mtp);
alone: /usr/bin/python3 tests/suite_reference_mtp.py [-v] [-k SUBSTRING] [--list] [--keep]
"""

import os
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), d) for d in ("ref", ".")]
import harness  # noqa: E402  (first: it pins numpy's BLAS to one thread)
from harness import CaseFailure, c_env, compare, f32_floor, need_hyserve, parse_logits  # noqa: E402
import suite_reference as tr  # noqa: E402  (TOL; suite_reference.all_tests() aliases itself when run as main)

import numpy as np  # noqa: E402

import gguf_io  # noqa: E402
import hybrid_ref  # noqa: E402
import make_hybrid_model  # noqa: E402
import make_model  # noqa: E402
import qwen35_ref  # noqa: E402

TOL = tr.TOL
SELF_TOL = 1e-10
PROMPT_BASE = 5000
TRUNK = ["--layers", "4", "--interval", "4", "--nk", "2", "--nv", "4"]      # LLLA, tiled value heads
QWEN35 = TRUNK + ["--dtype", "f32", "--nextn", "1"]

# name, generator ("qwen35": make_model.py, "qwen35moe": make_hybrid_model.py), seed, flags,
# (own nextn.embed_tokens, own nextn.shared_head_head)
MODELS = [
    ("mtp_qwen35_untied_f32_trunk_head", "qwen35", 51, QWEN35 + ["--untied"], (False, False)),
    ("mtp_qwen35_tied_f32_trunk_head", "qwen35", 52, QWEN35 + ["--tied"], (False, False)),
    ("mtp_qwen35_untied_f32_own_embed_own_head", "qwen35", 53,
     QWEN35 + ["--untied", "--nextn-embed", "--nextn-head"], (True, True)),
    # F16 storage (exact in the reference; the C prompt path multiplies it on f32 activations)
    ("mtp_qwen35_untied_f16_own_head", "qwen35", 56,
     TRUNK + ["--dtype", "f16", "--nextn", "1", "--untied", "--nextn-head"], (False, True)),
    ("mtp_qwen35moe_f32_trunk_head", "qwen35moe", 54,
     ["--arch", "qwen35moe", "--layers", "4", "--interval", "4", "--nk", "2", "--nv", "4", "--experts", "8",
      "--experts-used", "2", "--expert-ff", "32", "--shared-ff", "64", "--nextn", "1"], (False, False)),
]


def prompt(seed, n=harness.N_PROMPT, vocab=256):
    return harness.prompt(seed, vocab, PROMPT_BASE)[:n]


def model(ctx, name, gen, seed, flags):
    """Write the file once per run; (path, reference model with its MTP block loaded)."""
    path = os.path.join(ctx.tmpdir, name + ".gguf")
    if path not in ctx.models:
        argv = ["-o", path, "--seed", str(seed)] + flags
        (make_model if gen == "qwen35" else make_hybrid_model).main(argv)
        m = hybrid_ref.load_model(path)
        m.load_mtp()
        ctx.models[path] = m
    return path, ctx.models[path]


def run_rc(argv):
    """Run the C binary; (exit status, stdout text, stderr text), or CaseFailure if it cannot."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=harness.TIMEOUT,
                           env=c_env())
    except subprocess.TimeoutExpired:
        raise CaseFailure("timed out after %ds: %s" % (harness.TIMEOUT, " ".join(argv)))
    except OSError as e:
        raise CaseFailure("could not start %s: %s" % (argv[0], e))
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def c_mtp(ctx, path, tokens, all_rows=True):
    """`hyserve logits --mtp [--all]`: (rows [n-1 or 1, n_vocab], its stdout bytes length). An
    unknown --mtp reads as the C side missing, named as such."""
    need_hyserve(ctx)
    argv = [ctx.hyserve, "logits", "-m", path, "--tokens", ",".join(map(str, tokens)), "--mtp"]
    if all_rows:
        argv.append("--all")
    rc, out, err = run_rc(argv)
    if rc != 0:
        low = err.lower()
        if "--mtp" in err and any(w in low for w in ("unknown", "unrecognized", "invalid option", "usage")):
            raise CaseFailure("hyserve logits does not accept --mtp (the C side of the MTP contract is not in "
                              "this build): exit %d: %s" % (rc, err.strip()[-300:]))
        raise CaseFailure("hyserve logits --mtp exited with %d: %s\n      stderr: %s" % (
            rc, " ".join(argv[:5]) + " ...", err.strip()[-600:]))
    return parse_logits(out.encode(), tokens)


def mtp_golden(ctx, name, gen, seed, flags, own):
    path, m = model(ctx, name, gen, seed, flags)
    M = m.mtp
    if (M["own_embed"], M["own_head"]) != own:
        raise CaseFailure("file's MTP block has own embed/head %s, the spec asks %s" % (
            (M["own_embed"], M["own_head"]), own))
    tokens = prompt(seed)
    # the trunk first: `--all` without --mtp must still ignore the block
    need_hyserve(ctx)
    trunk_err = compare(harness.c_logits(ctx, path, tokens)[0], m.forward(tokens))[0]
    if trunk_err > TOL:
        raise CaseFailure("the trunk's logits (--all without --mtp) are %.3e from the reference (tol %.0e): "
                          "the MTP block must not change them" % (trunk_err, TOL))
    ref = m.mtp_logits(tokens)
    c = c_mtp(ctx, path, tokens)
    err, worst, rows = compare(c, ref)
    floor = f32_floor(m, tokens, ref, lambda mm, t: mm.mtp_logits(t))
    head = "own head" if M["own_head"] else ("tied token_embd head" if m.output is m.tok_embd else "output.weight head")
    msg = "max_rel_err %.3e (tol %.0e) over %d rows, worst row %d, f32 floor %.1e, %s%s, trunk %.1e" % (
        err, TOL, len(rows), worst, floor, head, ", own embed" if M["own_embed"] else "", trunk_err)
    gap = getattr(m, "min_route_gap", None)
    if gap is not None and np.isfinite(gap):
        msg += ", min router gap %.1e" % gap
    if err > TOL:
        msg += "; first row over tol: %d" % int(np.argmax(rows > TOL))
        if floor > TOL / 10:
            msg += " (the model itself is ill-conditioned on this prompt: suspect the seed, not only the engine)"
        raise CaseFailure(msg)
    last = c_mtp(ctx, path, tokens, all_rows=False)
    err1 = compare(last, ref[-1:])[0]
    if err1 > TOL:
        raise CaseFailure("without --all: the one row is %.3e from reference row n-2 (tol %.0e)" % (err1, TOL))
    return msg + ", without --all row n-2 %.1e" % err1


def t_mtp_qwen35_prompt_lengths(ctx):
    """The first file on 2 and 3 tokens (the block's attention over 1 and 2 rows) and on 150
    (the trunk's and the block's rows over more than two 64-token chunks)."""
    name, gen, seed, flags, _ = MODELS[0]
    path, m = model(ctx, name, gen, seed, flags)
    long_prompt = prompt(seed) + harness.prompt(seed + 1, 256, PROMPT_BASE) + prompt(seed + 2, 22)
    parts = []
    for tokens in (prompt(seed, 2), prompt(seed, 3), long_prompt):
        ref = m.mtp_logits(tokens)
        err, worst, _ = compare(c_mtp(ctx, path, tokens), ref)
        parts.append("%d tokens %.2e (worst row %d)" % (len(tokens), err, worst))
        if err > TOL:
            raise CaseFailure("max_rel_err over tol %.0e: %s" % (TOL, ", ".join(parts)))
    return "max_rel_err " + ", ".join(parts)


def check_accepts_mtp(ctx):
    """The positive run the negative checks stand on: an MTP file with 2 tokens gives 1 row."""
    name, gen, seed, flags, _ = MODELS[0]
    path, _ = model(ctx, name, gen, seed, flags)
    rows = c_mtp(ctx, path, prompt(seed, 2))
    if rows.shape[0] != 1:
        raise CaseFailure("--mtp --all on 2 tokens printed %d rows, expected 1" % rows.shape[0])
    return path


def expect_one_line_exit_2(argv, must_contain):
    """Run argv; it must exit 2, print nothing on stdout and one line on stderr containing every
    string of must_contain (case-insensitive). Returns that line."""
    rc, out, err = run_rc(argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if rc != 2 or out.strip() or len(lines) != 1:
        raise CaseFailure("%s: exit %d (want 2), stdout %r, stderr %d lines (want 1): %r" % (
            " ".join(argv[1:3]), rc, out[:80], len(lines), err[:300]))
    low = lines[0].lower()
    missing = [s for s in must_contain if s.lower() not in low]
    if missing:
        raise CaseFailure("error line does not name %s: %r" % (missing, lines[0]))
    return lines[0]


def t_mtp_cli_file_without_mtp_block_exits_2(ctx):
    check_accepts_mtp(ctx)
    path = os.path.join(ctx.tmpdir, "mtp_none.gguf")
    make_model.main(["-o", path, "--seed", "55", "--layers", "4", "--interval", "4"])
    msgs = []
    for extra in (["--all"], []):
        msgs.append(expect_one_line_exit_2([ctx.hyserve, "logits", "-m", path, "--tokens", "1,2,3", "--mtp"] + extra,
                                           [path, "no MTP block"]))
    return "exit 2, one line: %r" % msgs[0]


def t_mtp_cli_fewer_than_2_tokens_exits_2(ctx):
    path = check_accepts_mtp(ctx)
    msgs = []
    for extra in (["--all"], []):
        msgs.append(expect_one_line_exit_2([ctx.hyserve, "logits", "-m", path, "--tokens", "7", "--mtp"] + extra,
                                           ["token"]))
    return "exit 2, one line: %r" % msgs[0]


def t_ref_mtp_make_model_writes_mtp_block_layout(ctx):
    """The generators' MTP block: the trunk's gated attention layer tensors, the FFN kind, the four
    nextn tensors, the optional two only when asked; block_count = layers + 1, nextn_predict_layers 1."""
    D, V, H, Hkv, hd, F = 64, 256, 4, 2, 16, 128
    attn = {"attn_norm.weight": (D,), "attn_q.weight": (D, 2 * H * hd), "attn_k.weight": (D, Hkv * hd),
            "attn_v.weight": (D, Hkv * hd), "attn_output.weight": (H * hd, D), "attn_q_norm.weight": (hd,),
            "attn_k_norm.weight": (hd,), "post_attention_norm.weight": (D,),
            "nextn.eh_proj.weight": (2 * D, D), "nextn.enorm.weight": (D,), "nextn.hnorm.weight": (D,),
            "nextn.shared_head_norm.weight": (D,)}
    dense = {"ffn_gate.weight": (D, F), "ffn_up.weight": (D, F), "ffn_down.weight": (F, D)}
    E, Fe, Fs = 8, 32, 64
    moe = {"ffn_gate_inp.weight": (D, E), "ffn_gate_exps.weight": (D, Fe, E), "ffn_up_exps.weight": (D, Fe, E),
           "ffn_down_exps.weight": (Fe, D, E), "ffn_gate_inp_shexp.weight": (D,), "ffn_gate_shexp.weight": (D, Fs),
           "ffn_up_shexp.weight": (D, Fs), "ffn_down_shexp.weight": (Fs, D)}
    own = {"nextn.embed_tokens.weight": (D, V), "nextn.shared_head_head.weight": (D, V)}
    checked = 0
    for name, gen, seed, flags, (oe, oh) in MODELS:
        path, _ = model(ctx, name, gen, seed, flags)
        r = gguf_io.GGUFReader(path)
        arch = r.get("general.architecture")
        if r.kv[arch + ".block_count"] != 5 or r.kv.get(arch + ".nextn_predict_layers") != 1:
            raise CaseFailure("%s: block_count %r nextn_predict_layers %r" % (
                name, r.kv[arch + ".block_count"], r.kv.get(arch + ".nextn_predict_layers")))
        want = dict(attn)
        want.update(dense if gen == "qwen35" else moe)
        if oe:
            want["nextn.embed_tokens.weight"] = own["nextn.embed_tokens.weight"]
        if oh:
            want["nextn.shared_head_head.weight"] = own["nextn.shared_head_head.weight"]
        got = {n[len("blk.4."):]: ti.ne for n, ti in r.tensors.items() if n.startswith("blk.4.")}
        if got != want:
            raise CaseFailure("%s: MTP block layout: missing %s extra %s wrong %s" % (
                name, sorted(set(want) - set(got)), sorted(set(got) - set(want)),
                sorted(n for n in want if n in got and got[n] != want[n])))
        checked += 1
    return "%d files: blk.4 = attention + FFN + nextn tensors (own embed/head only when asked)" % checked


def t_ref_mtp_self_checks(ctx):
    parts = []
    for name, gen, seed, flags, _ in MODELS:
        _, m = model(ctx, name, gen, seed, flags)
        r = qwen35_ref.self_test_mtp(m, prompt(seed, 32), ctx.verbose)
        v = r["variants"]
        far = {k: d for k, d in v.items() if k != "pos_plus1"}
        bad = []
        if not r["prefix"] < SELF_TOL:
            bad.append("prefix invariance %.3e" % r["prefix"])
        if not r["chain"] < SELF_TOL:
            bad.append("chain cached vs batched %.3e" % r["chain"])
        bad += ["%s only %.2e away" % (k, d) for k, d in far.items() if not d > 100 * TOL]
        if not v["pos_plus1"] < SELF_TOL:
            bad.append("pos_plus1 %.2e (RoPE attention should see differences only)" % v["pos_plus1"])
        parts.append("%s: prefix %.1e chain %.1e, nearest wrong reading %s %.2e" % (
            name[4:], r["prefix"], r["chain"], min(far, key=far.get), min(far.values())))
        if bad:
            raise CaseFailure("%s: %s" % (name, "; ".join(bad)))
    return "; ".join(parts)


def all_tests():
    tests = [("ref_mtp_make_model_writes_mtp_block_layout", t_ref_mtp_make_model_writes_mtp_block_layout),
             ("ref_mtp_self_checks", t_ref_mtp_self_checks)]
    for name, gen, seed, flags, own in MODELS:
        tests.append((name, (lambda n, g, s, f, o: lambda ctx: mtp_golden(ctx, n, g, s, f, o))(
            name, gen, seed, flags, own)))
    tests += [("mtp_qwen35_untied_f32_prompts_of_2_3_150_tokens", t_mtp_qwen35_prompt_lengths),
              ("mtp_cli_file_without_mtp_block_exits_2", t_mtp_cli_file_without_mtp_block_exits_2),
              ("mtp_cli_fewer_than_2_tokens_exits_2", t_mtp_cli_fewer_than_2_tokens_exits_2)]
    return tests


def main(argv=None):
    return harness.main(argv, all_tests(), "reference_mtp")


if __name__ == "__main__":
    sys.exit(main())

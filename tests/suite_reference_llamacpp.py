#!/usr/bin/python3
"""suite_reference_llamacpp.py - hyserve's logits against llama.cpp's, recorded as figures.

Owns: one case per fixture in tests/data/llamacpp/*.json (qwen35, qwen35moe, granitehybrid
dense and MoE, nemotron_h, lfm2, falcon-h1, jamba, kimi-linear). Each fixture holds the
`hyserve synth` arguments of a small F32 file, that file's sha256, a prompt and llama.cpp's
logits at every position of it (how they were made: tests/data/llamacpp/README.md). A case
synthesizes the file again into the run's scratch directory, requires the same sha256 (else
the synthesizer changed and the fixture must be re-recorded), runs `hyserve logits --all` on
the prompt and requires at every position t
    max_v |hyserve_t,v - llama.cpp_t,v|  <=  TOL * max(1, max_v |llama.cpp_t,v|)   (TOL 1e-3)
Needs no llama.cpp build: the figures are the reference.
Does not: test the float64 reference (tests/suite_reference_hybrid.py does), quantized files,
long prompts or decode steps.

Runs inside tests/suite_reference.py when its all_tests() appends these (one line there), so
that suite's last line stays "reference: N passed, N failed"; alone:
  /usr/bin/python3 tests/suite_reference_llamacpp.py [-v] [-k SUBSTRING] [--list] [--keep]
"""

import glob
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.dont_write_bytecode = True

import harness  # noqa: E402  (first: it pins numpy's BLAS to one thread)
from harness import CaseFailure, c_logits, need_hyserve, run  # noqa: E402

import numpy as np  # noqa: E402

TOL = 1e-3
FIXTURES = os.path.join(HERE, "data", "llamacpp")
FIELDS = ("arch", "synth_args", "sha256", "tokens", "logits", "llama_cpp_commit", "command")


def load_fixture(path):
    with open(path) as f:
        fx = json.load(f)
    missing = [k for k in FIELDS if k not in fx]
    if missing:
        raise CaseFailure("%s lacks %s" % (os.path.relpath(path, HERE), ", ".join(missing)))
    ref = np.array(fx["logits"], dtype=np.float64)
    if ref.ndim != 2 or ref.shape[0] != len(fx["tokens"]):
        raise CaseFailure("%s: logits shape %s for %d tokens" % (os.path.relpath(path, HERE), ref.shape,
                                                                len(fx["tokens"])))
    return fx, ref


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def against_llamacpp(path):
    name = os.path.splitext(os.path.basename(path))[0]

    def fn(ctx):
        fx, ref = load_fixture(path)
        need_hyserve(ctx)
        model = os.path.join(ctx.tmpdir, "llamacpp_%s.gguf" % name)
        run([ctx.hyserve, "synth", "-o", model] + fx["synth_args"], "hyserve synth")
        got = sha256(model)
        if got != fx["sha256"]:
            raise CaseFailure("the synthesizer changed: `hyserve synth %s` now writes sha256 %s, the fixture "
                              "recorded %s; re-record tests/data/llamacpp/%s.json as tests/data/llamacpp/README.md "
                              "says (llama.cpp %s)" % (" ".join(fx["synth_args"]), got[:16], fx["sha256"][:16],
                                                       name, fx["llama_cpp_commit"][:12]))
        c, dt = c_logits(ctx, model, fx["tokens"])
        if c.shape != ref.shape:
            raise CaseFailure("hyserve logits shape %s != llama.cpp's %s" % (c.shape, ref.shape))
        if not np.all(np.isfinite(c)):
            raise CaseFailure("hyserve logits not finite (first at %s)" % (np.argwhere(~np.isfinite(c))[0],))
        diff = np.abs(c - ref).max(axis=1)
        scale = np.maximum(1.0, np.abs(ref).max(axis=1))
        ratio = diff / scale
        worst = int(ratio.argmax())
        msg = "%s, %d tokens: max|hyserve - llama.cpp| %.2e (%.1e of max(1, max|logit|), tol %.0e) worst pos %d, " \
              "at recording %.2e, C %.2fs" % (fx["arch"], len(fx["tokens"]), float(diff.max()), float(ratio.max()),
                                             TOL, worst, fx.get("max_abs_diff_at_recording", float("nan")), dt)
        if ratio.max() > TOL:
            top = int(np.abs(c[worst] - ref[worst]).argmax())
            raise CaseFailure(msg + "; first position over tol %d, worst token %d (hyserve %.6g, llama.cpp %.6g)" % (
                int(np.argmax(ratio > TOL)), top, c[worst, top], ref[worst, top]))
        return msg
    return fn


def t_fixtures_present(ctx):
    paths = sorted(glob.glob(os.path.join(FIXTURES, "*.json")))
    if not paths:
        raise CaseFailure("no fixtures in %s" % os.path.relpath(FIXTURES, HERE))
    archs = sorted({load_fixture(p)[0]["arch"] for p in paths})
    return "%d fixtures: %s" % (len(paths), ", ".join(archs))


def all_tests():
    tests = [("ref_llamacpp_fixtures_present", t_fixtures_present)]
    for path in sorted(glob.glob(os.path.join(FIXTURES, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        tests.append(("c_llamacpp_%s" % name, against_llamacpp(path)))
    return tests


if __name__ == "__main__":
    sys.exit(harness.main(sys.argv[1:], all_tests(), "reference"))

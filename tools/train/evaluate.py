#!/usr/bin/python3
"""evaluate.py - perplexity and bits per byte of a GGUF model on a text file, in PyTorch.

Owns: the scoring definition shared with `hyserve perplexity`
(cli/cli_perplexity.c); both must compute the same number on the same
token windows:

  t      = tokenize(text) without special-token parsing, n tokens
  u      = [s] + t, L = n + 1 tokens, s = the model's BOS id, or EOS when it
           has no BOS (this model: <|endoftext|>, the document separator it
           was trained with). s is context only, never scored.
  window k = u[b_k, e_k) with b_k = k * stride, e_k = min(b_k + ctx, L),
           evaluated from an empty state at positions 0 .. e_k - b_k - 1;
           the last window is the first with e_k = L.
  scored: window k scores the targets u[j], j in [max(b_k + 1, e_{k-1}), e_k)
           (e_{-1} = 0), with -log softmax(logits at j - 1)[u[j]]; so every
           token of t is scored exactly once, the first window scores all its
           targets and every later window its last stride tokens, each with at
           least ctx - stride tokens of context.
  perplexity    = exp(NLL / n),  NLL = summed natural-log loss over the n targets
  bits per byte = NLL / ln 2 / (UTF-8 bytes of the text)
Requires 2 <= ctx and 1 <= stride <= ctx - 1. Defaults: ctx 512, stride 256.

Owns too: the command line `evaluate.py -m MODEL.gguf -f TEXT [--ctx N]
[--stride S]`, printing the same lines as `hyserve perplexity`.
Does not: train; it loads the model from the GGUF file (export.load), so it
scores exactly the shipped weights (F16 values included).
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402


def windows(L, ctx, stride):
    """[(b, e, first_scored_target)] for a stream of L tokens (see the header)."""
    if ctx < 2 or not 1 <= stride <= ctx - 1:
        raise ValueError("need ctx >= 2 and 1 <= stride <= ctx - 1")
    out = []
    prev_e = 0
    b = 0
    while True:
        e = min(b + ctx, L)
        out.append((b, e, max(b + 1, prev_e)))
        if e == L:
            return out
        prev_e = e
        b += stride


def perplexity(model, ids, start_id, n_bytes, ctx=512, stride=256, batch=8, log=None):
    """dict(tokens, windows, nll, ppl, bpb) for token ids of a text of n_bytes bytes."""
    u = [start_id] + list(ids)
    L = len(u)
    wins = windows(L, ctx, stride)
    total = 0.0
    n_scored = 0
    model.eval()
    with torch.no_grad():
        # windows of equal length go through the model together
        groups = {}
        for w in wins:
            groups.setdefault(w[1] - w[0], []).append(w)
        for length, ws in sorted(groups.items()):
            for i in range(0, len(ws), batch):
                part = ws[i:i + batch]
                x = torch.tensor([u[b:e] for b, e, _ in part], dtype=torch.long)
                logp = F.log_softmax(model(x).double(), dim=-1)        # [B, T, V]
                for r, (b, e, j0) in enumerate(part):
                    tgt = torch.tensor(u[j0:e], dtype=torch.long)
                    rows = logp[r, j0 - 1 - b:e - 1 - b]
                    total -= rows.gather(1, tgt[:, None]).sum().item()
                    n_scored += e - j0
            if log:
                log("eval: %d-token windows done (%d scored so far)" % (length, n_scored))
    assert n_scored == len(ids), (n_scored, len(ids))
    return {"tokens": len(ids), "windows": len(wins), "ctx": ctx, "stride": stride,
            "bytes": n_bytes, "nll": total, "ppl": math.exp(total / len(ids)),
            "bpb": total / math.log(2) / n_bytes}


def evaluate_file(gguf_path, text_path, ctx=512, stride=256, log=None):
    m, tok, _ = export.load(gguf_path)
    with open(text_path, "rb") as f:
        raw = f.read()
    ids = tok.encode(raw.decode("utf-8"))
    return perplexity(m, ids, tok.eos_id, len(raw), ctx, stride, log=log)


def format_result(r):
    return ("tokens: %d  windows: %d  ctx: %d  stride: %d  bytes: %d\n"
            "nll: %.6f nats/token\nperplexity: %.4f\nbits per byte: %.4f"
            % (r["tokens"], r["windows"], r["ctx"], r["stride"], r["bytes"],
               r["nll"] / r["tokens"], r["ppl"], r["bpb"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch perplexity of a qwen35 GGUF on a text file")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--stride", type=int, default=None, help="default ctx / 2")
    ap.add_argument("-t", "--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.time()
    r = evaluate_file(a.model, a.file, a.ctx, a.stride or a.ctx // 2)
    print(format_result(r))
    print("time: %.1f s" % (time.time() - t0), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

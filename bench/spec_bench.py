#!/usr/bin/env python3
"""Speculative decoding's decode speed against none, side by side (bench/spec.sh).

Against one running server, rounds alternate every mode, so a change of load
hits them all; each request is streamed from /generate_stream with
ignore_eos and its decode rate is (tokens - 1) / (last token's arrival -
first token's arrival): the prompt's prefill is not in it. Modes:
  none        "speculative": false
  pred_exact  a token prediction equal to the greedy output (taken once
              from a none run of the same prompt)
  pred_wrong  a prediction wrong at every position: each greedy token moved
              by 1..97 ids (a random-weight model's greedy text repeats a
              few tokens, so a shuffle of it would still be right)
  ngram       "speculative": true (n-gram drafts on a --spec-type none server)
  draft       the server's own drafts (on a --model-draft server: the draft model's)
Prints one JSON object: per prompt and mode the median tok/s, the drafts and
accepted tokens of the last run, and the ratios to none.
Usage: spec_bench.py --port P --max-new N --rounds R [--prompt NAME=TEXT ...] [--modes a,b]
"""
import argparse
import http.client
import json
import random
import statistics
import time


def stream_once(port, prompt, max_new, extra):
    params = {"max_new_tokens": max_new, "ignore_eos": True, "details": True}
    params.update(extra)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/generate_stream", body=json.dumps({"inputs": prompt, "parameters": params}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    ids, times, last = [], [], None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        d = json.loads(line[5:])
        if "token" in d:
            ids.append(d["token"]["id"])
            times.append(time.monotonic())
        if d.get("details") is not None or d.get("generated_text") is not None:
            last = d
    c.close()
    rate = (len(ids) - 1) / (times[-1] - times[0]) if len(ids) > 1 and times[-1] > times[0] else 0.0
    return ids, rate, last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", action="append", default=[], help="NAME=TEXT")
    ap.add_argument("--modes", default="none,pred_exact,pred_wrong,ngram")
    a = ap.parse_args()
    modes = a.modes.split(",")
    prompts = dict(p.split("=", 1) for p in a.prompt) or {"free": "The history of the city begins"}
    out = {"max_new": a.max_new, "rounds": a.rounds, "prompts": {}}
    for name, text in prompts.items():
        greedy, _, _ = stream_once(a.port, text, a.max_new, {"speculative": False})
        c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
        c.request("GET", "/info")
        n_vocab = json.loads(c.getresponse().read())["model"]["n_vocab"]
        c.close()
        rng = random.Random(1)
        wrong = [(t + 1 + rng.randrange(97)) % n_vocab for t in greedy]
        extra = {"none": {"speculative": False},
                 "pred_exact": {"prediction": {"type": "tokens", "tokens": greedy}},
                 "pred_wrong": {"prediction": {"type": "tokens", "tokens": wrong}},
                 "ngram": {"speculative": True},
                 "draft": {}}
        rates = {m: [] for m in modes}
        last = {}
        same = True
        for _ in range(a.rounds):
            for m in modes:
                ids, rate, fin = stream_once(a.port, text, a.max_new, extra[m])
                rates[m].append(rate)
                same = same and ids == greedy
                sp = ((fin or {}).get("details") or {}).get("speculative") or {}
                last[m] = {"draft_tokens": sp.get("draft_tokens", 0), "accepted_tokens": sp.get("accepted_tokens", 0),
                           "verify_steps": sp.get("verify_steps", 0)}
        med = {m: statistics.median(v) for m, v in rates.items()}
        out["prompts"][name] = {
            "tok_s": med, "runs": rates, "last": last, "same_tokens_as_none": same,
            "ratio_to_none": {m: (med[m] / med["none"] if med.get("none") else None) for m in modes}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

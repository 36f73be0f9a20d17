#!/usr/bin/env python3
"""prefix_bench.py - the prefix cache over HTTP, on against off (issue 26).

Two workloads against a running `hyserve serve` (one with --prefix-cache on,
one with off, started by bench/prefix.sh on the same model file):

  chat:   a conversation resent whole every turn: a system prompt, then per
          turn ~270 new user tokens and a 32-token answer (ignore_eos), for
          --turns turns (10: ~300 tokens of growth a turn to ~3,000). The
          answer's text goes back through /tokenize, as a client's history
          would (cut to 32 tokens: a random model's bytes retokenize longer). Time to first token is measured on the stream (first chunk).
  system: --n requests (32) with one 40-token system prompt and a different
          20-token question each, one after another; cached tokens each.

Prints one JSON object: per turn the prompt tokens, cached tokens and TTFT.
Python standard library only.
"""
import argparse
import http.client
import json
import random
import time


def stream_ttft(port, prompt, max_tokens):
    """POST a streamed completion; (ttft seconds, text, cached tokens)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, text, cached = None, [], None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        j = json.loads(data)
        if j.get("choices"):
            if ttft is None:
                ttft = time.monotonic() - t0
            text.append(j["choices"][0].get("text", ""))
        if j.get("usage"):
            cached = j["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    c.close()
    return ttft, "".join(text), cached


def tokenize(port, text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/tokenize", body=json.dumps({"inputs": text}).encode(),
              headers={"Content-Type": "application/json"})
    j = json.loads(c.getresponse().read())
    c.close()
    return [t["id"] for t in j]


def chat(port, turns, seed):
    rng = random.Random(seed)
    words = lambda n: [rng.randrange(300, 4000) for _ in range(n)]   # noqa: E731
    history = words(30)
    out = []
    for turn in range(1, turns + 1):
        prompt = history + words(270)
        ttft, text, cached = stream_ttft(port, prompt, 32)
        out.append({"turn": turn, "prompt_tokens": len(prompt), "cached_tokens": cached, "ttft_s": round(ttft, 4)})
        # the answer as the client would resend it: its text tokenized again
        # (not always the ids generated), cut to the 32 generated so each turn
        # grows by about 300 tokens
        history = prompt + tokenize(port, text)[:32]
    return out


def system(port, n, seed):
    rng = random.Random(seed)
    sys_prompt = [rng.randrange(300, 4000) for _ in range(40)]
    out = []
    for i in range(n):
        q = [rng.randrange(300, 4000) for _ in range(20)]
        ttft, _, cached = stream_ttft(port, sys_prompt + q, 8)
        out.append({"request": i + 1, "cached_tokens": cached, "ttft_s": round(ttft, 4)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print(json.dumps({"chat": chat(a.port, a.turns, a.seed), "system_prompt": system(a.port, a.n, a.seed + 1)}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""prefix_bench.py - the prefix cache over HTTP, on against off (issue 26).

Two workloads against a running `hyserve serve` (one with --prefix-cache on,
one with off, started by bench/prefix.sh on the same model file):

  warmup: one cold 300-token request (its own salt) before the rest, so
          turn 1 is not the server's first request; its TTFT is reported.
  chat:   a conversation resent whole every turn: a system prompt, then per
          turn ~270 new user tokens and a 32-token answer (ignore_eos), for
          --turns turns (10: ~300 tokens of growth a turn to ~3,000). The
          answer's text goes back through /tokenize, as a client's history
          would (cut to 32 tokens: a random model's bytes retokenize longer). Time to first token is measured on the stream (first chunk).
  system: --n requests (32) through /v1/chat/completions, each a system
          message of about 40 tokens (the same for all) and a user question
          of about 20 (different each), one after another; cached tokens
          each against the system turn's tokens (measured under a salt of
          its own, so the measurement leaves nothing the requests can hit).

Prints one JSON object: per turn the prompt tokens, cached tokens and TTFT.
Python standard library only.
"""
import argparse
import http.client
import json
import random
import time


def sse_ttft(port, path, body):
    """POST a streamed request; (ttft seconds: the first chunk with a token's
    text or content, the text, cached tokens from the usage chunk)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
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
        ch = j["choices"][0] if j.get("choices") else None
        # the first token: a chat stream opens with a chunk of the role and
        # no text, sent at admission (server/stream.c)
        if ch is not None and ("text" in ch or "role" not in (ch.get("delta") or {"role": 0})):
            if ttft is None:
                ttft = time.monotonic() - t0
            text.append(ch.get("text") or ch["delta"].get("content") or "")
        if j.get("usage"):
            cached = j["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    c.close()
    return ttft, "".join(text), cached


def stream_ttft(port, prompt, max_tokens):
    """A streamed completion of token ids; (ttft seconds, text, cached tokens)."""
    return sse_ttft(port, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                              "ignore_eos": True, "stream": True,
                                              "stream_options": {"include_usage": True}})


def chat_ttft(port, msgs, max_tokens):
    """A streamed chat completion; (ttft seconds, cached tokens)."""
    ttft, _, cached = sse_ttft(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": max_tokens,
                                                              "temperature": 0, "stream": True,
                                                              "stream_options": {"include_usage": True}})
    return ttft, cached


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    j = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {j}")
    return j


def tokenize(port, text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/tokenize", body=json.dumps({"inputs": text}).encode(),
              headers={"Content-Type": "application/json"})
    j = json.loads(c.getresponse().read())
    c.close()
    return [t["id"] for t in j]


def scheduler_counts(port):
    """(engine steps, prompt tokens prefilled) so far, from /stats."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/stats?requests=0")
    j = json.loads(c.getresponse().read())["scheduler"]
    c.close()
    return j["steps_total"], j["prompt_tokens_total"]


def warmup(port, seed):
    """One cold 300-token request before anything is measured (page faults
    of the mapped weights, first touches of scratch and pool memory, thread
    start-up), under a salt of its own so it leaves nothing the chat can
    hit; its TTFT is reported."""
    rng = random.Random(seed)
    body = {"prompt": [rng.randrange(300, 4000) for _ in range(300)], "max_tokens": 2, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "cache_salt": "bench-warmup"}
    return round(sse_ttft(port, "/v1/completions", body)[0], 4)


def chat(port, turns, seed):
    rng = random.Random(seed)
    words = lambda n: [rng.randrange(300, 4000) for _ in range(n)]   # noqa: E731
    history = words(30)
    out = []
    for turn in range(1, turns + 1):
        prompt = history + words(270)
        s0 = scheduler_counts(port)
        ttft, text, cached = stream_ttft(port, prompt, 32)
        s1 = scheduler_counts(port)
        # steps: engine steps of the whole request (its prefill steps, then
        # one per generated token but the first); prefilled: prompt tokens run
        out.append({"turn": turn, "prompt_tokens": len(prompt), "cached_tokens": cached, "ttft_s": round(ttft, 4),
                    "steps": s1[0] - s0[0], "prefilled": s1[1] - s0[1]})
        # the answer as the client would resend it: its text tokenized again
        # (not always the ids generated), cut to the 32 generated so each turn
        # grows by about 300 tokens
        history = prompt + tokenize(port, text)[:32]
    return out


def system_turn_tokens(port, text):
    """Tokens of the ChatML system turn of text as a chat request renders
    it: the prompt tokens of a request of that message alone, under a salt
    no other request uses, less those of the generation prompt (markup)."""
    j = post(port, "/v1/chat/completions", {"messages": [{"role": "system", "content": text}], "max_tokens": 1,
                                            "cache_salt": "bench-measure"})
    gen = len(tokenize(port, "<|im_start|>assistant\n")) - len(tokenize(port, ""))
    return j["usage"]["prompt_tokens"] - gen


def system(port, n, seed):
    rng = random.Random(seed)
    sentence = lambda k: " ".join("".join(chr(rng.randrange(97, 123)) for _ in range(rng.randrange(2, 8)))  # noqa: E731
                                  for _ in range(k))
    # a system message of about 40 tokens (the synthesized vocabulary's
    # merges decide how many words that is)
    words, sys_text, n_sys = 12, "", 0
    for _ in range(8):
        sys_text = "You are a terse assistant. " + sentence(words)
        n_sys = system_turn_tokens(port, sys_text)
        if abs(n_sys - 40) <= 3:
            break
        words = max(1, round(words * 40 / max(n_sys, 1)))
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": sys_text}, {"role": "user", "content": sentence(6) + "?"}]
        ttft, cached = chat_ttft(port, msgs, 8)
        out.append({"request": i + 1, "cached_tokens": cached, "system_turn_tokens": n_sys, "ttft_s": round(ttft, 4)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    w = warmup(a.port, a.seed + 2)
    print(json.dumps({"warmup_ttft_s": w, "chat": chat(a.port, a.turns, a.seed),
                      "system_prompt": system(a.port, a.n, a.seed + 1)}))


if __name__ == "__main__":
    main()

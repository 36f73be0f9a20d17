#!/usr/bin/env python3
"""Prefix cache black-box tests (issue 26), run by tests/suite_prefix.sh.

Servers with the cache on serve synthesized f32 models (a 3:1 hybrid and
pure attention) beside a server of the same model with `--prefix-cache off`,
the independent evidence: every greedy completion with a hit must read as
the same prompt prefilled whole. Prompts are token-id arrays (/v1/completions)
so that where two prompts part is known exactly, and the cached token counts
follow from where the state is known: a DeltaNet model restores at a
snapshot (every --prefix-snapshot-interval tokens, one short of a prompt,
where a prompt left a cached one) or a cached sequence's end; an attention
model at any token. Miss reasons are read from /metrics.
Not tested here: that a miss under another salt takes a miss's time (tests
never assert timings; the salt check is in the lookup, before any work).
"""
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_http as hs  # noqa: E402  (Server, check helpers)

HYSERVE = hs.HYSERVE
TMP = os.path.abspath(os.path.join(os.environ.get("TEST_TMPDIR", "tests/tmp"), "prefix"))
hs.TMP = TMP
check = hs.check

COMMON = ["--embd", "64", "--vocab", "300", "--ctx", "4096", "--seed", "5"]
N_GEN = 8


def complete(srv, prompt, salt=None, max_tokens=N_GEN, key=None):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if salt:
        body["cache_salt"] = salt
    st, _, j, b = srv.jreq("POST", "/v1/completions", body, {"Authorization": f"Bearer {key}"} if key else None)
    if st != 200:
        raise RuntimeError(f"completion answered {st}: {b[:200]!r}")
    return j["choices"][0]["text"], j["usage"]["prompt_tokens_details"]["cached_tokens"]


def chat(srv, msgs, salt=None, max_tokens=N_GEN):
    """A greedy /v1/chat/completions; (text, cached tokens)."""
    body = {"messages": msgs, "max_tokens": max_tokens, "temperature": 0}
    if salt:
        body["cache_salt"] = salt
    st, _, j, b = srv.jreq("POST", "/v1/chat/completions", body)
    if st != 200:
        raise RuntimeError(f"chat answered {st}: {b[:200]!r}")
    return j["choices"][0]["message"]["content"], j["usage"]["prompt_tokens_details"]["cached_tokens"]


def n_tokens(srv, text):
    """How many tokens /tokenize makes of text (control tokens parsed, the model's BOS rule)."""
    st, _, j, _ = srv.jreq("POST", "/tokenize", {"inputs": text})
    if st != 200:
        raise RuntimeError(f"/tokenize answered {st}")
    return len(j)


def turns_tokens(off, msgs):
    """Tokens of msgs' ChatML turns as a chat request renders them (message
    text is tokenized apart from the markup): the prompt tokens the
    cache-off server reports for msgs, less its generation prompt's
    (markup only: /tokenize counts it, less the BOS /tokenize of "" gives)."""
    st, _, j, b = off.jreq("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    if st != 200:
        raise RuntimeError(f"chat answered {st}: {b[:200]!r}")
    return j["usage"]["prompt_tokens"] - (n_tokens(off, "<|im_start|>assistant\n") - n_tokens(off, ""))


def reset(srv, key=None):
    st, _, j, b = srv.jreq("POST", "/reset_prefix_cache", None, {"Authorization": f"Bearer {key}"} if key else None)
    if st != 200:
        raise RuntimeError(f"/reset_prefix_cache answered {st}: {b[:200]!r}")
    return j


def misses(srv):
    """{reason: count} of hyserve_prefix_cache_misses_total, and the hit count."""
    _, _, b = srv.req("GET", "/metrics")
    out = {}
    for line in b.decode().splitlines():
        if line.startswith("hyserve_prefix_cache_misses_total{reason="):
            out[line.split('"')[1]] = int(float(line.split()[-1]))
        elif line.startswith(("hyserve_prefix_cache_hits_total ", "hyserve_prefix_cache_hits_total{")):
            out["hits"] = int(float(line.split()[-1]))
    return out


def fresh(rng, n, avoid=()):
    """n random printable-byte token ids, the first not in avoid."""
    t = [rng.randrange(33, 127) for _ in range(n)]
    while t[0] in avoid:
        t[0] = rng.randrange(33, 127)
    return t


def same_text(on, off, prompt, salt=None):
    """Completes prompt on both servers; (text equal, cached tokens on `on`, texts)."""
    a, cached = complete(on, prompt, salt)
    b, _ = complete(off, prompt)
    return a == b, cached, (a, b)


def test_hybrid_hits(on, off):
    """3:1 hybrid, snapshots every 16 tokens: a hit exactly at a snapshot,
    a match between snapshots restored from the earlier one, the branch
    point kept for the next prompt, the same prompt again; text equal to the
    cache-off server's each time."""
    rng = random.Random(1)
    base = fresh(rng, 40)
    m0 = misses(on)
    eq, cached, t = same_text(on, off, base)
    check("first prompt: nothing cached, text as without the cache", eq and cached == 0, f"{cached} {t}")
    check("first prompt counted as a miss with no entry", misses(on)["no_entry"] == m0["no_entry"] + 1)
    p2 = base[:32] + fresh(rng, 10, avoid=(base[32],))
    eq, cached, t = same_text(on, off, p2)
    check("a match ending exactly at a snapshot (32) restores 32 tokens, same text", eq and cached == 32,
          f"{cached} {t}")
    m1 = misses(on)
    p3 = base[:25] + fresh(rng, 10, avoid=(base[25],))
    eq, cached, t = same_text(on, off, p3)
    m2 = misses(on)
    check("a match between snapshots (25) restores the earlier one (16), same text", eq and cached == 16,
          f"{cached} {t}")
    check("and says so: earlier_snapshot counted", m2["earlier_snapshot"] == m1["earlier_snapshot"] + 1, f"{m1} {m2}")
    p4 = base[:25] + fresh(rng, 12, avoid=(base[25], p3[25]))
    eq, cached, t = same_text(on, off, p4)
    check("a branch point 9 tokens past the restored snapshot takes no step of its own: the next prompt parting "
          "there restores 16 again, same text", eq and cached == 16, f"{cached} {t}")
    eq, cached, t = same_text(on, off, base)
    check("the same prompt again restores all but its last token, same text", eq and cached == len(base) - 1,
          f"{cached} {t}")
    _, _, j, _ = on.jreq("GET", "/stats")
    pc = j["pools"]["prefix_cache"]
    snap = j["model"]["cache_layout"]["recurrent"]["bytes_per_seq"] if "model" in j else None
    check("/stats: one snapshot's bytes are the layout's DeltaNet state + conv per sequence",
          snap is not None and pc["snapshot_bytes_each"] == snap, f"{pc.get('snapshot_bytes_each')} vs {snap}")
    st, _, est, _ = on.jreq("POST", "/v1/memory/estimate", {"context": 1024, "budget": 10 * snap if snap else 0})
    check("/v1/memory/estimate: a snapshot's bytes, and 10 of them fit a budget of 10",
          st == 200 and est["prefix_cache"]["snapshot_bytes"] == snap and est["prefix_cache"]["snapshots_in_budget"] == 10,
          json.dumps(est and est.get("prefix_cache")))
    check("/stats: store bytes within its budget, split by kind",
          0 < pc["bytes"] <= pc["budget_bytes"]
          and pc["bytes"] == pc["attn_kv_bytes"] + pc["recurrent_state_bytes"] + pc["conv_state_bytes"], json.dumps(pc))


def test_branch_point(on, off):
    """No fixed interval: a prompt that leaves a cached one 40 tokens in
    (past PREFIX_MIN_SNAP_GAP from what it restored) keeps a snapshot there,
    and the next prompt parting at the same token restores all 40."""
    rng = random.Random(12)
    a = fresh(rng, 60)
    complete(on, a)
    b = a[:40] + fresh(rng, 10, avoid=(a[40],))
    eq1, c1, _ = same_text(on, off, b)
    c = a[:40] + fresh(rng, 12, avoid=(a[40], b[40]))
    eq2, c2, t = same_text(on, off, c)
    check("branch point: the second prompt restores nothing (no state at 40 yet), the third all 40, same texts",
          eq1 and eq2 and c1 == 0 and c2 == 40, f"{c1} {c2} {t}")


def test_multi_turn(on, off):
    """A conversation resent whole: each turn's prompt is the last prompt,
    its answer and new tokens, and reuses all of the last turn."""
    rng = random.Random(2)
    prompt = fresh(rng, 30)
    ok, detail = True, ""
    for turn in range(4):
        a, cached = complete(on, prompt)
        b, _ = complete(off, prompt)
        if turn > 0 and cached < prev_len - 1:
            ok, detail = False, f"turn {turn}: cached {cached} of a {prev_len}-token last turn"
        if a != b:
            ok, detail = False, f"turn {turn}: {a!r} vs {b!r}"
        prev_len = len(prompt)
        _, _, j, _ = on.jreq("POST", "/tokenize", {"inputs": a})
        answer = [t["id"] for t in j] if isinstance(j, list) else []
        prompt = prompt + answer + fresh(rng, 20)
    check("multi-turn: every turn reuses the whole last turn, text as without the cache", ok, detail)


def test_attention_mid_page(on, off):
    """Pure attention: no snapshots needed, a match restores at any token,
    here mid-page (21 of 16-token pages)."""
    rng = random.Random(3)
    base = fresh(rng, 40)
    same_text(on, off, base)
    p = base[:21] + fresh(rng, 9, avoid=(base[21],))
    eq, cached, t = same_text(on, off, p)
    check("attention only: a match ending mid-page (21) restores 21 tokens, same text", eq and cached == 21,
          f"{cached} {t}")


def test_salts(on, off):
    """Entries are keyed by cache_salt: the same prompt never hits across salts."""
    rng = random.Random(4)
    p = fresh(rng, 30)
    complete(on, p, salt="alice")
    _, cached_a = complete(on, p, salt="alice")
    m0 = misses(on)
    _, cached_b = complete(on, p, salt="bob")
    _, cached_none = complete(on, p)
    m1 = misses(on)
    check("same salt hits", cached_a == len(p) - 1, f"{cached_a}")
    check("another salt, or none, never hits the first's entry", cached_b == 0 and cached_none == 0,
          f"{cached_b} {cached_none}")
    check("/metrics counts those misses as salt_differs", m1["salt_differs"] == m0["salt_differs"] + 2, f"{m0} {m1}")
    st, _, j, _ = on.jreq("POST", "/v1/completions", {"prompt": p, "max_tokens": 2, "cache_salt": 5})
    check("a cache_salt that is not a string is a 400 naming it", st == 400 and "cache_salt" in json.dumps(j), f"{st}")


def steps_of(srv, prompt, max_tokens=1):
    """(engine steps the request ran, its text, cached tokens), from /stats around it (one request at a time)."""
    s0 = srv.stats()["scheduler"]["steps_total"]
    text, cached = complete(srv, prompt, max_tokens=max_tokens)
    return srv.stats()["scheduler"]["steps_total"] - s0, text, cached


def test_cold_prompt_steps(on, off):
    """Snapshots are taken inside prefill steps (the engine copies the
    DeltaNet state after that token) instead of each stopping a step: a
    cold 12-token prompt (its one snapshot one short of its end) runs one
    engine step as without the cache, and the same prompt again restores
    all but its last token from that snapshot; a 40-token one with
    snapshots at 16, 32 and 39 runs two (one inside each, the chunk ending
    at 32), where each length was a step of its own before (four)."""
    rng = random.Random(9)
    p = fresh(rng, 12)
    n_on, t_on, _ = steps_of(on, p)
    n_off, t_off, _ = steps_of(off, p)
    check("a cold 12-token prompt: one engine step with the cache as without, same text",
          n_on == 1 and n_off == 1 and t_on == t_off, f"{n_on} {n_off} {t_on!r} {t_off!r}")
    _, cached = complete(on, p)
    check("the snapshot taken inside the step restores: the same prompt again reuses 11 tokens", cached == 11,
          f"{cached}")
    q = fresh(rng, 40, avoid=(p[0],))
    n_on, t_on, _ = steps_of(on, q)
    n_off, t_off, _ = steps_of(off, q)
    check("a cold 40-token prompt, snapshots at 16, 32, 39: two steps with the cache, one without, same text",
          n_on == 2 and n_off == 1 and t_on == t_off, f"{n_on} {n_off} {t_on!r} {t_off!r}")
    hits = [complete(on, q[:k] + fresh(rng, 5, avoid=(q[k],)))[1] for k in (16, 32)]
    check("and both snapshots restore (16 and 32 tokens)", hits == [16, 32], f"{hits}")


def test_prompt_logprobs(on, off):
    """A request for prompt log probabilities (OpenAI echo + logprobs) needs
    every prompt position's logits, which the store does not keep: it
    prefills whole even when its prompt is cached, its miss reads
    prompt_logprobs, its numbers are the cache-off server's, and the entry
    it leaves serves the next plain request."""
    rng = random.Random(8)
    p = fresh(rng, 30)
    complete(on, p)
    m0 = misses(on)
    body = {"prompt": p, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 1}
    st, _, a, _ = on.jreq("POST", "/v1/completions", body)
    st2, _, b, _ = off.jreq("POST", "/v1/completions", body)
    m1 = misses(on)
    ok = st == 200 and st2 == 200
    lp_a = a["choices"][0]["logprobs"]["token_logprobs"] if ok else None
    lp_b = b["choices"][0]["logprobs"]["token_logprobs"] if ok else None
    # within 1e-4: the cache-on server's prefill stops at its snapshot lengths, other chunk sizes than off's
    close = ok and len(lp_a) == len(lp_b) == len(p) + 2 and all(
        (x is None and y is None) or (x is not None and y is not None and abs(x - y) <= 1e-4)
        for x, y in zip(lp_a, lp_b))
    check("echo + logprobs over a cached prompt: nothing restored, prompt logprobs as without the cache",
          close and a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, f"{st} {st2} {lp_a} {lp_b}")
    check("and the miss says prompt_logprobs", m1.get("prompt_logprobs") == m0.get("prompt_logprobs", 0) + 1,
          f"{m0} {m1}")
    st, _, j, _ = on.jreq("POST", "/generate", {"inputs": "".join(chr(t) for t in p), "parameters": {
        "max_new_tokens": 1, "details": True, "decoder_input_details": True}})
    check("TGI decoder_input_details: details.prefix_cache says prompt_logprobs",
          st == 200 and j["details"]["prefix_cache"] == "prompt_logprobs" and j["details"]["cached_tokens"] == 0,
          f"{st} {json.dumps(j)[:300]}")
    _, cached = complete(on, p)
    check("a plain request after it restores all but the last token", cached == len(p) - 1, f"{cached}")


def test_eviction(model, off, entry_bytes, tag="evict"):
    """A store budget for about one entry: the second prompt evicts the
    first, which then misses as 'evicted' and still reads the same."""
    budget = entry_bytes * 3 // 2
    srv = hs.Server(tag, model, "-t", "1", "--prefix-cache-mem", str(budget))
    try:
        rng = random.Random(5)
        a, b = fresh(rng, 40), fresh(rng, 40)
        complete(srv, a)
        complete(srv, b)
        m0 = misses(srv)
        eq, cached, t = same_text(srv, off, a)
        m1 = misses(srv)
        check("after eviction: nothing restored, text as without the cache", eq and cached == 0, f"{cached} {t}")
        check("and the miss says evicted", m1["evicted"] == m0["evicted"] + 1, f"{m0} {m1}")
        pc = srv.stats()["pools"]["prefix_cache"]
        check("evictions counted, store within its budget", pc["evictions"] >= 1 and pc["bytes"] <= budget,
              json.dumps(pc))
    finally:
        srv.stop()


def test_random_load(model, off):
    """Randomized load under small budgets: requests sharing prefixes of
    random lengths, several at once. The store never exceeds its budget nor
    the pool its own, every text equals the cache-off server's, and after the
    load the pool holds exactly the store's entries."""
    srv = hs.Server("load", model, "-t", "1", "--max-seqs", "4", "--cache-mem", "900K",
                    "--prefix-cache-mem", "300K", "--prefix-snapshot-interval", "8")
    try:
        rng = random.Random(6)
        stems = [fresh(rng, 48) for _ in range(3)]
        prompts = [stems[rng.randrange(3)][:rng.randrange(1, 48)] + fresh(rng, rng.randrange(1, 12))
                   for _ in range(24)]
        answers = [None] * len(prompts)

        def worker(k):
            for i in range(k, len(prompts), 3):
                answers[i] = complete(srv, prompts[i])

        seen = hs.run_watched(srv, [lambda k=k: worker(k) for k in range(3)], period=0.01)
        bad = [i for i, p in enumerate(prompts) if answers[i] is None or answers[i][0] != complete(off, p)[0]]
        check("randomized load: every text equals the cache-off server's", not bad, f"prompts {bad}")
        over = [s["pools"]["prefix_cache"] for s in seen if s and
                (s["pools"]["prefix_cache"]["bytes"] > s["pools"]["prefix_cache"]["budget_bytes"]
                 or s["pools"]["reserved_bytes"] > s["pools"]["budget_bytes"])]
        check(f"randomized load: store and pool within their budgets ({len(seen)} samples)", seen and not over,
              json.dumps(over[:1]))
        s = srv.stats()
        pc = s["pools"]["prefix_cache"]
        check("randomized load: hits and evictions both happened", pc["hits"] > 0 and pc["evictions"] > 0, json.dumps(pc))
        check("after the load the pool holds exactly the store's entries",
              s["pools"]["n_seqs"] == pc["entries"] and s["pools"]["reserved_bytes"] <= pc["bytes"]
              and s["totals"]["all_requests_bytes"] == 0, json.dumps(s["pools"]))
        j = reset(srv)
        z = srv.stats()
        zp = z["pools"]
        check("POST /reset_prefix_cache after the load: the pool back to exactly zero (pages, slots, snapshots)",
              j["freed_entries"] == pc["entries"] and j["freed_pool_bytes"] == s["pools"]["reserved_bytes"]
              and j["pool_reserved_bytes"] == 0 and zp["reserved_bytes"] == 0 and zp["n_seqs"] == 0
              and zp["attn_kv"]["blocks_used"] == 0 and zp["recurrent"]["slots_used"] == 0
              and zp["prefix_cache"]["entries"] == 0 and zp["prefix_cache"]["bytes"] == 0
              and zp["prefix_cache"]["snapshot_state_bytes_held"] == 0
              and zp["prefix_cache"]["snapshot_conv_bytes_held"] == 0, json.dumps(j) + json.dumps(zp))
        hits = pc["hits"]
        complete(srv, prompts[0])
        check("after the reset the counters stay and the same prompt misses",
              srv.stats()["pools"]["prefix_cache"]["hits"] == hits)
    finally:
        srv.stop()


def sentence(rng, n):
    """n random lowercase words."""
    return " ".join("".join(chr(rng.randrange(97, 123)) for _ in range(rng.randrange(2, 7))) for _ in range(n))


def test_chat_system_prompt(on, off):
    """/v1/chat/completions marks the end of the system turn for a snapshot:
    the second request with the same system message and another question
    restores every system token (the ChatML rendering up to the user turn's
    <|im_start|>, counted by turns_tokens), and later ones at least as many;
    greedy text as without the cache."""
    rng = random.Random(7)
    system = "You answer briefly. " + sentence(rng, 12)
    n_sys = turns_tokens(off, [{"role": "system", "content": system}])
    got, ok = [], True
    for i, first in enumerate("QRSTU"):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": first + sentence(rng, 5)}]
        a, cached = chat(on, msgs)
        b, _ = chat(off, msgs)
        got.append(cached)
        ok = ok and a == b
    check(f"chat system prompt ({n_sys} tokens): nothing cached on the first request", got[0] == 0, f"{got}")
    check("the second request restores exactly the system turn (the snapshot the first took there)",
          got[1] == n_sys, f"cached {got}, system turn {n_sys} tokens")
    check("every later request restores at least the system turn", all(c >= n_sys for c in got[2:]), f"{got}")
    check("greedy chat text with those hits equals the cache-off server's", ok)


def test_chat_history_boundaries(on, off):
    """A multi-turn history sent to a server that has none of it: the
    request snapshots at its message boundaries, so a second history that
    keeps the first messages and replaces the assistant turn (a regenerated
    answer) restores up to that turn's start."""
    rng = random.Random(8)
    system, user = "Be exact. " + sentence(rng, 6), "A" + sentence(rng, 8)
    head = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    h1 = head + [{"role": "assistant", "content": "B" + sentence(rng, 6)}, {"role": "user", "content": "C" + sentence(rng, 4)}]
    h2 = head + [{"role": "assistant", "content": "D" + sentence(rng, 6)}, {"role": "user", "content": "E" + sentence(rng, 4)}]
    n_head = turns_tokens(off, head)
    a1, c1 = chat(on, h1, salt="history")
    a2, c2 = chat(on, h2, salt="history")
    check("a history's first request restores nothing (its own salt)", c1 == 0, f"{c1}")
    check("a history with another assistant turn restores up to that turn's start", c2 == n_head,
          f"cached {c2}, the turns before {n_head} tokens")
    check("and reads as without the cache", a1 == chat(off, h1)[0] and a2 == chat(off, h2)[0])


def test_reset_while_running(on, off):
    """POST /reset_prefix_cache while a request forked from an entry
    streams: 200 with what it freed and the request counted as running, the
    request ends with the text it would have had, and the pool then holds
    exactly what the store keeps: its entry."""
    rng = random.Random(9)
    p = fresh(rng, 40)
    q = p + fresh(rng, 4)
    complete(on, p)
    body = {"prompt": q, "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    c = on.conn(600)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text, cached, j = [], None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        ev = json.loads(line[5:])
        if ev.get("choices"):
            text.append(ev["choices"][0]["text"])
            if j is None:
                j = reset(on)       # the request has its first token: it runs on
        if ev.get("usage"):
            cached = ev["usage"]["prompt_tokens_details"]["cached_tokens"]
    c.close()
    check("reset while a request runs: 200 with the entries and bytes it freed, the request running",
          j and j["enabled"] is True and j["freed_entries"] >= 1 and j["freed_store_bytes"] > 0
          and j["running_requests"] == 1 and j["pool_reserved_bytes"] > 0, json.dumps(j))
    st, _, jo, _ = off.jreq("POST", "/v1/completions", {"prompt": q, "max_tokens": 3000, "temperature": 0,
                                                        "ignore_eos": True}, timeout=600)
    check("it ends with the cache-off server's text (a hit before the reset)",
          cached and cached > 0 and st == 200 and "".join(text) == jo["choices"][0]["text"], f"cached {cached}")
    s = on.stats()
    pc = s["pools"]["prefix_cache"]
    check("after it ends the pool holds exactly the store's one entry (its own)",
          pc["entries"] == 1 and s["pools"]["n_seqs"] == 1 and s["pools"]["reserved_bytes"] == pc["bytes"],
          json.dumps(s["pools"]))


def test_api_key_isolation(model):
    """Entries are keyed by the API key too: the same prompt and salt under
    another key is a miss that prefills the whole prompt (the prompt tokens
    the scheduler counts, not a wall time), and the key's own second request
    prefills one token; /reset_prefix_cache needs a key like every route."""
    k1, k2 = "hy-prefix-key-one-0001", "hy-prefix-key-two-0002"
    srv = hs.Server("keys", model, "-t", "1", "--api-key", k1, "--api-key", k2)
    try:
        auth = {"Authorization": f"Bearer {k1}"}
        p = fresh(random.Random(10), 30)

        def prefilled(key, salt=None):
            before = srv.jreq("GET", "/stats", None, auth)[2]["scheduler"]["prompt_tokens_total"]
            _, cached = complete(srv, p, salt=salt, key=key)
            after = srv.jreq("GET", "/stats", None, auth)[2]["scheduler"]["prompt_tokens_total"]
            return cached, after - before

        first = prefilled(k1)
        again = prefilled(k1)
        other = prefilled(k2)
        salted = prefilled(k1, salt="s2")
        check("key 1 first: the whole prompt prefilled", first == (0, len(p)), f"{first}")
        check("key 1 again: all but the last token restored, one prefilled", again == (len(p) - 1, 1), f"{again}")
        check("key 2, same prompt: a miss, the whole prompt prefilled as on key 1's first", other == (0, len(p)),
              f"{other}")
        check("key 1 under another salt: a miss, the whole prompt prefilled", salted == (0, len(p)), f"{salted}")
        st, _, _ = srv.req("POST", "/reset_prefix_cache")
        check("/reset_prefix_cache without a key: 401", st == 401, f"{st}")
        j = reset(srv, key=k2)
        s = srv.jreq("GET", "/stats", None, auth)[2]
        check("/reset_prefix_cache with a key: every entry freed, the pool back to zero",
              j["freed_entries"] == 3 and s["pools"]["reserved_bytes"] == 0 and s["pools"]["n_seqs"] == 0
              and s["pools"]["prefix_cache"]["entries"] == 0 and s["pools"]["prefix_cache"]["bytes"] == 0,
              json.dumps(j) + json.dumps(s["pools"]))
    finally:
        srv.stop()


def test_full_cache_evicts_to_admit(model, off):
    """A pool that holds a few entries and a store allowed all of it: once
    the entries fill the pool, a new request is admitted by evicting (the
    store's own budget is never what evicts here), and reads the same."""
    srv = hs.Server("full", model, "-t", "1", "--cache-mem", "200K", "--prefix-cache-mem", "200K")
    try:
        rng = random.Random(11)
        ok = True
        for _ in range(12):
            p = fresh(rng, 60)
            a, _ = complete(srv, p)
            ok = ok and a == complete(off, p)[0]
        s = srv.stats()
        pc = s["pools"]["prefix_cache"]
        check("a full cache admitted every request by evicting entries, texts as without the cache",
              ok and pc["evictions"] > 0 and s["pools"]["reserved_bytes"] <= s["pools"]["budget_bytes"],
              json.dumps(s["pools"]))
        check("the store never passed its budget (the pool's)", pc["bytes"] <= pc["budget_bytes"], json.dumps(pc))
    finally:
        srv.stop()


def test_mem_cli(model, on):
    """`hyserve mem` on the served model: one snapshot's bytes as /stats
    gives them, and how many a budget holds."""
    each = on.stats()["pools"]["prefix_cache"]["snapshot_bytes_each"]
    r = subprocess.run([HYSERVE, "mem", "-m", model, "--context", "256", "--budget", str(7 * each)],
                       capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("prefix snapshot:")), "")
    check("hyserve mem: a prefix snapshot line, 7 of them in a budget of 7", "the budget holds 7" in line,
          r.stdout[-400:] + r.stderr[-200:])


def main(argv=None):
    names = ["test_hybrid_hits", "test_multi_turn", "test_attention_mid_page", "test_salts", "test_eviction",
             "test_random_load", "test_layouts", "test_chat_system_prompt", "test_chat_history_boundaries",
             "test_reset_while_running", "test_api_key_isolation", "test_full_cache_evicts_to_admit", "test_mem_cli",
             "test_branch_point", "test_cold_prompt_steps", "test_prompt_logprobs"]
    chosen = hs.select(sys.argv[1:] if argv is None else argv, names, "prefix")
    os.makedirs(TMP, exist_ok=True)
    models = {"hybrid": ("LLLA", 4, []), "attn": ("A", 2, []), "dnet": ("L", 2, []), "mla": ("LAML", 4, []),
              "chat": ("LLLA", 4, ["--chat-template", "chatml"])}
    paths, errs = {}, b""
    for name, (pattern, layers, extra) in models.items():
        paths[name] = os.path.join(TMP, name + ".gguf")
        r = subprocess.run([HYSERVE, "synth", "-o", paths[name], "--layers", str(layers), "--pattern", pattern]
                           + COMMON + extra, capture_output=True)
        errs += r.stderr if r.returncode else b""
    if not check("synthesize the hybrid, attention, DeltaNet-only, MLA and chat models", not errs, errs.decode()[-400:]):
        print(f"prefix: {hs.passed} passed, {hs.failed} failed")
        sys.exit(1)
    hyb, att = paths["hybrid"], paths["attn"]
    servers = []

    def pair(name, model, interval="16"):
        """A cache-on server (snapshots every 16 tokens) and a cache-off one of model."""
        a = hs.Server(name + "_on", model, "-t", "1", "--prefix-cache", "on", "--prefix-snapshot-interval", interval)
        servers.append(a)
        b = hs.Server(name + "_off", model, "-t", "1", "--prefix-cache", "off")
        servers.append(b)
        return a, b

    def eviction(model, off):
        tag = os.path.basename(model)[:-5]
        one = hs.Server("one_" + tag, model, "-t", "1")
        servers.append(one)
        complete(one, fresh(random.Random(5), 40))
        entry = one.stats()["pools"]["prefix_cache"]["bytes"]
        test_eviction(model, off, entry, "evict_" + tag)

    try:
        on, off = pair("hyb", hyb)
        check("--prefix-cache off: /stats says disabled", off.stats()["pools"]["prefix_cache"]["enabled"] is False)
        hybrid_tests = [
            ("test_hybrid_hits", lambda: test_hybrid_hits(on, off)),
            ("test_cold_prompt_steps", lambda: test_cold_prompt_steps(on, off)),
            ("test_multi_turn", lambda: test_multi_turn(on, off)),
            ("test_salts", lambda: test_salts(on, off)),
            ("test_prompt_logprobs", lambda: test_prompt_logprobs(on, off)),
            ("test_reset_while_running", lambda: test_reset_while_running(on, off)),
            ("test_mem_cli", lambda: test_mem_cli(hyb, on)),
            ("test_eviction", lambda: eviction(hyb, off)),
            ("test_random_load", lambda: test_random_load(hyb, off)),
            ("test_full_cache_evicts_to_admit", lambda: test_full_cache_evicts_to_admit(hyb, off)),
            ("test_api_key_isolation", lambda: test_api_key_isolation(hyb)),
        ]
        for name, run in hybrid_tests:     # in this order: later ones see the store the earlier left
            if name in chosen:
                run()
        if "test_attention_mid_page" in chosen:
            a_on, a_off = pair("attn", att)
            test_attention_mid_page(a_on, a_off)
            eviction(att, a_off)
        if "test_layouts" in chosen:
            for name in ("dnet", "mla"):
                l_on, l_off = pair(name, paths[name])
                print(f"-- layout {name} ({models[name][0]})")
                test_hybrid_hits(l_on, l_off)
                eviction(paths[name], l_off)
        if {"test_chat_system_prompt", "test_chat_history_boundaries", "test_branch_point"} & chosen:
            c_on, c_off = pair("chat", paths["chat"], "0")    # the default: no fixed interval
            if "test_branch_point" in chosen:
                test_branch_point(c_on, c_off)
            if "test_chat_system_prompt" in chosen:
                test_chat_system_prompt(c_on, c_off)
            if "test_chat_history_boundaries" in chosen:
                test_chat_history_boundaries(c_on, c_off)
    except Exception as e:  # noqa: BLE001 - a crash in a test is a failure
        import traceback
        traceback.print_exc()
        check("prefix suite ran to the end", False, repr(e))
    finally:
        for s in servers:
            s.stop()
        hs.check_server_logs(servers)
    print(f"prefix: {hs.passed} passed, {hs.failed} failed")
    sys.exit(1 if hs.failed else 0)


if __name__ == "__main__":
    main()

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


def complete(srv, prompt, salt=None, max_tokens=N_GEN):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if salt:
        body["cache_salt"] = salt
    st, _, j, b = srv.jreq("POST", "/v1/completions", body)
    if st != 200:
        raise RuntimeError(f"completion answered {st}: {b[:200]!r}")
    return j["choices"][0]["text"], j["usage"]["prompt_tokens_details"]["cached_tokens"]


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
    check("the next prompt parting there hits the branch-point snapshot (25), same text", eq and cached == 25,
          f"{cached} {t}")
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


def test_eviction(model, off, entry_bytes):
    """A store budget for about one entry: the second prompt evicts the
    first, which then misses as 'evicted' and still reads the same."""
    budget = entry_bytes * 3 // 2
    srv = hs.Server("evict", model, "-t", "1", "--prefix-cache-mem", str(budget))
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
    finally:
        srv.stop()


def main(argv=None):
    names = ["test_hybrid_hits", "test_multi_turn", "test_attention_mid_page", "test_salts", "test_eviction",
             "test_random_load"]
    chosen = hs.select(sys.argv[1:] if argv is None else argv, names, "prefix")
    os.makedirs(TMP, exist_ok=True)
    hyb, att = os.path.join(TMP, "hybrid.gguf"), os.path.join(TMP, "attn.gguf")
    r1 = subprocess.run([HYSERVE, "synth", "-o", hyb, "--layers", "4", "--pattern", "LLLA"] + COMMON,
                        capture_output=True)
    r2 = subprocess.run([HYSERVE, "synth", "-o", att, "--layers", "2", "--pattern", "A"] + COMMON,
                        capture_output=True)
    if not check("synthesize the hybrid and attention models", r1.returncode == 0 and r2.returncode == 0,
                 (r1.stderr + r2.stderr).decode()[-400:]):
        print(f"prefix: {hs.passed} passed, {hs.failed} failed")
        sys.exit(1)
    servers = []
    try:
        on = hs.Server("on", hyb, "-t", "1", "--prefix-cache", "on", "--prefix-snapshot-interval", "16")
        off = hs.Server("off", hyb, "-t", "1", "--prefix-cache", "off")
        servers += [on, off]
        check("--prefix-cache off: /stats says disabled", off.stats()["pools"]["prefix_cache"]["enabled"] is False)
        if "test_hybrid_hits" in chosen:
            test_hybrid_hits(on, off)
        if "test_multi_turn" in chosen:
            test_multi_turn(on, off)
        if "test_salts" in chosen:
            test_salts(on, off)
        if "test_eviction" in chosen:
            one = hs.Server("one", hyb, "-t", "1")
            servers.append(one)
            complete(one, fresh(random.Random(5), 40))
            test_eviction(hyb, off, one.stats()["pools"]["prefix_cache"]["bytes"])
        if "test_random_load" in chosen:
            test_random_load(hyb, off)
        if "test_attention_mid_page" in chosen:
            a_on = hs.Server("attn_on", att, "-t", "1")
            a_off = hs.Server("attn_off", att, "-t", "1", "--prefix-cache", "off")
            servers += [a_on, a_off]
            test_attention_mid_page(a_on, a_off)
    except Exception as e:  # noqa: BLE001 - a crash in a test is a failure
        import traceback
        traceback.print_exc()
        check("prefix suite ran to the end", False, repr(e))
    finally:
        for s in servers:
            s.stop()
        for s in servers:
            with open(s.log_path, "rb") as f:
                log = f.read().decode("utf-8", "replace")
            bad = [l for l in log.splitlines() if "ERROR: AddressSanitizer" in l or "runtime error:" in l
                   or "LeakSanitizer" in l or "invariant broken" in l]
            check(f"server '{s.name}' log has no sanitizer or invariant reports", not bad, "\n".join(bad[:5]))
    print(f"prefix: {hs.passed} passed, {hs.failed} failed")
    sys.exit(1 if hs.failed else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Cache memory accounting on a running server (run by tests/suite_memory.sh).

A synthesized hybrid model with all three cache kinds (GQA attention, MLA,
Gated DeltaNet) is served with an f16 KV cache. The bytes /stats reports for
a live request are checked three ways: against arithmetic written out here
from the layout (independent of the C code), against the planner
(`hyserve mem` and POST /v1/memory/estimate), and against the pool totals
the cache manager keeps. Then: pools return to zero, a budget sized for
exactly K requests admits K and makes the next one wait, /metrics carries
the bytes by kind, and `serve --synth PRESET` shows a preset's numbers.
Prints "memory: N passed, N failed" last.

Usage: suite_memory.py [-k PATTERN] [--list]   (as tests/suite_http.py; test_metrics
counts the decode steps of test_live_request_bytes, so select both)
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_http as hs  # noqa: E402  (Server, stream, check helpers)

HYSERVE = hs.HYSERVE
TMP = os.path.abspath(os.path.join(os.environ.get("TEST_TMPDIR", "tests/tmp"), "memory"))
hs.TMP = TMP

# The model: 4 layers L L A M; sizes chosen so every cache kind is small but distinct.
SYNTH = ["--layers", "4", "--pattern", "LLAM", "--embd", "64", "--heads", "4", "--kv-heads", "2",
         "--head-dim", "16", "--dnet-k-heads", "2", "--dnet-v-heads", "4", "--dnet-k-dim", "16",
         "--mla-kv-lora", "32", "--mla-rope", "8", "--mla-nope", "16", "--mla-vdim", "16",
         "--ff", "128", "--ctx", "4096", "--seed", "3"]
PAGE = 16
KV_BYTES = 2                                   # f16
GQA_PER_TOKEN = 1 * 2 * 2 * 16 * KV_BYTES      # 1 attention layer x (K, V) x 2 KV heads x 16 dims
MLA_PER_TOKEN = 1 * (32 + 8) * KV_BYTES        # 1 MLA layer x (latent 32 + rope 8)
DNET_STATE = 2 * 4 * 16 * 16 * 4               # 2 DeltaNet layers x 4 value heads x d_k x d_v, f32
DNET_CONV = 2 * 3 * (2 * 2 * 16 + 4 * 16) * 4  # 2 layers x (K-1) x (q, k, v channels), f32
LAYOUT = {"layers": 4, "kv_dtype": "f16", "page_tokens": PAGE,
          "attention": {"layers": 1, "heads": 4, "kv_heads": 2, "head_dim": 16},
          "mla": {"layers": 1, "heads": 4, "kv_lora_rank": 32, "rope_dim": 8, "nope_dim": 16, "v_dim": 16},
          "deltanet": {"layers": 2, "k_heads": 2, "v_heads": 4, "d_k": 16, "d_v": 16, "conv_kernel": 4}}


def pages(n):
    return (n + PAGE - 1) // PAGE


def expect_reserved(n_tokens):
    return pages(n_tokens) * PAGE * (GQA_PER_TOKEN + MLA_PER_TOKEN) + DNET_STATE + DNET_CONV


check = hs.check


def planner(context, batch=1, budget=None):
    path = os.path.join(TMP, "layout.json")
    with open(path, "w") as f:
        json.dump(LAYOUT, f)
    args = [HYSERVE, "mem", "--config", path, "--context", str(context), "--batch", str(batch), "--json"]
    if budget:
        args += ["--budget", str(budget)]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else None


def watch_request(srv, stop, seen):
    """Poll /stats until stop is set, keeping every snapshot that lists requests."""
    while not stop.is_set():
        st, _, j, _ = srv.jreq("GET", "/stats")
        if st == 200 and j:
            seen.append(j)
        time.sleep(0.002)


def test_live_request_bytes(srv):
    prompt = "abcdefghijklmnopqrst"       # 20 bytes -> 20 byte tokens (byte vocabulary)
    max_new = 1500
    total = len(prompt) + max_new
    stop, seen = threading.Event(), []
    t = threading.Thread(target=watch_request, args=(srv, stop, seen))
    t.start()
    st, h, evs, _ = hs.stream(srv, "/generate_stream", {"inputs": prompt, "parameters": {"max_new_tokens": max_new}})
    stop.set()
    t.join()
    check("a long stream completes", st == 200 and len([e for e in evs if e[0] == "data"]) == max_new, f"{st}")
    # snapshots with the request holding its sequence (a "queued" one holds no cache yet)
    live = [s for s in seen if s.get("requests") and s["requests"][0]["state"] != "queued"]
    check("/stats listed the request while it ran", len(live) > 0, f"{len(seen)} snapshots")
    if not live:
        return
    want = expect_reserved(total)
    plan = planner(total)
    ok_all, detail = True, ""
    for s in live:
        r = s["requests"][0]
        by = r["cache_by_kind"]
        n = r["attn_kv"]["tokens"]
        good = (r["total_bytes_owned"] == want
                and by["gqa_kv"]["bytes_reserved"] == pages(total) * PAGE * GQA_PER_TOKEN
                and by["mla_latent"]["bytes_reserved"] == pages(total) * PAGE * MLA_PER_TOKEN
                and by["deltanet_state_bytes"] == DNET_STATE and by["deltanet_conv_bytes"] == DNET_CONV
                and by["gqa_kv"]["bytes_used"] == n * GQA_PER_TOKEN
                and by["mla_latent"]["bytes_used"] == n * MLA_PER_TOKEN
                # all_requests_bytes also counts the DeltaNet snapshots this
                # request took for the prefix store; the pool also holds the
                # store's entries (nothing is shared yet: the first request of
                # the server)
                and s["totals"]["all_requests_bytes"] == want + s["totals"]["checkpoint_bytes"]
                and s["pools"]["reserved_bytes"] == s["totals"]["all_requests_bytes"]
                + s["pools"]["prefix_cache"].get("bytes", 0))
        if not good:
            ok_all, detail = False, json.dumps(r)[:600]
            break
    check("request bytes by kind equal the layout arithmetic, reserved vs used", ok_all, detail)
    check("request bytes equal the planner's prediction (hyserve mem)",
          plan is not None and plan["total"]["bytes_reserved_per_sequence"] == want, f"{plan and plan['total']} want {want}")
    st2, _, none, _ = srv.jreq("GET", "/stats?requests=0")
    check("/stats?requests=0 omits the list", st2 == 200 and "requests" not in none, f"{none and list(none)}")
    lay = live[0]["model"]["cache_layout"]
    check("/stats layout shows GQA, MLA and DeltaNet bytes",
          lay["attention"]["bytes_per_token"] == GQA_PER_TOKEN and lay["mla"]["bytes_per_token"] == MLA_PER_TOKEN
          and lay["recurrent"]["bytes_per_seq"] == DNET_STATE + DNET_CONV, json.dumps(lay))
    time.sleep(0.05)
    s = srv.stats()
    pc = s["pools"]["prefix_cache"]
    kept, entries = (pc["bytes"], pc["entries"]) if pc["enabled"] else (0, 0)
    check("pools return to zero after the request (but for what the prefix cache keeps)",
          s["pools"]["reserved_bytes"] == kept and s["pools"]["n_seqs"] == entries
          and s["totals"]["all_requests_bytes"] == 0, json.dumps(s["pools"]))
    # the response's usage block carries the same peak bytes
    st, h, j, _ = srv.jreq("POST", "/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 12, "return_usage": True}})
    check("usage.cache.peak_total_bytes equals the reservation",
          st == 200 and j["usage"]["cache"]["peak_total_bytes"] == expect_reserved(len(prompt) + 12), f"{j}")


def test_stats_request_filter(srv):
    """/stats?request_id= lists that request alone. Two requests with ids of the test's choosing
    (X-Request-Id, which the responses must echo) run at once, and the unfiltered /stats lists
    both; every answer for the first id lists it and nothing else, also while the scheduler
    counts both running; once both ended, neither id lists anything. (Asked only after its
    request ended, as it once was, the filter had nothing left to filter.)"""
    ids = ("mem-filter-a", "mem-filter-b")
    echoed, answers = {}, []

    def generate(rid):
        try:
            st, h, _ = srv.req("POST", "/generate", {"inputs": "0123456789", "parameters": {"max_new_tokens": 400}},
                               headers={"X-Request-Id": rid}, timeout=120)
            echoed[rid] = (st, h.get("x-request-id"))
        finally:
            echoed.setdefault(rid, None)

    def poll():                 # the filtered view, until both requests answered
        while len(echoed) < len(ids):
            st, _, j, _ = srv.jreq("GET", "/stats?request_id=" + ids[0])
            if st == 200 and j:
                answers.append(j)
            time.sleep(0.002)

    seen = hs.run_watched(srv, [lambda rid=rid: generate(rid) for rid in ids] + [poll])
    check("requests keep the client's X-Request-Id", echoed == {rid: (200, rid) for rid in ids}, f"{echoed}")
    listed = [[q["id"] for q in a.get("requests", [])] for a in answers]
    both = [n for a, n in zip(answers, listed) if a["scheduler"]["running"] == 2]
    unfiltered = any(sorted(q["id"] for q in s.get("requests", [])) == list(ids) for s in seen)
    check("/stats?request_id= lists that request alone, also while the other one runs",
          unfiltered and answers and all(n in ([], [ids[0]]) for n in listed) and [ids[0]] in both,
          f"unfiltered listed both: {unfiltered}; {len(answers)} answers, {len(both)} with both running, "
          f"lists seen {sorted(set(map(tuple, listed)))}")
    after = [srv.jreq("GET", "/stats?request_id=" + rid)[2] for rid in ids]
    check("/stats?request_id= of an ended request lists none",
          all(a is not None and a.get("requests") == [] for a in after), f"{after and [a and a.get('requests') for a in after]}")


def test_admission(model):
    """Budget for exactly K requests of one size: the K+1-th waits, never over-allocates."""
    K, prompt, max_new = 3, "0123456789", 800
    per = expect_reserved(len(prompt) + max_new)
    budget = K * per
    srv = hs.Server("admit", model, "--kv-dtype", "f16", "--cache-mem", str(budget), "--max-seqs", "8",
                    "--queue-timeout", "60", "-t", "1")
    try:
        results = [None] * (K + 1)

        def one(i):
            results[i] = hs.stream(srv, "/generate_stream", {"inputs": prompt, "parameters": {"max_new_tokens": max_new}}, timeout=120)

        seen = hs.run_watched(srv, [lambda i=i: one(i) for i in range(K + 1)])
        ok = all(r and r[0] == 200 for r in results)
        check(f"all {K + 1} requests finish (the last one waited)", ok, str([r and r[0] for r in results]))
        max_running = max((s["scheduler"]["running"] for s in seen), default=0)
        max_reserved = max((s["pools"]["reserved_bytes"] for s in seen), default=0)
        waited = any(s["scheduler"]["waiting"] >= 1 and s["scheduler"]["running"] == K for s in seen)
        check(f"at most {K} run at once under a budget for {K}", max_running == K, f"max running {max_running}")
        check("the reservation never exceeds the budget", 0 < max_reserved <= budget,
              f"max reserved {max_reserved}, budget {budget}")
        check(f"request {K + 1} waited while {K} ran", waited, f"{len(seen)} snapshots")
        plan = planner(len(prompt) + max_new, budget=budget)
        check("the planner agrees: exactly K fit this budget",
              plan is not None and plan["fits"]["max_batch_at_context"] == K, f"{plan and plan.get('fits')}")
        # one request bigger than the whole budget can never fit: 422 with the numbers
        st, h, j, b = srv.jreq("POST", "/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 3000}})
        msg = json.dumps(j) if j else b.decode("utf-8", "replace")
        check("a request that can never fit gets 422 with the numbers", st == 422 and str(budget) in msg, f"{st} {msg}")
    finally:
        srv.stop()


def test_estimate_route(srv):
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"preset": "qwen3-next-80b-a3b", "context": 4096, "batch": 2})
    check("estimate: Qwen3-Next state per sequence is 79,036,416 bytes",
          st == 200 and j["per_sequence"]["recurrent_state_bytes"] == 79036416, f"{st} {j}")
    check("estimate: a quarter of all-attention", st == 200 and j["counterfactual"]["actual_over_all_attention"] == 0.25, f"{j}")
    # 36 DeltaNet layers x 32 heads x 128 x 128 state numbers, 2 bytes each; 36 x 3 x 8192 conv numbers, 4 bytes
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"preset": "qwen3-next-80b-a3b", "state_dtype": "bf16"})
    check("estimate: Qwen3-Next state per sequence with a bf16 state is 37,748,736 + 3,538,944 bytes",
          st == 200 and j["per_sequence"]["recurrent_state_bytes"] == 37748736 + 3538944
          and j["layout"]["state_dtype"] == "bf16", f"{st} {j}")
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"preset": "qwen3-next-80b-a3b", "state_dtype": "f16"})
    check("estimate: state_dtype f16 is a 400 naming the choices", st == 400 and "bf16" in json.dumps(j), f"{st} {j}")
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"preset": "deepseek-v2"})
    check("estimate: DeepSeek-V2 MHA / MLA is about 57",
          st == 200 and 56.5 < j["counterfactual"]["mha_over_actual"] < 57.5, f"{j and j.get('counterfactual')}")
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"layout": LAYOUT, "context": 100, "budget": "1M"})
    check("estimate of a layout equals the live arithmetic",
          st == 200 and j["total"]["bytes_reserved_per_sequence"] == expect_reserved(100)
          and j["fits"]["max_batch_at_context"] == (1 << 20) // expect_reserved(100), f"{j}")
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"context": 64})
    check("estimate without a layout describes the served model",
          st == 200 and j["total"]["bytes_reserved_per_sequence"] == expect_reserved(64), f"{j}")
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"preset": "no-such-model"})
    check("estimate: unknown preset is a 400 naming the known ones",
          st == 400 and "qwen3.5-0.8b" in json.dumps(j) and "error" in j, f"{st} {j}")
    st, h, b = srv.req("POST", "/v1/memory/estimate", raw=b"{not json")
    check("estimate: malformed JSON is a 400", st == 400, f"{st}")
    st, h, j, _ = srv.jreq("POST", "/v1/memory/estimate", {"layout": {"layers": 2, "deltanet": {"layers": "x"}}})
    check("estimate: a bad layout field is named", st == 400 and "deltanet.layers" in json.dumps(j), f"{st} {j}")


def test_metrics(srv):
    st, h, b = srv.req("GET", "/metrics")
    txt = b.decode()
    need = ['hyserve_cache_bytes{kind="attn_kv",', 'hyserve_cache_bytes{kind="mla_latent",',
            'hyserve_cache_bytes{kind="recurrent_state",', "hyserve_inter_token_latency_seconds_count",
            "hyserve_time_to_first_token_seconds_bucket", "hyserve_e2e_request_latency_seconds_sum",
            "hyserve_attn_kv_token_usage_ratio", "hyserve_cache_config_info"]
    missing = [n for n in need if n not in txt]
    check("/metrics has cache bytes by kind and latency histograms", st == 200 and not missing, f"missing {missing}")
    itl = [l for l in txt.splitlines() if l.startswith("hyserve_inter_token_latency_seconds_count")]
    check("inter-token latency was observed", itl and float(itl[0].split()[-1]) > 100, f"{itl}")


def test_serve_synth():
    # Qwen3.5-0.8B: 18 DeltaNet layers x 16 heads x 128 x 128 state numbers (18,874,368 bytes
    # in f32) and 18 x 3 x 6144 conv numbers (1,327,104 bytes, always f32); 6 attention layers
    # x 2 x 2 x 256 KV numbers per token (12,288 bytes in bf16). --state-dtype bf16 halves the
    # state: 9,437,184 + 1,327,104 = 10,764,288 bytes per sequence.
    srv = hs.Server("synth", "", "--synth", "qwen3.5-0.8b", "--kv-dtype", "bf16", "--state-dtype", "bf16",
                    "--max-seqs", "2", "--ctx", "256", "-t", "1")
    try:
        s = srv.stats()
        lay = s["model"]["cache_layout"]
        rec = lay["recurrent"]
        check("serve --synth qwen3.5-0.8b, bf16 KV and state: 12,288 KV bytes per token, 9,437,184 state "
              "(bf16) + 1,327,104 conv (f32) bytes per sequence",
              lay["attention"]["bytes_per_token"] == 12288 and rec["ssm_state_bytes_per_seq"] == 9437184 and
              rec["conv_state_bytes_per_seq"] == 1327104 and rec["bytes_per_seq"] == 10764288 and
              rec["dtype"] == "bf16" and rec["conv_dtype"] == "f32", json.dumps(lay))
        def spares_ready(n_blocks):     # the spare thread maps them in the background
            sp = {}
            for _ in range(400):
                sp = srv.stats()["pools"].get("spares", {})
                if sp.get("attn_kv_regions") == 2 and (n_blocks is None or sp.get("recurrent_blocks") == n_blocks):
                    break
                time.sleep(0.05)
            return sp
        spares_ready(2)
        st, h, j, _ = srv.jreq("POST", "/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 4, "return_usage": True}})
        check("the synthesized preset model generates", st == 200 and j["usage"]["cache"]["peak_total_bytes"] == 10764288 + 16 * 12288,
              f"{st} {j}")
        # Spares (with the prefix cache on; a block of 10,764,288 bytes is a mapping of its
        # own): DeltaNet blocks of 10,764,288 + 64 bytes rounded up to 2 MiB (12 MiB) and page
        # regions of 16 pages of 16 x 12,288 + 64 bytes rounded up to 2 MiB (4 MiB), mapped ahead
        # by a thread and made again when the server is idle; free memory outside the pool,
        # and never more blocks made and spare than the budget holds at once.
        MIB = 1 << 20
        blk = -(-(10764288 + 64) // (2 * MIB)) * 2 * MIB
        reg = -(-(16 * (16 * 12288 + 64)) // (2 * MIB)) * 2 * MIB
        sp = spares_ready(None)     # made again when idle (blocks: as many as the budget leaves room for)
        s = srv.stats()
        fit = s["pools"]["budget_bytes"] // 10764288
        if not s["pools"]["prefix_cache"]["enabled"]:
            check("spares: none with the prefix cache off", sp.get("bytes", 0) == 0
                  and sp.get("recurrent_blocks_taken_total", 0) == 0, json.dumps(sp))
        else:
            check("spares: a region and the request's block(s) were taken ready, two regions are ready again, "
                  "blocks made and spare within the budget's %d, bytes = blocks x 12 MiB + regions x 4 MiB, "
                  "and none of it in the pool" % fit,
                  blk == 12 * MIB and reg == 4 * MIB and sp.get("attn_kv_regions_taken_total", 0) >= 1
                  and sp.get("recurrent_blocks_taken_total", 0) >= 1 and sp.get("attn_kv_regions") == 2
                  and sp["recurrent_blocks_taken_total"] + sp["recurrent_blocks"] <= fit
                  and sp["bytes"] == sp["recurrent_blocks"] * blk + sp["attn_kv_regions"] * reg
                  and s["pools"]["reserved_bytes"] == s["pools"]["prefix_cache"].get("bytes", 0),
                  json.dumps(s["pools"]))
        st, _, b = srv.req("GET", "/metrics")
        txt = b.decode()
        check("/metrics labels the cache config with state_dtype=\"bf16\"", st == 200 and 'state_dtype="bf16"' in txt,
              [l for l in txt.splitlines() if "cache_config_info" in l])
        log = open(srv.log_path, "rb").read().decode("utf-8", "replace")
        check("serve --synth says what it loads: a synthesized model with the preset's cache layout",
              "loading a synthesized model with the cache layout of qwen3.5-0.8b" in log, log[:400])
    finally:
        srv.stop()


def main(argv=None):
    on_server = [("test_live_request_bytes", lambda: test_live_request_bytes(srv)),
                 ("test_stats_request_filter", lambda: test_stats_request_filter(srv)),
                 ("test_estimate_route", lambda: test_estimate_route(srv)),
                 ("test_metrics", lambda: test_metrics(srv))]
    alone = [("test_admission", lambda: test_admission(model)),
             ("test_serve_synth", test_serve_synth)]
    chosen = hs.select(sys.argv[1:] if argv is None else argv, [n for n, _ in on_server + alone], "memory")

    os.makedirs(TMP, exist_ok=True)
    model = os.path.join(TMP, "llam.gguf")
    r = subprocess.run([HYSERVE, "synth", "-o", model] + SYNTH, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not check("synthesize the LLAM model", r.returncode == 0, r.stderr.decode()):
        print(f"memory: {hs.passed} passed, {hs.failed} failed")
        sys.exit(1)
    srv = None
    try:
        if any(name in chosen for name, _ in on_server):
            srv = hs.Server("memory", model, "--kv-dtype", "f16", "--max-seqs", "4", "-t", "1")
            for name, t in on_server:
                if name in chosen:
                    t()
            srv.stop()
            srv = None
        for name, t in alone:
            if name in chosen:
                t()
    except Exception as e:  # noqa: BLE001 - a crash in a test is a failure
        import traceback
        traceback.print_exc()
        check("memory suite ran to the end", False, repr(e))
    finally:
        if srv:
            srv.stop()
    print(f"memory: {hs.passed} passed, {hs.failed} failed")
    sys.exit(1 if hs.failed else 0)


if __name__ == "__main__":
    main()

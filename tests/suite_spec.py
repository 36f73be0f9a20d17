#!/usr/bin/env python3
"""Speculative decoding served end to end (issue 42; run by tests/suite_spec.sh).

The evidence for every output is the same request run without speculation
("speculative": false) on the same server, never a stored answer:

 - the trained default model (models/default.gguf, a Gated DeltaNet hybrid;
   skipped when absent): a token prediction equal to the greedy output is
   accepted whole (usage.completion_tokens_details.accepted_prediction_tokens
   == completion_tokens, rejected 0) and changes no byte; a shuffled one
   accepts next to nothing, same text; a text prediction on chat the same;
   n-gram drafts (--spec-type ngram-simple) the same text; logprobs under
   speculation equal those without; a JSON-object constraint, stop strings
   and streaming (text and token count) the same; n: 3 sampled choices each
   equal to the same seed without a prediction; DELETE cancels a speculative
   stream and the pool goes back to the prefix store's; 16 requests at once
   (exact, wrong and n-gram drafts mixed) each equal to its run alone;
   /metrics' vllm:spec_decode_* counters and /stats' speculative section
   move by what the answers said; bad fields are 400s;
 - synthesized families, one server each with the prefix cache on: llama
   (attention only), qwen35 (DeltaNet), granitehybrid (Mamba-2), jamba
   (Mamba-1), lfm2 (short conv), falcon-h1 (attention beside Mamba-2) and
   kimi-linear (KDA and MLA): greedy with an exact prediction, a
   wrong one (every rejection rolls the state back) and n-gram drafts, at 1
   and 16 concurrent sequences, equal to no speculation;
 - the draft model (--spec-type draft-simple, --model-draft): llama (an
   untied attention-only target), qwen35 (DeltaNet) and jamba (Mamba-1)
   targets, each with a 2-layer synth draft of another layer mix (mostly
   wrong: many rollbacks of both sequences) and with itself as draft (every
   draft accepted), greedy at 1 and 16 concurrent sequences with the prefix
   cache on equal to no speculation; /stats' draft_model and `hyserve mem
   --model-draft` agree; cancel mid-stream frees both sequences; the default
   model as its own draft (real text: logprobs, a JSON constraint, a sampled
   seed, 16 sequences); a draft model of another vocabulary refused at start
   in one line;
 - the MTP head (--spec-type draft-mtp): qwen35 (dense FFN, the trunk's LM head) and qwen35moe (experts,
   an MTP embedding and head of its own) synthesized with one MTP block (hyserve synth --mtp 1), greedy at
   1 and 16 concurrent sequences with the prefix cache on equal to no speculation with drafts made
   (drafted > 0, random weights: nearly all rejected, each a rollback), and a tied qwen35 whose MTP drafts
   a repeat of the last token (--mtp-copy), as its trunk tends to do: drafts accepted; logprobs and a JSON constraint
   as without, "speculative": false drafts nothing, /stats' speculative.mtp pool holds rows while a
   stream runs and none after it is cancelled, /metrics' hyserve_spec_mtp_reserved_bytes, and `hyserve
   mem --mtp` plans that pool;
 - the options: draft-mtp refused on a model without an MTP block, draft-simple without
   --model-draft and --model-draft beside ngram-simple refused, the draft
   length range-checked.
Prints "spec: N passed, N failed, N skipped" last.

Usage: suite_spec.py [-k PATTERN] [--list]
"""
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_http as hs  # noqa: E402  (Server, stream helpers, check, choice_seed)

HYSERVE = hs.HYSERVE
TMP = os.path.abspath(os.path.join(os.environ.get("TEST_TMPDIR", "tests/tmp"), "spec"))
hs.TMP = TMP
check = hs.check
DEFAULT = os.path.join(os.path.dirname(hs.HERE), "models", "default.gguf")
# the servers here count drafts, accepted and rejected: the cost gate (--spec-cost, on by default)
# declines drafts by measured step times, which differ from run to run and under the sanitizers, so
# these servers leave the length to acceptance; the gate's behaviour is tests/test_spec_cost.c's and
# test_sched_spec's (fixed step times)
NOGATE = ("--spec-cost", "off")

FAMILIES = {
    "llama": ["--arch", "qwen35", "--layers", "2", "--pattern", "LA", "--untied", "--seed", "40"],
    "qwen35": ["--arch", "qwen35", "--layers", "4", "--pattern", "LLLA", "--seed", "32"],
    "granitehybrid": ["--arch", "granitehybrid", "--experts", "0", "--layers", "4", "--pattern", "SSSA",
                      "--seed", "33"],
    "jamba": ["--arch", "jamba", "--layers", "4", "--pattern", "BBAB", "--experts", "4", "--experts-used", "2",
              "--untied", "--seed", "34"],
    "lfm2": ["--arch", "lfm2", "--layers", "6", "--pattern", "CCACCA", "--seed", "35"],
    "falcon_h1": ["--arch", "falcon-h1", "--layers", "3", "--pattern", "HHH", "--untied", "--seed", "36"],
    "kimi_linear": ["--arch", "kimi-linear", "--layers", "4", "--pattern", "KKMK", "--experts", "8",
                    "--experts-used", "2", "--seed", "37"],
}
# the draft model (--spec-type draft-simple): per target family, a small synth draft of the same vocabulary
# (hyserve synth writes the one tokenizer of a vocabulary size) of another layer mix, so drafts are often
# wrong and every rejection rolls the draft sequence back (a recurrent draft: to its snapshot); the
# attention-only target is untied (a tied random-weight llama repeats its last token, which any draft guesses)
DRAFTS = {
    "llama": (["--arch", "llama", "--layers", "2", "--untied", "--seed", "31"],
              ["--arch", "qwen35", "--layers", "2", "--pattern", "LA", "--seed", "40"]),
    "qwen35": (FAMILIES["qwen35"], ["--arch", "llama", "--layers", "2", "--seed", "41"]),
    "jamba": (FAMILIES["jamba"], ["--arch", "qwen35", "--layers", "2", "--pattern", "LA", "--seed", "42"]),
}
# the MTP head (--spec-type draft-mtp): hybrids with one MTP block after the trunk
MTPS = {
    "qwen35": ["--arch", "qwen35", "--layers", "4", "--pattern", "LLLA", "--untied", "--seed", "44", "--mtp", "1"],
    "qwen35moe": ["--arch", "qwen35moe", "--layers", "4", "--pattern", "LLLA", "--experts", "4", "--experts-used",
                  "2", "--untied", "--seed", "45", "--mtp", "1", "--mtp-own-head"],
    # tied, so the trunk repeats its last token, and an MTP that drafts a repeat (--mtp-copy): drafts are
    # accepted, whole and in part (the accepted rows' MTP feed, rollbacks that carry accepted drafts)
    "qwen35_copy": ["--arch", "qwen35", "--layers", "4", "--pattern", "LLLA", "--seed", "46", "--mtp", "1",
                    "--mtp-copy"],
}
SKIPPED = []
COMMON = ["--vocab", "300", "--ctx", "1024", "--chat-template", "chatml"]


def gen_ids(srv, prompt, n, **extra):
    """/generate greedy with details: (status, text, ids, details, usage)."""
    params = {"max_new_tokens": n, "details": True, "return_usage": True}
    params.update(extra)
    st, _, j = hs.gen(srv, prompt, **params)
    if st != 200:
        return st, None, None, j, None
    return st, j["generated_text"], [t["id"] for t in j["details"]["tokens"]], j["details"], j.get("usage")



def concurrent_differ(srv, prompts, base, n, extra=lambda i: {}):
    """Generate every prompt at once (a thread each, extra(i) the request's fields): the indices whose
    ids differ from base[i]'s."""
    out = [None] * len(prompts)

    def one(i):
        out[i] = gen_ids(srv, prompts[i], n, **extra(i))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return [i for i in range(len(prompts)) if not out[i] or out[i][2] != base[i][2]]

def completion(srv, prompt, n, **extra):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    body.update(extra)
    st, _, j, b = srv.jreq("POST", "/v1/completions", body)
    return st, j, b


def wrong(ids, vocab, every=5):
    """A prediction right but for every 5th token (moved to its neighbour): each of those drafts is
    rejected after the ones before it were accepted, and the sequence rolls back to there."""
    return [(t + 1) % vocab if i % every == every - 1 else t for i, t in enumerate(ids)]


def quiet(srv, timeout=10.0):
    """Nothing running and the pool holding only the prefix store's sequences."""
    deadline = time.time() + timeout
    s = None
    while time.time() < deadline:
        s = srv.stats()
        pc = s["pools"].get("prefix_cache", {})
        if (s["scheduler"]["running"] == 0 and s["scheduler"]["waiting"] == 0 and not s["requests"]
                and s["pools"]["n_seqs"] == pc.get("entries", 0) and s["speculative"]["rollback_snapshots"] == 0
                and s["speculative"].get("draft_model", {}).get("sequences", 0) == 0
                and s["speculative"].get("draft_model", {}).get("reserved_bytes", 0) == 0
                and s["speculative"].get("mtp", {}).get("reserved_bytes", 0) == 0
                and s["speculative"].get("mtp", {}).get("sequences", 0) == 0):
            return True, s
        time.sleep(0.05)
    return False, s


# ---------------------------------------------------------------------------
# the trained default model
# ---------------------------------------------------------------------------

def test_prediction(srv):
    prompt = "The committee said that the new law would"
    st, text, ids, det, _ = gen_ids(srv, prompt, 48, speculative=False)
    if not check("default: greedy /generate without speculation answers 48 tokens", st == 200 and len(ids) == 48,
                 f"{st} {det}"):
        return
    check("default: speculative false reports no drafts", "speculative" not in det, json.dumps(det)[:300])
    st, t2, ids2, det2, u2 = gen_ids(srv, prompt, 48, prediction={"type": "tokens", "tokens": ids})
    ctd = (u2 or {}).get("completion_tokens_details", {})
    check("default: a token prediction equal to the greedy output: the same tokens, every prediction token "
          "accepted (accepted_prediction_tokens == completion_tokens, rejected 0), every draft accepted",
          st == 200 and ids2 == ids and t2 == text and ctd.get("accepted_prediction_tokens") == 48
          and ctd.get("rejected_prediction_tokens") == 0
          and det2["speculative"]["accepted_tokens"] == det2["speculative"]["draft_tokens"] > 0,
          f"{st} {ids2 == ids} {u2} {det2.get('speculative')}")
    steps = det2["speculative"]["verify_steps"] if st == 200 else 0
    check(f"default: ... in {steps} verify steps for 47 tokens after the first (at most 16 drafts a step)",
          0 < steps <= 4, str(steps))
    shuffled = list(ids)
    random.Random(5).shuffle(shuffled)
    st, t3, ids3, det3, u3 = gen_ids(srv, prompt, 48, prediction={"type": "tokens", "tokens": shuffled})
    # (this server also drafts by n-gram, whose drafts are not the prediction's: the prediction's own count)
    ctd3 = (u3 or {}).get("completion_tokens_details", {})
    check(f"default: a shuffled prediction: the same tokens, next to nothing of it accepted "
          f"({ctd3.get('accepted_prediction_tokens')} of 48 tokens, {ctd3.get('rejected_prediction_tokens')} "
          f"drafted and rejected)", st == 200 and ids3 == ids and ctd3.get("accepted_prediction_tokens", 99) <= 6
          and ctd3.get("rejected_prediction_tokens", 0) > 0, f"{st} {u3}")
    # OpenAI completions with a text prediction, and chat with one
    st, j, b = completion(srv, prompt, 48, speculative=False)
    st2, j2, b2 = completion(srv, prompt, 48, prediction={"type": "content", "content": j["choices"][0]["text"]})
    ctd = j2["usage"].get("completion_tokens_details", {}) if st2 == 200 else {}
    check("default: /v1/completions with the greedy text as prediction: the same text, accepted_prediction_tokens "
          "== completion_tokens (the text tokenizes back to the same tokens)",
          st == 200 and st2 == 200 and j2["choices"][0]["text"] == j["choices"][0]["text"]
          and ctd.get("accepted_prediction_tokens") == j2["usage"]["completion_tokens"], f"{b[:200]} {b2[:300]}")
    msgs = [{"role": "user", "content": "Write about the river."}]
    st, _, c1, b = srv.jreq("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 40, "temperature": 0,
                                                             "speculative": False})
    txt = c1["choices"][0]["message"]["content"] if st == 200 else ""
    pred = {"type": "content", "content": [{"type": "text", "text": txt[:len(txt) // 2]},
                                           {"type": "text", "text": txt[len(txt) // 2:]}]}
    st2, _, c2, b2 = srv.jreq("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 40, "temperature": 0,
                                                               "prediction": pred})
    ctd = c2["usage"].get("completion_tokens_details", {}) if st2 == 200 else {}
    check("default: chat with the answer as a prediction in text parts: the same content, most of it accepted",
          st == 200 and st2 == 200 and c2["choices"][0]["message"]["content"] == txt
          and ctd.get("accepted_prediction_tokens", 0) * 2 >= c2["usage"]["completion_tokens"],
          f"{b[:200]} {b2[:300]}")


def test_ngram_logprobs_grammar_stop(srv):
    rep = ("the red house and the blue house and the green house and the red house and the blue house and the "
           "green house and the red")
    st, j0, b0 = completion(srv, rep, 40, speculative=False, logprobs=3)
    st1, j1, b1 = completion(srv, rep, 40, logprobs=3)      # --spec-type ngram-simple
    sp = j1["usage"].get("speculative", {}) if st1 == 200 else {}
    check(f"default: n-gram drafts on a repeating prompt: the same text ({sp.get('accepted_tokens')} of "
          f"{sp.get('draft_tokens')} drafts accepted; this small model does not copy the prompt, it repeats its own "
          f"phrases)", st == 200 and st1 == 200 and j1["choices"][0]["text"] == j0["choices"][0]["text"]
          and sp.get("draft_tokens", 0) > 0, f"{b0[:200]} {b1[:300]}")
    if st == 200 and st1 == 200:
        l0, l1 = j0["choices"][0]["logprobs"], j1["choices"][0]["logprobs"]
        close = (l0["tokens"] == l1["tokens"] and len(l0["token_logprobs"]) == len(l1["token_logprobs"])
                 and all(abs(a - b) < 1e-3 for a, b in zip(l0["token_logprobs"], l1["token_logprobs"]))
                 and [sorted(d) for d in l0["top_logprobs"]] == [sorted(d) for d in l1["top_logprobs"]])
        check("default: logprobs (and top 3) of the accepted tokens equal those without speculation (within 1e-3)",
              close, f"{l0['token_logprobs'][:5]} {l1['token_logprobs'][:5]}")
    # JSON-object constraint with the constrained output as the prediction, then a broken one
    body = {"messages": [{"role": "user", "content": "A JSON object about a cat."}], "max_tokens": 48,
            "temperature": 0, "response_format": {"type": "json_object"}}
    st, _, g0, b0 = srv.jreq("POST", "/v1/chat/completions", dict(body, speculative=False))
    txt = g0["choices"][0]["message"]["content"] if st == 200 else ""
    st1, _, g1, b1 = srv.jreq("POST", "/v1/chat/completions", dict(body, prediction={"type": "content",
                                                                                       "content": txt}))
    st2, _, g2, b2 = srv.jreq("POST", "/v1/chat/completions",
                              dict(body, prediction={"type": "content", "content": txt[:5] + "}}}]]" + txt[5:]}))
    check("default: json_object output with a prediction (exact, and one with a break the grammar refuses): the "
          "same content", st == 200 and st1 == 200 and st2 == 200 and g1["choices"][0]["message"]["content"] == txt
          and g2["choices"][0]["message"]["content"] == txt, f"{b0[:200]} {b1[:200]} {b2[:200]}")
    # a stop string inside the predicted text: cut where it is without speculation
    prompt = "Once upon a time"
    st, j, b = completion(srv, prompt, 40, speculative=False)
    full = j["choices"][0]["text"] if st == 200 else ""
    stop = full[len(full) // 2: len(full) // 2 + 4]
    st0, s0, _ = completion(srv, prompt, 40, speculative=False, stop=[stop])
    st1, s1, b1 = completion(srv, prompt, 40, stop=[stop], prediction={"type": "content", "content": full})
    check(f"default: a stop string ({stop!r}) met inside an accepted draft cuts the text where it does without "
          "speculation", st0 == 200 and st1 == 200 and s1["choices"][0]["text"] == s0["choices"][0]["text"]
          and s1["choices"][0]["finish_reason"] == "stop", b1[:300])
    # max_tokens shorter than the prediction
    st2, m2, b2 = completion(srv, prompt, 7, prediction={"type": "content", "content": full})
    check("default: max_tokens 7 with a 40-token prediction: exactly 7 tokens, the plain text's first 7",
          st2 == 200 and m2["usage"]["completion_tokens"] == 7 and full.startswith(m2["choices"][0]["text"]),
          b2[:300])


def test_stream_n_cancel(srv):
    prompt = "In the morning the farmers"
    st, text, ids, _, _ = gen_ids(srv, prompt, 40, speculative=False)
    st2, _, evs, raw = hs.stream(srv, "/generate_stream", {"inputs": prompt, "parameters": {
        "max_new_tokens": 40, "prediction": {"type": "tokens", "tokens": ids}}})
    stext, datas = hs.tgi_stream_text(evs) if st2 == 200 else ("", [])
    sids = [d["token"]["id"] for d in datas if "token" in d]
    check("default: streamed with a prediction: one token event per token, the same ids and text (accepted "
          "tokens stream as they are accepted)", st == 200 and st2 == 200 and sids == ids and stext == text,
          f"{st2} {sids[:8]} {ids[:8]} {raw}")
    # n: 3 sampled, with a prediction: each choice equals its seed alone without one
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0.8, "seed": 77, "n": 3,
            "prediction": {"type": "tokens", "tokens": ids}}
    st, _, jn, bn = srv.jreq("POST", "/v1/completions", body)
    ok = st == 200
    for i in range(3):
        one = dict(body, n=1, seed=hs.choice_seed(77, i), speculative=False)
        one.pop("prediction")
        s1, _, j1, _ = srv.jreq("POST", "/v1/completions", one)
        ok = ok and s1 == 200 and j1["choices"][0]["text"] == jn["choices"][i]["text"]
    check("default: n: 3 sampled with a prediction: choice i equals seed derive(77, i) alone without speculation",
          ok, bn[:300])
    # cancel a long speculative stream
    pred = {"type": "tokens", "tokens": ids * 40}
    c = srv.conn(30)
    c.request("POST", "/generate_stream", body=json.dumps({"inputs": prompt, "parameters": {
        "max_new_tokens": 900, "ignore_eos": True, "prediction": pred, "speculative": True}}).encode(),
        headers={"X-Request-Id": "spec-cancel-1", "Content-Type": "application/json"})
    r = c.getresponse()
    it = hs.sse_events(r)
    got = [e for _, e in zip(range(3), it)]
    dst, _, _ = srv.req("DELETE", "/requests/spec-cancel-1")
    rest = list(it)
    c.close()
    last = json.loads(rest[-1][1]) if rest else {}
    check(f"default: DELETE ends a speculative stream with the cancelled event ({len(got) + len(rest)} events)",
          dst == 204 and last.get("error_type") == "cancelled", f"{dst} {rest[-1:]}")
    ok, s = quiet(srv)
    check("default: after the cancel nothing runs and no rollback snapshot or sequence is held but the prefix "
          "store's", ok, json.dumps(s and s["pools"])[:300])


def test_concurrent(srv):
    prompts = [f"Story {i}: the old man walked to the" for i in range(16)]
    alone = [gen_ids(srv, p, 32, speculative=False) for p in prompts]
    out = [None] * 16

    def one(i):
        ids = alone[i][2] or []
        extra = {}
        if i % 3 == 0:
            extra = {"prediction": {"type": "tokens", "tokens": ids}}
        elif i % 3 == 1:
            extra = {"prediction": {"type": "tokens", "tokens": wrong(ids, 4096)}}
        out[i] = gen_ids(srv, prompts[i], 32, **extra)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bad = [i for i in range(16) if not out[i] or out[i][0] != 200 or out[i][2] != alone[i][2]]
    check("default: 16 requests at once (exact, wrong and n-gram drafts) each answer the tokens it answers alone "
          "without speculation", not bad and all(a[0] == 200 for a in alone), f"differ: {bad}")
    s = srv.stats()
    check("default: /stats scheduler saw more than one sequence per step", s["scheduler"]["batch_decode_max"] > 1,
          json.dumps(s["scheduler"])[:300])


def test_metrics_and_errors(srv):
    def spec_counts():
        txt = srv.req("GET", "/metrics")[2].decode()
        vals = {}
        for line in txt.splitlines():
            if line.startswith("vllm:spec_decode_") and "position=" not in line:
                name, v = line.split("{")[0], float(line.rsplit(" ", 1)[1])
                vals[name] = v
            elif line.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total"):
                vals["pos"] = vals.get("pos", 0) + float(line.rsplit(" ", 1)[1])
        return vals, srv.stats()["speculative"]

    m0, s0 = spec_counts()
    st, text, ids, _, _ = gen_ids(srv, "A man and a woman", 24, speculative=False)
    st, _, _, det, _ = gen_ids(srv, "A man and a woman", 24, prediction={"type": "tokens", "tokens": ids})
    m1, s1 = spec_counts()
    sp = det.get("speculative", {}) if st == 200 else {}
    dd = m1.get("vllm:spec_decode_num_draft_tokens_total", 0) - m0.get("vllm:spec_decode_num_draft_tokens_total", 0)
    da = (m1.get("vllm:spec_decode_num_accepted_tokens_total", 0)
          - m0.get("vllm:spec_decode_num_accepted_tokens_total", 0))
    dn = m1.get("vllm:spec_decode_num_drafts_total", 0) - m0.get("vllm:spec_decode_num_drafts_total", 0)
    check("default: /metrics vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total moved by the "
          "request's details, the per-position counters by its accepted tokens, /stats speculative likewise",
          st == 200 and dd == sp.get("draft_tokens") and da == sp.get("accepted_tokens") and dn == sp.get("verify_steps")
          and m1.get("pos", 0) - m0.get("pos", 0) == da
          and s1["accepted_tokens_total"] - s0["accepted_tokens_total"] == da and s1["type"] == "ngram-simple",
          f"{m0} {m1} {sp} {s1}")
    for body, what in (({"prediction": {"type": "tokens", "tokens": [1, 4096]}}, "an id past the vocabulary"),
                       ({"prediction": {"type": "tokens", "tokens": [1, -2]}}, "a negative id"),
                       ({"prediction": {"type": "tokens", "tokens": [1.5]}}, "a fraction"),
                       ({"prediction": {"type": "image", "content": "x"}}, "an unknown type"),
                       ({"prediction": "text"}, "a string"),
                       ({"prediction": {"type": "content", "content": 5}}, "content a number"),
                       ({"speculative": "yes"}, "speculative a string")):
        st, _, j, b = srv.jreq("POST", "/v1/completions", dict({"prompt": "x", "max_tokens": 2}, **body))
        check(f"default: {what} is a 400 naming the field", st == 400 and j["error"]["param"] in (
            "prediction", "speculative"), f"{st} {b[:200]}")
    st, _, j, b = srv.jreq("POST", "/generate", {"inputs": "x", "parameters": {
        "max_new_tokens": 2, "prediction": {"type": "tokens", "tokens": [99999]}}})
    check("default: TGI parameters.prediction with an id past the vocabulary is a 422", st == 422, f"{st} {b[:200]}")


# ---------------------------------------------------------------------------
# synthesized families
# ---------------------------------------------------------------------------

def test_family(name, srv):
    prompts = [f"{name} prompt {i}: " + "abc def ghi " * (1 + i % 3) for i in range(16)]
    base = [gen_ids(srv, p, 40, speculative=False) for p in prompts]
    if not check(f"{name}: 16 greedy requests without speculation answer", all(b[0] == 200 for b in base),
                 str([b[0] for b in base])):
        return
    ids0 = base[0][2]
    r_exact = gen_ids(srv, prompts[0], 40, prediction={"type": "tokens", "tokens": ids0})
    r_wrong = gen_ids(srv, prompts[0], 40, prediction={"type": "tokens", "tokens": wrong(ids0, 300)})
    r_ngram = gen_ids(srv, prompts[0], 40, speculative=True)
    sp = r_exact[3].get("speculative", {}) if r_exact[0] == 200 else {}
    rej = (r_wrong[4] or {}).get("completion_tokens_details", {}).get("rejected_prediction_tokens", 0)
    check(f"{name}: one sequence: exact prediction (all {sp.get('draft_tokens')} drafts accepted), a prediction wrong "
          f"at every 5th token ({rej} draft tokens rejected, each rejection a rollback) and n-gram drafts all answer the tokens of "
          "no speculation",
          r_exact[2] == ids0 and r_wrong[2] == ids0 and r_ngram[2] == ids0 and rej > 0
          and sp.get("accepted_tokens") == sp.get("draft_tokens", -1) > 0, f"{r_exact[2]} {r_wrong[2]} {r_ngram[2]} {ids0}")
    bad = concurrent_differ(srv, prompts, base, 40, lambda i: (
        {"prediction": {"type": "tokens", "tokens": base[i][2]}} if i % 3 == 0 else
        {"prediction": {"type": "tokens", "tokens": wrong(base[i][2], 300)}} if i % 3 == 1 else {"speculative": True}))
    check(f"{name}: 16 sequences at once, prefix cache on, exact / wrong / n-gram drafts: each equal to no "
          "speculation", not bad, f"differ: {bad}")
    ok, s = quiet(srv)
    check(f"{name}: then nothing held but the prefix store's entries", ok, json.dumps(s and s["pools"])[:300])


def long_stream(srv, prompt, rid, n_events):
    """Start a 900-token stream with id rid and read n_events of it: (connection, event iterator, events read)."""
    c = srv.conn(30)
    c.request("POST", "/generate_stream", body=json.dumps({"inputs": prompt, "parameters": {
        "max_new_tokens": 900, "ignore_eos": True}}).encode(),
        headers={"X-Request-Id": rid, "Content-Type": "application/json"})
    it = hs.sse_events(c.getresponse())
    return c, it, [e for _, e in zip(range(n_events), it)]


def source_runs(srv, label, prompts):
    """The runs a server-side draft source is judged by: the prompts greedy without speculation (None when
    they fail, said), the first alone with the server's drafts, then all at once; (base, alone, its
    speculative details, the indices differing at once, drafted, accepted, rollbacks, /stats speculative)."""
    base = [gen_ids(srv, p, 40, speculative=False) for p in prompts]
    if not check(f"{label}: 16 greedy requests without speculation answer", all(b[0] == 200 for b in base),
                 str([b[0] for b in base])):
        return None
    r1 = gen_ids(srv, prompts[0], 40)
    sp = (r1[3] or {}).get("speculative", {}) if r1[0] == 200 else {}
    s0 = srv.stats()["speculative"]
    bad = concurrent_differ(srv, prompts, base, 40)
    s1 = srv.stats()["speculative"]
    return (base, r1, sp, bad, s1["draft_tokens_total"] - s0["draft_tokens_total"],
            s1["accepted_tokens_total"] - s0["accepted_tokens_total"], s1["rollbacks_total"] - s0["rollbacks_total"],
            s1)


def test_draft(name, srv, self_draft, model=None, draft=None):
    """Greedy with the draft model equal to no speculation, 1 and 16 sequences; the target as its own draft
    accepts every draft."""
    what = "the model itself as draft" if self_draft else "a 2-layer draft model"
    prompts = [f"{name} draft {i}: " + "uvw xyz " * (1 + i % 4) + str(i) for i in range(16)]
    runs = source_runs(srv, f"{name}, {what}", prompts)
    if not runs:
        return
    base, r1, sp, bad, drafted, acc, rb, s1 = runs
    check(f"{name}, {what}: one sequence: the tokens of no speculation ({sp.get('accepted_tokens')} of "
          f"{sp.get('draft_tokens')} drafts accepted)",
          r1[2] == base[0][2] and sp.get("draft_tokens", 0) > 0
          and (not self_draft or sp.get("accepted_tokens") == sp.get("draft_tokens")), f"{r1[2]} {base[0][2]} {sp}")
    check(f"{name}, {what}: 16 sequences at once, prefix cache on: each equal to no speculation ({acc} of {drafted} "
          f"drafts accepted, {rb} rollbacks)",
          not bad and drafted > 0 and (acc == drafted if self_draft else rb > 0), f"differ: {bad} {s1}")
    dm = s1.get("draft_model", {})
    check(f"{name}, {what}: /stats shows the draft model's engine (weights {dm.get('weight_bytes')} B, its own "
          f"cache {dm.get('cache_budget_bytes')} B)", dm.get("weight_bytes", 0) > 0 and dm.get("cache_budget_bytes", 0) > 0,
          json.dumps(s1))
    if not self_draft:
        # cancel mid-stream: both sequences (the model's and the draft model's) go back
        c, it, got = long_stream(srv, prompts[1], f"draft-cancel-{name}", 3)
        st = srv.stats()
        held = st["speculative"].get("draft_model", {}).get("sequences", 0)
        req = (st.get("requests") or [{}])[0]
        r = hs.run([HYSERVE, "mem", "-m", model, "--model-draft", draft, "--context", "1024", "--batch", "16", "--json"])
        plan = json.loads(r.stdout.decode() or "{}").get("speculative", {}) if r.returncode == 0 else {}
        dm = st["speculative"].get("draft_model", {})
        check(f"{name}, {what}: hyserve mem --model-draft plans what the server holds: the rollback snapshot "
              f"({plan.get('rollback_snapshot_bytes_per_seq')} B per sequence) and the draft weights "
              f"({plan.get('draft_weight_bytes')} B)",
              plan.get("rollback_snapshot_bytes_per_seq") == req.get("speculative", {}).get("rollback_snapshot_bytes")
              and plan.get("draft_weight_bytes") == dm.get("weight_bytes") and plan.get("draft_cache_bytes", 0) > 0,
              f"{plan} {req.get('speculative')} {dm}")
        # the route plans it too: by default for the served model of a speculating server, not when asked not to
        est = [srv.req("POST", "/v1/memory/estimate", {"context": 1024, "batch": 16, **extra})
               for extra in ({}, {"speculative": False})]
        e_sp = json.loads(est[0][2] or "{}").get("speculative", {}) if est[0][0] == 200 else {}
        check(f"{name}, {what}: POST /v1/memory/estimate plans the same: the snapshot a speculating request holds "
              f"({e_sp.get('rollback_snapshot_bytes_per_seq')} B), the draft's weights; none with \"speculative\": false",
              e_sp.get("rollback_snapshot_bytes_per_seq") == req.get("speculative", {}).get("rollback_snapshot_bytes")
              and e_sp.get("draft_weight_bytes") == dm.get("weight_bytes") and e_sp == plan
              and est[1][0] == 200 and "speculative" not in json.loads(est[1][2] or "{}"),
              f"{est[0][:2]} {e_sp} {plan} {est[1][:2]}")
        dst, _, _ = srv.req("DELETE", f"/requests/draft-cancel-{name}")
        rest = list(it)
        c.close()
        last = json.loads(rest[-1][1]) if rest else {}
        check(f"{name}, {what}: DELETE ends a draft-model stream ({len(got) + len(rest)} events, {held} draft "
              "sequence held while it ran)", dst == 204 and last.get("error_type") == "cancelled" and held == 1,
              f"{dst} {held} {rest[-1:]}")
    ok, s = quiet(srv)
    check(f"{name}, {what}: then nothing held but the prefix store's entries, no draft sequence or snapshot",
          ok, json.dumps(s and (s["pools"], s["speculative"]))[:400])


def test_mtp(name, srv):
    """--spec-type draft-mtp: greedy equal to no speculation at 1 and 16 sequences with drafts made; logprobs,
    a JSON constraint, "speculative": false and a cancel; the MTP pool in /stats and /metrics."""
    prompts = [f"{name} mtp {i}: " + "pqr stu " * (1 + i % 4) + str(i) for i in range(16)]
    runs = source_runs(srv, f"{name} mtp", prompts)
    if not runs:
        return
    base, r1, sp, bad, drafted, acc, rb, s1 = runs
    check(f"{name} mtp: speculative false reports no drafts", "speculative" not in (base[0][3] or {}),
          json.dumps(base[0][3])[:300])
    check(f"{name} mtp: one sequence: the tokens of no speculation ({sp.get('accepted_tokens')} of "
          f"{sp.get('draft_tokens')} MTP drafts accepted in {sp.get('verify_steps')} verify steps)",
          r1[2] == base[0][2] and sp.get("draft_tokens", 0) > 0, f"{r1[2]} {base[0][2]} {sp}")
    check(f"{name} mtp: 16 sequences at once, prefix cache on: each equal to no speculation ({acc} of {drafted} "
          f"drafts accepted, {rb} rollbacks)", not bad and drafted > 0 and s1["type"] == "draft-mtp"
          and (acc > 0 if name.endswith("_copy") else True),
          f"differ: {bad} {s1}")
    # logprobs of the accepted tokens, from the verifying distribution
    st, j0, b0 = completion(srv, prompts[3], 32, speculative=False, logprobs=3)
    st1, j1, b1 = completion(srv, prompts[3], 32, logprobs=3)
    u1 = j1["usage"].get("speculative", {}) if st1 == 200 else {}
    ok = st == 200 and st1 == 200 and j1["choices"][0]["text"] == j0["choices"][0]["text"]
    if ok:
        l0, l1 = j0["choices"][0]["logprobs"], j1["choices"][0]["logprobs"]
        ok = (l0["tokens"] == l1["tokens"]
              and all(abs(a - b) < 1e-3 for a, b in zip(l0["token_logprobs"], l1["token_logprobs"]))
              and [sorted(d) for d in l0["top_logprobs"]] == [sorted(d) for d in l1["top_logprobs"]])
    check(f"{name} mtp: logprobs (and top 3) under MTP drafts equal those without ({u1.get('draft_tokens')} drafts)",
          ok and u1.get("draft_tokens", 0) > 0, f"{b0[:200]} {b1[:300]}")
    body = {"messages": [{"role": "user", "content": "A JSON object."}], "max_tokens": 40, "temperature": 0,
            "response_format": {"type": "json_object"}}
    st, _, g0, b0 = srv.jreq("POST", "/v1/chat/completions", dict(body, speculative=False))
    st1, _, g1, b1 = srv.jreq("POST", "/v1/chat/completions", body)
    check(f"{name} mtp: a json_object constraint (drafts checked against the grammar first): the same content",
          st == 200 and st1 == 200 and g0["choices"][0]["message"]["content"] == g1["choices"][0]["message"]["content"],
          f"{b0[:200]} {b1[:200]}")
    # cancel mid-stream: the MTP rows go back with the sequence
    c, it, got = long_stream(srv, prompts[1], f"mtp-cancel-{name}", 30)
    st_run = srv.stats()
    mt = st_run["speculative"].get("mtp", {})
    rq = ((st_run.get("requests") or [{}])[0]).get("speculative", {})
    prom = srv.req("GET", "/metrics")[2].decode()
    dst, _, _ = srv.req("DELETE", f"/requests/mtp-cancel-{name}")
    rest = list(it)
    c.close()
    last = json.loads(rest[-1][1]) if rest else {}
    check(f"{name} mtp: while a stream runs /stats shows its MTP rows in their own pool ({mt.get('reserved_bytes')} "
          f"of {mt.get('cache_budget_bytes')} B, {mt.get('sequences')} sequence) and /metrics the gauge",
          mt.get("reserved_bytes", 0) > 0 and mt.get("cache_budget_bytes", 0) > 0 and mt.get("sequences") == 1
          and "hyserve_spec_mtp_reserved_bytes" in prom and rq.get("mtp_rows", 0) > 0
          and rq.get("mtp_reserved_bytes") == mt.get("reserved_bytes"), f"{mt} {rq}")
    r = hs.run([HYSERVE, "mem", "-m", srv.model, "--mtp", "--context", "1024", "--batch", "16", "--json"])
    plan = json.loads(r.stdout.decode() or "{}").get("speculative", {}) if r.returncode == 0 else {}
    check(f"{name} mtp: hyserve mem --mtp plans the server's MTP pool ({plan.get('mtp_cache_bytes')} B for 16 "
          f"sequences of 1024 tokens)", plan.get("mtp_cache_bytes") == mt.get("cache_budget_bytes") > 0,
          f"{plan} {mt} {r.stderr.decode()[-200:]}")
    est = srv.req("POST", "/v1/memory/estimate", {"context": 1024, "batch": 16})
    e_sp = json.loads(est[2] or "{}").get("speculative", {}) if est[0] == 200 else {}
    check(f"{name} mtp: POST /v1/memory/estimate plans the MTP pool of the served model by default "
          f"({e_sp.get('mtp_cache_bytes')} B)", e_sp.get("mtp_cache_bytes") == mt.get("cache_budget_bytes") > 0,
          f"{est[:2]} {e_sp} {mt}")
    check(f"{name} mtp: DELETE ends an MTP-drafted stream ({len(got) + len(rest)} events)",
          dst == 204 and last.get("error_type") == "cancelled", f"{dst} {rest[-1:]}")
    ok, s = quiet(srv)
    check(f"{name} mtp: then nothing held but the prefix store's entries, no MTP rows",
          ok, json.dumps(s and (s["pools"], s["speculative"]))[:400])


def test_draft_default(srv):
    """The trained default model as its own draft (--model-draft itself): real text, every draft accepted;
    logprobs, a JSON constraint, sampling and 16 sequences as without speculation."""
    prompt = "Once upon a time"
    st, j0, b0 = completion(srv, prompt, 48, speculative=False, logprobs=2)
    st1, j1, b1 = completion(srv, prompt, 48, logprobs=2)
    sp = j1["usage"].get("speculative", {}) if st1 == 200 else {}
    ok = st == 200 and st1 == 200 and j1["choices"][0]["text"] == j0["choices"][0]["text"]
    check(f"default as its own draft: the same text, every draft accepted ({sp.get('accepted_tokens')} of "
          f"{sp.get('draft_tokens')} in {sp.get('verify_steps')} verify steps)",
          ok and sp.get("draft_tokens", 0) > 0 and sp.get("accepted_tokens") == sp.get("draft_tokens"),
          f"{b0[:200]} {b1[:300]}")
    if ok:
        l0, l1 = j0["choices"][0]["logprobs"], j1["choices"][0]["logprobs"]
        check("default as its own draft: logprobs of the accepted tokens equal those without speculation (1e-3)",
              l0["tokens"] == l1["tokens"]
              and all(abs(a - b) < 1e-3 for a, b in zip(l0["token_logprobs"], l1["token_logprobs"])),
              f"{l0['token_logprobs'][:5]} {l1['token_logprobs'][:5]}")
    body = {"messages": [{"role": "user", "content": "A JSON object about a dog."}], "max_tokens": 40,
            "temperature": 0, "response_format": {"type": "json_object"}}
    st, _, g0, b0 = srv.jreq("POST", "/v1/chat/completions", dict(body, speculative=False))
    st1, _, g1, b1 = srv.jreq("POST", "/v1/chat/completions", body)
    check("default as its own draft: a json_object constraint: the same content",
          st == 200 and st1 == 200 and g0["choices"][0]["message"]["content"] == g1["choices"][0]["message"]["content"],
          f"{b0[:200]} {b1[:200]}")
    samp = {"temperature": 0.9, "seed": 123}
    st, j0, b0 = completion(srv, prompt, 32, speculative=False, **samp)
    st1, j1, b1 = completion(srv, prompt, 32, **samp)
    check("default as its own draft: sampled (temperature 0.9, seed 123): the text of no speculation (the verify "
          "rows are the bits of one-token steps, the draw the same)",
          st == 200 and st1 == 200 and j0["choices"][0]["text"] == j1["choices"][0]["text"], f"{b0[:200]} {b1[:200]}")
    prompts = [f"Story {i}: the little girl" for i in range(16)]
    base = [gen_ids(srv, p, 32, speculative=False) for p in prompts]
    bad = concurrent_differ(srv, prompts, base, 32)
    check("default as its own draft: 16 sequences at once, prefix cache on: each equal to no speculation",
          not bad, f"differ: {bad}")
    ok, s = quiet(srv)
    check("default as its own draft: then no draft sequence held", ok, json.dumps(s and s["speculative"])[:300])


def test_draft_refusals():
    fam = os.path.join(TMP, "qwen35.gguf")
    other = os.path.join(TMP, "vocab320.gguf")
    r = hs.run([HYSERVE, "synth", "-o", other, "--arch", "llama", "--layers", "2", "--seed", "43", "--vocab", "320",
                "--ctx", "1024", "--chat-template", "chatml"])
    if not check("hyserve synth writes a model of another vocabulary", r.returncode == 0 and os.path.exists(fam),
                 r.stderr.decode()[-300:]):
        return
    r = hs.run([HYSERVE, "serve", "-m", fam, "--model-draft", other, "--config", "/dev/null", "--port",
                str(hs.free_port())])
    err = (r.stderr.decode() + r.stdout.decode()).strip().splitlines()
    last = err[-1] if err else ""
    check("serve with a draft model of another vocabulary exits non-zero with one line saying so",
          r.returncode != 0 and "vocabulary has 320 tokens, the model's 300" in last, last)


def test_options():
    for args, want in ((["--spec-type", "draft-mtp"], "has no MTP block (nextn_predict_layers is 0)"),
                       (["--spec-type", "draft-simple"], "needs --model-draft FILE"),
                       (["--spec-type", "ngram-simple", "--model-draft", DEFAULT], "not ngram-simple"),
                       (["--spec-type", "bogus"], "must be none, ngram-simple, draft-simple or draft-mtp"),
                       (["--spec-draft-n-max", "0"], "out of range 1..64"),
                       (["--spec-draft-n-max", "65"], "out of range 1..64"),
                       (["--spec-draft-n-min", "20"], "out of range"),
                       (["--model-draft", "/nonexistent.gguf"], "cannot load the draft model /nonexistent.gguf")):
        r = hs.run([HYSERVE, "serve", "-m", DEFAULT, "--config", "/dev/null", "--port", str(hs.free_port())] + args)
        err = r.stderr.decode() + r.stdout.decode()
        check(f"serve {' '.join(args)} exits non-zero saying {want!r}", r.returncode != 0 and want in err, err[-300:])


# ---------------------------------------------------------------------------

DEFAULT_TESTS = ["test_prediction", "test_ngram_logprobs_grammar_stop", "test_stream_n_cancel", "test_concurrent",
                 "test_metrics_and_errors"]


def main(argv=None):
    names = (DEFAULT_TESTS + [f"test_family[{f}]" for f in FAMILIES] + [f"test_draft[{f}]" for f in DRAFTS]
             + [f"test_mtp[{f}]" for f in MTPS] + ["test_draft_default", "test_draft_refusals", "test_options"])
    chosen = hs.select(sys.argv[1:] if argv is None else argv, names, "spec")
    os.makedirs(TMP, exist_ok=True)
    servers = []
    try:
        todo = [n for n in DEFAULT_TESTS if n in chosen]
        if todo and not os.path.exists(DEFAULT):
            print(f"  SKIP {', '.join(todo)}: {DEFAULT} is absent")
            SKIPPED.extend(todo)
        elif todo:
            srv = hs.Server("spec-default", DEFAULT, "--spec-type", "ngram-simple", "--max-seqs", "16", "-t", "2", *NOGATE,
                            "--prefix-cache", "on")
            servers.append(srv)
            for n in todo:
                globals()[n](srv)
            srv.stop()
        # one server a synthesized model: the families (the server's defaults), the MTP files (draft-mtp)
        for test, group, suffix, args in (("test_family", FAMILIES, "", []),
                                          ("test_mtp", MTPS, "-mtp", ["--spec-type", "draft-mtp"])):
            for fam, synth in group.items():
                if f"{test}[{fam}]" not in chosen:
                    continue
                model = os.path.join(TMP, fam + suffix + ".gguf")
                r = hs.run([HYSERVE, "synth", "-o", model] + synth + COMMON)
                if not check(f"{fam}{suffix}: hyserve synth writes the model", r.returncode == 0,
                             r.stderr.decode()[-300:]):
                    continue
                srv = hs.Server("spec-" + fam + suffix, model, *args, "--max-seqs", "16", "-t", "2", *NOGATE,
                                "--prefix-cache", "on")
                servers.append(srv)
                globals()[test](fam, srv)
                srv.stop()
        for fam, (tsynth, dsynth) in DRAFTS.items():
            if f"test_draft[{fam}]" not in chosen:
                continue
            model = os.path.join(TMP, fam + "-target.gguf")
            draft = os.path.join(TMP, fam + "-draft.gguf")
            r = hs.run([HYSERVE, "synth", "-o", model] + tsynth + COMMON)
            r2 = hs.run([HYSERVE, "synth", "-o", draft] + dsynth + COMMON)
            if not check(f"{fam}: hyserve synth writes the model and its draft", r.returncode == 0 and r2.returncode == 0,
                         (r.stderr + r2.stderr).decode()[-300:]):
                continue
            for self_draft in (False, True):
                srv = hs.Server(f"spec-draft-{fam}{'-self' if self_draft else ''}", model, "--model-draft",
                                model if self_draft else draft, "--max-seqs", "16", "-t", "2", *NOGATE, "--prefix-cache", "on")
                servers.append(srv)
                test_draft(fam, srv, self_draft, model, draft)
                srv.stop()
        if "test_draft_default" in chosen and not os.path.exists(DEFAULT):
            print(f"  SKIP test_draft_default: {DEFAULT} is absent")
            SKIPPED.append("test_draft_default")
        elif "test_draft_default" in chosen:
            srv = hs.Server("spec-draft-default", DEFAULT, "--model-draft", DEFAULT, "--max-seqs", "16", "-t", "2", *NOGATE,
                            "--prefix-cache", "on")
            servers.append(srv)
            test_draft_default(srv)
            srv.stop()
        if "test_draft_refusals" in chosen:
            if not os.path.exists(os.path.join(TMP, "qwen35.gguf")):
                hs.run([HYSERVE, "synth", "-o", os.path.join(TMP, "qwen35.gguf")] + FAMILIES["qwen35"] + COMMON)
            test_draft_refusals()
        if "test_options" in chosen and os.path.exists(DEFAULT):
            test_options()
        elif "test_options" in chosen:
            SKIPPED.append("test_options")
    except Exception as e:  # noqa: BLE001 - a crash in a test is a failure
        import traceback
        traceback.print_exc()
        check("spec suite ran to the end", False, repr(e))
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.stop()
    hs.check_server_logs(servers)
    print(f"spec: {hs.passed} passed, {hs.failed} failed, {len(SKIPPED)} skipped")
    sys.exit(1 if hs.failed else 0)


if __name__ == "__main__":
    main()

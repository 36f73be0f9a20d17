#!/usr/bin/env python3
"""report.py - merge the benchmark parts into latest.json and render latest.md.

Owns: the ratios to the machine limits (one place for that arithmetic) and
the target verdicts. Inputs are the JSON objects written by hyserve-bench
(limits, engine per dtype, dnet, dnet-model) and bench/serve_bench (server);
run.sh passes them as NAME=FILE arguments.

Ratios:
  decode   (bytes a step must move / seconds per token) / triad bandwidth at
           the same thread count (best of the triad repetitions);
  prefill  model FLOP/s (projections, LM head row, causal attention pairs,
           DeltaNet recurrence) / sgemm FLOP/s at the model's projection
           shapes (best mix repetition) at the same thread count.
Limits use the best repetition (STREAM's convention) and engine figures the
median, so the ratios lean conservative.
"""
import json
import sys

# The limit each figure is divided by, named in the rows and the tables:
# decode streams the weights, so memory bandwidth; prompts of every weight
# type run today as sgemm on decoded tiles (engine/matmul.c), so the fp32
# sgemm rate at the model's shapes is their kernel family's peak.
DECODE_LIMIT = "triad bandwidth"
PREFILL_LIMIT = "sgemm fp32"


def load(path):
    with open(path) as f:
        return json.load(f)


def by_threads(rows):
    return {r["threads"]: r for r in rows}


def yn(b):
    return "yes" if b else "no"


def pct(x):
    return "-" if x is None else "%.0f%%" % (100.0 * x)


def spct(x):
    return "-" if x is None else "%+.1f%%" % (100.0 * x)


def fmt(x, nd=1):
    return "-" if x is None else ("%." + str(nd) + "f") % x


def main(argv):
    out_json, out_md, meta_path = argv[1], argv[2], argv[3]
    parts = {}
    for a in argv[4:]:
        name, path = a.split("=", 1)
        try:
            parts[name] = load(path)
        except (OSError, ValueError) as e:
            print("report: skipping %s (%s)" % (name, e), file=sys.stderr)
    res = load(meta_path)
    limits = parts.get("limits")
    res["limits"] = limits
    res["models"] = [parts[k] for k in sorted(parts) if k.startswith("engine_")]
    res["kernels"] = parts.get("kernels")
    res["dnet"] = parts.get("dnet")
    res["dnet_model"] = parts.get("dnet_model")
    res["server"] = parts.get("server")
    res["grammar"] = parts.get("grammar")
    res["grammar_248k"] = parts.get("grammar_248k")
    res["grammar_decode"] = parts.get("grammar_decode")

    bw = {}
    gemm = {}
    upd = {}
    if limits:
        for r in limits["triad"]:
            bw[r["threads"]] = r["gb_s"]["best"]
        for r in limits.get("update", []):
            upd[r["threads"]] = r["gb_s"]["best"]
        for r in limits["sgemm"]:
            gemm[r["threads"]] = r["mix_gflop_s"]["best"]

    der = {"decode": [], "prefill": [], "batched": [], "context": [], "targets": []}
    bw_run, gemm_run, upd_run = dict(bw), dict(gemm), dict(upd)
    for m in res["models"]:
        # a run with the DeltaNet state in bf16 (--state-dtype bf16) is its own row
        dt = m["dtype"] + (" (bf16 state)" if m.get("state_dtype") == "bf16" else "")
        # each model's own limits, measured right before its figures (fall back to the run's)
        bw, gemm, upd = dict(bw_run), dict(gemm_run), dict(upd_run)
        if m.get("limits"):
            bw = {r["threads"]: r["gb_s"]["best"] for r in m["limits"]["triad"]}
            gemm = {r["threads"]: r["mix_gflop_s"]["best"] for r in m["limits"]["sgemm"]}
            upd = {r["threads"]: r["gb_s"]["best"] for r in m["limits"].get("update", [])} or upd
        for th in m.get("threads", []):
            for p in th["prefill"]:
                lim = gemm.get(th["threads"])
                g = p["gflop_s"]["median"]
                der["prefill"].append({"dtype": dt, "threads": th["threads"], "tokens": p["tokens"],
                                       "tok_s": p["tok_s"]["median"], "spread_pct": p["tok_s"]["spread_pct"],
                                       "gflop_s": g, "limit_gflop_s": lim, "limit": PREFILL_LIMIT,
                                       "fraction": g / lim if lim else None})
        dec = {}
        # the decode figures are bracketed by a triad before and one after
        # them (runs from stop 33 on): the higher of the two is the limit,
        # so a dip in either sample does not flatter the fraction
        after = {r["threads"]: r["gb_s"]["best"] for r in m.get("limits_after_decode", {}).get("triad", [])}
        for d in m.get("decode", []):
            before, aft = bw.get(d["threads"]), after.get(d["threads"])
            lim = max(x for x in (before, aft) if x) if (before or aft) else None
            g = d["gb_s"]["median"]
            row = {"dtype": dt, "threads": d["threads"], "ctx": d["ctx"], "ctx_mean": d["ctx_mean"],
                   "tok_s": d["tok_s"]["median"], "spread_pct": d["tok_s"]["spread_pct"],
                   "bytes_per_token": d["bytes_per_token"], "gb_s": g, "limit_gb_s": lim, "limit": DECODE_LIMIT,
                   "limit_before_gb_s": before, "limit_after_gb_s": aft,
                   "fraction": g / lim if lim else None}
            der["decode"].append(row)
            dec[(d["threads"], d["ctx"])] = dict(row, tok_s_one_page=d.get("tok_s_one_page", {}).get("median"),
                                                 alt=d.get("tok_s_alternating", {}).get("median"),
                                                 near0=d.get("tok_s_near0_alternating", {}).get("median"),
                                                 near0_ctx_mean=d.get("near0_ctx_mean"),
                                                 kv_read=d.get("kv_read_gb_s", {}).get("best"))
        for th in (1, 2):
            a, b = dec.get((th, 0)), dec.get((th, 8192))
            if a and b and bw.get(th):
                # predicted: the 0-context step plus the extra KV bytes at
                # the measured bandwidth. The 0-context step is the short
                # sequence decoded in alternation with the 8K one (same
                # conditions); the separate 0-context section, minutes
                # earlier, is kept for comparison.
                same = b["alt"] is not None and b["near0"] is not None
                t0 = 1.0 / (b["near0"] if same else a["tok_s"])
                t8 = 1.0 / (b["alt"] if same else b["tok_s"])
                c0 = b["near0_ctx_mean"] if same else a["ctx_mean"]
                extra = (b["ctx_mean"] - c0) * m["kv_bytes_per_token"]
                pred = t0 + extra / (bw[th] * 1e9)
                # the same bytes at the rate a plain read of the cache's
                # pages reaches (best repetition, like the limits)
                kvr = b["kv_read"]
                pred_rd = t0 + extra / (kvr * 1e9) if kvr else None
                one = b["tok_s_one_page"]
                der["context"].append({"dtype": dt, "threads": th, "ms_ctx0": 1e3 * t0, "ms_ctx8k": 1e3 * t8,
                                       "ms_predicted": 1e3 * pred, "measured_over_predicted": t8 / pred,
                                       "alternating": same, "kv_read_gb_s": kvr, "triad_gb_s": bw[th],
                                       "ms_predicted_kv_read": 1e3 * pred_rd if pred_rd else None,
                                       "measured_over_predicted_kv_read": t8 / pred_rd if pred_rd else None,
                                       "ms_ctx0_section": 1e3 / a["tok_s"], "ms_ctx8k_section": 1e3 / b["tok_s"],
                                       "ms_ctx8k_one_page": 1e3 / one if one else None})
        bat = {r["seqs"]: r for r in m.get("batched", [])}
        one = bat.get(1)
        # Ceilings independent of any kernel. Bytes: a step of n sequences
        # reads every weight once and each sequence's DeltaNet state and
        # conv window (read, and one of its K - 1 rows written: a ring; files
        # from before the ring have no ssm_conv_kernel and count it all
        # written back) and its KV (~30 tokens); at equal bandwidth n
        # sequences can be at most n B(1) / B(n) times one. fp32: n tokens
        # cost n * 2 FLOP per parameter; at the run's 2-thread sgemm rate
        # that caps the step for kernels that multiply in fp32 (not Q8_0,
        # BF16 and F16 on AMX, which multiply in int8 and bf16, nor Q8_0 on
        # AVX512-VNNI, int8).
        conv = m.get("dnet_conv_bytes_per_seq", 0)
        conv_rows = max(m.get("ssm_conv_kernel", 2) - 1, 1)
        per_seq = 2 * m.get("dnet_state_bytes_per_seq", 0) + conv + conv / conv_rows + \
            30 * m.get("kv_bytes_per_token", 0)
        wb = m.get("weight_bytes", 0)
        # fp32 + state: the products at the sgemm rate, then each
        # sequence's DeltaNet state read and written back at the rate of an
        # in-place update stream (limits "update", its own pattern: no
        # write-allocate; the triad where a run lacks it). Within a layer
        # the state update needs the layer's projections and the next
        # layer's projections need the update, so the two do not overlap;
        # one sequence's step is its measured time.
        state = 2 * m.get("dnet_state_bytes_per_seq", 0)
        for s, r in sorted(bat.items()):
            bytes_cap = s * (wb + per_seq) / (wb + s * per_seq) if wb else None
            fp32_cap = fp32_state_cap = None
            products = m.get("batched_products", "amx" if m.get("batched_on_amx") else "fp32")
            if one and gemm.get(r["threads"]) and m.get("n_params") and products == "fp32":
                fp32_cap = gemm[r["threads"]] * 1e9 / (2.0 * m["n_params"]) / one["tok_s"]["median"]
                sbw = upd.get(r["threads"]) or bw.get(r["threads"])
                if sbw:
                    t_s = s * 2.0 * m["n_params"] / (gemm[r["threads"]] * 1e9) + s * state / (sbw * 1e9)
                    fp32_state_cap = min(s, s / (one["tok_s"]["median"] * t_s))
            if m.get("weights_in_panels"):
                products += ", panels"
            der["batched"].append({"dtype": dt, "seqs": s, "threads": r["threads"], "tok_s": r["tok_s"]["median"],
                                   "spread_pct": r["tok_s"]["spread_pct"],
                                   "vs_one": r["tok_s"]["median"] / one["tok_s"]["median"] if one else None,
                                   "vs_one_paired": r.get("x_one_paired"),
                                   "bytes_ceiling": bytes_cap, "products": products,
                                   "fp32_ceiling": min(s, fp32_cap) if fp32_cap else None,
                                   "fp32_state_ceiling": fp32_state_cap})

    T = der["targets"]
    for r in der["decode"]:
        if r["ctx"] == 0 and r["fraction"] is not None:
            T.append({"target": "decode %s %dT >= 80%% of bandwidth" % (r["dtype"], r["threads"]),
                      "value": r["fraction"], "goal": 0.80, "met": r["fraction"] >= 0.80})
    for r in der["prefill"]:
        if r["dtype"] == "f32" and r["tokens"] == 512 and r["fraction"] is not None:
            T.append({"target": "prefill 512 f32 %dT >= 60%% of sgemm" % r["threads"],
                      "value": r["fraction"], "goal": 0.60, "met": r["fraction"] >= 0.60})
    if res["dnet"]:
        for r in res["dnet"]["runs"]:
            T.append({"target": "DeltaNet chunked >= 5x recurrent (reference path) at 2048, %dT" % r["threads"],
                      "value": r["speedup_vs_ref"], "goal": 5.0, "met": r["speedup_vs_ref"] >= 5.0})
    for r in der["context"]:
        T.append({"target": "decode %s %dT at 8K context <= 0-context + extra KV reads" % (r["dtype"], r["threads"]),
                  "value": r["measured_over_predicted"], "goal": 1.0, "met": r["measured_over_predicted"] <= 1.0})
    for r in der["batched"]:
        if r["seqs"] == 16 and r["vs_one"] is not None:
            T.append({"target": "batched decode %s: 16 sequences >= 8x one" % r["dtype"],
                      "value": r["vs_one"], "goal": 8.0, "met": r["vs_one"] >= 8.0})
    srv = res["server"]
    if srv and srv.get("runs"):
        # single stream: mean time between token events over HTTP vs the engine's
        # own decode step (same weights, 2 threads, context 0..136 in both)
        one = [r for r in srv["runs"] if r["clients"] == 1]
        eng = [r for r in der["decode"] if r["dtype"] == srv["dtype"] and r["threads"] == srv["threads"] and r["ctx"] == 0]
        if one and eng and one[0]["tokens"] > 1:
            srv["http_ms_per_token"] = one[0]["itl_ms_mean"]
            srv["engine_ms_per_token"] = 1e3 / eng[0]["tok_s"]
            srv["overhead_fraction"] = srv["http_ms_per_token"] / srv["engine_ms_per_token"] - 1.0
        # the same comparison against the server's own engine time in the
        # same run (its decode-only steps, read from /stats before and
        # after): no drift of the machine between the two figures, so this
        # one decides the target when present
        if one and one[0]["tokens"] > 1 and srv.get("engine_decode_ms_1_client"):
            srv["http_ms_per_token"] = one[0]["itl_ms_mean"]
            srv["overhead_fraction_engine_section"] = srv.get("overhead_fraction")
            srv["overhead_fraction"] = srv["http_ms_per_token"] / srv["engine_decode_ms_1_client"] - 1.0
    if srv and srv.get("overhead_fraction") is not None:
        T.append({"target": "HTTP/JSON/SSE overhead per token < 2% (single stream)",
                  "value": srv["overhead_fraction"], "goal": 0.02, "met": srv["overhead_fraction"] < 0.02})
    gr = res["grammar"]
    if gr:
        # structured output: the grammar's extra time per token (mask + advance,
        # cold caches included) added to the engine's measured decode step,
        # 2 threads, context 0; the bench model's 4096-token head makes this
        # conservative (a 152K head lengthens the step, not the grammar's part)
        eng = sorted((r for r in der["decode"] if r["threads"] == 2 and r["ctx"] == 0), key=lambda r: -r["tok_s"])
        if eng:
            t_dec = 1e3 / eng[0]["tok_s"]
            gr["decode_dtype"] = eng[0]["dtype"]
            gr["decode_ms_per_token"] = t_dec
            gr["constrained_fraction"] = t_dec / (t_dec + max(gr["grammar_ms_per_token"], 0.0))
            T.append({"target": "constrained decode >= 90%% of unconstrained tok/s (%s 2T, %d-token vocab)" % (
                          eng[0]["dtype"], gr["n_vocab"]),
                      "value": gr["constrained_fraction"], "goal": 0.90, "met": gr["constrained_fraction"] >= 0.90})
        T.append({"target": "compile a 50-property JSON Schema < 50 ms", "value": gr["compile_ms_50_properties"],
                  "goal": 50.0, "met": gr["compile_ms_50_properties"] < 50.0})
    gd, g2 = res["grammar_decode"], res["grammar_248k"]
    if g2:
        T.append({"target": "compile a 50-property JSON Schema < 50 ms (%d-token vocab)" % g2["n_vocab"],
                  "value": g2["compile_ms_50_properties"], "goal": 50.0, "met": g2["compile_ms_50_properties"] < 50.0})
    if gd and gd["unconstrained"] and gd["constrained"]:
        # measured through the server: decode tok/s = 1 / mean inter-token
        # latency of each streamed request; the modes alternated in one run
        tok_s = lambda runs: sum(1e3 / r["itl_ms_mean"] for r in runs) / len(runs)
        gd["unconstrained_tok_s"], gd["constrained_tok_s"] = tok_s(gd["unconstrained"]), tok_s(gd["constrained"])
        gd["ratio"] = gd["constrained_tok_s"] / gd["unconstrained_tok_s"]
        T.append({"target": "measured constrained decode >= 90%% of unconstrained tok/s (%d-token vocab, served)"
                  % gd["vocab"], "value": gd["ratio"], "goal": 0.90, "met": gd["ratio"] >= 0.90})
    res["derived"] = der
    with open(out_json, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    with open(out_md, "w") as f:
        f.write(render(res))


def render(res):
    bw = {}
    if res.get("limits"):
        bw = {r["threads"]: r["gb_s"]["best"] for r in res["limits"]["triad"]}
    L = []
    w = L.append
    der = res["derived"]
    w("# hyserve benchmark (%s run)\n" % ("QUICK" if res.get("quick") else "full"))
    w("%s, commit %s%s. %s\n" % (res.get("date", "?"), res.get("git", "?"),
                                 " (dirty)" if res.get("git_dirty") else "", res.get("note", "")))
    lim = res.get("limits")
    if lim:
        mch = lim["machine"]
        w("Machine: %s, %d CPUs, L3 %.0f MiB, AVX2 %s, FMA %s, F16C %s; OpenBLAS core %s%s; hyserve kernels %s.\n" % (
            mch["cpu"], mch["n_procs"], mch["l3_bytes"] / 2**20, yn(mch["avx2"]), yn(mch["fma"]), yn(mch["f16c"]),
            mch["openblas_core"],
            " (OPENBLAS_CORETYPE=%s)" % res["env"]["OPENBLAS_CORETYPE"] if res.get("env", {}).get("OPENBLAS_CORETYPE") else "",
            mch.get("kernels", "?")))
        w("Load average before / after: %s / %s (a busy machine makes every figure noisy).\n" % (
            res.get("env", {}).get("loadavg_start", "?"), res.get("env", {}).get("loadavg_end", "?")))
        w("## Limits (measured in this run; best of the repetitions)\n")
        w("| limit | 1 thread | 2 threads |")
        w("|---|---|---|")
        tr, gv, gm = by_threads(lim["triad"]), by_threads(lim["sgemv"]), by_threads(lim["sgemm"])
        w("| triad bandwidth, %d MiB arrays | %.1f GB/s | %.1f GB/s |" % (
            lim["triad"][0]["array_bytes"] / 2**20, tr[1]["gb_s"]["best"], tr[2]["gb_s"]["best"]))
        if lim.get("update"):
            up = by_threads(lim["update"])
            w("| in-place update (read and written back), %d MiB | %.1f GB/s | %.1f GB/s |" % (
                lim["update"][0]["array_bytes"] / 2**20, up[1]["gb_s"]["best"], up[2]["gb_s"]["best"]))
        w("| sgemv, 256 MiB matrix | %.1f GB/s | %.1f GB/s |" % (gv[1]["gb_s"]["best"], gv[2]["gb_s"]["best"]))
        w("| sgemm, model projection shapes at 512 tokens | %.0f GFLOP/s | %.0f GFLOP/s |" % (
            gm[1]["mix_gflop_s"]["best"], gm[2]["mix_gflop_s"]["best"]))
        w("| sgemm, square 2048 | %.0f GFLOP/s | %.0f GFLOP/s |\n" % (
            gm[1]["square2048_gflop_s"]["best"], gm[2]["square2048_gflop_s"]["best"]))
    if der["decode"]:
        w("## Decode (tokens/s, median; fraction = bytes moved per token x rate / triad bandwidth measured next to the model: "
          "the higher of the triads before and after the model's decode figures)\n")
        w("| weights | threads | context | tok/s | spread | GB/s moved | measured against | limit GB/s (before / after) | of limit |")
        w("|---|---|---|---|---|---|---|---|---|")
        for r in der["decode"]:
            w("| %s | %d | %d | %.1f | %.0f%% | %.1f | %s | %s (%s / %s) | %s |" % (
                r["dtype"], r["threads"], r["ctx"], r["tok_s"], r["spread_pct"], r["gb_s"], r["limit"],
                fmt(r["limit_gb_s"]), fmt(r.get("limit_before_gb_s")), fmt(r.get("limit_after_gb_s")),
                pct(r["fraction"])))
        w("")
    if der["prefill"]:
        w("## Prefill (tokens/s, median; fraction = model FLOP/s / sgemm FLOP/s measured next to the model)\n")
        w("| weights | threads | prompt | tok/s | spread | GFLOP/s | measured against | limit GFLOP/s | of limit |")
        w("|---|---|---|---|---|---|---|---|---|")
        for r in der["prefill"]:
            w("| %s | %d | %d | %.1f | %.0f%% | %.1f | %s | %s | %s |" % (
                r["dtype"], r["threads"], r["tokens"], r["tok_s"], r["spread_pct"], r["gflop_s"], r["limit"],
                fmt(r["limit_gflop_s"], 0), pct(r["fraction"])))
        w("")
    if der["context"]:
        w("## Decode cost of context (ms per token)\n")
        w("A short sequence and the 8K one decode in alternating segments of 32 tokens, so \"at 0\" and "
          "\"at 8K\" are taken under the same conditions; the last two columns are the separate 0 and 8K "
          "sections above, minutes apart.\n")
        w("The prediction prices the extra KV bytes at the triad bandwidth; the next columns price them at "
          "the rate a plain read (a sum, no other arithmetic) of the same pages reaches, measured in the same "
          "alternation (\"KV read\").\n")
        w("| weights | threads | at 0 | at 8K | predicted from extra KV bytes | measured / predicted "
          "| triad GB/s | KV read GB/s | predicted at KV read | measured / that "
          "| at 8K, pages one at a time | sections: at 0 | sections: at 8K |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in der["context"]:
            w("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.1f | %s | %s | %s | %s | %.2f | %.2f |" % (
                r["dtype"], r["threads"], r["ms_ctx0"], r["ms_ctx8k"], r["ms_predicted"],
                r["measured_over_predicted"], r["triad_gb_s"], fmt(r.get("kv_read_gb_s"), 1),
                fmt(r.get("ms_predicted_kv_read"), 2), fmt(r.get("measured_over_predicted_kv_read"), 2),
                fmt(r.get("ms_ctx8k_one_page"), 2), r["ms_ctx0_section"], r["ms_ctx8k_section"]))
        w("")
    if der["batched"]:
        w("## Batched decode (aggregate tokens/s, 2 threads)\n")
        w("Ceilings on \"x one\" that no kernel can pass: *bytes* if every step ran at the same bandwidth "
          "(weights once per step, each sequence's DeltaNet state read and written, its conv window read and one row of it written); "
          "*fp32* if the products ran at the run's 2-thread sgemm rate with one sequence at its measured "
          "speed (Q8_0, BF16 and F16 on AMX multiply in int8 and bf16, Q8_0 on AVX512-VNNI in int8, and are not "
          "bound by it; shown as -); *fp32 + state* adds to those products each sequence's DeltaNet state, read and "
          "written back at the rate of an in-place update stream (limits: update; a layer's state update waits for its projections, and the next layer's "
          "projections for the update). *products*: what the decode step multiplies in (panels: BF16/F16/Q8_0 weights "
          "repacked into 16-row panels, engine/kernels/panels.h).\n")
        w("\"x one sequence\" divides the medians of the two groups (the target's figure); \"x one, per turn\" "
          "is the median, and range, of the same ratio taken turn by turn from segments seconds apart, so the "
          "machine's drift between turns cancels.\n")
        w("| weights | products | sequences | tok/s | spread | x one sequence | x one, per turn (range) | bytes ceiling | "
          "fp32 ceiling | fp32 + state ceiling |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for r in der["batched"]:
            p = r.get("vs_one_paired")
            paired = "%.2f (%.2f-%.2f)" % (p["median"], p["min"], p["max"]) if p else "-"
            w("| %s | %s | %d | %.1f | %.0f%% | %s | %s | %s | %s | %s |" % (
                r["dtype"], r.get("products", "-"), r["seqs"], r["tok_s"], r["spread_pct"], fmt(r["vs_one"], 2),
                paired, fmt(r.get("bytes_ceiling"), 1), fmt(r.get("fp32_ceiling"), 1),
                fmt(r.get("fp32_state_ceiling"), 1)))
        w("")
    wm = [(m["dtype"], m["weights_memory"]) for m in res["models"] if m.get("weights_memory")]
    if wm:
        w("## Weights in 2 MiB pages or mapped from the file (2 threads)\n")
        w("The engine serves the weights from the file mapping (4 KiB pages; F32 weights from its own copy "
          "advised for 2 MiB pages, so their ratio is near 1); `--huge-pages` reads them into "
          "2 MiB transparent huge pages. A second engine on the same file does that; decode steps alternate "
          "between the two, turn by turn. Ratio: the huge-page engine's rate over the mapped one's, per turn, "
          "median (range). \"loaded as\" is what the second engine got (mapped when the kernel has THP off).\n")
        w("| weights | sequences | loaded as | mapped tok/s | huge pages tok/s | ratio, per turn (range) |")
        w("|---|---|---|---|---|---|")
        for dt, d in wm:
            for g in d["groups"]:
                p = g["ratio_paired"]
                hu = g.get("huge_tok_s") or g.get("default_tok_s")
                w("| %s | %d | %s | %.1f | %.1f | %.3f (%.3f-%.3f) |" % (
                    dt, g["seqs"], d.get("other", d["default"]), g["mapped_tok_s"]["median"], hu["median"],
                    p["median"], p["min"], p["max"]))
        w("")
    kn = res.get("kernels")
    if kn:
        w("## Kernels: matmul() alone\n")
        w("Decode matrix-vector product over one %.0f MiB weight (streams from DRAM), GB/s of weights:\n" % (
            kn["matvec"][0]["bytes"] / 2**20))
        w("| weights | 1 thread | 2 threads | 2 threads, of triad |")
        w("|---|---|---|---|")
        mv = {}
        for r in kn["matvec"]:
            mv.setdefault(r["type"], {})[r["threads"]] = r["gb_s"]["median"]
        for t, d in mv.items():
            w("| %s | %.1f | %.1f | %s |" % (t, d.get(1, 0), d.get(2, 0), pct(d.get(2, 0) / bw[2]) if bw.get(2) else "-"))
        w("\nSmall batches on a 3584 x 1024 weight, 2 threads, GFLOP/s (the decode-step kernel: rows x tokens, panels, or Q8_0's int8 ones; vs dequantized tiles + sgemm):\n")
        w("| weights | tokens | decode-step kernel | sgemm |")
        w("|---|---|---|---|")
        sb = {}
        for r in kn["small_batch"]:
            sb.setdefault((r["type"], r["tokens"]), {})[r["path"]] = r["gflop_s"]["median"]
        for (t, n), d in sb.items():
            w("| %s | %d | %s | %s |" % (t, n, fmt(d.get("rows_x_tokens"), 1), fmt(d.get("sgemm"), 1)))
        w("")
    dn = res.get("dnet")
    if dn:
        w("## DeltaNet at %d tokens, %d heads of %dx%d (kernels only, tokens/s)\n" % (
            dn["tokens"], dn["heads"], dn["d_k"], dn["d_v"]))
        w("| threads | recurrent (scalar reference) | recurrent (AVX2 step) | chunked | chunked / reference | chunked / AVX2 step |")
        w("|---|---|---|---|---|---|")
        for r in dn["runs"]:
            av = r.get("recurrent_avx2_tok_s")
            w("| %d | %.0f | %s | %.0f | %.2fx | %s |" % (
                r["threads"], r["recurrent_ref_tok_s"]["median"], fmt(av["median"], 0) if av else "-",
                r["chunked_tok_s"]["median"], r["speedup_vs_ref"],
                "%.2fx" % r["speedup_vs_avx2"] if "speedup_vs_avx2" in r else "-"))
        w("")
    dm = res.get("dnet_model")
    if dm:
        w("Whole-model prefill of %d tokens (f32, 2 threads): chunked form %.1f tok/s, recurrent form "
          "(the AVX2 step where the CPU has it) %.1f tok/s. `auto` (what hyserve runs) takes the recurrent "
          "step on AVX2 CPUs, the chunked form elsewhere.\n" % (
            dm["tokens"], dm["chunked"]["median"], dm["recurrent"]["median"]))
    srv = res.get("server")
    if srv:
        w("## Server (%s, %d threads, /generate_stream over HTTP)\n" % (srv.get("dtype", "?"), srv.get("threads", 0)))
        if srv.get("error"):
            w("Not measured: %s\n" % srv["error"])
        else:
            w("| clients | TTFT p50 ms | ITL p50 ms | ITL p99 ms | aggregate tok/s | tokens |")
            w("|---|---|---|---|---|---|")
            for r in srv["runs"]:
                w("| %d | %.1f | %.2f | %.2f | %.1f | %d |" % (r["clients"], r["ttft_ms_p50"], r["itl_ms_p50"],
                                                           r["itl_ms_p99"], r["tok_s"], r["tokens"]))
            if srv.get("engine_decode_ms_1_client") and srv.get("overhead_fraction") is not None:
                earlier = ""
                if srv.get("engine_ms_per_token"):
                    earlier = " (against the engine section's decode, measured minutes earlier: %.3f ms, %s)" % (
                        srv["engine_ms_per_token"], spct(srv.get("overhead_fraction_engine_section")))
                w("\nSingle stream: %.3f ms per token over HTTP vs %.3f ms inside the server's engine calls "
                  "in the same run: overhead %s%s.\n" % (
                      srv["http_ms_per_token"], srv["engine_decode_ms_1_client"], spct(srv["overhead_fraction"]),
                      earlier))
            elif srv.get("overhead_fraction") is not None:
                w("\nSingle stream: %.3f ms per token over HTTP vs %.3f ms in the engine alone: overhead %s.\n" % (
                    srv["http_ms_per_token"], srv["engine_ms_per_token"], pct(srv["overhead_fraction"])))
    gr = res.get("grammar")
    if gr:
        w("## Structured output (%d-token Qwen3 vocabulary, nested JSON Schema)\n" % gr["n_vocab"])
        w("| figure | value |")
        w("|---|---|")
        w("| vocabulary trie (once per server) | %d nodes, %.0f ms |" % (gr["trie_nodes"], gr["vocab_build_ms"]))
        w("| compile: 50-property schema / nested schema | %.2f ms / %.2f ms |" % (
            gr["compile_ms_50_properties"], gr["compile_ms_nested"]))
        w("| sampler alone, temperature 1 (ms/token) | %.3f |" % gr["sampler_ms_per_token"])
        w("| mask + sampler + advance (ms/token) | %.3f |" % gr["constrained_ms_per_token"])
        w("| grammar's extra (ms/token, %d tokens over %d cold-cache requests) | %.3f |" % (
            gr["tokens"], gr["requests"], gr["grammar_ms_per_token"]))
        w("| mask p50 / p99 / max (ms; the max is a first walk of the whole trie) | %.3f / %.3f / %.1f |" % (
            gr["mask_ms_p50"], gr["mask_ms_p99"], gr["mask_ms_max"]))
        sh = gr.get("shared")
        if sh:
            w("| through the grammar cache: grammar's extra after the first request (ms/token) | %.3f |" % (
                sh["grammar_ms_per_token_after_first"]))
            w("| through the grammar cache: mask p50 / p99 / max (ms) over %d requests | %.3f / %.3f / %.1f |" % (
                sh["requests"], sh["mask_ms_p50"], sh["mask_ms_p99"], sh["mask_ms_max"]))
            w("| through the grammar cache: trie walks by requests 2.. / by all; cache bytes | %d / %d; %d |" % (
                sh["walks_after_first"], sh["walks"], sh["cache_bytes"]))
        if gr.get("constrained_fraction"):
            w("| constrained vs unconstrained decode (%s 2T engine step %.1f ms + the grammar's extra) | %s |" % (
                gr["decode_dtype"], gr["decode_ms_per_token"], pct(gr["constrained_fraction"])))
        w("\nThe logits are seeded random numbers (the grammar's cost does not depend on the model); the ratio "
          "adds the grammar's measured time to the engine's measured decode step. llama-server was not at hand.\n")
    gd, g2 = res.get("grammar_decode"), res.get("grammar_248k")
    if gd and gd.get("ratio"):
        w("## Structured output measured at a %d-token vocabulary (%s, %d threads, served)\n" % (
            gd["vocab"], gd["dtype"], gd["threads"]))
        w("| round | unconstrained tok/s (tokens) | nested schema tok/s (tokens) |")
        w("|---|---|---|")
        for i, (a, b) in enumerate(zip(gd["unconstrained"], gd["constrained"])):
            w("| %d | %.2f (%d) | %.2f (%d) |" % (i + 1, 1e3 / a["itl_ms_mean"], a["tokens"], 1e3 / b["itl_ms_mean"],
                                                 b["tokens"]))
        cf = gd.get("constrained_first")
        if cf:
            w("| first (cold grammar cache) | | %.2f (%d) |" % (1e3 / cf["itl_ms_mean"], cf["tokens"]))
        w("\nConstrained / unconstrained: **%s** (goal 90%%); load average %s. Qwen3's vocabulary grown to "
          "248320 with BPE-made tokens (bench/README.md).%s\n" % (
              pct(gd["ratio"]), gd["loadavg"], " 50-property schema compiled in %.2f ms at that vocabulary."
              % g2["compile_ms_50_properties"] if g2 else ""))
        if g2 and g2.get("shared"):
            w("\nAt that vocabulary the grammar bench's mask p50 / p99 / max: %.3f / %.3f / %.1f ms with a cold "
              "cache per request, %.3f / %.3f / %.1f ms through the grammar cache (requests 2.. walked %d of its "
              "%d states); the grammar's extra per token %.3f ms cold, %.3f ms shared (sampler alone %.3f ms).\n" % (
                  g2["mask_ms_p50"], g2["mask_ms_p99"], g2["mask_ms_max"], g2["shared"]["mask_ms_p50"],
                  g2["shared"]["mask_ms_p99"], g2["shared"]["mask_ms_max"], g2["shared"]["walks_after_first"],
                  g2["shared"]["walks"], g2["grammar_ms_per_token"], g2["shared"]["grammar_ms_per_token_after_first"],
                  g2["sampler_ms_per_token"]))
    if der["targets"]:
        w("## Targets\n")
        w("| target | value | goal | met |")
        w("|---|---|---|---|")
        for t in der["targets"]:
            v = t["value"]
            vs = pct(v) if t["goal"] < 1.0 or "bandwidth" in t["target"] or "sgemm" in t["target"] else "%.2f" % v
            gs = pct(t["goal"]) if t["goal"] < 1.0 else "%.2f" % t["goal"]
            w("| %s | %s | %s | %s |" % (t["target"], vs, gs, "yes" if t["met"] else "**no**"))
        w("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main(sys.argv)

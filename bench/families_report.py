#!/usr/bin/env python3
"""bench/families_report.py OUT.json OUT.md META_JSON PART.json...: the hybrid families' table.

Each part is one `hyserve-bench family` run (bench/families.sh adds name, scaled_from, synth,
loadavg). Decode's fraction is the bytes a token moves (bench.c family_decode_bytes: the
weights with only the chosen experts, the KV or latent of the context, the recurrent state read
and written, the conv windows read) times tokens/s over the higher of the triads measured just
before and just after the model. The MoE ratio is the 512-token prompt with the rows routed to
an expert in one product over the same prompt with one-row products per row and expert
(engine_params.moe_per_row), the two alternated in one process.
"""
import json
import sys


def best_triad(part, key):
    rows = part.get(key, {}).get("triad", [])
    return max((r["gb_s"]["best"] for r in rows), default=None)


def derive(p):
    lim = [x for x in (best_triad(p, "limits"), best_triad(p, "limits_after")) if x]
    limit = max(lim) if lim else None
    dec = p["decode"]
    gbs = dec["gb_s"]["median"]
    pre = p["prefill"]
    row = {"name": p["name"], "dtype": p["dtype"], "arch": p["arch"], "layout": p["layout"],
           "scaled_from": p["scaled_from"], "synth": p["synth"], "n_params": p["n_params"],
           "weight_bytes": p["weight_bytes"], "bytes_per_token": dec["bytes_per_token"],
           "prompt_tok_s": pre["tok_s"]["median"], "prompt_spread_pct": pre["tok_s"]["spread_pct"],
           "decode_tok_s": dec["tok_s"]["median"], "decode_spread_pct": dec["tok_s"]["spread_pct"],
           "decode_gb_s": gbs, "limit_gb_s": limit, "limits_gb_s": lim,
           "of_limit": gbs / limit if limit else None, "loadavg": p.get("loadavg")}
    if "tok_s_per_row_experts" in pre:
        per_row = pre["tok_s_per_row_experts"]["median"]
        row.update(moe_per_row_tok_s=per_row, moe_grouping_ratio=row["prompt_tok_s"] / per_row if per_row else None,
                   moe_per_row_max_abs_logit_diff=pre.get("per_row_max_abs_logit_diff"),
                   moe_max_abs_logit=pre.get("max_abs_logit"), experts="%d of %d" % (p["n_expert_used"], p["n_expert"]))
    return row


def render(meta, rows):
    L = ["# hyserve: the hybrid families (%s run)\n" % ("QUICK" if meta.get("quick") else "full"),
         "%s, commit %s%s, %d s. %s\n" % (meta.get("date", "?"), meta.get("git", "?"),
                                           " (dirty)" if meta.get("git_dirty") else "", meta.get("seconds", 0),
                                           meta.get("note", "")),
         "BLAS: %s. Load average before / after: %s / %s (2 CPUs; a busy machine makes every figure noisy).\n" % (
             meta.get("blas", "?"), meta.get("loadavg_start", "?"), meta.get("loadavg_end", "?")),
         "One synthesized model per architecture, embd 1024, vocab 4096, tied; the layer mix, head, state and "
         "expert shapes of the model it is scaled from (second table). 2 threads. Prompt: 512 tokens in one "
         "step, tokens/s median. Decode: after a 64-token prompt, tokens/s median of 16-token segments; "
         "fraction = bytes moved per token x tokens/s / the higher triad of the two measured next to the model "
         "(bytes: the weights, of the routed experts only the chosen ones, the context's KV or latent, the "
         "recurrent state read and written, the conv windows read). MoE: the prompt with the rows of each "
         "expert in one product over one-row products per row and expert, alternated in one process.\n",
         "| model | weights | params | MB moved per token | prompt tok/s | decode tok/s | GB/s moved | "
         "triad limit GB/s | of limit | MoE grouped / per-row |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        moe = "—"
        if r.get("moe_grouping_ratio"):
            moe = "%.2fx (%.0f / %.0f tok/s, %s experts)" % (r["moe_grouping_ratio"], r["prompt_tok_s"],
                                                            r["moe_per_row_tok_s"], r["experts"])
        L.append("| %s | %s | %.0f M | %.1f | %.0f (±%.0f%%) | %.1f (±%.0f%%) | %.1f | %s | %s | %s |" % (
            r["name"], r["dtype"], r["n_params"] / 1e6, r["bytes_per_token"] / 1e6, r["prompt_tok_s"],
            r["prompt_spread_pct"], r["decode_tok_s"], r["decode_spread_pct"], r["decode_gb_s"],
            "%.1f" % r["limit_gb_s"] if r["limit_gb_s"] else "?",
            "%.0f%%" % (100 * r["of_limit"]) if r["of_limit"] else "?", moe))
    L += ["", "| model | layout | scaled from | hyserve synth |", "|---|---|---|---|"]
    seen = set()
    for r in rows:
        if r["name"] in seen:
            continue
        seen.add(r["name"])
        L.append("| %s | %s | %s | `%s` |" % (r["name"], r["layout"], r["scaled_from"],
                                             r["synth"].rsplit(" --dtype", 1)[0]))
    diffs = [r for r in rows if r.get("moe_per_row_max_abs_logit_diff") is not None]
    if diffs:
        L.append("\nThe two MoE forms' last-token logits, max |difference| / max |logit|: " + ", ".join(
            "%s %s %.1e" % (r["name"], r["dtype"], r["moe_per_row_max_abs_logit_diff"] / max(r["moe_max_abs_logit"], 1e-30))
            for r in diffs) + " (quantized weights: one-row products quantize the activations as decode does).")
    return "\n".join(L) + "\n"


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    meta = json.loads(argv[3])
    rows = []
    for path in argv[4:]:
        try:
            with open(path) as f:
                rows.append(derive(json.load(f)))
        except (OSError, ValueError, KeyError) as e:
            print("families_report: skipping %s (%s)" % (path, e), file=sys.stderr)
    res = dict(meta, rows=rows)
    with open(argv[1], "w") as f:
        json.dump(res, f, indent=1)
    with open(argv[2], "w") as f:
        f.write(render(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

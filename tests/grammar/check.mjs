// check.mjs - independent evidence for hyserve's structured output.
//   node check.mjs labels             ajv's verdict on every corpus document of schemas.json
//                                     agrees with its label (valid / invalid); the C test
//                                     test_grammar_matcher_agrees_with_ajv_on_the_corpus
//                                     checks the matcher against the same labels
//   node check.mjs sample URL SEEDS   samples every schema at temperature 1 with SEEDS seeds
//                                     through /v1/completions response_format json_schema and
//                                     validates each output with ajv
// Prints one JSON line last: {"checked": N, "failures": [...]}.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import addFormats from "ajv-formats";

const here = dirname(fileURLToPath(import.meta.url));
const corpus = JSON.parse(readFileSync(join(here, "schemas.json"), "utf8"));
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

function verdict(validate, text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return { ok: false, why: "not JSON: " + e.message };
  }
  const ok = validate(doc);
  return { ok, why: ok ? "" : ajv.errorsText(validate.errors) };
}

async function labels() {
  const failures = [];
  let checked = 0;
  for (const c of corpus) {
    const validate = ajv.compile(c.schema);
    for (const [docs, want] of [[c.valid, true], [c.invalid, false]]) {
      for (const d of docs) {
        checked++;
        const v = verdict(validate, d);
        if (v.ok !== want) failures.push({ schema: c.name, doc: d, want, why: v.why });
      }
    }
  }
  return { checked, failures };
}

async function sample(url, seeds) {
  const failures = [];
  let checked = 0, tokens = 0, schemas = 0;
  for (const c of corpus) {
    if (c.sample === false) continue;
    schemas++;
    const validate = ajv.compile(c.schema);
    for (let seed = 1; seed <= seeds; seed++) {
      const body = {
        prompt: "Answer in JSON: " + c.name,
        max_tokens: 600,
        temperature: 1,
        seed,
        response_format: { type: "json_schema", json_schema: { name: c.name.replace(/[^a-zA-Z0-9_-]/g, "_"), strict: true, schema: c.schema } },
      };
      const r = await fetch(url + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      const j = await r.json();
      checked++;
      if (r.status !== 200) {
        failures.push({ schema: c.name, seed, status: r.status, error: j.error });
        continue;
      }
      const ch = j.choices[0];
      tokens += j.usage.completion_tokens;
      const v = verdict(validate, ch.text);
      if (!v.ok || ch.finish_reason !== "stop") failures.push({ schema: c.name, seed, text: ch.text, finish: ch.finish_reason, why: v.why });
    }
  }
  return { checked, tokens, schemas, failures };
}

const [mode, url, seeds] = process.argv.slice(2);
const out = mode === "labels" ? await labels() : await sample(url, Number(seeds || 5));
console.log(JSON.stringify(out));
process.exit(out.failures.length ? 1 : 0);

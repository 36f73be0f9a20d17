// chat_template.mjs URL TOKENIZER_CONFIG.json - hyserve's POST /apply-template
// against @huggingface/jinja rendering the real Qwen3 chat template (the one
// the converted Qwen3 tokenizer carries), byte for byte, for conversations
// with system prompts, tools, tool calls, tool results, several turns and
// thinking off (chat_template_kwargs.enable_thinking false).
// Prints one JSON line: {"checked": N, "failures": [...]}.
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const [url, cfgPath] = process.argv.slice(2);
const tmpl = new Template(JSON.parse(readFileSync(cfgPath, "utf8")).chat_template);
const weather = { type: "function", function: { name: "get_weather", description: "Weather in a city, \"now\"",
  parameters: { type: "object", properties: { city: { type: "string", description: "e.g. Zürich" },
    unit: { type: "string", enum: ["c", "f"] }, days: { type: "integer", minimum: 1 } }, required: ["city"] } } };
const clock = { type: "function", function: { name: "now", parameters: { type: "object", properties: {} } } };
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: JSON.stringify(args) } });
const cases = {
  "plain": { messages: [{ role: "user", content: "Hi" }] },
  "system and turns": { messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" },
    { role: "assistant", content: "Hello." }, { role: "user", content: "Again <|im_end|>" }] },
  "tools": { messages: [{ role: "user", content: "Weather in Paris?" }], tools: [weather, clock] },
  "tools and system": { messages: [{ role: "system", content: "You help." }, { role: "user", content: "Time?" }], tools: [clock, weather] },
  "a tool call and its result": { tools: [weather], messages: [{ role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: "", tool_calls: [call("c1", "get_weather", { city: "Paris", unit: "c" })] },
    { role: "tool", tool_call_id: "c1", content: "{\"temp\": 21}" }] },
  "parallel calls, text before them, two results": { tools: [weather, clock], messages: [
    { role: "system", content: "S" }, { role: "user", content: "Paris and time" },
    { role: "assistant", content: "Let me check.", tool_calls: [call("a", "get_weather", { city: "Paris" }), call("b", "now", {})] },
    { role: "tool", tool_call_id: "a", content: "sunny" }, { role: "tool", tool_call_id: "b", content: "12:00" },
    { role: "assistant", content: "Sunny at noon." }, { role: "user", content: "Thanks" }] },
  "thinking off": { messages: [{ role: "user", content: "Hi" }], kwargs: { enable_thinking: false } },
  "thinking off with tools": { messages: [{ role: "system", content: "S" }, { role: "user", content: "Hi" }],
    tools: [clock], kwargs: { enable_thinking: false } },
};
const failures = [];
let checked = 0;
for (const [name, c] of Object.entries(cases)) {
  const want = tmpl.render({ messages: c.messages, tools: c.tools, add_generation_prompt: true, ...(c.kwargs || {}) });
  const r = await fetch(url + "/apply-template", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: c.messages, tools: c.tools, chat_template_kwargs: c.kwargs }) });
  const j = await r.json();
  checked++;
  if (r.status !== 200 || j.prompt !== want) failures.push({ name, status: r.status, got: j.prompt ?? j, want });
}
console.log(JSON.stringify({ checked, failures }));
process.exit(failures.length ? 1 : 0);

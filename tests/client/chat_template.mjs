// chat_template.mjs URL TOKENIZER_CONFIG.json [qwen3|llama31] - hyserve's
// POST /apply-template against @huggingface/jinja rendering the real chat
// template in the config, byte for byte, for conversations with system
// prompts, tools, tool calls, tool results and several turns: Qwen3's (the
// one the converted Qwen3 tokenizer carries; also thinking off,
// chat_template_kwargs.enable_thinking false) or Llama 3.1's (see
// tools/llama31-tokenizer-gguf.sh; also its tools in the system turn,
// chat_template_kwargs.tools_in_user_message false).
// Llama 3.1: the template writes bos_token first, which hyserve adds as a
// token (add_bos), so the rendering must start with it and the rest is
// compared; it renders a call's arguments with tojson, so it gets them as
// the object that the OpenAI form's JSON text holds (vLLM and llama-server
// parse them before rendering too). Its tools go through tojson(indent=4),
// where @huggingface/jinja 0.5.1 writes an empty {} or [] over two or three
// lines and Python's json.dumps (transformers) as {} and []: the tools here
// have none (suite_http.py checks hyserve's {} against json.dumps).
// Prints one JSON line: {"checked": N, "failures": [...]}.
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const [url, cfgPath, family = "qwen3"] = process.argv.slice(2);
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
const search = { type: "function", function: { name: "search", description: "Search the web",
  parameters: { type: "object", properties: { query: { type: "string" }, top: { type: "integer", maximum: 10 } },
    required: ["query"], additionalProperties: false } } };
const llamaCases = {
  "plain": { messages: [{ role: "user", content: "Hi" }] },
  "system and turns, trimmed": { messages: [{ role: "system", content: " Be brief.\n" }, { role: "user", content: "Hi " },
    { role: "assistant", content: "Hello." }, { role: "user", content: "\tAgain <|eot_id|>" }] },
  "tools": { messages: [{ role: "user", content: "Weather in Paris?" }], tools: [weather, search] },
  "tools and system": { messages: [{ role: "system", content: "You help." }, { role: "user", content: " Find cats " }],
    tools: [search, weather] },
  "a tool call and its result": { tools: [weather], messages: [{ role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: "", tool_calls: [call("c1", "get_weather", { city: "Paris \"15e\"", unit: "c" })] },
    { role: "tool", tool_call_id: "c1", content: "{\"temp\": 21, \"sky\": \"clear\\nwarm\"}" }] },
  "two steps and more turns": { tools: [weather, search], messages: [
    { role: "system", content: "S" }, { role: "user", content: "Paris, then search" },
    { role: "assistant", content: null, tool_calls: [call("a", "get_weather", { city: "Paris", days: 3 })] },
    { role: "tool", tool_call_id: "a", content: "sunny" }, { role: "assistant", content: "Sunny." },
    { role: "user", content: "Now search cats" },
    { role: "assistant", content: "", tool_calls: [call("b", "search", { query: "cats", top: 2 })] },
    { role: "tool", tool_call_id: "b", content: "[1, 2]" }, { role: "assistant", content: "Two." },
    { role: "user", content: "Thanks" }] },
  "tools in the system turn (tools_in_user_message false)": { messages: [{ role: "system", content: " You help. " },
    { role: "user", content: "Find cats" }], tools: [search, weather], kwargs: { tools_in_user_message: false } },
  "tools in the system turn, no system message, a call and its result": { tools: [weather],
    kwargs: { tools_in_user_message: false }, messages: [{ role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: "", tool_calls: [call("c1", "get_weather", { city: "Paris" })] },
      { role: "tool", tool_call_id: "c1", content: "rain" }] },
  "tools in the system turn and no user message": { messages: [{ role: "system", content: "S" }], tools: [search],
    kwargs: { tools_in_user_message: false } },
  "a tool result without tools": { messages: [{ role: "user", content: "x" },
    { role: "assistant", content: "", tool_calls: [call("z", "now", {})] }, { role: "tool", tool_call_id: "z", content: "12:00" }] },
};
// what the template gets: arguments as objects (see above)
const parsedArgs = (messages) => messages.map((m) => m.tool_calls ? { ...m, tool_calls: m.tool_calls.map((c) =>
  ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } })) } : m);
const llama = family === "llama31";
const BOS = "<|begin_of_text|>";
const failures = [];
let checked = 0;
for (const [name, c] of Object.entries(llama ? llamaCases : cases)) {
  let want = tmpl.render({ messages: llama ? parsedArgs(c.messages) : c.messages, tools: c.tools,
    add_generation_prompt: true, bos_token: BOS, ...(c.kwargs || {}) });
  if (llama) {
    if (!want.startsWith(BOS)) failures.push({ name, why: "the rendering does not start with bos_token" });
    want = want.slice(BOS.length);
  }
  const r = await fetch(url + "/apply-template", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: c.messages, tools: c.tools, chat_template_kwargs: c.kwargs }) });
  const j = await r.json();
  checked++;
  if (r.status !== 200 || j.prompt !== want) failures.push({ name, status: r.status, got: j.prompt ?? j, want });
}
console.log(JSON.stringify({ checked, failures }));
process.exit(failures.length ? 1 : 0);

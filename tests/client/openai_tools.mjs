// openai_tools.mjs URL - tool calling through the official openai client:
// tool_choice required, a named function and auto, not streamed; a
// two-step conversation that sends the call and its result back; streamed
// required and named calls, accumulated from delta.tool_calls.
// Prints one JSON line with what the client parsed.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "none", maxRetries: 0 });
const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["c", "f"] } },
      required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "now", parameters: { type: "object", properties: {}, additionalProperties: false } } },
];
const user = { role: "user", content: "What is the weather in Paris?" };
const pick = (r) => ({ finish: r.choices[0].finish_reason, content: r.choices[0].message.content,
  calls: (r.choices[0].message.tool_calls || []).map((c) => ({ id: c.id, type: c.type, name: c.function.name,
    args: JSON.parse(c.function.arguments) })) });
const out = {};
const base = { model: "hyserve", messages: [user], tools, max_tokens: 200, temperature: 1 };
const req = await client.chat.completions.create({ ...base, seed: 1, tool_choice: "required" });
out.required = pick(req);
out.named = pick(await client.chat.completions.create({ ...base, seed: 2, parallel_tool_calls: false,
  tool_choice: { type: "function", function: { name: "get_weather" } } }));
out.auto = pick(await client.chat.completions.create({ ...base, seed: 3, max_tokens: 16, tool_choice: "auto" }));
const msg = req.choices[0].message;
const results = msg.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: "{\"temp\": 21}" }));
out.second = pick(await client.chat.completions.create({ ...base, seed: 4, max_tokens: 8,
  messages: [user, msg, ...results] }));
async function streamed(extra) {
  const calls = [];
  let content = "", finish = null;
  for await (const chunk of await client.chat.completions.create({ ...base, ...extra, stream: true })) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const t of ch.delta.tool_calls || []) {
      calls[t.index] ??= { id: "", name: "", args: "" };
      if (t.id) calls[t.index].id = t.id;
      if (t.function?.name) calls[t.index].name += t.function.name;
      if (t.function?.arguments) calls[t.index].args += t.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { finish, content, calls: calls.map((c) => ({ ...c, args: JSON.parse(c.args) })) };
}
out.stream_required = await streamed({ seed: 1, tool_choice: "required" });
out.stream_named = await streamed({ seed: 5, tool_choice: { type: "function", function: { name: "get_weather" } } });
console.log(JSON.stringify(out));

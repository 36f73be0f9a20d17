// anthropic_messages.mjs URL KEY - the Messages API through the official
// @anthropic-ai/sdk client (which sends its key as x-api-key): text with a
// system prompt, stop_sequences, messages.stream (events and the final
// message), tool_use with tool_choice any and a named tool, the tool_result
// round trip, countTokens, and an error status. Prints one JSON line.
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.argv[2], apiKey: process.argv[3], maxRetries: 0 });
const out = {};
const base = { model: "hyserve", max_tokens: 12, temperature: 0 };
const user = { role: "user", content: "Say hi" };
const ask0 = { role: "user", content: [{ type: "text", text: "Count" }, { type: "text", text: "to three" }] };
const pick = (m) => ({ id: m.id, type: m.type, role: m.role, stop_reason: m.stop_reason, stop_sequence: m.stop_sequence,
  blocks: m.content.map((b) => b.type), text: m.content.filter((b) => b.type === "text").map((b) => b.text).join(""),
  tools: m.content.filter((b) => b.type === "tool_use").map((b) => ({ id: b.id, name: b.name, input: b.input })),
  usage: m.usage });
out.text = pick(await client.messages.create({ ...base, system: "Be brief.", messages: [user] }));
out.nostop = pick(await client.messages.create({ ...base, messages: [ask0] }));
out.stop = pick(await client.messages.create({ ...base, messages: [ask0], stop_sequences: ["\n\n", "zzz"] }));

const stream = client.messages.stream({ ...base, system: "Be brief.", messages: [user] });
const events = [];
let deltas = "";
stream.on("text", (t) => { deltas += t; });
stream.on("streamEvent", (ev) => events.push(ev.type));
const fin = await stream.finalMessage();
out.stream = { events, deltas, final: pick(fin) };

const tools = [{ name: "get_weather", description: "Weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"],
    additionalProperties: false } }];
const ask = { role: "user", content: "Weather in Paris?" };
const call = await client.messages.create({ ...base, max_tokens: 200, temperature: 1, messages: [ask], tools,
  tool_choice: { type: "any" } });
out.tools = pick(call);
const named = client.messages.stream({ ...base, max_tokens: 200, temperature: 1, messages: [ask], tools,
  tool_choice: { type: "tool", name: "get_weather" } });
let json = "";
named.on("inputJson", (partial) => { json += partial; });
out.tool_stream = { ...pick(await named.finalMessage()), json };
const results = call.content.filter((b) => b.type === "tool_use").map((b) => ({ type: "tool_result", tool_use_id: b.id,
  content: "{\"temp\": 21}" }));
const round = [ask, { role: "assistant", content: call.content }, { role: "user", content: results }];
out.second = pick(await client.messages.create({ ...base, messages: round, tools }));
out.count = (await client.messages.countTokens({ model: "hyserve", messages: round, tools })).input_tokens;
try {
  await client.messages.create({ ...base, max_tokens: 10000, messages: [user] });
  out.error = "no error";
} catch (e) {
  out.error = { name: e.constructor.name, status: e.status, type: e.error?.error?.type ?? e.error?.type };
}
console.log(JSON.stringify(out));

// openai_responses.mjs URL - the Responses API through the official openai
// client: text, its stream helper (events and the final response), a JSON
// schema (text.format), tool calls as function_call items, the call's result
// sent back (as items and through previous_response_id), and an unknown
// previous_response_id. Prints one JSON line with what the client parsed.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "none", maxRetries: 0 });
const out = {};
const base = { model: "hyserve", max_output_tokens: 12, temperature: 0 };
const text = await client.responses.create({ ...base, input: "Say hi", instructions: "Be brief." });
out.text = { id: text.id, status: text.status, object: text.object, output_text: text.output_text,
  types: text.output.map((o) => o.type), usage: text.usage };

const stream = client.responses.stream({ ...base, input: "Say hi", instructions: "Be brief." });
const events = [];
let deltas = "";
for await (const ev of stream) {
  events.push({ type: ev.type, seq: ev.sequence_number });
  if (ev.type === "response.output_text.delta") deltas += ev.delta;
}
const fin = await stream.finalResponse();
out.stream = { events, deltas, final_text: fin.output_text, final_status: fin.status };

const schema = { type: "object", properties: { name: { type: "string", maxLength: 8 }, n: { type: "integer" } },
  required: ["name", "n"], additionalProperties: false };
const js = await client.responses.create({ ...base, max_output_tokens: 80, input: "A JSON person",
  text: { format: { type: "json_schema", name: "person", schema, strict: true } } });
out.schema = { status: js.status, text: js.output_text };

const tools = [{ type: "function", name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"],
    additionalProperties: false } }];
const call = await client.responses.create({ ...base, max_output_tokens: 200, temperature: 1, input: "Weather in Paris?",
  tools, tool_choice: "required" });
const calls = call.output.filter((o) => o.type === "function_call");
out.tools = { status: call.status, calls: calls.map((c) => ({ name: c.name, call_id: c.call_id, args: JSON.parse(c.arguments) })) };

const results = calls.map((c) => ({ type: "function_call_output", call_id: c.call_id, output: "{\"temp\": 21}" }));
const second = await client.responses.create({ ...base, previous_response_id: call.id, input: results, tools });
out.second = { status: second.status, types: second.output.map((o) => o.type), usage: second.usage,
  previous_response_id: second.previous_response_id };
const explicit = await client.responses.create({ ...base, tools,
  input: [{ role: "user", content: "Weather in Paris?" }, ...calls.map((c) => ({ type: "function_call",
    call_id: c.call_id, name: c.name, arguments: c.arguments })), ...results] });
out.explicit = { status: explicit.status, output_text: explicit.output_text, usage: explicit.usage };

const toolStream = client.responses.stream({ ...base, max_output_tokens: 200, temperature: 1, input: "Weather in Paris?",
  tools, tool_choice: { type: "function", name: "get_weather" } });
let argDeltas = "";
for await (const ev of toolStream) if (ev.type === "response.function_call_arguments.delta") argDeltas += ev.delta;
const tf = await toolStream.finalResponse();
out.tool_stream = { argDeltas, calls: tf.output.filter((o) => o.type === "function_call").map((c) => ({ name: c.name,
  arguments: c.arguments })) };

try {
  await client.responses.create({ ...base, previous_response_id: "resp_nope", input: "x" });
  out.unknown = "no error";
} catch (e) {
  out.unknown = { name: e.constructor.name, status: e.status, param: e.param ?? e.error?.param };
}
console.log(JSON.stringify(out));

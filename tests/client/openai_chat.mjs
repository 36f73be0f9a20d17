// openai_chat.mjs - drive hyserve with the official `openai` npm package.
//
// usage: node openai_chat.mjs BASE_URL
// Prints one JSON object on stdout with what the client saw; the Python
// suite (tests/suite_http.py) checks it against its own requests.
import OpenAI from 'openai';

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30000 });
const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Say hello.' },
];
const out = {};

// streaming chat completion with usage in the last chunk
const stream = await client.chat.completions.create({
  model: 'hyserve',
  messages,
  max_tokens: 12,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});
let text = '';
let finish = null;
let role = null;
let chunks = 0;
let usage = null;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta?.role) role = c.delta.role;
    if (c.delta?.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
out.stream = { text, finish, role, chunks, usage };

// the same request without streaming
const r = await client.chat.completions.create({ model: 'hyserve', messages, max_tokens: 12, temperature: 0 });
out.nonstream = { text: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };

// legacy completions, streamed
const cs = await client.completions.create({ model: 'hyserve', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true });
let ctext = '';
for await (const chunk of cs) ctext += chunk.choices[0]?.text ?? '';
out.completion_stream = { text: ctext };

// completions with a prompt array: one choice per prompt
const multi = await client.completions.create({
  model: 'hyserve', prompt: ['Once upon a time', 'The city'], max_tokens: 5, temperature: 0,
});
out.prompt_array = { choices: multi.choices.map((c) => ({ index: c.index, text: c.text })), usage: multi.usage };

// n: 3 sampled choices of one chat request (each as the same request with
// the seed the server derives for it, checked by the suite)
const nc = await client.chat.completions.create({
  model: 'hyserve', messages, max_tokens: 6, temperature: 0.9, seed: 7, n: 3,
});
out.n3 = { choices: nc.choices.map((c) => ({ index: c.index, text: c.message.content })), usage: nc.usage };

// chat with logprobs, whole and streamed: the client's types carry them through
const lp = await client.chat.completions.create({
  model: 'hyserve', messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2,
});
out.logprobs = { content: lp.choices[0].logprobs?.content ?? null, text: lp.choices[0].message.content };
const lps = await client.chat.completions.create({
  model: 'hyserve', messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2, stream: true,
});
const scontent = [];
for await (const chunk of lps)
  for (const c of chunk.choices) if (c.logprobs?.content) scontent.push(...c.logprobs.content);
out.logprobs_stream = { content: scontent };

// an invalid request surfaces as the client's typed error with our status
try {
  await client.chat.completions.create({ model: 'hyserve', messages, max_tokens: 4, temperature: 7 });
  out.error = { status: null };
} catch (e) {
  out.error = { status: e.status ?? null, type: e.type ?? e.error?.type ?? null, message: e.message };
}

console.log(JSON.stringify(out));

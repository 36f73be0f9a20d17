// hf_clients.mjs - drive hyserve with the official `@huggingface/inference`
// package, 2.x (npm alias hf2) and 4.x (hf4), as an Inference Endpoint.
//
// usage: node hf_clients.mjs BASE_URL
// Prints one JSON object on stdout with what each client saw; the Python
// suite (tests/suite_http.py) checks it against its own requests.
import { HfInferenceEndpoint } from 'hf2';
import { InferenceClient } from 'hf4';

const base = process.argv[2];
const messages = [{ role: 'user', content: 'Say hello.' }];
const out = {};

async function attempt(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: String(e && e.message ? e.message : e), status: e?.httpResponse?.status ?? null };
  }
}

// 2.x: textGeneration posts TGI's request to the endpoint (POST /), chatCompletion
// posts to /v1/chat/completions and requires system_fingerprint in the answer
const hf2 = new HfInferenceEndpoint(base);
await attempt('hf2_text', async () => {
  const r = await hf2.textGeneration({
    model: 'hyserve', // 2.x asks huggingface.co for a default model when none is given
    inputs: 'Once upon a time',
    parameters: { max_new_tokens: 6, details: true, top_n_tokens: 2 },
  });
  return { text: r.generated_text, details: r.details ?? null };
});
await attempt('hf2_chat', async () => {
  const r = await hf2.chatCompletion({ model: 'hyserve', messages, max_tokens: 8, temperature: 0 });
  return { text: r.choices[0].message.content, fingerprint: r.system_fingerprint, usage: r.usage };
});
await attempt('hf2_stream', async () => {
  let text = '';
  let last = null;
  const args = { model: 'hyserve', inputs: 'Once upon a time', parameters: { max_new_tokens: 6 } };
  for await (const ev of hf2.textGenerationStream(args)) {
    text += ev.token.text;
    last = ev;
  }
  return { text, generated_text: last?.generated_text ?? null };
});

// 4.x: with an endpoint URL, textGeneration posts to /v1/completions (the
// parameters flattened into the body, the URL as "model") and keeps only the
// text; chatCompletion posts to /v1/chat/completions
const hf4 = new InferenceClient(undefined, { endpointUrl: base });
await attempt('hf4_text', async () => {
  const r = await hf4.textGeneration({
    inputs: 'Once upon a time',
    parameters: { max_new_tokens: 6, details: true, top_n_tokens: 2, temperature: 0 },
  });
  return { text: r.generated_text };
});
await attempt('hf4_chat', async () => {
  const r = await hf4.chatCompletion({ messages, max_tokens: 8, temperature: 0 });
  return { text: r.choices[0].message.content, fingerprint: r.system_fingerprint, model: r.model };
});
await attempt('hf4_chat_stream', async () => {
  let text = '';
  for await (const ch of hf4.chatCompletionStream({ messages, max_tokens: 8, temperature: 0 }))
    text += ch.choices[0]?.delta?.content ?? '';
  return { text };
});

console.log(JSON.stringify(out));

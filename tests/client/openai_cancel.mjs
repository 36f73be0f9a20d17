// openai_cancel.mjs - a request cancelled by DELETE /requests/{id} is not
// retried by the official `openai` npm package.
//
// usage: node openai_cancel.mjs BASE_URL REQUEST_ID
// Starts a long non-streamed completion under REQUEST_ID with the client's
// default retry policy (maxRetries 2), cancels it by its id once the server
// knows it, and prints one JSON object: what the client finally saw and the
// DELETE's status. The Python suite counts the server's log lines for that id.
import OpenAI from 'openai';

const [base, id] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 2, timeout: 120000 });
const out = { deleteStatus: null };

const pending = client.completions
  .create({ model: 'hyserve', prompt: 'Cancel me', max_tokens: 2000, temperature: 0 },
          { headers: { 'X-Request-Id': id } })
  .then((r) => ({ status: 200, finish: r.choices[0].finish_reason }),
        (e) => ({ status: e.status ?? null, type: e.error?.type ?? e.type ?? null,
                  code: e.error?.code ?? e.code ?? null, message: e.message }));

// the id is unknown (404) until the request reaches the scheduler
const deadline = Date.now() + 20000;
while (Date.now() < deadline) {
  const r = await fetch(`${base}/requests/${id}`, { method: 'DELETE' });
  if (r.status !== 404) {
    out.deleteStatus = r.status;
    break;
  }
  await new Promise((res) => setTimeout(res, 20));
}
out.result = await pending;
console.log(JSON.stringify(out));

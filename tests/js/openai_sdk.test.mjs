// The official OpenAI Node SDK against the real `strata serve` binary:
// streaming and non-streaming chat and completions, logprobs checked against
// the transformers goldens of the qwen3 fixture, and overload surfacing as
// APIError 503 with Retry-After. Run by ctest (openai_sdk_e2e) with
// STRATA_BINARY and STRATA_SOURCE_DIR set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer as startStrata, stopServer } from './strata_server.mjs';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const SRC = process.env.STRATA_SOURCE_DIR;
const FIXTURE = `${SRC}/tests/fixtures/models/qwen3`;
const golden = JSON.parse(readFileSync(`${FIXTURE}/golden.json`, 'utf8'));

// Starts `strata serve` on an ephemeral port; resolves when it logs the port.
const startServer = (extraArgs) => startStrata(['--model-path', FIXTURE, ...extraArgs]);

let server, client;
before(async () => {
  server = await startServer(['--served-model-name', 'qwen3-tiny']);
  client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  const code = await stopServer(server);
  assert.equal(code, 0, 'SIGTERM drains and exits 0');
});

test('models lists the served name', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['qwen3-tiny']);
});

test('completion with token-id prompt matches transformers, with logprobs', async () => {
  const c = golden.cases[4];  // 64-token prompt
  const r = await client.completions.create({
    model: 'qwen3-tiny', prompt: c.prompt_ids, max_tokens: c.output_ids.length, temperature: 0,
    logprobs: 5, ignore_eos: true, return_tokens_as_token_ids: true,
  });
  const toks = r.choices[0].logprobs.tokens.map((t) => Number(t.replace('token_id:', '')));
  assert.deepEqual(toks, c.output_ids);
  r.choices[0].logprobs.token_logprobs.forEach((lp, i) =>
    assert.ok(Math.abs(lp - c.steps[i].logprob) < 1e-3, `step ${i}: ${lp} vs ${c.steps[i].logprob}`));
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
  assert.equal(r.usage.completion_tokens, c.output_ids.length);
});

test('streaming completion concatenates to the non-streaming text', async () => {
  const args = { model: 'qwen3-tiny', prompt: 'The quick brown fox', max_tokens: 12, temperature: 0, ignore_eos: true };
  const whole = await client.completions.create(args);
  const stream = await client.completions.create({ ...args, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      text += chunk.choices[0].text;
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 12);
});

test('chat completion matches the transformers golden text', async () => {
  const c = golden.chat_cases[0];
  const r = await client.chat.completions.create({
    model: 'qwen3-tiny', messages: c.messages, max_tokens: c.output_ids.length, temperature: 0,
    ignore_eos: true, logprobs: true, top_logprobs: 3,
  });
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, c.output_text);
  assert.equal(r.choices[0].logprobs.content.length, c.output_ids.length);
  assert.equal(r.choices[0].logprobs.content[0].top_logprobs.length, 3);
  assert.ok(Math.abs(r.choices[0].logprobs.content[0].logprob - c.steps[0].logprob) < 1e-3);
  assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
});

test('streaming chat', async () => {
  const c = golden.chat_cases[0];
  const stream = await client.chat.completions.create({
    model: 'qwen3-tiny', messages: c.messages, max_tokens: c.output_ids.length, temperature: 0, ignore_eos: true,
    stream: true,
  });
  let text = '', role = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    if (d?.role) role = d.role;
    if (d?.content) text += d.content;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, c.output_text);
});

test('invalid field is a 400 naming the param', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'qwen3-tiny', messages: [{ role: 'user', content: 'hi' }], temperature: 7 }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && e.param === 'temperature');
});

test('overload surfaces as APIError 503 with Retry-After', async () => {
  const small = await startServer(['--max-running-requests', '1', '--max-queued-requests', '1']);
  try {
    const c2 = new OpenAI({ baseURL: `http://127.0.0.1:${small.port}/v1`, apiKey: 'x', maxRetries: 0 });
    const calls = Array.from({ length: 12 }, () =>
      c2.completions.create({ model: 'qwen3', prompt: 'hello', max_tokens: 200, ignore_eos: true }));
    const results = await Promise.allSettled(calls);
    const rejected = results.filter((r) => r.status === 'rejected');
    const ok = results.filter((r) => r.status === 'fulfilled');
    assert.ok(rejected.length > 0, 'some requests are shed');
    assert.ok(ok.length >= 1, 'admitted requests complete');
    for (const r of rejected) {
      assert.ok(r.reason instanceof OpenAI.APIError, String(r.reason));
      assert.equal(r.reason.status, 503);
      assert.equal(r.reason.error?.type ?? r.reason.type, 'overloaded');
      assert.ok(Number(r.reason.headers.get('retry-after')) >= 1);
    }
    for (const r of ok) assert.equal(r.value.usage.completion_tokens, 200);
  } finally {
    assert.equal(await stopServer(small), 0);
  }
});

// Tools through --tool-call-parser: the tiny model writes gibberish, never a
// call, so this checks that the SDK accepts a tools request and its answer,
// streamed (through its stream helper, which accumulates tool-call deltas)
// and not; the parsers themselves are tested on canned text in C++.
test('tools request with --tool-call-parser hermes, streamed and not', async () => {
  const s = await startServer(['--served-model-name', 'qwen3-tiny', '--tool-call-parser', 'hermes',
                               '--reasoning-parser', 'qwen3']);
  try {
    const c = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'x', maxRetries: 0 });
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const req = { model: 'qwen3-tiny', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools,
                  tool_choice: 'auto', max_tokens: 16, temperature: 0 };
    const r = await c.chat.completions.create(req);
    const m = r.choices[0].message;
    assert.ok(typeof m.content === 'string' || (m.content === null && m.tool_calls?.length > 0));
    for (const call of m.tool_calls ?? []) {
      assert.equal(call.type, 'function');
      assert.equal(typeof JSON.parse(call.function.arguments), 'object');
    }
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));

    const stream = c.chat.completions.stream({ ...req, stream: true });
    const final = await stream.finalChatCompletion();
    assert.equal(final.choices[0].message.content ?? '', m.content ?? '');
    assert.equal((final.choices[0].message.tool_calls ?? []).length, (m.tool_calls ?? []).length);
    assert.equal(final.choices[0].finish_reason, r.choices[0].finish_reason);

    // tool_choice required: constrained decoding forces a call whose
    // arguments match the tool's schema (the random model never writes one).
    const forced = await c.chat.completions.create({ ...req, tool_choice: 'required', max_tokens: 200 });
    const calls = forced.choices[0].message.tool_calls;
    assert.ok(calls?.length >= 1, JSON.stringify(forced.choices[0]));
    for (const call of calls) assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
    assert.equal(forced.choices[0].finish_reason, 'tool_calls');
  } finally {
    assert.equal(await stopServer(s), 0);
  }
});

// The chunks StreamEncoder writes for a tool call (held to these exact bytes
// by ChatStream.ToolCallDeltasAreOpenAiShaped in openai_response_test.cc),
// replayed to the SDK's stream helper: it must assemble the call. The tiny
// model never writes a call, so this is where the streamed shape meets the
// real client.
test('the SDK assembles a streamed tool call from our chunk shape', async () => {
  const { createServer } = await import('node:http');
  const head = '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",';
  const events = [
    head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
    head + '"choices":[{"index":0,"delta":{"content":"Checking."},"logprobs":null,"finish_reason":null}]}',
    head + '"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",' +
           '"function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null}]}',
    head + '"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":' +
           '"{\\"a\\":1}"}}]},"logprobs":null,"finish_reason":null}]}',
    head + '"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"tool_calls",' +
           '"stop_reason":null}]}',
  ];
  const http = createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    for (const e of events) res.write(`data: ${e}\n\n`);
    res.end('data: [DONE]\n\n');
  });
  await new Promise((r) => http.listen(0, '127.0.0.1', r));
  try {
    const c = new OpenAI({ baseURL: `http://127.0.0.1:${http.address().port}/v1`, apiKey: 'x', maxRetries: 0 });
    const stream = c.chat.completions.stream({ model: 'm', messages: [{ role: 'user', content: 'hi' }],
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] });
    const final = await stream.finalChatCompletion();
    const m = final.choices[0].message;
    assert.equal(m.content, 'Checking.');
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].id, 'call_1');
    assert.equal(m.tool_calls[0].type, 'function');
    assert.equal(m.tool_calls[0].function.name, 'f');
    assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { a: 1 });
  } finally {
    http.close();
  }
});

// Prompt logprobs are computed in the prefill: the prompt + the golden's
// greedy continuation scores that continuation as transformers did when it
// generated it (teacher forcing), through vLLM's prompt_logprobs field and
// through echo + logprobs with max_tokens 0 (lm-eval-harness's scoring call).
test('prompt_logprobs and echo logprobs score a prompt as transformers does', async () => {
  const c = golden.cases[4];
  const prompt = [...c.prompt_ids, ...c.output_ids];
  const r = await client.completions.create({
    model: 'qwen3-tiny', prompt, max_tokens: 1, temperature: 0, prompt_logprobs: 2,
  });
  const plp = r.choices[0].prompt_logprobs;
  assert.equal(plp.length, prompt.length);
  assert.equal(plp[0], null);
  c.output_ids.forEach((id, k) => {
    const entry = plp[c.prompt_ids.length + k][String(id)];
    assert.ok(Math.abs(entry.logprob - c.steps[k].logprob) < 1e-3, `token ${k}: ${entry.logprob} vs ${c.steps[k].logprob}`);
    assert.ok(entry.rank >= 1);
  });
  for (let i = 1; i < prompt.length; i++) {
    assert.ok(String(prompt[i]) in plp[i], `entry ${i} holds the prompt's own token`);
    assert.ok(Object.keys(plp[i]).length <= 3, 'its token and the top 2');
  }

  const echo = await client.completions.create({
    model: 'qwen3-tiny', prompt, max_tokens: 0, echo: true, logprobs: 1, return_tokens_as_token_ids: true,
  });
  const ch = echo.choices[0];
  assert.equal(ch.finish_reason, 'length');
  assert.equal(echo.usage.completion_tokens, 0);
  assert.deepEqual(ch.logprobs.tokens, prompt.map((id) => `token_id:${id}`));
  assert.equal(ch.logprobs.token_logprobs[0], null);
  c.output_ids.forEach((id, k) =>
    assert.ok(Math.abs(ch.logprobs.token_logprobs[c.prompt_ids.length + k] - c.steps[k].logprob) < 1e-3));

  // echo with max_tokens 0 answers the prompt alone (it used to append the
  // one token the engine samples), streamed or not.
  const args = { model: 'qwen3-tiny', prompt: 'The quick brown fox', max_tokens: 0, echo: true };
  const alone = await client.completions.create(args);
  assert.equal(alone.choices[0].text, 'The quick brown fox');
  assert.equal(alone.choices[0].finish_reason, 'length');
  assert.equal(alone.usage.completion_tokens, 0);
  let streamed = '';
  for await (const chunk of await client.completions.create({ ...args, stream: true }))
    streamed += chunk.choices[0]?.text ?? '';
  assert.equal(streamed, 'The quick brown fox');

  // suffix (fill-in-the-middle) is refused, naming it.
  await assert.rejects(client.completions.create({ model: 'qwen3-tiny', prompt: 'def f(', suffix: 'x' }),
                       (e) => e instanceof OpenAI.APIError && e.status === 400 && e.param === 'suffix');
});

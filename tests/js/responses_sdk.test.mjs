// The Responses API (/v1/responses) through real clients against the real
// `strata serve` binary: the OpenAI Node SDK's responses.create (streamed
// and not, tools, a function_call round trip), the Vercel AI SDK's default
// OpenAI provider (AI SDK 6 speaks the Responses API) with generateText,
// streamText and a tool, and LangChain's ChatOpenAI with useResponsesApi.
// The tiny random model writes gibberish and never a tool call, so what is
// checked is that each client's requests are accepted and its parser takes
// every answer, and that greedy answers agree across clients and endpoints.
// Run by ctest (responses_sdk_e2e) with STRATA_BINARY and STRATA_SOURCE_DIR set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, tool } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';

const BIN = process.env.STRATA_BINARY;
const SRC = process.env.STRATA_SOURCE_DIR;
const FIXTURE = `${SRC}/tests/fixtures/models/qwen3`;
const MODEL = 'qwen3-tiny';

function startServer(extraArgs) {
  return new Promise((resolve, reject) => {
    const proc = spawn(BIN, ['serve', '--model-path', FIXTURE, '--port', '0', '--threads', '1', ...extraArgs],
                       { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`server did not start: ${log}`)), 30000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/serving '[^']*' on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc, port: Number(m[1]), log: () => log }); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}: ${log}`)); });
  });
}

function stopServer(s) {
  return new Promise((resolve) => {
    s.proc.removeAllListeners('exit');
    s.proc.on('exit', (code) => resolve(code));
    s.proc.kill('SIGTERM');
  });
}

let server, client, baseURL;
before(async () => {
  server = await startServer(['--served-model-name', MODEL, '--tool-call-parser', 'hermes']);
  baseURL = `http://127.0.0.1:${server.port}/v1`;
  client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  const code = await stopServer(server);
  assert.equal(code, 0, 'SIGTERM drains and exits 0');
});

const weatherTool = {
  type: 'function', name: 'get_weather', description: 'Current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  strict: false,
};

test('responses.create: a response object the SDK reads, equal to chat at temperature 0', async () => {
  const r = await client.responses.create({
    model: MODEL, instructions: 'Answer briefly.', input: 'Say hello.',
    max_output_tokens: 10, temperature: 0,
  });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, MODEL);
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
  assert.equal(r.output[0].content[0].type, 'output_text');
  // output_text is the SDK's own join of the output_text parts.
  assert.equal(r.output_text, r.output[0].content[0].text);
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 10);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');

  const chat = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'system', content: 'Answer briefly.' }, { role: 'user', content: 'Say hello.' }],
    max_tokens: 10, temperature: 0,
  });
  assert.equal(r.output_text, chat.choices[0].message.content);
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
});

test('responses.create stream: the event sequence, deltas add up to the non-streamed text', async () => {
  const args = { model: MODEL, input: 'Count to five.', max_output_tokens: 12, temperature: 0, ignore_eos: true };
  const whole = await client.responses.create(args);
  const stream = await client.responses.create({ ...args, stream: true });
  const types = [];
  let text = '', seq = 0, final = null;
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq++, `sequence_number of ${ev.type}`);
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress',
                                       'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
                                     'response.output_item.done', 'response.incomplete']);
  assert.equal(text, whole.output_text);
  assert.equal(final.output[0].content[0].text, text);
  assert.equal(final.usage.output_tokens, 12);

  // The SDK's stream helper assembles the same response.
  const helper = client.responses.stream(args);
  const done = await helper.finalResponse();
  assert.equal(done.output_text, whole.output_text);
});

test('responses.create with tools and a function_call round trip', async () => {
  const first = await client.responses.create({
    model: MODEL, input: 'What is the weather in Paris?', tools: [weatherTool], max_output_tokens: 8, temperature: 0,
  });
  assert.deepEqual(first.tools.map((t) => t.name), ['get_weather']);
  for (const item of first.output) {
    assert.ok(['message', 'function_call'].includes(item.type), item.type);
    if (item.type === 'function_call') JSON.parse(item.arguments);
  }
  // The call and its output sent back as items, as an agent loop does:
  // the same prompt as the chat form of the conversation.
  const input = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { type: 'function_call', call_id: 'call_abc', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_abc', output: '{"temperature_c":18}' },
  ];
  const second = await client.responses.create({
    model: MODEL, input, tools: [weatherTool], max_output_tokens: 8, temperature: 0,
  });
  const chat = await client.chat.completions.create({
    model: MODEL, max_tokens: 8, temperature: 0,
    tools: [{ type: 'function', function: { name: weatherTool.name, description: weatherTool.description,
                                            parameters: weatherTool.parameters, strict: false } }],
    messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'call_abc', type: 'function',
                                                       function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_abc', content: '{"temperature_c":18}' },
    ],
  });
  assert.equal(second.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(second.output_text, chat.choices[0].message.content ?? '');
  assert.ok(second.usage.input_tokens > first.usage.input_tokens, 'the tool result is in the prompt');
});

test('unsupported Responses features are a 400 naming the field', async () => {
  for (const [extra, param] of [[{ previous_response_id: 'resp_123' }, 'previous_response_id'],
                                [{ tools: [{ type: 'web_search' }] }, 'tools[0].type'],
                                [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, 'input[0]']]) {
    await assert.rejects(
      client.responses.create({ model: MODEL, input: 'x', ...extra }),
      (e) => e instanceof OpenAI.APIError && e.status === 400 && e.param === param,
      `expected a 400 naming ${param}`);
  }
});

// The Vercel AI SDK's default OpenAI provider: provider(model) is the
// Responses API in AI SDK 6.
test('AI SDK default provider: generateText and streamText agree, a tool is accepted', async () => {
  const openai = createOpenAI({ baseURL, apiKey: 'unused' });
  const model = openai(MODEL);
  assert.equal(model.provider, 'openai.responses');
  const g = await generateText({ model, prompt: 'Say hello.', maxOutputTokens: 10, temperature: 0, maxRetries: 0 });
  const ours = await client.responses.create({ model: MODEL, input: 'Say hello.', max_output_tokens: 10, temperature: 0 });
  assert.equal(g.text, ours.output_text);
  assert.ok(['stop', 'length'].includes(g.finishReason), g.finishReason);
  assert.equal(g.usage.outputTokens, ours.usage.output_tokens);

  const s = streamText({ model, prompt: 'Say hello.', maxOutputTokens: 10, temperature: 0, maxRetries: 0 });
  let streamed = '';
  for await (const piece of s.textStream) streamed += piece;
  assert.equal(streamed, g.text);
  assert.equal((await s.usage).outputTokens, g.usage.outputTokens);

  const withTool = await generateText({
    model, prompt: 'What is the weather in Paris?', maxOutputTokens: 8, temperature: 0, maxRetries: 0,
    tools: { get_weather: tool({ description: 'Current weather', inputSchema: z.object({ city: z.string() }),
                                 execute: async ({ city }) => ({ city, temperature_c: 18 }) }) },
  });
  assert.ok(['stop', 'length', 'tool-calls'].includes(withTool.finishReason), withTool.finishReason);
  assert.equal(typeof withTool.text, 'string');
});

test('LangChain ChatOpenAI with useResponsesApi: invoke, stream, bindTools', async () => {
  const llm = new ChatOpenAI({
    model: MODEL, apiKey: 'unused', useResponsesApi: true, temperature: 0, maxTokens: 10, maxRetries: 0,
    configuration: { baseURL },
  });
  const ours = await client.responses.create({ model: MODEL, input: 'Say hello.', max_output_tokens: 10, temperature: 0 });
  const msg = await llm.invoke('Say hello.');
  assert.equal(msg.text, ours.output_text);
  assert.equal(msg.usage_metadata.output_tokens, ours.usage.output_tokens);
  assert.match(msg.response_metadata.id, /^resp_/, 'answered by /v1/responses');
  assert.equal(msg.response_metadata.object, 'response');

  let streamed = '';
  for await (const chunk of await llm.stream('Say hello.')) streamed += chunk.text;
  assert.equal(streamed, ours.output_text);

  const withTools = llm.bindTools([{ name: 'get_weather', description: 'Current weather',
                                     schema: z.object({ city: z.string() }) }]);
  const t = await withTools.invoke('What is the weather in Paris?');
  assert.ok(Array.isArray(t.tool_calls));
  for (const c of t.tool_calls) assert.equal(typeof c.args, 'object');
});

// A second turn whose assistant text came from an earlier response: the AI
// SDK refers to it by id (item_reference) unless store is false. This
// server stores nothing, so the reference is a 400 that says what to set,
// and with store: false the same conversation goes through.
test('AI SDK multi-turn: item_reference refused with the fix, store: false works', async () => {
  const openai = createOpenAI({ baseURL, apiKey: 'unused' });
  const model = openai(MODEL);
  const first = await generateText({ model, prompt: 'Say hello.', maxOutputTokens: 6, temperature: 0, maxRetries: 0 });
  const itemId = first.response.body.output[0].id;
  assert.match(itemId, /^msg_/);
  const messages = [
    { role: 'user', content: 'Say hello.' },
    { role: 'assistant', content: [{ type: 'text', text: first.text, providerOptions: { openai: { itemId } } }] },
    { role: 'user', content: 'Again.' },
  ];
  await assert.rejects(
    generateText({ model, messages, maxOutputTokens: 6, temperature: 0, maxRetries: 0 }),
    (e) => e.statusCode === 400 && /item_reference/.test(e.responseBody) && /store is false/.test(e.responseBody));
  const second = await generateText({
    model, messages, maxOutputTokens: 6, temperature: 0, maxRetries: 0,
    providerOptions: { openai: { store: false } },
  });
  assert.equal(typeof second.text, 'string');
  assert.ok(second.usage.inputTokens > first.usage.inputTokens, 'the earlier turn is in the prompt');
});

// The Responses API (/v1/responses) through real clients against the real
// `strata serve` binary: the OpenAI Node SDK's responses.create (streamed
// and not, tools, a function_call round trip, previous_response_id,
// retrieve, delete), the Vercel AI SDK's default OpenAI provider (AI SDK 6
// speaks the Responses API, store true by default) with generateText,
// streamText, a tool, multi-turn item_reference and its multi-step tool
// loop, LangChain's ChatOpenAI with useResponsesApi, and structured outputs
// (responses.parse with zod, generateObject on the default provider).
// The tiny random model writes gibberish and never a tool call, so what is
// checked is that each client's requests are accepted and its parser takes
// every answer, and that greedy answers agree across clients and endpoints.
// Run by ctest (responses_sdk_e2e) with STRATA_BINARY and STRATA_SOURCE_DIR set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer as startStrata, stopServer } from './strata_server.mjs';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, tool, stepCountIs, wrapLanguageModel } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';

const SRC = process.env.STRATA_SOURCE_DIR;
const FIXTURE = `${SRC}/tests/fixtures/models/qwen3`;
const MODEL = 'qwen3-tiny';

const startServer = (extraArgs) => startStrata(['--model-path', FIXTURE, ...extraArgs]);

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

test('unsupported Responses features and unknown ids are errors naming the field', async () => {
  for (const [extra, status, param, says] of [
    [{ previous_response_id: 'resp_123' }, 400, 'previous_response_id', /resp_123' not found.*another replica/],
    [{ tools: [{ type: 'web_search' }] }, 400, 'tools[0].type', /built-in/],
    [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, 404, 'input[0]', /msg_1' not found.*evicted/]]) {
    await assert.rejects(
      client.responses.create({ model: MODEL, input: 'x', ...extra }),
      (e) => e instanceof OpenAI.APIError && e.status === status && e.param === param && says.test(e.message),
      `expected a ${status} naming ${param}`);
  }
});

// The response store with the OpenAI SDK: a conversation continued by
// previous_response_id is the conversation sent whole; retrieve returns
// the stored object (streamed responses too); delete removes it.
test('OpenAI SDK: previous_response_id, retrieve, inputItems.list and delete', async () => {
  const sampling = { max_output_tokens: 6, temperature: 0 };
  const first = await client.responses.create({ model: MODEL, input: 'Weather in Paris?', ...sampling });
  assert.equal(first.store, true, 'store defaults to true');
  const next = await client.responses.create({ model: MODEL, previous_response_id: first.id, input: 'And Rome?', ...sampling });
  assert.equal(next.previous_response_id, first.id);
  const whole = await client.responses.create({
    model: MODEL, store: false, ...sampling,
    input: [{ role: 'user', content: 'Weather in Paris?' }, ...first.output, { role: 'user', content: 'And Rome?' }],
  });
  assert.equal(whole.store, false);
  assert.equal(next.usage.input_tokens, whole.usage.input_tokens);
  assert.equal(next.output_text, whole.output_text, 'greedy: the same prompt, the same text');
  // A chain: the third turn sees both earlier ones.
  const third = await client.responses.create({ model: MODEL, previous_response_id: next.id, input: 'And Oslo?', ...sampling });
  assert.ok(third.usage.input_tokens > next.usage.input_tokens + next.usage.output_tokens);

  // input_items: the conversation next's model saw, each item with an id.
  const asc = await client.responses.inputItems.list(next.id, { order: 'asc' });
  assert.deepEqual(asc.data.map((i) => i.type), ['message', 'message', 'message']);
  assert.equal(asc.data[1].id, first.output[0].id, 'the first turn\'s answer, by its id');
  for (const i of asc.data) assert.match(i.id, /^msg_/);
  const desc = await client.responses.inputItems.list(next.id, { limit: 1 });
  assert.equal(desc.data.length, 1);
  assert.equal(desc.data[0].id, asc.data[2].id, 'newest first by default');
  assert.equal(desc.has_more, true);
  const all = [];
  for await (const i of client.responses.inputItems.list(next.id, { limit: 1, order: 'asc' })) all.push(i.id);
  assert.deepEqual(all, asc.data.map((i) => i.id), 'the SDK pages through with after');

  const got = await client.responses.retrieve(first.id);
  assert.equal(got.id, first.id);
  assert.deepEqual(got.output, first.output);
  assert.equal(got.output_text, first.output_text);

  const stream = await client.responses.create({ model: MODEL, input: 'Say hello.', stream: true, ...sampling });
  let completed;
  for await (const ev of stream) if (ev.type === 'response.completed' || ev.type === 'response.incomplete') completed = ev.response;
  assert.ok(completed);
  const sgot = await client.responses.retrieve(completed.id);
  assert.deepEqual(sgot.output, completed.output);

  await client.responses.delete(first.id);
  await assert.rejects(client.responses.retrieve(first.id),
                       (e) => e instanceof OpenAI.NotFoundError && /evicted/.test(e.message));
  await assert.rejects(client.responses.delete(first.id), (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(client.responses.retrieve(whole.id), (e) => e instanceof OpenAI.NotFoundError,
                       'store: false keeps nothing');
  // The continuation needs only its own entry: deleting the first turn does
  // not break the chain.
  const fourth = await client.responses.create({ model: MODEL, previous_response_id: third.id, input: 'Thanks.', ...sampling });
  assert.ok(fourth.usage.input_tokens > third.usage.input_tokens);
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

// LangChain: a second turn by previous_response_id (a call option) equals
// the same turn with the history sent (an AIMessage replays its response's
// output items, ids and all).
test('LangChain ChatOpenAI with useResponsesApi: previous_response_id and history', async () => {
  const llm = new ChatOpenAI({
    model: MODEL, apiKey: 'unused', useResponsesApi: true, temperature: 0, maxTokens: 6, maxRetries: 0,
    configuration: { baseURL },
  });
  const first = await llm.invoke('Weather in Paris?');
  const byId = await llm.invoke('And Rome?', { previous_response_id: first.response_metadata.id });
  const byHistory = await llm.invoke([{ role: 'user', content: 'Weather in Paris?' }, first,
                                      { role: 'user', content: 'And Rome?' }]);
  assert.equal(byId.usage_metadata.input_tokens, byHistory.usage_metadata.input_tokens);
  assert.equal(byId.text, byHistory.text);
  assert.ok(byId.usage_metadata.input_tokens > first.usage_metadata.input_tokens);
});

// A second turn whose assistant text came from an earlier response: the AI
// SDK refers to it by id (item_reference), as its default store: true
// does, and the server resolves it from its store; with store: false the
// SDK sends the text itself. Both prompts are the same.
test('AI SDK multi-turn: item_reference resolved from the store, equal to store: false', async () => {
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
  const referenced = await generateText({ model, messages, maxOutputTokens: 6, temperature: 0, maxRetries: 0 });
  const inline = await generateText({
    model, messages, maxOutputTokens: 6, temperature: 0, maxRetries: 0,
    providerOptions: { openai: { store: false } },
  });
  assert.equal(referenced.usage.inputTokens, inline.usage.inputTokens);
  assert.equal(referenced.text, inline.text);
  assert.ok(referenced.usage.inputTokens > first.usage.inputTokens, 'the earlier turn is in the prompt');
});

// The AI SDK's own multi-step tool loop (generateText and streamText with
// stopWhen, default provider settings: store true). The random-weight model
// never calls a tool and tool_choice "required" needs constrained decoding,
// so a middleware adds one call to the first step's real answer (everything
// else is the SDK's: it runs the tool, then sends step 2 with the step-1
// text as an item_reference, the call inline and its output). Step 2 must be
// accepted and see the whole conversation: its prompt equals the same
// conversation sent with store: false.
function withOneCannedCall(model) {
  let calls = 0;
  const call = { type: 'tool-call', toolCallId: 'call_loop1', toolName: 'get_weather', input: '{"city":"Paris"}' };
  return wrapLanguageModel({
    model,
    middleware: {
      specificationVersion: 'v3',
      wrapGenerate: async ({ doGenerate }) => {
        const r = await doGenerate();
        if (calls++ > 0) return r;
        return { ...r, content: [...r.content, call], finishReason: { unified: 'tool-calls', raw: 'tool_calls' } };
      },
      wrapStream: async ({ doStream }) => {
        const r = await doStream();
        if (calls++ > 0) return r;
        const add = new TransformStream({
          transform(part, ctl) {
            if (part.type === 'finish') {
              ctl.enqueue(call);
              ctl.enqueue({ ...part, finishReason: { unified: 'tool-calls', raw: 'tool_calls' } });
            } else {
              ctl.enqueue(part);
            }
          },
        });
        return { ...r, stream: r.stream.pipeThrough(add) };
      },
    },
  });
}

test('AI SDK multi-step tool loop with default settings (store: true, item_reference)', async () => {
  const openai = createOpenAI({ baseURL, apiKey: 'unused' });
  const bodies = [];
  const seen = createOpenAI({
    baseURL, apiKey: 'unused',
    fetch: async (url, init) => { bodies.push(JSON.parse(init.body)); return fetch(url, init); },
  });
  let ran = 0;
  const tools = { get_weather: tool({ description: 'Current weather', inputSchema: z.object({ city: z.string() }),
                                      execute: async ({ city }) => { ran++; return { city, temperature_c: 18 }; } }) };
  const common = { prompt: 'What is the weather in Paris?', tools, stopWhen: stepCountIs(3), maxOutputTokens: 6,
                   temperature: 0, maxRetries: 0 };

  const g = await generateText({ model: withOneCannedCall(seen(MODEL)), ...common });
  assert.equal(ran, 1, 'the SDK ran the tool');
  assert.equal(g.steps.length, 2, 'a second step after the tool result');
  const step2 = bodies[1];
  assert.ok(step2.store === undefined || step2.store === true, 'the default: store true');
  const types = step2.input.map((i) => i.type ?? i.role);
  assert.deepEqual(types, ['user', 'item_reference', 'function_call', 'function_call_output'], JSON.stringify(step2.input));
  assert.equal(step2.input[1].id, g.steps[0].response.body.output[0].id, 'a reference to step 1\'s message');

  // The same second step, sent without references (store: false): same prompt.
  const inline = await generateText({ model: withOneCannedCall(openai(MODEL)), ...common,
                                      providerOptions: { openai: { store: false } } });
  assert.equal(inline.steps.length, 2);
  assert.equal(g.steps[1].usage.inputTokens, inline.steps[1].usage.inputTokens);
  assert.ok(g.steps[1].usage.inputTokens > g.steps[0].usage.inputTokens, 'the call and its result are in the prompt');

  // streamText: the same loop over the streaming endpoint.
  bodies.length = 0;
  const s = streamText({ model: withOneCannedCall(seen(MODEL)), ...common });
  for await (const _ of s.textStream) { /* drain */ }
  const steps = await s.steps;
  assert.equal(steps.length, 2);
  assert.equal(bodies[1].input[1].type, 'item_reference');
  assert.equal(steps[1].usage.inputTokens, g.steps[1].usage.inputTokens);
  assert.equal(ran, 3);
});

// Structured outputs through the Responses API: text.format json_schema is
// enforced by constrained decoding, so even the random model's answer parses
// and validates (OpenAI SDK responses.parse with a zod schema, and the AI
// SDK's default provider with generateObject-style output via zod).
test('responses.parse with a zod text.format: the answer validates', async () => {
  const { zodTextFormat } = await import('openai/helpers/zod');
  const Person = z.object({ name: z.string(), age: z.number().int(), tags: z.array(z.string()).max(3) });
  for (const temperature of [0, 1]) {
    const r = await client.responses.parse({
      model: MODEL, input: 'A person, please.', max_output_tokens: 120, temperature,
      text: { format: zodTextFormat(Person, 'person') },
    });
    assert.equal(r.status, 'completed', JSON.stringify(r));
    assert.ok(r.output_parsed, 'parsed output');
    Person.parse(r.output_parsed);
  }
  // Streamed: the deltas add up to JSON that validates too.
  const stream = await client.responses.create({
    model: MODEL, input: 'A person, please.', max_output_tokens: 120, stream: true,
    text: { format: zodTextFormat(Person, 'person') },
  });
  let text = '';
  for await (const ev of stream) if (ev.type === 'response.output_text.delta') text += ev.delta;
  Person.parse(JSON.parse(text));
});

test('AI SDK default provider: generateObject validates (Responses text.format)', async () => {
  const { generateObject } = await import('ai');
  const provider = createOpenAI({ baseURL, apiKey: 'unused' });
  const Item = z.object({ title: z.string(), done: z.boolean(), priority: z.enum(['low', 'high']) });
  const { object } = await generateObject({
    model: provider(MODEL), schema: Item, prompt: 'One to-do item.', maxOutputTokens: 100, maxRetries: 0,
  });
  Item.parse(object);
});

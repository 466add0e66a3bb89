// Structured outputs and forced tool calls through real clients against the
// real `strata serve` on the demo model (random weights: gibberish text),
// where every answer must still parse and validate: the OpenAI Node SDK's
// chat.completions.parse with a zod schema and with a JSON schema,
// LangChain's withStructuredOutput and bindTools with tool_choice, and the
// Vercel AI SDK's generateObject through the chat provider. Run by ctest
// (structured_outputs_sdk_e2e) with STRATA_BINARY set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer as startStrata, stopServer } from './strata_server.mjs';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { ChatOpenAI } from '@langchain/openai';
import { tool } from '@langchain/core/tools';
import { generateObject } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';


const startServer = (extraArgs) => startStrata(extraArgs, { timeoutMs: 60000 });

const MODEL = 'demo';
// What every client asks for: nested objects, enums, bounded arrays and
// numbers, an optional-or-null field.
const Person = z.object({
  name: z.string().max(16),
  age: z.number().int().min(0).max(120),
  role: z.enum(['admin', 'user', 'guest']),
  tags: z.array(z.string().max(8)).max(3),
  address: z.object({ city: z.string().max(16), zip: z.string().regex(/^[0-9]{5}$/) }),
  nickname: z.string().max(6).nullable(),
  active: z.boolean(),
});
const personSchema = z.toJSONSchema(Person);
const Weather = z.object({ city: z.string().max(20), unit: z.enum(['celsius', 'fahrenheit']) });

let server, baseURL, client;
before(async () => {
  server = await startServer(['--served-model-name', MODEL, '--tool-call-parser', 'hermes']);
  baseURL = `http://127.0.0.1:${server.port}/v1`;
  client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  assert.equal(await stopServer(server), 0, 'SIGTERM drains and exits 0');
});

const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];

test('OpenAI SDK parse() with a zod schema: greedy and sampled', async () => {
  for (const temperature of [0, 1]) {
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.parse({
        model: MODEL, messages, max_tokens: 400, temperature, seed,
        response_format: zodResponseFormat(Person, 'person'),
      });
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'stop', m.content);
      assert.ok(m.parsed, m.content);
      Person.parse(m.parsed);  // throws unless valid
    }
  }
});

test('OpenAI SDK parse() with a JSON schema, and streamed', async () => {
  const response_format = {
    type: 'json_schema',
    json_schema: { name: 'person', strict: true, schema: personSchema },
  };
  const r = await client.chat.completions.parse({ model: MODEL, messages, max_tokens: 400, temperature: 0.8, seed: 3, response_format });
  Person.parse(JSON.parse(r.choices[0].message.content));
  Person.parse(r.choices[0].message.parsed);
  const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 400, temperature: 0.8, seed: 4, response_format, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  Person.parse(JSON.parse(text));
});

test('OpenAI SDK: forced tool calls, streamed and not', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: z.toJSONSchema(Weather) } }];
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await client.chat.completions.create({ model: MODEL, messages, tools, tool_choice, max_tokens: 300, temperature: 1, seed: 9 });
    const calls = r.choices[0].message.tool_calls;
    assert.ok(calls && calls.length >= 1, JSON.stringify(r.choices[0]));
    for (const c of calls) {
      assert.equal(c.function.name, 'get_weather');
      Weather.parse(JSON.parse(c.function.arguments));
    }
    const stream = await client.chat.completions.create({ model: MODEL, messages, tools, tool_choice, max_tokens: 300, temperature: 1, seed: 9, stream: true });
    const args = {};
    for await (const chunk of stream) {
      for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) args[tc.index] = (args[tc.index] ?? '') + (tc.function?.arguments ?? '');
    }
    assert.equal(Object.keys(args).length, calls.length);
    for (const a of Object.values(args)) Weather.parse(JSON.parse(a));
  }
});

function langchainModel(extra = {}) {
  return new ChatOpenAI({ model: MODEL, apiKey: 'unused', configuration: { baseURL }, maxRetries: 0, maxTokens: 400, temperature: 0.7, ...extra });
}

test('LangChain withStructuredOutput (default method and jsonSchema)', async () => {
  for (const method of [undefined, 'jsonSchema', 'functionCalling']) {
    const structured = langchainModel().withStructuredOutput(Person, method ? { method } : undefined);
    const out = await structured.invoke('Describe a person.');
    Person.parse(out);
  }
});

test('LangChain bindTools with tool_choice', async () => {
  const getWeather = tool(async () => 'sunny', { name: 'get_weather', description: 'Weather in a city', schema: Weather });
  for (const tool_choice of ['required', 'get_weather']) {
    const msg = await langchainModel().bindTools([getWeather], { tool_choice }).invoke('Weather in Paris?');
    assert.ok(msg.tool_calls.length >= 1, JSON.stringify(msg));
    for (const c of msg.tool_calls) {
      assert.equal(c.name, 'get_weather');
      Weather.parse(c.args);
    }
  }
});

test('Vercel AI SDK generateObject through the chat provider', async () => {
  const provider = createOpenAI({ baseURL, apiKey: 'unused' });
  for (const temperature of [0, 1]) {
    const { object } = await generateObject({ model: provider.chat(MODEL), schema: Person, prompt: 'Describe a person.', maxOutputTokens: 400, temperature, seed: 5, maxRetries: 0 });
    Person.parse(object);
  }
});

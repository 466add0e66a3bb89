// The official OpenAI Node SDK through `strata router` in front of two real
// `strata serve` workers: every answer equals the one the SDK gets from a
// worker directly (greedy, streaming and not, chat and completions), and the
// router's own overload (--max-concurrent-requests) surfaces as APIError 503
// with Retry-After. Run by ctest (router_sdk_e2e) with STRATA_BINARY and
// STRATA_SOURCE_DIR set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const BIN = process.env.STRATA_BINARY;
const SRC = process.env.STRATA_SOURCE_DIR;
const FIXTURE = `${SRC}/tests/fixtures/models/qwen3`;
const golden = JSON.parse(readFileSync(`${FIXTURE}/golden.json`, 'utf8'));

// Starts `strata <args>` and resolves with its port once it logs `pattern`.
function start(args, pattern) {
  return new Promise((resolve, reject) => {
    const proc = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`did not start: ${log}`)), 30000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(pattern);
      if (m) { clearTimeout(timer); resolve({ proc, port: Number(m[1]), log: () => log }); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`exited ${code}: ${log}`)); });
  });
}
const startServer = () => start(['serve', '--model-path', FIXTURE, '--port', '0', '--threads', '1',
                                 '--served-model-name', 'qwen3-tiny'], /on http:\/\/127\.0\.0\.1:(\d+)/);
const startRouter = (args) => start(['router', '--port', '0', ...args], /routing on http:\/\/127\.0\.0\.1:(\d+)/);

function stop(p) {
  return new Promise((resolve) => {
    p.proc.removeAllListeners('exit');
    p.proc.on('exit', (code) => resolve(code));
    p.proc.kill('SIGTERM');
  });
}

const sdk = (port) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
// STRATA_ROUTER_PD=1 (ctest router_pd_sdk_e2e): the router fronts a
// prefill/decode pair instead, and the direct answers come from a colocated
// server: PD through the router must answer exactly as one server does.
const PD = process.env.STRATA_ROUTER_PD === '1';
const startRole = (mode) => start(['serve', '--model-path', FIXTURE, '--port', '0', '--threads', '1',
                                   '--served-model-name', 'qwen3-tiny', '--disaggregation-mode', mode,
                                   '--disaggregation-bootstrap-port', '0'].filter((a, i, all) =>
                                     mode === 'prefill' || (a !== '--disaggregation-bootstrap-port' &&
                                                            all[i - 1] !== '--disaggregation-bootstrap-port')),
                                  /on http:\/\/127\.0\.0\.1:(\d+)/);
let workers, router, direct, routed;
before(async () => {
  if (PD) {
    workers = await Promise.all([startServer(), startRole('prefill'), startRole('decode')]);
    router = await startRouter(['--prefill', `http://127.0.0.1:${workers[1].port}`,
                                '--decode', `http://127.0.0.1:${workers[2].port}`]);
  } else {
    workers = await Promise.all([startServer(), startServer()]);
    router = await startRouter(workers.flatMap((w) => ['--worker', `http://127.0.0.1:${w.port}`]));
  }
  direct = sdk(workers[0].port);
  routed = sdk(router.port);
});
after(async () => {
  assert.equal(await stop(router), 0, 'SIGTERM drains the router and exits 0');
  for (const w of workers) assert.equal(await stop(w), 0);
});

// What must not depend on the path taken (a repeated prompt may hit the
// worker's prefix cache, so cached_tokens differ).
const strip = ({ id, created, usage, ...rest }) => {
  const { prompt_tokens_details, ...u } = usage;
  return { ...rest, usage: u };
};

test('models come from a worker', async () => {
  const models = await routed.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['qwen3-tiny']);
});

test('completions (token ids, logprobs) equal the worker\'s own, on both workers', async () => {
  const c = golden.cases[4];
  const args = { model: 'qwen3-tiny', prompt: c.prompt_ids, max_tokens: c.output_ids.length, temperature: 0,
                 logprobs: 5, ignore_eos: true, return_tokens_as_token_ids: true };
  const want = strip(await direct.completions.create(args));
  for (let i = 0; i < 2; ++i) assert.deepEqual(strip(await routed.completions.create(args)), want);
  const toks = want.choices[0].logprobs.tokens.map((t) => Number(t.replace('token_id:', '')));
  assert.deepEqual(toks, c.output_ids);
});

test('streaming completion through the router concatenates to the whole text', async () => {
  const args = { model: 'qwen3-tiny', prompt: 'The quick brown fox', max_tokens: 12, temperature: 0, ignore_eos: true };
  const whole = await direct.completions.create(args);
  const stream = await routed.completions.create({ ...args, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) text += chunk.choices[0].text;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(usage.completion_tokens, 12);
});

test('chat, streamed and not, equals the worker\'s own and the golden', async () => {
  const c = golden.chat_cases[0];
  const args = { model: 'qwen3-tiny', messages: c.messages, max_tokens: c.output_ids.length, temperature: 0,
                 ignore_eos: true, logprobs: true, top_logprobs: 2 };
  const want = strip(await direct.chat.completions.create(args));
  const got = strip(await routed.chat.completions.create(args));
  assert.deepEqual(got, want);
  assert.equal(got.choices[0].message.content, c.output_text);
  const stream = await routed.chat.completions.create({ ...args, stream: true });
  let text = '', role = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    if (d?.role) role = d.role;
    if (d?.content) text += d.content;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, c.output_text);
});

test('a worker\'s 400 comes through as the same APIError', async () => {
  await assert.rejects(
    routed.chat.completions.create({ model: 'qwen3-tiny', messages: [{ role: 'user', content: 'hi' }], temperature: 7 }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && e.param === 'temperature');
});

test('the router\'s own limit surfaces as APIError 503 with Retry-After', async () => {
  const upstream = PD ? ['--prefill', `http://127.0.0.1:${workers[1].port}`,
                         '--decode', `http://127.0.0.1:${workers[2].port}`]
                      : ['--worker', `http://127.0.0.1:${workers[1].port}`];
  const small = await startRouter([...upstream, '--max-concurrent-requests', '1', '--max-queued-requests', '1']);
  try {
    const c = sdk(small.port);
    const calls = Array.from({ length: 8 }, () =>
      c.completions.create({ model: 'qwen3-tiny', prompt: 'hello', max_tokens: 100, ignore_eos: true }));
    const results = await Promise.allSettled(calls);
    const rejected = results.filter((r) => r.status === 'rejected');
    const ok = results.filter((r) => r.status === 'fulfilled');
    assert.ok(rejected.length > 0, 'some requests are shed');
    assert.ok(ok.length >= 2, 'the running and the queued one complete');
    for (const r of rejected) {
      assert.ok(r.reason instanceof OpenAI.APIError, String(r.reason));
      assert.equal(r.reason.status, 503);
      assert.equal(r.reason.code, 'max_queued_requests');
      assert.ok(Number(r.reason.headers.get('retry-after')) >= 1);
    }
    for (const r of ok) assert.equal(r.value.usage.completion_tokens, 100);
  } finally {
    assert.equal(await stop(small), 0);
  }
});

// llama.cpp's CPU prefill and decode speed on one GGUF, measured the way
// `strata bench engine` measures Strata: one sequence, a prompt of
// --prompt-len random token ids evaluated as one batch, then --gen-len greedy
// decode steps; best of --repeats after one warm-up that pages in the weights.
//
//   node tools/bench/llama_cpp/bench.mjs --model M.gguf --threads 2 \
//       [--prompt-len 512] [--gen-len 64] [--repeats 1] [--vocab-hi 1000] \
//       [--native DIR]
//
// Prints one JSON object. What is timed is model evaluation through
// LlamaContextSequence.evaluate (llama_decode + greedy sampling of one token
// per step): prefill = prompt submitted -> first token sampled; decode = each
// later token. CPU only. Without --native: the npm prebuilt llama.cpp of
// node-llama-cpp 3.22.1 installed next to this file. With --native DIR: the
// llama.cpp that `node-llama-cpp source download` compiled (-march=native)
// inside DIR/node_modules/node-llama-cpp (tools/bench/llama_cpp/native.sh).
// Which one loaded is checked, not assumed: node-llama-cpp prefers a local
// build over the prebuilt when both exist, so the two live in separate installs.
import { loadNodeLlamaCpp } from "./load.mjs";

function parseArgs(argv) {
  const a = { promptLen: 512, genLen: 64, repeats: 1, threads: 1, vocabHi: 1000 };
  const names = {
    "--model": "model", "--threads": "threads", "--prompt-len": "promptLen",
    "--gen-len": "genLen", "--repeats": "repeats", "--vocab-hi": "vocabHi", "--native": "native",
  };
  for (let i = 0; i < argv.length; i += 2) {
    const key = names[argv[i]];
    if (!key || i + 1 >= argv.length) {
      console.error(`bench.mjs: unknown or valueless flag '${argv[i]}' (known: ${Object.keys(names).join(" ")})`);
      process.exit(2);
    }
    a[key] = key === "model" || key === "native" ? argv[i + 1] : Number(argv[i + 1]);
  }
  if (!a.model) {
    console.error("bench.mjs: --model PATH.gguf is required");
    process.exit(2);
  }
  return a;
}

// Deterministic token ids in [0, hi): the ids don't change the work done.
function promptTokens(n, hi, seed) {
  let s = seed >>> 0;
  const out = [];
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out.push(s % hi);
  }
  return out;
}

// One prompt + greedy generation; returns seconds for prefill and per-step decode.
async function runOnce(seq, prompt, genLen) {
  await seq.clearHistory();
  const cpuS = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };  // all threads
  const t0 = process.hrtime.bigint();
  const c0 = cpuS();
  let tFirst = 0n;
  let cFirst = 0;
  let steps = 0;
  for await (const _tok of seq.evaluate(prompt, { temperature: 0 })) {
    if (steps === 0) {
      tFirst = process.hrtime.bigint();
      cFirst = cpuS();
    }
    if (++steps > genLen) break;  // token 1 came from prefill; genLen decode steps after it
  }
  const tEnd = process.hrtime.bigint();
  const cEnd = cpuS();
  return {
    prefillS: Number(tFirst - t0) / 1e9, decodeS: Number(tEnd - tFirst) / 1e9, decodeSteps: steps - 1,
    prefillCpuS: cFirst - c0, decodeCpuS: cEnd - cFirst,
  };
}

const args = parseArgs(process.argv.slice(2));
const { llama, binding } = await loadNodeLlamaCpp({ native: args.native, maxThreads: args.threads });
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
const context = await model.createContext({
  contextSize: args.promptLen + args.genLen + 16,
  batchSize: args.promptLen,  // the whole prompt in one batch, as Strata does
  threads: { ideal: args.threads, min: args.threads },
  sequences: 1,
});
const seq = context.getSequence();

await runOnce(seq, promptTokens(32, args.vocabHi, 7), 4);  // warm-up: page in weights
let bestPrefill = 0;
let bestDecode = 0;
// Tokens x threads / CPU-seconds, as `strata bench engine` reports them.
let bestPrefillCpu = 0;
let bestDecodeCpu = 0;
for (let r = 0; r < args.repeats; r++) {
  const res = await runOnce(seq, promptTokens(args.promptLen, args.vocabHi, 1234 + r), args.genLen);
  bestPrefill = Math.max(bestPrefill, args.promptLen / res.prefillS);
  bestDecode = Math.max(bestDecode, res.decodeSteps / res.decodeS);
  bestPrefillCpu = Math.max(bestPrefillCpu, args.promptLen / (res.prefillCpuS / args.threads));
  bestDecodeCpu = Math.max(bestDecodeCpu, res.decodeSteps / (res.decodeCpuS / args.threads));
}
console.log(JSON.stringify({
  engine: args.native ? "llama.cpp native" : "llama.cpp prebuilt",
  binding,
  gpu: llama.gpu,
  cpu_variant: llama.buildType ?? null,
  model: args.model,
  threads: context.currentThreads,
  flash_attention: context.flashAttention,
  prompt_len: args.promptLen,
  gen_len: args.genLen,
  prefill_tok_s: bestPrefill,
  decode_tok_s: bestDecode,
  prefill_tok_per_cpu_s: bestPrefillCpu,
  decode_tok_per_cpu_s: bestDecodeCpu,
}));
await context.dispose();
await model.dispose();
await llama.dispose();

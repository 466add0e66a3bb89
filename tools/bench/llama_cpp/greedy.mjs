// Greedy continuation of a prompt of token ids with llama.cpp, for checking
// that a GGUF written by make_shape_model.py computes the same model as its
// safetensors twin in Strata (compare with `strata generate --prompt-ids`).
//
//   node tools/bench/llama_cpp/greedy.mjs --model M.gguf --prompt-ids 1,2,3 [--max-tokens 16] [--native DIR]
//
// Prints {"ids": [...]}; KV cache in F32 so only the matmul order differs.
// --native DIR: the natively compiled llama.cpp in DIR (see bench.mjs).
import { loadNodeLlamaCpp } from "./load.mjs";

const opt = { maxTokens: 16 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  if (argv[i] === "--model") opt.model = argv[i + 1];
  else if (argv[i] === "--prompt-ids") opt.prompt = argv[i + 1].split(",").map(Number);
  else if (argv[i] === "--max-tokens") opt.maxTokens = Number(argv[i + 1]);
  else if (argv[i] === "--native") opt.native = argv[i + 1];
  else {
    console.error(`greedy.mjs: unknown flag '${argv[i]}' (known: --model --prompt-ids --max-tokens --native)`);
    process.exit(2);
  }
}
if (!opt.model || !opt.prompt) {
  console.error("greedy.mjs: --model PATH.gguf and --prompt-ids are required");
  process.exit(2);
}
const { llama } = await loadNodeLlamaCpp({ native: opt.native, maxThreads: 1 });
const model = await llama.loadModel({ modelPath: opt.model, gpuLayers: 0 });
const context = await model.createContext({
  contextSize: opt.prompt.length + opt.maxTokens + 16, threads: 1,
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const ids = [];
for await (const tok of context.getSequence().evaluate(opt.prompt, { temperature: 0 })) {
  ids.push(tok);
  if (ids.length >= opt.maxTokens) break;
}
console.log(JSON.stringify({ ids }));
await context.dispose();
await model.dispose();
await llama.dispose();

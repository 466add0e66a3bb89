// Loads llama.cpp through node-llama-cpp for bench.mjs and greedy.mjs: the
// npm prebuilt installed next to this file, or (native = DIR) the build that
// `node-llama-cpp source download` compiled with -march=native inside
// DIR/node_modules/node-llama-cpp (native.sh makes it). Fails, saying which,
// when the binary that loaded is not the one asked for: node-llama-cpp
// silently prefers a local build over the prebuilt and falls back from a
// broken local build to the prebuilt, and either would mislabel a table.
import path from "node:path";
import { pathToFileURL } from "node:url";

export async function loadNodeLlamaCpp({ native, maxThreads }) {
  const mod = native
    ? await import(pathToFileURL(path.join(path.resolve(native), "node_modules/node-llama-cpp/dist/index.js")).href)
    : await import("node-llama-cpp");
  const { getLlama, LlamaLogLevel } = mod;
  const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: !native, maxThreads, logLevel: LlamaLogLevel.error,
  });
  const want = native ? "localBuild" : "prebuilt";
  if (llama.buildType !== want) {
    console.error(`load.mjs: asked for the ${want} llama.cpp but node-llama-cpp loaded its ${llama.buildType} ` +
      (native ? `from ${native}: rebuild it (tools/bench/llama_cpp/native.sh)`
              : "from tools/bench/llama_cpp: remove node_modules/node-llama-cpp/llama/localBuilds there"));
    process.exit(1);
  }
  const binding = native
    ? `node-llama-cpp@3.22.1 source build (GGML_NATIVE) in ${native}`
    : "node-llama-cpp@3.22.1 (npm prebuilt)";
  return { llama, binding };
}

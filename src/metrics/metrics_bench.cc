// Cost of a metric update on the engine thread, and of one scrape.
#include <benchmark/benchmark.h>

#include "metrics/metrics.h"

namespace strata::metrics {
namespace {

void BM_CounterInc(benchmark::State& state) {
  Counter c;
  for (auto _ : state) c.Inc();
  benchmark::DoNotOptimize(c.Value());
}
BENCHMARK(BM_CounterInc);

void BM_HistogramObserve(benchmark::State& state) {
  Histogram h(LatencyBuckets());
  double v = 0.0001;
  for (auto _ : state) {
    h.Observe(v);
    v = v < 400 ? v * 1.7 : 0.0001;  // walk every bucket
  }
  benchmark::DoNotOptimize(h.Read().count);
}
BENCHMARK(BM_HistogramObserve);

// A registry about the size the server will have: 20 counters with 5 series
// each, 5 latency histograms.
void BM_Render(benchmark::State& state) {
  auto r = std::move(Registry::Create({{"model", "qwen3-8b"}, {"role", "colocated"}})).value();
  for (int i = 0; i < 20; ++i) {
    auto* f = r->AddCounter("strata_thing" + std::to_string(i) + "_total", "Things.", {"outcome"})
                  .value();
    for (const char* o : {"ok", "error", "length", "stop", "abort"}) f->Get({o}).Inc(12345);
  }
  for (int i = 0; i < 5; ++i) {
    r->AddHistogram("strata_latency" + std::to_string(i) + "_seconds", "Latency.")
        .value()
        ->Get()
        .Observe(0.02);
  }
  size_t bytes = 0;
  for (auto _ : state) bytes = r->Render().size();
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Render);

}  // namespace
}  // namespace strata::metrics
BENCHMARK_MAIN();

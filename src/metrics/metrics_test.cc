#include "metrics/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "metrics/exposition.h"

namespace strata::metrics {
namespace {

std::unique_ptr<Registry> MakeRegistry(Labels labels = {}) {
  auto r = Registry::Create(std::move(labels));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

TEST(ExpositionTest, FormatValue) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-2), "-2");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e-05), "1e-05");
  EXPECT_EQ(FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatValue(NAN), "NaN");
}

TEST(ExpositionTest, Escaping) {
  EXPECT_EQ(EscapeHelp("a\\b\nc\"d"), "a\\\\b\\nc\"d");
  EXPECT_EQ(EscapeLabelValue("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
}

TEST(RegistryTest, RendersExactText) {
  auto r = MakeRegistry({{"model", "tiny \"q\""}, {"role", "colocated"}});
  auto requests =
      r->AddCounter("strata_requests_total", "Requests done.\nBy outcome \\ kind.", {"outcome"});
  ASSERT_TRUE(requests.ok()) << requests.status().ToString();
  (*requests)->Get({"ok"}).Inc(3);
  (*requests)->Get({"error"}).Inc();
  auto running = r->AddGauge("strata_running_requests", "Requests running now.");
  ASSERT_TRUE(running.ok());
  (*running)->Get().Set(2.5);
  auto ttft = r->AddHistogram("strata_ttft_seconds", "Time to first token.", {}, {0.1, 1});
  ASSERT_TRUE(ttft.ok());
  (*ttft)->Get().Observe(0.05);
  (*ttft)->Get().Observe(0.1);  // le is inclusive
  (*ttft)->Get().Observe(7);
  (*ttft)->Get().Observe(NAN);  // dropped
  int queued = 4;
  ASSERT_TRUE(r->AddCallbackGauge("strata_queued_requests", "Waiting requests.", [&] {
                 return queued;
               }).ok());
  queued = 5;  // read at render time
  EXPECT_EQ(
      r->Render(),
      "# HELP strata_requests_total Requests done.\\nBy outcome \\\\ kind.\n"
      "# TYPE strata_requests_total counter\n"
      "strata_requests_total{model=\"tiny \\\"q\\\"\",role=\"colocated\",outcome=\"error\"} 1\n"
      "strata_requests_total{model=\"tiny \\\"q\\\"\",role=\"colocated\",outcome=\"ok\"} 3\n"
      "# HELP strata_running_requests Requests running now.\n"
      "# TYPE strata_running_requests gauge\n"
      "strata_running_requests{model=\"tiny \\\"q\\\"\",role=\"colocated\"} 2.5\n"
      "# HELP strata_ttft_seconds Time to first token.\n"
      "# TYPE strata_ttft_seconds histogram\n"
      "strata_ttft_seconds_bucket{model=\"tiny \\\"q\\\"\",role=\"colocated\",le=\"0.1\"} 2\n"
      "strata_ttft_seconds_bucket{model=\"tiny \\\"q\\\"\",role=\"colocated\",le=\"1\"} 2\n"
      "strata_ttft_seconds_bucket{model=\"tiny \\\"q\\\"\",role=\"colocated\",le=\"+Inf\"} 3\n"
      "strata_ttft_seconds_sum{model=\"tiny \\\"q\\\"\",role=\"colocated\"} 7.15\n"
      "strata_ttft_seconds_count{model=\"tiny \\\"q\\\"\",role=\"colocated\"} 3\n"
      "# HELP strata_queued_requests Waiting requests.\n"
      "# TYPE strata_queued_requests gauge\n"
      "strata_queued_requests{model=\"tiny \\\"q\\\"\",role=\"colocated\"} 5\n");
}

TEST(RegistryTest, NoConstLabelsAndLabelledHistogram) {
  auto r = MakeRegistry();
  auto h = r->AddHistogram("strata_prompt_tokens", "Prompt length.", {"route"}, {10});
  ASSERT_TRUE(h.ok());
  (*h)->Get({"a\nb"}).Observe(11);
  auto c = r->AddCounter("strata_steps_total", "Engine steps.");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(r->Render(),
            "# HELP strata_prompt_tokens Prompt length.\n"
            "# TYPE strata_prompt_tokens histogram\n"
            "strata_prompt_tokens_bucket{route=\"a\\nb\",le=\"10\"} 0\n"
            "strata_prompt_tokens_bucket{route=\"a\\nb\",le=\"+Inf\"} 1\n"
            "strata_prompt_tokens_sum{route=\"a\\nb\"} 11\n"
            "strata_prompt_tokens_count{route=\"a\\nb\"} 1\n"
            "# HELP strata_steps_total Engine steps.\n"
            "# TYPE strata_steps_total counter\n"
            "strata_steps_total 0\n");
}

TEST(MetricsTest, CounterAndGaugeSemantics) {
  Counter c;
  c.Inc();
  c.Inc(2.5);
  EXPECT_EQ(c.Value(), 3.5);
  Gauge g;
  g.Inc(5);
  g.Dec(2);
  EXPECT_EQ(g.Value(), 3);
  g.Set(-1);
  EXPECT_EQ(g.Value(), -1);
}

TEST(MetricsTest, HistogramBuckets) {
  Histogram h({1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 4.0, 4.5, -3.0}) h.Observe(v);
  Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{3, 4, 5, 6}));
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.sum, 8.5);
}

TEST(MetricsTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  std::vector<double> b = LatencyBuckets();
  EXPECT_EQ(b.front(), 0.001);
  EXPECT_EQ(b.back(), 300);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  auto r = MakeRegistry();
  auto c = r->AddCounter("strata_tokens_total", "Tokens.", {"kind"});
  auto h = r->AddHistogram("strata_itl_seconds", "Inter-token latency.");
  ASSERT_TRUE(c.ok() && h.ok());
  constexpr int kThreads = 4, kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& mine = (*c)->Get({t % 2 ? "odd" : "even"});  // shared by two threads
      Histogram& hist = (*h)->Get();
      for (int i = 0; i < kIters; ++i) {
        mine.Inc();
        hist.Observe(0.5);
        if (i % 1000 == 0) r->Render();  // scraping while updating
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ((*c)->Get({"odd"}).Value(), 2.0 * kIters);
  EXPECT_EQ((*c)->Get({"even"}).Value(), 2.0 * kIters);
  Histogram::Snapshot s = (*h)->Get().Read();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kIters);
  EXPECT_EQ(s.sum, 0.5 * kThreads * kIters);
}

TEST(RegistryTest, RejectsBadNames) {
  auto r = MakeRegistry({{"model", "m"}});
  auto counter = [&](const char* name, std::vector<std::string> labels = {}) {
    return r->AddCounter(name, "Help.", std::move(labels)).status();
  };
  auto gauge = [&](const char* name) { return r->AddGauge(name, "Help.").status(); };
  EXPECT_FALSE(counter("strata_requests").ok());      // counter without _total
  EXPECT_FALSE(gauge("strata_requests_total").ok());  // _total on a gauge
  EXPECT_FALSE(gauge("2strata").ok());                // leading digit
  EXPECT_FALSE(gauge("strata-x").ok());               // bad character
  EXPECT_FALSE(gauge("").ok());
  EXPECT_FALSE(gauge("strata:x").ok());                     // colon: recording rules only
  EXPECT_FALSE(gauge("strata_queueLength").ok());           // camelCase
  EXPECT_FALSE(gauge("strata_latency_ms").ok());            // abbreviated unit
  EXPECT_FALSE(gauge("strata_latency_milliseconds").ok());  // non-base unit
  EXPECT_FALSE(gauge("strata_cache_kilobytes").ok());
  EXPECT_FALSE(gauge("strata_depth_gauge").ok());        // type in name
  EXPECT_FALSE(gauge("strata_pages_count").ok());        // histogram suffix
  EXPECT_FALSE(counter("strata_x_total", {"le"}).ok());  // reserved label
  EXPECT_FALSE(counter("strata_x_total", {"__x"}).ok());
  EXPECT_FALSE(counter("strata_x_total", {"a-b"}).ok());
  EXPECT_FALSE(counter("strata_x_total", {"outCome"}).ok());
  EXPECT_FALSE(counter("strata_x_total", {"model"}).ok());  // clashes with constant label
  EXPECT_FALSE(counter("strata_x_total", {"a", "a"}).ok());
  EXPECT_FALSE(r->AddGauge("strata_x", "").ok());  // no help
  EXPECT_FALSE(r->AddHistogram("strata_h_seconds", "H.", {}, {1, 1}).ok());
  EXPECT_FALSE(r->AddHistogram("strata_h_seconds", "H.", {}, {1, INFINITY}).ok());
  EXPECT_FALSE(Registry::Create({{"bad-label", "x"}}).ok());
  EXPECT_FALSE(Registry::Create({{"a", "x"}, {"a", "y"}}).ok());

  Status bad = gauge("strata_latency_ms");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("strata_latency_ms"), std::string::npos) << bad.message();

  // Good names pass, and each registers once.
  EXPECT_TRUE(counter("strata_x_total", {"outcome", "_private"}).ok());
  EXPECT_TRUE(gauge("strata_kv_free_bytes").ok());
  EXPECT_TRUE(gauge("strata_step_seconds").ok());
  EXPECT_FALSE(gauge("strata_step_seconds").ok());  // duplicate
  EXPECT_FALSE(r->AddCallbackGauge("strata_step_seconds", "H.", [] { return 0.0; }).ok());
  // Nothing was registered by the failures above.
  EXPECT_EQ(r->Render().find("strata_requests "), std::string::npos);
}

TEST(RegistryDeathTest, WrongLabelCountAborts) {
  auto r = MakeRegistry();
  auto c = r->AddCounter("strata_x_total", "X.", {"a", "b"});
  ASSERT_TRUE(c.ok());
  EXPECT_DEATH((*c)->Get({"only_one"}), "2 label name");
}

TEST(RegistryTest, BuildInfo) {
  auto r = MakeRegistry();
  ASSERT_TRUE(AddBuildInfo(*r, "1.2.3").ok());
  std::string text = r->Render();
  EXPECT_NE(text.find("# TYPE strata_build_info gauge\nstrata_build_info{version=\"1.2.3\","
                      "compiler=\""),
            std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with("} 1\n")) << text;
  EXPECT_FALSE(AddBuildInfo(*r).ok());  // registered once
}

// promtool (Debian package prometheus; scripts/deps.sh --test installs it) is
// Prometheus's own parser and linter: it must accept our text with no warning.
TEST(RegistryTest, PromtoolAcceptsExposition) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed (apt-get install prometheus)";
  }
  auto r = MakeRegistry({{"model", "qwen \"3\"\\x\ny"}, {"role", "colocated"}});
  ASSERT_TRUE(AddBuildInfo(*r).ok());
  auto c = r->AddCounter("strata_generated_tokens_total", "Tokens generated.\nAll \\ of them.",
                         {"outcome"});
  auto g = r->AddGauge("strata_kv_free_bytes", "Free KV cache.");
  auto h =
      r->AddHistogram("strata_e2e_request_latency_seconds", "End to end latency.", {"outcome"});
  auto t =
      r->AddHistogram("strata_prompt_tokens", "Prompt length.", {}, ExponentialBuckets(1, 4, 8));
  ASSERT_TRUE(c.ok() && g.ok() && h.ok() && t.ok());
  (*c)->Get({"ok"}).Inc(12345);
  (*c)->Get({"length"}).Inc(0.5);
  (*g)->Get().Set(1e20);
  (*h)->Get({"ok"}).Observe(0.0123);
  (*h)->Get({"error"}).Observe(400);
  (*t)->Get().Observe(100);
  ASSERT_TRUE(r->AddCallbackGauge("strata_queued_requests", "Waiting.", [] { return NAN; }).ok());
  ASSERT_TRUE(
      r->AddCallbackCounter("strata_preemptions_total", "Preempted.", [] { return 7.0; }).ok());

  std::string dir = ::testing::TempDir();
  std::string in = dir + "/metrics_test_exposition.txt", log = dir + "/metrics_test_promtool.txt";
  std::ofstream(in) << r->Render();
  int rc = std::system(("promtool check metrics < '" + in + "' > '" + log + "' 2>&1").c_str());
  std::ifstream f(log);
  std::string output((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << output;
  EXPECT_EQ(output, "") << output;  // lint warnings are printed even when rc is 0
  std::remove(in.c_str());
  std::remove(log.c_str());
}

}  // namespace
}  // namespace strata::metrics

// strata bench serve: drives a running OpenAI-compatible server (strata serve
// or any other) with a bounded load and reports latency, throughput, goodput
// and HTTP status counts (loadgen.h does the work).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/loadgen.h"

namespace strata::cli {
namespace {

void PrintStats(const char* name, const LatencyStats& s) {
  if (s.count == 0) return;
  std::printf("  %-12s mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f  max %9.2f  (n=%lld)\n", name,
              s.mean, s.p50, s.p90, s.p99, s.max, static_cast<long long>(s.count));
}

}  // namespace

int BenchServeCommand(const Args& args) {
  const std::string cmd = "bench serve";
  std::string url = "http://127.0.0.1:8000", json_path, plot_path;
  LoadgenConfig cfg;
  int64_t burst = 0, seed = 0;
  FlagSet f(
      cmd,
      "Sends a bounded load of streamed /v1/completions requests (token-id prompts, ignore_eos; "
      "--chat: /v1/chat/completions with word prompts) to a running server and reports TTFT, "
      "inter-token and end-to-end latency, throughput, goodput "
      "under "
      "--slo-ttft-ms/--slo-itl-ms, and counts by HTTP status. Schedule: --concurrency N (default), "
      "--request-rate R (Poisson) or --burst N (all at once).");
  f.String("url", &url, "server root, http://HOST:PORT (IPv4 or localhost)");
  f.String("api-key", &cfg.api_key, "sent as 'Authorization: Bearer KEY'");
  f.String("model", &cfg.model, "the request's \"model\" field (default: left out)");
  f.Int("num-requests", &cfg.num_requests, "conversations to send (each has --turns requests)", 1,
        int64_t{1} << 30);
  f.Int("concurrency", &cfg.concurrency, "conversations in flight at once (fixed-concurrency mode)",
        1, 100000);
  f.Double("request-rate", &cfg.request_rate, "Poisson arrivals per second (rate mode)", 0, 1e9);
  f.Int("burst", &burst, "send this many requests at once and stop (burst mode)", 0, 100000);
  f.Double("duration-s", &cfg.duration_s, "start no request after this many seconds (0: no limit)",
           0, 1e9);
  f.Double("timeout-s", &cfg.timeout_s,
           "cut a request that runs longer (counted as a connection error)", 0, 1e9);
  f.Int("input-len", &cfg.input_len, "new prompt tokens per request (ids in [10, 400])", 1,
        1 << 24);
  f.Int("output-len", &cfg.output_len, "max_tokens per request (ignore_eos: all are generated)", 1,
        1 << 24);
  f.Double("range-ratio", &cfg.range_ratio, "lengths are uniform in [len * ratio, len]", 0, 1);
  f.Int("shared-prefix-len", &cfg.shared_prefix_len, "tokens of a prefix shared within each group",
        0, 1 << 24);
  f.Int("num-groups", &cfg.num_groups, "prefix groups (conversation i uses prefix i % groups)", 1,
        1 << 20);
  f.Int("turns", &cfg.turns,
        "requests per conversation; each repeats the conversation so far and adds to it", 1, 1000);
  f.Bool("chat", &cfg.chat,
         "use /v1/chat/completions with word prompts; later turns carry the real answers (default: "
         "/v1/completions with token-id prompts)");
  f.Int("seed", &seed, "workload and arrival seed", 0, int64_t{1} << 62);
  f.Double("slo-ttft-ms", &cfg.slo_ttft_ms, "goodput: time to first token bound (0: none)", 0, 1e9);
  f.Double("slo-itl-ms", &cfg.slo_itl_ms, "goodput: mean inter-token latency bound (0: none)", 0,
           1e9);
  f.String("json", &json_path, "write the summary and per-request records as JSON to this file");
  f.String("plot", &plot_path, "write an SVG latency plot to this file");
  Status st = f.Parse(args);
  if (!st.ok()) return UsageError(cmd, st);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  const int modes =
      int{f.IsSet("request-rate")} + int{f.IsSet("burst")} + int{f.IsSet("concurrency")};
  if (modes > 1)
    return UsageError(cmd,
                      InvalidArgument("give only one of --concurrency, --request-rate, --burst"));
  if (f.IsSet("burst")) {
    if (burst < 1) return UsageError(cmd, InvalidArgument("--burst must be at least 1"));
    if (f.IsSet("num-requests"))
      return UsageError(cmd, InvalidArgument("--burst N sends N requests; drop --num-requests"));
    cfg.mode = LoadgenConfig::Mode::kBurst;
    cfg.num_requests = burst;
  } else if (f.IsSet("request-rate")) {
    if (!(cfg.request_rate > 0))
      return UsageError(cmd, InvalidArgument("--request-rate must be > 0"));
    cfg.mode = LoadgenConfig::Mode::kRate;
  }
  cfg.seed = static_cast<uint64_t>(seed);
  st = ParseUrl(url, &cfg);
  if (!st.ok()) return UsageError(cmd, st);

  const bool tty = isatty(STDERR_FILENO) != 0;
  double last_line = 0;
  ProgressFn progress = [&](int64_t done, int64_t total, double elapsed) {
    // With --duration-s the run may end long before `total`: show whichever is nearer.
    double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 0;
    if (cfg.duration_s > 0) frac = std::max(frac, std::min(1.0, elapsed / cfg.duration_s));
    if (tty) {
      const int width = 30;
      const int filled = std::clamp(static_cast<int>(width * frac), 0, width);
      std::fprintf(stderr, "\r[%s%s] %lld/%lld requests  %.1f s ", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), static_cast<long long>(done),
                   static_cast<long long>(total), elapsed);
    } else if (elapsed - last_line >= 5.0) {
      std::fprintf(stderr, "strata bench serve: %lld/%lld requests after %.0f s (%.0f%%)\n",
                   static_cast<long long>(done), static_cast<long long>(total), elapsed,
                   100 * frac);
      last_line = elapsed;
    }
  };
  double duration = 0;
  auto records = RunLoad(cfg, progress, &duration);
  if (!records.ok()) return Fail(cmd, records.status());
  if (tty) std::fprintf(stderr, "\n");
  const LoadSummary s = Summarize(*records, duration, cfg);

  std::printf("strata bench serve: %s  %.2f s\n", url.c_str(), s.duration_s);
  std::printf("  requests %lld  ok %lld  503 %lld  other-status %lld  connection-errors %lld\n",
              static_cast<long long>(s.requests), static_cast<long long>(s.ok),
              static_cast<long long>(s.rejected_503), static_cast<long long>(s.other_status),
              static_cast<long long>(s.connection_errors));
  std::printf("  throughput %.2f req/s  input %.1f tok/s  output %.1f tok/s\n",
              s.request_throughput, s.input_tok_s, s.output_tok_s);
  if (s.input_tokens > 0)
    std::printf("  prompt tokens %lld, of them served from the prefix cache %lld (%.1f%%)\n",
                static_cast<long long>(s.input_tokens), static_cast<long long>(s.cached_tokens),
                100.0 * static_cast<double>(s.cached_tokens) / static_cast<double>(s.input_tokens));
  if (cfg.slo_ttft_ms > 0 || cfg.slo_itl_ms > 0)
    std::printf(
        "  goodput %.2f req/s (%lld requests met ttft<=%.0f ms, itl<=%.0f ms; 0 = unchecked)\n",
        s.goodput, static_cast<long long>(s.slo_met), cfg.slo_ttft_ms, cfg.slo_itl_ms);
  std::printf("  latency in ms:\n");
  PrintStats("ttft", s.ttft_ms);
  PrintStats("itl", s.itl_ms);
  PrintStats("e2e", s.e2e_ms);
  PrintStats("rejection", s.rejection_ms);
  for (const auto& r : *records) {
    if (r.http_status != 200 && r.http_status != 503 && !r.error.empty()) {
      std::printf("  first error: status %d: %s\n", r.http_status, r.error.c_str());
      break;
    }
  }

  if (!json_path.empty()) {
    nlohmann::json reqs = nlohmann::json::array();
    for (const auto& r : *records) {
      reqs.push_back({{"conversation", r.conversation},
                      {"turn", r.turn},
                      {"start_s", r.start_s},
                      {"ttft_s", r.ttft_s},
                      {"e2e_s", r.e2e_s},
                      {"status", r.http_status},
                      {"error", r.error},
                      {"input_tokens", r.input_tokens},
                      {"output_tokens", r.output_tokens},
                      {"cached_tokens", r.cached_tokens}});
    }
    const char* mode = cfg.mode == LoadgenConfig::Mode::kBurst  ? "burst"
                       : cfg.mode == LoadgenConfig::Mode::kRate ? "rate"
                                                                : "concurrency";
    nlohmann::json j = {{"url", url},
                        {"config",
                         {{"mode", mode},
                          {"concurrency", cfg.concurrency},
                          {"request_rate", cfg.request_rate},
                          {"num_requests", cfg.num_requests},
                          {"input_len", cfg.input_len},
                          {"output_len", cfg.output_len},
                          {"range_ratio", cfg.range_ratio},
                          {"shared_prefix_len", cfg.shared_prefix_len},
                          {"num_groups", cfg.num_groups},
                          {"turns", cfg.turns},
                          {"endpoint", cfg.chat ? "/v1/chat/completions" : "/v1/completions"},
                          {"seed", cfg.seed},
                          {"slo_ttft_ms", cfg.slo_ttft_ms},
                          {"slo_itl_ms", cfg.slo_itl_ms}}},
                        {"summary", s.ToJson()},
                        {"requests", reqs}};
    std::ofstream out(json_path);
    out << j.dump(2) << "\n";
    if (!out)
      return Fail(cmd, Internal("cannot write --json file '" + json_path +
                                "'; check the directory exists and is writable"));
  }
  if (!plot_path.empty()) {
    std::ofstream out(plot_path);
    out << RenderLatencySvg(*records);
    if (!out)
      return Fail(cmd, Internal("cannot write --plot file '" + plot_path +
                                "'; check the directory exists and is writable"));
  }
  return kExitOk;
}

}  // namespace strata::cli

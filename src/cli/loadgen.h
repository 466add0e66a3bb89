// Load generator for an OpenAI-compatible server (strata bench serve): builds
// a workload (random lengths, shared prefixes, multi-turn), sends it over many
// concurrent HTTP/1.1 connections from one epoll thread under a schedule
// (fixed concurrency, Poisson rate or one burst), parses the SSE streams and
// summarises latency, throughput, goodput and status counts.
//
// The pure pieces (percentiles, SSE parsing, the Poisson schedule, the summary)
// are separate functions so tests can check them without a server. Nothing
// here is thread-safe; RunLoad owns its sockets and returns when done.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace strata::cli {

struct LoadgenConfig {
  // Target (parsed from --url; only http://).
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string model;  // empty: the "model" field is left out

  // Schedule: exactly one of concurrency / request_rate / burst is in effect.
  enum class Mode { kConcurrency, kRate, kBurst };
  Mode mode = Mode::kConcurrency;
  int64_t concurrency = 1;
  double request_rate = 0;     // req/s (Poisson)
  int64_t num_requests = 100;  // conversations (each has `turns` requests)
  double duration_s = 0;       // 0: no limit; else no new request starts after it
  double timeout_s = 300;      // a request running longer is cut and counted as an error

  // Workload.
  int64_t input_len = 128;
  int64_t output_len = 64;
  double range_ratio = 1.0;  // lengths uniform in [len * ratio, len]
  int64_t shared_prefix_len = 0;
  int64_t num_groups = 1;
  int64_t turns = 1;
  uint64_t seed = 0;
  // false: /v1/completions with token-id prompts (a later turn appends random
  // ids standing in for the answer); true: /v1/chat/completions with prompts
  // of random common words (the real token count comes back in usage) and the real answers
  // carried into the next turn's messages.
  bool chat = false;

  // Service-level objectives for goodput (0: not checked).
  double slo_ttft_ms = 0;
  double slo_itl_ms = 0;
};

// Parses "http://HOST:PORT[/]" into config->host/port. HOST must be an IPv4
// literal or "localhost"; https and paths are refused.
Status ParseUrl(const std::string& url, LoadgenConfig* config);

// p in [0, 100]; linear interpolation between closest ranks. `sorted` must be
// ascending; empty gives 0.
double Percentile(const std::vector<double>& sorted, double p);

// Incremental text/event-stream parser: Feed() accepts bytes in any split and
// returns the complete events' data payloads (multi-line data joined by \n).
class SseParser {
 public:
  std::vector<std::string> Feed(std::string_view bytes);

 private:
  std::string line_;
  std::string data_;
  bool has_data_ = false;
};

// One streamed completion chunk: the text and the number of tokens it carries
// (from continuous usage stats when present: completion_tokens minus
// `prev_completion_tokens`; else 1 for a non-empty text). done is true for
// "[DONE]". Malformed JSON gives an error.
struct SseChunk {
  bool done = false;
  int64_t tokens = 0;
  int64_t completion_tokens = -1;  // cumulative, when the chunk reports usage
  int64_t prompt_tokens = -1;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens
  std::string finish_reason;
  std::string text;  // choices[0].text, or choices[0].delta.content for chat
};
StatusOr<SseChunk> ParseCompletionChunk(const std::string& data, int64_t prev_completion_tokens);

// Start offsets (seconds from the run start) of n arrivals of a Poisson
// process with `rate` per second; the same seed gives the same schedule.
std::vector<double> PoissonSchedule(double rate, int64_t n, uint64_t seed);

// One request as the client saw it. Times are seconds since the run start.
struct RequestRecord {
  int64_t conversation = 0;
  int64_t turn = 0;
  double start_s = 0;
  double ttft_s = -1;  // -1: no token arrived
  double e2e_s = 0;
  int http_status = 0;  // 0: connection error / timeout / protocol error
  std::string error;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the server's prefix cache served
  std::vector<double> itl_s;  // gaps between token arrivals (per token)
};

struct LatencyStats {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  int64_t count = 0;
};
LatencyStats ComputeLatencyStats(std::vector<double> values);

struct LoadSummary {
  double duration_s = 0;
  int64_t requests = 0;
  int64_t ok = 0;  // HTTP 200 with a complete stream
  int64_t rejected_503 = 0;
  int64_t other_status = 0;
  int64_t connection_errors = 0;  // no HTTP status (refused, reset, timeout, bad stream)
  std::map<int, int64_t> by_status;
  double request_throughput = 0;  // ok / s
  double input_tok_s = 0, output_tok_s = 0;
  int64_t input_tokens = 0, cached_tokens = 0;  // over ok requests
  double goodput = 0;                           // ok requests meeting every set SLO, per second
  int64_t slo_met = 0;
  LatencyStats ttft_ms, itl_ms, e2e_ms, rejection_ms;
  nlohmann::json ToJson() const;
};

// A request meets the SLO when it succeeded, its TTFT <= slo_ttft_ms and its
// mean inter-token latency <= slo_itl_ms (each bound only when > 0).
bool MeetsSlo(const RequestRecord& r, double slo_ttft_ms, double slo_itl_ms);
LoadSummary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                      const LoadgenConfig& config);

// Progress callback: (finished requests, total requests, elapsed seconds).
using ProgressFn = std::function<void(int64_t, int64_t, double)>;

// Runs the whole load and returns every request's record (in finish order)
// and the wall time through *duration_s. Fails only when nothing can be sent
// (bad config); per-request failures are in the records.
StatusOr<std::vector<RequestRecord>> RunLoad(const LoadgenConfig& config,
                                             const ProgressFn& progress, double* duration_s);

// A small self-contained SVG: TTFT over request start time (200s as dots,
// rejections as crosses) and the CDF of end-to-end latency.
std::string RenderLatencySvg(const std::vector<RequestRecord>& records);

}  // namespace strata::cli

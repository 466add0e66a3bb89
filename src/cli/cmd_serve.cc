// strata serve: the OpenAI-compatible server (colocated prefill + decode).
//
// Startup order: parse and validate every flag (exit 78, EX_CONFIG, naming
// the flag and the allowed range, before any weight is read), read
// config.json and check the flags against the model, bind the listening
// socket (an address that cannot be bound is a configuration error too, found
// before the minutes a large model takes to load), then load weights and
// serve. Signals: see cli/signals.h (SIGTERM drains within --drain-timeout-s;
// a second one aborts what is left).
#include <arpa/inet.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "cache/kv_layout.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/signals.h"
#include "engine/async_engine.h"
#include "metrics/metrics.h"
#include "server/openai_server.h"
#include "util/logging.h"

namespace strata::cli {
namespace {

int ConfigError(const std::string& msg) {
  std::fprintf(stderr, "strata serve: invalid configuration: %s\n", msg.c_str());
  return kExitConfig;
}

// MemAvailable from /proc/meminfo, in bytes (0 if unknown).
uint64_t AvailableMemory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// True when `host` (a literal address) reaches only this machine.
bool IsLoopback(const std::string& host) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return host == "localhost";
}

// After the first stop signal: drain (finish in-flight work, refuse new
// work) until idle, the deadline, or a second signal; abort what is left in
// the last two cases. Returns the exit code: 0 drained, 1 deadline passed,
// 128 + signal when a signal forced the stop.
int Shutdown(ServeSignals& signals, ServeSignals::Event first, OpenAiServer& server, AsyncEngine& engine,
             std::chrono::seconds drain_timeout) {
  using Clock = std::chrono::steady_clock;
  auto log = [](const std::string& text) {
    std::fprintf(stderr, "strata serve: %s\n", text.c_str());
    std::fflush(stderr);
  };
  const auto idle = [&] { return server.in_flight() == 0 && engine.WaitIdle(std::chrono::milliseconds(0)); };
  int code = kExitOk;
  std::string why;
  if (first.kind == ServeSignals::Kind::kStopNow) {
    code = 128 + first.signo;
    why = first.name + ": stopping now";
  } else {
    log(first.name + ": draining (new requests get 503; " + std::to_string(server.in_flight()) +
        " in flight; they get up to " + std::to_string(drain_timeout.count()) + " s, see --drain-timeout-s)");
    server.BeginDrain();
    const auto deadline = Clock::now() + drain_timeout;
    while (!idle()) {
      if (Clock::now() >= deadline) {
        code = kExitFailure;
        why = "drain deadline of " + std::to_string(drain_timeout.count()) + " s passed";
        break;
      }
      ServeSignals::Event ev = signals.Next(std::chrono::milliseconds(20));
      if (ev.kind != ServeSignals::Kind::kNone) {
        code = 128 + ev.signo;
        why = "second signal (" + ev.name + ")";
        break;
      }
    }
  }
  if (code != kExitOk) {
    log(why + ": aborting " + std::to_string(server.in_flight()) + " in-flight requests");
    server.AbortInFlight("the server is shutting down (" + why + ")");
    // Let the error events reach the clients (bounded: a stalled client
    // must not hold the exit).
    const auto flush_deadline = Clock::now() + std::chrono::seconds(2);
    while (server.in_flight() > 0 && Clock::now() < flush_deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server.Stop();
  engine.Stop();
  log(code == kExitOk ? "drained; exiting" : "stopped (" + why + "); exit " + std::to_string(code));
  return code;
}

}  // namespace

int ServeCommand(const Args& args) {
  const std::string cmd = "serve";
  ModelFlags mf;
  mf.max_batch_tokens = 512;
  std::string host = "127.0.0.1", served_name, api_key, kv_dtype = "f32";
  int64_t port = 8000, max_running = 64, max_total_tokens = 0, page_size = 16, context_length = 0;
  int64_t max_queued_requests = 256, max_queued_tokens = 0, max_queue_time_ms = 0;
  int64_t max_body_bytes = 32 << 20, io_threads = 1, max_total_body_bytes = int64_t{256} << 20;
  int64_t drain_timeout_s = 30;
  bool disable_radix = false;
  FlagSet f(cmd,
            std::string("Serves the model over an OpenAI-compatible HTTP API (/v1/completions, "
                        "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics). "
                        "Overload is shed at once with 503 + Retry-After by the admission limits. ") +
                ServeSignals::kHelp);
  f.RejectEmptyStrings();
  mf.Register(f);
  f.String("host", &host, "address to listen on (0.0.0.0: every interface; a warning is logged when that is done without --api-key)");
  f.Int("port", &port, "TCP port (0: any free port, printed at startup)", 0, 65535);
  f.String("served-model-name", &served_name, "model name in the API (default: the model directory's name)");
  f.String("api-key", &api_key, "require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize and /debug/* (checked before the body is read)");
  f.Int("max-running-requests", &max_running, "requests computed concurrently", 1, 4096);
  f.Int("max-total-tokens", &max_total_tokens, "KV cache size in tokens (0: automatic)", 0, int64_t{1} << 40);
  f.Int("page-size", &page_size, "tokens per KV page", 1, 1024);
  f.Int("context-length", &context_length, "longest prompt + output (0: the model's max_position_embeddings)", 0, int64_t{1} << 30);
  f.String("kv-cache-dtype", &kv_dtype, "KV page element type: f32, bf16 or f16");
  f.Bool("disable-radix-cache", &disable_radix, "turn off prefix caching");
  f.Int("max-queued-requests", &max_queued_requests, "admission: most requests waiting for prefill (0: no limit)", 0, int64_t{1} << 30);
  f.Int("max-queued-tokens", &max_queued_tokens, "admission: most prompt tokens waiting for prefill (0: no limit)", 0, int64_t{1} << 40);
  f.Int("max-queue-time-ms", &max_queue_time_ms,
        "admission: refuse requests whose estimated queue wait exceeds this; fail queued ones that wait longer (0: no limit)",
        0, int64_t{1} << 40);
  f.Int("max-request-body-bytes", &max_body_bytes, "larger request bodies get 413", 1024, int64_t{1} << 32);
  f.Int("max-total-request-body-bytes", &max_total_body_bytes,
        "most bytes all request bodies being received may hold together; past it 503 + Retry-After "
        "(0: no cap; else >= --max-request-body-bytes)", 0, int64_t{1} << 40);
  f.Int("io-threads", &io_threads, "HTTP I/O threads", 1, 64);
  f.Int("drain-timeout-s", &drain_timeout_s,
        "on SIGTERM, how long in-flight requests may take to finish before the rest are aborted", 0, 24 * 3600);
  Status st = f.Parse(args);
  if (!st.ok()) return ConfigError(st.message());  // supervisors must not restart on this
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  // Flag values the ranges above cannot express.
  DType kv;
  if (kv_dtype == "f32" || kv_dtype == "float32") kv = DType::kF32;
  else if (kv_dtype == "bf16" || kv_dtype == "bfloat16") kv = DType::kBF16;
  else if (kv_dtype == "f16" || kv_dtype == "float16") kv = DType::kF16;
  else return ConfigError("--kv-cache-dtype: '" + kv_dtype + "' is not one of f32, bf16, f16");
  if (mf.matmul_precision != "fp32" && mf.matmul_precision != "bf16")
    return ConfigError("--matmul-precision: '" + mf.matmul_precision + "' is not one of fp32, bf16");
  if (mf.isa != "auto" && mf.isa != "avx512" && mf.isa != "avx2" && mf.isa != "scalar")
    return ConfigError("--cpu-isa: '" + mf.isa + "' is not one of auto, avx512, avx2, scalar");
  if (max_total_body_bytes != 0 && max_total_body_bytes < max_body_bytes)
    return ConfigError("--max-total-request-body-bytes " + std::to_string(max_total_body_bytes) +
                       " is smaller than --max-request-body-bytes " + std::to_string(max_body_bytes) +
                       " (allowed 0 for no cap, or " + std::to_string(max_body_bytes) + ".." +
                       std::to_string(int64_t{1} << 40) + ")");
  if (max_total_tokens > 0 && max_total_tokens < page_size)
    return ConfigError("--max-total-tokens " + std::to_string(max_total_tokens) +
                       " is smaller than one page (--page-size " + std::to_string(page_size) + ")");

  // The model's config, before any weight is read.
  std::string dir = mf.model_path;
  if (dir.empty()) {
    auto d = EnsureDemoModel();
    if (!d.ok()) return Fail(cmd, d.status());
    dir = *d;
    std::fprintf(stderr, "strata serve: no --model-path given; using the embedded demo model at %s\n", dir.c_str());
    mf.model_path = dir;
  }
  auto config = ReadModelConfig(dir);
  if (!config.ok()) return Fail(cmd, config.status());
  if (context_length > 0 && config->max_position_embeddings > 0 && context_length > config->max_position_embeddings)
    return ConfigError("--context-length " + std::to_string(context_length) + " exceeds the model's max_position_embeddings " +
                       std::to_string(config->max_position_embeddings) + " (allowed 1.." +
                       std::to_string(config->max_position_embeddings) + ")");
  if (max_total_tokens > 0) {
    const uint64_t bytes_per_token = 2ull * config->num_hidden_layers * config->num_key_value_heads *
                                     config->head_dim * DTypeSize(kv);
    const uint64_t need = bytes_per_token * static_cast<uint64_t>(max_total_tokens);
    const uint64_t avail = AvailableMemory();
    if (avail > 0 && need > avail)
      return ConfigError("--max-total-tokens " + std::to_string(max_total_tokens) + " needs " +
                         std::to_string(need >> 20) + " MiB of KV cache but only " + std::to_string(avail >> 20) +
                         " MiB of memory is available (allowed up to about " +
                         std::to_string(avail / bytes_per_token) + " tokens at --kv-cache-dtype " + kv_dtype + ")");
  }
  if (served_name.empty()) {
    served_name = dir;
    while (served_name.size() > 1 && served_name.back() == '/') served_name.pop_back();
    if (auto slash = served_name.rfind('/'); slash != std::string::npos) served_name = served_name.substr(slash + 1);
  }

  // Signals are taken on this thread; block them before any thread starts
  // (threads inherit the mask).
  ServeSignals signals = ServeSignals::Install("strata serve");

  // Bind before loading: a wrong --host or a taken --port is a configuration
  // error found in milliseconds, not after the weights load.
  HttpServerOptions http;
  http.host = host;
  http.port = static_cast<int>(port);
  http.io_threads = static_cast<int>(io_threads);
  http.max_body_bytes = static_cast<size_t>(max_body_bytes);
  http.max_total_body_bytes = static_cast<size_t>(max_total_body_bytes);
  http.api_key = api_key;
  auto listener = HttpServer::Create(http);
  if (!listener.ok()) return ConfigError("--host/--port: " + listener.status().message());
  if (api_key.empty() && !IsLoopback(host))
    STRATA_LOG(WARN) << "listening on " << host << ":" << (*listener)->port()
                     << " (beyond loopback) without --api-key: anyone who can reach this address can use the "
                        "model; set --api-key or listen on 127.0.0.1";

  mf.max_batch_tokens += max_running;  // prompt chunk + one decode token per running request
  auto stack = LoadForCli(cmd, mf);
  if (!stack.ok()) return Fail(cmd, stack.status());
  EngineOptions eo;
  eo.page_size = static_cast<int32_t>(page_size);
  eo.max_total_tokens = max_total_tokens;
  eo.max_running_requests = static_cast<int32_t>(max_running);
  eo.chunked_prefill_size = static_cast<int32_t>(mf.max_batch_tokens - max_running);
  eo.kv_dtype = kv;
  eo.context_length = context_length;
  eo.disable_radix_cache = disable_radix;
  auto engine = Engine::Create(*stack->model, *stack->backend, eo);
  if (!engine.ok()) return Fail(cmd, engine.status());
  auto registry = metrics::Registry::Create({{"model", served_name}, {"role", "colocated"}});
  if (!registry.ok()) return Fail(cmd, registry.status());
  (void)metrics::AddBuildInfo(**registry);
  AdmissionOptions adm;
  adm.max_queued_requests = max_queued_requests;
  adm.max_queued_tokens = max_queued_tokens;
  adm.max_queue_time_ms = max_queue_time_ms;
  auto async = AsyncEngine::Start(std::move(*engine), adm, registry->get());
  if (!async.ok()) return Fail(cmd, async.status());
  ServerOptions so;
  so.served_model_name = served_name;
  so.api_key = api_key;
  so.http = http;
  auto server = OpenAiServer::Create(*stack->model, **async, **registry, so, std::move(*listener));
  if (!server.ok()) return Fail(cmd, server.status());
  if (Status s = (*server)->Start(); !s.ok()) return Fail(cmd, s);
  const EngineSnapshot snap = (*async)->snapshot();
  std::fprintf(stderr,
               "strata serve: serving '%s' on http://%s:%d (KV cache %ld pages x %ld tokens, "
               "max running %ld, max queued %ld requests / %ld tokens, queue time limit %ld ms)\n",
               served_name.c_str(), host.c_str(), (*server)->port(), static_cast<long>(snap.pages_total),
               static_cast<long>(page_size), static_cast<long>(max_running), static_cast<long>(max_queued_requests),
               static_cast<long>(max_queued_tokens), static_cast<long>(max_queue_time_ms));
  std::fflush(stderr);

  ServeSignals::Event ev;
  while (ev.kind == ServeSignals::Kind::kNone) ev = signals.Next(std::chrono::milliseconds(-1));
  return Shutdown(signals, ev, **server, **async, std::chrono::seconds(drain_timeout_s));
}

}  // namespace strata::cli

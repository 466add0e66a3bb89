// Router: the front end of `strata router`. It takes OpenAI requests on its
// own HTTP server (server/http_server.h) and relays each one to a worker
// chosen by a policy (policy.h): a colocated `strata serve` (--worker), or in
// PD mode a prefill and a decode server (--prefill, --decode) at once, with
// the body rewritten as docs/architecture/disagg.md fixes. Responses stream
// back to the client as they arrive (upstream_client.h).
//
//   POST /v1/completions, /v1/chat/completions   admission (admission.h), a
//        policy pick, retries; PD: both roles, the decode's answer streamed
//   GET  /health     200 while a worker (PD: a prefill and a decode) is healthy
//   GET  /metrics    the router's Prometheus text (strata_router_*)
//   GET  /workers    every worker's state as JSON (health, breaker, load)
//   GET  /v1/models  and every other path: relayed to a healthy worker (PD: a decode)
//
// Health: every health_check_interval each worker gets GET /health (and, when
// that passes, GET /load; prefill and decode servers GET /server_info too);
// health_failure_threshold failed checks in a row take a worker out,
// health_success_threshold passes bring it back (the first pass after start
// counts as enough). Real requests feed a circuit breaker per worker
// (breaker.h). Retries: a 503 or a connection failure, only before any byte
// reached the client, on a worker not yet tried, at most max_retries times.
// A client that goes away cancels its upstream requests at once (the worker
// sees its client close and aborts).
//
// Ownership: the router owns its HTTP server, its upstream client (one I/O
// thread, which also runs the health checks) and its metrics registry.
// Thread-safety: Start/BeginDrain/Stop from one controlling thread; the rest
// from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "metrics/metrics.h"
#include "router/admission.h"
#include "router/breaker.h"
#include "router/policy.h"
#include "server/http_server.h"
#include "util/status.h"

namespace strata::router {

struct RouterOptions {
  std::vector<std::string> workers;   // colocated workers' URLs
  std::vector<std::string> prefills;  // PD mode: both prefills and decodes
  std::vector<std::string> decodes;
  PolicyOptions policy;        // for colocated workers, and PD roles by default
  std::string prefill_policy;  // PD: "" = policy.name
  std::string decode_policy;   // PD: "" = policy.name
  AdmissionLimits admission;
  std::chrono::milliseconds max_queue_time{60'000};  // 0: queued requests wait without limit
  std::chrono::milliseconds health_check_interval{2'000};
  std::chrono::milliseconds health_check_timeout{2'000};
  int64_t health_failure_threshold = 3;
  int64_t health_success_threshold = 2;
  BreakerOptions breaker;
  int64_t max_retries = 5;
  std::chrono::milliseconds request_timeout{1'800'000};  // one upstream request, whole
  std::chrono::milliseconds connect_timeout{3'000};
  // Non-empty: clients need `Authorization: Bearer <api_key>` on /v1/*. The
  // client's Authorization header is forwarded to workers either way.
  std::string api_key;
  HttpServerOptions http;
  uint64_t seed = 0;  // rooms, request ids, the random policy (0: random_device)
};

// Checks the options (URLs, policy names, thresholds, one mode); the first
// problem as InvalidArgument naming the flag and the fix.
Status ValidateRouterOptions(const RouterOptions& options);

struct WorkerStatus {
  std::string url;
  std::string role;  // "colocated", "prefill", "decode"
  bool healthy = false;
  BreakerState breaker = BreakerState::kClosed;
  int64_t load = 0;  // the estimate the policies see
  int64_t in_flight = 0;
  int bootstrap_port = 0;  // prefill: from its /server_info
};

class Router {
 public:
  // `http`: an already-bound, not yet started transport created with
  // options.http (+ api_key); null: one is created. The options must pass
  // ValidateRouterOptions.
  static StatusOr<std::unique_ptr<Router>> Create(RouterOptions options,
                                                  std::unique_ptr<HttpServer> http = nullptr);
  ~Router();  // Stop()

  // Runs the first round of health checks, waiting up to the check timeout
  // for it, then serves.
  Status Start();
  int port() const;
  // /health turns 503; new generation requests get 503 "draining"; those
  // admitted or queued go on.
  void BeginDrain();
  // Generation requests admitted or queued, plus relayed requests in progress.
  int64_t in_flight() const;
  void Stop();

  std::vector<WorkerStatus> Workers() const;
  metrics::Registry& registry();

  struct Impl;

 private:
  explicit Router(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace strata::router

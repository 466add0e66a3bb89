// Internals of the router (router.h is its public face), shared by
// router.cc (the front end, health checks, metrics) and exchange.cc (one
// client request and its upstream hops): the router's state, its workers, and
// the exchange state machine. Only those two files include this.
//
// Locking: an exchange's mutex is taken before a worker's, never the other
// way round; a worker's lock is held only for its own fields (health, load,
// breaker, the exchanges open there).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/request_body.h"
#include "router/router.h"
#include "router/upstream_client.h"

namespace strata::router {

using Clock = std::chrono::steady_clock;

enum class Role { kColocated, kPrefill, kDecode };
inline const char* RoleName(Role r) {
  switch (r) {
    case Role::kColocated:
      return "colocated";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
  }
  return "?";
}

// An OpenAI-shaped error the router itself gives.
struct RouterError {
  int status = 503;
  std::string type = "overloaded";
  std::string code;
  std::string message;
  bool retry_after = false;
};

struct Router::Impl : std::enable_shared_from_this<Router::Impl> {
  struct Exchange;
  struct Worker {
    Endpoint ep;
    Role role = Role::kColocated;
    mutable std::mutex mu;
    bool healthy = false;
    bool ever_healthy = false;
    int64_t fails = 0, passes = 0;
    CircuitBreaker breaker;
    int64_t reported_load = 0;
    int64_t in_flight_at_report = 0;
    int bootstrap_port = 0;
    std::string instance_id;
    bool info_known = false;
    bool warned_role = false;
    bool checking = false;  // a check is in flight (I/O thread only)
    std::atomic<int64_t> in_flight{0};
    metrics::Gauge* healthy_gauge = nullptr;
    metrics::Gauge* breaker_gauge = nullptr;
    metrics::Gauge* in_flight_gauge = nullptr;
    metrics::Gauge* load_gauge = nullptr;
    metrics::Histogram* seconds = nullptr;
    // Exchanges with a request open here (guarded by mu): failed over when
    // the health checks take this worker out, so a worker that stalls
    // (SIGSTOP, a hung process) does not hold them until the request timeout.
    std::unordered_map<Exchange*, std::weak_ptr<Exchange>> open;

    int64_t Load() const {  // REQUIRES: mu held
      return reported_load + std::max<int64_t>(0, in_flight.load() - in_flight_at_report);
    }
    void PublishBreaker() { breaker_gauge->Set(static_cast<double>(breaker.state())); }
  };

  RouterOptions options;
  bool pd = false;
  std::unique_ptr<UpstreamClient> client;  // before http: the transport goes first
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<metrics::Registry> registry;
  std::vector<std::unique_ptr<Worker>> workers;
  std::unique_ptr<Policy> policy;          // colocated
  std::unique_ptr<Policy> prefill_policy;  // PD
  std::unique_ptr<Policy> decode_policy;   // PD
  RouterAdmission admission;
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> relaying{0};  // non-generation requests in progress
  std::atomic<uint64_t> next_id{1};
  std::mutex rng_mu;
  std::mt19937_64 rng;

  metrics::Family<metrics::Counter>* requests_total = nullptr;
  metrics::Family<metrics::Counter>* rejected_total = nullptr;
  metrics::Counter* retries_total = nullptr;

  explicit Impl(RouterOptions o)
      : options(std::move(o)),
        admission(options.admission),
        rng(options.seed ? options.seed : std::random_device{}()) {}

  Status Init();
  void Route();
  void HandleProxy(HttpRequest&& req, std::shared_ptr<HttpResponder> res, bool generation);
  void HandleHealth(HttpResponder& res);
  void HandleWorkers(HttpResponder& res);

  // Health checks (I/O thread).
  void ScheduleChecks(std::chrono::milliseconds delay);
  void CheckWorker(Worker& w, std::function<void()> done);
  void OnCheck(Worker& w, bool pass, const std::string& why);
  void OnCheckLocked(Worker& w, bool pass, const std::string& why,
                     std::vector<std::shared_ptr<Exchange>>* lost);

  std::vector<Candidate> Candidates(Role role, const std::vector<int>& exclude);
  void CountHop(Worker& w, const char* outcome) { requests_total->Get({w.ep.url, outcome}).Inc(); }
  void Reject(HttpResponder& res, const RouterError& e, const std::string& request_id);
  uint64_t Rand() {
    std::lock_guard lock(rng_mu);
    return rng();
  }
  std::string NewRequestId(std::string_view client_id) {
    std::lock_guard lock(rng_mu);
    return MakeRequestId(client_id, rng);
  }
  uint64_t NewRoom() {
    std::lock_guard lock(rng_mu);
    return DrawRoom(rng);
  }
};

// One client request and its upstream hops. Guarded by mu; handlers of an
// attempt that has been replaced (a retry) see a stale `gen` and do nothing.
struct Router::Impl::Exchange : std::enable_shared_from_this<Exchange> {
  struct Hop {
    int worker = -1;
    std::shared_ptr<UpstreamCall> call;
    Clock::time_point start;
    bool active = false;  // sent and not yet ended (EndHop)
    bool head = false;
    int status = 0;
    HttpHeaders headers;
    std::string body;
    bool stream = false;  // relaying piece by piece (committed)
    std::string tail;     // the last bytes relayed (to spot the SSE end)
    UpstreamError error = UpstreamError::kNone;
    std::string detail;
    bool done = false;  // its on_done ran
  };

  Impl& r;
  std::shared_ptr<Impl> keep;  // the router outlives its exchanges' handlers
  uint64_t id = 0;
  std::string request_id;
  std::string method, target;
  HttpHeaders forward;  // headers sent upstream
  std::string body;
  bool generation = false;
  std::shared_ptr<HttpResponder> res;
  Clock::time_point arrival;
  std::string prefix_text;
  // The worker instance whose response store holds what this request refers
  // to (ReferencedResponseId): Dispatch sends it there while that worker is
  // healthy. "" none.
  std::string pin_instance;
  std::optional<ojson> parsed;  // PD: the body to add the fields to

  std::mutex mu;
  bool done = false;
  bool holds_slot = false;
  bool queued = false;
  bool committed = false;  // a byte reached the client
  int attempts = 0;
  uint64_t gen = 0;
  std::vector<int> failed;  // workers that failed this request (not tried again)
  Hop main;                 // the colocated worker, or the decode
  Hop prefill;              // PD only
  bool decode_failed_waiting = false;
  // The last retryable failure, relayed if no worker is left to try.
  std::optional<Hop> last_failure;

  explicit Exchange(Impl& impl) : r(impl), keep(impl.shared_from_this()) {}

  // All REQUIRE mu held.
  void Dispatch();
  void StartHop(Hop& hop, int worker, std::string hop_body, bool is_prefill);
  void EndHop(Hop& hop, const char* outcome, std::optional<bool> success);
  void CancelHop(Hop& hop, const char* outcome);
  bool CanRetry() const { return !done && !committed && attempts <= r.options.max_retries; }
  void Retry(Hop& failed_hop, const std::string& why);
  void Finish();
  void SendError(const RouterError& e);
  void SendWhole(const Hop& hop);
  void RelayFailure(const Hop& hop, const char* who);

  void OnHead(uint64_t g, bool is_prefill, UpstreamResponseHead head);
  void OnBody(uint64_t g, bool is_prefill, std::string piece);
  void OnDone(uint64_t g, bool is_prefill, UpstreamError e, std::string detail);
  void Done(bool is_prefill, UpstreamError e, std::string detail);  // REQUIRES: mu held
  void OnWorkerLost(int worker, const std::string& why);
  void OnClientGone();
  void OnPrefillGrace(uint64_t g);
};

}  // namespace strata::router

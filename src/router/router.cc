#include "router/router.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <unordered_map>

#include "router/request_body.h"
#include "router/upstream_client.h"
#include "util/logging.h"

namespace strata::router {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// Non-streaming answers up to this size are relayed whole, with the
// worker's Content-Length (a colocated server writes them in one piece at
// the end anyway); larger ones and every chunked (SSE) body stream through.
constexpr size_t kRelayWholeBytes = 4 << 20;
// PD: after the decode fails before its first byte, how long the router
// waits for the prefill's answer, which says better what went wrong.
constexpr auto kPrefillGrace = std::chrono::milliseconds(2'000);

enum class Role { kColocated, kPrefill, kDecode };
const char* RoleName(Role r) {
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

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Headers of a worker's response that the client gets: all but hop-by-hop
// ones (the router's transport frames the body itself).
HttpHeaders ClientHeaders(const HttpHeaders& upstream, const std::string& request_id) {
  static const char* const kHop[] = {
      "connection", "keep-alive", "transfer-encoding", "content-length",    "te",
      "trailer",    "upgrade",    "proxy-connection",  "proxy-authenticate"};
  HttpHeaders out;
  bool has_id = false;
  for (const auto& [k, v] : upstream) {
    bool hop = false;
    for (const char* h : kHop) hop = hop || IEquals(k, h);
    if (hop) continue;
    has_id = has_id || IEquals(k, "x-request-id");
    out.emplace_back(k, v);
  }
  if (!has_id) out.emplace_back("X-Request-Id", request_id);
  return out;
}

std::string HeaderOf(const HttpHeaders& h, std::string_view name) {
  for (const auto& [k, v] : h)
    if (IEquals(k, name)) return v;
  return "";
}

// An OpenAI-shaped error the router itself gives.
struct RouterError {
  int status = 503;
  std::string type = "overloaded";
  std::string code;
  std::string message;
  bool retry_after = false;
};

std::string SseErrorEvent(const std::string& message, const std::string& code) {
  return "data: " + HttpErrorJson(message, "server_error", code) + "\n\n";
}

}  // namespace

Status ValidateRouterOptions(const RouterOptions& o) {
  const bool pd = !o.prefills.empty() || !o.decodes.empty();
  if (!o.workers.empty() && pd)
    return InvalidArgument(
        "--worker cannot be combined with --prefill/--decode: run colocated workers (--worker) or "
        "PD pairs (--prefill and --decode), not both");
  if (!pd && o.workers.empty())
    return InvalidArgument(
        "no workers: give --worker URL (a `strata serve`) one or more times, or --prefill URL and "
        "--decode URL for PD disaggregation");
  if (pd && (o.prefills.empty() || o.decodes.empty()))
    return InvalidArgument(std::string("PD mode needs at least one --prefill and one --decode; ") +
                           (o.prefills.empty() ? "--prefill" : "--decode") + " is missing");
  std::vector<std::string> seen;
  auto check_urls = [&](const std::vector<std::string>& urls, const char* flag) -> Status {
    for (const std::string& u : urls) {
      auto e = ParseWorkerUrl(u);
      if (!e.ok()) return InvalidArgument(std::string("--") + flag + ": " + e.status().message());
      if (std::find(seen.begin(), seen.end(), e->url) != seen.end())
        return InvalidArgument(std::string("--") + flag + ": " + e->url +
                               " is given twice: list each worker once");
      seen.push_back(e->url);
    }
    return OkStatus();
  };
  RETURN_IF_ERROR(check_urls(o.workers, "worker"));
  RETURN_IF_ERROR(check_urls(o.prefills, "prefill"));
  RETURN_IF_ERROR(check_urls(o.decodes, "decode"));
  for (auto [flag, name] : {std::pair<const char*, std::string>{"policy", o.policy.name},
                            {"prefill-policy", o.prefill_policy},
                            {"decode-policy", o.decode_policy}}) {
    if (name.empty() && std::string(flag) != "policy") continue;
    PolicyOptions p = o.policy;
    p.name = name;
    if (auto made = Policy::Create(p); !made.ok())
      return InvalidArgument(std::string("--") + flag + ": " + made.status().message());
  }
  if (o.policy.balance_rel_threshold < 1)
    return InvalidArgument(
        "--balance-rel-threshold: " + std::to_string(o.policy.balance_rel_threshold) +
        " is below 1 (it is a ratio of loads: 1.5 means 50% above the least)");
  if (o.health_check_timeout > o.health_check_interval)
    return InvalidArgument(
        "--health-check-timeout-ms (" + std::to_string(o.health_check_timeout.count()) +
        ") exceeds --health-check-interval-ms (" + std::to_string(o.health_check_interval.count()) +
        "): checks would overlap; lower the timeout or raise the interval");
  if (o.admission.max_concurrent_requests == 0 && o.admission.max_queued_requests > 0)
    return InvalidArgument(
        "--max-queued-requests needs --max-concurrent-requests > 0 (requests queue only behind the "
        "concurrency limit); set both, or --max-queued-requests 0");
  return OkStatus();
}

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

// ---- Exchange ---------------------------------------------------------------

void Router::Impl::Exchange::Dispatch() {
  ++gen;
  ++attempts;
  if (!r.pd) {
    std::vector<Candidate> c = r.Candidates(Role::kColocated, failed);
    if (c.empty()) {
      if (last_failure) return RelayFailure(*last_failure, "the last worker tried");
      return SendError({503, "overloaded", "no_healthy_worker",
                        "no healthy worker can take the request now (see the router's /workers)",
                        true});
    }
    const int w = generation ? r.policy->Pick(c, prefix_text)
                             : c[static_cast<size_t>(r.Rand() % c.size())].worker;
    StartHop(main, w, body, false);
    return;
  }
  std::vector<Candidate> pc = r.Candidates(Role::kPrefill, failed);
  std::vector<Candidate> dc = r.Candidates(Role::kDecode, failed);
  if (!generation) {  // relayed requests (/v1/models, ...) go to a decode
    if (dc.empty()) {
      if (last_failure) return RelayFailure(*last_failure, "the last decode server tried");
      return SendError({503, "overloaded", "no_healthy_worker",
                        "no healthy decode server can take the request now", true});
    }
    StartHop(main, dc[static_cast<size_t>(r.Rand() % dc.size())].worker, body, false);
    return;
  }
  if (pc.empty() || dc.empty()) {
    if (last_failure) return RelayFailure(*last_failure, "the last PD pair tried");
    return SendError({503, "overloaded", "no_healthy_worker",
                      std::string("no healthy ") + (pc.empty() ? "prefill" : "decode") +
                          " server can take the request now (see the router's /workers)",
                      true});
  }
  const int p = r.prefill_policy->Pick(pc, prefix_text);
  const int d = r.decode_policy->Pick(dc, prefix_text);
  Worker& pw = *r.workers[static_cast<size_t>(p)];
  int bootstrap_port;
  {
    std::lock_guard lock(pw.mu);
    bootstrap_port = pw.bootstrap_port;
  }
  const uint64_t room = r.NewRoom();
  const std::string rewritten = WithBootstrapFields(*parsed, pw.ep.host, bootstrap_port, room);
  STRATA_LOG(DEBUG) << "router: request " << request_id << " room " << room << ": prefill "
                    << pw.ep.url << ", decode " << r.workers[static_cast<size_t>(d)]->ep.url;
  decode_failed_waiting = false;
  StartHop(prefill, p, rewritten, true);
  StartHop(main, d, rewritten, false);
}

void Router::Impl::Exchange::StartHop(Hop& hop, int worker, std::string hop_body, bool is_prefill) {
  Worker& w = *r.workers[static_cast<size_t>(worker)];
  hop = Hop{};
  hop.worker = worker;
  hop.start = Clock::now();
  hop.active = true;
  {
    std::lock_guard lock(w.mu);
    w.breaker.OnSend();
    w.PublishBreaker();
    w.open[this] = weak_from_this();
  }
  w.in_flight_gauge->Set(static_cast<double>(++w.in_flight));
  UpstreamRequest up;
  up.method = method;
  up.target = target;
  up.headers = forward;
  up.body = std::move(hop_body);
  up.timeout = r.options.request_timeout;
  UpstreamHandlers h;
  auto self = shared_from_this();
  const uint64_t g = gen;
  h.on_head = [self, g, is_prefill](UpstreamResponseHead head) {
    self->OnHead(g, is_prefill, std::move(head));
  };
  h.on_body = [self, g, is_prefill](std::string piece) {
    self->OnBody(g, is_prefill, std::move(piece));
  };
  h.on_done = [self, g, is_prefill](UpstreamError e, std::string detail) {
    self->OnDone(g, is_prefill, e, std::move(detail));
  };
  hop.call = r.client->Start(w.ep, std::move(up), std::move(h));
}

// Once per hop: the worker's counts, metrics and breaker. `success`: what the
// outcome says about the worker (nullopt: nothing, e.g. cancelled by us).
void Router::Impl::Exchange::EndHop(Hop& hop, const char* outcome, std::optional<bool> success) {
  if (!hop.active) return;
  hop.active = false;
  Worker& w = *r.workers[static_cast<size_t>(hop.worker)];
  w.in_flight_gauge->Set(static_cast<double>(--w.in_flight));
  r.CountHop(w, outcome);
  if (success) w.seconds->Observe(std::chrono::duration<double>(Clock::now() - hop.start).count());
  std::lock_guard lock(w.mu);
  w.open.erase(this);
  const BreakerState before = w.breaker.state();
  if (success)
    w.breaker.Record(*success, Clock::now());
  else
    w.breaker.Forget();
  w.PublishBreaker();
  if (w.breaker.state() != before)
    STRATA_LOG(WARN) << "router: worker " << w.ep.url << " circuit breaker "
                     << BreakerStateName(before) << " -> " << BreakerStateName(w.breaker.state())
                     << " (request " << request_id << ": " << outcome << ")";
}

void Router::Impl::Exchange::CancelHop(Hop& hop, const char* outcome) {
  if (!hop.active) return;
  if (hop.call) hop.call->Cancel();
  EndHop(hop, outcome, std::nullopt);
}

void Router::Impl::Exchange::Finish() {
  if (done) return;
  done = true;
  STRATA_LOG(DEBUG) << "router: request " << request_id << " " << method << " " << target
                    << " done in " << std::chrono::duration<double>(Clock::now() - arrival).count()
                    << " s after " << attempts << " attempt(s)";
  if (holds_slot) {
    holds_slot = false;
    // Off this lock: the freed slot starts the next queued request, which
    // takes its own exchange's lock.
    std::weak_ptr<Impl> impl = keep;
    r.client->After(std::chrono::milliseconds(0), [impl] {
      if (auto p = impl.lock()) p->admission.Release();
    });
  }
  if (!generation) --r.relaying;
}

void Router::Impl::Exchange::SendError(const RouterError& e) {
  if (done) return;
  HttpHeaders h = {{"Content-Type", "application/json"}, {"X-Request-Id", request_id}};
  if (e.retry_after) h.emplace_back("Retry-After", "1");
  res->Send(e.status, std::move(h), HttpErrorJson(e.message, e.type, e.code));
  Finish();
}

void Router::Impl::Exchange::SendWhole(const Hop& hop) {
  if (done) return;
  res->Send(hop.status, ClientHeaders(hop.headers, request_id), hop.body);
  committed = true;
  Finish();
}

// The answer of a hop that failed (its error response, or ours for a
// transport failure) when nothing better is left.
void Router::Impl::Exchange::RelayFailure(const Hop& hop, const char* who) {
  if (hop.error == UpstreamError::kNone && hop.head) return SendWhole(hop);
  const std::string url = r.workers[static_cast<size_t>(hop.worker)]->ep.url;
  if (hop.error == UpstreamError::kTimeout)
    return SendError({504, "server_error", "upstream_timeout",
                      std::string(who) + " (" + url + ") timed out: " + hop.detail, false});
  SendError({502, "server_error", "upstream_unreachable",
             std::string(who) + " (" + url + ") failed: " + hop.detail, true});
}

void Router::Impl::Exchange::Retry(Hop& failed_hop, const std::string& why) {
  failed.push_back(failed_hop.worker);
  last_failure = failed_hop;
  CancelHop(main, "cancelled");
  CancelHop(prefill, "cancelled");
  r.retries_total->Inc();
  STRATA_LOG(WARN) << "router: request " << request_id << ": "
                   << r.workers[static_cast<size_t>(failed_hop.worker)]->ep.url << " " << why
                   << "; retrying elsewhere (attempt " << attempts + 1 << " of at most "
                   << r.options.max_retries + 1 << ")";
  Dispatch();
}

void Router::Impl::Exchange::OnHead(uint64_t g, bool is_prefill, UpstreamResponseHead head) {
  std::lock_guard lock(mu);
  if (done || g != gen) return;
  Hop& hop = is_prefill ? prefill : main;
  hop.head = true;
  hop.status = head.status;
  hop.headers = std::move(head.headers);
  if (is_prefill) return;  // its answer is read whole
  const bool whole =
      head.status == 503 || (head.content_length && *head.content_length <= kRelayWholeBytes);
  if (whole) return;
  // Streamed through from here: the client has the head, so no retry.
  hop.stream = true;
  committed = true;
  res->StartStream(hop.status, ClientHeaders(hop.headers, request_id));
}

void Router::Impl::Exchange::OnBody(uint64_t g, bool is_prefill, std::string piece) {
  std::lock_guard lock(mu);
  if (done || g != gen) return;
  Hop& hop = is_prefill ? prefill : main;
  if (hop.stream) {
    hop.tail = (hop.tail + piece.substr(piece.size() > 32 ? piece.size() - 32 : 0));
    if (hop.tail.size() > 32) hop.tail.erase(0, hop.tail.size() - 32);
    res->Write(std::move(piece));
  } else if (hop.body.size() < kRelayWholeBytes + (1 << 20)) {
    hop.body += piece;
  }
}

void Router::Impl::Exchange::OnDone(uint64_t g, bool is_prefill, UpstreamError e,
                                    std::string detail) {
  std::lock_guard lock(mu);
  const Hop& hop = is_prefill ? prefill : main;
  // A stale attempt, or a hop already ended here (cancelled, failed over).
  if (g != gen || !hop.active) return;
  Done(is_prefill, e, std::move(detail));
}

// The worker of an open hop failed its health checks: that hop fails now as
// if its connection had (retried elsewhere when nothing reached the client
// yet; a stream in progress ends with an error event).
void Router::Impl::Exchange::OnWorkerLost(int worker, const std::string& why) {
  std::lock_guard lock(mu);
  for (bool is_prefill : {false, true}) {
    Hop& hop = is_prefill ? prefill : main;
    if (!hop.active || hop.worker != worker) continue;
    if (hop.call) hop.call->Cancel();
    Done(is_prefill, UpstreamError::kConnect, why);
  }
}

void Router::Impl::Exchange::Done(bool is_prefill, UpstreamError e, std::string detail) {
  Hop& hop = is_prefill ? prefill : main;
  hop.done = true;
  hop.error = e;
  hop.detail = std::move(detail);
  // What the hop says about its worker.
  const char* outcome = "error";
  std::optional<bool> healthy_worker;
  switch (e) {
    case UpstreamError::kNone:
      outcome = hop.status < 400    ? "ok"
                : hop.status < 500  ? "client_error"
                : hop.status == 503 ? "overloaded"
                                    : "error";
      // A 503 is shedding on purpose, a 502 names a failure of the other PD
      // role: neither is this worker broken.
      healthy_worker = hop.status < 500 || hop.status == 502 || hop.status == 503;
      break;
    case UpstreamError::kConnect:
      outcome = "unreachable";
      healthy_worker = false;
      break;
    case UpstreamError::kTimeout:
      outcome = "timeout";
      healthy_worker = false;
      break;
    case UpstreamError::kBroken:
      outcome = "broken";
      healthy_worker = false;
      break;
  }
  EndHop(hop, outcome, healthy_worker);
  if (done) return;  // e.g. PD: the decode already answered the client

  const bool retryable =
      e == UpstreamError::kConnect || (e == UpstreamError::kNone && hop.status == 503);
  const Worker& w = *r.workers[static_cast<size_t>(hop.worker)];

  if (is_prefill) {
    if (e == UpstreamError::kNone && hop.status < 300) {
      if (decode_failed_waiting) RelayFailure(main, "the decode server");
      return;
    }
    if (committed) return;  // the decode's stream carries on and ends with its own error
    // The prefill failed before the decode sent a byte: its answer is the one.
    STRATA_LOG(WARN) << "router: request " << request_id << ": prefill " << w.ep.url
                     << " failed before the decode answered: "
                     << (e == UpstreamError::kNone ? "HTTP " + std::to_string(hop.status)
                                                   : hop.detail);
    if (retryable && CanRetry()) return Retry(hop, "(prefill) refused or unreachable");
    CancelHop(main, "cancelled");
    return RelayFailure(hop, "the prefill server");
  }

  if (hop.stream) {  // committed: the client has the head and part of the body
    if (e != UpstreamError::kNone) {
      STRATA_LOG(WARN) << "router: request " << request_id << ": " << w.ep.url
                       << " broke off mid-stream: " << hop.detail;
      if (HeaderOf(hop.headers, "content-type").find("text/event-stream") != std::string::npos) {
        res->Write(
            SseErrorEvent("the worker's stream broke off: " + hop.detail,
                          e == UpstreamError::kTimeout ? "upstream_timeout" : "upstream_broken"));
        res->End();
      }
      // Other bodies: dropping the responder unfinished cuts the connection,
      // so the client sees a truncated body, not a clean end.
    } else {
      res->End();
    }
    return Finish();
  }

  const bool ok =
      e == UpstreamError::kNone && hop.status != 503 && (!r.pd || !generation || hop.status < 300);
  if (ok) return SendWhole(hop);
  if ((retryable || (e == UpstreamError::kBroken && !committed)) && CanRetry())
    return Retry(hop, e == UpstreamError::kNone ? "answered 503" : "failed: " + hop.detail);
  if (r.pd && generation && prefill.active && !retryable) {
    // The decode failed first; the prefill's answer (soon: the decode told it)
    // usually names the cause. Wait a little for it.
    decode_failed_waiting = true;
    std::weak_ptr<Exchange> weak = shared_from_this();
    const uint64_t my_gen = gen;
    r.client->After(kPrefillGrace, [weak, my_gen] {
      if (auto ex = weak.lock()) ex->OnPrefillGrace(my_gen);
    });
    return;
  }
  RelayFailure(hop, r.pd ? "the decode server" : "the worker");
}

void Router::Impl::Exchange::OnPrefillGrace(uint64_t g) {
  std::lock_guard lock(mu);
  if (done || g != gen || !decode_failed_waiting) return;
  CancelHop(prefill, "cancelled");
  RelayFailure(main, "the decode server");
}

void Router::Impl::Exchange::OnClientGone() {
  std::lock_guard lock(mu);
  if (done) return;
  STRATA_LOG(DEBUG) << "router: request " << request_id
                    << ": the client went away; closing its upstream requests";
  if (queued && r.admission.Cancel(id)) queued = false;
  // A client that closes right after the stream's last event (openai-node
  // does, on `data: [DONE]`) got its whole answer: ok, though the worker's
  // end of the chunked body had not reached the router yet.
  if (main.active && main.stream && main.tail.find("data: [DONE]\n\n") != std::string::npos) {
    main.call->Cancel();
    EndHop(main, "ok", true);
  }
  CancelHop(main, "aborted");
  CancelHop(prefill, "aborted");
  Finish();
}

// ---- Router::Impl -----------------------------------------------------------

Status Router::Impl::Init() {
  RETURN_IF_ERROR(ValidateRouterOptions(options));
  pd = !options.prefills.empty();
  ASSIGN_OR_RETURN(registry, metrics::Registry::Create({}));
  RETURN_IF_ERROR(metrics::AddBuildInfo(*registry));
  ASSIGN_OR_RETURN(
      requests_total,
      registry->AddCounter(
          "strata_router_requests_total",
          "Requests the router sent to each worker, by outcome: ok, client_error "
          "(4xx), overloaded (503), error (other 5xx), unreachable, timeout, broken "
          "(cut mid-body), aborted (client gone), cancelled (by the router: a retry or "
          "the other PD role failed); no_worker on worker=\"none\".",
          {"worker", "outcome"}));
  ASSIGN_OR_RETURN(rejected_total,
                   registry->AddCounter("strata_router_rejected_requests_total",
                                        "Requests the router's admission control refused with "
                                        "503, by the limit: max_concurrent_requests, "
                                        "max_queued_requests, max_queue_time, draining.",
                                        {"reason"}));
  for (const char* reason :
       {"max_concurrent_requests", "max_queued_requests", "max_queue_time", "draining"})
    rejected_total->Get({reason});
  ASSIGN_OR_RETURN(auto* retries, registry->AddCounter(
                                      "strata_router_retries_total",
                                      "Requests sent again to another worker after a 503 or a "
                                      "connection failure (before any byte reached the client)."));
  retries_total = &retries->Get();
  ASSIGN_OR_RETURN(auto* healthy,
                   registry->AddGauge("strata_router_worker_healthy",
                                      "1 while the worker passes its health checks.", {"worker"}));
  ASSIGN_OR_RETURN(
      auto* breaker,
      registry->AddGauge("strata_router_breaker_state",
                         "Each worker's circuit breaker: 0 closed, 1 half-open, 2 open.",
                         {"worker"}));
  ASSIGN_OR_RETURN(auto* inflight,
                   registry->AddGauge("strata_router_worker_in_flight_requests",
                                      "Requests the router has open at each worker.", {"worker"}));
  ASSIGN_OR_RETURN(auto* load,
                   registry->AddGauge("strata_router_worker_load",
                                      "Each worker's running + queued requests, from its GET "
                                      "/load at the last health check.",
                                      {"worker"}));
  ASSIGN_OR_RETURN(auto* seconds,
                   registry->AddHistogram("strata_router_request_seconds",
                                          "Time of each request to a worker, from sending it to "
                                          "the last byte of the answer.",
                                          {"worker"}));
  RETURN_IF_ERROR(registry->AddCallbackGauge(
      "strata_router_queued_requests",
      "Generation requests waiting at the router for a slot (--max-concurrent-requests).",
      [this] { return static_cast<double>(admission.queued()); }));
  RETURN_IF_ERROR(registry->AddCallbackGauge(
      "strata_router_in_flight_requests",
      "Generation requests holding one of the router's slots (sent to workers, not yet answered).",
      [this] { return static_cast<double>(admission.running()); }));
  requests_total->Get({"none", "no_worker"});

  auto add = [&](const std::vector<std::string>& urls, Role role) {
    for (const std::string& u : urls) {
      auto w = std::make_unique<Worker>();
      w->ep = *ParseWorkerUrl(u);  // validated above
      w->role = role;
      w->breaker = CircuitBreaker(options.breaker);
      w->healthy_gauge = &healthy->Get({w->ep.url});
      w->breaker_gauge = &breaker->Get({w->ep.url});
      w->in_flight_gauge = &inflight->Get({w->ep.url});
      w->load_gauge = &load->Get({w->ep.url});
      w->seconds = &seconds->Get({w->ep.url});
      for (const char* o : {"ok", "overloaded", "error", "unreachable"})
        requests_total->Get({w->ep.url, o});
      workers.push_back(std::move(w));
    }
  };
  add(options.workers, Role::kColocated);
  add(options.prefills, Role::kPrefill);
  add(options.decodes, Role::kDecode);

  auto make_policy = [&](const std::string& name) -> StatusOr<std::unique_ptr<Policy>> {
    PolicyOptions p = options.policy;
    if (!name.empty()) p.name = name;
    return Policy::Create(p);
  };
  ASSIGN_OR_RETURN(policy, make_policy(""));
  ASSIGN_OR_RETURN(prefill_policy, make_policy(options.prefill_policy));
  ASSIGN_OR_RETURN(decode_policy, make_policy(options.decode_policy));

  UpstreamClientOptions co;
  co.connect_timeout = options.connect_timeout;
  client = UpstreamClient::Create(co);
  if (!http) {
    HttpServerOptions ho = options.http;
    ho.api_key = options.api_key;
    ASSIGN_OR_RETURN(http, HttpServer::Create(ho));
  }
  Route();
  return OkStatus();
}

void Router::Impl::Route() {
  http->Handle(
      "GET", "/health",
      [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) { HandleHealth(*res); },
      HttpAuth::kPublic);
  http->Handle(
      "GET", "/metrics",
      [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
        res->Send(200, {{"Content-Type", std::string(metrics::kContentType)}}, registry->Render());
      },
      HttpAuth::kPublic);
  http->Handle("GET", "/workers",
               [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) { HandleWorkers(*res); });
  for (const char* path : {"/v1/completions", "/v1/chat/completions"})
    http->Handle("POST", path, [this](HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
      HandleProxy(std::move(req), std::move(res), true);
    });
  http->SetFallback([this](HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
    HandleProxy(std::move(req), std::move(res), false);
  });
}

void Router::Impl::HandleHealth(HttpResponder& res) {
  int64_t colocated = 0, prefills = 0, decodes = 0;
  for (const auto& w : workers) {
    std::lock_guard lock(w->mu);
    if (!w->healthy) continue;
    if (w->role == Role::kColocated) ++colocated;
    if (w->role == Role::kPrefill && w->bootstrap_port > 0) ++prefills;
    if (w->role == Role::kDecode) ++decodes;
  }
  json j;
  if (pd) {
    j = {{"healthy_prefills", prefills}, {"healthy_decodes", decodes}};
  } else {
    j = {{"healthy_workers", colocated}};
  }
  const bool up = pd ? (prefills > 0 && decodes > 0) : colocated > 0;
  j["status"] = draining ? "draining" : up ? "ok" : "no_healthy_worker";
  res.SendJson(up && !draining ? 200 : 503, j.dump());
}

void Router::Impl::HandleWorkers(HttpResponder& res) {
  json arr = json::array();
  for (const auto& w : workers) {
    std::lock_guard lock(w->mu);
    json j = {{"url", w->ep.url},      {"role", RoleName(w->role)},
              {"healthy", w->healthy}, {"breaker", BreakerStateName(w->breaker.state())},
              {"load", w->Load()},     {"in_flight", w->in_flight.load()}};
    if (w->role == Role::kPrefill) j["bootstrap_port"] = w->bootstrap_port;
    if (!w->instance_id.empty()) j["instance_id"] = w->instance_id;
    arr.push_back(std::move(j));
  }
  res.SendJson(200, json{{"workers", arr}}.dump());
}

std::vector<Candidate> Router::Impl::Candidates(Role role, const std::vector<int>& exclude) {
  std::vector<Candidate> out;
  const auto now = Clock::now();
  for (size_t i = 0; i < workers.size(); ++i) {
    Worker& w = *workers[i];
    if (w.role != role) continue;
    if (std::find(exclude.begin(), exclude.end(), static_cast<int>(i)) != exclude.end()) continue;
    std::lock_guard lock(w.mu);
    if (!w.healthy || (role == Role::kPrefill && w.bootstrap_port <= 0)) continue;
    const bool can = w.breaker.CanSend(now);
    w.PublishBreaker();
    if (!can) continue;
    out.push_back(Candidate{static_cast<int>(i), w.Load()});
  }
  return out;
}

void Router::Impl::Reject(HttpResponder& res, const RouterError& e, const std::string& request_id) {
  HttpHeaders h = {{"Content-Type", "application/json"}, {"X-Request-Id", request_id}};
  if (e.retry_after) h.emplace_back("Retry-After", "1");
  res.Send(e.status, std::move(h), HttpErrorJson(e.message, e.type, e.code));
}

void Router::Impl::HandleProxy(HttpRequest&& req, std::shared_ptr<HttpResponder> res,
                               bool generation) {
  auto ex = std::make_shared<Exchange>(*this);
  ex->id = next_id++;
  ex->request_id = NewRequestId(req.Header("X-Request-Id"));
  ex->generation = generation;
  ex->method = req.method;
  ex->target = req.target;
  ex->arrival = Clock::now();
  ex->res = res;
  for (const char* name : {"Content-Type", "Authorization", "Accept"})
    if (auto v = req.Header(name); !v.empty()) ex->forward.emplace_back(name, std::string(v));
  ex->forward.emplace_back("X-Request-Id", ex->request_id);
  ex->body = std::move(req.body);

  if (generation && draining.load()) {
    rejected_total->Get({"draining"}).Inc();
    return Reject(*res,
                  {503, "overloaded", "draining",
                   "the router is shutting down and accepts no new requests", true},
                  ex->request_id);
  }
  if (generation && (pd || policy->wants_prefix())) {
    auto parsed = ParseBodyObject(ex->body);
    if (parsed.ok()) {
      ex->prefix_text = PromptText(*parsed);
      if (pd) ex->parsed = std::move(*parsed);
    } else if (pd) {
      return Reject(*res, {400, "invalid_request_error", "", parsed.status().message(), false},
                    ex->request_id);
    } else {
      ex->prefix_text = ex->body.substr(0, kAffinityBlockBytes * kAffinityMaxBlocks);
    }
  }
  if (!generation) ++relaying;

  std::weak_ptr<Exchange> weak = ex;
  res->OnClose([weak] {
    if (auto e = weak.lock()) e->OnClientGone();
  });
  // The responder holds the exchange through OnClose only weakly; the
  // exchange holds itself through its hops' handlers and the queue.
  std::lock_guard lock(ex->mu);
  if (ex->done) return;  // the client left already
  if (!generation) return ex->Dispatch();

  std::string limit;
  auto start = [ex] {
    std::lock_guard lock(ex->mu);
    ex->queued = false;
    ex->holds_slot = true;
    if (ex->done) {      // left while queued but after the slot was handed over
      ex->done = false;  // let Finish() give the slot on
      ex->Finish();
      return;
    }
    ex->Dispatch();
  };
  switch (admission.Acquire(ex->id, start, &limit)) {
    case RouterAdmission::Verdict::kAdmitted:
      ex->holds_slot = true;
      return ex->Dispatch();
    case RouterAdmission::Verdict::kQueued: {
      ex->queued = true;
      if (options.max_queue_time.count() > 0) {
        client->After(options.max_queue_time, [ex, this] {
          std::lock_guard lock(ex->mu);
          if (ex->done || !ex->queued || !admission.Cancel(ex->id)) return;
          ex->queued = false;
          rejected_total->Get({"max_queue_time"}).Inc();
          ex->SendError({503, "overloaded", "max_queue_time",
                         "the request waited " + std::to_string(options.max_queue_time.count()) +
                             " ms at the router for a slot (--max-queue-time-ms); retry later",
                         true});
        });
      }
      return;
    }
    case RouterAdmission::Verdict::kRejected:
      rejected_total->Get({limit}).Inc();
      ex->SendError(
          {503, "overloaded", limit,
           limit == "max_queued_requests"
               ? "the router has " + std::to_string(options.admission.max_concurrent_requests) +
                     " requests in flight and " +
                     std::to_string(options.admission.max_queued_requests) +
                     " queued (--max-concurrent-requests, --max-queued-requests); retry later"
               : "the router has " + std::to_string(options.admission.max_concurrent_requests) +
                     " requests in flight (--max-concurrent-requests); retry later",
           true});
      return;
  }
}

// ---- health checks ------------------------------------------------------------

void Router::Impl::ScheduleChecks(std::chrono::milliseconds delay) {
  std::weak_ptr<Impl> weak = shared_from_this();
  client->After(delay, [weak] {
    auto self = weak.lock();
    if (!self || self->stopped.load()) return;
    for (auto& w : self->workers)
      if (!w->checking) self->CheckWorker(*w, [] {});
    self->ScheduleChecks(self->options.health_check_interval);
  });
}

// I/O thread. GET /health; when it passes, GET /load and (PD roles, or once)
// GET /server_info. `done` runs when the check has ended.
void Router::Impl::CheckWorker(Worker& w, std::function<void()> done) {
  w.checking = true;
  auto self = shared_from_this();
  UpstreamRequest req;
  req.method = "GET";
  req.target = "/health";
  req.timeout = options.health_check_timeout;
  client->Fetch(w.ep, req, [self, &w, req, done](UpstreamClient::FetchResult h) mutable {
    if (h.error != UpstreamError::kNone || h.status != 200) {
      self->OnCheck(w, false,
                    h.error != UpstreamError::kNone
                        ? h.detail
                        : "GET /health answered " + std::to_string(h.status));
      w.checking = false;
      return done();
    }
    req.target = "/load";
    self->client->Fetch(w.ep, req, [self, &w, req, done](UpstreamClient::FetchResult l) mutable {
      if (l.error == UpstreamError::kNone && l.status == 200) {
        json j = json::parse(l.body, nullptr, false);
        if (j.is_object()) {
          std::lock_guard lock(w.mu);
          w.reported_load = j.value("running", int64_t{0}) + j.value("queued", int64_t{0});
          w.in_flight_at_report = w.in_flight.load();
          w.load_gauge->Set(static_cast<double>(w.reported_load));
        }
      }
      bool want_info;
      {
        std::lock_guard lock(w.mu);
        want_info = w.role != Role::kColocated || !w.info_known;
      }
      if (!want_info) {
        self->OnCheck(w, true, "");
        w.checking = false;
        return done();
      }
      req.target = "/server_info";
      self->client->Fetch(w.ep, req, [self, &w, done](UpstreamClient::FetchResult s) {
        json j = s.error == UpstreamError::kNone && s.status == 200
                     ? json::parse(s.body, nullptr, false)
                     : json();
        std::string problem;
        {
          std::lock_guard lock(w.mu);
          if (j.is_object()) {
            w.info_known = true;
            const std::string id = j.value("instance_id", "");
            if (!w.instance_id.empty() && id != w.instance_id)
              STRATA_LOG(WARN) << "router: worker " << w.ep.url << " was replaced (instance "
                               << w.instance_id << " -> " << id << ")";
            w.instance_id = id;
            const std::string role = j.value("role", "");
            if (role != RoleName(w.role) && !w.warned_role) {
              w.warned_role = true;
              STRATA_LOG(WARN) << "router: " << w.ep.url << " was given as a " << RoleName(w.role)
                               << " worker but its /server_info says role '" << role
                               << "'; start it with the matching --disaggregation-mode";
            }
            if (w.role == Role::kPrefill) {
              auto p = j.find("disaggregation_bootstrap_port");
              w.bootstrap_port = p != j.end() && p->is_number_integer() ? p->get<int>() : 0;
              if (w.bootstrap_port <= 0)
                problem =
                    "its /server_info has no disaggregation_bootstrap_port (not a prefill "
                    "server?)";
            }
          } else if (w.role == Role::kPrefill && w.bootstrap_port <= 0) {
            problem = "GET /server_info failed, so its bootstrap port is unknown";
          }
        }
        self->OnCheck(w, problem.empty(), problem);
        w.checking = false;
        done();
      });
    });
  });
}

void Router::Impl::OnCheck(Worker& w, bool pass, const std::string& why) {
  std::vector<std::shared_ptr<Exchange>> lost;
  OnCheckLocked(w, pass, why, &lost);
  // Outside the worker's lock (exchanges lock themselves, then workers).
  const int index = static_cast<int>(
      std::find_if(workers.begin(), workers.end(), [&](const auto& p) { return p.get() == &w; }) -
      workers.begin());
  for (auto& ex : lost)
    ex->OnWorkerLost(index, w.ep.url + " stopped passing its health checks (" + why + ")");
}

void Router::Impl::OnCheckLocked(Worker& w, bool pass, const std::string& why,
                                 std::vector<std::shared_ptr<Exchange>>* lost) {
  std::lock_guard lock(w.mu);
  if (pass) {
    w.fails = 0;
    ++w.passes;
    // The first pass after start is enough; after an outage, success_threshold.
    if (!w.healthy && (!w.ever_healthy || w.passes >= options.health_success_threshold)) {
      w.healthy = true;
      w.ever_healthy = true;
      STRATA_LOG(INFO) << "router: " << RoleName(w.role) << " worker " << w.ep.url << " is healthy";
    }
  } else {
    w.passes = 0;
    ++w.fails;
    if (w.healthy && w.fails >= options.health_failure_threshold) {
      w.healthy = false;
      w.info_known = false;  // ask /server_info again when it is back: it may be a new process
      for (auto& [ptr, weak] : w.open)
        if (auto ex = weak.lock()) lost->push_back(std::move(ex));
      STRATA_LOG(WARN) << "router: " << RoleName(w.role) << " worker " << w.ep.url
                       << " is unhealthy after " << w.fails << " failed checks (" << why << ")";
    } else if (!w.ever_healthy && w.fails == 1) {
      STRATA_LOG(WARN) << "router: " << RoleName(w.role) << " worker " << w.ep.url
                       << " is not healthy yet (" << why << ")";
    }
  }
  w.healthy_gauge->Set(w.healthy ? 1 : 0);
}

// ---- Router -----------------------------------------------------------------

StatusOr<std::unique_ptr<Router>> Router::Create(RouterOptions options,
                                                 std::unique_ptr<HttpServer> http) {
  auto impl = std::make_shared<Impl>(std::move(options));
  impl->http = std::move(http);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

Router::Router(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Router::~Router() { Stop(); }

Status Router::Start() {
  // The first round of checks, so that a router started next to healthy
  // workers serves its first request.
  auto left = std::make_shared<std::atomic<size_t>>(impl_->workers.size());
  auto mu = std::make_shared<std::mutex>();
  auto cv = std::make_shared<std::condition_variable>();
  for (auto& w : impl_->workers) {
    Impl::Worker* wp = w.get();
    impl_->client->After(std::chrono::milliseconds(0), [impl = impl_, wp, left, mu, cv] {
      impl->CheckWorker(*wp, [left, mu, cv] {
        std::lock_guard lock(*mu);
        if (--*left == 0) cv->notify_all();
      });
    });
  }
  {
    std::unique_lock lock(*mu);
    cv->wait_for(lock, impl_->options.health_check_timeout + std::chrono::milliseconds(500),
                 [&] { return left->load() == 0; });
  }
  impl_->ScheduleChecks(impl_->options.health_check_interval);
  return impl_->http->Start();
}

int Router::port() const { return impl_->http->port(); }

void Router::BeginDrain() { impl_->draining = true; }

int64_t Router::in_flight() const {
  return impl_->admission.running() + impl_->admission.queued() + impl_->relaying.load();
}

void Router::Stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->http->Stop();
  impl_->client->Stop();
}

std::vector<WorkerStatus> Router::Workers() const {
  std::vector<WorkerStatus> out;
  for (const auto& w : impl_->workers) {
    std::lock_guard lock(w->mu);
    out.push_back(WorkerStatus{w->ep.url, RoleName(w->role), w->healthy, w->breaker.state(),
                               w->Load(), w->in_flight.load(), w->bootstrap_port});
  }
  return out;
}

metrics::Registry& Router::registry() { return *impl_->registry; }

}  // namespace strata::router

// Router: options, the front end's routes, health checks, metrics, and the
// public methods (the request state machine is in exchange.cc).
#include "router/router.h"

#include <algorithm>
#include <condition_variable>
#include <nlohmann/json.hpp>

#include "router/router_impl.h"
#include "server/openai_responses.h"
#include "util/logging.h"

namespace strata::router {

using json = nlohmann::json;

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
  http->Handle("POST", "/v1/responses",
               [this](HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
                 if (pd)  // a conversation's store lives on one server; a PD pair has two roles
                   return Reject(*res,
                                 {400, "invalid_request_error", "unsupported_endpoint",
                                  "the Responses API is not served through a prefill/decode pair "
                                  "(its stored responses live on one server); use "
                                  "/v1/chat/completions, or colocated workers (--worker)",
                                  false},
                                 NewRequestId(req.Header("X-Request-Id")));
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
  const bool responses = ex->target.rfind("/v1/responses", 0) == 0;
  if (generation && (pd || policy->wants_prefix() || responses)) {
    auto parsed = ParseBodyObject(ex->body);
    if (parsed.ok() && responses) {
      const std::string id = ReferencedResponseId(ex->method, ex->target, &*parsed);
      ex->pin_instance = std::string(ResponseIdInstance(id));
    }
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
  if (!generation) {
    ++relaying;
    if (responses)  // GET / DELETE /v1/responses/{id}[/input_items]
      ex->pin_instance =
          std::string(ResponseIdInstance(ReferencedResponseId(ex->method, ex->target, nullptr)));
  }

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

// I/O thread. GET /health; when it passes, GET /load and GET /server_info. `done` runs when the
// check has ended.
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
      // /server_info every time, colocated workers too: its instance_id
      // tells a replaced process (whose stored responses are gone) and
      // names the worker inside its response ids (ReferencedResponseId).
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

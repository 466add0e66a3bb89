// strata serve: the OpenAI-compatible server (colocated prefill + decode).
//
// Startup order: parse the flags, read config.json and the host's memory
// facts, validate everything at once (cli/serve_config.h: exit 78, EX_CONFIG,
// every problem naming the flag, the allowed values and the fix, before any
// weight is read; the HiCache host tier is planned here), bind the listening
// socket (an address that cannot be bound is a configuration error too,
// found before the minutes a large model takes to load), then load weights
// and serve. Signals: see cli/signals.h (SIGTERM drains within --drain-timeout-s;
// a second one aborts what is left).
#include <arpa/inet.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cache/kv_layout.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/serve_config.h"
#include "cli/signals.h"
#include "disagg/pd_role.h"
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
int Shutdown(ServeSignals& signals, ServeSignals::Event first, OpenAiServer& server,
             AsyncEngine& engine, std::chrono::seconds drain_timeout) {
  using Clock = std::chrono::steady_clock;
  auto log = [](const std::string& text) {
    std::fprintf(stderr, "strata serve: %s\n", text.c_str());
    std::fflush(stderr);
  };
  const auto idle = [&] {
    return server.in_flight() == 0 && engine.WaitIdle(std::chrono::milliseconds(0));
  };
  int code = kExitOk;
  std::string why;
  if (first.kind == ServeSignals::Kind::kStopNow) {
    code = 128 + first.signo;
    why = first.name + ": stopping now";
  } else {
    log(first.name + ": draining (new requests get 503; " + std::to_string(server.in_flight()) +
        " in flight; they get up to " + std::to_string(drain_timeout.count()) +
        " s, see --drain-timeout-s)");
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
  ServeConfig c;
  FlagSet f = MakeServeFlagSet(&c);
  Status st = f.Parse(args);
  if (!st.ok()) return ConfigError(st.message());  // supervisors must not restart on this
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  RecordGivenFlags(f, &c);

  // Every problem of the flags and of the flags against the model's config
  // and this machine, before any weight is read (serve_config.h).
  std::string dir = c.model.model_path;
  if (dir.empty()) {
    auto d = EnsureDemoModel();
    if (!d.ok()) return Fail(cmd, d.status());
    dir = *d;
    std::fprintf(stderr,
                 "strata serve: no --model-path given; using the embedded demo model at %s\n",
                 dir.c_str());
    c.model.model_path = dir;
  }
  auto config = ReadModelConfig(dir);
  const ServeEnvironment env = ReadServeEnvironment(c, dir);
  const ServePlan plan = ValidateServeConfig(c, config.ok() ? &*config : nullptr, env);
  if (plan.problems.size() == 1) return ConfigError(plan.problems[0]);
  if (!plan.ok()) {
    std::fprintf(stderr, "strata serve: invalid configuration (%zu problems):\n",
                 plan.problems.size());
    for (const std::string& p : plan.problems) std::fprintf(stderr, "  - %s\n", p.c_str());
    return kExitConfig;
  }
  if (!config.ok()) return Fail(cmd, config.status());
  for (const std::string& w : plan.warnings) STRATA_LOG(WARN) << w;
  if (plan.host_tier && plan.layout)
    std::fprintf(stderr, "strata serve: HiCache %s\n",
                 DescribeHostTierPlan(*plan.host_tier, *plan.layout).c_str());
  if (plan.device_memory)
    std::fprintf(stderr, "strata serve: GPU memory plan: %s\n",
                 plan.device_memory->Describe().c_str());
  std::string served_name = c.served_model_name;
  if (served_name.empty()) {
    served_name = dir;
    while (served_name.size() > 1 && served_name.back() == '/') served_name.pop_back();
    if (auto slash = served_name.rfind('/'); slash != std::string::npos)
      served_name = served_name.substr(slash + 1);
  }

  // Signals are taken on this thread; block them before any thread starts
  // (threads inherit the mask).
  ServeSignals signals = ServeSignals::Install("strata serve");

  // Bind before loading: a wrong --host or a taken --port is a configuration
  // error found in milliseconds, not after the weights load.
  HttpServerOptions http;
  http.host = c.host;
  http.port = static_cast<int>(c.port);
  http.io_threads = static_cast<int>(c.io_threads);
  http.max_body_bytes = static_cast<size_t>(c.max_request_body_bytes);
  http.max_total_body_bytes = static_cast<size_t>(c.max_total_request_body_bytes);
  http.api_key = c.api_key;
  auto listener = HttpServer::Create(http);
  if (!listener.ok()) return ConfigError("--host/--port: " + listener.status().message());
  if (c.api_key.empty() && !IsLoopback(c.host))
    STRATA_LOG(WARN)
        << "listening on " << c.host << ":" << (*listener)->port()
        << " (beyond loopback) without --api-key: anyone who can reach this address can use the "
           "model; set --api-key or listen on 127.0.0.1";

  ModelFlags mf = c.model;
  mf.max_batch_tokens = ServeMaxBatchTokens(c);
  // On a GPU: the one arena (validated above when the GPU was visible).
  if (mf.device != "cpu") mf.mem_fraction_static = c.mem_fraction_static;
  auto stack = LoadForCli(cmd, mf);
  if (!stack.ok()) return Fail(cmd, stack.status());
  EngineOptions eo = plan.engine;
  if (plan.host_tier) eo.hicache_host_pages = plan.host_tier->host_pages;  // validated above
  const bool pd_mode = c.disaggregation_mode != "null";
  disagg::PdOptions po;
  // PD: the KV transport comes first, so a decode's KV pool can live in
  // memory it allocated (peers on this host then write it directly). It
  // lives while the role or the pool's memory holds it.
  std::shared_ptr<disagg::KvTransport> transport;
  if (pd_mode) {
    po.mode = c.disaggregation_mode;
    po.bootstrap_host =
        c.disaggregation_bootstrap_host.empty() ? c.host : c.disaggregation_bootstrap_host;
    po.bootstrap_port = static_cast<int>(c.disaggregation_bootstrap_port);
    po.transfer_backend = c.disaggregation_transfer_backend;
    po.model = served_name;
    po.bootstrap_timeout = std::chrono::milliseconds(c.disaggregation_bootstrap_timeout_ms);
    po.transfer_timeout = std::chrono::milliseconds(c.disaggregation_transfer_timeout_ms);
    po.heartbeat_interval = std::chrono::milliseconds(c.disaggregation_heartbeat_interval_ms);
    po.peer_timeout = std::chrono::milliseconds(c.disaggregation_peer_timeout_ms);
    auto t = disagg::CreateRoleTransport(po);
    if (!t.ok()) return Fail(cmd, t.status());
    transport = std::move(*t);
    // Host memory only: on a GPU the pool is the backend's device memory.
    if (disagg::RoleWantsTransportPool(po.mode) && mf.device == "cpu")
      eo.kv_pool_allocator = disagg::MakeKvPoolAllocator(transport);
  }
  auto engine = Engine::Create(*stack->model, *stack->backend, eo);
  if (!engine.ok()) return Fail(cmd, engine.status());
  if (plan.layout &&
      (*engine)->pool().num_pages() != plan.device_pages)  // the host tier was sized from it
    return Fail(
        cmd, Internal("the engine allocated " + std::to_string((*engine)->pool().num_pages()) +
                      " KV pages; startup validation planned " + std::to_string(plan.device_pages) +
                      " (KvLayoutForConfig and Model::kv_layout disagree)"));
  if (const BackendMemoryUsage u = stack->backend->memory_usage(); u.arena_bytes > 0)
    std::fprintf(stderr,
                 "strata serve: GPU arena %.2f of %.2f GiB used after startup (%ld cudaMalloc)\n",
                 u.arena_used / 1073741824.0, u.arena_bytes / 1073741824.0,
                 static_cast<long>(u.device_mallocs));
  auto registry = metrics::Registry::Create(
      {{"model", served_name}, {"role", pd_mode ? c.disaggregation_mode : "colocated"}});
  if (!registry.ok()) return Fail(cmd, registry.status());
  (void)metrics::AddBuildInfo(**registry);
  // PD: the bootstrap endpoint and the KV transport over the engine's pool
  // (which lives as long as the engine). Destroyed after the engine stops.
  std::unique_ptr<disagg::PdRole> pd;
  if (pd_mode) {
    auto role = disagg::PdRole::Create(po, (*engine)->pool(), std::move(transport), **registry);
    if (!role.ok()) {
      if (role.status().code() == StatusCode::kUnavailable && po.mode == "prefill")
        return ConfigError("--disaggregation-bootstrap-port: " + role.status().message());
      return Fail(cmd, role.status());
    }
    pd = std::move(*role);
  }
  AdmissionOptions adm;
  adm.max_queued_requests = c.max_queued_requests;
  adm.max_queued_tokens = c.max_queued_tokens;
  adm.max_queue_time_ms = c.max_queue_time_ms;
  auto async = AsyncEngine::Start(std::move(*engine), adm, registry->get());
  if (!async.ok()) return Fail(cmd, async.status());
  ServerOptions so;
  so.served_model_name = served_name;
  so.api_key = c.api_key;
  so.tool_call_parser = c.tool_call_parser;
  so.reasoning_parser = c.reasoning_parser;
  so.responses_store = {c.responses_store_max_items, c.responses_store_max_bytes};
  so.http = http;
  so.pd = pd.get();
  auto server = OpenAiServer::Create(*stack->model, **async, **registry, so, std::move(*listener));
  if (!server.ok()) return Fail(cmd, server.status());
  if (Status s = (*server)->Start(); !s.ok()) return Fail(cmd, s);
  const EngineSnapshot snap = (*async)->snapshot();
  std::fprintf(stderr,
               "strata serve: serving '%s' on http://%s:%d (KV cache %ld pages x %ld tokens, "
               "max running %ld, max queued %ld requests / %ld tokens, queue time limit %ld ms)\n",
               served_name.c_str(), c.host.c_str(), (*server)->port(),
               static_cast<long>(snap.pages_total), static_cast<long>(c.page_size),
               static_cast<long>(c.max_running_requests), static_cast<long>(c.max_queued_requests),
               static_cast<long>(c.max_queued_tokens), static_cast<long>(c.max_queue_time_ms));
  if (pd) {
    std::string where;
    if (pd->mode() == "prefill")
      where = ", bootstrap on " +
              (c.disaggregation_bootstrap_host.empty() ? c.host : c.disaggregation_bootstrap_host) +
              ":" + std::to_string(pd->bootstrap_port());
    std::fprintf(stderr, "strata serve: PD %s role, instance %s%s\n", pd->mode().c_str(),
                 pd->instance_id().c_str(), where.c_str());
  }
  std::fflush(stderr);

  ServeSignals::Event ev;
  while (ev.kind == ServeSignals::Kind::kNone) ev = signals.Next(std::chrono::milliseconds(-1));
  const int code =
      Shutdown(signals, ev, **server, **async, std::chrono::seconds(c.drain_timeout_s));
  pd.reset();  // the engine stopped: no request holds a handoff any more
  return code;
}

}  // namespace strata::cli

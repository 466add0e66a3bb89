// strata router: the router in front of colocated `strata serve` workers
// (--worker) or PD pairs (--prefill, --decode): policies, health checks,
// circuit breakers, retries, its own admission limits, metrics
// (router/router.h; docs/architecture/disagg.md "Router").
//
// Flags follow SGLang's router where it has the same thing (--policy,
// --retry-max-retries, --cb-*, --health-*, --balance-*-threshold,
// --max-tree-size), in milliseconds where SGLang says seconds. Every
// configuration problem exits 78 (EX_CONFIG) before anything is served.
// Signals as `strata serve` (cli/signals.h): SIGTERM drains within
// --drain-timeout-s, a second signal stops at once.
#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/router_config.h"
#include "cli/signals.h"
#include "router/router.h"
#include "util/flags.h"
#include "util/logging.h"

namespace strata::cli {
namespace {

int ConfigError(const std::string& msg) {
  std::fprintf(stderr, "strata router: invalid configuration: %s\n", msg.c_str());
  return kExitConfig;
}

}  // namespace

int RouterCommand(const Args& args) {
  RouterConfig rc;
  FlagSet f = MakeRouterFlagSet(&rc);
  router::RouterOptions& o = rc.o;
  const RouterConfig& rf = rc;
  Status st = f.Parse(args);
  if (!st.ok()) return ConfigError(st.message());
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  if (rf.verbose) SetLogLevel(LogLevel::DEBUG);
  if (Status v = ResolveRouterConfig(f, &rc); !v.ok()) return ConfigError(v.message());

  ServeSignals signals = ServeSignals::Install("strata router");
  HttpServerOptions http;
  http.host = rf.host;
  http.port = static_cast<int>(rf.port);
  http.io_threads = static_cast<int>(rf.io_threads);
  http.max_body_bytes = static_cast<size_t>(rf.max_request_body_bytes);
  http.max_total_body_bytes = std::max(http.max_total_body_bytes, http.max_body_bytes);
  http.api_key = o.api_key;
  o.http = http;
  auto listener = HttpServer::Create(http);
  if (!listener.ok()) return ConfigError("--host/--port: " + listener.status().message());
  const size_t nworkers = o.workers.size() + o.prefills.size() + o.decodes.size();
  const bool pd = !o.prefills.empty();
  auto router = router::Router::Create(o, std::move(*listener));
  if (!router.ok()) return ConfigError(router.status().message());
  if (Status s = (*router)->Start(); !s.ok()) {
    std::fprintf(stderr, "strata router: error: %s\n", s.ToString().c_str());
    return kExitFailure;
  }
  size_t healthy = 0;
  for (const auto& w : (*router)->Workers()) healthy += w.healthy;
  std::fprintf(stderr,
               "strata router: routing on http://%s:%d to %zu %s (%zu healthy now; policy %s, max "
               "concurrent %ld, max queued %ld)\n",
               rf.host.c_str(), (*router)->port(), nworkers,
               pd ? "prefill/decode servers" : "workers", healthy, o.policy.name.c_str(),
               static_cast<long>(o.admission.max_concurrent_requests),
               static_cast<long>(o.admission.max_queued_requests));
  std::fflush(stderr);

  ServeSignals::Event ev;
  while (ev.kind == ServeSignals::Kind::kNone) ev = signals.Next(std::chrono::milliseconds(-1));
  int code = kExitOk;
  if (ev.kind == ServeSignals::Kind::kStopNow) {
    code = 128 + ev.signo;
  } else {
    std::fprintf(stderr, "strata router: %s: draining (%ld in flight; up to %ld s)\n",
                 ev.name.c_str(), static_cast<long>((*router)->in_flight()),
                 static_cast<long>(rf.drain_timeout_s));
    (*router)->BeginDrain();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(rf.drain_timeout_s);
    while ((*router)->in_flight() > 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        code = kExitFailure;
        break;
      }
      ServeSignals::Event again = signals.Next(std::chrono::milliseconds(20));
      if (again.kind != ServeSignals::Kind::kNone) {
        code = 128 + again.signo;
        break;
      }
    }
  }
  (*router)->Stop();
  std::fprintf(
      stderr, "strata router: %s\n",
      code == kExitOk ? "drained; exiting" : ("stopped; exit " + std::to_string(code)).c_str());
  return code;
}

}  // namespace strata::cli

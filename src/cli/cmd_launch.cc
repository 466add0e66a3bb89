// strata launch: supervises the services of a deployment file on this
// machine (cli/supervisor.h has the rules). Runs `strata check` on the file
// first and starts nothing when it fails (exit 78, its messages); then starts
// each service as `<this binary> serve <its flags>`, in file order, each
// gated on GET /health, and serves /metrics, GET /v1/services and GET
// /v1/targets (Prometheus service discovery) on
// 127.0.0.1:<[launcher] port>. SIGTERM/SIGINT stop every service in reverse
// order (SIGTERM, its --drain-timeout-s plus a margin, then SIGKILL) and
// exit 0. A launcher that is killed takes its services with it
// (PR_SET_PDEATHSIG); the next one ends any still draining before its check
// (StopLeftoverServices) and starts them afresh.
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/deploy_config.h"
#include "cli/signals.h"
#include "cli/supervisor.h"
#include "metrics/metrics.h"
#include "server/http_server.h"

namespace strata::cli {
namespace {

void Log(const std::string& text) {
  std::fprintf(stderr, "strata launch: %s\n", text.c_str());
  std::fflush(stderr);
}

// Where a service listening on `host` is reached from this machine.
std::string ProbeHost(const std::string& host) {
  if (host == "0.0.0.0" || host.empty()) return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

}  // namespace

int LaunchCommand(const Args& args) {
  const std::string cmd = "launch";
  std::string config_path;
  FlagSet f(cmd,
            "Supervises a deployment on this machine: checks it as `strata check` does (and starts "
            "nothing when that fails: exit 78), starts each service in file order once the one "
            "before it answers GET /health, restarts failed ones with exponential backoff, never "
            "restarts one that exited 78 (state config-error), stops restarting one that "
            "crash-loops (state crashloop), writes <log-dir>/<service>.log (rotated at 10 MiB, 3 "
            "files), and serves /metrics and GET /v1/services on 127.0.0.1:<[launcher] port> "
            "(see `strata status`). SIGTERM or SIGINT stops every service in reverse order, then "
            "exits 0.\n\n"
            "  strata launch deploy.toml");
  f.String("config", &config_path, "the deployment file (or give it as the one argument)");
  std::vector<std::string> positional;
  if (Status s = f.Parse(args, &positional); !s.ok()) return UsageError(cmd, s);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  if (positional.size() == 1 && config_path.empty()) config_path = positional[0];
  if (config_path.empty() || positional.size() > 1 ||
      (!positional.empty() && config_path != positional[0]))
    return UsageError(cmd, InvalidArgument("give one deployment file: strata launch deploy.toml"));

  // A previous launcher of this deployment that was killed (kill -9, the
  // OOM killer) took its children with it, but one still draining would
  // hold its ports and fail the check below: end those first (supervisor.h).
  if (auto pre = ParseDeploymentFile(config_path); pre.ok())
    if (Status st = StopLeftoverServices(pre->launcher.log_dir, Log); !st.ok()) {
      std::fprintf(stderr, "strata launch: %s; nothing started\n", st.message().c_str());
      return kExitFailure;
    }
  // The whole of `strata check` first: nothing starts on a file it refuses.
  const int checked = CheckCommand({"--config", config_path});
  // The plan goes out now, not when the launcher exits: its stdout is a
  // file or the journal more often than a terminal.
  std::fflush(stdout);
  if (int rc = checked; rc != kExitOk) {
    std::fprintf(stderr, "strata launch: %s was refused by the check above; nothing started\n",
                 config_path.c_str());
    return rc;
  }
  auto d = ParseDeploymentFile(config_path);
  if (!d.ok()) return Fail(cmd, d.status());  // it parsed a moment ago

  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return Fail(cmd, IoError("cannot find this binary (/proc/self/exe)"));
  self[n] = '\0';
  std::vector<SupervisedService> services;
  for (const ServiceSpec& s : d->services) {
    SupervisedService svc;
    svc.name = s.name;
    svc.argv = {self, s.command_name()};
    svc.argv.insert(svc.argv.end(), s.argv.begin(), s.argv.end());
    svc.host = ProbeHost(s.host());
    svc.port = static_cast<int>(s.port());
    svc.role = s.role();
    // Its own drain, then a margin for the engine to stop and the process to exit.
    svc.drain_timeout = std::chrono::seconds(s.drain_timeout_s() + 5);
    if (svc.port == 0)
      Log("service '" + s.name +
          "' has port 0: its port is unknown, so it counts as running once started (give it a "
          "fixed port to gate on GET /health)");
    services.push_back(std::move(svc));
  }

  // Signals are taken on this thread; block them before any thread starts.
  ServeSignals signals = ServeSignals::Install("strata launch");
  HttpServerOptions http;
  http.host = "127.0.0.1";
  http.port = static_cast<int>(d->launcher.port);
  auto server = HttpServer::Create(http);
  if (!server.ok()) {
    std::fprintf(stderr,
                 "strata launch: invalid configuration: [launcher] port: %s (stop what listens "
                 "there, or give [launcher] port another value)\n",
                 server.status().message().c_str());
    return kExitConfig;
  }
  auto sup = Supervisor::Create(SupervisorOptions::FromLauncher(d->launcher), std::move(services));
  if (!sup.ok()) {
    std::fprintf(stderr, "strata launch: invalid configuration: %s\n",
                 sup.status().message().c_str());
    return kExitConfig;
  }
  Supervisor* s = sup->get();
  (*server)->Handle(
      "GET", "/metrics",
      [s](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
        r->Send(200, {{"Content-Type", std::string(metrics::kContentType)}}, s->RenderMetrics());
      },
      HttpAuth::kPublic);
  (*server)->Handle(
      "GET", "/v1/services",
      [s](HttpRequest&&, std::shared_ptr<HttpResponder> r) { r->SendJson(200, s->ServicesJson()); },
      HttpAuth::kPublic);
  // Prometheus' http_sd_configs: the services as scrape targets, so
  // deploy/prometheus/prometheus.yml needs no list of ports.
  (*server)->Handle(
      "GET", "/v1/targets",
      [s](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
        r->SendJson(200, s->PrometheusTargetsJson());
      },
      HttpAuth::kPublic);
  (*server)->Handle(
      "GET", "/health",
      [](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
        r->SendJson(200, "{\"status\":\"ok\"}");
      },
      HttpAuth::kPublic);
  if (Status st = (*server)->Start(); !st.ok()) return Fail(cmd, st);
  Log("supervising " + std::to_string(d->services.size()) + " service(s) of " + config_path +
      "; logs in " + d->launcher.log_dir +
      "/; status on http://127.0.0.1:" + std::to_string((*server)->port()) +
      " (strata status --launcher http://127.0.0.1:" + std::to_string((*server)->port()) + ")");

  for (;;) {
    s->Poll(std::chrono::milliseconds(100));
    ServeSignals::Event ev = signals.Next(std::chrono::milliseconds(0));
    if (ev.kind == ServeSignals::Kind::kNone) continue;
    Log(ev.name + ": stopping every service in reverse order");
    break;
  }
  s->Stop();  // the status API answers meanwhile
  (*server)->Stop();
  Log("every service stopped; exiting");
  return kExitOk;
}

}  // namespace strata::cli

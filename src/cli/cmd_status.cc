// strata status: one screen of a running `strata launch`: per service its
// state, pid, restarts, uptime, health (GET /health now), queue depth (its
// strata_queued_requests) and the last error line of its output, from the
// launcher's GET /v1/services. --json prints that JSON as is. With --systemd
// (or when systemd is PID 1, no --launcher is given and no launcher answers)
// the same for the strata-*.service units (cli/systemd_status.h). Exit 0 when
// every service is running, 1 otherwise, 69 (EX_UNAVAILABLE) when the
// launcher (or systemctl) cannot be reached.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/deploy_config.h"
#include "cli/supervisor.h"
#include "cli/systemd_status.h"

namespace strata::cli {
namespace {

constexpr int kExitUnavailable = 69;  // sysexits.h EX_UNAVAILABLE

std::string Uptime(double s) {
  if (s <= 0) return "-";
  const int64_t t = static_cast<int64_t>(s);
  char buf[32];
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  return buf;
}

// The value of strata_queued_requests in a service's /metrics ("-" if absent).
std::string QueueDepth(const std::string& host, int port) {
  auto m = HttpGetOnce(host, port, "/metrics", std::chrono::seconds(2));
  if (!m.ok() || m->status != 200) return "-";
  const std::string name = "\nstrata_queued_requests";
  const size_t at = m->body.find(name);
  if (at == std::string::npos) return "-";
  const size_t end = m->body.find('\n', at + 1);
  const std::string line = m->body.substr(at + 1, end == std::string::npos ? end : end - at - 1);
  const size_t sp = line.rfind(' ');
  return sp == std::string::npos ? "-" : line.substr(sp + 1);
}

}  // namespace

int StatusCommand(const Args& args) {
  const std::string cmd = "status";
  std::string url = "http://127.0.0.1:" + std::to_string(kDefaultLauncherPort);
  bool json = false, systemd = false;
  FlagSet f(cmd,
            "Shows a running `strata launch`, or the strata-*.service units of `strata systemd`: "
            "per service its state (running, starting, backoff, crashloop, config-error, "
            "stopped), pid, restarts, uptime, health and the last error line of its log (the "
            "journal's, for units). Exit 0 when every service is running, 1 otherwise, 69 when "
            "the launcher (or systemctl) cannot be reached. Without --launcher, on a machine "
            "where systemd is PID 1 and no launcher answers, shows the units.\n\n"
            "  strata status [--launcher http://127.0.0.1:8090 | --systemd] [--json]");
  f.String("launcher", &url, "the launcher's address (its [launcher] port)");
  f.Bool("systemd", &systemd, "show the strata-*.service units (systemctl show, journalctl)");
  f.Bool("json", &json, "print the services as JSON (the launcher's GET /v1/services shape)");
  if (Status s = f.Parse(args); !s.ok()) return UsageError(cmd, s);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  if (systemd && f.IsSet("launcher"))
    return UsageError(cmd, InvalidArgument("give --launcher or --systemd, not both"));
  // http://host:port[/]
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string host = rest;
  int port = static_cast<int>(kDefaultLauncherPort);
  if (auto colon = rest.rfind(':');
      colon != std::string::npos && rest.find(']', colon) == std::string::npos) {
    host = rest.substr(0, colon);
    port = std::atoi(rest.c_str() + colon + 1);
  }
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (host.empty() || port <= 0 || port > 65535 || rest.find('/') != std::string::npos)
    return UsageError(cmd, InvalidArgument("--launcher " + url +
                                           ": give http://HOST:PORT, e.g. http://127.0.0.1:8090"));

  std::string body;  // {"services":[...]}
  StatusOr<HttpReply> r = Unavailable("not asked");
  if (!systemd) r = HttpGetOnce(host, port, "/v1/services", std::chrono::seconds(5));
  if (systemd || ((!r.ok() || r->status != 200) && !f.IsSet("launcher") && SystemdIsPid1())) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    auto units = SystemdServices(*MakeProcessRunner(), now);
    if (!units.ok()) {
      std::fprintf(stderr, "strata status: cannot read the strata units: %s\n",
                   units.status().message().c_str());
      return kExitUnavailable;
    }
    if (units->empty()) {
      std::fprintf(stderr,
                   "strata status: systemd has no strata-*.service unit loaded (install the units "
                   "of `strata systemd --config FILE --out DIR` and `systemctl daemon-reload`)\n");
      return kExitUnavailable;
    }
    body = ServicesJson(*units);
  } else if (!r.ok() || r->status != 200) {
    std::fprintf(stderr,
                 "strata status: cannot reach the launcher at %s: %s (is `strata launch` running? "
                 "give its [launcher] port with --launcher http://127.0.0.1:PORT)\n",
                 url.c_str(),
                 r.ok() ? ("GET /v1/services answered " + std::to_string(r->status)).c_str()
                        : r.status().message().c_str());
    return kExitUnavailable;
  } else {
    body = r->body;
  }
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("services") || !j["services"].is_array()) {
    std::fprintf(stderr, "strata status: %s/v1/services did not answer a launcher's JSON\n",
                 url.c_str());
    return kExitUnavailable;
  }
  bool all_running = !j["services"].empty();
  for (const auto& s : j["services"]) all_running &= s.value("state", "") == "running";
  if (json) {
    std::printf("%s\n", body.c_str());
    return all_running ? kExitOk : kExitFailure;
  }
  std::printf("%-20s %-13s %8s %8s %8s %-7s %6s %s\n", "SERVICE", "STATE", "PID", "RESTARTS",
              "UPTIME", "HEALTH", "QUEUE", "LAST ERROR");
  for (const auto& s : j["services"]) {
    const int pid = s.value("pid", 0);
    const int sport = s.value("port", 0);
    std::string health = "-", queue = "-";
    if (pid > 0 && sport > 0) {
      const std::string shost = s.value("host", std::string("127.0.0.1"));
      auto h = HttpGetOnce(shost, sport, "/health", std::chrono::seconds(2));
      health = h.ok() && h->status == 200 ? "ok" : h.ok() ? std::to_string(h->status) : "down";
      if (h.ok()) queue = QueueDepth(shost, sport);
    }
    std::printf("%-20s %-13s %8s %8lld %8s %-7s %6s %s\n", s.value("name", std::string()).c_str(),
                s.value("state", std::string()).c_str(),
                pid > 0 ? std::to_string(pid).c_str() : "-",
                static_cast<long long>(s.value("restarts", int64_t{0})),
                Uptime(s.value("uptime_s", 0.0)).c_str(), health.c_str(), queue.c_str(),
                s.value("last_error", std::string()).c_str());
  }
  return all_running ? kExitOk : kExitFailure;
}

}  // namespace strata::cli

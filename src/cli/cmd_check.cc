// strata check: validates a deployment (or one `strata serve` command line)
// against the model directories and this host before anything starts: each
// service's own ValidateServeConfig (the check `strata serve` runs at its
// start), the ports (unique, and free by a bind test), and host memory
// summed over the services on each NUMA node (cli/deploy_config.h). Prints
// the memory plan and every problem; exit 0 when it is all valid, 78
// (kExitConfig) otherwise.
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/deploy_config.h"
#include "model/model_dir.h"

namespace strata::cli {
namespace {

// Binds (host, port) as the server would (SO_REUSEADDR, so a port in
// TIME_WAIT is free, one that is listened on is not) and closes it again.
Status ProbePort(const std::string& host, int64_t port) {
  if (port == 0) return OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return FailedPrecondition("cannot resolve host '" + host + "': " + gai_strerror(rc) +
                              " (give an address of this machine, e.g. 127.0.0.1)");
  Status st = OkStatus();
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd < 0) {
    st = IoError("cannot create a socket to test " + where);
  } else {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
      const int e = errno;
      if (e == EADDRINUSE)
        st = FailedPrecondition(where +
                                " is already in use (a running server or deployment? stop it, or "
                                "give this service another port)");
      else if (e == EADDRNOTAVAIL)
        st = FailedPrecondition(where + ": " + host +
                                " is not on this machine (give one of its addresses)");
      else
        st = FailedPrecondition(
            "cannot bind " + where + ": " + std::strerror(e) +
            (port < 1024 ? " (ports below 1024 need privileges: use >= 1024)" : ""));
    }
    close(fd);
  }
  freeaddrinfo(res);
  return st;
}

// The I/O half of the check for one service: the model's config.json and
// weight sizes, the storage directory, the port.
ServiceInputs ReadInputs(ServiceSpec& s) {
  ServiceInputs in;
  if (s.command == ServiceCommand::kRouter) {
    in.port = ProbePort(s.host(), s.port());
    return in;
  }
  if (s.serve.model.model_path.empty()) {
    auto demo = EnsureDemoModel();  // as `strata serve` does without --model-path
    if (demo.ok()) s.serve.model.model_path = *demo;
  }
  auto model = ReadModelConfig(s.serve.model.model_path);
  if (model.ok())
    in.model = std::move(*model);
  else
    in.model_status = model.status();
  in.env = ReadServeEnvironment(s.serve, s.serve.model.model_path);
  in.port = ProbePort(s.serve.host, s.serve.port);
  return in;
}

}  // namespace

int CheckCommand(const Args& args) {
  const std::string cmd = "check";
  // Everything after "--" is a `strata serve` command line.
  Args own = args, serve_args;
  bool serve_line = false;
  if (auto dash = std::find(own.begin(), own.end(), "--"); dash != own.end()) {
    serve_line = true;
    serve_args.assign(dash + 1, own.end());
    own.erase(dash, own.end());
  }
  std::string config_path, only;
  FlagSet f(cmd,
            "Checks a deployment before anything starts: every service's flags against its model "
            "and this machine (what `strata serve` checks at startup), ports unique and free, and "
            "host memory summed per NUMA node over the services placed there. Prints the memory "
            "plan and every problem with its fix; exit 0 when valid, 78 otherwise.\n\n"
            "  strata check --config deploy.toml [--service NAME]\n"
            "  strata check -- <strata serve flags>");
  f.String("config", &config_path, "the deployment file (TOML; docs/architecture/cli.md)");
  f.String("service", &only, "check only this service of the file");
  if (Status s = f.Parse(own); !s.ok()) return UsageError(cmd, s);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  if (serve_line == !config_path.empty())
    return UsageError(cmd, InvalidArgument("give either --config FILE or -- <strata serve flags>"));
  if (!only.empty() && serve_line)
    return UsageError(cmd, InvalidArgument("--service selects a service of --config FILE"));

  auto d = serve_line ? DeploymentFromServeArgs(serve_args) : ParseDeploymentFile(config_path);
  if (!d.ok()) {
    std::fprintf(stderr, "strata check: invalid configuration:\n%s\n",
                 d.status().message().c_str());
    return d.status().code() == StatusCode::kNotFound ? kExitNoInput : kExitConfig;
  }
  if (!only.empty()) {
    std::vector<ServiceSpec> kept;
    std::string names;
    for (ServiceSpec& s : d->services) {
      names += (names.empty() ? "" : ", ") + s.name;
      if (s.name == only) kept.push_back(std::move(s));
    }
    if (kept.empty())
      return UsageError(cmd, InvalidArgument("--service " + only + ": " + d->path +
                                             " has no such service (it has: " + names + ")"));
    d->services = std::move(kept);
  }

  std::vector<ServiceInputs> inputs;
  for (ServiceSpec& s : d->services) inputs.push_back(ReadInputs(s));
  HostMemoryFacts host;
  if (auto facts = ReadHostMemoryFacts("/"); facts.ok()) host = std::move(*facts);
  const DeploymentPlan plan = PlanDeployment(*d, inputs, host);

  std::printf("%s", FormatDeploymentPlan(plan).c_str());
  for (const std::string& w : plan.warnings) std::printf("warning: %s\n", w.c_str());
  if (plan.ok()) {
    std::printf("OK: %zu service%s of %s valid on this machine\n", plan.services.size(),
                plan.services.size() == 1 ? "" : "s", d->path.c_str());
    return kExitOk;
  }
  std::fflush(stdout);
  std::fprintf(stderr, "strata check: invalid configuration (%zu problem%s):\n",
               plan.problems.size(), plan.problems.size() == 1 ? "" : "s");
  for (const std::string& p : plan.problems) std::fprintf(stderr, "  - %s\n", p.c_str());
  return kExitConfig;
}

}  // namespace strata::cli

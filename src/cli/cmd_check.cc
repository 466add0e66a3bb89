// strata check: validates a deployment (or one `strata serve` command line)
// against the model directories and this host before anything starts: each
// service's own ValidateServeConfig (the check `strata serve` runs at its
// start), the ports (unique, and free by a bind test; a prefill's bootstrap
// port too), the KV transport of PD roles (a self-test write between two
// transports of this process), each router's URLs against the services of
// the file (CheckRouterUrls), and host memory summed over the services on
// each NUMA node (cli/deploy_config.h); and the launcher's own port and
// log directory. Prints
// the memory plan and every problem; exit 0 when it is all valid, 78
// (kExitConfig) otherwise.
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/deploy_config.h"
#include "disagg/kv_transport.h"
#include "model/model_dir.h"
#include "util/logging.h"

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

// The KV transport's self-test on this host, once per backend (every PD
// service of a deployment gets the same answer), with the fix in the
// message. The servers `strata launch` starts inherit this environment, so
// they get the UCX_TLS tested here.
Status TransportOnThisHost(const std::string& backend) {
  static std::map<std::string, Status> tested;
  if (auto it = tested.find(backend); it != tested.end()) return it->second;
  disagg::TransportOptions o;
  o.backend = backend;
  // The outcome is the message; the transports' own INFO logs would only
  // repeat it.
  const LogLevel level = GetLogLevel();
  SetLogLevel(LogLevel::ERROR);
  Status st = disagg::SelfTestKvTransport(o, std::chrono::seconds(10));
  SetLogLevel(level);
  if (!st.ok()) {
    const char* tls = std::getenv("UCX_TLS");
    st = Status(st.code(),
                "KV pages cannot move between two processes of this machine (UCX_TLS=" +
                    std::string(tls ? tls : "unset: UCX's default") + "): " + st.message() +
                    (tls ? " (unset UCX_TLS, or set UCX_TLS=tcp (any hosts) or UCX_TLS=shm (one "
                           "host); docs/architecture/disagg.md, Data plane)"
                         : " (see what UCX offers here: ucx_info -d)"));
  }
  tested.emplace(backend, st);
  return st;
}

// This machine's addresses and names, for CheckRouterUrls: a router URL
// naming one of them must be a service of the file.
std::vector<std::string> LocalHosts() {
  std::vector<std::string> out;
  char name[256];
  if (gethostname(name, sizeof name) == 0) {
    name[sizeof name - 1] = '\0';
    out.emplace_back(name);
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    char host[NI_MAXHOST];
    const socklen_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(i->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0) {
      std::string h = host;
      if (auto pct = h.find('%'); pct != std::string::npos) h.erase(pct);  // fe80::1%eth0
      out.push_back(h);
    }
  }
  freeifaddrs(ifs);
  return out;
}

// What `strata launch` needs of this machine for itself: its port free (as
// the services' ports) and its log directory creatable and writable (the
// nearest existing ancestor is tested: the check creates nothing).
std::vector<std::string> LauncherProblems(const LauncherConfig& l) {
  std::vector<std::string> out;
  if (Status st = ProbePort("127.0.0.1", l.port); !st.ok())
    out.push_back("[launcher] port " + std::to_string(l.port) + ": " + st.message());
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(l.log_dir, ec);
  while (!ec && !dir.empty() && !std::filesystem::exists(dir, ec) && dir != dir.parent_path())
    dir = dir.parent_path();
  if (ec || !std::filesystem::is_directory(dir, ec))
    out.push_back("[launcher] log-dir '" + l.log_dir + "': " + dir.string() +
                  " is not a directory (give a directory, or a path one can be created at)");
  else {
    // A directory made and removed at once: access(W_OK) says yes to root
    // on read-only and virtual file systems alike.
    std::string probe = (dir / ".strata-check-XXXXXX").string();
    if (mkdtemp(probe.data()) == nullptr)
      out.push_back("[launcher] log-dir '" + l.log_dir + "': cannot create a directory in " +
                    dir.string() + ": " + std::strerror(errno) +
                    " (give a writable directory, e.g. log-dir = \"strata-logs\" under the "
                    "working directory)");
    else
      rmdir(probe.c_str());
  }
  return out;
}

// The I/O half of the check for one service: the model's config.json and
// weight sizes, the storage directory, the port; for PD roles the bootstrap
// port and the KV transport.
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
  const std::string role = s.role();
  if (role == "prefill")
    in.bootstrap_port = ProbePort(s.serve.disaggregation_bootstrap_host.empty()
                                      ? s.serve.host
                                      : s.serve.disaggregation_bootstrap_host,
                                  s.serve.disaggregation_bootstrap_port);
  // An unknown backend is ValidateServeConfig's problem, with its fix.
  if ((role == "prefill" || role == "decode") && s.serve.disaggregation_transfer_backend == "ucx")
    in.transport = TransportOnThisHost(s.serve.disaggregation_transfer_backend);
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
  FlagSet f(
      cmd,
      "Checks a deployment before anything starts: every service's flags against its model "
      "and this machine (what `strata serve` checks at startup), ports unique and free (a "
      "prefill's bootstrap port too), the KV transport of PD roles on this machine (with "
      "this UCX_TLS), each router's URLs against the services of the file (port and role), "
      "and host memory summed per NUMA node over the services placed there. Prints the memory "
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
  DeploymentPlan plan = PlanDeployment(*d, inputs, host, LocalHosts());
  if (!d->from_command_line)
    for (std::string& p : LauncherProblems(d->launcher)) plan.problems.push_back(std::move(p));

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

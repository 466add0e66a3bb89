// A deployment: the processes of one machine (services) and the launcher
// that supervises them, read from a TOML deployment file (toml11), and the
// deployment-level checks `strata check` runs on top of each service's own
// ValidateServeConfig.
//
// The file (docs/architecture/cli.md, "Deployment file"):
//
//   [launcher]                      # optional; every key has a default
//   port = 8090
//   crashloop-burst = 5
//   [[service]]
//   name = "chat"
//   command = "serve"
//   port = 30000                    # any `strata serve` flag, without --
//   enable-hierarchical-cache = true
//
// A service's keys go through the same FlagSet (RegisterServeFlags) as the
// command line, so an unknown key is the unknown-flag error and a value is
// checked by the same range; every message names the file, the line, the
// service and the key. ServiceSpec::argv is the command line the table stands
// for (what `strata systemd` puts in ExecStart=).
//
// Commands: "serve" (colocated or a PD role by its disaggregation flags)
// and "router" (`strata router`'s flags, cli/router_config.h). Services start
// in dependency order: every serve service before every router (the file's
// order otherwise).
//
// Parsing does file I/O only in ParseDeploymentFile; PlanDeployment is pure
// (tests fake the host and the per-service inputs). Plain values; thread-
// compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/router_config.h"
#include "cli/serve_config.h"
#include "util/flags.h"
#include "util/host_memory.h"
#include "util/status.h"

namespace strata::cli {

inline constexpr int64_t kDefaultLauncherPort = 8090;

// The [launcher] table. Defaults: crash loop = 5 failures in 10 s (systemd's
// StartLimitBurst/StartLimitIntervalSec defaults); restart backoff 10 s
// doubling to 300 s, reset after 600 s of healthy running (Kubernetes').
struct LauncherConfig {
  int64_t port = kDefaultLauncherPort;  // /metrics and the status API
  std::string log_dir = "strata-logs";  // per-service log files
  int64_t crashloop_burst = 5;
  int64_t crashloop_interval_s = 10;
  int64_t backoff_initial_s = 10;
  int64_t backoff_max_s = 300;
  int64_t backoff_reset_s = 600;
};
// Registers the [launcher] keys (as flags without --) bound to `config`.
void RegisterLauncherFlags(FlagSet& flags, LauncherConfig* config);

enum class ServiceCommand { kServe, kRouter };

struct ServiceSpec {
  std::string name;  // unique in the deployment; [A-Za-z0-9_.-]
  ServiceCommand command = ServiceCommand::kServe;
  int line = 0;  // of the [[service]] header, for messages
  // The equivalent command line after `strata serve`, in file order:
  // "--port=30000", "--enable-hierarchical-cache" (bools as bare flags when
  // true, "--flag=false" when false).
  std::vector<std::string> argv;
  ServeConfig serve;    // command serve: parsed from argv by RegisterServeFlags
  RouterConfig router;  // command router: parsed from argv by MakeRouterFlagSet

  const char* command_name() const {
    return command == ServiceCommand::kRouter ? "router" : "serve";
  }
  const std::string& host() const {
    return command == ServiceCommand::kRouter ? router.host : serve.host;
  }
  int64_t port() const { return command == ServiceCommand::kRouter ? router.port : serve.port; }
  int64_t drain_timeout_s() const {
    return command == ServiceCommand::kRouter ? router.drain_timeout_s : serve.drain_timeout_s;
  }
  // The `role` label of its metrics: "router", "prefill", "decode" or "colocated".
  std::string role() const {
    if (command == ServiceCommand::kRouter) return "router";
    return serve.disaggregation_mode == "null" ? "colocated" : serve.disaggregation_mode;
  }
};

struct Deployment {
  std::string path;  // the file, for messages
  LauncherConfig launcher;
  std::vector<ServiceSpec> services;
  // A `strata serve` command line (DeploymentFromServeArgs): no launcher
  // runs, so its port is nobody's.
  bool from_command_line = false;
};

// Parses a deployment file's text; `path` names it in messages. Every
// problem of every table is returned at once (InvalidArgument, one problem
// per line): TOML syntax ("deploy.toml:4: TOML syntax error: ..." with
// toml11's excerpt), unknown tables and keys, values of the wrong type or
// range, a missing name or command, a command that does not exist yet.
StatusOr<Deployment> ParseDeployment(const std::string& text, const std::string& path);
// Reads `path` (NotFound naming it when missing) and parses it.
StatusOr<Deployment> ParseDeploymentFile(const std::string& path);
// A deployment of one service, "serve", from a `strata serve` command line
// (`strata check -- <serve flags>`).
StatusOr<Deployment> DeploymentFromServeArgs(const std::vector<std::string>& args);

// What PlanDeployment needs per service, read by the caller (I/O).
struct ServiceInputs {
  std::optional<ModelConfig> model;  // config.json; empty when unreadable
  Status model_status = OkStatus();  // why it is empty
  ServeEnvironment env;              // ReadServeEnvironment
  Status port = OkStatus();          // the bind test of --host/--port
  // PD roles. A prefill: the bind test of its bootstrap host and port. Both
  // roles: the KV transport's self-test on this host
  // (disagg::SelfTestKvTransport with the launcher's UCX_TLS).
  Status bootstrap_port = OkStatus();
  Status transport = OkStatus();
};

// One service's validated plan and the host memory it takes.
struct ServiceMemory {
  std::string name;
  ServePlan plan;
  int numa_node = -1;
  std::string device;         // --device
  bool on_cpu = false;        // --device cpu: weights and device pool in host memory
  uint64_t weight_bytes = 0;  // the *.safetensors files
  uint64_t device_pool_bytes = 0;
  uint64_t host_tier_bytes = 0;  // HiCache host pool (0 without it)
  // What this service takes from host memory: the host tier, plus on
  // --device cpu the weights and the device pool.
  uint64_t HostBytes() const;
};

// One row of the per-node budget: a NUMA node, or (node -1) every allowed
// node together, which is also where the cgroup limit and MemAvailable bind.
struct NodeBudget {
  int node = -1;
  uint64_t free_bytes = 0;     // AllowedFreeBytes
  uint64_t reserve_bytes = 0;  // DefaultHostReserveBytes(node, 0): the OS, activations
  uint64_t planned_bytes = 0;  // sum of HostBytes() of the services counted here
  std::vector<std::string> services;
  int64_t HeadroomBytes() const;  // free - reserve - planned (negative: does not fit)
};

struct DeploymentPlan {
  std::vector<ServiceMemory> services;
  std::vector<NodeBudget> nodes;
  // "service 'a': <problem>" for each service's own problems, then the
  // deployment's (duplicate names or ports, ports taken, memory together).
  std::vector<std::string> problems;
  std::vector<std::string> warnings;
  bool ok() const { return problems.empty(); }
};

// Names and ports unique across the deployment (the launcher's port and
// each prefill's bootstrap port included; port 0 is "any" and never
// collides). PlanDeployment runs it; `strata systemd` too (two units of one
// name would overwrite each other).
std::vector<std::string> UniquenessProblems(const Deployment& d);

// A router's view of the deployment: each --worker, --prefill and --decode
// URL whose host is this machine (a loopback address, "localhost", or one
// of `local_hosts`: this machine's addresses and names) must be a service
// of the file on that port, of the role the flag names (--prefill: a
// prefill-mode service, --decode: decode-mode, --worker: colocated), and
// that service must listen where the router connects (--host 0.0.0.0, ::
// or the URL's host); a prefill's bootstrap endpoint too, since the router
// hands the decode the prefill's URL host as bootstrap_host. A URL of
// another machine cannot be checked here and is not. A PD service no router
// of the file sends to is a warning (when the file has a router).
struct RouterCrossCheck {
  std::vector<std::string> problems, warnings;
};
RouterCrossCheck CheckRouterUrls(const Deployment& d, const std::vector<std::string>& local_hosts);

// Validates every service (ValidateServeConfig with inputs[i]) and the
// deployment: UniquenessProblems, each port free (inputs[i].port; a
// prefill's bootstrap port too), the KV transport of PD roles
// (inputs[i].transport), CheckRouterUrls (`local_hosts` as it takes them),
// and memory summed per NUMA node: the services with --numa-node N against
// node N, and every service against all allowed nodes (and the cgroup), each
// with one reserve for the OS. Services that each fit alone but not together
// are a problem naming all of them and what would fit.
// REQUIRES: inputs.size() == d.services.size().
DeploymentPlan PlanDeployment(const Deployment& d, const std::vector<ServiceInputs>& inputs,
                              const HostMemoryFacts& host,
                              const std::vector<std::string>& local_hosts = {});

// The memory plan as a text table (per service: weights, device KV pool per
// group, host pool per group; per node: free, reserve, planned, headroom).
std::string FormatDeploymentPlan(const DeploymentPlan& plan);

}  // namespace strata::cli

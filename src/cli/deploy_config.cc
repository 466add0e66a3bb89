#include "cli/deploy_config.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <sstream>
#include <toml.hpp>

#include "cache/hicache_plan.h"
#include "router/upstream_client.h"

namespace strata::cli {
namespace {

using TomlValue = toml::value;

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// Decimal/SI size for the plan table: GB (10^9, as --hicache-size takes)
// from 1 GB up, MB below (the demo model's pools are a few MB).
std::string Size(long double bytes) {
  if (bytes < 0) return "-" + Size(-bytes);
  if (bytes >= 1e9L || bytes == 0) return FormatGB(bytes);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2Lf MB", bytes / 1e6L);
  return buf;
}

std::string NodeName(const HostMemoryFacts& host, int node) {
  if (node >= 0) return "NUMA node " + std::to_string(node);
  std::vector<int> nodes = host.NodesFor(-1);
  return "all allowed NUMA nodes (" + FormatNodeList(nodes) + ")";
}

// A TOML scalar as flag text; nullopt for arrays, tables and datetimes
// (no serve flag takes them).
std::optional<std::string> FlagText(const TomlValue& v) {
  switch (v.type()) {
    case toml::value_t::boolean:
      return v.as_boolean() ? "true" : "false";
    case toml::value_t::integer:
      return std::to_string(v.as_integer());
    case toml::value_t::floating: {
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, v.as_floating());
      return std::string(buf, r.ptr);
    }
    case toml::value_t::string:
      return v.as_string().str;
    default:
      return std::nullopt;
  }
}

std::string TypeName(const TomlValue& v) {
  std::ostringstream os;
  os << v.type();
  return os.str();
}

// The key/value pairs of a table in file order (toml11 keeps them in a
// hash map).
std::vector<std::pair<std::string, const TomlValue*>> InFileOrder(const TomlValue& table) {
  std::vector<std::pair<std::string, const TomlValue*>> out;
  for (const auto& [k, v] : table.as_table()) out.emplace_back(k, &v);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    const auto la = a.second->location(), lb = b.second->location();
    return std::pair(la.line(), la.column()) < std::pair(lb.line(), lb.column());
  });
  return out;
}

int LineOf(const TomlValue& v) { return static_cast<int>(v.location().line()); }

// Parses `table`'s keys (except `skip`) with `flags` as --key=value, one at
// a time so each error names its key and line. `where` is "service 'chat'"
// or "[launcher]". Returns the argv; problems go to `problems`.
std::vector<std::string> ParseKeys(const TomlValue& table, FlagSet& flags, const std::string& path,
                                   const std::string& where, const std::vector<std::string>& skip,
                                   std::vector<std::string>* problems) {
  std::vector<std::string> argv;
  for (const auto& [key, value] : InFileOrder(table)) {
    if (std::find(skip.begin(), skip.end(), key) != skip.end()) continue;
    const std::string at =
        path + ":" + std::to_string(LineOf(*value)) + ": " + where + ": key " + Quoted(key) + ": ";
    // An array is a flag given once per element (--worker, --prefill and
    // --decode of a router repeat).
    if (value->is_array() && !value->as_array().empty() && flags.IsRepeatable(key)) {
      bool ok = true;
      std::vector<std::string> args;
      for (const TomlValue& e : value->as_array()) {
        std::optional<std::string> t = FlagText(e);
        if (!t || e.is_boolean()) {
          problems->push_back(
              at + "an array element must be a string or number (one value of the flag)");
          ok = false;
          break;
        }
        args.push_back("--" + key + "=" + *t);
      }
      if (!ok) continue;
      bool parsed = true;
      for (const std::string& arg : args)
        if (Status st = flags.Parse({arg}); !st.ok()) {
          problems->push_back(at + st.message());
          parsed = false;
          break;
        }
      if (parsed) argv.insert(argv.end(), args.begin(), args.end());
      continue;
    }
    std::optional<std::string> text = FlagText(*value);
    if (!text) {
      const std::string type = TypeName(*value);
      problems->push_back(
          at + (std::string("aeiou").find(type[0]) == std::string::npos ? "is a " : "is an ") +
          type +
          "; a key takes one string, integer, float or boolean (the value of its "
          "flag)");
      continue;
    }
    // `--help` or a positional would be no key; only --name=value reaches Parse.
    std::string arg = "--" + key + "=" + *text;
    if (key.empty() || key.rfind("-", 0) == 0 || key == "help" || key == "h") {
      problems->push_back(at + "is not a flag name (keys are flags without the leading --)");
      continue;
    }
    if (Status s = flags.Parse({arg}); !s.ok()) {
      problems->push_back(at + s.message());
      continue;
    }
    if (value->is_boolean())
      argv.push_back(value->as_boolean() ? "--" + key : arg);
    else
      argv.push_back(arg);
  }
  return argv;
}

bool ValidServiceName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
  });
}

}  // namespace

void RegisterLauncherFlags(FlagSet& f, LauncherConfig* c) {
  f.Int("port", &c->port, "port of the launcher's /metrics and status API", 1, 65535);
  f.String("log-dir", &c->log_dir, "directory of the per-service log files");
  f.Int("crashloop-burst", &c->crashloop_burst,
        "a service that fails this many times within --crashloop-interval-s is crash-looping and "
        "is not restarted again",
        1, 1000);
  f.Int("crashloop-interval-s", &c->crashloop_interval_s, "the crash-loop window in seconds", 1,
        24 * 3600);
  f.Int("backoff-initial-s", &c->backoff_initial_s, "delay before the first restart", 0, 3600);
  f.Int("backoff-max-s", &c->backoff_max_s, "the restart delay doubles up to this", 0, 24 * 3600);
  f.Int("backoff-reset-s", &c->backoff_reset_s,
        "after this long running healthy the delay starts again at --backoff-initial-s", 1,
        7 * 24 * 3600);
}

StatusOr<Deployment> ParseDeployment(const std::string& text, const std::string& path) {
  TomlValue root;
  try {
    std::istringstream in(text);
    root = toml::parse(in, path);
  } catch (const toml::exception& e) {
    return InvalidArgument(path + ":" + std::to_string(e.location().line()) +
                           ": TOML syntax error: " + e.what());
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": TOML syntax error: " + e.what());
  }
  Deployment d;
  d.path = path;
  std::vector<std::string> problems;
  const TomlValue* services = nullptr;
  for (const auto& [key, value] : InFileOrder(root)) {
    const std::string at = path + ":" + std::to_string(LineOf(*value)) + ": ";
    if (key == "launcher") {
      if (!value->is_table()) {
        problems.push_back(at + "'launcher' must be a table ([launcher])");
        continue;
      }
      FlagSet lf("launcher", "the [launcher] table");
      lf.RejectEmptyStrings();
      RegisterLauncherFlags(lf, &d.launcher);
      ParseKeys(*value, lf, path, "[launcher]", {}, &problems);
      if (d.launcher.backoff_initial_s > d.launcher.backoff_max_s)
        problems.push_back(at + "[launcher]: backoff-initial-s " +
                           std::to_string(d.launcher.backoff_initial_s) +
                           " exceeds backoff-max-s " + std::to_string(d.launcher.backoff_max_s) +
                           " (the delay doubles from the first up to the second: lower the first "
                           "or raise the second)");
    } else if (key == "service") {
      if (!value->is_array()) {
        problems.push_back(at + "'service' must be an array of tables: write each as [[service]]");
        continue;
      }
      services = value;
    } else {
      problems.push_back(at + "unknown " +
                         (value->is_table() ? "table [" + key + "]" : "key " + Quoted(key)) +
                         " (a deployment file has a [launcher] table and [[service]] tables)");
    }
  }
  if (services) {
    for (const TomlValue& table : services->as_array()) {
      const std::string at = path + ":" + std::to_string(LineOf(table)) + ": ";
      if (!table.is_table()) {
        problems.push_back(at + "'service' must be an array of tables: write each as [[service]]");
        continue;
      }
      ServiceSpec spec;
      spec.line = LineOf(table);
      const auto& t = table.as_table();
      auto name = t.find("name");
      if (name == t.end() || !name->second.is_string() || name->second.as_string().str.empty()) {
        problems.push_back(at +
                           "[[service]] needs name = \"...\" (a unique name: letters, digits, "
                           "'-', '_', '.')");
        continue;
      }
      spec.name = name->second.as_string().str;
      const std::string where = "service " + Quoted(spec.name);
      if (!ValidServiceName(spec.name)) {
        problems.push_back(path + ":" + std::to_string(LineOf(name->second)) + ": " + where +
                           ": name may hold only letters, digits, '-', '_' and '.' (at most 64; it "
                           "names log files and systemd units)");
        continue;
      }
      auto command = t.find("command");
      const std::string cmd =
          command != t.end() && command->second.is_string() ? command->second.as_string().str : "";
      if (cmd == "router") {
        spec.command = ServiceCommand::kRouter;
        FlagSet f = MakeRouterFlagSet(&spec.router);
        const size_t before = problems.size();
        spec.argv = ParseKeys(table, f, path, where, {"name", "command"}, &problems);
        if (problems.size() != before) continue;
        if (Status v = ResolveRouterConfig(f, &spec.router); !v.ok()) {
          problems.push_back(path + ":" + std::to_string(spec.line) + ": " + where + ": " +
                             v.message());
          continue;
        }
        d.services.push_back(std::move(spec));
        continue;
      }
      if (cmd != "serve") {
        problems.push_back(
            (command == t.end() ? at
                                : path + ":" + std::to_string(LineOf(command->second)) + ": ") +
            where + ": " +
            (command == t.end() ? std::string("needs command = \"serve\" or \"router\"")
                                : "command " + Quoted(FlagText(command->second).value_or("?")) +
                                      " is not a command (allowed: \"serve\", \"router\")"));
        continue;
      }
      FlagSet f = MakeServeFlagSet(&spec.serve);
      const size_t before = problems.size();
      spec.argv = ParseKeys(table, f, path, where, {"name", "command"}, &problems);
      if (problems.size() != before) continue;
      RecordGivenFlags(f, &spec.serve);
      d.services.push_back(std::move(spec));
    }
  }
  // Dependency order: workers before the routers in front of them.
  std::stable_partition(d.services.begin(), d.services.end(),
                        [](const ServiceSpec& s) { return s.command == ServiceCommand::kServe; });
  if (!services && problems.empty())
    problems.push_back(path +
                       ": no [[service]] table: a deployment needs at least one (name, command "
                       "and the command's flags)");
  if (!problems.empty()) {
    std::string all;
    for (const std::string& p : problems) all += (all.empty() ? "" : "\n") + p;
    return InvalidArgument(all);
  }
  return d;
}

StatusOr<Deployment> ParseDeploymentFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return NotFound("cannot read the deployment file " + path +
                    " (give the path of a TOML file: deploy/examples/colocated.toml is one)");
  std::stringstream text;
  text << in.rdbuf();
  return ParseDeployment(text.str(), path);
}

StatusOr<Deployment> DeploymentFromServeArgs(const std::vector<std::string>& args) {
  Deployment d;
  d.path = "the command line";
  d.from_command_line = true;
  ServiceSpec spec;
  spec.name = "serve";
  FlagSet f = MakeServeFlagSet(&spec.serve);
  if (Status s = f.Parse(args); !s.ok()) return s;
  RecordGivenFlags(f, &spec.serve);
  spec.argv = args;
  d.services.push_back(std::move(spec));
  return d;
}

uint64_t ServiceMemory::HostBytes() const {
  return host_tier_bytes + (on_cpu ? weight_bytes + device_pool_bytes : 0);
}

int64_t NodeBudget::HeadroomBytes() const {
  return static_cast<int64_t>(free_bytes) - static_cast<int64_t>(reserve_bytes) -
         static_cast<int64_t>(planned_bytes);
}

std::vector<std::string> UniquenessProblems(const Deployment& d) {
  std::vector<std::string> problems;
  std::map<std::string, std::string> seen_name;
  // port -> (who uses it, which service: "" for the launcher)
  std::map<int64_t, std::pair<std::string, std::string>> seen_port;
  if (!d.from_command_line) seen_port[d.launcher.port] = {"the [launcher]", ""};
  for (const ServiceSpec& s : d.services) {
    if (!seen_name.emplace(s.name, s.name).second)
      problems.push_back(d.path + ":" + std::to_string(s.line) + ": two services are named " +
                         Quoted(s.name) + ": give each [[service]] its own name");
    if (s.port() != 0) {  // "any free port" never collides
      auto [it, fresh] =
          seen_port.emplace(s.port(), std::pair("service " + Quoted(s.name), s.name));
      if (!fresh)
        problems.push_back("service " + Quoted(s.name) + " and " + it->second.first +
                           " both use port " + std::to_string(s.port()) +
                           ": give each its own port (port = N; 0 picks any free port)");
    }
    // A prefill's bootstrap endpoint is a port of this machine too. Its
    // clash with its own --port is ValidateServeConfig's.
    if (s.role() != "prefill" || s.serve.disaggregation_bootstrap_port == 0) continue;
    const int64_t bp = s.serve.disaggregation_bootstrap_port;
    auto [it, fresh] =
        seen_port.emplace(bp, std::pair("the bootstrap port of service " + Quoted(s.name), s.name));
    if (!fresh && it->second.second != s.name)
      problems.push_back("service " + Quoted(s.name) + ": disaggregation-bootstrap-port " +
                         std::to_string(bp) + " is also used by " + it->second.first +
                         ": give each prefill a bootstrap port no other service or prefill uses "
                         "(disaggregation-bootstrap-port = N; 0 picks any free port)");
  }
  return problems;
}

namespace {

std::string Unbracket(const std::string& host) {
  return host.size() > 2 && host.front() == '[' && host.back() == ']'
             ? host.substr(1, host.size() - 2)
             : host;
}
bool IsLoopback(const std::string& host) {
  const std::string h = Unbracket(host);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}
bool IsWildcard(const std::string& host) {
  const std::string h = Unbracket(host);
  return h.empty() || h == "0.0.0.0" || h == "::";
}
// Whether a socket listening on `listen` accepts a connection to `target`.
bool Reaches(const std::string& listen, const std::string& target) {
  if (IsWildcard(listen)) return true;
  auto norm = [](std::string h) {
    h = Unbracket(h);
    return h == "localhost" ? std::string("127.0.0.1") : h;
  };
  return norm(listen) == norm(target);
}

}  // namespace

RouterCrossCheck CheckRouterUrls(const Deployment& d, const std::vector<std::string>& local_hosts) {
  RouterCrossCheck out;
  auto local = [&](const std::string& host) {
    return IsLoopback(host) ||
           std::find(local_hosts.begin(), local_hosts.end(), Unbracket(host)) != local_hosts.end();
  };
  auto role_key = [](const std::string& role) {
    return role == "colocated" ? std::string("no disaggregation-mode")
                               : "disaggregation-mode = \"" + role + "\"";
  };
  std::vector<std::string> referenced;
  bool any_router = false;
  for (const ServiceSpec& r : d.services) {
    if (r.command != ServiceCommand::kRouter) continue;
    any_router = true;
    const std::string who = "service " + Quoted(r.name) + ": ";
    const struct {
      const char* flag;
      const std::vector<std::string>* urls;
      const char* role;
    } lists[] = {{"worker", &r.router.o.workers, "colocated"},
                 {"prefill", &r.router.o.prefills, "prefill"},
                 {"decode", &r.router.o.decodes, "decode"}};
    for (const auto& list : lists) {
      // The services of that role, as the fix names them.
      std::string candidates;
      for (const ServiceSpec& s : d.services)
        if (s.command == ServiceCommand::kServe && s.role() == list.role && s.port() != 0)
          candidates += (candidates.empty() ? "" : ", ") + Quoted(s.name) + " on port " +
                        std::to_string(s.port());
      const std::string fix =
          candidates.empty()
              ? std::string(" (the file has no ") + list.role + " service: add one (" +
                    role_key(list.role) + "), or name a server of another machine)"
              : std::string(" (the file's ") + list.role + " services: " + candidates + ")";
      for (const std::string& url : *list.urls) {
        auto ep = router::ParseWorkerUrl(url);
        if (!ep.ok() || !local(ep->host)) continue;  // another machine: not ours to check
        const std::string at = who + "--" + list.flag + " " + url + ": ";
        if (ep->port == r.port()) {
          out.problems.push_back(at + "that is this router's own port; give the port of a " +
                                 list.role + " service" + fix);
          continue;
        }
        const ServiceSpec* target = nullptr;
        for (const ServiceSpec& s : d.services)
          if (s.port() == ep->port && &s != &r) target = &s;
        if (!target) {
          out.problems.push_back(at + "no service of " + d.path + " listens on port " +
                                 std::to_string(ep->port) + " of this machine; give the port of " +
                                 "a " + list.role + " service" + fix);
          continue;
        }
        referenced.push_back(target->name);
        const std::string role = target->role();
        if (role != list.role) {
          out.problems.push_back(at + "that is service " + Quoted(target->name) + ", a " + role +
                                 (target->command == ServiceCommand::kRouter
                                      ? ""
                                      : " service (" + role_key(role) + ")") +
                                 ", but --" + list.flag + " takes " + list.role + " services (" +
                                 role_key(list.role) + "): point it at one" + fix);
          continue;
        }
        if (!Reaches(target->serve.host, ep->host)) {
          out.problems.push_back(at + "service " + Quoted(target->name) + " listens on " +
                                 target->serve.host + " only (host), so the router cannot reach " +
                                 "it at " + ep->host + ": give the URL that address (http://" +
                                 target->serve.host + ":" + std::to_string(ep->port) +
                                 ") or let the service listen on every address (host = "
                                 "\"0.0.0.0\")");
          continue;
        }
        if (role != "prefill") continue;
        // The router hands the decode this URL's host as bootstrap_host.
        const std::string& bh = target->serve.disaggregation_bootstrap_host.empty()
                                    ? target->serve.host
                                    : target->serve.disaggregation_bootstrap_host;
        if (!Reaches(bh, ep->host))
          out.problems.push_back(
              at + "the router gives decode servers this URL's host, " + ep->host +
              ", as the bootstrap host, but service " + Quoted(target->name) +
              "'s bootstrap endpoint listens on " + bh +
              " only, so no decode can connect: set its disaggregation-bootstrap-host to " +
              ep->host + " or \"0.0.0.0\", or give the URL the address " + bh);
      }
    }
  }
  if (!any_router) return out;
  for (const ServiceSpec& s : d.services) {
    if (s.command != ServiceCommand::kServe || s.role() == "colocated") continue;
    if (std::find(referenced.begin(), referenced.end(), s.name) != referenced.end()) continue;
    out.warnings.push_back("service " + Quoted(s.name) + " (" + s.role() +
                           ") is behind no router of the file, so no request reaches it: add "
                           "its URL to a router's " +
                           s.role() + " = [...]");
  }
  return out;
}

DeploymentPlan PlanDeployment(const Deployment& d, const std::vector<ServiceInputs>& inputs,
                              const HostMemoryFacts& host,
                              const std::vector<std::string>& local_hosts) {
  DeploymentPlan out;
  std::vector<bool> service_ok;
  for (size_t i = 0; i < d.services.size(); ++i) {
    const ServiceSpec& s = d.services[i];
    const ServiceInputs& in = inputs[i];
    const std::string who = "service " + Quoted(s.name) + ": ";
    ServiceMemory m;
    m.name = s.name;
    if (s.command == ServiceCommand::kRouter) {  // no model, no KV: its port is all to check
      if (!in.port.ok())
        m.plan.problems.push_back("--port " + std::to_string(s.port()) + ": " + in.port.message());
      for (const std::string& p : m.plan.problems) out.problems.push_back(who + p);
      service_ok.push_back(m.plan.ok());
      out.services.push_back(std::move(m));
      continue;
    }
    m.plan = ValidateServeConfig(s.serve, in.model ? &*in.model : nullptr, in.env);
    m.numa_node = static_cast<int>(s.serve.numa_node);
    m.device = s.serve.model.device;
    m.on_cpu = m.device == "cpu";
    m.weight_bytes = in.env.weight_bytes;
    if (m.plan.layout) m.device_pool_bytes = m.plan.device_pages * m.plan.layout->BytesPerPage();
    if (m.plan.host_tier) m.host_tier_bytes = m.plan.host_tier->total_bytes;
    if (!in.model)
      m.plan.problems.push_back("--model-path " + s.serve.model.model_path + ": " +
                                in.model_status.message());
    if (!in.port.ok())
      m.plan.problems.push_back("--port " + std::to_string(s.serve.port) + ": " +
                                in.port.message());
    if (!in.bootstrap_port.ok())
      m.plan.problems.push_back("--disaggregation-bootstrap-port " +
                                std::to_string(s.serve.disaggregation_bootstrap_port) + ": " +
                                in.bootstrap_port.message());
    if (!in.transport.ok())
      m.plan.problems.push_back("--disaggregation-transfer-backend " +
                                s.serve.disaggregation_transfer_backend + ": " +
                                in.transport.message());
    for (const std::string& p : m.plan.problems) out.problems.push_back(who + p);
    for (const std::string& w : m.plan.warnings) out.warnings.push_back(who + w);
    service_ok.push_back(m.plan.ok());
    out.services.push_back(std::move(m));
  }

  for (std::string& p : UniquenessProblems(d)) out.problems.push_back(std::move(p));
  RouterCrossCheck urls = CheckRouterUrls(d, local_hosts);
  for (std::string& p : urls.problems) out.problems.push_back(std::move(p));
  for (std::string& w : urls.warnings) out.warnings.push_back(std::move(w));

  // GPU arenas together: services placed on one GPU must fit its free
  // memory side by side (each plan alone was checked against all of it).
  std::map<int, std::vector<const ServiceMemory*>> per_gpu;
  for (const ServiceMemory& m : out.services)
    if (m.plan.device_memory) per_gpu[m.plan.device_memory->device.device].push_back(&m);
  for (const auto& [gpu, services] : per_gpu) {
    if (services.size() < 2) continue;
    uint64_t sum = 0;
    std::string names;
    for (const ServiceMemory* m : services) {
      sum += m->plan.device_memory->arena_bytes;
      names += (names.empty() ? "" : ", ") + Quoted(m->name);
    }
    const uint64_t free_bytes = services[0]->plan.device_memory->device.free_bytes;
    if (sum > free_bytes)
      out.problems.push_back("services " + names + " share cuda:" + std::to_string(gpu) +
                             ": their --mem-fraction-static arenas take " + Size(sum) +
                             " together but " + Size(free_bytes) +
                             " is free; give them fractions that sum to less, or other GPUs");
  }

  // Memory together, per NUMA node and over every allowed node.
  if (host.nodes.empty()) {
    out.warnings.push_back(
        "this machine's free memory cannot be read, so the services' host memory was not summed");
    return out;
  }
  std::vector<int> rows;
  for (const ServiceMemory& m : out.services)
    if (m.numa_node >= 0 && CheckNumaNode(host, m.numa_node).ok() &&
        std::find(rows.begin(), rows.end(), m.numa_node) == rows.end())
      rows.push_back(m.numa_node);
  std::sort(rows.begin(), rows.end());
  rows.push_back(-1);
  for (int node : rows) {
    NodeBudget b;
    b.node = node;
    b.free_bytes = AllowedFreeBytes(host, node);
    b.reserve_bytes = DefaultHostReserveBytes(host, node, 0);
    bool all_ok = true;
    std::string parts;
    for (size_t i = 0; i < out.services.size(); ++i) {
      const ServiceMemory& m = out.services[i];
      if (node >= 0 && m.numa_node != node) continue;
      if (m.HostBytes() == 0) continue;
      b.planned_bytes += m.HostBytes();
      b.services.push_back(m.name);
      all_ok = all_ok && service_ok[i];
      std::string what;
      if (m.on_cpu)
        what = "weights " + Size(m.weight_bytes) + " + device pool " + Size(m.device_pool_bytes);
      if (m.host_tier_bytes > 0)
        what += (what.empty() ? "" : " + ") + std::string("host tier ") + Size(m.host_tier_bytes);
      parts += (parts.empty() ? "" : ", ") + Quoted(m.name) + " " + Size(m.HostBytes()) + " (" +
               what + ")";
    }
    // A service refused on its own is reported with its own fix first; its
    // numbers here would be partial.
    if (b.HeadroomBytes() < 0 && all_ok && !b.services.empty()) {
      const int64_t fits =
          static_cast<int64_t>(b.free_bytes) - static_cast<int64_t>(b.reserve_bytes);
      std::string cgroup;
      if (node < 0 && host.cgroup_limit_bytes > 0)
        cgroup = " (within the memory cgroup " + host.cgroup_path + ", limit " +
                 Size(host.cgroup_limit_bytes) + ")";
      out.problems.push_back(
          NodeName(host, node) + ": " + (b.services.size() > 1 ? "services " : "service ") + parts +
          " plan " + Size(b.planned_bytes) + " of host memory" +
          (b.services.size() > 1 ? " together" : "") + ", but " + Size(b.free_bytes) + " is free" +
          cgroup + " and " + Size(b.reserve_bytes) +
          " is kept back for the OS and activations, so at most " +
          Size(std::max<int64_t>(fits, 0)) + " fits (" + Size(-b.HeadroomBytes()) + " too much)" +
          (b.services.size() > 1
               ? ": each may fit alone, not together; lower hicache-size or hicache-ratio of some "
                 "of them, or place them on different NUMA nodes (numa-node = N)"
               : ": lower hicache-size or hicache-ratio, or max-total-tokens"));
    }
    out.nodes.push_back(std::move(b));
  }
  return out;
}

namespace {

// Left-aligned columns separated by two spaces.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line = "  ";
    for (size_t i = 0; i < r.size(); ++i)
      line += r[i] + (i + 1 < r.size() ? std::string(width[i] - r[i].size() + 2, ' ') : "");
    out += line + "\n";
  }
  return out;
}

std::string PerGroup(const std::optional<KvLayout>& layout, int64_t pages) {
  if (!layout || pages == 0) return "-";
  std::string out;
  for (size_t g = 0; g < layout->groups.size(); ++g)
    out += (out.empty() ? "" : ", ") + layout->groups[g].name + " " +
           Size(static_cast<long double>(pages) * layout->BytesPerPage(static_cast<int>(g)));
  return out;
}

}  // namespace

std::string FormatDeploymentPlan(const DeploymentPlan& plan) {
  std::vector<std::vector<std::string>> rows = {{"service", "device", "numa", "weights",
                                                 "device KV pool", "host pool (HiCache)",
                                                 "host memory"}};
  for (const ServiceMemory& m : plan.services) {
    rows.push_back({m.name, m.device, m.numa_node < 0 ? "any" : std::to_string(m.numa_node),
                    Size(m.weight_bytes), PerGroup(m.plan.layout, m.plan.device_pages),
                    PerGroup(m.plan.layout, m.plan.host_tier ? m.plan.host_tier->host_pages : 0),
                    Size(m.HostBytes())});
  }
  std::string out = "memory plan (GB = 10^9 bytes):\n" + Table(rows);
  if (!plan.nodes.empty()) {
    std::vector<std::vector<std::string>> nodes = {
        {"node", "free", "reserve", "planned", "headroom", "services"}};
    for (const NodeBudget& b : plan.nodes) {
      std::string names;
      for (const std::string& s : b.services) names += (names.empty() ? "" : ", ") + s;
      nodes.push_back({b.node < 0 ? "all" : std::to_string(b.node), Size(b.free_bytes),
                       Size(b.reserve_bytes), Size(b.planned_bytes), Size(b.HeadroomBytes()),
                       names.empty() ? "-" : names});
    }
    out += "host memory per NUMA node:\n" + Table(nodes);
  }
  for (const ServiceMemory& m : plan.services)
    if (m.plan.device_memory)
      out += "GPU memory of " + Quoted(m.name) + ": " + m.plan.device_memory->Describe() + "\n";
  return out;
}

}  // namespace strata::cli

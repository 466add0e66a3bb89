#include "cli/systemd_status.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.h"
#include "cli/serve_config.h"

namespace strata::cli {
namespace {

class ProcessRunner : public CommandRunner {
 public:
  StatusOr<std::string> Run(const std::vector<std::string>& argv) override {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return IoError("cannot create a pipe for " + cmd);
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return IoError("cannot create a pipe for " + cmd);
    }
    const pid_t pid = fork();
    if (pid < 0) return IoError("cannot fork for " + cmd);
    if (pid == 0) {
      dup2(out[1], 1);
      dup2(err[1], 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "%s", std::strerror(errno));
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    // systemctl's and journalctl's stderr is a line or two: reading stdout
    // to its end first cannot block the child on a full stderr pipe.
    auto drain = [](int fd) {
      std::string s;
      char buf[8192];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        s.append(buf, static_cast<size_t>(n));
      }
      close(fd);
      return s;
    };
    std::string stdout_text = drain(out[0]);
    std::string stderr_text = drain(err[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return stdout_text;
    while (!stderr_text.empty() && stderr_text.back() == '\n') stderr_text.pop_back();
    return Unavailable(cmd + " failed (" +
                       (WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                      : "signal " + std::to_string(WTERMSIG(st))) +
                       (stderr_text.empty() ? "" : ": " + stderr_text) + ")");
  }
};

int64_t ToInt(const std::string& s) {
  try {
    return s.empty() ? 0 : std::stoll(s);
  } catch (...) {
    return 0;
  }
}

// `--name=value` (as `strata systemd` writes them) in the unit's ExecStart
// property: "{ path=… ; argv[]=strata serve --port=30000 … ; ignore_errors=no ; … }".
std::string ExecFlag(const std::string& exec_start, const std::string& name) {
  const size_t argv_at = exec_start.find("argv[]=");
  if (argv_at == std::string::npos) return "";
  const size_t end = exec_start.find(" ;", argv_at);
  std::istringstream args(
      exec_start.substr(argv_at + 7, end == std::string::npos ? end : end - argv_at - 7));
  const std::string prefix = "--" + name + "=";
  std::string a, found;
  while (args >> a)
    if (a.rfind(prefix, 0) == 0) found = a.substr(prefix.size());
  return found;
}

bool ExecHasWord(const std::string& exec_start, const std::string& word) {
  const size_t argv_at = exec_start.find("argv[]=");
  if (argv_at == std::string::npos) return false;
  const size_t end = exec_start.find(" ;", argv_at);
  std::istringstream args(
      exec_start.substr(argv_at + 7, end == std::string::npos ? end : end - argv_at - 7));
  std::string a;
  args >> a;  // the program
  return args >> a && a == word;
}

ServiceState StateOf(const std::string& active, const std::string& sub, const std::string& result,
                     const std::optional<int>& exit_code) {
  if (active == "active" || active == "reloading") return ServiceState::kRunning;
  if (active == "activating")
    return sub == "auto-restart" ? ServiceState::kBackoff : ServiceState::kStarting;
  if (active == "failed" && result == "start-limit-hit") return ServiceState::kCrashloop;
  if ((active == "failed" || active == "inactive") && exit_code == kExitConfig)
    return ServiceState::kConfigError;
  return ServiceState::kStopped;
}

ServiceStatus FromProperties(const std::map<std::string, std::string>& p, double now_unix) {
  auto get = [&](const char* k) {
    auto it = p.find(k);
    return it == p.end() ? std::string() : it->second;
  };
  ServiceStatus s;
  std::string id = get("Id");
  s.name = id.substr(7, id.size() - 7 - 8);  // strata-NAME.service
  const std::string exec = get("ExecStart");
  const ServeConfig defaults;
  const std::string host = ExecFlag(exec, "host"), port = ExecFlag(exec, "port");
  s.host = host.empty() || host == "0.0.0.0" ? defaults.host : host;
  s.port = static_cast<int>(port.empty() ? defaults.port : ToInt(port));
  const std::string mode = ExecFlag(exec, "disaggregation-mode");
  s.role = ExecHasWord(exec, "router")      ? "router"
           : mode.empty() || mode == "null" ? "colocated"
                                            : mode;
  s.pid = static_cast<pid_t>(ToInt(get("MainPID")));
  s.restarts = ToInt(get("NRestarts"));
  // ExecMainCode: 0 never exited, 1 exited (status = code), 2 killed, 3 dumped (status = signal).
  const int64_t code = ToInt(get("ExecMainCode")), status = ToInt(get("ExecMainStatus"));
  if (code == 1) s.last_exit_code = static_cast<int>(status);
  if (code == 2 || code == 3) s.last_exit_code = static_cast<int>(128 + status);
  s.state = StateOf(get("ActiveState"), get("SubState"), get("Result"), s.last_exit_code);
  // --timestamp=unix: "@1764644400"; empty when it never started.
  const std::string start = get("ExecMainStartTimestamp");
  if (start.size() > 1 && start[0] == '@')
    s.start_time_s = static_cast<double>(ToInt(start.substr(1)));
  if (s.state == ServiceState::kRunning && s.pid > 0 && s.start_time_s > 0)
    s.uptime_s = std::max(0.0, now_unix - s.start_time_s);
  return s;
}

}  // namespace

std::unique_ptr<CommandRunner> MakeProcessRunner() { return std::make_unique<ProcessRunner>(); }

bool SystemdIsPid1() {
  struct stat st;
  return lstat("/run/systemd/system", &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<ServiceStatus> ParseSystemctlShow(std::string_view out, double now_unix) {
  std::vector<ServiceStatus> services;
  std::map<std::string, std::string> props;
  auto flush = [&] {
    const auto id = props.find("Id");
    if (id != props.end() && id->second.rfind("strata-", 0) == 0 && id->second.size() > 15 &&
        id->second.ends_with(".service"))
      services.push_back(FromProperties(props, now_unix));
    props.clear();
  };
  size_t at = 0;
  while (at <= out.size()) {
    size_t nl = out.find('\n', at);
    if (nl == std::string_view::npos) nl = out.size();
    const std::string_view line = out.substr(at, nl - at);
    if (line.empty()) {
      flush();
    } else if (const size_t eq = line.find('='); eq != std::string_view::npos) {
      props[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
    }
    at = nl + 1;
  }
  flush();
  return services;
}

StatusOr<std::vector<ServiceStatus>> SystemdServices(CommandRunner& run, double now_unix) {
  ASSIGN_OR_RETURN(std::string out, run.Run({"systemctl", "show", "--timestamp=unix", "-p",
                                             kSystemctlProperties, "strata-*.service"}));
  std::vector<ServiceStatus> services = ParseSystemctlShow(out, now_unix);
  for (ServiceStatus& s : services) {
    // JSON entries, so systemd's own lines about the unit ("Failed with
    // result 'exit-code'", "Scheduled restart job") can be told from the
    // service's output: they come from PID 1 with identifier "systemd".
    auto journal =
        run.Run({"journalctl", "-u", "strata-" + s.name + ".service", "-n", "60", "--no-pager",
                 "-q", "-o", "json", "--output-fields=MESSAGE,SYSLOG_IDENTIFIER,_PID"});
    if (!journal.ok()) continue;
    std::deque<std::string> lines;
    std::istringstream in(*journal);
    for (std::string l; std::getline(in, l);) {
      const nlohmann::json e = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
      if (!e.is_object() || !e.contains("MESSAGE") || !e["MESSAGE"].is_string()) continue;
      if (e.value("SYSLOG_IDENTIFIER", "") == "systemd" || e.value("_PID", "") == "1") continue;
      lines.push_back(e["MESSAGE"].get<std::string>());
      if (lines.size() > 20) lines.pop_front();
    }
    s.last_error = ErrorLine(lines);
    s.log_tail.assign(lines.begin(), lines.end());
  }
  return services;
}

}  // namespace strata::cli

#include "cli/supervisor.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/cli.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "1.5", "10": milliseconds as seconds for messages.
std::string Secs(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

// What /proc/<pid>/stat says of a process: its state letter and its start
// time (clock ticks after boot; with the pid it names one process for good).
struct ProcInfo {
  char state = 0;
  uint64_t start = 0;
};
std::optional<ProcInfo> ReadProc(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  const size_t close = text.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos || close + 2 > text.size()) return std::nullopt;
  std::istringstream rest(text.substr(close + 2));
  ProcInfo p;
  rest >> p.state;
  std::string skip;
  for (int field = 4; field <= 21; ++field) rest >> skip;  // ppid ... itrealvalue
  rest >> p.start;                                         // field 22: starttime
  if (!rest) return std::nullopt;
  return p;
}
// The process (pid, start) still runs: not gone, not reused, not a zombie
// (a zombie has closed its sockets; only its parent's wait is missing).
bool StillRuns(pid_t pid, uint64_t start) {
  if (pid <= 0) return false;
  std::optional<ProcInfo> p = ReadProc(pid);
  return p && p->start == start && p->state != 'Z' && p->state != 'X';
}

constexpr const char* kStateFile = "/launcher.state";

}  // namespace

Status StopLeftoverServices(const std::string& log_dir,
                            const std::function<void(const std::string&)>& log) {
  const std::string path = log_dir + kStateFile;
  std::ifstream in(path);
  if (!in) return OkStatus();
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  auto num = [](const nlohmann::json& j, const char* key) -> int64_t {
    if (!j.is_object()) return 0;
    auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  const nlohmann::json none;
  const nlohmann::json& launcher =
      doc.is_object() && doc.contains("launcher") ? doc.at("launcher") : none;
  const pid_t launcher_pid = static_cast<pid_t>(num(launcher, "pid"));
  if (launcher_pid != getpid() && StillRuns(launcher_pid, num(launcher, "start")))
    return FailedPrecondition(
        "another strata launch (pid " + std::to_string(launcher_pid) +
        ") supervises the services of log-dir " + log_dir + " (" + path +
        "): stop it first (kill " + std::to_string(launcher_pid) +
        " stops its services too), or give this deployment its own [launcher] log-dir");

  struct Leftover {
    std::string name;
    pid_t pid;
    uint64_t start;
    Clock::time_point deadline;
  };
  std::vector<Leftover> left;
  const auto now = Clock::now();
  if (doc.is_object() && doc.contains("children") && doc.at("children").is_array())
    for (const nlohmann::json& c : doc.at("children")) {
      const pid_t pid = static_cast<pid_t>(num(c, "pid"));
      const uint64_t start = static_cast<uint64_t>(num(c, "start"));
      if (!StillRuns(pid, start)) continue;
      const std::string name =
          c.contains("name") && c.at("name").is_string() ? c.at("name").get<std::string>() : "?";
      const auto drain =
          std::chrono::milliseconds(std::max<int64_t>(num(c, "drain_timeout_ms"), 0));
      left.push_back({name, pid, start, now + drain});
      const std::string line =
          "service '" + name + "': pid " + std::to_string(pid) + " of the previous launcher (pid " +
          std::to_string(launcher_pid) +
          ", gone) still runs (draining, or stopped); it gets SIGTERM, and SIGKILL after " +
          Secs(drain) + " s, so that its ports are free again";
      log(line);
      // Into the service's own log too: its story continues there.
      if (name.find('/') == std::string::npos) {
        std::ofstream(log_dir + "/" + name + ".log", std::ios::app)
            << "strata launch: " << line << "\n";
      }
      kill(pid, SIGCONT);  // a stopped process would not act on SIGTERM
      kill(pid, SIGTERM);
    }
  for (const Leftover& l : left) {
    while (StillRuns(l.pid, l.start) && Clock::now() < l.deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!StillRuns(l.pid, l.start)) continue;
    log("service '" + l.name + "': pid " + std::to_string(l.pid) +
        " did not exit within its drain timeout; SIGKILL");
    kill(l.pid, SIGKILL);
    const auto killed_by = Clock::now() + std::chrono::seconds(10);
    while (StillRuns(l.pid, l.start) && Clock::now() < killed_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (StillRuns(l.pid, l.start))
      return FailedPrecondition("service '" + l.name + "': pid " + std::to_string(l.pid) +
                                " of the previous launcher does not exit even after SIGKILL "
                                "(stuck in the kernel? see /proc/" +
                                std::to_string(l.pid) +
                                "/stack); it may hold its ports: end it, then launch again");
  }
  ::unlink(path.c_str());
  return OkStatus();
}

StatusOr<HttpReply> HttpGetOnce(const std::string& host, int port, const std::string& target,
                                std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    return Unavailable("cannot resolve " + host);
  const int fd = socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return Unavailable("cannot create a socket");
  }
  const auto deadline = Clock::now() + timeout;
  auto wait = [&](short events) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, static_cast<int>(left)) == 1;
  };
  Status st = OkStatus();
  HttpReply reply;
  if (::connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
    st = Unavailable("cannot connect to " + where + ": " + std::strerror(errno));
  } else if (!wait(POLLOUT)) {
    st = Unavailable("cannot connect to " + where + ": timed out");
  } else {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    const std::string req =
        "GET " + target + " HTTP/1.1\r\nHost: " + where + "\r\nConnection: close\r\n\r\n";
    if (err != 0) {
      st = Unavailable("cannot connect to " + where + ": " + std::strerror(err));
    } else if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) !=
               static_cast<ssize_t>(req.size())) {
      st = Unavailable("cannot send to " + where);
    } else {
      std::string raw;
      char buf[8192];
      size_t body_at = std::string::npos, want = std::string::npos;
      while (want == std::string::npos || raw.size() < want) {
        if (!wait(POLLIN)) break;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        raw.append(buf, static_cast<size_t>(n));
        if (body_at == std::string::npos && (body_at = raw.find("\r\n\r\n")) != std::string::npos) {
          body_at += 4;
          const std::string head = Lower(raw.substr(0, body_at));
          if (auto cl = head.find("\r\ncontent-length:"); cl != std::string::npos)
            want = body_at + std::strtoul(head.c_str() + cl + 17, nullptr, 10);
        }
      }
      if (body_at == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) {
        st = Unavailable("no HTTP response from " + where + " within " +
                         std::to_string(timeout.count()) + " ms");
      } else {
        reply.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
        reply.body = raw.substr(body_at);
      }
    }
  }
  close(fd);
  freeaddrinfo(res);
  if (!st.ok()) return st;
  return reply;
}

const char* ServiceStateName(ServiceState s) {
  switch (s) {
    case ServiceState::kStarting:
      return "starting";
    case ServiceState::kRunning:
      return "running";
    case ServiceState::kBackoff:
      return "backoff";
    case ServiceState::kCrashloop:
      return "crashloop";
    case ServiceState::kConfigError:
      return "config-error";
    case ServiceState::kStopped:
      return "stopped";
  }
  return "stopped";
}

std::string ErrorLine(const std::deque<std::string>& tail) {
  for (auto it = tail.rbegin(); it != tail.rend(); ++it) {
    const std::string l = Lower(*it);
    for (const char* word : {"error", "invalid", "fatal", "failed", "cannot", "abort"})
      if (l.find(word) != std::string::npos) return *it;
  }
  for (auto it = tail.rbegin(); it != tail.rend(); ++it)
    if (!it->empty()) return *it;
  return "";
}

SupervisorOptions SupervisorOptions::FromLauncher(const LauncherConfig& c) {
  using std::chrono::seconds;
  SupervisorOptions o;
  o.log_dir = c.log_dir;
  o.crashloop_burst = c.crashloop_burst;
  o.crashloop_interval = seconds(c.crashloop_interval_s);
  o.backoff_initial = seconds(c.backoff_initial_s);
  o.backoff_max = seconds(c.backoff_max_s);
  o.backoff_reset = seconds(c.backoff_reset_s);
  return o;
}

struct Supervisor::Child {
  SupervisedService spec;
  ServiceState state = ServiceState::kStopped;
  bool launched = false;
  pid_t pid = 0;
  int out_fd = -1;  // read end of the child's stdout+stderr
  int64_t restarts = 0;
  int64_t failures_in_row = 0;  // sets the backoff
  int64_t quick_failures = 0;   // the crash-loop count
  Clock::time_point started, ready_at, next_start, next_probe;
  bool ready = false;
  double start_time_s = 0;
  std::optional<int> last_exit;
  std::string last_error;
  std::string kill_reason;  // set when the supervisor killed it (readiness timeout)
  std::deque<std::string> tail;
  std::string partial;  // an unfinished last line
  // The log file.
  std::string log_path;
  int log_fd = -1;
  uint64_t log_bytes = 0;
};

Supervisor::Supervisor(SupervisorOptions options, std::unique_ptr<metrics::Registry> registry)
    : options_(std::move(options)), registry_(std::move(registry)) {}

StatusOr<std::unique_ptr<Supervisor>> Supervisor::Create(SupervisorOptions options,
                                                         std::vector<SupervisedService> services) {
  std::error_code ec;
  std::filesystem::create_directories(options.log_dir, ec);
  if (ec || access(options.log_dir.c_str(), W_OK) != 0)
    return FailedPrecondition(
        "[launcher] log-dir '" + options.log_dir + "' cannot be created or written: " +
        (ec ? ec.message() : std::string(std::strerror(errno))) + " (give a writable directory)");
  ASSIGN_OR_RETURN(auto registry, metrics::Registry::Create());
  std::unique_ptr<Supervisor> s(new Supervisor(std::move(options), std::move(registry)));
  metrics::Registry& r = *s->registry_;
  ASSIGN_OR_RETURN(s->up_, r.AddGauge("strata_service_up",
                                      "1 when the service is running (its /health answered 200).",
                                      {"service", "role"}));
  ASSIGN_OR_RETURN(s->restarts_,
                   r.AddCounter("strata_service_restarts_total",
                                "Times the launcher restarted the service.", {"service"}));
  ASSIGN_OR_RETURN(
      s->crashloop_,
      r.AddGauge("strata_service_crashloop",
                 "1 when the service crash-looped and is no longer restarted.", {"service"}));
  ASSIGN_OR_RETURN(s->exit_code_,
                   r.AddGauge("strata_service_last_exit_code",
                              "Exit code of the service's last process (128 + signal when "
                              "killed; 78: configuration error).",
                              {"service"}));
  ASSIGN_OR_RETURN(s->start_time_,
                   r.AddGauge("strata_service_start_time_seconds",
                              "Unix time the service's current process was started.", {"service"}));
  for (SupervisedService& spec : services) {
    auto c = std::make_unique<Child>();
    c->log_path = s->options_.log_dir + "/" + spec.name + ".log";
    c->log_fd = ::open(c->log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (c->log_fd < 0)
      return FailedPrecondition("cannot open the log file " + c->log_path + ": " +
                                std::strerror(errno) + " (check [launcher] log-dir)");
    struct stat st {};
    if (fstat(c->log_fd, &st) == 0) c->log_bytes = static_cast<uint64_t>(st.st_size);
    c->spec = std::move(spec);
    s->up_->Get({c->spec.name, c->spec.role});
    s->restarts_->Get({c->spec.name});
    s->crashloop_->Get({c->spec.name});
    s->children_.push_back(std::move(c));
  }
  s->state_path_ = s->options_.log_dir + kStateFile;
  s->WriteState();
  return s;
}

void Supervisor::WriteState() {
  nlohmann::json children = nlohmann::json::array();
  for (const auto& c : children_) {
    if (c->pid <= 0) continue;
    std::optional<ProcInfo> info = ReadProc(c->pid);
    children.push_back({{"name", c->spec.name},
                        {"pid", c->pid},
                        {"start", info ? info->start : 0},
                        {"drain_timeout_ms", c->spec.drain_timeout.count()}});
  }
  std::optional<ProcInfo> self = ReadProc(getpid());
  const nlohmann::json doc = {{"launcher", {{"pid", getpid()}, {"start", self ? self->start : 0}}},
                              {"children", children}};
  const std::string tmp = state_path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump() << "\n";
    if (!out) return;  // a full disk: the next launcher finds the last good file
  }
  ::rename(tmp.c_str(), state_path_.c_str());
}

Supervisor::~Supervisor() {
  Stop();
  for (auto& c : children_)
    if (c->log_fd >= 0) close(c->log_fd);
}

// Appends to the child's log; a file never passes max_log_bytes: when the
// next piece would, the file rotates (name.log -> name.log.1 -> ...; the
// oldest is dropped) at the last line end that fits.
static void WriteLog(const SupervisorOptions& o, std::string_view data, const std::string& path,
                     int& fd, uint64_t& bytes) {
  while (!data.empty() && fd >= 0) {
    const uint64_t max = o.max_log_bytes > 0 ? o.max_log_bytes : UINT64_MAX;  // 0: no rotation
    const uint64_t room = max > bytes ? max - bytes : 0;
    size_t take = data.size();
    if (take > room) {
      const size_t nl = room > 0 ? data.substr(0, room).rfind('\n') : std::string_view::npos;
      take = nl != std::string_view::npos ? nl + 1 : (bytes == 0 ? room : 0);
    }
    if (take == 0) {  // rotate, then write into the new file
      close(fd);
      for (int k = o.log_files - 1; k >= 1; --k) {
        const std::string from = k == 1 ? path : path + "." + std::to_string(k - 1);
        ::rename(from.c_str(), (path + "." + std::to_string(k)).c_str());
      }
      if (o.log_files <= 1) ::unlink(path.c_str());
      fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
      bytes = 0;
      continue;
    }
    const ssize_t n = ::write(fd, data.data(), take);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
    bytes += static_cast<uint64_t>(n);
  }
}

void Supervisor::Launch(Child& c) {
  const bool restart = c.launched;
  auto note = [&](const std::string& line) {
    const std::string text = "strata launch: " + line + "\n";
    WriteLog(options_, text, c.log_path, c.log_fd, c.log_bytes);
  };
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    note(std::string("cannot create a pipe: ") + std::strerror(errno));
    std::lock_guard lock(mu_);
    c.launched = true;
    c.state = ServiceState::kBackoff;
    c.next_start = Clock::now() + options_.backoff_initial;
    return;
  }
  std::vector<char*> argv;
  for (std::string& a : c.spec.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: its output into the pipe, signals as a fresh process has
    // them (the launcher blocks them for sigtimedwait), and it dies with the
    // launcher rather than run unsupervised.
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
    // Nothing else of the launcher: Asio's sockets are not close-on-exec, and
    // a child holding the launcher's listening socket would keep its port
    // after the launcher is gone.
    if (close_range(3, ~0U, 0) != 0)
      for (long fd = 3, max = sysconf(_SC_OPEN_MAX); fd < max; ++fd) close(static_cast<int>(fd));
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    // The launcher died before the line above: no signal will come.
    if (getppid() != parent) _exit(127);
    execv(argv[0], argv.data());
    // Only async-signal-safe calls between fork and exec (other threads may
    // hold the allocator's lock): no std::string here.
    const char* why = std::strerror(errno);
    for (const char* part : {"strata launch: cannot run ", static_cast<const char*>(argv[0]), ": ",
                             why, " (exit 127)\n"})
      (void)!::write(2, part, std::strlen(part));
    _exit(127);
  }
  close(fds[1]);
  std::string cmdline;
  for (const std::string& a : c.spec.argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  if (pid < 0) {
    close(fds[0]);
    note(std::string("cannot fork: ") + std::strerror(errno));
    std::lock_guard lock(mu_);
    c.launched = true;
    c.state = ServiceState::kBackoff;
    c.next_start = Clock::now() + options_.backoff_initial;
    return;
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  note((restart ? "restarting (pid " : "starting (pid ") + std::to_string(pid) + "): " + cmdline);
  {
    std::lock_guard lock(mu_);
    if (restart) {
      ++c.restarts;
      restarts_->Get({c.spec.name}).Inc();
    }
    c.launched = true;
    c.pid = pid;
    c.out_fd = fds[0];
    c.started = Clock::now();
    c.next_probe = c.started;
    c.start_time_s = UnixNow();
    c.ready = c.spec.port == 0;
    if (c.ready) c.ready_at = c.started;
    c.kill_reason.clear();
    c.state = c.ready ? ServiceState::kRunning : ServiceState::kStarting;
    UpdateMetricsLocked(c);
  }
  WriteState();
}

void Supervisor::ReadOutput(Child& c, bool until_eof) {
  if (c.out_fd < 0) return;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(c.out_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        close(c.out_fd);
        c.out_fd = -1;
      }
      break;
    }
    WriteLog(options_, std::string_view(buf, static_cast<size_t>(n)), c.log_path, c.log_fd,
             c.log_bytes);
    std::lock_guard lock(mu_);
    c.partial.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = c.partial.find('\n')) != std::string::npos) {
      c.tail.push_back(c.partial.substr(0, nl));
      c.partial.erase(0, nl + 1);
      while (static_cast<int>(c.tail.size()) > options_.tail_lines) c.tail.pop_front();
    }
    if (c.partial.size() > 4096) {  // a line without end: keep what fits
      c.tail.push_back(c.partial.substr(0, 4096));
      c.partial.clear();
    }
    if (!until_eof && n < static_cast<ssize_t>(sizeof buf)) break;
  }
}

void Supervisor::Exited(Child& c, int wait_status) {
  ReadOutput(c, /*until_eof=*/true);
  if (c.out_fd >= 0) {  // a grandchild holds the pipe: stop reading it
    close(c.out_fd);
    c.out_fd = -1;
  }
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  const auto now = Clock::now();
  const double ran = std::chrono::duration<double>(now - c.started).count();
  std::string line = "exited with code " + std::to_string(code);
  if (WIFSIGNALED(wait_status)) line += " (" + std::string(strsignal(WTERMSIG(wait_status))) + ")";
  line += " after " + std::to_string(static_cast<int64_t>(ran)) + " s";
  {
    std::lock_guard lock(mu_);
    c.pid = 0;
    c.last_exit = code;
    if (!c.partial.empty()) {
      c.tail.push_back(c.partial);
      c.partial.clear();
    }
    c.last_error = c.kill_reason.empty() ? ErrorLine(c.tail) : c.kill_reason;
    if (stopped_ || code == 0) {
      c.state = ServiceState::kStopped;
    } else if (code == kExitConfig) {
      c.state = ServiceState::kConfigError;
      line += ": configuration error, not restarted (fix the configuration, then launch again)";
    }
    UpdateMetricsLocked(c);
  }
  WriteState();
  if (!stopped_ && code != 0 && code != kExitConfig)
    Failed(c, line);
  else
    WriteLog(options_, "strata launch: " + line + "\n", c.log_path, c.log_fd, c.log_bytes);
}

void Supervisor::Failed(Child& c, const std::string& why) {
  const auto now = Clock::now();
  std::string line = why;
  {
    std::lock_guard lock(mu_);
    if (c.ready && now - c.ready_at >= options_.backoff_reset) c.failures_in_row = 0;
    ++c.failures_in_row;
    if (now - c.started < options_.crashloop_interval)
      ++c.quick_failures;
    else
      c.quick_failures = 0;
    if (c.quick_failures >= options_.crashloop_burst) {
      c.state = ServiceState::kCrashloop;
      line += ": crash loop (" + std::to_string(c.quick_failures) +
              " failures in a row, each within " + Secs(options_.crashloop_interval) +
              " s of its start), not restarted; fix the cause, then launch again";
    } else {
      auto delay = options_.backoff_initial;
      for (int64_t i = 1; i < c.failures_in_row && delay < options_.backoff_max; ++i) delay *= 2;
      delay = std::min(delay, options_.backoff_max);
      c.state = ServiceState::kBackoff;
      c.next_start = now + delay;
      line += "; restarting in " + Secs(delay) + " s";
    }
    UpdateMetricsLocked(c);
  }
  WriteLog(options_, "strata launch: " + line + "\n", c.log_path, c.log_fd, c.log_bytes);
}

void Supervisor::Poll(std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  std::vector<Child*> who;
  for (auto& c : children_)
    if (c->out_fd >= 0) {
      fds.push_back({c->out_fd, POLLIN, 0});
      who.push_back(c.get());
    }
  if (fds.empty())
    std::this_thread::sleep_for(wait);
  else if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) > 0)
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents) ReadOutput(*who[i], /*until_eof=*/false);
  if (stopped_) return;

  const auto now = Clock::now();
  for (auto& cp : children_) {
    Child& c = *cp;
    if (c.pid > 0) {
      int st = 0;
      if (waitpid(c.pid, &st, WNOHANG) == c.pid) {
        Exited(c, st);
        continue;
      }
    }
    if (c.state == ServiceState::kStarting && c.pid > 0 && now >= c.next_probe) {
      auto r = HttpGetOnce(c.spec.host, c.spec.port, "/health", std::chrono::milliseconds(1000));
      if (r.ok() && r->status == 200) {
        WriteLog(options_, "strata launch: healthy (GET /health 200)\n", c.log_path, c.log_fd,
                 c.log_bytes);
        std::lock_guard lock(mu_);
        c.ready = true;
        c.ready_at = Clock::now();
        c.state = ServiceState::kRunning;
        UpdateMetricsLocked(c);
      } else if (now - c.started > options_.ready_timeout) {
        c.kill_reason = "not healthy within " + Secs(options_.ready_timeout) +
                        " s (GET /health on " + c.spec.host + ":" + std::to_string(c.spec.port) +
                        "); killed";
        kill(c.pid, SIGKILL);
      } else {
        c.next_probe = Clock::now() + options_.health_interval;
      }
    }
  }
  // Start in order: the next service once the one before it is no longer
  // starting (it is running, or it failed and is the backoff's business).
  while (gate_ + 1 < children_.size() && children_[gate_]->launched &&
         children_[gate_]->state != ServiceState::kStarting)
    ++gate_;
  for (size_t i = 0; i < children_.size() && i <= gate_; ++i) {
    Child& c = *children_[i];
    if (!c.launched || (c.state == ServiceState::kBackoff && Clock::now() >= c.next_start))
      Launch(c);
  }
}

void Supervisor::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    Child& c = **it;
    if (c.pid > 0) {
      WriteLog(options_, "strata launch: stopping (SIGTERM)\n", c.log_path, c.log_fd, c.log_bytes);
      kill(c.pid, SIGTERM);
      const auto deadline = Clock::now() + c.spec.drain_timeout;
      int st = 0;
      bool gone = false;
      while (!(gone = waitpid(c.pid, &st, WNOHANG) == c.pid) && Clock::now() < deadline) {
        ReadOutput(c, false);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!gone) {
        WriteLog(options_, "strata launch: drain timeout passed; SIGKILL\n", c.log_path, c.log_fd,
                 c.log_bytes);
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &st, 0);
      }
      Exited(c, st);
    }
    std::lock_guard lock(mu_);
    if (c.state == ServiceState::kBackoff || c.state == ServiceState::kStarting ||
        c.state == ServiceState::kRunning)
      c.state = ServiceState::kStopped;
    UpdateMetricsLocked(c);
  }
  ::unlink(state_path_.c_str());  // nothing of this launcher runs any more
}

void Supervisor::UpdateMetricsLocked(Child& c) {
  up_->Get({c.spec.name, c.spec.role}).Set(c.state == ServiceState::kRunning ? 1 : 0);
  crashloop_->Get({c.spec.name}).Set(c.state == ServiceState::kCrashloop ? 1 : 0);
  if (c.last_exit) exit_code_->Get({c.spec.name}).Set(*c.last_exit);
  if (c.start_time_s > 0) start_time_->Get({c.spec.name}).Set(c.start_time_s);
}

ServiceStatus Supervisor::StatusLocked(const Child& c) const {
  ServiceStatus s;
  s.name = c.spec.name;
  s.role = c.spec.role;
  s.host = c.spec.host;
  s.port = c.spec.port;
  s.state = c.state;
  s.pid = c.pid;
  s.restarts = c.restarts;
  if (c.pid > 0) s.uptime_s = std::chrono::duration<double>(Clock::now() - c.started).count();
  s.start_time_s = c.start_time_s;
  s.last_exit_code = c.last_exit;
  s.last_error = c.last_error;
  s.log_tail.assign(c.tail.begin(), c.tail.end());
  return s;
}

std::vector<ServiceStatus> Supervisor::Snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<ServiceStatus> out;
  for (const auto& c : children_) out.push_back(StatusLocked(*c));
  return out;
}

std::string Supervisor::ServicesJson() const { return cli::ServicesJson(Snapshot()); }

std::string ServicesJson(const std::vector<ServiceStatus>& statuses) {
  nlohmann::json services = nlohmann::json::array();
  for (const ServiceStatus& s : statuses) {
    nlohmann::json j;
    j["name"] = s.name;
    j["state"] = ServiceStateName(s.state);
    j["pid"] = s.pid;
    j["restarts"] = s.restarts;
    j["uptime_s"] = s.uptime_s;
    j["last_exit_code"] = s.last_exit_code ? nlohmann::json(*s.last_exit_code) : nullptr;
    j["last_error"] = s.last_error;
    j["port"] = s.port;
    j["host"] = s.host;
    j["role"] = s.role;
    j["log_tail"] = s.log_tail;
    services.push_back(std::move(j));
  }
  // Replace, not throw, on bytes that are not UTF-8 (a child's output).
  return nlohmann::json{{"services", services}}.dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace);
}

std::string Supervisor::PrometheusTargetsJson() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const ServiceStatus& s : Snapshot()) {
    if (s.port == 0) continue;  // no known address to scrape
    // An IPv6 literal needs brackets in host:port.
    const std::string host = s.host.find(':') != std::string::npos ? "[" + s.host + "]" : s.host;
    groups.push_back({{"targets", {host + ":" + std::to_string(s.port)}},
                      {"labels", {{"service", s.name}, {"role", s.role}}}});
  }
  return groups.dump();
}

std::string Supervisor::RenderMetrics() const { return registry_->Render(); }

}  // namespace strata::cli

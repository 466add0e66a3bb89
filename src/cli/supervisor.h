// The supervisor behind `strata launch`: runs the services of a deployment
// as child processes, in order, each gated on readiness (GET /health 200 on
// its port) before the next starts; restarts a failed one with exponential
// backoff; never restarts one that exited 78 (EX_CONFIG: state config-error);
// stops restarting one that crash-loops (state crashloop); writes each
// child's stdout+stderr to <log-dir>/<name>.log with size-based rotation and
// keeps its last lines in memory as the reason shown by `strata status`.
//
// Rules (docs/architecture/cli.md, "strata launch"):
//   - a failure is an exit with a code other than 0 and 78, a death by a
//     signal, or readiness not reached within ready_timeout (then SIGKILL);
//   - the restart delay of the n-th failure in a row is
//     backoff_initial * 2^(n-1), capped at backoff_max; a run that stayed
//     running (healthy) for backoff_reset resets n;
//   - crash loop: crashloop_burst failures in a row, each after less than
//     crashloop_interval of *running time* since its start. The backoff wait
//     between them does not count, so "5 failures in 10 s" can happen with a
//     10 s first backoff (systemd's wall-clock window could never see it);
//     a run that lasted crashloop_interval or longer starts the count anew;
//   - exit 0 (the service stopped by itself or by someone else's SIGTERM):
//     state stopped, not restarted (systemd's Restart=on-failure).
//
// A launcher restart loses nothing: its children die with it and the next
// launcher starts them afresh. Each child has PR_SET_PDEATHSIG = SIGTERM
// (it drains as on `strata launch`'s own SIGTERM; the signal comes when the
// thread that forked it exits, so Poll() runs on a thread that lives as
// long as the supervisor: the launcher's main thread). A child still
// draining (or stopped, or one that outlived the launcher some other way)
// would hold its ports when the next launcher starts, so the supervisor
// keeps <log-dir>/launcher.state (its own pid and each child's pid, with
// their start times from /proc, so a reused pid is not mistaken for one of
// them) and the next launcher's StopLeftoverServices ends those processes
// (SIGTERM, up to their drain timeout, then SIGKILL) before its check
// probes the ports. Re-adopting them instead is not possible: only a
// parent can wait for a process's exit status.
//
// Time: Poll() reads std::chrono::steady_clock (tests set the durations small).
// Thread-safety: Poll(), Stop() and the constructor from one thread (the
// launcher's main loop); Snapshot(), ServicesJson() and RenderMetrics() from
// any thread (the launcher's HTTP threads) — they take the one mutex.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cli/deploy_config.h"
#include "metrics/metrics.h"

namespace strata::cli {

enum class ServiceState { kStarting, kRunning, kBackoff, kCrashloop, kConfigError, kStopped };
// "starting", "running", "backoff", "crashloop", "config-error", "stopped".
const char* ServiceStateName(ServiceState s);

// One child to supervise.
struct SupervisedService {
  std::string name;
  std::string role = "colocated";  // the strata_service_up label (serve's registry role)
  std::vector<std::string> argv;   // argv[0] is the program (execv, no PATH search)
  std::string host = "127.0.0.1";
  int port = 0;  // GET /health here gates readiness; 0: running once started
  std::chrono::milliseconds drain_timeout{35'000};  // SIGTERM to SIGKILL at stop
};

struct SupervisorOptions {
  std::string log_dir = "strata-logs";
  uint64_t max_log_bytes = uint64_t{10} << 20;  // then name.log -> name.log.1 -> ...
  int log_files = 3;                            // name.log, name.log.1, name.log.2
  int tail_lines = 20;                          // kept in memory per service
  int64_t crashloop_burst = 5;
  std::chrono::milliseconds crashloop_interval{10'000};
  std::chrono::milliseconds backoff_initial{10'000};
  std::chrono::milliseconds backoff_max{300'000};
  std::chrono::milliseconds backoff_reset{600'000};
  std::chrono::milliseconds ready_timeout{300'000};  // weights of a large model load slowly
  std::chrono::milliseconds health_interval{200};    // between /health probes while starting

  // The [launcher] table's settings (seconds) as options.
  static SupervisorOptions FromLauncher(const LauncherConfig& c);
};

// What `strata status` shows of one service.
struct ServiceStatus {
  std::string name, role, host;
  ServiceState state = ServiceState::kStopped;
  pid_t pid = 0;  // 0 when no process runs
  int port = 0;
  int64_t restarts = 0;
  double uptime_s = 0;                // of the running process; 0 when none
  double start_time_s = 0;            // Unix time of the last start; 0 before the first
  std::optional<int> last_exit_code;  // 128 + signal for a death by signal
  std::string last_error;             // the last error-looking line of its output
  std::vector<std::string> log_tail;  // its last lines
};

// The line of a service's last output lines that says why it ended: the last
// that looks like an error (error, invalid, fatal, failed, cannot, abort),
// else the last non-empty one. (`last_error`; `strata status` under systemd
// applies it to the journal.)
std::string ErrorLine(const std::deque<std::string>& lines);

// {"services":[{"name","state","pid","restarts","uptime_s","last_exit_code",
//  "last_error","port","host","role","log_tail"}]}: GET /v1/services, and
// `strata status --json` for systemd units.
std::string ServicesJson(const std::vector<ServiceStatus>& statuses);

// Before a launcher starts the services of `log_dir`: ends the processes a
// previous launcher of that log-dir left running (its <log-dir>/
// launcher.state names them; processes that are gone, or whose pid now
// belongs to another process, are skipped): SIGCONT and SIGTERM, up to each
// one's drain timeout, then SIGKILL; `log` gets one line per process (and
// the service's log file a line too). FailedPrecondition, touching nothing,
// when the launcher that wrote the file still runs. OK when there is no
// file. Blocks while processes drain.
Status StopLeftoverServices(const std::string& log_dir,
                            const std::function<void(const std::string&)>& log);

// One blocking HTTP/1.1 GET (Connection: close) of http://host:port/target,
// for the readiness probe and `strata status`. Unavailable (naming
// host:port and why) when nothing answers within `timeout`.
struct HttpReply {
  int status = 0;
  std::string body;
};
StatusOr<HttpReply> HttpGetOnce(const std::string& host, int port, const std::string& target,
                                std::chrono::milliseconds timeout);

class Supervisor {
 public:
  // Creates log_dir (an error names it) and the metric families. Starts nothing.
  static StatusOr<std::unique_ptr<Supervisor>> Create(SupervisorOptions options,
                                                      std::vector<SupervisedService> services);
  ~Supervisor();  // Stop()

  // One step: reads the children's output into their logs (waiting up to
  // `wait` for some), reaps exits, probes /health of starting services,
  // starts the next service once the one before it is no longer starting,
  // and restarts those whose backoff is over. Call in a loop.
  void Poll(std::chrono::milliseconds wait);
  // Stops every service in reverse order: SIGTERM, up to its drain_timeout,
  // then SIGKILL. Afterwards every service is stopped. Idempotent.
  void Stop();

  std::vector<ServiceStatus> Snapshot() const;
  std::string ServicesJson() const;  // cli::ServicesJson(Snapshot())
  // Prometheus HTTP service discovery (http_sd_configs): one target group per
  // service with a port, whatever its state (a down service is a target whose
  // `up` is 0): [{"targets":["host:port"],"labels":{"service","role"}}].
  // deploy/prometheus/prometheus.yml scrapes the services through it.
  std::string PrometheusTargetsJson() const;
  // strata_service_{up,restarts_total,crashloop,last_exit_code,start_time_seconds}.
  std::string RenderMetrics() const;

 private:
  struct Child;
  Supervisor(SupervisorOptions options, std::unique_ptr<metrics::Registry> registry);
  void Launch(Child& c);
  void Exited(Child& c, int wait_status);
  void Failed(Child& c, const std::string& why);  // backoff or crashloop
  void ReadOutput(Child& c, bool until_eof);
  void UpdateMetricsLocked(Child& c);
  // Rewrites <log-dir>/launcher.state (atomically: a temporary file, then
  // rename) with this process and the children running now.
  void WriteState();
  ServiceStatus StatusLocked(const Child& c) const;

  const SupervisorOptions options_;
  std::unique_ptr<metrics::Registry> registry_;
  metrics::Family<metrics::Gauge>* up_ = nullptr;
  metrics::Family<metrics::Counter>* restarts_ = nullptr;
  metrics::Family<metrics::Gauge>* crashloop_ = nullptr;
  metrics::Family<metrics::Gauge>* exit_code_ = nullptr;
  metrics::Family<metrics::Gauge>* start_time_ = nullptr;
  mutable std::mutex mu_;  // guards the children's status fields
  std::vector<std::unique_ptr<Child>> children_;
  std::string state_path_;
  size_t gate_ = 0;  // services [0, gate_] may start; advances past one not starting
  bool stopped_ = false;
};

}  // namespace strata::cli

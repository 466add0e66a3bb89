// Test helpers: `strata serve` (Server) and other strata commands
// (StrataProcess; router_test_process.h) as child processes on ephemeral
// ports, their stderr in log files, for the end-to-end tests of the binary.
// REQUIRES: STRATA_BINARY and STRATA_SOURCE_DIR defined by the build.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "server/http_test_client.h"
#include "util/stop_process.h"

namespace strata::http_test {

inline std::string Fixture(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// A `strata <command>` child process on an ephemeral port (--port 0): the
// port is read from the line it logs once serving, its stderr goes to a log
// file, and it is killed (SIGKILL) when the object goes.
class StrataProcess {
 public:
  StrataProcess(const std::string& command, std::vector<std::string> fixed_args,
                const std::vector<std::string>& args, const std::string& ready_regex,
                std::chrono::milliseconds request_timeout)
      : request_timeout_(request_timeout) {
    log_ = ::testing::TempDir() + "/" + command + "_" + std::to_string(getpid()) + "_" +
           std::to_string(counter_++) + ".log";
    // Emptied here, before the child exists: a test process that reuses the
    // pid of an earlier one (ctest runs ~1,000 of them) would otherwise read
    // that one's stale log, with its port, before the child truncates it, and
    // talk to a dead server (a rare "Send failed, status 0" at once).
    { std::ofstream(log_, std::ios::trunc); }
    pid_ = fork();
    if (pid_ == 0) {
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      std::vector<std::string> all = {STRATA_BINARY, command};
      all.insert(all.end(), fixed_args.begin(), fixed_args.end());
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(STRATA_BINARY, argv.data());
      _exit(127);
    }
    const std::regex re(ready_regex);
    Eventually(
        [&] {
          std::smatch m;
          std::string l = Log();
          if (std::regex_search(l, m, re)) port_ = std::stoi(m[1]);
          return port_ > 0 || Exited();
        },
        std::chrono::seconds(30));
  }
  ~StrataProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  StrataProcess(const StrataProcess&) = delete;
  StrataProcess& operator=(const StrataProcess&) = delete;

  int port() const { return port_; }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  bool Exited() {
    if (exited_) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      exited_ = true;
      code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -100 - WTERMSIG(st);
    }
    return exited_;
  }
  int WaitExit(std::chrono::seconds timeout) {
    Eventually([&] { return Exited(); }, timeout);
    return exited_ ? code_ : -2;
  }
  void Signal(int sig) { kill(pid_, sig); }
  // SIGSTOP, returning once every thread of the process is stopped (a bare
  // Signal(SIGSTOP) lets it run on until it is scheduled: util/stop_process.h).
  void Stop() { ASSERT_TRUE(StopProcess(pid_)) << "the process did not stop"; }

  Response Request(const std::string& raw) { return Request(raw, request_timeout_); }
  Response Request(const std::string& raw, std::chrono::milliseconds timeout) {
    Client c(Connect(port_, timeout));
    EXPECT_TRUE(c.Send(raw));
    auto r = c.Read();
    return r ? *r : Response{};
  }
  Response PostJson(const std::string& path, const std::string& body, const std::string& extra = "") {
    return PostJson(path, body, extra, request_timeout_);
  }
  Response PostJson(const std::string& path, const std::string& body, const std::string& extra,
                    std::chrono::milliseconds timeout) {
    return Request(Post(path, body, "Content-Type: application/json\r\n" + extra), timeout);
  }
  // The process's thread count, from /proc/PID/status (-1 if unknown).
  int Threads() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string key;
    while (in >> key)
      if (key == "Threads:") {
        int n = 0;
        in >> n;
        return n;
      }
    return -1;
  }
  // The value of one series of /metrics (-1 if absent).
  double Metric(const std::string& series) {
    Response r = Request(Get("/metrics"));
    const size_t pos = r.body.find("\n" + series + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(r.body.substr(pos + series.size() + 2, 32));
  }

 private:
  static inline int counter_ = 0;
  std::chrono::milliseconds request_timeout_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  int code_ = -1;
  std::string log_;
};

// `strata serve --port 0 --threads 1 ARGS...`.
class Server : public StrataProcess {
 public:
  explicit Server(const std::vector<std::string>& args)
      : StrataProcess("serve", {"--port", "0", "--threads", "1"}, args, "on http://[^ :]+:(\\d+)",
                      std::chrono::seconds(5)) {}
};

}  // namespace strata::http_test

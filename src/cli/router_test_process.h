// Test helper: a `strata router` child process on an ephemeral port, with its
// stderr in a log file (as serve_test_process.h does for `strata serve`).
// REQUIRES: STRATA_BINARY defined by the build.
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

namespace strata::http_test {

class RouterProcess {
 public:
  explicit RouterProcess(std::vector<std::string> args) {
    log_ = ::testing::TempDir() + "/router_" + std::to_string(getpid()) + "_" +
           std::to_string(counter_++) + ".log";
    pid_ = fork();
    if (pid_ == 0) {
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      std::vector<std::string> all = {STRATA_BINARY, "router", "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(STRATA_BINARY, argv.data());
      _exit(127);
    }
    Eventually(
        [&] {
          std::smatch m;
          std::string l = Log();
          static const std::regex re("routing on http://[^ ]+:(\\d+)");
          if (std::regex_search(l, m, re)) port_ = std::stoi(m[1]);
          return port_ > 0 || Exited();
        },
        std::chrono::seconds(30));
  }
  ~RouterProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
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

  Response Request(const std::string& raw,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    Client c(Connect(port_, timeout));
    EXPECT_TRUE(c.Send(raw));
    auto r = c.Read();
    return r ? *r : Response{};
  }
  Response PostJson(const std::string& path, const std::string& body, const std::string& extra = "",
                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    return Request(Post(path, body, "Content-Type: application/json\r\n" + extra), timeout);
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
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  int code_ = -1;
  std::string log_;
};

}  // namespace strata::http_test

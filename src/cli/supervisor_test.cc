// Tests of the supervisor's rules with fake children: /bin/sh scripts that
// print a line and exit with a chosen code (fault injection), or sleep. The
// real `strata serve` under `strata launch` is in launch_e2e_test.cc.
#include "cli/supervisor.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

SupervisedService Sh(const std::string& name, const std::string& script) {
  SupervisedService s;
  s.name = name;
  s.argv = {"/bin/sh", "-c", script};
  s.drain_timeout = milliseconds(2000);
  return s;
}

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/supervisor_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    tmp_ = tmpl;
    opt_.log_dir = tmp_ + "/logs";
    opt_.crashloop_burst = 3;
    opt_.crashloop_interval = milliseconds(10'000);
    opt_.backoff_initial = milliseconds(10);
    opt_.backoff_max = milliseconds(40);
    opt_.backoff_reset = milliseconds(600'000);
  }
  void TearDown() override {
    sup_.reset();
    fs::remove_all(tmp_);
  }
  Supervisor& Start(std::vector<SupervisedService> services) {
    auto s = Supervisor::Create(opt_, std::move(services));
    EXPECT_TRUE(s.ok()) << s.status().message();
    sup_ = std::move(*s);
    return *sup_;
  }
  // Polls until `pred` holds for service i (false after 20 s: a hang).
  template <typename P>
  bool PollUntil(size_t i, P pred) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      sup_->Poll(milliseconds(10));
      if (pred(sup_->Snapshot()[i])) return true;
    }
    return false;
  }
  void PollFor(milliseconds d) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) sup_->Poll(milliseconds(10));
  }

  std::string tmp_;
  SupervisorOptions opt_;
  std::unique_ptr<Supervisor> sup_;
};

TEST_F(SupervisorTest, AConfigErrorIsNeverRestartedAndKeepsItsMessage) {
  Supervisor& s = Start({Sh(
      "prefill", "echo 'strata serve: invalid configuration: --hicache-size 9000 GB'; exit 78")});
  ASSERT_TRUE(
      PollUntil(0, [](const ServiceStatus& st) { return st.state == ServiceState::kConfigError; }));
  PollFor(milliseconds(300));  // many backoffs long
  const ServiceStatus st = s.Snapshot()[0];
  EXPECT_EQ(st.state, ServiceState::kConfigError);
  EXPECT_EQ(st.restarts, 0);
  EXPECT_EQ(st.last_exit_code, 78);
  EXPECT_EQ(st.pid, 0);
  EXPECT_THAT(st.last_error, HasSubstr("--hicache-size 9000 GB"));
  EXPECT_THAT(s.RenderMetrics(),
              HasSubstr("strata_service_last_exit_code{service=\"prefill\"} 78"));
  EXPECT_THAT(s.RenderMetrics(), HasSubstr("strata_service_crashloop{service=\"prefill\"} 0"));
}

TEST_F(SupervisorTest, ACrashLoopStopsAfterTheBurstWithItsLastErrorLine) {
  Supervisor& s = Start({Sh("w", "echo loading; echo 'error: weights missing' >&2; exit 66")});
  ASSERT_TRUE(
      PollUntil(0, [](const ServiceStatus& st) { return st.state == ServiceState::kCrashloop; }));
  PollFor(milliseconds(300));
  const ServiceStatus st = s.Snapshot()[0];
  EXPECT_EQ(st.state, ServiceState::kCrashloop);
  EXPECT_EQ(st.restarts, 2);  // 3 starts = the burst
  EXPECT_EQ(st.last_error, "error: weights missing");
  const std::string m = s.RenderMetrics();
  EXPECT_THAT(m, HasSubstr("strata_service_crashloop{service=\"w\"} 1"));
  EXPECT_THAT(m, HasSubstr("strata_service_restarts_total{service=\"w\"} 2"));
  EXPECT_THAT(m, HasSubstr("strata_service_up{service=\"w\",role=\"colocated\"} 0"));
  EXPECT_THAT(m, HasSubstr("strata_service_last_exit_code{service=\"w\"} 66"));
  EXPECT_THAT(Read(opt_.log_dir + "/w.log"), HasSubstr("crash loop (3 failures in a row"));
  // The JSON of the status API.
  auto j = nlohmann::json::parse(s.ServicesJson());
  ASSERT_EQ(j["services"].size(), 1u);
  const auto& w = j["services"][0];
  EXPECT_EQ(w["name"], "w");
  EXPECT_EQ(w["state"], "crashloop");
  EXPECT_EQ(w["pid"], 0);
  EXPECT_EQ(w["restarts"], 2);
  EXPECT_EQ(w["last_exit_code"], 66);
  EXPECT_EQ(w["last_error"], "error: weights missing");
  EXPECT_EQ(w["port"], 0);
  EXPECT_TRUE(w.contains("uptime_s"));
}

TEST_F(SupervisorTest, TheBackoffDoublesUpToItsCap) {
  opt_.crashloop_burst = 6;
  Start({Sh("w", "exit 1")});
  ASSERT_TRUE(
      PollUntil(0, [](const ServiceStatus& st) { return st.state == ServiceState::kCrashloop; }));
  const std::string log = Read(opt_.log_dir + "/w.log");
  const size_t a = log.find("restarting in 0.01 s"), b = log.find("restarting in 0.02 s"),
               c = log.find("restarting in 0.04 s"), d = log.rfind("restarting in 0.04 s");
  EXPECT_TRUE(a < b && b < c && c < d) << log;  // 10, 20, 40, 40 (capped), 40 ms
  EXPECT_EQ(log.find("restarting in 0.08 s"), std::string::npos) << log;
}

TEST_F(SupervisorTest, AHealthyRunLongerThanBackoffResetResetsTheBackoff) {
  opt_.crashloop_burst = 100;
  opt_.backoff_reset = milliseconds(50);
  Start({Sh("w", "sleep 0.1; exit 1")});
  ASSERT_TRUE(PollUntil(0, [](const ServiceStatus& st) { return st.restarts >= 3; }));
  const std::string log = Read(opt_.log_dir + "/w.log");
  EXPECT_THAT(log, HasSubstr("restarting in 0.01 s"));
  EXPECT_EQ(log.find("restarting in 0.02 s"), std::string::npos) << log;
}

TEST_F(SupervisorTest, FailuresAfterLongRunsAreNotACrashLoop) {
  opt_.crashloop_burst = 2;
  opt_.crashloop_interval = milliseconds(50);
  Supervisor& s = Start({Sh("slow", "sleep 0.15; exit 1")});
  ASSERT_TRUE(PollUntil(0, [](const ServiceStatus& st) { return st.restarts >= 3; }));
  EXPECT_NE(s.Snapshot()[0].state, ServiceState::kCrashloop);
  // The same failures quicker than the interval are one.
  opt_.crashloop_interval = milliseconds(10'000);
  Supervisor& q = Start({Sh("slow", "sleep 0.15; exit 1")});
  ASSERT_TRUE(
      PollUntil(0, [](const ServiceStatus& st) { return st.state == ServiceState::kCrashloop; }));
  EXPECT_EQ(q.Snapshot()[0].restarts, 1);
}

TEST_F(SupervisorTest, AKilledServiceIsRestarted) {
  Supervisor& s = Start({Sh("w", "exec sleep 60")});
  ASSERT_TRUE(PollUntil(
      0, [](const ServiceStatus& st) { return st.state == ServiceState::kRunning && st.pid > 0; }));
  const pid_t first = s.Snapshot()[0].pid;
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(PollUntil(0, [&](const ServiceStatus& st) {
    return st.state == ServiceState::kRunning && st.pid > 0 && st.pid != first;
  }));
  const ServiceStatus st = s.Snapshot()[0];
  EXPECT_EQ(st.restarts, 1);
  EXPECT_EQ(st.last_exit_code, 128 + SIGKILL);
  EXPECT_THAT(s.RenderMetrics(),
              HasSubstr("strata_service_up{service=\"w\",role=\"colocated\"} 1"));
}

TEST_F(SupervisorTest, PrometheusTargetsListEveryServiceWithAPortInAnyState) {
  SupervisedService a = Sh("a", "exec sleep 60");
  a.port = 1;  // nothing listens: a stays starting, and is a target all the same
  SupervisedService b = Sh("b", "exit 0");
  b.host = "::1";
  b.port = 2;
  SupervisedService c = Sh("c", "exec sleep 60");  // port 0: no address to scrape
  Supervisor& s = Start({a, b, c});
  const auto j = nlohmann::json::parse(s.PrometheusTargetsJson());
  ASSERT_EQ(j.size(), 2u) << j.dump();
  EXPECT_EQ(j[0]["targets"], nlohmann::json::array({"127.0.0.1:1"}));
  EXPECT_EQ(j[0]["labels"], (nlohmann::json{{"service", "a"}, {"role", "colocated"}}));
  EXPECT_EQ(j[1]["targets"], nlohmann::json::array({"[::1]:2"}));
  EXPECT_EQ(j[1]["labels"]["service"], "b");
}

TEST_F(SupervisorTest, ExitZeroIsStoppedNotRestarted) {
  Supervisor& s = Start({Sh("w", "exit 0")});
  ASSERT_TRUE(PollUntil(0, [](const ServiceStatus& st) { return st.last_exit_code.has_value(); }));
  PollFor(milliseconds(200));
  EXPECT_EQ(s.Snapshot()[0].state, ServiceState::kStopped);
  EXPECT_EQ(s.Snapshot()[0].restarts, 0);
}

TEST_F(SupervisorTest, StartsWaitForTheOneBeforeToBeReady) {
  // "first" listens nowhere, so it stays starting until ready_timeout kills it.
  opt_.ready_timeout = milliseconds(500);
  opt_.crashloop_burst = 1;
  SupervisedService first = Sh("first", "exec sleep 60");
  first.port = 1;  // nothing answers /health there
  Supervisor& s = Start({first, Sh("second", "exec sleep 60")});
  PollFor(milliseconds(200));
  EXPECT_EQ(s.Snapshot()[0].state, ServiceState::kStarting);
  EXPECT_EQ(s.Snapshot()[1].pid, 0);  // not started yet
  EXPECT_EQ(s.Snapshot()[1].start_time_s, 0);
  ASSERT_TRUE(
      PollUntil(1, [](const ServiceStatus& st) { return st.state == ServiceState::kRunning; }));
  const ServiceStatus f = s.Snapshot()[0];
  EXPECT_EQ(f.state, ServiceState::kCrashloop);
  EXPECT_THAT(f.last_error, HasSubstr("not healthy within 0.5 s (GET /health on 127.0.0.1:1)"));
}

TEST_F(SupervisorTest, StopDrainsInReverseOrderAndKillsWhatDoesNotStop) {
  const std::string order = tmp_ + "/order";
  auto polite = [&](const std::string& name) {
    return Sh(name, "trap 'echo " + name + " >> " + order +
                        "; exit 0' TERM; while :; do sleep 0.05; done");
  };
  SupervisedService stubborn = Sh("stubborn", "trap '' TERM; while :; do sleep 0.05; done");
  stubborn.drain_timeout = milliseconds(300);
  Supervisor& s = Start({polite("a"), polite("b"), stubborn});
  ASSERT_TRUE(
      PollUntil(2, [](const ServiceStatus& st) { return st.state == ServiceState::kRunning; }));
  PollFor(milliseconds(100));  // the traps are set
  s.Stop();
  EXPECT_EQ(Read(order), "b\na\n");
  for (const ServiceStatus& st : s.Snapshot()) {
    EXPECT_EQ(st.state, ServiceState::kStopped) << st.name;
    EXPECT_EQ(st.pid, 0) << st.name;
  }
  EXPECT_EQ(s.Snapshot()[2].last_exit_code, 128 + SIGKILL);
  EXPECT_THAT(Read(opt_.log_dir + "/stubborn.log"), HasSubstr("drain timeout passed; SIGKILL"));
}

TEST_F(SupervisorTest, LogsRotateBySize) {
  opt_.max_log_bytes = 2000;
  opt_.log_files = 3;
  Supervisor& s = Start({Sh("w", "i=0; while [ $i -lt 1000 ]; do echo line-$i; i=$((i+1)); done")});
  ASSERT_TRUE(PollUntil(0, [](const ServiceStatus& st) { return st.last_exit_code.has_value(); }));
  const std::string log = opt_.log_dir + "/w.log";
  EXPECT_TRUE(fs::exists(log));
  EXPECT_TRUE(fs::exists(log + ".1"));
  EXPECT_TRUE(fs::exists(log + ".2"));
  EXPECT_FALSE(fs::exists(log + ".3"));
  for (const std::string& f : {log, log + ".1", log + ".2"}) EXPECT_LE(fs::file_size(f), 2000u);
  EXPECT_THAT(Read(log + ".1") + Read(log), HasSubstr("line-999\n"));  // the newest two
  EXPECT_EQ(s.Snapshot()[0].log_tail.back(), "line-999");
}

TEST_F(SupervisorTest, ChildrenInheritNoDescriptorButTheirOutput) {
  // Asio's sockets are not close-on-exec: a child holding the launcher's
  // listening socket kept its port after the launcher was gone.
  const int fd = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC
  ASSERT_GE(fd, 0);
  ASSERT_EQ(dup2(fd, 100), 100);
  close(fd);
  Supervisor& s =
      Start({Sh("w", "if [ -e /proc/$$/fd/100 ]; then echo leaked; else echo clean; fi; exit 0")});
  ASSERT_TRUE(PollUntil(0, [](const ServiceStatus& st) { return st.last_exit_code.has_value(); }));
  close(100);
  ASSERT_FALSE(s.Snapshot()[0].log_tail.empty());
  EXPECT_EQ(s.Snapshot()[0].log_tail.back(), "clean");
}

TEST_F(SupervisorTest, AProgramThatCannotRunSaysSo) {
  SupervisedService s;
  s.name = "w";
  s.argv = {"/nonexistent/strata", "serve"};
  Supervisor& sup = Start({s});
  ASSERT_TRUE(
      PollUntil(0, [](const ServiceStatus& st) { return st.state == ServiceState::kCrashloop; }));
  EXPECT_EQ(sup.Snapshot()[0].last_exit_code, 127);
  EXPECT_THAT(sup.Snapshot()[0].last_error,
              HasSubstr("cannot run /nonexistent/strata: No such file or directory"));
}

TEST_F(SupervisorTest, AnUnwritableLogDirIsRefusedWithItsName) {
  opt_.log_dir = "/proc/strata-no-such/logs";
  auto s = Supervisor::Create(opt_, {Sh("w", "exit 0")});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("[launcher] log-dir '/proc/strata-no-such/logs'"));
}

// /proc/<pid>/stat field 22 (the start time), as launcher.state records it.
uint64_t StartTicks(pid_t pid) {
  const std::string stat = Read("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 21; ++i) rest >> field;
  uint64_t start = 0;
  rest >> start;
  return start;
}

TEST_F(SupervisorTest, TheStateFileNamesTheChildrenAndTheNextLauncherEndsTheLeftovers) {
  // A child that ignores SIGTERM (SIG_IGN survives exec): it needs the SIGKILL.
  SupervisedService stubborn = Sh("w", "trap '' TERM; echo up; exec sleep 60");
  stubborn.drain_timeout = milliseconds(300);
  Supervisor& s = Start({stubborn});
  ASSERT_TRUE(PollUntil(0, [](const ServiceStatus& st) {  // past its trap
    return !st.log_tail.empty() && st.log_tail.back() == "up";
  }));
  const pid_t child = s.Snapshot()[0].pid;
  const std::string state = Read(opt_.log_dir + "/launcher.state");
  auto doc = nlohmann::json::parse(state);
  EXPECT_EQ(doc["launcher"]["pid"], getpid());
  ASSERT_EQ(doc["children"].size(), 1u) << state;
  EXPECT_EQ(doc["children"][0]["name"], "w");
  EXPECT_EQ(doc["children"][0]["pid"], child);
  EXPECT_EQ(doc["children"][0]["start"], StartTicks(child));

  // As a next launcher would find it (this process wrote it, so it is not
  // "another launcher"): the child is ended, SIGKILL after its drain timeout.
  const std::string other = tmp_ + "/other";
  fs::create_directories(other);
  std::ofstream(other + "/launcher.state") << state;
  std::vector<std::string> lines;
  auto log = [&](const std::string& l) { lines.push_back(l); };
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(StopLeftoverServices(other, log).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(300));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0],
              HasSubstr("service 'w': pid " + std::to_string(child) + " of the previous launcher"));
  EXPECT_THAT(lines[1], HasSubstr("did not exit within its drain timeout; SIGKILL"));
  EXPECT_FALSE(fs::exists(other + "/launcher.state"));
  EXPECT_THAT(Read(other + "/w.log"), HasSubstr("of the previous launcher"));
  ASSERT_TRUE(PollUntil(0, [](const ServiceStatus& st) { return st.last_exit_code.has_value(); }));
  EXPECT_EQ(s.Snapshot()[0].last_exit_code, 128 + SIGKILL);

  // A pid that now names another process (its start time differs) is not
  // touched; a launcher that still runs makes it refuse, touching nothing.
  const pid_t sleeper = fork();
  if (sleeper == 0) {
    execl("/bin/sleep", "sleep", "60", nullptr);
    _exit(127);
  }
  nlohmann::json reused = {{"launcher", {{"pid", 1}, {"start", 1}}},
                           {"children",
                            {{{"name", "x"},
                              {"pid", sleeper},
                              {"start", StartTicks(sleeper) + 1},
                              {"drain_timeout_ms", 0}}}}};
  std::ofstream(other + "/launcher.state") << reused.dump();
  lines.clear();
  EXPECT_TRUE(StopLeftoverServices(other, log).ok());
  EXPECT_TRUE(lines.empty());
  EXPECT_EQ(kill(sleeper, 0), 0);
  nlohmann::json live = {{"launcher", {{"pid", sleeper}, {"start", StartTicks(sleeper)}}},
                         {"children", nlohmann::json::array()}};
  std::ofstream(other + "/launcher.state") << live.dump();
  Status st = StopLeftoverServices(other, log);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("another strata launch (pid " + std::to_string(sleeper) +
                                      ") supervises the services of log-dir " + other));
  EXPECT_TRUE(fs::exists(other + "/launcher.state"));
  kill(sleeper, SIGKILL);
  waitpid(sleeper, nullptr, 0);
  // No file: nothing to do.
  EXPECT_TRUE(StopLeftoverServices(tmp_ + "/none", log).ok());

  // A stopped supervisor leaves no state file behind.
  s.Stop();
  EXPECT_FALSE(fs::exists(opt_.log_dir + "/launcher.state"));
}

}  // namespace
}  // namespace strata::cli

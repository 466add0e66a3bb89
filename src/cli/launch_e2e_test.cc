// End-to-end tests of `strata launch` and `strata status` through the real
// binary, with the launcher's timing knobs set small in the TOML: the
// incident's file is refused before anything starts (exit 78); a service
// that fails at every start is a crash loop after the burst, is not
// restarted again and `strata status` shows its last error line; a healthy
// service killed once is restarted and healthy again; SIGTERM stops
// everything and the launcher exits 0; a launcher killed with SIGKILL takes
// its services with it and a new one starts them afresh, ending one still
// holding its port first; `strata status --systemd` reads units
// from systemctl and journalctl (fakes on PATH: no systemd is PID 1 here).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/supervisor.h"
#include "server/http_test_client.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A port nobody listens on right now.
int FreePort() { return http_test::UnusedPort(); }

template <typename F>
bool Eventually(F cond, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return cond();
}

struct Result {
  int code = -1;
  std::string out, err;
};

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/launch_e2e_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    tmp_ = tmpl;
    port_ = FreePort();
  }
  void TearDown() override {
    if (stopped_ > 0) kill(stopped_, SIGKILL);  // a SIGSTOPped service, should a test fail
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);  // its children die with it (PR_SET_PDEATHSIG)
      waitpid(pid_, nullptr, 0);
    }
    fs::remove_all(tmp_);
  }
  std::string Launcher() const {
    return "[launcher]\nport = " + std::to_string(port_) + "\nlog-dir = \"" + tmp_ +
           "/logs\"\ncrashloop-burst = 3\ncrashloop-interval-s = 10\nbackoff-initial-s = 1\n"
           "backoff-max-s = 2\nbackoff-reset-s = 600\n";
  }
  static std::string Service(const std::string& name, const std::string& model, int port,
                             const std::string& more = "") {
    return "[[service]]\nname = \"" + name + "\"\ncommand = \"serve\"\nmodel-path = \"" + model +
           "\"\nport = " + std::to_string(port) + "\nthreads = 1\n" + more;
  }
  static std::string Model() {
    return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default";
  }
  std::string File(const std::string& text) {
    const std::string path = tmp_ + "/deploy.toml";
    std::ofstream(path) << text;
    return path;
  }
  // `strata launch FILE` in the background, its output in tmp_/launch.log.
  void Launch(const std::string& file, const std::string& log_name = "launch.log") {
    log_ = tmp_ + "/" + log_name;
    exited_ = false;
    code_ = -1;
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("STRATA_HOME", (tmp_ + "/home").c_str(), 1);
      execl(STRATA_BINARY, STRATA_BINARY, "launch", file.c_str(), nullptr);
      _exit(127);
    }
  }
  int WaitExit(std::chrono::seconds timeout) {
    int st = 0;
    Eventually([&] { return exited_ || (exited_ = waitpid(pid_, &st, WNOHANG) == pid_); }, timeout);
    if (exited_ && code_ == -1) code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -100 - WTERMSIG(st);
    return exited_ ? code_ : -2;
  }
  // The launcher's GET /v1/services (null while it does not answer).
  nlohmann::json Services() {
    auto r = HttpGetOnce("127.0.0.1", port_, "/v1/services", std::chrono::seconds(2));
    if (!r.ok() || r->status != 200) return nullptr;
    return nlohmann::json::parse(r->body);
  }
  nlohmann::json Svc(const std::string& name) {
    nlohmann::json j = Services();
    if (j.is_object())
      for (auto& s : j["services"])
        if (s["name"] == name) return s;
    return nullptr;
  }
  bool WaitState(const std::string& name, const std::string& state, std::chrono::seconds t) {
    return Eventually(
        [&] {
          auto s = Svc(name);
          return s.is_object() && s["state"] == state;
        },
        t);
  }
  std::string Metrics() {
    auto r = HttpGetOnce("127.0.0.1", port_, "/metrics", std::chrono::seconds(2));
    return r.ok() ? r->body : "";
  }
  Result Run(const std::vector<std::string>& args) {
    std::string cmd = STRATA_BINARY;
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " 2>" + tmp_ + "/run.err";
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int st = pclose(p);
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.err = Read(tmp_ + "/run.err");
    return r;
  }

  // The live (not zombie) processes with "--port=<port>" in their argv, and
  // each one's parent: what runs a service of that port.
  static std::vector<std::pair<pid_t, pid_t>> ServersOnPort(int port) {
    std::vector<std::pair<pid_t, pid_t>> out;
    const std::string want = "--port=" + std::to_string(port);
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string cmdline = Read(e.path().string() + "/cmdline");
      bool match = false;
      for (size_t at = 0; at < cmdline.size();) {
        const size_t end = cmdline.find('\0', at);
        if (cmdline.substr(at, end - at) == want) match = true;
        if (end == std::string::npos) break;
        at = end + 1;
      }
      if (!match) continue;
      const std::string stat = Read(e.path().string() + "/stat");
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 2));
      char state = 0;
      pid_t ppid = 0;
      rest >> state >> ppid;
      if (state != 'Z') out.emplace_back(std::stoi(name), ppid);
    }
    return out;
  }

  std::string tmp_, log_;
  int port_ = 0;
  pid_t stopped_ = -1;
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

TEST_F(LaunchTest, TheIncidentsFileIsRefusedBeforeAnythingStarts) {
  // The incident's PD pair: the prefill's host cache is far past this machine.
  Launch(File(Launcher() +
              Service("decode", Model(), FreePort(), "disaggregation-mode = \"decode\"\n") +
              Service("prefill", Model(), FreePort(),
                      "disaggregation-mode = \"prefill\"\ndisaggregation-bootstrap-port = " +
                          std::to_string(FreePort()) +
                          "\nenable-hierarchical-cache = true\nhicache-size = 100000\n")));
  EXPECT_EQ(WaitExit(std::chrono::seconds(60)), 78) << Read(log_);
  const std::string out = Read(log_);
  EXPECT_THAT(out, HasSubstr("service 'prefill': the HiCache host tier does not fit"));
  EXPECT_THAT(out, HasSubstr("nothing started"));
  EXPECT_FALSE(fs::exists(tmp_ + "/logs")) << "a service was started";
  EXPECT_THAT(out, ::testing::Not(HasSubstr("strata launch: supervising")));
}

TEST_F(LaunchTest, AServiceFailingAtEveryStartIsACrashLoopWithItsErrorLine) {
  // config.json is valid, so validation passes; the process then exits 66
  // at every start (the rest of the model is missing).
  const std::string broken = tmp_ + "/broken-model";
  fs::create_directories(broken);
  fs::copy_file(Model() + "/config.json", broken + "/config.json");
  Launch(File(Launcher() + Service("broken", broken, FreePort())));
  ASSERT_TRUE(WaitState("broken", "crashloop", std::chrono::seconds(90))) << Read(log_);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // longer than the backoff cap
  nlohmann::json s = Svc("broken");
  EXPECT_EQ(s["state"], "crashloop");
  EXPECT_EQ(s["restarts"], 2);  // 3 starts: the burst; not restarted again
  EXPECT_EQ(s["pid"], 0);
  EXPECT_EQ(s["last_exit_code"], 66);
  EXPECT_THAT(s["last_error"].get<std::string>(), HasSubstr("tokenizer.json is missing"));
  const std::string m = Metrics();
  EXPECT_THAT(m, HasSubstr("strata_service_crashloop{service=\"broken\"} 1"));
  EXPECT_THAT(m, HasSubstr("strata_service_up{service=\"broken\",role=\"colocated\"} 0"));
  EXPECT_THAT(m, HasSubstr("strata_service_restarts_total{service=\"broken\"} 2"));
  EXPECT_THAT(m, HasSubstr("strata_service_last_exit_code{service=\"broken\"} 66"));
  EXPECT_THAT(Read(tmp_ + "/logs/broken.log"), HasSubstr("crash loop (3 failures in a row"));
  // The exposition passes Prometheus' own linter.
  if (system("command -v promtool >/dev/null 2>&1") == 0) {
    std::ofstream(tmp_ + "/metrics.txt") << m;
    const std::string cmd =
        "promtool check metrics < " + tmp_ + "/metrics.txt > " + tmp_ + "/promtool.out 2>&1";
    EXPECT_EQ(system(cmd.c_str()), 0) << Read(tmp_ + "/promtool.out");
    EXPECT_EQ(Read(tmp_ + "/promtool.out"), "");
  }

  // strata status: one screen with the state and the error line; exit 1.
  Result r = Run({"status", "--launcher", "http://127.0.0.1:" + std::to_string(port_)});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("crashloop"));
  EXPECT_THAT(r.out, HasSubstr("tokenizer.json is missing"));
  r = Run({"status", "--launcher", "http://127.0.0.1:" + std::to_string(port_), "--json"});
  EXPECT_EQ(r.code, 1);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["services"][0]["state"], "crashloop");

  kill(pid_, SIGTERM);
  EXPECT_EQ(WaitExit(std::chrono::seconds(60)), 0) << Read(log_);
}

TEST_F(LaunchTest, AKilledServiceIsRestartedAndSigtermStopsEverything) {
  const int a = FreePort(), b = FreePort();
  Launch(File(Launcher() + Service("chat", Model(), a) + Service("chat2", Model(), b)));
  ASSERT_TRUE(WaitState("chat2", "running", std::chrono::seconds(120))) << Read(log_);
  ASSERT_TRUE(WaitState("chat", "running", std::chrono::seconds(5)));
  Result r = Run({"status", "--launcher", "http://127.0.0.1:" + std::to_string(port_)});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(" QUEUE "));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("chat +running +[0-9]+ +0 +[0-9hms]+ +ok +0 "));

  const int first = Svc("chat")["pid"];
  ASSERT_GT(first, 0);
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = Svc("chat");
        return s.is_object() && s["state"] == "running" && s["pid"] != first;
      },
      std::chrono::seconds(120)))
      << Read(tmp_ + "/logs/chat.log");
  nlohmann::json s = Svc("chat");
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["last_exit_code"], 128 + SIGKILL);
  EXPECT_EQ(Svc("chat2")["restarts"], 0);
  auto health = HttpGetOnce("127.0.0.1", a, "/health", std::chrono::seconds(5));
  ASSERT_TRUE(health.ok()) << health.status().message();
  EXPECT_EQ(health->status, 200);
  EXPECT_THAT(Metrics(), HasSubstr("strata_service_restarts_total{service=\"chat\"} 1"));
  EXPECT_THAT(Metrics(), HasSubstr("strata_service_up{service=\"chat\",role=\"colocated\"} 1"));

  const int p1 = Svc("chat")["pid"], p2 = Svc("chat2")["pid"];
  kill(pid_, SIGTERM);
  EXPECT_EQ(WaitExit(std::chrono::seconds(90)), 0) << Read(log_);
  EXPECT_NE(kill(p1, 0), 0);  // reaped by the launcher: gone
  EXPECT_NE(kill(p2, 0), 0);
  EXPECT_THAT(Read(log_), HasSubstr("every service stopped; exiting"));
  EXPECT_THAT(Read(tmp_ + "/logs/chat.log"), HasSubstr("strata serve: drained; exiting"));
  // Nothing listens any more.
  EXPECT_FALSE(HttpGetOnce("127.0.0.1", a, "/health", std::chrono::seconds(1)).ok());
  r = Run({"status", "--launcher", "http://127.0.0.1:" + std::to_string(port_)});
  EXPECT_EQ(r.code, 69);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the launcher at http://127.0.0.1:"));
}

// kill -9 of the launcher: its services die with it (PR_SET_PDEATHSIG:
// SIGTERM, they drain), and a new launcher of the same file starts them
// afresh. One of them is stopped (SIGSTOP) when the launcher dies, so it
// still holds its port when the new launcher starts, as a service draining
// a long request would: the new launcher ends it (from launcher.state)
// before its check probes the ports, instead of refusing the file because
// the port is in use. Nothing is left without a parent.
TEST_F(LaunchTest, AKilledLauncherIsRelaunchedCleanlyAndLeavesNoOrphans) {
  const int a = FreePort(), b = FreePort();
  const std::string file = File(Launcher() + Service("chat", Model(), a, "drain-timeout-s = 5\n") +
                                Service("chat2", Model(), b));
  Launch(file, "launch1.log");
  ASSERT_TRUE(WaitState("chat2", "running", std::chrono::seconds(120))) << Read(log_);
  const pid_t first_launcher = pid_;
  const int old_chat = Svc("chat")["pid"], old_chat2 = Svc("chat2")["pid"];
  ASSERT_GT(old_chat, 0);
  ASSERT_GT(old_chat2, 0);
  ASSERT_EQ(kill(old_chat, SIGSTOP), 0);
  stopped_ = old_chat;
  ASSERT_EQ(kill(first_launcher, SIGKILL), 0);
  EXPECT_EQ(WaitExit(std::chrono::seconds(10)), -100 - SIGKILL);
  // chat2 got SIGTERM from the kernel and drains away; chat cannot (stopped).
  EXPECT_TRUE(Eventually([&] { return ServersOnPort(b).empty(); }, std::chrono::seconds(30)));
  ASSERT_EQ(ServersOnPort(a).size(), 1u);

  Launch(file, "launch2.log");
  ASSERT_TRUE(Eventually(
      [&] {
        auto x = Svc("chat"), y = Svc("chat2");
        return x.is_object() && y.is_object() && x["state"] == "running" && y["state"] == "running";
      },
      std::chrono::seconds(120)))
      << Read(log_) << Read(tmp_ + "/logs/chat.log");
  const std::string log = Read(log_);
  EXPECT_THAT(log, HasSubstr("service 'chat': pid " + std::to_string(old_chat) +
                             " of the previous launcher (pid " + std::to_string(first_launcher) +
                             ", gone) still runs"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("already in use")));
  EXPECT_THAT(Read(tmp_ + "/logs/chat.log"), HasSubstr("of the previous launcher"));
  // Fresh processes, children of the new launcher; the old ones are gone.
  for (int port : {a, b}) {
    auto servers = ServersOnPort(port);
    ASSERT_EQ(servers.size(), 1u) << "port " << port;
    EXPECT_EQ(servers[0].second, pid_)
        << "port " << port << ": pid " << servers[0].first << " is not the new launcher's child";
    EXPECT_NE(servers[0].first, old_chat);
    EXPECT_NE(servers[0].first, old_chat2);
    auto health = HttpGetOnce("127.0.0.1", port, "/health", std::chrono::seconds(5));
    ASSERT_TRUE(health.ok()) << health.status().message();
    EXPECT_EQ(health->status, 200);
  }
  stopped_ = -1;                          // gone (its pid may be another process's soon)
  EXPECT_EQ(Svc("chat")["restarts"], 0);  // a new launcher: a first start, not a restart

  // A second launcher of the same file while this one runs touches nothing.
  Result again = Run({"launch", file});
  EXPECT_EQ(again.code, 1) << again.out << again.err;
  EXPECT_THAT(again.err, HasSubstr("another strata launch (pid " + std::to_string(pid_) + ")"));
  EXPECT_THAT(again.err, HasSubstr("nothing started"));
  EXPECT_EQ(ServersOnPort(a).size(), 1u);
  EXPECT_EQ(ServersOnPort(a)[0].second, pid_);

  kill(pid_, SIGTERM);
  EXPECT_EQ(WaitExit(std::chrono::seconds(90)), 0) << Read(log_);
  EXPECT_TRUE(ServersOnPort(a).empty());
  EXPECT_TRUE(ServersOnPort(b).empty());
  EXPECT_FALSE(fs::exists(tmp_ + "/logs/launcher.state"));
}

TEST_F(LaunchTest, StatusShowsSystemdUnitsFromSystemctlAndTheJournal) {
  // systemd 252's output for two units of `strata systemd`: one running
  // (nothing listens on its port, so its health is "down"), one that hit
  // StartLimitBurst.
  const std::string bin = tmp_ + "/bin";
  fs::create_directories(bin);
  const int port = FreePort();
  std::ofstream(bin + "/systemctl")
      << "#!/bin/sh\necho \"$@\" > " << tmp_ << "/systemctl.args\ncat <<'EOF'\n"
      << "Id=strata-chat.service\nActiveState=active\nSubState=running\nResult=success\n"
         "MainPID=4242\nNRestarts=1\nExecMainCode=0\nExecMainStatus=0\n"
         "ExecMainStartTimestamp=@1000\nExecStart={ path=/usr/bin/strata ; "
         "argv[]=/usr/bin/strata serve --port="
      << port
      << " ; ignore_errors=no ; start_time=[@1000] ; stop_time=[n/a] ; pid=4242 ; code=(null) ; "
         "status=0/0 }\n\n"
         "Id=strata-prefill.service\nActiveState=failed\nSubState=failed\n"
         "Result=start-limit-hit\nMainPID=0\nNRestarts=4\nExecMainCode=1\nExecMainStatus=66\n"
         "ExecMainStartTimestamp=@2000\nExecStart={ path=/usr/bin/strata ; "
         "argv[]=/usr/bin/strata serve --port=1 ; ignore_errors=no }\nEOF\n";
  std::ofstream(bin + "/journalctl") << R"SH(#!/bin/sh
case "$*" in *strata-prefill*) cat <<'EOF'
{"MESSAGE":"error: tokenizer.json is missing","SYSLOG_IDENTIFIER":"strata"}
{"MESSAGE":"strata-prefill.service: Failed with result 'exit-code'.","SYSLOG_IDENTIFIER":"systemd","_PID":"1"}
EOF
;; esac
)SH";
  fs::permissions(bin + "/systemctl", fs::perms::owner_all);
  fs::permissions(bin + "/journalctl", fs::perms::owner_all);
  const std::string path = getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin";
  setenv("PATH", (bin + ":" + path).c_str(), 1);
  Result r = Run({"status", "--systemd"});
  Result j = Run({"status", "--systemd", "--json"});
  setenv("PATH", path.c_str(), 1);

  EXPECT_EQ(r.code, 1) << r.out << r.err;  // not everything runs
  EXPECT_THAT(r.out, ::testing::ContainsRegex("chat +running +4242 +1 +[0-9hms]+ +down "));
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "prefill +crashloop +- +4 +- +- +- +error: tokenizer.json is missing"));
  EXPECT_THAT(Read(tmp_ + "/systemctl.args"), HasSubstr("show --timestamp=unix -p Id,"));
  auto doc = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << j.out << j.err;
  EXPECT_EQ(j.code, 1);
  EXPECT_EQ(doc["services"][1]["state"], "crashloop");
  EXPECT_EQ(doc["services"][1]["last_exit_code"], 66);
  EXPECT_EQ(doc["services"][0]["port"], port);

  // systemctl failing (no systemd as PID 1): 69 with its reason.
  std::ofstream(bin + "/systemctl")
      << "#!/bin/sh\necho 'System has not been booted with systemd' >&2\nexit 1\n";
  setenv("PATH", (bin + ":" + path).c_str(), 1);
  r = Run({"status", "--systemd"});
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(r.code, 69);
  EXPECT_THAT(r.err, HasSubstr("cannot read the strata units: systemctl show"));
  EXPECT_THAT(r.err, HasSubstr("System has not been booted with systemd"));
}

}  // namespace
// A PD pair and a router from one file: started in dependency order, the
// router answers through the pair, `strata status` lists every role.
TEST_F(LaunchTest, APdPairBehindARouterFromOneFile) {
  const int prefill = FreePort(), decode = FreePort(), router = FreePort(), bootstrap = FreePort();
  Launch(File(Launcher() + "[[service]]\nname = \"front\"\ncommand = \"router\"\nport = " +
              std::to_string(router) + "\nprefill = \"http://127.0.0.1:" + std::to_string(prefill) +
              "\"\ndecode = \"http://127.0.0.1:" + std::to_string(decode) + "\"\n" +
              Service("p", Model(), prefill,
                      "disaggregation-mode = \"prefill\"\ndisaggregation-bootstrap-port = " +
                          std::to_string(bootstrap) + "\n") +
              Service("d", Model(), decode, "disaggregation-mode = \"decode\"\n")));
  ASSERT_TRUE(Eventually(
      [&] {
        namespace ht = strata::http_test;
        ht::Client c(ht::Connect(router, std::chrono::seconds(5)));
        if (!c.ok() || !c.Send(ht::Post("/v1/completions", R"({"prompt":"hi","max_tokens":4})",
                                        "Content-Type: application/json\r\n")))
          return false;
        auto r = c.Read();
        return r && r->status == 200;
      },
      std::chrono::seconds(60)))
      << Read(log_);
  const std::string status =
      Run({"status", "--launcher", "http://127.0.0.1:" + std::to_string(port_), "--json"}).out;
  EXPECT_THAT(status, HasSubstr("\"role\":\"prefill\""));
  EXPECT_THAT(status, HasSubstr("\"role\":\"decode\""));
  EXPECT_THAT(status, HasSubstr("\"role\":\"router\""));
}

}  // namespace strata::cli

// End-to-end tests of `strata check` and `strata systemd` through the real
// binary: a valid deployment file prints its memory plan and exits 0; the
// incident's file (a host cache sized far past this machine), an unknown key,
// a TOML syntax error and a port already in use exit 78 with the numbers,
// file and line; a PD file's router URLs, bootstrap port and KV transport
// (UCX_TLS) are checked; the generated systemd units pass `systemd-analyze
// verify`.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A socket listening on 127.0.0.1:<port> (0: any); closed on destruction.
class Listener {
 public:
  Listener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A port nobody listens on right now.
int FreePort() { return Listener().port(); }

class DeployTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/deploy_e2e_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // `env`: "NAME=value " assignments before the command.
  Result Run(const std::vector<std::string>& args, const std::string& env = "") {
    std::string cmd = env + "STRATA_HOME=" + Quote(tmp_ + "/home") + " " + Quote(STRATA_BINARY);
    for (const auto& a : args) cmd += " " + Quote(a);
    cmd += " 2>" + Quote(tmp_ + "/stderr");
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = Read(tmp_ + "/stderr");
    return r;
  }
  std::string File(const std::string& name, const std::string& text) {
    const std::string path = tmp_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  static std::string Model() {
    return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default";
  }
  std::string Service(const std::string& name, int port, const std::string& more = "") {
    return "[[service]]\nname = \"" + name + "\"\ncommand = \"serve\"\nmodel-path = \"" + Model() +
           "\"\nport = " + std::to_string(port) + "\n" + more;
  }

  std::string tmp_;
};

TEST_F(DeployTest, AValidFileExits0AndPrintsTheMemoryPlan) {
  const std::string f =
      File("good.toml", "[launcher]\nport = " + std::to_string(FreePort()) + "\n" +
                            Service("chat", FreePort()) +
                            Service("cache", FreePort(), "enable-hierarchical-cache = true\n"));
  Result r = Run({"check", "--config", f});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("memory plan"));
  EXPECT_THAT(r.out, HasSubstr("device KV pool"));
  EXPECT_THAT(r.out, HasSubstr("host memory per NUMA node"));
  EXPECT_THAT(r.out, HasSubstr("headroom"));
  EXPECT_THAT(r.out, HasSubstr("chat, cache"));
  EXPECT_THAT(r.out, HasSubstr("OK: 2 services"));
  // --service: that one alone.
  r = Run({"check", "--config", f, "--service", "cache"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("chat ")));
  r = Run({"check", "--config", f, "--service", "nope"});
  EXPECT_EQ(r.code, 64);
  EXPECT_THAT(r.err, HasSubstr("has no such service (it has: chat, cache)"));
}

TEST_F(DeployTest, TheColocatedExampleIsValidOnAFreshMachine) {
  Result r = Run(
      {"check", "--config", std::string(STRATA_SOURCE_DIR) + "/deploy/examples/colocated.toml"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("chat-hicache"));
}

TEST_F(DeployTest, TheIncidentsHostCacheIsRefusedWithTheNumbers) {
  // SGLang's incident: a HiCache host tier far past this machine's memory.
  const std::string f = File(
      "incident.toml",
      Service("prefill", FreePort(), "enable-hierarchical-cache = true\nhicache-size = 100000\n"));
  Result r = Run({"check", "--config", f});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("service 'prefill': the HiCache host tier does not fit"));
  EXPECT_THAT(r.err, HasSubstr("--hicache-size 100000 asks for"));
  EXPECT_THAT(r.err, HasSubstr("100000.00 GB"));
  EXPECT_THAT(r.err, HasSubstr("fits"));
  EXPECT_THAT(r.out, HasSubstr("memory plan"));  // the plan is printed all the same
}

TEST_F(DeployTest, UnknownKeysAndSyntaxErrorsNameTheFileAndLine) {
  const std::string f = File("typo.toml", Service("chat", FreePort(), "max-queued-request = 8\n"));
  Result r = Run({"check", "--config", f});
  EXPECT_EQ(r.code, 78);
  EXPECT_THAT(r.err, HasSubstr(f + ":6: service 'chat': key 'max-queued-request': unknown flag "
                                   "--max-queued-request; did you mean --max-queued-requests?"));

  const std::string s = File("syntax.toml", "[launcher]\nport = 9000\n[[service]\nname = \"a\"\n");
  r = Run({"check", "--config", s});
  EXPECT_EQ(r.code, 78);
  EXPECT_THAT(r.err, HasSubstr(s + ":3: TOML syntax error"));

  r = Run({"check", "--config", tmp_ + "/missing.toml"});
  EXPECT_EQ(r.code, 66);
  EXPECT_THAT(r.err, HasSubstr("cannot read the deployment file"));
}

TEST_F(DeployTest, APortInUseIsAProblem) {
  Listener held;
  const std::string f = File("taken.toml", Service("chat", held.port()));
  Result r = Run({"check", "--config", f});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("service 'chat': --port " + std::to_string(held.port()) +
                        ": 127.0.0.1:" + std::to_string(held.port()) + " is already in use"));

  // The launcher's own port and log directory are checked too.
  const std::string launcher =
      File("launcher.toml", "[launcher]\nport = " + std::to_string(held.port()) +
                                "\nlog-dir = \"/proc/strata-no-such/logs\"\n" +
                                Service("chat", FreePort()));
  r = Run({"check", "--config", launcher});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("[launcher] port " + std::to_string(held.port()) + ": 127.0.0.1:" +
                               std::to_string(held.port()) + " is already in use"));
  EXPECT_THAT(r.err, HasSubstr("[launcher] log-dir '/proc/strata-no-such/logs': cannot create a "
                               "directory in /proc"));
  // A log-dir still to be made is fine, and the check makes nothing.
  const std::string later =
      File("later.toml", "[launcher]\nport = " + std::to_string(FreePort()) + "\nlog-dir = \"" +
                             tmp_ + "/a/b/logs\"\n" + Service("chat", FreePort()));
  r = Run({"check", "--config", later});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(tmp_ + "/a"));
}

// A PD pair behind a router: what one machine can tell before anything
// starts. The router's URLs name services of the file of the right role, the
// prefill's bootstrap port is free, and the KV transport moves bytes here
// with this environment's UCX_TLS.
TEST_F(DeployTest, APdFileIsCheckedAsOneDeploymentUcxAndTheRoutersUrlsIncluded) {
  const int prefill = FreePort(), decode = FreePort(), router = FreePort();
  Listener bootstrap_taken;
  const int bootstrap = FreePort();
  auto pd = [&](int bootstrap_port, int decode_url_port, int prefill_url_port = 0) {
    return "[launcher]\nport = " + std::to_string(FreePort()) + "\n" +
           Service("prefill", prefill,
                   "disaggregation-mode = \"prefill\"\ndisaggregation-bootstrap-port = " +
                       std::to_string(bootstrap_port) + "\n") +
           Service("decode", decode, "disaggregation-mode = \"decode\"\n") +
           "[[service]]\nname = \"router\"\ncommand = \"router\"\nport = " +
           std::to_string(router) + "\nprefill = [\"http://127.0.0.1:" +
           std::to_string(prefill_url_port ? prefill_url_port : prefill) +
           "\"]\ndecode = [\"http://127.0.0.1:" + std::to_string(decode_url_port) + "\"]\n";
  };
  const std::string good = File("pd.toml", pd(bootstrap, decode));
  Result r = Run({"check", "--config", good});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("OK: 3 services"));
  EXPECT_THAT(r.out, Not(HasSubstr("warning")));

  // A typo'd port in the router's --decode: the fix names the decode.
  r = Run({"check", "--config", File("typo.toml", pd(bootstrap, decode + 1000))});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("service 'router': --decode http://127.0.0.1:" +
                               std::to_string(decode + 1000) + ": no service of "));
  EXPECT_THAT(r.err, HasSubstr("give the port of a decode service (the file's decode services: "
                               "'decode' on port " +
                               std::to_string(decode) + ")"));
  // The router's URLs swapped: each names the wrong role.
  r = Run({"check", "--config", File("role.toml", pd(bootstrap, prefill, decode))});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("that is service 'prefill', a prefill service"));
  EXPECT_THAT(r.err, HasSubstr("that is service 'decode', a decode service"));

  // The bootstrap port is taken on this machine.
  r = Run({"check", "--config", File("taken.toml", pd(bootstrap_taken.port(), decode))});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("service 'prefill': --disaggregation-bootstrap-port " +
                               std::to_string(bootstrap_taken.port()) + ": 127.0.0.1:" +
                               std::to_string(bootstrap_taken.port()) + " is already in use"));

  // One host: shared memory is a transport the servers can use (UCX
  // reports its dead peers from keepalive), so the check passes.
  r = Run({"check", "--config", good}, "UCX_TLS=shm ");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("OK: 3 services"));
  // cma alone cannot set an endpoint up (no active messages): the servers
  // would fail at their first transfer; the check says so now.
  r = Run({"check", "--config", good}, "UCX_TLS=cma ");
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("service 'prefill': --disaggregation-transfer-backend ucx: KV pages "
                               "cannot move between two processes of this machine (UCX_TLS=cma)"));
  EXPECT_THAT(r.err, HasSubstr("service 'decode': --disaggregation-transfer-backend ucx"));
  EXPECT_THAT(r.err, HasSubstr("cma alone has no active messages"));
  EXPECT_THAT(r.err, HasSubstr("UCX_TLS=shm (one host)"));
  r = Run({"check", "--config", good}, "UCX_TLS=no_such_transport ");
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("initialising the transport"));
  r = Run({"check", "--config", good}, "UCX_TLS=tcp ");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(DeployTest, ThePdExampleIsValidOnAFreshMachine) {
  Result r =
      Run({"check", "--config", std::string(STRATA_SOURCE_DIR) + "/deploy/examples/pd.toml"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("OK: 3 services"));
  EXPECT_THAT(r.out, Not(HasSubstr("warning")));
}

TEST_F(DeployTest, BothCommandsHaveHelp) {
  for (const char* c : {"check", "systemd"}) {
    Result r = Run({c, "--help"});
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_THAT(r.out, HasSubstr("--config")) << c;
  }
  EXPECT_THAT(Run({"--help"}).out, HasSubstr("check"));
}

TEST_F(DeployTest, ServeFlagsAfterDashDash) {
  Result r = Run({"check", "--", "--model-path", Model(), "--port", "0"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("OK: 1 service of the command line"));
  r = Run({"check", "--", "--model-path", Model(), "--port", "0", "--hicache-ratio", "3"});
  EXPECT_EQ(r.code, 78);
  EXPECT_THAT(r.err,
              HasSubstr("--hicache-ratio has no effect without --enable-hierarchical-cache"));
  r = Run({"check", "--", "--modelpath", Model()});
  EXPECT_EQ(r.code, 78);
  EXPECT_THAT(r.err, HasSubstr("unknown flag --modelpath; did you mean --model-path?"));
  r = Run({"check"});
  EXPECT_EQ(r.code, 64);
}

TEST_F(DeployTest, SystemdUnitsPassSystemdAnalyzeVerify) {
  const std::string f =
      File("units.toml", "[launcher]\ncrashloop-burst = 4\n" + Service("chat", 30000) +
                             Service("cache", 30001,
                                     "enable-hierarchical-cache = true\n"
                                     "numa-node = 0\n"
                                     "served-model-name = \"50% off $HOME\"\n"));
  Result r = Run({"systemd", "--config", f, "--out", tmp_ + "/units"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string unit = Read(tmp_ + "/units/strata-cache.service");
  const std::string binary = fs::canonical(STRATA_BINARY).string();
  EXPECT_THAT(unit, HasSubstr("ExecStart=" + binary + " serve --model-path="));
  EXPECT_THAT(unit, HasSubstr(" --enable-hierarchical-cache --numa-node=0"));
  EXPECT_THAT(unit, HasSubstr("\"--served-model-name=50%% off $$HOME\""));
  EXPECT_THAT(unit, HasSubstr("Restart=on-failure\n"));
  EXPECT_THAT(unit, HasSubstr("RestartPreventExitStatus=78\n"));
  EXPECT_THAT(unit, HasSubstr("StartLimitBurst=4\n"));
  EXPECT_THAT(unit, HasSubstr("StartLimitIntervalSec=50\n"));  // 4 starts 10 s apart + 10 s
  EXPECT_THAT(unit, HasSubstr("LimitMEMLOCK=infinity\n"));
  EXPECT_THAT(unit, HasSubstr("NUMAPolicy=bind\nNUMAMask=0\n"));
  EXPECT_THAT(Read(tmp_ + "/units/strata-chat.service"), Not(HasSubstr("NUMAPolicy")));
  EXPECT_THAT(Read(tmp_ + "/units/strata.target"),
              HasSubstr("Wants=strata-chat.service strata-cache.service\n"));

  // Two services of one name would write one unit over the other.
  const std::string dup = File("dup.toml", Service("a", 30000) + Service("a", 30001));
  r = Run({"systemd", "--config", dup, "--out", tmp_ + "/dup"});
  EXPECT_EQ(r.code, 78);
  EXPECT_THAT(r.err, HasSubstr("two services are named 'a'"));
  EXPECT_FALSE(fs::exists(tmp_ + "/dup"));

  if (std::system("command -v systemd-analyze >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "systemd-analyze not installed (Debian package systemd; scripts/deps.sh "
                    "--test installs it)";
  // verify exits 0 on warnings too; it prints them, so nothing may be printed.
  const std::string log = tmp_ + "/verify.log";
  const int rc =
      std::system(("systemd-analyze verify " + Quote(tmp_ + "/units/strata-chat.service") + " " +
                   Quote(tmp_ + "/units/strata-cache.service") + " " +
                   Quote(tmp_ + "/units/strata.target") + " >" + Quote(log) + " 2>&1")
                      .c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0) << Read(log);
  EXPECT_EQ(Read(log), "");
}

}  // namespace

// End-to-end test of deploy/prometheus and deploy/grafana against real
// components: `strata launch` runs a deployment (two workers, one with a
// HiCache host and storage tier, a victim and a service that fails at every
// start), a live Prometheus (Debian `prometheus`) scrapes it with the shipped
// deploy/prometheus/prometheus.yml (addresses and intervals substituted, the
// alert rules as they are) and a live node_exporter (Debian
// `prometheus-node-exporter`). Then:
//   - the targets are found through the launcher's GET /v1/targets and carry
//     the node/service/role labels, node_exporter's too (NUMA nodes as
//     numa_node);
//   - every query of the dashboard returns data: the deployment has every
//     role (colocated workers, one with HiCache, a PD pair behind a router,
//     with traffic through each), so the router and PD panels too;
//   - every alert rule evaluates without error; the crash loop, a
//     configuration error at restart (its port taken) and a hung service
//     (SIGSTOP) are provoked and their alerts become active; every other rule
//     is listed with the state it needs (kNotProvoked: promtool unit tests in
//     tests/prometheus/alerts_test.yml cover those) and its metrics exist;
//   - a service killed once is restarted, healthy again, and Prometheus sees
//     the restart.
// (A deployment refused before anything starts: launch_e2e_test.cc.)
// Skipped when prometheus or prometheus-node-exporter is not installed
// (scripts/deps.sh --test installs both).
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

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "server/http_test_client.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

// Metrics no service of the deployment below exports (a prefix per role that
// is not deployed): their panels must evaluate but may return no data. Empty:
// the deployment has every role (colocated, prefill, decode, router).
const std::vector<std::string> kNotYetExported = {};

// Alert rules this test does not provoke, with the state each needs; their
// expressions are unit-tested with promtool (tests/prometheus/alerts_test.yml).
const std::map<std::string, std::string> kNotProvoked = {
    {"StrataLauncherDown", "the launcher not answering (this test needs it)"},
    {"StrataServiceDown", "down 2 minutes without crash loop or config error"},
    {"StrataServiceRestarting", "3 restarts in 15 minutes"},
    {"StrataQueueNearLimit", "a queue above 80% of its limit for 5 minutes"},
    {"StrataQueuedTokensNearLimit", "queued tokens above 80% of the limit for 5 minutes"},
    {"StrataHighRejectionRate", "over 5% of requests shed for 5 minutes"},
    {"StrataTTFTSLO", "TTFT p99 above 2 s for 10 minutes"},
    {"StrataHiCacheHostPoolFull", "a full host tier evicting for 15 minutes"},
    {"StrataHiCacheStorageErrors", "storage tier errors"},
    {"StrataKVTransferFailures", "a PD pair whose transfers fail"},
};

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int FreePort() { return http_test::UnusedPort(); }

// A listening socket on 127.0.0.1:port (SO_REUSEADDR, as the server binds); -1 on failure.
int Listen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string FindProgram(const std::string& name) {
  const char* path = getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
  return "";
}

template <typename F>
bool Eventually(F cond, seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return cond();
}

std::string UrlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// One request on a fresh connection; status 0 when nothing answered.
http_test::Response Http(int port, const std::string& raw, seconds timeout = seconds(30)) {
  http_test::Client c(http_test::Connect(port, timeout));
  if (!c.ok() || !c.Send(raw)) return {};
  return c.Read().value_or(http_test::Response{});
}
http_test::Response HttpGet(int port, const std::string& target) {
  return Http(port, http_test::Get(target, "Connection: close\r\n"));
}

// A program run in the background with its output in `log`; stopped (SIGCONT,
// SIGTERM, then SIGKILL after `grace`) by Stop() or the destructor.
class Process {
 public:
  Process() = default;
  Process(const std::vector<std::string>& argv, const std::string& log,
          const std::map<std::string, std::string>& env = {})
      : log_(log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Process() { Stop(seconds(5)); }
  pid_t pid() const { return pid_; }
  std::string Log() const { return Read(log_); }
  bool Running() {
    if (pid_ <= 0 || exited_) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) exited_ = true;
    return !exited_;
  }
  void Stop(seconds grace) {
    if (!Running()) return;
    kill(pid_, SIGCONT);
    kill(pid_, SIGTERM);
    if (!Eventually([&] { return !Running(); }, grace)) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      exited_ = true;
    }
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string log_;
};

// What SetUpTestSuite starts once for every test below.
struct Deployment {
  std::string tmp;
  int launcher = 0, chat = 0, hicache = 0, victim = 0, node_exporter = 0, prometheus = 0;
  int prefill = 0, decode = 0, bootstrap = 0, router = 0;  // a PD pair behind a router
  std::unique_ptr<Process> launch, exporter, prom;
  std::string skip;    // why the suite is skipped
  std::string failed;  // why the setup failed

  std::string Logs() const {
    std::string s =
        "--- strata launch:\n" + (launch ? launch->Log() : "") + "\n--- prometheus (tail):\n";
    const std::string p = prom ? prom->Log() : "";
    s += p.substr(p.size() > 4000 ? p.size() - 4000 : 0);
    return s;
  }
};
Deployment* d = nullptr;

std::string Model() {
  return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default";
}

std::string DeploymentFile() {
  // The broken service has a valid config.json (so the check passes) and
  // nothing else: it exits 66 at every start.
  const std::string broken = d->tmp + "/broken-model";
  fs::create_directories(broken);
  fs::copy_file(Model() + "/config.json", broken + "/config.json");
  auto service = [](const std::string& name, const std::string& model, int port,
                    const std::string& more) {
    return "[[service]]\nname = \"" + name + "\"\ncommand = \"serve\"\nmodel-path = \"" + model +
           "\"\nserved-model-name = \"m\"\nport = " + std::to_string(port) +
           "\nthreads = 1\nmax-total-tokens = 160\npage-size = 16\nmax-running-requests = 4\n" +
           more + "\n";
  };
  return "[launcher]\nport = " + std::to_string(d->launcher) + "\nlog-dir = \"" + d->tmp +
         "/logs\"\ncrashloop-burst = 3\ncrashloop-interval-s = 10\nbackoff-initial-s = 3\n"
         "backoff-max-s = 4\nbackoff-reset-s = 600\n\n" +
         service("chat", Model(), d->chat, "max-queued-requests = 8\nmax-queued-tokens = 4096") +
         service("chat-hicache", Model(), d->hicache,
                 "max-queued-requests = 8\nenable-hierarchical-cache = true\nhicache-ratio = 4\n"
                 "hicache-storage-backend = \"file\"\nhicache-storage-path = \"" +
                     d->tmp +
                     "/kv-storage\"\nhicache-storage-max-gb = 1\n"
                     "hicache-storage-prefetch-policy = \"wait_complete\"") +
         service("victim", Model(), d->victim, "") + service("broken", broken, FreePort(), "") +
         service("prefill", Model(), d->prefill,
                 "disaggregation-mode = \"prefill\"\ndisaggregation-bootstrap-port = " +
                     std::to_string(d->bootstrap)) +
         service("decode", Model(), d->decode, "disaggregation-mode = \"decode\"") +
         "[[service]]\nname = \"front\"\ncommand = \"router\"\nport = " +
         std::to_string(d->router) +
         "\nprefill = \"http://127.0.0.1:" + std::to_string(d->prefill) +
         "\"\ndecode = \"http://127.0.0.1:" + std::to_string(d->decode) +
         "\"\nhealth-check-interval-ms = 500\n";
}

// deploy/prometheus/prometheus.yml with this test's addresses and 1 s
// intervals; every substitution must find its text (the file changed
// otherwise: update the test with it).
std::string PrometheusConfig(std::string* problem) {
  const std::string src = std::string(STRATA_SOURCE_DIR) + "/deploy/prometheus/";
  std::string text = Read(src + "prometheus.yml");
  auto replace_all = [&](const std::string& from, const std::string& to) {
    size_t n = 0;
    for (size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
      ++n;
    }
    if (n == 0) *problem += "prometheus.yml has no '" + from + "'; ";
  };
  replace_all("127.0.0.1:8090", "127.0.0.1:" + std::to_string(d->launcher));
  replace_all("127.0.0.1:9100", "127.0.0.1:" + std::to_string(d->node_exporter));
  replace_all("scrape_interval: 15s", "scrape_interval: 1s");
  replace_all("scrape_interval: 10s", "scrape_interval: 1s");
  replace_all("evaluation_interval: 15s", "evaluation_interval: 1s");
  replace_all("refresh_interval: 15s", "refresh_interval: 1s");
  replace_all("  - alerts.yml", "  - " + src + "alerts.yml");
  return text;
}

// GET /api/v1/query: the result vector, or a string naming the error.
json Query(const std::string& expr) {
  http_test::Response r = HttpGet(d->prometheus, "/api/v1/query?query=" + UrlEncode(expr));
  if (r.status == 0) return "no answer from prometheus";
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || j.value("status", "") != "success")
    return "HTTP " + std::to_string(r.status) + ": " + r.body;
  return j["data"]["result"];
}
double Value(const std::string& expr) {
  json r = Query(expr);
  if (!r.is_array() || r.size() != 1) return -1;
  return std::stod(r[0]["value"][1].get<std::string>());
}

json Services() {
  http_test::Response r = HttpGet(d->launcher, "/v1/services");
  json j = json::parse(r.body, nullptr, false);
  return j.is_object() ? j["services"] : json::array();
}
json Svc(const std::string& name) {
  for (auto& s : Services())
    if (s["name"] == name) return s;
  return nullptr;
}
bool WaitState(const std::string& name, const std::string& state, seconds t) {
  return Eventually(
      [&] {
        json s = Svc(name);
        return s.is_object() && s["state"] == state;
      },
      t);
}

// The active alerts (pending or firing) named `name` whose service is `service`.
json ActiveAlert(const std::string& name, const std::string& service) {
  http_test::Response r = HttpGet(d->prometheus, "/api/v1/alerts");
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object()) return nullptr;
  for (auto& a : j["data"]["alerts"])
    if (a["labels"].value("alertname", "") == name && a["labels"].value("service", "") == service)
      return a;
  return nullptr;
}

std::vector<std::string> MetricNames(const std::string& expr) {
  static const std::regex name(R"(\b((strata|node)_[a-zA-Z0-9_]+|up)\b)");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name); it != std::sregex_iterator();
       ++it)
    out.insert((*it)[1].str());
  return {out.begin(), out.end()};
}
bool NotYetExported(const std::string& expr) {
  for (const std::string& p : kNotYetExported)
    if (expr.find(p) != std::string::npos) return true;
  return false;
}

// The dashboard's variables as "All" and its interval as one minute.
std::string Instantiate(std::string expr) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"$__rate_interval", "1m"}, {"$node", ".*"}, {"$service", ".*"}}) {
    for (size_t at = expr.find(from); at != std::string::npos; at = expr.find(from, at))
      expr.replace(at, from.size(), to);
  }
  return expr;
}

// Completions on `port`: the HiCache test's pattern, ~100-token prompts that
// together are several times the 160-token device pool, twice, so prefixes
// are evicted to the host (and storage) tier and loaded back.
// Returns the first failure ("" when every request got a 200): it runs in
// SetUpTestSuite, where a gtest failure would only skip the suite's tests,
// and ctest counts a skip as a pass.
std::string Traffic(int port) {
  const char* words[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"};
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 6; ++i) {
      std::string p = "prompt " + std::to_string(i) + ":";
      for (int w = 0; w < 20; ++w)
        p += std::string(" ") + words[(i * 7 + w * (i + 3)) % 8] + std::to_string(w % 5);
      json req = {{"model", "m"},
                  {"prompt", p},
                  {"max_tokens", 8},
                  {"temperature", 0},
                  {"ignore_eos", true}};
      http_test::Response r =
          Http(port,
               http_test::Post("/v1/completions", req.dump(),
                               "Content-Type: application/json\r\nConnection: close\r\n"),
               seconds(60));
      if (r.status != 200)
        return "port " + std::to_string(port) + ": " + std::to_string(r.status) + " " + r.body;
    }
  return "";
}

class MonitoringE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    d = new Deployment;
    const std::string prometheus = FindProgram("prometheus");
    std::string exporter = FindProgram("prometheus-node-exporter");
    if (exporter.empty()) exporter = FindProgram("node_exporter");
    if (prometheus.empty() || exporter.empty()) {
      d->skip = "needs prometheus and prometheus-node-exporter (scripts/deps.sh --test)";
      return;
    }
    std::string tmpl = ::testing::TempDir() + "/monitoring_e2e_XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      d->failed = "mkdtemp";
      return;
    }
    d->tmp = tmpl;
    d->launcher = FreePort();
    d->chat = FreePort();
    d->hicache = FreePort();
    d->victim = FreePort();
    d->prefill = FreePort();
    d->decode = FreePort();
    d->bootstrap = FreePort();
    d->router = FreePort();
    d->node_exporter = FreePort();
    d->prometheus = FreePort();

    d->exporter = std::make_unique<Process>(
        std::vector<std::string>{
            exporter, "--web.listen-address=127.0.0.1:" + std::to_string(d->node_exporter),
            "--collector.meminfo_numa", "--no-collector.systemd"},
        d->tmp + "/node_exporter.log");
    std::ofstream(d->tmp + "/deploy.toml") << DeploymentFile();
    d->launch = std::make_unique<Process>(
        std::vector<std::string>{STRATA_BINARY, "launch", d->tmp + "/deploy.toml"},
        d->tmp + "/launch.log",
        std::map<std::string, std::string>{{"STRATA_HOME", d->tmp + "/home"}});
    std::string problem;
    std::ofstream(d->tmp + "/prometheus.yml") << PrometheusConfig(&problem);
    if (!problem.empty()) {
      d->failed = problem;
      return;
    }
    d->prom = std::make_unique<Process>(
        std::vector<std::string>{prometheus, "--config.file=" + d->tmp + "/prometheus.yml",
                                 "--storage.tsdb.path=" + d->tmp + "/tsdb",
                                 "--web.listen-address=127.0.0.1:" + std::to_string(d->prometheus)},
        d->tmp + "/prometheus.log");

    // Every service started (broken: given up on).
    for (const char* s : {"chat", "chat-hicache", "victim", "prefill", "decode", "front"})
      if (!WaitState(s, "running", seconds(180))) {
        d->failed = std::string("service ") + s + " not running";
        return;
      }
    if (!WaitState("broken", "crashloop", seconds(120))) {
      d->failed = "service broken not in crashloop";
      return;
    }
    // Prometheus has scraped every target (broken, which never listens, is
    // the one worker down); then traffic while it scrapes, until the rates
    // of the request counters move (a rate needs two samples).
    if (!Eventually(
            [] {
              return Value("count(up{job=\"strata-worker\"} == 1)") == 5 &&
                     Value("count(up{job=\"strata-worker\"})") == 6 &&
                     Value("up{job=\"strata-router\"}") == 1 &&
                     Value("up{job=\"strata-launcher\"}") == 1 && Value("up{job=\"node\"}") == 1;
            },
            seconds(90))) {
      d->failed = "prometheus does not see every target up";
      return;
    }
    for (int port : {d->chat, d->hicache, d->router}) {  // router: to the PD pair
      d->failed = Traffic(port);
      if (!d->failed.empty()) return;
    }
    if (!Eventually(
            [] {
              return Value("count(rate(strata_generation_tokens_total[1m]) > 0)") == 4 &&
                     Value("count(rate(strata_kv_transfer_bytes_total[1m]) > 0)") == 1 &&
                     Value("count(count by (node) (rate(node_cpu_seconds_total[1m])))") == 1;
            },
            seconds(60)))
      d->failed = "no rate of strata_generation_tokens_total or node_cpu_seconds_total";
  }
  static void TearDownTestSuite() {
    if (d->launch) d->launch->Stop(seconds(90));  // drains its services
    d->prom.reset();
    d->exporter.reset();
    // Kept after a failure: the logs of every process are there.
    if (!d->tmp.empty() && !::testing::UnitTest::GetInstance()->Failed()) fs::remove_all(d->tmp);
    delete d;
    d = nullptr;
  }
  void SetUp() override {
    if (!d->skip.empty()) GTEST_SKIP() << d->skip;
    ASSERT_TRUE(d->failed.empty()) << d->failed << "\n" << d->Logs();
  }
};

TEST_F(MonitoringE2eTest, TargetsComeFromTheLauncherWithNodeServiceAndRoleLabels) {
  http_test::Response r = HttpGet(d->launcher, "/v1/targets");
  ASSERT_EQ(r.status, 200);
  json targets = json::parse(r.body);
  ASSERT_EQ(targets.size(), 7u) << r.body;
  EXPECT_EQ(targets[0]["targets"][0], "127.0.0.1:" + std::to_string(d->chat));
  EXPECT_EQ(targets[0]["labels"]["service"], "chat");

  json up = Query("up{job=\"strata-worker\",service=\"chat\"}");
  ASSERT_TRUE(up.is_array() && up.size() == 1) << up.dump();
  EXPECT_EQ(up[0]["metric"]["node"], "127.0.0.1");
  EXPECT_EQ(up[0]["metric"]["role"], "colocated");
  // A worker's own series: its labels (model, role) and the target's.
  json q = Query("strata_queued_requests{service=\"chat-hicache\"}");
  ASSERT_TRUE(q.is_array() && q.size() == 1) << q.dump();
  EXPECT_EQ(q[0]["metric"]["model"], "m");
  EXPECT_EQ(q[0]["metric"]["role"], "colocated");
  EXPECT_EQ(q[0]["metric"]["node"], "127.0.0.1");
  EXPECT_FALSE(q[0]["metric"].contains("exported_role")) << q.dump();
  // The launcher's series keep their service label (honor_labels).
  EXPECT_EQ(Value("strata_service_up{service=\"chat\",node=\"127.0.0.1\",role=\"colocated\"}"), 1);
  // node_exporter's NUMA series: the machine in node, the NUMA node in numa_node.
  json numa = Query("node_memory_numa_MemFree");
  ASSERT_TRUE(numa.is_array() && !numa.empty()) << numa.dump();
  EXPECT_EQ(numa[0]["metric"]["node"], "127.0.0.1");
  EXPECT_TRUE(numa[0]["metric"].contains("numa_node")) << numa.dump();
  EXPECT_FALSE(numa[0]["metric"].contains("exported_node")) << numa.dump();
  // The same node values on both sides, so the dashboard's $node filters both.
  EXPECT_EQ(Query("count by (node) (strata_service_up)")[0]["metric"],
            Query("count by (node) (node_memory_MemTotal_bytes)")[0]["metric"]);
}

TEST_F(MonitoringE2eTest, EveryDashboardQueryReturnsData) {
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/deploy/grafana/dashboards";
  int checked = 0, conditional = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    json dash = json::parse(Read(entry.path().string()));
    std::vector<std::pair<std::string, std::string>> exprs;  // where, expression
    for (auto& p : dash["panels"])
      for (auto& t : p.value("targets", json::array()))
        exprs.push_back({p["title"].get<std::string>() + " " + t["refId"].get<std::string>(),
                         t["expr"].get<std::string>()});
    // label_values(metric, label) variables, as the series Grafana lists.
    static const std::regex label_values(R"(^label_values\((.*),\s*(\w+)\)$)");
    for (auto& v : dash["templating"]["list"]) {
      if (v["type"] != "query") continue;
      std::smatch m;
      const std::string q = v["query"]["query"].get<std::string>();
      ASSERT_TRUE(std::regex_match(q, m, label_values)) << q;
      exprs.push_back({"variable " + v["name"].get<std::string>(),
                       "count by (" + m[2].str() + ") (" + m[1].str() + ")"});
    }
    for (const auto& [where, raw] : exprs) {
      const std::string expr = Instantiate(raw);
      json r = Query(expr);
      ASSERT_TRUE(r.is_array()) << entry.path().filename() << " " << where << ": " << expr << "\n"
                                << r.dump();
      if (NotYetExported(raw)) {
        ++conditional;
        continue;
      }
      EXPECT_FALSE(r.empty()) << entry.path().filename() << " " << where
                              << " returns no data: " << expr;
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
  EXPECT_EQ(conditional, 0) << "every role is deployed: every panel must return data";
  // Some values that must be right, not only present.
  EXPECT_TRUE(Eventually(
      [] {
        int running = 0;
        for (auto& s : Services()) running += s["state"] == "running";
        return Value("sum(strata_service_up)") == running;
      },
      seconds(30)));
  // The launcher's state said crashloop before Prometheus's last scrape of
  // it may have (a fresh-clone CI run read 0 here once): wait for a scrape.
  EXPECT_TRUE(Eventually(
      [] { return Value("strata_service_crashloop{service=\"broken\"}") == 1; }, seconds(30)));
  EXPECT_TRUE(Eventually(
      [] { return Value("strata_service_last_exit_code{service=\"broken\"}") == 66; },
      seconds(30)));
  EXPECT_GT(Value("sum(strata_hicache_hit_tokens_total{tier=~\"host|storage\"})"), 0);
  EXPECT_GT(Value("strata_hicache_storage_bytes"), 0);
  EXPECT_EQ(Value("strata_max_queued_tokens{service=\"chat\"}"), 4096);
}

TEST_F(MonitoringE2eTest, EveryAlertRuleEvaluatesAndTheProvokedOnesBecomeActive) {
  // A crash loop: from the start.
  ASSERT_TRUE(Eventually([] { return ActiveAlert("StrataServiceCrashLoop", "broken").is_object(); },
                         seconds(60)))
      << d->Logs();
  EXPECT_EQ(ActiveAlert("StrataServiceCrashLoop", "broken")["state"], "firing");
  EXPECT_THAT(Svc("broken")["last_error"].get<std::string>(),
              HasSubstr("tokenizer.json is missing"));

  // A configuration error at restart: the victim is killed and its port
  // taken before the launcher restarts it (backoff 3 s), so the new process
  // exits 78 and is never restarted.
  const int victim_pid = Svc("victim")["pid"];
  ASSERT_GT(victim_pid, 0);
  ASSERT_EQ(kill(victim_pid, SIGKILL), 0);
  int squatter = -1;
  ASSERT_TRUE(Eventually([&] { return (squatter = Listen(d->victim)) >= 0; }, seconds(10)));
  const bool config_error = WaitState("victim", "config-error", seconds(60));
  close(squatter);
  ASSERT_TRUE(config_error) << Svc("victim").dump();
  EXPECT_EQ(Svc("victim")["last_exit_code"], 78);
  ASSERT_TRUE(Eventually(
      [] { return ActiveAlert("StrataServiceConfigError", "victim").is_object(); }, seconds(60)))
      << d->Logs();
  EXPECT_EQ(ActiveAlert("StrataServiceConfigError", "victim")["state"], "firing");

  // A hung service: stopped, the launcher still says running, scrapes fail.
  const int hung = Svc("chat-hicache")["pid"];
  ASSERT_GT(hung, 0);
  ASSERT_EQ(kill(hung, SIGSTOP), 0);
  const bool not_answering = Eventually(
      [] { return ActiveAlert("StrataServiceNotAnswering", "chat-hicache").is_object(); },
      seconds(60));
  kill(hung, SIGCONT);
  EXPECT_TRUE(not_answering) << d->Logs();
  EXPECT_EQ(Svc("chat-hicache")["state"], "running");

  // Every rule: loaded, evaluated without error; provoked above or listed
  // with the state it needs, and then its metrics exist.
  const std::set<std::string> provoked = {"StrataServiceCrashLoop", "StrataServiceConfigError",
                                          "StrataServiceNotAnswering"};
  json rules;
  ASSERT_TRUE(Eventually(
      [&] {
        json j = json::parse(HttpGet(d->prometheus, "/api/v1/rules").body, nullptr, false);
        if (!j.is_object()) return false;
        rules = j["data"]["groups"];
        for (auto& g : rules)
          for (auto& r : g["rules"])
            if (r.value("health", "") != "ok") return false;
        return !rules.empty();
      },
      seconds(30)))
      << rules.dump(1);
  std::set<std::string> seen;
  for (auto& g : rules)
    for (auto& r : g["rules"]) {
      const std::string name = r["name"], query = r["query"];
      seen.insert(name);
      EXPECT_EQ(r["type"], "alerting") << name;
      EXPECT_TRUE(provoked.count(name) + kNotProvoked.count(name) == 1)
          << name << ": provoke it in this test or add it to kNotProvoked with the state it needs";
      if (!kNotProvoked.count(name) || NotYetExported(query)) continue;
      for (const std::string& m : MetricNames(query)) {
        // Eventually: with a 1 s scrape interval on a loaded 2-core machine
        // a scrape can miss, and Prometheus then marks that target's series
        // stale until the next one (seen once in CI for a HiCache counter
        // that is exported from startup).
        const std::string series = "count({__name__=\"" + m + "\"})";
        EXPECT_TRUE(Eventually(
            [&] {
              if (Value(series) > 0) return true;
              std::this_thread::sleep_for(std::chrono::milliseconds(250));
              return false;
            },
            seconds(20)))
            << name << " (" << kNotProvoked.at(name) << ") uses " << m
            << ", which no target exports";
      }
    }
  for (const std::string& name : provoked) EXPECT_TRUE(seen.count(name)) << name;
  EXPECT_EQ(seen.size(), provoked.size() + kNotProvoked.size());
}

TEST_F(MonitoringE2eTest, AKilledServiceIsRestartedAndPrometheusSeesTheRestart) {
  const int first = Svc("chat")["pid"];
  ASSERT_GT(first, 0);
  const int before = Svc("chat")["restarts"];
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(Eventually(
      [&] {
        json s = Svc("chat");
        return s.is_object() && s["state"] == "running" && s["pid"] != first;
      },
      seconds(120)))
      << d->Logs();
  EXPECT_EQ(Svc("chat")["restarts"], before + 1);
  EXPECT_EQ(HttpGet(d->chat, "/health").status, 200);
  const std::string restarts =
      "strata_service_restarts_total{service=\"chat\"} == " + std::to_string(before + 1);
  EXPECT_TRUE(Eventually([&] { return Value(restarts) == before + 1; }, seconds(30)));
  EXPECT_TRUE(Eventually([] { return Value("up{job=\"strata-worker\",service=\"chat\"}") == 1; },
                         seconds(30)));
  EXPECT_TRUE(
      Eventually([] { return Value("strata_service_up{service=\"chat\"}") == 1; }, seconds(30)));
}

}  // namespace
}  // namespace strata::cli

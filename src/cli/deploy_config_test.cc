// The deployment file and the deployment-level checks on values: keys parse
// through the serve FlagSet (the same errors as flags, with file, line,
// service and key), and host memory is summed per NUMA node on faked host
// facts, so two services that each fit alone are refused together.
#include "cli/deploy_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/model_dir.h"

namespace strata::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string FixtureDir(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

Deployment MustParse(const std::string& text) {
  auto d = ParseDeployment(text, "deploy.toml");
  EXPECT_TRUE(d.ok()) << d.status().message();
  return d.ok() ? *d : Deployment{};
}

std::string ParseError(const std::string& text) {
  auto d = ParseDeployment(text, "deploy.toml");
  EXPECT_FALSE(d.ok());
  return d.ok() ? "" : d.status().message();
}

TEST(DeployConfigTest, KeysAreServeFlagsAndArgvIsTheEquivalentCommandLine) {
  const Deployment d = MustParse(R"(
[launcher]
port = 9100
crashloop-burst = 3

[[service]]
name = "chat"
command = "serve"
port = 30000
model-path = "/models/x"
enable-hierarchical-cache = true
hicache-size = 150
disable-radix-cache = false
)");
  EXPECT_EQ(d.launcher.port, 9100);
  EXPECT_EQ(d.launcher.crashloop_burst, 3);
  EXPECT_EQ(d.launcher.crashloop_interval_s, 10);  // default
  ASSERT_EQ(d.services.size(), 1u);
  const ServiceSpec& s = d.services[0];
  EXPECT_EQ(s.name, "chat");
  EXPECT_EQ(s.line, 6);
  EXPECT_THAT(s.argv,
              ElementsAre("--port=30000", "--model-path=/models/x", "--enable-hierarchical-cache",
                          "--hicache-size=150", "--disable-radix-cache=false"));
  EXPECT_EQ(s.serve.port, 30000);
  EXPECT_EQ(s.serve.model.model_path, "/models/x");
  EXPECT_TRUE(s.serve.hicache.enabled);
  EXPECT_DOUBLE_EQ(s.serve.hicache.size_gb, 150);
  EXPECT_TRUE(s.serve.Given("hicache-size"));
  EXPECT_FALSE(s.serve.Given("hicache-ratio"));

  // The argv parses back to the same configuration, as `strata serve` reads it.
  auto again = DeploymentFromServeArgs(s.argv);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->services[0].serve.port, 30000);
  EXPECT_DOUBLE_EQ(again->services[0].serve.hicache.size_gb, 150);
  EXPECT_EQ(again->services[0].serve.given, s.serve.given);
}

TEST(DeployConfigTest, EveryKeyErrorNamesFileLineServiceAndKey) {
  const std::string e = ParseError(R"([[service]]
name = "a"
command = "serve"
modle-path = "/x"
port = "abc"
threads = [1]
page-size = 0
host = ""
)");
  EXPECT_THAT(e, HasSubstr("deploy.toml:4: service 'a': key 'modle-path': unknown flag "
                           "--modle-path; did you mean --model-path?"));
  EXPECT_THAT(e, HasSubstr("deploy.toml:5: service 'a': key 'port': --port: 'abc' is not an "
                           "integer"));
  EXPECT_THAT(e, HasSubstr("deploy.toml:6: service 'a': key 'threads': is an array"));
  EXPECT_THAT(e, HasSubstr("deploy.toml:7: service 'a': key 'page-size': --page-size: 0 is out of "
                           "range (allowed 1..1024)"));
  EXPECT_THAT(e, HasSubstr("deploy.toml:8: service 'a': key 'host': --host is empty"));
}

TEST(DeployConfigTest, TablesNamesAndCommands) {
  EXPECT_THAT(ParseError("[[service]]\nname = \"r\"\ncommand = \"router\"\n"),
              HasSubstr("deploy.toml:1: service 'r': "));  // a router needs workers
  EXPECT_THAT(ParseError("[[service]]\nname = \"r\"\ncommand = \"route\"\n"),
              HasSubstr("command 'route' is not a command (allowed: \"serve\", \"router\")"));
  EXPECT_THAT(ParseError("[[service]]\nname = \"r\"\n"),
              HasSubstr("deploy.toml:1: service 'r': needs command = \"serve\" or \"router\""));
  EXPECT_THAT(ParseError("[[service]]\ncommand = \"serve\"\n"),
              HasSubstr("deploy.toml:1: [[service]] needs name"));
  EXPECT_THAT(ParseError("[[service]]\nname = \"a b\"\ncommand = \"serve\"\n"),
              HasSubstr("name may hold only letters"));
  EXPECT_THAT(ParseError("[launcher]\nport = 9000\n"), HasSubstr("no [[service]] table"));
  EXPECT_THAT(ParseError("[launcher]\nprot = 9000\n[[service]]\nname = \"a\"\ncommand = "
                         "\"serve\"\n"),
              HasSubstr("deploy.toml:2: [launcher]: key 'prot': unknown flag --prot; did you "
                        "mean --port?"));
  EXPECT_THAT(ParseError("[servce]\nx = 1\n"), HasSubstr("unknown table [servce]"));
  EXPECT_THAT(ParseError("[launcher]\nbackoff-initial-s = 60\nbackoff-max-s = 30\n[[service]]\n"
                         "name = \"a\"\ncommand = \"serve\"\n"),
              HasSubstr("backoff-initial-s 60 exceeds backoff-max-s 30"));
}

TEST(DeployConfigTest, RouterServicesTakeRouterFlagsArraysRepeatAndStartAfterTheWorkers) {
  auto d = ParseDeployment(
      "[[service]]\nname = \"front\"\ncommand = \"router\"\nport = 30000\n"
      "prefill = [\"http://127.0.0.1:30010\", \"http://127.0.0.1:30012\"]\n"
      "decode = \"http://127.0.0.1:30011\"\npolicy = \"round_robin\"\n"
      "[[service]]\nname = \"p\"\ncommand = \"serve\"\nport = 30010\n"
      "disaggregation-mode = \"prefill\"\n",
      "deploy.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->services.size(), 2u);
  EXPECT_EQ(d->services[0].name, "p") << "workers start before the routers in front of them";
  const ServiceSpec& r = d->services[1];
  EXPECT_EQ(r.command, ServiceCommand::kRouter);
  EXPECT_STREQ(r.command_name(), "router");
  EXPECT_EQ(r.role(), "router");
  EXPECT_EQ(r.port(), 30000);
  EXPECT_EQ(r.router.o.prefills.size(), 2u);
  EXPECT_EQ(r.router.o.decodes.size(), 1u);
  EXPECT_EQ(r.router.o.policy.name, "round_robin");
  EXPECT_THAT(r.argv,
              ::testing::ElementsAre("--port=30000", "--prefill=http://127.0.0.1:30010",
                                     "--prefill=http://127.0.0.1:30012",
                                     "--decode=http://127.0.0.1:30011", "--policy=round_robin"));
  EXPECT_EQ(d->services[0].role(), "prefill");
  // Router keys are the router's flags, checked by the router's rules.
  EXPECT_THAT(ParseError("[[service]]\nname = \"r\"\ncommand = \"router\"\nworkers = \"x\"\n"),
              HasSubstr("deploy.toml:4: service 'r': key 'workers': unknown flag --workers; did "
                        "you mean --worker?"));
  EXPECT_THAT(ParseError("[[service]]\nname = \"r\"\ncommand = \"router\"\nworker = [true]\n"),
              HasSubstr("an array element must be a string or number"));
  EXPECT_THAT(ParseError("[[service]]\nname = \"r\"\ncommand = \"router\"\n"
                         "prefill = \"http://127.0.0.1:1\"\n"),
              HasSubstr("deploy.toml:1: service 'r': "));
}

TEST(DeployConfigTest, SyntaxErrorsNameTheLine) {
  const std::string e = ParseError("[launcher]\nport = 9000\n[[service]]\nname = \"a\n");
  EXPECT_THAT(e, HasSubstr("deploy.toml:4: TOML syntax error"));
  EXPECT_THAT(e, HasSubstr("name = \"a"));  // toml11's excerpt
}

// --- PlanDeployment on faked machines ---

constexpr uint64_t kGB10 = 1000000000;

HostMemoryFacts TwoNodes240() {
  HostMemoryFacts h;
  h.nodes = {{0, 256 * kGB10, 240 * kGB10}, {1, 256 * kGB10, 240 * kGB10}};
  h.allowed_nodes = {0, 1};
  h.mem_available_bytes = 480 * kGB10;
  return h;
}

ServiceInputs Inputs(const HostMemoryFacts& host, uint64_t weights = 16 * kGB10) {
  ServiceInputs in;
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (model.ok()) in.model = *model;
  in.env.host = host;
  in.env.weight_bytes = weights;
  return in;
}

std::string All(const DeploymentPlan& p) {
  std::string s;
  for (auto& x : p.problems) s += x + "\n";
  return s;
}

const char* kTwoWorkers = R"(
[[service]]
name = "prefill"
command = "serve"
device = "cuda"
port = 30000
enable-hierarchical-cache = true
hicache-size = 150
numa-node = %d

[[service]]
name = "decode"
command = "serve"
device = "cuda"
port = 30001
enable-hierarchical-cache = true
hicache-size = 150
numa-node = %d
)";

Deployment TwoWorkers(int node_a, int node_b) {
  char text[1024];
  std::snprintf(text, sizeof text, kTwoWorkers, node_a, node_b);
  return MustParse(text);
}

TEST(DeployPlanTest, TwoServicesThatEachFitANodeAloneAreRefusedTogether) {
  const HostMemoryFacts host = TwoNodes240();
  // Each alone fits node 0 (150 GB of 240 GB free, 12.8 GB reserve).
  for (int i = 0; i < 2; ++i) {
    Deployment one = TwoWorkers(0, 0);
    one.services.erase(one.services.begin() + i);
    const DeploymentPlan p = PlanDeployment(one, {Inputs(host)}, host);
    EXPECT_TRUE(p.ok()) << All(p);
  }
  const Deployment both = TwoWorkers(0, 0);
  const DeploymentPlan p = PlanDeployment(both, {Inputs(host), Inputs(host)}, host);
  ASSERT_EQ(p.problems.size(), 1u) << All(p);
  EXPECT_THAT(p.problems[0], HasSubstr("NUMA node 0: services 'prefill' 150.00 GB (host tier "
                                       "150.00 GB), 'decode' 150.00 GB (host tier 150.00 GB) "
                                       "plan 300.00 GB of host memory together, but 240.00 GB is "
                                       "free and 12.80 GB is kept back"));
  EXPECT_THAT(p.problems[0], HasSubstr("at most 227.20 GB fits (72.80 GB too much)"));
  EXPECT_THAT(p.problems[0], HasSubstr("place them on different NUMA nodes"));
  ASSERT_EQ(p.nodes.size(), 2u);  // node 0 and all nodes
  EXPECT_EQ(p.nodes[0].node, 0);
  EXPECT_EQ(p.nodes[0].planned_bytes, p.services[0].host_tier_bytes * 2);
  EXPECT_LT(p.nodes[0].HeadroomBytes(), 0);
  EXPECT_EQ(p.nodes[1].node, -1);
  EXPECT_GT(p.nodes[1].HeadroomBytes(), 0);  // 480 GB over both nodes would hold them
  // On GPUs the weights and the device pool are not host memory.
  EXPECT_EQ(p.services[0].HostBytes(), p.services[0].host_tier_bytes);

  // On different nodes they fit.
  const DeploymentPlan apart = PlanDeployment(TwoWorkers(0, 1), {Inputs(host), Inputs(host)}, host);
  EXPECT_TRUE(apart.ok()) << All(apart);
  EXPECT_EQ(apart.nodes.size(), 3u);
}

// Services on one GPU: each arena alone fits the free memory, the two
// together do not (each service's own plan sees the whole GPU).
TEST(DeployPlanTest, ArenasOfServicesSharingAGpuAreSummed) {
  const HostMemoryFacts host = TwoNodes240();
  auto on_gpu = [&] {
    ServiceInputs in = Inputs(host);
    DeviceMemoryFacts d;
    d.name = "fake GPU";
    d.total_bytes = uint64_t{80} << 30;
    d.free_bytes = uint64_t{79} << 30;
    in.env.device = d;
    ModelFootprint fp;
    fp.weight_bytes = fp.checkpoint_bytes = uint64_t{1} << 30;
    in.env.footprint = fp;
    return in;
  };
  const char* text = R"(
[[service]]
name = "a"
command = "serve"
device = "cuda"
mem-fraction-static = 0.6
port = 30000
[[service]]
name = "b"
command = "serve"
device = "%s"
mem-fraction-static = 0.6
port = 30001
)";
  char buf[512];
  std::snprintf(buf, sizeof buf, text, "cuda:0");
  const DeploymentPlan shared = PlanDeployment(MustParse(buf), {on_gpu(), on_gpu()}, host);
  ASSERT_EQ(shared.problems.size(), 1u) << All(shared);
  EXPECT_THAT(shared.problems[0], HasSubstr("services 'a', 'b' share cuda:0"));
  EXPECT_THAT(FormatDeploymentPlan(shared), HasSubstr("GPU memory of 'a': arena"));
  ServiceInputs other = on_gpu();
  other.env.device->device = 1;  // what ReadServeEnvironment reads for cuda:1
  std::snprintf(buf, sizeof buf, text, "cuda:1");
  const DeploymentPlan apart = PlanDeployment(MustParse(buf), {on_gpu(), other}, host);
  EXPECT_TRUE(apart.ok()) << All(apart);
}

TEST(DeployPlanTest, TheCgroupBindsOverAllNodes) {
  HostMemoryFacts host = TwoNodes240();
  host.cgroup_limit_bytes = 250 * kGB10;
  host.cgroup_usage_bytes = 0;
  host.cgroup_path = "/sys/fs/cgroup/strata";
  const DeploymentPlan p = PlanDeployment(TwoWorkers(0, 1), {Inputs(host), Inputs(host)}, host);
  ASSERT_EQ(p.problems.size(), 1u) << All(p);
  EXPECT_THAT(p.problems[0], HasSubstr("all allowed NUMA nodes (0-1): services 'prefill'"));
  EXPECT_THAT(p.problems[0], HasSubstr("within the memory cgroup /sys/fs/cgroup/strata"));
}

TEST(DeployPlanTest, OnCpuTheWeightsAndTheDevicePoolAreHostMemoryToo) {
  HostMemoryFacts host;
  host.nodes = {{0, 64 * kGB10, 40 * kGB10}};
  host.allowed_nodes = {0};
  const Deployment d = MustParse(R"(
[[service]]
name = "a"
command = "serve"
port = 30000
[[service]]
name = "b"
command = "serve"
port = 30001
)");
  const DeploymentPlan p =
      PlanDeployment(d, {Inputs(host, 20 * kGB10), Inputs(host, 20 * kGB10)}, host);
  ASSERT_EQ(p.problems.size(), 1u) << All(p);
  EXPECT_THAT(p.problems[0], HasSubstr("'a' "));
  EXPECT_THAT(p.problems[0], HasSubstr("(weights 20.00 GB + device pool"));
  EXPECT_GT(p.services[0].device_pool_bytes, 0u);
  EXPECT_EQ(p.services[0].HostBytes(), 20 * kGB10 + p.services[0].device_pool_bytes);
}

TEST(DeployPlanTest, NamesAndPortsAreUniqueAndTakenPortsAreProblems) {
  const HostMemoryFacts host = TwoNodes240();
  const Deployment d = MustParse(R"(
[launcher]
port = 30002
[[service]]
name = "a"
command = "serve"
port = 30000
[[service]]
name = "a"
command = "serve"
port = 30000
[[service]]
name = "c"
command = "serve"
port = 30002
[[service]]
name = "d"
command = "serve"
port = 0
[[service]]
name = "e"
command = "serve"
port = 0
)");
  std::vector<ServiceInputs> in(5, Inputs(host));
  in[4].port = FailedPrecondition("127.0.0.1:0 is already in use");
  const DeploymentPlan p = PlanDeployment(d, in, host);
  const std::string all = All(p);
  EXPECT_THAT(all, HasSubstr("deploy.toml:8: two services are named 'a'"));
  EXPECT_THAT(all, HasSubstr("service 'a' and service 'a' both use port 30000"));
  EXPECT_THAT(all, HasSubstr("service 'c' and the [launcher] both use port 30002"));
  EXPECT_THAT(all, Not(HasSubstr("service 'e' and service 'd'")));  // port 0: any
  EXPECT_THAT(all, HasSubstr("service 'e': --port 0: 127.0.0.1:0 is already in use"));
}

TEST(DeployPlanTest, EachServicesOwnProblemsAreNamedAndTheTableShowsThePlan) {
  const HostMemoryFacts host = TwoNodes240();
  const Deployment d = TwoWorkers(0, 7);
  const DeploymentPlan p = PlanDeployment(d, {Inputs(host), Inputs(host)}, host);
  EXPECT_THAT(All(p), HasSubstr("service 'decode': "));
  EXPECT_THAT(All(p), HasSubstr("7"));
  const std::string table =
      FormatDeploymentPlan(PlanDeployment(TwoWorkers(0, 1), {Inputs(host), Inputs(host)}, host));
  EXPECT_THAT(table, HasSubstr("prefill"));
  EXPECT_THAT(table, HasSubstr("full_attention 150.00 GB"));
  EXPECT_THAT(table, HasSubstr("host memory per NUMA node"));
}

// A PD pair behind a router; `urls` are the router's keys.
Deployment PdPair(const std::string& urls, const std::string& prefill_more = "") {
  return MustParse(R"(
[[service]]
name = "prefill"
command = "serve"
port = 30010
disaggregation-mode = "prefill"
)" + prefill_more + R"(
[[service]]
name = "decode"
command = "serve"
port = 30011
disaggregation-mode = "decode"
[[service]]
name = "chat"
command = "serve"
port = 30012
[[service]]
name = "router"
command = "router"
port = 30000
)" + urls);
}

std::string AllOf(const RouterCrossCheck& c) {
  std::string s;
  for (auto& x : c.problems) s += x + "\n";
  return s;
}

TEST(RouterUrlsTest, TheExamplesUrlsAreServicesOfTheRightRole) {
  const RouterCrossCheck ok = CheckRouterUrls(
      PdPair("prefill = [\"http://127.0.0.1:30010\"]\ndecode = [\"http://localhost:30011/\"]\n"),
      {});
  EXPECT_TRUE(ok.problems.empty()) << AllOf(ok);
  EXPECT_TRUE(ok.warnings.empty());
  // A colocated router's --worker takes a colocated service.
  const RouterCrossCheck worker = CheckRouterUrls(MustParse(R"(
[[service]]
name = "chat"
command = "serve"
port = 30012
[[service]]
name = "router"
command = "router"
port = 30000
worker = ["http://127.0.0.1:30012"]
)"),
                                                  {});
  EXPECT_TRUE(worker.problems.empty()) << AllOf(worker);
}

TEST(RouterUrlsTest, ATypodPortOrTheWrongRoleIsAProblemWithItsFix) {
  const RouterCrossCheck c = CheckRouterUrls(
      PdPair("prefill = [\"http://127.0.0.1:30011\"]\ndecode = [\"http://127.0.0.1:30021\", "
             "\"http://127.0.0.1:30000\", \"http://127.0.0.1:30012\"]\n"),
      {});
  const std::string all = AllOf(c);
  ASSERT_EQ(c.problems.size(), 4u) << all;
  EXPECT_THAT(c.problems[0],
              HasSubstr("service 'router': --prefill http://127.0.0.1:30011: that is service "
                        "'decode', a decode service (disaggregation-mode = \"decode\"), but "
                        "--prefill takes prefill services (disaggregation-mode = \"prefill\"): "
                        "point it at one (the file's prefill services: 'prefill' on port 30010)"));
  EXPECT_THAT(c.problems[1],
              HasSubstr("--decode http://127.0.0.1:30021: no service of deploy.toml listens on "
                        "port 30021 of this machine; give the port of a decode service (the "
                        "file's decode services: 'decode' on port 30011)"));
  EXPECT_THAT(c.problems[2], HasSubstr("--decode http://127.0.0.1:30000: that is this router's "
                                       "own port"));
  EXPECT_THAT(c.problems[3], HasSubstr("that is service 'chat', a colocated service (no "
                                       "disaggregation-mode), but --decode takes decode"));
  // The prefill is named by no router: a warning, not a problem.
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], HasSubstr("service 'prefill' (prefill) is behind no router"));
}

TEST(RouterUrlsTest, OnlyThisMachinesUrlsAreChecked) {
  const std::string urls =
      "prefill = [\"http://10.9.8.7:30099\", \"http://127.0.0.1:30010\"]\n"
      "decode = [\"http://10.9.8.7:30011\", \"http://127.0.0.1:30011\"]\n";
  EXPECT_TRUE(CheckRouterUrls(PdPair(urls), {}).problems.empty());
  // Once 10.9.8.7 is an address of this machine, port 30099 is a typo, and
  // the decode (--host 127.0.0.1 by default) cannot be reached there.
  const RouterCrossCheck c = CheckRouterUrls(PdPair(urls), {"10.9.8.7"});
  ASSERT_EQ(c.problems.size(), 2u) << AllOf(c);
  EXPECT_THAT(c.problems[0], HasSubstr("--prefill http://10.9.8.7:30099: no service"));
  EXPECT_THAT(c.problems[1], HasSubstr("--decode http://10.9.8.7:30011: service 'decode' listens "
                                       "on 127.0.0.1 only (host), so the router cannot reach it "
                                       "at 10.9.8.7"));
}

TEST(RouterUrlsTest, TheRouterAndTheDecodeMustReachWhereThePrefillListens) {
  const std::string urls =
      "prefill = [\"http://127.0.0.1:30010\"]\ndecode = [\"http://127.0.0.1:30011\"]\n";
  RouterCrossCheck c = CheckRouterUrls(PdPair(urls, "host = \"10.0.0.5\"\n"), {"10.0.0.5"});
  ASSERT_EQ(c.problems.size(), 1u) << AllOf(c);
  EXPECT_THAT(c.problems[0], HasSubstr("service 'prefill' listens on 10.0.0.5 only (host), so the "
                                       "router cannot reach it at 127.0.0.1: give the URL that "
                                       "address (http://10.0.0.5:30010)"));
  // The decode connects to the URL's host, where the bootstrap endpoint must listen.
  c = CheckRouterUrls(PdPair(urls, "disaggregation-bootstrap-host = \"10.0.0.5\"\n"), {});
  ASSERT_EQ(c.problems.size(), 1u) << AllOf(c);
  EXPECT_THAT(c.problems[0],
              HasSubstr("the router gives decode servers this URL's host, 127.0.0.1, as the "
                        "bootstrap host, but service 'prefill''s bootstrap endpoint listens on "
                        "10.0.0.5 only, so no decode can connect: set its "
                        "disaggregation-bootstrap-host to 127.0.0.1 or \"0.0.0.0\""));
  c = CheckRouterUrls(PdPair(urls, "disaggregation-bootstrap-host = \"0.0.0.0\"\n"), {});
  EXPECT_TRUE(c.problems.empty()) << AllOf(c);
}

TEST(DeployPlanTest, BootstrapPortsAreUniqueAndTheirBindTestAndTheTransportAreProblems) {
  const HostMemoryFacts host = TwoNodes240();
  const Deployment d = MustParse(R"(
[launcher]
port = 8090
[[service]]
name = "p1"
command = "serve"
port = 30010
disaggregation-mode = "prefill"
[[service]]
name = "p2"
command = "serve"
port = 30011
disaggregation-mode = "prefill"
[[service]]
name = "p3"
command = "serve"
port = 30012
disaggregation-mode = "prefill"
disaggregation-bootstrap-port = 30010
[[service]]
name = "p4"
command = "serve"
port = 30013
disaggregation-mode = "prefill"
disaggregation-bootstrap-port = 8090
)");
  std::vector<ServiceInputs> in(4, Inputs(host));
  in[0].bootstrap_port = FailedPrecondition("127.0.0.1:8998 is already in use");
  in[1].transport = Unavailable("KV pages cannot move");
  const std::string all = All(PlanDeployment(d, in, host));
  EXPECT_THAT(all, HasSubstr("service 'p2': disaggregation-bootstrap-port 8998 is also used by "
                             "the bootstrap port of service 'p1': give each prefill a bootstrap "
                             "port no other service or prefill uses"));
  EXPECT_THAT(all, HasSubstr("service 'p3': disaggregation-bootstrap-port 30010 is also used by "
                             "service 'p1'"));
  EXPECT_THAT(all, HasSubstr("service 'p4': disaggregation-bootstrap-port 8090 is also used by "
                             "the [launcher]"));
  EXPECT_THAT(all, HasSubstr("service 'p1': --disaggregation-bootstrap-port 8998: 127.0.0.1:8998 "
                             "is already in use"));
  EXPECT_THAT(all, HasSubstr("service 'p2': --disaggregation-transfer-backend ucx: KV pages "
                             "cannot move"));
}

}  // namespace
}  // namespace strata::cli

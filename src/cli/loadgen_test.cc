// Tests of the load generator: percentile math, SSE parsing across arbitrary
// read splits, the seeded Poisson schedule, SLO/goodput accounting, and one
// end-to-end burst of `strata bench serve` against a real `strata serve` with
// a tiny admission queue (both 200s and 503s must be counted, JSON written).
#include "cli/loadgen.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

namespace strata::cli {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 3);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 4.6);
  EXPECT_DOUBLE_EQ(Percentile(v, 25), 2);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_DOUBLE_EQ(Percentile(hundred, 99), 99.01);
}

TEST(LatencyStatsTest, SortsAndSummarises) {
  LatencyStats s = ComputeLatencyStats({5, 1, 4, 2, 3});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_EQ(ComputeLatencyStats({}).count, 0);
}

TEST(SseParserTest, EventsSurviveEverySplit) {
  const std::string stream =
      "data: {\"a\":1}\r\n\r\n"
      ": a comment\n\n"
      "event: x\ndata: line1\ndata: line2\n\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "line1\nline2", "[DONE]"};
  for (size_t cut1 = 0; cut1 <= stream.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= stream.size(); cut2 += 7) {
      SseParser p;
      std::vector<std::string> got;
      for (auto part :
           {stream.substr(0, cut1), stream.substr(cut1, cut2 - cut1), stream.substr(cut2)}) {
        for (auto& e : p.Feed(part)) got.push_back(e);
      }
      ASSERT_EQ(got, want) << "cuts " << cut1 << " " << cut2;
    }
  }
}

TEST(SseParserTest, IncompleteEventIsHeldBack) {
  SseParser p;
  EXPECT_TRUE(p.Feed("data: partial").empty());
  EXPECT_TRUE(p.Feed("\n").empty());
  EXPECT_EQ(p.Feed("\n"), std::vector<std::string>{"partial"});
}

TEST(CompletionChunkTest, CountsTokensFromUsageOrText) {
  auto c = ParseCompletionChunk(
      R"({"choices":[{"index":0,"text":"ab","finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":3}})",
      1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tokens, 2);
  EXPECT_EQ(c->prompt_tokens, 5);
  EXPECT_EQ(c->completion_tokens, 3);
  EXPECT_EQ(c->text, "ab");
  EXPECT_EQ(c->cached_tokens, -1);
  auto cached = ParseCompletionChunk(
      R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}})",
      3);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->tokens, 0);
  EXPECT_EQ(cached->cached_tokens, 4);
  auto t = ParseCompletionChunk(R"({"choices":[{"text":"x","finish_reason":"length"}]})", 0);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->tokens, 1);
  EXPECT_EQ(t->finish_reason, "length");
  auto chat = ParseCompletionChunk(R"({"choices":[{"delta":{"content":""}}]})", 0);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->tokens, 0);
  auto chat2 = ParseCompletionChunk(R"({"choices":[{"delta":{"content":" hi"}}]})", 0);
  ASSERT_TRUE(chat2.ok());
  EXPECT_EQ(chat2->tokens, 1);
  EXPECT_EQ(chat2->text, " hi");
  auto done = ParseCompletionChunk("[DONE]", 0);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
  EXPECT_FALSE(ParseCompletionChunk("{not json", 0).ok());
}

TEST(PoissonScheduleTest, SeededAndIncreasingWithTheRightMean) {
  const auto a = PoissonSchedule(100, 2000, 7);
  EXPECT_EQ(a, PoissonSchedule(100, 2000, 7));
  EXPECT_NE(a, PoissonSchedule(100, 2000, 8));
  ASSERT_EQ(a.size(), 2000u);
  for (size_t i = 1; i < a.size(); ++i) ASSERT_GT(a[i], a[i - 1]);
  // 2000 arrivals at 100/s take ~20 s; the mean gap's std error is ~2.2%.
  EXPECT_NEAR(a.back(), 20.0, 2.0);
}

TEST(ParseUrlTest, AcceptsLoopbackAndRejectsTheRest) {
  LoadgenConfig c;
  ASSERT_TRUE(ParseUrl("http://127.0.0.1:8123/", &c).ok());
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, 8123);
  ASSERT_TRUE(ParseUrl("http://localhost:9", &c).ok());
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_FALSE(ParseUrl("https://127.0.0.1:1", &c).ok());
  EXPECT_FALSE(ParseUrl("http://127.0.0.1:1/v1", &c).ok());
  EXPECT_FALSE(ParseUrl("http://127.0.0.1:0", &c).ok());
  EXPECT_FALSE(ParseUrl("http://example.com:80", &c).ok());
}

RequestRecord Ok(double ttft_s, double e2e_s, int64_t out) {
  RequestRecord r;
  r.http_status = 200;
  r.ttft_s = ttft_s;
  r.e2e_s = e2e_s;
  r.output_tokens = out;
  r.input_tokens = 10;
  return r;
}

TEST(SloTest, GoodputCountsRequestsMeetingBothBounds) {
  LoadgenConfig cfg;
  cfg.slo_ttft_ms = 100;
  cfg.slo_itl_ms = 10;
  std::vector<RequestRecord> rs;
  rs.push_back(Ok(0.05, 0.05 + 9 * 0.009, 10));  // meets both
  rs.push_back(Ok(0.20, 0.20 + 9 * 0.001, 10));  // TTFT too slow
  rs.push_back(Ok(0.01, 0.01 + 9 * 0.020, 10));  // ITL too slow
  rs.push_back(Ok(0.01, 0.01, 1));               // one token: no ITL to check
  RequestRecord rejected;
  rejected.http_status = 503;
  rejected.e2e_s = 0.002;
  rs.push_back(rejected);
  RequestRecord refused;
  refused.error = "connect: Connection refused";
  rs.push_back(refused);
  RequestRecord broken = Ok(0.01, 0.02, 2);
  broken.error = "stream ended without data: [DONE]";
  rs.push_back(broken);

  EXPECT_TRUE(MeetsSlo(rs[0], cfg.slo_ttft_ms, cfg.slo_itl_ms));
  EXPECT_FALSE(MeetsSlo(rs[1], cfg.slo_ttft_ms, cfg.slo_itl_ms));
  EXPECT_FALSE(MeetsSlo(rs[2], cfg.slo_ttft_ms, cfg.slo_itl_ms));
  EXPECT_TRUE(MeetsSlo(rs[2], cfg.slo_ttft_ms, 0));  // unchecked bound
  EXPECT_FALSE(MeetsSlo(rs[4], 0, 0));

  const LoadSummary s = Summarize(rs, 2.0, cfg);
  EXPECT_EQ(s.requests, 7);
  EXPECT_EQ(s.ok, 4);
  EXPECT_EQ(s.slo_met, 2);
  EXPECT_DOUBLE_EQ(s.goodput, 1.0);
  EXPECT_DOUBLE_EQ(s.request_throughput, 2.0);
  EXPECT_DOUBLE_EQ(s.output_tok_s, 31 / 2.0);
  EXPECT_EQ(s.rejected_503, 1);
  EXPECT_EQ(s.connection_errors, 2);
  EXPECT_EQ(s.by_status.at(200), 5);
  EXPECT_EQ(s.rejection_ms.count, 1);
  EXPECT_DOUBLE_EQ(s.rejection_ms.p99, 2.0);
}

TEST(SvgTest, RendersAWellFormedDocument) {
  std::vector<RequestRecord> rs = {Ok(0.01, 0.05, 4)};
  RequestRecord rejected;
  rejected.http_status = 503;
  rejected.e2e_s = 0.001;
  rs.push_back(rejected);
  const std::string svg = RenderLatencySvg(rs);
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<circle"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"red\""), std::string::npos);
}

// ---------------------------------------------------------------------------
// End to end through the real binary.

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs STRATA_BINARY with args, stdout+stderr to `log`; returns the pid.
pid_t Spawn(std::vector<std::string> args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    args.insert(args.begin(), STRATA_BINARY);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(STRATA_BINARY, argv.data());
    _exit(127);
  }
  return pid;
}

// A `strata serve` child on an ephemeral port; killed on destruction.
class ServerProcess {
 public:
  ServerProcess(const std::string& log, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "serve",
        "--port",
        "0",
        "--threads",
        "1",
        "--model-path",
        std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = Spawn(args, log);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    static const std::regex re("on http://127\\.0\\.0\\.1:(\\d+)");
    while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string l = ReadAll(log);
      if (std::regex_search(l, m, re))
        port_ = std::stoi(m[1]);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~ServerProcess() { Stop(); }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// Runs `strata bench serve` with args to completion; returns its exit code.
int RunBench(std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), {"bench", "serve"});
  int status = 0;
  waitpid(Spawn(args, log), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string TestDir() {
  static int n = 0;
  const std::string dir =
      ::testing::TempDir() + "/loadgen_" + std::to_string(getpid()) + "_" + std::to_string(n++);
  // A reused pid must not find an earlier run's logs (and their ports) here.
  EXPECT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  return dir;
}

TEST(BenchServeE2eTest, BurstAgainstATinyQueueCountsAdmittedAndRejected) {
  const std::string dir = TestDir();
  ServerProcess server(dir + "/server.log",
                       {"--max-running-requests", "1", "--max-queued-requests", "2"});
  ASSERT_GT(server.port(), 0) << ReadAll(dir + "/server.log");
  const std::string json_path = dir + "/out.json", svg_path = dir + "/out.svg",
                    bench_log = dir + "/bench.log";
  const int rc =
      RunBench({"--url", server.url(), "--burst", "40", "--input-len", "16", "--output-len", "8",
                "--timeout-s", "20", "--json", json_path, "--plot", svg_path},
               bench_log);
  server.Stop();
  ASSERT_EQ(rc, 0) << ReadAll(bench_log);

  const auto j = nlohmann::json::parse(ReadAll(json_path), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ReadAll(json_path);
  const auto& s = j["summary"];
  EXPECT_EQ(s["requests"], 40);
  EXPECT_GE(s["ok"].get<int>(), 1)
      << s.dump() << ReadAll(bench_log) << ReadAll(dir + "/server.log");
  EXPECT_GE(s["rejected_503"].get<int>(), 1) << s.dump();
  EXPECT_EQ(s["ok"].get<int>() + s["rejected_503"].get<int>(), 40) << s.dump();
  EXPECT_EQ(s["connection_errors"], 0);
  EXPECT_EQ(s["ttft_ms"]["count"], s["ok"]);
  EXPECT_EQ(j["requests"].size(), 40u);
  for (const auto& r : j["requests"]) {
    if (r["status"] == 200) {
      EXPECT_EQ(r["output_tokens"], 8) << r.dump();
      EXPECT_EQ(r["input_tokens"], 16) << r.dump();
    }
  }
  EXPECT_NE(ReadAll(svg_path).find("</svg>"), std::string::npos);
  EXPECT_NE(ReadAll(bench_log).find("503"), std::string::npos);
  if (!HasFailure())
    EXPECT_EQ(system(("rm -rf " + dir).c_str()), 0);
  else
    ADD_FAILURE() << "kept " << dir << "; server log:\n" << ReadAll(dir + "/server.log");
}

TEST(BenchServeE2eTest, ChatTurnsCarryTheConversation) {
  const std::string dir = TestDir();
  ServerProcess server(dir + "/server.log", {});
  ASSERT_GT(server.port(), 0) << ReadAll(dir + "/server.log");
  const std::string json_path = dir + "/out.json", bench_log = dir + "/bench.log";
  const int rc =
      RunBench({"--url", server.url(), "--chat", "--turns", "3", "--num-requests", "2",
                "--concurrency", "2", "--input-len", "6", "--output-len", "4", "--json", json_path},
               bench_log);
  server.Stop();
  ASSERT_EQ(rc, 0) << ReadAll(bench_log);
  const auto j = nlohmann::json::parse(ReadAll(json_path), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["summary"]["ok"], 6) << j["summary"].dump();
  std::map<std::pair<int, int>, int> input;  // (conversation, turn) -> prompt tokens
  for (const auto& r : j["requests"]) {
    EXPECT_EQ(r["output_tokens"], 4) << r.dump();
    input[{r["conversation"].get<int>(), r["turn"].get<int>()}] = r["input_tokens"].get<int>();
  }
  ASSERT_EQ(input.size(), 6u);
  for (int c = 0; c < 2; ++c) {
    // Each turn repeats the previous question and answer: the prompt grows by
    // more than the 4 answer tokens.
    EXPECT_GT(input[std::make_pair(c, 1)], input[std::make_pair(c, 0)] + 4);
    EXPECT_GT(input[std::make_pair(c, 2)], input[std::make_pair(c, 1)] + 4);
  }
  if (!HasFailure())
    EXPECT_EQ(system(("rm -rf " + dir).c_str()), 0);
  else
    ADD_FAILURE() << "kept " << dir << "; server log:\n" << ReadAll(dir + "/server.log");
}

}  // namespace
}  // namespace strata::cli

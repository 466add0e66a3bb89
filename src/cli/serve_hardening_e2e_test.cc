// End-to-end tests of `strata serve` hardening (issue 6) through the real
// binary and real sockets: a huge body never stalls other clients' I/O,
// /debug/integrity needs the key and costs no thread per call, requests that
// can never be admitted are 400s naming the limit, streams closed right after
// `data: [DONE]` count as ok, and GET /v1/models/{id}.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "cli/serve_test_process.h"
#include "server/http_test_client.h"

namespace {

using namespace strata::http_test;
using ::testing::HasSubstr;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Outcome(const char* outcome) {
  return std::string("strata_requests_total{model=\"m\",role=\"colocated\",outcome=\"") + outcome +
         "\"}";
}

// Item 1: parsing and tokenizing a huge body runs on a request thread, so
// /health and a concurrent stream keep going on the I/O thread meanwhile.
TEST(ServeHardeningTest, HugeBodiesDoNotStallHealthOrStreams) {
  Server s({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  ASSERT_GT(s.port(), 0) << s.Log();
  // ~24 MB of words to tokenize (under the 32 MiB body limit): seconds of
  // CPU per request. 10 MB took only 1.4 s for both on an AVX-512 2-core
  // machine, too quick for the bound below to prove anything.
  std::string words;
  while (words.size() < (24u << 20))
    words += "lorem ipsum dolor sit amet, consectetur adipiscing elit ";
  const std::string body = json{{"prompt", words}}.dump();
  words.clear();

  // A stream running through it all.
  std::atomic<bool> stream_done{false};
  double max_gap = 0;
  std::atomic<int> stream_events{0};
  std::thread stream([&] {
    Client c(Connect(s.port(), std::chrono::seconds(60)));
    json req = {
        {"prompt", "keep streaming"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}};
    c.Send(Post("/v1/completions", req.dump(), "Content-Type: application/json\r\n"));
    Clock::time_point last = Clock::now();
    c.Read([&](const std::string&) {
      const Clock::time_point now = Clock::now();
      if (stream_events++ > 0)
        max_gap = std::max(max_gap, std::chrono::duration<double>(now - last).count());
      last = now;
    });
    stream_done = true;
  });
  ASSERT_TRUE(Eventually([&] { return stream_events > 3; }, std::chrono::seconds(20)));

  std::atomic<int> tokenized{0};
  std::vector<std::thread> huge;
  for (int i = 0; i < 2; ++i) {
    huge.emplace_back([&] {
      Response r = s.PostJson("/tokenize", body, "", std::chrono::minutes(3));
      if (r.status == 200 && json::parse(r.body)["count"].get<int64_t>() > 500'000) tokenized++;
    });
  }
  // While they are being read and tokenized, /health answers promptly.
  double worst_health = 0;
  int health_ok = 0;
  const Clock::time_point t0 = Clock::now();
  while (tokenized.load() < 2 && Clock::now() - t0 < std::chrono::minutes(3)) {
    const Clock::time_point h0 = Clock::now();
    Response h = s.Request(Get("/health"), std::chrono::seconds(30));
    worst_health = std::max(worst_health, std::chrono::duration<double>(Clock::now() - h0).count());
    health_ok += h.status == 200;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& t : huge) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "huge bodies: %.1f s; worst /health %.3f s over %d calls\n", elapsed,
               worst_health, health_ok);
  EXPECT_EQ(tokenized.load(), 2);
  EXPECT_GT(health_ok, 0);
  // Blocked I/O means /health waits for whole tokenizations (~5 s each);
  // off the I/O thread it is milliseconds. The bound is generous for a busy
  // 2-core machine, and only meaningful when the tokenizing took longer.
  EXPECT_LT(worst_health, 1.5) << "tokenizing took " << elapsed << " s";
  // The bound above proves something only if a blocked I/O thread would
  // have broken it: the tokenizing must outlast it (2.4-2.9 s on an idle
  // 2-core machine; 3 s, the old bound, failed there).
  EXPECT_GT(elapsed, 2.0) << "the huge bodies were too quick to prove anything";
  stream.join();
  EXPECT_TRUE(stream_done.load());
  EXPECT_LT(max_gap, 1.5) << "the stream stalled while the huge bodies were processed";
  std::fprintf(stderr, "stream: %d events, largest gap %.3f s\n", stream_events.load(), max_gap);
}

// Item 3: /debug/* needs the API key; integrity checks are served by the
// engine loop one at a time (no thread per call): under load each answer is
// 200 or 503 + Retry-After, and the thread count stays flat.
TEST(ServeHardeningTest, IntegrityChecksNeedTheKeyAndCostNoThreads) {
  Server s(
      {"--model-path", Fixture("llama_default"), "--served-model-name", "m", "--api-key", "k"});
  ASSERT_GT(s.port(), 0) << s.Log();
  const std::string auth = "Authorization: Bearer k\r\n";
  Response noauth = s.Request(Get("/debug/integrity"));
  EXPECT_EQ(noauth.status, 401) << noauth.body;
  EXPECT_EQ(s.Request(Get("/debug/integrity", auth)).status, 200);  // idle: checked at once

  // Load: a few long generations keep the engine busy.
  std::vector<std::thread> load;
  for (int i = 0; i < 8; ++i) {
    load.emplace_back([&, i] {
      json req = {
          {"prompt", "load " + std::to_string(i)}, {"max_tokens", 2000}, {"ignore_eos", true}};
      s.PostJson("/v1/completions", req.dump(), auth, std::chrono::minutes(3));
    });
  }
  ASSERT_TRUE(Eventually(
      [&] { return s.Metric("strata_running_requests{model=\"m\",role=\"colocated\"}") > 0; },
      std::chrono::seconds(20)));
  const int threads_before = s.Threads();
  ASSERT_GT(threads_before, 0);
  std::atomic<int> ok{0}, busy{0}, other{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 10; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 30; ++i) {
        Response r = s.Request(Get("/debug/integrity", auth), std::chrono::seconds(30));
        if (r.status == 200) {
          ok++;
        } else if (r.status == 503 && r.Header("retry-after") == "1" &&
                   json::parse(r.body)["error"]["type"] == "overloaded") {
          busy++;
        } else {
          other++;
        }
      }
    });
  }
  int threads_max = threads_before;
  for (int i = 0; i < 20; ++i) {
    threads_max = std::max(threads_max, s.Threads());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& t : callers) t.join();
  threads_max = std::max(threads_max, s.Threads());
  EXPECT_EQ(ok + busy + other, 300);
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(busy.load(), 0);  // busy engine / one pending: 503, never 500
  EXPECT_LE(threads_max, threads_before + 1) << "threads grew from " << threads_before;
  for (auto& t : load) t.join();
  EXPECT_EQ(s.Request(Get("/debug/integrity", auth), std::chrono::seconds(30)).status, 200);
}

// Item 6: a request that exceeds a limit on its own is a 400 naming the
// limit; 503 + Retry-After is only for when waiting could help.
TEST(ServeHardeningTest, RequestThatCanNeverBeAdmittedIs400) {
  Server s({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  ASSERT_GT(s.port(), 0) << s.Log();
  // 3 prompts x n=128 = 384 choices > 64 running + 256 queued, on an idle server.
  Response r =
      s.PostJson("/v1/completions", R"({"prompt": ["a","b","c"], "n": 128, "max_tokens": 1})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_TRUE(r.Header("retry-after").empty());
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["code"], "max_queued_requests");
  EXPECT_EQ(e["param"], "n");
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("--max-queued-requests 256"));
  // Within the bound it runs.
  Response fits =
      s.PostJson("/v1/completions", R"({"prompt": ["a","b"], "n": 128, "max_tokens": 1})", "",
                 std::chrono::seconds(60));
  EXPECT_EQ(fits.status, 200) << fits.body;
  EXPECT_EQ(json::parse(fits.body)["choices"].size(), 256u);
  EXPECT_EQ(s.Metric(Outcome("rejected")), 0);

  Server t({"--model-path", Fixture("llama_default"), "--served-model-name", "m",
            "--max-queued-tokens", "100"});
  ASSERT_GT(t.port(), 0) << t.Log();
  Response big = t.PostJson("/v1/completions",
                            json{{"prompt", std::vector<int>(200, 5)}, {"max_tokens", 1}}.dump());
  EXPECT_EQ(big.status, 400) << big.body;
  json be = json::parse(big.body)["error"];
  EXPECT_EQ(be["code"], "max_queued_tokens");
  EXPECT_EQ(be["param"], "prompt");
  EXPECT_THAT(be["message"].get<std::string>(), HasSubstr("--max-queued-tokens 100"));
  EXPECT_EQ(t.PostJson("/v1/completions",
                       json{{"prompt", std::vector<int>(50, 5)}, {"max_tokens", 1}}.dump())
                .status,
            200);
}

// Item 11(a): openai-node closes the connection right after reading
// `data: [DONE]`; such a completed stream is outcome="ok".
TEST(ServeHardeningTest, StreamsClosedRightAfterDoneCountAsOk) {
  Server s({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  ASSERT_GT(s.port(), 0) << s.Log();
  constexpr int kRounds = 60, kParallel = 8;
  std::atomic<int> done_seen{0};
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> ts;
    for (int i = 0; i < kParallel; ++i) {
      ts.emplace_back([&, i] {
        int fd = Connect(s.port(), std::chrono::seconds(30));
        json req = {{"prompt", "close after done " + std::to_string(i)},
                    {"max_tokens", 3},
                    {"stream", true}};
        SendAll(fd, Post("/v1/completions", req.dump(), "Content-Type: application/json\r\n"));
        std::string got;
        char buf[4096];
        while (got.find("data: [DONE]") == std::string::npos) {
          ssize_t n = ::recv(fd, buf, sizeof buf, 0);
          if (n <= 0) break;
          got.append(buf, static_cast<size_t>(n));
        }
        if (got.find("data: [DONE]") != std::string::npos) done_seen++;
        // Close at once, with a reset, as an impatient client does.
        linger lg{1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        ::close(fd);
      });
    }
    for (auto& t : ts) t.join();
  }
  const int n = kRounds * kParallel;
  EXPECT_EQ(done_seen.load(), n);
  EXPECT_TRUE(
      Eventually([&] { return s.Metric(Outcome("ok")) + s.Metric(Outcome("aborted")) == n; }));
  EXPECT_EQ(s.Metric(Outcome("ok")), n);
  EXPECT_EQ(s.Metric(Outcome("aborted")), 0);
}

// Item 11(e): GET /v1/models/{id}, as OpenAI and SGLang serve it.
TEST(ServeHardeningTest, RetrieveModelById) {
  Server s(
      {"--model-path", Fixture("llama_default"), "--served-model-name", "org/m", "--api-key", "k"});
  ASSERT_GT(s.port(), 0) << s.Log();
  const std::string auth = "Authorization: Bearer k\r\n";
  Response list = s.Request(Get("/v1/models", auth));
  ASSERT_EQ(list.status, 200) << list.body;
  json listed = json::parse(list.body)["data"][0];
  EXPECT_EQ(listed["id"], "org/m");
  listed.erase("created");  // a timestamp: may tick between the two calls
  for (const char* path : {"/v1/models/org/m", "/v1/models/org%2Fm"}) {
    Response one = s.Request(Get(path, auth));
    ASSERT_EQ(one.status, 200) << path << " " << one.body;
    json got = json::parse(one.body);
    EXPECT_TRUE(got["created"].is_number_integer());
    got.erase("created");
    EXPECT_EQ(got, listed) << path;
  }
  EXPECT_EQ(s.Request(Get("/v1/models/org/m")).status, 401);
  Response missing = s.Request(Get("/v1/models/gpt-4o", auth));
  EXPECT_EQ(missing.status, 404);
  json e = json::parse(missing.body)["error"];
  EXPECT_EQ(e["code"], "model_not_found");
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr("gpt-4o"));
  EXPECT_EQ(s.Request(Get("/v2/elsewhere", auth)).status, 404);
}

}  // namespace

// End-to-end tests of `strata router` through the real binary: real
// `strata serve` workers (child processes on the fixture models) behind a
// real router process, all on 127.0.0.1. Greedy outputs through the router
// equal a worker's own, streaming or not, text and chat; round robin spreads;
// a worker killed with kill -9 is routed around and marked down; a burst
// above the router's limits gives only 200s and 503s with Retry-After; a
// client that disconnects mid-stream aborts the worker's request.
//
// These use colocated workers only. The PD dispatch path (both roles, the
// fields, the prefill's error first) is checked against fake roles in
// router/router_test.cc; the PD end-to-end tests come with the PD roles.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/router_test_process.h"
#include "cli/serve_test_process.h"
#include "server/http_test_client.h"

namespace {

using namespace strata::http_test;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kActive = "strata_kv_pages_used{model=\"m\",role=\"colocated\",state=\"active\"}";

std::string Url(const Server& s) { return "http://127.0.0.1:" + std::to_string(s.port()); }

// The parts of an answer that must not depend on the path it took (a
// second request may hit the worker's prefix cache: cached_tokens differ).
json Comparable(json j) {
  j.erase("id");
  j.erase("created");
  j["usage"].erase("prompt_tokens_details");
  return j;
}

// The text of an SSE stream of completions or chat chunks.
std::string StreamText(const std::string& body, bool chat) {
  std::string text;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    json j = json::parse(data);
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (chat) {
      if (c["delta"].contains("content") && c["delta"]["content"].is_string())
        text += c["delta"]["content"].get<std::string>();
    } else {
      text += c["text"].get<std::string>();
    }
  }
  return text;
}

TEST(RouterE2eTest, InvalidFlagsExit78WithTheFlagNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{}, "--worker"},
           {{"--worker", "127.0.0.1:8000"}, "expected http://HOST:PORT"},
           {{"--worker", "http://127.0.0.1:8000", "--policy", "fastest"}, "--policy"},
           {{"--prefill", "http://127.0.0.1:8000"}, "--decode is missing"},
           {{"--worker", "http://127.0.0.1:8000", "--max-concurrent-requests", "-1"},
            "--max-concurrent-requests"},
           {{"--worker", "http://127.0.0.1:8000", "--bogus"}, "unknown flag --bogus"},
       }) {
    RouterProcess r(c.args);
    EXPECT_EQ(r.WaitExit(std::chrono::seconds(10)), 78) << r.Log();
    EXPECT_THAT(r.Log(), HasSubstr("invalid configuration"));
    EXPECT_THAT(r.Log(), HasSubstr(c.says));
  }
  // A port that is taken is a configuration error too (found before serving).
  Server taken({"--model-path", Fixture("qwen3")});
  ASSERT_GT(taken.port(), 0);
  std::vector<std::string> args = {"--worker", Url(taken), "--port", std::to_string(taken.port())};
  RouterProcess busy(args);
  EXPECT_EQ(busy.WaitExit(std::chrono::seconds(10)), 78) << busy.Log();
  EXPECT_THAT(busy.Log(), HasSubstr("--host/--port"));
  // --max-concurrent-requests 0 alone is valid: no limit, so no queue.
  RouterProcess unlimited({"--worker", Url(taken), "--max-concurrent-requests", "0"});
  EXPECT_GT(unlimited.port(), 0) << unlimited.Log();
}

// Two workers on the qwen3 fixture, served as "m", behind a router with
// --policy `policy` (members start in this order).
struct TwoWorkers {
  Server a{{"--model-path", Fixture("qwen3"), "--served-model-name", "m"}};
  Server b{{"--model-path", Fixture("qwen3"), "--served-model-name", "m"}};
  RouterProcess r;
  explicit TwoWorkers(const std::string& policy)
      : r({"--worker", Url(a), "--worker", Url(b), "--policy", policy}) {}
  // All three listening (else the logs of the ones that are not).
  ::testing::AssertionResult Up() {
    if (a.port() <= 0) return ::testing::AssertionFailure() << "worker a: " << a.Log();
    if (b.port() <= 0) return ::testing::AssertionFailure() << "worker b: " << b.Log();
    if (r.port() <= 0) return ::testing::AssertionFailure() << "router: " << r.Log();
    return ::testing::AssertionSuccess();
  }
};

TEST(RouterE2eTest, GreedyOutputsEqualAWorkersOwnAndRoundRobinSpreads) {
  TwoWorkers w("round_robin");
  ASSERT_TRUE(w.Up());
  Server &a = w.a, &b = w.b;
  RouterProcess& r = w.r;
  ASSERT_EQ(r.Request(Get("/health")).status, 200) << r.Log();

  std::ifstream in(Fixture("qwen3") + "/golden.json");
  const json g = json::parse(in);
  const json completion = {{"model", "m"},       {"prompt", "The quick brown fox"},
                           {"max_tokens", 12},   {"temperature", 0},
                           {"ignore_eos", true}, {"logprobs", 2}};
  const json chat = {{"model", "m"},
                     {"messages", g["chat_cases"][0]["messages"]},
                     {"max_tokens", 10},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  for (int round = 0; round < 2; ++round) {  // each body reaches both workers
    for (bool is_chat : {false, true}) {
      const std::string path = is_chat ? "/v1/chat/completions" : "/v1/completions";
      const json& body = is_chat ? chat : completion;
      Response direct = a.PostJson(path, body.dump(), "", std::chrono::seconds(30));
      ASSERT_EQ(direct.status, 200) << direct.body;
      Response routed = r.PostJson(path, body.dump());
      ASSERT_EQ(routed.status, 200) << routed.body << r.Log();
      EXPECT_EQ(Comparable(json::parse(routed.body)), Comparable(json::parse(direct.body)));
      EXPECT_FALSE(routed.Header("x-request-id").empty());

      json sbody = body;
      sbody["stream"] = true;
      Response stream = r.PostJson(path, sbody.dump());
      ASSERT_EQ(stream.status, 200) << stream.body;
      EXPECT_EQ(stream.Header("content-type"), "text/event-stream");
      const json whole = json::parse(direct.body)["choices"][0];
      EXPECT_EQ(StreamText(stream.body, is_chat),
                is_chat ? whole["message"]["content"].get<std::string>()
                        : whole["text"].get<std::string>());
      EXPECT_THAT(stream.body, HasSubstr("data: [DONE]"));
    }
  }
  const std::string ok = "strata_requests_total{model=\"m\",role=\"colocated\",outcome=\"ok\"}";
  EXPECT_TRUE(Eventually([&] { return b.Metric(ok) == 4; }))
      << "round robin: half of the 8 routed requests, not " << b.Metric(ok);
  EXPECT_EQ(r.Metric("strata_router_requests_total{worker=\"" + Url(b) + "\",outcome=\"ok\"}"), 4);
  EXPECT_EQ(r.Metric("strata_router_requests_total{worker=\"" + Url(a) + "\",outcome=\"ok\"}"), 4);
  // /v1/models from a worker.
  Response models = r.Request(Get("/v1/models"));
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "m");
  // The worker side of the contract: /server_info and /load, without a key.
  Response info = a.Request(Get("/server_info"));
  ASSERT_EQ(info.status, 200);
  json ij = json::parse(info.body);
  EXPECT_EQ(ij["role"], "colocated");
  EXPECT_EQ(ij["disaggregation_mode"], "null");
  EXPECT_FALSE(ij.contains("disaggregation_bootstrap_port"));
  EXPECT_EQ(ij["model"], "m");
  EXPECT_GT(ij["page_size"].get<int>(), 0);
  EXPECT_EQ(json::parse(a.Request(Get("/get_server_info")).body), ij);
  json load = json::parse(a.Request(Get("/load")).body);
  EXPECT_EQ(load["running"], 0);
  EXPECT_EQ(load["queued"], 0);
  EXPECT_GT(load["pages_free"].get<int64_t>(), 0);
}

// /v1/responses through the router: each worker's response store is its
// own, so a conversation's turns (previous_response_id) and GET / DELETE of
// a response go to the worker whose id is inside the response's id
// (server/openai_responses.h NewStoredResponseId), whatever the policy says.
// Round robin over two workers would send every other turn to the wrong one.
TEST(RouterE2eTest, ResponsesFollowTheirStoreToTheWorkerThatMadeThem) {
  TwoWorkers w("round_robin");
  ASSERT_TRUE(w.Up());
  Server &a = w.a, &b = w.b;
  RouterProcess& r = w.r;
  // Both workers' instance ids known (the first health checks done).
  std::string workers;
  ASSERT_TRUE(Eventually([&] {
    Response w = r.Request(Get("/workers"));
    workers = w.body;
    if (w.status != 200) return false;
    int known = 0;
    const json all = json::parse(w.body);
    for (const auto& x : all["workers"]) known += x.contains("instance_id");
    return known == 2;
  })) << workers
      << r.Log();
  const std::string inst_a = json::parse(a.Request(Get("/server_info")).body)["instance_id"];
  const std::string inst_b = json::parse(b.Request(Get("/server_info")).body)["instance_id"];
  ASSERT_NE(inst_a, inst_b);

  int on_a = 0;
  for (int conv = 0; conv < 2; ++conv) {  // round robin starts them on both workers
    json req = {{"model", "m"},
                {"input", "Hello there"},
                {"max_output_tokens", 6},
                {"temperature", 0},
                {"store", true}};
    Response first = r.PostJson("/v1/responses", req.dump());
    ASSERT_EQ(first.status, 200) << first.body << r.Log();
    std::string prev = json::parse(first.body)["id"];
    const std::string inst = prev.substr(5, 16);
    ASSERT_TRUE(inst == inst_a || inst == inst_b) << prev;
    on_a += inst == inst_a;
    for (int turn = 0; turn < 4; ++turn) {
      json next = {{"model", "m"},     {"input", "And then?"}, {"max_output_tokens", 6},
                   {"temperature", 0}, {"store", true},        {"previous_response_id", prev}};
      Response rsp = r.PostJson("/v1/responses", next.dump());
      ASSERT_EQ(rsp.status, 200) << "turn " << turn << ": " << rsp.body;
      json j = json::parse(rsp.body);
      EXPECT_EQ(j["previous_response_id"], prev);
      prev = j["id"];
      EXPECT_EQ(prev.substr(5, 16), inst) << "the conversation stays on its worker";
      // Reading it back through the router, twice (relayed: a random worker
      // without the pin).
      for (int k = 0; k < 2; ++k) {
        Response got = r.Request(Get("/v1/responses/" + prev));
        ASSERT_EQ(got.status, 200) << got.body;
        EXPECT_EQ(json::parse(got.body)["id"], prev);
        Response items = r.Request(Get("/v1/responses/" + prev + "/input_items"));
        EXPECT_EQ(items.status, 200) << items.body;
      }
    }
    Response del = r.Request("DELETE /v1/responses/" + prev + " HTTP/1.1\r\nHost: test\r\n\r\n");
    EXPECT_EQ(del.status, 200) << del.body;
    EXPECT_EQ(r.Request(Get("/v1/responses/" + prev)).status, 404);
  }
  EXPECT_EQ(on_a, 1) << "round robin started one conversation on each worker";
}

// cache_aware (the default policy): conversations sharing a long system
// prompt land on one worker, so each after the first reuses its KV pages.
TEST(RouterE2eTest, CacheAwareSendsASharedPrefixToTheWorkerThatHasItCached) {
  TwoWorkers w("cache_aware");  // the default policy
  ASSERT_TRUE(w.Up());
  Server &a = w.a, &b = w.b;
  RouterProcess& r = w.r;
  std::string system = "You are a careful assistant. ";
  while (system.size() < 600) system += "Answer briefly and cite the rules you follow. ";
  for (int i = 0; i < 6; ++i) {
    json body = {{"model", "m"},
                 {"messages",
                  {{{"role", "system"}, {"content", system}},
                   {{"role", "user"}, {"content", "Question number " + std::to_string(i)}}}},
                 {"max_tokens", 2}};
    Response res = r.PostJson("/v1/chat/completions", body.dump());
    ASSERT_EQ(res.status, 200) << res.body;
    const int64_t cached = json::parse(res.body)["usage"]["prompt_tokens_details"]["cached_tokens"];
    if (i > 0) EXPECT_GT(cached, 0) << "request " << i << " missed the cache";
  }
  const std::string ok = "strata_requests_total{model=\"m\",role=\"colocated\",outcome=\"ok\"}";
  // (A worker counts a request just after its answer went out.)
  EXPECT_TRUE(Eventually([&] { return a.Metric(ok) + b.Metric(ok) == 6; }));
  EXPECT_TRUE(a.Metric(ok) == 6 || b.Metric(ok) == 6) << a.Metric(ok) << " / " << b.Metric(ok);
}

TEST(RouterE2eTest, AWorkerKilledWithSigkillIsRoutedAroundAndMarkedDown) {
  Server a({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  Server b({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  ASSERT_GT(a.port(), 0);
  ASSERT_GT(b.port(), 0);
  RouterProcess r({"--worker", Url(a), "--worker", Url(b), "--policy", "round_robin",
                   "--health-check-interval-ms", "500", "--health-failure-threshold", "2"});
  ASSERT_GT(r.port(), 0) << r.Log();
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(r.PostJson("/v1/completions", R"({"prompt":"warm","max_tokens":4})").status, 200);
  a.Signal(SIGKILL);
  ASSERT_EQ(a.WaitExit(std::chrono::seconds(5)), -100 - SIGKILL);
  // At once, before any health check noticed: retried on b.
  for (int i = 0; i < 6; ++i) {
    Response res = r.PostJson("/v1/completions", R"({"prompt":"after the kill","max_tokens":4})");
    EXPECT_EQ(res.status, 200) << res.body << r.Log();
  }
  const std::string healthy = "strata_router_worker_healthy{worker=\"" + Url(a) + "\"}";
  EXPECT_TRUE(Eventually([&] { return r.Metric(healthy) == 0; }, std::chrono::seconds(5)));
  EXPECT_EQ(r.Metric("strata_router_worker_healthy{worker=\"" + Url(b) + "\"}"), 1);
  EXPECT_GE(r.Metric("strata_router_retries_total"), 1);
  EXPECT_GE(
      r.Metric("strata_router_requests_total{worker=\"" + Url(a) + "\",outcome=\"unreachable\"}"),
      1);
  EXPECT_EQ(r.Request(Get("/health")).status, 200);
  json workers = json::parse(r.Request(Get("/workers")).body)["workers"];
  EXPECT_EQ(workers[0]["healthy"], false);
  EXPECT_EQ(workers[1]["healthy"], true);
  EXPECT_THAT(r.Log(), HasSubstr("is unhealthy"));
  const std::string old_instance = workers[0]["instance_id"];
  // A new process on the same port: healthy again after its checks pass,
  // noticed as a replacement, and given requests again.
  Server again({"--model-path", Fixture("llama_default"), "--served-model-name", "m", "--port",
                std::to_string(a.port())});
  ASSERT_EQ(again.port(), a.port()) << again.Log();
  EXPECT_TRUE(Eventually([&] { return r.Metric(healthy) == 1; }, std::chrono::seconds(5)));
  EXPECT_TRUE(Eventually(
      [&] {
        json w = json::parse(r.Request(Get("/workers")).body)["workers"][0];
        return w.value("instance_id", "") != old_instance;
      },
      std::chrono::seconds(5)));
  EXPECT_THAT(r.Log(), HasSubstr("was replaced"));
  b.Signal(SIGKILL);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(r.PostJson("/v1/completions", R"({"prompt":"on the new one","max_tokens":2})").status,
              200);
  EXPECT_TRUE(Eventually([&] {
    return again.Metric("strata_requests_total{model=\"m\",role=\"colocated\",outcome=\"ok\"}") >=
           4;
  }));
  // The last worker gone: 503 with Retry-After once health notices.
  again.Signal(SIGKILL);
  EXPECT_TRUE(
      Eventually([&] { return r.Request(Get("/health")).status == 503; }, std::chrono::seconds(5)));
  Response none = r.PostJson("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  EXPECT_EQ(none.status, 503);
  EXPECT_EQ(none.Header("retry-after"), "1");
}

// SIGSTOP: the worker's sockets stay open but nothing answers. The health
// checks notice within seconds and its requests fail over (a non-streamed
// one is answered by the other worker; a stream in progress ends with an
// error event) instead of hanging until --request-timeout-ms; SIGCONT brings
// it back.
TEST(RouterE2eTest, AStalledWorkerIsTakenOutAndItsRequestsFailOver) {
  Server a({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  Server b({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  ASSERT_GT(a.port(), 0);
  ASSERT_GT(b.port(), 0);
  // Checks every 500 ms, 2 failures: taken out within about 1.5 s (and a
  // loaded machine does not fail the healthy one's checks).
  RouterProcess r({"--worker", Url(a), "--worker", Url(b), "--policy", "round_robin",
                   "--health-check-interval-ms", "500", "--health-failure-threshold", "2"});
  ASSERT_GT(r.port(), 0) << r.Log();
  Response whole;
  std::optional<Response> stream;
  std::atomic<bool> streaming{false};
  const auto t0 = std::chrono::steady_clock::now();
  // Round robin: the stream goes to a, the request after it to b, the
  // non-streamed one to a again.
  std::thread ts([&] {
    Client c(Connect(r.port(), std::chrono::seconds(30)));
    json body = {{"prompt", "long"}, {"max_tokens", 1800}, {"ignore_eos", true}, {"stream", true}};
    c.Send(Post("/v1/completions", body.dump(), "Content-Type: application/json\r\n"));
    stream = c.Read([&](const std::string&) { streaming = true; });
  });
  ASSERT_TRUE(Eventually([&] { return streaming.load(); }, std::chrono::seconds(10)));
  ASSERT_EQ(r.PostJson("/v1/completions", R"({"prompt":"b","max_tokens":2})").status, 200);
  a.Stop();
  std::thread tw([&] {
    whole = r.PostJson("/v1/completions", R"({"prompt":"whole","max_tokens":5,"ignore_eos":true})");
  });
  ts.join();
  tw.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(json::parse(whole.body)["usage"]["completion_tokens"], 5);
  ASSERT_TRUE(stream.has_value()) << r.Log();
  EXPECT_EQ(stream->status, 200) << stream->body.substr(0, 500) << r.Log();
  EXPECT_THAT(stream->body.substr(stream->body.size() > 2000 ? stream->body.size() - 2000 : 0),
              HasSubstr("stopped passing its health checks"));
  EXPECT_EQ(r.Metric("strata_router_worker_healthy{worker=\"" + Url(a) + "\"}"), 0);
  a.Signal(SIGCONT);
  EXPECT_TRUE(Eventually(
      [&] { return r.Metric("strata_router_worker_healthy{worker=\"" + Url(a) + "\"}") == 1; },
      std::chrono::seconds(5)));
  // The stalled worker saw its client go once it ran again: nothing leaks.
  EXPECT_TRUE(Eventually([&] { return a.Metric(kActive) == 0; }, std::chrono::seconds(5)));
}

TEST(RouterE2eTest, ABurstAboveTheRoutersLimitsGetsOnly200sAnd503s) {
  Server w({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  ASSERT_GT(w.port(), 0);
  RouterProcess r(
      {"--worker", Url(w), "--max-concurrent-requests", "2", "--max-queued-requests", "3"});
  ASSERT_GT(r.port(), 0) << r.Log();
  std::atomic<int> ok{0}, shed{0}, other{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 40; ++i) {
    ts.emplace_back([&, i] {
      json body = {{"prompt", "burst " + std::to_string(i)},
                   {"max_tokens", 40},
                   {"ignore_eos", true},
                   {"stream", i % 2 == 0}};
      Response res = r.PostJson("/v1/completions", body.dump(), "", std::chrono::seconds(120));
      if (res.status == 200) {
        const bool complete = i % 2 == 0
                                  ? res.body.find("data: [DONE]") != std::string::npos
                                  : json::parse(res.body)["usage"]["completion_tokens"] == 40;
        (complete ? ok : other)++;
      } else if (res.status == 503 && res.Header("retry-after") == "1" &&
                 json::parse(res.body)["error"]["code"] == "max_queued_requests") {
        shed++;
      } else {
        other++;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(other.load(), 0) << r.Log();
  EXPECT_GT(shed.load(), 0);
  EXPECT_GE(ok.load(), 5) << "the 2 running and 3 queued at the peak at least";
  EXPECT_EQ(r.Metric("strata_router_rejected_requests_total{reason=\"max_queued_requests\"}"),
            shed.load());
  const std::string worker_ok =
      "strata_requests_total{model=\"m\",role=\"colocated\",outcome=\"ok\"}";
  EXPECT_TRUE(Eventually([&] { return w.Metric(worker_ok) == ok.load(); }))
      << "the worker never saw the shed ones: " << w.Metric(worker_ok) << " vs " << ok.load();
  EXPECT_TRUE(Eventually([&] { return r.Metric("strata_router_in_flight_requests") == 0; }));
  EXPECT_EQ(r.Metric("strata_router_queued_requests"), 0);
  EXPECT_TRUE(Eventually([&] { return w.Metric(kActive) == 0; }));
  // The router's exposition passes promtool's checks (when it is installed).
  if (system("command -v promtool >/dev/null 2>&1") == 0) {
    const std::string file =
        ::testing::TempDir() + "/router_metrics_" + std::to_string(getpid()) + ".txt";
    std::ofstream(file) << r.Request(Get("/metrics")).body;
    EXPECT_EQ(system(("promtool check metrics < " + file).c_str()), 0);
  }
}

TEST(RouterE2eTest, AClientDisconnectMidStreamAbortsTheWorkersRequest) {
  Server w({"--model-path", Fixture("llama_default"), "--served-model-name", "m"});
  ASSERT_GT(w.port(), 0);
  RouterProcess r({"--worker", Url(w)});
  ASSERT_GT(r.port(), 0) << r.Log();
  {
    Client c(r.port(), true);
    json body = {
        {"prompt", "stream forever"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}};
    ASSERT_TRUE(c.Send(Post("/v1/completions", body.dump(), "Content-Type: application/json\r\n")));
    char buf[4096];
    ASSERT_GT(::recv(c.fd(), buf, sizeof buf, 0), 0);  // the stream started
    ASSERT_TRUE(Eventually([&] { return w.Metric(kActive) > 0; }));
  }  // closes the socket mid-stream
  EXPECT_TRUE(Eventually([&] { return w.Metric(kActive) == 0; }, std::chrono::seconds(3)));
  EXPECT_TRUE(Eventually([&] {
    return w.Metric("strata_requests_total{model=\"m\",role=\"colocated\",outcome=\"aborted\"}") ==
           1;
  }));
  Response integrity = w.Request(Get("/debug/integrity"));
  EXPECT_EQ(integrity.status, 200) << integrity.body;
  EXPECT_EQ(r.Metric("strata_router_requests_total{worker=\"" + Url(w) + "\",outcome=\"aborted\"}"),
            1);
  Response next = r.PostJson("/v1/completions", R"({"prompt":"next","max_tokens":3})");
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(json::parse(next.body)["usage"]["completion_tokens"], 3);
  // SIGTERM: the router drains and exits 0.
  r.Signal(SIGTERM);
  EXPECT_EQ(r.WaitExit(std::chrono::seconds(10)), 0) << r.Log();
}

}  // namespace

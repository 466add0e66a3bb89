// The router against fake workers: real HTTP on 127.0.0.1, in one process,
// with workers whose answers the test controls (503s, 500s, streams that wait
// for the test, PD roles that fail on cue). What needs real `strata serve`
// processes is in cli/router_e2e_test.cc.
//
// The PD tests here check the router's half of docs/architecture/disagg.md
// (fields added to both bodies, one room, the decode streamed, the prefill's
// error first); fake roles stand in for the prefill and decode servers,
// which are tested with the router once they exist.
#include "router/router.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "server/http_test_client.h"

namespace strata::router {
namespace {

using namespace strata::http_test;
using ::testing::HasSubstr;
using json = nlohmann::json;
using Handler = std::function<void(HttpRequest&, std::shared_ptr<HttpResponder>)>;

// A worker whose generation endpoints run `generate` (default: a JSON answer
// naming the worker).
class FakeWorker {
 public:
  explicit FakeWorker(std::string name, std::string role = "colocated", int bootstrap_port = 0,
                      std::chrono::milliseconds read_timeout = std::chrono::seconds(60))
      : name_(std::move(name)) {
    HttpServerOptions o;
    o.port = 0;
    o.io_threads = 2;
    o.read_timeout = read_timeout;
    server_ = std::move(*HttpServer::Create(o));
    server_->Handle(
        "GET", "/health",
        [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
          res->SendJson(health_status.load(), "{}");
        },
        HttpAuth::kPublic);
    server_->Handle("GET", "/load", [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
      res->SendJson(200, json{{"running", load.load()}, {"queued", 0}}.dump());
    });
    json info = {{"role", role},
                 {"disaggregation_mode", role == "colocated" ? "null" : role},
                 {"instance_id", name_}};
    if (bootstrap_port) info["disaggregation_bootstrap_port"] = bootstrap_port;
    server_->Handle("GET", "/server_info",
                    [info](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
                      res->SendJson(200, info.dump());
                    });
    server_->Handle("GET", "/v1/models", [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
      res->SendJson(200, json{{"object", "list"}, {"data", {{{"id", name_}}}}}.dump());
    });
    for (const char* path : {"/v1/completions", "/v1/chat/completions"})
      server_->Handle("POST", path, [this](HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
        {
          std::lock_guard lock(mu_);
          requests_.push_back(req);
        }
        ++served;
        Handler h;
        {
          std::lock_guard lock(mu_);
          h = generate;
        }
        if (h) return h(req, std::move(res));
        res->SendJson(200, json{{"worker", name_}, {"body", req.body}}.dump());
      });
    EXPECT_TRUE(server_->Start().ok());
  }
  ~FakeWorker() { server_->Stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  void SetGenerate(Handler h) {
    std::lock_guard lock(mu_);
    generate = std::move(h);
  }
  std::vector<HttpRequest> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }
  void Stop() { server_->Stop(); }
  // Keeps a response open (a responder nobody holds is answered 500 or cut).
  void Hold(std::shared_ptr<HttpResponder> res) {
    std::lock_guard lock(mu_);
    held_.push_back(std::move(res));
  }

  std::atomic<int> health_status{200};
  std::atomic<int> load{0};
  std::atomic<int> served{0};

 private:
  std::string name_;
  std::unique_ptr<HttpServer> server_;
  std::mutex mu_;
  Handler generate;
  std::vector<HttpRequest> requests_;
  std::vector<std::shared_ptr<HttpResponder>> held_;
};

RouterOptions FastOptions() {
  RouterOptions o;
  o.http.port = 0;
  o.http.io_threads = 2;
  o.policy.name = "round_robin";
  // Fast, but three checks in a row must fail (a loaded machine may miss one).
  o.health_check_interval = std::chrono::milliseconds(100);
  o.health_check_timeout = std::chrono::milliseconds(100);
  o.health_failure_threshold = 3;
  o.health_success_threshold = 1;
  o.seed = 1;
  return o;
}

std::unique_ptr<Router> StartRouter(RouterOptions o) {
  auto r = Router::Create(std::move(o));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->Start().ok());
  return std::move(*r);
}

Response PostTo(int port, const std::string& path, const std::string& body,
                const std::string& extra = "") {
  Client c(Connect(port));
  EXPECT_TRUE(c.Send(Post(path, body, "Content-Type: application/json\r\n" + extra)));
  auto r = c.Read();
  return r ? *r : Response{};
}

Response GetFrom(int port, const std::string& path) {
  Client c(Connect(port));
  EXPECT_TRUE(c.Send(Get(path)));
  auto r = c.Read();
  return r ? *r : Response{};
}

double Metric(Router& r, const std::string& series) {
  const std::string text = r.registry().Render();
  const size_t pos = text.find("\n" + series + " ");
  if (pos == std::string::npos) return -1;
  return std::stod(text.substr(pos + series.size() + 2, 32));
}

// An SSE answer: `events` data lines, then [DONE].
void Sse(std::shared_ptr<HttpResponder> res, int events) {
  res->StartStream(200, {{"Content-Type", "text/event-stream"}});
  for (int i = 0; i < events; ++i) res->Write("data: {\"i\":" + std::to_string(i) + "}\n\n");
  res->Write("data: [DONE]\n\n");
  res->End();
}

TEST(RouterOptionsTest, ProblemsNameTheFlag) {
  RouterOptions o;
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("--worker"));
  o.workers = {"127.0.0.1:8000"};
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("expected http://HOST:PORT"));
  o.workers = {"http://a:1", "http://a:1/"};
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("given twice"));
  o.workers = {"http://a:1"};
  o.prefills = {"http://p:1"};
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("cannot be combined"));
  o.workers.clear();
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("--decode is missing"));
  o.decodes = {"http://d:1"};
  o.policy.name = "nope";
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("--policy: policy 'nope'"));
  o.policy.name = "cache_aware";
  o.decode_policy = "least_load";
  EXPECT_TRUE(ValidateRouterOptions(o).ok()) << ValidateRouterOptions(o).ToString();
  o.admission = {0, 5};
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("--max-queued-requests needs"));
}

TEST(RouterTest, RelaysAnswersStreamsAndRequestIdsRoundRobin) {
  FakeWorker a("a"), b("b");
  RouterOptions o = FastOptions();
  o.workers = {a.url(), b.url()};
  auto r = StartRouter(o);
  EXPECT_EQ(GetFrom(r->port(), "/health").status, 200);

  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) {
    Response res = PostTo(
        r->port(), "/v1/completions", R"({"prompt":"hi"})",
        "Authorization: Bearer client-key\r\nX-Request-Id: req-" + std::to_string(i) + "\r\n");
    ASSERT_EQ(res.status, 200) << res.body;
    EXPECT_EQ(res.Header("x-request-id"), "req-" + std::to_string(i));
    auto j = json::parse(res.body);
    EXPECT_EQ(j["body"], R"({"prompt":"hi"})") << "colocated bodies go through untouched";
    names.push_back(j["worker"]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "a", "b"}));
  HttpRequest seen = a.requests().at(0);
  EXPECT_EQ(seen.Header("Authorization"), "Bearer client-key");
  EXPECT_EQ(seen.Header("X-Request-Id"), "req-0");
  // No id from the client: the router makes one and sends it both ways.
  Response made = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(made.Header("x-request-id").substr(0, 4), "rtr-");

  a.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) { Sse(res, 3); });
  b.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) { Sse(res, 3); });
  Response s = PostTo(r->port(), "/v1/chat/completions", R"({"stream":true})");
  ASSERT_EQ(s.status, 200);
  EXPECT_TRUE(s.chunked);
  EXPECT_EQ(s.Header("content-type"), "text/event-stream");
  EXPECT_EQ(s.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: [DONE]\n\n");
  // Everything else is relayed too.
  Response models = GetFrom(r->port(), "/v1/models");
  EXPECT_EQ(models.status, 200);
  EXPECT_THAT(models.body, HasSubstr("\"object\":\"list\""));
  EXPECT_GE(Metric(*r, "strata_router_requests_total{worker=\"" + a.url() + "\",outcome=\"ok\"}"),
            3);
}

// The worker writes its first event and then waits until the test has read
// that event through the router: a router that buffered the body would hang
// here (the bound is seconds, the failure minutes).
TEST(RouterTest, StreamsArriveBeforeTheWorkerFinishes) {
  FakeWorker a("a");
  std::mutex mu;
  std::condition_variable cv;
  bool seen_first = false;
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    std::thread([&, res] {
      res->StartStream(200, {{"Content-Type", "text/event-stream"}});
      res->Write("data: first\n\n");
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return seen_first; });
      res->Write(seen_first ? "data: second\n\n" : "data: too-late\n\n");
      res->End();
    }).detach();
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  auto r = StartRouter(o);
  Client c(Connect(r->port(), std::chrono::seconds(20)));
  ASSERT_TRUE(c.Send(Post("/v1/completions", "{}", "Content-Type: application/json\r\n")));
  auto res = c.Read([&](const std::string& chunk) {
    if (chunk.find("first") != std::string::npos) {
      std::lock_guard lock(mu);
      seen_first = true;
      cv.notify_all();
    }
  });
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "data: first\n\ndata: second\n\n");
}

TEST(RouterTest, A503IsRetriedElsewhereAndRelayedWhenEveryWorkerSheds) {
  FakeWorker a("a"), b("b");
  auto shed = [](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->Send(503, {{"Content-Type", "application/json"}, {"Retry-After", "1"}},
              HttpErrorJson("queue full", "overloaded", "max_queued_requests"));
  };
  a.SetGenerate(shed);
  RouterOptions o = FastOptions();
  o.workers = {a.url(), b.url()};
  auto r = StartRouter(o);
  for (int i = 0; i < 4; ++i) {
    Response res = PostTo(r->port(), "/v1/completions", "{}");
    ASSERT_EQ(res.status, 200) << res.body;
    EXPECT_EQ(json::parse(res.body)["worker"], "b");
  }
  EXPECT_GE(Metric(*r, "strata_router_retries_total"), 2);
  b.SetGenerate(shed);
  Response res = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(res.status, 503);
  EXPECT_EQ(res.Header("retry-after"), "1");
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "max_queued_requests");
  // A 503 is shedding, not a broken worker: the breakers stay closed.
  EXPECT_EQ(Metric(*r, "strata_router_breaker_state{worker=\"" + a.url() + "\"}"), 0);
}

TEST(RouterTest, FailuresOpenTheBreakerAndNoRetryAfterTheFirstByte) {
  FakeWorker a("a"), b("b");
  a.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->SendJson(500, HttpErrorJson("boom", "server_error"));
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url(), b.url()};
  o.breaker.failure_threshold = 2;
  o.breaker.open_duration = std::chrono::seconds(60);
  auto r = StartRouter(o);
  int errors = 0;
  for (int i = 0; i < 8; ++i) errors += PostTo(r->port(), "/v1/completions", "{}").status == 500;
  EXPECT_EQ(errors, 2) << "a 500 is relayed (not retryable); two open the breaker";
  EXPECT_EQ(Metric(*r, "strata_router_breaker_state{worker=\"" + a.url() + "\"}"), 2);
  EXPECT_EQ(b.served.load(), 6);

  // A stream that breaks after its first byte is not retried: the client
  // gets what was sent and a final error event.
  b.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->StartStream(200, {{"Content-Type", "text/event-stream"}});
    res->Write("data: {\"i\":0}\n\n");
    // Dropping the responder mid-stream cuts the connection (a moment later,
    // so that the first event is on the wire first).
    std::thread([res]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      res.reset();
    }).detach();
  });
  const int before = b.served.load();
  Response cut = PostTo(r->port(), "/v1/completions", R"({"stream":true})");
  EXPECT_EQ(cut.status, 200);
  EXPECT_THAT(cut.body, HasSubstr("data: {\"i\":0}"));
  EXPECT_THAT(cut.body, HasSubstr("upstream_broken"));
  EXPECT_EQ(b.served.load(), before + 1);
}

TEST(RouterTest, UnreachableWorkersAreRetriedAndMarkedDown) {
  FakeWorker a("a"), b("b");
  RouterOptions o = FastOptions();
  o.workers = {a.url(), b.url()};
  o.health_check_interval = std::chrono::seconds(3600);  // only the startup round
  o.health_check_timeout = std::chrono::milliseconds(500);
  auto r = StartRouter(o);
  a.Stop();  // connection refused from now on, but still "healthy" to the router
  for (int i = 0; i < 4; ++i) {
    Response res = PostTo(r->port(), "/v1/completions", "{}");
    ASSERT_EQ(res.status, 200) << res.body;
    EXPECT_EQ(json::parse(res.body)["worker"], "b");
  }
  EXPECT_GE(Metric(*r, "strata_router_requests_total{worker=\"" + a.url() +
                           "\",outcome=\"unreachable\"}"),
            1);
  b.Stop();
  Response none = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(none.status, 502);
  EXPECT_EQ(json::parse(none.body)["error"]["code"], "upstream_unreachable");
}

TEST(RouterTest, HealthChecksTakeWorkersOutAndBringThemBack) {
  FakeWorker a("a");
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  auto r = StartRouter(o);
  ASSERT_EQ(GetFrom(r->port(), "/health").status, 200);
  a.health_status = 503;
  ASSERT_TRUE(Eventually([&] { return GetFrom(r->port(), "/health").status == 503; }));
  EXPECT_EQ(Metric(*r, "strata_router_worker_healthy{worker=\"" + a.url() + "\"}"), 0);
  Response res = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(res.status, 503);
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "no_healthy_worker");
  EXPECT_EQ(res.Header("retry-after"), "1");
  a.health_status = 200;
  ASSERT_TRUE(Eventually([&] { return GetFrom(r->port(), "/health").status == 200; }));
  EXPECT_EQ(PostTo(r->port(), "/v1/completions", "{}").status, 200);
}

TEST(RouterTest, LeastLoadFollowsTheWorkersReportedLoad) {
  FakeWorker a("a"), b("b");
  a.load = 10;
  RouterOptions o = FastOptions();
  o.policy.name = "least_load";
  o.workers = {a.url(), b.url()};
  auto r = StartRouter(o);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(json::parse(PostTo(r->port(), "/v1/completions", "{}").body)["worker"], "b");
  a.load = 0;
  b.load = 10;
  ASSERT_TRUE(Eventually([&] { return r->Workers()[1].load >= 10; }));
  EXPECT_EQ(json::parse(PostTo(r->port(), "/v1/completions", "{}").body)["worker"], "a");
}

TEST(RouterTest, CacheAwareKeepsAPrefixOnOneWorker) {
  FakeWorker a("a"), b("b");
  RouterOptions o = FastOptions();
  o.policy.name = "cache_aware";
  o.workers = {a.url(), b.url()};
  auto r = StartRouter(o);
  const std::string sys(256, 'S');
  std::set<std::string> for_sys, spread;
  for (int i = 0; i < 6; ++i) {
    json body = {{"prompt", sys + " question " + std::to_string(i)}};
    for_sys.insert(json::parse(PostTo(r->port(), "/v1/completions", body.dump()).body)["worker"]);
  }
  EXPECT_EQ(for_sys.size(), 1u) << "one shared prefix, one worker";
}

TEST(RouterTest, AdmissionQueuesThenShedsWithRetryAfterAndEveryAdmittedOneCompletes) {
  FakeWorker a("a");
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    std::thread([&, res] {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return release; });
      res->SendJson(200, "{\"done\":true}");
    }).detach();
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  o.admission = {2, 2};
  auto r = StartRouter(o);
  std::vector<Response> got(5);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] { got[i] = PostTo(r->port(), "/v1/completions", "{}"); });
  ASSERT_TRUE(Eventually([&] { return Metric(*r, "strata_router_queued_requests") == 2; }));
  EXPECT_EQ(Metric(*r, "strata_router_in_flight_requests"), 2);
  got[4] = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(got[4].status, 503);
  EXPECT_EQ(got[4].Header("retry-after"), "1");
  auto err = json::parse(got[4].body)["error"];
  EXPECT_EQ(err["code"], "max_queued_requests");
  EXPECT_EQ(err["type"], "overloaded");
  {
    std::lock_guard lock(mu);
    release = true;
    cv.notify_all();
  }
  for (auto& t : ts) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i].status, 200) << i << got[i].body;
  EXPECT_EQ(a.served.load(), 4);
  EXPECT_EQ(Metric(*r, "strata_router_rejected_requests_total{reason=\"max_queued_requests\"}"), 1);
  EXPECT_TRUE(Eventually([&] { return Metric(*r, "strata_router_in_flight_requests") == 0; }));
}

TEST(RouterTest, AQueuedRequestPastItsQueueTimeGets503) {
  FakeWorker a("a");
  std::atomic<bool> release{false};
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    std::thread([&, res] {
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      res->SendJson(200, "{}");
    }).detach();
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  o.admission = {1, 4};
  o.max_queue_time = std::chrono::milliseconds(200);
  auto r = StartRouter(o);
  std::thread first([&] { PostTo(r->port(), "/v1/completions", "{}"); });
  ASSERT_TRUE(Eventually([&] { return Metric(*r, "strata_router_in_flight_requests") == 1; }));
  Response late = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(late.status, 503);
  EXPECT_EQ(json::parse(late.body)["error"]["code"], "max_queue_time");
  release = true;
  first.join();
}

TEST(RouterTest, ClientDisconnectClosesTheUpstreamRequestAtOnce) {
  FakeWorker a("a");
  std::atomic<int> closed{0};
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->OnClose([&] { ++closed; });
    res->StartStream(200, {{"Content-Type", "text/event-stream"}});
    res->Write("data: start\n\n");  // and never more: only a disconnect ends it
    a.Hold(res);
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  auto r = StartRouter(o);
  {
    Client c(Connect(r->port()));
    ASSERT_TRUE(c.Send(Post("/v1/completions", "{}", "Content-Type: application/json\r\n")));
    char buf[1024];
    ASSERT_GT(::recv(c.fd(), buf, sizeof buf, 0), 0);
  }
  EXPECT_TRUE(Eventually([&] { return closed.load() == 1; }, std::chrono::seconds(3)));
  EXPECT_TRUE(Eventually([&] {
    return Metric(*r, "strata_router_requests_total{worker=\"" + a.url() +
                          "\",outcome=\"aborted\"}") == 1;
  }));
  EXPECT_TRUE(Eventually([&] { return r->in_flight() == 0; }));  // the slot is freed just after
}

TEST(RouterTest, AQueuedClientThatLeavesGivesItsPlaceUp) {
  FakeWorker a("a");
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) { a.Hold(res); });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  o.admission = {1, 1};
  auto r = StartRouter(o);
  Client first(Connect(r->port()));
  ASSERT_TRUE(first.Send(Post("/v1/completions", "{}", "Content-Type: application/json\r\n")));
  ASSERT_TRUE(Eventually([&] { return a.served.load() == 1; }));
  {
    Client queued(Connect(r->port()));
    ASSERT_TRUE(queued.Send(Post("/v1/completions", "{}", "Content-Type: application/json\r\n")));
    ASSERT_TRUE(Eventually([&] { return Metric(*r, "strata_router_queued_requests") == 1; }));
  }
  EXPECT_TRUE(Eventually([&] { return Metric(*r, "strata_router_queued_requests") == 0; }));
  first.Close();
  EXPECT_TRUE(Eventually([&] { return r->in_flight() == 0; }));
  EXPECT_EQ(a.served.load(), 1) << "the one that left never reached the worker";
}

TEST(RouterTest, TheApiKeyIsTheRoutersAndTheClientsHeaderGoesOn) {
  FakeWorker a("a");
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  o.api_key = "router-key";
  auto r = StartRouter(o);
  Response no = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(no.status, 401);
  EXPECT_EQ(json::parse(no.body)["error"]["type"], "authentication_error");
  EXPECT_EQ(a.served.load(), 0);
  EXPECT_EQ(GetFrom(r->port(), "/health").status, 200) << "health needs no key";
  EXPECT_EQ(GetFrom(r->port(), "/metrics").status, 200) << "nor metrics";
  Response yes = PostTo(r->port(), "/v1/completions", "{}", "Authorization: Bearer router-key\r\n");
  EXPECT_EQ(yes.status, 200);
  EXPECT_EQ(a.requests().at(0).Header("Authorization"), "Bearer router-key");
}

// A kept-alive connection the worker closed while it sat in the pool is
// replaced without the request noticing (no retry, no error).
TEST(RouterTest, APooledConnectionTheWorkerClosedIsReplacedTransparently) {
  FakeWorker a("a", "colocated", 0, std::chrono::milliseconds(100));
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  o.health_check_interval = std::chrono::seconds(3600);
  o.health_check_timeout = std::chrono::milliseconds(500);
  auto r = StartRouter(o);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(PostTo(r->port(), "/v1/completions", "{}").status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the worker closes it
  }
  EXPECT_EQ(a.served.load(), 3);
  EXPECT_EQ(Metric(*r, "strata_router_retries_total"), 0);
  EXPECT_EQ(Metric(*r, "strata_router_requests_total{worker=\"" + a.url() + "\",outcome=\"ok\"}"),
            3);
}

TEST(RouterTest, AWorkerThatNeverAnswersTimesOutWith504) {
  FakeWorker a("a");
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) { a.Hold(res); });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  o.request_timeout = std::chrono::milliseconds(300);
  auto r = StartRouter(o);
  Response res = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(res.status, 504);
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "upstream_timeout");
  EXPECT_EQ(
      Metric(*r, "strata_router_requests_total{worker=\"" + a.url() + "\",outcome=\"timeout\"}"),
      1);
}

// A non-streamed answer too big to hold (over 4 MiB) streams through intact.
TEST(RouterTest, ALargeAnswerStreamsThroughIntact) {
  FakeWorker a("a");
  std::string big(6 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + (i / 4096) % 26);
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->Send(200, {{"Content-Type", "application/json"}}, big);
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  auto r = StartRouter(o);
  Response res = PostTo(r->port(), "/v1/completions", "{}");
  EXPECT_EQ(res.status, 200);
  EXPECT_TRUE(res.chunked);
  EXPECT_EQ(res.body.size(), big.size());
  EXPECT_TRUE(res.body == big);
}

// openai-node closes its connection as soon as it reads `data: [DONE]`,
// often before the worker's end of the chunked body reached the router: that
// request was answered in full, so it counts as ok, not aborted.
TEST(RouterTest, AClientThatLeavesAfterTheLastEventCountsAsOk) {
  FakeWorker a("a");
  a.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->StartStream(200, {{"Content-Type", "text/event-stream"}});
    res->Write("data: {\"i\":0}\n\ndata: [DONE]\n\n");
    a.Hold(res);  // the stream's end is "late"
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url()};
  auto r = StartRouter(o);
  {
    Client c(Connect(r->port()));
    ASSERT_TRUE(c.Send(Post("/v1/completions", "{}", "Content-Type: application/json\r\n")));
    std::string got;
    char buf[4096];
    while (got.find("data: [DONE]") == std::string::npos) {
      const ssize_t n = ::recv(c.fd(), buf, sizeof buf, 0);
      ASSERT_GT(n, 0);
      got.append(buf, static_cast<size_t>(n));
    }
  }
  const std::string series = "strata_router_requests_total{worker=\"" + a.url() + "\",outcome=";
  EXPECT_TRUE(Eventually([&] { return r->in_flight() == 0; }));
  EXPECT_EQ(Metric(*r, series + "\"ok\"}"), 1);
  EXPECT_EQ(Metric(*r, series + "\"aborted\"}"), -1) << "never counted";
}

// A worker that stops answering (SIGSTOP, a hang) fails its health checks;
// its open requests then fail over at once instead of waiting for the
// request timeout: retried elsewhere before any byte reached the client, an
// error event for a stream in progress.
TEST(RouterTest, RequestsOnAWorkerThatFailsItsHealthChecksFailOver) {
  FakeWorker a("a"), b("b");
  a.SetGenerate([&](HttpRequest& req, std::shared_ptr<HttpResponder> res) {
    if (req.body.find("stream") != std::string::npos) {
      res->StartStream(200, {{"Content-Type", "text/event-stream"}});
      res->Write("data: {\"i\":0}\n\n");
    }
    a.Hold(res);  // and then nothing: stalled
  });
  RouterOptions o = FastOptions();
  o.workers = {a.url(), b.url()};
  o.request_timeout = std::chrono::seconds(60);
  auto r = StartRouter(o);
  std::thread stall([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    a.health_status = 503;
  });
  const auto t0 = std::chrono::steady_clock::now();
  Response whole, stream;
  std::thread t1([&] { whole = PostTo(r->port(), "/v1/completions", "{}"); });  // a (round robin)
  ASSERT_TRUE(Eventually([&] { return a.served.load() == 1; }));
  PostTo(r->port(), "/v1/completions", "{}");  // b
  std::thread t2([&] { stream = PostTo(r->port(), "/v1/completions", R"({"stream":true})"); });
  t1.join();
  t2.join();
  stall.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "not the timeout";
  EXPECT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(json::parse(whole.body)["worker"], "b") << "failed over to b";
  EXPECT_EQ(stream.status, 200);
  EXPECT_THAT(stream.body, HasSubstr("data: {\"i\":0}"));
  EXPECT_THAT(stream.body, HasSubstr("stopped passing its health checks"));
  EXPECT_EQ(r->Workers()[0].in_flight, 0);
}

// ---- PD ---------------------------------------------------------------------

TEST(RouterPdTest, BothRolesGetTheFieldsAndTheDecodeIsStreamed) {
  FakeWorker p("p", "prefill", 18998), d("d", "decode");
  p.SetGenerate([](HttpRequest& req, std::shared_ptr<HttpResponder> res) {
    const auto j = json::parse(req.body);
    res->SendJson(200, json{{"bootstrap_room", j["bootstrap_room"]}, {"status", "ok"}}.dump());
  });
  d.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) { Sse(res, 2); });
  RouterOptions o = FastOptions();
  o.prefills = {p.url()};
  o.decodes = {d.url()};
  auto r = StartRouter(o);
  ASSERT_EQ(GetFrom(r->port(), "/health").status, 200);
  EXPECT_EQ(r->Workers()[0].bootstrap_port, 18998);
  Response s = PostTo(r->port(), "/v1/completions", R"({"model":"m","prompt":"hi","stream":true})",
                      "X-Request-Id: pd-1\r\n");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n");
  ASSERT_TRUE(Eventually([&] { return p.requests().size() == 1 && d.requests().size() == 1; }));
  const json pb = json::parse(p.requests()[0].body), db = json::parse(d.requests()[0].body);
  EXPECT_EQ(pb, db) << "the same body to both roles";
  EXPECT_EQ(pb["bootstrap_host"], "127.0.0.1");
  EXPECT_EQ(pb["bootstrap_port"], 18998);
  EXPECT_LT(pb["bootstrap_room"].get<uint64_t>(), uint64_t{1} << 53);
  EXPECT_EQ(pb["prompt"], "hi");
  EXPECT_EQ(p.requests()[0].Header("X-Request-Id"), "pd-1");
  EXPECT_EQ(d.requests()[0].Header("X-Request-Id"), "pd-1");
  // Rooms differ per request.
  PostTo(r->port(), "/v1/completions", R"({"prompt":"again"})");
  ASSERT_TRUE(Eventually([&] { return p.requests().size() == 2; }));
  EXPECT_NE(json::parse(p.requests()[1].body)["bootstrap_room"], pb["bootstrap_room"]);
  // A body that is not JSON cannot carry the fields.
  EXPECT_EQ(PostTo(r->port(), "/v1/completions", "{nope").status, 400);
}

TEST(RouterPdTest, APrefillErrorBeforeTheDecodesFirstByteIsTheAnswerAndClosesTheDecode) {
  FakeWorker p("p", "prefill", 18998), d("d", "decode");
  std::atomic<int> decode_closed{0};
  p.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->SendJson(400, HttpErrorJson("prompt too long for the prefill", "invalid_request_error",
                                     "context_length_exceeded"));
  });
  d.SetGenerate([&](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->OnClose([&] { ++decode_closed; });  // waits for KV that never comes
    d.Hold(res);
  });
  RouterOptions o = FastOptions();
  o.prefills = {p.url()};
  o.decodes = {d.url()};
  auto r = StartRouter(o);
  Response res = PostTo(r->port(), "/v1/completions", R"({"prompt":"x","stream":true})");
  EXPECT_EQ(res.status, 400);
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "context_length_exceeded");
  EXPECT_TRUE(Eventually([&] { return decode_closed.load() == 1; }, std::chrono::seconds(3)));
}

TEST(RouterPdTest, APrefillThatShedsIsRetriedOnAnotherPair) {
  FakeWorker p1("p1", "prefill", 18001), p2("p2", "prefill", 18002), d("d", "decode");
  std::atomic<int> decode_closed{0};
  p1.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->Send(503, {{"Content-Type", "application/json"}, {"Retry-After", "1"}},
              HttpErrorJson("prefill queue full", "overloaded", "max_queued_requests"));
  });
  p2.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->SendJson(200, R"({"status":"ok"})");
  });
  std::atomic<int> decodes{0};
  d.SetGenerate([&](HttpRequest& req, std::shared_ptr<HttpResponder> res) {
    if (decodes++ == 0) {  // the first pair's decode waits for the KV of p1
      res->OnClose([&] { ++decode_closed; });
      d.Hold(res);
      return;
    }
    const auto j = json::parse(req.body);
    res->SendJson(200, json{{"port", j["bootstrap_port"]}}.dump());
  });
  RouterOptions o = FastOptions();
  o.prefills = {p1.url(), p2.url()};
  o.decodes = {d.url()};
  auto r = StartRouter(o);
  Response res = PostTo(r->port(), "/v1/completions", R"({"prompt":"x"})");
  ASSERT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(json::parse(res.body)["port"], 18002);
  EXPECT_TRUE(Eventually([&] { return decode_closed.load() == 1; }, std::chrono::seconds(3)));
  EXPECT_EQ(Metric(*r, "strata_router_retries_total"), 1);
}

TEST(RouterPdTest, ADecodeErrorWaitsBrieflyForThePrefillsAnswer) {
  FakeWorker p("p", "prefill", 18998), d("d", "decode");
  p.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    std::thread([res] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      res->SendJson(502, HttpErrorJson("transfer failed: peer_lost", "server_error", "peer_lost"));
    }).detach();
  });
  d.SetGenerate([](HttpRequest&, std::shared_ptr<HttpResponder> res) {
    res->SendJson(502, HttpErrorJson("the prefill reported a failure", "server_error", "rejected"));
  });
  RouterOptions o = FastOptions();
  o.prefills = {p.url()};
  o.decodes = {d.url()};
  auto r = StartRouter(o);
  Response res = PostTo(r->port(), "/v1/completions", R"({"prompt":"x"})");
  EXPECT_EQ(res.status, 502);
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "peer_lost") << "the prefill's answer names it";
  // Without a prefill without a bootstrap port the pair is not usable.
  FakeWorker np("np", "colocated"), nd("nd", "decode");
  RouterOptions o2 = FastOptions();
  o2.prefills = {np.url()};
  o2.decodes = {nd.url()};
  auto r2 = StartRouter(o2);
  EXPECT_EQ(GetFrom(r2->port(), "/health").status, 503);
  EXPECT_EQ(PostTo(r2->port(), "/v1/completions", "{}").status, 503);
}

}  // namespace
}  // namespace strata::router

// OpenAiServer in-process (the tiny llama_default fixture on the CPU
// backend, real sockets): AbortInFlight ends streams with a final SSE error
// event and a clean end, answers unstarted responses 503 and cancels the
// engine's work; Create accepts an already bound HttpServer.
#include "server/openai_server.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_test_client.h"

namespace strata {
namespace {

using namespace strata::http_test;
using json = nlohmann::json;

struct Stack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<metrics::Registry> registry;
  std::unique_ptr<AsyncEngine> engine;
  std::unique_ptr<OpenAiServer> server;
};

Stack Make(std::unique_ptr<HttpServer> http = nullptr) {
  Stack s;
  CpuBackendOptions bo;
  bo.num_threads = 1;
  s.backend = std::move(*CreateCpuBackend(bo));
  LoadOptions lo;
  lo.model.max_batch_tokens = 128 + 4;
  s.model = std::move(*LoadModelDir(
      std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default", *s.backend, lo));
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 8192;
  eo.max_running_requests = 4;
  eo.chunked_prefill_size = 128;
  auto e = Engine::Create(*s.model, *s.backend, eo);
  EXPECT_TRUE(e.ok());
  s.registry = std::move(*metrics::Registry::Create({{"model", "m"}, {"role", "colocated"}}));
  s.engine = std::move(*AsyncEngine::Start(std::move(*e), {}, s.registry.get()));
  ServerOptions so;
  so.served_model_name = "m";
  so.http.port = 0;
  auto server = OpenAiServer::Create(*s.model, *s.engine, *s.registry, so, std::move(http));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  s.server = std::move(*server);
  EXPECT_TRUE(s.server->Start().ok());
  return s;
}

TEST(OpenAiServerTest, AbortInFlightEndsStreamsWithAnErrorEventAndOthersWith503) {
  Stack s = Make();
  const std::string body_stream = json{
      {"prompt", "abort me"},
      {"max_tokens", 1500},
      {"ignore_eos", true},
      {"stream", true}}.dump();
  const std::string body_plain =
      json{{"prompt", "abort me too"}, {"max_tokens", 1500}, {"ignore_eos", true}}.dump();
  Client stream(Connect(s.server->port(), std::chrono::seconds(30)));
  Client plain(Connect(s.server->port(), std::chrono::seconds(30)));
  ASSERT_TRUE(
      stream.Send(Post("/v1/completions", body_stream, "Content-Type: application/json\r\n")));
  ASSERT_TRUE(
      plain.Send(Post("/v1/completions", body_plain, "Content-Type: application/json\r\n")));
  std::atomic<int> chunks{0};
  std::optional<Response> streamed;
  std::thread reader([&] { streamed = stream.Read([&](const std::string&) { chunks++; }); });
  ASSERT_TRUE(Eventually([&] { return chunks.load() > 2 && s.server->in_flight() == 2; },
                         std::chrono::seconds(20)));

  s.server->AbortInFlight("test says stop");
  reader.join();
  ASSERT_TRUE(streamed.has_value()) << "the stream did not end cleanly (terminating chunk)";
  EXPECT_EQ(streamed->status, 200);
  const std::string& sse = streamed->body;
  const size_t err = sse.find("data: {\"error\":");
  ASSERT_NE(err, std::string::npos) << sse.substr(sse.size() > 2000 ? sse.size() - 2000 : 0);
  const size_t eol = sse.find('\n', err);
  json ev = json::parse(sse.substr(err + 6, eol - err - 6));
  EXPECT_EQ(ev["error"]["code"], "request_aborted");
  EXPECT_NE(ev["error"]["message"].get<std::string>().find("test says stop"), std::string::npos);
  EXPECT_NE(sse.find("data: [DONE]", err), std::string::npos);

  auto p = plain.Read();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->status, 503);
  EXPECT_EQ(json::parse(p->body)["error"]["code"], "request_aborted");

  // The engine's work is cancelled, nothing is left in flight, and later
  // requests are refused the same way.
  EXPECT_EQ(s.server->in_flight(), 0);
  EXPECT_TRUE(s.engine->WaitIdle(std::chrono::seconds(5)));
  EXPECT_EQ(s.engine->snapshot().pages_active, 0);
  Client late(Connect(s.server->port(), std::chrono::seconds(10)));
  late.Send(Post("/v1/completions", R"({"prompt":"late","max_tokens":2})",
                 "Content-Type: application/json\r\n"));
  auto l = late.Read();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->status, 503);
  const std::string metrics = s.registry->Render();
  EXPECT_NE(
      metrics.find("strata_requests_total{model=\"m\",role=\"colocated\",outcome=\"aborted\"} 3"),
      std::string::npos)
      << metrics;
  s.server->AbortInFlight("again");  // idempotent
  s.server->Stop();
}

TEST(OpenAiServerTest, CreateTakesAnAlreadyBoundTransport) {
  HttpServerOptions ho;
  ho.port = 0;
  auto http = HttpServer::Create(ho);
  ASSERT_TRUE(http.ok());
  const int port = (*http)->port();
  Stack s = Make(std::move(*http));
  EXPECT_EQ(s.server->port(), port);
  Client c(Connect(port));
  c.Send(Get("/v1/models"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["data"][0]["max_model_len"], 2048);
}

}  // namespace
}  // namespace strata

// HttpServer against a real client on loopback (http_test_client.h: plain
// POSIX sockets, independent of Beast): keep-alive, bodies, 100-continue,
// streaming from other threads, disconnects, limits, malformed input,
// routing errors, timeouts, draining and stopping.
#include "server/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "server/http_test_client.h"

namespace strata {
namespace {

using http_test::Client;
using http_test::Eventually;
using http_test::Get;
using http_test::Post;

class HttpServerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_) server_->Stop();
    for (auto& t : threads_) t.join();
  }

  // Creates and starts a server with the routes every test uses; `extra`
  // may add more before Start().
  void StartServer(HttpServerOptions options = {},
                   const std::function<void(HttpServer&)>& extra = {}) {
    options.port = 0;
    auto server = HttpServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    server_->Handle("GET", "/hello", [this](HttpRequest&& req, std::shared_ptr<HttpResponder> r) {
      int n = ++hello_count_;
      r->Send(200, {{"Content-Type", "text/plain"}},
              "hello " + std::to_string(n) + " " + req.path + "?" + req.query);
    });
    server_->Handle("POST", "/echo", [](HttpRequest&& req, std::shared_ptr<HttpResponder> r) {
      r->Send(200, {{"X-Test", std::string(req.Header("x-TEST"))}}, req.body);
    });
    // 100 chunks written from another thread, with small delays.
    server_->Handle("GET", "/stream", [this](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->StartStream(200, {});
      std::lock_guard<std::mutex> lock(mu_);
      threads_.emplace_back([r] {
        for (int i = 0; i < 100; ++i) {
          r->Write("data: " + std::to_string(i) + "\n\n");
          if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        r->End();
      });
    });
    // Holds the responder (as the engine would) and counts OnClose calls.
    server_->Handle("GET", "/hold", [this](HttpRequest&& req, std::shared_ptr<HttpResponder> r) {
      if (req.query == "stream") {
        r->StartStream(200, {});
        r->Write("data: first\n\n");
      }
      r->OnClose([this] {
        ++closes_;
        closed_promise_.set_value();
      });
      std::lock_guard<std::mutex> lock(mu_);
      held_ = std::move(r);
    });
    if (extra) extra(*server_);
    ASSERT_TRUE(server_->Start().ok());
  }

  std::shared_ptr<HttpResponder> Held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }

  int port() const { return server_->port(); }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> hello_count_{0};
  std::atomic<int> closes_{0};
  std::promise<void> closed_promise_;
  std::mutex mu_;
  std::shared_ptr<HttpResponder> held_;
  std::vector<std::thread> threads_;
};

TEST_F(HttpServerTest, KeepAliveServesThreeRequestsOnOneConnection) {
  StartServer();
  Client c(port(), true);
  ASSERT_TRUE(c.ok());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(c.Send(Get("/hello?x=" + std::to_string(i))));
    auto r = c.Read();
    ASSERT_TRUE(r) << "request " << i;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "hello " + std::to_string(i) + " /hello?x=" + std::to_string(i));
    EXPECT_EQ(r->Header("content-type"), "text/plain");
    EXPECT_EQ(r->Header("connection"), "");  // HTTP/1.1: keep-alive by default
  }
  EXPECT_EQ(server_->active_connections(), 1);
  c.Close();
  EXPECT_TRUE(Eventually([&] { return server_->active_connections() == 0; }));
}

TEST_F(HttpServerTest, ConnectionCloseAndHttp10) {
  StartServer();
  {
    Client c(port(), true);
    ASSERT_TRUE(c.Send(Get("/hello", "Connection: close\r\n")));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->Header("connection"), "close");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    Client c(port(), true);
    ASSERT_TRUE(c.Send("GET /hello HTTP/1.0\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_TRUE(c.WaitClosed());
  }
}

TEST_F(HttpServerTest, RequestBodiesContentLengthChunkedAndExpectContinue) {
  StartServer();
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Post("/echo", "{\"prompt\":\"hi\"}", "X-Test: yes\r\n")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{\"prompt\":\"hi\"}");
  EXPECT_EQ(r->Header("x-test"), "yes");

  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
             "4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "Wikipedia");

  // The client waits for 100 Continue before sending its body.
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
             "Expect: 100-continue\r\n\r\n"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 100);
  ASSERT_TRUE(c.Send("abcde"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "abcde");
}

TEST_F(HttpServerTest, StreamsHundredChunksFromAnotherThreadThenKeepsAlive) {
  StartServer();
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/stream")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->chunked);
  EXPECT_EQ(r->Header("content-type"), "text/event-stream");
  EXPECT_EQ(r->Header("cache-control"), "no-cache");
  ASSERT_EQ(r->chunks.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(r->chunks[i], "data: " + std::to_string(i) + "\n\n");
  }
  EXPECT_TRUE(Eventually([&] { return server_->in_flight_requests() == 0; }));
  ASSERT_TRUE(c.Send(Get("/hello")));  // the same connection serves on
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, DisconnectMidStreamFiresOnCloseOnce) {
  StartServer();
  auto closed = closed_promise_.get_future();
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/hold?stream")));
  std::string first;
  // Read the headers and the first chunk by hand: the stream never ends.
  char buf[4096];
  while (first.find("data: first") == std::string::npos) {
    ssize_t n = ::recv(c.fd(), buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    first.append(buf, n);
  }
  EXPECT_EQ(server_->in_flight_requests(), 1);
  auto r = Held();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->closed());
  c.Close();
  ASSERT_EQ(closed.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(r->closed());
  r->Write("data: nobody reads this\n\n");  // no-ops now
  r->End();
  EXPECT_EQ(closes_.load(), 1);
  bool late = false;
  r->OnClose([&] { late = true; });  // already closed: runs at once
  EXPECT_TRUE(late);
  EXPECT_EQ(closes_.load(), 1);
  EXPECT_EQ(server_->in_flight_requests(), 0);
  EXPECT_TRUE(Eventually([&] { return server_->active_connections() == 0; }));
}

TEST_F(HttpServerTest, DisconnectBeforeAnyResponseFiresOnClose) {
  StartServer();
  auto closed = closed_promise_.get_future();
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/hold")));
  ASSERT_TRUE(Eventually([&] { return Held() != nullptr; }));
  c.Close();
  ASSERT_EQ(closed.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(Held()->closed());
  Held()->Send(200, {}, "too late");
  EXPECT_EQ(closes_.load(), 1);
}

TEST_F(HttpServerTest, OnCloseDoesNotFireAfterTheResponseCompleted) {
  std::atomic<int> fired{0};
  StartServer({}, [&](HttpServer& s) {
    s.Handle("GET", "/done", [&](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->OnClose([&] { ++fired; });
      r->Send(200, {}, "ok");
    });
  });
  {
    Client c(port(), true);
    ASSERT_TRUE(c.Send(Get("/done")));
    ASSERT_TRUE(c.Read());
  }
  EXPECT_TRUE(Eventually([&] { return server_->active_connections() == 0; }));
  EXPECT_EQ(fired.load(), 0);
}

TEST_F(HttpServerTest, BodyOverTheLimitGets413JsonAndClose) {
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  StartServer(options);
  const std::string expected =
      R"({"error":{"message":"request body is larger than the 1024-byte limit",)"
      R"("type":"invalid_request_error","param":null,"code":null}})";
  {  // Content-Length over the limit: answered before the body is read.
    Client c(port(), true);
    ASSERT_TRUE(c.Send(Post("/echo", std::string(2000, 'x'))));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(r->Header("content-type"), "application/json");
    EXPECT_EQ(r->Header("connection"), "close");
    EXPECT_EQ(r->body, expected);
    EXPECT_TRUE(c.WaitClosed());
  }
  {  // A chunked body that grows past the limit.
    Client c(port(), true);
    std::string req = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 5; ++i) req += "190\r\n" + std::string(400, 'y') + "\r\n";
    ASSERT_TRUE(c.Send(req));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(r->body, expected);
    EXPECT_TRUE(c.WaitClosed());
  }
  {  // Expect: 100-continue over the limit: 413 at once, no 100.
    Client c(port(), true);
    ASSERT_TRUE(
        c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n"
               "Expect: 100-continue\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
  }
  {  // At the limit is fine.
    Client c(port(), true);
    ASSERT_TRUE(c.Send(Post("/echo", std::string(1024, 'z'))));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.size(), 1024u);
  }
}

TEST_F(HttpServerTest, MalformedRequestsGet400AndTheServerServesOn) {
  HttpServerOptions options;
  options.max_header_bytes = 2048;
  StartServer(options);
  const std::vector<std::string> bad = {
      "GARBAGE\r\n\r\n",
      "GET /hello HTTP/1.1\r\nNoColonHere\r\n\r\n",
      "GET /hello HTTP/9.9\r\n\r\n",
      "GET /hello HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
      "GET  /hello  HTTP/1.1\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n",
      std::string("\x00\x01\x02\xff\xfe GET\r\n\r\n", 12),
      "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  // a TLS ClientHello
  };
  for (const auto& req : bad) {
    Client c(port(), true);
    ASSERT_TRUE(c.Send(req));
    auto r = c.Read();
    ASSERT_TRUE(r) << testing::PrintToString(req);
    EXPECT_EQ(r->status, 400) << testing::PrintToString(req);
    EXPECT_NE(r->body.find("malformed HTTP request"), std::string::npos) << r->body;
    EXPECT_TRUE(c.WaitClosed());
  }
  {  // Headers over the limit.
    Client c(port(), true);
    ASSERT_TRUE(c.Send(Get("/hello", "X-Big: " + std::string(4000, 'a') + "\r\n")));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 431);
    EXPECT_TRUE(c.WaitClosed());
  }
  {  // An endless header line without CRLF.
    Client c(port(), true);
    ASSERT_TRUE(c.Send("GET /hello HTTP/1.1\r\nX: " + std::string(5000, 'b')));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 431);
  }
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/hello")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, UnknownPath404AndWrongMethod405KeepTheConnection) {
  StartServer();
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/v1/nope")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->body,
            R"j({"error":{"message":"Invalid URL (GET /v1/nope)","type":"invalid_request_error",)j"
            R"j("param":null,"code":null}})j");
  ASSERT_TRUE(c.Send(Post("/hello", "x")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->Header("allow"), "GET");
  EXPECT_NE(r->body.find("\"type\":\"invalid_request_error\""), std::string::npos);
  ASSERT_TRUE(c.Send(Get("/hello")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // A HEAD answer carries the headers only.
  c.set_head_request(true);
  ASSERT_TRUE(c.Send("HEAD /nope HTTP/1.1\r\nHost: t\r\n\r\n"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  c.set_head_request(false);
  ASSERT_TRUE(c.Send(Get("/hello")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, FallbackGetsUnroutedPaths) {
  StartServer({}, [](HttpServer& s) {
    s.SetFallback([](HttpRequest&& req, std::shared_ptr<HttpResponder> r) {
      r->SendJson(299, "{\"path\":\"" + req.path + "\"}");
    });
  });
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/anything?q=1")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 299);
  EXPECT_EQ(r->body, "{\"path\":\"/anything\"}");
}

TEST_F(HttpServerTest, HandlerThatThrowsOrDropsTheResponderGets500) {
  StartServer({}, [](HttpServer& s) {
    s.Handle("GET", "/throw", [](HttpRequest&&, std::shared_ptr<HttpResponder>) {
      throw std::runtime_error("boom");
    });
    s.Handle("GET", "/drop", [](HttpRequest&&, std::shared_ptr<HttpResponder>) {});
    s.Handle("GET", "/drop-stream", [](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->StartStream(200, {});
      r->Write("x");
    });
  });
  Client c(port(), true);
  for (const char* path : {"/throw", "/drop"}) {
    ASSERT_TRUE(c.Send(Get(path)));
    auto r = c.Read();
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 500) << path;
    EXPECT_NE(r->body.find("server_error"), std::string::npos);
  }
  ASSERT_TRUE(c.Send(Get("/drop-stream")));
  EXPECT_FALSE(c.Read());  // truncated: the connection closes mid-stream
  EXPECT_TRUE(Eventually([&] { return server_->in_flight_requests() == 0; }));
}

TEST_F(HttpServerTest, ResponseHeadersCannotBeInjected) {
  StartServer({}, [](HttpServer& s) {
    s.Handle("GET", "/inject", [](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->Send(200, {{"X-Ok", "1"}, {"X-Bad", "a\r\nSet-Cookie: evil"}, {"Content-Length", "99"}},
              "body");
    });
  });
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/inject")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->Header("x-ok"), "1");
  EXPECT_EQ(r->Header("x-bad"), "");
  EXPECT_EQ(r->Header("set-cookie"), "");
  EXPECT_EQ(r->body, "body");
}

TEST_F(HttpServerTest, SlowAndIdleClientsTimeOut) {
  HttpServerOptions options;
  options.read_timeout = std::chrono::milliseconds(200);
  StartServer(options);
  {  // Slowloris: a request that never finishes gets 408 and a close.
    Client c(port(), true);
    ASSERT_TRUE(c.Send("GET /hello HTTP/1.1\r\nHost: t\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 408);
    EXPECT_TRUE(c.WaitClosed());
  }
  {  // Idle after a request: closed quietly.
    Client c(port(), true);
    ASSERT_TRUE(c.Send(Get("/hello")));
    ASSERT_TRUE(c.Read());
    EXPECT_TRUE(c.WaitClosed());
  }
  EXPECT_TRUE(Eventually([&] { return server_->active_connections() == 0; }));
}

TEST_F(HttpServerTest, StopAcceptingRefusesNewConnectionsAndFinishesInFlight) {
  std::shared_ptr<HttpResponder> held;
  std::mutex mu;
  StartServer({}, [&](HttpServer& s) {
    s.Handle("GET", "/slow", [&](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->StartStream(200, {});
      std::lock_guard<std::mutex> lock(mu);
      held = std::move(r);
    });
  });
  Client streaming(port(), true);
  Client idle(port(), true);
  ASSERT_TRUE(idle.Send(Get("/hello")));
  ASSERT_TRUE(idle.Read());
  ASSERT_TRUE(streaming.Send(Get("/slow")));
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return held != nullptr;
  }));
  server_->StopAccepting();
  EXPECT_EQ(http_test::Connect(port()), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  EXPECT_TRUE(idle.WaitClosed());  // idle kept-alive connections are closed
  EXPECT_EQ(server_->in_flight_requests(), 1);
  held->Write("data: still here\n\n");
  held->End();
  auto r = streaming.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "data: still here\n\n");
  EXPECT_TRUE(streaming.WaitClosed());  // draining: closed after its response
  streaming.Close();
  idle.Close();
  EXPECT_TRUE(Eventually([&] { return server_->in_flight_requests() == 0; }));
  EXPECT_TRUE(Eventually([&] { return server_->active_connections() == 0; }));
}

TEST_F(HttpServerTest, StopClosesStreamsAndFiresOnClose) {
  StartServer();
  auto closed = closed_promise_.get_future();
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/hold?stream")));
  ASSERT_TRUE(Eventually([&] { return Held() != nullptr; }));
  server_->Stop();
  ASSERT_EQ(closed.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(closes_.load(), 1);
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_EQ(server_->active_connections(), 0);
  Held()->Write("after stop");  // harmless
  Held()->End();
}

// A response given in full before Stop() (the engine finished) still reaches a
// client that reads slowly: 8 MB does not fit the socket buffers.
TEST_F(HttpServerTest, StopLetsCompleteResponsesFinishWriting) {
  const std::string big(8 << 20, 'b');
  std::atomic<bool> sent{false};
  StartServer({}, [&](HttpServer& s) {
    s.Handle("GET", "/big", [&](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->StartStream(200, {{"Content-Type", "text/plain"}});
      r->Write(big);
      r->End();
      sent = true;
    });
  });
  Client c(port(), true);
  ASSERT_TRUE(c.Send(Get("/big")));
  ASSERT_TRUE(Eventually([&] { return sent.load(); }));
  std::thread stopper([&] { server_->Stop(); });
  auto r = c.Read();
  stopper.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body.size(), big.size());
  EXPECT_TRUE(c.WaitClosed());
}

// ---- API key at header time ------------------------------------------------

constexpr char kMissingKey[] =
    R"({"error":{"message":"missing API key: send the header 'Authorization: Bearer <key>'",)"
    R"("type":"authentication_error","param":null,"code":"invalid_api_key"}})";

// The head of a 30 MB POST goes out alone: the 401 must come back before any
// body byte is sent (the old check ran in the handler, after the whole body).
TEST_F(HttpServerTest, ApiKeyIsCheckedWhenTheHeadArrivesBeforeAnyBodyByte) {
  HttpServerOptions options;
  options.api_key = "sk-test";
  StartServer(options);
  Client c(port(), true);
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 30000000\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r) << "no answer before the body was sent";
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->Header("www-authenticate"), "Bearer");
  EXPECT_EQ(r->Header("connection"), "close");
  EXPECT_EQ(r->body, kMissingKey);
  EXPECT_EQ(server_->buffered_body_bytes(), 0);
  EXPECT_TRUE(c.WaitClosed());

  // A client that sends its body anyway is cut off: the server reads at most
  // the linger allowance (4 MiB) of a 30 MB body, holding none of it.
  Client blast(port(), true);
  std::atomic<size_t> sent{0};
  std::thread sender([&] {
    const std::string head =
        "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\nContent-Length: "
        "30000000\r\n\r\n";
    if (!blast.Send(head)) return;
    const std::string piece(64 << 10, 'x');
    while (sent < 30000000u && blast.Send(piece)) sent += piece.size();
  });
  auto r2 = blast.Read();
  sender.join();
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->status, 401);
  EXPECT_NE(r2->body.find("\"message\":\"invalid API key\""), std::string::npos) << r2->body;
  EXPECT_LT(sent.load(), 30000000u);
  EXPECT_EQ(server_->buffered_body_bytes(), 0);
}

TEST_F(HttpServerTest, ApiKeySchemeIsCaseInsensitiveAndPublicRoutesNeedNone) {
  HttpServerOptions options;
  options.api_key = "sk-test";
  StartServer(options, [](HttpServer& s) {
    s.Handle(
        "GET", "/health",
        [](HttpRequest&&, std::shared_ptr<HttpResponder> r) { r->SendJson(200, "{}"); },
        HttpAuth::kPublic);
  });
  Client c(port(), true);
  for (const char* auth : {"Bearer sk-test", "bearer sk-test", "BEARER  sk-test"}) {
    ASSERT_TRUE(c.Send(Post("/echo", "hi", std::string("Authorization: ") + auth + "\r\n")));
    auto r = c.Read();
    ASSERT_TRUE(r) << auth;
    EXPECT_EQ(r->status, 200) << auth;
    EXPECT_EQ(r->body, "hi");
  }
  ASSERT_TRUE(c.Send(Get("/health")));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // Without a body the connection serves on after a 401.
  ASSERT_TRUE(c.Send(Get("/hello", "Authorization: Bearer sk-tesT\r\n")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_NE(r->body.find("\"message\":\"invalid API key\""), std::string::npos);
  // Unknown paths are a 404 with or without the key, at the head: an
  // announced body is never read.
  ASSERT_TRUE(c.Send(Get("/v1/nope")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  {
    Client big(port(), true);
    ASSERT_TRUE(big.Send("POST /v1/nope HTTP/1.1\r\nHost: t\r\nContent-Length: 30000000\r\n\r\n"));
    auto nope = big.Read();
    ASSERT_TRUE(nope);
    EXPECT_EQ(nope->status, 404);
    EXPECT_TRUE(big.WaitClosed());
  }
  // A wrong method on a public path is a 405 without the key.
  ASSERT_TRUE(c.Send(Post("/health", "")));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(hello_count_.load(), 0);
}

// ---- The cap on all request bodies together -------------------------------

// Eight clients announce 1 MB bodies at a 4 MiB cap: four are read, the other
// four get 503 + Retry-After at once (before sending a body byte); once the
// four are dispatched the bytes are free again.
TEST_F(HttpServerTest, TotalBodyCapRefusesBodiesPastItAtOnce) {
  HttpServerOptions options;
  options.max_body_bytes = 1 << 20;
  options.max_total_body_bytes = 4 << 20;
  StartServer(options);
  constexpr size_t kBody = 1000000;
  const std::string head =
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(kBody) + "\r\n\r\n";
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<Client>(port(), true));
    ASSERT_TRUE(
        clients.back()->Send(head + std::string(100, 'a')));  // the head and a little of the body
    if (i < 4) {
      ASSERT_TRUE(Eventually([&] {
        return server_->buffered_body_bytes() == int64_t(kBody) * (i + 1);
      })) << "client "
          << i << ": " << server_->buffered_body_bytes();
    }
  }
  for (int i = 4; i < 8; ++i) {
    auto r = clients[i]->Read();
    ASSERT_TRUE(r) << "client " << i;
    EXPECT_EQ(r->status, 503);
    EXPECT_EQ(r->Header("retry-after"), "1");
    EXPECT_EQ(r->Header("connection"), "close");
    EXPECT_NE(
        r->body.find(R"("type":"overloaded","param":null,"code":"max_total_request_body_bytes")"),
        std::string::npos)
        << r->body;
  }
  EXPECT_EQ(server_->buffered_body_bytes(), int64_t(kBody) * 4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(clients[i]->Send(std::string(kBody - 100, 'b')));
  for (int i = 0; i < 4; ++i) {
    auto r = clients[i]->Read();
    ASSERT_TRUE(r) << "client " << i;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.size(), kBody);
  }
  EXPECT_EQ(server_->buffered_body_bytes(), 0);

  // Chunked bodies count as they arrive: with 3.8 MB held, a chunked body is
  // refused once its bytes pass the cap.
  for (int i = 0; i < 4; ++i) clients[i]->Close();
  std::vector<std::unique_ptr<Client>> holders;
  for (int i = 0; i < 4; ++i) {
    holders.push_back(std::make_unique<Client>(port(), true));
    ASSERT_TRUE(
        holders.back()->Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 950000\r\n\r\n"));
  }
  ASSERT_TRUE(Eventually([&] { return server_->buffered_body_bytes() == 4 * 950000; }));
  Client chunked(port(), true);
  std::string req = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 8; ++i) req += "10000\r\n" + std::string(0x10000, 'c') + "\r\n";
  chunked.Send(req);  // the server may close before all of it is sent
  auto r = chunked.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(server_->buffered_body_bytes(), 4 * 950000);
  holders.clear();
  EXPECT_TRUE(Eventually([&] { return server_->buffered_body_bytes() == 0; }));
}

TEST(HttpServerCreate, TotalBodyCapBelowThePerRequestLimitIsAnError) {
  HttpServerOptions options;
  options.port = 0;
  options.max_body_bytes = 1 << 20;
  options.max_total_body_bytes = 1 << 19;
  auto s = HttpServer::Create(options);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("max_total_body_bytes"), std::string::npos);
  options.max_total_body_bytes = 0;  // no cap
  EXPECT_TRUE(HttpServer::Create(options).ok());
}

// ---- HTTP conformance (RFC 9112) ------------------------------------------

// The same heads, in one write and in 7-byte writes, get the same answers:
// at the limit 200, one byte over 431 (the old parser let 112 KB through in
// one write and refused 70 KB in 7-byte writes).
TEST_F(HttpServerTest, HeaderLimitIsExactHoweverTheBytesArrive) {
  StartServer();  // max_header_bytes: 64 KiB
  auto head_of = [](size_t bytes) {
    std::string pre = "GET /hello HTTP/1.1\r\nHost: t\r\nX-Pad: ";
    return pre + std::string(bytes - pre.size() - 4, 'a') + "\r\n\r\n";
  };
  for (bool trickle : {false, true}) {
    for (size_t bytes : {size_t{65536}, size_t{65537}, size_t{70000}, size_t{112000}}) {
      SCOPED_TRACE((trickle ? "7-byte writes, " : "one write, ") + std::to_string(bytes) +
                   " bytes");
      Client c(port(), true);
      std::string head = head_of(bytes);
      if (trickle) {
        for (size_t at = 0; at < head.size(); at += 7) {
          if (!c.Send(std::string_view(head).substr(at, 7))) break;  // refused early: fine
        }
      } else {
        c.Send(head);
      }
      auto r = c.Read();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, bytes <= 65536 ? 200 : 431);
    }
  }
}

TEST_F(HttpServerTest, AbsoluteFormTargetsRouteByTheirPath) {
  StartServer();
  Client c(port(), true);
  ASSERT_TRUE(
      c.Send("POST http://127.0.0.1:8000/echo HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: "
             "2\r\n\r\nok"));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok");
  ASSERT_TRUE(
      c.Send("GET http://127.0.0.1:8000/hello?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello 1 /hello?x=1");
}

TEST_F(HttpServerTest, UnsupportedTransferCodingIs501AndMissingHostIs400) {
  StartServer();
  {
    Client c(port(), true);
    ASSERT_TRUE(
        c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
               "4\r\nWiki\r\n0\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 501);
    EXPECT_NE(r->body.find("gzip, chunked"), std::string::npos) << r->body;
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    Client c(port(), true);
    ASSERT_TRUE(c.Send("GET /hello HTTP/1.1\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("Host"), std::string::npos) << r->body;
  }
  {  // HTTP/1.0 needs no Host.
    Client c(port(), true);
    ASSERT_TRUE(c.Send("GET /hello HTTP/1.0\r\n\r\n"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_EQ(server_->buffered_body_bytes(), 0);
}

TEST(HttpServerCreate, ReportsAddressInUseWithHostAndPort) {
  HttpServerOptions options;
  options.port = 0;
  auto first = HttpServer::Create(options);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  options.port = (*first)->port();
  auto second = HttpServer::Create(options);
  ASSERT_FALSE(second.ok());
  const std::string& msg = second.status().message();
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(options.port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;

  options.host = "no.such.host.invalid";
  auto third = HttpServer::Create(options);
  ASSERT_FALSE(third.ok());
  EXPECT_NE(third.status().message().find("no.such.host.invalid"), std::string::npos);
}

}  // namespace
}  // namespace strata

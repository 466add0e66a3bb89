// HttpServer under load and abuse: 2,000 concurrent streaming connections on
// one I/O thread, random bytes as requests, and curl as an independent client.
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "server/http_server.h"
#include "server/http_test_client.h"

namespace strata {
namespace {

using http_test::Client;
using http_test::Eventually;
using http_test::Get;

std::unique_ptr<HttpServer> MakeServer(HttpServerOptions options,
                                       const std::function<void(HttpServer&)>& routes) {
  options.port = 0;
  auto server = HttpServer::Create(options);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  if (!server.ok()) return nullptr;
  routes(**server);
  EXPECT_TRUE((*server)->Start().ok());
  return std::move(*server);
}

// Each request starts a stream; a timer thread writes to all of them every
// 50 ms; every client must see every event; then all clients hang up and the
// server must notice each one and free everything.
class HttpServerStreams : public ::testing::TestWithParam<int> {};  // io_threads

TEST_P(HttpServerStreams, TwoThousandConcurrentStreams) {
  constexpr int kConns = 2000;
  constexpr int kRounds = 4;
  if (http_test::RaiseFdLimit(2 * kConns + 200) < 2 * kConns + 200) {
    GTEST_SKIP() << "the hard open-file limit is too low for " << kConns << " connections";
  }
  std::mutex mu;
  std::vector<std::shared_ptr<HttpResponder>> streams;
  std::atomic<int> closes{0};
  HttpServerOptions options;
  options.io_threads = GetParam();
  auto server = MakeServer(options, [&](HttpServer& s) {
    s.Handle("GET", "/v1/stream", [&](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->StartStream(200, {});
      r->OnClose([&] { ++closes; });
      std::lock_guard<std::mutex> lock(mu);
      streams.push_back(std::move(r));
    });
  });
  ASSERT_TRUE(server);

  std::vector<int> fds;
  fds.reserve(kConns);
  const std::string request = Get("/v1/stream");
  for (int i = 0; i < kConns; ++i) {
    int fd = http_test::Connect(server->port());
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    fds.push_back(fd);
    ASSERT_TRUE(http_test::SendAll(fd, request));
  }
  ASSERT_TRUE(Eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return streams.size() == kConns;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(server->active_connections(), kConns);
  EXPECT_EQ(server->in_flight_requests(), kConns);

  std::thread ticker([&] {
    for (int round = 0; round < kRounds; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::lock_guard<std::mutex> lock(mu);
      for (auto& r : streams) r->Write("data: round " + std::to_string(round) + "\n\n");
    }
  });

  // Read every connection until it has the last round.
  const std::string last = "data: round " + std::to_string(kRounds - 1) + "\n\n";
  std::vector<std::string> got(kConns);
  std::vector<pollfd> pfds(kConns);
  for (int i = 0; i < kConns; ++i) pfds[i] = {fds[i], POLLIN, 0};
  int complete = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (complete < kConns && std::chrono::steady_clock::now() < deadline) {
    if (::poll(pfds.data(), pfds.size(), 100) <= 0) continue;
    for (int i = 0; i < kConns; ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = ::recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) {
        pfds[i].fd = -1;
        continue;
      }
      got[i].append(buf, n);
      if (got[i].find(last) != std::string::npos) {
        pfds[i].fd = -1;  // done with this one
        ++complete;
      }
    }
  }
  ticker.join();
  ASSERT_EQ(complete, kConns);
  for (int i = 0; i < kConns; ++i) {
    size_t at = got[i].find("\r\n\r\n");
    ASSERT_EQ(got[i].rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << i;
    for (int round = 0; round < kRounds; ++round) {
      std::string event = "data: round " + std::to_string(round) + "\n\n";
      size_t pos = got[i].find(event, at);
      ASSERT_NE(pos, std::string::npos) << "connection " << i << " missed round " << round;
      at = pos;
    }
  }

  for (int fd : fds) ::close(fd);
  EXPECT_TRUE(Eventually([&] { return closes.load() == kConns; }, std::chrono::seconds(10)))
      << closes.load();
  EXPECT_TRUE(Eventually([&] { return server->active_connections() == 0; }))
      << server->active_connections();
  EXPECT_EQ(server->in_flight_requests(), 0);
  for (auto& r : streams) EXPECT_TRUE(r->closed());
  streams.clear();
  server->Stop();
}

INSTANTIATE_TEST_SUITE_P(IoThreads, HttpServerStreams, ::testing::Values(1, 2));

// Random bytes, random header soup and mutated valid requests never crash or
// wedge the server: each connection ends (the client half-closes and the
// server closes), and a valid request is served afterwards.
TEST(HttpServerStress, RandomRequestsNeverCrashTheServer) {
  HttpServerOptions options;
  options.max_body_bytes = 4096;
  options.max_header_bytes = 2048;
  auto server = MakeServer(options, [](HttpServer& s) {
    s.Handle("POST", "/v1/completions", [](HttpRequest&& req, std::shared_ptr<HttpResponder> r) {
      r->Send(200, {}, req.body);
    });
    s.Handle("GET", "/v1/models", [](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->StartStream(200, {});
      r->Write("data: x\n\n");
      r->End();
    });
  });
  ASSERT_TRUE(server);
  const std::vector<std::string> tokens = {"GET ",
                                           "POST ",
                                           "/v1/completions",
                                           "/v1/models",
                                           " HTTP/1.1",
                                           " HTTP/1.0",
                                           "\r\n",
                                           "\r\n\r\n",
                                           "Host: x",
                                           "Content-Length: ",
                                           "Transfer-Encoding: chunked",
                                           "Expect: 100-continue",
                                           "Connection: close",
                                           ": ",
                                           "0",
                                           "5",
                                           "ffffffffffffffff",
                                           "-1",
                                           "\n",
                                           " ",
                                           "\t",
                                           std::string(1, '\0'),
                                           "\xff",
                                           "abcde",
                                           "4\r\nWiki\r\n",
                                           "0\r\n\r\n"};
  const std::string valid =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
  std::mt19937 rng(20240611);
  for (int iter = 0; iter < 300; ++iter) {
    std::string input;
    switch (iter % 3) {
      case 0: {  // raw random bytes
        size_t n = rng() % 600;
        for (size_t i = 0; i < n; ++i) input.push_back(static_cast<char>(rng()));
        break;
      }
      case 1: {  // a soup of HTTP tokens
        size_t n = rng() % 40;
        for (size_t i = 0; i < n; ++i) input += tokens[rng() % tokens.size()];
        break;
      }
      default: {  // a valid request with a few bytes flipped, cut or repeated
        input = valid;
        int edits = 1 + rng() % 4;
        for (int e = 0; e < edits; ++e) {
          size_t at = rng() % input.size();
          switch (rng() % 3) {
            case 0:
              input[at] = static_cast<char>(rng());
              break;
            case 1:
              input.resize(at);
              break;
            default:
              input.insert(at, tokens[rng() % tokens.size()]);
              break;
          }
          if (input.empty()) input = valid;
        }
        break;
      }
    }
    Client c(server->port(), true);
    ASSERT_TRUE(c.ok()) << "iteration " << iter;
    c.Send(input);  // the server may already have closed: fine
    ::shutdown(c.fd(), SHUT_WR);
    ASSERT_TRUE(c.WaitClosed()) << "iteration " << iter << " wedged the connection on input "
                                << testing::PrintToString(input);
  }
  Client c(server->port(), true);
  ASSERT_TRUE(c.Send(valid));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello");
  c.Close();
  EXPECT_TRUE(Eventually([&] { return server->active_connections() == 0; }));
  EXPECT_EQ(server->in_flight_requests(), 0);
}

// curl: a second client nobody here wrote.
std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(HttpServerCurl, StreamsKeepAliveAndLargeBodies) {
  if (std::system("curl --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "curl is not installed";
  HttpServerOptions options;
  options.max_body_bytes = 1 << 20;
  std::vector<std::thread> threads;
  std::mutex mu;
  auto server = MakeServer(options, [&](HttpServer& s) {
    s.Handle("GET", "/remote", [](HttpRequest&& req, std::shared_ptr<HttpResponder> r) {
      r->Send(200, {{"Content-Type", "text/plain"}}, req.remote + "\n");
    });
    s.Handle("POST", "/len", [](HttpRequest&& req, std::shared_ptr<HttpResponder> r) {
      r->Send(200, {}, std::to_string(req.body.size()));
    });
    s.Handle("GET", "/sse", [&](HttpRequest&&, std::shared_ptr<HttpResponder> r) {
      r->StartStream(200, {});
      std::lock_guard<std::mutex> lock(mu);
      threads.emplace_back([r] {
        for (int i = 0; i < 5; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          r->Write("data: " + std::to_string(i) + "\n\n");
        }
        r->Write("data: [DONE]\n\n");
        r->End();
      });
    });
  });
  ASSERT_TRUE(server);
  const std::string base = "http://127.0.0.1:" + std::to_string(server->port());

  EXPECT_EQ(RunCommand("curl -sS -N --max-time 10 " + base + "/sse"),
            "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: [DONE]\n\n");

  // Three URLs in one curl invocation reuse one connection: same peer port.
  std::string remotes = RunCommand("curl -sS --max-time 10 " + base + "/remote " + base +
                                   "/remote " + base + "/remote");
  std::string first = remotes.substr(0, remotes.find('\n') + 1);
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(remotes, first + first + first);

  // curl sends "Expect: 100-continue" for large bodies and waits for the 100.
  std::string path = ::testing::TempDir() + "http_server_curl_body.bin";
  {
    std::ofstream f(path, std::ios::binary);
    f << std::string(300'000, 'q');
  }
  EXPECT_EQ(RunCommand("curl -sS --max-time 10 -H 'Expect: 100-continue' --data-binary @" + path +
                       " " + base + "/len"),
            "300000");
  {
    std::ofstream f(path, std::ios::binary);
    f << std::string((1 << 20) + 1, 'q');
  }
  std::string over = RunCommand("curl -sS --max-time 10 -w ' %{http_code}' --data-binary @" + path +
                                " " + base + "/len");
  EXPECT_NE(over.find("1048576-byte limit"), std::string::npos) << over;
  EXPECT_NE(over.find(" 413"), std::string::npos) << over;
  std::remove(path.c_str());

  server->Stop();
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace strata

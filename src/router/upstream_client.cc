#include "router/upstream_client.h"

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <map>
#include <thread>
#include <unordered_set>
#include <vector>

namespace strata::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

StatusOr<Endpoint> ParseWorkerUrl(std::string_view url) {
  const std::string shape = "expected http://HOST:PORT, e.g. http://127.0.0.1:8000";
  std::string_view rest = url;
  if (rest.substr(0, 7) != "http://")
    return InvalidArgument(
        "worker URL '" + std::string(url) +
        "': " + (rest.substr(0, 8) == "https://" ? "https is not supported; " : "") + shape);
  rest.remove_prefix(7);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/@?#") != std::string_view::npos)
    return InvalidArgument("worker URL '" + std::string(url) +
                           "': no path, query or user info is allowed; " + shape);
  Endpoint e;
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {  // [v6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return InvalidArgument("worker URL '" + std::string(url) + "': " + shape);
    e.host = std::string(rest.substr(1, close - 1));
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos)
      return InvalidArgument("worker URL '" + std::string(url) + "': no port; " + shape);
    e.host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
  }
  int p = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || p > 65535) {
      p = -1;
      break;
    }
    p = p * 10 + (c - '0');
  }
  if (e.host.empty() || port.empty() || p <= 0 || p > 65535)
    return InvalidArgument("worker URL '" + std::string(url) + "': bad host or port; " + shape);
  e.port = p;
  const bool v6 = e.host.find(':') != std::string::npos;
  e.url = "http://" + (v6 ? "[" + e.host + "]" : e.host) + ":" + std::to_string(p);
  return e;
}

const char* UpstreamErrorName(UpstreamError e) {
  switch (e) {
    case UpstreamError::kNone:
      return "none";
    case UpstreamError::kConnect:
      return "connect";
    case UpstreamError::kTimeout:
      return "timeout";
    case UpstreamError::kBroken:
      return "broken";
  }
  return "?";
}

namespace {
// Parked connections older than this are closed rather than reused: the
// worker closes idle kept-alive connections after its read timeout (60 s by
// default), and a fresh connect costs less than a stale one's failure.
constexpr auto kMaxIdleAge = std::chrono::seconds(20);
}  // namespace

struct UpstreamClient::Impl : std::enable_shared_from_this<UpstreamClient::Impl> {
  struct Parked {
    std::unique_ptr<beast::tcp_stream> stream;
    Clock::time_point since;
  };
  struct Call;

  UpstreamClientOptions options;
  net::io_context ioc{1};
  net::executor_work_guard<net::io_context::executor_type> work{ioc.get_executor()};
  std::thread thread;
  std::atomic<bool> stopped{false};
  // I/O thread only:
  std::map<std::string, std::vector<Parked>> idle;
  std::unordered_set<Call*> live;
  std::unordered_set<std::shared_ptr<net::steady_timer>> timers;

  std::unique_ptr<beast::tcp_stream> TakeIdle(const std::string& url) {
    auto it = idle.find(url);
    if (it == idle.end()) return nullptr;
    while (!it->second.empty()) {
      Parked p = std::move(it->second.back());
      it->second.pop_back();
      if (Clock::now() - p.since < kMaxIdleAge) return std::move(p.stream);
    }
    return nullptr;
  }
  void ReturnIdle(const std::string& url, std::unique_ptr<beast::tcp_stream> s) {
    auto& v = idle[url];
    if (stopped.load() || v.size() >= options.max_idle_per_endpoint) return;  // closes it
    s->expires_never();
    v.push_back(Parked{std::move(s), Clock::now()});
  }
  void CloseAll();
};

struct UpstreamClient::Impl::Call final : UpstreamCall, std::enable_shared_from_this<Call> {
  Call(std::shared_ptr<Impl> c, Endpoint e, UpstreamRequest r, UpstreamHandlers hs)
      : client(std::move(c)), ep(std::move(e)), h(std::move(hs)), resolver(client->ioc) {
    req.method_string(r.method);
    req.target(r.target);
    req.version(11);
    req.set(http::field::host, ep.host + ":" + std::to_string(ep.port));
    for (auto& [k, v] : r.headers) req.set(k, v);
    req.keep_alive(true);
    if (!r.body.empty() || r.method == "POST" || r.method == "PUT") {
      req.body() = std::move(r.body);
      req.prepare_payload();
    }
    deadline = Clock::now() + r.timeout;
  }

  void Cancel() override {
    net::post(client->ioc, [self = shared_from_this()] { self->Abandon(); });
  }

  void Begin() {
    client->live.insert(this);
    if (auto s = client->TakeIdle(ep.url)) {
      stream = std::move(s);
      reused = true;
      Write();
    } else {
      Resolve();
    }
  }

  void Resolve() {
    resolver.async_resolve(
        ep.host, std::to_string(ep.port),
        [self = shared_from_this()](beast::error_code ec, tcp::resolver::results_type results) {
          if (self->finished) return;
          if (ec)
            return self->Finish(UpstreamError::kConnect,
                                "cannot resolve " + self->ep.host + ": " + ec.message());
          self->Connect(results);
        });
  }

  void Connect(const tcp::resolver::results_type& results) {
    stream = std::make_unique<beast::tcp_stream>(client->ioc);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    stream->expires_after(
        std::max(std::chrono::milliseconds(1), std::min(client->options.connect_timeout, left)));
    stream->async_connect(results, [self = shared_from_this()](beast::error_code ec,
                                                               const tcp::endpoint&) {
      if (self->finished) return;
      if (ec)
        return self->Finish(UpstreamError::kConnect,
                            "cannot connect to " + self->ep.url + ": " +
                                (ec == beast::error::timeout ? "connect timed out" : ec.message()));
      beast::error_code ignored;
      self->stream->socket().set_option(tcp::no_delay(true), ignored);
      self->Write();
    });
  }

  // After a failure before the response head on a reused connection: the
  // worker had closed it; open a fresh one once.
  bool RetryFresh() {
    if (!reused || head_seen) return false;
    reused = false;
    stream.reset();
    buf.clear();
    Resolve();
    return true;
  }

  void Write() {
    if (Clock::now() >= deadline) return Finish(UpstreamError::kTimeout, Timeout());
    stream->expires_at(deadline);
    http::async_write(*stream, req, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->finished) return;
      if (ec == beast::error::timeout)
        return self->Finish(UpstreamError::kTimeout, self->Timeout());
      if (ec && !self->RetryFresh())
        return self->Finish(UpstreamError::kConnect,
                            "sending the request to " + self->ep.url + " failed: " + ec.message());
      if (!ec) self->ReadHead();
    });
  }

  void ReadHead() {
    parser.emplace();
    parser->body_limit(std::numeric_limits<uint64_t>::max());
    http::async_read_header(
        *stream, buf, *parser, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (self->finished) return;
          if (ec == beast::error::timeout)
            return self->Finish(UpstreamError::kTimeout, self->Timeout());
          if (ec && !self->RetryFresh())
            return self->Finish(
                UpstreamError::kConnect,
                self->ep.url + " closed the connection before answering: " + ec.message());
          if (ec) return;
          self->head_seen = true;
          UpstreamResponseHead head;
          const auto& msg = self->parser->get();
          head.status = static_cast<int>(msg.result_int());
          for (const auto& f : msg) head.headers.emplace_back(f.name_string(), f.value());
          if (auto n = self->parser->content_length()) head.content_length = *n;
          if (self->h.on_head) self->h.on_head(std::move(head));
          if (!self->finished) self->ReadBody();
        });
  }

  void ReadBody() {
    if (parser->is_done()) return Complete();
    parser->get().body().data = piece.data();
    parser->get().body().size = piece.size();
    // read_some, not read: it returns with whatever arrived, so each SSE
    // event goes on at once instead of waiting for the buffer to fill.
    http::async_read_some(
        *stream, buf, *parser, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (self->finished) return;
          if (ec == http::error::need_buffer) ec = {};
          // What was parsed before an error still goes to the client.
          const size_t got = self->piece.size() - self->parser->get().body().size;
          if (got > 0 && self->h.on_body) self->h.on_body(std::string(self->piece.data(), got));
          if (self->finished) return;
          if (ec == beast::error::timeout)
            return self->Finish(UpstreamError::kTimeout, self->Timeout());
          if (ec)
            return self->Finish(UpstreamError::kBroken, "the response from " + self->ep.url +
                                                            " broke off: " + ec.message());
          self->ReadBody();
        });
  }

  void Complete() {
    const bool keep = parser->get().keep_alive() && buf.size() == 0;
    finished = true;
    client->live.erase(this);
    if (keep) client->ReturnIdle(ep.url, std::move(stream));
    Close();
    auto done = std::move(h.on_done);
    h = {};
    if (done) done(UpstreamError::kNone, "");
  }

  void Finish(UpstreamError e, std::string detail) {
    finished = true;
    client->live.erase(this);
    Close();
    auto done = std::move(h.on_done);
    h = {};
    if (done) done(e, std::move(detail));
  }

  void Abandon() {
    if (finished) return;
    finished = true;
    client->live.erase(this);
    Close();
    h = {};
  }

  void Close() {
    resolver.cancel();
    if (!stream) return;
    beast::error_code ec;
    stream->socket().shutdown(tcp::socket::shutdown_both, ec);
    stream->close();
    stream.reset();
  }

  std::string Timeout() const {
    return "no complete answer from " + ep.url +
           " within the request timeout (--request-timeout-ms)";
  }

  std::shared_ptr<Impl> client;
  Endpoint ep;
  UpstreamHandlers h;
  http::request<http::string_body> req;
  tcp::resolver resolver;
  std::unique_ptr<beast::tcp_stream> stream;
  beast::flat_buffer buf;
  std::optional<http::response_parser<http::buffer_body>> parser;
  std::array<char, 16384> piece{};
  Clock::time_point deadline;
  bool reused = false;
  bool head_seen = false;
  bool finished = false;  // I/O thread only
};

void UpstreamClient::Impl::CloseAll() {
  std::vector<Call*> calls(live.begin(), live.end());
  for (Call* c : calls) c->Abandon();
  live.clear();
  for (auto& t : timers) t->cancel();
  timers.clear();
  idle.clear();
}

std::unique_ptr<UpstreamClient> UpstreamClient::Create(UpstreamClientOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->thread = std::thread([p = impl.get()] { p->ioc.run(); });
  return std::unique_ptr<UpstreamClient>(new UpstreamClient(std::move(impl)));
}

UpstreamClient::UpstreamClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
UpstreamClient::~UpstreamClient() { Stop(); }

std::shared_ptr<UpstreamCall> UpstreamClient::Start(const Endpoint& endpoint,
                                                    UpstreamRequest request,
                                                    UpstreamHandlers handlers) {
  auto call =
      std::make_shared<Impl::Call>(impl_, endpoint, std::move(request), std::move(handlers));
  if (impl_->stopped.load()) return call;  // never runs
  net::post(impl_->ioc, [call] {
    if (call->client->stopped.load()) return;
    call->Begin();
  });
  return call;
}

void UpstreamClient::Fetch(const Endpoint& endpoint, UpstreamRequest request,
                           std::function<void(FetchResult)> done) {
  auto result = std::make_shared<FetchResult>();
  constexpr size_t kMaxFetchBytes = 1 << 20;
  UpstreamHandlers h;
  h.on_head = [result](UpstreamResponseHead head) { result->status = head.status; };
  h.on_body = [result](std::string piece) {
    if (result->body.size() < kMaxFetchBytes) result->body += piece;
  };
  h.on_done = [result, done = std::move(done)](UpstreamError e, std::string detail) {
    result->error = e;
    result->detail = std::move(detail);
    done(std::move(*result));
  };
  Start(endpoint, std::move(request), std::move(h));
}

void UpstreamClient::After(std::chrono::milliseconds delay, std::function<void()> fn) {
  if (impl_->stopped.load()) return;
  net::post(impl_->ioc, [impl = impl_, delay, fn = std::move(fn)]() mutable {
    if (impl->stopped.load()) return;
    auto t = std::make_shared<net::steady_timer>(impl->ioc, delay);
    impl->timers.insert(t);
    t->async_wait([impl, t, fn = std::move(fn)](beast::error_code ec) {
      impl->timers.erase(t);
      if (!ec && !impl->stopped.load()) fn();
    });
  });
}

void UpstreamClient::Stop() {
  if (impl_->stopped.exchange(true)) return;
  net::post(impl_->ioc, [impl = impl_.get()] { impl->CloseAll(); });
  impl_->work.reset();  // run() returns once the aborted operations have completed
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace strata::router

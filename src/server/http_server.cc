// HttpServer: listener, routing, threads, shutdown. Connections live in
// http_connection.cc.
#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_connection.h"
#include "util/logging.h"

namespace strata {

using http_internal::HttpConnection;
using http_internal::Route;
using http_internal::tcp;
namespace net = boost::asio;

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return v;
    }
  }
  return {};
}

void HttpResponder::SendJson(int status, std::string json_body) {
  Send(status, {{"Content-Type", "application/json"}}, std::move(json_body));
}

std::string HttpErrorJson(std::string_view message, std::string_view type, std::string_view code) {
  nlohmann::ordered_json j;
  j["error"] = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!code.empty()) j["error"]["code"] = code;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- Core ------------------------------------------------------------------

HttpServer::Core::Core(HttpServerOptions opts)
    : options(std::move(opts)),
      ioc(std::max(1, options.io_threads)),
      accept_strand(net::make_strand(ioc)),
      acceptor(accept_strand),
      accept_retry(accept_strand) {}

Route HttpServer::Core::FindRoute(const std::string& method, const std::string& path) const {
  Route r;
  auto it = routes.find(path);
  if (it == routes.end()) {
    if (fallback.handler) {
      r.handler = &fallback.handler;
      r.needs_key = fallback.auth == HttpAuth::kApiKey;
    } else {
      r.error_status = 404;
      r.needs_key = false;  // answered at the head either way: no body is read
    }
    return r;
  }
  auto m = it->second.find(method);
  if (m != it->second.end()) {
    r.handler = &m->second.handler;
    r.needs_key = m->second.auth == HttpAuth::kApiKey;
    return r;
  }
  r.error_status = 405;
  r.needs_key = false;
  for (const auto& [name, entry] : it->second) {
    if (!r.allow.empty()) r.allow += ", ";
    r.allow += name;
    r.needs_key = r.needs_key || entry.auth == HttpAuth::kApiKey;
  }
  return r;
}

bool HttpServer::Core::ReserveBody(size_t n) {
  const size_t cap = options.max_total_body_bytes;
  size_t cur = body_bytes.load(std::memory_order_relaxed);
  do {
    if (cap > 0 && (n > cap || cur > cap - n)) return false;
  } while (!body_bytes.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  return true;
}

void HttpServer::Core::ReleaseBody(size_t n) {
  if (n > 0) body_bytes.fetch_sub(n, std::memory_order_relaxed);
}

void HttpServer::Core::Register(const std::shared_ptr<HttpConnection>& conn) {
  std::lock_guard<std::mutex> lock(mu);
  conns.emplace(conn.get(), conn);
}

void HttpServer::Core::Unregister(HttpConnection* conn) {
  std::lock_guard<std::mutex> lock(mu);
  conns.erase(conn);
}

std::vector<std::shared_ptr<HttpConnection>> HttpServer::Core::Connections() {
  std::vector<std::shared_ptr<HttpConnection>> out;
  std::lock_guard<std::mutex> lock(mu);
  out.reserve(conns.size());
  for (auto& [p, weak] : conns) {
    if (auto c = weak.lock()) out.push_back(std::move(c));
  }
  return out;
}

namespace {

// How long Stop() lets complete responses finish writing.
constexpr std::chrono::milliseconds kStopGrace{1000};

void Accept(std::shared_ptr<HttpServer::Core> core) {
  auto& acceptor = core->acceptor;
  acceptor.async_accept(net::make_strand(core->ioc), [core](boost::system::error_code ec,
                                                            tcp::socket socket) mutable {
    if (!core->acceptor.is_open() || core->stopped) return;
    if (ec) {
      // Out of descriptors (or a transient error): back off instead of
      // spinning; the connections waiting in the backlog are taken later.
      static std::atomic<int64_t> last_log{0};
      int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
      if (last_log.exchange(now) != now) {
        STRATA_LOG(WARN) << "http: accept failed: " << ec.message()
                         << (ec == net::error::no_descriptors
                                 ? " (raise the open-file limit: ulimit -n)"
                                 : "");
      }
      core->accept_retry.expires_after(std::chrono::milliseconds(50));
      core->accept_retry.async_wait([core](boost::system::error_code wait_ec) {
        if (!wait_ec) Accept(core);
      });
      return;
    }
    std::make_shared<HttpConnection>(core, std::move(socket))->PostStart();
    Accept(std::move(core));
  });
}

// Every connection is a descriptor: lift the soft limit to the hard one.
void RaiseFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  rlim_t before = lim.rlim_cur;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) lim.rlim_cur = before;
  }
  STRATA_LOG(INFO) << "http: open-file limit " << lim.rlim_cur << " (was " << before << ", hard "
                   << lim.rlim_max << "): at most ~" << (lim.rlim_cur > 64 ? lim.rlim_cur - 64 : 0)
                   << " concurrent connections";
}

}  // namespace

// ---- HttpServer ------------------------------------------------------------

HttpServer::HttpServer(std::shared_ptr<Core> core) : core_(std::move(core)) {}

HttpServer::~HttpServer() { Stop(); }

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options) {
  const std::string where = options.host + ":" + std::to_string(options.port);
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("cannot listen on " + where + ": port must be 0..65535");
  }
  if (options.max_total_body_bytes != 0 && options.max_total_body_bytes < options.max_body_bytes) {
    return InvalidArgument(
        "http server max_total_body_bytes (" + std::to_string(options.max_total_body_bytes) +
        ") is smaller than max_body_bytes (" + std::to_string(options.max_body_bytes) +
        "): no request with a body at the limit could be read; raise it or use 0 (no cap)");
  }
  if (options.io_threads < 1) {
    return InvalidArgument("http server io_threads must be >= 1 (got " +
                           std::to_string(options.io_threads) + ")");
  }
  auto core = std::make_shared<Core>(options);
  boost::system::error_code ec;
  tcp::resolver resolver(core->ioc);
  auto results = resolver.resolve(options.host, std::to_string(options.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return InvalidArgument("cannot listen on " + where + ": cannot resolve host '" + options.host +
                           "': " + ec.message() +
                           "; give an IP address such as 127.0.0.1 or 0.0.0.0");
  }
  tcp::endpoint endpoint = results.begin()->endpoint();
  auto fail = [&](const char* step) {
    std::string hint;
    if (ec == net::error::address_in_use) {
      hint = "; another process listens there: stop it or choose another --port";
    } else if (ec == net::error::access_denied) {
      hint = "; ports below 1024 need privileges: choose a port >= 1024";
    } else if (ec.value() == EADDRNOTAVAIL) {
      hint = "; the address is not on this machine: use 127.0.0.1 or 0.0.0.0";
    }
    return IoError("cannot listen on " + where + ": " + step + " failed: " + ec.message() + hint);
  };
  auto& acceptor = core->acceptor;
  if (acceptor.open(endpoint.protocol(), ec)) return fail("socket");
  if (acceptor.set_option(tcp::acceptor::reuse_address(true), ec)) return fail("setsockopt");
  if (acceptor.bind(endpoint, ec)) return fail("bind");
  if (acceptor.listen(options.backlog, ec)) return fail("listen");
  core->port = acceptor.local_endpoint(ec).port();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(core)));
}

void HttpServer::Handle(std::string method, std::string path, HttpHandler handler, HttpAuth auth) {
  STRATA_CHECK(!core_->started) << "HttpServer::Handle after Start()";
  core_->routes[std::move(path)][std::move(method)] = {std::move(handler), auth};
}

void HttpServer::SetFallback(HttpHandler handler, HttpAuth auth) {
  STRATA_CHECK(!core_->started) << "HttpServer::SetFallback after Start()";
  core_->fallback = {std::move(handler), auth};
}

Status HttpServer::Start() {
  if (core_->started) return FailedPrecondition("HttpServer::Start called twice");
  core_->started = true;
  RaiseFileLimit();
  core_->work.emplace(core_->ioc.get_executor());
  net::post(core_->accept_strand, [core = core_] { Accept(core); });
  for (int i = 0; i < core_->options.io_threads; ++i) {
    core_->threads.emplace_back([core = core_.get()] {
      for (;;) {
        try {
          core->ioc.run();
          return;
        } catch (const std::exception& e) {  // a bug; keep serving the others
          STRATA_LOG(ERROR) << "http: I/O thread caught: " << e.what();
        }
      }
    });
  }
  STRATA_LOG(INFO) << "http: listening on " << core_->options.host << ":" << core_->port;
  return OkStatus();
}

int HttpServer::port() const { return core_->port; }

void HttpServer::StopAccepting() {
  if (core_->draining.exchange(true)) return;
  if (core_->threads.empty()) {  // not started: nothing runs on the strand
    boost::system::error_code ec;
    core_->acceptor.close(ec);
  } else {
    auto closed = std::make_shared<std::promise<void>>();
    auto done = closed->get_future();
    net::post(core_->accept_strand, [core = core_, closed] {
      boost::system::error_code ec;
      core->acceptor.close(ec);
      core->accept_retry.cancel();
      closed->set_value();
    });
    // Once this returns, connecting is refused. On an I/O thread (a handler)
    // waiting could deadlock; the close then happens just after.
    if (!core_->ioc.get_executor().running_in_this_thread()) done.wait();
  }
  for (auto& c : core_->Connections()) c->PostDrain();
}

void HttpServer::Stop() {
  if (core_->stopped.load()) return;
  STRATA_CHECK(!core_->ioc.get_executor().running_in_this_thread())
      << "HttpServer::Stop called from an I/O thread (a handler or OnClose callback); "
         "call it from another thread";
  core_->stopping.store(true);
  StopAccepting();
  // Responses already complete (End() or Send() given) may still be on their
  // way out: give them a moment; close everything else now.
  for (auto& c : core_->Connections()) c->PostShutdown();
  if (!core_->threads.empty()) {
    auto deadline = std::chrono::steady_clock::now() + kStopGrace;
    while (core_->active.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  for (auto& c : core_->Connections()) c->PostClose();
  // Posted before `stopped` is set, so these closes run (OnClose callbacks
  // fire); then the I/O threads run out of work and return.
  core_->stopped.store(true, std::memory_order_release);
  core_->work.reset();
  for (auto& t : core_->threads) t.join();
  if (!core_->threads.empty()) STRATA_LOG(INFO) << "http: stopped";
  core_->threads.clear();
}

int64_t HttpServer::active_connections() const { return core_->active.load(); }

int64_t HttpServer::in_flight_requests() const { return core_->in_flight.load(); }

int64_t HttpServer::buffered_body_bytes() const {
  return static_cast<int64_t>(core_->body_bytes.load(std::memory_order_relaxed));
}

}  // namespace strata

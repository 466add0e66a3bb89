// Internals of the HTTP transport (http_server.h is the public face): the
// server's shared state (HttpServer::Core) and one client connection.
//
// A connection is a small state machine run on its own strand:
//
//   kReading --request read----> kHandling --response written--> kReading
//      |                            |      \--(close after)-->  kLingering
//      |--bad request: error response (kHandling, discard input)--^   |
//      v                            v                                 v
//   kClosed <-- peer EOF / error / timeout / Stop() --------------- kClosed
//
// Exactly one read is outstanding in kReading, kHandling (this is how a
// disconnect is seen while a response is pending) and kLingering (drain the
// peer's unread data after shutdown(send), so the close does not turn into a
// reset that eats our last response). Reads wait for readiness and then read
// into a per-thread buffer, so an idle connection owns no read buffer.
//
// Input goes through a RequestReader (http_request_reader.h): the head is
// checked (limits, conformance, route, API key, body caps) before any body
// byte is read.
//
// Ownership: async operations and HttpResponders hold shared_ptrs to the
// connection; the connection holds only a weak_ptr to its responder (a
// responder nobody holds is an abandoned request). Connections hold the Core,
// so the io_context outlives every socket.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http_request_reader.h"
#include "server/http_server.h"

namespace strata {

namespace http_internal {
namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

class HttpConnection;

// Where a request goes: a handler, or an error status the transport answers.
struct Route {
  const HttpHandler* handler = nullptr;
  int error_status = 0;   // 404 or 405 when handler is null
  std::string allow;      // for 405: "GET, POST"
  bool needs_key = true;  // the API key is checked (when one is set)
};

struct RouteEntry {
  HttpHandler handler;
  HttpAuth auth = HttpAuth::kApiKey;
};

}  // namespace http_internal

struct HttpServer::Core {
  explicit Core(HttpServerOptions opts);

  http_internal::Route FindRoute(const std::string& method, const std::string& path) const;
  void Register(const std::shared_ptr<http_internal::HttpConnection>& conn);
  void Unregister(http_internal::HttpConnection* conn);
  std::vector<std::shared_ptr<http_internal::HttpConnection>> Connections();
  // Counts `n` more body bytes against max_total_body_bytes; false (and
  // nothing counted) when they would pass it.
  bool ReserveBody(size_t n);
  void ReleaseBody(size_t n);

  const HttpServerOptions options;
  boost::asio::io_context ioc;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  boost::asio::strand<boost::asio::io_context::executor_type> accept_strand;
  http_internal::tcp::acceptor acceptor;
  boost::asio::steady_timer accept_retry;
  std::vector<std::thread> threads;
  int port = 0;
  bool started = false;

  // path -> (method -> handler); fixed once Start() runs.
  std::map<std::string, std::map<std::string, http_internal::RouteEntry>> routes;
  http_internal::RouteEntry fallback;

  std::atomic<bool> draining{false};  // StopAccepting() was called
  std::atomic<bool> stopping{false};  // Stop() is closing connections
  std::atomic<bool> stopped{false};   // Stop() is done: nothing more is posted
  std::atomic<int64_t> active{0};
  std::atomic<int64_t> in_flight{0};
  std::atomic<size_t> body_bytes{0};  // see ReserveBody()

  std::mutex mu;  // guards conns
  std::unordered_map<http_internal::HttpConnection*, std::weak_ptr<http_internal::HttpConnection>>
      conns;
};

namespace http_internal {

class ConnectionResponder;

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(std::shared_ptr<HttpServer::Core> core, tcp::socket socket);
  ~HttpConnection();

  // From any thread. No-ops once the server has stopped.
  void PostStart();
  void PostClose();
  void PostDrain();     // close if idle between requests
  void PostShutdown();  // close, unless a complete response is still being written
  void PostSend(uint64_t seq, int status, HttpHeaders headers, std::string body);
  void PostStartStream(uint64_t seq, int status, HttpHeaders headers);
  void PostWrite(uint64_t seq, std::string chunk);
  void PostEnd(uint64_t seq);
  void PostAbandon(uint64_t seq);

 private:
  enum class State { kReading, kHandling, kLingering, kClosed };

  template <typename F>
  void Post(F&& f);

  // Reading.
  void StartRead();
  void OnReadable(boost::system::error_code ec);
  void OnData(const char* data, size_t n);
  void ParsePending();
  bool OnHead();              // false: answered with an error already
  bool ChargeBody(size_t n);  // false: answered 503 (the total body cap)
  void ReleaseBody();
  void Dispatch();
  void StartRequest();  // back to kReading for the next request

  // Responding (all on the strand; `seq` guards against stale responders).
  bool Current(uint64_t seq) const;
  void DoSend(int status, const HttpHeaders& headers, std::string body);
  void DoStartStream(int status, const HttpHeaders& headers);
  void DoWrite(std::string_view chunk);
  void DoEnd();
  void RespondError(int status, std::string_view message, std::string_view type, bool close,
                    HttpHeaders extra = {}, std::string_view code = {});
  void Queue(std::string bytes);
  void Flush();
  void OnWritten(boost::system::error_code ec);
  void FinishResponse();
  std::string Head(int status, const HttpHeaders& headers, std::string_view framing);

  // Deadlines and closing.
  void SetDeadline(Clock::time_point* which, Clock::time_point when);
  void WaitTimer();
  void OnTimer();
  void BeginLinger();
  void Close();

  std::shared_ptr<HttpServer::Core> core_;
  tcp::socket socket_;
  net::steady_timer timer_;
  std::string remote_;
  State state_ = State::kReading;

  // Input.
  bool reading_ = false;          // a readiness wait is outstanding
  bool request_started_ = false;  // bytes of the current request have arrived
  bool discard_input_ = false;    // answering an error; ignore what the peer sends
  size_t discarded_ = 0;
  std::string pending_;  // received, not yet used by the reader
  RequestReader reader_;
  Route route_;         // of the current request, once its head is in
  size_t charged_ = 0;  // its body bytes counted in Core::body_bytes

  // The response being produced.
  uint64_t seq_ = 0;  // of the current request
  std::weak_ptr<ConnectionResponder> responder_;
  bool counted_ = false;    // counted in Core::in_flight
  bool head_only_ = false;  // a HEAD request: headers only
  bool keep_alive_ = true;
  bool http10_ = false;
  bool started_ = false;  // status line queued
  bool streaming_ = false;
  bool done_ = false;  // every byte of the response is queued

  // Output.
  std::vector<std::string> outbox_;
  std::vector<std::string> writing_;
  size_t outbox_bytes_ = 0;
  bool write_in_progress_ = false;

  Clock::time_point read_deadline_ = Clock::time_point::max();
  Clock::time_point write_deadline_ = Clock::time_point::max();
};

// The HttpResponder handed to handlers: forwards to its connection's strand.
class ConnectionResponder final : public HttpResponder {
 public:
  ConnectionResponder(std::shared_ptr<HttpConnection> conn, uint64_t seq)
      : conn_(std::move(conn)), seq_(seq) {}
  ~ConnectionResponder() override;

  void Send(int status, HttpHeaders headers, std::string body) override;
  void StartStream(int status, HttpHeaders headers) override;
  void Write(std::string chunk) override;
  void End() override;
  bool closed() const override { return closed_.load(std::memory_order_acquire); }
  void OnClose(std::function<void()> fn) override;

  // From the connection's strand.
  void NotifyClosed();  // the connection went away before the response completed
  void NotifyDone();    // the response completed

 private:
  std::shared_ptr<HttpConnection> conn_;
  const uint64_t seq_;
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  bool done_ = false;
  std::function<void()> on_close_;
};

}  // namespace http_internal
}  // namespace strata

// The router's HTTP/1.1 client for its hops to workers: asynchronous
// (Boost.Beast), keep-alive connections pooled per worker, a connect timeout
// and a deadline per request, and responses handed over piece by piece as
// they arrive (a streamed SSE body is never held whole).
//
// Model: one I/O thread runs every upstream socket and timer, so calls and
// the pool need no locks of their own; thousands of streams cost sockets,
// not threads (relaying is copying bytes). Handlers run on that thread and
// must return quickly (HttpResponder calls are fine: they never block).
//
// A pooled connection the worker has closed meanwhile is noticed when the
// request is written or the head read; the call then opens a fresh
// connection once, transparently (the worker saw no request on the old one).
//
// Ownership: the client owns its thread and every connection; a call lives
// until it finishes or is cancelled. Thread-safety: Start(), Fetch(), After()
// and UpstreamCall::Cancel() from any thread; Stop() from one controlling
// thread, not from a handler.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_server.h"  // HttpHeaders
#include "util/status.h"

namespace strata::router {

// Where a worker listens: "http://host:port" (a trailing slash is allowed;
// https, paths and user info are not).
struct Endpoint {
  std::string host;
  int port = 0;
  std::string url;  // normalised "http://host:port": the worker's name in logs and metrics
};
// InvalidArgument naming the URL and the expected shape otherwise.
StatusOr<Endpoint> ParseWorkerUrl(std::string_view url);

struct UpstreamRequest {
  std::string method = "POST";
  std::string target;  // "/v1/completions"
  // Sent as given; the client sets Host, Content-Length and Connection.
  HttpHeaders headers;
  std::string body;
  std::chrono::milliseconds timeout{1'800'000};  // connect to last body byte
};

// How a call ended.
enum class UpstreamError {
  kNone,     // the whole response arrived
  kConnect,  // no connection, or it broke before the response head: the
             // worker did not answer (retryable on another worker)
  kTimeout,  // the request's deadline passed
  kBroken,   // the connection broke or the response was malformed after the head
};
const char* UpstreamErrorName(UpstreamError e);

struct UpstreamResponseHead {
  int status = 0;
  HttpHeaders headers;                     // as received (hop-by-hop ones included)
  std::optional<uint64_t> content_length;  // absent: chunked or read to close
};

struct UpstreamHandlers {
  std::function<void(UpstreamResponseHead)> on_head;  // once, before any body piece
  std::function<void(std::string)> on_body;           // each piece as it arrives
  // Once, last, unless the call was cancelled first; `detail` says what
  // failed and where (empty on kNone).
  std::function<void(UpstreamError, std::string detail)> on_done;
};

class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  // Closes the connection now (so the worker sees its client go and aborts
  // the request). No handler runs once the cancel reaches the I/O thread;
  // one already running finishes. Idempotent.
  virtual void Cancel() = 0;
};

struct UpstreamClientOptions {
  std::chrono::milliseconds connect_timeout{3'000};
  size_t max_idle_per_endpoint = 64;  // kept-alive connections parked per worker
};

class UpstreamClient {
 public:
  static std::unique_ptr<UpstreamClient> Create(UpstreamClientOptions options);
  ~UpstreamClient();  // Stop()

  // Sends `request` to `endpoint`; `handlers` run on the I/O thread.
  std::shared_ptr<UpstreamCall> Start(const Endpoint& endpoint, UpstreamRequest request,
                                      UpstreamHandlers handlers);

  struct FetchResult {
    UpstreamError error = UpstreamError::kNone;
    std::string detail;
    int status = 0;
    std::string body;
  };
  // A whole small response (health checks, /load, /server_info); `done` runs
  // on the I/O thread.
  void Fetch(const Endpoint& endpoint, UpstreamRequest request,
             std::function<void(FetchResult)> done);
  // Runs `fn` on the I/O thread after `delay` (unless the client stops first).
  void After(std::chrono::milliseconds delay, std::function<void()> fn);

  // Cancels every call and timer (no handler runs after), closes every
  // connection and joins the thread. Later Start/Fetch/After do nothing.
  // Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit UpstreamClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with live calls, which may outlive the client
};

}  // namespace strata::router

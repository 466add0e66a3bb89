// HTTP/1.1 transport for `strata serve`: accepts connections, parses requests,
// routes them to handlers by (method, path), and writes complete or chunked
// (server-sent events) responses. Built on Boost.Asio/Beast, kept out of this
// header so that users of the server compile without Boost.
//
// Model: a few I/O threads (HttpServerOptions::io_threads) run every socket;
// thousands of idle or streaming connections cost file descriptors and a few
// hundred bytes each, not threads. Each connection is serialised on its own
// strand. Handlers are called on an I/O thread and MUST return quickly (queue
// the work elsewhere); the response is given later through the
// HttpResponder, from any thread.
//
// What the transport does by itself (handlers never see these requests).
// Everything but 408 is decided when the head (request line + headers) is
// in, before any body byte is read (http_request_reader.h has the head rules):
//   - 400 (malformed request, HTTP/1.1 without Host, Transfer-Encoding not
//     ending in chunked), 501 (a transfer coding besides chunked), 431 (head
//     over max_header_bytes, however the bytes arrive), 408 (request not
//     received within read_timeout);
//   - in this order: 401 (api_key set, the route needs it and the request
//     lacks `Authorization: Bearer <key>`), 404 (no route for the path: no
//     key needed, no body read) and
//     405 (path known, method not; with an Allow header), 413 (Content-Length
//     over max_body_bytes; chunked bodies when they grow past it), 503 (the
//     body would take the bodies held by all connections past
//     max_total_body_bytes; Retry-After: 1);
//   - after an error at head time the connection closes when a body follows
//     (it is never read) and serves on otherwise;
//   - `Expect: 100-continue`: answers 100 only when the request will be read
//     (every check above passed), otherwise the final error at once;
//   - keep-alive (HTTP/1.1 default, HTTP/1.0 on request), idle connections
//     closed after read_timeout; stalled writes closed after write_timeout.
// Error bodies are OpenAI-shaped JSON: {"error":{"message","type","param","code"}}.
//
// Disconnects: while a response is pending the connection keeps a read
// outstanding, so a peer that closes (or half-closes) its socket is seen at
// once; the request's OnClose callback then fires and its writes become no-ops.
//
// Ownership: HttpServer owns its threads and listener. A connection lives
// while the peer is connected or while an HttpResponder for it is held.
// Thread-safety: every public method of HttpServer and HttpResponder is
// thread-safe, except Handle()/SetFallback() (call before Start()).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace strata {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   // "GET", "POST", ... as sent (case-sensitive per RFC 9110)
  std::string target;   // the request target as sent: "/v1/models?x=1"
  std::string path;     // target up to '?': "/v1/models" (not percent-decoded)
  std::string query;    // after '?', without it; empty if none
  HttpHeaders headers;  // in order received; names as sent
  std::string body;     // de-chunked when sent chunked
  std::string remote;   // peer "ip:port"
  int version = 11;     // 10 or 11

  // The first header named `name` (ASCII case-insensitive); empty if absent.
  std::string_view Header(std::string_view name) const;
};

// The response to one request. Created by the server, handed to the handler;
// hold the shared_ptr as long as the response is being produced.
//
// Exactly one of: Send(); or StartStream(), any number of Write(), End().
// Calls out of that order are ignored. Every method may be called from any
// thread at any time; calls are queued onto the connection in call order (per
// calling thread) and never block. After the peer goes away every call is a
// no-op. If the last reference is dropped with no response given, the server
// answers 500 (or, mid-stream, closes the connection so the client sees a
// truncated stream rather than a clean end).
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;

  // A complete response. Content-Length, Transfer-Encoding and Connection are
  // set by the server (handler copies are dropped).
  virtual void Send(int status, HttpHeaders headers, std::string body) = 0;
  // Starts a streamed response (chunked on HTTP/1.1; on HTTP/1.0 raw bytes,
  // then close). Defaults Content-Type: text/event-stream and
  // Cache-Control: no-cache when the handler gives none.
  virtual void StartStream(int status, HttpHeaders headers) = 0;
  // One piece of the stream body; empty pieces are skipped. Requires
  // StartStream() first. If the peer stops reading and unsent output exceeds
  // HttpServerOptions::max_buffered_bytes, the connection is closed.
  virtual void Write(std::string chunk) = 0;
  // Ends the stream; the connection then serves its next request.
  virtual void End() = 0;

  // True once the connection is gone (the peer closed it, it failed, or the
  // server stopped) before the response completed.
  virtual bool closed() const = 0;
  // `fn` runs once, on an I/O thread (so: quick, non-blocking), if the
  // connection goes away before the response completes; at once on the
  // calling thread if it already has. Replaces an earlier callback. Dropped
  // unrun when the response completes. Must not block on the server.
  virtual void OnClose(std::function<void()> fn) = 0;

  // Convenience: Send(status, {Content-Type: application/json}, json_body).
  void SendJson(int status, std::string json_body);
};

// Called on an I/O thread; must return quickly (see above).
using HttpHandler = std::function<void(HttpRequest&&, std::shared_ptr<HttpResponder>)>;

// Whether a route needs HttpServerOptions::api_key (when one is set).
enum class HttpAuth {
  kApiKey,  // `Authorization: Bearer <key>` checked when the head arrives: 401 otherwise
  kPublic,  // answered without a key (health checks, metrics scrapes)
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // an IP address or a resolvable name
  int port = 8000;                 // 0: an ephemeral port (see HttpServer::port())
  int io_threads = 1;
  size_t max_body_bytes = 32 << 20;  // larger bodies: 413
  // Bytes all request bodies being received may hold together; a request
  // whose Content-Length would pass it gets 503 at once, a chunked body when
  // its bytes would. A body counts from its head (Content-Length: all of it;
  // chunked: as it arrives) until it is handed to its handler, or until the
  // transport stops reading it (an error answer, the connection closing).
  // 0: no cap. REQUIRES: 0 or >= max_body_bytes.
  size_t max_total_body_bytes = size_t{256} << 20;
  // Non-empty: routes registered with HttpAuth::kApiKey (the default) and
  // the fallback need `Authorization: Bearer <api_key>`
  // (scheme case-insensitive; the key compared in constant time).
  std::string api_key;
  size_t max_header_bytes = 64 << 10;  // request line + headers; larger: 431
  // Time allowed to receive a whole request (from its first byte), and to
  // wait idle for the next request on a kept-alive connection.
  std::chrono::milliseconds read_timeout{60'000};
  // Time one write may stall (the peer not reading) before the connection is closed.
  std::chrono::milliseconds write_timeout{60'000};
  size_t max_buffered_bytes = 16 << 20;  // unsent stream output per connection
  int backlog = 4096;
};

// {"error":{"message":message,"type":type,"param":null,"code":code}}; code
// is null when empty.
std::string HttpErrorJson(std::string_view message, std::string_view type = "invalid_request_error",
                          std::string_view code = {});

class HttpServer {
 public:
  // Binds and listens (connections queue in the backlog until Start()).
  // Errors name host:port and the reason, e.g. "address already in use".
  static StatusOr<std::unique_ptr<HttpServer>> Create(HttpServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes requests with exactly this method and path (no query string).
  // A path answers 405 without the key only if every route on it is kPublic.
  // REQUIRES: before Start().
  void Handle(std::string method, std::string path, HttpHandler handler,
              HttpAuth auth = HttpAuth::kApiKey);
  // Gets every request with no route for its path (instead of 404, which
  // needs no key: it is answered at the head, reading no body).
  // REQUIRES: before Start().
  void SetFallback(HttpHandler handler, HttpAuth auth = HttpAuth::kApiKey);

  // Raises the open-file limit to its hard maximum (logging the result) and
  // starts the I/O threads. REQUIRES: called once.
  Status Start();
  // The bound port (useful with port 0).
  int port() const;

  // Closes the listener (new connections are refused once this returns) and
  // starts draining: idle kept-alive connections are closed, requests being
  // read or answered complete normally and then their connections close.
  // Idempotent. Wait for in_flight_requests() to reach 0, then Stop().
  void StopAccepting();
  // Closes every connection and joins the I/O threads. Responses already
  // complete (Send() or End() called before Stop()) get up to a second to
  // finish writing; the rest are cut off and their OnClose callbacks fire.
  // Idempotent; later responder calls are no-ops.
  // REQUIRES: not called on an I/O thread (from a handler or OnClose).
  void Stop();

  int64_t active_connections() const;
  // Requests handed to a handler whose response has not yet been fully
  // written (nor their connection closed).
  int64_t in_flight_requests() const;
  // Bytes of request bodies counted against max_total_body_bytes now.
  int64_t buffered_body_bytes() const;

  struct Core;  // internal (http_connection.h)

 private:
  explicit HttpServer(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

}  // namespace strata

// One HTTP connection: see http_connection.h for the state machine.
#include "server/http_connection.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "server/http_auth.h"
#include "util/logging.h"

namespace strata::http_internal {
namespace {

constexpr size_t kReadChunk = 64 << 10;
// Bytes a peer may send ahead (a pipelined request) while its current
// response is pending; beyond this we stop reading until the response is done.
constexpr size_t kMaxReadAhead = 64 << 10;
// After the last response on a connection we read and drop what the peer still
// sends, for at most this long / this much, so our close does not reset it.
constexpr std::chrono::milliseconds kLingerTime{2000};
constexpr size_t kMaxLinger = 4 << 20;

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// A header the handler may set: a token name, a value without CR/LF/NUL, and
// not one of the framing headers the server owns.
bool Allowed(const std::pair<std::string, std::string>& h) {
  if (h.first.empty()) return false;
  for (char c : h.first) {
    if (c <= ' ' || c >= 127 || c == ':') return false;
  }
  for (char c : h.second) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return !IEquals(h.first, "content-length") && !IEquals(h.first, "transfer-encoding") &&
         !IEquals(h.first, "connection");
}

bool HasHeader(const HttpHeaders& headers, std::string_view name) {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& h) { return IEquals(h.first, name); });
}

// 1xx, 204 and 304 responses carry no body (RFC 9110 6.4.1).
bool NoBody(int status) { return status < 200 || status == 204 || status == 304; }

}  // namespace

HttpConnection::HttpConnection(std::shared_ptr<HttpServer::Core> core, tcp::socket socket)
    : core_(std::move(core)),
      socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      reader_({core_->options.max_header_bytes, core_->options.max_body_bytes}) {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (!ec) {
    remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  socket_.set_option(tcp::no_delay(true), ec);  // stream chunks go out at once
  socket_.non_blocking(true, ec);
  core_->active.fetch_add(1);
}

HttpConnection::~HttpConnection() {
  if (charged_ > 0) core_->ReleaseBody(charged_);
  if (state_ != State::kClosed) {  // never closed: the server stopped with work queued
    core_->Unregister(this);
    core_->active.fetch_sub(1);
  }
}

template <typename F>
void HttpConnection::Post(F&& f) {
  if (core_->stopped.load(std::memory_order_acquire)) return;
  net::post(socket_.get_executor(), std::forward<F>(f));
}

void HttpConnection::PostStart() {
  Post([self = shared_from_this()] {
    self->core_->Register(self);
    if (self->core_->stopped || self->core_->draining) {
      self->Close();
      return;
    }
    self->StartRequest();
    self->WaitTimer();
  });
}

void HttpConnection::PostClose() {
  Post([self = shared_from_this()] { self->Close(); });
}

void HttpConnection::PostDrain() {
  Post([self = shared_from_this()] {
    if (self->state_ == State::kReading && !self->request_started_) self->Close();
  });
}

void HttpConnection::PostShutdown() {
  Post([self = shared_from_this()] {
    if (self->state_ == State::kHandling && self->done_) {
      self->keep_alive_ = false;  // FinishResponse() closes once it is written
    } else {
      self->Close();
    }
  });
}

void HttpConnection::PostSend(uint64_t seq, int status, HttpHeaders headers, std::string body) {
  Post([self = shared_from_this(), seq, status, headers = std::move(headers),
        body = std::move(body)]() mutable {
    if (self->Current(seq) && !self->started_) self->DoSend(status, headers, std::move(body));
  });
}

void HttpConnection::PostStartStream(uint64_t seq, int status, HttpHeaders headers) {
  Post([self = shared_from_this(), seq, status, headers = std::move(headers)] {
    if (self->Current(seq) && !self->started_) self->DoStartStream(status, headers);
  });
}

void HttpConnection::PostWrite(uint64_t seq, std::string chunk) {
  if (chunk.empty()) return;
  Post([self = shared_from_this(), seq, chunk = std::move(chunk)] {
    if (self->Current(seq) && self->streaming_) self->DoWrite(chunk);
  });
}

void HttpConnection::PostEnd(uint64_t seq) {
  Post([self = shared_from_this(), seq] {
    if (self->Current(seq) && self->streaming_) self->DoEnd();
  });
}

void HttpConnection::PostAbandon(uint64_t seq) {
  Post([self = shared_from_this(), seq] {
    if (!self->Current(seq)) return;
    if (self->started_) {
      STRATA_LOG(WARN) << "http: handler dropped a stream to " << self->remote_
                       << " without End(); closing the connection";
      self->Close();
    } else {
      STRATA_LOG(WARN) << "http: handler dropped a request from " << self->remote_
                       << " without a response; answering 500";
      self->RespondError(500, "the server dropped the request without a response", "server_error",
                         false);
    }
  });
}

// ---- Reading ---------------------------------------------------------------

void HttpConnection::StartRead() {
  if (reading_ || state_ == State::kClosed) return;
  reading_ = true;
  socket_.async_wait(
      tcp::socket::wait_read,
      [self = shared_from_this()](boost::system::error_code ec) { self->OnReadable(ec); });
}

void HttpConnection::OnReadable(boost::system::error_code ec) {
  reading_ = false;
  if (state_ == State::kClosed) return;
  if (ec) {
    Close();
    return;
  }
  thread_local char buf[kReadChunk];
  size_t n = socket_.read_some(net::buffer(buf), ec);
  if (ec == net::error::would_block || ec == net::error::try_again) {
    StartRead();
    return;
  }
  if (ec) {  // EOF (the peer closed or half-closed) or a reset
    Close();
    return;
  }
  OnData(buf, n);
}

void HttpConnection::OnData(const char* data, size_t n) {
  if (discard_input_ || state_ == State::kLingering) {
    discarded_ += n;
    if (discarded_ > kMaxLinger) {
      Close();
    } else {
      StartRead();
    }
    return;
  }
  pending_.append(data, n);
  if (state_ == State::kReading) {
    if (!request_started_) {
      request_started_ = true;
      SetDeadline(&read_deadline_, Clock::now() + core_->options.read_timeout);
    }
    ParsePending();
  }
  if (state_ == State::kClosed) return;
  // While a response is pending keep reading (to see a disconnect), unless
  // the peer is sending far ahead.
  if (state_ != State::kHandling || discard_input_ || pending_.size() <= kMaxReadAhead) {
    StartRead();
  }
}

void HttpConnection::ParsePending() {
  while (state_ == State::kReading && !pending_.empty()) {
    // A chunked body is counted before it is read: the bytes fed are an upper
    // bound on what the body grows by; the rest is given back below.
    size_t precharge = 0;
    if (reader_.head_done() && reader_.head().chunked) {
      precharge = pending_.size();
      if (!ChargeBody(precharge)) return;
    }
    const size_t before = reader_.body_size();
    size_t used = 0;
    RequestReader::Step step = reader_.Put(pending_, &used);
    pending_.erase(0, used);
    if (precharge > 0) {
      const size_t grown = reader_.body_size() - before;
      core_->ReleaseBody(precharge - grown);
      charged_ -= precharge - grown;
    }
    switch (step) {
      case RequestReader::Step::kNeedMore:
        return;
      case RequestReader::Step::kError: {
        const std::string message = reader_.error_message();  // RespondError resets the reader
        RespondError(reader_.error_status(), message, "invalid_request_error", true);
        return;
      }
      case RequestReader::Step::kHead:
        if (!OnHead()) return;
        if (reader_.done()) {
          Dispatch();
          return;
        }
        break;  // read the body
      case RequestReader::Step::kDone:
        Dispatch();
        return;
    }
  }
}

// The head is in: everything that can refuse the request does so now, before
// a body byte is read (or buffered), and 100 Continue goes out when the
// client waits for it.
bool HttpConnection::OnHead() {
  const RequestHead& head = reader_.head();
  http10_ = head.version < 11;
  head_only_ = head.head_method;
  keep_alive_ = head.keep_alive && !core_->draining.load();
  // A refused request whose body is not all here yet closes the connection:
  // that body is never read. One already received is skipped and the
  // connection serves on.
  const bool close = head.chunked || head.content_length.value_or(0) > pending_.size();
  auto skip_body = [&] {
    if (!close) pending_.erase(0, static_cast<size_t>(head.content_length.value_or(0)));
  };
  route_ = core_->FindRoute(head.method, head.path);
  const std::string& key = core_->options.api_key;
  if (route_.needs_key && !key.empty()) {
    BearerCheck auth = CheckBearer(reader_.Header("authorization"), key);
    if (auth != BearerCheck::kOk) {
      skip_body();
      RespondError(401,
                   auth == BearerCheck::kMissing
                       ? "missing API key: send the header 'Authorization: Bearer <key>'"
                       : "invalid API key",
                   "authentication_error", close, {{"WWW-Authenticate", "Bearer"}},
                   "invalid_api_key");
      return false;
    }
  }
  if (!route_.handler) {
    HttpHeaders extra;
    if (!route_.allow.empty()) extra.emplace_back("Allow", route_.allow);
    skip_body();
    RespondError(route_.error_status,
                 route_.error_status == 404
                     ? "Invalid URL (" + head.method + " " + head.target + ")"
                     : "method " + head.method + " is not allowed on " + head.path,
                 "invalid_request_error", close, std::move(extra));
    return false;
  }
  const size_t max_body = core_->options.max_body_bytes;
  if (head.content_length && *head.content_length > max_body) {
    RespondError(413, "request body is larger than the " + std::to_string(max_body) + "-byte limit",
                 "invalid_request_error", true);
    return false;
  }
  if (head.content_length && *head.content_length > 0) {
    if (!ChargeBody(static_cast<size_t>(*head.content_length))) return false;
    reader_.ReserveBody(static_cast<size_t>(*head.content_length));
  }
  if (head.expect_continue && head.has_body()) {
    Queue("HTTP/1.1 100 Continue\r\n\r\n");
    Flush();
  }
  return true;
}

bool HttpConnection::ChargeBody(size_t n) {
  if (core_->ReserveBody(n)) {
    charged_ += n;
    return true;
  }
  const size_t cap = core_->options.max_total_body_bytes;
  RespondError(503,
               "the server is receiving too many request bodies at once (more than " +
                   std::to_string(cap) + " bytes in all); retry shortly",
               "overloaded", true, {{"Retry-After", "1"}}, "max_total_request_body_bytes");
  return false;
}

void HttpConnection::ReleaseBody() {
  core_->ReleaseBody(charged_);
  charged_ = 0;
}

void HttpConnection::Dispatch() {
  HttpRequest req = reader_.TakeRequest();
  req.remote = remote_;
  // The body belongs to the handler now: it no longer counts against the cap.
  ReleaseBody();

  state_ = State::kHandling;
  SetDeadline(&read_deadline_, Clock::time_point::max());
  ++seq_;
  started_ = streaming_ = done_ = false;
  keep_alive_ = keep_alive_ && !core_->draining.load();

  counted_ = true;
  core_->in_flight.fetch_add(1);
  auto responder = std::make_shared<ConnectionResponder>(shared_from_this(), seq_);
  responder_ = responder;
  std::string what = req.method + " " + req.path;
  try {
    (*route_.handler)(std::move(req), std::move(responder));
  } catch (const std::exception& e) {
    STRATA_LOG(ERROR) << "http: handler for " << what << " threw: " << e.what();
    if (!started_)
      RespondError(500, "internal error in the request handler", "server_error", false);
  } catch (...) {
    STRATA_LOG(ERROR) << "http: handler for " << what << " threw";
    if (!started_)
      RespondError(500, "internal error in the request handler", "server_error", false);
  }
}

void HttpConnection::StartRequest() {
  state_ = State::kReading;
  http10_ = head_only_ = false;
  reader_.Reset();
  // Idle connections keep no buffer a large request left behind.
  if (pending_.empty() && pending_.capacity() > 4096) std::string().swap(pending_);
  request_started_ = !pending_.empty();
  SetDeadline(&read_deadline_, Clock::now() + core_->options.read_timeout);
  ParsePending();  // a request the peer sent ahead
  if (state_ != State::kClosed) StartRead();
}

// ---- Responding ------------------------------------------------------------

bool HttpConnection::Current(uint64_t seq) const {
  return seq == seq_ && state_ == State::kHandling && !done_;
}

std::string HttpConnection::Head(int status, const HttpHeaders& headers, std::string_view framing) {
  if (status < 100 || status > 999) status = 500;
  std::string reason(http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status))));
  if (reason.empty() || reason[0] == '<') reason = "Unknown";
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
  for (const auto& h : headers) {
    if (!Allowed(h)) continue;
    out += h.first;
    out += ": ";
    out += h.second;
    out += "\r\n";
  }
  out += framing;
  if (!keep_alive_) {
    out += "Connection: close\r\n";
  } else if (http10_) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  return out;
}

void HttpConnection::DoSend(int status, const HttpHeaders& headers, std::string body) {
  started_ = true;
  done_ = true;
  std::string framing;
  if (NoBody(status)) {
    body.clear();
  } else {
    framing = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  Queue(Head(status, headers, framing));
  if (!head_only_ && !body.empty()) Queue(std::move(body));
  Flush();
}

void HttpConnection::DoStartStream(int status, const HttpHeaders& headers) {
  started_ = true;
  streaming_ = true;
  HttpHeaders all = headers;
  if (!HasHeader(all, "content-type")) all.emplace_back("Content-Type", "text/event-stream");
  if (!HasHeader(all, "cache-control")) all.emplace_back("Cache-Control", "no-cache");
  if (http10_) keep_alive_ = false;  // no chunking: the end of the stream is the close
  Queue(Head(status, all, http10_ ? "" : "Transfer-Encoding: chunked\r\n"));
  if (head_only_) done_ = true;
  Flush();
}

void HttpConnection::DoWrite(std::string_view chunk) {
  if (head_only_) return;
  if (outbox_bytes_ + chunk.size() > core_->options.max_buffered_bytes) {
    STRATA_LOG(WARN) << "http: " << remote_ << " is not reading its stream (" << outbox_bytes_
                     << " bytes unsent); closing the connection";
    Close();
    return;
  }
  if (http10_) {
    Queue(std::string(chunk));
  } else {
    char size[24];
    int len = std::snprintf(size, sizeof size, "%zx\r\n", chunk.size());
    std::string framed;
    framed.reserve(len + chunk.size() + 2);
    framed.append(size, len);
    framed.append(chunk);
    framed.append("\r\n");
    Queue(std::move(framed));
  }
  Flush();
}

void HttpConnection::DoEnd() {
  done_ = true;
  if (!http10_ && !head_only_) Queue("0\r\n\r\n");
  Flush();
}

void HttpConnection::RespondError(int status, std::string_view message, std::string_view type,
                                  bool close, HttpHeaders extra, std::string_view code) {
  ReleaseBody();  // nothing more of this request's body is kept
  if (close) {
    keep_alive_ = false;
    discard_input_ = true;
    pending_.clear();
    reader_.Reset();
  }
  state_ = State::kHandling;
  SetDeadline(&read_deadline_, Clock::time_point::max());
  if (!counted_) ++seq_;  // no responder for this response: stale ones stay stale
  started_ = streaming_ = done_ = false;
  extra.emplace_back("Content-Type", "application/json");
  DoSend(status, extra, HttpErrorJson(message, type, code));
}

void HttpConnection::Queue(std::string bytes) {
  outbox_bytes_ += bytes.size();
  outbox_.push_back(std::move(bytes));
}

void HttpConnection::Flush() {
  if (write_in_progress_ || outbox_.empty() || state_ == State::kClosed) return;
  write_in_progress_ = true;
  writing_.swap(outbox_);
  std::vector<net::const_buffer> bufs;
  bufs.reserve(writing_.size());
  for (const auto& s : writing_) bufs.emplace_back(s.data(), s.size());
  SetDeadline(&write_deadline_, Clock::now() + core_->options.write_timeout);
  net::async_write(
      socket_, bufs,
      [self = shared_from_this()](boost::system::error_code ec, size_t) { self->OnWritten(ec); });
}

void HttpConnection::OnWritten(boost::system::error_code ec) {
  write_in_progress_ = false;
  for (const auto& s : writing_) outbox_bytes_ -= s.size();
  writing_.clear();
  SetDeadline(&write_deadline_, Clock::time_point::max());
  if (state_ == State::kClosed) return;
  if (ec) {
    Close();
    return;
  }
  if (!outbox_.empty()) {
    Flush();
  } else if (state_ == State::kHandling && done_) {
    FinishResponse();
  }
}

// Every byte of the response is on the wire.
void HttpConnection::FinishResponse() {
  if (counted_) {
    counted_ = false;
    core_->in_flight.fetch_sub(1);
  }
  if (auto r = responder_.lock()) r->NotifyDone();
  responder_.reset();
  ++seq_;
  if (core_->stopping.load()) {
    Close();
  } else if (keep_alive_ && !core_->draining.load()) {
    StartRequest();
  } else {
    BeginLinger();
  }
}

// ---- Deadlines and closing -------------------------------------------------

// The timer sleeps until the earliest deadline; moving a deadline earlier
// cancels the wait, whose handler re-arms it (one wait is ever outstanding).
void HttpConnection::SetDeadline(Clock::time_point* which, Clock::time_point when) {
  *which = when;
  if (when < timer_.expiry()) timer_.expires_at(when);
}

void HttpConnection::WaitTimer() {
  timer_.expires_at(std::min(read_deadline_, write_deadline_));
  timer_.async_wait([self = shared_from_this()](boost::system::error_code) { self->OnTimer(); });
}

void HttpConnection::OnTimer() {
  if (state_ == State::kClosed) return;
  auto now = Clock::now();
  if (write_deadline_ <= now) {
    STRATA_LOG(DEBUG) << "http: write to " << remote_ << " timed out";
    Close();
    return;
  }
  if (read_deadline_ <= now) {
    if (state_ == State::kReading && request_started_ && !write_in_progress_) {
      RespondError(408,
                   "the request was not received within " +
                       std::to_string(core_->options.read_timeout.count()) + " ms",
                   "invalid_request_error", true);
    } else if (state_ == State::kReading || state_ == State::kLingering) {
      Close();
      return;
    }
  }
  WaitTimer();
}

void HttpConnection::BeginLinger() {
  state_ = State::kLingering;
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    Close();
    return;
  }
  pending_.clear();
  SetDeadline(&read_deadline_,
              Clock::now() + std::min<Clock::duration>(kLingerTime, core_->options.read_timeout));
  StartRead();
}

void HttpConnection::Close() {
  if (state_ == State::kClosed) return;
  State was = state_;
  state_ = State::kClosed;
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  timer_.cancel();
  outbox_.clear();
  pending_.clear();
  reader_.Reset();
  ReleaseBody();
  if (was == State::kHandling && counted_) {
    counted_ = false;
    core_->in_flight.fetch_sub(1);
  }
  if (auto r = responder_.lock()) r->NotifyClosed();
  responder_.reset();
  core_->Unregister(this);
  core_->active.fetch_sub(1);
}

// ---- ConnectionResponder ---------------------------------------------------

ConnectionResponder::~ConnectionResponder() {
  bool answered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answered = done_;
  }
  // The connection checks whether a response was given; this is a no-op there
  // when it was, or when the connection is gone.
  if (!answered && !closed()) conn_->PostAbandon(seq_);
}

void ConnectionResponder::Send(int status, HttpHeaders headers, std::string body) {
  conn_->PostSend(seq_, status, std::move(headers), std::move(body));
}

void ConnectionResponder::StartStream(int status, HttpHeaders headers) {
  conn_->PostStartStream(seq_, status, std::move(headers));
}

void ConnectionResponder::Write(std::string chunk) {
  if (closed()) return;
  conn_->PostWrite(seq_, std::move(chunk));
}

void ConnectionResponder::End() { conn_->PostEnd(seq_); }

void ConnectionResponder::OnClose(std::function<void()> fn) {
  std::function<void()> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_.load()) {
      if (!done_) {
        old = std::exchange(on_close_, std::move(fn));
      }
      return;  // `old` and (when done) `fn` are destroyed outside the lock
    }
  }
  fn();
}

void ConnectionResponder::NotifyClosed() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || closed_.load()) return;
    closed_.store(true, std::memory_order_release);
    fn = std::move(on_close_);
    on_close_ = nullptr;
  }
  if (!fn) return;
  try {
    fn();
  } catch (const std::exception& e) {
    STRATA_LOG(ERROR) << "http: OnClose callback threw: " << e.what();
  } catch (...) {
    STRATA_LOG(ERROR) << "http: OnClose callback threw";
  }
}

void ConnectionResponder::NotifyDone() {
  std::function<void()> fn;
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  fn = std::move(on_close_);
  on_close_ = nullptr;
  // fn (destroyed after the lock is released, declared first) may hold
  // references to this responder; the caller holds one too.
}

}  // namespace strata::http_internal

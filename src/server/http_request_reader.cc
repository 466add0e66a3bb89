#include "server/http_request_reader.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace strata::http_internal {
namespace http = boost::beast::http;

namespace {

std::string_view SV(boost::core::string_view s) { return {s.data(), s.size()}; }

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return Lower(x) == Lower(y); });
}

// tchar (RFC 9110 §5.6.2): what a method is made of.
bool IsTchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The transfer codings of every Transfer-Encoding field, in order, without
// parameters; empty list elements are skipped (RFC 9110 §5.6.1).
std::vector<std::string_view> TransferCodings(
    const http::request_parser<http::empty_body>::value_type& msg) {
  std::vector<std::string_view> codings;
  for (const auto& f : msg) {
    if (f.name() != http::field::transfer_encoding) continue;
    std::string_view v = SV(f.value());
    while (!v.empty()) {
      size_t comma = v.find(',');
      std::string_view item = v.substr(0, comma);
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      item = Trim(item.substr(0, item.find(';')));
      if (!item.empty()) codings.push_back(item);
    }
  }
  return codings;
}

// "http://host:port/p?q" -> "/p?q"; origin-form and anything else unchanged.
std::string_view OriginOf(std::string_view target) {
  if (target.empty() || target.front() == '/') return target;
  // absolute-URI = scheme ":" hier-part; scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
  size_t colon = target.find("://");
  if (colon == std::string_view::npos || colon == 0) return target;
  for (size_t i = 0; i < colon; ++i) {
    char c = target[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alpha && (i == 0 || !((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.')))
      return target;
  }
  std::string_view rest = target.substr(colon + 3);
  size_t end = rest.find_first_of("/?");
  return end == std::string_view::npos ? std::string_view() : rest.substr(end);
}

}  // namespace

RequestReader::RequestReader(Limits limits) : limits_(limits) {}

RequestReader::Step RequestReader::Fail(int status, std::string message) {
  state_ = State::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  return Step::kError;
}

RequestReader::Step RequestReader::Put(std::string_view data, size_t* used) {
  *used = 0;
  switch (state_) {
    case State::kHead: {
      // The head ends at the first CRLFCRLF; only its first max_header_bytes
      // bytes are ever searched, so the verdict does not depend on how the
      // bytes were split.
      const size_t limit = limits_.max_header_bytes;
      const size_t window = std::min(data.size(), limit);
      // Bytes that cannot start a request (binary garbage, a TLS handshake)
      // are refused at once rather than after the limit or the timeout: the
      // method is a token ended by a space. A property of the prefix, so it
      // too does not depend on how the bytes were split.
      for (; !method_seen_ && method_checked_ < window; ++method_checked_) {
        const char c = data[method_checked_];
        if (c == ' ' && method_checked_ > 0) {
          method_seen_ = true;
        } else if (!IsTchar(c)) {
          return Fail(400, "malformed HTTP request: bad method");
        }
      }
      size_t from = scanned_ >= 3 ? scanned_ - 3 : 0;
      size_t end =
          window >= 4 ? data.substr(0, window).find("\r\n\r\n", from) : std::string_view::npos;
      if (end == std::string_view::npos) {
        scanned_ = window;
        if (data.size() >= limit) {
          return Fail(
              431, "request headers are larger than the " + std::to_string(limit) + "-byte limit");
        }
        return Step::kNeedMore;
      }
      const size_t head_bytes = end + 4;
      Step step = ParseHead(data.substr(0, head_bytes));
      if (step == Step::kError) return step;
      *used = head_bytes;
      return step;
    }
    case State::kBody: {
      if (head_.chunked) return PutChunked(data, used);
      if (*head_.content_length > limits_.max_body_bytes) {
        return Fail(413, "request body is larger than the " +
                             std::to_string(limits_.max_body_bytes) + "-byte limit");
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left_, data.size()));
      body_.append(data.data(), n);
      left_ -= n;
      *used = n;
      if (left_ > 0) return Step::kNeedMore;
      state_ = State::kDone;
      return Step::kDone;
    }
    case State::kDone:
      return Step::kDone;
    case State::kError:
      return Step::kError;
  }
  return Step::kError;
}

RequestReader::Step RequestReader::ParseHead(std::string_view head) {
  parser_.emplace();
  // Our own count above is the header limit; the body is ours to read.
  parser_->header_limit(std::numeric_limits<std::uint32_t>::max());
  parser_->body_limit(boost::none);
  parser_->skip(true);
  boost::system::error_code ec;
  size_t n = parser_->put(boost::asio::buffer(head.data(), head.size()), ec);
  if (ec && ec != http::error::need_more)
    return Fail(400, "malformed HTTP request: " + ec.message());
  if (!parser_->is_header_done() || n != head.size()) {
    return Fail(
        400,
        "malformed HTTP request: the head did not parse as one request line and header fields");
  }
  head_.bytes = head.size();
  // The headers are copied now: Beast later appends a chunked body's
  // trailer fields to them and edits Transfer-Encoding, and a trailer "Host"
  // or "Authorization" is not a header (RFC 9110 §6.5.1).
  const auto& msg = parser_->get();
  headers_.reserve(std::distance(msg.begin(), msg.end()));
  for (const auto& f : msg)
    headers_.emplace_back(std::string(SV(f.name_string())), std::string(SV(f.value())));
  return CheckHead();
}

RequestReader::Step RequestReader::CheckHead() {
  const auto& msg = parser_->get();
  head_.method = std::string(SV(msg.method_string()));
  head_.target = std::string(SV(msg.target()));
  head_.version = static_cast<int>(msg.version());
  head_.keep_alive = msg.keep_alive();
  head_.head_method = msg.method() == http::verb::head;
  head_.expect_continue =
      head_.version >= 11 && IEquals(Trim(SV(msg[http::field::expect])), "100-continue");

  if (head_.version >= 11) {
    size_t hosts = msg.count(http::field::host);
    if (hosts != 1) {
      return Fail(
          400,
          hosts == 0
              ? "malformed HTTP request: an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)"
              : "malformed HTTP request: more than one Host header (RFC 9112 §3.2)");
    }
  }

  std::vector<std::string_view> codings = TransferCodings(msg);
  if (msg.count(http::field::transfer_encoding) > 0) {
    std::string te;
    for (const auto& f : msg) {
      if (f.name() != http::field::transfer_encoding) continue;
      if (!te.empty()) te += ", ";
      te += SV(f.value());
    }
    if (head_.version < 11) {
      return Fail(
          400, "malformed HTTP request: Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1)");
    }
    if (codings.empty() || !IEquals(codings.back(), "chunked")) {
      return Fail(400,
                  "malformed HTTP request: Transfer-Encoding '" + te +
                      "' does not end in chunked, so the body length is unknown (RFC 9112 §6.3)");
    }
    for (size_t i = 0; i + 1 < codings.size(); ++i) {
      if (IEquals(codings[i], "chunked")) {
        return Fail(400,
                    "malformed HTTP request: Transfer-Encoding '" + te + "' applies chunked twice");
      }
    }
    if (codings.size() > 1) {
      return Fail(
          501,
          "Transfer-Encoding '" + te +
              "' is not supported: send the body uncompressed with 'Transfer-Encoding: chunked' "
              "alone or with a Content-Length");
    }
    // One coding, "chunked": Beast must agree, or body framing would differ.
    if (!parser_->chunked()) {
      return Fail(400, "malformed HTTP request: Transfer-Encoding '" + te +
                           "' could not be read as chunked");
    }
  }
  head_.chunked = parser_->chunked();
  if (auto len = parser_->content_length()) head_.content_length = *len;

  std::string_view origin = OriginOf(head_.target);
  size_t q = origin.find('?');
  head_.path = std::string(origin.substr(0, q));
  if (q != std::string_view::npos) head_.query = std::string(origin.substr(q + 1));
  if (head_.path.empty() && origin.data() != head_.target.data()) head_.path = "/";

  if (head_.has_body()) {
    state_ = State::kBody;
    left_ = head_.content_length.value_or(0);
  } else {
    state_ = State::kDone;
  }
  return Step::kHead;
}

std::string_view RequestReader::Header(std::string_view name) const {
  for (const auto& [k, v] : headers_) {
    if (IEquals(k, name)) return v;
  }
  return {};
}

// One byte at a time outside chunk data, so every verdict depends only on
// the bytes, never on how they were split.
RequestReader::Step RequestReader::PutChunked(std::string_view data, size_t* used) {
  auto bad = [&](const std::string& what) {
    return Fail(400, "malformed HTTP request: bad chunked body: " + what);
  };
  size_t i = 0;
  while (i < data.size()) {
    const char c = data[i];
    switch (chunk_) {
      case Chunk::kSize: {
        int digit = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
        if (digit >= 0) {
          if (++size_digits_ > 16) return bad("chunk size has more than 16 hex digits");
          left_ = left_ * 16 + static_cast<uint64_t>(digit);
        } else if (size_digits_ == 0) {
          return bad("a chunk size must start with a hex digit");
        } else if (c == ';' || c == ' ' || c == '\t') {
          chunk_ = Chunk::kExt;
        } else if (c == '\r') {
          chunk_ = Chunk::kSizeLF;
        } else {
          return bad("unexpected byte after the chunk size");
        }
        ++i;
        break;
      }
      case Chunk::kExt:
        if (++line_bytes_ > limits_.max_header_bytes) {
          return bad("a chunk extension is longer than " +
                     std::to_string(limits_.max_header_bytes) + " bytes");
        }
        if (c == '\r') {
          chunk_ = Chunk::kSizeLF;
        } else if (c == '\n' || c == '\0') {
          return bad("unexpected byte in a chunk extension");
        }
        ++i;
        break;
      case Chunk::kSizeLF:
        if (c != '\n') return bad("a chunk size line must end in CRLF");
        ++i;
        line_bytes_ = 0;
        size_digits_ = 0;
        if (left_ == 0) {
          chunk_ = Chunk::kLineStart;
        } else if (left_ > limits_.max_body_bytes - body_.size()) {
          *used = i;
          return Fail(413, "request body is larger than the " +
                               std::to_string(limits_.max_body_bytes) + "-byte limit");
        } else {
          chunk_ = Chunk::kData;
        }
        break;
      case Chunk::kData: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(left_, data.size() - i));
        body_.append(data.data() + i, n);
        left_ -= n;
        i += n;
        if (left_ == 0) chunk_ = Chunk::kDataCR;
        break;
      }
      case Chunk::kDataCR:
        if (c != '\r') return bad("chunk data must be followed by CRLF");
        chunk_ = Chunk::kDataLF;
        ++i;
        break;
      case Chunk::kDataLF:
        if (c != '\n') return bad("chunk data must be followed by CRLF");
        chunk_ = Chunk::kSize;
        ++i;
        break;
      case Chunk::kLineStart:  // a trailer field line, or the CRLF that ends the body
      case Chunk::kTrailer:
        if (++line_bytes_ > limits_.max_header_bytes) {
          *used = i;
          return Fail(431, "request trailers are larger than the " +
                               std::to_string(limits_.max_header_bytes) + "-byte limit");
        }
        if (c == '\r') {
          chunk_ = chunk_ == Chunk::kLineStart ? Chunk::kEndLF : Chunk::kTrailerLF;
        } else if (c == '\n' || c == '\0') {
          return bad("unexpected byte in a trailer");
        } else {
          chunk_ = Chunk::kTrailer;
        }
        ++i;
        break;
      case Chunk::kTrailerLF:
        if (c != '\n') return bad("a trailer line must end in CRLF");
        chunk_ = Chunk::kLineStart;
        ++i;
        break;
      case Chunk::kEndLF:
        if (c != '\n') return bad("the chunked body must end in CRLF");
        ++i;
        *used = i;
        state_ = State::kDone;
        return Step::kDone;
    }
  }
  *used = i;
  return Step::kNeedMore;
}

size_t RequestReader::body_size() const { return body_.size(); }

void RequestReader::ReserveBody(size_t n) { body_.reserve(std::min(n, limits_.max_body_bytes)); }

HttpRequest RequestReader::TakeRequest() {
  HttpRequest req;
  req.method = std::move(head_.method);
  req.target = std::move(head_.target);
  req.path = std::move(head_.path);
  req.query = std::move(head_.query);
  req.version = head_.version;
  req.headers = std::move(headers_);
  req.body = std::move(body_);
  Reset();
  return req;
}

void RequestReader::Reset() {
  state_ = State::kHead;
  scanned_ = 0;
  method_checked_ = 0;
  headers_.clear();
  method_seen_ = false;
  parser_.reset();
  body_ = std::string();
  left_ = 0;
  chunk_ = Chunk::kSize;
  size_digits_ = 0;
  line_bytes_ = 0;
  head_ = RequestHead();
  error_status_ = 0;
  error_message_.clear();
}

}  // namespace strata::http_internal

// Reads one HTTP/1.x request from a connection's bytes, however they arrive:
// finds the end of the head (request line + header fields + blank line)
// counting the bytes itself, so the header limit is exact whether the head
// comes in one write or in 7-byte pieces; parses the head with Beast and
// checks what RFC 9112 requires of a server before any body byte is read;
// then reads the body (Content-Length, or chunked with its own decoder,
// byte by byte, so that its limits too are exact however the bytes arrive)
// within the body limit.
// No sockets, no clocks: the connection feeds bytes in and acts on the
// result, and the fuzz target (fuzz/http_head_fuzz.cc) does the same.
//
// Head checks (each an error status with a message; nothing is read past the head):
//   400  at once, when a byte that cannot be part of a method arrives before
//        the first space (binary garbage, TLS);
//   431  the head is longer than max_header_bytes (counted up to and
//        including the blank line that ends it);
//   400  malformed (Beast's parse), an HTTP/1.1 request without exactly one
//        Host (RFC 9112 §3.2), Transfer-Encoding in an HTTP/1.0 request or
//        not ending in `chunked` (§6.1, §6.3), `chunked` twice, or both
//        Transfer-Encoding and Content-Length;
//   501  Transfer-Encoding with any coding besides the final `chunked`
//        (e.g. `gzip, chunked`): we implement no other coding (§6.1).
// The request target may be origin-form ("/v1/models?x") or absolute-form
// ("http://host:8000/v1/models?x", §3.2.2): path and query come from either.
//
// Use: Put() the unconsumed input (from the request's first byte) until it
// returns kHead; inspect head(); Put() the rest until kDone; TakeRequest();
// Reset() for the next request. Not thread-safe (one per connection).
#pragma once

#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_server.h"

namespace strata::http_internal {

// What the head of a request says, once it passed the checks above.
struct RequestHead {
  std::string method;  // as sent
  std::string target;  // as sent
  std::string path;    // of the target (either form), up to '?'; "/" when absolute-form has none
  std::string query;   // after '?'
  int version = 11;    // 10 or 11
  std::optional<uint64_t> content_length;
  bool chunked = false;
  bool keep_alive = true;
  bool expect_continue = false;  // HTTP/1.1 `Expect: 100-continue`
  bool head_method = false;      // HEAD: the response has no body
  size_t bytes = 0;              // of the head, blank line included

  bool has_body() const { return chunked || content_length.value_or(0) > 0; }
};

class RequestReader {
 public:
  struct Limits {
    size_t max_header_bytes = 64 << 10;
    size_t max_body_bytes = 32 << 20;
  };
  enum class Step {
    kNeedMore,  // every byte given was used (or is kept by the caller, before the head)
    kHead,      // the head is in and valid: see head(); Put() the rest for the body
    kDone,      // the whole request is in: TakeRequest()
    kError,     // error_status(), error_message(); the reader is unusable until Reset()
  };

  explicit RequestReader(Limits limits);

  // Before the head is complete `data` must be all the input not yet used,
  // starting at the request's first byte (nothing is used until the whole
  // head is there; the reader remembers how far it has looked). *used is
  // the number of leading bytes of `data` this call consumed.
  Step Put(std::string_view data, size_t* used);

  bool head_done() const { return state_ == State::kBody || state_ == State::kDone; }
  bool done() const { return state_ == State::kDone; }
  // REQUIRES: head_done().
  const RequestHead& head() const { return head_; }
  // The first header named `name` (case-insensitive); empty if absent. REQUIRES: head_done().
  std::string_view Header(std::string_view name) const;
  // Body bytes held so far.
  size_t body_size() const;
  // Reserves room for the announced body (call once the request is accepted).
  void ReserveBody(size_t n);
  // REQUIRES: done(). Moves the request out (`remote` is left empty).
  HttpRequest TakeRequest();

  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  // Ready for the next request; frees what the last one held.
  void Reset();

 private:
  enum class State { kHead, kBody, kDone, kError };
  Step Fail(int status, std::string message);
  Step ParseHead(std::string_view head);
  Step CheckHead();

  const Limits limits_;
  State state_ = State::kHead;
  size_t scanned_ = 0;         // head bytes already searched for the blank line
  size_t method_checked_ = 0;  // head bytes checked as the method
  bool method_seen_ = false;   // the space after the method arrived
  HttpHeaders headers_;        // of the head, as sent (trailers are not headers)
  // Beast parses the head only (skip(true)); the body is read below.
  std::optional<boost::beast::http::request_parser<boost::beast::http::empty_body>> parser_;
  std::string body_;
  uint64_t left_ = 0;  // Content-Length: bytes still to come; chunked: of this chunk
  // The chunked decoder (RFC 9112 §7.1).
  enum class Chunk {
    kSize,
    kExt,
    kSizeLF,
    kData,
    kDataCR,
    kDataLF,
    kLineStart,
    kTrailer,
    kTrailerLF,
    kEndLF
  };
  Chunk chunk_ = Chunk::kSize;
  int size_digits_ = 0;
  size_t line_bytes_ = 0;  // of the chunk extension or the trailer section so far
  Step PutChunked(std::string_view data, size_t* used);
  RequestHead head_;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace strata::http_internal

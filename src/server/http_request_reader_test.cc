// RequestReader (http_request_reader.h): the exact header limit however the
// bytes arrive, RFC 9112 head checks (Host, Transfer-Encoding, absolute-form
// targets), bodies and pipelining.
#include "server/http_request_reader.h"

#include <gtest/gtest.h>

#include <string>

namespace strata::http_internal {
namespace {

using Step = RequestReader::Step;

struct Result {
  Step step = Step::kNeedMore;
  int status = 0;
  std::string message;
  RequestHead head;
  std::string body;
};

// Feeds `input` in pieces of `piece` bytes, as a connection would; stops at
// the first error or the end of the first request.
Result Read(const std::string& input, size_t piece, RequestReader::Limits limits = {}) {
  RequestReader reader(limits);
  Result r;
  std::string pending;
  for (size_t fed = 0; fed < input.size();) {
    size_t n = std::min(piece, input.size() - fed);
    pending.append(input, fed, n);
    fed += n;
    while (!pending.empty()) {
      size_t used = 0;
      Step s = reader.Put(pending, &used);
      pending.erase(0, used);
      if (s == Step::kError) {
        r.step = s;
        r.status = reader.error_status();
        r.message = reader.error_message();
        return r;
      }
      if (s == Step::kHead) r.head = reader.head();
      if (s == Step::kNeedMore) break;
      if (reader.done()) {
        r.head = reader.head();
        r.step = Step::kDone;
        r.body = reader.TakeRequest().body;
        return r;
      }
    }
  }
  r.step = reader.head_done() ? Step::kHead : Step::kNeedMore;
  return r;
}

// A GET whose head (blank line included) is exactly `bytes` long.
std::string HeadOfSize(size_t bytes) {
  std::string pre = "GET /hello HTTP/1.1\r\nHost: t\r\nX-Pad: ";
  return pre + std::string(bytes - pre.size() - 4, 'a') + "\r\n\r\n";
}

TEST(RequestReader, HeaderLimitIsExactHoweverTheBytesArrive) {
  RequestReader::Limits limits;
  limits.max_header_bytes = 64 << 10;
  for (size_t piece : {size_t{1} << 30, size_t{7}, size_t{1}, size_t{4096}}) {
    SCOPED_TRACE("pieces of " + std::to_string(piece));
    Result at = Read(HeadOfSize(64 << 10), piece, limits);
    EXPECT_EQ(at.step, Step::kDone);
    EXPECT_EQ(at.head.bytes, size_t{64} << 10);
    Result over = Read(HeadOfSize((64 << 10) + 1), piece, limits);
    EXPECT_EQ(over.step, Step::kError);
    EXPECT_EQ(over.status, 431);
    EXPECT_EQ(over.message, "request headers are larger than the 65536-byte limit");
    Result big = Read(HeadOfSize(112 << 10), piece, limits);
    EXPECT_EQ(big.status, 431);
    // A head that never ends is refused once it reaches the limit.
    Result endless = Read("GET /hello HTTP/1.1\r\nX: " + std::string(64 << 10, 'b'), piece, limits);
    EXPECT_EQ(endless.status, 431);
    Result short_endless =
        Read("GET /hello HTTP/1.1\r\nX: " + std::string(100, 'b'), piece, limits);
    EXPECT_EQ(short_endless.step, Step::kNeedMore);
  }
}

TEST(RequestReader, NothingIsConsumedBeforeTheHeadIsComplete) {
  RequestReader reader({});
  size_t used = 7;
  EXPECT_EQ(reader.Put("GET / HTTP/1.1\r\nHost: x\r\n", &used), Step::kNeedMore);
  EXPECT_EQ(used, 0u);
  EXPECT_EQ(reader.Put("GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /next", &used), Step::kHead);
  EXPECT_EQ(used, 27u);
  EXPECT_TRUE(reader.done());
  EXPECT_EQ(reader.TakeRequest().path, "/");
}

TEST(RequestReader, AbsoluteFormTargetsRouteByTheirPath) {
  Result r = Read(
      "POST http://127.0.0.1:8000/v1/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
      "Content-Length: 2\r\n\r\n{}",
      1 << 20);
  ASSERT_EQ(r.step, Step::kDone) << r.message;
  EXPECT_EQ(r.head.target, "http://127.0.0.1:8000/v1/completions?x=1");
  EXPECT_EQ(r.head.path, "/v1/completions");
  EXPECT_EQ(r.head.query, "x=1");
  EXPECT_EQ(r.body, "{}");
  r = Read("GET HTTPS://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", 1 << 20);
  EXPECT_EQ(r.head.path, "/");
  r = Read("GET http://h?q HTTP/1.1\r\nHost: h\r\n\r\n", 1 << 20);
  EXPECT_EQ(r.head.path, "/");
  EXPECT_EQ(r.head.query, "q");
  r = Read("GET /plain?a=b HTTP/1.1\r\nHost: h\r\n\r\n", 1 << 20);
  EXPECT_EQ(r.head.path, "/plain");
  EXPECT_EQ(r.head.query, "a=b");
}

TEST(RequestReader, TransferCodingsOtherThanChunkedAre501) {
  for (const char* te : {"gzip, chunked", "deflate,chunked", "x-custom ,  chunked"}) {
    Result r = Read(std::string("POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te +
                        "\r\n\r\n0\r\n\r\n",
                    1 << 20);
    EXPECT_EQ(r.status, 501) << te;
    EXPECT_NE(r.message.find(te), std::string::npos) << r.message;
  }
  // The same, over two fields.
  Result r = Read(
      "POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: "
      "chunked\r\n\r\n0\r\n\r\n",
      1 << 20);
  EXPECT_EQ(r.status, 501);
  // chunked not last: the body length is unknown (RFC 9112 §6.3: 400).
  for (const char* te : {"gzip", "chunked, gzip", "chunked, chunked", ""}) {
    r = Read(std::string("POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te + "\r\n\r\n",
             1 << 20);
    EXPECT_EQ(r.status, 400) << te;
  }
  r = Read("POST /e HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 1 << 20);
  EXPECT_EQ(r.status, 400);
  r = Read("POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
           3);
  ASSERT_EQ(r.step, Step::kDone);
  EXPECT_TRUE(r.head.chunked);
  EXPECT_EQ(r.body, "abc");
}

TEST(RequestReader, Http11NeedsExactlyOneHost) {
  Result r = Read("GET /health HTTP/1.1\r\n\r\n", 1 << 20);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.message.find("Host"), std::string::npos);
  r = Read("GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 1 << 20);
  EXPECT_EQ(r.status, 400);
  r = Read("GET /health HTTP/1.0\r\n\r\n", 1 << 20);
  EXPECT_EQ(r.step, Step::kDone);
  EXPECT_EQ(r.head.version, 10);
  EXPECT_FALSE(r.head.keep_alive);
}

TEST(RequestReader, BodiesWithinTheLimit) {
  RequestReader::Limits limits;
  limits.max_body_bytes = 10;
  for (size_t piece : {size_t{1}, size_t{5}, size_t{1000}}) {
    Result r =
        Read("POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789", piece, limits);
    ASSERT_EQ(r.step, Step::kDone);
    EXPECT_EQ(r.body, "0123456789");
    // Over the limit by Content-Length: the head is accepted (the caller
    // answers 413 in its own order); reading the body is refused.
    r = Read("POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n01234567890", piece, limits);
    EXPECT_EQ(r.status, 413);
    r = Read(
        "POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
        "chunked\r\n\r\n6\r\nabcdef\r\n5\r\nghijk\r\n0\r\n\r\n",
        piece, limits);
    EXPECT_EQ(r.status, 413);
    r = Read("POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n", piece,
             limits);
    EXPECT_EQ(r.status, 400);
  }
}

// Found by http_head_fuzz (tests/fuzz/http/crash_trailer_host.http): Beast
// appends trailer fields to the header fields, so a trailer "Host" made a
// second Host header (and a trailer "Authorization" looked like a header).
TEST(RequestReader, TrailersAreNotHeaders) {
  RequestReader reader({});
  std::string in =
      "POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "1\r\na\r\n0\r\nHost: evil\r\nAuthorization: Bearer k\r\n\r\n";
  size_t used = 0;
  ASSERT_EQ(reader.Put(in, &used), Step::kHead);
  in.erase(0, used);
  ASSERT_EQ(reader.Put(in, &used), Step::kDone);
  HttpRequest req = reader.TakeRequest();
  EXPECT_EQ(req.body, "a");
  ASSERT_EQ(req.headers.size(), 2u);
  EXPECT_EQ(req.headers[0].second, "x");
  EXPECT_EQ(req.headers[1].second, "chunked");
}

TEST(RequestReader, PipelinedRequestsAreReadOneAtATime) {
  RequestReader reader({});
  std::string in =
      "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabcGET /b "
      "HTTP/1.1\r\nHost: x\r\n\r\n";
  size_t used = 0;
  ASSERT_EQ(reader.Put(in, &used), Step::kHead);
  EXPECT_TRUE(reader.head().expect_continue);
  EXPECT_EQ(reader.head().content_length, 3u);
  EXPECT_EQ(reader.Header("content-length"), "3");
  in.erase(0, used);
  ASSERT_EQ(reader.Put(in, &used), Step::kDone);
  in.erase(0, used);
  HttpRequest a = reader.TakeRequest();
  EXPECT_EQ(a.body, "abc");
  EXPECT_EQ(a.path, "/a");
  ASSERT_EQ(reader.Put(in, &used), Step::kHead);
  EXPECT_EQ(used, in.size());
  EXPECT_TRUE(reader.done());
  EXPECT_EQ(reader.TakeRequest().path, "/b");
}

}  // namespace
}  // namespace strata::http_internal

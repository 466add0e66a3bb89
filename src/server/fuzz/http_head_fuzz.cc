// Fuzz entry point for the HTTP request reader (http_request_reader.h) and the
// API-key check (http_auth.h): any bytes are read as a stream of up to four
// pipelined requests, twice: in one piece and in pieces of 1..13 bytes (the
// size varies with the input). Checks, besides "no crash, no sanitizer
// report":
//   - the two readings agree exactly (every head, body and error status):
//     how the bytes arrive never changes the answer;
//   - before the head is complete nothing is consumed; a head is never
//     longer than the header limit, a body never longer than the body limit
//     (and exactly its Content-Length);
//   - an accepted HTTP/1.1 request has exactly one Host; a chunked one has a
//     Transfer-Encoding of exactly "chunked" and no Content-Length;
//   - errors are 400, 413, 431 or 501, with a message;
//   - CheckBearer accepts exactly "Bearer <key>" (any case, any spaces) and
//     ConstantTimeEquals agrees with ==.
//
// Built as a libFuzzer binary under clang (http_head_fuzz.cmake, which
// defines STRATA_LIBFUZZER) and, under any compiler, run over the seed corpus
// tests/fuzz/http/ plus mutations by http_head_fuzz_test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/http_auth.h"
#include "server/http_request_reader.h"

namespace strata {

int FuzzHttpRequestHead(const uint8_t* data, size_t size);

namespace {

#define FUZZ_CHECK(cond)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "http_head_fuzz: check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                    \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

using http_internal::RequestReader;

constexpr size_t kMaxHeader = 256;
constexpr size_t kMaxBody = 256;
constexpr std::string_view kKey = "sk-fuzz-key";

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return Lower(x) == Lower(y); });
}

void CheckAuth(std::string_view value) {
  BearerCheck c = CheckBearer(value, kKey);
  std::string_view v = value;
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  bool expect_ok = false;
  if (v.size() > 7 && IEquals(v.substr(0, 6), "bearer") && (v[6] == ' ' || v[6] == '\t')) {
    std::string_view rest = v.substr(7);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    expect_ok = rest == kKey;
  }
  FUZZ_CHECK((c == BearerCheck::kOk) == expect_ok);
  FUZZ_CHECK((c == BearerCheck::kMissing) == v.empty());
  for (size_t cut : {size_t{0}, value.size() / 2, value.size()}) {
    std::string_view a = value.substr(0, cut), b = value.substr(cut);
    FUZZ_CHECK(ConstantTimeEquals(a, b) == (a == b));
    FUZZ_CHECK(ConstantTimeEquals(a, a));
  }
}

// Reads `input` fed in pieces of `piece` bytes; returns a transcript.
std::string Read(std::string_view input, size_t piece) {
  RequestReader reader({kMaxHeader, kMaxBody});
  std::string pending, log;
  size_t fed = 0;
  int requests = 0;
  for (;;) {
    const bool more = fed < input.size();
    if (more) {
      size_t n = std::min(piece, input.size() - fed);
      pending.append(input.substr(fed, n));
      fed += n;
    }
    for (bool progress = true; progress && !pending.empty();) {
      progress = false;
      size_t used = 0;
      const bool head_was_done = reader.head_done();
      RequestReader::Step step = reader.Put(pending, &used);
      FUZZ_CHECK(used <= pending.size());
      if (!head_was_done && step != RequestReader::Step::kHead) FUZZ_CHECK(used == 0);
      pending.erase(0, used);
      switch (step) {
        case RequestReader::Step::kError: {
          int s = reader.error_status();
          FUZZ_CHECK(s == 400 || s == 413 || s == 431 || s == 501);
          FUZZ_CHECK(!reader.error_message().empty());
          return log + "error " + std::to_string(s) + "\n";
        }
        case RequestReader::Step::kNeedMore:
          break;
        case RequestReader::Step::kHead: {
          const auto& h = reader.head();
          FUZZ_CHECK(h.bytes == used && h.bytes >= 4 && h.bytes <= kMaxHeader);
          FUZZ_CHECK(h.version == 10 || h.version == 11);
          FUZZ_CHECK(!(h.chunked && h.content_length));
          FUZZ_CHECK(!h.chunked || h.version == 11);
          FUZZ_CHECK(!h.path.empty() || h.target.empty() || h.target[0] != '/');
          CheckAuth(reader.Header("authorization"));
          log += "head " + h.method + " [" + h.target + "] [" + h.path + "] [" + h.query + "] " +
                 std::to_string(h.version) +
                 " cl=" + (h.content_length ? std::to_string(*h.content_length) : "-") +
                 " chunked=" + std::to_string(h.chunked) + " ka=" + std::to_string(h.keep_alive) +
                 " expect=" + std::to_string(h.expect_continue) +
                 " bytes=" + std::to_string(h.bytes) + "\n";
          progress = true;
          if (!reader.done()) break;
          [[fallthrough]];
        }
        case RequestReader::Step::kDone: {
          const bool chunked = reader.head().chunked;
          const auto cl = reader.head().content_length;
          HttpRequest req = reader.TakeRequest();
          FUZZ_CHECK(req.body.size() <= kMaxBody);
          if (cl) FUZZ_CHECK(req.body.size() == *cl);
          if (!cl && !chunked) FUZZ_CHECK(req.body.empty());
          size_t hosts = 0, te = 0;
          for (const auto& [name, value] : req.headers) {
            if (IEquals(name, "host")) ++hosts;
            if (IEquals(name, "transfer-encoding")) ++te;
          }
          if (req.version == 11) FUZZ_CHECK(hosts == 1);
          FUZZ_CHECK(te == 0 || chunked);
          FUZZ_CHECK(!reader.head_done());
          log += "body " + std::to_string(req.body.size()) + " [" + req.body + "]\n";
          if (++requests == 4) return log;
          progress = true;
          break;
        }
      }
    }
    if (!more) break;
  }
  return log + "need more\n";
}

}  // namespace

int FuzzHttpRequestHead(const uint8_t* data, size_t size) {
  if (size > 2048) return 0;  // the limits are small; longer inputs find nothing new
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string whole = Read(input, input.size() + 1);
  // One split per input, varying with it (1..13 bytes): cheaper than several
  // fixed ones, and over many inputs it tries them all.
  const size_t piece = 1 + size % 13;
  const std::string pieces = Read(input, piece);
  if (whole != pieces) {
    std::fprintf(stderr,
                 "http_head_fuzz: the reading depends on how the bytes arrive\n"
                 "--- one piece:\n%s--- %zu-byte pieces:\n%s",
                 whole.c_str(), piece, pieces.c_str());
    std::fprintf(stderr, "--- input (hex):\n");
    for (unsigned char c : input) std::fprintf(stderr, "%02x", c);
    std::fprintf(stderr, "\n");
    std::abort();
  }
  return 0;
}

}  // namespace strata

#ifdef STRATA_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return strata::FuzzHttpRequestHead(data, size);
}
#endif

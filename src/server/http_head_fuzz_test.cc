// Runs the HTTP request-head fuzz entry point (src/server/fuzz/http_head_fuzz.cc)
// under any compiler: over the seed corpus in tests/fuzz/http/ (which holds
// every input libFuzzer found that failed a check), then over deterministic
// mutations of it (byte edits and HTTP-token splices). A failed check aborts
// the process, which fails this test and prints the check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "util/fuzz_corpus.h"

namespace strata {

int FuzzHttpRequestHead(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> LoadCorpus() { return LoadFuzzCorpus("http"); }

void RunOne(const std::string& input) {
  FuzzHttpRequestHead(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const std::vector<std::string> tokens = {"\r\n",
                                                  "\r\n\r\n",
                                                  "\n",
                                                  " ",
                                                  "\t",
                                                  ":",
                                                  ",",
                                                  ";",
                                                  "Host: x\r\n",
                                                  "Content-Length: 3\r\n",
                                                  "Transfer-Encoding: chunked\r\n",
                                                  "Transfer-Encoding: gzip, chunked\r\n",
                                                  "Transfer-Encoding: gzip\r\n",
                                                  "Expect: 100-continue\r\n",
                                                  "Connection: close\r\n",
                                                  "Authorization: Bearer sk-fuzz-key\r\n",
                                                  "Authorization: BEARER sk-fuzz-ke\r\n",
                                                  "http://h:1",
                                                  "?",
                                                  "/",
                                                  "HTTP/1.0",
                                                  "HTTP/1.1",
                                                  "0\r\n\r\n",
                                                  "5\r\nhello\r\n",
                                                  "ffffffffffffffff",
                                                  "-1",
                                                  std::string(1, '\0'),
                                                  "\xff",
                                                  std::string(300, 'a')};
  int edits = 1 + rng() % 4;
  for (int e = 0; e < edits; ++e) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 4) {
      case 0:
        if (pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        s.insert(pos, tokens[rng() % tokens.size()]);
        break;
      case 2:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 8);
        break;
      default:
        if (pos < s.size()) s.insert(pos, s.substr(pos, 1 + rng() % 32));
        break;
    }
  }
  return s;
}

TEST(HttpHeadFuzz, SeedCorpus) {
  std::vector<std::string> corpus = LoadCorpus();
  ASSERT_GE(corpus.size(), 20u);
  for (const std::string& input : corpus) RunOne(input);
}

TEST(HttpHeadFuzz, RandomMutationsOfTheCorpus) {
  std::vector<std::string> corpus = LoadCorpus();
  ASSERT_FALSE(corpus.empty());
  std::mt19937_64 rng(20261201);
  for (int i = 0; i < 4000; ++i) {
    std::string input = corpus[rng() % corpus.size()];
    int rounds = 1 + rng() % 3;
    for (int r = 0; r < rounds; ++r) input = Mutate(std::move(input), rng);
    RunOne(input);
  }
}

}  // namespace
}  // namespace strata

// Runs the model-file fuzz entry points (model_fuzz.h) under any compiler:
// over each seed corpus in tests/fuzz/<target>/ (the real fixtures plus a
// regression seed per bug the fuzzers found), then over deterministic byte
// mutations of it. A failed FUZZ_CHECK aborts, which fails the test with the
// check printed; a crash or sanitizer report (in a sanitizer build) likewise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/fuzz/model_fuzz.h"
#include "util/fuzz_corpus.h"

namespace strata::fuzz {
namespace {

using Entry = int (*)(const uint8_t*, size_t);

struct Target {
  const char* corpus;  // folder under tests/fuzz
  Entry entry;
  int mutations;
};

std::vector<std::string> LoadCorpus(const std::string& name) { return LoadFuzzCorpus(name); }

void RunOne(Entry entry, const std::string& input) {
  entry(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

// Byte edits that stress parsers: overwrite, insert a structural token,
// delete a run, duplicate a run, truncate.
std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const std::vector<std::string> tokens = {"\"",
                                                  "{",
                                                  "}",
                                                  "[",
                                                  "]",
                                                  ",",
                                                  ":",
                                                  "null",
                                                  "-1",
                                                  "1e309",
                                                  "18446744073709551615",
                                                  "\\u0000",
                                                  "\xff",
                                                  "\xc3",
                                                  "{{",
                                                  "}}",
                                                  "{%",
                                                  "%}",
                                                  "{#",
                                                  "(",
                                                  ")",
                                                  "|",
                                                  "~",
                                                  "*",
                                                  "**",
                                                  "for x in range(99999)",
                                                  "endfor",
                                                  "if",
                                                  "endif",
                                                  "not ",
                                                  "\n",
                                                  "\x00"};
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0:
        if (pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        s.insert(pos, tokens[rng() % tokens.size()]);
        break;
      case 2:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 16);
        break;
      case 3:
        if (pos < s.size()) s.insert(pos, s.substr(pos, 1 + rng() % 64));
        break;
      default:
        if (rng() % 4 == 0) s.resize(pos);
        break;
    }
  }
  return s;
}

class ModelFuzzReplay : public ::testing::TestWithParam<Target> {};

TEST_P(ModelFuzzReplay, SeedCorpus) {
  std::vector<std::string> corpus = LoadCorpus(GetParam().corpus);
  ASSERT_GE(corpus.size(), 3u) << GetParam().corpus;
  for (const std::string& input : corpus) RunOne(GetParam().entry, input);
}

TEST_P(ModelFuzzReplay, MutationsOfTheCorpus) {
  std::vector<std::string> corpus = LoadCorpus(GetParam().corpus);
  ASSERT_FALSE(corpus.empty());
  std::mt19937_64 rng(20261201);  // fixed: the test is deterministic
  for (int i = 0; i < GetParam().mutations; ++i) {
    std::string input = corpus[rng() % corpus.size()];
    for (int r = 1 + static_cast<int>(rng() % 3); r > 0; --r) input = Mutate(std::move(input), rng);
    RunOne(GetParam().entry, input);
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, ModelFuzzReplay,
                         ::testing::Values(Target{"safetensors", &SafetensorsOneInput, 3000},
                                           Target{"safetensors_index", &SafetensorsIndexOneInput,
                                                  3000},
                                           Target{"hf_config", &HfConfigOneInput, 3000},
                                           Target{"tokenizer", &TokenizerOneInput, 300},
                                           Target{"jinja", &JinjaOneInput, 2000}),
                         [](const auto& info) { return std::string(info.param.corpus); });

}  // namespace
}  // namespace strata::fuzz

// Runs the libFuzzer entry point (src/server/fuzz/request_fuzz.cc) under any
// compiler: over the seed corpus in tests/fuzz/openai/, then over a few
// thousand deterministic mutations of it (byte edits and JSON-aware field
// replacements). A failed check in the entry point aborts the process, which
// fails this test and prints the check; the input is written to stderr first.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "util/fuzz_corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

std::vector<std::string> LoadCorpus() { return LoadFuzzCorpus("openai"); }

void RunOne(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

// Values of every JSON type and the edges of the documented ranges.
const std::vector<Json>& InterestingValues() {
  static const std::vector<Json> values = [] {
    std::vector<Json> v = {nullptr,
                           true,
                           false,
                           0,
                           1,
                           -1,
                           2,
                           -2,
                           20,
                           21,
                           128,
                           129,
                           2147483647,
                           2147483648LL,
                           -9223372036854775807LL - 1,
                           18446744073709551615ULL,
                           0.0,
                           0.5,
                           1.0,
                           1.5,
                           2.0,
                           2.5,
                           -0.5,
                           1e-6,
                           1e300,
                           "",
                           "x",
                           "\n",
                           "停止",
                           "text",
                           "auto",
                           "none",
                           "required",
                           "user",
                           "assistant",
                           "tool",
                           "system",
                           "developer",
                           "image_url",
                           "low",
                           "default",
                           "flex",
                           "a b",
                           Json::array(),
                           Json::object()};
    v.push_back(Json::array({1, 2, 3}));
    v.push_back(Json::array({"a", ""}));
    v.push_back(Json::array({Json::array({1}), Json::array()}));
    v.push_back(Json{{"type", "text"}, {"text", "t"}});
    v.push_back(Json{{"type", "json_object"}});
    v.push_back(Json{{"include_usage", true}});
    v.push_back(Json{{"continuous_usage_stats", true}});
    v.push_back(Json::array({"text", "audio"}));
    v.push_back(Json{{"k", "v"}});
    v.push_back(Json::array({Json{{"role", "user"}, {"content", "hi"}}}));
    v.push_back(Json::array({Json{{"type", "function"}, {"function", Json{{"name", "f"}}}}}));
    v.push_back(Json::array({Json{{"function", Json{{"name", "f"}, {"arguments", "{\"a\":"}}}}}));
    return v;
  }();
  return values;
}

// Every field either endpoint knows (one list: openai_protocol's), plus one
// it does not.
const std::vector<std::string>& FieldNames() {
  static const std::vector<std::string> names = [] {
    std::set<std::string> all;
    for (bool chat : {false, true})
      for (std::string& f : KnownRequestFields(chat)) all.insert(std::move(f));
    std::vector<std::string> v(all.begin(), all.end());
    v.push_back("unknown_field");
    return v;
  }();
  return names;
}

// Replaces a random value somewhere inside j (objects and arrays, any depth).
void MutateJson(Json& j, std::mt19937_64& rng) {
  const auto& values = InterestingValues();
  Json* node = &j;
  for (int depth = 0; depth < 4; ++depth) {
    if (node->is_object() && !node->empty() && rng() % 3 != 0) {
      auto it = node->begin();
      std::advance(it, rng() % node->size());
      node = &it.value();
    } else if (node->is_array() && !node->empty() && rng() % 3 != 0) {
      node = &(*node)[rng() % node->size()];
    } else {
      break;
    }
  }
  if (node->is_object() && rng() % 2 == 0) {
    (*node)[FieldNames()[rng() % FieldNames().size()]] = values[rng() % values.size()];
  } else if (node->is_object() && !node->empty() && rng() % 3 == 0) {
    auto it = node->begin();
    std::advance(it, rng() % node->size());
    node->erase(it);
  } else {
    *node = values[rng() % values.size()];
  }
}

std::string MutateBytes(std::string s, std::mt19937_64& rng) {
  static const std::vector<std::string> tokens = {
      "\"", "{",     "}",       "[",       "]",    ",",    ":",  "null",
      "-1", "1e309", "\\u0000", "\\ud800", "\xff", "\xc3", "0.", "\"stop\":"};
  int edits = 1 + rng() % 4;
  for (int e = 0; e < edits; ++e) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 4) {
      case 0:
        if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        s.insert(pos, tokens[rng() % tokens.size()]);
        break;
      case 2:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 8);
        break;
      default:
        if (pos < s.size()) s.insert(pos, s.substr(pos, 1 + rng() % 16));
        break;
    }
  }
  return s;
}

TEST(RequestFuzz, SeedCorpus) {
  std::vector<std::string> corpus = LoadCorpus();
  ASSERT_GE(corpus.size(), 10u);
  for (const std::string& input : corpus) RunOne(input);
}

TEST(RequestFuzz, RandomMutationsOfTheCorpus) {
  std::vector<std::string> corpus = LoadCorpus();
  ASSERT_FALSE(corpus.empty());
  std::mt19937_64 rng(20261130);
  for (int i = 0; i < 4000; ++i) {
    const std::string& seed = corpus[rng() % corpus.size()];
    std::string input;
    Json j = Json::parse(seed, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && rng() % 4 != 0) {
      int rounds = 1 + rng() % 3;
      for (int r = 0; r < rounds; ++r) MutateJson(j, rng);
      input = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    } else {
      input = MutateBytes(seed, rng);
    }
    RunOne(input);
  }
}

}  // namespace
}  // namespace strata

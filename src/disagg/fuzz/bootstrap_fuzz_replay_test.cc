// Runs the bootstrap-message fuzz entry point (bootstrap_fuzz.h) under any
// compiler: over the seed corpus in tests/fuzz/bootstrap/ (one valid
// payload of every message type and damaged ones), then over deterministic
// byte mutations of it. A failed FUZZ_CHECK aborts, which fails the test
// with the check printed. The corpus is what the encoder writes today
// (SeedsAreCurrent); STRATA_WRITE_FUZZ_SEEDS=1 rewrites it after a format
// change.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "disagg/bootstrap.h"
#include "disagg/fuzz/bootstrap_fuzz.h"
#include "util/fuzz_corpus.h"

namespace strata::fuzz {
namespace {

using namespace strata::disagg;

Hello SeedHello() {
  Hello h;
  h.instance_id = "0123456789abcdef";
  h.role = "decode";
  h.model = "Qwen/Qwen3-0.6B";
  h.layout.page_size = 16;
  PoolGroupSpec full;
  full.name = "full_attention";
  full.num_layers = 28;
  full.num_kv_heads = 8;
  full.head_dim = 128;
  full.dtype = DType::kBF16;
  PoolGroupSpec latent = full;
  latent.name = "latent";
  latent.num_layers = 2;
  latent.num_kv_heads = 1;
  latent.head_dim = 576;
  latent.has_v = false;
  latent.sliding_window = 4096;
  h.layout.groups = {full, latent};
  h.num_pages = 1024;
  h.transport = "ucx";
  h.transport_descriptor = std::string("\x00\x01\x02\xfe\xff worker address", 20);
  return h;
}

// The seed corpus: name -> payload. valid_* decode; bad_* do not.
std::map<std::string, std::string> Seeds() {
  std::map<std::string, std::string> s;
  const std::string hello = EncodeMessage(SeedHello());
  s["valid_hello.json"] = hello;
  s["valid_room_ready.json"] =
      EncodeMessage(RoomReady{123456789, 1000, 2, {17, 3, 99, 4, 1073741823}});
  RoomDone done{(uint64_t{1} << 53) - 1, 151643, -0.25f, {}, 1000, 32, true, "stop"};
  done.top_logprobs = {
      {151643, -0.25f}, {11, -2.5f}, {12, -std::numeric_limits<float>::infinity()}};
  s["valid_room_done.json"] = EncodeMessage(done);
  s["valid_room_failed.json"] =
      EncodeMessage(RoomFailed{7, FailureReason::kTransferTimeout, "no KV within 30000 ms"});
  s["valid_heartbeat.json"] = EncodeMessage(Heartbeat{std::numeric_limits<uint64_t>::max()});
  s["bad_empty.json"] = "";
  s["bad_truncated_hello.json"] = hello.substr(0, hello.size() / 2);
  s["bad_unknown_type.json"] = R"({"type":"room_abort","room":1})";
  s["bad_protocol.json"] = [&] {
    std::string x = hello;
    const std::string ours = "\"protocol\":" + std::to_string(kBootstrapProtocolVersion);
    x.replace(x.find(ours), ours.size(),
              "\"protocol\":" + std::to_string(kBootstrapProtocolVersion + 1));
    return x;
  }();
  s["bad_dst_page.json"] =
      R"({"type":"room_ready","room":1,"prompt_tokens":5,"first_page":0,"dst_pages":[-3]})";
  s["bad_number_overflow.json"] = R"({"type":"heartbeat","seq":1e400})";
  s["bad_deep.json"] = std::string(64, '[') + std::string(64, ']');
  s["bad_nul.json"] = std::string("{\"type\":\"heartbeat\",\"seq\":1}\0x", 30);
  return s;
}

void RunOne(const std::string& input) {
  BootstrapMessageOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

TEST(BootstrapFuzzReplay, SeedsAreCurrent) {
  const std::filesystem::path dir =
      std::filesystem::path(STRATA_SOURCE_DIR) / "tests/fuzz/bootstrap";
  const std::map<std::string, std::string> seeds = Seeds();
  if (std::getenv("STRATA_WRITE_FUZZ_SEEDS") != nullptr) {
    for (const auto& [name, bytes] : seeds) {
      std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
  }
  for (const auto& [name, bytes] : seeds) {
    std::ifstream in(dir / name, std::ios::binary);
    ASSERT_TRUE(in) << name << " missing: STRATA_WRITE_FUZZ_SEEDS=1 writes the corpus";
    const std::string on_disk{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    EXPECT_EQ(on_disk, bytes) << name << " differs from what the encoder writes";
  }
}

TEST(BootstrapFuzzReplay, SeedsAreWhatTheirNamesSay) {
  for (const auto& [name, bytes] : Seeds()) {
    StatusOr<Message> m = DecodeMessage(bytes);
    EXPECT_EQ(m.ok(), name.starts_with("valid_")) << name << ": " << m.status().ToString();
  }
}

TEST(BootstrapFuzzReplay, SeedCorpus) {
  const std::vector<std::string> corpus = LoadFuzzCorpus("bootstrap");
  ASSERT_GE(corpus.size(), 10u);
  for (const std::string& s : corpus) RunOne(s);
}

// Byte edits for a text format: overwrite, insert a JSON-significant byte,
// delete a run, duplicate a run, truncate, write a boundary number.
std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const char* const kTokens[] = {"-1",    "0",        "1.5",  "18446744073709551616",
                                        "1e400", "null",     "\"\"", "[]",
                                        "{}",    "\"-inf\"", "true", "\\u0000"};
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:
        if (pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        s.insert(pos, 1, "{}[]\",:0-e\\"[rng() % 11]);
        break;
      case 2:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 16);
        break;
      case 3:
        if (pos < s.size()) s.insert(pos, s.substr(pos, 1 + rng() % 32));
        break;
      case 4:
        if (rng() % 3 == 0) s.resize(pos);
        break;
      default: {
        // Replace the number or word at pos with a boundary token.
        size_t end = pos;
        while (end < s.size() && s[end] != ',' && s[end] != '}' && s[end] != ']') ++end;
        s.replace(pos, end - pos, kTokens[rng() % 12]);
        break;
      }
    }
  }
  return s;
}

TEST(BootstrapFuzzReplay, MutationsOfTheCorpus) {
  const std::vector<std::string> corpus = LoadFuzzCorpus("bootstrap");
  ASSERT_FALSE(corpus.empty());
  std::mt19937_64 rng(20261202);  // fixed: the test is deterministic
  for (int i = 0; i < 20000; ++i) {
    std::string input = corpus[rng() % corpus.size()];
    for (int r = 1 + static_cast<int>(rng() % 3); r > 0; --r) input = Mutate(std::move(input), rng);
    RunOne(input);
  }
}

}  // namespace
}  // namespace strata::fuzz

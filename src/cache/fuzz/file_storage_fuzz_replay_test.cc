// Runs the storage-file fuzz entry point (cache_fuzz.h) under any compiler:
// over the seed corpus in tests/fuzz/file_storage/ (valid files of the two
// fuzz layouts and damaged ones), then over deterministic byte mutations of
// it. A failed FUZZ_CHECK aborts, which fails the test with the check
// printed. The corpus is what the encoder writes today (SeedsAreCurrent);
// STRATA_WRITE_FUZZ_SEEDS=1 rewrites it after a format change.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cache/file_storage.h"
#include "cache/fuzz/cache_fuzz.h"
#include "cache/radix_tree.h"
#include "util/fuzz_corpus.h"

namespace strata::fuzz {
namespace {

using Bytes = std::vector<uint8_t>;

// A valid file of fuzz layout `li` with `pages` pages, deterministic bytes.
Bytes ValidFile(int li, int pages, int32_t token_base) {
  const FuzzStorageLayout& l = FileStorageFuzzLayout(li);
  std::vector<int32_t> tokens;
  for (int i = 0; i < pages * l.layout.page_size; ++i) tokens.push_back(token_base + 3 * i);
  uint64_t h = RadixTree::kRootHash;
  for (int p = 0; p < pages; ++p) {
    h = RadixTree::ChainPageHash(
        h, std::span<const int32_t>(tokens).subspan(static_cast<size_t>(p * l.layout.page_size),
                                                    static_cast<size_t>(l.layout.page_size)));
  }
  Bytes payload(static_cast<size_t>(pages) * l.layout.BytesPerPage());
  std::mt19937 rng(static_cast<uint32_t>(li * 100 + pages));
  for (auto& b : payload) b = static_cast<uint8_t>(rng());
  return EncodeStorageFile(l.ns, l.layout, {RadixTree::kRootHash, h, pages}, tokens, payload);
}

// The seed corpus: name → bytes. valid_* parse under their layout; bad_*
// under neither.
std::map<std::string, Bytes> Seeds() {
  std::map<std::string, Bytes> s;
  s["valid_a_1page.kv"] = ValidFile(0, 1, 100);
  s["valid_a_3pages.kv"] = ValidFile(0, 3, 5000);
  s["valid_b_1page.kv"] = ValidFile(1, 1, 7);
  s["valid_b_4pages.kv"] = ValidFile(1, 4, 151000);
  const Bytes a = ValidFile(0, 2, 42);
  const Bytes b = ValidFile(1, 2, 42);
  const uint64_t hb =
      StorageHeaderBytes(FileStorageFuzzLayout(1).ns, FileStorageFuzzLayout(1).layout);
  s["bad_zero_length.kv"] = {};
  s["bad_truncated_header.kv"] = Bytes(b.begin(), b.begin() + 40);
  s["bad_truncated_tokens.kv"] = Bytes(b.begin(), b.begin() + static_cast<long>(hb) + 6);
  s["bad_truncated_payload.kv"] = Bytes(a.begin(), a.end() - 100);
  Bytes x = b;
  x[x.size() - 20] ^= 0x04;
  s["bad_flipped_payload.kv"] = x;
  x = b;
  x[hb + 2] ^= 0x01;
  s["bad_flipped_token.kv"] = x;
  x = a;
  x[0] = 'Z';
  s["bad_magic.kv"] = x;
  x = a;
  x[8] = 2;
  s["bad_version.kv"] = x;
  x = b;
  x[48 + 5] = 'c';  // "fuzz-c": another namespace (header checksum left as it was)
  s["bad_namespace.kv"] = x;
  KvLayout other = FileStorageFuzzLayout(1).layout;
  other.groups[1].head_dim = 16;  // same namespace, another layout
  s["bad_layout.kv"] = EncodeStorageFile("fuzz-b", other, {1, 2, 1}, std::vector<int32_t>(2, 0),
                                         Bytes(other.BytesPerPage(), 9));
  x = a;
  x.push_back(0);
  s["bad_appended_byte.kv"] = x;
  return s;
}

void RunOne(const Bytes& input) { FileStorageOneInput(input.data(), input.size()); }

TEST(FileStorageFuzzReplay, SeedsAreCurrent) {
  const std::filesystem::path dir =
      std::filesystem::path(STRATA_SOURCE_DIR) / "tests/fuzz/file_storage";
  const std::map<std::string, Bytes> seeds = Seeds();
  if (std::getenv("STRATA_WRITE_FUZZ_SEEDS") != nullptr) {
    for (const auto& [name, bytes] : seeds) {
      std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
  }
  for (const auto& [name, bytes] : seeds) {
    std::ifstream in(dir / name, std::ios::binary);
    ASSERT_TRUE(in) << name << " missing: STRATA_WRITE_FUZZ_SEEDS=1 writes the corpus";
    const Bytes on_disk{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    EXPECT_EQ(on_disk, bytes) << name << " differs from what the encoder writes";
  }
}

TEST(FileStorageFuzzReplay, SeedsAreWhatTheirNamesSay) {
  for (const auto& [name, bytes] : Seeds()) {
    int accepted = 0;
    for (int i = 0; i < 2; ++i) {
      const FuzzStorageLayout& l = FileStorageFuzzLayout(i);
      auto v = ParseStorageFile(bytes, l.ns, l.layout);
      if (v.ok()) {
        ++accepted;
      } else {
        EXPECT_EQ(v.status().code(), StatusCode::kDataLoss) << name;
      }
    }
    EXPECT_EQ(accepted, name.starts_with("valid_") ? 1 : 0) << name;
  }
}

TEST(FileStorageFuzzReplay, SeedCorpus) {
  const std::vector<std::string> corpus = LoadFuzzCorpus("file_storage");
  ASSERT_GE(corpus.size(), 10u);
  for (const std::string& s : corpus) RunOne(Bytes(s.begin(), s.end()));
}

// Byte edits for a binary format: overwrite, flip a bit, insert, delete a
// run, duplicate a run, truncate, write a boundary integer.
Bytes Mutate(Bytes s, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 7) {
      case 0:
        if (pos < s.size()) s[pos] = static_cast<uint8_t>(rng());
        break;
      case 1:
        if (pos < s.size()) s[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 2:
        s.insert(s.begin() + static_cast<long>(pos), static_cast<uint8_t>(rng()));
        break;
      case 3:
        if (pos < s.size()) {
          s.erase(s.begin() + static_cast<long>(pos),
                  s.begin() + static_cast<long>(std::min(s.size(), pos + 1 + rng() % 64)));
        }
        break;
      case 4:
        if (pos < s.size()) {
          const Bytes run(s.begin() + static_cast<long>(pos),
                          s.begin() + static_cast<long>(std::min(s.size(), pos + 1 + rng() % 64)));
          s.insert(s.begin() + static_cast<long>(pos), run.begin(), run.end());
        }
        break;
      case 5:
        if (rng() % 3 == 0) s.resize(pos);
        break;
      default: {
        static const uint32_t kInts[] = {0,          1,          2,        0x7fffffff,
                                         0x80000000, 0xffffffff, 1u << 20, (1u << 20) + 1};
        const uint32_t v = kInts[rng() % 8];
        for (int i = 0; i < 4 && pos + static_cast<size_t>(i) < s.size(); ++i) {
          s[pos + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
        }
        break;
      }
    }
  }
  return s;
}

TEST(FileStorageFuzzReplay, MutationsOfTheCorpus) {
  const std::vector<std::string> corpus = LoadFuzzCorpus("file_storage");
  ASSERT_FALSE(corpus.empty());
  std::mt19937_64 rng(20261202);  // fixed: the test is deterministic
  for (int i = 0; i < 20000; ++i) {
    const std::string& base = corpus[rng() % corpus.size()];
    Bytes input(base.begin(), base.end());
    for (int r = 1 + static_cast<int>(rng() % 3); r > 0; --r) input = Mutate(std::move(input), rng);
    RunOne(input);
  }
}

}  // namespace
}  // namespace strata::fuzz

#include "cache/file_storage.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/radix_tree.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Two pool groups, one K-only (an MLA-like latent), page size 2.
KvLayout TwoGroupLayout() {
  KvLayout l;
  l.page_size = 2;
  PoolGroupSpec full;
  full.name = "full_attention";
  full.num_layers = 2;
  full.num_kv_heads = 2;
  full.head_dim = 4;
  full.dtype = DType::kBF16;
  PoolGroupSpec latent;
  latent.name = "latent";
  latent.num_layers = 3;
  latent.num_kv_heads = 1;
  latent.head_dim = 8;
  latent.dtype = DType::kF16;
  latent.has_v = false;
  l.groups = {full, latent};
  return l;
}

KvLayout OtherLayout() {  // same page size and groups, one head dim differs
  KvLayout l = TwoGroupLayout();
  l.groups[1].head_dim = 16;
  return l;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "file_storage_test.XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A host pool in ordinary memory, laid out like HostKvPool (KvPoolMemory).
class HostMem {
 public:
  HostMem(const KvLayout& layout, int64_t pages) : layout_(layout) {
    mem_.num_pages = pages;
    mem_.layout = &layout_;
    for (size_t g = 0; g < layout_.groups.size(); ++g) {
      buf_.emplace_back(layout_.BytesPerPage(static_cast<int>(g)) * static_cast<size_t>(pages));
    }
    for (auto& b : buf_) mem_.group_base.push_back(b.data());
  }
  const KvPoolMemory& mem() const { return mem_; }
  // Every byte of `page` from `seed`, distinct per (group, layer, tensor).
  void Fill(int32_t page, uint32_t seed) {
    ForEachPiece(page, [&](int g, int layer, int tensor, char* p, size_t n) {
      std::mt19937 rng(seed * 7919u + static_cast<uint32_t>(g * 100 + layer * 10 + tensor));
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(rng());
    });
  }
  std::vector<char> Bytes(int32_t page) const {
    std::vector<char> out;
    ForEachPiece(page, [&](int, int, int, char* p, size_t n) { out.insert(out.end(), p, p + n); });
    return out;
  }
  // The file payload order: group, layer, tensor, then the run's pages.
  std::vector<uint8_t> Payload(const std::vector<int32_t>& pages) const {
    std::vector<uint8_t> out;
    for (size_t g = 0; g < layout_.groups.size(); ++g) {
      const size_t n = layout_.BytesPerPagePerTensor(static_cast<int>(g));
      for (int layer = 0; layer < layout_.groups[g].num_layers; ++layer) {
        for (int t = 0; t < (layout_.groups[g].has_v ? 2 : 1); ++t) {
          for (int32_t p : pages) {
            const char* s = mem_.PagePtr(static_cast<int>(g), layer, t, p);
            out.insert(out.end(), s, s + n);
          }
        }
      }
    }
    return out;
  }

 private:
  void ForEachPiece(int32_t page,
                    const std::function<void(int, int, int, char*, size_t)>& f) const {
    for (size_t g = 0; g < layout_.groups.size(); ++g) {
      for (int layer = 0; layer < layout_.groups[g].num_layers; ++layer) {
        for (int t = 0; t < (layout_.groups[g].has_v ? 2 : 1); ++t) {
          f(static_cast<int>(g), layer, t, mem_.PagePtr(static_cast<int>(g), layer, t, page),
            layout_.BytesPerPagePerTensor(static_cast<int>(g)));
        }
      }
    }
  }
  KvLayout layout_;
  std::vector<std::vector<char>> buf_;
  KvPoolMemory mem_;
};

// A token sequence and its chained page hashes.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> hashes;  // hashes[i]: after page i
  Seq(int pages, int page_size, int32_t base, uint64_t start = RadixTree::kRootHash)
      : start(start) {
    for (int i = 0; i < pages * page_size; ++i) tokens.push_back(base + i);
    Rehash(page_size);
  }
  void Rehash(int page_size) {
    hashes.clear();
    uint64_t h = start;
    for (size_t p = 0; p * page_size < tokens.size(); ++p) {
      h = RadixTree::ChainPageHash(h, std::span<const int32_t>(tokens).subspan(
                                          p * page_size, static_cast<size_t>(page_size)));
      hashes.push_back(h);
    }
  }
  StorageRun Run(int from, int n) const {
    return {from == 0 ? start : hashes[static_cast<size_t>(from - 1)],
            hashes[static_cast<size_t>(from + n - 1)], n};
  }
  std::vector<int32_t> Tokens(int from, int n, int page_size) const {
    return {tokens.begin() + from * page_size, tokens.begin() + (from + n) * page_size};
  }
  uint64_t start;
};

class FileStorageTest : public ::testing::Test {
 protected:
  FileStorageTest() : layout_(TwoGroupLayout()), host_(layout_, 64) {
    for (int32_t p = 0; p < 64; ++p) host_.Fill(p, static_cast<uint32_t>(p + 1));
  }
  FileStorageOptions Options(uint64_t max_bytes = 0) const {
    FileStorageOptions o;
    o.dir = dir_.path() + "/store";
    o.namespace_id = "model-abc123";
    o.max_bytes = max_bytes;
    return o;
  }
  std::unique_ptr<FileStorage> OpenOrDie(const FileStorageOptions& o,
                                         std::shared_ptr<StorageFileSystem> f = nullptr) {
    auto s = f ? FileStorage::Open(o, layout_, f) : FileStorage::Open(o, layout_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  // Waits for `t` and returns its status; completions of other tickets that
  // Poll returned meanwhile are kept for their own Wait.
  Status Wait(FileStorage& st, FileStorage::Ticket t, FileStorage::Completion* out = nullptr) {
    EXPECT_TRUE(st.WaitFor(t, Clock::now() + std::chrono::seconds(30))) << "ticket " << t;
    for (auto& c : st.Poll()) polled_[c.ticket] = c;
    auto it = polled_.find(t);
    if (it == polled_.end()) {
      ADD_FAILURE() << "ticket " << t << " completed but not polled";
      return Internal("not polled");
    }
    if (out) *out = it->second;
    return it->second.status;
  }
  // Writes pages [from, from+n) of `seq` from host pages starting at `page0`.
  Status Write(FileStorage& st, const Seq& seq, int from, int n, int32_t page0,
               FileStorage::Completion* out = nullptr) {
    std::vector<int32_t> pages;
    for (int i = 0; i < n; ++i) pages.push_back(page0 + i);
    return Wait(st,
                st.SubmitWrite(seq.Run(from, n), seq.Tokens(from, n, layout_.page_size),
                               host_.mem(), pages),
                out);
  }
  Status Read(FileStorage& st, const Seq& seq, int from, int n, HostMem& dst, int32_t page0) {
    std::vector<int32_t> pages;
    for (int i = 0; i < n; ++i) pages.push_back(page0 + i);
    return Wait(st, st.SubmitRead(seq.Run(from, n), seq.Tokens(from, n, layout_.page_size),
                                  dst.mem(), pages));
  }
  std::string FilePath(const StorageRun& r) const {
    return Options().dir + "/" + Options().namespace_id + "/" +
           StorageFileName(r.start_hash, r.end_hash);
  }
  std::vector<std::string> FilesInNamespace() const {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(Options().dir + "/" + Options().namespace_id)) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  TempDir dir_;
  KvLayout layout_;
  HostMem host_;
  std::map<FileStorage::Ticket, FileStorage::Completion> polled_;
};

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void WriteAll(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(StorageFormat, ChecksumIsStreamingAndSeesEveryBitFlip) {
  std::vector<uint8_t> data(1000);
  std::mt19937 rng(1);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint64_t whole = StorageChecksumOf(data);
  for (int trial = 0; trial < 50; ++trial) {
    StorageChecksum c;
    size_t pos = 0;
    while (pos < data.size()) {
      const size_t n = std::min<size_t>(data.size() - pos, rng() % 70);
      c.Update(std::span<const uint8_t>(data).subspan(pos, n));
      pos += n;
    }
    ASSERT_EQ(c.Final(), whole);
  }
  std::set<uint64_t> seen = {whole};
  for (size_t i = 0; i < data.size(); ++i) {
    for (int bit = 0; bit < 8; bit += 3) {
      data[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_TRUE(seen.insert(StorageChecksumOf(data)).second) << "byte " << i << " bit " << bit;
      data[i] ^= static_cast<uint8_t>(1u << bit);
    }
  }
  // Length is part of it: trailing zeros and prefixes differ.
  std::vector<uint8_t> zeros(64, 0);
  std::set<uint64_t> lens;
  for (size_t n = 0; n <= zeros.size(); ++n)
    lens.insert(StorageChecksumOf(std::span(zeros).first(n)));
  EXPECT_EQ(lens.size(), zeros.size() + 1);
}

TEST(StorageFormat, FileNamesRoundTripAndRejectOthers) {
  const std::string name = StorageFileName(0x0123456789abcdefull, 0xfedcba9876543210ull);
  EXPECT_EQ(name, "fedcba9876543210-0123456789abcdef.kv");
  uint64_t s = 0, e = 0;
  ASSERT_TRUE(ParseStorageFileName(name, &s, &e));
  EXPECT_EQ(s, 0x0123456789abcdefull);
  EXPECT_EQ(e, 0xfedcba9876543210ull);
  for (const char* bad :
       {"FEDCBA9876543210-0123456789abcdef.kv", "fedcba9876543210-0123456789abcdef.kv.tmp",
        "fedcba9876543210_0123456789abcdef.kv", "fedcba987654321-0123456789abcdef.kv",
        "fedcba9876543210-0123456789abcdeg.kv", "", "x.kv"}) {
    EXPECT_FALSE(ParseStorageFileName(bad, &s, &e)) << bad;
  }
}

TEST(StorageFormat, ParseRejectsEveryDefectWithDataLoss) {
  const KvLayout layout = TwoGroupLayout();
  Seq seq(2, layout.page_size, 100);
  std::vector<uint8_t> payload(2 * layout.BytesPerPage());
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 31);
  const std::vector<uint8_t> good =
      EncodeStorageFile("ns", layout, seq.Run(0, 2), seq.tokens, payload);
  ASSERT_EQ(good.size(), StorageFileBytes("ns", layout, 2));
  auto v = ParseStorageFile(good, "ns", layout);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->tokens, seq.tokens);
  EXPECT_EQ(v->header.start_hash, RadixTree::kRootHash);
  EXPECT_EQ(v->header.end_hash, seq.hashes[1]);
  EXPECT_TRUE(std::equal(v->payload.begin(), v->payload.end(), payload.begin(), payload.end()));

  auto expect_loss = [&](std::vector<uint8_t> bytes, std::string_view ns, const KvLayout& l,
                         const std::string& what, const std::string& needle) {
    auto r = ParseStorageFile(bytes, ns, l);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what;
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << what << ": " << r.status().message();
  };
  // Every single byte flipped anywhere is caught.
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> b = good;
    b[i] ^= 0x40;
    ASSERT_FALSE(ParseStorageFile(b, "ns", layout).ok()) << "byte " << i;
  }
  // Every truncation, including zero length.
  for (size_t n = 0; n < good.size(); ++n) {
    ASSERT_FALSE(ParseStorageFile(std::span(good).first(n), "ns", layout).ok()) << n;
  }
  std::vector<uint8_t> b = good;
  b[0] = 'X';
  expect_loss(b, "ns", layout, "magic", "magic");
  b = good;
  b[8] = 2;
  expect_loss(b, "ns", layout, "version", "format version 2");
  expect_loss(good, "nt", layout, "namespace", "namespace 'ns', expected 'nt'");
  expect_loss(good, "ns2", layout, "namespace length", "namespace");
  expect_loss(good, "ns", OtherLayout(), "layout", "foreign layout: pool group 1");
  KvLayout ps = layout;
  ps.page_size = 4;
  expect_loss(good, "ns", ps, "page size", "page size 2");
  b = good;
  b.push_back(0);
  expect_loss(b, "ns", layout, "longer", "oversized");
  b = good;
  b[b.size() - 20] ^= 1;  // payload
  expect_loss(b, "ns", layout, "payload", "checksum mismatch");
}

TEST_F(FileStorageTest, WriteReadRoundTripHasExactBytes) {
  auto st = OpenOrDie(Options());
  ASSERT_NE(st, nullptr);
  Seq seq(3, layout_.page_size, 1000);
  const std::vector<int32_t> src = {5, 1, 7};
  FileStorage::Completion wc;
  ASSERT_TRUE(Wait(*st, st->SubmitWrite(seq.Run(0, 3), seq.tokens, host_.mem(), src), &wc).ok());
  EXPECT_FALSE(wc.is_read);
  const uint64_t file_bytes = StorageFileBytes(Options().namespace_id, layout_, 3);
  EXPECT_EQ(wc.bytes, file_bytes);
  // The file is exactly the format's encoding of those pages.
  EXPECT_EQ(ReadAll(FilePath(seq.Run(0, 3))),
            EncodeStorageFile(Options().namespace_id, layout_, seq.Run(0, 3), seq.tokens,
                              host_.Payload(src)));
  EXPECT_EQ(FilesInNamespace().size(), 1u);  // no temp file left

  HostMem dst(layout_, 8);
  for (int32_t p = 0; p < 8; ++p) dst.Fill(p, 999);
  const std::vector<int32_t> to = {6, 0, 3};
  FileStorage::Completion rc;
  ASSERT_TRUE(Wait(*st, st->SubmitRead(seq.Run(0, 3), seq.tokens, dst.mem(), to), &rc).ok());
  EXPECT_TRUE(rc.is_read);
  EXPECT_EQ(rc.bytes, file_bytes);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dst.Bytes(to[i]), host_.Bytes(src[i])) << i;
  HostMem untouched(layout_, 8);
  untouched.Fill(2, 999);
  EXPECT_EQ(dst.Bytes(2), untouched.Bytes(2));  // other pages stay

  const auto s = st->stats();
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(s.bytes, file_bytes);
  EXPECT_EQ(s.written_pages, 3);
  EXPECT_EQ(s.read_pages, 3);
  EXPECT_EQ(s.errors_corrupt + s.errors_io + s.errors_full, 0);

  // Writing it again is skipped: completes OK, nothing written.
  ASSERT_TRUE(Write(*st, seq, 0, 3, 20, &wc).ok());
  EXPECT_EQ(wc.bytes, 0u);
  EXPECT_EQ(st->stats().written_pages, 3);
  EXPECT_EQ(ReadAll(FilePath(seq.Run(0, 3))),
            EncodeStorageFile(Options().namespace_id, layout_, seq.Run(0, 3), seq.tokens,
                              host_.Payload(src)));
}

TEST_F(FileStorageTest, MatchFollowsChainsOfRunsAndStopsWhereTheyStop) {
  auto st = OpenOrDie(Options());
  Seq seq(10, layout_.page_size, 0);
  ASSERT_TRUE(Write(*st, seq, 0, 3, 0).ok());
  ASSERT_TRUE(Write(*st, seq, 3, 2, 3).ok());
  ASSERT_TRUE(Write(*st, seq, 5, 4, 5).ok());
  EXPECT_EQ(st->Match(seq.start, seq.hashes),
            (std::vector<StorageRun>{seq.Run(0, 3), seq.Run(3, 2), seq.Run(5, 4)}));
  // A prompt shorter than the chain: only the runs that fit.
  EXPECT_EQ(st->Match(seq.start, std::span(seq.hashes).first(6)),
            (std::vector<StorageRun>{seq.Run(0, 3), seq.Run(3, 2)}));
  EXPECT_EQ(st->Match(seq.start, std::span(seq.hashes).first(2)), std::vector<StorageRun>{});
  // A prompt that diverges inside the second run: the first run only.
  Seq other = seq;
  other.tokens[8] = -5;  // page 4
  other.Rehash(layout_.page_size);
  EXPECT_EQ(st->Match(other.start, other.hashes), std::vector<StorageRun>{seq.Run(0, 3)});
  // Continuing from the middle of a sequence (a host match ended at page 3).
  EXPECT_EQ(st->Match(seq.hashes[2], std::span(seq.hashes).subspan(3)),
            (std::vector<StorageRun>{seq.Run(3, 2), seq.Run(5, 4)}));
  // Another start: a miss.
  EXPECT_TRUE(st->Match(12345, seq.hashes).empty());
  EXPECT_TRUE(st->Match(seq.start, {}).empty());

  // The longest chain, not the longest first run: [0,4) is a dead end,
  // [0,2) + [2,7) reaches further.
  Seq alt(8, layout_.page_size, 500);
  ASSERT_TRUE(Write(*st, alt, 0, 4, 10).ok());
  ASSERT_TRUE(Write(*st, alt, 0, 2, 20).ok());
  ASSERT_TRUE(Write(*st, alt, 2, 5, 30).ok());
  EXPECT_EQ(st->Match(alt.start, alt.hashes),
            (std::vector<StorageRun>{alt.Run(0, 2), alt.Run(2, 5)}));
  EXPECT_EQ(st->Match(alt.start, std::span(alt.hashes).first(5)),
            std::vector<StorageRun>{alt.Run(0, 4)});
}

TEST_F(FileStorageTest, RestartFindsTheSameRunsAndReadsThem) {
  Seq seq(6, layout_.page_size, 40);
  Seq two(2, layout_.page_size, 7000);
  std::vector<StorageRun> before;
  {
    auto st = OpenOrDie(Options());
    ASSERT_TRUE(Write(*st, seq, 0, 2, 0).ok());
    ASSERT_TRUE(Write(*st, seq, 2, 4, 2).ok());
    ASSERT_TRUE(Write(*st, two, 0, 2, 40).ok());
    before = st->Match(seq.start, seq.hashes);
    ASSERT_EQ(before.size(), 2u);
  }
  auto st = OpenOrDie(Options());
  EXPECT_EQ(st->stats().files, 3);
  EXPECT_EQ(st->stats().bytes, StorageFileBytes(Options().namespace_id, layout_, 2) * 2 +
                                   StorageFileBytes(Options().namespace_id, layout_, 4));
  EXPECT_EQ(st->Match(seq.start, seq.hashes), before);
  HostMem dst(layout_, 8);
  ASSERT_TRUE(Read(*st, seq, 2, 4, dst, 4).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(dst.Bytes(4 + i), host_.Bytes(2 + i));
  ASSERT_TRUE(Read(*st, two, 0, 2, dst, 0).ok());
  EXPECT_EQ(dst.Bytes(1), host_.Bytes(41));
  EXPECT_EQ(st->stats().errors_corrupt, 0);
}

// One damage done to a stored file: each must end as a miss, counted corrupt,
// the file removed, the destination pages never given the file's bytes.
struct Damage {
  const char* name;
  std::function<void(std::vector<uint8_t>&, const KvLayout&, const Seq&)> apply;
};

std::vector<Damage> Damages() {
  return {
      {"flipped_payload_byte", [](auto& b, auto&, auto&) { b[b.size() - 9 - 3] ^= 0x01; }},
      {"flipped_token",
       [](auto& b, auto& l, auto&) { b[StorageHeaderBytes("model-abc123", l) + 5] ^= 0x80; }},
      {"flipped_checksum", [](auto& b, auto&, auto&) { b.back() ^= 0x10; }},
      {"truncated", [](auto& b, auto&, auto&) { b.resize(b.size() - 100); }},
      {"truncated_in_header", [](auto& b, auto&, auto&) { b.resize(30); }},
      {"zero_length", [](auto& b, auto&, auto&) { b.clear(); }},
      {"wrong_magic", [](auto& b, auto&, auto&) { b[3] = 'x'; }},
      {"wrong_version", [](auto& b, auto&, auto&) { b[8] = 9; }},
      {"appended_byte", [](auto& b, auto&, auto&) { b.push_back(7); }},
      {"other_namespace",
       [](auto& b, auto& l, auto& s) {
         std::vector<uint8_t> payload(2 * l.BytesPerPage(), 3);
         b = EncodeStorageFile("model-abc124", l, s.Run(0, 2), s.Tokens(0, 2, l.page_size),
                               payload);
       }},
      {"other_layout",
       [](auto& b, auto& l, auto& s) {
         const KvLayout other = OtherLayout();
         std::vector<uint8_t> payload(2 * other.BytesPerPage(), 3);
         b = EncodeStorageFile("model-abc123", other, s.Run(0, 2), s.Tokens(0, 2, l.page_size),
                               payload);
       }},
      {"other_tokens_same_hashes",  // a 64-bit collision, or a file from a buggy writer
       [](auto& b, auto& l, auto& s) {
         std::vector<int32_t> tokens = s.Tokens(0, 2, l.page_size);
         tokens[1] += 1;
         std::vector<uint8_t> payload(2 * l.BytesPerPage(), 3);
         b = EncodeStorageFile("model-abc123", l, s.Run(0, 2), tokens, payload);
       }},
      {"header_names_other_run",
       [](auto& b, auto& l, auto& s) {
         std::vector<uint8_t> payload(2 * l.BytesPerPage(), 3);
         StorageRun r = s.Run(0, 2);
         r.end_hash ^= 1;
         b = EncodeStorageFile("model-abc123", l, r, s.Tokens(0, 2, l.page_size), payload);
       }},
  };
}

class FileStorageDamageTest : public FileStorageTest, public ::testing::WithParamInterface<int> {};

TEST_P(FileStorageDamageTest, WhileRunningIsAMissCountedAndRemoved) {
  const Damage d = Damages()[static_cast<size_t>(GetParam())];
  auto st = OpenOrDie(Options());
  Seq seq(2, layout_.page_size, 77);
  ASSERT_TRUE(Write(*st, seq, 0, 2, 10).ok());
  const std::string path = FilePath(seq.Run(0, 2));
  std::vector<uint8_t> bytes = ReadAll(path);
  d.apply(bytes, layout_, seq);
  WriteAll(path, bytes);

  ASSERT_EQ(st->Match(seq.start, seq.hashes).size(), 1u);  // the index still believes it
  HostMem dst(layout_, 4);
  HostMem fresh(layout_, 4);
  Status s = Read(*st, seq, 0, 2, dst, 0);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << d.name << ": " << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_EQ(dst.Bytes(0), fresh.Bytes(0)) << "host pages written from a bad file";
  EXPECT_EQ(dst.Bytes(1), fresh.Bytes(1));
  EXPECT_EQ(st->stats().errors_corrupt, 1);
  EXPECT_EQ(st->stats().files, 0);
  EXPECT_EQ(st->stats().bytes, 0u);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(st->Match(seq.start, seq.hashes).empty());
  // A later read of it (from a stale match) is a plain miss, not counted.
  EXPECT_EQ(Read(*st, seq, 0, 2, dst, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(st->stats().errors_corrupt, 1);
  // And the run can be stored again.
  ASSERT_TRUE(Write(*st, seq, 0, 2, 10).ok());
  ASSERT_TRUE(Read(*st, seq, 0, 2, dst, 0).ok());
  EXPECT_EQ(dst.Bytes(1), host_.Bytes(11));
}

TEST_P(FileStorageDamageTest, BeforeRestartIsAMissCountedAndRemoved) {
  const Damage d = Damages()[static_cast<size_t>(GetParam())];
  Seq seq(2, layout_.page_size, 77);
  Seq good(3, layout_.page_size, 9000);
  const std::string path = FilePath(seq.Run(0, 2));
  {
    auto st = OpenOrDie(Options());
    ASSERT_TRUE(Write(*st, seq, 0, 2, 10).ok());
    ASSERT_TRUE(Write(*st, good, 0, 3, 20).ok());
  }
  std::vector<uint8_t> bytes = ReadAll(path);
  d.apply(bytes, layout_, seq);
  WriteAll(path, bytes);

  auto st = OpenOrDie(Options());
  // Header defects are found by the scan; payload defects by the read.
  HostMem dst(layout_, 4);
  HostMem fresh(layout_, 4);
  if (!st->Match(seq.start, seq.hashes).empty()) {
    EXPECT_EQ(Read(*st, seq, 0, 2, dst, 0).code(), StatusCode::kDataLoss) << d.name;
  }
  EXPECT_EQ(dst.Bytes(0), fresh.Bytes(0));
  EXPECT_EQ(st->stats().errors_corrupt, 1) << d.name;
  EXPECT_FALSE(fs::exists(path)) << d.name;
  EXPECT_TRUE(st->Match(seq.start, seq.hashes).empty());
  // The good file next to it is untouched.
  EXPECT_EQ(st->stats().files, 1);
  ASSERT_TRUE(Read(*st, good, 0, 3, dst, 1).ok());
  EXPECT_EQ(dst.Bytes(3), host_.Bytes(22));
}

INSTANTIATE_TEST_SUITE_P(Damages, FileStorageDamageTest,
                         ::testing::Range(0, static_cast<int>(Damages().size())),
                         [](const auto& info) {
                           return std::string(Damages()[static_cast<size_t>(info.param)].name);
                         });

TEST_F(FileStorageTest, StartupRemovesTempFilesAndLeavesOtherNamespacesAndNamesAlone) {
  Seq seq(2, layout_.page_size, 5);
  {
    auto st = OpenOrDie(Options());
    ASSERT_TRUE(Write(*st, seq, 0, 2, 0).ok());
  }
  const std::string ns_dir = Options().dir + "/" + Options().namespace_id;
  WriteAll(ns_dir + "/" + StorageFileName(1, 2) + ".123.0.tmp", {1, 2, 3});  // an interrupted write
  WriteAll(ns_dir + "/garbage.tmp", std::vector<uint8_t>(5000, 0xee));
  WriteAll(ns_dir + "/README", {'h', 'i'});                    // not a storage name: left alone
  fs::create_directory(ns_dir + "/" + StorageFileName(3, 4));  // a directory with a storage name
  // A valid file of another namespace, in its own directory: never read.
  fs::create_directories(Options().dir + "/other-model");
  const std::string foreign =
      Options().dir + "/other-model/" + StorageFileName(seq.start, seq.hashes[1]);
  fs::copy_file(FilePath(seq.Run(0, 2)), foreign);

  auto st = OpenOrDie(Options());
  const auto s = st->stats();
  EXPECT_EQ(s.removed_temp, 2);
  EXPECT_EQ(s.errors_corrupt, 0);
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(FilesInNamespace(),
            (std::vector<std::string>{StorageFileName(3, 4),
                                      StorageFileName(seq.start, seq.hashes[1]), "README"}));
  EXPECT_TRUE(fs::exists(foreign));
  FileStorageOptions o = Options();
  o.namespace_id = "other-model";
  auto other = OpenOrDie(o);
  EXPECT_EQ(other->stats().files, 0);  // the copy says model-abc123 inside: foreign there
  EXPECT_EQ(other->stats().errors_corrupt, 1);
}

TEST_F(FileStorageTest, CapacityEvictsLeastRecentlyUsedFirst) {
  const uint64_t f = StorageFileBytes(Options().namespace_id, layout_, 1);
  auto st = OpenOrDie(Options(3 * f + f / 2));
  std::vector<Seq> s;
  for (int i = 0; i < 6; ++i) s.emplace_back(1, layout_.page_size, 100 * i);
  auto stored = [&](int i) { return !st->Match(s[i].start, s[i].hashes).empty(); };
  auto on_disk = [&](int i) { return fs::exists(FilePath(s[i].Run(0, 1))); };
  ASSERT_TRUE(Write(*st, s[0], 0, 1, 0).ok());
  ASSERT_TRUE(Write(*st, s[1], 0, 1, 1).ok());
  ASSERT_TRUE(Write(*st, s[2], 0, 1, 2).ok());
  ASSERT_TRUE(stored(0));                       // touch 0: order 1, 2, 0
  ASSERT_TRUE(Write(*st, s[3], 0, 1, 3).ok());  // evicts 1
  EXPECT_FALSE(on_disk(1));
  EXPECT_TRUE(on_disk(0) && on_disk(2) && on_disk(3));
  HostMem dst(layout_, 2);
  ASSERT_TRUE(Read(*st, s[2], 0, 1, dst, 0).ok());  // a read touches too: order 0, 3, 2
  ASSERT_TRUE(Write(*st, s[4], 0, 1, 4).ok());      // evicts 0
  EXPECT_FALSE(on_disk(0));
  EXPECT_TRUE(on_disk(2) && on_disk(3) && on_disk(4));
  EXPECT_FALSE(stored(0) || stored(1));
  auto stats = st->stats();
  EXPECT_EQ(stats.evicted_pages, 2);
  EXPECT_EQ(stats.evicted_bytes, 2 * f);
  EXPECT_EQ(stats.files, 3);
  EXPECT_EQ(stats.bytes, 3 * f);

  // A run larger than the whole capacity is skipped, and evicts nothing.
  Seq big(6, layout_.page_size, 5000);
  ASSERT_GT(StorageFileBytes(Options().namespace_id, layout_, 6), 3 * f + f / 2);
  FileStorage::Completion c;
  ASSERT_TRUE(Write(*st, big, 0, 6, 10, &c).ok());
  EXPECT_EQ(c.bytes, 0u);
  stats = st->stats();
  EXPECT_EQ(stats.skipped_capacity, 1);
  EXPECT_EQ(stats.files, 3);
  EXPECT_FALSE(fs::exists(FilePath(big.Run(0, 6))));

  // After a restart the order comes from file mtimes: make 4 the oldest.
  st.reset();
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  fs::last_write_time(FilePath(s[4].Run(0, 1)), old);
  fs::last_write_time(FilePath(s[3].Run(0, 1)), old + std::chrono::minutes(1));
  st = OpenOrDie(Options(3 * f + f / 2));
  ASSERT_TRUE(Write(*st, s[5], 0, 1, 5).ok());
  EXPECT_FALSE(on_disk(4));
  EXPECT_TRUE(on_disk(2) && on_disk(3) && on_disk(5));
  // A lower limit at startup evicts the oldest at once (3 is now the oldest).
  st.reset();
  st = OpenOrDie(Options(2 * f + f / 2));
  EXPECT_EQ(st->stats().files, 2);
  EXPECT_FALSE(on_disk(3));
}

// Passes everything to the real file system, except that writes (or
// renames) fail with a chosen errno while it is set.
class FaultFs : public StorageFileSystem {
 public:
  std::atomic<int> write_errno{0}, rename_errno{0}, read_errno{0};
  std::atomic<int> writes{0};
  std::atomic<bool> hold_reads{false};
  int reads_waiting = 0;  // guarded by mu_
  int MakeDir(const std::string& p) override { return real_->MakeDir(p); }
  int ListDir(const std::string& d, std::vector<std::string>* n) override {
    return real_->ListDir(d, n);
  }
  int Stat(const std::string& p, uint64_t* s, int64_t* m) override { return real_->Stat(p, s, m); }
  int ReadFile(const std::string& p, uint64_t n, std::vector<uint8_t>* o) override {
    if (const int e = read_errno.load()) return e;
    if (hold_reads) {
      std::unique_lock l(mu_);
      ++reads_waiting;
      cv_.notify_all();
      cv_.wait(l, [&] { return !hold_reads; });
    }
    return real_->ReadFile(p, n, o);
  }
  // Reads block in ReadFile until Release (the run stays pinned meanwhile).
  void Hold() { hold_reads = true; }
  void WaitForReaders(int n) {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return reads_waiting >= n; });
  }
  void Release() {
    std::lock_guard l(mu_);
    hold_reads = false;
    cv_.notify_all();
  }
  int WriteNewFile(const std::string& p,
                   std::span<const std::span<const uint8_t>> pieces) override {
    ++writes;
    if (const int e = write_errno.load()) {
      // A full disk leaves a partial temp file behind: the storage removes it.
      std::vector<uint8_t> part(10, 1);
      std::span<const uint8_t> one[] = {part};
      real_->WriteNewFile(p, one);
      return e;
    }
    return real_->WriteNewFile(p, pieces);
  }
  int Rename(const std::string& f, const std::string& t) override {
    if (const int e = rename_errno.load()) return e;
    return real_->Rename(f, t);
  }
  int Remove(const std::string& p) override { return real_->Remove(p); }
  int Touch(const std::string& p) override { return real_->Touch(p); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<StorageFileSystem> real_ = PosixStorageFileSystem();
};

struct DiskFault {
  int err;
  bool on_rename;
  bool full;  // counted full (else io)
};

class FileStorageDiskFaultTest : public FileStorageTest,
                                 public ::testing::WithParamInterface<DiskFault> {};

TEST_P(FileStorageDiskFaultTest, StopsBackupsLogsOnceAndReadsGoOn) {
  auto ffs = std::make_shared<FaultFs>();
  auto st = OpenOrDie(Options(), ffs);
  Seq kept(2, layout_.page_size, 1);
  ASSERT_TRUE(Write(*st, kept, 0, 2, 0).ok());

  (GetParam().on_rename ? ffs->rename_errno : ffs->write_errno) = GetParam().err;
  ::testing::internal::CaptureStderr();
  Seq a(1, layout_.page_size, 300), b(1, layout_.page_size, 400), c(1, layout_.page_size, 500);
  Status first = Write(*st, a, 0, 1, 5);
  FileStorage::Completion later;
  Status second = Write(*st, b, 0, 1, 6, &later);
  ffs->write_errno = 0;  // the disk has room again: backups stay off until restart
  ffs->rename_errno = 0;
  Status third = Write(*st, c, 0, 1, 7);
  const std::string log = ::testing::internal::GetCapturedStderr();

  EXPECT_FALSE(first.ok());
  EXPECT_EQ(first.code(), GetParam().full ? StatusCode::kResourceExhausted : StatusCode::kIoError);
  EXPECT_TRUE(second.ok()) << second.ToString();  // skipped
  EXPECT_EQ(later.bytes, 0u);
  EXPECT_TRUE(third.ok());
  EXPECT_EQ(ffs->writes.load(),
            2);  // the kept run and the failed one: later writes never reach the disk
  const auto s = st->stats();
  EXPECT_TRUE(s.writes_disabled);
  EXPECT_EQ(s.errors_full, GetParam().full ? 1 : 0);
  EXPECT_EQ(s.errors_io, GetParam().full ? 0 : 1);
  EXPECT_EQ(s.files, 1);
  EXPECT_NE(s.writes_disabled_reason.find(std::strerror(GetParam().err)), std::string::npos)
      << s.writes_disabled_reason;
  EXPECT_NE(s.writes_disabled_reason.find("--hicache-storage-path"), std::string::npos);
  size_t count = 0;
  for (size_t pos = log.find("backups to storage are off"); pos != std::string::npos;
       pos = log.find("backups to storage are off", pos + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << log;
  EXPECT_NE(log.find("[strata W "), std::string::npos) << log;  // STRATA_LOG(WARN)
  // No temp file, no file of the failed runs.
  EXPECT_EQ(FilesInNamespace(),
            std::vector<std::string>{StorageFileName(kept.start, kept.hashes[1])});
  // Reads go on.
  HostMem dst(layout_, 2);
  ASSERT_TRUE(Read(*st, kept, 0, 2, dst, 0).ok());
  EXPECT_EQ(dst.Bytes(1), host_.Bytes(1));
  // A restart (the operator freed space) writes again.
  st.reset();
  st = OpenOrDie(Options(), ffs);
  EXPECT_FALSE(st->stats().writes_disabled);
  ASSERT_TRUE(Write(*st, c, 0, 1, 7).ok());
  EXPECT_EQ(st->stats().files, 2);
}

INSTANTIATE_TEST_SUITE_P(Faults, FileStorageDiskFaultTest,
                         ::testing::Values(DiskFault{ENOSPC, false, true},
                                           DiskFault{EDQUOT, false, true},
                                           DiskFault{EROFS, false, false},
                                           DiskFault{EACCES, false, false},
                                           DiskFault{EROFS, true, false}),
                         [](const auto& info) {
                           return std::string(info.param.err == ENOSPC   ? "ENOSPC"
                                              : info.param.err == EDQUOT ? "EDQUOT"
                                              : info.param.err == EROFS  ? "EROFS"
                                                                         : "EACCES") +
                                  (info.param.on_rename ? "_on_rename" : "");
                         });

TEST_F(FileStorageTest, ARunBeingReadIsNotEvicted) {
  const uint64_t f = StorageFileBytes(Options().namespace_id, layout_, 1);
  auto ffs = std::make_shared<FaultFs>();
  FileStorageOptions o = Options(2 * f);
  o.io_threads = 3;  // two held in reads, one left for the writes
  auto st = OpenOrDie(o, ffs);
  Seq a(1, layout_.page_size, 1), b(1, layout_.page_size, 2), c(1, layout_.page_size, 3),
      d(1, layout_.page_size, 4);
  ASSERT_TRUE(Write(*st, a, 0, 1, 0).ok());
  ASSERT_TRUE(Write(*st, b, 0, 1, 1).ok());  // LRU order: a, b
  ffs->Hold();
  HostMem dst(layout_, 2);
  const auto read_a = st->SubmitRead(a.Run(0, 1), a.tokens, dst.mem(), {0});
  ffs->WaitForReaders(1);
  ASSERT_TRUE(Write(*st, c, 0, 1, 2).ok());  // a is oldest but pinned: b goes
  EXPECT_TRUE(fs::exists(FilePath(a.Run(0, 1))));
  EXPECT_FALSE(fs::exists(FilePath(b.Run(0, 1))));
  const auto read_c = st->SubmitRead(c.Run(0, 1), c.tokens, dst.mem(), {1});
  ffs->WaitForReaders(2);
  // Everything pinned: the write is skipped and evicts nothing.
  FileStorage::Completion wc;
  ASSERT_TRUE(Write(*st, d, 0, 1, 3, &wc).ok());
  EXPECT_EQ(wc.bytes, 0u);
  EXPECT_EQ(st->stats().skipped_capacity, 1);
  EXPECT_EQ(st->stats().files, 2);
  ffs->Release();
  ASSERT_TRUE(Wait(*st, read_a).ok());
  ASSERT_TRUE(Wait(*st, read_c).ok());
  EXPECT_EQ(dst.Bytes(0), host_.Bytes(0));
  EXPECT_EQ(dst.Bytes(1), host_.Bytes(2));
}

TEST_F(FileStorageTest, OtherIoErrorsAreCountedAndWritesGoOn) {
  auto ffs = std::make_shared<FaultFs>();
  auto st = OpenOrDie(Options(), ffs);
  Seq a(1, layout_.page_size, 1), b(1, layout_.page_size, 2);
  ffs->rename_errno = EIO;
  EXPECT_EQ(Write(*st, a, 0, 1, 0).code(), StatusCode::kIoError);
  ffs->rename_errno = 0;
  ASSERT_TRUE(Write(*st, b, 0, 1, 1).ok());
  ASSERT_TRUE(Write(*st, a, 0, 1, 0).ok());  // the failed run is not "already stored"
  const auto s = st->stats();
  EXPECT_FALSE(s.writes_disabled);
  EXPECT_EQ(s.errors_io, 1);
  EXPECT_EQ(s.files, 2);
  EXPECT_EQ(FilesInNamespace().size(), 2u);  // the failed write's temp file is gone
}

TEST_F(FileStorageTest, ReadErrorsAreCountedIoNotCorrupt) {
  auto ffs = std::make_shared<FaultFs>();
  Seq a(1, layout_.page_size, 1), b(1, layout_.page_size, 2);
  {
    auto st = OpenOrDie(Options(), ffs);
    ASSERT_TRUE(Write(*st, a, 0, 1, 0).ok());
    ASSERT_TRUE(Write(*st, b, 0, 1, 1).ok());
    ffs->read_errno = EIO;  // a failing disk under a running server
    HostMem dst(layout_, 1);
    EXPECT_EQ(Read(*st, a, 0, 1, dst, 0).code(), StatusCode::kIoError);
    EXPECT_EQ(st->stats().errors_io, 1);
    EXPECT_EQ(st->stats().errors_corrupt, 0);
    EXPECT_TRUE(st->Match(a.start, a.hashes).empty());  // dropped: not retried every request
  }
  // At startup an unreadable file is skipped and left in place (not corrupt).
  auto st = OpenOrDie(Options(), ffs);
  EXPECT_EQ(st->stats().files, 0);
  EXPECT_EQ(st->stats().errors_io, 1);
  EXPECT_EQ(st->stats().errors_corrupt, 0);
  EXPECT_TRUE(fs::exists(FilePath(b.Run(0, 1))));
  ffs->read_errno = 0;
  st.reset();
  st = OpenOrDie(Options(), ffs);
  EXPECT_EQ(st->stats().files, 1);
}

TEST_F(FileStorageTest, ReadOnlyDirectoryForRealUsers) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "root ignores directory permissions (FaultFs covers EACCES)";
  auto st = OpenOrDie(Options());
  Seq kept(1, layout_.page_size, 1), a(1, layout_.page_size, 2);
  ASSERT_TRUE(Write(*st, kept, 0, 1, 0).ok());
  ::chmod((Options().dir + "/" + Options().namespace_id).c_str(), 0555);
  EXPECT_FALSE(Write(*st, a, 0, 1, 1).ok());
  EXPECT_TRUE(st->stats().writes_disabled);
  HostMem dst(layout_, 1);
  EXPECT_TRUE(Read(*st, kept, 0, 1, dst, 0).ok());
}

TEST_F(FileStorageTest, ManySubmitsWhileIoThreadsRun) {
  FileStorageOptions o = Options();
  o.io_threads = 4;
  auto st = OpenOrDie(o);
  constexpr int kRuns = 120;
  std::vector<Seq> seqs;
  for (int i = 0; i < kRuns; ++i) seqs.emplace_back(1 + i % 3, layout_.page_size, 10000 * (i + 1));
  std::set<FileStorage::Ticket> writes, reads;
  std::map<FileStorage::Ticket, Status> done;
  HostMem mid(layout_, 3 * 1000);
  int32_t next_mid = 0;
  auto drain = [&] {
    for (auto& c : st->Poll()) {
      EXPECT_TRUE(done.emplace(c.ticket, c.status).second)
          << "ticket " << c.ticket << " polled twice";
    }
  };
  for (int i = 0; i < kRuns; ++i) {
    const Seq& s = seqs[static_cast<size_t>(i)];
    const int n = static_cast<int>(s.hashes.size());
    std::vector<int32_t> pages;
    for (int p = 0; p < n; ++p) pages.push_back((i + p) % 64);
    writes.insert(st->SubmitWrite(s.Run(0, n), s.tokens, host_.mem(), pages));
    drain();
    // Reads of what has landed so far, while later writes are queued (each
    // into pages of its own: reads run concurrently).
    if (i % 10 == 9) {
      ASSERT_TRUE(
          st->WaitFor(*std::next(writes.begin(), i - 5), Clock::now() + std::chrono::seconds(30)));
      for (int j = 0; j < i; ++j) {
        const Seq& r = seqs[static_cast<size_t>(j)];
        for (const StorageRun& run : st->Match(r.start, r.hashes)) {
          std::vector<int32_t> pages;
          for (int p = 0; p < run.num_pages; ++p) pages.push_back(next_mid++);
          ASSERT_LE(next_mid, 3 * 1000);
          reads.insert(st->SubmitRead(run, r.tokens, mid.mem(), pages));
        }
      }
    }
  }
  for (auto t : writes) ASSERT_TRUE(st->WaitFor(t, Clock::now() + std::chrono::seconds(60)));
  for (auto t : reads) ASSERT_TRUE(st->WaitFor(t, Clock::now() + std::chrono::seconds(60)));
  drain();
  EXPECT_EQ(done.size(), writes.size() + reads.size());
  for (auto t : writes) EXPECT_TRUE(done[t].ok()) << done[t].ToString();
  for (auto t : reads) EXPECT_TRUE(done[t].ok()) << done[t].ToString();
  EXPECT_GT(reads.size(), 100u);
  EXPECT_EQ(st->stats().files, kRuns);
  // Now real reads, all in flight together, into separate pages.
  HostMem dst(layout_, 3 * kRuns);
  std::vector<FileStorage::Ticket> rt;
  for (int i = 0; i < kRuns; ++i) {
    const Seq& s = seqs[static_cast<size_t>(i)];
    const int n = static_cast<int>(s.hashes.size());
    std::vector<int32_t> pages;
    for (int p = 0; p < n; ++p) pages.push_back(3 * i + p);
    rt.push_back(st->SubmitRead(s.Run(0, n), s.tokens, dst.mem(), pages));
  }
  for (auto t : rt) ASSERT_TRUE(st->WaitFor(t, Clock::now() + std::chrono::seconds(60)));
  drain();
  for (auto t : rt) EXPECT_TRUE(done[t].ok()) << done[t].ToString();
  for (int i = 0; i < kRuns; ++i) {
    const int n = static_cast<int>(seqs[static_cast<size_t>(i)].hashes.size());
    for (int p = 0; p < n; ++p)
      ASSERT_EQ(dst.Bytes(3 * i + p), host_.Bytes((i + p) % 64)) << i << " " << p;
  }
  EXPECT_EQ(st->stats().errors_corrupt + st->stats().errors_io, 0);
}

TEST_F(FileStorageTest, DestructorCompletesQueuedWrites) {
  constexpr int kRuns = 60;
  std::vector<Seq> seqs;
  for (int i = 0; i < kRuns; ++i) seqs.emplace_back(2, layout_.page_size, 3000 * (i + 1));
  {
    FileStorageOptions o = Options();
    o.io_threads = 1;
    auto st = OpenOrDie(o);
    for (const Seq& s : seqs) st->SubmitWrite(s.Run(0, 2), s.tokens, host_.mem(), {4, 9});
  }  // destroyed with most writes still queued
  auto st = OpenOrDie(Options());
  EXPECT_EQ(st->stats().files, kRuns);
  EXPECT_EQ(st->stats().removed_temp, 0);
  HostMem dst(layout_, 2);
  ASSERT_TRUE(Read(*st, seqs.back(), 0, 2, dst, 0).ok());
  EXPECT_EQ(dst.Bytes(1), host_.Bytes(9));
}

TEST_F(FileStorageTest, ContractViolationsCompleteWithInvalidArgument) {
  auto st = OpenOrDie(Options());
  Seq s(2, layout_.page_size, 1);
  FileStorage::Completion c;
  EXPECT_EQ(Wait(*st, st->SubmitWrite(s.Run(0, 2), s.Tokens(0, 1, 2), host_.mem(), {0, 1})).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Wait(*st, st->SubmitWrite(s.Run(0, 2), s.tokens, host_.mem(), {0, 64})).code(),
            StatusCode::kInvalidArgument);
  HostMem wrong(OtherLayout(), 4);
  EXPECT_EQ(Wait(*st, st->SubmitWrite(s.Run(0, 2), s.tokens, wrong.mem(), {0, 1})).code(),
            StatusCode::kInvalidArgument);
  std::vector<int32_t> other = s.tokens;
  other[0] = 42;  // not the run's tokens
  EXPECT_EQ(Wait(*st, st->SubmitWrite(s.Run(0, 2), other, host_.mem(), {0, 1})).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st->stats().files, 0);
  EXPECT_TRUE(FilesInNamespace().empty());
  // A read of something never stored: NotFound at once.
  HostMem dst(layout_, 2);
  EXPECT_EQ(Read(*st, s, 0, 2, dst, 0).code(), StatusCode::kNotFound);
  EXPECT_FALSE(st->WaitFor(987654, Clock::now()));
}

TEST_F(FileStorageTest, OpenErrorsNameThePathAndTheFlag) {
  WriteAll(dir_.path() + "/file", {1});
  FileStorageOptions o = Options();
  o.dir = dir_.path() + "/file/store";
  auto r = FileStorage::Open(o, layout_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find(dir_.path() + "/file/store"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find(std::strerror(ENOTDIR)), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("--hicache-storage-path"), std::string::npos);

  for (const char* bad : {"", "..", "a/b", "sp ace"}) {
    o = Options();
    o.namespace_id = bad;
    EXPECT_EQ(FileStorage::Open(o, layout_).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  o = Options();
  o.dir = "";
  EXPECT_NE(FileStorage::Open(o, layout_).status().message().find("--hicache-storage-path"),
            std::string::npos);
  o = Options();
  o.io_threads = 0;
  EXPECT_EQ(FileStorage::Open(o, layout_).status().code(), StatusCode::kInvalidArgument);
  // Nested directories are created.
  o = Options();
  o.dir = dir_.path() + "/a/b/c";
  auto ok = FileStorage::Open(o, layout_);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(fs::is_directory(dir_.path() + "/a/b/c/" + o.namespace_id));
  EXPECT_EQ((*ok)->path(), dir_.path() + "/a/b/c/" + o.namespace_id);
}

}  // namespace
}  // namespace strata

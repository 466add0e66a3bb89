// HiCache policy glue without a model: a device pool, a host pool, the tiered
// tree and (optionally) file storage, driven the way the scheduler drives
// them. Every test checks page bytes, not just bookkeeping: a prefix that
// comes back from the host or from storage must hold exactly what was
// computed into it.
#include "cache/hicache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace strata {
namespace {

KvLayout Layout() {  // two groups of different bytes per page, one K-only
  KvLayout l;
  l.page_size = 4;
  l.groups.push_back({"full_attention", 2, 2, 8, DType::kBF16, true, 0});
  l.groups.push_back({"latent", 1, 1, 16, DType::kF32, false, 0});
  return l;
}

// Deterministic bytes for the page that holds `tokens` (a function of the
// tokens only, as real KV is of the prefix).
uint8_t Byte(uint64_t key, int g, int l, int t, size_t i) {
  uint64_t h = key ^ (uint64_t(g) << 40) ^ (uint64_t(l) << 32) ^ (uint64_t(t) << 24) ^ i;
  h *= 0x9e3779b97f4a7c15ull;
  return static_cast<uint8_t>(h >> 56);
}

template <typename F>
void ForEachRun(const KvPoolMemory& m, int64_t page, F&& f) {
  for (int g = 0; g < static_cast<int>(m.layout->groups.size()); ++g)
    for (int l = 0; l < m.layout->groups[g].num_layers; ++l)
      for (int t = 0; t < (m.layout->groups[g].has_v ? 2 : 1); ++t)
        f(g, l, t, m.PagePtr(g, l, t, page), m.layout->BytesPerPagePerTensor(g));
}

void Fill(const KvPoolMemory& m, int64_t page, uint64_t key) {
  ForEachRun(m, page, [&](int g, int l, int t, char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(Byte(key, g, l, t, i));
  });
}

bool Holds(const KvPoolMemory& m, int64_t page, uint64_t key) {
  bool ok = true;
  ForEachRun(m, page, [&](int g, int l, int t, char* p, size_t n) {
    for (size_t i = 0; i < n && ok; ++i) ok = static_cast<uint8_t>(p[i]) == Byte(key, g, l, t, i);
  });
  return ok;
}

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(seed * 1000 + i);
  return t;
}

uint64_t PageKey(std::span<const int32_t> tokens, int64_t page, int page_size) {
  return RadixTree::ChainPageHash(RadixTree::kRootHash,
                                  tokens.first(static_cast<size_t>((page + 1) * page_size)));
}

class HiCacheTest : public ::testing::Test {
 protected:
  void Build(HiCacheWritePolicy policy, const std::string& storage_dir = "") {
    hicache_.reset();
    tree_.reset();
    host_.reset();
    device_.reset();
    if (!backend_) {
      CpuBackendOptions o;
      o.num_threads = 1;
      backend_ = std::move(CreateCpuBackend(o)).value();
    }
    device_ = std::move(KvPool::Create(layout_, 8, *backend_)).value();
    host_ = std::move(HostKvPool::Create(layout_, 32, -1, nullptr)).value();
    tree_ = std::make_unique<RadixTree>(RadixTreeConfig{layout_.page_size}, &device_->allocator(),
                                        &host_->allocator());
    HiCacheOptions o;
    o.enabled = true;
    o.write_policy = policy;
    std::unique_ptr<FileStorage> storage;
    if (!storage_dir.empty()) {
      FileStorageOptions fo;
      fo.dir = storage_dir;
      fo.max_bytes = 1 << 26;
      fo.namespace_id = "test";
      storage = std::move(FileStorage::Open(fo, layout_)).value();
    }
    hicache_ =
        std::make_unique<HiCache>(o, *device_, *host_, *tree_, *backend_, std::move(storage));
  }

  // "Computes" tokens into fresh device pages and inserts them, as a
  // finished prefill chunk does. Returns the request's page ids (still held).
  std::vector<int32_t> Compute(const std::vector<int32_t>& tokens) {
    const int64_t pages = static_cast<int64_t>(tokens.size()) / layout_.page_size;
    std::vector<int32_t> ids;
    EXPECT_TRUE(device_->allocator().Allocate(pages, &ids).ok());
    for (int64_t p = 0; p < pages; ++p)
      Fill(device_->memory(), ids[p], PageKey(tokens, p, layout_.page_size));
    RadixTree::InsertResult r = tree_->Insert(tokens, ids);
    hicache_->OnInserted(r.handle);
    return ids;
  }
  void Release(const std::vector<int32_t>& ids) {
    for (int32_t p : ids) device_->allocator().Unref(p);
  }
  void Drain() {
    for (int i = 0; i < 1000 && hicache_->busy(); ++i)
      hicache_->WaitAny(std::chrono::milliseconds(5));
    ASSERT_FALSE(hicache_->busy());
  }
  void CheckAll() {
    ASSERT_TRUE(tree_->CheckIntegrity().ok()) << tree_->CheckIntegrity().ToString();
    ASSERT_TRUE(hicache_->CheckIntegrity().ok()) << hicache_->CheckIntegrity().ToString();
    ASSERT_TRUE(device_->allocator().CheckIntegrity().ok());
  }
  // Loads the host part of tokens' match back into fresh device pages,
  // waits, inserts, and checks every page's bytes. Returns tokens loaded.
  int64_t LoadBackAndCheck(const std::vector<int32_t>& tokens) {
    RadixTree::MatchResult m = tree_->MatchPrefix(tokens);
    tree_->Lock(m.host_handle);
    std::vector<int32_t> pages = m.pages;
    for (int32_t p : pages) device_->allocator().Ref(p);
    std::vector<int32_t> fresh;
    EXPECT_TRUE(
        device_->allocator().Allocate(static_cast<int64_t>(m.host_pages.size()), &fresh).ok());
    const HiCache::Ticket t = hicache_->StartLoadBack(m.host_pages, fresh, 0);
    hicache_->WaitLoadBack(t);
    std::optional<Status> done = hicache_->TakeLoadBack(t);
    EXPECT_TRUE(done.has_value() && done->ok());
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    RadixTree::InsertResult r = tree_->Insert(
        std::span<const int32_t>(tokens).first(static_cast<size_t>(m.num_tokens + m.host_tokens)),
        pages);
    tree_->Lock(r.handle);
    tree_->Unlock(m.host_handle);
    for (size_t p = 0; p < pages.size(); ++p)
      EXPECT_TRUE(Holds(device_->memory(), pages[p],
                        PageKey(tokens, static_cast<int64_t>(p), layout_.page_size)))
          << "page " << p << " of the loaded prefix holds other bytes";
    tree_->Unlock(r.handle);
    Release(pages);
    return m.host_tokens;
  }

  KvLayout layout_ = Layout();
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvPool> device_;
  std::unique_ptr<HostKvPool> host_;
  std::unique_ptr<RadixTree> tree_;
  std::unique_ptr<HiCache> hicache_;
};

TEST_F(HiCacheTest, WriteThroughBacksUpAtInsertAndLoadsBackExactBytes) {
  Build(HiCacheWritePolicy::kWriteThrough);
  const std::vector<int32_t> a = Tokens(16, 1);
  Release(Compute(a));
  Drain();
  EXPECT_EQ(hicache_->stats().backup_tokens_host, 16);
  CheckAll();
  // Another prefix needs the whole device pool: `a` goes host-only.
  const std::vector<int32_t> b = Tokens(32, 2);
  ASSERT_EQ(tree_->Evict(8), 4);
  Release(Compute(b));
  Drain();
  CheckAll();
  EXPECT_EQ(tree_->PeekPrefixLengths(a).device_tokens, 0);
  EXPECT_EQ(tree_->PeekPrefixLengths(a).host_tokens, 16);
  // Room for a's pages again, then load a back.
  tree_->Evict(4);
  EXPECT_EQ(LoadBackAndCheck(a), 16);
  Drain();
  CheckAll();
  const HiCacheStats st = hicache_->stats();
  EXPECT_EQ(st.load_back_tokens_host, 16);
  EXPECT_EQ(st.hit_tokens_host, 16);
  EXPECT_GT(st.evicted_tokens_device, 0);
  EXPECT_EQ(hicache_->TakeLoadBackSeconds().size(), 1u);
}

TEST_F(HiCacheTest, SelectiveBacksUpOnlyWhatWasHit) {
  Build(HiCacheWritePolicy::kWriteThroughSelective);
  const std::vector<int32_t> a = Tokens(8, 1), b = Tokens(8, 2);
  Release(Compute(a));
  Release(Compute(b));
  Drain();
  EXPECT_EQ(hicache_->stats().backup_tokens_host, 0);
  RadixTree::MatchResult m = tree_->MatchPrefix(a);
  hicache_->OnMatched(m.handle);
  Drain();
  EXPECT_EQ(hicache_->stats().backup_tokens_host, 8);
  EXPECT_TRUE(tree_->HasHostCopy(m.handle));
  CheckAll();
}

TEST_F(HiCacheTest, WriteBackCopiesJustBeforeEviction) {
  Build(HiCacheWritePolicy::kWriteBack);
  const std::vector<int32_t> a = Tokens(32, 1);
  Release(Compute(a));
  Drain();
  EXPECT_EQ(hicache_->stats().backup_tokens_host, 0);
  hicache_->PrepareEvict(8);  // waits for the copies
  EXPECT_EQ(hicache_->stats().backup_tokens_host, 32);
  EXPECT_EQ(tree_->Evict(8), 8);
  EXPECT_EQ(tree_->PeekPrefixLengths(a).host_tokens, 32);
  EXPECT_EQ(LoadBackAndCheck(a), 32);
  CheckAll();
}

TEST_F(HiCacheTest, StorageSurvivesARestartAndACorruptFileIsAMiss) {
  const std::string dir = ::testing::TempDir() + "/hicache_test_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::vector<int32_t> a = Tokens(24, 3);
  Build(HiCacheWritePolicy::kWriteThrough, dir);
  Release(Compute(a));
  Drain();
  EXPECT_EQ(hicache_->stats().backup_tokens_storage, 24);
  EXPECT_GT(hicache_->stats().storage_bytes, 0u);

  // A new process: empty tree, same directory.
  Build(HiCacheWritePolicy::kWriteThrough, dir);
  EXPECT_EQ(tree_->PeekPrefixLengths(a).host_tokens, 0);
  const uint64_t id = hicache_->StartPrefetch(a, 0);
  ASSERT_NE(id, 0u);
  for (int i = 0; i < 1000 && !hicache_->PrefetchDone(id); ++i)
    hicache_->WaitAny(std::chrono::milliseconds(5));
  ASSERT_TRUE(hicache_->PrefetchDone(id));
  EXPECT_EQ(hicache_->PrefetchedTokens(id), 24);
  hicache_->ForgetPrefetch(id);
  EXPECT_EQ(hicache_->stats().hit_tokens_storage, 24);
  EXPECT_EQ(LoadBackAndCheck(a), 24);
  CheckAll();

  // Damage every stored file: the next process reads nothing wrong.
  hicache_.reset();
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::fstream io(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(e.file_size() / 2));
    io.put('\x7f');
  }
  Build(HiCacheWritePolicy::kWriteThrough, dir);
  const uint64_t id2 = hicache_->StartPrefetch(a, 0);
  if (id2 != 0) {  // the header may be what was hit: then the scan dropped it
    for (int i = 0; i < 1000 && !hicache_->PrefetchDone(id2); ++i)
      hicache_->WaitAny(std::chrono::milliseconds(5));
    EXPECT_EQ(hicache_->PrefetchedTokens(id2), 0);
    hicache_->ForgetPrefetch(id2);
  }
  EXPECT_GE(hicache_->stats().storage_errors_corrupt, 1);
  EXPECT_EQ(tree_->PeekPrefixLengths(a).host_tokens, 0);
  CheckAll();
  hicache_.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata

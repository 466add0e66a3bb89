#include "cache/cache_controller.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/host_pool.h"
#include "cache/kv_pool.h"

namespace strata {
namespace {

// Two groups: K and V in BF16, and a K-only (MLA-like) F32 group.
KvLayout TwoGroups() {
  KvLayout l;
  l.page_size = 4;
  l.groups.push_back({"full_attention", 3, 2, 8, DType::kBF16, true, 0});
  l.groups.push_back({"latent", 2, 1, 24, DType::kF32, false, 0});
  return l;
}

// Byte i of (group, layer, tensor) of a page written with `seed`.
uint8_t PatternByte(int g, int l, int t, int64_t page, size_t i, uint32_t seed) {
  uint32_t h = seed * 2654435761u ^ (g * 97u + l * 13u + t * 7u) * 40503u ^
               static_cast<uint32_t>(page) * 69069u;
  h ^= static_cast<uint32_t>(i) * 2246822519u;
  return static_cast<uint8_t>(h ^ (h >> 13) ^ (h >> 24));
}

template <typename F>
void ForEachRun(const KvPoolMemory& m, int64_t page, F&& f) {
  const KvLayout& layout = *m.layout;
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g)
    for (int l = 0; l < layout.groups[g].num_layers; ++l)
      for (int t = 0; t < (layout.groups[g].has_v ? 2 : 1); ++t)
        f(g, l, t, m.PagePtr(g, l, t, page), layout.BytesPerPagePerTensor(g));
}

void FillPage(const KvPoolMemory& m, int64_t page, uint32_t seed) {
  ForEachRun(m, page, [&](int g, int l, int t, char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(PatternByte(g, l, t, page, i, seed));
  });
}

// True iff `page` of m holds what FillPage(_, pattern_page, seed) wrote.
bool PageHolds(const KvPoolMemory& m, int64_t page, int64_t pattern_page, uint32_t seed) {
  bool ok = true;
  ForEachRun(m, page, [&](int g, int l, int t, char* p, size_t n) {
    for (size_t i = 0; i < n && ok; ++i)
      ok = static_cast<uint8_t>(p[i]) == PatternByte(g, l, t, pattern_page, i, seed);
  });
  return ok;
}

void ClobberPage(const KvPoolMemory& m, int64_t page) {
  ForEachRun(m, page, [](int, int, int, char* p, size_t n) { std::memset(p, 0x5A, n); });
}

// Pages of ~100 KiB, so that a job of tens of pages is past the CPU
// backend's threshold for copying on several threads.
KvLayout BigTwoGroups() {
  KvLayout l = TwoGroups();
  l.page_size = 16;
  l.groups[0].num_kv_heads = 4;
  l.groups[0].head_dim = 64;
  l.groups[1].head_dim = 96;
  return l;
}

struct Pools {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<KvPool> device;
  std::unique_ptr<HostKvPool> host;
  explicit Pools(int64_t device_pages = 64, int64_t host_pages = 128,
                 const KvLayout& layout = TwoGroups()) {
    CpuBackendOptions o;
    o.num_threads = 2;
    o.copy_threads = 3;
    cpu = std::move(CreateCpuBackend(o)).value();
    device = std::move(KvPool::Create(layout, device_pages, *cpu)).value();
    host = std::move(HostKvPool::Create(layout, host_pages, -1, nullptr)).value();
  }
};

// Test-only backend for copies: memcpy, recording each call; optionally
// holding the first call until Release(), or failing every call.
class RecordingCopyBackend : public Backend {
 public:
  struct Call {
    CopyKind kind;
    size_t blocks;
    uint64_t bytes;
    std::thread::id thread;
  };
  bool fail = false;

  // The first CopyBlocks call waits in the backend until Release(); later
  // calls go through.
  void HoldFirstCall() { hold_ = true; }
  void WaitUntilHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }
  std::vector<Call> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

  std::string Name() const override { return "recording-copy"; }
  Status CopyBlocks(std::span<const CopyBlock> blocks, CopyKind kind) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (first_) {
      first_ = false;
      held_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !hold_; });
    }
    uint64_t bytes = 0;
    for (const CopyBlock& b : blocks) bytes += b.bytes;
    calls_.push_back({kind, blocks.size(), bytes, std::this_thread::get_id()});
    if (fail) return Internal("test: the copy engine is on fire");
    for (const CopyBlock& b : blocks) std::memcpy(b.dst, b.src, b.bytes);
    return OkStatus();
  }
  StatusOr<Buffer> Allocate(size_t) override { std::abort(); }
  void CopyToDevice(void*, const void*, size_t) override { std::abort(); }
  void CopyToHost(void*, const void*, size_t) override { std::abort(); }
  void Embedding(const Tensor&, const int32_t*, Tensor) override { std::abort(); }
  void RmsNorm(const Tensor&, const Tensor&, float, Tensor) override { std::abort(); }
  void Linear(const Tensor&, const Tensor&, const Tensor*, Tensor) override { std::abort(); }
  void SiluMul(const Tensor&, const Tensor&, Tensor) override { std::abort(); }
  void Add(const Tensor&, const Tensor&, Tensor) override { std::abort(); }
  void Rope(Tensor, Tensor, const int32_t*, const RopeParams&) override { std::abort(); }
  void StoreKv(const Tensor&, const Tensor&, const KvLayerView&, const int64_t*) override {
    std::abort();
  }
  void PagedAttention(const Tensor&, const KvLayerView&, const AttentionSeq*, int32_t,
                      const AttentionParams&, Tensor) override {
    std::abort();
  }
  void GatherRows(const Tensor&, const int32_t*, Tensor) override { std::abort(); }
  void ScaleAddRows(const Tensor&, const int32_t*, const float*, Tensor) override { std::abort(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false, held_ = false, first_ = true;
  std::vector<Call> calls_;
};

TEST(CacheControllerTest, BackupClobberLoadBackIsExact) {
  Pools pools;
  const KvPoolMemory dev = pools.device->memory(), host = pools.host->memory();
  for (int64_t p = 0; p < 64; ++p) FillPage(dev, p, 1);
  CacheController cc(*pools.cpu, dev, host);

  // 3,4,5 -> 7,8,9 merge into one run; the rest are scattered.
  const std::vector<PageCopy> backup = {{3, 7}, {4, 8}, {5, 9}, {10, 50}, {20, 2}, {63, 127}};
  const CacheController::Ticket t1 = cc.Submit(CopyDirection::kDeviceToHost, backup);
  cc.Wait(t1);
  for (const PageCopy& c : backup) ClobberPage(dev, c.src_page);
  // Load back into other device pages, in a different order.
  const std::vector<PageCopy> load = {{127, 0}, {2, 40}, {9, 32}, {7, 30}, {8, 31}, {50, 11}};
  const CacheController::Ticket t2 = cc.Submit(CopyDirection::kHostToDevice, load);
  cc.Wait(t2);
  EXPECT_TRUE(PageHolds(dev, 30, 3, 1));
  EXPECT_TRUE(PageHolds(dev, 31, 4, 1));
  EXPECT_TRUE(PageHolds(dev, 32, 5, 1));
  EXPECT_TRUE(PageHolds(dev, 11, 10, 1));
  EXPECT_TRUE(PageHolds(dev, 40, 20, 1));
  EXPECT_TRUE(PageHolds(dev, 0, 63, 1));
  // Pages nobody wrote are as they were.
  EXPECT_TRUE(PageHolds(dev, 33, 33, 1));
  EXPECT_TRUE(PageHolds(dev, 1, 1, 1));

  std::vector<CacheController::Completion> done = cc.Poll();
  ASSERT_EQ(done.size(), 2u);
  const uint64_t page_bytes = TwoGroups().BytesPerPage();
  EXPECT_EQ(done[0].ticket, t1);
  EXPECT_EQ(done[0].dir, CopyDirection::kDeviceToHost);
  EXPECT_EQ(done[1].ticket, t2);
  EXPECT_EQ(done[1].dir, CopyDirection::kHostToDevice);
  for (const auto& c : done) {
    EXPECT_TRUE(c.status.ok()) << c.status.ToString();
    EXPECT_EQ(c.pages, 6);
    EXPECT_EQ(c.bytes, 6 * page_bytes);
    EXPECT_GE(c.total_seconds, c.copy_seconds);
    EXPECT_GE(c.copy_seconds, 0);
  }
  EXPECT_TRUE(cc.Poll().empty());
  const CacheController::Stats s = cc.stats();
  EXPECT_EQ(s.jobs, 2);
  EXPECT_EQ(s.pages, 12);
  EXPECT_EQ(s.bytes_d2h, 6 * page_bytes);
  EXPECT_EQ(s.bytes_h2d, 6 * page_bytes);
}

TEST(CacheControllerTest, OneCopyCallPerJobWithAdjacentPagesMerged) {
  Pools pools;
  RecordingCopyBackend rec;
  CacheController cc(rec, pools.device->memory(), pools.host->memory());
  // Runs: {3,4,5}->{7,8,9}; {6}->{20} (src adjacent, dst not); {10}->{10}; {11}->{12}.
  cc.Wait(cc.Submit(CopyDirection::kDeviceToHost,
                    {{5, 9}, {3, 7}, {6, 20}, {4, 8}, {10, 10}, {11, 12}}));
  const std::vector<RecordingCopyBackend::Call> calls = rec.calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].kind, CopyKind::kDeviceToHost);
  // (3 layers x K,V) + (2 layers x K) = 8 (group, layer, tensor) regions, 4 runs each.
  EXPECT_EQ(calls[0].blocks, 8u * 4);
  EXPECT_EQ(calls[0].bytes, 6 * TwoGroups().BytesPerPage());
  // An empty job is one (empty) call too and completes.
  cc.Wait(cc.Submit(CopyDirection::kHostToDevice, {}));
  EXPECT_EQ(rec.calls().size(), 2u);
  EXPECT_EQ(rec.calls()[1].blocks, 0u);
}

TEST(CacheControllerTest, LoadBacksAreServedBeforeQueuedBackups) {
  Pools pools;
  RecordingCopyBackend rec;
  rec.HoldFirstCall();
  CacheController cc(rec, pools.device->memory(), pools.host->memory());
  const auto first = cc.Submit(CopyDirection::kDeviceToHost, {{0, 0}});
  rec.WaitUntilHeld();  // the controller is inside the first job
  const auto b1 = cc.Submit(CopyDirection::kDeviceToHost, {{1, 1}});
  const auto b2 = cc.Submit(CopyDirection::kDeviceToHost, {{2, 2}});
  const auto l1 = cc.Submit(CopyDirection::kHostToDevice, {{3, 3}});
  const auto l2 = cc.Submit(CopyDirection::kHostToDevice, {{4, 4}});
  rec.Release();
  // Not Wait: it would run a still-queued job out of turn.
  std::vector<CacheController::Ticket> order;
  for (int i = 0; order.size() < 5 && i < 60000; ++i) {
    for (const auto& c : cc.Poll()) order.push_back(c.ticket);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(order, (std::vector<CacheController::Ticket>{first, l1, l2, b1, b2}));
}

// The engine needs a queued load-back now while the controller is busy
// with a backup: Wait runs it on the engine's thread instead of queueing
// behind the backup.
TEST(CacheControllerTest, WaitRunsAStillQueuedJobOnTheWaitingThread) {
  Pools pools;
  const KvPoolMemory dev = pools.device->memory(), host = pools.host->memory();
  FillPage(host, 5, 3);
  RecordingCopyBackend rec;
  rec.HoldFirstCall();
  CacheController cc(rec, dev, host);
  const auto backup = cc.Submit(CopyDirection::kDeviceToHost, {{0, 0}});
  rec.WaitUntilHeld();  // the controller thread is inside the backup
  const auto load = cc.Submit(CopyDirection::kHostToDevice, {{5, 9}});
  cc.Wait(load);  // returns although the backup still holds the controller
  EXPECT_TRUE(PageHolds(dev, 9, 5, 3));
  std::vector<RecordingCopyBackend::Call> calls = rec.calls();
  ASSERT_EQ(calls.size(), 1u) << "only the load-back has copied yet";
  EXPECT_EQ(calls[0].kind, CopyKind::kHostToDevice);
  EXPECT_EQ(calls[0].thread, std::this_thread::get_id());
  rec.Release();
  cc.Wait(backup);
  std::vector<CacheController::Ticket> order;
  for (const auto& c : cc.Poll()) order.push_back(c.ticket);
  EXPECT_EQ(order, (std::vector<CacheController::Ticket>{load, backup}));
  EXPECT_EQ(cc.stats().jobs, 2);
}

TEST(CacheControllerTest, WaitOnACompletedTicketReturnsAtOnce) {
  Pools pools;
  CacheController cc(*pools.cpu, pools.device->memory(), pools.host->memory());
  const auto t = cc.Submit(CopyDirection::kDeviceToHost, {{1, 1}});
  cc.Wait(t);
  cc.Wait(t);  // completed, not yet polled
  ASSERT_EQ(cc.Poll().size(), 1u);
  cc.Wait(t);  // completed and polled
  EXPECT_TRUE(cc.Poll().empty()) << "Wait must not produce a second completion";
}

TEST(CacheControllerTest, FailedCopyIsReportedNotCounted) {
  Pools pools;
  RecordingCopyBackend rec;
  rec.fail = true;
  CacheController cc(rec, pools.device->memory(), pools.host->memory());
  cc.Wait(cc.Submit(CopyDirection::kHostToDevice, {{1, 2}, {5, 6}}));
  const auto done = cc.Poll();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), StatusCode::kInternal);
  EXPECT_NE(done[0].status.message().find("loading back 2 KV pages"), std::string::npos)
      << done[0].status.message();
  EXPECT_NE(done[0].status.message().find("on fire"), std::string::npos)
      << done[0].status.message();
  EXPECT_EQ(cc.stats().jobs, 1);
  EXPECT_EQ(cc.stats().bytes_h2d, 0u);
}

TEST(CacheControllerTest, DestructorFinishesQueuedJobs) {
  Pools pools(64, 256);
  const KvPoolMemory dev = pools.device->memory(), host = pools.host->memory();
  for (int64_t p = 0; p < 64; ++p) FillPage(dev, p, 9);
  {
    CacheController cc(*pools.cpu, dev, host);
    for (int j = 0; j < 4; ++j) {
      std::vector<PageCopy> job;
      for (int p = 0; p < 64; ++p) job.push_back({p, j * 64 + p});
      cc.Submit(CopyDirection::kDeviceToHost, std::move(job));
    }
  }  // no Wait: the destructor runs them all
  for (int j = 0; j < 4; ++j)
    for (int p = 0; p < 64; ++p)
      ASSERT_TRUE(PageHolds(host, j * 64 + p, p, 9)) << "job " << j << " page " << p;
}

// The engine thread keeps writing KV pages that no job touches while
// backups and load-backs run: every copy is exact and no write is lost.
TEST(CacheControllerTest, CopiesStayExactWhileTheEngineWritesOtherPages) {
  Pools pools(128, 64, BigTwoGroups());
  const KvPoolMemory dev = pools.device->memory(), host = pools.host->memory();
  CacheController cc(*pools.cpu, dev, host);
  // Device pages 0..63 go out to scattered host pages and, after a clobber,
  // come back into the same device pages; 64..127 are the engine's.
  for (int round = 0; round < 8; ++round) {
    const uint32_t seed = 100 + round;
    for (int64_t p = 0; p < 64; ++p) FillPage(dev, p, seed);
    std::vector<PageCopy> out, back;
    for (int p = 0; p < 64; ++p) {
      out.push_back({p, (p * 37 + round) % 64});  // scattered host pages
      back.push_back({(p * 37 + round) % 64, p});
    }
    const auto t_out = cc.Submit(CopyDirection::kDeviceToHost, out);
    // Meanwhile: the "engine" writes its own pages (and checks them).
    for (int64_t p = 64; p < 128; ++p) FillPage(dev, p, seed);
    cc.Wait(t_out);
    for (int64_t p = 0; p < 64; ++p) ClobberPage(dev, p);
    const auto t_back = cc.Submit(CopyDirection::kHostToDevice, back);
    for (int64_t p = 64; p < 128; ++p)
      ASSERT_TRUE(PageHolds(dev, p, p, seed)) << "engine page " << p;
    for (int64_t p = 64; p < 128; ++p) FillPage(dev, p, seed + 1000);
    cc.Wait(t_back);
    for (int64_t p = 0; p < 64; ++p)
      ASSERT_TRUE(PageHolds(dev, p, p, seed)) << "round " << round << " page " << p;
    for (int64_t p = 64; p < 128; ++p)
      ASSERT_TRUE(PageHolds(dev, p, p, seed + 1000)) << "engine page " << p;
  }
  for (const auto& c : cc.Poll()) EXPECT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(cc.stats().jobs, 16);
}

TEST(CacheControllerDeathTest, RejectsOutOfRangeAndDuplicateDestinations) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the controller and copy threads run
  Pools pools(8, 16);
  CacheController cc(*pools.cpu, pools.device->memory(), pools.host->memory());
  EXPECT_DEATH(cc.Submit(CopyDirection::kDeviceToHost, {{8, 0}}), "outside the pools");
  EXPECT_DEATH(cc.Submit(CopyDirection::kHostToDevice, {{15, 8}}), "outside the pools");
  EXPECT_DEATH(cc.Submit(CopyDirection::kDeviceToHost, {{1, 3}, {2, 3}}), "destination page twice");
}

}  // namespace
}  // namespace strata

#include "cache/kv_pool.h"

#include "cache/page_table.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

namespace strata {
namespace {

// Test-only backend: aligned malloc for memory, optionally failing the n-th
// allocation; the compute ops are never called by the pool.
class MallocBackend : public Backend {
 public:
  int allocations = 0;
  int live = 0;
  int fail_at = -1;  // index of the Allocate call that fails

  std::string Name() const override { return "malloc-test"; }
  StatusOr<Buffer> Allocate(size_t bytes) override {
    if (allocations++ == fail_at) return ResourceExhausted("test: out of memory");
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) return ResourceExhausted("aligned_alloc failed");
    ++live;
    live_counter_ = &live;
    return Buffer(p, bytes, &MallocBackend::Free);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void CopyToHost(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  Status CopyBlocks(std::span<const CopyBlock> blocks, CopyKind) override {
    for (const CopyBlock& b : blocks) std::memcpy(b.dst, b.src, b.bytes);
    return OkStatus();
  }
  void Embedding(const Tensor&, const int32_t*, Tensor) override { std::abort(); }
  void RmsNorm(const Tensor&, const Tensor&, float, Tensor) override { std::abort(); }
  void Linear(const Tensor&, const Tensor&, const Tensor*, Tensor) override { std::abort(); }
  void SiluMul(const Tensor&, const Tensor&, Tensor) override { std::abort(); }
  void Add(const Tensor&, const Tensor&, Tensor) override { std::abort(); }
  void Rope(Tensor, Tensor, const int32_t*, const RopeParams&) override { std::abort(); }
  void StoreKv(const Tensor&, const Tensor&, const KvLayerView&, const int64_t*) override { std::abort(); }
  void PagedAttention(const Tensor&, const KvLayerView&, const AttentionSeq*, int32_t, const AttentionParams&,
                      Tensor) override {
    std::abort();
  }
  void GatherRows(const Tensor&, const int32_t*, Tensor) override { std::abort(); }
  void ScaleAddRows(const Tensor&, const int32_t*, const float*, Tensor) override { std::abort(); }

 private:
  static void Free(void* p) {
    std::free(p);
    if (live_counter_) --*live_counter_;
  }
  static inline int* live_counter_ = nullptr;
};

KvLayout TwoGroups(int page_size) {
  KvLayout l;
  l.page_size = page_size;
  l.groups.push_back(PoolGroupSpec{"full", 3, 2, 8, DType::kF32});
  PoolGroupSpec latent{"latent", 2, 1, 12, DType::kBF16};
  latent.has_v = false;
  l.groups.push_back(latent);
  return l;
}

TEST(KvPoolTest, AllocatesOneBufferPerGroupOfTheRightSize) {
  MallocBackend backend;
  KvLayout layout = TwoGroups(16);
  auto pool = KvPool::Create(layout, 10, backend);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(backend.allocations, 2);
  EXPECT_EQ((*pool)->num_pages(), 10);
  EXPECT_EQ((*pool)->page_size(), 16);
  EXPECT_EQ((*pool)->allocator().num_free(), 10);
  EXPECT_EQ((*pool)->total_bytes(), layout.BytesPerPage() * 10);
  EXPECT_EQ((*pool)->memory_source(), "malloc-test");
  pool->reset();
  EXPECT_EQ(backend.live, 0);
}

// Every (group, layer, K/V) view covers num_pages * page bytes, views never
// overlap, and each stays inside its group's allocation.
void CheckViewsDistinct(int page_size) {
  MallocBackend backend;
  KvLayout layout = TwoGroups(page_size);
  const int64_t pages = 7;
  auto pool_or = KvPool::Create(layout, pages, backend);
  ASSERT_TRUE(pool_or.ok()) << pool_or.status().ToString();
  const KvPool& pool = **pool_or;

  std::map<const char*, const char*> ranges;  // begin -> end
  for (int g = 0; g < pool.num_groups(); ++g) {
    const PoolGroupSpec& s = layout.groups[g];
    const size_t tensor_bytes = layout.BytesPerPagePerTensor(g) * pages;
    for (int l = 0; l < s.num_layers; ++l) {
      KvLayerView v = pool.Layer(g, l);
      EXPECT_EQ(v.page_size, page_size);
      EXPECT_EQ(v.num_kv_heads, s.num_kv_heads);
      EXPECT_EQ(v.head_dim, s.head_dim);
      EXPECT_EQ(v.dtype, s.dtype);
      EXPECT_EQ(v.num_pages, pages);
      ASSERT_NE(v.k, nullptr);
      EXPECT_EQ(v.v == nullptr, !s.has_v);
      for (void* t : {v.k, v.v}) {
        if (!t) continue;
        const char* b = static_cast<const char*>(t);
        ranges[b] = b + tensor_bytes;
      }
    }
  }
  ASSERT_EQ(ranges.size(), 3u * 2 + 2u * 1);
  const char* prev_end = nullptr;
  for (auto [b, e] : ranges) {
    if (prev_end) {
      EXPECT_LE(prev_end, b) << "views overlap";
    }
    prev_end = e;
  }

  // Writing the last slot of every tensor through its view and reading it
  // back proves each view owns its memory (and ASan/valgrind see the bounds).
  for (int g = 0; g < pool.num_groups(); ++g) {
    const size_t tensor_bytes = layout.BytesPerPagePerTensor(g) * pages;
    for (int l = 0; l < layout.groups[g].num_layers; ++l) {
      KvLayerView v = pool.Layer(g, l);
      std::memset(v.k, 0x10 + l, tensor_bytes);
      if (v.v) std::memset(v.v, 0x50 + l, tensor_bytes);
    }
    for (int l = 0; l < layout.groups[g].num_layers; ++l) {
      KvLayerView v = pool.Layer(g, l);
      EXPECT_EQ(static_cast<unsigned char*>(v.k)[0], 0x10 + l);
      EXPECT_EQ(static_cast<unsigned char*>(v.k)[tensor_bytes - 1], 0x10 + l);
      if (v.v) {
        EXPECT_EQ(static_cast<unsigned char*>(v.v)[tensor_bytes - 1], 0x50 + l);
      }
    }
  }
}

TEST(KvPoolTest, LayerViewsAreDistinctPageSize1) { CheckViewsDistinct(1); }
TEST(KvPoolTest, LayerViewsAreDistinctPageSize16) { CheckViewsDistinct(16); }

TEST(KvPoolTest, SlotAddressMatchesKvLayerViewLayout) {
  // Token slot s of a layer is at k + s * kv_heads * head_dim elements.
  MallocBackend backend;
  KvLayout layout = TwoGroups(4);
  auto pool = KvPool::Create(layout, 3, backend);
  ASSERT_TRUE(pool.ok());
  KvLayerView v = (*pool)->Layer(0, 1);
  const int64_t per_token = int64_t{v.num_kv_heads} * v.head_dim;
  const int64_t last_slot = v.num_pages * v.page_size - 1;
  float* k = static_cast<float*>(v.k);
  k[last_slot * per_token + per_token - 1] = 3.5f;  // last element of the tensor
  EXPECT_EQ(static_cast<char*>(v.v) - static_cast<char*>(v.k),
            static_cast<std::ptrdiff_t>(layout.BytesPerPagePerTensor(0) * 3));
  EXPECT_EQ(k[(last_slot + 1) * per_token - 1], 3.5f);
}

// A group of one entry per 4 tokens at page size 16 holds 4 entries per
// page: its layers are a quarter of a token group's size, the view carries
// tokens_per_entry, and the page copy unit (PagePtr) agrees with the view.
TEST(KvPoolTest, GroupOfEntriesPerWindowSizesPagesByEntries) {
  MallocBackend backend;
  KvLayout layout;
  layout.page_size = 16;
  PoolGroupSpec tokens{"tokens", 2, 1, 8, DType::kF32};
  tokens.has_v = false;
  PoolGroupSpec entries = tokens;
  entries.name = "entries";
  entries.tokens_per_entry = 4;
  layout.groups = {tokens, entries};
  auto pool = KvPool::Create(layout, 5, backend);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  KvLayerView t = (*pool)->Layer(0, 1), e = (*pool)->Layer(1, 1);
  EXPECT_EQ(t.tokens_per_entry, 1);
  EXPECT_EQ(e.tokens_per_entry, 4);
  EXPECT_EQ((*pool)->total_bytes(), 5 * (layout.BytesPerPage(0) + layout.BytesPerPage(1)));
  EXPECT_EQ(layout.BytesPerPage(1) * 4, layout.BytesPerPage(0));
  // Entry 3 of page 2 (slot 2 * 4 + 3) is the last entry of that page's run.
  const KvPoolMemory m = (*pool)->memory();
  float* page2 = reinterpret_cast<float*>(m.PagePtr(1, 1, 0, 2));
  EXPECT_EQ(page2, static_cast<float*>(e.k) + (2 * 4) * 8);
  EXPECT_EQ(m.PagePtr(1, 1, 0, 3) - m.PagePtr(1, 1, 0, 2),
            static_cast<std::ptrdiff_t>(layout.BytesPerPagePerTensor(1)));
  EXPECT_EQ(layout.BytesPerPagePerTensor(1), 4u * 8 * sizeof(float));
}

TEST(KvPoolTest, FailedAllocationFreesEarlierGroups) {
  MallocBackend backend;
  backend.fail_at = 1;  // the second group
  auto pool = KvPool::Create(TwoGroups(16), 10, backend);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(pool.status().message().find("group \"latent\""), std::string::npos) << pool.status().message();
  EXPECT_NE(pool.status().message().find("malloc-test"), std::string::npos);
  EXPECT_EQ(backend.live, 0);
}

// A KvPoolAllocator with state (what the seam is for: a Buffer's free
// function has none): counts its live blocks, can fail the n-th
// allocation or hand out a misaligned block.
class CountingAllocator : public KvPoolAllocator {
 public:
  int live = 0;
  int calls = 0;
  int fail_at = -1;
  int misalign_at = -1;
  std::vector<int> groups;

  StatusOr<KvPoolBlock> Allocate(int group, size_t bytes) override {
    groups.push_back(group);
    const int call = calls++;
    if (call == fail_at) return Unavailable("test allocator: no memory for group " + std::to_string(group));
    char* p = static_cast<char*>(std::aligned_alloc(64, (bytes + 64 + 63) / 64 * 64));
    if (!p) return ResourceExhausted("aligned_alloc failed");
    ++live;
    std::shared_ptr<void> owner(p, [this](void* q) {
      std::free(q);
      --live;
    });
    return KvPoolBlock{call == misalign_at ? p + 1 : p, bytes, std::move(owner)};
  }
  std::string Describe() const override { return "counting test allocator"; }
};

TEST(KvPoolTest, AllocatorGivesTheMemoryAndFreesItWithThePool) {
  MallocBackend backend;
  CountingAllocator alloc;
  const KvLayout layout = TwoGroups(16);
  auto pool = KvPool::Create(layout, 10, backend, &alloc);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(backend.allocations, 0) << "the backend allocated although an allocator was given";
  EXPECT_EQ(alloc.live, 2);
  EXPECT_EQ(alloc.groups, (std::vector<int>{0, 1}));
  EXPECT_EQ((*pool)->memory_source(), "counting test allocator");
  EXPECT_EQ((*pool)->total_bytes(), layout.BytesPerPage() * 10);
  // The views point into the allocator's blocks, which are writable.
  const KvPoolMemory m = (*pool)->memory();
  ASSERT_EQ(m.group_base.size(), 2u);
  EXPECT_EQ(static_cast<void*>(m.group_base[0]), (*pool)->Layer(0, 0).k);
  for (int g = 0; g < 2; ++g) std::memset(m.group_base[g], 0x5A, layout.BytesPerPage(g) * 10);
  pool->reset();
  EXPECT_EQ(alloc.live, 0);
}

TEST(KvPoolTest, AllocatorFailureFreesEarlierGroupsAndNamesTheSource) {
  MallocBackend backend;
  CountingAllocator alloc;
  alloc.fail_at = 1;
  auto pool = KvPool::Create(TwoGroups(16), 10, backend, &alloc);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(pool.status().message().find("latent"), std::string::npos) << pool.status().message();
  EXPECT_NE(pool.status().message().find("counting test allocator"), std::string::npos)
      << pool.status().message();
  EXPECT_EQ(alloc.live, 0);

  CountingAllocator bad;
  bad.misalign_at = 0;
  auto misaligned = KvPool::Create(TwoGroups(16), 10, backend, &bad);
  ASSERT_FALSE(misaligned.ok());
  EXPECT_NE(misaligned.status().message().find("64-byte aligned"), std::string::npos)
      << misaligned.status().message();
  EXPECT_EQ(bad.live, 0);
  EXPECT_EQ(backend.allocations, 0);
}

TEST(KvPoolTest, RejectsBadLayoutAndPageCount) {
  MallocBackend backend;
  EXPECT_EQ(KvPool::Create(TwoGroups(0), 10, backend).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvPool::Create(TwoGroups(16), 0, backend).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.allocations, 0);
}

TEST(KvPoolTest, SizedFromTokenBudget) {
  MallocBackend backend;
  KvLayout layout = TwoGroups(16);
  auto pages = NumKvPagesForTokens(layout, 100);
  ASSERT_TRUE(pages.ok());
  auto pool = KvPool::Create(layout, *pages, backend);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->num_pages() * (*pool)->page_size(), 96);
}

// With the real CPU backend: StoreKv through the pool's views into the slots
// a PageTable hands out lands where KvLayerView's layout says, in that layer
// only, and a child sharing a prefix writes only its own pages.
TEST(KvPoolTest, CpuBackendStoreKvFollowsPageTableSlots) {
  CpuBackendOptions o;
  o.num_threads = 1;
  auto backend = CreateCpuBackend(o);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  KvLayout layout;
  layout.page_size = 4;
  layout.groups.push_back(PoolGroupSpec{"full", 2, 2, 8, DType::kBF16});
  auto pool_or = KvPool::Create(layout, 6, **backend);
  ASSERT_TRUE(pool_or.ok()) << pool_or.status().ToString();
  KvPool& pool = **pool_or;
  const int64_t e = 2 * 8;  // kv_heads * head_dim
  const size_t tensor_bytes = layout.BytesPerPagePerTensor(0) * 6;
  for (int l = 0; l < 2; ++l) {
    std::memset(pool.Layer(0, l).k, 0, tensor_bytes);
    std::memset(pool.Layer(0, l).v, 0, tensor_bytes);
  }

  std::vector<int32_t> taken;
  ASSERT_TRUE(pool.allocator().Allocate(1, &taken).ok());  // page 0 belongs to someone else
  PageTable parent(4);
  ASSERT_TRUE(parent.Reserve(10, pool.allocator()).ok());  // pages 1, 2, 3
  parent.SetNumTokens(10);

  // Token t's K row holds t * 16 + c, V row -(t * 16 + c): integers below
  // 256, exact in bf16.
  auto store = [&](const PageTable& t, int64_t begin, int64_t end, float add) {
    const int64_t n = end - begin;
    std::vector<float> k(static_cast<size_t>(n * e)), v(k.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < e; ++c) {
        k[i * e + c] = static_cast<float>((begin + i) * 16 + c) + add;
        v[i * e + c] = -k[i * e + c];
      }
    }
    std::vector<int64_t> slots(static_cast<size_t>(n));
    t.Slots(begin, end, slots.data());
    (*backend)->StoreKv(Tensor{k.data(), DType::kF32, n, e, 0}, Tensor{v.data(), DType::kF32, n, e, 0},
                        pool.Layer(0, 1), slots.data());
  };
  // Element c of token pos, read by the documented layout
  // [page][offset][kv_head][head_dim] from the view's base.
  auto read = [&](const void* base, const PageTable& t, int64_t pos, int64_t c) {
    const int64_t page = t.pages()[pos / 4];
    const auto* bf = static_cast<const uint16_t*>(base);
    return Bf16ToFloat(bf[(page * 4 + pos % 4) * e + c]);
  };

  store(parent, 0, 10, 0.f);
  for (int64_t pos = 0; pos < 10; ++pos) {
    for (int64_t c = 0; c < e; ++c) {
      ASSERT_EQ(read(pool.Layer(0, 1).k, parent, pos, c), pos * 16 + c) << pos << "," << c;
      ASSERT_EQ(read(pool.Layer(0, 1).v, parent, pos, c), -(pos * 16 + c));
      ASSERT_EQ(read(pool.Layer(0, 0).k, parent, pos, c), 0.f) << "layer 0 written";
    }
  }

  // The child shares the first full page, then writes positions 4..7 of
  // its own: the parent's page for those positions stays as it was.
  PageTable child(4);
  child.AdoptSharedPrefix(std::span<const int32_t>(parent.pages().data(), 1), pool.allocator());
  ASSERT_TRUE(child.Reserve(8, pool.allocator()).ok());
  child.SetNumTokens(8);
  ASSERT_NE(child.pages()[1], parent.pages()[1]);
  store(child, 4, 8, 0.5f);  // 64.5 .. 127.5: still exact in bf16
  EXPECT_EQ(read(pool.Layer(0, 1).k, child, 4, 0), 64.5f);
  EXPECT_EQ(read(pool.Layer(0, 1).k, child, 7, 15), 127.5f);
  EXPECT_EQ(read(pool.Layer(0, 1).k, parent, 4, 0), 64.f);  // the parent's page is untouched
  EXPECT_EQ(read(pool.Layer(0, 1).k, child, 0, 3), 3.f);  // shared page, written by the parent
  parent.Release(pool.allocator());
  EXPECT_EQ(pool.allocator().refcount(child.pages()[0]), 1);
  EXPECT_EQ(read(pool.Layer(0, 1).k, child, 2, 5), 37.f);
  child.Release(pool.allocator());
  pool.allocator().Unref(taken[0]);
  EXPECT_EQ(pool.allocator().num_used(), 0);
  EXPECT_TRUE(pool.allocator().CheckIntegrity().ok());
}

}  // namespace
}  // namespace strata

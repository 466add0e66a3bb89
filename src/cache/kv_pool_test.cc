#include "cache/kv_pool.h"

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

}  // namespace
}  // namespace strata

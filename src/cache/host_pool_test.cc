#include "cache/host_pool.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cache/kv_pool.h"

namespace strata {
namespace {

// A 2-group layout: one GQA group with K and V, one K-only (MLA-like) group.
KvLayout TwoGroups() {
  KvLayout l;
  l.page_size = 4;
  l.groups.push_back({"full_attention", 3, 2, 8, DType::kBF16, true, 0});
  l.groups.push_back({"latent", 2, 1, 24, DType::kF32, false, 0});
  return l;
}

// Test-only backend recording PinHostMemory / UnpinHostMemory; optionally
// failing the n-th pin. The pool calls nothing else.
class PinRecorder : public Backend {
 public:
  std::vector<void*> pinned, unpinned;
  int fail_pin_at = -1;

  std::string Name() const override { return "pin-recorder"; }
  Status PinHostMemory(void* p, size_t) override {
    if (static_cast<int>(pinned.size()) == fail_pin_at)
      return ResourceExhausted("test: cannot pin");
    pinned.push_back(p);
    return OkStatus();
  }
  void UnpinHostMemory(void* p) override { unpinned.push_back(p); }
  StatusOr<Buffer> Allocate(size_t) override { std::abort(); }
  void CopyToDevice(void*, const void*, size_t) override { std::abort(); }
  void CopyToHost(void*, const void*, size_t) override { std::abort(); }
  Status CopyBlocks(std::span<const CopyBlock>, CopyKind) override { std::abort(); }
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
};

// Virtual memory of this process in KiB (/proc/self/status VmSize).
int64_t VmSizeKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7));
  return -1;
}

TEST(HostKvPoolTest, LayoutMatchesTheDevicePool) {
  const KvLayout layout = TwoGroups();
  constexpr int64_t kPages = 37;
  auto host = HostKvPool::Create(layout, kPages, -1, nullptr);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_EQ((*host)->num_pages(), kPages);
  EXPECT_EQ((*host)->allocator().num_pages(), kPages);
  EXPECT_EQ((*host)->allocator().num_free(), kPages);
  EXPECT_EQ((*host)->numa_node(), -1);
  EXPECT_FALSE((*host)->pinned());
  EXPECT_EQ((*host)->total_bytes(), layout.BytesPerPage() * kPages);

  auto cpu = CreateCpuBackend(CpuBackendOptions{});
  ASSERT_TRUE(cpu.ok());
  auto device = KvPool::Create(layout, kPages, **cpu);
  ASSERT_TRUE(device.ok());
  const KvPoolMemory h = (*host)->memory(), d = (*device)->memory();
  ASSERT_EQ(h.group_base.size(), 2u);
  EXPECT_EQ(h.num_pages, kPages);
  EXPECT_EQ(h.layout, &(*host)->layout());
  // Same offset of every (group, layer, tensor, page) run on both sides, and
  // the device side is where the backend's views put it.
  for (int g = 0; g < 2; ++g) {
    const PoolGroupSpec& s = layout.groups[g];
    const size_t run = layout.BytesPerPagePerTensor(g);
    for (int l = 0; l < s.num_layers; ++l) {
      const KvLayerView view = (*device)->Layer(g, l);
      for (int t = 0; t < (s.has_v ? 2 : 1); ++t) {
        for (int64_t p = 0; p < kPages; ++p) {
          EXPECT_EQ(h.PagePtr(g, l, t, p) - h.group_base[g],
                    d.PagePtr(g, l, t, p) - d.group_base[g]);
          EXPECT_EQ(d.PagePtr(g, l, t, p), static_cast<char*>(t == 0 ? view.k : view.v) + p * run);
        }
      }
    }
  }
  // Every byte of the host pool is writable and distinct: write each run's
  // index into it, then read all back.
  for (int g = 0; g < 2; ++g) {
    const PoolGroupSpec& s = layout.groups[g];
    const size_t run = layout.BytesPerPagePerTensor(g);
    int32_t id = 0;
    for (int l = 0; l < s.num_layers; ++l)
      for (int t = 0; t < (s.has_v ? 2 : 1); ++t)
        for (int64_t p = 0; p < kPages; ++p, ++id)
          std::memset(h.PagePtr(g, l, t, p), id & 0xff, run);
    id = 0;
    for (int l = 0; l < s.num_layers; ++l)
      for (int t = 0; t < (s.has_v ? 2 : 1); ++t)
        for (int64_t p = 0; p < kPages; ++p, ++id) {
          const char* q = h.PagePtr(g, l, t, p);
          for (size_t i = 0; i < run; ++i) ASSERT_EQ(static_cast<uint8_t>(q[i]), id & 0xff);
        }
  }
}

TEST(HostKvPoolTest, BindsToNodeZeroBeforeFirstTouch) {
  auto pool = HostKvPool::Create(TwoGroups(), 1000, 0, nullptr);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->numa_node(), 0);
  // The kernel's policy for each mapping is MPOL_BIND to {0}.
  for (char* base : (*pool)->memory().group_base) {
    int mode = -1;
    unsigned long mask[16] = {};
    constexpr unsigned long kMpolFAddr = 1UL << 1;  // <linux/mempolicy.h>: policy of the address
    ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 16 * 64UL, base, kMpolFAddr), 0)
        << std::strerror(errno);
    EXPECT_EQ(mode, 2) << "MPOL_BIND";
    EXPECT_EQ(mask[0], 1UL);
    base[0] = 1;  // and it can be touched
  }
}

TEST(HostKvPoolTest, AbsentNodeFailsCleanlyNamingIt) {
  PinRecorder pins;
  const int64_t vm_before = VmSizeKib();
  // 100k pages of ~1 KiB: ~100 MB mapped per group if it leaked.
  auto pool = HostKvPool::Create(TwoGroups(), 100000, 999, &pins);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
  const std::string msg = pool.status().message();
  EXPECT_NE(msg.find("NUMA node 999"), std::string::npos) << msg;
  EXPECT_NE(msg.find("full_attention"), std::string::npos) << msg;
  EXPECT_NE(msg.find("online nodes are"), std::string::npos) << msg;
  EXPECT_TRUE(pins.pinned.empty()) << "bound before pinned";
  EXPECT_LT(VmSizeKib() - vm_before, 50 * 1024) << "the mapping stayed after the failure";

  auto negative = HostKvPool::Create(TwoGroups(), 10, -2, nullptr);
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  // Far past any node id Linux has: refused without a node mask of that size.
  auto huge = HostKvPool::Create(TwoGroups(), 10, 1 << 30, nullptr);
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("does not exist"), std::string::npos)
      << huge.status().message();
}

TEST(HostKvPoolTest, RejectsBadLayoutAndPageCount) {
  EXPECT_EQ(HostKvPool::Create(TwoGroups(), 0, -1, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(HostKvPool::Create(TwoGroups(), kMaxKvPages + 1, -1, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  KvLayout empty;
  EXPECT_EQ(HostKvPool::Create(empty, 10, -1, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(HostKvPoolTest, TooBigAMappingIsResourceExhaustedAndFreesEarlierGroups) {
  // Group 0 ~1 GiB (virtual), group 1 ~2^30 pages x 64 MiB: more address
  // space than exists.
  KvLayout l;
  l.page_size = 16;
  l.groups.push_back({"small", 1, 1, 64, DType::kF16, true, 0});
  l.groups.push_back({"huge", 4096, 64, 128, DType::kF32, true, 0});
  const int64_t pages = int64_t{1} << 18;  // group 0: 2^18 x 4 KiB = 1 GiB
  const int64_t vm_before = VmSizeKib();
  auto pool = HostKvPool::Create(l, pages, -1, nullptr);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kResourceExhausted);
  const std::string msg = pool.status().message();
  EXPECT_NE(msg.find("\"huge\""), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(l.BytesPerPage(1) * pages) + " bytes"), std::string::npos)
      << msg;
  EXPECT_LT(VmSizeKib() - vm_before, 512 * 1024) << "group \"small\" stayed mapped";
}

TEST(HostKvPoolTest, PinsEachGroupAndUnpinsOnDestructionOrFailure) {
  PinRecorder pins;
  {
    auto pool = HostKvPool::Create(TwoGroups(), 64, -1, &pins);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    EXPECT_TRUE((*pool)->pinned());
    const std::vector<char*> bases = (*pool)->memory().group_base;
    ASSERT_EQ(pins.pinned.size(), 2u);
    EXPECT_EQ(pins.pinned[0], bases[0]);
    EXPECT_EQ(pins.pinned[1], bases[1]);
    EXPECT_TRUE(pins.unpinned.empty());
  }
  EXPECT_EQ(std::multiset<void*>(pins.unpinned.begin(), pins.unpinned.end()),
            std::multiset<void*>(pins.pinned.begin(), pins.pinned.end()));

  PinRecorder failing;
  failing.fail_pin_at = 1;  // the second group
  auto pool = HostKvPool::Create(TwoGroups(), 64, -1, &failing);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(pool.status().message().find("pinning host KV pool group \"latent\""),
            std::string::npos)
      << pool.status().message();
  ASSERT_EQ(failing.pinned.size(), 1u);
  EXPECT_EQ(failing.unpinned, failing.pinned) << "the first group's pin outlived the failure";
}

}  // namespace
}  // namespace strata

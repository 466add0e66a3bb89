// DeviceArena (first-fit, aligned, coalescing, exhaustion) over a fake
// address range, and the arena-size and upload-dtype rules plans count with.
#include "backend/device_memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace strata {
namespace {

constexpr uintptr_t kBase = uintptr_t{1} << 40;  // never dereferenced
constexpr uint64_t kA = kDeviceArenaAlignment;

TEST(DeviceArenaTest, BlocksAreAlignedAndRoundedUp) {
  DeviceArena a(kBase, 64 * kA);
  const uintptr_t p = a.Allocate(1), q = a.Allocate(kA + 1), r = a.Allocate(0);
  EXPECT_EQ(p, kBase);
  EXPECT_EQ(q, kBase + kA);      // 1 byte took one unit
  EXPECT_EQ(r, kBase + 3 * kA);  // kA + 1 bytes took two
  EXPECT_NE(r, 0u);              // zero bytes still get a distinct block
  for (uintptr_t x : {p, q, r}) EXPECT_EQ(x % kA, 0u);
  EXPECT_EQ(a.used(), 4 * kA);
  EXPECT_EQ(a.num_blocks(), 3);
  EXPECT_EQ(a.CheckIntegrity(), "");
}

TEST(DeviceArenaTest, FirstFitReusesTheLowestHoleThatFits) {
  DeviceArena a(kBase, 16 * kA);
  const uintptr_t b0 = a.Allocate(2 * kA), b1 = a.Allocate(kA), b2 = a.Allocate(4 * kA);
  a.Allocate(kA);
  a.Free(b0);                         // hole of 2 at the bottom
  a.Free(b2);                         // hole of 4 in the middle
  EXPECT_EQ(a.Allocate(3 * kA), b2);  // the 2-unit hole is too small
  EXPECT_EQ(a.Allocate(kA), b0);      // the lowest hole that fits
  (void)b1;
  EXPECT_EQ(a.CheckIntegrity(), "");
}

TEST(DeviceArenaTest, FreeMergesWithBothNeighbours) {
  DeviceArena a(kBase, 8 * kA);
  const uintptr_t x = a.Allocate(2 * kA), y = a.Allocate(2 * kA), z = a.Allocate(2 * kA);
  EXPECT_EQ(a.largest_free(), 2 * kA);
  a.Free(x);
  a.Free(z);  // z merges with the free tail
  EXPECT_EQ(a.largest_free(), 4 * kA);
  a.Free(y);  // y merges with x below and z + tail above: one range again
  EXPECT_EQ(a.largest_free(), 8 * kA);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.CheckIntegrity(), "");
  EXPECT_EQ(a.Allocate(8 * kA), kBase);  // the whole arena in one block
}

TEST(DeviceArenaTest, ExhaustionReturnsZeroAndChangesNothing) {
  DeviceArena a(kBase, 4 * kA);
  EXPECT_EQ(a.Allocate(5 * kA), 0u);
  const uintptr_t p = a.Allocate(3 * kA);
  ASSERT_NE(p, 0u);
  EXPECT_EQ(a.Allocate(2 * kA), 0u);  // one unit left
  EXPECT_EQ(a.AllocateHigh(2 * kA), 0u);
  EXPECT_EQ(a.used(), 3 * kA);
  EXPECT_NE(a.Allocate(kA), 0u);
  EXPECT_EQ(a.Allocate(1), 0u);  // full
  EXPECT_EQ(a.CheckIntegrity(), "");
  // Fragmented: 2 units free in total, never 2 together.
  DeviceArena f(kBase, 4 * kA);
  const uintptr_t u0 = f.Allocate(kA);
  f.Allocate(kA);
  const uintptr_t u2 = f.Allocate(kA);
  f.Allocate(kA);
  f.Free(u0);
  f.Free(u2);
  EXPECT_EQ(f.used(), 2 * kA);
  EXPECT_EQ(f.largest_free(), kA);
  EXPECT_EQ(f.Allocate(2 * kA), 0u);
}

TEST(DeviceArenaTest, HighAllocationsStayAboveLowOnesAndGiveTheTopBack) {
  DeviceArena a(kBase, 16 * kA);
  const uintptr_t w0 = a.Allocate(4 * kA);
  const uintptr_t staging = a.AllocateHigh(3 * kA);
  EXPECT_EQ(staging, kBase + 13 * kA);  // the top three units
  const uintptr_t w1 = a.Allocate(4 * kA);
  EXPECT_EQ(w1, w0 + 4 * kA);  // low blocks stay packed below the staging
  a.Free(staging);
  EXPECT_EQ(a.largest_free(), 8 * kA);  // no hole left behind
  EXPECT_EQ(a.CheckIntegrity(), "");
}

TEST(DeviceArenaTest, PeakAndRandomChurnKeepTheInvariants) {
  DeviceArena a(kBase, 1024 * kA);
  std::mt19937 rng(7);
  std::vector<uintptr_t> live;
  uint64_t expect_peak = 0;
  for (int i = 0; i < 4000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t k = rng() % live.size();
      a.Free(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      const uint64_t bytes = 1 + rng() % (8 * kA);
      const uintptr_t p = rng() % 4 == 0 ? a.AllocateHigh(bytes) : a.Allocate(bytes);
      if (p != 0) {
        EXPECT_EQ(p % kA, 0u);
        EXPECT_GE(p, kBase);
        EXPECT_LE(p + ArenaBlockBytes(bytes), kBase + 1024 * kA);
        live.push_back(p);
      }
    }
    expect_peak = std::max(expect_peak, a.used());
    if (i % 250 == 0) {
      ASSERT_EQ(a.CheckIntegrity(), "") << "after step " << i;
    }
  }
  EXPECT_EQ(a.peak_used(), expect_peak);
  for (uintptr_t p : live) a.Free(p);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.largest_free(), 1024 * kA);
  EXPECT_EQ(a.CheckIntegrity(), "");
}

TEST(DeviceArenaDeathTest, FreeOfAForeignPointerAborts) {
  DeviceArena a(kBase, 4 * kA);
  const uintptr_t p = a.Allocate(kA);
  EXPECT_DEATH(a.Free(p + kA), "did not hand out");
}

TEST(DeviceMemoryRulesTest, ArenaIsTheFractionOfTotalRoundedToTheGranularity) {
  DeviceMemoryFacts h200;
  h200.total_bytes = uint64_t{150754820096};  // what an H200 reports (140.4 GiB)
  const uint64_t arena = ArenaBytes(h200, 0.88);
  EXPECT_EQ(arena % kDeviceArenaGranularity, 0u);
  EXPECT_LE(arena, static_cast<uint64_t>(0.88 * 150754820096.0));
  EXPECT_GT(arena + kDeviceArenaGranularity, static_cast<uint64_t>(0.88 * 150754820096.0));
  EXPECT_EQ(ArenaBytes(h200, 1.0),
            h200.total_bytes / kDeviceArenaGranularity * kDeviceArenaGranularity);
}

TEST(DeviceMemoryRulesTest, UploadDTypeAndBackendInternals) {
  EXPECT_EQ(CudaWeightDType(DType::kBF16, false), DType::kF32);
  EXPECT_EQ(CudaWeightDType(DType::kF16, false), DType::kF32);
  EXPECT_EQ(CudaWeightDType(DType::kBF16, true), DType::kBF16);
  EXPECT_EQ(CudaWeightDType(DType::kF16, true), DType::kF32);
  EXPECT_EQ(CudaWeightDType(DType::kF32, true), DType::kF32);
  const uint64_t fp32 = CudaBackendArenaBytes(false, 576, 4096);
  EXPECT_EQ(fp32, kA + kCudaGemmWorkspaceBytes);  // no scratch without bf16 GEMMs
  EXPECT_EQ(CudaBackendArenaBytes(true, 576, 4096), fp32 + 576 * 4096 * 2);
}

}  // namespace
}  // namespace strata

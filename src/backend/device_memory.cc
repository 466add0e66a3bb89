#include "backend/device_memory.h"

#include <algorithm>
#include <cmath>

#include "util/logging.h"

namespace strata {

uint64_t ArenaBytes(const DeviceMemoryFacts& facts, double fraction) {
  const long double want = static_cast<long double>(facts.total_bytes) * fraction;
  const uint64_t bytes = want <= 0 ? 0 : static_cast<uint64_t>(std::floor(want));
  return bytes / kDeviceArenaGranularity * kDeviceArenaGranularity;
}

DType CudaWeightDType(DType checkpoint, bool bf16_matmul) {
  return bf16_matmul && checkpoint == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

uint64_t CudaBackendArenaBytes(bool bf16_matmul, int64_t max_linear_rows, int64_t max_16bit_cols) {
  uint64_t bytes = ArenaBlockBytes(sizeof(int32_t)) + ArenaBlockBytes(kCudaGemmWorkspaceBytes);
  if (bf16_matmul && max_linear_rows > 0 && max_16bit_cols > 0)
    bytes += ArenaBlockBytes(static_cast<uint64_t>(max_linear_rows) *
                             static_cast<uint64_t>(max_16bit_cols) * 2);
  return bytes;
}

uint64_t CudaBackendStepArenaBytes(int64_t max_rows, int64_t vocab, int max_head_dim) {
  constexpr uint64_t kSmBound = 256, kRowsPerSm = 128;
  const uint64_t attention =
      kSmBound * kRowsPerSm * static_cast<uint64_t>(std::max(max_head_dim, 1) + 2) * sizeof(float);
  const uint64_t rows = static_cast<uint64_t>(std::max<int64_t>(max_rows, 1));
  const uint64_t v = static_cast<uint64_t>(std::max<int64_t>(vocab, 1));
  auto grown = [](uint64_t b) { return ArenaBlockBytes(std::max<uint64_t>(b * 5 / 4, 4096)); };
  const uint64_t scratch = grown(rows * v * sizeof(float));
  const uint64_t masses = grown(rows * 2 * ((v + 255) / 256) * sizeof(double));
  const uint64_t results = grown(rows * 512);
  const uint64_t inputs = grown(rows * (512 + v / 8 + (uint64_t{64} << 10)));
  return ArenaBlockBytes(attention) + scratch + masses + results + inputs;
}

DeviceArena::DeviceArena(uintptr_t base, uint64_t size) : base_(base), size_(size) {
  STRATA_CHECK(base % kDeviceArenaAlignment == 0) << "arena base " << base << " is not aligned";
  STRATA_CHECK(size % kDeviceArenaAlignment == 0) << "arena size " << size << " is not aligned";
  if (size > 0) free_.emplace(base, size);
}

uintptr_t DeviceArena::Take(std::map<uintptr_t, uint64_t>::iterator it, uint64_t bytes, bool high) {
  const uintptr_t start = it->first;
  const uint64_t have = it->second;
  uintptr_t p;
  if (high) {
    p = start + (have - bytes);
    if (have == bytes)
      free_.erase(it);
    else
      it->second = have - bytes;
  } else {
    p = start;
    free_.erase(it);
    if (have > bytes) free_.emplace(start + bytes, have - bytes);
  }
  blocks_.emplace(p, bytes);
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return p;
}

uintptr_t DeviceArena::Allocate(uint64_t bytes) {
  const uint64_t need = ArenaBlockBytes(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->second >= need) return Take(it, need, false);
  return 0;
}

uintptr_t DeviceArena::AllocateHigh(uint64_t bytes) {
  const uint64_t need = ArenaBlockBytes(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.rbegin(); it != free_.rend(); ++it)
    if (it->second >= need) return Take(std::prev(it.base()), need, true);
  return 0;
}

void DeviceArena::Free(uintptr_t p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto b = blocks_.find(p);
  STRATA_CHECK(b != blocks_.end())
      << "DeviceArena::Free of " << p << ", which the arena did not hand out (a Strata bug)";
  uintptr_t start = p;
  uint64_t bytes = b->second;
  blocks_.erase(b);
  used_ -= bytes;
  // Merge with the free neighbours on either side.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace(start, bytes);
}

uint64_t DeviceArena::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t DeviceArena::peak_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

uint64_t DeviceArena::largest_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t best = 0;
  for (const auto& [start, bytes] : free_) best = std::max(best, bytes);
  return best;
}

int64_t DeviceArena::num_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(blocks_.size());
}

std::string DeviceArena::CheckIntegrity() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Walk blocks and free ranges together in address order: they must tile
  // [base, base + size) with no gap or overlap, and no two free ranges may
  // touch (they would have been merged).
  std::map<uintptr_t, std::pair<uint64_t, bool>> all;  // start -> (bytes, free)
  for (const auto& [s, n] : blocks_) all.emplace(s, std::make_pair(n, false));
  for (const auto& [s, n] : free_)
    if (!all.emplace(s, std::make_pair(n, true)).second)
      return "free range at " + std::to_string(s) + " is also a block";
  uintptr_t at = base_;
  bool prev_free = false;
  uint64_t used = 0;
  for (const auto& [s, v] : all) {
    const auto [n, is_free] = v;
    if (s != at)
      return "gap or overlap at " + std::to_string(at) + " (next range at " + std::to_string(s) +
             ")";
    if (n == 0 || n % kDeviceArenaAlignment != 0)
      return "range at " + std::to_string(s) + " has size " + std::to_string(n);
    if (is_free && prev_free) return "free ranges at " + std::to_string(s) + " not merged";
    if (!is_free) used += n;
    prev_free = is_free;
    at = s + n;
  }
  if (at != base_ + size_)
    return "the ranges end at " + std::to_string(at) + ", not at the arena's end";
  if (used != used_)
    return "used " + std::to_string(used_) + " but blocks sum to " + std::to_string(used);
  return "";
}

}  // namespace strata

// GPU memory as one static arena: the facts of a device's memory, how big
// the arena of a --mem-fraction-static is, the upload-dtype rule and the
// fixed internals of the CUDA backend (what a plan made before any weight
// loads must count), and DeviceArena, the first-fit allocator that carves
// Allocate() out of one cudaMalloc.
//
// Nothing here calls CUDA: DeviceArena manages an address range it is
// given (the CUDA backend hands it its one cudaMalloc; tests hand it any
// number), and DeviceMemoryFacts are plain values (ReadCudaMemoryFacts in
// backend.h reads them from a real device), so plans and the allocator
// are tested without a GPU against a fake 80 or 141 GB one.
//
// Thread-safety: DeviceArena is safe from any thread (one mutex); the
// rest are values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "backend/dtype.h"

namespace strata {

// What one GPU's memory is right now (cudaMemGetInfo, cudaGetDeviceProperties).
struct DeviceMemoryFacts {
  int device = 0;
  std::string name;  // e.g. "NVIDIA H200"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;  // free at the time of reading (other processes hold the rest)
};

// Alignment of every block of the arena: cuBLASLt's widest operand
// alignment (backend/cuda Alignment()) and a multiple of Allocate()'s 64.
inline constexpr size_t kDeviceArenaAlignment = 256;
// The arena is a multiple of this (the driver's allocation granularity).
inline constexpr uint64_t kDeviceArenaGranularity = uint64_t{2} << 20;

// `bytes` rounded up to kDeviceArenaAlignment: what one Allocate(bytes)
// takes from the arena (at least one unit: zero-byte buffers are distinct).
inline uint64_t ArenaBlockBytes(uint64_t bytes) {
  const uint64_t a = kDeviceArenaAlignment;
  return bytes == 0 ? a : (bytes + a - 1) / a * a;
}

// The arena of --mem-fraction-static `fraction` on this device:
// fraction x total memory, rounded down to kDeviceArenaGranularity. The
// CUDA backend allocates exactly this; plans count with it.
// REQUIRES: 0 < fraction <= 1.
uint64_t ArenaBytes(const DeviceMemoryFacts& facts, double fraction);

// The dtype UploadWeight keeps a checkpoint weight of dtype `checkpoint`
// in (CudaBackendOptions::matmul_precision): bf16 keeps BF16 weights as
// BF16; everything else is widened to F32 (F16 included: the bf16 GEMM path
// has no F16 x BF16 kernel, and widening is exact).
DType CudaWeightDType(DType checkpoint, bool bf16_matmul);

// The GEMM workspace cuBLASLt is given (allocated once at backend start).
inline constexpr size_t kCudaGemmWorkspaceBytes = size_t{32} << 20;

// Arena bytes the CUDA backend itself takes: the device error word, the
// cuBLASLt workspace and, with bf16 matmul, the scratch Linear rounds x
// into (max_linear_rows x max_16bit_cols BF16 values: the widest 16-bit
// weight any Linear reads, at the most rows one step carries).
uint64_t CudaBackendArenaBytes(bool bf16_matmul, int64_t max_linear_rows, int64_t max_16bit_cols);

// Arena bytes the CUDA backend grows into while serving, on top of the
// above: PagedAttention's split-K partials (the split count is chosen so
// that splits x query rows x heads stays under 128 rows per SM, here bounded
// for up to 256 SMs) and SampleRows' device buffers for `max_rows` rows of
// `vocab` logits (the adjusted-logits scratch, per-block masses, results,
// and inputs of up to vocab/8 mask bytes plus 64 KiB of bans, biases and
// penalty tokens per row), each as the backend grows it (x 5/4). Beyond the
// sampling bound a row is sampled on the host instead (correct, slower).
uint64_t CudaBackendStepArenaBytes(int64_t max_rows, int64_t vocab, int max_head_dim);

// First-fit allocator over [base, base + size): blocks are
// kDeviceArenaAlignment-aligned (base must be), a free list ordered by
// address with neighbours merged on Free. Allocate takes the lowest free
// range that fits; AllocateHigh the highest (staging buffers that live a
// moment, so they never split the long-lived blocks that grow from the
// bottom).
//
//   base                                                    base + size
//   | weights ... | KV pool | per-step |   free   | staging (high) |
//
// Not a caching allocator: a freed block is reusable at once. The CUDA
// backend issues every use of arena memory on its one compute stream, so a
// block freed while kernels still read it is only written again by work
// queued after them (stream order, as cudaFreeAsync).
class DeviceArena {
 public:
  DeviceArena(uintptr_t base, uint64_t size);
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // The start of a block of at least `bytes` (ArenaBlockBytes), or 0 when
  // no free range holds it.
  uintptr_t Allocate(uint64_t bytes);
  uintptr_t AllocateHigh(uint64_t bytes);
  // Returns the block at `p` (from Allocate*). A pointer the arena did not
  // hand out aborts (a Strata bug).
  void Free(uintptr_t p);

  uint64_t size() const { return size_; }
  uint64_t used() const;
  uint64_t peak_used() const;
  uint64_t largest_free() const;  // the biggest single allocation possible now
  int64_t num_blocks() const;
  // Free list sorted, disjoint, coalesced, within range; blocks and free
  // ranges tile the arena exactly. Returns "" when all hold, else the first
  // problem.
  std::string CheckIntegrity() const;

 private:
  uintptr_t Take(std::map<uintptr_t, uint64_t>::iterator it, uint64_t bytes, bool high);

  const uintptr_t base_;
  const uint64_t size_;
  mutable std::mutex mu_;
  std::map<uintptr_t, uint64_t> free_;    // start -> bytes, coalesced
  std::map<uintptr_t, uint64_t> blocks_;  // start -> bytes handed out
  uint64_t used_ = 0, peak_ = 0;
};

}  // namespace strata

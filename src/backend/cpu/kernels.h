// The CPU backend's kernel table: one set of hot loops per instruction-set
// level (scalar, AVX2, AVX-512), chosen once at backend creation. Each set is
// its own translation unit compiled with that level's flags
// (backend/simd_flags.cmake). Only plain data crosses this header, so no
// SIMD-compiled inline code can leak into baseline code via the linker.
//
// The scalar set is the reference the SIMD sets are tested against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace strata::cpu {

// Linear: out[r, j] = x[r, :] . w[j, :] (+ bias[j]) for r < n.
struct LinearArgs {
  const float* x = nullptr;
  int64_t x_stride = 0;
  int64_t n = 0;  // rows of x / out
  int64_t k = 0;  // reduction length
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  int64_t w_stride = 0;
  const float* bias = nullptr;  // F32 or null
  float* out = nullptr;
  int64_t out_stride = 0;
  // For gemm_bf16 only: x rounded to bf16, row stride xb_stride (>= k
  // rounded up to even, padding zero).
  const uint16_t* xb = nullptr;
  int64_t xb_stride = 0;
  // For gemv only: software prefetch this many bytes ahead in every weight
  // stream (0: none). The backend picks it per CPU (GemvPrefetchBytes).
  int64_t prefetch_bytes = 256;
  // For gemv only: weight rows read side by side per step, each a long
  // sequential stream (1, 2 or 4). The backend picks it per CPU
  // (GemvStreams).
  int gemv_streams = 4;
};

// The GEMV prefetch distance for a CPU. Measured (docs/perf.md, "GEMV
// prefetch distance"), one thread, bf16 Qwen2.5-0.5B shapes from DRAM: on
// a 2-vCPU AMD EPYC 0/256/512/1024 bytes gave 15.5/17.4/15.9/15.7 GB/s; on
// a 2-vCPU AMX Xeon 0/256/512/1024/2048 gave 13.0-13.6/13.6-14.1/14.2-15.1/
// 14.6-15.3/14.5-15.3. So 1024 on Intel, 256 elsewhere.
inline int64_t GemvPrefetchBytes(bool intel) { return intel ? 1024 : 256; }

// The GEMV's weight streams per step for a CPU. One long stream per core
// is capped by the prefetcher's depth on an Intel Xeon (~9 GB/s for 1
// stream vs ~19 for 8: docs/perf.md), so 4 there. On AMD EPYC 2 streams
// read best (the read probe's 2-stream pattern, 2026-12-02 and 2026-12-07),
// and on a Zen 5 guest, one thread, the GEMV with 2 streams (2 chains each)
// read qkv/gate_up/lm_head 3-8% faster than with 4, decode 0.80-0.82 of the
// probe against 0.77-0.78 (docs/perf.md, 2026-12-07).
inline int GemvStreams(bool intel) { return intel ? 4 : 2; }

// One query token of one sequence attending to KV positions
// [first_pos, last_pos] (inclusive) through its page table, for query heads
// [first_head, first_head + num_heads), which all read kv head kv_head.
struct AttentionRowArgs {
  const float* q = nullptr;  // the token's query row; head h at q + h * head_dim
  float* out = nullptr;      // the token's output row, same layout
  const KvLayerView* layer = nullptr;
  const int32_t* page_table = nullptr;
  int32_t first_pos = 0;
  int32_t last_pos = 0;
  int32_t kv_head = 0;
  int32_t first_head = 0;
  int32_t num_heads = 0;  // <= kMaxAttentionGroup
  int32_t head_dim = 0;   // <= kMaxHeadDim
  float scale = 0.f;
};

// Consecutive query tokens of one sequence (a prefill block), rows
// [0, num_rows) at positions pos0 + t, each attending causally to
// [max(0, pos0 + t - window + 1) or 0 if window == 0, pos0 + t], for query
// heads [first_head, first_head + num_heads) of kv head kv_head. Row t's q
// is q + t * q_stride (head h at + h * head_dim), its output likewise.
struct AttentionBlockArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  const KvLayerView* layer = nullptr;
  const int32_t* page_table = nullptr;
  int32_t pos0 = 0;
  int32_t num_rows = 0;  // <= kMaxAttentionBlockRows
  int32_t window = 0;    // 0: none
  int32_t kv_head = 0;
  int32_t first_head = 0;
  int32_t num_heads = 0;  // num_rows * num_heads * head_dim <= kAttentionBlockFloats
  int32_t head_dim = 0;   // a multiple of 16, <= kMaxHeadDim
  float scale = 0.f;
};

inline constexpr int64_t kMaxGemvRows = 4;
inline constexpr int kMaxAttentionGroup = 16;
inline constexpr int kMaxHeadDim = 576;  // an MLA latent: DeepSeek V3 kv_lora 512 + rope 64
inline constexpr int kMaxAttentionBlockRows = 16;
inline constexpr int64_t kAttentionBlockFloats = 16384;  // the block's output accumulators
// Bytes of per-thread scratch a gemm call may use.
inline constexpr size_t kGemmScratchBytes = 1 << 20;

struct CpuKernels {
  const char* name;
  // Few-row Linear (n <= kMaxGemvRows), output columns [m0, m1). Memory bound.
  void (*gemv)(const LinearArgs& a, int64_t m0, int64_t m1);
  // Many-row Linear, output columns [m0, m1), all n rows. `scratch` holds
  // kGemmScratchBytes, 64-byte aligned, owned by the calling thread.
  void (*gemm)(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch);
  // As gemm but multiplies bf16-rounded activations (a.xb) with bf16-rounded
  // weights, accumulating in F32. Null when the level lacks it.
  void (*gemm_bf16)(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch);
  // gemm_bf16 on AMX tiles: same arithmetic, different summation order.
  // Only where DetectCpuFeatures().amx_bf16 and RequestAmxPermission().
  // a.xb rows must be zero-padded to a multiple of 32 columns.
  void (*gemm_bf16_amx)(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch);
  // Column alignment that keeps gemm's panels whole when splitting [0, m).
  int64_t gemm_cols_align;
  void (*attention_row)(const AttentionRowArgs& a);
  // A block of a prefill's query tokens (or one decode token of a GQA group
  // of >= 4 heads) in one pass over their KV (each K block transposed once
  // for all the block's rows and heads); null where the level lacks it
  // (then attention_row per token).
  void (*attention_block)(const AttentionBlockArgs& a);
  // out[i] = silu(gate[i]) * up[i] for i < n; out may alias gate or up.
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n);
};

const CpuKernels* ScalarKernels();
const CpuKernels* Avx2Kernels();
const CpuKernels* Avx512Kernels();

}  // namespace strata::cpu

// Launchers of the CUDA backend's kernels (kernels.cu), called by
// cuda_backend.cc. Plain structs and pointers only, so that nvcc compiles one
// small file and the backend class stays ordinary C++.
//
// Every launcher enqueues on `stream` and returns at once. Pointers are
// device memory. Index errors found on the device (a token id, KV slot or
// row out of range) are not fatal there: the offending row is skipped and
// the first error code is written to `err`, which the backend checks at
// Synchronize().
//
// Thread-safety: launchers are stateless; the stream orders them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/dtype.h"

namespace strata::cuda {

// Codes written to the device error word (0: none).
enum DeviceError : int32_t {
  kErrNone = 0,
  kErrTokenId = 1,    // Embedding: id outside [0, table rows)
  kErrKvSlot = 2,     // StoreKv: slot outside the layer's pages
  kErrGatherRow = 3,  // GatherRows: row outside x
  kErrScaleAddRow = 4,  // ScaleAddRows: row outside out
};
const char* DeviceErrorName(int32_t code);

// A 2-D strided view as the kernels see it (row stride in elements).
struct View {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0, stride = 0;
};

// Same bound as the CPU backend: 576 is an MLA latent (DeepSeek V3: 512 + 64).
inline constexpr int kMaxHeadDim = 576;
inline constexpr int kMaxRotaryHalf = kMaxHeadDim / 2;

// dst = src converted elementwise (any float dtype to any float dtype).
void Convert(const View& src, const View& dst, cudaStream_t stream);

void Embedding(const View& table, const int32_t* ids, const View& out, int32_t* err,
               cudaStream_t stream);

// `rounded` (RmsNorm, AddRmsNorm, SiluMul), when its data is set: a second
// output, [out.rows x out.cols] in rounded.dtype (BF16 or F16) with row
// stride rounded.stride, receiving each value written to out rounded to
// nearest-even -- what Convert(out, rounded) would write, to the bit, made
// while the value is in a register: the next GEMM's input (Linear's
// convert_x) without a conversion pass.
void RmsNorm(const View& x, const View& weight, float eps, const View& out, cudaStream_t stream,
             const View& rounded = View{});
// x += delta, then out = RmsNorm(x): one kernel whose results are Add's and
// RmsNorm's to the bit (the same float add, the same norm code and thread
// count). out must not alias x or delta.
void AddRmsNorm(const View& x, const View& delta, const View& weight, float eps, const View& out,
                cudaStream_t stream, const View& rounded = View{});

// Small-batch Linear (decode): out[r][j] = sum_k round(x[r][k]) * w[j][k]
// (+ bias[j] when bias.data is set), for x.rows in [1, kGemvMaxRows].
// w is [m x k] row-major (stride w.stride) in BF16, F16 or F32; x and out
// are F32 with any row stride. round() rounds x to w's dtype (none for F32)
// -- what the GEMM path does by converting x before cuBLASLt -- and the
// products are summed in F32. Bandwidth-bound: every weight byte is read
// once, with 16-byte loads when w and x rows are 16-byte aligned and k is a
// whole number of 16-byte vectors, else element by element (any shape).
// Summation order is fixed, so results are deterministic run to run.
// One row only: linear_bench on the H200 (Llama-3.2-1B shapes, bf16) had
// this kernel at 2.1-4.5 TB/s of weights for one row but behind convert +
// cuBLASLt from 2 rows on most shapes (gate/up 8192x2048: 19 us at 2 rows,
// 41 us at 8, cuBLASLt 10.8 us at 9).
inline constexpr int64_t kGemvMaxRows = 1;
void Gemv(const View& x, const View& w, const View& bias, const View& out, cudaStream_t stream);
// Gemv of one x against up to kGemvMaxParts weights of one dtype and the
// same k, in ONE launch (q/k/v, gate/up of a decode row): each part's out is
// exactly what Gemv gives for it, and the grid is the parts' blocks side by
// side, so small projections (k/v: 128 blocks alone on 132 SMs) ride along
// with a large one instead of each paying a launch and a tail.
struct GemvPart {
  View w, bias, out;  // bias.data null: none
};
inline constexpr int kGemvMaxParts = 3;
void GemvGroup(const View& x, const GemvPart* parts, int n, cudaStream_t stream);
// out = silu(x . gate.w^T + gate.bias) * (x . up.w^T + up.bias), one launch:
// each block owns 2 rows of both weights, sums them as Gemv does and applies
// SiluMul's float expression, so out is GemvGroup then SiluMul to the bit.
// gate.out / up.out are not written. REQUIRES: gate.w and up.w of one dtype
// and shape.
void GemvSiluMul(const View& x, const GemvPart& gate, const GemvPart& up, const View& out,
                 cudaStream_t stream);

// out[r, c] += bias[c].
void AddBias(const View& out, const View& bias, cudaStream_t stream);

void SiluMul(const View& gate, const View& up, const View& out, cudaStream_t stream,
             const View& rounded = View{});

void Add(const View& a, const View& b, const View& out, cudaStream_t stream);

// Passed by value: the table travels in the kernel's parameters.
struct RopeTable {
  float inv_freq[kMaxRotaryHalf];
  int32_t head_dim = 0, rotary_dim = 0, rotary_offset = 0;
  bool interleaved = false;
  float attention_scaling = 1.f;
};
void Rope(const View& q, const View& k, const int32_t* positions, const RopeTable& rope,
          cudaStream_t stream);

// out[rows[i], :] += scales[i] * x[i, :]; rows distinct.
void ScaleAddRows(const View& x, const int32_t* rows, const float* scales, const View& out,
                  int32_t* err, cudaStream_t stream);

struct KvLayer {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF32;
  int32_t page_size = 0, num_kv_heads = 0, head_dim = 0;
  int64_t num_pages = 0;
};
void StoreKv(const View& k, const View& v, const KvLayer& layer, const int64_t* slots, int32_t* err,
             cudaStream_t stream);

// Rope (rotate-half, not interleaved) then StoreKv, one launch: the same
// bits in q, k and the cache as the two launches. For decode steps' few
// rows (kRopeStoreKvMaxRows): Rope's thread per (row, head, pair) is what
// it uses, and more rows take Rope's kernel of 8 heads a thread instead.
// REQUIRES: k.cols == layer.num_kv_heads * layer.head_dim ==
// (k heads) * rope.head_dim; v likewise unless layer.v is null.
inline constexpr int64_t kRopeStoreKvMaxRows = 16;
void RopeStoreKv(const View& q, const View& k, const View& v, const int32_t* positions,
                 const RopeTable& rope, const KvLayer& layer, const int64_t* slots, int32_t* err,
                 cudaStream_t stream);

// Mirrors strata::AttentionSeq (backend.h); static_assert'ed in cuda_backend.cc.
struct Seq {
  int32_t q_start, q_len, kv_len;
  const int32_t* page_table;
};
struct AttentionArgs {
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0, sliding_window = 0;
  float scale = 0.f;
  int32_t max_kv_len = 0;  // AttentionParams::max_kv_len: an upper bound, 0 unknown
  // The backend's matmul precision is bf16: attention may round q, K, V and
  // the probabilities to bf16 for the tensor cores (PagedAttentionUsesTensorCores).
  bool tensor_cores = false;
};
// Flash-style paged attention (kernels.cu has the tiling): tiles of
// (token, head-of-the-GQA-group) query rows of one sequence and KV head
// against KV tiles read through the page table, with an online softmax; the
// KV range is cut into AttentionSplits pieces (split-K, flash-decoding)
// whose partial (max, sum, acc) go to `workspace` and are merged by a
// second kernel. V may alias K (layer.v == layer.k, MLA): its rows are read
// once. head_dim <= kMaxHeadDim. AttentionSplits: enough blocks for the
// SMs, but no more pieces than args.max_kv_len (when set) has kAttnCols
// positions, so a short context launches no block without KV.
// PagedAttentionWorkspaceBytes ignores max_kv_len (it only lowers the split
// count): one size for a decode whose context grows, never a regrow.
// REQUIRES: workspace_bytes >= PagedAttentionWorkspaceBytes(q.rows,
// num_seqs, args, num_sms); q.rows == out.rows; every sequence's q_len <=
// kv_len and its rows inside q.
int AttentionSplits(int64_t q_rows, int32_t num_seqs, const AttentionArgs& args, int num_sms);
size_t PagedAttentionWorkspaceBytes(int64_t q_rows, int32_t num_seqs, const AttentionArgs& args,
                                    int num_sms);
// Dynamic shared memory of one attention block (above 48 KiB the launcher
// raises the kernel's limit; the device must offer it: H200 227 KiB).
size_t AttentionSmemBytes(int head_dim, bool v_alias);
void PagedAttention(const View& q, const KvLayer& layer, const Seq* seqs, int32_t num_seqs,
                    const AttentionArgs& args, const View& out, void* workspace,
                    size_t workspace_bytes, int num_sms, cudaStream_t stream);
// Whether PagedAttention runs this call on the tensor cores
// (attention_mma.cuh): args.tensor_cores, head_dim 64 or 128, V apart from K
// and K and V 16-byte aligned; prefill, decode and mixed batches alike.
// There q, each K/V tile and the softmax probabilities are rounded to bf16
// and multiplied with mma.sync (m16n8k16, F32 accumulate): what
// FlashAttention does with bf16 inputs, and no longer the CPU backend's F32
// result to 1e-5.
bool PagedAttentionUsesTensorCores(int64_t q_rows, int32_t num_seqs, const AttentionArgs& args,
                                   const KvLayer& layer);

void GatherRows(const View& x, const int32_t* rows, const View& out, int32_t* err,
                cudaStream_t stream);

// One block of a batched page copy. dst and src may be device memory or
// host memory registered with cudaHostRegisterMapped (the kernel reads and
// writes it over the bus through its unified address).
struct CopyDesc {
  void* dst;
  const void* src;
  uint64_t bytes;
};
// Copies every block of desc[0, n) (desc in device memory): one thread block
// per copy block at a time, 16-byte accesses where the block is aligned. A
// gather of many small pages in one launch, where one cudaMemcpyAsync per
// page pays a command each.
void CopyBlocks(const CopyDesc* desc, int64_t n, cudaStream_t stream);

// STRATA_CUDA_OP_TIMING=gated (op_timing.h): one thread spins until *flag
// (host memory mapped into the device) is nonzero, or `timeout_ns` of the
// GPU's global timer pass, when it sets *timed_out (mapped too) to 1. The
// work queued behind it then runs back to back once the host lets it go.
void Gate(const volatile int32_t* flag, volatile int32_t* timed_out, int64_t timeout_ns,
          cudaStream_t stream);

}  // namespace strata::cuda

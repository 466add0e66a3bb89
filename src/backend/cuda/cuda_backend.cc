// The CUDA backend: Backend ops as kernels (kernels.cu) and cuBLASLt GEMMs
// on one CUDA stream of one device. Weights are copied to the device once by
// UploadWeight.
//
// Memory (CudaBackendOptions::mem_fraction_static):
//   > 0: one cudaMalloc of ArenaBytes(device, fraction) at Init, checked
//        against the free memory first; every Allocate and weight upload is
//        a block of that arena (backend/device_memory.h). Weights and
//        buffers pack from the bottom, an upload's staging copy comes from
//        the top and is returned at once, so loading leaves no holes.
//   0:   one cudaMalloc per buffer (tests and tools).
// Outside the arena: the CUDA context, cuBLASLt's handle, and CopyBlocks'
// descriptor array (24 bytes per block of one call, at least 64 KiB, made on
// the first HiCache copy).
//
// Linear precision (CudaBackendOptions::matmul_precision):
//   fp32: weights are widened to F32 at upload; F32 x F32 GEMM with F32
//         compute (CUBLAS_COMPUTE_32F: no TF32), matching the CPU backend.
//   bf16: BF16 weights stay BF16; x is rounded to BF16 into a scratch
//         buffer; tensor-core GEMM with F32 accumulation and F32 output.
// Either way, x with at most cuda::kGemvMaxRows rows (decode) skips the
// scratch conversion and cuBLASLt: one GEMV kernel (kernels.h Gemv) reads
// the weights once, rounds x to the weight's type as it loads it, sums in
// F32 and adds the bias -- the same products as the GEMM path, summed in
// another order.
// Linear dispatches on the weight's dtype, so either kind of weight works
// with either setting. LinearGroup (q/k/v) of a decode row is one GEMV
// launch over all its weights (kernels.h GemvGroup), LinearSiluMul (gate/up
// and SiLU·mul) one more (GemvSiluMul); AddRmsNorm one kernel for the
// residual add and the norm.
// The GEMM path's x in 16 bits is made once per distinct input (Rounded16,
// below): RmsNorm, AddRmsNorm and SiluMul write it beside their F32 output
// when a GEMM is likely to read it next, and a Linear that converts x
// leaves its conversion for the next Linear of the same x (q/k/v, gate/up).
// Either way the bf16 values are the ones Convert would make, so results
// are unchanged to the bit.
// Attention follows the same setting: under bf16, PagedAttention (prefill
// and decode, head dims 64 and 128) runs on the tensor cores (q, K, V and the
// probabilities rounded to bf16; kernels.h PagedAttentionUsesTensorCores);
// under fp32 it stays the exact F32 kernel.
//
// Recordings (Backend::BeginRecording): CUDA graphs captured from the
// compute stream; kernels are launched with programmatic dependent launch
// (kernels.cu Launch), so in a graph or not each may start while the one
// before finishes.
//
// Page copies (CopyBlocks, for HiCache) run on a second non-blocking
// stream, the copy stream, so they overlap the compute stream's kernels:
// one gather kernel over host memory pinned (and mapped) by PinHostMemory,
// else one cudaMemcpyAsync per block.
//
// Sampling (SampleRows) runs sample_kernels.cu (a prepare launch over
// 2,048-token chunks of every row, then one block per row) on the
// compute stream: the rows' parameters, masks, bans, biases and penalty
// tokens go up in one copy from pinned memory, the small per-row results
// come back in one. A row comes back flagged when the kernel cannot finish
// it (sample_kernels.h lists when); only then are its logits copied to the
// host and sampled there. Vocabularies above INT32_MAX, and a failure to
// allocate the sampling buffers, send every row to the host that way.
// Per-op GPU timing (STRATA_CUDA_OP_TIMING=1 or =gated; op_timer.h): a
// cudaEvent pair around every op and host<->device copy, read back at the
// next CopyToHost / Synchronize (the stream is idle then) and summed per op
// kind and step class; the table goes to stderr when the backend is
// destroyed. Off (the default), an op pays one null-pointer test.
//
// Thread-safety: as Backend: ops are issued from one thread at a time.
// CopyBlocks, PinHostMemory and UnpinHostMemory may be called from any
// thread; CopyBlocks calls are served one at a time (copy_mu_).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_timer.h"
#include "backend/cuda/op_timing.h"
#include "backend/cuda/sample_kernels.h"
#include "util/logging.h"

namespace strata {
namespace {

static_assert(sizeof(cuda::PenaltyEntry) == sizeof(PenaltyToken) &&
                  offsetof(cuda::PenaltyEntry, output_count) ==
                      offsetof(PenaltyToken, output_count),
              "cuda::PenaltyEntry must mirror PenaltyToken");
static_assert(cuda::kSampleMaxTop == kMaxLogprobs, "the kernel reports at most kMaxLogprobs");

static_assert(sizeof(cuda::Seq) == sizeof(AttentionSeq) &&
                  offsetof(cuda::Seq, page_table) == offsetof(AttentionSeq, page_table),
              "cuda::Seq must mirror AttentionSeq");

#define CUDA_CHECK(expr)                                                                      \
  do {                                                                                        \
    const cudaError_t e_ = (expr);                                                            \
    STRATA_CHECK(e_ == cudaSuccess) << "CUDA backend: " #expr ": " << cudaGetErrorString(e_); \
  } while (0)
#define CUBLAS_CHECK(expr)                                             \
  do {                                                                 \
    const cublasStatus_t s_ = (expr);                                  \
    STRATA_CHECK(s_ == CUBLAS_STATUS_SUCCESS)                          \
        << "CUDA backend: " #expr ": " << cublasLtGetStatusString(s_); \
  } while (0)

bool IsFloatDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

cuda::View ToView(const Tensor& t) {
  return cuda::View{t.data, t.dtype, t.rows, t.cols, t.row_stride()};
}

cuda::KvLayer ToKvLayer(const KvLayerView& l) {
  return cuda::KvLayer{l.k, l.v, l.dtype, l.page_size, l.num_kv_heads, l.head_dim, l.num_pages};
}

void FreeDevice(void* p) { cudaFree(p); }
void FreePinned(void* p) { cudaFreeHost(p); }
void FreeArenaBlock(void* arena, void* p) {
  static_cast<DeviceArena*>(arena)->Free(reinterpret_cast<uintptr_t>(p));
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string GiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// Largest power of two (<= 256) dividing the address and the row pitch:
// cuBLASLt must be told, or it may pick a kernel that needs more.
uint32_t Alignment(const void* p, int64_t ld_bytes) {
  uint32_t a = 256;
  while (a > 1 && ((reinterpret_cast<uintptr_t>(p) % a) != 0 || ld_bytes % a != 0)) a /= 2;
  return a;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, bool bf16_weights, const std::string& device_name, int num_sms,
              double mem_fraction_static)
      : device_(device),
        bf16_weights_(bf16_weights),
        device_name_(device_name),
        num_sms_(num_sms),
        mem_fraction_(mem_fraction_static) {}

  ~CudaBackend() override {
    cudaSetDevice(device_);
    ReleaseGate();
    cudaStreamSynchronize(stream_);
    DropRecordings();
    if (timer_) timer_->Finish();
    timer_.reset();
    weights_.clear();
    attn_ws_.Reset();
    sample_in_.Reset();
    sample_out_.Reset();
    sample_scratch_.Reset();
    sample_mass_.Reset();
    sample_partials_.Reset();
    xh_.Reset();
    workspace_.Reset();
    err_buf_.Reset();
    err_host_.Reset();
    if (arena_) {
      if (arena_->num_blocks() == 0) {
        cudaFree(arena_base_);
      } else {
        // Buffers that outlive the backend still free into the arena: keep
        // it (and its memory) until the process ends.
        STRATA_LOG(WARN) << "CUDA backend: " << arena_->num_blocks()
                         << " buffers outlive the backend; its arena stays allocated";
        (void)arena_.release();
      }
    }
    matmul_cache_.clear();
    if (lt_) cublasLtDestroy(lt_);
    if (stream_) cudaStreamDestroy(stream_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);  // idle: CopyBlocks waits for its copies
    if (desc_dev_) cudaFree(desc_dev_);
    if (desc_host_) cudaFreeHost(desc_host_);
  }

  Status Init() {
    if (cudaSetDevice(device_) != cudaSuccess)
      return Unavailable("CUDA backend: cannot use device " + std::to_string(device_));
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
      return Unavailable("CUDA backend: cannot create a stream on device " +
                         std::to_string(device_));
    if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS)
      return Unavailable("CUDA backend: cublasLtCreate failed on device " +
                         std::to_string(device_));
    if (mem_fraction_ > 0) RETURN_IF_ERROR(CreateArena());
    ASSIGN_OR_RETURN(err_buf_, Allocate(sizeof(int32_t)));
    CUDA_CHECK(cudaMemsetAsync(err_buf_.data(), 0, sizeof(int32_t), stream_));
    if (!GrowPinned(err_host_, sizeof(int32_t)))
      return Unavailable("CUDA backend: cannot allocate pinned host memory on device " +
                         std::to_string(device_));
    int host_ptr = 0;
    if (cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, device_) !=
        cudaSuccess)
      cudaGetLastError();
    host_pointers_usable_ = host_ptr != 0;
    int smem_optin = 0;
    if (cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_) ==
            cudaSuccess &&
        smem_optin > 0)
      max_smem_per_block_ = static_cast<size_t>(smem_optin);
    else
      cudaGetLastError();
    ASSIGN_OR_RETURN(workspace_, Allocate(kWorkspaceBytes));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const cuda::OpTimingMode mode = cuda::ParseOpTimingMode(std::getenv("STRATA_CUDA_OP_TIMING"));
    if (mode != cuda::OpTimingMode::kOff) {
      ASSIGN_OR_RETURN(timer_, cuda::OpTimer::Create(mode, stream_));
    }
    return OkStatus();
  }

  std::string Name() const override {
    return "cuda (device " + std::to_string(device_) + ": " + device_name_ + ", " +
           (bf16_weights_ ? "bf16" : "fp32") + " matmul)";
  }

  // The arena: checked against the free memory before the one cudaMalloc.
  Status CreateArena() {
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Unavailable("CUDA backend: cudaMemGetInfo on device " + std::to_string(device_) +
                         ": " + cudaGetErrorString(e));
    }
    DeviceMemoryFacts facts{device_, device_name_, total_b, free_b};
    const uint64_t bytes = ArenaBytes(facts, mem_fraction_);
    const std::string what = "--mem-fraction-static " + Num(mem_fraction_) + " of " + GiB(total_b) +
                             " on device " + std::to_string(device_) + " (" + device_name_ +
                             ") is " + GiB(bytes);
    if (bytes == 0) return InvalidArgument(what + ": too small for any buffer");
    if (bytes > free_b)
      return ResourceExhausted(what + ", but only " + GiB(free_b) +
                               " is free (another process holds the rest: see nvidia-smi); "
                               "lower --mem-fraction-static or free the GPU");
    void* base = nullptr;
    e = cudaMalloc(&base, bytes);
    ++device_mallocs_;
    if (e != cudaSuccess) {
      cudaGetLastError();
      return ResourceExhausted("CUDA backend: cudaMalloc of the arena failed: " + what + ": " +
                               cudaGetErrorString(e));
    }
    arena_base_ = base;
    arena_ = std::make_unique<DeviceArena>(reinterpret_cast<uintptr_t>(base), bytes);
    return OkStatus();
  }

  BackendMemoryUsage memory_usage() const override {
    BackendMemoryUsage u;
    u.device_mallocs = device_mallocs_;
    if (arena_) {
      u.arena_bytes = arena_->size();
      u.arena_used = arena_->used();
      u.arena_peak = arena_->peak_used();
      u.arena_largest_free = arena_->largest_free();
    }
    return u;
  }

  StatusOr<Buffer> Allocate(size_t bytes) override {
    if (recording_) {
      BreakRecording("Allocate");
      return FailedPrecondition(
          "CUDA backend: Allocate while recording ops (a step that "
          "allocates cannot be replayed; it runs op by op)");
    }
    return AllocateBlock(bytes, false);
  }

  // `high`: from the top of the arena (a staging copy freed at once).
  StatusOr<Buffer> AllocateBlock(size_t bytes, bool high) {
    if (arena_) {
      const uintptr_t p = high ? arena_->AllocateHigh(bytes) : arena_->Allocate(bytes);
      if (p == 0)
        return ResourceExhausted(
            "CUDA backend: the arena (--mem-fraction-static " + Num(mem_fraction_) + ", " +
            GiB(arena_->size()) + " on device " + std::to_string(device_) +
            ") has no free range of " + std::to_string(bytes) + " bytes (" + GiB(arena_->used()) +
            " used, largest free range " + std::to_string(arena_->largest_free()) +
            " bytes): startup's memory plan did not foresee this buffer (a Strata bug); raise "
            "--mem-fraction-static or lower --max-total-tokens");
      return Buffer(reinterpret_cast<void*>(p), bytes, &FreeArenaBlock, arena_.get());
    }
    void* p = nullptr;
    ++device_mallocs_;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls work
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return ResourceExhausted("CUDA backend: cannot allocate " + std::to_string(bytes) +
                               " bytes on device " + std::to_string(device_) + " (" +
                               std::to_string(free_b) + " of " + std::to_string(total_b) +
                               " bytes free: " + cudaGetErrorString(e) +
                               "); lower the KV cache size or batch size");
    }
    return Buffer(p, bytes, &FreeDevice);
  }

  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    if (recording_) return BreakRecording("CopyToDevice");
    // From pageable memory the copy is staged before this returns, so the
    // caller may reuse `src` at once; from pinned memory (PinHostMemory: the
    // runner's step staging) it is a DMA that reads `src` when it runs. It
    // also waits for the stream first (CUDA's rule for pageable sources), so
    // under STRATA_CUDA_OP_TIMING=gated it must not sit behind a shut gate:
    // copies open it and run ungated; the step's next kernel shuts a new one.
    ReleaseGate();
    Timed timed(this, "CopyToDevice", /*arms_gate=*/false);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }

  // Returns when the bytes are on the host (all earlier ops have finished).
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    if (recording_) return BreakRecording("CopyToHost");
    {
      // Into pageable memory the copy returns only once done, so under
      // STRATA_CUDA_OP_TIMING=gated the gate opens first (as in CopyToDevice).
      ReleaseGate();
      Timed timed(this, "CopyToHost", /*arms_gate=*/false);
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    SyncStream();
    if (timer_) timer_->Harvest();
  }

  // Host memory pinned by PinHostMemory is mapped into the device's address
  // space, so when every block's host side lies in it, one gather kernel on
  // the copy stream moves all blocks (the SMs read or write host memory over
  // the bus). Measured on the H200: 512 random 16 KiB-block pages, one
  // cudaMemcpyBatchAsync reached 4.8 GB/s of the link's 55 (it submits one
  // DMA per block), and batching pageable memory failed with an unspecified
  // launch failure. Otherwise (pageable host memory) one cudaMemcpyAsync per
  // block, staged by the driver: correct, not fast.
  Status CopyBlocks(std::span<const CopyBlock> blocks, CopyKind kind) override {
    std::lock_guard<std::mutex> lock(copy_mu_);
    // The current device is per host thread, and the caller (the cache
    // controller's thread) may never have set it.
    cudaError_t e = cudaSetDevice(device_);
    if (e != cudaSuccess) return CopyError("cudaSetDevice", e);
    if (!copy_stream_) {
      e = cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking);
      if (e != cudaSuccess) {
        copy_stream_ = nullptr;
        return CopyError("creating the copy stream", e);
      }
    }
    std::vector<cuda::CopyDesc>& desc = copy_desc_;
    desc.clear();
    bool all_mapped = host_pointers_usable_;
    {
      std::lock_guard<std::mutex> pl(pinned_mu_);
      for (const CopyBlock& b : blocks) {
        if (b.bytes == 0) continue;
        desc.push_back({b.dst, b.src, b.bytes});
        const void* host = kind == CopyKind::kHostToDevice ? b.src : b.dst;
        if (all_mapped && !InPinnedRange(host, b.bytes)) all_mapped = false;
      }
    }
    if (desc.empty()) return OkStatus();
    if (all_mapped) {
      const size_t bytes = desc.size() * sizeof(cuda::CopyDesc);
      if (desc_capacity_ < bytes) {
        if (desc_dev_) cudaFree(desc_dev_);
        if (desc_host_) cudaFreeHost(desc_host_);
        desc_dev_ = nullptr;
        desc_host_ = nullptr;
        desc_capacity_ = 0;
        const size_t cap = std::max<size_t>(bytes, 64 << 10);
        e = cudaMalloc(&desc_dev_, cap);
        if (e == cudaSuccess) e = cudaMallocHost(&desc_host_, cap);
        if (e != cudaSuccess) return CopyError("allocating the copy descriptors", e);
        desc_capacity_ = cap;
      }
      std::memcpy(desc_host_, desc.data(), bytes);
      e = cudaMemcpyAsync(desc_dev_, desc_host_, bytes, cudaMemcpyHostToDevice, copy_stream_);
      if (e != cudaSuccess) return CopyError("uploading the copy descriptors", e);
      cuda::CopyBlocks(static_cast<const cuda::CopyDesc*>(desc_dev_),
                       static_cast<int64_t>(desc.size()), copy_stream_);
      e = cudaGetLastError();
      if (e != cudaSuccess) return CopyError("launching the page-copy kernel", e);
    } else {
      const cudaMemcpyKind k =
          kind == CopyKind::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
      for (size_t i = 0; i < desc.size(); ++i) {
        e = cudaMemcpyAsync(desc[i].dst, desc[i].src, desc[i].bytes, k, copy_stream_);
        if (e != cudaSuccess) {
          cudaStreamSynchronize(copy_stream_);  // the blocks queued before it
          return CopyError("cudaMemcpyAsync of block " + std::to_string(i) + " (" +
                               std::to_string(desc[i].bytes) + " bytes)",
                           e);
        }
      }
    }
    e = cudaStreamSynchronize(copy_stream_);
    if (e != cudaSuccess) return CopyError("waiting for the copy stream", e);
    return OkStatus();
  }

  // True iff [p, p + bytes) lies inside one range PinHostMemory registered.
  // REQUIRES: pinned_mu_ held.
  bool InPinnedRange(const void* p, size_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = pinned_.upper_bound(a);
    if (it == pinned_.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
  }

  Status PinHostMemory(void* p, size_t bytes) override {
    if (bytes == 0) return OkStatus();
    cudaError_t e = cudaSetDevice(device_);
    // Portable: pinned for every CUDA context, not only this device's.
    // Mapped: the page-copy kernel reads and writes it by its host address
    // (unified addressing; host_pointers_usable_ says the device can).
    if (e == cudaSuccess)
      e = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
      cudaGetLastError();
      const std::string msg = "CUDA backend: cannot pin " + std::to_string(bytes) +
                              " bytes of host memory at " +
                              std::to_string(reinterpret_cast<uintptr_t>(p)) +
                              " (cudaHostRegister: " + cudaGetErrorString(e) + ")";
      if (e == cudaErrorMemoryAllocation)
        return ResourceExhausted(
            msg + "; raise the locked-memory limit (ulimit -l) or shrink the host KV pool");
      return Internal(msg + "; each range may be pinned once (a Strata bug otherwise)");
    }
    std::lock_guard<std::mutex> pl(pinned_mu_);
    pinned_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return OkStatus();
  }

  void UnpinHostMemory(void* p) override {
    cudaSetDevice(device_);
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();  // not registered: nothing to do
    std::lock_guard<std::mutex> pl(pinned_mu_);
    pinned_.erase(reinterpret_cast<uintptr_t>(p));
  }

  void Synchronize() override {
    if (recording_) return BreakRecording("Synchronize");
    // The error word comes back in the same wait (pinned: no second
    // round trip after it).
    CUDA_CHECK(cudaMemcpyAsync(err_host_.data(), err_buf_.data(), sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream_));
    SyncStream();
    if (timer_) timer_->EndStep();
    CUDA_CHECK(cudaGetLastError());
    const int32_t code = *static_cast<const volatile int32_t*>(err_host_.data());
    STRATA_CHECK(code == cuda::kErrNone)
        << "CUDA backend: an op found a bad index on the device: " << cuda::DeviceErrorName(code)
        << " (a Strata bug)";
  }

  // Both buffers are taken before any copy starts, so a failure leaves
  // nothing allocated and nothing in flight: the weight's own buffer (its
  // kept dtype, CudaWeightDType) from the bottom, and, when it is widened,
  // a staging copy of the checkpoint bytes from the top of the arena,
  // returned once the conversion has run.
  StatusOr<Tensor> UploadWeight(const Tensor& host) override {
    STRATA_CHECK(IsFloatDType(host.dtype)) << DTypeName(host.dtype);
    if (recording_) {
      BreakRecording("UploadWeight");
      return FailedPrecondition("CUDA backend: UploadWeight while recording ops");
    }
    const DType want = CudaWeightDType(host.dtype, bf16_weights_);
    const size_t src_row = host.cols * DTypeSize(host.dtype);
    const size_t host_pitch = host.row_stride() * DTypeSize(host.dtype);
    ASSIGN_OR_RETURN(Buffer out, Allocate(host.rows * host.cols * DTypeSize(want)));
    Tensor t{out.data(), want, host.rows, host.cols, 0};
    if (want == host.dtype) {
      CUDA_CHECK(cudaMemcpy2DAsync(out.data(), src_row, host.data, host_pitch, src_row, host.rows,
                                   cudaMemcpyHostToDevice, stream_));
    } else {
      ASSIGN_OR_RETURN(Buffer raw, AllocateBlock(host.rows * src_row, /*high=*/true));
      CUDA_CHECK(cudaMemcpy2DAsync(raw.data(), src_row, host.data, host_pitch, src_row, host.rows,
                                   cudaMemcpyHostToDevice, stream_));
      Tensor r{raw.data(), host.dtype, host.rows, host.cols, 0};
      cuda::Convert(ToView(r), ToView(t), stream_);
      SyncStream();  // before `raw` is freed
    }
    weights_.push_back(std::move(out));
    return t;
  }

  void Embedding(const Tensor& table, const int32_t* ids, Tensor out) override {
    STRATA_CHECK(out.dtype == DType::kF32 && IsFloatDType(table.dtype));
    STRATA_CHECK(out.cols == table.cols) << out.cols << " vs " << table.cols;
    if (out.rows == 0) return;
    Timed timed(this, "Embedding");
    if (timer_) timer_->NoteStepTokens(out.rows);
    cuda::Embedding(ToView(table), ids, ToView(out), ErrWord(), stream_);
    Launched();
  }

  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(x.rows == out.rows && x.cols == out.cols);
    STRATA_CHECK(weight.rows * weight.cols == x.cols)
        << "norm weight has " << weight.rows << "x" << weight.cols;
    STRATA_CHECK(IsFloatDType(weight.dtype));
    cuda::View w = ToView(weight);
    const cuda::View rounded = PrepareRounded(out);
    Timed timed(this, "RmsNorm");
    cuda::RmsNorm(ToView(x), w, eps, ToView(out), stream_, rounded);
    Launched();
    MarkRounded(out, rounded);
  }

  void AddRmsNorm(Tensor x, const Tensor& delta, const Tensor& weight, float eps,
                  Tensor out) override {
    CheckSameShape(x, delta, out);
    STRATA_CHECK(out.data != x.data && out.data != delta.data)
        << "AddRmsNorm: out aliases an input";
    STRATA_CHECK(weight.rows * weight.cols == x.cols)
        << "norm weight has " << weight.rows << "x" << weight.cols;
    STRATA_CHECK(IsFloatDType(weight.dtype));
    const cuda::View rounded = PrepareRounded(out);
    Timed timed(this, "AddRmsNorm");
    cuda::AddRmsNorm(ToView(x), ToView(delta), ToView(weight), eps, ToView(out), stream_, rounded);
    Launched();
    MarkRounded(out, rounded);
  }

  static void CheckLinear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(IsFloatDType(w.dtype)) << DTypeName(w.dtype);
    STRATA_CHECK(x.cols == w.cols && out.rows == x.rows && out.cols == w.rows)
        << "Linear shapes: x " << x.rows << "x" << x.cols << ", w " << w.rows << "x" << w.cols
        << ", out " << out.rows << "x" << out.cols;
    STRATA_CHECK(!bias || (bias->rows * bias->cols == w.rows && IsFloatDType(bias->dtype)));
  }

  // A decode row against all parts in one GEMV launch; otherwise (more
  // rows: cuBLASLt per part; mixed weight dtypes; too many parts) Linear per
  // part, the base class's default.
  void LinearGroup(const Tensor& x, std::span<const LinearPart> parts) override {
    bool one_launch = x.rows <= cuda::kGemvMaxRows && !parts.empty() &&
                      parts.size() <= static_cast<size_t>(cuda::kGemvMaxParts);
    for (const LinearPart& p : parts) one_launch = one_launch && p.w.dtype == parts[0].w.dtype;
    if (!one_launch) {
      Backend::LinearGroup(x, parts);
      return;
    }
    cuda::GemvPart gp[cuda::kGemvMaxParts];
    for (size_t i = 0; i < parts.size(); ++i) {
      CheckLinear(x, parts[i].w, parts[i].bias, parts[i].out);
      gp[i] = {ToView(parts[i].w), parts[i].bias ? ToView(*parts[i].bias) : cuda::View{},
               ToView(parts[i].out)};
    }
    if (x.rows == 0) return;
    Timed timed(this, parts[0].w.dtype == DType::kF32 ? "Linear.gemv_f32" : "Linear.gemv_16bit");
    cuda::GemvGroup(ToView(x), gp, static_cast<int>(parts.size()), stream_);
    Launched();
  }

  // A decode row: one launch writing silu(gate) * up (GemvSiluMul);
  // otherwise the default, LinearGroup then SiluMul.
  void LinearSiluMul(const Tensor& x, const LinearPart& gate, const LinearPart& up,
                     Tensor out) override {
    if (x.rows > cuda::kGemvMaxRows || gate.w.dtype != up.w.dtype || gate.w.rows != up.w.rows) {
      Backend::LinearSiluMul(x, gate, up, out);
      return;
    }
    CheckLinear(x, gate.w, gate.bias, gate.out);
    CheckLinear(x, up.w, up.bias, up.out);
    STRATA_CHECK(out.dtype == DType::kF32 && out.rows == x.rows && out.cols == gate.w.rows)
        << "LinearSiluMul out " << out.rows << "x" << out.cols;
    if (x.rows == 0) return;
    auto part = [](const LinearPart& p) {
      return cuda::GemvPart{ToView(p.w), p.bias ? ToView(*p.bias) : cuda::View{}, ToView(p.out)};
    };
    Timed timed(this, gate.w.dtype == DType::kF32 ? "Linear.gemv_f32" : "Linear.gemv_16bit");
    cuda::GemvSiluMul(ToView(x), part(gate), part(up), ToView(out), stream_);
    Launched();
  }

  void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) override {
    CheckLinear(x, w, bias, out);
    const int64_t n = x.rows, m = w.rows, k = x.cols;
    if (n == 0 || m == 0) return;
    if (n <= cuda::kGemvMaxRows) {
      // Decode: a bandwidth-bound GEMV with x rounded as it is loaded and
      // the bias fused; no conversion kernel, no cuBLASLt call.
      Timed timed(this, w.dtype == DType::kF32 ? "Linear.gemv_f32" : "Linear.gemv_16bit");
      cuda::Gemv(ToView(x), ToView(w), bias ? ToView(*bias) : cuda::View{}, ToView(out), stream_);
      Launched();
      return;
    }
    const void* b = x.data;
    int64_t ldb = x.row_stride();
    const bool rounded = w.dtype != DType::kF32;
    if (rounded) {
      // Tensor-core path: x rounded to the weight's 16-bit type, by the op
      // that wrote x or by the Linear before this one, else here.
      gemm_dtype_ = w.dtype;
      if (!HoldsRounded(x, w.dtype)) {
        if (!EnsureRoundedScratch(n * k * DTypeSize(w.dtype))) return;  // recording, broken
        Tensor xh{xh_.data(), w.dtype, n, k, 0};
        Timed timed(this, "Linear.convert_x");
        cuda::Convert(ToView(x), ToView(xh), stream_);
        x16_ = Rounded16{x.data, n, k, x.row_stride(), w.dtype, op_seq_};
      }
      b = xh_.data();
      ldb = k;
    }
    {
      Timed timed(this, w.dtype == DType::kF32 ? "Linear.gemm_f32" : "Linear.gemm_16bit");
      Gemm(w.data, w.dtype, w.row_stride(), b, ldb, out.data, out.row_stride(), m, n, k);
    }
    if (bias) {
      Timed timed(this, "Linear.bias");
      cuda::AddBias(ToView(out), ToView(*bias), stream_);
    }
    Launched();
    // This GEMM wrote only out: x's rounding stays good for the next
    // Linear of the same x unless out overlaps x.
    if (rounded) {
      if (Overlaps(out, x)) {
        x16_ = Rounded16{};
      } else {
        x16_.seq = op_seq_;
      }
    }
  }

  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override {
    CheckSameShape(gate, up, out);
    const cuda::View rounded = PrepareRounded(out);
    Timed timed(this, "SiluMul");
    cuda::SiluMul(ToView(gate), ToView(up), ToView(out), stream_, rounded);
    Launched();
    MarkRounded(out, rounded);
  }

  void Add(const Tensor& a, const Tensor& b, Tensor out) override {
    CheckSameShape(a, b, out);
    Timed timed(this, "Add");
    cuda::Add(ToView(a), ToView(b), ToView(out), stream_);
    Launched();
  }

  // Rope's checks; false when there is nothing to rotate.
  static bool RopeTableOf(const Tensor& q, const Tensor& k, const RopeParams& rope,
                          cuda::RopeTable* t) {
    STRATA_CHECK(q.dtype == DType::kF32 && k.dtype == DType::kF32);
    STRATA_CHECK(k.cols == 0 || q.rows == k.rows);
    const int hd = rope.head_dim, half = rope.rotary_dim / 2;
    STRATA_CHECK(hd > 0 && hd <= cuda::kMaxHeadDim && rope.rotary_offset >= 0 &&
                 rope.rotary_offset + rope.rotary_dim <= hd && rope.rotary_dim % 2 == 0);
    STRATA_CHECK(q.cols % hd == 0 && k.cols % hd == 0);
    if (q.rows == 0 || half == 0) return false;
    std::copy(rope.inv_freq, rope.inv_freq + half, t->inv_freq);
    t->head_dim = hd;
    t->rotary_dim = rope.rotary_dim;
    t->rotary_offset = rope.rotary_offset;
    t->interleaved = rope.interleaved;
    t->attention_scaling = rope.attention_scaling;
    return true;
  }

  void Rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) override {
    cuda::RopeTable t;
    if (!RopeTableOf(q, k, rope, &t)) return;
    Timed timed(this, "Rope");
    cuda::Rope(ToView(q), ToView(k), positions, t, stream_);
    Launched();
  }

  static void CheckStoreKv(const Tensor& k, const Tensor& v, const KvLayerView& layer) {
    const int64_t e = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
    STRATA_CHECK(k.dtype == DType::kF32 && k.cols == e) << k.cols << " vs kv width " << e;
    if (layer.v != nullptr) {
      STRATA_CHECK(v.dtype == DType::kF32 && k.rows == v.rows && v.cols == e)
          << v.cols << " vs kv width " << e;
    }
    STRATA_CHECK(IsFloatDType(layer.dtype));
  }

  void StoreKv(const Tensor& k, const Tensor& v, const KvLayerView& layer,
               const int64_t* slots) override {
    CheckStoreKv(k, v, layer);
    if (k.rows == 0) return;
    Timed timed(this, "StoreKv");
    cuda::StoreKv(ToView(k), ToView(v), ToKvLayer(layer), slots, ErrWord(), stream_);
    Launched();
  }

  // A decode step's rows, rotate-half, keys of the cache's head size: one
  // kernel; otherwise Rope then StoreKv.
  void RopeStoreKv(Tensor q, Tensor k, const Tensor& v, const int32_t* positions,
                   const RopeParams& rope, const KvLayerView& layer,
                   const int64_t* slots) override {
    CheckStoreKv(k, v, layer);
    cuda::RopeTable t;
    if (q.rows > cuda::kRopeStoreKvMaxRows || rope.interleaved || layer.head_dim != rope.head_dim ||
        !RopeTableOf(q, k, rope, &t)) {
      Backend::RopeStoreKv(q, k, v, positions, rope, layer, slots);
      return;
    }
    Timed timed(this, "RopeStoreKv");
    cuda::RopeStoreKv(ToView(q), ToView(k), ToView(v), positions, t, ToKvLayer(layer), slots,
                      ErrWord(), stream_);
    Launched();
  }

  bool ComputesAsynchronously() const override { return true; }

  // ---- Recordings: CUDA graphs of the compute stream (Backend::BeginRecording) ----
  // The stream is captured in thread-local mode, so the cache controller's
  // thread (CopyBlocks on the copy stream) goes on unaffected. Kernels'
  // arguments, the scratch buffers' addresses (xh_, attn_ws_) included, are
  // baked into the graph: growing either drops every recording
  // (DropRecordings), and Replay of a dropped id returns false. Not with
  // STRATA_CUDA_OP_TIMING: it times ops one by one, so it runs them so.
  bool SupportsRecording() const override { return timer_ == nullptr; }

  Status BeginRecording() override {
    if (!SupportsRecording())
      return FailedPrecondition(
          "CUDA backend: no recordings while STRATA_CUDA_OP_TIMING times ops one by one");
    if (recording_) return FailedPrecondition("CUDA backend: BeginRecording while recording");
    const cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Internal(std::string("CUDA backend: cudaStreamBeginCapture: ") +
                      cudaGetErrorString(e));
    }
    recording_ = true;
    recording_broken_.clear();
    return OkStatus();
  }

  StatusOr<int> EndRecording() override {
    if (!recording_) return FailedPrecondition("CUDA backend: EndRecording without BeginRecording");
    recording_ = false;
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (e != cudaSuccess || !recording_broken_.empty()) {
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      return FailedPrecondition("CUDA backend: the ops could not be recorded: " +
                                (recording_broken_.empty()
                                     ? std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e)
                                     : recording_broken_ + " while recording"));
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e == cudaSuccess) e = cudaGraphUpload(exec, stream_);  // the first replay pays no upload
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (exec) cudaGraphExecDestroy(exec);
      return Internal(std::string("CUDA backend: instantiating the recorded graph: ") +
                      cudaGetErrorString(e));
    }
    const int id = next_recording_++;
    recordings_[id] = exec;
    return id;
  }

  bool Replay(int id) override {
    auto it = recordings_.find(id);
    if (it == recordings_.end()) return false;
    ++op_seq_;  // a replay writes what its ops write: x16_ is stale after it
    x16_ = Rounded16{};
    CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    return true;
  }

  void ForgetRecording(int id) override {
    auto it = recordings_.find(id);
    if (it == recordings_.end()) return;
    cudaGraphExecDestroy(it->second);
    recordings_.erase(it);
  }

  void PagedAttention(const Tensor& q, const KvLayerView& layer, const AttentionSeq* seqs,
                      int32_t num_seqs, const AttentionParams& p, Tensor out) override {
    const int hd = p.head_dim;
    STRATA_CHECK(q.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0);
    STRATA_CHECK(layer.num_kv_heads == p.num_kv_heads && layer.head_dim == hd);
    STRATA_CHECK(hd > 0 && hd <= cuda::kMaxHeadDim) << "head_dim " << hd;
    STRATA_CHECK(q.cols == static_cast<int64_t>(p.num_heads) * hd && out.cols == q.cols &&
                 q.rows == out.rows);
    STRATA_CHECK(IsFloatDType(layer.dtype) && layer.page_size > 0);
    if (num_seqs == 0 || q.rows == 0) return;
    cuda::AttentionArgs a{p.num_heads, p.num_kv_heads, hd,           p.sliding_window,
                          p.scale,     p.max_kv_len,   bf16_weights_};
    const bool v_alias = layer.v == nullptr || layer.v == layer.k;
    STRATA_CHECK(cuda::AttentionSmemBytes(hd, v_alias) <= max_smem_per_block_)
        << "CUDA backend: attention with head_dim " << hd << " needs "
        << cuda::AttentionSmemBytes(hd, v_alias) << " bytes of shared memory per block; device "
        << device_ << " offers " << max_smem_per_block_;
    // Split-K partials, grown like xh_.
    const size_t ws = cuda::PagedAttentionWorkspaceBytes(q.rows, num_seqs, a, num_sms_);
    if (attn_ws_.bytes() < ws) {
      if (recording_) return BreakRecording("PagedAttention growing its workspace");
      SyncStream();  // the old workspace may still be read
      DropRecordings();  // they read the old one
      attn_ws_ = Buffer();
      StatusOr<Buffer> buf = Allocate(ws);
      STRATA_CHECK(buf.ok()) << buf.status().message();
      attn_ws_ = std::move(buf).value();
    }
    Timed timed(this, "PagedAttention");
    cuda::PagedAttention(ToView(q), ToKvLayer(layer), reinterpret_cast<const cuda::Seq*>(seqs),
                         num_seqs, a, ToView(out), attn_ws_.data(), attn_ws_.bytes(), num_sms_,
                         stream_);
    Launched();
  }

  void ScaleAddRows(const Tensor& x, const int32_t* rows, const float* scales,
                    Tensor out) override {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32 && x.cols == out.cols);
    if (x.rows == 0) return;
    Timed timed(this, "ScaleAddRows");
    cuda::ScaleAddRows(ToView(x), rows, scales, ToView(out), ErrWord(), stream_);
    Launched();
  }

  void GatherRows(const Tensor& x, const int32_t* rows, Tensor out) override {
    STRATA_CHECK(x.dtype == out.dtype && x.cols == out.cols);
    if (out.rows == 0) return;
    Timed timed(this, "GatherRows");
    cuda::GatherRows(ToView(x), rows, ToView(out), ErrWord(), stream_);
    Launched();
  }

  void SampleRows(const Tensor& logits, std::span<const SampleRowParams> rows, HostRowSampler& host,
                  std::span<SampleResult> out) override {
    STRATA_CHECK(out.size() == rows.size() && logits.dtype == DType::kF32);
    const int64_t vocab = logits.cols;
    if (rows.empty()) return;
    if (recording_) return BreakRecording("SampleRows");
    if (vocab > INT32_MAX || !SampleOnDevice(logits, rows)) {
      Backend::SampleRows(logits, rows, host, out);
      return;
    }
    const auto* res = static_cast<const cuda::SampleRowOut*>(sample_out_host_.data());
    for (size_t i = 0; i < rows.size(); ++i) {
      const cuda::SampleRowOut& r = res[i];
      if (r.needs_host != cuda::kSampleDone) {
        sample_row_.resize(static_cast<size_t>(vocab));
        CopyToHost(sample_row_.data(), logits.row<float>(rows[i].logit_row),
                   sample_row_.size() * sizeof(float));
        out[i] = host.SampleOnHost(i, sample_row_.data());
        continue;
      }
      SampleResult& o = out[i];
      o.token_id = r.token_id;
      o.logprob = r.logprob;
      o.rank = r.rank;
      o.top_logprobs.clear();
      for (int j = 0; j < r.num_top; ++j)
        o.top_logprobs.push_back({r.top_ids[j], r.top_logprobs[j]});
    }
  }

 private:
  static constexpr size_t kWorkspaceBytes = kCudaGemmWorkspaceBytes;

  // ---- STRATA_CUDA_OP_TIMING (op_timer.h) ----
  // RAII: records op's start event now and its stop event at scope exit,
  // when timing is on; else nothing.
  class Timed {
   public:
    Timed(CudaBackend* b, const char* op, bool arms_gate = true) : t_(b->timer_.get()) {
      ++b->op_seq_;  // Rounded16's clock
      if (t_) index_ = t_->Begin(op, arms_gate);
    }
    ~Timed() {
      if (t_) t_->End(index_);
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    cuda::OpTimer* t_;
    size_t index_ = 0;
  };

  // Every wait for the compute stream goes through here: in gated mode the
  // stream cannot drain while its gate is shut.
  void SyncStream() {
    STRATA_CHECK(!recording_) << "CUDA backend: a wait for the stream while recording ops";
    ReleaseGate();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void ReleaseGate() {
    if (timer_) timer_->ReleaseGate();
  }

  // ---- x in 16 bits for the GEMM path (Linear's convert_x, once per input) ----
  // xh_ holds x16_: the F32 tensor {data, rows, cols, stride} rounded to
  // `dtype`, contiguous, as of the op numbered `seq`. It is good for a
  // Linear only while op_seq_ == seq: every op begins with a Timed, which
  // counts it, so any op between the writer and the Linear (one that might
  // write the tensor: a copy, a kernel) makes it stale. A Linear that reads
  // it and writes nothing of x re-stamps it. One thread drives the compute
  // stream (the backend's contract), so these need no lock.
  struct Rounded16 {
    const void* data = nullptr;
    int64_t rows = 0, cols = 0, stride = 0;
    DType dtype = DType::kF32;
    uint64_t seq = 0;
  };

  bool HoldsRounded(const Tensor& x, DType dtype) const {
    return x16_.data != nullptr && x16_.seq == op_seq_ && x16_.data == x.data &&
           x16_.rows == x.rows && x16_.cols == x.cols && x16_.stride == x.row_stride() &&
           x16_.dtype == dtype;
  }

  // Grows xh_ to `bytes` (dropping what it held). Before the op's Timed: it
  // may wait for the stream.
  bool EnsureRoundedScratch(size_t bytes) {
    if (xh_.bytes() >= bytes) return true;
    if (recording_) {
      BreakRecording("growing the bf16 scratch");
      return false;
    }
    SyncStream();  // the old scratch may still be read
    DropRecordings();  // they use the old one
    x16_ = Rounded16{};
    // Freed first: in the arena the old block merges with the free range
    // after it instead of staying behind as a hole.
    xh_.Reset();
    StatusOr<Buffer> buf = Allocate(bytes);
    STRATA_CHECK(buf.ok()) << buf.status().message();
    xh_ = std::move(buf).value();
    return true;
  }

  // Where an op writing F32 `out` also writes out rounded for the GEMM
  // likely to read it next: xh_, when out has more rows than the GEMV takes
  // and the GEMMs run 16-bit weights; else a view without data (none).
  // Called before the op's Timed; MarkRounded after its launch.
  cuda::View PrepareRounded(const Tensor& out) {
    if (out.rows <= cuda::kGemvMaxRows || out.cols == 0 || gemm_dtype_ == DType::kF32 ||
        out.dtype != DType::kF32) {
      return cuda::View{};
    }
    if (!EnsureRoundedScratch(static_cast<size_t>(out.rows * out.cols) * DTypeSize(gemm_dtype_)))
      return cuda::View{};  // recording, broken: what runs is never used
    return cuda::View{xh_.data(), gemm_dtype_, out.rows, out.cols, out.cols};
  }
  void MarkRounded(const Tensor& out, const cuda::View& rounded) {
    x16_ = rounded.data == nullptr
               ? Rounded16{}
               : Rounded16{out.data, out.rows, out.cols, out.row_stride(), rounded.dtype, op_seq_};
  }

  static bool Overlaps(const Tensor& a, const Tensor& b) {
    const auto lo = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data); };
    const auto hi = [](const Tensor& t) {
      return reinterpret_cast<uintptr_t>(t.data) +
             static_cast<uintptr_t>(t.rows * t.row_stride()) * DTypeSize(t.dtype);
    };
    return lo(a) < hi(b) && lo(b) < hi(a);
  }

  static void CheckSameShape(const Tensor& a, const Tensor& b, const Tensor& out) {
    STRATA_CHECK(a.dtype == DType::kF32 && b.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(a.rows == out.rows && b.rows == out.rows && a.cols == out.cols &&
                 b.cols == out.cols)
        << a.rows << "x" << a.cols << ", " << b.rows << "x" << b.cols << " -> " << out.rows << "x"
        << out.cols;
  }

  int32_t* ErrWord() { return static_cast<int32_t*>(err_buf_.data()); }

  // An op that cannot be recorded was issued while recording: the recording
  // fails at EndRecording (with the first such op's name); the op is not run.
  void BreakRecording(const char* what) {
    if (recording_broken_.empty()) recording_broken_ = what;
  }
  // Every recording, before memory that their kernels use moves. REQUIRES:
  // the stream idle or no replay queued since (callers sync first).
  void DropRecordings() {
    for (auto& [id, exec] : recordings_) cudaGraphExecDestroy(exec);
    recordings_.clear();
  }

  // Grows device buffer `buf` to `bytes`; false when the memory is not there.
  // Safe between ops: SampleRows waits for its kernel before returning.
  bool GrowDevice(Buffer& buf, size_t bytes) {
    if (buf.bytes() >= bytes) return true;
    StatusOr<Buffer> b = Allocate(std::max<size_t>(bytes * 5 / 4, 4096));
    if (!b.ok()) return false;
    buf = std::move(b).value();
    return true;
  }
  bool GrowPinned(Buffer& buf, size_t bytes) {
    if (buf.bytes() >= bytes) return true;
    const size_t want = std::max<size_t>(bytes * 5 / 4, 4096);
    void* p = nullptr;
    if (cudaMallocHost(&p, want) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    buf = Buffer(p, want, &FreePinned);
    return true;
  }

  // Packs the rows' inputs, runs the sampling kernel and leaves the results
  // in sample_out_host_. False (nothing launched) when a buffer could not be
  // allocated.
  bool SampleOnDevice(const Tensor& logits, std::span<const SampleRowParams> rows) {
    const int64_t vocab = logits.cols;
    std::vector<cuda::SampleRowArgs>& args = sample_args_;
    args.clear();
    size_t words = 0, banned = 0, bias = 0, penalties = 0;
    int64_t scratch_rows = 0;
    for (const SampleRowParams& p : rows) {
      STRATA_CHECK(p.logit_row >= 0 && p.logit_row < logits.rows)
          << "logit row " << p.logit_row << " of " << logits.rows;
      STRATA_CHECK(p.logprobs <= kMaxLogprobs) << "logprobs " << p.logprobs;
      cuda::SampleRowArgs a;
      a.logit_row = p.logit_row;
      a.uniform = p.uniform;
      a.temperature = p.temperature;
      a.top_p = p.top_p;
      a.min_p = p.min_p;
      a.repetition_penalty = p.repetition_penalty;
      a.frequency_penalty = p.frequency_penalty;
      a.presence_penalty = p.presence_penalty;
      a.top_k = p.top_k;
      a.logprobs = p.logprobs;
      a.allowed_words = static_cast<int32_t>(p.allowed.size());
      a.banned_count = static_cast<int32_t>(p.banned.size());
      a.bias_count = static_cast<int32_t>(p.logit_bias.size());
      a.penalty_count = static_cast<int32_t>(p.penalties.size());
      a.allowed_offset = static_cast<int64_t>(words);
      a.banned_offset = static_cast<int64_t>(banned);
      a.bias_offset = static_cast<int64_t>(bias);
      a.penalty_offset = static_cast<int64_t>(penalties);
      words += p.allowed.size();
      banned += p.banned.size();
      bias += p.logit_bias.size();
      penalties += p.penalties.size();
      const bool adjusts =
          !p.allowed.empty() || !p.banned.empty() || !p.logit_bias.empty() || !p.penalties.empty();
      a.scratch_row = adjusts ? scratch_rows++ : -1;
      args.push_back(a);
    }
    // One upload: [args | allowed words | banned | bias ids | bias values |
    // penalty tokens], each section 16-byte aligned.
    auto align = [](size_t b) { return (b + 15) / 16 * 16; };
    const size_t off_words = align(args.size() * sizeof(cuda::SampleRowArgs));
    const size_t off_banned = off_words + align(words * sizeof(uint32_t));
    const size_t off_bias_ids = off_banned + align(banned * sizeof(int32_t));
    const size_t off_bias_values = off_bias_ids + align(bias * sizeof(int32_t));
    const size_t off_penalties = off_bias_values + align(bias * sizeof(float));
    const size_t total = off_penalties + align(penalties * sizeof(cuda::PenaltyEntry));
    const int64_t nb = (vocab + cuda::kSampleWeightBlock - 1) / cuda::kSampleWeightBlock;
    const size_t out_bytes = rows.size() * sizeof(cuda::SampleRowOut);
    if (!GrowPinned(sample_in_host_, total) || !GrowDevice(sample_in_, total) ||
        !GrowPinned(sample_out_host_, out_bytes) || !GrowDevice(sample_out_, out_bytes) ||
        !GrowDevice(sample_scratch_, static_cast<size_t>(scratch_rows * vocab) * sizeof(float)) ||
        !GrowDevice(sample_mass_, rows.size() * 2 * static_cast<size_t>(nb) * sizeof(double)) ||
        !GrowDevice(sample_partials_, rows.size() * static_cast<size_t>(cuda::SampleChunks(vocab)) *
                                          sizeof(cuda::SamplePartial)))
      return false;
    char* h = static_cast<char*>(sample_in_host_.data());
    std::memcpy(h, args.data(), args.size() * sizeof(cuda::SampleRowArgs));
    size_t cw = off_words, cb = off_banned, ci = off_bias_ids, cv = off_bias_values,
           cp = off_penalties;
    for (const SampleRowParams& p : rows) {
      if (!p.allowed.empty()) std::memcpy(h + cw, p.allowed.data(), p.allowed.size_bytes());
      cw += p.allowed.size_bytes();
      if (!p.banned.empty()) std::memcpy(h + cb, p.banned.data(), p.banned.size_bytes());
      cb += p.banned.size_bytes();
      for (const auto& [id, value] : p.logit_bias) {
        std::memcpy(h + ci, &id, sizeof id);
        std::memcpy(h + cv, &value, sizeof value);
        ci += sizeof id;
        cv += sizeof value;
      }
      if (!p.penalties.empty()) std::memcpy(h + cp, p.penalties.data(), p.penalties.size_bytes());
      cp += p.penalties.size_bytes();
    }
    CUDA_CHECK(cudaMemcpyAsync(sample_in_.data(), h, total, cudaMemcpyHostToDevice, stream_));
    char* d = static_cast<char*>(sample_in_.data());
    cuda::SampleInputs in;
    in.rows = reinterpret_cast<const cuda::SampleRowArgs*>(d);
    in.allowed = reinterpret_cast<const uint32_t*>(d + off_words);
    in.banned = reinterpret_cast<const int32_t*>(d + off_banned);
    in.bias_ids = reinterpret_cast<const int32_t*>(d + off_bias_ids);
    in.bias_values = reinterpret_cast<const float*>(d + off_bias_values);
    in.penalties = reinterpret_cast<const cuda::PenaltyEntry*>(d + off_penalties);
    Timed timed(this, "SampleRows");
    cuda::SampleRows(static_cast<const float*>(logits.data), logits.row_stride(), vocab, in,
                     static_cast<int32_t>(rows.size()), static_cast<float*>(sample_scratch_.data()),
                     static_cast<double*>(sample_mass_.data()),
                     static_cast<cuda::SamplePartial*>(sample_partials_.data()),
                     static_cast<cuda::SampleRowOut*>(sample_out_.data()), stream_);
    Launched();
    CUDA_CHECK(cudaMemcpyAsync(sample_out_host_.data(), sample_out_.data(), out_bytes,
                               cudaMemcpyDeviceToHost, stream_));
    SyncStream();  // the pinned staging is reused next call
    return true;
  }

  // A launch error (bad configuration) surfaces here, at the op that caused it.
  static void Launched() { CUDA_CHECK(cudaPeekAtLastError()); }

  // One cached cuBLASLt plan per GEMM shape, layout and alignment.
  struct MatmulPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~MatmulPlan() {
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (c) cublasLtMatrixLayoutDestroy(c);
      if (op) cublasLtMatmulDescDestroy(op);
    }
  };
  using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t,
                             uint32_t, uint32_t>;

  // Row-major out[n, m] = x[n, k] . w[m, k]^T is, column-major,
  // out^T (m x n) = op_T(W: k x m) . x^T (k x n).
  void Gemm(const void* w, DType wt, int64_t ldw, const void* x, int64_t ldx, void* out,
            int64_t ldo, int64_t m, int64_t n, int64_t k) {
    const int64_t es = DTypeSize(wt);
    const uint32_t aw = Alignment(w, ldw * es), ax = Alignment(x, ldx * es),
                   ao = Alignment(out, ldo * 4);
    const PlanKey key{static_cast<int>(wt), m, n, k, ldw, ldx, ldo, aw, ax, ao};
    auto it = matmul_cache_.find(key);
    if (it == matmul_cache_.end()) {
      auto plan = std::make_unique<MatmulPlan>();
      CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CudaType(wt), k, m, ldw));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CudaType(wt), k, n, ldx));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, m, n, ldo));
      cublasLtMatmulPreference_t pref;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = kWorkspaceBytes;
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof aw));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof ax));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ao, sizeof ao));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ao, sizeof ao));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
          lt_, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      STRATA_CHECK(s == CUBLAS_STATUS_SUCCESS && found > 0)
          << "CUDA backend: cuBLASLt has no GEMM for " << DTypeName(wt) << " m=" << m << " n=" << n
          << " k=" << k << " (" << cublasLtGetStatusString(s) << ")";
      plan->algo = result.algo;
      it = matmul_cache_.emplace(key, std::move(plan)).first;
    }
    const MatmulPlan& p = *it->second;
    const float one = 1.f, zero = 0.f;
    CUBLAS_CHECK(cublasLtMatmul(lt_, p.op, &one, w, p.a, x, p.b, &zero, out, p.c, out, p.c, &p.algo,
                                workspace_.data(), kWorkspaceBytes, stream_));
  }

  Status CopyError(const std::string& what, cudaError_t e) {
    cudaGetLastError();
    return Internal("CUDA backend: page copy on device " + std::to_string(device_) +
                    " failed: " + what + ": " + cudaGetErrorString(e));
  }

  int device_;
  bool bf16_weights_;
  std::string device_name_;
  int num_sms_;
  double mem_fraction_ = 0;
  // The arena (mem_fraction_ > 0): declared before every Buffer member, so
  // it outlives them. Blocks are freed from any thread (DeviceArena locks).
  std::unique_ptr<DeviceArena> arena_;
  void* arena_base_ = nullptr;
  std::atomic<int64_t> device_mallocs_{0};
  cudaStream_t stream_ = nullptr;
  // CopyBlocks state, guarded by copy_mu_. The copy stream is created on
  // first use (a backend that never copies pages never has one).
  std::mutex copy_mu_;
  cudaStream_t copy_stream_ = nullptr;
  std::vector<cuda::CopyDesc> copy_desc_;
  void* desc_dev_ = nullptr;   // the kernel's descriptor array (device)
  void* desc_host_ = nullptr;  // its pinned staging copy
  size_t desc_capacity_ = 0;
  // The device can dereference registered host memory by its host address
  // (cudaDevAttrCanUseHostPointerForRegisteredMem; set in Init).
  bool host_pointers_usable_ = false;
  // Ranges PinHostMemory registered: start -> bytes.
  std::mutex pinned_mu_;
  std::map<uintptr_t, size_t> pinned_;
  cublasLtHandle_t lt_ = nullptr;
  Buffer err_buf_, workspace_, xh_;
  Buffer err_host_;          // pinned: err_buf_'s copy at Synchronize
  Rounded16 x16_;            // what xh_ holds
  uint64_t op_seq_ = 0;      // ops begun (Timed)
  DType gemm_dtype_ = DType::kF32;  // the 16-bit weight type of the last GEMM, F32 before any
  // SampleRows: inputs (pinned staging and device), results (device and
  // pinned), adjusted-logits scratch, per-block masses, per-chunk partials;
  // a host row for a row handed to the host.
  Buffer sample_in_host_, sample_in_, sample_out_, sample_out_host_, sample_scratch_, sample_mass_,
      sample_partials_;
  std::vector<cuda::SampleRowArgs> sample_args_;
  std::vector<float> sample_row_;
  Buffer attn_ws_;  // PagedAttention's split-K partials
  // Recordings (CUDA graphs) by id; the capture in progress and what broke it.
  std::map<int, cudaGraphExec_t> recordings_;
  int next_recording_ = 0;
  bool recording_ = false;
  std::string recording_broken_;
  size_t max_smem_per_block_ = 48 << 10;  // opt-in limit, read in Init
  std::vector<Buffer> weights_;
  std::map<PlanKey, std::unique_ptr<MatmulPlan>> matmul_cache_;
  std::unique_ptr<cuda::OpTimer> timer_;  // null unless STRATA_CUDA_OP_TIMING is set
};

}  // namespace

StatusOr<DeviceMemoryFacts> ReadCudaMemoryFacts(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Unavailable(std::string("no CUDA device: cudaGetDeviceCount says ") +
                       (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"));
  }
  if (device < 0 || device >= count)
    return Unavailable("CUDA device " + std::to_string(device) +
                       " does not exist (this machine has " + std::to_string(count) + ")");
  cudaDeviceProp prop{};
  DeviceMemoryFacts f;
  f.device = device;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) f.name = prop.name;
  size_t free_b = 0, total_b = 0;
  e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Unavailable("CUDA device " + std::to_string(device) +
                       ": cudaMemGetInfo: " + cudaGetErrorString(e));
  }
  f.total_bytes = total_b;
  f.free_bytes = free_b;
  return f;
}

StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  bool bf16 = false;
  if (options.matmul_precision == "bf16") {
    bf16 = true;
  } else if (options.matmul_precision != "fp32") {
    return InvalidArgument("CUDA backend: unknown matmul_precision \"" + options.matmul_precision +
                           "\"; expected fp32 or bf16");
  }
  if (!(options.mem_fraction_static >= 0 && options.mem_fraction_static <= 1))
    return InvalidArgument("CUDA backend: mem_fraction_static " + Num(options.mem_fraction_static) +
                           " is outside [0, 1] (0: no arena)");
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Unavailable(std::string("no CUDA device: cudaGetDeviceCount says ") +
                       (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") +
                       "; use --device cpu");
  }
  if (options.device < 0 || options.device >= count) {
    return InvalidArgument("CUDA backend: device " + std::to_string(options.device) +
                           " does not exist (this machine has " + std::to_string(count) +
                           "); use --device cuda:0 .. cuda:" + std::to_string(count - 1));
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, options.device) != cudaSuccess)
    return Unavailable("CUDA backend: cannot read the properties of device " +
                       std::to_string(options.device));
  if (prop.major != 9 || prop.minor != 0) {
    return FailedPrecondition("CUDA backend: device " + std::to_string(options.device) + " (" +
                              prop.name + ", compute capability " + std::to_string(prop.major) +
                              "." + std::to_string(prop.minor) +
                              ") cannot run this binary's sm_90a (Hopper) code; rebuild with "
                              "-DCMAKE_CUDA_ARCHITECTURES=<its arch> or use --device cpu");
  }
  auto b = std::make_unique<CudaBackend>(options.device, bf16, prop.name, prop.multiProcessorCount,
                                         options.mem_fraction_static);
  RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace strata

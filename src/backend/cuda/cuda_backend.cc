// The CUDA backend: Backend ops as kernels (kernels.cu) and cuBLASLt GEMMs
// on one CUDA stream of one device. Buffers are plain cudaMalloc'ed device
// memory; weights are copied to the device once by UploadWeight.
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
// with either setting.
//
// Page copies (CopyBlocks, for HiCache) run on a second non-blocking
// stream, the copy stream, so they overlap the compute stream's kernels:
// one gather kernel over host memory pinned (and mapped) by PinHostMemory,
// else one cudaMemcpyAsync per block.
//
// Thread-safety: as Backend: ops are issued from one thread at a time.
// CopyBlocks, PinHostMemory and UnpinHostMemory may be called from any
// thread; CopyBlocks calls are served one at a time (copy_mu_).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "util/logging.h"

namespace strata {
namespace {

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
  CudaBackend(int device, bool bf16_weights, const std::string& device_name)
      : device_(device), bf16_weights_(bf16_weights), device_name_(device_name) {}

  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
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
    ASSIGN_OR_RETURN(err_buf_, Allocate(sizeof(int32_t)));
    CUDA_CHECK(cudaMemsetAsync(err_buf_.data(), 0, sizeof(int32_t), stream_));
    int host_ptr = 0;
    if (cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, device_) !=
        cudaSuccess)
      cudaGetLastError();
    host_pointers_usable_ = host_ptr != 0;
    ASSIGN_OR_RETURN(workspace_, Allocate(kWorkspaceBytes));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return OkStatus();
  }

  std::string Name() const override {
    return "cuda (device " + std::to_string(device_) + ": " + device_name_ + ", " +
           (bf16_weights_ ? "bf16" : "fp32") + " matmul)";
  }

  StatusOr<Buffer> Allocate(size_t bytes) override {
    void* p = nullptr;
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
    // From pageable memory the copy is staged before this returns, so the
    // caller may reuse `src` at once.
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }

  // Returns when the bytes are on the host (all earlier ops have finished).
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
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
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaGetLastError());
    int32_t code = 0;
    CUDA_CHECK(cudaMemcpy(&code, err_buf_.data(), sizeof code, cudaMemcpyDeviceToHost));
    STRATA_CHECK(code == cuda::kErrNone)
        << "CUDA backend: an op found a bad index on the device: " << cuda::DeviceErrorName(code)
        << " (a Strata bug)";
  }

  StatusOr<Tensor> UploadWeight(const Tensor& host) override {
    STRATA_CHECK(IsFloatDType(host.dtype)) << DTypeName(host.dtype);
    const DType want = (bf16_weights_ && host.dtype == DType::kBF16) ? DType::kBF16 : DType::kF32;
    const size_t src_row = host.cols * DTypeSize(host.dtype);
    ASSIGN_OR_RETURN(Buffer raw, Allocate(host.rows * src_row));
    CUDA_CHECK(cudaMemcpy2DAsync(raw.data(), src_row, host.data,
                                 host.row_stride() * DTypeSize(host.dtype), src_row, host.rows,
                                 cudaMemcpyHostToDevice, stream_));
    Tensor t{raw.data(), host.dtype, host.rows, host.cols, 0};
    if (want != host.dtype) {
      ASSIGN_OR_RETURN(Buffer wide, Allocate(host.rows * host.cols * DTypeSize(want)));
      Tensor w{wide.data(), want, host.rows, host.cols, 0};
      cuda::Convert(ToView(t), ToView(w), stream_);
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // before `raw` is freed
      t = w;
      raw = std::move(wide);
    }
    weights_.push_back(std::move(raw));
    return t;
  }

  void Embedding(const Tensor& table, const int32_t* ids, Tensor out) override {
    STRATA_CHECK(out.dtype == DType::kF32 && IsFloatDType(table.dtype));
    STRATA_CHECK(out.cols == table.cols) << out.cols << " vs " << table.cols;
    if (out.rows == 0) return;
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
    cuda::RmsNorm(ToView(x), w, eps, ToView(out), stream_);
    Launched();
  }

  void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) override {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(IsFloatDType(w.dtype)) << DTypeName(w.dtype);
    STRATA_CHECK(x.cols == w.cols && out.rows == x.rows && out.cols == w.rows)
        << "Linear shapes: x " << x.rows << "x" << x.cols << ", w " << w.rows << "x" << w.cols
        << ", out " << out.rows << "x" << out.cols;
    const int64_t n = x.rows, m = w.rows, k = x.cols;
    if (n == 0 || m == 0) return;
    STRATA_CHECK(!bias || (bias->rows * bias->cols == m && IsFloatDType(bias->dtype)));
    if (n <= cuda::kGemvMaxRows) {
      // Decode: a bandwidth-bound GEMV with x rounded as it is loaded and
      // the bias fused; no conversion kernel, no cuBLASLt call.
      cuda::Gemv(ToView(x), ToView(w), bias ? ToView(*bias) : cuda::View{}, ToView(out), stream_);
      Launched();
      return;
    }
    const void* b = x.data;
    int64_t ldb = x.row_stride();
    if (w.dtype != DType::kF32) {
      // Tensor-core path: round x to the weight's 16-bit type.
      const size_t bytes = n * k * DTypeSize(w.dtype);
      if (xh_.bytes() < bytes) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old scratch may still be read
        StatusOr<Buffer> buf = Allocate(bytes);
        STRATA_CHECK(buf.ok()) << buf.status().message();
        xh_ = std::move(buf).value();
      }
      Tensor xh{xh_.data(), w.dtype, n, k, 0};
      cuda::Convert(ToView(x), ToView(xh), stream_);
      b = xh_.data();
      ldb = k;
    }
    Gemm(w.data, w.dtype, w.row_stride(), b, ldb, out.data, out.row_stride(), m, n, k);
    if (bias) cuda::AddBias(ToView(out), ToView(*bias), stream_);
    Launched();
  }

  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override {
    CheckSameShape(gate, up, out);
    cuda::SiluMul(ToView(gate), ToView(up), ToView(out), stream_);
    Launched();
  }

  void Add(const Tensor& a, const Tensor& b, Tensor out) override {
    CheckSameShape(a, b, out);
    cuda::Add(ToView(a), ToView(b), ToView(out), stream_);
    Launched();
  }

  void Rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) override {
    STRATA_CHECK(q.dtype == DType::kF32 && k.dtype == DType::kF32);
    STRATA_CHECK(k.cols == 0 || q.rows == k.rows);
    const int hd = rope.head_dim, half = rope.rotary_dim / 2;
    STRATA_CHECK(hd > 0 && hd <= cuda::kMaxHeadDim && rope.rotary_offset >= 0 &&
                 rope.rotary_offset + rope.rotary_dim <= hd && rope.rotary_dim % 2 == 0);
    STRATA_CHECK(q.cols % hd == 0 && k.cols % hd == 0);
    if (q.rows == 0 || half == 0) return;
    cuda::RopeTable t;
    std::copy(rope.inv_freq, rope.inv_freq + half, t.inv_freq);
    t.head_dim = hd;
    t.rotary_dim = rope.rotary_dim;
    t.rotary_offset = rope.rotary_offset;
    t.interleaved = rope.interleaved;
    t.attention_scaling = rope.attention_scaling;
    cuda::Rope(ToView(q), ToView(k), positions, t, stream_);
    Launched();
  }

  void StoreKv(const Tensor& k, const Tensor& v, const KvLayerView& layer,
               const int64_t* slots) override {
    const int64_t e = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
    STRATA_CHECK(k.dtype == DType::kF32 && k.cols == e) << k.cols << " vs kv width " << e;
    if (layer.v != nullptr) {
      STRATA_CHECK(v.dtype == DType::kF32 && k.rows == v.rows && v.cols == e)
          << v.cols << " vs kv width " << e;
    }
    STRATA_CHECK(IsFloatDType(layer.dtype));
    if (k.rows == 0) return;
    cuda::StoreKv(ToView(k), ToView(v), ToKvLayer(layer), slots, ErrWord(), stream_);
    Launched();
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
    cuda::AttentionArgs a{p.num_heads, p.num_kv_heads, hd, p.sliding_window, p.scale};
    cuda::PagedAttention(ToView(q), ToKvLayer(layer), reinterpret_cast<const cuda::Seq*>(seqs),
                         num_seqs, a, ToView(out), stream_);
    Launched();
  }

  void ScaleAddRows(const Tensor& x, const int32_t* rows, const float* scales,
                    Tensor out) override {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32 && x.cols == out.cols);
    if (x.rows == 0) return;
    cuda::ScaleAddRows(ToView(x), rows, scales, ToView(out), ErrWord(), stream_);
    Launched();
  }

  void GatherRows(const Tensor& x, const int32_t* rows, Tensor out) override {
    STRATA_CHECK(x.dtype == out.dtype && x.cols == out.cols);
    if (out.rows == 0) return;
    cuda::GatherRows(ToView(x), rows, ToView(out), ErrWord(), stream_);
    Launched();
  }

 private:
  static constexpr size_t kWorkspaceBytes = 32 << 20;

  static void CheckSameShape(const Tensor& a, const Tensor& b, const Tensor& out) {
    STRATA_CHECK(a.dtype == DType::kF32 && b.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(a.rows == out.rows && b.rows == out.rows && a.cols == out.cols &&
                 b.cols == out.cols)
        << a.rows << "x" << a.cols << ", " << b.rows << "x" << b.cols << " -> " << out.rows << "x"
        << out.cols;
  }

  int32_t* ErrWord() { return static_cast<int32_t*>(err_buf_.data()); }

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
  std::vector<Buffer> weights_;
  std::map<PlanKey, std::unique_ptr<MatmulPlan>> matmul_cache_;
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  bool bf16 = false;
  if (options.matmul_precision == "bf16") {
    bf16 = true;
  } else if (options.matmul_precision != "fp32") {
    return InvalidArgument("CUDA backend: unknown matmul_precision \"" + options.matmul_precision +
                           "\"; expected fp32 or bf16");
  }
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
  auto b = std::make_unique<CudaBackend>(options.device, bf16, prop.name);
  RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace strata

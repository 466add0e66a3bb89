// The op interface that model code is written against, once, for every
// backend (CPU now, CUDA later). ARCHITECTURE.md: "model/ is written once
// against the backend's op interface".
//
// Conventions
// - Tensors are non-owning 2-D row-major views (Tensor) into memory the
//   backend allocated (Buffer). Row stride may exceed cols (views into a
//   fused output).
// - Activations are F32. Weights may be F32, F16 or BF16; a model passes
//   each through UploadWeight once (the CPU uses a memory-mapped checkpoint
//   in place; the CUDA backend copies it to the GPU). KV pages are F32, F16
//   or BF16 (KvLayerView::dtype).
// - Index arrays (ids, positions, slots, page tables, the AttentionSeq
//   array) live in backend memory too; on the CPU that is ordinary host
//   memory. RopeParams::inv_freq is the one host-memory input.
// - Ops are issued from one thread (the engine thread). A backend may run
//   an op on many threads internally; ops on one Backend run in issue order.
//   After Synchronize() all earlier ops have finished.
// - Shapes are the caller's responsibility: a mismatch is a Strata bug and
//   aborts via STRATA_CHECK, not a Status (ops sit on the hot path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/device_memory.h"
#include "backend/dtype.h"
#include "backend/sampling.h"
#include "util/status.h"

namespace strata {

// A 2-D row-major view: element (r, c) is at data + (r * stride + c) * size.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between rows; 0 means == cols

  int64_t row_stride() const { return stride ? stride : cols; }
  template <typename T>
  T* row(int64_t r) const {
    return reinterpret_cast<T*>(static_cast<char*>(data) + r * row_stride() * DTypeSize(dtype));
  }
  // Columns [c0, c0 + n) of every row, sharing memory.
  Tensor Cols(int64_t c0, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + c0 * DTypeSize(dtype);
    t.cols = n;
    t.stride = row_stride();
    return t;
  }
  // Rows [r0, r0 + n), sharing memory.
  Tensor Rows(int64_t r0, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + r0 * row_stride() * DTypeSize(dtype);
    t.rows = n;
    t.stride = row_stride();
    return t;
  }
};

// Owning handle to backend memory. Movable, not copyable. Freed by
// free_fn(data), or free_ctx(ctx, data) when the memory belongs to an owner
// (the CUDA backend's arena).
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t bytes, void (*free_fn)(void*))
      : data_(data), bytes_(bytes), free_(free_fn) {}
  Buffer(void* data, size_t bytes, void (*free_ctx)(void* ctx, void* data), void* ctx)
      : data_(data), bytes_(bytes), free_ctx_(free_ctx), ctx_(ctx) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_;
      bytes_ = o.bytes_;
      free_ = o.free_;
      free_ctx_ = o.free_ctx_;
      ctx_ = o.ctx_;
      o.data_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }
  void Reset() {
    if (data_ && free_ctx_)
      free_ctx_(ctx_, data_);
    else if (data_ && free_)
      free_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Tensor AsTensor(DType t, int64_t rows, int64_t cols) const {
    return Tensor{data_, t, rows, cols, 0};
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  void (*free_)(void*) = nullptr;
  void (*free_ctx_)(void*, void*) = nullptr;
  void* ctx_ = nullptr;
};

// One layer's K and V pages. Token slot s (= page_id * page_size + offset)
// stores num_kv_heads * head_dim elements at k + s * num_kv_heads * head_dim
// (same for v): layout [page][offset][kv_head][head_dim].
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF32;
  int32_t page_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t num_pages = 0;
  // > 1: a group of one entry per window of tokens_per_entry tokens
  // (cache/kv_layout.h PoolGroupSpec): a page then holds
  // ceil(page_size / tokens_per_entry) entries, and slot s = page_id *
  // that + offset. Only the model that declared such a group reads it; the
  // attention ops take token groups (1).
  int32_t tokens_per_entry = 1;
};

// One sequence's slice of an attention batch. Its q_len new tokens occupy
// rows [q_start, q_start + q_len) of q/out and sit at positions
// kv_len - q_len .. kv_len - 1; their K/V are already stored (StoreKv).
// page_table[i] holds positions [i * page_size, (i + 1) * page_size).
struct AttentionSeq {
  int32_t q_start = 0;
  int32_t q_len = 0;
  int32_t kv_len = 0;
  const int32_t* page_table = nullptr;
};

struct AttentionParams {
  int32_t num_heads = 0;     // query heads; q has num_heads * head_dim columns
  int32_t num_kv_heads = 0;  // GQA: query head h reads kv head h / (num_heads / num_kv_heads)
  int32_t head_dim = 0;
  float scale = 0.f;           // usually 1/sqrt(head_dim)
  int32_t sliding_window = 0;  // 0: full causal; else attend to the last W positions incl. self
  // The longest kv_len of the call's sequences, or an upper bound on it
  // (ForwardBatch::max_kv_len: the host knows it without reading the
  // AttentionSeq array back); 0: unknown. A hint for how to split the work
  // (the CUDA backend cuts the KV range into no more pieces than it has):
  // outputs never depend on it, even when it understates.
  int32_t max_kv_len = 0;
};

// Rotary embedding parameters, computed once by the model from its config
// (default / linear / llama3 scaling all reduce to an inv_freq table).
struct RopeParams {
  const float* inv_freq = nullptr;  // rotary_dim / 2 entries, host memory
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;  // rotary_offset + rotary_dim <= head_dim
  float attention_scaling = 1.f;  // multiplies cos/sin (yarn's attention factor; else 1)
  // First rotated dim of each head: dims [rotary_offset, rotary_offset +
  // rotary_dim) rotate, the rest pass through (MLA puts the rotary part
  // after the non-positional part of each query head).
  int32_t rotary_offset = 0;
  // false: HF "rotate_half" (dim i pairs with i + rotary_dim / 2). true:
  // GPT-J / DeepSeek interleaved pairs (2i, 2i + 1) rotated by frequency i,
  // results written back in de-interleaved order [rotated evens, rotated
  // odds] as transformers' apply_rotary_pos_emb_interleave does, so q and k
  // stay consistent with each other.
  bool interleaved = false;
};

// One output of Backend::LinearGroup / LinearSiluMul: out = x . w^T (+ bias).
struct LinearPart {
  Tensor w;
  const Tensor* bias = nullptr;  // may be null
  Tensor out;
};

// Batched copies between backend memory and host memory (HiCache backups
// and load-backs, PD staging). Blocks may differ in size; they must not
// overlap one another.
enum class CopyKind : uint8_t {
  kHostToDevice,  // dst in backend memory (Allocate), src in host memory
  kDeviceToHost,  // dst in host memory, src in backend memory
};
struct CopyBlock {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// What a backend's memory looks like now. Without an arena (the CPU, or
// CUDA at mem_fraction_static 0) only device_mallocs is counted.
struct BackendMemoryUsage {
  uint64_t arena_bytes = 0;  // 0: no arena
  uint64_t arena_used = 0;
  uint64_t arena_peak = 0;
  uint64_t arena_largest_free = 0;
  // cudaMalloc calls made for Allocate/UploadWeight so far (1 with an arena).
  int64_t device_mallocs = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;

  // Memory for activations, KV pages and index arrays. 64-byte aligned.
  // Errors: ResourceExhausted (out of backend memory, or of the arena).
  virtual StatusOr<Buffer> Allocate(size_t bytes) = 0;
  // Where this backend's memory comes from, for logs and tests.
  virtual BackendMemoryUsage memory_usage() const { return {}; }
  // Host <-> backend copies (plain memcpy on the CPU). CopyToDevice from
  // memory PinHostMemory registered may read `src` when the copy runs, in
  // issue order after earlier ops: keep it unchanged until Synchronize (from
  // other host memory the bytes are taken before it returns).
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void Synchronize() {}
  // Whether ops return before they have run (a GPU's queue; the CPU runs
  // each op to its end). The engine then does host work that a step's
  // results do not feed (its constraint masks) while the step computes.
  virtual bool ComputesAsynchronously() const { return false; }

  // Copies every block and returns when all of them are done. Unlike the
  // ops below, this may be called from any thread, concurrently with ops
  // issued on the engine thread (the HiCache controller thread calls it): it
  // uses its own threads (CPU: a multithreaded memcpy) or its own stream
  // (CUDA: one batched async copy), never the compute queue. Host memory
  // should be registered with PinHostMemory for full speed on a GPU.
  // Concurrent CopyBlocks calls are safe (a backend may serve them one after
  // the other). Zero-byte blocks are allowed. Errors: the backend's copy
  // failed (the blocks' contents are then unspecified).
  virtual Status CopyBlocks(std::span<const CopyBlock> blocks, CopyKind kind) = 0;
  // Registers host memory [p, p + bytes) for fast device copies (CUDA:
  // cudaHostRegister) until UnpinHostMemory(p). The CPU backend does
  // nothing. Errors: the registration failed.
  virtual Status PinHostMemory(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
    return OkStatus();
  }
  virtual void UnpinHostMemory(void* p) { (void)p; }

  // A view of weight `host` (host memory, e.g. the mapped checkpoint) that
  // this backend's ops can read, valid while the backend lives. The CPU
  // returns `host` itself; the CUDA backend returns a device copy (possibly
  // converted: see CudaBackendOptions). Errors: out of backend memory.
  virtual StatusOr<Tensor> UploadWeight(const Tensor& host) { return host; }

  // out[i, :] = table[ids[i], :] as F32. out.rows == number of ids.
  virtual void Embedding(const Tensor& table, const int32_t* ids, Tensor out) = 0;

  // out = x * rsqrt(mean(x^2) + eps) * weight, per row (HF LlamaRMSNorm:
  // normalise in f32, then multiply by the weight). out may alias x.
  virtual void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) = 0;

  // out[n, m] = x[n, k] . w[m, k]^T (+ bias[m]). x, out F32; w any weight
  // dtype, accumulated in F32. bias may be null. out must not alias x.
  virtual void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) = 0;

  // Linear of one x against several weights with the same k (q/k/v,
  // gate/up): for each part, part.out = x . part.w^T (+ part.bias), exactly
  // what Linear(x, part.w, part.bias, part.out) gives. A backend may compute
  // them in one pass (CUDA: one GEMV launch for a decode row); this default
  // calls Linear per part, so a backend without an override (the CPU) is
  // unchanged to the bit. No out may alias x.
  virtual void LinearGroup(const Tensor& x, std::span<const LinearPart> parts) {
    for (const LinearPart& p : parts) Linear(x, p.w, p.bias, p.out);
  }

  // The MLP's gated activation: out = silu(x . gate.w^T + gate.bias) *
  // (x . up.w^T + up.bias), exactly LinearGroup(x, {gate, up}) then
  // SiluMul(gate.out, up.out, out) (this default). gate.out and up.out are
  // scratch: a backend that fuses (CUDA, one decode row) leaves them
  // unwritten. out may alias either.
  virtual void LinearSiluMul(const Tensor& x, const LinearPart& gate, const LinearPart& up,
                             Tensor out) {
    const LinearPart parts[] = {gate, up};
    LinearGroup(x, parts);
    SiluMul(gate.out, up.out, out);
  }

  // The residual add and the norm after it: x += delta, then out =
  // RmsNorm(x), exactly Add(x, delta, x) then RmsNorm(x, weight, eps, out)
  // (this default). out must not alias x or delta.
  virtual void AddRmsNorm(Tensor x, const Tensor& delta, const Tensor& weight, float eps,
                          Tensor out) {
    Add(x, delta, x);
    RmsNorm(x, weight, eps, out);
  }

  // out = silu(gate) * up, elementwise. out may alias gate or up.
  virtual void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) = 0;

  // out = a + b, elementwise. out may alias a or b.
  virtual void Add(const Tensor& a, const Tensor& b, Tensor out) = 0;

  // Rotates q [n, heads * head_dim] and k [n, kv_heads * head_dim] in place,
  // row i at position positions[i] (see RopeParams for which dims and how).
  // k may have no columns (only q rotates): models whose keys have another
  // head shape rotate them in a second call.
  virtual void Rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) = 0;

  // Writes row i of k and v ([n, kv_heads * head_dim], F32) into token slot
  // slots[i] of layer, converting to layer.dtype. A K-only layer (an MLA
  // latent pool: layer.v null) stores k alone and ignores v.
  virtual void StoreKv(const Tensor& k, const Tensor& v, const KvLayerView& layer,
                       const int64_t* slots) = 0;

  // Rope(q, k, positions, rope) then StoreKv(k, v, layer, slots): the
  // rotated keys go to the cache (this default). A backend may fuse the two
  // (CUDA: one kernel for decode rows); the results are the same bits.
  // REQUIRES: as Rope and StoreKv, and k holds whole KV rows (k.cols ==
  // layer's kv_heads * head_dim).
  virtual void RopeStoreKv(Tensor q, Tensor k, const Tensor& v, const int32_t* positions,
                           const RopeParams& rope, const KvLayerView& layer, const int64_t* slots) {
    Rope(q, k, positions, rope);
    StoreKv(k, v, layer, slots);
  }

  // Causal attention of each sequence's new queries over its paged context.
  // q, out: [total new tokens, num_heads * head_dim], F32. Softmax in F32.
  // layer.v may equal layer.k (MLA in absorbed form: the values are the
  // cached latent itself).
  virtual void PagedAttention(const Tensor& q, const KvLayerView& layer, const AttentionSeq* seqs,
                              int32_t num_seqs, const AttentionParams& params, Tensor out) = 0;

  // out[i, :] = x[rows[i], :]. Used to pick the rows that need logits.
  virtual void GatherRows(const Tensor& x, const int32_t* rows, Tensor out) = 0;

  // out[rows[i], :] += scales[i] * x[i, :] for i in [0, x.rows), in order of
  // i (F32; rows and scales in backend memory). The rows of one call must be
  // distinct. A mixture-of-experts layer adds each expert's outputs back to
  // the tokens routed to it this way.
  virtual void ScaleAddRows(const Tensor& x, const int32_t* rows, const float* scales,
                            Tensor out) = 0;

  // The next token of each row (backend/sampling.h): out[i] for rows[i],
  // sampled from logits row rows[i].logit_row (F32, logits.cols = vocab)
  // with the host Sampler's semantics, either here or by host.SampleOnHost.
  // Returns when every result is on the host; only the results (and the
  // logits of rows handed to the host) are copied. logits stays unchanged.
  // REQUIRES: out.size() == rows.size(); each logit_row < logits.rows.
  // This default copies each row to the host and hands it over.
  virtual void SampleRows(const Tensor& logits, std::span<const SampleRowParams> rows,
                          HostRowSampler& host, std::span<SampleResult> out);

  // ---- Recorded op sequences (CUDA graphs) ----
  // A backend that queues ops (a GPU) may record the ops of one step once
  // and replay them: one enqueue instead of one per op. A replay runs the
  // recorded ops with the recorded arguments: the same shapes, pointers and
  // host-side values (RopeParams::inv_freq, AttentionParams, counts such as
  // num_seqs), as they were when recorded. What it reads afresh is backend
  // memory: activations, KV pages and the index arrays (ids, positions,
  // slots, page tables, AttentionSeq), so the per-step values of a replayed
  // step travel through buffers at fixed addresses that the caller fills
  // (CopyToDevice, in issue order before Replay).
  //
  // REQUIRES for a replay to compute what issuing the ops again would: the
  // caller would issue exactly the recorded ops with the recorded arguments;
  // only the contents of backend memory differ. Ops are issued from the one
  // engine thread, as always.
  //
  // BeginRecording: the ops issued until EndRecording are recorded, not run
  // (their outputs stay unwritten). While recording, nothing may wait for
  // the device or need the host to see results: Synchronize, CopyToHost,
  // CopyToDevice, SampleRows and an Allocate make the recording fail (the
  // backend notes it and does not run them). EndRecording returns the
  // recording's id (>= 0), or an error saying what broke it; nothing of a
  // failed recording ran, so the caller issues the ops again, unrecorded.
  // Replay(id) enqueues the recorded ops and returns true, or returns false
  // having enqueued nothing when the backend has dropped the recording (it
  // drops them all when it must move memory they use, e.g. a scratch buffer
  // a longer step grew): the caller then issues the ops itself and may
  // record them again. ForgetRecording(id) frees one (a dropped id too).
  // Recordings live until forgotten, dropped or the backend is destroyed.
  // A backend that cannot record (the CPU: each op runs to its end, there is
  // nothing to save) returns false from SupportsRecording; the others are
  // then never called.
  virtual bool SupportsRecording() const { return false; }
  virtual Status BeginRecording() { return Unimplemented("this backend records no ops"); }
  virtual StatusOr<int> EndRecording() { return Unimplemented("this backend records no ops"); }
  virtual bool Replay(int id) {
    (void)id;
    return false;
  }
  virtual void ForgetRecording(int id) { (void)id; }
};

struct CpuBackendOptions {
  int num_threads = 0;  // 0: all online CPUs
  // Highest instruction set to use: "auto" (what the CPU has), "avx512",
  // "avx2", "scalar". Lets tests compare kernels and users pin behaviour.
  std::string isa = "auto";
  // Arithmetic of many-row Linear (prefill): "fp32" (F32 activations and
  // accumulation; the exact default) or "bf16" (activations rounded to bf16,
  // products via AVX512_BF16 with F32 accumulation; faster, less exact;
  // needs isa avx512 on a CPU with AVX512_BF16). Few-row Linear (decode) is
  // always fp32.
  std::string matmul_precision = "fp32";
  // Threads of CopyBlocks (HiCache page copies), counting the calling
  // thread: a pool of its own, separate from the compute threads above,
  // because the cache controller copies while the engine thread computes.
  // 0: min(4, online CPUs / 2), at least 1 (memcpy saturates memory
  // bandwidth with a few threads; more would steal cores from compute).
  int copy_threads = 0;
};

// What CpuBackendOptions::copy_threads = 0 means on this machine.
int DefaultCpuCopyThreads();

// The CPU backend (backend/cpu/). Fails if `isa` names an instruction set the
// CPU lacks.
StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options);

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal (--device cuda:N)
  // Arithmetic of Linear: "fp32" (weights widened to F32 at upload, F32
  // GEMM with TF32 off: matches the CPU backend and transformers' fp32
  // goldens) or "bf16" (BF16 weights stay BF16, activations are rounded to
  // BF16 for the GEMM, F32 accumulation on the tensor cores; faster, less
  // exact).
  std::string matmul_precision = "fp32";
  // --mem-fraction-static: > 0 takes ArenaBytes(device, fraction) (a
  // fraction of the device's total memory) in ONE cudaMalloc at creation
  // and serves every Allocate and weight upload from it
  // (backend/device_memory.h DeviceArena); creation fails with
  // ResourceExhausted, before anything else is allocated, when that much is
  // not free. 0: one cudaMalloc per buffer (tests, tools). In (0, 1].
  double mem_fraction_static = 0;
};

// The memory facts of CUDA device `device` (cudaMemGetInfo; creates the
// device's context in this process). Unavailable when this binary has no
// CUDA backend or the device does not exist.
StatusOr<DeviceMemoryFacts> ReadCudaMemoryFacts(int device);

// The CUDA backend (backend/cuda/). Errors: Unavailable when this binary was
// built without CUDA or no CUDA device is present (the message says which),
// InvalidArgument for a bad option.
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace strata

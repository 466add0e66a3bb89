// The CPU backend: Backend ops on host memory, run on a persistent thread
// pool, with the hot loops taken from the kernel set chosen at creation
// (kernels.h). Elementwise ops are plain C++ here; they are a small share of
// the time and the compiler vectorises them for the baseline target.
//
// Thread-safety: as Backend: ops are issued from one thread at a time;
// CopyBlocks may be called from any thread (its own pool, its own mutex).
#include <emmintrin.h>  // SSE2 (baseline x86-64): streaming stores
#include <sys/mman.h>
#include <unistd.h>
#include <xmmintrin.h>  // _mm_prefetch

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "util/logging.h"

namespace strata {
namespace {

using cpu::CpuKernels;
using cpu::LinearArgs;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// 64-byte aligned. Buffers of 2 MiB and more (the KV pool, big
// activations) are aligned to 2 MiB and asked to use transparent huge pages:
// PagedAttention and the HiCache page copies touch KV pages in random order,
// and with 4 KiB pages each 16 KiB page run costs several TLB misses (page
// copies measured ~10 % faster on THP; hicache_copy_bench).
void* AlignedAlloc(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < kHuge) return std::aligned_alloc(64, RoundUp(std::max<size_t>(bytes, 1), 64));
  void* p = std::aligned_alloc(kHuge, RoundUp(bytes, kHuge));
  if (p) (void)madvise(p, RoundUp(bytes, kHuge), MADV_HUGEPAGE);  // best effort
  return p;
}

// Page copies at least this big use streaming stores: well past the L3 of
// the CPUs we run on (32 MiB on this EPYC part; glibc's own threshold for a
// single memcpy is about 3/4 of it), so a normal store would be evicted
// before anyone reads it anyway.
constexpr size_t kStreamingCopyBytes = size_t{64} << 20;

// memcpy with non-temporal (streaming) stores: the destination lines are
// written without being read first (a plain memcpy's stores read each line
// for ownership: 3 bytes of memory traffic per byte copied instead of 2) and
// do not evict the cache. For copies far bigger than the cache, where glibc
// streams too, but made of blocks (16 KiB pages) too small for glibc to
// choose it. Ends with sfence: streaming stores are weakly ordered, and the
// caller publishes "done" with an ordinary store.
void StreamingCopy(char* dst, const char* src, size_t n) {
  if (n == 0) return;
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  for (; n >= 64; n -= 64, dst += 64, src += 64) {
    _mm_prefetch(src + 512, _MM_HINT_T0);  // a few lines ahead (harmless past the end)
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, n);
  _mm_sfence();
}

// Element i of a contiguous vector of any float dtype, as F32.
inline float LoadAsFloat(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default:
      STRATA_CHECK(false) << "not a float dtype: " << DTypeName(t);
  }
  return 0.f;
}

inline void StoreFromFloat(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToF16(v);
      return;
    default:
      STRATA_CHECK(false) << "not a float dtype: " << DTypeName(t);
  }
}

bool IsFloatDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Converts a vector tensor (1 x n or n x 1, contiguous) to F32 in `dst`.
const float* VectorAsF32(const Tensor& t, int64_t n, std::vector<float>* dst) {
  STRATA_CHECK(t.rows * t.cols == n) << "vector has " << t.rows << "x" << t.cols << ", want " << n;
  STRATA_CHECK(t.rows == 1 || t.cols == 1 || t.row_stride() == t.cols)
      << "vector must be contiguous";
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
  dst->resize(n);
  for (int64_t i = 0; i < n; ++i) (*dst)[i] = LoadAsFloat(t.data, t.dtype, i);
  return dst->data();
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, int copy_threads, cpu::CpuIsa isa, const CpuKernels* kernels,
             bool bf16_matmul, bool amx)
      : pool_(num_threads),
        copy_pool_(copy_threads),
        isa_(isa),
        kernels_(kernels),
        bf16_matmul_(bf16_matmul),
        amx_(amx) {
    for (int t = 0; t < num_threads; ++t) {
      scratch_.emplace_back(static_cast<char*>(AlignedAlloc(cpu::kGemmScratchBytes)), &std::free);
    }
  }

  std::string Name() const override {
    return std::string("cpu (") + cpu::CpuIsaName(isa_) +
           (amx_           ? ", bf16 matmul on AMX"
            : bf16_matmul_ ? ", bf16 matmul"
                           : "") +
           ", " + std::to_string(pool_.num_threads()) + " threads, " +
           std::to_string(copy_pool_.num_threads()) + " copy threads)";
  }

  StatusOr<Buffer> Allocate(size_t bytes) override {
    void* p = AlignedAlloc(bytes);
    if (!p) {
      return ResourceExhausted("CPU backend: cannot allocate " + std::to_string(bytes) +
                               " bytes of host memory; lower the KV cache size or batch size");
    }
    return Buffer(p, bytes, &std::free);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  // The blocks, concatenated, are cut into equal byte ranges, one task each:
  // a big block is split over threads and many small ones (a 16 KiB page of
  // one layer is typical) are grouped, so every thread moves about the same
  // bytes whatever the block sizes. Tasks are handed out dynamically.
  Status CopyBlocks(std::span<const CopyBlock> blocks, CopyKind) override {
    // One copy at a time: copy_pool_ (like pool_) runs one job at a time,
    // and a second caller would only split the same memory bandwidth.
    std::lock_guard<std::mutex> lock(copy_mu_);
    copy_offsets_.resize(blocks.size() + 1);
    size_t total = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      copy_offsets_[i] = total;
      total += blocks[i].bytes;
    }
    copy_offsets_[blocks.size()] = total;
    // A copy much bigger than the cache streams (see StreamingCopy); a
    // small one stays cached for the attention that reads it next.
    const bool stream = total >= kStreamingCopyBytes;
    // Copies bytes [off, off + n) of block i. Streaming, it first prefetches
    // the start of block i + 1: blocks sit at random places, so the
    // hardware prefetcher starts every one cold (+10 % on one thread).
    auto copy = [&blocks, stream](size_t i, size_t off, size_t n) {
      char* dst = static_cast<char*>(blocks[i].dst) + off;
      const char* src = static_cast<const char*>(blocks[i].src) + off;
      if (stream) {
        if (i + 1 < blocks.size()) {
          const char* next = static_cast<const char*>(blocks[i + 1].src);
          for (int k = 0; k < 8; ++k) _mm_prefetch(next + 64 * k, _MM_HINT_T0);
        }
        StreamingCopy(dst, src, n);
      } else if (n) {
        std::memcpy(dst, src, n);
      }
    };
    // Below this a second thread costs more to wake than it saves.
    constexpr size_t kMinParallelBytes = size_t{256} << 10;
    const size_t threads = static_cast<size_t>(copy_pool_.num_threads());
    if (threads == 1 || total < kMinParallelBytes) {
      for (size_t i = 0; i < blocks.size(); ++i) copy(i, 0, blocks[i].bytes);
      return OkStatus();
    }
    // ~4 tasks per thread balances a descheduled thread; 4 KiB multiples keep
    // cuts page-aligned within page-aligned blocks.
    const size_t task_bytes = RoundUp(CeilDiv(total, threads * 4), 4096);
    const int64_t num_tasks = CeilDiv(total, task_bytes);
    copy_pool_.ParallelFor(num_tasks, [&](int64_t t, int) {
      size_t lo = static_cast<size_t>(t) * task_bytes;
      const size_t hi = std::min(total, lo + task_bytes);
      // The block holding byte lo: the last offset <= lo (skips empty blocks).
      size_t i = std::upper_bound(copy_offsets_.begin(), copy_offsets_.end(), lo) -
                 copy_offsets_.begin() - 1;
      while (lo < hi) {
        const size_t off = lo - copy_offsets_[i];
        const size_t n = std::min(hi, copy_offsets_[i + 1]) - lo;
        copy(i, off, n);
        lo += n;
        ++i;
      }
    });
    return OkStatus();
  }

  void Embedding(const Tensor& table, const int32_t* ids, Tensor out) override {
    STRATA_CHECK(out.dtype == DType::kF32 && IsFloatDType(table.dtype));
    STRATA_CHECK(out.cols == table.cols) << out.cols << " vs " << table.cols;
    for (int64_t i = 0; i < out.rows; ++i) {
      STRATA_CHECK(ids[i] >= 0 && ids[i] < table.rows) << "token id " << ids[i] << " out of range";
      const char* src = static_cast<const char*>(table.data) +
                        ids[i] * table.row_stride() * DTypeSize(table.dtype);
      float* dst = out.row<float>(i);
      for (int64_t c = 0; c < out.cols; ++c) dst[c] = LoadAsFloat(src, table.dtype, c);
    }
  }

  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(x.rows == out.rows && x.cols == out.cols);
    const int64_t d = x.cols;
    const float* w = VectorAsF32(weight, d, &weight_f32_);
    ForRows(x.rows, d, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.row<float>(r);
        float* o = out.row<float>(r);
        double ss = 0;
        for (int64_t c = 0; c < d; ++c) ss += static_cast<double>(xr[c]) * xr[c];
        const float inv = 1.f / std::sqrt(static_cast<float>(ss / d) + eps);
        for (int64_t c = 0; c < d; ++c) o[c] = w[c] * (xr[c] * inv);
      }
    });
  }

  void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) override {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(IsFloatDType(w.dtype)) << DTypeName(w.dtype);
    STRATA_CHECK(x.cols == w.cols && out.rows == x.rows && out.cols == w.rows)
        << "Linear shapes: x " << x.rows << "x" << x.cols << ", w " << w.rows << "x" << w.cols
        << ", out " << out.rows << "x" << out.cols;
    const int64_t n = x.rows, m = w.rows;
    if (n == 0 || m == 0) return;
    LinearArgs a;
    a.x = static_cast<const float*>(x.data);
    a.x_stride = x.row_stride();
    a.n = n;
    a.k = x.cols;
    a.w = w.data;
    a.w_dtype = w.dtype;
    a.w_stride = w.row_stride();
    a.bias = bias ? VectorAsF32(*bias, m, &bias_f32_) : nullptr;
    a.out = static_cast<float*>(out.data);
    a.out_stride = out.row_stride();
    a.prefetch_bytes = gemv_prefetch_;
    a.gemv_streams = gemv_streams_;
    const int64_t threads = pool_.num_threads();
    if (n <= cpu::kMaxGemvRows) {
      // Memory bound: a few chunks per thread so a slow thread is covered.
      const int64_t chunk = std::max<int64_t>(64, RoundUp(CeilDiv(m, threads * 4), 16));
      pool_.ParallelFor(CeilDiv(m, chunk), [&](int64_t t, int) {
        kernels_->gemv(a, t * chunk, std::min(m, (t + 1) * chunk));
      });
      return;
    }
    auto gemm = kernels_->gemm;
    if (bf16_matmul_) {
      gemm = amx_ ? kernels_->gemm_bf16_amx : kernels_->gemm_bf16;
      a.xb_stride = RoundUp(a.k, 32);
      xb_.resize(n * a.xb_stride);
      a.xb = xb_.data();
      ForRows(n, a.k, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = a.x + r * a.x_stride;
          uint16_t* d = xb_.data() + r * a.xb_stride;
          for (int64_t c = 0; c < a.k; ++c) d[c] = FloatToBf16(xr[c]);
          for (int64_t c = a.k; c < a.xb_stride; ++c) d[c] = 0;
        }
      });
    }
    // Compute bound: a few column ranges per thread, handed out dynamically,
    // so a thread the machine preempts holds up at most one small range
    // (with one range per thread the others waited for all of it). Each range
    // packs only its own weight panels, so splitting costs no repacking; at
    // least 128 columns keeps a range a whole group of packed panels.
    const int64_t tasks = threads > 1 ? 4 * threads : 1;
    const int64_t chunk = RoundUp(std::max<int64_t>(128, CeilDiv(m, tasks)), kernels_->gemm_cols_align);
    pool_.ParallelFor(CeilDiv(m, chunk), [&](int64_t t, int thread) {
      gemm(a, t * chunk, std::min(m, (t + 1) * chunk), scratch_[thread].get());
    });
  }

  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override {
    CheckSameShape(gate, up, out);
    ForRows(out.rows, out.cols, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* g = gate.row<float>(r);
        const float* u = up.row<float>(r);
        float* o = out.row<float>(r);
        kernels_->silu_mul(g, u, o, out.cols);
      }
    });
  }

  void Add(const Tensor& a, const Tensor& b, Tensor out) override {
    CheckSameShape(a, b, out);
    ForRows(out.rows, out.cols, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* x = a.row<float>(r);
        const float* y = b.row<float>(r);
        float* o = out.row<float>(r);
        for (int64_t c = 0; c < out.cols; ++c) o[c] = x[c] + y[c];
      }
    });
  }

  void Rope(Tensor q, Tensor k, const int32_t* positions, const RopeParams& rope) override {
    STRATA_CHECK(q.dtype == DType::kF32 && k.dtype == DType::kF32);
    STRATA_CHECK(k.cols == 0 || q.rows == k.rows);
    const int hd = rope.head_dim, half = rope.rotary_dim / 2, off = rope.rotary_offset;
    STRATA_CHECK(hd > 0 && off >= 0 && off + rope.rotary_dim <= hd && rope.rotary_dim % 2 == 0);
    STRATA_CHECK(q.cols % hd == 0 && k.cols % hd == 0);
    ForRows(q.rows, q.cols + k.cols, [&](int64_t r0, int64_t r1) {
      std::vector<float> cs(2 * half), x(2 * half);
      for (int64_t r = r0; r < r1; ++r) {
        const float pos = static_cast<float>(positions[r]);
        for (int i = 0; i < half; ++i) {
          const float f = pos * rope.inv_freq[i];  // F32 product, as HF
          cs[i] = static_cast<float>(std::cos(static_cast<double>(f))) * rope.attention_scaling;
          cs[half + i] =
              static_cast<float>(std::sin(static_cast<double>(f))) * rope.attention_scaling;
        }
        auto rotate = [&](float* row, int64_t cols) {
          for (int64_t h = 0; h < cols; h += hd) {
            float* v = row + h + off;
            if (rope.interleaved) {  // pairs (2i, 2i + 1) -> dims i and half + i
              std::copy(v, v + 2 * half, x.begin());
              for (int i = 0; i < half; ++i) {
                const float x1 = x[2 * i], x2 = x[2 * i + 1];
                v[i] = x1 * cs[i] - x2 * cs[half + i];
                v[half + i] = x2 * cs[i] + x1 * cs[half + i];
              }
              continue;
            }
            for (int i = 0; i < half; ++i) {
              const float x1 = v[i], x2 = v[half + i];
              v[i] = x1 * cs[i] - x2 * cs[half + i];
              v[half + i] = x2 * cs[i] + x1 * cs[half + i];
            }
          }
        };
        rotate(q.row<float>(r), q.cols);
        if (k.cols > 0) rotate(k.row<float>(r), k.cols);
      }
    });
  }

  void StoreKv(const Tensor& k, const Tensor& v, const KvLayerView& layer,
               const int64_t* slots) override {
    const int64_t e = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
    const bool has_v = layer.v != nullptr;
    STRATA_CHECK(k.dtype == DType::kF32 && k.cols == e) << k.cols << " vs kv width " << e;
    if (has_v) {
      STRATA_CHECK(v.dtype == DType::kF32 && k.rows == v.rows && v.cols == e)
          << v.cols << " vs kv width " << e;
    }
    const int64_t num_slots = layer.num_pages * layer.page_size;
    for (int64_t i = 0; i < k.rows; ++i) {
      const int64_t s = slots[i];
      STRATA_CHECK(s >= 0 && s < num_slots) << "KV slot " << s << " out of range " << num_slots;
      const float* kr = k.row<float>(i);
      const float* vr = has_v ? v.row<float>(i) : nullptr;
      if (layer.dtype == DType::kF32) {
        std::memcpy(static_cast<float*>(layer.k) + s * e, kr, e * 4);
        if (has_v) std::memcpy(static_cast<float*>(layer.v) + s * e, vr, e * 4);
        continue;
      }
      for (int64_t c = 0; c < e; ++c) {
        StoreFromFloat(layer.k, layer.dtype, s * e + c, kr[c]);
        if (has_v) StoreFromFloat(layer.v, layer.dtype, s * e + c, vr[c]);
      }
    }
  }

  void PagedAttention(const Tensor& q, const KvLayerView& layer, const AttentionSeq* seqs,
                      int32_t num_seqs, const AttentionParams& p, Tensor out) override {
    const int hd = p.head_dim;
    STRATA_CHECK(q.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0);
    STRATA_CHECK(layer.num_kv_heads == p.num_kv_heads && layer.head_dim == hd);
    STRATA_CHECK(hd > 0 && hd <= cpu::kMaxHeadDim) << "head_dim " << hd;
    STRATA_CHECK(q.cols == static_cast<int64_t>(p.num_heads) * hd && out.cols == q.cols);
    STRATA_CHECK(IsFloatDType(layer.dtype) && layer.page_size > 0);
    const int group = p.num_heads / p.num_kv_heads;
    const int chunks = static_cast<int>(CeilDiv(group, cpu::kMaxAttentionGroup));
    const int chunk_heads = static_cast<int>(CeilDiv(group, chunks));
    const int64_t units = static_cast<int64_t>(p.num_kv_heads) * chunks;  // tasks per token
    // Prefill tokens go in blocks of `block_rows` (one task per block and
    // unit, kernels_->attention_block) where the kernel set has it. A decode
    // token (q_len 1) takes the block kernel too when its task has at least
    // kDecodeBlockHeads heads, which share each transposed K block (Qwen2.5-
    // 0.5B, 7 heads: +5% decode tok/s at a 512-token context, +15% at 2,048;
    // Llama-3.2-1B, 4 heads: +1-5%; docs/perf.md 2026-12-07), else
    // attention_row.
    constexpr int kDecodeBlockHeads = 4;
    const int64_t block_rows =
        std::min<int64_t>(cpu::kMaxAttentionBlockRows,
                          cpu::kAttentionBlockFloats / (static_cast<int64_t>(chunk_heads) * hd));
    const bool blocks =
        kernels_->attention_block != nullptr && hd % 16 == 0 && block_rows > 1;
    auto use_block = [&](const AttentionSeq& sq) {
      return blocks && (sq.q_len > 1 || chunk_heads >= kDecodeBlockHeads);
    };
    auto rows_per_task = [&](const AttentionSeq& sq) -> int64_t {
      return use_block(sq) ? block_rows : 1;
    };
    task_start_.assign(num_seqs + 1, 0);
    for (int32_t s = 0; s < num_seqs; ++s) {
      const AttentionSeq& sq = seqs[s];
      STRATA_CHECK(sq.q_len >= 0 && sq.q_len <= sq.kv_len)
          << "seq " << s << " q_len " << sq.q_len << " kv_len " << sq.kv_len;
      STRATA_CHECK(sq.q_start >= 0 && sq.q_start + sq.q_len <= q.rows && q.rows == out.rows);
      task_start_[s + 1] = task_start_[s] + CeilDiv(sq.q_len, rows_per_task(sq)) * units;
    }
    pool_.ParallelFor(task_start_[num_seqs], [&](int64_t t, int) {
      const int64_t s =
          std::upper_bound(task_start_.begin() + 1, task_start_.end(), t) - task_start_.begin() - 1;
      const AttentionSeq& sq = seqs[s];
      const int64_t local = t - task_start_[s];
      const int64_t rows = rows_per_task(sq);
      const int64_t i = local / units * rows;
      const int kv_head = static_cast<int>((local % units) / chunks);
      const int chunk = static_cast<int>(local % chunks);
      const int32_t pos = sq.kv_len - sq.q_len + static_cast<int32_t>(i);
      if (use_block(sq)) {
        cpu::AttentionBlockArgs a;
        a.q = q.row<float>(sq.q_start + i);
        a.q_stride = q.row_stride();
        a.out = out.row<float>(sq.q_start + i);
        a.out_stride = out.row_stride();
        a.layer = &layer;
        a.page_table = sq.page_table;
        a.pos0 = pos;
        a.num_rows = static_cast<int32_t>(std::min<int64_t>(rows, sq.q_len - i));
        a.window = p.sliding_window > 0 ? p.sliding_window : 0;
        a.kv_head = kv_head;
        a.first_head = kv_head * group + chunk * chunk_heads;
        a.num_heads = std::min(chunk_heads, group - chunk * chunk_heads);
        a.head_dim = hd;
        a.scale = p.scale;
        kernels_->attention_block(a);
        return;
      }
      cpu::AttentionRowArgs a;
      a.q = q.row<float>(sq.q_start + i);
      a.out = out.row<float>(sq.q_start + i);
      a.layer = &layer;
      a.page_table = sq.page_table;
      a.first_pos = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
      a.last_pos = pos;
      a.kv_head = kv_head;
      a.first_head = kv_head * group + chunk * chunk_heads;
      a.num_heads = std::min(chunk_heads, group - chunk * chunk_heads);
      a.head_dim = hd;
      a.scale = p.scale;
      kernels_->attention_row(a);
    });
  }

  void ScaleAddRows(const Tensor& x, const int32_t* rows, const float* scales,
                    Tensor out) override {
    STRATA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32 && x.cols == out.cols);
    for (int64_t i = 0; i < x.rows; ++i) {
      STRATA_CHECK(rows[i] >= 0 && rows[i] < out.rows) << "row " << rows[i] << " of " << out.rows;
    }
    // The rows are distinct, so threads may take different ones.
    ForRows(x.rows, x.cols, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const float* src = x.row<float>(i);
        float* dst = out.row<float>(rows[i]);
        const float w = scales[i];
        for (int64_t c = 0; c < x.cols; ++c) dst[c] += w * src[c];
      }
    });
  }

  void GatherRows(const Tensor& x, const int32_t* rows, Tensor out) override {
    STRATA_CHECK(x.dtype == out.dtype && x.cols == out.cols);
    const size_t bytes = x.cols * DTypeSize(x.dtype);
    for (int64_t i = 0; i < out.rows; ++i) {
      STRATA_CHECK(rows[i] >= 0 && rows[i] < x.rows) << "row " << rows[i] << " of " << x.rows;
      std::memcpy(out.row<char>(i),
                  static_cast<const char*>(x.data) + rows[i] * x.row_stride() * DTypeSize(x.dtype),
                  bytes);
    }
  }

  // The logits are host memory: every row goes to the host Sampler in
  // place, so CPU sampling is exactly engine/sampler.h's.
  void SampleRows(const Tensor& logits, std::span<const SampleRowParams> rows, HostRowSampler& host,
                  std::span<SampleResult> out) override {
    STRATA_CHECK(out.size() == rows.size() && logits.dtype == DType::kF32);
    for (size_t i = 0; i < rows.size(); ++i) {
      STRATA_CHECK(rows[i].logit_row >= 0 && rows[i].logit_row < logits.rows)
          << "logit row " << rows[i].logit_row << " of " << logits.rows;
      out[i] = host.SampleOnHost(i, logits.row<float>(rows[i].logit_row));
    }
  }

 private:
  static void CheckSameShape(const Tensor& a, const Tensor& b, const Tensor& out) {
    STRATA_CHECK(a.dtype == DType::kF32 && b.dtype == DType::kF32 && out.dtype == DType::kF32);
    STRATA_CHECK(a.rows == out.rows && b.rows == out.rows && a.cols == out.cols &&
                 b.cols == out.cols)
        << a.rows << "x" << a.cols << ", " << b.rows << "x" << b.cols << " -> " << out.rows << "x"
        << out.cols;
  }

  // Runs fn(r0, r1) over row ranges, in parallel when the op is big enough
  // to pay for the dispatch.
  template <typename F>
  void ForRows(int64_t rows, int64_t cols, F&& fn) {
    constexpr int64_t kMinParallelElems = 1 << 15;
    const int64_t threads = pool_.num_threads();
    if (threads == 1 || rows < 2 || rows * cols < kMinParallelElems) {
      fn(0, rows);
      return;
    }
    const int64_t chunk = CeilDiv(rows, std::min(rows, threads * 4));
    pool_.ParallelFor(CeilDiv(rows, chunk),
                      [&](int64_t t, int) { fn(t * chunk, std::min(rows, (t + 1) * chunk)); });
  }

  cpu::ThreadPool pool_;
  // CopyBlocks: its own threads and state, guarded by copy_mu_, so copies
  // run beside the engine thread's ops without touching pool_.
  std::mutex copy_mu_;
  cpu::ThreadPool copy_pool_;
  std::vector<size_t> copy_offsets_;  // start of each block in the concatenation
  cpu::CpuIsa isa_;
  const CpuKernels* kernels_;
  // GEMV software-prefetch distance for this CPU (kernels.h GemvPrefetchBytes).
  const int64_t gemv_prefetch_ = cpu::GemvPrefetchBytes(cpu::DetectCpuFeatures().intel);
  // GEMV weight streams per step for this CPU (kernels.h GemvStreams).
  const int gemv_streams_ = cpu::GemvStreams(cpu::DetectCpuFeatures().intel);
  bool bf16_matmul_;
  bool amx_;
  std::vector<std::unique_ptr<char, decltype(&std::free)>> scratch_;  // per thread, gemm
  std::vector<float> bias_f32_, weight_f32_;
  std::vector<uint16_t> xb_;
  std::vector<int64_t> task_start_;
};

}  // namespace

int DefaultCpuCopyThreads() {
  const long cpus = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  return static_cast<int>(std::clamp<long>(cpus / 2, 1, 4));
}

StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  const cpu::CpuFeatures& features = cpu::DetectCpuFeatures();
  ASSIGN_OR_RETURN(cpu::CpuIsa isa, cpu::ResolveCpuIsa(options.isa, features));
  const CpuKernels* kernels = isa == cpu::CpuIsa::kAvx512 ? cpu::Avx512Kernels()
                              : isa == cpu::CpuIsa::kAvx2 ? cpu::Avx2Kernels()
                                                          : cpu::ScalarKernels();
  bool bf16 = false;
  if (options.matmul_precision == "bf16") {
    if (!kernels->gemm_bf16 || !features.avx512_bf16) {
      return InvalidArgument(
          std::string("CPU backend: matmul_precision \"bf16\" needs AVX512_BF16 and isa avx512; ") +
          "this backend uses isa " + cpu::CpuIsaName(isa) + " on a CPU with " +
          features.ToString() + "; use matmul_precision \"fp32\"");
    }
    bf16 = true;
  } else if (options.matmul_precision != "fp32") {
    return InvalidArgument("CPU backend: unknown matmul_precision \"" + options.matmul_precision +
                           "\"; expected fp32 or bf16");
  }
  // AMX computes the same bf16 products as vdpbf16ps, much faster; use it
  // whenever the CPU has it and Linux lets this process use tile state.
  const bool amx =
      bf16 && kernels->gemm_bf16_amx && features.amx_bf16 && cpu::RequestAmxPermission();
  int threads = options.num_threads;
  if (threads < 0) {
    return InvalidArgument("CPU backend: num_threads " + std::to_string(threads) +
                           " is negative; use 0 for all CPUs");
  }
  const long cpus = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  if (threads == 0) threads = static_cast<int>(cpus);
  int copy_threads = options.copy_threads;
  if (copy_threads < 0) {
    return InvalidArgument("CPU backend: copy_threads " + std::to_string(copy_threads) +
                           " is negative; use 0 for the default (min(4, CPUs / 2))");
  }
  if (copy_threads == 0) copy_threads = DefaultCpuCopyThreads();
  return std::unique_ptr<Backend>(new CpuBackend(threads, copy_threads, isa, kernels, bf16, amx));
}

}  // namespace strata

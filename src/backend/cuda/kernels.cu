// The CUDA backend's kernels: straightforward and exact first (each computes
// what the CPU backend computes, in the same F32 arithmetic where the CPU's
// order is cheap to follow), fast later. Dtypes of weights and activations
// are dispatched at run time inside the elementwise kernels; only the KV
// store is templated on the KV dtype (3 instantiations) and attention on its
// head-dim class (4; the KV dtype is switched once per tile load), to keep
// this file quick to compile. PagedAttention lives in attention.cuh,
// included below.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/cuda/kernels.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : b > (1 << 20) ? (1 << 20) : b);
}

// The grid of a ROW_STRIDE kernel: a block per kThreads columns of a row
// (at most 64), a row per blockIdx.y (at most 65,535, CUDA's bound).
dim3 RowGrid(int64_t rows, int64_t cols) {
  const int64_t x = std::clamp<int64_t>((cols + kThreads - 1) / kThreads, 1, 64);
  const int64_t y = std::clamp<int64_t>(rows, 1, 65535);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

__device__ inline float Load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ inline void Store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      return;
    case DType::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      return;
    default:
      static_cast<float*>(p)[i] = v;
      return;
  }
}

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float ToFloat(__half v) { return __half2float(v); }
template <typename T>
__device__ inline T FromFloat(float v);
template <>
__device__ inline float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ inline __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

__device__ inline float* RowF(const View& v, int64_t r) {
  return static_cast<float*>(v.data) + r * v.stride;
}

// Four consecutive elements of row r from column c (c % 4 == 0) with one
// 16-byte (F32) or 8-byte (16-bit) access: the Vec4 paths below, taken
// when every view qualifies (Vec4Ok). With one 4-byte load a thread, the
// elementwise kernels kept too few bytes in flight to pass ~1.8 TB/s.
__device__ inline void Load4(const View& v, int64_t r, int64_t c, float (&out)[4]) {
  const float4 t = *reinterpret_cast<const float4*>(RowF(v, r) + c);
  out[0] = t.x, out[1] = t.y, out[2] = t.z, out[3] = t.w;
}
__device__ inline void Store4(const View& v, int64_t r, int64_t c, const float (&x)[4]) {
  const int64_t i = r * v.stride + c;
  switch (v.dtype) {
    case DType::kBF16: {
      const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]), b = __floats2bfloat162_rn(x[2], x[3]);
      uint2 u;
      u.x = *reinterpret_cast<const uint32_t*>(&a);
      u.y = *reinterpret_cast<const uint32_t*>(&b);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(v.data) + i) = u;
      return;
    }
    case DType::kF16: {
      const __half2 a = __floats2half2_rn(x[0], x[1]), b = __floats2half2_rn(x[2], x[3]);
      uint2 u;
      u.x = *reinterpret_cast<const uint32_t*>(&a);
      u.y = *reinterpret_cast<const uint32_t*>(&b);
      *reinterpret_cast<uint2*>(static_cast<__half*>(v.data) + i) = u;
      return;
    }
    default:
      *reinterpret_cast<float4*>(static_cast<float*>(v.data) + i) = make_float4(x[0], x[1], x[2], x[3]);
      return;
  }
}

__device__ inline void SetError(int32_t* err, int32_t code) { atomicCAS(err, 0, code); }

// ---- Programmatic dependent launch (PDL) ----
// Every compute kernel of this file is launched by Launch, with
// programmatic stream serialization: it may be scheduled while the kernel
// before it in the stream still runs, once every block of that one has
// started (each block's first act is LaunchDependents). So every block
// first calls GridDependency (or, the GEMV, WaitForPrior after its first
// weight loads: weights are never written by an op), which returns when
// the kernel before has finished and its writes are visible -- which, as
// that kernel waited in the same way, covers all earlier work. In a decode
// step (a CUDA graph, or eager) a kernel's launch and the GEMV's first
// weight loads then overlap the tail of the kernel before (the norm, the
// rope, the attention), where the stream otherwise idled between them. A
// kernel after a copy, an event or a cuBLASLt GEMM starts as a plain launch
// would: the attribute only relaxes kernel-after-kernel order.
__device__ __forceinline__ void WaitForPrior() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void LaunchDependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void GridDependency() {
  LaunchDependents();
  WaitForPrior();
}

template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // An error stays the thread's last error: the backend's Launched() reports it.
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// Elementwise kernels over a [rows x cols] view: blockIdx.y walks rows and
// the threads of blockIdx.x a row's columns (both grid-strided), so an
// element's row and column cost no 64-bit division (with one flat index,
// i / cols and i % cols held Convert to ~1.4 TB/s and SiluMul to ~1.8 on
// the H200: a 2k prefill's 7 conversions a layer took 11.2 ms).
#define ROW_STRIDE(r, c, rows, cols)                                               \
  for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)                         \
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < (cols); \
         c += int64_t{gridDim.x} * blockDim.x)

// kVec4: src F32, columns in 4s (Vec4Ok).
template <bool kVec4>
__global__ void ConvertKernel(View src, View dst) {
  GridDependency();
  if (kVec4) {
    ROW_STRIDE(r, c4, src.rows, src.cols / 4) {
      float v[4];
      Load4(src, r, 4 * c4, v);
      Store4(dst, r, 4 * c4, v);
    }
    return;
  }
  ROW_STRIDE(r, c, src.rows, src.cols) {
    Store(dst.data, dst.dtype, r * dst.stride + c, Load(src.data, src.dtype, r * src.stride + c));
  }
}

__global__ void EmbeddingKernel(View table, const int32_t* ids, View out, int32_t* err) {
  GridDependency();
  const int64_t n = out.rows * out.cols;
  GRID_STRIDE(i, n) {
    const int64_t r = i / out.cols, c = i % out.cols;
    const int32_t id = ids[r];
    if (id < 0 || id >= table.rows) {
      SetError(err, kErrTokenId);
      continue;
    }
    RowF(out, r)[c] = Load(table.data, table.dtype, id * table.stride + c);
  }
}

// One block per row (blockDim.x a multiple of 32, at most kMaxNormThreads).
// Sum of squares in double like the CPU backend, so the scale factor is the
// same float.
constexpr int kMaxNormThreads = 1024;
// kAdd: x += delta first (AddRmsNorm), each thread writing and then reading
// back only its own elements; the norm is then RmsNorm's to the bit (same
// code, same thread count), and the sum x + delta is Add's float add.
// kVec4: thread i takes columns 4i .. 4i + 3, 4 (i + blockDim.x) .., by
// 16-byte accesses (d % 4 == 0 and every view qualifies: Vec4Ok).
template <bool kAdd, bool kVec4>
__global__ void __launch_bounds__(kMaxNormThreads)
    RmsNormKernel(View x, View delta, View w, float eps, View out, View rounded) {
  GridDependency();
  constexpr int V = kVec4 ? 4 : 1;
  const int64_t r = blockIdx.x;
  const int64_t d = x.cols, n = d / V;
  float* xr = RowF(x, r);
  const float* dr = kAdd ? RowF(delta, r) : nullptr;
  double ss = 0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v[4];
    if (kVec4) {
      Load4(x, r, 4 * i, v);
    } else {
      v[0] = xr[i];
    }
    if (kAdd) {
      float dv[4];
      if (kVec4) {
        Load4(delta, r, 4 * i, dv);
      } else {
        dv[0] = dr[i];
      }
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = v[j] + dv[j];
      if (kVec4) {
        Store4(x, r, 4 * i, v);
      } else {
        xr[i] = v[0];
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) ss += static_cast<double>(v[j]) * v[j];
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ double part[kMaxNormThreads / 32];
  __shared__ float inv_s;
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int i = 0; i < static_cast<int>(blockDim.x) / 32; ++i) t += part[i];
    inv_s = 1.f / sqrtf(static_cast<float>(t / d) + eps);
  }
  __syncthreads();
  const float inv = inv_s;
  float* o = RowF(out, r);
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (kVec4) {
      float v[4];
      Load4(x, r, 4 * i, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = __fmul_rn(Load(w.data, w.dtype, 4 * i + j), __fmul_rn(v[j], inv));
      Store4(out, r, 4 * i, v);
      if (rounded.data != nullptr) Store4(rounded, r, 4 * i, v);
    } else {
      const float v = __fmul_rn(Load(w.data, w.dtype, i), __fmul_rn(xr[i], inv));
      o[i] = v;
      if (rounded.data != nullptr) Store(rounded.data, rounded.dtype, r * rounded.stride + i, v);
    }
  }
}

__global__ void AddBiasKernel(View out, View bias) {
  GridDependency();
  ROW_STRIDE(r, c, out.rows, out.cols) { RowF(out, r)[c] += Load(bias.data, bias.dtype, c); }
}

template <bool kVec4>
__global__ void SiluMulKernel(View gate, View up, View out, View rounded) {
  GridDependency();
  if (kVec4) {
    ROW_STRIDE(r, c4, out.rows, out.cols / 4) {
      float g[4], u[4], v[4];
      Load4(gate, r, 4 * c4, g);
      Load4(up, r, 4 * c4, u);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = g[j] / (1.f + expf(-g[j])) * u[j];
      Store4(out, r, 4 * c4, v);
      if (rounded.data != nullptr) Store4(rounded, r, 4 * c4, v);
    }
    return;
  }
  ROW_STRIDE(r, c, out.rows, out.cols) {
    const float g = RowF(gate, r)[c], u = RowF(up, r)[c];
    const float v = g / (1.f + expf(-g)) * u;
    RowF(out, r)[c] = v;
    if (rounded.data != nullptr) Store(rounded.data, rounded.dtype, r * rounded.stride + c, v);
  }
}

template <bool kVec4>
__global__ void AddKernel(View a, View b, View out) {
  GridDependency();
  if (kVec4) {
    ROW_STRIDE(r, c4, out.rows, out.cols / 4) {
      float x[4], y[4];
      Load4(a, r, 4 * c4, x);
      Load4(b, r, 4 * c4, y);
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = x[j] + y[j];
      Store4(out, r, 4 * c4, x);
    }
    return;
  }
  ROW_STRIDE(r, c, out.rows, out.cols) { RowF(out, r)[c] = RowF(a, r)[c] + RowF(b, r)[c]; }
}

// One thread per (row, rotary pair, group of kHeads heads): the pair's
// cos/sin (in double, rounded to float, like the CPU backend; no fused
// multiply-add) once for all the group's heads, whose loads are all issued
// before the first store. A thread per (row, head, pair) computed the same
// double cos/sin 40 times a row on Llama-3.1-8B (32 q + 8 k heads): 2.6 ms
// of a 2k prefill's forward on the H200, 0.9 ms with groups of 8. A decode
// step's few rows take kHeads = 1 (groups of 8 left it 320 threads: 6.5
// instead of 5.6 us a call).
template <int kHeads>
__global__ void RopeKernel(View q, View k, const int32_t* positions, RopeTable rope) {
  GridDependency();
  constexpr int kRopeHeads = kHeads;
  const int half = rope.rotary_dim / 2, hd = rope.head_dim;
  const int64_t qh = q.cols / hd, kh = k.cols / hd, heads = qh + kh;
  const int64_t groups = (heads + kRopeHeads - 1) / kRopeHeads;
  const int64_t n = q.rows * groups * half;
  GRID_STRIDE(idx, n) {
    const int i = static_cast<int>(idx % half);
    const int64_t t = idx / half;
    const int64_t g = t % groups, r = t / groups;
    const float f = __fmul_rn(static_cast<float>(positions[r]), rope.inv_freq[i]);
    const float cs =
        __fmul_rn(static_cast<float>(cos(static_cast<double>(f))), rope.attention_scaling);
    const float sn =
        __fmul_rn(static_cast<float>(sin(static_cast<double>(f))), rope.attention_scaling);
    float* v[kRopeHeads];
    float x1[kRopeHeads], x2[kRopeHeads];
#pragma unroll
    for (int j = 0; j < kRopeHeads; ++j) {
      const int64_t h = g * kRopeHeads + j;
      v[j] = h >= heads ? nullptr
                        : (h < qh ? RowF(q, r) + h * hd : RowF(k, r) + (h - qh) * hd) +
                              rope.rotary_offset;
      x1[j] = v[j] != nullptr ? v[j][i] : 0.f;
      x2[j] = v[j] != nullptr ? v[j][half + i] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kRopeHeads; ++j) {
      if (v[j] == nullptr) continue;
      v[j][i] = __fsub_rn(__fmul_rn(x1[j], cs), __fmul_rn(x2[j], sn));
      v[j][half + i] = __fadd_rn(__fmul_rn(x2[j], cs), __fmul_rn(x1[j], sn));
    }
  }
}

// Interleaved rope: one thread per (row, head) rotates the whole head
// through registers, since output dim i depends on input dims 2i and 2i + 1.
__global__ void RopeInterleavedKernel(View q, View k, const int32_t* positions, RopeTable rope) {
  GridDependency();
  const int half = rope.rotary_dim / 2, hd = rope.head_dim;
  const int64_t qh = q.cols / hd, kh = k.cols / hd;
  const int64_t n = q.rows * (qh + kh);
  GRID_STRIDE(t, n) {
    const int64_t h = t % (qh + kh), r = t / (qh + kh);
    float* v = (h < qh ? RowF(q, r) + h * hd : RowF(k, r) + (h - qh) * hd) + rope.rotary_offset;
    float x[2 * kMaxRotaryHalf];
    for (int i = 0; i < 2 * half; ++i) x[i] = v[i];
    for (int i = 0; i < half; ++i) {
      const float f = __fmul_rn(static_cast<float>(positions[r]), rope.inv_freq[i]);
      const float cs =
          __fmul_rn(static_cast<float>(cos(static_cast<double>(f))), rope.attention_scaling);
      const float sn =
          __fmul_rn(static_cast<float>(sin(static_cast<double>(f))), rope.attention_scaling);
      const float x1 = x[2 * i], x2 = x[2 * i + 1];
      v[i] = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
      v[half + i] = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
    }
  }
}

__global__ void ScaleAddRowsKernel(View x, const int32_t* rows, const float* scales, View out,
                                   int32_t* err) {
  GridDependency();
  const int64_t n = x.rows * x.cols;
  GRID_STRIDE(i, n) {
    const int64_t r = i / x.cols, c = i % x.cols;
    const int32_t dst = rows[r];
    if (dst < 0 || dst >= out.rows) {
      SetError(err, kErrScaleAddRow);
      continue;
    }
    float* o = RowF(out, dst) + c;
    *o = __fadd_rn(*o, __fmul_rn(scales[r], RowF(x, r)[c]));
  }
}

template <typename T>
__global__ void StoreKvKernel(View k, View v, KvLayer layer, const int64_t* slots, int32_t* err) {
  GridDependency();
  const int64_t e = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
  const int64_t num_slots = layer.num_pages * layer.page_size;
  const int64_t n = k.rows * e;
  GRID_STRIDE(i, n) {
    const int64_t r = i / e, c = i % e;
    const int64_t s = slots[r];
    if (s < 0 || s >= num_slots) {
      SetError(err, kErrKvSlot);
      continue;
    }
    static_cast<T*>(layer.k)[s * e + c] = FromFloat<T>(RowF(k, r)[c]);
    if (layer.v != nullptr) static_cast<T*>(layer.v)[s * e + c] = FromFloat<T>(RowF(v, r)[c]);
  }
}

// Rope (rotate-half) and StoreKv of a few rows in one launch. Threads
// [0, rows * heads * half) are RopeKernel<1>'s (row, head, pair), and a
// thread of a k head also stores its two rotated values into the slot, as
// StoreKvKernel would from the rotated k; threads after them take (row,
// column) of the KV width and store v, and k where the column is outside
// the rotary dims (rope leaves it as it is). Same float operations as the
// two kernels, so the same bits.
template <typename T>
__global__ void RopeStoreKvKernel(View q, View k, View v, const int32_t* positions, RopeTable rope,
                                  KvLayer layer, const int64_t* slots, int32_t* err) {
  GridDependency();
  const int half = rope.rotary_dim / 2, hd = rope.head_dim;
  const int64_t qh = q.cols / hd, kh = k.cols / hd, heads = qh + kh;
  const int64_t e = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
  const int64_t num_slots = layer.num_pages * layer.page_size;
  const int64_t n_rope = q.rows * heads * half;
  const int64_t n = n_rope + q.rows * e;
  GRID_STRIDE(idx, n) {
    if (idx < n_rope) {
      const int i = static_cast<int>(idx % half);
      const int64_t t = idx / half;
      const int64_t h = t % heads, r = t / heads;
      const float f = __fmul_rn(static_cast<float>(positions[r]), rope.inv_freq[i]);
      const float cs =
          __fmul_rn(static_cast<float>(cos(static_cast<double>(f))), rope.attention_scaling);
      const float sn =
          __fmul_rn(static_cast<float>(sin(static_cast<double>(f))), rope.attention_scaling);
      float* x = (h < qh ? RowF(q, r) + h * hd : RowF(k, r) + (h - qh) * hd) + rope.rotary_offset;
      const float x1 = x[i], x2 = x[half + i];
      const float y1 = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
      const float y2 = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
      x[i] = y1;
      x[half + i] = y2;
      if (h >= qh) {
        const int64_t s = slots[r];
        if (s < 0 || s >= num_slots) {
          SetError(err, kErrKvSlot);
          continue;
        }
        T* dst = static_cast<T*>(layer.k) + s * e + (h - qh) * hd + rope.rotary_offset;
        dst[i] = FromFloat<T>(y1);
        dst[half + i] = FromFloat<T>(y2);
      }
      continue;
    }
    const int64_t j = idx - n_rope;
    const int64_t r = j / e, c = j % e;
    const int64_t s = slots[r];
    if (s < 0 || s >= num_slots) {
      SetError(err, kErrKvSlot);
      continue;
    }
    const int d = static_cast<int>(c % hd);
    if (d < rope.rotary_offset || d >= rope.rotary_offset + rope.rotary_dim)
      static_cast<T*>(layer.k)[s * e + c] = FromFloat<T>(RowF(k, r)[c]);
    if (layer.v != nullptr) static_cast<T*>(layer.v)[s * e + c] = FromFloat<T>(RowF(v, r)[c]);
  }
}

__global__ void GatherRowsKernel(View x, const int32_t* rows, View out, int64_t esz, int32_t* err) {
  GridDependency();
  const int64_t row_bytes = x.cols * esz;
  const int64_t n = out.rows * row_bytes;
  GRID_STRIDE(i, n) {
    const int64_t r = i / row_bytes, b = i % row_bytes;
    const int32_t src = rows[r];
    if (src < 0 || src >= x.rows) {
      SetError(err, kErrGatherRow);
      continue;
    }
    static_cast<char*>(out.data)[r * out.stride * esz + b] =
        static_cast<const char*>(x.data)[src * x.stride * esz + b];
  }
}

// --- Small-batch GEMV (Gemv in kernels.h) ---
//
// Block b owns G consecutive weight rows j0 = b*G ... j0+G-1; its
// kGemvWarps warps split k: lane l of warp w takes the V-element chunks
// starting at (w*32 + l)*V, then every kGemvWarps*32*V further (V = 16
// bytes of weights: 8 BF16/F16 or 4 F32). Per chunk a thread loads V
// weights of each of its G rows (one 16-byte load each, streamed past L1)
// and the matching V floats of each x row (16-byte loads through L1/L2,
// where x stays: it is re-read by every block), so one x load serves G
// weight rows. Partial sums acc[g][r] are reduced across the warp by
// shuffles and across the block's warps through shared memory, in a fixed
// order. Rows past m are clamped to row m-1 for loading (valid memory,
// never written) so the inner loop has no row branch.
constexpr int kGemvWarps = 8;

__device__ inline uint4 LoadStreaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ inline void Unpack(uint4 v, float* f, float) {
  f[0] = __uint_as_float(v.x);
  f[1] = __uint_as_float(v.y);
  f[2] = __uint_as_float(v.z);
  f[3] = __uint_as_float(v.w);
}
__device__ inline void Unpack(uint4 v, float* f, __nv_bfloat16) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);  // the lower address is the low half
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ inline void Unpack(uint4 v, float* f, __half) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    memcpy(&h, &u[i], sizeof(h));
    const float2 t = __half22float2(h);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// x rounded to the weight's type and back, as Convert then the GEMM see it.
template <typename W>
__device__ inline float RoundTo(float v) {
  return ToFloat(FromFloat<W>(v));
}

// acc[g][r] += wf[g][.] . round(x[r][c, c + V)) for the x rows r < n.
// VEC: x rows are 16-byte aligned and c + V <= k; else loads are checked
// against k element by element.
template <typename W, int R, int G, bool VEC>
__device__ inline void DotChunk(const View& x, int n, int64_t c, int64_t k,
                                const float (&wf)[G][16 / sizeof(W)], float (&acc)[G][R]) {
  constexpr int V = 16 / sizeof(W);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (R > 1 && r >= n) break;  // n is the same for the whole grid
    const float* xr = static_cast<const float*>(x.data) + r * x.stride + c;
    float xf[V];
    if (VEC) {
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(xr) + q);
        xf[4 * q] = t.x;
        xf[4 * q + 1] = t.y;
        xf[4 * q + 2] = t.z;
        xf[4 * q + 3] = t.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) xf[i] = c + i < k ? xr[i] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float xv = RoundTo<W>(xf[i]);
#pragma unroll
      for (int g = 0; g < G; ++g) acc[g][r] = fmaf(wf[g][i], xv, acc[g][r]);
    }
  }
}

// One launch may cover several weights of the same k against the same x
// (GemvGroup: q/k/v, gate/up): part i owns blocks [first_block_i,
// first_block_{i+1}); a block does exactly what a launch of its part alone
// would do with block index blockIdx.x - first_block, so a part's results
// are those of Gemv on it, to the bit.
struct GemvLaunchPart {
  View w, bias, out;
  int64_t first_block;
  bool vec;  // the 16-byte path (w rows and x aligned, k a whole number of vectors)
};
struct GemvLaunch {
  GemvLaunchPart part[kGemvMaxParts];
  int n;
  // GemvSiluMul: parts 0 (gate) and 1 (up) of equal m; block b owns rows
  // b*G/2 ... of both (G/2 of each, the same chunks of k per thread as a
  // plain launch, so each sum is Gemv's) and writes silu(gate) * up to
  // silu_out instead of either part's out.
  bool silu_mul;
  View silu_out;
};

template <typename W, int R, int G>
__global__ void __launch_bounds__(kGemvWarps * 32) GemvKernel(View x, GemvLaunch parts) {
  // This block's part (block-uniform; unrolled so the parameters are read
  // with constant indices, not copied to local memory).
  LaunchDependents();  // the next kernel may launch once every block has started
  const bool silu = parts.silu_mul;
  constexpr int H = G / 2;  // rows of each matrix per block under silu
  int pi = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxParts; ++i)
    if (!silu && i < parts.n && blockIdx.x >= parts.part[i].first_block) pi = i;
  View w, bias, out;
  int64_t first = 0;
  bool vec = false;
#pragma unroll
  for (int i = 0; i < kGemvMaxParts; ++i)
    if (i == pi) {
      w = parts.part[i].w;
      bias = parts.part[i].bias;
      out = parts.part[i].out;
      first = parts.part[i].first_block;
      vec = parts.part[i].vec;
    }
  constexpr int V = 16 / sizeof(W);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = static_cast<int>(x.rows);  // 1 <= n <= R
  const int64_t k = x.cols, m = w.rows;
  const int64_t j0 = silu ? int64_t{blockIdx.x} * H : (int64_t{blockIdx.x} - first) * G;
  const W* wr[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (silu) {
      const View& pw = g < H ? parts.part[0].w : parts.part[1].w;
      wr[g] = static_cast<const W*>(pw.data) + min(j0 + g % H, m - 1) * pw.stride;
    } else {
      wr[g] = static_cast<const W*>(w.data) + min(j0 + g, m - 1) * w.stride;
    }
  }
  float acc[G][R];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[g][r] = 0.f;

  const int64_t step = int64_t{kGemvWarps} * 32 * V;
  const int64_t c0 = (int64_t{warp} * 32 + lane) * V;
  if (vec) {
    // U chunks per trip, all U * G = 8 weight loads issued before any is
    // used (16-byte loads of w rows: 16-byte aligned, and k % V == 0).
    constexpr int U = 8 / G;
    int64_t c = c0;
    bool waited = false;
    for (; c + (U - 1) * step < k; c += U * step) {
      uint4 raw[U][G];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int g = 0; g < G; ++g) raw[u][g] = LoadStreaming(wr[g] + c + u * step);
      // The first trip's weight loads are in flight while the kernel before
      // finishes (PDL); x and out are touched only after it has.
      if (!waited) {
        WaitForPrior();
        waited = true;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float wf[G][V];
#pragma unroll
        for (int g = 0; g < G; ++g) Unpack(raw[u][g], wf[g], W{});
        DotChunk<W, R, G, true>(x, n, c + u * step, k, wf, acc);
      }
    }
    if (!waited) WaitForPrior();
    for (; c < k; c += step) {
      float wf[G][V];
#pragma unroll
      for (int g = 0; g < G; ++g) Unpack(LoadStreaming(wr[g] + c), wf[g], W{});
      DotChunk<W, R, G, true>(x, n, c, k, wf, acc);
    }
  } else {
    WaitForPrior();
    for (int64_t c = c0; c < k; c += step) {
      float wf[G][V];
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < V; ++i) wf[g][i] = c + i < k ? ToFloat(wr[g][c + i]) : 0.f;
      DotChunk<W, R, G, false>(x, n, c, k, wf, acc);
    }
  }

  __shared__ float part[kGemvWarps][G][R];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= n) break;
      float v = acc[g][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][g][r] = v;
    }
  __syncthreads();
  const int t = threadIdx.x;
  if (silu) {
    // The sums in Gemv's order and SiluMul's float expression.
    if (t < H * R) {
      const int g = t / R, r = t % R;
      const int64_t j = j0 + g;
      if (r < n && j < m) {
        float sg = 0.f, su = 0.f;
#pragma unroll
        for (int i = 0; i < kGemvWarps; ++i) sg += part[i][g][r];
#pragma unroll
        for (int i = 0; i < kGemvWarps; ++i) su += part[i][g + H][r];
        const View& bg = parts.part[0].bias;
        const View& bu = parts.part[1].bias;
        if (bg.data != nullptr) sg += Load(bg.data, bg.dtype, j);
        if (bu.data != nullptr) su += Load(bu.data, bu.dtype, j);
        RowF(parts.silu_out, r)[j] = sg / (1.f + expf(-sg)) * su;
      }
    }
    return;
  }
  if (t < G * R) {
    const int g = t / R, r = t % R;
    const int64_t j = j0 + g;
    if (r < n && j < m) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kGemvWarps; ++i) s += part[i][g][r];
      if (bias.data != nullptr) s += Load(bias.data, bias.dtype, j);
      RowF(out, r)[j] = s;
    }
  }
}

__global__ void CopyBlocksKernel(const CopyDesc* desc, int64_t n) {
  for (int64_t b = blockIdx.x; b < n; b += gridDim.x) {
    const CopyDesc d = desc[b];
    char* dst = static_cast<char*>(d.dst);
    const char* src = static_cast<const char*>(d.src);
    uint64_t done = 0;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
      const uint64_t vecs = d.bytes / 16;
      uint4* dv = reinterpret_cast<uint4*>(dst);
      const uint4* sv = reinterpret_cast<const uint4*>(src);
      for (uint64_t i = threadIdx.x; i < vecs; i += blockDim.x) dv[i] = sv[i];
      done = vecs * 16;
    }
    for (uint64_t i = done + threadIdx.x; i < d.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

__device__ inline uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void GateKernel(const volatile int32_t* flag, volatile int32_t* timed_out,
                           int64_t timeout_ns) {
  const uint64_t t0 = GlobalTimerNs();
  while (*flag == 0) {
    if (GlobalTimerNs() - t0 > static_cast<uint64_t>(timeout_ns)) {
      *timed_out = 1;
      return;
    }
    __nanosleep(2000);
  }
}

}  // namespace

#define STRATA_SHARED __shared__
#define STRATA_DYNAMIC_SMEM(name) extern __shared__ float name[]
#define STRATA_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  Launch(kernel, grid, block, smem_bytes, stream, __VA_ARGS__)
#define STRATA_GRID_DEPENDENCY() GridDependency()
#define STRATA_ATTENTION_MMA 1
#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_mma.cuh"

void Gate(const volatile int32_t* flag, volatile int32_t* timed_out, int64_t timeout_ns,
          cudaStream_t stream) {
  GateKernel<<<1, 1, 0, stream>>>(flag, timed_out, timeout_ns);
}

void CopyBlocks(const CopyDesc* desc, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  // Enough blocks in flight to keep the bus busy (every SM several times),
  // no more than there are copy blocks.
  const int64_t grid = n < 4096 ? n : 4096;
  CopyBlocksKernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(desc, n);
}

const char* DeviceErrorName(int32_t code) {
  switch (code) {
    case kErrNone:
      return "none";
    case kErrTokenId:
      return "Embedding: a token id is outside the embedding table";
    case kErrKvSlot:
      return "StoreKv: a KV slot is outside the layer's pages";
    case kErrGatherRow:
      return "GatherRows: a row index is outside the input";
    case kErrScaleAddRow:
      return "ScaleAddRows: a row index is outside the output";
  }
  return "unknown device error";
}

namespace {
// Whether a view's rows can be walked 4 columns at a time by Load4/Store4:
// a 16-byte-aligned start (8 is enough for a 16-bit view, but the buffers
// here are 16-aligned or not at all), a row stride and width in 4s. An
// unset view (no data) qualifies: it is not accessed.
bool Vec4Ok(const View& v) {
  if (v.data == nullptr) return true;
  return (reinterpret_cast<uintptr_t>(v.data) & 15) == 0 && v.stride % 4 == 0 && v.cols % 4 == 0;
}
}  // namespace

void Convert(const View& src, const View& dst, cudaStream_t stream) {
  if (src.rows == 0 || src.cols == 0) return;
  if (src.dtype == DType::kF32 && Vec4Ok(src) && Vec4Ok(dst)) {
    Launch(ConvertKernel<true>, RowGrid(src.rows, src.cols / 4), kThreads, 0, stream, src, dst);
  } else {
    Launch(ConvertKernel<false>, RowGrid(src.rows, src.cols), kThreads, 0, stream, src, dst);
  }
}

void Embedding(const View& table, const int32_t* ids, const View& out, int32_t* err,
               cudaStream_t stream) {
  Launch(EmbeddingKernel, Blocks(out.rows * out.cols), kThreads, 0, stream, table, ids, out, err);
}

namespace {
// A row per block: with few rows (decode) only a few SMs work, so each
// block gets a thread per element up to 1024, every load of the row in
// flight at once (256 threads walked a 2048-wide row in 8 serial steps);
// with many rows (prefill) 256, as the blocks fill the GPU anyway.
unsigned NormThreads(const View& x, bool vec4) {
  const int64_t cap = x.rows >= 264 ? kThreads : kMaxNormThreads;
  const int64_t n = vec4 ? x.cols / 4 : x.cols;  // a thread's first pass: one element or four
  return static_cast<unsigned>(std::min<int64_t>(cap, std::max<int64_t>(32, (n + 31) / 32 * 32)));
}

template <bool kAdd>
void LaunchNorm(const View& x, const View& delta, const View& weight, float eps, const View& out,
                cudaStream_t stream, const View& rounded) {
  if (x.rows == 0) return;
  const bool vec4 = Vec4Ok(x) && Vec4Ok(delta) && Vec4Ok(out) && Vec4Ok(rounded);
  const unsigned blocks = static_cast<unsigned>(x.rows), threads = NormThreads(x, vec4);
  if (vec4) {
    Launch(RmsNormKernel<kAdd, true>, blocks, threads, 0, stream, x, delta, weight, eps, out,
           rounded);
  } else {
    Launch(RmsNormKernel<kAdd, false>, blocks, threads, 0, stream, x, delta, weight, eps, out,
           rounded);
  }
}
}  // namespace

void RmsNorm(const View& x, const View& weight, float eps, const View& out, cudaStream_t stream,
             const View& rounded) {
  LaunchNorm<false>(x, View{}, weight, eps, out, stream, rounded);
}

void AddRmsNorm(const View& x, const View& delta, const View& weight, float eps, const View& out,
                cudaStream_t stream, const View& rounded) {
  LaunchNorm<true>(x, delta, weight, eps, out, stream, rounded);
}

namespace {
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// 4 weight rows per block: each x load serves 4 weight loads, and at
// k = 2048 (one chunk per thread per row) a thread still has 4 16-byte
// loads in flight; m = 2048 gives 512 blocks, ~4 per SM, one wave. One x
// row (batch-1 decode) only: with 2-8 rows this kernel measured slower
// than convert + cuBLASLt on most Llama-3.2-1B shapes (linear_bench on the
// H200: gate/up 8192x2048 at 8 rows 41 us against 10.8 us at 9 rows).
constexpr int kGemvRowsPerBlock = 4;

// silu_out set: GemvSiluMul (parts 0 and 1, equal m).
template <typename W>
void LaunchGemv(const View& x, const GemvPart* parts, int n, const View* silu_out,
                cudaStream_t stream) {
  constexpr int64_t V = 16 / sizeof(W);
  const bool x_vec = x.cols % V == 0 && Aligned16(x.data) && x.stride % 4 == 0;
  GemvLaunch launch{};
  int64_t blocks = 0;
  for (int i = 0; i < n; ++i) {
    const View& w = parts[i].w;
    if (w.rows == 0) continue;
    GemvLaunchPart& p = launch.part[launch.n++];
    p = GemvLaunchPart{w, parts[i].bias, parts[i].out, blocks,
                       x_vec && Aligned16(w.data) && (w.stride * int64_t{sizeof(W)}) % 16 == 0};
    blocks += (w.rows + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock;
  }
  if (blocks == 0) return;
  if (silu_out != nullptr) {
    // Both matrices' rows in every block: one path for the block, the
    // 16-byte one only when both qualify.
    const bool vec = launch.part[0].vec && launch.part[1].vec;
    launch.part[0].vec = launch.part[1].vec = vec;
    launch.silu_mul = true;
    launch.silu_out = *silu_out;
    constexpr int64_t kHalf = kGemvRowsPerBlock / 2;
    blocks = (parts[0].w.rows + kHalf - 1) / kHalf;
  }
  static_assert(kGemvMaxRows == 1, "one instantiation: batch-1 decode");
  Launch(GemvKernel<W, 1, kGemvRowsPerBlock>, static_cast<unsigned>(blocks), kGemvWarps * 32, 0,
         stream, x, launch);
}
}  // namespace

namespace {
void DispatchGemv(const View& x, const GemvPart* parts, int n, const View* silu_out,
                  cudaStream_t stream) {
  if (x.rows == 0 || n == 0) return;
  switch (parts[0].w.dtype) {
    case DType::kBF16:
      LaunchGemv<__nv_bfloat16>(x, parts, n, silu_out, stream);
      return;
    case DType::kF16:
      LaunchGemv<__half>(x, parts, n, silu_out, stream);
      return;
    default:
      LaunchGemv<float>(x, parts, n, silu_out, stream);
      return;
  }
}
}  // namespace

void GemvGroup(const View& x, const GemvPart* parts, int n, cudaStream_t stream) {
  DispatchGemv(x, parts, n, nullptr, stream);
}

void GemvSiluMul(const View& x, const GemvPart& gate, const GemvPart& up, const View& out,
                 cudaStream_t stream) {
  if (gate.w.rows == 0) return;
  const GemvPart parts[2] = {gate, up};
  DispatchGemv(x, parts, 2, &out, stream);
}

void Gemv(const View& x, const View& w, const View& bias, const View& out, cudaStream_t stream) {
  const GemvPart part{w, bias, out};
  GemvGroup(x, &part, 1, stream);
}

void AddBias(const View& out, const View& bias, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return;
  Launch(AddBiasKernel, RowGrid(out.rows, out.cols), kThreads, 0, stream, out, bias);
}

void SiluMul(const View& gate, const View& up, const View& out, cudaStream_t stream,
             const View& rounded) {
  if (out.rows == 0 || out.cols == 0) return;
  if (Vec4Ok(gate) && Vec4Ok(up) && Vec4Ok(out) && Vec4Ok(rounded)) {
    Launch(SiluMulKernel<true>, RowGrid(out.rows, out.cols / 4), kThreads, 0, stream, gate, up, out,
           rounded);
  } else {
    Launch(SiluMulKernel<false>, RowGrid(out.rows, out.cols), kThreads, 0, stream, gate, up, out,
           rounded);
  }
}

void Add(const View& a, const View& b, const View& out, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return;
  if (Vec4Ok(a) && Vec4Ok(b) && Vec4Ok(out)) {
    Launch(AddKernel<true>, RowGrid(out.rows, out.cols / 4), kThreads, 0, stream, a, b, out);
  } else {
    Launch(AddKernel<false>, RowGrid(out.rows, out.cols), kThreads, 0, stream, a, b, out);
  }
}

void Rope(const View& q, const View& k, const int32_t* positions, const RopeTable& rope,
          cudaStream_t stream) {
  const int64_t heads = q.cols / rope.head_dim + k.cols / rope.head_dim;
  if (rope.interleaved) {
    Launch(RopeInterleavedKernel, Blocks(q.rows * heads), kThreads, 0, stream, q, k, positions,
           rope);
    return;
  }
  const int64_t pairs = rope.rotary_dim / 2;
  if (q.rows <= 16) {
    Launch(RopeKernel<1>, Blocks(q.rows * heads * pairs), kThreads, 0, stream, q, k, positions,
           rope);
  } else {
    Launch(RopeKernel<8>, Blocks(q.rows * ((heads + 7) / 8) * pairs), kThreads, 0, stream, q, k,
           positions, rope);
  }
}

void StoreKv(const View& k, const View& v, const KvLayer& layer, const int64_t* slots, int32_t* err,
             cudaStream_t stream) {
  const int blocks = Blocks(k.rows * layer.num_kv_heads * layer.head_dim);
  switch (layer.dtype) {
    case DType::kBF16:
      Launch(StoreKvKernel<__nv_bfloat16>, blocks, kThreads, 0, stream, k, v, layer, slots, err);
      return;
    case DType::kF16:
      Launch(StoreKvKernel<__half>, blocks, kThreads, 0, stream, k, v, layer, slots, err);
      return;
    default:
      Launch(StoreKvKernel<float>, blocks, kThreads, 0, stream, k, v, layer, slots, err);
      return;
  }
}

void RopeStoreKv(const View& q, const View& k, const View& v, const int32_t* positions,
                 const RopeTable& rope, const KvLayer& layer, const int64_t* slots, int32_t* err,
                 cudaStream_t stream) {
  const int64_t heads = q.cols / rope.head_dim + k.cols / rope.head_dim;
  const int64_t e = static_cast<int64_t>(layer.num_kv_heads) * layer.head_dim;
  const int blocks = Blocks(q.rows * (heads * (rope.rotary_dim / 2) + e));
  switch (layer.dtype) {
    case DType::kBF16:
      Launch(RopeStoreKvKernel<__nv_bfloat16>, blocks, kThreads, 0, stream, q, k, v, positions,
             rope, layer, slots, err);
      return;
    case DType::kF16:
      Launch(RopeStoreKvKernel<__half>, blocks, kThreads, 0, stream, q, k, v, positions, rope,
             layer, slots, err);
      return;
    default:
      Launch(RopeStoreKvKernel<float>, blocks, kThreads, 0, stream, q, k, v, positions, rope, layer,
             slots, err);
      return;
  }
}

void ScaleAddRows(const View& x, const int32_t* rows, const float* scales, const View& out,
                  int32_t* err, cudaStream_t stream) {
  Launch(ScaleAddRowsKernel, Blocks(x.rows * x.cols), kThreads, 0, stream, x, rows, scales, out,
         err);
}

void GatherRows(const View& x, const int32_t* rows, const View& out, int32_t* err,
                cudaStream_t stream) {
  const int64_t esz = static_cast<int64_t>(DTypeSize(x.dtype));
  Launch(GatherRowsKernel, Blocks(out.rows * x.cols * esz), kThreads, 0, stream, x, rows, out, esz,
         err);
}

}  // namespace strata::cuda

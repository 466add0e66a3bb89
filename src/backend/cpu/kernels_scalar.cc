// Scalar kernel set: portable C++ for any x86-64 CPU, and the reference the
// SIMD sets are tested against. F32 accumulation throughout.
#include <cstdint>

#include "backend/cpu/kernels.h"

namespace strata::cpu {
namespace {

#include "backend/cpu/kernels_types.inc"

// Four partial sums break the dependency chain without changing precision
// class (still F32 accumulation).
template <typename T>
float Dot(const float* q, const T* k, int n) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += q[i] * ToFloat(k[i]);
    s1 += q[i + 1] * ToFloat(k[i + 1]);
    s2 += q[i + 2] * ToFloat(k[i + 2]);
    s3 += q[i + 3] * ToFloat(k[i + 3]);
  }
  for (; i < n; ++i) s0 += q[i] * ToFloat(k[i]);
  return (s0 + s1) + (s2 + s3);
}

template <typename T>
void Axpy(float a, const T* v, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * ToFloat(v[i]);
}

void Scale(float* y, float c, int n) {
  for (int i = 0; i < n; ++i) y[i] *= c;
}

float ExpSubSum(float* s, float m, int n) {
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += (s[i] = __builtin_expf(s[i] - m));
  return sum;
}

#include "backend/cpu/kernels_attention.inc"

void SiluMul(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.f + __builtin_expf(-g[i])) * u[i];
}

template <typename W>
void GemvT(const LinearArgs& a, int64_t m0, int64_t m1) {
  const W* w = static_cast<const W*>(a.w);
  for (int64_t r0 = 0; r0 < a.n; r0 += kMaxGemvRows) {
    const int64_t nr = a.n - r0 < kMaxGemvRows ? a.n - r0 : kMaxGemvRows;
    for (int64_t j = m0; j < m1; ++j) {
      const W* wr = w + j * a.w_stride;
      float acc[kMaxGemvRows][4] = {};
      int64_t i = 0;
      for (; i + 4 <= a.k; i += 4) {
        const float w0 = ToFloat(wr[i]), w1 = ToFloat(wr[i + 1]);
        const float w2 = ToFloat(wr[i + 2]), w3 = ToFloat(wr[i + 3]);
        for (int64_t r = 0; r < nr; ++r) {
          const float* x = a.x + (r0 + r) * a.x_stride + i;
          acc[r][0] += x[0] * w0;
          acc[r][1] += x[1] * w1;
          acc[r][2] += x[2] * w2;
          acc[r][3] += x[3] * w3;
        }
      }
      for (; i < a.k; ++i) {
        const float wv = ToFloat(wr[i]);
        for (int64_t r = 0; r < nr; ++r) acc[r][0] += a.x[(r0 + r) * a.x_stride + i] * wv;
      }
      const float b = a.bias ? a.bias[j] : 0.f;
      for (int64_t r = 0; r < nr; ++r) {
        a.out[(r0 + r) * a.out_stride + j] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) + b;
      }
    }
  }
}

void Gemv(const LinearArgs& a, int64_t m0, int64_t m1) {
  switch (a.w_dtype) {
    case DType::kF32: return GemvT<float>(a, m0, m1);
    case DType::kBF16: return GemvT<Bf16>(a, m0, m1);
    case DType::kF16: return GemvT<Half>(a, m0, m1);
    default: __builtin_trap();
  }
}

void Gemm(const LinearArgs& a, int64_t m0, int64_t m1, void*) { Gemv(a, m0, m1); }

const CpuKernels kScalarKernels = {
    .name = "scalar",
    .gemv = Gemv,
    .gemm = Gemm,
    .gemm_bf16 = nullptr,
    .gemm_bf16_amx = nullptr,
    .gemm_cols_align = 16,
    .attention_row = AttendRow,
    .attention_block = nullptr,
    .silu_mul = SiluMul,
};

}  // namespace

const CpuKernels* ScalarKernels() { return &kScalarKernels; }

}  // namespace strata::cpu

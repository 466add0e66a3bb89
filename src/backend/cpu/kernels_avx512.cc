// AVX-512 kernel set (16 F32 lanes), plus the AVX512_BF16 gemm. Compiled
// with AVX-512 F/BW/VL/DQ + BF16 flags (simd_flags.cmake); used only when
// DetectCpuFeatures().avx512 (gemm_bf16 only with avx512_bf16).
#include <immintrin.h>

// GCC 12's _mm512_reduce_add_ps and friends trip a false -Wmaybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <array>
#include <cstdint>
#include <utility>

#include "backend/cpu/kernels.h"

namespace strata::cpu {
namespace {

#include "backend/cpu/kernels_types.inc"

using Vec = __m512;
constexpr int kLanes = 16;
// 12 rows x 2 vectors = 24 accumulators + 2 panel vectors + broadcasts of 32 zmm.
constexpr int kGemmMr = 12;

inline Vec VZero() { return _mm512_setzero_ps(); }
inline Vec VSet1(float v) { return _mm512_set1_ps(v); }
inline Vec VFma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec VMul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec VAdd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline void VStore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline float VSum(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec VLoad(const float* p) { return _mm512_loadu_ps(p); }
inline Vec VLoad(const Bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec VLoad(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

#include "backend/cpu/kernels_simd.inc"
#include "backend/cpu/kernels_attention.inc"

const CpuKernels kAvx512Kernels = {
    .name = "avx512",
    .gemv = Gemv,
    .gemm = Gemm,
    .gemm_bf16 = nullptr,
    .gemm_cols_align = kNr,
    .attention_row = AttendRow,
};

}  // namespace

const CpuKernels* Avx512Kernels() { return &kAvx512Kernels; }

}  // namespace strata::cpu

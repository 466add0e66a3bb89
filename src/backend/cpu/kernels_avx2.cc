// AVX2 + FMA + F16C kernel set (8 F32 lanes). Compiled with -mavx2 -mfma
// -mf16c (simd_flags.cmake); used only when DetectCpuFeatures().avx2.
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <utility>

#include "backend/cpu/kernels.h"

namespace strata::cpu {
namespace {

#include "backend/cpu/kernels_types.inc"

using Vec = __m256;
constexpr int kLanes = 8;
// 6 rows x 2 vectors = 12 accumulators + 2 panel vectors + 1 broadcast of 16 ymm.
constexpr int kGemmMr = 6;

inline Vec VZero() { return _mm256_setzero_ps(); }
inline Vec VSet1(float v) { return _mm256_set1_ps(v); }
inline Vec VFma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec VMul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec VAdd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline void VStore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline float VSum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline Vec VSub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec VDiv(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec VMin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec VMax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec VRound(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

#include "backend/cpu/kernels_exp_poly.inc"

inline Vec VExp(Vec x) {
  Vec n;
  const Vec p = VExpPoly(x, &n);
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline Vec VLoad(const float* p) { return _mm256_loadu_ps(p); }
inline Vec VLoad(const Bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec VLoad(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

#include "backend/cpu/kernels_simd.inc"
#include "backend/cpu/kernels_attention.inc"

const CpuKernels kAvx2Kernels = {
    .name = "avx2",
    .gemv = Gemv,
    .gemm = Gemm,
    .gemm_bf16 = nullptr,
    .gemm_bf16_amx = nullptr,
    .gemm_cols_align = kNr,
    .attention_row = AttendRow,
    .silu_mul = SiluMul,
};

}  // namespace

const CpuKernels* Avx2Kernels() { return &kAvx2Kernels; }

}  // namespace strata::cpu

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
inline Vec VRound(Vec a) {
  return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

#include "backend/cpu/kernels_exp_poly.inc"

inline Vec VExp(Vec x) {
  Vec n;
  const Vec p = VExpPoly(x, &n);
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline Vec VLoad(const float* p) { return _mm256_loadu_ps(p); }
inline Vec VLoad(const Bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec VLoad(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8x8 transpose of F32 lanes held as 8 vectors (rows in, columns out).
inline void Transpose8x8(Vec r[8]) {
  const Vec t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const Vec t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const Vec t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const Vec t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const Vec u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const Vec u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const Vec u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const Vec u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Packs the first kc / 8 * 8 k of a full panel with 8x8 transposes: the
// scalar loop of PackPanel wrote one float per cache line of the panel and
// took ~20% of a 512-row GEMM on Zen 3 (perf, Qwen2.5-0.5B shapes).
template <typename W>
int64_t PackPanelVector(const LinearArgs& a, int64_t j0, int ncols, int64_t k0, int64_t kc,
                        float* panel) {
  constexpr int kNr = 2 * kLanes;  // as kernels_simd.inc, which comes later
  if (ncols != kNr) return 0;
  const W* w = static_cast<const W*>(a.w) + k0;
  const int64_t kv = kc / kLanes * kLanes;
  for (int cb = 0; cb < kNr; cb += kLanes) {
    for (int64_t kb = 0; kb < kv; kb += kLanes) {
      Vec r[kLanes];
#pragma GCC unroll 8
      for (int i = 0; i < kLanes; ++i) r[i] = VLoad(w + (j0 + cb + i) * a.w_stride + kb);
      Transpose8x8(r);
#pragma GCC unroll 8
      for (int i = 0; i < kLanes; ++i) VStore(panel + (kb + i) * kNr + cb, r[i]);
    }
  }
  return kv;
}
#define STRATA_HAVE_PACK_PANEL_VECTOR 1

#include "backend/cpu/kernels_simd.inc"

// After kernels_simd.inc: uses its Dot, Axpy, Scale and ExpSubSum.
#include "backend/cpu/kernels_attention.inc"

const CpuKernels kAvx2Kernels = {
    .name = "avx2",
    .gemv = Gemv,
    .gemm = Gemm,
    .gemm_bf16 = nullptr,
    .gemm_bf16_amx = nullptr,
    .gemm_cols_align = kNr,
    .attention_row = AttendRow,
    .attention_block = nullptr,
    .silu_mul = SiluMul,
};

}  // namespace

const CpuKernels* Avx2Kernels() { return &kAvx2Kernels; }

}  // namespace strata::cpu

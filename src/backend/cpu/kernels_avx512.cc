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

// ---- bf16 GEMM (AVX512_BF16) ----
//
// Same loop nest as Gemm, but operands are bf16 and vdpbf16ps does two
// multiply-adds per F32 lane: acc[c] += x[2p] * w[c][2p] + x[2p+1] * w[c][2p+1].
// The panel stores pairs: panel[p][c] = (w[c][2p], w[c][2p+1]) as one 32-bit
// word, kNr columns wide; x pairs are broadcast as 32-bit words.
constexpr int64_t kBf16Kc = 512;  // k per block (even)
static_assert(kBf16Kc / 2 * kNr * 4 <= kGemmScratchBytes, "panel must fit scratch");

inline uint16_t WeightBf16(float v) { return RoundToBf16(v); }
inline uint16_t WeightBf16(Bf16 v) { return v.bits; }
inline uint16_t WeightBf16(Half v) { return RoundToBf16(ToFloat(v)); }

template <typename W>
void PackPanelBf16(const LinearArgs& a, int64_t j0, int ncols, int64_t k0, int64_t kc, uint32_t* panel) {
  const int64_t pairs = (kc + 1) / 2;
  const W* w = static_cast<const W*>(a.w) + k0;
  for (int c = 0; c < ncols; ++c) {
    const W* wr = w + (j0 + c) * a.w_stride;
    int64_t p = 0;
    for (; p < kc / 2; ++p) {
      panel[p * kNr + c] = WeightBf16(wr[2 * p]) | static_cast<uint32_t>(WeightBf16(wr[2 * p + 1])) << 16;
    }
    if (p < pairs) panel[p * kNr + c] = WeightBf16(wr[2 * p]);  // odd kc: pad the pair with 0
  }
  for (int c = ncols; c < kNr; ++c)
    for (int64_t p = 0; p < pairs; ++p) panel[p * kNr + c] = 0;
}

template <int MR>
void MicroKernelBf16(const uint16_t* x, int64_t xs, const uint32_t* panel, int64_t pairs, float* out, int64_t os,
                     int ncols, const float* init_bias, bool accumulate) {
  Vec acc[MR][2];
  if (accumulate) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) LoadCols(out + r * os, ncols, &acc[r][0], &acc[r][1]);
  } else {
    Vec b0 = VZero(), b1 = VZero();
    if (init_bias) LoadCols(init_bias, ncols, &b0, &b1);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r][0] = b0, acc[r][1] = b1;
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh p0 = (__m512bh)_mm512_loadu_si512(panel + p * kNr);
    const __m512bh p1 = (__m512bh)_mm512_loadu_si512(panel + p * kNr + kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, x + r * xs + 2 * p, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, p0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, p1);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) StoreCols(out + r * os, ncols, acc[r][0], acc[r][1]);
}

using MicroKernelBf16Fn = void (*)(const uint16_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, int,
                                   const float*, bool);

template <int... Is>
constexpr auto MakeMicroKernelsBf16(std::integer_sequence<int, Is...>) {
  return std::array<MicroKernelBf16Fn, sizeof...(Is)>{&MicroKernelBf16<Is + 1>...};
}

template <typename W>
void GemmBf16T(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch) {
  static constexpr auto kernels = MakeMicroKernelsBf16(std::make_integer_sequence<int, kGemmMr>());
  uint32_t* panel = static_cast<uint32_t*>(scratch);
  for (int64_t n0 = 0; n0 < a.n; n0 += kGemmNc) {
    const int64_t n1 = n0 + kGemmNc < a.n ? n0 + kGemmNc : a.n;
    for (int64_t k0 = 0; k0 < a.k; k0 += kBf16Kc) {
      const int64_t kc = a.k - k0 < kBf16Kc ? a.k - k0 : kBf16Kc;
      const int64_t pairs = (kc + 1) / 2;
      for (int64_t j0 = m0; j0 < m1; j0 += kNr) {
        const int ncols = static_cast<int>(m1 - j0 < kNr ? m1 - j0 : kNr);
        PackPanelBf16<W>(a, j0, ncols, k0, kc, panel);
        const float* bias = a.bias ? a.bias + j0 : nullptr;
        for (int64_t r0 = n0; r0 < n1; r0 += kGemmMr) {
          const int mr = static_cast<int>(n1 - r0 < kGemmMr ? n1 - r0 : kGemmMr);
          kernels[mr - 1](a.xb + r0 * a.xb_stride + k0, a.xb_stride, panel, pairs, a.out + r0 * a.out_stride + j0,
                          a.out_stride, ncols, bias, k0 > 0);
        }
      }
    }
  }
}

void GemmBf16(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch) {
  switch (a.w_dtype) {
    case DType::kF32: return GemmBf16T<float>(a, m0, m1, scratch);
    case DType::kBF16: return GemmBf16T<Bf16>(a, m0, m1, scratch);
    case DType::kF16: return GemmBf16T<Half>(a, m0, m1, scratch);
    default: __builtin_trap();
  }
}

const CpuKernels kAvx512Kernels = {
    .name = "avx512",
    .gemv = Gemv,
    .gemm = Gemm,
    .gemm_bf16 = GemmBf16,
    .gemm_cols_align = kNr,
    .attention_row = AttendRow,
};

}  // namespace

const CpuKernels* Avx512Kernels() { return &kAvx512Kernels; }

}  // namespace strata::cpu

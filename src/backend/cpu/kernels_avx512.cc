// AVX-512 kernel set (16 F32 lanes), plus the AVX512_BF16 gemm. Compiled
// with AVX-512 F/BW/VL/DQ + BF16 flags (simd_flags.cmake); used only when
// DetectCpuFeatures().avx512 (gemm_bf16 only with avx512_bf16).
#include <immintrin.h>

// GCC 12's _mm512_reduce_add_ps and friends trip a false -Wmaybe-uninitialized,
// its permute intrinsics (Transpose16x16) a false -Wuninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

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
inline Vec VSub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec VDiv(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec VMin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec VMax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec VRound(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

#include "backend/cpu/kernels_exp_poly.inc"

inline Vec VExp(Vec x) {
  Vec n;
  const Vec p = VExpPoly(x, &n);
  return _mm512_scalef_ps(p, n);
}
inline Vec VLoad(const float* p) { return _mm512_loadu_ps(p); }
inline Vec VLoad(const Bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec VLoad(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// In-register transpose of 16 rows of 16 32-bit words: afterwards r[t]
// holds word t of every input row. Unpacks interleave within 128-bit lanes,
// then two rounds of lane shuffles gather each column.
inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // rows 4g..4g+3: r[4g + c] lane L = column 4L + c
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i s0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    const __m512i s1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    const __m512i s2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    const __m512i s3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
    t[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Vector part of PackPanel (see kernels_simd.inc): whole 16x16 blocks of a
// full-width panel; returns how many kk it packed (the rest is scalar).
template <typename W>
int64_t PackPanelVector(const LinearArgs& a, int64_t j0, int ncols, int64_t k0, int64_t kc, float* panel) {
  if (ncols != 2 * kLanes) return 0;
  const W* w = static_cast<const W*>(a.w) + k0;
  const int64_t kv = kc / 16 * 16;
  for (int cb = 0; cb < 2 * kLanes; cb += 16) {
    for (int64_t kb = 0; kb < kv; kb += 16) {
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(VLoad(w + (j0 + cb + i) * a.w_stride + kb));
      Transpose16x16(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(panel + (kb + i) * 2 * kLanes + cb, r[i]);
    }
  }
  return kv;
}
#define STRATA_HAVE_PACK_PANEL_VECTOR 1
#define STRATA_HAVE_GEMM_LOOP 1  // Gemm512 below

#include "backend/cpu/kernels_simd.inc"
#include "backend/cpu/kernels_attention.inc"

// ---- fp32 GEMM loop nest (AVX-512) ----
//
// The micro-kernel, panel packing and 12 x 32 register tile are
// kernels_simd.inc's; the loop nest around them is this file's, because on
// the AVX-512 parts here (Zen 5: 1 MiB L2, two 512-bit FMA pipes) the shared
// one lost a quarter of the FMA peak outside the inner loop. Per thread,
// over its columns [m0, m1):
//   for each block of kGemm512Nb rows of x
//     for each group of kGemm512Group panels (64 columns)
//       for each k block (K cut into equal blocks of <= kGemm512KcMax)
//         pack the group's panels (kc x 32 F32 each, in L2), prefetch
//             the weights of the next pack, then
//         for each 12-row tile of x, for each panel of the group:
//             register tile over the whole k block
// The shared nest (k blocks of 256 outside the groups) loads and stores
// every output tile once per k block, and by the time it returns to a tile
// that tile has left L2 (the whole output, 20 MB for Qwen2.5-0.5B's gate_up,
// is swept per k block): 18% of the micro-kernel's time went to those
// loads. Here a k block is all of K up to 2048 (every Qwen2.5-0.5B and
// Llama-3.2-1B Linear but down), so each output is written once, and a
// group's outputs stay in L2 between its k blocks otherwise. x is read from
// L3 once per group; at 64 columns per group that is ~7 GB/s, far below
// what L3 delivers (docs/perf.md, "AMD EPYC (Zen 5, AVX-512) … fp32 prefill GEMM").
// Per output the sum runs kk ascending within a block, blocks in order.
constexpr int64_t kGemm512KcMax = 2048;
constexpr int kGemm512Group = 2;
constexpr int64_t kGemm512Nb = 1024;
static_assert(kGemm512Group * kGemm512KcMax * kNr * sizeof(float) <= kGemmScratchBytes, "panels must fit scratch");

// Prefetches (into L2) the weights rows [j0, j1) x columns [k0, k0 + kc):
// they come from DRAM in short row pieces, too short for the hardware
// prefetcher to pick up.
template <typename W>
void PrefetchWeights(const LinearArgs& a, int64_t j0, int64_t j1, int64_t k0, int64_t kc) {
  for (int64_t j = j0; j < j1; ++j) {
    const char* p = reinterpret_cast<const char*>(static_cast<const W*>(a.w) + j * a.w_stride + k0);
    for (int64_t b = 0; b < kc * static_cast<int64_t>(sizeof(W)); b += 64) __builtin_prefetch(p + b, 0, 2);
  }
}

template <typename W>
void Gemm512T(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch) {
  static constexpr auto kernels = MakeMicroKernels(std::make_integer_sequence<int, kGemmMr>());
  constexpr int64_t kGroupCols = kGemm512Group * kNr;
  float* panels = static_cast<float*>(scratch);
  const int64_t nkb = (a.k + kGemm512KcMax - 1) / kGemm512KcMax;
  const int64_t kb = ((a.k + nkb - 1) / nkb + 15) / 16 * 16;  // <= kGemm512KcMax
  for (int64_t n0 = 0; n0 < a.n; n0 += kGemm512Nb) {
    const int64_t n1 = n0 + kGemm512Nb < a.n ? n0 + kGemm512Nb : a.n;
    for (int64_t g0 = m0; g0 < m1; g0 += kGroupCols) {
      const int64_t g1 = g0 + kGroupCols < m1 ? g0 + kGroupCols : m1;
      const int npanels = static_cast<int>((g1 - g0 + kNr - 1) / kNr);
      for (int64_t k0 = 0; k0 < a.k; k0 += kb) {
        const int64_t kc = a.k - k0 < kb ? a.k - k0 : kb;
        for (int p = 0; p < npanels; ++p) {
          const int64_t j0 = g0 + p * kNr;
          PackPanel<W>(a, j0, static_cast<int>(g1 - j0 < kNr ? g1 - j0 : kNr), k0, kc, panels + p * kc * kNr);
        }
        if (k0 + kc < a.k) {  // the next pack: this group's next k block, or the next group's first
          PrefetchWeights<W>(a, g0, g1, k0 + kc, a.k - k0 - kc < kb ? a.k - k0 - kc : kb);
        } else if (g1 < m1) {
          PrefetchWeights<W>(a, g1, g1 + kGroupCols < m1 ? g1 + kGroupCols : m1, 0, kb < a.k ? kb : a.k);
        }
        for (int64_t r0 = n0; r0 < n1; r0 += kGemmMr) {
          const int mr = static_cast<int>(n1 - r0 < kGemmMr ? n1 - r0 : kGemmMr);
          for (int p = 0; p < npanels; ++p) {
            const int64_t j0 = g0 + p * kNr;
            kernels[mr - 1](a.x + r0 * a.x_stride + k0, a.x_stride, panels + p * kc * kNr, kc,
                            a.out + r0 * a.out_stride + j0, a.out_stride,
                            static_cast<int>(g1 - j0 < kNr ? g1 - j0 : kNr), a.bias ? a.bias + j0 : nullptr,
                            k0 > 0);
          }
        }
      }
    }
  }
}

void Gemm512(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch) {
  switch (a.w_dtype) {
    case DType::kF32: return Gemm512T<float>(a, m0, m1, scratch);
    case DType::kBF16: return Gemm512T<Bf16>(a, m0, m1, scratch);
    case DType::kF16: return Gemm512T<Half>(a, m0, m1, scratch);
    default: __builtin_trap();
  }
}

// ---- Attention of a block of query tokens per pass over the KV (prefill; decode of >= 4 heads) ----
//
// AttendRow walks the KV once per token and takes one horizontal sum per
// (position, head): 14% of an fp32 Qwen2.5-0.5B prefill on the Zen 5 EPYC.
// Here each block of 16 KV positions is loaded once for all the block's
// rows and heads, K transposed (16 positions in the lanes), so a score
// vector of 16 positions is hd broadcast FMAs and the weighted V sum hd/16
// FMAs per position, with one max and one sum reduction per 16 positions.
// Online softmax as AttendRow (same math, different summation order).
template <typename T>
void AttendBlockT(const AttentionBlockArgs& a) {
  constexpr int kPos = 16;  // KV positions per block (the lanes)
  const KvLayerView& layer = *a.layer;
  const int hd = a.head_dim, g = a.num_heads, nr = a.num_rows, nv = hd / kLanes;
  const int64_t ps = layer.page_size;
  const int64_t token_elems = static_cast<int64_t>(layer.num_kv_heads) * hd;
  const T* kbase = static_cast<const T*>(layer.k) + static_cast<int64_t>(a.kv_head) * hd;
  const T* vbase = static_cast<const T*>(layer.v) + static_cast<int64_t>(a.kv_head) * hd;
  alignas(64) float o[kAttentionBlockFloats];
  alignas(64) float kt[kMaxHeadDim * kPos];  // kt[i * 16 + j] = K[p0 + j][i]
  alignas(64) float pj[kPos];
  float m[kMaxAttentionBlockRows * kMaxAttentionGroup], l[kMaxAttentionBlockRows * kMaxAttentionGroup];
  for (int i = 0; i < nr * g; ++i) m[i] = -__builtin_inff(), l[i] = 0.f;
  for (int i = 0; i < nr * g * hd; ++i) o[i] = 0.f;
  const int32_t last = a.pos0 + nr - 1;
  const int32_t first = a.window > 0 && a.pos0 - a.window + 1 > 0 ? a.pos0 - a.window + 1 : 0;
  const Vec scale = VSet1(a.scale);
  for (int32_t p0 = first / kPos * kPos; p0 <= last; p0 += kPos) {
    const int nb = last - p0 + 1 < kPos ? last - p0 + 1 : kPos;
    const T* vrow[kPos];
    const T* krow[kPos];
    for (int j = 0; j < nb; ++j) {
      const int64_t p = p0 + j;
      const int64_t slot = static_cast<int64_t>(a.page_table[p / ps]) * ps + p % ps;
      krow[j] = kbase + slot * token_elems;
      vrow[j] = vbase + slot * token_elems;
    }
    for (int c = 0; c < nv; ++c) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = j < nb ? _mm512_castps_si512(VLoad(krow[j] + c * kLanes)) : _mm512_setzero_si512();
      Transpose16x16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(kt + (c * kLanes + i) * kPos, r[i]);
    }
    for (int t = 0; t < nr; ++t) {
      const int32_t pos = a.pos0 + t;
      const int32_t lo = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
      if (p0 > pos || p0 + nb - 1 < lo) continue;
      // Lanes j with lo <= p0 + j <= pos.
      const int jlo = lo > p0 ? lo - p0 : 0, jhi = pos - p0 < nb - 1 ? pos - p0 : nb - 1;
      const __mmask16 valid = static_cast<__mmask16>(((1u << (jhi + 1)) - 1) & ~((1u << jlo) - 1));
      for (int h = 0; h < g; ++h) {
        const float* qv = a.q + t * a.q_stride + static_cast<int64_t>(a.first_head + h) * hd;
        // 8 chains of hd / 8 FMAs (named: GCC keeps an array of them in memory).
        Vec s0 = VZero(), s1 = VZero(), s2 = VZero(), s3 = VZero();
        Vec s4 = VZero(), s5 = VZero(), s6 = VZero(), s7 = VZero();
        for (int i = 0; i < hd; i += 8) {
          s0 = VFma(VSet1(qv[i]), _mm512_load_ps(kt + i * kPos), s0);
          s1 = VFma(VSet1(qv[i + 1]), _mm512_load_ps(kt + (i + 1) * kPos), s1);
          s2 = VFma(VSet1(qv[i + 2]), _mm512_load_ps(kt + (i + 2) * kPos), s2);
          s3 = VFma(VSet1(qv[i + 3]), _mm512_load_ps(kt + (i + 3) * kPos), s3);
          s4 = VFma(VSet1(qv[i + 4]), _mm512_load_ps(kt + (i + 4) * kPos), s4);
          s5 = VFma(VSet1(qv[i + 5]), _mm512_load_ps(kt + (i + 5) * kPos), s5);
          s6 = VFma(VSet1(qv[i + 6]), _mm512_load_ps(kt + (i + 6) * kPos), s6);
          s7 = VFma(VSet1(qv[i + 7]), _mm512_load_ps(kt + (i + 7) * kPos), s7);
        }
        const Vec sc = VMul(VAdd(VAdd(VAdd(s0, s1), VAdd(s2, s3)), VAdd(VAdd(s4, s5), VAdd(s6, s7))), scale);
        const int idx = t * g + h;
        const float bm = _mm512_mask_reduce_max_ps(valid, sc);
        const float mx = bm > m[idx] ? bm : m[idx];
        const Vec p = _mm512_maskz_mov_ps(valid, VExp(VSub(sc, VSet1(mx))));
        const float corr = __builtin_expf(m[idx] - mx);  // 0 on the first block
        m[idx] = mx;
        l[idx] = l[idx] * corr + VSum(p);
        _mm512_store_ps(pj, p);
        float* orow = o + static_cast<int64_t>(idx) * hd;
        const Vec cv = VSet1(corr);
        // 64 dims at a time, even and odd positions in separate chains.
        int c = 0;
        for (; c + 4 <= nv; c += 4) {
          float* op = orow + c * kLanes;
          Vec a0 = VMul(VLoad(op), cv), a1 = VMul(VLoad(op + 16), cv);
          Vec a2 = VMul(VLoad(op + 32), cv), a3 = VMul(VLoad(op + 48), cv);
          Vec b0 = VZero(), b1 = VZero(), b2 = VZero(), b3 = VZero();
          int j = jlo;
          for (; j + 1 <= jhi; j += 2) {
            const T* v0 = vrow[j] + c * kLanes;
            const T* v1 = vrow[j + 1] + c * kLanes;
            const Vec w0 = VSet1(pj[j]), w1 = VSet1(pj[j + 1]);
            a0 = VFma(w0, VLoad(v0), a0), a1 = VFma(w0, VLoad(v0 + 16), a1);
            a2 = VFma(w0, VLoad(v0 + 32), a2), a3 = VFma(w0, VLoad(v0 + 48), a3);
            b0 = VFma(w1, VLoad(v1), b0), b1 = VFma(w1, VLoad(v1 + 16), b1);
            b2 = VFma(w1, VLoad(v1 + 32), b2), b3 = VFma(w1, VLoad(v1 + 48), b3);
          }
          if (j <= jhi) {
            const T* v0 = vrow[j] + c * kLanes;
            const Vec w0 = VSet1(pj[j]);
            a0 = VFma(w0, VLoad(v0), a0), a1 = VFma(w0, VLoad(v0 + 16), a1);
            a2 = VFma(w0, VLoad(v0 + 32), a2), a3 = VFma(w0, VLoad(v0 + 48), a3);
          }
          VStore(op, VAdd(a0, b0)), VStore(op + 16, VAdd(a1, b1));
          VStore(op + 32, VAdd(a2, b2)), VStore(op + 48, VAdd(a3, b3));
        }
        for (; c < nv; ++c) {
          float* op = orow + c * kLanes;
          Vec a0 = VMul(VLoad(op), cv);
          for (int j = jlo; j <= jhi; ++j) a0 = VFma(VSet1(pj[j]), VLoad(vrow[j] + c * kLanes), a0);
          VStore(op, a0);
        }
      }
    }
  }
  for (int t = 0; t < nr; ++t) {
    float* out = a.out + t * a.out_stride + static_cast<int64_t>(a.first_head) * hd;
    for (int h = 0; h < g; ++h) {
      const int idx = t * g + h;
      const float inv = 1.f / l[idx];
      for (int i = 0; i < hd; ++i) out[h * hd + i] = o[idx * hd + i] * inv;
    }
  }
}

void AttendBlock(const AttentionBlockArgs& a) {
  switch (a.layer->dtype) {
    case DType::kF32: return AttendBlockT<float>(a);
    case DType::kBF16: return AttendBlockT<Bf16>(a);
    case DType::kF16: return AttendBlockT<Half>(a);
    default: __builtin_trap();
  }
}

// ---- bf16 GEMM (AVX512_BF16) ----
//
// Same loop nest as Gemm, but operands are bf16 and vdpbf16ps does two
// multiply-adds per F32 lane: acc[c] += x[2p] * w[c][2p] + x[2p+1] * w[c][2p+1].
// The panel stores pairs: panel[p][c] = (w[c][2p], w[c][2p+1]) as one 32-bit
// word, kNr columns wide; x pairs are broadcast as 32-bit words.
constexpr int64_t kBf16Kc = 512;  // k per block (even)
static_assert(kBf16Kc / 2 * kNr * 4 + 48 * kNr * 4 <= kGemmScratchBytes, "panel must fit scratch");
static_assert(kBf16Kc % 32 == 0, "AMX steps of 32 k must tile a k block");

inline uint16_t WeightBf16(float v) { return RoundToBf16(v); }
inline uint16_t WeightBf16(Bf16 v) { return v.bits; }
inline uint16_t WeightBf16(Half v) { return RoundToBf16(ToFloat(v)); }

// Packs pairs [0, (kc + 1) / 2) and zero-fills up to `padded_pairs`.
// 16 pairs (32 elements) of one weight row as bf16 words, low element first.
inline __m512i LoadPairs(const Bf16* p) { return _mm512_loadu_si512(p); }
inline __m512i LoadPairs(const float* p) {
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
}
inline __m512i LoadPairs(const Half* p) {
  return (__m512i)_mm512_cvtne2ps_pbh(VLoad(p + 16), VLoad(p));
}

template <typename W>
void PackPanelBf16(const LinearArgs& a, int64_t j0, int ncols, int64_t k0, int64_t kc, int64_t padded_pairs,
                   uint32_t* panel) {
  const int64_t pairs = (kc + 1) / 2;
  const W* w = static_cast<const W*>(a.w) + k0;
  int64_t pv = 0;  // pairs packed by whole 16x16 blocks
  if (ncols == kNr) {
    pv = kc / 32 * 16;
    for (int cb = 0; cb < kNr; cb += 16) {
      for (int64_t pb = 0; pb < pv; pb += 16) {
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) r[i] = LoadPairs(w + (j0 + cb + i) * a.w_stride + 2 * pb);
        Transpose16x16(r);
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(panel + (pb + i) * kNr + cb, r[i]);
      }
    }
  }
  for (int c = 0; c < ncols; ++c) {
    const W* wr = w + (j0 + c) * a.w_stride;
    int64_t p = pv;
    for (; p < kc / 2; ++p) {
      panel[p * kNr + c] = WeightBf16(wr[2 * p]) | static_cast<uint32_t>(WeightBf16(wr[2 * p + 1])) << 16;
    }
    if (p < pairs) panel[p * kNr + c] = WeightBf16(wr[2 * p]);  // odd kc: pad the pair with 0
    for (p = pairs; p < padded_pairs; ++p) panel[p * kNr + c] = 0;
  }
  for (int c = ncols; c < kNr; ++c)
    for (int64_t p = 0; p < padded_pairs; ++p) panel[p * kNr + c] = 0;
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

// ---- AMX-BF16 ----
//
// A 32x32 output block is four 16x16 F32 accumulator tiles (tmm0-3); each
// step of 32 k loads two 16x32 bf16 x tiles (tmm4-5, straight from xb) and
// two 16-pair x 16-column weight tiles (tmm6-7, straight from the pair-packed
// panel, whose row stride is kNr words) and issues four tdpbf16ps.
// Rows left over (< 32) go to the AVX512_BF16 microkernel on the same panel.
constexpr int kAmxRows = 32;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) void AmxBegin() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC 12 does not treat ldtilecfg as reading its operand and drops the
  // stores above without this barrier.
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) void AmxEnd() { _tile_release(); }

// c: 32 rows x 32 F32 columns, row stride cs floats. init: accumulate onto
// c (kAccumulate), start from zero, or start from the 16-row block `bias16`.
enum class AmxInit { kZero, kAccumulate, kBias };

__attribute__((target("amx-tile,amx-bf16"))) void AmxBlock(const uint16_t* x, int64_t xs, const uint32_t* panel,
                                                            int64_t padded_pairs, float* c, int64_t cs,
                                                            AmxInit init, const float* bias16) {
  const int64_t cb = cs * 4;
  if (init == AmxInit::kAccumulate) {
    _tile_loadd(0, c, cb);
    _tile_loadd(1, c + 16, cb);
    _tile_loadd(2, c + 16 * cs, cb);
    _tile_loadd(3, c + 16 * cs + 16, cb);
  } else if (init == AmxInit::kBias) {
    _tile_loadd(0, bias16, kNr * 4);
    _tile_loadd(1, bias16 + 16, kNr * 4);
    _tile_loadd(2, bias16, kNr * 4);
    _tile_loadd(3, bias16 + 16, kNr * 4);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t xb = xs * 2;
  for (int64_t p = 0; p < padded_pairs; p += 16) {
    _tile_loadd(4, x + 2 * p, xb);
    _tile_loadd(5, x + 16 * xs + 2 * p, xb);
    _tile_loadd(6, panel + p * kNr, kNr * 4);
    _tile_loadd(7, panel + p * kNr + 16, kNr * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, cb);
  _tile_stored(1, c + 16, cb);
  _tile_stored(2, c + 16 * cs, cb);
  _tile_stored(3, c + 16 * cs + 16, cb);
}

// Loop nest as Gemm, with a group of panels packed together: for AMX the
// 32-row x block (32 x kc bf16) is then reused from L1 by every panel of the
// group, and each tile step's 4 KB of operands stays off L2's bandwidth.
template <bool kAmx>
struct Bf16Blocking {
  static constexpr int64_t kKc = kAmx ? 256 : kBf16Kc;
  static constexpr int kGroup = kAmx ? 8 : 1;
  static constexpr int64_t kPanelWords = kKc / 2 * kNr;  // pairs padded to 16 fit: kKc % 32 == 0
};
static_assert(Bf16Blocking<true>::kGroup * (Bf16Blocking<true>::kPanelWords * 4 + 16 * kNr * 4) +
                      kAmxRows * kNr * 4 <= kGemmScratchBytes,
              "AMX panels must fit scratch");

template <typename W, bool kAmx>
void GemmBf16T(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch) {
  using B = Bf16Blocking<kAmx>;
  static constexpr auto kernels = MakeMicroKernelsBf16(std::make_integer_sequence<int, kGemmMr>());
  // scratch: kGroup panels | kGroup 16-row bias blocks | 32x32 staging block
  uint32_t* panels = static_cast<uint32_t*>(scratch);
  float* bias16 = reinterpret_cast<float*>(panels + B::kGroup * B::kPanelWords);
  float* stage = bias16 + B::kGroup * 16 * kNr;
  if (kAmx) AmxBegin();
  for (int64_t n0 = 0; n0 < a.n; n0 += kGemmNc) {
    const int64_t n1 = n0 + kGemmNc < a.n ? n0 + kGemmNc : a.n;
    for (int64_t k0 = 0; k0 < a.k; k0 += B::kKc) {
      const int64_t kc = a.k - k0 < B::kKc ? a.k - k0 : B::kKc;
      const int64_t pairs = (kc + 1) / 2;
      const int64_t padded_pairs = kAmx ? (pairs + 15) / 16 * 16 : pairs;
      for (int64_t g0 = m0; g0 < m1; g0 += B::kGroup * kNr) {
        const int np = static_cast<int>((m1 - g0 + kNr - 1) / kNr < B::kGroup ? (m1 - g0 + kNr - 1) / kNr : B::kGroup);
        for (int p = 0; p < np; ++p) {
          const int64_t j0 = g0 + p * kNr;
          const int ncols = static_cast<int>(m1 - j0 < kNr ? m1 - j0 : kNr);
          PackPanelBf16<W>(a, j0, ncols, k0, kc, padded_pairs, panels + p * B::kPanelWords);
          if (kAmx && a.bias && k0 == 0) {
            for (int r = 0; r < 16; ++r)
              for (int c = 0; c < kNr; ++c) bias16[(p * 16 + r) * kNr + c] = c < ncols ? a.bias[j0 + c] : 0.f;
          }
        }
        int64_t r0 = n0;
        if (kAmx) {
          const AmxInit init = k0 > 0 ? AmxInit::kAccumulate : a.bias ? AmxInit::kBias : AmxInit::kZero;
          for (; r0 + kAmxRows <= n1; r0 += kAmxRows) {
            const uint16_t* x = a.xb + r0 * a.xb_stride + k0;
            for (int p = 0; p < np; ++p) {
              const int64_t j0 = g0 + p * kNr;
              const int ncols = static_cast<int>(m1 - j0 < kNr ? m1 - j0 : kNr);
              const uint32_t* panel = panels + p * B::kPanelWords;
              const float* b16 = bias16 + p * 16 * kNr;
              float* out = a.out + r0 * a.out_stride + j0;
              if (ncols == kNr) {
                AmxBlock(x, a.xb_stride, panel, padded_pairs, out, a.out_stride, init, b16);
                continue;
              }
              for (int r = 0; r < kAmxRows && init == AmxInit::kAccumulate; ++r)
                for (int c = 0; c < ncols; ++c) stage[r * kNr + c] = out[r * a.out_stride + c];
              AmxBlock(x, a.xb_stride, panel, padded_pairs, stage, kNr, init, b16);
              for (int r = 0; r < kAmxRows; ++r)
                for (int c = 0; c < ncols; ++c) out[r * a.out_stride + c] = stage[r * kNr + c];
            }
          }
        }
        for (int p = 0; p < np; ++p) {
          const int64_t j0 = g0 + p * kNr;
          const int ncols = static_cast<int>(m1 - j0 < kNr ? m1 - j0 : kNr);
          const float* bias = a.bias ? a.bias + j0 : nullptr;
          for (int64_t r = r0; r < n1; r += kGemmMr) {
            const int mr = static_cast<int>(n1 - r < kGemmMr ? n1 - r : kGemmMr);
            kernels[mr - 1](a.xb + r * a.xb_stride + k0, a.xb_stride, panels + p * B::kPanelWords, pairs,
                            a.out + r * a.out_stride + j0, a.out_stride, ncols, bias, k0 > 0);
          }
        }
      }
    }
  }
  if (kAmx) AmxEnd();
}

void GemmBf16(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch) {
  switch (a.w_dtype) {
    case DType::kF32: return GemmBf16T<float, false>(a, m0, m1, scratch);
    case DType::kBF16: return GemmBf16T<Bf16, false>(a, m0, m1, scratch);
    case DType::kF16: return GemmBf16T<Half, false>(a, m0, m1, scratch);
    default: __builtin_trap();
  }
}

void GemmBf16Amx(const LinearArgs& a, int64_t m0, int64_t m1, void* scratch) {
  switch (a.w_dtype) {
    case DType::kF32: return GemmBf16T<float, true>(a, m0, m1, scratch);
    case DType::kBF16: return GemmBf16T<Bf16, true>(a, m0, m1, scratch);
    case DType::kF16: return GemmBf16T<Half, true>(a, m0, m1, scratch);
    default: __builtin_trap();
  }
}

const CpuKernels kAvx512Kernels = {
    .name = "avx512",
    .gemv = Gemv,
    .gemm = Gemm512,
    .gemm_bf16 = GemmBf16,
    .gemm_bf16_amx = GemmBf16Amx,
    .gemm_cols_align = kNr,
    .attention_row = AttendRow,
    .attention_block = AttendBlock,
    .silu_mul = SiluMul,
};

}  // namespace

const CpuKernels* Avx512Kernels() { return &kAvx512Kernels; }

}  // namespace strata::cpu

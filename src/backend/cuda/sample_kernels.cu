// Device sampling: one block of kSampleThreads per row (sample_kernels.h
// says what is reproduced exactly and what goes back to the host). Each
// phase is a few passes over the row, which sits in L2 (600 KB at a 151k
// vocabulary); the sequential parts (mass sums in block order, the
// inverse-CDF walks) run on thread 0 because their order is the host's.
#include <cmath>
#include <cstdint>

#include "backend/cuda/sample_kernels.h"

namespace strata::cuda {
namespace {

constexpr float kNegInf = -INFINITY;
constexpr float kGreedyT = 1e-5f;  // kGreedyTemperature (backend/sampling.h)
constexpr float kMinExp = -87.f;   // the host sampler's kMinExp
constexpr int kWarps = kSampleThreads / 32;
constexpr int kBands = 128;  // weight bands by binary exponent (w <= 1)

struct Shared {
  unsigned long long cand[kSampleCandidates];
  int hist[256];
  int band_count[kBands];
  float band_mass[kBands];
  float red_f[kWarps];
  double red_d[kWarps];
  long long red_i[kWarps];
  uint32_t prefix;
  int remaining, found;
  int n_cand, b_end, reason, token;
  double top_k_mass, kept_mass;
};

// The host sampler's ExpNonPositive, operation for operation with explicit
// round-to-nearest intrinsics so nvcc cannot contract a multiply and an add
// into an FMA (the host, built for ISO C++ on baseline x86-64, never does):
// each weight is the host's float.
__device__ inline float ExpNonPositive(float x) {
  x = x >= kMinExp ? x : kMinExp;
  const float magic = 12582912.f;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), magic), magic);
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693145751953125f)),
                            __fmul_rn(n, 1.42860682030941723212e-6f));
  float p = 1.f / 720;
  p = __fadd_rn(__fmul_rn(p, r), 1.f / 120);
  p = __fadd_rn(__fmul_rn(p, r), 1.f / 24);
  p = __fadd_rn(__fmul_rn(p, r), 1.f / 6);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.f);
  p = __fadd_rn(__fmul_rn(p, r), 1.f);
  const int bits = (static_cast<int>(n) + 127) << 23;
  return __fmul_rn(p, __int_as_float(bits));
}

// The host's BuildCandidates weight of one logit: e (the top-k set's
// weight) and the returned w (e minus what min-p removes).
struct WeightArgs {
  float vmax, inv_t, kth, min_p;
};
__device__ inline float Weight(float v, const WeightArgs& w, float* e_out) {
  const float d = __fmul_rn(__fsub_rn(v, w.vmax), w.inv_t);
  const bool in_k = (v >= w.kth) && (d >= kMinExp);  // NaN and -inf fail
  const float e = in_k ? ExpNonPositive(d) : 0.f;
  *e_out = e;
  return (e >= w.min_p && e > 0.f) ? e : 0.f;
}
__device__ inline float Weight(float v, const WeightArgs& w) {
  float e;
  return Weight(v, w, &e);
}

// Float order as unsigned order; -0 counts as +0 (the host compares floats).
__device__ inline uint32_t OrderedKey(float v) {
  if (v == 0.f) v = 0.f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ inline float KeyToFloat(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
// Candidate sort keys: value descending, then id ascending.
__device__ inline unsigned long long CandKey(uint32_t value_bits, int64_t id) {
  return (static_cast<unsigned long long>(value_bits) << 32) |
         (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ inline int32_t CandId(unsigned long long k) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k & 0xFFFFFFFFu));
}
__device__ inline uint32_t CandValueBits(unsigned long long k) {
  return static_cast<uint32_t>(k >> 32);
}

// ---- Block reductions (every thread calls; every thread gets the result) ----
__device__ float BlockMax(float v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // the previous reduction's reads are done
  if ((threadIdx.x & 31) == 0) sh.red_f[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kWarps ? sh.red_f[threadIdx.x & 31] : kNegInf;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ double BlockSum(double v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_d[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kWarps ? sh.red_d[threadIdx.x & 31] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ long long BlockSum(long long v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_i[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kWarps ? sh.red_i[threadIdx.x & 31] : 0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ long long BlockMin(long long v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_i[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kWarps ? sh.red_i[threadIdx.x & 31] : INT64_MAX;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Largest non-NaN value of x; -inf when there is none.
__device__ float RowMax(const float* x, int64_t n, Shared& sh) {
  float m = kNegInf;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, x[i]);  // fmaxf skips NaN
  return BlockMax(m, sh);
}

// The k-th largest non-NaN value of x (k >= 1) by an exact radix select
// over OrderedKey, 8 bits per pass. False when fewer than k are not NaN.
__device__ bool RadixKth(const float* x, int64_t n, int64_t k, Shared& sh, float* out) {
  uint32_t prefix = 0, mask = 0;
  int remaining = static_cast<int>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = x[i];
      if (isnan(v)) continue;
      const uint32_t key = OrderedKey(v);
      if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, digit = -1;
      for (int d = 255; d >= 0; --d) {
        if (cum + sh.hist[d] >= remaining) {
          digit = d;
          break;
        }
        cum += sh.hist[d];
      }
      sh.found = digit >= 0;
      if (digit >= 0) {
        sh.prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        sh.remaining = remaining - cum;
      }
    }
    __syncthreads();
    if (!sh.found) return false;
    prefix = sh.prefix;
    remaining = sh.remaining;
    mask |= 255u << shift;
  }
  *out = KeyToFloat(prefix);
  return true;
}

// Sorts sh.cand[0, n) descending (bitonic over the next power of two,
// padded with the smallest key).
__device__ void SortCandidates(int n, Shared& sh) {
  int p = 2;
  while (p < n) p <<= 1;
  for (int i = n + threadIdx.x; i < p; i += blockDim.x) sh.cand[i] = 0;
  __syncthreads();
  for (int k = 2; k <= p; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < p; i += blockDim.x) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const unsigned long long a = sh.cand[i], b = sh.cand[ixj];
          const bool desc = (i & k) == 0;
          if (desc ? a < b : a > b) {
            sh.cand[i] = b;
            sh.cand[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The host's dense Draw, on one thread: walk the block masses, then the
// weights of the block the target falls in, in double.
__device__ int32_t DenseDraw(const float* x, int64_t vocab, const WeightArgs& wa, const double* bm,
                             int64_t nb, double target) {
  const int64_t padded = (vocab + 3) / 4 * 4;
  double cum = 0;
  int64_t last = -1;
  for (int64_t b = 0; b < nb; ++b) {
    if (target >= cum + bm[b]) {
      cum += bm[b];
      continue;
    }
    const int64_t end = min(padded, (b + 1) * kSampleWeightBlock);
    for (int64_t i = b * kSampleWeightBlock; i < end; ++i) {
      const float w = i < vocab ? Weight(x[i], wa) : 0.f;
      if (w <= 0.f) continue;
      cum += w;
      last = i;
      if (target < cum) return static_cast<int32_t>(i);
    }
  }
  if (last >= 0) return static_cast<int32_t>(last);
  for (int64_t i = vocab - 1; i >= 0; --i)
    if (Weight(x[i], wa) > 0.f) return static_cast<int32_t>(i);
  return 0;
}

constexpr int kPrepareThreads = 256;
constexpr int kPrepareLoads = kSampleChunk / kPrepareThreads;  // per thread, all in flight

// Block (row r = blockIdx.x, chunk c = blockIdx.y): tokens [c * kSampleChunk,
// +kSampleChunk) of row r. First the host's Sampler::Adjust for those tokens
// into the row's scratch (when it has one): mask, then bans, then logit_bias
// in order, then penalties; each token belongs to this block alone, so the
// per-token order is the host's. Then the chunk's SamplePartial.
__global__ void __launch_bounds__(kPrepareThreads)
    PrepareRowsKernel(const float* logits, int64_t stride, int64_t vocab, SampleInputs in,
                      float* scratch, SamplePartial* partials) {
  const SampleRowArgs a = in.rows[blockIdx.x];
  const int tid = threadIdx.x;
  const int64_t c0 = int64_t{blockIdx.y} * kSampleChunk;
  const int64_t c1 = min(vocab, c0 + kSampleChunk);
  const float* raw = logits + a.logit_row * stride;
  float v[kPrepareLoads];
#pragma unroll
  for (int k = 0; k < kPrepareLoads; ++k) {
    const int64_t i = c0 + tid + k * kPrepareThreads;
    v[k] = i < c1 ? raw[i] : kNegInf;
  }
  if (a.scratch_row >= 0) {
    float* y = scratch + a.scratch_row * vocab;
    const uint32_t* words = in.allowed + a.allowed_offset;
    const int64_t covered = a.allowed_words > 0 ? min(vocab, int64_t{a.allowed_words} * 32) : vocab;
#pragma unroll
    for (int k = 0; k < kPrepareLoads; ++k) {
      const int64_t i = c0 + tid + k * kPrepareThreads;
      if (i >= c1) continue;
      if (a.allowed_words > 0 && !(i < covered && ((words[i >> 5] >> (i & 31)) & 1u)))
        v[k] = kNegInf;
      y[i] = v[k];
    }
    const bool sparse = a.banned_count > 0 || a.bias_count > 0 || a.penalty_count > 0;
    if (sparse) {
      __syncthreads();
      for (int j = tid; j < a.banned_count; j += kPrepareThreads) {
        const int32_t id = in.banned[a.banned_offset + j];
        if (id >= c0 && id < c1) y[id] = kNegInf;
      }
      __syncthreads();
      if (tid == 0) {  // in order: a repeated id adds up as on the host
        for (int j = 0; j < a.bias_count; ++j) {
          const int32_t id = in.bias_ids[a.bias_offset + j];
          if (id >= c0 && id < c1) y[id] = __fadd_rn(y[id], in.bias_values[a.bias_offset + j]);
        }
      }
      __syncthreads();
      const float rep = a.repetition_penalty;
      for (int j = tid; j < a.penalty_count; j += kPrepareThreads) {  // distinct ids
        const PenaltyEntry e = in.penalties[a.penalty_offset + j];
        if (e.token_id < c0 || e.token_id >= c1) continue;
        float l = y[e.token_id];
        if (rep != 1.f) l = l > 0.f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
        if (e.output_count > 0) {
          l = __fsub_rn(l, __fmul_rn(a.frequency_penalty, static_cast<float>(e.output_count)));
          l = __fsub_rn(l, a.presence_penalty);
        }
        y[e.token_id] = l;
      }
      __syncthreads();  // this block's writes are visible to its reads below
#pragma unroll
      for (int k = 0; k < kPrepareLoads; ++k) {
        const int64_t i = c0 + tid + k * kPrepareThreads;
        if (i < c1) v[k] = y[i];
      }
    }
  }
  // The chunk's max and the lowest id at it; NaN never wins (both compares
  // fail), -inf does when nothing is larger.
  float best = kNegInf;
  int32_t index = INT32_MAX;
#pragma unroll
  for (int k = 0; k < kPrepareLoads; ++k) {
    const int64_t i = c0 + tid + k * kPrepareThreads;
    if (i >= c1) continue;
    if (v[k] > best || (v[k] == best && index == INT32_MAX)) {
      best = v[k];
      index = static_cast<int32_t>(i);
    }
  }
  __shared__ float red_v[kPrepareThreads / 32];
  __shared__ int32_t red_i[kPrepareThreads / 32];
  auto combine = [](float& bv, int32_t& bi, float ov, int32_t oi) {
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  };
  for (int o = 16; o > 0; o >>= 1)
    combine(best, index, __shfl_xor_sync(0xffffffffu, best, o),
            __shfl_xor_sync(0xffffffffu, index, o));
  if ((tid & 31) == 0) red_v[tid >> 5] = best, red_i[tid >> 5] = index;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < kPrepareThreads / 32; ++w) combine(best, index, red_v[w], red_i[w]);
    partials[int64_t{blockIdx.x} * gridDim.y + blockIdx.y] = SamplePartial{best, index};
  }
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const float* logits, int64_t stride, int64_t vocab, SampleInputs in,
                     float* scratch, double* block_mass, const SamplePartial* partials,
                     int64_t chunks, SampleRowOut* outs) {
  __shared__ Shared sh;
  const SampleRowArgs a = in.rows[blockIdx.x];
  const int tid = threadIdx.x, nt = blockDim.x;
  const float* raw = logits + a.logit_row * stride;
  const float* x = raw;
  if (tid == 0) sh.reason = kSampleDone;

  // 1. The prepare kernel adjusted the row into scratch.
  if (a.scratch_row >= 0) x = scratch + a.scratch_row * vocab;

  // 2. The token.
  int32_t token = 0;
  const SamplePartial* parts = partials + int64_t{blockIdx.x} * chunks;
  float pmax = kNegInf;
  for (int64_t c = tid; c < chunks; c += nt) pmax = fmaxf(pmax, parts[c].max);
  const float vmax = BlockMax(pmax, sh);
  if (a.temperature < kGreedyT || !isfinite(vmax)) {
    // The host's Argmax: the lowest id whose value equals the row's max.
    // A chunk holds such an id only when its own max equals it (float ==).
    long long best = INT64_MAX;
    for (int64_t c = tid; c < chunks; c += nt)
      if (parts[c].max == vmax && parts[c].index != INT32_MAX)
        best = min(best, static_cast<long long>(parts[c].index));
    best = BlockMin(best, sh);
    token = best == INT64_MAX ? 0 : static_cast<int32_t>(best);
  } else {
    WeightArgs wa{vmax, __fdiv_rn(1.f, a.temperature), kNegInf, a.min_p};
    if (a.top_k > 0 && a.top_k < vocab) {
      float kth;
      if (RadixKth(x, vocab, a.top_k, sh, &kth)) wa.kth = kth;
    }
    // Masses per 256-token block as the host sums them: four float lanes
    // (token i in lane i % 4), then the lanes into a double.
    const int64_t nb = (vocab + kSampleWeightBlock - 1) / kSampleWeightBlock;
    double* bm_kept = block_mass + int64_t{blockIdx.x} * 2 * nb;
    double* bm_in_k = bm_kept + nb;
    for (int64_t b = tid; b < nb; b += nt) {
      float in_k[4] = {0.f, 0.f, 0.f, 0.f}, kept[4] = {0.f, 0.f, 0.f, 0.f};
      const int64_t end = min(vocab, (b + 1) * kSampleWeightBlock);
      for (int64_t i0 = b * kSampleWeightBlock; i0 < end; i0 += 4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (i0 + j >= end) break;
          float e;
          const float w = Weight(x[i0 + j], wa, &e);
          in_k[j] = __fadd_rn(in_k[j], e);
          kept[j] = __fadd_rn(kept[j], w);
        }
      }
      double s_in = 0, s_kept = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s_in += static_cast<double>(in_k[j]);
        s_kept += static_cast<double>(kept[j]);
      }
      bm_in_k[b] = s_in;
      bm_kept[b] = s_kept;
    }
    __syncthreads();
    if (tid == 0) {
      double tk = 0, km = 0;
      for (int64_t b = 0; b < nb; ++b) {
        tk += bm_in_k[b];
        km += bm_kept[b];
      }
      sh.top_k_mass = tk;
      sh.kept_mass = km;
      if (a.top_p >= 1.f) sh.token = DenseDraw(x, vocab, wa, bm_kept, nb, a.uniform * km);
    }
    __syncthreads();
    if (a.top_p < 1.f) {
      // top-p: the prefix (weight desc, id asc) whose mass reaches
      // top_p * the top-k mass. Bands by binary exponent pick a set that
      // holds it (a margin covers the float band sums); only that set is
      // sorted, then thread 0 walks it as the host does.
      const double limit = static_cast<double>(a.top_p) * sh.top_k_mass;
      for (int i = tid; i < kBands; i += nt) {
        sh.band_count[i] = 0;
        sh.band_mass[i] = 0.f;
      }
      __syncthreads();
      // Band histogram. The heavy bands (w >= 2^-kLocalBands: where a flat
      // distribution puts almost every token) are counted per thread and
      // merged per warp, so the block does ~32 x kLocalBands shared atomics
      // instead of two per token (which serialised on the few hot addresses:
      // 20 ms per 151k-token row on the H200). Lighter bands, rare, go
      // straight to shared memory. Float band masses only place the cut
      // (with a margin); their summation order never reaches a result.
      constexpr int kLocalBands = 24;
      int local_count[kLocalBands];
      float local_mass[kLocalBands];
#pragma unroll
      for (int b = 0; b < kLocalBands; ++b) local_count[b] = 0, local_mass[b] = 0.f;
      for (int64_t i = tid; i < vocab; i += nt) {
        const float w = Weight(x[i], wa);
        if (w <= 0.f) continue;
        const int band = 127 - static_cast<int>((__float_as_uint(w) >> 23) & 0xFFu);
        if (band < kLocalBands) {
          ++local_count[band];
          local_mass[band] += w;
        } else {
          atomicAdd(&sh.band_count[band], 1);
          atomicAdd(&sh.band_mass[band], w);
        }
      }
#pragma unroll
      for (int b = 0; b < kLocalBands; ++b) {
        int c = local_count[b];
        float m = local_mass[b];
        for (int off = 16; off > 0; off >>= 1) {
          c += __shfl_xor_sync(0xFFFFFFFFu, c, off);
          m += __shfl_xor_sync(0xFFFFFFFFu, m, off);
        }
        if ((tid & 31) == 0 && c > 0) {
          atomicAdd(&sh.band_count[b], c);
          atomicAdd(&sh.band_mass[b], m);
        }
      }
      __syncthreads();
      if (tid == 0) {
        // The first band where the mass reaches limit (with and without a
        // 0.1% margin), plus one band more when that still fits.
        int with_margin = kBands - 1, exact = kBands - 1;
        double m = 0;
        bool have_exact = false;
        for (int b = 0; b < kBands; ++b) {
          m += sh.band_mass[b];
          if (!have_exact && m >= limit) exact = b, have_exact = true;
          if (m >= limit * (1 + 1e-3)) {
            with_margin = b;
            break;
          }
        }
        auto count_to = [&](int last) {
          int c = 0;
          for (int b = 0; b <= last; ++b) c += sh.band_count[b];
          return c;
        };
        int b_end = -1;
        if (with_margin + 1 < kBands && count_to(with_margin + 1) <= kSampleCandidates)
          b_end = with_margin + 1;
        else if (count_to(with_margin) <= kSampleCandidates)
          b_end = with_margin;
        else if (count_to(exact) <= kSampleCandidates)
          b_end = exact;
        if (b_end < 0) sh.reason = kSampleTopPCandidates;
        sh.b_end = b_end;
        sh.found = count_to(kBands - 1);  // every token with weight
        sh.n_cand = 0;
      }
      __syncthreads();
      if (sh.reason == kSampleDone) {
        const int b_end = sh.b_end;
        for (int64_t i = tid; i < vocab; i += nt) {
          const float w = Weight(x[i], wa);
          if (w <= 0.f) continue;
          const int band = 127 - static_cast<int>((__float_as_uint(w) >> 23) & 0xFFu);
          if (band > b_end) continue;
          const int pos = atomicAdd(&sh.n_cand, 1);
          sh.cand[pos] = CandKey(__float_as_uint(w), i);
        }
        __syncthreads();
        const int n = sh.n_cand;
        SortCandidates(n, sh);
        if (tid == 0) {
          double mass = 0;
          int i = 0;
          for (; i < n && mass < limit; ++i) mass += __uint_as_float(CandValueBits(sh.cand[i]));
          if (i == n && mass < limit && n < sh.found) {
            sh.reason = kSampleTopPMargin;
          } else {
            const int count = max(i, 1);
            double kept_mass = 0;
            for (int c = 0; c < count; ++c) kept_mass += __uint_as_float(CandValueBits(sh.cand[c]));
            const double target = a.uniform * kept_mass;
            double cum = 0;
            int32_t t = CandId(sh.cand[count - 1]);  // rounding put target on the sum
            for (int c = 0; c < count; ++c) {
              cum += __uint_as_float(CandValueBits(sh.cand[c]));
              if (target < cum) {
                t = CandId(sh.cand[c]);
                break;
              }
            }
            sh.token = t;
          }
        }
      }
      __syncthreads();
    }
    token = sh.token;
  }

  // 3. A token the mask forbids only wins when every allowed logit is -inf
  // or NaN; the host's KeepAllowed decides what then.
  if (tid == 0 && sh.reason == kSampleDone && (a.allowed_words > 0 || a.banned_count > 0)) {
    bool ok = a.allowed_words == 0 ||
              ((token >> 5) < a.allowed_words &&
               ((in.allowed[a.allowed_offset + (token >> 5)] >> (token & 31)) & 1u));
    for (int j = 0; ok && j < a.banned_count; ++j) ok = in.banned[a.banned_offset + j] != token;
    if (!ok) sh.reason = kSampleMaskedOut;
  }
  __syncthreads();

  // 4. Raw logprobs of the token, its rank and the top N (the host's
  // ComputeTokenLogprobs; the log-sum-exp in double).
  float logprob = 0.f;
  long long rank = 0;
  int num_top = 0;
  if (sh.reason == kSampleDone && a.logprobs >= 0) {
    // Unadjusted rows: the partials' max is the raw row's.
    const float m = a.scratch_row >= 0 ? RowMax(raw, vocab, sh) : vmax;
    const float chosen = raw[token];
    double s = 0;
    long long ge = 0;
    for (int64_t i = tid; i < vocab; i += nt) {
      const float v = raw[i];
      const float d = __fsub_rn(v, m);
      if (d >= kMinExp) s += static_cast<double>(ExpNonPositive(d));
      ge += v >= chosen;
    }
    s = BlockSum(s, sh);
    rank = BlockSum(ge, sh);
    const double lse = isfinite(m) ? static_cast<double>(m) + log(s) : static_cast<double>(m);
    logprob = static_cast<float>(static_cast<double>(chosen) - lse);
    rank = max(rank, 1LL);
    const int64_t n = min(int64_t{a.logprobs}, vocab);
    if (n > 0) {
      float thr = kNegInf;  // fewer than n non-NaN values: all of them
      float kth;
      if (RadixKth(raw, vocab, n, sh, &kth)) thr = kth;
      long long c = 0;
      for (int64_t i = tid; i < vocab; i += nt) c += raw[i] >= thr;
      c = BlockSum(c, sh);
      if (c > kSampleCandidates) {
        if (tid == 0) sh.reason = kSampleTopNCandidates;
      } else {
        if (tid == 0) sh.n_cand = 0;
        __syncthreads();
        for (int64_t i = tid; i < vocab; i += nt) {
          const float v = raw[i];
          if (!(v >= thr)) continue;
          const int pos = atomicAdd(&sh.n_cand, 1);
          sh.cand[pos] = CandKey(OrderedKey(v), i);
        }
        __syncthreads();
        SortCandidates(static_cast<int>(c), sh);
        num_top = static_cast<int>(min(c, static_cast<long long>(n)));
        if (tid == 0) {
          SampleRowOut* out = outs + blockIdx.x;
          for (int j = 0; j < num_top; ++j) {
            out->top_ids[j] = CandId(sh.cand[j]);
            out->top_logprobs[j] = static_cast<float>(
                static_cast<double>(KeyToFloat(CandValueBits(sh.cand[j]))) - lse);
          }
        }
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    SampleRowOut* out = outs + blockIdx.x;
    out->token_id = token;
    out->needs_host = sh.reason;
    out->logprob = logprob;
    out->rank = rank;
    out->num_top = sh.reason == kSampleDone ? num_top : 0;
  }
}

}  // namespace

void SampleRows(const float* logits, int64_t stride, int64_t vocab, const SampleInputs& in,
                int32_t num_rows, float* scratch, double* block_mass, SamplePartial* partials,
                SampleRowOut* out, cudaStream_t stream) {
  if (num_rows <= 0) return;
  const int64_t chunks = SampleChunks(vocab);
  PrepareRowsKernel<<<dim3(static_cast<unsigned>(num_rows), static_cast<unsigned>(chunks)),
                      kPrepareThreads, 0, stream>>>(logits, stride, vocab, in, scratch, partials);
  SampleRowsKernel<<<static_cast<unsigned>(num_rows), kSampleThreads, 0, stream>>>(
      logits, stride, vocab, in, scratch, block_mass, partials, chunks, out);
}

}  // namespace strata::cuda

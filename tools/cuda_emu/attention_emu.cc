// Runs src/backend/cuda/attention.cuh (PagedAttention's kernels and
// launcher, the code the GPU runs) on the host: every block as 128
// std::threads with real barriers and warp exchanges, one block at a time,
// its dynamic shared memory exactly the bytes the launcher asked for and
// poisoned with NaN. Under AddressSanitizer that checks the shared-memory
// size and every index; under ThreadSanitizer the barriers (a missing
// __syncthreads is a race); and the outputs against a double-precision
// attention. A development check for a machine without a GPU (slow: minutes),
// not a CI test; tools/cuda_emu/run.sh builds and runs it.
//
// Emulated: __syncthreads, __shfl_sync/_xor_sync/_up_sync, __ballot_sync
// (all 32 lanes must take part, as the kernels promise); a thread that
// returns counts as arrived at every later barrier.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backend/cuda/kernels.h"

#undef __global__
#define __global__
#undef __device__
#define __device__
#define __launch_bounds__(x)
#define cudaFuncSetAttribute(...) ((void)0)
#define STRATA_SHARED static
#define STRATA_DYNAMIC_SMEM(name) float* name = g_smem
#define STRATA_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  EmuLaunch(kernel, grid, block, smem_bytes, __VA_ARGS__)

namespace strata::cuda {
namespace {

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;
float* g_smem = nullptr;

struct WarpState {
  std::barrier<>* bar;
  uint64_t vals[32];
};
struct BlockState {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
  std::vector<WarpState> warps;
};
BlockState* g_block = nullptr;

void __syncthreads() { g_block->bar->arrive_and_wait(); }

template <typename T, typename F>
T WarpExchange(T v, F src) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  WarpState& ws = g_block->warps[w];
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  ws.vals[lane] = bits;
  ws.bar->arrive_and_wait();
  const int s = src(lane);
  uint64_t got = ws.vals[s & 31];
  ws.bar->arrive_and_wait();
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int o) {
  return WarpExchange(v, [&](int l) { return l ^ o; });
}
template <typename T>
T __shfl_sync(unsigned, T v, int src) {
  return WarpExchange(v, [&](int) { return src; });
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned d) {
  const int lane = threadIdx.x & 31;
  T r = WarpExchange(v,
                     [&](int l) { return l >= static_cast<int>(d) ? l - static_cast<int>(d) : l; });
  return lane >= static_cast<int>(d) ? r : v;
}
unsigned __ballot_sync(unsigned, bool p) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  WarpState& ws = g_block->warps[w];
  ws.vals[lane] = p ? 1 : 0;
  ws.bar->arrive_and_wait();
  unsigned b = 0;
  for (int i = 0; i < 32; ++i) b |= (ws.vals[i] ? 1u : 0u) << i;
  ws.bar->arrive_and_wait();
  return b;
}
int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
using std::max;
using std::min;
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }

inline float ToFloat(float v) { return v; }
inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float ToFloat(__half v) { return __half2float(v); }
inline float* RowF(const View& v, int64_t r) { return static_cast<float*>(v.data) + r * v.stride; }

template <typename K, typename... Args>
void EmuLaunch(K kernel, dim3 grid, int threads, size_t smem_bytes, Args... args) {
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        // Exactly the bytes asked for, poisoned: ASan sees any overrun, NaN any unwritten read.
        std::vector<float> smem(std::max<size_t>(smem_bytes / 4, 1), NAN);
        g_smem = smem_bytes ? smem.data() : nullptr;
        BlockState b;
        b.bar = std::make_unique<std::barrier<>>(threads);
        b.warps.resize(threads / 32);
        for (int w = 0; w < threads / 32; ++w) {
          b.warp_bars.push_back(std::make_unique<std::barrier<>>(32));
          b.warps[w].bar = b.warp_bars.back().get();
        }
        g_block = &b;
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] {
            threadIdx = {static_cast<unsigned>(t), 0, 0};
            blockIdx = {bx, by, bz};
            blockDim = dim3(threads);
            gridDim = grid;
            kernel(args...);
            b.warps[t >> 5].bar->arrive_and_drop();
            b.bar->arrive_and_drop();
          });
        for (auto& t : ts) t.join();
      }
}

}  // namespace

#include "backend/cuda/attention.cuh"

}  // namespace strata::cuda

using namespace strata;
using namespace strata::cuda;

struct Spec {
  int q_len, kv_len;
};

// Returns max abs error vs a double reference.
// max_kv_hint: AttentionArgs::max_kv_len; -1: the longest kv_len (what the
// model passes), 0: unknown.
double Run(DType dt, int ps, int heads, int kvh, int hd, int window, std::vector<Spec> specs,
           bool alias, int num_sms, std::mt19937& rng, int max_kv_hint = -1) {
  int64_t pages = 3, rows = 0;
  for (auto& s : specs) pages += (s.kv_len + ps - 1) / ps, rows += s.q_len;
  const int64_t e = int64_t(kvh) * hd, esz = dt == DType::kF32 ? 4 : 2;
  std::vector<uint8_t> kb(pages * ps * e * esz), vb(kb.size());
  std::normal_distribution<float> nd(0, 1);
  auto setv = [&](std::vector<uint8_t>& b, int64_t i, float v) -> float {
    if (dt == DType::kF32) {
      std::memcpy(&b[i * 4], &v, 4);
      return v;
    }
    if (dt == DType::kBF16) {
      __nv_bfloat16 h = __float2bfloat16(v);
      std::memcpy(&b[i * 2], &h, 2);
      return __bfloat162float(h);
    }
    __half h = __float2half(v);
    std::memcpy(&b[i * 2], &h, 2);
    return __half2float(h);
  };
  std::vector<float> kf(pages * ps * e), vf(kf.size());
  for (int64_t i = 0; i < (int64_t)kf.size(); ++i)
    kf[i] = setv(kb, i, nd(rng)), vf[i] = setv(vb, i, nd(rng));
  if (alias) vf = kf;
  std::vector<int32_t> freep(pages);
  for (int i = 0; i < pages; ++i) freep[i] = i;
  std::shuffle(freep.begin(), freep.end(), rng);
  std::vector<std::vector<int32_t>> tables(specs.size());
  std::vector<Seq> seqs;
  int qs = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int p = 0; p < (specs[s].kv_len + ps - 1) / ps; ++p)
      tables[s].push_back(freep.back()), freep.pop_back();
    seqs.push_back({qs, specs[s].q_len, specs[s].kv_len, tables[s].data()});
    qs += specs[s].q_len;
  }
  const int64_t cols = int64_t(heads) * hd;
  std::vector<float> q(rows * cols), out(rows * cols, 12345.f);
  for (auto& x : q) x = nd(rng);
  View qv{q.data(), DType::kF32, rows, cols, cols}, ov{out.data(), DType::kF32, rows, cols, cols};
  KvLayer layer{kb.data(), alias ? kb.data() : vb.data(), dt, ps, kvh, hd, pages};
  AttentionArgs a{heads, kvh, hd, window, 1.f / std::sqrt(float(hd))};
  a.max_kv_len = max_kv_hint;
  if (max_kv_hint < 0) {  // the model's path: the longest context
    a.max_kv_len = 0;
    for (auto& s : specs) a.max_kv_len = std::max(a.max_kv_len, s.kv_len);
  }
  const size_t wsb = PagedAttentionWorkspaceBytes(rows, specs.size(), a, num_sms);
  std::vector<float> ws(std::max<size_t>(wsb / 4, 1), NAN);
  PagedAttention(qv, layer, seqs.data(), seqs.size(), a, ov, wsb ? ws.data() : nullptr, wsb,
                 num_sms, nullptr);
  double worst = 0;
  const int g = heads / kvh;
  for (size_t s = 0; s < specs.size(); ++s)
    for (int t = 0; t < specs[s].q_len; ++t)
      for (int h = 0; h < heads; ++h) {
        const int pos = specs[s].kv_len - specs[s].q_len + t;
        const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
        const int kh = h / g;
        const float* qr = &q[(seqs[s].q_start + t) * cols + h * hd];
        std::vector<double> sc;
        double mx = -1e300;
        for (int p = first; p <= pos; ++p) {
          const int64_t slot = int64_t(tables[s][p / ps]) * ps + p % ps;
          double d = 0;
          for (int i = 0; i < hd; ++i) d += double(qr[i]) * kf[slot * e + kh * hd + i];
          d *= a.scale;
          sc.push_back(d);
          mx = std::max(mx, d);
        }
        double l = 0;
        for (auto& x : sc) x = std::exp(x - mx), l += x;
        for (int i = 0; i < hd; ++i) {
          double o = 0;
          for (int p = first; p <= pos; ++p) {
            const int64_t slot = int64_t(tables[s][p / ps]) * ps + p % ps;
            o += sc[p - first] * vf[slot * e + kh * hd + i];
          }
          o /= l;
          const double got = out[(seqs[s].q_start + t) * cols + h * hd + i];
          const double err = std::abs(got - o);
          if (!(err <= worst)) worst = err;
        }
      }
  const char* dn = dt == DType::kF32 ? "f32" : dt == DType::kBF16 ? "bf16" : "f16";
  std::printf(
      "%-5s ps %2d heads %2d/%d hd %3d win %3d alias %d max_kv %5d splits %2d  max err %.3g\n", dn,
      ps, heads, kvh, hd, window, alias, a.max_kv_len,
      AttentionSplits(rows, specs.size(), a, num_sms), worst);
  return worst;
}

// Default: every case; "small": three (ThreadSanitizer is slow).
int main(int argc, char** argv) {
  std::mt19937 rng(5);
  const int sms = 132;  // an H200
  const bool small = argc > 1 && std::strcmp(argv[1], "small") == 0;
  // The split count follows the longest context (a host-side check).
  {
    AttentionArgs a{32, 8, 64, 0, 0.125f};  // Llama-3.2-1B, one decode token
    const int unknown = AttentionSplits(1, 1, a, sms);
    const size_t ws = PagedAttentionWorkspaceBytes(1, 1, a, sms);
    bool ok = unknown == kMaxSplits;
    for (auto [kv, want] : {std::pair{1, 1}, {16, 1}, {32, 1}, {33, 2}, {1000, 32}, {100000, 64}}) {
      a.max_kv_len = kv;
      ok = ok && AttentionSplits(1, 1, a, sms) == want &&
           PagedAttentionWorkspaceBytes(1, 1, a, sms) == ws;  // one size: never regrown
    }
    a.max_kv_len = 5000, a.sliding_window = 100;  // a tile sees at most 100 + 15 positions
    ok = ok && AttentionSplits(1, 1, a, sms) == 4;
    std::printf("split counts from max_kv_len: %s\n", ok ? "OK" : "FAIL");
    if (!ok) return 1;
  }
  double w = 0;
  // Decode rows, long and short contexts: many split-K pieces, empty ones, the reduce.
  w = std::max(w, Run(DType::kBF16, 16, 8, 2, 64, 0, {{1, 300}, {1, 150}, {1, 33}, {1, 1}}, false,
                      sms, rng));
  // The same with the split count from the SM count alone (max_kv_len
  // unknown: more pieces, many empty) and from an understated hint (one).
  w = std::max(w, Run(DType::kBF16, 16, 8, 2, 64, 0, {{1, 300}, {1, 150}, {1, 33}, {1, 1}}, false,
                      sms, rng, 0));
  w = std::max(w, Run(DType::kBF16, 16, 8, 2, 64, 0, {{1, 300}, {1, 33}}, false, sms, rng, 1));
  // Few SMs, so one piece: tiles written directly; a sliding window.
  w = std::max(w, Run(DType::kBF16, 16, 16, 2, 64, 25, {{60, 100}, {1, 200}}, false, 1, rng));
  // MLA: hd 576, V = K.
  w = std::max(w, Run(DType::kBF16, 16, 16, 1, 576, 0, {{1, 70}, {5, 30}}, true, sms, rng));
  if (!small) {
    w = std::max(w, Run(DType::kF16, 1, 16, 2, 128, 0, {{1, 500}}, false, sms, rng));
    w = std::max(w, Run(DType::kF32, 16, 4, 4, 64, 0, {{1, 200}, {1, 100}}, false, sms, rng));
    w = std::max(w, Run(DType::kBF16, 16, 8, 2, 128, 0, {{40, 100}, {1, 70}}, false, sms, rng));
    w = std::max(w,
                 Run(DType::kF32, 1, 8, 2, 64, 20, {{1, 300}, {50, 90}, {3, 3}}, false, sms, rng));
    w = std::max(w, Run(DType::kF16, 5, 6, 2, 40, 0, {{1, 1}, {1, 37}, {5, 5}, {3, 50}, {17, 33}},
                        false, sms, rng));
    w = std::max(w, Run(DType::kF32, 5, 4, 1, 576, 0, {{1, 40}, {3, 64}}, false, sms, rng));
    w = std::max(w, Run(DType::kF16, 16, 4, 1, 256, 0, {{1, 30}, {9, 40}}, false, sms, rng));
    w = std::max(w, Run(DType::kBF16, 16, 16, 2, 64, 0, {{60, 100}, {7, 7}}, false, 1, rng));
  }
  std::printf("worst %.3g %s\n", w, w < 1e-4 ? "OK" : "FAIL");
  return w < 1e-4 ? 0 : 1;
}

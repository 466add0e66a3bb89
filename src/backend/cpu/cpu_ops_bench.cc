// CPU backend micro-benchmarks, each next to the roofline it is bounded by:
//   MemRead      streaming sum over a 1 GiB buffer: the memory read bandwidth
//                that bounds decode (GEMV reads every weight once per step).
//   Gemv         Linear with 1 row (decode) over bf16 weights at the shapes of
//                Qwen2.5-0.5B and Llama-3.2-1B; GB/s of weight bytes read.
//                Weights are replicated to >= 512 MiB and cycled, so they come
//                from DRAM as in a real decode step, not from L3.
//   FmaPeak      register-only FMA (and vdpbf16ps) throughput: the compute
//                roofline for prefill. fp32 is AVX-512, fp32-avx2 the 8-lane
//                FMA that the avx2 kernel set's GEMM runs on, fp32-gemm-loop
//                the avx512 GEMM micro-kernel's loads and FMAs from L1.
//   Gemm         Linear with 512 rows (prefill) in fp32 and bf16 precision;
//                GFLOP/s.
// Run: build-cpu/src/cpu_ops_bench [--benchmark_filter=Gemv]
#include <benchmark/benchmark.h>
// GCC 12 intrinsics headers trip false -W(maybe-)uninitialized warnings.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/thread_pool.h"

namespace strata {
namespace {

struct Shape {
  const char* model;
  const char* name;
  int64_t m, k;  // weight rows (outputs) x cols (inputs)
};

constexpr Shape kShapes[] = {
    {"qwen2.5-0.5b", "qkv", 1152, 896},       {"qwen2.5-0.5b", "o", 896, 896},
    {"qwen2.5-0.5b", "gate_up", 9728, 896},   {"qwen2.5-0.5b", "down", 896, 4864},
    {"qwen2.5-0.5b", "lm_head", 151936, 896}, {"llama3.2-1b", "qkv", 3072, 2048},
    {"llama3.2-1b", "o", 2048, 2048},         {"llama3.2-1b", "gate_up", 16384, 2048},
    {"llama3.2-1b", "down", 2048, 8192},      {"llama3.2-1b", "lm_head", 128256, 2048},
};

std::unique_ptr<Backend> MakeBackend(int threads, const std::string& precision = "fp32") {
  CpuBackendOptions o;
  o.num_threads = threads;
  o.matmul_precision = precision;
  auto b = CreateCpuBackend(o);
  if (!b.ok()) return nullptr;
  return std::move(b).value();
}

// Buffers of >= 2 MiB are 2 MiB-aligned and on transparent huge pages where
// the kernel allows, as the CPU backend holds weights (cpu_backend.cc): on
// 4 KiB pages a GEMV stream pays a TLB walk every 64 lines that the engine
// does not.
struct Aligned {
  void* p;
  explicit Aligned(size_t bytes) {
    constexpr size_t kHuge = size_t{2} << 20;
    if (bytes < kHuge) {
      p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      return;
    }
    const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    p = std::aligned_alloc(kHuge, rounded);
#if defined(__linux__)
    if (p) (void)madvise(p, rounded, MADV_HUGEPAGE);  // best effort
#endif
  }
  ~Aligned() { std::free(p); }
};

void FillBf16(uint16_t* p, size_t n) {
  uint32_t s = 12345;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = FloatToBf16((static_cast<float>(s >> 8) / 16777216.f - 0.5f) * 0.1f);
  }
}

void BM_MemRead(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  constexpr size_t kBytes = size_t{1} << 30;
  Aligned buf(kBytes);
  std::memset(buf.p, 1, kBytes);
  cpu::ThreadPool pool(threads);
  const uint64_t* words = static_cast<const uint64_t*>(buf.p);
  const int64_t n = kBytes / 8, chunks = 64;
  std::vector<uint64_t> sums(chunks);
  for (auto _ : state) {
    pool.ParallelFor(chunks, [&](int64_t c, int) {
      uint64_t s = 0;
      for (int64_t i = c * (n / chunks); i < (c + 1) * (n / chunks); ++i) s += words[i];
      sums[c] = s;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(kBytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Gemv(benchmark::State& state, Shape shape) {
  const int threads = static_cast<int>(state.range(0));
  auto backend = MakeBackend(threads);
  const size_t elems = shape.m * shape.k, bytes = elems * 2;
  const size_t copies = std::max<size_t>(1, ((size_t{512} << 20) + bytes - 1) / bytes);
  std::vector<std::unique_ptr<Aligned>> w;
  for (size_t c = 0; c < copies; ++c) {
    w.push_back(std::make_unique<Aligned>(bytes));
    if (c == 0)
      FillBf16(static_cast<uint16_t*>(w.back()->p), elems);
    else
      std::memcpy(w.back()->p, w[0]->p, bytes);
  }
  std::vector<float> x(shape.k, 0.01f), out(shape.m);
  size_t i = 0;
  for (auto _ : state) {
    Tensor wt{w[i++ % copies]->p, DType::kBF16, shape.m, shape.k, 0};
    backend->Linear(Tensor{x.data(), DType::kF32, 1, shape.k, 0}, wt, nullptr,
                    Tensor{out.data(), DType::kF32, 1, shape.m, 0});
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(backend->Name());
}

void BM_Gemm(benchmark::State& state, Shape shape, std::string precision) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = 512;
  auto backend = MakeBackend(threads, precision);
  if (!backend) {
    state.SkipWithError(("matmul_precision " + precision + " unsupported here").c_str());
    return;
  }
  Aligned w(shape.m * shape.k * 2);
  FillBf16(static_cast<uint16_t*>(w.p), shape.m * shape.k);
  std::vector<float> x(n * shape.k), out(n * shape.m);
  uint32_t seed = 99;
  for (float& v : x) {  // uniform with unit variance, like normalised activations
    seed = seed * 1664525u + 1013904223u;
    v = (static_cast<float>(seed >> 8) / 16777216.f - 0.5f) * 3.464f;
  }
  const Tensor xt{x.data(), DType::kF32, n, shape.k, 0}, wt{w.p, DType::kBF16, shape.m, shape.k, 0};
  for (auto _ : state) {
    backend->Linear(xt, wt, nullptr, Tensor{out.data(), DType::kF32, n, shape.m, 0});
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * shape.m * shape.k / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  if (precision != "fp32") {
    // Accuracy against the fp32 path: RMS and max error relative to the RMS output.
    std::vector<float> ref(n * shape.m);
    MakeBackend(threads)->Linear(xt, wt, nullptr, Tensor{ref.data(), DType::kF32, n, shape.m, 0});
    double se = 0, sr = 0, mx = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = double(out[i]) - ref[i];
      se += d * d;
      sr += double(ref[i]) * ref[i];
      mx = std::max(mx, std::abs(d));
    }
    state.counters["rel_rms_err"] = std::sqrt(se / sr);
    state.counters["rel_max_err"] = mx / std::sqrt(sr / ref.size());
  }
  state.SetLabel(backend->Name());
}

// Register-only throughput: 24 independent accumulator chains, named
// variables: with an array GCC kept the chains in memory and the loop ran at
// store-forwarding latency (45-48 "GFLOP/s" on a core whose GEMM does 150).
#define STRATA_CHAINS(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) \
  X(18) X(19) X(20) X(21) X(22) X(23)
__attribute__((target("avx512f"))) float FmaLoop(int64_t iters) {
  __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  __asm__ volatile("" : "+v"(a), "+v"(b));
#define STRATA_ACC(i) __m512 c##i = _mm512_set1_ps(static_cast<float>(i));
  STRATA_CHAINS(STRATA_ACC)
#undef STRATA_ACC
  for (int64_t it = 0; it < iters; ++it) {
#define STRATA_FMA(i) c##i = _mm512_fmadd_ps(c##i, a, b);
    STRATA_CHAINS(STRATA_FMA)
#undef STRATA_FMA
  }
  __m512 s = _mm512_setzero_ps();
#define STRATA_ADD(i) s = _mm512_add_ps(s, c##i);
  STRATA_CHAINS(STRATA_ADD)
#undef STRATA_ADD
  return _mm512_reduce_add_ps(s);
}

// The fp32 GEMM micro-kernel's instruction mix with every operand in L1:
// per step 2 panel loads, 12 broadcasts from 12 rows (x_stride 896 floats,
// as Qwen2.5-0.5B's hidden size) and 24 FMAs into 24 accumulators. The
// ceiling a 12 x 32 tile can reach on this core, below the pure FmaPeak.
alignas(64) float g_panel[256 * 32];
alignas(64) float g_xrows[12 * 896];
__attribute__((target("avx512f"))) float FmaLoadLoop(int64_t iters) {
#define STRATA_ACC(i) __m512 c##i = _mm512_setzero_ps();
  STRATA_CHAINS(STRATA_ACC)
#undef STRATA_ACC
  const float* x = g_xrows;
  __asm__ volatile("" : "+r"(x));
  for (int64_t it = 0; it < iters; ++it) {
    const int64_t kk = it & 255;
    const __m512 p0 = _mm512_load_ps(g_panel + kk * 32), p1 = _mm512_load_ps(g_panel + kk * 32 + 16);
#define STRATA_ROW(r, i, j)                                  \
  {                                                          \
    const __m512 xv = _mm512_set1_ps(x[(r) * 896 + kk]);     \
    c##i = _mm512_fmadd_ps(xv, p0, c##i);                    \
    c##j = _mm512_fmadd_ps(xv, p1, c##j);                    \
  }
    STRATA_ROW(0, 0, 1) STRATA_ROW(1, 2, 3) STRATA_ROW(2, 4, 5) STRATA_ROW(3, 6, 7) STRATA_ROW(4, 8, 9)
    STRATA_ROW(5, 10, 11) STRATA_ROW(6, 12, 13) STRATA_ROW(7, 14, 15) STRATA_ROW(8, 16, 17)
    STRATA_ROW(9, 18, 19) STRATA_ROW(10, 20, 21) STRATA_ROW(11, 22, 23)
#undef STRATA_ROW
  }
  __m512 s = _mm512_setzero_ps();
#define STRATA_ADD(i) s = _mm512_add_ps(s, c##i);
  STRATA_CHAINS(STRATA_ADD)
#undef STRATA_ADD
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bf16"))) float DpBf16Loop(int64_t iters) {
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a80);
  __asm__ volatile("" : "+v"(a), "+v"(b));
#define STRATA_ACC(i) __m512 c##i = _mm512_set1_ps(static_cast<float>(i));
  STRATA_CHAINS(STRATA_ACC)
#undef STRATA_ACC
  for (int64_t it = 0; it < iters; ++it) {
#define STRATA_DP(i) c##i = _mm512_dpbf16_ps(c##i, a, b);
    STRATA_CHAINS(STRATA_DP)
#undef STRATA_DP
  }
  __m512 s = _mm512_setzero_ps();
#define STRATA_ADD(i) s = _mm512_add_ps(s, c##i);
  STRATA_CHAINS(STRATA_ADD)
#undef STRATA_ADD
  return _mm512_reduce_add_ps(s);
}
#undef STRATA_CHAINS

// 12 chains: a Zen 3 core has 2 FMA pipes of 4 cycles' latency (8 in flight).
// Named variables, not an array: GCC kept an array of them in memory.
__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iters) {
  __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  __asm__ volatile("" : "+x"(a), "+x"(b));
#define STRATA_ACC(i) __m256 c##i = _mm256_set1_ps(static_cast<float>(i));
  STRATA_ACC(0)
  STRATA_ACC(1) STRATA_ACC(2) STRATA_ACC(3) STRATA_ACC(4) STRATA_ACC(5) STRATA_ACC(6) STRATA_ACC(7)
      STRATA_ACC(8) STRATA_ACC(9) STRATA_ACC(10) STRATA_ACC(11)
#undef STRATA_ACC
          for (int64_t it = 0; it < iters; ++it) {
#define STRATA_FMA(i) c##i = _mm256_fmadd_ps(c##i, a, b);
    STRATA_FMA(0)
    STRATA_FMA(1) STRATA_FMA(2) STRATA_FMA(3) STRATA_FMA(4) STRATA_FMA(5) STRATA_FMA(6)
        STRATA_FMA(7) STRATA_FMA(8) STRATA_FMA(9) STRATA_FMA(10) STRATA_FMA(11)
#undef STRATA_FMA
  }
  const __m256 s =
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                                  _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7))),
                    _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

void BM_FmaPeakAvx2(benchmark::State& state) {
  if (!cpu::DetectCpuFeatures().avx2) {
    state.SkipWithError("CPU lacks AVX2");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  cpu::ThreadPool pool(threads);
  constexpr int64_t kIters = 1 << 21;
  std::vector<float> sink(threads);
  for (auto _ : state) {
    pool.ParallelFor(threads, [&](int64_t t, int) { sink[t] = FmaLoopAvx2(kIters); });
    benchmark::DoNotOptimize(sink.data());
  }
  const double flops = double(threads) * kIters * 12 * 8 * 2;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

enum class PeakKind { kFp32, kBf16, kFp32GemmLoop };

void BM_FmaPeak(benchmark::State& state, PeakKind kind) {
  const bool bf16 = kind == PeakKind::kBf16;
  const auto& f = cpu::DetectCpuFeatures();
  if (!f.avx512 || (bf16 && !f.avx512_bf16)) {
    state.SkipWithError("CPU lacks the instructions");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  cpu::ThreadPool pool(threads);
  constexpr int64_t kIters = 1 << 20;
  std::vector<float> sink(threads);
  for (auto _ : state) {
    pool.ParallelFor(threads, [&](int64_t t, int) {
      sink[t] = kind == PeakKind::kBf16 ? DpBf16Loop(kIters)
                : kind == PeakKind::kFp32GemmLoop ? FmaLoadLoop(kIters)
                                                  : FmaLoop(kIters);
    });
    benchmark::DoNotOptimize(sink.data());
  }
  // Per FMA lane: 2 flops; vdpbf16ps does 2 multiply-adds per f32 lane.
  const double flops = double(threads) * kIters * 24 * 16 * 2 * (bf16 ? 2 : 1);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void RegisterAll() {
  // With --benchmark_repetitions, "min" is the one to read for times and
  // "max" for rates: this machine is shared and noise only ever slows it.
  auto threads = [](benchmark::internal::Benchmark* b) {
    b->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
    b->ComputeStatistics(
        "min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
    b->ComputeStatistics(
        "max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); });
  };
  threads(benchmark::RegisterBenchmark("MemRead", BM_MemRead));
  for (const Shape& s : kShapes) {
    threads(benchmark::RegisterBenchmark((std::string("Gemv/") + s.model + "/" + s.name).c_str(),
                                         BM_Gemv, s));
  }
  threads(benchmark::RegisterBenchmark("FmaPeak/fp32", BM_FmaPeak, PeakKind::kFp32));
  threads(benchmark::RegisterBenchmark("FmaPeak/bf16", BM_FmaPeak, PeakKind::kBf16));
  threads(benchmark::RegisterBenchmark("FmaPeak/fp32-gemm-loop", BM_FmaPeak, PeakKind::kFp32GemmLoop));
  threads(benchmark::RegisterBenchmark("FmaPeak/fp32-avx2", BM_FmaPeakAvx2));
  for (const Shape& s : kShapes) {
    if (std::string(s.name) == "lm_head") continue;  // prefill computes logits for one row
    for (const char* p : {"fp32", "bf16"}) {
      threads(benchmark::RegisterBenchmark(
          (std::string("Gemm512/") + p + "/" + s.model + "/" + s.name).c_str(), BM_Gemm, s,
          std::string(p)));
    }
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::RegisterAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

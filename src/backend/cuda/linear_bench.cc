// CUDA Linear at decode batch sizes (issue 10): time per call and weight
// bandwidth (weight bytes / time) for Llama-3.2-1B's projections, at n x
// rows of x. n = 1 (cuda::kGemvMaxRows) takes the GEMV kernel, more rows
// the cuBLASLt GEMM.
//
// Timing: `--calls` calls queued back to back on the backend's stream,
// then one Synchronize; time / calls. This is what a decode step sees (no
// host sync between ops) and includes the launch rate: a call shorter than
// a launch (~2-3 us of host time) measures the launch, not the kernel.
// Repeated `--reps` times; the median is printed.
//
// Then LinearGroup at one row (one GEMV launch over q/k/v or gate/up) next
// to the same parts as separate Linear calls, for Llama-3.2-1B's and
// Llama-3.1-8B's shapes (hidden 4096, 8 kv heads x 128, intermediate 14336);
// for gate/up also LinearSiluMul (the GEMVs and SiLU·mul in one launch).
//
// Usage: linear_bench [--precision=bf16|fp32] [--calls=200] [--reps=5]
//                     [--rows=1,2,4,8,9,16]
// Without a CUDA device it prints why and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace strata {
namespace {

struct Shape {
  const char* name;
  int64_t m, k;
};
// Llama-3.2-1B: hidden 2048, 8 kv heads x 64, intermediate 8192, vocab 128256.
constexpr Shape kShapes[] = {{"q/o 2048x2048", 2048, 2048},
                             {"k/v 512x2048", 512, 2048},
                             {"gate/up 8192x2048", 8192, 2048},
                             {"down 2048x8192", 2048, 8192},
                             {"lm_head 128256x2048", 128256, 2048}};

struct Group {
  const char* name;
  int64_t k;
  std::vector<int64_t> ms;
};
const Group kGroups[] = {{"1B q/k/v", 2048, {2048, 512, 512}},
                         {"1B gate/up", 2048, {8192, 8192}},
                         {"8B q/k/v", 4096, {4096, 1024, 1024}},
                         {"8B gate/up", 4096, {14336, 14336}},
                         {"8B o", 4096, {4096}},
                         {"8B down", 14336, {4096}}};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Deterministic, cheap fill (values in [-0.5, 0.5)); the bench needs no
// distribution, only finite numbers.
void FillHost(std::vector<float>& v, uint32_t seed) {
  uint32_t s = seed;
  for (float& f : v) {
    s = s * 1664525u + 1013904223u;
    f = static_cast<float>(s >> 8) / 16777216.f - 0.5f;
  }
}

int Run(int argc, char** argv) {
  std::string precision = "bf16";
  int calls = 200, reps = 5;
  std::vector<int64_t> rows = {1, 2, 4, 8, 9, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--precision=", 0) == 0) {
      precision = a.substr(12);
    } else if (a.rfind("--calls=", 0) == 0) {
      calls = std::max(1, std::atoi(a.c_str() + 8));
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::max(1, std::atoi(a.c_str() + 7));
    } else if (a.rfind("--rows=", 0) == 0) {
      rows.clear();
      for (const char* p = a.c_str() + 7; *p;) {
        rows.push_back(std::max<int64_t>(1, std::atoll(p)));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  CudaBackendOptions o;
  o.matmul_precision = precision;
  auto b = CreateCudaBackend(o);
  if (!b.ok()) {
    std::printf("linear_bench: %s\n", b.status().message().c_str());
    return 0;
  }
  Backend& be = **b;
  std::printf("# CUDA Linear, %s weights (--precision=%s), %d calls x %d reps, median\n",
              precision == "bf16" ? "BF16" : "F32", precision.c_str(), calls, reps);
  std::printf("%-22s %4s %10s %10s\n", "shape", "n", "us/call", "GB/s(w)");
  const int64_t max_n = *std::max_element(rows.begin(), rows.end());
  for (const Shape& s : kShapes) {
    // Host weights as BF16 (what a checkpoint holds); UploadWeight keeps
    // them BF16 under --precision=bf16 and widens them to F32 under fp32.
    std::vector<float> wf(static_cast<size_t>(s.m * s.k));
    FillHost(wf, 7);
    std::vector<uint16_t> wh(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wh[i] = FloatToBf16(wf[i]);
    wf = {};
    auto w = be.UploadWeight(Tensor{wh.data(), DType::kBF16, s.m, s.k, 0});
    if (!w.ok()) {
      std::printf("%-22s upload failed: %s\n", s.name, w.status().message().c_str());
      continue;
    }
    wh = {};
    const double wbytes = static_cast<double>(s.m * s.k) * DTypeSize(w->dtype);
    std::vector<float> xh(static_cast<size_t>(max_n * s.k));
    FillHost(xh, 11);
    auto xb = be.Allocate(xh.size() * sizeof(float));
    auto ob = be.Allocate(static_cast<size_t>(max_n * s.m) * sizeof(float));
    if (!xb.ok() || !ob.ok()) {
      std::printf("%-22s allocation failed\n", s.name);
      continue;
    }
    be.CopyToDevice(xb->data(), xh.data(), xh.size() * sizeof(float));
    for (int64_t n : rows) {
      const Tensor x{xb->data(), DType::kF32, n, s.k, 0};
      const Tensor out{ob->data(), DType::kF32, n, s.m, 0};
      for (int i = 0; i < 10; ++i) be.Linear(x, *w, nullptr, out);  // plans, clocks
      be.Synchronize();
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        const double t0 = Now();
        for (int i = 0; i < calls; ++i) be.Linear(x, *w, nullptr, out);
        be.Synchronize();
        t.push_back((Now() - t0) / calls);
      }
      std::sort(t.begin(), t.end());
      const double med = t[t.size() / 2];
      std::printf("%-22s %4lld %10.2f %10.0f\n", s.name, static_cast<long long>(n), med * 1e6,
                  wbytes / med / 1e9);
    }
  }
  // LinearGroup, one row: one launch against the parts one by one.
  std::printf("\n%-22s %12s %10s %12s %10s\n", "group (n=1)", "group us", "GB/s(w)", "parts us",
              "GB/s(w)");
  for (const Group& g : kGroups) {
    std::vector<Tensor> ws;
    std::vector<Buffer> outs;
    double wbytes = 0;
    bool ok = true;
    for (int64_t m : g.ms) {
      std::vector<uint16_t> wh(static_cast<size_t>(m * g.k));
      for (size_t i = 0; i < wh.size(); ++i) wh[i] = FloatToBf16(((i * 2654435761u) >> 24) / 512.f);
      auto w = be.UploadWeight(Tensor{wh.data(), DType::kBF16, m, g.k, 0});
      auto ob = be.Allocate(static_cast<size_t>(m) * sizeof(float));
      if (!w.ok() || !ob.ok()) {
        ok = false;
        break;
      }
      wbytes += static_cast<double>(m * g.k) * DTypeSize(w->dtype);
      ws.push_back(*w);
      outs.push_back(std::move(ob).value());
    }
    auto xb = be.Allocate(static_cast<size_t>(g.k) * sizeof(float));
    if (!ok || !xb.ok()) {
      std::printf("%-22s allocation failed\n", g.name);
      continue;
    }
    std::vector<float> xh(static_cast<size_t>(g.k));
    FillHost(xh, 13);
    be.CopyToDevice(xb->data(), xh.data(), xh.size() * sizeof(float));
    const Tensor x{xb->data(), DType::kF32, 1, g.k, 0};
    std::vector<LinearPart> parts;
    for (size_t i = 0; i < ws.size(); ++i)
      parts.push_back({ws[i], nullptr, Tensor{outs[i].data(), DType::kF32, 1, g.ms[i], 0}});
    auto time = [&](auto&& call) {
      for (int i = 0; i < 10; ++i) call();
      be.Synchronize();
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        const double t0 = Now();
        for (int i = 0; i < calls; ++i) call();
        be.Synchronize();
        t.push_back((Now() - t0) / calls);
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const double tg = time([&] { be.LinearGroup(x, parts); });
    const double tp = time([&] {
      for (const LinearPart& p : parts) be.Linear(x, p.w, nullptr, p.out);
    });
    std::printf("%-22s %12.2f %10.0f %12.2f %10.0f\n", g.name, tg * 1e6, wbytes / tg / 1e9,
                tp * 1e6, wbytes / tp / 1e9);
    if (parts.size() == 2) {  // gate/up: + SiLU·mul into a third buffer
      auto act = be.Allocate(static_cast<size_t>(g.ms[0]) * sizeof(float));
      if (!act.ok()) continue;
      const Tensor a{act->data(), DType::kF32, 1, g.ms[0], 0};
      const double ts = time([&] { be.LinearSiluMul(x, parts[0], parts[1], a); });
      const double tu = time([&] {
        be.LinearGroup(x, parts);
        be.SiluMul(parts[0].out, parts[1].out, a);
      });
      std::printf("%-22s %12.2f %10.0f %12.2f %10.0f\n", "  + silu_mul (fused/not)", ts * 1e6,
                  wbytes / ts / 1e9, tu * 1e6, wbytes / tu / 1e9);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Run(argc, argv); }

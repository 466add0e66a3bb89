// Tests every CPU backend op against straightforward double-precision
// references written here, at every kernel level this machine supports
// ("scalar", "avx2", "avx512"), and the SIMD levels against the scalar one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"

namespace strata {
namespace {

// Host storage of one dtype with a float view for references.
struct HostTensor {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0, stride = 0;
  std::vector<uint8_t> bytes;

  HostTensor(DType t, int64_t r, int64_t c, int64_t s = 0)
      : dtype(t), rows(r), cols(c), stride(s ? s : c) {
    bytes.assign(static_cast<size_t>(std::max<int64_t>(1, r * stride)) * DTypeSize(t), 0);
  }
  Tensor view() { return Tensor{bytes.data(), dtype, rows, cols, stride}; }
  float get(int64_t r, int64_t c) const {
    const int64_t i = r * stride + c;
    switch (dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, &bytes[i * 4], 4);
        return f;
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, &bytes[i * 2], 2);
        return Bf16ToFloat(h);
      }
      default: {
        uint16_t h;
        std::memcpy(&h, &bytes[i * 2], 2);
        return F16ToFloat(h);
      }
    }
  }
  void set(int64_t r, int64_t c, float v) {
    const int64_t i = r * stride + c;
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&bytes[i * 4], &v, 4);
        return;
      case DType::kBF16: {
        uint16_t h = FloatToBf16(v);
        std::memcpy(&bytes[i * 2], &h, 2);
        return;
      }
      default: {
        uint16_t h = FloatToF16(v);
        std::memcpy(&bytes[i * 2], &h, 2);
        return;
      }
    }
  }
  void Fill(std::mt19937& rng, float scale = 1.f) {
    std::normal_distribution<float> d(0.f, scale);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) set(r, c, d(rng));
  }
};

std::vector<std::string> SupportedIsas() {
  std::vector<std::string> isas = {"scalar"};
  const auto& f = cpu::DetectCpuFeatures();
  if (f.avx2) isas.push_back("avx2");
  if (f.avx512) isas.push_back("avx512");
  return isas;
}

std::unique_ptr<Backend> MakeBackend(const std::string& isa, int threads = 2,
                                     const std::string& precision = "fp32") {
  CpuBackendOptions o;
  o.isa = isa;
  o.num_threads = threads;
  o.matmul_precision = precision;
  auto b = CreateCpuBackend(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

class CpuBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { backend_ = MakeBackend(GetParam()); }
  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{1234};
};

// ---- Linear ----

struct LinearCase {
  int64_t n, k, m;
};

// Checks out against a double reference; error bound relative to sum |x*w|.
void CheckLinear(Backend* b, DType wt, LinearCase c, bool bias, bool strided, std::mt19937& rng,
                 bool bf16_inputs = false) {
  const int64_t pad = strided ? 3 : 0;
  HostTensor xbuf(DType::kF32, c.n, c.k + pad + 2), w(wt, c.m, c.k, c.k + pad),
      out(DType::kF32, c.n, c.m + pad);
  HostTensor bias_t(wt, 1, c.m);
  xbuf.Fill(rng);
  w.Fill(rng, 0.5f);
  bias_t.Fill(rng);
  Tensor x =
      strided ? xbuf.view().Cols(2, c.k) : Tensor{xbuf.bytes.data(), DType::kF32, c.n, c.k, 0};
  const int64_t x_off = strided ? 2 : 0, x_stride = strided ? xbuf.stride : c.k;
  Tensor o = out.view().Cols(0, c.m);
  Tensor bt = bias_t.view();
  b->Linear(x, w.view(), bias ? &bt : nullptr, o);
  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t j = 0; j < c.m; ++j) {
      double ref = bias ? bias_t.get(0, j) : 0.0, mag = std::abs(ref);
      for (int64_t i = 0; i < c.k; ++i) {
        float xv = xbuf.get(0, r * x_stride + x_off + i);
        float wv = w.get(j, i);
        if (bf16_inputs) xv = Bf16ToFloat(FloatToBf16(xv)), wv = Bf16ToFloat(FloatToBf16(wv));
        ref += static_cast<double>(xv) * wv;
        mag += std::abs(static_cast<double>(xv) * wv);
      }
      ASSERT_NEAR(out.get(r, j), ref, 2e-6 * mag + 1e-6)
          << "dtype " << DTypeName(wt) << " n=" << c.n << " k=" << c.k << " m=" << c.m << " at "
          << r << "," << j;
    }
  }
}

TEST_P(CpuBackendTest, LinearMatchesReference) {
  const LinearCase cases[] = {{1, 64, 33}, {2, 7, 5},  {3, 100, 17},  {4, 128, 70},
                              {5, 64, 33}, {13, 1, 9}, {37, 300, 70}, {1, 33, 1}};
  for (DType wt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const LinearCase& c : cases) {
      CheckLinear(backend_.get(), wt, c, /*bias=*/c.n % 2 == 1, /*strided=*/c.m % 2 == 1, rng_);
    }
  }
}

TEST_P(CpuBackendTest, LinearCrossesGemmBlocks) {
  // More rows and a longer k than one gemm block, column count not a
  // multiple of the panel width, strided everything.
  CheckLinear(backend_.get(), DType::kBF16, {800, 520, 40}, true, true, rng_);
  CheckLinear(backend_.get(), DType::kF32, {30, 257, 100}, false, true, rng_);
  // Columns past one group of packed panels (8 x 16 at AVX2, 8 x 32 at
  // AVX-512) per thread, ending in a partial panel: the next group's prefetch
  // and the group tail.
  CheckLinear(backend_.get(), DType::kF16, {20, 300, 2 * 8 * 32 * 2 + 18}, true, false, rng_);
}

TEST_P(CpuBackendTest, LinearGemmEdgesAndThreadSplits) {
  // The avx512 loop nest's edges (kernels_avx512.cc Gemm512T): past one
  // 1024-row block with a 6-row tail; K over 2048, cut into 3 equal k blocks
  // that accumulate onto the output, with a 5-row tile; and 1-4 threads, whose
  // column ranges (>= 128 columns each) end in a group of 2 panels whose
  // second is partial (300 = 128 + 128 + 32 + 12).
  CheckLinear(backend_.get(), DType::kBF16, {1030, 37, 70}, true, false, rng_);
  CheckLinear(backend_.get(), DType::kF32, {29, 4100, 45}, false, true, rng_);
  for (int threads : {1, 2, 3, 4}) {
    auto b = MakeBackend(GetParam(), threads);
    CheckLinear(b.get(), DType::kF16, {17, 64, 300}, true, true, rng_);
    CheckLinear(b.get(), DType::kBF16, {12, 2049, 77}, false, false, rng_);
  }
}

TEST(CpuBackendBf16Matmul, MatchesBf16RoundedReference) {
  if (!cpu::DetectCpuFeatures().avx512_bf16) GTEST_SKIP() << "no AVX512_BF16";
  auto b = MakeBackend("avx512", 2, "bf16");
  std::mt19937 rng(7);
  for (DType wt : {DType::kBF16, DType::kF32, DType::kF16}) {
    CheckLinear(b.get(), wt, {37, 301, 70}, true, true, rng, /*bf16_inputs=*/true);
    CheckLinear(b.get(), wt, {800, 520, 40}, false, false, rng, /*bf16_inputs=*/true);
    // Decode-sized calls stay exact F32.
    CheckLinear(b.get(), wt, {2, 64, 33}, true, false, rng, /*bf16_inputs=*/false);
  }
}

// LinearArgs over HostTensors (kernel tests call the kernels directly).
cpu::LinearArgs KernelArgs(const HostTensor& x, const HostTensor& w, const HostTensor& bias,
                           HostTensor& out) {
  cpu::LinearArgs a;
  a.x = reinterpret_cast<const float*>(x.bytes.data());
  a.x_stride = x.stride;
  a.n = x.rows;
  a.k = x.cols;
  a.w = w.bytes.data();
  a.w_dtype = w.dtype;
  a.w_stride = w.stride;
  a.bias = reinterpret_cast<const float*>(bias.bytes.data());
  a.out = reinterpret_cast<float*>(out.bytes.data());
  a.out_stride = out.stride;
  return a;
}

// Both bf16 kernels directly (the backend picks only one of them): blocks of
// 32 rows plus a row tail, a k tail that is not a multiple of 32, a partial
// column panel, bias, and accumulation over several k blocks.
TEST(CpuBackendBf16Matmul, VnniAndAmxKernelsMatchReference) {
  const auto& f = cpu::DetectCpuFeatures();
  if (!f.avx512_bf16) GTEST_SKIP() << "no AVX512_BF16";
  std::vector<std::pair<const char*, decltype(cpu::CpuKernels::gemm)>> kernels = {
      {"vdpbf16ps", cpu::Avx512Kernels()->gemm_bf16}};
  if (f.amx_bf16 && cpu::RequestAmxPermission())
    kernels.push_back({"amx", cpu::Avx512Kernels()->gemm_bf16_amx});
  std::mt19937 rng(11);
  const int64_t n = 70, k = 1100, m = 50;
  HostTensor x(DType::kF32, n, k), w(DType::kBF16, m, k), bias(DType::kF32, 1, m);
  x.Fill(rng);
  w.Fill(rng, 0.5f);
  bias.Fill(rng);
  const int64_t xbs = (k + 31) / 32 * 32;
  std::vector<uint16_t> xb(n * xbs, 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) xb[r * xbs + c] = FloatToBf16(x.get(r, c));
  std::vector<char> scratch(cpu::kGemmScratchBytes + 64);
  void* aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  for (auto [name, gemm] : kernels) {
    HostTensor out(DType::kF32, n, m);
    cpu::LinearArgs a = KernelArgs(x, w, bias, out);
    a.xb = xb.data();
    a.xb_stride = xbs;
    gemm(a, 0, 32, aligned);  // one full panel
    gemm(a, 32, m, aligned);  // a partial one
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < m; ++j) {
        double ref = bias.get(0, j), mag = std::abs(ref);
        for (int64_t i = 0; i < k; ++i) {
          const double p = double(Bf16ToFloat(xb[r * xbs + i])) * w.get(j, i);
          ref += p;
          mag += std::abs(p);
        }
        ASSERT_NEAR(out.get(r, j), ref, 2e-6 * mag + 1e-6) << name << " at " << r << "," << j;
      }
  }
}

// The GEMV kernel of every ISA level here directly, with both stream counts
// (the backend picks one per CPU: kernels.h GemvStreams): 1-5 x rows (the
// 4-row blocks and a tail), k with no tail, a tail past the 2-chain unroll
// and a tail past the lanes, and column ranges whose length is not a
// multiple of the streams, starting past 0.
TEST(CpuKernels, GemvMatchesReferenceWithTwoAndFourStreams) {
  const auto& f = cpu::DetectCpuFeatures();
  std::vector<std::pair<const char*, const cpu::CpuKernels*>> sets = {
      {"scalar", cpu::ScalarKernels()}};
  if (f.avx2) sets.push_back({"avx2", cpu::Avx2Kernels()});
  if (f.avx512) sets.push_back({"avx512", cpu::Avx512Kernels()});
  std::mt19937 rng(23);
  for (DType wt : {DType::kBF16, DType::kF16, DType::kF32})
    for (int64_t k : {896, 80, 37})
      for (int64_t n : {1, 2, 5}) {
        const int64_t m = 23;
        HostTensor x(DType::kF32, n, k), w(wt, m, k, k + 3), bias(DType::kF32, 1, m);
        x.Fill(rng);
        w.Fill(rng, 0.5f);
        bias.Fill(rng);
        for (auto [name, kernels] : sets)
          for (int streams : {2, 4}) {
            HostTensor out(DType::kF32, n, m);
            cpu::LinearArgs a = KernelArgs(x, w, bias, out);
            a.gemv_streams = streams;
            kernels->gemv(a, 0, 2);
            kernels->gemv(a, 2, 13);
            kernels->gemv(a, 13, m);
            for (int64_t r = 0; r < n; ++r)
              for (int64_t j = 0; j < m; ++j) {
                double ref = bias.get(0, j), mag = std::abs(ref);
                for (int64_t i = 0; i < k; ++i) {
                  const double p = double(x.get(r, i)) * w.get(j, i);
                  ref += p;
                  mag += std::abs(p);
                }
                ASSERT_NEAR(out.get(r, j), ref, 1e-6 * mag + 1e-6)
                    << name << " streams " << streams << " " << DTypeName(wt) << " k " << k
                    << " n " << n << " at " << r << "," << j;
              }
          }
      }
}

// ---- elementwise ----

TEST_P(CpuBackendTest, EmbeddingConvertsRows) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    HostTensor table(t, 10, 12);
    table.Fill(rng_);
    HostTensor out(DType::kF32, 3, 12);
    const int32_t ids[] = {9, 0, 9};
    backend_->Embedding(table.view(), ids, out.view());
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 12; ++c) EXPECT_EQ(out.get(r, c), table.get(ids[r], c));
  }
}

TEST_P(CpuBackendTest, RmsNormInPlaceAndStrided) {
  for (DType wt : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : {1, 3, 64}) {
      const int64_t d = 896;
      HostTensor x(DType::kF32, rows, d + 4), w(wt, 1, d);
      x.Fill(rng_, 3.f);
      w.Fill(rng_);
      HostTensor orig = x;
      Tensor xv = x.view().Cols(0, d);
      backend_->RmsNorm(xv, w.view(), 1e-6f, xv);  // in place
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t c = 0; c < d; ++c) ss += double(orig.get(r, c)) * orig.get(r, c);
        const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
        for (int64_t c = 0; c < d; ++c) {
          const double ref = orig.get(r, c) * inv * w.get(0, c);
          ASSERT_NEAR(x.get(r, c), ref, 1e-5 * std::abs(ref) + 1e-6);
        }
        for (int64_t c = d; c < d + 4; ++c)
          ASSERT_EQ(x.get(r, c), orig.get(r, c)) << "wrote past the view";
      }
    }
  }
}

TEST_P(CpuBackendTest, SiluMulAndAdd) {
  for (int64_t rows : {1, 100}) {
    const int64_t d = 500;
    HostTensor g(DType::kF32, rows, d), u(DType::kF32, rows, d), o(DType::kF32, rows, d + 2);
    g.Fill(rng_, 4.f);
    u.Fill(rng_);
    const float extremes[] = {-200.f, -90.f, -87.5f, 88.5f, 90.f, 200.f, 0.f, -0.f};
    for (int i = 0; i < 8; ++i) g.set(0, 3 * i, extremes[i]);  // exp's clamped range
    backend_->SiluMul(g.view(), u.view(), o.view().Cols(1, d));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) {
        const double gv = g.get(r, c);
        const double ref = gv / (1 + std::exp(-gv)) * u.get(r, c);
        ASSERT_NEAR(o.get(r, c + 1), ref, 1e-5 * std::abs(ref) + 1e-6);
      }
    HostTensor a = g;
    backend_->Add(a.view(), u.view(), a.view());  // aliasing a
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) ASSERT_EQ(a.get(r, c), g.get(r, c) + u.get(r, c));
  }
}

// The fused seams' defaults (LinearGroup, LinearSiluMul, AddRmsNorm) are the unfused ops
// to the bit, so models written against them stay exact on the CPU.
TEST_P(CpuBackendTest, FusedSeamsEqualTheUnfusedOps) {
  for (int64_t rows : {1, 5}) {
    const int64_t k = 96;
    HostTensor x(DType::kF32, rows, k), wq(DType::kBF16, 64, k), wk(DType::kBF16, 16, k),
        bq(DType::kBF16, 1, 64);
    x.Fill(rng_);
    wq.Fill(rng_, 0.5f);
    wk.Fill(rng_, 0.5f);
    bq.Fill(rng_);
    HostTensor q(DType::kF32, rows, 64), kk(DType::kF32, rows, 16), q1 = q, k1 = kk;
    const Tensor bt = bq.view();
    const LinearPart parts[] = {{wq.view(), &bt, q.view()}, {wk.view(), nullptr, kk.view()}};
    backend_->LinearGroup(x.view(), parts);
    backend_->Linear(x.view(), wq.view(), &bt, q1.view());
    backend_->Linear(x.view(), wk.view(), nullptr, k1.view());
    EXPECT_EQ(q.bytes, q1.bytes);
    EXPECT_EQ(kk.bytes, k1.bytes);

    HostTensor wu(DType::kBF16, 64, k), act(DType::kF32, rows, 64), up = act, act1 = act, up1 = act;
    wu.Fill(rng_, 0.5f);
    backend_->LinearSiluMul(x.view(), {wq.view(), &bt, q.view()}, {wu.view(), nullptr, up.view()},
                            act.view());
    backend_->Linear(x.view(), wq.view(), &bt, act1.view());
    backend_->Linear(x.view(), wu.view(), nullptr, up1.view());
    backend_->SiluMul(act1.view(), up1.view(), act1.view());
    EXPECT_EQ(act.bytes, act1.bytes);

    HostTensor r(DType::kF32, rows, k), d(DType::kF32, rows, k), w(DType::kBF16, 1, k),
        out(DType::kF32, rows, k);
    r.Fill(rng_, 3.f);
    d.Fill(rng_);
    w.Fill(rng_);
    HostTensor r1 = r, out1 = out;
    backend_->AddRmsNorm(r.view(), d.view(), w.view(), 1e-5f, out.view());
    backend_->Add(r1.view(), d.view(), r1.view());
    backend_->RmsNorm(r1.view(), w.view(), 1e-5f, out1.view());
    EXPECT_EQ(r.bytes, r1.bytes);
    EXPECT_EQ(out.bytes, out1.bytes);
  }
}

TEST_P(CpuBackendTest, GatherRows) {
  HostTensor x(DType::kF32, 5, 7), out(DType::kF32, 2, 7);
  x.Fill(rng_);
  const int32_t rows[] = {4, 1};
  backend_->GatherRows(x.view(), rows, out.view());
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 7; ++c) EXPECT_EQ(out.get(r, c), x.get(rows[r], c));
}

TEST_P(CpuBackendTest, RopeRotateHalfWithPartialRotary) {
  const int hd = 16, heads = 3, kv_heads = 1, rot = 8;
  const int64_t n = 40;
  std::vector<float> inv_freq(rot / 2);
  for (int i = 0; i < rot / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / rot);
  RopeParams rp{inv_freq.data(), hd, rot, 1.f};
  HostTensor q(DType::kF32, n, heads * hd), k(DType::kF32, n, kv_heads * hd);
  q.Fill(rng_);
  k.Fill(rng_);
  HostTensor q0 = q, k0 = k;
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 37 % 1000);
  backend_->Rope(q.view(), k.view(), pos.data(), rp);
  auto check = [&](const HostTensor& before, const HostTensor& after, int nh) {
    for (int64_t r = 0; r < n; ++r)
      for (int h = 0; h < nh; ++h)
        for (int i = 0; i < hd; ++i) {
          const int c = h * hd + i;
          double ref = before.get(r, c);
          if (i < rot) {
            const int j = i % (rot / 2);
            const double f = double(float(pos[r]) * inv_freq[j]);
            const double x1 = before.get(r, h * hd + j), x2 = before.get(r, h * hd + j + rot / 2);
            ref = i < rot / 2 ? x1 * std::cos(f) - x2 * std::sin(f)
                              : x2 * std::cos(f) + x1 * std::sin(f);
          }
          ASSERT_NEAR(after.get(r, c), ref, 1e-5) << r << " " << c;
        }
  };
  check(q0, q, heads);
  check(k0, k, kv_heads);
}

// MLA's layout: each head is [nope | rotary] (offset = nope), pairs
// interleaved; k rotates in a second call with its own head shape (k empty
// in the first). Reference: transformers' apply_rotary_pos_emb_interleave.
TEST_P(CpuBackendTest, RopeInterleavedAtOffsetAndQOnly) {
  const int nope = 6, rot = 8, hd = nope + rot, heads = 3;
  const int64_t n = 17;
  std::vector<float> inv_freq(rot / 2);
  for (int i = 0; i < rot / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / rot);
  RopeParams rp{inv_freq.data(), hd, rot, 0.5f, nope, true};
  HostTensor q(DType::kF32, n, heads * hd);
  q.Fill(rng_);
  HostTensor q0 = q;
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 53 % 700);
  const Tensor none{nullptr, DType::kF32, n, 0, 0};
  backend_->Rope(q.view(), none, pos.data(), rp);
  for (int64_t r = 0; r < n; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd; ++i) {
        const int c = h * hd + i;
        double ref = q0.get(r, c);
        if (i >= nope) {
          const int d = i - nope, j = d % (rot / 2);
          const double f = double(float(pos[r]) * inv_freq[j]);
          const double cs = 0.5 * std::cos(f), sn = 0.5 * std::sin(f);
          const double x1 = q0.get(r, h * hd + nope + 2 * j),
                       x2 = q0.get(r, h * hd + nope + 2 * j + 1);
          ref = d < rot / 2 ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
        }
        ASSERT_NEAR(q.get(r, c), ref, 1e-5) << r << " " << c;
      }
}

TEST_P(CpuBackendTest, ScaleAddRowsAddsInPlaceOnlyToTheNamedRows) {
  HostTensor x(DType::kF32, 3, 5000), out(DType::kF32, 6, 5000, 5003);
  x.Fill(rng_);
  out.Fill(rng_);
  HostTensor before = out;
  std::vector<int32_t> rows = {4, 0, 2};
  std::vector<float> scales = {0.5f, -2.f, 3.f};
  backend_->ScaleAddRows(x.view(), rows.data(), scales.data(), out.view());
  for (int r = 0; r < 6; ++r) {
    int i = -1;
    for (int j = 0; j < 3; ++j)
      if (rows[j] == r) i = j;
    for (int c = 0; c < 5000; ++c) {
      const float want = i < 0 ? before.get(r, c) : before.get(r, c) + scales[i] * x.get(i, c);
      ASSERT_EQ(out.get(r, c), want) << r << " " << c;
    }
  }
}

// ---- KV cache and attention ----

struct PagedKv {
  KvLayerView view;
  std::vector<uint8_t> k, v;
  PagedKv(DType t, int page_size, int kv_heads, int hd, int64_t pages) {
    const size_t bytes = size_t(pages) * page_size * kv_heads * hd * DTypeSize(t);
    k.assign(bytes, 0xff);  // NaN garbage where nothing was stored
    v.assign(bytes, 0xff);
    view = KvLayerView{k.data(), v.data(), t, page_size, kv_heads, hd, pages};
  }
};

TEST_P(CpuBackendTest, StoreKvConvertsIntoSlots) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    PagedKv kv(t, 4, 2, 8, 3);
    HostTensor k(DType::kF32, 2, 16), v(DType::kF32, 2, 16);
    k.Fill(rng_);
    v.Fill(rng_);
    const int64_t slots[] = {11, 2};
    backend_->StoreKv(k.view(), v.view(), kv.view, slots);
    HostTensor kp(t, 12, 16), vp(t, 12, 16);
    kp.bytes = kv.k;
    vp.bytes = kv.v;
    for (int i = 0; i < 2; ++i)
      for (int c = 0; c < 16; ++c) {
        HostTensor rounded(t, 1, 1);
        rounded.set(0, 0, k.get(i, c));
        EXPECT_EQ(kp.get(slots[i], c), rounded.get(0, 0));
        rounded.set(0, 0, v.get(i, c));
        EXPECT_EQ(vp.get(slots[i], c), rounded.get(0, 0));
      }
  }
}

// A K-only layer (an MLA latent pool): v is ignored and never written.
TEST_P(CpuBackendTest, StoreKvIntoAKOnlyLayerWritesKAlone) {
  PagedKv kv(DType::kBF16, 2, 1, 12, 4);
  kv.view.v = nullptr;
  HostTensor k(DType::kF32, 3, 12);
  k.Fill(rng_);
  const Tensor none{nullptr, DType::kF32, 3, 0, 0};
  const int64_t slots[] = {7, 0, 3};
  backend_->StoreKv(k.view(), none, kv.view, slots);
  HostTensor kp(DType::kBF16, 8, 12);
  kp.bytes = kv.k;
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 12; ++c) {
      HostTensor rounded(DType::kBF16, 1, 1);
      rounded.set(0, 0, k.get(i, c));
      EXPECT_EQ(kp.get(slots[i], c), rounded.get(0, 0));
    }
  EXPECT_TRUE(std::all_of(kv.v.begin(), kv.v.end(), [](uint8_t b) { return b == 0xff; }));
}

struct SeqSpec {
  int q_len, kv_len;
  int shares_prefix_of = -1;  // reuse this earlier seq's full pages (same tokens)
};

// Builds a batch: per sequence dense K/V of kv_len tokens, scattered over a
// random page table via StoreKv, and checks PagedAttention against dense
// attention computed in double from the same (dtype-rounded) values.
void CheckAttention(Backend* b, DType kv_dtype, int page_size, int heads, int kv_heads, int hd,
                    int window, const std::vector<SeqSpec>& specs, std::mt19937& rng) {
  const int num_seqs = static_cast<int>(specs.size());
  int64_t total_pages = 0, total_q = 0;
  for (const auto& s : specs)
    total_pages += (s.kv_len + page_size - 1) / page_size, total_q += s.q_len;
  total_pages += 3;  // unused pages in between
  PagedKv kv(kv_dtype, page_size, kv_heads, hd, total_pages);
  std::vector<int32_t> free_pages(total_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);

  const int64_t e = int64_t(kv_heads) * hd;
  std::vector<HostTensor> keys, values;  // dense per seq, dtype-rounded
  std::vector<std::vector<int32_t>> tables(num_seqs);
  std::vector<AttentionSeq> seqs(num_seqs);
  HostTensor q(DType::kF32, total_q, int64_t(heads) * hd),
      out(DType::kF32, total_q, int64_t(heads) * hd);
  q.Fill(rng);
  int q_start = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const SeqSpec& sp = specs[s];
    HostTensor kd(DType::kF32, sp.kv_len, e), vd(DType::kF32, sp.kv_len, e);
    kd.Fill(rng);
    vd.Fill(rng);
    int shared_tokens = 0;
    const int pages = (sp.kv_len + page_size - 1) / page_size;
    if (sp.shares_prefix_of >= 0) {
      const int src = sp.shares_prefix_of;
      const int full = std::min(specs[src].kv_len, sp.kv_len) / page_size;
      shared_tokens = full * page_size;
      for (int p = 0; p < full; ++p) tables[s].push_back(tables[src][p]);
      for (int t = 0; t < shared_tokens; ++t)
        for (int c = 0; c < e; ++c)
          kd.set(t, c, keys[src].get(t, c)), vd.set(t, c, values[src].get(t, c));
    }
    while (int(tables[s].size()) < pages) {
      tables[s].push_back(free_pages.back());
      free_pages.pop_back();
    }
    // Store the non-shared tokens through the backend.
    std::vector<int64_t> slots;
    HostTensor ks(DType::kF32, sp.kv_len - shared_tokens, e),
        vs(DType::kF32, sp.kv_len - shared_tokens, e);
    for (int t = shared_tokens; t < sp.kv_len; ++t) {
      slots.push_back(int64_t(tables[s][t / page_size]) * page_size + t % page_size);
      for (int c = 0; c < e; ++c)
        ks.set(t - shared_tokens, c, kd.get(t, c)), vs.set(t - shared_tokens, c, vd.get(t, c));
    }
    if (!slots.empty()) b->StoreKv(ks.view(), vs.view(), kv.view, slots.data());
    // Round the dense copy as the cache stores it.
    for (int t = 0; t < sp.kv_len; ++t)
      for (int c = 0; c < e; ++c) {
        HostTensor r(kv_dtype, 1, 2);
        r.set(0, 0, kd.get(t, c));
        r.set(0, 1, vd.get(t, c));
        kd.set(t, c, r.get(0, 0));
        vd.set(t, c, r.get(0, 1));
      }
    keys.push_back(kd);
    values.push_back(vd);
    seqs[s] = AttentionSeq{q_start, sp.q_len, sp.kv_len, nullptr};
    q_start += sp.q_len;
  }
  for (int s = 0; s < num_seqs; ++s) seqs[s].page_table = tables[s].data();

  AttentionParams params{heads, kv_heads, hd, 1.f / std::sqrt(float(hd)), window};
  b->PagedAttention(q.view(), kv.view, seqs.data(), num_seqs, params, out.view());

  const int group = heads / kv_heads;
  for (int s = 0; s < num_seqs; ++s) {
    for (int i = 0; i < specs[s].q_len; ++i) {
      const int row = seqs[s].q_start + i;
      const int pos = specs[s].kv_len - specs[s].q_len + i;
      const int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
      for (int h = 0; h < heads; ++h) {
        const int g = h / group;
        std::vector<double> sc;
        double mx = -1e300;
        for (int p = lo; p <= pos; ++p) {
          double d = 0;
          for (int c = 0; c < hd; ++c)
            d += double(q.get(row, h * hd + c)) * keys[s].get(p, g * hd + c);
          sc.push_back(d * params.scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int c = 0; c < hd; ++c) {
          double ref = 0;
          for (int p = lo; p <= pos; ++p) ref += sc[p - lo] / sum * values[s].get(p, g * hd + c);
          ASSERT_NEAR(out.get(row, h * hd + c), ref, 2e-5)
              << "seq " << s << " token " << i << " head " << h << " dim " << c << " page_size "
              << page_size;
        }
      }
    }
  }
}

TEST_P(CpuBackendTest, PagedAttentionMatchesDense) {
  // Prefill, decode, chunked prefill (q_len < kv_len) and a sequence that
  // shares the first pages of another, in one batch.
  const std::vector<SeqSpec> batch = {{37, 37}, {1, 50}, {9, 70}, {3, 45, 0}, {1, 1}};
  for (int page_size : {1, 4, 16}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      CheckAttention(backend_.get(), t, page_size, 6, 2, 64, 0, batch, rng_);
    }
  }
}

TEST_P(CpuBackendTest, PagedAttentionSlidingWindowAndShapes) {
  const std::vector<SeqSpec> batch = {{20, 20}, {1, 77}, {5, 40}};
  CheckAttention(backend_.get(), DType::kF32, 4, 4, 4, 40, 8, batch,
                 rng_);  // MHA, odd head_dim, window
  CheckAttention(backend_.get(), DType::kF16, 16, 20, 1, 32, 0, batch,
                 rng_);  // group of 20 > 16: chunked
  CheckAttention(backend_.get(), DType::kBF16, 1, 8, 2, 128, 33, batch, rng_);
  // Prefill blocks of 16 tokens (avx512 attention_block) whose rows' windows
  // (5) start inside a KV block or miss it entirely, and 7 heads per group as
  // Qwen2.5-0.5B, with a partial last block.
  CheckAttention(backend_.get(), DType::kF32, 4, 14, 2, 64, 5, {{40, 40}, {21, 60}, {1, 9}}, rng_);
  CheckAttention(backend_.get(), DType::kF32, 16, 14, 2, 64, 0, {{50, 50}, {17, 70}}, rng_);
  // Decode tokens of groups of >= 4 heads also take attention_block: long
  // contexts, contexts of exactly one KV block, a window ending mid-block.
  CheckAttention(backend_.get(), DType::kF16, 16, 8, 2, 64, 0, {{1, 300}, {1, 16}, {1, 17}}, rng_);
  CheckAttention(backend_.get(), DType::kBF16, 4, 16, 4, 128, 21, {{1, 90}, {1, 3}}, rng_);
}

// ---- SIMD levels against the scalar reference path ----

TEST_P(CpuBackendTest, AgreesWithScalarKernels) {
  auto scalar = MakeBackend("scalar", 1);
  for (DType wt : {DType::kBF16, DType::kF32}) {
    for (int64_t n : {1, 3, 20}) {
      HostTensor x(DType::kF32, n, 896), w(wt, 200, 896), o1(DType::kF32, n, 200),
          o2(DType::kF32, n, 200);
      x.Fill(rng_);
      w.Fill(rng_, 0.1f);
      backend_->Linear(x.view(), w.view(), nullptr, o1.view());
      scalar->Linear(x.view(), w.view(), nullptr, o2.view());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < 200; ++j)
          ASSERT_NEAR(o1.get(r, j), o2.get(r, j), 1e-4) << r << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuBackendTest, ::testing::ValuesIn(SupportedIsas()),
                         [](const auto& info) { return info.param; });

// ---- CopyBlocks ----

// Blocks of the given sizes copied from one source buffer to scattered,
// gapped places in a destination buffer; checks every byte copied exactly
// and no byte outside the blocks written.
struct CopyCase {
  std::vector<uint8_t> src, dst;
  std::vector<CopyBlock> blocks;
  std::vector<size_t> dst_off;

  CopyCase(const std::vector<size_t>& sizes, std::mt19937& rng) {
    size_t src_total = 0, dst_total = 0;
    std::vector<size_t> src_off;
    for (size_t n : sizes) {
      src_off.push_back(src_total);
      src_total += n;
    }
    // Destinations in shuffled order with gaps of 0..63 bytes (odd alignments too).
    std::vector<size_t> order(sizes.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    dst_off.assign(sizes.size(), 0);
    for (size_t i : order) {
      dst_total += rng() % 64;
      dst_off[i] = dst_total;
      dst_total += sizes[i];
    }
    src.resize(src_total + 1);
    dst.assign(dst_total + 64, 0xEE);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < sizes.size(); ++i)
      blocks.push_back(CopyBlock{dst.data() + dst_off[i], src.data() + src_off[i], sizes[i]});
  }

  void Check() const {
    std::vector<bool> covered(dst.size(), false);
    for (size_t i = 0; i < blocks.size(); ++i) {
      ASSERT_EQ(std::memcmp(blocks[i].dst, blocks[i].src, blocks[i].bytes), 0)
          << "block " << i << " of " << blocks.size() << " (" << blocks[i].bytes
          << " bytes) differs";
      for (size_t j = 0; j < blocks[i].bytes; ++j) covered[dst_off[i] + j] = true;
    }
    for (size_t j = 0; j < dst.size(); ++j)
      if (!covered[j]) {
        ASSERT_EQ(dst[j], 0xEE) << "byte " << j << " outside every block was written";
      }
  }
};

std::unique_ptr<Backend> MakeCopyBackend(int copy_threads) {
  CpuBackendOptions o;
  o.num_threads = 2;
  o.copy_threads = copy_threads;
  auto b = CreateCpuBackend(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

TEST(CpuCopyBlocksTest, CopiesEveryByteOfManySizes) {
  std::mt19937 rng(7);
  const std::vector<std::vector<size_t>> cases = {
      {},         // nothing
      {0, 0},     // only empty blocks
      {1},        // one byte
      {16384},    // one page of one layer, below the parallel threshold
      {5 << 20},  // one big block: split across threads
      {(3 << 20) + 3, 0, 1, (1 << 20) + 4093},  // odd sizes around task cuts
  };
  for (int threads : {1, 2, 3, 5}) {
    auto b = MakeCopyBackend(threads);
    EXPECT_NE(b->Name().find(std::to_string(threads) + " copy threads"), std::string::npos)
        << b->Name();
    std::vector<std::vector<size_t>> all = cases;
    // 512 page-sized blocks (a 32-page, 16-layer load-back) and random mixes.
    all.push_back(std::vector<size_t>(512, 16384));
    // Past the streaming-store threshold (64 MiB): odd sizes and alignments.
    std::vector<size_t> big(1100);
    for (size_t& n : big) n = 60000 + rng() % 10000;
    all.push_back(big);
    for (int r = 0; r < 4; ++r) {
      std::vector<size_t> sizes(1 + rng() % 300);
      for (size_t& n : sizes) n = rng() % 3 == 0 ? rng() % 100 : rng() % 70000;
      all.push_back(sizes);
    }
    for (const auto& sizes : all) {
      CopyCase c(sizes, rng);
      for (CopyKind kind : {CopyKind::kHostToDevice, CopyKind::kDeviceToHost}) {
        std::fill(c.dst.begin(), c.dst.end(), 0xEE);
        ASSERT_TRUE(b->CopyBlocks(c.blocks, kind).ok());
        SCOPED_TRACE("copy_threads " + std::to_string(threads) + ", " +
                     std::to_string(sizes.size()) + " blocks");
        c.Check();
      }
    }
  }
}

// The HiCache controller copies while the engine thread computes, and a
// second caller may copy at the same time: both stay exact.
TEST(CpuCopyBlocksTest, ConcurrentCallersAndComputeStayExact) {
  auto b = MakeCopyBackend(3);
  constexpr int kCallers = 3, kRounds = 12;
  std::vector<std::thread> callers;
  std::vector<int> failures(kCallers, 0);
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      for (int r = 0; r < kRounds; ++r) {
        std::vector<size_t> sizes(1 + rng() % 200);
        for (size_t& n : sizes) n = rng() % 40000;
        CopyCase c(sizes, rng);
        if (!b->CopyBlocks(c.blocks, CopyKind::kDeviceToHost).ok()) ++failures[t];
        for (const CopyBlock& blk : c.blocks)
          if (std::memcmp(blk.dst, blk.src, blk.bytes) != 0) ++failures[t];
      }
    });
  }
  // Meanwhile, ops on this ("engine") thread, checked against a backend
  // nobody else uses.
  auto reference = MakeBackend("scalar", 1);
  std::mt19937 rng(5);
  for (int r = 0; r < 6; ++r) {
    HostTensor x(DType::kF32, 8, 512), w(DType::kF32, 256, 512), o1(DType::kF32, 8, 256),
        o2(DType::kF32, 8, 256);
    x.Fill(rng);
    w.Fill(rng, 0.1f);
    b->Linear(x.view(), w.view(), nullptr, o1.view());
    reference->Linear(x.view(), w.view(), nullptr, o2.view());
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < 256; ++j) ASSERT_NEAR(o1.get(i, j), o2.get(i, j), 1e-4);
  }
  for (auto& c : callers) c.join();
  for (int t = 0; t < kCallers; ++t) EXPECT_EQ(failures[t], 0) << "caller " << t;
}

// ---- options ----

TEST(CpuBackendOptionsTest, RejectsBadOptions) {
  CpuBackendOptions o;
  o.isa = "neon";
  EXPECT_EQ(CreateCpuBackend(o).status().code(), StatusCode::kInvalidArgument);
  o.isa = "scalar";
  o.matmul_precision = "bf16";
  auto r = CreateCpuBackend(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("matmul_precision"), std::string::npos)
      << r.status().message();
  o.matmul_precision = "fp8";
  EXPECT_EQ(CreateCpuBackend(o).status().code(), StatusCode::kInvalidArgument);
  o.matmul_precision = "fp32";
  o.num_threads = -1;
  EXPECT_EQ(CreateCpuBackend(o).status().code(), StatusCode::kInvalidArgument);
  o.num_threads = 0;
  o.copy_threads = -2;
  r = CreateCpuBackend(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("copy_threads"), std::string::npos) << r.status().message();
}

TEST(CpuBackendOptionsTest, AutoUsesAllCpusByDefault) {
  auto b = CreateCpuBackend(CpuBackendOptions{});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE((*b)->Name().find("threads"), std::string::npos);
}

}  // namespace
}  // namespace strata

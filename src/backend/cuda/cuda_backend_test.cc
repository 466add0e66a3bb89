// Op parity (as llama.cpp's test-backend-ops): every CUDA backend op against
// the CPU backend's op on the same random inputs, over several shapes: page
// size 1 and 16 and one that divides nothing, GQA ratios 1/4/8, head dims
// 40/64/128, one-token and multi-token sequences, strided views, every KV
// and weight dtype. The CPU backend is itself tested against double-precision
// references (cpu_backend_test.cc).
//
// Without a CUDA device (or in a build without CUDA) every test is skipped
// with "no CUDA device: ...".
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend.h"

namespace strata {
namespace {

// Host storage of one dtype.
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

class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CudaBackendOptions o;
    auto c = CreateCudaBackend(o);
    if (!c.ok()) GTEST_SKIP() << c.status().message();
    cuda_ = std::move(c).value();
    CpuBackendOptions co;
    co.num_threads = 4;
    auto p = CreateCpuBackend(co);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    cpu_ = std::move(p).value();
  }

  // A device copy of `h` (same shape and stride), kept alive by the fixture.
  Tensor Up(const HostTensor& h) {
    auto b = cuda_->Allocate(h.bytes.size());
    EXPECT_TRUE(b.ok());
    cuda_->CopyToDevice(b->data(), h.bytes.data(), h.bytes.size());
    Tensor t{b->data(), h.dtype, h.rows, h.cols, h.stride};
    keep_.push_back(std::move(b).value());
    return t;
  }
  template <typename T>
  const T* UpArray(const std::vector<T>& v) {
    auto b = cuda_->Allocate(std::max<size_t>(1, v.size() * sizeof(T)));
    EXPECT_TRUE(b.ok());
    cuda_->CopyToDevice(b->data(), v.data(), v.size() * sizeof(T));
    const T* p = static_cast<const T*>(b->data());
    keep_.push_back(std::move(b).value());
    return p;
  }
  HostTensor Down(const Tensor& dev, const HostTensor& like) {
    HostTensor h = like;
    cuda_->Synchronize();
    cuda_->CopyToHost(h.bytes.data(), dev.data, h.bytes.size());
    return h;
  }

  std::unique_ptr<Backend> cuda_, cpu_;
  std::vector<Buffer> keep_;
  std::mt19937 rng_{20261201};
};

// Max |got - want| over the view, relative to max |want| (at least 1).
// Returns the worst difference relative to the largest |want| (at least 1).
double ExpectClose(const HostTensor& got, const HostTensor& want, double tol,
                   const std::string& what) {
  double worst = 0, mag = 1;
  int64_t wr = 0, wc = 0;
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t c = 0; c < want.cols; ++c) {
      mag = std::max(mag, std::abs(double(want.get(r, c))));
      const double d = std::abs(double(got.get(r, c)) - want.get(r, c));
      if (!(d <= worst)) worst = d, wr = r, wc = c;  // NaN counts as worst
    }
  EXPECT_LE(worst / mag, tol) << what << ": at " << wr << "," << wc << " cuda " << got.get(wr, wc)
                              << " cpu " << want.get(wr, wc);
  return worst / mag;
}

TEST_F(CudaParityTest, Embedding) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    HostTensor table(t, 37, 19);
    table.Fill(rng_);
    std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1};
    HostTensor out(DType::kF32, ids.size(), 19, 23), ref = out;
    Tensor dt = cuda_->UploadWeight(table.view()).value();
    Tensor o = Up(out);
    cuda_->Embedding(dt, UpArray(ids), o);
    cpu_->Embedding(table.view(), ids.data(), ref.view());
    ExpectClose(Down(o, out), ref, 0, std::string("Embedding ") + DTypeName(t));
  }
}

TEST_F(CudaParityTest, RmsNorm) {
  // pad 0: rows 16-byte aligned, widths in 4s: the 4-wide path (kernels.cu
  // Vec4Ok) where d allows; pad 5: element by element.
  for (int64_t pad : {5, 0})
  for (DType wt : {DType::kF32, DType::kBF16}) {
    // Fewer than 264 rows: a thread per element (up to 1024); 300: 256.
    for (auto [rows, d] : {std::pair<int64_t, int64_t>{1, 64},
                           {7, 129},
                           {33, 896},
                           {3, 4096},
                           {1, 2048},
                           {300, 2048}}) {
      HostTensor x(DType::kF32, rows, d, d + pad), w(wt, 1, d), out(DType::kF32, rows, d);
      x.Fill(rng_, 3.f);
      w.Fill(rng_);
      HostTensor ref_in = x, ref = out;
      Tensor dw = cuda_->UploadWeight(w.view()).value();
      Tensor dx = Up(x), dout = Up(out);
      cuda_->RmsNorm(dx, dw, 1e-6f, dout);
      cpu_->RmsNorm(x.view(), w.view(), 1e-6f, ref.view());
      ExpectClose(Down(dout, out), ref, 1e-6,
                  "RmsNorm " + std::to_string(rows) + "x" + std::to_string(d));
      // In place, as the decoder does for q/k norms.
      cuda_->RmsNorm(dx, dw, 1e-6f, dx);
      cpu_->RmsNorm(ref_in.view(), w.view(), 1e-6f, ref_in.view());
      ExpectClose(Down(dx, x), ref_in, 1e-6, "RmsNorm in place");
    }
  }
}

struct LinearCase {
  int64_t n, k, m;
};

// `precision` "bf16": the CPU reference gets x rounded to bf16 (what the
// CUDA tensor-core path multiplies).
void CheckLinear(Backend* cuda, Backend* cpu, DType wt, LinearCase c, bool bias, bool strided,
                 bool round_x, std::mt19937& rng, std::vector<Buffer>* keep) {
  const int64_t pad = strided ? 3 : 0;
  HostTensor x(DType::kF32, c.n, c.k, c.k + pad), w(wt, c.m, c.k), b(wt, 1, c.m);
  HostTensor out(DType::kF32, c.n, c.m, c.m + pad);
  x.Fill(rng);
  w.Fill(rng, 0.5f);
  b.Fill(rng);
  HostTensor xr = x;
  if (round_x)
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t i = 0; i < c.k; ++i) xr.set(r, i, Bf16ToFloat(FloatToBf16(x.get(r, i))));
  HostTensor ref = out;
  Tensor wt_cpu = w.view(), bt_cpu = b.view();
  cpu->Linear(xr.view(), wt_cpu, bias ? &bt_cpu : nullptr, ref.view());

  auto up = [&](const HostTensor& h) {
    Buffer buf = cuda->Allocate(h.bytes.size()).value();
    cuda->CopyToDevice(buf.data(), h.bytes.data(), h.bytes.size());
    Tensor d{buf.data(), h.dtype, h.rows, h.cols, h.stride};
    keep->push_back(std::move(buf));
    return d;
  };
  Tensor dw = cuda->UploadWeight(w.view()).value(), db = cuda->UploadWeight(b.view()).value();
  Tensor dx = up(x), dout = up(out);
  cuda->Linear(dx, dw, bias ? &db : nullptr, dout);
  HostTensor got = out;
  cuda->Synchronize();
  cuda->CopyToHost(got.bytes.data(), dout.data, got.bytes.size());
  ExpectClose(got, ref, 2e-5,
              std::string("Linear ") + DTypeName(wt) + (round_x ? " bf16 path" : "") + " n=" +
                  std::to_string(c.n) + " k=" + std::to_string(c.k) + " m=" + std::to_string(c.m));
}

const LinearCase kLinearCases[] = {{1, 64, 33},    {2, 7, 5},      {3, 100, 17},   {4, 128, 70},
                                   {5, 64, 33},    {13, 1, 9},     {37, 300, 70},  {1, 33, 1},
                                   {1, 896, 4864}, {64, 896, 151}, {300, 512, 256}};

TEST_F(CudaParityTest, LinearFp32) {
  for (DType wt : {DType::kF32, DType::kF16, DType::kBF16})
    for (const LinearCase& c : kLinearCases)
      CheckLinear(cuda_.get(), cpu_.get(), wt, c, c.n % 2 == 1, c.m % 2 == 1, false, rng_, &keep_);
}

TEST_F(CudaParityTest, LinearBf16TensorCores) {
  CudaBackendOptions o;
  o.matmul_precision = "bf16";
  auto b = CreateCudaBackend(o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::vector<Buffer> keep;
  for (const LinearCase& c : kLinearCases)
    CheckLinear(b->get(), cpu_.get(), DType::kBF16, c, c.n % 2 == 1, c.m % 2 == 1, true, rng_,
                &keep);
  keep.clear();
}

// Small-batch Linear: n <= 8 rows take the GEMV kernel (kernels.h Gemv),
// n = 9 the GEMM. Weights of every dtype go to the device as they are (not
// widened by UploadWeight); the reference gets x rounded to the weight's
// type, as the CUDA backend multiplies it (no rounding for F32 weights).
// Shapes: Llama-3.2-1B's projections, odd k (no 16-byte vectors), m not a
// multiple of the rows per block, strided and misaligned x/w/out views.
struct GemvCase {
  int64_t n, k, m;
  int64_t x_pad = 0, w_pad = 0, out_pad = 0;
  bool bias = false;
  int64_t x_offset = 0;  // x starts this many floats into its buffer
};

float RoundToDType(float v, DType t) {
  if (t == DType::kBF16) return Bf16ToFloat(FloatToBf16(v));
  if (t == DType::kF16) return F16ToFloat(FloatToF16(v));
  return v;
}

TEST_F(CudaParityTest, LinearSmallBatchGemv) {
  std::vector<GemvCase> cases;
  for (int64_t n = 1; n <= 9; ++n) cases.push_back({n, 2048, 2048});
  cases.push_back({1, 2048, 512, 0, 0, 0, true});  // k/v projection
  cases.push_back({1, 2048, 8192});                // gate/up
  cases.push_back({1, 8192, 2048});                // down
  cases.push_back({4, 8192, 2048, 0, 0, 0, true});
  cases.push_back({8, 2048, 512, 0, 0, 0, true});
  cases.push_back({1, 2048, 32768});  // lm_head-like (128256 rows in the model)
  cases.push_back({1, 2047, 300, 0, 0, 0, true});
  cases.push_back({3, 7, 5, 0, 0, 0, true});
  cases.push_back({1, 1, 9});
  cases.push_back({2, 2052, 130});  // k % 8 == 4: scalar for 16-bit, vectors for F32
  cases.push_back({5, 100, 1, 0, 0, 0, true});
  cases.push_back({1, 64, 3});
  cases.push_back({3, 2048, 256, 3, 0, 5, true});    // x rows misaligned
  cases.push_back({2, 2048, 256, 8, 8, 3});          // strided but 16-byte aligned
  cases.push_back({1, 512, 64, 0, 4});               // w rows 16-byte aligned only for F32
  cases.push_back({2, 512, 64, 0, 0, 0, false, 1});  // x base misaligned
  constexpr float kSentinel = 7.25f;
  for (DType wt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const GemvCase& c : cases) {
      const std::string what = std::string("Linear GEMV ") + DTypeName(wt) +
                               " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                               " m=" + std::to_string(c.m);
      HostTensor xh(DType::kF32, c.n, c.x_offset + c.k, c.x_offset + c.k + c.x_pad);
      xh.Fill(rng_);
      HostTensor w(wt, c.m, c.k, c.k + c.w_pad), b(wt, 1, c.m);
      w.Fill(rng_, 0.5f);
      b.Fill(rng_);
      // Reference inputs: contiguous, x rounded.
      HostTensor xr(DType::kF32, c.n, c.k), wc(wt, c.m, c.k);
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t i = 0; i < c.k; ++i) xr.set(r, i, RoundToDType(xh.get(r, c.x_offset + i), wt));
      for (int64_t r = 0; r < c.m; ++r)
        for (int64_t i = 0; i < c.k; ++i) wc.set(r, i, w.get(r, i));
      HostTensor out(DType::kF32, c.n, c.m, c.m + c.out_pad), ref(DType::kF32, c.n, c.m);
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t i = 0; i < out.stride; ++i) out.set(r, i, kSentinel);
      Tensor bt = b.view();
      cpu_->Linear(xr.view(), wc.view(), c.bias ? &bt : nullptr, ref.view());

      const Tensor dxb = Up(xh), dw = Up(w), db = Up(b), dout = Up(out);
      const Tensor dx{static_cast<float*>(dxb.data) + c.x_offset, DType::kF32, c.n, c.k, xh.stride};
      cuda_->Linear(dx, dw, c.bias ? &db : nullptr, dout);
      const HostTensor got = Down(dout, out);
      ExpectClose(got, ref, 2e-5, what);
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t i = c.m; i < out.stride; ++i)
          ASSERT_EQ(got.get(r, i), kSentinel) << what << ": wrote the padding at " << r << "," << i;
      if (c.n == 1 && c.k == 2048 && c.m == 2048) {  // fixed summation order
        cuda_->Linear(dx, dw, nullptr, dout);
        const HostTensor again = Down(dout, out);
        EXPECT_EQ(std::memcmp(again.bytes.data(), got.bytes.data(), got.bytes.size()), 0) << what;
      }
      keep_.clear();
    }
  }
}

// LinearGroup: one GEMV launch over q/k/v- and gate/up-like parts (k/v
// smaller than q, m not a multiple of the 4 rows a block owns, biases on
// some parts, a strided out, an empty part) gives each part exactly the
// bytes Linear gives it alone, and the CPU's values; more rows and mixed
// dtypes take Linear per part.
TEST_F(CudaParityTest, LinearGroupEqualsLinearPerPart) {
  struct Case {
    int64_t n, k;
    std::vector<int64_t> ms;
    bool mixed_dtypes = false;
  };
  const Case cases[] = {{1, 2048, {2048, 512, 512}}, {1, 4096, {14336, 14336}},
                        {1, 100, {33, 7, 1}},        {1, 64, {0, 9}},
                        {3, 256, {64, 30, 30}},      {1, 512, {128, 64}, true}};
  for (DType wt : {DType::kBF16, DType::kF32}) {
    for (const Case& c : cases) {
      std::string what = std::string("LinearGroup ") + DTypeName(wt) + " n=" + std::to_string(c.n) +
                         " k=" + std::to_string(c.k) + " m=";
      for (int64_t m : c.ms) what += std::to_string(m) + ",";
      HostTensor x(DType::kF32, c.n, c.k);
      x.Fill(rng_);
      const Tensor dx = Up(x);
      std::vector<HostTensor> ws, bs, outs;
      std::vector<Tensor> dws, dbs, douts, dsingle;
      for (size_t i = 0; i < c.ms.size(); ++i) {
        const DType t = c.mixed_dtypes && i == 1 ? DType::kF16 : wt;
        ws.emplace_back(t, c.ms[i], c.k);
        ws.back().Fill(rng_, 0.5f);
        bs.emplace_back(t, 1, c.ms[i]);
        bs.back().Fill(rng_);
        outs.emplace_back(DType::kF32, c.n, c.ms[i], c.ms[i] + 2);
        dws.push_back(Up(ws.back()));  // as is (UploadWeight would widen to F32 here)
        dbs.push_back(Up(bs.back()));
        douts.push_back(Up(outs.back()));
        dsingle.push_back(Up(outs.back()));
      }
      std::vector<LinearPart> parts;
      for (size_t i = 0; i < c.ms.size(); ++i)
        parts.push_back({dws[i], i % 2 == 0 ? &dbs[i] : nullptr, douts[i]});
      cuda_->LinearGroup(dx, parts);
      for (size_t i = 0; i < c.ms.size(); ++i) {
        const HostTensor got = Down(douts[i], outs[i]);
        cuda_->Linear(dx, dws[i], parts[i].bias, dsingle[i]);
        const HostTensor single = Down(dsingle[i], outs[i]);
        EXPECT_EQ(std::memcmp(got.bytes.data(), single.bytes.data(), got.bytes.size()), 0)
            << what << " part " << i << ": differs from Linear alone";
        // The CPU on x rounded to the weight's type (what the GEMV and the
        // tensor-core GEMM multiply).
        HostTensor xr = x, ref = outs[i];
        for (int64_t r = 0; r < c.n; ++r)
          for (int64_t j = 0; j < c.k; ++j) xr.set(r, j, RoundToDType(x.get(r, j), ws[i].dtype));
        Tensor bt = bs[i].view();
        cpu_->Linear(xr.view(), ws[i].view(), i % 2 == 0 ? &bt : nullptr, ref.view());
        ExpectClose(got, ref, 2e-5, what + " part " + std::to_string(i) + " vs cpu");
      }
      keep_.clear();
    }
  }
}

// LinearSiluMul: gate and up of a decode row in one launch writing
// silu(gate) * up: the bytes of LinearGroup then SiluMul on CUDA (an odd m
// leaves a block half full; biases on gate only, up only, both), the CPU's
// values; more rows take the default.
TEST_F(CudaParityTest, LinearSiluMulEqualsGroupThenSiluMul) {
  struct Case {
    int64_t n, k, m;
    bool gate_bias, up_bias;
  };
  const Case cases[] = {{1, 2048, 8192, false, false}, {1, 4096, 14336, false, false},
                        {1, 100, 33, true, false},     {1, 64, 1, false, true},
                        {1, 2047, 70, true, true},     {3, 256, 64, true, true}};
  for (DType wt : {DType::kBF16, DType::kF32}) {
    for (const Case& c : cases) {
      const std::string what = std::string("LinearSiluMul ") + DTypeName(wt) +
                               " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                               " m=" + std::to_string(c.m);
      HostTensor x(DType::kF32, c.n, c.k), wg(wt, c.m, c.k), wu(wt, c.m, c.k), bg(wt, 1, c.m),
          bu(wt, 1, c.m), out(DType::kF32, c.n, c.m);
      x.Fill(rng_, 2.f);
      wg.Fill(rng_, 0.5f);
      wu.Fill(rng_, 0.5f);
      bg.Fill(rng_);
      bu.Fill(rng_);
      const Tensor dx = Up(x), dwg = Up(wg), dwu = Up(wu), dbg = Up(bg), dbu = Up(bu);
      const Tensor dg = Up(out), du = Up(out), dout = Up(out), dg2 = Up(out), du2 = Up(out);
      const LinearPart gate{dwg, c.gate_bias ? &dbg : nullptr, dg};
      const LinearPart up{dwu, c.up_bias ? &dbu : nullptr, du};
      cuda_->LinearSiluMul(dx, gate, up, dout);
      const HostTensor got = Down(dout, out);
      const LinearPart parts[] = {{dwg, gate.bias, dg2}, {dwu, up.bias, du2}};
      cuda_->LinearGroup(dx, parts);
      cuda_->SiluMul(dg2, du2, dg2);
      const HostTensor unfused = Down(dg2, out);
      EXPECT_EQ(std::memcmp(got.bytes.data(), unfused.bytes.data(), got.bytes.size()), 0)
          << what << ": differs from LinearGroup then SiluMul";
      HostTensor xr = x, g = out, u = out, ref = out;
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t j = 0; j < c.k; ++j) xr.set(r, j, RoundToDType(x.get(r, j), wt));
      Tensor tbg = bg.view(), tbu = bu.view();
      cpu_->LinearSiluMul(xr.view(), {wg.view(), c.gate_bias ? &tbg : nullptr, g.view()},
                          {wu.view(), c.up_bias ? &tbu : nullptr, u.view()}, ref.view());
      ExpectClose(got, ref, 2e-5, what + " vs cpu");
      keep_.clear();
    }
  }
}

// The GEMM path's x in bf16 made once per input (cuda_backend.cc
// Rounded16): by RmsNorm, AddRmsNorm and SiluMul beside their output, or
// by the first of several Linears of one x. A layer's worth of ops run
// twice on bf16 backends, once as the model calls them and once with an
// unrelated op between every two (which makes any kept rounding stale, so
// every Linear converts its x): the outputs must be the same bytes, and a
// tensor changed after its rounding was made (Add into it) must be read
// as changed. The op table counts the conversions each run made.
TEST(CudaRoundedInputTest, FusedRoundingIsTheConversionAndNeverStale) {
  for (auto [n, k, m, y_pad] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{300, 512, 384, 4},
                                {17, 96, 40, 0}}) {
    const std::string what = "n=" + std::to_string(n) + " k=" + std::to_string(k);
    std::mt19937 rng(11);
    HostTensor x(DType::kF32, n, k), nw(DType::kBF16, 1, k), w1(DType::kBF16, m, k),
        w2(DType::kBF16, m, k), w3(DType::kBF16, k, m), y(DType::kF32, n, k, k + y_pad),
        a(DType::kF32, n, m), d(DType::kF32, n, k), tiny(DType::kF32, 1, 1);
    x.Fill(rng, 2.f);
    nw.Fill(rng);
    w1.Fill(rng, 0.1f);
    w2.Fill(rng, 0.1f);
    w3.Fill(rng, 0.1f);
    std::vector<HostTensor> outs[2];
    std::string tables[2];
    for (int run = 0; run < 2; ++run) {
      const bool poke = run == 1;
      setenv("STRATA_CUDA_OP_TIMING", "1", 1);
      CudaBackendOptions o;
      o.matmul_precision = "bf16";
      auto c = CreateCudaBackend(o);
      unsetenv("STRATA_CUDA_OP_TIMING");
      if (!c.ok()) GTEST_SKIP() << c.status().message();
      std::unique_ptr<Backend> b = std::move(c).value();
      std::vector<Buffer> keep;
      auto up = [&](const HostTensor& h) {
        Buffer buf = b->Allocate(h.bytes.size()).value();
        b->CopyToDevice(buf.data(), h.bytes.data(), h.bytes.size());
        Tensor t{buf.data(), h.dtype, h.rows, h.cols, h.stride};
        keep.push_back(std::move(buf));
        return t;
      };
      const Tensor dx = up(x), dnw = up(nw), dw1 = up(w1), dw2 = up(w2), dw3 = up(w3), dy = up(y),
                   da1 = up(a), da2 = up(a), ds = up(a), dd = up(d), de = up(a), dwarm = up(a),
                   dt = up(tiny);
      auto between = [&] {
        if (poke) b->Add(dt, dt, dt);
      };
      b->Linear(dx, dw1, nullptr, dwarm);  // the first GEMM: its weight type is then known
      between();
      b->RmsNorm(dx, dnw, 1e-5f, dy);
      between();
      b->Linear(dy, dw1, nullptr, da1);
      between();
      b->Linear(dy, dw2, nullptr, da2);
      between();
      b->SiluMul(da1, da2, ds);
      between();
      b->Linear(ds, dw3, nullptr, dd);
      between();
      b->AddRmsNorm(dx, dd, dnw, 1e-5f, dy);
      between();
      b->Add(dy, dx, dy);  // y changes after its rounding was made
      between();
      b->Linear(dy, dw1, nullptr, de);
      b->Synchronize();
      for (const Tensor* t : {&da1, &da2, &dd, &de}) {
        HostTensor h(DType::kF32, t->rows, t->cols);
        b->CopyToHost(h.bytes.data(), t->data, h.bytes.size());
        outs[run].push_back(std::move(h));
      }
      keep.clear();
      testing::internal::CaptureStderr();
      b.reset();  // prints the op table
      tables[run] = testing::internal::GetCapturedStderr();
    }
    const char* names[] = {"q-like Linear", "second Linear of the same x", "down after SiluMul",
                           "Linear of a tensor changed after its rounding"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(std::memcmp(outs[0][i].bytes.data(), outs[1][i].bytes.data(),
                            outs[0][i].bytes.size()),
                0)
          << what << ": " << names[i] << " differs from converting its x";
    }
    auto count_of = [](const std::string& table, const std::string& op) {
      const size_t at = table.find("  " + op + " ");
      if (at == std::string::npos) return int64_t{0};
      std::istringstream row(table.substr(at + op.size() + 2));
      int64_t c = -1;
      row >> c;
      return c;
    };
    // Fused: the warm-up's x and the changed y only. Poked: all 5 Linears.
    EXPECT_EQ(count_of(tables[0], "Linear.convert_x"), 2) << what << "\n" << tables[0];
    EXPECT_EQ(count_of(tables[1], "Linear.convert_x"), 5) << what << "\n" << tables[1];
  }
}

// AddRmsNorm: x += delta and the norm in one kernel, the bytes of Add then
// RmsNorm on CUDA (x and out both) and the CPU's values.
TEST_F(CudaParityTest, AddRmsNormEqualsAddThenRmsNorm) {
  for (int64_t pad : {3, 0})  // 0: the 4-wide path (see RmsNorm)
  for (DType wt : {DType::kF32, DType::kBF16}) {
    for (auto [rows, d] : {std::pair<int64_t, int64_t>{1, 2048}, {1, 4096}, {7, 129}, {300, 896}}) {
      const std::string what = "AddRmsNorm " + std::to_string(rows) + "x" + std::to_string(d) +
                               " pad " + std::to_string(pad);
      HostTensor x(DType::kF32, rows, d, d + pad), delta(DType::kF32, rows, d), w(wt, 1, d),
          out(DType::kF32, rows, d);
      x.Fill(rng_, 3.f);
      delta.Fill(rng_);
      w.Fill(rng_);
      const Tensor dw = cuda_->UploadWeight(w.view()).value();
      const Tensor dx = Up(x), dx2 = Up(x), dd = Up(delta), dout = Up(out), dout2 = Up(out);
      cuda_->AddRmsNorm(dx, dd, dw, 1e-5f, dout);
      cuda_->Add(dx2, dd, dx2);
      cuda_->RmsNorm(dx2, dw, 1e-5f, dout2);
      const HostTensor gx = Down(dx, x), gout = Down(dout, out);
      const HostTensor sx = Down(dx2, x), sout = Down(dout2, out);
      EXPECT_EQ(std::memcmp(gx.bytes.data(), sx.bytes.data(), gx.bytes.size()), 0) << what << " x";
      EXPECT_EQ(std::memcmp(gout.bytes.data(), sout.bytes.data(), gout.bytes.size()), 0)
          << what << " out";
      HostTensor rx = x, rout = out;
      cpu_->AddRmsNorm(rx.view(), delta.view(), w.view(), 1e-5f, rout.view());
      ExpectClose(gx, rx, 1e-6, what + " x vs cpu");
      ExpectClose(gout, rout, 1e-6, what + " out vs cpu");
      keep_.clear();
    }
  }
}

TEST_F(CudaParityTest, SiluMulAndAdd) {
  for (int64_t pad : {1, 0})  // 0: the 4-wide path where cols allows (see RmsNorm)
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 7}, {5, 4864}, {65, 33}, {300, 1024}}) {
    HostTensor g(DType::kF32, rows, cols, cols + pad), u(DType::kF32, rows, cols),
        out(DType::kF32, rows, cols);
    g.Fill(rng_, 4.f);
    u.Fill(rng_);
    HostTensor ref = out;
    Tensor dg = Up(g), du = Up(u), dout = Up(out);
    cuda_->SiluMul(dg, du, dout);
    cpu_->SiluMul(g.view(), u.view(), ref.view());
    ExpectClose(Down(dout, out), ref, 1e-6, "SiluMul");
    cuda_->Add(dout, du, du);  // out aliases b
    cpu_->Add(ref.view(), u.view(), u.view());
    ExpectClose(Down(du, u), u, 1e-6, "Add");
  }
}

TEST_F(CudaParityTest, Rope) {
  struct Case {
    int heads, kv_heads, hd, rotary;
    float scaling;
  };
  for (const Case& c :
       {Case{4, 2, 64, 64, 1.f}, Case{3, 1, 40, 40, 1.f}, Case{8, 8, 128, 64, 0.75f},
        // Llama-3.1-8B (5 groups of kRopeHeads = 8), and q alone with a partial rotary.
        Case{32, 8, 128, 128, 1.f}, Case{9, 0, 64, 32, 1.f}})
  // 9 rows: a thread per head (decode's kernel); 40: a thread per 8 heads.
  for (const int n : {9, 40}) {
    std::vector<float> inv_freq(c.rotary / 2);
    for (int i = 0; i < c.rotary / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / c.rotary);
    RopeParams rp{inv_freq.data(), c.hd, c.rotary, c.scaling};
    std::vector<int32_t> pos = {0, 1, 2, 7, 100, 511, 4095, 30000, 131071};
    for (int i = 9; i < n; ++i) pos.push_back(i * 3301 % 131072);
    HostTensor q(DType::kF32, n, c.heads * c.hd, c.heads * c.hd + 4),
        k(DType::kF32, n, c.kv_heads * c.hd);
    q.Fill(rng_);
    k.Fill(rng_);
    Tensor dq = Up(q), dk = Up(k);
    cuda_->Rope(dq, dk, UpArray(pos), rp);
    HostTensor rq = q, rk = k;
    cpu_->Rope(rq.view(), rk.view(), pos.data(), rp);
    ExpectClose(Down(dq, q), rq, 1e-6, "Rope q hd " + std::to_string(c.hd));
    ExpectClose(Down(dk, k), rk, 1e-6, "Rope k hd " + std::to_string(c.hd));
  }
  // MLA: [nope | rotary] heads, interleaved pairs, q alone (k has no columns).
  for (int nope : {0, 32, 128}) {
    const int rot = 64, hd = nope + rot, heads = 4, n = 5;
    std::vector<float> inv_freq(rot / 2);
    for (int i = 0; i < rot / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / rot);
    RopeParams rp{inv_freq.data(), hd, rot, 0.9f, nope, true};
    std::vector<int32_t> pos = {0, 3, 77, 1000, 65535};
    HostTensor q(DType::kF32, n, heads * hd, heads * hd + 8);
    q.Fill(rng_);
    const Tensor none{nullptr, DType::kF32, n, 0, 0};
    Tensor dq = Up(q);
    cuda_->Rope(dq, none, UpArray(pos), rp);
    HostTensor rq = q;
    cpu_->Rope(rq.view(), none, pos.data(), rp);
    ExpectClose(Down(dq, q), rq, 1e-6, "interleaved Rope nope " + std::to_string(nope));
  }
}

// RopeStoreKv: the fused decode kernel writes q, k and the cache pages with
// the bytes of Rope then StoreKv (partial rotary at an offset included, K
// alone for a K-only pool; the cache's other slots untouched).
TEST_F(CudaParityTest, RopeStoreKvEqualsRopeThenStoreKv) {
  struct Case {
    int heads, kv_heads, hd, rotary, offset, n;
    DType kv;
    bool k_only;
  };
  for (const Case& c :
       {Case{32, 8, 128, 128, 0, 1, DType::kBF16, false},
        Case{4, 2, 64, 32, 16, 16, DType::kF32, false},
        Case{6, 3, 40, 40, 0, 5, DType::kF16, false}, Case{4, 1, 64, 64, 0, 2, DType::kBF16, true},
        // 17 rows: past the fused kernel, Rope then StoreKv.
        Case{8, 2, 64, 64, 0, 17, DType::kBF16, false}}) {
    const std::string what = "RopeStoreKv hd " + std::to_string(c.hd) + " rows " +
                             std::to_string(c.n) + (c.k_only ? " k only" : "");
    std::vector<float> inv_freq(c.rotary / 2);
    for (int i = 0; i < c.rotary / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / c.rotary);
    RopeParams rp{inv_freq.data(), c.hd, c.rotary, 0.9f, c.offset, false};
    std::vector<int32_t> pos;
    std::vector<int64_t> slots;
    for (int i = 0; i < c.n; ++i) {
      pos.push_back(i * 977 % 5000);
      slots.push_back((i * 7 + 3) % 40);
    }
    const int64_t e = int64_t{c.kv_heads} * c.hd, page = 8, pages = 5;
    HostTensor q(DType::kF32, c.n, c.heads * c.hd, c.heads * c.hd + 4), k(DType::kF32, c.n, e),
        v(DType::kF32, c.n, e), cache(c.kv, 2 * page * pages, e);
    q.Fill(rng_);
    k.Fill(rng_);
    v.Fill(rng_);
    cache.Fill(rng_);
    Tensor fq = Up(q), fk = Up(k), fcache = Up(cache), sq = Up(q), sk = Up(k), scache = Up(cache);
    const Tensor dv = Up(v);
    auto layer = [&](const Tensor& t) {
      KvLayerView l;
      l.k = t.data;
      l.v = c.k_only ? nullptr : static_cast<char*>(t.data) + page * pages * e * DTypeSize(c.kv);
      l.dtype = c.kv;
      l.page_size = static_cast<int32_t>(page);
      l.num_kv_heads = c.kv_heads;
      l.head_dim = c.hd;
      l.num_pages = pages;
      return l;
    };
    const int32_t* dpos = UpArray(pos);
    const int64_t* dslots = UpArray(slots);
    cuda_->RopeStoreKv(fq, fk, dv, dpos, rp, layer(fcache), dslots);
    cuda_->Rope(sq, sk, dpos, rp);
    cuda_->StoreKv(sk, dv, layer(scache), dslots);
    for (auto [f, sep, like, name] : {std::tuple{fq, sq, &q, "q"}, std::tuple{fk, sk, &k, "k"},
                                      std::tuple{fcache, scache, &cache, "cache"}}) {
      const HostTensor a = Down(f, *like), b = Down(sep, *like);
      EXPECT_EQ(std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()), 0)
          << what << " " << name;
    }
    keep_.clear();
  }
}

TEST_F(CudaParityTest, ScaleAddRows) {
  HostTensor x(DType::kF32, 4, 300), out(DType::kF32, 9, 300, 301);
  x.Fill(rng_);
  out.Fill(rng_);
  std::vector<int32_t> rows = {8, 1, 5, 0};
  std::vector<float> scales = {0.25f, 2.f, -1.f, 7.f};
  HostTensor ref = out;
  Tensor dout = Up(out);
  cuda_->ScaleAddRows(Up(x), UpArray(rows), UpArray(scales), dout);
  cpu_->ScaleAddRows(x.view(), rows.data(), scales.data(), ref.view());
  ExpectClose(Down(dout, out), ref, 0, "ScaleAddRows");
}

TEST_F(CudaParityTest, GatherRows) {
  HostTensor x(DType::kF32, 10, 33, 40), out(DType::kF32, 4, 33);
  x.Fill(rng_);
  std::vector<int32_t> rows = {9, 0, 3, 3};
  HostTensor ref = out;
  Tensor dout = Up(out);
  cuda_->GatherRows(Up(x), UpArray(rows), dout);
  cpu_->GatherRows(x.view(), rows.data(), ref.view());
  ExpectClose(Down(dout, out), ref, 0, "GatherRows");
}

// StoreKv then PagedAttention on both backends from the same inputs: the KV
// pages must hold the same bytes, and the outputs must agree.
struct SeqSpec {
  int q_len, kv_len;
};

// v_alias: a K-only pool (StoreKv with layer.v null) whose attention reads
// V from K, as DeepSeek's MLA does.
// Returns the worst relative difference of the outputs.
double CheckAttention(Backend* cuda, Backend* cpu, DType kv_dtype, int page_size, int heads,
                      int kv_heads, int hd, int window, const std::vector<SeqSpec>& specs,
                      std::mt19937& rng, std::vector<Buffer>* keep, bool v_alias = false,
                      double tol = 1e-5);

TEST_F(CudaParityTest, StoreKvAndPagedAttention) {
  const std::vector<SeqSpec> batch = {{1, 1}, {1, 37}, {5, 5}, {3, 50}, {17, 33}, {1, 300}};
  struct Case {
    DType kv;
    int page_size, heads, kv_heads, hd, window;
  };
  const Case cases[] = {
      {DType::kF32, 16, 8, 8, 64, 0},     // MHA
      {DType::kF32, 1, 8, 2, 64, 0},      // GQA 4, page size 1
      {DType::kBF16, 16, 16, 2, 128, 0},  // GQA 8, head_dim 128
      {DType::kF16, 5, 6, 2, 40, 0},      // page size dividing nothing, odd-ish head dim
      {DType::kBF16, 16, 4, 4, 64, 7},    // sliding window
      {DType::kF32, 16, 14, 2, 64, 0},    // Qwen2.5-0.5B's 14/2
  };
  for (const Case& c : cases)
    CheckAttention(cuda_.get(), cpu_.get(), c.kv, c.page_size, c.heads, c.kv_heads, c.hd, c.window,
                   batch, rng_, &keep_);
  // Prefill-shaped batches: many query tiles per sequence (few split-K
  // pieces) beside a lone decode row.
  const std::vector<SeqSpec> prefill = {{70, 70}, {1, 500}, {9, 40}};
  CheckAttention(cuda_.get(), cpu_.get(), DType::kBF16, 16, 16, 2, 128, 0, prefill, rng_, &keep_);
  CheckAttention(cuda_.get(), cpu_.get(), DType::kF32, 1, 16, 4, 64, 33, prefill, rng_, &keep_);
}

// The flash kernels' paths (kernels.cu, PagedAttention): few query rows
// get many split-K pieces (an H200's 132 SMs give 64 splits to one decode
// token of 2 KV heads) and the reduce; many rows one piece written
// directly; contexts far longer than a piece, pieces left empty by short
// contexts beside long ones, GQA 1/4/8, head dims 64/128/256/576 (576 also
// above 48 KiB of shared memory), V aliasing K, page sizes 1/16, chunked
// prefill over a cached prefix, sliding windows.
TEST_F(CudaParityTest, PagedAttentionSplitsTilesAndLongContexts) {
  // Decode: one token per sequence, long and short contexts together.
  CheckAttention(cuda_.get(), cpu_.get(), DType::kBF16, 16, 8, 2, 64, 0,
                 {{1, 3000}, {1, 1500}, {1, 33}, {1, 1}}, rng_, &keep_);
  CheckAttention(cuda_.get(), cpu_.get(), DType::kF16, 1, 16, 2, 128, 0, {{1, 5000}}, rng_, &keep_);
  CheckAttention(cuda_.get(), cpu_.get(), DType::kF32, 16, 4, 4, 64, 0, {{1, 2000}, {1, 100}}, rng_,
                 &keep_);  // MHA: one query row per tile
  // Chunked prefill over a cached prefix, with splits, beside a decode row.
  CheckAttention(cuda_.get(), cpu_.get(), DType::kBF16, 16, 8, 2, 128, 0, {{40, 600}, {1, 700}},
                 rng_, &keep_);
  // Enough rows for a single piece: tiles written directly, no reduce.
  CheckAttention(cuda_.get(), cpu_.get(), DType::kBF16, 16, 16, 2, 64, 0, {{600, 1000}, {7, 7}},
                 rng_, &keep_);
  // Sliding windows over long contexts, decode and chunked prefill.
  CheckAttention(cuda_.get(), cpu_.get(), DType::kF32, 1, 8, 2, 64, 100,
                 {{1, 3000}, {50, 900}, {3, 3}}, rng_, &keep_);
  CheckAttention(cuda_.get(), cpu_.get(), DType::kBF16, 16, 16, 2, 64, 250,
                 {{600, 1000}, {1, 2000}}, rng_, &keep_);
  // Head dims 256 and 576 (DeepSeek's MLA latent: one KV head, V = K).
  CheckAttention(cuda_.get(), cpu_.get(), DType::kF16, 16, 4, 1, 256, 0, {{1, 300}, {9, 40}}, rng_,
                 &keep_);
  CheckAttention(cuda_.get(), cpu_.get(), DType::kBF16, 16, 16, 1, 576, 0, {{1, 700}, {20, 300}},
                 rng_, &keep_, /*v_alias=*/true);
  CheckAttention(cuda_.get(), cpu_.get(), DType::kF32, 5, 4, 1, 576, 0, {{1, 400}, {3, 64}}, rng_,
                 &keep_);  // separate V: 184 KB of shared memory per block
}

double CheckAttention(Backend* cuda, Backend* cpu, DType kv_dtype, int page_size, int heads,
                      int kv_heads, int hd, int window, const std::vector<SeqSpec>& specs,
                      std::mt19937& rng, std::vector<Buffer>* keep, bool v_alias, double tol) {
  std::string what = std::string("attention kv ") + DTypeName(kv_dtype) + " page " +
                     std::to_string(page_size) + " heads " + std::to_string(heads) + "/" +
                     std::to_string(kv_heads) + " hd " + std::to_string(hd) + " window " +
                     std::to_string(window) + (v_alias ? " V=K" : "") + " seqs";
  for (const auto& sp : specs)
    what += " " + std::to_string(sp.q_len) + "/" + std::to_string(sp.kv_len);
  const int num_seqs = static_cast<int>(specs.size());
  int64_t total_pages = 3, total_q = 0;
  for (const auto& s : specs)
    total_pages += (s.kv_len + page_size - 1) / page_size, total_q += s.q_len;
  const int64_t e = int64_t(kv_heads) * hd;
  const size_t pool_bytes = total_pages * page_size * e * DTypeSize(kv_dtype);
  std::vector<int32_t> free_pages(total_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);

  auto up = [&](const void* src, size_t bytes) {
    Buffer buf = cuda->Allocate(std::max<size_t>(bytes, 1)).value();
    cuda->CopyToDevice(buf.data(), src, bytes);
    void* p = buf.data();
    keep->push_back(std::move(buf));
    return p;
  };
  std::vector<uint8_t> zeros(pool_bytes, 0), cpu_k = zeros, cpu_v = zeros;
  KvLayerView cpu_layer{cpu_k.data(), cpu_v.data(), kv_dtype, page_size, kv_heads, hd, total_pages};
  KvLayerView dev_layer = cpu_layer;
  dev_layer.k = up(zeros.data(), pool_bytes);
  void* const dev_v = dev_layer.v = up(zeros.data(), pool_bytes);
  if (v_alias) cpu_layer.v = dev_layer.v = nullptr;  // StoreKv writes K only

  // All sequences' tokens in one StoreKv, as a model step does.
  std::vector<std::vector<int32_t>> tables(num_seqs);
  std::vector<int64_t> slots;
  for (int s = 0; s < num_seqs; ++s) {
    const int pages = (specs[s].kv_len + page_size - 1) / page_size;
    for (int p = 0; p < pages; ++p) tables[s].push_back(free_pages.back()), free_pages.pop_back();
    for (int i = 0; i < specs[s].kv_len; ++i)
      slots.push_back(int64_t(tables[s][i / page_size]) * page_size + i % page_size);
  }
  HostTensor k(DType::kF32, slots.size(), e), v(DType::kF32, slots.size(), e);
  k.Fill(rng);
  v.Fill(rng);
  cpu->StoreKv(k.view(), v.view(), cpu_layer, slots.data());
  Tensor dk{up(k.bytes.data(), k.bytes.size()), DType::kF32, k.rows, e, 0};
  Tensor dv{up(v.bytes.data(), v.bytes.size()), DType::kF32, v.rows, e, 0};
  cuda->StoreKv(dk, dv, dev_layer, static_cast<const int64_t*>(up(slots.data(), slots.size() * 8)));
  std::vector<uint8_t> got_k(pool_bytes), got_v(pool_bytes);
  cuda->Synchronize();
  cuda->CopyToHost(got_k.data(), dev_layer.k, pool_bytes);
  cuda->CopyToHost(got_v.data(), dev_v, pool_bytes);
  EXPECT_TRUE(got_k == cpu_k && got_v == cpu_v) << "StoreKv: KV pages differ, " << what;
  if (v_alias) cpu_layer.v = cpu_layer.k, dev_layer.v = dev_layer.k;

  // Attention: host seqs for the CPU, device seqs (with device page tables) for CUDA.
  std::vector<AttentionSeq> cpu_seqs(num_seqs), dev_seqs(num_seqs);
  int q_start = 0;
  for (int s = 0; s < num_seqs; ++s) {
    cpu_seqs[s] = AttentionSeq{q_start, specs[s].q_len, specs[s].kv_len, tables[s].data()};
    dev_seqs[s] = cpu_seqs[s];
    dev_seqs[s].page_table =
        static_cast<const int32_t*>(up(tables[s].data(), tables[s].size() * 4));
    q_start += specs[s].q_len;
  }
  HostTensor q(DType::kF32, total_q, int64_t(heads) * hd),
      out(DType::kF32, total_q, int64_t(heads) * hd);
  q.Fill(rng);
  HostTensor ref = out;
  AttentionParams params{heads, kv_heads, hd, 1.f / std::sqrt(float(hd)), window};
  cpu->PagedAttention(q.view(), cpu_layer, cpu_seqs.data(), num_seqs, params, ref.view());
  Tensor dq{up(q.bytes.data(), q.bytes.size()), DType::kF32, q.rows, q.cols, 0};
  Tensor dout{up(out.bytes.data(), out.bytes.size()), DType::kF32, out.rows, out.cols, 0};
  const auto* ds =
      static_cast<const AttentionSeq*>(up(dev_seqs.data(), dev_seqs.size() * sizeof(AttentionSeq)));
  // max_kv_len: unknown (splits from the SM count alone), exact (no more
  // splits than the longest context fills) and understated (a hint only:
  // one piece, still right).
  int32_t max_kv = 0;
  for (const auto& sp : specs) max_kv = std::max(max_kv, sp.kv_len);
  double worst = 0;
  for (int32_t hint : {0, max_kv, 1}) {
    AttentionParams p = params;
    p.max_kv_len = hint;
    cuda->PagedAttention(dq, dev_layer, ds, num_seqs, p, dout);
    HostTensor got = out;
    cuda->Synchronize();
    cuda->CopyToHost(got.bytes.data(), dout.data, got.bytes.size());
    worst =
        std::max(worst, ExpectClose(got, ref, tol, what + " max_kv_len " + std::to_string(hint)));
  }
  return worst;
}

// Under bf16 matmul precision a batch with a prefill chunk runs on the
// tensor cores (attention_mma.cuh): q, K, V and the probabilities rounded to
// bf16, so within 2e-2 of the CPU's F32 attention (inputs in [-1, 1]), and
// further than 1e-4 from it (else the FMA kernel ran), on every path the FMA kernel's tests cover:
// KV dtypes, page sizes 1/16/5, GQA 1/4/8, head dims 64/128, windows,
// split-K pieces with empty ones, a cached prefix, decode rows beside the
// chunk, pure decode batches. V = K (MLA) and head dims other than 64/128
// keep the exact FMA kernel (1e-5) even here.
TEST_F(CudaParityTest, PagedAttentionOnTensorCoresUnderBf16) {
  CudaBackendOptions o;
  o.matmul_precision = "bf16";
  auto c = CreateCudaBackend(o);
  ASSERT_TRUE(c.ok()) << c.status().message();
  std::unique_ptr<Backend> tc = std::move(c).value();
  const double kTol = 2e-2;
  struct Case {
    DType kv;
    int page_size, heads, kv_heads, hd, window;
    std::vector<SeqSpec> seqs;
  };
  const Case cases[] = {
      {DType::kBF16, 16, 32, 8, 64, 0, {{70, 70}, {1, 500}, {9, 40}}},   // Llama 1B's GQA 4
      {DType::kBF16, 16, 32, 8, 128, 0, {{300, 300}}},                   // 8B's
      {DType::kF32, 1, 16, 2, 128, 0, {{40, 600}, {1, 700}}},            // cached prefix, F32 pages
      {DType::kF16, 5, 8, 8, 64, 0, {{33, 33}, {2, 17}}},                // MHA, odd page size
      {DType::kBF16, 16, 16, 2, 64, 250, {{600, 1000}, {1, 2000}}},      // window
      {DType::kF32, 16, 8, 2, 128, 100, {{50, 900}, {3, 3}}},            // window, chunk
      {DType::kBF16, 16, 8, 2, 128, 0, {{2, 3000}}},                     // few rows: splits
      {DType::kBF16, 1, 14, 2, 64, 0, {{129, 129}, {1, 1}, {65, 200}}},  // 0.5B's 14/2
      {DType::kBF16, 16, 32, 8, 128, 0, {{1, 3000}, {1, 33}, {1, 1}}},   // decode, splits
      {DType::kF32, 16, 32, 8, 64, 0, {{1, 2000}, {1, 1500}, {1, 64}, {1, 65}}},  // decode batch
      {DType::kBF16, 16, 16, 2, 64, 100, {{1, 3000}, {1, 7}}},                    // decode, window
      {DType::kF16, 5, 32, 8, 128, 0, {{200, 450}}},  // F16 pages, odd page size, cached prefix
      {DType::kF32, 16, 8, 8, 64, 0, {{130, 130}}},   // MHA, F32 pages
  };
  for (const Case& k : cases) {
    const double err = CheckAttention(tc.get(), cpu_.get(), k.kv, k.page_size, k.heads, k.kv_heads,
                                      k.hd, k.window, k.seqs, rng_, &keep_, false, kTol);
    // Rounded to bf16, so not the FMA kernel's F32 result: the call really
    // ran on the tensor cores.
    EXPECT_GT(err, 1e-4) << "heads " << k.heads << "/" << k.kv_heads << " hd " << k.hd;
  }
  // Deterministic: the same inputs twice (a decode batch of many split-K
  // pieces, empty pieces beside a long context, the reduce) give the same
  // result to the bit, as a replayed decode step must.
  for (int rep = 0; rep < 2; ++rep) {
    std::mt19937 same = rng_;
    const std::vector<SeqSpec> decode = {{1, 3000}, {1, 33}, {1, 700}};
    const double e1 = CheckAttention(tc.get(), cpu_.get(), DType::kBF16, 16, 32, 8, 128, 0, decode,
                                     same, &keep_, false, kTol);
    same = rng_;
    const double e2 = CheckAttention(tc.get(), cpu_.get(), DType::kBF16, 16, 32, 8, 128, 0, decode,
                                     same, &keep_, false, kTol);
    EXPECT_EQ(e1, e2) << "repeat " << rep;
  }
  // V aliasing K (MLA), head dim 256: the FMA kernel, exact.
  CheckAttention(tc.get(), cpu_.get(), DType::kBF16, 16, 16, 1, 576, 0, {{1, 700}, {20, 300}}, rng_,
                 &keep_, /*v_alias=*/true);
  CheckAttention(tc.get(), cpu_.get(), DType::kF16, 16, 4, 1, 256, 0, {{9, 40}}, rng_, &keep_);
}

// ---- CopyBlocks (HiCache page copies) ----

// Host memory of its own pages (mmap: two heap buffers may share a page,
// and a page can be registered only once), optionally pinned through the
// backend for its lifetime. `bytes` views it.
struct HostBytes {
  Backend* backend = nullptr;
  std::span<uint8_t> bytes;
  bool pinned = false;
  HostBytes(Backend* b, size_t n, uint8_t fill, bool pin) : backend(b) {
    void* p = mmap(nullptr, std::max<size_t>(n, 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    bytes = {static_cast<uint8_t*>(p), n};
    std::fill(bytes.begin(), bytes.end(), fill);
    if (pin) {
      Status s = b->PinHostMemory(bytes.data(), bytes.size());
      EXPECT_TRUE(s.ok()) << s.ToString();
      pinned = s.ok();
    }
  }
  ~HostBytes() {
    if (pinned) backend->UnpinHostMemory(bytes.data());
    munmap(bytes.data(), std::max<size_t>(bytes.size(), 1));
  }
};

// Many blocks of uneven sizes, host -> scattered device places -> other host
// places, with pinned and pageable host memory on each side: every byte
// arrives, and nothing outside the blocks is written.
TEST_F(CudaParityTest, CopyBlocksBothDirectionsPinnedAndPageable) {
  constexpr size_t kDeviceBytes = 24 << 20;
  auto dev = cuda_->Allocate(kDeviceBytes);
  ASSERT_TRUE(dev.ok());
  char* d = static_cast<char*>(dev->data());
  for (bool pin_src : {false, true}) {
    for (bool pin_dst : {false, true}) {
      SCOPED_TRACE(std::string("source ") + (pin_src ? "pinned" : "pageable") + ", destination " +
                   (pin_dst ? "pinned" : "pageable"));
      // Block sizes: page-sized (16 KiB, the usual), tiny, odd, and a few MiB.
      std::vector<size_t> sizes;
      for (int i = 0; i < 600; ++i) sizes.push_back(16384);
      for (int i = 0; i < 200; ++i) sizes.push_back(1 + rng_() % 9000);
      sizes.push_back(0);
      sizes.push_back((3 << 20) + 5);
      std::shuffle(sizes.begin(), sizes.end(), rng_);
      // Scattered device offsets with gaps; host source packed, destination gapped.
      std::vector<size_t> dev_off, src_off, dst_off;
      size_t dev_end = 0, src_end = 0, dst_end = 0;
      for (size_t n : sizes) {
        dev_end += rng_() % 256;
        dev_off.push_back(dev_end);
        dev_end += n;
        src_off.push_back(src_end);
        src_end += n;
        dst_end += rng_() % 64;
        dst_off.push_back(dst_end);
        dst_end += n;
      }
      ASSERT_LE(dev_end, kDeviceBytes);
      HostBytes src(cuda_.get(), src_end, 0, pin_src);
      for (auto& b : src.bytes) b = static_cast<uint8_t>(rng_());
      HostBytes dst(cuda_.get(), dst_end, 0x11, pin_dst);
      std::vector<uint8_t> fill(kDeviceBytes, 0xEE);
      cuda_->CopyToDevice(d, fill.data(), fill.size());
      cuda_->Synchronize();  // the copy stream does not wait for the compute stream

      std::vector<CopyBlock> up, down;
      for (size_t i = 0; i < sizes.size(); ++i) {
        up.push_back({d + dev_off[i], src.bytes.data() + src_off[i], sizes[i]});
        down.push_back({dst.bytes.data() + dst_off[i], d + dev_off[i], sizes[i]});
      }
      Status s = cuda_->CopyBlocks(up, CopyKind::kHostToDevice);
      ASSERT_TRUE(s.ok()) << s.ToString();
      std::vector<uint8_t> whole(kDeviceBytes);
      cuda_->CopyToHost(whole.data(), d, whole.size());
      std::vector<bool> covered(kDeviceBytes, false);
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_EQ(std::memcmp(whole.data() + dev_off[i], src.bytes.data() + src_off[i], sizes[i]),
                  0)
            << "host->device block " << i << " (" << sizes[i] << " bytes)";
        std::fill(covered.begin() + dev_off[i], covered.begin() + dev_off[i] + sizes[i], true);
      }
      for (size_t j = 0; j < kDeviceBytes; ++j) {
        if (!covered[j]) {
          ASSERT_EQ(whole[j], 0xEE) << "device byte " << j << " outside every block was written";
        }
      }
      s = cuda_->CopyBlocks(down, CopyKind::kDeviceToHost);
      ASSERT_TRUE(s.ok()) << s.ToString();
      size_t prev_end = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_EQ(
            std::memcmp(dst.bytes.data() + dst_off[i], src.bytes.data() + src_off[i], sizes[i]), 0)
            << "device->host block " << i << " (" << sizes[i] << " bytes)";
        for (size_t j = prev_end; j < dst_off[i]; ++j)
          ASSERT_EQ(dst.bytes[j], 0x11) << "host byte " << j;
        prev_end = dst_off[i] + sizes[i];
      }
    }
  }
  // Empty and all-empty batches are fine.
  EXPECT_TRUE(cuda_->CopyBlocks({}, CopyKind::kHostToDevice).ok());
  CopyBlock empty{d, d, 0};
  EXPECT_TRUE(cuda_->CopyBlocks({&empty, 1}, CopyKind::kDeviceToHost).ok());
}

TEST_F(CudaParityTest, PinningTwiceIsAnErrorNotACrash) {
  HostBytes host(cuda_.get(), 1 << 20, 0, false);
  ASSERT_TRUE(cuda_->PinHostMemory(host.bytes.data(), host.bytes.size()).ok());
  Status again = cuda_->PinHostMemory(host.bytes.data(), host.bytes.size());
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("cudaHostRegister"), std::string::npos) << again.message();
  cuda_->UnpinHostMemory(host.bytes.data());
  // Unregistered now: pinning works again, and a stray unpin is harmless.
  ASSERT_TRUE(cuda_->PinHostMemory(host.bytes.data(), host.bytes.size()).ok());
  cuda_->UnpinHostMemory(host.bytes.data());
  cuda_->UnpinHostMemory(host.bytes.data());
}

// The cache controller copies on its own thread while the engine thread
// issues kernels: the copy (on the copy stream) and the GEMMs (on the
// compute stream) both give exact results.
TEST_F(CudaParityTest, CopyRunsBesideComputeOnTheEngineStream) {
  // ~17 GFLOP per GEMM: 50 of them keep the compute stream busy for longer
  // than the copies take.
  HostTensor x(DType::kF32, 1024, 2048), w(DType::kF32, 4096, 2048), o(DType::kF32, 1024, 4096);
  x.Fill(rng_);
  w.Fill(rng_, 0.05f);
  const Tensor dx = Up(x), dw = Up(w), dout = Up(o);
  cuda_->Linear(dx, dw, nullptr, dout);
  const HostTensor alone = Down(dout, o);

  constexpr size_t kPages = 2048, kPageBytes = 16384;  // 32 MiB each way
  auto dev = cuda_->Allocate(kPages * kPageBytes);
  ASSERT_TRUE(dev.ok());
  HostBytes src(cuda_.get(), kPages * kPageBytes, 0, true),
      back(cuda_.get(), kPages * kPageBytes, 0, true);
  for (auto& b : src.bytes) b = static_cast<uint8_t>(rng_());
  std::vector<size_t> perm(kPages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng_);
  char* d = static_cast<char*>(dev->data());
  std::vector<CopyBlock> up, down;
  for (size_t i = 0; i < kPages; ++i) {
    up.push_back({d + perm[i] * kPageBytes, src.bytes.data() + i * kPageBytes, kPageBytes});
    down.push_back({back.bytes.data() + i * kPageBytes, d + perm[i] * kPageBytes, kPageBytes});
  }
  Status copy_status;
  std::thread copier([&] {
    for (int r = 0; r < 4 && copy_status.ok(); ++r) {
      copy_status = cuda_->CopyBlocks(up, CopyKind::kHostToDevice);
      if (copy_status.ok()) copy_status = cuda_->CopyBlocks(down, CopyKind::kDeviceToHost);
    }
  });
  for (int r = 0; r < 50; ++r) cuda_->Linear(dx, dw, nullptr, dout);  // queued, not waited for
  copier.join();
  ASSERT_TRUE(copy_status.ok()) << copy_status.ToString();
  EXPECT_EQ(std::memcmp(back.bytes.data(), src.bytes.data(), src.bytes.size()), 0);
  const HostTensor busy = Down(dout, o);
  ExpectClose(busy, alone, 1e-6, "the GEMM while a copy ran beside it");
}

// STRATA_CUDA_OP_TIMING: the ops still compute the same (also with the
// gate holding each step back), and the table printed when the backend is
// destroyed counts every op of each step. The accounting itself is
// op_timing_test.cc's.
TEST(CudaOpTimingTest, TableCountsEveryOpAndResultsAreUnchanged) {
  for (const char* mode : {"1", "gated"}) {
    SCOPED_TRACE(mode);
    setenv("STRATA_CUDA_OP_TIMING", mode, 1);
    auto c = CreateCudaBackend(CudaBackendOptions{});
    unsetenv("STRATA_CUDA_OP_TIMING");
    if (!c.ok()) GTEST_SKIP() << c.status().message();
    std::unique_ptr<Backend> cuda = std::move(c).value();
    std::mt19937 rng(7);
    HostTensor x(DType::kF32, 3, 256), w(DType::kF32, 1, 256), out(DType::kF32, 3, 256);
    x.Fill(rng);
    w.Fill(rng);
    auto bx = cuda->Allocate(x.bytes.size()).value();
    auto bo = cuda->Allocate(out.bytes.size()).value();
    Tensor dw = cuda->UploadWeight(w.view()).value();
    Tensor dx{bx.data(), DType::kF32, 3, 256, 0}, dout{bo.data(), DType::kF32, 3, 256, 0};
    testing::internal::CaptureStderr();
    constexpr int kSteps = 3;
    for (int step = 0; step < kSteps; ++step) {
      cuda->CopyToDevice(bx.data(), x.bytes.data(), x.bytes.size());
      cuda->RmsNorm(dx, dw, 1e-6f, dout);
      cuda->Add(dout, dx, dout);
      cuda->Add(dout, dx, dout);
      cuda->Synchronize();
    }
    HostTensor got = out;
    cuda->CopyToHost(got.bytes.data(), dout.data, got.bytes.size());
    cuda->Synchronize();
    cuda.reset();  // prints the table
    const std::string table = testing::internal::GetCapturedStderr();
    CpuBackendOptions co;
    auto cpu = CreateCpuBackend(co).value();
    HostTensor ref = out;
    cpu->RmsNorm(x.view(), w.view(), 1e-6f, ref.view());
    cpu->Add(ref.view(), x.view(), ref.view());
    cpu->Add(ref.view(), x.view(), ref.view());
    ExpectClose(got, ref, 1e-6, std::string("ops under STRATA_CUDA_OP_TIMING=") + mode);
    EXPECT_NE(table.find("STRATA_CUDA_OP_TIMING"), std::string::npos) << table;
    // 4 steps (3, then the lone copy back); no Embedding, so one class.
    EXPECT_NE(table.find("-- steps without an Embedding: 4 steps"), std::string::npos) << table;
    auto count_of = [&](const std::string& op) {
      const size_t at = table.find("  " + op + " ");
      if (at == std::string::npos) return int64_t{-1};
      std::istringstream row(table.substr(at + op.size() + 2));
      int64_t n = -1;
      row >> n;
      return n;
    };
    EXPECT_EQ(count_of("RmsNorm"), kSteps) << table;
    EXPECT_EQ(count_of("Add"), 2 * kSteps) << table;
    EXPECT_EQ(count_of("CopyToDevice"), kSteps) << table;
    EXPECT_EQ(count_of("CopyToHost"), 1) << table;
    EXPECT_EQ(table.find("timed out"), std::string::npos) << table;
  }
}

TEST(CudaBackendOptionsTest, RejectsBadPrecisionOrSaysNoDevice) {
  CudaBackendOptions o;
  o.matmul_precision = "tf32";
  auto b = CreateCudaBackend(o);
  ASSERT_FALSE(b.ok());
  // A build or machine without CUDA answers "no CUDA device" before
  // looking at the options; with one, the option is rejected.
  const std::string msg = b.status().message();
  EXPECT_TRUE(msg.find("no CUDA device") != std::string::npos ||
              msg.find("matmul_precision") != std::string::npos)
      << msg;
}

}  // namespace
}  // namespace strata

// The CUDA backend with --mem-fraction-static on a real GPU: one cudaMalloc
// of ArenaBytes, the device memory plan's KV pool (the whole remainder)
// fits it exactly, the engine serves the same tokens as a backend with one
// cudaMalloc per buffer, and nothing more is allocated while it serves; an
// arena larger than the free memory is refused at creation; a failed
// upload leaves the arena as it was.
//
// Skipped with "no CUDA device: ..." without a GPU (or in a build without
// CUDA). On the GPU machine:
//   ./build/src/cuda_arena_test
#include <gtest/gtest.h>

#include "engine/device_memory_plan.h"
#include "engine/engine.h"
#include "model/model_dir.h"

namespace strata {
namespace {

std::string Fixture(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// The reason to skip, or "" when a CUDA device is here.
std::string NoGpu() {
  auto facts = ReadCudaMemoryFacts(0);
  return facts.ok() ? "" : facts.status().message();
}

std::vector<GenerationRequest> Requests() {
  std::vector<GenerationRequest> reqs(4);
  for (int i = 0; i < 4; ++i) {
    for (int t = 0; t < 9 + 13 * i; ++t) reqs[i].prompt.push_back((7 * t + 3 * i) % 200 + 1);
    reqs[i].params.max_tokens = 12;
    reqs[i].params.temperature = 0;
    reqs[i].params.ignore_eos = true;
    reqs[i].prompt_logprobs = i == 3 ? 2 : -1;
  }
  return reqs;
}

TEST(CudaArenaTest, OneCudaMallocHoldsThePlanAndServesAsPerBufferMemoryDoes) {
  if (std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = Fixture("qwen3");
  auto config = ReadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  LoadOptions lo;
  lo.model.max_batch_tokens = 64 + 8;
  EngineOptions eo;
  eo.max_running_requests = 8;
  eo.chunked_prefill_size = 64;
  eo.kv_dtype = DType::kBF16;
  const int64_t context = EffectiveContextLength(eo, config->max_position_embeddings);

  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const bool bf16 = std::string(precision) == "bf16";
    // Reference: one cudaMalloc per buffer.
    CudaBackendOptions plain;
    plain.matmul_precision = precision;
    auto ref_backend = CreateCudaBackend(plain);
    ASSERT_TRUE(ref_backend.ok()) << ref_backend.status().message();
    auto ref_model = LoadModelDir(dir, **ref_backend, lo);
    ASSERT_TRUE(ref_model.ok()) << ref_model.status().message();
    EngineOptions ref_eo = eo;
    ref_eo.kv_pool_pages = 64;
    auto ref_engine = Engine::Create(**ref_model, **ref_backend, ref_eo);
    ASSERT_TRUE(ref_engine.ok()) << ref_engine.status().message();
    auto want = (*ref_engine)->Generate(Requests());
    ASSERT_TRUE(want.ok()) << want.status().message();
    EXPECT_GT((*ref_backend)->memory_usage().device_mallocs, 10);
    ref_engine->reset();
    ref_model->reset();
    ref_backend->reset();

    // The plan, from the headers and this GPU's facts, before the arena.
    auto facts = ReadCudaMemoryFacts(0);
    ASSERT_TRUE(facts.ok());
    auto fp = MeasureModelFootprint(dir, *config, lo.model, bf16);
    ASSERT_TRUE(fp.ok()) << fp.status().message();
    DeviceMemoryPlanInput in;
    in.device = *facts;
    in.mem_fraction_static = 0.02;  // ~2.8 GiB of an H200: the KV pool is most of it
    in.bf16_matmul = bf16;
    in.model = *fp;
    auto layout = KvLayoutForConfig(*config, eo.page_size, eo.kv_dtype);
    ASSERT_TRUE(layout.ok());
    in.layout = *layout;
    in.vocab_size = config->vocab_size;
    in.runner = EngineRunnerLimits(eo, context, lo.model.max_batch_tokens, config->vocab_size);
    in.context_length = context;
    auto plan = PlanDeviceMemory(in);
    ASSERT_TRUE(plan.ok()) << plan.status().message();

    CudaBackendOptions co = plain;
    co.mem_fraction_static = in.mem_fraction_static;
    auto backend = CreateCudaBackend(co);
    ASSERT_TRUE(backend.ok()) << backend.status().message();
    EXPECT_EQ((*backend)->memory_usage().arena_bytes, plan->arena_bytes);
    auto model = LoadModelDir(dir, **backend, lo);
    ASSERT_TRUE(model.ok()) << model.status().message();
    EngineOptions arena_eo = eo;
    arena_eo.kv_pool_pages = plan->kv_pages;  // the whole remainder
    auto engine = Engine::Create(**model, **backend, arena_eo);
    ASSERT_TRUE(engine.ok()) << engine.status().message() << "\nplan: " << plan->Describe();
    const BackendMemoryUsage after_create = (*backend)->memory_usage();
    // The plan is exact: what is used is every term but the lazily made
    // bf16 GEMM scratch; what is left is the plan's leftover plus that.
    const uint64_t scratch = plan->backend_bytes - CudaBackendArenaBytes(false, 0, 0);
    EXPECT_EQ(after_create.arena_used + scratch + plan->unused_bytes, plan->arena_bytes)
        << plan->Describe();
    auto got = (*engine)->Generate(Requests());
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < got->size(); ++i) {
      EXPECT_EQ((*got)[i].output, (*want)[i].output) << "request " << i;
      EXPECT_EQ((*got)[i].prompt_logprobs.size(), (*want)[i].prompt_logprobs.size());
    }
    const BackendMemoryUsage u = (*backend)->memory_usage();
    EXPECT_EQ(u.device_mallocs, 1);  // the arena, nothing else
    EXPECT_LE(u.arena_peak, u.arena_bytes);
    EXPECT_LE(u.arena_used, after_create.arena_used + scratch);
    EXPECT_TRUE((*engine)->CheckIntegrity().ok());
    engine->reset();
    model->reset();
  }
}

TEST(CudaArenaTest, AnArenaLargerThanTheFreeMemoryIsRefusedAtCreation) {
  if (std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  CudaBackendOptions co;
  co.mem_fraction_static = 1.0;  // the context alone already holds some of it
  auto b = CreateCudaBackend(co);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted) << b.status().message();
  EXPECT_NE(b.status().message().find("is free"), std::string::npos) << b.status().message();
  co.mem_fraction_static = 1.5;
  EXPECT_EQ(CreateCudaBackend(co).status().code(), StatusCode::kInvalidArgument);
}

TEST(CudaArenaTest, AFailedUploadLeavesTheArenaAsItWas) {
  if (std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  CudaBackendOptions co;
  co.mem_fraction_static = 0.0005;  // a few tens of MiB
  auto b = CreateCudaBackend(co);
  ASSERT_TRUE(b.ok()) << b.status().message();
  Backend& be = **b;
  const BackendMemoryUsage u0 = be.memory_usage();
  ASSERT_GT(u0.arena_largest_free, uint64_t{1} << 20);
  // A BF16 weight whose F32 copy fits but not together with its staging copy.
  const int64_t cols = 256;
  int64_t rows = static_cast<int64_t>(u0.arena_largest_free / 5 / cols);
  std::vector<uint16_t> host(static_cast<size_t>(rows * cols), FloatToBf16(0.5f));
  Tensor t{host.data(), DType::kBF16, rows, cols, 0};
  auto up = be.UploadWeight(t);
  ASSERT_FALSE(up.ok());
  EXPECT_EQ(up.status().code(), StatusCode::kResourceExhausted);
  const BackendMemoryUsage u1 = be.memory_usage();
  EXPECT_EQ(u1.arena_used, u0.arena_used);
  EXPECT_EQ(u1.arena_largest_free, u0.arena_largest_free);
  // One that fits with its staging: uploaded, widened, and the staging given back.
  rows = static_cast<int64_t>(u0.arena_largest_free / 7 / cols);
  t.rows = rows;
  auto ok = be.UploadWeight(t);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->dtype, DType::kF32);
  const BackendMemoryUsage u2 = be.memory_usage();
  EXPECT_EQ(u2.arena_used, u0.arena_used + ArenaBlockBytes(static_cast<uint64_t>(rows * cols) * 4));
  std::vector<float> back(static_cast<size_t>(rows * cols));
  be.CopyToHost(back.data(), ok->data, back.size() * sizeof(float));
  EXPECT_EQ(back.front(), 0.5f);
  EXPECT_EQ(back.back(), 0.5f);
  EXPECT_EQ(u2.device_mallocs, 1);
}

}  // namespace
}  // namespace strata

// The device memory plan: MeasureModelFootprint against what a real load,
// engine and steps allocate (a counting backend over the CPU backend that
// applies the CUDA upload rule), DeepSeek V3's derived tensors and skipped
// MTP layers counted from the headers independently, and PlanDeviceMemory
// on fake 80 GiB / 141 GB GPUs: fits, does not fit (every term and the
// smallest fraction in the message), free memory short, --max-total-tokens.
#include "engine/device_memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "model/model_dir.h"
#include "model/weights.h"
#include "util/logging.h"

namespace strata {
namespace {

int MaxHeadDim(const KvLayout& l) {
  int d = 0;
  for (const PoolGroupSpec& g : l.groups) d = std::max(d, g.head_dim);
  return d;
}

std::string Fixture(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// Forwards every op to the CPU backend and counts what an arena would hold:
// Allocate blocks (live and peak) and uploads under the CUDA rule.
class CountingBackend final : public Backend {
 public:
  CountingBackend(Backend& inner, bool bf16) : in_(inner), bf16_(bf16) {}
  std::string Name() const override { return "counting(" + in_.Name() + ")"; }
  StatusOr<Buffer> Allocate(size_t bytes) override {
    allocated += ArenaBlockBytes(bytes);
    ++allocations;
    return in_.Allocate(bytes);
  }
  StatusOr<Tensor> UploadWeight(const Tensor& host) override {
    weight_bytes += ArenaBlockBytes(static_cast<uint64_t>(host.rows * host.cols) *
                                    DTypeSize(CudaWeightDType(host.dtype, bf16_)));
    ++uploads;
    return in_.UploadWeight(host);
  }
  void CopyToDevice(void* d, const void* s, size_t n) override { in_.CopyToDevice(d, s, n); }
  void CopyToHost(void* d, const void* s, size_t n) override { in_.CopyToHost(d, s, n); }
  void Synchronize() override { in_.Synchronize(); }
  Status CopyBlocks(std::span<const CopyBlock> b, CopyKind k) override {
    return in_.CopyBlocks(b, k);
  }
  void Embedding(const Tensor& t, const int32_t* ids, Tensor o) override {
    in_.Embedding(t, ids, o);
  }
  void RmsNorm(const Tensor& x, const Tensor& w, float e, Tensor o) override {
    in_.RmsNorm(x, w, e, o);
  }
  void Linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor o) override {
    in_.Linear(x, w, b, o);
  }
  void SiluMul(const Tensor& g, const Tensor& u, Tensor o) override { in_.SiluMul(g, u, o); }
  void Add(const Tensor& a, const Tensor& b, Tensor o) override { in_.Add(a, b, o); }
  void Rope(Tensor q, Tensor k, const int32_t* p, const RopeParams& r) override {
    in_.Rope(q, k, p, r);
  }
  void StoreKv(const Tensor& k, const Tensor& v, const KvLayerView& l, const int64_t* s) override {
    in_.StoreKv(k, v, l, s);
  }
  void PagedAttention(const Tensor& q, const KvLayerView& l, const AttentionSeq* s, int32_t n,
                      const AttentionParams& p, Tensor o) override {
    in_.PagedAttention(q, l, s, n, p, o);
  }
  void GatherRows(const Tensor& x, const int32_t* r, Tensor o) override { in_.GatherRows(x, r, o); }
  void ScaleAddRows(const Tensor& x, const int32_t* r, const float* s, Tensor o) override {
    in_.ScaleAddRows(x, r, s, o);
  }

  uint64_t allocated = 0, weight_bytes = 0;
  int64_t allocations = 0, uploads = 0;

 private:
  Backend& in_;
  bool bf16_;
};

std::unique_ptr<Backend> Cpu() {
  CpuBackendOptions bo;
  bo.num_threads = 1;
  auto b = CreateCpuBackend(bo);
  STRATA_CHECK(b.ok()) << b.status().message();
  return std::move(b).value();
}

TEST(DeviceMemoryPlanTest, FootprintIsWhatALoadAndAnEngineAllocate) {
  auto cpu = Cpu();
  for (const char* name :
       {"llama_default", "qwen3", "qwen2", "mistral", "deepseek_v3", "deepseek_v3_lite"}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(name) + (bf16 ? " bf16" : " fp32"));
      auto config = ReadModelConfig(Fixture(name));
      ASSERT_TRUE(config.ok()) << config.status().message();
      ModelOptions mo;
      mo.max_batch_tokens = 40;
      auto fp = MeasureModelFootprint(Fixture(name), *config, mo, bf16);
      ASSERT_TRUE(fp.ok()) << fp.status().message();
      CountingBackend counting(*cpu, bf16);
      LoadOptions lo;
      lo.model = mo;
      auto model = LoadModelDir(Fixture(name), counting, lo);
      ASSERT_TRUE(model.ok()) << model.status().message();
      EXPECT_EQ(fp->weight_bytes, counting.weight_bytes);
      EXPECT_EQ(fp->num_weights, counting.uploads);
      EXPECT_EQ(fp->buffer_bytes, counting.allocated);
      EXPECT_GT(fp->weight_bytes, 0u);

      // The engine allocates the pool and the runner's buffers once; steps
      // allocate nothing more.
      EngineOptions eo;
      eo.max_running_requests = 3;
      eo.chunked_prefill_size = 37;
      eo.context_length = 100;
      eo.kv_pool_pages = 20;
      const uint64_t before = counting.allocated;
      auto engine = Engine::Create(**model, counting, eo);
      ASSERT_TRUE(engine.ok()) << engine.status().message();
      const KvLayout layout = (*model)->model->kv_layout(eo.page_size, eo.kv_dtype);
      uint64_t pool = 0;
      for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g)
        pool += ArenaBlockBytes(layout.BytesPerPage(g) * 20);
      const RunnerLimits limits =
          EngineRunnerLimits(eo, 100, mo.max_batch_tokens, config->vocab_size);
      EXPECT_EQ(counting.allocated - before,
                pool + ModelRunner::DeviceBytes(limits, config->vocab_size));
      std::vector<GenerationRequest> reqs(3);
      for (int i = 0; i < 3; ++i) {
        reqs[i].prompt = std::vector<int32_t>(5 + 9 * i, 3 + i);
        reqs[i].params.max_tokens = 4;
        reqs[i].prompt_logprobs = i == 2 ? 1 : -1;
      }
      const uint64_t after_create = counting.allocated;
      auto out = (*engine)->Generate(std::move(reqs));
      ASSERT_TRUE(out.ok()) << out.status().message();
      EXPECT_EQ(counting.allocated, after_create) << "a step allocated backend memory";
    }
  }
}

TEST(DeviceMemoryPlanTest, DeepSeekCountsDerivedTensorsAndSkipsMtpAndHostTensors) {
  const std::string dir = Fixture("deepseek_v3");
  auto config = ReadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  ASSERT_GT(config->num_nextn_predict_layers, 0);  // the fixture ships an MTP layer
  auto store = WeightStore::Open(dir);
  ASSERT_TRUE(store.ok());
  // Independently, from the headers: every tensor of layers < num_hidden_layers
  // (and the non-layer ones) except the router bias (host), widened to F32,
  // plus one derived W_uk^T [heads * kv_lora, nope] per layer.
  uint64_t want = 0;
  int64_t n = 0;
  bool saw_mtp = false;
  for (const auto& [name, w] : store->tensors()) {
    if (name.rfind("model.layers.", 0) == 0 &&
        std::atoll(name.c_str() + 13) >= config->num_hidden_layers) {
      saw_mtp = true;
      continue;
    }
    if (name.find("e_score_correction_bias") != std::string::npos) continue;
    uint64_t elems = 1;
    for (int64_t d : w.shape) elems *= static_cast<uint64_t>(d);
    want += ArenaBlockBytes(elems * 4);
    ++n;
  }
  ASSERT_TRUE(saw_mtp);
  const MlaConfig& m = config->mla;
  want += config->num_hidden_layers *
          ArenaBlockBytes(static_cast<uint64_t>(config->num_attention_heads * m.kv_lora_rank *
                                                m.qk_nope_head_dim) *
                          4);
  n += config->num_hidden_layers;
  auto fp = MeasureModelFootprint(dir, *config, ModelOptions{}, /*bf16_matmul=*/false);
  ASSERT_TRUE(fp.ok()) << fp.status().message();
  EXPECT_EQ(fp->weight_bytes, want);
  EXPECT_EQ(fp->num_weights, n);
}

TEST(DeviceMemoryPlanTest, AModelThatCannotLoadFailsAsTheLoadWould) {
  auto config = ReadModelConfig(Fixture("qwen3"));
  ASSERT_TRUE(config.ok());
  config->num_hidden_layers += 1;  // the checkpoint lacks that layer
  auto fp = MeasureModelFootprint(Fixture("qwen3"), *config, ModelOptions{}, false);
  ASSERT_FALSE(fp.ok());
  EXPECT_NE(fp.status().message().find("missing tensor"), std::string::npos)
      << fp.status().message();
}

constexpr uint64_t kGiB = uint64_t{1} << 30;

DeviceMemoryFacts Gpu80() {
  DeviceMemoryFacts d;
  d.name = "fake 80 GiB";
  d.total_bytes = 80 * kGiB;
  d.free_bytes = 79 * kGiB;
  return d;
}

// An 8B-like model: 32 layers x 8 KV heads x 128 x BF16 KV, 15 GiB weights.
DeviceMemoryPlanInput Input() {
  DeviceMemoryPlanInput in;
  in.device = Gpu80();
  in.mem_fraction_static = 0.88;
  in.model.weight_bytes = 15 * kGiB;
  in.model.checkpoint_bytes = 15 * kGiB;
  in.model.buffer_bytes = kGiB / 2;
  in.layout.page_size = 16;
  in.layout.groups = {{"full_attention", 32, 8, 128, DType::kBF16}};
  EngineOptions eo;
  in.vocab_size = 128256;
  in.runner = EngineRunnerLimits(eo, 8192, 576, in.vocab_size);
  in.context_length = 8192;
  return in;
}

TEST(DeviceMemoryPlanTest, TheKvPoolIsTheArenasRemainderInWholePages) {
  const DeviceMemoryPlanInput in = Input();
  auto p = PlanDeviceMemory(in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->arena_bytes, ArenaBytes(in.device, 0.88));
  EXPECT_EQ(p->weight_bytes, 15 * kGiB);
  EXPECT_EQ(p->runner_bytes, ModelRunner::DeviceBytes(in.runner, in.vocab_size));
  EXPECT_EQ(p->backend_bytes,
            CudaBackendArenaBytes(false, 576, 0) +
                CudaBackendStepArenaBytes(in.runner.max_logit_rows, in.vocab_size,
                                          MaxHeadDim(in.layout)));
  const uint64_t rest = p->arena_bytes - 15 * kGiB - p->activation_bytes() - kDeviceArenaAlignment;
  EXPECT_EQ(p->kv_pages, static_cast<int64_t>(rest / in.layout.BytesPerPage()));
  EXPECT_EQ(p->kv_pages, p->kv_pages_fit);
  // Everything adds up to the arena, and the leftover is less than a page.
  EXPECT_EQ(p->weight_bytes + p->activation_bytes() + p->kv_bytes + p->unused_bytes,
            p->arena_bytes);
  EXPECT_LT(p->unused_bytes, in.layout.BytesPerPage() + kDeviceArenaAlignment);
  EXPECT_TRUE(p->warnings.empty());
  EXPECT_NE(p->Describe().find("KV pool"), std::string::npos);
  // A larger fraction gives a larger pool, never different weights.
  DeviceMemoryPlanInput more = in;
  more.mem_fraction_static = 0.95;
  auto q = PlanDeviceMemory(more);
  ASSERT_TRUE(q.ok());
  EXPECT_GT(q->kv_pages, p->kv_pages);
}

TEST(DeviceMemoryPlanTest, TooSmallAFractionNamesEveryTermAndTheSmallestThatFits) {
  DeviceMemoryPlanInput in = Input();
  in.mem_fraction_static = 0.1;  // 8 GiB < 15 GiB of weights
  auto p = PlanDeviceMemory(in);
  ASSERT_FALSE(p.ok());
  const std::string msg = p.status().message();
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  for (const char* part :
       {"weights 15.00 GiB", "activations", "exceed", "--mem-fraction-static 0.10", "80.00 GiB",
        "smallest fraction that fits is 0.2"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
  // The fraction it names does fit.
  const size_t at = msg.find("fits is ");
  in.mem_fraction_static = std::stod(msg.substr(at + 8, 4));
  EXPECT_TRUE(PlanDeviceMemory(in).ok()) << in.mem_fraction_static;
  in.mem_fraction_static -= 0.01;
  EXPECT_FALSE(PlanDeviceMemory(in).ok()) << in.mem_fraction_static;
}

TEST(DeviceMemoryPlanTest, WidenedWeightsSayBf16WouldHelpAndTooBigSaysSo) {
  DeviceMemoryPlanInput in = Input();
  in.model.checkpoint_bytes = 60 * kGiB;
  in.model.weight_bytes = 120 * kGiB;  // a 30B BF16 checkpoint widened to F32
  auto p = PlanDeviceMemory(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("does not fit the GPU"), std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("--matmul-precision bf16"), std::string::npos)
      << p.status().message();
}

TEST(DeviceMemoryPlanTest, AnArenaLargerThanTheFreeMemoryIsRefused) {
  DeviceMemoryPlanInput in = Input();
  in.device.free_bytes = 40 * kGiB;  // another process holds half
  auto p = PlanDeviceMemory(in);
  ASSERT_FALSE(p.ok());
  const std::string msg = p.status().message();
  EXPECT_NE(msg.find("only 40.00 GiB of it is free"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at most 0.50"), std::string::npos) << msg;
  in.mem_fraction_static = 0.5;
  EXPECT_TRUE(PlanDeviceMemory(in).ok());
}

TEST(DeviceMemoryPlanTest, MaxTotalTokensCapsThePoolAndAboveTheFitWarns) {
  DeviceMemoryPlanInput in = Input();
  const int64_t fit = PlanDeviceMemory(in)->kv_pages;
  in.max_total_tokens = 1000;  // 62 pages
  auto capped = PlanDeviceMemory(in);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->kv_pages, 62);
  EXPECT_EQ(capped->kv_pages_fit, fit);
  EXPECT_GT(capped->unused_bytes, 10 * kGiB);  // the cap leaves the arena mostly empty
  // The cap also meets the one-context warning (8192 tokens of context).
  ASSERT_EQ(capped->warnings.size(), 1u);
  EXPECT_NE(capped->warnings[0].find("fewer than one request"), std::string::npos);
  in.max_total_tokens = (fit + 100) * 16;
  auto over = PlanDeviceMemory(in);
  ASSERT_TRUE(over.ok());
  EXPECT_EQ(over->kv_pages, fit);
  ASSERT_EQ(over->warnings.size(), 1u);
  EXPECT_NE(over->warnings[0].find("--max-total-tokens"), std::string::npos);
}

TEST(DeviceMemoryPlanTest, DeepSeekV3FixtureOnAnH200) {
  const std::string dir = Fixture("deepseek_v3");
  auto config = ReadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  EngineOptions eo;
  eo.kv_dtype = DType::kBF16;
  ModelOptions mo;
  mo.max_batch_tokens = eo.chunked_prefill_size + eo.max_running_requests;
  auto fp = MeasureModelFootprint(dir, *config, mo, true);
  ASSERT_TRUE(fp.ok()) << fp.status().message();
  auto layout = KvLayoutForConfig(*config, eo.page_size, eo.kv_dtype);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->groups.size(), 1u);
  EXPECT_FALSE(layout->groups[0].has_v);  // the MLA latent: K only
  DeviceMemoryPlanInput in;
  in.device.name = "fake H200";
  in.device.total_bytes = uint64_t{150754820096};
  in.device.free_bytes = in.device.total_bytes - (uint64_t{600} << 20);
  in.mem_fraction_static = 0.9;
  in.bf16_matmul = true;
  in.model = *fp;
  in.layout = *layout;
  in.vocab_size = config->vocab_size;
  const int64_t context = EffectiveContextLength(eo, config->max_position_embeddings);
  in.runner = EngineRunnerLimits(eo, context, mo.max_batch_tokens, config->vocab_size);
  in.context_length = context;
  auto p = PlanDeviceMemory(in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const uint64_t per_page = static_cast<uint64_t>(config->num_hidden_layers) * 16 *
                            (config->mla.kv_lora_rank + config->mla.qk_rope_head_dim) * 2;
  EXPECT_EQ(layout->BytesPerPage(), per_page);
  EXPECT_EQ(p->kv_pages, std::min<int64_t>((p->arena_bytes - p->weight_bytes -
                                            p->activation_bytes() - kDeviceArenaAlignment) /
                                               per_page,
                                           kMaxKvPages));
  EXPECT_EQ(p->backend_bytes,
            CudaBackendArenaBytes(true, mo.max_batch_tokens, fp->max_16bit_cols) +
                CudaBackendStepArenaBytes(in.runner.max_logit_rows, in.vocab_size,
                                          MaxHeadDim(in.layout)));
  EXPECT_GT(fp->max_16bit_cols, 0);  // bf16 keeps the fixture's BF16 weights
}

}  // namespace
}  // namespace strata

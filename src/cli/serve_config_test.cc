// ValidateServeConfig on values (no process, no weights): every problem is
// reported at once, each naming the flag, the allowed values and the fix;
// the device pool and the HiCache host tier are planned from config.json
// and faked host facts.
#include "cli/serve_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string FixtureDir(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// Parses `args` the way `strata serve` does.
ServeConfig Parse(const std::vector<std::string>& args) {
  ServeConfig c;
  FlagSet f("serve", "test");
  f.RejectEmptyStrings();
  RegisterServeFlags(f, &c);
  Status st = f.Parse(args);
  EXPECT_TRUE(st.ok()) << st.message();
  RecordGivenFlags(f, &c);
  return c;
}

ServeEnvironment Machine(uint64_t total, uint64_t free) {
  ServeEnvironment env;
  env.host.nodes = {{0, total, free}};
  env.host.allowed_nodes = {0};
  return env;
}

std::string All(const ServePlan& p) {
  std::string s;
  for (auto& x : p.problems) s += x + "\n";
  return s;
}

TEST(ServeConfigValidationTest, TheDefaultsAreValid) {
  const ServeConfig c = Parse({});
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  const ServePlan p = ValidateServeConfig(c, &*model, Machine(64 * kGB, 32 * kGB));
  EXPECT_TRUE(p.ok()) << All(p);
  EXPECT_FALSE(p.host_tier.has_value());
  ASSERT_TRUE(p.layout.has_value());
  EXPECT_GT(p.device_pages, 0);
  EXPECT_EQ(p.engine.page_size, 16);
  EXPECT_EQ(p.engine.chunked_prefill_size, 512);
  EXPECT_FALSE(p.engine.hicache.enabled);
  EXPECT_EQ(p.engine.schedule_conservativeness, 1.0);
}

TEST(ServeConfigValidationTest, ScheduleConservativenessReachesTheEngineAndIsBounded) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  const ServePlan p = ValidateServeConfig(Parse({"--schedule-conservativeness", "0.3"}), &*model,
                                          Machine(64 * kGB, 32 * kGB));
  EXPECT_TRUE(p.ok()) << All(p);
  EXPECT_DOUBLE_EQ(p.engine.schedule_conservativeness, 0.3);
  for (const char* bad : {"-1", "101", "lots"}) {
    ServeConfig c;
    FlagSet f("serve", "test");
    RegisterServeFlags(f, &c);
    const Status st = f.Parse({"--schedule-conservativeness", bad});
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("schedule-conservativeness"), std::string::npos) << st.message();
  }
}

TEST(ServeConfigValidationTest, EveryProblemIsReportedAtOnce) {
  const ServeConfig c = Parse(
      {"--kv-cache-dtype", "q4", "--cpu-isa", "neon", "--matmul-precision", "tf32",
       "--max-request-body-bytes", "4096", "--max-total-request-body-bytes", "2048", "--page-size",
       "64", "--max-total-tokens", "10", "--hicache-ratio", "2", "--numa-node", "1"});
  const ServePlan p = ValidateServeConfig(c, nullptr, Machine(64 * kGB, 32 * kGB));
  ASSERT_EQ(p.problems.size(), 6u) << All(p);
  EXPECT_THAT(p.problems[0],
              HasSubstr("--kv-cache-dtype: 'q4' is not one of auto, f32, bf16, f16"));
  EXPECT_THAT(p.problems[1], HasSubstr("--matmul-precision: 'tf32' is not one of fp32, bf16, auto"));
  EXPECT_THAT(p.problems[2],
              HasSubstr("--cpu-isa: 'neon' is not one of auto, avx512, avx2, scalar"));
  EXPECT_THAT(p.problems[3], HasSubstr("--max-total-request-body-bytes 2048 is smaller than"));
  EXPECT_THAT(p.problems[4],
              HasSubstr("--max-total-tokens 10 is smaller than one page (--page-size 64)"));
  EXPECT_THAT(
      p.problems[5],
      HasSubstr("--hicache-ratio, --numa-node have no effect without --enable-hierarchical-cache: "
                "add --enable-hierarchical-cache, or remove them"));
}

TEST(ServeConfigValidationTest, EachHiCacheFlagNeedsEnable) {
  for (std::vector<std::string> args :
       std::vector<std::vector<std::string>>{{"--hicache-ratio", "3"},
                                             {"--hicache-size", "10"},
                                             {"--hicache-write-policy", "write_back"},
                                             {"--hicache-storage-backend", "file"},
                                             {"--hicache-storage-path", ::testing::TempDir()},
                                             {"--hicache-storage-max-gb", "5"},
                                             {"--hicache-storage-prefetch-policy", "timeout"},
                                             {"--hicache-storage-prefetch-timeout-ms", "50"},
                                             {"--numa-node", "0"}}) {
    const ServePlan p = ValidateServeConfig(Parse(args), nullptr, Machine(64 * kGB, 32 * kGB));
    bool said = false;
    for (auto& m : p.problems)
      said |= m.find(args[0] + " has no effect without --enable-hierarchical-cache") !=
              std::string::npos;
    EXPECT_TRUE(said) << args[0] << ":\n" << All(p);
  }
}

TEST(ServeConfigValidationTest, HiCacheCombinationRules) {
  const auto env = Machine(64 * kGB, 32 * kGB);
  auto problems = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "--enable-hierarchical-cache");
    return ValidateServeConfig(Parse(args), nullptr, env).problems;
  };
  EXPECT_THAT(problems({}), IsEmpty());
  EXPECT_THAT(problems({"--disable-radix-cache"}),
              ElementsAre(HasSubstr("--enable-hierarchical-cache needs the prefix cache, which "
                                    "--disable-radix-cache turns off")));
  EXPECT_THAT(problems({"--hicache-write-policy", "writeback"}),
              ElementsAre(HasSubstr(
                  "'writeback' is not one of write_through, write_through_selective, write_back")));
  EXPECT_THAT(problems({"--hicache-storage-prefetch-policy", "lazy", "--hicache-storage-backend",
                        "file", "--hicache-storage-path", ::testing::TempDir()}),
              ElementsAre(HasSubstr("'lazy' is not one of best_effort, wait_complete, timeout")));
  EXPECT_THAT(problems({"--hicache-storage-backend", "redis"}),
              ElementsAre(HasSubstr(
                  "--hicache-storage-backend: 'redis' is not a storage backend (allowed: file")));
  EXPECT_THAT(
      problems({"--hicache-storage-backend", "file"}),
      ElementsAre(HasSubstr("--hicache-storage-backend file needs --hicache-storage-path DIR")));
  EXPECT_THAT(problems({"--hicache-storage-path", ::testing::TempDir()}),
              ElementsAre(HasSubstr("needs --hicache-storage-backend file")));
  EXPECT_THAT(
      problems({"--hicache-storage-max-gb", "5"}),
      ElementsAre(HasSubstr("--hicache-storage-max-gb needs --hicache-storage-backend file")));
  EXPECT_THAT(problems({"--hicache-storage-backend", "file", "--hicache-storage-path",
                        ::testing::TempDir(), "--hicache-storage-max-gb", "0"}),
              ElementsAre(HasSubstr("must be a positive number of GB")));
  EXPECT_THAT(problems({"--hicache-storage-backend", "file", "--hicache-storage-path",
                        ::testing::TempDir(), "--hicache-storage-prefetch-timeout-ms", "50"}),
              ElementsAre(HasSubstr(
                  "--hicache-storage-prefetch-timeout-ms applies only to "
                  "--hicache-storage-prefetch-policy timeout (the policy is best_effort)")));
  EXPECT_THAT(problems({"--hicache-storage-backend", "file", "--hicache-storage-path",
                        ::testing::TempDir(), "--hicache-storage-prefetch-policy", "timeout",
                        "--hicache-storage-prefetch-timeout-ms", "50"}),
              IsEmpty());
  EXPECT_THAT(
      problems({"--numa-node", "4"}),
      ElementsAre(HasSubstr("--numa-node 4: this machine has no such NUMA node (nodes: 0")));
  // Resolved into the engine's options.
  const ServePlan ok = ValidateServeConfig(
      Parse({"--enable-hierarchical-cache", "--hicache-write-policy", "write_back",
             "--hicache-storage-backend", "file", "--hicache-storage-path", "/tmp/x",
             "--hicache-storage-prefetch-policy", "timeout",
             "--hicache-storage-prefetch-timeout-ms", "250", "--numa-node", "0", "--hicache-ratio",
             "3"}),
      nullptr, env);
  ASSERT_TRUE(ok.ok()) << All(ok);
  const HiCacheOptions& h = ok.engine.hicache;
  EXPECT_TRUE(h.enabled);
  EXPECT_EQ(h.write_policy, HiCacheWritePolicy::kWriteBack);
  EXPECT_EQ(h.prefetch_policy, PrefetchPolicy::kTimeout);
  EXPECT_EQ(h.prefetch_timeout_ms, 250);
  EXPECT_EQ(h.numa_node, 0);
  EXPECT_EQ(h.ratio, 3);
  EXPECT_TRUE(h.ratio_explicit);
  EXPECT_EQ(h.storage_path, "/tmp/x");
  EXPECT_EQ(h.storage_max_gb, kDefaultStorageMaxGb);
}

TEST(ServeConfigValidationTest, AStoragePathThatCannotBeWrittenIsAProblem) {
  const std::string base = ::testing::TempDir() + "/serve_config_probe_" + std::to_string(getpid());
  fs::remove_all(base);
  // Created when missing (nested), and left without the probe file.
  EXPECT_TRUE(ProbeWritableDir(base + "/a/b").ok());
  EXPECT_TRUE(fs::is_directory(base + "/a/b"));
  EXPECT_TRUE(fs::is_empty(base + "/a/b"));
  // Under a regular file: cannot be created, whoever runs the test.
  std::ofstream(base + "/file") << "x";
  Status s = ProbeWritableDir(base + "/file/sub");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cannot create directory " + base + "/file/sub"));
  EXPECT_FALSE(ProbeWritableDir(base + "/file").ok());  // a file, not a directory

  ServeConfig c = Parse({"--enable-hierarchical-cache", "--hicache-storage-backend", "file",
                         "--hicache-storage-path", base + "/file/sub"});
  const ServeEnvironment env = ReadServeEnvironment(c, FixtureDir("llama_default"));
  const ServePlan p = ValidateServeConfig(c, nullptr, env);
  EXPECT_THAT(p.problems, ElementsAre(HasSubstr("--hicache-storage-path " + base +
                                                "/file/sub: cannot create")));
  fs::remove_all(base);
}

TEST(ServeConfigValidationTest, TheModelsConfigSizesTheDevicePoolAndTheHostTier) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  // 2 layers x 2 kv heads x 16 dims x K+V x f32 = 512 bytes per token.
  const ServeConfig c =
      Parse({"--enable-hierarchical-cache", "--hicache-ratio", "3", "--max-total-tokens", "16000"});
  ServeEnvironment env = Machine(64 * kGB, 32 * kGB);
  env.weight_bytes = 5 * kGB;
  const ServePlan p = ValidateServeConfig(c, &*model, env);
  ASSERT_TRUE(p.ok()) << All(p);
  EXPECT_EQ(p.device_pages, 1000);
  ASSERT_TRUE(p.host_tier.has_value());
  EXPECT_EQ(p.host_tier->host_pages, 3000);
  EXPECT_EQ(p.host_tier->total_bytes, 3000u * 16 * 512);
  // --device cpu: the weights and the device pool live in host memory too.
  EXPECT_EQ(p.host_tier->reserve_bytes, 5 * kGB + 1000u * 16 * 512 + 3200000000u);
  // On a GPU they do not.
  ServeConfig gpu = c;
  gpu.model.device = "cuda";
  EXPECT_EQ(ValidateServeConfig(gpu, &*model, env).host_tier->reserve_bytes, 3200000000u);

  // The same flags on a machine with 4 GB free: refused with the numbers.
  const ServePlan small =
      ValidateServeConfig(Parse({"--enable-hierarchical-cache", "--hicache-size", "100000"}),
                          &*model, Machine(8 * kGB, 4 * kGB));
  ASSERT_EQ(small.problems.size(), 1u) << All(small);
  EXPECT_THAT(small.problems[0], HasSubstr("--hicache-size 100000 asks for"));
  EXPECT_THAT(small.problems[0], HasSubstr("4.00 GB free on NUMA node 0"));
  EXPECT_THAT(small.problems[0], HasSubstr("At most --hicache-ratio"));
}

TEST(ServeConfigValidationTest, MemoryIsNotSizedForADtypeThatDidNotParse) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  const ServePlan p = ValidateServeConfig(
      Parse({"--kv-cache-dtype", "q4", "--enable-hierarchical-cache", "--hicache-size", "100000"}),
      &*model, Machine(8 * kGB, 4 * kGB));
  EXPECT_THAT(p.problems, ElementsAre(HasSubstr("--kv-cache-dtype: 'q4'")));
  EXPECT_FALSE(p.host_tier.has_value());
}

TEST(ServeConfigValidationTest, ContextLengthAndKvMemoryAgainstTheModel) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  const ServePlan p =
      ValidateServeConfig(Parse({"--context-length", "4096", "--max-total-tokens", "100000000"}),
                          &*model, Machine(64 * kGB, 32 * kGB));
  ASSERT_EQ(p.problems.size(), 2u) << All(p);
  EXPECT_THAT(p.problems[0],
              HasSubstr("--context-length 4096 exceeds the model's max_position_embeddings 2048"));
  // 10^8 tokens x 512 bytes = 51 GB > 32 GB free.
  EXPECT_THAT(p.problems[1],
              HasSubstr("--max-total-tokens 100000000 needs 48828 MiB of KV cache but only 30517 "
                        "MiB of memory is available (allowed up to about 62500000 tokens"));
  // On a GPU the device pool is not in host memory.
  ServeConfig gpu = Parse({"--max-total-tokens", "100000000"});
  gpu.model.device = "cuda";
  EXPECT_TRUE(ValidateServeConfig(gpu, &*model, Machine(64 * kGB, 32 * kGB)).ok());
}

TEST(ServeConfigValidationTest, WeightFileBytesSumsTheSafetensorsFiles) {
  uint64_t expect = 0;
  for (const auto& e : fs::directory_iterator(FixtureDir("qwen3")))
    if (e.path().extension() == ".safetensors") expect += fs::file_size(e.path());
  EXPECT_GT(expect, 0u);
  EXPECT_EQ(WeightFileBytes(FixtureDir("qwen3")), expect);
  EXPECT_EQ(WeightFileBytes("/nonexistent"), 0u);
}

TEST(ServeConfigValidationTest, DisaggregationRules) {
  const ServeEnvironment env = Machine(64 * kGB, 32 * kGB);
  EXPECT_THAT(ValidateServeConfig(Parse({"--disaggregation-mode", "prefill"}), nullptr, env).problems, IsEmpty());
  EXPECT_THAT(ValidateServeConfig(Parse({"--disaggregation-mode", "decode"}), nullptr, env).problems, IsEmpty());
  auto problems = [&](const std::vector<std::string>& args) {
    return All(ValidateServeConfig(Parse(args), nullptr, env));
  };
  EXPECT_THAT(problems({"--disaggregation-mode", "both"}),
              HasSubstr("--disaggregation-mode: 'both' is not one of null, prefill, decode"));
  EXPECT_THAT(problems({"--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl"}),
              HasSubstr("is not one of ucx"));
  EXPECT_THAT(problems({"--disaggregation-mode", "prefill", "--disaggregation-peer-timeout-ms", "500",
                        "--disaggregation-heartbeat-interval-ms", "500"}),
              HasSubstr("must be at least twice --disaggregation-heartbeat-interval-ms"));
  EXPECT_THAT(problems({"--disaggregation-mode", "prefill", "--port", "8998"}),
              HasSubstr("is also --port"));
  EXPECT_THAT(problems({"--disaggregation-bootstrap-port", "9000"}),
              HasSubstr("applies only to a PD role"));
  EXPECT_THAT(problems({"--disaggregation-mode", "decode", "--device", "cuda"}),
              HasSubstr("host-memory KV pools only"));
}

TEST(ServeConfigValidationTest, ParserNames) {
  for (const char* name : {"auto", "llama3", "hermes", "qwen25", "mistral", "deepseekv3"}) {
    const ServePlan p = ValidateServeConfig(Parse({"--tool-call-parser", name}), nullptr,
                                            Machine(64 * kGB, 32 * kGB));
    EXPECT_TRUE(p.ok()) << name << ": " << All(p);
  }
  for (const char* name : {"qwen3", "deepseek-r1"}) {
    const ServePlan p = ValidateServeConfig(Parse({"--reasoning-parser", name}), nullptr,
                                            Machine(64 * kGB, 32 * kGB));
    EXPECT_TRUE(p.ok()) << name << ": " << All(p);
  }
  const ServePlan p =
      ValidateServeConfig(Parse({"--tool-call-parser", "pythonic", "--reasoning-parser", "qwq"}),
                          nullptr, Machine(64 * kGB, 32 * kGB));
  EXPECT_THAT(
      p.problems,
      ElementsAre(HasSubstr("--tool-call-parser: 'pythonic' is not one of auto, llama3, hermes, "
                            "qwen25, mistral, deepseekv3"),
                  HasSubstr("--reasoning-parser: 'qwq' is not one of qwen3, deepseek-r1")));
}


// --mem-fraction-static (issue 10): its range, --device cpu, and on a
// (fake) GPU the device memory plan sizing the pool from the arena.
namespace gpu {

ServeEnvironment FakeGpu(uint64_t total, uint64_t free, const ModelFootprint& fp) {
  ServeEnvironment env = Machine(64 * kGiB, 32 * kGiB);
  DeviceMemoryFacts d;
  d.name = "fake GPU";
  d.total_bytes = total;
  d.free_bytes = free;
  env.device = d;
  env.footprint = fp;
  return env;
}

ModelFootprint Weights(uint64_t bytes) {
  ModelFootprint fp;
  fp.weight_bytes = bytes;
  fp.checkpoint_bytes = bytes;
  fp.buffer_bytes = 64 << 20;
  return fp;
}

TEST(ServeConfigValidationTest, MemFractionStaticRangeAndCpu) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  for (const char* bad : {"0", "1.5", "-0.2"}) {
    const ServePlan p = ValidateServeConfig(
        Parse({"--device", "cuda", "--mem-fraction-static", bad}), &*model, Machine(64 * kGB, 32 * kGB));
    ASSERT_EQ(p.problems.size(), 1u) << bad << ": " << All(p);
    EXPECT_THAT(p.problems[0], HasSubstr("is outside (0, 1]")) << bad;
  }
  const ServePlan cpu = ValidateServeConfig(Parse({"--mem-fraction-static", "0.5"}), &*model,
                                            Machine(64 * kGB, 32 * kGB));
  ASSERT_EQ(cpu.problems.size(), 1u) << All(cpu);
  EXPECT_THAT(cpu.problems[0], HasSubstr("does nothing with --device cpu"));
  // The default on the CPU is no problem (it is never used there).
  EXPECT_TRUE(ValidateServeConfig(Parse({}), &*model, Machine(64 * kGB, 32 * kGB)).ok());
  const ServePlan dev = ValidateServeConfig(Parse({"--device", "gpu"}), &*model,
                                            Machine(64 * kGB, 32 * kGB));
  EXPECT_THAT(All(dev), HasSubstr("expected cpu, cuda or cuda:N"));
}

// --kv-cache-dtype auto (the default): the model's bf16 on a GPU under bf16
// matmul (the GPU default), f32 under fp32 matmul and on the CPU.
TEST(ServeConfigValidationTest, KvCacheDtypeAutoIsBf16OnAGpuAndF32Elsewhere) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  const ServeEnvironment gpu = FakeGpu(80 * kGiB, 79 * kGiB, Weights(15 * kGiB));
  auto kv = [&](std::vector<std::string> args, const ServeEnvironment& env) {
    const ServePlan p = ValidateServeConfig(Parse(args), &*model, env);
    EXPECT_TRUE(p.ok()) << All(p);
    return p.engine.kv_dtype;
  };
  EXPECT_EQ(kv({"--device", "cuda"}, gpu), DType::kBF16);
  EXPECT_EQ(kv({"--device", "cuda", "--matmul-precision", "fp32"}, gpu), DType::kF32);
  EXPECT_EQ(kv({"--device", "cuda", "--kv-cache-dtype", "f16"}, gpu), DType::kF16);
  EXPECT_EQ(kv({}, Machine(64 * kGB, 32 * kGB)), DType::kF32);
  EXPECT_EQ(kv({"--matmul-precision", "bf16"}, Machine(64 * kGB, 32 * kGB)), DType::kF32);
}

TEST(ServeConfigValidationTest, OnAGpuTheArenaSizesTheDevicePool) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  const ServeConfig c = Parse({"--device", "cuda", "--kv-cache-dtype", "bf16"});
  const ServeEnvironment env = FakeGpu(80 * kGiB, 79 * kGiB, Weights(15 * kGiB));
  const ServePlan p = ValidateServeConfig(c, &*model, env);
  ASSERT_TRUE(p.ok()) << All(p);
  ASSERT_TRUE(p.device_memory.has_value());
  EXPECT_EQ(p.device_memory->arena_bytes, ArenaBytes(*env.device, kDefaultMemFractionStatic));
  EXPECT_EQ(p.device_pages, p.device_memory->kv_pages);
  EXPECT_EQ(p.engine.kv_pool_pages, p.device_pages);
  // Far more than PlanKvPoolPages' 1 GiB cap.
  EXPECT_GT(static_cast<uint64_t>(p.device_pages) * p.layout->BytesPerPage(), 50 * kGiB);
  // The runner limits the plan counted are the engine's.
  EXPECT_EQ(p.device_memory->runner_bytes,
            ModelRunner::DeviceBytes(
                EngineRunnerLimits(p.engine,
                                   EffectiveContextLength(p.engine, model->max_position_embeddings),
                                   static_cast<int32_t>(ServeMaxBatchTokens(c)), model->vocab_size),
                model->vocab_size));
  // --max-total-tokens caps it.
  const ServePlan capped = ValidateServeConfig(
      Parse({"--device", "cuda", "--kv-cache-dtype", "bf16", "--max-total-tokens", "4096"}),
      &*model, env);
  ASSERT_TRUE(capped.ok()) << All(capped);
  EXPECT_EQ(capped.device_pages, 4096 / 16);
}

TEST(ServeConfigValidationTest, AModelThatDoesNotFitIsAProblemWithTheNumbers) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  const ServePlan p =
      ValidateServeConfig(Parse({"--device", "cuda:1", "--mem-fraction-static", "0.5"}), &*model,
                          FakeGpu(80 * kGiB, 79 * kGiB, Weights(50 * kGiB)));
  ASSERT_EQ(p.problems.size(), 1u) << All(p);
  EXPECT_THAT(p.problems[0], HasSubstr("weights 50.00 GiB"));
  EXPECT_THAT(p.problems[0], HasSubstr("exceed --mem-fraction-static 0.50"));
  EXPECT_THAT(p.problems[0], HasSubstr("smallest fraction that fits is 0.6"));
}

TEST(ServeConfigValidationTest, NoVisibleGpuIsAWarningAndTheLoadDecides) {
  auto model = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(model.ok());
  ServeEnvironment env = Machine(64 * kGB, 32 * kGB);
  env.device = Unavailable("no CUDA device: cudaGetDeviceCount says 0 devices");
  const ServePlan p = ValidateServeConfig(Parse({"--device", "cuda"}), &*model, env);
  EXPECT_TRUE(p.ok()) << All(p);
  EXPECT_FALSE(p.device_memory.has_value());
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_THAT(p.warnings[0], HasSubstr("GPU memory not checked (no CUDA device"));
}

}  // namespace gpu

}  // namespace
}  // namespace strata::cli

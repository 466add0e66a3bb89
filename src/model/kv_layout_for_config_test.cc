// KvLayoutForConfig (the layout from config.json alone, what startup
// validation sizes pools with before the weights load) agrees with
// Model::kv_layout of the loaded model, for every registered architecture.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "model/model_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string FixtureDir(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

void ExpectSameLayout(const KvLayout& a, const KvLayout& b, const std::string& where) {
  EXPECT_EQ(a.page_size, b.page_size) << where;
  ASSERT_EQ(a.groups.size(), b.groups.size()) << where;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    const PoolGroupSpec &x = a.groups[g], &y = b.groups[g];
    EXPECT_EQ(x.name, y.name) << where << " group " << g;
    EXPECT_EQ(x.num_layers, y.num_layers) << where << " group " << g;
    EXPECT_EQ(x.num_kv_heads, y.num_kv_heads) << where << " group " << g;
    EXPECT_EQ(x.head_dim, y.head_dim) << where << " group " << g;
    EXPECT_EQ(x.dtype, y.dtype) << where << " group " << g;
    EXPECT_EQ(x.has_v, y.has_v) << where << " group " << g;
    EXPECT_EQ(x.sliding_window, y.sliding_window) << where << " group " << g;
    EXPECT_EQ(x.tokens_per_entry, y.tokens_per_entry) << where << " group " << g;
  }
  EXPECT_EQ(a.BytesPerPage(), b.BytesPerPage()) << where;
}

class KvLayoutForConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CpuBackendOptions bo;
    bo.num_threads = 1;
    auto b = CreateCpuBackend(bo);
    ASSERT_TRUE(b.ok());
    backend_ = std::move(*b);
  }
  // Loads `dir` and compares the two layouts at a few page sizes and dtypes;
  // returns the architecture.
  std::string Check(const std::string& dir) {
    auto m = LoadModelDir(dir, *backend_, {});
    EXPECT_TRUE(m.ok()) << dir << ": " << m.status().message();
    if (!m.ok()) return "";
    auto config = ReadModelConfig(dir);
    EXPECT_TRUE(config.ok());
    for (int page_size : {1, 16, 64})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        auto from_config = KvLayoutForConfig(*config, page_size, dt);
        EXPECT_TRUE(from_config.ok()) << dir << ": " << from_config.status().message();
        if (from_config.ok())
          ExpectSameLayout(*from_config, (*m)->model->kv_layout(page_size, dt),
                           dir + " page_size " + std::to_string(page_size));
      }
    return (*m)->config.architecture;
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(KvLayoutForConfigTest, AgreesWithTheLoadedModelForEveryArchitecture) {
  std::set<std::string> covered;
  for (const char* f :
       {"llama_default", "llama3_rope", "llama_linear", "mistral", "qwen2", "qwen3", "deepseek_v3",
        "deepseek_v3_lite", "deepseek_v4"})
    covered.insert(Check(FixtureDir(f)));
  // A new architecture needs a fixture here, or this test says so.
  for (const std::string& a : SupportedArchitectures())
    EXPECT_TRUE(covered.count(a)) << a << " has no fixture";
}

TEST_F(KvLayoutForConfigTest, AgreesWithASlidingWindow) {
  // The fixtures run full attention; a copy of mistral with a window
  // exercises the sliding_attention group both ways.
  const std::string dir =
      ::testing::TempDir() + "/kv_layout_for_config_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::copy(FixtureDir("mistral"), dir, fs::copy_options::recursive);
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  j["sliding_window"] = 16;
  std::ofstream(dir + "/config.json") << j.dump(2);
  Check(dir);
  auto config = ReadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  auto l = KvLayoutForConfig(*config, 16, DType::kBF16);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->groups[0].name, "sliding_attention");
  EXPECT_EQ(l->groups[0].sliding_window, 16);
  fs::remove_all(dir);
}

TEST_F(KvLayoutForConfigTest, UnknownArchitecturesAndBadConfigsAreErrors) {
  auto config = ReadModelConfig(FixtureDir("llama_default"));
  ASSERT_TRUE(config.ok());
  ModelConfig c = *config;
  c.architecture = "GPT2LMHeadModel";
  auto u = KvLayoutForConfig(c, 16, DType::kBF16);
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(u.status().message(),
              HasSubstr("'GPT2LMHeadModel' is not supported (supported: DeepseekV3ForCausalLM, "
                        "DeepseekV4ForCausalLM, LlamaForCausalLM"));
  auto p = KvLayoutForConfig(*config, 0, DType::kBF16);
  EXPECT_FALSE(p.ok());  // page size 0: the layout's own validation
}

}  // namespace
}  // namespace strata

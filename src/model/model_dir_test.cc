// Malformed model directories: each problem a user can meet with a download
// gives one clear error naming the file (and tensor or field), never a crash
// or a silently wrong model. Uses the CPU backend and the llama_default and
// qwen3 fixtures, copied to a temp dir and broken one way per test.
#include "model/model_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class ModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/model_dir_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl + "/model";
    CopyFixture("llama_default");
    CpuBackendOptions bo;
    bo.num_threads = 1;
    auto b = CreateCpuBackend(bo);
    ASSERT_TRUE(b.ok());
    backend_ = std::move(*b);
  }
  void TearDown() override { fs::remove_all(fs::path(dir_).parent_path()); }

  void CopyFixture(const std::string& name) {
    fs::remove_all(dir_);
    fs::copy(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name, dir_,
             fs::copy_options::recursive);
    fs::remove(dir_ + "/golden.json");
  }
  nlohmann::json ReadJson(const std::string& file) {
    std::ifstream in(dir_ + "/" + file);
    return nlohmann::json::parse(in);
  }
  void WriteText(const std::string& file, const std::string& text) {
    std::ofstream out(dir_ + "/" + file, std::ios::binary | std::ios::trunc);
    out << text;
  }
  void EditConfig(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = ReadJson("config.json");
    edit(j);
    WriteText("config.json", j.dump(2));
  }
  // Rewrites model.safetensors through `edit` on its tensor list.
  void EditWeights(const std::function<void(std::vector<TensorToWrite>&)>& edit) {
    std::vector<TensorToWrite> ts;
    {
      auto w = WeightStore::Open(dir_);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      for (auto& [name, info] : w->tensors()) {
        const auto* p = static_cast<const uint8_t*>(info.data);
        ts.push_back({name, info.dtype, info.shape, std::vector<uint8_t>(p, p + info.nbytes)});
      }
    }
    edit(ts);
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", ts).ok());
  }
  Status Load() {
    LoadOptions lo;
    lo.model.max_batch_tokens = 16;
    auto m = LoadModelDir(dir_, *backend_, lo);
    return m.ok() ? OkStatus() : m.status();
  }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(ModelDirTest, FixtureLoads) { EXPECT_TRUE(Load().ok()) << Load().ToString(); }

TEST_F(ModelDirTest, MissingDirectory) {
  fs::remove_all(dir_);
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(dir_), HasSubstr("does not exist")));
}

TEST_F(ModelDirTest, MissingConfig) {
  fs::remove(dir_ + "/config.json");
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
}

TEST_F(ModelDirTest, MalformedConfigJson) {
  WriteText("config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ");
  Status s = Load();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
}

TEST_F(ModelDirTest, UnknownArchitecture) {
  EditConfig([](nlohmann::json& j) { j["architectures"] = {"GPT2LMHeadModel"}; });
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("GPT2LMHeadModel"), HasSubstr("LlamaForCausalLM"),
                                 HasSubstr("Qwen3ForCausalLM")));
}

TEST_F(ModelDirTest, MissingTokenizer) {
  fs::remove(dir_ + "/tokenizer.json");
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.json"));
}

TEST_F(ModelDirTest, MalformedTokenizer) {
  WriteText("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": 7}}");
  Status s = Load();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.json"));
}

TEST_F(ModelDirTest, TokenizerVocabLargerThanModel) {
  EditConfig([](nlohmann::json& j) { j["vocab_size"] = 300; });  // tokenizer has 480
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("tokenizer.json"), HasSubstr("480"), HasSubstr("300")));
}

TEST_F(ModelDirTest, MissingWeights) {
  fs::remove(dir_ + "/model.safetensors");
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

TEST_F(ModelDirTest, TruncatedWeights) {
  const auto size = fs::file_size(dir_ + "/model.safetensors");
  fs::resize_file(dir_ + "/model.safetensors", size - 1000);
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("model.safetensors"), HasSubstr("truncated")));
}

TEST_F(ModelDirTest, GarbageHeaderLength) {
  std::fstream f(dir_ + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  const char big[8] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\x00', '\x00'};
  f.write(big, 8);
  f.close();
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

TEST_F(ModelDirTest, MissingTensor) {
  EditWeights([](std::vector<TensorToWrite>& ts) {
    std::erase_if(ts, [](const TensorToWrite& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; });
  });
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.1.mlp.up_proj.weight"));
}

TEST_F(ModelDirTest, ExtraTensor) {
  EditWeights([](std::vector<TensorToWrite>& ts) {
    ts.push_back({"model.layers.0.self_attn.q_norm.weight", DType::kBF16, {16}, std::vector<uint8_t>(32)});
  });
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.0.self_attn.q_norm.weight"));
}

TEST_F(ModelDirTest, ShapeMismatch) {
  EditConfig([](nlohmann::json& j) { j["intermediate_size"] = 256; });
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("mlp"), HasSubstr("256")));
}

TEST_F(ModelDirTest, IntegerTensorWhereFloatExpected) {
  EditWeights([](std::vector<TensorToWrite>& ts) {
    for (auto& t : ts)
      if (t.name == "model.norm.weight") {
        t.dtype = DType::kI32;
        t.shape = {32};  // 64 bf16 = 128 bytes = 32 int32
      }
  });
  Status s = Load();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), AllOf(HasSubstr("model.norm.weight"), HasSubstr("I32")));
}

TEST_F(ModelDirTest, ShardedIndexNamingMissingShard) {
  CopyFixture("llama3_rope");
  ASSERT_TRUE(Load().ok());
  nlohmann::json idx = ReadJson("model.safetensors.index.json");
  std::string shard = idx["weight_map"].begin().value();
  fs::remove(dir_ + "/" + shard);
  Status s = Load();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(shard));
}

TEST_F(ModelDirTest, UnsupportedRopeType) {
  EditConfig([](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; });
  Status s = Load();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("yarn"));
}

TEST_F(ModelDirTest, UnsupportedChatTemplateSyntaxFailsAtLoad) {
  nlohmann::json tc = ReadJson("tokenizer_config.json");
  tc["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfro %}";
  WriteText("tokenizer_config.json", tc.dump());
  Status s = Load();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("chat template"));
}

TEST_F(ModelDirTest, TransformersFiveTemplateFileWins) {
  CopyFixture("qwen3");
  WriteText("chat_template.jinja", "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}");
  CpuBackendOptions bo;
  auto b = CreateCpuBackend(bo);
  auto m = LoadModelDir(dir_, **b, {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ChatTemplateInputs in;
  in.messages = nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}});
  auto r = (*m)->chat_template->Render(in);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "[user]hi");
}

// DeepSeek V4's multi-token-prediction weights (config num_nextn_predict_layers
// 1): transformers' "mtp.*" and DeepSeek's model.layers.<num_hidden_layers>
// are skipped explicitly; a tensor past them, or anything else unknown, is
// still an error naming it.
TEST_F(ModelDirTest, DeepseekV4SkipsMtpWeightsByNameOnly) {
  CopyFixture("deepseek_v4");
  ASSERT_TRUE(Load().ok()) << Load().ToString();
  auto extra = [](const std::string& name) {
    return [name](std::vector<TensorToWrite>& ts) {
      ts.push_back({name, DType::kF32, {2}, std::vector<uint8_t>(8, 0)});
    };
  };
  EditWeights(extra("mtp.0.enorm.weight"));
  EditWeights(extra("model.layers.4.attn.wq_a.weight"));
  EXPECT_TRUE(Load().ok()) << Load().ToString();
  EditWeights(extra("model.layers.5.attn.wq_a.weight"));  // past the one MTP layer
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.5.attn.wq_a.weight"));
  EXPECT_THAT(s.message(), Not(HasSubstr("mtp.0")));
  CopyFixture("deepseek_v4");
  EditConfig([](nlohmann::json& j) { j["num_nextn_predict_layers"] = 0; });
  EditWeights(extra("mtp.0.enorm.weight"));
  EXPECT_THAT(Load().message(), HasSubstr("mtp.0.enorm.weight"));
}

}  // namespace
}  // namespace strata

#include "model/hf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/rope.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// config.json of meta-llama/Llama-3.2-1B as published.
const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// The same model saved by transformers 5.
const char* kLlama32V5 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": true,
  "transformers_version": "5.0.0",
  "use_cache": true,
  "vocab_size": 128256
})";

const char* kLlama2 = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

ModelConfig MustParse(const std::string& text) {
  auto c = ParseModelConfig(text, "config.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ModelConfig{};
}

// kBase with `patch` merged in (null values delete keys).
std::string Patched(const char* base, const Json& patch) {
  Json j = Json::parse(base);
  j.merge_patch(patch);
  return j.dump();
}

Status ParseError(const std::string& text) {
  auto c = ParseModelConfig(text, "/models/x/config.json");
  EXPECT_FALSE(c.ok()) << text;
  return c.ok() ? OkStatus() : c.status();
}

// Error messages quote the bad value; a 200,000-deep [[[...]]] used to be
// dumped whole, recursing once per level until the stack overflowed.
TEST(HfConfigTest, DeeplyNestedFieldInErrorIsNotDumpedWhole) {
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  std::string text = kQwen25;
  text.replace(text.find("151936"), 6, deep);
  Status s = ParseError(text);
  EXPECT_THAT(s.message(),
              HasSubstr("field 'vocab_size' must be an integer, got a deeply nested array"));
}

// 1e400 makes nlohmann throw out_of_range (not parse_error); it used to
// escape ParseModelConfig as an exception.
TEST(HfConfigTest, NumberTooLargeForADoubleIsInvalidArgument) {
  std::string text = kQwen25;
  text.replace(text.find("151936"), 6, "1e400");
  Status s = ParseError(text);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("/models/x/config.json: not valid JSON"));
  auto g = ParseGenerationConfig(R"({"temperature": -1e400})", "generation_config.json");
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
}

TEST(HfConfigTest, Llama32Published) {
  ModelConfig c = MustParse(kLlama32);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001));
}

TEST(HfConfigTest, Transformers5DialectMatchesPublished) {
  ModelConfig a = MustParse(kLlama32);
  ModelConfig b = MustParse(kLlama32V5);
  EXPECT_EQ(b.rope.type, a.rope.type);
  EXPECT_DOUBLE_EQ(b.rope.theta, a.rope.theta);
  EXPECT_DOUBLE_EQ(b.rope.factor, a.rope.factor);
  EXPECT_DOUBLE_EQ(b.rope.low_freq_factor, a.rope.low_freq_factor);
  EXPECT_DOUBLE_EQ(b.rope.high_freq_factor, a.rope.high_freq_factor);
  EXPECT_EQ(b.rope.original_max_position_embeddings, a.rope.original_max_position_embeddings);
  EXPECT_EQ(b.dtype, a.dtype);
  EXPECT_EQ(b.head_dim, a.head_dim);
}

TEST(HfConfigTest, Llama2) {
  ModelConfig c = MustParse(kLlama2);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 128);  // 4096 / 32
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);  // LlamaConfig default
  EXPECT_EQ(c.dtype, "float16");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
}

TEST(HfConfigTest, Mistral7BSlidingWindow) {
  ModelConfig c = MustParse(kMistral7B);
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.attention_bias);
  // v0.2+ sets null: full attention. Absent: MistralConfig's default 4096.
  EXPECT_EQ(MustParse(Patched(kMistral7B, {{"sliding_window", nullptr}})).sliding_window, 4096);
  Json j = Json::parse(kMistral7B);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(MustParse(j.dump()).sliding_window, 0);
  // Mistral has no attention_bias field; transformers ignores it.
  EXPECT_FALSE(MustParse(Patched(kMistral7B, {{"attention_bias", true}})).attention_bias);
}

TEST(HfConfigTest, Qwen25) {
  ModelConfig c = MustParse(kQwen25);
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c.attention_bias);  // Qwen2 always has q/k/v biases
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151643));
  EXPECT_TRUE(MustParse(Patched(kQwen25, {{"attention_bias", false}})).attention_bias);
}

TEST(HfConfigTest, Qwen3) {
  ModelConfig c = MustParse(kQwen3);
  EXPECT_EQ(c.head_dim, 128);  // explicit, != 1024 / 16
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);  // integer in the file
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151645));
  EXPECT_TRUE(MustParse(Patched(kQwen3, {{"attention_bias", true}})).attention_bias);
}

TEST(HfConfigTest, Qwen3Transformers5) {
  Json j = Json::parse(kQwen3);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  j["rope_parameters"] = {{"rope_theta", 1000000}, {"rope_type", "default"}};
  j["layer_types"] = std::vector<std::string>(28, "full_attention");
  ModelConfig c = MustParse(j.dump());
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.sliding_window, 0);
}

TEST(HfConfigTest, ModelTypeDefaults) {
  Json minimal = {{"model_type", "llama"},    {"vocab_size", 100},      {"hidden_size", 64},
                  {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
  ModelConfig l = MustParse(minimal.dump());
  EXPECT_EQ(l.architecture, "LlamaForCausalLM");
  EXPECT_EQ(l.num_key_value_heads, 4);
  EXPECT_EQ(l.head_dim, 16);
  EXPECT_EQ(l.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(l.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(l.rope.theta, 10000.0);
  EXPECT_FALSE(l.tie_word_embeddings);
  EXPECT_EQ(l.bos_token_id, 1);
  EXPECT_THAT(l.eos_token_ids, ElementsAre(2));

  // MistralConfig defaults to 8 KV heads (see MistralDefaultKvHeadsMustDivide).
  minimal["model_type"] = "mistral";
  minimal["num_attention_heads"] = 8;
  minimal["num_key_value_heads"] = nullptr;  // null: same as attention heads
  ModelConfig m = MustParse(minimal.dump());
  EXPECT_EQ(m.num_key_value_heads, 8);
  EXPECT_EQ(m.max_position_embeddings, 131072);
  EXPECT_EQ(m.sliding_window, 4096);

  minimal["model_type"] = "qwen3";
  minimal["num_attention_heads"] = 32;
  minimal.erase("num_key_value_heads");
  ModelConfig q = MustParse(minimal.dump());
  EXPECT_EQ(q.head_dim, 128);  // Qwen3Config default, not hidden / heads
  EXPECT_EQ(q.num_key_value_heads, 32);
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_FALSE(q.bos_token_id.has_value());
  EXPECT_TRUE(q.eos_token_ids.empty());
}

TEST(HfConfigTest, MistralDefaultKvHeadsMustDivide) {
  Json j = {{"model_type", "mistral"},  {"vocab_size", 100},      {"hidden_size", 64},
            {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
  Status s = ParseError(j.dump());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_key_value_heads (8, the mistral default"));
}

TEST(HfConfigTest, EosList) {
  ModelConfig c = MustParse(Patched(kLlama32, {{"eos_token_id", {128001, 128008, 128009}}}));
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
  Json j = Json::parse(kLlama32);
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(MustParse(j.dump()).eos_token_ids.empty());
}

TEST(HfConfigTest, RopeLinearWithOldTypeKey) {
  ModelConfig c =
      MustParse(Patched(kLlama2, {{"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}}));
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  c = MustParse(Patched(kLlama2, {{"rope_scaling", {{"rope_type", "default"}}}}));
  EXPECT_EQ(c.rope.type, "default");
}

// Qwen2.5's documented long-context setting: yarn, factor 4 over 32k.
TEST(HfConfigTest, YarnRopeFromQwenAndItsAttentionFactor) {
  ModelConfig c = MustParse(Patched(
      kQwen25,
      {{"rope_scaling",
        {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}}));
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  // transformers: attention_factor = get_mscale(factor) = 0.1 ln 4 + 1.
  EXPECT_NEAR(RopeAttentionScaling(c.rope), 0.1 * std::log(4.0) + 1, 1e-6);
  // mscale / mscale_all_dim (DeepSeek) take their ratio instead; an explicit
  // attention_factor wins.
  c.rope.mscale = 1.0;
  c.rope.mscale_all_dim = 1.0;
  EXPECT_FLOAT_EQ(RopeAttentionScaling(c.rope), 1.0f);
  c.rope.mscale_all_dim = 0.5;
  EXPECT_NEAR(RopeAttentionScaling(c.rope), (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1),
              1e-6);
  c.rope.attention_factor = 0.7;
  EXPECT_FLOAT_EQ(RopeAttentionScaling(c.rope), 0.7f);
  Status s = ParseError(Patched(kQwen25, {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}}));
  EXPECT_THAT(s.message(), HasSubstr("rope_scaling.original_max_position_embeddings"));
  // The inv_freq table: the fastest dims keep their frequency (extrapolation),
  // the slowest are divided by the factor (interpolation).
  auto inv = ComputeInvFreq(c.rope, 128);
  ASSERT_TRUE(inv.ok());
  RopeConfig plain;
  plain.theta = c.rope.theta;
  auto base = ComputeInvFreq(plain, 128);
  EXPECT_FLOAT_EQ((*inv)[0], (*base)[0]);
  EXPECT_NEAR((*inv)[63], (*base)[63] / 4.0, 1e-12);
}

TEST(HfConfigTest, UnknownRopeTypeIsUnimplemented) {
  Status s = ParseError(Patched(kLlama32V5, {{"rope_parameters", {{"rope_type", "longrope"}}}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("'longrope'"));
  s = ParseError(Patched(kLlama32V5, {{"rope_parameters", {{"rope_type", "dynamic"}}}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("'dynamic'"));
}

TEST(HfConfigTest, Llama3RopeNeedsItsFields) {
  Status s = ParseError(Patched(kLlama32, {{"rope_scaling", {{"low_freq_factor", nullptr}}}}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rope_scaling.low_freq_factor"));
  s = ParseError(Patched(kLlama32V5, {{"rope_parameters", {{"factor", "big"}}}}));
  EXPECT_THAT(s.message(), HasSubstr("rope_parameters.factor"));
  s = ParseError(Patched(kLlama32, {{"rope_scaling", {{"high_freq_factor", 0.5}}}}));
  EXPECT_THAT(s.message(), HasSubstr("low_freq_factor < high_freq_factor"));
  s = ParseError(Patched(kLlama2, {{"rope_scaling", {{"type", "linear"}}}}));
  EXPECT_THAT(s.message(), HasSubstr("rope_scaling.factor"));
}

TEST(HfConfigTest, MissingRequiredFieldNamesIt) {
  for (const char* field : {"hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "model_type"}) {
    Json j = Json::parse(kLlama32);
    j.erase(field);
    Status s = ParseError(j.dump());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr("/models/x/config.json")) << field;
    EXPECT_THAT(s.message(), HasSubstr(std::string("'") + field + "'")) << field;
  }
}

TEST(HfConfigTest, WrongTypesNameTheField) {
  struct Case {
    const char* field;
    Json value;
  } cases[] = {
      {"hidden_size", "2048"},    {"num_hidden_layers", 16.5},
      {"rms_norm_eps", "1e-5"},   {"tie_word_embeddings", 1},
      {"torch_dtype", 16},        {"eos_token_id", "</s>"},
      {"eos_token_id", {1, "x"}}, {"architectures", "LlamaForCausalLM"},
      {"rope_scaling", "llama3"}, {"head_dim", "64"},
      {"bos_token_id", -1},       {"max_position_embeddings", Json::array()},
  };
  for (const auto& c : cases) {
    Json j = Json::parse(kLlama32);
    j[c.field] = c.value;
    Status s = ParseError(j.dump());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field << "=" << c.value.dump();
    EXPECT_THAT(s.message(), HasSubstr(std::string("'") + c.field + "'")) << c.value.dump();
  }
  // Whole numbers written as floats are accepted.
  EXPECT_EQ(MustParse(Patched(kLlama32, {{"hidden_size", 2048.0}})).hidden_size, 2048);
}

TEST(HfConfigTest, InconsistentValues) {
  Status s = ParseError(Patched(kLlama32, {{"num_key_value_heads", 5}}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("multiple of num_key_value_heads"));
  for (const char* field : {"hidden_size", "num_attention_heads", "vocab_size", "head_dim",
                            "num_key_value_heads", "max_position_embeddings"}) {
    for (int v : {0, -4}) {
      Status e = ParseError(Patched(kLlama32, {{field, v}}));
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << field << v;
      EXPECT_THAT(e.message(), HasSubstr(field)) << field << v;
    }
  }
  s = ParseError(Patched(kLlama2, {{"hidden_size", 4100}}));
  EXPECT_THAT(s.message(), HasSubstr("multiple of num_attention_heads"));
  s = ParseError(Patched(kLlama32, {{"rope_theta", -1.0}}));
  EXPECT_THAT(s.message(), HasSubstr("rope_theta"));
  s = ParseError(Patched(kLlama32, {{"rms_norm_eps", 0}}));
  EXPECT_THAT(s.message(), HasSubstr("rms_norm_eps"));
}

TEST(HfConfigTest, NotJsonOrNotObject) {
  Status s = ParseError("{\"model_type\": ");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("/models/x/config.json: not valid JSON"));
  s = ParseError("[1]");
  EXPECT_THAT(s.message(), HasSubstr("must be a JSON object"));
}

TEST(HfConfigTest, UnsupportedModelTypeAndDtype) {
  Status s = ParseError(Patched(kLlama32, {{"model_type", "gemma3"}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("'gemma3'"));
  s = ParseError(Patched(kLlama32, {{"torch_dtype", "float8_e4m3fn"}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("float8_e4m3fn"));
}

TEST(HfConfigTest, QuantizedCheckpointIsUnimplemented) {
  Status s = ParseError(Patched(
      kQwen25,
      {{"quantization_config", {{"bits", 4}, {"quant_method", "awq"}, {"group_size", 128}}}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("quant_method 'awq'"));
}

TEST(HfConfigTest, QwenSlidingWindow) {
  // Every layer sliding is supported; only some is not.
  ModelConfig c =
      MustParse(Patched(kQwen25, {{"use_sliding_window", true}, {"max_window_layers", 0}}));
  EXPECT_EQ(c.sliding_window, 32768);
  Status s =
      ParseError(Patched(kQwen25, {{"use_sliding_window", true}, {"max_window_layers", 21}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("3 of 24 layers"));
  // max_window_layers >= layers: nothing slides.
  EXPECT_EQ(MustParse(Patched(kQwen25, {{"use_sliding_window", true}})).sliding_window, 0);
  Json j = Json::parse(kQwen3);
  j["layer_types"] = std::vector<std::string>(27, "full_attention");
  j["layer_types"].push_back("sliding_attention");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  EXPECT_EQ(ParseError(j.dump()).code(), StatusCode::kUnimplemented);
}

TEST(HfConfigTest, PerLayerTypeRopeIsUnimplemented) {
  Json j = Json::parse(kLlama32V5);
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  Status e = ParseError(j.dump());
  EXPECT_EQ(e.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(e.message(), HasSubstr("per-layer-type"));
}

TEST(HfConfigTest, LoadModelConfigMissingFile) {
  auto c = LoadModelConfig("/nonexistent/dir/config.json");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/dir/config.json"));
}

// deepseek-ai/DeepSeek-V3's config.json as published, less its FP8
// quantization_config (a bf16 conversion of it).
const char* kDeepseekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
  "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.46.3", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 129280
})";

TEST(HfConfigTest, DeepseekV3Published) {
  ModelConfig c = MustParse(kDeepseekV3);
  EXPECT_EQ(c.architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(c.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(c.mla.v_head_dim, 128);
  EXPECT_TRUE(c.mla.rope_interleave);
  EXPECT_EQ(c.moe.n_routed_experts, 256);
  EXPECT_EQ(c.moe.n_shared_experts, 1);
  EXPECT_EQ(c.moe.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe.moe_intermediate_size, 2048);
  EXPECT_EQ(c.moe.first_k_dense_replace, 3);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.factor, 40);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  // The real checkpoint is FP8: refused as quantized, saying so.
  Status s = ParseError(Patched(kDeepseekV3, {{"quantization_config", {{"quant_method", "fp8"}}}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("fp8"));
  // No q low-rank (V2-Lite's shape): an explicit null; absent means
  // DeepseekV3Config's default, 1536.
  Json j = Json::parse(kDeepseekV3);
  j["q_lora_rank"] = nullptr;
  c = MustParse(j.dump());
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  j.erase("q_lora_rank");
  EXPECT_EQ(MustParse(j.dump()).mla.q_lora_rank, 1536);
}

// The fixture's config.json (transformers 5.17's save of a tiny
// DeepseekV4Config): every V4 field read, per-kind rope, layer kinds.
TEST(HfConfigTest, DeepseekV4FixtureConfig) {
  auto c = LoadModelConfig(std::string(STRATA_SOURCE_DIR) +
                           "/tests/fixtures/models/deepseek_v4/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const DeepseekV4Config& v = c->v4;
  using A = DeepseekV4Config::Attention;
  EXPECT_EQ(c->architecture, "DeepseekV4ForCausalLM");
  EXPECT_THAT(v.layer_types,
              ElementsAre(A::kSliding, A::kCompressedSparse, A::kHeavilyCompressed,
                          A::kCompressedSparse));
  EXPECT_THAT(v.hash_moe, ElementsAre(true, false, false, false));
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_key_value_heads, 1);
  EXPECT_EQ(c->intermediate_size, 32);  // moe_intermediate_size
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(v.rope_dim, 8);
  EXPECT_EQ(v.csa_rate, 4);
  EXPECT_EQ(v.hca_rate, 128);
  EXPECT_EQ(v.q_lora_rank, 32);
  EXPECT_EQ(v.o_groups, 2);
  EXPECT_EQ(v.o_lora_rank, 16);
  EXPECT_EQ(v.index_n_heads, 2);
  EXPECT_EQ(v.index_head_dim, 16);
  EXPECT_EQ(v.index_topk, 8);
  EXPECT_EQ(v.hc_mult, 2);
  EXPECT_EQ(v.hc_sinkhorn_iters, 20);
  EXPECT_DOUBLE_EQ(v.swiglu_limit, 10.0);
  EXPECT_DOUBLE_EQ(v.main_rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(v.compress_rope.theta, 160000.0);
  EXPECT_EQ(c->moe.scoring_func, "sqrtsoftplus");
  EXPECT_EQ(c->moe.n_routed_experts, 8);
  EXPECT_EQ(c->moe.num_experts_per_tok, 2);
  EXPECT_DOUBLE_EQ(c->moe.routed_scaling_factor, 1.5);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
}

TEST(HfConfigTest, DeepseekV4RefusesWhatItCannotRunByName) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) +
                   "/tests/fixtures/models/deepseek_v4/config.json");
  const Json base = Json::parse(in);
  auto error = [&](const char* key, const Json& value) {
    Json j = base;
    j[key] = value;
    return ParseError(j.dump());
  };
  Status s = error("scoring_func", "softmax");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("scoring_func 'softmax'"));
  EXPECT_THAT(error("num_key_value_heads", 2).message(), HasSubstr("num_key_value_heads 2"));
  EXPECT_THAT(error("mlp_bias", true).message(), HasSubstr("mlp_bias"));
  EXPECT_THAT(error("n_shared_experts", 2).message(), HasSubstr("n_shared_experts 2"));
  EXPECT_THAT(error("layer_types", Json::array({"sliding_attention", "full_attention",
                                                "sliding_attention", "sliding_attention"}))
                  .message(),
              HasSubstr("layer_types[1]"));
  EXPECT_THAT(error("mlp_layer_types", Json::array({"moe", "dense", "moe", "moe"})).message(),
              HasSubstr("mlp_layer_types[1]"));
  EXPECT_THAT(error("compress_rates", {{"full_attention", 2}}).message(),
              HasSubstr("compress_rates.full_attention"));
  Json j = base;
  j["rope_parameters"]["compress"]["rope_type"] = "llama3";
  j["rope_parameters"]["compress"]["factor"] = 2.0;
  j["rope_parameters"]["compress"]["low_freq_factor"] = 1.0;
  j["rope_parameters"]["compress"]["high_freq_factor"] = 4.0;
  j["rope_parameters"]["compress"]["original_max_position_embeddings"] = 64;
  EXPECT_THAT(ParseError(j.dump()).message(), HasSubstr("rope type 'llama3'"));
  // Legacy spellings and defaults fold in as DeepseekV4Config's __post_init__.
  j = base;
  j.erase("layer_types");
  j.erase("mlp_layer_types");
  j.erase("compress_rates");
  j["compress_ratios"] = {0, 4, 128, 4};
  j["num_hash_layers"] = 2;
  ModelConfig c = MustParse(j.dump());
  using A = DeepseekV4Config::Attention;
  EXPECT_THAT(c.v4.layer_types, ElementsAre(A::kSliding, A::kCompressedSparse,
                                            A::kHeavilyCompressed, A::kCompressedSparse));
  EXPECT_THAT(c.v4.hash_moe, ElementsAre(true, true, false, false));
  j.erase("compress_ratios");
  EXPECT_THAT(MustParse(j.dump()).v4.layer_types,
              ElementsAre(A::kHeavilyCompressed, A::kHeavilyCompressed, A::kHeavilyCompressed,
                          A::kCompressedSparse));
}

TEST(HfConfigTest, DeepseekV3RoutingOtherThanV3sIsRefused) {
  Status s = ParseError(Patched(kDeepseekV3, {{"scoring_func", "softmax"}}));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("scoring_func 'softmax'"));
  s = ParseError(Patched(kDeepseekV3, {{"topk_method", "group_limited_greedy"}}));
  EXPECT_THAT(s.message(), HasSubstr("topk_method 'group_limited_greedy'"));
  s = ParseError(Patched(kDeepseekV3, {{"moe_layer_freq", 2}}));
  EXPECT_THAT(s.message(), HasSubstr("moe_layer_freq 2"));
  s = ParseError(Patched(kDeepseekV3, {{"n_group", 7}}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("n_group (7)"));
  s = ParseError(Patched(kDeepseekV3, {{"num_experts_per_tok", 200}}));
  EXPECT_THAT(s.message(), HasSubstr("num_experts_per_tok (200)"));
  s = ParseError(Patched(kDeepseekV3, {{"qk_rope_head_dim", 63}}));
  EXPECT_THAT(s.message(), HasSubstr("qk_rope_head_dim"));
  s = ParseError(Patched(kDeepseekV3, {{"kv_lora_rank", "big"}}));
  EXPECT_THAT(s.message(), HasSubstr("'kv_lora_rank'"));
}

// The KV cache DeepSeek V3 declares: one K-only latent group of
// kv_lora_rank + qk_rope_head_dim per token and layer (576 x 61 layers).
TEST(HfConfigTest, DeepseekV3KvLayoutIsOneLatentGroup) {
  auto layout = KvLayoutForConfig(MustParse(kDeepseekV3), 64, DType::kBF16);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->groups.size(), 1u);
  const PoolGroupSpec& g = layout->groups[0];
  EXPECT_EQ(g.name, "mla_latent");
  EXPECT_EQ(g.num_layers, 61);
  EXPECT_EQ(g.num_kv_heads, 1);
  EXPECT_EQ(g.head_dim, 576);
  EXPECT_FALSE(g.has_v);
  EXPECT_EQ(layout->BytesPerToken(), 61u * 576 * 2);
}

TEST(GenerationConfigTest, Llama32Instruct) {
  auto g = ParseGenerationConfig(R"({
    "bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
    "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0.dev0"})",
                                 "generation_config.json");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_THAT(g->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(g->bos_token_id, 128000);
  EXPECT_EQ(g->do_sample, true);
  EXPECT_DOUBLE_EQ(*g->temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g->top_p, 0.9);
  EXPECT_FALSE(g->top_k.has_value());
  EXPECT_FALSE(g->min_p.has_value());
}

TEST(GenerationConfigTest, Qwen3) {
  auto g = ParseGenerationConfig(R"({
    "bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
    "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
    "transformers_version": "4.51.0"})",
                                 "generation_config.json");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->top_k, 20);
  EXPECT_THAT(g->eos_token_ids, ElementsAre(151645, 151643));
  auto single = ParseGenerationConfig(R"({"eos_token_id": 2, "max_new_tokens": 256,
      "repetition_penalty": 1.1, "min_p": 0.05, "temperature": null})",
                                      "g.json");
  ASSERT_TRUE(single.ok());
  EXPECT_THAT(single->eos_token_ids, ElementsAre(2));
  EXPECT_EQ(single->max_new_tokens, 256);
  EXPECT_DOUBLE_EQ(*single->repetition_penalty, 1.1);
  EXPECT_FALSE(single->temperature.has_value());
}

TEST(GenerationConfigTest, Errors) {
  for (const char* bad :
       {R"({"temperature": "hot"})", R"({"top_p": 1.5})", R"({"top_k": 2.5})", R"({"top_k": -1})",
        R"({"do_sample": "yes"})", R"({"eos_token_id": [1.5]})", R"({"repetition_penalty": 0})",
        R"({"max_new_tokens": 0})", R"({"temperature": -1})", R"({"min_p": 2})"}) {
    auto g = ParseGenerationConfig(bad, "/m/generation_config.json");
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(g.status().message(), HasSubstr("/m/generation_config.json: field '")) << bad;
  }
  EXPECT_EQ(ParseGenerationConfig("nope", "g.json").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata

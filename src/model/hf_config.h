// The parts of a Hugging Face model directory's config.json and
// generation_config.json that Strata needs, parsed into plain structs.
//
// Both dialects real users have are accepted:
//  - published checkpoints: "rope_theta" + "rope_scaling" + "torch_dtype"
//  - transformers >= 5:     "rope_parameters" (holds rope_theta and the
//                           scaling fields) + "dtype"
// Fields a config leaves out get the defaults of transformers' config class
// for its model_type (llama, mistral, qwen2, qwen3; others are Unimplemented).
// Errors name the file and the field and say what was expected:
// InvalidArgument for missing/mistyped/inconsistent fields, Unimplemented for
// valid settings Strata cannot run (rope types other than default/linear/
// llama3, sliding windows on only some layers, quantized checkpoints).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace strata {

struct RopeConfig {
  std::string type = "default";  // "default", "linear", "llama3" (others: Unimplemented)
  double theta = 10000.0;
  double factor = 1.0;  // linear, llama3
  double low_freq_factor = 1.0;  // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;  // llama3
  double partial_rotary_factor = 1.0;
};

struct ModelConfig {
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM"
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases: Qwen2 always (o_proj never); Llama/Qwen3 from
                                // the field, where it also gives o_proj a bias
  bool mlp_bias = false;
  int64_t sliding_window = 0;   // 0: none (Mistral: null; Qwen: use_sliding_window false)
  std::string dtype = "bfloat16";  // torch_dtype / dtype: "bfloat16", "float16", "float32"
  RopeConfig rope;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // eos_token_id may be an int or a list
};

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<bool> do_sample;
  std::optional<int64_t> max_new_tokens;
};

// Parses config.json text; `path` is used in error messages only.
StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& path);
StatusOr<ModelConfig> LoadModelConfig(const std::string& path);
// Parses generation_config.json text.
StatusOr<GenerationConfig> ParseGenerationConfig(const std::string& json_text,
                                                 const std::string& path);

}  // namespace strata

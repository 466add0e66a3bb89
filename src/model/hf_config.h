// The parts of a Hugging Face model directory's config.json and
// generation_config.json that Strata needs, parsed into plain structs.
//
// Both dialects real users have are accepted:
//  - published checkpoints: "rope_theta" + "rope_scaling" + "torch_dtype"
//  - transformers >= 5:     "rope_parameters" (holds rope_theta and the
//                           scaling fields) + "dtype"
// Fields a config leaves out get the defaults of transformers' config class
// for its model_type (llama, mistral, qwen2, qwen3, deepseek_v3,
// deepseek_v4; others are Unimplemented).
// Errors name the file and the field and say what was expected:
// InvalidArgument for missing/mistyped/inconsistent fields, Unimplemented for
// valid settings Strata cannot run (rope types other than default/linear/
// llama3/yarn, sliding windows on only some layers, quantized checkpoints).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace strata {

struct RopeConfig {
  std::string type = "default";  // "default", "linear", "llama3", "yarn" (others: Unimplemented)
  double theta = 10000.0;
  double factor = 1.0;  // linear, llama3
  double low_freq_factor = 1.0;  // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn
  double partial_rotary_factor = 1.0;
  // yarn (transformers' _compute_yarn_parameters; 0 / absent as there).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  std::optional<double> attention_factor;
  bool truncate = true;
};

// Multi-head latent attention (DeepSeek V2/V3): queries through an optional
// low-rank projection; keys and values expanded from one compressed latent
// per token plus a shared rotary key, which is all the KV cache holds.
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: a direct q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;  // rotary dims in interleaved pairs
};

// A mixture-of-experts MLP (routed plus shared experts). n_routed_experts 0:
// every layer is dense.
struct MoeConfig {
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;  // layers [0, k) use the dense MLP
  int64_t n_group = 1;                // group-limited routing: experts in n_group groups,
  int64_t topk_group = 1;             // tokens pick from the best topk_group of them
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::string scoring_func = "sigmoid";
};

// DeepSeek V4 (transformers 5.17's DeepseekV4Config): shared K=V
// single-head attention over a sliding window plus, per layer type, a
// compressed history; hyper-connection residual streams; MoE with
// sqrt(softplus) scores and hash routing on some layers. See
// docs/architecture/model.md "DeepSeek V4 forward".
struct DeepseekV4Config {
  enum class Attention { kSliding, kCompressedSparse, kHeavilyCompressed };
  std::vector<Attention> layer_types;  // one per layer
  std::vector<bool> hash_moe;          // mlp_layer_types: true for "hash_moe"
  int64_t q_lora_rank = 1024;
  int64_t rope_dim = 64;  // qk_rope_head_dim = head_dim * partial_rotary_factor
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  int64_t csa_rate = 4;    // compress_rates["compressed_sparse_attention"]
  int64_t hca_rate = 128;  // compress_rates["heavily_compressed_attention"]
  int64_t index_n_heads = 64;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double swiglu_limit = 10.0;
  RopeConfig main_rope;      // rope_parameters["main"]: sliding layers
  RopeConfig compress_rope;  // rope_parameters["compress"]: CSA/HCA layers and compressors
};

struct ModelConfig {
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM"
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3", "deepseek_v3"
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
  MlaConfig mla;  // deepseek_v3
  MoeConfig moe;  // deepseek_v3, deepseek_v4
  DeepseekV4Config v4;  // deepseek_v4
  // Multi-token-prediction layers a checkpoint may append after the last
  // decoder layer (model.layers.<num_hidden_layers + i>.*); loaded as
  // nothing (skipped explicitly), never mistaken for decoder layers.
  int64_t num_nextn_predict_layers = 0;
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

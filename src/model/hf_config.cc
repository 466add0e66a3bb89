#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/json_snippet.h"

namespace strata {

namespace {

using Json = nlohmann::json;

// Defaults of transformers' configuration classes
// (transformers/models/<type>/configuration_<type>.py) for the fields that
// differ between model types. Fields a real checkpoint always sets
// (vocab_size, hidden_size, ...) are required here instead of defaulted.
struct TypeDefaults {
  const char* model_type;
  const char* architecture;  // when "architectures" is absent
  int64_t max_position_embeddings;
  int64_t num_key_value_heads;          // when the key is absent; 0: num_attention_heads
  int64_t head_dim;                     // when absent or null; 0: hidden_size / heads
  std::optional<int64_t> bos_token_id;  // when the key is absent
  std::optional<int64_t> eos_token_id;
  bool reads_attention_bias;  // llama, qwen3: "attention_bias" field
  bool always_qkv_bias;       // qwen2: q/k/v biases are hard-wired
  bool reads_mlp_bias;        // llama
  enum { kNoWindow, kMistralWindow, kQwenWindow } window;
};

constexpr TypeDefaults kTypes[] = {
    {"llama", "LlamaForCausalLM", 2048, 0, 0, 1, 2, true, false, true, TypeDefaults::kNoWindow},
    {"mistral", "MistralForCausalLM", 4096 * 32, 8, 0, 1, 2, false, false, false,
     TypeDefaults::kMistralWindow},
    {"qwen2", "Qwen2ForCausalLM", 32768, 32, 0, std::nullopt, std::nullopt, false, true, false,
     TypeDefaults::kQwenWindow},
    {"qwen3", "Qwen3ForCausalLM", 32768, 32, 128, std::nullopt, std::nullopt, true, false, false,
     TypeDefaults::kQwenWindow},
    {"deepseek_v3", "DeepseekV3ForCausalLM", 4096, 0, 0, 0, 1, true, false, false,
     TypeDefaults::kNoWindow},
    // The window is every layer's (ParseDeepseekV4 reads it).
    {"deepseek_v4", "DeepseekV4ForCausalLM", 1048576, 1, 512, 0, 1, true, false, true,
     TypeDefaults::kNoWindow},
};

// Typed access to one JSON object with errors that name the file and field.
class Fields {
 public:
  Fields(const Json& j, std::string path, std::string prefix = "")
      : j_(j), path_(std::move(path)), prefix_(std::move(prefix)) {}

  // Present and not null.
  bool Has(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  bool Contains(const char* key) const { return j_.contains(key); }
  const Json& at(const char* key) const { return j_.at(key); }

  Status Error(const char* key, const std::string& want) const {
    std::string got = j_.contains(key) ? JsonSnippet(j_.at(key)) : "nothing";
    return InvalidArgument(path_ + ": field '" + prefix_ + key + "' must be " + want + ", got " +
                           got);
  }
  Status Missing(const char* key, const std::string& want) const {
    return InvalidArgument(path_ + ": required field '" + prefix_ + key + "' (" + want +
                           ") is missing");
  }

  // Leaves *out unchanged when the field is absent or null, unless required.
  Status Int(const char* key, int64_t* out, bool required = false) const {
    if (!Has(key)) return required ? Missing(key, "an integer") : OkStatus();
    const Json& v = j_.at(key);
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Error(key, "an integer that fits in 64 bits");
      }
      *out = v.get<int64_t>();
      return OkStatus();
    }
    // 4096.0 is a whole number written by some converters; 4096.5 is not.
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
        *out = static_cast<int64_t>(d);
        return OkStatus();
      }
    }
    return Error(key, "an integer");
  }
  Status Positive(const char* key, int64_t* out, bool required = false) const {
    RETURN_IF_ERROR(Int(key, out, required));
    if (Has(key) && *out <= 0) return Error(key, "a positive integer");
    return OkStatus();
  }
  Status Double(const char* key, double* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_number()) return Error(key, "a number");
    *out = v.get<double>();
    if (!std::isfinite(*out)) return Error(key, "a finite number");
    return OkStatus();
  }
  Status Bool(const char* key, bool* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_boolean()) return Error(key, "true or false");
    *out = v.get<bool>();
    return OkStatus();
  }
  Status String(const char* key, std::string* out, bool required = false) const {
    if (!Has(key)) return required ? Missing(key, "a string") : OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_string()) return Error(key, "a string");
    *out = v.get<std::string>();
    return OkStatus();
  }
  // An int or a list of ints (eos_token_id). Null gives an empty list.
  Status IntOrList(const char* key, std::vector<int64_t>* out) const {
    if (!Contains(key)) return OkStatus();
    const Json& v = j_.at(key);
    out->clear();
    if (v.is_null()) return OkStatus();
    auto one = [&](const Json& e) -> bool {
      if (!e.is_number_integer() || e.get<int64_t>() < 0) return false;
      out->push_back(e.get<int64_t>());
      return true;
    };
    if (v.is_array()) {
      for (const auto& e : v) {
        if (!one(e)) return Error(key, "a token id or a list of token ids (non-negative integers)");
      }
      return OkStatus();
    }
    if (!one(v)) return Error(key, "a token id or a list of token ids (non-negative integers)");
    return OkStatus();
  }
  Status OptionalTokenId(const char* key, std::optional<int64_t>* out) const {
    if (!Contains(key)) return OkStatus();
    if (j_.at(key).is_null()) {
      out->reset();
      return OkStatus();
    }
    int64_t v = 0;
    RETURN_IF_ERROR(Int(key, &v));
    if (v < 0) return Error(key, "a non-negative token id");
    *out = v;
    return OkStatus();
  }

 private:
  const Json& j_;
  std::string path_;
  std::string prefix_;
};

StatusOr<Json> ParseObject(const std::string& text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for 1e400
    return InvalidArgument(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) {
    return InvalidArgument(path + ": must be a JSON object, got " + std::string(j.type_name()));
  }
  return j;
}

Status ParseRopeObject(const Json& p, const std::string& path, const std::string& prefix,
                       RopeConfig* rope);
Status CheckRope(const std::string& path, const RopeConfig& rope);

// Reads the rope settings from either dialect:
//   published: "rope_theta": 500000.0, "rope_scaling": {"rope_type"|"type": ..., "factor": ...}
//   transformers 5: "rope_parameters": {"rope_type": ..., "rope_theta": ..., "factor": ...}
Status ParseRope(const Json& j, const std::string& path, RopeConfig* rope) {
  Fields top(j, path);
  RETURN_IF_ERROR(top.Double("rope_theta", &rope->theta));
  RETURN_IF_ERROR(top.Double("partial_rotary_factor", &rope->partial_rotary_factor));

  const char* key = nullptr;
  if (top.Has("rope_parameters")) {
    key = "rope_parameters";
  } else if (top.Has("rope_scaling")) {
    key = "rope_scaling";
  }
  if (key != nullptr) {
    const Json& p = j.at(key);
    if (!p.is_object()) return top.Error(key, "an object or null");
    // transformers 5 nests one dict per layer type for models that mix
    // attention kinds (e.g. {"full_attention": {...}, "sliding_attention": {...}}).
    if (!p.contains("rope_type") && !p.contains("type") && !p.empty() && p.begin()->is_object()) {
      return Unimplemented(path + ": per-layer-type '" + key +
                           "' (one rope setting per attention kind) is not supported");
    }
    RETURN_IF_ERROR(ParseRopeObject(p, path, std::string(key) + ".", rope));
  }
  return CheckRope(path, *rope);
}

// One rope settings object ({"rope_type": ..., "rope_theta": ..., ...}),
// `prefix` naming it in errors ("rope_parameters.").
Status ParseRopeObject(const Json& p, const std::string& path, const std::string& prefix,
                       RopeConfig* rope) {
  {
    const std::string key = prefix.substr(0, prefix.size() - 1);
    Fields f(p, path, prefix);
    // "type" is the older spelling of "rope_type".
    RETURN_IF_ERROR(f.String(f.Has("rope_type") ? "rope_type" : "type", &rope->type));
    RETURN_IF_ERROR(f.Double("rope_theta", &rope->theta));
    RETURN_IF_ERROR(f.Double("partial_rotary_factor", &rope->partial_rotary_factor));
    if (rope->type == "linear" || rope->type == "llama3" || rope->type == "yarn") {
      if (!f.Has("factor")) return f.Missing("factor", "a number, the rope scaling factor");
      RETURN_IF_ERROR(f.Double("factor", &rope->factor));
      if (rope->factor <= 0) return f.Error("factor", "a positive number");
    }
    if (rope->type == "llama3") {
      const char* kWant = "a number; llama3 rope scaling needs it";
      if (!f.Has("low_freq_factor")) return f.Missing("low_freq_factor", kWant);
      if (!f.Has("high_freq_factor")) return f.Missing("high_freq_factor", kWant);
      if (!f.Has("original_max_position_embeddings")) {
        return f.Missing("original_max_position_embeddings",
                         "an integer; llama3 rope scaling needs it");
      }
      RETURN_IF_ERROR(f.Double("low_freq_factor", &rope->low_freq_factor));
      RETURN_IF_ERROR(f.Double("high_freq_factor", &rope->high_freq_factor));
      RETURN_IF_ERROR(
          f.Positive("original_max_position_embeddings", &rope->original_max_position_embeddings));
      if (rope->low_freq_factor <= 0 || rope->high_freq_factor <= rope->low_freq_factor) {
        return InvalidArgument(path + ": " + key +
                               " needs 0 < low_freq_factor < high_freq_factor, got " +
                               std::to_string(rope->low_freq_factor) + " and " +
                               std::to_string(rope->high_freq_factor));
      }
    }
    if (rope->type == "yarn") {
      if (!f.Has("original_max_position_embeddings")) {
        return f.Missing("original_max_position_embeddings",
                         "an integer; yarn rope scaling needs it");
      }
      RETURN_IF_ERROR(
          f.Positive("original_max_position_embeddings", &rope->original_max_position_embeddings));
      RETURN_IF_ERROR(f.Double("beta_fast", &rope->beta_fast));
      RETURN_IF_ERROR(f.Double("beta_slow", &rope->beta_slow));
      RETURN_IF_ERROR(f.Double("mscale", &rope->mscale));
      RETURN_IF_ERROR(f.Double("mscale_all_dim", &rope->mscale_all_dim));
      RETURN_IF_ERROR(f.Bool("truncate", &rope->truncate));
      if (f.Has("attention_factor")) {
        double a = 0;
        RETURN_IF_ERROR(f.Double("attention_factor", &a));
        if (a <= 0) return f.Error("attention_factor", "a positive number");
        rope->attention_factor = a;
      }
      // transformers: a 0 or null beta falls back to its default.
      if (rope->beta_fast == 0) rope->beta_fast = 32.0;
      if (rope->beta_slow == 0) rope->beta_slow = 1.0;
    }
  }
  return OkStatus();
}

// The rope settings parsed are ones Strata runs.
Status CheckRope(const std::string& path, const RopeConfig& rope) {
  if (rope.type != "default" && rope.type != "linear" && rope.type != "llama3" &&
      rope.type != "yarn") {
    return Unimplemented(path + ": rope type '" + rope.type +
                         "' is not supported (supported: default, linear, llama3, yarn)");
  }
  if (rope.theta <= 0) {
    return InvalidArgument(path + ": rope_theta must be positive, got " +
                           std::to_string(rope.theta));
  }
  if (rope.partial_rotary_factor <= 0 || rope.partial_rotary_factor > 1) {
    return InvalidArgument(path + ": partial_rotary_factor must be in (0, 1], got " +
                           std::to_string(rope.partial_rotary_factor));
  }
  return OkStatus();
}

// Sliding-window attention as transformers decides it per model type.
Status ParseSlidingWindow(const Json& j, const std::string& path, const TypeDefaults& t,
                          ModelConfig* c) {
  Fields f(j, path);
  c->sliding_window = 0;
  if (t.window == TypeDefaults::kNoWindow) return OkStatus();
  int64_t window = 4096;  // both classes' default when the key is absent
  if (f.Contains("sliding_window") && j.at("sliding_window").is_null()) window = 0;
  RETURN_IF_ERROR(f.Int("sliding_window", &window));
  if (window < 0) return f.Error("sliding_window", "a non-negative integer or null");
  if (t.window == TypeDefaults::kMistralWindow) {  // every layer slides when set
    c->sliding_window = window;
    return OkStatus();
  }

  // Qwen2/Qwen3: the window exists only with use_sliding_window, and then
  // only layers >= max_window_layers slide; transformers 5 may spell the
  // per-layer choice out in "layer_types".
  bool use = false;
  RETURN_IF_ERROR(f.Bool("use_sliding_window", &use));
  if (!use) window = 0;
  int64_t sliding_layers = 0;
  if (f.Has("layer_types")) {
    const Json& lt = j.at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c->num_hidden_layers) {
      return f.Error("layer_types", "a list with one attention kind per layer (" +
                                        std::to_string(c->num_hidden_layers) + ")");
    }
    for (const auto& e : lt) {
      if (!e.is_string()) return f.Error("layer_types", "a list of strings");
      const std::string kind = e.get<std::string>();
      if (kind != "sliding_attention" && kind != "full_attention") {
        return Unimplemented(path + ": layer type '" + kind + "' is not supported");
      }
      sliding_layers += kind == "sliding_attention";
    }
  } else {
    int64_t max_window_layers = 28;
    RETURN_IF_ERROR(f.Int("max_window_layers", &max_window_layers));
    sliding_layers =
        std::max<int64_t>(0, c->num_hidden_layers - std::max<int64_t>(0, max_window_layers));
  }
  if (window == 0 || sliding_layers == 0) return OkStatus();
  if (sliding_layers != c->num_hidden_layers) {
    return Unimplemented(path + ": sliding-window attention on only " +
                         std::to_string(sliding_layers) + " of " +
                         std::to_string(c->num_hidden_layers) +
                         " layers (use_sliding_window with max_window_layers or layer_types) "
                         "is not supported");
  }
  c->sliding_window = window;
  return OkStatus();
}

// DeepSeek V3's MLA and MoE fields, with DeepseekV3Config's defaults. The
// published config also names its routing ("scoring_func": "sigmoid",
// "topk_method": "noaux_tc", "moe_layer_freq": 1); anything else is another
// model (DeepSeek V2's softmax routing) and is refused rather than run wrong.
Status ParseDeepseekV3(const Json& j, const std::string& path, ModelConfig* c) {
  Fields f(j, path);
  MlaConfig& m = c->mla;
  m.kv_lora_rank = 512;
  m.q_lora_rank = 1536;
  m.qk_rope_head_dim = 64;
  m.qk_nope_head_dim = 128;
  m.v_head_dim = 128;
  RETURN_IF_ERROR(f.Positive("kv_lora_rank", &m.kv_lora_rank));
  if (f.Contains("q_lora_rank") && j.at("q_lora_rank").is_null()) m.q_lora_rank = 0;
  RETURN_IF_ERROR(f.Positive("q_lora_rank", &m.q_lora_rank));
  RETURN_IF_ERROR(f.Positive("qk_rope_head_dim", &m.qk_rope_head_dim));
  RETURN_IF_ERROR(f.Positive("qk_nope_head_dim", &m.qk_nope_head_dim));
  RETURN_IF_ERROR(f.Positive("v_head_dim", &m.v_head_dim));
  RETURN_IF_ERROR(f.Bool("rope_interleave", &m.rope_interleave));
  if (m.qk_rope_head_dim % 2) return f.Error("qk_rope_head_dim", "an even number");

  MoeConfig& e = c->moe;
  e.n_routed_experts = 256;
  e.n_shared_experts = 1;
  e.num_experts_per_tok = 8;
  e.moe_intermediate_size = 2048;
  e.first_k_dense_replace = 3;
  e.n_group = 8;
  e.topk_group = 4;
  e.routed_scaling_factor = 2.5;
  RETURN_IF_ERROR(f.Positive("n_routed_experts", &e.n_routed_experts));
  RETURN_IF_ERROR(f.Int("n_shared_experts", &e.n_shared_experts));
  RETURN_IF_ERROR(f.Positive("num_experts_per_tok", &e.num_experts_per_tok));
  RETURN_IF_ERROR(f.Positive("moe_intermediate_size", &e.moe_intermediate_size));
  RETURN_IF_ERROR(f.Int("first_k_dense_replace", &e.first_k_dense_replace));
  RETURN_IF_ERROR(f.Positive("n_group", &e.n_group));
  RETURN_IF_ERROR(f.Positive("topk_group", &e.topk_group));
  RETURN_IF_ERROR(f.Bool("norm_topk_prob", &e.norm_topk_prob));
  RETURN_IF_ERROR(f.Double("routed_scaling_factor", &e.routed_scaling_factor));
  RETURN_IF_ERROR(f.String("scoring_func", &e.scoring_func));
  if (e.n_shared_experts < 0) return f.Error("n_shared_experts", "an integer >= 0");
  if (e.first_k_dense_replace < 0) return f.Error("first_k_dense_replace", "an integer >= 0");
  if (e.scoring_func != "sigmoid") {
    return Unimplemented(path + ": scoring_func '" + e.scoring_func +
                         "' is not supported for deepseek_v3 (supported: sigmoid)");
  }
  std::string topk_method = "noaux_tc";
  RETURN_IF_ERROR(f.String("topk_method", &topk_method));
  if (topk_method != "noaux_tc") {
    return Unimplemented(path + ": topk_method '" + topk_method +
                         "' is not supported for deepseek_v3 (supported: noaux_tc)");
  }
  int64_t freq = 1;
  RETURN_IF_ERROR(f.Positive("moe_layer_freq", &freq));
  if (freq != 1) {
    return Unimplemented(path + ": moe_layer_freq " + std::to_string(freq) +
                         " is not supported (supported: 1, every layer after "
                         "first_k_dense_replace is MoE)");
  }
  if (e.n_routed_experts % e.n_group != 0 || e.n_routed_experts / e.n_group < 2) {
    return InvalidArgument(path + ": n_routed_experts (" + std::to_string(e.n_routed_experts) +
                           ") must split into n_group (" + std::to_string(e.n_group) +
                           ") groups of at least 2 experts");
  }
  if (e.topk_group > e.n_group ||
      e.num_experts_per_tok > e.topk_group * (e.n_routed_experts / e.n_group)) {
    return InvalidArgument(path + ": num_experts_per_tok (" +
                           std::to_string(e.num_experts_per_tok) + ") must fit in topk_group (" +
                           std::to_string(e.topk_group) + ") of n_group (" +
                           std::to_string(e.n_group) + ") expert groups");
  }
  // DeepseekV3Config's num_mtp_layers (default 1), spelled
  // num_nextn_predict_layers in config.json.
  c->num_nextn_predict_layers = 1;
  RETURN_IF_ERROR(f.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  if (c->num_nextn_predict_layers < 0) {
    return f.Error("num_nextn_predict_layers", "an integer >= 0");
  }
  return OkStatus();
}


// DeepSeek V4's fields with DeepseekV4Config's defaults (transformers 5.17).
// Settings transformers accepts but this engine does not run are refused by
// name (Unimplemented); fields transformers reads but ignores at inference
// (router_aux_loss_coef, router_jitter_noise, norm_topk_prob: V4 always
// renormalises) are accepted.
Status ParseDeepseekV4(const Json& j, const std::string& path, ModelConfig* c) {
  Fields f(j, path);
  DeepseekV4Config& v = c->v4;
  RETURN_IF_ERROR(f.Positive("q_lora_rank", &v.q_lora_rank));
  RETURN_IF_ERROR(f.Positive("o_groups", &v.o_groups));
  RETURN_IF_ERROR(f.Positive("o_lora_rank", &v.o_lora_rank));
  RETURN_IF_ERROR(f.Positive("index_n_heads", &v.index_n_heads));
  RETURN_IF_ERROR(f.Positive("index_head_dim", &v.index_head_dim));
  RETURN_IF_ERROR(f.Positive("index_topk", &v.index_topk));
  RETURN_IF_ERROR(f.Positive("hc_mult", &v.hc_mult));
  RETURN_IF_ERROR(f.Positive("hc_sinkhorn_iters", &v.hc_sinkhorn_iters));
  RETURN_IF_ERROR(f.Double("hc_eps", &v.hc_eps));
  RETURN_IF_ERROR(f.Double("swiglu_limit", &v.swiglu_limit));
  if (c->num_key_value_heads != 1) {
    return Unimplemented(path + ": num_key_value_heads " + std::to_string(c->num_key_value_heads) +
                         " is not supported for deepseek_v4 (its attention has one shared K=V head)");
  }
  if (c->attention_bias || c->mlp_bias) {
    return Unimplemented(path + ": " + (c->attention_bias ? "attention_bias" : "mlp_bias") +
                         " true is not supported for deepseek_v4 (its checkpoints have no biases)");
  }
  if (c->hidden_act != "silu") {
    return Unimplemented(path + ": hidden_act '" + c->hidden_act +
                         "' is not supported for deepseek_v4 (supported: silu)");
  }
  if (c->num_attention_heads * c->head_dim % v.o_groups != 0) {
    return f.Error("o_groups", "a divisor of num_attention_heads * head_dim (" +
                                   std::to_string(c->num_attention_heads * c->head_dim) + ")");
  }

  // Sliding window of every layer (transformers: kv_idx > q_idx - window).
  int64_t window = 128;
  RETURN_IF_ERROR(f.Positive("sliding_window", &window));
  c->sliding_window = window;

  // compress_rates (legacy: compress_rate_csa / compress_rate_hca).
  RETURN_IF_ERROR(f.Positive("compress_rate_csa", &v.csa_rate));
  RETURN_IF_ERROR(f.Positive("compress_rate_hca", &v.hca_rate));
  if (f.Has("compress_rates")) {
    const Json& r = j.at("compress_rates");
    if (!r.is_object()) return f.Error("compress_rates", "an object of rates per layer type");
    Fields rf(r, path, "compress_rates.");
    for (const auto& [name, unused] : r.items()) {
      if (name != "compressed_sparse_attention" && name != "heavily_compressed_attention") {
        return Unimplemented(path + ": compress_rates." + name + " names an unknown layer type");
      }
    }
    RETURN_IF_ERROR(rf.Positive("compressed_sparse_attention", &v.csa_rate));
    RETURN_IF_ERROR(rf.Positive("heavily_compressed_attention", &v.hca_rate));
  }

  // layer_types (legacy: compress_ratios 0 / 4 / 128 per layer; default:
  // two HCA layers, then CSA and HCA interleaved).
  const int64_t n = c->num_hidden_layers;
  using A = DeepseekV4Config::Attention;
  v.layer_types.clear();
  if (f.Has("layer_types")) {
    const Json& lt = j.at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) < n) {
      return f.Error("layer_types", "a list with one attention kind per layer (" +
                                        std::to_string(n) + ")");
    }
    for (int64_t i = 0; i < n; ++i) {
      const std::string kind = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (kind == "sliding_attention") {
        v.layer_types.push_back(A::kSliding);
      } else if (kind == "compressed_sparse_attention") {
        v.layer_types.push_back(A::kCompressedSparse);
      } else if (kind == "heavily_compressed_attention") {
        v.layer_types.push_back(A::kHeavilyCompressed);
      } else {
        return Unimplemented(path + ": layer_types[" + std::to_string(i) + "] " +
                             JsonSnippet(lt[i]) +
                             " is not a deepseek_v4 layer type (sliding_attention, "
                             "compressed_sparse_attention, heavily_compressed_attention)");
      }
    }
  } else if (f.Has("compress_ratios")) {
    const Json& cr = j.at("compress_ratios");
    if (!cr.is_array() || static_cast<int64_t>(cr.size()) < n) {
      return f.Error("compress_ratios", "a list with one ratio (0, 4 or 128) per layer");
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = cr[i].is_number_integer() ? cr[i].get<int64_t>() : -1;
      if (r == 0) {
        v.layer_types.push_back(A::kSliding);
      } else if (r == 4) {
        v.layer_types.push_back(A::kCompressedSparse);
      } else if (r == 128) {
        v.layer_types.push_back(A::kHeavilyCompressed);
      } else {
        return f.Error("compress_ratios", "a list of 0, 4 or 128");
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      v.layer_types.push_back(i < 2 || i % 2 == 0 ? A::kHeavilyCompressed : A::kCompressedSparse);
    }
  }

  // mlp_layer_types (legacy: num_hash_layers; default 3 hash layers).
  v.hash_moe.clear();
  if (f.Has("mlp_layer_types")) {
    const Json& mt = j.at("mlp_layer_types");
    if (!mt.is_array() || static_cast<int64_t>(mt.size()) < n) {
      return f.Error("mlp_layer_types", "a list with one MLP kind per layer (" +
                                            std::to_string(n) + ")");
    }
    for (int64_t i = 0; i < n; ++i) {
      const std::string kind = mt[i].is_string() ? mt[i].get<std::string>() : "";
      if (kind != "hash_moe" && kind != "moe") {
        return Unimplemented(path + ": mlp_layer_types[" + std::to_string(i) + "] " +
                             JsonSnippet(mt[i]) + " is not a deepseek_v4 MLP kind (hash_moe, moe)");
      }
      v.hash_moe.push_back(kind == "hash_moe");
    }
  } else {
    int64_t hash_layers = 3;
    RETURN_IF_ERROR(f.Int("num_hash_layers", &hash_layers));
    for (int64_t i = 0; i < n; ++i) v.hash_moe.push_back(i < hash_layers);
  }

  // Rotary: head_dim * partial_rotary_factor trailing dims of each head
  // (legacy: qk_rope_head_dim / head_dim; default 64 / 512). "main" for
  // sliding layers, "compress" for CSA/HCA layers and the compressors.
  double partial = 64.0 / 512.0;
  int64_t legacy_rope_dim = 0;
  RETURN_IF_ERROR(f.Positive("qk_rope_head_dim", &legacy_rope_dim));
  if (f.Has("partial_rotary_factor")) {
    RETURN_IF_ERROR(f.Double("partial_rotary_factor", &partial));
  } else if (legacy_rope_dim > 0) {
    partial = static_cast<double>(legacy_rope_dim) / static_cast<double>(c->head_dim);
  }
  v.rope_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * partial);
  if (v.rope_dim <= 0 || v.rope_dim % 2 || v.rope_dim > c->head_dim) {
    return InvalidArgument(path + ": head_dim * partial_rotary_factor (" +
                           std::to_string(v.rope_dim) +
                           ") must be an even number of dims in (0, head_dim]");
  }
  double rope_theta = 10000.0, compress_theta = 160000.0;
  RETURN_IF_ERROR(f.Double("rope_theta", &rope_theta));
  RETURN_IF_ERROR(f.Double("compress_rope_theta", &compress_theta));
  v.main_rope = RopeConfig{};
  v.main_rope.theta = rope_theta;
  v.main_rope.partial_rotary_factor = partial;
  v.compress_rope = v.main_rope;
  v.compress_rope.theta = compress_theta;
  const Json* rp = f.Has("rope_parameters") ? &j.at("rope_parameters") : nullptr;
  if (rp != nullptr && !rp->is_object()) return f.Error("rope_parameters", "an object or null");
  if (rp != nullptr && rp->contains("main") && rp->contains("compress")) {
    RETURN_IF_ERROR(ParseRopeObject(rp->at("main"), path, "rope_parameters.main.", &v.main_rope));
    RETURN_IF_ERROR(
        ParseRopeObject(rp->at("compress"), path, "rope_parameters.compress.", &v.compress_rope));
  } else if (rp != nullptr) {  // flat: the compress rope's scaling
    RETURN_IF_ERROR(ParseRopeObject(*rp, path, "rope_parameters.", &v.compress_rope));
    v.compress_rope.theta = compress_theta;
    v.compress_rope.partial_rotary_factor = partial;
  }
  // The V4 reference does not scale cos/sin by yarn's mscale.
  if (v.compress_rope.type == "yarn" && !v.compress_rope.attention_factor) {
    v.compress_rope.attention_factor = 1.0;
  }
  for (const RopeConfig* r : {&v.main_rope, &v.compress_rope}) {
    RETURN_IF_ERROR(CheckRope(path, *r));
    if (r->type != "default" && r->type != "yarn") {
      return Unimplemented(path + ": rope type '" + r->type +
                           "' is not supported for deepseek_v4 (supported: default, yarn)");
    }
    if (static_cast<int64_t>(static_cast<double>(c->head_dim) * r->partial_rotary_factor) !=
        v.rope_dim) {
      return Unimplemented(path + ": rope_parameters with a partial_rotary_factor other than "
                                  "the model's (" + std::to_string(partial) +
                           ") are not supported for deepseek_v4");
    }
  }
  c->rope = v.main_rope;

  MoeConfig& e = c->moe;
  e.n_routed_experts = 256;
  e.n_shared_experts = 1;
  e.num_experts_per_tok = 6;
  e.moe_intermediate_size = 2048;
  e.first_k_dense_replace = 0;
  e.routed_scaling_factor = 1.5;
  e.scoring_func = "sqrtsoftplus";
  RETURN_IF_ERROR(f.Positive("n_routed_experts", &e.n_routed_experts));
  RETURN_IF_ERROR(f.Int("n_shared_experts", &e.n_shared_experts));
  RETURN_IF_ERROR(f.Positive("num_experts_per_tok", &e.num_experts_per_tok));
  RETURN_IF_ERROR(f.Positive("moe_intermediate_size", &e.moe_intermediate_size));
  RETURN_IF_ERROR(f.Bool("norm_topk_prob", &e.norm_topk_prob));
  RETURN_IF_ERROR(f.Double("routed_scaling_factor", &e.routed_scaling_factor));
  RETURN_IF_ERROR(f.String("scoring_func", &e.scoring_func));
  if (e.scoring_func != "sqrtsoftplus" && e.scoring_func != "sigmoid") {
    return Unimplemented(path + ": scoring_func '" + e.scoring_func +
                         "' is not supported for deepseek_v4 (supported: sqrtsoftplus, sigmoid)");
  }
  if (e.n_shared_experts != 1) {
    return Unimplemented(path + ": n_shared_experts " + std::to_string(e.n_shared_experts) +
                         " is not supported for deepseek_v4 (its shared MLP is one expert wide)");
  }
  if (e.num_experts_per_tok > e.n_routed_experts) {
    return f.Error("num_experts_per_tok", "at most n_routed_experts");
  }
  // transformers reads intermediate_size through moe_intermediate_size.
  c->intermediate_size = e.moe_intermediate_size;
  c->num_nextn_predict_layers = 1;
  RETURN_IF_ERROR(f.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  if (c->num_nextn_predict_layers < 0) {
    return f.Error("num_nextn_predict_layers", "an integer >= 0");
  }
  return OkStatus();
}
}  // namespace

StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& path) {
  ASSIGN_OR_RETURN(Json j, ParseObject(json_text, path));
  Fields f(j, path);
  ModelConfig c;

  RETURN_IF_ERROR(f.String("model_type", &c.model_type, /*required=*/true));
  const TypeDefaults* t = nullptr;
  for (const auto& d : kTypes) {
    if (c.model_type == d.model_type) t = &d;
  }
  if (t == nullptr) {
    return Unimplemented(
        path + ": model_type '" + c.model_type +
        "' is not supported (supported: llama, mistral, qwen2, qwen3, deepseek_v3, deepseek_v4)");
  }
  if (f.Has("architectures")) {
    const Json& a = j.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      return f.Error("architectures", "a non-empty list of class names");
    }
    c.architecture = a[0].get<std::string>();
  } else {
    c.architecture = t->architecture;  // what AutoModelForCausalLM would pick
  }

  // Quantized checkpoints (GPTQ/AWQ int32-packed weights, FP8 scales) need
  // kernels Strata does not have; say so instead of "missing tensor".
  if (f.Has("quantization_config")) {
    std::string method = "unknown";
    const Json& q = j.at("quantization_config");
    if (q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()) {
      method = q["quant_method"].get<std::string>();
    }
    return Unimplemented(path +
                         ": quantized checkpoints are not supported (quantization_config "
                         "quant_method '" +
                         method + "'); use the unquantized bf16/fp16 model");
  }

  RETURN_IF_ERROR(f.Positive("vocab_size", &c.vocab_size, true));
  RETURN_IF_ERROR(f.Positive("hidden_size", &c.hidden_size, true));
  // deepseek_v4 has none (its MLPs are moe_intermediate_size wide).
  RETURN_IF_ERROR(f.Positive("intermediate_size", &c.intermediate_size,
                             /*required=*/c.model_type != "deepseek_v4"));
  RETURN_IF_ERROR(f.Positive("num_hidden_layers", &c.num_hidden_layers, true));
  RETURN_IF_ERROR(f.Positive("num_attention_heads", &c.num_attention_heads, true));

  c.num_key_value_heads = f.Contains("num_key_value_heads") || t->num_key_value_heads == 0
                              ? c.num_attention_heads
                              : t->num_key_value_heads;
  RETURN_IF_ERROR(f.Positive("num_key_value_heads", &c.num_key_value_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return InvalidArgument(
        path + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
        ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) +
        (f.Contains("num_key_value_heads")
             ? std::string(")")
             : ", the " + c.model_type + " default; set num_key_value_heads)"));
  }
  if (f.Has("head_dim")) {
    RETURN_IF_ERROR(f.Positive("head_dim", &c.head_dim));
  } else if (t->head_dim != 0) {
    c.head_dim = t->head_dim;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return InvalidArgument(path + ": hidden_size (" + std::to_string(c.hidden_size) +
                             ") must be a multiple of num_attention_heads (" +
                             std::to_string(c.num_attention_heads) +
                             ") when head_dim is not given");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  c.max_position_embeddings = t->max_position_embeddings;
  RETURN_IF_ERROR(f.Positive("max_position_embeddings", &c.max_position_embeddings));
  c.rms_norm_eps = 1e-6;
  RETURN_IF_ERROR(f.Double("rms_norm_eps", &c.rms_norm_eps));
  if (c.rms_norm_eps <= 0) return f.Error("rms_norm_eps", "a positive number");
  RETURN_IF_ERROR(f.String("hidden_act", &c.hidden_act));
  RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c.tie_word_embeddings));

  c.attention_bias = t->always_qkv_bias;
  if (t->reads_attention_bias) RETURN_IF_ERROR(f.Bool("attention_bias", &c.attention_bias));
  if (t->reads_mlp_bias) RETURN_IF_ERROR(f.Bool("mlp_bias", &c.mlp_bias));

  RETURN_IF_ERROR(ParseSlidingWindow(j, path, *t, &c));

  // "dtype" (transformers 5) wins over "torch_dtype" (published checkpoints).
  const char* dtype_key = f.Has("dtype") ? "dtype" : "torch_dtype";
  RETURN_IF_ERROR(f.String(dtype_key, &c.dtype));
  if (c.dtype != "bfloat16" && c.dtype != "float16" && c.dtype != "float32") {
    return Unimplemented(path + ": " + dtype_key + " '" + c.dtype +
                         "' is not supported (supported: bfloat16, float16, float32)");
  }

  if (c.model_type == "deepseek_v4") {
    RETURN_IF_ERROR(ParseDeepseekV4(j, path, &c));  // its rope is per attention kind
  } else {
    RETURN_IF_ERROR(ParseRope(j, path, &c.rope));
  }
  if (c.model_type == "deepseek_v3") RETURN_IF_ERROR(ParseDeepseekV3(j, path, &c));

  c.bos_token_id = t->bos_token_id;
  RETURN_IF_ERROR(f.OptionalTokenId("bos_token_id", &c.bos_token_id));
  if (t->eos_token_id) c.eos_token_ids = {*t->eos_token_id};
  RETURN_IF_ERROR(f.IntOrList("eos_token_id", &c.eos_token_ids));
  return c;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open (is this a Hugging Face model directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path + ": read failed");
  return ParseModelConfig(ss.str(), path);
}

StatusOr<GenerationConfig> ParseGenerationConfig(const std::string& json_text,
                                                 const std::string& path) {
  ASSIGN_OR_RETURN(Json j, ParseObject(json_text, path));
  Fields f(j, path);
  GenerationConfig g;
  RETURN_IF_ERROR(f.IntOrList("eos_token_id", &g.eos_token_ids));
  RETURN_IF_ERROR(f.OptionalTokenId("bos_token_id", &g.bos_token_id));

  auto opt_double = [&](const char* key, std::optional<double>* out) -> Status {
    if (!f.Has(key)) return OkStatus();
    double v = 0;
    RETURN_IF_ERROR(f.Double(key, &v));
    *out = v;
    return OkStatus();
  };
  auto opt_int = [&](const char* key, std::optional<int64_t>* out) -> Status {
    if (!f.Has(key)) return OkStatus();
    int64_t v = 0;
    RETURN_IF_ERROR(f.Int(key, &v));
    *out = v;
    return OkStatus();
  };
  RETURN_IF_ERROR(opt_double("temperature", &g.temperature));
  RETURN_IF_ERROR(opt_double("top_p", &g.top_p));
  RETURN_IF_ERROR(opt_int("top_k", &g.top_k));
  RETURN_IF_ERROR(opt_double("min_p", &g.min_p));
  RETURN_IF_ERROR(opt_double("repetition_penalty", &g.repetition_penalty));
  RETURN_IF_ERROR(opt_int("max_new_tokens", &g.max_new_tokens));
  if (f.Has("do_sample")) {
    bool v = false;
    RETURN_IF_ERROR(f.Bool("do_sample", &v));
    g.do_sample = v;
  }

  if (g.temperature && *g.temperature < 0) return f.Error("temperature", "a number >= 0");
  if (g.top_p && (*g.top_p <= 0 || *g.top_p > 1)) return f.Error("top_p", "a number in (0, 1]");
  if (g.top_k && *g.top_k < 0) return f.Error("top_k", "an integer >= 0 (0: no limit)");
  if (g.min_p && (*g.min_p < 0 || *g.min_p > 1)) return f.Error("min_p", "a number in [0, 1]");
  if (g.repetition_penalty && *g.repetition_penalty <= 0) {
    return f.Error("repetition_penalty", "a positive number");
  }
  if (g.max_new_tokens && *g.max_new_tokens <= 0) {
    return f.Error("max_new_tokens", "a positive integer");
  }
  return g;
}

}  // namespace strata

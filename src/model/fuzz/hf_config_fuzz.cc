// Fuzz target: config.json text through ParseModelConfig, and the same text
// as generation_config.json through ParseGenerationConfig.
// Checks: errors are InvalidArgument/Unimplemented naming the file; an
// accepted config has every size positive, attention heads a multiple of the
// KV heads, a supported dtype and rope type, finite positive rope theta and
// norm epsilon, and non-negative token ids; an accepted generation config has
// its sampling fields within the ranges the parser documents.
#include <cmath>
#include <string>

#include "model/fuzz/model_fuzz.h"
#include "model/hf_config.h"

namespace strata::fuzz {
namespace {

void CheckError(const Status& s, const char* file) {
  FUZZ_CHECK(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnimplemented);
  FUZZ_CHECK(s.message().rfind(file, 0) == 0);
}

}  // namespace

int HfConfigOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = ParseModelConfig(text, "config.json");
  if (!c.ok()) {
    CheckError(c.status(), "config.json");
  } else {
    FUZZ_CHECK(!c->architecture.empty());
    FUZZ_CHECK(c->vocab_size > 0 && c->hidden_size > 0 && c->intermediate_size > 0);
    FUZZ_CHECK(c->num_hidden_layers > 0 && c->num_attention_heads > 0);
    FUZZ_CHECK(c->num_key_value_heads > 0 && c->num_attention_heads % c->num_key_value_heads == 0);
    FUZZ_CHECK(c->head_dim > 0 && c->max_position_embeddings > 0);
    FUZZ_CHECK(std::isfinite(c->rms_norm_eps) && c->rms_norm_eps > 0);
    FUZZ_CHECK(c->sliding_window >= 0);
    FUZZ_CHECK(c->dtype == "bfloat16" || c->dtype == "float16" || c->dtype == "float32");
    FUZZ_CHECK(c->rope.type == "default" || c->rope.type == "linear" || c->rope.type == "llama3");
    FUZZ_CHECK(std::isfinite(c->rope.theta) && c->rope.theta > 0);
    FUZZ_CHECK(c->rope.partial_rotary_factor > 0 && c->rope.partial_rotary_factor <= 1);
    if (c->rope.type != "default") FUZZ_CHECK(c->rope.factor > 0);
    FUZZ_CHECK(!c->bos_token_id || *c->bos_token_id >= 0);
    for (int64_t id : c->eos_token_ids) FUZZ_CHECK(id >= 0);
  }
  auto g = ParseGenerationConfig(text, "generation_config.json");
  if (!g.ok()) {
    CheckError(g.status(), "generation_config.json");
  } else {
    for (int64_t id : g->eos_token_ids) FUZZ_CHECK(id >= 0);
    FUZZ_CHECK(!g->temperature || (std::isfinite(*g->temperature) && *g->temperature >= 0));
    FUZZ_CHECK(!g->top_p || (*g->top_p > 0 && *g->top_p <= 1));
    FUZZ_CHECK(!g->top_k || *g->top_k >= 0);
    FUZZ_CHECK(!g->min_p || (*g->min_p >= 0 && *g->min_p <= 1));
    FUZZ_CHECK(!g->max_new_tokens || *g->max_new_tokens > 0);
  }
  return 0;
}

}  // namespace strata::fuzz

STRATA_FUZZ_ENTRY(HfConfigOneInput)

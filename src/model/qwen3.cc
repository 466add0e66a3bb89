// Qwen3ForCausalLM: per-head RMSNorm on q and k before RoPE; head_dim is
// set explicitly and need not equal hidden_size / num_attention_heads.
#include "model/decoder.h"

namespace strata {

namespace {
DecoderOptions Options(const ModelConfig& c) {
  DecoderOptions d;
  d.qkv_bias = c.attention_bias;
  d.o_bias = c.attention_bias;
  d.qk_norm = true;
  d.tied_embeddings = c.tie_word_embeddings;
  d.sliding_window = static_cast<int32_t>(c.sliding_window);
  return d;
}
}  // namespace

StatusOr<std::unique_ptr<Model>> CreateQwen3(const ModelConfig& c, WeightStore& w, Backend& b,
                                             const ModelOptions& o) {
  return CreateDecoderModel(c, Options(c), w, b, o);
}

KvLayout Qwen3KvLayout(const ModelConfig& c, int page_size, DType dtype) {
  return DecoderKvLayout(c, Options(c), page_size, dtype);
}

}  // namespace strata

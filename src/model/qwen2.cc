// Qwen2ForCausalLM (Qwen2, Qwen2.5): q/k/v projections always carry biases,
// o_proj does not; small models tie the LM head to the embeddings.
#include "model/decoder.h"

namespace strata {

namespace {
DecoderOptions Options(const ModelConfig& c) {
  DecoderOptions d;
  d.qkv_bias = true;
  d.tied_embeddings = c.tie_word_embeddings;
  d.sliding_window = static_cast<int32_t>(c.sliding_window);
  return d;
}
}  // namespace

StatusOr<std::unique_ptr<Model>> CreateQwen2(const ModelConfig& c, WeightStore& w, Backend& b,
                                             const ModelOptions& o) {
  return CreateDecoderModel(c, Options(c), w, b, o);
}

KvLayout Qwen2KvLayout(const ModelConfig& c, int page_size, DType dtype) {
  return DecoderKvLayout(c, Options(c), page_size, dtype);
}

}  // namespace strata

// Qwen2ForCausalLM (Qwen2, Qwen2.5): q/k/v projections always carry biases,
// o_proj does not; small models tie the LM head to the embeddings.
#include "model/decoder.h"

namespace strata {

StatusOr<std::unique_ptr<Model>> CreateQwen2(const ModelConfig& c, WeightStore& w, Backend& b,
                                             const ModelOptions& o) {
  DecoderOptions d;
  d.qkv_bias = true;
  d.tied_embeddings = c.tie_word_embeddings;
  d.sliding_window = static_cast<int32_t>(c.sliding_window);
  return CreateDecoderModel(c, d, w, b, o);
}

}  // namespace strata

// MistralForCausalLM: Llama's layout, no biases, optional sliding window
// (null in Mistral 7B v0.2+ and later releases: full attention).
#include "model/decoder.h"

namespace strata {

StatusOr<std::unique_ptr<Model>> CreateMistral(const ModelConfig& c, WeightStore& w, Backend& b,
                                               const ModelOptions& o) {
  DecoderOptions d;
  d.tied_embeddings = c.tie_word_embeddings;
  d.sliding_window = static_cast<int32_t>(c.sliding_window);
  return CreateDecoderModel(c, d, w, b, o);
}

}  // namespace strata

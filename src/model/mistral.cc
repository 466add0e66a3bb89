// MistralForCausalLM: Llama's layout, no biases, optional sliding window
// (null in Mistral 7B v0.2+ and later releases: full attention).
#include "model/decoder.h"

namespace strata {

namespace {
DecoderOptions Options(const ModelConfig& c) {
  DecoderOptions d;
  d.tied_embeddings = c.tie_word_embeddings;
  d.sliding_window = static_cast<int32_t>(c.sliding_window);
  return d;
}
}  // namespace

StatusOr<std::unique_ptr<Model>> CreateMistral(const ModelConfig& c, WeightStore& w, Backend& b,
                                               const ModelOptions& o) {
  return CreateDecoderModel(c, Options(c), w, b, o);
}

KvLayout MistralKvLayout(const ModelConfig& c, int page_size, DType dtype) {
  return DecoderKvLayout(c, Options(c), page_size, dtype);
}

}  // namespace strata

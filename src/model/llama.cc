// LlamaForCausalLM: the plain decoder. attention_bias / mlp_bias come from
// config.json (false in Meta's releases).
#include "model/decoder.h"

namespace strata {

StatusOr<std::unique_ptr<Model>> CreateLlama(const ModelConfig& c, WeightStore& w, Backend& b,
                                             const ModelOptions& o) {
  DecoderOptions d;
  d.qkv_bias = c.attention_bias;
  d.o_bias = c.attention_bias;
  d.mlp_bias = c.mlp_bias;
  d.tied_embeddings = c.tie_word_embeddings;
  return CreateDecoderModel(c, d, w, b, o);
}

}  // namespace strata

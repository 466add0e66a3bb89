// LlamaForCausalLM: the plain decoder. attention_bias / mlp_bias come from
// config.json (false in Meta's releases).
#include "model/decoder.h"

namespace strata {

namespace {
DecoderOptions Options(const ModelConfig& c) {
  DecoderOptions d;
  d.qkv_bias = c.attention_bias;
  d.o_bias = c.attention_bias;
  d.mlp_bias = c.mlp_bias;
  d.tied_embeddings = c.tie_word_embeddings;
  return d;
}
}  // namespace

StatusOr<std::unique_ptr<Model>> CreateLlama(const ModelConfig& c, WeightStore& w, Backend& b,
                                             const ModelOptions& o) {
  return CreateDecoderModel(c, Options(c), w, b, o);
}

KvLayout LlamaKvLayout(const ModelConfig& c, int page_size, DType dtype) {
  return DecoderKvLayout(c, Options(c), page_size, dtype);
}

}  // namespace strata

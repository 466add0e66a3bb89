// The pre-norm decoder-only transformer shared by the Llama family
// (Llama, Mistral, Qwen2, Qwen3): embeddings -> N x [RMSNorm, GQA attention
// with RoPE, residual, RMSNorm, SwiGLU MLP, residual] -> RMSNorm -> LM head.
// Architectures differ only in DecoderOptions (biases, q/k norm, tied
// embeddings, sliding window) and are defined in their own files
// (llama.cc, mistral.cc, qwen2.cc, qwen3.cc) as small factories.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/weights.h"

namespace strata {

struct DecoderOptions {
  bool qkv_bias = false;  // q_proj/k_proj/v_proj have .bias (Qwen2)
  bool o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;          // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool tied_embeddings = false;  // lm_head reuses model.embed_tokens.weight
  int32_t sliding_window = 0;
};

// The decoder's KV cache: one group of num_hidden_layers K+V layers
// ("sliding_attention" when the options set a window, else
// "full_attention"). DecoderModel::kv_layout returns exactly this.
KvLayout DecoderKvLayout(const ModelConfig& config, const DecoderOptions& decoder, int page_size,
                         DType dtype);

// Binds the weights (checking every name, dtype and shape; rejecting
// tensors the architecture does not use) and allocates the workspace.
StatusOr<std::unique_ptr<Model>> CreateDecoderModel(const ModelConfig& config,
                                                    const DecoderOptions& decoder,
                                                    WeightStore& weights, Backend& backend,
                                                    const ModelOptions& options);

}  // namespace strata

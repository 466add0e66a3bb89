// Loads a Hugging Face model directory as published on the hub:
//   config.json                       (required)
//   model.safetensors | model.safetensors.index.json + shards (required)
//   tokenizer.json                    (required)
//   tokenizer_config.json             (optional: bos/eos, chat template)
//   chat_template.jinja               (optional, transformers >= 5; wins)
//   generation_config.json            (optional: default sampling, eos ids)
//
// Everything is checked before the model is built; the first problem is
// returned as a Status naming the file (and tensor or field) and the fix.
// Weights stay memory-mapped in their checkpoint dtype.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/hf_config.h"
#include "model/jinja/chat_template.h"
#include "model/model.h"
#include "model/tokenizer/tokenizer.h"
#include "model/weights.h"

namespace strata {

struct LoadedModel {
  std::string dir;
  ModelConfig config;
  GenerationConfig generation;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> chat_template;  // null: the model has none
  std::string chat_template_source;
  WeightStore weights;
  std::unique_ptr<Model> model;
  // The union of generation_config.json and config.json eos ids.
  std::vector<int32_t> eos_token_ids;
  double load_seconds = 0;
  size_t weight_bytes = 0;
};

struct LoadOptions {
  ModelOptions model;
  // Called with (bytes_done, bytes_total) while weights are paged in.
  std::function<void(size_t, size_t)> progress;
  bool prefault_weights = true;  // read every weight page now, not on the first request
  // Sample every tensor for NaN/Inf (CheckWeightsFinite) and refuse the
  // model if any has one; off with --skip-weight-check.
  bool check_weights = true;
};

// Reads only config.json/tokenizer files: what `strata check` needs.
StatusOr<ModelConfig> ReadModelConfig(const std::string& dir);

StatusOr<std::unique_ptr<LoadedModel>> LoadModelDir(const std::string& dir, Backend& backend,
                                                    const LoadOptions& options);

// The directory the embedded demo model is written to when no --model-path
// is given: $STRATA_HOME/demo-model, else $XDG_CACHE_HOME/strata/demo-model,
// else ~/.cache/strata/demo-model. Written (atomically) if missing.
StatusOr<std::string> EnsureDemoModel();

}  // namespace strata

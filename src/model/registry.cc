// The architecture table: config.json "architectures"[0] -> factory.
#include <map>

#include "model/model.h"
#include "model/weights.h"

namespace strata {

StatusOr<std::unique_ptr<Model>> CreateLlama(const ModelConfig&, WeightStore&, Backend&, const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateMistral(const ModelConfig&, WeightStore&, Backend&, const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateQwen2(const ModelConfig&, WeightStore&, Backend&, const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateQwen3(const ModelConfig&, WeightStore&, Backend&, const ModelOptions&);

namespace {
const std::map<std::string, ModelFactory>& Table() {
  static const std::map<std::string, ModelFactory> table = {
      {"LlamaForCausalLM", &CreateLlama},
      {"MistralForCausalLM", &CreateMistral},
      {"Qwen2ForCausalLM", &CreateQwen2},
      {"Qwen3ForCausalLM", &CreateQwen3},
  };
  return table;
}
}  // namespace

ModelFactory FindArchitecture(const std::string& name) {
  auto it = Table().find(name);
  return it == Table().end() ? nullptr : it->second;
}

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (auto& [name, f] : Table()) names.push_back(name);
  return names;
}

}  // namespace strata

// The architecture table: config.json "architectures"[0] -> factory and KV
// layout function.
#include <map>

#include "model/model.h"
#include "model/weights.h"

namespace strata {

StatusOr<std::unique_ptr<Model>> CreateLlama(const ModelConfig&, WeightStore&, Backend&,
                                             const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateMistral(const ModelConfig&, WeightStore&, Backend&,
                                               const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateQwen2(const ModelConfig&, WeightStore&, Backend&,
                                             const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateQwen3(const ModelConfig&, WeightStore&, Backend&,
                                             const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateDeepseekV3(const ModelConfig&, WeightStore&, Backend&,
                                                  const ModelOptions&);
StatusOr<std::unique_ptr<Model>> CreateDeepseekV4(const ModelConfig&, WeightStore&, Backend&,
                                                  const ModelOptions&);
KvLayout LlamaKvLayout(const ModelConfig&, int, DType);
KvLayout MistralKvLayout(const ModelConfig&, int, DType);
KvLayout Qwen2KvLayout(const ModelConfig&, int, DType);
KvLayout Qwen3KvLayout(const ModelConfig&, int, DType);
KvLayout DeepseekV3KvLayout(const ModelConfig&, int, DType);
KvLayout DeepseekV4KvLayout(const ModelConfig&, int, DType);

namespace {
struct Architecture {
  ModelFactory create;
  KvLayoutFunction kv_layout;
};
const std::map<std::string, Architecture>& Table() {
  static const std::map<std::string, Architecture> table = {
      {"DeepseekV3ForCausalLM", {&CreateDeepseekV3, &DeepseekV3KvLayout}},
      {"DeepseekV4ForCausalLM", {&CreateDeepseekV4, &DeepseekV4KvLayout}},
      {"LlamaForCausalLM", {&CreateLlama, &LlamaKvLayout}},
      {"MistralForCausalLM", {&CreateMistral, &MistralKvLayout}},
      {"Qwen2ForCausalLM", {&CreateQwen2, &Qwen2KvLayout}},
      {"Qwen3ForCausalLM", {&CreateQwen3, &Qwen3KvLayout}},
  };
  return table;
}
}  // namespace

ModelFactory FindArchitecture(const std::string& name) {
  auto it = Table().find(name);
  return it == Table().end() ? nullptr : it->second.create;
}

StatusOr<KvLayout> KvLayoutForConfig(const ModelConfig& config, int page_size, DType dtype) {
  auto it = Table().find(config.architecture);
  if (it == Table().end()) {
    std::string list;
    for (auto& a : SupportedArchitectures()) list += (list.empty() ? "" : ", ") + a;
    return Unimplemented("config.json: architecture '" + config.architecture +
                         "' is not supported (supported: " + list + ")");
  }
  KvLayout layout = it->second.kv_layout(config, page_size, dtype);
  RETURN_IF_ERROR(layout.Validate());
  return layout;
}

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (auto& [name, f] : Table()) names.push_back(name);
  return names;
}

}  // namespace strata

// Fuzz target: model.safetensors.index.json text through the index parser
// WeightStore::Open uses for sharded checkpoints.
// Checks: errors are DataLoss with a message; an accepted index names at
// least one shard, every shard is a plain file name (no '/', not "." or
// "..": the index must not reach outside the model directory) and holds at
// least one tensor, and no tensor is listed twice.
#include <set>
#include <string>
#include <string_view>

#include "model/fuzz/model_fuzz.h"
#include "model/weights.h"

namespace strata::fuzz {

int SafetensorsIndexOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto shards = ParseShardIndex(text, "model.safetensors.index.json");
  if (!shards.ok()) {
    FUZZ_CHECK(shards.status().code() == StatusCode::kDataLoss);
    FUZZ_CHECK(!shards.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(!shards->empty());
  std::set<std::string> tensors;
  for (const auto& [shard, names] : *shards) {
    FUZZ_CHECK(!shard.empty() && shard != "." && shard != "..");
    FUZZ_CHECK(shard.find('/') == std::string::npos);
    FUZZ_CHECK(!names.empty());
    for (const std::string& n : names) FUZZ_CHECK(tensors.insert(n).second);
  }
  return 0;
}

}  // namespace strata::fuzz

STRATA_FUZZ_ENTRY(SafetensorsIndexOneInput)

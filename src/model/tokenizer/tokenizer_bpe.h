// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): turns
// one pre-token (a word) into token ids exactly like HF `tokenizers`' BPE:
// per-character initial symbols (with continuing_subword_prefix /
// end_of_word_suffix), <0xNN> byte fallback, unk (optionally fused), then
// rank-ordered merging with a priority queue over a linked list of symbols,
// and ignore_merges (whole word in the vocabulary wins).
//
// Immutable after FromJson except for an internal word cache that is
// sharded and mutex-protected: Tokenize() is safe from many threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace strata::tok {

// Hash for unordered_map<std::string, ...> lookups by string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Upper bound (exclusive) for token ids; they index dense per-id tables.
inline constexpr int64_t kMaxTokenId = int64_t{1} << 24;

class BpeModel {
 public:
  // `model` is the "model" object; `where` names the file for errors.
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model,
                                                      const std::string& where);

  // Appends the ids of `word` to *out. Empty words give nothing.
  void Tokenize(std::string_view word, std::vector<int32_t>* out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr if the id is not in the model vocabulary.
  const std::string* IdToToken(int32_t id) const;
  // Largest id in the vocabulary (-1 if empty).
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  // Number of vocabulary entries (HF get_vocab_size; ids may have gaps).
  size_t vocab_count() const { return vocab_.size(); }

 private:
  BpeModel() = default;
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;

  struct MergeInfo {
    uint32_t rank;
    int32_t new_id;
  };

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  // Ids of single-character tokens (no prefix/suffix applied), by code point.
  std::unordered_map<char32_t, int32_t> char_ids_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> tokens, -1 if absent
  bool all_byte_ids_ = false;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix

  // Word cache: words are short and repeat a lot in real text.
  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheShardCapacity = 8192;
  static constexpr size_t kMaxCachedWordBytes = 128;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::unique_ptr<CacheShard[]> cache_ = std::make_unique<CacheShard[]>(kCacheShards);
};

}  // namespace strata::tok

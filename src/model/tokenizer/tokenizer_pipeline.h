// The text stages of a tokenizer.json before the model: normalizers (NFC,
// NFKC, Lowercase, Replace, Prepend, Strip, ...) and pre-tokenizers (Split
// with a regex or string, ByteLevel, Metaspace, Digits, Whitespace, ...),
// each reproducing HF `tokenizers` semantics, including the exact Split
// delimiter behaviours (Isolated, Removed, MergedWithPrevious,
// MergedWithNext, Contiguous, invert).
//
// Stages are immutable after parsing and safe to run from many threads.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace strata::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s in place. REQUIRES: s is valid UTF-8; it stays valid.
  virtual void Normalize(std::string& s) const = 0;
};

// `j` is the "normalizer" value (not null); `where` is "<file>: normalizer".
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& j,
                                                      const std::string& where);

// Receives pre-tokens. `first` is true when the piece starts at offset 0 of
// the original input (Metaspace's prepend_scheme "first" needs it).
class PieceSink {
 public:
  virtual void Piece(std::string_view piece, bool first) = 0;

 protected:
  ~PieceSink() = default;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits/rewrites `piece` and hands each non-empty result to `next`.
  virtual void Run(std::string_view piece, bool first, PieceSink& next) const = 0;
};

// A flattened chain of pre-tokenizers (a Sequence, or one, or none).
class PreTokenizerChain {
 public:
  // `j` is the "pre_tokenizer" value (null allowed: no pre-tokenization).
  static StatusOr<PreTokenizerChain> Parse(const nlohmann::json& j, const std::string& where);
  // Runs every stage; `out` gets the final pre-tokens in order.
  void Run(std::string_view text, bool first, PieceSink& out) const;

 private:
  void RunFrom(size_t stage, std::string_view text, bool first, PieceSink& out) const;
  std::vector<std::shared_ptr<const PreTokenizer>> stages_;
};

}  // namespace strata::tok

// Hugging Face tokenizer.json, executed in C++ with results identical to HF
// `tokenizers`: BPE models (byte-level as in Llama 3 / Qwen2 / Qwen3 /
// DeepSeek V3, and SentencePiece-style with byte fallback as in Llama 2 /
// Mistral), normalizers, pre-tokenizers (Split with its regex, ByteLevel,
// Metaspace, Sequence, ...), added/special tokens, post-processor (BOS) and
// decoders.
//
// Thread-safety: a loaded Tokenizer is immutable; Encode/Decode are safe from
// many threads. IncrementalDecoder is per stream, not shared.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace strata {

class TokenizerImpl;

class Tokenizer {
 public:
  // tokenizer_json: contents of tokenizer.json. tokenizer_config_json:
  // contents of tokenizer_config.json or "" (supplies bos/eos names and
  // chat_template). `path` (the tokenizer.json path) is for error messages.
  // Errors: InvalidArgument naming the file and field for malformed input,
  // Unimplemented naming the type for unsupported models/stages (only BPE
  // models are supported).
  static StatusOr<std::shared_ptr<const Tokenizer>> FromJson(
      const std::string& tokenizer_json, const std::string& tokenizer_config_json,
      const std::string& path);
  // Reads dir/tokenizer.json and dir/tokenizer_config.json (optional).
  static StatusOr<std::shared_ptr<const Tokenizer>> FromDir(const std::string& dir);

  ~Tokenizer();

  // Like HF `tokenizers` Tokenizer.encode(text, add_special_tokens=...):
  // added/special tokens written in the text are recognised;
  // add_special_tokens applies tokenizer.json's post-processor (e.g. Llama
  // 3's BOS). tokenizer_config.json's add_bos_token is not consulted (HF
  // `tokenizers` ignores it too; DeepSeek V3's tokenizer.json adds no BOS).
  // Invalid UTF-8 in `text` is first repaired like Rust's from_utf8_lossy
  // (each maximal invalid subpart -> U+FFFD).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = true) const;
  // Like HF `decode(ids, skip_special_tokens=...)`. Unknown ids are skipped.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The raw bytes token `id` stands for, which may be part of a UTF-8
  // character (OpenAI's logprobs "bytes": a text's tokens' bytes concatenate
  // to the text). Byte-level BPE (GPT-2, Llama 3, Qwen): the bytes its
  // characters map to; a <0xNN> byte-fallback token: that byte; otherwise
  // Decode({id}). Special tokens are their text. "" for unknown ids.
  std::string TokenBytes(int32_t id) const;
  // Vocabulary size including added tokens (max id + 1).
  int64_t vocab_size() const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::string bos_token() const;  // "" if none
  std::string eos_token() const;
  // chat_template string from tokenizer_config.json ("" if absent).
  const std::string& chat_template() const;

 private:
  Tokenizer();
  std::unique_ptr<TokenizerImpl> impl_;
  friend class TokenizerImpl;
  friend class IncrementalDecoder;
};

// Turns a growing token sequence into text for streaming. Emits text only
// once it is complete UTF-8 that later tokens cannot change, never emits
// broken UTF-8, and the concatenation of all Add() results plus Flush()
// equals Decode(all ids). With a ByteFallback decoder (Llama 2, Mistral) a
// run of <0xNN> tokens is held until a non-byte token ends it, because HF
// decodes the run as a whole (one invalid byte turns it all into U+FFFD).
// Likewise the last token's text is held while it would read differently
// with a token after it (BPEDecoder: "d</w>Y" is "dY" at the end, "d Y"
// before more text).
// Cost per Add() is one decode of the short window since the last emission.
class IncrementalDecoder {
 public:
  IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens);
  // Appends one token; returns the newly final text (may be empty).
  std::string Add(int32_t id);
  // Returns whatever text is still held back (end of stream).
  std::string Flush();

 private:
  std::shared_ptr<const Tokenizer> tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
};

}  // namespace strata

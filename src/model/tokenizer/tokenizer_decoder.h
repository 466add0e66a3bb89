// Decoders of a tokenizer.json ("decoder"): turn token strings back into
// text exactly like HF `tokenizers` (ByteLevel with lossy UTF-8 repair,
// Replace, ByteFallback, Fuse, Strip, Metaspace, BPEDecoder, Sequence).
// HF's decode(ids) = join(decoder.decode_chain(token strings)).
//
// Immutable after parsing; safe from many threads.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "util/status.h"

namespace strata::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF decode_chain: rewrites the token list in place.
  virtual void DecodeChain(std::vector<std::string>& tokens) const = 0;
};

// Facts about a decoder chain that streaming detokenization needs.
struct DecoderTraits {
  bool byte_level_only = false;  // exactly one ByteLevel decoder: bytes concatenate
  bool byte_fallback = false;    // a ByteFallback decoder is in the chain
  // A stage decodes the last token differently from the others (BPEDecoder:
  // its suffix becomes "" there, " " elsewhere).
  bool last_token_differs = false;
};

// `j` is the "decoder" value (not null).
StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& j, const std::string& where,
                                                DecoderTraits* traits);

// "<0xNN>" -> NN (HF ByteFallback's test), else -1.
int ByteFallbackValue(const std::string& token);

}  // namespace strata::tok

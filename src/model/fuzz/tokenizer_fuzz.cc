// Fuzz target: tokenizer.json (and, after a line "--tokenizer_config.json--",
// tokenizer_config.json) through Tokenizer::FromJson, then encode and decode
// of a few short fixed texts.
// Checks: construction errors are InvalidArgument/Unimplemented naming the
// file; every encoded id is in [0, vocab_size); decoding ids, including
// unknown ones, never fails; and IncrementalDecoder's pieces join to exactly
// Decode(ids), as its header promises.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/fuzz/model_fuzz.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::fuzz {

int TokenizerOneInput(const uint8_t* data, size_t size) {
  static constexpr std::string_view kSplit = "\n--tokenizer_config.json--\n";
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string tokenizer_json(input), config_json;
  if (size_t at = input.find(kSplit); at != std::string_view::npos) {
    tokenizer_json = std::string(input.substr(0, at));
    config_json = std::string(input.substr(at + kSplit.size()));
  }
  auto tok = Tokenizer::FromJson(tokenizer_json, config_json, "tokenizer.json");
  if (!tok.ok()) {
    const StatusCode code = tok.status().code();
    FUZZ_CHECK(code == StatusCode::kInvalidArgument || code == StatusCode::kUnimplemented);
    FUZZ_CHECK(!tok.status().message().empty());
    return 0;
  }
  const std::shared_ptr<const Tokenizer>& t = *tok;
  const int64_t vocab = t->vocab_size();
  FUZZ_CHECK(vocab >= 0);
  static const char* const kTexts[] = {
      "Hello, world! It's 2026.",
      " \t\n  leading   spaces\r\n",
      "h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xef\xbc\xa1",
      "<|im_start|>user\n<s></s><|endoftext|>",
      "bad \xff\xfe utf8 \xc3",
      "",
  };
  for (const char* text : kTexts) {
    for (bool special : {true, false}) {
      std::vector<int32_t> ids = t->Encode(text, special);
      for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < vocab);
      const std::string decoded = t->Decode(ids, false);
      t->Decode(ids, true);
      IncrementalDecoder inc(t, false);
      std::string streamed;
      for (int32_t id : ids) streamed += inc.Add(id);
      streamed += inc.Flush();
      FUZZ_CHECK(streamed == decoded);
    }
  }
  const int32_t big = vocab > INT32_MAX ? INT32_MAX : static_cast<int32_t>(vocab);
  t->Decode({-1, 0, big, big - 1, INT32_MAX, INT32_MIN}, false);
  return 0;
}

}  // namespace strata::fuzz

STRATA_FUZZ_ENTRY(TokenizerOneInput)

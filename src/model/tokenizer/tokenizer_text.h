// Text primitives shared by the tokenizer pieces: UTF-8 walking and repair
// (with the exact semantics of Rust's String::from_utf8_lossy, which HF
// `tokenizers` uses when decoding bytes), Unicode predicates with Rust's
// meaning (char::is_whitespace, is_numeric, regex \w), the GPT-2
// byte-level alphabet, and a PCRE2 regex wrapper for the Split patterns.
//
// Everything here is stateless or immutable after construction and safe to
// use from many threads. Internal to the tokenizer (namespace strata::tok).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace strata::tok {

// Decodes the code point at s[i] and advances i past it. REQUIRES: s is
// valid UTF-8 and i < s.size().
inline char32_t NextCodepoint(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
  char32_t cp = c & (0x3F >> n);
  for (int k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n + 1;
  return cp;
}

// Byte length of the UTF-8 sequence that starts with lead byte c (1 for
// continuation/invalid bytes, so walking never stalls).
inline size_t Utf8Len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

void AppendUtf8(std::string& out, char32_t cp);
bool IsValidUtf8(std::string_view s);
// Rust String::from_utf8_lossy: every maximal invalid subpart becomes one
// U+FFFD (the Unicode "substitution of maximal subparts" practice).
std::string Utf8Lossy(std::string_view s);
// Length of the longest prefix of s that ends on a complete character, i.e.
// s minus a trailing sequence that is a valid but unfinished UTF-8 prefix.
size_t CompleteUtf8Prefix(std::string_view s);

// Rust char predicates.
bool IsWhitespace(char32_t c);  // White_Space property
bool IsNumeric(char32_t c);     // general category Nd, Nl or No
// Rust regex's Unicode \w (letters, marks, Nd, Nl, Pc, ZWNJ/ZWJ), which HF
// uses for single_word added tokens.
bool IsWordChar(char32_t c);
bool IsCombiningMark(char32_t c);  // general category M* (HF StripAccents)

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
// ByteLevelChar(b) is that code point as UTF-8; ByteLevelByte(cp) is the
// inverse, -1 for code points outside the alphabet.
const std::string& ByteLevelChar(uint8_t b);
int ByteLevelByte(char32_t cp);

// A compiled PCRE2 pattern (UTF + UCP, JIT when available) with the matching
// semantics HF's Oniguruma regexes have for the tokenizer.json patterns.
class Regex {
 public:
  // `where` names the JSON field for the error message.
  static StatusOr<std::shared_ptr<const Regex>> Compile(const std::string& pattern,
                                                        const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(start, end) for each leftmost non-overlapping match in s (empty
  // matches included, the next search starting one character later).
  // REQUIRES: s is valid UTF-8.
  template <typename Fn>
  void ForEachMatch(std::string_view s, Fn&& fn) const {
    size_t pos = 0;
    size_t start = 0, end = 0;
    while (pos <= s.size() && Find(s, pos, &start, &end)) {
      fn(start, end);
      if (end > start) {
        pos = end;
      } else {
        if (end >= s.size()) break;
        pos = end + Utf8Len(static_cast<unsigned char>(s[end]));
      }
    }
  }

 private:
  Regex() = default;
  bool Find(std::string_view s, size_t pos, size_t* start, size_t* end) const;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace strata::tok

#include "model/tokenizer/tokenizer_pipeline.h"

#include <utf8proc.h>

#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer_text.h"

namespace strata::tok {

using nlohmann::json;

namespace {

std::string TypeOf(const json& j) {
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool GetBool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

Status MissingField(const std::string& where, const char* field, const char* what) {
  return InvalidArgument(where + "." + field + " is missing or not " + what +
                         "; fix tokenizer.json");
}

// A Split/Replace pattern: {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;  // set for Regex patterns
};

StatusOr<Pattern> ParsePattern(const json& j, const std::string& where) {
  Pattern p;
  if (!j.is_object())
    return MissingField(where, "pattern", "an object {\"String\"|\"Regex\": ...}");
  if (auto it = j.find("String"); it != j.end() && it->is_string()) {
    p.literal = it->get<std::string>();
  } else if (auto it2 = j.find("Regex"); it2 != j.end() && it2->is_string()) {
    ASSIGN_OR_RETURN(p.regex, Regex::Compile(it2->get<std::string>(), where + ".pattern.Regex"));
  } else {
    return MissingField(where, "pattern", "an object {\"String\"|\"Regex\": ...}");
  }
  return p;
}

// One piece of a split: [start, end) and whether the pattern matched it.
struct Span {
  size_t start, end;
  bool match;
};

// HF Pattern::find_matches: the text cut into consecutive match / non-match
// spans (an empty text gives one empty non-match).
void FindMatches(const Pattern& p, std::string_view s, std::vector<Span>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  auto on_match = [&](size_t start, size_t end) {
    if (prev != start) out.push_back({prev, start, false});
    out.push_back({start, end, true});
    prev = end;
  };
  if (p.regex) {
    p.regex->ForEachMatch(s, on_match);
  } else if (p.literal.empty()) {
    out.push_back({0, s.size(), false});
    return;
  } else {
    size_t pos = 0;
    while ((pos = s.find(p.literal, pos)) != std::string_view::npos) {
      on_match(pos, pos + p.literal.size());
      pos += p.literal.size();
    }
  }
  if (prev != s.size()) out.push_back({prev, s.size(), false});
}

// HF's `impl Fn(char) -> bool for Pattern`: every matching character is its
// own match.
template <typename Pred>
void FindCharMatches(Pred pred, std::string_view s, std::vector<Span>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t last = 0, i = 0;
  while (i < s.size()) {
    size_t b = i;
    char32_t c = NextCodepoint(s, i);
    if (pred(c)) {
      if (last < b) out.push_back({last, b, false});
      out.push_back({b, i, true});
      last = i;
    }
  }
  if (s.size() > last) out.push_back({last, s.size(), false});
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

StatusOr<Behavior> ParseBehavior(const json& j, const std::string& where) {
  auto it = j.find("behavior");
  std::string b = it != j.end() && it->is_string() ? it->get<std::string>() : "";
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  return InvalidArgument(
      where + ".behavior = \"" + b +
      "\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// HF NormalizedString::split: applies the delimiter behaviour to the spans
// and calls emit(start, end) for each kept, non-empty piece.
template <typename Emit>
void ApplyBehavior(std::vector<Span>& spans, Behavior behavior, bool invert, Emit&& emit) {
  if (invert) {
    for (Span& s : spans) s.match = !s.match;
  }
  struct Out {
    size_t start, end;
    bool remove;
  };
  std::vector<Out> outs;
  outs.reserve(spans.size());
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& s : spans) outs.push_back({s.start, s.end, false});
      break;
    case Behavior::kRemoved:
      for (const Span& s : spans) outs.push_back({s.start, s.end, s.match});
      break;
    case Behavior::kContiguous: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match == prev_match && !outs.empty()) {
          outs.back().end = s.end;
        } else {
          outs.push_back({s.start, s.end, false});
        }
        prev_match = s.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match && !prev_match && !outs.empty()) {
          outs.back().end = s.end;
        } else {
          outs.push_back({s.start, s.end, false});
        }
        prev_match = s.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !prev_match && !outs.empty()) {
          outs.back().start = s.start;
        } else {
          outs.push_back({s.start, s.end, false});
        }
        prev_match = s.match;
      }
      std::reverse(outs.begin(), outs.end());
      break;
    }
  }
  for (const Out& o : outs) {
    if (!o.remove && o.end > o.start) emit(o.start, o.end);
  }
}

// ---------------------------------------------------------------------------
// Normalizers

class SequenceNormalizer : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> parts;
  void Normalize(std::string& s) const override {
    for (const auto& p : parts) p->Normalize(s);
  }
};

// True for characters NFC may change or that may change their neighbours:
// combining marks, composition participants, characters with a
// decomposition, and Hangul jamo (composed algorithmically). Everything
// else below or around them is left alone by NFC. Nothing below U+0300
// qualifies.
bool NfcSensitive(char32_t c) {
  if (c < 0x300) return false;
  if (c >= 0x1100 && c <= 0x11FF) return true;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  return p->combining_class != 0 || p->comb_index != UINT16_MAX || p->decomp_seqindex != UINT16_MAX;
}

std::string Utf8procMap(std::string_view s, int options) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
  std::string r = n >= 0 ? std::string(reinterpret_cast<const char*>(out), n) : std::string(s);
  std::free(out);
  return r;
}

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  void Normalize(std::string& s) const override {
    if (options_ == (UTF8PROC_STABLE | UTF8PROC_COMPOSE)) {
      NormalizeNfc(s);
      return;
    }
    for (unsigned char c : s) {
      if (c >= 0x80) {
        s = Utf8procMap(s, options_);
        return;
      }
    }
  }

 private:
  // NFC only rewrites maximal runs of NfcSensitive characters plus the
  // starter before each run; runs are bounded by characters that neither
  // compose backwards nor reorder, so each run normalises independently.
  // Most text (ASCII, CJK, ...) is copied untouched.
  void NormalizeNfc(std::string& s) const {
    std::string out;
    size_t copied = 0, prev_start = 0, i = 0;
    while (i < s.size()) {
      if (static_cast<unsigned char>(s[i]) < 0x80) {
        prev_start = i++;
        continue;
      }
      size_t cs = i;
      if (!NfcSensitive(NextCodepoint(s, i))) {
        prev_start = cs;
        continue;
      }
      size_t start = cs == 0 ? 0 : std::max(prev_start, copied);
      size_t end = i;
      while (end < s.size()) {
        size_t k = end;
        if (!NfcSensitive(NextCodepoint(s, k))) break;
        end = k;
      }
      out.append(s, copied, start - copied);
      out += Utf8procMap(std::string_view(s).substr(start, end - start), options_);
      copied = end;
      prev_start = end;
      i = end;
    }
    if (copied == 0) return;
    out.append(s, copied, std::string::npos);
    s.swap(out);
  }

  int options_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void Normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      char32_t c = NextCodepoint(s, i);
      if (c == 0x130) {  // İ lowercases to two characters (Rust char::to_lowercase)
        out += "i\xCC\x87";
        continue;
      }
      AppendUtf8(out, c < 0x80 ? (c >= 'A' && c <= 'Z' ? c + 32 : c)
                               : static_cast<char32_t>(
                                     utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
    s.swap(out);
  }
};

class StripNormalizer : public Normalizer {
 public:
  bool left = true, right = true;
  void Normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left) {
      size_t i = 0;
      while (i < s.size()) {
        size_t at = i;
        if (!IsWhitespace(NextCodepoint(s, i))) {
          b = at;
          break;
        }
        b = i;
      }
    }
    if (right) {
      // Walk back over whitespace characters.
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!IsWhitespace(NextCodepoint(s, i))) break;
        e = start;
      }
    }
    s = s.substr(b, e - b);
  }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  void Normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t b = i;
      char32_t c = NextCodepoint(s, i);
      if (!IsCombiningMark(c)) out.append(s, b, i - b);
    }
    s.swap(out);
  }
};

class ReplaceNormalizer : public Normalizer {
 public:
  Pattern pattern;
  std::string content;
  void Normalize(std::string& s) const override {
    thread_local std::vector<Span> spans;
    FindMatches(pattern, s, spans);
    std::string out;
    out.reserve(s.size());
    for (const Span& sp : spans) {
      if (sp.match) {
        out += content;
      } else {
        out.append(s, sp.start, sp.end - sp.start);
      }
    }
    s.swap(out);
  }
};

class PrependNormalizer : public Normalizer {
 public:
  std::string prepend;
  void Normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend);
  }
};

// ---------------------------------------------------------------------------
// Pre-tokenizers

class SplitPreTokenizer : public PreTokenizer {
 public:
  Pattern pattern;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  void Run(std::string_view piece, bool first, PieceSink& next) const override {
    std::vector<Span> spans;
    FindMatches(pattern, piece, spans);
    ApplyBehavior(spans, behavior, invert,
                  [&](size_t b, size_t e) { next.Piece(piece.substr(b, e - b), first && b == 0); });
  }
};

// Splits on characters selected by a predicate (Digits, WhitespaceSplit,
// Punctuation).
class CharSplitPreTokenizer : public PreTokenizer {
 public:
  std::function<bool(char32_t)> pred;
  Behavior behavior = Behavior::kIsolated;
  void Run(std::string_view piece, bool first, PieceSink& next) const override {
    std::vector<Span> spans;
    FindCharMatches(pred, piece, spans);
    ApplyBehavior(spans, behavior, false,
                  [&](size_t b, size_t e) { next.Piece(piece.substr(b, e - b), first && b == 0); });
  }
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  bool add_prefix_space = false;
  std::shared_ptr<const Regex> regex;  // GPT-2 pattern when use_regex
  void Run(std::string_view piece, bool first, PieceSink& next) const override {
    std::string prefixed;
    if (add_prefix_space && (piece.empty() || piece[0] != ' ')) {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    std::string mapped;
    auto map_and_emit = [&](std::string_view s, bool f) {
      mapped.clear();
      for (unsigned char c : s) mapped += ByteLevelChar(c);
      next.Piece(mapped, f);
    };
    if (!regex) {
      map_and_emit(piece, first);
      return;
    }
    Pattern p;
    p.regex = regex;
    std::vector<Span> spans;
    FindMatches(p, piece, spans);
    ApplyBehavior(spans, Behavior::kIsolated, false, [&](size_t b, size_t e) {
      map_and_emit(piece.substr(b, e - b), first && b == 0);
    });
  }
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  char32_t replacement = 0x2581;
  std::string replacement_utf8;
  Prepend prepend = Prepend::kAlways;
  bool split = true;
  void Run(std::string_view piece, bool first, PieceSink& next) const override {
    std::string s;
    s.reserve(piece.size() + 3);
    bool starts_with_rep =
        piece.substr(0, 1) == " " || piece.substr(0, replacement_utf8.size()) == replacement_utf8;
    if ((prepend == Prepend::kAlways || (prepend == Prepend::kFirst && first)) &&
        !starts_with_rep) {
      s += replacement_utf8;
    }
    for (char c : piece) {
      if (c == ' ') {
        s += replacement_utf8;
      } else {
        s.push_back(c);
      }
    }
    if (!split) {
      next.Piece(s, first);
      return;
    }
    std::vector<Span> spans;
    FindCharMatches([this](char32_t c) { return c == replacement; }, s, spans);
    ApplyBehavior(spans, Behavior::kMergedWithNext, false, [&](size_t b, size_t e) {
      next.Piece(std::string_view(s).substr(b, e - b), first && b == 0);
    });
  }
};

bool IsPunctuation(char32_t c) {
  if (c < 0x80)
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126);
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

Status ParsePreTokenizerInto(const json& j, const std::string& where,
                             std::vector<std::shared_ptr<const PreTokenizer>>& out) {
  std::string type = TypeOf(j);
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return MissingField(where, "pretokenizers", "an array");
    for (size_t k = 0; k < it->size(); ++k) {
      RETURN_IF_ERROR(ParsePreTokenizerInto(
          (*it)[k], where + ".pretokenizers[" + std::to_string(k) + "]", out));
    }
    return OkStatus();
  }
  if (type == "Split") {
    auto p = std::make_shared<SplitPreTokenizer>();
    auto pat = j.find("pattern");
    if (pat == j.end())
      return MissingField(where, "pattern", "an object {\"String\"|\"Regex\": ...}");
    ASSIGN_OR_RETURN(p->pattern, ParsePattern(*pat, where));
    ASSIGN_OR_RETURN(p->behavior, ParseBehavior(j, where));
    p->invert = GetBool(j, "invert", false);
    out.push_back(std::move(p));
    return OkStatus();
  }
  if (type == "ByteLevel") {
    auto p = std::make_shared<ByteLevelPreTokenizer>();
    p->add_prefix_space = GetBool(j, "add_prefix_space", true);
    if (GetBool(j, "use_regex", true)) {
      ASSIGN_OR_RETURN(
          p->regex,
          Regex::Compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
                         "\\s+(?!\\S)|\\s+",
                         where + " (GPT-2 regex)"));
    }
    out.push_back(std::move(p));
    return OkStatus();
  }
  if (type == "Metaspace") {
    auto p = std::make_shared<MetaspacePreTokenizer>();
    std::string rep = "\xE2\x96\x81";
    if (auto it = j.find("replacement"); it != j.end() && it->is_string())
      rep = it->get<std::string>();
    size_t i = 0;
    if (rep.empty() || !IsValidUtf8(rep) || (NextCodepoint(rep, i), i != rep.size())) {
      return InvalidArgument(where + ".replacement must be a single character");
    }
    i = 0;
    p->replacement = NextCodepoint(rep, i);
    p->replacement_utf8 = rep;
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      std::string s = it->get<std::string>();
      if (s == "always") {
        p->prepend = MetaspacePreTokenizer::Prepend::kAlways;
      } else if (s == "first") {
        p->prepend = MetaspacePreTokenizer::Prepend::kFirst;
      } else if (s == "never") {
        p->prepend = MetaspacePreTokenizer::Prepend::kNever;
      } else {
        return InvalidArgument(where + ".prepend_scheme = \"" + s +
                               "\" is not always, first or never");
      }
    } else {  // older files: add_prefix_space
      p->prepend = GetBool(j, "add_prefix_space", true) ? MetaspacePreTokenizer::Prepend::kAlways
                                                        : MetaspacePreTokenizer::Prepend::kNever;
    }
    p->split = GetBool(j, "split", true);
    out.push_back(std::move(p));
    return OkStatus();
  }
  if (type == "Digits") {
    auto p = std::make_shared<CharSplitPreTokenizer>();
    p->pred = IsNumeric;
    p->behavior =
        GetBool(j, "individual_digits", false) ? Behavior::kIsolated : Behavior::kContiguous;
    out.push_back(std::move(p));
    return OkStatus();
  }
  if (type == "WhitespaceSplit") {
    auto p = std::make_shared<CharSplitPreTokenizer>();
    p->pred = IsWhitespace;
    p->behavior = Behavior::kRemoved;
    out.push_back(std::move(p));
    return OkStatus();
  }
  if (type == "Whitespace") {
    auto p = std::make_shared<SplitPreTokenizer>();
    // HF: \w+|[^\w\s]+ in Oniguruma, whose Unicode \w (UTS #18) also covers
    // marks and the joiners U+200C/U+200D; spelled out for PCRE2.
    ASSIGN_OR_RETURN(p->pattern.regex,
                     Regex::Compile("[\\p{L}\\p{M}\\p{N}\\p{Pc}\\x{200C}\\x{200D}]+|"
                                    "[^\\p{L}\\p{M}\\p{N}\\p{Pc}\\x{200C}\\x{200D}\\s]+",
                                    where));
    p->behavior = Behavior::kRemoved;
    p->invert = true;
    out.push_back(std::move(p));
    return OkStatus();
  }
  if (type == "Punctuation") {
    auto p = std::make_shared<CharSplitPreTokenizer>();
    p->pred = IsPunctuation;
    p->behavior = Behavior::kIsolated;
    if (j.contains("behavior")) {
      ASSIGN_OR_RETURN(p->behavior, ParseBehavior(j, where));
    }
    out.push_back(std::move(p));
    return OkStatus();
  }
  return Unimplemented(
      where + ": pre-tokenizer type \"" + type +
      "\" is not supported (supported: Sequence, Split, ByteLevel, Metaspace, Digits, Whitespace, "
      "WhitespaceSplit, Punctuation)");
}

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& j, const std::string& where) {
  std::string type = TypeOf(j);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNormalizer>();
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return MissingField(where, "normalizers", "an array");
    for (size_t k = 0; k < it->size(); ++k) {
      ASSIGN_OR_RETURN(
          auto n, ParseNormalizer((*it)[k], where + ".normalizers[" + std::to_string(k) + "]"));
      seq->parts.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(std::move(seq));
  }
  if (type == "NFC")
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (type == "NFD")
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  if (type == "NFKC") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "NFKD") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer());
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = GetBool(j, "strip_left", true);
    n->right = GetBool(j, "strip_right", true);
    return std::unique_ptr<Normalizer>(std::move(n));
  }
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    auto pat = j.find("pattern");
    if (pat == j.end())
      return MissingField(where, "pattern", "an object {\"String\"|\"Regex\": ...}");
    ASSIGN_OR_RETURN(n->pattern, ParsePattern(*pat, where));
    auto c = j.find("content");
    if (c == j.end() || !c->is_string()) return MissingField(where, "content", "a string");
    n->content = c->get<std::string>();
    return std::unique_ptr<Normalizer>(std::move(n));
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    auto p = j.find("prepend");
    if (p == j.end() || !p->is_string()) return MissingField(where, "prepend", "a string");
    n->prepend = p->get<std::string>();
    return std::unique_ptr<Normalizer>(std::move(n));
  }
  return Unimplemented(
      where + ": normalizer type \"" + type +
      "\" is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, "
      "Strip, Replace, Prepend)");
}

StatusOr<PreTokenizerChain> PreTokenizerChain::Parse(const json& j, const std::string& where) {
  PreTokenizerChain chain;
  if (!j.is_null()) RETURN_IF_ERROR(ParsePreTokenizerInto(j, where, chain.stages_));
  return chain;
}

void PreTokenizerChain::Run(std::string_view text, bool first, PieceSink& out) const {
  if (text.empty()) return;
  RunFrom(0, text, first, out);
}

void PreTokenizerChain::RunFrom(size_t stage, std::string_view text, bool first,
                                PieceSink& out) const {
  if (stage == stages_.size()) {
    out.Piece(text, first);
    return;
  }
  struct Next final : PieceSink {
    const PreTokenizerChain* chain;
    size_t stage;
    PieceSink* out;
    void Piece(std::string_view p, bool f) override { chain->RunFrom(stage, p, f, *out); }
  } next;
  next.chain = this;
  next.stage = stage + 1;
  next.out = &out;
  stages_[stage]->Run(text, first, next);
}

}  // namespace strata::tok

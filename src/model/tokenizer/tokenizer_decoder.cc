#include "model/tokenizer/tokenizer_decoder.h"

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer_text.h"

namespace strata::tok {

using nlohmann::json;

int ByteFallbackValue(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(token[3]), lo = hex(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

namespace {

std::string TypeOf(const json& j) {
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

class SequenceDecoder : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> parts;
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts) p->DecodeChain(tokens);
  }
};

// All tokens -> one string: map each character back to its byte (a token with
// a character outside the alphabet contributes its raw UTF-8 instead), then
// repair like Rust's from_utf8_lossy.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      size_t mark = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        int b = ByteLevelByte(NextCodepoint(t, i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!ok) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, Utf8Lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  std::string literal;
  std::shared_ptr<const Regex> regex;
  std::string content;
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t prev = 0;
      auto on_match = [&](size_t b, size_t e) {
        out.append(t, prev, b - prev);
        out += content;
        prev = e;
      };
      if (regex) {
        regex->ForEachMatch(t, on_match);
      } else if (!literal.empty()) {
        size_t pos = 0;
        while ((pos = t.find(literal, pos)) != std::string::npos) {
          on_match(pos, pos + literal.size());
          pos += literal.size();
        }
      }
      out.append(t, prev, std::string::npos);
      t.swap(out);
    }
  }
};

// Runs of <0xNN> tokens become their bytes when those form valid UTF-8, else
// one U+FFFD per byte token.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&]() {
      if (run_tokens == 0) return;
      if (IsValidUtf8(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_tokens; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_tokens = 0;
    };
    for (std::string& t : tokens) {
      int b = ByteFallbackValue(t);
      if (b >= 0) {
        run.push_back(static_cast<char>(b));
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Per token: removes up to `start` leading and `stop` trailing `content` chars.
class StripDecoder : public Decoder {
 public:
  char32_t content = ' ';
  size_t start = 0, stop = 0;
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> offs;  // byte offset of each character, plus the end
      for (size_t i = 0; i < t.size();) {
        offs.push_back(i);
        NextCodepoint(t, i);
      }
      const size_t n = offs.size();
      offs.push_back(t.size());
      auto char_at = [&](size_t k) {
        size_t i = offs[k];
        return NextCodepoint(t, i);
      };
      size_t cut_start = 0;
      for (size_t k = 0; k < n && k < start; ++k) {
        if (char_at(k) != content) break;
        cut_start = k + 1;
      }
      size_t cut_stop = n;
      for (size_t k = 0; k < n && k < stop; ++k) {
        if (char_at(n - 1 - k) != content) break;
        cut_stop = n - 1 - k;
      }
      if (cut_stop < cut_start) cut_stop = cut_start;
      t = t.substr(offs[cut_start], offs[cut_stop] - offs[cut_start]);
    }
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  std::string replacement;
  bool strip_first = true;  // prepend_scheme != never
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      std::string out;
      out.reserve(t.size());
      size_t i = 0;
      while (i < t.size()) {
        if (t.compare(i, replacement.size(), replacement) == 0) {
          // HF drops every replacement char of the first token, not just a leading one.
          if (k != 0 || !strip_first) out.push_back(' ');
          i += replacement.size();
        } else {
          out.push_back(t[i++]);
        }
      }
      t.swap(out);
    }
  }
};

// BPEDecoder: the end-of-word suffix becomes a space, except in the last token.
class BpeSuffixDecoder : public Decoder {
 public:
  std::string suffix;
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      const std::string rep = k + 1 == tokens.size() ? "" : " ";
      std::string out;
      size_t prev = 0, pos;
      while (!suffix.empty() && (pos = t.find(suffix, prev)) != std::string::npos) {
        out.append(t, prev, pos - prev);
        out += rep;
        prev = pos + suffix.size();
      }
      out.append(t, prev, std::string::npos);
      t.swap(out);
    }
  }
};

Status ParseInto(const json& j, const std::string& where, std::unique_ptr<Decoder>* out,
                 DecoderTraits* traits, int* count) {
  std::string type = TypeOf(j);
  ++*count;
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceDecoder>();
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) {
      return InvalidArgument(where + ".decoders is missing or not an array; fix tokenizer.json");
    }
    --*count;
    for (size_t k = 0; k < it->size(); ++k) {
      std::unique_ptr<Decoder> d;
      RETURN_IF_ERROR(
          ParseInto((*it)[k], where + ".decoders[" + std::to_string(k) + "]", &d, traits, count));
      seq->parts.push_back(std::move(d));
    }
    *out = std::move(seq);
    return OkStatus();
  }
  if (type == "ByteLevel") {
    *out = std::make_unique<ByteLevelDecoder>();
    traits->byte_level_only = true;
    return OkStatus();
  }
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDecoder>();
    auto pat = j.find("pattern");
    auto content = j.find("content");
    if (pat == j.end() || !pat->is_object() || content == j.end() || !content->is_string()) {
      return InvalidArgument(where +
                             ": Replace needs pattern {\"String\"|\"Regex\": ...} and content; fix "
                             "tokenizer.json");
    }
    if (auto s = pat->find("String"); s != pat->end() && s->is_string()) {
      d->literal = s->get<std::string>();
    } else if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
      ASSIGN_OR_RETURN(d->regex, Regex::Compile(r->get<std::string>(), where + ".pattern.Regex"));
    } else {
      return InvalidArgument(where + ".pattern must be {\"String\": ...} or {\"Regex\": ...}");
    }
    d->content = content->get<std::string>();
    *out = std::move(d);
    return OkStatus();
  }
  if (type == "ByteFallback") {
    *out = std::make_unique<ByteFallbackDecoder>();
    traits->byte_fallback = true;
    return OkStatus();
  }
  if (type == "Fuse") {
    *out = std::make_unique<FuseDecoder>();
    return OkStatus();
  }
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    auto c = j.find("content");
    if (c != j.end() && c->is_string() && !c->get<std::string>().empty()) {
      std::string s = c->get<std::string>();
      size_t i = 0;
      d->content = NextCodepoint(s, i);
    }
    if (auto s = j.find("start"); s != j.end() && s->is_number_unsigned())
      d->start = s->get<size_t>();
    if (auto s = j.find("stop"); s != j.end() && s->is_number_unsigned())
      d->stop = s->get<size_t>();
    *out = std::move(d);
    return OkStatus();
  }
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = "\xE2\x96\x81";
    if (auto r = j.find("replacement");
        r != j.end() && r->is_string() && !r->get<std::string>().empty()) {
      d->replacement = r->get<std::string>();
    }
    if (auto p = j.find("prepend_scheme"); p != j.end() && p->is_string()) {
      d->strip_first = p->get<std::string>() != "never";
    } else if (auto a = j.find("add_prefix_space"); a != j.end() && a->is_boolean()) {
      d->strip_first = a->get<bool>();
    }
    *out = std::move(d);
    return OkStatus();
  }
  if (type == "BPEDecoder") {
    auto d = std::make_unique<BpeSuffixDecoder>();
    traits->last_token_differs = true;
    d->suffix = "</w>";
    if (auto s = j.find("suffix"); s != j.end() && s->is_string())
      d->suffix = s->get<std::string>();
    *out = std::move(d);
    return OkStatus();
  }
  return Unimplemented(
      where + ": decoder type \"" + type +
      "\" is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, "
      "Metaspace, BPEDecoder)");
}

}  // namespace

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& j, const std::string& where,
                                                DecoderTraits* traits) {
  *traits = DecoderTraits{};
  std::unique_ptr<Decoder> d;
  int count = 0;
  RETURN_IF_ERROR(ParseInto(j, where, &d, traits, &count));
  traits->byte_level_only = traits->byte_level_only && count == 1;
  return d;
}

}  // namespace strata::tok

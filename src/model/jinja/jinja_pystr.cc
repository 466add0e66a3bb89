#include "model/jinja/jinja_pystr.h"

#include <utf8proc.h>

#include <algorithm>

namespace strata::jinja {

const std::string& RequireString(const Value& v, const char* what) {
  if (!v.is_string()) Fail(std::string(what) + " expects a string, got " + v.TypeName());
  return v.as_string();
}

// ---- str helpers with Python semantics ----

namespace {

uint32_t MapCase(uint32_t c, int how) {  // 0 lower, 1 upper, 2 title
  auto cp = static_cast<utf8proc_int32_t>(c);
  return static_cast<uint32_t>(how == 0   ? utf8proc_tolower(cp)
                               : how == 1 ? utf8proc_toupper(cp)
                                          : utf8proc_totitle(cp));
}

bool IsCased(uint32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

// Appends the case mapping of cps[i] as Python does, including the
// unconditional multi-character mappings of SpecialCasing.txt that matter
// for Latin text (ß -> SS, ligatures, dotted İ) and the final-sigma rule.
void AppendCased(std::string& out, const std::vector<uint32_t>& cps, size_t i, int how) {
  struct Special {
    uint32_t c;
    const char* upper;
    const char* title;
  };
  static const Special kSpecial[] = {
      {0x00DF, "SS", "Ss"},           {0xFB00, "FF", "Ff"},   {0xFB01, "FI", "Fi"},
      {0xFB02, "FL", "Fl"},           {0xFB03, "FFI", "Ffi"}, {0xFB04, "FFL", "Ffl"},
      {0xFB05, "ST", "St"},           {0xFB06, "ST", "St"},   {0x0149, "\u02bcN", "\u02bcN"},
      {0x01F0, "J\u030c", "J\u030c"},
  };
  uint32_t c = cps[i];
  if (how != 0) {
    for (const Special& sp : kSpecial)
      if (sp.c == c) {
        out += how == 1 ? sp.upper : sp.title;
        return;
      }
  } else if (c == 0x0130) {  // İ -> i + combining dot above
    out += "i\u0307";
    return;
  } else if (c == 0x03A3) {  // Σ -> ς at the end of a word
    bool after_cased = i > 0 && IsCased(cps[i - 1]);
    bool before_cased = i + 1 < cps.size() && IsCased(cps[i + 1]);
    AppendUtf8(out, after_cased && !before_cased ? 0x03C2 : 0x03C3);
    return;
  }
  AppendUtf8(out, MapCase(c, how));
}

bool IsAlpha(uint32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

}  // namespace

std::string MapString(const std::string& s, int how) {
  std::string out;
  std::vector<uint32_t> cps = DecodeUtf8(s);
  for (size_t i = 0; i < cps.size(); ++i) AppendCased(out, cps, i, how);
  return out;
}

std::string PyCapitalize(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) AppendCased(out, cps, i, i == 0 ? 2 : 0);
  return out;
}

namespace {

std::string PyTitle(const std::string& s) {  // str.title()
  std::string out;
  bool prev_cased = false;
  std::vector<uint32_t> cps = DecodeUtf8(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    if (IsCased(c)) {
      AppendCased(out, cps, i, prev_cased ? 0 : 2);
      prev_cased = true;
    } else {
      AppendUtf8(out, c);
      prev_cased = false;
    }
  }
  return out;
}

}  // namespace

std::string JinjaTitle(const std::string& s) {
  // jinja2's title filter: words start after runs of [-\s(\{\[<].
  std::string out;
  bool word_start = true;
  std::vector<uint32_t> cps = DecodeUtf8(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    bool sep = IsPyWhitespace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      AppendUtf8(out, c);
      word_start = true;
    } else {
      AppendCased(out, cps, i, word_start ? 1 : 0);
      word_start = false;
    }
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, size_t max_bytes) {
  std::string out;
  auto check = [&out, max_bytes] {
    if (out.size() > max_bytes)
      Fail("replace() builds a string over the " + std::to_string(max_bytes) + "-byte limit");
  };
  if (from.empty()) {  // Python inserts `to` between every character
    std::vector<uint32_t> cps = DecodeUtf8(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
        check();
      }
      if (i < cps.size()) AppendUtf8(out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++n;
    check();
  }
  out.append(s, pos);
  return out;
}

List Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List parts;
  if (sep.is_none() || sep.is_undefined()) {
    std::vector<uint32_t> cps = DecodeUtf8(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPyWhitespace(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t b = i;
      while (i < cps.size() && !IsPyWhitespace(cps[i])) ++i;
      words.emplace_back(b, i);
    }
    // Past maxsplit words the rest is one piece that keeps its outer
    // whitespace (trailing for split, leading for rsplit), as CPython does.
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit) {
      if (!from_right) {
        size_t b = words[static_cast<size_t>(maxsplit)].first;
        size_t e = cps.size();
        words.resize(static_cast<size_t>(maxsplit));
        words.emplace_back(b, e);
      } else {
        size_t keep = static_cast<size_t>(maxsplit);
        size_t e = words[words.size() - keep - 1].second;
        std::vector<std::pair<size_t, size_t>> w2{{0, e}};  // the rest keeps its leading whitespace
        w2.insert(w2.end(), words.end() - static_cast<std::ptrdiff_t>(keep), words.end());
        words = std::move(w2);
      }
    }
    for (auto [b, e] : words) parts.emplace_back(EncodeUtf8(cps, b, e));
    return parts;
  }
  const std::string& d = RequireString(sep, "split");
  if (d.empty()) Fail("empty separator");
  std::vector<std::string> pieces;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    pieces.push_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  pieces.push_back(s.substr(pos));
  if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) > maxsplit + 1) {
    size_t m = static_cast<size_t>(maxsplit);
    std::vector<std::string> merged;
    if (!from_right) {
      merged.assign(pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(m));
      std::string rest = pieces[m];
      for (size_t i = m + 1; i < pieces.size(); ++i) rest += d + pieces[i];
      merged.push_back(rest);
    } else {
      size_t head = pieces.size() - m;
      std::string rest = pieces[0];
      for (size_t i = 1; i < head; ++i) rest += d + pieces[i];
      merged.push_back(rest);
      merged.insert(merged.end(), pieces.begin() + static_cast<std::ptrdiff_t>(head), pieces.end());
    }
    pieces = std::move(merged);
  }
  for (auto& p : pieces) parts.emplace_back(std::move(p));
  return parts;
}

namespace {

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = RequireString(a, prefix ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.as_list())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

}  // namespace

int64_t ToInt(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  Fail(std::string(what) + " expects an integer, got " + v.TypeName());
}

Value StrMethod(const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "startswith" || name == "endswith")
    return Value(AffixMatch(s, a.Get(0, "prefix"), name[0] == 's'));
  if (name == "strip") return Value(PyStrip(s, a.Get(0, "chars"), true, true));
  if (name == "lstrip") return Value(PyStrip(s, a.Get(0, "chars"), true, false));
  if (name == "rstrip") return Value(PyStrip(s, a.Get(0, "chars"), false, true));
  if (name == "split" || name == "rsplit")
    return Value(Split(s, a.Get(0, "sep"), ToInt(a.Get(1, "maxsplit", Value(-1)), "maxsplit"),
                       name[0] == 'r'));
  if (name == "upper") return Value(MapString(s, 1));
  if (name == "lower") return Value(MapString(s, 0));
  if (name == "title") return Value(PyTitle(s));
  if (name == "capitalize") return Value(PyCapitalize(s));
  if (name == "replace")
    return Value(Replace(s, RequireString(a.Get(0, "old"), "replace"),
                         RequireString(a.Get(1, "new"), "replace"),
                         ToInt(a.Get(2, "count", Value(-1)), "count")));
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    const std::string& sub = RequireString(a.Get(0, "sub"), name.c_str());
    if (name == "count") {
      if (sub.empty()) return Value(Value(s).Length() + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name == "index") Fail("substring not found");
      return Value(-1);
    }
    return Value(Value(s.substr(0, p)).Length());
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& v : a.Get(0, "iterable").Iterate()) {
      if (!first) out += s;
      first = false;
      out += RequireString(v, "str.join");
    }
    return Value(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& x = RequireString(a.Get(0, "affix"), name.c_str());
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
    if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (name == "partition" || name == "rpartition") {
    const std::string& sep = RequireString(a.Get(0, "sep"), name.c_str());
    if (sep.empty()) Fail("empty separator");
    size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos)
      return name == "partition" ? Value::MakeTuple({Value(s), Value(""), Value("")})
                                 : Value::MakeTuple({Value(""), Value(""), Value(s)});
    return Value::MakeTuple({Value(s.substr(0, p)), Value(sep), Value(s.substr(p + sep.size()))});
  }
  if (name == "splitlines") {
    List out;
    size_t b = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        out.emplace_back(s.substr(b, i - b));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        b = i + 1;
      }
    }
    if (b < s.size()) out.emplace_back(s.substr(b));
    return Value(std::move(out));
  }
  auto all = [&](auto pred) {
    std::vector<uint32_t> cps = DecodeUtf8(s);
    if (cps.empty()) return Value(false);
    for (uint32_t c : cps)
      if (!pred(c)) return Value(false);
    return Value(true);
  };
  if (name == "isdigit") return all([](uint32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all(IsAlpha);
  if (name == "isalnum")
    return all([](uint32_t c) { return IsAlpha(c) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return all(IsPyWhitespace);
  if (name == "islower" || name == "isupper") {
    bool any_cased = false;
    bool want_lower = name == "islower";
    for (uint32_t c : DecodeUtf8(s)) {
      if (!IsCased(c)) continue;
      any_cased = true;
      if ((MapCase(c, want_lower ? 0 : 1) != c)) return Value(false);
    }
    return Value(any_cased);
  }
  Fail("str has no method '" + name + "'");
}

bool IsStrMethod(const std::string& n) {
  static const char* kNames[] = {
      "startswith",   "endswith",     "strip",     "lstrip",    "rstrip",     "split",
      "rsplit",       "upper",        "lower",     "title",     "capitalize", "replace",
      "find",         "rfind",        "count",     "index",     "join",       "splitlines",
      "isdigit",      "isalpha",      "isalnum",   "isspace",   "islower",    "isupper",
      "removeprefix", "removesuffix", "partition", "rpartition"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

bool IsUnsupportedPyMethod(const std::string& n) {
  // Real Python str/list/dict methods a template could call that this
  // engine does not implement: rejected at parse time instead of failing
  // on the first request that reaches them.
  static const char* kNames[] = {
      "format",       "format_map", "encode",      "zfill",      "center",    "ljust",
      "rjust",        "casefold",   "swapcase",    "expandtabs", "isnumeric", "isdecimal",
      "isidentifier", "istitle",    "isprintable", "isascii",    "translate", "maketrans",
      "rindex",       "copy",       "fromkeys"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

}  // namespace strata::jinja

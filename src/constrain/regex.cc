#include "constrain/regex.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <string>

namespace strata::constrain {
namespace {

using Node = GrammarBuilder::Node;
constexpr uint32_t kMaxCodepoint = 0x10FFFF;
// Repetition counts above this are refused ({n,m} with huge m would lower
// to a huge grammar).
constexpr int kMaxRepeat = 4096;
// Groups nested deeper are refused: parsing and lowering recurse per level.
constexpr int kMaxNesting = 128;

CodepointRanges Normalize(CodepointRanges r) {
  std::sort(r.begin(), r.end());
  CodepointRanges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

CodepointRanges Complement(const CodepointRanges& r) {
  CodepointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : Normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

const CodepointRanges kDigit = {{'0', '9'}};
const CodepointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodepointRanges kSpace = {{'\t', '\r'}, {' ', ' '}};

// Shared by the regex and EBNF parsers: a cursor over UTF-8 text with
// error reporting.
class Cursor {
 public:
  Cursor(std::string_view text, const char* what) : s_(text), what_(what) {}
  bool done() const { return i_ >= s_.size(); }
  char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }
  size_t pos() const { return i_; }
  void skip(size_t n = 1) { i_ += n; }
  void unskip() { --i_; }
  bool eat(char c) {
    if (peek() == c && !done()) {
      ++i_;
      return true;
    }
    return false;
  }
  Status Error(const std::string& msg) const {
    return InvalidArgument(std::string(what_) + " at offset " + std::to_string(i_) + ": " + msg);
  }
  // One UTF-8 encoded code point (invalid bytes pass through as themselves).
  uint32_t NextCodepoint() {
    const uint8_t c = static_cast<uint8_t>(s_[i_++]);
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    uint32_t cp = extra == 3 ? (c & 0x07) : extra == 2 ? (c & 0x0F) : extra == 1 ? (c & 0x1F) : c;
    for (; extra > 0 && i_ < s_.size(); --extra)
      cp = (cp << 6) | (static_cast<uint8_t>(s_[i_++]) & 0x3F);
    return cp;
  }
  bool ReadHex(int digits, uint32_t* out) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char h = peek();
      if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                             ? h - '0'
                                             : (std::tolower(h) - 'a' + 10));
      skip();
    }
    *out = v;
    return true;
  }
  // After a backslash: a single-code-point escape, or a class escape
  // (\d \w \s and their negations) into *cls. Returns false with *err set
  // for an unsupported one.
  bool Escape(uint32_t* cp, CodepointRanges* cls, bool* is_class, Status* err) {
    *is_class = false;
    if (done()) {
      *err = Error("a pattern cannot end with a backslash");
      return false;
    }
    const char c = peek();
    skip();
    switch (c) {
      case 'd':
        *cls = kDigit;
        *is_class = true;
        return true;
      case 'w':
        *cls = kWord;
        *is_class = true;
        return true;
      case 's':
        *cls = kSpace;
        *is_class = true;
        return true;
      case 'D':
        *cls = Complement(kDigit);
        *is_class = true;
        return true;
      case 'W':
        *cls = Complement(kWord);
        *is_class = true;
        return true;
      case 'S':
        *cls = Complement(kSpace);
        *is_class = true;
        return true;
      case 'n':
        *cp = '\n';
        return true;
      case 'r':
        *cp = '\r';
        return true;
      case 't':
        *cp = '\t';
        return true;
      case 'f':
        *cp = '\f';
        return true;
      case 'v':
        *cp = '\v';
        return true;
      case '0':
        *cp = 0;
        return true;
      case 'x':
        if (ReadHex(2, cp)) return true;
        *err = Error("\\x needs two hex digits");
        return false;
      case 'u':
        if (eat('{')) {
          uint32_t v = 0;
          int n = 0;
          while (std::isxdigit(static_cast<unsigned char>(peek())) && n < 6) {
            uint32_t d = 0;
            ReadHex(1, &d);
            v = v * 16 + d;
            ++n;
          }
          if (n == 0 || !eat('}') || v > kMaxCodepoint) {
            *err = Error("\\u{...} needs 1 to 6 hex digits of a code point <= 10FFFF");
            return false;
          }
          *cp = v;
          return true;
        }
        if (ReadHex(4, cp)) return true;
        *err = Error("\\u needs four hex digits");
        return false;
      default:
        if (std::isalnum(static_cast<unsigned char>(c))) {
          unskip();
          *err = Error(std::string("the escape \\") + c +
                       " is not supported (backreferences, \\b, \\p{...} and the like cannot be "
                       "generated by this server)");
          return false;
        }
        unskip();
        *cp = NextCodepoint();  // escaped punctuation stands for itself
        return true;
    }
  }
  // A [...] class; the cursor is past '['.
  StatusOr<CodepointRanges> Class() {
    const bool negate = eat('^');
    CodepointRanges r;
    bool first = true;
    for (;;) {
      if (done()) return Error("unterminated character class (missing ']')");
      if (peek() == ']' && !first) {
        skip();
        break;
      }
      first = false;
      if (peek() == '[' && peek(1) == ':')
        return Error("POSIX classes like [:alpha:] are not supported");
      uint32_t lo = 0;
      if (eat('\\')) {
        CodepointRanges cls;
        bool is_class = false;
        Status err;
        if (!Escape(&lo, &cls, &is_class, &err)) return err;
        if (is_class) {
          r.insert(r.end(), cls.begin(), cls.end());
          continue;
        }
      } else {
        lo = NextCodepoint();
      }
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
        skip();
        if (eat('\\')) {
          CodepointRanges cls;
          bool is_class = false;
          Status err;
          if (!Escape(&hi, &cls, &is_class, &err)) return err;
          if (is_class) return Error("a class escape cannot end a range");
        } else {
          hi = NextCodepoint();
        }
        if (hi < lo) return Error("a range's end is below its start");
      }
      r.emplace_back(lo, hi);
    }
    r = Normalize(std::move(r));
    return negate ? Complement(r) : r;
  }

 private:
  std::string_view s_;
  const char* what_;
  size_t i_ = 0;
};

// Quantifier after an atom: {min, max} (max kUnbounded); none: {1, 1}.
StatusOr<std::pair<int, int>> Quantifier(Cursor& c) {
  int min = 1, max = 1;
  if (c.eat('*')) {
    min = 0, max = GrammarBuilder::kUnbounded;
  } else if (c.eat('+')) {
    min = 1, max = GrammarBuilder::kUnbounded;
  } else if (c.eat('?')) {
    min = 0, max = 1;
  } else if (c.peek() == '{' && std::isdigit(static_cast<unsigned char>(c.peek(1)))) {
    c.skip();
    auto number = [&]() {
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(c.peek())) && v <= kMaxRepeat) {
        v = v * 10 + (c.peek() - '0');
        c.skip();
      }
      return v;
    };
    int64_t lo = number(), hi = lo;
    if (c.eat(',')) hi = std::isdigit(static_cast<unsigned char>(c.peek())) ? number() : -1;
    if (!c.eat('}')) return c.Error("a {n,m} repetition needs its closing '}'");
    if (lo > kMaxRepeat || hi > kMaxRepeat)
      return c.Error("repetition counts above " + std::to_string(kMaxRepeat) +
                     " are not supported");
    if (hi >= 0 && hi < lo) return c.Error("in {n,m}, m must be >= n");
    min = static_cast<int>(lo);
    max = hi < 0 ? GrammarBuilder::kUnbounded : static_cast<int>(hi);
  } else {
    return std::make_pair(1, 1);
  }
  if (!c.eat('?')) c.eat('+');  // lazy / possessive: the same strings
  return std::make_pair(min, max);
}

class RegexParser {
 public:
  RegexParser(GrammarBuilder& b, std::string_view p, const CodepointSink& sink)
      : b_(b), c_(p, "regex"), sink_(sink) {}

  StatusOr<Node> Parse() {
    c_.eat('^');
    ASSIGN_OR_RETURN(Node n, Alternation());
    if (!c_.done()) return c_.Error("unbalanced ')'");
    return n;
  }

 private:
  StatusOr<Node> Alternation() {
    std::vector<Node> options;
    for (;;) {
      ASSIGN_OR_RETURN(Node s, Sequence());
      options.push_back(s);
      if (!c_.eat('|')) break;
    }
    return b_.Alt(std::move(options));
  }
  StatusOr<Node> Sequence() {
    std::vector<Node> parts;
    while (!c_.done() && c_.peek() != '|' && c_.peek() != ')') {
      if (c_.peek() == '$' && c_.pos() + 1 == end_of_pattern()) {
        c_.skip();
        continue;
      }
      ASSIGN_OR_RETURN(Node atom, Atom());
      ASSIGN_OR_RETURN(auto q, Quantifier(c_));
      parts.push_back(q == std::make_pair(1, 1) ? atom : b_.Repeat(atom, q.first, q.second));
    }
    if (parts.empty()) return b_.Empty();
    return b_.Seq(std::move(parts));
  }
  size_t end_of_pattern() const { return end_; }
  StatusOr<Node> Atom() {
    const char ch = c_.peek();
    if (ch == '(') {
      if (++depth_ > kMaxNesting)
        return c_.Error("groups nest deeper than " + std::to_string(kMaxNesting));
      c_.skip();
      if (c_.eat('?')) {
        if (c_.eat(':')) {
        } else if (c_.peek() == '<' && c_.peek(1) != '=' && c_.peek(1) != '!') {
          while (!c_.done() && c_.peek() != '>') c_.skip();
          c_.skip();
        } else if (c_.peek() == 'P' && c_.peek(1) == '<') {
          while (!c_.done() && c_.peek() != '>') c_.skip();
          c_.skip();
        } else {
          return c_.Error(
              "(?" + std::string(1, c_.peek()) +
              "...) is not supported (lookaround and inline flags cannot be generated)");
        }
      }
      ASSIGN_OR_RETURN(Node inner, Alternation());
      if (!c_.eat(')')) return c_.Error("missing ')'");
      --depth_;
      return inner;
    }
    if (ch == '[') {
      c_.skip();
      ASSIGN_OR_RETURN(CodepointRanges r, c_.Class());
      return sink_(b_, r);
    }
    if (ch == '.') {
      c_.skip();
      return sink_(b_, Complement({{'\n', '\n'}}));
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{')
      return c_.Error(std::string("nothing to repeat before '") + ch + "'");
    if (ch == '^' || ch == '$')
      return c_.Error(std::string("'") + ch + "' is only supported at the pattern's start/end");
    if (c_.eat('\\')) {
      uint32_t cp = 0;
      CodepointRanges cls;
      bool is_class = false;
      Status err;
      if (!c_.Escape(&cp, &cls, &is_class, &err)) return err;
      return sink_(b_, is_class ? cls : CodepointRanges{{cp, cp}});
    }
    const uint32_t cp = c_.NextCodepoint();
    return sink_(b_, {{cp, cp}});
  }

  GrammarBuilder& b_;
  Cursor c_;
  const CodepointSink& sink_;
  int depth_ = 0;

 public:
  size_t end_ = 0;
};

}  // namespace

Node PlainCodepoints(GrammarBuilder& b, const CodepointRanges& ranges) {
  return b.Codepoints(ranges);
}

Node JsonStringCodepoints(GrammarBuilder& b, const CodepointRanges& ranges) {
  // What may stand for itself, and what must be escaped.
  CodepointRanges plain;
  std::vector<Node> escaped;
  for (auto [lo, hi] : Normalize(ranges)) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x1F); ++c) {
      static const std::map<uint32_t, const char*> kShort = {
          {'\b', "\\b"}, {'\f', "\\f"}, {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}};
      auto it = kShort.find(c);
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      escaped.push_back(b.Literal(it != kShort.end() ? it->second : buf));
    }
    if (hi < 0x20) continue;
    lo = std::max<uint32_t>(lo, 0x20);
    for (uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}}) {
      if (lo <= special && special <= hi) {
        escaped.push_back(b.Literal(special == '"' ? "\\\"" : "\\\\"));
        if (lo < special) plain.emplace_back(lo, special - 1);
        lo = special + 1;
      }
    }
    if (lo <= hi) plain.emplace_back(lo, hi);
  }
  std::vector<Node> options;
  if (!plain.empty()) options.push_back(b.Codepoints(plain));
  options.insert(options.end(), escaped.begin(), escaped.end());
  if (options.empty()) return b.Bytes(ByteSet{});
  return b.Alt(std::move(options));
}

StatusOr<Node> CompileRegex(GrammarBuilder& b, std::string_view pattern,
                            const CodepointSink& sink) {
  RegexParser p(b, pattern, sink);
  p.end_ = pattern.size();
  return p.Parse();
}

namespace {

class EbnfParser {
 public:
  EbnfParser(GrammarBuilder& b, std::string_view text) : b_(b), c_(text, "grammar") {}

  StatusOr<GrammarBuilder::Rule> Parse() {
    SkipSpace(true);
    while (!c_.done()) {
      std::string name = Name();
      if (name.empty()) return c_.Error("expected a rule name (name ::= ...)");
      SkipSpace(true);
      if (!(c_.eat(':') && c_.eat(':') && c_.eat('=')))
        return c_.Error("expected '::=' after the rule name '" + name + "'");
      const GrammarBuilder::Rule r = RuleFor(name);
      if (b_.defined(r)) return c_.Error("rule '" + name + "' is defined twice");
      ASSIGN_OR_RETURN(Node body, Alternation());
      b_.Define(r, body);
      SkipSpace(true);
    }
    auto it = rules_.find("root");
    if (it == rules_.end() || !b_.defined(it->second))
      return InvalidArgument("grammar: there is no 'root' rule (the start: root ::= ...)");
    return it->second;
  }

 private:
  static bool IsNameChar(char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
  }
  std::string Name() {
    std::string n;
    while (!c_.done() && IsNameChar(c_.peek())) {
      n += c_.peek();
      c_.skip();
    }
    return n;
  }
  GrammarBuilder::Rule RuleFor(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    const GrammarBuilder::Rule r = b_.NewRule(name);
    rules_.emplace(name, r);
    return r;
  }
  // Skips blanks and comments; newlines too when `newlines`, or when the
  // next line does not start a new rule.
  void SkipSpace(bool newlines) {
    for (;;) {
      while (!c_.done() && (c_.peek() == ' ' || c_.peek() == '\t' || c_.peek() == '\r')) c_.skip();
      if (c_.peek() == '#') {
        while (!c_.done() && c_.peek() != '\n') c_.skip();
        continue;
      }
      if (c_.peek() == '\n' && (newlines || !NextLineStartsRule())) {
        c_.skip();
        continue;
      }
      return;
    }
  }
  bool NextLineStartsRule() const {
    size_t k = 1;
    while (c_.peek(k) == ' ' || c_.peek(k) == '\t' || c_.peek(k) == '\r' || c_.peek(k) == '\n') ++k;
    size_t n = 0;
    while (IsNameChar(c_.peek(k + n))) ++n;
    if (n == 0) return c_.peek(k) == '\0';
    k += n;
    while (c_.peek(k) == ' ' || c_.peek(k) == '\t') ++k;
    return c_.peek(k) == ':' && c_.peek(k + 1) == ':' && c_.peek(k + 2) == '=';
  }
  StatusOr<Node> Alternation() {
    std::vector<Node> options;
    for (;;) {
      ASSIGN_OR_RETURN(Node s, Sequence());
      options.push_back(s);
      SkipSpace(false);
      if (!c_.eat('|')) break;
    }
    return b_.Alt(std::move(options));
  }
  StatusOr<Node> Sequence() {
    std::vector<Node> parts;
    for (;;) {
      SkipSpace(false);
      const char ch = c_.peek();
      if (c_.done() || ch == '|' || ch == ')' || ch == '\n') break;
      ASSIGN_OR_RETURN(Node atom, Atom());
      ASSIGN_OR_RETURN(auto q, Quantifier(c_));
      parts.push_back(q == std::make_pair(1, 1) ? atom : b_.Repeat(atom, q.first, q.second));
    }
    if (parts.empty()) return b_.Empty();
    return b_.Seq(std::move(parts));
  }
  StatusOr<Node> Atom() {
    const char ch = c_.peek();
    if (ch == '"' || ch == '\'') {
      c_.skip();
      std::vector<Node> chars;
      while (!c_.eat(ch)) {
        if (c_.done()) return c_.Error("unterminated string literal");
        uint32_t cp = 0;
        if (c_.eat('\\')) {
          CodepointRanges cls;
          bool is_class = false;
          Status err;
          if (!c_.Escape(&cp, &cls, &is_class, &err)) return err;
          if (is_class) return c_.Error("a class escape cannot appear in a string literal");
        } else {
          cp = c_.NextCodepoint();
        }
        chars.push_back(b_.Codepoints({{cp, cp}}));
      }
      if (chars.empty()) return b_.Empty();
      return b_.Seq(std::move(chars));
    }
    if (ch == '[') {
      c_.skip();
      ASSIGN_OR_RETURN(CodepointRanges r, c_.Class());
      return b_.Codepoints(r);
    }
    if (ch == '(') {
      if (++depth_ > kMaxNesting)
        return c_.Error("groups nest deeper than " + std::to_string(kMaxNesting));
      c_.skip();
      ASSIGN_OR_RETURN(Node inner, Alternation());
      SkipSpace(true);
      if (!c_.eat(')')) return c_.Error("missing ')'");
      --depth_;
      return inner;
    }
    if (ch == '.') {
      c_.skip();
      return b_.Codepoints({{0, kMaxCodepoint}});
    }
    if (IsNameChar(ch)) return b_.Ref(RuleFor(Name()));
    return c_.Error(std::string("unexpected '") + ch + "'");
  }

  GrammarBuilder& b_;
  Cursor c_;
  std::map<std::string, GrammarBuilder::Rule> rules_;
  int depth_ = 0;
};

}  // namespace

StatusOr<GrammarBuilder::Rule> CompileEbnf(GrammarBuilder& b, std::string_view grammar) {
  return EbnfParser(b, grammar).Parse();
}

}  // namespace strata::constrain

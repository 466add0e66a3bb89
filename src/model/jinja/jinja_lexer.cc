#include "model/jinja/jinja_lexer.h"

#include <cstring>

#include "model/jinja/jinja_value.h"

namespace strata::jinja {
namespace {

// Byte length of the Python whitespace character starting at s[i], or 0.
size_t WsLenAt(const std::string& s, size_t i) {
  if (i >= s.size()) return 0;
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return IsPyWhitespace(c) ? 1 : 0;
  std::vector<uint32_t> cp = DecodeUtf8(std::string_view(s).substr(i, 4));
  if (cp.empty() || !IsPyWhitespace(cp[0])) return 0;
  return cp[0] < 0x800 ? 2 : 3;  // all non-ASCII whitespace is below U+10000
}

// Byte length of the Python whitespace character ending at s[end-1], or 0.
size_t WsLenBefore(const std::string& s, size_t begin, size_t end) {
  for (size_t n = 1; n <= 3 && n <= end - begin; ++n) {
    size_t i = end - n;
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // continuation byte
    return WsLenAt(s, i) == n ? n : 0;
  }
  return 0;
}

std::string RStripWs(const std::string& s) {
  size_t end = s.size();
  while (size_t n = WsLenBefore(s, 0, end)) end -= n;
  return s.substr(0, end);
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t tag = FindTagStart(pos_);
      std::string text = s_.substr(pos_, tag - pos_);
      if (tag == s_.size()) {
        Emit(TokenType::kText, text);
        pos_ = tag;
        break;
      }
      char kind = s_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < s_.size() ? s_[tag + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      if (sign == '-') {
        text = RStripWs(text);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          size_t p = l_pos;
          while (size_t n = WsLenAt(text, p)) p += n;
          if (p == text.size() && p > l_pos) text.resize(l_pos);
        }
      }
      CountLines(pos_, tag);
      Emit(TokenType::kText, text);
      pos_ = tag + 2 + (sign != '\0' ? 1 : 0);
      Status st;
      if (kind == '#')
        st = LexComment();
      else if (kind == '{')
        st = LexTag(/*is_block=*/false);
      else if (IsRawBlock())
        st = LexRaw();
      else
        st = LexTag(/*is_block=*/true);
      if (!st.ok()) return st;
      line_starting = pos_ > 0 && s_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i)
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return s_.size();
  }

  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < s_.size(); ++i) line_ += s_[i] == '\n';
  }

  void Emit(TokenType t, std::string v) {
    if (t == TokenType::kText && v.empty()) return;
    tokens_.push_back(Token{t, std::move(v), line_});
  }

  Status Error(const std::string& what) const {
    return InvalidArgument("template line " + std::to_string(line_) + ": " + what);
  }

  // After a block or comment end: "-" strips all following whitespace,
  // "+" keeps it, else trim_blocks removes one newline.
  void AfterBlockEnd(char sign) {
    if (sign == '-') {
      while (size_t n = WsLenAt(s_, pos_)) {
        CountLines(pos_, pos_ + n);
        pos_ += n;
      }
    } else if (sign != '+' && pos_ < s_.size() && s_[pos_] == '\n') {
      ++line_;
      ++pos_;
    }
  }

  Status LexComment() {
    size_t end = s_.find("#}", pos_);
    if (end == std::string::npos) return Error("unterminated comment ('{#' without '#}')");
    char sign = end > pos_ && (s_[end - 1] == '-' || s_[end - 1] == '+') ? s_[end - 1] : '\0';
    CountLines(pos_, end);
    pos_ = end + 2;
    AfterBlockEnd(sign);
    return OkStatus();
  }

  bool IsRawBlock() const {
    size_t p = pos_;
    while (p < s_.size() && WsLenAt(s_, p)) p += WsLenAt(s_, p);
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && WsLenAt(s_, p)) p += WsLenAt(s_, p);
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0 ||
           s_.compare(p, 3, "+%}") == 0;
  }

  Status LexRaw() {
    size_t close = s_.find("%}", pos_);
    pos_ = close + 2;
    if (s_[close - 1] == '-') AfterBlockEnd('-');  // no trim_blocks after {% raw %} (as jinja2)
    // Find {%[-+]? endraw [-+]?%}
    for (size_t p = s_.find("{%", pos_); p != std::string::npos; p = s_.find("{%", p + 2)) {
      size_t q = p + 2;
      char lsign = q < s_.size() && (s_[q] == '-' || s_[q] == '+') ? s_[q++] : '\0';
      while (q < s_.size() && WsLenAt(s_, q)) q += WsLenAt(s_, q);
      if (s_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < s_.size() && WsLenAt(s_, q)) q += WsLenAt(s_, q);
      char rsign = q < s_.size() && (s_[q] == '-' || s_[q] == '+') ? s_[q++] : '\0';
      if (s_.compare(q, 2, "%}") != 0) continue;
      std::string text = s_.substr(pos_, p - pos_);
      if (lsign == '-') text = RStripWs(text);
      CountLines(pos_, q + 2);
      Emit(TokenType::kText, text);
      pos_ = q + 2;
      AfterBlockEnd(rsign);
      return OkStatus();
    }
    return Error("unterminated {% raw %} block (no {% endraw %})");
  }

  Status LexTag(bool is_block) {
    tokens_.push_back(Token{is_block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", line_});
    const char* end_delim = is_block ? "%}" : "}}";
    int depth = 0;  // brackets: an end delimiter inside them is not the end
    while (true) {
      while (size_t n = WsLenAt(s_, pos_)) {
        CountLines(pos_, pos_ + n);
        pos_ += n;
      }
      if (pos_ >= s_.size())
        return Error(std::string("unterminated tag: missing '") + end_delim + "'");
      if (depth == 0) {
        char sign = '\0';
        size_t p = pos_;
        if (s_[p] == '-' || (is_block && s_[p] == '+')) sign = s_[p++];
        if (s_.compare(p, 2, end_delim) == 0) {
          pos_ = p + 2;
          tokens_.push_back(Token{is_block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", line_});
          if (is_block) {
            AfterBlockEnd(sign);
          } else if (sign == '-') {
            AfterBlockEnd('-');
          }
          return OkStatus();
        }
      }
      char c = s_[pos_];
      if (IsDigit(c)) {
        LexNumber();
      } else if (IsNameStart(c)) {
        size_t b = pos_;
        while (pos_ < s_.size() && (IsNameStart(s_[pos_]) || IsDigit(s_[pos_]))) ++pos_;
        tokens_.push_back(Token{TokenType::kName, s_.substr(b, pos_ - b), line_});
      } else if (c == '\'' || c == '"') {
        RETURN_IF_ERROR(LexString());
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2)
          if (s_.compare(pos_, 2, o) == 0) op = o;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}<>=.:|,;", c) || c == '\0')
            return Error(std::string("unexpected character '") + c + "' in a tag");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) return Error("unexpected '" + op + "'");
          --depth;
        }
        pos_ += op.size();
        tokens_.push_back(Token{TokenType::kOperator, op, line_});
      }
    }
  }

  void LexNumber() {
    // (\d+_)*\d+ with an optional fraction and exponent; a number right
    // after '.' is an integer (foo.0.1 is two item lookups).
    bool after_dot = pos_ > 0 && s_[pos_ - 1] == '.';
    size_t b = pos_;
    auto digits = [&] {
      while (pos_ < s_.size() && (IsDigit(s_[pos_]) || (s_[pos_] == '_' && pos_ + 1 < s_.size() &&
                                                        IsDigit(s_[pos_ + 1]))))
        ++pos_;
    };
    digits();
    bool is_float = false;
    if (!after_dot && pos_ + 1 < s_.size() && s_[pos_] == '.' && IsDigit(s_[pos_ + 1])) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (!after_dot && pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) ++p;
      if (p < s_.size() && IsDigit(s_[p])) {
        pos_ = p;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = b; i < pos_; ++i)
      if (s_[i] != '_') text += s_[i];
    tokens_.push_back(Token{is_float ? TokenType::kFloat : TokenType::kInt, text, line_});
  }

  // Python unicode-escape rules, as jinja2 applies them to string literals.
  Status LexString() {
    char q = s_[pos_++];
    int start_line = line_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) {
        line_ = start_line;
        return Error("unterminated string literal");
      }
      char c = s_[pos_++];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) continue;
      char e = s_[pos_++];
      auto hex = [&](int n) -> int64_t {
        if (pos_ + static_cast<size_t>(n) > s_.size()) return -1;
        int64_t v = 0;
        for (int i = 0; i < n; ++i) {
          char h = s_[pos_ + static_cast<size_t>(i)];
          int d = IsDigit(h)               ? h - '0'
                  : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                           : -1;
          if (d < 0) return -1;
          v = v * 16 + d;
        }
        pos_ += static_cast<size_t>(n);
        return v;
      };
      switch (e) {
        case '\n':
          ++line_;
          break;  // line continuation
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          int64_t v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (v < 0 || v > 0x10FFFF)
            return Error(std::string("bad \\") + e + " escape in a string literal");
          AppendUtf8(out, static_cast<uint32_t>(v));
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0';
            for (int i = 0; i < 2 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++i)
              v = v * 8 + (s_[pos_++] - '0');
            AppendUtf8(out, static_cast<uint32_t>(v));
          } else if (e == 'N') {
            return Error("\\N{...} escapes in string literals are not supported");
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back(Token{TokenType::kString, std::move(out), start_line});
    return OkStatus();
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

// jinja2 normalizes \r\n and \r to \n and drops one trailing newline
// (keep_trailing_newline=False).
std::string NormalizeSource(const std::string& src) {
  std::string s;
  s.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      s += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      s += src[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

StatusOr<std::vector<Token>> Lex(const std::string& source) {
  return Lexer(NormalizeSource(source)).Run();
}

}  // namespace strata::jinja

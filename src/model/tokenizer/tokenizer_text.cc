#include "model/tokenizer/tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

namespace strata::tok {

void AppendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Scans one UTF-8 sequence at s[i]. Returns the number of bytes that form a
// valid sequence (>0), or, when invalid, -(bytes in the maximal invalid
// subpart). *incomplete is set when the subpart was cut short by the end of s
// (a valid prefix that more bytes could complete).
int ScanSequence(std::string_view s, size_t i, bool* incomplete) {
  *incomplete = false;
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // range for the first continuation byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *incomplete = true;
      return -k;
    }
    unsigned char d = b(i + k);
    bool ok = k == 1 ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xBF);
    if (!ok) return -k;
  }
  return need + 1;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    bool incomplete;
    int n = ScanSequence(s, i, &incomplete);
    if (n < 0) return false;
    i += n;
  }
  return true;
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    bool incomplete;
    int n = ScanSequence(s, i, &incomplete);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += -n;
    }
  }
  return out;
}

size_t CompleteUtf8Prefix(std::string_view s) {
  // Only the last (up to 3) bytes can be an unfinished sequence.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0xC0) continue;  // not a lead byte
    bool incomplete;
    int n = ScanSequence(s, i, &incomplete);
    if (n < 0 && incomplete) return i;
  }
  return s.size();
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME) ||
         cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC;
}

bool IsCombiningMark(char32_t c) {
  if (c < 0x300) return false;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 324> bytes;  // code points 0..323 cover the alphabet
  ByteLevelTables() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      char32_t cp = printable ? b : 256 + extra++;
      AppendUtf8(chars[b], cp);
      bytes[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t b) { return Tables().chars[b]; }
int ByteLevelByte(char32_t cp) { return cp < 324 ? Tables().bytes[cp] : -1; }

// ---------------------------------------------------------------------------
// Regex

namespace {

// Per-thread PCRE2 scratch: match data (ovector) and a JIT stack large enough
// for long whitespace runs. Shared by all patterns on the thread.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(16, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadMatchState() {
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

StatusOr<std::shared_ptr<const Regex>> Regex::Compile(const std::string& pattern,
                                                      const std::string& where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgument(where + ": regex /" + pattern + "/ does not compile at offset " +
                           std::to_string(offset) + ": " + reinterpret_cast<const char*>(msg) +
                           "; fix the pattern in tokenizer.json");
  }
  pcre2_jit_compile(code,
                    PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  std::shared_ptr<Regex> re(new Regex());
  re->code_ = code;
  return std::shared_ptr<const Regex>(std::move(re));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::Find(std::string_view s, size_t pos, size_t* start, size_t* end) const {
  ThreadMatchState& st = MatchState();
  int rc =
      pcre2_match(static_cast<const pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(s.data()),
                  s.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.ctx);
  if (rc < 0) return false;  // PCRE2_ERROR_NOMATCH (or a resource error: treat as no match)
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  *start = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace strata::tok

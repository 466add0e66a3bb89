#include "util/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace strata {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::INFO)};
const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::DEBUG: return "D";
    case LogLevel::INFO: return "I";
    case LogLevel::WARN: return "W";
    case LogLevel::ERROR: return "E";
  }
  return "?";
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

LogMessage::LogMessage(LogLevel level, const char* file, int line, bool fatal)
    : level_(level), fatal_(fatal) {
  const char* base = std::strrchr(file, '/');
  os_ << "[strata " << LevelName(level) << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  os_ << '\n';
  std::string s = os_.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
  if (fatal_) std::abort();
  (void)level_;
}

}  // namespace strata

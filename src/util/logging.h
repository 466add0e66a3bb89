// Minimal leveled logging to stderr. Thread-safe (one write per line).
// STRATA_LOG(INFO) << "text";  Levels: DEBUG, INFO, WARN, ERROR.
// STRATA_CHECK(cond) aborts with file:line on a broken internal invariant
// (a Strata bug), never for bad user input: that gets a Status.
#pragma once

#include <sstream>

namespace strata {

enum class LogLevel { DEBUG = 0, INFO = 1, WARN = 2, ERROR = 3 };
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line, bool fatal = false);
  ~LogMessage();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  bool fatal_;
  std::ostringstream os_;
};

}  // namespace strata

// A for-statement rather than if/else, so `if (x) STRATA_LOG(INFO) << y;`
// followed by an else binds as written.
#define STRATA_LOG(level)                                                            \
  for (bool _strata_log_once = ::strata::LogLevel::level >= ::strata::GetLogLevel(); \
       _strata_log_once; _strata_log_once = false)                                   \
  ::strata::LogMessage(::strata::LogLevel::level, __FILE__, __LINE__).stream()

#define STRATA_CHECK(cond)                                                          \
  if (cond) {                                                                       \
  } else                                                                            \
    ::strata::LogMessage(::strata::LogLevel::ERROR, __FILE__, __LINE__, true).stream() \
        << "Check failed: " #cond " "

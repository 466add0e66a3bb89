// Process signals for `strata serve` (and any long-running command): which
// signals stop the process, which are ignored, and that every one of them is
// logged, so that a process never disappears without a line saying why.
//
//   SIGTERM, SIGINT        stop: the first drains, a second one aborts what is left
//   SIGQUIT                stop at once (in-flight requests are aborted)
//   SIGHUP, SIGUSR1,       ignored, with a log line (Strata logs to stderr, so
//   SIGUSR2, SIGALRM, ...  there is no log file to reopen on SIGHUP)
//   SIGSEGV, SIGBUS, ...   (a crash) a last line on stderr, then the default action
//
// Asynchronous signals are blocked in every thread and taken synchronously
// with sigtimedwait() by the one thread that calls Next(); crash signals get
// an async-signal-safe handler that writes one line and re-raises.
//
// Thread-safety: Install() before any other thread starts (threads inherit
// the signal mask); Next() from one thread.
#pragma once

#include <chrono>
#include <string>

namespace strata::cli {

class ServeSignals {
 public:
  enum class Kind {
    kNone,     // Next() timed out
    kDrain,    // SIGTERM, SIGINT: drain (the second one: abort)
    kStopNow,  // SIGQUIT: abort in-flight work and exit
  };
  struct Event {
    Kind kind = Kind::kNone;
    int signo = 0;
    std::string name;  // "SIGTERM"
  };

  // Blocks the handled asynchronous signals in the calling thread and sets
  // the crash handlers; `command` prefixes every log line ("strata serve").
  static ServeSignals Install(const std::string& command);

  // The next signal that asks to stop, waiting at most `timeout` (negative:
  // forever). Ignored signals that arrive meanwhile are logged and skipped.
  Event Next(std::chrono::milliseconds timeout);

  // The text for --help.
  static const char* kHelp;

 private:
  std::string command_;
};

}  // namespace strata::cli

#include "cli/signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace strata::cli {
namespace {

// Signals whose default action ends the process and that say nothing about
// its health: taken by sigtimedwait and logged.
constexpr int kAsyncSignals[] = {SIGTERM,   SIGINT,  SIGQUIT, SIGHUP,  SIGUSR1, SIGUSR2, SIGALRM,
                                 SIGVTALRM, SIGPROF, SIGIO,   SIGXCPU, SIGXFSZ, SIGPWR};
// A crash: the process cannot go on, but it can say so.
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP};

char crash_prefix[128];  // written once by Install, read by the handler

const char* SignalName(int signo) {
  switch (signo) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGALRM:
      return "SIGALRM";
    case SIGVTALRM:
      return "SIGVTALRM";
    case SIGPROF:
      return "SIGPROF";
    case SIGIO:
      return "SIGIO";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGPWR:
      return "SIGPWR";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGFPE:
      return "SIGFPE";
    case SIGABRT:
      return "SIGABRT";
    case SIGSYS:
      return "SIGSYS";
    case SIGTRAP:
      return "SIGTRAP";
    default:
      return "signal";
  }
}

// Async-signal-safe: write(2) only, then the default action (a core dump
// where enabled).
void OnCrash(int signo) {
  const char* name = SignalName(signo);
  (void)!write(2, crash_prefix, strlen(crash_prefix));
  (void)!write(2, name, strlen(name));
  static const char tail[] = "; the process is ending (a bug: please report it with this log)\n";
  (void)!write(2, tail, sizeof tail - 1);
  signal(signo, SIG_DFL);
  raise(signo);
}

void Log(const std::string& command, const std::string& text) {
  std::fprintf(stderr, "%s: %s\n", command.c_str(), text.c_str());
  std::fflush(stderr);
}

}  // namespace

const char* ServeSignals::kHelp =
    "Signals: SIGTERM or SIGINT drains (/health 503, new requests 503, in-flight requests finish, "
    "exit 0; past --drain-timeout-s the rest are aborted, exit 1); a second SIGTERM/SIGINT aborts "
    "in-flight requests at once (streams end with an error event) and exits 128+signal; SIGQUIT "
    "does the same at once. SIGHUP, SIGUSR1, SIGUSR2 and SIGALRM are logged and ignored (logs go "
    "to stderr: there is no log file to reopen).";

ServeSignals ServeSignals::Install(const std::string& command) {
  ServeSignals s;
  s.command_ = command;
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kAsyncSignals) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a peer that closes mid-write is an error code, not a death
  std::snprintf(crash_prefix, sizeof crash_prefix, "%s: fatal signal ", command.c_str());
  struct sigaction sa {};
  sa.sa_handler = OnCrash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  for (int sig : kCrashSignals) sigaction(sig, &sa, nullptr);
  return s;
}

ServeSignals::Event ServeSignals::Next(std::chrono::milliseconds timeout) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kAsyncSignals) sigaddset(&set, sig);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int signo;
    if (timeout.count() < 0) {
      signo = sigwaitinfo(&set, nullptr);
    } else {
      auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) left = std::chrono::nanoseconds(0);
      timespec ts{static_cast<time_t>(left.count() / 1'000'000'000),
                  static_cast<long>(left.count() % 1'000'000'000)};
      signo = sigtimedwait(&set, nullptr, &ts);
    }
    if (signo < 0) {
      if (errno == EINTR) continue;
      return {};  // EAGAIN: timed out
    }
    Event e;
    e.signo = signo;
    e.name = SignalName(signo);
    if (signo == SIGTERM || signo == SIGINT) {
      e.kind = Kind::kDrain;
      return e;
    }
    if (signo == SIGQUIT) {
      e.kind = Kind::kStopNow;
      return e;
    }
    Log(command_,
        e.name + " received; ignored" +
            (signo == SIGHUP ? std::string(" (logs go to stderr: there is no log file to reopen)")
                             : ""));
  }
}

}  // namespace strata::cli

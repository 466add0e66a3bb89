// StopProcess: SIGSTOP a process and wait until the kernel has stopped every
// thread of it. For tests that stall a peer: kill() returns as soon as the
// signal is queued, and on a loaded machine the target may run on for tens
// of milliseconds (until one of its threads is scheduled and takes the
// stop), long enough to finish a request the test meant to stall (seen as
// "a killed decode answered" in pd_e2e_test).
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace strata {

// Whether every thread of `pid` is stopped: its state in
// /proc/<pid>/task/<tid>/stat is 'T' (stopped) or 't' (traced). False when
// the process is gone.
inline bool AllThreadsStopped(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool stopped = true;
  int threads = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    ++threads;
    FILE* f = std::fopen((dir + "/" + e->d_name + "/stat").c_str(), "r");
    if (f == nullptr) continue;  // the thread just exited
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    // "tid (comm) S ...": the state follows the last ')' (comm may hold any).
    const std::string s(buf, n);
    const size_t paren = s.rfind(')');
    const char state = paren != std::string::npos && paren + 2 < s.size() ? s[paren + 2] : '?';
    if (state != 'T' && state != 't') stopped = false;
  }
  closedir(d);
  return stopped && threads > 0;
}

// Sends SIGSTOP and waits until every thread is stopped (polling every
// millisecond, up to `timeout`). False when kill fails or the timeout passes.
inline bool StopProcess(pid_t pid,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  if (kill(pid, SIGSTOP) != 0) return false;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!AllThreadsStopped(pid)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace strata

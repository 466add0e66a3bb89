// One thread that runs one host job at a time beside the engine thread: the
// engine hands it work that does not need the step's results (a step's
// constraint masks) before it launches the step's forward on an
// asynchronous backend, and collects it before sampling, so that work runs
// while the GPU computes and while the engine thread issues launches.
//
// Contract: Start(job) then Wait(), strictly alternating, from one thread
// (the engine's). Start returns at once; Wait returns once the job has run,
// and everything the job wrote is visible to the caller after Wait (the
// handoff is a mutex). The destructor waits for a started job, then joins.
//
// Thread-safety: not for concurrent callers; the job runs on the worker.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace strata {

class HostWorker {
 public:
  HostWorker();
  ~HostWorker();
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  // REQUIRES: no job started and not yet waited for.
  void Start(std::function<void()> job);
  // Returns at once when no job was started.
  void Wait();
  bool busy() const { return started_; }

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;  // set by Start, cleared by the worker when done
  bool started_ = false;       // caller's view: Start called, Wait not yet
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata

// CacheController: the HiCache copy thread (docs/architecture/hicache.md).
// Copies whole pages between the device KV pool and the host pool: backups
// (device -> host) and load-backs (host -> device), off the engine thread.
// It knows the two pools' memory (KvPoolMemory, same layout), not the radix
// tree or the page allocators: the engine decides which pages to copy and
// owns their lifetime (a page must stay allocated, and its source bytes
// unchanged, until its job completes).
//
// Each job is ONE Backend::CopyBlocks call holding every (group, layer,
// tensor, page run) block, where a run is a set of pages consecutive on both
// sides (merged into one block). The controller thread serves jobs one at a
// time: queued load-backs first (they gate a request's prefill), then
// backups, each in submission order; Wait takes a still-queued job out of
// turn and runs it on the waiting thread.
//
// Thread-safety: every method may be called from any thread (a mutex guards
// the queues); the engine thread is the intended caller. The copies run on
// the controller's own thread, concurrently with the engine's compute ops:
// that is why it needs Backend::CopyBlocks, which is callable off the
// engine thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_layout.h"
#include "util/status.h"

namespace strata {

struct PageCopy {
  int32_t src_page;
  int32_t dst_page;
};

enum class CopyDirection {
  kDeviceToHost,  // backup: src_page is a device page, dst_page a host page
  kHostToDevice,  // load-back: src_page is a host page, dst_page a device page
};

class CacheController {
 public:
  // device = the KvPool's memory(); host = the HostKvPool's memory().
  // REQUIRES: the same layout (checked: groups, layers, bytes per page);
  // backend, and both pools, outlive the controller.
  CacheController(Backend& backend, KvPoolMemory device, KvPoolMemory host);
  // Finishes every queued job (their completions are dropped), then joins.
  ~CacheController();
  CacheController(const CacheController&) = delete;
  CacheController& operator=(const CacheController&) = delete;

  using Ticket = uint64_t;  // 1, 2, 3, ... in submission order

  // Queues a copy of whole pages (every group, layer, K and V) and returns
  // at once. An empty list is a job that completes at once.
  // REQUIRES: page ids in range of their pools; no dst_page twice (a
  // Strata bug otherwise: aborts).
  Ticket Submit(CopyDirection dir, std::vector<PageCopy> pages);

  struct Completion {
    Ticket ticket = 0;
    Status status;  // the backend's copy error, if any
    CopyDirection dir = CopyDirection::kDeviceToHost;
    int64_t pages = 0;
    uint64_t bytes = 0;
    double copy_seconds = 0;   // inside CopyBlocks
    double total_seconds = 0;  // Submit to completion (queue + copy)
  };
  // Jobs completed since the last call, in completion order. Never blocks
  // on a copy.
  std::vector<Completion> Poll();

  // Blocks until `ticket` has completed; it is then returned by the next
  // Poll as usual. For pages the current step needs. Returns at once for a
  // ticket already completed (polled or not). A job still queued is run on
  // the calling thread, ahead of the queue (the caller needs it now); one
  // already running is waited for.
  // REQUIRES: ticket was returned by Submit.
  void Wait(Ticket ticket);

  struct Stats {
    int64_t jobs = 0;   // completed
    int64_t pages = 0;  // copied by completed jobs, both directions
    uint64_t bytes_h2d = 0, bytes_d2h = 0;
    double seconds_h2d = 0, seconds_d2h = 0;  // copy time (CopyBlocks)
  };
  Stats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Job {
    Ticket ticket;
    CopyDirection dir;
    std::vector<PageCopy> pages;
    Clock::time_point submitted;
  };

  void Loop();
  // Copies the job's pages; any thread, without mu_ (the controller's, or
  // Wait's for a job still queued).
  Completion Run(Job& job);
  // Records a completion. REQUIRES: mu_ held.
  void Finish(Completion c);

  Backend& backend_;
  const KvPoolMemory device_, host_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // a job queued, or stop_
  std::condition_variable done_cv_;  // a job completed
  std::deque<Job> load_backs_, backups_;
  std::unordered_set<Ticket> unfinished_;  // queued or running
  std::vector<Completion> completed_;      // not yet polled
  Ticket next_ticket_ = 1;
  bool stop_ = false;
  Stats stats_;

  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace strata

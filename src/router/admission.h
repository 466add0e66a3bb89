// The router's own admission control (--max-concurrent-requests,
// --max-queued-requests, --max-queue-time-ms): at most max_concurrent
// requests are dispatched to workers at once; past that, up to max_queued
// wait in arrival order for a slot; past that a request is refused at once
// (the router answers 503 + Retry-After, code naming the limit). SGLang's
// router queues without such a bound in PD mode; this one never does.
//
// The queue-time limit is the caller's timer (router.cc): when it fires it
// calls Cancel(), and a request still queued is answered 503 max_queue_time.
//
// Thread-safety: every method is thread-safe. The `start` callbacks run on
// the thread that frees the slot (Release), outside the lock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace strata::router {

struct AdmissionLimits {
  int64_t max_concurrent_requests = 256;  // 0: no limit (and then nothing queues)
  int64_t max_queued_requests = 100;      // 0: nothing waits; full: refused at once
};

class RouterAdmission {
 public:
  explicit RouterAdmission(AdmissionLimits limits) : limits_(limits) {}

  enum class Verdict {
    kAdmitted,  // holds a slot now: dispatch, then Release() when done
    kQueued,    // `start` runs later, holding a slot (or never: Cancel())
    kRejected,  // nothing held; *limit says which limit refused it
  };
  // `id`: unique per request (for Cancel). `limit` (set on kRejected):
  // "max_queued_requests" when the queue is full, "max_concurrent_requests"
  // when no queue is allowed (max_queued_requests 0).
  Verdict Acquire(uint64_t id, std::function<void()> start, std::string* limit);
  // A request holding a slot is done: the slot goes to the oldest queued
  // request (its `start` runs here, after the lock is released).
  void Release();
  // Removes a queued request (client gone, queue time passed): true if it was
  // still queued (its `start` will never run); false if it already started or
  // was never queued.
  bool Cancel(uint64_t id);

  int64_t running() const;
  int64_t queued() const;
  const AdmissionLimits& limits() const { return limits_; }

 private:
  struct Waiter {
    uint64_t id;
    std::function<void()> start;
  };
  const AdmissionLimits limits_;
  mutable std::mutex mu_;
  int64_t running_ = 0;
  std::deque<Waiter> queue_;
};

}  // namespace strata::router

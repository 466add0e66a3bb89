// A circuit breaker for one worker: after `failure_threshold` consecutive
// failed requests the worker is taken out of rotation (open) for
// `open_duration`; then a few trial requests may go (half-open, one at a
// time); `success_threshold` consecutive successes close it again, any failure
// opens it for another `open_duration`.
//
//   closed --K failures--> open --open_duration--> half_open --S successes--> closed
//                           ^                          |
//                           +-------- a failure -------+
//
// What counts as a failure is the caller's decision (router.cc: connection
// failures, timeouts and 5xx answers other than 503; a 503 is the worker
// shedding load on purpose and is left to retries and least_load).
//
// Time is passed in, so tests drive it. Not thread-safe: the router guards
// each worker's breaker with its own mutex.
#pragma once

#include <chrono>
#include <cstdint>

namespace strata::router {

struct BreakerOptions {
  bool enabled = true;  // false: always closed (--disable-circuit-breaker)
  int64_t failure_threshold = 10;
  int64_t success_threshold = 3;
  std::chrono::milliseconds open_duration{60'000};
};

// The numbers are the strata_router_breaker_state gauge's values.
enum class BreakerState { kClosed = 0, kHalfOpen = 1, kOpen = 2 };
const char* BreakerStateName(BreakerState s);

class CircuitBreaker {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CircuitBreaker(BreakerOptions options = {}) : options_(options) {}

  // Whether a request may be sent now: closed; or half-open with no trial in
  // flight. Moves open to half-open once open_duration has passed.
  bool CanSend(Clock::time_point now);
  // A request was sent (after CanSend said yes): in half-open it is the trial.
  void OnSend();
  // The outcome of a request that was sent.
  void Record(bool success, Clock::time_point now);
  // The request was sent but ended without telling anything about the worker
  // (the client went away first): frees a half-open trial slot.
  void Forget();

  BreakerState state() const { return state_; }

 private:
  BreakerOptions options_;
  BreakerState state_ = BreakerState::kClosed;
  int64_t consecutive_failures_ = 0;
  int64_t consecutive_successes_ = 0;  // in half-open
  int64_t trials_in_flight_ = 0;
  Clock::time_point opened_at_{};
};

}  // namespace strata::router

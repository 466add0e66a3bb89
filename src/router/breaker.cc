#include "router/breaker.h"

namespace strata::router {

const char* BreakerStateName(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kHalfOpen:
      return "half_open";
    case BreakerState::kOpen:
      return "open";
  }
  return "?";
}

bool CircuitBreaker::CanSend(Clock::time_point now) {
  if (!options_.enabled) return true;
  if (state_ == BreakerState::kOpen && now - opened_at_ >= options_.open_duration) {
    state_ = BreakerState::kHalfOpen;
    consecutive_successes_ = 0;
    trials_in_flight_ = 0;
  }
  switch (state_) {
    case BreakerState::kClosed:
      return true;
    case BreakerState::kHalfOpen:
      return trials_in_flight_ == 0;
    case BreakerState::kOpen:
      return false;
  }
  return false;
}

void CircuitBreaker::OnSend() {
  if (options_.enabled && state_ == BreakerState::kHalfOpen) ++trials_in_flight_;
}

void CircuitBreaker::Forget() {
  if (trials_in_flight_ > 0) --trials_in_flight_;
}

void CircuitBreaker::Record(bool success, Clock::time_point now) {
  if (!options_.enabled) return;
  Forget();
  if (success) {
    consecutive_failures_ = 0;
    if (state_ == BreakerState::kHalfOpen && ++consecutive_successes_ >= options_.success_threshold)
      state_ = BreakerState::kClosed;
    return;
  }
  consecutive_successes_ = 0;
  ++consecutive_failures_;
  if (state_ == BreakerState::kHalfOpen ||
      (state_ == BreakerState::kClosed && consecutive_failures_ >= options_.failure_threshold)) {
    state_ = BreakerState::kOpen;
    opened_at_ = now;
  }
}

}  // namespace strata::router

#include "router/breaker.h"

#include <gtest/gtest.h>

namespace strata::router {
namespace {

using std::chrono::milliseconds;

TEST(CircuitBreakerTest, OpensAfterConsecutiveFailuresAndRecoversThroughHalfOpen) {
  BreakerOptions o;
  o.failure_threshold = 3;
  o.success_threshold = 2;
  o.open_duration = milliseconds(1000);
  CircuitBreaker b(o);
  auto t = CircuitBreaker::Clock::time_point{} + std::chrono::hours(1);
  // A success in between resets the count: failures must be consecutive.
  for (bool ok : {false, false, true, false, false}) {
    ASSERT_TRUE(b.CanSend(t));
    b.OnSend();
    b.Record(ok, t);
  }
  EXPECT_EQ(b.state(), BreakerState::kClosed);
  b.OnSend();
  b.Record(false, t);
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_FALSE(b.CanSend(t + milliseconds(999)));
  // After the cool-down: one trial at a time.
  EXPECT_TRUE(b.CanSend(t + milliseconds(1000)));
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  b.OnSend();
  EXPECT_FALSE(b.CanSend(t + milliseconds(1001))) << "a second trial while one is in flight";
  b.Record(true, t + milliseconds(1002));
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  ASSERT_TRUE(b.CanSend(t + milliseconds(1003)));
  b.OnSend();
  b.Record(true, t + milliseconds(1004));
  EXPECT_EQ(b.state(), BreakerState::kClosed);
}

TEST(CircuitBreakerTest, AFailedTrialReopensForAnotherCoolDown) {
  BreakerOptions o;
  o.failure_threshold = 1;
  o.open_duration = milliseconds(100);
  CircuitBreaker b(o);
  auto t = CircuitBreaker::Clock::time_point{} + std::chrono::hours(1);
  b.OnSend();
  b.Record(false, t);
  ASSERT_TRUE(b.CanSend(t + milliseconds(100)));
  b.OnSend();
  b.Record(false, t + milliseconds(150));
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_FALSE(b.CanSend(t + milliseconds(249)));
  EXPECT_TRUE(b.CanSend(t + milliseconds(250)));
}

TEST(CircuitBreakerTest, AForgottenTrialFreesTheSlotAndDisabledNeverOpens) {
  BreakerOptions o;
  o.failure_threshold = 1;
  o.open_duration = milliseconds(10);
  CircuitBreaker b(o);
  auto t = CircuitBreaker::Clock::time_point{} + std::chrono::hours(1);
  b.OnSend();
  b.Record(false, t);
  ASSERT_TRUE(b.CanSend(t + milliseconds(10)));
  b.OnSend();
  b.Forget();  // the client left: nothing learned, the next trial may go
  EXPECT_TRUE(b.CanSend(t + milliseconds(11)));

  o.enabled = false;
  CircuitBreaker off(o);
  for (int i = 0; i < 100; ++i) off.Record(false, t);
  EXPECT_TRUE(off.CanSend(t));
  EXPECT_EQ(off.state(), BreakerState::kClosed);
}

}  // namespace
}  // namespace strata::router

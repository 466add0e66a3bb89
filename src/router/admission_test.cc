#include "router/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace strata::router {
namespace {

using Verdict = RouterAdmission::Verdict;

TEST(RouterAdmissionTest, ConcurrentThenQueuedThenRejectedNamingTheLimit) {
  RouterAdmission a({2, 1});
  std::string limit;
  int started = 0;
  EXPECT_EQ(a.Acquire(
                1, [&] { ++started; }, &limit),
            Verdict::kAdmitted);
  EXPECT_EQ(a.Acquire(
                2, [&] { ++started; }, &limit),
            Verdict::kAdmitted);
  EXPECT_EQ(a.Acquire(
                3, [&] { ++started; }, &limit),
            Verdict::kQueued);
  EXPECT_EQ(a.Acquire(
                4, [&] { ++started; }, &limit),
            Verdict::kRejected);
  EXPECT_EQ(limit, "max_queued_requests");
  EXPECT_EQ(a.running(), 2);
  EXPECT_EQ(a.queued(), 1);
  a.Release();  // the slot passes to request 3
  EXPECT_EQ(started, 1);
  EXPECT_EQ(a.running(), 2);
  EXPECT_EQ(a.queued(), 0);
  a.Release();
  a.Release();
  EXPECT_EQ(a.running(), 0);

  RouterAdmission no_queue({1, 0});
  EXPECT_EQ(no_queue.Acquire(
                1, [] {}, &limit),
            Verdict::kAdmitted);
  EXPECT_EQ(no_queue.Acquire(
                2, [] {}, &limit),
            Verdict::kRejected);
  EXPECT_EQ(limit, "max_concurrent_requests");
}

TEST(RouterAdmissionTest, CancelledWaitersNeverStartAndUnlimitedAdmitsAll) {
  RouterAdmission a({1, 5});
  std::string limit;
  std::vector<int> order;
  ASSERT_EQ(a.Acquire(
                1, [] {}, &limit),
            Verdict::kAdmitted);
  for (uint64_t id : {2, 3, 4})
    a.Acquire(
        id, [&, id] { order.push_back(int(id)); }, &limit);
  EXPECT_TRUE(a.Cancel(3));
  EXPECT_FALSE(a.Cancel(3));
  a.Release();
  a.Release();
  EXPECT_EQ(order, (std::vector<int>{2, 4}));
  EXPECT_FALSE(a.Cancel(2)) << "already started";

  RouterAdmission unlimited({0, 0});
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(unlimited.Acquire(
                  i, [] {}, &limit),
              Verdict::kAdmitted);
}

// Many threads acquiring and releasing: never more than the limit run, and
// every admitted or queued request runs exactly once.
TEST(RouterAdmissionTest, CountsStayExactUnderConcurrency) {
  RouterAdmission a({3, 1000});
  std::atomic<int> running{0}, max_running{0}, ran{0};
  auto body = [&] {
    const int now = ++running;
    int m = max_running.load();
    while (now > m && !max_running.compare_exchange_weak(m, now)) {
    }
    ++ran;
    --running;
    a.Release();
  };
  std::vector<std::thread> ts;
  std::atomic<uint64_t> id{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        std::string limit;
        if (a.Acquire(++id, body, &limit) == Verdict::kAdmitted) body();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ran.load(), 800);
  EXPECT_LE(max_running.load(), 3);
  EXPECT_EQ(a.running(), 0);
  EXPECT_EQ(a.queued(), 0);
}

}  // namespace
}  // namespace strata::router

#include "engine/host_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(HostWorkerTest, WaitReturnsAfterTheJobAndSeesWhatItWrote) {
  HostWorker w;
  std::vector<int> out;
  for (int i = 0; i < 2000; ++i) {
    w.Start([&out, i] { out.push_back(i); });  // the worker alone touches out until Wait
    EXPECT_TRUE(w.busy());
    w.Wait();
    EXPECT_FALSE(w.busy());
    ASSERT_EQ(out.size(), size_t(i + 1));
    ASSERT_EQ(out.back(), i);
  }
}

TEST(HostWorkerTest, TheJobRunsOnAnotherThreadWhileTheCallerWorks) {
  HostWorker w;
  std::atomic<bool> caller_done{false};
  bool saw_caller_done = false;
  std::thread::id job_thread;
  w.Start([&] {
    job_thread = std::this_thread::get_id();
    // Runs while the caller is still working: it sees the caller finish.
    while (!caller_done.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    saw_caller_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  caller_done = true;
  w.Wait();
  EXPECT_TRUE(saw_caller_done);
  EXPECT_NE(job_thread, std::this_thread::get_id());
}

TEST(HostWorkerTest, WaitWithoutAJobReturnsAndTheDestructorWaitsForOne) {
  std::atomic<int> ran{0};
  {
    HostWorker w;
    w.Wait();  // nothing started
    w.Start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ran = 1;
    });
  }  // destroyed with the job running: it finishes first
  EXPECT_EQ(ran.load(), 1);
}

TEST(HostWorkerDeathTest, StartingTwiceWithoutWaitIsABug) {
  EXPECT_DEATH(
      {
        HostWorker w;
        w.Start([] {});
        w.Start([] {});
      },
      "not waited for");
}

}  // namespace
}  // namespace strata

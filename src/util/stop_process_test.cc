// StopProcess (stop_process.h) on a real child with several busy threads.
#include "util/stop_process.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(StopProcessTest, ReturnsOnceEveryThreadIsStoppedAndSeesThemRunAgain) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atomic<uint64_t> n{0};
    std::vector<std::thread> spin;
    for (int i = 0; i < 3; ++i)
      spin.emplace_back([&] {
        for (;;) n.fetch_add(1, std::memory_order_relaxed);
      });
    for (;;) n.fetch_add(1, std::memory_order_relaxed);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its threads started
  EXPECT_FALSE(AllThreadsStopped(pid)) << "a spinning process reads as stopped";
  ASSERT_TRUE(StopProcess(pid));
  EXPECT_TRUE(AllThreadsStopped(pid));
  kill(pid, SIGCONT);
  bool running = false;
  for (int i = 0; i < 1000 && !running; ++i) {
    running = !AllThreadsStopped(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(running) << "still stopped after SIGCONT";
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_FALSE(AllThreadsStopped(pid)) << "a reaped process";
  EXPECT_FALSE(StopProcess(pid, std::chrono::milliseconds(10)));
}

}  // namespace
}  // namespace strata

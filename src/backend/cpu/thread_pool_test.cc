#include "backend/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace strata::cpu {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 3, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> bad_thread{false};
      pool.ParallelFor(n, [&](int64_t t, int thread) {
        hits[t].fetch_add(1);
        if (thread < 0 || thread >= threads) bad_thread = true;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "task " << i;
      EXPECT_FALSE(bad_thread);
    }
  }
}

TEST(ThreadPoolTest, ManyBackToBackJobsSeeEarlierWrites) {
  // Each job reads what the previous one wrote: checks the pool's
  // happens-before edges between consecutive ParallelFor calls.
  ThreadPool pool(2);
  std::vector<int64_t> data(64, 0);
  for (int iter = 0; iter < 300; ++iter) {
    pool.ParallelFor(64, [&](int64_t t, int) { data[t] = data[t] + t; });
  }
  for (int64_t t = 0; t < 64; ++t) ASSERT_EQ(data[t], 300 * t);
}

// More threads than cores: workers are often descheduled, wake late and
// find a job retired or a newer one running. Every task of every job must
// still run exactly once, and the caller must not wait for sleeping workers
// (regression: it used to wait for every worker to check in, making decode
// 10x slower on a busy machine).
TEST(ThreadPoolTest, OversubscribedPoolRunsEachJobsTasksOnce) {
  ThreadPool pool(16);
  std::vector<std::atomic<int>> hits(8);
  for (int iter = 0; iter < 3000; ++iter) {
    const int64_t n = 1 + iter % 8;
    pool.ParallelFor(n, [&](int64_t t, int) { hits[t].fetch_add(1, std::memory_order_relaxed); });
    for (int64_t t = 0; t < n; ++t) {
      ASSERT_EQ(hits[t].load(), 1) << "iteration " << iter << " task " << t;
      hits[t].store(0);
    }
  }
}

}  // namespace
}  // namespace strata::cpu

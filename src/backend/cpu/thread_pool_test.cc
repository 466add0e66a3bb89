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

}  // namespace
}  // namespace strata::cpu

// A small persistent thread pool for the CPU backend's data-parallel ops.
//
// ParallelFor(n, fn) runs fn(task, thread) for every task in [0, n) on the
// pool's threads plus the calling thread, and returns when all have finished.
// Tasks are handed out dynamically (one atomic counter), so uneven tasks
// balance. Decode issues ~10 small ops per layer, so dispatch is cheap:
// workers spin briefly on a generation counter before sleeping on it.
//
// Thread-safety: ParallelFor must not be called concurrently or re-entrantly
// (the backend issues ops from one thread). The pool owns its threads and
// joins them on destruction.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace strata::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread: 1 means no worker threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(int64_t task, int thread) for each task in [0, num_tasks);
  // `thread` in [0, num_threads()) identifies the executing thread (0 is the
  // caller), e.g. to index per-thread scratch memory.
  template <typename F>
  void ParallelFor(int64_t num_tasks, F&& fn) {
    if (num_tasks <= 0) return;
    if (num_tasks == 1 || workers_.empty()) {
      for (int64_t i = 0; i < num_tasks; ++i) fn(i, 0);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    Run(num_tasks, [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, int64_t task, int thread);
  void Run(int64_t num_tasks, TaskFn fn, void* ctx);
  void RunTasks(int thread);
  void WorkerLoop(int thread);

  std::vector<std::thread> workers_;
  // The current job; written by the caller before generation_ is bumped.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t num_tasks_ = 0;
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> busy_workers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace strata::cpu

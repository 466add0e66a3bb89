// A small persistent thread pool for the CPU backend's data-parallel ops.
//
// ParallelFor(n, fn) runs fn(task, thread) for every task in [0, n) on the
// pool's threads plus the calling thread, and returns when all have finished.
// Tasks are handed out dynamically (one atomic counter), so uneven tasks
// balance. Decode issues ~10 small ops per layer, so dispatch is cheap:
// workers spin briefly on a generation counter before sleeping on it.
// The caller waits for the tasks, not for the workers: when a worker is
// descheduled (a busy machine), the caller runs every task itself instead of
// waiting for that worker to wake up. A worker only ever blocks the caller
// during the few instructions between joining a job and finding it drained.
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
  void WorkerLoop(int thread);

  // One ParallelFor call; lives on the caller's stack.
  struct Job {
    TaskFn fn;
    void* ctx;
    int64_t num_tasks;
    alignas(64) std::atomic<int64_t> next_task{0};
    alignas(64) std::atomic<int64_t> done_tasks{0};
  };
  void RunJobTasks(Job& job, int thread);

  std::vector<std::thread> workers_;
  alignas(64) std::atomic<Job*> job_{nullptr};
  alignas(64) std::atomic<uint32_t> generation_{0};
  // Workers between loading job_ and leaving it; the caller waits for 0
  // before its Job goes out of scope.
  alignas(64) std::atomic<int> active_workers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace strata::cpu

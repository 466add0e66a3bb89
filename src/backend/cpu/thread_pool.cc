#include "backend/cpu/thread_pool.h"

namespace strata::cpu {
namespace {

// Spin iterations before sleeping; each is a `pause` (~10-60 ns). Long
// enough to bridge the gap between consecutive ops of one decode step.
constexpr int kSpinIterations = 4000;

inline void CpuRelax() { __builtin_ia32_pause(); }

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::RunJobTasks(Job& job, int thread) {
  for (;;) {
    const int64_t task = job.next_task.fetch_add(1, std::memory_order_relaxed);
    if (task >= job.num_tasks) return;
    job.fn(job.ctx, task, thread);
    job.done_tasks.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::Run(int64_t num_tasks, TaskFn fn, void* ctx) {
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.num_tasks = num_tasks;
  job_.store(&job);  // seq_cst: ordered before the worker's join (below)
  generation_.fetch_add(1);
  generation_.notify_all();
  RunJobTasks(job, 0);
  // Tasks other threads took: wait for them to finish.
  for (int i = 0; job.done_tasks.load(std::memory_order_acquire) < num_tasks; ++i) {
    if (i < kSpinIterations) CpuRelax();
    else std::this_thread::yield();
  }
  // Retire the job. A worker that joins after this store sees null; one that
  // joined before is counted in active_workers_ and leaves at once (no tasks
  // are left), so this wait is a few instructions long.
  job_.store(nullptr);
  while (active_workers_.load() != 0) CpuRelax();
}

void ThreadPool::WorkerLoop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      CpuRelax();
      gen = generation_.load(std::memory_order_acquire);
    }
    while (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    active_workers_.fetch_add(1);  // seq_cst: join, then look at the job
    if (Job* job = job_.load()) RunJobTasks(*job, thread);
    active_workers_.fetch_sub(1);
  }
}

}  // namespace strata::cpu

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
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::Run(int64_t num_tasks, TaskFn fn, void* ctx) {
  fn_ = fn;
  ctx_ = ctx;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  RunTasks(0);
  for (int i = 0; i < kSpinIterations; ++i) {
    if (busy_workers_.load(std::memory_order_acquire) == 0) return;
    CpuRelax();
  }
  for (;;) {
    int busy = busy_workers_.load(std::memory_order_acquire);
    if (busy == 0) return;
    busy_workers_.wait(busy, std::memory_order_acquire);
  }
}

void ThreadPool::RunTasks(int thread) {
  for (;;) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    fn_(ctx_, task, thread);
  }
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
    if (stop_.load(std::memory_order_relaxed)) return;
    RunTasks(thread);
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

}  // namespace strata::cpu

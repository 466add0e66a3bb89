#include "engine/host_worker.h"

#include <utility>

#include "util/logging.h"

namespace strata {

HostWorker::HostWorker() : thread_([this] { Loop(); }) {}

HostWorker::~HostWorker() {
  Wait();
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostWorker::Start(std::function<void()> job) {
  STRATA_CHECK(!started_) << "HostWorker::Start: the last job was not waited for";
  STRATA_CHECK(job != nullptr);
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = std::move(job);
  }
  started_ = true;
  cv_.notify_all();
}

void HostWorker::Wait() {
  if (!started_) return;
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return job_ == nullptr; });
  started_ = false;
}

void HostWorker::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || job_ != nullptr; });
    if (job_ == nullptr) return;  // stop_, nothing pending
    std::function<void()> job = job_;
    l.unlock();
    job();
    l.lock();
    job_ = nullptr;
    cv_.notify_all();
  }
}

}  // namespace strata

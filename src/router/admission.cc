#include "router/admission.h"

#include <algorithm>

namespace strata::router {

RouterAdmission::Verdict RouterAdmission::Acquire(uint64_t id, std::function<void()> start,
                                                  std::string* limit) {
  std::lock_guard lock(mu_);
  if (limits_.max_concurrent_requests == 0 || running_ < limits_.max_concurrent_requests) {
    ++running_;
    return Verdict::kAdmitted;
  }
  if (static_cast<int64_t>(queue_.size()) < limits_.max_queued_requests) {
    queue_.push_back(Waiter{id, std::move(start)});
    return Verdict::kQueued;
  }
  *limit = limits_.max_queued_requests > 0 ? "max_queued_requests" : "max_concurrent_requests";
  return Verdict::kRejected;
}

void RouterAdmission::Release() {
  std::function<void()> next;
  {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) {
      next = std::move(queue_.front().start);  // the slot passes on: running_ unchanged
      queue_.pop_front();
    } else if (running_ > 0) {
      --running_;
    }
  }
  if (next) next();
}

bool RouterAdmission::Cancel(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Waiter& w) { return w.id == id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

int64_t RouterAdmission::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

int64_t RouterAdmission::queued() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace strata::router

#include "cache/cache_controller.h"

#include <algorithm>
#include <string>
#include <utility>

#include "util/logging.h"

namespace strata {
namespace {

// The two pools must agree on every size that page addressing uses.
void CheckSameLayout(const KvPoolMemory& device, const KvPoolMemory& host) {
  STRATA_CHECK(device.layout && host.layout) << "CacheController: a pool without a layout";
  const KvLayout& d = *device.layout;
  const KvLayout& h = *host.layout;
  STRATA_CHECK(d.page_size == h.page_size && d.groups.size() == h.groups.size() &&
               device.group_base.size() == d.groups.size() &&
               host.group_base.size() == h.groups.size())
      << "CacheController: device layout (" << d.Describe() << ") and host layout (" << h.Describe()
      << ") differ";
  for (size_t g = 0; g < d.groups.size(); ++g) {
    const int gi = static_cast<int>(g);
    STRATA_CHECK(d.groups[g].num_layers == h.groups[g].num_layers &&
                 d.groups[g].has_v == h.groups[g].has_v &&
                 d.BytesPerPagePerTensor(gi) == h.BytesPerPagePerTensor(gi))
        << "CacheController: group " << d.groups[g].name << " differs between device ("
        << d.Describe() << ") and host (" << h.Describe() << ")";
  }
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

CacheController::CacheController(Backend& backend, KvPoolMemory device, KvPoolMemory host)
    : backend_(backend), device_(std::move(device)), host_(std::move(host)) {
  CheckSameLayout(device_, host_);
  thread_ = std::thread([this] { Loop(); });
}

CacheController::~CacheController() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

CacheController::Ticket CacheController::Submit(CopyDirection dir, std::vector<PageCopy> pages) {
  const KvPoolMemory& src = dir == CopyDirection::kDeviceToHost ? device_ : host_;
  const KvPoolMemory& dst = dir == CopyDirection::kDeviceToHost ? host_ : device_;
  std::vector<int32_t> dst_pages;
  dst_pages.reserve(pages.size());
  for (const PageCopy& p : pages) {
    STRATA_CHECK(p.src_page >= 0 && p.src_page < src.num_pages && p.dst_page >= 0 &&
                 p.dst_page < dst.num_pages)
        << "CacheController: page copy " << p.src_page << " -> " << p.dst_page
        << " outside the pools (" << src.num_pages << " source pages, " << dst.num_pages
        << " destination pages)";
    dst_pages.push_back(p.dst_page);
  }
  std::sort(dst_pages.begin(), dst_pages.end());
  STRATA_CHECK(std::adjacent_find(dst_pages.begin(), dst_pages.end()) == dst_pages.end())
      << "CacheController: a job writes one destination page twice";
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    Job job{ticket, dir, std::move(pages), Clock::now()};
    (dir == CopyDirection::kHostToDevice ? load_backs_ : backups_).push_back(std::move(job));
    unfinished_.insert(ticket);
  }
  work_cv_.notify_one();
  return ticket;
}

std::vector<CacheController::Completion> CacheController::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Completion> out;
  out.swap(completed_);
  return out;
}

void CacheController::Wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  STRATA_CHECK(ticket >= 1 && ticket < next_ticket_)
      << "CacheController: Wait on unknown ticket " << ticket;
  // Still queued: run it on this thread. The caller would block on it
  // anyway, and this skips waking the controller thread, which on a busy
  // machine waits milliseconds for a core (hicache_copy_bench saw 3 ms on a
  // 32 MiB copy of 4 ms). A job the controller already runs is waited for.
  for (std::deque<Job>* queue : {&load_backs_, &backups_}) {
    auto it = std::find_if(queue->begin(), queue->end(),
                           [&](const Job& j) { return j.ticket == ticket; });
    if (it == queue->end()) continue;
    Job job = std::move(*it);
    queue->erase(it);
    lock.unlock();
    Completion c = Run(job);
    lock.lock();
    Finish(std::move(c));
    return;
  }
  done_cv_.wait(lock, [&] { return unfinished_.count(ticket) == 0; });
}

CacheController::Stats CacheController::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CacheController::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !load_backs_.empty() || !backups_.empty(); });
    if (load_backs_.empty() && backups_.empty()) return;  // stop_, and nothing left
    std::deque<Job>& queue = !load_backs_.empty() ? load_backs_ : backups_;
    Job job = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    Completion c = Run(job);
    lock.lock();
    Finish(std::move(c));
  }
}

void CacheController::Finish(Completion c) {
  ++stats_.jobs;
  if (c.status.ok()) {
    stats_.pages += c.pages;
    if (c.dir == CopyDirection::kHostToDevice) {
      stats_.bytes_h2d += c.bytes;
      stats_.seconds_h2d += c.copy_seconds;
    } else {
      stats_.bytes_d2h += c.bytes;
      stats_.seconds_d2h += c.copy_seconds;
    }
  }
  unfinished_.erase(c.ticket);
  completed_.push_back(std::move(c));
  done_cv_.notify_all();
}

CacheController::Completion CacheController::Run(Job& job) {
  const bool backup = job.dir == CopyDirection::kDeviceToHost;
  const KvPoolMemory& src = backup ? device_ : host_;
  const KvPoolMemory& dst = backup ? host_ : device_;
  // Runs of pages consecutive on both sides become one block per (group,
  // layer, tensor): a prefix's pages are often allocated in order.
  std::sort(job.pages.begin(), job.pages.end(),
            [](const PageCopy& a, const PageCopy& b) { return a.src_page < b.src_page; });
  struct PageRun {
    int32_t src, dst, len;
  };
  std::vector<PageRun> runs;
  for (const PageCopy& p : job.pages) {
    if (!runs.empty() && runs.back().src + runs.back().len == p.src_page &&
        runs.back().dst + runs.back().len == p.dst_page) {
      ++runs.back().len;
    } else {
      runs.push_back({p.src_page, p.dst_page, 1});
    }
  }
  const KvLayout& layout = *device_.layout;
  std::vector<CopyBlock> blocks;
  uint64_t bytes = 0;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const int gi = static_cast<int>(g);
    const size_t run_bytes = layout.BytesPerPagePerTensor(gi);
    const int tensors = layout.groups[g].has_v ? 2 : 1;
    for (int l = 0; l < layout.groups[g].num_layers; ++l) {
      for (int t = 0; t < tensors; ++t) {
        for (const PageRun& r : runs) {
          const size_t n = run_bytes * static_cast<size_t>(r.len);
          blocks.push_back({dst.PagePtr(gi, l, t, r.dst), src.PagePtr(gi, l, t, r.src), n});
          bytes += n;
        }
      }
    }
  }
  Completion c;
  c.ticket = job.ticket;
  c.dir = job.dir;
  c.pages = static_cast<int64_t>(job.pages.size());
  c.bytes = bytes;
  const Clock::time_point start = Clock::now();
  c.status =
      backend_.CopyBlocks(blocks, backup ? CopyKind::kDeviceToHost : CopyKind::kHostToDevice);
  const Clock::time_point end = Clock::now();
  c.copy_seconds = Seconds(end - start);
  c.total_seconds = Seconds(end - job.submitted);
  if (!c.status.ok()) {
    c.status = c.status.Annotate(std::string(backup ? "backing up " : "loading back ") +
                                 std::to_string(c.pages) + " KV pages (" + std::to_string(bytes) +
                                 " bytes)");
  }
  return c;
}

}  // namespace strata

#include "cache/hicache.h"

#include <algorithm>
#include <thread>

#include "util/logging.h"

namespace strata {

HiCache::HiCache(const HiCacheOptions& options, KvPool& device, HostKvPool& host, RadixTree& tree,
                 Backend& backend, std::unique_ptr<FileStorage> storage)
    : options_(options),
      device_(device),
      tree_(tree),
      backend_(backend),
      host_(&host),
      storage_(std::move(storage)),
      page_size_(device.page_size()) {
  controller_ = std::make_unique<CacheController>(backend_, device_.memory(), host_->memory());
  stats_.host_pages_total = host_->num_pages();
}

HiCache::~HiCache() {
  // Backups finish (their storage writes start), reads finish, writes finish:
  // what a restarted server should find is on disk before we return.
  for (int rounds = 0; busy() && rounds < 3000; ++rounds) WaitAny(std::chrono::milliseconds(10));
  controller_.reset();
}

bool HiCache::busy() const {
  return !backups_.empty() || !writes_.empty() || !reads_.empty() ||
         std::any_of(loads_.begin(), loads_.end(), [](const auto& l) { return !l.second.result; });
}

void HiCache::WaitAny(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const size_t before = backups_.size() + writes_.size() + reads_.size();
    const auto pending_loads =
        std::count_if(loads_.begin(), loads_.end(), [](const auto& l) { return !l.second.result; });
    Poll();
    const size_t after = backups_.size() + writes_.size() + reads_.size();
    const auto still =
        std::count_if(loads_.begin(), loads_.end(), [](const auto& l) { return !l.second.result; });
    if (after < before || still < pending_loads || !busy()) return;
    if (std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void HiCache::Poll() {
  for (const CacheController::Completion& c : controller_->Poll()) ApplyCopy(c);
  if (storage_)
    for (const FileStorage::Completion& c : storage_->Poll()) ApplyStorage(c);
}

void HiCache::ApplyCopy(const CacheController::Completion& c) {
  if (auto it = loads_.find(c.ticket); it != loads_.end()) {
    LoadBack& l = it->second;
    l.result = c.status;
    if (c.status.ok()) {
      stats_.load_back_tokens_host += l.tokens - l.storage_tokens;
      stats_.load_back_tokens_storage += l.storage_tokens;
      stats_.load_back_bytes += c.bytes;
      stats_.load_back_copy_seconds += c.copy_seconds;
      load_back_seconds_.push_back(c.total_seconds);
    }
    return;
  }
  auto it = backups_.find(c.ticket);
  if (it == backups_.end()) return;
  Backup b = std::move(it->second);
  backups_.erase(it);
  if (!c.status.ok()) {
    STRATA_LOG(WARN) << "HiCache backup to host failed (" << c.status.ToString()
                     << "); the prefix stays on the device only";
    tree_.AbortBackup(b.job_id);
    return;
  }
  tree_.CompleteBackup(b.job_id);
  stats_.backup_tokens_host += b.num_tokens;
  if (!storage_) return;
  // The host copy goes on to storage. Pin its pages until the write is done:
  // the tree may evict them from the host meanwhile, and they must not be
  // reused under the writer.
  for (int32_t p : b.host_pages) host_->allocator().Ref(p);
  StorageRun run{b.start_hash, b.end_hash, static_cast<int32_t>(b.host_pages.size())};
  const FileStorage::Ticket t =
      storage_->SubmitWrite(run, std::move(b.tokens), host_->memory(), b.host_pages);
  writes_[t] = StorageWrite{std::move(b.host_pages), b.num_tokens};
}

void HiCache::ApplyStorage(const FileStorage::Completion& c) {
  if (auto it = writes_.find(c.ticket); it != writes_.end()) {
    for (int32_t p : it->second.host_pages) host_->allocator().Unref(p);
    if (c.status.ok()) stats_.backup_tokens_storage += it->second.num_tokens;
    writes_.erase(it);
    return;
  }
  auto it = reads_.find(c.ticket);
  if (it == reads_.end()) return;
  it->second.result = c.status;
  AdvancePrefetch(it->second.prefetch);
}

void HiCache::AdvancePrefetch(uint64_t id) {
  auto pit = prefetches_.find(id);
  if (pit == prefetches_.end()) return;
  Prefetch& pf = pit->second;
  while (!pf.done()) {
    auto rit = reads_.find(pf.reads[pf.next]);
    STRATA_CHECK(rit != reads_.end());
    StorageRead& r = rit->second;
    if (!r.result) break;  // apply in order
    if (r.result->ok() && !pf.failed) {
      // The tree takes its own host references; a run whose path was
      // evicted meanwhile (InsertHost refuses it) is dropped, and so are the
      // runs after it.
      auto taken = tree_.InsertHost(r.tokens, r.start_tokens, r.host_pages);
      const int64_t end = taken.ok() ? taken->num_tokens : 0;
      if (end >= static_cast<int64_t>(r.tokens.size())) {
        const int64_t n = static_cast<int64_t>(r.tokens.size()) - r.start_tokens;
        pf.tokens_inserted += n;
        stats_.hit_tokens_storage += n;
      } else
        pf.failed = true;
    } else {
      pf.failed = true;
    }
    for (int32_t p : r.host_pages) host_->allocator().Unref(p);
    reads_.erase(rit);
    pf.next++;
  }
  if (pf.done() && pf.forgotten) prefetches_.erase(pit);
}

void HiCache::StartBackups(RadixNodeHandle handle) {
  for (RadixTree::BackupJob& job : tree_.StartBackup(handle)) {
    std::vector<PageCopy> pages;
    pages.reserve(job.device_pages.size());
    for (size_t i = 0; i < job.device_pages.size(); ++i)
      pages.push_back(PageCopy{job.device_pages[i], job.host_pages[i]});
    const CacheController::Ticket t =
        controller_->Submit(CopyDirection::kDeviceToHost, std::move(pages));
    Backup b;
    b.job_id = job.id;
    b.tokens = std::move(job.tokens);
    b.start_hash = job.start_hash;
    b.end_hash = job.end_hash;
    b.host_pages = std::move(job.host_pages);
    b.num_tokens = job.num_tokens;
    backups_[t] = std::move(b);
  }
}

void HiCache::OnInserted(RadixNodeHandle handle) {
  if (options_.write_policy == HiCacheWritePolicy::kWriteThrough && !handle.is_root())
    StartBackups(handle);
}

void HiCache::OnMatched(RadixNodeHandle handle) {
  if (options_.write_policy == HiCacheWritePolicy::kWriteThroughSelective && !handle.is_root())
    StartBackups(handle);
}

void HiCache::PrepareEvict(int64_t num_pages) {
  if (options_.write_policy != HiCacheWritePolicy::kWriteBack || num_pages <= 0) return;
  std::vector<CacheController::Ticket> tickets;
  for (RadixNodeHandle h : tree_.UnbackedEvictionCandidates(num_pages)) {
    const size_t before = backups_.size();
    StartBackups(h);
    if (backups_.size() == before) break;  // the host pool is full of locked pages
  }
  for (const auto& [t, b] : backups_) tickets.push_back(t);
  // The engine needs these pages for the current step: wait for the copies.
  for (CacheController::Ticket t : tickets) controller_->Wait(t);
  Poll();
}

HiCache::Ticket HiCache::StartLoadBack(std::span<const int32_t> host_pages,
                                       std::span<const int32_t> device_pages,
                                       int64_t storage_tokens) {
  STRATA_CHECK(host_pages.size() == device_pages.size())
      << "load-back of " << host_pages.size() << " host pages into " << device_pages.size()
      << " device pages";
  std::vector<PageCopy> pages;
  pages.reserve(host_pages.size());
  for (size_t i = 0; i < host_pages.size(); ++i)
    pages.push_back(PageCopy{host_pages[i], device_pages[i]});
  const CacheController::Ticket t =
      controller_->Submit(CopyDirection::kHostToDevice, std::move(pages));
  LoadBack l;
  l.tokens = static_cast<int64_t>(host_pages.size()) * page_size_;
  l.storage_tokens = std::min(storage_tokens, l.tokens);
  loads_[t] = l;
  return t;
}

std::optional<Status> HiCache::TakeLoadBack(Ticket ticket) {
  auto it = loads_.find(ticket);
  if (it == loads_.end())
    return Internal("unknown HiCache load-back ticket " + std::to_string(ticket));
  if (!it->second.result) {
    Poll();
    it = loads_.find(ticket);
    if (!it->second.result) return std::nullopt;
  }
  Status s = *it->second.result;
  loads_.erase(it);
  return s;
}

void HiCache::WaitLoadBack(Ticket ticket) {
  auto it = loads_.find(ticket);
  if (it == loads_.end() || it->second.result) return;
  controller_->Wait(ticket);
  Poll();
}

uint64_t HiCache::StartPrefetch(std::span<const int32_t> tokens, int64_t start_tokens) {
  if (!storage_) return 0;
  const int64_t ps = page_size_;
  const int64_t full = static_cast<int64_t>(tokens.size()) / ps * ps;
  if (start_tokens >= full) return 0;
  // The chained hash at the match's end, then of every page past it.
  uint64_t start_hash = RadixTree::kRootHash;
  for (int64_t pos = 0; pos < start_tokens; pos += ps)
    start_hash = RadixTree::ChainPageHash(
        start_hash, tokens.subspan(static_cast<size_t>(pos), static_cast<size_t>(ps)));
  std::vector<uint64_t> hashes;
  uint64_t h = start_hash;
  for (int64_t pos = start_tokens; pos < full; pos += ps) {
    h = RadixTree::ChainPageHash(h,
                                 tokens.subspan(static_cast<size_t>(pos), static_cast<size_t>(ps)));
    hashes.push_back(h);
  }
  std::vector<StorageRun> runs = storage_->Match(start_hash, hashes);
  if (runs.empty()) return 0;
  int64_t pages = 0;
  for (const StorageRun& r : runs) pages += r.num_pages;
  PageAllocator& alloc = host_->allocator();
  if (!alloc.CanAllocate(pages)) tree_.EvictHost(pages - alloc.num_free());
  // Take the runs that fit, in order (a later run needs the earlier ones).
  const uint64_t id = next_prefetch_++;
  Prefetch& pf = prefetches_[id];
  int64_t pos = start_tokens;
  for (const StorageRun& r : runs) {
    std::vector<int32_t> host_pages;
    if (!alloc.Allocate(r.num_pages, &host_pages).ok()) break;
    const int64_t run_tokens = int64_t{r.num_pages} * ps;
    std::vector<int32_t> expected(tokens.begin() + pos, tokens.begin() + pos + run_tokens);
    StorageRead rd;
    rd.prefetch = id;
    rd.tokens.assign(tokens.begin(), tokens.begin() + pos + run_tokens);
    rd.start_tokens = pos;
    rd.host_pages = host_pages;
    const FileStorage::Ticket t =
        storage_->SubmitRead(r, std::move(expected), host_->memory(), std::move(host_pages));
    reads_[t] = std::move(rd);
    pf.reads.push_back(t);
    pos += run_tokens;
  }
  if (pf.reads.empty()) {
    prefetches_.erase(id);
    return 0;
  }
  return id;
}

bool HiCache::PrefetchDone(uint64_t id) const {
  auto it = prefetches_.find(id);
  return it == prefetches_.end() || it->second.done();
}

int64_t HiCache::PrefetchedTokens(uint64_t id) const {
  auto it = prefetches_.find(id);
  return it == prefetches_.end() ? 0 : it->second.tokens_inserted;
}

void HiCache::ForgetPrefetch(uint64_t id) {
  // Reads still in flight keep going; their runs land in the tree for later
  // requests.
  auto it = prefetches_.find(id);
  if (it == prefetches_.end()) return;
  it->second.forgotten = true;
  if (it->second.done()) prefetches_.erase(it);
}

HiCacheStats HiCache::stats() const {
  HiCacheStats s = stats_;
  const RadixTreeStats t = tree_.stats();
  s.hit_tokens_device = t.hit_tokens;
  s.hit_tokens_host = t.host_hit_tokens - host_hits_from_storage_;
  s.evicted_tokens_device = t.evicted_pages * page_size_;
  s.evicted_tokens_host = t.host_evicted_pages * page_size_;
  s.host_pages_used = host_->allocator().num_used();
  if (storage_) {
    const FileStorage::Stats fs = storage_->stats();
    s.storage_bytes = fs.bytes;
    s.evicted_tokens_storage = fs.evicted_pages * page_size_;
    s.storage_errors_corrupt = fs.errors_corrupt;
    s.storage_errors_io = fs.errors_io;
    s.storage_errors_full = fs.errors_full;
  }
  return s;
}

std::vector<double> HiCache::TakeLoadBackSeconds() {
  std::vector<double> out;
  out.swap(load_back_seconds_);
  return out;
}

Status HiCache::CheckIntegrity() const {
  RETURN_IF_ERROR(host_->allocator().CheckIntegrity());
  for (const auto& [t, w] : writes_)
    for (int32_t p : w.host_pages)
      if (host_->allocator().refcount(p) < 1)
        return Internal("HiCache: host page " + std::to_string(p) +
                        " of a storage write in flight is free");
  for (const auto& [t, r] : reads_)
    for (int32_t p : r.host_pages)
      if (host_->allocator().refcount(p) < 1)
        return Internal("HiCache: host page " + std::to_string(p) +
                        " of a storage read in flight is free");
  return OkStatus();
}

}  // namespace strata

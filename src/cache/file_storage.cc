#include "cache/file_storage.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>

#include "cache/radix_tree.h"
#include "util/logging.h"

namespace strata {
namespace {

const char* ErrnoName(int e) {
  switch (e) {
    case ENOSPC:
      return "ENOSPC";
    case EDQUOT:
      return "EDQUOT";
    case EROFS:
      return "EROFS";
    case EACCES:
      return "EACCES";
    case EPERM:
      return "EPERM";
    case EIO:
      return "EIO";
    case ENOENT:
      return "ENOENT";
    case ENOTDIR:
      return "ENOTDIR";
    case EEXIST:
      return "EEXIST";
    case EISDIR:
      return "EISDIR";
    case EMFILE:
      return "EMFILE";
    default:
      return "errno";
  }
}
std::string ErrnoText(int e) {
  return std::string(std::strerror(e)) + " (" + ErrnoName(e) + " " + std::to_string(e) + ")";
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

// ---- FileStorage ----

class FileStorage::Impl {
 public:
  Impl(const FileStorageOptions& o, const KvLayout& layout, std::shared_ptr<StorageFileSystem> fs)
      : opts_(o), layout_(layout), fs_(std::move(fs)), dir_(o.dir + "/" + o.namespace_id) {}

  ~Impl() {
    {
      std::lock_guard l(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status Scan();
  void Start() {
    for (int i = 0; i < opts_.io_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  }
  std::vector<StorageRun> Match(uint64_t start_hash, std::span<const uint64_t> page_hashes);
  Ticket SubmitWrite(const StorageRun& run, std::vector<int32_t> tokens, KvPoolMemory host,
                     std::vector<int32_t> host_pages);
  Ticket SubmitRead(const StorageRun& run, std::vector<int32_t> expected_tokens, KvPoolMemory host,
                    std::vector<int32_t> host_pages);
  std::vector<Completion> Poll() {
    std::lock_guard l(mu_);
    return std::exchange(done_, {});
  }
  bool WaitFor(Ticket t, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock l(mu_);
    return done_cv_.wait_until(
        l, deadline, [&] { return t > 0 && t < next_ticket_ && !in_flight_.contains(t); });
  }
  Stats stats() const {
    std::lock_guard l(mu_);
    return stats_;
  }
  const std::string& dir() const { return dir_; }

 private:
  struct Key {
    uint64_t start = 0, end = 0;
    auto operator<=>(const Key&) const = default;
  };
  // kQueued → kWriting → kStored → kRemoving → erased; a failed write is
  // erased from kQueued/kWriting.
  enum class State { kQueued, kWriting, kStored, kRemoving };
  struct Entry {
    uint64_t id = 0;
    State state = State::kQueued;
    int32_t num_pages = 0;
    uint64_t bytes = 0;            // the file's size (reserved against max_bytes while writing)
    int pins = 0;                  // reads submitted and not finished: not evictable
    std::list<Key>::iterator lru;  // valid when kStored
  };
  struct Victim {
    Key key;
    uint64_t id = 0;
  };
  struct Job {
    Ticket ticket = 0;
    bool is_read = false;
    Key key;
    uint64_t entry_id = 0;
    int32_t num_pages = 0;
    std::vector<int32_t> tokens;
    KvPoolMemory host;
    std::vector<int32_t> pages;
  };

  std::string PathOf(const Key& k) const { return dir_ + "/" + StorageFileName(k.start, k.end); }
  // REQUIRES: mu_ held.
  Ticket CompleteNowLocked(bool is_read, Status s) {
    const Ticket t = next_ticket_++;
    done_.push_back({t, std::move(s), is_read, 0, 0});
    done_cv_.notify_all();
    return t;
  }
  Status CheckHostArgs(const StorageRun& run, size_t num_tokens, const KvPoolMemory& host,
                       const std::vector<int32_t>& pages) const;
  // A queued or writing entry whose write ended without a file: erased.
  // REQUIRES: mu_ held.
  void DropLocked(std::map<Key, Entry>::iterator it) {
    if (it->second.state == State::kWriting) used_bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  // A stored entry whose file is about to be removed: out of the LRU, the
  // counts and Match at once, but kept in the map (kRemoving) until the
  // caller has unlinked the file and calls EraseRemovingLocked, so that no
  // new write of the same run can be queued and renamed in between (its file
  // would be the one unlinked). REQUIRES: mu_ held, state kStored.
  Victim RetireLocked(std::map<Key, Entry>::iterator it) {
    lru_.erase(it->second.lru);
    stats_.bytes -= it->second.bytes;
    stats_.files -= 1;
    used_bytes_ -= it->second.bytes;
    it->second.state = State::kRemoving;
    return {it->first, it->second.id};
  }
  // After the unlink of retired entries. REQUIRES: mu_ held.
  void EraseRemovingLocked(const std::vector<Victim>& victims) {
    for (const Victim& v : victims) {
      auto it = entries_.find(v.key);
      if (it != entries_.end() && it->second.id == v.id) entries_.erase(it);
    }
  }
  void RemoveFiles(const std::vector<Victim>& victims) {
    int64_t failed = 0;
    for (const Victim& v : victims) {
      if (const int e = fs_->Remove(PathOf(v.key)); e != 0 && e != ENOENT) ++failed;
    }
    std::lock_guard l(mu_);
    stats_.errors_io += failed;
    EraseRemovingLocked(victims);
  }
  // Makes room for `bytes` more by retiring unpinned LRU files into
  // `victims` (the caller removes them outside the lock: RemoveFiles). False
  // when even that is not enough, and then nothing is evicted. REQUIRES: mu_ held.
  bool EvictForLocked(uint64_t bytes, std::vector<Victim>* victims);
  // Classifies a failed write or rename; stops backups on full/read-only
  // disks. Returns the completion status and, when this call disabled
  // writes, the line to log once. REQUIRES: mu_ held.
  Status OnWriteErrorLocked(int err, const std::string& what, std::string* log_line);
  void WorkerLoop();
  Completion DoWrite(Job& job);
  Completion DoRead(Job& job);

  const FileStorageOptions opts_;
  const KvLayout layout_;
  const std::shared_ptr<StorageFileSystem> fs_;
  const std::string dir_;
  std::atomic<uint64_t> temp_seq_{0};

  mutable std::mutex mu_;  // everything below
  std::condition_variable work_cv_, done_cv_;
  std::map<Key, Entry> entries_;  // ordered by (start, end): Match finds runs from a hash by range
  std::list<Key> lru_;            // stored files, least recently used first
  uint64_t used_bytes_ = 0;       // stored + being written (what max_bytes bounds)
  uint64_t next_entry_id_ = 1;
  Ticket next_ticket_ = 1;
  std::deque<Job> queue_;
  std::unordered_set<Ticket> in_flight_;
  std::vector<Completion> done_;
  Stats stats_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

Status FileStorage::Impl::Scan() {
  std::vector<std::string> names;
  if (const int e = fs_->ListDir(dir_, &names); e != 0) {
    return Status(StatusCode::kIoError, "hicache storage: cannot read directory " + dir_ + ": " +
                                            ErrnoText(e) +
                                            "; check --hicache-storage-path and its permissions");
  }
  std::sort(names.begin(), names.end());
  struct Found {
    Key key;
    int32_t num_pages;
    uint64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  const uint64_t header_bytes = StorageHeaderBytes(opts_.namespace_id, layout_);
  int64_t temps = 0, corrupt = 0, unreadable = 0;
  for (const std::string& name : names) {
    const std::string path = dir_ + "/" + name;
    // A write a crash interrupted (or garbage): never renamed, never read.
    if (EndsWith(name, ".tmp")) {
      fs_->Remove(path);
      ++temps;
      continue;
    }
    Key key;
    if (!ParseStorageFileName(name, &key.start, &key.end)) continue;  // not ours: left alone
    uint64_t size = 0;
    int64_t mtime = 0;
    if (fs_->Stat(path, &size, &mtime) != 0) continue;  // a directory or gone
    std::vector<uint8_t> head;
    if (const int e = fs_->ReadFile(path, header_bytes, &head); e != 0) {
      // Unreadable is not corrupt: left in place, not indexed, counted io.
      STRATA_LOG(WARN) << "hicache storage: cannot read " << path << ": " << ErrnoText(e)
                       << "; skipped";
      ++unreadable;
      continue;
    }
    Status bad = OkStatus();
    StatusOr<StorageFileHeader> h = ParseStorageHeader(head, opts_.namespace_id, layout_);
    if (!h.ok()) {
      bad = h.status();
    } else if (h->start_hash != key.start || h->end_hash != key.end) {
      bad = DataLoss("its header names other hashes than its file name");
    } else if (h->file_bytes != size) {
      bad = DataLoss("truncated or oversized: " + std::to_string(size) +
                     " bytes, its header says " + std::to_string(h->file_bytes));
    } else {
      found.push_back({key, h->num_pages, size, mtime});
    }
    if (!bad.ok()) {
      STRATA_LOG(DEBUG) << "hicache storage: removing " << path << ": " << bad.message();
      fs_->Remove(path);
      ++corrupt;
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
  std::vector<Victim> victims;
  {
    std::lock_guard l(mu_);
    stats_.errors_corrupt += corrupt;
    stats_.errors_io += unreadable;
    stats_.removed_temp += temps;
    for (const Found& f : found) {
      Entry& e = entries_[f.key];
      e.id = next_entry_id_++;
      e.state = State::kStored;
      e.num_pages = f.num_pages;
      e.bytes = f.bytes;
      e.lru = lru_.insert(lru_.end(), f.key);
      used_bytes_ += f.bytes;
      stats_.bytes += f.bytes;
      stats_.files += 1;
    }
    if (opts_.max_bytes > 0 && used_bytes_ > opts_.max_bytes) {  // the limit was lowered
      EvictForLocked(0, &victims);
    }
  }
  RemoveFiles(victims);
  const Stats s = stats();
  STRATA_LOG(INFO) << "hicache storage: " << dir_ << ": " << s.files << " stored runs (" << s.bytes
                   << " bytes) found"
                   << (corrupt ? "; removed " + std::to_string(corrupt) + " corrupt files" : "")
                   << (temps ? "; removed " + std::to_string(temps) + " temp files" : "")
                   << (victims.empty()
                           ? ""
                           : "; evicted " + std::to_string(victims.size()) + " past the limit");
  return OkStatus();
}

bool FileStorage::Impl::EvictForLocked(uint64_t bytes, std::vector<Victim>* victims) {
  if (opts_.max_bytes == 0) return true;
  if (bytes > opts_.max_bytes) return false;  // never fits: evict nothing for it
  if (used_bytes_ + bytes > opts_.max_bytes) {
    uint64_t evictable = 0;
    for (const Key& k : lru_) {
      const Entry& e = entries_.find(k)->second;
      if (e.pins == 0) evictable += e.bytes;
    }
    if (used_bytes_ - evictable + bytes > opts_.max_bytes)
      return false;  // pinned by reads: evict nothing
  }
  auto it = lru_.begin();
  while (used_bytes_ + bytes > opts_.max_bytes && it != lru_.end()) {
    auto e = entries_.find(*it);
    ++it;
    if (e->second.pins > 0) continue;
    stats_.evicted_pages += e->second.num_pages;
    stats_.evicted_bytes += e->second.bytes;
    victims->push_back(RetireLocked(e));
  }
  return used_bytes_ + bytes <= opts_.max_bytes;
}

std::vector<StorageRun> FileStorage::Impl::Match(uint64_t start_hash,
                                                 std::span<const uint64_t> page_hashes) {
  const size_t n = page_hashes.size();
  std::vector<StorageRun> out;
  std::lock_guard l(mu_);
  if (entries_.empty() || n == 0) return out;
  // Page positions a chain of stored runs reaches from position 0, each with
  // the run that reached it first (its start position and entry). A std::map
  // visited in order: runs only go forward, so a position is complete when
  // visited, and the cost is one lookup per reached position, however long
  // the prompt (a miss is one lookup).
  using It = std::map<Key, Entry>::iterator;
  std::map<size_t, std::pair<size_t, It>> reached;
  reached.emplace(0, std::pair<size_t, It>{0, entries_.end()});
  size_t best = 0;
  for (auto cur = reached.begin(); cur != reached.end(); ++cur) {
    const size_t pos = cur->first;
    const uint64_t h = pos == 0 ? start_hash : page_hashes[pos - 1];
    for (auto it = entries_.lower_bound(Key{h, 0}); it != entries_.end() && it->first.start == h;
         ++it) {
      if (it->second.state != State::kStored) continue;
      const size_t end = pos + static_cast<size_t>(it->second.num_pages);
      if (end > n || page_hashes[end - 1] != it->first.end) continue;
      reached.try_emplace(end, pos, it);
      best = std::max(best, end);
    }
  }
  for (size_t pos = best; pos > 0;) {
    const auto& [from, it] = reached.at(pos);
    out.push_back({it->first.start, it->first.end, it->second.num_pages});
    lru_.splice(lru_.end(), lru_, it->second.lru);  // touch
    pos = from;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

Status FileStorage::Impl::CheckHostArgs(const StorageRun& run, size_t num_tokens,
                                        const KvPoolMemory& host,
                                        const std::vector<int32_t>& pages) const {
  if (run.num_pages < 1 || run.num_pages > kMaxStoragePagesPerFile) {
    return InvalidArgument("storage run of " + std::to_string(run.num_pages) + " pages (1.." +
                           std::to_string(kMaxStoragePagesPerFile) + ")");
  }
  if (num_tokens != static_cast<size_t>(run.num_pages) * layout_.page_size ||
      pages.size() != static_cast<size_t>(run.num_pages)) {
    return InvalidArgument("storage run of " + std::to_string(run.num_pages) + " pages given " +
                           std::to_string(num_tokens) + " tokens and " +
                           std::to_string(pages.size()) + " host pages (page size " +
                           std::to_string(layout_.page_size) + ")");
  }
  bool same_layout = host.layout != nullptr && host.layout->page_size == layout_.page_size &&
                     host.layout->groups.size() == layout_.groups.size() &&
                     host.group_base.size() == layout_.groups.size();
  for (size_t g = 0; same_layout && g < layout_.groups.size(); ++g) {
    const PoolGroupSpec& a = host.layout->groups[g];
    const PoolGroupSpec& b = layout_.groups[g];
    same_layout = a.num_layers == b.num_layers && a.has_v == b.has_v &&
                  host.layout->BytesPerPagePerTensor(static_cast<int>(g)) ==
                      layout_.BytesPerPagePerTensor(static_cast<int>(g));
  }
  if (!same_layout)
    return InvalidArgument("host pool layout differs from the storage tier's layout");
  for (int32_t p : pages) {
    if (p < 0 || p >= host.num_pages) {
      return InvalidArgument("host page " + std::to_string(p) + " outside the host pool of " +
                             std::to_string(host.num_pages) + " pages");
    }
  }
  return OkStatus();
}

FileStorage::Ticket FileStorage::Impl::SubmitWrite(const StorageRun& run,
                                                   std::vector<int32_t> tokens, KvPoolMemory host,
                                                   std::vector<int32_t> host_pages) {
  Status args = CheckHostArgs(run, tokens.size(), host, host_pages);
  std::lock_guard l(mu_);
  if (!args.ok()) return CompleteNowLocked(false, std::move(args));
  const Key key{run.start_hash, run.end_hash};
  if (stats_.writes_disabled || entries_.contains(key)) return CompleteNowLocked(false, OkStatus());
  Entry& e = entries_[key];
  e.id = next_entry_id_++;
  e.state = State::kQueued;
  e.num_pages = run.num_pages;
  const Ticket t = next_ticket_++;
  in_flight_.insert(t);
  queue_.push_back({t, false, key, e.id, run.num_pages, std::move(tokens), std::move(host),
                    std::move(host_pages)});
  work_cv_.notify_one();
  return t;
}

FileStorage::Ticket FileStorage::Impl::SubmitRead(const StorageRun& run,
                                                  std::vector<int32_t> expected_tokens,
                                                  KvPoolMemory host,
                                                  std::vector<int32_t> host_pages) {
  Status args = CheckHostArgs(run, expected_tokens.size(), host, host_pages);
  std::lock_guard l(mu_);
  if (!args.ok()) return CompleteNowLocked(true, std::move(args));
  const Key key{run.start_hash, run.end_hash};
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.state != State::kStored ||
      it->second.num_pages != run.num_pages) {
    return CompleteNowLocked(true, NotFound("storage run " + StorageFileName(key.start, key.end) +
                                            " is not stored (evicted since Match?)"));
  }
  it->second.pins += 1;
  const Ticket t = next_ticket_++;
  in_flight_.insert(t);
  queue_.push_back({t, true, key, it->second.id, run.num_pages, std::move(expected_tokens),
                    std::move(host), std::move(host_pages)});
  work_cv_.notify_one();
  return t;
}

void FileStorage::Impl::WorkerLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock l(mu_);
      work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained: the destructor finishes queued work
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto t0 = std::chrono::steady_clock::now();
    Completion c = job.is_read ? DoRead(job) : DoWrite(job);
    c.ticket = job.ticket;
    c.is_read = job.is_read;
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard l(mu_);
      in_flight_.erase(job.ticket);
      done_.push_back(std::move(c));
    }
    done_cv_.notify_all();
  }
}

Status FileStorage::Impl::OnWriteErrorLocked(int err, const std::string& what,
                                             std::string* log_line) {
  const std::string text = "hicache storage: " + what + ": " + ErrnoText(err);
  const bool full = err == ENOSPC || err == EDQUOT;
  const bool read_only = err == EROFS || err == EACCES || err == EPERM;
  if (full) {
    stats_.errors_full += 1;
  } else {
    stats_.errors_io += 1;
  }
  if ((full || read_only) && !stats_.writes_disabled) {
    stats_.writes_disabled = true;
    stats_.writes_disabled_reason =
        text +
        (full ? "; backups to storage are off until restart (free space or raise the quota of "
                "--hicache-storage-path, or lower --hicache-storage-max-gb)"
              : "; backups to storage are off until restart (make --hicache-storage-path "
                "writable)") +
        "; reads from storage go on";
    *log_line = stats_.writes_disabled_reason;
  }
  if (full) return ResourceExhausted(text);
  return Status(StatusCode::kIoError, text);
}

FileStorage::Completion FileStorage::Impl::DoWrite(Job& job) {
  Completion c;
  const uint64_t file_bytes = StorageFileBytes(opts_.namespace_id, layout_, job.num_pages);
  // The tokens must be the run's: a file is trusted by its hashes at Match.
  uint64_t h = job.key.start;
  const size_t ps = static_cast<size_t>(layout_.page_size);
  for (size_t p = 0; p < static_cast<size_t>(job.num_pages); ++p) {
    h = RadixTree::ChainPageHash(h, std::span<const int32_t>(job.tokens).subspan(p * ps, ps));
  }
  std::vector<Victim> victims;
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    if (h != job.key.end) {
      DropLocked(it);
      c.status = InvalidArgument("storage write: the tokens do not hash to the run's end hash " +
                                 StorageFileName(job.key.start, job.key.end));
      return c;
    }
    if (stats_.writes_disabled) {  // disabled while this write was queued
      DropLocked(it);
      return c;
    }
    if (!EvictForLocked(file_bytes, &victims)) {
      DropLocked(it);
      stats_.skipped_capacity += 1;
      return c;  // larger than max_bytes, or the rest is being read: skipped
    }
    it->second.state = State::kWriting;
    it->second.bytes = file_bytes;
    used_bytes_ += file_bytes;
  }
  RemoveFiles(victims);
  // Header and tokens, then the payload straight from the host pages.
  const std::vector<uint8_t> head = EncodeStorageHeaderAndTokens(
      opts_.namespace_id, layout_, {job.key.start, job.key.end, job.num_pages}, job.tokens);
  std::vector<std::span<const uint8_t>> pieces;
  pieces.push_back(head);
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const PoolGroupSpec& s = layout_.groups[g];
    const size_t bytes = layout_.BytesPerPagePerTensor(static_cast<int>(g));
    for (int layer = 0; layer < s.num_layers; ++layer) {
      for (int tensor = 0; tensor < (s.has_v ? 2 : 1); ++tensor) {
        for (int32_t page : job.pages) {
          pieces.emplace_back(reinterpret_cast<const uint8_t*>(
                                  job.host.PagePtr(static_cast<int>(g), layer, tensor, page)),
                              bytes);
        }
      }
    }
  }
  StorageChecksum sum;
  for (auto p : pieces) sum.Update(p);
  const std::vector<uint8_t> trailer = EncodeStorageTrailer(sum.Final());
  pieces.push_back(trailer);

  // Atomic: the final name appears only by rename of a complete file. No
  // fsync (see hicache.md, "Storage tier": a crash costs misses, never trust).
  const std::string path = PathOf(job.key);
  const std::string tmp =
      path + "." + std::to_string(::getpid()) + "." + std::to_string(temp_seq_++) + ".tmp";
  int err = fs_->WriteNewFile(tmp, pieces);
  std::string what = "writing " + tmp;
  if (err == 0) {
    err = fs_->Rename(tmp, path);
    what = "renaming " + tmp + " to " + path;
  }
  std::string log_line;
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    if (err != 0) {
      DropLocked(it);
      c.status = OnWriteErrorLocked(err, what, &log_line);
    } else {
      it->second.state = State::kStored;
      it->second.lru = lru_.insert(lru_.end(), job.key);
      stats_.bytes += file_bytes;
      stats_.files += 1;
      stats_.written_pages += job.num_pages;
      c.bytes = file_bytes;
    }
  }
  if (err != 0) fs_->Remove(tmp);
  if (!log_line.empty()) STRATA_LOG(WARN) << log_line;
  return c;
}

FileStorage::Completion FileStorage::Impl::DoRead(Job& job) {
  Completion c;
  const std::string path = PathOf(job.key);
  const uint64_t file_bytes = StorageFileBytes(opts_.namespace_id, layout_, job.num_pages);
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    if (it == entries_.end() || it->second.id != job.entry_id ||
        it->second.state != State::kStored) {  // removed by another read
      c.status = NotFound("storage run " + path + " was removed");
      return c;
    }
  }
  std::vector<uint8_t> buf;
  const int err = fs_->ReadFile(path, file_bytes + 1, &buf);  // +1: a longer file is caught too
  Status s = OkStatus();
  if (err != 0) {
    s = Status(StatusCode::kIoError, "hicache storage: reading " + path + ": " + ErrnoText(err));
  } else {
    StatusOr<StorageFileView> v = ParseStorageFile(buf, opts_.namespace_id, layout_);
    if (!v.ok()) {
      s = v.status();
    } else if (v->header.start_hash != job.key.start || v->header.end_hash != job.key.end ||
               v->header.num_pages != job.num_pages) {
      s = DataLoss("its header names another run");
    } else if (v->tokens != job.tokens) {
      s = DataLoss("its tokens differ from the prompt's (a 64-bit hash collision or a stale file)");
    } else {
      // Verified whole: only now do host pages change.
      size_t off = 0;
      for (size_t g = 0; g < layout_.groups.size(); ++g) {
        const PoolGroupSpec& spec = layout_.groups[g];
        const size_t bytes = layout_.BytesPerPagePerTensor(static_cast<int>(g));
        for (int layer = 0; layer < spec.num_layers; ++layer) {
          for (int tensor = 0; tensor < (spec.has_v ? 2 : 1); ++tensor) {
            for (int32_t page : job.pages) {
              std::memcpy(job.host.PagePtr(static_cast<int>(g), layer, tensor, page),
                          v->payload.data() + off, bytes);
              off += bytes;
            }
          }
        }
      }
      fs_->Touch(path);  // the LRU order a restart reads; failure only costs that
    }
    if (!s.ok()) {
      s = DataLoss("hicache storage: " + path + ": " + s.message() + "; removed (a miss)");
    }
  }
  std::vector<Victim> retired;
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    const bool ours =
        it != entries_.end() && it->second.id == job.entry_id && it->second.state == State::kStored;
    if (ours) it->second.pins -= 1;
    if (s.ok()) {
      if (ours) lru_.splice(lru_.end(), lru_, it->second.lru);  // touch
      stats_.read_pages += job.num_pages;
      c.bytes = buf.size();
    } else {
      if (s.code() == StatusCode::kDataLoss) {
        stats_.errors_corrupt += 1;
      } else {
        stats_.errors_io += 1;
      }
      if (ours) retired.push_back(RetireLocked(it));
    }
  }
  if (!retired.empty()) RemoveFiles(retired);
  if (!s.ok()) STRATA_LOG(DEBUG) << s.message();
  c.status = std::move(s);
  return c;
}

// ---- Public wrappers ----

StatusOr<std::unique_ptr<FileStorage>> FileStorage::Open(const FileStorageOptions& options,
                                                         const KvLayout& layout) {
  return Open(options, layout, PosixStorageFileSystem());
}

StatusOr<std::unique_ptr<FileStorage>> FileStorage::Open(const FileStorageOptions& options,
                                                         const KvLayout& layout,
                                                         std::shared_ptr<StorageFileSystem> fs) {
  if (options.dir.empty()) {
    return InvalidArgument(
        "--hicache-storage-path is empty: give the directory for the file storage tier");
  }
  const std::string& ns = options.namespace_id;
  const bool ns_ok = !ns.empty() && ns.size() <= kMaxStorageNamespaceBytes && ns != "." && ns != ".." &&
                     std::all_of(ns.begin(), ns.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
                     });
  if (!ns_ok) {
    return InvalidArgument("hicache storage namespace '" + ns +
                           "' must be 1-128 characters of [A-Za-z0-9._-] (it names a directory)");
  }
  if (options.io_threads < 1) {
    return InvalidArgument("hicache storage needs at least 1 I/O thread, got " +
                           std::to_string(options.io_threads));
  }
  RETURN_IF_ERROR(layout.Validate().Annotate("hicache storage layout"));
  // mkdir -p of dir, then dir/<namespace>.
  std::string prefix;
  const std::string full = options.dir + "/" + ns;
  for (size_t pos = 0; pos != std::string::npos;) {
    const size_t next = full.find('/', pos + 1);
    prefix = full.substr(0, next);
    pos = next;
    if (prefix.empty() || prefix == "/" || prefix.back() == '/') continue;
    if (const int e = fs->MakeDir(prefix); e != 0) {
      return Status(
          StatusCode::kIoError,
          "hicache storage: cannot create directory " + full +
              (prefix == full ? "" : " (at " + prefix + ")") + ": " + ErrnoText(e) +
              "; give --hicache-storage-path a directory this process can create and write");
    }
  }
  auto impl = std::make_unique<Impl>(options, layout, std::move(fs));
  RETURN_IF_ERROR(impl->Scan());
  impl->Start();
  return std::unique_ptr<FileStorage>(new FileStorage(std::move(impl)));
}

FileStorage::FileStorage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FileStorage::~FileStorage() = default;

std::vector<StorageRun> FileStorage::Match(uint64_t start_hash,
                                           std::span<const uint64_t> page_hashes) {
  return impl_->Match(start_hash, page_hashes);
}
FileStorage::Ticket FileStorage::SubmitWrite(const StorageRun& run, std::vector<int32_t> tokens,
                                             KvPoolMemory host, std::vector<int32_t> host_pages) {
  return impl_->SubmitWrite(run, std::move(tokens), std::move(host), std::move(host_pages));
}
FileStorage::Ticket FileStorage::SubmitRead(const StorageRun& run,
                                            std::vector<int32_t> expected_tokens, KvPoolMemory host,
                                            std::vector<int32_t> host_pages) {
  return impl_->SubmitRead(run, std::move(expected_tokens), std::move(host), std::move(host_pages));
}
std::vector<FileStorage::Completion> FileStorage::Poll() { return impl_->Poll(); }
bool FileStorage::WaitFor(Ticket t, std::chrono::steady_clock::time_point deadline) {
  return impl_->WaitFor(t, deadline);
}
FileStorage::Stats FileStorage::stats() const { return impl_->stats(); }
const std::string& FileStorage::path() const { return impl_->dir(); }

}  // namespace strata

#include "cache/radix_tree.h"

#include <algorithm>
#include <string>

#include "util/logging.h"

namespace strata {
namespace {

uint64_t Mix64(uint64_t z) {  // splitmix64 finalizer: a bijection on 64 bits
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string Str(int64_t v) { return std::to_string(v); }
std::string Str(uint64_t v) { return std::to_string(v); }

void EraseOne(std::vector<int32_t>& v, int32_t x) {
  auto it = std::find(v.begin(), v.end(), x);
  STRATA_CHECK(it != v.end()) << "radix backup job does not list node " << x;
  v.erase(it);
}

}  // namespace

uint64_t RadixTree::ChainPageHash(uint64_t parent_hash, std::span<const int32_t> page_tokens) {
  uint64_t h = parent_hash;
  for (int32_t t : page_tokens) {
    h = Mix64((h ^ uint64_t{static_cast<uint32_t>(t)}) + 0x9e3779b97f4a7c15ull);
  }
  return h;
}

bool RadixTree::PageKeyLess::operator()(std::span<const int32_t> a,
                                        std::span<const int32_t> b) const {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
}

RadixTree::RadixTree(const RadixTreeConfig& config, PageAllocator* device, PageAllocator* host)
    : page_size_(config.page_size), allocator_(device), host_(host) {
  STRATA_CHECK(page_size_ >= 1) << "radix tree page_size " << page_size_;
  STRATA_CHECK(allocator_ != nullptr);
  STRATA_CHECK(host_ != allocator_) << "radix tree: the host tier needs its own page allocator";
  nodes_.emplace_back();
  nodes_[kRoot].alive = true;
  in_tree_.assign(static_cast<size_t>(allocator_->num_pages()), 0);
  if (host_) in_host_tree_.assign(static_cast<size_t>(host_->num_pages()), 0);
}

RadixTree::~RadixTree() {
  for (const Node& n : nodes_) {
    if (!n.alive) continue;
    for (int32_t p : n.device_pages) allocator_->Unref(p);
    for (int32_t p : n.host_pages) host_->Unref(p);
  }
  for (const auto& [id, job] : jobs_) {
    for (int32_t p : job.detached_host_pages) host_->Unref(p);
  }
}

void RadixTree::CheckHandle(RadixNodeHandle h) const {
  STRATA_CHECK(h.node >= 0 && static_cast<size_t>(h.node) < nodes_.size() && node(h.node).alive &&
               node(h.node).generation == h.generation)
      << "stale or foreign radix tree handle (node " << h.node << ", generation " << h.generation
      << "): it was evicted; lock a handle before the next Insert or Evict";
}

uint64_t RadixTree::EndHash(int32_t id) const {
  const Node& n = node(id);
  return n.page_hashes.empty() ? kRootHash : n.page_hashes.back();
}

bool RadixTree::IsDeviceLeaf(int32_t id) const {
  const Node& n = node(id);
  return id != kRoot && n.alive && n.lock_ref == 0 && n.on_device() && n.device_children == 0 &&
         n.backup_job == 0;
}

bool RadixTree::IsHostLeaf(int32_t id) const {
  const Node& n = node(id);
  return id != kRoot && n.alive && n.lock_ref == 0 && n.host_valid() && n.host_children == 0;
}

bool RadixTree::ParentHostValid(int32_t id) const {
  const int32_t parent = node(id).parent;
  return parent == kRoot || node(parent).host_valid();
}

int64_t RadixTree::MatchPages(int32_t id, std::span<const int32_t> tokens) const {
  const Node& n = node(id);
  const int64_t max_pages =
      std::min(n.num_pages(), static_cast<int64_t>(tokens.size()) / page_size_);
  const size_t ps = static_cast<size_t>(page_size_);
  int64_t m = 0;
  while (m < max_pages) {
    const size_t off = static_cast<size_t>(m) * ps;
    if (!std::equal(n.tokens.begin() + static_cast<ptrdiff_t>(off),
                    n.tokens.begin() + static_cast<ptrdiff_t>(off + ps),
                    tokens.begin() + static_cast<ptrdiff_t>(off))) {
      break;
    }
    ++m;
  }
  return m;
}

void RadixTree::Relist(int32_t id) {
  if (id == kRoot) return;
  const EvictKey key{node(id).last_access, id};
  evictable_.erase(key);
  host_evictable_.erase(key);
  if (IsDeviceLeaf(id)) evictable_.insert(key);
  if (IsHostLeaf(id)) host_evictable_.insert(key);
}

void RadixTree::Unaccount(int32_t id) {
  if (id == kRoot) return;
  Node& n = node(id);
  const EvictKey key{n.last_access, id};
  evictable_.erase(key);
  host_evictable_.erase(key);
  const int64_t np = n.num_pages();
  if (n.on_device()) (n.lock_ref > 0 ? locked_pages_ : evictable_pages_) -= np;
  if (n.has_host_pages()) host_pages_ -= np;
  if (n.backup_job != 0) pending_pages_ -= np;
  if (!n.on_device() && n.has_host_pages()) host_only_pages_ -= np;
  Node& parent = node(n.parent);
  parent.device_children -= n.on_device() ? 1 : 0;
  parent.host_children -= n.has_host_pages() ? 1 : 0;
}

void RadixTree::Account(int32_t id) {
  if (id == kRoot) return;
  Node& n = node(id);
  const int64_t np = n.num_pages();
  if (n.on_device()) (n.lock_ref > 0 ? locked_pages_ : evictable_pages_) += np;
  if (n.has_host_pages()) host_pages_ += np;
  if (n.backup_job != 0) pending_pages_ += np;
  if (!n.on_device() && n.has_host_pages()) host_only_pages_ += np;
  // A locked node may gain tiers (a load-back, a finished backup), never lose one.
  n.locked_tiers = n.lock_ref > 0 ? static_cast<uint8_t>(n.locked_tiers | n.tiers()) : 0;
  Node& parent = node(n.parent);
  parent.device_children += n.on_device() ? 1 : 0;
  parent.host_children += n.has_host_pages() ? 1 : 0;
  Relist(id);
  Relist(n.parent);
}

void RadixTree::Touch(int32_t id, uint64_t now) {
  if (id == kRoot) return;
  const EvictKey key{node(id).last_access, id};
  evictable_.erase(key);
  host_evictable_.erase(key);
  node(id).last_access = now;
  Relist(id);
}

int32_t RadixTree::NewNode() {
  int32_t id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = node(id);
  n.alive = true;
  ++num_nodes_;
  return id;
}

void RadixTree::FreeNode(int32_t id) {
  Node& n = node(id);
  const uint32_t generation = n.generation + 1;
  n = Node();
  n.generation = generation;
  free_nodes_.push_back(id);
  --num_nodes_;
}

void RadixTree::RemoveLeaf(int32_t id, const std::vector<int32_t>& key) {
  const int32_t parent = node(id).parent;
  STRATA_CHECK(node(id).children.empty()) << "radix node " << id << " removed with children";
  node(parent).children.erase(key);
  FreeNode(id);
  Relist(parent);
}

int32_t RadixTree::Split(int32_t id, int64_t upper_pages) {
  const int32_t up = NewNode();  // may reallocate nodes_: take references after
  Unaccount(id);
  Node& lower = node(id);
  Node& upper = node(up);
  STRATA_CHECK(upper_pages > 0 && upper_pages < lower.num_pages());
  const auto upper_tokens = static_cast<ptrdiff_t>(upper_pages * page_size_);
  const auto up_pages = static_cast<ptrdiff_t>(upper_pages);
  auto move_front = [up_pages](std::vector<int32_t>& from, std::vector<int32_t>& to) {
    if (from.empty()) return;
    to.assign(from.begin(), from.begin() + up_pages);
    from.erase(from.begin(), from.begin() + up_pages);
  };

  upper.parent = lower.parent;
  upper.tokens.assign(lower.tokens.begin(), lower.tokens.begin() + upper_tokens);
  lower.tokens.erase(lower.tokens.begin(), lower.tokens.begin() + upper_tokens);
  move_front(lower.device_pages, upper.device_pages);
  move_front(lower.host_pages, upper.host_pages);
  upper.page_hashes.assign(lower.page_hashes.begin(), lower.page_hashes.begin() + up_pages);
  lower.page_hashes.erase(lower.page_hashes.begin(), lower.page_hashes.begin() + up_pages);
  // Both halves belong to an in-flight backup: the job names them, not a node.
  upper.backup_job = lower.backup_job;
  if (upper.backup_job != 0) jobs_.at(upper.backup_job).nodes.push_back(up);
  upper.lock_ref = lower.lock_ref;  // every lock below lower is below upper too
  upper.locked_tiers = lower.locked_tiers;
  upper.last_access = lower.last_access;
  upper.hit_count = lower.hit_count;
  lower.parent = up;

  // The parent's key for this subtree (its first page) is unchanged.
  auto it = node(upper.parent)
                .children.find(
                    std::span<const int32_t>(upper.tokens.data(), static_cast<size_t>(page_size_)));
  STRATA_CHECK(it != node(upper.parent).children.end() && it->second == id);
  it->second = up;
  upper.children.emplace(
      std::vector<int32_t>(lower.tokens.begin(), lower.tokens.begin() + page_size_), id);
  Account(up);
  Account(id);  // after up: it counts in up's child tiers and relists up
  return up;
}

void RadixTree::AttachDevicePages(int32_t id, std::span<const int32_t> pages) {
  Unaccount(id);
  Node& n = node(id);
  STRATA_CHECK(!n.on_device() && static_cast<int64_t>(pages.size()) == n.num_pages());
  for (int32_t p : pages) {
    STRATA_CHECK(p >= 0 && p < allocator_->num_pages())
        << "radix Insert of page " << p << " outside [0, " << allocator_->num_pages() << ")";
    STRATA_CHECK(!in_tree_[static_cast<size_t>(p)])
        << "radix Insert of page " << p << " that the tree already stores for other tokens";
    allocator_->Ref(p);
    in_tree_[static_cast<size_t>(p)] = 1;
  }
  n.device_pages.assign(pages.begin(), pages.end());
  inserted_pages_ += n.num_pages();
  Account(id);
}

void RadixTree::AttachHostPages(int32_t id, std::span<const int32_t> pages) {
  Unaccount(id);
  Node& n = node(id);
  STRATA_CHECK(!n.has_host_pages() && static_cast<int64_t>(pages.size()) == n.num_pages());
  for (int32_t p : pages) {
    STRATA_CHECK(p >= 0 && p < host_->num_pages())
        << "radix InsertHost of host page " << p << " outside [0, " << host_->num_pages() << ")";
    STRATA_CHECK(!in_host_tree_[static_cast<size_t>(p)])
        << "radix InsertHost of host page " << p << " that the tree already stores";
    host_->Ref(p);
    in_host_tree_[static_cast<size_t>(p)] = 1;
  }
  n.host_pages.assign(pages.begin(), pages.end());
  host_inserted_pages_ += n.num_pages();
  Account(id);
}

RadixTree::MatchResult RadixTree::MatchPrefix(std::span<const int32_t> tokens) {
  const uint64_t now = ++clock_;
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t limit = tokens.size() / ps * ps;
  MatchResult result;
  int32_t cur = kRoot;
  size_t pos = 0;
  bool on_host = false;  // past the device-resident part (device closure: no way back)
  while (pos < limit) {
    const auto& children = node(cur).children;
    auto it = children.find(tokens.subspan(pos, ps));
    if (it == children.end()) break;
    int32_t child = it->second;
    const bool device = node(child).on_device();
    if (device ? on_host : !node(child).host_valid()) break;
    const int64_t m = MatchPages(child, tokens.subspan(pos));
    const bool partial = m < node(child).num_pages();
    if (partial) child = Split(child, m);
    Node& c = node(child);
    if (device) {
      result.pages.insert(result.pages.end(), c.device_pages.begin(), c.device_pages.end());
      result.handle = HandleOf(child);
    } else {
      on_host = true;
      result.host_pages.insert(result.host_pages.end(), c.host_pages.begin(), c.host_pages.end());
    }
    ++c.hit_count;
    Touch(child, now);
    pos += static_cast<size_t>(m) * ps;
    cur = child;
    if (partial) break;
  }
  result.num_tokens = static_cast<int64_t>(result.pages.size() * ps);
  result.host_tokens = static_cast<int64_t>(pos) - result.num_tokens;
  result.host_handle = HandleOf(cur);
  hit_tokens_ += result.num_tokens;
  host_hit_tokens_ += result.host_tokens;
  miss_tokens_ += static_cast<int64_t>(tokens.size()) - static_cast<int64_t>(pos);
  return result;
}

RadixTree::PrefixLengths RadixTree::PeekPrefixLengths(std::span<const int32_t> tokens) const {
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t limit = tokens.size() / ps * ps;
  PrefixLengths out;
  int32_t cur = kRoot;
  size_t pos = 0;
  bool on_host = false;
  while (pos < limit) {
    const auto& children = node(cur).children;
    auto it = children.find(tokens.subspan(pos, ps));
    if (it == children.end()) break;
    const Node& c = node(it->second);
    const bool device = c.on_device();
    if (device ? on_host : !c.host_valid()) break;
    on_host = !device;
    const int64_t m = MatchPages(it->second, tokens.subspan(pos));
    (device ? out.device_tokens : out.host_tokens) += m * page_size_;
    pos += static_cast<size_t>(m) * ps;
    if (m < c.num_pages()) break;
    cur = it->second;
  }
  return out;
}

int64_t RadixTree::PeekPrefixLength(std::span<const int32_t> tokens) const {
  return PeekPrefixLengths(tokens).device_tokens;
}

void RadixTree::Lock(RadixNodeHandle handle) {
  CheckHandle(handle);
  if (handle.is_root()) return;
  ++node(handle.node).self_locks;
  for (int32_t id = handle.node; id != kRoot; id = node(id).parent) {
    if (node(id).lock_ref > 0) {
      ++node(id).lock_ref;
      continue;
    }
    Unaccount(id);
    ++node(id).lock_ref;
    Account(id);
  }
}

void RadixTree::Unlock(RadixNodeHandle handle) {
  CheckHandle(handle);
  if (handle.is_root()) return;
  STRATA_CHECK(node(handle.node).self_locks > 0)
      << "Unlock of radix node " << handle.node << " that holds no lock (unbalanced Lock/Unlock)";
  --node(handle.node).self_locks;
  for (int32_t id = handle.node; id != kRoot; id = node(id).parent) {
    STRATA_CHECK(node(id).lock_ref > 0) << "radix node " << id << " lock_ref underflow";
    if (node(id).lock_ref > 1) {
      --node(id).lock_ref;
      continue;
    }
    Unaccount(id);
    --node(id).lock_ref;
    Account(id);
  }
}

RadixTree::InsertResult RadixTree::Insert(std::span<const int32_t> tokens,
                                          std::span<const int32_t> pages) {
  const uint64_t now = ++clock_;
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t num_pages = tokens.size() / ps;
  STRATA_CHECK(pages.size() >= num_pages)
      << "radix Insert of " << tokens.size() << " tokens (" << num_pages
      << " whole pages) with only " << pages.size() << " page ids";
  const size_t limit = num_pages * ps;

  int32_t cur = kRoot;
  size_t pos = 0;           // tokens
  int64_t taken_from = -1;  // first token whose page the tree took
  while (pos < limit) {
    const auto& children = node(cur).children;
    auto it = children.find(tokens.subspan(pos, ps));
    if (it == children.end()) break;
    int32_t child = it->second;
    const int64_t m = MatchPages(child, tokens.subspan(pos, limit - pos));
    if (m < node(child).num_pages()) child = Split(child, m);
    if (!node(child).on_device()) {
      // Host-only: the caller's pages hold these tokens now (a load-back).
      // Device closure: cur is on the device already, so the match stays a
      // prefix.
      AttachDevicePages(child, pages.subspan(pos / ps, static_cast<size_t>(m)));
      if (taken_from < 0) taken_from = static_cast<int64_t>(pos);
    }
    Touch(child, now);
    pos += static_cast<size_t>(m) * ps;
    cur = child;
  }

  InsertResult result;
  result.num_cached_tokens = taken_from < 0 ? static_cast<int64_t>(pos) : taken_from;
  if (pos < limit) {
    const uint64_t parent_hash = EndHash(cur);
    const int32_t leaf = NewNode();  // may reallocate nodes_
    Node& n = node(leaf);
    n.parent = cur;
    n.tokens.assign(tokens.begin() + static_cast<ptrdiff_t>(pos),
                    tokens.begin() + static_cast<ptrdiff_t>(limit));
    n.page_hashes.reserve(num_pages - pos / ps);
    uint64_t h = parent_hash;
    for (size_t i = 0; i < num_pages - pos / ps; ++i) {
      h = ChainPageHash(h, std::span<const int32_t>(n.tokens).subspan(i * ps, ps));
      n.page_hashes.push_back(h);
    }
    n.last_access = now;
    node(cur).children.emplace(
        std::vector<int32_t>(n.tokens.begin(), n.tokens.begin() + page_size_), leaf);
    Account(leaf);  // an empty node: counts nothing yet
    AttachDevicePages(leaf, pages.subspan(pos / ps, num_pages - pos / ps));
    cur = leaf;
  }
  result.num_inserted_tokens = static_cast<int64_t>(limit) - result.num_cached_tokens;
  result.handle = HandleOf(cur);
  return result;
}

int64_t RadixTree::ReplaceDevicePages(
    std::span<const int32_t> tokens, std::span<const int32_t> pages,
    const std::function<bool(int32_t tree_page, int32_t page)>& replace) {
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t num_pages = tokens.size() / ps;
  STRATA_CHECK(pages.size() >= num_pages)
      << "radix ReplaceDevicePages of " << tokens.size() << " tokens with only " << pages.size()
      << " page ids";
  const size_t limit = num_pages * ps;
  int64_t swapped = 0;
  int32_t cur = kRoot;
  size_t pos = 0;
  while (pos < limit) {
    const auto& children = node(cur).children;
    auto it = children.find(tokens.subspan(pos, ps));
    if (it == children.end()) break;
    const int32_t child = it->second;
    const int64_t m = MatchPages(child, tokens.subspan(pos, limit - pos));
    if (!node(child).on_device()) break;  // the device path ends here
    if (node(child).backup_job == 0) {
      bool changed = false;
      for (int64_t i = 0; i < m; ++i) {
        const int32_t old = node(child).device_pages[static_cast<size_t>(i)];
        const int32_t fresh = pages[pos / ps + static_cast<size_t>(i)];
        if (old == fresh || in_tree_[static_cast<size_t>(fresh)] || !replace(old, fresh)) continue;
        if (!changed) Unaccount(child);
        changed = true;
        STRATA_CHECK(allocator_->refcount(fresh) > 0) << "radix ReplaceDevicePages of free page " << fresh;
        allocator_->Ref(fresh);
        in_tree_[static_cast<size_t>(fresh)] = 1;
        in_tree_[static_cast<size_t>(old)] = 0;
        allocator_->Unref(old);
        node(child).device_pages[static_cast<size_t>(i)] = fresh;
        ++swapped;
      }
      if (changed) Account(child);
    }
    if (m < node(child).num_pages()) break;
    pos += static_cast<size_t>(m) * ps;
    cur = child;
  }
  return swapped;
}

StatusOr<RadixTree::InsertHostResult> RadixTree::InsertHost(std::span<const int32_t> tokens,
                                                            int64_t start_tokens,
                                                            std::span<const int32_t> host_pages) {
  STRATA_CHECK(host_ != nullptr) << "radix InsertHost on a tree without a host tier";
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t limit = tokens.size() / ps * ps;
  STRATA_CHECK(start_tokens >= 0 && start_tokens % page_size_ == 0 &&
               static_cast<size_t>(start_tokens) <= tokens.size())
      << "radix InsertHost from token " << start_tokens << " of " << tokens.size()
      << " (must be a page boundary inside the tokens)";
  const size_t start = static_cast<size_t>(start_tokens);
  STRATA_CHECK(host_pages.size() >= (limit - std::min(limit, start)) / ps)
      << "radix InsertHost of tokens [" << start << ", " << limit << ") with only "
      << host_pages.size() << " host page ids";

  // The prefix must be host-resident (valid) all the way: check before
  // changing anything.
  {
    int32_t cur = kRoot;
    size_t pos = 0;
    while (pos < start) {
      auto it = node(cur).children.find(tokens.subspan(pos, ps));
      if (it == node(cur).children.end() || !node(it->second).host_valid()) break;
      const int64_t m = MatchPages(it->second, tokens.subspan(pos, start - pos));
      pos += static_cast<size_t>(m) * ps;
      if (m < node(it->second).num_pages()) break;
      cur = it->second;
    }
    if (pos < start) {
      return NotFound("radix InsertHost: only " + Str(static_cast<int64_t>(pos)) + " of the " +
                      Str(start_tokens) +
                      " prefix tokens are still host-resident in the tree (evicted while their "
                      "continuation was read); drop the read pages and match again");
    }
  }

  const uint64_t now = ++clock_;
  InsertHostResult result;
  int32_t cur = kRoot;
  size_t pos = 0;
  bool blocked = false;
  while (pos < limit) {
    auto it = node(cur).children.find(tokens.subspan(pos, ps));
    if (it == node(cur).children.end()) break;
    int32_t child = it->second;
    // A host copy in flight cannot be extended yet (host closure of valid
    // copies); the prefix checked above has none.
    if (node(child).backup_job != 0) {
      blocked = true;
      break;
    }
    const int64_t m = MatchPages(child, tokens.subspan(pos, limit - pos));
    if (m < node(child).num_pages()) child = Split(child, m);
    if (!node(child).has_host_pages()) {  // device-only: the read gives it a host copy
      AttachHostPages(child, host_pages.subspan((pos - start) / ps, static_cast<size_t>(m)));
      result.num_taken_pages += m;
    }
    Touch(child, now);
    pos += static_cast<size_t>(m) * ps;
    cur = child;
  }
  if (pos < limit && !blocked) {
    STRATA_CHECK(pos >= start && (cur == kRoot || node(cur).host_valid()));
    const size_t first = (pos - start) / ps, count = (limit - pos) / ps;
    const uint64_t parent_hash = EndHash(cur);
    const int32_t leaf = NewNode();  // may reallocate nodes_
    Node& n = node(leaf);
    n.parent = cur;
    n.tokens.assign(tokens.begin() + static_cast<ptrdiff_t>(pos),
                    tokens.begin() + static_cast<ptrdiff_t>(limit));
    uint64_t h = parent_hash;
    for (size_t i = 0; i < count; ++i) {
      h = ChainPageHash(h, std::span<const int32_t>(n.tokens).subspan(i * ps, ps));
      n.page_hashes.push_back(h);
    }
    n.last_access = now;
    node(cur).children.emplace(
        std::vector<int32_t>(n.tokens.begin(), n.tokens.begin() + page_size_), leaf);
    // Not accounted yet: AttachHostPages brackets it, and an empty node counts nothing.
    AttachHostPages(leaf, host_pages.subspan(first, count));
    result.num_taken_pages += static_cast<int64_t>(count);
    pos = limit;
    cur = leaf;
  }
  result.num_tokens = static_cast<int64_t>(pos);
  result.handle = HandleOf(cur);
  return result;
}

int64_t RadixTree::TailPagesToFree(const std::vector<int32_t>& pages, const PageAllocator& alloc,
                                   int64_t want) const {
  int64_t k = 0, would_free = 0;
  for (auto it = pages.rbegin(); it != pages.rend() && would_free < want; ++it, ++k) {
    if (alloc.refcount(*it) == 1) ++would_free;
  }
  return k;
}

int64_t RadixTree::Evict(int64_t num_pages) {
  int64_t freed = 0;
  while (freed < num_pages && !evictable_.empty()) {
    int32_t id = evictable_.begin()->second;
    const int64_t np = node(id).num_pages();
    if (node(id).host_valid()) {
      // Offload: keep the host copy, drop the device pages (of the tail only,
      // split off first, if that frees enough: residency is per node).
      const int64_t k = TailPagesToFree(node(id).device_pages, *allocator_, num_pages - freed);
      if (k < np) Split(id, np - k);
      Unaccount(id);
      Node& n = node(id);
      for (int32_t p : n.device_pages) {
        in_tree_[static_cast<size_t>(p)] = 0;
        ++evicted_pages_;
        ++offloaded_pages_;
        if (allocator_->Unref(p)) ++freed;
      }
      n.device_pages.clear();
      Account(id);
      continue;
    }
    // No host copy (nor one in flight), so no child either: remove tail first.
    Unaccount(id);
    Node& n = node(id);
    STRATA_CHECK(!n.has_host_pages() && n.children.empty());
    const std::vector<int32_t> key(n.tokens.begin(), n.tokens.begin() + page_size_);
    while (freed < num_pages && !n.device_pages.empty()) {
      const int32_t p = n.device_pages.back();
      n.device_pages.pop_back();
      n.page_hashes.pop_back();
      n.tokens.resize(n.tokens.size() - static_cast<size_t>(page_size_));
      in_tree_[static_cast<size_t>(p)] = 0;
      ++evicted_pages_;
      if (allocator_->Unref(p)) ++freed;
    }
    if (!n.device_pages.empty()) {
      Account(id);  // freed enough; the rest of the leaf stays
      break;
    }
    RemoveLeaf(id, key);
  }
  return freed;
}

std::vector<RadixNodeHandle> RadixTree::UnbackedEvictionCandidates(int64_t num_pages) const {
  std::vector<RadixNodeHandle> out;
  int64_t covered = 0;
  for (auto it = evictable_.begin(); it != evictable_.end() && covered < num_pages; ++it) {
    const Node& n = node(it->second);
    if (n.has_host_pages()) continue;
    out.push_back(HandleOf(it->second));
    covered += n.num_pages();
  }
  return out;
}

int64_t RadixTree::EvictHost(int64_t num_pages) {
  if (host_ == nullptr) return 0;
  int64_t freed = 0;
  while (freed < num_pages && !host_evictable_.empty()) {
    int32_t id = host_evictable_.begin()->second;
    const int64_t np = node(id).num_pages();
    if (node(id).on_device()) {
      // Drop the host copy (of the tail only, split off first, if enough).
      const int64_t k = TailPagesToFree(node(id).host_pages, *host_, num_pages - freed);
      if (k < np) Split(id, np - k);
      Unaccount(id);
      Node& n = node(id);
      for (int32_t p : n.host_pages) {
        in_host_tree_[static_cast<size_t>(p)] = 0;
        ++host_evicted_pages_;
        if (host_->Unref(p)) ++freed;
      }
      n.host_pages.clear();
      Account(id);
      continue;
    }
    // Host-only leaf: its descendants would be host-resident, and it has none.
    Unaccount(id);
    Node& n = node(id);
    STRATA_CHECK(n.children.empty());
    const std::vector<int32_t> key(n.tokens.begin(), n.tokens.begin() + page_size_);
    while (freed < num_pages && !n.host_pages.empty()) {
      const int32_t p = n.host_pages.back();
      n.host_pages.pop_back();
      n.page_hashes.pop_back();
      n.tokens.resize(n.tokens.size() - static_cast<size_t>(page_size_));
      in_host_tree_[static_cast<size_t>(p)] = 0;
      ++host_evicted_pages_;
      if (host_->Unref(p)) ++freed;
    }
    if (!n.host_pages.empty()) {
      Account(id);
      break;
    }
    RemoveLeaf(id, key);
  }
  return freed;
}

std::vector<RadixTree::BackupJob> RadixTree::StartBackup(RadixNodeHandle handle) {
  STRATA_CHECK(host_ != nullptr) << "radix StartBackup on a tree without a host tier";
  CheckHandle(handle);
  std::vector<BackupJob> jobs;
  if (handle.is_root()) return jobs;
  std::vector<int32_t> path;
  for (int32_t id = handle.node; id != kRoot; id = node(id).parent) path.push_back(id);
  std::reverse(path.begin(), path.end());
  // The lock keeps EvictHost off this path (its host copies are the closure
  // the new ones need) and Evict off its device pages.
  Lock(handle);
  for (int32_t id : path) {
    if (node(id).has_host_pages()) continue;
    const int64_t np = node(id).num_pages();
    if (!host_->CanAllocate(np)) EvictHost(np - host_->num_free());  // may split elsewhere
    std::vector<int32_t> pages;
    if (!host_->Allocate(np, &pages).ok()) break;
    Unaccount(id);
    Node& n = node(id);
    for (int32_t p : pages) in_host_tree_[static_cast<size_t>(p)] = 1;
    n.host_pages = pages;
    n.backup_job = next_job_++;
    jobs_[n.backup_job].nodes.push_back(id);
    Account(id);
    ++backups_started_;
    BackupJob job{n.backup_job, n.device_pages, std::move(pages), np * page_size_};
    job.tokens = n.tokens;
    job.start_hash = EndHash(n.parent);
    job.end_hash = EndHash(id);
    jobs.push_back(std::move(job));
  }
  Unlock(handle);
  return jobs;
}

void RadixTree::EraseJobIfDone(uint64_t id) {
  auto it = jobs_.find(id);
  if (it != jobs_.end() && it->second.copied && it->second.nodes.empty()) jobs_.erase(it);
}

void RadixTree::ValidateBackups(int32_t first) {
  std::vector<int32_t> stack = {first};
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    const uint64_t job = node(id).backup_job;
    Unaccount(id);
    node(id).backup_job = 0;
    Account(id);
    EraseOne(jobs_.at(job).nodes, id);
    EraseJobIfDone(job);
    for (const auto& [key, child] : node(id).children) {
      const uint64_t cj = node(child).backup_job;
      if (cj != 0 && jobs_.at(cj).copied) stack.push_back(child);
    }
  }
}

void RadixTree::DetachPendingHost(int32_t first, uint64_t aborting_job) {
  std::vector<int32_t> stack = {first};
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    if (!node(id).has_host_pages()) continue;  // and none below (host closure)
    for (const auto& [key, child] : node(id).children) stack.push_back(child);
    const uint64_t job = node(id).backup_job;
    // A valid copy needs a valid parent, so below an in-flight one all are in flight.
    STRATA_CHECK(job != 0) << "radix node " << id << " has a valid host copy under a backup";
    Unaccount(id);
    std::vector<int32_t> pages = std::move(node(id).host_pages);
    node(id).host_pages.clear();
    node(id).backup_job = 0;
    Account(id);
    Job& j = jobs_.at(job);
    EraseOne(j.nodes, id);
    if (job == aborting_job || j.copied) {  // nothing writes these any more
      for (int32_t p : pages) {
        in_host_tree_[static_cast<size_t>(p)] = 0;
        host_->Unref(p);
      }
    } else {  // its copy still runs: free them when it ends
      j.detached_host_pages.insert(j.detached_host_pages.end(), pages.begin(), pages.end());
      detached_pages_ += static_cast<int64_t>(pages.size());
    }
    if (job != aborting_job) EraseJobIfDone(job);
  }
}

void RadixTree::CompleteBackup(uint64_t id) {
  auto it = jobs_.find(id);
  STRATA_CHECK(it != jobs_.end() && !it->second.copied)
      << "CompleteBackup of radix backup job " << id
      << " that StartBackup never returned or that already completed or aborted";
  Job& job = it->second;
  job.copied = true;
  ++backups_completed_;
  for (int32_t p : job.detached_host_pages) {
    in_host_tree_[static_cast<size_t>(p)] = 0;
    host_->Unref(p);
  }
  detached_pages_ -= static_cast<int64_t>(job.detached_host_pages.size());
  job.detached_host_pages.clear();
  const std::vector<int32_t> nodes = job.nodes;  // ValidateBackups edits the list
  for (int32_t n : nodes) {
    if (node(n).backup_job == id && ParentHostValid(n)) ValidateBackups(n);
  }
  EraseJobIfDone(id);
}

void RadixTree::AbortBackup(uint64_t id) {
  auto it = jobs_.find(id);
  STRATA_CHECK(it != jobs_.end() && !it->second.copied)
      << "AbortBackup of radix backup job " << id
      << " that StartBackup never returned or that already completed or aborted";
  ++backups_aborted_;
  for (int32_t p : it->second.detached_host_pages) {
    in_host_tree_[static_cast<size_t>(p)] = 0;
    host_->Unref(p);
  }
  detached_pages_ -= static_cast<int64_t>(it->second.detached_host_pages.size());
  it->second.detached_host_pages.clear();
  const std::vector<int32_t> nodes = it->second.nodes;
  for (int32_t n : nodes) {
    if (node(n).backup_job == id) DetachPendingHost(n, id);
  }
  STRATA_CHECK(jobs_.at(id).nodes.empty());
  jobs_.erase(id);
}

int64_t RadixTree::HitCount(RadixNodeHandle handle) const {
  CheckHandle(handle);
  return static_cast<int64_t>(node(handle.node).hit_count);
}

bool RadixTree::HasHostCopy(RadixNodeHandle handle) const {
  CheckHandle(handle);
  for (int32_t id = handle.node; id != kRoot; id = node(id).parent) {
    if (!node(id).host_valid()) return false;
  }
  return true;
}

Residency RadixTree::NodeResidency(RadixNodeHandle handle) const {
  CheckHandle(handle);
  STRATA_CHECK(!handle.is_root()) << "NodeResidency of the radix root";
  const Node& n = node(handle.node);
  if (!n.on_device()) return Residency::kHost;
  return n.host_valid() ? Residency::kDeviceAndHost : Residency::kDevice;
}

RadixTreeStats RadixTree::stats() const {
  RadixTreeStats s;
  s.cached_pages = evictable_pages_ + locked_pages_;
  s.evictable_pages = evictable_pages_;
  s.locked_pages = locked_pages_;
  s.nodes = num_nodes_;
  s.hit_tokens = hit_tokens_;
  s.miss_tokens = miss_tokens_;
  s.inserted_pages = inserted_pages_;
  s.evicted_pages = evicted_pages_;
  s.device_cached_pages = s.cached_pages;
  s.host_cached_pages = host_pages_ + detached_pages_;
  s.host_only_pages = host_only_pages_;
  s.host_hit_tokens = host_hit_tokens_;
  s.offloaded_pages = offloaded_pages_;
  s.host_inserted_pages = host_inserted_pages_;
  s.host_evicted_pages = host_evicted_pages_;
  s.backups_started = backups_started_;
  s.backups_completed = backups_completed_;
  s.backups_aborted = backups_aborted_;
  s.backup_pages_in_flight = pending_pages_ + detached_pages_;
  return s;
}

uint64_t RadixTree::PrefixHash(RadixNodeHandle handle) const {
  CheckHandle(handle);
  return EndHash(handle.node);
}

Status RadixTree::CheckIntegrity() const {
  auto fail = [](const std::string& what) {
    return Internal("radix tree: " + what + " (a Strata bug: the prefix cache is corrupt)");
  };
  const Node& root = node(kRoot);
  if (!root.alive || root.parent != kNone || !root.tokens.empty() || !root.device_pages.empty() ||
      !root.host_pages.empty() || root.backup_job != 0 || !root.page_hashes.empty() ||
      root.generation != 0) {
    return fail("the root node is not an empty, parentless, live node of generation 0");
  }
  if (in_tree_.size() != static_cast<size_t>(allocator_->num_pages())) {
    return fail("page bitmap has " + Str(static_cast<int64_t>(in_tree_.size())) +
                " entries for an allocator of " + Str(allocator_->num_pages()) + " pages");
  }
  const size_t host_num_pages = host_ ? static_cast<size_t>(host_->num_pages()) : 0;
  if (in_host_tree_.size() != host_num_pages) {
    return fail("host page bitmap has " + Str(static_cast<int64_t>(in_host_tree_.size())) +
                " entries for a host allocator of " + Str(static_cast<int64_t>(host_num_pages)) +
                " pages");
  }
  if (!host_ && !jobs_.empty()) return fail("backup jobs exist without a host tier");
  const size_t ps = static_cast<size_t>(page_size_);
  std::vector<uint8_t> seen_page(in_tree_.size(), 0);
  std::vector<uint8_t> seen_host(in_host_tree_.size(), 0);
  std::vector<uint8_t> reached(nodes_.size(), 0);
  std::set<EvictKey> expect_device, expect_host;
  std::map<uint64_t, int64_t> job_nodes;  // job -> nodes naming it
  std::string child_count_error;
  int64_t nodes = 0, evictable_pages = 0, locked_pages = 0, host_pages = 0, host_only = 0,
          pending = 0;

  // Checks one stored page of either tier.
  auto check_page = [&](int32_t p, const PageAllocator& alloc, std::vector<uint8_t>& seen,
                        const std::vector<uint8_t>& bitmap, const std::string& pwhere) -> Status {
    if (p < 0 || p >= alloc.num_pages()) return fail(pwhere + " is out of range");
    if (seen[static_cast<size_t>(p)]) return fail(pwhere + " is stored twice in the tree");
    seen[static_cast<size_t>(p)] = 1;
    if (!bitmap[static_cast<size_t>(p)]) return fail(pwhere + " is missing from the page bitmap");
    if (alloc.refcount(p) < 1) return fail(pwhere + " is free in the allocator (refcount 0)");
    return OkStatus();
  };

  // Preorder walk from the root; parents are checked before their children.
  std::vector<int32_t> stack = {kRoot};
  reached[kRoot] = 1;
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    const Node& n = node(id);
    const std::string where = "node " + Str(static_cast<int64_t>(id));
    if (n.lock_ref < 0 || n.self_locks < 0) {
      return fail(where + " has negative lock_ref " + Str(static_cast<int64_t>(n.lock_ref)) +
                  " / self_locks " + Str(static_cast<int64_t>(n.self_locks)));
    }
    if (n.last_access > clock_) {
      return fail(where + " was last used at " + Str(n.last_access) + ", after the clock " +
                  Str(clock_));
    }
    int64_t sum = 0, device_children = 0, host_children = 0;
    for (const auto& [key, child] : n.children) {
      const std::string cwhere = "child " + Str(static_cast<int64_t>(child)) + " of " + where;
      if (child <= kRoot || static_cast<size_t>(child) >= nodes_.size() || !node(child).alive) {
        return fail(cwhere + " is not a live node id");
      }
      if (reached[static_cast<size_t>(child)]) return fail(cwhere + " is reachable twice");
      reached[static_cast<size_t>(child)] = 1;
      const Node& c = node(child);
      if (c.parent != id) {
        return fail(cwhere + " names node " + Str(static_cast<int64_t>(c.parent)) +
                    " as its parent");
      }
      if (key.size() != ps || c.tokens.size() < ps ||
          !std::equal(key.begin(), key.end(), c.tokens.begin())) {
        return fail(cwhere + " is keyed by tokens other than its first page's");
      }
      // Closure, checked from the parent's side.
      if (c.on_device() && id != kRoot && !n.on_device()) {
        return fail(cwhere + " has device pages under a parent without (device closure)");
      }
      if (c.has_host_pages() && id != kRoot && !n.has_host_pages()) {
        return fail(cwhere + " has host pages under a parent without (host closure)");
      }
      if (c.host_valid() && id != kRoot && !n.host_valid()) {
        return fail(cwhere + " has a valid host copy under a parent whose copy is in flight " +
                    "(host closure)");
      }
      sum += c.lock_ref;
      device_children += c.on_device() ? 1 : 0;
      host_children += c.has_host_pages() ? 1 : 0;
      stack.push_back(child);
    }
    if ((device_children != n.device_children || host_children != n.host_children) &&
        child_count_error.empty()) {
      // Reported after the reachability checks: an unlinked child shows here
      // too, and "orphaned" names the cause.
      child_count_error =
          (where + " counts " + Str(static_cast<int64_t>(n.device_children)) + " device and " +
           Str(static_cast<int64_t>(n.host_children)) + " host children; a recount gives " +
           Str(device_children) + " and " + Str(host_children));
    }
    if (id == kRoot) {
      // Lock never counts on the root: locking an empty match is a no-op.
      if (n.lock_ref != 0 || n.self_locks != 0) return fail("the root node carries locks");
      continue;
    }
    if (n.lock_ref != n.self_locks + sum) {
      return fail(where + " has lock_ref " + Str(static_cast<int64_t>(n.lock_ref)) + " but " +
                  Str(static_cast<int64_t>(n.self_locks)) + " own locks + " + Str(sum) +
                  " in its children");
    }
    if (n.lock_ref == 0 && n.locked_tiers != 0) {
      return fail(where + " is unlocked but records tiers held under a lock");
    }
    if (n.lock_ref > 0 && (n.tiers() & n.locked_tiers) != n.locked_tiers) {
      return fail(where + " is locked and lost a tier it had (" +
                  Str(static_cast<int64_t>(n.locked_tiers)) + " -> " +
                  Str(static_cast<int64_t>(n.tiers())) + "; 1 = device, 2 = host)");
    }

    ++nodes;
    const int64_t np = n.num_pages();
    if (np <= 0 || n.tokens.size() != static_cast<size_t>(np) * ps) {
      return fail(where + " holds " + Str(static_cast<int64_t>(n.tokens.size())) + " tokens for " +
                  Str(np) + " pages of " + Str(static_cast<int64_t>(page_size_)) +
                  " (must be pages * page_size > 0)");
    }
    const auto dp = static_cast<int64_t>(n.device_pages.size());
    const auto hp = static_cast<int64_t>(n.host_pages.size());
    if ((dp != 0 && dp != np) || (hp != 0 && hp != np)) {
      return fail(where + " has " + Str(dp) + " device and " + Str(hp) + " host pages for " +
                  Str(np) + " pages (residency must be uniform per node)");
    }
    if (dp == 0 && hp == 0) return fail(where + " holds neither device nor host pages");
    if (hp != 0 && !host_) return fail(where + " has host pages without a host tier");
    if (n.backup_job != 0) {
      if (hp == 0 || dp == 0) {
        return fail(where + " has backup job " + Str(n.backup_job) +
                    " in flight without both device and host pages");
      }
      auto job = jobs_.find(n.backup_job);
      if (job == jobs_.end()) {
        return fail(where + " names backup job " + Str(n.backup_job) + ", which does not exist");
      }
      if (std::count(job->second.nodes.begin(), job->second.nodes.end(), id) != 1) {
        return fail(where + " is in backup job " + Str(n.backup_job) +
                    " but the job does not list it exactly once");
      }
      ++job_nodes[n.backup_job];
      pending += np;
    }
    uint64_t h = EndHash(n.parent);
    for (int64_t i = 0; i < np; ++i) {
      const auto u = static_cast<size_t>(i);
      if (dp != 0) {
        Status s = check_page(n.device_pages[u], *allocator_, seen_page, in_tree_,
                              where + " page " + Str(i) + " (id " +
                                  Str(static_cast<int64_t>(n.device_pages[u])) + ")");
        if (!s.ok()) return s;
      }
      if (hp != 0) {
        Status s = check_page(n.host_pages[u], *host_, seen_host, in_host_tree_,
                              where + " host page " + Str(i) + " (id " +
                                  Str(static_cast<int64_t>(n.host_pages[u])) + ")");
        if (!s.ok()) return s;
      }
      h = ChainPageHash(h, std::span<const int32_t>(n.tokens).subspan(u * ps, ps));
      if (n.page_hashes[u] != h)
        return fail(where + " page " + Str(i) + " has a stale chained hash");
    }
    if (dp != 0) (n.lock_ref > 0 ? locked_pages : evictable_pages) += np;
    if (hp != 0) host_pages += np;
    if (dp == 0) host_only += np;
    if (IsDeviceLeaf(id)) expect_device.insert({n.last_access, id});
    if (IsHostLeaf(id)) expect_host.insert({n.last_access, id});
  }

  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (nodes_[id].alive && !reached[id])
      return fail("node " + Str(static_cast<int64_t>(id)) + " is orphaned");
  }
  for (int32_t id : free_nodes_) {
    if (id <= kRoot || static_cast<size_t>(id) >= nodes_.size() || node(id).alive) {
      return fail("free node list holds " + Str(static_cast<int64_t>(id)) +
                  ", which is not a dead node slot");
    }
  }
  if (!child_count_error.empty()) return fail(child_count_error);
  int64_t detached = 0;
  for (const auto& [jid, job] : jobs_) {
    const std::string jwhere = "backup job " + Str(jid);
    if (jid == 0 || jid >= next_job_) return fail(jwhere + " has an id StartBackup never gave");
    if (static_cast<int64_t>(job.nodes.size()) != job_nodes[jid]) {
      return fail(jwhere + " lists " + Str(static_cast<int64_t>(job.nodes.size())) + " nodes but " +
                  Str(job_nodes[jid]) + " nodes name it");
    }
    if (job.copied && job.nodes.empty()) return fail(jwhere + " is finished but still kept");
    if (job.copied && !job.detached_host_pages.empty()) {
      return fail(jwhere + " is copied but still holds detached host pages");
    }
    for (int32_t p : job.detached_host_pages) {
      Status s = check_page(p, *host_, seen_host, in_host_tree_,
                            jwhere + " detached host page " + Str(static_cast<int64_t>(p)));
      if (!s.ok()) return s;
    }
    detached += static_cast<int64_t>(job.detached_host_pages.size());
  }
  for (size_t p = 0; p < in_tree_.size(); ++p) {
    if (in_tree_[p] && !seen_page[p]) {
      return fail("page " + Str(static_cast<int64_t>(p)) +
                  " is marked stored but no node holds it");
    }
  }
  for (size_t p = 0; p < in_host_tree_.size(); ++p) {
    if (in_host_tree_[p] && !seen_host[p]) {
      return fail("host page " + Str(static_cast<int64_t>(p)) +
                  " is marked stored but no node or job holds it");
    }
  }
  if (expect_device != evictable_) {
    return fail("evictable set holds " + Str(static_cast<int64_t>(evictable_.size())) +
                " entries but the device leaves (by last access) are " +
                Str(static_cast<int64_t>(expect_device.size())) + " different ones");
  }
  if (expect_host != host_evictable_) {
    return fail("host evictable set holds " + Str(static_cast<int64_t>(host_evictable_.size())) +
                " entries but the host leaves (by last access) are " +
                Str(static_cast<int64_t>(expect_host.size())) + " different ones");
  }
  if (nodes != num_nodes_ || evictable_pages != evictable_pages_ || locked_pages != locked_pages_) {
    return fail("counters say " + Str(num_nodes_) + " nodes, " + Str(evictable_pages_) +
                " evictable and " + Str(locked_pages_) + " locked pages; a recount gives " +
                Str(nodes) + ", " + Str(evictable_pages) + " and " + Str(locked_pages));
  }
  if (host_pages != host_pages_ || host_only != host_only_pages_ || pending != pending_pages_ ||
      detached != detached_pages_) {
    return fail("host counters say " + Str(host_pages_) + " host, " + Str(host_only_pages_) +
                " host-only, " + Str(pending_pages_) + " in-flight and " + Str(detached_pages_) +
                " detached pages; a recount gives " + Str(host_pages) + ", " + Str(host_only) +
                ", " + Str(pending) + " and " + Str(detached));
  }
  if (inserted_pages_ - evicted_pages_ != evictable_pages + locked_pages) {
    return fail("device page counters do not balance: " + Str(inserted_pages_) + " inserted - " +
                Str(evicted_pages_) + " evicted != " + Str(evictable_pages + locked_pages) +
                " cached");
  }
  return OkStatus();
}

}  // namespace strata

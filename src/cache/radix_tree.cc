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

RadixTree::RadixTree(const RadixTreeConfig& config, PageAllocator* allocator)
    : page_size_(config.page_size), allocator_(allocator) {
  STRATA_CHECK(page_size_ >= 1) << "radix tree page_size " << page_size_;
  STRATA_CHECK(allocator_ != nullptr);
  nodes_.emplace_back();
  nodes_[kRoot].alive = true;
  in_tree_.assign(static_cast<size_t>(allocator_->num_pages()), 0);
}

RadixTree::~RadixTree() {
  for (const Node& n : nodes_) {
    if (!n.alive) continue;
    for (int32_t p : n.device_pages) allocator_->Unref(p);
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

bool RadixTree::IsEvictableLeaf(int32_t id) const {
  const Node& n = node(id);
  return id != kRoot && n.alive && n.children.empty() && n.lock_ref == 0;
}

int64_t RadixTree::MatchPages(int32_t id, std::span<const int32_t> tokens) const {
  const Node& n = node(id);
  const int64_t max_pages =
      std::min(n.num_pages(), static_cast<int64_t>(tokens.size()) / page_size_);
  const size_t ps = static_cast<size_t>(page_size_);
  int64_t m = 0;
  for (; m < max_pages; ++m) {
    const size_t off = static_cast<size_t>(m) * ps;
    if (!std::equal(n.tokens.begin() + off, n.tokens.begin() + off + ps, tokens.begin() + off))
      break;
  }
  return m;
}

void RadixTree::Touch(int32_t id, uint64_t now) {
  Node& n = node(id);
  if (n.last_access == now) return;
  if (IsEvictableLeaf(id)) {
    evictable_.erase({n.last_access, id});
    evictable_.insert({now, id});
  }
  n.last_access = now;
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

int32_t RadixTree::Split(int32_t id, int64_t upper_pages) {
  const int32_t up = NewNode();  // may reallocate nodes_: take references after
  Node& lower = node(id);
  Node& upper = node(up);
  STRATA_CHECK(upper_pages > 0 && upper_pages < lower.num_pages());
  const auto upper_tokens = static_cast<ptrdiff_t>(upper_pages * page_size_);
  const auto up_pages = static_cast<ptrdiff_t>(upper_pages);

  upper.parent = lower.parent;
  upper.residency = lower.residency;
  upper.tokens.assign(lower.tokens.begin(), lower.tokens.begin() + upper_tokens);
  upper.device_pages.assign(lower.device_pages.begin(), lower.device_pages.begin() + up_pages);
  upper.page_hashes.assign(lower.page_hashes.begin(), lower.page_hashes.begin() + up_pages);
  upper.lock_ref = lower.lock_ref;  // every lock below lower is below upper too
  upper.last_access = lower.last_access;
  upper.hit_count = lower.hit_count;

  lower.tokens.erase(lower.tokens.begin(), lower.tokens.begin() + upper_tokens);
  lower.device_pages.erase(lower.device_pages.begin(), lower.device_pages.begin() + up_pages);
  lower.page_hashes.erase(lower.page_hashes.begin(), lower.page_hashes.begin() + up_pages);
  lower.parent = up;

  // The parent's key for this subtree (its first page) is unchanged.
  auto it = node(upper.parent)
                .children.find(
                    std::span<const int32_t>(upper.tokens.data(), static_cast<size_t>(page_size_)));
  STRATA_CHECK(it != node(upper.parent).children.end() && it->second == id);
  it->second = up;
  upper.children.emplace(
      std::vector<int32_t>(lower.tokens.begin(), lower.tokens.begin() + page_size_), id);
  // lower keeps its last_access, so its evictable-set entry (if any) stands.
  return up;
}

RadixTree::MatchResult RadixTree::MatchPrefix(std::span<const int32_t> tokens) {
  const uint64_t now = ++clock_;
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t limit = tokens.size() / ps * ps;
  MatchResult result;
  int32_t cur = kRoot;
  size_t pos = 0;
  while (pos < limit) {
    const auto& children = node(cur).children;
    auto it = children.find(tokens.subspan(pos, ps));
    if (it == children.end()) break;
    int32_t child = it->second;
    const int64_t m = MatchPages(child, tokens.subspan(pos));
    const bool partial = m < node(child).num_pages();
    if (partial) child = Split(child, m);
    Node& c = node(child);
    result.pages.insert(result.pages.end(), c.device_pages.begin(), c.device_pages.end());
    ++c.hit_count;
    Touch(child, now);
    pos += static_cast<size_t>(m) * ps;
    cur = child;
    if (partial) break;
  }
  result.num_tokens = static_cast<int64_t>(pos);
  result.handle = HandleOf(cur);
  hit_tokens_ += result.num_tokens;
  miss_tokens_ += static_cast<int64_t>(tokens.size()) - result.num_tokens;
  return result;
}

int64_t RadixTree::PeekPrefixLength(std::span<const int32_t> tokens) const {
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t limit = tokens.size() / ps * ps;
  int32_t cur = kRoot;
  size_t pos = 0;
  while (pos < limit) {
    const auto& children = node(cur).children;
    auto it = children.find(tokens.subspan(pos, ps));
    if (it == children.end()) break;
    const int64_t m = MatchPages(it->second, tokens.subspan(pos));
    pos += static_cast<size_t>(m) * ps;
    if (m < node(it->second).num_pages()) break;
    cur = it->second;
  }
  return static_cast<int64_t>(pos);
}

void RadixTree::Lock(RadixNodeHandle handle) {
  CheckHandle(handle);
  if (handle.is_root()) return;
  ++node(handle.node).self_locks;
  for (int32_t id = handle.node; id != kRoot; id = node(id).parent) {
    Node& n = node(id);
    if (n.lock_ref++ > 0) continue;
    evictable_pages_ -= n.num_pages();
    locked_pages_ += n.num_pages();
    if (n.children.empty()) evictable_.erase({n.last_access, id});
  }
}

void RadixTree::Unlock(RadixNodeHandle handle) {
  CheckHandle(handle);
  if (handle.is_root()) return;
  STRATA_CHECK(node(handle.node).self_locks > 0)
      << "Unlock of radix node " << handle.node << " that holds no lock (unbalanced Lock/Unlock)";
  --node(handle.node).self_locks;
  for (int32_t id = handle.node; id != kRoot; id = node(id).parent) {
    Node& n = node(id);
    STRATA_CHECK(n.lock_ref > 0) << "radix node " << id << " lock_ref underflow";
    if (--n.lock_ref > 0) continue;
    evictable_pages_ += n.num_pages();
    locked_pages_ -= n.num_pages();
    if (n.children.empty()) evictable_.insert({n.last_access, id});
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
  size_t pos = 0;  // tokens
  while (pos < limit) {
    const auto& children = node(cur).children;
    auto it = children.find(tokens.subspan(pos, ps));
    if (it == children.end()) break;
    int32_t child = it->second;
    const int64_t m = MatchPages(child, tokens.subspan(pos, limit - pos));
    if (m < node(child).num_pages()) child = Split(child, m);
    Touch(child, now);
    pos += static_cast<size_t>(m) * ps;
    cur = child;
  }

  InsertResult result;
  result.num_cached_tokens = static_cast<int64_t>(pos);
  if (pos < limit) {
    const bool parent_was_evictable_leaf = IsEvictableLeaf(cur);
    const uint64_t parent_hash = EndHash(cur);
    const int32_t leaf = NewNode();  // may reallocate nodes_
    Node& n = node(leaf);
    n.parent = cur;
    n.tokens.assign(tokens.begin() + static_cast<ptrdiff_t>(pos),
                    tokens.begin() + static_cast<ptrdiff_t>(limit));
    n.device_pages.assign(pages.begin() + static_cast<ptrdiff_t>(pos / ps),
                          pages.begin() + static_cast<ptrdiff_t>(num_pages));
    n.page_hashes.reserve(n.device_pages.size());
    uint64_t h = parent_hash;
    for (size_t i = 0; i < n.device_pages.size(); ++i) {
      const int32_t p = n.device_pages[i];
      STRATA_CHECK(p >= 0 && p < allocator_->num_pages())
          << "radix Insert of page " << p << " outside [0, " << allocator_->num_pages() << ")";
      STRATA_CHECK(!in_tree_[static_cast<size_t>(p)])
          << "radix Insert of page " << p << " that the tree already stores for other tokens";
      allocator_->Ref(p);
      in_tree_[static_cast<size_t>(p)] = 1;
      h = ChainPageHash(h, std::span<const int32_t>(n.tokens).subspan(i * ps, ps));
      n.page_hashes.push_back(h);
    }
    n.last_access = now;
    const int64_t added = n.num_pages();
    node(cur).children.emplace(
        std::vector<int32_t>(n.tokens.begin(), n.tokens.begin() + page_size_), leaf);
    if (parent_was_evictable_leaf) evictable_.erase({node(cur).last_access, cur});
    evictable_.insert({now, leaf});
    evictable_pages_ += added;
    inserted_pages_ += added;
    result.num_inserted_tokens = static_cast<int64_t>(limit - pos);
    cur = leaf;
  }
  result.handle = HandleOf(cur);
  return result;
}

int64_t RadixTree::Evict(int64_t num_pages) {
  int64_t freed = 0;
  while (freed < num_pages && !evictable_.empty()) {
    const int32_t id = evictable_.begin()->second;
    Node& n = node(id);
    const std::vector<int32_t> key(n.tokens.begin(), n.tokens.begin() + page_size_);
    while (freed < num_pages && !n.device_pages.empty()) {
      const int32_t p = n.device_pages.back();
      n.device_pages.pop_back();
      n.page_hashes.pop_back();
      n.tokens.resize(n.tokens.size() - static_cast<size_t>(page_size_));
      in_tree_[static_cast<size_t>(p)] = 0;
      --evictable_pages_;
      ++evicted_pages_;
      if (allocator_->Unref(p)) ++freed;
    }
    if (!n.device_pages.empty()) break;  // freed enough; the rest of the leaf stays
    const int32_t parent = n.parent;
    evictable_.erase(evictable_.begin());
    node(parent).children.erase(key);
    FreeNode(id);
    if (IsEvictableLeaf(parent)) evictable_.insert({node(parent).last_access, parent});
  }
  return freed;
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
      !root.page_hashes.empty() || root.generation != 0) {
    return fail("the root node is not an empty, parentless, live node of generation 0");
  }
  if (in_tree_.size() != static_cast<size_t>(allocator_->num_pages())) {
    return fail("page bitmap has " + Str(static_cast<int64_t>(in_tree_.size())) +
                " entries for an allocator of " + Str(allocator_->num_pages()) + " pages");
  }
  const size_t ps = static_cast<size_t>(page_size_);
  std::vector<uint8_t> seen_page(in_tree_.size(), 0);
  std::vector<uint8_t> reached(nodes_.size(), 0);
  std::vector<int64_t> child_lock_sum(nodes_.size(), 0);
  std::set<EvictKey> expect_evictable;
  int64_t nodes = 0, evictable_pages = 0, locked_pages = 0;

  // Preorder walk from the root; parents are checked before their children.
  std::vector<int32_t> stack = {kRoot};
  reached[kRoot] = 1;
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    const Node& n = node(id);
    const std::string where = "node " + Str(id);
    if (n.lock_ref < 0 || n.self_locks < 0) {
      return fail(where + " has negative lock_ref " + Str(n.lock_ref) + " / self_locks " +
                  Str(n.self_locks));
    }
    if (n.last_access > clock_) {
      return fail(where + " was last used at " + Str(static_cast<int64_t>(n.last_access)) +
                  ", after the clock " + Str(static_cast<int64_t>(clock_)));
    }
    int64_t sum = 0;
    for (const auto& [key, child] : n.children) {
      const std::string cwhere = "child " + Str(child) + " of node " + Str(id);
      if (child <= kRoot || static_cast<size_t>(child) >= nodes_.size() || !node(child).alive) {
        return fail(cwhere + " is not a live node id");
      }
      if (reached[static_cast<size_t>(child)]) return fail(cwhere + " is reachable twice");
      reached[static_cast<size_t>(child)] = 1;
      const Node& c = node(child);
      if (c.parent != id) return fail(cwhere + " names node " + Str(c.parent) + " as its parent");
      if (key.size() != ps || c.tokens.size() < ps ||
          !std::equal(key.begin(), key.end(), c.tokens.begin())) {
        return fail(cwhere + " is keyed by tokens other than its first page's");
      }
      sum += c.lock_ref;
      stack.push_back(child);
    }
    if (id == kRoot) {
      // Lock never counts on the root: locking an empty match is a no-op.
      if (n.lock_ref != 0 || n.self_locks != 0) return fail("the root node carries locks");
      continue;
    }
    if (n.lock_ref != n.self_locks + sum) {
      return fail(where + " has lock_ref " + Str(n.lock_ref) + " but " + Str(n.self_locks) +
                  " own locks + " + Str(sum) + " in its children");
    }

    ++nodes;
    const int64_t np = n.num_pages();
    if (np <= 0 || n.tokens.size() != static_cast<size_t>(np) * ps) {
      return fail(where + " holds " + Str(static_cast<int64_t>(n.tokens.size())) + " tokens for " +
                  Str(np) + " pages of " + Str(page_size_) + " (must be pages * page_size > 0)");
    }
    if (n.residency != Residency::kDevice || !n.host_pages.empty()) {
      return fail(where + " is not device-resident (no host tier exists yet)");
    }
    if (n.page_hashes.size() != static_cast<size_t>(np)) {
      return fail(where + " has " + Str(static_cast<int64_t>(n.page_hashes.size())) +
                  " page hashes for " + Str(np) + " pages");
    }
    uint64_t h = EndHash(n.parent);
    for (int64_t i = 0; i < np; ++i) {
      const int32_t p = n.device_pages[static_cast<size_t>(i)];
      const std::string pwhere = where + " page " + Str(i) + " (id " + Str(p) + ")";
      if (p < 0 || p >= allocator_->num_pages()) return fail(pwhere + " is out of range");
      if (seen_page[static_cast<size_t>(p)]) return fail(pwhere + " is stored twice in the tree");
      seen_page[static_cast<size_t>(p)] = 1;
      if (!in_tree_[static_cast<size_t>(p)])
        return fail(pwhere + " is missing from the page bitmap");
      if (allocator_->refcount(p) < 1)
        return fail(pwhere + " is free in the allocator (refcount 0)");
      h = ChainPageHash(
          h, std::span<const int32_t>(n.tokens).subspan(static_cast<size_t>(i) * ps, ps));
      if (n.page_hashes[static_cast<size_t>(i)] != h)
        return fail(pwhere + " has a stale chained hash");
    }
    (n.lock_ref > 0 ? locked_pages : evictable_pages) += np;
    if (n.children.empty() && n.lock_ref == 0) expect_evictable.insert({n.last_access, id});
  }

  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (nodes_[id].alive && !reached[id])
      return fail("node " + Str(static_cast<int64_t>(id)) + " is orphaned");
  }
  for (int32_t id : free_nodes_) {
    if (id <= kRoot || static_cast<size_t>(id) >= nodes_.size() || node(id).alive) {
      return fail("free node list holds " + Str(id) + ", which is not a dead node slot");
    }
  }
  for (size_t p = 0; p < in_tree_.size(); ++p) {
    if (in_tree_[p] && !seen_page[p]) {
      return fail("page " + Str(static_cast<int64_t>(p)) +
                  " is marked stored but no node holds it");
    }
  }
  if (expect_evictable != evictable_) {
    return fail("evictable set holds " + Str(static_cast<int64_t>(evictable_.size())) +
                " entries but the unlocked leaves (by last access) are " +
                Str(static_cast<int64_t>(expect_evictable.size())) + " different ones");
  }
  if (nodes != num_nodes_ || evictable_pages != evictable_pages_ || locked_pages != locked_pages_) {
    return fail("counters say " + Str(num_nodes_) + " nodes, " + Str(evictable_pages_) +
                " evictable and " + Str(locked_pages_) + " locked pages; a recount gives " +
                Str(nodes) + ", " + Str(evictable_pages) + " and " + Str(locked_pages));
  }
  return OkStatus();
}

}  // namespace strata

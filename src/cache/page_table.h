// PageTable: the pages one request's KV lives in, in sequence order.
// pages()[i] holds token positions [i * page_size, (i + 1) * page_size);
// token position t lives in slot pages()[t / page_size] * page_size +
// t % page_size of every layer of every pool group (the layout
// [page][offset][kv_head][head_dim] of KvLayerView).
//
// Ownership: the table holds one reference on each of its pages but does not
// keep a pointer to the allocator (tables move around with their requests);
// every call that changes references takes the allocator, and the owner must
// call Release() before dropping a non-empty table.
//
// Sharing a prefix: a new request starts with full pages of another's
// (AdoptSharedPrefix Refs them), so a shared page survives until its last
// owner releases it. Only whole pages are shared, and a shared page is never
// written again: both owners only append past it.
//
// Not thread-safe: used by the engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/page_allocator.h"
#include "util/status.h"

namespace strata {

class PageTable {
 public:
  // REQUIRES: page_size >= 1.
  explicit PageTable(int page_size);

  int page_size() const { return page_size_; }
  const std::vector<int32_t>& pages() const { return pages_; }
  // Tokens whose KV this table holds (written or about to be in this step).
  int64_t num_tokens() const { return num_tokens_; }
  // Tokens the current pages can hold.
  int64_t capacity() const { return static_cast<int64_t>(pages_.size()) * page_size_; }

  // Pages to allocate so that the table holds total_tokens tokens (0 when it
  // already can). Pure: the "prepare" half of prepare-then-apply.
  int64_t PagesNeeded(int64_t total_tokens) const;

  // Makes capacity() >= total_tokens by allocating PagesNeeded(total_tokens)
  // pages. On ResourceExhausted nothing changes. Does not change num_tokens.
  Status Reserve(int64_t total_tokens, PageAllocator& allocator);

  // Sets num_tokens (after the scheduler placed this step's tokens).
  // REQUIRES: 0 <= n <= capacity().
  void SetNumTokens(int64_t n);

  // Slot id of token position pos: page * page_size + offset.
  // REQUIRES: 0 <= pos < capacity().
  int64_t Slot(int64_t pos) const {
    return int64_t{pages_[static_cast<size_t>(pos / page_size_)]} * page_size_ + pos % page_size_;
  }
  // Writes the slots of positions [begin, end) to out[0 .. end - begin).
  // REQUIRES: 0 <= begin <= end <= capacity().
  void Slots(int64_t begin, int64_t end, int64_t* out) const;

  // Starts this table with another owner's full pages (e.g. a radix-tree
  // prefix match or a parent request), taking one reference on each.
  // Afterwards num_tokens() == pages.size() * page_size.
  // REQUIRES: the table is empty; every page is in use in allocator.
  void AdoptSharedPrefix(std::span<const int32_t> pages, PageAllocator& allocator);

  // Keeps positions [0, n): pages past ceil(n / page_size) are Unref'd,
  // num_tokens becomes min(num_tokens, n). For rollback (speculative
  // decoding) and trimming an over-reservation.
  // REQUIRES: n >= 0. Before positions >= n are written again, the page
  // holding position n - 1 must not be shared (refcount 1).
  void Truncate(int64_t n, PageAllocator& allocator);

  // Unrefs every page; the table becomes empty. Pages shared with another
  // owner stay in use until that owner releases them too.
  void Release(PageAllocator& allocator);

 private:
  int page_size_;
  std::vector<int32_t> pages_;
  int64_t num_tokens_ = 0;
};

}  // namespace strata

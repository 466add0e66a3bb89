// PageAllocator: the ids and refcounts of a fixed number of KV pages. No
// memory: KvPool owns the bytes; this owns only bookkeeping (vectors of ints).
//
// A page is free (refcount 0, on the free list) or used (refcount >= 1).
// Every owner of a page holds one reference: a request's page table, a radix
// tree node caching it. A prefix shared by two requests is one page with
// refcount 2, and it returns to the free list when the last owner Unrefs it.
//
// Prepare, then apply (llama.cpp's memory interface): CanAllocate(n) answers
// "does this fit?" without changing anything, and Allocate either hands out
// all n pages or fails with no side effect, so a scheduler can plan a batch
// and back off cleanly.
//
// Misuse (Ref/Unref of a free or out-of-range page) is a Strata bug and
// aborts via STRATA_CHECK; running out of pages is normal and is a Status.
//
// Not thread-safe: owned and used by the engine thread.
#pragma once

#include <cstdint>
#include <vector>

#include "util/status.h"

namespace strata {

class PageAllocator {
 public:
  // All num_pages pages start free. Allocation order is deterministic: a
  // fresh allocator hands out 0, 1, 2, ...; freed pages are reused last-in,
  // first-out (their memory is likely still warm).
  // REQUIRES: 0 <= num_pages <= kMaxKvPages.
  explicit PageAllocator(int64_t num_pages);

  PageAllocator(const PageAllocator&) = delete;
  PageAllocator& operator=(const PageAllocator&) = delete;
  PageAllocator(PageAllocator&&) = default;
  PageAllocator& operator=(PageAllocator&&) = default;

  // True iff Allocate(n) would succeed now. Changes nothing.
  bool CanAllocate(int64_t n) const { return n >= 0 && n <= num_free(); }

  // Appends n page ids, each with refcount 1, to *out. If fewer than n pages
  // are free, returns ResourceExhausted and changes neither the allocator
  // nor *out. n == 0 succeeds and appends nothing.
  // REQUIRES: n >= 0.
  Status Allocate(int64_t n, std::vector<int32_t>* out);

  // Adds an owner to a used page (sharing it).
  // REQUIRES: page is in range and used.
  void Ref(int32_t page);

  // Drops one owner; the page becomes free when its refcount reaches 0.
  // Returns true iff the page became free.
  // REQUIRES: page is in range and used.
  bool Unref(int32_t page);

  int64_t num_pages() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_pages() - num_free(); }
  // REQUIRES: page in range.
  int32_t refcount(int32_t page) const;

  // Verifies every invariant: refcounts are >= 0; the free list holds no
  // duplicate and no out-of-range id and is exactly the set of pages with
  // refcount 0; counts agree. O(num_pages). Returns Internal naming the first
  // broken invariant. Tests and the idle scheduler call it.
  Status CheckIntegrity() const;

 private:
  friend class PageAllocatorTestPeer;  // corrupts state to test CheckIntegrity

  std::vector<int32_t> refcount_;  // per page
  std::vector<int32_t> free_;      // stack of free page ids; back() goes next
};

}  // namespace strata

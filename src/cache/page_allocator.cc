#include "cache/page_allocator.h"

#include <string>

#include "cache/kv_layout.h"
#include "util/logging.h"

namespace strata {

PageAllocator::PageAllocator(int64_t num_pages) {
  STRATA_CHECK(num_pages >= 0 && num_pages <= kMaxKvPages) << "num_pages " << num_pages;
  refcount_.assign(static_cast<size_t>(num_pages), 0);
  free_.reserve(static_cast<size_t>(num_pages));
  // Highest id at the bottom of the stack so that page 0 goes out first.
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

Status PageAllocator::Allocate(int64_t n, std::vector<int32_t>* out) {
  STRATA_CHECK(n >= 0) << "Allocate(" << n << ")";
  if (n > num_free()) {
    return ResourceExhausted("KV cache out of pages: asked for " + std::to_string(n) + ", " +
                             std::to_string(num_free()) + " of " + std::to_string(num_pages()) +
                             " free; wait for requests to finish, or give the KV cache more memory");
  }
  out->reserve(out->size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    refcount_[p] = 1;
    out->push_back(p);
  }
  return OkStatus();
}

void PageAllocator::Ref(int32_t page) {
  STRATA_CHECK(page >= 0 && page < num_pages()) << "Ref of page " << page << " outside [0, " << num_pages() << ")";
  STRATA_CHECK(refcount_[page] > 0) << "Ref of free page " << page;
  ++refcount_[page];
}

bool PageAllocator::Unref(int32_t page) {
  STRATA_CHECK(page >= 0 && page < num_pages()) << "Unref of page " << page << " outside [0, " << num_pages()
                                                << ")";
  STRATA_CHECK(refcount_[page] > 0) << "Unref of free page " << page << " (double free)";
  if (--refcount_[page] > 0) return false;
  free_.push_back(page);
  return true;
}

int32_t PageAllocator::refcount(int32_t page) const {
  STRATA_CHECK(page >= 0 && page < num_pages()) << "page " << page;
  return refcount_[page];
}

Status PageAllocator::CheckIntegrity() const {
  const int64_t n = num_pages();
  if (num_free() > n) {
    return Internal("page allocator: " + std::to_string(num_free()) + " free pages but only " + std::to_string(n) +
                    " pages");
  }
  std::vector<char> on_free_list(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < free_.size(); ++i) {
    const int32_t p = free_[i];
    if (p < 0 || p >= n) {
      return Internal("page allocator: free list entry " + std::to_string(i) + " is page " + std::to_string(p) +
                      ", outside [0, " + std::to_string(n) + ")");
    }
    if (on_free_list[p]) return Internal("page allocator: page " + std::to_string(p) + " is twice on the free list");
    on_free_list[p] = 1;
    if (refcount_[p] != 0) {
      return Internal("page allocator: page " + std::to_string(p) + " is on the free list with refcount " +
                      std::to_string(refcount_[p]));
    }
  }
  for (int64_t p = 0; p < n; ++p) {
    if (refcount_[p] < 0) {
      return Internal("page allocator: page " + std::to_string(p) + " has negative refcount " +
                      std::to_string(refcount_[p]));
    }
    if (refcount_[p] == 0 && !on_free_list[p]) {
      return Internal("page allocator: page " + std::to_string(p) + " has refcount 0 but is not on the free list (leaked)");
    }
  }
  return OkStatus();
}

}  // namespace strata

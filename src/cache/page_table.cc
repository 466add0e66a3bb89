#include "cache/page_table.h"

#include <algorithm>

#include "util/logging.h"

namespace strata {

PageTable::PageTable(int page_size) : page_size_(page_size) {
  STRATA_CHECK(page_size >= 1) << "page_size " << page_size;
}

int64_t PageTable::PagesNeeded(int64_t total_tokens) const {
  const int64_t pages = (total_tokens + page_size_ - 1) / page_size_;
  return std::max<int64_t>(0, pages - static_cast<int64_t>(pages_.size()));
}

Status PageTable::Reserve(int64_t total_tokens, PageAllocator& allocator) {
  // Allocate leaves pages_ untouched on failure.
  return allocator.Allocate(PagesNeeded(total_tokens), &pages_);
}

void PageTable::SetNumTokens(int64_t n) {
  STRATA_CHECK(n >= 0 && n <= capacity()) << "SetNumTokens(" << n << ") with capacity " << capacity();
  num_tokens_ = n;
}

void PageTable::Slots(int64_t begin, int64_t end, int64_t* out) const {
  STRATA_CHECK(0 <= begin && begin <= end && end <= capacity())
      << "Slots(" << begin << ", " << end << ") with capacity " << capacity();
  for (int64_t pos = begin; pos < end; ++pos) *out++ = Slot(pos);
}

void PageTable::AdoptSharedPrefix(std::span<const int32_t> pages, PageAllocator& allocator) {
  STRATA_CHECK(pages_.empty() && num_tokens_ == 0) << "AdoptSharedPrefix into a non-empty page table";
  pages_.reserve(pages.size());
  for (int32_t p : pages) {
    allocator.Ref(p);
    pages_.push_back(p);
  }
  num_tokens_ = static_cast<int64_t>(pages_.size()) * page_size_;
}

void PageTable::Truncate(int64_t n, PageAllocator& allocator) {
  STRATA_CHECK(n >= 0) << "Truncate(" << n << ")";
  const size_t keep = static_cast<size_t>((n + page_size_ - 1) / page_size_);
  while (pages_.size() > keep) {
    allocator.Unref(pages_.back());
    pages_.pop_back();
  }
  num_tokens_ = std::min(num_tokens_, n);
}

void PageTable::Release(PageAllocator& allocator) {
  for (int32_t p : pages_) allocator.Unref(p);
  pages_.clear();
  num_tokens_ = 0;
}

}  // namespace strata

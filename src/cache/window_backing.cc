#include "cache/window_backing.h"

#include <string>

#include "cache/kv_layout.h"
#include "util/logging.h"

namespace strata {

WindowBacking::WindowBacking(int64_t num_page_ids, int64_t num_slots) : slots_(num_slots) {
  STRATA_CHECK(num_page_ids >= 0 && num_page_ids <= kMaxKvPages) << "num_page_ids " << num_page_ids;
  slot_of_.assign(static_cast<size_t>(num_page_ids), -1);
  page_of_.assign(static_cast<size_t>(num_slots), -1);
}

Status WindowBacking::Back(std::span<const int32_t> pages) {
  for (size_t i = 0; i < pages.size(); ++i) {
    const int32_t p = pages[i];
    STRATA_CHECK(slot(p) < 0) << "Back of page " << p << ", already backed by slot " << slot(p);
    for (size_t j = 0; j < i; ++j) STRATA_CHECK(pages[j] != p) << "Back of page " << p << " twice";
  }
  const int64_t n = static_cast<int64_t>(pages.size());
  if (!slots_.CanAllocate(n)) {
    return ResourceExhausted("KV cache out of window pages: asked for " + std::to_string(n) + ", " +
                             std::to_string(num_free_slots()) + " of " +
                             std::to_string(num_slots()) + " free");
  }
  std::vector<int32_t> got;
  got.reserve(pages.size());
  STRATA_CHECK(slots_.Allocate(n, &got).ok());
  for (size_t i = 0; i < pages.size(); ++i) {
    slot_of_[pages[i]] = got[i];
    page_of_[got[i]] = pages[i];
  }
  return OkStatus();
}

void WindowBacking::Release(int32_t page) {
  const int32_t s = slot(page);
  STRATA_CHECK(s >= 0) << "Release of page " << page << ", a tombstone (no window entries)";
  STRATA_CHECK(slots_.Unref(s));
  slot_of_[page] = -1;
  page_of_[s] = -1;
}

int32_t WindowBacking::slot(int32_t page) const {
  STRATA_CHECK(page >= 0 && page < num_page_ids())
      << "page " << page << " outside [0, " << num_page_ids() << ")";
  return slot_of_[page];
}

Status WindowBacking::CheckIntegrity() const {
  Status s = slots_.CheckIntegrity();
  if (!s.ok()) return Internal("window backing: slots: " + s.message());
  const int64_t n = num_page_ids(), m = num_slots();
  if (static_cast<int64_t>(page_of_.size()) != m) {
    return Internal("window backing: " + std::to_string(page_of_.size()) + " slot entries for " +
                    std::to_string(m) + " slots");
  }
  for (int64_t p = 0; p < n; ++p) {
    const int32_t sl = slot_of_[p];
    if (sl < -1 || sl >= m) {
      return Internal("window backing: page " + std::to_string(p) + " maps to slot " +
                      std::to_string(sl) + ", outside [-1, " + std::to_string(m) + ")");
    }
    if (sl >= 0 && page_of_[sl] != p) {
      return Internal("window backing: page " + std::to_string(p) + " maps to slot " +
                      std::to_string(sl) + ", which maps to page " + std::to_string(page_of_[sl]));
    }
  }
  for (int64_t sl = 0; sl < m; ++sl) {
    const int32_t p = page_of_[sl];
    const int32_t refs = slots_.refcount(static_cast<int32_t>(sl));
    const bool used = refs > 0;
    if (refs > 1) {
      return Internal("window backing: slot " + std::to_string(sl) + " has " + std::to_string(refs) +
                      " references (one page per slot)");
    }
    if (p < -1 || p >= n) {
      return Internal("window backing: slot " + std::to_string(sl) + " maps to page " +
                      std::to_string(p) + ", outside [-1, " + std::to_string(n) + ")");
    }
    if (used != (p >= 0)) {
      return Internal("window backing: slot " + std::to_string(sl) + (used ? " is held" : " is free") +
                      " but maps to " + (p >= 0 ? "page " + std::to_string(p) : "no page"));
    }
    if (p >= 0 && slot_of_[p] != sl) {
      return Internal("window backing: slot " + std::to_string(sl) + " maps to page " +
                      std::to_string(p) + ", which maps to slot " + std::to_string(slot_of_[p]));
    }
  }
  return OkStatus();
}

}  // namespace strata

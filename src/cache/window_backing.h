// WindowBacking: the physical pages of a layout's windowed pool groups
// (PoolGroupSpec::sliding_window > 0) behind the one page-id space.
//
// A page id names the same token range in every group (kv_layout.h), but a
// windowed group needs a page's entries only while somebody may still
// attend to them: a running request while the page is inside its window, the
// radix tree while a prefix match may end less than a window after it. So
// the windowed groups get fewer physical pages (slots) than there are page
// ids, and every page id is either
//   - backed: one slot holds its entries in every windowed group (slot s is
//     page s of each windowed group's buffer), or
//   - a tombstone: its windowed entries are gone; its other groups' pages
//     are untouched, so a prefix ending at least a window after it is
//     still whole (cache.md "Pool groups for DeepSeek V4", point 2).
//
// Who may tombstone a page (cache.md point 2; the engine's scheduler
// decides, this class only keeps the map): a running request drops the
// pages it alone holds as they leave its window; pages shared with the
// radix tree or another request stay backed until the slots run out, then
// the scheduler reclaims slots of page ids that are free in the
// PageAllocator first, then of pages no running request's window needs.
// So a backed page id may be free (its slot is garbage to collect) and a
// tombstone may be in use (its other groups still hold tokens).
//
// Prepare, then apply, as PageAllocator: CanBack(n) changes nothing; Back()
// backs every page given or none. Misuse (releasing a tombstone, backing a
// backed page, an id out of range) is a Strata bug and aborts via
// STRATA_CHECK; running out of slots is a Status.
//
// Not thread-safe: owned and used by the engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/page_allocator.h"
#include "util/status.h"

namespace strata {

class WindowBacking {
 public:
  // Page ids [0, num_page_ids), all tombstones; num_slots slots, all free.
  // Slots go out 0, 1, 2, ... and are reused last-in, first-out.
  // REQUIRES: 0 <= num_slots, num_page_ids <= kMaxKvPages.
  WindowBacking(int64_t num_page_ids, int64_t num_slots);

  WindowBacking(const WindowBacking&) = delete;
  WindowBacking& operator=(const WindowBacking&) = delete;
  WindowBacking(WindowBacking&&) = default;
  WindowBacking& operator=(WindowBacking&&) = default;

  // True iff Back() of n pages would succeed now. Changes nothing.
  bool CanBack(int64_t n) const { return slots_.CanAllocate(n); }

  // Gives each page a slot. If fewer slots than pages are free, returns
  // ResourceExhausted and changes nothing.
  // REQUIRES: each page in range, unbacked, and given once.
  Status Back(std::span<const int32_t> pages);

  // Frees the page's slot: the page becomes a tombstone.
  // REQUIRES: page backed.
  void Release(int32_t page);

  // The page's slot, or -1 for a tombstone. REQUIRES: page in range.
  int32_t slot(int32_t page) const;
  bool backed(int32_t page) const { return slot(page) >= 0; }
  // slot(p) for every page id p, indexed by page id: what the engine maps
  // a sequence's page table through for the windowed groups' attention.
  const std::vector<int32_t>& slot_of_page() const { return slot_of_; }
  // The page each slot backs, -1 when free, indexed by slot: the
  // candidates when slots must be reclaimed.
  const std::vector<int32_t>& page_of_slot() const { return page_of_; }

  int64_t num_page_ids() const { return static_cast<int64_t>(slot_of_.size()); }
  int64_t num_slots() const { return slots_.num_pages(); }
  int64_t num_free_slots() const { return slots_.num_free(); }

  // Verifies every invariant: the slot allocator's own (a used slot has
  // exactly one reference); a backed page's slot is in use and maps back to
  // it (slot -> page is a bijection on the used slots); a free slot maps to
  // no page. O(num_page_ids + num_slots). Returns Internal naming the first
  // broken one.
  Status CheckIntegrity() const;

 private:
  friend class WindowBackingTestPeer;  // corrupts state to test CheckIntegrity

  PageAllocator slots_;           // slot ids (refcount 1 while backing a page)
  std::vector<int32_t> slot_of_;  // per page id: its slot, or -1
  std::vector<int32_t> page_of_;  // per slot: its page id, or -1 when free
};

// The first page index of a sequence's page list that any token from
// position `next_pos` on may still attend to in a group of window
// `window` (> 0): the next token attends to [next_pos - window + 1,
// next_pos], so pages before index (next_pos - window + 1) / page_size can
// be dropped (0 while the window reaches the start).
// REQUIRES: next_pos >= 0, window >= 1, page_size >= 1.
inline int64_t FirstPageInWindow(int64_t next_pos, int64_t window, int64_t page_size) {
  const int64_t first_pos = next_pos - window + 1;
  return first_pos <= 0 ? 0 : first_pos / page_size;
}

}  // namespace strata

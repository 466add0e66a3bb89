// Page ops: turning "these KV pages of the sender's pool go to those pages
// of the receiver's pool" into the byte-range WriteOps a KvTransport moves.
//
// Both pools are laid out as cache/kv_layout.h says (KvPoolMemory): group g
// is one buffer [layer][K, V][page][...], so (group, layer, tensor, page) is
// one contiguous run of BytesPerPagePerTensor(g) bytes at
//   ((layer * T + tensor) * num_pages + page) * BytesPerPagePerTensor(g)
// with T = 2 (K and V) or 1 (K only). The two pools share the layout (the
// caller checked it: bootstrap's Hello) but not their page counts, so the
// same (group, layer, tensor, page) sits at different offsets on each side.
// Each group's buffer is registered as one region, groups in order, starting
// at PoolRegions::first_region.
//
// Runs where consecutive source pages map to consecutive destination pages
// become one op per (group, layer, tensor): fewer, larger puts.
//
// Pure functions on values; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/kv_layout.h"
#include "disagg/kv_transport.h"
#include "util/status.h"

namespace strata::disagg {

// One side's pool as the transport sees it.
struct PoolRegions {
  int64_t num_pages = 0;      // pages in this side's pool (every group)
  RegionId first_region = 0;  // region of group 0; group g is first_region + g
};

// Byte offset of (group g, layer, tensor, page) in group g's buffer of a
// pool of `num_pages` pages. The one formula; KvPoolMemory::PagePtr agrees.
// REQUIRES: indices in range.
uint64_t PageRunOffset(const KvLayout& layout, int64_t num_pages, int g, int layer, int tensor,
                       int64_t page);

// The pages that bytes [offset, offset + length) of group g's buffer (a
// pool of `num_pages` pages) belong to, each once, ascending: the inverse of
// PageRunOffset, for a receiver checking what a write touches. Empty for
// length 0. InvalidArgument for a group out of range or a range past the
// buffer's end.
StatusOr<std::vector<int32_t>> PagesOfRange(const KvLayout& layout, int64_t num_pages, int g,
                                            uint64_t offset, uint64_t length);

// The ops that copy src_pages[i] of the sender's pool to dst_pages[i] of the
// receiver's pool, in every group, layer and tensor. Ordered by group, layer,
// tensor, then position in the page lists; merged where both sides advance
// by one page. Fails with InvalidArgument (naming the bad page and its
// index) when the lists differ in length, a page is outside its pool, or a
// destination page appears twice (two sources would race for it), and when
// the layout is invalid.
StatusOr<std::vector<WriteOp>> PageWriteOps(const KvLayout& layout, const PoolRegions& src,
                                            const PoolRegions& dst,
                                            std::span<const int32_t> src_pages,
                                            std::span<const int32_t> dst_pages);

}  // namespace strata::disagg

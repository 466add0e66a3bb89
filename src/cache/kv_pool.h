// KvPool: the memory of the paged KV cache on one backend, plus the
// allocator of its page ids.
//
// Memory: one backend Buffer per pool group, laid out
//   [layer][K, V][page][offset in page][kv_head][head_dim]
// so that every (group, layer, tensor) is one contiguous region of
// num_pages pages and each page of it is one contiguous run of
// KvLayout::BytesPerPagePerTensor(g) bytes: the unit the host tier and PD
// transfer copy. Layer(g, l) is the view the backend's StoreKv and
// PagedAttention take. All groups share one page-index space (kv_layout.h).
//
// Ownership: KvPool owns the buffers and the PageAllocator; views and page
// ids stay valid for the pool's lifetime. The memory is not zeroed: a slot
// is read only after StoreKv wrote it.
//
// Not thread-safe: owned and used by the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_layout.h"
#include "cache/page_allocator.h"
#include "util/status.h"

namespace strata {

class KvPool {
 public:
  // Validates the layout and allocates num_pages pages of every group via
  // backend.Allocate. Fails with InvalidArgument for a bad layout or page
  // count, or with the backend's error (annotated with the group and size)
  // when memory runs out; nothing stays allocated on failure.
  // REQUIRES: backend outlives the pool (its buffers are freed by it).
  static StatusOr<std::unique_ptr<KvPool>> Create(const KvLayout& layout, int64_t num_pages, Backend& backend);

  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int page_size() const { return layout_.page_size; }
  int64_t num_pages() const { return allocator_.num_pages(); }
  int num_groups() const { return static_cast<int>(layout_.groups.size()); }

  PageAllocator& allocator() { return allocator_; }
  const PageAllocator& allocator() const { return allocator_; }

  // The K/V pages of one layer of one group (v is null when the group has no
  // V). REQUIRES: 0 <= group < num_groups(), 0 <= layer < its num_layers.
  KvLayerView Layer(int group, int layer) const;

  // Base pointers of every group, for batched page copies (KvPoolMemory).
  KvPoolMemory memory() const;

  // Bytes of device memory the pool holds, all groups.
  size_t total_bytes() const;

 private:
  KvPool(const KvLayout& layout, int64_t num_pages);

  KvLayout layout_;
  PageAllocator allocator_;
  std::vector<Buffer> buffers_;  // one per group
};

}  // namespace strata

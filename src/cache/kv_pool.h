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
// Windowed groups (PoolGroupSpec::sliding_window > 0) may be backed by
// fewer pages than there are page ids (cache/window_backing.h): then their
// buffers hold num_window_slots pages, addressed by slot instead of page id,
// and window_backing() maps one to the other; every other group (and every
// group without a backing) is addressed by page id.
//
// Ownership: KvPool owns the buffers, the PageAllocator and the window
// backing; views and page ids stay valid for the pool's lifetime. The memory is not zeroed: a slot
// is read only after StoreKv wrote it.
//
// Where the bytes come from: the backend's Allocate, or a KvPoolAllocator
// the creator passes (PD: memory the KV transport allocated, so a peer on
// the same host writes the pages directly; the pool knows nothing of the
// transport, only this seam).
//
// Not thread-safe: owned and used by the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_layout.h"
#include "cache/page_allocator.h"
#include "cache/window_backing.h"
#include "util/status.h"

namespace strata {

// One pool group's memory from a KvPoolAllocator. `owner` keeps the memory
// alive: the pool drops it when it is destroyed, and whatever it holds
// (e.g. the allocating object) frees the bytes then.
struct KvPoolBlock {
  void* data = nullptr;  // 64-byte aligned, `bytes` long
  size_t bytes = 0;
  std::shared_ptr<void> owner;
};

// A source of KV pool memory other than the backend. REQUIRES: the memory
// is host memory the backend's ops can use (the CPU backend; a GPU backend
// needs its own device memory). Called only while a pool is created, on the
// creating thread.
class KvPoolAllocator {
 public:
  virtual ~KvPoolAllocator() = default;
  // At least `bytes` for pool group `group` (0, 1, ... in order), or the
  // allocator's error (the pool annotates it with the group and size).
  virtual StatusOr<KvPoolBlock> Allocate(int group, size_t bytes) = 0;
  // For messages: what the memory is ("ucx transport (sysv shared memory)").
  virtual std::string Describe() const = 0;
};

class KvPool {
 public:
  // Validates the layout and allocates num_pages pages of every group via
  // `allocator` when given, else backend.Allocate. With num_window_slots >=
  // 0 and a layout that has windowed groups, those groups get
  // num_window_slots pages and a WindowBacking (in [1, num_pages]: at least
  // one window must fit); -1: no backing, every group num_pages. Fails with
  // InvalidArgument for a bad layout, page or slot count, or with the
  // allocator's or backend's error (annotated with the group and size) when
  // memory runs out; nothing stays allocated on failure.
  // REQUIRES: backend outlives the pool (its buffers are freed by it).
  static StatusOr<std::unique_ptr<KvPool>> Create(const KvLayout& layout, int64_t num_pages, Backend& backend,
                                                  KvPoolAllocator* allocator = nullptr,
                                                  int64_t num_window_slots = -1);

  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int page_size() const { return layout_.page_size; }
  int64_t num_pages() const { return allocator_.num_pages(); }
  int num_groups() const { return static_cast<int>(layout_.groups.size()); }

  PageAllocator& allocator() { return allocator_; }
  const PageAllocator& allocator() const { return allocator_; }
  // The windowed groups' backing, or null (none: they are addressed by
  // page id like every group).
  WindowBacking* window_backing() { return backing_.get(); }
  const WindowBacking* window_backing() const { return backing_.get(); }
  // Pages group g's buffer holds: num_window_slots for a backed windowed
  // group, else num_pages().
  int64_t GroupPages(int group) const;
  // True when group g is addressed through window_backing().
  bool Windowed(int group) const;

  // The K/V pages of one layer of one group (v is null when the group has no
  // V). REQUIRES: 0 <= group < num_groups(), 0 <= layer < its num_layers.
  KvLayerView Layer(int group, int layer) const;

  // Base pointers of every group, for batched page copies (KvPoolMemory,
  // which addresses every group by page id). REQUIRES: no window backing
  // (the host tier and PD transfer run with every group per page id).
  KvPoolMemory memory() const;

  // Bytes of device memory the pool holds, all groups.
  size_t total_bytes() const;

  // Describe() of the allocator the memory came from, or the backend's
  // Name() ("cpu").
  const std::string& memory_source() const { return memory_source_; }

 private:
  KvPool(const KvLayout& layout, int64_t num_pages);

  KvLayout layout_;
  PageAllocator allocator_;
  std::unique_ptr<WindowBacking> backing_;  // null: none
  std::vector<KvPoolBlock> blocks_;         // one per group
  std::string memory_source_;
};

}  // namespace strata

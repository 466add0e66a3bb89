// HostKvPool: the host tier of HiCache (docs/architecture/hicache.md). Host
// memory in the device KvPool's layout, one anonymous mapping per pool group
//   [layer][K, V][page][offset in page][kv_head][head_dim]
// so a (group, layer, tensor, page) run has the same size and shape on both
// sides and a page copy is one block each way (KvPoolMemory), plus the
// PageAllocator of host page ids.
//
// Placement: with a NUMA node, each mapping is bound to it (mbind MPOL_BIND)
// before anything touches it, so every page the kernel later faults in
// comes from that node (or the fault fails: the plan in hicache_plan checked
// the node's free memory first). Transparent huge pages are requested
// (best effort). The memory is NOT pre-touched: the host tier fills, and
// RSS grows, as backups land in it. Exception: PinHostMemory on a GPU
// (cudaHostRegister) locks, and so faults in, every page at Create.
//
// Ownership: the pool owns its mappings and unpins (with the backend given
// to Create) and unmaps them on destruction.
//
// Not thread-safe: owned by the engine thread. The bytes are read and
// written by the cache controller's copies while the pool lives; page ids
// (allocator) are the engine's only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_layout.h"
#include "cache/page_allocator.h"
#include "util/status.h"

namespace strata {

class HostKvPool {
 public:
  // Maps num_pages pages of every group of `layout`, binds them to
  // numa_node (-1: no binding, the process's default policy), and pins them
  // with pin_with when it is not null. Errors (nothing stays mapped or
  // pinned): InvalidArgument for a bad layout, page count or node (binding
  // failed: the message names the node and the online nodes);
  // ResourceExhausted naming the group and its bytes when a mapping fails;
  // the backend's error, annotated with the group, when pinning fails.
  // REQUIRES: pin_with, when given, outlives the pool.
  static StatusOr<std::unique_ptr<HostKvPool>> Create(const KvLayout& layout, int64_t num_pages,
                                                      int numa_node, Backend* pin_with);
  ~HostKvPool();
  HostKvPool(const HostKvPool&) = delete;
  HostKvPool& operator=(const HostKvPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t num_pages() const { return allocator_.num_pages(); }
  int numa_node() const { return numa_node_; }
  bool pinned() const { return pin_with_ != nullptr; }

  PageAllocator& allocator() { return allocator_; }
  const PageAllocator& allocator() const { return allocator_; }

  // Base pointers of every group (valid while the pool lives).
  KvPoolMemory memory() const;

  // Bytes mapped, all groups (virtual: see "not pre-touched" above).
  size_t total_bytes() const;

 private:
  HostKvPool(const KvLayout& layout, int64_t num_pages, int numa_node, Backend* pin_with);

  struct Region {
    char* base = nullptr;
    size_t bytes = 0;
    bool pinned = false;
  };

  KvLayout layout_;
  PageAllocator allocator_;
  int numa_node_;
  Backend* pin_with_;
  std::vector<Region> regions_;  // one per group
};

}  // namespace strata

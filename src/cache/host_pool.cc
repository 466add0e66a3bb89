#include "cache/host_pool.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "util/host_memory.h"

namespace strata {
namespace {

std::string OnlineNodes() {
  std::ifstream in("/sys/devices/system/node/online");
  std::string s;
  if (!std::getline(in, s) || s.empty()) return "unknown (no /sys/devices/system/node/online)";
  return s;
}

// Binds [p, p + bytes) to `node` before first touch (util/host_memory.h).
Status BindToNode(void* p, size_t bytes, int node, const std::string& what) {
  Status st = BindToNumaNode(p, bytes, node);
  if (st.ok()) return st;
  return InvalidArgument("cannot bind " + what + " to NUMA node " + std::to_string(node) + ": " +
                         st.message() + "; the online nodes are " + OnlineNodes() +
                         ": pass --numa-node with one of those, or leave it unset");
}

}  // namespace

HostKvPool::HostKvPool(const KvLayout& layout, int64_t num_pages, int numa_node, Backend* pin_with)
    : layout_(layout), allocator_(num_pages), numa_node_(numa_node), pin_with_(pin_with) {}

HostKvPool::~HostKvPool() {
  for (const Region& r : regions_) {
    if (r.pinned) pin_with_->UnpinHostMemory(r.base);
    munmap(r.base, r.bytes);
  }
}

StatusOr<std::unique_ptr<HostKvPool>> HostKvPool::Create(const KvLayout& layout, int64_t num_pages,
                                                         int numa_node, Backend* pin_with) {
  RETURN_IF_ERROR(layout.Validate());
  if (num_pages < 1 || num_pages > kMaxKvPages) {
    return InvalidArgument("host KV pool page count " + std::to_string(num_pages) +
                           " must be in [1, " + std::to_string(kMaxKvPages) + "]");
  }
  if (numa_node < -1 || numa_node >= 1024) {  // Linux: CONFIG_NODES_SHIFT <= 10
    return InvalidArgument("host KV pool NUMA node " + std::to_string(numa_node) +
                           " does not exist; use -1 for no binding or one of the online nodes (" +
                           OnlineNodes() + ")");
  }
  std::unique_ptr<HostKvPool> pool(new HostKvPool(layout, num_pages, numa_node, pin_with));
  // On any error below, `pool`'s destructor unpins and unmaps what exists.
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const size_t bytes = layout.BytesPerPage(static_cast<int>(g)) * static_cast<size_t>(num_pages);
    const std::string what = "host KV pool group \"" + layout.groups[g].name + "\" (" +
                             std::to_string(num_pages) + " pages, " + std::to_string(bytes) +
                             " bytes)";
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return ResourceExhausted("cannot map " + what + ": mmap: " + std::strerror(err) +
                               "; lower --hicache-ratio or --hicache-size");
    }
    pool->regions_.push_back(Region{static_cast<char*>(p), bytes, false});
    if (numa_node >= 0) RETURN_IF_ERROR(BindToNode(p, bytes, numa_node, what));
    // Fewer TLB misses while copying and fewer pages to pin; fine without.
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    if (pin_with) {
      RETURN_IF_ERROR(pin_with->PinHostMemory(p, bytes).Annotate("pinning " + what));
      pool->regions_.back().pinned = true;
    }
  }
  return pool;
}

KvPoolMemory HostKvPool::memory() const {
  KvPoolMemory m;
  m.layout = &layout_;
  m.num_pages = num_pages();
  for (const Region& r : regions_) m.group_base.push_back(r.base);
  return m;
}

size_t HostKvPool::total_bytes() const {
  size_t total = 0;
  for (const Region& r : regions_) total += r.bytes;
  return total;
}

}  // namespace strata

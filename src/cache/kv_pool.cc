#include "cache/kv_pool.h"

#include <cstdint>
#include <string>

#include "util/logging.h"

namespace strata {

KvPool::KvPool(const KvLayout& layout, int64_t num_pages) : layout_(layout), allocator_(num_pages) {}

StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvLayout& layout, int64_t num_pages, Backend& backend,
                                                  KvPoolAllocator* allocator, int64_t num_window_slots) {
  RETURN_IF_ERROR(layout.Validate());
  if (num_pages < 1 || num_pages > kMaxKvPages) {
    return InvalidArgument("KV pool page count " + std::to_string(num_pages) + " must be in [1, " +
                           std::to_string(kMaxKvPages) + "]; size it with NumKvPagesForBytes/ForTokens");
  }
  std::unique_ptr<KvPool> pool(new KvPool(layout, num_pages));
  if (num_window_slots >= 0 && layout.MaxSlidingWindow() > 0) {
    if (num_window_slots < 1 || num_window_slots > num_pages) {
      return InvalidArgument("KV pool window pages " + std::to_string(num_window_slots) +
                             " must be in [1, " + std::to_string(num_pages) + "] (the page count)");
    }
    pool->backing_ = std::make_unique<WindowBacking>(num_pages, num_window_slots);
  }
  auto source = [&] { return allocator != nullptr ? allocator->Describe() : backend.Name(); };
  for (int g = 0; g < pool->num_groups(); ++g) {
    const int64_t group_pages = pool->GroupPages(g);
    const size_t bytes = layout.BytesPerPage(g) * static_cast<size_t>(group_pages);
    StatusOr<KvPoolBlock> block = Internal("unset");
    if (allocator != nullptr) {
      block = allocator->Allocate(g, bytes);
      if (block.ok() && (block->data == nullptr || block->bytes < bytes ||
                         reinterpret_cast<uintptr_t>(block->data) % 64 != 0))
        block = Internal("the allocator returned " + std::to_string(block->bytes) +
                         " bytes, null or not 64-byte aligned");
    } else {
      StatusOr<Buffer> buf = backend.Allocate(bytes);
      if (buf.ok()) {
        auto held = std::make_shared<Buffer>(std::move(buf).value());
        block = KvPoolBlock{held->data(), held->bytes(), held};
      } else {
        block = buf.status();
      }
    }
    if (!block.ok()) {
      // Blocks of earlier groups free themselves with `pool`.
      return block.status().Annotate("allocating KV pool group \"" + layout.groups[g].name + "\" (" +
                                     std::to_string(group_pages) + " pages, " + std::to_string(bytes) + " bytes on " +
                                     source() + ")");
    }
    pool->blocks_.push_back(std::move(block).value());
  }
  pool->memory_source_ = source();  // after the blocks: an allocator may say what it got
  return pool;
}

bool KvPool::Windowed(int group) const {
  STRATA_CHECK(group >= 0 && group < num_groups()) << "KV pool group " << group << " of " << num_groups();
  return backing_ != nullptr && layout_.groups[group].sliding_window > 0;
}

int64_t KvPool::GroupPages(int group) const {
  return Windowed(group) ? backing_->num_slots() : num_pages();
}

KvLayerView KvPool::Layer(int group, int layer) const {
  STRATA_CHECK(group >= 0 && group < num_groups()) << "KV pool group " << group << " of " << num_groups();
  const PoolGroupSpec& s = layout_.groups[group];
  STRATA_CHECK(layer >= 0 && layer < s.num_layers) << "layer " << layer << " of group " << s.name;
  const size_t tensor_bytes = layout_.BytesPerPagePerTensor(group) * static_cast<size_t>(GroupPages(group));
  const int tensors = s.has_v ? 2 : 1;
  char* base = static_cast<char*>(blocks_[group].data) + static_cast<size_t>(layer) * tensors * tensor_bytes;
  KvLayerView view;
  view.k = base;
  view.v = s.has_v ? base + tensor_bytes : nullptr;
  view.dtype = s.dtype;
  view.page_size = layout_.page_size;
  view.num_kv_heads = s.num_kv_heads;
  view.head_dim = s.head_dim;
  view.num_pages = GroupPages(group);
  view.tokens_per_entry = s.tokens_per_entry;
  return view;
}

KvPoolMemory KvPool::memory() const {
  STRATA_CHECK(backing_ == nullptr) << "KvPool::memory() of a pool with a window backing";
  KvPoolMemory m;
  m.layout = &layout_;
  m.num_pages = num_pages();
  for (const KvPoolBlock& b : blocks_) m.group_base.push_back(static_cast<char*>(b.data));
  return m;
}

size_t KvPool::total_bytes() const {
  size_t total = 0;
  for (const KvPoolBlock& b : blocks_) total += b.bytes;
  return total;
}

}  // namespace strata

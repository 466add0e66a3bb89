// Layout descriptors of the paged KV cache: how many bytes one page holds in
// each pool group, and sizing of the pool from an operator's budget.
//
// A *pool group* is a set of layers with one per-token layout (kv heads,
// head dim, dtype, K and V or K only). A plain GQA model has one group; later
// models add groups (sliding-window layers, an MLA latent cache, indexer
// caches). Nothing in cache/ knows which model declared them: the radix tree,
// host tier, PD transfer and metrics work from these descriptors only.
//
// Page-index space (design choice of this version): every group shares ONE
// page-index space. Page id p names tokens [p * page_size, (p + 1) *
// page_size) of a sequence in every group at once, so a request has one page
// table, the radix tree stores one list of page ids per node, and PD transfer
// and offload address every group from the same ids. A windowed group
// (sliding_window > 0) may be backed by fewer physical pages than there are
// ids, so its out-of-window pages are reused (cache/window_backing.h,
// KvPool; docs/architecture/cache.md "Pool groups for DeepSeek V4").
//
// Plain values; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/dtype.h"
#include "util/status.h"

namespace strata {

struct PoolGroupSpec {
  std::string name;  // e.g. "full_attention"; unique within a layout
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kBF16;  // kF32, kF16 or kBF16
  // false: one tensor per layer (an MLA latent: K only, KvLayerView::v is
  // null). true: K and V per layer.
  bool has_v = true;
  // > 0: the group's layers attend to at most the last sliding_window tokens
  // (their older pages can be reused: see the page-index note above).
  int sliding_window = 0;
  // Tokens one entry of the group stands for (>= 1). 1: one entry per token
  // (every group of a plain model). r > 1: one entry per window of r tokens
  // (a compressed-attention summary of tokens [e * r, (e + 1) * r)); entry e
  // lives in the page of its window's last token, at offset
  // ((e + 1) * r - 1) % page_size / r, so a page of page_size tokens holds
  // ceil(page_size / r) entries (one, used by one page in r / page_size,
  // when r > page_size). Pages stay one index space with every other group.
  int tokens_per_entry = 1;

  // Entries one page of page_size tokens holds: ceil(page_size / tokens_per_entry).
  int64_t EntriesPerPage(int page_size) const {
    return (int64_t{page_size} + tokens_per_entry - 1) / tokens_per_entry;
  }
  // Elements of one entry (a token when tokens_per_entry is 1) in one
  // layer's K (and V, same shape).
  int64_t ElementsPerTokenPerTensor() const { return int64_t{num_kv_heads} * head_dim; }
  // Bytes one entry occupies in one layer: K plus V (2 * kv_heads * head_dim
  // * dtype size), or K only when !has_v.
  size_t BytesPerTokenPerLayer() const {
    return (has_v ? 2 : 1) * static_cast<size_t>(ElementsPerTokenPerTensor()) * DTypeSize(dtype);
  }
};

struct KvLayout {
  int page_size = 1;  // tokens per page, >= 1
  std::vector<PoolGroupSpec> groups;

  // Returns every problem with the layout in one message (page_size < 1, no
  // groups, a group without layers/heads/head_dim, a non-float dtype, a
  // duplicate name), or OK.
  Status Validate() const;

  // Bytes of one page of one layer's K tensor (V is the same size) in group g:
  // EntriesPerPage(page_size) * kv_heads * head_dim * dtype size (entries are
  // tokens unless the group's tokens_per_entry > 1). The unit of page copies.
  // REQUIRES: 0 <= g < groups.size().
  size_t BytesPerPagePerTensor(int g) const;
  // Bytes of one page across all layers (K and V) of group g.
  size_t BytesPerPage(int g) const;
  // Bytes of one page across every group: the cost of one page id.
  size_t BytesPerPage() const;
  // Bytes one token costs across every group and layer (BytesPerPage() /
  // page_size, rounded down: groups of tokens_per_entry > 1 cost a page's
  // entries spread over its tokens).
  size_t BytesPerToken() const;
  // The largest sliding_window of any group, 0 when no group is windowed:
  // the tokens back from the next one that any windowed group may read.
  int MaxSlidingWindow() const {
    int w = 0;
    for (const PoolGroupSpec& g : groups) w = g.sliding_window > w ? g.sliding_window : w;
    return w;
  }
  // "full_attention: 28 layers x 2 x 4 kv heads x 128 x BF16; ..." for logs
  // and error messages.
  std::string Describe() const;
};

// Where the pages of one pool live (the device KvPool or a HostKvPool): one
// base pointer per group, each laid out [layer][K, V][page][offset in
// page][kv_head][head_dim], so (group, layer, tensor, page) is one contiguous
// run of BytesPerPagePerTensor(group) bytes: the unit of host/device copies,
// storage files and PD transfer. Non-owning; valid while the pool lives.
struct KvPoolMemory {
  const KvLayout* layout = nullptr;
  int64_t num_pages = 0;
  std::vector<char*> group_base;  // one per layout->groups entry

  // Start of page `page` of tensor `tensor` (0 = K, 1 = V) of `layer` in
  // group g. REQUIRES: indices in range (tensor 1 only when the group has V).
  char* PagePtr(int g, int layer, int tensor, int64_t page) const;
};

// Largest page count the allocator supports: page ids are int32 and slot ids
// (page * page_size + offset) must fit int64.
inline constexpr int64_t kMaxKvPages = int64_t{1} << 30;

// Pages that fit in `bytes` of memory (rounded down). Fails with
// ResourceExhausted when the budget holds no page, InvalidArgument when the
// layout is invalid or the result exceeds kMaxKvPages.
StatusOr<int64_t> NumKvPagesForBytes(const KvLayout& layout, uint64_t bytes);

// Pages for a token budget (--max-total-tokens). Rounds DOWN to whole pages,
// like SGLang: a cap the operator set is never exceeded. Fails with
// InvalidArgument when tokens <= 0, when the budget is smaller than one page,
// or when the page count exceeds kMaxKvPages.
StatusOr<int64_t> NumKvPagesForTokens(const KvLayout& layout, int64_t max_total_tokens);

}  // namespace strata

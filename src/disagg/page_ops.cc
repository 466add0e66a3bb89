#include "disagg/page_ops.h"

#include <algorithm>
#include <string>
#include <utility>

namespace strata::disagg {

uint64_t PageRunOffset(const KvLayout& layout, int64_t num_pages, int g, int layer, int tensor,
                       int64_t page) {
  const PoolGroupSpec& s = layout.groups[static_cast<size_t>(g)];
  const uint64_t tensors = s.has_v ? 2 : 1;
  const uint64_t run = layout.BytesPerPagePerTensor(g);
  return ((static_cast<uint64_t>(layer) * tensors + static_cast<uint64_t>(tensor)) *
              static_cast<uint64_t>(num_pages) +
          static_cast<uint64_t>(page)) *
         run;
}

StatusOr<std::vector<int32_t>> PagesOfRange(const KvLayout& layout, int64_t num_pages, int g,
                                            uint64_t offset, uint64_t length) {
  if (g < 0 || static_cast<size_t>(g) >= layout.groups.size())
    return InvalidArgument("no pool group " + std::to_string(g) + " (" +
                           std::to_string(layout.groups.size()) + " in the layout)");
  const PoolGroupSpec& s = layout.groups[static_cast<size_t>(g)];
  const uint64_t run = layout.BytesPerPagePerTensor(g);
  const uint64_t runs = static_cast<uint64_t>(s.num_layers) * (s.has_v ? 2 : 1) *
                        static_cast<uint64_t>(num_pages);
  if (run == 0 || num_pages <= 0 || offset > runs * run || length > runs * run - offset)
    return InvalidArgument("[" + std::to_string(offset) + ", +" + std::to_string(length) +
                           ") is outside group " + std::to_string(g) + "'s " +
                           std::to_string(runs * run) + " bytes");
  std::vector<int32_t> pages;
  if (length == 0) return pages;
  const uint64_t first = offset / run, last = (offset + length - 1) / run;
  const uint64_t n = static_cast<uint64_t>(num_pages);
  if (last - first + 1 >= n) {
    // Every page (the range spans a whole [layer][tensor] slice).
    pages.resize(static_cast<size_t>(n));
    for (uint64_t p = 0; p < n; ++p) pages[p] = static_cast<int32_t>(p);
    return pages;
  }
  // Consecutive runs are consecutive pages, wrapping at most once.
  for (uint64_t i = first; i <= last; ++i) pages.push_back(static_cast<int32_t>(i % n));
  std::sort(pages.begin(), pages.end());
  return pages;
}

namespace {

Status CheckPages(std::span<const int32_t> pages, int64_t num_pages, const char* side) {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || pages[i] >= num_pages) {
      return InvalidArgument(std::string(side) + " page " + std::to_string(pages[i]) + " (index " +
                             std::to_string(i) + ") is outside the " + side + "'s pool of " +
                             std::to_string(num_pages) + " pages");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<WriteOp>> PageWriteOps(const KvLayout& layout, const PoolRegions& src,
                                            const PoolRegions& dst,
                                            std::span<const int32_t> src_pages,
                                            std::span<const int32_t> dst_pages) {
  RETURN_IF_ERROR(layout.Validate().Annotate("KV page transfer"));
  if (src_pages.size() != dst_pages.size()) {
    return InvalidArgument("KV page transfer: " + std::to_string(src_pages.size()) +
                           " source pages but " + std::to_string(dst_pages.size()) +
                           " destination pages (they pair up one to one)");
  }
  RETURN_IF_ERROR(CheckPages(src_pages, src.num_pages, "sender"));
  RETURN_IF_ERROR(CheckPages(dst_pages, dst.num_pages, "receiver"));
  {
    std::vector<std::pair<int32_t, size_t>> sorted(dst_pages.size());
    for (size_t i = 0; i < dst_pages.size(); ++i) sorted[i] = {dst_pages[i], i};
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i].first == sorted[i - 1].first) {
        return InvalidArgument(
            "KV page transfer: receiver page " + std::to_string(sorted[i].first) +
            " appears twice (indices " + std::to_string(sorted[i - 1].second) + " and " +
            std::to_string(sorted[i].second) + "); each destination page takes one source page");
      }
    }
  }

  // Runs [begin, end) of positions where both sides advance by one page.
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < src_pages.size();) {
    size_t j = i + 1;
    while (j < src_pages.size() && src_pages[j] == src_pages[j - 1] + 1 &&
           dst_pages[j] == dst_pages[j - 1] + 1) {
      ++j;
    }
    runs.emplace_back(i, j);
    i = j;
  }

  std::vector<WriteOp> ops;
  for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
    const int g = static_cast<int>(gi);
    const PoolGroupSpec& s = layout.groups[gi];
    const int tensors = s.has_v ? 2 : 1;
    const uint64_t run_bytes = layout.BytesPerPagePerTensor(g);
    for (int layer = 0; layer < s.num_layers; ++layer) {
      for (int tensor = 0; tensor < tensors; ++tensor) {
        for (const auto& [begin, end] : runs) {
          WriteOp op;
          op.src_region = src.first_region + g;
          op.src_offset = PageRunOffset(layout, src.num_pages, g, layer, tensor, src_pages[begin]);
          op.dst_region = dst.first_region + g;
          op.dst_offset = PageRunOffset(layout, dst.num_pages, g, layer, tensor, dst_pages[begin]);
          op.length = (end - begin) * run_bytes;
          ops.push_back(op);
        }
      }
    }
  }
  return ops;
}

}  // namespace strata::disagg

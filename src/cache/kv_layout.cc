#include "cache/kv_layout.h"

#include <set>
#include <sstream>

#include "util/logging.h"

namespace strata {
namespace {

bool IsKvDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

std::string HumanBytes(uint64_t bytes) {
  std::ostringstream os;
  if (bytes >= (uint64_t{1} << 30)) {
    os << static_cast<double>(bytes) / (uint64_t{1} << 30) << " GiB";
  } else if (bytes >= (uint64_t{1} << 20)) {
    os << static_cast<double>(bytes) / (uint64_t{1} << 20) << " MiB";
  } else {
    os << bytes << " bytes";
  }
  return os.str();
}

}  // namespace

Status KvLayout::Validate() const {
  std::vector<std::string> problems;
  if (page_size < 1) {
    problems.push_back("page_size is " + std::to_string(page_size) + "; it must be >= 1 (set --page-size)");
  }
  if (groups.empty()) problems.push_back("the layout has no pool group; a model declares at least one");
  std::set<std::string> names;
  for (size_t g = 0; g < groups.size(); ++g) {
    const PoolGroupSpec& s = groups[g];
    std::string where = "pool group " + std::to_string(g) + " (\"" + s.name + "\")";
    if (s.name.empty()) problems.push_back(where + " has no name");
    if (!names.insert(s.name).second) problems.push_back(where + ": duplicate group name");
    if (s.num_layers < 1) problems.push_back(where + ": num_layers is " + std::to_string(s.num_layers) + ", must be >= 1");
    if (s.num_kv_heads < 1) {
      problems.push_back(where + ": num_kv_heads is " + std::to_string(s.num_kv_heads) + ", must be >= 1");
    }
    if (s.head_dim < 1) problems.push_back(where + ": head_dim is " + std::to_string(s.head_dim) + ", must be >= 1");
    if (s.sliding_window < 0) {
      problems.push_back(where + ": sliding_window is " + std::to_string(s.sliding_window) + ", must be >= 0");
    }
    if (s.tokens_per_entry < 1) {
      problems.push_back(where + ": tokens_per_entry is " + std::to_string(s.tokens_per_entry) + ", must be >= 1");
    }
    if (!IsKvDType(s.dtype)) {
      problems.push_back(where + ": dtype " + DTypeName(s.dtype) + " cannot hold KV; use F32, F16 or BF16");
    }
  }
  if (problems.empty()) return OkStatus();
  std::string msg = "invalid KV cache layout: ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  return InvalidArgument(msg);
}

size_t KvLayout::BytesPerPagePerTensor(int g) const {
  STRATA_CHECK(g >= 0 && g < static_cast<int>(groups.size())) << "group " << g;
  const PoolGroupSpec& s = groups[g];
  return static_cast<size_t>(s.EntriesPerPage(page_size)) * static_cast<size_t>(s.ElementsPerTokenPerTensor()) *
         DTypeSize(s.dtype);
}

size_t KvLayout::BytesPerPage(int g) const {
  STRATA_CHECK(g >= 0 && g < static_cast<int>(groups.size())) << "group " << g;
  return static_cast<size_t>(groups[g].EntriesPerPage(page_size)) * groups[g].BytesPerTokenPerLayer() *
         static_cast<size_t>(groups[g].num_layers);
}

size_t KvLayout::BytesPerPage() const {
  size_t total = 0;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) total += BytesPerPage(g);
  return total;
}

size_t KvLayout::BytesPerToken() const { return BytesPerPage() / static_cast<size_t>(page_size); }

std::string KvLayout::Describe() const {
  std::ostringstream os;
  os << "page_size " << page_size << "; ";
  for (size_t g = 0; g < groups.size(); ++g) {
    const PoolGroupSpec& s = groups[g];
    os << (g ? "; " : "") << s.name << ": " << s.num_layers << " layers x " << (s.has_v ? "K+V" : "K") << " x "
       << s.num_kv_heads << " kv heads x " << s.head_dim << " x " << DTypeName(s.dtype);
    if (s.tokens_per_entry > 1) os << " per " << s.tokens_per_entry << " tokens";
  }
  return os.str();
}

StatusOr<int64_t> NumKvPagesForBytes(const KvLayout& layout, uint64_t bytes) {
  RETURN_IF_ERROR(layout.Validate());
  const uint64_t page_bytes = layout.BytesPerPage();
  const uint64_t pages = bytes / page_bytes;
  if (pages == 0) {
    return ResourceExhausted("the KV cache budget of " + HumanBytes(bytes) + " is smaller than one page (" +
                             HumanBytes(page_bytes) + " for " + layout.Describe() +
                             "); give the KV cache more memory (--mem-fraction-static) or lower --page-size");
  }
  if (pages > static_cast<uint64_t>(kMaxKvPages)) {
    return InvalidArgument("the KV cache budget of " + HumanBytes(bytes) + " makes " + std::to_string(pages) +
                           " pages, more than the supported " + std::to_string(kMaxKvPages) +
                           "; raise --page-size or lower the budget");
  }
  return static_cast<int64_t>(pages);
}

StatusOr<int64_t> NumKvPagesForTokens(const KvLayout& layout, int64_t max_total_tokens) {
  RETURN_IF_ERROR(layout.Validate());
  if (max_total_tokens <= 0) {
    return InvalidArgument("--max-total-tokens is " + std::to_string(max_total_tokens) +
                           "; it must be a positive number of tokens");
  }
  const int64_t pages = max_total_tokens / layout.page_size;
  if (pages == 0) {
    return InvalidArgument("--max-total-tokens " + std::to_string(max_total_tokens) +
                           " is smaller than one page of " + std::to_string(layout.page_size) +
                           " tokens; raise --max-total-tokens to at least " + std::to_string(layout.page_size) +
                           " or lower --page-size");
  }
  if (pages > kMaxKvPages) {
    return InvalidArgument("--max-total-tokens " + std::to_string(max_total_tokens) + " makes " +
                           std::to_string(pages) + " pages, more than the supported " +
                           std::to_string(kMaxKvPages) + "; lower --max-total-tokens or raise --page-size");
  }
  // The memory such a pool needs must at least be addressable.
  const uint64_t page_bytes = layout.BytesPerPage();
  if (static_cast<uint64_t>(pages) > UINT64_MAX / page_bytes) {
    return InvalidArgument("--max-total-tokens " + std::to_string(max_total_tokens) +
                           " needs more bytes than a 64-bit size can hold; lower it");
  }
  return pages;
}

char* KvPoolMemory::PagePtr(int g, int layer, int tensor, int64_t page) const {
  STRATA_CHECK(layout != nullptr && g >= 0 && g < static_cast<int>(group_base.size()))
      << "KV pool group " << g << " of " << group_base.size();
  const PoolGroupSpec& s = layout->groups[static_cast<size_t>(g)];
  const int tensors = s.has_v ? 2 : 1;
  STRATA_CHECK(layer >= 0 && layer < s.num_layers && tensor >= 0 && tensor < tensors && page >= 0 &&
               page < num_pages)
      << "KV page (group " << s.name << ", layer " << layer << ", tensor " << tensor << ", page " << page
      << ") outside the pool of " << num_pages << " pages";
  const size_t page_bytes = layout->BytesPerPagePerTensor(g);
  const size_t tensor_bytes = page_bytes * static_cast<size_t>(num_pages);
  return group_base[static_cast<size_t>(g)] + (static_cast<size_t>(layer) * tensors + static_cast<size_t>(tensor)) * tensor_bytes +
         static_cast<size_t>(page) * page_bytes;
}

}  // namespace strata

#include "cache/hicache_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace strata {
namespace {

std::string NodesText(const HostMemoryFacts& facts, int numa_node) {
  const std::vector<int> nodes = facts.NodesFor(numa_node);
  if (numa_node >= 0 || nodes.size() == 1) return "NUMA node " + FormatNodeList(nodes);
  return "the allowed NUMA nodes " + FormatNodeList(nodes);
}

std::string FlagText(const HiCacheOptions& o) {
  char buf[64];
  if (o.size_gb > 0)
    std::snprintf(buf, sizeof buf, "--hicache-size %g", o.size_gb);
  else
    std::snprintf(buf, sizeof buf, "--hicache-ratio %g", o.ratio);
  return buf;
}

// "a 1.00 GB, b 2.00 GB" for `pages` pages of every group.
std::string PerGroup(const KvLayout& layout, long double pages) {
  std::string out;
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g)
    out += (g ? ", " : "") + layout.groups[g].name + " " +
           FormatGB(pages * static_cast<long double>(layout.BytesPerPage(g)));
  return out;
}

std::string PagesText(long double pages) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0Lf", pages);
  return buf;
}

}  // namespace

std::string FormatGB(long double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2Lf GB", bytes / kGB);
  return buf;
}

const char* WritePolicyName(HiCacheWritePolicy p) {
  switch (p) {
    case HiCacheWritePolicy::kWriteThrough:
      return "write_through";
    case HiCacheWritePolicy::kWriteThroughSelective:
      return "write_through_selective";
    case HiCacheWritePolicy::kWriteBack:
      return "write_back";
  }
  return "?";
}

StatusOr<HiCacheWritePolicy> ParseWritePolicy(const std::string& name) {
  for (auto p : {HiCacheWritePolicy::kWriteThrough, HiCacheWritePolicy::kWriteThroughSelective,
                 HiCacheWritePolicy::kWriteBack})
    if (name == WritePolicyName(p)) return p;
  return InvalidArgument("--hicache-write-policy: '" + name +
                         "' is not one of write_through, write_through_selective, write_back");
}

const char* PrefetchPolicyName(PrefetchPolicy p) {
  switch (p) {
    case PrefetchPolicy::kBestEffort:
      return "best_effort";
    case PrefetchPolicy::kWaitComplete:
      return "wait_complete";
    case PrefetchPolicy::kTimeout:
      return "timeout";
  }
  return "?";
}

StatusOr<PrefetchPolicy> ParsePrefetchPolicy(const std::string& name) {
  for (auto p :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout})
    if (name == PrefetchPolicyName(p)) return p;
  return InvalidArgument("--hicache-storage-prefetch-policy: '" + name +
                         "' is not one of best_effort, wait_complete, timeout");
}

uint64_t DefaultHostReserveBytes(const HostMemoryFacts& facts, int numa_node,
                                 uint64_t weights_and_pools_in_host_memory) {
  const uint64_t os = std::max(uint64_t{2} << 30, AllowedTotalBytes(facts, numa_node) / 20);
  return weights_and_pools_in_host_memory + os;
}

Status CheckNumaNode(const HostMemoryFacts& facts, int numa_node) {
  if (numa_node < 0) return OkStatus();
  std::vector<int> existing;
  for (const auto& n : facts.nodes) existing.push_back(n.node);
  const bool exists = facts.FindNode(numa_node) != nullptr;
  const bool allowed =
      facts.allowed_nodes.empty() ||
      std::count(facts.allowed_nodes.begin(), facts.allowed_nodes.end(), numa_node);
  if (exists && allowed) return OkStatus();
  return InvalidArgument("--numa-node " + std::to_string(numa_node) + ": " +
                         (exists ? "this process may not allocate from that node"
                                 : "this machine has no such NUMA node") +
                         " (nodes: " + FormatNodeList(existing) +
                         "; this process may allocate from: " + FormatNodeList(facts.NodesFor(-1)) +
                         " (Mems_allowed_list)); give one of those, or leave --numa-node out");
}

StatusOr<HostTierPlan> PlanHostTier(const KvLayout& layout, int64_t device_pages,
                                    const HiCacheOptions& o, const HostMemoryFacts& facts,
                                    uint64_t host_reserve_bytes) {
  RETURN_IF_ERROR(layout.Validate());
  if (device_pages < 1)
    return InvalidArgument("HiCache plan: the device pool has " + std::to_string(device_pages) +
                           " pages; it needs at least one");
  if (o.ratio_explicit && o.size_gb > 0)
    return InvalidArgument(
        "--hicache-ratio and --hicache-size were both given; they are two ways of sizing the "
        "same host tier (ratio: host pages = ratio x device pages; size: GB split across pool "
        "groups). Give one of them");
  if (o.size_gb < 0 || !std::isfinite(o.size_gb))
    return InvalidArgument(
        "--hicache-size " + std::to_string(o.size_gb) +
        ": expected a positive number of GB (10^9 bytes), or 0 to size by --hicache-ratio");
  if (o.size_gb == 0 && (!std::isfinite(o.ratio) || o.ratio <= 1.0)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", o.ratio);
    return InvalidArgument(
        std::string("--hicache-ratio ") + buf +
        " must exceed 1: a host tier no larger than the device pool (" +
        std::to_string(device_pages) +
        " pages) extends nothing (every page it could hold is already on the device). "
        "Use e.g. --hicache-ratio 2 (the default), or --hicache-size GB");
  }
  RETURN_IF_ERROR(CheckNumaNode(facts, o.numa_node));

  const long double page_bytes = static_cast<long double>(layout.BytesPerPage());
  // Host pages for a ratio or a size (GB). The flags are decimal text:
  // "1.43" is the double 1.42999..., and 1.43 x device_pages must not lose
  // a page to that. A ratio's exact product is a multiple of 1/100 when it
  // has two decimals, so 10^-6 pages of slack never crosses an integer; a
  // size's exact quotient can sit 1/page_bytes below one, so its slack is
  // smaller (the rounding error of a double there is below 10^-8 pages).
  auto ratio_pages = [&](double ratio) {
    return std::floor(static_cast<long double>(ratio) * device_pages + 1e-6L);
  };
  auto size_pages = [&](double gb) {
    return std::floor(static_cast<long double>(gb) * kGB / page_bytes + 1e-9L);
  };
  const long double want_pages = o.size_gb > 0 ? size_pages(o.size_gb) : ratio_pages(o.ratio);
  if (want_pages < 1)
    return InvalidArgument(FlagText(o) + " holds no page: one page of every pool group is " +
                           FormatGB(page_bytes) + " (" + std::to_string(layout.BytesPerPage()) +
                           " bytes; " + layout.Describe() + "). Give at least that much");
  const long double want_bytes = want_pages * page_bytes;

  const uint64_t node_free = [&] {
    HostMemoryFacts no_cgroup = facts;
    no_cgroup.cgroup_limit_bytes = 0;
    return AllowedFreeBytes(no_cgroup, o.numa_node);
  }();
  const uint64_t available = AllowedFreeBytes(facts, o.numa_node);
  const uint64_t budget = available > host_reserve_bytes ? available - host_reserve_bytes : 0;
  if (want_bytes > static_cast<long double>(budget)) {
    const int64_t fit_pages =
        static_cast<int64_t>(std::min<long double>(std::floor(budget / page_bytes), kMaxKvPages));
    // Largest ratio (2 decimals, down) and size (GB, 1 decimal, down) whose
    // pages fit; a ratio must exceed 1.00, a size must hold a page. The
    // exact estimate (ratio r/100 fits iff r x device_pages < 100 x
    // (fit_pages + 1); size s/10 GB iff s x 10^8 < (fit_pages + 1) x page
    // bytes) is then checked with the very functions that size a request
    // (r / 100.0 is the double strtod gives for the text "r/100").
    using u128 = unsigned __int128;
    const auto fit1 = static_cast<u128>(fit_pages) + 1;
    auto ratio100 = static_cast<int64_t>((fit1 * 100 - 1) / static_cast<u128>(device_pages));
    while (ratio100 > 0 && ratio_pages(ratio100 / 100.0) > fit_pages) --ratio100;
    while (ratio_pages((ratio100 + 1) / 100.0) <= fit_pages) ++ratio100;
    auto size10 = static_cast<int64_t>((fit1 * layout.BytesPerPage() - 1) / (kGB / 10));
    while (size10 > 0 && size_pages(size10 / 10.0) > fit_pages) --size10;
    while (size_pages((size10 + 1) / 10.0) <= fit_pages) ++size10;
    const bool size_holds_page = size10 > 0 && size_pages(size10 / 10.0) >= 1;
    char ratio_text[32], size_text[32];
    std::snprintf(ratio_text, sizeof ratio_text, "%ld.%02ld", static_cast<long>(ratio100 / 100),
                  static_cast<long>(ratio100 % 100));
    std::snprintf(size_text, sizeof size_text, "%ld.%ld", static_cast<long>(size10 / 10),
                  static_cast<long>(size10 % 10));
    std::string fits;
    if (ratio100 > 100 && size_holds_page)
      fits = "At most --hicache-ratio " + std::string(ratio_text) + " or --hicache-size " +
             size_text + " fits";
    else if (size_holds_page)
      fits = "No --hicache-ratio above 1 fits (that would need more than " +
             FormatGB(static_cast<long double>(device_pages) * page_bytes) +
             "); at most --hicache-size " + size_text + " fits";
    else
      fits = "Nothing fits: the budget after the reserve holds no host page (" +
             FormatGB(page_bytes) + ")";
    std::string where = FormatGB(node_free) + " free on " + NodesText(facts, o.numa_node);
    if (available < node_free)
      where += ", but the memory cgroup " + facts.cgroup_path + " (limit " +
               FormatGB(facts.cgroup_limit_bytes) + ", " + FormatGB(facts.cgroup_usage_bytes) +
               " in use) leaves only " + FormatGB(available) + " (that limit binds)";
    return InvalidArgument(
        "the HiCache host tier does not fit in host memory (GB = 10^9 bytes): " + FlagText(o) +
        " asks for " + PagesText(want_pages) + " host pages = " + FormatGB(want_bytes) + " (" +
        PerGroup(layout, want_pages) + ") for a device pool of " + std::to_string(device_pages) +
        " pages = " + FormatGB(static_cast<long double>(device_pages) * page_bytes) + " (" +
        PerGroup(layout, device_pages) + "); the host has " + where + ", less a reserve of " +
        FormatGB(host_reserve_bytes) + " for weights, activations and the OS, leaving " +
        FormatGB(budget) + " for the host tier. " + fits +
        (o.numa_node < 0 ? "; or free memory" : "; or free memory, or choose another --numa-node"));
  }
  if (want_pages > kMaxKvPages)
    return InvalidArgument(FlagText(o) + " asks for " + PagesText(want_pages) +
                           " host pages; at most " + std::to_string(kMaxKvPages) +
                           " are supported (raise --page-size)");

  HostTierPlan plan;
  plan.host_pages = static_cast<int64_t>(want_pages);
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g) {
    plan.group_bytes.push_back(static_cast<uint64_t>(plan.host_pages) * layout.BytesPerPage(g));
    plan.total_bytes += plan.group_bytes.back();
  }
  plan.available_bytes = available;
  plan.reserve_bytes = host_reserve_bytes;
  plan.numa_node = o.numa_node;
  if (plan.host_pages <= device_pages)
    plan.warnings.push_back(
        FlagText(o) + " gives a host tier of " + std::to_string(plan.host_pages) +
        " pages, no larger than the device pool (" + std::to_string(device_pages) +
        " pages): it keeps prefixes the device evicts only while they stay among the "
        "most recent host pages; a larger size extends the cache further");
  return plan;
}

std::string DescribeHostTierPlan(const HostTierPlan& plan, const KvLayout& layout) {
  std::string groups;
  for (size_t g = 0; g < plan.group_bytes.size() && g < layout.groups.size(); ++g)
    groups += (g ? ", " : "") + layout.groups[g].name + " " + FormatGB(plan.group_bytes[g]);
  return "host tier " + std::to_string(plan.host_pages) + " pages = " + FormatGB(plan.total_bytes) +
         " (" + groups + ") on " +
         (plan.numa_node >= 0 ? "NUMA node " + std::to_string(plan.numa_node)
                              : "the allowed NUMA nodes") +
         "; " + FormatGB(plan.available_bytes) + " available, " + FormatGB(plan.reserve_bytes) +
         " reserved";
}

}  // namespace strata

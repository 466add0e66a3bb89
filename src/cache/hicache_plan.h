// HiCache options and the host-tier plan: how many host pages the host KV
// tier gets, checked against the memory this process can actually get,
// before anything is allocated (docs/architecture/hicache.md, "Sizing and
// validation").
//
// PlanHostTier is pure: it works from a KvLayout (pool groups, never a
// model), the device pool's page count, the options and HostMemoryFacts
// (util/host_memory.h; tests build them by hand), so `strata serve`,
// `strata check` and the tests all run the same arithmetic. Every refusal is
// one InvalidArgument message naming each number and what would fit.
//
// Plain values and free functions; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/kv_layout.h"
#include "util/host_memory.h"
#include "util/status.h"

namespace strata {

// When device pages are copied to the host tier (SGLang's semantics).
enum class HiCacheWritePolicy {
  kWriteThrough,           // write_through: at insertion
  kWriteThroughSelective,  // write_through_selective: once a prefix has been hit
  kWriteBack,              // write_back: when about to be evicted from the device
};
// How long a request waits for its storage-tier prefix to be read.
enum class PrefetchPolicy {
  kBestEffort,    // best_effort: prefill starts with what has arrived
  kWaitComplete,  // wait_complete: wait for the whole read
  kTimeout,       // timeout: wait up to prefetch_timeout_ms
};

// "write_through" etc.; Parse fails with InvalidArgument listing the
// allowed spellings.
const char* WritePolicyName(HiCacheWritePolicy p);
StatusOr<HiCacheWritePolicy> ParseWritePolicy(const std::string& name);
const char* PrefetchPolicyName(PrefetchPolicy p);
StatusOr<PrefetchPolicy> ParsePrefetchPolicy(const std::string& name);

inline constexpr double kDefaultHiCacheRatio = 2.0;         // SGLang's default
inline constexpr double kDefaultStorageMaxGb = 100.0;       // capacity of the file tier
inline constexpr int64_t kDefaultPrefetchTimeoutMs = 1000;  // SGLang's prefetch_timeout_base
inline constexpr uint64_t kGB = 1000000000;                 // --hicache-size's unit

// The --hicache-* and --numa-node flags (cli/serve_config.cc registers them;
// the engine and the HiCache glue take this struct).
struct HiCacheOptions {
  bool enabled = false;  // --enable-hierarchical-cache
  // --hicache-ratio: host pages = floor(ratio x device pages); must exceed 1.
  double ratio = kDefaultHiCacheRatio;
  bool ratio_explicit = false;  // given on the command line (with size_gb: an error)
  // --hicache-size: host budget in GB (10^9 bytes); 0: size from ratio.
  double size_gb = 0;
  HiCacheWritePolicy write_policy = HiCacheWritePolicy::kWriteThrough;
  std::string storage_backend;                   // "" (no storage tier) or "file"
  std::string storage_path;                      // directory of the file tier
  double storage_max_gb = kDefaultStorageMaxGb;  // capacity in GB; LRU eviction past it
  PrefetchPolicy prefetch_policy = PrefetchPolicy::kBestEffort;
  int64_t prefetch_timeout_ms = kDefaultPrefetchTimeoutMs;  // for PrefetchPolicy::kTimeout
  int numa_node = -1;  // -1: the nodes the process may allocate from
};

// The host tier PlanHostTier accepted.
struct HostTierPlan {
  // Host pages; every group holds this many (shared page-index space,
  // cache/kv_layout.h), so group_bytes[g] = host_pages * BytesPerPage(g).
  int64_t host_pages = 0;
  std::vector<uint64_t> group_bytes;
  uint64_t total_bytes = 0;      // sum of group_bytes
  uint64_t available_bytes = 0;  // AllowedFreeBytes on the plan's node(s)
  uint64_t reserve_bytes = 0;    // kept back for weights, activations, the OS
  int numa_node = -1;            // as in HiCacheOptions
  // Accepted but worth a log line (e.g. a host tier no larger than the
  // device pool, which --hicache-size allows).
  std::vector<std::string> warnings;
};

// Sizes the host tier and checks it fits:
//   --hicache-ratio R: host pages = floor(R x device_pages); R must exceed 1.
//   --hicache-size S:  host pages = floor(S x 10^9 / layout.BytesPerPage()),
//       i.e. S split across groups in proportion to each group's bytes per
//       page; must hold at least one page. (Smaller than the device pool is
//       allowed, with a warning: the incident sizes a 150 GB host
//       tier under a 160 GB device pool.)
//   ratio_explicit together with size_gb > 0: an error naming both flags.
//   numa_node >= 0 must be an existing node among facts.allowed_nodes.
//   total host bytes must not exceed AllowedFreeBytes(facts, numa_node) -
//       host_reserve_bytes; otherwise one message naming the device pool per
//       group, the request per group, the free bytes on the node(s) (and the
//       cgroup limit when it binds), the reserve, and the largest
//       --hicache-ratio (2 decimals) and --hicache-size (GB, 1 decimal), both
//       rounded down, that fit, or that none does.
// All sizes in messages are GB = 10^9 bytes, as --hicache-size takes.
StatusOr<HostTierPlan> PlanHostTier(const KvLayout& layout, int64_t device_pages,
                                    const HiCacheOptions& o, const HostMemoryFacts& facts,
                                    uint64_t host_reserve_bytes);

// OK when numa_node is -1, or an existing node among facts.allowed_nodes
// (every node when that is empty); otherwise InvalidArgument listing the
// nodes and the allowed ones. PlanHostTier runs it too.
Status CheckNumaNode(const HostMemoryFacts& facts, int numa_node);

// What the host tier must leave free: the weights and the device pool when
// they live in host memory (the CPU backend; 0 on a GPU) plus activations
// and the OS: max(2 GiB, 5% of the total memory of the plan's node(s)).
uint64_t DefaultHostReserveBytes(const HostMemoryFacts& facts, int numa_node,
                                 uint64_t weights_and_pools_in_host_memory);

// "host tier: 42690 pages = 319.99 GB (a 191.99 GB, b 42.67 GB) on NUMA
// node 0, 12.80 GB reserved of 240.00 GB free" for the startup log.
std::string DescribeHostTierPlan(const HostTierPlan& plan, const KvLayout& layout);

// "123.45 GB" (10^9 bytes, 2 decimals, rounded to nearest).
std::string FormatGB(long double bytes);

}  // namespace strata

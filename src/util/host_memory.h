// Host memory facts: how much RAM this process can actually get, per NUMA
// node, under its cpuset (Mems_allowed_list) and its memory cgroup.
//
// The HiCache plan (cache/hicache_plan.h) and `strata serve`'s startup
// validation size the host KV tier from these facts before anything is
// allocated. They come from /sys and /proc under a root directory, so tests
// point ReadHostMemoryFacts at a fake tree and build HostMemoryFacts values
// by hand to fake any machine.
//
// Plain values and free functions; thread-compatible. ReadHostMemoryFacts
// only reads files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace strata {

struct NumaNodeMemory {
  int node = 0;
  uint64_t total_bytes = 0;
  // What an allocation on this node can get without swapping: MemFree plus
  // the reclaimable page cache and slab (see ReadHostMemoryFacts).
  uint64_t free_bytes = 0;
};

struct HostMemoryFacts {
  std::vector<NumaNodeMemory> nodes;  // ascending node ids
  std::vector<int> allowed_nodes;     // Mems_allowed_list (ascending); empty: every node
  // The tightest memory cgroup on the way from this process's cgroup to the
  // root: the one with the least headroom (limit - usage). 0: no limit.
  uint64_t cgroup_limit_bytes = 0;
  uint64_t cgroup_usage_bytes = 0;
  std::string cgroup_path;           // where that limit was found, for messages
  uint64_t mem_available_bytes = 0;  // /proc/meminfo MemAvailable

  const NumaNodeMemory* FindNode(int node) const;
  // The nodes an allocation with `numa_node` draws from: {numa_node}, or
  // (-1) the allowed nodes that exist (every node when none is listed).
  std::vector<int> NodesFor(int numa_node) const;
};

// Reads, under `root` (a directory standing for "/"):
//   sys/devices/system/node/node<N>/meminfo   per-node MemTotal and the free
//       estimate MemFree + Active(file) + Inactive(file) + SReclaimable:
//       the kernel's MemAvailable formula without its watermark terms (a few
//       hundred MB at most, covered by the plan's reserve). Absent (many
//       containers): one node 0 with MemTotal and MemAvailable of
//       proc/meminfo.
//   proc/self/status      Mems_allowed_list ("0-1,3"); absent: every node.
//   proc/self/cgroup      cgroup v2 ("0::/path": sys/fs/cgroup/<path>/
//       memory.max, memory.current) and v1 ("N:memory:/path":
//       sys/fs/cgroup/memory/<path>/memory.limit_in_bytes,
//       memory.usage_in_bytes), walking up to the root; a missing directory
//       or file is skipped, "max" or a v1 limit >= 2^60 is no limit.
//   proc/meminfo          MemAvailable.
// Fails (NotFound) only when neither node meminfo nor proc/meminfo can be
// read; InvalidArgument when a file that exists cannot be parsed.
StatusOr<HostMemoryFacts> ReadHostMemoryFacts(const std::string& root = "/");

// Free bytes an allocation on `numa_node` (-1: the allowed nodes) can get:
// the sum of those nodes' free bytes, capped by mem_available_bytes (when
// known) and by the cgroup's headroom (limit - usage) when there is a limit.
uint64_t AllowedFreeBytes(const HostMemoryFacts& facts, int numa_node);
// Sum of total bytes of the same nodes.
uint64_t AllowedTotalBytes(const HostMemoryFacts& facts, int numa_node);
// The cgroup headroom (limit - usage, 0 when usage exceeds the limit), or
// UINT64_MAX when there is no limit.
uint64_t CgroupHeadroomBytes(const HostMemoryFacts& facts);

// "0-1,3" <-> {0, 1, 3}. Parse accepts spaces around items and a trailing
// newline; fails with InvalidArgument on anything else (naming the text).
StatusOr<std::vector<int>> ParseNodeList(const std::string& text);
std::string FormatNodeList(const std::vector<int>& nodes);

// Binds the pages of [addr, addr + bytes) to NUMA node `node` (mbind
// MPOL_BIND), before first touch so they are allocated there. `addr` must
// be page-aligned (an anonymous mmap). Fails with IoError naming the node.
Status BindToNumaNode(void* addr, size_t bytes, int node);

}  // namespace strata

#include "util/host_memory.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string Join(const std::string& root, const std::string& rel) {
  std::string r = root.empty() ? "/" : root;
  if (r.back() != '/') r += '/';
  return r + rel;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream os;
  os << in.rdbuf();
  *out = os.str();
  return true;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool ParseU64(const std::string& text, uint64_t* out) {
  const std::string t = Trim(text);
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  *out = std::strtoull(t.c_str(), nullptr, 10);
  return errno != ERANGE;
}

// "Key: value kB" lines (proc/meminfo) or "Node N Key: value kB" (node
// meminfo) -> key -> bytes.
std::map<std::string, uint64_t> ParseMeminfo(const std::string& text) {
  std::map<std::string, uint64_t> kv;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> tok;
    for (std::string t; ls >> t;) tok.push_back(t);
    size_t k = (tok.size() >= 2 && tok[0] == "Node") ? 2 : 0;
    if (tok.size() < k + 2 || tok[k].back() != ':') continue;
    uint64_t v = 0;
    if (!ParseU64(tok[k + 1], &v)) continue;
    const bool kb = tok.size() > k + 2 && tok[k + 2] == "kB";
    kv[tok[k].substr(0, tok[k].size() - 1)] = kb ? v * 1024 : v;
  }
  return kv;
}

uint64_t Get(const std::map<std::string, uint64_t>& kv, const std::string& key) {
  auto it = kv.find(key);
  return it == kv.end() ? 0 : it->second;
}

// One cgroup directory's (limit, usage); false if it has no limit file or
// no limit.
bool ReadCgroupLimit(const std::string& dir, bool v2, uint64_t* limit, uint64_t* usage) {
  std::string l, u;
  if (!ReadFile(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), &l)) return false;
  if (Trim(l) == "max" || !ParseU64(l, limit)) return false;
  if (!v2 && *limit >= (uint64_t{1} << 60)) return false;  // v1 spells "none" as ~2^63
  if (!ReadFile(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"), &u) ||
      !ParseU64(u, usage))
    *usage = 0;
  return true;
}

// Walks from `base + path` up to `base`, keeping the limit with the least
// headroom in `facts`.
void WalkCgroup(const std::string& base, std::string path, bool v2, HostMemoryFacts* facts) {
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    uint64_t limit = 0, usage = 0;
    if (ReadCgroupLimit(base + path, v2, &limit, &usage)) {
      const uint64_t headroom = limit > usage ? limit - usage : 0;
      if (facts->cgroup_limit_bytes == 0 || headroom < CgroupHeadroomBytes(*facts)) {
        facts->cgroup_limit_bytes = limit;
        facts->cgroup_usage_bytes = usage;
        facts->cgroup_path = base + (path.empty() ? "/" : path);
      }
    }
    if (path.empty()) break;
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos ? std::string() : path.substr(0, slash);
  }
}

}  // namespace

const NumaNodeMemory* HostMemoryFacts::FindNode(int node) const {
  for (const auto& n : nodes)
    if (n.node == node) return &n;
  return nullptr;
}

std::vector<int> HostMemoryFacts::NodesFor(int numa_node) const {
  if (numa_node >= 0) return {numa_node};
  std::vector<int> out;
  for (const auto& n : nodes)
    if (allowed_nodes.empty() || std::count(allowed_nodes.begin(), allowed_nodes.end(), n.node))
      out.push_back(n.node);
  return out;
}

StatusOr<std::vector<int>> ParseNodeList(const std::string& text) {
  std::vector<int> out;
  const std::string t = Trim(text);
  if (t.empty()) return out;
  std::istringstream in(t);
  std::string item;
  auto bad = [&] {
    return InvalidArgument("'" + t + "' is not a NUMA node list (expected e.g. 0-1,3)");
  };
  while (std::getline(in, item, ',')) {
    item = Trim(item);
    const size_t dash = item.find('-');
    uint64_t lo = 0, hi = 0;
    if (dash == std::string::npos) {
      if (!ParseU64(item, &lo)) return bad();
      hi = lo;
    } else if (!ParseU64(item.substr(0, dash), &lo) || !ParseU64(item.substr(dash + 1), &hi)) {
      return bad();
    }
    if (hi < lo || hi > 4095) return bad();  // the kernel's MAX_NUMNODES is at most 1024
    for (uint64_t n = lo; n <= hi; ++n) out.push_back(static_cast<int>(n));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string FormatNodeList(const std::vector<int>& nodes) {
  std::string out;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(nodes[i]);
    if (j > i) out += "-" + std::to_string(nodes[j]);
    i = j + 1;
  }
  return out;
}

StatusOr<HostMemoryFacts> ReadHostMemoryFacts(const std::string& root) {
  HostMemoryFacts facts;
  std::string text;
  const std::string meminfo_path = Join(root, "proc/meminfo");
  std::map<std::string, uint64_t> meminfo;
  if (ReadFile(meminfo_path, &text)) {
    meminfo = ParseMeminfo(text);
    facts.mem_available_bytes =
        meminfo.count("MemAvailable")
            ? Get(meminfo, "MemAvailable")
            : Get(meminfo, "MemFree") + Get(meminfo, "Cached");  // kernels < 3.14
  }

  const std::string node_dir = Join(root, "sys/devices/system/node");
  std::error_code ec;
  if (fs::is_directory(node_dir, ec)) {
    for (const auto& e : fs::directory_iterator(node_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() < 5 || name.rfind("node", 0) != 0 ||
          name.find_first_not_of("0123456789", 4) != std::string::npos)
        continue;
      if (!ReadFile(e.path().string() + "/meminfo", &text)) continue;
      auto kv = ParseMeminfo(text);
      if (!kv.count("MemTotal"))
        return InvalidArgument(e.path().string() + "/meminfo has no MemTotal line");
      NumaNodeMemory n;
      n.node = std::atoi(name.c_str() + 4);
      n.total_bytes = Get(kv, "MemTotal");
      n.free_bytes =
          std::min(n.total_bytes, Get(kv, "MemFree") + Get(kv, "Active(file)") +
                                      Get(kv, "Inactive(file)") + Get(kv, "SReclaimable"));
      facts.nodes.push_back(n);
    }
    std::sort(facts.nodes.begin(), facts.nodes.end(),
              [](const NumaNodeMemory& a, const NumaNodeMemory& b) { return a.node < b.node; });
  }
  if (facts.nodes.empty()) {
    if (meminfo.empty())
      return NotFound("cannot read host memory: neither " + node_dir + "/node*/meminfo nor " +
                      meminfo_path + " is readable");
    NumaNodeMemory n;
    n.total_bytes = Get(meminfo, "MemTotal");
    n.free_bytes = std::min(n.total_bytes, facts.mem_available_bytes);
    facts.nodes.push_back(n);
  }

  if (ReadFile(Join(root, "proc/self/status"), &text)) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Mems_allowed_list:", 0) != 0) continue;
      auto list = ParseNodeList(line.substr(18));
      if (!list.ok())
        return list.status().Annotate(Join(root, "proc/self/status") + " Mems_allowed_list");
      facts.allowed_nodes = *list;
    }
  }

  if (ReadFile(Join(root, "proc/self/cgroup"), &text)) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      // hierarchy-id:controllers:path (the path may itself hold ':').
      const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
      const std::string path = line.substr(b + 1);
      if (id == "0" && controllers.empty()) {
        WalkCgroup(Join(root, "sys/fs/cgroup"), path, /*v2=*/true, &facts);
      } else {
        std::istringstream cs(controllers);
        for (std::string c; std::getline(cs, c, ',');)
          if (c == "memory")
            WalkCgroup(Join(root, "sys/fs/cgroup/memory"), path, /*v2=*/false, &facts);
      }
    }
  }
  return facts;
}

uint64_t CgroupHeadroomBytes(const HostMemoryFacts& f) {
  if (f.cgroup_limit_bytes == 0) return UINT64_MAX;
  return f.cgroup_limit_bytes > f.cgroup_usage_bytes ? f.cgroup_limit_bytes - f.cgroup_usage_bytes
                                                     : 0;
}

uint64_t AllowedFreeBytes(const HostMemoryFacts& facts, int numa_node) {
  uint64_t sum = 0;
  for (int n : facts.NodesFor(numa_node))
    if (const NumaNodeMemory* m = facts.FindNode(n)) sum += m->free_bytes;
  // No node set yields more than the whole machine's MemAvailable (some
  // sandboxes show node files that disagree with /proc/meminfo).
  if (facts.mem_available_bytes > 0) sum = std::min(sum, facts.mem_available_bytes);
  return std::min(sum, CgroupHeadroomBytes(facts));
}

uint64_t AllowedTotalBytes(const HostMemoryFacts& facts, int numa_node) {
  uint64_t sum = 0;
  for (int n : facts.NodesFor(numa_node))
    if (const NumaNodeMemory* m = facts.FindNode(n)) sum += m->total_bytes;
  return sum;
}

Status BindToNumaNode(void* addr, size_t bytes, int node) {
  if (node < 0 || node >= 1024)
    return InvalidArgument("NUMA node " + std::to_string(node) + " is out of range");
  constexpr int kBits = 1024;
  unsigned long mask[kBits / (8 * sizeof(unsigned long))] = {};
  mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  constexpr int kMpolBind = 2;  // <linux/mempolicy.h>, without a libnuma dependency
  // maxnode is one past the last bit: the kernel reads maxnode - 1 bits.
  if (syscall(SYS_mbind, addr, bytes, kMpolBind, mask, kBits + 1, 0) != 0)
    return IoError("mbind of " + std::to_string(bytes) + " bytes to NUMA node " +
                   std::to_string(node) +
                   " failed (is the node among Mems_allowed_list in /proc/self/status?)");
  return OkStatus();
}

}  // namespace strata

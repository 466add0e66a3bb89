#include "disagg/ucx_info.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace strata::disagg {

std::string CaptureToString(const std::function<void(FILE*)>& print) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return "";
  print(f);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

std::string Hostname() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

// "tcp/lo posix/memory ..." from ucp_context_print_info's
// "#   resource 0  :  md 0  dev 0  flags -- tcp/lo" lines.
std::string ResourcesOf(ucp_context_h context) {
  const std::string info = CaptureToString([&](FILE* f) { ucp_context_print_info(context, f); });
  std::string out;
  size_t pos = 0;
  while (pos < info.size()) {
    size_t end = info.find('\n', pos);
    if (end == std::string::npos) end = info.size();
    const std::string_view line(info.data() + pos, end - pos);
    const size_t dash = line.rfind("-- ");
    if (line.find("resource") != std::string_view::npos && dash != std::string_view::npos) {
      if (!out.empty()) out += ' ';
      out += line.substr(dash + 3);
    }
    pos = end + 1;
  }
  return out;
}

// "sysv/memory posix/memory" from ucp_ep_print_info's
// "#   lane[0]:  0:sysv/memory.0 md[0] -> ..." lines: what an endpoint uses.
std::string LanesOf(const std::string& ep_info) {
  std::string out;
  for (size_t pos = ep_info.find("lane["); pos != std::string::npos;
       pos = ep_info.find("lane[", pos + 1)) {
    const size_t colon = ep_info.find(':', ep_info.find(':', pos) + 1);
    if (colon == std::string::npos) break;
    const size_t end = ep_info.find_first_of(" \n", colon);
    std::string tl = ep_info.substr(colon + 1, end - colon - 1);
    if (const size_t dot = tl.rfind('.'); dot != std::string::npos) tl.resize(dot);
    if ((" " + out + " ").find(" " + tl + " ") != std::string::npos) continue;
    if (!out.empty()) out += ' ';
    out += tl;
  }
  return out;
}

// What backs the mapping that holds `p`, from /proc/self/maps: "sysv
// shared memory" (UCX's sysv allocator: "/SYSV<key> (deleted)"), "posix
// shared memory" (/dev/shm or a memfd), "heap", "private memory"
// (anonymous), else the mapped file's path.
std::string MemoryKindAt(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return "unknown memory";
  char line[4096];
  std::string kind = "unknown memory";
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &path_at) < 2) continue;
    if (addr < lo || addr >= hi) continue;
    std::string path = line + path_at;
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    if (path.rfind("/SYSV", 0) == 0)
      kind = "sysv shared memory";
    else if (path.rfind("/dev/shm/", 0) == 0 || path.rfind("/memfd:", 0) == 0)
      kind = "posix shared memory";
    else if (path == "[heap]")
      kind = "heap";
    else if (path.empty())
      kind = "private memory";
    else
      kind = path;
    break;
  }
  std::fclose(f);
  return kind;
}

}  // namespace strata::disagg

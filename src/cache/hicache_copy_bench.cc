// HiCache load-back bandwidth (issue 7, item 7): host -> device copies of N
// random, non-adjacent pages through CacheController (Submit + Wait: the
// engine's path, one CopyBlocks call per job) against the ceiling measured
// in the same run: one contiguous block of the same total bytes moved the
// plain way. Backups (device -> host) are measured the same way.
//
//   CPU:  ceiling = std::memcpy on `copy_threads` plain threads, each
//         copying one slice of the block (the same thread count as the
//         backend's CopyBlocks; persistent, started through a barrier).
//   CUDA: ceiling = one cudaMemcpyAsync of a pinned contiguous block on the
//         compute stream (CopyToDevice / CopyToHost + Synchronize); the host
//         pool is pinned (HostKvPool with pin_with).
//
// Layout: Llama-3.2-1B's KV (16 layers, 8 kv heads, head_dim 64, BF16,
// page 16): 512 KiB per page, as 32 blocks of 16 KiB (one per layer and
// tensor); random pages share no run, so a job of N pages is 32 N blocks.
// Repetitions alternate the two sides (the machine's bandwidth drifts); the
// ratio is the median of the per-repetition ratios (PairedRatio).
//
// Usage: hicache_copy_bench [--device=cpu|cuda|all] [--pages=512] [--reps=15]
//                           [--copy-threads=0 (backend default)]
#include <sys/mman.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "cache/cache_controller.h"
#include "cache/host_pool.h"
#include "cache/kv_pool.h"

namespace strata {
namespace {

struct Options {
  std::string device = "all";
  int64_t pages = 512;
  int reps = 15;
  int copy_threads = 0;
};

KvLayout Llama32_1B() {
  KvLayout l;
  l.page_size = 16;
  l.groups.push_back({"full_attention", 16, 8, 64, DType::kBF16, true, 0});
  return l;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Plain multithreaded memcpy: `threads` equal slices, one std::memcpy each,
// on persistent threads (the calling thread takes the first slice) started
// and joined through a barrier: no thread creation inside the timing.
class PlainMemcpy {
 public:
  explicit PlainMemcpy(int threads) : threads_(threads), start_(threads), end_(threads) {
    for (int t = 1; t < threads; ++t) {
      workers_.emplace_back([this, t] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          Slice(t);
          end_.arrive_and_wait();
        }
      });
    }
  }
  ~PlainMemcpy() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& w : workers_) w.join();
  }
  void Copy(char* dst, const char* src, size_t bytes) {
    dst_ = dst;
    src_ = src;
    bytes_ = bytes;
    start_.arrive_and_wait();
    Slice(0);
    end_.arrive_and_wait();
  }

 private:
  void Slice(int t) {
    const size_t slice = (bytes_ + threads_ - 1) / threads_;
    const size_t lo = std::min(bytes_, t * slice), hi = std::min(bytes_, lo + slice);
    std::memcpy(dst_ + lo, src_ + lo, hi - lo);
  }

  const int threads_;
  std::barrier<> start_, end_;
  std::vector<std::thread> workers_;
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  size_t bytes_ = 0;
  bool stop_ = false;  // written before the start barrier, read after it
};

// Every byte of the pool written once (page faults out of the timing).
void Touch(const KvPoolMemory& m) {
  for (int l = 0; l < m.layout->groups[0].num_layers; ++l)
    for (int t = 0; t < 2; ++t)
      std::memset(m.PagePtr(0, l, t, 0), 1, m.layout->BytesPerPagePerTensor(0) * m.num_pages);
}

struct Side {
  std::vector<double> seconds;
  double gbps(uint64_t bytes) const { return bytes / Median(seconds) / 1e9; }
  double best_gbps(uint64_t bytes) const {
    return bytes / *std::min_element(seconds.begin(), seconds.end()) / 1e9;
  }
};

// Median over repetitions of ceiling time / path time, each pair measured
// back to back: steadier than a ratio of medians when the machine's
// bandwidth drifts (a shared machine's does, by tens of percent).
double PairedRatio(const Side& ceiling, const Side& path) {
  std::vector<double> r;
  for (size_t i = 0; i < path.seconds.size(); ++i)
    r.push_back(ceiling.seconds[i] / path.seconds[i]);
  return Median(r);
}

// Runs one backend; returns false when it is not available.
bool RunOne(const std::string& device, const Options& o) {
  std::unique_ptr<Backend> backend;
  int threads = 1;
  if (device == "cpu") {
    CpuBackendOptions co;
    co.num_threads = 1;  // compute threads: unused here
    co.copy_threads = o.copy_threads;
    auto b = CreateCpuBackend(co);
    if (!b.ok()) {
      std::fprintf(stderr, "cpu: %s\n", b.status().ToString().c_str());
      return false;
    }
    backend = std::move(b).value();
    threads = o.copy_threads ? o.copy_threads : DefaultCpuCopyThreads();
  } else {
    auto b = CreateCudaBackend(CudaBackendOptions{});
    if (!b.ok()) {
      std::printf("%s: skipped (%s)\n", device.c_str(), b.status().message().c_str());
      return false;
    }
    backend = std::move(b).value();
  }
  const bool gpu = device != "cpu";
  const KvLayout layout = Llama32_1B();
  const size_t page_bytes = layout.BytesPerPage();
  const int64_t n = o.pages;
  const uint64_t bytes = page_bytes * static_cast<uint64_t>(n);

  // Pools of 2N pages; the job uses N of the even pages on each side, in a
  // random pairing, so no two of its pages are adjacent on either side.
  auto device_pool = KvPool::Create(layout, 2 * n, *backend);
  auto host_pool = HostKvPool::Create(layout, 2 * n, -1, gpu ? backend.get() : nullptr);
  if (!device_pool.ok() || !host_pool.ok()) {
    std::fprintf(stderr, "%s: %s %s\n", device.c_str(), device_pool.status().ToString().c_str(),
                 host_pool.status().ToString().c_str());
    return false;
  }
  Touch((*host_pool)->memory());
  if (!gpu) Touch((*device_pool)->memory());
  std::vector<int32_t> host_pages(n), device_pages(n);
  for (int64_t i = 0; i < n; ++i) host_pages[i] = device_pages[i] = static_cast<int32_t>(2 * i);
  std::mt19937 rng(42);
  std::shuffle(host_pages.begin(), host_pages.end(), rng);
  std::shuffle(device_pages.begin(), device_pages.end(), rng);
  std::vector<PageCopy> load, backup;
  for (int64_t i = 0; i < n; ++i) {
    load.push_back({host_pages[i], device_pages[i]});
    backup.push_back({device_pages[i], host_pages[i]});
  }

  // The ceiling's contiguous buffers: host (pinned on a GPU) and device.
  // 2 MiB-aligned and on huge pages where the kernel gives them: the best
  // case for the plain copy (the host pool asks for huge pages too).
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t block_alloc = (bytes + kHuge - 1) / kHuge * kHuge;
  std::unique_ptr<char, decltype(&std::free)> host_block(
      static_cast<char*>(std::aligned_alloc(kHuge, block_alloc)), &std::free);
  (void)madvise(host_block.get(), block_alloc, MADV_HUGEPAGE);
  std::memset(host_block.get(), 2, bytes);
  if (gpu) {
    Status s = backend->PinHostMemory(host_block.get(), bytes);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", device.c_str(), s.ToString().c_str());
      return false;
    }
  }
  // Page-aligned like the host block: a source and destination 64 bytes
  // apart modulo 4 KiB make a plain memcpy alias (loads stall on the stores
  // 4 KiB before them) and would understate the ceiling.
  auto device_block = backend->Allocate(bytes + 4096);
  if (!device_block.ok()) return false;
  char* dblock = static_cast<char*>(device_block->data());
  dblock += (4096 - reinterpret_cast<uintptr_t>(dblock) % 4096) % 4096;
  if (!gpu) std::memset(dblock, 3, bytes);

  PlainMemcpy plain(gpu ? 1 : threads);
  CacheController cc(*backend, (*device_pool)->memory(), (*host_pool)->memory());
  Side ceil_h2d, ceil_d2h, load_side, backup_side;
  std::vector<double> load_copy;       // CopyBlocks time alone, from the completions
  for (int r = -1; r < o.reps; ++r) {  // r = -1: warm-up, not recorded
    double t0 = Now();
    if (gpu) {
      backend->CopyToDevice(dblock, host_block.get(), bytes);
      backend->Synchronize();
    } else {
      plain.Copy(dblock, host_block.get(), bytes);
    }
    double t1 = Now();
    cc.Wait(cc.Submit(CopyDirection::kHostToDevice, load));
    double t2 = Now();
    if (gpu) {
      backend->CopyToHost(host_block.get(), dblock, bytes);
    } else {
      plain.Copy(host_block.get(), dblock, bytes);
    }
    double t3 = Now();
    cc.Wait(cc.Submit(CopyDirection::kDeviceToHost, backup));
    double t4 = Now();
    for (const auto& c : cc.Poll()) {
      if (!c.status.ok()) {
        std::fprintf(stderr, "%s: %s\n", device.c_str(), c.status.ToString().c_str());
        return false;
      }
      if (r >= 0 && c.dir == CopyDirection::kHostToDevice) load_copy.push_back(c.copy_seconds);
    }
    if (r < 0) continue;
    ceil_h2d.seconds.push_back(t1 - t0);
    load_side.seconds.push_back(t2 - t1);
    ceil_d2h.seconds.push_back(t3 - t2);
    backup_side.seconds.push_back(t4 - t3);
  }
  if (gpu) backend->UnpinHostMemory(host_block.get());

  std::printf(
      "%s (%s): %lld random pages x %zu bytes = %.1f MiB per job, %lld blocks of %zu bytes, %d "
      "reps\n",
      device.c_str(), backend->Name().c_str(), static_cast<long long>(n), page_bytes,
      bytes / 1048576.0, static_cast<long long>(n * 32), layout.BytesPerPagePerTensor(0), o.reps);
  std::printf("  %-28s %10s %10s %8s\n", "", "median", "best", "ratio");
  std::printf("  %-28s %7.2f GB/s %7.2f GB/s\n", "ceiling host->device", ceil_h2d.gbps(bytes),
              ceil_h2d.best_gbps(bytes));
  std::printf("  %-28s %7.2f GB/s %7.2f GB/s %7.2f\n", "load-back (Submit+Wait)",
              load_side.gbps(bytes), load_side.best_gbps(bytes), PairedRatio(ceil_h2d, load_side));
  std::printf("  %-28s %7.2f GB/s\n", "  of which CopyBlocks alone",
              bytes / Median(load_copy) / 1e9);
  std::printf("  %-28s %7.2f GB/s %7.2f GB/s\n", "ceiling device->host", ceil_d2h.gbps(bytes),
              ceil_d2h.best_gbps(bytes));
  std::printf("  %-28s %7.2f GB/s %7.2f GB/s %7.2f\n", "backup (Submit+Wait)",
              backup_side.gbps(bytes), backup_side.best_gbps(bytes),
              PairedRatio(ceil_d2h, backup_side));
  return true;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--device=")) {
      o.device = v;
    } else if (const char* v = value("--pages=")) {
      o.pages = std::atoll(v);
    } else if (const char* v = value("--reps=")) {
      o.reps = std::atoi(v);
    } else if (const char* v = value("--copy-threads=")) {
      o.copy_threads = std::atoi(v);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--device=cpu|cuda|all] [--pages=N] [--reps=N] [--copy-threads=N]\n"
                   "unknown argument: %s\n",
                   argv[0], a.c_str());
      return 2;
    }
  }
  if (o.pages < 1 || o.reps < 1 || o.copy_threads < 0 ||
      (o.device != "cpu" && o.device != "cuda" && o.device != "all")) {
    std::fprintf(stderr,
                 "bad arguments: --pages and --reps must be >= 1, --copy-threads >= 0, --device "
                 "cpu|cuda|all\n");
    return 2;
  }
  bool ran = false;
  if (o.device != "cuda") ran |= strata::RunOne("cpu", o);
  if (o.device != "cpu") ran |= strata::RunOne("cuda", o);
  return ran ? 0 : 1;
}

// KV transfer bandwidth over UcxTransport (issue 8, item 8): a sender and a
// receiver process (fork, before either touches UCX) on this host; the
// sender writes N pages of a real model's KV layout into the receiver's
// pool the way a prefill server does (PageWriteOps per prefill chunk, every
// chunk in flight at once), timed from the first Write to the last `done`.
// The transports are UCX_TLS's, as for `strata serve`. The ceiling is
// `ucx_perftest -t ucp_put_bw` on the same UCX_TLS and message size
// (tools/bench/kv_transfer.sh runs both and prints the ratio).
//
// Layout: Qwen2.5-0.5B's KV (24 layers, 2 kv heads, head_dim 64, BF16,
// page 16): one (layer, tensor, page) run is 4 KiB, a page 192 KiB
// (--layers and --k-only take layers and V away, for smaller working sets).
//   --case=4k    random, non-adjacent pages: every op is one 4 KiB run.
//   --case=256k  runs of 64 consecutive pages on both sides: every op is
//                64 x 4 KiB = 256 KiB (a prefix of fresh pages).
// At the end the receiver hashes its pool and the sender checks the hash
// against the image it expects: the bench moves real bytes, exactly.
// Building that image is timed too: the same copies as a plain memcpy in
// one process ("memcpy_mbps_median"), the memory system's ceiling for the
// pattern, which ucx_perftest (one cache-hot buffer) does not show.
//
// Usage: kv_transfer_bench [--case=4k|256k] [--pages=1024] [--chunk-pages=64] [--reps=5]
//          [--receiver-memory=ucx|heap] [--sender-memory=heap|ucx] [--direct-copy=1|0]
//          [--writes=auto|puts|messages] [--repeat=1] [--layers=24] [--k-only]
// Memory: "ucx" pools come from KvTransport::AllocateRegion (what `strata
// serve` gives PD roles), "heap" ones are std::vectors given to
// RegisterRegion. --direct-copy=0 turns UcxTransportOptions::direct_copy
// off on the sender (UCX's puts even where the peer's memory is mapped).
// --writes sets UcxTransportOptions::writes of the sender (auto: the
// transport's own active messages where UCX has no native put, i.e. tcp).
// Prints one line per repetition and a final "result ..." line (MB/s as
// ucx_perftest prints them: 2^20 bytes per second).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "disagg/page_ops.h"
#include "disagg/ucx_transport.h"

namespace strata::disagg {
namespace {

struct Options {
  std::string bench_case = "4k";
  // Where each side's pool lives: "ucx" (KvTransport::AllocateRegion, what
  // `strata serve` does for PD roles) or "heap" (a std::vector registered
  // with RegisterRegion, as before).
  std::string receiver_memory = "ucx";
  std::string sender_memory = "heap";  // a prefill's pool is the backend's
  bool direct_copy = true;  // UcxTransportOptions::direct_copy of the sender
  UcxTransportOptions::Writes writes = UcxTransportOptions::Writes::kAuto;
  int64_t pages = 1024;
  int64_t chunk_pages = 64;
  int reps = 5;
  // Each repetition writes the transfer this many times (the batches posted
  // `repeat` times over, all in flight): with few --pages the pages stay in
  // the caches, as ucx_perftest's one buffer does.
  int repeat = 1;
  // The layout's layers and tensors (Qwen2.5-0.5B: 24, K and V). Fewer
  // shrink the working set: --layers=1 --k-only --case=256k --pages=64 is
  // one 256 KiB run per transfer, ucx_perftest's one buffer of that size.
  int layers = 24;
  bool k_only = false;
};

KvLayout Qwen25_05B(int layers, bool k_only) {
  KvLayout l;
  l.page_size = 16;
  l.groups.push_back({"full_attention", layers, 2, 64, DType::kBF16, !k_only, 0});
  return l;
}

uint64_t Fnv(const char* p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

bool ReadFull(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kv_transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

// The receiver: registers its pool, sends the descriptor, then hashes the
// pool on request ('h') until the pipe closes.
// A pool of `bytes` in `memory` ("ucx" or "heap") registered as region 0.
char* MakePool(UcxTransport& t, const std::string& memory, size_t bytes, std::vector<char>& heap,
               const char* who) {
  char* base = nullptr;
  if (memory == "ucx") {
    auto r = t.AllocateRegion(bytes);
    if (!r.ok()) Die(std::string(who) + ": AllocateRegion: " + r.status().ToString());
    base = static_cast<char*>(r->base);
  } else {
    heap.resize(bytes);
    base = heap.data();
    if (!t.RegisterRegion(base, bytes).ok()) Die(std::string(who) + ": RegisterRegion failed");
  }
  std::fprintf(stderr, "kv_transfer_bench: %s pool in %s\n", who, t.RegionMemory(0).c_str());
  return base;
}

[[noreturn]] void Receiver(const std::string& memory, size_t pool_bytes, int in, int out) {
  auto t = UcxTransport::Create();
  if (!t.ok()) Die("receiver: " + t.status().ToString());
  std::vector<char> heap;
  char* pool = MakePool(**t, memory, pool_bytes, heap, "receiver");
  std::memset(pool, 0xEE, pool_bytes);
  const std::string desc = *(*t)->LocalDescriptor();
  const uint32_t len = static_cast<uint32_t>(desc.size());
  if (write(out, &len, 4) != 4 || write(out, desc.data(), len) != static_cast<ssize_t>(len)) {
    Die("receiver: pipe write failed");
  }
  char cmd;
  while (read(in, &cmd, 1) == 1) {
    const uint64_t h = Fnv(pool, pool_bytes);
    if (write(out, &h, 8) != 8) Die("receiver: pipe write failed");
  }
  std::exit(0);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(const Options& o) {
  const KvLayout layout = Qwen25_05B(o.layers, o.k_only);
  const int64_t pool_pages = 2 * o.pages;  // room for the non-adjacent picks
  const size_t pool_bytes = layout.BytesPerPage() * static_cast<size_t>(pool_pages);

  // Which pages go where.
  std::mt19937 rng(42);
  std::vector<int32_t> src_pages, dst_pages;
  if (o.bench_case == "4k") {
    // Even ids, shuffled on each side: no two picks are adjacent, so
    // nothing merges and every op is one 4 KiB run.
    for (int32_t p = 0; p < o.pages; ++p) src_pages.push_back(2 * p);
    dst_pages = src_pages;
    std::shuffle(src_pages.begin(), src_pages.end(), rng);
    std::shuffle(dst_pages.begin(), dst_pages.end(), rng);
  } else if (o.bench_case == "256k") {
    // Runs of 64 pages, the runs in shuffled order, dst runs elsewhere.
    constexpr int32_t kRun = 64;
    if (o.pages % kRun != 0) Die("--pages must be a multiple of 64 for --case=256k");
    std::vector<int32_t> runs(o.pages / kRun);
    std::iota(runs.begin(), runs.end(), 0);
    std::vector<int32_t> dst_runs(runs.size());
    std::iota(dst_runs.begin(), dst_runs.end(), 0);
    std::shuffle(runs.begin(), runs.end(), rng);
    std::shuffle(dst_runs.begin(), dst_runs.end(), rng);
    for (size_t r = 0; r < runs.size(); ++r) {
      for (int32_t i = 0; i < kRun; ++i) {
        src_pages.push_back(runs[r] * 2 * kRun + i);  // gaps between runs
        dst_pages.push_back(dst_runs[r] * 2 * kRun + kRun + i);
      }
    }
  } else {
    Die("--case must be 4k or 256k");
  }

  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) Die("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    close(to_child[1]);
    close(from_child[0]);
    Receiver(o.receiver_memory, pool_bytes, to_child[0], from_child[1]);
  }
  close(to_child[0]);
  close(from_child[1]);
  uint32_t len = 0;
  if (!ReadFull(from_child[0], &len, 4)) Die("the receiver died before sending its descriptor");
  std::string desc(len, '\0');
  if (!ReadFull(from_child[0], desc.data(), len)) Die("short descriptor");

  UcxTransportOptions sender_options;
  sender_options.direct_copy = o.direct_copy;
  sender_options.writes = o.writes;
  auto created = UcxTransport::Create(sender_options);
  if (!created.ok()) Die("sender: " + created.status().ToString());
  UcxTransport& t = **created;
  std::vector<char> heap;
  char* src = MakePool(t, o.sender_memory, pool_bytes, heap, "sender");
  for (size_t i = 0; i < pool_bytes; i += 8) {
    const uint64_t x = rng();
    std::memcpy(src + i, &x, std::min<size_t>(8, pool_bytes - i));
  }
  auto peer = t.Connect(desc);
  if (!peer.ok()) Die("sender: " + peer.status().ToString());

  // One batch per prefill chunk, as the prefill server sends them.
  std::vector<std::vector<WriteOp>> batches;
  size_t ops = 0;
  uint64_t bytes = 0;
  for (int64_t at = 0; at < o.pages; at += o.chunk_pages) {
    const int64_t n = std::min(o.chunk_pages, o.pages - at);
    auto b = PageWriteOps(layout, {pool_pages, 0}, {pool_pages, 0},
                          std::span<const int32_t>(src_pages).subspan(at, n),
                          std::span<const int32_t>(dst_pages).subspan(at, n));
    if (!b.ok()) Die(b.status().ToString());
    for (const WriteOp& op : *b) bytes += op.length;
    ops += b->size();
    batches.push_back(std::move(b).value());
  }
  const uint64_t msg = batches.front().front().length;

  const char* tls = std::getenv("UCX_TLS");
  std::printf("kv_transfer_bench: UCX_TLS=%s case=%s pages=%lld chunk_pages=%lld: %zu batches, %zu ops of %llu B, %.1f MiB per transfer\n",
              tls ? tls : "(unset)", o.bench_case.c_str(), static_cast<long long>(o.pages),
              static_cast<long long>(o.chunk_pages), batches.size(), ops,
              static_cast<unsigned long long>(msg), bytes / 1048576.0);
  std::vector<double> mbps;
  for (int rep = 0; rep < o.reps; ++rep) {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = batches.size() * static_cast<size_t>(o.repeat);
    Status first_error;
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < o.repeat; ++k) {
      for (const auto& b : batches) {
        const Status st = t.Write(*peer, b, [&](Status s) {
          std::lock_guard<std::mutex> lock(mu);
          if (!s.ok() && first_error.ok()) first_error = s;
          if (--left == 0) cv.notify_all();
        });
        if (!st.ok()) Die(st.ToString());
      }
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return left == 0; });
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!first_error.ok()) Die("write failed: " + first_error.ToString());
    mbps.push_back(static_cast<double>(bytes) * o.repeat / 1048576.0 / s);
    std::printf("rep %d: %.3f s, %.1f MB/s\n", rep, s, mbps.back());
    std::fflush(stdout);
  }

  // The receiver's pool must be exactly the expected image. Building it is
  // also the memory system's ceiling for this pattern: the same copies by
  // one thread of this process into a private pool of the same size (paged
  // in first), timed per repetition like ours.
  std::vector<char> want(pool_bytes, static_cast<char>(0xEE));
  std::vector<double> memcpy_mbps;
  for (int rep = 0; rep < o.reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < o.repeat; ++k) {
      for (const auto& b : batches) {
        for (const WriteOp& op : b) std::memcpy(want.data() + op.dst_offset, src + op.src_offset, op.length);
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    memcpy_mbps.push_back(static_cast<double>(bytes) * o.repeat / 1048576.0 / s);
  }
  const char c = 'h';
  uint64_t got = 0;
  if (write(to_child[1], &c, 1) != 1 || !ReadFull(from_child[0], &got, 8)) Die("receiver gone");
  const bool exact = got == Fnv(want.data(), want.size());
  const TransportStats stats = t.stats();
  t.Disconnect(*peer);
  close(to_child[1]);
  waitpid(pid, nullptr, 0);
  std::printf("result case=%s receiver_memory=%s sender_memory=%s msg_bytes=%llu mbps_median=%.1f mbps_best=%.1f memcpy_mbps_median=%.1f repeat=%d bytes_per_rep=%llu direct_fraction=%.2f verified=%s\n",
              o.bench_case.c_str(), o.receiver_memory.c_str(), o.sender_memory.c_str(),
              static_cast<unsigned long long>(msg), Median(mbps),
              *std::max_element(mbps.begin(), mbps.end()), Median(memcpy_mbps), o.repeat,
              static_cast<unsigned long long>(bytes) * static_cast<unsigned long long>(o.repeat),
              stats.bytes_written ? static_cast<double>(stats.bytes_copied_directly) / stats.bytes_written : 0.0,
              exact ? "yes" : "NO");
  return exact ? 0 : 2;
}

}  // namespace
}  // namespace strata::disagg

int main(int argc, char** argv) {
  strata::disagg::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--case=")) {
      o.bench_case = v;
    } else if (const char* v = value("--receiver-memory=")) {
      o.receiver_memory = v;
    } else if (const char* v = value("--sender-memory=")) {
      o.sender_memory = v;
    } else if (const char* v = value("--repeat=")) {
      o.repeat = std::atoi(v);
    } else if (const char* v = value("--direct-copy=")) {
      o.direct_copy = std::atoi(v) != 0;
    } else if (const char* v = value("--writes=")) {
      const std::string w = v;
      if (w != "auto" && w != "puts" && w != "messages") {
        std::fprintf(stderr, "--writes: auto, puts or messages, not \"%s\"\n", v);
        return 1;
      }
      using Writes = strata::disagg::UcxTransportOptions::Writes;
      o.writes = w == "puts" ? Writes::kPuts : w == "messages" ? Writes::kMessages : Writes::kAuto;
    } else if (const char* v = value("--pages=")) {
      o.pages = std::atoll(v);
    } else if (const char* v = value("--chunk-pages=")) {
      o.chunk_pages = std::atoll(v);
    } else if (const char* v = value("--reps=")) {
      o.reps = std::atoi(v);
    } else if (const char* v = value("--layers=")) {
      o.layers = std::atoi(v);
    } else if (a == "--k-only") {
      o.k_only = true;
    } else {
      std::fprintf(stderr, "usage: kv_transfer_bench [--case=4k|256k] [--pages=1024] [--chunk-pages=64] [--reps=5] "
                   "[--receiver-memory=ucx|heap] [--sender-memory=ucx|heap] [--direct-copy=1|0] [--writes=auto|puts|messages] [--repeat=1] [--layers=24] [--k-only]\n");
      return 1;
    }
  }
  for (const std::string* m : {&o.receiver_memory, &o.sender_memory}) {
    if (*m != "ucx" && *m != "heap") {
      std::fprintf(stderr, "kv_transfer_bench: --receiver-memory/--sender-memory: ucx or heap, got %s\n",
                   m->c_str());
      return 1;
    }
  }
  if (o.pages < 1 || o.chunk_pages < 1 || o.reps < 1 || o.repeat < 1 || o.layers < 1) {
    std::fprintf(stderr, "kv_transfer_bench: --pages, --chunk-pages, --reps, --repeat and --layers must be >= 1\n");
    return 1;
  }
  return strata::disagg::Run(o);
}

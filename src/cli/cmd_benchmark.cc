// strata bench engine: prefill and decode throughput of the CPU engine on a
// model directory, next to the machine's measured memory read bandwidth
// (the roofline of batch-1 decode: weight bytes / bandwidth).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"

namespace strata::cli {
namespace {

// Streaming read bandwidth over `bytes` with `threads` threads, best of 3.
// Each thread walks kStreams distant parts of its share in lockstep: one
// sequential stream per core is capped by the prefetcher's depth (measured
// here: ~9 GB/s for 1 stream vs ~19 GB/s for 8 on one core), while a GEMV
// reads many weight rows at once, so a single stream would understate the
// roofline about 2x.
double MeasureReadBandwidth(size_t bytes, int threads) {
  constexpr size_t kStreams = 8;
  std::vector<uint64_t> buf(bytes / 8, 1);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> ts;
    std::vector<uint64_t> sums(threads);
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        const size_t n = buf.size(), b = n * t / threads, e = n * (t + 1) / threads;
        const size_t len = (e - b) / kStreams;
        const uint64_t* p = buf.data() + b;
        uint64_t s[kStreams] = {};
        for (size_t i = 0; i < len; ++i)
          for (size_t k = 0; k < kStreams; ++k) s[k] += p[k * len + i];
        uint64_t total = 0;
        for (uint64_t v : s) total += v;
        sums[t] = total;
      });
    }
    for (auto& t : ts) t.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t total = 0;
    for (auto s : sums) total += s;
    if (total == 0) std::fprintf(stderr, " ");  // keep the sums alive
    best = std::max(best, bytes / dt / 1e9);
  }
  return best;
}

// strata bench bandwidth: the roofline's denominator on its own, so a peer
// engine run in another process can be measured next to the same yardstick.
int BandwidthCommand(const Args& args) {
  const std::string cmd = "bench bandwidth";
  int64_t threads = 0, mib = 1024;
  bool json = false;
  FlagSet f(cmd, "Measures streaming memory read bandwidth (best of 3 passes over --mib MiB).");
  f.Int("threads", &threads, "reading threads (0: all hardware threads)", 0, 1024);
  f.Int("mib", &mib, "buffer size in MiB (keep it well above the last-level cache)", 1, 1 << 20);
  f.Bool("json", &json, "print results as one JSON object");
  Status st = f.Parse(args);
  if (!st.ok()) return UsageError(cmd, st);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  const int n = threads > 0 ? static_cast<int>(threads) : static_cast<int>(std::thread::hardware_concurrency());
  const double bw = MeasureReadBandwidth(static_cast<size_t>(mib) << 20, n);
  if (json) {
    std::printf("%s\n", nlohmann::json{{"threads", n}, {"bytes", mib << 20}, {"read_bandwidth_gb_s", bw}}.dump().c_str());
  } else {
    std::printf("threads %d  read bandwidth %.1f GB/s\n", n, bw);
  }
  return kExitOk;
}

}  // namespace

int BenchCommand(const Args& args) {
  const std::string cmd = "bench";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf(
        "usage: strata bench <kind> [flags]\n\nkinds:\n"
        "  engine   prefill and decode tokens/s of one sequence on the CPU, with the measured\n"
        "           memory bandwidth roofline (strata bench engine --help)\n"
        "  bandwidth  the memory read bandwidth alone, as bench engine measures it, for\n"
        "           comparing other engines against the same roofline (strata bench bandwidth --help)\n"
        "  serve    load a running OpenAI-compatible server: latency, throughput, goodput,\n"
        "           503 counts (strata bench serve --help)\n");
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] == "bandwidth") return BandwidthCommand(Args(args.begin() + 1, args.end()));
  if (args[0] == "serve") return BenchServeCommand(Args(args.begin() + 1, args.end()));
  if (args[0] != "engine")
    return UsageError(cmd, InvalidArgument("unknown benchmark '" + args[0] + "' (known: engine, bandwidth, serve)"));
  ModelFlags mf;
  int64_t prompt_len = 512, gen_len = 64, reps = 3;
  bool json = false, warmup = true;
  FlagSet f("bench engine",
            "Measures prefill (one prompt of --prompt-len random tokens) and batch-1 decode "
            "(--gen-len tokens) on the --device backend, alternating runs, and reports tokens/s and "
            "the decode ratio to the memory-bandwidth roofline measured in the same run.");
  mf.Register(f);
  f.Int("prompt-len", &prompt_len, "prompt tokens", 1, 1 << 20);
  f.Int("gen-len", &gen_len, "generated tokens", 1, 1 << 20);
  f.Int("repeats", &reps, "repetitions (best is reported)", 1, 100);
  f.Bool("json", &json, "print results as one JSON object");
  f.Bool("warmup", &warmup, "run one short untimed request first (default true)");
  Args rest(args.begin() + 1, args.end());
  Status st = f.Parse(rest);
  if (!st.ok()) return UsageError(cmd, st);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  if (!f.IsSet("chunked-prefill-size")) mf.max_batch_tokens = prompt_len;
  auto stack = LoadForCli(cmd, mf);
  if (!stack.ok()) return Fail(cmd, stack.status());
  LoadedModel& m = *stack->model;
  EngineOptions eo;
  eo.max_running_requests = 1;
  eo.chunked_prefill_size = static_cast<int32_t>(mf.max_batch_tokens);
  eo.max_total_tokens = prompt_len + gen_len + 64;
  eo.context_length = prompt_len + gen_len + 1;
  auto engine = Engine::Create(m, *stack->backend, eo);
  if (!engine.ok()) return Fail(cmd, engine.status());
  std::mt19937 rng(1234);
  const int64_t vocab_hi = std::min<int64_t>(m.config.vocab_size, m.tokenizer->vocab_size()) - 1;
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(std::max<int64_t>(vocab_hi, 1)));
  const int threads = mf.threads > 0 ? static_cast<int>(mf.threads)
                                     : static_cast<int>(std::thread::hardware_concurrency());
  if (warmup) {
    // One short request first, untimed: first-touch costs (KV pages, scratch,
    // thread start-up, AMX state) stay out of a single timed repetition.
    GenerationRequest req;
    for (int64_t i = 0; i < std::min<int64_t>(prompt_len, 16); ++i) req.prompt.push_back(dist(rng));
    req.params.temperature = 0;
    req.params.ignore_eos = true;
    req.params.max_tokens = 2;
    std::vector<GenerationRequest> reqs;
    reqs.push_back(std::move(req));
    auto res = engine->get()->Generate(std::move(reqs));
    if (!res.ok()) return Fail(cmd, res.status());
  }
  double best_prefill = 0, best_decode = 0, best_bw = 0;
  for (int64_t r = 0; r < reps; ++r) {
    // Alternate: bandwidth, then the engine, so drift hits both alike.
    // The host-memory roofline means nothing for a GPU: there it is left 0
    // (docs/perf.md quotes GPU runs against the device's copy bandwidth).
    if (mf.device == "cpu") best_bw = std::max(best_bw, MeasureReadBandwidth(size_t{1} << 30, threads));
    GenerationRequest req;
    for (int64_t i = 0; i < prompt_len; ++i) req.prompt.push_back(dist(rng));
    req.params.temperature = 0;
    req.params.ignore_eos = true;
    req.params.max_tokens = static_cast<int>(gen_len);
    Engine* e = engine->get();
    const EngineStats before = e->stats();
    std::vector<GenerationRequest> reqs;
    reqs.push_back(std::move(req));
    auto res = e->Generate(std::move(reqs));
    if (!res.ok()) return Fail(cmd, res.status());
    const EngineStats& after = e->stats();
    const double pt = after.prefill_seconds - before.prefill_seconds;
    const double dt = after.decode_seconds - before.decode_seconds;
    if (pt > 0) best_prefill = std::max(best_prefill, (after.prefill_tokens - before.prefill_tokens) / pt);
    if (dt > 0) best_decode = std::max(best_decode, (after.decode_tokens - before.decode_tokens) / dt);
  }
  // Batch-1 decode reads every weight once per token (embedding: one row).
  const double weight_bytes = static_cast<double>(m.weight_bytes);
  const double roofline = best_bw * 1e9 / weight_bytes;
  nlohmann::json j = {{"model", m.dir},
                      {"architecture", m.config.architecture},
                      {"threads", threads},
                      {"backend", stack->backend->Name()},
                      {"prompt_len", prompt_len},
                      {"gen_len", gen_len},
                      {"prefill_tok_s", best_prefill},
                      {"decode_tok_s", best_decode},
                      {"read_bandwidth_gb_s", best_bw},
                      {"weight_bytes", weight_bytes},
                      {"decode_roofline_tok_s", roofline},
                      {"decode_vs_roofline", roofline > 0 ? best_decode / roofline : 0}};
  if (json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("threads %d  prefill %.1f tok/s  decode %.2f tok/s  bandwidth %.1f GB/s  "
                "roofline %.2f tok/s  decode/roofline %.2f\n",
                threads, best_prefill, best_decode, best_bw, roofline,
                roofline > 0 ? best_decode / roofline : 0.0);
  }
  return kExitOk;
}

}  // namespace strata::cli

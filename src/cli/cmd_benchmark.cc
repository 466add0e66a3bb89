// strata bench engine: prefill and decode throughput of the CPU engine on a
// model directory, next to the machine's measured memory read bandwidth
// (the roofline of batch-1 decode: weight bytes / bandwidth).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "constrain/constraint.h"
#include "engine/engine.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace strata::cli {
namespace {

// One pass of one thread over `streams` equal parts of [p, p + bytes), read
// in lockstep: each step loads 64 bytes of every stream into its own pair of
// accumulators, so up to 2 * streams independent loads are in flight, plus
// optionally a software prefetch kPrefetch bytes ahead (as the GEMV does). The
// AVX2 variant loads 32 bytes at a time as the GEMV kernels do; the portable
// one reads 8-byte words (the compiler's SSE2 at best).
#if defined(__x86_64__)
template <int kStreams, int kPrefetch = 0>
__attribute__((target("avx2"))) uint64_t ReadPassAvx2(const uint8_t* p, size_t bytes) {
  // Streams start kSkew bytes more than len apart: at a power-of-two
  // spacing (1 GiB / 4) every stream hits the same cache sets and DRAM
  // banks, and 4 streams with prefetch read 12-17 GB/s instead of 22-24
  // (one thread, AMD EPYC). The 16 * kSkew bytes left unread are < 0.01%.
  constexpr size_t kSkew = 65 * 64;
  const size_t len = (bytes - kStreams * kSkew) / kStreams / 64 * 64;
  __m256i acc[kStreams][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_si256();
  for (size_t i = 0; i < len; i += 64) {
    for (int s = 0; s < kStreams; ++s) {
      const auto* q = reinterpret_cast<const __m256i*>(p + s * (len + kSkew) + i);
      if constexpr (kPrefetch > 0)
        _mm_prefetch(reinterpret_cast<const char*>(q) + kPrefetch, _MM_HINT_T0);
      acc[s][0] = _mm256_add_epi64(acc[s][0], _mm256_load_si256(q));
      acc[s][1] = _mm256_add_epi64(acc[s][1], _mm256_load_si256(q + 1));
    }
  }
  __m256i t = _mm256_setzero_si256();
  for (auto& a : acc) t = _mm256_add_epi64(t, _mm256_add_epi64(a[0], a[1]));
  alignas(32) uint64_t o[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(o), t);
  return o[0] + o[1] + o[2] + o[3];
}
#endif

template <int kStreams>
uint64_t ReadPassPortable(const uint8_t* p, size_t bytes) {
  const size_t len = bytes / kStreams / 8;
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t s[kStreams] = {};
  for (size_t i = 0; i < len; ++i)
    for (int k = 0; k < kStreams; ++k) s[k] += w[k * len + i];
  uint64_t total = 0;
  for (uint64_t v : s) total += v;
  return total;
}

using ReadPassFn = uint64_t (*)(const uint8_t*, size_t);

// Streaming read bandwidth over `bytes` (keep it well above the last-level
// cache) with `threads` threads, each reading its own contiguous share: the
// best over several access patterns and 3 passes each. No single pattern is
// fastest everywhere: one sequential stream per core is capped by the
// prefetcher's depth on some CPUs (an Intel Xeon: ~9 GB/s for 1 stream vs
// ~19 for 8), while on others (a 2-vCPU AMD EPYC VM) 2 streams did best, and
// the bf16 GEMV reads 4 long streams with a software prefetch 256 bytes
// ahead. Taking the best of 1 to 16 AVX2 streams, with and without that
// prefetch (and the portable loop), keeps the roofline
// at what the machine can read, so no engine's decode beats it by reading
// more cleverly (issue 13: a probe at 0.64x of what llama.cpp streamed).
double MeasureReadBandwidth(size_t bytes, int threads) {
  std::vector<ReadPassFn> passes = {&ReadPassPortable<8>};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) {
    passes = {&ReadPassAvx2<1>,      &ReadPassAvx2<2>,      &ReadPassAvx2<4>,
              &ReadPassAvx2<8>,      &ReadPassAvx2<16>,     &ReadPassAvx2<1, 256>,
              &ReadPassAvx2<4, 256>, &ReadPassAvx2<8, 256>, &ReadPassPortable<8>};
  }
#endif
  // 2 MiB-aligned and, where the kernel allows, on transparent huge pages,
  // as the CPU backend holds weights (cpu_backend.cc): on 4 KiB pages a
  // stream also pays a TLB walk every 64 lines, and decode then beat the
  // probe (16.3 vs 13.1 GB/s, one thread, AMD EPYC). Shares are multiples of
  // 16 streams x 64 bytes x 64.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t share = bytes / threads / (16 * 64 * 64) * (16 * 64 * 64);
  const size_t alloc = (share * threads + kHuge - 1) / kHuge * kHuge;
  // Kept for the process: bench engine probes before and after every
  // repetition, and zeroing 1 GiB of fresh huge pages each time took longer
  // than the probe itself. Only the CLI's one thread calls this.
  static std::unique_ptr<uint8_t, decltype(&std::free)> buf(nullptr, &std::free);
  static size_t buf_bytes = 0;
  if (buf_bytes < alloc) {
    buf.reset(static_cast<uint8_t*>(std::aligned_alloc(kHuge, alloc)));
    if (!buf) return 0;
    buf_bytes = alloc;
#if defined(__linux__)
    (void)madvise(buf.get(), alloc, MADV_HUGEPAGE);  // best effort
#endif
    std::memset(buf.get(), 1, alloc);  // touch every page before timing
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    for (ReadPassFn pass : passes) {
      std::vector<std::thread> ts;
      std::vector<uint64_t> sums(threads);
      const auto t0 = std::chrono::steady_clock::now();
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] { sums[t] = pass(buf.get() + share * t, share); });
      for (auto& t : ts) t.join();
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      uint64_t total = 0;
      for (auto s : sums) total += s;
      if (total == 0) std::fprintf(stderr, " ");  // keep the sums alive
      best = std::max(best, static_cast<double>(share * threads) / dt / 1e9);
    }
  }
  return best;
}

// strata bench bandwidth: the roofline's denominator on its own, so a peer
// engine run in another process can be measured next to the same yardstick.
int BandwidthCommand(const Args& args) {
  const std::string cmd = "bench bandwidth";
  int64_t threads = 0, mib = 1024;
  bool json = false;
  FlagSet f(
      cmd,
      "Measures streaming memory read bandwidth over --mib MiB: the best of 3 passes of each of "
      "several access patterns (1 to 16 streams per thread, 32-byte loads where AVX2 exists).");
  f.Int("threads", &threads, "reading threads (0: all hardware threads)", 0, 1024);
  f.Int("mib", &mib, "buffer size in MiB (keep it well above the last-level cache)", 1, 1 << 20);
  f.Bool("json", &json, "print results as one JSON object");
  Status st = f.Parse(args);
  if (!st.ok()) return UsageError(cmd, st);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  const int n = threads > 0 ? static_cast<int>(threads)
                            : static_cast<int>(std::thread::hardware_concurrency());
  const double bw = MeasureReadBandwidth(static_cast<size_t>(mib) << 20, n);
  if (json) {
    std::printf("%s\n",
                nlohmann::json{{"threads", n}, {"bytes", mib << 20}, {"read_bandwidth_gb_s", bw}}
                    .dump()
                    .c_str());
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
        "           comparing other engines against the same roofline (strata bench bandwidth "
        "--help)\n"
        "  serve    load a running OpenAI-compatible server: latency, throughput, goodput,\n"
        "           503 counts (strata bench serve --help)\n");
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] == "bandwidth") return BandwidthCommand(Args(args.begin() + 1, args.end()));
  if (args[0] == "serve") return BenchServeCommand(Args(args.begin() + 1, args.end()));
  if (args[0] != "engine")
    return UsageError(cmd, InvalidArgument("unknown benchmark '" + args[0] +
                                           "' (known: engine, bandwidth, serve)"));
  ModelFlags mf;
  int64_t prompt_len = 512, gen_len = 64, reps = 3, batch = 1;
  bool json = false, warmup = true, json_object = false, constraint_warm = false,
       constraint_fragments = false, constraint_prewarmed = false;
  std::string json_schema_path, kv_dtype = "auto";
  FlagSet f(
      "bench engine",
      "Measures prefill (one prompt of --prompt-len random tokens) and batch-1 decode "
      "(--gen-len tokens) on the --device backend, alternating runs, and reports tokens/s and "
      "the decode ratio to the memory-bandwidth roofline measured in the same run. With --batch "
      "N, N such prompts are prefilled together and decoded together: decode tokens/s counts "
      "all N sequences' tokens over the steps that carried decode tokens only.");
  mf.Register(f);
  f.Int("prompt-len", &prompt_len, "prompt tokens", 1, 1 << 20);
  f.Int("gen-len", &gen_len, "generated tokens", 1, 1 << 20);
  f.Int("repeats", &reps, "repetitions (best is reported)", 1, 100);
  f.Int("batch", &batch,
        "sequences per repetition, decoded together (the chunked prefill size defaults to all "
        "their prompts, so that every decode step carries all of them)",
        1, 4096);
  f.Bool("json", &json, "print results as one JSON object");
  f.Bool("warmup", &warmup, "run one short untimed request first (default true)");
  f.String("kv-cache-dtype", &kv_dtype,
           "KV page element type: f32, bf16, f16 or auto (bf16 on a GPU under bf16 matmul, f32 on "
           "the CPU)");
  f.String("json-schema", &json_schema_path,
           "also decode under this JSON schema (a file), compiled afresh each repetition (a "
           "schema's first answer: every mask cold), alternated with the plain decode, and report "
           "what the constraint adds to a decode step");
  f.Bool("json-object", &json_object, "the same with response_format json_object");
  f.Bool("constraint-warm", &constraint_warm,
         "compile the schema once and answer once untimed first, so every timed answer finds its "
         "masks cached (a schema seen before: the same tools or response_format again)");
  f.Bool("constraint-fragments-warm", &constraint_fragments,
         "compile afresh each repetition but keep the vocabulary's string fragments from earlier "
         "repetitions (a new schema in a server that has masked strings of its shapes before); "
         "without it a cold repetition also drops them (the first schema a process sees)");
  f.Bool("constraint-prewarmed", &constraint_prewarmed,
         "a cold repetition keeps only the fragments constrain::PrewarmFragments masks (what "
         "strata serve does at startup): the first schema a server sees");
  Args rest(args.begin() + 1, args.end());
  Status st = f.Parse(rest);
  if (!st.ok()) return UsageError(cmd, st);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  auto kv = ParseKvCacheDtype(kv_dtype, mf);
  if (!kv.ok()) return UsageError(cmd, kv.status());
  if (batch > 1 && (!json_schema_path.empty() || json_object))
    return UsageError(cmd, InvalidArgument("--batch with a constraint: measure constraints at "
                                           "batch 1"));
  if (!f.IsSet("chunked-prefill-size")) mf.max_batch_tokens = prompt_len * batch;
  auto stack = LoadForCli(cmd, mf);
  if (!stack.ok()) return Fail(cmd, stack.status());
  LoadedModel& m = *stack->model;
  EngineOptions eo;
  eo.max_running_requests = static_cast<int32_t>(batch);
  eo.kv_dtype = *kv;
  eo.chunked_prefill_size = static_cast<int32_t>(mf.max_batch_tokens);
  eo.step_recording.enabled = mf.decode_graphs;
  eo.max_total_tokens = batch * (prompt_len + gen_len + 64);
  eo.context_length = prompt_len + gen_len + 1;
  auto engine = Engine::Create(m, *stack->backend, eo);
  if (!engine.ok()) return Fail(cmd, engine.status());
  // Constrained decode (--json-schema / --json-object): the vocabulary's
  // trie is built once, as the server does; the automaton each repetition.
  std::optional<constrain::ConstraintSpec> spec;
  std::shared_ptr<const constrain::Vocabulary> vocab;
  if (!json_schema_path.empty() || json_object) {
    if (!json_schema_path.empty() && json_object)
      return UsageError(cmd, InvalidArgument("--json-schema and --json-object: give one"));
    spec.emplace();
    if (json_object) {
      spec->kind = constrain::ConstraintSpec::Kind::kJsonObject;
    } else {
      std::ifstream in(json_schema_path, std::ios::binary);
      if (!in) return Fail(cmd, NotFound("--json-schema: cannot read " + json_schema_path));
      std::stringstream text;
      text << in.rdbuf();
      spec->kind = constrain::ConstraintSpec::Kind::kJsonSchema;
      spec->text = text.str();
    }
    auto g = constrain::CompileSpec(*spec);  // a bad schema fails here, before any timing
    if (!g.ok()) return Fail(cmd, g.status().Annotate(json_schema_path));
    vocab = constrain::VocabularyFromTokenizer(*m.tokenizer, m.config.vocab_size, m.eos_token_ids);
  }
  double best_cdecode = 0, best_compile_us = 0;
  int64_t ctokens = 0;
  std::unique_ptr<constrain::ConstraintCompiler> compiler;  // one per repetition unless warm
  if (spec && constraint_warm) {
    // One untimed answer: its masks stay in the compiler's cached automaton.
    compiler = std::make_unique<constrain::ConstraintCompiler>(vocab);
    auto a = compiler->Compile(*spec);
    if (!a.ok()) return Fail(cmd, a.status());
    GenerationRequest w;
    for (int64_t i = 0; i < std::min<int64_t>(prompt_len, 16); ++i) w.prompt.push_back(1 + i);
    w.params.temperature = 0;
    w.params.max_tokens = static_cast<int>(gen_len);
    w.constraint = constrain::NewTokenConstraint(std::move(a).value());
    std::vector<GenerationRequest> ws;
    ws.push_back(std::move(w));
    auto wr = engine->get()->Generate(std::move(ws));
    if (!wr.ok()) return Fail(cmd, wr.status());
  }
  std::mt19937 rng(1234);
  const int64_t vocab_hi = std::min<int64_t>(m.config.vocab_size, m.tokenizer->vocab_size()) - 1;
  std::uniform_int_distribution<int32_t> dist(0,
                                              static_cast<int32_t>(std::max<int64_t>(vocab_hi, 1)));
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
  // Tokens x threads / CPU-seconds: what the engine does with the cores it
  // got, for a shared machine where wall-clock rates mostly measure the others.
  double best_prefill_cpu = 0, best_decode_cpu = 0;
  for (int64_t r = 0; r < reps; ++r) {
    // Alternate: bandwidth, then the engine, so drift hits both alike.
    // The host-memory roofline means nothing for a GPU: there it is left 0
    // (docs/perf.md quotes GPU runs against the device's copy bandwidth).
    if (mf.device == "cpu")
      best_bw = std::max(best_bw, MeasureReadBandwidth(size_t{1} << 30, threads));
    Engine* e = engine->get();
    const EngineStats before = e->stats();
    std::vector<GenerationRequest> reqs;
    for (int64_t b = 0; b < batch; ++b) {
      GenerationRequest req;
      for (int64_t i = 0; i < prompt_len; ++i) req.prompt.push_back(dist(rng));
      req.params.temperature = 0;
      req.params.ignore_eos = true;
      req.params.max_tokens = static_cast<int>(gen_len);
      reqs.push_back(std::move(req));
    }
    auto res = e->Generate(std::move(reqs));
    if (!res.ok()) return Fail(cmd, res.status());
    // And after it: the probe is a lower bound on the machine's bandwidth at
    // that moment, so the best of both sides of the run is the roofline.
    if (mf.device == "cpu")
      best_bw = std::max(best_bw, MeasureReadBandwidth(size_t{1} << 30, threads));
    const EngineStats& after = e->stats();
    const double pt = after.prefill_seconds - before.prefill_seconds;
    const double dt = after.decode_seconds - before.decode_seconds;
    if (pt > 0)
      best_prefill = std::max(best_prefill, (after.prefill_tokens - before.prefill_tokens) / pt);
    if (dt > 0)
      best_decode =
          std::max(best_decode, (after.decode_only_tokens - before.decode_only_tokens) / dt);
    if (spec) {
      // Same prompt length, greedy, stopping at the answer's EOS (the
      // constraint forces it within gen_len): decode tokens/s over its steps.
      if (!compiler || !constraint_warm)
        compiler = std::make_unique<constrain::ConstraintCompiler>(vocab);
      if (!constraint_warm && !constraint_fragments) {
        vocab->ClearFragments();
        if (constraint_prewarmed) constrain::PrewarmFragments(vocab);  // untimed
      }
      const auto c0 = std::chrono::steady_clock::now();
      auto automaton = compiler->Compile(*spec);
      if (!automaton.ok()) return Fail(cmd, automaton.status());
      const double compile_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
      best_compile_us = r == 0 ? compile_us : std::min(best_compile_us, compile_us);
      GenerationRequest creq;
      for (int64_t i = 0; i < prompt_len; ++i) creq.prompt.push_back(dist(rng));
      creq.params.temperature = 0;
      creq.params.max_tokens = static_cast<int>(gen_len);
      creq.constraint = constrain::NewTokenConstraint(std::move(automaton).value());
      const EngineStats cb = e->stats();
      std::vector<GenerationRequest> creqs;
      creqs.push_back(std::move(creq));
      auto cres = e->Generate(std::move(creqs));
      if (!cres.ok()) return Fail(cmd, cres.status());
      const EngineStats& ca = e->stats();
      const double cdt = ca.decode_seconds - cb.decode_seconds;
      ctokens = ca.decode_tokens - cb.decode_tokens;
      if (cdt > 0) best_cdecode = std::max(best_cdecode, ctokens / cdt);
    }
    const double pc = (after.prefill_cpu_seconds - before.prefill_cpu_seconds) / threads;
    const double dc = (after.decode_cpu_seconds - before.decode_cpu_seconds) / threads;
    if (pc > 0)
      best_prefill_cpu =
          std::max(best_prefill_cpu, (after.prefill_tokens - before.prefill_tokens) / pc);
    if (dc > 0)
      best_decode_cpu =
          std::max(best_decode_cpu, (after.decode_only_tokens - before.decode_only_tokens) / dc);
  }
  // A decode step reads every weight once (embedding: one row per
  // sequence) and yields `batch` tokens: the roofline is per step.
  const double weight_bytes = static_cast<double>(m.weight_bytes);
  const double roofline = best_bw * 1e9 / weight_bytes * static_cast<double>(batch);
  // What decode actually streamed: weight bytes per step x steps/s, the
  // number to hold against the probe (and against a peer's, computed alike).
  const double decode_read_gb_s = weight_bytes * best_decode / static_cast<double>(batch) / 1e9;
  nlohmann::json j = {{"model", m.dir},
                      {"architecture", m.config.architecture},
                      {"threads", threads},
                      {"backend", stack->backend->Name()},
                      {"prompt_len", prompt_len},
                      {"batch", batch},
                      {"decode_step_ms", best_decode > 0 ? 1e3 * batch / best_decode : 0},
                      {"gen_len", gen_len},
                      {"prefill_tok_s", best_prefill},
                      {"decode_tok_s", best_decode},
                      {"prefill_tok_per_cpu_s", best_prefill_cpu},
                      {"decode_tok_per_cpu_s", best_decode_cpu},
                      {"read_bandwidth_gb_s", best_bw},
                      {"weight_bytes", weight_bytes},
                      {"decode_roofline_tok_s", roofline},
                      {"decode_read_gb_s", decode_read_gb_s},
                      {"decode_vs_roofline", roofline > 0 ? best_decode / roofline : 0},
                      // Decode steps replayed from recordings (CUDA graphs), all repetitions.
                      {"decode_steps_replayed", engine->get()->step_recording_stats().replayed},
                      {"decode_steps_recorded", engine->get()->step_recording_stats().recorded}};
  if (spec) {
    // What the constraint adds per decode step: masks (cold: each
    // repetition compiles afresh), their upload and the masked sampling.
    const double plain_us = best_decode > 0 ? 1e6 / best_decode : 0;
    const double cons_us = best_cdecode > 0 ? 1e6 / best_cdecode : 0;
    j["constraint"] = json_object ? "json_object" : json_schema_path;
    j["constraint_masks"] = constraint_warm        ? "warm"
                            : constraint_fragments ? "cold, fragments warm"
                            : constraint_prewarmed ? "cold, prewarmed (a server's first schema)"
                                                   : "cold";
    j["constrained_decode_tok_s"] = best_cdecode;
    j["constrained_decode_tokens"] = ctokens;
    j["constraint_compile_us"] = best_compile_us;
    j["constraint_step_cost"] = plain_us > 0 ? (cons_us - plain_us) / plain_us : 0;
  }
  if (json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (batch > 1)
      std::printf("batch %lld  decode step %.3f ms  ", static_cast<long long>(batch),
                  j["decode_step_ms"].get<double>());
    std::printf(
        "threads %d  prefill %.1f tok/s  decode %.2f tok/s (reads %.1f GB/s)  bandwidth %.1f GB/s  "
        "roofline %.2f tok/s  decode/roofline %.2f\n",
        threads, best_prefill, best_decode, decode_read_gb_s, best_bw, roofline,
        roofline > 0 ? best_decode / roofline : 0.0);
    if (spec)
      std::printf(
          "constrained decode %.2f tok/s (%lld tokens; compile %.0f us): %+.1f%% per step\n",
          best_cdecode, static_cast<long long>(ctokens), best_compile_us,
          100.0 * j["constraint_step_cost"].get<double>());
  }
  return kExitOk;
}

}  // namespace strata::cli

#include "cli/serve_config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/signals.h"
#include "model/model.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

// The flags that configure HiCache; each needs --enable-hierarchical-cache.
const char* const kHiCacheFlags[] = {
    "hicache-ratio",
    "hicache-size",
    "hicache-write-policy",
    "hicache-storage-backend",
    "hicache-storage-path",
    "hicache-storage-max-gb",
    "hicache-storage-prefetch-policy",
    "hicache-storage-prefetch-timeout-ms",
    "numa-node",
};

std::string MiB(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

bool ServeConfig::Given(const std::string& flag) const {
  return std::find(given.begin(), given.end(), flag) != given.end();
}

void RegisterServeFlags(FlagSet& f, ServeConfig* c) {
  c->model.Register(f);
  f.String("host", &c->host,
           "address to listen on (0.0.0.0: every interface; a warning is logged when that is done "
           "without --api-key)");
  f.Int("port", &c->port, "TCP port (0: any free port, printed at startup)", 0, 65535);
  f.String("served-model-name", &c->served_model_name,
           "model name in the API (default: the model directory's name)");
  f.String("api-key", &c->api_key,
           "require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize and /debug/* "
           "(checked before the body is read)");
  f.Int("max-running-requests", &c->max_running_requests, "requests computed concurrently", 1,
        4096);
  f.Int("max-total-tokens", &c->max_total_tokens, "KV cache size in tokens (0: automatic)", 0,
        int64_t{1} << 40);
  f.Double("schedule-conservativeness", &c->schedule_conservativeness,
           "how much KV to keep for the answers of running requests when admitting more "
           "(SGLang's flag): admission leaves room for 0.7 x this of every running request's "
           "tokens left to generate (at most 1x), falling to 0.1 x this while nothing is "
           "preempted; larger: fewer preemptions, smaller batches (10: none); 0: admit on the "
           "prompt alone",
           0, 100);
  f.Double("mem-fraction-static", &c->mem_fraction_static,
           "--device cuda: the fraction of the GPU's total memory taken at startup, in one "
           "allocation, for the weights, the activations and the KV pool (the KV pool is what "
           "is left; --max-total-tokens caps it); checked before anything is allocated. SGLang's "
           "flag, except that Strata's activations are inside the fraction (SGLang's live in the "
           "rest); in (0, 1]; an error with --device cpu",
           -1e9, 1e9);
  f.Int("page-size", &c->page_size, "tokens per KV page", 1, 1024);
  f.Int("context-length", &c->context_length,
        "longest prompt + output (0: the model's max_position_embeddings)", 0, int64_t{1} << 30);
  f.String("kv-cache-dtype", &c->kv_cache_dtype,
           "KV page element type: f32, bf16, f16 or auto (bf16 on a GPU under bf16 matmul, f32 on "
           "the CPU)");
  f.Bool("disable-radix-cache", &c->disable_radix_cache, "turn off prefix caching");
  f.Int("max-queued-requests", &c->max_queued_requests,
        "admission: most requests waiting for prefill (0: no limit)", 0, int64_t{1} << 30);
  f.Int("max-queued-tokens", &c->max_queued_tokens,
        "admission: most prompt tokens waiting for prefill (0: no limit)", 0, int64_t{1} << 40);
  f.Int("max-queue-time-ms", &c->max_queue_time_ms,
        "admission: refuse requests whose estimated queue wait exceeds this; fail queued ones that "
        "wait longer (0: no limit)",
        0, int64_t{1} << 40);
  f.Int("max-request-body-bytes", &c->max_request_body_bytes, "larger request bodies get 413", 1024,
        int64_t{1} << 32);
  f.Int("max-total-request-body-bytes", &c->max_total_request_body_bytes,
        "most bytes all request bodies being received may hold together; past it 503 + Retry-After "
        "(0: no cap; else >= --max-request-body-bytes)",
        0, int64_t{1} << 40);
  f.Int("io-threads", &c->io_threads, "HTTP I/O threads", 1, 64);
  f.String(
      "tool-call-parser", &c->tool_call_parser,
      "turn the model's tool-call syntax into message.tool_calls for chat requests with tools: "
      "auto (by the chat template), llama3, hermes, qwen25, mistral, deepseekv3 (default: none, "
      "calls stay in the content)");
  f.String("reasoning-parser", &c->reasoning_parser,
           "split <think>...</think> into reasoning_content: qwen3, deepseek-r1 (default: none)");
  f.Int("responses-store-max-items", &c->responses_store_max_items,
        "most /v1/responses responses kept for previous_response_id, item_reference and GET "
        "/v1/responses/{id} (least recently used evicted first; 0: keep none, answer store: "
        "false)",
        0, int64_t{1} << 30);
  f.Int("responses-store-max-bytes", &c->responses_store_max_bytes,
        "most bytes of JSON the /v1/responses store keeps (least recently used evicted first)", 0,
        int64_t{1} << 40);
  f.Int("drain-timeout-s", &c->drain_timeout_s,
        "on SIGTERM, how long in-flight requests may take to finish before the rest are aborted", 0,
        24 * 3600);

  // HiCache (SGLang's flag names and meanings; docs/architecture/hicache.md).
  f.Bool("enable-hierarchical-cache", &c->hicache.enabled,
         "back the device KV pool with a host-memory tier (HiCache): prefixes evicted from the "
         "device stay in host RAM and are copied back instead of recomputed; the host tier is "
         "sized by --hicache-ratio or --hicache-size and checked against the free memory of the "
         "NUMA node(s) and the cgroup limit before anything loads");
  f.Double("hicache-ratio", &c->hicache.ratio,
           "host tier pages = R x device pool pages, in every pool group; must exceed 1", -1e9,
           1e9);
  f.Double("hicache-size", &c->hicache.size_gb,
           "host tier budget in GB (10^9 bytes), split across pool groups in proportion to their "
           "bytes per page; 0: size by --hicache-ratio; not together with --hicache-ratio",
           -1e12, 1e12);
  f.String("hicache-write-policy", &c->hicache_write_policy,
           "when device pages are copied to the host tier: write_through (at insertion), "
           "write_through_selective (once a prefix has been hit), write_back (when evicted from "
           "the device)");
  f.String("hicache-storage-backend", &c->hicache.storage_backend,
           "a storage tier under the host tier: file (one file per page run in "
           "--hicache-storage-path); default: none");
  f.String("hicache-storage-path", &c->hicache.storage_path,
           "directory of the file storage tier (created if missing; must be writable; a restarted "
           "server finds its prefixes there)");
  f.Double("hicache-storage-max-gb", &c->hicache.storage_max_gb,
           "capacity of the storage tier in GB (10^9 bytes); least recently used files are evicted "
           "past it",
           -1e12, 1e12);
  f.String("hicache-storage-prefetch-policy", &c->hicache_prefetch_policy,
           "how long a request waits for its prefix from storage: best_effort (prefill starts with "
           "what has arrived), wait_complete (the whole read), timeout (up to "
           "--hicache-storage-prefetch-timeout-ms)");
  f.Int("hicache-storage-prefetch-timeout-ms", &c->hicache_prefetch_timeout_ms,
        "the wait of --hicache-storage-prefetch-policy timeout", 1, int64_t{1} << 31);
  f.Int("numa-node", &c->numa_node,
        "allocate and bind the host tier on this NUMA node (-1: the nodes this process may "
        "allocate from, Mems_allowed_list in /proc/self/status)",
        -1, 4095);

  // PD disaggregation (SGLang's names where SGLang has the flag).
  f.String("disaggregation-mode", &c->disaggregation_mode,
           "null (colocated: prefill and decode here), prefill or decode (one half of a PD pair "
           "behind `strata router`)");
  f.Int("disaggregation-bootstrap-port", &c->disaggregation_bootstrap_port,
        "prefill: the port decode servers connect to (the bootstrap handshake; 0: any free port, "
        "shown in /server_info)",
        0, 65535);
  f.String("disaggregation-bootstrap-host", &c->disaggregation_bootstrap_host,
           "prefill: the address the bootstrap port listens on (default: --host)");
  f.String("disaggregation-transfer-backend", &c->disaggregation_transfer_backend,
           "how KV pages move from prefill to decode: ucx (its transports by UCX_TLS: tcp across "
           "hosts, shm (shared memory) on one host)");
  f.Int("disaggregation-bootstrap-timeout-ms", &c->disaggregation_bootstrap_timeout_ms,
        "prefill: how long a request waits for its decode to register its pages before it fails "
        "(bootstrap_timeout)",
        1, int64_t{1} << 31);
  f.Int("disaggregation-transfer-timeout-ms", &c->disaggregation_transfer_timeout_ms,
        "how long a room may take from the decode's page registration to the KV and first token "
        "delivered, the prefill's queueing included (transfer_timeout)",
        1, int64_t{1} << 31);
  f.Int("disaggregation-heartbeat-interval-ms", &c->disaggregation_heartbeat_interval_ms,
        "PD peers send a heartbeat this often", 10, 600000);
  f.Int("disaggregation-peer-timeout-ms", &c->disaggregation_peer_timeout_ms,
        "a PD peer silent for this long is lost: its rooms fail (peer_lost) and its connection is "
        "dropped; at least twice --disaggregation-heartbeat-interval-ms",
        20, 3600000);
}

FlagSet MakeServeFlagSet(ServeConfig* config) {
  FlagSet f(
      "serve",
      std::string("Serves the model over an OpenAI-compatible HTTP API (/v1/completions, "
                  "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics). "
                  "Overload is shed at once with 503 + Retry-After by the admission limits. ") +
          ServeSignals::kHelp);
  f.RejectEmptyStrings();
  RegisterServeFlags(f, config);
  return f;
}

void RecordGivenFlags(const FlagSet& flags, ServeConfig* c) {
  c->given = flags.SetFlags();
  c->hicache.ratio_explicit = c->Given("hicache-ratio");
}

int64_t ServeMaxBatchTokens(const ServeConfig& c) {
  return c.model.max_batch_tokens + c.max_running_requests;
}

Status ProbeWritableDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  // std::error_code carries the OS's reason; IoError would append errno's.
  if (ec)
    return FailedPrecondition("cannot create directory " + dir + ": " + ec.message() +
                              " (give a directory this user may create, or create it first)");
  if (!fs::is_directory(dir, ec)) return FailedPrecondition(dir + " exists and is not a directory");
  const std::string probe = dir + "/.strata-write-probe-" + std::to_string(getpid());
  {
    std::ofstream out(probe, std::ios::binary | std::ios::trunc);
    out << "probe";
    out.flush();
    if (!out) {
      return IoError("cannot write a file in " + dir +
                     " (is it read-only or full? give a writable directory)");
    }
  }
  fs::remove(probe, ec);
  if (ec) return FailedPrecondition("cannot remove the probe file " + probe + ": " + ec.message());
  return OkStatus();
}

uint64_t WeightFileBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".safetensors") continue;
    std::error_code size_ec;
    const auto size = fs::file_size(e.path(), size_ec);
    if (!size_ec) total += size;
  }
  return total;
}

ServeEnvironment ReadServeEnvironment(const ServeConfig& config, const std::string& model_dir) {
  ServeEnvironment env;
  if (auto facts = ReadHostMemoryFacts("/"); facts.ok()) env.host = std::move(*facts);
  env.weight_bytes = WeightFileBytes(model_dir);
  if (!config.hicache.storage_path.empty())
    env.storage_path = ProbeWritableDir(config.hicache.storage_path);
  auto ordinal = ParseDeviceFlag(config.model.device);
  const double f = config.mem_fraction_static;
  if (ordinal.ok() && *ordinal >= 0 && f > 0 && f <= 1) {
    env.device = ReadCudaMemoryFacts(*ordinal);
    auto model = ReadModelConfig(model_dir);
    if (!env.device.ok()) {
      env.footprint = env.device.status();
    } else if (!model.ok()) {
      env.footprint = model.status();
    } else {
      ModelOptions mo;
      mo.max_batch_tokens = static_cast<int32_t>(ServeMaxBatchTokens(config));
      env.footprint =
          MeasureModelFootprint(model_dir, *model, mo, config.model.MatmulPrecision() == "bf16");
    }
  }
  return env;
}

ServePlan ValidateServeConfig(const ServeConfig& c, const ModelConfig* model,
                              const ServeEnvironment& env) {
  ServePlan plan;
  auto problem = [&](std::string text) { plan.problems.push_back(std::move(text)); };
  const ModelFlags& mf = c.model;

  // Flag values the ranges of RegisterServeFlags cannot express.
  EngineOptions& eo = plan.engine;
  if (auto kv = ParseKvCacheDtype(c.kv_cache_dtype, mf); kv.ok())
    eo.kv_dtype = *kv;
  else
    problem(kv.status().message());
  const bool kv_ok = plan.problems.empty();  // else memory is not sized for a guessed dtype
  if (mf.matmul_precision != "fp32" && mf.matmul_precision != "bf16" &&
      mf.matmul_precision != "auto")
    problem("--matmul-precision: '" + mf.matmul_precision + "' is not one of fp32, bf16, auto");
  if (mf.isa != "auto" && mf.isa != "avx512" && mf.isa != "avx2" && mf.isa != "scalar")
    problem("--cpu-isa: '" + mf.isa + "' is not one of auto, avx512, avx2, scalar");
  if (!c.tool_call_parser.empty() && c.tool_call_parser != "auto" &&
      !ToolCallFormatFromName(c.tool_call_parser))
    problem("--tool-call-parser: '" + c.tool_call_parser + "' is not one of " +
            std::string(kToolCallParserNames));
  if (c.disaggregation_mode != "null" && c.disaggregation_mode != "prefill" &&
      c.disaggregation_mode != "decode")
    problem("--disaggregation-mode: '" + c.disaggregation_mode +
            "' is not one of null, prefill, decode");
  if (c.disaggregation_transfer_backend != "ucx")
    problem("--disaggregation-transfer-backend: '" + c.disaggregation_transfer_backend +
            "' is not one of ucx");
  if (c.disaggregation_peer_timeout_ms < 2 * c.disaggregation_heartbeat_interval_ms)
    problem("--disaggregation-peer-timeout-ms " + std::to_string(c.disaggregation_peer_timeout_ms) +
            " must be at least twice --disaggregation-heartbeat-interval-ms " +
            std::to_string(c.disaggregation_heartbeat_interval_ms) +
            " (one late heartbeat must not make a live peer lost)");
  if (c.disaggregation_mode == "prefill" && c.disaggregation_bootstrap_port != 0 &&
      c.disaggregation_bootstrap_port == c.port)
    problem("--disaggregation-bootstrap-port " + std::to_string(c.disaggregation_bootstrap_port) +
            " is also --port: give the bootstrap endpoint its own port (default 8998)");
  if (c.disaggregation_mode != "null" && mf.device != "cpu")
    problem("--disaggregation-mode " + c.disaggregation_mode + " with --device " + mf.device +
            ": the PD transfer moves host-memory KV pools only for now (Debian's UCX has no CUDA "
            "transports; GPU pools need the CUDA IPC transport, not built yet): use --device cpu");
  if (c.disaggregation_mode == "null") {
    for (const char* flag :
         {"disaggregation-bootstrap-port", "disaggregation-bootstrap-host",
          "disaggregation-transfer-backend", "disaggregation-bootstrap-timeout-ms",
          "disaggregation-transfer-timeout-ms"})
      if (c.Given(flag))
        problem(std::string("--") + flag +
                " applies only to a PD role: add --disaggregation-mode prefill or decode");
  }
  auto ordinal = ParseDeviceFlag(mf.device);
  if (!ordinal.ok()) problem(ordinal.status().message());
  const bool on_gpu = ordinal.ok() && *ordinal >= 0;
  const double frac = c.mem_fraction_static;
  const bool frac_ok = frac > 0 && frac <= 1;
  if (!frac_ok)
    problem("--mem-fraction-static " + Num(frac) +
            " is outside (0, 1]: it is the fraction of the GPU's total memory for the weights, "
            "activations and KV pool (SGLang's flag; typically 0.8-0.9, default " +
            Num(kDefaultMemFractionStatic) + ")");
  else if (ordinal.ok() && !on_gpu && c.Given("mem-fraction-static"))
    problem(
        "--mem-fraction-static sizes GPU memory and does nothing with --device cpu (there "
        "the KV pool is --max-total-tokens, by default enough for --max-running-requests "
        "full contexts up to 1 GiB): remove it, or use --device cuda");
  if (!c.reasoning_parser.empty() && !ReasoningFormatFromName(c.reasoning_parser))
    problem("--reasoning-parser: '" + c.reasoning_parser + "' is not one of " +
            std::string(kReasoningParserNames));
  if (c.max_total_request_body_bytes != 0 &&
      c.max_total_request_body_bytes < c.max_request_body_bytes)
    problem("--max-total-request-body-bytes " + std::to_string(c.max_total_request_body_bytes) +
            " is smaller than --max-request-body-bytes " +
            std::to_string(c.max_request_body_bytes) + " (allowed 0 for no cap, or " +
            std::to_string(c.max_request_body_bytes) + ".." + std::to_string(int64_t{1} << 40) +
            ")");
  if (c.max_total_tokens > 0 && c.max_total_tokens < c.page_size)
    problem("--max-total-tokens " + std::to_string(c.max_total_tokens) +
            " is smaller than one page (--page-size " + std::to_string(c.page_size) + ")");
  eo.page_size = static_cast<int32_t>(c.page_size);
  eo.max_total_tokens = c.max_total_tokens;
  eo.max_running_requests = static_cast<int32_t>(c.max_running_requests);
  eo.schedule_conservativeness = c.schedule_conservativeness;
  eo.chunked_prefill_size = static_cast<int32_t>(mf.max_batch_tokens);
  eo.step_recording.enabled = mf.decode_graphs;
  eo.context_length = c.context_length;
  eo.disable_radix_cache = c.disable_radix_cache;
  // PD moves every pool group by page id: no window backing (engine.h),
  // so the plan sizes the pool as the engine will.
  eo.window_backing = c.disaggregation_mode == "null";

  // HiCache flags.
  HiCacheOptions& h = eo.hicache;
  h = c.hicache;
  h.ratio_explicit = c.Given("hicache-ratio");
  h.numa_node = static_cast<int>(c.numa_node);
  h.prefetch_timeout_ms = c.hicache_prefetch_timeout_ms;
  if (auto w = ParseWritePolicy(c.hicache_write_policy); w.ok())
    h.write_policy = *w;
  else
    problem(w.status().message());
  if (auto p = ParsePrefetchPolicy(c.hicache_prefetch_policy); p.ok())
    h.prefetch_policy = *p;
  else
    problem(p.status().message());
  if (!h.enabled) {
    std::string without;
    for (const char* flag : kHiCacheFlags)
      if (c.Given(flag)) without += std::string(without.empty() ? "" : ", ") + "--" + flag;
    if (!without.empty())
      problem(without + (without.find(',') == std::string::npos ? " has" : " have") +
              " no effect without --enable-hierarchical-cache: add --enable-hierarchical-cache, or "
              "remove " +
              (without.find(',') == std::string::npos ? "it" : "them"));
  } else if (c.disable_radix_cache) {
    problem(
        "--enable-hierarchical-cache needs the prefix cache, which --disable-radix-cache turns off "
        "(the host tier holds prefixes the radix cache evicts): remove one of the two");
  }
  if (!h.storage_backend.empty() && h.storage_backend != "file")
    problem("--hicache-storage-backend: '" + h.storage_backend +
            "' is not a storage backend (allowed: file; leave the flag out for no storage tier)");
  if (h.storage_backend == "file" && h.storage_path.empty())
    problem(
        "--hicache-storage-backend file needs --hicache-storage-path DIR (the directory the tier "
        "writes its files to)");
  if (h.storage_backend.empty() && !h.storage_path.empty())
    problem("--hicache-storage-path " + h.storage_path +
            " needs --hicache-storage-backend file (without a backend there is no storage tier)");
  if (!h.storage_path.empty() && !env.storage_path.ok())
    problem("--hicache-storage-path " + h.storage_path + ": " + env.storage_path.message());
  if (c.Given("hicache-storage-max-gb") && !(h.storage_max_gb > 0))
    problem("--hicache-storage-max-gb " + std::to_string(h.storage_max_gb) +
            ": the storage capacity must be a positive number of GB (default " +
            std::to_string(static_cast<int>(kDefaultStorageMaxGb)) + ")");
  if (c.Given("hicache-storage-max-gb") && h.storage_backend.empty())
    problem(
        "--hicache-storage-max-gb needs --hicache-storage-backend file (it is the storage tier's "
        "capacity)");
  if (c.Given("hicache-storage-prefetch-policy") && h.storage_backend.empty())
    problem(
        "--hicache-storage-prefetch-policy needs --hicache-storage-backend file (it says how "
        "long a request waits for the storage tier)");
  if (c.Given("hicache-storage-prefetch-timeout-ms") &&
      h.prefetch_policy != PrefetchPolicy::kTimeout)
    problem(
        "--hicache-storage-prefetch-timeout-ms applies only to --hicache-storage-prefetch-policy "
        "timeout (the policy is " +
        c.hicache_prefetch_policy +
        "): add --hicache-storage-prefetch-policy timeout, or remove it");
  if (h.enabled && h.numa_node >= 0) {
    if (Status s = CheckNumaNode(env.host, h.numa_node); !s.ok()) problem(s.message());
  }

  if (!model) return plan;

  // Against the model's config.json.
  if (c.context_length > 0 && model->max_position_embeddings > 0 &&
      c.context_length > model->max_position_embeddings)
    problem("--context-length " + std::to_string(c.context_length) +
            " exceeds the model's max_position_embeddings " +
            std::to_string(model->max_position_embeddings) + " (allowed 1.." +
            std::to_string(model->max_position_embeddings) + ")");
  // An unknown architecture is the model's problem, not the flags': the
  // load reports it (exit 65) with the supported list.
  auto layout = KvLayoutForConfig(*model, eo.page_size, eo.kv_dtype);
  if (!layout.ok()) {
    if (layout.status().code() != StatusCode::kUnimplemented) problem(layout.status().message());
    return plan;
  }
  plan.layout = *layout;
  const int64_t context = EffectiveContextLength(eo, model->max_position_embeddings);
  auto pages = PlanKvPoolPages(*layout, eo, context);
  if (!pages.ok()) {
    problem("--max-total-tokens " + std::to_string(c.max_total_tokens) + ": " +
            pages.status().message());
    return plan;
  }
  plan.device_pages = *pages;
  if (!kv_ok) return plan;
  if (on_gpu && frac_ok && !env.device.ok()) {
    plan.warnings.push_back("GPU memory not checked (" + env.device.status().message() +
                            "): the model's fit in --mem-fraction-static is known only where the "
                            "GPU is visible");
  } else if (on_gpu && frac_ok && env.footprint.ok()) {
    // An unloadable model (env.footprint's error) is the load's to report.
    DeviceMemoryPlanInput in;
    in.device = *env.device;
    in.mem_fraction_static = frac;
    in.bf16_matmul = mf.MatmulPrecision() == "bf16";
    in.model = *env.footprint;
    in.layout = *layout;
    in.vocab_size = model->vocab_size;
    in.runner = EngineRunnerLimits(eo, context, static_cast<int32_t>(ServeMaxBatchTokens(c)),
                                   model->vocab_size);
    in.max_total_tokens = c.max_total_tokens;
    in.context_length = context;
    auto gpu = PlanDeviceMemory(in);
    if (!gpu.ok()) {
      problem(gpu.status().message());
      return plan;
    }
    for (const std::string& w : gpu->warnings) plan.warnings.push_back(w);
    plan.device_pages = gpu->kv_pages;
    eo.kv_pool_pages = gpu->kv_pages;
    plan.device_memory = *gpu;
    pages = gpu->kv_pages;
  }
  const uint64_t pool_bytes = static_cast<uint64_t>(*pages) * layout->BytesPerPage();
  const bool pool_in_host = mf.device == "cpu";
  if (pool_in_host && c.max_total_tokens > 0) {
    const uint64_t avail = AllowedFreeBytes(env.host, -1);
    if (avail > 0 && pool_bytes > avail)
      problem("--max-total-tokens " + std::to_string(c.max_total_tokens) + " needs " +
              MiB(pool_bytes) + " of KV cache but only " + MiB(avail) +
              " of memory is available (allowed up to about " +
              std::to_string(avail / layout->BytesPerToken()) + " tokens at --kv-cache-dtype " +
              c.kv_cache_dtype + ")");
  }
  if (h.enabled) {
    if (env.host.nodes.empty()) {
      problem(
          "--enable-hierarchical-cache: this machine's free memory cannot be read (neither "
          "/sys/devices/system/node/node*/meminfo nor /proc/meminfo), so the host tier cannot be "
          "checked; run without --enable-hierarchical-cache");
      return plan;
    }
    HiCacheOptions sizing = h;
    // A bad --numa-node is a problem above; size on the allowed nodes so the
    // other sizing problems are reported with it.
    if (!CheckNumaNode(env.host, sizing.numa_node).ok()) sizing.numa_node = -1;
    const uint64_t in_host = pool_in_host ? env.weight_bytes + pool_bytes : 0;
    const uint64_t reserve = DefaultHostReserveBytes(env.host, sizing.numa_node, in_host);
    auto tier = PlanHostTier(*layout, *pages, sizing, env.host, reserve);
    if (!tier.ok()) {
      problem(tier.status().message());
    } else {
      for (const std::string& w : tier->warnings) plan.warnings.push_back(w);
      plan.host_tier = *tier;
    }
  }
  return plan;
}

}  // namespace strata::cli

// The configuration of `strata serve`: every flag's value (ServeConfig),
// their registration with --help text (RegisterServeFlags), and the check
// that every configuration is valid before anything starts
// (ValidateServeConfig), which `strata serve` runs before any weight is
// read and `strata check` can run alone.
//
// Validation is split so that it is pure: ReadServeEnvironment does the
// I/O (host memory facts, weight file sizes, a probe of the storage
// directory) and ValidateServeConfig computes every problem from values:
// each says what is wrong, what is allowed and the fix, and all of them are
// reported at once (exit 78, kExitConfig).
//
// Plain values and free functions; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/hicache_plan.h"
#include "cli/common.h"
#include "engine/device_memory_plan.h"
#include "engine/engine.h"
#include "model/hf_config.h"
#include "server/response_store.h"
#include "util/flags.h"
#include "util/host_memory.h"

namespace strata::cli {

// SGLang's usual value on 80-141 GB GPUs (its default is derived from the
// GPU's memory; about 10 GiB are left outside the fraction on big GPUs).
inline constexpr double kDefaultMemFractionStatic = 0.88;

struct ServeConfig {
  ModelFlags model;  // --model-path, --device, --threads, --chunked-prefill-size, ...
  std::string host = "127.0.0.1";
  int64_t port = 8000;
  std::string served_model_name;  // empty: the model directory's name
  std::string api_key;
  int64_t max_running_requests = 64;
  double schedule_conservativeness = 1.0;  // engine.h EngineOptions
  int64_t max_total_tokens = 0;  // 0: automatic (engine/engine.h PlanKvPoolPages)
  // --device cuda: the fraction of the GPU's total memory the one arena of
  // weights, activations and KV pool takes (engine/device_memory_plan.h).
  double mem_fraction_static = kDefaultMemFractionStatic;
  int64_t page_size = 16;
  int64_t context_length = 0;  // 0: the model's max_position_embeddings
  std::string kv_cache_dtype = "auto";
  bool disable_radix_cache = false;
  int64_t max_queued_requests = 256;
  int64_t max_queued_tokens = 0;
  int64_t max_queue_time_ms = 0;
  int64_t max_request_body_bytes = int64_t{32} << 20;
  int64_t max_total_request_body_bytes = int64_t{256} << 20;
  int64_t io_threads = 1;
  int64_t drain_timeout_s = 30;
  std::string tool_call_parser;  // "": none; else auto or a name (server/tool_call_parser.h)
  std::string reasoning_parser;  // "": none; else qwen3 or deepseek-r1
  // /v1/responses' store bounds (server/response_store.h has the defaults).
  int64_t responses_store_max_items = ResponseStoreOptions().max_items;
  int64_t responses_store_max_bytes = ResponseStoreOptions().max_bytes;
  // HiCache: the numeric and bool flags bind into `hicache` directly; these
  // hold the text and int64 flags until ValidateServeConfig resolves them.
  HiCacheOptions hicache;
  std::string hicache_write_policy = "write_through";
  std::string hicache_prefetch_policy = "best_effort";
  int64_t hicache_prefetch_timeout_ms = kDefaultPrefetchTimeoutMs;
  int64_t numa_node = -1;
  // PD disaggregation (SGLang's flag names; docs/architecture/disagg.md).
  std::string disaggregation_mode = "null";  // null (colocated), prefill, decode
  int64_t disaggregation_bootstrap_port = 8998;
  std::string disaggregation_bootstrap_host;  // "": the --host value
  std::string disaggregation_transfer_backend = "ucx";
  int64_t disaggregation_bootstrap_timeout_ms = 30000;
  int64_t disaggregation_transfer_timeout_ms = 120000;
  int64_t disaggregation_heartbeat_interval_ms = 1000;
  int64_t disaggregation_peer_timeout_ms = 5000;
  // Names (without --) of the flags given on the command line; set by
  // RecordGivenFlags after FlagSet::Parse.
  std::vector<std::string> given;

  bool Given(const std::string& flag) const;
};

// Registers every serve flag, bound to `config`'s fields (the defaults are
// the fields' initial values).
void RegisterServeFlags(FlagSet& flags, ServeConfig* config);
// The FlagSet of `strata serve`: RegisterServeFlags plus the empty-string
// rule. Every serve command line and every serve service of a deployment
// file (cli/deploy_config.h) is parsed with it. `config` must outlive it.
FlagSet MakeServeFlagSet(ServeConfig* config);
// After flags.Parse(): records which flags were given (config->given and
// hicache.ratio_explicit).
void RecordGivenFlags(const FlagSet& flags, ServeConfig* config);
// The most rows one forward step of `strata serve` carries: a prompt chunk
// (--chunked-prefill-size) plus one decode token per running request.
int64_t ServeMaxBatchTokens(const ServeConfig& config);

// What validation needs to know about the machine and the model files.
struct ServeEnvironment {
  HostMemoryFacts host;
  uint64_t weight_bytes = 0;  // sum of the model's *.safetensors sizes
  // The probe of --hicache-storage-path (OK when none is given).
  Status storage_path = OkStatus();
  // --device cuda[:N] only: the GPU's memory facts (Unavailable, saying why,
  // where no GPU is visible) and what loading the model puts on it
  // (MeasureModelFootprint; the model's own error when it cannot load).
  StatusOr<DeviceMemoryFacts> device = Unavailable("its memory facts were not read");
  StatusOr<ModelFootprint> footprint = Unavailable("not measured");
};

// I/O: reads the host memory facts, stats the weight files of `model_dir`
// (no read), and probes --hicache-storage-path (ProbeWritableDir). A failure
// to read host facts leaves them empty (the HiCache plan then says so). On
// --device cuda[:N] with a valid --mem-fraction-static also the GPU's
// memory facts (this creates the device's CUDA context) and the model's
// footprint from its checkpoint headers.
ServeEnvironment ReadServeEnvironment(const ServeConfig& config, const std::string& model_dir);

// Creates `dir` if missing, writes and removes a temporary file in it.
// IoError naming the directory and the step that failed.
Status ProbeWritableDir(const std::string& dir);
// Sum of the sizes of *.safetensors files in `dir` (0 if none or unreadable).
uint64_t WeightFileBytes(const std::string& dir);

struct ServePlan {
  std::vector<std::string> problems;  // empty: the configuration is valid
  std::vector<std::string> warnings;  // valid, but worth a log line
  EngineOptions engine;               // every engine option resolved from the flags
  // Known when the model config was given and its architecture is known.
  std::optional<KvLayout> layout;
  int64_t device_pages = 0;
  std::optional<HostTierPlan> host_tier;  // with --enable-hierarchical-cache
  // --device cuda with the GPU's facts known: the arena's plan, whose KV
  // pages are device_pages (and engine.kv_pool_pages).
  std::optional<DeviceMemoryPlan> device_memory;
  bool ok() const { return problems.empty(); }
};

// Every problem of `config`: flag values the ranges of RegisterServeFlags
// cannot express and combinations (--kv-cache-dtype, --cpu-isa,
// --matmul-precision, body caps, --max-total-tokens vs --page-size, every
// --hicache-* and --numa-node rule); with `model` (config.json, may be
// null when it could not be read) also --context-length vs the model, the
// device pool against host memory on --device cpu, the HiCache host-tier
// plan (cache/hicache_plan.h) against env.host, and on --device cuda the
// GPU memory plan (engine/device_memory_plan.h) against env.device, which
// then sizes the device pool. --mem-fraction-static must be in (0, 1] and
// is an error with --device cpu (it would size nothing there).
ServePlan ValidateServeConfig(const ServeConfig& config, const ModelConfig* model,
                              const ServeEnvironment& env);

}  // namespace strata::cli

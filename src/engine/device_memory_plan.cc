#include "engine/device_memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "model/weights.h"
#include "util/logging.h"

namespace strata {
namespace {

std::string GiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

std::string Fraction(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", f);
  return buf;
}

// The smallest fraction, in hundredths, whose arena holds `bytes`.
double SmallestFraction(const DeviceMemoryFacts& d, uint64_t bytes) {
  for (int h = 1; h <= 100; ++h)
    if (ArenaBytes(d, h / 100.0) >= bytes) return h / 100.0;
  return 2;  // more than the whole GPU
}

// A backend that runs no op and allocates nothing: it records what a load
// would take (every Allocate and UploadWeight, rounded as the arena rounds)
// and hands out addresses of a fake range nobody dereferences (model code
// never reads backend memory on the host: on CUDA it could not).
class PlanningBackend final : public Backend {
 public:
  explicit PlanningBackend(bool bf16) : bf16_(bf16) {}
  std::string Name() const override { return "memory planning (no device)"; }

  StatusOr<Buffer> Allocate(size_t bytes) override {
    fp_.buffer_bytes += ArenaBlockBytes(bytes);
    return Buffer(Fake(bytes), bytes, static_cast<void (*)(void*)>(nullptr));
  }
  StatusOr<Tensor> UploadWeight(const Tensor& host) override {
    const DType keep = CudaWeightDType(host.dtype, bf16_);
    const uint64_t elems = static_cast<uint64_t>(host.rows) * static_cast<uint64_t>(host.cols);
    fp_.num_weights++;
    fp_.checkpoint_bytes += elems * DTypeSize(host.dtype);
    fp_.weight_bytes += ArenaBlockBytes(elems * DTypeSize(keep));
    if (keep != host.dtype)
      fp_.max_staging_bytes =
          std::max<uint64_t>(fp_.max_staging_bytes, ArenaBlockBytes(elems * DTypeSize(host.dtype)));
    if (DTypeSize(keep) == 2) fp_.max_16bit_cols = std::max(fp_.max_16bit_cols, host.cols);
    return Tensor{Fake(elems * DTypeSize(keep)), keep, host.rows, host.cols, 0};
  }
  void CopyToDevice(void*, const void*, size_t) override {}
  void CopyToHost(void* dst, const void*, size_t bytes) override { std::memset(dst, 0, bytes); }
  Status CopyBlocks(std::span<const CopyBlock>, CopyKind) override {
    return Internal("the memory-planning backend copies no pages");
  }
  void Embedding(const Tensor&, const int32_t*, Tensor) override { NoOps(); }
  void RmsNorm(const Tensor&, const Tensor&, float, Tensor) override { NoOps(); }
  void Linear(const Tensor&, const Tensor&, const Tensor*, Tensor) override { NoOps(); }
  void SiluMul(const Tensor&, const Tensor&, Tensor) override { NoOps(); }
  void Add(const Tensor&, const Tensor&, Tensor) override { NoOps(); }
  void Rope(Tensor, Tensor, const int32_t*, const RopeParams&) override { NoOps(); }
  void StoreKv(const Tensor&, const Tensor&, const KvLayerView&, const int64_t*) override {
    NoOps();
  }
  void PagedAttention(const Tensor&, const KvLayerView&, const AttentionSeq*, int32_t,
                      const AttentionParams&, Tensor) override {
    NoOps();
  }
  void GatherRows(const Tensor&, const int32_t*, Tensor) override { NoOps(); }
  void ScaleAddRows(const Tensor&, const int32_t*, const float*, Tensor) override { NoOps(); }

  const ModelFootprint& footprint() const { return fp_; }

 private:
  [[noreturn]] static void NoOps() {
    STRATA_CHECK(false) << "the memory-planning backend runs no ops (a model computed at load?)";
    std::abort();
  }
  void* Fake(uint64_t bytes) {
    void* p = reinterpret_cast<void*>(next_);
    next_ += ArenaBlockBytes(bytes);
    return p;
  }

  bool bf16_;
  ModelFootprint fp_;
  uintptr_t next_ = uintptr_t{1} << 44;
};

}  // namespace

StatusOr<ModelFootprint> MeasureModelFootprint(const std::string& dir, const ModelConfig& config,
                                               const ModelOptions& options, bool bf16_matmul) {
  ModelFactory factory = FindArchitecture(config.architecture);
  if (!factory)
    return Unimplemented(dir + "/config.json: architecture '" + config.architecture +
                         "' is not supported");
  ASSIGN_OR_RETURN(WeightStore weights, WeightStore::Open(dir));
  PlanningBackend backend(bf16_matmul);
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, factory(config, weights, backend, options));
  return backend.footprint();
}

std::string DeviceMemoryPlan::Describe() const {
  const uint64_t tokens = static_cast<uint64_t>(kv_pages) * static_cast<uint64_t>(page_size);
  std::string s =
      "arena " + GiB(arena_bytes) + " = --mem-fraction-static " + Fraction(mem_fraction_static) +
      " x " + GiB(device.total_bytes) + " of cuda:" + std::to_string(device.device) +
      (device.name.empty() ? "" : " (" + device.name + ")") + ": weights " + GiB(weight_bytes) +
      " + activations " + GiB(activation_bytes()) + " (model workspace " + GiB(model_buffer_bytes) +
      ", per-step buffers " + GiB(runner_bytes) + ", backend " + GiB(backend_bytes) +
      ") + KV pool " + GiB(kv_bytes) + " (" + std::to_string(kv_pages) + " pages x " +
      std::to_string(page_size) + " = " + std::to_string(tokens) + " tokens)";
  if (unused_bytes >= (uint64_t{1} << 30) / 100) s += " + unused " + GiB(unused_bytes);
  return s;
}

StatusOr<DeviceMemoryPlan> PlanDeviceMemory(const DeviceMemoryPlanInput& in) {
  RETURN_IF_ERROR(in.layout.Validate());
  if (!(in.mem_fraction_static > 0 && in.mem_fraction_static <= 1))
    return InvalidArgument("--mem-fraction-static " + Fraction(in.mem_fraction_static) +
                           " is outside (0, 1]");
  const DeviceMemoryFacts& d = in.device;
  DeviceMemoryPlan p;
  p.device = d;
  p.mem_fraction_static = in.mem_fraction_static;
  p.page_size = in.layout.page_size;
  p.arena_bytes = ArenaBytes(d, in.mem_fraction_static);
  p.weight_bytes = in.model.weight_bytes;
  p.model_buffer_bytes = in.model.buffer_bytes;
  // Windowed groups may get a window backing (its arrays counted either way).
  p.runner_bytes =
      ModelRunner::DeviceBytes(in.runner, in.vocab_size, in.layout.MaxSlidingWindow() > 0);
  int max_head_dim = 0;
  for (const PoolGroupSpec& g : in.layout.groups) max_head_dim = std::max(max_head_dim, g.head_dim);
  p.backend_bytes =
      CudaBackendArenaBytes(in.bf16_matmul, in.runner.max_batch_tokens, in.model.max_16bit_cols) +
      CudaBackendStepArenaBytes(in.runner.max_logit_rows, in.vocab_size, max_head_dim);
  const std::string frac = Fraction(in.mem_fraction_static);
  const std::string arena = "--mem-fraction-static " + frac + " x " + GiB(d.total_bytes) +
                            " of cuda:" + std::to_string(d.device) + " = " + GiB(p.arena_bytes);
  const std::string widened =
      in.model.weight_bytes >
              in.model.checkpoint_bytes + in.model.num_weights * kDeviceArenaAlignment
          ? " (--matmul-precision fp32 widens the checkpoint's " + GiB(in.model.checkpoint_bytes) +
                " to F32; --matmul-precision bf16 keeps BF16 weights as they are)"
          : "";
  // How to fix a shortfall of `need` bytes in the arena.
  auto fix = [&](uint64_t need) {
    const double f = SmallestFraction(d, need);
    if (f > 1)
      return std::string("; this does not fit the GPU's ") + GiB(d.total_bytes) +
             " at any fraction" + widened + " (or use a GPU with more memory)";
    if (ArenaBytes(d, f) > d.free_bytes)
      return "; the smallest fraction that fits is " + Fraction(f) + ", but only " +
             GiB(d.free_bytes) + " of the GPU is free (another process holds the rest: nvidia-smi)";
    return "; the smallest fraction that fits is " + Fraction(f) + ": raise --mem-fraction-static" +
           widened;
  };

  if (p.arena_bytes > d.free_bytes) {
    const double most =
        std::floor(static_cast<double>(d.free_bytes) /
                   static_cast<double>(std::max<uint64_t>(1, d.total_bytes)) * 100) /
        100;
    return FailedPrecondition(arena + ", but only " + GiB(d.free_bytes) +
                              " of it is free (another process holds the rest: see nvidia-smi); "
                              "lower --mem-fraction-static to at most " +
                              Fraction(most) + " or free the GPU");
  }
  const uint64_t fixed = p.weight_bytes + p.activation_bytes();
  const int num_groups = static_cast<int>(in.layout.groups.size());
  const uint64_t one_page = in.layout.BytesPerPage() + num_groups * kDeviceArenaAlignment;
  const std::string terms = "weights " + GiB(p.weight_bytes) + " + activations " +
                            GiB(p.activation_bytes()) + " (model workspace " +
                            GiB(p.model_buffer_bytes) + ", per-step buffers " +
                            GiB(p.runner_bytes) + ", backend " + GiB(p.backend_bytes) + ")";
  if (fixed + one_page > p.arena_bytes)
    return FailedPrecondition(terms +
                              (fixed > p.arena_bytes ? " exceed " : " leave no KV page in ") +
                              arena + fix(fixed + one_page));
  // Loading: the backend's buffers and the weights so far, plus the staging
  // copy of a widened weight, before the workspace and the pool exist.
  const uint64_t load_peak = p.backend_bytes + p.weight_bytes + in.model.max_staging_bytes;
  if (load_peak > p.arena_bytes)
    return FailedPrecondition(
        "loading needs weights " + GiB(p.weight_bytes) +
        " + the staging copy of the largest widened weight " + GiB(in.model.max_staging_bytes) +
        " + backend " + GiB(p.backend_bytes) + " at once, more than " + arena + fix(load_peak));

  // The remainder in whole pages: each group is one block of the arena.
  const uint64_t rest = p.arena_bytes - fixed - num_groups * kDeviceArenaAlignment;
  const int64_t fit =
      static_cast<int64_t>(std::min<uint64_t>(rest / in.layout.BytesPerPage(), kMaxKvPages));
  p.kv_pages_fit = fit;
  p.kv_pages = fit;
  if (in.max_total_tokens > 0) {
    ASSIGN_OR_RETURN(const int64_t cap, NumKvPagesForTokens(in.layout, in.max_total_tokens));
    if (cap <= fit) {
      p.kv_pages = cap;
    } else {
      p.warnings.push_back("--max-total-tokens " + std::to_string(in.max_total_tokens) +
                           " is more than the " + std::to_string(fit * in.layout.page_size) +
                           " tokens that fit in " + arena + " after " + terms +
                           "; the KV pool holds those (raise --mem-fraction-static for more)");
    }
  }
  for (int g = 0; g < num_groups; ++g)
    p.kv_bytes += ArenaBlockBytes(static_cast<uint64_t>(p.kv_pages) * in.layout.BytesPerPage(g));
  p.unused_bytes = p.arena_bytes - fixed - p.kv_bytes;
  const int64_t pool_tokens = p.kv_pages * in.layout.page_size;
  if (in.context_length > 0 && pool_tokens < in.context_length + 1)
    p.warnings.push_back("the KV pool holds " + std::to_string(pool_tokens) +
                         " tokens, fewer than one request of the context length " +
                         std::to_string(in.context_length) +
                         " needs: longer prompts will be refused (raise --mem-fraction-static or "
                         "lower --context-length)");
  return p;
}

}  // namespace strata

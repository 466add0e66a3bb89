#include "cli/common.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "cli/cli.h"

namespace strata::cli {

int Fail(const std::string& cmd, const Status& st) {
  std::fprintf(stderr, "strata %s: error: %s\n", cmd.c_str(), st.message().c_str());
  switch (st.code()) {
    case StatusCode::kNotFound:
      return kExitNoInput;
    case StatusCode::kDataLoss:
    case StatusCode::kUnimplemented:
    case StatusCode::kInvalidArgument:
      return kExitData;
    default:
      return kExitFailure;
  }
}

int UsageError(const std::string& cmd, const Status& st) {
  std::fprintf(stderr, "strata %s: %s\n(see strata %s --help)\n", cmd.c_str(), st.message().c_str(),
               cmd.c_str());
  return kExitUsage;
}

void ModelFlags::Register(FlagSet& f) {
  f.String("model-path", &model_path,
           "Hugging Face model directory (config.json, *.safetensors, tokenizer.json); "
           "default: the embedded demo model");
  f.String("device", &device, "where the model runs: cpu (default), cuda (GPU 0) or cuda:N");
  f.Int("threads", &threads, "CPU threads for compute (0: all cores)", 0, 4096);
  f.String("cpu-isa", &isa, "highest CPU instruction set: auto, avx512, avx2, scalar");
  f.String("matmul-precision", &matmul_precision,
           "fp32 (exact), bf16 (activations rounded to bf16; half the weight memory on a GPU, "
           "faster prefill) or auto: bf16 on --device cuda, fp32 on the CPU");
  f.Int("chunked-prefill-size", &max_batch_tokens, "most tokens one forward step carries", 1,
        1 << 20);
  f.Bool("decode-graphs", &decode_graphs,
         "on a GPU, replay decode steps of up to 64 sequences as recorded CUDA graphs "
         "(--decode-graphs=false issues every op, for comparison)");
  f.Bool("skip-weight-check", &skip_weight_check,
         "load even if a tensor holds NaN/Inf (by default a sample of every tensor is checked "
         "and such a model is refused with exit 65)");
}

namespace {

void ProgressBar(size_t done, size_t total) {
  static int last = -1;
  const int pct = total ? static_cast<int>(done * 100 / total) : 100;
  if (pct == last) return;
  last = pct;
  const int width = 30, filled = pct * width / 100;
  std::fprintf(stderr, "\rloading weights [%.*s%*s] %3d%% %.2f/%.2f GiB", filled,
               "##############################", width - filled, "", pct, done / 1073741824.0,
               total / 1073741824.0);
  if (done >= total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

double ResidentGiB() {
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0;
    if (std::fscanf(f, "%ld %ld", &size, &pages) != 2) pages = 0;
    std::fclose(f);
  }
  return pages * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1073741824.0;
}

}  // namespace

StatusOr<DType> ParseKvCacheDtype(const std::string& kv, const ModelFlags& flags) {
  if (kv == "auto")
    return flags.device != "cpu" && flags.MatmulPrecision() == "bf16" ? DType::kBF16 : DType::kF32;
  if (kv == "f32" || kv == "float32") return DType::kF32;
  if (kv == "bf16" || kv == "bfloat16") return DType::kBF16;
  if (kv == "f16" || kv == "float16") return DType::kF16;
  return InvalidArgument("--kv-cache-dtype: '" + kv + "' is not one of auto, f32, bf16, f16");
}

StatusOr<int> ParseDeviceFlag(const std::string& d) {
  if (d == "cpu") return -1;
  if (d == "cuda") return 0;
  if (d.rfind("cuda:", 0) == 0) {
    const std::string n = d.substr(5);
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos)
      return InvalidArgument("--device " + d +
                             ": expected cuda:N with N a GPU number, e.g. cuda:0");
    return std::stoi(n);
  }
  return InvalidArgument("--device " + d + ": expected cpu, cuda or cuda:N");
}

namespace {

// --device cpu | cuda | cuda:N.
StatusOr<std::unique_ptr<Backend>> CreateBackendForCli(const ModelFlags& flags) {
  ASSIGN_OR_RETURN(const int ordinal, ParseDeviceFlag(flags.device));
  if (ordinal < 0) {
    CpuBackendOptions bo;
    bo.num_threads = static_cast<int>(flags.threads);
    bo.isa = flags.isa;
    bo.matmul_precision = flags.MatmulPrecision();
    return CreateCpuBackend(bo);
  }
  CudaBackendOptions co;
  co.matmul_precision = flags.MatmulPrecision();
  co.device = ordinal;
  co.mem_fraction_static = flags.mem_fraction_static;
  return CreateCudaBackend(co);
}

}  // namespace

StatusOr<LoadedStack> LoadForCli(const std::string& cmd, const ModelFlags& flags) {
  LoadedStack s;
  std::string dir = flags.model_path;
  if (dir.empty()) {
    ASSIGN_OR_RETURN(dir, EnsureDemoModel());
    std::fprintf(stderr, "strata %s: no --model-path given; using the embedded demo model at %s\n",
                 cmd.c_str(), dir.c_str());
  }
  ASSIGN_OR_RETURN(s.backend, CreateBackendForCli(flags));
  LoadOptions lo;
  lo.model.max_batch_tokens = static_cast<int32_t>(flags.max_batch_tokens);
  lo.check_weights = !flags.skip_weight_check;
  if (isatty(STDERR_FILENO)) lo.progress = &ProgressBar;
  ASSIGN_OR_RETURN(s.model, LoadModelDir(dir, *s.backend, lo));
  const auto& m = *s.model;
  std::fprintf(stderr,
               "strata %s: loaded %s (%s, %ld layers, %.2f GiB of weights) in %.2f s; "
               "resident memory %.2f GiB; backend %s\n",
               cmd.c_str(), dir.c_str(), m.config.architecture.c_str(),
               static_cast<long>(m.config.num_hidden_layers), m.weight_bytes / 1073741824.0,
               m.load_seconds, ResidentGiB(), s.backend->Name().c_str());
  return s;
}

}  // namespace strata::cli

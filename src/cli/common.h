// Pieces every model-serving subcommand shares: turning a Status into a
// message and exit code, and loading a model directory (or the embedded demo
// model) with progress on a terminal.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/model_dir.h"
#include "util/flags.h"
#include "util/status.h"

namespace strata::cli {

// Prints "strata <cmd>: error: <message>" to stderr and returns the exit
// code for the status: NotFound 66, DataLoss/InvalidArgument in input files
// 65, Unimplemented 65, otherwise 1.
int Fail(const std::string& cmd, const Status& status);
// Usage error (bad flags): prints the message and a --help hint; returns 64.
int UsageError(const std::string& cmd, const Status& status);

struct ModelFlags {
  std::string model_path;      // empty: the demo model
  std::string device = "cpu";  // cpu, cuda, cuda:N
  // CudaBackendOptions::mem_fraction_static (0: no arena). Not a flag of
  // its own here: `strata serve` sets it from --mem-fraction-static.
  double mem_fraction_static = 0;
  int64_t threads = 0;
  std::string isa = "auto";
  // fp32, bf16 or auto (the default): bf16 on a GPU (the checkpoint's
  // weights as they are, tensor cores; what peers serve in), fp32 on the CPU
  // (exact against transformers' fp32 reference). Read it through
  // MatmulPrecision(), which resolves auto for `device`.
  std::string matmul_precision = "auto";
  int64_t max_batch_tokens = 512;
  std::string MatmulPrecision() const {
    if (matmul_precision != "auto") return matmul_precision;
    return device == "cpu" ? "fp32" : "bf16";
  }
  bool skip_weight_check = false;  // LoadOptions::check_weights off
  // EngineOptions::step_recording.enabled: decode steps replayed as CUDA
  // graphs (on by default; off issues every op, for comparison).
  bool decode_graphs = true;
  void Register(FlagSet& flags);
};

// --device: -1 for cpu, N for cuda:N (cuda is 0). InvalidArgument naming
// the allowed forms otherwise.
StatusOr<int> ParseDeviceFlag(const std::string& device);

// --kv-cache-dtype: f32 / float32, bf16 / bfloat16, f16 / float16, or auto
// (the default): bf16 where the matmul precision resolves to bf16 on a GPU
// (the model's dtype, as SGLang's auto), f32 on the CPU (exact).
// InvalidArgument naming the flag and the allowed values otherwise.
StatusOr<DType> ParseKvCacheDtype(const std::string& value, const ModelFlags& flags);

struct LoadedStack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LoadedModel> model;
};

// Resolves the demo model when no --model-path is given (saying so in one
// line on stderr), creates the backend --device names, loads the model with a progress
// bar when stderr is a terminal, and reports load time and memory.
StatusOr<LoadedStack> LoadForCli(const std::string& cmd, const ModelFlags& flags);

}  // namespace strata::cli

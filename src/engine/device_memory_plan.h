// The device memory plan of an engine on CUDA with --mem-fraction-static,
// made before anything is allocated: which part of the one arena
// (backend/device_memory.h, ArenaBytes = fraction x the GPU's total memory)
// the weights take as uploaded, which the activations (the model's
// workspace, the runner's per-step buffers, the backend's own), and the KV
// pool = the remainder in whole pages of the model's KvLayout, capped by
// --max-total-tokens. `strata serve` validates it with the other flags
// (exit 78 when the model does not fit, naming every term and the smallest
// fraction that fits) and sizes the pool from it; `strata check` prints it.
//
//   arena = fraction x total
//   | backend | weights (as uploaded) | model workspace | KV pool ... | per-step |
//                                       ^ staging of a widened upload (top, transient)
//
// Semantics next to SGLang's: SGLang's --mem-fraction-static is (weights +
// KV pool) / GPU memory, activations and CUDA graphs living in the rest.
// Strata's activations are static buffers sized for the largest step, so
// they are inside the arena too: at one fraction Strata's KV pool is smaller
// by the activation terms, and nothing but the CUDA context, cuBLASLt's
// handle and HiCache's copy descriptors lives outside fraction x total.
//
// Pure functions of values except MeasureModelFootprint (reads the
// checkpoint's headers); thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/device_memory.h"
#include "cache/kv_layout.h"
#include "engine/model_runner.h"
#include "model/hf_config.h"
#include "model/model.h"
#include "util/status.h"

namespace strata {

// What loading a model puts in backend memory, each buffer rounded as the
// arena rounds it.
struct ModelFootprint {
  int64_t num_weights = 0;         // UploadWeight calls (derived tensors included)
  uint64_t checkpoint_bytes = 0;   // those tensors in their checkpoint dtype
  uint64_t weight_bytes = 0;       // as uploaded (CudaWeightDType)
  uint64_t max_staging_bytes = 0;  // the largest checkpoint copy a widened upload stages
  uint64_t buffer_bytes = 0;       // the model's workspace (its Allocate calls at load)
  int64_t max_16bit_cols = 0;      // widest weight kept in 16 bits (the bf16 GEMM scratch)
};

// Builds the model of `dir` (its config.json already read into `config`)
// against a backend that records sizes and allocates nothing: the model's
// own binding code says what is uploaded, so tied embeddings, skipped
// multi-token-prediction layers and derived tensors (DeepSeek's absorbed
// W_uk^T) count as a real load counts them. Reads the safetensors headers,
// and the values only of tensors a model derives others from at load
// (DeepSeek: kv_b_proj). Errors: the model's own (missing tensors, shapes,
// unknown architecture), as LoadModelDir would report them.
StatusOr<ModelFootprint> MeasureModelFootprint(const std::string& dir, const ModelConfig& config,
                                               const ModelOptions& options, bool bf16_matmul);

struct DeviceMemoryPlanInput {
  DeviceMemoryFacts device;
  double mem_fraction_static = 0;  // REQUIRES: in (0, 1]
  bool bf16_matmul = false;        // --matmul-precision bf16
  ModelFootprint model;
  KvLayout layout;
  RunnerLimits runner;  // EngineRunnerLimits of the engine options
  int64_t vocab_size = 0;
  int64_t max_total_tokens = 0;  // --max-total-tokens (0: no cap)
  int64_t context_length = 0;    // EffectiveContextLength, for the one-request warning
};

struct DeviceMemoryPlan {
  DeviceMemoryFacts device;
  double mem_fraction_static = 0;
  uint64_t arena_bytes = 0;
  uint64_t weight_bytes = 0;
  // Activations: the model's workspace + the runner's per-step buffers +
  // the backend's error word, GEMM workspace and bf16 scratch.
  uint64_t model_buffer_bytes = 0, runner_bytes = 0, backend_bytes = 0;
  uint64_t activation_bytes() const { return model_buffer_bytes + runner_bytes + backend_bytes; }
  int32_t page_size = 0;
  int64_t kv_pages = 0;       // what the pool gets
  int64_t kv_pages_fit = 0;   // what the remainder holds (before --max-total-tokens)
  uint64_t kv_bytes = 0;      // kv_pages' bytes, as allocated
  uint64_t unused_bytes = 0;  // arena left over (rounding, or the --max-total-tokens cap)
  std::vector<std::string> warnings;
  // "arena 123.75 GiB = 0.88 x 140.62 GiB of cuda:0 (NVIDIA H200): weights
  // 15.26 GiB + activations 1.20 GiB (...) + KV pool 107.29 GiB (N pages x
  // 16 = T tokens)".
  std::string Describe() const;
};

// The plan, or FailedPrecondition naming each term when it cannot work:
// the arena is larger than the device's free memory (another process holds
// it); weights + activations leave no KV page; loading's peak (weights +
// the largest staging copy) exceeds the arena. Each says the smallest
// fraction that fits, or that the model does not fit this GPU at all.
// --max-total-tokens above what fits is a warning and the remainder wins
// (as SGLang); a pool shorter than one context_length is a warning.
StatusOr<DeviceMemoryPlan> PlanDeviceMemory(const DeviceMemoryPlanInput& in);

}  // namespace strata

// The recording half of STRATA_CUDA_OP_TIMING (op_timing.h has the modes and
// the accounting): a cudaEvent pair around every op on one stream, the gate
// kernel of gated mode, and the step bookkeeping, feeding an OpTimingTable.
// The CUDA backend owns one when timing is on (else none: an op then pays
// one null-pointer test) and brackets each op with Begin/End.
//
// A step runs from its first Begin to EndStep (the backend's Synchronize).
// Gated mode queues the step's work behind Gate (kernels.h), which spins
// until ReleaseGate: the backend must release it before every wait for the
// stream, or the wait would last the gate's 100 ms timeout.
//
// Thread-safety: none; used from the backend's engine thread only.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/op_timing.h"
#include "util/status.h"

namespace strata::cuda {

class OpTimer {
 public:
  // mode != kOff. Unavailable when gated mode cannot map its gate words.
  static StatusOr<std::unique_ptr<OpTimer>> Create(OpTimingMode mode, cudaStream_t stream);
  ~OpTimer();  // frees the events and the gate (Finish first for the table)
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  // Records op's start event on the stream (opening a step when none is
  // open; in gated mode with arms_gate, queuing the step's gate first).
  // Returns the index End takes.
  size_t Begin(const char* op, bool arms_gate);
  // Records the stop event of Begin's op.
  void End(size_t index);
  // A step's class is the row count of its first Embedding (StepClass).
  void NoteStepTokens(int64_t tokens) {
    if (step_tokens_ < 0) step_tokens_ = tokens;
  }
  // Gated mode: opens the gate so the stream can drain. No-op otherwise.
  void ReleaseGate();
  // REQUIRES: the stream is idle. Reads and recycles the events recorded
  // since the last harvest.
  void Harvest();
  // REQUIRES: the stream is idle. Harvests and closes the step.
  void EndStep();
  // The last step, then the table to stderr.
  void Finish();

 private:
  OpTimer(OpTimingMode mode, cudaStream_t stream) : mode_(mode), stream_(stream) {}
  cudaEvent_t TakeEvent();

  static constexpr int64_t kGateTimeoutNs = 100'000'000;
  struct Pending {
    const char* op;
    cudaEvent_t start, stop;
  };
  const OpTimingMode mode_;
  const cudaStream_t stream_;
  OpTimingTable table_;
  std::vector<cudaEvent_t> free_events_, all_events_;
  std::vector<Pending> pending_;  // recorded since the last harvest
  bool in_step_ = false;
  int64_t step_tokens_ = -1;  // rows of the step's first Embedding
  double step_span_ms_ = 0;   // GPU span of the step's harvests so far
  std::chrono::steady_clock::time_point step_begin_;
  // Gated mode: host words mapped into the device (cudaHostAllocMapped).
  int32_t* gate_host_ = nullptr;  // [0]: open flag, [1]: timed out
  int32_t* gate_dev_ = nullptr;
  bool gate_armed_ = false;
};

}  // namespace strata::cuda

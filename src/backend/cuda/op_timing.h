// Per-op GPU time accounting for the CUDA backend's STRATA_CUDA_OP_TIMING
// mode (cuda_backend.cc records a cudaEvent pair around every op and feeds
// the elapsed times here at each Synchronize). This part is plain host C++,
// so its arithmetic and table are tested without a GPU (op_timing_test.cc).
//
// A "step" is what the backend did between two Synchronize() calls (one
// engine step: metadata uploads, the forward pass, the logits copy). Steps
// are grouped into classes by how many tokens their first Embedding
// embedded (StepClass), so a run's decode steps and prefill steps get
// separate tables.
//
// Thread-safety: none; the backend owns one table and feeds it from the
// engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata::cuda {

// How STRATA_CUDA_OP_TIMING is set: unset, "" or "0": kOff; "gated": kGated;
// anything else ("1"): kEvents.
//   kEvents: event pairs around every op. An op's time runs from its start
//     event to its stop event on the GPU, so when the GPU waits for the host
//     (launch-bound), it includes the wait for the op's launches; the GPU's
//     idle time between ops shows as the step's span minus the ops' sum.
//   kGated: the same, and each step's work is queued behind a gate kernel
//     that spins until the host reaches the step's end (or 100 ms pass), so
//     the GPU runs the whole step back to back: op times and the span are
//     then device time alone, without launch gaps. Wall time is meaningless
//     in this mode (the GPU starts late on purpose).
enum class OpTimingMode { kOff, kEvents, kGated };
OpTimingMode ParseOpTimingMode(const char* env_value);

// The class label of a step that embedded `tokens` tokens in its first
// Embedding (-1: it had none, e.g. weight upload or a test's lone op).
std::string StepClass(int64_t tokens);

class OpTimingTable {
 public:
  // One op of a step of class `step` took `gpu_ms` on the GPU.
  void AddOp(const std::string& step, const std::string& op, double gpu_ms);
  // One step of class `step` ended: `wall_ms` on the host from its first op
  // to its Synchronize returning, `span_ms` on the GPU from its first start
  // event to its last stop event.
  void AddStep(const std::string& step, double wall_ms, double span_ms);
  // Gated mode: a step's gate gave up waiting for the host (100 ms).
  void AddGateTimeout() { ++gate_timeouts_; }

  struct OpStats {
    int64_t count = 0;
    double total_ms = 0;
  };
  struct StepStats {
    int64_t steps = 0;
    double wall_ms = 0, span_ms = 0, ops_ms = 0;
    std::map<std::string, OpStats> ops;
  };
  const std::map<std::string, StepStats>& steps() const { return steps_; }

  // One table per step class: per op kind its count, count per step, total
  // ms, mean µs, µs per step and share of the ops' GPU time, largest total
  // first; then the class's steps, wall, span and ops' sum per step and
  // busy = ops' sum / wall. Empty string when nothing was recorded.
  std::string Format(const std::string& mode_note) const;

 private:
  std::map<std::string, StepStats> steps_;
  int64_t gate_timeouts_ = 0;
};

}  // namespace strata::cuda

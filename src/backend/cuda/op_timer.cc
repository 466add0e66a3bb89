#include "backend/cuda/op_timer.h"

#include <cstdio>
#include <string>

#include "backend/cuda/kernels.h"
#include "util/logging.h"

namespace strata::cuda {
namespace {

void Check(cudaError_t e, const char* what) {
  STRATA_CHECK(e == cudaSuccess) << "CUDA backend op timing: " << what << ": "
                                 << cudaGetErrorString(e);
}

}  // namespace

StatusOr<std::unique_ptr<OpTimer>> OpTimer::Create(OpTimingMode mode, cudaStream_t stream) {
  std::unique_ptr<OpTimer> t(new OpTimer(mode, stream));
  if (mode == OpTimingMode::kGated) {
    void* h = nullptr;
    if (cudaHostAlloc(&h, 2 * sizeof(int32_t), cudaHostAllocMapped) != cudaSuccess) {
      cudaGetLastError();
      return Unavailable(
          "CUDA backend: STRATA_CUDA_OP_TIMING=gated: cannot allocate mapped "
          "host memory for the gate; use STRATA_CUDA_OP_TIMING=1");
    }
    t->gate_host_ = static_cast<int32_t*>(h);
    t->gate_host_[0] = t->gate_host_[1] = 0;
    void* d = nullptr;
    Check(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");
    t->gate_dev_ = static_cast<int32_t*>(d);
  }
  return t;
}

OpTimer::~OpTimer() {
  for (cudaEvent_t e : all_events_) cudaEventDestroy(e);
  if (gate_host_) cudaFreeHost(gate_host_);
}

cudaEvent_t OpTimer::TakeEvent() {
  if (free_events_.empty()) {
    cudaEvent_t e;
    Check(cudaEventCreate(&e), "cudaEventCreate");
    all_events_.push_back(e);
    return e;
  }
  cudaEvent_t e = free_events_.back();
  free_events_.pop_back();
  return e;
}

size_t OpTimer::Begin(const char* op, bool arms_gate) {
  if (!in_step_) {
    in_step_ = true;
    step_tokens_ = -1;
    step_span_ms_ = 0;
    step_begin_ = std::chrono::steady_clock::now();
  }
  if (mode_ == OpTimingMode::kGated && arms_gate && !gate_armed_) {
    // The previous gate has finished: every release is followed by a sync.
    __atomic_store_n(&gate_host_[0], 0, __ATOMIC_SEQ_CST);
    Gate(gate_dev_, gate_dev_ + 1, kGateTimeoutNs, stream_);
    Check(cudaPeekAtLastError(), "Gate");
    gate_armed_ = true;
  }
  const cudaEvent_t start = TakeEvent(), stop = TakeEvent();
  Check(cudaEventRecord(start, stream_), "cudaEventRecord");
  pending_.push_back({op, start, stop});
  return pending_.size() - 1;
}

void OpTimer::End(size_t index) {
  Check(cudaEventRecord(pending_[index].stop, stream_), "cudaEventRecord");
}

void OpTimer::ReleaseGate() {
  if (gate_armed_) {
    __atomic_store_n(&gate_host_[0], 1, __ATOMIC_SEQ_CST);
    gate_armed_ = false;
  }
}

void OpTimer::Harvest() {
  if (pending_.empty()) return;
  const std::string cls = StepClass(step_tokens_);
  for (const Pending& p : pending_) {
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, p.start, p.stop), "cudaEventElapsedTime");
    table_.AddOp(cls, p.op, ms);
    free_events_.push_back(p.start);
    free_events_.push_back(p.stop);
  }
  float span = 0;
  Check(cudaEventElapsedTime(&span, pending_.front().start, pending_.back().stop),
        "cudaEventElapsedTime");
  step_span_ms_ += span;
  pending_.clear();
  if (gate_host_ && __atomic_load_n(&gate_host_[1], __ATOMIC_SEQ_CST) != 0) {
    table_.AddGateTimeout();
    __atomic_store_n(&gate_host_[1], 0, __ATOMIC_SEQ_CST);
  }
}

void OpTimer::EndStep() {
  Harvest();
  if (!in_step_) return;
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_begin_)
          .count();
  table_.AddStep(StepClass(step_tokens_), wall_ms, step_span_ms_);
  in_step_ = false;
}

void OpTimer::Finish() {
  EndStep();
  const std::string s =
      table_.Format(mode_ == OpTimingMode::kGated ? "gated: device time without launch gaps"
                                                  : "events: includes waits for launches");
  if (!s.empty()) std::fprintf(stderr, "%s", s.c_str());
}

}  // namespace strata::cuda

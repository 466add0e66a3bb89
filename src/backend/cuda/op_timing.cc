#include "backend/cuda/op_timing.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace strata::cuda {

OpTimingMode ParseOpTimingMode(const char* v) {
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "0") == 0) return OpTimingMode::kOff;
  if (std::strcmp(v, "gated") == 0) return OpTimingMode::kGated;
  return OpTimingMode::kEvents;
}

std::string StepClass(int64_t tokens) {
  if (tokens < 0) return "steps without an Embedding";
  if (tokens == 1) return "steps of 1 token";
  return "steps of " + std::to_string(tokens) + " tokens";
}

void OpTimingTable::AddOp(const std::string& step, const std::string& op, double gpu_ms) {
  StepStats& s = steps_[step];
  OpStats& o = s.ops[op];
  ++o.count;
  o.total_ms += gpu_ms;
  s.ops_ms += gpu_ms;
}

void OpTimingTable::AddStep(const std::string& step, double wall_ms, double span_ms) {
  StepStats& s = steps_[step];
  ++s.steps;
  s.wall_ms += wall_ms;
  s.span_ms += span_ms;
}

namespace {
void Appendf(std::string* out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void Appendf(std::string* out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) out->append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof buf - 1));
}
}  // namespace

std::string OpTimingTable::Format(const std::string& mode_note) const {
  if (steps_.empty()) return "";
  std::string out = "== CUDA per-op GPU time (STRATA_CUDA_OP_TIMING: " + mode_note + ")\n";
  for (const auto& [cls, s] : steps_) {
    const double n = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
    Appendf(&out, "-- %s: %lld steps\n", cls.c_str(), static_cast<long long>(s.steps));
    Appendf(&out, "  %-24s %9s %9s %11s %10s %10s %7s\n", "op", "count", "per step", "total ms",
            "mean us", "us/step", "share");
    std::vector<std::pair<std::string, OpStats>> ops(s.ops.begin(), s.ops.end());
    std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) {
      return a.second.total_ms > b.second.total_ms;
    });
    for (const auto& [name, o] : ops) {
      Appendf(&out, "  %-24s %9lld %9.1f %11.3f %10.2f %10.1f %6.1f%%\n", name.c_str(),
              static_cast<long long>(o.count), o.count / n, o.total_ms,
              o.count > 0 ? 1e3 * o.total_ms / o.count : 0.0, 1e3 * o.total_ms / n,
              s.ops_ms > 0 ? 100.0 * o.total_ms / s.ops_ms : 0.0);
    }
    Appendf(&out,
            "  per step: wall %.1f us, GPU span %.1f us, ops' GPU time %.1f us "
            "(busy %.0f%% of wall, %.0f%% of span)\n",
            1e3 * s.wall_ms / n, 1e3 * s.span_ms / n, 1e3 * s.ops_ms / n,
            s.wall_ms > 0 ? 100.0 * s.ops_ms / s.wall_ms : 0.0,
            s.span_ms > 0 ? 100.0 * s.ops_ms / s.span_ms : 0.0);
  }
  if (gate_timeouts_ > 0)
    Appendf(&out,
            "  warning: %lld steps' gates timed out (the host took over 100 ms to queue a step, "
            "or a launch queue filled): those steps ran partly ungated\n",
            static_cast<long long>(gate_timeouts_));
  return out;
}

}  // namespace strata::cuda

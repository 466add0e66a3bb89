// The host half of STRATA_CUDA_OP_TIMING: mode parsing, step classes, the
// sums and the table (no GPU needed; the event recording around the ops is
// exercised by cuda_backend_test's OpTiming test on a GPU).
#include "backend/cuda/op_timing.h"

#include <gtest/gtest.h>

#include <sstream>

namespace strata::cuda {
namespace {

TEST(OpTimingTest, ParsesTheEnvironmentValue) {
  EXPECT_EQ(ParseOpTimingMode(nullptr), OpTimingMode::kOff);
  EXPECT_EQ(ParseOpTimingMode(""), OpTimingMode::kOff);
  EXPECT_EQ(ParseOpTimingMode("0"), OpTimingMode::kOff);
  EXPECT_EQ(ParseOpTimingMode("1"), OpTimingMode::kEvents);
  EXPECT_EQ(ParseOpTimingMode("yes"), OpTimingMode::kEvents);
  EXPECT_EQ(ParseOpTimingMode("gated"), OpTimingMode::kGated);
}

TEST(OpTimingTest, StepClassesByTokens) {
  EXPECT_EQ(StepClass(1), "steps of 1 token");
  EXPECT_EQ(StepClass(512), "steps of 512 tokens");
  EXPECT_EQ(StepClass(-1), "steps without an Embedding");
}

TEST(OpTimingTest, SumsPerStepClassAndOp) {
  OpTimingTable t;
  const std::string d = StepClass(1), p = StepClass(16);
  for (int step = 0; step < 4; ++step) {
    for (int layer = 0; layer < 2; ++layer) {
      t.AddOp(d, "Linear.gemm_16bit", 0.010);
      t.AddOp(d, "PagedAttention", 0.005);
    }
    t.AddStep(d, 0.100, 0.050);
  }
  t.AddOp(p, "PagedAttention", 1.0);
  t.AddStep(p, 2.0, 1.5);
  ASSERT_EQ(t.steps().size(), 2u);
  const auto& ds = t.steps().at(d);
  EXPECT_EQ(ds.steps, 4);
  EXPECT_NEAR(ds.wall_ms, 0.4, 1e-12);
  EXPECT_NEAR(ds.span_ms, 0.2, 1e-12);
  EXPECT_NEAR(ds.ops_ms, 0.12, 1e-12);
  EXPECT_EQ(ds.ops.at("Linear.gemm_16bit").count, 8);
  EXPECT_NEAR(ds.ops.at("PagedAttention").total_ms, 0.04, 1e-12);
  EXPECT_EQ(t.steps().at(p).ops.at("PagedAttention").count, 1);
}

TEST(OpTimingTest, TableHasTheNumbersLargestFirst) {
  OpTimingTable t;
  EXPECT_EQ(t.Format("x"), "");  // nothing recorded: nothing printed
  const std::string d = StepClass(1);
  for (int step = 0; step < 2; ++step) {
    t.AddOp(d, "Add", 0.001);
    t.AddOp(d, "Linear.gemm_16bit", 0.003);
    t.AddOp(d, "Linear.gemm_16bit", 0.003);
    t.AddOp(d, "RmsNorm", 0.001);
    t.AddStep(d, 0.016, 0.010);
  }
  t.AddGateTimeout();
  const std::string s = t.Format("events");
  EXPECT_NE(s.find("STRATA_CUDA_OP_TIMING: events"), std::string::npos) << s;
  EXPECT_NE(s.find("-- steps of 1 token: 2 steps"), std::string::npos) << s;
  // gemm: 4 calls, 2 per step, 0.012 ms, 3 us each, 6 us per step, 75% of 16 us.
  EXPECT_NE(s.find("Linear.gemm_16bit                4       2.0       0.012       3.00        "
                   "6.0   75.0%"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("Add                              2       1.0       0.002       1.00        "
                   "1.0   12.5%"),
            std::string::npos)
      << s;
  EXPECT_LT(s.find("Linear.gemm_16bit"), s.find("Add "));  // largest total first
  EXPECT_NE(s.find("per step: wall 16.0 us, GPU span 10.0 us, ops' GPU time 8.0 us (busy 50% of "
                   "wall, 80% of span)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("1 steps' gates timed out"), std::string::npos) << s;
}

}  // namespace
}  // namespace strata::cuda

// The weak-scaling step-time model of dpt-bench scaling (apps/bench/scaling_model.h).
#include <gtest/gtest.h>

#include "scaling_model.h"

using dpt::bench::ScalingModel;

// The 92M-parameter MLP in bf16 on 2 x H200: 2.58 ms alone, 3.67 ms per step on two GPUs, with
// 0.99 ms of AllReduce of which 0.556 ms came after backward (measured with DDP's bucket events).
TEST(ScalingModel, FitReproducesTheMeasurementItWasFittedTo) {
  ScalingModel m = ScalingModel::fit(2.58, 92.2e6 * 2, 2, 3.67, 0.99, 0.556);
  EXPECT_NEAR(m.step_ms(2), 3.67, 1e-9);
  EXPECT_NEAR(m.efficiency(2), 2.58 / 3.67, 1e-9);
  EXPECT_NEAR(m.hidden_ms, 0.99 - 0.556, 1e-12);
  EXPECT_NEAR(m.interference_ms, 3.67 - 2.58 - 0.556, 1e-12);
  EXPECT_DOUBLE_EQ(m.step_ms(1), 2.58);
}

TEST(ScalingModel, RingAllReduceFollowsTheAlphaBetaFormula) {
  ScalingModel m;
  m.alpha_us = 5;
  m.beta_gbps = 100;
  m.grad_bytes = 1e9;
  // 2 (N-1) alpha + 2 (N-1)/N * bytes / beta, one node: N = 4 -> 30 us + 15 ms.
  EXPECT_NEAR(m.allreduce_ms(4), 0.030 + 15.0, 1e-9);
  EXPECT_EQ(m.allreduce_ms(1), 0.0);
}

TEST(ScalingModel, MoreGpusNeverPredictAFasterStepAndNodesCostTheNetwork) {
  ScalingModel m = ScalingModel::fit(2.58, 92.2e6 * 2, 2, 3.67, 0.99, 0.556);
  double previous = m.step_ms(1);
  for (int g : {2, 4, 8, 16, 64}) {
    EXPECT_GE(m.step_ms(g), previous) << g;
    previous = m.step_ms(g);
  }
  EXPECT_GT(m.allreduce_ms(16), m.allreduce_ms(8));  // 16 GPUs span two nodes of 8
}

#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace dpt::optim {
namespace {

TEST(LrSchedule, ConstantIsConstant) {
  ConstantLr s(0.3);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.3);
  EXPECT_DOUBLE_EQ(s.lr(100000), 0.3);
}

TEST(LrSchedule, StepDecaysEveryPeriod) {
  StepLr s(1.0, 10, 0.5);
  EXPECT_DOUBLE_EQ(s.lr(0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(25), 0.25);
  EXPECT_THROW(StepLr(1.0, 0, 0.5), Error);
}

TEST(LrSchedule, CosineHitsItsEndpointsAndMidpoint) {
  WarmupCosineLr s(6e-4, 10, 110, 6e-5);
  EXPECT_DOUBLE_EQ(s.lr(0), 6e-4 / 10);      // warmup starts above zero
  EXPECT_DOUBLE_EQ(s.lr(4), 6e-4 * 5 / 10);  // linear
  EXPECT_DOUBLE_EQ(s.lr(10), 6e-4);          // peak at the end of warmup
  EXPECT_NEAR(s.lr(60), (6e-4 + 6e-5) / 2, 1e-15);  // halfway through the decay
  EXPECT_DOUBLE_EQ(s.lr(110), 6e-5);         // floor at total_steps
  EXPECT_DOUBLE_EQ(s.lr(1000), 6e-5);        // and after
  for (int64_t t = 10; t < 110; ++t) EXPECT_GE(s.lr(t), s.lr(t + 1)) << t;  // monotone decay
}

TEST(LrSchedule, FactoryBuildsEachKindAndRejectsUnknown) {
  LrScheduleConfig c;
  c.kind = "cosine";
  c.lr = 1.0;
  c.warmup_steps = 0;
  c.total_steps = 4;
  c.min_lr = 0.0;
  auto s = make_lr_schedule(c);
  EXPECT_DOUBLE_EQ(s->lr(0), 1.0);
  EXPECT_NEAR(s->lr(2), 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(s->lr(4), 0.0);
  c.kind = "linear-ish";
  EXPECT_THROW(make_lr_schedule(c), Error);
}

}  // namespace
}  // namespace dpt::optim

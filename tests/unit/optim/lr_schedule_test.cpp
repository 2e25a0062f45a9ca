#include "lamina/optim/lr_schedule.hpp"

#include <gtest/gtest.h>

namespace lamina::test {
namespace {

TEST(LrSchedule, LinearWarmupThenCosineToMinLr) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 10;
  o.schedule = LrSchedule::cosine;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(o, 9, 110), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10, 110), 1.0);
  EXPECT_NEAR(learning_rate(o, 60, 110), 0.55, 1e-12);  // half way: mean of lr and min_lr
  EXPECT_NEAR(learning_rate(o, 110, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 500, 110), 0.1, 1e-12);  // stays at min_lr
  o.decay_steps = 50;
  EXPECT_NEAR(learning_rate(o, 60, 110), 0.1, 1e-12);
}

TEST(LrSchedule, Constant) {
  OptimizerConfig o;
  o.lr = 0.3;
  o.schedule = LrSchedule::constant;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 10), 0.3);
  EXPECT_DOUBLE_EQ(learning_rate(o, 9, 10), 0.3);
}

}  // namespace
}  // namespace lamina::test

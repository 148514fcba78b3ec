// StepWindow: medians over the last steps, busy time without comm_wait.
#include "libs/agent/step_window.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace agent {
namespace {

// A step of `ms` milliseconds per phase (data_wait, forward_backward,
// comm_wait, optimizer), starting at `start_ms`.
train::StepPhases Step(int64_t start_ms, const double (&ms)[4]) {
  train::StepPhases p;
  int64_t t = start_ms * 1000000;
  p.step.start_ns = t;
  for (int i = 0; i < 4; ++i) {
    p.phase[i].start_ns = t;
    t += static_cast<int64_t>(ms[i] * 1e6);
    p.phase[i].end_ns = t;
  }
  p.step.end_ns = t;
  return p;
}

TEST(StepWindowTest, MediansOfTheLastStepsIgnoreOneOutlier) {
  StepWindow w(5);
  EXPECT_EQ(w.Summary().steps(), 0);
  // Old steps that fall out of the window.
  for (int i = 0; i < 10; ++i) w.Add(Step(i * 1000, {100, 100, 100, 100}), 64);
  w.Add(Step(20000, {1, 10, 4, 2}), 64);
  w.Add(Step(21000, {1, 12, 6, 2}), 64);
  w.Add(Step(22000, {1, 500, 8, 2}), 64);  // one slow step
  w.Add(Step(23000, {3, 11, 5, 2}), 64);
  w.Add(Step(24000, {1, 13, 7, 4}), 64);
  const scheduler::v1::StepTimeSummary s = w.Summary();
  EXPECT_EQ(s.steps(), 5);
  EXPECT_NEAR(s.data_wait_seconds(), 0.001, 1e-9);
  EXPECT_NEAR(s.forward_backward_seconds(), 0.012, 1e-9);
  EXPECT_NEAR(s.comm_wait_seconds(), 0.006, 1e-9);
  EXPECT_NEAR(s.optimizer_seconds(), 0.002, 1e-9);
  // Steps 17, 21, 511, 21, 25 ms; busy = step - comm_wait: 13, 15, 503, 16, 18.
  EXPECT_NEAR(s.step_seconds(), 0.021, 1e-9);
  EXPECT_NEAR(s.busy_seconds(), 0.016, 1e-9);
  // 5 x 64 samples in 0.595 s.
  EXPECT_NEAR(s.samples_per_second(), 320 / 0.595, 1e-6);
}

TEST(StepWindowTest, EvenWindowTakesTheMeanOfTheMiddleTwo) {
  StepWindow w(4);
  w.Add(Step(0, {0, 10, 0, 0}), 1);
  w.Add(Step(100, {0, 20, 0, 0}), 1);
  w.Add(Step(200, {0, 40, 0, 0}), 1);
  w.Add(Step(300, {0, 30, 0, 0}), 1);
  EXPECT_NEAR(w.Summary().forward_backward_seconds(), 0.025, 1e-9);
}

}  // namespace
}  // namespace agent
}  // namespace dtrain

// StragglerDetector: a persistently slower rank is named with its phase
// after `reports` reports; noise, a hovering ratio and short windows are not.
#include "libs/scheduler/straggler.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

// A summary of 32 steps: data_wait, forward_backward, comm_wait and
// optimizer medians in milliseconds.
v1::StepTimeSummary Summary(double data, double fb, double comm, double opt, int steps = 32) {
  v1::StepTimeSummary s;
  s.set_steps(steps);
  s.set_data_wait_seconds(data / 1e3);
  s.set_forward_backward_seconds(fb / 1e3);
  s.set_comm_wait_seconds(comm / 1e3);
  s.set_optimizer_seconds(opt / 1e3);
  s.set_step_seconds((data + fb + comm + opt) / 1e3);
  s.set_busy_seconds((data + fb + opt) / 1e3);
  return s;
}

TEST(StragglerTest, CalmRanksWithNoiseAreNeverStragglers) {
  StragglerDetector d(2);
  // +-12% around 40 ms, ranks alternating which is faster.
  const double wobble[] = {1.0, 1.12, 0.9, 1.05, 0.95, 1.1, 0.88, 1.0};
  for (int i = 0; i < 40; ++i) {
    const double a = 40 * wobble[i % 8], b = 40 * wobble[(i + 3) % 8];
    EXPECT_FALSE(d.Observe(0, Summary(1, a, b > a ? b - a : 1, 2)).has_value()) << i;
    EXPECT_FALSE(d.Observe(1, Summary(1, b, a > b ? a - b : 1, 2)).has_value()) << i;
  }
  EXPECT_FALSE(d.is_straggler(0));
  EXPECT_FALSE(d.is_straggler(1));
}

// Reports in a row that name or clear a straggler.
const int kReports = StragglerOptions().reports;

TEST(StragglerTest, SlowRankIsNamedAfterItsReportsInARowWithItsPhase) {
  ASSERT_GE(kReports, 3);
  StragglerDetector d(2);
  // Rank 1 computes 1.8x longer; rank 0 waits for it in comm_wait, so both
  // steps last as long: only the busy time tells them apart.
  for (int i = 0; i < kReports - 1; ++i) {
    EXPECT_FALSE(d.Observe(0, Summary(1, 40, 33, 2)).has_value());
    EXPECT_FALSE(d.Observe(1, Summary(1, 73, 1, 3)).has_value());
  }
  EXPECT_FALSE(d.Observe(0, Summary(1, 40, 33, 2)).has_value());
  std::optional<StragglerChange> c = d.Observe(1, Summary(1, 73, 1, 3));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->rank, 1);
  EXPECT_TRUE(c->straggler);
  EXPECT_NEAR(c->ratio, 77.0 / 43.0, 1e-9);
  EXPECT_EQ(c->phase, "forward_backward");
  EXPECT_TRUE(d.is_straggler(1));
  EXPECT_FALSE(d.is_straggler(0));
  // Reported once; the fast rank is not one.
  EXPECT_FALSE(d.Observe(1, Summary(1, 73, 1, 3)).has_value());
  EXPECT_FALSE(d.Observe(0, Summary(1, 40, 33, 2)).has_value());

  // Calm again: cleared only after kReports calm reports in a row; a ratio
  // between clear_ratio and ratio keeps it.
  for (int i = 0; i < kReports - 1; ++i) {
    EXPECT_FALSE(d.Observe(1, Summary(1, 41, 1, 2)).has_value());
  }
  EXPECT_FALSE(d.Observe(1, Summary(1, 48, 1, 2)).has_value());  // 1.18x
  for (int i = 0; i < kReports - 1; ++i) {
    EXPECT_FALSE(d.Observe(1, Summary(1, 41, 1, 2)).has_value());
  }
  c = d.Observe(1, Summary(1, 41, 1, 2));
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->straggler);
  EXPECT_FALSE(d.is_straggler(1));
}

TEST(StragglerTest, HoveringAroundTheThresholdDoesNotFlag) {
  StragglerDetector d(2);
  d.Observe(0, Summary(0, 40, 10, 0));
  // 1.35x, 1.2x, 1.35x, 1.2x, ...: never two slow reports in a row.
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(d.Observe(1, Summary(0, i % 2 == 0 ? 54 : 48, 0, 0)).has_value()) << i;
  }
}

TEST(StragglerTest, ComparesWithTheMedianOfTheOtherRanksAndNamesThePhase) {
  StragglerDetector d(4);
  for (int r = 0; r < 3; ++r) d.Observe(r, Summary(2, 40, 20, 2));
  std::optional<StragglerChange> c;
  for (int i = 0; i < kReports; ++i) c = d.Observe(3, Summary(30, 40, 0, 2));  // a starved loader
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->rank, 3);
  EXPECT_EQ(c->phase, "data_wait");
  EXPECT_NEAR(c->ratio, 72.0 / 44.0, 1e-9);
}

TEST(StragglerTest, ShortWindowsTinyGapsAndUnknownRanksDoNotCount) {
  StragglerDetector d(2);
  d.Observe(0, Summary(0, 40, 0, 0));
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(d.Observe(1, Summary(0, 90, 0, 0, /*steps=*/4)).has_value());
  }
  // 2x, but 1 ms apart: below min_excess_seconds.
  StragglerDetector tiny(2);
  tiny.Observe(0, Summary(0, 1, 0, 0));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(tiny.Observe(1, Summary(0, 2, 0, 0)).has_value());
  EXPECT_FALSE(d.Observe(7, Summary(0, 90, 0, 0)).has_value());
  EXPECT_FALSE(d.Observe(-1, Summary(0, 90, 0, 0)).has_value());
  // A replaced rank starts over.
  for (int i = 0; i < kReports; ++i) d.Observe(1, Summary(0, 90, 0, 0));
  EXPECT_TRUE(d.is_straggler(1));
  d.Reset(1);
  EXPECT_FALSE(d.is_straggler(1));
  EXPECT_EQ(d.ratio(1), 0);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

#include "services/trainctl/progress.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace trainctl {
namespace {

namespace v1 = scheduler::v1;

v1::JobStatus Status(int epoch, int64_t step, int attempts = 1) {
  v1::JobStatus j;
  j.mutable_spec()->set_epochs(4);
  j.set_state(v1::RUNNING);
  j.set_epoch(epoch);
  j.set_step(step);
  j.set_steps_per_epoch(100);
  j.set_attempts(attempts);
  j.set_test_accuracy(-1);
  return j;
}

TEST(ProgressTest, FractionCountsEpochsAndSteps) {
  EXPECT_DOUBLE_EQ(FractionDone(Status(0, 0)), 0);
  EXPECT_DOUBLE_EQ(FractionDone(Status(1, 50)), 1.5 / 4);
  EXPECT_DOUBLE_EQ(FractionDone(Status(4, 0)), 1);
  v1::JobStatus unknown = Status(2, 30);
  unknown.set_steps_per_epoch(0);  // before the first report: epochs only
  EXPECT_DOUBLE_EQ(FractionDone(unknown), 0.5);
  v1::JobStatus done = Status(3, 0);
  done.set_state(v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ(FractionDone(done), 1);
}

TEST(ProgressTest, FormatsEtaAndBar) {
  EXPECT_EQ(FormatEta(absl::Seconds(9)), "9s");
  EXPECT_EQ(FormatEta(absl::Seconds(245)), "4m05s");
  EXPECT_EQ(FormatEta(absl::Seconds(3720)), "1h02m");
  EXPECT_EQ(FormatEta(absl::InfiniteDuration()), "-");
  EXPECT_EQ(Bar(0.5, 10), "#####.....");
  EXPECT_EQ(Bar(2, 4), "####");
}

TEST(ProgressTest, EtaExtrapolatesTheAttemptsRate) {
  ProgressTracker t;
  absl::Time t0 = absl::FromUnixSeconds(1000);
  std::string line = t.Update(Status(0, 0), t0);
  EXPECT_EQ(t.eta(), absl::InfiniteDuration());
  EXPECT_NE(line.find("ETA -"), std::string::npos) << line;
  // A quarter of the job in 10 s: 30 s to go.
  line = t.Update(Status(1, 0), t0 + absl::Seconds(10));
  EXPECT_EQ(t.eta(), absl::Seconds(30));
  EXPECT_NE(line.find("[#####...............]  25%"), std::string::npos) << line;
  EXPECT_NE(line.find("epoch 1/4  step 0/100"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 30s"), std::string::npos) << line;
  // A requeued job (next attempt, resumed at epoch 1) starts a new estimate.
  t.Update(Status(1, 0, 2), t0 + absl::Seconds(60));
  EXPECT_EQ(t.eta(), absl::InfiniteDuration());
  t.Update(Status(2, 50, 2), t0 + absl::Seconds(66));
  EXPECT_EQ(t.eta(), absl::Seconds(6));  // 1.5/4 in 6 s: 1.5/4 to go
}

}  // namespace
}  // namespace trainctl
}  // namespace dtrain

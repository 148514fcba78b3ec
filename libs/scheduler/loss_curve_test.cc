#include "libs/scheduler/loss_curve.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

google::protobuf::RepeatedPtrField<v1::StepLoss> Steps(int64_t from, int64_t to) {
  google::protobuf::RepeatedPtrField<v1::StepLoss> r;
  for (int64_t s = from; s < to; ++s) {
    v1::StepLoss* l = r.Add();
    l->set_step(s);
    l->set_loss(2.0f + 0.001f * static_cast<float>(s));
  }
  return r;
}

std::vector<int64_t> StepsOf(const v1::JobStatus& j) {
  std::vector<int64_t> out;
  for (const v1::StepLoss& s : j.step_losses()) out.push_back(s.step());
  return out;
}

TEST(LossCurveTest, KeepsTheFirstAndTheNewestStepsInOrder) {
  v1::JobStatus j;
  // Reports of uneven sizes, as the report interval makes them.
  int64_t at = 0;
  for (int64_t n : {7, 1, 30, 93, 250, 3, 16}) {
    MergeStepLosses(Steps(at, at + n), &j);
    at += n;
  }
  ASSERT_EQ(at, 400);
  std::vector<int64_t> want;
  for (int64_t s = 0; s < kFirstSteps; ++s) want.push_back(s);
  for (int64_t s = at - kRecentSteps; s < at; ++s) want.push_back(s);
  EXPECT_EQ(StepsOf(j), want);
  for (const v1::StepLoss& s : j.step_losses()) {
    EXPECT_FLOAT_EQ(s.loss(), 2.0f + 0.001f * static_cast<float>(s.step())) << s.step();
  }
}

TEST(LossCurveTest, StepsTrainedAgainReplaceTheKeptOnesFromThereOn) {
  v1::JobStatus j;
  MergeStepLosses(Steps(0, 50), &j);
  // Resumed from a checkpoint at step 30: steps 30.. are trained again, with
  // other losses; the old 30..49 are gone, not mixed in.
  google::protobuf::RepeatedPtrField<v1::StepLoss> again = Steps(30, 40);
  for (v1::StepLoss& s : again) s.set_loss(-1.0f);
  MergeStepLosses(again, &j);
  ASSERT_EQ(j.step_losses_size(), 40);
  EXPECT_EQ(j.step_losses(29).step(), 29);
  EXPECT_FLOAT_EQ(j.step_losses(29).loss(), 2.029f);
  EXPECT_EQ(j.step_losses(39).step(), 39);
  EXPECT_EQ(j.step_losses(39).loss(), -1.0f);
}

TEST(LossCurveTest, AnEmptyReportChangesNothingAndAnUnsortedOneIsSorted) {
  v1::JobStatus j;
  MergeStepLosses(Steps(0, 3), &j);
  MergeStepLosses({}, &j);
  EXPECT_EQ(StepsOf(j), (std::vector<int64_t>{0, 1, 2}));
  google::protobuf::RepeatedPtrField<v1::StepLoss> r = Steps(3, 6);
  r.SwapElements(0, 2);
  MergeStepLosses(r, &j);
  EXPECT_EQ(StepsOf(j), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

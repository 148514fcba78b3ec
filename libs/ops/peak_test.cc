#include "libs/ops/peak.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace ops {
namespace {

TEST(GemmPeakTest, MeasuresAPlausibleRateAndRejectsBadOptions) {
  absl::StatusOr<double> peak = MeasureGemmPeakFlops({.n = 256, .reps = 3, .threads = 1});
  ASSERT_TRUE(peak.ok()) << peak.status();
  // One core of any machine this runs on: above 1 GFLOP/s (a naive loop),
  // below 1 TFLOP/s (no CPU core does more f32 FMAs per second).
  EXPECT_GT(*peak, 1e9);
  EXPECT_LT(*peak, 1e12);
  EXPECT_TRUE(absl::IsInvalidArgument(MeasureGemmPeakFlops({.n = 0}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MeasureGemmPeakFlops({.threads = 0}).status()));
}

}  // namespace
}  // namespace ops
}  // namespace dtrain

#include "libs/ops/peak.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

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

// A fresh private directory for a cache.
std::string TempDir(const char* name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                 "/", name, "-", getpid());
  mkdir(dir.c_str(), 0700);
  return dir;
}

constexpr GemmPeakOptions kSmall{.n = 128, .reps = 2, .threads = 1};

TEST(HostGemmPeakTest, TheFirstCallerMeasuresAndTheNextReadsItsFigure) {
  const std::string dir = TempDir("peak-cache");
  bool cached = true;
  absl::StatusOr<double> first = HostGemmPeakFlops(kSmall, dir, &cached);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(cached);
  absl::StatusOr<double> second = HostGemmPeakFlops(kSmall, dir, &cached);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(cached);
  EXPECT_EQ(*second, *first);
  // Another size or thread count is another figure.
  absl::StatusOr<double> other =
      HostGemmPeakFlops({.n = 96, .reps = 2, .threads = 1}, dir, &cached);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(cached);
}

TEST(HostGemmPeakTest, CallersThatStartTogetherMeasureOnce) {
  const std::string dir = TempDir("peak-together");
  double figure[2] = {0, 0};
  bool cached[2] = {true, true};
  std::thread a([&] { figure[0] = HostGemmPeakFlops(kSmall, dir, &cached[0]).value_or(-1); });
  std::thread b([&] { figure[1] = HostGemmPeakFlops(kSmall, dir, &cached[1]).value_or(-1); });
  a.join();
  b.join();
  EXPECT_GT(figure[0], 0);
  EXPECT_EQ(figure[0], figure[1]);
  EXPECT_NE(cached[0], cached[1]) << "exactly one of them measures";
}

TEST(HostGemmPeakTest, AnUnreadableOrForeignCacheIsMeasuredAgain) {
  const std::string dir = TempDir("peak-bad");
  const std::string file = dir + "/gemm-peak-n128-t1";
  bool cached = true;
  for (const char* bad : {"garbage", "other-boot-id 5e10", "", "x -1"}) {
    std::ofstream(file) << bad;
    absl::StatusOr<double> peak = HostGemmPeakFlops(kSmall, dir, &cached);
    ASSERT_TRUE(peak.ok()) << bad;
    EXPECT_FALSE(cached) << "'" << bad << "' was taken as a figure";
    EXPECT_GT(*peak, 1e9);
  }
  // The last measurement replaced it.
  ASSERT_TRUE(HostGemmPeakFlops(kSmall, dir, &cached).ok());
  EXPECT_TRUE(cached);
}

TEST(HostGemmPeakTest, ADirectoryOthersMayWriteIsNotUsed) {
  const std::string dir = TempDir("peak-open");
  chmod(dir.c_str(), 0777);
  bool cached = true;
  ASSERT_TRUE(HostGemmPeakFlops(kSmall, dir, &cached).ok());
  ASSERT_TRUE(HostGemmPeakFlops(kSmall, dir, &cached).ok());
  EXPECT_FALSE(cached) << "a figure another user could have written was read";
  EXPECT_NE(access((dir + "/gemm-peak-n128-t1").c_str(), F_OK), 0) << "the cache was written";
}

}  // namespace
}  // namespace ops
}  // namespace dtrain

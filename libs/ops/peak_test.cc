#include "libs/ops/peak.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

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

// These tests are about the cache: their figures are kept however busy the
// machine running them is (min_cpu_share 0).
constexpr GemmPeakOptions kSmall{.n = 128, .reps = 2, .threads = 1, .min_cpu_share = 0};

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
      HostGemmPeakFlops({.n = 96, .reps = 2, .threads = 1, .min_cpu_share = 0}, dir, &cached);
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

// Processes spinning on every core (3 per core) for the test's duration.
class BusyCores {
 public:
  BusyCores() {
    const unsigned n = 3 * std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        for (volatile uint64_t x = 0;; x = x + 1) {
        }
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~BusyCores() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  size_t count() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

// A figure measured while other processes hold the cores reads low; it is
// returned but not kept, so the next caller measures again (here once the
// cores are free, and keeps its figure).
TEST(HostGemmPeakTest, AFigureMeasuredWhileOtherProcessesHoldTheCoresIsNotKept) {
  const std::string dir = TempDir("peak-busy");
  // Products long enough to span several of the scheduler's time slices.
  const GemmPeakOptions options{.n = 1024, .reps = 2, .threads = 1, .min_cpu_share = 0.9};
  const std::string file = dir + "/gemm-peak-n1024-t1";
  bool cached = true;
  {
    BusyCores busy;
    ASSERT_GE(busy.count(), 3u);
    double share = 1;
    ASSERT_TRUE(MeasureGemmPeakFlops(options, &share).ok());
    EXPECT_LT(share, 0.9) << "the spinning processes did not take the cores";
    absl::StatusOr<double> peak = HostGemmPeakFlops(options, dir, &cached);
    ASSERT_TRUE(peak.ok()) << peak.status();
    EXPECT_FALSE(cached);
    EXPECT_GT(*peak, 0);
    std::ifstream in(file);
    const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(kept, "") << "a figure measured on busy cores was kept";
  }
  GemmPeakOptions keep = options;
  keep.min_cpu_share = 0;  // however busy the machine running this test is
  ASSERT_TRUE(HostGemmPeakFlops(keep, dir, &cached).ok());
  EXPECT_FALSE(cached);
  ASSERT_TRUE(HostGemmPeakFlops(keep, dir, &cached).ok());
  EXPECT_TRUE(cached);
}

}  // namespace
}  // namespace ops
}  // namespace dtrain

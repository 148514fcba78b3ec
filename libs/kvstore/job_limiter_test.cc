#include "libs/kvstore/job_limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace dtrain {
namespace kvstore {
namespace {

TEST(JobLimiterTest, AJobAtItsCapIsRefusedAndOtherJobsAreNot) {
  JobLimiter limiter(2, "calls in flight", "--max_calls_per_job");
  absl::StatusOr<JobLimiter::Hold> a1 = limiter.Acquire("a");
  absl::StatusOr<JobLimiter::Hold> a2 = limiter.Acquire("a");
  ASSERT_TRUE(a1.ok() && a2.ok());
  absl::StatusOr<JobLimiter::Hold> a3 = limiter.Acquire("a");
  ASSERT_TRUE(absl::IsResourceExhausted(a3.status())) << a3.status();
  // The error names the job, the count and the knob.
  EXPECT_NE(a3.status().message().find("job 'a' has 2 calls in flight"), std::string::npos)
      << a3.status();
  EXPECT_NE(a3.status().message().find("--max_calls_per_job"), std::string::npos);
  EXPECT_TRUE(limiter.Acquire("b").ok());
  EXPECT_EQ(limiter.InUse("a"), 2);
  EXPECT_EQ(limiter.InUse("b"), 0) << "b's hold was a temporary, given back";
}

// A job whose token names many trainers gets kPerWorker places per
// trainer where that is more than the cap; a small or unsaid one gets the
// cap.
TEST(JobLimiterTest, AJobOfManyTrainersGetsPlacesPerTrainer) {
  JobLimiter limiter(2, "calls in flight", "--max_calls_per_job");
  const int workers = 3;
  std::vector<JobLimiter::Hold> held;
  for (int i = 0; i < JobLimiter::kPerWorker * workers; ++i) {
    absl::StatusOr<JobLimiter::Hold> h = limiter.Acquire("big", workers);
    ASSERT_TRUE(h.ok()) << i << ": " << h.status();
    held.push_back(*std::move(h));
  }
  absl::StatusOr<JobLimiter::Hold> over = limiter.Acquire("big", workers);
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_NE(over.status().message().find("4 per trainer of its 3"), std::string::npos)
      << over.status();
  for (int i = 0; i < 2; ++i) held.push_back(*limiter.Acquire("unsaid", 0));
  EXPECT_FALSE(limiter.Acquire("unsaid", 0).ok()) << "a token without a count gets the cap";
  EXPECT_EQ(limiter.InUse("big"), JobLimiter::kPerWorker * workers);
}

TEST(JobLimiterTest, AHoldGivesItsPlaceBackOnceWhenDestroyedOrMovedOver) {
  JobLimiter limiter(1, "connections", "--x");
  {
    absl::StatusOr<JobLimiter::Hold> h = limiter.Acquire("a");
    ASSERT_TRUE(h.ok());
    JobLimiter::Hold moved = std::move(*h);
    EXPECT_EQ(limiter.InUse("a"), 1);
    EXPECT_FALSE(limiter.Acquire("a").ok());
  }
  EXPECT_EQ(limiter.InUse("a"), 0);
  JobLimiter::Hold kept = *limiter.Acquire("a");
  kept = *limiter.Acquire("b");  // gives a's place back, takes b's
  EXPECT_EQ(limiter.InUse("a"), 0);
  EXPECT_EQ(limiter.InUse("b"), 1);
}

TEST(JobLimiterTest, NoCapHoldsNothing) {
  JobLimiter limiter(0, "calls", "--x");
  std::vector<JobLimiter::Hold> holds;
  for (int i = 0; i < 1000; ++i) holds.push_back(*limiter.Acquire("a"));
  EXPECT_EQ(limiter.InUse("a"), 0);
}

TEST(JobLimiterTest, ConcurrentCallersNeverExceedTheCap) {
  JobLimiter limiter(3, "calls", "--x");
  std::atomic<int> max_seen{0}, granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<JobLimiter::Hold> h = limiter.Acquire("a");
        if (!h.ok()) continue;
        ++granted;
        const int n = limiter.InUse("a");
        int m = max_seen.load();
        while (n > m && !max_seen.compare_exchange_weak(m, n)) {
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(granted.load(), 0);
  EXPECT_LE(max_seen.load(), 3);
  EXPECT_EQ(limiter.InUse("a"), 0);
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

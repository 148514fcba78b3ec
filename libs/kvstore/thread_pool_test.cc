#include "libs/kvstore/thread_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

// A task that blocks does not hold back the next one: the second task runs
// (and releases the first) while the first waits.
TEST(ElasticThreadPoolTest, BlockedTaskDoesNotDelayTheNext) {
  ElasticThreadPool pool;
  absl::Notification released, first_done;
  pool.Schedule([&] {
    if (released.WaitForNotificationWithTimeout(absl::Seconds(30))) first_done.Notify();
  });
  pool.Schedule([&] { released.Notify(); });
  EXPECT_TRUE(first_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(pool.num_threads(), 2);
}

// The destructor runs every task scheduled before it.
TEST(ElasticThreadPoolTest, DestructorRunsAllScheduledTasks) {
  std::atomic<int> ran{0};
  {
    ElasticThreadPool pool;
    for (int i = 0; i < 10; ++i) {
      pool.Schedule([&] {
        absl::SleepFor(absl::Milliseconds(20));
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

// Fair sharing: borrowed dominant share by weight, users' shares, and the
// weighted water-filling the simulation measures against.
#include "libs/scheduler/fair_sharing.h"

#include <numeric>

#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

QueueSpec Queue(int64_t trainers, int64_t cuda, double weight) {
  QueueSpec q;
  q.name = "q";
  q.cohort = "c";
  q.managed[kTrainers] = q.managed[kCudaDevices] = true;
  q.quota[kTrainers] = trainers;
  q.quota[kCudaDevices] = cuda;
  q.lending_limit = q.quota;
  q.weight = weight;
  return q;
}

TEST(FairSharingTest, QueueShareIsTheDominantBorrowedShareByWeight) {
  const QueueSpec q = Queue(4, 16, 2);
  Resources lendable;
  lendable[kTrainers] = 10;
  lendable[kCudaDevices] = 40;
  Resources usage;
  usage[kTrainers] = 4;  // at quota: nothing borrowed
  usage[kCudaDevices] = 16;
  EXPECT_EQ(QueueShare(q, usage, lendable), 0);
  usage[kTrainers] = 6;      // 2 of 10 borrowed
  usage[kCudaDevices] = 28;  // 12 of 40 borrowed: dominant
  EXPECT_DOUBLE_EQ(QueueShare(q, usage, lendable), 0.3 / 2);
  QueueSpec alone = q;
  alone.cohort.clear();
  EXPECT_EQ(QueueShare(alone, usage, lendable), 0);
}

TEST(FairSharingTest, UserShareIsTheDominantShareOfTheQueue) {
  const QueueSpec q = Queue(4, 16, 1);
  EXPECT_DOUBLE_EQ(UserShare(q, GangResources(1, 8, true)), 0.5);  // cuda 8/16 > 1/4
  EXPECT_DOUBLE_EQ(UserShare(q, GangResources(2, 1, true)), 0.5);  // trainers 2/4
  QueueSpec unlimited;
  EXPECT_DOUBLE_EQ(UserShare(unlimited, GangResources(3, 1, false)), 3);  // trainers
}

TEST(FairSharingTest, WaterFillingGivesNominalThenSplitsTheRestByWeight) {
  // Three queues of nominal 10; c is idle, a (weight 2) and b (1) want more.
  std::vector<double> s =
      WeightedFairShares({10, 10, 10}, {1e9, 1e9, 1e9}, {2, 1, 1}, {100, 100, 0}, 30);
  EXPECT_NEAR(s[0], 10 + 10 * 2.0 / 3, 1e-6);
  EXPECT_NEAR(s[1], 10 + 10 * 1.0 / 3, 1e-6);
  EXPECT_NEAR(s[2], 0, 1e-9);
  // b wants only 12: a gets the rest; a limit caps.
  s = WeightedFairShares({10, 10, 10}, {1e9, 1e9, 1e9}, {1, 1, 1}, {100, 12, 5}, 30);
  EXPECT_NEAR(s[1], 12, 1e-6);
  EXPECT_NEAR(s[2], 5, 1e-6);
  EXPECT_NEAR(s[0], 13, 1e-6);
  s = WeightedFairShares({10, 10, 10}, {11, 1e9, 1e9}, {1, 1, 1}, {100, 100, 0}, 30);
  EXPECT_NEAR(s[0], 11, 1e-6);
  EXPECT_NEAR(s[1], 19, 1e-6);
  // Demand below nominal: everyone gets what they want.
  s = WeightedFairShares({10, 10}, {10, 10}, {1, 1}, {3, 4}, 20);
  EXPECT_NEAR(std::accumulate(s.begin(), s.end(), 0.0), 7, 1e-9);
}

TEST(FairSharingTest, CohortLendableSumsLendingLimits) {
  QueueConfig c;
  c.queues = {Queue(4, 16, 1), Queue(2, 8, 1)};
  c.queues[1].lending_limit[kTrainers] = 1;
  EXPECT_EQ(CohortLendable(c, "c")[kTrainers], 5);
  EXPECT_EQ(CohortLendable(c, "c")[kCudaDevices], 24);
  EXPECT_TRUE(CohortLendable(c, "").IsZero());
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

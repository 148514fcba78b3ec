#include "libs/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain::data {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

using Order = std::vector<int64_t>;

bool IsPermutation(const Order& order, int64_t n) {
  Order sorted = order;
  std::sort(sorted.begin(), sorted.end());
  Order identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  return sorted == identity;
}

TEST(SamplerTest, SplitMix64MatchesTheReferenceGenerator) {
  // The first outputs of Vigna's splitmix64.c seeded with 1234567.
  uint64_t state = 1234567;
  EXPECT_EQ(SplitMix64Next(&state), 6457827717110365317ULL);
  EXPECT_EQ(SplitMix64Next(&state), 3203168211198807973ULL);
  EXPECT_EQ(SplitMix64Next(&state), 9817491932198370423ULL);
}

// Golden orders printed by `python3 libs/data/epoch_order.py` (the reference
// that the PyTorch scripts import) and cross-checked with an independent
// implementation on ctypes.c_uint64 arithmetic.
TEST(SamplerTest, MatchesPythonReference) {
  EXPECT_THAT(EpochOrder(10, 0, 0, true), ElementsAre(6, 3, 2, 9, 8, 1, 4, 7, 0, 5));
  EXPECT_THAT(EpochOrder(10, 42, 1, true), ElementsAre(7, 5, 8, 0, 9, 6, 2, 1, 4, 3));
  EXPECT_THAT(EpochOrder(10, 42, 2, true), ElementsAre(9, 0, 3, 8, 1, 2, 6, 7, 5, 4));
  // Wrap-around: the largest seed and a negative epoch.
  EXPECT_THAT(EpochOrder(16, ~uint64_t{0}, -1, true),
              ElementsAre(8, 13, 0, 10, 6, 5, 7, 4, 1, 14, 12, 3, 11, 2, 9, 15));
  const Order big = EpochOrder(60000, 42, 3, true);
  ASSERT_EQ(big.size(), 60000u);
  EXPECT_THAT(Order(big.begin(), big.begin() + 8),
              ElementsAre(51749, 40203, 46307, 56485, 7861, 17120, 17428, 57178));
  EXPECT_THAT(Order(big.end() - 4, big.end()), ElementsAre(47379, 58118, 37495, 1589));
  // shard_order(epoch_order(10, 42, 1), 1, 3)
  absl::StatusOr<Order> shard = ShardOrder(EpochOrder(10, 42, 1, true), 1, 3);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_THAT(*shard, ElementsAre(5, 9, 1));
}

TEST(SamplerTest, WithoutShuffleIsTheIdentity) {
  EXPECT_THAT(EpochOrder(5, 42, 7, false), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_TRUE(EpochOrder(0, 42, 7, true).empty());
  EXPECT_TRUE(EpochOrder(-3, 42, 7, true).empty());
  EXPECT_THAT(EpochOrder(1, 42, 7, true), ElementsAre(0));
}

TEST(SamplerTest, IsAPermutationAndDeterministic) {
  for (int64_t n : {2, 3, 10, 1000, 60000}) {
    const Order order = EpochOrder(n, 123, 4, true);
    EXPECT_TRUE(IsPermutation(order, n)) << n;
    EXPECT_EQ(order, EpochOrder(n, 123, 4, true)) << n;
  }
}

TEST(SamplerTest, DiffersBetweenEpochsAndSeeds) {
  const Order base = EpochOrder(1000, 7, 0, true);
  Order identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(base, identity);
  std::set<Order> seen = {base};
  for (int64_t epoch = 1; epoch < 20; ++epoch) {
    EXPECT_TRUE(seen.insert(EpochOrder(1000, 7, epoch, true)).second) << "epoch " << epoch;
  }
  for (uint64_t seed : {0ULL, 1ULL, 8ULL, 1ULL << 63}) {
    EXPECT_TRUE(seen.insert(EpochOrder(1000, seed, 0, true)).second) << "seed " << seed;
  }
}

TEST(SamplerTest, ShardsAreDisjointEqualAndCoverAllButFewerThanWorldSize) {
  for (int64_t n : {0, 1, 7, 10, 60000, 60001}) {
    for (int w : {1, 2, 3, 7, 8}) {
      const Order order = EpochOrder(n, 5, 2, true);
      std::set<int64_t> covered;
      int64_t total = 0;
      for (int r = 0; r < w; ++r) {
        absl::StatusOr<Order> shard = ShardOrder(order, r, w);
        ASSERT_TRUE(shard.ok()) << shard.status();
        EXPECT_EQ(static_cast<int64_t>(shard->size()), n / w) << "n=" << n << " w=" << w;
        for (size_t k = 0; k < shard->size(); ++k) {
          EXPECT_EQ((*shard)[k], order[r + k * w]);
        }
        covered.insert(shard->begin(), shard->end());
        total += shard->size();
      }
      EXPECT_EQ(static_cast<int64_t>(covered.size()), total) << "shards overlap";
      EXPECT_LT(n - total, w);
      EXPECT_GE(n - total, 0);
    }
  }
}

TEST(SamplerTest, ShardRejectsInvalidRankAndWorldSize) {
  const Order order = EpochOrder(10, 0, 0, true);
  EXPECT_EQ(ShardOrder(order, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardOrder(order, 0, -2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardOrder(order, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardOrder(order, -1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(*ShardOrder(order, 0, 1), ElementsAreArray(order));
}

}  // namespace
}  // namespace dtrain::data

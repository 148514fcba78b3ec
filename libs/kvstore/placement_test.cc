#include "libs/kvstore/placement.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

TEST(PlacementTest, AJobsSmallKeysLiveTogetherOnItsHomeShard) {
  for (int servers = 1; servers <= 5; ++servers) {
    const int home = HomeShard("resnet", servers);
    ASSERT_GE(home, 0);
    ASSERT_LT(home, servers);
    for (int k = 0; k < 100; ++k) {
      // 4 B to just under 64 KiB.
      const int64_t elements = 1 + k * ((64 << 10) / 4 - 2) / 99;
      auto slices = PlaceKey("resnet", absl::StrCat("layer", k, ".bias"), {elements}, DType::kF32,
                             servers, PlacementOptions());
      ASSERT_TRUE(slices.ok());
      ASSERT_EQ(slices->size(), 1u);
      EXPECT_EQ((*slices)[0].spec.count, elements);
      EXPECT_EQ((*slices)[0].spec.num_slices, 1);
      EXPECT_EQ((*slices)[0].server, home) << "key " << k << " of " << elements << " floats";
    }
  }
}

TEST(PlacementTest, JobsSpreadTheirHomesOverTheShards) {
  std::map<int, int> per_server;
  for (int j = 0; j < 400; ++j) {
    const std::string job = absl::StrCat("job-", j);
    auto slices = PlaceKey(job, "b", {16}, DType::kF32, 4, PlacementOptions());
    ASSERT_TRUE(slices.ok());
    EXPECT_EQ((*slices)[0].server, HomeShard(job, 4));
    ++per_server[(*slices)[0].server];
  }
  for (int s = 0; s < 4; ++s) EXPECT_GT(per_server[s], 60) << "server " << s;
}

TEST(PlacementTest, MidSizedKeysAreWholeAndSpreadByTheirNames) {
  // 64 KiB (exactly: no longer small) up to 256 KiB, and small keys with
  // co-location off.
  PlacementOptions spread;
  spread.colocate_below_bytes = 0;
  for (const auto& [elements, options] : {std::make_pair(int64_t{16 << 10}, PlacementOptions()),
                                          std::make_pair(int64_t{64 << 10} - 1, PlacementOptions()),
                                          std::make_pair(int64_t{64}, spread)}) {
    std::map<int, int> per_server;
    for (int k = 0; k < 400; ++k) {
      const std::string key = absl::StrCat("layer", k, ".weight");
      auto slices = PlaceKey("resnet", key, {elements}, DType::kF32, 4, options);
      ASSERT_TRUE(slices.ok());
      ASSERT_EQ(slices->size(), 1u);
      EXPECT_EQ((*slices)[0].spec.count, elements);
      EXPECT_EQ((*slices)[0].server, static_cast<int>(Fnv1a(key) % 4));
      ++per_server[(*slices)[0].server];
    }
    for (int s = 0; s < 4; ++s) EXPECT_GT(per_server[s], 60) << elements << " floats, server " << s;
  }
}

TEST(PlacementTest, LargeKeysAreSlicedEvenlyOverAllServers) {
  for (int servers = 1; servers <= 5; ++servers) {
    auto slices = PlaceKey("job", "w", {1001, 257}, DType::kF32, servers, PlacementOptions());
    ASSERT_TRUE(slices.ok());
    ASSERT_EQ(static_cast<int>(slices->size()), servers);
    int64_t next = 0;
    std::map<int, int> used;
    for (size_t i = 0; i < slices->size(); ++i) {
      const SliceSpec& s = (*slices)[i].spec;
      EXPECT_EQ(s.slice, static_cast<int>(i));
      EXPECT_EQ(s.offset, next);
      EXPECT_LE(std::abs(s.count - 1001 * 257 / servers), 1);  // equal bytes within an element
      EXPECT_TRUE(ValidateSliceSpec(s).ok());
      next += s.count;
      ++used[(*slices)[i].server];
    }
    EXPECT_EQ(next, 1001 * 257);
    EXPECT_EQ(static_cast<int>(used.size()), servers);  // one slice per server
  }
}

TEST(PlacementTest, DeterministicAndValidated) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{6, 1, 5, 5}, std::vector<int64_t>{120, 400}}) {
    auto a = PlaceKey("lenet", "conv1.weight", shape, DType::kF32, 3, PlacementOptions());
    auto b = PlaceKey("lenet", "conv1.weight", shape, DType::kF32, 3, PlacementOptions());
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ((*a)[0].server, (*b)[0].server);
  }
  EXPECT_EQ(Fnv1a(""), 14695981039346656037ull);
  EXPECT_FALSE(PlaceKey("job", "w", {4}, DType::kF32, 0, PlacementOptions()).ok());
  EXPECT_FALSE(PlaceKey("job", "", {4}, DType::kF32, 2, PlacementOptions()).ok());
  EXPECT_FALSE(PlaceKey("job", "w", {-4}, DType::kF32, 2, PlacementOptions()).ok());
  EXPECT_FALSE(PlaceKey("job", "w", {4}, DType::kU8, 2, PlacementOptions()).ok());
  // A tiny key never gets more slices than elements (slicing comes first).
  PlacementOptions tiny;
  tiny.slice_threshold_bytes = 1;
  EXPECT_EQ(PlaceKey("job", "w", {2}, DType::kF32, 4, tiny)->size(), 2u);
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

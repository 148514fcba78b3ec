#include "libs/kvstore/placement.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

TEST(PlacementTest, SmallKeysAreWholeAndSpreadByHash) {
  std::map<int, int> per_server;
  for (int k = 0; k < 400; ++k) {
    auto slices =
        PlaceKey(absl::StrCat("layer", k, ".bias"), {64}, DType::kF32, 4, PlacementOptions());
    ASSERT_TRUE(slices.ok());
    ASSERT_EQ(slices->size(), 1u);
    EXPECT_EQ((*slices)[0].spec.count, 64);
    EXPECT_EQ((*slices)[0].spec.num_slices, 1);
    ++per_server[(*slices)[0].server];
  }
  for (int s = 0; s < 4; ++s) EXPECT_GT(per_server[s], 60) << "server " << s;
}

TEST(PlacementTest, LargeKeysAreSlicedEvenlyOverAllServers) {
  for (int servers = 1; servers <= 5; ++servers) {
    auto slices = PlaceKey("w", {1001, 257}, DType::kF32, servers, PlacementOptions());
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
  auto a = PlaceKey("conv1.weight", {6, 1, 5, 5}, DType::kF32, 3, PlacementOptions());
  auto b = PlaceKey("conv1.weight", {6, 1, 5, 5}, DType::kF32, 3, PlacementOptions());
  ASSERT_EQ((*a)[0].server, (*b)[0].server);
  EXPECT_EQ(Fnv1a(""), 14695981039346656037ull);
  EXPECT_FALSE(PlaceKey("w", {4}, DType::kF32, 0, PlacementOptions()).ok());
  EXPECT_FALSE(PlaceKey("", {4}, DType::kF32, 2, PlacementOptions()).ok());
  EXPECT_FALSE(PlaceKey("w", {-4}, DType::kF32, 2, PlacementOptions()).ok());
  EXPECT_FALSE(PlaceKey("w", {4}, DType::kU8, 2, PlacementOptions()).ok());
  // A tiny key never gets more slices than elements.
  PlacementOptions tiny;
  tiny.slice_threshold_bytes = 1;
  EXPECT_EQ(PlaceKey("w", {2}, DType::kF32, 4, tiny)->size(), 2u);
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

#include "libs/kvstore/chunks.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

TEST(ChunkAssemblerTest, GathersInOrderChunks) {
  ChunkAssembler a({{"a", 5}, {"b", 2}});
  ASSERT_TRUE(a.Add(0, 0, {"ab", "c"}).ok());
  ASSERT_TRUE(a.Add(1, 0, {"xy"}).ok());
  ASSERT_TRUE(a.Add(0, 3, {"de"}).ok());
  ASSERT_TRUE(a.Finish(false).ok());
  EXPECT_EQ(a.pieces(0).size(), 3u);
  EXPECT_EQ(a.bytes(), 7);
}

TEST(ChunkAssemblerTest, RejectsMalformedChunks) {
  ChunkAssembler a({{"key 'w'", 4}});
  EXPECT_TRUE(absl::StrContains(a.Add(1, 0, {"x"}).message(), "item 1"));
  EXPECT_TRUE(absl::StrContains(a.Add(-1, 0, {"x"}).message(), "item -1"));
  EXPECT_TRUE(absl::StrContains(a.Add(0, 2, {"x"}).message(), "expected offset 0"));
  EXPECT_TRUE(absl::StrContains(a.Add(0, 0, {""}).message(), "empty chunk"));
  EXPECT_TRUE(absl::StrContains(a.Add(0, 0, {"12345"}).message(), "larger"));
  ASSERT_TRUE(a.Add(0, 0, {"12"}).ok());
  EXPECT_TRUE(absl::StrContains(a.Finish(false).message(), "has 2 bytes, expected 4"));
  ChunkAssembler empty({{"z", 4}});
  EXPECT_TRUE(empty.Finish(true).ok());
  EXPECT_FALSE(empty.Finish(false).ok());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

#include "libs/kvstore/malloc_tuning.h"

#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace kvstore {
namespace {

TEST(MallocTuningTest, AppliesOnGlibcAndKeepsAllocationsWorking) {
#if defined(__GLIBC__)
  EXPECT_TRUE(TuneMallocForBulkTransfers());
#else
  EXPECT_FALSE(TuneMallocForBulkTransfers());
#endif
  for (int i = 0; i < 8; ++i) {
    std::vector<char> big(size_t{8} << 20, static_cast<char>(i));
    EXPECT_EQ(big.back(), static_cast<char>(i));
  }
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

#include "libs/kvstore/malloc_tuning.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
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

#if defined(__GLIBC__)
// VmRSS of this process in bytes.
int64_t ResidentBytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// With freed memory kept (TuneMallocForBulkTransfers), ReleaseFreeMemory
// gives 64 MiB of freed blocks back: resident memory drops by most of it.
TEST(MallocTuningTest, ReleaseFreeMemoryReturnsFreedBlocks) {
  ASSERT_TRUE(TuneMallocForBulkTransfers());
  std::vector<char*> blocks;
  for (int i = 0; i < 256; ++i) {
    char* b = static_cast<char*>(std::malloc(256 << 10));  // below the mmap threshold
    ASSERT_NE(b, nullptr);
    std::memset(b, i, 256 << 10);
    blocks.push_back(b);
  }
  for (char* b : blocks) std::free(b);
  const int64_t kept = ResidentBytes();
  ASSERT_TRUE(ReleaseFreeMemory());
  const int64_t released = ResidentBytes();
  ASSERT_GT(kept, 0);
  EXPECT_LE(released, kept - (32 << 20)) << "VmRSS " << kept << " -> " << released;
}
#endif

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

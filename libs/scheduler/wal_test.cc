#include "libs/scheduler/wal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace dtrain {
namespace scheduler {
namespace {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string p = std::string(dir ? dir : "/tmp") + "/" + name;
  std::remove(p.c_str());
  return p;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

TEST(WalTest, Crc32MatchesZlib) { EXPECT_EQ(Crc32("123456789"), 0xCBF43926u); }

TEST(WalTest, AppendThenReplay) {
  std::string path = TmpPath("a.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE(wal.ok()) << wal.status();
    EXPECT_TRUE(records.empty());
    ASSERT_TRUE((*wal)->Append("one").ok());
    ASSERT_TRUE((*wal)->Append("").ok());
    ASSERT_TRUE((*wal)->Append(std::string(100000, 'x')).ok());
  }
  auto wal = Wal::Open(path, &records);
  ASSERT_TRUE(wal.ok()) << wal.status();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0], "one");
  EXPECT_EQ(records[1], "");
  EXPECT_EQ(records[2].size(), 100000u);
  ASSERT_TRUE((*wal)->Append("four").ok());
  wal->reset();
  ASSERT_TRUE(Wal::Open(path, &records).ok());
  EXPECT_EQ(records.size(), 4u);
}

// Every prefix of the last record (a crash mid-append) is cut off, and the
// log is usable afterwards.
TEST(WalTest, TruncatedLastRecordIsCutOff) {
  std::string path = TmpPath("t.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE(wal.ok());
    ASSERT_TRUE((*wal)->Append("first").ok());
    ASSERT_TRUE((*wal)->Append("second record").ok());
  }
  const std::string full = ReadAll(path);
  const size_t first_end = 8 + 5;
  for (size_t cut = first_end + 1; cut < full.size(); ++cut) {
    SCOPED_TRACE(cut);
    WriteAll(path, full.substr(0, cut));
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE(wal.ok()) << wal.status();
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0], "first");
    EXPECT_EQ((*wal)->size(), static_cast<int64_t>(first_end));
    ASSERT_TRUE((*wal)->Append("again").ok());
    wal->reset();
    ASSERT_TRUE(Wal::Open(path, &records).ok());
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(records[1], "again");
  }
}

TEST(WalTest, CorruptLastRecordIsCutOff) {
  std::string path = TmpPath("c.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE((*wal)->Append("first").ok());
    ASSERT_TRUE((*wal)->Append("second").ok());
  }
  std::string data = ReadAll(path);
  data.back() ^= 1;
  WriteAll(path, data);
  ASSERT_TRUE(Wal::Open(path, &records).ok());
  ASSERT_EQ(records.size(), 1u);
}

TEST(WalTest, CorruptionBeforeTheEndIsDataLoss) {
  std::string path = TmpPath("m.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE((*wal)->Append("first").ok());
    ASSERT_TRUE((*wal)->Append("second").ok());
  }
  std::string data = ReadAll(path);
  data[9] ^= 1;  // inside "first"
  WriteAll(path, data);
  auto wal = Wal::Open(path, &records);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kDataLoss) << wal.status();
}

TEST(WalTest, RewriteReplacesTheLog) {
  std::string path = TmpPath("r.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE((*wal)->Append("old").ok());
  }
  auto wal = Wal::Rewrite(path, {"a", "b"});
  ASSERT_TRUE(wal.ok()) << wal.status();
  ASSERT_TRUE((*wal)->Append("c").ok());
  wal->reset();
  ASSERT_TRUE(Wal::Open(path, &records).ok());
  EXPECT_EQ(records, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(WalTest, UnwritableDirectoryIsAnError) {
  std::vector<std::string> records;
  auto wal = Wal::Open("/nonexistent-dir/x.wal", &records);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kNotFound) << wal.status();
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

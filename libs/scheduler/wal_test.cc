#include "libs/scheduler/wal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/scheduler/tmpfs_for_test.h"

namespace dtrain {
namespace scheduler {
namespace {

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

TEST(WalTest, Crc32MatchesZlib) { EXPECT_EQ(Crc32("123456789"), 0xCBF43926u); }

TEST(WalTest, AppendThenReplay) {
  std::string path = FreshTestPath("a.wal");
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
  std::string path = FreshTestPath("t.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE(wal.ok());
    ASSERT_TRUE((*wal)->Append("first").ok());
    ASSERT_TRUE((*wal)->Append("second record").ok());
  }
  const std::string full = ReadFileForTest(path);
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
  std::string path = FreshTestPath("c.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE((*wal)->Append("first").ok());
    ASSERT_TRUE((*wal)->Append("second").ok());
  }
  std::string data = ReadFileForTest(path);
  data.back() ^= 1;
  WriteAll(path, data);
  ASSERT_TRUE(Wal::Open(path, &records).ok());
  ASSERT_EQ(records.size(), 1u);
}

TEST(WalTest, CorruptionBeforeTheEndIsDataLoss) {
  std::string path = FreshTestPath("m.wal");
  std::vector<std::string> records;
  {
    auto wal = Wal::Open(path, &records);
    ASSERT_TRUE((*wal)->Append("first").ok());
    ASSERT_TRUE((*wal)->Append("second").ok());
  }
  std::string data = ReadFileForTest(path);
  data[9] ^= 1;  // inside "first"
  WriteAll(path, data);
  auto wal = Wal::Open(path, &records);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kDataLoss) << wal.status();
}

// Compaction while the log is open: the file is replaced, appends go to the
// new one, no temporary file is left behind.
TEST(WalTest, CompactReplacesTheLogWhileOpen) {
  std::string path = FreshTestPath("r.wal");
  std::vector<std::string> records;
  auto wal = Wal::Open(path, &records);
  ASSERT_TRUE(wal.ok()) << wal.status();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*wal)->Append("old").ok());
  EXPECT_EQ((*wal)->records(), 10);
  ASSERT_TRUE((*wal)->Compact({"a", "b"}).ok());
  EXPECT_EQ((*wal)->records(), 2);
  EXPECT_EQ((*wal)->size(), static_cast<int64_t>(ReadFileForTest(path).size()));
  ASSERT_TRUE((*wal)->Append("c").ok());
  EXPECT_EQ((*wal)->records(), 3);
  EXPECT_TRUE(ReadFileForTest(path + ".compact").empty());
  EXPECT_NE(access((path + ".compact").c_str(), F_OK), 0) << "temporary file left behind";
  wal->reset();
  ASSERT_TRUE(Wal::Open(path, &records).ok());
  EXPECT_EQ(records, (std::vector<std::string>{"a", "b", "c"}));
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// A real full disk (a 64 KiB tmpfs): failed appends leave the log exactly as
// it was (no torn frame that would make a later record unreadable), and it
// takes appends again once there is space.
TEST(WalTest, FailedAppendOnAFullDiskLeavesTheLogReadable) {
  absl::StatusOr<std::string> dir = MountSmallTmpfs("wal_full", 64 << 10);
  ASSERT_TRUE(dir.ok()) << "this test needs a real full filesystem: " << dir.status();
  const std::string path = *dir + "/full.wal";
  std::vector<std::string> records;
  auto wal = Wal::Open(path, &records);
  ASSERT_TRUE(wal.ok()) << wal.status();
  ASSERT_TRUE((*wal)->Append("first").ok());
  ASSERT_TRUE((*wal)->Append("second").ok());
  const int64_t good = (*wal)->size();
  absl::StatusOr<int64_t> filled = FillDisk(*dir + "/filler");
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_GT(*filled, 32 << 10);

  // Larger than the free tail of the log's last page: part of it can be
  // written before the disk is full.
  const std::string big(3 * 4096, 'b');
  absl::Status s = (*wal)->Append(big);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s;
  EXPECT_EQ((*wal)->size(), good);
  EXPECT_EQ(FileSize(path), good) << "a torn frame was left in the log";
  EXPECT_EQ((*wal)->records(), 2);
  // All or nothing for a batch.
  s = (*wal)->AppendAll({"x", big});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(FileSize(path), good);
  // Compaction needs a second file, which does not fit: the log stays.
  s = (*wal)->Compact({big, big});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(FileSize(path), good);
  EXPECT_NE(access((path + ".compact").c_str(), F_OK), 0) << "temporary file left behind";
  {
    std::vector<std::string> now;
    auto again = Wal::Open(path, &now);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(now, (std::vector<std::string>{"first", "second"}));
  }

  // Space again: appends follow the last good record.
  ASSERT_EQ(std::remove((*dir + "/filler").c_str()), 0);
  ASSERT_TRUE((*wal)->Append(big).ok());
  ASSERT_TRUE((*wal)->AppendAll({"x", "y"}).ok());
  EXPECT_EQ((*wal)->records(), 5);
  EXPECT_EQ(FileSize(path), (*wal)->size());
  wal->reset();
  ASSERT_TRUE(Wal::Open(path, &records).ok());
  EXPECT_EQ(records, (std::vector<std::string>{"first", "second", big, "x", "y"}));
}

TEST(WalTest, UnwritableDirectoryIsAnError) {
  std::vector<std::string> records;
  auto wal = Wal::Open("/nonexistent-dir/x.wal", &records);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kNotFound) << wal.status();
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

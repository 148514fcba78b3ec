#include "libs/kvstore/snapshot.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/checkpoint/checkpoint.h"
#include "libs/kvstore/placement.h"

namespace dtrain {
namespace kvstore {
namespace {

std::string F32(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

absl::Status Push(Store& s, int worker, int64_t round, const std::vector<float>& g) {
  std::string bytes = F32(g);
  return s.Push("j", worker, Compression::kNone, {{"w", 0, round, DType::kF32, {3}, {bytes}}})
      .status();
}

std::string Value(Store& s) {
  auto v = s.Pull("j", 0, {{"w", 0, 0}}, PullOptions());
  EXPECT_TRUE(v.ok()) << v.status();
  return std::string((*v)[0].bytes.view());
}

void Fill(Store& store) {
  JobConfig c;
  c.job = "j";
  c.num_workers = 2;
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = 0.1;
  c.momentum = 0.9;
  c.weight_decay = 1.0 / 3;  // needs all 17 digits to round-trip
  c.placement = DescribePlacement(PlacementOptions());
  ASSERT_TRUE(store.CreateJob(c).ok());
  SliceSpec spec;
  spec.key = "w";
  spec.shape = {3};
  spec.count = 3;
  std::string init = F32({0.1f, 0.2f, 0.3f});
  ASSERT_TRUE(store.Init("j", {{spec, {init}}}).ok());
  ASSERT_TRUE(Push(store, 0, 1, {1, 2, 3}).ok());
  ASSERT_TRUE(Push(store, 1, 1, {3, 2, 1}).ok());
  ASSERT_TRUE(Push(store, 0, 2, {0.5f, 0.5f, 0.5f}).ok());  // round 2 half pushed
}

TEST(SnapshotTest, RoundTripResumesExactly) {
  std::string dir = FreshTestDir("roundtrip");
  Store store{StoreOptions()};
  Fill(store);
  absl::StatusOr<SnapshotInfo> info = WriteSnapshot(store, dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->path, dir + "/kvstore-shard-0.dtckpt");
  EXPECT_EQ(info->slices, 1);

  Store restored{StoreOptions()};
  ASSERT_EQ(*LoadSnapshot(dir, &restored), true);
  EXPECT_EQ(Value(restored), Value(store));
  EXPECT_EQ(restored.GetJob("j", 0, false)->config, store.GetJob("j", 0, false)->config);
  EXPECT_EQ(restored.GetJob("j", 0, false)->config.placement,
            DescribePlacement(PlacementOptions()));
  // Both finish round 2 identically (the half-pushed round survived).
  for (Store* s : {&store, &restored}) ASSERT_TRUE(Push(*s, 1, 2, {1, 1, 1}).ok());
  EXPECT_EQ(Value(restored), Value(store));
  EXPECT_EQ(restored.GetJob("j", 1, true)->slices[0].pushed_round, 2);
}

// A snapshot written before JobConfig.max_delay was renamed max_staleness
// still loads (with its bounded-delay setting).
TEST(SnapshotTest, ReadsTheOldMaxDelayName) {
  std::string dir = FreshTestDir("old_name");
  Store store{StoreOptions()};
  JobConfig c;
  c.job = "b";
  c.num_workers = 2;
  c.consistency = Consistency::kBoundedDelay;
  c.max_staleness = 3;
  c.optimizer = OptimizerKind::kSgd;
  c.learning_rate = 0.1;
  ASSERT_TRUE(store.CreateJob(c).ok());
  absl::StatusOr<SnapshotInfo> info = WriteSnapshot(store, dir);
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<checkpoint::Checkpoint> ckpt = checkpoint::ReadCheckpoint(info->path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::string& config = ckpt->metadata["job.0"];
  const size_t at = config.find("max_staleness");
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, std::strlen("max_staleness"), "max_delay");
  // Nor had it a placement line (JobConfig::placement came later).
  const size_t placement = config.find("\nplacement=");
  ASSERT_NE(placement, std::string::npos) << config;
  config.erase(placement, config.find('\n', placement + 1) - placement);
  ASSERT_TRUE(checkpoint::WriteCheckpoint(info->path, *ckpt).ok());

  Store restored{StoreOptions()};
  absl::StatusOr<bool> loaded = LoadSnapshot(dir, &restored);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(*loaded);
  EXPECT_EQ(restored.GetJob("b", 0, false)->config.max_staleness, 3);
  EXPECT_EQ(restored.GetJob("b", 0, false)->config.placement, "");
}

TEST(SnapshotTest, MissingDamagedAndForeignSnapshots) {
  std::string dir = FreshTestDir("damaged");
  Store empty{StoreOptions()};
  EXPECT_EQ(*LoadSnapshot(dir, &empty), false);

  Store store{StoreOptions()};
  Fill(store);
  ASSERT_TRUE(WriteSnapshot(store, dir).ok());
  // Another shard's file name is not ours.
  StoreOptions other;
  other.shard_index = 1;
  Store shard1{other};
  EXPECT_EQ(*LoadSnapshot(dir, &shard1), false);
  ASSERT_EQ(std::rename((dir + "/kvstore-shard-0.dtckpt").c_str(),
                        (dir + "/kvstore-shard-1.dtckpt").c_str()),
            0);
  EXPECT_EQ(LoadSnapshot(dir, &shard1).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(std::rename((dir + "/kvstore-shard-1.dtckpt").c_str(),
                        (dir + "/kvstore-shard-0.dtckpt").c_str()),
            0);
  // Flip a byte in the middle: the checksum catches it, nothing is loaded.
  {
    std::fstream f(dir + "/kvstore-shard-0.dtckpt",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    std::streamoff size = f.tellg();
    f.seekp(size / 2);
    char c = 0;
    f.seekg(size / 2);
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(size / 2);
    f.write(&c, 1);
  }
  Store damaged{StoreOptions()};
  EXPECT_EQ(LoadSnapshot(dir, &damaged).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(damaged.JobNames().empty());
}

TEST(SnapshotTest, SnapshotterWritesWhenChanged) {
  std::string dir = FreshTestDir("snapshotter");
  Store store{StoreOptions()};
  Fill(store);
  Snapshotter snapshotter(&store, dir, absl::Milliseconds(20));
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (snapshotter.snapshots_written() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(snapshotter.snapshots_written(), 1);
  snapshotter.Stop();
  int64_t written = snapshotter.snapshots_written();
  EXPECT_EQ(*snapshotter.SnapshotIfChanged(), false);
  ASSERT_TRUE(Push(store, 1, 2, {1, 1, 1}).ok());
  EXPECT_EQ(*snapshotter.SnapshotIfChanged(), true);
  EXPECT_EQ(snapshotter.snapshots_written(), written + 1);
  Store restored{StoreOptions()};
  ASSERT_TRUE(*LoadSnapshot(dir, &restored));
  EXPECT_EQ(Value(restored), Value(store));
  // No data directory: nothing written.
  Snapshotter none(&store, "", absl::Milliseconds(1));
  EXPECT_TRUE(none.SnapshotNow()->path.empty());
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

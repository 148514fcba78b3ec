// Must-show of docs/data.md: Fashion-MNIST written out by the test as
// WebDataset PNG shards and as .npy (both in IDX order) trains a 2-rank
// LeNet job (two ranks in this process, in-process communicators) whose
// per-epoch losses, train accuracies and test accuracies equal the IDX
// run's bit for bit; and with a rank lost in epoch 1 and replaced in place,
// the WebDataset run equals the IDX run with the same loss.
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "libs/collective/communicator.h"
#include "libs/collective/store.h"
#include "libs/data/fashion_mnist.h"
#include "libs/data/open.h"
#include "libs/data/pack.h"
#include "libs/train/job.h"
#include "libs/train/job_test_util.h"

namespace dtrain {
namespace train {
namespace {

using testing::EpochRecorder;
using testing::SameBits;
using testing::TmpDir;

constexpr int64_t kTrain = 2048;
constexpr int64_t kTest = 500;

// Rank `r` of the 2-rank LeNet job both tests run on `d` (2 epochs of
// kTrain images).
JobConfig TwoRankLenet(const std::string& name, const data::DataConfig& d, int r) {
  JobConfig c;
  c.name = name;
  c.model = "lenet";
  c.epochs = 2;
  c.global_batch_size = 128;
  c.sgd = {.lr = 0.05f, .momentum = 0.9f};
  c.seed = 7;
  c.init = "kaiming";
  c.threads = 1;
  c.train_limit = kTrain;
  c.test_limit = kTest;
  c.data = d;
  c.rank = r;
  c.world_size = 2;
  return c;
}

// Both ranks' per-epoch progress.
std::vector<std::vector<JobProgress>> TrainTwoRanks(const data::DataConfig& d) {
  collective::InMemoryStore store;
  EpochRecorder rec[2];
  absl::Status st[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      collective::CommunicatorOptions co;
      co.transport = collective::TransportKind::kInProcess;
      auto comm = collective::Communicator::Create(r, 2, &store, co);
      if (!comm.ok()) {
        st[r] = comm.status();
        return;
      }
      JobConfig c = TwoRankLenet("formats", d, r);
      c.communicator = comm->get();
      JobProgress p;
      st[r] = RunJob(c, &rec[r], &p);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_TRUE(st[1].ok()) << st[1];
  return {rec[0].epochs, rec[1].epochs};
}

// Rank 0's observer when rank 1 goes away: regroups into a new in-process
// communicator that a replacement rank 1 (JobConfig::join) meets.
class Regrouper : public JobObserver, public Membership {
 public:
  explicit Regrouper(collective::Store* store) : store_(store) {}
  absl::StatusOr<MembershipTransports> Regroup(const absl::Status& failure) override {
    ++regroups;
    collective::CommunicatorOptions co;
    co.transport = collective::TransportKind::kInProcess;
    co.key_prefix = "gen1";
    auto comm = collective::Communicator::Create(0, 2, store_, co);
    if (!comm.ok()) return comm.status();
    comm_ = *std::move(comm);
    MembershipTransports t;
    t.communicator = comm_.get();
    return t;
  }
  void OnEpoch(const JobProgress& p) override { epochs.push_back(p); }
  int regroups = 0;
  std::vector<JobProgress> epochs;

 private:
  collective::Store* store_;
  std::unique_ptr<collective::Communicator> comm_;
};

class StopAfter : public JobObserver, public JobControl {
 public:
  explicit StopAfter(int steps) : stop_after_(steps) {}
  void OnStep(const JobProgress& p, const StepTimes& t) override { ++steps_; }
  bool StopRequested() override { return steps_ >= stop_after_; }

 private:
  int stop_after_;
  int steps_ = 0;
};

// Rank 1 stops in epoch 1 (its communicator closes, as when its process is
// killed); rank 0 regroups with a replacement that takes the state and the
// data position from it. Rank 0's per-epoch progress.
std::vector<JobProgress> TrainTwoRanksWithALostRank(const data::DataConfig& d) {
  collective::InMemoryStore store;
  Regrouper regrouper(&store);
  absl::Status st[3];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      collective::CommunicatorOptions co;
      co.transport = collective::TransportKind::kInProcess;
      JobConfig c = TwoRankLenet("formats-recovery", d, r);
      JobProgress p;
      {
        auto comm = collective::Communicator::Create(r, 2, &store, co);
        if (!comm.ok()) {
          st[r] = comm.status();
          return;
        }
        c.communicator = comm->get();
        StopAfter stop(r == 1 ? 5 : 1 << 30);  // epoch 1, step 6
        st[r] = RunJob(c, r == 0 ? JobHooks(&regrouper) : JobHooks(&stop), &p);
      }
      if (r == 0) return;
      co.key_prefix = "gen1";
      auto comm = collective::Communicator::Create(1, 2, &store, co);
      if (!comm.ok()) {
        st[2] = comm.status();
        return;
      }
      c.communicator = comm->get();
      c.join = true;
      JobProgress joined;
      st[2] = RunJob(c, nullptr, &joined);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_TRUE(absl::IsCancelled(st[1])) << st[1];
  EXPECT_TRUE(st[2].ok()) << st[2];
  EXPECT_EQ(regrouper.regroups, 1);
  return regrouper.epochs;
}

TEST(DataFormatsTest, WebDatasetAndNpyTrainExactlyAsIdx) {
  absl::StatusOr<data::Dataset> train =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTrain);
  absl::StatusOr<data::Dataset> test =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTest);
  ASSERT_TRUE(train.ok() && test.ok()) << train.status() << test.status();
  const data::Dataset train_part = data::Subset(*train, kTrain);
  const data::Dataset test_part = data::Subset(*test, kTest);

  const std::string wds = TmpDir("wds");
  ASSERT_TRUE(data::WriteWebDataset(train_part, wds, "train", {.shard_size = 500}).ok());
  ASSERT_TRUE(data::WriteWebDataset(test_part, wds, "test", {.shard_size = 500}).ok());
  ASSERT_TRUE(data::WriteNpyDataset(train_part, TmpDir("npy-train")).ok());
  ASSERT_TRUE(data::WriteNpyDataset(test_part, TmpDir("npy-test")).ok());

  data::DataConfig w;
  w.format = "webdataset";
  w.train = data::BraceLocation(wds, "train", 5);
  w.test = data::BraceLocation(wds, "test", 1);
  w.channels = 1;
  w.height = w.width = 28;
  w.num_classes = 10;
  w.data_threads = 2;
  data::DataConfig n = w;
  n.format = "npy";
  n.train = TmpDir("npy-train");
  n.test = TmpDir("npy-test");

  const auto idx_run = TrainTwoRanks(data::DataConfig{});
  const auto wds_run = TrainTwoRanks(w);
  const auto npy_run = TrainTwoRanks(n);
  for (const auto* run : {&wds_run, &npy_run}) {
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ((*run)[r].size(), 2u);
      ASSERT_EQ(idx_run[r].size(), 2u);
      for (int e = 0; e < 2; ++e) {
        const JobProgress& want = idx_run[r][e];
        const JobProgress& got = (*run)[r][e];
        EXPECT_TRUE(SameBits(got.loss, want.loss))
            << "rank " << r << " epoch " << e + 1 << ": " << got.loss << " vs " << want.loss;
        EXPECT_TRUE(SameBits(got.train_accuracy, want.train_accuracy));
        EXPECT_TRUE(SameBits(got.test_accuracy, want.test_accuracy));
      }
    }
  }
  // Rank 0 reports the dataset's sizes (trainctl get shows them).
  EXPECT_EQ(wds_run[0][0].data_train_samples, kTrain);
  EXPECT_EQ(wds_run[0][0].data_test_samples, kTest);
  EXPECT_EQ(wds_run[0][0].data_corrupt_skipped, 0);
  // It learned something (so equality is not of two broken runs).
  EXPECT_LT(idx_run[0][1].loss, idx_run[0][0].loss);
  EXPECT_GT(idx_run[0][1].test_accuracy, 0.6);
}

TEST(DataFormatsTest, AfterALostRankIsReplacedInPlaceWebDatasetStillTrainsExactlyAsIdx) {
  absl::StatusOr<data::Dataset> train =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTrain);
  absl::StatusOr<data::Dataset> test =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTest);
  ASSERT_TRUE(train.ok() && test.ok()) << train.status() << test.status();
  const std::string wds = TmpDir("wds-recovery");
  ASSERT_TRUE(
      data::WriteWebDataset(data::Subset(*train, kTrain), wds, "train", {.shard_size = 1024}).ok());
  ASSERT_TRUE(
      data::WriteWebDataset(data::Subset(*test, kTest), wds, "test", {.shard_size = 1024}).ok());
  data::DataConfig w;
  w.format = "webdataset";
  w.train = data::BraceLocation(wds, "train", 2);
  w.test = data::BraceLocation(wds, "test", 1);
  w.channels = 1;
  w.height = w.width = 28;
  w.num_classes = 10;
  const std::vector<JobProgress> idx_run = TrainTwoRanksWithALostRank(data::DataConfig{});
  const std::vector<JobProgress> wds_run = TrainTwoRanksWithALostRank(w);
  ASSERT_EQ(idx_run.size(), 2u);
  ASSERT_EQ(wds_run.size(), 2u);
  for (int e = 0; e < 2; ++e) {
    EXPECT_TRUE(SameBits(wds_run[e].loss, idx_run[e].loss))
        << "epoch " << e + 1 << ": " << wds_run[e].loss << " vs " << idx_run[e].loss;
    EXPECT_TRUE(SameBits(wds_run[e].test_accuracy, idx_run[e].test_accuracy));
  }
  EXPECT_GT(idx_run[1].test_accuracy, 0.6);
}

}  // namespace
}  // namespace train
}  // namespace dtrain

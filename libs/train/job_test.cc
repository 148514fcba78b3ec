#include "libs/train/job.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "libs/collective/store.h"

namespace dtrain {
namespace train {
namespace {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string p = std::string(dir ? dir : "/tmp") + "/" + name;
  std::remove(p.c_str());
  return p;
}

// A small real job: MLP on 2,048 Fashion-MNIST images, momentum (so a
// checkpoint must carry the momentum buffers to resume exactly).
JobConfig SmallJob(int epochs) {
  JobConfig c;
  c.name = "test";
  c.model = "mlp";
  c.epochs = epochs;
  c.global_batch_size = 128;
  c.sgd = {.lr = 0.05f, .momentum = 0.9f};
  c.init = "kaiming";
  c.seed = 3;
  c.threads = 1;
  c.train_limit = 2048;
  c.test_limit = 1000;
  return c;
}

class Recorder : public JobObserver {
 public:
  void OnStep(const JobProgress& p, const StepTimes& t) override {
    ++steps;
    EXPECT_GE(t.compute, 0);
    EXPECT_GE(t.data_wait, 0);
  }
  void OnEpoch(const JobProgress& p) override { epochs.push_back(p); }
  bool StopRequested() override { return stop_after >= 0 && steps >= stop_after; }
  bool DrainRequested(int64_t steps_done) override {
    EXPECT_EQ(steps_done, steps);
    return drain_after >= 0 && steps_done >= drain_after;
  }

  int steps = 0;
  int stop_after = -1;
  int drain_after = -1;
  std::vector<JobProgress> epochs;
};

TEST(JobTest, TrainsReportsAndCheckpoints) {
  JobConfig c = SmallJob(2);
  c.checkpoint_interval_epochs = 1;
  c.checkpoint_path = TmpPath("job.ckpt");
  Recorder r;
  JobProgress p;
  ASSERT_TRUE(RunJob(c, &r, &p).ok());
  EXPECT_EQ(p.steps_per_epoch, 16);
  EXPECT_EQ(r.steps, 32);
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_EQ(r.epochs[0].epoch, 1);
  EXPECT_EQ(p.epoch, 2);
  EXPECT_GT(p.test_accuracy, 0.6);
  EXPECT_GT(p.train_accuracy, 0.5);
  EXPECT_LT(p.loss, r.epochs[0].loss);
  EXPECT_GT(p.epoch_seconds, 0);
  EXPECT_EQ(p.checkpoint_path, c.checkpoint_path);
  EXPECT_EQ(p.checkpoint_epoch, 2);
}

// The checkpoint of epoch 1, resumed, ends exactly where the undisturbed
// 3-epoch job does: same data order from epoch 2 on, same parameters and
// momentum.
TEST(JobTest, ResumedJobEndsWhereTheUndisturbedOneDoes) {
  JobProgress undisturbed;
  ASSERT_TRUE(RunJob(SmallJob(3), nullptr, &undisturbed).ok());

  JobConfig first = SmallJob(1);
  first.checkpoint_interval_epochs = 1;
  first.checkpoint_path = TmpPath("epoch1.ckpt");
  JobProgress p1;
  ASSERT_TRUE(RunJob(first, nullptr, &p1).ok());

  JobConfig resumed = SmallJob(3);
  resumed.resume_from = first.checkpoint_path;
  resumed.seed = 3;
  Recorder r;
  JobProgress p;
  ASSERT_TRUE(RunJob(resumed, &r, &p).ok());
  EXPECT_EQ(r.epochs.size(), 2u);  // epochs 2 and 3 only
  EXPECT_EQ(r.steps, 32);
  EXPECT_EQ(p.epoch, 3);
  EXPECT_DOUBLE_EQ(p.loss, undisturbed.loss);
  EXPECT_DOUBLE_EQ(p.test_accuracy, undisturbed.test_accuracy);

  // Resuming from the final epoch's checkpoint trains nothing and still
  // evaluates; a corrupt checkpoint is an error naming the file.
  JobConfig done = SmallJob(1);
  done.resume_from = first.checkpoint_path;
  Recorder none;
  JobProgress pd;
  ASSERT_TRUE(RunJob(done, &none, &pd).ok());
  EXPECT_EQ(none.steps, 0);
  EXPECT_GT(pd.test_accuracy, 0.5);
  const std::string bad = TmpPath("bad.ckpt");
  FILE* f = std::fopen(bad.c_str(), "w");
  std::fputs("not a checkpoint", f);
  std::fclose(f);
  JobConfig corrupt = SmallJob(2);
  corrupt.resume_from = bad;
  absl::Status s = RunJob(corrupt, nullptr, &pd);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(bad), std::string::npos) << s;
}

// Drained at epoch 2 step 5 (21 steps in) and resumed from the drain's
// checkpoint: the rest of epoch 2 and epoch 3 only, ending exactly where the
// undisturbed job does (loss of every epoch included).
TEST(JobTest, DrainedJobResumesAtTheStepItStoppedAt) {
  Recorder undisturbed_r;
  JobProgress undisturbed;
  ASSERT_TRUE(RunJob(SmallJob(3), &undisturbed_r, &undisturbed).ok());
  ASSERT_EQ(undisturbed_r.epochs.size(), 3u);

  JobConfig first = SmallJob(3);
  first.checkpoint_interval_epochs = 1;
  first.checkpoint_path = TmpPath("drain.ckpt");
  Recorder r1;
  r1.drain_after = 21;
  JobProgress p1;
  absl::Status s = RunJob(first, &r1, &p1);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_NE(s.message().find("drained at epoch 2 step 5"), std::string::npos) << s;
  EXPECT_TRUE(p1.drained);
  EXPECT_EQ(r1.steps, 21);
  EXPECT_EQ(p1.checkpoint_path, first.checkpoint_path);
  EXPECT_EQ(p1.checkpoint_epoch, 1);
  EXPECT_EQ(p1.checkpoint_step, 5);

  JobConfig resumed = SmallJob(3);
  resumed.resume_from = first.checkpoint_path;
  Recorder r2;
  JobProgress p2;
  ASSERT_TRUE(RunJob(resumed, &r2, &p2).ok());
  EXPECT_EQ(r2.steps, 48 - 21);  // nothing lost, nothing repeated
  ASSERT_EQ(r2.epochs.size(), 2u);
  EXPECT_DOUBLE_EQ(r2.epochs[0].loss, undisturbed_r.epochs[1].loss);
  EXPECT_DOUBLE_EQ(r2.epochs[0].train_accuracy, undisturbed_r.epochs[1].train_accuracy);
  EXPECT_DOUBLE_EQ(p2.loss, undisturbed.loss);
  EXPECT_DOUBLE_EQ(p2.test_accuracy, undisturbed.test_accuracy);

  // A missing partial statistics file is an error naming it.
  JobProgress p3;
  ASSERT_EQ(std::remove((first.checkpoint_path + ".rank0.partial").c_str()), 0);
  s = RunJob(resumed, nullptr, &p3);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(first.checkpoint_path + ".rank0.partial"), std::string::npos) << s;
}

TEST(JobTest, StopsWhenAskedAndRejectsBadConfigs) {
  Recorder r;
  r.stop_after = 3;
  JobProgress p;
  EXPECT_EQ(RunJob(SmallJob(2), &r, &p).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(p.step, 3);

  JobConfig c = SmallJob(1);
  c.rank = 2;
  c.world_size = 2;
  EXPECT_NE(RunJob(c, nullptr, &p).message().find("rank:"), std::string::npos);
  c = SmallJob(1);
  c.world_size = 2;  // no communicator
  EXPECT_NE(RunJob(c, nullptr, &p).message().find("communicator:"), std::string::npos);
  c = SmallJob(1);
  c.hybridize = true;
  c.devices = {Device::Cpu(0), Device::Cpu(1)};
  EXPECT_NE(RunJob(c, nullptr, &p).message().find("hybridize:"), std::string::npos);
  c = SmallJob(1);
  c.checkpoint_interval_epochs = 1;
  EXPECT_NE(RunJob(c, nullptr, &p).message().find("checkpoint_path:"), std::string::npos);
  c = SmallJob(1);
  c.data_dir = "/nonexistent/fashion";
  absl::Status s = RunJob(c, nullptr, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/fashion"), std::string::npos) << s;
}

// Two ranks (threads) with an in-process communicator: both report the same
// epoch loss (the mean over both shards), rank 0 evaluates.
TEST(JobTest, TwoRanksAverageTheirEpochLoss) {
  collective::InMemoryStore store;
  JobProgress p[2];
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
      JobConfig c = SmallJob(1);
      c.rank = r;
      c.world_size = 2;
      c.communicator = comm->get();
      st[r] = RunJob(c, nullptr, &p[r]);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
  EXPECT_EQ(p[0].loss, p[1].loss);
  EXPECT_EQ(p[0].train_accuracy, p[1].train_accuracy);
  EXPECT_GT(p[0].test_accuracy, 0.5);
  EXPECT_EQ(p[1].test_accuracy, -1);  // only rank 0 evaluates
}

}  // namespace
}  // namespace train
}  // namespace dtrain

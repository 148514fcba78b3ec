#include "libs/train/job.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/collective/store.h"
#include "libs/kvstore/in_process.h"

namespace dtrain {
namespace train {
namespace {

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

class Recorder : public JobObserver, public JobControl {
 public:
  void OnStep(const JobProgress& p, const StepTimes& t) override {
    ++steps;
    EXPECT_GE(t.compute, 0);
    EXPECT_GE(t.data_wait, 0);
    // The phases cut the step into contiguous spans (step_phases.h), and
    // every bucket's reduction lies inside the step.
    const StepPhases& ph = t.phases;
    EXPECT_GT(ph.step.start_ns, 0);
    EXPECT_EQ(ph.phase[0].start_ns, ph.step.start_ns);
    for (int i = 1; i < kNumStepPhases; ++i) {
      EXPECT_EQ(ph.phase[i].start_ns, ph.phase[i - 1].end_ns) << StepPhaseName(StepPhase(i));
      EXPECT_GE(ph.phase[i].end_ns, ph.phase[i].start_ns) << StepPhaseName(StepPhase(i));
    }
    EXPECT_EQ(ph.phase[kNumStepPhases - 1].end_ns, ph.step.end_ns);
    EXPECT_GT(ph.seconds(StepPhase::kForwardBackward), 0);
    EXPECT_FALSE(ph.bucket_reductions.empty());
    EXPECT_GT(t.samples, 0);
    for (const PhaseSpan& b : ph.bucket_reductions) {
      EXPECT_GE(b.start_ns, ph.span(StepPhase::kForwardBackward).start_ns);
      EXPECT_LE(b.end_ns, ph.span(StepPhase::kCommWait).end_ns);
    }
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
  c.checkpoint_path = FreshTestPath("job.ckpt");
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
  first.checkpoint_path = FreshTestPath("epoch1.ckpt");
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
  const std::string bad = FreshTestPath("bad.ckpt");
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
  first.checkpoint_path = FreshTestPath("drain.ckpt");
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

// The run that completes a drained job (with the job's checkpoint path, as
// the agent runs every attempt) removes the drain's partial statistics; the
// checkpoint and files of other checkpoints stay.
TEST(JobTest, CompletingADrainedJobRemovesItsPartialStatistics) {
  JobConfig first = SmallJob(2);
  first.checkpoint_interval_epochs = 1;
  first.checkpoint_path = FreshTestPath("cleanup.ckpt");
  Recorder r1;
  r1.drain_after = 21;
  JobProgress p1;
  ASSERT_EQ(RunJob(first, &r1, &p1).code(), absl::StatusCode::kCancelled);
  const std::string partial = first.checkpoint_path + ".rank0.partial";
  ASSERT_TRUE(std::filesystem::exists(partial));
  // A stale temporary of this job's, and another job's partial file.
  const std::string tmp = first.checkpoint_path + ".rank1.partial.tmp";
  const std::string other = FreshTestPath("cleanup.ckpt2.rank0.partial");
  std::ofstream(tmp) << "0 0 0 0 0\n";
  std::ofstream(other) << "0 0 0 0 0\n";

  JobConfig resumed = first;
  resumed.resume_from = first.checkpoint_path;
  Recorder r2;
  JobProgress p2;
  ASSERT_TRUE(RunJob(resumed, &r2, &p2).ok());
  EXPECT_EQ(r2.steps, 32 - 21);
  EXPECT_FALSE(std::filesystem::exists(partial));
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_TRUE(std::filesystem::exists(first.checkpoint_path));
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

// Recovery in place with two ranks (threads, in-process communicators):
// rank 1 goes away at step 12 of epoch 1 (its communicator closes); rank
// 0's step fails, its observer regroups into a new communicator that a
// replacement rank 1 (JobConfig::join) meets; rank 0 sends its state and
// data position and both finish. Epoch 2 is the undisturbed run's exactly.
class Regrouper : public JobObserver, public Membership {
 public:
  explicit Regrouper(collective::Store* store) : store_(store) {}
  absl::StatusOr<MembershipTransports> Regroup(const absl::Status& failure) override {
    ++regroups;
    failure_code = failure.code();
    collective::CommunicatorOptions co;
    co.transport = collective::TransportKind::kInProcess;
    co.key_prefix = "gen1";
    auto comm = collective::Communicator::Create(0, 2, store_, co);
    if (!comm.ok()) return comm.status();
    comm_ = *std::move(comm);
    return MembershipTransports{comm_.get()};
  }
  void OnRecovered(double seconds, int64_t steps_lost) override {
    recovered_seconds = seconds;
    lost = steps_lost;
  }
  void OnEpoch(const JobProgress& p) override { epochs.push_back(p); }

  int regroups = 0;
  absl::StatusCode failure_code = absl::StatusCode::kOk;
  double recovered_seconds = -1;
  int64_t lost = -1;
  std::vector<JobProgress> epochs;

 private:
  collective::Store* store_;
  std::unique_ptr<collective::Communicator> comm_;
};

// Records the step counts DrainRequested sees.
class DrainPolls : public JobControl {
 public:
  bool DrainRequested(int64_t steps_done) override {
    polls.push_back(steps_done);
    return false;
  }
  std::vector<int64_t> polls;
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

TEST(JobTest, LostRankIsReplacedInPlaceAndTheJobEndsLikeTheUndisturbedOne) {
  DrainPolls joiner_polls;
  JobProgress first_epochs[2];  // epoch 1, undisturbed and disturbed
  auto run_two = [&joiner_polls, &first_epochs](bool disturbed, JobProgress* p,
                                                Regrouper** observer_out,
                                                JobProgress* joiner_progress) {
    collective::InMemoryStore store;
    absl::Status st[3];
    Regrouper regrouper(&store);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        collective::CommunicatorOptions co;
        co.transport = collective::TransportKind::kInProcess;
        JobConfig c = SmallJob(2);  // 16 steps an epoch
        c.rank = r;
        c.world_size = 2;
        {
          auto comm = collective::Communicator::Create(r, 2, &store, co);
          ASSERT_TRUE(comm.ok()) << comm.status();
          c.communicator = comm->get();
          StopAfter stop(disturbed && r == 1 ? 11 : 1 << 30);  // in epoch 1 step 12
          st[r] = RunJob(c, r == 0 ? JobHooks(&regrouper) : JobHooks(&stop), &p[r]);
        }  // rank 1's communicator closes: rank 0's step fails
        if (!disturbed || r == 0) return;
        co.key_prefix = "gen1";
        auto comm = collective::Communicator::Create(1, 2, &store, co);
        ASSERT_TRUE(comm.ok()) << comm.status();
        c.communicator = comm->get();
        c.join = true;
        st[2] = RunJob(c, &joiner_polls, joiner_progress);
      });
    }
    for (auto& t : ranks) t.join();
    EXPECT_TRUE(st[0].ok()) << st[0];
    if (disturbed) {
      EXPECT_TRUE(absl::IsCancelled(st[1])) << st[1];
      EXPECT_TRUE(st[2].ok()) << st[2];
      EXPECT_EQ(regrouper.regroups, 1);
      EXPECT_TRUE(regrouper.failure_code == absl::StatusCode::kUnavailable ||
                  regrouper.failure_code == absl::StatusCode::kAborted)
          << absl::StatusCodeToString(regrouper.failure_code);
      EXPECT_EQ(regrouper.lost, 1);  // the failed step
      EXPECT_GT(regrouper.recovered_seconds, 0);
    } else {
      EXPECT_TRUE(st[1].ok()) << st[1];
      EXPECT_EQ(regrouper.regroups, 0);
    }
    EXPECT_EQ(regrouper.epochs.size(), 2u);
    if (!regrouper.epochs.empty()) first_epochs[disturbed] = regrouper.epochs[0];
    return regrouper.epochs.size() == 2u ? regrouper.epochs[1] : JobProgress();
  };
  JobProgress ref[2], got[2], joiner;
  const JobProgress ref_last = run_two(false, ref, nullptr, nullptr);
  const JobProgress got_last = run_two(true, got, nullptr, &joiner);
  EXPECT_EQ(got[0].epoch, 2);
  EXPECT_EQ(joiner.epoch, 2);
  // The joiner counts steps from the root's count (11 done when rank 0's
  // 12th step failed), so both ranks would agree on a drain step.
  ASSERT_FALSE(joiner_polls.polls.empty());
  EXPECT_EQ(joiner_polls.polls.front(), 11);
  EXPECT_EQ(joiner_polls.polls.back(), 31);  // the last step of epoch 2 is the 32nd
  // The replacement averaged the same epoch-2 statistics as rank 0.
  EXPECT_EQ(joiner.loss, got[0].loss);
  // Epoch 1's statistics are the undisturbed run's bit for bit: every step
  // summed them over both ranks, so rank 0's running sums hold the lost
  // rank's share of its 11 steps, and the replacement received them.
  EXPECT_EQ(first_epochs[1].epoch, 1);
  EXPECT_EQ(first_epochs[1].loss, first_epochs[0].loss);
  EXPECT_EQ(first_epochs[1].train_accuracy, first_epochs[0].train_accuracy);
  EXPECT_EQ(first_epochs[1].test_accuracy, first_epochs[0].test_accuracy);
  // Epoch 2 after the recovery is the undisturbed epoch 2: same state, same
  // data (two ranks: the allreduce's sums do not depend on the order).
  EXPECT_EQ(got_last.loss, ref_last.loss);
  EXPECT_NEAR(got_last.test_accuracy, ref_last.test_accuracy, 0.002);
  EXPECT_GT(ref_last.test_accuracy, 0.5);
}

// A bounded-delay KVSTORE job (the kvstore holds the weights): rank 1 of 2
// stops after 11 steps of epoch 1 and rank 0 trains on until the bound
// holds it back; a replacement (JobConfig::join, no communicator) connects
// as kvstore worker 1, continues that worker's rounds at step 12 (its first
// DrainRequested sees 11 steps done) and reports one step lost; both ranks
// finish both epochs.
class Joiner : public JobObserver, public JobControl {
 public:
  bool DrainRequested(int64_t steps_done) override {
    polls.push_back(steps_done);
    return false;
  }
  void OnRecovered(double seconds, int64_t steps_lost) override {
    ++recoveries;
    recovered_seconds = seconds;
    lost = steps_lost;
  }
  std::vector<int64_t> polls;
  int recoveries = 0;
  double recovered_seconds = -1;
  int64_t lost = -1;
};

TEST(JobTest, KvstoreWorkerWithKvstoreHeldWeightsIsReplacedAndContinuesItsRounds) {
  kvstore::InProcessOptions ko;
  ko.num_shards = 1;
  auto kv = kvstore::InProcessKVStore::Create(ko);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto config = [](int rank, kvstore::ParameterServer* ps) {
    JobConfig c = SmallJob(2);  // 16 steps an epoch
    c.rank = rank;
    c.world_size = 2;
    c.kvstore = ps;
    c.kvstore_consistency = kvstore::Consistency::kBoundedDelay;
    c.kvstore_max_staleness = 2;
    return c;
  };
  absl::Status st[3];
  JobProgress p[3];
  Recorder survivor;
  Joiner joiner;
  std::thread rank0([&] {
    auto ps = (*kv)->Connect("kvw", 0);
    ASSERT_TRUE(ps.ok()) << ps.status();
    st[0] = RunJob(config(0, ps->get()), &survivor, &p[0]);
  });
  {
    auto ps = (*kv)->Connect("kvw", 1);
    ASSERT_TRUE(ps.ok()) << ps.status();
    StopAfter stop(11);
    st[1] = RunJob(config(1, ps->get()), &stop, &p[1]);
  }
  {
    auto ps = (*kv)->Connect("kvw", 1);
    ASSERT_TRUE(ps.ok()) << ps.status();
    JobConfig c = config(1, ps->get());
    c.join = true;
    st[2] = RunJob(c, &joiner, &p[2]);
  }
  rank0.join();
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_TRUE(absl::IsCancelled(st[1])) << st[1];
  ASSERT_TRUE(st[2].ok()) << st[2];
  // The survivor never stopped: all 32 steps, two epochs.
  EXPECT_EQ(survivor.steps, 32);
  EXPECT_EQ(p[0].epoch, 2);
  // The replacement did the lost worker's remaining 21 steps.
  ASSERT_EQ(joiner.polls.size(), 21u);
  EXPECT_EQ(joiner.polls.front(), 11);
  EXPECT_EQ(joiner.polls.back(), 31);
  EXPECT_EQ(p[2].epoch, 2);
  EXPECT_EQ(joiner.recoveries, 1);
  EXPECT_EQ(joiner.lost, 1);
  EXPECT_GT(joiner.recovered_seconds, 0);
  // Asynchronous pushes interleave as the two threads are scheduled: under
  // a loaded machine the weights go staler (0.42 measured once, 0.5-0.7
  // usually). Well above chance (0.1) shows the job kept learning.
  EXPECT_GT(p[0].test_accuracy, 0.3);
}

// A communicator that goes away in the epoch's statistics round (its first
// synchronous allreduce of 3 floats): it closes the real one (so the peers'
// round fails) and fails that call.
class DiesInStatistics : public collective::Communicator {
 public:
  explicit DiesInStatistics(std::unique_ptr<collective::Communicator> inner)
      : inner_(std::move(inner)),
        options_(inner_->options()),
        rank_(inner_->rank()),
        size_(inner_->size()) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const collective::CommunicatorOptions& options() const override { return options_; }
  const char* transport_name() const override { return "dies-in-statistics"; }
  absl::Status health() const override {
    return inner_ != nullptr ? inner_->health() : absl::UnavailableError("gone");
  }
  collective::Algorithm AllreduceAlgorithmFor(size_t bytes) const override {
    return collective::Algorithm::kAuto;
  }

 private:
  absl::Status DoAllreduce(void* data, size_t count, DType dtype, collective::ReduceOp op,
                           absl::Duration timeout) override {
    if (count == 3 && inner_ != nullptr) {
      inner_.reset();
      return absl::UnavailableError("this rank went away in the statistics round");
    }
    return Inner()->Allreduce(data, count, dtype, op, timeout);
  }
  absl::Status DoReduceScatter(const void* input, void* output, size_t output_count, DType dtype,
                               collective::ReduceOp op, absl::Duration timeout) override {
    return Inner()->ReduceScatter(input, output, output_count, dtype, op, timeout);
  }
  absl::Status DoAllgather(const void* input, void* output, size_t input_count, DType dtype,
                           absl::Duration timeout) override {
    return Inner()->Allgather(input, output, input_count, dtype, timeout);
  }
  absl::Status DoBroadcast(void* data, size_t count, DType dtype, int root,
                           absl::Duration timeout) override {
    return Inner()->Broadcast(data, count, dtype, root, timeout);
  }
  absl::Status DoBarrier(absl::Duration timeout) override { return Inner()->Barrier(timeout); }
  std::shared_ptr<collective::Work> DoAllreduceAsync(void* data, size_t count, DType dtype,
                                                     collective::ReduceOp op,
                                                     absl::Duration timeout) override {
    return Inner()->AllreduceAsync(data, count, dtype, op, timeout);
  }
  std::shared_ptr<collective::Work> DoReduceScatterAsync(const void* input, void* output,
                                                         size_t output_count, DType dtype,
                                                         collective::ReduceOp op,
                                                         absl::Duration timeout) override {
    return Inner()->ReduceScatterAsync(input, output, output_count, dtype, op, timeout);
  }
  std::shared_ptr<collective::Work> DoAllgatherAsync(const void* input, void* output,
                                                     size_t input_count, DType dtype,
                                                     absl::Duration timeout) override {
    return Inner()->AllgatherAsync(input, output, input_count, dtype, timeout);
  }
  std::shared_ptr<collective::Work> DoBroadcastAsync(void* data, size_t count, DType dtype,
                                                     int root, absl::Duration timeout) override {
    return Inner()->BroadcastAsync(data, count, dtype, root, timeout);
  }
  std::shared_ptr<collective::Work> DoBarrierAsync(absl::Duration timeout) override {
    return Inner()->BarrierAsync(timeout);
  }
  collective::Communicator* Inner() {
    EXPECT_NE(inner_, nullptr) << "used after it went away";
    return inner_.get();
  }

  std::unique_ptr<collective::Communicator> inner_;
  const collective::CommunicatorOptions options_;
  const int rank_, size_;
};

// A peer lost in the epoch's statistics round (after the epoch's last
// step): rank 0's round fails, it regroups with a replacement as after a
// failed step, with no step lost (both hold the epoch's end), the new
// membership meets for epoch 1's statistics, and epoch 2 is the
// undisturbed run's exactly.
TEST(JobTest, PeerLostInTheStatisticsRoundIsReplacedInPlaceWithNoStepLost) {
  auto run_two = [](bool disturbed, Regrouper* regrouper, JobProgress* joiner_progress,
                    collective::Store* store) {
    absl::Status st[3];
    JobProgress p[2];
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        collective::CommunicatorOptions co;
        co.transport = collective::TransportKind::kInProcess;
        JobConfig c = SmallJob(2);  // 16 steps an epoch
        c.rank = r;
        c.world_size = 2;
        {
          auto comm = collective::Communicator::Create(r, 2, store, co);
          ASSERT_TRUE(comm.ok()) << comm.status();
          std::unique_ptr<collective::Communicator> used = *std::move(comm);
          if (disturbed && r == 1) used = std::make_unique<DiesInStatistics>(std::move(used));
          c.communicator = used.get();
          JobObserver none;
          st[r] = RunJob(c, r == 0 ? JobHooks(regrouper) : JobHooks(&none), &p[r]);
        }
        if (!disturbed || r == 0) return;
        co.key_prefix = "gen1";
        auto comm = collective::Communicator::Create(1, 2, store, co);
        ASSERT_TRUE(comm.ok()) << comm.status();
        c.communicator = comm->get();
        c.join = true;
        st[2] = RunJob(c, nullptr, joiner_progress);
      });
    }
    for (auto& t : ranks) t.join();
    EXPECT_TRUE(st[0].ok()) << st[0];
    if (disturbed) {
      EXPECT_TRUE(absl::IsUnavailable(st[1])) << st[1];
      EXPECT_TRUE(st[2].ok()) << st[2];
    } else {
      EXPECT_TRUE(st[1].ok()) << st[1];
    }
  };
  collective::InMemoryStore ref_store, store;
  Regrouper ref(&ref_store), got(&store);
  JobProgress joiner;
  run_two(false, &ref, nullptr, &ref_store);
  run_two(true, &got, &joiner, &store);
  EXPECT_EQ(ref.regroups, 0);
  EXPECT_EQ(got.regroups, 1);
  EXPECT_TRUE(got.failure_code == absl::StatusCode::kUnavailable ||
              got.failure_code == absl::StatusCode::kAborted)
      << absl::StatusCodeToString(got.failure_code);
  EXPECT_EQ(got.lost, 0);  // every survivor had finished the epoch's steps
  EXPECT_GT(got.recovered_seconds, 0);
  EXPECT_EQ(joiner.epoch, 2);
  ASSERT_EQ(ref.epochs.size(), 2u);
  ASSERT_EQ(got.epochs.size(), 2u);
  // Every step's statistics were summed over the ranks: both epochs' are
  // the undisturbed run's bit for bit.
  for (int e = 0; e < 2; ++e) {
    EXPECT_EQ(got.epochs[e].loss, ref.epochs[e].loss) << "epoch " << e + 1;
    EXPECT_EQ(got.epochs[e].train_accuracy, ref.epochs[e].train_accuracy) << "epoch " << e + 1;
  }
  EXPECT_NEAR(got.epochs[1].test_accuracy, ref.epochs[1].test_accuracy, 0.002);
}

// Elastic: rank 1 of 2 goes away at step 12 of epoch 1 and rank 0 goes on
// alone (a one-rank membership, same per-rank batch: 32 steps an epoch, the
// epoch resumed at step 22, the same share of its samples); after 30 steps
// RegroupRequested asks for a larger membership and a new rank 1 joins at
// that step boundary (epoch 2 step 9 of 32 alone: step 4 of 16 with two).
class Elastic : public JobObserver, public JobControl, public Membership {
 public:
  explicit Elastic(collective::Store* store) : store_(store) {}
  absl::StatusOr<MembershipTransports> Regroup(const absl::Status& failure) override {
    failures.push_back(failure.code());
    collective::CommunicatorOptions co;
    co.transport = collective::TransportKind::kInProcess;
    const int world = failure.ok() ? 2 : 1;  // grow to 2, or shrink to 1
    co.key_prefix = absl::StrCat("gen", failures.size());
    auto comm = collective::Communicator::Create(0, world, store_, co);
    if (!comm.ok()) return comm.status();
    comms_.push_back(*std::move(comm));
    return MembershipTransports{comms_.back().get()};
  }
  bool RegroupRequested(int64_t steps_done) override {
    if (failures.size() != 1 || steps_done != 30) return false;
    return true;
  }
  void OnRecovered(double seconds, int64_t steps_lost) override { lost.push_back(steps_lost); }
  void OnStep(const JobProgress& p, const StepTimes& t) override {
    if (failures.size() == 1 && steps_at_world1 == 0) first_step_alone = p.step;
    if (failures.size() == 1) ++steps_at_world1;
    steps_per_epoch.push_back(p.steps_per_epoch);
  }
  void OnEpoch(const JobProgress& p) override { epochs.push_back(p); }

  std::vector<absl::StatusCode> failures;
  std::vector<int64_t> lost;
  std::vector<int64_t> steps_per_epoch;
  std::vector<JobProgress> epochs;
  int64_t first_step_alone = -1;
  int steps_at_world1 = 0;

 private:
  collective::Store* store_;
  std::vector<std::unique_ptr<collective::Communicator>> comms_;
};

TEST(JobTest, ElasticJobShrinksToItsSurvivorAndGrowsAtAStepBoundary) {
  collective::InMemoryStore store;
  Elastic elastic(&store);
  absl::Status st[3];
  JobProgress p[3];
  struct : JobObserver {
    void OnStep(const JobProgress& p, const StepTimes& t) override { ++steps; }
    int steps = 0;
  } joiner_steps;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      collective::CommunicatorOptions co;
      co.transport = collective::TransportKind::kInProcess;
      JobConfig c = SmallJob(2);
      c.rank = r;
      c.world_size = 2;
      c.local_batch_size = 64;  // an elastic job's: 2 ranks x 64
      {
        auto comm = collective::Communicator::Create(r, 2, &store, co);
        ASSERT_TRUE(comm.ok()) << comm.status();
        c.communicator = comm->get();
        StopAfter stop(r == 1 ? 11 : 1 << 30);
        st[r] = RunJob(c, r == 0 ? JobHooks(&elastic) : JobHooks(&stop), &p[r]);
      }
      if (r == 0) return;
      // A new rank 1 of 2 (generation 2), waiting until rank 0 meets it.
      co.key_prefix = "gen2";
      auto comm = collective::Communicator::Create(1, 2, &store, co);
      ASSERT_TRUE(comm.ok()) << comm.status();
      c.communicator = comm->get();
      c.join = true;
      st[2] = RunJob(c, &joiner_steps, &p[2]);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(st[0].ok()) << st[0];
  EXPECT_TRUE(absl::IsCancelled(st[1])) << st[1];
  ASSERT_TRUE(st[2].ok()) << st[2];
  // A failure (the shrink), then a regroup without one (the grow).
  ASSERT_EQ(elastic.failures.size(), 2u);
  EXPECT_NE(elastic.failures[0], absl::StatusCode::kOk);
  EXPECT_EQ(elastic.failures[1], absl::StatusCode::kOk);
  // The shrink lost the failed step; the grow lost nothing.
  EXPECT_EQ(elastic.lost, (std::vector<int64_t>{1, 0}));
  // Alone, rank 0 took epoch 1 up at the same share of the samples: 11 of
  // 16 two-rank steps are 22 of 32 one-rank steps (its 23rd step is the
  // first), then 19 steps (10 of epoch 1, 9 of epoch 2) until the grow.
  EXPECT_EQ(elastic.first_step_alone, 23);
  EXPECT_EQ(elastic.steps_at_world1, 19);
  ASSERT_EQ(elastic.epochs.size(), 2u);
  EXPECT_EQ(elastic.epochs[0].steps_per_epoch, 32);
  EXPECT_EQ(elastic.epochs[1].steps_per_epoch, 16);
  EXPECT_EQ(elastic.steps_per_epoch.back(), 16);
  // The joiner started at epoch 2 step 9 x 1 / 2 = 4 and did its 12 steps.
  EXPECT_EQ(joiner_steps.steps, 12);
  EXPECT_EQ(p[2].epoch, 2);
  EXPECT_EQ(p[0].epoch, 2);
  // Both averaged the same epoch-2 statistics; rank 0 evaluated.
  EXPECT_EQ(p[2].loss, p[0].loss);
  EXPECT_EQ(p[2].test_accuracy, -1);
  EXPECT_GT(p[0].test_accuracy, 0.5);
}

}  // namespace
}  // namespace train
}  // namespace dtrain

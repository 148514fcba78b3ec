// End to end: a scheduler restart restarts nothing. `trainctl cluster up`
// starts a scheduler (its supervisor restarts it when it dies) and two
// trainer daemons; a two-trainer LeNet job (ALLREDUCE) runs undisturbed,
// then again with the scheduler SIGKILLed three times in a row from the
// middle of epoch 2 or 3, each time once the trainers registered again. The
// trainers must train on while it is away, register again within 2 s of
// the new scheduler answering, and the new scheduler must adopt the running
// attempt instead of requeueing it: the job ends SUCCEEDED on attempt 1,
// each rank started once and each epoch ended once (no step redone), with
// the undisturbed run's loss and accuracy at every epoch. The same for a
// KVSTORE job (synchronous rounds through a kvstore shard), killed once.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/rpc/credentials.h"
#include "protos/scheduler.grpc.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

class SchedulerRestartE2eTest : public ClusterTest {
 protected:
  void SetUp() override {
    ClusterOptions o;
    o.trainers = 2;
    o.restart = true;  // the supervisor starts the killed scheduler again
    o.heartbeat_timeout_s = 10;
    o.kvstore_shards = KvstoreShards();
    ASSERT_NO_FATAL_FAILURE(Up(o));
  }
  virtual int KvstoreShards() const { return 0; }

  // Runs `request` undisturbed, then again with the scheduler SIGKILLed
  // `kills` times while it runs (each once the trainers registered again),
  // and checks the adoption (see the file comment).
  void RunAndRestart(v1::SubmitRequest request, int kills) {
    request.mutable_spec()->set_name("undisturbed");
    v1::JobStatus ref = Submit(request);
    ref = WatchToEnd(ref.id(), absl::Seconds(300));
    ASSERT_EQ(ref.state(), v1::SUCCEEDED) << ref.DebugString();
    ASSERT_GT(ref.test_accuracy(), 0.5);
    request.mutable_spec()->set_name("restarted");
    v1::JobStatus job = Submit(request);
    job = WaitMidEpoch(job.id(), {.first_epoch = 2, .last_epoch = 3});
    ASSERT_EQ(job.state(), v1::RUNNING) << job.DebugString();
    ASSERT_EQ(job.trainers_size(), 2);
    const std::vector<std::string> trainers(job.trainers().begin(), job.trainers().end());
    for (int kill = 0; kill < kills; ++kill) {
      const absl::Duration reregistered = KillSchedulerAndTimeReregistration(trainers);
      std::printf("reregistered_after_answering_s=%.3f\n", absl::ToDoubleSeconds(reregistered));
      EXPECT_LE(reregistered, absl::Seconds(2));
      ASSERT_NE(reregistered, absl::InfiniteDuration());
      ASSERT_EQ(Get(job.id()).state(), v1::RUNNING) << "the job ended before the restart " << kill;
    }

    v1::JobStatus done = WatchToEnd(job.id(), absl::Seconds(300));
    ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
    EXPECT_EQ(done.attempts(), 1) << done.DebugString();
    ASSERT_EQ(done.trainers_size(), 2);
    EXPECT_EQ(done.trainers(0), trainers[0]);
    EXPECT_EQ(done.trainers(1), trainers[1]);
    int adopted = 0;
    bool placed = false;
    for (const v1::JobEvent& e : done.events()) {
      EXPECT_FALSE(placed && e.state() == v1::QUEUED) << "requeued: " << e.reason();
      placed = placed || e.state() == v1::RUNNING;
      if (e.reason() == "scheduler restarted; adopted the running attempt 1 from its 2 trainers") {
        ++adopted;
      }
    }
    EXPECT_EQ(adopted, kills) << done.DebugString();
    // Each rank started once and resumed nothing, and rank 0 ended each
    // epoch once, in order: no step redone.
    EXPECT_EQ(TrainerLogLines(dir(), {"starting job " + job.id()}).size(), 2u);
    EXPECT_TRUE(TrainerLogLines(dir(), {"resumed from"}).empty());
    EXPECT_EQ(TrainerLogLines(dir(), {"claimed rank", job.id()}).size(), 2u * kills);
    const std::vector<std::string> epochs = EpochLines(job.id());
    ASSERT_EQ(epochs.size(), static_cast<size_t>(request.spec().epochs()));
    for (size_t i = 0; i < epochs.size(); ++i) {
      EXPECT_TRUE(absl::StartsWith(epochs[i], absl::StrCat(i + 1, ": loss "))) << epochs[i];
    }
    // The undisturbed run's loss and test accuracy at every epoch.
    EXPECT_EQ(epochs, EpochLines(ref.id()));
    std::printf("test_accuracy=%.4f reference_test_accuracy=%.4f\n", done.test_accuracy(),
                ref.test_accuracy());
    EXPECT_DOUBLE_EQ(done.test_accuracy(), ref.test_accuracy());
    EXPECT_DOUBLE_EQ(done.loss(), ref.loss());
  }

  // Rank 0's end-of-epoch lines of job `id` ("3: loss 0.445103, test
  // accuracy 0.854"), in the order logged.
  std::vector<std::string> EpochLines(const std::string& id) const {
    const std::string key = absl::StrCat("job ", id, " epoch ");
    std::vector<std::string> lines;
    for (const std::string& line : TrainerLogLines(dir(), {key, ": loss "})) {
      lines.push_back(line.substr(line.find(key) + key.size()));
    }
    return lines;
  }

  int SchedulerPid() const {
    for (const ClusterProcess& p : ReadCluster(dir())) {
      if (p.role == "scheduler") return p.pid;
    }
    return -1;
  }

  // A stub on a channel of its own: a new channel connects at once, where
  // stub_'s waits out its reconnect backoff.
  std::unique_ptr<v1::JobService::Stub> FreshStub() const {
    return v1::JobService::NewStub(rpc::NewChannel(scheduler()));
  }

  // SIGKILLs the scheduler; returns how long after the new one first
  // answered every trainer in `trainers` was registered again (or an
  // infinite duration, failing the test).
  absl::Duration KillSchedulerAndTimeReregistration(const std::vector<std::string>& trainers) {
    const int pid = SchedulerPid();
    EXPECT_GT(pid, 0);
    if (pid <= 0 || kill(pid, SIGKILL) != 0) return absl::InfiniteDuration();
    const absl::Time end = absl::Now() + absl::Seconds(60);
    absl::Time answered = absl::InfiniteFuture();
    // Until the new scheduler answers: a new channel every 50 ms; then that
    // one (each new channel costs the scheduler a TLS handshake).
    std::unique_ptr<v1::JobService::Stub> stub;
    while (absl::Now() < end) {
      const int now_pid = SchedulerPid();
      if (now_pid != pid && now_pid > 0) {
        if (stub == nullptr || answered == absl::InfiniteFuture()) stub = FreshStub();
        v1::ListTrainersReply reply;
        auto ctx = Ctx(absl::Milliseconds(500));
        if (stub->ListTrainers(ctx.get(), v1::ListTrainersRequest(), &reply).ok()) {
          const absl::Time at = absl::Now();
          if (answered == absl::InfiniteFuture()) answered = at;
          std::set<std::string> busy;
          for (const v1::TrainerStatus& t : reply.trainers()) {
            if (t.state() == v1::BUSY) busy.insert(t.id());
          }
          bool all = true;
          for (const std::string& t : trainers) all = all && busy.count(t) > 0;
          if (all) return at - answered;
        }
      }
      absl::SleepFor(absl::Milliseconds(answered == absl::InfiniteFuture() ? 50 : 10));
    }
    ADD_FAILURE() << "the trainers did not register again within 60 s of the kill (answered: "
                  << (answered != absl::InfiniteFuture()) << ")";
    return absl::InfiniteDuration();
  }
};

TEST_F(SchedulerRestartE2eTest, ThreeRestartsInARowLeaveTheAllreduceJobAtAttemptOne) {
  // 96 steps an epoch (7-10 s here). The three restarts take about 10 s
  // (the supervisor waits 1, 2, then 4 s before it starts the scheduler
  // again); killed in epoch 2 or 3 of 6, the job has 3 epochs or more left.
  RunAndRestart(MomentumLenetJob("", 6, 12288), 3);
}

class KvstoreSchedulerRestartE2eTest : public SchedulerRestartE2eTest {
 protected:
  int KvstoreShards() const override { return 1; }
};

TEST_F(KvstoreSchedulerRestartE2eTest, SigkilledSchedulerAdoptsTheRunningKvstoreJob) {
  // 512 steps an epoch (about 1-2 s): at least 7 epochs left after the kill.
  v1::SubmitRequest r = KvstoreMlpJob("", 10, 32768);
  r.mutable_spec()->set_test_limit(2000);  // an accuracy to compare
  RunAndRestart(r, 1);
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

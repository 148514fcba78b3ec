// End to end: a trainer SIGKILLed in the middle of a two-trainer LeNet job.
//
// `trainctl cluster up` starts a scheduler (heartbeat timeout 2 s, no
// recovery in place: this is the checkpoint-restart path; recover_e2e_test
// covers the other) and three trainer daemons sharing
// <cluster>/checkpoints. The same job (2 trainers, momentum, a checkpoint
// after every epoch) runs twice: undisturbed, then with rank 0's trainer
// killed once the job has checkpointed epoch 1. The survivor's allreduce
// fails, the scheduler requeues the job, the job runs again on the survivor
// and the idle trainer, resumes from the checkpoint (parameters and
// momentum) and must end within 0.01 test accuracy of the
// undisturbed run. The scheduler must also notice the dead trainer within
// its heartbeat timeout (its trainers_alive gauge drops).
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/metrics/scrape.h"
#include "protos/scheduler.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

constexpr double kHeartbeatTimeoutS = 2;

class ResumeE2eTest : public ClusterTest {
 protected:
  void SetUp() override {
    Up({.name = "resume-cluster",
        .trainers = 3,
        .heartbeat_timeout_s = kHeartbeatTimeoutS,
        .flags = "--recover_in_place=false"});
  }

  static v1::SubmitRequest Job(const std::string& name) {
    return MomentumLenetJob(name, 4, 6144);  // 48 steps an epoch
  }

  double TrainersAlive() { return SchedulerMetric("dtrain_scheduler_trainers_alive"); }
};

TEST_F(ResumeE2eTest, KilledTrainerJobResumesFromCheckpoint) {
  // The reference: the same job, undisturbed.
  v1::JobStatus ref = Submit(Job("undisturbed"));
  ASSERT_FALSE(ref.id().empty());
  const absl::Time ref_start = absl::Now();
  ref = WatchToEnd(ref.id(), absl::Seconds(240));
  std::fprintf(stderr, "undisturbed: %s in %s, loss %.5f, test accuracy %.4f\n",
               v1::JobState_Name(ref.state()).c_str(),
               absl::FormatDuration(absl::Now() - ref_start).c_str(), ref.loss(),
               ref.test_accuracy());
  ASSERT_EQ(ref.state(), v1::SUCCEEDED) << ref.DebugString();
  ASSERT_EQ(ref.attempts(), 1);
  ASSERT_EQ(TrainersAlive(), 3);
  // The job's trainers exported their device memory while it ran.
  int with_memory = 0;
  for (const ClusterProcess& p : ReadCluster(dir())) {
    if (p.role != "trainer") continue;
    ASSERT_TRUE(metrics::Scrape(PortOfUrl(p.metrics_url)).ok()) << p.name;
    const double peak =
        ScrapeSample(PortOfUrl(p.metrics_url),
                     R"(dtrain_trainer_device_memory_bytes{device="cpu",state="peak"})");
    if (peak > 1e5) ++with_memory;
  }
  EXPECT_EQ(with_memory, 2);

  v1::JobStatus job = Submit(Job("disturbed"));
  ASSERT_FALSE(job.id().empty());
  job = PollJob(
      job.id(),
      [](const v1::JobStatus& j) { return j.state() == v1::RUNNING && j.checkpoint_epoch() >= 1; },
      absl::Seconds(120));
  ASSERT_EQ(job.state(), v1::RUNNING) << job.DebugString();
  ASSERT_LT(job.epoch(), 4) << "the job ended before the kill: " << job.DebugString();
  const std::map<std::string, int> pids = TrainerPids();
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_EQ(job.trainers_size(), 2);
  auto victim = pids.find(job.trainers(0));  // rank 0: the one that writes checkpoints
  ASSERT_NE(victim, pids.end()) << job.trainers(0);
  std::fprintf(stderr, "killing rank 0 (%s, pid %d) at epoch %d step %lld, checkpoint %s (%d)\n",
               victim->first.c_str(), victim->second, job.epoch(),
               static_cast<long long>(job.step()), job.checkpoint_path().c_str(),
               job.checkpoint_epoch());
  ASSERT_EQ(kill(victim->second, SIGKILL), 0);
  const absl::Time killed = absl::Now();

  // The scheduler declares it lost within its heartbeat timeout (plus its
  // liveness check period, a quarter of it, and scrape slack).
  absl::Duration noticed = absl::InfiniteDuration();
  for (absl::Time deadline = killed + absl::Seconds(4 * kHeartbeatTimeoutS); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(50))) {
    if (TrainersAlive() == 2) {
      noticed = absl::Now() - killed;
      break;
    }
  }
  std::fprintf(stderr, "scheduler dropped the dead trainer after %s\n",
               absl::FormatDuration(noticed).c_str());
  EXPECT_LE(noticed, absl::Seconds(kHeartbeatTimeoutS * 1.25 + 1));

  v1::JobStatus done = WatchToEnd(job.id(), absl::Seconds(240));
  std::fprintf(stderr, "disturbed: %s after %d attempts, loss %.5f, test accuracy %.4f\n",
               v1::JobState_Name(done.state()).c_str(), done.attempts(), done.loss(),
               done.test_accuracy());
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.attempts(), 2) << done.DebugString();
  EXPECT_EQ(done.epoch(), 4);
  // The second placement excluded the dead trainer and resumed.
  for (const std::string& t : done.trainers()) EXPECT_NE(t, victim->first);
  bool resumed = false;
  for (const v1::JobEvent& e : done.events()) {
    if (e.state() == v1::QUEUED && e.reason().find("resuming from") != std::string::npos) {
      resumed = true;
    }
  }
  EXPECT_TRUE(resumed) << done.DebugString();
  // Both ranks of the second attempt loaded the checkpoint (a restart from
  // scratch would end the same way, so look at what the trainers did).
  EXPECT_EQ(TrainerLogLines(dir(), {done.id() + " rank", "resumed from"}).size(), 2u);
  // The resumed run is the undisturbed one: same data order from the
  // checkpointed epoch on, same parameters and momentum.
  std::fprintf(stderr, "test accuracy difference %.5f, loss difference %.3g\n",
               std::fabs(done.test_accuracy() - ref.test_accuracy()),
               std::fabs(done.loss() - ref.loss()));
  EXPECT_NEAR(done.test_accuracy(), ref.test_accuracy(), 0.01);
  // Tighter: a lost momentum buffer or a different data order would show in
  // the last epoch's loss (the run is deterministic; this allows for
  // summation order only).
  EXPECT_NEAR(done.loss(), ref.loss(), 1e-4 * ref.loss());
  EXPECT_GT(ref.test_accuracy(), 0.6);  // it did learn
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

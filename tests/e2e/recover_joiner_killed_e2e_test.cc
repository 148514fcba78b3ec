// End to end: a second SIGKILL during a recovery in place. A 2-trainer
// LeNet KVSTORE job whose weights the kvstore holds (BOUNDED_DELAY,
// max_staleness 2, one shard) runs on a cluster of 4 trainers (2 spares,
// heartbeat timeout 3 s); rank 0's trainer is SIGKILLed mid-epoch, and the
// spare the scheduler then makes rank 0 is SIGKILLed too while it joins
// (before its first step). The scheduler must offer the next generation to
// the other spare, which continues kvstore worker 0's rounds; the job must
// SUCCEED on its first attempt with the survivor still rank 1.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "protos/scheduler.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

class JoinerKilledE2eTest : public ClusterTest {};

TEST_F(JoinerKilledE2eTest, ReplacementKilledWhileJoiningIsReplacedByTheNextSpare) {
  ASSERT_NO_FATAL_FAILURE(Up({.name = "joiner_killed",
                              .trainers = 4,
                              .kvstore_shards = 1,
                              .kvstore_replicas = 1,
                              .heartbeat_timeout_s = 3}));

  v1::SubmitRequest r = MomentumLenetJob("joiner-killed", 3, 12288);  // 96 steps an epoch
  v1::JobSpec* s = r.mutable_spec();
  s->set_lr(0.02);
  s->mutable_sync()->set_mode(v1::KVSTORE);
  s->mutable_sync()->set_consistency(v1::BOUNDED_DELAY);
  s->mutable_sync()->set_max_staleness(2);
  const v1::JobStatus submitted = Submit(r);
  ASSERT_FALSE(submitted.id().empty());
  absl::StatusOr<v1::JobStatus> mid = cluster_->WaitMidEpoch(
      submitted.id(), {.first_epoch = 2, .last_epoch = 2, .min_step = 10, .min_steps_left = 10});
  ASSERT_TRUE(mid.ok()) << mid.status();
  const v1::JobStatus job = *mid;
  ASSERT_EQ(job.trainers_size(), 2);
  const std::string survivor = job.trainers(1);
  std::map<std::string, int> pids = TrainerPids();
  ASSERT_EQ(pids.size(), 4u);
  const std::string victim = job.trainers(0);
  ASSERT_TRUE(cluster_->KillTrainer(victim, SIGKILL).ok());
  const absl::Time killed = absl::Now();

  // The scheduler makes a spare rank 0 (generation 1); kill it while it
  // joins: before the recovery is counted, that is before its first step.
  v1::JobStatus offered = job;
  PollUntil(
      absl::Seconds(30),
      [&] {
        offered = Get(job.id());
        return offered.trainers_size() != 2 || offered.trainers(0) != victim;
      },
      absl::Milliseconds(10));
  ASSERT_EQ(offered.trainers_size(), 2) << offered.DebugString();
  const std::string joiner = offered.trainers(0);
  ASSERT_NE(joiner, victim) << "no replacement offered: " << offered.DebugString();
  ASSERT_EQ(kill(pids.at(joiner), SIGKILL), 0);
  std::fprintf(stderr, "killed rank 0 (%s), then its replacement %s %s later\n", victim.c_str(),
               joiner.c_str(), absl::FormatDuration(absl::Now() - killed).c_str());
  EXPECT_EQ(offered.recoveries(), 0)
      << "the replacement had joined already: " << offered.DebugString();
  EXPECT_EQ(offered.generation(), 1) << offered.DebugString();

  absl::StatusOr<v1::JobStatus> last = cluster_->WatchToEnd(job.id(), absl::Seconds(180));
  ASSERT_TRUE(last.ok()) << last.status();
  const v1::JobStatus& done = *last;
  std::fprintf(stderr,
               "%s %s after the first kill: attempts %d, recoveries %d, generation %d, last "
               "recovery %.2f s, steps lost %lld, test accuracy %.4f\n",
               v1::JobState_Name(done.state()).c_str(),
               absl::FormatDuration(absl::Now() - killed).c_str(), done.attempts(),
               done.recoveries(), done.generation(), done.last_recovery_seconds(),
               static_cast<long long>(done.steps_lost()), done.test_accuracy());
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.attempts(), 1) << done.DebugString();
  EXPECT_EQ(done.recoveries(), 1) << done.DebugString();
  EXPECT_EQ(done.generation(), 2) << done.DebugString();
  EXPECT_EQ(done.epoch(), 3);
  ASSERT_EQ(done.trainers_size(), 2);
  EXPECT_NE(done.trainers(0), victim);
  EXPECT_NE(done.trainers(0), joiner);
  EXPECT_EQ(done.trainers(1), survivor);
  EXPECT_GT(done.test_accuracy(), 0.6) << done.DebugString();
  // The last spare continued worker 0's rounds; nobody read a checkpoint.
  ASSERT_EQ(pids.count(done.trainers(0)), 1u) << done.trainers(0);
  const int last_spare = pids.at(done.trainers(0));
  int continued = 0, resumed = 0;
  for (const ClusterProcess& p : cluster_->Processes("trainer")) {
    std::ifstream log(absl::StrCat(dir(), "/", p.name, ".log"));
    for (std::string line; std::getline(log, line);) {
      if (line.find(done.id()) == std::string::npos) continue;
      if (line.find("resumed from") != std::string::npos) ++resumed;
      if (p.pid == last_spare &&
          line.find("continuing kvstore worker 0 after its ") != std::string::npos) {
        ++continued;
      }
    }
  }
  EXPECT_EQ(continued, 1);
  EXPECT_EQ(resumed, 0);
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

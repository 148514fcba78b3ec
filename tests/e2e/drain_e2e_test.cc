// End to end: graceful drain. `trainctl cluster up` starts a scheduler and
// three trainer daemons sharing <cluster>/checkpoints; a two-trainer LeNet
// job (momentum, a checkpoint after every epoch) runs undisturbed, then
// again with rank 0's trainer sent SIGTERM in the middle of epoch 2 of 3 (what a
// Kubernetes drain or rolling update does). The trainer must finish its
// step, checkpoint it with its peer, report the job drained and exit 0; the
// scheduler must requeue the job without counting a failed attempt and
// resume it at that very step on the survivor and the spare trainer; the
// job must end exactly like the undisturbed run. A second test drains a
// trainer with `trainctl drain` and watches `trainctl trainers`.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "protos/scheduler.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

class DrainE2eTest : public ClusterTest {
 protected:
  void SetUp() override {
    Up({.trainers = 3, .restart = true, .heartbeat_timeout_s = 5, .down_grace_s = 10});
  }

  static v1::SubmitRequest Job(const std::string& name, int epochs) {
    return MomentumLenetJob(name, epochs, 12288);  // 96 steps an epoch
  }

  // Waits until the job runs in one of the epochs `first`..`last`, early
  // enough that the drain (at the next multiple of 16 steps) still lands
  // inside that epoch.
  v1::JobStatus WaitMidEpoch(const std::string& id, int first, int last) {
    return ClusterTest::WaitMidEpoch(id, {.first_epoch = first,
                                          .last_epoch = last,
                                          .min_step = 1,
                                          .min_steps_left = 17,
                                          .timeout = absl::Seconds(180)});
  }
};

TEST_F(DrainE2eTest, SigtermedTrainerDrainsAndTheJobResumesAtItsStep) {
  v1::JobStatus ref = Submit(Job("undisturbed", 3));
  ASSERT_FALSE(ref.id().empty());
  ref = WatchToEnd(ref.id(), absl::Seconds(300));
  ASSERT_EQ(ref.state(), v1::SUCCEEDED) << ref.DebugString();
  ASSERT_GT(ref.test_accuracy(), 0.6);  // it did learn

  v1::JobStatus job = Submit(Job("drained", 3));
  ASSERT_FALSE(job.id().empty());
  job = WaitMidEpoch(job.id(), 2, 2);
  ASSERT_EQ(job.state(), v1::RUNNING) << job.DebugString();
  ASSERT_EQ(job.epoch(), 1) << "not in epoch 2: " << job.DebugString();
  const int64_t spe = job.steps_per_epoch();
  ASSERT_EQ(spe, 96);  // 6,144 images per rank, 64 a step
  const int64_t seen_at_sigterm = job.epoch() * spe + job.step();
  std::map<std::string, TrainerProcess> procs = Trainers(dir());
  ASSERT_EQ(procs.size(), 3u);
  ASSERT_EQ(job.trainers_size(), 2);
  const std::string victim = job.trainers(0);  // rank 0: it writes the checkpoint
  ASSERT_EQ(procs.count(victim), 1u) << victim;
  const int pid = procs[victim].pid;
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const absl::Time sent = absl::Now();

  // The victim exits on its own, well within --drain_timeout_s (60 s), and
  // says so as its last words (status 0, not the timeout's stop).
  while (ProcessAlive(pid) && absl::Now() - sent < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(ProcessAlive(pid));
  const absl::Duration exited_after = absl::Now() - sent;
  EXPECT_LT(exited_after, absl::Seconds(30));
  const std::string victim_log = ReadFile(procs[victim].log_path);
  EXPECT_NE(victim_log.find("trainer exiting with status 0"), std::string::npos);
  EXPECT_EQ(victim_log.find("stopping the job"), std::string::npos);
  EXPECT_EQ(victim_log.find("trainer shutting down"), std::string::npos);

  v1::JobStatus done = WatchToEnd(job.id(), absl::Seconds(300));
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  // Two placements, one of them drained: no failed attempt counted.
  EXPECT_EQ(done.attempts(), 2) << done.DebugString();
  EXPECT_EQ(done.drains(), 1) << done.DebugString();
  for (const std::string& t : done.trainers()) EXPECT_NE(t, victim);
  std::string requeue;
  for (const v1::JobEvent& e : done.events()) {
    EXPECT_NE(e.state(), v1::FAILED) << e.reason();
    if (e.state() == v1::QUEUED && e.reason().find("drained at") != std::string::npos) {
      requeue = e.reason();
    }
  }
  ASSERT_NE(requeue, "") << done.DebugString();
  // "... drained at epoch E step S; requeued, resuming from <ckpt> (epoch E step S)"
  const int64_t epoch = NumberAfter(requeue, "drained at epoch ");
  const int64_t step = NumberAfter(requeue, "drained at epoch " + absl::StrCat(epoch) + " step ");
  EXPECT_TRUE(epoch >= 2 && epoch <= 3) << requeue;  // of 3: mid-job
  EXPECT_GT(step, 0) << requeue;                     // mid-epoch
  EXPECT_NE(requeue.find(absl::StrCat("(epoch ", epoch, " step ", step, ")")), std::string::npos)
      << requeue;
  const int64_t drained_at = (epoch - 1) * spe + step;
  // Work lost: the steps the first attempt did beyond its checkpoint (its
  // ranks log how many steps they did before draining) and steps done before
  // the SIGTERM that the checkpoint lacks: at most one.
  std::vector<std::string> agreed = TrainerLogLines(dir(), {done.id() + " rank", "draining after"});
  ASSERT_EQ(agreed.size(), 2u) << victim_log;
  for (const std::string& line : agreed) {
    EXPECT_EQ(NumberAfter(line, "draining after "), drained_at) << line;
  }
  EXPECT_GE(drained_at + 1, seen_at_sigterm);
  // Both ranks of the second attempt resumed at that step.
  std::vector<std::string> resumed = TrainerLogLines(
      dir(), {done.id() + " rank", absl::StrCat("after epoch ", epoch - 1, " step ", step)});
  EXPECT_EQ(resumed.size(), 2u);
  // They read the partial statistics each rank wrote next to the checkpoint
  // when it drained; the run that completed the job removed them.
  std::vector<std::string> partials;
  for (const auto& f : std::filesystem::directory_iterator(dir() + "/checkpoints")) {
    if (absl::EndsWith(f.path().string(), ".partial")) partials.push_back(f.path().string());
  }
  EXPECT_TRUE(partials.empty()) << partials[0];
  EXPECT_TRUE(std::filesystem::exists(dir() + "/checkpoints/" + done.id() + ".ckpt"));
  std::fprintf(stderr,
               "drained at epoch %lld step %lld (seen at SIGTERM: step %lld of the job); trainer "
               "exited after %s; loss %.6f vs %.6f, test accuracy %.4f vs %.4f\n",
               static_cast<long long>(epoch), static_cast<long long>(step),
               static_cast<long long>(seen_at_sigterm), absl::FormatDuration(exited_after).c_str(),
               done.loss(), ref.loss(), done.test_accuracy(), ref.test_accuracy());
  // Nothing lost or repeated: the same run as the undisturbed one.
  EXPECT_NEAR(done.test_accuracy(), ref.test_accuracy(), 0.01);
  EXPECT_DOUBLE_EQ(done.test_accuracy(), ref.test_accuracy());
  EXPECT_DOUBLE_EQ(done.loss(), ref.loss());
}

TEST_F(DrainE2eTest, TrainctlDrainMovesTheJobAndListsTheTrainer) {
  int rc;
  std::string out = Trainctl("--scheduler=" + scheduler() + " drain no-such-trainer", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;

  v1::JobStatus job = Submit(Job("moved", 3));
  ASSERT_FALSE(job.id().empty());
  job = WaitMidEpoch(job.id(), 1, 2);
  ASSERT_EQ(job.state(), v1::RUNNING) << job.DebugString();
  ASSERT_EQ(job.trainers_size(), 2);
  const std::string drained = job.trainers(1);
  out = Trainctl("--scheduler=" + scheduler() + " drain " + drained, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, absl::StrCat(drained, " DRAINING: job ", job.id(), " drains\n"));

  v1::JobStatus done = WatchToEnd(job.id(), absl::Seconds(300));
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_EQ(done.drains(), 1);
  for (const std::string& t : done.trainers()) EXPECT_NE(t, drained);

  // The drained trainer still runs, idle and DRAINING; the others are IDLE.
  std::map<std::string, TrainerProcess> procs = Trainers(dir());
  ASSERT_EQ(procs.count(drained), 1u);
  EXPECT_TRUE(ProcessAlive(procs[drained].pid));
  out = Trainctl("--scheduler=" + scheduler() + " -o json trainers", &rc);
  ASSERT_EQ(rc, 0) << out;
  v1::ListTrainersReply list;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out, &list).ok()) << out;
  ASSERT_EQ(list.trainers_size(), 3) << out;
  for (const v1::TrainerStatus& t : list.trainers()) {
    EXPECT_EQ(t.state(), t.id() == drained ? v1::DRAINING : v1::IDLE) << out;
    EXPECT_EQ(t.job_ids_size(), 0) << out;
  }
  out = Trainctl("--scheduler=" + scheduler() + " trainers", &rc);
  ASSERT_EQ(rc, 0) << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << out;
  EXPECT_EQ(lines[0].substr(0, 2), "ID");
  for (size_t i = 1; i < lines.size(); ++i) {
    const bool is_drained = lines[i].substr(0, drained.size() + 1) == drained + " ";
    EXPECT_NE(lines[i].find(is_drained ? " DRAINING " : " IDLE "), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

// End to end: straggler detection and why a job waits, with real CPU
// contention. `trainctl cluster up` starts a scheduler and two trainer
// daemons; each trainer (every thread of it) is pinned to its own core.
//
// Calm: a two-trainer LeNet ALLREDUCE job (one thread per trainer) runs to
// its end; its status never names a straggler and the scheduler's
// dtrain_scheduler_stragglers stays 0.
//
// Contended: three busy loops share the first trainer's core; the same job
// must name that trainer's rank a straggler (JobStatus.stragglers, an event
// "straggler: rank R on trainer T is N.Nx slower than the median of the
// other ranks, in forward_backward", `trainctl get`,
// dtrain_scheduler_stragglers 1) within 60 s of its submission. Meanwhile
// a second two-trainer job waits, and its status, `trainctl get`, `list` and
// `-o json get` say why: both trainers run the first job.
//
// The test runs alone (tags exclusive): its calm half needs the cores to
// itself. Skipped on a machine with fewer than two CPUs for this process.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
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

// Pins every thread of process `pid` to `cpu` (threads it starts later
// inherit it).
bool PinProcess(int pid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  bool any = false;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    int tid = 0;
    if (!absl::SimpleAtoi(task.path().filename().string(), &tid)) continue;
    if (sched_setaffinity(tid, sizeof(set), &set) != 0) return false;
    any = true;
  }
  return any;
}

class StragglerE2eTest : public ClusterTest {
 protected:
  void SetUp() override {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
    for (int c = 0; c < CPU_SETSIZE && cpus_.size() < 2; ++c) {
      if (CPU_ISSET(c, &mine)) cpus_.push_back(c);
    }
    if (cpus_.size() < 2) GTEST_SKIP() << "needs two CPUs to pin the trainers apart";
    Up({.name = "straggler", .trainers = 2});
  }

  void TearDown() override {
    for (int pid : busy_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    ClusterTest::TearDown();
  }

  static v1::SubmitRequest Job(const std::string& name, int epochs) {
    v1::SubmitRequest r;
    v1::JobSpec* s = r.mutable_spec();
    s->set_name(name);
    s->set_model("lenet");
    s->set_epochs(epochs);
    s->set_global_batch_size(128);
    s->set_lr(0.1);
    s->set_seed(1);
    s->set_test_limit(1000);
    s->set_threads(1);
    s->set_num_trainers(2);
    s->mutable_sync()->set_mode(v1::ALLREDUCE);
    return r;
  }

  // A process spinning on `cpu` until TearDown kills it.
  void BusyLoop(int cpu) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof(set), &set);
      for (volatile uint64_t i = 0;; i = i + 1) {
      }
    }
    busy_.push_back(pid);
  }

  std::vector<int> cpus_;
  std::vector<int> busy_;
};

TEST_F(StragglerE2eTest, ContendedRankIsNamedAndACalmRunNamesNone) {
  // The trainers' "registered as" lines can reach their logs after the
  // scheduler lists them (a loaded machine): read until both are there.
  std::map<std::string, int> pids = TrainerPids();
  for (absl::Time deadline = absl::Now() + absl::Seconds(30);
       pids.size() < 2 && absl::Now() < deadline; pids = TrainerPids()) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(pids.size(), 2u);
  std::vector<std::string> ids;
  for (const auto& [id, pid] : pids) {
    ASSERT_TRUE(PinProcess(pid, cpus_[ids.size()])) << "pinning trainer " << id;
    ids.push_back(id);
  }
  const std::string& slow_trainer = ids[0];  // shares cpus_[0] with the busy loops

  // Calm: each trainer alone on its core.
  v1::JobStatus calm = Submit(Job("calm", 1));
  int reports_seen = 0;
  for (absl::Time deadline = absl::Now() + absl::Seconds(120);
       absl::Now() < deadline && calm.state() != v1::SUCCEEDED && calm.state() != v1::FAILED;
       absl::SleepFor(absl::Milliseconds(250))) {
    calm = Get(calm.id());
    ASSERT_EQ(calm.stragglers_size(), 0) << calm.DebugString();
    ASSERT_NE(SchedulerMetric("dtrain_scheduler_stragglers"), 1);
    if (calm.rank_step_times_size() == 2 && calm.rank_step_times(0).steps() > 0 &&
        calm.rank_step_times(1).steps() > 0) {
      ++reports_seen;
    }
  }
  ASSERT_EQ(calm.state(), v1::SUCCEEDED) << calm.DebugString();
  for (const v1::JobEvent& e : calm.events()) {
    EXPECT_EQ(e.reason().find("straggler"), std::string::npos) << e.reason();
  }
  // Both ranks' summaries were seen for a good part of the run.
  EXPECT_GE(reports_seen, 8);
  EXPECT_EQ(SchedulerMetric("dtrain_scheduler_stragglers_detected_total"), 0);
  // Both ranks' summaries were there to compare (the detector's verdict,
  // checked above, is what counts: on a shared machine one report's ratio
  // may pass 1.3).
  const double busy0 = calm.rank_step_times(0).busy_seconds();
  const double busy1 = calm.rank_step_times(1).busy_seconds();
  ASSERT_GT(busy0, 0);
  ASSERT_GT(busy1, 0);
  EXPECT_GT(calm.samples_per_second(), 0);
  std::fprintf(stderr, "calm: %.0f samples/s, busy ms rank 0 %.1f rank 1 %.1f\n",
               calm.samples_per_second(), busy0 * 1e3, busy1 * 1e3);

  // Contended: three busy loops on the first trainer's core.
  for (int i = 0; i < 3; ++i) BusyLoop(cpus_[0]);
  const absl::Time submitted = absl::Now();
  v1::JobStatus job = Submit(Job("contended", 20));
  absl::Time first_report = absl::InfiniteFuture();
  for (absl::Time deadline = absl::Now() + absl::Seconds(180);
       absl::Now() < deadline && job.stragglers_size() == 0;
       absl::SleepFor(absl::Milliseconds(250))) {
    job = Get(job.id());
    ASSERT_EQ(job.state(), v1::RUNNING) << job.DebugString();
    if (first_report == absl::InfiniteFuture() && job.rank_step_times_size() > 0) {
      first_report = absl::Now();
    }
  }
  ASSERT_EQ(job.stragglers_size(), 1) << job.DebugString();
  const absl::Duration took = absl::Now() - first_report;
  const absl::Duration since_submit = absl::Now() - submitted;
  EXPECT_LE(since_submit, absl::Seconds(60));
  const v1::Straggler& s = job.stragglers(0);
  ASSERT_EQ(job.trainers_size(), 2);
  EXPECT_EQ(s.trainer(), slow_trainer);
  EXPECT_EQ(job.trainers(s.rank()), slow_trainer);
  EXPECT_GE(s.ratio(), 1.3);
  EXPECT_EQ(s.phase(), "forward_backward");
  std::string event;
  for (const v1::JobEvent& e : job.events()) {
    if (e.reason().rfind("straggler:", 0) == 0) event = e.reason();
  }
  EXPECT_EQ(
      event.find(absl::StrCat("straggler: rank ", s.rank(), " on trainer ", slow_trainer, " is ")),
      0u)
      << event;
  EXPECT_NE(event.find("x slower than the median of the other ranks, in forward_backward"),
            std::string::npos)
      << event;
  std::fprintf(stderr, "contended: named %s after the submission (%s after the first report): %s\n",
               absl::FormatDuration(since_submit).c_str(), absl::FormatDuration(took).c_str(),
               event.c_str());
  EXPECT_EQ(SchedulerMetric("dtrain_scheduler_stragglers"), 1);
  EXPECT_EQ(SchedulerMetric("dtrain_scheduler_stragglers_detected_total"), 1);
  int rc;
  std::string out = Trainctl(absl::StrCat("--scheduler=", scheduler(), " get ", job.id()), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(
      out.find(absl::StrCat("  straggler: rank ", s.rank(), " on trainer ", slow_trainer, " is ")),
      std::string::npos)
      << out;
  EXPECT_NE(out.find(absl::StrCat("rank ", s.rank(), " step (median of ")), std::string::npos)
      << out;

  // Why a job waits: both trainers run the contended job.
  v1::JobStatus waiting = Submit(Job("waiting", 1));
  waiting = Get(waiting.id());
  ASSERT_EQ(waiting.state(), v1::QUEUED);
  const std::string reason =
      absl::StrCat("needs 2 trainers with 1 free cpu device; none is free, ", ids[0], " runs ",
                   job.id(), ", ", ids[1], " runs ", job.id());
  EXPECT_EQ(waiting.pending_reason(), reason);
  out = Trainctl(absl::StrCat("--scheduler=", scheduler(), " get ", waiting.id()), &rc);
  EXPECT_NE(out.find("  waiting: " + reason + "\n"), std::string::npos) << out;
  out = Trainctl(absl::StrCat("--scheduler=", scheduler(), " list"), &rc);
  EXPECT_NE(out.find("waiting: " + reason), std::string::npos) << out;
  out = Trainctl(absl::StrCat("--scheduler=", scheduler(), " -o json get ", waiting.id()), &rc);
  EXPECT_NE(out.find("\"pending_reason\":\"" + reason + "\""), std::string::npos) << out;
  Cancel(waiting.id());
  Cancel(job.id());
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

// Chaos, end to end: processes SIGKILLed at random under a KVSTORE job.
//
// A local cluster (`trainctl cluster up`: scheduler, 3 trainers, 2 kvstore
// shards of 2 replicas each; the supervisor restarts what dies, as
// Kubernetes restarts a pod) runs a 2-trainer MLP job through the kvstore
// (SYNCHRONOUS rounds, a checkpoint after every epoch) undisturbed, then
// again while, every eighth of the undisturbed run's time (2-6 s, plus up to
// half of it at random), a random trainer, kvstore replica or the
// scheduler is SIGKILLed, 8 times at most (so that the job can finish
// however slow the machine). The disturbed job must SUCCEED with a test
// accuracy within 0.01 of the undisturbed one; nothing the scheduler
// acknowledged may be lost: jobs submitted during the chaos all exist and
// succeed, and every state the job was seen in appears in its final event
// history, in order, with versions that never went back.
#include <signal.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

v1::SubmitRequest Job(const std::string& name) {
  // 1-2.5 s an epoch on two cores (the data port made it faster: at 16
  // epochs the job once ended after two kills): the chaos lasts 30-60 s.
  v1::SubmitRequest r = KvstoreMlpJob(name, 24, 16384);
  r.mutable_spec()->set_checkpoint_interval_epochs(1);
  r.mutable_spec()->set_test_limit(2000);
  return r;
}

TEST(KvstoreChaosE2eTest, RandomKillsEveryFewSecondsLoseNothing) {
  // Trainer and scheduler kills end attempts (the job resumes from its
  // checkpoint); allow enough of them.
  absl::StatusOr<std::unique_ptr<TestCluster>> started =
      TestCluster::Start({.name = "chaos",
                          .trainers = 3,
                          .kvstore_shards = 2,
                          .kvstore_replicas = 2,
                          .restart = true,
                          .heartbeat_timeout_s = 3,
                          .flags = "--max_attempts=50"});
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;

  const absl::Time ref_start = absl::Now();
  absl::StatusOr<v1::JobStatus> ref = cluster.Submit(Job("undisturbed"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<v1::JobStatus> ref_done = cluster.WatchToEnd(ref->id(), absl::Seconds(300));
  ASSERT_TRUE(ref_done.ok()) << ref_done.status();
  ASSERT_EQ(ref_done->state(), v1::SUCCEEDED) << ref_done->DebugString();
  // Kills every eighth of the undisturbed run (2-6 s, plus up to half of
  // that at random): at least three land however fast the job runs here;
  // at most kMaxKills, so that it ends however slow.
  const int64_t gap_ms =
      std::clamp<int64_t>(absl::ToInt64Milliseconds(absl::Now() - ref_start) / 8, 2000, 6000);
  constexpr size_t kMaxKills = 8;
  auto next_gap = [&](std::mt19937& rng) {
    return absl::Milliseconds(gap_ms + static_cast<int64_t>(rng() % (gap_ms / 2)));
  };

  absl::StatusOr<v1::JobStatus> job = cluster.Submit(Job("chaos"));
  ASSERT_TRUE(job.ok()) << job.status();
  std::mt19937 rng(20261201);
  std::vector<std::string> kills;         // "t=12s kvstore-1-0", for failure messages
  std::vector<std::string> submitted;     // small jobs acknowledged during the chaos
  std::vector<v1::JobState> seen_states;  // the chaos job's states, as polled
  int64_t last_version = 0;
  const absl::Time start = absl::Now();
  absl::Time next_kill = start + absl::Milliseconds(gap_ms);
  v1::JobStatus st = *job;
  const absl::Time deadline = start + absl::Seconds(600);
  while (!IsFinal(st.state()) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    absl::StatusOr<v1::JobStatus> got = cluster.Get(job->id());
    if (got.ok()) {
      // The scheduler may be down (restarting); otherwise it never forgets.
      EXPECT_GE(got->version(), last_version) << absl::StrJoin(kills, ", ");
      last_version = std::max<int64_t>(last_version, got->version());
      if (seen_states.empty() || seen_states.back() != got->state()) {
        seen_states.push_back(got->state());
      }
      st = *got;
    } else {
      EXPECT_TRUE(absl::IsUnavailable(got.status()) || absl::IsDeadlineExceeded(got.status()))
          << got.status();
    }
    if (absl::Now() < next_kill || IsFinal(st.state()) || kills.size() >= kMaxKills) continue;
    // A random kind, then a random process of that kind.
    std::vector<ClusterProcess> procs = cluster.Processes();
    const char* kinds[] = {"trainer", "kvstore", "scheduler"};
    const std::string kind = kinds[rng() % 3];
    std::vector<ClusterProcess> candidates;
    for (const ClusterProcess& p : procs) {
      if (p.role == kind && ProcessAlive(p.pid)) candidates.push_back(p);
    }
    if (!candidates.empty()) {
      const ClusterProcess& victim = candidates[rng() % candidates.size()];
      ASSERT_EQ(kill(victim.pid, SIGKILL), 0);
      kills.push_back(
          absl::StrCat("t=", absl::ToInt64Seconds(absl::Now() - start), "s ", victim.name));
      if (kind == "scheduler") {
        // A submission the restarted scheduler acknowledges must stay.
        for (absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;
             absl::SleepFor(absl::Milliseconds(200))) {
          absl::StatusOr<v1::JobStatus> s =
              cluster.Submit(SmallMlpJob(absl::StrCat("during-chaos-", submitted.size()), 512));
          if (s.ok()) {
            submitted.push_back(s->id());
            break;
          }
        }
      }
    }
    next_kill = absl::Now() + next_gap(rng);
  }
  const std::string schedule = absl::StrJoin(kills, ", ");
  ASSERT_TRUE(IsFinal(st.state())) << "still " << st.DebugString() << "\nkills: " << schedule;
  ASSERT_EQ(st.state(), v1::SUCCEEDED) << st.DebugString() << "\nkills: " << schedule;
  EXPECT_GE(kills.size(), 3u) << schedule;  // the chaos did happen
  EXPECT_NEAR(st.test_accuracy(), ref_done->test_accuracy(), 0.01) << schedule;

  // Every state seen appears in the job's history, in order.
  size_t at = 0;
  for (const v1::JobEvent& e : st.events()) {
    if (at < seen_states.size() && e.state() == seen_states[at]) ++at;
  }
  EXPECT_EQ(at, seen_states.size()) << st.DebugString() << "\nkills: " << schedule;
  // The jobs submitted during the chaos were not lost, and they run.
  for (const std::string& id : submitted) {
    absl::StatusOr<v1::JobStatus> s = cluster.WatchToEnd(id, absl::Seconds(300));
    ASSERT_TRUE(s.ok()) << id << ": " << s.status();
    EXPECT_EQ(s->state(), v1::SUCCEEDED) << s->DebugString();
  }
  std::fprintf(stderr,
               "chaos: %zu kills (%s); job SUCCEEDED after %d attempts, test accuracy %.4f vs "
               "%.4f undisturbed; %zu jobs submitted during it all SUCCEEDED\n",
               kills.size(), schedule.c_str(), st.attempts(), st.test_accuracy(),
               ref_done->test_accuracy(), submitted.size());
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

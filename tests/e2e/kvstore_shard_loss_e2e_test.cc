// End to end: a kvstore shard SIGKILLed under a running KVSTORE job, and the
// kvstore jobs of finished attempts.
//
// A local cluster (`trainctl cluster up`: scheduler, 2 kvstore shards, 2
// trainers) runs a 2-trainer MLP job whose gradients go through both shards
// (SYNCHRONOUS rounds). Killing shard 1 (unreplicated, not restarted) must
// make both ranks end the attempt within 10 s (the trainers'
// --kvstore_unavailable_timeout_s, 5 s, plus a heartbeat), and the job
// must reach a final state within 120 s, never hang: every later attempt
// fails fast too (its CreateJob cannot reach shard 1), until the scheduler's
// attempt limit (3 here: each failed attempt after the first takes about
// 11 s, and two of them show "every later attempt" as the default 5 did).
// The surviving shard keeps none of the attempts' kvstore jobs (deleted
// after FAILED). Jobs that end SUCCEEDED or CANCELLED leave nothing on
// either shard either. And a shard that is restarted (as Kubernetes or
// `cluster up` restarts it) comes back without the job: the attempt ends
// retryably (the client's ABORTED, LostJobStateError) and the job resumes
// on a new attempt and succeeds.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

// Waits until `id` is RUNNING and rank 0 reported a step; returns its status.
v1::JobStatus WaitForProgress(TestCluster& cluster, const std::string& id) {
  return OrFail(cluster.PollJob(
                    id,
                    [](const v1::JobStatus& st) {
                      return st.state() == v1::RUNNING && (st.step() > 0 || st.epoch() > 0);
                    },
                    absl::Seconds(90)),
                "Get");
}

// Waits up to `timeout` for kvstore job `kv_job` to be gone from the shards
// in `shards`; true if it is.
bool GoneFrom(TestCluster& cluster, const std::vector<int>& shards, const std::string& kv_job,
              absl::Duration timeout) {
  return PollUntil(
      timeout,
      [&] {
        bool gone = true;
        for (int i : shards) gone = gone && absl::IsNotFound(cluster.KvstoreJobOnShard(i, kv_job));
        return gone;
      },
      absl::Milliseconds(100));
}

TEST(KvstoreShardLossE2eTest, KilledShardEndsTheAttemptWithinSecondsAndTheJobNeverHangs) {
  absl::StatusOr<std::unique_ptr<TestCluster>> started =
      TestCluster::Start({.name = "shard-loss",
                          .trainers = 2,
                          .kvstore_shards = 2,
                          .heartbeat_timeout_s = 3,
                          .flags = "--max_attempts=3"});
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;
  // Long enough that it is still running when the shard dies.
  absl::StatusOr<v1::JobStatus> submitted = cluster.Submit(KvstoreMlpJob("shard-loss", 1000, 2048));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  const v1::JobStatus running = WaitForProgress(cluster, id);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.DebugString();
  ASSERT_EQ(running.attempts(), 1);
  // The attempt's kvstore job lives on both shards.
  const std::string kv1 = id + "-a1";
  ASSERT_TRUE(cluster.KvstoreJobOnShard(0, kv1).ok());
  ASSERT_TRUE(cluster.KvstoreJobOnShard(1, kv1).ok());

  ASSERT_TRUE(cluster.Kill("kvstore-1", SIGKILL).ok());
  const absl::Time killed = absl::Now();

  // Both ranks end attempt 1: each trainer logs its rank's final state.
  auto ended = [&](int rank) {
    const std::string needle = absl::StrCat("job ", id, " rank ", rank, " ");
    for (const char* trainer : {"trainer-0", "trainer-1"}) {
      const std::string log = cluster.Log(trainer);
      for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) {
        const std::string rest = log.substr(at + needle.size(), 10);
        if (rest.rfind("FAILED:", 0) == 0 || rest.rfind("CANCELLED:", 0) == 0) return true;
      }
    }
    return false;
  };
  absl::Duration both_ended = absl::InfiniteDuration();
  for (absl::Time end = killed + absl::Seconds(60); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(50))) {
    if (ended(0) && ended(1)) {
      both_ended = absl::Now() - killed;
      break;
    }
  }
  EXPECT_LE(both_ended, absl::Seconds(10)) << "both ranks ended attempt 1 after " << both_ended;
  RecordProperty("attempt_ended_ms", static_cast<int>(absl::ToInt64Milliseconds(both_ended)));

  // A final state within 120 s of the kill.
  absl::StatusOr<v1::JobStatus> done =
      cluster.WatchToEnd(id, absl::Seconds(120) - (absl::Now() - killed));
  ASSERT_TRUE(done.ok()) << "no final state within 120 s of the kill: " << done.status();
  RecordProperty("final_state_ms",
                 static_cast<int>(absl::ToInt64Milliseconds(absl::Now() - killed)));
  EXPECT_EQ(done->state(), v1::FAILED) << done->DebugString();
  // It failed because of the lost shard, retryably at first (requeued).
  bool requeued = false;
  for (const v1::JobEvent& e : done->events()) {
    requeued =
        requeued || (e.state() == v1::QUEUED && e.reason().find("requeued") != std::string::npos);
  }
  EXPECT_TRUE(requeued) << done->DebugString();
  ASSERT_GT(done->events_size(), 0);
  const std::string& why = done->events(done->events_size() - 1).reason();
  EXPECT_NE(why.find(cluster.shard(1).address), std::string::npos) << done->DebugString();

  // Every attempt up to the limit was made (and failed), then the job failed
  // for good; the surviving shard kept no attempt's kvstore job (deleted
  // after FAILED).
  ASSERT_EQ(done->attempts(), 3) << done->DebugString();
  for (int attempt = 1; attempt <= done->attempts(); ++attempt) {
    const std::string kv = absl::StrCat(id, "-a", attempt);
    EXPECT_TRUE(GoneFrom(cluster, {0}, kv, absl::Seconds(15))) << kv;
  }
  EXPECT_GE(cluster.CountInLog("kvstore-0", "deleted job '" + kv1 + "'"), 1);
  absl::StatusOr<std::vector<std::string>> left = cluster.ShardJobs(0);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty()) << (*left)[0];
}

TEST(KvstoreShardLossE2eTest, SucceededAndCancelledJobsLeaveNothingOnTheShards) {
  absl::StatusOr<std::unique_ptr<TestCluster>> started = TestCluster::Start(
      {.name = "cleanup", .trainers = 2, .kvstore_shards = 2, .heartbeat_timeout_s = 3});
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;

  // SUCCEEDED: both ranks leave; each shard drops the job when the second
  // one leaves.
  absl::StatusOr<v1::JobStatus> ok = cluster.Submit(KvstoreMlpJob("ok", 1, 256));
  ASSERT_TRUE(ok.ok()) << ok.status();
  absl::StatusOr<v1::JobStatus> done = cluster.WatchToEnd(ok->id(), absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->DebugString();
  const std::string kv_ok = ok->id() + "-a1";
  EXPECT_TRUE(GoneFrom(cluster, {0, 1}, kv_ok, absl::Seconds(10)));
  for (const char* shard : {"kvstore-0", "kvstore-1"}) {
    EXPECT_EQ(cluster.CountInLog(shard, "created job=" + kv_ok + " "), 1) << shard;
    EXPECT_EQ(cluster.CountInLog(shard, "deleted job '" + kv_ok + "' (every worker left)"), 1)
        << shard;
  }

  // CANCELLED mid-run: the ranks stop and delete it.
  absl::StatusOr<v1::JobStatus> long_job = cluster.Submit(KvstoreMlpJob("cancelled", 1000, 2048));
  ASSERT_TRUE(long_job.ok()) << long_job.status();
  const v1::JobStatus running = WaitForProgress(cluster, long_job->id());
  ASSERT_EQ(running.state(), v1::RUNNING) << running.DebugString();
  const std::string kv_cancelled = long_job->id() + "-a1";
  ASSERT_TRUE(cluster.KvstoreJobOnShard(0, kv_cancelled).ok());
  ASSERT_TRUE(cluster.Cancel(long_job->id()).ok());
  done = cluster.WatchToEnd(long_job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::CANCELLED) << done->DebugString();
  EXPECT_TRUE(GoneFrom(cluster, {0, 1}, kv_cancelled, absl::Seconds(10)));
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::vector<std::string>> left = cluster.ShardJobs(i);
    ASSERT_TRUE(left.ok()) << left.status();
    EXPECT_TRUE(left->empty()) << "shard " << i << " still holds " << (*left)[0];
  }
}

// SIGKILL of a shard that the cluster's supervisor restarts: the shard
// comes back empty on the same address, the ranks' pushes there are
// ABORTED ("no longer has this job's state"), the scheduler requeues the
// job, and the new attempt runs to SUCCEEDED, within 120 s of the kill.
TEST(KvstoreShardLossE2eTest, RestartedShardLosesTheJobAndTheJobResumesOnANewAttempt) {
  absl::StatusOr<std::unique_ptr<TestCluster>> started =
      TestCluster::Start({.name = "shard-restart",
                          .trainers = 2,
                          .kvstore_shards = 2,
                          .restart = true,
                          .heartbeat_timeout_s = 3});
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;
  absl::StatusOr<v1::JobStatus> submitted =
      cluster.Submit(KvstoreMlpJob("shard-restart", 60, 2048));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  const v1::JobStatus running = WaitForProgress(cluster, id);
  ASSERT_EQ(running.state(), v1::RUNNING) << running.DebugString();
  ASSERT_TRUE(cluster.KvstoreJobOnShard(1, id + "-a1").ok());
  const int old_pid = cluster.shard(1).pid;
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  const absl::Time killed = absl::Now();

  absl::StatusOr<v1::JobStatus> done =
      cluster.WatchToEnd(id, absl::Seconds(120) - (absl::Now() - killed));
  ASSERT_TRUE(done.ok()) << "no final state within 120 s of the kill: " << done.status();
  RecordProperty("final_state_ms",
                 static_cast<int>(absl::ToInt64Milliseconds(absl::Now() - killed)));
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->DebugString();
  EXPECT_GE(done->attempts(), 2) << done->DebugString();
  // Requeued because of shard 1 (its address in the rank's reason: while
  // it restarts UNAVAILABLE, once back ABORTED, no longer having the job).
  bool requeued_for_shard = false;
  for (const v1::JobEvent& e : done->events()) {
    requeued_for_shard =
        requeued_for_shard ||
        (e.state() == v1::QUEUED && e.reason().find(cluster.shard(1).address) != std::string::npos);
  }
  EXPECT_TRUE(requeued_for_shard) << done->DebugString();
  // The supervisor restarted shard 1: it listened again on its address.
  EXPECT_GE(cluster.CountInLog("kvstore-1", "kvstore listening on port"), 2);
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

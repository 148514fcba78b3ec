// End to end: a kvstore replica SIGKILLed under a running KVSTORE job.
//
// A local cluster (`trainctl cluster up --kvstore_shards=2
// --kvstore_replicas=2`: scheduler, 2 chains of 2 kvstore replicas, 2
// trainers; the supervisor restarts what dies, as Kubernetes would) runs a
// 2-trainer MLP job synchronizing through both shards (SYNCHRONOUS rounds,
// a checkpoint after every epoch) undisturbed, then again with the head of
// shard 0 SIGKILLed mid-job. The job must SUCCEED on its first attempt (no
// requeue), and its final parameters (its last checkpoint) must equal the
// undisturbed run's within 1e-6 relative: no push lost or applied twice. The
// killed replica comes back as a new process and rejoins its chain (state
// transfer while the job runs); both chains end with 2 ACTIVE replicas.
// Then, with two KVClient workers of 1 KiB rounds (answered by the chain's
// tail), the head or the tail SIGKILLed while a round waits for a late
// worker: every round's value is still exactly its pushes' sum.
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/status.h"
#include "libs/checkpoint/checkpoint.h"
#include "libs/kvstore/client.h"
#include "libs/kvstore/shard_map.h"
#include "libs/tensor/dtype.h"
#include "tests/e2e/test_cluster.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;

constexpr int kEpochs = 4;

v1::SubmitRequest Job(const std::string& name) {
  // 2-6 s an epoch: trainers report progress every second, so the status
  // must not move by more than an epoch between reports.
  v1::SubmitRequest r = KvstoreMlpJob(name, kEpochs, 3 * 16384);
  r.mutable_spec()->set_checkpoint_interval_epochs(1);
  r.mutable_spec()->set_momentum(0.9);
  r.mutable_spec()->set_test_limit(1000);
  return r;
}

v1::JobStatus WatchToEnd(TestCluster& cluster, const std::string& id) {
  absl::StatusOr<v1::JobStatus> last = cluster.WatchToEnd(id, absl::Seconds(300));
  EXPECT_TRUE(last.ok()) << last.status();
  return last.ok() ? *last : v1::JobStatus();
}

// Chains of `map` with `replicas` ACTIVE members each.
bool Full(const kvstore::v1::ShardMap& map, int replicas) {
  if (map.chains_size() != 2) return false;
  for (const kvstore::v1::Chain& c : map.chains()) {
    int active = 0;
    for (const kvstore::v1::ChainMember& m : c.members()) {
      active += m.state() == kvstore::v1::REPLICA_ACTIVE;
    }
    if (active != replicas || c.members_size() != replicas) return false;
  }
  return true;
}

// The started cluster's kvstore map, with every chain full (2 ACTIVE
// replicas); an error naming what is not.
absl::StatusOr<kvstore::v1::ShardMap> FullMap(TestCluster& cluster) {
  DT_ASSIGN_OR_RETURN(kvstore::v1::ShardMap map, cluster.KvstoreMap());
  if (!Full(map, 2)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the kvstore chains are not full: ", map.DebugString()));
  }
  return map;
}

// Largest relative difference between two checkpoints' f32 tensors (1 when
// they differ in names or shapes).
double MaxRelativeDifference(const checkpoint::Checkpoint& a, const checkpoint::Checkpoint& b,
                             int* compared) {
  *compared = 0;
  if (a.tensors.size() != b.tensors.size()) return 1;
  double worst = 0;
  for (const checkpoint::TensorRecord& ta : a.tensors) {
    const checkpoint::TensorRecord* tb = b.Find(ta.name);
    if (tb == nullptr || tb->shape != ta.shape || tb->data.size() != ta.data.size()) return 1;
    if (ta.dtype != static_cast<int32_t>(DType::kF32)) {
      if (ta.data != tb->data) return 1;
      continue;
    }
    const size_t n = ta.data.size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float x, y;
      std::memcpy(&x, ta.data.data() + i * 4, 4);
      std::memcpy(&y, tb->data.data() + i * 4, 4);
      const double scale = std::max({std::fabs(x), std::fabs(y), 1e-12f});
      worst = std::max(worst, std::fabs(static_cast<double>(x) - y) / scale);
    }
    ++*compared;
  }
  return worst;
}

TEST(KvstoreReplicaE2eTest, AKilledReplicaCostsNoAttemptAndNoPrecision) {
  absl::StatusOr<std::unique_ptr<TestCluster>> started =
      TestCluster::Start({.name = "replica",
                          .trainers = 2,
                          .kvstore_shards = 2,
                          .kvstore_replicas = 2,
                          .restart = true,
                          .heartbeat_timeout_s = 3});
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;
  absl::StatusOr<kvstore::v1::ShardMap> map = FullMap(cluster);
  ASSERT_TRUE(map.ok()) << map.status();

  absl::StatusOr<v1::JobStatus> ref = cluster.Submit(Job("undisturbed"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  *ref = WatchToEnd(cluster, ref->id());
  ASSERT_EQ(ref->state(), v1::SUCCEEDED) << ref->DebugString();

  absl::StatusOr<v1::JobStatus> job = cluster.Submit(Job("replica-killed"));
  ASSERT_TRUE(job.ok()) << job.status();
  // Mid-job: epoch 2 has begun, and at least one more is to come.
  absl::StatusOr<v1::JobStatus> mid = cluster.PollJob(
      job->id(),
      [](const v1::JobStatus& j) {
        return j.state() == v1::RUNNING && j.epoch() >= 1 && j.step() > 0;
      },
      absl::Seconds(120));
  ASSERT_TRUE(mid.ok()) << mid.status();
  v1::JobStatus st = *mid;
  ASSERT_EQ(st.state(), v1::RUNNING) << st.DebugString();
  ASSERT_LE(st.epoch(), kEpochs - 2) << "not mid-job: " << st.DebugString();
  map = cluster.KvstoreMap();
  ASSERT_TRUE(map.ok()) << map.status();
  const kvstore::v1::ChainMember* head = kvstore::ChainHead(*map, 0);
  ASSERT_NE(head, nullptr) << map->DebugString();
  const ClusterProcess& victim = cluster.replica(0, head->replica());
  ASSERT_EQ(victim.address, head->address());
  const int64_t seen_at_kill = st.epoch() * st.steps_per_epoch() + st.step();
  ASSERT_EQ(kill(victim.pid, SIGKILL), 0);
  const absl::Time killed = absl::Now();

  // The scheduler's map drops the dead head (it timed out, or came back as
  // a new process); training goes on past the step seen at the kill.
  absl::Duration map_changed = absl::InfiniteDuration(), progressed = absl::InfiniteDuration();
  for (absl::Time end = killed + absl::Seconds(60);
       absl::Now() < end &&
       (map_changed == absl::InfiniteDuration() || progressed == absl::InfiniteDuration());
       absl::SleepFor(absl::Milliseconds(20))) {
    absl::StatusOr<kvstore::v1::ShardMap> now = cluster.KvstoreMap();
    if (now.ok() && map_changed == absl::InfiniteDuration()) {
      const kvstore::v1::ChainMember* h = kvstore::ChainHead(*now, 0);
      if (h == nullptr || h->incarnation() != head->incarnation())
        map_changed = absl::Now() - killed;
    }
    absl::StatusOr<v1::JobStatus> got = cluster.Get(job->id());
    if (got.ok() && got->epoch() * got->steps_per_epoch() + got->step() > seen_at_kill + 1 &&
        progressed == absl::InfiniteDuration()) {
      progressed = absl::Now() - killed;
    }
    if (got.ok() && IsFinal(got->state())) break;
  }
  v1::JobStatus done = WatchToEnd(cluster, job->id());
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.attempts(), 1) << done.DebugString();
  int queued = 0;
  for (const v1::JobEvent& e : done.events()) {
    queued += e.state() == v1::QUEUED;
    EXPECT_NE(e.state(), v1::FAILED) << e.reason();
  }
  EXPECT_EQ(queued, 1) << done.DebugString();  // submitted, never requeued
  EXPECT_LT(map_changed, absl::Seconds(10));
  EXPECT_LT(progressed, absl::Seconds(15));

  // The same parameters as the undisturbed run.
  absl::StatusOr<checkpoint::Checkpoint> a = checkpoint::ReadCheckpoint(ref->checkpoint_path());
  absl::StatusOr<checkpoint::Checkpoint> b = checkpoint::ReadCheckpoint(done.checkpoint_path());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(done.checkpoint_epoch(), kEpochs);
  int compared = 0;
  const double diff = MaxRelativeDifference(*a, *b, &compared);
  EXPECT_GE(compared, 2);  // MLP weights and biases at least
  EXPECT_LE(diff, 1e-6);
  EXPECT_DOUBLE_EQ(done.test_accuracy(), ref->test_accuracy());

  // The killed replica came back (the supervisor) and rejoined its chain.
  bool full = false;
  for (absl::Time end = absl::Now() + absl::Seconds(60); !full && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(100))) {
    map = cluster.KvstoreMap();
    full = map.ok() && Full(*map, 2);
  }
  EXPECT_TRUE(full) << (map.ok() ? map->DebugString() : map.status().ToString());
  EXPECT_GE(cluster.CountInLog(cluster.replica(0, 1 - head->replica()).name, "took over"), 1);
  std::fprintf(stderr,
               "head of shard 0 killed at step %lld: map changed after %s, training past it after "
               "%s; %d tensors, max relative difference %g; attempts %d\n",
               static_cast<long long>(seen_at_kill), absl::FormatDuration(map_changed).c_str(),
               absl::FormatDuration(progressed).c_str(), compared, diff, done.attempts());
}

// A small PushPull whose round waits for a late worker: its push is held
// at the head (no thread waits for it; the round goes down the chain as
// one batch) and its pull waits for the tail's answer. SIGKILL the head
// (`kill_tail` false) or the tail then: the waiting worker sees its
// connection close and its retry reaches the chain that is left, and every
// round's value is exactly its workers' sum (a push lost or applied twice
// would change it).
void KillAReplicaWhileARoundWaits(bool kill_tail) {
  absl::StatusOr<std::unique_ptr<TestCluster>> started =
      TestCluster::Start({.name = kill_tail ? "waittail" : "parked",
                          .trainers = 2,
                          .kvstore_shards = 2,
                          .kvstore_replicas = 2,
                          .heartbeat_timeout_s = 3});
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;
  absl::StatusOr<kvstore::v1::ShardMap> map = FullMap(cluster);
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<std::unique_ptr<kvstore::KVClient>> workers;
  for (int w = 0; w < 2; ++w) {
    kvstore::ClientOptions o;
    for (const ClusterProcess& p : cluster.kvstore_processes()) o.servers.push_back(p.address);
    o.replicas = 2;
    o.job = "parked";
    o.worker = w;
    o.unavailable_timeout = absl::Seconds(60);
    o.pull_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<kvstore::KVClient>> c = kvstore::KVClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    workers.push_back(std::move(*c));
  }
  kvstore::JobConfig config;
  config.job = "parked";
  config.num_workers = 2;           // no optimizer: a round's value is its pushes' sum
  constexpr int64_t kFloats = 256;  // 1 KiB: held at the head, answered by the tail
  for (auto& w : workers) {
    ASSERT_TRUE(w->CreateJob(config).ok());
    ASSERT_TRUE(w->Init({{"w", {kFloats}}}).ok());
  }
  constexpr int kRounds = 6, kLateRound = 4;
  std::atomic<bool> parked{false};
  std::vector<std::vector<float>> got(2 * kRounds);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (int r = 1; r <= kRounds && status[w].ok(); ++r) {
        std::vector<float> g(kFloats, static_cast<float>((w + 1) * r)), out(kFloats, -1);
        if (r == kLateRound) {
          if (w == 0) parked = true;
          if (w == 1) absl::SleepFor(absl::Seconds(2));  // worker 0 waits for it, parked
        }
        status[w] = workers[w]->PushPull({{"w", g.data(), out.data()}});
        got[static_cast<size_t>(2 * (r - 1) + w)] = out;
      }
    });
  }
  while (!parked) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(300));  // worker 0's round-4 PushPull is parked
  const kvstore::v1::ChainMember* member =
      kill_tail ? kvstore::ChainTail(*map, 0) : kvstore::ChainHead(*map, 0);
  ASSERT_NE(member, nullptr);
  const ClusterProcess& victim = cluster.replica(0, member->replica());
  ASSERT_EQ(kill(victim.pid, SIGKILL), 0);
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(status[w].ok()) << "worker " << w << ": " << status[w];
  for (int r = 1; r <= kRounds; ++r) {
    for (int w = 0; w < 2; ++w) {
      EXPECT_EQ(got[static_cast<size_t>(2 * (r - 1) + w)],
                std::vector<float>(kFloats, static_cast<float>(3 * r)))
          << "worker " << w << " round " << r;
    }
  }
}

TEST(KvstoreReplicaE2eTest, AHeadKilledWhileARoundWaitsLosesNoPush) {
  KillAReplicaWhileARoundWaits(/*kill_tail=*/false);
}

TEST(KvstoreReplicaE2eTest, ATailKilledWhileARoundWaitsForItsAnswerLosesNoPush) {
  KillAReplicaWhileARoundWaits(/*kill_tail=*/true);
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

// The one cluster of the end-to-end tests: a local cluster that `trainctl
// cluster up` starts (scheduler, kvstore shards and replicas, trainer
// daemons; mutual TLS by default), owned by a test and torn down when it goes
// out of scope, after TensorFlow's grpc_testlib.h TestCluster:
//
//   ClusterOptions o;
//   o.name = "drain";
//   o.trainers = 3;
//   o.users = {"alice"};
//   absl::StatusOr<std::unique_ptr<TestCluster>> c = TestCluster::Start(o);
//   ASSERT_TRUE(c.ok()) << c.status();
//   absl::StatusOr<JobStatus> job = (*c)->Submit(MomentumLenetJob("j", 4, 12288), "alice");
//   absl::StatusOr<JobStatus> mid = (*c)->WaitMidEpoch(job->id(), {});
//   ASSERT_TRUE((*c)->KillTrainer(mid->trainers(0), SIGKILL).ok());
//   absl::StatusOr<JobStatus> done = (*c)->WatchToEnd(job->id(), absl::Seconds(300));
//
// ClusterTest is the GoogleTest fixture around one (cluster_, Up, and calls
// that fail the test instead of returning a status). PollUntil below is the
// poll every e2e test uses, also those that start their processes
// themselves (the scheduler alone, network namespaces) or test `cluster up`
// itself (TestCluster::Adopt tears down a cluster such a test started).
//
// This header needs the scheduler's messages only. A test that calls the
// scheduler's gRPC service itself (deadlines, stubs as a user, Watch)
// includes tests/e2e/test_cluster_rpc.h as well: the gRPC headers are most
// of an e2e test's compile time, and most tests do not need them.
//
// Teardown (the destructor): SIGCONT to the cluster's processes (one a test
// stopped), `trainctl cluster down --grace_s=<down_grace_s>`,
// then SIGKILL to every process of cluster.json (as listed at start-up and at
// teardown) and every process whose command line names the cluster's
// directory (the supervisor, anything restarted). When the test has failed,
// the processes' logs and cluster.json are then copied to
// $TEST_UNDECLARED_OUTPUTS_DIR/<name>/ (Bazel's outputs.zip of the test). A
// TestCluster is used by one test thread.
#ifndef DTRAIN_TESTS_E2E_TEST_CLUSTER_H_
#define DTRAIN_TESTS_E2E_TEST_CLUSTER_H_

#include <signal.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "libs/rpc/credentials.h"
#include "protos/kvstore.pb.h"
#include "protos/scheduler.pb.h"
#include "tests/e2e/e2e_util.h"

namespace dtrain {
namespace e2e {

// ---- Polling (every e2e test) ----

// Calls `done` until it returns true (then true) or `timeout` passes (then
// false, after one last call), sleeping `interval` between calls.
bool PollUntil(absl::Duration timeout, const std::function<bool()>& done,
               absl::Duration interval = absl::Milliseconds(20));

// SUCCEEDED, FAILED or CANCELLED.
bool IsFinal(scheduler::v1::JobState s);

// The value of `v`, or T() after failing the test (non-fatally) with `what`
// and v's status.
template <typename T>
T OrFail(absl::StatusOr<T> v, const char* what = "") {
  if (v.ok()) return *std::move(v);
  ADD_FAILURE() << what << (*what ? ": " : "") << v.status();
  return T();
}

// ---- Jobs the tests run ----

// LeNet on 2 trainers, global batch 128, lr 0.05 with momentum 0.9
// (checkpoints and the state sent to a replacement carry the momentum
// buffers), kaiming init, seed 3, `train_limit` images an epoch (12288: 96
// steps), 2000 test images, one thread a trainer, a checkpoint every epoch,
// ALLREDUCE.
scheduler::v1::SubmitRequest MomentumLenetJob(const std::string& name, int epochs,
                                              int64_t train_limit);

// The smallest useful job: one trainer, an MLP, one epoch of `train_limit`
// images, global batch 64, lr 0.1, 64 test images, one thread.
scheduler::v1::SubmitRequest SmallMlpJob(const std::string& name, int64_t train_limit);

// SmallMlpJob with `epochs` and seed 1 on 2 trainers synchronizing through
// the kvstore (SYNCHRONOUS).
scheduler::v1::SubmitRequest KvstoreMlpJob(const std::string& name, int epochs,
                                           int64_t train_limit);

// ---- The cluster ----

struct ClusterOptions {
  // Its directory: $TEST_TMPDIR/<name>; empty: "cluster" (ClusterTest::Up:
  // the test's name).
  std::string name;
  int trainers = 2;
  int kvstore_shards = 0;
  int kvstore_replicas = 1;  // per shard; 0: cluster up's default (2 when there are shards)
  bool tls = true;           // false: `cluster up --insecure`
  // User certificates (role user) issued in <dir>/certs after start-up:
  // Submit(request, user), Credentials(user), TrainctlAs(user, ...).
  std::vector<std::string> users;
  bool restart = false;            // --restart=always (the supervisor restarts) or never
  double heartbeat_timeout_s = 0;  // 0: the scheduler's default (10 s)
  std::string env;                 // "VAR=value ..." for the cluster's processes
  std::string flags;               // more `cluster up` flags
  int down_grace_s = 5;            // teardown's `cluster down --grace_s`
};

// Where WaitMidEpoch waits: epochs counted from 1 as a user does.
struct MidEpoch {
  int first_epoch = 2, last_epoch = 3;
  int64_t min_step = 1;        // at least this many steps into the epoch
  int64_t min_steps_left = 1;  // and at least this many steps before its end
  absl::Duration timeout = absl::Seconds(120);
};

class TestCluster {
 public:
  using JobStatus = scheduler::v1::JobStatus;

  // Starts the cluster (`trainctl cluster up`), issues the users'
  // certificates and makes this process use the cluster's admin credential
  // (unless !tls). On failure whatever started is torn down and the error
  // holds up's output.
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(const ClusterOptions& options);
  // A cluster the test started itself in `dir` (a test of `cluster up`):
  // only the teardown, and the accessors that read cluster.json.
  static std::unique_ptr<TestCluster> Adopt(const std::string& dir, int down_grace_s = 5);
  ~TestCluster();
  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& up_output() const { return up_output_; }  // `cluster up`'s output
  const ClusterProcess& scheduler() const { return scheduler_; }
  // The scheduler's stubs as the admin (defined in test_cluster_rpc.h).
  struct Stubs;
  Stubs& stubs() { return *stubs_; }

  // ---- Jobs (through the scheduler, as the admin or as a user) ----
  absl::StatusOr<JobStatus> Submit(const scheduler::v1::SubmitRequest& r,
                                   const std::string& user = "");
  absl::StatusOr<JobStatus> Get(const std::string& id);
  absl::Status Cancel(const std::string& id);
  // Watches job `id` until it ends; its last status.
  absl::StatusOr<JobStatus> WatchToEnd(const std::string& id, absl::Duration timeout);
  // Polls job `id` every 100 ms until `until(status)` holds, the job ends or
  // `timeout` passes; the last status (an error only when Get fails). Rank 0
  // reports progress once a second, so faster polls would see nothing new
  // and cost the scheduler an RPC each.
  absl::StatusOr<JobStatus> PollJob(const std::string& id,
                                    const std::function<bool(const JobStatus&)>& until,
                                    absl::Duration timeout);
  // Polls until job `id` is RUNNING in epoch `epoch` (from 1) or later, or
  // ends; FAILED_PRECONDITION (with the status) when it did not get there.
  absl::StatusOr<JobStatus> WaitEpoch(const std::string& id, int epoch,
                                      absl::Duration timeout = absl::Seconds(120));
  // Polls until job `id` is RUNNING inside one of the epochs
  // `w.first_epoch`..`w.last_epoch`, within the step window;
  // FAILED_PRECONDITION (with the last status) when the job passed the last
  // epoch, ended or the timeout passed first. Rank 0 reports progress once a
  // second and a test epoch can take about as long, so allow several epochs.
  absl::StatusOr<JobStatus> WaitMidEpoch(const std::string& id, const MidEpoch& w);

  // ---- Users (ClusterOptions::users; "admin" is always there) ----
  std::shared_ptr<const rpc::Credentials> Credentials(const std::string& user) const;
  // Issues one more certificate in <dir>/certs (`trainctl certs issue`):
  // role user, admin, trainer, kvstore or scheduler.
  absl::Status IssueCertificate(const std::string& name, const std::string& role) const;
  // trainctl against this cluster with `user`'s certificate.
  std::string TrainctlAs(const std::string& user, const std::string& args, int* rc) const;

  // ---- Processes ----
  // The processes cluster.json lists now (pids change when one restarts),
  // of `role` (scheduler, kvstore, trainer) or all of them.
  std::vector<ClusterProcess> Processes(const std::string& role = "") const;
  // The process named `name` in cluster.json (e.g. "kvstore-1", "trainer-0").
  absl::StatusOr<ClusterProcess> Process(const std::string& name) const;
  // Sends `sig` (SIGKILL, SIGTERM, SIGSTOP, ...) to the process `name`.
  absl::Status Kill(const std::string& name, int sig = SIGKILL) const;
  // Sends `sig` to the trainer daemon registered as `trainer_id` (the ids of
  // JobStatus.trainers).
  absl::Status KillTrainer(const std::string& trainer_id, int sig = SIGKILL) const;
  // The trainers: registered id -> pid.
  std::map<std::string, int> TrainerPids() const { return e2e::TrainerPids(dir_); }
  // The text of <dir>/<process>.log, and the occurrences of `needle` in it.
  std::string Log(const std::string& process) const;
  int CountInLog(const std::string& process, const std::string& needle) const;

  // ---- Metrics ----
  // The value of sample `series` on process `name`'s /metrics, or -1.
  double Metric(const std::string& name, const std::string& series) const;
  double SchedulerMetric(const std::string& series) const;

  // ---- The kvstore (kvstore_shards > 0) ----
  // kvstore-<i> (replicas == 1) or kvstore-<shard>-<j>, as at start-up.
  const ClusterProcess& shard(int i) const { return kvstore_[static_cast<size_t>(i)]; }
  const ClusterProcess& replica(int shard, int j) const {
    return kvstore_[static_cast<size_t>(shard * replicas_ + j)];
  }
  int replicas() const { return replicas_; }
  const std::vector<ClusterProcess>& kvstore_processes() const { return kvstore_; }
  // The scheduler's shard map (JobService.GetKvstoreMap).
  absl::StatusOr<kvstore::v1::ShardMap> KvstoreMap();
  // GetJob of kvstore job `kv_job` on shard `i`: OK, NOT_FOUND, or the error.
  absl::Status KvstoreJobOnShard(int i, const std::string& kv_job) const;
  // The jobs a kvstore process reports in its per-job metric series
  // (dtrain_kvstore_slices{job=...}), or an error if it cannot be scraped.
  absl::StatusOr<std::vector<std::string>> JobsOn(const ClusterProcess& p) const;
  absl::StatusOr<std::vector<std::string>> ShardJobs(int i) const { return JobsOn(shard(i)); }

 private:
  TestCluster();
  void ReadProcesses();

  std::string dir_, up_output_;
  int down_grace_s_ = 5;
  int replicas_ = 1;
  ClusterProcess scheduler_;
  std::vector<ClusterProcess> kvstore_;
  std::vector<ClusterProcess> started_;  // cluster.json at start-up
  std::unique_ptr<Stubs> stubs_;
};

// The GoogleTest fixture around one TestCluster (cluster_, made by Up):
//
//   class DrainE2eTest : public ClusterTest {
//     void SetUp() override { Up({.name = "drain", .trainers = 3}); }
//   };
//
// Its job calls fail the test (non-fatally) and return an empty status
// instead of returning an error. TearDown drops the cluster.
class ClusterTest : public ::testing::Test {
 protected:
  using JobStatus = scheduler::v1::JobStatus;

  // Starts cluster_; a failure is fatal to the test (from a test body:
  // ASSERT_NO_FATAL_FAILURE(Up(...))). An empty options.name: the test's.
  void Up(ClusterOptions options);
  void TearDown() override { cluster_.reset(); }

  JobStatus Submit(const scheduler::v1::SubmitRequest& r) { return OrFail(cluster_->Submit(r)); }
  JobStatus Get(const std::string& id) { return OrFail(cluster_->Get(id), "Get"); }
  void Cancel(const std::string& id) { EXPECT_TRUE(cluster_->Cancel(id).ok()); }
  JobStatus WatchToEnd(const std::string& id, absl::Duration timeout) {
    return OrFail(cluster_->WatchToEnd(id, timeout), "WatchToEnd");
  }
  JobStatus PollJob(const std::string& id, const std::function<bool(const JobStatus&)>& until,
                    absl::Duration timeout) {
    return OrFail(cluster_->PollJob(id, until, timeout), "PollJob");
  }
  // The last status; the test fails when the job was not mid-epoch.
  JobStatus WaitMidEpoch(const std::string& id, const MidEpoch& w);
  std::map<std::string, int> TrainerPids() const { return cluster_->TrainerPids(); }
  double SchedulerMetric(const std::string& series) const {
    return cluster_->SchedulerMetric(series);
  }
  const std::string& dir() const { return cluster_->dir(); }
  const std::string& scheduler() const { return cluster_->scheduler().address; }

  std::unique_ptr<TestCluster> cluster_;
};

}  // namespace e2e
}  // namespace dtrain

#endif  // DTRAIN_TESTS_E2E_TEST_CLUSTER_H_

// A GoogleTest fixture around a local cluster that `trainctl cluster up`
// starts (mutual TLS with the cluster's admin credential), for the end-to-end
// tests that run jobs on it and disturb them (drain, resume, recover,
// straggler):
//
//   class DrainE2eTest : public ClusterFixture {
//     void SetUp() override { Up("drain", "--trainers=3 --heartbeat_timeout_s=5"); }
//   };
//   TEST_F(DrainE2eTest, X) {
//     v1::JobStatus job = Submit(MomentumLenetJob("drained", 4, 12288));
//     job = WaitMidEpoch(job.id(), {.first_epoch = 2, .last_epoch = 3});
//     ...
//     v1::JobStatus done = WatchToEnd(job.id(), absl::Seconds(300));
//   }
//
// TearDown stops the cluster (`cluster down`, then SIGKILL for whatever
// still runs). A fixture is used by one test thread.
#ifndef DTRAIN_TESTS_E2E_CLUSTER_FIXTURE_H_
#define DTRAIN_TESTS_E2E_CLUSTER_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "protos/scheduler.grpc.pb.h"

namespace dtrain {
namespace e2e {

class ClusterFixture : public ::testing::Test {
 protected:
  using JobStatus = scheduler::v1::JobStatus;

  // Runs `trainctl cluster up --dir=<TmpDir(name)> <flags>` and sets dir_,
  // scheduler_ (its address), scheduler_metrics_port_ and stub_. A failure is
  // fatal to the test (from a test body: ASSERT_NO_FATAL_FAILURE(Up(...))).
  void Up(const std::string& name, const std::string& flags);

  // `cluster down --grace_s=<down_grace_s_>`, then SIGKILL to every process
  // of cluster.json that still runs. Nothing when Up was not called.
  void TearDown() override;

  // A context whose deadline is `timeout` from now.
  static std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout = absl::Seconds(10));

  // The job of the drain, resume and recover tests: LeNet on 2 trainers,
  // global batch 128, lr 0.05 with momentum 0.9 (checkpoints and the state
  // sent to a replacement must carry the momentum buffers), kaiming init,
  // seed 3, `train_limit` images an epoch (12288: 96 steps), 2000 test images,
  // one thread a trainer, a checkpoint every epoch, ALLREDUCE.
  static scheduler::v1::SubmitRequest MomentumLenetJob(const std::string& name, int epochs,
                                                       int64_t train_limit);

  // JobService calls through stub_ with a 10 s deadline; a failed call fails
  // the test (non-fatally) and returns an empty status.
  JobStatus Submit(const scheduler::v1::SubmitRequest& request);
  JobStatus Get(const std::string& id);
  void Cancel(const std::string& id);

  // Watches job `id` until it ends and returns its last status; a failed or
  // timed-out watch fails the test and returns an empty status.
  JobStatus WatchToEnd(const std::string& id, absl::Duration timeout);

  // Polls job `id` every 20 ms until `until(status)` holds, the job ends
  // (SUCCEEDED, FAILED, CANCELLED) or `timeout` passes; the last status.
  JobStatus PollJob(const std::string& id, const std::function<bool(const JobStatus&)>& until,
                    absl::Duration timeout);

  // Where WaitMidEpoch waits: epochs counted from 1 as a user does.
  struct MidEpoch {
    int first_epoch = 2, last_epoch = 3;
    int64_t min_step = 1;        // at least this many steps into the epoch
    int64_t min_steps_left = 1;  // and at least this many steps before its end
    absl::Duration timeout = absl::Seconds(120);
  };
  // Polls job `id` until it is RUNNING inside one of the epochs
  // `w.first_epoch`..`w.last_epoch`, within the step window (it fails the
  // test if it is not by the time the job passes the last epoch, ends or the
  // timeout passes); the last status. Rank 0 reports progress once a second
  // and a test epoch takes about 1.5 s on a quiet machine, so one epoch's
  // window can fall between two reports under load: allow several epochs.
  JobStatus WaitMidEpoch(const std::string& id, const MidEpoch& w);

  // The value of the scheduler's sample `series` (e.g.
  // "dtrain_scheduler_trainers_alive"), or -1 (not scraped, no such sample).
  double SchedulerMetric(const std::string& series) const;

  // The cluster's trainers: registered id -> pid (e2e::TrainerPids).
  std::map<std::string, int> TrainerPids() const;

  static bool IsFinal(scheduler::v1::JobState s);

  int down_grace_s_ = 5;  // TearDown's `cluster down --grace_s`
  std::string dir_;       // the cluster's directory (cluster.json, logs, certs)
  std::string scheduler_;
  int scheduler_metrics_port_ = 0;
  std::unique_ptr<scheduler::v1::JobService::Stub> stub_;
};

}  // namespace e2e
}  // namespace dtrain

#endif  // DTRAIN_TESTS_E2E_CLUSTER_FIXTURE_H_

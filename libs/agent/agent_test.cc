// Agent against a fake ClusterClient (the seam: the gRPC client is
// services/trainer's, tested there and end to end) and real jobs: RunJob
// trains an MLP on a slice of Fashion-MNIST.
#include "libs/agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/base/signals.h"
#include "libs/base/status.h"
#include "libs/collective/store.h"
#include "libs/kvstore/in_process.h"

namespace dtrain {
namespace agent {
namespace {

namespace v1 = scheduler::v1;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kWait = absl::Seconds(60);

// A scheduler in memory: records every call and answers as told.
class FakeCluster : public ClusterClient {
 public:
  absl::StatusOr<v1::RegisterTrainerReply> RegisterTrainer(
      const v1::RegisterTrainerRequest& request) override {
    absl::MutexLock lock(&mu_);
    register_calls_.push_back(request);
    if (unavailable_ || hold_registrations_) return absl::UnavailableError("scheduler unreachable");
    v1::RegisterTrainerReply reply;
    reply.set_trainer_id(absl::StrCat("trainer-", ++registered_));
    if (adopt_ && request.has_running() && !request.previous_trainer_id().empty()) {
      reply.set_trainer_id(request.previous_trainer_id());  // a restarted scheduler adopts it
    }
    reply.set_heartbeat_interval_ms(20);
    known_.insert(reply.trainer_id());
    awaiting_.erase(reply.trainer_id());
    return reply;
  }

  absl::StatusOr<v1::HeartbeatReply> Heartbeat(const v1::HeartbeatRequest& request) override {
    absl::MutexLock lock(&mu_);
    if (unavailable_) return absl::UnavailableError("scheduler unreachable");
    if (known_.count(request.trainer_id()) == 0) {
      return absl::NotFoundError(absl::StrCat("unknown trainer '", request.trainer_id(), "'"));
    }
    heartbeats_.push_back(request);
    v1::HeartbeatReply reply;
    for (auto it = to_assign_.begin(); it != to_assign_.end();) {
      if (it->first.empty() || it->first == request.trainer_id()) {
        *reply.add_assignments() = std::move(it->second);
        it = to_assign_.erase(it);
      } else {
        ++it;
      }
    }
    for (std::string& id : to_cancel_) reply.add_cancel_job_ids(std::move(id));
    to_cancel_.clear();
    for (const auto& [trainer, job] : to_drain_) {
      if (trainer == request.trainer_id()) reply.add_drain_job_ids(job);
    }
    return reply;
  }

  absl::StatusOr<v1::ReportProgressReply> ReportProgress(const v1::ProgressReport& r) override {
    absl::MutexLock lock(&mu_);
    if (unavailable_ || fail_reports_ > 0) {
      if (fail_reports_ > 0) --fail_reports_;
      return absl::UnavailableError("scheduler unreachable");
    }
    if (strict_reports_ && known_.count(r.trainer_id()) == 0) {
      // As Scheduler::ReportProgress answers: a trainer of a job awaiting
      // adoption is asked to try again, any other is unknown.
      if (awaiting_.count(r.trainer_id()) > 0) {
        return absl::UnavailableError("the scheduler restarted and waits for the trainer");
      }
      unknown_reports_.push_back(r);
      return absl::NotFoundError(absl::StrCat("unknown trainer '", r.trainer_id(), "'"));
    }
    reports_.push_back(r);
    v1::ReportProgressReply reply;
    reply.set_stop(stop_jobs_.count(r.job_id()) > 0);
    return reply;
  }

  std::unique_ptr<collective::Store> RendezvousStore(const std::string& trainer_id,
                                                     const std::string& job_id,
                                                     int attempt) override {
    absl::MutexLock lock(&mu_);
    rendezvous_.push_back(absl::StrCat(trainer_id, " ", job_id, " ", attempt));
    return std::make_unique<collective::PrefixStore>(absl::StrCat(job_id, "/", attempt, "/"),
                                                     &store_);
  }

  // Controls.
  // Delivers `a` with the next heartbeat of `trainer_id` (empty: anyone's).
  void Assign(v1::Assignment a, const std::string& trainer_id = "") {
    absl::MutexLock lock(&mu_);
    to_assign_.emplace_back(trainer_id, std::move(a));
  }
  void Cancel(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    to_cancel_.push_back(job_id);
  }
  // Every heartbeat reply to `trainer_id` asks it to drain `job_id`.
  void DrainInReplies(const std::string& trainer_id, const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    to_drain_.emplace_back(trainer_id, job_id);
  }
  void StopInReplies(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    stop_jobs_.insert(job_id);
  }
  void SetUnavailable(bool unavailable) {
    absl::MutexLock lock(&mu_);
    unavailable_ = unavailable;
  }
  void FailNextReports(int n) {
    absl::MutexLock lock(&mu_);
    fail_reports_ = n;
  }
  // Forgets every trainer, like a restarted scheduler (which then awaits
  // the trainers of the jobs that were running).
  void Forget() {
    absl::MutexLock lock(&mu_);
    awaiting_.insert(known_.begin(), known_.end());
    known_.clear();
  }
  // ReportProgress answers as the scheduler does for trainers it does not
  // know (NOT_FOUND, or UNAVAILABLE for one a restart awaits) instead of
  // recording every report.
  void StrictReports() {
    absl::MutexLock lock(&mu_);
    strict_reports_ = true;
  }
  // Registrations fail (UNAVAILABLE) while held, as they may when a
  // restarted scheduler is busy; heartbeats and reports are answered.
  void HoldRegistrations(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_registrations_ = hold;
  }
  // Reports ReportProgress answered NOT_FOUND (StrictReports).
  std::vector<v1::ProgressReport> unknown_reports() const {
    absl::MutexLock lock(&mu_);
    return unknown_reports_;
  }
  // A registration that claims a running job gets its previous id back.
  void AdoptClaims() {
    absl::MutexLock lock(&mu_);
    adopt_ = true;
  }

  // Observations. Polls `done` until it holds or kWait passes; returns
  // whether it holds.
  static bool WaitUntil(const std::function<bool()>& done) {
    for (const absl::Time end = absl::Now() + kWait; absl::Now() < end;) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return done();
  }
  // The final report of `job_id` (attempt 0: any), if one arrived.
  std::optional<v1::ProgressReport> Final(const std::string& job_id, int attempt = 0) const {
    absl::MutexLock lock(&mu_);
    for (const v1::ProgressReport& r : reports_) {
      if (r.job_id() == job_id && r.final_state() != v1::JOB_STATE_UNSPECIFIED &&
          (attempt == 0 || r.attempt() == attempt)) {
        return r;
      }
    }
    return std::nullopt;
  }
  bool HasFinal(const std::string& job_id, int attempt = 0) const {
    return Final(job_id, attempt).has_value();
  }
  std::vector<v1::ProgressReport> Progress(const std::string& job_id) const {
    absl::MutexLock lock(&mu_);
    std::vector<v1::ProgressReport> out;
    for (const v1::ProgressReport& r : reports_) {
      if (r.job_id() == job_id && r.final_state() == v1::JOB_STATE_UNSPECIFIED) out.push_back(r);
    }
    return out;
  }
  int FinalCount() const {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const v1::ProgressReport& r : reports_) n += r.final_state() != v1::JOB_STATE_UNSPECIFIED;
    return n;
  }
  std::vector<v1::HeartbeatRequest> heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<v1::RegisterTrainerRequest> register_calls() const {
    absl::MutexLock lock(&mu_);
    return register_calls_;
  }
  int registered() const {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  std::vector<std::string> rendezvous() const {
    absl::MutexLock lock(&mu_);
    return rendezvous_;
  }

  std::vector<v1::ProgressReport> reports() const {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::ProgressReport> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterTrainerRequest> register_calls_ ABSL_GUARDED_BY(mu_);
  int registered_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> known_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, v1::Assignment>> to_assign_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> to_cancel_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> to_drain_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> stop_jobs_ ABSL_GUARDED_BY(mu_);
  bool unavailable_ ABSL_GUARDED_BY(mu_) = false;
  bool adopt_ ABSL_GUARDED_BY(mu_) = false;
  bool strict_reports_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_registrations_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> awaiting_ ABSL_GUARDED_BY(mu_);  // Forget()'s trainers
  std::vector<v1::ProgressReport> unknown_reports_ ABSL_GUARDED_BY(mu_);
  int fail_reports_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> rendezvous_ ABSL_GUARDED_BY(mu_);
  collective::InMemoryStore store_;
};

// Records what the agent tells its observer (the metrics' view).
class RecordingObserver : public AgentObserver {
 public:
  void OnJobStart(const std::string& job_id, int rank,
                  const std::vector<Device>& devices) override {
    absl::MutexLock lock(&mu_);
    events.push_back(absl::StrCat("start ", job_id, " rank ", rank, " devices ", devices.size()));
  }
  void OnStep(const train::JobProgress& p, const train::StepTimes& t) override {
    absl::MutexLock lock(&mu_);
    ++steps;
  }
  void OnEpoch(const train::JobProgress& p) override {
    absl::MutexLock lock(&mu_);
    ++epochs;
  }
  void OnJobEnd(const std::string& job_id, v1::JobState state) override {
    absl::MutexLock lock(&mu_);
    events.push_back(absl::StrCat("end ", job_id, " ", v1::JobState_Name(state)));
  }
  std::vector<std::string> Events() {
    absl::MutexLock lock(&mu_);
    return events;
  }
  int Steps() {
    absl::MutexLock lock(&mu_);
    return steps;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> events ABSL_GUARDED_BY(mu_);
  int steps ABSL_GUARDED_BY(mu_) = 0;
  int epochs ABSL_GUARDED_BY(mu_) = 0;
};

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

AgentOptions Options() {
  AgentOptions o;
  o.name = "test-trainer";
  o.resources.devices = {"cpu"};
  o.resources.checkpoint_dir = TmpDir();
  o.resources.collective_host = "127.0.0.1";
  o.resources.collective_timeout = absl::Seconds(20);
  o.min_heartbeat_interval = absl::Milliseconds(10);
  o.register_backoff = absl::Milliseconds(50);
  o.max_register_backoff = absl::Milliseconds(200);
  o.report_interval = absl::Milliseconds(10);
  return o;
}

// A small real job: an MLP on 1,024 images, 8 steps an epoch.
v1::Assignment SmallJob(const std::string& id, int epochs, int attempt = 1) {
  v1::Assignment a;
  a.set_job_id(id);
  a.set_rank(0);
  a.set_world_size(1);
  a.set_attempt(attempt);
  v1::JobSpec* s = a.mutable_spec();
  s->set_name("small");
  s->set_model("mlp");
  s->set_epochs(epochs);
  s->set_global_batch_size(128);
  s->set_lr(0.05);
  s->set_momentum(0.9);
  s->set_init("kaiming");
  s->set_seed(3);
  s->set_threads(1);
  s->set_train_limit(1024);
  s->set_test_limit(500);
  return a;
}

// Runs an agent on its own thread; stops it and joins on destruction.
class RunningAgent {
 public:
  RunningAgent(FakeCluster* cluster, AgentOptions options, AgentObserver* observer = nullptr)
      : agent_(cluster, std::move(options), observer), thread_([this] { agent_.Run(); }) {}
  ~RunningAgent() { Stop(); }
  void Stop() {
    agent_.Shutdown();
    if (thread_.joinable()) thread_.join();
  }
  Agent& agent() { return agent_; }

 private:
  Agent agent_;
  std::thread thread_;
};

bool Lists(const v1::HeartbeatRequest& h, const std::string& job_id) {
  for (const std::string& id : h.running_job_ids()) {
    if (id == job_id) return true;
  }
  return false;
}

TEST(AgentTest, RegistersAndHeartbeatsWithItsId) {
  FakeCluster cluster;
  RunningAgent a(&cluster, Options());
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.heartbeats().size() >= 3; }));
  a.Stop();
  const std::vector<v1::RegisterTrainerRequest> regs = cluster.register_calls();
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_EQ(regs[0].name(), "test-trainer");
  EXPECT_THAT(regs[0].devices(), ::testing::ElementsAre("cpu"));
  for (const v1::HeartbeatRequest& h : cluster.heartbeats()) {
    EXPECT_EQ(h.trainer_id(), "trainer-1");
    EXPECT_EQ(h.running_job_ids_size(), 0);
  }
}

// An assignment is trained for real and reported: progress after each
// epoch, one final SUCCEEDED report with the checkpoint, the observer sees
// the job start and end, and heartbeats list the job only while it runs.
TEST(AgentTest, RunsAnAssignmentAndReportsIt) {
  FakeCluster cluster;
  RecordingObserver observer;
  AgentOptions o = Options();
  o.report_interval = absl::Hours(1);  // progress reports only after epochs
  RunningAgent agent(&cluster, o, &observer);
  v1::Assignment a = SmallJob("job-run", 2, 4);
  a.mutable_spec()->set_checkpoint_interval_epochs(1);
  std::remove((TmpDir() + "/job-run.ckpt").c_str());
  cluster.Assign(a);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-run"); }));
  // The next heartbeat no longer lists it.
  const size_t seen = cluster.heartbeats().size();
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.heartbeats().size() > seen + 1; }));
  agent.Stop();

  const v1::ProgressReport last = *cluster.Final("job-run");
  EXPECT_EQ(last.final_state(), v1::SUCCEEDED);
  EXPECT_EQ(last.reason(), "training finished");
  EXPECT_EQ(last.trainer_id(), "trainer-1");
  EXPECT_EQ(last.rank(), 0);
  EXPECT_EQ(last.attempt(), 4);
  EXPECT_EQ(last.epoch(), 2);
  EXPECT_EQ(last.steps_per_epoch(), 8);
  EXPECT_GT(last.test_accuracy(), 0.5);  // chance is 0.1
  EXPECT_EQ(last.checkpoint_path(), TmpDir() + "/job-run.ckpt");
  EXPECT_EQ(last.checkpoint_epoch(), 2);
  EXPECT_FALSE(last.retryable());
  EXPECT_EQ(access(last.checkpoint_path().c_str(), R_OK), 0);

  // The first step's report (how long an epoch is), then one per epoch.
  const std::vector<v1::ProgressReport> progress = cluster.Progress("job-run");
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(progress[0].epoch(), 0);
  EXPECT_EQ(progress[0].step(), 1);
  EXPECT_EQ(progress[0].steps_per_epoch(), 8);
  EXPECT_EQ(progress[1].epoch(), 1);
  EXPECT_EQ(progress[2].epoch(), 2);
  EXPECT_LT(progress[2].loss(), progress[1].loss());
  EXPECT_EQ(progress[2].checkpoint_epoch(), 2);
  EXPECT_EQ(cluster.FinalCount(), 1);

  EXPECT_THAT(observer.Events(),
              ::testing::ElementsAre("start job-run rank 0 devices 1", "end job-run SUCCEEDED"));
  EXPECT_EQ(observer.Steps(), 16);

  const std::vector<v1::HeartbeatRequest> hb = cluster.heartbeats();
  bool listed = false;
  for (const v1::HeartbeatRequest& h : hb) listed = listed || Lists(h, "job-run");
  EXPECT_TRUE(listed);
  EXPECT_FALSE(Lists(hb.back(), "job-run"));
}

// The loss curve: rank 0's progress reports carry every step's loss once,
// in order; those of a report that did not arrive go with the next one.
TEST(AgentTest, StepLossesOfALostReportGoWithTheNext) {
  FakeCluster cluster;
  AgentOptions o = Options();
  o.report_interval = absl::Hours(1);  // the first step's report, then epochs'
  RunningAgent agent(&cluster, o);
  cluster.FailNextReports(1);  // the first step's
  cluster.Assign(SmallJob("job-curve", 2));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-curve"); }));
  agent.Stop();
  EXPECT_EQ(cluster.Final("job-curve")->final_state(), v1::SUCCEEDED);
  const std::vector<v1::ProgressReport> progress = cluster.Progress("job-curve");
  ASSERT_EQ(progress.size(), 2u) << "the first step's report was lost";
  ASSERT_EQ(progress[0].step_losses_size(), 8) << "steps 1-8: the lost step 1 too";
  ASSERT_EQ(progress[1].step_losses_size(), 8);
  for (int i = 0; i < 16; ++i) {
    const v1::StepLoss& l = progress[i / 8].step_losses(i % 8);
    EXPECT_EQ(l.step(), i);
    EXPECT_TRUE(std::isfinite(l.loss()) && l.loss() > 0) << l.loss();
  }
  // Rank 0's batch means, averaged over epoch 2, against the epoch's loss
  // (one rank: the same batches).
  double sum = 0;
  for (const v1::StepLoss& l : progress[1].step_losses()) sum += l.loss();
  EXPECT_NEAR(sum / 8, progress[1].loss(), 1e-5 * progress[1].loss());
}

// A cancel in a heartbeat reply stops the job at its next step; it is
// reported CANCELLED, and the agent goes on to run the next assignment.
TEST(AgentTest, CancelStopsTheJobAndReportsCancelled) {
  FakeCluster cluster;
  RunningAgent agent(&cluster, Options());
  cluster.Assign(SmallJob("job-long", 10000));
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    for (const v1::ProgressReport& r : cluster.reports()) {
      if (r.job_id() == "job-long" && r.step() > 0) return true;
    }
    return false;
  }));
  cluster.Cancel("job-long");
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-long"); }));
  const v1::ProgressReport last = *cluster.Final("job-long");
  EXPECT_EQ(last.final_state(), v1::CANCELLED);
  EXPECT_THAT(last.reason(), StartsWith("cancelled at epoch "));
  EXPECT_LT(last.epoch(), 10000);
  EXPECT_FALSE(last.retryable());

  cluster.Assign(SmallJob("job-next", 1));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-next"); }));
  EXPECT_EQ(cluster.Final("job-next")->final_state(), v1::SUCCEEDED);
  EXPECT_EQ(cluster.FinalCount(), 2);
}

// stop in a progress reply (the scheduler cancelled the job, or it is no
// longer this trainer's) stops it the same way.
TEST(AgentTest, StopInAProgressReplyCancels) {
  FakeCluster cluster;
  cluster.StopInReplies("job-stop");
  RunningAgent agent(&cluster, Options());
  cluster.Assign(SmallJob("job-stop", 10000));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-stop"); }));
  const v1::ProgressReport last = *cluster.Final("job-stop");
  EXPECT_EQ(last.final_state(), v1::CANCELLED);
  EXPECT_EQ(last.epoch(), 0);
  EXPECT_LE(last.step(), 2);  // stopped at the step after the first report
}

// Another job while one runs is refused with the reason; a newer attempt of
// the running job supersedes it and starts once it has ended.
TEST(AgentTest, OneJobAtATimeAndNewerAttemptsSupersede) {
  FakeCluster cluster;
  RunningAgent agent(&cluster, Options());
  cluster.Assign(SmallJob("job-a", 10000, 1));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return !cluster.Progress("job-a").empty(); }));

  cluster.Assign(SmallJob("job-b", 1));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-b"); }));
  EXPECT_EQ(cluster.Final("job-b")->final_state(), v1::FAILED);
  EXPECT_EQ(cluster.Final("job-b")->reason(), "trainer is already running job job-a");
  EXPECT_FALSE(cluster.HasFinal("job-a"));

  cluster.Assign(SmallJob("job-a", 1, 2));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-a", 2); }));
  const v1::ProgressReport first = *cluster.Final("job-a", 1);
  EXPECT_EQ(first.final_state(), v1::FAILED);
  EXPECT_THAT(first.reason(), StartsWith("superseded by attempt 2 at epoch "));
  const v1::ProgressReport second = *cluster.Final("job-a", 2);
  EXPECT_EQ(second.final_state(), v1::SUCCEEDED);
  EXPECT_EQ(second.epoch(), 1);
}

// A job that cannot start is reported FAILED with the reason, never dropped:
// a device the trainer lacks, KVSTORE without a parameter server, a bad
// assignment (not retryable), and a rendezvous whose peer never comes
// (retryable: the scheduler may place the job again).
TEST(AgentTest, FailedStartsAreReportedWithTheReason) {
  FakeCluster cluster;
  RecordingObserver observer;
  AgentOptions o = Options();
  o.resources.collective_timeout = absl::Seconds(1);
  RunningAgent agent(&cluster, o, &observer);

  v1::Assignment cuda = SmallJob("job-cuda", 1);
  cuda.mutable_spec()->set_device_kind("cuda");
  cluster.Assign(cuda);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-cuda"); }));
  EXPECT_THAT(observer.Events(),
              ::testing::ElementsAre("start job-cuda rank 0 devices 0", "end job-cuda FAILED"));
  EXPECT_EQ(cluster.Final("job-cuda")->final_state(), v1::FAILED);
  EXPECT_EQ(cluster.Final("job-cuda")->reason(),
            "the job needs 1 cuda devices; this trainer has cpu");
  EXPECT_FALSE(cluster.Final("job-cuda")->retryable());

  v1::Assignment kv = SmallJob("job-kv", 1);
  kv.mutable_spec()->mutable_sync()->set_mode(v1::KVSTORE);
  cluster.Assign(kv);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-kv"); }));
  EXPECT_EQ(cluster.Final("job-kv")->final_state(), v1::FAILED);
  EXPECT_THAT(cluster.Final("job-kv")->reason(), HasSubstr("--kvstore"));

  v1::Assignment bad = SmallJob("job-bad", 1);
  bad.mutable_spec()->set_model("vgg");
  cluster.Assign(bad);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-bad"); }));
  EXPECT_EQ(cluster.Final("job-bad")->final_state(), v1::FAILED);
  EXPECT_THAT(cluster.Final("job-bad")->reason(), StartsWith("spec.model: "));

  v1::Assignment alone = SmallJob("job-alone", 1);
  alone.set_world_size(2);
  alone.mutable_spec()->set_num_trainers(2);
  cluster.Assign(alone);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-alone"); }));
  const v1::ProgressReport last = *cluster.Final("job-alone");
  EXPECT_EQ(last.final_state(), v1::FAILED);
  EXPECT_THAT(last.reason(), StartsWith("rendezvous of rank 0 of 2: "));
  EXPECT_TRUE(last.retryable());
  EXPECT_THAT(cluster.rendezvous(), ::testing::ElementsAre("trainer-1 job-alone 1"));
}

// KVSTORE jobs get their parameter server from the factory: one kvstore job
// per attempt, the rank as the worker. A connection error fails the job,
// retryable.
TEST(AgentTest, KvstoreJobsConnectThroughTheFactory) {
  FakeCluster cluster;
  absl::Mutex mu;
  std::vector<std::string> calls;
  AgentOptions o = Options();
  o.connect_parameter_server = [&](const std::string& job, int worker, const std::string& /*token*/)
      -> absl::StatusOr<std::unique_ptr<kvstore::ParameterServer>> {
    absl::MutexLock lock(&mu);
    calls.push_back(absl::StrCat(job, " worker ", worker));
    return absl::UnavailableError("shard 0 is down");
  };
  RunningAgent agent(&cluster, o);
  v1::Assignment a = SmallJob("job-kv", 1, 2);
  a.mutable_spec()->mutable_sync()->set_mode(v1::KVSTORE);
  a.mutable_spec()->set_num_trainers(2);
  a.set_world_size(2);
  a.set_rank(1);
  cluster.Assign(a);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-kv"); }));
  const v1::ProgressReport last = *cluster.Final("job-kv");
  EXPECT_EQ(last.final_state(), v1::FAILED);
  EXPECT_EQ(last.rank(), 1);
  EXPECT_EQ(last.reason(), "connecting to the kvstore: shard 0 is down");
  EXPECT_TRUE(last.retryable());
  absl::MutexLock lock(&mu);
  EXPECT_THAT(calls, ::testing::ElementsAre("job-kv-a2 worker 1"));
  EXPECT_TRUE(cluster.rendezvous().empty());
}

// A replacement of a lost rank of an ALLREDUCE job over NCCL (join,
// generation 1) meets under the generation's keys twice, in the order the
// survivors regroup: first a host communicator (TCP, "regroup" keys) that
// carries the state out of the survivors' device memory, then a new NCCL
// communicator for the gradients (its own unique id, under "gen1/"). Here
// the NCCL side is a fake that fails (no GPU): the job fails retryably,
// naming the rendezvous. (data_parallel_cuda_test runs the real side.)
TEST(AgentTest, ACudaReplacementMeetsOverAHostCommunicatorThenOverNccl) {
  FakeCluster cluster;
  absl::Mutex mu;
  std::vector<std::string> calls;
  AgentOptions o = Options();
  o.resources.devices = {"cuda:0"};
  o.connect_communicator = [&](int rank, int world, collective::Store* store,
                               const collective::CommunicatorOptions& co)
      -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
    EXPECT_EQ(rank, 1);
    EXPECT_EQ(world, 2);
    // Which keys the store writes: the generation's.
    EXPECT_TRUE(store->Set(absl::StrCat("probe-", calls.size()), "x").ok());
    absl::MutexLock lock(&mu);
    calls.push_back(absl::StrCat(co.transport == collective::TransportKind::kNccl ? "nccl" : "tcp",
                                 " ", co.key_prefix, " cuda:", co.cuda_device));
    if (co.transport == collective::TransportKind::kNccl) {
      return absl::UnavailableError("no NCCL peer here");
    }
    collective::CommunicatorOptions one;
    one.transport = collective::TransportKind::kInProcess;
    return collective::Communicator::Create(0, 1, store, one);
  };
  RunningAgent agent(&cluster, o);
  v1::Assignment a = SmallJob("job-gpu", 1);
  a.mutable_spec()->set_device_kind("cuda");
  a.mutable_spec()->set_num_trainers(2);
  a.set_world_size(2);
  a.set_rank(1);
  a.set_generation(1);
  a.set_join(true);
  cluster.Assign(a);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-gpu"); }));
  const v1::ProgressReport last = *cluster.Final("job-gpu");
  EXPECT_EQ(last.final_state(), v1::FAILED);
  EXPECT_EQ(last.reason(), "rendezvous of rank 1 of 2: no NCCL peer here");
  EXPECT_TRUE(last.retryable());
  {
    absl::MutexLock lock(&mu);
    EXPECT_THAT(calls, ::testing::ElementsAre("tcp regroup cuda:0", "nccl allreduce cuda:0"));
  }
  std::unique_ptr<collective::Store> attempt = cluster.RendezvousStore("test", "job-gpu", 1);
  for (const char* key : {"gen1/probe-0", "gen1/probe-1"}) {
    EXPECT_TRUE(attempt->Get(key, absl::ZeroDuration()).ok()) << key;
  }
}

// Meeting the peers can take long; heartbeats keep flowing meanwhile and
// list the job, so the scheduler does not take the trainer for lost or the
// job for dropped. A connection error then fails the job, retryable.
TEST(AgentTest, HeartbeatsContinueWhileAJobStarts) {
  FakeCluster cluster;
  absl::Notification entered;
  absl::Notification release;
  AgentOptions o = Options();
  o.connect_communicator = [&](int rank, int world, collective::Store* store,
                               const collective::CommunicatorOptions& co)
      -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
    EXPECT_EQ(rank, 0);
    EXPECT_EQ(world, 2);
    EXPECT_NE(store, nullptr);
    EXPECT_EQ(co.transport, collective::TransportKind::kTcp);
    entered.Notify();
    release.WaitForNotification();
    return absl::UnavailableError("peer 1 went away");
  };
  RunningAgent agent(&cluster, o);
  v1::Assignment a = SmallJob("job-slow", 1);
  a.set_world_size(2);
  a.mutable_spec()->set_num_trainers(2);
  cluster.Assign(a);
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(kWait));
  const size_t before = cluster.heartbeats().size();
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.heartbeats().size() >= before + 5; }));
  for (size_t i = before; i < before + 5; ++i) {
    EXPECT_TRUE(Lists(cluster.heartbeats()[i], "job-slow")) << i;
  }
  EXPECT_FALSE(cluster.HasFinal("job-slow"));
  release.Notify();
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-slow"); }));
  const v1::ProgressReport last = *cluster.Final("job-slow");
  EXPECT_EQ(last.final_state(), v1::FAILED);
  EXPECT_EQ(last.reason(), "rendezvous of rank 0 of 2: peer 1 went away");
  EXPECT_TRUE(last.retryable());
}

// The scheduler unreachable at start: registration is retried with backoff
// (not in a tight loop). Unreachable later and then restarted (it forgot
// the trainer): the agent registers again and heartbeats with its new id.
// A final report that fails transiently is tried again.
TEST(AgentTest, LostSchedulerRetriesAndRegistersAgain) {
  FakeCluster cluster;
  cluster.SetUnavailable(true);
  AgentOptions o = Options();
  o.report_interval = absl::Hours(1);  // progress: the first step's and the epoch's
  RunningAgent agent(&cluster, o);
  absl::SleepFor(absl::Seconds(1));
  // 50, 100, 200, 200, ... ms apart: about 7 tries in a second.
  const size_t tries = cluster.register_calls().size();
  EXPECT_GE(tries, 3u);
  EXPECT_LE(tries, 12u);
  EXPECT_EQ(cluster.registered(), 0);
  EXPECT_EQ(agent.agent().trainer_id(), "");
  cluster.SetUnavailable(false);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.heartbeats().size() >= 2; }));
  EXPECT_EQ(agent.agent().trainer_id(), "trainer-1");

  cluster.SetUnavailable(true);
  absl::SleepFor(absl::Milliseconds(300));
  cluster.Forget();
  cluster.SetUnavailable(false);
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    const std::vector<v1::HeartbeatRequest> hb = cluster.heartbeats();
    return !hb.empty() && hb.back().trainer_id() == "trainer-2";
  }));
  EXPECT_EQ(cluster.registered(), 2);
  EXPECT_EQ(agent.agent().trainer_id(), "trainer-2");

  // The two progress reports fail, and so does the final report's first try.
  cluster.FailNextReports(3);
  cluster.Assign(SmallJob("job-after", 1));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-after"); }));
  EXPECT_EQ(cluster.Final("job-after")->final_state(), v1::SUCCEEDED);
  EXPECT_EQ(cluster.Final("job-after")->trainer_id(), "trainer-2");
  EXPECT_TRUE(cluster.Progress("job-after").empty());
}

// The scheduler restarts while a job runs: the job trains on while the
// scheduler is unreachable, and the registration that follows says what
// the trainer runs (previous id, job, attempt, rank, world, progress,
// devices); given its id back, the job goes on from its first start and
// its final report carries the same id.
TEST(AgentTest, RegistrationAfterASchedulerRestartClaimsTheRunningJob) {
  FakeCluster cluster;
  cluster.AdoptClaims();
  RecordingObserver observer;
  AgentOptions o = Options();
  o.unreachable_heartbeat_interval = absl::Milliseconds(20);
  RunningAgent agent(&cluster, o, &observer);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return agent.agent().trainer_id() == "trainer-1"; }));
  v1::Assignment job = SmallJob("job-adopted", 400, /*attempt=*/3);
  cluster.Assign(job);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return observer.Steps() >= 20; }));

  cluster.SetUnavailable(true);  // killed
  const int steps_before = observer.Steps();
  const size_t heartbeats_before = cluster.heartbeats().size();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GT(observer.Steps(), steps_before) << "the job stopped while the scheduler was away";
  EXPECT_EQ(cluster.heartbeats().size(), heartbeats_before);
  cluster.Forget();  // the restarted scheduler knows no trainer
  cluster.SetUnavailable(false);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.register_calls().size() >= 2; }));
  const v1::RegisterTrainerRequest claim = cluster.register_calls()[1];
  EXPECT_EQ(claim.previous_trainer_id(), "trainer-1");
  ASSERT_TRUE(claim.has_running()) << "registered without the running job (it ended too soon?)";
  EXPECT_EQ(claim.running().job_id(), "job-adopted");
  EXPECT_EQ(claim.running().attempt(), 3);
  EXPECT_EQ(claim.running().rank(), 0);
  EXPECT_EQ(claim.running().world_size(), 1);
  EXPECT_EQ(claim.running().generation(), 0);
  // 8 steps an epoch, and it had done more than 20 steps.
  EXPECT_GE(claim.running().epoch() * 8 + claim.running().step(), 20);
  EXPECT_THAT(claim.running().devices(), ::testing::ElementsAre("cpu"));
  // The first registration claimed nothing.
  EXPECT_FALSE(cluster.register_calls()[0].has_running());

  cluster.Cancel("job-adopted");  // ends it sooner than its 400 epochs
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-adopted"); }));
  EXPECT_EQ(cluster.Final("job-adopted")->trainer_id(), "trainer-1");
  EXPECT_EQ(cluster.Final("job-adopted")->attempt(), 3);
  int starts = 0;
  for (const std::string& e : observer.Events()) starts += absl::StartsWith(e, "start ");
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(agent.agent().trainer_id(), "trainer-1");
}

// Between a restarted scheduler's "unknown trainer" heartbeat reply and the
// registration that claims the running job (held back here, as a busy
// scheduler may), the agent has no id. Progress reports fall due all the
// while (every 10 ms); none goes out without an id, whose NOT_FOUND would
// stop the job as cancelled. The job trains on, is adopted and reports again
// as trainer-1. (A fresh clone's scheduler_restart_e2e_test once saw its job
// CANCELLED right after the scheduler restarted.)
TEST(AgentTest, ReportsWaitForTheIdWhileTheAgentRegistersAgain) {
  FakeCluster cluster;
  cluster.AdoptClaims();
  cluster.StrictReports();
  RecordingObserver observer;
  RunningAgent agent(&cluster, Options(), &observer);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return agent.agent().trainer_id() == "trainer-1"; }));
  cluster.Assign(SmallJob("job-adopted", 400));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return observer.Steps() >= 20; }));
  ASSERT_FALSE(cluster.Progress("job-adopted").empty());

  cluster.HoldRegistrations(true);
  cluster.Forget();  // restarted: heartbeats are answered "unknown trainer"
  ASSERT_TRUE(cluster.WaitUntil([&]() { return agent.agent().trainer_id().empty(); }));
  const int steps = observer.Steps();
  ASSERT_TRUE(cluster.WaitUntil([&]() { return observer.Steps() >= steps + 16; }))
      << "the job stopped while the agent registered again";
  EXPECT_GE(cluster.register_calls().size(), 2u);
  cluster.HoldRegistrations(false);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return agent.agent().trainer_id() == "trainer-1"; }));
  const size_t reported = cluster.Progress("job-adopted").size();
  ASSERT_TRUE(
      cluster.WaitUntil([&]() { return cluster.Progress("job-adopted").size() > reported; }));
  EXPECT_EQ(cluster.Progress("job-adopted").back().trainer_id(), "trainer-1");
  for (const v1::ProgressReport& r : cluster.unknown_reports()) {
    ADD_FAILURE() << "a report went out as trainer '" << r.trainer_id() << "': " << r.DebugString();
  }
  EXPECT_FALSE(cluster.HasFinal("job-adopted"));

  cluster.Cancel("job-adopted");
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-adopted"); }));
  EXPECT_EQ(cluster.Final("job-adopted")->trainer_id(), "trainer-1");
  EXPECT_EQ(cluster.Final("job-adopted")->final_state(), v1::CANCELLED);
  EXPECT_TRUE(cluster.unknown_reports().empty());
}

// Two agents run a two-trainer job together: they meet through the
// scheduler's rendezvous store and allreduce over TCP on loopback. Both
// ranks succeed with the same epoch loss (averaged over the ranks); only
// rank 0 reports progress.
TEST(AgentTest, TwoAgentsTrainOneJobTogether) {
  FakeCluster cluster;
  RunningAgent first(&cluster, Options());
  RunningAgent second(&cluster, Options());
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    return !first.agent().trainer_id().empty() && !second.agent().trainer_id().empty();
  }));
  v1::Assignment a = SmallJob("job-pair", 1);
  a.set_world_size(2);
  a.mutable_spec()->set_num_trainers(2);
  a.set_rank(0);
  cluster.Assign(a, first.agent().trainer_id());
  a.set_rank(1);
  cluster.Assign(a, second.agent().trainer_id());
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    int n = 0;
    for (const v1::ProgressReport& r : cluster.reports()) {
      n += r.job_id() == "job-pair" && r.final_state() != v1::JOB_STATE_UNSPECIFIED;
    }
    return n == 2;
  }));
  std::map<int, v1::ProgressReport> finals;
  std::map<int, int> step_times;  // reports with step times, by rank
  for (const v1::ProgressReport& r : cluster.reports()) {
    if (r.final_state() == v1::JOB_STATE_UNSPECIFIED) {
      // Every rank reports its step times (stragglers); rank 0 also its
      // progress.
      ASSERT_TRUE(r.has_step_times()) << r.rank();
      EXPECT_GT(r.step_times().steps(), 0);
      EXPECT_GT(r.step_times().forward_backward_seconds(), 0);
      EXPECT_GT(r.step_times().busy_seconds(), 0);
      EXPECT_LE(r.step_times().busy_seconds(), r.step_times().step_seconds() + 1e-9);
      EXPECT_GT(r.step_times().samples_per_second(), 0);
      ++step_times[r.rank()];
    } else {
      finals[r.rank()] = r;
    }
  }
  EXPECT_GE(step_times[0], 1);
  EXPECT_GE(step_times[1], 1);
  ASSERT_EQ(finals.size(), 2u);
  EXPECT_EQ(finals[0].final_state(), v1::SUCCEEDED) << finals[0].reason();
  EXPECT_EQ(finals[1].final_state(), v1::SUCCEEDED) << finals[1].reason();
  EXPECT_EQ(finals[0].steps_per_epoch(), 8);  // 64 samples per rank and step
  EXPECT_DOUBLE_EQ(finals[0].loss(), finals[1].loss());
  // The loss curve: rank 0's reports carry every step's loss once, in
  // order (the epoch's report flushes the last ones); rank 1's none.
  std::vector<int64_t> steps;
  double sum = 0;
  for (const v1::ProgressReport& r : cluster.reports()) {
    if (r.rank() != 0) {
      EXPECT_EQ(r.step_losses_size(), 0);
      continue;
    }
    for (const v1::StepLoss& l : r.step_losses()) {
      steps.push_back(l.step());
      sum += l.loss();
    }
  }
  ASSERT_EQ(steps.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(steps[i], i);
  // Rank 0's steps' mean is its share of the epoch's loss: not the epoch's
  // (that averages both ranks), but near it.
  EXPECT_NEAR(sum / 8, finals[0].loss(), 0.25 * finals[0].loss());
}

// Two agents run a synchronous KVSTORE job through an in-process kvstore
// with two shards: each gets its worker's parameter server from the factory
// (one kvstore job per attempt), and both ranks succeed with the same epoch
// loss.
TEST(AgentTest, TwoAgentsTrainThroughTheKvstore) {
  kvstore::InProcessOptions ko;
  ko.num_shards = 2;
  absl::StatusOr<std::unique_ptr<kvstore::InProcessKVStore>> kv =
      kvstore::InProcessKVStore::Create(ko);
  ASSERT_TRUE(kv.ok()) << kv.status();
  absl::Mutex mu;
  std::vector<std::string> calls;
  AgentOptions o = Options();
  o.connect_parameter_server = [&](const std::string& job, int worker, const std::string& /*token*/)
      -> absl::StatusOr<std::unique_ptr<kvstore::ParameterServer>> {
    {
      absl::MutexLock lock(&mu);
      calls.push_back(absl::StrCat(job, " worker ", worker));
    }
    DT_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::InProcessParameterServer> ps,
                        (*kv)->Connect(job, worker));
    return std::unique_ptr<kvstore::ParameterServer>(std::move(ps));
  };
  FakeCluster cluster;
  RunningAgent first(&cluster, o);
  RunningAgent second(&cluster, o);
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    return !first.agent().trainer_id().empty() && !second.agent().trainer_id().empty();
  }));
  v1::Assignment a = SmallJob("job-kvpair", 1, 3);
  a.set_world_size(2);
  a.mutable_spec()->set_num_trainers(2);
  a.mutable_spec()->mutable_sync()->set_mode(v1::KVSTORE);
  a.set_rank(0);
  cluster.Assign(a, first.agent().trainer_id());
  a.set_rank(1);
  cluster.Assign(a, second.agent().trainer_id());
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    int n = 0;
    for (const v1::ProgressReport& r : cluster.reports()) {
      n += r.job_id() == "job-kvpair" && r.final_state() != v1::JOB_STATE_UNSPECIFIED;
    }
    return n == 2;
  }));
  std::map<int, v1::ProgressReport> finals;
  for (const v1::ProgressReport& r : cluster.reports()) {
    if (r.final_state() != v1::JOB_STATE_UNSPECIFIED) finals[r.rank()] = r;
  }
  ASSERT_EQ(finals.size(), 2u);
  EXPECT_EQ(finals[0].final_state(), v1::SUCCEEDED) << finals[0].reason();
  EXPECT_EQ(finals[1].final_state(), v1::SUCCEEDED) << finals[1].reason();
  EXPECT_EQ(finals[0].epoch(), 1);
  EXPECT_DOUBLE_EQ(finals[0].loss(), finals[1].loss());
  EXPECT_GT(finals[0].test_accuracy(), 0.3);  // chance is 0.1
  // No communicator; the store only carries drain agreements.
  EXPECT_EQ(cluster.rendezvous().size(), 2u);
  {
    absl::MutexLock lock(&mu);
    EXPECT_THAT(
        calls, ::testing::UnorderedElementsAre("job-kvpair-a3 worker 0", "job-kvpair-a3 worker 1"));
  }
  // Both ranks left the kvstore job after their final reports: the shards
  // dropped it.
  EXPECT_TRUE(cluster.WaitUntil([&]() {
    return (*kv)->shard(0).JobNames().empty() && (*kv)->shard(1).JobNames().empty();
  })) << "kvstore jobs left: "
      << absl::StrJoin((*kv)->shard(0).JobNames(), ",");
}

// A rank waiting on the kvstore for a round its peer never pushes (the
// peer's shard died) stops as soon as the scheduler cancels the attempt:
// the agent cancels the parameter server's operations instead of waiting
// out the pull timeout (5 minutes), reports, and deletes the kvstore job.
TEST(AgentTest, CancelEndsAKvstoreWaitAndDeletesTheKvstoreJob) {
  kvstore::InProcessOptions ko;
  ko.num_shards = 2;
  absl::StatusOr<std::unique_ptr<kvstore::InProcessKVStore>> kv =
      kvstore::InProcessKVStore::Create(ko);
  ASSERT_TRUE(kv.ok()) << kv.status();
  AgentOptions o = Options();
  o.connect_parameter_server = [&](const std::string& job, int worker, const std::string& /*token*/)
      -> absl::StatusOr<std::unique_ptr<kvstore::ParameterServer>> {
    DT_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::InProcessParameterServer> ps,
                        (*kv)->Connect(job, worker));
    return std::unique_ptr<kvstore::ParameterServer>(std::move(ps));
  };
  FakeCluster cluster;
  RunningAgent agent(&cluster, o);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return !agent.agent().trainer_id().empty(); }));
  v1::Assignment a = SmallJob("job-kvwait", 1, 1);
  a.set_world_size(2);
  a.mutable_spec()->set_num_trainers(2);
  a.mutable_spec()->mutable_sync()->set_mode(v1::KVSTORE);
  a.set_rank(0);  // rank 1 never comes
  cluster.Assign(a, agent.agent().trainer_id());
  // Rank 0 created the kvstore job and waits in its first round.
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    absl::StatusOr<kvstore::JobStatus> job = (*kv)->shard(0).GetJob("job-kvwait-a1", 0, true);
    if (!job.ok()) return false;
    for (const kvstore::SliceStatus& s : job->slices) {
      if (s.pushed_round > 0) return true;
    }
    return false;
  }));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(cluster.HasFinal("job-kvwait"));
  const absl::Time cancelled = absl::Now();
  cluster.Cancel("job-kvwait");
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-kvwait"); }));
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
  const v1::ProgressReport last = *cluster.Final("job-kvwait");
  EXPECT_EQ(last.final_state(), v1::CANCELLED) << last.reason();
  EXPECT_THAT(last.reason(), StartsWith("cancelled at epoch "));
  EXPECT_TRUE(cluster.WaitUntil(
      [&]() { return (*kv)->shard(0).JobNames().empty() && (*kv)->shard(1).JobNames().empty(); }));
}

// The final reports of `job_id` attempt `attempt` by rank, once `n` arrived.
std::map<int, v1::ProgressReport> WaitForFinals(const FakeCluster& cluster,
                                                const std::string& job_id, int attempt, int n) {
  std::map<int, v1::ProgressReport> finals;
  EXPECT_TRUE(cluster.WaitUntil([&]() {
    finals.clear();
    for (const v1::ProgressReport& r : cluster.reports()) {
      if (r.job_id() == job_id && r.attempt() == attempt &&
          r.final_state() != v1::JOB_STATE_UNSPECIFIED) {
        finals[r.rank()] = r;
      }
    }
    return static_cast<int>(finals.size()) == n;
  })) << job_id;
  return finals;
}

// Assigns a two-rank job to two agents.
void AssignPair(FakeCluster* cluster, v1::Assignment a, const std::string& rank0,
                const std::string& rank1) {
  a.set_world_size(2);
  a.mutable_spec()->set_num_trainers(2);
  a.set_rank(0);
  cluster->Assign(a, rank0);
  a.set_rank(1);
  cluster->Assign(a, rank1);
}

// Drains its agent (as SIGTERM does) once its job has done step 3 of epoch
// 2: on the job thread, so the step is deterministic.
class DrainAtStep : public AgentObserver {
 public:
  void OnStep(const train::JobProgress& p, const train::StepTimes& t) override {
    Agent* a = agent.load();
    if (p.epoch == 1 && p.step == 3 && a != nullptr) a->Drain();
  }
  std::atomic<Agent*> agent{nullptr};
};

// Drain (SIGTERM) of rank 1's agent mid-epoch: both ranks stop at the same
// step, rank 0 checkpoints it, both report FAILED retryable drained, and the
// drained agent's Run() returns. The job resumed from that checkpoint on
// rank 0's agent and a spare ends exactly like an undisturbed run.
TEST(AgentTest, DrainStopsEveryRankAtOneStepAndTheJobResumesThere) {
  FakeCluster cluster;
  // Ranks read the drain step every 5 steps (every agent of a job alike).
  AgentOptions o = Options();
  o.drain_poll_steps = 5;
  RunningAgent first(&cluster, o);
  RunningAgent spare(&cluster, o);
  DrainAtStep drain_at;
  auto second = std::make_unique<Agent>(&cluster, o, &drain_at);
  std::atomic<bool> returned{false};
  std::thread runner([&] {
    second->Run();
    returned = true;
  });
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    return !first.agent().trainer_id().empty() && !second->trainer_id().empty() &&
           !spare.agent().trainer_id().empty();
  }));
  v1::Assignment a = SmallJob("job-drain", 20);
  a.mutable_spec()->set_checkpoint_interval_epochs(1);
  drain_at.agent = second.get();
  AssignPair(&cluster, a, first.agent().trainer_id(), second->trainer_id());
  std::map<int, v1::ProgressReport> drained = WaitForFinals(cluster, "job-drain", 1, 2);
  runner.join();
  EXPECT_TRUE(returned);
  ASSERT_EQ(drained.size(), 2u);
  for (const auto& [rank, r] : drained) {
    EXPECT_EQ(r.final_state(), v1::FAILED) << rank;
    EXPECT_TRUE(r.retryable()) << rank;
    EXPECT_TRUE(r.drained()) << rank;
    EXPECT_THAT(r.reason(), StartsWith("drained at epoch ")) << rank;
  }
  EXPECT_EQ(drained[0].reason(), drained[1].reason());  // the same step
  const v1::ProgressReport& r0 = drained[0];
  EXPECT_EQ(r0.checkpoint_path(), TmpDir() + "/job-drain.ckpt");
  EXPECT_EQ(r0.reason(), absl::StrCat("drained at epoch ", r0.checkpoint_epoch() + 1, " step ",
                                      r0.checkpoint_step()));
  // Asked before step 4 of epoch 2 (8 steps an epoch: 11 steps done): the
  // claimant names the first multiple of drain_poll_steps after 11, 15,
  // where every rank reads it: epoch 2 step 7.
  EXPECT_EQ(r0.checkpoint_epoch(), 1);
  EXPECT_EQ(r0.checkpoint_step(), 7);
  EXPECT_TRUE(drained[1].checkpoint_path().empty());
  bool said_draining = false;
  for (const v1::HeartbeatRequest& h : cluster.heartbeats()) {
    if (h.trainer_id() == second->trainer_id()) said_draining |= h.draining();
    if (h.trainer_id() == first.agent().trainer_id()) {
      EXPECT_FALSE(h.draining());
    }
  }
  EXPECT_TRUE(said_draining);

  v1::Assignment resumed = a;
  resumed.set_attempt(2);
  resumed.set_resume_checkpoint(r0.checkpoint_path());
  resumed.set_resume_epoch(r0.checkpoint_epoch());
  resumed.set_resume_step(r0.checkpoint_step());
  AssignPair(&cluster, resumed, first.agent().trainer_id(), spare.agent().trainer_id());
  std::map<int, v1::ProgressReport> done = WaitForFinals(cluster, "job-drain", 2, 2);
  v1::Assignment undisturbed = a;
  undisturbed.set_job_id("job-undrained");
  AssignPair(&cluster, undisturbed, first.agent().trainer_id(), spare.agent().trainer_id());
  std::map<int, v1::ProgressReport> reference = WaitForFinals(cluster, "job-undrained", 1, 2);
  ASSERT_EQ(done[0].final_state(), v1::SUCCEEDED) << done[0].reason();
  ASSERT_EQ(reference[0].final_state(), v1::SUCCEEDED) << reference[0].reason();
  EXPECT_EQ(done[0].epoch(), 20);
  EXPECT_DOUBLE_EQ(done[0].loss(), reference[0].loss());
  EXPECT_DOUBLE_EQ(done[0].test_accuracy(), reference[0].test_accuracy());
}

// The scheduler drains a KVSTORE job (HeartbeatReply.drain_job_ids to rank
// 1's trainer, as trainctl drain does): both workers stop at the same step,
// rank 0 checkpoints, and the agents keep running.
TEST(AgentTest, SchedulerDrainOfAKvstoreJob) {
  kvstore::InProcessOptions ko;
  ko.num_shards = 2;
  absl::StatusOr<std::unique_ptr<kvstore::InProcessKVStore>> kv =
      kvstore::InProcessKVStore::Create(ko);
  ASSERT_TRUE(kv.ok()) << kv.status();
  AgentOptions o = Options();
  o.connect_parameter_server = [&](const std::string& job, int worker, const std::string& /*token*/)
      -> absl::StatusOr<std::unique_ptr<kvstore::ParameterServer>> {
    DT_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::InProcessParameterServer> ps,
                        (*kv)->Connect(job, worker));
    return std::unique_ptr<kvstore::ParameterServer>(std::move(ps));
  };
  FakeCluster cluster;
  RunningAgent first(&cluster, o);
  RunningAgent second(&cluster, o);
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    return !first.agent().trainer_id().empty() && !second.agent().trainer_id().empty();
  }));
  v1::Assignment a = SmallJob("job-kvdrain", 20);
  a.mutable_spec()->set_checkpoint_interval_epochs(1);
  a.mutable_spec()->mutable_sync()->set_mode(v1::KVSTORE);
  AssignPair(&cluster, a, first.agent().trainer_id(), second.agent().trainer_id());
  ASSERT_TRUE(cluster.WaitUntil([&]() {
    for (const v1::ProgressReport& r : cluster.Progress("job-kvdrain")) {
      if (r.step() >= 2) return true;
    }
    return false;
  }));
  cluster.DrainInReplies(second.agent().trainer_id(), "job-kvdrain");
  std::map<int, v1::ProgressReport> drained = WaitForFinals(cluster, "job-kvdrain", 1, 2);
  ASSERT_EQ(drained.size(), 2u);
  EXPECT_TRUE(drained[0].drained()) << drained[0].reason();
  EXPECT_TRUE(drained[1].drained()) << drained[1].reason();
  EXPECT_THAT(drained[0].reason(), StartsWith("drained at epoch "));
  EXPECT_EQ(drained[0].reason(), drained[1].reason());
  EXPECT_EQ(drained[0].checkpoint_path(), TmpDir() + "/job-kvdrain.ckpt");
  EXPECT_LT(drained[0].epoch(), 20);
  // Still running: another job goes through.
  cluster.Assign(SmallJob("job-after", 1), second.agent().trainer_id());
  ASSERT_TRUE(cluster.WaitUntil([&]() { return cluster.HasFinal("job-after"); }));
  EXPECT_EQ(cluster.Final("job-after")->final_state(), v1::SUCCEEDED);
}

// A one-rank job drains at its next step (nothing to agree on): rank 0
// checkpoints, reports drained, and Run() returns; an idle draining agent
// returns at once after telling the scheduler.
TEST(AgentTest, DrainOfAOneRankJobAndOfAnIdleAgent) {
  FakeCluster cluster;
  Agent agent(&cluster, Options());
  std::thread runner([&] { agent.Run(); });
  v1::Assignment a = SmallJob("job-solo", 10000);
  a.mutable_spec()->set_checkpoint_interval_epochs(1);
  cluster.Assign(a);
  ASSERT_TRUE(cluster.WaitUntil([&]() { return !cluster.Progress("job-solo").empty(); }));
  agent.Drain();
  runner.join();
  const std::optional<v1::ProgressReport> last = cluster.Final("job-solo");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->final_state(), v1::FAILED);
  EXPECT_TRUE(last->retryable());
  EXPECT_TRUE(last->drained());
  EXPECT_EQ(last->checkpoint_path(), TmpDir() + "/job-solo.ckpt");
  EXPECT_EQ(last->reason(), absl::StrCat("drained at epoch ", last->checkpoint_epoch() + 1,
                                         " step ", last->checkpoint_step()));
  EXPECT_TRUE(cluster.rendezvous().empty());  // one rank: no agreement
  EXPECT_EQ(cluster.FinalCount(), 1);

  FakeCluster idle_cluster;
  Agent idle(&idle_cluster, Options());
  std::thread idle_runner([&] { idle.Run(); });
  ASSERT_TRUE(idle_cluster.WaitUntil([&]() { return !idle_cluster.heartbeats().empty(); }));
  idle.Drain();
  idle_runner.join();  // Run() returned
  const std::vector<v1::HeartbeatRequest> beats = idle_cluster.heartbeats();
  EXPECT_TRUE(beats.back().draining());
  EXPECT_FALSE(beats.front().draining());
}

// SIGTERM wired to Shutdown() (the daemon's path once --drain_timeout_s has
// passed): the running job stops at its next step, is reported FAILED and
// retryable ("trainer shutting down"), and Run() returns.
TEST(AgentTest, SigtermStopsTheJobAndRunReturns) {
  FakeCluster cluster;
  ShutdownSignal& signal = ShutdownSignal::Install();
  Agent agent(&cluster, Options());
  std::thread watcher([&] {
    signal.Wait();
    agent.Shutdown();
  });
  std::atomic<bool> returned{false};
  std::thread runner([&] {
    agent.Run();
    returned = true;
  });
  cluster.Assign(SmallJob("job-term", 10000));
  ASSERT_TRUE(cluster.WaitUntil([&]() { return !cluster.Progress("job-term").empty(); }));
  EXPECT_FALSE(returned);
  const absl::Time sent = absl::Now();
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  runner.join();
  watcher.join();
  EXPECT_LT(absl::Now() - sent, absl::Seconds(10));
  const std::optional<v1::ProgressReport> last = cluster.Final("job-term");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->final_state(), v1::FAILED);
  EXPECT_THAT(last->reason(), StartsWith("trainer shutting down at epoch "));
  EXPECT_TRUE(last->retryable());  // the trainer went away, not the job's fault
  EXPECT_FALSE(last->drained());
  EXPECT_EQ(cluster.FinalCount(), 1);
}

}  // namespace
}  // namespace agent
}  // namespace dtrain

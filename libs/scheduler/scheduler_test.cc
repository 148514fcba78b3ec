#include "libs/scheduler/scheduler.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/scheduler/queue_test_util.h"
#include "libs/scheduler/tmpfs_for_test.h"
#include "libs/security/job_token.h"

namespace dtrain {
namespace scheduler {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerOptions Options(const std::string& wal = "") {
    SchedulerOptions o;
    o.wal_path = wal;
    o.heartbeat_timeout = absl::Seconds(10);
    o.now = [this] { return now_; };
    return o;
  }

  std::unique_ptr<Scheduler> Open(SchedulerOptions o) {
    auto s = Scheduler::Open(std::move(o));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static JobSpec Spec(const std::string& name, int trainers = 1, int priority = 0,
                      const std::string& kind = "cpu") {
    JobSpec s;
    s.set_name(name);
    s.set_model("mlp");
    s.set_epochs(2);
    s.set_global_batch_size(240);  // divisible by 1, 2 and 3 trainers
    s.set_lr(0.1);
    s.set_num_trainers(trainers);
    s.set_priority(priority);
    s.set_device_kind(kind);
    return s;
  }

  static std::string AddTrainer(Scheduler* s, const std::string& device = "cpu") {
    RegisterTrainerRequest r;
    r.set_name("host");
    r.add_devices(device);
    auto reply = s->RegisterTrainer(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply->trainer_id();
  }

  static HeartbeatReply Beat(Scheduler* s, const std::string& trainer,
                             std::vector<std::string> running = {}) {
    HeartbeatRequest r;
    r.set_trainer_id(trainer);
    for (auto& id : running) r.add_running_job_ids(id);
    auto reply = s->Heartbeat(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : HeartbeatReply();
  }

  static ProgressReport Final(const std::string& trainer, const std::string& job, int rank,
                              JobState state) {
    ProgressReport r;
    r.set_trainer_id(trainer);
    r.set_job_id(job);
    r.set_rank(rank);
    r.set_epoch(2);
    r.set_test_accuracy(0.8);
    r.set_final_state(state);
    return r;
  }

  // Two new trainers, each placed by its first heartbeat (on a job that
  // waits for two); fatal unless each got one assignment. `first`: the
  // first trainer's reply.
  //   std::string t1, t2;
  //   ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2));
  static void PlaceOnTwoTrainers(Scheduler* s, std::string* t1, std::string* t2,
                                 HeartbeatReply* first = nullptr) {
    *t1 = AddTrainer(s);
    *t2 = AddTrainer(s);
    HeartbeatReply a1 = Beat(s, *t1);
    ASSERT_EQ(a1.assignments_size(), 1);
    ASSERT_EQ(Beat(s, *t2).assignments_size(), 1);
    if (first != nullptr) *first = a1;
  }

  // What a job's root reports once the first step after a regroup to
  // `generation` completed (attempt 1).
  static ProgressReport Recovered(const std::string& trainer, const std::string& job, int rank,
                                  int generation, double seconds, int64_t steps_lost) {
    ProgressReport r;
    r.set_trainer_id(trainer);
    r.set_job_id(job);
    r.set_rank(rank);
    r.set_attempt(1);
    r.set_generation(generation);
    r.set_recovery_seconds(seconds);
    r.set_recovery_steps_lost(steps_lost);
    return r;
  }

  // Rank 0 reports a step: the job made progress (recovery in place needs it).
  static void Progressed(Scheduler* s, const std::string& job, const std::string& t0,
                         const std::string& t1) {
    for (const std::string& t : {t0, t1}) {
      ProgressReport p;
      p.set_trainer_id(t);
      p.set_job_id(job);
      p.set_rank(0);
      p.set_step(3);
      if (s->ReportProgress(p).ok()) return;  // the one holding rank 0
    }
    ADD_FAILURE() << "no trainer holds rank 0 of " << job;
  }

  // Job `job` runs on t1 and t2 (rank r2) and has made progress; a spare is
  // free. t2 goes silent past the heartbeat timeout while t1 reports the
  // peer lost: the job stays RUNNING on attempt 1 in generation 1 with the
  // spare as rank r2, the spare's next heartbeat brings its joining
  // assignment (`joined`) and t1's a Regroup (`survivor`), and no cancel.
  // `last_heartbeat`: when t2 was last heard of.
  void LoseRankToASpare(Scheduler* s, const std::string& job, const std::string& t1,
                        const std::string& t2, int r2, HeartbeatReply* joined,
                        HeartbeatReply* survivor, absl::Time* last_heartbeat = nullptr) {
    std::string spare = AddTrainer(s);
    Beat(s, spare);
    Progressed(s, job, t1, t2);
    if (last_heartbeat != nullptr) *last_heartbeat = now_;  // t2's, from Progressed at the latest

    now_ += absl::Seconds(11);
    Beat(s, t1, {job});
    Beat(s, spare);
    EXPECT_EQ(s->CheckLiveness(), 1);
    auto st = s->Get(job);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->state(), v1::RUNNING) << st->DebugString();
    EXPECT_EQ(st->attempts(), 1);
    EXPECT_EQ(st->generation(), 1);
    ASSERT_EQ(st->trainers_size(), 2);
    EXPECT_EQ(st->trainers(r2), spare);
    *joined = Beat(s, spare);
    ASSERT_EQ(joined->assignments_size(), 1);
    EXPECT_TRUE(joined->assignments(0).join());
    EXPECT_EQ(joined->assignments(0).rank(), r2);
    EXPECT_EQ(joined->assignments(0).generation(), 1);
    *survivor = Beat(s, t1, {job});
    EXPECT_EQ(survivor->cancel_job_ids_size(), 0);
    ASSERT_EQ(survivor->regroups_size(), 1);
    EXPECT_EQ(survivor->regroups(0).generation(), 1);
  }

  static std::string TmpPath(const std::string& name) {
    const char* dir = std::getenv("TEST_TMPDIR");
    std::string p = std::string(dir ? dir : "/tmp") + "/" + name;
    std::remove(p.c_str());
    return p;
  }

  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

TEST_F(SchedulerTest, SubmitValidates) {
  auto s = Open(Options());
  JobSpec bad = Spec("x");
  bad.set_lr(-1);
  auto r = s->Submit(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("lr"), std::string::npos);
}

TEST_F(SchedulerTest, SingleTrainerJobRunsAndSucceeds) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("a"));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::QUEUED);
  std::string t = AddTrainer(s.get());
  EXPECT_EQ(s->Get(job->id())->state(), v1::RUNNING);
  HeartbeatReply hb = Beat(s.get(), t);
  ASSERT_EQ(hb.assignments_size(), 1);
  EXPECT_EQ(hb.assignments(0).job_id(), job->id());
  EXPECT_EQ(hb.assignments(0).rank(), 0);
  EXPECT_EQ(hb.assignments(0).world_size(), 1);
  // Delivered once only.
  EXPECT_EQ(Beat(s.get(), t, {job->id()}).assignments_size(), 0);

  ProgressReport p;
  p.set_trainer_id(t);
  p.set_job_id(job->id());
  p.set_epoch(1);
  p.set_loss(0.5);
  p.set_data_train_samples(60000);
  p.set_data_test_samples(10000);
  p.set_data_corrupt_skipped(3);
  // The loss curve: each report brings the steps since the previous one.
  for (int step = 0; step < 3; ++step) {
    v1::StepLoss* l = p.add_step_losses();
    l->set_step(step);
    l->set_loss(2.5f - 0.25f * static_cast<float>(step));
  }
  ASSERT_TRUE(s->ReportProgress(p).ok());
  EXPECT_EQ(s->Get(job->id())->epoch(), 1);
  p.clear_step_losses();
  v1::StepLoss* l3 = p.add_step_losses();
  l3->set_step(3);
  l3->set_loss(1.0f);
  ASSERT_TRUE(s->ReportProgress(p).ok());
  {
    const JobStatus got = *s->Get(job->id());
    ASSERT_EQ(got.step_losses_size(), 4) << got.DebugString();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.step_losses(i).step(), i);
    EXPECT_EQ(got.step_losses(2).loss(), 2.0f);
    EXPECT_EQ(got.step_losses(3).loss(), 1.0f);
  }
  // The dataset's sizes (trainctl get shows them).
  EXPECT_EQ(s->Get(job->id())->data_train_samples(), 60000);
  EXPECT_EQ(s->Get(job->id())->data_test_samples(), 10000);
  EXPECT_EQ(s->Get(job->id())->data_corrupt_skipped(), 3);
  auto stop = s->ReportProgress(Final(t, job->id(), 0, v1::SUCCEEDED));
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_FALSE(*stop);
  auto done = s->Get(job->id());
  EXPECT_EQ(done->state(), v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ(done->test_accuracy(), 0.8);
  EXPECT_EQ(s->Cancel(job->id(), "").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Stats().trainers_busy, 0);
}

TEST_F(SchedulerTest, GangSchedulingWaitsForAllTrainers) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("gang", 3));
  std::string t1 = AddTrainer(s.get());
  std::string t2 = AddTrainer(s.get());
  EXPECT_EQ(s->Get(job->id())->state(), v1::QUEUED);
  EXPECT_EQ(Beat(s.get(), t1).assignments_size(), 0);
  std::string t3 = AddTrainer(s.get());
  auto running = s->Get(job->id());
  EXPECT_EQ(running->state(), v1::RUNNING);
  ASSERT_EQ(running->trainers_size(), 3);
  EXPECT_EQ(running->trainers(0), t1);
  EXPECT_EQ(running->trainers(2), t3);
  HeartbeatReply hb = Beat(s.get(), t3);
  ASSERT_EQ(hb.assignments_size(), 1);
  EXPECT_EQ(hb.assignments(0).rank(), 2);
  EXPECT_EQ(hb.assignments(0).world_size(), 3);
  // Success needs every rank.
  Beat(s.get(), t1);
  Beat(s.get(), t2);
  ASSERT_TRUE(s->ReportProgress(Final(t1, job->id(), 0, v1::SUCCEEDED)).ok());
  ASSERT_TRUE(s->ReportProgress(Final(t2, job->id(), 1, v1::SUCCEEDED)).ok());
  EXPECT_EQ(s->Get(job->id())->state(), v1::RUNNING);
  ASSERT_TRUE(s->ReportProgress(Final(t3, job->id(), 2, v1::SUCCEEDED)).ok());
  EXPECT_EQ(s->Get(job->id())->state(), v1::SUCCEEDED);
}

TEST_F(SchedulerTest, QueuedJobSaysWhyItWaits) {
  auto s = Open(Options());
  auto gang = s->Submit(Spec("gang", 2));
  ASSERT_TRUE(gang.ok());
  EXPECT_EQ(s->Get(gang->id())->pending_reason(),
            "needs 2 trainers with 1 free cpu device; none is free; only 0 of the 0 registered "
            "trainers have 1 cpu device");
  std::string t1 = AddTrainer(s.get());
  EXPECT_EQ(s->Get(gang->id())->pending_reason(),
            "needs 2 trainers with 1 free cpu device; 1 is free; only 1 of the 1 registered "
            "trainers has 1 cpu device");
  // A one-trainer job of higher priority takes t1; a second trainer is not
  // enough while t1 runs it.
  auto small = s->Submit(Spec("small", 1, 9));
  ASSERT_EQ(s->Get(small->id())->state(), v1::RUNNING);
  std::string t2 = AddTrainer(s.get());
  const JobStatus waiting = *s->Get(gang->id());
  EXPECT_EQ(waiting.state(), v1::QUEUED);
  EXPECT_EQ(waiting.pending_reason(), absl::StrCat("needs 2 trainers with 1 free cpu device; 1 is "
                                                   "free, ",
                                                   t1, " runs ", small->id()));
  // A cuda job names what is missing.
  auto gpu = s->Submit(Spec("gpu", 1, 0, "cuda"));
  EXPECT_EQ(s->Get(gpu->id())->pending_reason(),
            "needs 1 trainer with 1 free cuda device; none is free; only 0 of the 2 registered "
            "trainers have 1 cuda device");
  // Placed: no reason any more.
  Beat(s.get(), t1);
  ASSERT_TRUE(s->ReportProgress(Final(t1, small->id(), 0, v1::SUCCEEDED)).ok());
  Beat(s.get(), t1);
  const JobStatus placed = *s->Get(gang->id());
  EXPECT_EQ(placed.state(), v1::RUNNING);
  EXPECT_EQ(placed.pending_reason(), "");
}

TEST_F(SchedulerTest, QueuedJobDoesNotNameOtherUsersJobs) {
  auto s = Open(Options());
  std::string t1 = AddTrainer(s.get());
  auto alices = s->Submit(Spec("alices", 1), "", "alice");
  ASSERT_EQ(s->Get(alices->id())->state(), v1::RUNNING);
  auto bobs = s->Submit(Spec("bobs", 1), "", "bob");
  auto alices2 = s->Submit(Spec("alices2", 1), "", "alice");
  EXPECT_EQ(s->Get(bobs->id())->pending_reason(),
            absl::StrCat("needs 1 trainer with 1 free cpu device; none is free, ", t1,
                         " runs another user's job"));
  EXPECT_EQ(s->Get(alices2->id())->pending_reason(),
            absl::StrCat("needs 1 trainer with 1 free cpu device; none is free, ", t1, " runs ",
                         alices->id()));
}

TEST_F(SchedulerTest, QueuedJobNamesTrainersHeldForAHigherJob) {
  auto s = Open(Options());
  auto big = s->Submit(Spec("big", 2, 5));
  auto low = s->Submit(Spec("low", 1, 0));
  std::string t1 = AddTrainer(s.get());
  EXPECT_EQ(s->Get(big->id())->pending_reason(),
            "needs 2 trainers with 1 free cpu device; 1 is free; only 1 of the 1 registered "
            "trainers has 1 cpu device");
  EXPECT_EQ(s->Get(low->id())->pending_reason(),
            absl::StrCat("needs 1 trainer with 1 free cpu device; none is free, ", t1,
                         " is held for ", big->id(), " (higher priority)"));
}

// Rank `rank` reports its step times: medians in ms of forward_backward and
// comm_wait over 32 steps.
ProgressReport StepTimesReport(const std::string& trainer, const std::string& job, int rank,
                               double fb_ms, double comm_ms) {
  ProgressReport r;
  r.set_trainer_id(trainer);
  r.set_job_id(job);
  r.set_rank(rank);
  v1::StepTimeSummary* st = r.mutable_step_times();
  st->set_steps(32);
  st->set_data_wait_seconds(0.001);
  st->set_forward_backward_seconds(fb_ms / 1e3);
  st->set_comm_wait_seconds(comm_ms / 1e3);
  st->set_optimizer_seconds(0.002);
  st->set_step_seconds((fb_ms + comm_ms + 3) / 1e3);
  st->set_busy_seconds((fb_ms + 3) / 1e3);
  return r;
}

TEST_F(SchedulerTest, PersistentlySlowRankIsNamedAStragglerAndClearedWhenCalm) {
  auto s = Open(Options());
  std::string t1 = AddTrainer(s.get());
  std::string t2 = AddTrainer(s.get());
  auto job = s->Submit(Spec("pair", 2));
  ASSERT_EQ(s->Get(job->id())->state(), v1::RUNNING);
  Beat(s.get(), t1);
  Beat(s.get(), t2);
  // Calm: no straggler.
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(s->ReportProgress(StepTimesReport(t1, job->id(), 0, 40, 2)).ok());
    ASSERT_TRUE(s->ReportProgress(StepTimesReport(t2, job->id(), 1, 42, 1)).ok());
  }
  JobStatus st = *s->Get(job->id());
  EXPECT_EQ(st.stragglers_size(), 0);
  ASSERT_EQ(st.rank_step_times_size(), 2);
  EXPECT_NEAR(st.rank_step_times(1).forward_backward_seconds(), 0.042, 1e-12);
  // Rank 1 computes 1.8x longer; rank 0 waits for it.
  const int64_t version = st.version();
  const int reports = StragglerOptions().reports;
  for (int i = 0; i < reports; ++i) {
    ASSERT_TRUE(s->ReportProgress(StepTimesReport(t1, job->id(), 0, 40, 32)).ok());
    ASSERT_TRUE(s->ReportProgress(StepTimesReport(t2, job->id(), 1, 74, 1)).ok());
  }
  st = *s->Get(job->id());
  EXPECT_GT(st.version(), version);
  ASSERT_EQ(st.stragglers_size(), 1);
  EXPECT_EQ(st.stragglers(0).rank(), 1);
  EXPECT_EQ(st.stragglers(0).trainer(), t2);
  EXPECT_EQ(st.stragglers(0).phase(), "forward_backward");
  EXPECT_NEAR(st.stragglers(0).ratio(), 77.0 / 43.0, 1e-9);
  EXPECT_EQ(st.stragglers(0).since_unix_ms(), absl::ToUnixMillis(now_));
  EXPECT_EQ(st.state(), v1::RUNNING);
  EXPECT_EQ(st.events().rbegin()->reason(),
            absl::StrCat("straggler: rank 1 on trainer ", t2,
                         " is 1.8x slower than the median of the other ranks, in "
                         "forward_backward"));
  EXPECT_EQ(s->Stats().stragglers, 1);
  EXPECT_EQ(s->Stats().stragglers_detected, 1);
  // Calm again for as many reports: cleared, with an event.
  for (int i = 0; i < reports; ++i) {
    ASSERT_TRUE(s->ReportProgress(StepTimesReport(t1, job->id(), 0, 40, 2)).ok());
    ASSERT_TRUE(s->ReportProgress(StepTimesReport(t2, job->id(), 1, 41, 1)).ok());
  }
  st = *s->Get(job->id());
  EXPECT_EQ(st.stragglers_size(), 0);
  EXPECT_NE(st.events().rbegin()->reason().find("straggler no more: rank 1 on trainer " + t2),
            std::string::npos)
      << st.events().rbegin()->reason();
  EXPECT_EQ(s->Stats().stragglers, 0);
  EXPECT_EQ(s->Stats().stragglers_detected, 1);
}

TEST_F(SchedulerTest, DevicesMustMatch) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("gpu", 1, 0, "cuda"));
  AddTrainer(s.get(), "cpu");
  EXPECT_EQ(s->Get(job->id())->state(), v1::QUEUED);
  AddTrainer(s.get(), "cuda:0");
  EXPECT_EQ(s->Get(job->id())->state(), v1::RUNNING);
  RegisterTrainerRequest bad;
  bad.add_devices("tpu:0");
  EXPECT_EQ(s->RegisterTrainer(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, PriorityThenArrivalAndNoStarvation) {
  auto s = Open(Options());
  auto low = s->Submit(Spec("low", 1, 0));
  auto big = s->Submit(Spec("big", 2, 5));
  auto high = s->Submit(Spec("high", 1, 5));
  AddTrainer(s.get());
  // big (priority 5, earlier) reserves the only trainer: neither runs.
  EXPECT_EQ(s->Get(big->id())->state(), v1::QUEUED);
  EXPECT_EQ(s->Get(high->id())->state(), v1::QUEUED);
  EXPECT_EQ(s->Get(low->id())->state(), v1::QUEUED);
  AddTrainer(s.get());
  EXPECT_EQ(s->Get(big->id())->state(), v1::RUNNING);
  AddTrainer(s.get());
  EXPECT_EQ(s->Get(high->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(low->id())->state(), v1::QUEUED);
  EXPECT_EQ(s->Stats().queue_length, 1);
}

TEST_F(SchedulerTest, CancelQueuedAndRunning) {
  auto s = Open(Options());
  auto a = s->Submit(Spec("a"));
  auto b = s->Submit(Spec("b"));
  auto cancelled = s->Cancel(b->id(), "");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(s->Cancel("job-999999", "").status().code(), absl::StatusCode::kNotFound);

  std::string t = AddTrainer(s.get());
  ASSERT_EQ(Beat(s.get(), t).assignments_size(), 1);
  ASSERT_TRUE(s->Cancel(a->id(), "changed my mind").ok());
  EXPECT_EQ(s->Get(a->id())->events().rbegin()->reason(), "changed my mind");
  HeartbeatReply hb = Beat(s.get(), t, {a->id()});
  ASSERT_EQ(hb.cancel_job_ids_size(), 1);
  EXPECT_EQ(hb.cancel_job_ids(0), a->id());
  // Busy until it reports the end.
  EXPECT_EQ(s->Stats().trainers_busy, 1);
  auto stop = s->ReportProgress(Final(t, a->id(), 0, v1::CANCELLED));
  ASSERT_TRUE(stop.ok());
  EXPECT_TRUE(*stop);
  EXPECT_EQ(s->Stats().trainers_busy, 0);
  EXPECT_EQ(s->Get(a->id())->state(), v1::CANCELLED);
}

TEST_F(SchedulerTest, LostTrainerRequeuesItsJob) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("a", 2));
  std::string t1, t2;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2));
  now_ += absl::Seconds(8);
  Beat(s.get(), t2, {job->id()});
  EXPECT_EQ(s->CheckLiveness(), 0);
  now_ += absl::Seconds(5);
  EXPECT_EQ(s->CheckLiveness(), 1);
  auto st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::QUEUED);
  EXPECT_NE(st->events().rbegin()->reason().find("trainer " + t1 + " lost"), std::string::npos)
      << st->events().rbegin()->reason();
  // The survivor is told to stop; the lost one must register again.
  EXPECT_EQ(Beat(s.get(), t2, {job->id()}).cancel_job_ids_size(), 1);
  HeartbeatRequest r;
  r.set_trainer_id(t1);
  EXPECT_EQ(s->Heartbeat(r).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Stats().trainers_alive, 1);
}

// Each placement is a new attempt with an empty rendezvous store; the
// previous attempt's keys are gone and its attempt number is refused.
// With a cluster secret, every rank of an ALLREDUCE job's attempt gets the
// attempt's collective secret (the same for all ranks, another one for the
// next attempt); KVSTORE jobs get a kvstore token instead; without a
// cluster secret nothing.
TEST_F(SchedulerTest, AssignmentsCarryTheAttemptsCollectiveSecret) {
  const std::string cluster_secret(64, 'c');
  SchedulerOptions o = Options();
  o.job_token_secret = cluster_secret;
  auto s = Open(o);
  auto job = s->Submit(Spec("allreduce", 2));
  ASSERT_TRUE(job.ok()) << job.status();
  std::string t1 = AddTrainer(s.get());
  std::string t2 = AddTrainer(s.get());
  HeartbeatReply a1 = Beat(s.get(), t1), a2 = Beat(s.get(), t2);
  ASSERT_EQ(a1.assignments_size(), 1);
  ASSERT_EQ(a2.assignments_size(), 1);
  const std::string want = security::CollectiveSecret(cluster_secret, job->id(), 1);
  EXPECT_EQ(a1.assignments(0).collective_secret(), want);
  EXPECT_EQ(a2.assignments(0).collective_secret(), want);
  EXPECT_NE(want, security::CollectiveSecret(cluster_secret, job->id(), 2));
  EXPECT_TRUE(a1.assignments(0).kvstore_token().empty());

  JobSpec kv = Spec("kvstore", 1);
  kv.mutable_sync()->set_mode(v1::KVSTORE);
  auto kv_job = s->Submit(kv);
  ASSERT_TRUE(kv_job.ok()) << kv_job.status();
  std::string t3 = AddTrainer(s.get());
  HeartbeatReply a3 = Beat(s.get(), t3);
  ASSERT_EQ(a3.assignments_size(), 1);
  // A KVSTORE job's ranks exchange state over a communicator when they
  // recover in place: they get the secret of their attempt too.
  EXPECT_EQ(a3.assignments(0).collective_secret(),
            security::CollectiveSecret(cluster_secret, kv_job->id(), 1));
  EXPECT_FALSE(a3.assignments(0).kvstore_token().empty());

  auto plain = Open(Options());
  auto plain_job = plain->Submit(Spec("plain", 1));
  ASSERT_TRUE(plain_job.ok()) << plain_job.status();
  std::string t4 = AddTrainer(plain.get());
  HeartbeatReply a4 = Beat(plain.get(), t4);
  ASSERT_EQ(a4.assignments_size(), 1);
  EXPECT_TRUE(a4.assignments(0).collective_secret().empty());
}

// A flood of submits: a user's QUEUED jobs stop at the cap with
// RESOURCE_EXHAUSTED naming it; other users still submit; once one of the
// user's jobs runs, the user may submit one more.
TEST_F(SchedulerTest, QueuedJobsPerUserAreCapped) {
  SchedulerOptions o = Options();
  o.max_queued_jobs_per_user = 3;
  auto s = Open(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->Submit(Spec("m", 1), "", "mallory").ok());
  absl::StatusOr<JobStatus> over = s->Submit(Spec("m", 1), "", "mallory");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("max_queued_jobs_per_user=3"), std::string::npos)
      << over.status();
  EXPECT_TRUE(s->Submit(Spec("a", 1), "", "alice").ok());
  EXPECT_EQ(s->List(v1::QUEUED).size(), 4u);
  std::string t = AddTrainer(s.get());
  Beat(s.get(), t);  // runs mallory's first job
  EXPECT_TRUE(s->Submit(Spec("m", 1), "", "mallory").ok());
  EXPECT_EQ(s->Submit(Spec("m", 1), "", "mallory").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(SchedulerTest, RequeuedJobGetsANewAttemptAndAnEmptyStore) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("a", 2));
  std::string t1 = AddTrainer(s.get());
  std::string t2 = AddTrainer(s.get());
  ASSERT_EQ(Beat(s.get(), t1).assignments(0).attempt(), 1);
  ASSERT_EQ(Beat(s.get(), t2).assignments(0).attempt(), 1);
  StoreSetRequest set;
  set.set_trainer_id(t1);
  set.set_job_id(job->id());
  set.set_attempt(1);
  set.set_key("addr/0");
  set.set_value("127.0.0.1:1234");
  ASSERT_TRUE(s->StoreSet(set).ok());
  StoreGetRequest get;
  get.set_trainer_id(t2);
  get.set_job_id(job->id());
  get.set_attempt(1);
  get.set_key("addr/0");
  auto got = s->StoreGet(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->found());
  EXPECT_EQ(got->value(), "127.0.0.1:1234");

  now_ += absl::Seconds(8);
  Beat(s.get(), t2, {job->id()});
  now_ += absl::Seconds(5);
  EXPECT_EQ(s->CheckLiveness(), 1);  // t1
  EXPECT_EQ(s->StoreGet(get).status().code(), absl::StatusCode::kFailedPrecondition);
  // The survivor reports its end; with a new trainer the job runs again.
  ProgressReport end;
  end.set_trainer_id(t2);
  end.set_job_id(job->id());
  end.set_rank(1);
  end.set_final_state(v1::FAILED);
  ASSERT_TRUE(s->ReportProgress(end).ok());
  std::string t3 = AddTrainer(s.get());
  HeartbeatReply hb = Beat(s.get(), t2);
  ASSERT_EQ(hb.assignments_size(), 1);
  EXPECT_EQ(hb.assignments(0).attempt(), 2);
  EXPECT_EQ(s->Get(job->id())->attempts(), 2);
  get.set_attempt(2);
  got = s->StoreGet(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->found());
  set.set_trainer_id(t2);
  EXPECT_EQ(s->StoreSet(set).code(), absl::StatusCode::kFailedPrecondition);  // attempt 1
  set.set_attempt(2);
  EXPECT_TRUE(s->StoreSet(set).ok());
  // Cancelling drops the table.
  ASSERT_TRUE(s->Cancel(job->id(), "").ok());
  EXPECT_EQ(s->StoreGet(get).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Rank 0's checkpoint reports reach the next placement (and survive a
// scheduler restart); reports from other ranks do not count.
TEST_F(SchedulerTest, RequeuedJobResumesFromTheNewestCheckpoint) {
  const std::string wal = TmpPath("resume.wal");
  auto s = Open(Options(wal));
  auto job = s->Submit(Spec("a", 2));
  std::string t1, t2;
  HeartbeatReply first;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2, &first));
  EXPECT_EQ(first.assignments(0).resume_checkpoint(), "");
  const int rank1 = first.assignments(0).rank();
  const std::string r0 = rank1 == 0 ? t1 : t2, r1 = rank1 == 0 ? t2 : t1;
  ProgressReport p;
  p.set_trainer_id(r0);
  p.set_job_id(job->id());
  p.set_rank(0);
  p.set_epoch(1);
  p.set_checkpoint_path("/ckpt/a-e1.ckpt");
  p.set_checkpoint_epoch(1);
  ASSERT_TRUE(s->ReportProgress(p).ok());
  p.set_epoch(2);
  p.set_checkpoint_path("/ckpt/a-e2.ckpt");
  p.set_checkpoint_epoch(2);
  ASSERT_TRUE(s->ReportProgress(p).ok());
  ProgressReport other = p;  // rank 1 cannot move the checkpoint
  other.set_trainer_id(r1);
  other.set_rank(1);
  other.set_checkpoint_path("/elsewhere.ckpt");
  other.set_checkpoint_epoch(9);
  ASSERT_TRUE(s->ReportProgress(other).ok());
  EXPECT_EQ(s->Get(job->id())->checkpoint_path(), "/ckpt/a-e2.ckpt");

  // Progress reports are not logged, but raise the version.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(s->ReportProgress(p).ok());
  const int64_t version_before = s->Get(job->id())->version();

  // The scheduler restarts and no trainer claims the job within the
  // heartbeat timeout: it is requeued and keeps its checkpoint, and its
  // version went on increasing (a Watch client never sees it go back).
  s.reset();
  s = Open(Options(wal));
  auto st = s->Get(job->id());
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st->version(), version_before);
  EXPECT_EQ(st->state(), v1::RUNNING);  // awaiting adoption
  now_ += absl::Seconds(11);
  s->CheckLiveness();
  st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::QUEUED);
  EXPECT_EQ(st->checkpoint_path(), "/ckpt/a-e2.ckpt");
  EXPECT_EQ(st->checkpoint_epoch(), 2);
  std::string t3 = AddTrainer(s.get());
  std::string t4 = AddTrainer(s.get());
  HeartbeatReply again = Beat(s.get(), t3);
  ASSERT_EQ(again.assignments_size(), 1);
  EXPECT_EQ(again.assignments(0).attempt(), 2);
  EXPECT_EQ(again.assignments(0).resume_checkpoint(), "/ckpt/a-e2.ckpt");
  EXPECT_EQ(again.assignments(0).resume_epoch(), 2);
  // Lost trainer: the requeue event says where the job resumes.
  now_ += absl::Seconds(8);
  Beat(s.get(), t4, {job->id()});
  now_ += absl::Seconds(5);
  EXPECT_EQ(s->CheckLiveness(), 1);
  st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::QUEUED);
  EXPECT_NE(st->events().rbegin()->reason().find("resuming from /ckpt/a-e2.ckpt (epoch 2)"),
            std::string::npos)
      << st->events().rbegin()->reason();
}

// SIGTERM of rank 1's trainer: it heartbeats draining (no new work, its job
// is told to drain); rank 1's drained report frees it, rank 0's (with the
// drain's checkpoint) requeues the job, which resumes at that step on the
// spare trainer. With max_attempts 1 a counted attempt would have failed it.
TEST_F(SchedulerTest, DrainedReportRequeuesWithoutCountingAndResumesAtTheStep) {
  SchedulerOptions o = Options();
  o.max_attempts = 1;
  auto s = Open(o);
  auto job = s->Submit(Spec("a", 2));
  std::string t1, t2;
  HeartbeatReply first;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2, &first));
  const bool t1_rank0 = first.assignments(0).rank() == 0;
  const std::string r0 = t1_rank0 ? t1 : t2, r1 = t1_rank0 ? t2 : t1;
  std::string spare = AddTrainer(s.get());
  Beat(s.get(), spare);

  HeartbeatRequest going;
  going.set_trainer_id(r1);
  going.add_running_job_ids(job->id());
  going.set_draining(true);
  absl::StatusOr<HeartbeatReply> hb = s->Heartbeat(going);
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_EQ(hb->drain_job_ids_size(), 1);
  EXPECT_EQ(hb->drain_job_ids(0), job->id());
  EXPECT_EQ(Beat(s.get(), r0, {job->id()}).drain_job_ids_size(), 0);

  ProgressReport d1 = Final(r1, job->id(), 1, v1::FAILED);
  d1.set_epoch(1);
  d1.set_step(5);
  d1.set_retryable(true);
  d1.set_drained(true);
  d1.set_attempt(1);
  d1.set_reason("drained at epoch 2 step 5");
  ASSERT_TRUE(s->ReportProgress(d1).ok());
  // Waits for rank 0's checkpoint.
  EXPECT_EQ(s->Get(job->id())->state(), v1::RUNNING);
  ProgressReport d0 = d1;
  d0.set_trainer_id(r0);
  d0.set_rank(0);
  d0.set_checkpoint_path("/ckpt/a.ckpt");
  d0.set_checkpoint_epoch(1);
  d0.set_checkpoint_step(5);
  ASSERT_TRUE(s->ReportProgress(d0).ok());

  auto st = s->Get(job->id());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::RUNNING) << st->events().rbegin()->reason();
  EXPECT_EQ(st->attempts(), 2);
  EXPECT_EQ(st->drains(), 1);
  EXPECT_EQ(st->checkpoint_epoch(), 1);
  EXPECT_EQ(st->checkpoint_step(), 5);
  const std::string requeued = st->events(st->events_size() - 2).reason();
  EXPECT_NE(requeued.find("drained at epoch 2 step 5"), std::string::npos) << requeued;
  EXPECT_NE(requeued.find("resuming from /ckpt/a.ckpt (epoch 2 step 5)"), std::string::npos)
      << requeued;
  // Placed on r0 and the spare, never on the draining trainer.
  std::vector<std::string> placed(st->trainers().begin(), st->trainers().end());
  std::sort(placed.begin(), placed.end());
  std::vector<std::string> expected = {r0, spare};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(placed, expected);
  EXPECT_EQ(Beat(s.get(), r1).assignments_size(), 0);
  HeartbeatReply again = Beat(s.get(), spare);
  ASSERT_EQ(again.assignments_size(), 1);
  EXPECT_EQ(again.assignments(0).resume_checkpoint(), "/ckpt/a.ckpt");
  EXPECT_EQ(again.assignments(0).resume_epoch(), 1);
  EXPECT_EQ(again.assignments(0).resume_step(), 5);
  EXPECT_EQ(again.assignments(0).attempt(), 2);

  // A failure that is not a drain still counts: attempts 2 - drains 1
  // reaches max_attempts 1.
  ASSERT_EQ(Beat(s.get(), r0).assignments_size(), 1);
  ProgressReport f = Final(spare, job->id(), again.assignments(0).rank(), v1::FAILED);
  f.set_retryable(true);
  f.set_attempt(2);
  f.set_reason("peer gone");
  ASSERT_TRUE(s->ReportProgress(f).ok());
  st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::FAILED);
  EXPECT_NE(st->events().rbegin()->reason().find("placed 2 times (the limit)"), std::string::npos)
      << st->events().rbegin()->reason();
}

// trainctl drain: an assignment the trainer has not received is taken back
// (the job goes to another trainer, not counted); a busy trainer's job is
// told to drain; ListTrainers shows IDLE, BUSY, DRAINING and LOST.
TEST_F(SchedulerTest, DrainTrainerAndListTrainers) {
  auto s = Open(Options());
  auto Register = [&](const std::string& name) {
    RegisterTrainerRequest r;
    r.set_name(name);
    r.add_devices("cpu");
    r.add_devices("cpu:1");
    auto reply = s->RegisterTrainer(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply->trainer_id();
  };
  const std::string a = Register("pod-a");
  const std::string b = Register("pod-b");
  const std::string c = Register("pod-b");  // names need not be unique
  auto job = s->Submit(Spec("j"));
  ASSERT_EQ(s->Get(job->id())->trainers(0), a);  // not delivered yet

  auto drained = s->DrainTrainer("pod-a");  // by name
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->id(), a);
  EXPECT_EQ(drained->state(), v1::DRAINING);
  EXPECT_EQ(drained->job_ids_size(), 0);
  auto st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::RUNNING);
  EXPECT_EQ(st->trainers(0), b);
  EXPECT_EQ(st->attempts(), 2);
  EXPECT_EQ(st->drains(), 1);
  EXPECT_EQ(Beat(s.get(), a).assignments_size(), 0);
  ASSERT_EQ(Beat(s.get(), b).assignments_size(), 1);

  EXPECT_EQ(s->DrainTrainer("nobody").status().code(), absl::StatusCode::kNotFound);
  auto ambiguous = s->DrainTrainer("pod-b");
  EXPECT_EQ(ambiguous.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ambiguous.status().message().find("2 trainers are named 'pod-b'"), std::string::npos)
      << ambiguous.status();

  // c goes silent and is lost.
  now_ += absl::Seconds(8);
  Beat(s.get(), a);
  Beat(s.get(), b, {job->id()});
  now_ += absl::Seconds(5);
  EXPECT_EQ(s->CheckLiveness(), 1);
  std::vector<v1::TrainerStatus> list = s->ListTrainers();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].id(), a);
  EXPECT_EQ(list[0].state(), v1::DRAINING);
  EXPECT_EQ(list[0].name(), "pod-a");
  ASSERT_EQ(list[0].devices_size(), 1);
  EXPECT_EQ(list[0].devices(0), "2 cpu");
  EXPECT_EQ(list[1].id(), b);
  EXPECT_EQ(list[1].state(), v1::BUSY);
  ASSERT_EQ(list[1].job_ids_size(), 1);
  EXPECT_EQ(list[1].job_ids(0), job->id());
  EXPECT_EQ(list[1].rank(), 0);
  EXPECT_EQ(list[2].id(), c);
  EXPECT_EQ(list[2].state(), v1::LOST);
  EXPECT_EQ(list[2].rank(), -1);

  // Draining the busy trainer: its job is told to drain at every heartbeat;
  // draining it again changes nothing.
  ASSERT_TRUE(s->DrainTrainer(b).ok());
  auto twice = s->DrainTrainer(b);
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(twice->job_ids_size(), 1);
  HeartbeatReply hb = Beat(s.get(), b, {job->id()});
  ASSERT_EQ(hb.drain_job_ids_size(), 1);
  EXPECT_EQ(hb.drain_job_ids(0), job->id());
  EXPECT_EQ(s->ListTrainers()[1].state(), v1::DRAINING);
}

// A retried Submit (same request id) returns the first job, also after a
// restart; without an id or with another one, a new job is queued.
TEST_F(SchedulerTest, SubmitWithARequestIdIsIdempotent) {
  const std::string wal = TmpPath("dedup.wal");
  auto s = Open(Options(wal));
  auto a = s->Submit(Spec("a"), "req-1");
  ASSERT_TRUE(a.ok()) << a.status();
  auto again = s->Submit(Spec("a"), "req-1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id(), a->id());
  EXPECT_NE(s->Submit(Spec("a"), "req-2")->id(), a->id());
  EXPECT_NE(s->Submit(Spec("a"))->id(), a->id());
  EXPECT_NE(s->Submit(Spec("a"))->id(), a->id());
  EXPECT_EQ(s->List().size(), 4u);
  EXPECT_EQ(s->Submit(Spec("a"), std::string(129, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  s.reset();
  s = Open(Options(wal));
  EXPECT_EQ(s->Submit(Spec("a"), "req-1")->id(), a->id());
  EXPECT_EQ(s->List().size(), 4u);
}

// A report of an earlier attempt (a trainer still winding it down after the
// job was placed again) neither updates nor ends the current attempt.
TEST_F(SchedulerTest, ReportsOfAnotherAttemptAreIgnored) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("a"));
  std::string t = AddTrainer(s.get());
  ASSERT_EQ(Beat(s.get(), t).assignments(0).attempt(), 1);
  ProgressReport stale = Final(t, job->id(), 0, v1::FAILED);
  stale.set_attempt(7);
  auto stop = s->ReportProgress(stale);
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_TRUE(*stop);
  EXPECT_EQ(s->Get(job->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Stats().trainers_busy, 1);
  ProgressReport current = Final(t, job->id(), 0, v1::SUCCEEDED);
  current.set_attempt(1);
  ASSERT_TRUE(s->ReportProgress(current).ok());
  EXPECT_EQ(s->Get(job->id())->state(), v1::SUCCEEDED);
}

TEST_F(SchedulerTest, LostTrainerFailsJobAfterMaxAttempts) {
  SchedulerOptions o = Options();
  o.max_attempts = 2;
  auto s = Open(o);
  auto job = s->Submit(Spec("a"));
  for (int attempt = 1; attempt <= 2; ++attempt) {
    std::string t = AddTrainer(s.get());
    HeartbeatReply hb = Beat(s.get(), t);
    ASSERT_EQ(hb.assignments_size(), 1) << "attempt " << attempt;
    EXPECT_EQ(hb.assignments(0).attempt(), attempt);
    now_ += absl::Seconds(11);
    EXPECT_EQ(s->CheckLiveness(), 1);
  }
  auto st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::FAILED);
  EXPECT_NE(st->events().rbegin()->reason().find("placed 2 times (the limit)"), std::string::npos)
      << st->events().rbegin()->reason();
}

TEST_F(SchedulerTest, LostTrainerFailsJobWhenNotRequeueing) {
  SchedulerOptions o = Options();
  o.requeue_on_trainer_loss = false;
  auto s = Open(o);
  auto job = s->Submit(Spec("a"));
  std::string t = AddTrainer(s.get());
  now_ += absl::Seconds(11);
  EXPECT_EQ(s->CheckLiveness(), 1);
  EXPECT_EQ(s->Get(job->id())->state(), v1::FAILED);
}

TEST_F(SchedulerTest, TrainerThatDropsAJobFailsIt) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("a"));
  std::string t = AddTrainer(s.get());
  ASSERT_EQ(Beat(s.get(), t).assignments_size(), 1);
  Beat(s.get(), t, {});
  EXPECT_EQ(s->Get(job->id())->state(), v1::FAILED);
}

TEST_F(SchedulerTest, WatchSeesChanges) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("a"));
  auto same = s->WaitForChange(job->id(), job->version(), absl::Now() + absl::Milliseconds(10));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->version(), job->version());
  AddTrainer(s.get());
  auto changed = s->WaitForChange(job->id(), job->version(), absl::Now() + absl::Seconds(5));
  EXPECT_GT(changed->version(), job->version());
  EXPECT_EQ(changed->state(), v1::RUNNING);
  EXPECT_EQ(s->WaitForChange("nope", 0, absl::Now()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, RestartReplaysTheLog) {
  std::string wal = TmpPath("sched.wal");
  std::string done_id, running_id, queued_id;
  {
    auto s = Open(Options(wal));
    done_id = s->Submit(Spec("done"))->id();
    running_id = s->Submit(Spec("running"))->id();
    queued_id = s->Submit(Spec("queued", 1, -1))->id();
    std::string t = AddTrainer(s.get());
    Beat(s.get(), t);
    ASSERT_TRUE(s->ReportProgress(Final(t, done_id, 0, v1::SUCCEEDED)).ok());
    EXPECT_EQ(s->Get(running_id)->state(), v1::RUNNING);
  }
  auto s = Open(Options(wal));
  std::vector<JobStatus> jobs = s->List();
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs[0].id(), done_id);
  EXPECT_EQ(jobs[0].state(), v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ(jobs[0].test_accuracy(), 0.8);
  // Awaiting its trainers; requeued when none claims it in time.
  EXPECT_EQ(jobs[1].state(), v1::RUNNING);
  now_ += absl::Seconds(11);
  s->CheckLiveness();
  jobs = s->List();
  EXPECT_EQ(jobs[1].state(), v1::QUEUED);
  EXPECT_NE(jobs[1].events().rbegin()->reason().find("restarted"), std::string::npos);
  EXPECT_EQ(jobs[2].state(), v1::QUEUED);
  // New ids continue after the old ones.
  EXPECT_EQ(s->Submit(Spec("next"))->id(), "job-000004");
  // The requeued job runs again when a trainer comes.
  AddTrainer(s.get());
  EXPECT_EQ(s->Get(running_id)->state(), v1::RUNNING);
}

TEST_F(SchedulerTest, RestartCompactsALongLog) {
  std::string wal = TmpPath("long.wal");
  const std::string id = "job-000001";
  {
    // A long log (the scheduler compacts while running, so write it
    // directly, as an older version or failing compactions would leave it).
    std::vector<std::string> none;
    auto log = Wal::Open(wal, &none);
    ASSERT_TRUE(log.ok()) << log.status();
    JobStatus st;
    st.set_id(id);
    *st.mutable_spec() = Spec("long");
    st.set_state(v1::RUNNING);
    for (int epoch = 1; epoch <= 200; ++epoch) {
      st.set_epoch(epoch);
      ASSERT_TRUE((*log)->Append(st.SerializeAsString()).ok());
    }
  }
  {
    auto s = Open(Options(wal));
    EXPECT_EQ(s->Get(id)->epoch(), 200);
  }
  FILE* f = std::fopen(wal.c_str(), "r");
  std::fseek(f, 0, SEEK_END);
  long compacted = std::ftell(f);
  std::fclose(f);
  EXPECT_LT(compacted, 4000) << "log not compacted";
  auto s = Open(Options(wal));
  EXPECT_EQ(s->Get(id)->epoch(), 200);
  EXPECT_EQ(s->Get(id)->state(), v1::QUEUED);
}

TEST_F(SchedulerTest, RestartAfterTornLastRecord) {
  std::string wal = TmpPath("torn.wal");
  {
    auto s = Open(Options(wal));
    ASSERT_TRUE(s->Submit(Spec("one")).ok());
    ASSERT_TRUE(s->Submit(Spec("two")).ok());
  }
  // Cut the last record in half, as a crash during its append would.
  FILE* f = std::fopen(wal.c_str(), "r+");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 0, SEEK_END);
  long size = std::ftell(f);
  std::fclose(f);
  ASSERT_EQ(truncate(wal.c_str(), size - 5), 0);
  auto s = Open(Options(wal));
  std::vector<JobStatus> jobs = s->List();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].spec().name(), "one");
  EXPECT_EQ(s->Submit(Spec("three"))->id(), "job-000002");
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// A real full disk: every change whose record cannot be written is refused
// with UNAVAILABLE naming the log and the OS error, and nothing changes
// (in memory or in the log); changes the scheduler makes itself wait. Once
// there is space, they go through, and a restart finds every accepted job.
TEST_F(SchedulerTest, FullDiskRefusesChangesAndLeavesStateUnchanged) {
  absl::StatusOr<std::string> dir = MountSmallTmpfs("sched_full", 64 << 10);
  ASSERT_TRUE(dir.ok()) << "this test needs a real full filesystem: " << dir.status();
  const std::string wal = *dir + "/jobs.wal";
  const std::string filler = *dir + "/filler";
  std::vector<std::string> accepted;
  std::string a_id, b_id, t, t2;
  {
    auto s = Open(Options(wal));
    a_id = s->Submit(Spec("a"))->id();
    t = AddTrainer(s.get());
    ASSERT_EQ(Beat(s.get(), t).assignments_size(), 1);
    b_id = s->Submit(Spec("b"))->id();
    ASSERT_EQ(s->Get(b_id)->state(), v1::QUEUED);
    accepted = {a_id, b_id};

    absl::StatusOr<int64_t> filled = FillDisk(filler);
    ASSERT_TRUE(filled.ok()) << filled.status();
    // The log's last page may still take a record or two.
    absl::Status refused;
    for (int i = 0; i < 64 && refused.ok(); ++i) {
      auto c = s->Submit(Spec("c"), absl::StrCat("req-", i));
      if (c.ok()) accepted.push_back(c->id());
      refused = c.status();
    }
    ASSERT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_NE(refused.message().find(wal), std::string::npos) << refused;
    EXPECT_NE(refused.message().find("No space left on device"), std::string::npos) << refused;
    EXPECT_NE(refused.message().find("not submitted"), std::string::npos) << refused;
    EXPECT_EQ(s->List().size(), accepted.size());
    const int64_t log_size = FileSize(wal);

    // Every record below is larger than the refused submission, so none
    // fits either.
    const JobStatus b_before = *s->Get(b_id);
    absl::Status st = s->Cancel(b_id, "").status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find(b_id + " is unchanged"), std::string::npos) << st;
    EXPECT_EQ(s->Get(b_id)->state(), v1::QUEUED);
    EXPECT_EQ(s->Get(b_id)->version(), b_before.version());

    ProgressReport p;
    p.set_trainer_id(t);
    p.set_job_id(a_id);
    p.set_epoch(1);
    p.set_checkpoint_path("/ckpt/a");
    p.set_checkpoint_epoch(1);
    EXPECT_EQ(s->ReportProgress(p).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(s->Get(a_id)->epoch(), 0);
    EXPECT_EQ(s->Get(a_id)->checkpoint_path(), "");
    st = s->ReportProgress(Final(t, a_id, 0, v1::FAILED)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_EQ(s->Get(a_id)->state(), v1::RUNNING);
    EXPECT_EQ(s->Stats().trainers_busy, 1);
    // The trainer drops the job without a report: it cannot be failed yet;
    // the heartbeat itself succeeds.
    Beat(s.get(), t, {});
    EXPECT_EQ(s->Get(a_id)->state(), v1::RUNNING);
    EXPECT_EQ(s->Stats().trainers_busy, 1);

    // A free trainer: b cannot be placed.
    t2 = AddTrainer(s.get());
    EXPECT_EQ(s->Get(b_id)->state(), v1::QUEUED);
    EXPECT_EQ(Beat(s.get(), t2).assignments_size(), 0);
    EXPECT_EQ(s->Stats().trainers_busy, 1);

    // t goes silent: it is not declared lost while a's requeue cannot be
    // logged.
    now_ += absl::Seconds(11);
    Beat(s.get(), t2);
    EXPECT_EQ(s->CheckLiveness(), 0);
    EXPECT_EQ(s->Stats().trainers_alive, 2);
    EXPECT_EQ(s->Get(a_id)->state(), v1::RUNNING);
    EXPECT_EQ(FileSize(wal), log_size) << "a refused change reached the log";

    // Space again: what waited goes through.
    ASSERT_EQ(std::remove(filler.c_str()), 0);
    EXPECT_EQ(s->CheckLiveness(), 1);
    const JobStatus a = *s->Get(a_id);
    ASSERT_GE(a.events_size(), 2);
    EXPECT_NE(a.events(a.events_size() - 2).reason().find("trainer " + t + " lost"),
              std::string::npos)
        << a.DebugString();
    // a (first in the queue) is placed on t2.
    EXPECT_EQ(a.state(), v1::RUNNING);
    EXPECT_EQ(a.attempts(), 2);
    ASSERT_TRUE(s->Cancel(b_id, "").ok());
  }
  auto s = Open(Options(wal));
  std::vector<JobStatus> jobs = s->List();
  ASSERT_EQ(jobs.size(), accepted.size());
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(jobs[i].id(), accepted[i]);
  EXPECT_EQ(jobs[0].state(), v1::RUNNING);  // awaiting adoption, as when the scheduler stopped
  EXPECT_EQ(jobs[0].attempts(), 2);
  EXPECT_EQ(jobs[1].state(), v1::CANCELLED);
  // The refused submission left no trace: ids continue after the accepted.
  EXPECT_EQ(s->Submit(Spec("d"))->id(), absl::StrFormat("job-%06d", accepted.size() + 1));
}

// The log is compacted while the scheduler runs, not only at a restart.
TEST_F(SchedulerTest, CompactsWhileRunning) {
  std::string wal = TmpPath("running.wal");
  auto s = Open(Options(wal));
  std::string id = s->Submit(Spec("long"))->id();
  std::string t = AddTrainer(s.get());
  Beat(s.get(), t);
  int64_t largest = 0;
  for (int epoch = 1; epoch <= 500; ++epoch) {
    ProgressReport p;
    p.set_trainer_id(t);
    p.set_job_id(id);
    p.set_epoch(epoch);
    ASSERT_TRUE(s->ReportProgress(p).ok());
    largest = std::max(largest, FileSize(wal));
  }
  const int64_t record = static_cast<int64_t>(s->Get(id)->ByteSizeLong()) + 8;
  // At most 2 * (1 job + 1) + 64 records, plus the one just appended (500
  // without compaction).
  EXPECT_LE(largest, 70 * record) << "log not compacted while running";
  EXPECT_LT(FileSize(wal), largest);
  auto again = Open(Options(wal));
  EXPECT_EQ(again->Get(id)->epoch(), 500);
}

// Finished jobs go after the retention period (from memory and, through a
// restart, from the log); others stay. A Submit retry finds its job while
// it is kept. Ids are never reused.
TEST_F(SchedulerTest, FinishedJobsAreDroppedAfterTheRetentionPeriod) {
  std::string wal = TmpPath("retention.wal");
  SchedulerOptions o = Options(wal);
  o.finished_job_retention = absl::Hours(1);
  std::string done, cancelled, queued;
  {
    auto s = Open(o);
    done = s->Submit(Spec("done"), "rid-done")->id();
    std::string t = AddTrainer(s.get());
    Beat(s.get(), t);
    ASSERT_TRUE(s->ReportProgress(Final(t, done, 0, v1::SUCCEEDED)).ok());
    queued = s->Submit(Spec("queued", 1, 0, "cuda"))->id();
    cancelled = s->Submit(Spec("cancelled", 1, 0, "cuda"))->id();
    now_ += absl::Minutes(20);
    ASSERT_TRUE(s->Cancel(cancelled, "").ok());

    now_ += absl::Minutes(45);  // done: 65 min ago; cancelled: 45 min ago
    s->CheckLiveness();
    EXPECT_EQ(s->Get(done).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s->Get(cancelled)->state(), v1::CANCELLED);
    EXPECT_EQ(s->Get(queued)->state(), v1::QUEUED);
    auto retry = s->Submit(Spec("cancelled"), "rid-done");
    EXPECT_NE(retry->id(), done) << "a dropped job's request id still answered";
    EXPECT_EQ(retry->id(), "job-000004");
    EXPECT_EQ(s->Stats().jobs_by_state[v1::SUCCEEDED], 0);
  }
  {
    auto s = Open(o);  // the clock has not moved: cancelled is still kept
    EXPECT_EQ(s->Get(done).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s->Get(cancelled)->state(), v1::CANCELLED);
    // rid-done now names the job its retry created, also after a restart.
    EXPECT_EQ(s->Submit(Spec("x"), "rid-done")->id(), "job-000004");
    now_ += absl::Minutes(16);
    s->CheckLiveness();
    EXPECT_EQ(s->Get(cancelled).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s->List().size(), 2u);  // queued and job-000004
  }
  auto s = Open(o);
  std::vector<JobStatus> jobs = s->List();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].id(), queued);
  EXPECT_EQ(jobs[1].id(), "job-000004");
  EXPECT_EQ(s->Submit(Spec("next"))->id(), "job-000005");
}

// Dropping every job and compacting keeps the id counter.
TEST_F(SchedulerTest, IdsAreNotReusedAfterAllJobsAreDropped) {
  std::string wal = TmpPath("ids.wal");
  SchedulerOptions o = Options(wal);
  o.finished_job_retention = absl::Minutes(1);
  {
    auto s = Open(o);
    std::string id = s->Submit(Spec("one"))->id();
    std::string t = AddTrainer(s.get());
    Beat(s.get(), t);
    for (int epoch = 1; epoch <= 100; ++epoch) {
      ProgressReport p;
      p.set_trainer_id(t);
      p.set_job_id(id);
      p.set_epoch(epoch);
      ASSERT_TRUE(s->ReportProgress(p).ok());
    }
    ASSERT_TRUE(s->Cancel(id, "").ok());
    now_ += absl::Minutes(2);
    s->CheckLiveness();
    EXPECT_TRUE(s->List().empty());
  }
  EXPECT_LT(FileSize(wal), 100) << "the log still holds the dropped job";
  auto s = Open(o);
  EXPECT_TRUE(s->List().empty());
  EXPECT_EQ(s->Submit(Spec("two"))->id(), "job-000002");
}

TEST_F(SchedulerTest, ListPages) {
  auto s = Open(Options());
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(s->Submit(Spec(absl::StrCat("j", i))).ok());
  ASSERT_TRUE(s->Cancel("job-000003", "").ok());
  auto p1 = s->ListPage(v1::JOB_STATE_UNSPECIFIED, 3, "");
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_EQ(p1->jobs.size(), 3u);
  EXPECT_EQ(p1->jobs[0].id(), "job-000001");
  EXPECT_EQ(p1->jobs[2].id(), "job-000003");
  ASSERT_FALSE(p1->next_page_token.empty());
  // A job submitted between pages comes at the end, shifting nothing.
  ASSERT_TRUE(s->Submit(Spec("late")).ok());
  auto p2 = s->ListPage(v1::JOB_STATE_UNSPECIFIED, 3, p1->next_page_token);
  ASSERT_TRUE(p2.ok()) << p2.status();
  ASSERT_EQ(p2->jobs.size(), 3u);
  EXPECT_EQ(p2->jobs[0].id(), "job-000004");
  auto p3 = s->ListPage(v1::JOB_STATE_UNSPECIFIED, 3, p2->next_page_token);
  ASSERT_TRUE(p3.ok()) << p3.status();
  ASSERT_EQ(p3->jobs.size(), 2u);
  EXPECT_EQ(p3->jobs[1].id(), "job-000008");
  EXPECT_TRUE(p3->next_page_token.empty());
  // Filtered by state.
  auto c = s->ListPage(v1::CANCELLED, 1, "");
  ASSERT_EQ(c->jobs.size(), 1u);
  EXPECT_EQ(c->jobs[0].id(), "job-000003");
  EXPECT_TRUE(c->next_page_token.empty());
  auto q = s->ListPage(v1::QUEUED, 4, "");
  ASSERT_EQ(q->jobs.size(), 4u);
  EXPECT_EQ(q->jobs[2].id(), "job-000004");  // job-000003 is not QUEUED
  q = s->ListPage(v1::QUEUED, 4, q->next_page_token);
  ASSERT_EQ(q->jobs.size(), 3u);
  EXPECT_EQ(q->jobs[0].id(), "job-000006");
  // Bad input names the field.
  auto bad = s->ListPage(v1::JOB_STATE_UNSPECIFIED, -1, "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("page_size"), std::string::npos) << bad.status();
  bad = s->ListPage(v1::JOB_STATE_UNSPECIFIED, 3, "job-000002");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("page_token"), std::string::npos) << bad.status();
}

TEST_F(SchedulerTest, ListPageSizeDefaultAndLimit) {
  SchedulerOptions o = Options();
  o.max_queued_jobs_per_user = 0;  // more queued jobs than the default cap
  auto s = Open(o);
  const int n = kMaxListPageSize + 5;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(s->Submit(Spec("j")).ok());
  auto page = s->ListPage(v1::JOB_STATE_UNSPECIFIED, 0, "");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs.size(), static_cast<size_t>(kDefaultListPageSize));
  page = s->ListPage(v1::JOB_STATE_UNSPECIFIED, n * 2, "");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs.size(), static_cast<size_t>(kMaxListPageSize));
  page = s->ListPage(v1::JOB_STATE_UNSPECIFIED, n * 2, page->next_page_token);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs.size(), 5u);
  EXPECT_TRUE(page->next_page_token.empty());
}

// Recovery in place: a lost rank of a running ALLREDUCE job goes to a free
// trainer within the same attempt (a new generation); the survivor is told
// to regroup, the spare to join; the root's report completes the recovery.
TEST_F(SchedulerTest, LostRankIsReplacedInPlaceByASpare) {
  auto s = Open(Options());
  auto job = s->Submit(Spec("r", 2));
  std::string t1, t2;
  HeartbeatReply a1;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2, &a1));
  EXPECT_EQ(a1.assignments(0).generation(), 0);
  EXPECT_FALSE(a1.assignments(0).join());
  const int r1 = a1.assignments(0).rank(), r2 = 1 - r1;
  std::string spare = AddTrainer(s.get());
  EXPECT_EQ(Beat(s.get(), spare).assignments_size(), 0);
  EXPECT_EQ(Beat(s.get(), t1, {job->id()}).regroups_size(), 0);  // generation 0: nothing
  Progressed(s.get(), job->id(), t1, t2);

  now_ += absl::Seconds(11);
  Beat(s.get(), t1, {job->id()});
  Beat(s.get(), spare);
  EXPECT_EQ(s->CheckLiveness(), 1);
  auto st = s->Get(job->id());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::RUNNING);
  EXPECT_EQ(st->attempts(), 1);
  EXPECT_EQ(st->generation(), 1);
  ASSERT_EQ(st->trainers_size(), 2);
  EXPECT_EQ(st->trainers(r1), t1);
  EXPECT_EQ(st->trainers(r2), spare);
  const std::string lost_event = st->events().rbegin()->reason();
  EXPECT_NE(lost_event.find(absl::StrCat("rank ", r2, " lost on trainer ", t2)), std::string::npos)
      << lost_event;
  EXPECT_NE(lost_event.find("recovering in place on trainer " + spare + " (generation 1)"),
            std::string::npos)
      << lost_event;

  // The spare joins: the lost rank, the same attempt, generation 1.
  HeartbeatReply joined = Beat(s.get(), spare);
  ASSERT_EQ(joined.assignments_size(), 1);
  EXPECT_EQ(joined.assignments(0).rank(), r2);
  EXPECT_EQ(joined.assignments(0).attempt(), 1);
  EXPECT_EQ(joined.assignments(0).generation(), 1);
  EXPECT_TRUE(joined.assignments(0).join());
  EXPECT_EQ(Beat(s.get(), spare, {job->id()}).regroups_size(), 0);
  // The survivor regroups (in every heartbeat) and is not told to stop.
  for (int i = 0; i < 2; ++i) {
    HeartbeatReply survivor = Beat(s.get(), t1, {job->id()});
    EXPECT_EQ(survivor.cancel_job_ids_size(), 0);
    EXPECT_EQ(survivor.assignments_size(), 0);
    ASSERT_EQ(survivor.regroups_size(), 1);
    EXPECT_EQ(survivor.regroups(0).job_id(), job->id());
    EXPECT_EQ(survivor.regroups(0).attempt(), 1);
    EXPECT_EQ(survivor.regroups(0).generation(), 1);
    ASSERT_EQ(survivor.regroups(0).trainer_ids_size(), 2);
    EXPECT_EQ(survivor.regroups(0).trainer_ids(r2), spare);
  }
  // Both may use the attempt's rendezvous store.
  StoreSetRequest set;
  set.set_trainer_id(spare);
  set.set_job_id(job->id());
  set.set_attempt(1);
  set.set_key("gen1/k");
  set.set_value("v");
  EXPECT_TRUE(s->StoreSet(set).ok());

  // The rank that sent the state reports the recovery, once.
  ProgressReport rec = Recovered(t1, job->id(), r1, 1, 2.5, 1);
  ASSERT_TRUE(s->ReportProgress(rec).ok());
  ASSERT_TRUE(s->ReportProgress(rec).ok());
  st = s->Get(job->id());
  EXPECT_EQ(st->recoveries(), 1);
  EXPECT_DOUBLE_EQ(st->last_recovery_seconds(), 2.5);
  EXPECT_EQ(st->steps_lost(), 1);
  EXPECT_NE(st->events().rbegin()->reason().find(absl::StrCat(
                "rank ", r2, " lost on trainer ", t2, "; recovered in place on trainer ", spare,
                " in 2.5 s (generation 1, 1 step lost)")),
            std::string::npos)
      << st->events().rbegin()->reason();
  SchedulerStats stats = s->Stats();
  EXPECT_EQ(stats.recoveries, 1);
  EXPECT_DOUBLE_EQ(stats.recovery_seconds_sum, 2.5);
  ASSERT_EQ(stats.recovery_seconds_counts.size(), std::size(kRecoverySecondsBounds) + 1);
  // 2.5 s falls in (2, 3]: the fourth bucket.
  ASSERT_EQ(kRecoverySecondsBounds[3], 3);
  for (size_t b = 0; b < stats.recovery_seconds_counts.size(); ++b) {
    EXPECT_EQ(stats.recovery_seconds_counts[b], b == 3 ? 1 : 0) << b;
  }
  // Both ranks finish: the job succeeds on its first attempt.
  ASSERT_TRUE(s->ReportProgress(Final(t1, job->id(), r1, v1::SUCCEEDED)).ok());
  ASSERT_TRUE(s->ReportProgress(Final(spare, job->id(), r2, v1::SUCCEEDED)).ok());
  st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::SUCCEEDED);
  EXPECT_EQ(st->attempts(), 1);
}

// An elastic job (min 1, max 2) with no spare continues on its survivor
// (renumbered to rank 0), then grows back onto a trainer that registers once
// the shrink has settled; the grow is not counted as a recovery.
TEST_F(SchedulerTest, ElasticJobShrinksWithoutASpareAndGrowsBackOntoANewTrainer) {
  auto s = Open(Options());
  JobSpec spec = Spec("e", 2);
  spec.set_min_trainers(1);
  spec.set_max_trainers(2);
  auto job = s->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  std::string t1, t2;
  HeartbeatReply a1;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2, &a1));
  // Lose rank 0, so that the survivor's rank changes.
  const std::string lost = a1.assignments(0).rank() == 0 ? t1 : t2;
  const std::string kept = lost == t1 ? t2 : t1;
  Progressed(s.get(), job->id(), t1, t2);
  now_ += absl::Seconds(11);
  Beat(s.get(), kept, {job->id()});
  EXPECT_EQ(s->CheckLiveness(), 1);
  auto st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::RUNNING);
  EXPECT_EQ(st->attempts(), 1);
  EXPECT_EQ(st->generation(), 1);
  ASSERT_EQ(st->trainers_size(), 1);
  EXPECT_EQ(st->trainers(0), kept);
  EXPECT_NE(st->events().rbegin()->reason().find(
                "rank 0 lost on trainer " + lost +
                " (no heartbeat for 11s); no spare trainer: continuing on 1 trainer"),
            std::string::npos)
      << st->events().rbegin()->reason();
  HeartbeatReply regroup = Beat(s.get(), kept, {job->id()});
  EXPECT_EQ(regroup.cancel_job_ids_size(), 0);
  ASSERT_EQ(regroup.regroups_size(), 1);
  EXPECT_EQ(regroup.regroups(0).generation(), 1);
  ASSERT_EQ(regroup.regroups(0).trainer_ids_size(), 1);
  EXPECT_EQ(regroup.regroups(0).trainer_ids(0), kept);

  // A progress report the survivor sent as rank 1 before it regrouped is
  // dropped without stopping it.
  ProgressReport stale;
  stale.set_trainer_id(kept);
  stale.set_job_id(job->id());
  stale.set_rank(1);
  stale.set_attempt(1);
  stale.set_step(9);
  auto stop = s->ReportProgress(stale);
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_FALSE(*stop);

  // A trainer that registers before the shrink settled is not taken.
  std::string t3 = AddTrainer(s.get());
  EXPECT_EQ(Beat(s.get(), t3).assignments_size(), 0);

  ProgressReport rec = Recovered(kept, job->id(), 0, 1, 1.5, 1);
  ASSERT_TRUE(s->ReportProgress(rec).ok());
  st = s->Get(job->id());
  EXPECT_EQ(st->recoveries(), 1);
  EXPECT_EQ(st->steps_lost(), 1);
  // Settled: the new trainer joins as rank 1 of 2 in generation 2 (the
  // heartbeat that follows the recovery report grows the job).
  HeartbeatReply joined = Beat(s.get(), t3);
  ASSERT_EQ(joined.assignments_size(), 1);
  EXPECT_EQ(joined.assignments(0).rank(), 1);
  EXPECT_EQ(joined.assignments(0).world_size(), 2);
  EXPECT_EQ(joined.assignments(0).generation(), 2);
  EXPECT_TRUE(joined.assignments(0).join());
  EXPECT_EQ(Beat(s.get(), t3, {job->id()}).regroups_size(), 0);
  st = s->Get(job->id());
  ASSERT_EQ(st->trainers_size(), 2);
  EXPECT_EQ(st->trainers(0), kept);
  EXPECT_EQ(st->trainers(1), t3);
  EXPECT_EQ(st->generation(), 2);
  bool shrank = false, grew = false;
  for (const auto& e : st->events()) {
    shrank = shrank || e.reason().find(
                           "; continued on 1 trainer in 1.5 s (generation 1, 1 step "
                           "lost)") != std::string::npos;
    grew = grew ||
           e.reason().find("growing to 2 trainers (max_trainers 2): " + t3) != std::string::npos;
  }
  EXPECT_TRUE(shrank);
  EXPECT_TRUE(grew);
  regroup = Beat(s.get(), kept, {job->id()});
  ASSERT_EQ(regroup.regroups_size(), 1);
  EXPECT_EQ(regroup.regroups(0).generation(), 2);
  ASSERT_EQ(regroup.regroups(0).trainer_ids_size(), 2);
  EXPECT_EQ(regroup.regroups(0).trainer_ids(1), t3);

  // The root reports the grow: an event, not a recovery.
  rec = Recovered(kept, job->id(), 0, 2, 0.8, 0);
  ASSERT_TRUE(s->ReportProgress(rec).ok());
  st = s->Get(job->id());
  EXPECT_EQ(st->recoveries(), 1);
  EXPECT_EQ(st->steps_lost(), 1);
  EXPECT_NE(st->events().rbegin()->reason().find("grew to 2 trainers (" + t3 +
                                                 " joined) in 0.8 s (generation 2)"),
            std::string::npos)
      << st->events().rbegin()->reason();
  EXPECT_EQ(s->Stats().recoveries, 1);
  // At max_trainers: another free trainer is not taken.
  std::string t4 = AddTrainer(s.get());
  EXPECT_EQ(Beat(s.get(), t4).assignments_size(), 0);

  ASSERT_TRUE(s->ReportProgress(Final(kept, job->id(), 0, v1::SUCCEEDED)).ok());
  ASSERT_TRUE(s->ReportProgress(Final(t3, job->id(), 1, v1::SUCCEEDED)).ok());
  st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::SUCCEEDED);
  EXPECT_EQ(st->attempts(), 1);
}

// An elastic job at min_trainers requeues as before when it loses another.
TEST_F(SchedulerTest, ElasticJobAtItsMinimumIsRequeued) {
  auto s = Open(Options());
  JobSpec spec = Spec("m", 2);
  spec.set_min_trainers(2);
  spec.set_max_trainers(3);
  auto job = s->Submit(spec);
  std::string t1, t2;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2));
  Progressed(s.get(), job->id(), t1, t2);
  now_ += absl::Seconds(11);
  Beat(s.get(), t1, {job->id()});
  EXPECT_EQ(s->CheckLiveness(), 1);
  auto st = s->Get(job->id());
  EXPECT_EQ(st->state(), v1::QUEUED);
  EXPECT_EQ(st->generation(), 0);
}

// A survivor that says its peer is gone gets the silent trainer declared
// lost after 2 heartbeat intervals instead of the heartbeat timeout.
TEST_F(SchedulerTest, PeerLostHeartbeatLosesTheSilentTrainerEarly) {
  SchedulerOptions o = Options();
  o.heartbeat_interval = absl::Seconds(1);
  auto s = Open(o);
  auto job = s->Submit(Spec("p", 2));
  std::string t1, t2;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2));
  std::string spare = AddTrainer(s.get());
  Progressed(s.get(), job->id(), t1, t2);
  HeartbeatRequest lost;
  lost.set_trainer_id(t1);
  lost.add_running_job_ids(job->id());
  lost.add_peer_lost_job_ids(job->id());
  now_ += absl::Milliseconds(1500);
  ASSERT_TRUE(s->Heartbeat(lost).ok());
  EXPECT_EQ(s->Get(job->id())->generation(), 0);  // t2 silent 1.5 s: not yet
  now_ += absl::Milliseconds(1000);
  Beat(s.get(), spare);
  ASSERT_TRUE(s->Heartbeat(lost).ok());
  auto st = s->Get(job->id());
  EXPECT_EQ(st->generation(), 1);
  EXPECT_NE(st->events().rbegin()->reason().find("a peer's collectives failed"), std::string::npos)
      << st->events().rbegin()->reason();
  EXPECT_EQ(s->Stats().trainers_alive, 2);
  // Without the survivor's word, CheckLiveness keeps the heartbeat timeout.
  now_ += absl::Seconds(3);
  Beat(s.get(), t1, {job->id()});
  EXPECT_EQ(s->CheckLiveness(), 0);
}

// A KVSTORE job in synchronous rounds recovers in place like an ALLREDUCE
// one; its new generation meets in a kvstore job of its own, which the
// joiner's assignment token and the survivor's Regroup token name.
TEST_F(SchedulerTest, KvstoreJobRecoversInPlaceInAKvstoreJobOfItsGeneration) {
  SchedulerOptions o = Options();
  o.job_token_secret = "00112233445566778899aabbccddeeff";
  auto s = Open(o);
  JobSpec spec = Spec("kv", 2);
  spec.mutable_sync()->set_mode(v1::KVSTORE);
  auto job = s->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  std::string t1, t2;
  HeartbeatReply a1;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2, &a1));
  // The kvstore job a token grants, and the world size it names.
  auto granted = [&](const std::string& token) {
    absl::StatusOr<security::JobGrant> g =
        security::VerifyJobToken(o.job_token_secret, token, now_);
    return g.ok() ? absl::StrCat(g->job, " workers=", g->workers) : g.status().ToString();
  };
  EXPECT_EQ(granted(a1.assignments(0).kvstore_token()), job->id() + "-a1 workers=2");
  const int r2 = 1 - a1.assignments(0).rank();
  HeartbeatReply joined, survivor;
  ASSERT_NO_FATAL_FAILURE(LoseRankToASpare(s.get(), job->id(), t1, t2, r2, &joined, &survivor));
  EXPECT_EQ(granted(joined.assignments(0).kvstore_token()), job->id() + "-a1-g1 workers=2");
  EXPECT_EQ(granted(survivor.regroups(0).kvstore_token()), job->id() + "-a1-g1 workers=2");
}

// A KVSTORE job whose kvstore holds the weights (asynchronous): the spare
// joins the attempt's own kvstore job (every token grants "<id>-a1"), and
// its recovery counts from the lost trainer's last heartbeat.
TEST_F(SchedulerTest, KvstoreJobWithKvstoreHeldWeightsRecoversInTheAttemptsKvstoreJob) {
  SchedulerOptions o = Options();
  o.job_token_secret = "00112233445566778899aabbccddeeff";
  auto s = Open(o);
  JobSpec spec = Spec("kv", 2);
  spec.mutable_sync()->set_mode(v1::KVSTORE);
  spec.mutable_sync()->set_consistency(v1::ASYNCHRONOUS);
  auto job = s->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  std::string t1, t2;
  HeartbeatReply a1;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2, &a1));
  // The kvstore job a token grants, and the world size it names.
  auto granted = [&](const std::string& token) {
    absl::StatusOr<security::JobGrant> g =
        security::VerifyJobToken(o.job_token_secret, token, now_);
    return g.ok() ? absl::StrCat(g->job, " workers=", g->workers) : g.status().ToString();
  };
  const int r2 = 1 - a1.assignments(0).rank();
  HeartbeatReply joined, survivor;
  absl::Time last_heartbeat;
  ASSERT_NO_FATAL_FAILURE(
      LoseRankToASpare(s.get(), job->id(), t1, t2, r2, &joined, &survivor, &last_heartbeat));
  EXPECT_EQ(granted(joined.assignments(0).kvstore_token()), job->id() + "-a1 workers=2");
  EXPECT_EQ(granted(survivor.regroups(0).kvstore_token()), job->id() + "-a1 workers=2");
  const std::string spare = joined.assignments(0).trainer_ids(r2);

  // The replacement reports after its first step, 2 s later: the recovery
  // took 13 s from the last heartbeat, whatever the joiner measured.
  now_ += absl::Seconds(2);
  ASSERT_TRUE(s->ReportProgress(Recovered(spare, job->id(), r2, 1, 0.5, 1)).ok());
  auto st = s->Get(job->id());
  EXPECT_EQ(st->recoveries(), 1);
  EXPECT_DOUBLE_EQ(st->last_recovery_seconds(), absl::ToDoubleSeconds(now_ - last_heartbeat));
  EXPECT_EQ(st->steps_lost(), 1);
  EXPECT_NE(
      st->events().rbegin()->reason().find("recovered in place on trainer " + spare + " in 13.0 s"),
      std::string::npos)
      << st->DebugString();
}

// A CUDA job (one GPU per trainer) recovers in place onto a spare with a
// GPU; a spare without one is not used (the attempt is requeued).
TEST_F(SchedulerTest, CudaJobRecoversInPlaceOnlyOnASpareWithAGpu) {
  for (const std::string spare_device : {"cuda:0", "cpu"}) {
    SCOPED_TRACE(spare_device);
    auto s = Open(Options());
    auto job = s->Submit(Spec("gpu", 2, 0, "cuda"));
    ASSERT_TRUE(job.ok()) << job.status();
    std::string t1 = AddTrainer(s.get(), "cuda:0");
    std::string t2 = AddTrainer(s.get(), "cuda:0");
    HeartbeatReply a1 = Beat(s.get(), t1);
    ASSERT_EQ(a1.assignments_size(), 1);
    ASSERT_EQ(Beat(s.get(), t2).assignments_size(), 1);
    const int r2 = 1 - a1.assignments(0).rank();
    std::string spare = AddTrainer(s.get(), spare_device);
    Beat(s.get(), spare);
    Progressed(s.get(), job->id(), t1, t2);
    now_ += absl::Seconds(11);
    Beat(s.get(), t1, {job->id()});
    Beat(s.get(), spare);
    EXPECT_EQ(s->CheckLiveness(), 1);
    auto st = s->Get(job->id());
    ASSERT_TRUE(st.ok());
    if (spare_device == "cpu") {
      EXPECT_EQ(st->state(), v1::QUEUED) << st->DebugString();
      EXPECT_EQ(st->generation(), 0);
      continue;
    }
    EXPECT_EQ(st->state(), v1::RUNNING) << st->DebugString();
    EXPECT_EQ(st->attempts(), 1);
    EXPECT_EQ(st->generation(), 1);
    EXPECT_EQ(st->trainers(r2), spare);
    HeartbeatReply joined = Beat(s.get(), spare);
    ASSERT_EQ(joined.assignments_size(), 1);
    EXPECT_TRUE(joined.assignments(0).join());
    EXPECT_EQ(joined.assignments(0).spec().device_kind(), "cuda");
    HeartbeatReply survivor = Beat(s.get(), t1, {job->id()});
    EXPECT_EQ(survivor.cancel_job_ids_size(), 0);
    ASSERT_EQ(survivor.regroups_size(), 1);
    EXPECT_EQ(survivor.regroups(0).generation(), 1);
  }
}

// No free trainer, recover_in_place off, no progress yet, or a
// sync_batch_norm job (its groups span the old membership): the attempt is
// requeued as before.
TEST_F(SchedulerTest, WithoutASpareOrWithSyncBatchNormTheAttemptIsRequeued) {
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    SchedulerOptions o = Options();
    o.recover_in_place = variant != 2;
    auto s = Open(o);
    JobSpec spec = Spec("q", 2);
    if (variant == 1) spec.set_sync_batch_norm(true);
    auto job = s->Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    const std::string device = "cpu";
    std::string t1 = AddTrainer(s.get(), device);
    std::string t2 = AddTrainer(s.get(), device);
    Beat(s.get(), t1);
    Beat(s.get(), t2);
    if (variant != 3) Progressed(s.get(), job->id(), t1, t2);
    if (variant != 0) AddTrainer(s.get(), device);  // a spare, not used
    now_ += absl::Seconds(11);
    Beat(s.get(), t1, {job->id()});
    for (const auto& t : s->ListTrainers()) {
      if (t.id() != t1 && t.id() != t2 && t.state() != v1::LOST) Beat(s.get(), t.id());
    }
    EXPECT_EQ(s->CheckLiveness(), 1);
    auto st = s->Get(job->id());
    EXPECT_NE(st->state(), v1::RUNNING) << st->DebugString();
    EXPECT_EQ(st->generation(), 0);
    EXPECT_EQ(st->recoveries(), 0);
    bool requeued = false;
    for (const auto& e : st->events()) {
      if (e.state() == v1::QUEUED && e.reason().find("lost") != std::string::npos) requeued = true;
    }
    EXPECT_TRUE(requeued) << st->DebugString();
  }
}

// Queues (SchedulerOptions.queues, docs/queues.md): a job is placed only
// within its owner's queue's quota or what the cohort lends; otherwise it
// waits, with the quota that blocks it, on free trainers it does not hold.
TEST_F(SchedulerTest, QueuesPlaceWithinQuotaAndBorrowFromTheCohort) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(R"(queues:
  - name: team-a
    cohort: research
    quota: {trainers: 1}
    users: [alice]
  - name: team-b
    cohort: research
    quota: {trainers: 1}
    lending_limit: {trainers: 0}
    users: [bob]
  - name: team-c
    cohort: research
    quota: {trainers: 1}
    users: [dave]
  - name: batch
    quota: {trainers: 1}
    users: [carol]
)");
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  auto s = Open(std::move(o));
  std::vector<std::string> trainers;
  for (int i = 0; i < 6; ++i) {
    trainers.push_back(AddTrainer(s.get()));
    Beat(s.get(), trainers.back());
  }
  auto a1 = s->Submit(Spec("a1"), "", "alice");
  auto a2 = s->Submit(Spec("a2"), "", "alice");
  auto a3 = s->Submit(Spec("a3"), "", "alice");
  ASSERT_TRUE(a1.ok() && a2.ok() && a3.ok());
  EXPECT_EQ(s->Get(a1->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(a2->id())->state(), v1::RUNNING);  // borrows team-c's idle trainer
  EXPECT_EQ(s->Get(a3->id())->state(), v1::QUEUED);   // team-b lends nothing
  EXPECT_EQ(s->Get(a3->id())->pending_reason(),
            "queue team-a: trainers 2 in use + 1 requested > quota 1 + borrowable 1 (cohort "
            "research: 2 of 2 shared in use)");
  auto b1 = s->Submit(Spec("b1"), "", "bob");
  auto c1 = s->Submit(Spec("c1"), "", "carol");
  auto c2 = s->Submit(Spec("c2"), "", "carol");
  auto d1 = s->Submit(Spec("d1"), "", "dave");
  ASSERT_TRUE(b1.ok() && c1.ok() && c2.ok() && d1.ok());
  EXPECT_EQ(s->Get(b1->id())->state(), v1::RUNNING);  // what team-b keeps for itself
  EXPECT_EQ(s->Get(c1->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(c2->id())->pending_reason(),
            "queue batch: trainers 1 in use + 1 requested > quota 1");
  // team-c's trainer is borrowed and its policy is never to reclaim.
  const std::string d1_waits =
      "queue team-c: trainers 0 in use + 1 requested is within quota 1, but other queues of "
      "cohort research borrow 1 of it; reclaim is never";
  EXPECT_EQ(s->Get(d1->id())->pending_reason(), d1_waits);
  int free = 0;  // 2 trainers stay free: quota, not trainers, holds the jobs
  for (const auto& t : s->ListTrainers()) free += t.job_ids().empty() ? 1 : 0;
  EXPECT_EQ(free, 2);

  // Refused at submission: a user in no queue, a gang its queue never admits.
  auto stranger = s->Submit(Spec("x"), "", "mallory");
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stranger.status().message(),
            "user mallory is in no queue; ask an admin to add them to the queues file");
  auto big = s->Submit(Spec("big", 3), "", "alice");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big.status().message(),
            "the job can never be admitted: queue team-a: trainers 0 in use + 3 requested > quota "
            "1 + borrowable 1 (cohort research: 0 of 2 shared in use); ask for less");

  // a1 ends: team-c's d1, within its quota, goes before team-a's older a3,
  // which would borrow.
  const std::string t = s->Get(a1->id())->trainers(0);
  ASSERT_TRUE(s->ReportProgress(Final(t, a1->id(), 0, v1::SUCCEEDED)).ok());
  EXPECT_EQ(s->Get(d1->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(a3->id())->state(), v1::QUEUED);
  EXPECT_EQ(s->Get(a3->id())->pending_reason(),
            "queue team-a: trainers 1 in use + 1 requested > quota 1 + borrowable 0 (cohort "
            "research: 2 of 2 shared in use)");
}

// The issue's two teams: team-a borrows team-b's idle trainer; bob's job
// reclaims it: team-a's newer job is told to drain (events on both name only
// queues and the rule), its drained report requeues it at the drained step
// (a drain, not an attempt) and bob's job is placed.
TEST_F(SchedulerTest, QueuesReclaimBorrowedQuotaByDrainingTheBorrower) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(queue_test::kTwoTeamsQueues);
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  o.max_attempts = 1;  // a counted attempt would fail the drained job
  auto s = Open(std::move(o));
  const std::string t1 = AddTrainer(s.get()), t2 = AddTrainer(s.get());
  Beat(s.get(), t1);
  Beat(s.get(), t2);
  auto a1 = s->Submit(Spec("a1"), "", "alice");
  auto a2 = s->Submit(Spec("a2"), "", "alice");
  ASSERT_TRUE(a1.ok() && a2.ok());
  ASSERT_EQ(s->Get(a2->id())->state(), v1::RUNNING);  // borrowed
  const std::string ta1 = s->Get(a1->id())->trainers(0), ta2 = s->Get(a2->id())->trainers(0);
  ASSERT_EQ(Beat(s.get(), ta1, {a1->id()}).drain_job_ids_size(), 0);
  ASSERT_EQ(Beat(s.get(), ta2, {a2->id()}).drain_job_ids_size(), 0);

  auto b1 = s->Submit(Spec("b1"), "", "bob");
  ASSERT_TRUE(b1.ok());
  const std::string preempting =
      "waiting for preemption: draining 1 job of queue team-a "
      "(reclaim_within_cohort)";
  EXPECT_EQ(s->Get(b1->id())->pending_reason(),
            "queue team-b: trainers 0 in use + 1 requested is within quota 1, but other queues of "
            "cohort research borrow 1 of it; reclaim is any; " +
                preempting);
  EXPECT_EQ(s->Get(b1->id())->events().rbegin()->reason(), preempting);
  EXPECT_EQ(s->Get(a2->id())->events().rbegin()->reason(),
            "preempted (drained at a step, back at the head of its queue) to reclaim quota for "
            "queue team-b (reclaim_within_cohort: any; queue team-a borrows above its quota)");
  // Only the borrowed job drains; asking again starts nothing new.
  HeartbeatReply drain = Beat(s.get(), ta2, {a2->id()});
  ASSERT_EQ(drain.drain_job_ids_size(), 1);
  EXPECT_EQ(drain.drain_job_ids(0), a2->id());
  EXPECT_EQ(Beat(s.get(), ta1, {a1->id()}).drain_job_ids_size(), 0);
  EXPECT_EQ(s->Get(b1->id())->pending_reason(),
            "queue team-b: trainers 0 in use + 1 requested is within quota 1, but other queues of "
            "cohort research borrow 1 of it; reclaim is any; waiting for 1 preempted job to drain");

  ProgressReport d = Final(ta2, a2->id(), 0, v1::FAILED);
  d.set_epoch(1);
  d.set_step(7);
  d.set_retryable(true);
  d.set_drained(true);
  d.set_attempt(1);
  d.set_reason("drained at epoch 2 step 7");
  d.set_checkpoint_path("/ckpt/a2.ckpt");
  d.set_checkpoint_epoch(1);
  d.set_checkpoint_step(7);
  ASSERT_TRUE(s->ReportProgress(d).ok());
  auto st = s->Get(a2->id());
  EXPECT_EQ(st->state(), v1::QUEUED);
  EXPECT_EQ(st->drains(), 1);
  EXPECT_EQ(st->checkpoint_step(), 7);
  EXPECT_EQ(st->pending_reason(),
            "queue team-a: trainers 1 in use + 1 requested > quota 1 + borrowable 0 (cohort "
            "research: 2 of 2 shared in use)");
  EXPECT_EQ(s->Get(b1->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(b1->id())->trainers(0), ta2);

  // b1 ends: a2 borrows again and resumes at the drained step.
  ASSERT_TRUE(s->ReportProgress(Final(ta2, b1->id(), 0, v1::SUCCEEDED)).ok());
  st = s->Get(a2->id());
  EXPECT_EQ(st->state(), v1::RUNNING);
  EXPECT_EQ(st->attempts(), 2);
  EXPECT_EQ(st->checkpoint_step(), 7);
}

// Within one queue a higher-priority job drains a lower one (within_queue:
// lower_priority); one of equal priority waits.
TEST_F(SchedulerTest, QueuesHigherPriorityDrainsALowerOneOfItsQueue) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(
      "queues:\n  - name: q\n    quota: {trainers: 1}\n    users: [alice, bob]\n"
      "preemption: {within_queue: lower_priority}\n");
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  auto s = Open(std::move(o));
  const std::string t = AddTrainer(s.get());
  Beat(s.get(), t);
  auto low = s->Submit(Spec("low", 1, 0), "", "alice");
  ASSERT_TRUE(low.ok());
  ASSERT_EQ(Beat(s.get(), t, {low->id()}).drain_job_ids_size(), 0);
  auto same = s->Submit(Spec("same", 1, 0), "", "bob");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(Beat(s.get(), t, {low->id()}).drain_job_ids_size(), 0);
  EXPECT_EQ(s->Get(same->id())->pending_reason(),
            "queue q: trainers 1 in use + 1 requested > quota 1");
  auto urgent = s->Submit(Spec("urgent", 1, 5), "", "bob");
  ASSERT_TRUE(urgent.ok());
  EXPECT_EQ(s->Get(low->id())->events().rbegin()->reason(),
            "preempted (drained at a step, back at the head of its queue) for a job of priority 5 "
            "in queue q (within_queue: lower_priority)");
  EXPECT_EQ(s->Get(urgent->id())->events().rbegin()->reason(),
            "waiting for preemption: draining 1 job of queue q (within_queue)");
  ASSERT_EQ(Beat(s.get(), t, {low->id()}).drain_job_ids_size(), 1);
  ProgressReport d = Final(t, low->id(), 0, v1::FAILED);
  d.set_retryable(true);
  d.set_drained(true);
  d.set_attempt(1);
  ASSERT_TRUE(s->ReportProgress(d).ok());
  EXPECT_EQ(s->Get(urgent->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(low->id())->state(), v1::QUEUED);
  EXPECT_EQ(s->Get(low->id())->drains(), 1);
}

// Reclaim from an elastic job above min_trainers shrinks it instead of
// draining it: it keeps rank 0 in a new generation, the trainer it gives up
// gets the regroup too (it leaves at that step) and then takes bob's job;
// events on both jobs name the other's queue and the rule, never the other
// job; the metric counts a "shrink". Once bob's job ends the elastic job
// grows back.
TEST_F(SchedulerTest, QueuesShrinkAnElasticJobInsteadOfPreemptingItAndGrowItBack) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(queue_test::kTwoTeamsQueues);
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  auto s = Open(std::move(o));
  JobSpec spec = Spec("elastic", 2);
  spec.set_min_trainers(1);
  auto a = s->Submit(spec, "", "alice");
  ASSERT_TRUE(a.ok()) << a.status();
  std::string t1, t2;
  ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2));
  auto st = s->Get(a->id());
  ASSERT_EQ(st->state(), v1::RUNNING);  // one trainer borrowed from team-b
  const std::string root = st->trainers(0), other = st->trainers(1);
  Beat(s.get(), root, {a->id()});
  Beat(s.get(), other, {a->id()});
  Progressed(s.get(), a->id(), root, other);

  auto b = s->Submit(Spec("b"), "", "bob");
  ASSERT_TRUE(b.ok());
  st = s->Get(a->id());
  EXPECT_EQ(st->state(), v1::RUNNING);
  EXPECT_EQ(st->attempts(), 1);
  EXPECT_EQ(st->generation(), 1);
  ASSERT_EQ(st->trainers_size(), 1);
  EXPECT_EQ(st->trainers(0), root);
  const std::string shrink_event = st->events().rbegin()->reason();
  EXPECT_EQ(shrink_event,
            "shrinking from 2 to 1 trainers to reclaim quota for queue team-b "
            "(reclaim_within_cohort: any; queue team-a borrows above its quota); " +
                other + " leaves at a step boundary (generation 1)");
  EXPECT_EQ(shrink_event.find(b->id()), std::string::npos);
  const std::string waiting = s->Get(b->id())->events().rbegin()->reason();
  EXPECT_EQ(waiting,
            "waiting for preemption: shrinking 1 job of queue team-a (reclaim_within_cohort)");
  EXPECT_EQ(waiting.find(a->id()), std::string::npos);
  // Nobody drains; both ranks get the new membership (without `other`).
  for (const std::string& t : {root, other}) {
    HeartbeatReply hb = Beat(s.get(), t, {a->id()});
    EXPECT_EQ(hb.drain_job_ids_size(), 0) << t;
    EXPECT_EQ(hb.cancel_job_ids_size(), 0) << t;
    ASSERT_EQ(hb.regroups_size(), 1) << t;
    EXPECT_EQ(hb.regroups(0).generation(), 1);
    ASSERT_EQ(hb.regroups(0).trainer_ids_size(), 1);
    EXPECT_EQ(hb.regroups(0).trainer_ids(0), root);
  }
  // Until `other` has left, bob's job waits for it.
  EXPECT_EQ(s->Get(b->id())->state(), v1::QUEUED);
  const std::vector<QueueMetrics> m = s->Stats().queues;
  EXPECT_EQ(m[0].preemptions.at("shrink"), 1);
  EXPECT_EQ(m[0].preemptions.at("reclaim_within_cohort"), 0);

  // The root regrouped: an event, not a recovery. `other` finds itself out
  // of the membership and ends; bob's job takes its trainer.
  ASSERT_TRUE(s->ReportProgress(Recovered(root, a->id(), 0, 1, 0.4, 0)).ok());
  st = s->Get(a->id());
  EXPECT_EQ(st->recoveries(), 0);
  EXPECT_EQ(st->events().rbegin()->reason(),
            "shrank to 1 trainer (" + other + " left) in 0.4 s (generation 1)");
  ProgressReport left = Final(other, a->id(), 1, v1::FAILED);
  left.set_attempt(1);
  left.set_reason("this trainer is not in generation 1 of the job");
  ASSERT_TRUE(s->ReportProgress(left).ok());
  EXPECT_EQ(s->Get(a->id())->state(), v1::RUNNING);
  auto bs = s->Get(b->id());
  ASSERT_EQ(bs->state(), v1::RUNNING);
  EXPECT_EQ(bs->trainers(0), other);

  // bob's job ends: alice's grows back onto the trainer, borrowing again.
  Beat(s.get(), other, {b->id()});
  ASSERT_TRUE(s->ReportProgress(Final(other, b->id(), 0, v1::SUCCEEDED)).ok());
  Beat(s.get(), other);
  st = s->Get(a->id());
  EXPECT_EQ(st->state(), v1::RUNNING);
  EXPECT_EQ(st->attempts(), 1);
  EXPECT_EQ(st->drains(), 0);
  ASSERT_EQ(st->trainers_size(), 2) << st->DebugString();
  EXPECT_EQ(st->trainers(1), other);
  EXPECT_EQ(st->generation(), 2);
}

// Within one queue a higher-priority job shrinks a lower elastic one that
// has made progress (within_queue: lower_priority); one that has not (its
// membership may still be meeting) is drained whole instead.
TEST_F(SchedulerTest, QueuesShrinkOnlyASettledElasticJobForAHigherPriorityOne) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(
      "queues:\n  - name: q\n    quota: {trainers: 2}\n    users: [alice, bob]\n"
      "preemption: {within_queue: lower_priority}\n");
  ASSERT_TRUE(queues.ok()) << queues.status();
  for (const bool progressed : {true, false}) {
    SCOPED_TRACE(progressed ? "progressed" : "no progress");
    SchedulerOptions o = Options();
    o.queues = *queues;
    auto s = Open(std::move(o));
    JobSpec spec = Spec("elastic", 2);
    spec.set_min_trainers(1);
    auto low = s->Submit(spec, "", "alice");
    ASSERT_TRUE(low.ok()) << low.status();
    std::string t1, t2;
    ASSERT_NO_FATAL_FAILURE(PlaceOnTwoTrainers(s.get(), &t1, &t2));
    auto st = s->Get(low->id());
    const std::string root = st->trainers(0), other = st->trainers(1);
    Beat(s.get(), root, {low->id()});
    Beat(s.get(), other, {low->id()});
    if (progressed) Progressed(s.get(), low->id(), root, other);
    auto urgent = s->Submit(Spec("urgent", 1, 5), "", "bob");
    ASSERT_TRUE(urgent.ok());
    st = s->Get(low->id());
    if (progressed) {
      EXPECT_EQ(st->events().rbegin()->reason(),
                "shrinking from 2 to 1 trainers for a job of priority 5 in queue q "
                "(within_queue: lower_priority); " +
                    other + " leaves at a step boundary (generation 1)");
      EXPECT_EQ(s->Get(urgent->id())->events().rbegin()->reason(),
                "waiting for preemption: shrinking 1 job of queue q (within_queue)");
      EXPECT_EQ(Beat(s.get(), root, {low->id()}).drain_job_ids_size(), 0);
      EXPECT_EQ(s->Stats().queues[0].preemptions.at("shrink"), 1);
      EXPECT_EQ(s->Stats().queues[0].preemptions.at("within_queue"), 0);
    } else {
      EXPECT_EQ(st->trainers_size(), 2);
      EXPECT_EQ(st->events().rbegin()->reason(),
                "preempted (drained at a step, back at the head of its queue) for a job of "
                "priority 5 in queue q (within_queue: lower_priority)");
      EXPECT_EQ(Beat(s.get(), root, {low->id()}).drain_job_ids_size(), 1);
      EXPECT_EQ(s->Stats().queues[0].preemptions.at("shrink"), 0);
      EXPECT_EQ(s->Stats().queues[0].preemptions.at("within_queue"), 1);
    }
  }
}

// Inside a queue, at equal priority, the user with the smaller share of it
// goes first, whoever submitted first.
TEST_F(SchedulerTest, QueuesOrderUsersOfAQueueByTheirShare) {
  absl::StatusOr<QueueConfig> queues =
      ParseQueueConfig("queues:\n  - name: q\n    quota: {trainers: 2}\n    users: [alice, bob]\n");
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  auto s = Open(std::move(o));
  const std::string t1 = AddTrainer(s.get()), t2 = AddTrainer(s.get());
  Beat(s.get(), t1);
  Beat(s.get(), t2);
  auto a1 = s->Submit(Spec("a1"), "", "alice");
  auto a2 = s->Submit(Spec("a2"), "", "alice");
  auto a3 = s->Submit(Spec("a3"), "", "alice");
  auto b1 = s->Submit(Spec("b1"), "", "bob");
  ASSERT_TRUE(a1.ok() && a2.ok() && a3.ok() && b1.ok());
  ASSERT_EQ(s->Get(a2->id())->state(), v1::RUNNING);
  // a1 ends: bob (no share) goes before alice's older a3.
  const std::string t = s->Get(a1->id())->trainers(0);
  ASSERT_TRUE(s->ReportProgress(Final(t, a1->id(), 0, v1::SUCCEEDED)).ok());
  EXPECT_EQ(s->Get(b1->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(a3->id())->state(), v1::QUEUED);
}

// Fairness between the users of one queue in the running scheduler: alice
// queues 12 jobs, then bob 12 (arrival order alone would run all of
// alice's first); while both wait, each freed trainer goes to the user with
// the smaller share, so they get equal trainer time (one tick per job).
TEST_F(SchedulerTest, QueuesGiveTwoUsersOfAQueueEqualTrainerTime) {
  absl::StatusOr<QueueConfig> queues =
      ParseQueueConfig("queues:\n  - name: q\n    quota: {trainers: 2}\n    users: [alice, bob]\n");
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  auto s = Open(std::move(o));
  for (int i = 0; i < 2; ++i) Beat(s.get(), AddTrainer(s.get()));
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(s->Submit(Spec("a"), "", "alice").ok());
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(s->Submit(Spec("b"), "", "bob").ok());
  std::map<std::string, int> ticks;  // trainer-ticks per user while both wait
  for (int tick = 0; tick < 10; ++tick) {
    const std::vector<JobStatus> running = s->List(v1::RUNNING);
    ASSERT_EQ(running.size(), 2u) << "tick " << tick;
    for (const JobStatus& j : running) ++ticks[j.owner()];
    now_ += absl::Seconds(10);  // a tick: 10 s on one device
    for (const JobStatus& j : running) {
      Beat(s.get(), j.trainers(0), {j.id()});  // delivered
      ASSERT_TRUE(s->ReportProgress(Final(j.trainers(0), j.id(), 0, v1::SUCCEEDED)).ok());
    }
  }
  EXPECT_EQ(ticks["alice"] + ticks["bob"], 20);
  EXPECT_LE(std::abs(ticks["alice"] - ticks["bob"]), 20 / 10)
      << ticks["alice"] << " vs " << ticks["bob"];
  // What trainctl queues shows admins: each user's device-seconds, the
  // running jobs' so far included (4 s into the next tick).
  now_ += absl::Seconds(4);
  std::map<std::string, int> running;
  for (const JobStatus& j : s->List(v1::RUNNING)) ++running[j.owner()];
  const v1::ListQueuesReply reply = s->ListQueues(/*with_yaml=*/true);
  ASSERT_EQ(reply.queues_size(), 1);
  ASSERT_EQ(reply.queues(0).user_usage_size(), 2);
  for (const v1::QueueUserUsage& u : reply.queues(0).user_usage()) {
    EXPECT_DOUBLE_EQ(u.device_seconds(), 10.0 * ticks[u.user()] + 4.0 * running[u.user()])
        << u.user();
    EXPECT_EQ(u.running(), running[u.user()]) << u.user();
    EXPECT_EQ(u.pending(), 12 - ticks[u.user()] - running[u.user()]) << u.user();
  }
  // Others' names and usage are for admins only.
  EXPECT_EQ(s->ListQueues(/*with_yaml=*/false).queues(0).user_usage_size(), 0);
}

// JobSpec.queue picks one of the owner's queues (JobStatus.queue says which);
// an unknown queue and another team's are refused naming the owner's queues.
TEST_F(SchedulerTest, QueuesJobSpecQueuePicksOneOfTheOwnersQueues) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(
      "queues:\n  - name: a\n    quota: {trainers: 1}\n    users: [alice]\n"
      "  - name: shared\n    quota: {trainers: 1}\n    users: [alice, bob]\n"
      "default_queues: {alice: a}\n");
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  auto s = Open(std::move(o));
  auto by_default = s->Submit(Spec("d"), "", "alice");
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ(by_default->queue(), "a");
  JobSpec spec = Spec("named");
  spec.set_queue("shared");
  auto named = s->Submit(spec, "", "alice");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->queue(), "shared");
  spec.set_queue("a");
  auto other = s->Submit(spec, "", "bob");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other.status().message(), "user bob may not submit to queue a (your queues: shared)");
  spec.set_queue("nope");
  auto unknown = s->Submit(spec, "", "alice");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(),
            "queue: unknown queue 'nope' (queues: a, shared; yours: a, shared)");
  EXPECT_EQ(s->List().size(), 2u);  // nothing was queued for the refused ones
}

// ListQueues: quota, usage, borrowed, lent, pending and admitted per queue;
// QUEUED jobs carry their position in their queue.
TEST_F(SchedulerTest, QueuesListShowsUsageBorrowedLentAndPositions) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(queue_test::kTwoTeamsQueues);
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options();
  o.queues = *queues;
  auto s = Open(std::move(o));
  EXPECT_FALSE(Open(Options())->ListQueues(true).configured());
  for (int i = 0; i < 2; ++i) Beat(s.get(), AddTrainer(s.get()));
  auto a1 = s->Submit(Spec("a1"), "", "alice");
  auto a2 = s->Submit(Spec("a2"), "", "alice");  // borrows team-b's trainer
  auto a3 = s->Submit(Spec("a3"), "", "alice");
  auto a4 = s->Submit(Spec("a4"), "", "alice");
  ASSERT_TRUE(a1.ok() && a2.ok() && a3.ok() && a4.ok());
  EXPECT_EQ(s->Get(a3->id())->queue_position(), 1);
  EXPECT_EQ(s->Get(a4->id())->queue_position(), 2);
  EXPECT_EQ(s->Get(a1->id())->queue_position(), 0);  // running
  const v1::ListQueuesReply r = s->ListQueues(false);
  ASSERT_TRUE(r.configured());
  EXPECT_EQ(r.yaml(), "");
  ASSERT_EQ(r.queues_size(), 2);
  const v1::QueueStatus& a = r.queues(0);
  const v1::QueueStatus& b = r.queues(1);
  EXPECT_EQ(a.name(), "team-a");
  EXPECT_EQ(a.cohort(), "research");
  EXPECT_EQ(a.resources(0), "trainers");
  EXPECT_EQ(a.quota().trainers(), 1);
  EXPECT_EQ(a.usage().trainers(), 2);
  EXPECT_EQ(a.borrowed().trainers(), 1);
  EXPECT_EQ(a.lent().trainers(), 0);
  EXPECT_EQ(a.pending(), 2);
  EXPECT_EQ(a.admitted(), 2);
  EXPECT_EQ(b.usage().trainers(), 0);
  EXPECT_EQ(b.lent().trainers(), 1);
  EXPECT_EQ(b.available().trainers(), 0);  // lent: free again once reclaimed
  EXPECT_EQ(b.reclaim_within_cohort(), "any");
  EXPECT_EQ(a.preempted().at("reclaim_within_cohort"), 0);
  // bob reclaims: counted against team-a's queue.
  ASSERT_TRUE(s->Submit(Spec("b1"), "", "bob").ok());
  EXPECT_EQ(s->ListQueues(false).queues(0).preempted().at("reclaim_within_cohort"), 1);
  const SchedulerStats st = s->Stats();
  ASSERT_EQ(st.queues.size(), 2u);
  EXPECT_EQ(st.queues[0].preemptions.at("reclaim_within_cohort"), 1);
  int64_t admissions = 0;
  for (int64_t n : st.queues[0].wait_counts) admissions += n;
  EXPECT_EQ(admissions, 2);  // a1 and a2
}

// ApplyQueues: a malformed file and one that would strand running jobs are
// refused (naming the problem; nothing changes); an accepted one is logged
// and survives a restart with the same --queues file, not a changed one.
TEST_F(SchedulerTest, QueuesApplyRefusesStrandingAndSurvivesARestart) {
  const std::string wal = TmpPath("queues.wal");
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(queue_test::kTwoTeamsQueues);
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options(wal);
  o.queues = *queues;
  o.queues_yaml = queue_test::kTwoTeamsQueues;
  auto s = Open(o);
  EXPECT_EQ(Open(Options())->ApplyQueues(queue_test::kTwoTeamsQueues, "root").status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (int i = 0; i < 2; ++i) Beat(s.get(), AddTrainer(s.get()));
  auto a1 = s->Submit(Spec("a1"), "", "alice");
  auto a2 = s->Submit(Spec("a2"), "", "alice");
  ASSERT_TRUE(a1.ok() && a2.ok());
  ASSERT_EQ(s->Get(a2->id())->state(), v1::RUNNING);  // team-a uses 2

  auto bad = s->ApplyQueues("queues:\n  - name: x\n    quota: {trainers: -1}\n", "root");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "queues file line 3: queue x: negative quota trainers (-1)");
  const std::string shrunk =
      "queues:\n  - name: team-a\n    quota: {trainers: 1}\n    users: [alice]\n"
      "  - name: team-b\n    quota: {trainers: 1}\n    users: [bob]\n";
  auto strand = s->ApplyQueues(shrunk, "root");
  EXPECT_EQ(strand.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(strand.status().message()),
              ::testing::HasSubstr("would strand running jobs: queue team-a uses trainers 2"));
  EXPECT_EQ(s->ListQueues(true).yaml(), queue_test::kTwoTeamsQueues);
  EXPECT_EQ(s->Get(a2->id())->state(), v1::RUNNING);
  EXPECT_EQ(s->Get(a2->id())->events_size(), 2);  // submitted, placed: nothing else

  const std::string bigger =
      "queues:\n  - name: team-a\n    quota: {trainers: 3}\n    users: [alice]\n"
      "  - name: team-b\n    quota: {trainers: 1}\n    users: [bob]\n";
  auto applied = s->ApplyQueues(bigger, "root");
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->yaml(), bigger);
  EXPECT_EQ(applied->queues(0).quota().trainers(), 3);
  EXPECT_EQ(applied->queues(0).borrowed().trainers(), 0);
  s.reset();
  s = Open(o);  // the same --queues file: the applied one stays
  EXPECT_EQ(s->ListQueues(true).yaml(), bigger);
  EXPECT_EQ(s->ListQueues(true).queues(0).usage().trainers(), 2);
  s.reset();
  o.queues_yaml = shrunk;  // the ConfigMap changed since: the file wins
  auto changed = ParseQueueConfig(shrunk);
  ASSERT_TRUE(changed.ok());
  o.queues = *changed;
  s = Open(o);
  EXPECT_EQ(s->ListQueues(true).yaml(), shrunk);
}

// A scheduler restart restarts nothing: the trainers of a running attempt
// register again saying what they run, and the restarted scheduler adopts
// the attempt (same ids, same attempt, the progress since the last logged
// epoch) instead of requeueing it.
class RestartTest : public SchedulerTest {
 protected:
  // A 2-trainer job placed and delivered on trainers_[0] and trainers_[1].
  std::unique_ptr<Scheduler> StartJob(const SchedulerOptions& o) {
    auto s = Open(o);
    job_ = s->Submit(Spec("adopted", 2))->id();
    trainers_ = {AddTrainer(s.get()), AddTrainer(s.get())};
    for (const std::string& t : trainers_) {
      HeartbeatReply r = Beat(s.get(), t);
      EXPECT_EQ(r.assignments_size(), 1);
    }
    return s;
  }

  // Registers trainer `rank` again as its agent does after a NOT_FOUND
  // heartbeat; returns the id it got.
  std::string Reregister(Scheduler* s, int rank, int attempt = 1, int epoch = 0, int step = 0) {
    RegisterTrainerRequest r;
    r.set_name("host");
    r.add_devices("cpu");
    r.set_previous_trainer_id(trainers_[rank]);
    RegisterTrainerRequest::RunningWork* w = r.mutable_running();
    w->set_job_id(job_);
    w->set_attempt(attempt);
    w->set_rank(rank);
    w->set_world_size(2);
    w->set_epoch(epoch);
    w->set_step(step);
    w->add_devices("cpu");
    auto reply = s->RegisterTrainer(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->trainer_id() : "";
  }

  static bool HasEvent(const JobStatus& st, const std::string& text) {
    for (const v1::JobEvent& e : st.events()) {
      if (e.reason().find(text) != std::string::npos) return true;
    }
    return false;
  }

  std::string job_;
  std::vector<std::string> trainers_;
};

TEST_F(RestartTest, AdoptsTheRunningAttemptOnceEveryRankIsClaimed) {
  const std::string wal = TmpPath("adopt.wal");
  auto s = StartJob(Options(wal));
  ProgressReport p;
  p.set_trainer_id(trainers_[0]);
  p.set_job_id(job_);
  p.set_rank(0);
  p.set_attempt(1);
  p.set_epoch(1);  // logged
  ASSERT_TRUE(s->ReportProgress(p).ok());
  s.reset();  // killed
  s = Open(Options(wal));

  // Until it registers again: a heartbeat is told to register, but a
  // report or a store call is only unavailable (NOT_FOUND would stop the
  // trainer's job).
  HeartbeatRequest beat;
  beat.set_trainer_id(trainers_[0]);
  EXPECT_EQ(s->Heartbeat(beat).status().code(), absl::StatusCode::kNotFound);
  p.set_step(3);
  EXPECT_EQ(s->ReportProgress(p).status().code(), absl::StatusCode::kUnavailable);
  StoreSetRequest set;
  set.set_trainer_id(trainers_[1]);
  set.set_job_id(job_);
  set.set_attempt(1);
  set.set_key("dtrain/drain/claim");
  set.set_value("1");
  EXPECT_EQ(s->StoreSet(set).code(), absl::StatusCode::kUnavailable);

  EXPECT_EQ(Reregister(s.get(), 0, 1, 1, 7), trainers_[0]);
  JobStatus st = *s->Get(job_);
  EXPECT_EQ(st.state(), v1::RUNNING);
  EXPECT_FALSE(HasEvent(st, "adopted"));  // rank 1 is not claimed yet
  EXPECT_EQ(st.epoch(), 1);
  EXPECT_EQ(st.step(), 7);  // rank 0's claim brings the progress up to date
  // A trainer that claims nothing is a new one; a claim of another attempt
  // is not honoured either.
  const std::string fresh = AddTrainer(s.get());
  EXPECT_NE(fresh, trainers_[0]);
  EXPECT_NE(fresh, trainers_[1]);
  EXPECT_NE(Reregister(s.get(), 1, /*attempt=*/2), trainers_[1]);
  EXPECT_FALSE(HasEvent(*s->Get(job_), "adopted"));

  EXPECT_EQ(Reregister(s.get(), 1), trainers_[1]);
  st = *s->Get(job_);
  EXPECT_EQ(st.state(), v1::RUNNING);
  EXPECT_EQ(st.attempts(), 1);
  EXPECT_EQ(st.events().rbegin()->reason(),
            "scheduler restarted; adopted the running attempt 1 from its 2 trainers");
  ASSERT_EQ(st.trainers_size(), 2);
  EXPECT_EQ(st.trainers(0), trainers_[0]);
  EXPECT_EQ(st.trainers(1), trainers_[1]);

  // The attempt goes on: nothing new is delivered, nothing cancelled, the
  // store answers, and it ends on attempt 1.
  for (const std::string& t : trainers_) {
    HeartbeatReply r = Beat(s.get(), t, {job_});
    EXPECT_EQ(r.assignments_size(), 0);
    EXPECT_EQ(r.cancel_job_ids_size(), 0);
  }
  EXPECT_TRUE(s->StoreSet(set).ok());
  ASSERT_TRUE(s->ReportProgress(Final(trainers_[1], job_, 1, v1::SUCCEEDED)).ok());
  ASSERT_TRUE(s->ReportProgress(Final(trainers_[0], job_, 0, v1::SUCCEEDED)).ok());
  st = *s->Get(job_);
  EXPECT_EQ(st.state(), v1::SUCCEEDED);
  EXPECT_EQ(st.attempts(), 1);
  // The fresh trainer was free for other work all along.
  EXPECT_EQ(s->ListTrainers().size(), 4u);
}

// A claim retried (its reply lost while the restarted scheduler was busy)
// gets the same id back, before and after the adoption, and the job keeps
// running: were the trainer registered anew, its heartbeats, which list the
// job, would cancel it.
TEST_F(RestartTest, ARetriedClaimKeepsTheTrainerAndTheJob) {
  const std::string wal = TmpPath("retried-claim.wal");
  auto s = StartJob(Options(wal));
  s.reset();  // killed
  s = Open(Options(wal));
  EXPECT_EQ(Reregister(s.get(), 1), trainers_[1]);
  EXPECT_EQ(Reregister(s.get(), 1), trainers_[1]);  // before the adoption
  EXPECT_EQ(Reregister(s.get(), 0), trainers_[0]);
  ASSERT_TRUE(HasEvent(*s->Get(job_), "adopted the running attempt 1"));
  EXPECT_EQ(Reregister(s.get(), 1), trainers_[1]);  // after it
  for (const std::string& t : trainers_) {
    HeartbeatReply r = Beat(s.get(), t, {job_});
    EXPECT_EQ(r.cancel_job_ids_size(), 0) << t;
    EXPECT_EQ(r.assignments_size(), 0) << t;
  }
  JobStatus st = *s->Get(job_);
  EXPECT_EQ(st.state(), v1::RUNNING);
  EXPECT_EQ(st.attempts(), 1);
  EXPECT_EQ(s->ListTrainers().size(), 2u);
}

TEST_F(RestartTest, PartlyClaimedAttemptIsRequeuedAfterTheTimeoutWithoutCounting) {
  const std::string wal = TmpPath("partial.wal");
  SchedulerOptions o = Options(wal);
  o.max_attempts = 2;
  o.recover_in_place = false;
  auto s = StartJob(o);
  s.reset();
  s = Open(o);
  ASSERT_EQ(Reregister(s.get(), 0), trainers_[0]);
  now_ += absl::Seconds(5);
  Beat(s.get(), trainers_[0], {job_});
  s->CheckLiveness();
  EXPECT_EQ(s->Get(job_)->state(), v1::RUNNING);  // within the heartbeat timeout
  now_ += absl::Seconds(6);
  Beat(s.get(), trainers_[0], {job_});
  s->CheckLiveness();
  JobStatus st = *s->Get(job_);
  EXPECT_EQ(st.state(), v1::QUEUED);
  EXPECT_EQ(st.events().rbegin()->reason().rfind(kRestartRequeued, 0), 0u)
      << st.events().rbegin()->reason();
  EXPECT_NE(st.events().rbegin()->reason().find("rank 1 (" + trainers_[1] + ") not claimed"),
            std::string::npos)
      << st.events().rbegin()->reason();
  // The claimed trainer is told to stop its rank of the old attempt.
  HeartbeatReply r = Beat(s.get(), trainers_[0], {job_});
  ASSERT_EQ(r.cancel_job_ids_size(), 1);
  EXPECT_EQ(r.cancel_job_ids(0), job_);
  ProgressReport stopped = Final(trainers_[0], job_, 0, v1::CANCELLED);
  stopped.set_attempt(1);
  ASSERT_TRUE(s->ReportProgress(stopped).ok());

  // Placed again (attempt 2); a trainer lost there requeues it: with
  // max_attempts 2 it would fail if the restart's requeue counted.
  const std::string t2 = AddTrainer(s.get());
  st = *s->Get(job_);
  ASSERT_EQ(st.state(), v1::RUNNING);
  EXPECT_EQ(st.attempts(), 2);
  Beat(s.get(), trainers_[0]);
  Beat(s.get(), t2);
  now_ += absl::Seconds(8);
  Beat(s.get(), trainers_[0], {job_});
  now_ += absl::Seconds(5);
  EXPECT_EQ(s->CheckLiveness(), 1);
  st = *s->Get(job_);
  EXPECT_EQ(st.state(), v1::QUEUED) << st.events().rbegin()->reason();
}

TEST_F(RestartTest, ThreeRestartsInARowLeaveTheJobAtAttemptOne) {
  const std::string wal = TmpPath("three.wal");
  auto s = StartJob(Options(wal));
  for (int restart = 1; restart <= 3; ++restart) {
    s.reset();
    now_ += absl::Seconds(2);
    s = Open(Options(wal));
    ASSERT_EQ(Reregister(s.get(), 1, 1, 0, restart), trainers_[1]);
    ASSERT_EQ(Reregister(s.get(), 0, 1, 0, restart), trainers_[0]);
    JobStatus st = *s->Get(job_);
    EXPECT_EQ(st.state(), v1::RUNNING);
    EXPECT_EQ(st.attempts(), 1);
    EXPECT_EQ(st.step(), restart);
    int adoptions = 0;
    for (const v1::JobEvent& e : st.events()) {
      if (e.reason().find("adopted the running attempt 1") != std::string::npos) ++adoptions;
    }
    EXPECT_EQ(adoptions, restart);  // each adoption is logged
  }
  ASSERT_TRUE(s->ReportProgress(Final(trainers_[0], job_, 0, v1::SUCCEEDED)).ok());
  ASSERT_TRUE(s->ReportProgress(Final(trainers_[1], job_, 1, v1::SUCCEEDED)).ok());
  EXPECT_EQ(s->Get(job_)->state(), v1::SUCCEEDED);
  EXPECT_EQ(s->Get(job_)->attempts(), 1);
}

// With queues, a restarted scheduler counts the running attempt against its
// queue from the log while it awaits the claims, and after adopting it:
// team-a's 2-trainer job (its quota and 1 borrowed) leaves no room for
// alice's next job though a trainer is free, before and after the claims;
// once it ends, the next job is admitted.
TEST_F(RestartTest, QueueUsageIsRebuiltFromTheLogAndTheClaims) {
  absl::StatusOr<QueueConfig> queues = ParseQueueConfig(queue_test::kTwoTeamsQueues);
  ASSERT_TRUE(queues.ok()) << queues.status();
  SchedulerOptions o = Options(TmpPath("queues.wal"));
  o.queues = *queues;
  auto s = Open(o);
  trainers_ = {AddTrainer(s.get()), AddTrainer(s.get())};
  auto job = s->Submit(Spec("borrower", 2), "", "alice");
  ASSERT_TRUE(job.ok()) << job.status();
  job_ = job->id();
  for (const std::string& t : trainers_) EXPECT_EQ(Beat(s.get(), t).assignments_size(), 1);
  EXPECT_EQ(s->Get(job_)->state(), v1::RUNNING);
  s.reset();  // killed
  s = Open(o);

  const std::string spare = AddTrainer(s.get());
  Beat(s.get(), spare);
  auto next = s->Submit(Spec("next"), "", "alice");
  ASSERT_TRUE(next.ok()) << next.status();
  const std::string full =
      "queue team-a: trainers 2 in use + 1 requested > quota 1 + borrowing limit 1";
  EXPECT_EQ(s->Get(next->id())->state(), v1::QUEUED);  // awaiting the claims: still counted
  EXPECT_EQ(s->Get(next->id())->pending_reason(), full);

  EXPECT_EQ(Reregister(s.get(), 0), trainers_[0]);
  EXPECT_EQ(Reregister(s.get(), 1), trainers_[1]);
  ASSERT_TRUE(HasEvent(*s->Get(job_), "adopted the running attempt 1"));
  EXPECT_EQ(s->Get(next->id())->state(), v1::QUEUED);  // adopted: counted
  EXPECT_EQ(s->Get(next->id())->pending_reason(), full);

  ASSERT_TRUE(s->ReportProgress(Final(trainers_[0], job_, 0, v1::SUCCEEDED)).ok());
  ASSERT_TRUE(s->ReportProgress(Final(trainers_[1], job_, 1, v1::SUCCEEDED)).ok());
  EXPECT_EQ(s->Get(job_)->attempts(), 1);
  EXPECT_EQ(s->Get(next->id())->state(), v1::RUNNING);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

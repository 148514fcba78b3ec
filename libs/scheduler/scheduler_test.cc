#include "libs/scheduler/scheduler.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "gtest/gtest.h"

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
  ASSERT_TRUE(s->ReportProgress(p).ok());
  EXPECT_EQ(s->Get(job->id())->epoch(), 1);
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
  std::string t1 = AddTrainer(s.get());
  std::string t2 = AddTrainer(s.get());
  Beat(s.get(), t1);
  Beat(s.get(), t2);
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
  std::string t1 = AddTrainer(s.get());
  std::string t2 = AddTrainer(s.get());
  HeartbeatReply first = Beat(s.get(), t1);
  ASSERT_EQ(first.assignments_size(), 1);
  EXPECT_EQ(first.assignments(0).resume_checkpoint(), "");
  ASSERT_EQ(Beat(s.get(), t2).assignments_size(), 1);
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

  // The scheduler restarts: the job is requeued and keeps its checkpoint.
  s.reset();
  s = Open(Options(wal));
  auto st = s->Get(job->id());
  ASSERT_TRUE(st.ok());
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
  std::string id;
  {
    auto s = Open(Options(wal));
    id = s->Submit(Spec("long"))->id();
    std::string t = AddTrainer(s.get());
    Beat(s.get(), t);
    for (int epoch = 1; epoch <= 200; ++epoch) {
      ProgressReport p;
      p.set_trainer_id(t);
      p.set_job_id(id);
      p.set_epoch(epoch);
      ASSERT_TRUE(s->ReportProgress(p).ok());
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

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

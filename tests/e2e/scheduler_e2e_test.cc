// End to end: scheduler_server and a trainer daemon as child processes on
// loopback, driven through the JobService stubs and the trainctl binary.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/grpc_status.h"
#include "libs/base/subprocess.h"
#include "libs/rpc/credentials.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/kvstore/testing/server_process.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace {

namespace v1 = scheduler::v1;

using e2e::Ctx;
using e2e::Runfile;
using e2e::TmpDir;

// A child process that is not a server (the trainer daemon); killed
// (SIGKILL) when the test ends.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    SubprocessOptions options;
    options.argv = std::move(argv);
    absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
    EXPECT_TRUE(child.ok()) << child.status();
    if (child.ok()) child_ = *std::move(child);
  }
  // Sends SIGTERM and returns the exit status (-1 on timeout or a signal).
  int Terminate(absl::Duration timeout) {
    if (child_ == nullptr || !child_->Signal(SIGTERM).ok()) return -1;
    absl::StatusOr<ExitStatus> status = child_->Wait(timeout);
    return status.ok() ? status->exit_code() : -1;
  }

 private:
  std::unique_ptr<Subprocess> child_;
};

class SchedulerE2eTest : public ::testing::Test {
 protected:
  // The scheduler, trainers and trainctl run on mutual TLS as the test's admin.
  void SetUp() override { e2e::UseTestCredentials(); }

  void Connect() { stub_ = v1::JobService::NewStub(dtrain::rpc::NewChannel(scheduler_.address())); }

  static v1::SubmitRequest MlpJob(const std::string& name, int epochs) {
    v1::SubmitRequest r;
    v1::JobSpec* s = r.mutable_spec();
    s->set_name(name);
    s->set_model("mlp");
    s->set_epochs(epochs);
    s->set_global_batch_size(128);
    s->set_lr(0.1);
    s->set_init("kaiming");
    s->set_train_limit(4096);
    s->set_test_limit(1000);
    s->set_threads(1);
    return r;
  }

  // Watches job `id` to its end and returns the last status.
  v1::JobStatus WatchToEnd(const std::string& id) {
    absl::StatusOr<v1::JobStatus> last = e2e::WatchToEnd(stub_.get(), id, absl::Seconds(120));
    EXPECT_TRUE(last.ok()) << last.status();
    return last.ok() ? *last : v1::JobStatus();
  }

  // Runs trainctl against this test's scheduler; returns its output and
  // sets *rc.
  std::string Trainctl(const std::string& args, int* rc) {
    return e2e::Trainctl(absl::StrCat("--scheduler=", scheduler_.address(), " ", args), rc);
  }

  kvstore::ServerProcess scheduler_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(SchedulerE2eTest, SubmitTrainCancelRestart) {
  const std::string data_dir = TmpDir("scheduler");
  ASSERT_TRUE(scheduler_
                  .Start(Runfile("services/scheduler/scheduler_server"),
                         {"--data_dir=" + data_dir, "--heartbeat_timeout_s=3"})
                  .ok());
  Connect();
  Child trainer({Runfile("services/trainer/trainer"), "--scheduler=" + scheduler_.address(),
                 "--work_dir=" + TmpDir("trainer"), "--name=e2e"});

  // Submit, then watch it train to the end.
  v1::JobStatus job;
  absl::Status s = FromGrpcStatus(stub_->Submit(Ctx().get(), MlpJob("e2e-mlp", 2), &job), "Submit");
  ASSERT_TRUE(s.ok()) << s;
  v1::JobStatus done = WatchToEnd(job.id());
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.epoch(), 2);
  EXPECT_GT(done.test_accuracy(), 0.5);

  // A finished job cannot be cancelled.
  v1::CancelRequest cancel;
  cancel.set_id(job.id());
  v1::JobStatus ignored;
  grpc::Status gs = stub_->Cancel(Ctx().get(), cancel, &ignored);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << gs.error_message();

  // trainctl sees the same, and reports the error code.
  int rc;
  std::string out = Trainctl("-o json list", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(job.id()), std::string::npos) << out;
  out = Trainctl("cancel " + job.id(), &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("FAILED_PRECONDITION"), std::string::npos) << out;

  // trainctl submit -f (protobuf JSON) --wait streams the job to its end.
  const std::string spec_file = TmpDir("specs") + "/job.json";
  {
    FILE* f = std::fopen(spec_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"name": "from-json", "model": "mlp", "epochs": 1, "global_batch_size": 128,
                   "lr": 0.1, "init": "kaiming", "train_limit": 2048, "test_limit": 500,
                   "threads": 1})",
               f);
    std::fclose(f);
  }
  out = Trainctl("submit -f " + spec_file + " --wait", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  // The same as a YAML job file.
  const std::string yaml_file = TmpDir("specs") + "/job.yaml";
  {
    FILE* f = std::fopen(yaml_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        "# a tiny job\nname: from-yaml\nmodel: mlp\nepochs: 1\nglobal_batch_size: 128\n"
        "lr: 0.1\ninit: kaiming\ntrain_limit: 2048\ntest_limit: 500\nthreads: 1\n"
        "sync:\n  mode: ALLREDUCE\n",
        f);
    std::fclose(f);
  }
  out = Trainctl("submit -f " + yaml_file + " --wait", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("from-yaml"), std::string::npos) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  {
    FILE* f = std::fopen(yaml_file.c_str(), "w");
    std::fputs("name: bad\nsync: [1, 2]\n", f);
    std::fclose(f);
  }
  out = Trainctl("submit -f " + yaml_file, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("job.yaml:2: flow collections"), std::string::npos) << out;
  out = Trainctl("submit --name='bad name' --model=mlp --epochs=1 --batch_size=8 --lr=1", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("INVALID_ARGUMENT: JobService.Submit: name:"), std::string::npos) << out;

  // Cancel a running job: the trainer stops at the next step.
  v1::JobStatus running;
  s = FromGrpcStatus(stub_->Submit(Ctx().get(), MlpJob("to-cancel", 500), &running), "Submit");
  ASSERT_TRUE(s.ok()) << s;
  for (absl::Time deadline = absl::Now() + absl::Seconds(60);
       running.epoch() < 1 && absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(100))) {
    v1::GetRequest get;
    get.set_id(running.id());
    ASSERT_TRUE(stub_->Get(Ctx().get(), get, &running).ok());
  }
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_GE(running.epoch(), 1);
  cancel.set_id(running.id());
  cancel.set_reason("e2e cancel");
  gs = stub_->Cancel(Ctx().get(), cancel, &running);
  ASSERT_TRUE(gs.ok()) << gs.error_message();
  EXPECT_EQ(running.state(), v1::CANCELLED);
  EXPECT_EQ(running.events(running.events_size() - 1).reason(), "e2e cancel");

  // A job running while the scheduler crashes, watched with trainctl.
  v1::SubmitRequest watched_req = MlpJob("survives-restart", 6);
  watched_req.mutable_spec()->set_checkpoint_interval_epochs(1);
  watched_req.mutable_spec()->set_model("lenet");  // slow enough to be mid-job at the crash
  v1::JobStatus watched;
  s = FromGrpcStatus(stub_->Submit(Ctx().get(), watched_req, &watched), "Submit");
  ASSERT_TRUE(s.ok()) << s;
  std::string watch_out;
  int watch_rc = -1;
  std::thread watcher([&] { watch_out = Trainctl("watch " + watched.id(), &watch_rc); });
  for (absl::Time deadline = absl::Now() + absl::Seconds(60);
       watched.epoch() < 1 && absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(20))) {
    v1::GetRequest get;
    get.set_id(watched.id());
    ASSERT_TRUE(stub_->Get(Ctx().get(), get, &watched).ok());
  }
  ASSERT_EQ(watched.state(), v1::RUNNING) << watched.DebugString();

  // Crash the scheduler and restart it on the same port and data: the jobs
  // are still there (the running one adopted from its trainer, which trains
  // on and registers again claiming it: same attempt); the watch reconnects
  // and sees it through.
  ASSERT_TRUE(scheduler_.Kill(SIGKILL).ok());
  ASSERT_TRUE(scheduler_.Wait().ok());
  absl::SleepFor(absl::Milliseconds(500));  // the watch notices
  ASSERT_TRUE(scheduler_.Restart().ok());
  Connect();
  v1::ListReply list;
  s = FromGrpcStatus(stub_->List(Ctx().get(), v1::ListRequest(), &list), "List");
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(list.jobs_size(), 5);
  EXPECT_EQ(list.jobs(4).id(), watched.id());
  EXPECT_NE(list.jobs(4).state(), v1::FAILED) << list.jobs(4).DebugString();
  watcher.join();
  std::fprintf(stderr, "trainctl watch across the restart (exit %d):\n%s\n", watch_rc,
               watch_out.c_str());
  EXPECT_EQ(watch_rc, 0) << watch_out;
  EXPECT_NE(watch_out.find("reconnecting"), std::string::npos) << watch_out;
  EXPECT_NE(watch_out.find("SUCCEEDED"), std::string::npos) << watch_out;
  v1::GetRequest get_watched;
  get_watched.set_id(watched.id());
  ASSERT_TRUE(stub_->Get(Ctx().get(), get_watched, &watched).ok());
  EXPECT_EQ(watched.state(), v1::SUCCEEDED) << watched.DebugString();
  EXPECT_EQ(watched.attempts(), 1) << watched.DebugString();
  // `trainctl get` shows where it ran, the attempt and its checkpoint.
  int get_rc;
  const std::string got = Trainctl("get " + watched.id(), &get_rc);
  EXPECT_EQ(get_rc, 0) << got;
  EXPECT_NE(got.find("(attempt 1)"), std::string::npos) << got;
  EXPECT_NE(got.find("checkpoint: "), std::string::npos) << got;
  EXPECT_NE(got.find(".ckpt (epoch 6)"), std::string::npos) << got;
  EXPECT_NE(got.find("scheduler restarted; adopted the running attempt 1 from its 1 trainer"),
            std::string::npos)
      << got;
  EXPECT_GT(watched.loss(), 0) << watched.DebugString();
  EXPECT_GT(watched.test_accuracy(), 0.5) << watched.DebugString();
  EXPECT_EQ(list.jobs(0).id(), job.id());
  EXPECT_EQ(list.jobs(1).state(), v1::SUCCEEDED);  // from JSON
  EXPECT_EQ(list.jobs(2).state(), v1::SUCCEEDED);  // from YAML
  EXPECT_EQ(list.jobs(3).state(), v1::CANCELLED);
  EXPECT_EQ(list.jobs(0).state(), v1::SUCCEEDED);
  EXPECT_GT(list.jobs(0).test_accuracy(), 0.5);

  v1::JobStatus second;
  s = FromGrpcStatus(stub_->Submit(Ctx().get(), MlpJob("after-restart", 1), &second), "Submit");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_NE(second.id(), job.id());
  EXPECT_EQ(WatchToEnd(second.id()).state(), v1::SUCCEEDED);

  // Clean shutdown of both.
  EXPECT_EQ(trainer.Terminate(absl::Seconds(20)), 0);
  ASSERT_TRUE(scheduler_.Kill(SIGTERM).ok());
  auto status = scheduler_.Wait();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

// Device choice: by default a trainer offers the CUDA devices it finds, and
// CPU (with one log line saying why) on a machine without any, like this one
// when no GPU is present.
TEST(TrainerDevicesTest, FallsBackToCpuWithOneLogLine) {
  e2e::UseTestCredentials();
  int rc;
  std::string out = e2e::Run(
      absl::StrCat(
          "timeout -s INT 2 ", Runfile("services/trainer/trainer"),
          " --scheduler=127.0.0.1:1 --rpc_timeout_s=0.2 --work_dir=", TmpDir("trainer-devices")),
      &rc);
  if (out.find("devices: cuda") != std::string::npos) {
    // A GPU machine: the CUDA devices, no fallback.
    EXPECT_NE(out.find("with devices cuda:0"), std::string::npos) << out;
    EXPECT_EQ(out.find("devices: cpu"), std::string::npos) << out;
    return;
  }
  EXPECT_NE(out.find("devices: cpu (no CUDA device"), std::string::npos) << out;
  EXPECT_NE(out.find("with devices cpu"), std::string::npos) << out;
  // Insisting on CUDA without a GPU is a usage error naming the flag.
  out = e2e::Run(Runfile("services/trainer/trainer") + " --devices=cuda --scheduler=127.0.0.1:1",
                 &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--devices=cuda"), std::string::npos) << out;
}

// A trainer killed mid-job is declared lost after the heartbeat timeout;
// its job goes back to the queue with a reason and runs on the next trainer.
TEST_F(SchedulerE2eTest, KilledTrainerRequeuesItsJob) {
  ASSERT_TRUE(scheduler_
                  .Start(Runfile("services/scheduler/scheduler_server"),
                         {"--data_dir=" + TmpDir("scheduler-lost"), "--heartbeat_timeout_s=1"})
                  .ok());
  Connect();
  auto first = std::make_unique<Child>(std::vector<std::string>{
      Runfile("services/trainer/trainer"), "--scheduler=" + scheduler_.address(),
      "--work_dir=" + TmpDir("trainer-a"), "--name=a"});
  v1::JobStatus job;
  ASSERT_TRUE(stub_->Submit(Ctx().get(), MlpJob("survivor", 3), &job).ok());
  v1::GetRequest get;
  get.set_id(job.id());
  for (absl::Time deadline = absl::Now() + absl::Seconds(30);
       job.state() != v1::RUNNING && absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(50))) {
    ASSERT_TRUE(stub_->Get(Ctx().get(), get, &job).ok());
  }
  ASSERT_EQ(job.state(), v1::RUNNING);
  first.reset();  // SIGKILL
  for (absl::Time deadline = absl::Now() + absl::Seconds(30);
       job.state() == v1::RUNNING && absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(100))) {
    ASSERT_TRUE(stub_->Get(Ctx().get(), get, &job).ok());
  }
  ASSERT_EQ(job.state(), v1::QUEUED);
  EXPECT_NE(job.events(job.events_size() - 1).reason().find("lost"), std::string::npos)
      << job.DebugString();

  Child second({Runfile("services/trainer/trainer"), "--scheduler=" + scheduler_.address(),
                "--work_dir=" + TmpDir("trainer-b"), "--name=b"});
  v1::JobStatus done = WatchToEnd(job.id());
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(second.Terminate(absl::Seconds(20)), 0);
}

// Gang scheduling places a two-trainer job on both daemons, which meet
// through the scheduler's rendezvous store and train it together with TCP
// allreduce; then a running two-trainer job is cancelled and both stop.
TEST_F(SchedulerE2eTest, TwoTrainerJobTrainsAndCancels) {
  ASSERT_TRUE(scheduler_.Start(Runfile("services/scheduler/scheduler_server"), {}).ok());
  Connect();
  const std::string wa = TmpDir("trainer-m1"), wb = TmpDir("trainer-m2");
  Child a({Runfile("services/trainer/trainer"), "--scheduler=" + scheduler_.address(),
           "--work_dir=" + wa, "--name=m1", "--collective_host=127.0.0.1"});
  Child b({Runfile("services/trainer/trainer"), "--scheduler=" + scheduler_.address(),
           "--work_dir=" + wb, "--name=m2", "--collective_host=127.0.0.1"});
  v1::SubmitRequest req = MlpJob("two", 2);
  req.mutable_spec()->set_num_trainers(2);
  req.mutable_spec()->mutable_sync()->set_mode(v1::ALLREDUCE);
  req.mutable_spec()->set_checkpoint_interval_epochs(1);
  v1::JobStatus job;
  ASSERT_TRUE(stub_->Submit(Ctx().get(), req, &job).ok());
  const absl::Time start = absl::Now();
  v1::JobStatus done = WatchToEnd(job.id());
  std::fprintf(stderr, "two-trainer job %s: %s in %s, test accuracy %.3f, loss %.3f\n",
               done.id().c_str(), v1::JobState_Name(done.state()).c_str(),
               absl::FormatDuration(absl::Now() - start).c_str(), done.test_accuracy(),
               done.loss());
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_EQ(done.trainers_size(), 2);
  EXPECT_EQ(done.attempts(), 1);
  EXPECT_EQ(done.epoch(), 2);
  EXPECT_GT(done.test_accuracy(), 0.6) << done.DebugString();
  // Rank 0 checkpointed replica 0 after each epoch.
  struct stat st;
  const std::string ckpt = absl::StrCat("/", job.id(), ".ckpt");
  EXPECT_TRUE(stat((wa + ckpt).c_str(), &st) == 0 || stat((wb + ckpt).c_str(), &st) == 0);

  // A long two-trainer job: cancel it while it runs; both trainers stop
  // (they report their ends and are free for the next job) within seconds.
  v1::SubmitRequest long_req = MlpJob("two-long", 10000);
  long_req.mutable_spec()->set_num_trainers(2);
  v1::JobStatus running;
  ASSERT_TRUE(stub_->Submit(Ctx().get(), long_req, &running).ok());
  v1::GetRequest get;
  get.set_id(running.id());
  for (absl::Time deadline = absl::Now() + absl::Seconds(60);
       (running.state() != v1::RUNNING || running.epoch() < 1) && absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(100))) {
    ASSERT_TRUE(stub_->Get(Ctx().get(), get, &running).ok());
  }
  ASSERT_EQ(running.state(), v1::RUNNING) << running.DebugString();
  ASSERT_GE(running.epoch(), 1) << running.DebugString();
  v1::CancelRequest cancel;
  cancel.set_id(running.id());
  cancel.set_reason("e2e cancel of two trainers");
  ASSERT_TRUE(stub_->Cancel(Ctx().get(), cancel, &running).ok());
  EXPECT_EQ(running.state(), v1::CANCELLED);
  const absl::Time cancelled = absl::Now();

  // Both trainers are free again when a new two-trainer job can start; it
  // needs both, so it runs only after both stopped the cancelled one.
  v1::SubmitRequest next_req = MlpJob("two-next", 1);
  next_req.mutable_spec()->set_num_trainers(2);
  next_req.mutable_spec()->set_train_limit(1024);
  v1::JobStatus next;
  ASSERT_TRUE(stub_->Submit(Ctx().get(), next_req, &next).ok());
  get.set_id(next.id());
  for (absl::Time deadline = absl::Now() + absl::Seconds(30);
       next.state() == v1::QUEUED && absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(50))) {
    ASSERT_TRUE(stub_->Get(Ctx().get(), get, &next).ok());
  }
  const absl::Duration stop_time = absl::Now() - cancelled;
  std::fprintf(stderr, "both trainers free %s after the cancel\n",
               absl::FormatDuration(stop_time).c_str());
  EXPECT_NE(next.state(), v1::QUEUED) << next.DebugString();
  EXPECT_LT(stop_time, absl::Seconds(5));
  EXPECT_EQ(WatchToEnd(next.id()).state(), v1::SUCCEEDED);

  EXPECT_EQ(a.Terminate(absl::Seconds(20)), 0);
  EXPECT_EQ(b.Terminate(absl::Seconds(20)), 0);
}

}  // namespace
}  // namespace dtrain

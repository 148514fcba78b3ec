// End to end: the real scheduler_server with its job log on a tiny tmpfs
// (64 KiB, mounted in this test's own mount namespace, which the server
// process inherits). Filling the disk makes changes fail with a clear
// UNAVAILABLE while Get, List, health and Ping go on working; the server,
// SIGKILLed while the disk is full, starts again (disk still full, then
// freed) with every accepted job and none of the refused ones. Also:
// --finished_job_retention drops finished jobs (for good, across a
// restart), and `trainctl list` fetches every page of a long List.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/grpc_status.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/health_check.h"
#include "libs/scheduler/tmpfs_for_test.h"
#include "protos/admin.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"
#include "services/kvstore/testing/server_process.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace {

namespace v1 = scheduler::v1;
using e2e::Ctx;

class SchedulerLogE2eTest : public ::testing::Test {
 protected:
  // The scheduler and trainctl run on mutual TLS as the test's admin.
  void SetUp() override { e2e::UseTestCredentials(); }

  void Connect() {
    channel_ = dtrain::rpc::NewChannel(scheduler_.address());
    stub_ = v1::JobService::NewStub(channel_);
  }

  absl::StatusOr<v1::JobStatus> Submit(const std::string& name, const std::string& request_id) {
    v1::SubmitRequest r;
    r.set_request_id(request_id);
    v1::JobSpec* s = r.mutable_spec();
    s->set_name(name);
    s->set_model("mlp");
    s->set_epochs(1);
    s->set_global_batch_size(64);
    s->set_lr(0.1);
    v1::JobStatus job;
    absl::Status st = FromGrpcStatus(stub_->Submit(Ctx().get(), r, &job), "Submit");
    if (!st.ok()) return st;
    return job;
  }

  // Every job id, through List pages of `page_size`.
  std::vector<std::string> ListAll(int page_size) {
    std::vector<std::string> ids;
    v1::ListRequest req;
    req.set_page_size(page_size);
    for (int pages = 0; pages < 1000; ++pages) {
      v1::ListReply reply;
      grpc::Status s = stub_->List(Ctx().get(), req, &reply);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const auto& j : reply.jobs()) ids.push_back(j.id());
      if (reply.next_page_token().empty()) break;
      req.set_page_token(reply.next_page_token());
    }
    return ids;
  }

  bool Ping() {
    auto admin_stub = admin::Admin::NewStub(channel_);
    admin::PingRequest req;
    admin::PingReply reply;
    return admin_stub->Ping(Ctx().get(), req, &reply).ok() && reply.service() == "scheduler";
  }

  std::string Trainctl(const std::string& args, int* rc) {
    return e2e::Trainctl(absl::StrCat("--scheduler=", scheduler_.address(), " ", args), rc);
  }

  kvstore::ServerProcess scheduler_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(SchedulerLogE2eTest, FullLogDiskRefusesChangesAndRestartsWithEveryAcceptedJob) {
  // First, before any thread: the mount namespace is this thread's.
  absl::StatusOr<std::string> disk = scheduler::MountSmallTmpfs("log_disk", 64 << 10);
  ASSERT_TRUE(disk.ok()) << "this test needs a real full filesystem (a 64 KiB tmpfs): "
                         << disk.status();
  const std::string data_dir = *disk + "/scheduler";
  const std::string filler = *disk + "/filler";
  const std::string binary = e2e::Runfile("services/scheduler/scheduler_server");
  ASSERT_TRUE(scheduler_.Start(binary, {"--data_dir=" + data_dir}).ok());
  Connect();

  std::vector<std::string> accepted;
  for (const char* name : {"a", "b", "c"}) {
    absl::StatusOr<v1::JobStatus> job = Submit(name, "");
    ASSERT_TRUE(job.ok()) << job.status();
    accepted.push_back(job->id());
  }
  absl::StatusOr<int64_t> filled = scheduler::FillDisk(filler);
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_GT(*filled, 32 << 10);

  // The log's last page may take a record or two more; then Submit fails.
  absl::Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    absl::StatusOr<v1::JobStatus> job = Submit("d", absl::StrCat("fill-", i));
    if (job.ok()) accepted.push_back(job->id());
    refused = job.status();
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find(data_dir + "/jobs.wal"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("No space left on device"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("not submitted"), std::string::npos) << refused;

  // A cancel is refused too, and changes nothing.
  v1::CancelRequest cancel;
  cancel.set_id(accepted[0]);
  v1::JobStatus job;
  grpc::Status gs = stub_->Cancel(Ctx().get(), cancel, &job);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::UNAVAILABLE) << gs.error_message();
  EXPECT_NE(gs.error_message().find("No space left on device"), std::string::npos)
      << gs.error_message();
  v1::GetRequest get;
  get.set_id(accepted[0]);
  gs = stub_->Get(Ctx().get(), get, &job);
  ASSERT_TRUE(gs.ok()) << gs.error_message();
  EXPECT_EQ(job.state(), v1::QUEUED);

  // Reads, health and Ping go on; trainctl reports the reason.
  EXPECT_EQ(ListAll(2), accepted);
  absl::StatusOr<rpc::HealthStatus> health = rpc::CheckHealth(channel_.get(), absl::Seconds(10));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, rpc::HealthStatus::kServing);
  EXPECT_TRUE(Ping());
  int rc;
  std::string out = Trainctl(
      "--timeout_s=1 submit --name=e --model=mlp --epochs=1 --batch_size=64 --lr=0.1", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("No space left on device"), std::string::npos) << out;

  // SIGKILL while the disk is full; it starts again on the full disk with
  // every accepted job and none of the refused ones.
  ASSERT_TRUE(scheduler_.Kill(SIGKILL).ok());
  ASSERT_TRUE(scheduler_.Wait().ok());
  absl::Status started = scheduler_.Restart();
  ASSERT_TRUE(started.ok()) << started;
  Connect();
  EXPECT_EQ(ListAll(100), accepted);
  // (A longer request id than the refused submission's: a larger record.)
  EXPECT_EQ(Submit("f", "after-the-restart").status().code(), absl::StatusCode::kUnavailable);

  // Space again: changes go through without a restart.
  ASSERT_EQ(std::remove(filler.c_str()), 0);
  absl::StatusOr<v1::JobStatus> more = Submit("g", "");
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(more->id(), absl::StrFormat("job-%06d", accepted.size() + 1));
  accepted.push_back(more->id());
  gs = stub_->Cancel(Ctx().get(), cancel, &job);
  ASSERT_TRUE(gs.ok()) << gs.error_message();

  ASSERT_TRUE(scheduler_.Kill(SIGKILL).ok());
  ASSERT_TRUE(scheduler_.Wait().ok());
  started = scheduler_.Restart();
  ASSERT_TRUE(started.ok()) << started;
  Connect();
  EXPECT_EQ(ListAll(1000), accepted);
  gs = stub_->Get(Ctx().get(), get, &job);
  ASSERT_TRUE(gs.ok()) << gs.error_message();
  EXPECT_EQ(job.state(), v1::CANCELLED);
}

// More jobs than one List page: trainctl list shows them all.
TEST_F(SchedulerLogE2eTest, TrainctlListFetchesEveryPage) {
  // 230 queued jobs of one user: past the default per-user cap (100).
  ASSERT_TRUE(scheduler_
                  .Start(e2e::Runfile("services/scheduler/scheduler_server"),
                         {"--data_dir=", "--max_queued_jobs_per_user=0"})
                  .ok());
  Connect();
  const int n = 230;  // three pages of the default 100
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<v1::JobStatus> job = Submit(absl::StrCat("j", i), "");
    ASSERT_TRUE(job.ok()) << job.status();
  }
  int rc;
  std::string out = Trainctl("-o json list", &rc);
  ASSERT_EQ(rc, 0) << out;
  for (int i = 1; i <= n; ++i) {
    const std::string id = absl::StrFormat("\"job-%06d\"", i);
    ASSERT_NE(out.find(id), std::string::npos) << id << " missing from trainctl list";
  }
  EXPECT_EQ(out.find(absl::StrFormat("\"job-%06d\"", n + 1)), std::string::npos);
  out = Trainctl("list --state=QUEUED", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(absl::StrFormat("job-%06d", n)), std::string::npos) << out;
}

TEST_F(SchedulerLogE2eTest, FinishedJobsAreDroppedAfterTheRetentionFlag) {
  const std::string binary = e2e::Runfile("services/scheduler/scheduler_server");
  int rc;
  std::string out = e2e::Run(binary + " --finished_job_retention=0", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--finished_job_retention must be > 0"), std::string::npos) << out;

  // Liveness (and retention) checks every heartbeat_timeout / 4.
  ASSERT_TRUE(scheduler_
                  .Start(binary, {"--data_dir=" + e2e::TmpDir("retention"),
                                  "--finished_job_retention=2s", "--heartbeat_timeout_s=1"})
                  .ok());
  Connect();
  absl::StatusOr<v1::JobStatus> done = Submit("done", "rid-done");
  ASSERT_TRUE(done.ok()) << done.status();
  absl::StatusOr<v1::JobStatus> waiting = Submit("waiting", "");
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  v1::CancelRequest cancel;
  cancel.set_id(done->id());
  v1::JobStatus job;
  grpc::Status gs = stub_->Cancel(Ctx().get(), cancel, &job);
  ASSERT_TRUE(gs.ok()) << gs.error_message();
  const absl::Time finished = absl::Now();
  // Kept at first: a retried Submit finds it.
  absl::StatusOr<v1::JobStatus> retry = Submit("done", "rid-done");
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->id(), done->id());

  v1::GetRequest get;
  get.set_id(done->id());
  grpc::StatusCode code = grpc::StatusCode::OK;
  while (code == grpc::StatusCode::OK && absl::Now() - finished < absl::Seconds(20)) {
    absl::SleepFor(absl::Milliseconds(100));
    code = stub_->Get(Ctx().get(), get, &job).error_code();
  }
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
  EXPECT_GE(absl::Now() - finished, absl::Milliseconds(1900)) << "dropped before its retention";
  EXPECT_EQ(ListAll(10), std::vector<std::string>{waiting->id()});

  // Gone for good: not back after a restart, and its id is not reused.
  ASSERT_TRUE(scheduler_.Kill(SIGKILL).ok());
  ASSERT_TRUE(scheduler_.Wait().ok());
  absl::Status started = scheduler_.Restart();
  ASSERT_TRUE(started.ok()) << started;
  Connect();
  EXPECT_EQ(ListAll(10), std::vector<std::string>{waiting->id()});
  absl::StatusOr<v1::JobStatus> next = Submit("next", "");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id(), "job-000003");
}

}  // namespace
}  // namespace dtrain

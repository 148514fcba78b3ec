// GrpcClusterClient against a real scheduler server on loopback: each RPC
// carries its messages and its errors (with the RPC's name), and the
// rendezvous store is the attempt's.
#include "services/trainer/grpc_cluster_client.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/credentials.h"
#include "services/scheduler/server.h"

namespace dtrain {
namespace trainer {
namespace {

namespace v1 = scheduler::v1;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class GrpcClusterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = scheduler::SchedulerServer::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<GrpcClusterClient>(
        dtrain::rpc::NewChannel(absl::StrCat("127.0.0.1:", server_->port())), absl::Seconds(5));
  }

  std::string Register(const std::string& name) {
    v1::RegisterTrainerRequest r;
    r.set_name(name);
    r.add_devices("cpu");
    absl::StatusOr<v1::RegisterTrainerReply> reply = client_->RegisterTrainer(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->trainer_id() : "";
  }

  std::unique_ptr<scheduler::SchedulerServer> server_;
  std::unique_ptr<GrpcClusterClient> client_;
};

TEST_F(GrpcClusterClientTest, RegistersHeartbeatsReportsAndMeets) {
  v1::RegisterTrainerRequest r;
  r.set_name("t0");
  r.add_devices("cpu");
  absl::StatusOr<v1::RegisterTrainerReply> reg = client_->RegisterTrainer(r);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_THAT(reg->trainer_id(), StartsWith("trainer-"));
  EXPECT_GT(reg->heartbeat_interval_ms(), 0);
  const std::string t0 = reg->trainer_id();
  const std::string t1 = Register("t1");

  v1::JobSpec spec;
  spec.set_name("pair");
  spec.set_model("mlp");
  spec.set_epochs(1);
  spec.set_global_batch_size(8);
  spec.set_lr(0.1);
  spec.set_num_trainers(2);
  absl::StatusOr<v1::JobStatus> job = server_->scheduler()->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();

  v1::HeartbeatRequest hb;
  hb.set_trainer_id(t0);
  absl::StatusOr<v1::HeartbeatReply> beat = client_->Heartbeat(hb);
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->assignments_size(), 1);
  const v1::Assignment a = beat->assignments(0);
  EXPECT_EQ(a.job_id(), job->id());
  EXPECT_EQ(a.spec().name(), "pair");
  EXPECT_EQ(a.world_size(), 2);
  hb.set_trainer_id(t1);
  ASSERT_TRUE(client_->Heartbeat(hb).ok());

  // The two trainers' stores are the same table.
  std::unique_ptr<collective::Store> s0 = client_->RendezvousStore(t0, a.job_id(), a.attempt());
  std::unique_ptr<collective::Store> s1 = client_->RendezvousStore(t1, a.job_id(), a.attempt());
  ASSERT_TRUE(s0->Set("addr/0", "here").ok());
  absl::StatusOr<std::string> got = s1->Get("addr/0", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");

  v1::ProgressReport p;
  p.set_trainer_id(t0);
  p.set_job_id(a.job_id());
  p.set_rank(a.rank());
  p.set_attempt(a.attempt());
  p.set_epoch(0);
  p.set_step(3);
  absl::StatusOr<v1::ReportProgressReply> rep = client_->ReportProgress(p);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_FALSE(rep->stop());
  ASSERT_TRUE(server_->scheduler()->Cancel(a.job_id(), "test").ok());
  rep = client_->ReportProgress(p);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->stop());
}

TEST_F(GrpcClusterClientTest, ErrorsKeepTheirCodeAndNameTheRpc) {
  v1::HeartbeatRequest hb;
  hb.set_trainer_id("trainer-nobody");
  absl::Status s = client_->Heartbeat(hb).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), StartsWith("ClusterService.Heartbeat: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("trainer-nobody"));

  v1::ProgressReport p;
  p.set_trainer_id("trainer-nobody");
  p.set_job_id("job-x");
  s = client_->ReportProgress(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), StartsWith("ClusterService.ReportProgress: "));

  // The scheduler gone: UNAVAILABLE within the deadline.
  server_->Shutdown(absl::ZeroDuration());
  v1::RegisterTrainerRequest r;
  r.set_name("late");
  const absl::Time start = absl::Now();
  s = client_->RegisterTrainer(r).status();
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), StartsWith("ClusterService.RegisterTrainer: "));
  EXPECT_LT(absl::Now() - start, absl::Seconds(7));
}

}  // namespace
}  // namespace trainer
}  // namespace dtrain

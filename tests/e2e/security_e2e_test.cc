// End to end on a mutual-TLS cluster (`trainctl cluster up`: scheduler, 2
// kvstore shards, 2 trainers, certificates in DIR/certs), as outsiders and
// other users would try it:
//   - alice (role user) submits a 2-trainer KVSTORE job;
//   - bob (another user) cannot get, watch or cancel it (PERMISSION_DENIED,
//     through the API and through trainctl) and does not see it in List;
//     an admin sees both users' jobs;
//   - a client without TLS, or with TLS but no client certificate, or with a
//     certificate of another CA, cannot call the scheduler or a shard;
//   - alice's user certificate cannot call ClusterService or the kvstore;
//   - job B's trainers cannot read job A's keys: a shard serves a trainer
//     only the job its kvstore token names (none, a token of another job or
//     one signed with another secret: PERMISSION_DENIED);
//   - a trainer certificate that did not register a trainer id cannot report
//     for it (the attack of issue 16: a final FAILED report with an id
//     published in JobStatus.trainers);
//   - and alice's job finishes undisturbed (SUCCEEDED on its first attempt).
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/rpc/credentials.h"
#include "libs/security/certs.h"
#include "libs/security/job_token.h"
#include "protos/admin.grpc.pb.h"
#include "protos/kvstore.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"
#include "tests/e2e/e2e_util.h"
#include "tests/e2e/test_cluster.h"
#include "tests/e2e/test_cluster_rpc.h"

namespace dtrain {
namespace e2e {
namespace {

namespace v1 = scheduler::v1;
namespace kv = kvstore::v1;

absl::StatusCode Code(const grpc::Status& s) {
  return static_cast<absl::StatusCode>(s.error_code());
}

class SecurityE2eTest : public ClusterTest {
 protected:
  void SetUp() override {
    // cluster up is TLS by default: no flag asks for it.
    ASSERT_NO_FATAL_FAILURE(Up({.name = "secure-cluster",
                                .trainers = 2,
                                .kvstore_shards = 2,
                                .kvstore_replicas = 0,  // cluster up's default: 2
                                .users = {"alice", "bob"},
                                .down_grace_s = 10}));
    const std::string& out = cluster_->up_output();
    ASSERT_NE(out.find(absl::StrCat("export DTRAIN_CA=", dir(), "/certs/ca.pem DTRAIN_CERT=", dir(),
                                    "/certs/admin.pem DTRAIN_KEY=", dir(), "/certs/admin.key")),
              std::string::npos)
        << out;
    scheduler_ = scheduler();
    for (const ClusterProcess& p : cluster_->kvstore_processes()) shards_.push_back(p.address);
    ASSERT_EQ(shards_.size(), 4u);  // 2 shards of 2 replicas (the default): every one checked
    certs_ = dir() + "/certs";
    // A trainer certificate no running trainer holds.
    ASSERT_TRUE(cluster_->IssueCertificate("rogue", "trainer").ok());
    int rc;
    const std::string init = Trainctl("certs init --dir=" + TmpDir("other-ca"), &rc);
    ASSERT_EQ(rc, 0) << init;
  }

  std::shared_ptr<const rpc::Credentials> As(const std::string& name,
                                             const std::string& certs = "") {
    const std::string d = certs.empty() ? certs_ : certs;
    absl::StatusOr<std::shared_ptr<const rpc::Credentials>> c =
        rpc::Credentials::Load({d + "/ca.pem", d + "/" + name + ".pem", d + "/" + name + ".key"});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : rpc::Credentials::Insecure();
  }

  std::unique_ptr<v1::JobService::Stub> Jobs(const std::shared_ptr<const rpc::Credentials>& c) {
    return v1::JobService::NewStub(rpc::NewChannel(scheduler_, c.get()));
  }

  // trainctl as `name` (its certificate by flag, over the admin's environment).
  std::string TrainctlAs(const std::string& name, const std::string& args, int* rc) {
    return cluster_->TrainctlAs(name, args, rc);
  }

  static v1::SubmitRequest Job(const std::string& name) {
    v1::SubmitRequest r;
    v1::JobSpec* s = r.mutable_spec();
    s->set_name(name);
    s->set_model("mlp");
    s->set_epochs(3);
    s->set_global_batch_size(256);
    s->set_lr(0.1);
    s->set_num_trainers(2);
    s->set_devices_per_trainer(1);
    s->set_device_kind("cpu");
    s->mutable_sync()->set_mode(v1::KVSTORE);
    s->set_train_limit(8192);
    s->set_test_limit(1000);
    s->set_threads(1);
    s->set_seed(1);
    return r;
  }

  std::string certs_, scheduler_;
  std::vector<std::string> shards_;
};

TEST_F(SecurityE2eTest, UsersOwnTheirJobsAndOnlyTrainersServeThem) {
  auto alice = As("alice"), bob = As("bob"), admin = As("admin"), rogue = As("rogue");
  auto alice_jobs = Jobs(alice), bob_jobs = Jobs(bob), admin_jobs = Jobs(admin);

  absl::StatusOr<v1::JobStatus> submitted = cluster_->Submit(Job("alice-job"), "alice");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::JobStatus job = *submitted;
  EXPECT_EQ(job.owner(), "alice");
  // Wait until it runs (placed on both trainers), so the attacks below meet
  // a running job.
  for (absl::Time end = absl::Now() + absl::Seconds(60);
       job.state() == v1::QUEUED && absl::Now() < end; absl::SleepFor(absl::Milliseconds(50))) {
    v1::GetRequest get;
    get.set_id(job.id());
    ASSERT_TRUE(alice_jobs->Get(Ctx().get(), get, &job).ok());
  }
  ASSERT_EQ(job.trainers_size(), 2) << job.DebugString();

  // Bob: not alice's job, through the API...
  v1::JobStatus seen;
  v1::GetRequest get;
  get.set_id(job.id());
  EXPECT_EQ(Code(bob_jobs->Get(Ctx().get(), get, &seen)), absl::StatusCode::kPermissionDenied);
  v1::CancelRequest cancel;
  cancel.set_id(job.id());
  EXPECT_EQ(Code(bob_jobs->Cancel(Ctx().get(), cancel, &seen)),
            absl::StatusCode::kPermissionDenied);
  {
    v1::WatchRequest watch;
    watch.set_id(job.id());
    auto ctx = Ctx();
    auto stream = bob_jobs->Watch(ctx.get(), watch);
    EXPECT_FALSE(stream->Read(&seen));
    EXPECT_EQ(Code(stream->Finish()), absl::StatusCode::kPermissionDenied);
  }
  v1::JobStatus bobs;
  ASSERT_TRUE(bob_jobs->Submit(Ctx().get(), Job("bob-job"), &bobs).ok());
  v1::ListReply list;
  ASSERT_TRUE(bob_jobs->List(Ctx().get(), v1::ListRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), bobs.id());
  ASSERT_TRUE(bob_jobs
                  ->Cancel(
                      Ctx().get(),
                      [&] {
                        v1::CancelRequest c;
                        c.set_id(bobs.id());
                        return c;
                      }(),
                      &seen)
                  .ok());
  // ...and through trainctl, with a message that says why.
  int rc;
  std::string out = TrainctlAs("bob", "cancel " + job.id(), &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("PERMISSION_DENIED"), std::string::npos) << out;
  EXPECT_NE(out.find("bob (user)"), std::string::npos) << out;
  out = TrainctlAs("bob", "-o json list", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find(job.id()), std::string::npos) << out;
  EXPECT_NE(out.find(bobs.id()), std::string::npos) << out;
  // The admin sees both.
  list.Clear();
  ASSERT_TRUE(admin_jobs->List(Ctx().get(), v1::ListRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 2);
  // A user may not drain trainers.
  v1::DrainTrainerRequest drain;
  drain.set_trainer(job.trainers(0));
  v1::TrainerStatus ts;
  EXPECT_EQ(Code(alice_jobs->DrainTrainer(Ctx().get(), drain, &ts)),
            absl::StatusCode::kPermissionDenied);

  // Alice's user certificate: no ClusterService, no kvstore.
  v1::ProgressReport kill;  // issue 16's attack: a final FAILED in a trainer's name
  kill.set_trainer_id(job.trainers(0));
  kill.set_job_id(job.id());
  kill.set_rank(0);
  kill.set_final_state(v1::FAILED);
  kill.set_reason("forged");
  v1::ReportProgressReply reply;
  auto alice_cluster = v1::ClusterService::NewStub(rpc::NewChannel(scheduler_, alice.get()));
  EXPECT_EQ(Code(alice_cluster->ReportProgress(Ctx().get(), kill, &reply)),
            absl::StatusCode::kPermissionDenied);
  v1::RegisterTrainerReply reg;
  EXPECT_EQ(Code(alice_cluster->RegisterTrainer(Ctx().get(), v1::RegisterTrainerRequest(), &reg)),
            absl::StatusCode::kPermissionDenied);
  const std::string kv_job = job.id() + "-a1";
  for (const std::string& shard : shards_) {
    auto control = kv::KVStore::NewStub(rpc::NewChannel(shard, alice.get()));
    kv::GetJobRequest gj;
    gj.set_job(kv_job);
    kv::GetJobResponse gjr;
    EXPECT_EQ(Code(control->GetJob(Ctx().get(), gj, &gjr)), absl::StatusCode::kPermissionDenied);
    kv::DeleteJobRequest dj;
    dj.set_job(kv_job);
    kv::DeleteJobResponse djr;
    EXPECT_EQ(Code(control->DeleteJob(Ctx().get(), dj, &djr)), absl::StatusCode::kPermissionDenied);
    auto data = kv::KVStoreData::NewStub(rpc::NewChannel(shard, alice.get()));
    kv::PullRequest pull;
    pull.set_job(kv_job);
    pull.add_items()->set_key("w0");
    kv::PullResponse pr;
    EXPECT_EQ(Code(data->PullUnary(Ctx().get(), pull, &pr)), absl::StatusCode::kPermissionDenied);
    // Snapshots are for the scheduler and admins, not trainers.
    auto trainer_control = kv::KVStore::NewStub(rpc::NewChannel(shard, rogue.get()));
    kv::SnapshotResponse sr;
    EXPECT_EQ(Code(trainer_control->Snapshot(Ctx().get(), kv::SnapshotRequest(), &sr)),
              absl::StatusCode::kPermissionDenied);
  }

  // Job B's trainers cannot read job A's keys: a shard serves a trainer only
  // the job its kvstore token (minted by the scheduler under the cluster
  // secret, here by the test as the scheduler would for job B) names.
  absl::StatusOr<std::string> secret = security::ReadClusterSecret(certs_ + "/cluster.secret");
  ASSERT_TRUE(secret.ok()) << secret.status();
  const std::string job_b = security::KvstoreJobName("job-999999", 1);
  const std::string b_token = security::MintJobToken(*secret, job_b, absl::Now() + absl::Hours(1));
  auto trainer_call = [&](const std::string& shard, const std::string& token,
                          const std::string& job) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    if (!token.empty()) ctx.AddMetadata(security::kJobTokenMetadata, token);
    kv::GetJobRequest gj;
    gj.set_job(job);
    kv::GetJobResponse gjr;
    return Code(kv::KVStore::NewStub(rpc::NewChannel(shard, rogue.get()))->GetJob(&ctx, gj, &gjr));
  };
  for (const std::string& shard : shards_) {
    SCOPED_TRACE(shard);
    // Its own job: past authorization (a job the shard does not hold).
    EXPECT_EQ(trainer_call(shard, b_token, job_b), absl::StatusCode::kNotFound);
    EXPECT_EQ(trainer_call(shard, b_token, kv_job), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(trainer_call(shard, "", kv_job), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(trainer_call(shard,
                           security::MintJobToken(std::string(64, '0'), kv_job,
                                                  absl::Now() + absl::Hours(1)),
                           kv_job),
              absl::StatusCode::kPermissionDenied);
    auto data = kv::KVStoreData::NewStub(rpc::NewChannel(shard, rogue.get()));
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    ctx.AddMetadata(security::kJobTokenMetadata, b_token);
    kv::PullRequest pull;
    pull.set_job(kv_job);
    pull.add_items()->set_key("w0");
    kv::PullResponse pr;
    EXPECT_EQ(Code(data->PullUnary(&ctx, pull, &pr)), absl::StatusCode::kPermissionDenied);
  }

  // A trainer certificate, but not the one that registered that trainer id.
  auto rogue_cluster = v1::ClusterService::NewStub(rpc::NewChannel(scheduler_, rogue.get()));
  grpc::Status forged = rogue_cluster->ReportProgress(Ctx().get(), kill, &reply);
  EXPECT_EQ(Code(forged), absl::StatusCode::kPermissionDenied) << forged.error_message();
  // "rogue (trainer) may not act as trainer <id>, which trainer-<i> registered"
  EXPECT_NE(forged.error_message().find("rogue (trainer)"), std::string::npos)
      << forged.error_message();
  EXPECT_NE(forged.error_message().find("which trainer-"), std::string::npos)
      << forged.error_message();

  // No TLS, TLS without a client certificate, a certificate of another CA:
  // nothing answers, not even Admin.Ping.
  grpc::SslCredentialsOptions ca_only;
  std::ifstream ca(certs_ + "/ca.pem");
  ca_only.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  const std::vector<std::pair<std::string, std::shared_ptr<grpc::ChannelCredentials>>> strangers = {
      {"plain text", grpc::InsecureChannelCredentials()},
      {"TLS without a client certificate", grpc::SslCredentials(ca_only)},
      {"another CA's admin", As("admin", TmpDir("other-ca"))->ChannelCredentials()}};
  for (const auto& [what, creds] : strangers) {
    for (const std::string& address : {scheduler_, shards_[0], shards_[1]}) {
      SCOPED_TRACE(what + " to " + address);
      auto ping = admin::Admin::NewStub(grpc::CreateChannel(address, creds));
      admin::PingReply pong;
      EXPECT_EQ(Code(ping->Ping(Ctx().get(), admin::PingRequest(), &pong)),
                absl::StatusCode::kUnavailable);
    }
    auto jobs = v1::JobService::NewStub(grpc::CreateChannel(scheduler_, creds));
    EXPECT_EQ(Code(jobs->Cancel(Ctx().get(), cancel, &seen)), absl::StatusCode::kUnavailable);
  }
  // The admin's ping names the caller the server saw.
  admin::PingReply pong;
  ASSERT_TRUE(admin::Admin::NewStub(rpc::NewChannel(shards_[0], admin.get()))
                  ->Ping(Ctx().get(), admin::PingRequest(), &pong)
                  .ok());
  EXPECT_EQ(pong.caller(), "admin (admin)");

  // Alice's job was not disturbed.
  absl::StatusOr<v1::JobStatus> done =
      e2e::WatchToEnd(alice_jobs.get(), job.id(), absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->DebugString();
  EXPECT_EQ(done->attempts(), 1) << done->DebugString();
  EXPECT_GT(done->test_accuracy(), 0.5) << done->DebugString();
}

}  // namespace
}  // namespace e2e
}  // namespace dtrain

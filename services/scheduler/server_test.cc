#include "services/scheduler/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "protos/admin.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"

namespace dtrain {
namespace scheduler {
namespace {

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.metrics_listen = "127.0.0.1:0";
    auto s = SchedulerServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    channel_ = dtrain::rpc::NewChannel(absl::StrCat("127.0.0.1:", server_->port()));
    jobs_ = v1::JobService::NewStub(channel_);
    cluster_ = v1::ClusterService::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  static v1::SubmitRequest Submit(const std::string& name) {
    v1::SubmitRequest r;
    r.mutable_spec()->set_name(name);
    r.mutable_spec()->set_model("mlp");
    r.mutable_spec()->set_epochs(1);
    r.mutable_spec()->set_global_batch_size(64);
    r.mutable_spec()->set_lr(0.1);
    return r;
  }

  std::unique_ptr<SchedulerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
};

TEST_F(ServerTest, BadSpecIsInvalidArgumentNamingTheField) {
  v1::SubmitRequest r = Submit("x");
  r.mutable_spec()->set_epochs(0);
  v1::JobStatus reply;
  grpc::Status s = jobs_->Submit(Ctx().get(), r, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("epochs:", 0), 0u) << s.error_message();
  v1::GetRequest g;
  g.set_id("job-424242");
  EXPECT_EQ(jobs_->Get(Ctx().get(), g, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
}

// DrainTrainer and ListTrainers over gRPC: errors keep their codes.
TEST_F(ServerTest, DrainTrainerAndListTrainersOverGrpc) {
  v1::RegisterTrainerRequest reg;
  reg.set_name("pod-0");
  reg.add_devices("cpu");
  v1::RegisterTrainerReply registered;
  ASSERT_TRUE(cluster_->RegisterTrainer(Ctx().get(), reg, &registered).ok());
  v1::DrainTrainerRequest d;
  d.set_trainer("pod-9");
  v1::TrainerStatus t;
  grpc::Status s = jobs_->DrainTrainer(Ctx().get(), d, &t);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_NE(s.error_message().find("pod-9"), std::string::npos) << s.error_message();
  v1::ListTrainersReply list;
  ASSERT_TRUE(jobs_->ListTrainers(Ctx().get(), v1::ListTrainersRequest(), &list).ok());
  ASSERT_EQ(list.trainers_size(), 1);
  EXPECT_EQ(list.trainers(0).state(), v1::IDLE);
  d.set_trainer("pod-0");
  ASSERT_TRUE(jobs_->DrainTrainer(Ctx().get(), d, &t).ok());
  EXPECT_EQ(t.id(), registered.trainer_id());
  EXPECT_EQ(t.state(), v1::DRAINING);
  list.Clear();
  ASSERT_TRUE(jobs_->ListTrainers(Ctx().get(), v1::ListTrainersRequest(), &list).ok());
  ASSERT_EQ(list.trainers_size(), 1);
  EXPECT_EQ(list.trainers(0).state(), v1::DRAINING);
}

TEST_F(ServerTest, JobLifecycleOverGrpcWithWatchAndMetrics) {
  v1::JobStatus job;
  ASSERT_TRUE(jobs_->Submit(Ctx().get(), Submit("a"), &job).ok());
  EXPECT_EQ(job.state(), v1::QUEUED);

  // Watch in the background: it must see QUEUED, RUNNING and SUCCEEDED.
  std::vector<v1::JobState> seen;
  absl::Notification first;
  std::thread watcher([&] {
    auto ctx = Ctx();
    v1::WatchRequest w;
    w.set_id(job.id());
    auto reader = jobs_->Watch(ctx.get(), w);
    v1::JobStatus st;
    while (reader->Read(&st)) {
      if (seen.empty() || seen.back() != st.state()) seen.push_back(st.state());
      if (!first.HasBeenNotified()) first.Notify();
    }
    EXPECT_TRUE(reader->Finish().ok());
  });

  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(10)));
  v1::RegisterTrainerRequest reg;
  reg.set_name("t");
  reg.add_devices("cpu");
  v1::RegisterTrainerReply t;
  ASSERT_TRUE(cluster_->RegisterTrainer(Ctx().get(), reg, &t).ok());
  v1::HeartbeatRequest hb;
  hb.set_trainer_id(t.trainer_id());
  v1::HeartbeatReply hr;
  ASSERT_TRUE(cluster_->Heartbeat(Ctx().get(), hb, &hr).ok());
  ASSERT_EQ(hr.assignments_size(), 1);

  auto text = metrics::Scrape(server_->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_scheduler_jobs{state=\"RUNNING\"}"), 1);
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_scheduler_trainers_alive"), 1);
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_scheduler_queue_length"), 0);
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_scheduler_stragglers"), 0);
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_scheduler_stragglers_detected_total"), 0);
  EXPECT_EQ(*metrics::SampleValue(
                *text, "dtrain_scheduler_requests_total{code=\"OK\",method=\"Heartbeat\"}"),
            1);
  // The scaffold's interceptor counts the same call under its gRPC names.
  EXPECT_EQ(*metrics::SampleValue(*text,
                                  "dtrain_rpc_server_requests_total{grpc_code=\"OK\","
                                  "grpc_method=\"Heartbeat\","
                                  "grpc_service=\"dtrain.scheduler.v1.ClusterService\"}"),
            1);
  auto linted = metrics::PromtoolCheck(*text);
  EXPECT_TRUE(linted.ok()) << linted.status();

  v1::ProgressReport p;
  p.set_trainer_id(t.trainer_id());
  p.set_job_id(job.id());
  p.set_epoch(1);
  p.set_final_state(v1::SUCCEEDED);
  v1::ReportProgressReply pr;
  ASSERT_TRUE(cluster_->ReportProgress(Ctx().get(), p, &pr).ok());
  watcher.join();
  EXPECT_EQ(seen, (std::vector<v1::JobState>{v1::QUEUED, v1::RUNNING, v1::SUCCEEDED}));

  v1::CancelRequest c;
  c.set_id(job.id());
  grpc::Status s = jobs_->Cancel(Ctx().get(), c, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();

  v1::ListReply list;
  ASSERT_TRUE(jobs_->List(Ctx().get(), v1::ListRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);
}

TEST_F(ServerTest, ListPages) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    v1::JobStatus job;
    ASSERT_TRUE(jobs_->Submit(Ctx().get(), Submit(absl::StrCat("p", i)), &job).ok());
    ids.push_back(job.id());
  }
  v1::ListRequest req;
  req.set_page_size(2);
  std::vector<std::string> seen;
  int pages = 0;
  do {
    v1::ListReply reply;
    grpc::Status s = jobs_->List(Ctx().get(), req, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LE(reply.jobs_size(), 2);
    for (const auto& j : reply.jobs()) seen.push_back(j.id());
    req.set_page_token(reply.next_page_token());
    ++pages;
  } while (!req.page_token().empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, ids);
  req.set_page_token("nonsense");
  v1::ListReply reply;
  grpc::Status s = jobs_->List(Ctx().get(), req, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("page_token:", 0), 0u) << s.error_message();
}

TEST_F(ServerTest, AdminPing) {
  auto admin_stub = admin::Admin::NewStub(channel_);
  admin::PingRequest req;
  req.set_payload("hi");
  admin::PingReply reply;
  ASSERT_TRUE(admin_stub->Ping(Ctx().get(), req, &reply).ok());
  EXPECT_EQ(reply.service(), "scheduler");
  EXPECT_EQ(reply.payload(), "hi");
}

TEST_F(ServerTest, UnknownTrainerHeartbeatIsNotFound) {
  v1::HeartbeatRequest hb;
  hb.set_trainer_id("nobody");
  v1::HeartbeatReply hr;
  EXPECT_EQ(cluster_->Heartbeat(Ctx().get(), hb, &hr).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, ShutdownEndsWatches) {
  v1::JobStatus job;
  ASSERT_TRUE(jobs_->Submit(Ctx().get(), Submit("w"), &job).ok());
  std::thread watcher([&] {
    auto ctx = Ctx();
    v1::WatchRequest w;
    w.set_id(job.id());
    auto reader = jobs_->Watch(ctx.get(), w);
    v1::JobStatus st;
    while (reader->Read(&st)) {
    }
    EXPECT_FALSE(reader->Finish().ok());
  });
  absl::SleepFor(absl::Milliseconds(300));
  absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(5));
  watcher.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// The kvstore shard map over gRPC: replicas' heartbeats build the chain,
// GetKvstoreMap shows it, a silent replica leaves it without any further
// call (the server's own expiry), bad input keeps its code, metrics follow.
TEST(KvstoreMapServerTest, HeartbeatsBuildTheMapAndSilentReplicasLeave) {
  ServerOptions o;
  o.metrics_listen = "127.0.0.1:0";
  o.kvstore_heartbeat_interval = absl::Milliseconds(50);
  o.kvstore_heartbeat_timeout = absl::Milliseconds(600);
  o.kvstore_startup_grace = absl::ZeroDuration();
  auto server = SchedulerServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  auto cluster = v1::ClusterService::NewStub(channel);
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  };
  auto get_map = [&] {
    kvstore::v1::ShardMap m;
    grpc::Status s = jobs->GetKvstoreMap(ctx().get(), kvstore::v1::GetShardMapRequest(), &m);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return m;
  };
  EXPECT_EQ(get_map().version(), 0u);

  auto request = [](int replica, uint64_t incarnation) {
    kvstore::v1::KvstoreHeartbeatRequest r;
    r.set_shard(0);
    r.set_replica(replica);
    r.set_address(absl::StrCat("127.0.0.1:", 9000 + replica));
    r.set_incarnation(incarnation);
    r.set_num_shards(1);
    return r;
  };
  kvstore::v1::KvstoreHeartbeatReply a, b;
  ASSERT_TRUE(cluster->KvstoreHeartbeat(ctx().get(), request(0, 11), &a).ok());
  ASSERT_TRUE(cluster->KvstoreHeartbeat(ctx().get(), request(1, 22), &b).ok());
  EXPECT_EQ(b.heartbeat_interval_ms(), 50);
  ASSERT_EQ(b.map().chains_size(), 1);
  ASSERT_EQ(b.map().chains(0).members_size(), 2);
  EXPECT_EQ(b.map().chains(0).members(0).state(), kvstore::v1::REPLICA_ACTIVE);
  EXPECT_EQ(b.map().chains(0).members(1).state(), kvstore::v1::REPLICA_JOINING);
  EXPECT_EQ(b.map().chains(0).members(1).address(), "127.0.0.1:9001");
  EXPECT_EQ(get_map().DebugString(), b.map().DebugString());

  // Replica 0 reports replica 1 caught up: both ACTIVE.
  kvstore::v1::KvstoreHeartbeatRequest caught = request(0, 11);
  *caught.mutable_map() = b.map();
  caught.set_has_state(true);
  caught.set_caught_up_replica(1);
  caught.set_caught_up_incarnation(22);
  ASSERT_TRUE(cluster->KvstoreHeartbeat(ctx().get(), caught, &a).ok());
  EXPECT_EQ(a.map().chains(0).members(1).state(), kvstore::v1::REPLICA_ACTIVE);
  EXPECT_EQ(a.map().version(), 3u);

  // Bad input: INVALID_ARGUMENT naming the field; the map is unchanged.
  kvstore::v1::KvstoreHeartbeatRequest bad = request(0, 11);
  bad.set_num_shards(2);
  grpc::Status s = cluster->KvstoreHeartbeat(ctx().get(), bad, &a);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("num_shards:", 0), 0u) << s.error_message();

  auto text = metrics::Scrape((*server)->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_scheduler_kvstore_map_version"), 3);
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_scheduler_kvstore_map_changes_total"), 3);
  EXPECT_EQ(*metrics::SampleValue(
                *text, "dtrain_scheduler_kvstore_replicas{shard=\"0\",state=\"ACTIVE\"}"),
            2);
  EXPECT_EQ(*metrics::SampleValue(
                *text, "dtrain_scheduler_kvstore_replicas{shard=\"0\",state=\"JOINING\"}"),
            0);
  EXPECT_EQ(
      *metrics::SampleValue(
          *text,
          "dtrain_scheduler_requests_total{code=\"INVALID_ARGUMENT\",method=\"KvstoreHeartbeat\"}"),
      1);

  // Only replica 1 goes on heartbeating: replica 0 (the head) leaves the
  // chain within the timeout plus one expiry period, by the server's thread.
  const absl::Time start = absl::Now();
  kvstore::v1::ShardMap m;
  while (absl::Now() - start < absl::Seconds(5)) {
    kvstore::v1::KvstoreHeartbeatRequest r = request(1, 22);
    *r.mutable_map() = a.map();
    r.set_has_state(true);
    ASSERT_TRUE(cluster->KvstoreHeartbeat(ctx().get(), r, &b).ok());
    m = get_map();
    if (m.chains(0).members_size() == 1) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(m.chains(0).members_size(), 1) << m.DebugString();
  EXPECT_EQ(m.chains(0).members(0).replica(), 1);
  EXPECT_EQ(m.chains(0).members(0).state(), kvstore::v1::REPLICA_ACTIVE);
  EXPECT_EQ(m.version(), 4u);
  EXPECT_GE(took, absl::Milliseconds(400));
  EXPECT_LT(took, absl::Seconds(2));
  // With no heartbeat at all, the server's expiry alone empties the chain.
  absl::SleepFor(absl::Milliseconds(1000));
  m = get_map();
  EXPECT_EQ(m.chains(0).members_size(), 0) << m.DebugString();
  EXPECT_EQ(m.version(), 5u);
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

namespace dtrain {
namespace scheduler {
namespace {

std::string ReadTestModel(const std::string& name) {
  return ReadFileForTest(RunfilePath("libs/onnx/testdata/" + name));
}

std::unique_ptr<grpc::ClientContext> ModelCtx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ctx;
}

// PutModel of `bytes` in `pieces` data chunks after a header without data.
grpc::Status Put(v1::JobService::Stub* jobs, const std::string& bytes, int pieces,
                 v1::PutModelReply* reply) {
  auto ctx = ModelCtx();
  auto w = jobs->PutModel(ctx.get(), reply);
  v1::ModelChunk header;
  header.set_digest(ModelDigestOf(bytes));
  header.set_total_bytes(static_cast<int64_t>(bytes.size()));
  w->Write(header);
  const size_t piece = bytes.size() / pieces + 1;
  for (size_t off = 0; off < bytes.size(); off += piece) {
    v1::ModelChunk c;
    c.set_data(bytes.substr(off, piece));
    w->Write(c);
  }
  w->WritesDone();
  return w->Finish();
}

template <typename Reader>
grpc::Status ReadAllChunks(Reader reader, std::string* bytes, v1::ModelChunk* header) {
  v1::ModelChunk c;
  bool first = true;
  while (reader->Read(&c)) {
    if (first) *header = c;
    first = false;
    *bytes += c.data();
  }
  return reader->Finish();
}

class ModelServerTest : public ::testing::Test {
 protected:
  void Start() {
    mkdir(dir_.c_str(), 0755);  // scheduler_server's main makes it
    ServerOptions o;
    o.data_dir = dir_;
    auto s = SchedulerServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto channel = dtrain::rpc::NewChannel(absl::StrCat("127.0.0.1:", server_->port()));
    jobs_ = v1::JobService::NewStub(channel);
    cluster_ = v1::ClusterService::NewStub(channel);
  }
  const std::string dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/sched");
  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
};

// Upload in pieces, submit by digest, the assigned trainer (only) fetches
// it, the owner reads it back, and all of it after a restart.
TEST_F(ModelServerTest, UploadSubmitFetchAndRestart) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string lenet = ReadTestModel("lenet.onnx");
  ASSERT_GT(lenet.size(), 10000u);
  v1::PutModelReply put;
  grpc::Status s = Put(jobs_.get(), lenet, 3, &put);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(put.digest(), ModelDigestOf(lenet));
  EXPECT_EQ(put.total_bytes(), static_cast<int64_t>(lenet.size()));
  EXPECT_FALSE(put.existed());
  ASSERT_TRUE(Put(jobs_.get(), lenet, 1, &put).ok());
  EXPECT_TRUE(put.existed());

  v1::SubmitRequest r;
  r.mutable_spec()->set_name("file");
  r.mutable_spec()->set_model_digest(ModelDigestOf(lenet));
  r.mutable_spec()->set_epochs(1);
  r.mutable_spec()->set_global_batch_size(64);
  r.mutable_spec()->set_lr(0.1);
  v1::JobStatus job;
  s = jobs_->Submit(ModelCtx().get(), r, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();

  // Trainer a gets the job; trainer b does not.
  auto reg = [&](const std::string& name) {
    v1::RegisterTrainerRequest req;
    req.set_name(name);
    req.add_devices("cpu");
    v1::RegisterTrainerReply reply;
    EXPECT_TRUE(cluster_->RegisterTrainer(ModelCtx().get(), req, &reply).ok());
    return reply.trainer_id();
  };
  const std::string a = reg("a");
  v1::HeartbeatRequest hb;
  hb.set_trainer_id(a);
  v1::HeartbeatReply assigned;
  ASSERT_TRUE(cluster_->Heartbeat(ModelCtx().get(), hb, &assigned).ok());
  ASSERT_EQ(assigned.assignments_size(), 1);
  EXPECT_EQ(assigned.assignments(0).spec().model_digest(), ModelDigestOf(lenet));
  const std::string b = reg("b");

  v1::GetModelRequest get;
  get.set_trainer_id(a);
  get.set_job_id(job.id());
  get.set_digest(ModelDigestOf(lenet));
  std::string bytes;
  v1::ModelChunk header;
  auto ctx = ModelCtx();
  s = ReadAllChunks(cluster_->GetModel(ctx.get(), get), &bytes, &header);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(bytes, lenet);
  EXPECT_EQ(header.digest(), ModelDigestOf(lenet));
  EXPECT_EQ(header.total_bytes(), static_cast<int64_t>(lenet.size()));
  for (const auto& [trainer, digest] :
       {std::pair<std::string, std::string>{b, ModelDigestOf(lenet)}, {a, ModelDigestOf("x")}}) {
    get.set_trainer_id(trainer);
    get.set_digest(digest);
    std::string none;
    auto c = ModelCtx();
    s = ReadAllChunks(cluster_->GetModel(c.get(), get), &none, &header);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_TRUE(none.empty());
  }

  // A restart keeps the model and the job that names it.
  server_->Shutdown(absl::Seconds(1));
  server_.reset();
  ASSERT_NO_FATAL_FAILURE(Start());
  v1::GetJobModelRequest mine;
  mine.set_id(job.id());
  bytes.clear();
  auto c = ModelCtx();
  s = ReadAllChunks(jobs_->GetJobModel(c.get(), mine), &bytes, &header);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(bytes, lenet);
}

TEST_F(ModelServerTest, WithoutADataDirThereIsNoModelStore) {
  auto s = SchedulerServer::Start(ServerOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  auto jobs =
      v1::JobService::NewStub(dtrain::rpc::NewChannel(absl::StrCat("127.0.0.1:", (*s)->port())));
  v1::PutModelReply put;
  grpc::Status st = Put(jobs.get(), "bytes", 1, &put);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("--data_dir"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace scheduler
}  // namespace dtrain

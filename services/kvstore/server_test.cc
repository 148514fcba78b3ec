// The server's gRPC surface: health, reflection, admin, metrics, shutdown
// with a final snapshot and resumption from it.
#include "services/kvstore/server.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/kvstore/client.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "protos/admin.grpc.pb.h"

namespace dtrain {
namespace kvstore {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base ? base : "/tmp", "/", name);
  EXPECT_EQ(std::system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str()), 0);
  return dir;
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (b.Valid() && b.Dump(&slices).ok()) {
    for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return dtrain::rpc::NewChannel(address);
}

TEST(KVStoreServerTest, HealthReflectionAndAdmin) {
  ServerOptions options;
  options.port_file = TempDir("port") + "/kvstore.port";
  auto server = KVStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  {
    std::ifstream in(options.port_file);
    int port = 0;
    ASSERT_TRUE(in >> port) << options.port_file;
    EXPECT_EQ(port, (*server)->port());
  }
  auto channel = Channel((*server)->local_address());

  // grpc.health.v1.Health/Check with an empty request: {status: SERVING}.
  {
    grpc::ClientContext ctx;
    grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                     grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::Slice empty;
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel.get(), method, &ctx, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(Flatten(response), std::string("\x08\x01", 2));  // status = SERVING
  }
  // Server reflection lists our services.
  {
    grpc::ClientContext ctx;
    grpc::internal::RpcMethod method(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        grpc::internal::RpcMethod::BIDI_STREAMING);
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel.get(), method, &ctx));
    grpc::Slice list_services(std::string("\x3a\x00", 2));  // list_services: ""
    ASSERT_TRUE(stream->Write(grpc::ByteBuffer(&list_services, 1)));
    stream->WritesDone();
    grpc::ByteBuffer reply;
    ASSERT_TRUE(stream->Read(&reply));
    std::string text = Flatten(reply);
    for (const char* service : {"dtrain.kvstore.v1.KVStore", "dtrain.kvstore.v1.KVStoreData",
                                "dtrain.admin.Admin", "grpc.health.v1.Health"}) {
      EXPECT_TRUE(absl::StrContains(text, service)) << service;
    }
    while (stream->Read(&reply)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
  }
  // dtrain.admin.Admin/Ping.
  {
    auto admin = admin::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    admin::PingRequest request;
    request.set_payload("hello");
    admin::PingReply reply;
    ASSERT_TRUE(admin->Ping(&ctx, request, &reply).ok());
    EXPECT_EQ(reply.payload(), "hello");
    EXPECT_EQ(reply.service(), "kvstore");
  }
  EXPECT_TRUE((*server)->Shutdown(absl::Seconds(1)).ok());
}

TEST(KVStoreServerTest, RejectsBadOptions) {
  ServerOptions options;
  options.max_message_bytes = 10;
  EXPECT_EQ(KVStoreServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = ServerOptions();
  options.listen = "256.1.1.1:0";
  EXPECT_EQ(KVStoreServer::Start(options).status().code(), absl::StatusCode::kUnavailable);
  options = ServerOptions();
  options.metrics_listen = "nonsense";
  EXPECT_EQ(KVStoreServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KVStoreServerTest, MetricsCountPushesPullsRoundsAndHeldBytes) {
  ServerOptions options;
  options.metrics_listen = "127.0.0.1:0";
  options.quota_bytes_per_job = 1 << 20;
  auto server = KVStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions client_options;
  client_options.servers = {(*server)->local_address()};
  client_options.job = "m";
  auto client = KVClient::Connect(client_options);
  ASSERT_TRUE(client.ok());
  JobConfig config;
  config.job = "m";
  ASSERT_TRUE((*client)->CreateJob(config).ok());
  ASSERT_TRUE((*client)
                  ->Init({{"a", {256}, DType::kF32, nullptr}, {"b", {10}, DType::kF32, nullptr}})
                  .ok());
  std::vector<float> a(256, 1.0f), b(10, 2.0f);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*client)->PushPull({{"a", a.data(), a.data()}, {"b", b.data(), b.data()}}).ok());
  }
  ASSERT_TRUE((*client)->Push({{"a", a.data()}}).ok());
  ASSERT_TRUE((*client)->Pull({{"a", a.data()}}).ok());
  EXPECT_FALSE((*client)->Push({{"a", nullptr}}).ok());  // client-side, not counted

  auto text = metrics::Scrape((*server)->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  auto value = [&](const std::string& series) {
    absl::StatusOr<double> v = metrics::SampleValue(*text, series);
    EXPECT_TRUE(v.ok()) << series << "\n" << *text;
    return v.ok() ? *v : -1;
  };
  EXPECT_EQ(value("dtrain_kvstore_requests_total{code=\"OK\",method=\"PushPullUnary\"}"), 3);
  EXPECT_EQ(value("dtrain_kvstore_requests_total{code=\"OK\",method=\"PushUnary\"}"), 1);
  EXPECT_EQ(value("dtrain_kvstore_requests_total{code=\"OK\",method=\"PullUnary\"}"), 1);
  EXPECT_EQ(value("dtrain_kvstore_requests_total{code=\"OK\",method=\"Init\"}"), 1);
  EXPECT_EQ(value("dtrain_kvstore_request_duration_seconds_count{method=\"PushPullUnary\"}"), 3);
  // The scaffold's interceptor counts the same calls under their gRPC names.
  EXPECT_EQ(value("dtrain_rpc_server_requests_total{grpc_code=\"OK\",grpc_method=\"PushPullUnary\","
                  "grpc_service=\"dtrain.kvstore.v1.KVStoreData\"}"),
            3);
  EXPECT_EQ(value("dtrain_rpc_server_requests_total{grpc_code=\"OK\",grpc_method=\"Init\","
                  "grpc_service=\"dtrain.kvstore.v1.KVStore\"}"),
            1);
  EXPECT_EQ(value("dtrain_kvstore_push_bytes_total"), 4 * 1024 + 3 * 40);
  EXPECT_EQ(value("dtrain_kvstore_pull_bytes_total"), 4 * 1024 + 3 * 40);
  EXPECT_EQ(value("dtrain_kvstore_rounds_completed_total{job=\"m\"}"), 4 + 3);
  EXPECT_EQ(value("dtrain_kvstore_keys{job=\"m\"}"), 2);
  EXPECT_EQ(value("dtrain_kvstore_slices{job=\"m\"}"), 2);
  EXPECT_EQ(value("dtrain_kvstore_held_bytes{job=\"m\"}"), 8 * 266);  // value + accumulator
  EXPECT_EQ(value("dtrain_kvstore_quota_bytes"), 1 << 20);
  absl::StatusOr<bool> linted = metrics::PromtoolCheck(*text);
  ASSERT_TRUE(linted.ok()) << linted.status();
  if (!*linted) std::cerr << "promtool not installed: metrics lint skipped\n";
}

TEST(KVStoreServerTest, ShutdownSnapshotsAndRestartResumes) {
  const std::string dir = TempDir("resume");
  ServerOptions options;
  options.data_dir = dir;
  options.snapshot_interval = absl::ZeroDuration();
  auto server = KVStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->resumed());
  const int port = (*server)->port();
  ClientOptions client_options;
  client_options.servers = {(*server)->local_address()};
  client_options.job = "r";
  auto client = KVClient::Connect(client_options);
  ASSERT_TRUE(client.ok());
  JobConfig config;
  config.job = "r";
  config.optimizer = OptimizerKind::kSgd;
  config.learning_rate = 0.5;
  config.momentum = 0.5;
  ASSERT_TRUE((*client)->CreateJob(config).ok());
  std::vector<float> w = {1, 2, 3}, g = {1, 1, 1};
  ASSERT_TRUE((*client)->Init({{"w", {3}, DType::kF32, w.data()}}).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*client)->PushPull({{"w", g.data(), w.data()}}).ok());
  ASSERT_TRUE((*server)->Shutdown(absl::Seconds(1)).ok());
  server->reset();

  // Same directory, same port: the job is back, and the client continues.
  options.listen = absl::StrCat("127.0.0.1:", port);
  auto restarted = KVStoreServer::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_TRUE((*restarted)->resumed());
  std::vector<float> now(3);
  ASSERT_TRUE((*client)->Pull({{"w", now.data(), 0}}).ok());
  EXPECT_EQ(now, w);
  ASSERT_TRUE((*client)->Resync().ok());
  EXPECT_EQ(*(*client)->PushedRound("w"), 3);
  ASSERT_TRUE((*client)->PushPull({{"w", g.data(), now.data()}}).ok());
  EXPECT_NE(now, w);
  EXPECT_EQ((*client)->GetJob(0, true)->slices[0].completed_round, 4);
}

// A job no worker call names for job_ttl is dropped: from GetJob, the
// per-job metric series and the snapshot; a job in use stays, and scraping
// the metrics (which reads every job) does not keep a job alive.
TEST(KVStoreServerTest, IdleJobsExpireFromMemoryMetricsAndSnapshots) {
  const std::string dir = TempDir("ttl");
  ServerOptions options;
  options.data_dir = dir;
  options.snapshot_interval = absl::ZeroDuration();
  options.metrics_listen = "127.0.0.1:0";
  options.job_ttl = absl::Milliseconds(800);
  auto server = KVStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto connect = [&](const std::string& job) {
    ClientOptions o;
    o.servers = {(*server)->local_address()};
    o.job = job;
    auto c = KVClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    JobConfig config;
    config.job = job;
    EXPECT_TRUE((*c)->CreateJob(config).ok());
    EXPECT_TRUE((*c)->Init({{"w", {16}, DType::kF32, nullptr}}).ok());
    return std::move(*c);
  };
  std::unique_ptr<KVClient> orphan = connect("orphan");
  std::unique_ptr<KVClient> busy = connect("busy");
  ASSERT_TRUE((*server)->snapshotter().SnapshotNow().ok());
  auto scrape = [&] {
    absl::StatusOr<std::string> text = metrics::Scrape((*server)->metrics_port());
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : "";
  };
  ASSERT_TRUE(metrics::SampleValue(scrape(), "dtrain_kvstore_slices{job=\"orphan\"}").ok());

  // "busy" is used every 100 ms for almost 4 TTLs; "orphan" is not.
  const absl::Time start = absl::Now();
  absl::Duration orphan_gone = absl::InfiniteDuration();
  while (absl::Now() - start < absl::Milliseconds(3000)) {
    std::vector<float> v(16);
    ASSERT_TRUE(busy->Pull({{"w", v.data(), 0}}).ok());
    scrape();
    const std::vector<std::string> jobs = (*server)->store().JobNames();
    if (orphan_gone == absl::InfiniteDuration() &&
        std::find(jobs.begin(), jobs.end(), "orphan") == jobs.end()) {
      orphan_gone = absl::Now() - start;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  // Expired after the TTL, within a check period (TTL / 4) and slack for a
  // loaded machine.
  EXPECT_GE(orphan_gone, absl::Milliseconds(800));
  EXPECT_LE(orphan_gone, absl::Milliseconds(2500));
  EXPECT_EQ((*server)->store().JobNames(), std::vector<std::string>{"busy"});
  EXPECT_EQ(orphan->GetJob(0, false).status().code(), absl::StatusCode::kNotFound);
  const std::string text = scrape();
  EXPECT_FALSE(metrics::SampleValue(text, "dtrain_kvstore_slices{job=\"orphan\"}").ok()) << text;
  EXPECT_TRUE(metrics::SampleValue(text, "dtrain_kvstore_slices{job=\"busy\"}").ok()) << text;

  // The snapshot was rewritten without it: a restart brings back only "busy".
  (*server)->Shutdown(absl::ZeroDuration()).IgnoreError();
  server->reset();
  options.job_ttl = absl::ZeroDuration();
  options.metrics_listen = "";
  auto restarted = KVStoreServer::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ((*restarted)->store().JobNames(), std::vector<std::string>{"busy"});
}

}  // namespace
}  // namespace kvstore
}  // namespace dtrain

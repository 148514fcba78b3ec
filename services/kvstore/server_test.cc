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
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/kvstore/client.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/health_check.h"
#include "libs/security/certs.h"
#include "libs/security/job_token.h"
#include "protos/admin.grpc.pb.h"
#include "protos/kvstore.grpc.pb.h"

namespace dtrain {
namespace kvstore {
namespace {

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return dtrain::rpc::NewChannel(address);
}

TEST(KVStoreServerTest, HealthReflectionAndAdmin) {
  ServerOptions options;
  options.port_file = FreshTestDir("port") + "/kvstore.port";
  auto server = KVStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  {
    std::ifstream in(options.port_file);
    int port = 0;
    ASSERT_TRUE(in >> port) << options.port_file;
    EXPECT_EQ(port, (*server)->port());
  }
  auto channel = Channel((*server)->local_address());

  // grpc.health.v1.Health/Check of the whole server: SERVING.
  {
    absl::StatusOr<rpc::HealthStatus> health = rpc::CheckHealth(channel.get(), absl::Seconds(10));
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, rpc::HealthStatus::kServing);
  }
  // Server reflection lists our services.
  {
    absl::StatusOr<std::vector<std::string>> services =
        rpc::ListServices(channel.get(), absl::Seconds(10));
    ASSERT_TRUE(services.ok()) << services.status();
    for (const char* service : {"dtrain.kvstore.v1.KVStore", "dtrain.kvstore.v1.KVStoreData",
                                "dtrain.admin.Admin", "grpc.health.v1.Health"}) {
      EXPECT_THAT(*services, ::testing::Contains(service));
    }
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
  client_options.data_path = DataPath::kGrpc;  // the gRPC handlers (data port: data_port_test)
  client_options.job = "m";
  auto client = RemoteParameterServer::Connect(client_options);
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

// Threads of this process (/proc/self/status).
int ThreadCount() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "Threads:")) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// Threads a server holds while `waiting` workers' push-pulls wait for the
// last worker's push (all unary calls), then checks every one of them gets
// the round's sum.
int ThreadsHeldByWaitingPulls(bool callback_data, int waiting) {
  ServerOptions options;
  options.callback_data = callback_data;
  auto server = KVStoreServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return -1;
  std::vector<std::unique_ptr<RemoteParameterServer>> clients;
  for (int w = 0; w <= waiting; ++w) {
    ClientOptions o;
    o.servers = {(*server)->local_address()};
    o.data_path = DataPath::kGrpc;  // the gRPC handlers (data port: data_port_test)
    o.job = "t";
    o.worker = w;
    auto c = RemoteParameterServer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return -1;
    clients.push_back(std::move(*c));
  }
  JobConfig config;
  config.job = "t";
  config.num_workers = waiting + 1;
  EXPECT_TRUE(clients[0]->CreateJob(config).ok());
  for (auto& c : clients) EXPECT_TRUE(c->Init({{"w", {4}, DType::kF32, nullptr}}).ok());
  // Every client connected and its threads started before counting.
  std::vector<std::vector<float>> values(waiting + 1, std::vector<float>(4, 1.0f));
  for (int w = 0; w <= waiting; ++w) {
    absl::Status s = clients[w]->Pull({{"w", values[w].data()}});
    EXPECT_TRUE(s.ok()) << s;
    values[w].assign(4, 1.0f);
  }
  const int before = ThreadCount();
  std::vector<std::thread> threads;
  for (int w = 0; w < waiting; ++w) {
    threads.emplace_back([&, w] {
      absl::Status s = clients[w]->PushPull({{"w", values[w].data(), values[w].data()}});
      EXPECT_TRUE(s.ok()) << s;
    });
  }
  // Until every waiting worker's push is in (its pull then waits).
  for (int i = 0; i < 500; ++i) {
    int pushed = 0;
    for (int w = 0; w < waiting; ++w) {
      absl::StatusOr<JobStatus> st = (*server)->store().GetJob("t", w, true);
      if (st.ok() && st->slices.size() == 1 && st->slices[0].pushed_round == 1) ++pushed;
    }
    if (pushed == waiting) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::SleepFor(absl::Milliseconds(100));
  const int held = ThreadCount() - before;
  absl::Status last =
      clients[waiting]->PushPull({{"w", values[waiting].data(), values[waiting].data()}});
  EXPECT_TRUE(last.ok()) << last;
  for (std::thread& t : threads) t.join();
  for (int w = 0; w <= waiting; ++w) {
    EXPECT_EQ(values[w], std::vector<float>(4, static_cast<float>(waiting + 1))) << "worker " << w;
  }
  return held;
}

// With callback_data a pull waiting for its round holds no server thread:
// 32 waiting push-pulls cost the sync server a thread each and the
// callback path next to none (the client threads are in both counts).
TEST(KVStoreServerTest, CallbackDataPullsWaitWithoutHoldingThreads) {
  const int sync_threads = ThreadsHeldByWaitingPulls(false, 32);
  const int callback_threads = ThreadsHeldByWaitingPulls(true, 32);
  EXPECT_GE(sync_threads, callback_threads + 24)
      << "sync " << sync_threads << ", callback " << callback_threads;
}

// The callback path's pull deadline (max_pull_wait here) is an alarm: the
// reply names the missing worker, and the call is counted.
TEST(KVStoreServerTest, CallbackDataPullDeadlineNamesMissingWorkers) {
  ServerOptions options;
  options.callback_data = true;
  options.max_pull_wait = absl::Milliseconds(300);
  options.metrics_listen = "127.0.0.1:0";
  auto server = KVStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions o;
  o.servers = {(*server)->local_address()};
  o.data_path = DataPath::kGrpc;  // the gRPC handlers (data port: data_port_test)
  o.job = "d";
  o.max_attempts = 1;
  auto client = RemoteParameterServer::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  JobConfig config;
  config.job = "d";
  config.num_workers = 2;
  ASSERT_TRUE((*client)->CreateJob(config).ok());
  ASSERT_TRUE((*client)->Init({{"w", {4}, DType::kF32, nullptr}}).ok());
  std::vector<float> g(4, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = (*client)->PushPull({{"w", g.data(), g.data()}});
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "waiting for workers [1]")) << s;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(5));
  auto text = metrics::Scrape((*server)->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<double> v = metrics::SampleValue(
      *text, "dtrain_kvstore_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"PushPullUnary\"}");
  ASSERT_TRUE(v.ok()) << *text;
  EXPECT_EQ(*v, 1);
}

// With mutual TLS and a cluster secret, the callback path confines a
// trainer to the job its kvstore token names, as the sync path does, and
// its waiting pulls are answered by the other trainer's push.
TEST(KVStoreServerTest, CallbackDataKeepsTrainersToTheirTokensJob) {
  const std::string dir = FreshTestDir("certs");
  ASSERT_TRUE(security::InitCertDir(dir, {}).ok());
  ASSERT_TRUE(security::IssueCert(dir, {"trainer-0", security::Role::kTrainer}).ok());
  auto creds = [&](const std::string& name) {
    auto c = rpc::Credentials::Load(
        {dir + "/ca.pem", dir + "/" + name + ".pem", dir + "/" + name + ".key"});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : rpc::Credentials::Insecure();
  };
  absl::StatusOr<std::string> secret = security::ReadClusterSecret(dir + "/cluster.secret");
  ASSERT_TRUE(secret.ok()) << secret.status();
  rpc::SetDefaultCredentials(creds("kvstore"));
  ServerOptions options;
  options.callback_data = true;
  options.job_token_secret = *secret;
  auto server = KVStoreServer::Start(options);
  rpc::SetDefaultCredentials(creds("trainer-0"));  // the clients below
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string b_token = security::MintJobToken(*secret, "b", absl::Now() + absl::Hours(1));
  auto connect = [&](const std::string& job, int worker) {
    ClientOptions o;
    o.servers = {(*server)->local_address()};
    o.data_path = DataPath::kGrpc;  // the gRPC handlers (data port: data_port_test)
    o.job = job;
    o.worker = worker;
    o.token = b_token;
    o.max_attempts = 1;
    auto c = RemoteParameterServer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  };
  std::unique_ptr<RemoteParameterServer> b0 = connect("b", 0), b1 = connect("b", 1),
                                         a0 = connect("a", 0);
  ASSERT_TRUE(b0 && b1 && a0);
  JobConfig config;
  config.job = "b";
  config.num_workers = 2;
  ASSERT_TRUE(b0->CreateJob(config).ok());
  ASSERT_TRUE(b0->Init({{"w", {4}, DType::kF32, nullptr}}).ok());
  ASSERT_TRUE(b1->Init({{"w", {4}, DType::kF32, nullptr}}).ok());
  // Job a exists (with key w), but b's token does not reach it: every
  // unary data call is refused before the store is asked about job a.
  config.job = "a";
  ASSERT_TRUE((*server)->store().CreateJob(config).ok());
  InitItem init;
  init.spec.key = "w";
  init.spec.shape = {4};
  init.spec.count = 4;
  ASSERT_TRUE((*server)->store().Init("a", {init}).ok());
  EXPECT_EQ(a0->CreateJob(config).code(), absl::StatusCode::kPermissionDenied);
  auto data = v1::KVStoreData::NewStub(rpc::NewChannel((*server)->local_address()));
  v1::PushRequest push;
  push.set_job("a");
  v1::PushItem* item = push.add_items();
  item->set_key("w");
  item->set_round(1);
  item->add_shape(4);
  push.add_chunks()->set_data(std::string(16, '\0'));
  v1::PullRequest pull;
  pull.set_job("a");
  pull.add_items()->set_key("w");
  for (const char* method : {"PushUnary", "PushPullUnary", "PullUnary"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(security::kJobTokenMetadata, b_token);
    v1::PushResponse pushed;
    v1::PullResponse pulled;
    const std::string m = method;
    grpc::Status st = m == "PushUnary"       ? data->PushUnary(&ctx, push, &pushed)
                      : m == "PushPullUnary" ? data->PushPullUnary(&ctx, push, &pulled)
                                             : data->PullUnary(&ctx, pull, &pulled);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << method << ": " << st.error_message();
  }
  std::vector<float> g0(4, 1.0f), g1(4, 2.0f);
  std::thread waiter([&] {
    absl::Status s = b0->PushPull({{"w", g0.data(), g0.data()}});
    EXPECT_TRUE(s.ok()) << s;
  });
  absl::SleepFor(absl::Milliseconds(50));
  absl::Status s = b1->PushPull({{"w", g1.data(), g1.data()}});
  waiter.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(g0, std::vector<float>(4, 3.0f));
  EXPECT_EQ(g1, std::vector<float>(4, 3.0f));
  rpc::SetDefaultCredentials(rpc::Credentials::Insecure());
}

TEST(KVStoreServerTest, ShutdownSnapshotsAndRestartResumes) {
  const std::string dir = FreshTestDir("resume");
  ServerOptions options;
  options.data_dir = dir;
  options.snapshot_interval = absl::ZeroDuration();
  auto server = KVStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->resumed());
  const int port = (*server)->port();
  ClientOptions client_options;
  client_options.servers = {(*server)->local_address()};
  client_options.data_path = DataPath::kGrpc;  // the gRPC handlers (data port: data_port_test)
  client_options.job = "r";
  auto client = RemoteParameterServer::Connect(client_options);
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
  const std::string dir = FreshTestDir("ttl");
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
    o.data_path = DataPath::kGrpc;  // the gRPC handlers (data port: data_port_test)
    o.job = job;
    auto c = RemoteParameterServer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    JobConfig config;
    config.job = job;
    EXPECT_TRUE((*c)->CreateJob(config).ok());
    EXPECT_TRUE((*c)->Init({{"w", {16}, DType::kF32, nullptr}}).ok());
    return std::move(*c);
  };
  std::unique_ptr<RemoteParameterServer> orphan = connect("orphan");
  std::unique_ptr<RemoteParameterServer> busy = connect("busy");
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

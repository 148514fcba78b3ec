// The scaffold on loopback: health, reflection, admin, the RPC metrics,
// port files, graceful shutdown, and the signal tail of mains.
#include "libs/rpc/server.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/sync_stream.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/base/testing.h"
#include "libs/metrics/metrics.h"
#include "libs/metrics/scrape.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/health_check.h"
#include "protos/admin.grpc.pb.h"
#include "protos/scheduler.grpc.pb.h"

namespace dtrain {
namespace rpc {
namespace {

namespace v1 = scheduler::v1;

std::shared_ptr<grpc::Channel> Channel(const Server& server) {
  return dtrain::rpc::NewChannel(server.local_address());
}

// grpc.health.v1.Health/Check for the whole server (5 s deadline).
absl::StatusOr<HealthStatus> HealthCheck(grpc::Channel* channel) {
  return CheckHealth(channel, absl::Seconds(5));
}

grpc::Status Ping(grpc::Channel* channel, const std::string& payload, int fail_with_code = 0,
                  admin::PingReply* reply = nullptr) {
  auto stub = admin::Admin::NewStub(std::shared_ptr<grpc::Channel>(channel, [](auto*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  admin::PingRequest request;
  request.set_payload(payload);
  request.set_fail_with_code(fail_with_code);
  admin::PingReply ignored;
  return stub->Ping(&ctx, request, reply ? reply : &ignored);
}

// A JobService whose Get holds the call (id "<ms>": that many milliseconds;
// id "block": until Release() or cancellation) and whose other methods are
// unimplemented.
class BlockingJobs final : public v1::JobService::Service {
 public:
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetRequest* request,
                   v1::JobStatus* reply) override {
    entered_.fetch_add(1);
    const bool block = request->id() == "block";
    const absl::Time until =
        block ? absl::InfiniteFuture()
              : absl::Now() + absl::Milliseconds(std::atoi(request->id().c_str()));
    while (absl::Now() < until && !ctx->IsCancelled() && !(block && release_.HasBeenNotified())) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    reply->set_id(request->id());
    absl::MutexLock lock(&mu_);
    last_return_ = absl::Now();
    return grpc::Status::OK;
  }
  int entered() const { return entered_.load(); }
  void Release() { release_.Notify(); }
  // When the last call that was not cancelled returned.
  absl::Time last_return() {
    absl::MutexLock lock(&mu_);
    return last_return_;
  }

 private:
  std::atomic<int> entered_{0};
  absl::Notification release_;
  absl::Mutex mu_;
  absl::Time last_return_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// Get with id = `hold` (see BlockingJobs).
grpc::Status HoldingGet(grpc::Channel* channel, const std::string& hold) {
  auto stub = v1::JobService::NewStub(std::shared_ptr<grpc::Channel>(channel, [](auto*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetRequest request;
  request.set_id(hold);
  v1::JobStatus reply;
  grpc::Status s = stub->Get(&ctx, request, &reply);
  if (s.ok() && reply.id() != request.id()) return grpc::Status(grpc::StatusCode::INTERNAL, "id");
  return s;
}

void WaitUntil(const std::function<bool()>& cond) {
  for (int i = 0; i < 2000 && !cond(); ++i) absl::SleepFor(absl::Milliseconds(5));
}

TEST(RpcServerTest, HealthReflectionAdminAndAddedServices) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  BlockingJobs jobs;
  Server server(options);
  server.AddService(&jobs);
  ASSERT_TRUE(server.Start().ok());
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.metrics_port(), 0);
  auto channel = Channel(server);

  absl::StatusOr<HealthStatus> health = HealthCheck(channel.get());
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kServing);
  // A service the server does not know: NOT_FOUND (the request names it).
  health = CheckHealth(channel.get(), absl::Seconds(5), "no.such.Service");
  EXPECT_EQ(health.status().code(), absl::StatusCode::kNotFound) << health.status();
  EXPECT_NE(health.status().message().find("grpc.health.v1.Health/Check"), std::string::npos)
      << health.status();

  // Server reflection lists the added service and the scaffold's.
  {
    absl::StatusOr<std::vector<std::string>> services =
        rpc::ListServices(channel.get(), absl::Seconds(10));
    ASSERT_TRUE(services.ok()) << services.status();
    for (const char* service :
         {"dtrain.scheduler.v1.JobService", "dtrain.admin.Admin", "grpc.health.v1.Health"}) {
      EXPECT_THAT(*services, ::testing::Contains(service));
    }
  }

  admin::PingReply reply;
  grpc::Status s = Ping(channel.get(), "hello", 0, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.payload(), "hello");
  EXPECT_EQ(reply.service(), "testsvc");
  EXPECT_GE(reply.uptime_ms(), 0);
  s = Ping(channel.get(), "no such job", static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "no such job");

  EXPECT_TRUE(HoldingGet(channel.get(), "0").ok());
  EXPECT_EQ(jobs.entered(), 1);
  server.Shutdown(absl::Seconds(1));
  EXPECT_FALSE(HealthCheck(channel.get()).ok());
}

TEST(RpcServerTest, MetricsCountCallsByServiceMethodAndCode) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  BlockingJobs jobs;
  Server server(options);
  server.AddService(&jobs);
  // Families of the owner appear next to the scaffold's.
  auto own = std::make_shared<prometheus::Registry>();
  metrics::AddCounter(*own, "dtrain_testsvc_things_total", "Things.").Add({}).Increment(7);
  server.Expose(own);
  ASSERT_TRUE(server.Start().ok());
  ASSERT_GT(server.metrics_port(), 0);
  auto channel = Channel(server);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Ping(channel.get(), "x").ok());
  EXPECT_EQ(Ping(channel.get(), "x", static_cast<int>(grpc::StatusCode::UNAVAILABLE)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(HoldingGet(channel.get(), "50").ok());
  auto stub = v1::JobService::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::CancelRequest request;
    v1::JobStatus reply;
    EXPECT_EQ(stub->Cancel(&ctx, request, &reply).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }

  absl::StatusOr<std::string> text = metrics::Scrape(server.metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  auto value = [&](const std::string& series) {
    absl::StatusOr<double> v = metrics::SampleValue(*text, series);
    EXPECT_TRUE(v.ok()) << series << "\n" << *text;
    return v.ok() ? *v : -1;
  };
  const std::string ping = "grpc_method=\"Ping\",grpc_service=\"dtrain.admin.Admin\"";
  EXPECT_EQ(value("dtrain_rpc_server_requests_total{grpc_code=\"OK\"," + ping + "}"), 3);
  EXPECT_EQ(value("dtrain_rpc_server_requests_total{grpc_code=\"UNAVAILABLE\"," + ping + "}"), 1);
  EXPECT_EQ(value("dtrain_rpc_server_request_duration_seconds_count{" + ping + "}"), 4);
  const std::string get = "grpc_method=\"Get\",grpc_service=\"dtrain.scheduler.v1.JobService\"";
  EXPECT_EQ(value("dtrain_rpc_server_requests_total{grpc_code=\"OK\"," + get + "}"), 1);
  // The held Get took at least 50 ms: it is not in the 10 ms bucket's count.
  EXPECT_GE(value("dtrain_rpc_server_request_duration_seconds_sum{" + get + "}"), 0.05);
  EXPECT_EQ(value("dtrain_rpc_server_requests_total{grpc_code=\"UNIMPLEMENTED\","
                  "grpc_method=\"Cancel\",grpc_service=\"dtrain.scheduler.v1.JobService\"}"),
            1);
  EXPECT_EQ(value("dtrain_rpc_server_requests_in_flight"), 0);
  EXPECT_EQ(value("dtrain_testsvc_things_total"), 7);
  absl::StatusOr<bool> linted = metrics::PromtoolCheck(*text);
  ASSERT_TRUE(linted.ok()) << linted.status();
  EXPECT_TRUE(*linted) << "promtool is missing";
}

TEST(RpcServerTest, CountsCallsInFlight) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  BlockingJobs jobs;
  Server server(options);
  server.AddService(&jobs);
  ASSERT_TRUE(server.Start().ok());
  auto channel = Channel(server);
  std::thread a([&] { EXPECT_TRUE(HoldingGet(channel.get(), "block").ok()); });
  std::thread b([&] { EXPECT_TRUE(HoldingGet(channel.get(), "block").ok()); });
  WaitUntil([&] { return jobs.entered() == 2; });
  EXPECT_EQ(server.calls_in_flight(), 2);
  absl::StatusOr<std::string> text = metrics::Scrape(server.metrics_port());
  jobs.Release();
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*metrics::SampleValue(*text, "dtrain_rpc_server_requests_in_flight"), 2);
  a.join();
  b.join();
  EXPECT_EQ(server.calls_in_flight(), 0);
}

TEST(RpcServerTest, WritesPortFiles) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  options.port_file = TestTmpPath("grpc.port");
  options.metrics_listen = "127.0.0.1:0";
  options.metrics_port_file = TestTmpPath("metrics.port");
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_EQ(ReadFileForTest(options.port_file), absl::StrCat(server.port()));
  EXPECT_EQ(ReadFileForTest(options.metrics_port_file), absl::StrCat(server.metrics_port()));
  EXPECT_NE(server.port(), server.metrics_port());
}

TEST(RpcServerTest, MetricsOnlyServer) {
  // The trainer daemon's case without --health_listen: no gRPC port.
  ServerOptions options;
  options.service = "trainer";
  options.metrics_listen = "127.0.0.1:0";
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_EQ(server.port(), 0);
  EXPECT_EQ(server.grpc_server(), nullptr);
  absl::StatusOr<std::string> text = metrics::Scrape(server.metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(absl::StrContains(*text, "dtrain_rpc_server_requests_in_flight 0")) << *text;
}

TEST(RpcServerTest, BadOptionsAndBusyPortsAreErrors) {
  {
    Server server(ServerOptions{});
    absl::Status s = server.Start();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "service")) << s;
  }
  {
    ServerOptions options;
    options.service = "testsvc";
    BlockingJobs jobs;
    Server server(options);
    server.AddService(&jobs);
    absl::Status s = server.Start();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "no gRPC address")) << s;
  }
  // A port someone else holds: kUnavailable naming the address.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string busy = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  {
    ServerOptions options;
    options.service = "testsvc";
    options.listen = busy;
    Server server(options);
    absl::Status s = server.Start();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), busy)) << s;
  }
  {
    ServerOptions options;
    options.service = "testsvc";
    options.metrics_listen = busy;
    Server server(options);
    absl::Status s = server.Start();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  }
  close(fd);
  {
    ServerOptions options;
    options.service = "testsvc";
    options.listen = "127.0.0.1:0";
    options.port_file = TestTmpPath("no/such/dir/port");
    Server server(options);
    absl::Status s = server.Start();
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), options.port_file)) << s;
  }
}

// Exhaustion (issue 16): many more blocking calls than max_threads, over
// several connections. The excess is refused with RESOURCE_EXHAUSTED right
// away instead of piling up threads; the held calls still finish; and the
// health check answers within 1 s throughout.
TEST(RpcServerTest, ThreadCapRefusesTheExcessAndHealthStillAnswers) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  options.max_threads = 16;
  options.max_pollers = 2;
  BlockingJobs jobs;
  Server server(options);
  server.AddService(&jobs);
  ASSERT_TRUE(server.Start().ok());
  constexpr int kCalls = 200;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < 4; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("dtrain.test.channel", c);  // separate connections
    channels.push_back(grpc::CreateCustomChannel(server.local_address(),
                                                 grpc::InsecureChannelCredentials(), args));
  }
  std::vector<grpc::Status> results(kCalls);
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back(
        [&, i] { results[i] = HoldingGet(channels[i % channels.size()].get(), "1500"); });
  }
  auto health = Channel(server);
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<HealthStatus> h = HealthCheck(health.get());
    EXPECT_TRUE(h.ok()) << "probe " << i << ": " << h.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "probe " << i;
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (auto& t : calls) t.join();
  int ok = 0, exhausted = 0;
  for (const grpc::Status& s : results) {
    if (s.ok()) ++ok;
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
  }
  EXPECT_EQ(ok + exhausted, kCalls);
  EXPECT_GT(ok, 0);
  EXPECT_GT(exhausted, 0);
  EXPECT_LE(jobs.entered(), 16);  // never more handlers at once than threads
}

TEST(RpcServerTest, ShutdownLetsCallsInFlightFinishWithinTheGrace) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  BlockingJobs jobs;
  Server server(options);
  server.AddService(&jobs);
  ASSERT_TRUE(server.Start().ok());
  auto channel = Channel(server);
  grpc::Status result;
  std::thread call([&] { result = HoldingGet(channel.get(), "300"); });
  WaitUntil([&] { return jobs.entered() == 1; });
  const absl::Time start = absl::Now();
  server.Shutdown(absl::Seconds(10));
  const absl::Time end = absl::Now();
  call.join();
  EXPECT_TRUE(result.ok()) << result.error_message();
  // It waited for the call, and not for the idle connection until the grace.
  EXPECT_GE(end, jobs.last_return());
  EXPECT_LT(end - start, absl::Seconds(5));
  // New calls are refused.
  EXPECT_FALSE(Ping(channel.get(), "late").ok());
}

TEST(RpcServerTest, ShutdownCancelsCallsThatOutlastTheGrace) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  BlockingJobs jobs;
  Server server(options);
  server.AddService(&jobs);
  ASSERT_TRUE(server.Start().ok());
  auto channel = Channel(server);
  grpc::Status result;
  std::thread call([&] { result = HoldingGet(channel.get(), "block"); });
  WaitUntil([&] { return jobs.entered() == 1; });
  const absl::Time start = absl::Now();
  server.Shutdown(absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  call.join();
  // The client sees the call cut off (UNAVAILABLE or CANCELLED, depending
  // on which side notices first).
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(jobs.last_return(), absl::InfinitePast());  // the handler saw the cancellation
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(RpcServerTest, IdleConnectionsDoNotDelayShutdown) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  auto channel = Channel(server);
  ASSERT_TRUE(Ping(channel.get(), "connect").ok());  // an open, idle connection
  const absl::Time start = absl::Now();
  server.Shutdown(absl::Seconds(20));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(RpcServerTest, RunUntilShutdownSignalCallsTheShutdownOnSigterm) {
  ServerOptions options;
  options.service = "testsvc";
  options.listen = "127.0.0.1:0";
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  std::atomic<int> shutdowns{0};
  std::thread killer([] {
    absl::SleepFor(absl::Milliseconds(100));
    kill(getpid(), SIGTERM);
  });
  const absl::Time start = absl::Now();
  const int code = RunUntilShutdownSignal("server_test", [&] {
    shutdowns.fetch_add(1);
    server.Shutdown(absl::Seconds(1));
    return absl::OkStatus();
  });
  killer.join();
  EXPECT_EQ(code, 0);
  EXPECT_EQ(shutdowns.load(), 1);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  auto channel = Channel(server);
  EXPECT_FALSE(Ping(channel.get(), "after").ok());
}

}  // namespace
}  // namespace rpc
}  // namespace dtrain

// Mutual TLS on loopback: a server with certificates from libs/security
// answers clients holding a certificate of the same CA, knows who they are,
// and refuses plain-text clients, clients without a certificate and clients
// of another CA.
#include "libs/rpc/credentials.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/base/subprocess.h"
#include "libs/base/testing.h"
#include "libs/rpc/server.h"
#include "libs/security/certs.h"
#include "protos/admin.grpc.pb.h"

namespace dtrain {
namespace rpc {
namespace {

TlsFiles Files(const std::string& dir, const std::string& name) {
  return {dir + "/ca.pem", absl::StrCat(dir, "/", name, ".pem"),
          absl::StrCat(dir, "/", name, ".key")};
}

// Admin.Ping through `channel`: the caller the server saw, or the error.
absl::StatusOr<std::string> Ping(std::shared_ptr<grpc::Channel> channel) {
  auto stub = admin::Admin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  admin::PingReply reply;
  grpc::Status s = stub->Ping(&ctx, admin::PingRequest(), &reply);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return reply.caller();
}

class CredentialsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(security::InitCertDir(TestTmpPath("ca"), {}).ok());
    security::CertRequest alice;
    alice.name = "alice";
    alice.role = security::Role::kUser;
    ASSERT_TRUE(security::IssueCert(TestTmpPath("ca"), alice).ok());
    ASSERT_TRUE(security::InitCertDir(TestTmpPath("other-ca"), {}).ok());
  }

  void SetUp() override {
    auto creds = Credentials::Load(Files(TestTmpPath("ca"), "scheduler"));
    ASSERT_TRUE(creds.ok()) << creds.status();
    ServerOptions o;
    o.service = "scheduler";
    o.listen = "127.0.0.1:0";
    o.credentials = *creds;
    server_ = std::make_unique<Server>(o);
    ASSERT_TRUE(server_->Start().ok());
  }

  std::unique_ptr<Server> server_;
};

TEST_F(CredentialsTest, AClientOfTheSameCaIsKnownByItsCertificate) {
  auto alice = Credentials::Load(Files(TestTmpPath("ca"), "alice"));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ((*alice)->identity().ToString(), "alice (user)");
  absl::StatusOr<std::string> caller = Ping(NewChannel(server_->local_address(), alice->get()));
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(*caller, "alice (user)");
  // By the name "localhost" too (a SAN of every certificate).
  caller = Ping(NewChannel(absl::StrCat("localhost:", server_->port()), alice->get()));
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(*caller, "alice (user)");
}

TEST_F(CredentialsTest, PlainTextNoCertificateOrAnotherCaCannotCall) {
  EXPECT_EQ(
      Ping(NewChannel(server_->local_address(), Credentials::Insecure().get())).status().code(),
      absl::StatusCode::kUnavailable);
  // TLS that trusts the CA but presents no client certificate.
  grpc::SslCredentialsOptions no_cert;
  std::ifstream in(TestTmpPath("ca") + "/ca.pem");
  no_cert.pem_root_certs.assign(std::istreambuf_iterator<char>(in), {});
  EXPECT_EQ(Ping(grpc::CreateChannel(server_->local_address(), grpc::SslCredentials(no_cert)))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  // A certificate of another CA (its own admin).
  auto stranger = Credentials::Load(Files(TestTmpPath("other-ca"), "admin"));
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ(Ping(NewChannel(server_->local_address(), stranger->get())).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(CredentialsLoadTest, ErrorsNameTheFile) {
  absl::StatusOr<std::shared_ptr<const Credentials>> c =
      Credentials::Load({"/nonexistent/ca.pem", "x.pem", "x.key"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/ca.pem"), std::string::npos) << c.status();
  const std::string dir = TestTmpPath("load");
  ASSERT_TRUE(security::InitCertDir(dir, {}).ok());
  // The key where the certificate belongs.
  c = Credentials::Load({dir + "/ca.pem", dir + "/admin.key", dir + "/admin.key"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("admin.key"), std::string::npos) << c.status();
}

// The reconnect test's server: this binary run with --serve=PORT
// --cert_dir=DIR serves (the scheduler's certificate of DIR, port file
// DIR/port) until it is killed. A server of its own process: gRPC's polling
// threads of an in-process server would also drive the client's connection
// attempts, which in a trainer only gRPC's backup poller does.
int Serve(int port, const std::string& cert_dir) {
  auto creds = Credentials::Load(Files(cert_dir, "scheduler"));
  if (!creds.ok()) return 2;
  ServerOptions o;
  o.service = "scheduler";
  o.listen = absl::StrCat("127.0.0.1:", port);
  o.port_file = cert_dir + "/port";
  o.credentials = *creds;
  Server server(o);
  if (!server.Start().ok()) return 3;
  absl::SleepFor(absl::InfiniteDuration());
  return 0;
}

// Starts Serve in a child on `port` (0: any) and waits for its port file.
std::unique_ptr<Subprocess> StartServer(int port, const std::string& cert_dir, int* bound) {
  std::remove((cert_dir + "/port").c_str());
  SubprocessOptions o;
  o.argv = {"/proc/self/exe", absl::StrCat("--serve=", port), "--cert_dir=" + cert_dir};
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(o);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return nullptr;
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (absl::Now() < end) {
    std::ifstream in(cert_dir + "/port");
    if (in >> *bound) return *std::move(child);
    absl::SleepFor(absl::Milliseconds(5));
  }
  ADD_FAILURE() << "the server did not write " << cert_dir << "/port within 30 s";
  return nullptr;
}

// A server (another process) SIGKILLed and started again on its port after
// several seconds is reached within about a second of it serving again by
// a channel whose calls (no wait_for_ready) kept failing meanwhile, as a
// trainer's heartbeats reach a restarted scheduler. Without NewChannel's
// bounded backoff a channel would be in a backoff of seconds; without the
// backup poll interval, nothing in the client process would drive the
// connection attempt (calls that fail at once do not poll): each of its
// steps (TCP connect, TLS handshake, HTTP/2 settings) waited for gRPC's
// 5 s backup poll, 15 s in all.
TEST(ChannelReconnectTest, ReachesARestartedServerWithinASecondOfItServing) {
  const std::string dir = TestTmpPath("reconnect-ca");
  ASSERT_TRUE(security::InitCertDir(dir, {}).ok());
  auto admin = Credentials::Load(Files(dir, "admin"));
  ASSERT_TRUE(admin.ok()) << admin.status();
  int port = 0;
  std::unique_ptr<Subprocess> server = StartServer(0, dir, &port);
  ASSERT_NE(server, nullptr);
  std::shared_ptr<grpc::Channel> channel =
      NewChannel(absl::StrCat("127.0.0.1:", port), admin->get());
  ASSERT_TRUE(Ping(channel).ok());
  ASSERT_TRUE(server->Signal(SIGKILL).ok());
  ASSERT_TRUE(server->Wait(absl::Seconds(10)).ok());
  // Six seconds of failing calls: with gRPC's default backoff (1 s growing
  // 1.6x to 120 s) the channel would now wait 2.6-4.1 s between attempts.
  const absl::Time away_until = absl::Now() + absl::Seconds(6);
  int failures = 0;
  while (absl::Now() < away_until) {
    if (!Ping(channel).ok()) ++failures;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GT(failures, 10);
  int again = 0;
  server = StartServer(port, dir, &again);
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(again, port);
  const absl::Time serving = absl::Now();
  // Calls that fail at once while the channel is not connected, every 20 ms.
  absl::Duration reconnected = absl::InfiniteDuration();
  while (absl::Now() - serving < absl::Seconds(20)) {
    auto stub = admin::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    admin::PingReply reply;
    if (stub->Ping(&ctx, admin::PingRequest(), &reply).ok()) {
      reconnected = absl::Now() - serving;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf("reconnected_after_serving_s=%.3f\n", absl::ToDoubleSeconds(reconnected));
  // Under a second: the last backoff (500 ms, +-20% jitter) and a few
  // polls of 100 ms; 2 s leaves room for a loaded machine.
  EXPECT_LT(reconnected, absl::Seconds(2));
}

TEST(CredentialsDefaultTest, PlainTextUntilAMainSetsThem) {
  EXPECT_TRUE(DefaultCredentials()->insecure());
  EXPECT_FALSE(DefaultCredentials()->identity().authenticated);
}

}  // namespace
}  // namespace rpc
}  // namespace dtrain

// The test, or with --serve=PORT --cert_dir=DIR the reconnect test's server.
int main(int argc, char** argv) {
  if (argc == 3 && absl::StartsWith(argv[1], "--serve=") &&
      absl::StartsWith(argv[2], "--cert_dir=")) {
    int port = 0;
    if (!absl::SimpleAtoi(absl::string_view(argv[1]).substr(8), &port)) return 2;
    return dtrain::rpc::Serve(port, std::string(argv[2] + 11));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

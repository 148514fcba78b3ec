// Mutual TLS on loopback: a server with certificates from libs/security
// answers clients holding a certificate of the same CA, knows who they are,
// and refuses plain-text clients, clients without a certificate and clients
// of another CA.
#include "libs/base/testing.h"
#include "libs/rpc/credentials.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
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

// A server that went away for several seconds and came back on the same
// port is reached within about a second by a channel that kept failing
// meanwhile (gRPC's default backoff, 1 s growing 1.6x to 120 s, would leave
// it in backoff for seconds: a trainer re-registered 14-16 s after its
// scheduler restarted).
TEST_F(CredentialsTest, AChannelReconnectsWithinASecondOfTheServerComingBack) {
  auto alice = Credentials::Load(Files(TestTmpPath("ca"), "alice"));
  ASSERT_TRUE(alice.ok()) << alice.status();
  const int port = server_->port();
  std::shared_ptr<grpc::Channel> channel =
      NewChannel(absl::StrCat("127.0.0.1:", port), alice->get());
  ASSERT_TRUE(Ping(channel).ok());
  server_->Shutdown(absl::Seconds(1));
  server_.reset();
  // Six seconds of failing calls: with gRPC's default the backoff would now
  // be 2.6-4.1 s long.
  const absl::Time away_until = absl::Now() + absl::Seconds(6);
  int failures = 0;
  while (absl::Now() < away_until) {
    if (!Ping(channel).ok()) ++failures;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GT(failures, 10);
  auto creds = Credentials::Load(Files(TestTmpPath("ca"), "scheduler"));
  ASSERT_TRUE(creds.ok()) << creds.status();
  ServerOptions o;
  o.service = "scheduler";
  o.listen = absl::StrCat("127.0.0.1:", port);
  o.credentials = *creds;
  server_ = std::make_unique<Server>(o);
  ASSERT_TRUE(server_->Start().ok());
  const absl::Time back = absl::Now();
  // Calls that fail at once while the channel waits out its backoff (no
  // wait_for_ready), every 20 ms.
  absl::Duration reconnected = absl::InfiniteDuration();
  while (absl::Now() - back < absl::Seconds(10)) {
    auto stub = admin::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    admin::PingReply reply;
    if (stub->Ping(&ctx, admin::PingRequest(), &reply).ok()) {
      reconnected = absl::Now() - back;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LT(reconnected, absl::Milliseconds(1500));
}

TEST(CredentialsDefaultTest, PlainTextUntilAMainSetsThem) {
  EXPECT_TRUE(DefaultCredentials()->insecure());
  EXPECT_FALSE(DefaultCredentials()->identity().authenticated);
}

}  // namespace
}  // namespace rpc
}  // namespace dtrain

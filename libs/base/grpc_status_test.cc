// Starts a real gRPC server on a loopback port and checks that statuses
// survive the trip: absl -> grpc (server) -> wire -> grpc -> absl (client).
#include "libs/base/grpc_status.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "libs/rpc/credentials.h"
#include "protos/admin.grpc.pb.h"

namespace dtrain {
namespace {

class AdminImpl final : public admin::Admin::Service {
 public:
  grpc::Status Ping(grpc::ServerContext*, const admin::PingRequest* req,
                    admin::PingReply* reply) override {
    if (req->fail_with_code() != 0) {
      return ToGrpcStatus(
          absl::Status(static_cast<absl::StatusCode>(req->fail_with_code()), req->payload()));
    }
    reply->set_payload(req->payload());
    reply->set_service("test");
    return ToGrpcStatus(absl::OkStatus());
  }
};

class GrpcStatusTest : public testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", dtrain::rpc::DefaultCredentials()->ServerCredentials(),
                             &port);
    builder.RegisterService(&impl_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    auto channel = dtrain::rpc::NewChannel("127.0.0.1:" + std::to_string(port));
    stub_ = admin::Admin::NewStub(channel);
  }
  void TearDown() override { server_->Shutdown(); }

  absl::Status Call(const std::string& payload, int code, std::string* echoed) {
    grpc::ClientContext ctx;
    admin::PingRequest req;
    req.set_payload(payload);
    req.set_fail_with_code(code);
    admin::PingReply reply;
    absl::Status s = FromGrpcStatus(stub_->Ping(&ctx, req, &reply), "Admin.Ping");
    *echoed = reply.payload();
    return s;
  }

  AdminImpl impl_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<admin::Admin::Stub> stub_;
};

TEST_F(GrpcStatusTest, OkRoundTrip) {
  std::string echoed;
  ASSERT_TRUE(Call("hello", 0, &echoed).ok());
  EXPECT_EQ(echoed, "hello");
}

TEST_F(GrpcStatusTest, EveryErrorCodeSurvivesTheWire) {
  for (int code = 1; code <= 16; ++code) {
    std::string echoed;
    absl::Status s = Call("reason " + std::to_string(code), code, &echoed);
    EXPECT_EQ(static_cast<int>(s.code()), code);
    EXPECT_EQ(s.message(), "Admin.Ping: reason " + std::to_string(code));
  }
}

TEST(GrpcStatusConversion, DirectMapping) {
  grpc::Status g = ToGrpcStatus(absl::ResourceExhaustedError("full"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(g.error_message(), "full");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  absl::Status a = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  EXPECT_EQ(a.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.message(), "down");
}

}  // namespace
}  // namespace dtrain

// grpc_health_probe ADDRESS: what a Kubernetes gRPC probe does (kubelet >= 1.27,
// `grpc: {port: N}`): one grpc.health.v1.Health/Check call for the whole server
// (service ""), plaintext, with a deadline. Exits 0 and prints SERVING when
// the server answers SERVING; otherwise prints why and exits 1. tools/images
// smoke runs it against the containers' probe ports.
//   grpc_health_probe 10.89.70.10:7000 [--timeout_s=1] [--service=NAME]
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

ABSL_FLAG(double, timeout_s, 1, "deadline of the call (Kubernetes' default timeoutSeconds: 1)");
ABSL_FLAG(std::string, service, "", "the service to ask about (empty: the whole server)");

namespace {

const char* StatusName(int status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "an unknown status";
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("grpc_health_probe ADDRESS: one grpc.health.v1 Check, as kubelet");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: grpc_health_probe HOST:PORT [--timeout_s=S] [--service=NAME]\n");
    return 2;
  }
  const std::string address = args[1];
  const std::string service = absl::GetFlag(FLAGS_service);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s))));
  // HealthCheckRequest {string service = 1;} by hand: no generated code for
  // grpc.health.v1 in Debian's gRPC packages.
  std::string request_bytes;
  if (!service.empty() && service.size() < 128) {
    request_bytes.push_back('\x0a');
    request_bytes.push_back(static_cast<char>(service.size()));
    request_bytes += service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                   grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, &ctx, request, &response);
  if (!s.ok()) {
    std::printf("%s: health check failed: %s (gRPC code %d)\n", address.c_str(),
                s.error_message().c_str(), static_cast<int>(s.error_code()));
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string reply;
  if (response.Valid() && response.Dump(&slices).ok()) {
    for (const auto& piece : slices) {
      reply.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
  }
  // HealthCheckResponse {ServingStatus status = 1;}: absent means UNKNOWN (0).
  int status = 0;
  if (reply.size() == 2 && reply[0] == '\x08') status = static_cast<unsigned char>(reply[1]);
  std::printf("%s: %s\n", address.c_str(), StatusName(status));
  return status == 1 ? 0 : 1;
}

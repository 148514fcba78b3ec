// grpc_health_probe ADDRESS: what a Kubernetes gRPC probe does (kubelet >= 1.27,
// `grpc: {port: N}`): one grpc.health.v1.Health/Check call for the whole server
// (service ""), plaintext, with a deadline. Exits 0 and prints SERVING when
// the server answers SERVING; otherwise prints why and exits 1. tools/images
// smoke runs it against the containers' probe ports.
//   grpc_health_probe 10.89.70.10:7000 [--timeout_s=1] [--service=NAME]
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "libs/rpc/health_check.h"

ABSL_FLAG(double, timeout_s, 1, "deadline of the call (Kubernetes' default timeoutSeconds: 1)");
ABSL_FLAG(std::string, service, "", "the service to ask about (empty: the whole server)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("grpc_health_probe ADDRESS: one grpc.health.v1 Check, as kubelet");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: grpc_health_probe HOST:PORT [--timeout_s=S] [--service=NAME]\n");
    return 2;
  }
  const std::string address = args[1];
  const std::string service = absl::GetFlag(FLAGS_service);
  if (service.size() >= 128) {
    std::fprintf(stderr, "grpc_health_probe: --service must be shorter than 128 bytes\n");
    return 2;
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  absl::StatusOr<dtrain::rpc::HealthStatus> status = dtrain::rpc::CheckHealth(
      channel.get(), absl::Seconds(absl::GetFlag(FLAGS_timeout_s)), service);
  if (!status.ok()) {
    std::printf("%s: health check failed: %s (gRPC code %d)\n", address.c_str(),
                std::string(status.status().message()).c_str(),
                static_cast<int>(status.status().code()));
    return 1;
  }
  std::printf("%s: %s\n", address.c_str(), dtrain::rpc::HealthStatusName(*status));
  return *status == dtrain::rpc::HealthStatus::kServing ? 0 : 1;
}

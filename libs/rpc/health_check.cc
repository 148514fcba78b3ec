#include "libs/rpc/health_check.h"

#include <grpcpp/client_context.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/grpc_status.h"

namespace dtrain {
namespace rpc {

const char* HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "an unknown status";
}

absl::StatusOr<HealthStatus> CheckHealth(grpc::Channel* channel, absl::Duration timeout,
                                         const std::string& service) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // HealthCheckRequest {string service = 1;}: tag 0x0a, a one-byte length.
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back('\x0a');
    request_bytes.push_back(static_cast<char>(service.size()));
    request_bytes += service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                   grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel, method, &ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "grpc.health.v1.Health/Check");
  std::vector<grpc::Slice> slices;
  std::string reply;
  if (response.Valid() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& piece : slices) {
      reply.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
  }
  // HealthCheckResponse {ServingStatus status = 1;}: tag 0x08, a varint
  // (0..3); absent means UNKNOWN.
  if (reply.empty()) return HealthStatus::kUnknown;
  if (reply.size() == 2 && reply[0] == '\x08' && static_cast<unsigned char>(reply[1]) <= 3) {
    return static_cast<HealthStatus>(static_cast<unsigned char>(reply[1]));
  }
  return absl::InternalError(absl::StrCat("grpc.health.v1.Health/Check: a reply of ", reply.size(),
                                          " bytes that is not a HealthCheckResponse"));
}

bool HealthServing(grpc::Channel* channel, absl::Duration timeout) {
  absl::StatusOr<HealthStatus> s = CheckHealth(channel, timeout);
  return s.ok() && *s == HealthStatus::kServing;
}

}  // namespace rpc
}  // namespace dtrain

// A client of gRPC health checking (grpc.health.v1.Health/Check) and of
// server reflection's service list, written by hand: Debian's gRPC packages
// ship no generated code for grpc.health.v1 or grpc.reflection, so the
// request ({string service = 1;}) and the reply ({ServingStatus status =
// 1;}) are encoded here. Every server of ours answers it (libs/rpc/server.h:
// SERVING from Start until Shutdown begins).
//
//   absl::StatusOr<rpc::HealthStatus> h = rpc::CheckHealth(channel.get(), absl::Seconds(1));
//   if (h.ok() && *h == rpc::HealthStatus::kServing) ...
//   if (rpc::HealthServing(channel.get(), absl::Seconds(1))) ...
//
// Thread-safe (each call has its own context).
#ifndef DTRAIN_LIBS_RPC_HEALTH_CHECK_H_
#define DTRAIN_LIBS_RPC_HEALTH_CHECK_H_

#include <grpcpp/channel.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {
namespace rpc {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// "UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN".
const char* HealthStatusName(HealthStatus status);

// One Check of `service` ("": the whole server) over `channel`, with a
// deadline `timeout` from now. Returns the status the server reported (a
// reply without a status field is kUnknown), or the call's error with its
// gRPC code (message prefixed "grpc.health.v1.Health/Check: "), or
// kInternal for a reply that is not a HealthCheckResponse. REQUIRES:
// `service` shorter than 128 bytes.
absl::StatusOr<HealthStatus> CheckHealth(grpc::Channel* channel, absl::Duration timeout,
                                         const std::string& service = "");

// Whether CheckHealth of the whole server answers kServing within `timeout`.
bool HealthServing(grpc::Channel* channel, absl::Duration timeout);

// The services the server offers, as server reflection
// (grpc.reflection.v1alpha.ServerReflection, list_services) names them, in
// its order; the call's error with its gRPC code, or kInternal for a reply
// that is not a list of services.
absl::StatusOr<std::vector<std::string>> ListServices(grpc::Channel* channel,
                                                      absl::Duration timeout);

}  // namespace rpc
}  // namespace dtrain

#endif  // DTRAIN_LIBS_RPC_HEALTH_CHECK_H_

// The one place where absl::Status and grpc::Status meet.
//
// Libraries return absl::Status; gRPC servers in services/ convert at the
// RPC boundary with ToGrpcStatus, and clients convert replies back with
// FromGrpcStatus. Codes map one to one (both follow google.rpc.Code).
#ifndef DTRAIN_LIBS_BASE_GRPC_STATUS_H_
#define DTRAIN_LIBS_BASE_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dtrain {

grpc::Status ToGrpcStatus(const absl::Status& status);

// `rpc` (for example "Scheduler.SubmitJob"), when given, is prepended to the
// message so a user sees which call failed.
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view rpc = "");

}  // namespace dtrain

#endif  // DTRAIN_LIBS_BASE_GRPC_STATUS_H_

// Conversions between the kvstore's plain types (types.h) and their protos
// (protos/kvstore.proto, package dtrain.kvstore.v1), for the client and the
// gRPC service.
//
// FromProto functions validate what the network sent and return
// kInvalidArgument naming the field (an unknown enum value or dtype code);
// the semantic checks (ValidateJobConfig, ValidateSliceSpec) are the
// store's.
//
// Thread-safety: pure functions.
#ifndef DTRAIN_LIBS_KVSTORE_PROTO_CONVERT_H_
#define DTRAIN_LIBS_KVSTORE_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "libs/kvstore/types.h"
#include "protos/kvstore.pb.h"

namespace dtrain {
namespace kvstore {

v1::JobConfig ToProto(const JobConfig& config);
absl::StatusOr<JobConfig> FromProto(const v1::JobConfig& proto);

v1::SliceSpec ToProto(const SliceSpec& spec);
absl::StatusOr<SliceSpec> FromProto(const v1::SliceSpec& proto);

v1::Compression ToProto(Compression compression);
absl::StatusOr<Compression> FromProto(v1::Compression proto);
// A push's compression from its header (compression, topk_ratio):
// kInvalidArgument for an unknown method or a ratio ValidateCompression
// refuses.
absl::StatusOr<CompressionSpec> CompressionFromProto(v1::Compression method, double topk_ratio);

// A key's dtype as sent in a message: kInvalidArgument for an unknown code.
absl::StatusOr<DType> DTypeFromWire(int32_t code);

v1::GetJobResponse ToProto(const JobStatus& status);
absl::StatusOr<JobStatus> FromProto(const v1::GetJobResponse& proto);

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_PROTO_CONVERT_H_

#include "libs/rpc/health_check.h"

#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/client_context.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/base/grpc_status.h"

namespace dtrain {
namespace rpc {
namespace {

std::string Flatten(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (buffer.Valid() && buffer.Dump(&slices).ok()) {
    for (const grpc::Slice& piece : slices) {
      out.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
  }
  return out;
}

// The length-delimited fields numbered `number` of the message `bytes`;
// false if `bytes` is not a message.
bool Submessages(const std::string& bytes, int number, std::vector<std::string>* out) {
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) return false;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() != number) continue;
    if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) return false;
    out->push_back(f.length_delimited());
  }
  return true;
}

}  // namespace

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
  const std::string reply = Flatten(response);
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

absl::StatusOr<std::vector<std::string>> ListServices(grpc::Channel* channel,
                                                      absl::Duration timeout) {
  constexpr char kMethod[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::internal::RpcMethod method(kMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, method, &ctx));
  // ServerReflectionRequest {string list_services = 7;}, empty.
  grpc::Slice request(std::string("\x3a\x00", 2));
  grpc::ByteBuffer response;
  const bool sent = stream->Write(grpc::ByteBuffer(&request, 1));
  stream->WritesDone();
  const bool got = sent && stream->Read(&response);
  grpc::ByteBuffer rest;
  while (stream->Read(&rest)) {
  }
  grpc::Status s = stream->Finish();
  if (!s.ok()) return FromGrpcStatus(s, kMethod + 1);
  // ServerReflectionResponse {ListServiceResponse list_services_response = 6;},
  // ListServiceResponse {repeated ServiceResponse service = 1;},
  // ServiceResponse {string name = 1;}.
  std::vector<std::string> lists, services, names;
  if (!got || !Submessages(Flatten(response), 6, &lists) || lists.size() != 1 ||
      !Submessages(lists[0], 1, &services)) {
    return absl::InternalError(absl::StrCat(kMethod + 1, ": no list of services in the reply"));
  }
  for (const std::string& service : services) {
    std::vector<std::string> name;
    if (!Submessages(service, 1, &name) || name.size() != 1) {
      return absl::InternalError(absl::StrCat(kMethod + 1, ": a service without a name"));
    }
    names.push_back(name[0]);
  }
  return names;
}

}  // namespace rpc
}  // namespace dtrain

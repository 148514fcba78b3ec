// The model store's streams (protos/scheduler.proto ModelChunk): receiving
// a PutModel upload into the store and sending a stored file, for
// server.cc's handlers. Authorization is the handlers' business.
#ifndef DTRAIN_SERVICES_SCHEDULER_MODEL_RPC_H_
#define DTRAIN_SERVICES_SCHEDULER_MODEL_RPC_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include <string>

#include "absl/status/statusor.h"
#include "libs/scheduler/model_store.h"
#include "protos/scheduler.pb.h"

namespace dtrain {
namespace scheduler {

// Data bytes per ModelChunk sent (and what clients should send).
inline constexpr size_t kModelChunkBytes = 1 << 20;

// Reads the header chunk, then data chunks into an upload, and commits it
// when the stream ends (errors: ModelStore's; INVALID_ARGUMENT for a stream
// without a header). Returns as soon as a chunk is refused.
absl::StatusOr<v1::PutModelReply> ReceiveModel(ModelStore* store,
                                               grpc::ServerReaderInterface<v1::ModelChunk>* in);

// Sends the header (digest, size) and the file at `path` in
// kModelChunkBytes pieces.
absl::Status SendModel(const std::string& path, const std::string& digest,
                       grpc::ServerWriterInterface<v1::ModelChunk>* out);

}  // namespace scheduler
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_SCHEDULER_MODEL_RPC_H_

// The gRPC adapters of a kvstore shard over its request logic
// (libs/kvstore/shard.h): dtrain.kvstore.v1.KVStoreData (Push, Pull,
// PushPull and their unary forms, with raw byte buffers so that values are
// never copied by protobuf: libs/kvstore/wire.h), and the step every call
// of the shard's gRPC services takes (RunShardCall).
//
//   ShardHandler shard(...);
//   DataServiceOptions options;
//   options.callback = true;   // the unary forms on gRPC's callback API
//   DataService data(&shard, options);
//   server.AddService(&data);  // rpc::Server
//
// This layer only moves bytes: it decodes and reassembles chunked
// messages, cuts pulled values into reply messages (chunk_bytes each),
// and converts statuses (libs/base/grpc_status.h). A sync call blocks its
// server thread while its pull waits for a round; with `callback`, a unary
// pull waiting for its round holds no thread (the push that completes the
// round answers it; its deadline is an alarm).
//
// Thread-safety: the service is called by gRPC's threads; the shard
// outlives it.
#ifndef DTRAIN_SERVICES_KVSTORE_DATA_SERVICE_H_
#define DTRAIN_SERVICES_KVSTORE_DATA_SERVICE_H_

#include <grpcpp/impl/codegen/service_type.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/server_context.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libs/kvstore/shard.h"

namespace dtrain {
namespace kvstore {

// Every call of the shard's gRPC services: authorizes the caller of `ctx`
// (its certificate and kvstore token metadata) for `method`, sets its job
// scope, takes its place among its job's calls in flight, runs `handler`,
// counts it (ShardHandler::Account) and converts its status for gRPC.
grpc::Status RunShardCall(ShardHandler& shard, const char* method, const grpc::ServerContext* ctx,
                          const std::function<absl::Status()>& handler);

struct DataServiceOptions {
  // gRPC's limit per message: a unary reply of more value bytes (less 64
  // KiB of headers) is RESOURCE_EXHAUSTED, naming the streaming call.
  int64_t max_message_bytes = 4 << 20;
  // Value bytes per streamed reply message (capped at max_message_bytes / 2,
  // at least 1 KiB).
  int64_t chunk_bytes = 1 << 20;
  // The unary forms on gRPC's callback API (ServerOptions::callback_data);
  // only for an unreplicated shard (its continuations cannot wait for the
  // chain).
  bool callback = false;
};

// dtrain.kvstore.v1.KVStoreData, registered under the names the generated
// stubs use.
class DataService final : public grpc::Service {
 public:
  DataService(ShardHandler* shard, const DataServiceOptions& options);
  ~DataService() override;

  class Calls;  // the handlers

 private:
  template <typename Handler, typename Fn>
  void Add(const char* method, grpc::internal::RpcMethod::RpcType type, Fn fn);

  std::unique_ptr<Calls> calls_;
  std::vector<std::unique_ptr<std::string>> names_;  // RpcServiceMethod keeps the pointers
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_KVSTORE_DATA_SERVICE_H_

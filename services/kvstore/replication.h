// The gRPC side of a replicated kvstore shard (protos/replication.proto):
// the link to the successor, the Replica service, and the heartbeat that
// keeps the replica's shard map current. The protocol itself is
// libs/kvstore/replicator.h.
#ifndef DTRAIN_SERVICES_KVSTORE_REPLICATION_H_
#define DTRAIN_SERVICES_KVSTORE_REPLICATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/kvstore/replicator.h"
#include "protos/replication.grpc.pb.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace dtrain {
namespace kvstore {

// Sends batches over gRPC (Replica.Replicate), cut into chunk_bytes pieces.
class GrpcReplicaLink : public ReplicaLink {
 public:
  explicit GrpcReplicaLink(absl::Duration timeout, int64_t chunk_bytes = 1 << 20)
      : timeout_(timeout), chunk_bytes_(chunk_bytes) {}
  absl::StatusOr<v1::ReplicateReply> Replicate(
      const std::string& address, const std::string& batch,
      const std::vector<absl::string_view>& values) override;

 private:
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);

  const absl::Duration timeout_;
  const int64_t chunk_bytes_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// Sends batches over the successor's data port (a REPLICATE frame carrying
// the serialized batch; libs/kvstore/data_port.h), found through
// KVStore.DataPort: over its Unix socket (the batch in shared memory) when
// the successor runs on this host (same boot id) and, with TLS, gave this
// process its replica ticket (it does for kvstore identities); else over TCP
// with this process's credentials (mutual TLS); over gRPC (`fallback`) when
// the successor has no data port. A pool of connections per successor.
class DataPortReplicaLink : public ReplicaLink {
 public:
  // `spin`: how long a send polls for the acknowledgement before sleeping
  // (DataPortConnection::set_spin).
  DataPortReplicaLink(absl::Duration timeout, absl::Duration spin);
  ~DataPortReplicaLink() override;
  absl::StatusOr<v1::ReplicateReply> Replicate(
      const std::string& address, const std::string& batch,
      const std::vector<absl::string_view>& values) override;

  // Batches sent since start, by transport: "unix", "tls", "tcp" (REPLICATE
  // frames) and "grpc" (Replica.Replicate calls); every kind is present.
  std::map<std::string, int64_t> FramesSent() const;

 private:
  struct Peer;
  Peer* PeerOf(const std::string& address);
  void Count(const char* kind);

  const absl::Duration timeout_;
  const absl::Duration spin_;
  GrpcReplicaLink fallback_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex frames_mu_;
  std::map<std::string, int64_t> frames_ ABSL_GUARDED_BY(frames_mu_) = {
      {"unix", 0}, {"tls", 0}, {"tcp", 0}, {"grpc", 0}};
};

// dtrain.kvstore.v1.Replica over a Replicator.
class ReplicaService final : public v1::Replica::Service {
 public:
  // How a received batch is applied: Replicator::Receive, and whatever the
  // server does around it (the answers its pushes ask of this replica).
  using ReceiveFn =
      std::function<absl::StatusOr<v1::ReplicateReply>(v1::ReplicateBatch, absl::Time deadline)>;
  // batch_limit: the most bytes one Replicate call may bring.
  ReplicaService(Replicator* replicator, int64_t batch_limit, ReceiveFn receive = nullptr)
      : replicator_(replicator), batch_limit_(batch_limit), receive_(std::move(receive)) {}
  grpc::Status Replicate(grpc::ServerContext* ctx, grpc::ServerReader<v1::ReplicateChunk>* reader,
                         v1::ReplicateReply* reply) override;
  grpc::Status GetShardMap(grpc::ServerContext* ctx, const v1::GetShardMapRequest* request,
                           v1::ShardMap* map) override;

 private:
  Replicator* const replicator_;
  const int64_t batch_limit_;
  const ReceiveFn receive_;
};

struct MapHeartbeatOptions {
  std::string scheduler;  // host:port
  int shard = 0;
  int replica = 0;
  int num_shards = 1;
  std::string address;  // what peers and clients dial
  uint64_t incarnation = 0;
  absl::Duration interval = absl::Milliseconds(200);  // until the scheduler says otherwise
  absl::Duration timeout = absl::Seconds(1);
};

// Heartbeats to the scheduler (ClusterService.KvstoreHeartbeat) on a thread
// and hands every map it answers to the Replicator.
class MapHeartbeat {
 public:
  MapHeartbeat(Replicator* replicator, MapHeartbeatOptions options);
  ~MapHeartbeat();  // stops the thread
  MapHeartbeat(const MapHeartbeat&) = delete;
  MapHeartbeat& operator=(const MapHeartbeat&) = delete;

  int64_t failures() const;

 private:
  void Loop();

  Replicator* const replicator_;
  const MapHeartbeatOptions options_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_KVSTORE_REPLICATION_H_

#include "services/kvstore/server.h"

#include <grpcpp/server_context.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/kvstore/data_port.h"
#include "libs/kvstore/malloc_tuning.h"
#include "libs/kvstore/shard.h"
#include "libs/rpc/credentials.h"
#include "libs/rpc/server.h"
#include "protos/kvstore.grpc.pb.h"
#include "services/kvstore/data_service.h"
#include "services/kvstore/replication.h"

namespace dtrain {
namespace kvstore {

namespace {

// dtrain.kvstore.v1.KVStore
class ControlService final : public v1::KVStore::Service {
 public:
  explicit ControlService(ShardHandler* shard) : shard_(*shard) {}

  grpc::Status CreateJob(grpc::ServerContext* ctx, const v1::CreateJobRequest* request,
                         v1::CreateJobResponse* response) override {
    return RunShardCall(shard_, "CreateJob", ctx,
                        [&] { return shard_.CreateJob(*request, response); });
  }
  grpc::Status DeleteJob(grpc::ServerContext* ctx, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override {
    return RunShardCall(shard_, "DeleteJob", ctx,
                        [&] { return shard_.DeleteJob(*request, response); });
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override {
    return RunShardCall(shard_, "GetJob", ctx, [&] { return shard_.GetJob(*request, response); });
  }
  grpc::Status Init(grpc::ServerContext* ctx, grpc::ServerReader<v1::InitRequest>* reader,
                    v1::InitResponse* response) override {
    return RunShardCall(shard_, "Init", ctx, [&] {
      return shard_.Init([reader](v1::InitRequest* m) { return reader->Read(m); }, response);
    });
  }
  grpc::Status Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest*,
                        v1::SnapshotResponse* response) override {
    return RunShardCall(shard_, "Snapshot", ctx, [&] { return shard_.Snapshot(response); });
  }
  grpc::Status DataPort(grpc::ServerContext* ctx, const v1::DataPortRequest*,
                        v1::DataPortResponse* response) override {
    return RunShardCall(shard_, "DataPort", ctx,
                        [&] { return shard_.DataPort(rpc::PeerIdentity(*ctx), response); });
  }

 private:
  ShardHandler& shard_;
};

}  // namespace

// The services live as long as the gRPC server.
struct KVStoreServer::Services {
  std::unique_ptr<ControlService> control;
  std::unique_ptr<DataService> data;
  std::unique_ptr<ReplicaService> replica;
};

absl::StatusOr<std::unique_ptr<KVStoreServer>> KVStoreServer::Start(const ServerOptions& options) {
  if (options.shard_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_index must be >= 0, got ", options.shard_index));
  }
  if (options.max_message_bytes < (64 << 10) || options.max_message_bytes > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be 64 KiB to 1 GiB, got ", options.max_message_bytes));
  }
  if (options.quota_bytes_per_job < 0 || options.max_jobs < 0) {
    return absl::InvalidArgumentError("quota_bytes_per_job and max_jobs must be >= 0");
  }
  std::unique_ptr<KVStoreServer> server(new KVStoreServer());
  server->options_ = options;
  StoreOptions store_options;
  store_options.shard_index = options.shard_index;
  store_options.quota_bytes_per_job = options.quota_bytes_per_job;
  store_options.max_jobs = options.max_jobs;
  server->store_ = std::make_unique<Store>(store_options);
  if (!options.data_dir.empty()) {
    DT_ASSIGN_OR_RETURN(server->resumed_, LoadSnapshot(options.data_dir, server->store_.get()));
    if (server->resumed_) {
      DT_LOG(INFO) << "kvstore shard " << options.shard_index << " resumed from "
                   << SnapshotPath(options.data_dir, options.shard_index) << " ("
                   << server->store_->JobNames().size() << " jobs)";
    }
  }
  server->snapshotter_ = std::make_unique<Snapshotter>(server->store_.get(), options.data_dir,
                                                       options.snapshot_interval);
  uint64_t r_incarnation = 0;
  const DataPortReplicaLink* link = nullptr;  // its metrics
  if (!options.scheduler.empty()) {
    if (options.num_shards < 1 || options.shard_index >= options.num_shards ||
        options.replica_index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replication needs 0 <= shard_index < num_shards and replica_index >= 0, got shard ",
          options.shard_index, " of ", options.num_shards, ", replica ", options.replica_index));
    }
    // The chain's writes travel over the successor's data port (gRPC when it
    // has none).
    auto data_port_link =
        std::make_unique<DataPortReplicaLink>(options.replication_timeout, options.replica_spin);
    link = data_port_link.get();
    server->link_ = std::move(data_port_link);
    ReplicatorOptions r;
    r.ack_spin = options.replica_spin;
    r.round_hold = options.replica_round_hold;
    r.shard = options.shard_index;
    r.replica = options.replica_index;
    std::random_device random;
    r.incarnation = (static_cast<uint64_t>(random()) << 32) ^ random() ^ 1;
    r_incarnation = r.incarnation;
    server->replicator_ =
        std::make_unique<Replicator>(server->store_.get(), server->link_.get(), r);
  }
  ShardHandlerOptions s;
  s.job_token_secret = options.job_token_secret;
  s.shard_index = options.shard_index;
  s.quota_bytes_per_job = options.quota_bytes_per_job;
  s.max_calls_per_job = options.max_calls_per_job;
  s.max_pull_wait = options.max_pull_wait;
  s.replication_timeout = options.replication_timeout;
  s.replica_round_hold = options.replica_round_hold;
  server->shard_ = std::make_unique<ShardHandler>(
      s, server->store_.get(), server->snapshotter_.get(), server->replicator_.get());
  if (link != nullptr) server->shard_->set_frames_sent([link] { return link->FramesSent(); });
  server->services_ = std::make_unique<Services>();
  server->services_->control = std::make_unique<ControlService>(server->shard_.get());
  // A replicated shard answers a pull once the chain holds what it read; the
  // callback path's continuations run inside the store's push (under the
  // replicator), where that cannot be waited for: the sync path there.
  const bool callback_data = options.callback_data && server->replicator_ == nullptr;
  if (options.callback_data && !callback_data) {
    DT_LOG(WARNING) << "--callback_data is ignored on a replicated shard (--scheduler): its "
                       "pulls wait for the chain on the sync path";
  }
  DataServiceOptions data;
  data.max_message_bytes = options.max_message_bytes;
  data.chunk_bytes = options.chunk_bytes;
  data.callback = callback_data;
  server->services_->data = std::make_unique<DataService>(server->shard_.get(), data);

  rpc::ServerOptions rpc_options;
  rpc_options.service = "kvstore";
  rpc_options.listen = options.listen;
  rpc_options.port_file = options.port_file;
  rpc_options.metrics_listen = options.metrics_listen;
  rpc_options.max_message_bytes = options.max_message_bytes;
  // A sync server thread blocks while its pull waits for a round. With
  // gRPC's defaults (1 to 2 idle pollers) the pool then creates a thread
  // for the next call and ends one after every round; keeping a few more
  // idle threads avoids that churn (a thread start per push-pull).
  rpc_options.min_pollers = 2;
  rpc_options.max_pollers = 16;
  server->rpc_ = std::make_unique<rpc::Server>(rpc_options);
  server->rpc_->AddService(server->services_->control.get());
  server->rpc_->AddService(server->services_->data.get());
  if (server->replicator_ != nullptr) {
    // A state transfer carries the whole shard.
    server->services_->replica = std::make_unique<ReplicaService>(
        server->replicator_.get(), int64_t{16} << 30,
        [shard = server->shard_.get()](v1::ReplicateBatch batch, absl::Time deadline) {
          return shard->ReceiveBatch(std::move(batch), deadline, {});
        });
    server->rpc_->AddService(server->services_->replica.get());
  }
  server->rpc_->Expose(server->shard_->registry());
  server->rpc_->Expose(server->shard_->store_metrics());
  DT_RETURN_IF_ERROR(server->rpc_->Start());
  {
    DataPortServerOptions d;
    if (options.data_listen == "auto") {
      const size_t colon = options.listen.rfind(':');
      d.tcp_listen = absl::StrCat(
          colon == std::string::npos ? std::string("127.0.0.1") : options.listen.substr(0, colon),
          ":0");
    } else {
      d.tcp_listen = options.data_listen;
    }
    if (options.data_socket == "auto") {
      absl::StatusOr<std::string> path = DefaultDataSocketPath();
      if (path.ok()) {
        d.unix_socket = *path;
      } else {
        DT_LOG(WARNING) << "no data port socket: " << path.status();
      }
    } else {
      d.unix_socket = options.data_socket;
    }
    std::shared_ptr<const rpc::Credentials> credentials = rpc::DefaultCredentials();
    if (!credentials->insecure()) {
      d.tls.enabled = true;
      d.tls.ca_file = credentials->files().ca;
      d.tls.cert_file = credentials->files().cert;
      d.tls.key_file = credentials->files().key;
    }
    d.max_connections = options.data_max_connections;
    d.max_connections_per_job = options.data_max_connections_per_job;
    d.replicate_spin = options.replica_spin;
    if (!d.tcp_listen.empty() || !d.unix_socket.empty()) {
      DT_ASSIGN_OR_RETURN(server->data_port_, DataPortServer::Start(d, server->shard_.get()));
      server->shard_->set_data_port(server->data_port_.get());
      DT_LOG(INFO) << "kvstore shard " << options.shard_index << " data port: tcp port "
                   << server->data_port_->tcp_port() << (d.tls.enabled ? " (TLS)" : " (plain)")
                   << ", socket " << (d.unix_socket.empty() ? "none" : d.unix_socket);
    }
  }
  if (server->replicator_ != nullptr) {
    MapHeartbeatOptions h;
    h.scheduler = options.scheduler;
    h.shard = options.shard_index;
    h.replica = options.replica_index;
    h.num_shards = options.num_shards;
    h.address = options.advertise.empty() ? server->local_address() : options.advertise;
    h.incarnation = r_incarnation;
    server->heartbeat_ = std::make_unique<MapHeartbeat>(server->replicator_.get(), h);
    DT_LOG(INFO) << "kvstore shard " << options.shard_index << " replica " << options.replica_index
                 << " at " << h.address << " follows the shard map of " << options.scheduler;
  }
  if (options.job_ttl > absl::ZeroDuration()) {
    const absl::Duration every = std::min(options.job_ttl / 4, absl::Minutes(1));
    KVStoreServer* s = server.get();
    server->reaper_ = std::thread([s, every] { s->Reap(every); });
  }
  return server;
}

void KVStoreServer::Reap(absl::Duration every) {
  while (!reaper_stop_.WaitForNotificationWithTimeout(every)) {
    const std::vector<std::string> dropped = store_->DropIdleJobs(absl::Now() - options_.job_ttl);
    for (const std::string& job : dropped) {
      DT_LOG(INFO) << "expired job '" << job << "': no call named it for " << options_.job_ttl;
    }
    if (!dropped.empty()) ReleaseFreeMemory();
    if (!dropped.empty() && !options_.data_dir.empty()) {
      // The dropped jobs leave the snapshot now, not at the next interval.
      absl::StatusOr<bool> wrote = snapshotter_->SnapshotIfChanged();
      if (!wrote.ok()) DT_LOG(ERROR) << "snapshot after expiring jobs failed: " << wrote.status();
    }
  }
}

KVStoreServer::~KVStoreServer() {
  absl::Status s = Shutdown(absl::ZeroDuration());
  if (!s.ok()) DT_LOG(ERROR) << "kvstore shutdown: " << s;
}

absl::Status KVStoreServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  reaper_stop_.Notify();
  if (reaper_.joinable()) reaper_.join();
  heartbeat_.reset();
  // Calls in flight finish (or are cancelled) before the final snapshot.
  // Writes still waiting for the chain when the grace period ends (a
  // successor that died with no map change coming: the heartbeat has
  // stopped) are failed, so that their handlers return.
  std::thread stopper;
  absl::Notification rpc_done;
  if (replicator_ != nullptr) {
    stopper = std::thread([this, grace, &rpc_done] {
      if (!rpc_done.WaitForNotificationWithTimeout(grace + absl::Milliseconds(100))) {
        replicator_->Stop();
      }
    });
  }
  if (rpc_) rpc_->Shutdown(grace);
  rpc_done.Notify();
  if (stopper.joinable()) stopper.join();
  if (replicator_ != nullptr) replicator_->Stop();
  if (data_port_) {
    shard_->set_data_port(nullptr);
    data_port_->Shutdown();
  }
  absl::Status status;
  if (snapshotter_) {
    snapshotter_->Stop();
    if (!options_.data_dir.empty()) {
      absl::StatusOr<SnapshotInfo> info = snapshotter_->SnapshotNow();
      if (info.ok()) {
        DT_LOG(INFO) << "final snapshot " << info->path << " (" << info->slices << " slices, "
                     << info->bytes << " bytes)";
      } else {
        status = info.status();
      }
    }
  }
  return status;
}

int KVStoreServer::port() const { return rpc_ ? rpc_->port() : 0; }

int KVStoreServer::metrics_port() const { return rpc_ ? rpc_->metrics_port() : 0; }

int KVStoreServer::data_port() const { return data_port_ ? data_port_->tcp_port() : 0; }

std::string KVStoreServer::data_socket() const {
  return data_port_ ? data_port_->unix_socket() : "";
}

std::string KVStoreServer::data_port_instance() const {
  return data_port_ ? data_port_->instance() : "";
}

std::string KVStoreServer::local_address() const { return absl::StrCat("127.0.0.1:", port()); }

}  // namespace kvstore
}  // namespace dtrain

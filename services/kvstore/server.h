// KVStoreServer: one kvstore shard as a gRPC server (protos/kvstore.proto).
//
//   ServerOptions options;
//   options.listen = "127.0.0.1:0";
//   options.data_dir = "/var/lib/kvstore";
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<KVStoreServer> server, KVStoreServer::Start(options));
//   DT_LOG(INFO) << "listening on port " << server->port();
//   ...
//   DT_RETURN_IF_ERROR(server->Shutdown(absl::Seconds(10)));   // final snapshot
//
// The server is thin: the store (libs/kvstore/store.h) holds the state and
// the rules, the shard handler (libs/kvstore/shard.h) every request's
// logic (authorization, push, pull, replication, accounting) for gRPC and
// the data port alike; the gRPC adapters (data_service.h and the control
// service here) reassemble chunked streams, convert messages, and map
// absl::Status to grpc::Status (libs/base/grpc_status.h). It serves, on
// one port:
//   dtrain.kvstore.v1.KVStore      jobs, Init, GetJob, Snapshot
//   dtrain.kvstore.v1.KVStoreData  Push, Pull, PushPull and their unary forms
//                                  (values zero-copy, libs/kvstore/wire.h)
// and, through the server scaffold (libs/rpc/server.h), dtrain.admin.Admin
// (Ping), grpc.health.v1.Health (SERVING until shutdown starts),
// grpc.reflection, the port file, and, when metrics_listen is set,
// Prometheus metrics over HTTP: the scaffold's dtrain_rpc_server_* and
//   dtrain_kvstore_requests_total{method,code}
//   dtrain_kvstore_request_duration_seconds{method}     (histogram)
//   dtrain_kvstore_push_bytes_total, dtrain_kvstore_pull_bytes_total
//                                     value bytes received / sent
//   dtrain_kvstore_duplicate_pushes_total   retried pushes not applied again
//   dtrain_kvstore_rounds_completed_total{job}
//   dtrain_kvstore_keys{job}, dtrain_kvstore_slices{job},
//   dtrain_kvstore_held_bytes{job}, dtrain_kvstore_quota_bytes
//   dtrain_kvstore_snapshots_total
//
// Replicated (ServerOptions.scheduler set): also dtrain.kvstore.v1.Replica,
// and the metrics
//   dtrain_kvstore_replica_map_version, dtrain_kvstore_replica_role{role}
//   dtrain_kvstore_replica_forwarded_total, ..._received_total,
//   ..._transfers_total, ..._transfer_bytes_total, ..._send_failures_total
//   dtrain_kvstore_tail_answers_total{result}   push-pulls answered here as the
//                                  tail (v1::AnswerAt): ok, or refused
//
// Jobs no call named for job_ttl are dropped (logged "expired job").
// Dropping a job (DeleteJob, the last LeaveJob, expiry) gives the freed
// memory back to the OS (ReleaseFreeMemory, malloc_tuning.h), so resident
// memory follows the jobs held.
//
// The data port (ServerOptions.data_listen, data_socket) serves Push, Pull
// and PushPull outside gRPC, a thread per connection; its requests count in
// dtrain_kvstore_requests_total and the duration histogram under the same
// method names, and
//   dtrain_kvstore_data_port_connections{kind}   open now (tcp, tls, unix)
//
// Calls block a gRPC server thread while a pull waits for its round
// (except with callback_data, see ServerOptions); the wait ends at the call's deadline, at
// max_pull_wait, or when the call is cancelled (also by Shutdown).
//
// Thread-safety: Start, Shutdown and the destructor are called by the
// owner; the accessors are thread-safe.
#ifndef DTRAIN_SERVICES_KVSTORE_SERVER_H_
#define DTRAIN_SERVICES_KVSTORE_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/kvstore/replicator.h"
#include "libs/kvstore/shard.h"
#include "libs/kvstore/snapshot.h"
#include "libs/kvstore/store.h"

namespace dtrain {
namespace rpc {
class Server;
}  // namespace rpc

namespace kvstore {

struct ServerOptions {
  // The cluster secret (hex; libs/security/job_token.h); non-empty: a
  // trainer's calls must carry a kvstore token for the job they name
  // (Assignment.kvstore_token), else PERMISSION_DENIED.
  std::string job_token_secret;
  // gRPC address, e.g. "0.0.0.0:7070"; port 0 picks a free one.
  std::string listen = "127.0.0.1:0";
  // Where snapshots live; empty: no snapshots. A snapshot found here at
  // Start is loaded (a damaged one fails Start).
  std::string data_dir;
  int shard_index = 0;
  // Where Start writes the bound gRPC port once serving; empty: nowhere.
  std::string port_file;
  // Prometheus endpoint ("127.0.0.1:0", ":9100"); empty: none.
  std::string metrics_listen;
  // Periodic snapshots (when the store changed); <= 0: only on request and
  // at shutdown.
  absl::Duration snapshot_interval = absl::Seconds(60);
  int64_t quota_bytes_per_job = 0;
  // Jobs held at once (StoreOptions::max_jobs); 0: no limit.
  int max_jobs = 0;
  // Calls of one job (a caller whose kvstore token names it) served at
  // once on the gRPC server, a held pull included, or JobLimiter::kPerWorker
  // per trainer its token names if more; more are refused with
  // RESOURCE_EXHAUSTED, so one job's calls cannot take every thread
  // (rpc::ServerOptions::max_threads, 256). 0: no cap.
  int max_calls_per_job = 128;
  // gRPC send and receive limit per message.
  int64_t max_message_bytes = 4 << 20;
  // Value bytes per reply message (capped at max_message_bytes / 2).
  int64_t chunk_bytes = 1 << 20;
  // Longest a pull waits for its round when the call has a later deadline
  // (or none).
  absl::Duration max_pull_wait = absl::Minutes(10);
  // A job no call has named for this long is an orphan (its workers died
  // without deleting it) and is dropped, from memory, metrics and the next
  // snapshot; checked every job_ttl / 4 (at most every minute). Keep it well
  // above max_pull_wait. <= 0: jobs never expire.
  absl::Duration job_ttl = absl::Hours(1);

  // The unary data calls (PushUnary, PullUnary, PushPullUnary: the small
  // pushes and pulls) on gRPC's callback API: no hand-off to a sync server
  // thread, and a pull waiting for its round holds no thread (the push that
  // completes the round answers it). Off by default.
  bool callback_data = false;  // ignored on a replicated shard (see Start)

  // The data port (libs/kvstore/data_port.h): Push, Pull and PushPull
  // outside gRPC, which clients find through KVStore.DataPort and use by
  // default. data_listen: its TCP address (mutual TLS with the process's
  // credentials, plain only when they are insecure); "auto": the host of
  // `listen`, any free port; "": none. data_socket: its Unix socket (shared
  // memory, for clients on this host); "auto": DefaultDataSocketPath(); "":
  // none. Both run the same checks, store operations and metrics as the
  // gRPC data calls.
  std::string data_listen = "auto";
  std::string data_socket = "auto";
  int data_max_connections = 256;
  // Of those, one job's (DataPortServerOptions::max_connections_per_job).
  int data_max_connections_per_job = 128;
  // How long a replica's threads poll before sleeping where a reply or the
  // next frame usually comes within microseconds (the successor's
  // acknowledgement, the predecessor's next batch, the chain's
  // acknowledgement of a read): each saves a thread wakeup (tens of
  // microseconds on a virtual machine) at the cost of that much CPU. Zero
  // (the default): sleep at once. Small push-pulls are answered by the tail
  // (v1::AnswerAt), so these waits are off their path, and on a host with
  // no spare core the polling takes the CPU the tail and the trainers need
  // (libs/kvstore/README.md, "Answers from the tail").
  absl::Duration replica_spin = absl::ZeroDuration();
  // Replicated: how long a PushPull's push that completes no round
  // waits for the round's last push to go down the chain with it (one batch
  // per round; ReplicatorOptions::round_hold). 0: every push goes alone.
  absl::Duration replica_round_hold = absl::Milliseconds(2);

  // Chain replication (protos/replication.proto). With a scheduler address,
  // this server is replica `replica_index` of shard `shard_index` (of
  // `num_shards`): it heartbeats to the scheduler, follows its shard map,
  // takes writes only as its chain's head and reads only as an ACTIVE
  // member, and forwards every write to its successor. Empty: an
  // unreplicated shard that takes every call.
  std::string scheduler;
  int replica_index = 0;
  int num_shards = 1;
  // host:port that peers and clients dial; empty: 127.0.0.1:<bound port>.
  std::string advertise;
  // How long a write waits for the chain to acknowledge it, and a batch for
  // the successor to take it.
  absl::Duration replication_timeout = absl::Seconds(30);
};

class MapHeartbeat;
class DataPortServer;

class KVStoreServer {
 public:
  // Loads the snapshot (if any), starts the gRPC server, the snapshotter
  // and the metrics endpoint, and writes the port file. Errors:
  // kInvalidArgument for bad options, kUnavailable when an address cannot
  // be bound, the snapshot's and the port file's errors.
  static absl::StatusOr<std::unique_ptr<KVStoreServer>> Start(const ServerOptions& options);

  // Shuts down (with no grace) if Shutdown was not called.
  ~KVStoreServer();
  KVStoreServer(const KVStoreServer&) = delete;
  KVStoreServer& operator=(const KVStoreServer&) = delete;

  // Marks the server NOT_SERVING, stops accepting calls, lets calls in
  // flight finish for up to `grace` (then cancels them), stops periodic
  // snapshots and writes a final one. Returns the snapshot's error, if any.
  // Later calls do nothing.
  absl::Status Shutdown(absl::Duration grace);

  int port() const;
  // 0 without a metrics endpoint.
  int metrics_port() const;
  // "127.0.0.1:<port>", for clients in tests.
  std::string local_address() const;
  // The data port's TCP port (0: none) and Unix socket ("": none).
  int data_port() const;
  std::string data_socket() const;
  // The data port's random id (DataPortServer::instance()); "" without one.
  std::string data_port_instance() const;
  // True if Start resumed from a snapshot.
  bool resumed() const { return resumed_; }

  Store& store() { return *store_; }
  // Null for an unreplicated shard.
  Replicator* replicator() { return replicator_.get(); }
  // Null without a data port.
  DataPortServer* data_port_server() { return data_port_.get(); }
  Snapshotter& snapshotter() { return *snapshotter_; }
  // The request logic behind both transports.
  ShardHandler& shard() { return *shard_; }

 private:
  KVStoreServer() = default;
  // Drops expired jobs every `every` until reaper_stop_.
  void Reap(absl::Duration every);

  ServerOptions options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Snapshotter> snapshotter_;
  std::unique_ptr<ReplicaLink> link_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<ShardHandler> shard_;
  struct Services;
  std::unique_ptr<Services> services_;  // outlives rpc_
  std::unique_ptr<rpc::Server> rpc_;
  std::unique_ptr<DataPortServer> data_port_;  // after shard_, its handler
  std::unique_ptr<MapHeartbeat> heartbeat_;    // after rpc_: peers dial us once it runs
  bool resumed_ = false;
  bool shut_down_ = false;
  absl::Notification reaper_stop_;
  std::thread reaper_;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_KVSTORE_SERVER_H_

// RemoteParameterServer: a worker's ParameterServer (parameter_server.h)
// over a sharded kvstore of servers (protos/kvstore.proto); its in-process
// counterpart is InProcessParameterServer (in_process.h).
//
//   ClientOptions options;
//   options.servers = {"10.0.0.1:7000", "10.0.0.2:7000"};   // shard i at servers[i]
//   options.job = "resnet";
//   options.worker = rank;
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<RemoteParameterServer> kv,
//   RemoteParameterServer::Connect(options)); DT_RETURN_IF_ERROR(kv->CreateJob(config)); // every
//   worker may call it DT_RETURN_IF_ERROR(kv->Init({{"fc.weight", {10, 512}, DType::kF32,
//   weights}}));
//
//   // Training step: push each bucket as soon as its gradients are ready...
//   Work bucket = kv->PushAsync({{"fc.weight", grad}, {"fc.bias", grad_b}});
//   ... backward continues ...
//   DT_RETURN_IF_ERROR(bucket.Wait());
//   // ...then pull the new weights into the model's buffers.
//   DT_RETURN_IF_ERROR(kv->Pull({{"fc.weight", weights}, {"fc.bias", bias}}));
//
// Placement (placement.h) is computed from the job name and server list: a
// job's small keys live together on its home shard, mid-sized ones spread
// over the shards by name, large keys are sliced over all of them. An operation on a set
// of keys sends one batched, chunked stream per shard, all shards in
// parallel.
//
// Rounds. The client counts, per key, the rounds it has pushed: each push
// of a key is the next round, and a pull (or push-pull) asks for the round
// this worker pushed last, so under SYNC consistency it returns the result of
// that round once every worker has pushed it. Operations on the same key run
// in the order they were issued (a pull waits for the preceding push of its
// key to be acknowledged). Pushes and pulls that fail with DEADLINE_EXCEEDED
// or ABORTED are retried (max_attempts), as are the idempotent control calls
// (CreateJob, Init, GetJob, Snapshot); the shard applies a retried push at
// most once. After a shard restarted from a snapshot, Resync() reloads the
// rounds from the shards.
//
// Failure detection. Calls do not wait for a connection (no gRPC
// wait_for_ready): a call to a shard that is down fails at once with
// UNAVAILABLE (connection refused or reset), and is retried with backoff
// until unavailable_timeout has passed since its first UNAVAILABLE, then the
// operation fails with that error. So a dead shard fails the operation
// within about unavailable_timeout (5 s), not rpc_timeout or pull_timeout,
// while a shard that restarts within it is waited for. A pull that waits on
// a live shard for a round another worker can never complete (that worker's
// push failed) is ended by Cancel(), which the trainer's agent calls when
// the scheduler stops the attempt. Not covered: a shard whose host vanishes
// without closing connections; its calls end at their deadlines.
//
// Replicated shards (replicas > 1). The client follows the shard map the
// replicas serve (Replica.GetShardMap; the scheduler owns it): writes
// (CreateJob, Init, Push, DeleteJob, LeaveJob) go to each chain's head, reads
// (Pull, GetJob) to its tail; a push-pull goes to the head, which answers it
// once every replica holds the values it returns (one round trip). A call that fails with
// UNAVAILABLE (a replica died, or is no longer what the map said) makes the client refresh its map
// from the replicas and retry, within unavailable_timeout: failover takes the scheduler's heartbeat
// timeout plus a refresh. A retried push is a duplicate wherever the chain had applied it, so
// nothing is applied twice.
//
// Buffers. Push sources and pull destinations are the caller's memory,
// holding the whole key in its dtype (row-major). Pushes send it without
// copying, so a source must stay valid and unchanged until the operation's
// Work is done; a destination is written until then.
//
// Errors are the shards' Status (see store.h), prefixed with the RPC and the
// server ("KVStoreData.Push to 127.0.0.1:7001: ...", "DataPort.PushPull to
// 127.0.0.1:7001 (unix): ..." over the data port), or kInvalidArgument /
// kNotFound from the client for an unknown key or a missing buffer.
//
// Data path (ClientOptions.data_path): by default pushes and pulls go over
// each shard's data port, not gRPC: a pool of connections per server
// address, an operation taking an idle one and running on the calling
// thread (one shard's part inline), the values written straight from the
// caller's buffers (writev; or one copy into the shared-memory segment) and
// read straight into them. The rounds, retries, failover, replicated
// routing, Cancel and compression are the same on every path; a shard without
// a data port is served over gRPC.
//
// Performance (gRPC path): requests and replies that fit in one message go as unary
// calls, larger ones stream in chunk_bytes messages. A process moving large
// values should call TuneMallocForBulkTransfers() (malloc_tuning.h) at start.
//
// Thread-safety: a RemoteParameterServer is thread-safe; operations may be issued from
// several threads. Destroying it waits for operations in flight.
#ifndef DTRAIN_LIBS_KVSTORE_CLIENT_H_
#define DTRAIN_LIBS_KVSTORE_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/kvstore/placement.h"
#include "libs/kvstore/push_encoder.h"
#include "libs/kvstore/types.h"
#include "libs/kvstore/worker_keys.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace dtrain {
namespace kvstore {
namespace v1 {
class DeleteJobRequest;
class ShardMap;
}  // namespace v1

class ElasticThreadPool;
class DataPortConnection;

// How pushes and pulls travel (control calls always use gRPC):
//   kAuto: the shard's data port (libs/kvstore/data_port.h), over its Unix
//          socket and shared memory when the shard runs on this host (same
//          boot id, a socket this uid can connect to), else over TCP (mutual
//          TLS); gRPC when the shard has no data port (or refuses more
//          connections).
//   kTcp:  the data port over TCP only, else gRPC.
//   kGrpc: KVStoreData over gRPC only.
enum class DataPath { kAuto, kTcp, kGrpc };
const char* DataPathName(DataPath path);  // "auto", "tcp", "grpc"
// InvalidArgument naming the accepted names.
absl::StatusOr<DataPath> ParseDataPath(absl::string_view name);

struct ClientOptions {
  // "host:port" of every shard; shard i must run with --shard_index=i.
  // With replicas > 1: every replica, shard-major (shard i replica j at
  // servers[i * replicas + j]), the seeds of the shard map (see
  // "Replicated shards").
  std::vector<std::string> servers;
  // Replicas per shard (chain replication, protos/replication.proto).
  int replicas = 1;
  std::string job;
  int worker = 0;
  // The job's kvstore capability (libs/security/job_token.h), sent with
  // every call; "" sends none (shards without a cluster secret).
  std::string token;
  // Encoding of pushed values (f16/bf16 halve push traffic, top-k sends a
  // fraction of it; see Compression); SetPushCompression changes it later.
  CompressionSpec compression;
  PlacementOptions placement;
  // Value bytes per message. 1 MiB keeps messages far below the default
  // 4 MiB limit while amortizing per-message costs.
  int64_t chunk_bytes = 1 << 20;
  // gRPC message-size limit for sending and receiving; the shards'
  // --max_message_bytes must be at least chunk_bytes plus headers too.
  int64_t max_message_bytes = 4 << 20;
  // Deadline of control calls and pushes, per attempt.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Deadline of pulls and push-pulls, which wait for rounds, per attempt.
  absl::Duration pull_timeout = absl::Minutes(5);
  // Attempts of an operation that fails with a transient error
  // (IsTransient, libs/base/retry.h), and the first wait between them (it
  // doubles per attempt, with jitter).
  int max_attempts = 3;
  absl::Duration retry_backoff = absl::Milliseconds(50);
  // How long a shard may stay unreachable (UNAVAILABLE) before an operation
  // on it fails (see "Failure detection"). Not counted in max_attempts.
  absl::Duration unavailable_timeout = absl::Seconds(5);
  // See DataPath.
  DataPath data_path = DataPath::kAuto;
  // On the data port, how long a call polls for its reply before its
  // thread sleeps: a reply that comes within it skips the wakeup of a
  // sleeping thread (tens of microseconds on a virtual machine), at the
  // cost of that much CPU per call. Off by default: a call that fans out
  // to several shards waits on several server threads, and on a host with
  // fewer spare cores than that the spinning delays them (measured in
  // libs/kvstore/README.md).
  absl::Duration reply_spin = absl::ZeroDuration();
  // With replicas, a data port PushPull of up to 64 KiB gets its values
  // from the chain's tail, on a connection kept there for answers
  // (v1::AnswerAt), instead of from the head once the tail acknowledged:
  // one hop less per round (chain replication's reply from the tail).
  bool answer_at_tail = true;
};

class RemoteParameterServer : public ParameterServerBase {
 public:
  // Validates the options and opens a channel per server (connections are
  // made lazily). kInvalidArgument for no servers, a bad worker id or chunk
  // size.
  static absl::StatusOr<std::unique_ptr<RemoteParameterServer>> Connect(ClientOptions options);
  ~RemoteParameterServer();
  RemoteParameterServer(const RemoteParameterServer&) = delete;
  RemoteParameterServer& operator=(const RemoteParameterServer&) = delete;

  const ClientOptions& options() const { return options_; }
  const std::string& job() const override { return options_.job; }
  int worker() const override { return options_.worker; }

  // Creates the job on every shard (idempotent; see KVStore.CreateJob).
  // config.job must equal options().job.
  absl::Status CreateJob(const JobConfig& config) override;
  // Drops the job on every shard (the error of the first shard that failed;
  // the others are still asked). Not affected by Cancel. Each attempt's
  // deadline is min(rpc_timeout, unavailable_timeout): cleanup of a lost
  // shard is left to its job TTL rather than holding the caller.
  absl::Status DeleteJob() override;
  // This worker is done with the job; each shard drops it once every worker
  // left (see ParameterServer::LeaveJob). Not affected by Cancel.
  absl::Status LeaveJob() override;

  // Cancels this client's operations in flight (their gRPC calls end at
  // once) and makes later ones fail at once, all with kCancelled carrying
  // `reason`; DeleteJob and LeaveJob still work. Irreversible.
  void Cancel(const std::string& reason) override;

  // Pushes issued from now on encode values as `compression`.
  absl::Status SetPushCompression(const CompressionSpec& compression) override;

  // Places the keys and creates their slices on the shards (idempotent: a
  // key that exists with the same spec keeps its value). Every worker calls
  // Init for the keys it uses; it is also how a client learns placement.
  absl::Status Init(const std::vector<KeySpec>& keys) override;

  // Push, Pull and PushPull (ParameterServerBase): a push is this worker's
  // next round of each key; a pull copies values into the caller's buffers
  // (see Rounds above); a push-pull is one round trip per shard. The
  // blocking forms send every shard's request from the calling thread.

  // Sets this client's round counters to what the shards report for this
  // worker (after a shard restarted from a snapshot, or a worker restarted).
  absl::Status Resync();
  // Resync, then the lowest round this worker pushed of any key it Init'ed.
  absl::StatusOr<int64_t> ResumeRounds() override;

  // The job's state on shard `server`.
  absl::StatusOr<JobStatus> GetJob(int server, bool include_slices);

  // Asks every shard to write a snapshot now; returns the files.
  absl::StatusOr<std::vector<std::string>> Snapshot();

  // The round this worker last pushed for `key` (the lowest over its
  // slices), or kNotFound for a key not Init'ed by this client.
  absl::StatusOr<int64_t> PushedRound(const std::string& key) const;

  // Where `key`'s slices live, or kNotFound.
  absl::StatusOr<std::vector<PlacedSlice>> Placement(const std::string& key) const;

 private:
  using Key = WorkerKeys::Key;
  using SliceOp = WorkerKeys::SliceOp;
  class TrackedCall;  // a call Cancel can end
  using Op = CallKind;

  explicit RemoteParameterServer(ClientOptions options);
  // Adds options_.token to the call's metadata.
  void AddToken(grpc::ClientContext* ctx) const;
  // Checks a call's items, numbers its pushed rounds, orders it after the
  // keys' previous calls and starts it.
  Work Issue(Op op, std::vector<CallItem> items, bool run_one_inline) override;
  // Resync; the lowest round this worker pushed of any key (ResumeRounds).
  absl::StatusOr<int64_t> ResyncRounds();
  // Runs `work` grouped by server (one task each, in parallel) after `deps`
  // finished; with run_one_inline one task runs on the calling thread.
  Work Start(Op op, std::vector<SliceOp> work, std::vector<std::shared_ptr<Work::State>> deps,
             std::shared_ptr<Work::State> state, bool run_one_inline);
  absl::Status RunOnServer(Op op, int server, const std::vector<SliceOp>& work,
                           const std::shared_ptr<Work::State>& state);
  absl::Status PushOnce(int server, const std::vector<SliceOp>& work, bool pull_back,
                        const std::shared_ptr<Work::State>& state);
  absl::Status PullOnce(int server, const std::vector<SliceOp>& work);
  // The data port: an idle (or new) connection to the shard at `address`
  // (reached over `channel` for discovery), or null for gRPC.
  struct DataPool;
  // With `answers`, an answers connection (DataHello.answers), from its
  // own pool.
  absl::StatusOr<std::unique_ptr<DataPortConnection>> TakeDataConn(
      const std::string& address, const std::shared_ptr<grpc::Channel>& channel,
      bool answers = false);
  void ReturnDataConn(const std::string& address, std::unique_ptr<DataPortConnection> conn,
                      bool answers = false);
  struct Endpoint;
  struct PendingData;
  // `tail`: for a PushPull at a chain's head, the tail that may answer it
  // (ClientOptions.answer_at_tail); null: the head answers.
  absl::StatusOr<std::unique_ptr<PendingData>> StartDataCall(
      const std::string& address, const std::shared_ptr<grpc::Channel>& channel, Op op,
      const std::vector<SliceOp>& work, const Endpoint* tail = nullptr);
  absl::Status FinishDataCall(std::unique_ptr<PendingData> pending,
                              const std::vector<SliceOp>& work);
  // The reply's pulled values (a PullResponse header `reply` read from
  // `conn`) into `work`'s destinations.
  absl::Status ReadPulled(PendingData& pending, DataPortConnection& conn, const std::string& reply,
                          const std::vector<SliceOp>& work);
  absl::Status DataPortCall(const std::string& address,
                            const std::shared_ptr<grpc::Channel>& channel, Op op,
                            const std::vector<SliceOp>& work, bool* used,
                            const Endpoint* tail = nullptr);
  // Runs `attempt` until it succeeds, fails with a non-transient error,
  // max_attempts failed with DEADLINE_EXCEEDED or ABORTED, UNAVAILABLE
  // lasted unavailable_timeout, or (when `cancellable`) Cancel was called.
  absl::Status WithRetries(const std::function<absl::Status()>& attempt, bool cancellable = true);
  // OK, or the status Cancel set.
  absl::Status CancelStatus() const;
  // Deadline per attempt of DeleteJob and LeaveJob.
  absl::Duration CleanupTimeout() const;
  // Sends `request` (a DeleteJob, or a LeaveJob with leave set) to every
  // shard within CleanupTimeout; `what` names the call in errors.
  absl::Status SendDeleteJob(const v1::DeleteJobRequest& request, absl::string_view what);
  // Runs fn(i) for every shard in parallel; returns the first error.
  absl::Status ForEachServer(const std::function<absl::Status(int)>& fn);

  // Where a call to `shard` goes: the shard's server, or (replicated) its
  // chain's head for writes and tail for reads.
  struct Endpoint {
    std::shared_ptr<grpc::Channel> channel;
    std::string address;
  };
  absl::StatusOr<Endpoint> Route(int shard, bool write);
  // For a PushPull at `head`, the chain's tail that answers it
  // (ClientOptions.answer_at_tail), or nullopt (unreplicated, head and
  // tail the same, or the option off).
  absl::optional<Endpoint> AnswerTail(int shard, const Endpoint& head);
  // Replicated: fetches the newest shard map the replicas serve.
  void RefreshMap();
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(map_mu_);

  const ClientOptions options_;
  PushEncoder encoder_;  // of pushes, from options_.compression
  int num_shards_ = 0;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;  // by server (unreplicated)
  // Replicated: the map followed, and a channel per replica address.
  absl::Mutex map_mu_;
  std::unique_ptr<v1::ShardMap> map_ ABSL_GUARDED_BY(map_mu_);
  bool map_stale_ ABSL_GUARDED_BY(map_mu_) = true;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> by_address_
      ABSL_GUARDED_BY(map_mu_);
  absl::Mutex refresh_mu_;  // one refresh at a time
  std::unique_ptr<ElasticThreadPool> pool_;
  WorkerKeys keys_{"this client"};
  mutable absl::Mutex calls_mu_;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(calls_mu_);
  absl::flat_hash_set<DataPortConnection*> data_calls_ ABSL_GUARDED_BY(calls_mu_);
  absl::Mutex data_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<DataPool>> data_pools_ ABSL_GUARDED_BY(data_mu_);
  absl::Status cancelled_ ABSL_GUARDED_BY(calls_mu_);
};

// The name RemoteParameterServer had before (as InProcessParameterServer's
// counterpart), kept for callers outside libs/kvstore until they move.
using KVClient = RemoteParameterServer;

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_CLIENT_H_

// ShardHandler: one kvstore shard's request logic, with no transport.
//
// Every request a shard takes, whether it came as a gRPC call
// (services/kvstore/server.cc) or a data port frame (data_port.h), goes
// through the same steps here: authorize the caller (libs/security/authz.h
// and the job's kvstore token), take its place among its job's calls,
// check it against the chain (writes at the head, reads at an ACTIVE
// member), prepare and apply a push (through the Replicator when
// replicated), pull, receive the predecessor's batches, and account for it
// in the shard's metrics. Like ps-lite's KVServer request handle: the
// transports only move bytes.
//
//   ShardHandler handler(options, &store, &snapshotter, replicator);
//   // gRPC adapter, per call:
//   DT_ASSIGN_OR_RETURN(auto grant, handler.Authorize(who, "Pull", token));
//   security::JobScope scope(grant.has_value() ? &grant->job : nullptr);
//   DT_ASSIGN_OR_RETURN(JobLimiter::Hold place, handler.CallPlace(grant));
//   DT_ASSIGN_OR_RETURN(std::vector<PulledValue> values, handler.Pull(request, pull_options));
//   handler.Account("Pull", start, status);
//   // the data port: DataPortServer::Start(options, &handler)
//
// The gRPC adapter decodes messages (wire.h) and assembles chunks itself;
// what reaches this class is protobuf headers and value pieces. A push is
// prepared (PreparePush: checked against the store before any value is
// read), its values attached, then applied (ApplyPush).
//
// Metrics (registry(), store_metrics(); names in services/kvstore/server.h):
// requests by method and code, their latency, bytes pushed and pulled,
// duplicates, answers at the tail, and the store's, data port's and chain's
// gauges and counters.
//
// Thread-safety: every method is thread-safe; set_data_port and
// set_frames_sent are called before serving (set_data_port(nullptr) at
// shutdown too). Store, snapshotter and replicator outlive the handler.
#ifndef DTRAIN_LIBS_KVSTORE_SHARD_H_
#define DTRAIN_LIBS_KVSTORE_SHARD_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "libs/kvstore/data_port.h"
#include "libs/kvstore/job_limiter.h"
#include "libs/kvstore/replicator.h"
#include "libs/kvstore/snapshot.h"
#include "libs/kvstore/store.h"
#include "libs/metrics/metrics.h"
#include "libs/security/identity.h"
#include "libs/security/job_token.h"
#include "protos/kvstore.pb.h"

namespace dtrain {
namespace kvstore {

struct ShardHandlerOptions {
  // The cluster secret (ServerOptions::job_token_secret); empty: no tokens.
  std::string job_token_secret;
  int shard_index = 0;
  int64_t quota_bytes_per_job = 0;  // for its metric
  // A job's calls in flight (ServerOptions::max_calls_per_job); 0: no cap.
  int max_calls_per_job = 128;
  // Longest a pull waits for its round.
  absl::Duration max_pull_wait = absl::Minutes(10);
  // How long a write waits for the chain.
  absl::Duration replication_timeout = absl::Seconds(30);
  // ReplicatorOptions::round_hold.
  absl::Duration replica_round_hold = absl::Milliseconds(2);
};

struct ParkedPull;

// The header of a pull's reply, whatever carries it: each value's index,
// round, dtype and byte size, in order (the values travel as the payload).
v1::PullResponse PullReplyHeader(const std::vector<PulledValue>& values);

class ShardHandler : public DataPortHandler {
 public:
  using Clock = std::chrono::steady_clock;
  using Grant = absl::optional<security::JobGrant>;

  // `replicator` null: an unreplicated shard that takes every call.
  ShardHandler(const ShardHandlerOptions& options, Store* store, Snapshotter* snapshotter,
               Replicator* replicator);
  ~ShardHandler() override;

  // ---- Every request ----

  // `who` may call `method` (libs/security/authz.h: KvstoreAction). With a
  // cluster secret, a trainer must present a kvstore token (`token`, null
  // when none was sent): then what it grants (the job its calls are
  // confined to, security::JobScope); nullopt: unconfined.
  absl::StatusOr<Grant> Authorize(const security::Identity& who, const char* method,
                                  const std::string* token) const;
  // A call's place among its job's calls in flight: a trainer's calls count
  // against its job's cap, unconfined ones hold none.
  absl::StatusOr<JobLimiter::Hold> CallPlace(const Grant& grant);
  // Counts a finished call (either transport) under `method`, one of the
  // KVStore and KVStoreData method names.
  void Account(const char* method, Clock::time_point start, const absl::Status& status);

  // ---- KVStore (control) ----

  absl::Status CreateJob(const v1::CreateJobRequest& request, v1::CreateJobResponse* response);
  absl::Status DeleteJob(const v1::DeleteJobRequest& request, v1::DeleteJobResponse* response);
  absl::Status GetJob(const v1::GetJobRequest& request, v1::GetJobResponse* response);
  // `read` gives the request stream's next message (false at its end).
  absl::Status Init(const std::function<bool(v1::InitRequest*)>& read, v1::InitResponse* response);
  absl::Status Snapshot(v1::SnapshotResponse* response);
  // Where the data port is; the replica ticket only for a caller (`who`,
  // the call's identity when known) allowed to replicate.
  absl::Status DataPort(const absl::StatusOr<security::Identity>& who,
                        v1::DataPortResponse* response) const;

  // ---- Pushes and pulls ----

  // Writes go through the chain's head, reads need an ACTIVE member
  // (always OK unreplicated). Every push and pull checks them; an adapter
  // may check first, before it reads the request.
  absl::Status CheckWrites() const;
  absl::Status CheckReads() const;

  // A push as received: its header, and the store's view of it.
  struct IncomingPush {
    v1::PushRequest header;
    CompressionSpec compression;
    std::vector<PushItem> items;  // data: the caller's pieces, set after PreparePush
    int64_t bytes = 0;
  };

  // The checks of a push before any value is read: writes allowed here,
  // the job within the caller's scope, the items (into p->items) and their
  // expected value bytes (`sizes`: what the values must add up to).
  absl::Status PreparePush(IncomingPush* p, std::vector<std::pair<std::string, int64_t>>* sizes);
  // Counts value bytes received (push) and sent (pull) by an adapter.
  void CountPushBytes(int64_t bytes);
  void CountPullBytes(int64_t bytes);

  // Applies a push (through the chain when replicated). With `ack`, does
  // not wait for the chain: the caller waits (ReadCommitted covers it)
  // before answering. With `by_reference` (and `ack`), a push whose items
  // are one piece each reaches the chain without a copy: the caller keeps
  // the pieces valid until it called Replicator::Detach(*ack). With
  // `hold_incomplete` (a PushPull), a push that completes no round reaches
  // the chain with the push that completes it (Replicator::Apply).
  absl::StatusOr<PushResult> ApplyPush(const IncomingPush& p, Replicator::Ack* ack = nullptr,
                                       bool by_reference = false, bool hold_incomplete = false);
  // A PushPull's pull, after its push: the values of the pushed items'
  // rounds once complete and on every replica.
  absl::StatusOr<std::vector<PulledValue>> PullPushed(const IncomingPush& p,
                                                      const PullOptions& options);
  // The checks of a pull (reads allowed here, the job in scope) and its items.
  absl::StatusOr<std::vector<PullRequestItem>> PreparePull(const v1::PullRequest& request) const;
  // A pull: PreparePull, the store's pull, ReadCommitted.
  absl::StatusOr<std::vector<PulledValue>> Pull(const v1::PullRequest& request,
                                                const PullOptions& options);
  // Before values read here are answered: at a chain's head, waits until
  // every replica holds every write applied here so far. Unreplicated: at
  // once. Gives up after replication_timeout.
  absl::Status ReadCommitted() const;
  // A pull's deadline given the caller's (InfiniteFuture: none): at most
  // max_pull_wait from now.
  absl::Time PullDeadline(absl::Time caller_deadline) const;

  // A batch from the predecessor (data port or gRPC): applied, then the
  // answers its pushes (and the rounds they completed) owe clients here.
  absl::StatusOr<v1::ReplicateReply> ReceiveBatch(v1::ReplicateBatch batch, absl::Time deadline,
                                                  const std::vector<absl::string_view>& values);

  // ---- The data port (DataPortHandler) ----

  absl::StatusOr<Grant> Hello(const security::Identity& who, const v1::DataHello& hello,
                              DataConn::Kind kind) override;
  absl::Status Handle(const DataRequest& request, DataReply* reply) override;

  void set_data_port(DataPortServer* data_port) { data_port_.store(data_port); }
  // Batches sent to the successor by transport (DataPortReplicaLink), for
  // dtrain_kvstore_replicate_frames_total; unset: no such metric.
  void set_frames_sent(std::function<std::map<std::string, int64_t>()> frames_sent) {
    frames_sent_ = std::move(frames_sent);
  }

  Store& store() { return *store_; }
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  std::shared_ptr<metrics::CallbackCollectable> store_metrics() const { return store_metrics_; }

 private:
  absl::StatusOr<MutationResult> Replicate(v1::Mutation m);

  // The data port's requests (Handle); `*parked`: the reply was deferred.
  absl::Status HandleData(const DataRequest& request, DataReply* reply, bool* parked);
  absl::Status HandlePush(const DataRequest& request, const PullOptions& pull, DataReply* reply,
                          bool* parked);
  absl::Status HandleReplicate(const DataRequest& request, DataReply* reply);
  absl::Status CheckAnswerAt(const DataRequest& request, uint64_t payload_bytes) const;
  absl::Status PulledReply(const std::vector<PulledValue>& values, DataReply* reply);
  // Parked pulls (a data port PushPull waiting for its round without a
  // thread) and answers at the tail (v1::AnswerAt).
  void ParkPull(const DataRequest& request, const IncomingPush& p, const Replicator::Ack& ack,
                absl::Time deadline);
  void Arm(const std::shared_ptr<ParkedPull>& p);
  void Progress(const std::shared_ptr<ParkedPull>& p);
  void TryAnswer(const std::shared_ptr<ParkedPull>& p, bool expired);
  std::vector<std::shared_ptr<ParkedPull>> TailAnswers(const v1::ReplicateBatch& batch);
  void WaitForAnswerAt(DataResponder* r, const IncomingPush& p, const Replicator::Ack& ack,
                       absl::Time deadline);
  std::vector<prometheus::MetricFamily> Collect() const;

  const ShardHandlerOptions options_;
  JobLimiter calls_per_job_;
  Store* const store_;
  Snapshotter* const snapshotter_;
  Replicator* const replicator_;  // null: unreplicated
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Counter& push_bytes_;
  prometheus::Counter& pull_bytes_;
  prometheus::Counter& duplicates_;
  prometheus::Family<prometheus::Counter>& tail_answers_;
  prometheus::Counter& tail_answered_;
  prometheus::Counter& tail_refused_;
  std::shared_ptr<metrics::CallbackCollectable> store_metrics_;
  struct MethodMetrics {
    prometheus::Counter* ok = nullptr;
    prometheus::Histogram* latency = nullptr;
  };
  std::map<std::string, MethodMetrics> methods_;  // filled by the constructor, then read-only
  std::atomic<DataPortServer*> data_port_{nullptr};
  std::function<std::map<std::string, int64_t>()> frames_sent_;
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_SHARD_H_

// InProcessKVStore: a kvstore whose shards are Stores (store.h) in this
// process, and InProcessParameterServer, a worker's ParameterServer over it.
// The same contract as the gRPC client (client.h) with no network: for
// library tests and single-process tools.
//
//   InProcessOptions options;
//   options.num_shards = 2;
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<InProcessKVStore> kvstore,
//                       InProcessKVStore::Create(options));
//   // One ParameterServer per worker (each typically used by its own thread):
//   DT_ASSIGN_OR_RETURN(std::unique_ptr<InProcessParameterServer> ps,
//                       kvstore->Connect("resnet", rank));
//   DT_RETURN_IF_ERROR(ps->CreateJob(config));
//   DT_RETURN_IF_ERROR(ps->Init({{"fc.weight", {10, 512}, DType::kF32, weights}}));
//   Work bucket = ps->PushPullAsync({{"fc.weight", grad, weights}});
//
// What it shares with RemoteParameterServer, so that code tested against one runs
// against the other (parameter_server_contract.h checks both):
//   - placement: keys are placed on the shards by PlaceKey (placement.h),
//     large keys sliced over all of them;
//   - rounds: each push of a key is this worker's next round; a pull or
//     push-pull of kLastPushedRound asks for the round it pushed last;
//   - order: operations on the same key run in the order they were issued;
//   - asynchrony: an ...Async call returns at once; its work runs on this
//     worker's threads (one task per shard touched), so a pull waiting for
//     other workers blocks neither the caller nor other workers;
//   - buffers: sources are read and destinations written until the
//     operation's Work is done;
//   - errors: the Stores' statuses (store.h: kNotFound, kAlreadyExists,
//     kOutOfRange...), kNotFound for a key this worker did not Init,
//     kInvalidArgument for a missing buffer or a key twice in one call,
//     kDeadlineExceeded for a pull that waited longer than pull_timeout.
// Push compression (SetPushCompression) encodes values as the gRPC client
// does, so its effect on training shows in process too.
// What it lacks: retries (nothing is transient here), and the
// client's Resync/Snapshot (a test reaches the Stores through shard();
// ResumeRounds reads a worker's rounds from them).
//
// Lifetime: the Stores live while the InProcessKVStore or any of its
// ParameterServers does, in any order of destruction.
//
// Thread-safety: all methods are thread-safe.
#ifndef DTRAIN_LIBS_KVSTORE_IN_PROCESS_H_
#define DTRAIN_LIBS_KVSTORE_IN_PROCESS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/kvstore/placement.h"
#include "libs/kvstore/push_encoder.h"
#include "libs/kvstore/store.h"
#include "libs/kvstore/types.h"
#include "libs/kvstore/worker_keys.h"

namespace dtrain {
namespace kvstore {

class ElasticThreadPool;
class InProcessParameterServer;

struct InProcessOptions {
  // Stores the keys are placed on (like a RemoteParameterServer's server list).
  int num_shards = 1;
  // Options of every Store; shard_index is set to the shard's index.
  StoreOptions store;
  PlacementOptions placement;
  // Longest a pull waits for its round (RemoteParameterServer: pull_timeout).
  absl::Duration pull_timeout = absl::Minutes(5);
};

class InProcessKVStore {
 public:
  // kInvalidArgument for num_shards < 1 or a pull_timeout that is not
  // positive.
  static absl::StatusOr<std::unique_ptr<InProcessKVStore>> Create(InProcessOptions options);
  ~InProcessKVStore();
  InProcessKVStore(const InProcessKVStore&) = delete;
  InProcessKVStore& operator=(const InProcessKVStore&) = delete;

  // A ParameterServer for `worker` of `job` (which need not exist yet).
  // kInvalidArgument for a bad job name or worker id.
  absl::StatusOr<std::unique_ptr<InProcessParameterServer>> Connect(const std::string& job,
                                                                    int worker);

  int num_shards() const;
  // Shard `index` (0 <= index < num_shards()): its jobs and rounds
  // (Store::GetJob), its state (Store::Export).
  Store& shard(int index);

  // The Stores and options, shared with every ParameterServer.
  struct Shards;

 private:
  explicit InProcessKVStore(std::shared_ptr<Shards> shards);

  std::shared_ptr<Shards> shards_;
};

class InProcessParameterServer : public ParameterServerBase {
 public:
  // Waits for the operations in flight.
  ~InProcessParameterServer() override;
  InProcessParameterServer(const InProcessParameterServer&) = delete;
  InProcessParameterServer& operator=(const InProcessParameterServer&) = delete;

  const std::string& job() const override { return job_; }
  int worker() const override { return worker_; }

  // On every shard. config.job must equal job().
  absl::Status CreateJob(const JobConfig& config) override;
  absl::Status DeleteJob() override;
  absl::Status LeaveJob() override;
  // A waiting pull notices within a few milliseconds.
  void Cancel(const std::string& reason) override;
  absl::Status SetPushCompression(const CompressionSpec& compression) override;
  absl::Status Init(const std::vector<KeySpec>& keys) override;

  // Push, Pull and PushPull (ParameterServerBase): the blocking forms run
  // one shard's part on the calling thread.

  // The round this worker last pushed for `key` (the lowest over its
  // slices), or kNotFound for a key it did not Init.
  absl::StatusOr<int64_t> PushedRound(const std::string& key) const;
  // Reads this worker's rounds from the shards (see ParameterServer).
  absl::StatusOr<int64_t> ResumeRounds() override;

 private:
  friend class InProcessKVStore;
  using Key = WorkerKeys::Key;
  using SliceOp = WorkerKeys::SliceOp;
  using Op = CallKind;

  InProcessParameterServer(std::shared_ptr<InProcessKVStore::Shards> shards, std::string job,
                           int worker);
  // Checks an operation's keys and buffers, numbers its rounds and runs it
  // (one task per shard) after the operations before it on the same keys.
  Work Issue(Op op, std::vector<CallItem> requests, bool run_one_inline) override;
  // Runs `work` (one shard's part of an operation) against the Store.
  absl::Status RunOnShard(Op op, int shard, const std::vector<SliceOp>& work);

  const std::shared_ptr<InProcessKVStore::Shards> shards_;
  const std::string job_;
  const int worker_;
  WorkerKeys keys_;
  mutable absl::Mutex mu_;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> is_cancelled_{false};
  PushEncoder encoder_;
  std::unique_ptr<ElasticThreadPool> pool_;  // last: destroyed (joined) first
};

}  // namespace kvstore
}  // namespace dtrain

#endif  // DTRAIN_LIBS_KVSTORE_IN_PROCESS_H_

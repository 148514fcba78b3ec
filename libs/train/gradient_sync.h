// How the trainers of a data-parallel job meet, in two parts (PyTorch DDP's
// communication hooks, widened to the whole step, and torchft's Manager,
// which owns how a job survives a lost member):
//
//  - a SyncStrategy is one way of meeting, stateless and registered once:
//    which options select it, the GradientSync it makes, and how a job that
//    uses it lives through a lost trainer (whether its survivors regroup in
//    place, how a replacement joins, whether a lost peer shows as an error or
//    as a stall). The trainer daemon's plan (libs/agent/job_plan.h) names one
//    for a job; libs/train/job.cc and libs/agent ask it instead of branching
//    on the transports.
//  - a GradientSync is the hook a strategy makes for one trainer, built with
//    its state (communicator, kvstore client). The bucket reducer
//    (reducer.h) sums a ready bucket over this trainer's replicas into a flat
//    buffer; the hook decides what happens to it and to the weights.
//
//   strategy (libs/train/sync/)  selected when (DataParallelOptions)
//   "local"                      no communicator, no kvstore (one trainer)
//   "allreduce"                  a communicator with a host transport (or CPU
//                                replicas): average the host buffer
//   "nccl_allreduce"             one CUDA replica and a kNccl communicator:
//                                average the device buffer
//   "kvstore_sync"               kvstore, kSync: a synchronous round per
//                                bucket ("grad/bucket<b>")
//   "kvstore_weights"            kvstore, kAsync or kBoundedDelay: the server
//                                holds the weights ("param/bucket<b>")
//
// A hook also shares the initial weights (broadcast, kvstore Init), pulls
// the latest weights, tells how many trainers share a step, combines
// per-trainer statistics (the epoch's loss and accuracy sums; a drain's
// meeting) and makes the hook of a regrouped membership.
//
// Adding a sync mode: one new file under libs/train/sync/ that implements
// GradientSync and a SyncStrategy and registers the strategy with
// DT_REGISTER_SYNC_STRATEGY; libs/train/BUILD compiles sync/*.cc into the
// data_parallel library. ChooseSyncStrategy is the one place a strategy is
// chosen from the transports: exactly one registered strategy must select
// the options.
//
// Thread-safety: strategies are immutable (any thread). Start,
// PullLatestWeights, AverageStatistics, Regroup and ResumeRounds run on the
// thread that drives the trainer, between steps; ReduceBucket on the
// communication worker (one bucket at a time, in bucket order);
// UpdateReplica(r) on replica r's worker after every ReduceBucket of the
// step, concurrently for different replicas.
#ifndef DTRAIN_LIBS_TRAIN_GRADIENT_SYNC_H_
#define DTRAIN_LIBS_TRAIN_GRADIENT_SYNC_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/nn/sync_batch_norm.h"
#include "libs/train/data_parallel.h"
#include "libs/train/reducer.h"

namespace dtrain {
namespace train {

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // The registered name.
  virtual const char* name() const = 0;
  // Where the reducer assembles a ready bucket for ReduceBucket.
  virtual Reducer::BufferPlace bucket_place() const { return Reducer::BufferPlace::kHost; }
  // Trainers whose gradients are averaged in a step (each replica's share of
  // the job's loss is its slice weight over this).
  virtual int trainers() const { return 1; }
  // Synchronized batch norm across trainers: gathers the statistics of every
  // trainer (null: this trainer's replicas only). With one, buckets are
  // reduced only after every replica's backward.
  virtual nn::SyncBatchNormGroup::CrossGather BatchNormGather() { return nullptr; }
  // Replicas apply a local optimizer step to the gradients ReduceBucket
  // leaves (true), or UpdateReplica sets their weights (false).
  virtual bool optimizer_steps_locally() const { return true; }

  // Once, before the first step, with the replicas' parameters in `reducer`
  // (not owned; outlives this). Makes replica 0's weights the job's initial
  // weights (the trainer then copies them to its other replicas).
  absl::Status Start(Reducer* reducer) {
    reducer_ = reducer;
    return ShareInitialWeights();
  }
  // Instead of Start, for a strategy that replaces another one mid-job
  // (DataParallelTrainer::Regroup): the replicas already hold the weights.
  void Attach(Reducer* reducer) { reducer_ = reducer; }

  // Bucket b is ready: `flat` holds this trainer's weighted sum of its
  // replicas' gradients (buckets()[b].numel floats, where bucket_place()
  // says). With optimizer_steps_locally(), returns with `flat` holding the
  // gradient every replica applies (the reducer copies it back).
  virtual absl::Status ReduceBucket(int b, float* flat) = 0;
  // On replica r's worker (its stream current), after every ReduceBucket of
  // the step, when !optimizer_steps_locally(): sets replica r's weights.
  virtual absl::Status UpdateReplica(int r);
  // Copies the job's current weights into every replica where the trainer's
  // steps may leave others (kvstore-held weights); a no-op by default.
  virtual absl::Status PullLatestWeights() { return absl::OkStatus(); }
  // `sums` (n host floats) are this trainer's sums (a loss sum, a sample
  // count, ...). Afterwards their ratios are over every trainer's samples:
  // each becomes its sum or its mean over the trainers (allreduce, a
  // synchronous kvstore round); strategies with no common round (one
  // trainer, kvstore-held weights) leave this trainer's.
  virtual absl::Status AverageStatistics(float* sums, int n) { return absl::OkStatus(); }
  // Whether every step also sums its statistics over the step's trainers
  // (ReduceStepStatistics): then every trainer holds the whole job's running
  // statistics of the epoch, and a recovery in place carries them exactly
  // (a lost trainer's share is in the survivors' sums).
  virtual bool reduces_step_statistics() const { return false; }
  // In each step, on the communication worker after the step's buckets and
  // every replica's backward, before any replica's update (a failure fails
  // the step, which then updates nothing): `sums` (n host doubles, this
  // trainer's) become their sums over the step's trainers, added in rank
  // order (every trainer gets the same bits). Unimplemented unless
  // reduces_step_statistics().
  virtual absl::Status ReduceStepStatistics(double* sums, int n);
  // Recovery in place (DataParallelTrainer::Regroup), after the replicas'
  // engine was reset: the hook of the new membership, attached to the same
  // reducer, for `next` (this trainer's options with the membership's
  // transports: `communicator` for the gradients, `kvstore` its kvstore
  // job, `kvstore_workers` its size). Null: this hook carries on.
  // By default the communicator's hook (a joiner's "local" hook becomes
  // "allreduce"); Unimplemented for strategies whose trainers do not
  // regroup.
  virtual absl::StatusOr<std::unique_ptr<GradientSync>> Regroup(const DataParallelOptions& next);
  // A replacement of a lost trainer continues its rounds
  // (SyncStrategy::replacement_continues_rounds): the rounds the lost worker
  // had completed. FailedPrecondition for the other strategies.
  virtual absl::StatusOr<int64_t> ResumeRounds();

 protected:
  virtual absl::Status ShareInitialWeights() { return absl::OkStatus(); }
  Reducer* reducer() const { return reducer_; }

 private:
  Reducer* reducer_ = nullptr;
};

// One way trainers meet (see the file comment): registered once, never
// destroyed; its methods are pure.
class SyncStrategy {
 public:
  virtual ~SyncStrategy() = default;

  // The registered name: "local", "allreduce", ...
  virtual const char* name() const = 0;
  // True for the options this strategy serves.
  virtual bool Selects(const DataParallelOptions& options) const = 0;
  // Checks the options (InvalidArgument naming what is wrong) and makes this
  // trainer's hook; no I/O (GradientSync::Start does that).
  virtual absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      const DataParallelOptions& options) const = 0;

  // The transports a trainer connects for it: a collective::Communicator
  // that carries the gradients (and the initial broadcast), ...
  virtual bool uses_communicator() const { return false; }
  // ... which is a device one (NCCL): the state of a regroup then travels
  // over a host communicator of the same membership (exchange), ...
  virtual bool uses_device_communicator() const { return false; }
  // ... or a kvstore client (one worker per trainer) of the parameter server.
  virtual bool uses_kvstore() const { return false; }

  // Recovery in place (libs/train/job.h). Whether the survivors of a lost
  // trainer regroup: the new membership exchanges the root's state over a
  // host communicator and carries on (`world`: the trainers before the loss).
  virtual bool RegroupsInPlace(int world) const { return false; }
  // A survivor learns of a lost peer only when its agent interrupts it
  // (cancels the kvstore client, aborts the NCCL communicator) as the
  // scheduler offers the next membership: until then its step stalls. Its
  // heartbeats then say a peer is lost once a step stalls, and the recovery
  // counts from the stalled step's start.
  virtual bool loss_is_silent() const { return false; }
  // Whether `failure` of a collective (a step's, an epoch's statistics
  // round) may be a lost peer's, worth a regroup (a silent loss's: unless
  // the job was asked to stop). By default a transient error (IsTransient).
  virtual bool MayBePeerLoss(const absl::Status& failure) const;
  // A replacement continues the lost trainer's kvstore rounds (the kvstore
  // holds the weights; DataParallelTrainer::ResumeKvstoreWorker) instead of
  // receiving the survivors' state: the survivors never stop, and the
  // rounds count from where the attempt started.
  virtual bool replacement_continues_rounds() const { return false; }
  // Whether a step may wait for a lost peer without failing (a round or
  // collective that waits for its push), with `consistency` (the job's
  // DataParallelOptions::kvstore_consistency): the agent then watches how
  // long steps take. By default loss_is_silent().
  virtual bool StepMayStall(kvstore::Consistency consistency) const { return loss_is_silent(); }
};

// Adds a strategy (at static initialization; see DT_REGISTER_SYNC_STRATEGY;
// never freed). Dies on a duplicate name. Returns true.
bool RegisterSyncStrategy(const SyncStrategy* strategy);
// The registered names, sorted.
std::vector<std::string> GradientSyncNames();
// The strategy registered as `name`; null if none is.
const SyncStrategy* FindSyncStrategy(absl::string_view name);
// The one registered strategy that selects `options` (Internal if several
// do, InvalidArgument if none does).
absl::StatusOr<const SyncStrategy*> ChooseSyncStrategy(const DataParallelOptions& options);
// The hook for `options`: ChooseSyncStrategy's, as it makes it.
absl::StatusOr<std::unique_ptr<GradientSync>> CreateGradientSync(
    const DataParallelOptions& options);

// For the kvstore strategies: sets this trainer's push compression
// (options.kvstore_compression) on `ps` and creates, idempotently, the
// kvstore job MakeKvstoreJobConfig(ps->job(), options) describes.
absl::Status CreateKvstoreJob(kvstore::ParameterServer* ps, const DataParallelOptions& options);

}  // namespace train
}  // namespace dtrain

#define DT_SYNC_STRATEGY_CONCAT_INNER_(a, b) a##b
#define DT_SYNC_STRATEGY_CONCAT_(a, b) DT_SYNC_STRATEGY_CONCAT_INNER_(a, b)

// In a strategy's .cc file, at namespace scope, with its SyncStrategy class:
//   DT_REGISTER_SYNC_STRATEGY(MyStrategy);
#define DT_REGISTER_SYNC_STRATEGY(Class)                                                      \
  [[maybe_unused]] static const bool DT_SYNC_STRATEGY_CONCAT_(_dt_sync_strategy_, __LINE__) = \
      ::dtrain::train::RegisterSyncStrategy(new Class())

#endif  // DTRAIN_LIBS_TRAIN_GRADIENT_SYNC_H_

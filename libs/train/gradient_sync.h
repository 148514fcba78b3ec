// GradientSync: how the trainers of a data-parallel job meet (PyTorch DDP's
// communication hooks, widened to the whole step). The bucket reducer
// (reducer.h) sums a ready bucket over this trainer's replicas into a flat
// buffer; the strategy decides what happens to it and to the weights:
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
// A strategy also shares the initial weights (broadcast, kvstore Init),
// pulls the latest weights, tells how many trainers share a step, and
// combines per-trainer statistics (the epoch's loss and accuracy sums).
//
// Adding a sync mode: one new file under libs/train/sync/ that implements
// GradientSync and registers it with DT_REGISTER_GRADIENT_SYNC (a name, the
// predicate over DataParallelOptions that selects it, a factory that checks
// the options); libs/train/BUILD compiles sync/*.cc into the data_parallel
// library. CreateGradientSync is the one place a strategy is chosen: exactly
// one registered predicate must accept the options.
//
// Thread-safety: Start, PullLatestWeights and AverageStatistics run on the
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

 protected:
  virtual absl::Status ShareInitialWeights() { return absl::OkStatus(); }
  Reducer* reducer() const { return reducer_; }

 private:
  Reducer* reducer_ = nullptr;
};

struct GradientSyncRegistration {
  std::string name;
  // True for the options this strategy serves.
  std::function<bool(const DataParallelOptions&)> selects;
  // Checks the options (InvalidArgument naming what is wrong) and makes the
  // strategy; no I/O (Start does that).
  std::function<absl::StatusOr<std::unique_ptr<GradientSync>>(const DataParallelOptions&)> create;
};

// Adds a strategy (at static initialization; see DT_REGISTER_GRADIENT_SYNC).
// Dies on a duplicate name. Returns true.
bool RegisterGradientSync(GradientSyncRegistration registration);
// The registered names, sorted.
std::vector<std::string> GradientSyncNames();
// The strategy for `options`: the one registered strategy that selects them
// (Internal if several do, InvalidArgument if none does), as its factory
// makes it.
absl::StatusOr<std::unique_ptr<GradientSync>> CreateGradientSync(
    const DataParallelOptions& options);

}  // namespace train
}  // namespace dtrain

#define DT_GRADIENT_SYNC_CONCAT_INNER_(a, b) a##b
#define DT_GRADIENT_SYNC_CONCAT_(a, b) DT_GRADIENT_SYNC_CONCAT_INNER_(a, b)

// In a strategy's .cc file, at namespace scope:
//   DT_REGISTER_GRADIENT_SYNC("name", SelectsFn, CreateFn);
#define DT_REGISTER_GRADIENT_SYNC(name, selects, create)                                      \
  [[maybe_unused]] static const bool DT_GRADIENT_SYNC_CONCAT_(_dt_gradient_sync_, __LINE__) = \
      ::dtrain::train::RegisterGradientSync(                                                  \
          ::dtrain::train::GradientSyncRegistration{name, selects, create})

#endif  // DTRAIN_LIBS_TRAIN_GRADIENT_SYNC_H_

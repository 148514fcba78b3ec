// Data-parallel training over the devices of one trainer and, optionally,
// across trainers: the multi-GPU sections of the chapter, with gradient
// communication overlapped with backward as PyTorch DDP and Horovod do.
//
// Three parts (PyTorch's DistributedDataParallel, Reducer and communication
// hooks):
//  - DataParallelTrainer (this file) is the orchestration: the replicas,
//    their engine queues and the step;
//  - the bucket reducer (reducer.h) owns the buckets, the autograd gradient
//    hooks and readiness, and the per-device weighted sum into one flat
//    buffer per bucket;
//  - a GradientSync strategy (gradient_sync.h, one file each under sync/)
//    decides what happens to a summed bucket across trainers (nothing, an
//    allreduce, a kvstore round), how the initial weights are shared, and
//    how a step ends (local SGD, or the kvstore's weights). Create picks it
//    from the options: "local" (no communicator, no kvstore), "allreduce"
//    (a communicator), "nccl_allreduce" (one CUDA device and an NCCL
//    communicator), "kvstore_sync" or "kvstore_weights" (see
//    kvstore_consistency below).
//
// Each step:
//  1. The global minibatch is split across the trainer's K devices (rows in
//     proportion; sizes may differ by one).
//  2. Every replica runs forward and backward on its slice, each on its own
//     worker queue of the dependency engine.
//  3. Parameters are grouped into buckets in reverse registration order
//     (roughly the order backward produces their gradients). As soon as a
//     bucket's gradients are final on every replica, the communication
//     queue sums them within the trainer (weighted by slice size, so the
//     result is the gradient of the mean loss over the global batch), hands
//     the bucket to the strategy (which averages it across trainers), and
//     writes the result back to every replica while the rest of backward
//     still runs.
//  4. Every replica applies the same SGD update, so replicas stay identical.
//     (Or, with an asynchronous kvstore, the parameter server applies SGD to
//     each pushed bucket and every replica copies back the pulled weights;
//     see DataParallelOptions::kvstore_consistency.)
//
// Batch norm keeps per-device statistics (each replica normalizes over its
// own slice, as the chapter's implementation does), or, with
// DataParallelOptions::sync_batch_norm, uses the statistics of the global
// batch (libs/nn/sync_batch_norm.h).
//
// CUDA devices: `devices` may be cuda:0, cuda:1, ... instead of CPU devices
// (all of one kind; a mix is InvalidArgument). Each replica lives on its GPU
// (Module::To) and its engine queue's thread makes that GPU current; all of a
// replica's work (its slice of the batch copied in with Tensor::To, forward,
// backward, the SGD step, and the reducer's copies of its gradients) is
// ordered on one stream, the device's default stream (libs/cuda/stream.h),
// made current explicitly. Bucket reduction takes one of two paths:
//  - host staging (every case but the next): each replica's bucket
//    gradients are copied device -> pinned host memory on the replica's
//    stream (so after the kernels that produced them), the weighted sum, the
//    allreduce with a host transport (TCP, shm, ...) or the kvstore round run
//    on the host exactly as for CPU replicas, and the result is copied back
//    host -> device into every replica's gradients, before its SGD step.
//  - device allreduce ("nccl_allreduce"): exactly one CUDA device and a
//    communicator whose transport is TransportKind::kNccl
//    (libs/cuda/nccl/nccl_collective.h, which takes device pointers): each
//    bucket is flattened into a device buffer, allreduced (average over
//    trainers) by NCCL and copied back, with no host staging. The
//    communicator's cuda_device must be the trainer's device; an NCCL
//    communicator with several devices per trainer is InvalidArgument (run
//    one trainer per GPU).
// The initial weights are broadcast through host memory with a host
// transport and in device memory with NCCL. The kvstore modes (kSync, kAsync,
// kBoundedDelay) work on CUDA through host staging. sync_batch_norm is
// InvalidArgument on CUDA devices (libs/nn/sync_batch_norm computes in host
// memory). Each step ends with every replica's stream synchronized, so
// asynchronous CUDA errors fail the step they happened in. Create answers
// FailedPrecondition for a CUDA device the machine does not have (naming
// the device and, with no GPU at all, the CUDA runtime's reason), or when the
// binary does not link //libs/cuda:cuda_backend.
//
// Thread-safety: one thread drives a DataParallelTrainer.
#ifndef DTRAIN_LIBS_TRAIN_DATA_PARALLEL_H_
#define DTRAIN_LIBS_TRAIN_DATA_PARALLEL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/collective/communicator.h"
#include "libs/kvstore/parameter_server.h"
#include "libs/nn/models.h"
#include "libs/nn/optim.h"
#include "libs/tensor/tensor.h"
#include "libs/train/step_phases.h"

namespace dtrain {
namespace train {

struct DataParallelOptions {
  std::string model = "lenet";
  // Its input channels and classes (nn::MakeModel's options).
  nn::ModelOptions model_options;
  // For tests: builds the model instead of nn::MakeModel(model) (called once
  // per replica; every call must build the same architecture).
  std::function<absl::StatusOr<std::shared_ptr<nn::Module>>()> model_factory;
  // Resuming: called for every replica (its model and optimizer) after the
  // initialization and before the initial weights are broadcast to the other
  // trainers and, in the asynchronous kvstore modes, stored on the server,
  // so the job continues from what it loads (a checkpoint) everywhere.
  std::function<absl::Status(nn::Module* model, nn::Sgd* optimizer)> restore;
  // The trainer's devices, one model replica each (cpu:0, cpu:1, ...; or
  // cuda:0, cuda:1, ..., see the file comment; not a mix).
  std::vector<Device> devices = {Device::Cpu(0)};
  // CPU threads for the kernels of each device's replica.
  int threads_per_device = 1;
  // Gradient bucket size. Smaller buckets start communication earlier;
  // larger ones amortize per-message costs.
  size_t bucket_bytes = size_t{1} << 20;
  ops::SgdParams sgd;
  nn::Init init = nn::Init::kNormal;
  float init_std = 0.01f;
  uint64_t seed = 0;
  // Synchronized batch norm. Off: every BatchNorm2d layer normalizes with the
  // statistics of its replica's slice. On: in training mode every BatchNorm2d
  // layer of every replica normalizes with the mean and variance over the
  // global batch (all devices of this trainer and, with `communicator`, of
  // every trainer), its backward uses the global sums of dy and dy * xhat,
  // and the running statistics are updated from the global mean and unbiased
  // variance (PyTorch's SyncBatchNorm), so they are the same on every
  // replica. The replicas meet at each layer in forward and in backward; a
  // replica waits at most `sync_batch_norm_timeout` for the others (the step
  // then fails with DeadlineExceeded). With a communicator the statistics
  // are allgathered across trainers from the device threads, so gradient
  // buckets are reduced only after every replica's backward finished (the
  // collectives must be issued in the same order on every trainer): no
  // overlap of communication with backward in that combination. Not
  // supported through a kvstore with more than one worker (Create answers
  // InvalidArgument): the kvstore has no collective for the statistics. Nor
  // on CUDA devices (InvalidArgument naming this option): the synchronized
  // layer computes in host memory.
  bool sync_batch_norm = false;
  absl::Duration sync_batch_norm_timeout = absl::Minutes(5);
  // Across trainers (not owned; null for a single trainer). Every trainer
  // must use the same options and the same global batch size per step.
  collective::Communicator* communicator = nullptr;
  // Or through the parameter server (not owned; exclusive with
  // `communicator`). Create() creates the client's job (options().job) as
  // MakeKvstoreJobConfig(options) builds it, and its keys, idempotently from
  // every trainer; every trainer must pass the same options. A job name must
  // not be reused with a different consistency or optimizer (the kvstore
  // answers AlreadyExists).
  kvstore::ParameterServer* kvstore = nullptr;
  // The number of trainers (kvstore workers) of the job.
  int kvstore_workers = 1;
  // How trainers meet on the kvstore (ignored without `kvstore`):
  //  kSync          every gradient bucket is a key "grad/bucket<b>" of a
  //                 synchronous job with no server optimizer and
  //                 gradient_scale 1/kvstore_workers: each step pushes the
  //                 trainer's mean bucket gradient and pulls the mean over all
  //                 trainers of that round, then every replica applies
  //                 `sgd` locally. Same result as allreduce.
  //  kAsync         the parameter server holds the weights: every bucket is a
  //                 key "param/bucket<b>" initialized once with the initial
  //                 weights (Init is idempotent: the first trainer's weights
  //                 win, and every trainer starts from what the server holds).
  //                 The server applies SGD with `sgd`'s lr, momentum and
  //                 weight decay (the same formula as nn::Sgd; nesterov is
  //                 rejected) to each pushed gradient as it arrives. Each step
  //                 pushes each bucket's gradient (the mean over this
  //                 trainer's batch) as soon as it is ready and pulls back the
  //                 server's current weights into every replica; there is no
  //                 local SGD step and `optimizer(i)` holds no state.
  //  kBoundedDelay  as kAsync, but the server lets no trainer run more than
  //                 `kvstore_max_staleness` rounds (steps) ahead of the
  //                 slowest: the pull of step r waits until every trainer has
  //                 pushed step r - kvstore_max_staleness. 0 makes the
  //                 trainers take turns in lock step (yet each push is still
  //                 applied on its own, unlike kSync).
  // Batch-norm running statistics are not kept on the server: in kAsync and
  // kBoundedDelay each trainer keeps its own.
  kvstore::Consistency kvstore_consistency = kvstore::Consistency::kSync;
  // kBoundedDelay only (>= 0); must be 0 for the other modes.
  int kvstore_max_staleness = 0;
  // How this trainer's gradient pushes travel (ParameterServer::
  // SetPushCompression): f16 or bf16 halve their bytes, top-k sends a
  // fraction of them with error feedback; pulls stay f32.
  kvstore::CompressionSpec kvstore_compression;
  // This trainer joins a running job (recovery in place) through
  // `communicator`: the strategy is made for it, but the initial weights are
  // not shared (the other trainers are not there; Regroup brings the
  // state). For a device communicator (NCCL), whose strategy keeps its
  // buckets in device memory from the start.
  bool joining = false;
};

// The kvstore job a data-parallel run with `workers` trainers needs in the
// synchronous mode (kept for callers that build it themselves).
kvstore::JobConfig MakeKvstoreJobConfig(const std::string& job, int workers);

// The kvstore job for `options` (its kvstore_workers, kvstore_consistency,
// kvstore_max_staleness and, for kAsync / kBoundedDelay, the server-side SGD
// from options.sgd with gradient_scale 1).
kvstore::JobConfig MakeKvstoreJobConfig(const std::string& job, const DataParallelOptions& options);

// The chapter's advice for k devices: keep the per-device batch, so the
// global batch grows k-fold, and scale the learning rate with it (the linear
// scaling rule).
struct ScaledHyperparameters {
  int64_t batch_size;
  float lr;
};
ScaledHyperparameters ScaleForDevices(int64_t batch_per_device, float base_lr, int devices);

class DataParallelTrainer {
 public:
  static absl::StatusOr<std::unique_ptr<DataParallelTrainer>> Create(
      const DataParallelOptions& options);
  ~DataParallelTrainer();

  // One training step on this trainer's share of the global batch: `x` is
  // [N, ...] and `labels` i32 [N] on the host. N must be at least the number
  // of devices. Returns the mean loss over the N samples.
  absl::StatusOr<float> Step(const Tensor& x, const Tensor& labels);
  // Correct predictions (training mode, before the update) of the last Step
  // over its N samples: the training accuracy, at the cost of an argmax.
  int64_t last_correct() const;
  // With a strategy that sums each step's statistics over the trainers
  // (GradientSync::reduces_step_statistics, "allreduce"): the last Step's
  // {loss sum, samples, correct} over every trainer of the step (the same
  // bits on each), else null. A trainer's loss sum is its mean loss (Step's
  // result, as a float) times its samples.
  const double* last_step_statistics() const;
  // Whether this trainer's steps sum their statistics over the trainers
  // (its current strategy's GradientSync::reduces_step_statistics).
  bool sums_step_statistics() const;

  // Counts correct predictions of replica 0's model in evaluation mode (on
  // its device; `x` and `labels` on the host).
  int64_t CountCorrect(const Tensor& x, const Tensor& labels);

  // kAsync / kBoundedDelay kvstore modes: copies the server's current weights
  // into every replica (a step leaves the weights of its own pushes, which
  // other trainers' later pushes may have moved on). Call it at the end of
  // training or before evaluation or a checkpoint. A no-op in the other
  // modes, where replicas already hold the job's weights.
  absl::Status PullLatestWeights();

  // Combines this trainer's statistics `sums` (n host floats: a loss sum, a
  // sample count, ...) with the other trainers' so that their ratios are
  // over every trainer's samples (each becomes its sum or its mean over the
  // trainers). With kvstore-held weights (kAsync / kBoundedDelay) there is no
  // common round and they stay this trainer's; one trainer: unchanged. The
  // synchronous kvstore mode takes n == 3 (its key "stats/epoch").
  absl::Status AverageStatistics(float* sums, int n);

  // Recovery in place (the "allreduce" or "nccl_allreduce" strategy, or
  // "local" for a trainer that joins a running job): continues with `communicator`
  // (not owned; it outlives the trainer or the next Regroup), a new
  // membership of the job's ranks after a peer was lost. A Step that failed
  // because of the lost peer applied no update (the engine skipped it), so
  // each survivor still holds the state of its last completed step. Every
  // trainer of the new communicator calls Regroup together: rank `root`'s
  // replica 0 parameters, buffers and momentum are broadcast to all of them
  // (a joiner's own are overwritten) and copied to every local replica.
  // A "kvstore_sync" trainer keeps meeting on the kvstore, in `kvstore` (not
  // owned; it outlives the trainer or the next Regroup): the new
  // membership's kvstore job, which Regroup creates (`communicator` only
  // carries the broadcast); the same client as before for a joiner, which
  // made the job at Create. CUDA replicas: the state travels through host
  // memory (device -> host on the root, host -> device everywhere), over
  // `communicator`, a host transport; `gradients` (not owned; null: the
  // same as `communicator`) is the new membership's communicator for the
  // gradients, an NCCL one for the "nccl_allreduce" strategy. Unimplemented
  // for sync_batch_norm and the kvstore-held weights modes.
  absl::Status Regroup(collective::Communicator* communicator, int root,
                       kvstore::ParameterServer* kvstore = nullptr,
                       collective::Communicator* gradients = nullptr);

  // kAsync / kBoundedDelay kvstore modes: this trainer replaces a lost one
  // under the same kvstore worker id in a running job (Create pulled the
  // server's weights). Continues that worker's rounds
  // (kvstore::ParameterServer::ResumeRounds) and returns the steps it had
  // completed: the rounds every bucket had pushed (the lowest, when it died
  // between two buckets' pushes). FailedPrecondition in the other modes.
  absl::StatusOr<int64_t> ResumeKvstoreWorker();

  // The gradient-sync strategy Create chose (gradient_sync.h): "local",
  // "allreduce", "nccl_allreduce", "kvstore_sync" or "kvstore_weights".
  const char* sync_name() const;

  // Replica `i`'s model (all replicas hold the same parameters after a step).
  nn::Module* replica(int i);
  // Replica `i`'s optimizer (its momentum buffers, for checkpoints).
  nn::Sgd* optimizer(int i);
  int num_devices() const;
  int num_buckets() const;
  // Seconds the last step's communication queue spent waiting for buckets,
  // and doing reductions: their ratio shows how much communication overlaps
  // backward.
  double last_comm_wait_seconds() const;
  double last_comm_work_seconds() const;
  // The last Step's phases (step_phases.h): forward_backward from Step's
  // start, comm_wait and optimizer, and each bucket's reduction; the data
  // wait is the caller's (RunJob's), so phase[kDataWait] is an empty span at
  // Step's start and `step` starts there too.
  const StepPhases& last_step_phases() const;

  DataParallelTrainer(const DataParallelTrainer&) = delete;
  DataParallelTrainer& operator=(const DataParallelTrainer&) = delete;

 private:
  struct Impl;
  explicit DataParallelTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_DATA_PARALLEL_H_

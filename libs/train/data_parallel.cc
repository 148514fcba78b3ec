#include "libs/train/data_parallel.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/autograd/functions.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/stream.h"
#include "libs/engine/engine.h"
#include "libs/nn/layers.h"
#include "libs/nn/sync_batch_norm.h"
#include "libs/ops/ops.h"
#include "libs/train/gradient_sync.h"
#include "libs/train/reducer.h"

namespace dtrain {
namespace train {

using autograd::Variable;

kvstore::JobConfig MakeKvstoreJobConfig(const std::string& job, int workers) {
  kvstore::JobConfig c;
  c.job = job;
  c.num_workers = workers;
  c.consistency = kvstore::Consistency::kSync;
  c.optimizer = kvstore::OptimizerKind::kNone;
  c.gradient_scale = 1.0 / workers;
  return c;
}

kvstore::JobConfig MakeKvstoreJobConfig(const std::string& job,
                                        const DataParallelOptions& options) {
  if (options.kvstore_consistency == kvstore::Consistency::kSync) {
    return MakeKvstoreJobConfig(job, options.kvstore_workers);
  }
  kvstore::JobConfig c;
  c.job = job;
  c.num_workers = options.kvstore_workers;
  c.consistency = options.kvstore_consistency;
  c.max_staleness = options.kvstore_consistency == kvstore::Consistency::kBoundedDelay
                        ? options.kvstore_max_staleness
                        : 0;
  // The server's step (protos/kvstore.proto) is nn::Sgd's without nesterov:
  // g = grad + wd * w; v = momentum * v + g; w -= lr * v, with v from zero.
  c.optimizer = kvstore::OptimizerKind::kSgd;
  c.learning_rate = options.sgd.lr;
  c.momentum = options.sgd.momentum;
  c.weight_decay = options.sgd.weight_decay;
  // Each trainer pushes the mean gradient over its own batch, applied alone.
  c.gradient_scale = 1;
  return c;
}

ScaledHyperparameters ScaleForDevices(int64_t batch_per_device, float base_lr, int devices) {
  return {batch_per_device * devices, base_lr * static_cast<float>(devices)};
}

struct DataParallelTrainer::Impl {
  DataParallelOptions options;
  int k = 0;
  std::unique_ptr<engine::Engine> engine;
  std::vector<engine::QueueId> device_queues;
  engine::QueueId comm_queue;
  std::vector<engine::VarHandle> replica_vars;
  std::vector<engine::VarHandle> bucket_vars;
  std::vector<std::shared_ptr<nn::Module>> replicas;
  std::vector<std::vector<Variable>> params;  // [replica][param]
  std::vector<std::unique_ptr<nn::Sgd>> optimizers;
  // Sync batch norm: one group per BatchNorm2d layer, shared by the replicas.
  std::vector<std::shared_ptr<nn::SyncBatchNormGroup>> bn_groups;
  // CUDA replicas (see the header): every replica's work (its engine tasks,
  // and the reducer's copies of its gradients) is ordered on one stream per
  // replica, its device's default stream, made current explicitly.
  bool cuda_replicas = false;
  std::vector<Stream*> streams;  // [replica]; null for CPU replicas
  // Buckets, readiness, the weighted sum; then what crosses the trainers.
  // (The strategy uses the reducer: declared after it, destroyed first.)
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<GradientSync> sync;

  // Per-step results.
  std::vector<double> weights;  // slice size / trainer's batch, per replica
  std::vector<float> losses;
  std::vector<int64_t> corrects;  // per replica, of the last step
  // The step's statistics over every trainer (when the strategy sums them).
  engine::VarHandle stats_var;
  double step_stats[3] = {0, 0, 0};
  bool step_stats_valid = false;
  double comm_wait = 0, comm_work = 0;
  // Phases of the last step (step_phases.h): when each replica's backward
  // ended and each bucket's reduction ran (written by the engine's workers,
  // read after WaitAll), and the result.
  std::vector<int64_t> backward_end_ns;  // per replica
  std::vector<PhaseSpan> bucket_spans;   // per bucket
  StepPhases phases;

  void Abort() {
    if (reducer) reducer->Abort();
    // Releases replicas waiting for this one at a batch-norm layer.
    for (auto& g : bn_groups) g->Abort(absl::AbortedError("a replica failed"));
  }

  absl::Status ForwardBackward(int r, const Tensor& x, const Tensor& labels) {
    std::optional<cuda::StreamGuard> on_replica;
    if (cuda_replicas) on_replica.emplace(streams[r]);
    DT_ASSIGN_OR_RETURN(Tensor xr, x.To(options.devices[r]));
    DT_ASSIGN_OR_RETURN(Tensor yr, labels.To(options.devices[r]));
    optimizers[r]->ZeroGrad();
    Variable logits = replicas[r]->Forward(Variable(xr));
    Variable loss = autograd::SoftmaxCrossEntropy(logits, yr);
    loss.Backward();
    losses[r] = ops::ScalarValue(loss.value());
    corrects[r] = ops::CountCorrect(logits.value(), yr);
    for (size_t l = 0; l < bn_groups.size(); ++l) {
      DT_RETURN_IF_ERROR(
          Annotate(bn_groups[l]->status(), absl::StrCat("replica ", r, ", batch-norm layer ", l)));
    }
    reducer->FinishBackward(r);
    backward_end_ns[r] = absl::GetCurrentTimeNanos();
    return absl::OkStatus();
  }

  // On the communication queue, bucket after bucket.
  absl::Status ReduceBucket(int b) {
    auto t0 = std::chrono::steady_clock::now();
    DT_RETURN_IF_ERROR(reducer->WaitForBucket(b));
    auto t1 = std::chrono::steady_clock::now();
    bucket_spans[b].start_ns = absl::GetCurrentTimeNanos();
    DT_ASSIGN_OR_RETURN(float* flat, reducer->SumBucket(b));
    DT_RETURN_IF_ERROR(sync->ReduceBucket(b, flat));
    if (sync->optimizer_steps_locally()) DT_RETURN_IF_ERROR(reducer->WriteBackGradients(b));
    auto t2 = std::chrono::steady_clock::now();
    bucket_spans[b].end_ns = absl::GetCurrentTimeNanos();
    comm_wait += std::chrono::duration<double>(t1 - t0).count();
    comm_work += std::chrono::duration<double>(t2 - t1).count();
    return absl::OkStatus();
  }

  // On the communication queue after the buckets and every replica's
  // backward, before any update: {loss sum, samples, correct} over the
  // step's trainers.
  absl::Status ReduceStepStatistics(int64_t n) {
    double loss = 0;
    int64_t correct = 0;
    for (int r = 0; r < k; ++r) {
      loss += weights[r] * losses[r];
      correct += corrects[r];
    }
    step_stats[0] = static_cast<double>(static_cast<float>(loss)) * static_cast<double>(n);
    step_stats[1] = static_cast<double>(n);
    step_stats[2] = static_cast<double>(correct);
    return sync->ReduceStepStatistics(step_stats, 3);
  }

  // On replica r's queue after every bucket of the step.
  absl::Status FinishStep(int r) {
    std::optional<cuda::StreamGuard> on_replica;
    if (cuda_replicas) on_replica.emplace(streams[r]);
    if (sync->optimizer_steps_locally()) {
      optimizers[r]->Step();
    } else {
      DT_RETURN_IF_ERROR(sync->UpdateReplica(r));
    }
    if (cuda_replicas) {
      // The step ends with the replica's device work done: errors of
      // asynchronous kernels surface in this step, and the pinned buffers
      // the copies read are free again.
      return Annotate(streams[r]->Synchronize(),
                      absl::StrCat("replica ", r, " on ", options.devices[r].ToString()));
    }
    return absl::OkStatus();
  }
};

DataParallelTrainer::DataParallelTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DataParallelTrainer::~DataParallelTrainer() {
  if (impl_ && impl_->engine) {
    impl_->Abort();
    absl::Status s = impl_->engine->WaitAll();
    (void)s;
    // Copies a failed step left in flight must not outlive the buffers.
    s = impl_->reducer->SynchronizeReplicas();
    (void)s;
  }
}

namespace {

// The BatchNorm2d layers under `m`, depth first in registration order (the
// same order in every replica).
void CollectBatchNorms(nn::Module* m, std::vector<nn::BatchNorm2d*>* out) {
  if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m)) out->push_back(bn);
  for (auto& [name, child] : m->NamedChildren()) CollectBatchNorms(child.get(), out);
}

std::string DeviceList(const std::vector<Device>& devices) {
  std::string out;
  for (const Device& d : devices) absl::StrAppend(&out, out.empty() ? "" : ", ", d.ToString());
  return out;
}

// All CPU, or all CUDA devices (each once).
absl::Status CheckDeviceKinds(const std::vector<Device>& devices) {
  for (const Device& d : devices) {
    if (!d.is_cpu() && !d.is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data-parallel training runs on CPU or CUDA devices, got ", d.ToString()));
    }
    if (d.type != devices[0].type) {
      return absl::InvalidArgumentError(
          absl::StrCat("all devices of a data-parallel trainer must be of one kind (all cpu or "
                       "all cuda), got ",
                       DeviceList(devices)));
    }
  }
  if (devices[0].is_cpu()) return absl::OkStatus();
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (devices[i] == devices[j]) {
        return absl::InvalidArgumentError(
            absl::StrCat(devices[i].ToString(),
                         " is listed twice (one replica per CUDA device): ", DeviceList(devices)));
      }
    }
  }
  return absl::OkStatus();
}

// CUDA devices this process can use (the machine has them and the backend is
// linked).
absl::Status CheckCudaDevicesAvailable(const std::vector<Device>& devices) {
  std::string reason;
  int count = cuda::DeviceCount(&reason);
  for (const Device& d : devices) {
    if (count == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("data-parallel training on ", d.ToString(),
                       ": no CUDA device is available on this machine (", reason, ")"));
    }
    if (d.index < 0 || d.index >= count) {
      return absl::FailedPreconditionError(absl::StrCat("data-parallel training on ", d.ToString(),
                                                        ": this machine has ", count,
                                                        " CUDA device(s)"));
    }
    // The device exists; its allocator exists only when the backend is linked.
    absl::StatusOr<Allocator*> allocator = GetAllocator(d);
    if (!allocator.ok()) {
      return Annotate(allocator.status(), absl::StrCat("data-parallel training on ", d.ToString(),
                                                       " (link //libs/cuda:cuda_backend)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataParallelTrainer>> DataParallelTrainer::Create(
    const DataParallelOptions& o) {
  if (o.devices.empty()) return absl::InvalidArgumentError("data-parallel training needs devices");
  DT_RETURN_IF_ERROR(CheckDeviceKinds(o.devices));
  const bool on_cuda = o.devices[0].is_cuda();
  if (on_cuda && o.sync_batch_norm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sync_batch_norm is implemented for CPU replicas only (libs/nn/sync_batch_norm "
        "computes in host memory); devices are ",
        DeviceList(o.devices)));
  }
  if (o.threads_per_device <= 0) {
    return absl::InvalidArgumentError("threads_per_device must be positive");
  }
  if (o.bucket_bytes == 0) return absl::InvalidArgumentError("bucket_bytes must be positive");
  if (o.kvstore != nullptr && o.communicator != nullptr) {
    return absl::InvalidArgumentError("synchronize through a communicator or a kvstore, not both");
  }
  if (o.kvstore != nullptr && o.kvstore_workers < 1) {
    return absl::InvalidArgumentError("kvstore_workers must be at least 1");
  }
  if (o.kvstore_max_staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvstore_max_staleness must be >= 0, got ", o.kvstore_max_staleness));
  }
  if (o.kvstore_max_staleness != 0 &&
      o.kvstore_consistency != kvstore::Consistency::kBoundedDelay) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kvstore_max_staleness (", o.kvstore_max_staleness, ") is for the bounded-delay mode; ",
        "kvstore_consistency is ", kvstore::ConsistencyName(o.kvstore_consistency)));
  }
  if (o.sync_batch_norm && o.kvstore != nullptr && o.kvstore_workers > 1) {
    return absl::InvalidArgumentError(
        "sync_batch_norm across trainers needs a communicator; the kvstore has no collective for "
        "the batch statistics (use sync_batch_norm with a single kvstore worker or a "
        "communicator)");
  }
  if (o.sync_batch_norm && o.sync_batch_norm_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("sync_batch_norm_timeout must be positive");
  }
  // The one place the way trainers meet is chosen (gradient_sync.h); its
  // factory checks the options that are the strategy's own.
  DT_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync, CreateGradientSync(o));
  if (on_cuda) DT_RETURN_IF_ERROR(CheckCudaDevicesAvailable(o.devices));
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->k = static_cast<int>(o.devices.size());
  impl->engine = engine::Engine::Create({.max_pending = 4096});
  impl->cuda_replicas = on_cuda;
  impl->streams.assign(impl->k, nullptr);
  for (int r = 0; r < impl->k; ++r) {
    int threads = o.threads_per_device;
    if (on_cuda) {
      // The replica's worker makes its GPU the thread's current device
      // (cudaSetDevice is per thread; kernels and allocations also set it
      // for each call, this covers everything else, e.g. cuBLAS handles).
      int index = o.devices[r].index;
      impl->device_queues.push_back(
          impl->engine->AddQueue(o.devices[r].ToString(), 1, [threads, index] {
            ops::SetCpuThreads(threads);
            (void)cudaSetDevice(index);  // the device exists (checked above)
          }));
      impl->streams[r] = DefaultStream(o.devices[r]);
      if (impl->streams[r] == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            o.devices[r].ToString(), " has no stream (is //libs/cuda:cuda_backend linked?)"));
      }
    } else {
      impl->device_queues.push_back(impl->engine->AddQueue(
          o.devices[r].ToString(), 1, [threads] { ops::SetCpuThreads(threads); }));
    }
    impl->replica_vars.push_back(impl->engine->NewVar(absl::StrCat("replica", r)));
  }
  impl->comm_queue = impl->engine->AddQueue("comm", 1, [] { ops::SetCpuThreads(1); });

  for (int r = 0; r < impl->k; ++r) {
    absl::StatusOr<std::shared_ptr<nn::Module>> made =
        o.model_factory ? o.model_factory() : nn::MakeModel(o.model, o.model_options);
    DT_RETURN_IF_ERROR(made.status());
    std::shared_ptr<nn::Module> m = *std::move(made);
    if (r == 0) nn::InitParameters(m.get(), o.init, o.seed, o.init_std);
    DT_RETURN_IF_ERROR(m->To(o.devices[r]));
    m->Train();
    impl->replicas.push_back(m);
    std::vector<Variable> ps;
    for (auto& [name, v] : m->NamedParameters()) ps.push_back(v);
    impl->params.push_back(ps);
    impl->optimizers.push_back(std::make_unique<nn::Sgd>(m->NamedParameters(), o.sgd));
  }
  if (o.restore) {
    for (int r = 0; r < impl->k; ++r) {
      DT_RETURN_IF_ERROR(o.restore(impl->replicas[r].get(), impl->optimizers[r].get()));
    }
  }
  bool reduce_after_backward = false;
  if (o.sync_batch_norm) {
    std::vector<std::vector<nn::BatchNorm2d*>> bns(impl->k);
    for (int r = 0; r < impl->k; ++r) CollectBatchNorms(impl->replicas[r].get(), &bns[r]);
    nn::SyncBatchNormGroup::CrossGather cross = sync->BatchNormGather();
    // Statistics gathered across trainers from the device threads: the
    // collectives must be issued in the same order on every trainer, so
    // buckets wait for every replica's backward.
    reduce_after_backward = cross != nullptr;
    for (size_t l = 0; l < bns[0].size(); ++l) {
      auto group =
          std::make_shared<nn::SyncBatchNormGroup>(impl->k, o.sync_batch_norm_timeout, cross);
      for (int r = 0; r < impl->k; ++r) bns[r][l]->SetSyncGroup(group, r);
      impl->bn_groups.push_back(std::move(group));
    }
  }
  Reducer::Options ro;
  ro.params = impl->params;
  ro.devices = o.devices;
  ro.streams = impl->streams;
  ro.bucket_bytes = o.bucket_bytes;
  ro.reduce_after_backward = reduce_after_backward;
  ro.place = sync->bucket_place();
  DT_ASSIGN_OR_RETURN(impl->reducer, Reducer::Create(std::move(ro)));
  for (size_t b = 0; b < impl->reducer->buckets().size(); ++b) {
    impl->bucket_vars.push_back(impl->engine->NewVar(absl::StrCat("bucket", b)));
  }
  impl->stats_var = impl->engine->NewVar("step_statistics");
  // Same initial weights everywhere: the strategy makes replica 0 hold the
  // job's (broadcast from rank 0, or what the kvstore holds), then every
  // other replica copies them.
  impl->sync = std::move(sync);
  if (o.joining) {
    impl->sync->Attach(impl->reducer.get());  // Regroup brings the weights
  } else {
    DT_RETURN_IF_ERROR(impl->sync->Start(impl->reducer.get()));
  }
  const size_t np = impl->params[0].size();
  for (int r = 1; r < impl->k; ++r) {
    for (size_t p = 0; p < np; ++p) {
      DT_RETURN_IF_ERROR(impl->params[r][p].mutable_value().CopyFrom(impl->params[0][p].value()));
    }
  }
  impl->reducer->InstallHooks();
  return std::unique_ptr<DataParallelTrainer>(new DataParallelTrainer(std::move(impl)));
}

absl::StatusOr<float> DataParallelTrainer::Step(const Tensor& x, const Tensor& labels) {
  Impl& s = *impl_;
  int64_t n = x.dim(0);
  if (n < s.k || labels.dim(0) != n) {
    return absl::InvalidArgumentError(absl::StrCat("a step needs at least one sample per device (",
                                                   s.k, "), got ", n, " samples and ",
                                                   labels.dim(0), " labels"));
  }
  s.weights.assign(s.k, 0.0);
  std::vector<int64_t> rows(s.k);
  for (int r = 0; r < s.k; ++r) {
    rows[r] = n / s.k + (r < n % s.k ? 1 : 0);
    s.weights[r] = static_cast<double>(rows[r]) / n;
  }
  const int64_t start_ns = absl::GetCurrentTimeNanos();
  s.backward_end_ns.assign(s.k, start_ns);
  s.bucket_spans.assign(s.bucket_vars.size(), PhaseSpan{start_ns, start_ns});
  s.reducer->StartStep(s.weights);
  for (auto& g : s.bn_groups) g->Reset();
  s.losses.assign(s.k, 0.0f);
  s.corrects.assign(s.k, 0);
  s.comm_wait = s.comm_work = 0;
  Impl* raw = impl_.get();
  int64_t begin = 0;
  for (int r = 0; r < s.k; ++r) {
    // The replica's share of the gradient of the job's loss: trainers
    // average their gradients.
    for (auto& g : s.bn_groups) g->set_loss_weight(r, s.weights[r] / s.sync->trainers());
    Tensor xr = x.Slice(begin, begin + rows[r]), yr = labels.Slice(begin, begin + rows[r]);
    begin += rows[r];
    s.engine->Push(
        [raw, r, xr, yr]() {
          absl::Status st = raw->ForwardBackward(r, xr, yr);
          if (!st.ok()) raw->Abort();
          return st;
        },
        {}, {s.replica_vars[r]}, s.device_queues[r], absl::StrCat("forward_backward/replica", r));
  }
  for (size_t b = 0; b < s.bucket_vars.size(); ++b) {
    int bi = static_cast<int>(b);
    s.engine->Push([raw, bi]() { return raw->ReduceBucket(bi); }, {}, {s.bucket_vars[b]},
                   s.comm_queue, absl::StrCat("reduce/bucket", b));
  }
  // The step's statistics: after every replica's backward, before any
  // update (a failed reduction fails the step, which then updates nothing).
  s.step_stats_valid = false;
  std::vector<engine::VarHandle> before_update = s.bucket_vars;
  if (s.sync->reduces_step_statistics()) {
    s.engine->Push([raw, n]() { return raw->ReduceStepStatistics(n); }, s.replica_vars,
                   {s.stats_var}, s.comm_queue, "reduce/step_statistics");
    before_update.push_back(s.stats_var);
  }
  for (int r = 0; r < s.k; ++r) {
    s.engine->Push([raw, r]() { return raw->FinishStep(r); }, before_update, {s.replica_vars[r]},
                   s.device_queues[r], absl::StrCat("sgd/replica", r));
  }
  DT_RETURN_IF_ERROR(s.engine->WaitAll());
  s.step_stats_valid = s.sync->reduces_step_statistics();
  // The step's phases: contiguous spans (step_phases.h).
  const int64_t end_ns = absl::GetCurrentTimeNanos();
  int64_t backward_end = start_ns;
  for (int64_t t : s.backward_end_ns) backward_end = std::max(backward_end, t);
  int64_t comm_end = backward_end;
  for (const PhaseSpan& b : s.bucket_spans) comm_end = std::max(comm_end, b.end_ns);
  comm_end = std::min(comm_end, end_ns);
  StepPhases& ph = s.phases;
  ph.step = {start_ns, end_ns};
  ph.phase[static_cast<int>(StepPhase::kDataWait)] = {start_ns, start_ns};
  ph.phase[static_cast<int>(StepPhase::kForwardBackward)] = {start_ns, backward_end};
  ph.phase[static_cast<int>(StepPhase::kCommWait)] = {backward_end, comm_end};
  ph.phase[static_cast<int>(StepPhase::kOptimizer)] = {comm_end, end_ns};
  ph.bucket_reductions = s.bucket_spans;
  double loss = 0;
  for (int r = 0; r < s.k; ++r) loss += s.weights[r] * s.losses[r];
  return static_cast<float>(loss);
}

absl::Status DataParallelTrainer::Regroup(collective::Communicator* comm, int root,
                                          kvstore::ParameterServer* kvstore,
                                          collective::Communicator* gradients) {
  Impl& s = *impl_;
  if (comm == nullptr) return absl::InvalidArgumentError("Regroup needs a communicator");
  if (gradients == nullptr) gradients = comm;
  if (s.options.sync_batch_norm) {
    return absl::UnimplementedError("recovery in place is implemented without sync_batch_norm");
  }
  if (comm->options().transport == collective::TransportKind::kNccl) {
    return absl::InvalidArgumentError(
        "Regroup: the state travels over a host communicator; pass the NCCL one as `gradients`");
  }
  if (gradients->size() != comm->size() || gradients->rank() != comm->rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Regroup: the gradients' communicator is rank ", gradients->rank(), " of ",
                     gradients->size(), ", the state's rank ", comm->rank(), " of ", comm->size()));
  }
  if (root < 0 || root >= comm->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Regroup: root ", root, " is not a rank of ", comm->size()));
  }
  // The failed step poisoned the engine variables it wrote (engine.h): fresh
  // ones, and every error it left is collected.
  for (int i = 0; i < 1000 && !s.engine->WaitAll().ok(); ++i) {
  }
  for (int r = 0; r < s.k; ++r) s.replica_vars[r] = s.engine->NewVar(absl::StrCat("replica", r));
  for (size_t b = 0; b < s.bucket_vars.size(); ++b) {
    s.bucket_vars[b] = s.engine->NewVar(absl::StrCat("bucket", b));
  }
  s.stats_var = s.engine->NewVar("step_statistics");
  s.step_stats_valid = false;
  // The strategy's hook for the new membership (gradient_sync.h).
  DataParallelOptions next = s.options;
  next.communicator = gradients;
  next.kvstore = kvstore;
  next.kvstore_workers = comm->size();
  DT_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync, s.sync->Regroup(next));
  if (sync != nullptr) s.sync = std::move(sync);
  const bool is_root = comm->rank() == root;
  auto broadcast = [&](Tensor* t, const std::string& what) -> absl::Status {
    const std::string context = absl::StrCat("regroup: broadcast of ", what, " from rank ", root);
    if (!s.cuda_replicas) {
      return Annotate(
          comm->Broadcast(t->raw_data(), static_cast<size_t>(t->numel()), DType::kF32, root),
          context);
    }
    // Device memory through the host: the root's copy goes out, every rank
    // copies what arrived back to its device.
    std::optional<cuda::StreamGuard> on_replica;
    on_replica.emplace(s.streams[0]);
    absl::StatusOr<Tensor> host = t->To(Device::Cpu(0));
    if (!host.ok()) return Annotate(host.status(), context);
    DT_RETURN_IF_ERROR(Annotate(s.streams[0]->Synchronize(), context));
    DT_RETURN_IF_ERROR(Annotate(
        comm->Broadcast(host->raw_data(), static_cast<size_t>(host->numel()), DType::kF32, root),
        context));
    DT_RETURN_IF_ERROR(Annotate(t->CopyFrom(*host), context));
    return Annotate(s.streams[0]->Synchronize(), context);  // before `host` is freed
  };
  nn::Module* m0 = s.replicas[0].get();
  for (auto& [name, v] : m0->NamedParameters()) {
    DT_RETURN_IF_ERROR(broadcast(&v.mutable_value(), name));
  }
  for (auto& [name, t] : m0->NamedBuffers()) DT_RETURN_IF_ERROR(broadcast(t, name));
  // Momentum exists after the first step: the root says whether it has it.
  std::map<std::string, Tensor*> mine;
  for (auto& [name, t] : s.optimizers[0]->NamedState()) mine[name] = t;
  float has_momentum = is_root && !mine.empty() ? 1.0f : 0.0f;
  DT_RETURN_IF_ERROR(
      Annotate(comm->Broadcast(&has_momentum, 1, DType::kF32, root), "regroup: momentum flag"));
  if (has_momentum > 0) {
    DT_RETURN_IF_ERROR(
        s.optimizers[0]->LoadState([&](const std::string& name, Tensor* dst) -> absl::Status {
          if (is_root) {
            auto it = mine.find(name);
            if (it == mine.end()) return absl::InternalError("no momentum for " + name);
            DT_RETURN_IF_ERROR(dst->CopyFrom(*it->second));
          }
          return broadcast(dst, name);
        }));
  }
  // Every local replica holds replica 0's state.
  const size_t np = s.params[0].size();
  std::vector<std::pair<std::string, Tensor*>> buffers0 = m0->NamedBuffers();
  std::map<std::string, Tensor*> momentum0;
  for (auto& [name, t] : s.optimizers[0]->NamedState()) momentum0[name] = t;
  for (int r = 1; r < s.k; ++r) {
    for (size_t p = 0; p < np; ++p) {
      DT_RETURN_IF_ERROR(s.params[r][p].mutable_value().CopyFrom(s.params[0][p].value()));
    }
    std::vector<std::pair<std::string, Tensor*>> buffers = s.replicas[r]->NamedBuffers();
    for (size_t b = 0; b < buffers.size() && b < buffers0.size(); ++b) {
      DT_RETURN_IF_ERROR(buffers[b].second->CopyFrom(*buffers0[b].second));
    }
    if (!momentum0.empty()) {
      DT_RETURN_IF_ERROR(
          s.optimizers[r]->LoadState([&](const std::string& name, Tensor* dst) -> absl::Status {
            auto it = momentum0.find(name);
            if (it == momentum0.end()) return absl::NotFoundError(name);
            return dst->CopyFrom(*it->second);
          }));
    }
  }
  return absl::OkStatus();
}

int64_t DataParallelTrainer::CountCorrect(const Tensor& x, const Tensor& labels) {
  Impl& s = *impl_;
  autograd::NoGradGuard no_grad;
  nn::Module* m = s.replicas[0].get();
  m->Eval();
  std::optional<cuda::StreamGuard> on_replica;
  if (s.cuda_replicas) on_replica.emplace(s.streams[0]);
  absl::StatusOr<Tensor> xr = x.To(s.options.devices[0]);
  absl::StatusOr<Tensor> yr = labels.To(s.options.devices[0]);
  DT_CHECK(xr.ok() && yr.ok()) << "copy to " << s.options.devices[0].ToString();
  int64_t correct = ops::CountCorrect(m->Forward(Variable(*xr)).value(), *yr);
  m->Train();
  return correct;
}

absl::StatusOr<int64_t> DataParallelTrainer::ResumeKvstoreWorker() {
  return impl_->sync->ResumeRounds();
}

absl::Status DataParallelTrainer::PullLatestWeights() { return impl_->sync->PullLatestWeights(); }

absl::Status DataParallelTrainer::AverageStatistics(float* sums, int n) {
  return impl_->sync->AverageStatistics(sums, n);
}

const char* DataParallelTrainer::sync_name() const { return impl_->sync->name(); }

nn::Module* DataParallelTrainer::replica(int i) { return impl_->replicas[i].get(); }
nn::Sgd* DataParallelTrainer::optimizer(int i) { return impl_->optimizers[i].get(); }
int64_t DataParallelTrainer::last_correct() const {
  int64_t n = 0;
  for (int64_t c : impl_->corrects) n += c;
  return n;
}
const double* DataParallelTrainer::last_step_statistics() const {
  return impl_->step_stats_valid ? impl_->step_stats : nullptr;
}
bool DataParallelTrainer::sums_step_statistics() const {
  return impl_->sync->reduces_step_statistics();
}
int DataParallelTrainer::num_devices() const { return impl_->k; }
int DataParallelTrainer::num_buckets() const {
  return static_cast<int>(impl_->reducer->buckets().size());
}
double DataParallelTrainer::last_comm_wait_seconds() const { return impl_->comm_wait; }
double DataParallelTrainer::last_comm_work_seconds() const { return impl_->comm_work; }
const StepPhases& DataParallelTrainer::last_step_phases() const { return impl_->phases; }

}  // namespace train
}  // namespace dtrain

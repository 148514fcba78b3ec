#include "libs/train/data_parallel.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/autograd/functions.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/device_allocator.h"
#include "libs/cuda/stream.h"
#include "libs/engine/engine.h"
#include "libs/nn/layers.h"
#include "libs/nn/sync_batch_norm.h"
#include "libs/ops/ops.h"

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
  c.max_delay = options.kvstore_consistency == kvstore::Consistency::kBoundedDelay
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
  struct Bucket {
    std::vector<int> params;  // indices into the parameter list
    int64_t numel = 0;
    std::vector<float> flat;
    // Server mode: the weights pulled after this step's push.
    std::vector<float> weights;
  };

  // kAsync / kBoundedDelay kvstore: the server holds the weights.
  bool server_weights() const {
    return options.kvstore != nullptr && options.kvstore_consistency != kvstore::Consistency::kSync;
  }
  static std::string WeightKey(int b) { return absl::StrCat("param/bucket", b); }

  // Copies bucket b's `weights` into replica r's parameter values (on a CUDA
  // replica: host to device, ordered on the calling thread's current stream
  // of the device, which is the replica's stream; see `streams`).
  absl::Status CopyWeightsToReplica(int b, int r) {
    const Bucket& bucket = buckets[b];
    int64_t off = 0;
    for (int p : bucket.params) {
      Tensor& t = params[r][p].mutable_value();
      if (cuda_replicas) {
        DT_RETURN_IF_ERROR(CopyBytes(t.device(), t.raw_data(), Device::Cpu(),
                                     bucket.weights.data() + off, t.nbytes(), streams[r]));
      } else {
        std::memcpy(t.data<float>(), bucket.weights.data() + off, t.numel() * sizeof(float));
      }
      off += t.numel();
    }
    return absl::OkStatus();
  }

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
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;
  // Sync batch norm: one group per BatchNorm2d layer, shared by the replicas.
  std::vector<std::shared_ptr<nn::SyncBatchNormGroup>> bn_groups;
  // Bucket reductions wait for every replica's backward (sync batch norm
  // across trainers: see the header).
  bool reduce_after_backward = false;

  // CUDA replicas (see the header). Every replica's work (its engine tasks,
  // and the comm queue's copies of its gradients) is ordered on one stream
  // per replica: its device's default stream, made current explicitly.
  bool cuda_replicas = false;
  std::vector<Stream*> streams;  // [replica]; null for CPU replicas
  // Host staging of bucket gradients: one pinned buffer per replica, as large
  // as the largest bucket (the comm queue reduces one bucket at a time).
  std::vector<cuda::PinnedBuffer> staging;
  // Per bucket, pinned: the reduced bucket (the host path's `flat` lives
  // here instead of Bucket::flat, so the copies back to the devices are
  // from pinned memory).
  std::vector<cuda::PinnedBuffer> pinned_flat;
  // One CUDA device and an NCCL communicator: buckets are flattened and
  // allreduced in device memory (no host staging). [bucket]
  bool device_allreduce = false;
  std::vector<Tensor> device_flat;

  // Per-step state, shared by the device workers (hooks) and the
  // communication worker.
  absl::Mutex mu;
  std::vector<int> pending ABSL_GUARDED_BY(mu);              // gradients still to come, per bucket
  std::vector<std::vector<char>> ready ABSL_GUARDED_BY(mu);  // [replica][param]
  bool aborted ABSL_GUARDED_BY(mu) = false;
  int backward_done ABSL_GUARDED_BY(mu) = 0;  // replicas whose backward finished
  std::vector<double> weights;                // slice size / global batch, per replica
  std::vector<float> losses;
  std::vector<int64_t> corrects;  // per replica, of the last step
  double comm_wait = 0, comm_work = 0;

  // Pulls every bucket's current weights (round 0: no waiting) into every
  // replica.
  absl::Status PullWeights() {
    std::vector<kvstore::PullTarget> targets;
    for (size_t b = 0; b < buckets.size(); ++b) {
      targets.push_back({WeightKey(static_cast<int>(b)), buckets[b].weights.data(), 0});
    }
    DT_RETURN_IF_ERROR(options.kvstore->Pull(std::move(targets)));
    for (size_t b = 0; b < buckets.size(); ++b) {
      for (int r = 0; r < k; ++r) {
        DT_RETURN_IF_ERROR(CopyWeightsToReplica(static_cast<int>(b), r));
      }
    }
    return SyncReplicas();
  }

  // Waits for the device work of every CUDA replica enqueued so far (a no-op
  // for CPU replicas).
  absl::Status SyncReplicas() {
    if (!cuda_replicas) return absl::OkStatus();
    for (int r = 0; r < k; ++r) {
      DT_RETURN_IF_ERROR(
          Annotate(streams[r]->Synchronize(),
                   absl::StrCat("replica ", r, " on ", options.devices[r].ToString())));
    }
    return absl::OkStatus();
  }

  // CUDA replicas, host path: copies replica r's gradients of `bucket` into
  // staging[r] (device to host, on the replica's stream, so after the
  // kernels that produced them). Returns once enqueued; SyncStaging waits.
  absl::Status StageGradients(const Bucket& bucket, int r) {
    cuda::DeviceGuard guard(options.devices[r].index);
    cudaStream_t stream = cuda::NativeStream(streams[r]);
    float* dst = static_cast<float*>(staging[r].data());
    int64_t off = 0;
    for (int p : bucket.params) {
      const Tensor& g = params[r][p].grad();
      DT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst + off, g.raw_data(), g.nbytes(), cudaMemcpyDeviceToHost, stream));
      off += g.numel();
    }
    return absl::OkStatus();
  }

  // CUDA replicas, host path: copies the reduced bucket at `flat` (pinned)
  // into every replica's gradients (host to device on each replica's stream,
  // before the SGD step enqueued there later). `flat` is not written again
  // before the replicas are synchronized (at the end of the step).
  absl::Status UnstageGradients(const Bucket& bucket, const float* flat) {
    for (int r = 0; r < k; ++r) {
      cuda::DeviceGuard guard(options.devices[r].index);
      cudaStream_t stream = cuda::NativeStream(streams[r]);
      int64_t off = 0;
      for (int p : bucket.params) {
        Tensor& g = params[r][p].mutable_grad();
        DT_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(g.raw_data(), flat + off, g.nbytes(), cudaMemcpyHostToDevice, stream));
        off += g.numel();
      }
    }
    return absl::OkStatus();
  }

  // One CUDA replica and an NCCL communicator: flattens the bucket's
  // gradients into device_flat[b], allreduces that (average over trainers)
  // and copies the result back, all in device memory. The weighted sum over
  // replicas is the identity (k == 1, weight 1).
  absl::Status ReduceBucketOnDevice(int b) {
    Bucket& bucket = buckets[b];
    cuda::DeviceGuard guard(options.devices[0].index);
    cudaStream_t stream = cuda::NativeStream(streams[0]);
    float* flat = device_flat[b].data<float>();
    int64_t off = 0;
    for (int p : bucket.params) {
      const Tensor& g = params[0][p].grad();
      DT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(flat + off, g.raw_data(), g.nbytes(), cudaMemcpyDeviceToDevice, stream));
      off += g.numel();
    }
    {
      // The NCCL communicator orders its collective after the work enqueued
      // on this thread's current stream of its device: the replica's stream.
      cuda::StreamGuard on_replica(streams[0]);
      DT_RETURN_IF_ERROR(
          Annotate(options.communicator->Allreduce(flat, static_cast<size_t>(bucket.numel),
                                                   DType::kF32, collective::ReduceOp::kAverage),
                   absl::StrCat("NCCL allreduce of gradient bucket ", b)));
    }
    off = 0;
    for (int p : bucket.params) {
      Tensor& g = params[0][p].mutable_grad();
      DT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(g.raw_data(), flat + off, g.nbytes(), cudaMemcpyDeviceToDevice, stream));
      off += g.numel();
    }
    return absl::OkStatus();
  }

  void MarkReady(int r, int p) {
    absl::MutexLock lock(&mu);
    if (ready[r][p]) return;
    ready[r][p] = 1;
    --pending[bucket_of[p]];
  }

  void Abort() {
    {
      absl::MutexLock lock(&mu);
      aborted = true;
    }
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
    // Parameters that got no gradient (unused in this forward) count as zero.
    for (size_t p = 0; p < params[r].size(); ++p) {
      Variable& v = params[r][p];
      bool done;
      {
        absl::MutexLock lock(&mu);
        done = ready[r][p];
      }
      if (!done) {
        v.mutable_grad() = Tensor::Zeros(v.value().shape(), v.value().dtype(), v.value().device());
        MarkReady(r, static_cast<int>(p));
      }
    }
    absl::MutexLock lock(&mu);
    ++backward_done;
    return absl::OkStatus();
  }

  absl::Status ReduceBucket(int b) {
    auto t0 = std::chrono::steady_clock::now();
    {
      absl::MutexLock lock(&mu);
      auto done = [this, b]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
        return (pending[b] == 0 && (!reduce_after_backward || backward_done == k)) || aborted;
      };
      if (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Minutes(10))) {
        return absl::DeadlineExceededError(
            absl::StrCat("bucket ", b, ": gradients not ready after 10 minutes"));
      }
      if (aborted) return absl::AbortedError(absl::StrCat("bucket ", b, ": a replica failed"));
    }
    auto t1 = std::chrono::steady_clock::now();
    if (device_allreduce) {
      DT_RETURN_IF_ERROR(ReduceBucketOnDevice(b));
      auto t2 = std::chrono::steady_clock::now();
      comm_wait += std::chrono::duration<double>(t1 - t0).count();
      comm_work += std::chrono::duration<double>(t2 - t1).count();
      return absl::OkStatus();
    }
    Bucket& bucket = buckets[b];
    float* flat = bucket.flat.data();
    if (cuda_replicas) {
      // Host path for CUDA replicas: every replica's gradients to pinned
      // host memory first (all copies enqueued, then waited for).
      flat = static_cast<float*>(pinned_flat[b].data());
      for (int r = 0; r < k; ++r) {
        DT_RETURN_IF_ERROR(Annotate(
            StageGradients(bucket, r),
            absl::StrCat("copying gradient bucket ", b, " of replica ", r, " to the host")));
      }
      for (int r = 0; r < k; ++r) {
        DT_RETURN_IF_ERROR(Annotate(
            streams[r]->Synchronize(),
            absl::StrCat("copying gradient bucket ", b, " of replica ", r, " to the host")));
      }
    }
    // Weighted sum over replicas: the gradient of the mean loss over the
    // trainer's whole batch.
    int64_t off = 0;
    for (int p : bucket.params) {
      int64_t n = params[0][p].value().numel();
      float* dst = flat + off;
      const float* g0 = cuda_replicas ? static_cast<const float*>(staging[0].data()) + off
                                      : params[0][p].grad().data<float>();
      float w0 = static_cast<float>(weights[0]);
      for (int64_t j = 0; j < n; ++j) dst[j] = w0 * g0[j];
      for (int r = 1; r < k; ++r) {
        const float* g = cuda_replicas ? static_cast<const float*>(staging[r].data()) + off
                                       : params[r][p].grad().data<float>();
        float w = static_cast<float>(weights[r]);
        for (int64_t j = 0; j < n; ++j) dst[j] += w * g[j];
      }
      off += n;
    }
    if (server_weights()) {
      // Push this trainer's mean gradient (the server applies SGD to it on
      // arrival) and pull the weights as of this push (under bounded delay
      // the pull waits for the slowest trainer to come within the bound).
      // The replicas copy them in after their backward (see Step).
      DT_RETURN_IF_ERROR(Annotate(
          options.kvstore->PushPull({{WeightKey(b), flat, bucket.weights.data()}}),
          absl::StrCat("kvstore push of gradient bucket ", b, " and pull of its weights")));
    } else if (options.kvstore != nullptr) {
      // One synchronous round: push this trainer's bucket, pull the mean over
      // all trainers once every trainer has pushed it.
      DT_RETURN_IF_ERROR(
          Annotate(options.kvstore->PushPull({{absl::StrCat("grad/bucket", b), flat, flat}}),
                   absl::StrCat("kvstore push-pull of gradient bucket ", b)));
    } else if (options.communicator != nullptr) {
      DT_RETURN_IF_ERROR(
          Annotate(options.communicator->Allreduce(flat, static_cast<size_t>(bucket.numel),
                                                   DType::kF32, collective::ReduceOp::kAverage),
                   absl::StrCat("allreduce of gradient bucket ", b)));
    }
    if (cuda_replicas && !server_weights()) {
      DT_RETURN_IF_ERROR(
          Annotate(UnstageGradients(bucket, flat),
                   absl::StrCat("copying reduced gradient bucket ", b, " to the devices")));
    }
    off = 0;
    for (int p : bucket.params) {
      if (server_weights() || cuda_replicas) break;  // not used again, or copied above
      int64_t n = params[0][p].value().numel();
      for (int r = 0; r < k; ++r) {
        std::memcpy(params[r][p].mutable_grad().data<float>(), flat + off, n * sizeof(float));
      }
      off += n;
    }
    auto t2 = std::chrono::steady_clock::now();
    comm_wait += std::chrono::duration<double>(t1 - t0).count();
    comm_work += std::chrono::duration<double>(t2 - t1).count();
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
    s = impl_->SyncReplicas();
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
  const bool nccl = o.communicator != nullptr &&
                    o.communicator->options().transport == collective::TransportKind::kNccl;
  if (on_cuda) {
    if (o.sync_batch_norm) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sync_batch_norm is implemented for CPU replicas only (libs/nn/sync_batch_norm "
          "computes in host memory); devices are ",
          DeviceList(o.devices)));
    }
    if (nccl && o.devices.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "an NCCL communicator reduces device memory of one GPU per trainer; this trainer has ",
          o.devices.size(), " devices (", DeviceList(o.devices),
          "): run one trainer (rank) per GPU, or use a host transport"));
    }
    if (nccl && o.communicator->options().cuda_device != o.devices[0].index) {
      return absl::InvalidArgumentError(
          absl::StrCat("the NCCL communicator is on cuda:", o.communicator->options().cuda_device,
                       " but the trainer's device is ", o.devices[0].ToString()));
    }
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
  if (o.kvstore != nullptr && o.kvstore_consistency != kvstore::Consistency::kSync) {
    if (o.sgd.nesterov) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the kvstore's server-side SGD has no nesterov momentum (kvstore_consistency ",
          kvstore::ConsistencyName(o.kvstore_consistency), ")"));
    }
    if (!(o.sgd.lr > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the kvstore's server-side SGD needs a positive learning rate, got ", o.sgd.lr));
    }
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
  if (on_cuda) DT_RETURN_IF_ERROR(CheckCudaDevicesAvailable(o.devices));
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->k = static_cast<int>(o.devices.size());
  impl->engine = engine::Engine::Create({.max_pending = 4096});
  impl->cuda_replicas = on_cuda;
  impl->device_allreduce = on_cuda && nccl;
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
        o.model_factory ? o.model_factory() : nn::MakeModel(o.model);
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
  size_t np = impl->params[0].size();
  if (o.sync_batch_norm) {
    std::vector<std::vector<nn::BatchNorm2d*>> bns(impl->k);
    for (int r = 0; r < impl->k; ++r) CollectBatchNorms(impl->replicas[r].get(), &bns[r]);
    nn::SyncBatchNormGroup::CrossGather cross;
    if (o.communicator != nullptr) {
      collective::Communicator* comm = o.communicator;
      absl::Duration timeout = o.sync_batch_norm_timeout;
      cross = [comm, timeout](const std::vector<double>& local, std::vector<double>* all) {
        all->resize(local.size() * static_cast<size_t>(comm->size()));
        // Raw bytes: every trainer sums the gathered statistics itself, in
        // rank order, so all get bitwise the same result.
        return comm->Allgather(local.data(), all->data(), local.size() * sizeof(double), DType::kU8,
                               timeout);
      };
      impl->reduce_after_backward = true;
    }
    for (size_t l = 0; l < bns[0].size(); ++l) {
      auto group =
          std::make_shared<nn::SyncBatchNormGroup>(impl->k, o.sync_batch_norm_timeout, cross);
      for (int r = 0; r < impl->k; ++r) bns[r][l]->SetSyncGroup(group, r);
      impl->bn_groups.push_back(std::move(group));
    }
  }
  // Same initial weights everywhere: replica 0 of rank 0 is the source.
  if (o.communicator != nullptr && (!on_cuda || nccl)) {
    // CPU replicas with a host transport, or a CUDA replica with NCCL: the
    // buffers are where the communicator wants them.
    std::optional<cuda::StreamGuard> on_replica;
    if (on_cuda) on_replica.emplace(impl->streams[0]);
    for (size_t p = 0; p < np; ++p) {
      Tensor& t = impl->params[0][p].mutable_value();
      DT_RETURN_IF_ERROR(Annotate(
          o.communicator->Broadcast(t.raw_data(), static_cast<size_t>(t.numel()), DType::kF32, 0),
          "broadcast of initial weights"));
    }
  } else if (o.communicator != nullptr) {
    // CUDA replicas with a host transport: through host memory.
    for (size_t p = 0; p < np; ++p) {
      Tensor& t = impl->params[0][p].mutable_value();
      std::vector<float> host(static_cast<size_t>(t.numel()));
      DT_RETURN_IF_ERROR(t.CopyToHost(host.data()));
      DT_RETURN_IF_ERROR(
          Annotate(o.communicator->Broadcast(host.data(), host.size(), DType::kF32, 0),
                   "broadcast of initial weights"));
      DT_RETURN_IF_ERROR(CopyBytes(t.device(), t.raw_data(), Device::Cpu(), host.data(), t.nbytes(),
                                   impl->streams[0]));
    }
    DT_RETURN_IF_ERROR(impl->streams[0]->Synchronize());
  }
  for (int r = 1; r < impl->k; ++r) {
    for (size_t p = 0; p < np; ++p) {
      DT_RETURN_IF_ERROR(impl->params[r][p].mutable_value().CopyFrom(impl->params[0][p].value()));
    }
  }
  // Buckets in reverse registration order.
  impl->bucket_of.assign(np, -1);
  Impl::Bucket current;
  for (int p = static_cast<int>(np) - 1; p >= 0; --p) {
    int64_t n = impl->params[0][p].value().numel();
    if (!current.params.empty() &&
        static_cast<size_t>((current.numel + n) * sizeof(float)) > o.bucket_bytes) {
      impl->buckets.push_back(std::move(current));
      current = Impl::Bucket();
    }
    current.params.push_back(p);
    current.numel += n;
  }
  if (!current.params.empty()) impl->buckets.push_back(std::move(current));
  int64_t max_bucket = 0;
  for (size_t b = 0; b < impl->buckets.size(); ++b) {
    Impl::Bucket& bucket = impl->buckets[b];
    max_bucket = std::max(max_bucket, bucket.numel);
    if (impl->device_allreduce) {
      DT_ASSIGN_OR_RETURN(Tensor flat, Tensor::TryEmpty({bucket.numel}, DType::kF32, o.devices[0]));
      impl->device_flat.push_back(std::move(flat));
    } else if (on_cuda) {
      DT_ASSIGN_OR_RETURN(cuda::PinnedBuffer flat,
                          cuda::PinnedBuffer::Allocate(bucket.numel * sizeof(float)));
      impl->pinned_flat.push_back(std::move(flat));
    } else {
      bucket.flat.resize(static_cast<size_t>(bucket.numel));
    }
    for (int p : bucket.params) impl->bucket_of[p] = static_cast<int>(b);
    impl->bucket_vars.push_back(impl->engine->NewVar(absl::StrCat("bucket", b)));
  }
  if (on_cuda && !impl->device_allreduce) {
    for (int r = 0; r < impl->k; ++r) {
      DT_ASSIGN_OR_RETURN(cuda::PinnedBuffer staging,
                          cuda::PinnedBuffer::Allocate(max_bucket * sizeof(float)));
      impl->staging.push_back(std::move(staging));
    }
  }
  if (o.kvstore != nullptr) {
    kvstore::JobConfig config = MakeKvstoreJobConfig(o.kvstore->job(), o);
    DT_RETURN_IF_ERROR(Annotate(
        o.kvstore->CreateJob(config),
        absl::StrCat("creating the kvstore job (", kvstore::DescribeJobConfig(config), ")")));
    std::vector<kvstore::KeySpec> keys;
    for (size_t b = 0; b < impl->buckets.size(); ++b) {
      Impl::Bucket& bucket = impl->buckets[b];
      if (!impl->server_weights()) {
        keys.push_back({absl::StrCat("grad/bucket", b), {bucket.numel}, DType::kF32, nullptr});
        continue;
      }
      // The initial weights, flattened as the bucket's gradients are.
      bucket.weights.resize(static_cast<size_t>(bucket.numel));
      int64_t off = 0;
      for (int p : bucket.params) {
        const Tensor& t = impl->params[0][p].value();
        if (on_cuda) {
          DT_RETURN_IF_ERROR(t.CopyToHost(bucket.weights.data() + off));
        } else {
          std::memcpy(bucket.weights.data() + off, t.data<float>(), t.numel() * sizeof(float));
        }
        off += t.numel();
      }
      keys.push_back({Impl::WeightKey(static_cast<int>(b)),
                      {bucket.numel},
                      DType::kF32,
                      bucket.weights.data()});
    }
    DT_RETURN_IF_ERROR(Annotate(o.kvstore->Init(keys), "initializing the kvstore keys"));
    if (impl->server_weights()) {
      // Another trainer may have initialized the keys first (or trained
      // already): start from what the server holds.
      DT_RETURN_IF_ERROR(Annotate(impl->PullWeights(), "pulling the initial weights"));
    }
  }
  impl->pending.assign(impl->buckets.size(), 0);
  impl->ready.assign(impl->k, std::vector<char>(np, 0));
  Impl* raw = impl.get();
  for (int r = 0; r < impl->k; ++r) {
    for (size_t p = 0; p < np; ++p) {
      impl->params[r][p].AddGradHook(
          [raw, r, p](Tensor&) { raw->MarkReady(r, static_cast<int>(p)); });
    }
  }
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
  {
    absl::MutexLock lock(&s.mu);
    for (size_t b = 0; b < s.buckets.size(); ++b) {
      s.pending[b] = s.k * static_cast<int>(s.buckets[b].params.size());
    }
    for (auto& row : s.ready) std::fill(row.begin(), row.end(), 0);
    s.aborted = false;
    s.backward_done = 0;
  }
  for (auto& g : s.bn_groups) g->Reset();
  s.weights.assign(s.k, 0.0);
  s.losses.assign(s.k, 0.0f);
  s.corrects.assign(s.k, 0);
  s.comm_wait = s.comm_work = 0;
  int64_t begin = 0;
  for (int r = 0; r < s.k; ++r) {
    int64_t rows = n / s.k + (r < n % s.k ? 1 : 0);
    s.weights[r] = static_cast<double>(rows) / n;
    // The replica's share of the gradient of the job's loss: trainers
    // average their gradients (allreduce kAverage, or the kvstore's
    // gradient_scale 1/workers).
    for (auto& g : s.bn_groups) {
      int trainers = 1;
      if (s.options.communicator != nullptr) trainers = s.options.communicator->size();
      if (s.options.kvstore != nullptr) trainers = s.options.kvstore_workers;
      g->set_loss_weight(r, s.weights[r] / trainers);
    }
    Tensor xr = x.Slice(begin, begin + rows), yr = labels.Slice(begin, begin + rows);
    begin += rows;
    Impl* raw = impl_.get();
    s.engine->Push(
        [raw, r, xr, yr]() {
          absl::Status st = raw->ForwardBackward(r, xr, yr);
          if (!st.ok()) raw->Abort();
          return st;
        },
        {}, {s.replica_vars[r]}, s.device_queues[r], absl::StrCat("forward_backward/replica", r));
  }
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    Impl* raw = impl_.get();
    int bi = static_cast<int>(b);
    s.engine->Push([raw, bi]() { return raw->ReduceBucket(bi); }, {}, {s.bucket_vars[b]},
                   s.comm_queue, absl::StrCat("reduce/bucket", b));
  }
  for (int r = 0; r < s.k; ++r) {
    Impl* raw = impl_.get();
    s.engine->Push(
        [raw, r]() {
          std::optional<cuda::StreamGuard> on_replica;
          if (raw->cuda_replicas) on_replica.emplace(raw->streams[r]);
          if (raw->server_weights()) {
            // After this replica's backward: the bucket tasks (which this
            // task depends on) pulled the weights.
            for (size_t b = 0; b < raw->buckets.size(); ++b) {
              DT_RETURN_IF_ERROR(raw->CopyWeightsToReplica(static_cast<int>(b), r));
            }
          } else {
            raw->optimizers[r]->Step();
          }
          if (raw->cuda_replicas) {
            // The step ends with the replica's device work done: errors of
            // asynchronous kernels surface in this step, and the pinned
            // buffers the copies read are free again.
            return Annotate(
                raw->streams[r]->Synchronize(),
                absl::StrCat("replica ", r, " on ", raw->options.devices[r].ToString()));
          }
          return absl::OkStatus();
        },
        s.bucket_vars, {s.replica_vars[r]}, s.device_queues[r], absl::StrCat("sgd/replica", r));
  }
  DT_RETURN_IF_ERROR(s.engine->WaitAll());
  double loss = 0;
  for (int r = 0; r < s.k; ++r) loss += s.weights[r] * s.losses[r];
  return static_cast<float>(loss);
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

absl::Status DataParallelTrainer::PullLatestWeights() {
  if (!impl_->server_weights()) return absl::OkStatus();
  return Annotate(impl_->PullWeights(), "pulling the latest weights from the kvstore");
}

nn::Module* DataParallelTrainer::replica(int i) { return impl_->replicas[i].get(); }
nn::Sgd* DataParallelTrainer::optimizer(int i) { return impl_->optimizers[i].get(); }
int64_t DataParallelTrainer::last_correct() const {
  int64_t n = 0;
  for (int64_t c : impl_->corrects) n += c;
  return n;
}
int DataParallelTrainer::num_devices() const { return impl_->k; }
int DataParallelTrainer::num_buckets() const { return static_cast<int>(impl_->buckets.size()); }
double DataParallelTrainer::last_comm_wait_seconds() const { return impl_->comm_wait; }
double DataParallelTrainer::last_comm_work_seconds() const { return impl_->comm_work; }

}  // namespace train
}  // namespace dtrain

// The bucket reducer of data-parallel training (PyTorch c10d's Reducer): what
// every way of synchronizing gradients needs, whatever crosses the trainers.
//
// It owns
//  - the buckets: parameters grouped in reverse registration order (roughly
//    the order backward produces their gradients), each at most
//    `bucket_bytes` of f32 (a larger parameter is a bucket of its own);
//  - readiness: the autograd gradient hooks of every replica's parameters
//    count down each bucket's pending gradients, and WaitForBucket returns
//    once a bucket is final on every replica (with reduce_after_backward,
//    once every replica's backward finished);
//  - each bucket's flat buffer and the per-device weighted sum: SumBucket
//    writes sum_r weight_r * grad_r (weight_r = replica r's share of the
//    trainer's batch, so the result is the gradient of the mean loss over
//    the trainer's whole batch) into the bucket's flat buffer, and
//    WriteBackGradients copies the flat buffer into every replica's
//    gradients.
// What happens to a summed bucket between the two (allreduce, a kvstore
// round, ...) is a GradientSync's business (gradient_sync.h).
//
// Flat buffers live where the strategy wants them (BufferPlace):
//  - kHost: host memory. For CUDA replicas the gradients are first staged
//    device -> pinned host memory on each replica's stream (so after the
//    kernels that produced them), the flat buffer is pinned too, and the
//    copies back are host -> device on each replica's stream, before the
//    SGD step enqueued there later.
//  - kDevice: device memory of the one replica's device (one CUDA replica
//    only): the bucket's gradients are flattened there on the replica's
//    stream (the weighted sum is the identity) and unflattened back.
// Flatten and Unflatten are the one pair of copy loops between a bucket's
// tensors and a flat buffer (CopyBytes, ordered on the given stream; plain
// memcpy between host buffers).
//
// Thread-safety: the hooks (device workers), FinishBackward and Abort may run
// concurrently with WaitForBucket (the communication worker); StartStep
// runs between steps; SumBucket and WriteBackGradients of a bucket run on
// one thread at a time.
#ifndef DTRAIN_LIBS_TRAIN_REDUCER_H_
#define DTRAIN_LIBS_TRAIN_REDUCER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/autograd/variable.h"
#include "libs/cuda/device_allocator.h"
#include "libs/tensor/device.h"
#include "libs/tensor/stream.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace train {

// Parameters of one bucket: indices into a replica's parameter list.
struct Bucket {
  std::vector<int> params;
  int64_t numel = 0;
};

// Groups parameters of `numels` elements (f32, in registration order) into
// buckets in reverse registration order, each at most `bucket_bytes` unless
// a single parameter is larger. REQUIRES: bucket_bytes > 0.
std::vector<Bucket> AssignBuckets(const std::vector<int64_t>& numels, size_t bucket_bytes);

// Copies `tensors` (f32, on one device) one after the other into `flat` on
// `flat_device` / back. Copies involving a CUDA device are ordered on
// `stream` (the CUDA side's; see CopyBytes); host-to-host copies are memcpy.
absl::Status Flatten(const std::vector<const Tensor*>& tensors, const Device& flat_device,
                     float* flat, Stream* stream);
absl::Status Unflatten(const float* flat, const Device& flat_device,
                       const std::vector<Tensor*>& tensors, Stream* stream);

class Reducer {
 public:
  enum class BufferPlace { kHost, kDevice };

  struct Options {
    // [replica][param]: every replica's parameters, in registration order
    // (the same shapes in every replica).
    std::vector<std::vector<autograd::Variable>> params;
    // [replica]: its device and, for CUDA replicas, the stream all its work
    // is ordered on (null for CPU replicas). All of one kind.
    std::vector<Device> devices;
    std::vector<Stream*> streams;
    size_t bucket_bytes = size_t{1} << 20;
    // Buckets are ready only once every replica's backward finished (sync
    // batch norm across trainers: collectives in the same order everywhere).
    bool reduce_after_backward = false;
    BufferPlace place = BufferPlace::kHost;
  };

  // Errors: InvalidArgument for kDevice with other than one CUDA replica;
  // the allocator's errors for the flat and staging buffers.
  static absl::StatusOr<std::unique_ptr<Reducer>> Create(Options options);

  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  int num_replicas() const { return static_cast<int>(options_.params.size()); }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Device& device(int r) const { return options_.devices[r]; }
  Stream* stream(int r) const { return options_.streams[r]; }
  bool cuda_replicas() const { return options_.devices[0].is_cuda(); }
  // Replica r's parameter p (registration order).
  int num_params() const { return static_cast<int>(options_.params[0].size()); }
  autograd::Variable& param(int r, int p) { return options_.params[r][p]; }

  // Bucket b's parameter values / gradients of replica r, in bucket order
  // (what Flatten and Unflatten take).
  std::vector<const Tensor*> Values(int b, int r);
  std::vector<Tensor*> MutableValues(int b, int r);
  std::vector<const Tensor*> Gradients(int b, int r);
  std::vector<Tensor*> MutableGradients(int b, int r);

  // Adds the gradient hooks to every replica's parameters (once, after the
  // replicas hold their initial weights).
  void InstallHooks();

  // Before every step: no gradient ready yet; `slice_weights` [replica] are
  // the replicas' shares of the trainer's batch (summing to 1).
  void StartStep(std::vector<double> slice_weights);
  // On replica r's worker after its backward: parameters that got no
  // gradient (unused in this forward) get zeros and count as ready.
  void FinishBackward(int r);
  // A replica failed: WaitForBucket answers Aborted.
  void Abort();
  // Blocks until bucket b is ready. Errors: Aborted after Abort();
  // DeadlineExceeded after 10 minutes.
  absl::Status WaitForBucket(int b);

  // Writes bucket b's weighted sum of the replicas' gradients into its flat
  // buffer and returns that buffer (buckets()[b].numel floats, on the host
  // or, with kDevice, on the replica's device).
  absl::StatusOr<float*> SumBucket(int b);
  // Copies bucket b's flat buffer into every replica's gradients.
  absl::Status WriteBackGradients(int b);

  // Waits for the work enqueued so far on every CUDA replica's stream (a
  // no-op for CPU replicas).
  absl::Status SynchronizeReplicas();

 private:
  explicit Reducer(Options options);
  void MarkReady(int r, int p);

  Options options_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // [param]
  std::vector<double> slice_weights_;
  // Flat buffers, one of: [bucket] host (CPU replicas), pinned host (CUDA
  // replicas, kHost), device (kDevice).
  std::vector<std::vector<float>> host_flat_;
  std::vector<cuda::PinnedBuffer> pinned_flat_;
  std::vector<Tensor> device_flat_;
  // CUDA replicas, kHost: [replica] pinned staging as large as the largest
  // bucket (buckets are summed one at a time).
  std::vector<cuda::PinnedBuffer> staging_;

  absl::Mutex mu_;
  std::vector<int> pending_ ABSL_GUARDED_BY(mu_);              // gradients still to come [bucket]
  std::vector<std::vector<char>> ready_ ABSL_GUARDED_BY(mu_);  // [replica][param]
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  int backward_done_ ABSL_GUARDED_BY(mu_) = 0;  // replicas whose backward finished
};

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_REDUCER_H_

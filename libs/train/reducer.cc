#include "libs/train/reducer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"

namespace dtrain {
namespace train {

std::vector<Bucket> AssignBuckets(const std::vector<int64_t>& numels, size_t bucket_bytes) {
  DT_CHECK(bucket_bytes > 0);
  std::vector<Bucket> buckets;
  Bucket current;
  for (int p = static_cast<int>(numels.size()) - 1; p >= 0; --p) {
    const int64_t n = numels[p];
    if (!current.params.empty() &&
        static_cast<size_t>((current.numel + n) * sizeof(float)) > bucket_bytes) {
      buckets.push_back(std::move(current));
      current = Bucket();
    }
    current.params.push_back(p);
    current.numel += n;
  }
  if (!current.params.empty()) buckets.push_back(std::move(current));
  return buckets;
}

absl::Status Flatten(const std::vector<const Tensor*>& tensors, const Device& flat_device,
                     float* flat, Stream* stream) {
  int64_t off = 0;
  for (const Tensor* t : tensors) {
    if (flat_device.is_cpu() && t->device().is_cpu()) {
      std::memcpy(flat + off, t->raw_data(), t->nbytes());
    } else {
      DT_RETURN_IF_ERROR(
          CopyBytes(flat_device, flat + off, t->device(), t->raw_data(), t->nbytes(), stream));
    }
    off += t->numel();
  }
  return absl::OkStatus();
}

absl::Status Unflatten(const float* flat, const Device& flat_device,
                       const std::vector<Tensor*>& tensors, Stream* stream) {
  int64_t off = 0;
  for (Tensor* t : tensors) {
    if (flat_device.is_cpu() && t->device().is_cpu()) {
      std::memcpy(t->raw_data(), flat + off, t->nbytes());
    } else {
      DT_RETURN_IF_ERROR(
          CopyBytes(t->device(), t->raw_data(), flat_device, flat + off, t->nbytes(), stream));
    }
    off += t->numel();
  }
  return absl::OkStatus();
}

Reducer::Reducer(Options options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Reducer>> Reducer::Create(Options options) {
  DT_CHECK(!options.params.empty() && options.params.size() == options.devices.size() &&
           options.params.size() == options.streams.size());
  if (options.place == BufferPlace::kDevice &&
      (options.devices.size() != 1 || !options.devices[0].is_cuda())) {
    return absl::InvalidArgumentError(
        absl::StrCat("flat gradient buckets in device memory need exactly one CUDA replica, got ",
                     options.devices.size(), " replica(s) on ", options.devices[0].ToString()));
  }
  std::unique_ptr<Reducer> r(new Reducer(std::move(options)));
  const Options& o = r->options_;
  const int k = r->num_replicas();
  const size_t np = o.params[0].size();
  std::vector<int64_t> numels;
  for (const autograd::Variable& v : o.params[0]) numels.push_back(v.value().numel());
  r->buckets_ = AssignBuckets(numels, o.bucket_bytes);
  r->bucket_of_.assign(np, -1);
  int64_t max_bucket = 0;
  for (size_t b = 0; b < r->buckets_.size(); ++b) {
    const Bucket& bucket = r->buckets_[b];
    max_bucket = std::max(max_bucket, bucket.numel);
    for (int p : bucket.params) r->bucket_of_[p] = static_cast<int>(b);
    if (o.place == BufferPlace::kDevice) {
      DT_ASSIGN_OR_RETURN(Tensor flat, Tensor::TryEmpty({bucket.numel}, DType::kF32, o.devices[0]));
      r->device_flat_.push_back(std::move(flat));
    } else if (r->cuda_replicas()) {
      DT_ASSIGN_OR_RETURN(cuda::PinnedBuffer flat,
                          cuda::PinnedBuffer::Allocate(bucket.numel * sizeof(float)));
      r->pinned_flat_.push_back(std::move(flat));
    } else {
      r->host_flat_.emplace_back(static_cast<size_t>(bucket.numel));
    }
  }
  if (r->cuda_replicas() && o.place == BufferPlace::kHost) {
    for (int i = 0; i < k; ++i) {
      DT_ASSIGN_OR_RETURN(cuda::PinnedBuffer staging,
                          cuda::PinnedBuffer::Allocate(max_bucket * sizeof(float)));
      r->staging_.push_back(std::move(staging));
    }
  }
  absl::MutexLock lock(&r->mu_);
  r->pending_.assign(r->buckets_.size(), 0);
  r->ready_.assign(k, std::vector<char>(np, 0));
  return r;
}

std::vector<const Tensor*> Reducer::Values(int b, int r) {
  std::vector<const Tensor*> out;
  for (int p : buckets_[b].params) out.push_back(&options_.params[r][p].value());
  return out;
}

std::vector<Tensor*> Reducer::MutableValues(int b, int r) {
  std::vector<Tensor*> out;
  for (int p : buckets_[b].params) out.push_back(&options_.params[r][p].mutable_value());
  return out;
}

std::vector<const Tensor*> Reducer::Gradients(int b, int r) {
  std::vector<const Tensor*> out;
  for (int p : buckets_[b].params) out.push_back(&options_.params[r][p].grad());
  return out;
}

std::vector<Tensor*> Reducer::MutableGradients(int b, int r) {
  std::vector<Tensor*> out;
  for (int p : buckets_[b].params) out.push_back(&options_.params[r][p].mutable_grad());
  return out;
}

void Reducer::InstallHooks() {
  for (int r = 0; r < num_replicas(); ++r) {
    for (size_t p = 0; p < options_.params[r].size(); ++p) {
      options_.params[r][p].AddGradHook(
          [this, r, p](Tensor&) { MarkReady(r, static_cast<int>(p)); });
    }
  }
}

void Reducer::StartStep(std::vector<double> slice_weights) {
  DT_CHECK(static_cast<int>(slice_weights.size()) == num_replicas());
  slice_weights_ = std::move(slice_weights);
  absl::MutexLock lock(&mu_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = num_replicas() * static_cast<int>(buckets_[b].params.size());
  }
  for (auto& row : ready_) std::fill(row.begin(), row.end(), 0);
  aborted_ = false;
  backward_done_ = 0;
}

void Reducer::MarkReady(int r, int p) {
  absl::MutexLock lock(&mu_);
  if (ready_[r][p]) return;
  ready_[r][p] = 1;
  --pending_[bucket_of_[p]];
}

void Reducer::FinishBackward(int r) {
  for (size_t p = 0; p < options_.params[r].size(); ++p) {
    autograd::Variable& v = options_.params[r][p];
    bool done;
    {
      absl::MutexLock lock(&mu_);
      done = ready_[r][p];
    }
    if (!done) {
      v.mutable_grad() = Tensor::Zeros(v.value().shape(), v.value().dtype(), v.value().device());
      MarkReady(r, static_cast<int>(p));
    }
  }
  absl::MutexLock lock(&mu_);
  ++backward_done_;
}

void Reducer::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
}

absl::Status Reducer::WaitForBucket(int b) {
  absl::MutexLock lock(&mu_);
  auto done = [this, b]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (pending_[b] == 0 &&
            (!options_.reduce_after_backward || backward_done_ == num_replicas())) ||
           aborted_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Minutes(10))) {
    return absl::DeadlineExceededError(
        absl::StrCat("bucket ", b, ": gradients not ready after 10 minutes"));
  }
  if (aborted_) return absl::AbortedError(absl::StrCat("bucket ", b, ": a replica failed"));
  return absl::OkStatus();
}

absl::StatusOr<float*> Reducer::SumBucket(int b) {
  const Bucket& bucket = buckets_[b];
  const int k = num_replicas();
  if (options_.place == BufferPlace::kDevice) {
    // One replica: its weight is 1, the sum is its gradients.
    float* flat = device_flat_[b].data<float>();
    DT_RETURN_IF_ERROR(Annotate(
        Flatten(Gradients(b, 0), options_.devices[0], flat, options_.streams[0]),
        absl::StrCat("flattening gradient bucket ", b, " on ", options_.devices[0].ToString())));
    return flat;
  }
  if (cuda_replicas()) {
    // Every replica's gradients to pinned host memory first (on the
    // replica's stream: after the kernels that produced them), then one
    // fused loop over the flat copies.
    float* flat = static_cast<float*>(pinned_flat_[b].data());
    for (int r = 0; r < k; ++r) {
      DT_RETURN_IF_ERROR(
          Annotate(Flatten(Gradients(b, r), Device::Cpu(), static_cast<float*>(staging_[r].data()),
                           options_.streams[r]),
                   absl::StrCat("copying gradient bucket ", b, " of replica ", r, " to the host")));
    }
    for (int r = 0; r < k; ++r) {
      DT_RETURN_IF_ERROR(
          Annotate(options_.streams[r]->Synchronize(),
                   absl::StrCat("copying gradient bucket ", b, " of replica ", r, " to the host")));
    }
    const int64_t n = bucket.numel;
    const float* g0 = static_cast<const float*>(staging_[0].data());
    const float w0 = static_cast<float>(slice_weights_[0]);
    for (int64_t j = 0; j < n; ++j) flat[j] = w0 * g0[j];
    for (int r = 1; r < k; ++r) {
      const float* g = static_cast<const float*>(staging_[r].data());
      const float w = static_cast<float>(slice_weights_[r]);
      for (int64_t j = 0; j < n; ++j) flat[j] += w * g[j];
    }
    return flat;
  }
  // CPU replicas: read the gradients in place.
  float* flat = host_flat_[b].data();
  int64_t off = 0;
  for (int p : bucket.params) {
    const int64_t n = options_.params[0][p].value().numel();
    float* dst = flat + off;
    const float* g0 = options_.params[0][p].grad().data<float>();
    const float w0 = static_cast<float>(slice_weights_[0]);
    for (int64_t j = 0; j < n; ++j) dst[j] = w0 * g0[j];
    for (int r = 1; r < k; ++r) {
      const float* g = options_.params[r][p].grad().data<float>();
      const float w = static_cast<float>(slice_weights_[r]);
      for (int64_t j = 0; j < n; ++j) dst[j] += w * g[j];
    }
    off += n;
  }
  return flat;
}

absl::Status Reducer::WriteBackGradients(int b) {
  if (options_.place == BufferPlace::kDevice) {
    return Annotate(
        Unflatten(device_flat_[b].data<float>(), options_.devices[0], MutableGradients(b, 0),
                  options_.streams[0]),
        absl::StrCat("unflattening gradient bucket ", b, " on ", options_.devices[0].ToString()));
  }
  const float* flat =
      cuda_replicas() ? static_cast<const float*>(pinned_flat_[b].data()) : host_flat_[b].data();
  for (int r = 0; r < num_replicas(); ++r) {
    // CUDA replicas: host -> device on the replica's stream, before the SGD
    // step enqueued there later. The pinned buffer is not written again
    // before the next step.
    DT_RETURN_IF_ERROR(
        Annotate(Unflatten(flat, Device::Cpu(), MutableGradients(b, r), options_.streams[r]),
                 absl::StrCat("copying reduced gradient bucket ", b, " to replica ", r, " on ",
                              options_.devices[r].ToString())));
  }
  return absl::OkStatus();
}

absl::Status Reducer::SynchronizeReplicas() {
  if (!cuda_replicas()) return absl::OkStatus();
  for (int r = 0; r < num_replicas(); ++r) {
    DT_RETURN_IF_ERROR(
        Annotate(options_.streams[r]->Synchronize(),
                 absl::StrCat("replica ", r, " on ", options_.devices[r].ToString())));
  }
  return absl::OkStatus();
}

}  // namespace train
}  // namespace dtrain

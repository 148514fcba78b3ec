#include "libs/cuda/copy.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "libs/base/status.h"
#include "libs/cuda/cuda_status.h"
#include "libs/cuda/device_allocator.h"

namespace dtrain {
namespace cuda {
namespace {

cudaStream_t StreamFor(const Device& device, Stream* stream) {
  if (stream != nullptr && stream->device() == device) return NativeStream(stream);
  return CurrentCudaStream(device.index);
}

bool IsPinned(const void* host) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

absl::Status HostToDevice(const Device& dst_device, void* dst, const Device&, const void* src,
                          size_t bytes, Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  DeviceGuard guard(dst_device.index);
  cudaStream_t s = StreamFor(dst_device, stream);
  DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  if (IsPinned(src)) DT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status DeviceToHost(const Device&, void* dst, const Device& src_device, const void* src,
                          size_t bytes, Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  DeviceGuard guard(src_device.index);
  cudaStream_t s = StreamFor(src_device, stream);
  DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  DT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status DeviceToDevice(const Device& dst_device, void* dst, const Device& src_device,
                            const void* src, size_t bytes, Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  DeviceGuard guard(dst_device.index);
  cudaStream_t s = StreamFor(dst_device, stream);
  if (dst_device == src_device) {
    DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    return absl::OkStatus();
  }
  // Order after the source device's pending work, then copy peer to peer.
  Stream* src_stream = CurrentStream(src_device.index);
  if (src_stream == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(src_device.ToString(), " has no stream (no such device?)"));
  }
  absl::StatusOr<std::unique_ptr<CudaEvent>> e = CudaEvent::Create(src_device.index);
  if (!e.ok()) return e.status();
  DT_RETURN_IF_ERROR((*e)->Record(NativeStream(src_stream)));
  DT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, (*e)->get(), 0));
  DT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, s));
  return absl::OkStatus();
}

}  // namespace

void RegisterCudaCopies() {
  RegisterCopyFn(DeviceType::kCUDA, DeviceType::kCPU, HostToDevice);
  RegisterCopyFn(DeviceType::kCPU, DeviceType::kCUDA, DeviceToHost);
  RegisterCopyFn(DeviceType::kCUDA, DeviceType::kCUDA, DeviceToDevice);
}

absl::StatusOr<std::unique_ptr<HostToDeviceCopier>> HostToDeviceCopier::Create(int device) {
  absl::StatusOr<CachingAllocator*> a = DeviceAllocator(device);  // checks the device exists
  if (!a.ok()) return a.status();
  // Higher priority than compute: a copy the next step waits for should not
  // queue behind compute kernels.
  int least = 0, greatest = 0;
  {
    DeviceGuard guard(device);
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) {
      cudaGetLastError();
      greatest = 0;
    }
  }
  absl::StatusOr<std::unique_ptr<CudaStream>> s = CudaStream::Create(device, greatest);
  if (!s.ok()) return s.status();
  return std::unique_ptr<HostToDeviceCopier>(new HostToDeviceCopier(device, *std::move(s)));
}

absl::StatusOr<Tensor> HostToDeviceCopier::Copy(const Tensor& host, Stream* consumer) {
  if (!host.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostToDeviceCopier::Copy: ", host.DebugString(), " is not on the CPU"));
  }
  if (consumer == nullptr) consumer = CurrentStream(device_);
  if (consumer == nullptr || consumer->device() != Device::Cuda(device_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostToDeviceCopier::Copy: the consumer stream is not on cuda:", device_));
  }
  const size_t bytes = host.nbytes();
  absl::StatusOr<PinnedBuffer> staging = PinnedBuffer::Allocate(bytes);
  if (!staging.ok()) return staging.status();
  if (bytes > 0) std::memcpy(staging->data(), host.raw_data(), bytes);

  absl::StatusOr<Tensor> dst;
  {
    // Allocated for the copy stream, which writes it first.
    StreamGuard on_copy(stream_.get());
    dst = Tensor::TryEmpty(host.shape(), host.dtype(), Device::Cuda(device_));
  }
  if (!dst.ok()) return dst.status();
  DeviceGuard guard(device_);
  if (bytes > 0) {
    DT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->raw_data(), staging->data(), bytes,
                                            cudaMemcpyHostToDevice, stream_->get()));
  }
  staging->RecordStream(stream_.get());  // reused once the copy is done
  absl::StatusOr<std::unique_ptr<CudaEvent>> done = CudaEvent::Create(device_);
  if (!done.ok()) return done.status();
  DT_RETURN_IF_ERROR((*done)->Record(stream_->get()));
  DT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(NativeStream(consumer), (*done)->get(), 0));
  RecordStream(*dst, consumer);
  return dst;
}

absl::StatusOr<bool> HostToDeviceCopier::Idle() const {
  cudaError_t err = cudaStreamQuery(stream_->get());
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  DT_CUDA_RETURN_IF_ERROR(err);
  return false;
}

}  // namespace cuda
}  // namespace dtrain

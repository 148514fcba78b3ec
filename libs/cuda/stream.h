// CUDA streams and events, the calling thread's current stream, and the
// current device.
//
//   DT_ASSIGN_OR_RETURN(auto copy_stream, CudaStream::Create(/*device=*/0));
//   {
//     StreamGuard on_copy(copy_stream.get());  // kernels and allocations of this
//     ...                                      // thread on cuda:0 use copy_stream
//   }
//   DT_RETURN_IF_ERROR(compute->Wait(copy_stream.get()));
//
// Every CUDA kernel in libs/cuda runs on CurrentStream(device): the innermost
// StreamGuard of the calling thread for that device, else the device's
// default stream (libs/tensor's DefaultStream(Device::Cuda(i)), a non-blocking
// stream the backend creates; never CUDA's legacy NULL stream, which could
// not be captured into a CUDA graph and would serialize with every stream).
// Kernels are asynchronous: Stream::Synchronize, or reading a tensor back
// (Tensor::ToVector), waits for them.
#ifndef DTRAIN_LIBS_CUDA_STREAM_H_
#define DTRAIN_LIBS_CUDA_STREAM_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "libs/tensor/device.h"
#include "libs/tensor/stream.h"

namespace dtrain {
namespace cuda {

// Devices with an index at or above this are rejected (far more than any host has).
inline constexpr int kMaxDevices = 64;

// Makes `device` the calling thread's current CUDA device for the guard's
// lifetime (cudaSetDevice; restores the previous one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

class CudaEvent {
 public:
  // An event on `device`; `timing` events can measure elapsed time (others
  // are cheaper to record and wait for).
  static absl::StatusOr<std::unique_ptr<CudaEvent>> Create(int device, bool timing = false);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Records the event on `stream` (a stream of the event's device).
  absl::Status Record(cudaStream_t stream);
  absl::Status Record(Stream* stream);
  // True once the work recorded before the event has completed.
  absl::StatusOr<bool> Query() const;
  // Blocks the calling thread until then.
  absl::Status Synchronize() const;
  // Milliseconds between two recorded timing events.
  static absl::StatusOr<float> ElapsedMs(const CudaEvent& start, const CudaEvent& end);

  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }

 private:
  CudaEvent(int device, cudaEvent_t event) : device_(device), event_(event) {}
  int device_;
  cudaEvent_t event_;
};

class CudaStream final : public Stream {
 public:
  // A new non-blocking stream on `device`. `priority`: lower numbers run
  // first (cudaDeviceGetStreamPriorityRange); 0 is the default.
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(int device, int priority = 0);
  ~CudaStream() override;

  Device device() const override { return Device::Cuda(device_); }
  absl::Status Synchronize() override;
  void* native_handle() const override { return stream_; }

  cudaStream_t get() const { return stream_; }
  int device_index() const { return device_; }

  // Work enqueued on this stream from now on waits for `event`.
  absl::Status Wait(const CudaEvent& event);
  // ... for all work enqueued on `other` (a CUDA stream, any device) so far.
  absl::Status Wait(Stream* other);

 private:
  CudaStream(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  int device_;
  cudaStream_t stream_;
};

// The calling thread's stream for `device` (see the file comment). Null only
// when the device's default stream could not be created (no such device).
Stream* CurrentStream(int device);
// Its handle; fatal when there is none (kernels call this only after their
// tensors were allocated on the device, so the device exists).
cudaStream_t CurrentCudaStream(int device);

// Makes `stream` (a CUDA stream) the calling thread's current stream of its
// device for the guard's lifetime. Guards nest.
class StreamGuard {
 public:
  explicit StreamGuard(Stream* stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  Stream* prev_;
};

// The cudaStream_t of a CUDA dtrain::Stream; fatal for other streams.
cudaStream_t NativeStream(Stream* stream);

// Sets the calling thread's stream-capture mode to relaxed for the guard's
// lifetime, so that calls CUDA deems unsafe during a capture (cudaMalloc,
// event queries) are allowed: the caching allocator's own calls, which never
// touch the capturing stream.
class RelaxedCaptureModeGuard {
 public:
  RelaxedCaptureModeGuard();
  ~RelaxedCaptureModeGuard();
  RelaxedCaptureModeGuard(const RelaxedCaptureModeGuard&) = delete;
  RelaxedCaptureModeGuard& operator=(const RelaxedCaptureModeGuard&) = delete;

 private:
  cudaStreamCaptureMode prev_;
};

// The factory libs/tensor's DefaultStream uses for CUDA devices: a new
// CudaStream, or null (with a log line) when the device cannot make one.
Stream* NewDefaultStream(int device);

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_STREAM_H_

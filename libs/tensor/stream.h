// Per-device work queues and copies between devices.
//
// A Stream orders work on one device. On CUDA it wraps a cudaStream_t (see
// libs/cuda); kernels and copies enqueued on it run asynchronously and
// Synchronize() waits for them. On CPU, kernels run on the calling thread
// when they are issued, so a CPU stream is always synchronized; asynchrony
// across CPU work comes from the dependency engine (libs/engine), which runs
// operations on per-device worker threads.
#ifndef DTRAIN_LIBS_TENSOR_STREAM_H_
#define DTRAIN_LIBS_TENSOR_STREAM_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "libs/tensor/device.h"

namespace dtrain {

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  // Blocks until all work enqueued so far has finished.
  virtual absl::Status Synchronize() = 0;
  // The backend's handle (cudaStream_t for CUDA), nullptr for CPU.
  virtual void* native_handle() const { return nullptr; }
};

// The default stream of `device` (process-wide; never null for CPU). For
// other device types the backend must have registered a factory.
Stream* DefaultStream(const Device& device);
void RegisterStreamFactory(DeviceType type, std::function<Stream*(int index)> factory);

// Copies `bytes` bytes between any two devices. The copy is ordered on
// `stream` (which must belong to the non-CPU side when there is one; null
// means that device's default stream); CPU<->CPU copies complete before the
// call returns.
using CopyFn =
    std::function<absl::Status(const Device& dst_device, void* dst, const Device& src_device,
                               const void* src, size_t bytes, Stream* stream)>;
absl::Status CopyBytes(const Device& dst_device, void* dst, const Device& src_device,
                       const void* src, size_t bytes, Stream* stream = nullptr);
void RegisterCopyFn(DeviceType dst, DeviceType src, CopyFn fn);

}  // namespace dtrain

#endif  // DTRAIN_LIBS_TENSOR_STREAM_H_

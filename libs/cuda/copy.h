// Copies between host and CUDA devices.
//
// RegisterCudaCopies() installs libs/tensor's CopyBytes functions for
// cuda<-cpu, cpu<-cuda and cuda<-cuda (the backend calls it):
//  - host -> device is ordered on the given stream (null: the destination's
//    CurrentStream). From pageable memory CUDA stages the bytes before the
//    call returns, so the source may be reused at once; from pinned memory
//    the call waits for the copy, since the caller may free the source.
//  - device -> host waits for the copy: the caller reads the bytes next.
//  - device -> device is ordered on the destination's stream, after the work
//    enqueued so far on the source device's current stream.
//
// HostToDeviceCopier overlaps host-to-device copies with compute: it stages a
// host tensor in pinned memory and copies it on a copy stream of its own, and
// the tensor it returns is ready for the consumer stream without blocking
// anyone:
//
//   DT_ASSIGN_OR_RETURN(auto copier, HostToDeviceCopier::Create(0));
//   DT_ASSIGN_OR_RETURN(Tensor x, copier->Copy(host_batch));  // returns at once
//   y = ops::Conv2d(x, ...);   // on the current stream, which waits for the copy
#ifndef DTRAIN_LIBS_CUDA_COPY_H_
#define DTRAIN_LIBS_CUDA_COPY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "libs/cuda/stream.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace cuda {

void RegisterCudaCopies();

class HostToDeviceCopier {
 public:
  static absl::StatusOr<std::unique_ptr<HostToDeviceCopier>> Create(int device);

  // Copies CPU tensor `host` to a new tensor on the device. The host bytes are
  // staged into pinned memory before the call returns (so `host` may change
  // afterwards); the device copy runs on the copy stream, and `consumer` (null:
  // the device's CurrentStream) waits for it before any work enqueued on it
  // later. The result's memory is announced to `consumer` (RecordStream).
  absl::StatusOr<Tensor> Copy(const Tensor& host, Stream* consumer = nullptr);

  // True when every copy enqueued so far has completed.
  absl::StatusOr<bool> Idle() const;
  CudaStream* copy_stream() const { return stream_.get(); }

 private:
  HostToDeviceCopier(int device, std::unique_ptr<CudaStream> stream)
      : device_(device), stream_(std::move(stream)) {}
  int device_;
  std::unique_ptr<CudaStream> stream_;
};

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_COPY_H_

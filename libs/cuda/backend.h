// The CUDA backend of the tensor library and the op registry.
//
// Linking //libs/cuda:cuda_backend (an alwayslink library) is all it takes:
// static initializers register, for DeviceType::kCUDA, the caching allocator
// (device_allocator.h), the default streams (stream.h), the copy functions
// (copy.h) and a kernel for every op of libs/ops/ops.h (cuda_ops.cc,
// blas_ops.cc, dnn/). Registration makes no CUDA call, so a binary that links
// the backend starts and runs on machines without a GPU; "cuda:N" tensors
// then fail to allocate with a message saying the device is not available,
// and ChooseDevices picks the CPU.
#ifndef DTRAIN_LIBS_CUDA_BACKEND_H_
#define DTRAIN_LIBS_CUDA_BACKEND_H_

#include "libs/cuda/devices.h"

namespace dtrain {
namespace cuda {

// Registers the allocator, stream and copy factories (idempotent; the
// backend's static initializer calls it). Returns true.
bool RegisterCudaBackend();

}  // namespace cuda
}  // namespace dtrain

#endif  // DTRAIN_LIBS_CUDA_BACKEND_H_

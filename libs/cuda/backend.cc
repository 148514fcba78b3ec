#include "libs/cuda/backend.h"

#include "libs/cuda/copy.h"
#include "libs/cuda/device_allocator.h"
#include "libs/cuda/stream.h"
#include "libs/tensor/allocator.h"
#include "libs/tensor/stream.h"

namespace dtrain {
namespace cuda {

bool RegisterCudaBackend() {
  static const bool done = [] {
    RegisterAllocatorFactory(DeviceType::kCUDA, NewCudaTensorAllocator);
    RegisterStreamFactory(DeviceType::kCUDA, NewDefaultStream);
    RegisterCudaCopies();
    return true;
  }();
  return done;
}

namespace {
const bool kRegistered = RegisterCudaBackend();
}  // namespace

}  // namespace cuda
}  // namespace dtrain
